/* Bulk operator actions (resubmit/skip every event a filter matches), one engine for the
 * CLI (`resubmit --all`, `skip --all`) and the admin API (`POST /api/v1/bulk/...`).
 *
 * The matching events are queued as ordinary operator requests (nh_operator_queue, the
 * path of a single resubmit) in batches, one store transaction per batch, so a killed run
 * leaves whole batches behind. A run keeps a snapshot time in `bulk_runs` under its key
 * (the command and its filters): it acts only on events unchanged since it first started,
 * and leaves out events that already have a request waiting. Running an interrupted
 * command again therefore queues exactly the rest: what the first run queued either still
 * waits (left out) or has been applied by the host (changed since the snapshot, left out).
 * A caller steps batch by batch (nh_bulk_step), so the admin API runs one per loop turn
 * and never holds the loop for a whole group. */
#ifndef NH_BULK_H
#define NH_BULK_H

#include "dispatch/nh_operator.h"

typedef struct nh_bulk nh_bulk_t;

typedef struct nh_bulk_opts {
  nh_op_kind_t kind;       /* NH_OP_RESUBMIT or NH_OP_SKIP */
  int force;               /* resubmit Completed and Skipped events too */
  const char *key;         /* the run's identity: the command and its filters */
  const char *owner;       /* "host:pid:bulk": a live owner makes a second run refuse */
  const char *actor;       /* for each event's history ("cli (bulk)", "admin API (bulk)") */
  const char *who;         /* for the operator log; NULL: the operating-system user */
  const char *reason;      /* skip: why, kept in the log */
} nh_bulk_opts_t;

#define NH_BULK_EPS 32
typedef struct nh_bulk_result {
  long long total;                     /* what the run set out to queue (after prepare) */
  long long queued, refused;
  char first_refusal[512];
  int resumed;                         /* an interrupted run of the same key was picked up */
  int64_t resumed_started_ms;
  long long resumed_queued;
  int neps;
  struct { char name[128]; long long n; } eps[NH_BULK_EPS];   /* queued per endpoint */
} nh_bulk_result_t;

/* The filter is copied (its strings must outlive the run); only the statuses the action
 * can apply to are kept (as nh_operator_queue would refuse the others). */
nh_bulk_t *nh_bulk_new(nh_store_t *s, nh_transport_t *tr, const nh_event_filter_t *f, const nh_bulk_opts_t *o);
/* The same on a PostgreSQL store, through a command's blocking connection. */
struct nh_pg_db;
nh_bulk_t *nh_bulk_new_pg(struct nh_pg_db *db, const nh_event_filter_t *f, const nh_bulk_opts_t *o);
/* Why the last call failed (the store's words). */
const char *nh_bulk_errmsg(const nh_bulk_t *b);
/* Picks up an interrupted run of the same key or snapshots now, and counts the events.
 * NH_ESTATE (err says why): the same run is going on in a live process. */
int nh_bulk_prepare(nh_bulk_t *b, nh_error_t *err);
/* The first n events the run would queue, in its order (a dry run's sample). */
int nh_bulk_sample(nh_bulk_t *b, int n, nh_audit_cb cb, void *data);
/* Ends a run that found nothing to do (forgets an interrupted one of the same key). */
int nh_bulk_nothing(nh_bulk_t *b);
/* Records the run, then queues a batch per call: 1 more to do, 0 done, NH_EFAIL (the
 * batches queued so far stay queued; the same run again queues the rest). */
int nh_bulk_start(nh_bulk_t *b);
int nh_bulk_step(nh_bulk_t *b);
/* After a failed step: the run stays recorded (its snapshot, what it queued) but owned by
 * no one, so the same action again in this live process resumes it instead of waiting. */
int nh_bulk_abandon(nh_bulk_t *b);
/* Forgets the run and writes one operator-log line for it. */
int nh_bulk_finish(nh_bulk_t *b);
const nh_bulk_result_t *nh_bulk_result(const nh_bulk_t *b);
void nh_bulk_free(nh_bulk_t *b);

#endif
