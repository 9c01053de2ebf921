/* nimbus.http.request: the Lua side of the HTTP client (being written). */
#include "nh_lmodules.h"

#include <lauxlib.h>

int nh_lhttp_open(lua_State *L)
{
  lua_newtable(L);
  return 1;
}
