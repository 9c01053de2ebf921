/* Dispatcher internals shared by its files. */
#ifndef NH_DISPATCH_INT_H
#define NH_DISPATCH_INT_H

#include "nh_dispatch.h"
#include "nh_retry.h"
#include "nh_story.h"
#include "core/nh_msg.h"
#include "core/nh_outcome_types.h"
#include "core/nh_queue.h"
#include "core/nh_trace.h"
#include "lua/nh_vm.h"
#include "store/nh_uow.h"

typedef struct nh_endpoint {
  char *name;
  nh_vm_t *vm;
  int concurrency;               /* sessions in flight at once */
  int partitions;                /* broker queues the endpoint's sessions are spread over (a power of two) */
  int sessions;                  /* Service Bus: sessions accepted at once (session receivers); 0: none */
  int inbox;
  int64_t lock_ms, renew_max_ms;
  double timeout_s, cpu_budget_s;  /* per handler task: wall-clock deadline, CPU between yields */
  nh_retry_config_t retry;
  nh_retry_policy_t transient;   /* nimbus.transient(...) errors: max_retries = max_attempts - 1 */
  char **types;                  /* handled event types (subscriptions) */
  int *commands;                 /* per type: a command (exactly one consuming endpoint) */
  int ntypes;
  int in_flight;
  char *due_cursor;              /* where the next scan of draining sessions starts */
  int queue_starved;             /* replays took every slot in the last pump: the queue goes first */
  char *pass_cursor;             /* due_cursor and queue_starved when the pump's pass began: a void */
  int pass_starved;              /* pass (nh_uow.h) starts again from them */
  int retired;                   /* dropped by a reload: no new work */
  int metrics_seeded;            /* its store-wide gauges were read (nh_tell.c) */
  struct nh_endpoint *next;
} nh_endpoint_t;

typedef enum { NH_JOB_QUEUE, NH_JOB_RETRY, NH_JOB_PARKED } nh_job_src_t;

/* Why the host ended a running handler (nh_renew.c). The first three make the attempt a
 * failure ("handler cancelled: <name>"); a lost lock records nothing. */
typedef enum {
  NH_CANCEL_NONE,          /* not by a renewal: it ended itself, or the host is stopping or closing its VM */
  NH_CANCEL_RENEW_CAP,     /* past the endpoint's lock.renew_max */
  NH_CANCEL_NOT_ALIVE,     /* is_alive(ctx) returned false */
  NH_CANCEL_ALIVE_RAISED,  /* is_alive(ctx) raised (the error in job->cancel_detail) */
  NH_CANCEL_LOCK_LOST,     /* the session lock is gone: another owner may have the message */
} nh_cancel_t;

typedef struct nh_adapter {
  char *path;
  nh_vm_t *vm;
} nh_adapter_t;

typedef struct nh_pub {
  char *type, *body, *session, *correlation_id, *to;
  char *given_id;                /* the handler's MessageId (nimbus.publish{message_id=}), else message_id */
  size_t body_len;
  char message_id[37];
  nh_queue_t node;               /* job->pubs */
} nh_pub_t;

typedef struct nh_job {
  nh_dispatch_t *d;
  nh_endpoint_t *ep;
  nh_job_src_t src;
  nh_msg_t msg;
  int64_t park_seq;             /* NH_JOB_PARKED */
  nh_session_state_t st;         /* read by route; valid while we hold the session lock */
  nh_run_kind_t kind;            /* passed to Lua as ctx.kind */
  nh_outcome_t out;
  int apply_failures;
  int lock_loss_told;            /* its lost session lock was logged and counted (unlock in nh_outcome.c) */
  nh_task_t *task;               /* while the handler runs */
  nh_vm_t *vm;                   /* the generation it runs in */
  int64_t started_ms;
  uint64_t started_ns, finished_ns;   /* uv_hrtime around the handler run */
  nh_trace_ctx_t span;           /* the handler run's span (nh_spans.c), once span_set */
  uint8_t span_parent[8];        /* the sender's span, when span_has_parent */
  int span_set, span_has_parent;
  int64_t span_start_ns;         /* unix epoch */
  int was_handoff;               /* the audit row read was Pending+Handoff */
  int64_t retry_in_ms;           /* the outcome scheduled a retry in this many ms; -1: none */
  int attempt, max_attempts;     /* a transient failure's attempt (for the story) */
  nh_cancel_t cancel;            /* why the host ended it (renewal cap, is_alive, lock lost) */
  char *cancel_detail;           /* the error an is_alive raised */
  nh_queue_t run_node;           /* in d->running_jobs while the handler runs */
  nh_queue_t fresh_node;         /* in d->fresh between fetching and starting */
  nh_queue_t pubs;               /* nh_pub_t: publishes buffered until the outcome commits */
  nh_queue_t done_node;          /* d->done, or a pump's applied and retry queues */
} nh_job_t;

