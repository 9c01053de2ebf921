/* VM lifecycle, adapter loading, and the task runner. Every C->Lua call outside a task
 * goes through nh_vm_pcall (traceback as message handler); tasks report errors through
 * lua_resume's status, with the traceback taken from the coroutine before it is reset.
 * The runtime's private functions (the handler runner, subscriptions, hooks, liveness)
 * come from require("nimbus.internal"), never from the public `nimbus` table. */
#include "nh_vm.h"
#include "nh_lasync.h"
#include "nh_lmodules.h"
#include "nh_task.h"
#include "nh_vm_int.h"
#include "core/nh_log.h"
#include "core/nh_util.h"
#include "net/nh_http_client.h"

#include <lauxlib.h>
#include <lualib.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
  if (nh_share_dir("lua", buf, sizeof buf) == 0 && dir_has_nimbus(buf)) return buf;
  (void)argv0;
  const char *src = src_lua_dir();
  return src ? src : "lua";
}

static void set_package_path(lua_State *L, const char *lua_dir, const char *adapter_dir)
{
  /* Chunk names come from these paths ("@<path>/nimbus/init.lua"), and the runtime blames a
   * configuration mistake on the first frame outside lua/ and adapters/ by comparing them:
   * canonical absolute paths ("/x/adapters/y.lua", not "/x/lua/../adapters/y.lua" or a
   * relative "lua/../adapters/y.lua") make that comparison and the file:line it prints exact. */
  char real_lua[PATH_MAX];
  if (realpath(lua_dir, real_lua)) lua_dir = real_lua;
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
  /* The adapter library (adapters/, docs/adapters.md) sits beside lua/: in the source tree
   * and under <prefix>/share/nimbus-host. `require("adapters.http_forward")` resolves through
   * the parent directory, after the adapter's own directory so a local module wins. */
  char up[PATH_MAX + 4], parent[PATH_MAX + 4], probe[PATH_MAX + 24];
  struct stat sb;
  snprintf(up, sizeof up, "%s/..", lua_dir);
  if (!realpath(up, parent)) snprintf(parent, sizeof parent, "%s", up);
  snprintf(probe, sizeof probe, "%s/adapters", parent);
  if (stat(probe, &sb) == 0 && S_ISDIR(sb.st_mode)) {
    lua_pushfstring(L, "%s/?.lua;", parent);
    luaL_addvalue(&b);
  }
  luaL_addstring(&b, old ? old : "");
  luaL_pushresult(&b);
  lua_setfield(L, -3, "path");
  lua_pop(L, 2);
}

/* The small-block pool. Lua tells the size of every block it frees or resizes, so a
 * block needs no header: a free is a push onto its class's list and an allocation a pop.
 * A handler run allocates and frees about 50 blocks of the same few sizes (ctx, its
 * strings, the decoded event, closures of the middleware chain): through malloc and
 * free they cost 6,500 instructions per event of the e2e bench (3 % of the host's).
 * Slabs go back to malloc only when the VM closes: what the pool keeps is the most small
 * blocks the VM held at once (a reload's new VM starts an empty pool). Under
 * AddressSanitizer every block is malloc's, so the fuzz builds still see each use after
 * free. */
#define NH_VM_POOL (!NH_ASAN)

#define NH_VM_SLAB (64 * 1024)
#define NH_VM_SLAB_HEAD 16   /* the slab link, keeping the blocks 16-byte aligned */

static void *pool_get(nh_vm_pool_t *p, size_t n)
{
  size_t c = (n - 1) / 16, size = (c + 1) * 16;
  void *b = p->free[c];
  if (b) {
    p->free[c] = *(void **)b;
    return b;
  }
  if (p->bump_left < size) {
    char *slab = malloc(NH_VM_SLAB);
    if (!slab) return NULL;
    *(void **)slab = p->slabs;
    p->slabs = slab;
    /* the old slab's tail (under NH_VM_POOL_MAX bytes) is left unused */
    p->bump = slab + NH_VM_SLAB_HEAD;
    p->bump_left = NH_VM_SLAB - NH_VM_SLAB_HEAD;
  }
  b = p->bump;
  p->bump += size;
  p->bump_left -= size;
  return b;
}

static void pool_put(nh_vm_pool_t *p, void *b, size_t n)
{
  size_t c = (n - 1) / 16;
  *(void **)b = p->free[c];
  p->free[c] = b;
}

