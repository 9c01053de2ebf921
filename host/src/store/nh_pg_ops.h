/* The PostgreSQL store's row operations: every row statement of the sqlite store
 * (nh_store.c, nh_store_rows.c, nh_store_query.c) in PostgreSQL's dialect, the argument
 * builders that fill a statement's parameters from the structs of nh_store.h, the readers
 * that turn a result row back into them, and the executor that runs them (nh_pg_exec.c):
 * one statement at a time, or many as one pipeline inside BEGIN ... COMMIT. nh_pg_rows.c
 * builds the blocking nh_pgs_* twins of the nh_store_* row functions on top.
 *
 * Each operation means exactly what its sqlite twin means (docs/store-backends.md):
 * host/tests/test_pg_rows.c runs the same sequences on both stores and compares what
 * they read back. Every result is asked for in binary format: bytea bodies arrive as
 * their bytes (no unescaping, a NUL kept) and bigints as 8 bytes. */
#ifndef NH_PG_OPS_H
#define NH_PG_OPS_H

#include <libpq-fe.h>
#include <stdint.h>

#include "core/nh_error.h"
#include "core/nh_failgroup.h"
#include "nh_store.h"

/* One prepared statement each. Where a store function runs more than one statement, or
 * picks one by its arguments, each is its own operation (SESSION_DEL: a free session is
 * a deleted row; AUDIT_FIND_PREFIX after AUDIT_FIND; PUBLISHED_SEEN after a claim that
 * lost a race). */
typedef enum nh_pgop {
  NH_PGOP_AUDIT_PUT,
  NH_PGOP_AUDIT_GET,
  NH_PGOP_AUDIT_FIND,
  NH_PGOP_AUDIT_FIND_PREFIX,
  NH_PGOP_AUDIT_FIND_PREFIX_OPEN,   /* a prefix with no string above its range (see nh_pgargs_audit_find_prefix) */
  NH_PGOP_AUDIT_RETEXT,
  NH_PGOP_HANDOFFS_DUE,
  NH_PGOP_HANDOFF_FLAG_OVERDUE,
  NH_PGOP_HISTORY_ADD,
  NH_PGOP_HISTORY_LIST,
  NH_PGOP_SESSION_GET,
  NH_PGOP_SESSION_PUT,
  NH_PGOP_SESSION_DEL,
  NH_PGOP_SESSIONS_RETRY_DUE,
  NH_PGOP_SESSIONS_DRAINING,
  NH_PGOP_SESSIONS_LIST,
  NH_PGOP_SESSIONS_LIST_ENDPOINT,
  NH_PGOP_PARK,
  NH_PGOP_PARKED_HEAD,
  NH_PGOP_PARKED_DEL,
  NH_PGOP_PARKED_DEL_EVENT,
  NH_PGOP_PARKED_COUNT,
  NH_PGOP_PARKED_ANY,
  NH_PGOP_INBOX_HAS,
  NH_PGOP_INBOX_ADD,
  NH_PGOP_PROCESSED_HAS,
  NH_PGOP_OPPENDING_ADD,
  NH_PGOP_OPPENDING_HAS,
  NH_PGOP_OPPENDING_TAKE,
  NH_PGOP_OPLOG_ADD,
  NH_PGOP_PUBLISHED_SEEN,
  NH_PGOP_PUBLISHED_CLAIM,
  NH_PGOP_HOST_PUT,
  NH_PGOP_HOST_DEL,
  NH_PGOP_HOSTS_SERVING,
  NH_PGOP_BULK_GET,
  NH_PGOP_BULK_PUT,
  NH_PGOP_BULK_DONE,
  /* reads only the unit of work makes (nh_uow_pg.c): no sqlite twin of their own */
  NH_PGOP_PARKED_WINDOW,       /* a session's parked rows after a park_seq, in order, up to a limit */
  NH_PGOP_PARKED_COUNT_EVENT,  /* how many rows of an event are parked (what PARKED_DEL_EVENT would remove) */
  NH_PGOP_OPPENDING_GET,       /* an operator request's expected status, not removed (OPPENDING_TAKE is the write) */
  /* a status checker's list (dispatch/nh_pgcalls.c) */
  NH_PGOP_HANDOFFS_PENDING,    /* an endpoint's Pending+Handoff events, oldest first */
  NH_PGOP_PUBLISHED_CLAIM_OR_FAIL,   /* PUBLISHED_CLAIM that fails its transaction when the id is taken */
  /* the overdue scan (dispatch/nh_overdue.c) */
  NH_PGOP_HANDOFF_OVERDUE_MARK,      /* HANDOFF_FLAG_OVERDUE and its history row, one statement: a row back if flagged */
  /* retention (dispatch/nh_retention.c) and `purge` (nh_pg_purge.c): nh_store_purge's
   * deletes, each one statement answering (rows deleted[, history rows deleted]) */
  NH_PGOP_PURGE_RESOLVED,
  NH_PGOP_PURGE_PROCESSED,
  NH_PGOP_PURGE_PUBLISHED,
  NH_PGOP_PURGE_INBOX,
  NH_PGOP_PURGE_COUNT,         /* purge --dry-run: (events, inbox entries) PURGE_RESOLVED and PURGE_INBOX would take */
  /* the store-wide gauges (dispatch/nh_gauges_pg.c): an endpoint's (blocked sessions,
   * pending hand-offs, parked events), nh_store_endpoint_stats and _parked in one row */
  NH_PGOP_ENDPOINT_GAUGES,
  /* the set twins of row operations (nh_pg_opdef_t's set): each parameter an array */
  NH_PGOP_AUDIT_PUT_SET,
  NH_PGOP_HISTORY_ADD_SET,
  NH_PGOP_SESSION_GET_SET,
  NH_PGOP_COUNT
} nh_pgop_t;

