/* VM lifecycle, adapter loading, and the task runner. Every C->Lua call outside a task
 * goes through nh_vm_pcall (traceback as message handler); tasks report errors through
 * lua_resume's status, with the traceback taken from the coroutine before it is reset. */
#include "nh_vm.h"
#include "nh_vm_int.h"
#include "core/nh_log.h"
#include "core/nh_util.h"

#include <lauxlib.h>
#include <lualib.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void nh_outcome_clear(nh_outcome_t *o)
{
  free(o->error_text);
  free(o->error_type);
  free(o->error_stack);
  free(o->handoff_reason);
  free(o->external_job_id);
  memset(o, 0, sizeof *o);
  o->expected_by_s = -1;
}

static int msgh_traceback(lua_State *L)
{
  const char *msg = lua_tostring(L, 1);
  if (!msg) {
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) msg = lua_tostring(L, -1);
    else msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  }
  luaL_traceback(L, L, msg, 1);
  return 1;
}

int nh_vm_pcall(lua_State *L, int nargs, int nres, nh_error_t *err)
{
  int base = lua_gettop(L) - nargs;
  lua_pushcfunction(L, msgh_traceback);
  lua_insert(L, base);
  int rc = lua_pcall(L, nargs, nres, base);
  lua_remove(L, base);
  if (rc != LUA_OK) {
    nh_error_set(err, NH_EFAIL, "%s", lua_tostring(L, -1) ? lua_tostring(L, -1) : "(non-string error)");
    lua_pop(L, 1);
    return NH_EFAIL;
  }
  return NH_OK;
}

static const char *src_lua_dir(void)
{
#ifdef NH_SOURCE_LUA_DIR
  return NH_SOURCE_LUA_DIR;
#else
  return NULL;
#endif
}

static int dir_has_nimbus(const char *dir)
{
  char p[2 * PATH_MAX];
  struct stat sb;
  snprintf(p, sizeof p, "%s/nimbus/init.lua", dir);
  return stat(p, &sb) == 0;
}

const char *nh_vm_lua_dir(const char *argv0)
{
  static char buf[PATH_MAX + 32];
  const char *env = getenv("NIMBUS_LUA_DIR");
  if (env && *env) return env;
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash) {
      *slash = '\0';
      snprintf(buf, sizeof buf, "%s/../share/nimbus-host/lua", exe);
      if (dir_has_nimbus(buf)) return buf;
    }
  }
  (void)argv0;
  const char *src = src_lua_dir();
  return src ? src : "lua";
}

static void set_package_path(lua_State *L, const char *lua_dir, const char *adapter_dir)
{
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "path");
  const char *old = lua_tostring(L, -1);
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  lua_pushfstring(L, "%s/?.lua;%s/?/init.lua;", lua_dir, lua_dir);
  luaL_addvalue(&b);
  if (adapter_dir) {
    lua_pushfstring(L, "%s/?.lua;%s/?/init.lua;", adapter_dir, adapter_dir);
    luaL_addvalue(&b);
  }
  luaL_addstring(&b, old ? old : "");
  luaL_pushresult(&b);
  lua_setfield(L, -3, "path");
  lua_pop(L, 2);
}

static void idle_cb(uv_idle_t *h);

static nh_vm_t *vm_create(uv_loop_t *loop, const char *path, const char *lua_dir, const nh_vm_host_t *host)
{
  nh_vm_t *vm = nh_xcalloc(1, sizeof *vm);
  vm->loop = loop;
  vm->path = nh_xstrdup(path ? path : "(script)");
  if (host) vm->host = *host;
  vm->has_host = host != NULL;
  vm->run_ref = LUA_NOREF;
  vm->L = luaL_newstate();
  if (!vm->L) {
    fputs("nimbus-host: cannot create a Lua state (out of memory)\n", stderr);
    abort();
  }
  *(void **)lua_getextraspace(vm->L) = NULL;   /* main thread: not a task */
  luaL_openlibs(vm->L);
  char *adir = NULL;
  if (path) {
    adir = nh_xstrdup(path);
    char *slash = strrchr(adir, '/');
    if (slash) *slash = '\0';
    else strcpy(adir, ".");
  }
  set_package_path(vm->L, lua_dir, adir);
  free(adir);
  nh_lapi_open(vm);
  uv_idle_init(loop, &vm->idle);
  vm->idle.data = vm;
  return vm;
}

