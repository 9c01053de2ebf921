/* The embedded transport's tables and statements in PostgreSQL's dialect (stage 4
 * groundwork, docs/store-backends.md "The embedded transport on PostgreSQL"): its schema as
 * a migration list of its own, every statement of nh_embedded.c's q_sql as an operation
 * with an argument builder and a reader into nh_msg_t (in the style of nh_pg_ops.h), and
 * heads_and_lock, the head scan for several hosts: one statement that finds the heads of
 * sessions nobody holds and takes their lease, so hosts running it at once never get the
 * same session.
 *
 * The operations are a table of nh_pg_exec.c's executor (nh_pgq_optab), run like the
 * store's: one at a time (nh_pgq_run), or in batches, the store's operations among them
 * (nh_pgq_batch_add beside nh_pg_batch_add: one transaction, one round trip), each
 * prepared once per connection, binary results. host/tests/test_pg_queue.c runs the same
 * sequences through the sqlite transport and through these operations and compares what
 * comes back. */
#ifndef NH_PG_QUEUE_H
#define NH_PG_QUEUE_H

#include <libpq-fe.h>
#include <stdint.h>

#include "core/nh_error.h"
#include "core/nh_msg.h"
#include "nh_pg_ops.h"

/* The queue schema version this nimbus-host writes (entries of its migration list). */
#define NH_PG_QUEUE_SCHEMA_VERSION 1

/* Brings the queue tables (subscriptions, queue, session_locks, dead_letters) to
 * NH_PG_QUEUE_SCHEMA_VERSION, blocking, with the store's migrator (nh_pg_int.h): one
 * transaction per migration under an advisory lock of its own (not the store's: either
 * may migrate while the other waits for nothing), the version in the one-row table
 * nimbus_queue_schema. A newer queue schema is refused, naming both versions. */
int nh_pg_queue_migrate(PGconn *conn, nh_error_t *err);
/* The queue schema version the connection sees (0: no queue tables yet). */
int nh_pg_queue_schema_version(PGconn *conn, int *version, nh_error_t *err);

/* One prepared statement each: q_sql's, in its order, then what PostgreSQL adds. */
typedef enum nh_pgqop {
  NH_PGQ_SUB_DEL,
  NH_PGQ_SUB_ADD,
  NH_PGQ_SUB_CONFLICT,
  NH_PGQ_SUBSCRIBERS,
  NH_PGQ_INSERT,
  NH_PGQ_HEADS,
  NH_PGQ_LOCK,
  NH_PGQ_UNLOCK,
  NH_PGQ_RENEW,
  NH_PGQ_DELIVERED,
  NH_PGQ_DELETE,
  NH_PGQ_DEAD,
  NH_PGQ_RELEASE_LOCK,
  NH_PGQ_RELEASED,
  NH_PGQ_OWNERS,
  NH_PGQ_ROW,
  NH_PGQ_DROP_OWNER,
  /* PostgreSQL's own */
  NH_PGQ_HEADS_AND_LOCK,   /* HEADS + LOCK + DELIVERED as one statement, safe for several hosts */
  NH_PGQ_SESSION_NEXT,     /* a locked session's next rows by query (see nh_pgqargs_session_next) */
  NH_PGQ_HELD,             /* 1 if `owner` holds the session's lease (expired or not), else 0 */
  NH_PGQ_UNLOCK_OWNED,     /* UNLOCK that fails its batch when the lease is not `owner`'s any more */
  NH_PGQ_NOTIFY,           /* wakes the hosts listening on NH_PGQ_CHANNEL: the endpoint has work */
  NH_PGQ_LEASE_KEY,        /* a session's lease key, the guard of the lease writes (nh_pg_opdef_t's guard) */
  /* the set twins of row operations (nh_pg_opdef_t's set): each parameter an array */
  NH_PGQ_INSERT_SET,
  NH_PGQ_DELETE_SET,
  NH_PGQ_UNLOCK_OWNED_SET,
  NH_PGQ_HELD_SET,
  NH_PGQ_LEASE_KEY_SET,
  NH_PGQ_COUNT
} nh_pgqop_t;

/* The queue's operations as a table of the executor (nh_pg_ops.h), NH_PGQ_COUNT of them. */
extern const nh_pg_optab_t nh_pgq_optab;

const char *nh_pgqop_name(nh_pgqop_t op);
const char *nh_pgqop_sql(nh_pgqop_t op);
int nh_pgqop_nparams(nh_pgqop_t op);

/* ---------------------------------------------------------------- arguments
 *
 * Each builder resets `a`, fills it as nh_embedded.c binds its twin (ids and names through
 * nh_pg_args_key, prose through nh_pg_args_text, bodies as bytea) and returns the
 * operation. Nothing is allocated unless a text is not UTF-8 (nh_pg_ops.h). */
nh_pgqop_t nh_pgqargs_sub_del(nh_pg_args_t *a, const char *endpoint);
nh_pgqop_t nh_pgqargs_sub_add(nh_pg_args_t *a, const char *event_type, const char *endpoint, int command);
/* Other endpoints consuming `event_type` when one of the two declares it a command. */
nh_pgqop_t nh_pgqargs_sub_conflict(nh_pg_args_t *a, const char *event_type, const char *endpoint, int command);
nh_pgqop_t nh_pgqargs_subscribers(nh_pg_args_t *a, const char *event_type);
/* One copy of m for `endpoint` with `event_id` (enqueued_at 0: now; visible at once).
 * Returns the row's seq (RETURNING seq: the transport will want it). */
