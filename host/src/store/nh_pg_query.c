/* Operator queries on a PostgreSQL store (the CLI's, blocking): events with the filters of
 * nh_store_query.c that a reader uses (status, endpoint, session, type, event id, error
 * text, updated_at range, the newest N) and those of a bulk run (its snapshot, the statuses
 * it leaves out, events with a payload and without a waiting request, batches after a
 * seq), in its order, read back with nh_pgrow_audit. The
 * statement is built per call from the filters that are set, as sqlite's is, so the planner
 * can use the index of the most selective one. */
#include "nh_pg_ops.h"
#include "nh_store_int.h"
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

static int where(query_t *q, const nh_event_filter_t *f, nh_error_t *err)
{
  if (f->payload || f->rowid_to || f->desc || f->page)
    return nh_error_set(err, NH_EUSAGE, "this filter is not built on a PostgreSQL store yet (docs/store-backends.md)");
  add(q, " WHERE true");
  /* a bulk run's (dispatch/nh_bulk.c): its snapshot, what it can apply to, its keyset */
  if (f->cutoff_ms) i64_is(q, " AND updated_at <= $%d", f->cutoff_ms);
  for (int i = 0; i < 4 && f->not_status[i]; i++) key_not(q, "status", f->not_status[i]);
  if (f->need_payload) add(q, " AND payload IS NOT NULL");
  if (f->without_request)
    add(q, " AND NOT EXISTS (SELECT 1 FROM operator_pending p WHERE p.event_id = audit.event_id"
           " AND p.endpoint = audit.endpoint)");
  if (f->after_rowid) i64_is(q, " AND seq > $%d", f->after_rowid);
  if (f->status) key_is(q, "status", f->status);
  key_in(q, "status", f->status_in);
  if (f->endpoint) key_is(q, "endpoint", f->endpoint);
  if (f->session) key_is(q, "session_id", f->session);
  if (f->type) key_is(q, "event_type", f->type);
  key_in(q, "event_type", f->type_in);
  if (f->event_id) key_is(q, "event_id", f->event_id);
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

static PGresult *exec_query(nh_pg_db_t *db, query_t *q, nh_error_t *err)
{
  PGresult *r = PQexecParams(nh_pg_db_conn(db), q->sql, q->args.n, NULL, q->args.values, q->args.lengths,
                             q->args.formats, 1);
  nh_pg_args_release(&q->args);
  if (PQresultStatus(r) != PGRES_TUPLES_OK) {
    nh_error_set(err, NH_EFAIL, "store: the events query failed: %s", PQresultErrorMessage(r));
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
  if (f->batch > 0) {   /* a bulk batch: insert order, as sqlite's rowid */
    i64_is(&q, " ORDER BY seq LIMIT $%d", f->batch);
  } else if (f->limit > 0) {   /* the newest N, printed oldest first */
    i64_is(&q, " ORDER BY created_at DESC, seq DESC LIMIT $%d) newest", f->limit);
    add(&q, " ORDER BY created_at, seq");
  } else {
    add(&q, " ORDER BY created_at, seq");
  }
  PGresult *r = exec_query(db, &q, err);
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
  PGresult *r = exec_query(db, &q, err);
  if (!r) return NH_EFAIL;
  int64_t n = nh_pg_col_i64(r, 0, 0);
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
  PGresult *r = exec_query(db, &q, err);
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
  PGresult *r = exec_query(db, &q, err);
  if (!r) return NH_EFAIL;
  int found = PQntuples(r) > 0;
  if (found && endpoint) snprintf(endpoint, len, "%s", nh_pg_col_text(r, 0, 0));
  PQclear(r);
  return found;
}