/* The prepared statement's name ("nh_audit_put"), its SQL and its parameter count. */
const char *nh_pgop_name(nh_pgop_t op);
const char *nh_pgop_sql(nh_pgop_t op);
int nh_pgop_nparams(nh_pgop_t op);

/* An operation table: the statements one module defines, indexed by its own enum (the
 * store's nh_pgop_t here; the embedded queue's nh_pgqop_t, nh_pg_queue.h). The executor
 * runs the operations of any table, in the same batches if need be (a pump settles queue
 * rows and writes store rows in one transaction), and prepares each once per connection. */
typedef struct nh_pg_opdef {
  const char *name;   /* the prepared statement's name, unique over every table */
  const char *sql;
  int nparams;
  /* A row operation a commit may send for many rows as one statement (nh_pg_set.h):
   * `set` is its twin in the same table, which takes as parameter i the array of every
   * row's parameter i, and `types` (on the twin) each array's elements: 't' text (numbers
   * too, cast in its SQL), 'b' bytea. `rel` is the table the row operation writes: rows
   * of one table whose first `key` parameters repeat (an upsert's key, a guarded delete's)
   * do not go in one statement. 0: none, the operation is sent row by row. */
  int set;
  const char *types;
  const char *rel;
  int key;
  /* An operation of the same table that takes a lock this one's row needs first, given
   * this one's first parameters (its nparams of them), with a set twin: a batch builder
   * that knows its whole list (a commit, a transport's batch outside a pump) sends every
   * guard of it before its first statement, as one set statement that takes them in one
   * order (nh_pg_sets_add_guard). 0: none. The queue's lease ends and renewals take their
   * session's lease key so (nh_pg_queue.c, "Lease keys"). */
  int guard;
} nh_pg_opdef_t;

typedef struct nh_pg_optab {
  const char *what;            /* who reports a misuse: "store", "queue" */
  size_t prefix;               /* the names' common prefix ("nh_"), dropped in messages */
  const nh_pg_opdef_t *ops;
  int count;
} nh_pg_optab_t;

/* The store's operations, NH_PGOP_COUNT of them. */
extern const nh_pg_optab_t nh_pg_store_optab;

/* ---------------------------------------------------------------- arguments */

#define NH_PG_MAX_ARGS 25   /* audit put's */

/* A statement's parameters, in the arrays PQsendQueryPrepared takes. Strings are
 * borrowed (they must outlive the call that sends them, nothing longer: libpq copies
 * them into its output buffer); numbers are formatted into the struct's own buffers.
 * Text goes in text format, bytea in binary (its bytes as they are, with their length).
 * Text that is not UTF-8, which PostgreSQL refuses, goes as a cleaned copy (nh_pg_args_text,
 * nh_pg_args_key) the args own until nh_pg_db_run or nh_pg_batch_add has taken them (they
 * release them, sent or not); args built and never sent are released with
 * nh_pg_args_release. Valid text is sent from the caller's pointer, with no copy. */
