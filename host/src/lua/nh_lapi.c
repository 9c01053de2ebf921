/* The C side of the `nimbus` module, preloaded as "nimbus.core". */
#include "nh_task.h"
#include "nh_vm_int.h"
#include "core/nh_log.h"
#include "core/nh_util.h"

#include "nh_lasync.h"
#include "nh_lmodules.h"

#include <lauxlib.h>
#include <stdlib.h>
#include <string.h>

#ifndef NH_VERSION
#define NH_VERSION "0.0.0"
#endif

static nh_vm_t *upvm(lua_State *L) { return lua_touserdata(L, lua_upvalueindex(1)); }

/* core.log(level, msg, fields): fields is the flat { key, value, ... } list built by
 * nimbus.log (lua/nimbus/init.lua); a value { json } is JSON text. */
static int l_log(lua_State *L)
{
  static const char *const levels[] = { "debug", "info", "warn", "error", NULL };
  int level = luaL_checkoption(L, 1, "info", levels);
  const char *msg = luaL_checkstring(L, 2);
  if (!nh_log_enabled((nh_log_level_t)level)) return 0;
  enum { MAX_FIELDS = 64 };
  nh_log_field_t f[MAX_FIELDS];
  int n = 0;
  if (lua_istable(L, 3)) {
    lua_Integer len = luaL_len(L, 3);
    luaL_checkstack(L, 3 * MAX_FIELDS + 4, "log fields");   /* at most three values a field */
    for (lua_Integer i = 1; i + 1 <= len && n < MAX_FIELDS; i += 2) {
      lua_rawgeti(L, 3, i);   /* left on the stack: the strings stay alive until the line is written */
      lua_rawgeti(L, 3, i + 1);
      const char *key = lua_tostring(L, -2);
      if (!key) continue;
      nh_log_field_t *x = &f[n];
      memset(x, 0, sizeof *x);
      x->key = key;
      switch (lua_type(L, -1)) {
      case LUA_TNUMBER:
        if (lua_isinteger(L, -1)) x->kind = NH_LF_INT, x->i = (int64_t)lua_tointeger(L, -1);
        else x->kind = NH_LF_NUM, x->num = (double)lua_tonumber(L, -1);
        break;
      case LUA_TBOOLEAN:
        x->kind = NH_LF_BOOL;
        x->i = lua_toboolean(L, -1);
        break;
      case LUA_TTABLE:
        lua_rawgeti(L, -1, 1);
        x->kind = NH_LF_JSON;
        x->str = lua_tostring(L, -1);
        break;
      case LUA_TNIL:
        x->kind = NH_LF_STR;
        break;
      default:
        x->kind = NH_LF_STR;
        x->str = lua_tostring(L, -1);
      }
      n++;
    }
  }
  nh_log_fields((nh_log_level_t)level, "lua", f, n, "%s", msg);
  return 0;
}

/* core.hook_add(name): nimbus.on registered a function (validated there). */
static int l_hook_add(lua_State *L)
{
  nh_vm_t *vm = upvm(L);
  int h = nh_hook_find(luaL_checkstring(L, 1));
  luaL_argcheck(L, h >= 0, 1, "unknown hook");
  vm->hooks[h]++;
  return 0;
}

static int l_now(lua_State *L)
{
  lua_pushnumber(L, (lua_Number)nh_time_now_ms() / 1000.0);
  return 1;
}