static int load_run_ref(nh_vm_t *vm, nh_error_t *err)
{
  lua_State *L = vm->L;
  lua_getglobal(L, "require");
  lua_pushliteral(L, "nimbus");
  if (nh_vm_pcall(L, 1, 1, err)) return NH_EFAIL;
  lua_getfield(L, -1, "_run");
  if (!lua_isfunction(L, -1)) {
    lua_pop(L, 2);
    return nh_error_set(err, NH_EFAIL, "the nimbus Lua module has no _run function (wrong NIMBUS_LUA_DIR?)");
  }
  vm->run_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_pop(L, 1);
  return NH_OK;
}

nh_vm_t *nh_vm_new(uv_loop_t *loop, const char *adapter_path, const char *lua_dir, const nh_vm_host_t *host,
                   nh_error_t *err)
{
  nh_vm_t *vm = vm_create(loop, adapter_path, lua_dir, host);
  lua_State *L = vm->L;
  if (!dir_has_nimbus(lua_dir)) {
    nh_error_set(err, NH_EFAIL, "cannot find the nimbus Lua runtime in %s (set NIMBUS_LUA_DIR to the lua/ directory)",
                 lua_dir);
    goto fail;
  }
  if (load_run_ref(vm, err)) goto fail;
  int rc = luaL_loadfile(L, adapter_path);
  if (rc != LUA_OK) {
    /* Syntax errors already read "file:line: message". */
    nh_error_set(err, NH_EUSAGE, "%s", lua_tostring(L, -1));
    lua_pop(L, 1);
    goto fail;
  }
  if (nh_vm_pcall(L, 0, 0, err)) {
    err->code = NH_EUSAGE;
    goto fail;
  }
  return vm;
fail:
  nh_vm_close(vm);
  return NULL;
}

static void vm_free_cb(uv_handle_t *h)
{
  nh_vm_t *vm = h->data;
  free(vm->path);
  free(vm);
}

void nh_vm_close(nh_vm_t *vm)
{
  if (!vm) return;
  nh_vm_cancel_all(vm);
  uv_idle_stop(&vm->idle);
  lua_close(vm->L);
  vm->L = NULL;
  uv_close((uv_handle_t *)&vm->idle, vm_free_cb);
}

lua_State *nh_vm_state(nh_vm_t *vm) { return vm->L; }
const char *nh_vm_path(nh_vm_t *vm) { return vm->path; }
int nh_vm_live_tasks(nh_vm_t *vm) { return vm->live_tasks; }

int nh_vm_subscriptions(nh_vm_t *vm, nh_vm_sub_cb cb, void *data, nh_error_t *err)
{
  lua_State *L = vm->L;
  lua_getglobal(L, "require");
  lua_pushliteral(L, "nimbus");
  if (nh_vm_pcall(L, 1, 1, err)) return NH_EFAIL;
  lua_getfield(L, -1, "_subscriptions");
  if (nh_vm_pcall(L, 0, 1, err)) {
    lua_pop(L, 1);
    return NH_EFAIL;
  }
  lua_pushnil(L);
  while (lua_next(L, -2)) {
    const char *name = lua_tostring(L, -2);
    int n = (int)luaL_len(L, -1);
    const char **types = nh_xcalloc((size_t)n + 1, sizeof *types);
    for (int i = 0; i < n; i++) {
      lua_rawgeti(L, -1 - i, i + 1);
      types[i] = lua_tostring(L, -1);
    }
    cb(data, name, types, n);
    lua_pop(L, n);
    free(types);
    lua_pop(L, 1);
  }
  lua_pop(L, 2);
  return NH_OK;
}

/* ---------------------------------------------------------------- tasks */

static void task_list_remove(nh_vm_t *vm, nh_task_t *t)
{
  if (t->prev) t->prev->next = t->next;
  else vm->tasks = t->next;
  if (t->next) t->next->prev = t->prev;
  t->next = t->prev = NULL;
}

static char *field_str(lua_State *co, int idx, const char *key)
{
  lua_getfield(co, idx, key);
  char *v = NULL;
  if (lua_type(co, -1) == LUA_TSTRING || lua_type(co, -1) == LUA_TNUMBER) v = nh_xstrdup(lua_tostring(co, -1));
  lua_pop(co, 1);
  return v;
}