typedef struct nh_pg_args {
  int n;
  const char *values[NH_PG_MAX_ARGS];
  int lengths[NH_PG_MAX_ARGS];
  int formats[NH_PG_MAX_ARGS];
  char num[NH_PG_MAX_ARGS][24];
  char group[NH_FAILGROUP_ID_LEN + 1];   /* audit put: the failure group it computes */
  char bound[8];                         /* a prefix find: the character that ends its range */
  char *owned[NH_PG_MAX_ARGS];     /* cleaned copies of text that was not UTF-8 */
  int nowned;
} nh_pg_args_t;

void nh_pg_args_reset(nh_pg_args_t *a);
void nh_pg_args_release(nh_pg_args_t *a);   /* frees its cleaned copies (the send calls do it) */
/* Prose (an error text, a detail): each byte that does not start a well-formed UTF-8
 * sequence is sent as U+FFFD, the rest as it is. NULL: SQL NULL. */
void nh_pg_args_text(nh_pg_args_t *a, const char *s);
/* An id or name the store compares (an endpoint, a message id): each such byte is sent
 * as the four characters \xFF (its value in hex), so that ids differing only there stay
 * apart; the reads escape their keys alike and find what was written (nh_pg_ops.c). */
void nh_pg_args_key(nh_pg_args_t *a, const char *s);
void nh_pg_args_bytes(nh_pg_args_t *a, const char *p, size_t len);    /* bytea; NULL p: SQL NULL */
void nh_pg_args_i64(nh_pg_args_t *a, int64_t v);
void nh_pg_args_null(nh_pg_args_t *a);

/* One builder per operation: resets `a`, fills it from the store's structs as the sqlite
 * twin binds them (its defaults too: updated_at 0 is now, a NULL actor the OS user) and
 * returns the operation to run with it. */
nh_pgop_t nh_pgargs_audit_put(nh_pg_args_t *a, const nh_audit_t *au);
nh_pgop_t nh_pgargs_audit_get(nh_pg_args_t *a, const char *endpoint, const char *event_id);
nh_pgop_t nh_pgargs_audit_find(nh_pg_args_t *a, const char *event_id);
/* Ids starting with `prefix` (escaped as a key, if it is not UTF-8): the
 * range [prefix, upper) of byte order (text is COLLATE "C"), whose upper end is the prefix
 * up to its last character below U+10FFFF, that character incremented; an index range
 * on a generic plan, where starts_with() or LIKE would not be. */
nh_pgop_t nh_pgargs_audit_find_prefix(nh_pg_args_t *a, const char *prefix);
nh_pgop_t nh_pgargs_audit_retext(nh_pg_args_t *a, const char *endpoint, const char *session, const char *text);
nh_pgop_t nh_pgargs_handoffs_due(nh_pg_args_t *a, int64_t now, int limit);
nh_pgop_t nh_pgargs_handoff_flag_overdue(nh_pg_args_t *a, const char *endpoint, const char *event_id, int64_t at);
nh_pgop_t nh_pgargs_history_add(nh_pg_args_t *a, const char *endpoint, const char *event_id, const char *message_id,
                                const char *message_type, const char *status, const char *detail,
                                const nh_history_extra_t *x);
nh_pgop_t nh_pgargs_history_list(nh_pg_args_t *a, const char *endpoint, const char *event_id);
nh_pgop_t nh_pgargs_session_get(nh_pg_args_t *a, const char *endpoint, const char *session);
/* SESSION_DEL for a free session (not blocked, not draining, no retry due), else SESSION_PUT. */
nh_pgop_t nh_pgargs_session_put(nh_pg_args_t *a, const char *endpoint, const char *session,
                                const nh_session_state_t *st);
nh_pgop_t nh_pgargs_sessions_retry_due(nh_pg_args_t *a, const char *endpoint, int64_t now, int limit);
nh_pgop_t nh_pgargs_sessions_draining(nh_pg_args_t *a, const char *endpoint, const char *after, int limit);
nh_pgop_t nh_pgargs_sessions_list(nh_pg_args_t *a, const char *endpoint, int blocked_only);
nh_pgop_t nh_pgargs_park(nh_pg_args_t *a, const nh_msg_t *m, int64_t park_seq);
nh_pgop_t nh_pgargs_parked_head(nh_pg_args_t *a, const char *endpoint, const char *session);
nh_pgop_t nh_pgargs_parked_delete(nh_pg_args_t *a, const char *endpoint, const char *session, int64_t park_seq);
nh_pgop_t nh_pgargs_parked_delete_event(nh_pg_args_t *a, const char *endpoint, const char *event_id);
nh_pgop_t nh_pgargs_parked_count(nh_pg_args_t *a, const char *endpoint, const char *session);
nh_pgop_t nh_pgargs_parked_any(nh_pg_args_t *a, const char *endpoint, const char *session);
nh_pgop_t nh_pgargs_inbox_has(nh_pg_args_t *a, const char *endpoint, const char *message_id);
nh_pgop_t nh_pgargs_inbox_add(nh_pg_args_t *a, const char *endpoint, const char *message_id);
nh_pgop_t nh_pgargs_processed_has(nh_pg_args_t *a, const char *endpoint, const char *message_id,
                                  const char *event_id);
