/* Tasks (nh_task.h): one coroutine per task, anchored in the registry and resumed from
 * loop callbacks. A count hook enforces the CPU budget of each resume, a uv_timer the
 * deadline; tasks started later or yielding without an operation wait in a FIFO ready
 * list that a uv_idle runs once per loop iteration. */
#include "nh_task.h"
#include "nh_lasync.h"
#include "nh_vm_int.h"
#include "core/nh_log.h"
#include "core/nh_runtime.h"
#include "core/nh_util.h"

#include <lauxlib.h>
#include <stdlib.h>
#include <string.h>

#define NH_DEFAULT_CPU_BUDGET_S 1.0
#define NH_HOOK_COUNT 10000       /* instructions between budget checks */

/* The task being resumed right now is the runtime's (its loop's: one thread, so at most
 * one). The hook uses it because coroutines created inside a task inherit the hook but
 * not the task. */
static nh_task_t *running_of(nh_vm_t *vm) { return nh_runtime_of(vm->loop)->task; }

nh_task_t *nh_task_running(lua_State *L) { return running_of(nh_lua_vm(L)); }

const char *nh_task_kind_name(nh_task_kind_t k)
{
  switch (k) {
  case NH_TASK_KIND_PLAIN: return "task";
  case NH_TASK_KIND_HANDLER: return "handler";
  case NH_TASK_KIND_CHECKER: return "checker";
  case NH_TASK_KIND_ROUTE: return "route";
  case NH_TASK_KIND_HOOK: return "hook";
  }
  return "task";
}

static void deadline_closed(uv_handle_t *h) { free(h); }

static void vm_idle_cb(uv_idle_t *h);

/* Queues t to be resumed with `nargs` on the next loop iteration. */
static void ready_push(nh_task_t *t, int nargs)
{
  nh_vm_t *vm = t->vm;
  t->start_nargs = nargs;
  t->resume_gen = vm->yield_gen;
  nh_queue_insert_tail(&vm->ready, &t->ready_node);
  if (!uv_is_active((uv_handle_t *)&vm->idle)) uv_idle_start(&vm->idle, vm_idle_cb);
}

static void task_free(nh_task_t *t)
{
  nh_vm_t *vm = t->vm;
  nh_queue_remove(&t->ready_node);   /* harmless when it was not waiting there */
  nh_queue_remove(&t->node);
  if (t->deadline) {
    uv_timer_stop(t->deadline);
    uv_close((uv_handle_t *)t->deadline, deadline_closed);
    t->deadline = NULL;
  }
  if (vm->L) {
    lua_sethook(t->co, NULL, 0, 0);
    /* 5.4.4: closes pending to-be-closed variables; a thread reset cleanly is as good as new */
    int st = lua_resetthread(t->co);
    if (t->reusable && st == LUA_OK && vm->nspare < NH_VM_SPARE_THREADS) {
      *(void **)lua_getextraspace(t->co) = NULL;
      vm->spare_co[vm->nspare++] = t->co_ref;
    } else {
      luaL_unref(vm->L, LUA_REGISTRYINDEX, t->co_ref);
    }
  }
  vm->live_tasks--;
  free(t);
}

static void task_end(nh_task_t *t, nh_task_status_t status, int nres)
{
  if (t->pending) {
    nh_op_t *op = t->pending;
    t->pending = NULL;
    op->cancel(op);
  }
  t->done = 1;
  /* Only a handler that returned gives its thread back: internal.run cleared what the
   * runtime keeps per coroutine (its log context), and only handlers take spare ones. */
  t->reusable = status == NH_TASK_OK && t->kind == NH_TASK_KIND_HANDLER;
  if (t->done_flag) *t->done_flag = NULL;
  if (t->on_done) t->on_done(t, status, nres);
  task_free(t);
}

