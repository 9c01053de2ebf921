/* The sqlite store: the single source of truth for session state, parked messages,
 * the audit projection, message history, the inbox and the operator action log.
 * All statements are prepared once; callers group writes in transactions
 * (nh_store_begin/commit) because one fsync per message would cap throughput. */
#ifndef NH_STORE_H
#define NH_STORE_H

#include <sqlite3.h>
#include <stdint.h>

#include "core/nh_error.h"
#include "core/nh_msg.h"

typedef struct nh_store nh_store_t;

/* Audit statuses (the projection's `status` column, spelled as in events --json). */
#define NH_ST_COMPLETED "Completed"
#define NH_ST_FAILED "Failed"
#define NH_ST_PENDING "Pending"
#define NH_ST_DEFERRED "Deferred"
#define NH_ST_DEADLETTERED "DeadLettered"
#define NH_ST_UNSUPPORTED "Unsupported"
#define NH_ST_SKIPPED "Skipped"
#define NH_SUB_RETRYING "Retrying"   /* Pending after a transient failure, its next attempt scheduled */

typedef struct nh_audit {
  char *endpoint, *event_id, *session_id, *event_type;
  char *status, *sub_status;
  char *error_text, *error_type;
  char *handoff_reason, *external_job_id;
  int64_t expected_by;            /* ms since epoch, 0 = none */
  char *message_id, *correlation_id, *originating_message_id;
  int retry_count;
  int attempts;                   /* transient failures in a row (Pending+Retrying, or the Failed they ended in) */
  char *payload;                  /* latest event JSON */
  size_t payload_len;             /* its bytes (it may hold a NUL); 0 with a payload: strlen, see nh_audit_payload_len */
  char *result;                   /* hand-off result JSON */
  char *error_stack;              /* Lua traceback of a failure */
  int64_t created_at, updated_at;
  int64_t queue_time_ms;          /* the latest handler run: enqueue to its start; -1: none */
  int64_t processing_time_ms;     /* the latest handler run's duration; -1: none */
  int64_t overdue_at;             /* a hand-off flagged overdue at (ms); 0: not */
  char *traceparent;              /* the W3C trace context it arrived with */
  char *replaced_payload;         /* not stored in audit: the payload a new body replaced (history keeps it) */
} nh_audit_t;

typedef struct nh_session_state {
  int exists;
  char *blocked_by;               /* EventId owning the block, NULL if free */
  int draining;                   /* parked messages replay before new arrivals */
  int64_t retry_due;              /* ms since epoch, 0 = no retry scheduled */
  int64_t next_park_seq;
} nh_session_state_t;

typedef enum { NH_STORE_CREATE = 1, NH_STORE_READONLY = 2 } nh_store_flags_t;

/* `path`: a sqlite file; a postgresql:// URL is reached and migrated, then refused for now
 * (nh_store_open_pg, docs/store-backends.md). */
int nh_store_open(nh_store_t **out, const char *path, int flags, nh_error_t *err);
int nh_store_open_pg(const char *url, int flags, nh_error_t *err);
/* A PostgreSQL store for a host or a command: the URL checked, a blocking connection made
 * and the schema migrated (NH_STORE_READONLY: its version only read, and a database with
 * no store yet refused), every problem said as nh_store_open says it; *out is the
 * connection, the caller's. */
struct pg_conn;
int nh_store_pg_connect(const char *url, int flags, struct pg_conn **out, int *from, int *to, nh_error_t *err);
void nh_store_close(nh_store_t *s);
sqlite3 *nh_store_db(nh_store_t *s);
const char *nh_store_path(nh_store_t *s);

/* Told after every begin, commit and rollback of a store transaction. A broker
 * transport cannot join the sqlite transaction, so it holds the dispositions and sends
 * it is asked for until the transaction that recorded their effects has committed. */