nh_pgop_t nh_pgargs_oppending_add(nh_pg_args_t *a, const char *message_id, const char *endpoint, const char *event_id,
                                  const char *action, const char *expected_status);
nh_pgop_t nh_pgargs_oppending_has(nh_pg_args_t *a, const char *endpoint, const char *event_id);
nh_pgop_t nh_pgargs_oppending_take(nh_pg_args_t *a, const char *message_id);
nh_pgop_t nh_pgargs_oplog_add(nh_pg_args_t *a, const char *actor, const char *action, const char *endpoint,
                              const char *event_id, const char *session, const char *detail);
nh_pgop_t nh_pgargs_published_seen(nh_pg_args_t *a, const char *message_id);
nh_pgop_t nh_pgargs_published_claim(nh_pg_args_t *a, const char *message_id, int64_t now, int64_t since);
nh_pgop_t nh_pgargs_host_put(nh_pg_args_t *a, const char *owner, const char *endpoints_csv, int64_t started_at,
                             int64_t now);
nh_pgop_t nh_pgargs_host_del(nh_pg_args_t *a, const char *owner);
nh_pgop_t nh_pgargs_hosts_serving(nh_pg_args_t *a, const char *endpoint, int64_t since);
nh_pgop_t nh_pgargs_bulk_get(nh_pg_args_t *a, const char *key);
nh_pgop_t nh_pgargs_bulk_put(nh_pg_args_t *a, const char *key, const nh_bulk_run_t *run);
nh_pgop_t nh_pgargs_bulk_done(nh_pg_args_t *a, const char *key);
nh_pgop_t nh_pgargs_parked_window(nh_pg_args_t *a, const char *endpoint, const char *session, int64_t after,
                                  int limit);
nh_pgop_t nh_pgargs_parked_count_event(nh_pg_args_t *a, const char *endpoint, const char *event_id);
nh_pgop_t nh_pgargs_oppending_get(nh_pg_args_t *a, const char *message_id);
nh_pgop_t nh_pgargs_handoffs_pending(nh_pg_args_t *a, const char *endpoint);
nh_pgop_t nh_pgargs_published_claim_or_fail(nh_pg_args_t *a, const char *message_id, int64_t now, int64_t since);
/* purge: PURGE_RESOLVED with a row limit, the others 1,000 rows a statement */
nh_pgop_t nh_pgargs_purge(nh_pg_args_t *a, nh_pgop_t op, int64_t before, int limit);
/* purge --dry-run: 0 for either time counts none of its kind */
nh_pgop_t nh_pgargs_purge_count(nh_pg_args_t *a, int64_t resolved_before, int64_t inbox_before);
nh_pgop_t nh_pgargs_endpoint_gauges(nh_pg_args_t *a, const char *endpoint);
nh_pgop_t nh_pgargs_handoff_overdue_mark(nh_pg_args_t *a, const char *endpoint, const char *event_id, int64_t at,
                                         const char *detail);

/* 1 if s holds len bytes of well-formed UTF-8 (what PostgreSQL's text accepts, less the
 * NUL a C string cannot hold anyway). */
int nh_pg_utf8_valid(const char *s, size_t len);

/* ---------------------------------------------------------------- readers */

/* A column of a binary-format result: NULL is 0 / NULL; strings are owned copies. */
int64_t nh_pg_col_i64(const PGresult *r, int row, int col);
char *nh_pg_col_strdup(const PGresult *r, int row, int col);
/* A body (bytea) with its length; "" and 0 for an empty one, NULL for SQL NULL. */
char *nh_pg_col_body(const PGresult *r, int row, int col, size_t *len);
/* The text of a column inside the result (NULL for SQL NULL): valid while r is. */
const char *nh_pg_col_text(const PGresult *r, int row, int col);