static void pool_close(nh_vm_pool_t *p)
{
  while (p->slabs) {
    void *next = *(void **)p->slabs;
    free(p->slabs);
    p->slabs = next;
  }
}

static int pooled(size_t n) { return NH_VM_POOL && n > 0 && n <= NH_VM_POOL_MAX; }

/* realloc over the pool and malloc: the old block's size is osize (Lua's word for it). */
static void *vm_realloc(nh_vm_pool_t *p, void *ptr, size_t old, size_t nsize)
{
  int was = pooled(old), is = pooled(nsize);
  if (!was && !is) return realloc(ptr, nsize);
  if (was && is && (old - 1) / 16 == (nsize - 1) / 16) return ptr;   /* same class */
  void *b = is ? pool_get(p, nsize) : malloc(nsize);
  if (!b) return NULL;
  if (ptr) {
    memcpy(b, ptr, old < nsize ? old : nsize);
    if (was) pool_put(p, ptr, old);
    else free(ptr);
  }
  return b;
}

/* Allocator with a per-VM limit. The limit only applies while a task runs, so a memory
 * bomb fails inside lua_resume (protected: the handler fails) and the host's own
 * unprotected API calls between tasks never hit it. */
static void *vm_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
  nh_vm_t *vm = ud;
  size_t old = ptr ? osize : 0;
  if (nsize == 0) {
    if (pooled(old)) pool_put(&vm->pool, ptr, old);
    else free(ptr);
    vm->mem -= old;
    return NULL;
  }
  if (nsize > old && vm->in_task && vm->mem + (nsize - old) > vm->mem_limit) return NULL;
  void *p = vm_realloc(&vm->pool, ptr, old, nsize);
  if (!p) return NULL;
  vm->mem = vm->mem - old + nsize;
  return p;
}

static size_t vm_mem_limit(void)
{
  const char *env = getenv("NIMBUS_MEMORY_LIMIT_MB");
  long mb = env ? strtol(env, NULL, 10) : 0;
  return (size_t)(mb > 0 ? mb : 1024) << 20;
}

static int vm_panic(lua_State *L)
{
  const char *msg = lua_tostring(L, -1);
  nh_log_error("lua", "unprotected Lua error, aborting: %s", msg ? msg : "(not a string)");
  abort();
  return 0;
}

/* Lua warnings (for instance an error inside a __gc metamethod) go to the log. */
static void vm_warn(void *ud, const char *msg, int tocont)
{
  nh_vm_t *vm = ud;
  size_t n = strlen(msg);
  if (n > sizeof vm->warn_buf - 1 - vm->warn_len) n = sizeof vm->warn_buf - 1 - vm->warn_len;
  memcpy(vm->warn_buf + vm->warn_len, msg, n);
  vm->warn_len += n;
  vm->warn_buf[vm->warn_len] = '\0';
  if (tocont) return;
  if (vm->warn_buf[0] != '@') nh_log_warn("lua", "%s: warning: %s", vm->path, vm->warn_buf);
  vm->warn_len = 0;
}

/* os.exit in an adapter would take every endpoint of the host down (and again at every
 * restart, before the event gets an outcome): it fails the handler instead. */
static int l_no_exit(lua_State *L)
{
  return luaL_error(L, "os.exit is not available in an adapter (it would stop the whole host): raise an error "
                       "to fail the event, or return");
}

/* The main chunk of an adapter must return: loading runs on the loop thread, so one that
 * waits for ever would freeze every endpoint and the signal handlers with it. */
#define NH_LOAD_BUDGET_S 10.0
#define NH_LOAD_HOOK_COUNT 10000

static void load_hook(lua_State *L, lua_Debug *ar)
{
  void *ud = NULL;
  lua_getallocf(L, &ud);
  nh_vm_t *vm = ud;
  if (!vm->load_deadline_ns || uv_hrtime() < vm->load_deadline_ns) return;
  /* from now on every instruction raises, so a pcall inside a loop cannot outlast it */
  lua_sethook(L, load_hook, LUA_MASKCOUNT, 1);
  char secs[32];
  snprintf(secs, sizeof secs, "%g", vm->load_budget_s);   /* lua_pushfstring has no %g */
  lua_getinfo(L, "Sl", ar);   /* the interrupted function: where the load was stopped */
  lua_pushfstring(L, "%s:%d: loading the adapter took longer than %s s and was stopped here: the main chunk must "
                     "return (run long work in a status checker or nimbus.spawn; NIMBUS_LOAD_TIMEOUT sets the budget)",
                  ar->short_src, ar->currentline, secs);
  lua_error(L);
}