typedef enum {
  NH_TXN_BEGIN, NH_TXN_COMMIT, NH_TXN_ROLLBACK,
  NH_TXN_SAVEPOINT, NH_TXN_SAVEPOINT_END, NH_TXN_SAVEPOINT_ROLLBACK   /* one job's savepoint (not nested) */
} nh_txn_phase_t;
typedef void (*nh_store_txn_cb)(void *data, nh_txn_phase_t phase);
void nh_store_set_txn_hook(nh_store_t *s, nh_store_txn_cb cb, void *data);

/* BEGIN IMMEDIATE: take the write lock up front so a busy peer is waited for here
 * (busy timeout) rather than failing half-way through a batch. */
int nh_store_begin(nh_store_t *s);
/* Refuses (rolls back, returns NH_EFAIL) if any statement failed in the transaction. */
int nh_store_commit(nh_store_t *s);
void nh_store_rollback(nh_store_t *s);
/* Per-job savepoints inside a batch: one job's failure undoes only that job. */
int nh_store_savepoint(nh_store_t *s);
/* Releases the savepoint, or rolls back to it if a statement failed since; returns
 * NH_EFAIL in that case (the job's effects are gone). */
int nh_store_savepoint_end(nh_store_t *s);
void nh_store_savepoint_rollback(nh_store_t *s);
int nh_store_failed(nh_store_t *s);
int nh_store_in_tx(nh_store_t *s);
/* The last error said for an operator: the cause (disk full, read-only, I/O error,
 * permissions, damage) and what to do, into err; returns err->msg. */
const char *nh_store_explain(nh_store_t *s, const char *doing, nh_error_t *err);
const char *nh_store_errmsg(nh_store_t *s);
/* Copies WAL frames back into the database without waiting for readers. Called when
 * the host goes idle so the automatic checkpoint rarely lands inside a busy batch. */
void nh_store_checkpoint(nh_store_t *s);

/* Told after every commit how many pages the WAL holds; replaces sqlite's automatic
 * checkpoint, so the callback must see that one happens (NULL: sqlite's own again). */
typedef void (*nh_store_wal_cb)(void *data, int wal_pages);
/* Pages of WAL after which a connection without such a hook checkpoints in its commit. */
#define NH_STORE_WAL_AUTOCHECKPOINT 10000
void nh_store_set_wal_hook(nh_store_t *s, nh_store_wal_cb cb, void *data);
/* A PASSIVE checkpoint of the store file at `path` through a connection of its own, so
 * it may run on another thread; NH_OK also when another process is checkpointing. With
 * `conn`, that connection is opened at the first call and kept in *conn for the next
 * (opening one reads the whole schema: a few percent of a busy host's CPU when it
 * checkpoints often); close it with nh_store_checkpoint_conn_close. NULL: one per call. */
int nh_store_checkpoint_file(const char *path, sqlite3 **conn, int *wal_pages, int *copied, nh_error_t *err);
void nh_store_checkpoint_conn_close(sqlite3 *conn);

/* audit projection: one row per (endpoint, event_id) */
int nh_store_audit_put(nh_store_t *s, const nh_audit_t *a);
int nh_store_audit_get(nh_store_t *s, const char *endpoint, const char *event_id, nh_audit_t *out);
/* By event id (or a unique prefix of at least 8 characters) across endpoints. */
int nh_store_audit_find(nh_store_t *s, const char *event_id, nh_audit_t *out, nh_error_t *err);
void nh_audit_clear(nh_audit_t *a);
/* The payload's length in bytes: payload_len, or strlen for one built as a C string. */
size_t nh_audit_payload_len(const nh_audit_t *a);
/* Pending hand-offs whose expected_by is before `now` and not flagged yet, earliest first
 * (the partial index audit_handoff_due); cb returns non-zero to stop. */