/* AUDIT_GET, AUDIT_FIND*, HANDOFFS_DUE rows into an owned nh_audit_t (nh_audit_clear). */
void nh_pgrow_audit(const PGresult *r, int row, nh_audit_t *a);
/* SESSION_GET (col 0) and the session lists (col 1, after session_id). */
void nh_pgrow_session(const PGresult *r, int row, int col, nh_session_state_t *st);
/* PARKED_HEAD and PARKED_WINDOW: the message (owned, nh_msg_clear) of `endpoint`/`session` and its park_seq. */
void nh_pgrow_parked(const PGresult *r, int row, const char *endpoint, const char *session, nh_msg_t *m,
                     int64_t *park_seq);
/* HISTORY_LIST: the row's strings point into r. */
void nh_pgrow_history(const PGresult *r, int row, nh_history_row_t *h);
/* BULK_GET into an owned run (its owner is freed by the caller). */
void nh_pgrow_bulk(const PGresult *r, int row, nh_bulk_run_t *out);
/* Rows an INSERT, UPDATE or DELETE touched. */
int nh_pg_affected(const PGresult *r);

/* ---------------------------------------------------------------- executor (nh_pg_exec.c) */

/* A connection with the operations prepared on it, each on first use, whatever its table. */
typedef struct nh_pg_db nh_pg_db_t;

/* Takes the connection (nh_pg_db_free PQfinish()es it) and makes it non-blocking: the
 * executor waits on its socket itself, in one place (wait_socket). */
nh_pg_db_t *nh_pg_db_new(PGconn *conn);
void nh_pg_db_free(nh_pg_db_t *db);
/* Frees the executor and gives its connection back (still non-blocking), for another
 * owner: a start-up step that runs a few operations before the connection is handed on. */
PGconn *nh_pg_db_detach(nh_pg_db_t *db);
PGconn *nh_pg_db_conn(nh_pg_db_t *db);

/* One operation, blocking: one round trip (with its prepare, the first time). NH_OK with
 * the result in *res (the caller PQclear()s; res may be NULL to drop it), or the error
 * explained, naming the operation. */
int nh_pg_db_run(nh_pg_db_t *db, nh_pgop_t op, nh_pg_args_t *args, PGresult **res, nh_error_t *err);
/* The same for operation `op` of any table. */
int nh_pg_db_run_op(nh_pg_db_t *db, const nh_pg_optab_t *tab, int op, nh_pg_args_t *args, PGresult **res,
                    nh_error_t *err);

/* A batch: operations sent as they are added, in pipeline mode inside BEGIN ... COMMIT,
 * and their results read back in order when it commits. Nothing waits for the server
 * between begin and commit, so the whole batch is one round trip. */
/* A result, with the operation it answers: `op` of table `tab` (nh_pg_store_optab's are
 * nh_pgop_t). */
typedef void (*nh_pg_result_cb)(void *data, const nh_pg_optab_t *tab, int op, const PGresult *res);
int nh_pg_batch_begin(nh_pg_db_t *db, nh_error_t *err);
/* Sends one operation (args may go once this returns). cb (may be NULL) gets its result
 * once the batch has committed. */
int nh_pg_batch_add(nh_pg_db_t *db, nh_pgop_t op, nh_pg_args_t *args, nh_pg_result_cb cb, void *data,
                    nh_error_t *err);
/* The same for operation `op` of any table. */
int nh_pg_batch_add_op(nh_pg_db_t *db, const nh_pg_optab_t *tab, int op, nh_pg_args_t *args, nh_pg_result_cb cb,
                       void *data, nh_error_t *err);
/* Commits and waits. NH_OK: committed, and every callback has run, in the order the
 * operations were added. Otherwise nothing of the batch is committed (except when the
 * connection was lost during the COMMIT itself, which the error then says), no callback
 * runs, and err names the operation that failed and why. Either way the batch is over. */
int nh_pg_batch_commit(nh_pg_db_t *db, nh_error_t *err);
/* Drops a batch before its commit: rolls back whatever was sent. */
void nh_pg_batch_abandon(nh_pg_db_t *db);

/* An operation of any table with copies of its parameters, to be sent later (the unit of
 * work's write list, a transport's writes outside a pump): nh_pg_opcopy_new releases a
 * (its cleaned copies freed, as a send does). */
