/* nimbus.http.serve: the Lua side of the HTTP server (stub, being written). */
#include "nh_lmodules.h"

#include <lauxlib.h>

int nh_lhttpd_open(lua_State *L)
{
  lua_newtable(L);
  return 1;
}