struct nh_dispatch {
  uv_loop_t *loop;
  nh_store_t *store;
  struct nh_checkpointer *ckpt;   /* WAL checkpoints off the loop thread */
  nh_transport_t *tr;
  char *lua_dir;
  nh_endpoint_t *endpoints;
  nh_endpoint_t *pending_eps;    /* registered by the adapter being loaded */
  nh_adapter_t *adapters;        /* one VM per adapter file, the current generation */
  int nadapters;
  nh_vm_t **retiring;            /* previous generations finishing their running tasks */
  int nretiring;
  nh_vm_t *reloading;            /* the generation being replaced during a reload */
  struct nh_watch *watch;        /* nh_watch.c: the adapter directories watched for saves (hot reload) */
  uv_timer_t reload_timer;       /* nh_watch.c: when the next reload (attempt) is due */
  uint64_t reloads, reload_failures;
  char reply_ep[48];             /* this process's reply queue: "_reply.<uuid>" */
  nh_queue_t requests;           /* nh_request.c: waiting for a reply, newest first */
  nh_queue_t fresh;              /* fetched in the open transaction, not started (nh_job_t.fresh_node) */
  nh_queue_t done;               /* finished, effects not yet committed (FIFO) */
  int running;
  nh_queue_t running_jobs;       /* handlers in flight, their locks renewed (nh_job_t.run_node) */
  uint64_t renewals, renew_failures, cancellations;
  uint64_t pumps, pumped;        /* transactions with work, messages fetched in them */
  int pumping, stopping, started, closing, force_stop;
  int committing;                /* a pump's commit is out: the next pump waits for its result */
  int filling;                   /* a void pass's misses are being read (a unit with a cache): the pump waits */
  int commit_ok;                 /* NH_UOW_LATE_COMMIT: the result, told on commit_timer */
  int late_fill;                 /* ... and it is a fill's, not a commit's */
  int commit_in_doubt;           /* the commit's outcome is UNKNOWN: its jobs are given back, not applied again */
  uv_timer_t commit_timer;
  nh_queue_t pump_applied;       /* the pump's jobs whose outcome its transaction records */
  nh_queue_t pump_retry;         /* its jobs whose outcome could not be written, to apply again */
  int pump_fetched, pump_had_done;
  int store_failing;             /* the last pump's transaction failed (disk full, unwritable) */
  nh_endpoint_t *receiving_ep;   /* the endpoint whose receive() is running */
  int64_t poll_ms;               /* adaptive idle poll interval */
  int64_t drain_deadline;
  void (*on_stopped)(void *);
  void *stopped_data;
  uv_idle_t idle;
  uv_timer_t timer;
  uv_timer_t drain_timer;
  uv_timer_t renew_timer;
  uv_timer_t retention_timer;    /* nh_retention.c */
  int64_t retention_resolved_ms, retention_inbox_ms;   /* 0: keep */
  int retention_fixed;           /* set on the command line: the adapter's nimbus.retention does not change it */
  uint64_t purged;
  uv_timer_t presence_timer;     /* nh_presence.c */
  uv_timer_t overdue_timer;      /* nh_overdue.c */
  int overdue_scanning;          /* PostgreSQL: a scan's batches are out on the link */
  int gauges_reading;            /* PostgreSQL: the store-wide gauges' read is out on the link */
  int64_t gauges_read_at;        /* when it was sent last (nh_gauges_pg.c) */
  char *owner;                   /* "host:pid:tag", NULL: not registered in `hosts` */
  int64_t started_ms;
  nh_story_t story;              /* the open transaction's notes (nh_story.h) */
  nh_uow_t *uow;                 /* the state machine's reads in a pump (store/nh_uow.h) */
  struct nh_pg_link *link;       /* a PostgreSQL store's (store == NULL): Lua's store calls (nh_pgcalls.c) */
  char **pub_claims;             /* PostgreSQL: the MessageIds the open pass claimed (nh_vmhost.c) */
  int npub_claims;
};

/* nh_outcome.c: the state machine */
int nh_dispatch_route(nh_dispatch_t *d, nh_job_t *job);    /* 1: needs a handler, 0: settled here, < 0: error */
int nh_dispatch_apply(nh_dispatch_t *d, nh_job_t *job);    /* writes a finished job's effects */
int nh_dispatch_flush_pubs(nh_dispatch_t *d, nh_job_t *job);
void nh_job_free(nh_job_t *job);
void nh_pub_free(nh_pub_t *p);

/* nh_request.c */
void *nh_dispatch_request(void *data, const char *type, const char *body, size_t len, const char *session,
                          const nh_trace_ctx_t *trace, double timeout_s, void (*done)(void *, const char *, const char *, const char *), void *ud,
                          nh_error_t *err);
void nh_dispatch_request_cancel(void *data, void *handle);
void nh_dispatch_take_reply(nh_dispatch_t *d, nh_msg_t *m);
void nh_dispatch_deliver_replies(nh_dispatch_t *d, int ok);
int nh_dispatch_send_reply(nh_dispatch_t *d, nh_job_t *job);
void nh_dispatch_requests_close(nh_dispatch_t *d);