typedef struct nh_pg_opcopy {
  const nh_pg_optab_t *tab;
  int op;
  int n;
  char *values[NH_PG_MAX_ARGS];
  int lengths[NH_PG_MAX_ARGS];
  int formats[NH_PG_MAX_ARGS];
} nh_pg_opcopy_t;
nh_pg_opcopy_t *nh_pg_opcopy_new(const nh_pg_optab_t *tab, int op, nh_pg_args_t *a);
void nh_pg_opcopy_free(nh_pg_opcopy_t *c);
/* The parameters of a copied operation, borrowed from it (valid while it lives). */
void nh_pg_opcopy_args(const nh_pg_opcopy_t *c, nh_pg_args_t *a);
/* Adds the copied operation to a batch (nh_pg_batch_add_op). */
int nh_pg_opcopy_send(nh_pg_db_t *db, const nh_pg_opcopy_t *c, nh_pg_result_cb cb, void *data, nh_error_t *err);

/* What happened to a batch whose commit was not confirmed. NOT_COMMITTED: nothing of it
 * (a statement failed, the batch was abandoned, or the connection went before COMMIT did).
 * UNKNOWN: the connection went after COMMIT was sent and before its result: the caller
 * must treat the work as not settled and read it back (or let redelivery sort it out). */
typedef enum nh_pg_batch_outcome {
  NH_PG_COMMITTED,
  NH_PG_NOT_COMMITTED,
  NH_PG_UNKNOWN
} nh_pg_batch_outcome_t;
/* The outcome of the last batch once it is over (nh_pg_batch_commit returned, or
 * nh_pg_batch_poll returned 0); of the batch under way, what it would be were its
 * connection dropped now (a deadline passed, the host closes). */
nh_pg_batch_outcome_t nh_pg_batch_outcome(nh_pg_db_t *db);

/* ---- the same batch without waiting (what a loop drives, from a uv_poll on PQsocket) */

enum { NH_PG_WANT_READ = 1, NH_PG_WANT_WRITE = 2 };
/* Sends COMMIT and the pipeline's sync; then nh_pg_batch_poll until it returns 0. */
int nh_pg_batch_send_commit(nh_pg_db_t *db, nh_error_t *err);
/* Sends ROLLBACK and the sync instead (a builder gave up half way); then nh_pg_batch_poll
 * until it returns 0, with an error (NH_ESTATE, unless the connection failed first) and
 * no callback run. */
int nh_pg_batch_send_abandon(nh_pg_db_t *db, nh_error_t *err);
/* Sends what libpq holds and reads what has arrived, without waiting. Returns what to
 * wait for on PQsocket (NH_PG_WANT_READ, | NH_PG_WANT_WRITE) or 0 once the batch is over,
 * with its outcome in *rc and err (as nh_pg_batch_commit's). */
int nh_pg_batch_poll(nh_pg_db_t *db, int *rc, nh_error_t *err);

/* What the executor has sent since nh_pg_db_new: statements, and pipelines (each ended
 * by one sync; a pipeline is one round trip: every statement of it goes out before any
 * result is waited for). */
typedef struct nh_pg_db_stats {
  int64_t statements, pipelines, prepares;
} nh_pg_db_stats_t;
void nh_pg_db_stats(nh_pg_db_t *db, nh_pg_db_stats_t *out);

/* The blocking operations' error state, like the sqlite store's: any failed statement
 * sets it (a failed read must never pass for "no row"); the last error is kept. */
int nh_pg_db_failed(nh_pg_db_t *db);
const nh_error_t *nh_pg_db_error(nh_pg_db_t *db);
void nh_pg_db_clear_failed(nh_pg_db_t *db);
void nh_pg_db_set_failed(nh_pg_db_t *db, const nh_error_t *err);

/* ---------------------------------------------------------------- blocking operations (nh_pg_rows.c) */

/* The nh_store_* row functions on PostgreSQL: same arguments, same return values, each
 * statement run at once (in the caller's transaction if it opened one with nh_pg_exec,
 * else on its own). Errors are logged, kept in the db (nh_pg_db_error) and returned as
 * the sqlite twin returns them. */
int nh_pgs_audit_put(nh_pg_db_t *db, const nh_audit_t *a);
int nh_pgs_audit_get(nh_pg_db_t *db, const char *endpoint, const char *event_id, nh_audit_t *out);
int nh_pgs_audit_find(nh_pg_db_t *db, const char *event_id, nh_audit_t *out, nh_error_t *err);
int nh_pgs_audit_retext_deferred(nh_pg_db_t *db, const char *endpoint, const char *session, const char *text);
int nh_pgs_handoffs_due(nh_pg_db_t *db, int64_t now, int limit, nh_audit_cb cb, void *data);
int nh_pgs_handoff_flag_overdue(nh_pg_db_t *db, const char *endpoint, const char *event_id, int64_t at);
int nh_pgs_history_add(nh_pg_db_t *db, const char *endpoint, const char *event_id, const char *message_id,
                       const char *message_type, const char *status, const char *detail);
