/* nimbus.httpd.core: the C side of nimbus.http.serve (lua/nimbus/httpd.lua is the face).
 *
 *   core.listen(dispatch, host, port, max_body, max_headers, timeout, cpu_budget,
 *               idle_timeout, max_connections) -> server | nil, message, code
 *   server:port() server:close()
 *
 * Each request runs as its own task (kind "route") calling
 *   dispatch(method, path, query_pairs, header_pairs, body)
 *     -> status, body_string|nil, header_pairs|nil, log_message|nil
 * where *_pairs are flat lists { name1, value1, name2, value2, ... } (a query key with
 * no '=' has the value false). When the task ends the response goes back to the
 * connection (nh_httpd_respond). A task that raises past the dispatcher answers 500, a
 * task stopped by its CPU budget 500, by its deadline 504, cancelled by the host
 * (VM closing) 503.
 *
 * A listening server is anchored in the registry, so it is not collected; close (or
 * lua_close, through __gc) stops it. Requests in flight when it closes finish their
 * task; their answers are dropped. */
#include "nh_lmodules.h"
#include "nh_vm.h"
#include "nh_lasync.h"
#include "nh_task.h"
#include "nh_vm_int.h"
#include "core/nh_log.h"
#include "core/nh_queue.h"
#include "core/nh_runtime.h"
#include "core/nh_util.h"
#include "net/nh_httpd.h"

#include <lauxlib.h>
#include <stdlib.h>
#include <string.h>

#define SERVER_MT "nimbus.httpd.server"
#define MAX_RESPONSE_HEADERS 128

typedef struct lserver {
  nh_httpd_t *h;          /* NULL once closed */
  nh_vm_t *vm;
  nh_queue_t node;        /* the runtime's open servers (for nh_lhttpd_quiesce_vm) */
  int self_ref, fn_ref;
  double timeout_s, cpu_budget_s;
  int port;
} lserver_t;

/* ---------------------------------------------------------------- responses */

static void respond_json_error(nh_httpd_req_t *r, unsigned status, const char *json)
{
  static const nh_httpd_header_t ct = { "Content-Type", "application/json" };
  nh_error_t err = {0};
  nh_httpd_respond(r, status, &ct, 1, json, strlen(json), &err);
}

/* The dispatcher returned: status, body, header pairs, log message. */
static void respond_from_results(nh_httpd_req_t *r, lua_State *co, int nres)
{
  int base = lua_gettop(co) - nres + 1;
  const char *method = nh_httpd_req_method(r), *path = nh_httpd_req_path(r);
  if (nres >= 4 && lua_type(co, base + 3) == LUA_TSTRING)
    nh_log_error("httpd", "%s", lua_tostring(co, base + 3));
  int isint = 0;
  lua_Integer status = nres >= 1 ? lua_tointegerx(co, base, &isint) : 0;
  if (!isint || status < 200 || status > 999) {
    nh_log_error("httpd", "%s %s: the HTTP dispatcher returned no valid status; answered 500", method, path);
    respond_json_error(r, 500, "{\"error\":\"internal error\"}");
    return;
  }
  size_t len = 0;
  const char *body = nres >= 2 && lua_type(co, base + 1) == LUA_TSTRING ? lua_tolstring(co, base + 1, &len) : NULL;
  nh_httpd_header_t hdrs[MAX_RESPONSE_HEADERS];
  size_t nh = 0;
  if (nres >= 3 && lua_istable(co, base + 2)) {
    lua_Integer n = luaL_len(co, base + 2);
    for (lua_Integer i = 1; i + 1 <= n && nh < MAX_RESPONSE_HEADERS; i += 2) {
      lua_rawgeti(co, base + 2, i);
      lua_rawgeti(co, base + 2, i + 1);
      /* the strings stay referenced by the table, which stays on the stack */
      hdrs[nh].name = lua_tostring(co, -2);
      hdrs[nh].value = lua_tostring(co, -1);
      lua_pop(co, 2);
      if (hdrs[nh].name && hdrs[nh].value) nh++;
    }
  }
  nh_error_t err = {0};
  if (nh_httpd_respond(r, (unsigned)status, hdrs, nh, body, len, &err) != 0)
    nh_log_error("httpd", "%s %s: %s; answered 500", method, path, err.msg);
}

