/* A plain Lua state with the runtime's Lua files (lua/) on its path and empty stand-ins
 * for the host's C modules, for targets that drive pure-Lua code. Made once per process:
 * libFuzzer calls a target many thousand times. */
#include "nh_fuzz.h"

#include <lauxlib.h>
#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>

static const char *const setup =
  "package.path = NH_LUA_DIR .. '/?.lua;' .. NH_LUA_DIR .. '/?/init.lua;' .. package.path\n"
  "local stub = function() return setmetatable({}, { __index = function() return function() end end }) end\n"
  "for _, m in ipairs({ 'nimbus.core', 'nimbus.http.core', 'nimbus.httpd.core', 'nimbus.sqlite.core' }) do\n"
  "  package.preload[m] = stub\n"
  "end\n";

static lua_State *nh_fuzz_lua(void)
{
  static lua_State *L;
  if (L) return L;
  L = luaL_newstate();
  luaL_openlibs(L);
  lua_pushstring(L, NH_SOURCE_LUA_DIR);
  lua_setglobal(L, "NH_LUA_DIR");
  if (luaL_dostring(L, setup) != LUA_OK) {
    fprintf(stderr, "fuzz: Lua set-up failed: %s\n", lua_tostring(L, -1));
    abort();
  }
  return L;
}

/* Runs the global function `fn` on the input string (a refusal returns normally). */
static void call(const char *fn, const uint8_t *data, size_t size)
{
  lua_State *L = nh_fuzz_lua();
  lua_getglobal(L, fn);
  lua_pushlstring(L, (const char *)data, size);
  if (lua_pcall(L, 1, 0, 0) != LUA_OK) {
    fprintf(stderr, "fuzz: %s raised: %s\n", fn, lua_tostring(L, -1));
    abort();
  }
  static unsigned calls;
  if (++calls % 256 == 0) lua_gc(L, LUA_GCCOLLECT, 0);
}

void nh_fuzz_lua_run(const char *chunk, const char *fn, const uint8_t *data, size_t size)
{
  static int loaded;
  lua_State *L = nh_fuzz_lua();
  if (!loaded && luaL_dostring(L, chunk) != LUA_OK) {
    fprintf(stderr, "fuzz: Lua target failed to load: %s\n", lua_tostring(L, -1));
    abort();
  }
  loaded = 1;
  call(fn, data, size);
}