static double load_budget(void)
{
  const char *v = getenv("NIMBUS_LOAD_TIMEOUT");
  double s = v ? atof(v) : 0;
  return s > 0 ? s : NH_LOAD_BUDGET_S;
}

static nh_vm_t *vm_create(uv_loop_t *loop, const char *path, const char *lua_dir, const nh_vm_host_t *host)
{
  nh_vm_t *vm = nh_xcalloc(1, sizeof *vm);
  vm->loop = loop;
  vm->path = nh_xstrdup(path ? path : "(script)");
  vm->script = path == NULL;
  if (host) vm->host = *host;
  vm->has_host = host != NULL;
  vm->run_ref = vm->alive_ref = vm->hook_ref = LUA_NOREF;
  nh_queue_init(&vm->tasks);
  nh_queue_init(&vm->ready);
  vm->mem_limit = vm_mem_limit();
  vm->L = lua_newstate(vm_alloc, vm);
  if (!vm->L) {
    fputs("nimbus-host: cannot create a Lua state (out of memory)\n", stderr);
    abort();
  }
  lua_atpanic(vm->L, vm_panic);
  lua_setwarnf(vm->L, vm_warn, vm);
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
  lua_warning(vm->L, "@on", 0);   /* errors in __gc metamethods are reported as warnings */
  if (path) {   /* an adapter, not a -l script */
    lua_getglobal(vm->L, "os");
    lua_pushcfunction(vm->L, l_no_exit);
    lua_setfield(vm->L, -2, "exit");
    lua_pop(vm->L, 1);
  }
  nh_lapi_open(vm);
  uv_idle_init(loop, &vm->idle);
  vm->idle.data = vm;
  return vm;
}

/* Pushes the runtime's private table: require("nimbus") fills it, require("nimbus.internal")
 * returns it. */
static int push_internal(lua_State *L, nh_error_t *err)
{
  lua_getglobal(L, "require");
  lua_pushliteral(L, "nimbus");
  if (nh_vm_pcall(L, 1, 0, err)) return NH_EFAIL;
  lua_getglobal(L, "require");
  lua_pushliteral(L, "nimbus.internal");
  return nh_vm_pcall(L, 1, 1, err);
}

static int load_run_ref(nh_vm_t *vm, nh_error_t *err)
{
  lua_State *L = vm->L;
  if (push_internal(L, err)) return NH_EFAIL;
  lua_getfield(L, -1, "run");
  if (!lua_isfunction(L, -1)) {
    lua_pop(L, 2);
    return nh_error_set(err, NH_EFAIL, "the nimbus Lua runtime has no handler runner (nimbus.internal.run): "
                                       "wrong NIMBUS_LUA_DIR?");
  }
  vm->run_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  /* asked at every lock renewal of every running handler: keep it at hand too */
  lua_getfield(L, -1, "is_alive");
  vm->alive_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_getfield(L, -1, "hook");
  vm->hook_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_pop(L, 1);
  return NH_OK;
}

nh_vm_t *nh_vm_init(uv_loop_t *loop, const char *adapter_path, const char *lua_dir, const nh_vm_host_t *host,
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
  vm->load_budget_s = load_budget();
  vm->load_deadline_ns = uv_hrtime() + (uint64_t)(vm->load_budget_s * 1e9);
  lua_sethook(L, load_hook, LUA_MASKCOUNT, NH_LOAD_HOOK_COUNT);
  rc = nh_vm_pcall(L, 0, 0, err);
  lua_sethook(L, NULL, 0, 0);
  vm->load_deadline_ns = 0;
  if (rc) {
    err->code = NH_EUSAGE;
    goto fail;
  }
  return vm;
fail:
  nh_vm_close(vm);
  return NULL;
}

/* The first line of an error with its traceback: "file:line: message". */
static void push_first_line(lua_State *L, const char *msg)
{
  const char *tb = strstr(msg, "\nstack traceback:");
  if (tb) lua_pushlstring(L, msg, (size_t)(tb - msg));
  else lua_pushstring(L, msg);
}

