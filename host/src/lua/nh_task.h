/* Tasks: Lua coroutines driven by the loop. Every handler, status-checker run, served
 * HTTP request and nimbus.spawn function runs as one. A host call that waits (sleep,
 * HTTP) starts its operation, parks an nh_op_t on the task and yields; the operation's
 * completion callback pushes its results and calls nh_task_complete, always from a
 * loop callback, never from inside another resume.
 *
 * Budgets: a wall-clock deadline per task (uv_timer) and a CPU budget per resume (a
 * count hook; past the budget the hook yields the coroutine away, which no pcall can
 * catch, and the task ends as failed). */
#ifndef NH_TASK_H
#define NH_TASK_H

#include <lua.h>
#include <stdint.h>
#include <uv.h>

#include "core/nh_outcome_types.h"
#include "core/nh_trace.h"

typedef struct nh_vm nh_vm_t;
typedef struct nh_task nh_task_t;
typedef struct nh_op nh_op_t;

/* A pending asynchronous operation. cancel() must stop the operation and release it
 * without resuming the task (the task is being torn down). */
struct nh_op {
  void (*cancel)(nh_op_t *op);
};

/* What a task runs. */
typedef enum {
  NH_TASK_KIND_PLAIN,     /* a nimbus.spawn or nimbus.run function */
  NH_TASK_KIND_HANDLER,   /* a message's handler (nimbus._run) */
  NH_TASK_KIND_CHECKER,   /* a status checker's run (core.every) */
  NH_TASK_KIND_ROUTE,     /* a served HTTP request */
  NH_TASK_KIND_HOOK,      /* a lifecycle hook (nimbus.on) */
} nh_task_kind_t;

/* "task", "handler", "checker", "route": for logs and the operator log's actor. */
const char *nh_task_kind_name(nh_task_kind_t k);

/* How a task ended (nh_task_status_t, core/nh_outcome_types.h): NH_TASK_OK with its nres
 * results on nh_task_thread(t); NH_TASK_ERROR with the message and traceback at its top
 * (nh_task_error says whether it was out of memory); NH_TASK_KILLED, nh_task_kill says
 * why; NH_TASK_CANCELLED by the host. */
typedef void (*nh_task_done_cb)(nh_task_t *t, nh_task_status_t status, int nres);

typedef struct nh_task_opts {
  nh_task_kind_t kind;
  double deadline_s;         /* <= 0: none */
  double cpu_budget_s;       /* <= 0: default (1 s) */
  nh_task_done_cb on_done;
  void *data;
  const nh_trace_ctx_t *trace;   /* the span the task runs in (a handler's), copied; NULL: none */
} nh_task_opts_t;

/* Creates a task whose function and `nargs` arguments the caller pushes on the returned
 * coroutine (nh_task_thread) before calling nh_task_run. */
nh_task_t *nh_task_new(nh_vm_t *vm, const nh_task_opts_t *opts);
lua_State *nh_task_thread(nh_task_t *t);
void *nh_task_data(nh_task_t *t);
nh_task_kind_t nh_task_kind(nh_task_t *t);
nh_task_kill_t nh_task_kill(nh_task_t *t);     /* NH_KILL_NONE unless it was killed */
nh_task_err_t nh_task_error(nh_task_t *t);     /* after NH_TASK_ERROR */
/* The budgets it runs under: CPU per resume (the default when none was given) and the
 * deadline (<= 0: none), in seconds. */
/* The span the task runs in (its children's parent: nimbus.http.request), or NULL. */
const nh_trace_ctx_t *nh_task_trace(nh_task_t *t);
double nh_task_cpu_budget(nh_task_t *t);
double nh_task_deadline(nh_task_t *t);
void nh_task_run(nh_task_t *t, int nargs);
/* Like nh_task_run, but on the next loop iteration. */
void nh_task_start_later(nh_task_t *t, int nargs);

/* For yielding C primitives: the task running in L, or raises a clear error naming
 * `what` when L is not a task (a plain coroutine, the main chunk, a __gc metamethod,
 * a table.sort comparator...). */
nh_task_t *nh_task_check(lua_State *L, const char *what);
/* Task of L or NULL, without raising. */
nh_task_t *nh_task_of(lua_State *L);
/* Parks op on the task and yields; use as `return nh_task_yield(L, t, op);`. */
int nh_task_yield(lua_State *L, nh_task_t *t, nh_op_t *op);
/* Like nh_task_yield, with a continuation: k(L, LUA_YIELD, ctx) runs when the task
 * resumes, with the C function's stack as it was plus what the completion pushed. */
int nh_task_yieldk(lua_State *L, nh_task_t *t, nh_op_t *op, lua_KContext ctx, lua_KFunction k);
/* Completion: the op pushed nres values on nh_task_thread(t); resumes the task. */
void nh_task_complete(nh_task_t *t, int nres);
/* The same, resumed on the next loop iteration: for completions that happen inside
 * another task's resume (one task ending another's wait). */
void nh_task_complete_later(nh_task_t *t, int nres);

/* Ends every task of the VM (NH_TASK_CANCELLED). */
void nh_task_cancel_all(nh_vm_t *vm);
void nh_task_cancel(nh_task_t *t);

#endif
