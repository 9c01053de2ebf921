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

static void spawned_done(nh_task_t *t, nh_task_status_t status, int nres)
{
  (void)nres;
  lua_State *co = nh_task_thread(t);
  if (status == NH_TASK_ERROR)
    nh_log_error("lua", "a nimbus.spawn task failed: %s", lua_tostring(co, -1));
  else if (status == NH_TASK_KILLED)
    nh_log_error("lua", "a nimbus.spawn task was stopped: %s", nh_task_kill_name(nh_task_kill(t)));
}

/* nimbus.spawn(fn, ...): runs fn(...) as a detached task, starting on the next loop
 * iteration (never inside the caller's own resume). */
static int l_spawn(lua_State *L)
{
  luaL_checktype(L, 1, LUA_TFUNCTION);
  int n = lua_gettop(L);
  nh_vm_t *vm = nh_lua_vm(L);
  nh_task_opts_t opts = { .kind = NH_TASK_KIND_PLAIN, .on_done = spawned_done };
  nh_task_t *t = nh_task_new(vm, &opts);
  lua_State *co = nh_task_thread(t);
  lua_xmove(L, co, n);
  nh_task_start_later(t, n - 1);
  lua_pushboolean(L, 1);
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

/* core.every(seconds, fn, label, timeout[, endpoint, checker]) */
static int l_every(lua_State *L)
{
  double secs = luaL_checknumber(L, 1);
  luaL_argcheck(L, secs > 0, 1, "interval must be > 0 seconds");
  luaL_checktype(L, 2, LUA_TFUNCTION);
  const char *label = luaL_optstring(L, 3, "periodic task");
  double timeout = luaL_optnumber(L, 4, 60.0);
  nh_vm_t *vm = nh_lua_vm(L);
  nh_every_t *e = nh_xcalloc(1, sizeof *e);
  e->vm = vm;
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
  return 0;
}

void nh_lasync_close(nh_vm_t *vm)
{
  while (vm->everies) {
    nh_every_t *e = vm->everies;
    vm->everies = e->next;
    uv_timer_stop(&e->timer);
    luaL_unref(vm->L, LUA_REGISTRYINDEX, e->fn_ref);
    e->closed = 1;
    /* a run still going (a retiring generation) frees the entry when it ends */
    if (!e->running) uv_close((uv_handle_t *)&e->timer, every_closed);
  }
}

void nh_lasync_register(lua_State *L)
{
  static const luaL_Reg fns[] = { { "sleep", l_sleep }, { "spawn", l_spawn }, { "run", l_run }, { "every", l_every },
                                  { NULL, NULL } };
  luaL_setfuncs(L, fns, 0);
}