char *nh_vm_check(uv_loop_t *loop, const char *adapter_path, const char *lua_dir, const nh_vm_host_t *host,
                  nh_error_t *err)
{
  if (!dir_has_nimbus(lua_dir)) {
    nh_error_set(err, NH_EFAIL, "cannot find the nimbus Lua runtime in %s (set NIMBUS_LUA_DIR to the lua/ directory)",
                 lua_dir);
    return NULL;
  }
  nh_vm_t *vm = vm_create(loop, adapter_path, lua_dir, host);
  vm->check = 1;
  lua_State *L = vm->L;
  char *report = NULL;
  if (push_internal(L, err)) goto done;   /* the runtime itself does not load: not the adapter's fault */
  int internal = lua_gettop(L);
  lua_pushnil(L);   /* the error that stopped loading, if one did */
  int rc = luaL_loadfile(L, adapter_path);
  if (rc != LUA_OK) {
    lua_replace(L, internal + 1);   /* syntax errors read "file:line: message" */
  } else {
    nh_error_t lerr = {0};
    vm->load_budget_s = load_budget();
    vm->load_deadline_ns = uv_hrtime() + (uint64_t)(vm->load_budget_s * 1e9);
    lua_sethook(L, load_hook, LUA_MASKCOUNT, NH_LOAD_HOOK_COUNT);
    rc = nh_vm_pcall(L, 0, 0, &lerr);
    lua_sethook(L, NULL, 0, 0);
    vm->load_deadline_ns = 0;
    if (rc) {
      push_first_line(L, lerr.msg);
      lua_replace(L, internal + 1);
    }
  }
  lua_getfield(L, internal, "check_report");
  lua_pushvalue(L, internal + 1);
  if (nh_vm_pcall(L, 1, 1, err) == NH_OK) {
    if (lua_type(L, -1) == LUA_TSTRING) report = nh_xstrdup(lua_tostring(L, -1));
    else nh_error_set(err, NH_EFAIL, "nimbus.internal.check_report returned no report");
  }
done:
  nh_vm_close(vm);
  return report;
}

int nh_vm_has_work(nh_vm_t *vm)
{
  return vm->live_tasks > 0 || nh_lasync_has_timers(vm) || nh_lhttpd_vm_serves(vm) > 0;
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
  nh_lasync_close(vm);
  nh_vm_cancel_all(vm);
  uv_idle_stop(&vm->idle);
  lua_close(vm->L);
  vm->L = NULL;
  pool_close(&vm->pool);   /* lua_close gave back every block */
  uv_close((uv_handle_t *)&vm->idle, vm_free_cb);
}

lua_State *nh_vm_state(nh_vm_t *vm) { return vm->L; }
const char *nh_vm_path(nh_vm_t *vm) { return vm->path; }
int nh_vm_live_tasks(nh_vm_t *vm) { return vm->live_tasks; }
void nh_vm_stop_timers(nh_vm_t *vm)
{
  nh_lasync_close(vm);
  nh_lhttpd_quiesce_vm(vm);   /* the new generation's servers already listen beside them */
}
void nh_vm_set_deadline(nh_vm_t *vm, int64_t at_ms) { vm->deadline_ms = at_ms; }
int64_t nh_vm_deadline(nh_vm_t *vm) { return vm->deadline_ms; }

int nh_vm_subscriptions(nh_vm_t *vm, nh_vm_sub_cb cb, void *data, nh_error_t *err)
{
  lua_State *L = vm->L;
  if (push_internal(L, err)) return NH_EFAIL;
  lua_getfield(L, -1, "subscriptions");
  if (nh_vm_pcall(L, 0, 1, err)) {
    lua_pop(L, 1);
    return NH_EFAIL;
  }
  /* Outside a protected call: nothing here may raise (no metamethods, no luaL_check*),
   * and anything that is not the shape nimbus.internal.subscriptions builds is skipped. */
  lua_pushnil(L);
  while (lua_next(L, -2)) {
    if (lua_type(L, -2) != LUA_TSTRING || lua_type(L, -1) != LUA_TTABLE) {
      lua_pop(L, 1);
      continue;
    }
    const char *name = lua_tostring(L, -2);
    int n = (int)lua_rawlen(L, -1);
    int t = lua_gettop(L);
    if (!lua_checkstack(L, n + 4)) {
      lua_settop(L, 0);
      return nh_error_set(err, NH_EFAIL, "endpoint %s handles too many event types (%d)", name, n);
    }
    const char **types = nh_xcalloc((size_t)n + 1, sizeof *types);
    int *commands = nh_xcalloc((size_t)n + 1, sizeof *commands);
    lua_pushliteral(L, "commands");
    lua_rawget(L, t);
    int ct = lua_gettop(L), k = 0;
    for (int i = 0; i < n; i++) {
      if (lua_rawgeti(L, t, i + 1) != LUA_TSTRING) {
        lua_pop(L, 1);
        continue;
      }
      types[k] = lua_tostring(L, -1);   /* stays on the stack until the callback returns */
      if (lua_istable(L, ct)) {
        lua_pushvalue(L, -1);
        lua_rawget(L, ct);
        commands[k] = lua_toboolean(L, -1);
        lua_pop(L, 1);
      }
      k++;
    }
    cb(data, name, types, commands, k);
    lua_settop(L, t - 1);
    free(types);
    free(commands);
  }
  lua_pop(L, 2);
  return NH_OK;
}

