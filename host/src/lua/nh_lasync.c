/* Waiting host calls that are not I/O: nimbus.sleep, nimbus.spawn, nimbus.run. */
#include "nh_lasync.h"
#include "nh_task.h"
#include "nh_vm_int.h"
#include "core/nh_log.h"
#include "core/nh_metrics.h"
#include "core/nh_runtime.h"
#include "core/nh_util.h"

#include <lauxlib.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- sleep */

typedef struct sleep_op {
  nh_op_t op;
  uv_timer_t timer;
  nh_task_t *task;
} sleep_op_t;

static void sleep_closed(uv_handle_t *h) { free(h->data); }

static void sleep_fired(uv_timer_t *h)
{
  sleep_op_t *s = h->data;
  nh_task_t *t = s->task;
  uv_close((uv_handle_t *)&s->timer, sleep_closed);
  nh_task_complete(t, 0);
}

static void sleep_cancel(nh_op_t *op)
{
  sleep_op_t *s = (sleep_op_t *)op;
  uv_timer_stop(&s->timer);
  uv_close((uv_handle_t *)&s->timer, sleep_closed);
}

static int l_sleep(lua_State *L)
{
  double secs = luaL_checknumber(L, 1);
  luaL_argcheck(L, secs >= 0 && secs < 1e9, 1, "seconds must be >= 0");
  nh_task_t *t = nh_task_check(L, "nimbus.sleep");
  sleep_op_t *s = nh_xcalloc(1, sizeof *s);
  s->op.cancel = sleep_cancel;
  s->task = t;
  uv_timer_init(nh_lua_loop(L), &s->timer);
  s->timer.data = s;
  uv_timer_start(&s->timer, sleep_fired, (uint64_t)(secs * 1000.0 + 0.5), 0);
  return nh_task_yield(L, t, &s->op);
}

/* ---------------------------------------------------------------- spawn */

/* nimbus.spawn returns a handle (a full userdata): the task while it runs, then how it
 * ended, its results in the handle's user value ({ n = k, ... }, or { err } when it
 * failed). The registry keeps the handle alive while the task runs, so a task nobody
 * holds a handle to still reports to its waiters and its log. */
#define TASK_MT "nimbus.task"

typedef enum { LT_RUNNING, LT_DONE, LT_FAILED, LT_KILLED, LT_CANCELLED } lt_state_t;

typedef struct ltask {
  nh_task_t *task;           /* NULL once it ended */
  lt_state_t state;
  nh_task_kill_t kill;       /* LT_KILLED: why */
  int self_ref;
  nh_queue_t waiters;        /* wait_op_t.node: tasks in task:wait() */
} ltask_t;

typedef struct wait_op {
  nh_op_t op;
  nh_task_t *task;           /* the waiting task */
  nh_queue_t node;
} wait_op_t;

static void wait_cancel(nh_op_t *op)
{
  wait_op_t *w = (wait_op_t *)op;
  nh_queue_remove(&w->node);
  free(w);
}

/* Stores the task's results (or its error value) in the handle's user value. */
static void keep_results(lua_State *co, ltask_t *lt, int first, int n)
{
  lua_createtable(co, n, 1);
  for (int i = 0; i < n; i++) {
    lua_pushvalue(co, first + i);
    lua_rawseti(co, -2, i + 1);
  }
  lua_pushinteger(co, n);
  lua_setfield(co, -2, "n");
  lua_rawgeti(co, LUA_REGISTRYINDEX, lt->self_ref);
  lua_insert(co, -2);
  lua_setiuservalue(co, -2, 1);
  lua_pop(co, 1);
}