static void route_done(nh_task_t *t, nh_task_status_t status, int nres)
{
  nh_httpd_req_t *r = nh_task_data(t);
  lua_State *co = nh_task_thread(t);
  const char *method = nh_httpd_req_method(r), *path = nh_httpd_req_path(r);
  switch (status) {
  case NH_TASK_OK:
    respond_from_results(r, co, nres);
    break;
  case NH_TASK_ERROR:
    nh_log_error("httpd", "%s %s: the request task failed: %s", method, path, lua_tostring(co, -1));
    respond_json_error(r, 500, "{\"error\":\"internal error\"}");
    break;
  case NH_TASK_KILLED: {
    nh_task_kill_t why = nh_task_kill(t);
    int deadline = why == NH_KILL_DEADLINE;   /* a CPU budget is the route's own failure: 500 */
    nh_log_error("httpd", "%s %s: the route was stopped: %s; answered %d", method, path, nh_task_kill_name(why),
                 deadline ? 504 : 500);
    if (deadline) respond_json_error(r, 504, "{\"error\":\"deadline exceeded\"}");
    else respond_json_error(r, 500, "{\"error\":\"internal error\"}");
    break;
  }
  case NH_TASK_CANCELLED:
    nh_log_debug("httpd", "%s %s: the route was cancelled (the Lua VM is closing)", method, path);
    respond_json_error(r, 503, "{\"error\":\"server shutting down\"}");
    break;
  }
}

/* ---------------------------------------------------------------- requests */

typedef struct pairs_ud {
  lua_State *L;
  lua_Integer n;
} pairs_ud_t;

static void push_pair(void *ud, const char *k, size_t klen, const char *v, size_t vlen)
{
  pairs_ud_t *p = ud;
  lua_pushlstring(p->L, k, klen);
  lua_rawseti(p->L, -2, ++p->n);
  if (v) lua_pushlstring(p->L, v, vlen);
  else lua_pushboolean(p->L, 0);
  lua_rawseti(p->L, -2, ++p->n);
}

static void on_request(void *data, nh_httpd_req_t *r)
{
  lserver_t *ls = data;
  nh_task_opts_t opts = { .kind = NH_TASK_KIND_ROUTE, .deadline_s = ls->timeout_s,
                          .cpu_budget_s = ls->cpu_budget_s, .on_done = route_done, .data = r };
  nh_task_t *t = nh_task_new(ls->vm, &opts);
  lua_State *co = nh_task_thread(t);
  lua_checkstack(co, 8);
  lua_rawgeti(co, LUA_REGISTRYINDEX, ls->fn_ref);
  lua_pushstring(co, nh_httpd_req_method(r));
  lua_pushstring(co, nh_httpd_req_path(r));
  pairs_ud_t p = { co, 0 };
  lua_newtable(co);
  nh_httpd_req_query(r, push_pair, &p);
  p.n = 0;
  lua_newtable(co);
  nh_httpd_req_headers(r, push_pair, &p);
  size_t len;
  const char *body = nh_httpd_req_body(r, &len);
  lua_pushlstring(co, body, len);
  nh_httpd_req_drop_body(r);
  /* next loop iteration: we are inside MHD's processing here */
  nh_task_start_later(t, 5);
}

/* ---------------------------------------------------------------- server object */

static lserver_t *check_server(lua_State *L) { return luaL_checkudata(L, 1, SERVER_MT); }

/* The open servers of a runtime: its list under this key. */
static const char servers_key = 's';
static nh_queue_t *servers(uv_loop_t *loop) { return nh_runtime_list(nh_runtime_of(loop), &servers_key); }

/* Harmless on a server not on the list (never started, or closed already). */
static void server_unlink(lserver_t *ls) { nh_queue_remove(&ls->node); }

void nh_lhttpd_quiesce_vm(nh_vm_t *vm)
{
  nh_queue_t *q;
  nh_queue_foreach(q, servers(vm->loop)) {
    lserver_t *ls = nh_queue_data(q, lserver_t, node);
    if (ls->vm == vm && ls->h) nh_httpd_quiesce(ls->h);
  }
}

int nh_lhttpd_vm_serves(nh_vm_t *vm)
{
  nh_queue_t *q;
  int n = 0;
  nh_queue_foreach(q, servers(vm->loop)) {
    lserver_t *ls = nh_queue_data(q, lserver_t, node);
    n += ls->vm == vm && ls->h;
  }
  return n;
}