/* nh_reload.c */
int nh_dispatch_reload(nh_dispatch_t *d, int adapter, nh_error_t *err);   /* adapter < 0: all */
enum { NH_RL_OK, NH_RL_FAILED, NH_RL_SUPERSEDED };
/* Loads adapter i again: NH_RL_*. A failure is logged and counted when `report`, else
 * left to the caller (the watcher holds it for a last try); a failure while its files
 * were changing is NH_RL_SUPERSEDED, neither. */
int nh_dispatch_reload_adapter(nh_dispatch_t *d, int i, int report, nh_error_t *err);
void nh_dispatch_close_retired(nh_dispatch_t *d, int force);
int nh_dispatch_subscribe_all(nh_dispatch_t *d, nh_error_t *err);

/* nh_watch.c: saves of the adapter files trigger reloads */
void nh_dispatch_unwatch(nh_dispatch_t *d);
void nh_dispatch_reload_begins(nh_dispatch_t *d);      /* a change from now on supersedes what loads */
int nh_dispatch_reload_superseded(nh_dispatch_t *d);   /* a .lua file changed since the load began */

/* nh_dispatch.c */
void nh_dispatch_kick(nh_dispatch_t *d);   /* pump on the next loop iteration */
nh_endpoint_t *nh_dispatch_find_endpoint(nh_dispatch_t *d, const char *name);
void nh_dispatch_collect_types(void *data, const char *endpoint, const char *const *types, const int *commands,
                               int n);
/* A running job's handler ended (job->out says how): off the running list, queued for
 * the next pump to apply. */
void nh_dispatch_job_finished(nh_dispatch_t *d, nh_job_t *job);

/* nh_vmhost.c: the callbacks Lua calls the host through */
const nh_vm_host_t *nh_dispatch_vm_host(nh_dispatch_t *d, nh_vm_host_t *out);
int nh_dispatch_pub_dedup(nh_dispatch_t *d, const char *who, const char *message_id, int claim);
void nh_dispatch_pub_claims_clear(nh_dispatch_t *d);   /* a pass begins */
/* "who: MessageId ... was already published at ...: not published again" */
void nh_dispatch_log_duplicate(const char *who, const char *message_id, int64_t at);

/* nh_tell.c: after a commit, the story's log lines, metrics and hooks */
void nh_dispatch_tell(nh_dispatch_t *d);
/* The same for a story of its own (a writer beside the pump's transaction, on PostgreSQL). */
void nh_dispatch_tell_story(nh_dispatch_t *d, nh_story_t *s);
void nh_dispatch_metrics_start(nh_dispatch_t *d);   /* gauges read from the store, collectors */
void nh_dispatch_metrics_stop(nh_dispatch_t *d);
void nh_dispatch_count_lock_lost(const char *endpoint);
/* The store-wide gauges of an endpoint, as read (nh_tell.c) */
void nh_dispatch_gauges_set(const char *endpoint, int64_t blocked, int64_t pending, int64_t parked);
/* nh_gauges_pg.c: reads them on a PostgreSQL store (at most every 10 s; no-op on sqlite) */
void nh_dispatch_gauges_pg(nh_dispatch_t *d);

/* nh_spans.c: traces (docs/observability.md) */
void nh_dispatch_spans_start(void);                              /* its counter shows from the start */
void nh_dispatch_span_begin(nh_dispatch_t *d, nh_job_t *job);   /* as its handler starts */
void nh_dispatch_span_end(nh_dispatch_t *d, nh_job_t *job);     /* exported (--otlp, sampled) */
/* A publish outside any handler: a new trace whose PRODUCER span is exported. */
void nh_dispatch_span_root_publish(nh_dispatch_t *d, const char *event_type, const char *to,
                                   char out[NH_TRACEPARENT_LEN + 1]);

/* nh_renew.c */
void nh_dispatch_renew_start(nh_dispatch_t *d);   /* (re)arms the timer: a third of the lock duration */
const char *nh_dispatch_cancel_name(nh_cancel_t c);   /* "lock lost", ...: for texts and logs */

/* nh_retention.c */
void nh_dispatch_retention_start(nh_dispatch_t *d);
int nh_dispatch_set_retention(void *data, const char *resolved, const char *inbox, nh_error_t *err);

/* nh_overdue.c */
void nh_dispatch_overdue_start(nh_dispatch_t *d);

/* nh_presence.c */
#define NH_PRESENCE_EVERY_MS 10000
void nh_dispatch_presence_update(nh_dispatch_t *d);   /* at start and after a reload */
void nh_dispatch_presence_end(nh_dispatch_t *d);

/* nh_endpoint.c */
int nh_endpoint_parse(nh_endpoint_t *ep, lua_State *L, int opts, nh_error_t *err);
void nh_endpoint_free(nh_endpoint_t *ep);

/* nh_outcome.c: a queue message delivered more often than this is dead-lettered unrun */
#define NH_MAX_DELIVERIES 10

#endif