static void spawned_done(nh_task_t *t, nh_task_status_t status, int nres)
{
  ltask_t *lt = nh_task_data(t);
  lua_State *co = nh_task_thread(t);
  int waited = !nh_queue_empty(&lt->waiters);
  lt->task = NULL;
  if (lua_checkstack(co, nres + 4)) {
    if (status == NH_TASK_OK) keep_results(co, lt, lua_gettop(co) - nres + 1, nres);
    else if (status == NH_TASK_ERROR) keep_results(co, lt, lua_gettop(co) - 1, 1);   /* the value, below its traceback */
  }
  switch (status) {
  case NH_TASK_OK: lt->state = LT_DONE; break;
  case NH_TASK_ERROR:
    lt->state = LT_FAILED;
    /* a waiter gets the error raised in its own task; nobody else would see it */
    if (!waited) nh_log_error("lua", "a nimbus.spawn task failed: %s", lua_tostring(co, -1));
    break;
  case NH_TASK_KILLED:
    lt->state = LT_KILLED;
    lt->kill = nh_task_kill(t);
    if (!waited) nh_log_error("lua", "a nimbus.spawn task was stopped: %s", nh_task_kill_name(lt->kill));
    break;
  case NH_TASK_CANCELLED: lt->state = LT_CANCELLED; break;
  }
  /* from the next loop iteration: this may run inside another task's resume (cancel) */
  while (!nh_queue_empty(&lt->waiters)) {
    wait_op_t *w = nh_queue_data(nh_queue_head(&lt->waiters), wait_op_t, node);
    nh_queue_remove(&w->node);
    nh_task_complete_later(w->task, 0);
    free(w);
  }
  luaL_unref(co, LUA_REGISTRYINDEX, lt->self_ref);
  lt->self_ref = LUA_NOREF;
}

/* nimbus.spawn(fn, ...): runs fn(...) as a detached task, starting on the next loop
 * iteration (never inside the caller's own resume); returns its handle. */
static int l_spawn(lua_State *L)
{
  luaL_checktype(L, 1, LUA_TFUNCTION);
  int n = lua_gettop(L);
  nh_vm_t *vm = nh_lua_vm(L);
  /* the handle first: allocating may raise (memory limit), and no task exists yet then */
  ltask_t *lt = lua_newuserdatauv(L, sizeof *lt, 1);
  memset(lt, 0, sizeof *lt);
  lt->state = LT_RUNNING;
  lt->self_ref = LUA_NOREF;
  nh_queue_init(&lt->waiters);
  luaL_setmetatable(L, TASK_MT);
  lua_insert(L, 1);
  lua_pushvalue(L, 1);
  lt->self_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  nh_task_opts_t opts = { .kind = NH_TASK_KIND_PLAIN, .on_done = spawned_done, .data = lt };
  nh_task_t *t = nh_task_new(vm, &opts);
  lt->task = t;
  lua_xmove(L, nh_task_thread(t), n);   /* fn and its arguments; the handle stays */
  nh_task_start_later(t, n - 1);
  return 1;
}

static ltask_t *check_ltask(lua_State *L)
{
  return luaL_checkudata(L, 1, TASK_MT);
}

/* After the wait (or at once when the task had ended): its results, or its error. */
static int wait_k(lua_State *L, int status, lua_KContext ctx)
{
  (void)status;
  (void)ctx;
  ltask_t *lt = check_ltask(L);
  switch (lt->state) {
  case LT_DONE: {
    lua_getiuservalue(L, 1, 1);
    int r = lua_gettop(L);
    lua_getfield(L, r, "n");
    int n = (int)lua_tointeger(L, -1);
    lua_pop(L, 1);
    luaL_checkstack(L, n, "task results");
    for (int i = 1; i <= n; i++) lua_rawgeti(L, r, i);
    return n;
  }
  case LT_FAILED:
    lua_getiuservalue(L, 1, 1);
    lua_rawgeti(L, -1, 1);
    return lua_error(L);   /* the task's own error value: nimbus.permanent(...) stays one */
  case LT_KILLED:
    return luaL_error(L, "task:wait: the task was stopped: %s", nh_task_kill_name(lt->kill));
  case LT_CANCELLED:
    return luaL_error(L, "task:wait: the task was cancelled (task:cancel())");
  case LT_RUNNING:
    break;
  }
  return luaL_error(L, "task:wait: the task is still running (internal error)");
}

