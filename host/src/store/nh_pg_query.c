/* Operator queries on a PostgreSQL store (the CLI's and the admin API's, blocking): events
 * with the filters of nh_store_query.c that a reader uses (status, endpoint, session, type,
 * event id, payload and error text, updated_at range, the newest N, the API's keyset pages
 * either way) and those of a bulk run (its snapshot, the statuses it leaves out, events
 * with a payload and without a waiting request, batches after a seq), in its order, read
 * back with nh_pgrow_audit; `events --follow`'s history reads; the embedded queue's
 * unfinished work (`events --status queued|running`); and the console's reads of
 * nh_store_console.c (endpoints, their figures, blocked sessions, an event's operator
 * log). The statement is built per call from the filters that are set, as sqlite's is, so
 * the planner can use the index of the most selective one. Nothing here keeps state
 * between calls: a worker thread may call these on its own connection. */
#include "nh_pg_ops.h"
#include "nh_store_int.h"
#include "core/nh_log.h"
#include "core/nh_strset.h"
#include "core/nh_util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct query {
  char sql[4096];
  size_t len;
  nh_pg_args_t args;
} query_t;

static void add(query_t *q, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(query_t *q, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(q->sql + q->len, sizeof q->sql - q->len, fmt, ap);
  va_end(ap);
  if (n > 0) q->len += (size_t)n < sizeof q->sql - q->len ? (size_t)n : sizeof q->sql - q->len - 1;
}

/* " AND column = $n" for a key (an id or a name: escaped as the writers escape it) */
static void key_is(query_t *q, const char *column, const char *v)
{
  nh_pg_args_key(&q->args, v);
  add(q, " AND %s = $%d", column, q->args.n);
}

static void key_not(query_t *q, const char *column, const char *v)
{
  nh_pg_args_key(&q->args, v);
  add(q, " AND %s <> $%d", column, q->args.n);
}

static void key_in(query_t *q, const char *column, const char *const *list)
{
  if (!list[0]) return;
  add(q, " AND %s IN (", column);
  for (int i = 0; i < 8 && list[i]; i++) {
    nh_pg_args_key(&q->args, list[i]);
    add(q, "%s$%d", i ? ", " : "", q->args.n);
  }
  add(q, ")");
}

static void i64_is(query_t *q, const char *cond, int64_t v)
{
  nh_pg_args_i64(&q->args, v);
  add(q, cond, q->args.n);
}

/* " AND payload holds sub": bytes against bytes, as nh_event_filter_match's memmem and
 * sqlite's instr() (which matches the same bytes for any needle that starts a UTF-8
 * character, as every API and CLI filter does). payload is bytea, so the needle goes as
 * bytea too: a text needle would be cast through the payload's encoding, which arbitrary
 * bodies (a NUL, bytes that are not UTF-8) do not have. Case-sensitive. */
static void payload_has(query_t *q, const char *sub)
{
  nh_pg_args_bytes(&q->args, sub, strlen(sub));
  add(q, " AND position($%d::bytea in payload) > 0", q->args.n);
}

static int where(query_t *q, const nh_event_filter_t *f, nh_error_t *err)
{
  /* rowid_from/rowid_to is the sqlite page planner's probe (nh_store_events decides with
   * it whether a page walks the table or reads the status index), never a caller's
   * filter: PostgreSQL's planner makes that choice itself from its statistics */
  if (f->rowid_to)
    return nh_error_set(err, NH_EUSAGE, "rowid_from/rowid_to is sqlite's page planner probe, not a filter of a "
                                        "PostgreSQL store");
  add(q, " WHERE true");
  /* a bulk run's (dispatch/nh_bulk.c): its snapshot, what it can apply to, its keyset */
  if (f->cutoff_ms) i64_is(q, " AND updated_at <= $%d", f->cutoff_ms);
  for (int i = 0; i < 4 && f->not_status[i]; i++) key_not(q, "status", f->not_status[i]);
  if (f->need_payload) add(q, " AND payload IS NOT NULL");
  if (f->without_request)
    add(q, " AND NOT EXISTS (SELECT 1 FROM operator_pending p WHERE p.event_id = audit.event_id"
           " AND p.endpoint = audit.endpoint)");
  /* the keyset: after the cursor in the batch's direction (a newest-first page goes down) */
  if (f->after_rowid) i64_is(q, f->desc ? " AND seq < $%d" : " AND seq > $%d", f->after_rowid);
  if (f->status) key_is(q, "status", f->status);
  key_in(q, "status", f->status_in);
  if (f->endpoint) key_is(q, "endpoint", f->endpoint);
  if (f->session) key_is(q, "session_id", f->session);
  if (f->type) key_is(q, "event_type", f->type);
  key_in(q, "event_type", f->type_in);
  if (f->event_id) key_is(q, "event_id", f->event_id);
  if (f->payload) payload_has(q, f->payload);
  if (f->group) key_is(q, "fail_group", f->group);
  if (f->error) {
    /* ILIKE: sqlite's LIKE ignores ASCII case */
    char *pat = nh_store_like_pattern(f->error);
    nh_pg_args_text(&q->args, pat);
    /* the args borrow the text until the query is sent: kept with them */
    q->args.owned[q->args.nowned++] = pat;
    add(q, " AND error_text ILIKE $%d ESCAPE '\\'", q->args.n);
  }
  if (f->since_ms) i64_is(q, " AND updated_at >= $%d", f->since_ms);
  if (f->before_ms) i64_is(q, " AND updated_at < $%d", f->before_ms);
  return NH_OK;
}

/* Runs q (its args released), asking for binary results; NULL with err said if it failed. */
static PGresult *exec_query(nh_pg_db_t *db, query_t *q, const char *what, nh_error_t *err)
{
  PGresult *r = PQexecParams(nh_pg_db_conn(db), q->sql, q->args.n, NULL, q->args.values, q->args.lengths,
                             q->args.formats, 1);
  nh_pg_args_release(&q->args);
  if (PQresultStatus(r) != PGRES_TUPLES_OK) {
    nh_error_set(err, NH_EFAIL, "store: the %s query failed: %s", what, PQresultErrorMessage(r));
    PQclear(r);
    return NULL;
  }
  return r;
}

int nh_pgs_events(nh_pg_db_t *db, const nh_event_filter_t *f, nh_audit_cb cb, void *data, int64_t *last_seq,
                  nh_error_t *err)
{
  query_t q = { .len = 0 };
  nh_pg_args_reset(&q.args);
  if (f->limit > 0) add(&q, "SELECT * FROM (SELECT " NH_AUDIT_COLS ", seq FROM audit");
  else add(&q, "SELECT " NH_AUDIT_COLS ", seq FROM audit");
  if (where(&q, f, err)) {
    nh_pg_args_release(&q.args);
    return NH_EFAIL;
  }
  if (f->batch > 0) {
    /* a bulk batch or a reader's page (f->page: only sqlite's plan differs): insert
     * order, as sqlite's rowid, newest first when desc */
    i64_is(&q, f->desc ? " ORDER BY seq DESC LIMIT $%d" : " ORDER BY seq LIMIT $%d", f->batch);
  } else if (f->limit > 0) {   /* the newest N, printed oldest first */
    i64_is(&q, " ORDER BY created_at DESC, seq DESC LIMIT $%d) newest", f->limit);
    add(&q, " ORDER BY created_at, seq");
  } else {
    add(&q, " ORDER BY created_at, seq");
  }
  PGresult *r = exec_query(db, &q, "events", err);
  if (!r) return NH_EFAIL;
  int n = 0;
  for (int i = 0; i < PQntuples(r); i++) {
    nh_audit_t a;
    nh_pgrow_audit(r, i, &a);
    if (last_seq) *last_seq = nh_pg_col_i64(r, i, PQnfields(r) - 1);
    int stop = cb(data, &a);
    nh_audit_clear(&a);
    n++;
    if (stop) break;
  }
  PQclear(r);
  return n;
}

int64_t nh_pgs_events_count(nh_pg_db_t *db, const nh_event_filter_t *f, nh_error_t *err)
{
  query_t q = { .len = 0 };
  nh_pg_args_reset(&q.args);
  add(&q, "SELECT count(*) FROM audit");
  if (where(&q, f, err)) {
    nh_pg_args_release(&q.args);
    return NH_EFAIL;
  }
  PGresult *r = exec_query(db, &q, "events", err);
  if (!r) return NH_EFAIL;
  int64_t n = nh_pg_col_i64(r, 0, 0);
  PQclear(r);
  return n;
}

/* ---- --follow: history rows after a cursor, with their event as it is now ---- */

int64_t nh_pgs_history_last_id(nh_pg_db_t *db, nh_error_t *err)
{
  query_t q = { .len = 0 };
  nh_pg_args_reset(&q.args);
  add(&q, "SELECT coalesce(max(id), 0) FROM history");
  PGresult *r = exec_query(db, &q, "history", err);
  if (!r) return NH_EFAIL;
  int64_t id = nh_pg_col_i64(r, 0, 0);
  PQclear(r);
  return id;
}

int nh_pgs_history_after(nh_pg_db_t *db, int64_t after_id, const int64_t *gaps, int ngaps, int limit,
                         nh_history_follow_cb cb, void *data, nh_error_t *err)
{
  /* one statement a poll, not one a row: the event of each row read beside it (NULL
   * columns when it was deleted since) */
  query_t q = { .len = 0 };
  nh_pg_args_reset(&q.args);
  add(&q, "SELECT a.*, h.id FROM history h LEFT JOIN LATERAL (SELECT " NH_AUDIT_COLS " FROM audit"
          " WHERE audit.endpoint = h.endpoint AND audit.event_id = h.event_id) a ON true");
  i64_is(&q, " WHERE h.id > $%d", after_id);
  for (int g = 0; g < ngaps; g++) {
    i64_is(&q, " OR (h.id > $%d", gaps[2 * g]);
    i64_is(&q, " AND h.id < $%d)", gaps[2 * g + 1]);
  }
  i64_is(&q, " ORDER BY h.id LIMIT $%d", limit);
  PGresult *r = exec_query(db, &q, "history", err);
  if (!r) return NH_EFAIL;
  int n = PQntuples(r), last = PQnfields(r) - 1;
  for (int i = 0; i < n; i++) {
    int64_t id = nh_pg_col_i64(r, i, last);
    if (PQgetisnull(r, i, 0)) {
      cb(data, id, NULL);
      continue;
    }
    nh_audit_t a;
    nh_pgrow_audit(r, i, &a);
    cb(data, id, &a);
    nh_audit_clear(&a);
  }
  PQclear(r);
  return n;
}

/* ---- events --status queued|running: the embedded queue ---- */

int nh_pgq_unfinished(nh_pg_db_t *db, const char *endpoint, const char *session, int want_running, int64_t now,
                      int limit, int (*cb)(void *data, const nh_queued_row_t *r), void *data, nh_error_t *err)
{
  /* as sqlite's nh_embedded_list: a live lock with an owner means the session's head is
   * in a handler, and the head is the first row of a locked session this scan meets (it
   * reads in seq order); `locked` remembers the locked sessions met */
  query_t q = { .len = 0 };
  nh_pg_args_reset(&q.args);
  nh_pg_args_i64(&q.args, now);
  add(&q, "SELECT q.endpoint, q.session_id, q.event_id, q.event_type, q.message_type, l.owner, q.enqueued_at,"
          " q.visible_at, q.delivery_count FROM queue q LEFT JOIN session_locks l ON l.endpoint = q.endpoint"
          " AND l.session_id = q.session_id AND l.locked_until > $1 WHERE true");
  if (endpoint) key_is(&q, "q.endpoint", endpoint);
  else add(&q, " AND q.endpoint NOT LIKE '\\_reply.%%' ESCAPE '\\'");
  if (session) key_is(&q, "q.session_id", session);
  add(&q, " ORDER BY q.seq");
  PGresult *r = PQexecParams(nh_pg_db_conn(db), q.sql, q.args.n, NULL, q.args.values, q.args.lengths,
                             q.args.formats, 1);
  nh_pg_args_release(&q.args);
  if (PQresultStatus(r) != PGRES_TUPLES_OK) {
    const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    int none = state && strcmp(state, "42P01") == 0;   /* no host has run on this store: no queue yet */
    if (!none) nh_error_set(err, NH_EFAIL, "store: the queue query failed: %s", PQresultErrorMessage(r));
    PQclear(r);
    return none ? 0 : NH_EFAIL;
  }
  int n = 0;
  nh_strset_t locked;
  nh_strset_init(&locked, 64);
  for (int i = 0; i < PQntuples(r); i++) {
    nh_queued_row_t row = {
      .endpoint = nh_pg_col_text(r, i, 0), .session_id = nh_pg_col_text(r, i, 1),
      .event_id = nh_pg_col_text(r, i, 2), .event_type = nh_pg_col_text(r, i, 3),
      .message_type = nh_pg_col_text(r, i, 4), .enqueued_at = nh_pg_col_i64(r, i, 6),
      .visible_at = nh_pg_col_i64(r, i, 7), .delivery_count = (int)nh_pg_col_i64(r, i, 8),
    };
    if (!PQgetisnull(r, i, 5)) row.running = nh_queued_running(&locked, row.endpoint, row.session_id);
    row.owner = row.running ? nh_pg_col_text(r, i, 5) : NULL;
    if (row.running != want_running) continue;
    n++;
    if (cb(data, &row) || (limit > 0 && n >= limit)) break;
  }
  nh_strset_free(&locked);
  PQclear(r);
  return n;
}

/* ---- failure groups ---- */

int nh_pgs_failgroups(nh_pg_db_t *db, const char *endpoint, nh_failgroup_cb cb, void *data, nh_error_t *err)
{
  /* as sqlite's (nh_store_query.c): the partial index audit_group alone for the counts and
   * the seqs of each group's first and last event, then those two rows */
  query_t q = { .len = 0 };
  nh_pg_args_reset(&q.args);
  add(&q, "SELECT g.fail_group, g.endpoint, g.n, f.created_at, l.updated_at, l.event_id, l.error_type, l.error_text"
          " FROM (SELECT fail_group, endpoint, count(*) AS n, min(seq) AS first, max(seq) AS last"
          " FROM audit WHERE fail_group IS NOT NULL");
  if (endpoint) key_is(&q, "endpoint", endpoint);
  add(&q, " GROUP BY fail_group, endpoint) g JOIN audit f ON f.seq = g.first JOIN audit l ON l.seq = g.last"
          " ORDER BY g.n DESC, g.fail_group");
  PGresult *r = exec_query(db, &q, "failure groups", err);
  if (!r) return NH_EFAIL;
  int n = 0;
  for (int i = 0; i < PQntuples(r); i++) {
    nh_failgroup_row_t g = {
      .group = nh_pg_col_text(r, i, 0), .endpoint = nh_pg_col_text(r, i, 1), .count = nh_pg_col_i64(r, i, 2),
      .first_ms = nh_pg_col_i64(r, i, 3), .last_ms = nh_pg_col_i64(r, i, 4),
      .sample_event_id = nh_pg_col_text(r, i, 5), .error_type = nh_pg_col_text(r, i, 6),
      .sample_text = nh_pg_col_text(r, i, 7),
    };
    n++;
    if (cb(data, &g)) break;
  }
  PQclear(r);
  return n;
}

int nh_pgs_failgroup_endpoint(nh_pg_db_t *db, const char *group, char *endpoint, size_t len, nh_error_t *err)
{
  query_t q = { .len = 0 };
  nh_pg_args_reset(&q.args);
  add(&q, "SELECT endpoint FROM audit WHERE true");
  key_is(&q, "fail_group", group);
  add(&q, " LIMIT 1");
  PGresult *r = exec_query(db, &q, "failure group", err);
  if (!r) return NH_EFAIL;
  int found = PQntuples(r) > 0;
  if (found && endpoint) snprintf(endpoint, len, "%s", nh_pg_col_text(r, 0, 0));
  PQclear(r);
  return found;
}

/* ---- the console's reads (nh_store_console.c's twins) ---- */

/* These have no error out-parameter, as their sqlite twins have none: a failure is logged
 * and kept in the db (nh_pg_db_error), as nh_pg_rows.c's readers keep theirs. */
static PGresult *read_rows(nh_pg_db_t *db, query_t *q, const char *what)
{
  nh_error_t err = { 0 };
  PGresult *r = exec_query(db, q, what, &err);
  if (!r) {
    nh_log_error("store", "%s", err.msg);
    nh_pg_db_set_failed(db, &err);
  }
  return r;
}

int nh_pgs_endpoints(nh_pg_db_t *db, int (*cb)(void *data, const char *endpoint), void *data)
{
  /* a loose index scan of audit_session (endpoint first): one probe per endpoint, not a
   * pass over every row, as sqlite's skip-scan */
  query_t q = { .len = 0 };
  nh_pg_args_reset(&q.args);
  add(&q, "WITH RECURSIVE e AS (SELECT min(endpoint) AS ep FROM audit UNION ALL"
          " SELECT (SELECT min(endpoint) FROM audit WHERE endpoint > e.ep) FROM e WHERE e.ep IS NOT NULL)"
          " SELECT ep FROM e WHERE ep IS NOT NULL");
  PGresult *r = read_rows(db, &q, "endpoints");
  if (!r) return NH_EFAIL;
  int n = 0;
  for (int i = 0; i < PQntuples(r); i++) {
    n++;
    if (cb(data, nh_pg_col_text(r, i, 0))) break;
  }
  PQclear(r);
  return n;
}

int nh_pgs_endpoint_stats(nh_pg_db_t *db, const char *endpoint, int64_t now, nh_endpoint_stats_t *out)
{
  /* sqlite's three counts with its conditions, in one statement (one snapshot): sessions'
   * key starts with the endpoint, audit_status is (status, endpoint, updated_at) */
  memset(out, 0, sizeof *out);
  query_t q = { .len = 0 };
  nh_pg_args_reset(&q.args);
  nh_pg_args_key(&q.args, endpoint);
  nh_pg_args_i64(&q.args, now);
  add(&q, "SELECT (SELECT count(*) FROM sessions WHERE endpoint = $1 AND blocked_by IS NOT NULL),"
          " (SELECT count(*) FROM audit WHERE status = 'Pending' AND endpoint = $1 AND sub_status = 'Handoff'),"
          " (SELECT count(*) FROM audit WHERE status = 'Pending' AND endpoint = $1 AND sub_status = 'Handoff'"
          " AND expected_by IS NOT NULL AND expected_by < $2)");
  PGresult *r = read_rows(db, &q, "endpoint figures");
  if (!r) {
    out->blocked_sessions = out->handoffs_pending = out->handoffs_overdue = NH_EFAIL;
    return NH_EFAIL;
  }
  out->blocked_sessions = nh_pg_col_i64(r, 0, 0);
  out->handoffs_pending = nh_pg_col_i64(r, 0, 1);
  out->handoffs_overdue = nh_pg_col_i64(r, 0, 2);
  PQclear(r);
  return NH_OK;
}

int64_t nh_pgs_endpoint_parked(nh_pg_db_t *db, const char *endpoint)
{
  query_t q = { .len = 0 };
  nh_pg_args_reset(&q.args);
  add(&q, "SELECT count(*) FROM parked WHERE true");   /* a range of parked's primary key */
  key_is(&q, "endpoint", endpoint);
  PGresult *r = read_rows(db, &q, "parked events");
  if (!r) return NH_EFAIL;
  int64_t n = nh_pg_col_i64(r, 0, 0);
  PQclear(r);
  return n;
}

/* A blocked session's row: the columns of nh_pgs_blocked_sessions' SELECT, in its order;
 * the strings point into r. */
static nh_blocked_row_t blocked_row(const PGresult *r, int i)
{
  nh_blocked_row_t b = {
    .endpoint = nh_pg_col_text(r, i, 0), .session_id = nh_pg_col_text(r, i, 1),
    .blocked_by = nh_pg_col_text(r, i, 2), .retry_due = nh_pg_col_i64(r, i, 3),
    .status = nh_pg_col_text(r, i, 4), .sub_status = nh_pg_col_text(r, i, 5),
    .event_type = nh_pg_col_text(r, i, 6), .error_text = nh_pg_col_text(r, i, 7),
    .since = nh_pg_col_i64(r, i, 8), .handoff_reason = nh_pg_col_text(r, i, 9),
    .parked = nh_pg_col_i64(r, i, 10),
  };
  return b;
}

int nh_pgs_blocked_sessions(nh_pg_db_t *db, const char *endpoint, const char *after_endpoint,
                            const char *after_session, int limit, nh_blocked_cb cb, void *data)
{
  /* as sqlite's: the blocker's row beside each session (NULL columns when it is gone),
   * the parked count per session (a range of parked's key), keyset order on sessions'
   * key; both compare byte by byte (COLLATE "C"), so a cursor pages the same way */
  query_t q = { .len = 0 };
  nh_pg_args_reset(&q.args);
  add(&q, "SELECT s.endpoint, s.session_id, s.blocked_by, s.retry_due, a.status, a.sub_status, a.event_type,"
          " a.error_text, a.updated_at, a.handoff_reason,"
          " (SELECT count(*) FROM parked p WHERE p.endpoint = s.endpoint AND p.session_id = s.session_id)"
          " FROM sessions s LEFT JOIN audit a ON a.event_id = s.blocked_by AND a.endpoint = s.endpoint"
          " WHERE s.blocked_by IS NOT NULL");
  if (endpoint) key_is(&q, "s.endpoint", endpoint);
  if (after_session) {   /* the cursor is the session alone when no endpoint came with it, as on sqlite */
    nh_pg_args_key(&q.args, after_endpoint ? after_endpoint : "");
    nh_pg_args_key(&q.args, after_session);
    add(&q, " AND (s.endpoint, s.session_id) > ($%d, $%d)", q.args.n - 1, q.args.n);
  }
  add(&q, " ORDER BY s.endpoint, s.session_id");
  /* sqlite's LIMIT: a negative one is none */
  if (limit >= 0) i64_is(&q, " LIMIT $%d", limit);
  PGresult *r = read_rows(db, &q, "blocked sessions");
  if (!r) return NH_EFAIL;
  int n = 0;
  for (int i = 0; i < PQntuples(r); i++) {
    nh_blocked_row_t b = blocked_row(r, i);
    n++;
    if (cb(data, &b)) break;
  }
  PQclear(r);
  return n;
}

int nh_pgs_oplog_list(nh_pg_db_t *db, const char *endpoint, const char *event_id, nh_oplog_cb cb, void *data)
{
  /* no index on event_id, as on sqlite: the log is small; id is its insert order */
  query_t q = { .len = 0 };
  nh_pg_args_reset(&q.args);
  add(&q, "SELECT at, actor, action, detail FROM operator_log WHERE true");
  key_is(&q, "event_id", event_id);
  key_is(&q, "endpoint", endpoint);
  add(&q, " ORDER BY id");
  PGresult *r = read_rows(db, &q, "operator log");
  if (!r) return NH_EFAIL;
  int n = 0;
  for (int i = 0; i < PQntuples(r); i++) {
    nh_oplog_row_t o = { .at = nh_pg_col_i64(r, i, 0), .actor = nh_pg_col_text(r, i, 1),
                         .action = nh_pg_col_text(r, i, 2), .detail = nh_pg_col_text(r, i, 3) };
    n++;
    if (cb(data, &o)) break;
  }
  PQclear(r);
  return n;
}