static void budget_hook(lua_State *L, lua_Debug *ar)
{
  (void)ar;
  nh_task_t *t = nh_task_running(L);
  if (!t) return;
  if (t->kill == NH_KILL_NONE) {
    if (uv_hrtime() - t->resume_ns <= t->cpu_budget_ns) return;
    t->kill = NH_KILL_CPU_BUDGET;
  }
  /* Yielding from a hook cannot be caught by pcall. Where the running coroutine cannot
   * yield (a nested coroutine, a C call boundary), raise instead and try again at the
   * next check, once control is back in yieldable code of the task. */
  if (L == t->co && lua_isyieldable(L)) {
    lua_yield(L, 0);
    return;
  }
  luaL_error(L, "%s (%.3g s of continuous running)", nh_task_kill_name(t->kill), (double)t->cpu_budget_ns / 1e9);
}

static void deadline_cb(uv_timer_t *h)
{
  nh_task_t *t = h->data;
  t->kill = NH_KILL_DEADLINE;
  nh_log_warn("lua", "%s task exceeded its %.3g s deadline; cancelling it", nh_task_kind_name(t->kind),
              t->deadline_s);
  task_end(t, NH_TASK_KILLED, 0);
}

nh_task_t *nh_task_new(nh_vm_t *vm, const nh_task_opts_t *o)
{
  nh_task_t *t = nh_xcalloc(1, sizeof *t);
  t->vm = vm;
  t->kind = o->kind;
  t->data = o->data;
  t->on_done = o->on_done;
  t->cpu_budget_ns = (uint64_t)((o->cpu_budget_s > 0 ? o->cpu_budget_s : NH_DEFAULT_CPU_BUDGET_S) * 1e9);
  t->deadline_s = o->deadline_s;
  if (o->trace) t->trace = *o->trace, t->has_trace = 1;
  if (o->kind == NH_TASK_KIND_HANDLER && vm->nspare > 0) {
    t->co_ref = vm->spare_co[--vm->nspare];
    lua_rawgeti(vm->L, LUA_REGISTRYINDEX, t->co_ref);
    t->co = lua_tothread(vm->L, -1);
    lua_pop(vm->L, 1);
  } else {
    t->co = lua_newthread(vm->L);
    t->co_ref = luaL_ref(vm->L, LUA_REGISTRYINDEX);
  }
  *(void **)lua_getextraspace(t->co) = t;
  nh_queue_init(&t->ready_node);
  nh_queue_insert_head(&vm->tasks, &t->node);
  vm->live_tasks++;
  if (o->deadline_s > 0) {
    t->deadline = nh_xmalloc(sizeof *t->deadline);
    uv_timer_init(vm->loop, t->deadline);
    t->deadline->data = t;
    uv_timer_start(t->deadline, deadline_cb, (uint64_t)(o->deadline_s * 1000.0), 0);
  }
  return t;
}

lua_State *nh_task_thread(nh_task_t *t) { return t->co; }
void *nh_task_data(nh_task_t *t) { return t->data; }
nh_task_kind_t nh_task_kind(nh_task_t *t) { return t->kind; }
nh_task_kill_t nh_task_kill(nh_task_t *t) { return t->kill; }
nh_task_err_t nh_task_error(nh_task_t *t) { return t->error; }
const nh_trace_ctx_t *nh_task_trace(nh_task_t *t) { return t->has_trace ? &t->trace : NULL; }
double nh_task_cpu_budget(nh_task_t *t) { return (double)t->cpu_budget_ns / 1e9; }
double nh_task_deadline(nh_task_t *t) { return t->deadline_s; }

/* Told by lua_resume's status. A memory error that went through coroutine.wrap comes
 * back re-raised as a plain error (LUA_ERRRUN); its value is then still Lua's own fixed
 * message for memory errors (Lua's text, not the host's: no rewording here changes it). */
static int is_memory_error(lua_State *co, int rc)
{
  if (rc == LUA_ERRMEM) return 1;
  size_t len;
  const char *v = lua_type(co, -1) == LUA_TSTRING ? lua_tolstring(co, -1, &len) : NULL;
  return v && len == sizeof "not enough memory" - 1 && memcmp(v, "not enough memory", len) == 0;
}