/* task:wait(): yields the calling task until the spawned one ends. */
static int l_task_wait(lua_State *L)
{
  ltask_t *lt = check_ltask(L);
  lua_settop(L, 1);
  if (lt->state != LT_RUNNING) return wait_k(L, LUA_OK, 0);
  nh_task_t *self = nh_task_check(L, "task:wait");
  if (self == lt->task) return luaL_error(L, "task:wait: a task cannot wait for itself");
  wait_op_t *w = nh_xcalloc(1, sizeof *w);
  w->op.cancel = wait_cancel;
  w->task = self;
  nh_queue_insert_tail(&lt->waiters, &w->node);
  return nh_task_yieldk(L, self, &w->op, 0, wait_k);
}

/* task:cancel(): ends a running task (its waiters get an error); false if it had ended. */
static int l_task_cancel(lua_State *L)
{
  ltask_t *lt = check_ltask(L);
  if (lt->state != LT_RUNNING) {
    lua_pushboolean(L, 0);
    return 1;
  }
  if (nh_task_running(L) == lt->task)
    return luaL_error(L, "task:cancel: a task cannot cancel itself; return from it (or raise an error) instead");
  nh_task_cancel(lt->task);
  lua_pushboolean(L, 1);
  return 1;
}

static const char *ltask_status(const ltask_t *lt)
{
  static const char *const names[] = { "running", "done", "failed", "failed", "cancelled" };
  return names[lt->state];
}

/* task:status(): "running", "done", "failed" (it raised or was stopped) or "cancelled". */
static int l_task_status(lua_State *L)
{
  lua_pushstring(L, ltask_status(check_ltask(L)));
  return 1;
}

static int l_task_tostring(lua_State *L)
{
  lua_pushfstring(L, "nimbus task (%s)", ltask_status(check_ltask(L)));
  return 1;
}

/* ---------------------------------------------------------------- run */

typedef struct run_state {
  int finished;
  nh_task_status_t status;
  lua_State *caller;
  int nres;
} run_state_t;

static void run_done(nh_task_t *t, nh_task_status_t status, int nres)
{
  run_state_t *r = nh_task_data(t);
  lua_State *co = nh_task_thread(t);
  r->finished = 1;
  r->status = status;
  if (status == NH_TASK_OK) {
    if (!lua_checkstack(r->caller, nres + 1)) nres = 0;
    lua_xmove(co, r->caller, nres);
    r->nres = nres;
  } else if (status == NH_TASK_ERROR) {
    lua_pushvalue(co, -2);   /* the error value itself (below its traceback), like pcall */
    lua_xmove(co, r->caller, 1);
  } else {
    lua_pushstring(r->caller, status == NH_TASK_KILLED ? nh_task_kill_name(nh_task_kill(t)) : "task cancelled");
  }
}

/* nimbus.run(fn, ...): for plain scripts (nimbus-host -l): runs fn(...) as a task and
 * drives the loop until it ends; returns its results or raises its error. */
static int l_run(lua_State *L)
{
  luaL_checktype(L, 1, LUA_TFUNCTION);
  if (nh_runtime_of(nh_lua_loop(L))->running)
    return luaL_error(L, "nimbus.run drives the event loop and cannot be called while the host runs it "
                         "(use nimbus.spawn)");
  if (nh_task_running(L) || nh_task_of(L))
    return luaL_error(L, "nimbus.run drives the event loop and cannot be called from a task; "
                         "call the function directly or use nimbus.spawn");
  int n = lua_gettop(L);
  nh_vm_t *vm = nh_lua_vm(L);
  run_state_t r = { 0, NH_TASK_OK, L, 0 };
  nh_task_opts_t opts = { .kind = NH_TASK_KIND_PLAIN, .on_done = run_done, .data = &r };
  nh_task_t *t = nh_task_new(vm, &opts);
  lua_xmove(L, nh_task_thread(t), n);
  int base = lua_gettop(L);
  nh_task_run(t, n - 1);
  while (!r.finished) uv_run(vm->loop, UV_RUN_ONCE);
  if (r.status != NH_TASK_OK) return lua_error(L);
  return lua_gettop(L) - base;
}