static int l_register_endpoint(lua_State *L)
{
  nh_vm_t *vm = upvm(L);
  const char *name = luaL_checkstring(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  lua_pushboolean(L, 1);
  if (!vm->has_host || !vm->host.register_endpoint) return 1;   /* interpreter mode: declare only */
  nh_error_t err = {0};
  if (vm->host.register_endpoint(vm->host.data, vm, L, name, 2, &err)) {
    /* nil, message: nimbus.endpoint raises it at the adapter's own line */
    lua_pushnil(L);
    lua_pushfstring(L, "nimbus.endpoint(%s): %s", name, err.msg);
    return 2;
  }
  return 1;
}

static const char *opt_str(lua_State *L, int idx)
{
  return lua_isnoneornil(L, idx) ? NULL : luaL_checkstring(L, idx);
}

static int l_set_retention(lua_State *L)
{
  nh_vm_t *vm = upvm(L);
  const char *resolved = opt_str(L, 1), *inbox = opt_str(L, 2);
  if (!vm->has_host || !vm->host.set_retention) return 0;   /* interpreter mode: nothing to delete */
  nh_error_t err = {0};
  if (vm->host.set_retention(vm->host.data, resolved, inbox, &err)) {
    lua_pushnil(L);   /* nimbus.retention raises it at the adapter's line */
    lua_pushstring(L, err.msg);
    return 2;
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* ---------------------------------------------------------------- answers that come later */

struct nh_later {
  nh_op_t op;
  nh_task_t *task;                               /* NULL once the task ended (the op was cancelled) */
  int (*fail)(lua_State *L, const nh_error_t *err);   /* pushes the call's error answer */
};

/* The task ends while the host still works: the host keeps the handle and answers into
 * nothing (nh_later_done frees it). */
static void later_cancel(nh_op_t *op) { ((nh_later_t *)op)->task = NULL; }

/* A handle when L can wait for the answer: L is a task's own thread, yieldable. */
static nh_later_t *later_new(lua_State *L, int (*fail)(lua_State *, const nh_error_t *))
{
  nh_task_t *t = nh_task_of(L);
  if (!t || !lua_isyieldable(L)) return NULL;
  nh_later_t *l = nh_xcalloc(1, sizeof *l);
  l->op.cancel = later_cancel;
  l->task = t;
  l->fail = fail;
  return l;
}

lua_State *nh_later_thread(nh_later_t *l) { return l->task ? nh_task_thread(l->task) : NULL; }

void nh_later_done(nh_later_t *l, int nres)
{
  nh_task_t *t = l->task;
  free(l);
  if (t) nh_task_complete(t, nres);
}

void nh_later_fail(nh_later_t *l, const nh_error_t *err)
{
  lua_State *co = nh_later_thread(l);
  nh_later_done(l, co ? l->fail(co, err) : 0);
}

static int publish_fail(lua_State *L, const nh_error_t *err)
{
  /* ENOSTORE: a script with no store to publish to (nimbus.publish raises it, saying what
   * to do); ENOSUBSCRIBER: a script's publish nobody subscribes to, nothing queued */
  lua_pushnil(L);
  lua_pushstring(L, err->msg);
  lua_pushstring(L, err->code == NH_EUSAGE      ? "EINVAL"
                    : err->code == NH_ESTATE    ? "ENOSTORE"
                    : err->code == NH_ENOTFOUND ? "ENOSUBSCRIBER"
                                                : "EIO");
  return 3;
}

static int l_publish(lua_State *L)
{
  nh_vm_t *vm = upvm(L);
  const char *type = luaL_checkstring(L, 1);
  size_t len;
  const char *body = luaL_checklstring(L, 2, &len);
  const char *session = opt_str(L, 3), *corr = opt_str(L, 4), *to = opt_str(L, 5), *given = opt_str(L, 6);
  if (!vm->has_host || !vm->host.publish)
    return luaL_error(L, "nimbus.publish: this Lua state has no store or transport to publish to");
  /* Only a handler's publishes wait for its outcome; others are sent at once. */
  /* The running task, not L's: a coroutine created inside a handler publishes for it. */
  nh_task_t *t = nh_task_running(L);
  if (t && nh_task_kind(t) != NH_TASK_KIND_HANDLER) t = NULL;
  char mid[37];
  int duplicate = 0;
  nh_error_t err = {0};
  /* a handler's publish is answered now, but for whether its own MessageId is taken */
  nh_later_t *later = t && !given ? NULL : later_new(L, publish_fail);
  int rc = vm->host.publish(vm->host.data, t ? nh_task_data(t) : NULL, type, body, len, session, corr, to, given,
                            mid, &duplicate, later, &err);
  if (rc == NH_LATER) return nh_task_yield(L, later->task, &later->op);
  free(later);
  if (rc) return publish_fail(L, &err);
  lua_pushstring(L, given ? given : mid);
  lua_pushboolean(L, duplicate);
  return 2;
}

/* pending_handoffs' error answer: the message, raised by pending_k once resumed */
static int pending_fail(lua_State *L, const nh_error_t *err)
{
  lua_pushstring(L, err->msg);
  return 1;
}

static int pending_k(lua_State *L, int status, lua_KContext ctx)
{
  (void)status;
  (void)ctx;
  return lua_istable(L, -1) ? 1 : lua_error(L);
}

static int l_pending_handoffs(lua_State *L)
{
  nh_vm_t *vm = upvm(L);
  const char *endpoint = luaL_checkstring(L, 1);
  if (!vm->host.pending_handoffs)
    return luaL_error(L, "pending hand-offs can only be listed inside a running host or a script with a store");
  nh_error_t err = {0};
  nh_later_t *later = later_new(L, pending_fail);
  int rc = vm->host.pending_handoffs(vm->host.data, L, endpoint, later, &err);
  if (rc == NH_LATER) return nh_task_yieldk(L, later->task, &later->op, 0, pending_k);
  free(later);
  if (rc) return luaL_error(L, "%s", err.msg);
  return 1;
}

static int handoff_fail(lua_State *L, const nh_error_t *err)
{
  lua_pushnil(L);
  lua_pushstring(L, err->msg);
  lua_pushstring(L, err->code == NH_ESTATE                                 ? "ESTATE"
                 : err->code == NH_EUSAGE || err->code == NH_ENOTFOUND ? "ENOTFOUND"
                                                                       : "EIO");
  return 3;
}

/* core.handoff("complete"|"fail", event_id, endpoint, session, message_id, result, store, text, type) */
static int l_handoff(lua_State *L)
{
  nh_vm_t *vm = upvm(L);
  static const char *const kinds[] = { "fail", "complete", NULL };
  nh_handoff_req_t req = {
    .complete = luaL_checkoption(L, 1, NULL, kinds), .event_id = luaL_checkstring(L, 2),
    .endpoint = opt_str(L, 3), .session_id = opt_str(L, 4), .message_id = opt_str(L, 5), .result = opt_str(L, 6),
    .store = opt_str(L, 7), .error_text = opt_str(L, 8), .error_type = opt_str(L, 9),
  };
  nh_task_t *t = nh_task_running(L);
  req.actor = t ? nh_task_kind_name(nh_task_kind(t)) : "script";
  if (!vm->host.handoff) return luaL_error(L, "hand-offs can only be settled inside a running host or a script");
  nh_error_t err = {0};
  nh_later_t *later = later_new(L, handoff_fail);
  int rc = vm->host.handoff(vm->host.data, &req, later, &err);
  if (rc == NH_LATER) return nh_task_yield(L, later->task, &later->op);
  free(later);
  if (rc) return handoff_fail(L, &err);
  lua_pushboolean(L, 1);
  return 1;
}

typedef struct req_op {
  nh_op_t op;
  nh_task_t *task;
  nh_vm_t *vm;
  void *handle;
} req_op_t;

static void req_cancel(nh_op_t *op)
{
  req_op_t *r = (req_op_t *)op;
  r->vm->host.request_cancel(r->vm->host.data, r->handle);
  free(r);
}

static void req_done(void *ud, const char *reply, const char *msg, const char *code)
{
  req_op_t *r = ud;
  nh_task_t *t = r->task;
  lua_State *co = nh_task_thread(t);
  free(r);
  if (reply) {
    lua_pushstring(co, reply);
    nh_task_complete(t, 1);
  } else {
    lua_pushnil(co);
    lua_pushstring(co, msg ? msg : "request failed");
    lua_pushstring(co, code ? code : "EIO");
    nh_task_complete(t, 3);
  }
}

/* core.request(type, body, session, timeout_s): yields until the reply */
static int l_request(lua_State *L)
{
  nh_vm_t *vm = upvm(L);
  const char *type = luaL_checkstring(L, 1);
  size_t len;
  const char *body = luaL_checklstring(L, 2, &len);
  const char *session = opt_str(L, 3);
  double timeout = luaL_optnumber(L, 4, 10.0);
  nh_task_t *t = nh_task_check(L, "nimbus.request");
  if (!vm->host.request)
    return luaL_error(L, "nimbus.request works inside a running host (nimbus-host ADAPTER.lua)");
  req_op_t *r = nh_xcalloc(1, sizeof *r);
  r->op.cancel = req_cancel;
  r->task = t;
  r->vm = vm;
  nh_error_t err = {0};
  r->handle = vm->host.request(vm->host.data, type, body, len, session, nh_task_trace(t), timeout, req_done, r, &err);
  if (!r->handle) {
    free(r);
    lua_pushnil(L);
    lua_pushstring(L, err.msg);
    lua_pushstring(L, err.code == NH_ENOTFOUND ? "ENOREPLIER" : "EIO");
    return 3;
  }
  return nh_task_yield(L, t, &r->op);
}

static int open_core(lua_State *L)
{
  static const luaL_Reg fns[] = {
    { "log", l_log }, { "now", l_now }, { "register_endpoint", l_register_endpoint },
    { "set_retention", l_set_retention },
    { "publish", l_publish }, { "pending_handoffs", l_pending_handoffs }, { "handoff", l_handoff },
    { "request", l_request }, { "hook_add", l_hook_add },
    { NULL, NULL },
  };
  luaL_newlibtable(L, fns);
  lua_pushlightuserdata(L, lua_touserdata(L, lua_upvalueindex(1)));
  luaL_setfuncs(L, fns, 1);
  nh_lasync_register(L);
  lua_pushliteral(L, NH_VERSION);
  lua_setfield(L, -2, "version");
  /* what the VM runs: an adapter in a host ("run"), a -l script ("script"), or an adapter
   * under `nimbus-host check` ("check", where configuration mistakes are recorded) */
  nh_vm_t *vm = lua_touserdata(L, lua_upvalueindex(1));
  lua_pushstring(L, vm->check ? "check" : vm->script ? "script" : "run");
  lua_setfield(L, -2, "mode");
  return 1;
}

nh_vm_t *nh_lua_vm(lua_State *L)
{
  lua_getfield(L, LUA_REGISTRYINDEX, "nimbus.vm");
  nh_vm_t *vm = lua_touserdata(L, -1);
  lua_pop(L, 1);
  return vm;
}

uv_loop_t *nh_lua_loop(lua_State *L) { return nh_lua_vm(L)->loop; }

void nh_lapi_open(nh_vm_t *vm)
{
  lua_State *L = vm->L;
  lua_pushlightuserdata(L, vm);
  lua_setfield(L, LUA_REGISTRYINDEX, "nimbus.vm");
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
  lua_pushlightuserdata(L, vm);
  lua_pushcclosure(L, open_core, 1);
  lua_setfield(L, -2, "nimbus.core");
  lua_pushcfunction(L, nh_lsqlite_open);
  lua_setfield(L, -2, "nimbus.sqlite.core");
  lua_pushcfunction(L, nh_lhttpd_open);
  lua_setfield(L, -2, "nimbus.httpd.core");
  lua_pushcfunction(L, nh_lhttp_open);
  lua_setfield(L, -2, "nimbus.http.core");
  lua_pushcfunction(L, nh_lcrypto_open);
  lua_setfield(L, -2, "nimbus.crypto.core");
  lua_pop(L, 1);
}
