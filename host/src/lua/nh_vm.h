/* Lua VMs and tasks. One VM per adapter file; every message runs as its own coroutine
 * (a task). This module knows nothing about transports or the store: the dispatcher
 * hands it plain fields through nh_task_args_t and gets an nh_task_result_t back, which
 * says what happened to the task; what that means for the event is the dispatcher's
 * decision. The types both sides share are in core/nh_outcome_types.h. */
#ifndef NH_VM_H
#define NH_VM_H

#include <lua.h>
#include <stdint.h>
#include <uv.h>

#include "core/nh_error.h"
#include "core/nh_outcome_types.h"
#include "core/nh_trace.h"

typedef struct nh_vm nh_vm_t;
typedef struct nh_task nh_task_t;

/* An answer that comes later. A host call made where Lua can wait (a task's own thread,
 * yieldable) is given one; NULL elsewhere (the main chunk, a coroutine of the task's own,
 * across a C boundary). The host either answers now, as each call below says, leaving it
 * untouched, or keeps it, returns NH_LATER and answers once, from a loop callback: the
 * values go on nh_later_thread (NULL when the task ended meanwhile: push nothing) and
 * nh_later_done resumes the task with them; nh_later_fail answers with the call's error
 * instead. Either frees the handle. A store that is a server answers so
 * (dispatch/nh_pgcalls.c): the loop never waits for its round trips. */
typedef struct nh_later nh_later_t;
#define NH_LATER 1
lua_State *nh_later_thread(nh_later_t *l);
void nh_later_done(nh_later_t *l, int nres);
void nh_later_fail(nh_later_t *l, const nh_error_t *err);

/* What the host (dispatcher) provides to Lua. Callbacks run on the loop thread. */
typedef struct nh_vm_host {
  void *data;
  /* Validates endpoint options at the top of the stack index `opts`; on error returns
   * non-zero with the reason in err (raised to the adapter as a Lua error). */
  int (*register_endpoint)(void *data, nh_vm_t *vm, lua_State *L, const char *name, int opts, nh_error_t *err);
  /* task_data is the publishing task's nh_task_args_t.data, NULL outside a task.
   * given_id: the caller's MessageId (NULL: a fresh one into message_id); published
   * once within the dedup window: *duplicate is set when it was already. Later (outside a
   * handler only): the MessageId and whether it was a duplicate, nh_later_done(later, 2). */
  int (*publish)(void *data, void *task_data, const char *type, const char *body, size_t body_len,
                 const char *session, const char *correlation_id, const char *to, const char *given_id,
                 char message_id[37], int *duplicate, nh_later_t *later, nh_error_t *err);
  /* A handler task ended (task_data: its nh_task_args_t.data); the result is moved to
   * the callee, which frees it with nh_task_result_clear. */
  void (*task_done)(void *data, void *task_data, nh_task_result_t *r);
  /* Pushes the endpoint's Pending+Handoff events as a Lua array; returns 0, or non-zero
   * with err set. Later: the array, nh_later_done(later, 1). */
  int (*pending_handoffs)(void *data, lua_State *L, const char *endpoint, nh_later_t *later, nh_error_t *err);
  /* Settles a hand-off (complete: result JSON or NULL; fail: error text and type). Later:
   * true, nh_later_done(later, 1). */
  int (*handoff)(void *data, const nh_handoff_req_t *req, nh_later_t *later, nh_error_t *err);
  /* Sends a request (in the calling task's span, `trace`, when it has one) and calls done(ud, reply_json, NULL, NULL) or done(ud, NULL, msg, code)
   * later, from the loop; returns a handle for request_cancel (no done after it). */
  void *(*request)(void *data, const char *type, const char *body, size_t len, const char *session,
                   const nh_trace_ctx_t *trace, double timeout_s, void (*done)(void *ud, const char *reply, const char *msg, const char *code),
                   void *ud, nh_error_t *err);
  void (*request_cancel)(void *data, void *handle);
  /* nimbus.retention{resolved = AGE, inbox = AGE}: ages as text ("7d"), NULL = unchanged. */
  int (*set_retention)(void *data, const char *resolved, const char *inbox, nh_error_t *err);
} nh_vm_host_t;

typedef struct nh_task_args {
  const char *endpoint, *event_type, *body;
  size_t body_len;
  const char *event_id, *message_id, *session_id, *correlation_id, *originating_message_id;
  nh_run_kind_t kind;            /* ctx.kind, as nh_run_kind_name says it */
  int retry_count, delivery_count;
  int64_t enqueued_at;
  double deadline_s, cpu_budget_s;   /* <= 0: none / the default */
  const nh_trace_ctx_t *trace;   /* the handler's span (ctx.trace_id, ctx.traceparent); NULL: none */
  void *data;                    /* handed back in task_done */
} nh_task_args_t;

/* Creates a VM, sets package.path (lua_dir, then the adapter's directory) and loads the
 * adapter. On failure returns NULL with "file:line: message" in err. host may be NULL
 * (interpreter mode). */