/* ---------------------------------------------------------------- every */

/* A periodic task (status checkers): fn runs as a task every `secs`; a tick that finds
 * the previous run still going is skipped, so runs never overlap. */
typedef struct nh_every {
  uv_timer_t timer;
  nh_vm_t *vm;
  uint64_t id;                 /* what its handle names it by (the entry may be freed first) */
  int fn_ref;
  char *label;
  double timeout_s;
  nh_task_t *running;
  char *endpoint, *checker;    /* a status checker's (NULL: another periodic task) */
  int closed;                  /* stopped (reload, shutdown) while a run was still going */
  struct nh_every *next;
} nh_every_t;

static void every_closed(uv_handle_t *h);

static nh_metric_t m_checker_runs = NH_METRIC_DEF(NH_METRIC_COUNTER, "nimbus_checker_runs_total",
  "Status checker runs, by result (ok, error, killed)", "endpoint", "checker", "result");

static void every_done(nh_task_t *t, nh_task_status_t status, int nres)
{
  (void)nres;
  nh_every_t *e = nh_task_data(t);
  e->running = NULL;
  lua_State *co = nh_task_thread(t);
  nh_log_field_t f[] = { NH_LOG_STR("endpoint", e->endpoint), NH_LOG_STR("checker", e->checker) };
  if (status == NH_TASK_ERROR)
    nh_log_fields(NH_LOG_ERROR, "lua", f, 2, "%s failed (it runs again at the next tick): %s", e->label,
                  lua_tostring(co, -1));
  else if (status == NH_TASK_KILLED)
    nh_log_fields(NH_LOG_ERROR, "lua", f, 2, "%s stopped: %s (it runs again at the next tick)", e->label,
                  nh_task_kill_name(nh_task_kill(t)));
  if (e->checker)
    nh_metric_add(&m_checker_runs, 1, e->endpoint, e->checker,
                  status == NH_TASK_OK ? "ok" : status == NH_TASK_ERROR ? "error"
                  : status == NH_TASK_KILLED ? "killed" : "cancelled");
  if (e->closed) uv_close((uv_handle_t *)&e->timer, every_closed);   /* its last run ended */
}

static void every_tick(uv_timer_t *h)
{
  nh_every_t *e = h->data;
  if (e->running) {
    nh_log_debug("lua", "%s: previous run still going, skipping this tick", e->label);
    return;
  }
  nh_task_opts_t opts = { .kind = NH_TASK_KIND_CHECKER, .deadline_s = e->timeout_s, .on_done = every_done,
                          .data = e };
  nh_task_t *t = nh_task_new(e->vm, &opts);
  lua_State *co = nh_task_thread(t);
  lua_rawgeti(co, LUA_REGISTRYINDEX, e->fn_ref);
  e->running = t;
  nh_task_run(t, 0);
}

static void every_closed(uv_handle_t *h)
{
  nh_every_t *e = h->data;
  free(e->label);
  free(e->endpoint);
  free(e->checker);
  free(e);
}

#define EVERY_MT "nimbus.every"

/* Stops e's timer and takes it off the VM's list; a run still going frees it when it ends. */
static void every_stop(nh_vm_t *vm, nh_every_t *e)
{
  for (nh_every_t **p = &vm->everies; *p; p = &(*p)->next)
    if (*p == e) {
      *p = e->next;
      break;
    }
  uv_timer_stop(&e->timer);
  luaL_unref(vm->L, LUA_REGISTRYINDEX, e->fn_ref);
  e->fn_ref = LUA_NOREF;
  e->closed = 1;
  if (!e->running) uv_close((uv_handle_t *)&e->timer, every_closed);
}