typedef int (*nh_audit_cb)(void *data, const nh_audit_t *a);
int nh_store_handoffs_due(nh_store_t *s, int64_t now, int limit, nh_audit_cb cb, void *data);
/* Flags one overdue (1), or 0 when another host did first. */
int nh_store_handoff_flag_overdue(nh_store_t *s, const char *endpoint, const char *event_id, int64_t at);
/* A pending hand-off flagged overdue (its expected_by passed). */
int nh_audit_overdue(const nh_audit_t *a);
/* Failed or DeadLettered: the statuses that carry a failure group and that an operator
 * resolves (resubmit, skip). */
int nh_audit_unresolved_failure(const char *status);
/* Pending+Retrying: a transient failure waiting for its next attempt. */
int nh_audit_retrying(const nh_audit_t *a);
/* Rewrites the reason on a session's Deferred rows (the blocker changed during a replay). */
int nh_store_audit_retext_deferred(nh_store_t *s, const char *endpoint, const char *session, const char *text);
typedef int (*nh_audit_cb)(void *data, const nh_audit_t *a);
/* Every audit status, as stored, NULL-terminated. */
extern const char *const nh_store_statuses[];
/* The audit status spelled as stored ("failed" -> "Failed"), or NULL if it is none. */
const char *nh_store_status_canon(const char *status);
/* Compatibility wrapper over nh_store_events: status matched case-insensitively. */
int nh_store_audit_list(nh_store_t *s, const char *endpoint, const char *status,
                        const char *session, nh_audit_cb cb, void *data);

/* ---- operator queries (nh_store_query.c): built per call from the filters given, so
 * each runs on the index of its most selective filter (status, session or group). */
typedef struct nh_event_filter {
  const char *endpoint, *status, *session, *type;
  /* Several statuses or types (either one: status/type, or these lists, NULL-terminated) */
  const char *status_in[8], *type_in[8];
  const char *event_id;           /* one event id (exact) */
  const char *payload;            /* substring of the stored payload (case-sensitive; reads the rows) */
  const char *error;              /* substring of error_text, case-insensitive */
  const char *group;              /* failure group id (nh_failgroup_id) */
  int64_t since_ms, before_ms;    /* updated_at range, 0 = open */
  int64_t cutoff_ms;              /* bulk snapshot: unchanged since (updated_at <= cutoff), 0 = none */
  int without_request;            /* leave out events with an operator request waiting */
  const char *not_status[4];      /* leave out these statuses (what a bulk action cannot apply to) */
  int need_payload;               /* only events with a stored payload (resubmit without a body) */
  int limit;                      /* 0: all, oldest first; N: the newest N, still oldest first */
  /* Bulk batches: rows in insert order (rowid), after after_rowid, at most `batch`. The
   * order of a session's events, and with a group and its endpoint the order of the
   * group's index, so a batch reads its own rows only (created_at order sorted every
   * matching row again for each batch: 94 ms a batch in a group of 100,000). */
  int batch;
  int64_t after_rowid;
  int desc;                       /* batch newest first: rows before after_rowid (0: from the newest) */
  int page;                       /* the batch is a reader's page (the API's lists), not a bulk batch */
  int64_t rowid_from, rowid_to;   /* rowid in (from, to], when to is set (the page planner's probe) */
} nh_event_filter_t;
/* Calls cb per row in (created_at, rowid) order, or rowid order for a batch; a non-zero
 * return stops. Returns the number of rows passed to cb, or NH_EFAIL. `last_rowid`
 * (optional) gets the rowid of the last row passed (keyset paging). */
int nh_store_events(nh_store_t *s, const nh_event_filter_t *f, nh_audit_cb cb, void *data, int64_t *last_rowid);
int64_t nh_store_events_count(nh_store_t *s, const nh_event_filter_t *f);
/* "%sub%" as a LIKE pattern with ESCAPE '\': %, _ and backslash in sub taken literally; the
 * caller frees. */
char *nh_store_like_pattern(const char *sub);
/* 1 if the row satisfies every filter (for rows read some other way: events --follow). */
int nh_event_filter_match(const nh_event_filter_t *f, const nh_audit_t *a);
/* Every endpoint with audit rows (an index skip-scan, not a table scan). */
int nh_store_endpoints(nh_store_t *s, int (*cb)(void *data, const char *endpoint), void *data);
/* History rows after `after_id`, oldest first, at most `limit`: the endpoint and event of
 * each, for following changes as they happen. Returns the count; *last gets the last id. */
