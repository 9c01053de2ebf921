/* nimbus.sqlite: adapter-owned sqlite databases (stub, being written). */
#include "nh_lmodules.h"

#include <lauxlib.h>

int nh_lsqlite_open(lua_State *L)
{
  lua_newtable(L);
  return 1;
}