/* ---------------------------------------------------------------- handler tasks */

/* The value at the top of co as an owned string (a number as its text), else NULL. */
static char *value_str(lua_State *co)
{
  int t = lua_type(co, -1);
  if (t != LUA_TSTRING && t != LUA_TNUMBER) return NULL;
  lua_pushvalue(co, -1);   /* lua_tostring turns a number into a string in place: not lua_next's value */
  char *v = nh_xstrdup(lua_tostring(co, -1));
  lua_pop(co, 1);
  return v;
}

/* The runner's table into o: the runner names its outcome with a status string, the
 * one place those names are read. The table is walked once (lua_next) rather than asked
 * for each field: most outcomes are the runner's shared Completed table, of one entry,
 * and eight lookups of fields it does not have cost a handler run 1,900 instructions.
 * The runner's tables are plain (no metatable), so walking reads what lookups would. */
static nh_runner_ret_t outcome_from_table(lua_State *co, int idx, nh_outcome_t *o)
{
  static const struct { const char *name; nh_outcome_kind_t kind; } kinds[] = {
    { "completed", NH_OUT_COMPLETED }, { "failed", NH_OUT_FAILED }, { "handoff", NH_OUT_HANDOFF },
    { "deadletter", NH_OUT_DEADLETTER }, { "unsupported", NH_OUT_UNSUPPORTED },
    { "transient", NH_OUT_TRANSIENT },
  };
  int known = 0;
  o->expected_by_s = -1;
  o->retry_after_s = -1;
  lua_pushnil(co);
  while (lua_next(co, idx)) {
    const char *k = lua_type(co, -2) == LUA_TSTRING ? lua_tostring(co, -2) : "";
    char **str = strcmp(k, "error_text") == 0        ? &o->error_text
                 : strcmp(k, "error_type") == 0      ? &o->error_type
                 : strcmp(k, "error_stack") == 0     ? &o->error_stack
                 : strcmp(k, "handoff_reason") == 0  ? &o->handoff_reason
                 : strcmp(k, "external_job_id") == 0 ? &o->external_job_id
                 : strcmp(k, "reply") == 0           ? &o->reply
                                                     : NULL;
    if (str) {
      free(*str);
      *str = value_str(co);
    } else if (strcmp(k, "status") == 0 && lua_type(co, -1) == LUA_TSTRING) {
      const char *status = lua_tostring(co, -1);
      for (size_t i = 0; !known && i < sizeof kinds / sizeof kinds[0]; i++)
        if (strcmp(status, kinds[i].name) == 0) {
          o->kind = kinds[i].kind;
          known = 1;
        }
    } else if (strcmp(k, "expected_by") == 0 && lua_isnumber(co, -1)) {
      o->expected_by_s = lua_tonumber(co, -1);
    } else if (strcmp(k, "retry_after") == 0 && lua_type(co, -1) == LUA_TNUMBER) {   /* the runner checked it */
      o->retry_after_s = lua_tonumber(co, -1);
    }
    lua_pop(co, 1);
  }
  return known ? NH_RUNNER_OUTCOME : NH_RUNNER_UNKNOWN_STATUS;
}

/* A handler task ended: report what happened to it (what the runner returned, the error
 * that escaped it, why it was stopped). The host decides what that means. */
static void handler_done(nh_task_t *t, nh_task_status_t status, int nres)
{
  nh_vm_t *vm = t->vm;
  lua_State *co = t->co;
  nh_task_result_t r;
  nh_task_result_init(&r);
  r.status = status;
  r.cpu_budget_s = nh_task_cpu_budget(t);
  r.deadline_s = nh_task_deadline(t);
  switch (status) {
  case NH_TASK_OK:
    r.returned = nres >= 1 && lua_istable(co, -nres) ? outcome_from_table(co, lua_gettop(co) - nres + 1, &r.out)
                                                     : NH_RUNNER_NO_OUTCOME;
    break;
  case NH_TASK_ERROR:
    r.error = nh_task_error(t);
    r.error_msg = nh_xstrdup(lua_tostring(co, -1));   /* the message with its traceback */
    break;
  case NH_TASK_KILLED:
    r.kill = nh_task_kill(t);
    break;
  case NH_TASK_CANCELLED:
    break;
  }
  if (vm->has_host && vm->host.task_done) vm->host.task_done(vm->host.data, nh_task_data(t), &r);
  else nh_task_result_clear(&r);
}