int nh_pgs_history_add_ex(nh_pg_db_t *db, const char *endpoint, const char *event_id, const char *message_id,
                          const char *message_type, const char *status, const char *detail,
                          const nh_history_extra_t *x);
int nh_pgs_history_list(nh_pg_db_t *db, const char *endpoint, const char *event_id, nh_history_cb cb, void *data);
/* nh_store_events on PostgreSQL (nh_pg_query.c): every filter of nh_event_filter_t but
 * sqlite's page planner probe (rowid_from/rowid_to: NH_EUSAGE, said), same rows, same
 * order; the count of rows passed to cb, or NH_EFAIL. last_seq (optional): the seq of the
 * last row passed, a batch's or page's keyset (as sqlite's rowid) */
int nh_pgs_events(nh_pg_db_t *db, const nh_event_filter_t *f, nh_audit_cb cb, void *data, int64_t *last_seq,
                  nh_error_t *err);
int64_t nh_pgs_events_count(nh_pg_db_t *db, const nh_event_filter_t *f, nh_error_t *err);
/* `events --follow` on PostgreSQL (nh_pg_query.c): the last history id (0: none), and the
 * history rows after `after_id` or inside one of `ngaps` gaps (ids strictly between
 * gaps[2k] and gaps[2k+1]), oldest first, at most `limit`, each with its event as it is
 * now (NULL: deleted since). Ids commit out of order here: the caller reads them with a
 * cursor that waits for gaps (core/nh_idcursor.h). Returns the rows read or NH_EFAIL. */
typedef void (*nh_history_follow_cb)(void *data, int64_t id, const nh_audit_t *a);
int64_t nh_pgs_history_last_id(nh_pg_db_t *db, nh_error_t *err);
int nh_pgs_history_after(nh_pg_db_t *db, int64_t after_id, const int64_t *gaps, int ngaps, int limit,
                         nh_history_follow_cb cb, void *data, nh_error_t *err);
/* nh_embedded_list on PostgreSQL (nh_pg_query.c): the queue's unfinished work, same rows,
 * same order (a store no host ran on yet has no queue: 0 rows). */
int nh_pgq_unfinished(nh_pg_db_t *db, const char *endpoint, const char *session, int want_running, int64_t now,
                      int limit, int (*cb)(void *data, const nh_queued_row_t *r), void *data, nh_error_t *err);
/* nh_store_failgroups and nh_store_failgroup_endpoint on PostgreSQL */
int nh_pgs_failgroups(nh_pg_db_t *db, const char *endpoint, nh_failgroup_cb cb, void *data, nh_error_t *err);
int nh_pgs_failgroup_endpoint(nh_pg_db_t *db, const char *group, char *endpoint, size_t len, nh_error_t *err);
/* The operator console's and admin API's reads on PostgreSQL (nh_pg_query.c): same rows,
 * order, counts and return values as their sqlite twins; no error out-parameter, as those
 * have none: a failure is logged and kept in the db (nh_pg_db_error). No globals: safe on a
 * worker thread's own connection. */
/* nh_store_endpoints: every endpoint with audit rows, in byte order; the count passed to cb */
int nh_pgs_endpoints(nh_pg_db_t *db, int (*cb)(void *data, const char *endpoint), void *data);
/* nh_store_endpoint_stats: blocked sessions, pending and overdue (expected_by < now) hand-offs */
int nh_pgs_endpoint_stats(nh_pg_db_t *db, const char *endpoint, int64_t now, nh_endpoint_stats_t *out);
/* nh_store_endpoint_parked: the endpoint's parked rows */
int64_t nh_pgs_endpoint_parked(nh_pg_db_t *db, const char *endpoint);
/* nh_store_blocked_sessions: (endpoint, session) keyset pages of blocked sessions with their blocker */
int nh_pgs_blocked_sessions(nh_pg_db_t *db, const char *endpoint, const char *after_endpoint,
                            const char *after_session, int limit, nh_blocked_cb cb, void *data);