static void outcome_from_table(lua_State *co, int idx, nh_outcome_t *o)
{
  static const struct { const char *name; nh_outcome_kind_t kind; } kinds[] = {
    { "completed", NH_OUT_COMPLETED }, { "failed", NH_OUT_FAILED }, { "handoff", NH_OUT_HANDOFF },
    { "deadletter", NH_OUT_DEADLETTER }, { "unsupported", NH_OUT_UNSUPPORTED },
    { "transient", NH_OUT_TRANSIENT },
  };
  char *status = field_str(co, idx, "status");
  o->kind = NH_OUT_FAILED;
  int known = 0;
  for (size_t i = 0; status && i < sizeof kinds / sizeof kinds[0]; i++)
    if (strcmp(status, kinds[i].name) == 0) {
      o->kind = kinds[i].kind;
      known = 1;
    }
  free(status);
  if (!known) {
    o->error_text = nh_xstrdup("internal error: the nimbus runner returned no known status");
    o->error_type = nh_xstrdup("HostError");
    return;
  }
  o->error_text = field_str(co, idx, "error_text");
  o->error_type = field_str(co, idx, "error_type");
  o->error_stack = field_str(co, idx, "error_stack");
  o->handoff_reason = field_str(co, idx, "handoff_reason");
  o->external_job_id = field_str(co, idx, "external_job_id");
  lua_getfield(co, idx, "expected_by");
  o->expected_by_s = lua_isnumber(co, -1) ? lua_tonumber(co, -1) : -1;
  lua_pop(co, 1);
}

static void task_finish(nh_task_t *t, nh_outcome_t *o)
{
  nh_vm_t *vm = t->vm;
  task_list_remove(vm, t);
  if (vm->L) {
    lua_resetthread(t->co);   /* 5.4.4: closes pending to-be-closed variables */
    luaL_unref(vm->L, LUA_REGISTRYINDEX, t->co_ref);
  }
  vm->live_tasks--;
  void *data = t->data;
  free(t);
  if (vm->has_host && vm->host.task_done) vm->host.task_done(vm->host.data, data, o);
  else nh_outcome_clear(o);
}

/* Resumes a task with `nargs` values already on its stack. */
static void task_resume(nh_task_t *t, int nargs)
{
  int nres = 0;
  lua_State *co = t->co;
  int rc = lua_resume(co, t->vm->L, nargs, &nres);
  nh_outcome_t o;
  memset(&o, 0, sizeof o);
  o.expected_by_s = -1;
  if (rc == LUA_YIELD) {
    lua_pop(co, nres);
    if (!t->pending) {
      /* A bare coroutine.yield(): run again on the next loop iteration. */
      t->resume_next = 1;
      if (!uv_is_active((uv_handle_t *)&t->vm->idle)) uv_idle_start(&t->vm->idle, idle_cb);
    }
    return;
  }
  if (rc == LUA_OK) {
    if (nres >= 1 && lua_istable(co, -nres)) {
      outcome_from_table(co, lua_gettop(co) - nres + 1, &o);
    } else {
      o.kind = NH_OUT_FAILED;
      o.error_text = nh_xstrdup("internal error: the nimbus runner returned no outcome");
      o.error_type = nh_xstrdup("HostError");
    }
  } else {
    /* An error the runner's xpcall did not catch (it raised itself, or out of memory). */
    const char *msg = lua_tostring(co, -1);
    luaL_traceback(co, co, msg ? msg : "(non-string error)", 0);
    o.kind = NH_OUT_FAILED;
    o.error_text = nh_xstrdup(msg ? msg : "(non-string error)");
    o.error_type = nh_xstrdup(rc == LUA_ERRMEM ? "OutOfMemory" : "LuaError");
    o.error_stack = nh_xstrdup(lua_tostring(co, -1));
  }
  task_finish(t, &o);
}