nh_pgqop_t nh_pgqargs_insert(nh_pg_args_t *a, const nh_msg_t *m, const char *endpoint, const char *event_id);
/* The first `scan` rows of the endpoint's sessions not locked at `now`, in seq order
 * (the sqlite transport's scan: the caller keeps each session's first row). */
nh_pgqop_t nh_pgqargs_heads(nh_pg_args_t *a, const char *endpoint, int64_t now, int scan);
/* Up to `max` heads visible at `now` of sessions nobody holds (or whose lease expired by
 * `now`) and whose lease no other transaction is writing, each leased to `owner` until
 * `until` and counted as delivered, in seq order;
 * the scan reads as many rows as the sqlite transport's (max * 4 + 256). */
nh_pgqop_t nh_pgqargs_heads_and_lock(nh_pg_args_t *a, const char *endpoint, int64_t now, int max, const char *owner,
                                     int64_t until);
/* The session's lease for `owner` until `until`, if there is none or it expired by `now`
 * and no other transaction is writing it (its lease key is free: nh_pg_queue.c): one row
 * when taken, none when not free now. */
nh_pgqop_t nh_pgqargs_lock(nh_pg_args_t *a, const char *endpoint, const char *session, const char *owner,
                           int64_t until, int64_t now);
nh_pgqop_t nh_pgqargs_unlock(nh_pg_args_t *a, const char *endpoint, const char *session, const char *owner);
nh_pgqop_t nh_pgqargs_renew(nh_pg_args_t *a, const char *endpoint, const char *session, const char *owner,
                            int64_t until);
nh_pgqop_t nh_pgqargs_delivered(nh_pg_args_t *a, int64_t seq);
nh_pgqop_t nh_pgqargs_delete(nh_pg_args_t *a, int64_t seq);
nh_pgqop_t nh_pgqargs_dead(nh_pg_args_t *a, int64_t seq, const char *reason, int64_t at);
/* A release with a delay: the session held (no owner) until `until`, if `owner` holds it. */
nh_pgqop_t nh_pgqargs_release_lock(nh_pg_args_t *a, const char *endpoint, const char *session, int64_t until,
                                   const char *owner);
nh_pgqop_t nh_pgqargs_released(nh_pg_args_t *a, int64_t seq);
nh_pgqop_t nh_pgqargs_owners(nh_pg_args_t *a);
nh_pgqop_t nh_pgqargs_row(nh_pg_args_t *a, int64_t seq, const char *endpoint, const char *session);
nh_pgqop_t nh_pgqargs_drop_owner(nh_pg_args_t *a, const char *owner);
/* Up to `max` rows of the session after `after_seq`, in seq order; the caller stops at the
 * first not visible yet (nh_pgq_visible). sqlite takes these from the last head scan,
 * since an index on (endpoint, session_id, seq) halved its write rate; this reads the
 * endpoint's rows after `after_seq` by queue_endpoint, filtered by session. */
nh_pgqop_t nh_pgqargs_session_next(nh_pg_args_t *a, const char *endpoint, const char *session, int64_t after_seq,
                                   int max);

/* Whether `owner` holds the session's lease (one row: its count, 0 or 1). */
nh_pgqop_t nh_pgqargs_held(nh_pg_args_t *a, const char *endpoint, const char *session, const char *owner);
/* The lease's end with an outcome: deletes it, and fails the whole batch (naming the
 * session) if `owner` does not hold it any more, so an outcome is never recorded for a
 * session another host has taken over (the lease expired while this host was cut off). */
nh_pgqop_t nh_pgqargs_unlock_owned(nh_pg_args_t *a, const char *endpoint, const char *session, const char *owner);
/* NOTIFY NH_PGQ_CHANNEL with the endpoint as payload (sent at the commit, as NOTIFY is). */
#define NH_PGQ_CHANNEL "nimbus_queue"
nh_pgqop_t nh_pgqargs_notify(nh_pg_args_t *a, const char *endpoint);

/* ---------------------------------------------------------------- readers */

/* A row of HEADS, HEADS_AND_LOCK, ROW or SESSION_NEXT into m (owned strings, nh_msg_clear),
 * as nh_embedded.c's read_row: delivery_count counts the delivery being made. */
void nh_pgq_row(const PGresult *r, int row, const char *endpoint, nh_msg_t *m);
/* 1 if the row is visible at `now` (its visible_at has come). */
int nh_pgq_visible(const PGresult *r, int row, int64_t now);

/* ---------------------------------------------------------------- executor */

/* nh_pg_db_run and nh_pg_batch_add_op for the queue's operations (nh_pg_ops.h): one
 * operation blocking, or added to a batch that may hold the store's operations too; cb
 * (may be NULL) gets the result once the batch has committed, with tab &nh_pgq_optab. */
int nh_pgq_run(nh_pg_db_t *db, nh_pgqop_t op, nh_pg_args_t *args, PGresult **res, nh_error_t *err);
int nh_pgq_batch_add(nh_pg_db_t *db, nh_pgqop_t op, nh_pg_args_t *args, nh_pg_result_cb cb, void *data,
                     nh_error_t *err);
/* m queued for `endpoint` as event `event_id`, and the hosts listening woken at the commit
 * (INSERT and NOTIFY added to the batch). */
int nh_pgq_batch_add_copy(nh_pg_db_t *db, const nh_msg_t *m, const char *endpoint, const char *event_id,
                          nh_error_t *err);

#endif