int nh_store_history_after(nh_store_t *s, int64_t after_id, int limit,
                           int (*cb)(void *data, const char *endpoint, const char *event_id), void *data,
                           int64_t *last);
int64_t nh_store_history_last_id(nh_store_t *s);
/* The SQL nh_store_events would run for f (for the query-plan test); caller frees. */
char *nh_store_events_sql(const nh_event_filter_t *f, int count);

typedef struct nh_failgroup_row {
  const char *group, *endpoint, *error_type, *sample_event_id, *sample_text;
  int64_t count, first_ms, last_ms;   /* first: the oldest event's creation; last: the latest failure */
} nh_failgroup_row_t;
typedef int (*nh_failgroup_cb)(void *data, const nh_failgroup_row_t *g);
/* Failure groups of unresolved events (Failed, DeadLettered), largest first. */
int nh_store_failgroups(nh_store_t *s, const char *endpoint, nh_failgroup_cb cb, void *data);
/* 1 if any unresolved event belongs to the group (its endpoint, one per group, copied to
 * `endpoint` if not NULL), 0 if none, NH_EFAIL. */
int nh_store_failgroup_endpoint(nh_store_t *s, const char *group, char *endpoint, size_t len);

/* Retention: deletes, in one call and at most `max_rows` audit rows, resolved events
 * (Completed, Skipped, Unsupported) last changed before `resolved_before` with their
 * history, `processed` entries older than that, and inbox entries older than
 * `inbox_before` (0: keep). Never an unresolved event (Failed, Pending, Deferred,
 * DeadLettered) or one with an operator request waiting. Runs in the caller's
 * transaction. Returns the number of rows deleted (0: nothing left), or NH_EFAIL. */
typedef struct nh_purge_counts {
  int64_t events, history, inbox, processed;
} nh_purge_counts_t;
int nh_store_purge(nh_store_t *s, int64_t resolved_before, int64_t inbox_before, int max_rows,
                   nh_purge_counts_t *counts);
/* What nh_store_purge would delete in all (audit rows and inbox entries). */
int nh_store_purge_count(nh_store_t *s, int64_t resolved_before, int64_t inbox_before, nh_purge_counts_t *counts);
/* Gives freed pages back to the file system (stores created with incremental vacuum),
 * at most `pages` per call; a no-op on older stores, whose freed pages are reused. */
void nh_store_vacuum_step(nh_store_t *s, int pages);

/* Idempotent publishing: a publish whose caller chose the MessageId (publish
 * --message-id, nimbus.publish{message_id = ...}) claims it in the open transaction.
 * 1: first time (publish it), 0: already published since `since` (*at gets when; do not
 * publish again), NH_EFAIL. Older claims are replaced (the window has passed). */
#define NH_DEDUP_WINDOW_MS (24LL * 3600 * 1000)
int nh_store_published_claim(nh_store_t *s, const char *message_id, int64_t now, int64_t since, int64_t *at);
/* Whether a MessageId last published at `at` (0: never) is still within the window. */
static inline int nh_published_recently(int64_t at, int64_t now) { return at > 0 && at >= now - NH_DEDUP_WINDOW_MS; }
/* 1 if published since `since` (*at gets when), 0 if not, NH_EFAIL; claims nothing. */
int nh_store_published_seen(nh_store_t *s, const char *message_id, int64_t since, int64_t *at);

/* Running hosts (`hosts`): each host writes its row at start with its endpoints as
 * ",A,B,", refreshes seen_at while it runs and deletes it at stop, so an operator
 * command can tell that no host serves an endpoint (its requests then wait). */