static void idle_cb(uv_idle_t *h)
{
  nh_vm_t *vm = h->data;
  uv_idle_stop(h);
  /* Collect first: resuming may start or finish other tasks. */
  int n = 0;
  for (nh_task_t *t = vm->tasks; t; t = t->next) n += t->resume_next;
  if (!n) return;
  nh_task_t **due = nh_xmalloc(sizeof *due * (size_t)n);
  int i = 0;
  for (nh_task_t *t = vm->tasks; t; t = t->next)
    if (t->resume_next) {
      t->resume_next = 0;
      due[i++] = t;
    }
  for (i = 0; i < n; i++) task_resume(due[i], 0);
  free(due);
}

static void set_str(lua_State *L, const char *k, const char *v)
{
  if (!v) return;
  lua_pushstring(L, v);
  lua_setfield(L, -2, k);
}

int nh_vm_task_start(nh_vm_t *vm, const nh_task_args_t *a, nh_error_t *err)
{
  lua_State *L = vm->L;
  if (!lua_checkstack(L, 8)) return nh_error_set(err, NH_EFAIL, "Lua stack exhausted");
  nh_task_t *t = nh_xcalloc(1, sizeof *t);
  t->vm = vm;
  t->data = a->data;
  t->co = lua_newthread(L);
  *(void **)lua_getextraspace(t->co) = t;
  t->co_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  t->next = vm->tasks;
  if (vm->tasks) vm->tasks->prev = t;
  vm->tasks = t;
  vm->live_tasks++;

  lua_State *co = t->co;
  lua_rawgeti(co, LUA_REGISTRYINDEX, vm->run_ref);
  lua_pushstring(co, a->endpoint);
  lua_pushstring(co, a->event_type);
  if (a->body) lua_pushlstring(co, a->body, a->body_len);
  else lua_pushnil(co);
  lua_createtable(co, 0, 12);
  set_str(co, "endpoint", a->endpoint);
  set_str(co, "event_type", a->event_type);
  set_str(co, "event_id", a->event_id);
  set_str(co, "message_id", a->message_id);
  set_str(co, "session_id", a->session_id);
  set_str(co, "correlation_id", a->correlation_id);
  set_str(co, "originating_message_id", a->originating_message_id);
  set_str(co, "kind", a->kind);
  lua_pushinteger(co, a->retry_count);
  lua_setfield(co, -2, "retry_count");
  lua_pushinteger(co, a->delivery_count);
  lua_setfield(co, -2, "delivery_count");
  lua_pushinteger(co, a->enqueued_at);   /* ctx.enqueued_at (ISO text) is built lazily in Lua */
  lua_setfield(co, -2, "enqueued_ms");
  task_resume(t, 4);
  return NH_OK;
}

void nh_vm_cancel_all(nh_vm_t *vm)
{
  while (vm->tasks) {
    nh_outcome_t o;
    memset(&o, 0, sizeof o);
    o.kind = NH_OUT_CANCELLED;
    o.expected_by_s = -1;
    task_finish(vm->tasks, &o);
  }
}

nh_task_t *nh_vm_current_task(lua_State *L) { return *(nh_task_t **)lua_getextraspace(L); }

/* ---------------------------------------------------------------- interpreter mode */

int nh_vm_run_script(uv_loop_t *loop, const char *script, int argc, char **argv, const char *lua_dir)
{
  nh_vm_t *vm = vm_create(loop, NULL, lua_dir, NULL);
  lua_State *L = vm->L;
  /* arg[0] = script, arg[1..] = the rest, negative indices = the host itself (lua.c) */
  lua_createtable(L, argc, 1);
  lua_pushstring(L, script);
  lua_rawseti(L, -2, 0);
  for (int i = 0; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i + 1);
  }
  lua_setglobal(L, "arg");
  int status = 0;
  nh_error_t err = {0};
  if (luaL_loadfile(L, script) != LUA_OK) {
    fprintf(stderr, "nimbus-host: %s\n", lua_tostring(L, -1));
    lua_pop(L, 1);
    status = 2;
  } else {
    for (int i = 0; i < argc; i++) lua_pushstring(L, argv[i]);
    if (nh_vm_pcall(L, argc, 0, &err)) {
      fprintf(stderr, "nimbus-host: %s\n", err.msg);
      status = 1;
    }
  }
  uv_run(loop, UV_RUN_DEFAULT);
  nh_vm_close(vm);
  uv_run(loop, UV_RUN_DEFAULT);
  return status;
}