static void task_resume(nh_task_t *t, int nargs)
{
  nh_vm_t *vm = t->vm;
  lua_State *co = t->co;
  int nres = 0;
  nh_runtime_t *rt = nh_runtime_of(vm->loop);
  nh_task_t *outer = rt->task;   /* NULL: resumes only happen from loop callbacks */
  rt->task = t;
  vm->in_task++;
  t->resume_ns = uv_hrtime();
  lua_sethook(co, budget_hook, LUA_MASKCOUNT, NH_HOOK_COUNT);
  int rc = lua_resume(co, vm->L, nargs, &nres);
  vm->in_task--;
  rt->task = outer;
  if (rc == LUA_YIELD) {
    lua_pop(co, nres);
    if (t->kill != NH_KILL_NONE) {
      task_end(t, NH_TASK_KILLED, 0);
    } else if (!t->pending) {
      ready_push(t, 0);   /* a bare coroutine.yield(): run again on the next loop iteration */
    }
    return;
  }
  if (rc == LUA_OK) {
    task_end(t, NH_TASK_OK, nres);
    return;
  }
  if (t->kill != NH_KILL_NONE) {   /* the budget error surfaced where the coroutine could not yield */
    task_end(t, NH_TASK_KILLED, 0);
    return;
  }
  t->error = is_memory_error(co, rc) ? NH_TASK_ERR_MEMORY : NH_TASK_ERR_RUNTIME;
  const char *msg = lua_tostring(co, -1);
  luaL_traceback(co, co, msg ? msg : "(error object is not a string)", 0);
  task_end(t, NH_TASK_ERROR, 1);
}

void nh_task_run(nh_task_t *t, int nargs) { task_resume(t, nargs); }

void nh_task_start_later(nh_task_t *t, int nargs) { ready_push(t, nargs); }

static void vm_idle_cb(uv_idle_t *h)
{
  nh_vm_t *vm = h->data;
  uv_idle_stop(h);
  /* Resume, in FIFO order, every task queued before this pass; tasks queued while we
   * run carry this pass's generation and wait for the next one. */
  uint64_t gen = ++vm->yield_gen;
  while (!nh_queue_empty(&vm->ready)) {
    nh_task_t *t = nh_queue_data(nh_queue_head(&vm->ready), nh_task_t, ready_node);
    if (t->resume_gen >= gen) break;
    int nargs = t->start_nargs;
    nh_queue_remove(&t->ready_node);
    t->start_nargs = 0;
    task_resume(t, nargs);
  }
}

nh_task_t *nh_task_of(lua_State *L) { return *(nh_task_t **)lua_getextraspace(L); }

nh_task_t *nh_task_check(lua_State *L, const char *what)
{
  nh_task_t *t = nh_task_of(L);
  if (!t) {
    luaL_error(L, "%s must be called from a task (a handler, middleware, status checker, HTTP route or "
                  "nimbus.spawn function), not from %s",
               what, nh_task_running(L) ? "a coroutine created inside one" : "the main chunk");
    return NULL;
  }
  if (!lua_isyieldable(L)) {
    luaL_error(L, "%s cannot wait here: it was called across a C boundary (a __gc or other metamethod, a "
                  "table.sort comparator, a string.gsub callback...)", what);
    return NULL;
  }
  return t;
}

int nh_task_yield(lua_State *L, nh_task_t *t, nh_op_t *op)
{
  t->pending = op;
  return lua_yield(L, 0);
}

int nh_task_yieldk(lua_State *L, nh_task_t *t, nh_op_t *op, lua_KContext ctx, lua_KFunction k)
{
  t->pending = op;
  return lua_yieldk(L, 0, ctx, k);
}

void nh_task_complete(nh_task_t *t, int nres)
{
  t->pending = NULL;
  task_resume(t, nres);
}

void nh_task_complete_later(nh_task_t *t, int nres)
{
  t->pending = NULL;
  ready_push(t, nres);
}

void nh_task_cancel(nh_task_t *t) { task_end(t, NH_TASK_CANCELLED, 0); }

void nh_task_cancel_all(nh_vm_t *vm)
{
  /* the head each time, never a saved next: task_end runs the owner's callback */
  while (!nh_queue_empty(&vm->tasks))
    task_end(nh_queue_data(nh_queue_head(&vm->tasks), nh_task_t, node), NH_TASK_CANCELLED, 0);
}