/* handle:cancel(): no more runs (one going on finishes); false if it was stopped already. */
static int l_every_cancel(lua_State *L)
{
  uint64_t id = *(uint64_t *)luaL_checkudata(L, 1, EVERY_MT);
  nh_vm_t *vm = nh_lua_vm(L);
  for (nh_every_t *e = vm->everies; e; e = e->next)
    if (e->id == id) {
      every_stop(vm, e);
      lua_pushboolean(L, 1);
      return 1;
    }
  lua_pushboolean(L, 0);
  return 1;
}

/* core.every(seconds, fn, label, timeout[, endpoint, checker]) -> handle */
static int l_every(lua_State *L)
{
  double secs = luaL_checknumber(L, 1);
  luaL_argcheck(L, secs > 0, 1, "interval must be > 0 seconds");
  luaL_checktype(L, 2, LUA_TFUNCTION);
  const char *label = luaL_optstring(L, 3, "periodic task");
  double timeout = luaL_optnumber(L, 4, 60.0);
  nh_vm_t *vm = nh_lua_vm(L);
  static uint64_t next_id;
  uint64_t *handle = lua_newuserdatauv(L, sizeof *handle, 0);   /* before anything that needs freeing */
  *handle = ++next_id;
  luaL_setmetatable(L, EVERY_MT);
  nh_every_t *e = nh_xcalloc(1, sizeof *e);
  e->vm = vm;
  e->id = *handle;
  e->label = nh_xstrdup(label);
  e->timeout_s = timeout;
  if (lua_isstring(L, 5) && lua_isstring(L, 6)) {
    e->endpoint = nh_xstrdup(lua_tostring(L, 5));
    e->checker = nh_xstrdup(lua_tostring(L, 6));
  }
  lua_pushvalue(L, 2);
  e->fn_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  uv_timer_init(vm->loop, &e->timer);
  e->timer.data = e;
  uint64_t ms = (uint64_t)(secs * 1000.0 + 0.5);
  uv_timer_start(&e->timer, every_tick, ms ? ms : 1, ms ? ms : 1);
  e->next = vm->everies;
  vm->everies = e;
  return 1;
}

void nh_lasync_close(nh_vm_t *vm)
{
  /* a run still going (a retiring generation) frees its entry when it ends */
  while (vm->everies) every_stop(vm, vm->everies);
}

int nh_lasync_has_timers(nh_vm_t *vm) { return vm->everies != NULL; }

static void new_metatable(lua_State *L, const char *name, const luaL_Reg *methods, lua_CFunction tostring)
{
  if (luaL_newmetatable(L, name)) {
    lua_newtable(L);
    luaL_setfuncs(L, methods, 0);
    lua_setfield(L, -2, "__index");
    if (tostring) {
      lua_pushcfunction(L, tostring);
      lua_setfield(L, -2, "__tostring");
    }
  }
  lua_pop(L, 1);
}

void nh_lasync_register(lua_State *L)
{
  static const luaL_Reg task_methods[] = { { "wait", l_task_wait }, { "cancel", l_task_cancel },
                                           { "status", l_task_status }, { NULL, NULL } };
  static const luaL_Reg every_methods[] = { { "cancel", l_every_cancel }, { NULL, NULL } };
  new_metatable(L, TASK_MT, task_methods, l_task_tostring);
  new_metatable(L, EVERY_MT, every_methods, NULL);
  static const luaL_Reg fns[] = { { "sleep", l_sleep }, { "spawn", l_spawn }, { "run", l_run }, { "every", l_every },
                                  { NULL, NULL } };
  luaL_setfuncs(L, fns, 0);
}
