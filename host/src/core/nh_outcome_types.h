/* The plain types a handler run is described with, shared by lua/ and dispatch/. They
 * live in core so that both can include them and the dependencies stay one way
 * (dispatch -> lua -> core): lua/ runs a task and reports what happened to it
 * (nh_task_result_t); dispatch/ decides what that means for the event (which outcome,
 * which error type: dispatch/nh_vmhost.c). Nothing here takes a decision.
 *
 * Decisions are taken on the enums; the strings of the *_name functions are only shown
 * (logs, error texts, ctx.kind in Lua), so rewording one changes no behaviour. */
#ifndef NH_OUTCOME_TYPES_H
#define NH_OUTCOME_TYPES_H

#include <stdint.h>

/* Why a message's handler runs: ctx.kind in Lua. */
typedef enum {
  NH_RUN_EVENT,      /* a message from the queue */
  NH_RUN_RESUBMIT,   /* an operator's resubmission of an event */
  NH_RUN_RETRY,      /* a session's blocker again, from its audit payload */
  NH_RUN_REPLAY,     /* a parked message, after its session's blocker resolved */
} nh_run_kind_t;

/* "event", "resubmit", "retry", "replay". */
const char *nh_run_kind_name(nh_run_kind_t k);

/* ---------------------------------------------------------------- how a task ended */

typedef enum {
  NH_TASK_OK,          /* the function returned */
  NH_TASK_ERROR,       /* it raised an error nothing caught */
  NH_TASK_KILLED,      /* the Lua side stopped it: a budget or the deadline (nh_task_kill_t) */
  NH_TASK_CANCELLED,   /* the host tore it down (shutdown, VM closed, nh_vm_task_cancel) */
} nh_task_status_t;

typedef enum {
  NH_KILL_NONE,
  NH_KILL_CPU_BUDGET,  /* it ran past its CPU budget without yielding */
  NH_KILL_DEADLINE,    /* it ran past its wall-clock deadline */
} nh_task_kill_t;

/* "CPU budget exceeded", "deadline exceeded": for logs and Lua error messages. */
const char *nh_task_kill_name(nh_task_kill_t k);

typedef enum {
  NH_TASK_ERR_RUNTIME,  /* any error value raised */
  NH_TASK_ERR_MEMORY,   /* the VM ran out of memory (its limit) */
} nh_task_err_t;

/* What the handler runner (nimbus._run) returned, for NH_TASK_OK. */
typedef enum {
  NH_RUNNER_OUTCOME,         /* an outcome table with a status the host knows */
  NH_RUNNER_NO_OUTCOME,      /* no table at all */
  NH_RUNNER_UNKNOWN_STATUS,  /* a table whose status the host does not know */
} nh_runner_ret_t;

/* ---------------------------------------------------------------- outcomes */

typedef enum {
  NH_OUT_COMPLETED,
  NH_OUT_FAILED,
  NH_OUT_HANDOFF,
  NH_OUT_DEADLETTER,
  NH_OUT_UNSUPPORTED,
  NH_OUT_TRANSIENT,
  NH_OUT_CANCELLED,     /* the host stopped the task: nothing is recorded or settled */
} nh_outcome_kind_t;

typedef struct nh_outcome {
  nh_outcome_kind_t kind;
  char *error_text, *error_type, *error_stack;
  char *handoff_reason, *external_job_id;
  double expected_by_s;   /* < 0: none given */
  char *reply;            /* reply handlers: the JSON to send back to the requester */
  double retry_after_s;   /* transient: the least wait before the next attempt (< 0: none given),
                           * nimbus.transient(msg, { retry_after = s }), e.g. an API's Retry-After */
} nh_outcome_t;

/* An empty outcome (no strings, no expected_by, no retry_after). */
void nh_outcome_init(nh_outcome_t *o);
/* The wait before a transient outcome's next attempt: the policy's `delay_ms`, or the
 * outcome's retry_after when that is longer, never more than `cap_ms` (> 0) -- a Retry-After
 * of a day must not park a session for a day unasked. Whole milliseconds, rounded up so the
 * attempt is never due before retry_after. */
int64_t nh_outcome_retry_delay_ms(const nh_outcome_t *o, int64_t delay_ms, int64_t cap_ms);
/* Frees the strings and leaves it empty. */
void nh_outcome_clear(nh_outcome_t *o);

/* What happened to a handler task, as lua/ reports it to its host (task_done). The
 * strings are owned; nh_task_result_clear frees them. */
typedef struct nh_task_result {
  nh_task_status_t status;
  nh_runner_ret_t returned;      /* NH_TASK_OK: what the runner gave back */
  nh_outcome_t out;              /* NH_TASK_OK + NH_RUNNER_OUTCOME: the outcome the runner decided */
  nh_task_err_t error;           /* NH_TASK_ERROR: what kind of error escaped the runner */
  char *error_msg;               /* NH_TASK_ERROR: its message with the traceback (NULL: none) */
  nh_task_kill_t kill;           /* NH_TASK_KILLED: why */
  double cpu_budget_s, deadline_s;   /* the budgets the task ran under (deadline <= 0: none) */
} nh_task_result_t;

void nh_task_result_init(nh_task_result_t *r);
void nh_task_result_clear(nh_task_result_t *r);

/* ---------------------------------------------------------------- hand-offs */

/* A hand-off settlement asked for from Lua (nimbus.handoff.complete/fail,
 * chk:complete/fail). The strings are borrowed. */
typedef struct nh_handoff_req {
  int complete;                  /* 1 complete, 0 fail */
  const char *event_id, *endpoint, *session_id, *message_id;
  const char *result;            /* complete: JSON or NULL */
  const char *error_text, *error_type;   /* fail */
  const char *store;             /* scripts only: which store file (NULL: $NIMBUS_STORE or ./nimbus.db) */
  const char *actor;             /* who asked, for the operator log ("handler", "checker", "script"...) */
} nh_handoff_req_t;

#endif