static void server_stop(lua_State *L, lserver_t *ls)
{
  server_unlink(ls);
  if (!ls->h) return;
  nh_httpd_close(ls->h);
  ls->h = NULL;
  luaL_unref(L, LUA_REGISTRYINDEX, ls->fn_ref);
  luaL_unref(L, LUA_REGISTRYINDEX, ls->self_ref);
  ls->fn_ref = ls->self_ref = LUA_NOREF;
}

static int l_close(lua_State *L)
{
  server_stop(L, check_server(L));
  return 0;
}

static int l_gc(lua_State *L)
{
  server_stop(L, check_server(L));
  return 0;
}

static int l_port(lua_State *L)
{
  lua_pushinteger(L, check_server(L)->port);
  return 1;
}

static int l_listening(lua_State *L)
{
  lua_pushboolean(L, check_server(L)->h != NULL);
  return 1;
}

static int l_tostring(lua_State *L)
{
  lserver_t *ls = check_server(L);
  lua_pushfstring(L, "nimbus.http server (port %d, %s)", ls->port, ls->h ? "listening" : "closed");
  return 1;
}

static lua_Integer opt_nonneg(lua_State *L, int idx, lua_Integer def)
{
  lua_Integer v = luaL_optinteger(L, idx, def);
  luaL_argcheck(L, v >= 0, idx, "must be >= 0");
  return v;
}

static int l_listen(lua_State *L)
{
  luaL_checktype(L, 1, LUA_TFUNCTION);
  const char *host = luaL_optstring(L, 2, "127.0.0.1");
  lua_Integer port = luaL_checkinteger(L, 3);
  luaL_argcheck(L, port >= 0 && port <= 65535, 3, "port must be 0..65535");
  lua_Integer max_body = opt_nonneg(L, 4, 0);
  lua_Integer max_headers = opt_nonneg(L, 5, 0);
  double timeout = luaL_optnumber(L, 6, 30.0);
  double cpu = luaL_optnumber(L, 7, 0);
  lua_Integer idle = opt_nonneg(L, 8, 0);
  lua_Integer maxconn = opt_nonneg(L, 9, 0);
  luaL_argcheck(L, max_headers <= 100000 && idle <= 86400 && maxconn <= 1000000, 5, "limit out of range");

  lserver_t *ls = lua_newuserdatauv(L, sizeof *ls, 0);
  memset(ls, 0, sizeof *ls);
  nh_queue_init(&ls->node);
  ls->fn_ref = ls->self_ref = LUA_NOREF;
  ls->vm = nh_lua_vm(L);
  ls->timeout_s = timeout;
  ls->cpu_budget_s = cpu;
  luaL_setmetatable(L, SERVER_MT);
  if (ls->vm->check) {   /* `nimbus-host check`: the routes were validated; nothing listens */
    ls->port = (int)port;
    return 1;
  }

  nh_httpd_opts_t o = {
    .host = host, .port = (int)port, .max_body = (size_t)max_body, .max_headers = (unsigned)max_headers,
    .idle_timeout_s = (unsigned)idle, .max_connections = (unsigned)maxconn, .on_request = on_request, .data = ls,
    .owner = nh_lua_vm(L), .owner_key = nh_vm_path(nh_lua_vm(L)),
  };
  nh_error_t err = {0};
  char code[32];
  ls->h = nh_httpd_start(nh_lua_loop(L), &o, &err, code);
  if (!ls->h) {
    lua_pushnil(L);
    lua_pushstring(L, err.msg);
    lua_pushstring(L, code[0] ? code : "EIO");
    return 3;
  }
  ls->port = nh_httpd_port(ls->h);
  nh_queue_insert_head(servers(nh_lua_loop(L)), &ls->node);
  lua_pushvalue(L, 1);
  ls->fn_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_pushvalue(L, -1);
  ls->self_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  return 1;
}

int nh_lhttpd_open(lua_State *L)
{
  static const luaL_Reg methods[] = {
    { "close", l_close }, { "port", l_port }, { "listening", l_listening }, { NULL, NULL },
  };
  if (luaL_newmetatable(L, SERVER_MT)) {
    luaL_newlib(L, methods);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, l_gc);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, l_tostring);
    lua_setfield(L, -2, "__tostring");
  }
  lua_pop(L, 1);
  static const luaL_Reg fns[] = { { "listen", l_listen }, { NULL, NULL } };
  luaL_newlib(L, fns);
  return 1;
}