int nh_store_host_put(nh_store_t *s, const char *owner, const char *endpoints_csv, int64_t started_at, int64_t now);
int nh_store_host_del(nh_store_t *s, const char *owner);
/* Hosts serving `endpoint` seen since `since` whose process is not known dead. */
int nh_store_hosts_serving(nh_store_t *s, const char *endpoint, int64_t since);

/* Bulk operator runs (resubmit --all, skip --all): a run keeps the snapshot time it
 * started with, so running an interrupted command again picks up the rest and never
 * applies anything twice. */
typedef struct nh_bulk_run {
  int64_t cutoff_ms, started_ms, queued;
  char *owner;                    /* "host:pid:bulk" of the process that started it */
} nh_bulk_run_t;
int nh_store_bulk_get(nh_store_t *s, const char *key, nh_bulk_run_t *out);   /* 1 found, 0 not, NH_EFAIL */
int nh_store_bulk_put(nh_store_t *s, const char *key, const nh_bulk_run_t *run);
int nh_store_bulk_done(nh_store_t *s, const char *key);

/* message history: append-only */
int nh_store_history_add(nh_store_t *s, const char *endpoint, const char *event_id,
                         const char *message_id, const char *message_type, const char *status,
                         const char *detail);
/* What an attempt leaves besides its status: the error of a failed one, and the payload
 * a resubmit with a new body replaced (so every body the event ran with is kept). */
typedef struct nh_history_extra {
  const char *error_text, *error_type, *error_stack, *previous_payload;
} nh_history_extra_t;
int nh_store_history_add_ex(nh_store_t *s, const char *endpoint, const char *event_id, const char *message_id,
                            const char *message_type, const char *status, const char *detail,
                            const nh_history_extra_t *x);
typedef struct nh_history_row {
  int64_t at;
  const char *message_id, *message_type, *status, *detail;
  const char *error_text, *error_type, *error_stack, *previous_payload;
} nh_history_row_t;
typedef int (*nh_history_cb)(void *data, const nh_history_row_t *row);
int nh_store_history_list(nh_store_t *s, const char *endpoint, const char *event_id, nh_history_cb cb,
                          void *data);

/* session state */
int nh_store_session_get(nh_store_t *s, const char *endpoint, const char *session, nh_session_state_t *st);
int nh_store_session_put(nh_store_t *s, const char *endpoint, const char *session, const nh_session_state_t *st);
void nh_session_state_clear(nh_session_state_t *st);
/* Sessions with work that is not in the queue: a due retry or parked messages to replay. */
typedef int (*nh_session_cb)(void *data, const char *endpoint, const char *session, const nh_session_state_t *st);
/* Due retries first (earliest first), then draining sessions from *cursor on (the last
 * session returned is stored back; NULL cursor: from the start). Returns the count. */
int nh_store_sessions_due(nh_store_t *s, const char *endpoint, int64_t now, int limit, char **cursor,
                          nh_session_cb cb, void *data);
int nh_store_sessions_list(nh_store_t *s, const char *endpoint, int blocked_only, nh_session_cb cb,
                           void *data);

/* parked messages (per session FIFO by park_seq) */
int nh_store_park(nh_store_t *s, const nh_msg_t *m, int64_t park_seq);
int nh_store_parked_head(nh_store_t *s, const char *endpoint, const char *session, nh_msg_t *out,
                         int64_t *park_seq);
int nh_store_parked_delete(nh_store_t *s, const char *endpoint, const char *session, int64_t park_seq);
int nh_store_parked_delete_event(nh_store_t *s, const char *endpoint, const char *event_id);
int nh_store_parked_count(nh_store_t *s, const char *endpoint, const char *session);
/* 1 if the session has anything parked (reads one index entry, not the whole queue). */
int nh_store_parked_any(nh_store_t *s, const char *endpoint, const char *session);
/* The session's parked rows after park_seq `after`, in order: up to limit into out[]
 * (owned, nh_msg_clear) and park_seqs[]; returns how many, or NH_EFAIL. */
int nh_store_parked_window(nh_store_t *s, const char *endpoint, const char *session, int64_t after, int limit,
                           nh_msg_t *out, int64_t *park_seqs);