/* nh_store_oplog_list: an event's operator log, oldest first */
int nh_pgs_oplog_list(nh_pg_db_t *db, const char *endpoint, const char *event_id, nh_oplog_cb cb, void *data);
int nh_pgs_session_get(nh_pg_db_t *db, const char *endpoint, const char *session, nh_session_state_t *st);
int nh_pgs_session_put(nh_pg_db_t *db, const char *endpoint, const char *session, const nh_session_state_t *st);
int nh_pgs_sessions_due(nh_pg_db_t *db, const char *endpoint, int64_t now, int limit, char **cursor,
                        nh_session_cb cb, void *data);
int nh_pgs_sessions_list(nh_pg_db_t *db, const char *endpoint, int blocked_only, nh_session_cb cb, void *data);
int nh_pgs_park(nh_pg_db_t *db, const nh_msg_t *m, int64_t park_seq);
int nh_pgs_parked_head(nh_pg_db_t *db, const char *endpoint, const char *session, nh_msg_t *out, int64_t *park_seq);
int nh_pgs_parked_delete(nh_pg_db_t *db, const char *endpoint, const char *session, int64_t park_seq);
int nh_pgs_parked_delete_event(nh_pg_db_t *db, const char *endpoint, const char *event_id);
int nh_pgs_parked_count(nh_pg_db_t *db, const char *endpoint, const char *session);
int nh_pgs_parked_any(nh_pg_db_t *db, const char *endpoint, const char *session);
int nh_pgs_inbox_has(nh_pg_db_t *db, const char *endpoint, const char *message_id);
int nh_pgs_inbox_add(nh_pg_db_t *db, const char *endpoint, const char *message_id);
int nh_pgs_processed_has(nh_pg_db_t *db, const char *endpoint, const char *message_id, const char *event_id);
int nh_pgs_oppending_add(nh_pg_db_t *db, const char *message_id, const char *endpoint, const char *event_id,
                         const char *action, const char *expected_status);
int nh_pgs_oppending_has(nh_pg_db_t *db, const char *endpoint, const char *event_id);
int nh_pgs_oppending_take(nh_pg_db_t *db, const char *message_id, char **expected_status);
int nh_pgs_oplog_add(nh_pg_db_t *db, const char *actor, const char *action, const char *endpoint,
                     const char *event_id, const char *session, const char *detail);
int nh_pgs_published_claim(nh_pg_db_t *db, const char *message_id, int64_t now, int64_t since, int64_t *at);
int nh_pgs_published_seen(nh_pg_db_t *db, const char *message_id, int64_t since, int64_t *at);
int nh_pgs_host_put(nh_pg_db_t *db, const char *owner, const char *endpoints_csv, int64_t started_at, int64_t now);
int nh_pgs_host_del(nh_pg_db_t *db, const char *owner);
int nh_pgs_hosts_serving(nh_pg_db_t *db, const char *endpoint, int64_t since);
int nh_pgs_bulk_get(nh_pg_db_t *db, const char *key, nh_bulk_run_t *out);
int nh_pgs_bulk_put(nh_pg_db_t *db, const char *key, const nh_bulk_run_t *run);
int nh_pgs_bulk_done(nh_pg_db_t *db, const char *key);

/* Retention's deletes on PostgreSQL (nh_pg_purge.c), added to the batch being built: the
 * resolved events before resolved_before (at most max_rows, with their history) and the
 * processed entries, when resolved_before > 0; the inbox entries before inbox_before, when
 * > 0; the MessageId claims past the dedup window. Once the batch commits, *counts has
 * what each deleted added to it. */
int nh_pg_purge_add(nh_pg_db_t *db, int64_t resolved_before, int64_t inbox_before, int max_rows,
                    nh_purge_counts_t *counts, nh_error_t *err);
/* purge on PostgreSQL (nh_pg_purge.c). One transaction of nh_store_purge's deletes (the
 * same rows, the same limits: at most max_rows resolved events), committed; the rows
 * deleted (0: nothing left) added to *counts, or NH_EFAIL with err said (nothing of this
 * transaction deleted). */
int nh_pgs_purge(nh_pg_db_t *db, int64_t resolved_before, int64_t inbox_before, int max_rows,
                 nh_purge_counts_t *counts, nh_error_t *err);
/* nh_store_purge_count: what nh_pgs_purge would delete in all (events and inbox entries). */
int nh_pgs_purge_count(nh_pg_db_t *db, int64_t resolved_before, int64_t inbox_before, nh_purge_counts_t *counts,
                       nh_error_t *err);
/* The database's size in bytes (pg_database_size), or -1 if it cannot be read. */
int64_t nh_pgs_database_bytes(nh_pg_db_t *db);

#endif