nh_vm_t *nh_vm_init(uv_loop_t *loop, const char *adapter_path, const char *lua_dir, const nh_vm_host_t *host,
                   nh_error_t *err);
/* Interpreter mode: runs `script` with the global `arg` set as lua.c does. Returns the
 * process exit status. */
int nh_vm_run_script(uv_loop_t *loop, const char *script, int argc, char **argv, const char *lua_dir,
                     const nh_vm_host_t *host);
/* Check mode (`nimbus-host check`): loads the adapter into a VM that listens on no port,
 * creates no database file and sends nothing (nimbus.http.serve checks its routes,
 * nimbus.sqlite.open gives an empty in-memory database, publishes go to host->publish,
 * tasks and timers never run), with configuration mistakes recorded instead of raised.
 * Returns what the runtime recorded, as JSON (nimbus.internal.check_report: problems,
 * endpoints with their handlers and checkers, and "error", the "file:line: message" that
 * stopped loading), for the caller to free; NULL with err set when the runtime itself
 * cannot be loaded. The VM is closed before it returns. */
char *nh_vm_check(uv_loop_t *loop, const char *adapter_path, const char *lua_dir, const nh_vm_host_t *host,
                  nh_error_t *err);
/* Whether a loaded adapter does anything besides its endpoints: tasks alive (nimbus.spawn),
 * periodic tasks (checkers, nimbus.every) or HTTP servers listening. An adapter without
 * endpoints is still an adapter when this is true. */
int nh_vm_has_work(nh_vm_t *vm);
void nh_vm_close(nh_vm_t *vm);
lua_State *nh_vm_state(nh_vm_t *vm);
const char *nh_vm_path(nh_vm_t *vm);
int nh_vm_live_tasks(nh_vm_t *vm);
/* Reload support: stop the VM's periodic tasks (a retiring generation), and a drain
 * deadline (ms since epoch) its owner enforces. */
void nh_vm_stop_timers(nh_vm_t *vm);
void nh_vm_set_deadline(nh_vm_t *vm, int64_t at_ms);
int64_t nh_vm_deadline(nh_vm_t *vm);

/* Fills `out` with endpoint name -> handled event types, for subscriptions. */
typedef void (*nh_vm_sub_cb)(void *data, const char *endpoint, const char *const *types, const int *commands,
                             int n);
int nh_vm_subscriptions(nh_vm_t *vm, nh_vm_sub_cb cb, void *data, nh_error_t *err);

/* Starts a handler task; it may finish (task_done) before this returns, in which case
 * *task is NULL. */
int nh_vm_task_start(nh_vm_t *vm, const nh_task_args_t *args, nh_task_t **task, nh_error_t *err);
/* Asks the handler's is_alive(ctx) of a running handler task (plain call, it cannot wait).
 * 1 alive (or no is_alive given), 0 not alive, < 0 it raised (message in err). */
int nh_vm_task_alive(nh_vm_t *vm, const char *event_id, nh_error_t *err);
/* Ends a task without an outcome (task_done gets NH_TASK_CANCELLED). */
void nh_vm_task_cancel(nh_task_t *t);
/* Cancels every suspended task of the VM (task_done with NH_TASK_CANCELLED). */
void nh_vm_cancel_all(nh_vm_t *vm);

/* Lifecycle hooks (nimbus.on, nh_hooks.c): told after the outcome committed, each
 * registered function run as a task of its own with the usual budgets; a hook that fails
 * is logged and counted and changes nothing. */
typedef enum {
  NH_HOOK_EVENT_FAILED, NH_HOOK_DEAD_LETTERED, NH_HOOK_SESSION_BLOCKED, NH_HOOK_SESSION_UNBLOCKED,
  NH_HOOK_HANDOFF_OVERDUE, NH_HOOK_COUNT
} nh_hook_t;
const char *nh_hook_name(nh_hook_t h);
/* The hook of that name, or -1. */
int nh_hook_find(const char *name);
typedef struct nh_hook_info {
  const char *endpoint, *event_id, *session_id, *event_type, *message_id;
  const char *status, *error, *error_type, *blocked_by, *detail, *action, *external_job_id;
  int64_t retry_in_ms;           /* < 0: none */
  int attempt;                   /* 0: not a transient failure */
  int64_t expected_by;           /* hand-offs: ms; 0: none */
} nh_hook_info_t;
/* Whether the VM registered any function for the hook (cheap: asked per note). */
int nh_vm_hook_wanted(nh_vm_t *vm, nh_hook_t h);
/* Starts one task per registered function; returns how many. */
int nh_vm_hook_fire(nh_vm_t *vm, nh_hook_t h, const nh_hook_info_t *info);
/* Memory the VM's allocator holds, in bytes. */
size_t nh_vm_memory(nh_vm_t *vm);

/* t[k] = v on the table at the top of the stack; nothing when v is NULL. */
void nh_lua_set_str(lua_State *L, const char *k, const char *v);

/* Resolves the directory holding lua/nimbus: $NIMBUS_LUA_DIR, the install prefix
 * next to the executable, then the source tree the binary was built from. */
const char *nh_vm_lua_dir(const char *argv0);

#endif