/* How many rows of the event are parked (what nh_store_parked_delete_event would remove). */
int nh_store_parked_count_event(nh_store_t *s, const char *endpoint, const char *event_id);

/* inbox: (endpoint, message_id) pairs already handled successfully */
int nh_store_inbox_has(nh_store_t *s, const char *endpoint, const char *message_id);
int nh_store_inbox_add(nh_store_t *s, const char *endpoint, const char *message_id);

/* Lets a transport whose settlement is not atomic with the store (AMQP) recognise a
 * redelivery whose outcome was already committed: 1 if the event has a history row from
 * this message that records an outcome (not an operator's request, not a cancelled run).
 * Every path that settles a delivery writes one in the same transaction, so no row of its
 * own is needed per message (the `processed` table of schema 1 is no longer written; its
 * old rows go with retention). */
int nh_store_processed_has(nh_store_t *s, const char *endpoint, const char *message_id, const char *event_id);

/* operator requests queued and not yet applied: one at a time per event */
/* expected_status: the event's status when the request was made; the host rejects the
 * request if the event has moved on since (a retry completed it meanwhile, say). */
int nh_store_oppending_add(nh_store_t *s, const char *message_id, const char *endpoint, const char *event_id,
                           const char *action, const char *expected_status);
int nh_store_oppending_has(nh_store_t *s, const char *endpoint, const char *event_id);
/* Removes the request; 1 and *expected_status (caller frees) if it was there, 0 if not. */
int nh_store_oppending_take(nh_store_t *s, const char *message_id, char **expected_status);
/* The request's expected status, the request left in place: 1 found, 0 none, NH_EFAIL. */
int nh_store_oppending_get(nh_store_t *s, const char *message_id, char **expected_status);

/* operator action log; actor: who did it ("cli (alice)", "admin API (token ops-1)"); NULL:
 * the operating-system user */
int nh_store_oplog_add(nh_store_t *s, const char *actor, const char *action, const char *endpoint,
                       const char *event_id, const char *session, const char *detail);

/* ---- the operator console's reads (nh_store_console.c) */
typedef struct nh_endpoint_stats {
  int64_t blocked_sessions, handoffs_pending, handoffs_overdue;
} nh_endpoint_stats_t;
int nh_store_endpoint_stats(nh_store_t *s, const char *endpoint, int64_t now, nh_endpoint_stats_t *out);
/* Bytes of the store file and its WAL (0 when absent). */
void nh_store_file_sizes(nh_store_t *s, int64_t *db, int64_t *wal);
/* Parked rows of an endpoint (the metrics' starting figure; a range of the primary key). */
int64_t nh_store_endpoint_parked(nh_store_t *s, const char *endpoint);

typedef struct nh_blocked_row {
  const char *endpoint, *session_id, *blocked_by;
  int64_t retry_due;                     /* 0: no retry scheduled */
  const char *status, *sub_status, *event_type, *error_text, *handoff_reason;   /* the blocker's */
  int64_t since;                         /* the blocker's last change */
  int64_t parked;                        /* messages parked behind it */
} nh_blocked_row_t;
typedef int (*nh_blocked_cb)(void *data, const nh_blocked_row_t *r);
/* Blocked sessions in (endpoint, session) order after the given key (NULL: from the
 * start), at most `limit`. Returns the count passed to cb, or NH_EFAIL. */
int nh_store_blocked_sessions(nh_store_t *s, const char *endpoint, const char *after_endpoint,
                              const char *after_session, int limit, nh_blocked_cb cb, void *data);

typedef struct nh_oplog_row {
  int64_t at;
  const char *actor, *action, *detail;
} nh_oplog_row_t;
typedef int (*nh_oplog_cb)(void *data, const nh_oplog_row_t *r);
int nh_store_oplog_list(nh_store_t *s, const char *endpoint, const char *event_id, nh_oplog_cb cb, void *data);

#endif