void nh_lua_set_str(lua_State *L, const char *k, const char *v)
{
  if (!v) return;
  lua_pushstring(L, v);
  lua_setfield(L, -2, k);
}

int nh_vm_task_start(nh_vm_t *vm, const nh_task_args_t *a, nh_task_t **task, nh_error_t *err)
{
  *task = NULL;
  if (!lua_checkstack(vm->L, 8)) return nh_error_set(err, NH_EFAIL, "Lua stack exhausted");
  nh_task_opts_t opts = { .kind = NH_TASK_KIND_HANDLER, .deadline_s = a->deadline_s,
                          .cpu_budget_s = a->cpu_budget_s, .on_done = handler_done, .data = a->data,
                          .trace = a->trace };
  nh_task_t *t = nh_task_new(vm, &opts);
  lua_State *co = nh_task_thread(t);
  lua_rawgeti(co, LUA_REGISTRYINDEX, vm->run_ref);
  lua_pushstring(co, a->endpoint);
  lua_pushstring(co, a->event_type);
  if (a->body) lua_pushlstring(co, a->body, a->body_len);
  else lua_pushnil(co);
  lua_createtable(co, 0, 12);
  nh_lua_set_str(co, "endpoint", a->endpoint);
  nh_lua_set_str(co, "event_type", a->event_type);
  nh_lua_set_str(co, "event_id", a->event_id);
  nh_lua_set_str(co, "message_id", a->message_id);
  nh_lua_set_str(co, "session_id", a->session_id);
  nh_lua_set_str(co, "correlation_id", a->correlation_id);
  nh_lua_set_str(co, "originating_message_id", a->originating_message_id);
  nh_lua_set_str(co, "kind", nh_run_kind_name(a->kind));
  lua_pushinteger(co, a->retry_count);
  lua_setfield(co, -2, "retry_count");
  lua_pushinteger(co, a->delivery_count);
  lua_setfield(co, -2, "delivery_count");
  lua_pushinteger(co, a->enqueued_at);   /* ctx.enqueued_at (ISO text) is built lazily in Lua */
  lua_setfield(co, -2, "enqueued_ms");
  if (a->trace) {
    char tp[NH_TRACEPARENT_LEN + 1];
    nh_trace_format(a->trace, tp);
    lua_pushlstring(co, tp + 3, 32);   /* 00-<trace-id>-...: the id alone */
    lua_setfield(co, -2, "trace_id");
    lua_pushstring(co, tp);
    lua_setfield(co, -2, "traceparent");
  }
  t->done_flag = task;   /* cleared if the task ends inside this run */
  *task = t;
  nh_task_run(t, 4);
  return NH_OK;
}

int nh_vm_task_alive(nh_vm_t *vm, const char *event_id, nh_error_t *err)
{
  lua_State *L = vm->L;
  lua_rawgeti(L, LUA_REGISTRYINDEX, vm->alive_ref);
  lua_pushstring(L, event_id);
  if (nh_vm_pcall(L, 1, 1, err)) return -1;
  int alive = lua_toboolean(L, -1);
  lua_pop(L, 1);
  return alive;
}

void nh_vm_task_cancel(nh_task_t *t) { nh_task_cancel(t); }

void nh_vm_cancel_all(nh_vm_t *vm) { nh_task_cancel_all(vm); }

/* ---------------------------------------------------------------- interpreter mode */

int nh_vm_run_script(uv_loop_t *loop, const char *script, int argc, char **argv, const char *lua_dir,
                     const nh_vm_host_t *host)
{
  nh_vm_t *vm = vm_create(loop, NULL, lua_dir, host);
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
  } else if (!lua_checkstack(L, argc + LUA_MINSTACK)) {   /* busted passes every spec file as an argument */
    fprintf(stderr, "nimbus-host -l: too many arguments for a Lua call (%d)\n", argc);
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
  nh_vm_close(vm);   /* its handles close with the runtime (the caller's) */
  return status;
}
