/* Operator queries: events (with every filter of the CLI and the bulk commands),
 * sessions, failure groups, bulk-run bookkeeping; also the publish dedup table, the
 * registry of running hosts and purge. Event queries are built per call from the filters
 * that are set, so sqlite picks the index of the most selective one; `?1 IS NULL OR ...`
 * forms would defeat every index and read the whole audit table each time. */
#define _GNU_SOURCE   /* strcasestr */
#include "nh_store_int.h"
#include "core/nh_failgroup.h"
#include "core/nh_log.h"
#include "core/nh_sqlite.h"
#include "core/nh_util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef struct sqlbuf {
  char *p;
  size_t len, cap;
} sqlbuf_t;

static void add(sqlbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(sqlbuf_t *b, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (b->len + (size_t)n + 1 > b->cap) {
    b->cap = (b->len + (size_t)n + 1) * 2;
    b->p = nh_xrealloc(b->p, b->cap);
  }
  va_start(ap, fmt);
  vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
}

/* column IN (:column0, ...) for a NULL-terminated list (status and type are both columns
 * whose parameter name is their own: event_type is bound as :type0...). */
static void in_list(sqlbuf_t *b, const char *name, const char *const *list)
{
  if (!list[0]) return;
  add(b, " AND %s IN (", strcmp(name, "type") == 0 ? "event_type" : name);
  for (int i = 0; i < 8 && list[i]; i++) add(b, "%s:%s%d", i ? ", " : "", name, i);
  add(b, ")");
}

static void where(sqlbuf_t *b, const nh_event_filter_t *f)
{
  add(b, " WHERE 1");
  if (f->status) add(b, " AND status = :status");
  in_list(b, "status", f->status_in);
  if (f->endpoint) add(b, " AND endpoint = :endpoint");
  if (f->session) add(b, " AND session_id = :session");
  if (f->type) add(b, " AND event_type = :type");
  in_list(b, "type", f->type_in);
  if (f->event_id) add(b, " AND event_id = :event_id");
  if (f->payload) add(b, " AND instr(payload, :payload) > 0");
  if (f->group) add(b, " AND fail_group = :group");
  /* LIKE is case-insensitive for ASCII, as strcasestr in nh_event_filter_match, and reads
   * the text in place (lower() copied every error text: 39 ms against 26 over 100,000) */
  if (f->error) add(b, " AND error_text LIKE :error ESCAPE '\\'");
  if (f->since_ms) add(b, " AND updated_at >= :since");
  if (f->before_ms) add(b, " AND updated_at < :before");
  if (f->cutoff_ms) add(b, " AND updated_at <= :cutoff");
  if (f->after_rowid) add(b, f->desc ? " AND rowid < :after_rowid" : " AND rowid > :after_rowid");
  if (f->rowid_to) add(b, " AND rowid > :rowid_from AND rowid <= :rowid_to");
  for (int i = 0; i < 4 && f->not_status[i]; i++) add(b, " AND status <> :not%d", i);
  if (f->need_payload) add(b, " AND payload IS NOT NULL");
  if (f->without_request)
    add(b, " AND NOT EXISTS (SELECT 1 FROM operator_pending p WHERE p.event_id = audit.event_id"
           " AND p.endpoint = audit.endpoint)");
}

char *nh_store_events_sql(const nh_event_filter_t *f, int count)
{
  sqlbuf_t b = { 0 };
  if (count == 2) {   /* how many match, up to :limit */
    add(&b, "SELECT count(*) FROM (SELECT 1 FROM audit");
    where(&b, f);
    add(&b, " LIMIT :limit)");
  } else if (count) {
    add(&b, "SELECT count(*) FROM audit");
    where(&b, f);
  } else if (f->batch > 0 && f->page && (f->status || f->status_in[0])) {
    /* A reader's page filtered by status: the rowids come from the status index (it
     * covers the filters) and only the page's rows are read. Ordered by rowid, sqlite
     * would rather walk the whole table in that order: 100 ms for the newest 100 of
     * 100,000 Failed events among 1,000,000, against 16 ms this way. */
    add(&b, "SELECT " NH_AUDIT_COLS ", rowid AS rid FROM audit WHERE rowid IN (SELECT rowid FROM audit");
    where(&b, f);
    add(&b, f->desc ? " ORDER BY +rowid DESC LIMIT :batch)" : " ORDER BY +rowid LIMIT :batch)");
    add(&b, f->desc ? " ORDER BY rowid DESC" : " ORDER BY rowid");
  } else if (f->batch > 0) {
    add(&b, "SELECT " NH_AUDIT_COLS ", rowid AS rid FROM audit");
    where(&b, f);
    add(&b, f->desc ? " ORDER BY rowid DESC LIMIT :batch" : " ORDER BY rowid LIMIT :batch");
  } else if (f->limit > 0) {
    /* the newest N, printed oldest first */
    add(&b, "SELECT * FROM (SELECT " NH_AUDIT_COLS ", rowid AS rid FROM audit");
    where(&b, f);
    add(&b, " ORDER BY created_at DESC, rowid DESC LIMIT :limit) ORDER BY created_at, rid");
  } else {
    add(&b, "SELECT " NH_AUDIT_COLS ", rowid AS rid FROM audit");
    where(&b, f);
    add(&b, " ORDER BY created_at, rowid");
  }
  return b.p;
}

char *nh_store_like_pattern(const char *sub)
{
  size_t n = strlen(sub);
  char *pat = nh_xmalloc(2 * n + 3), *o = pat;
  *o++ = '%';
  for (size_t i = 0; i < n; i++) {
    if (sub[i] == '%' || sub[i] == '_' || sub[i] == '\\') *o++ = '\\';
    *o++ = sub[i];
  }
  *o++ = '%';
  *o = '\0';
  return pat;
}

static void bind_name(sqlite3_stmt *st, const char *name, const char *v)
{
  int i = sqlite3_bind_parameter_index(st, name);
  if (i > 0) nh_sqlite_bind_text(st, i, v);
}

static void bind_i64(sqlite3_stmt *st, const char *name, int64_t v)
{
  int i = sqlite3_bind_parameter_index(st, name);
  if (i > 0) sqlite3_bind_int64(st, i, v);
}

static sqlite3_stmt *prepare(nh_store_t *s, const nh_event_filter_t *f, int count)
{
  char *sql = nh_store_events_sql(f, count);
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(s->db, sql, -1, &st, NULL) != SQLITE_OK) {
    nh_log_error("store", "events query: %s", sqlite3_errmsg(s->db));
    free(sql);
    return NULL;
  }
  free(sql);
  bind_name(st, ":status", f->status);
  bind_name(st, ":endpoint", f->endpoint);
  bind_name(st, ":session", f->session);
  bind_name(st, ":type", f->type);
  bind_name(st, ":group", f->group);
  bind_name(st, ":event_id", f->event_id);
  bind_name(st, ":payload", f->payload);
  for (int i = 0; i < 8; i++) {
    char name[16];
    snprintf(name, sizeof name, ":status%d", i);
    bind_name(st, name, f->status_in[i]);
    snprintf(name, sizeof name, ":type%d", i);
    bind_name(st, name, f->type_in[i]);
  }
  if (f->error) {
    char *pat = nh_store_like_pattern(f->error);
    bind_name(st, ":error", pat);
    free(pat);
  }
  bind_i64(st, ":since", f->since_ms);
  bind_i64(st, ":before", f->before_ms);
  bind_i64(st, ":cutoff", f->cutoff_ms);
  bind_i64(st, ":batch", f->batch);
  bind_i64(st, ":after_rowid", f->after_rowid);
  bind_i64(st, ":rowid_from", f->rowid_from);
  bind_i64(st, ":rowid_to", f->rowid_to);
  bind_i64(st, ":limit", f->limit);
  for (int i = 0; i < 4 && f->not_status[i]; i++) {
    char name[16];
    snprintf(name, sizeof name, ":not%d", i);
    bind_name(st, name, f->not_status[i]);
  }
  return st;
}

/* A reader's page by status reads the status index (see nh_store_events_sql) unless
 * walking the table in rowid order from the cursor meets a whole page within the next
 * NH_PAGE_WALK rows: sorting the rowids of 600,000 Deferred events took 85 ms where the
 * walk took 17, and the newest 100 of 100,000 Failed events behind 300,000 Completed
 * ones took 100 ms to walk and 16 by the index. The probe walks that window only. */
#define NH_PAGE_WALK 20000

static int64_t max_rowid(nh_store_t *s)
{
  sqlite3_stmt *st = NULL;
  int64_t v = 0;
  if (sqlite3_prepare_v2(s->db, "SELECT max(rowid) FROM audit", -1, &st, NULL) == SQLITE_OK &&
      sqlite3_step(st) == SQLITE_ROW)
    v = sqlite3_column_int64(st, 0);
  sqlite3_finalize(st);
  return v;
}

static int page_walks(nh_store_t *s, const nh_event_filter_t *f)
{
  nh_event_filter_t probe = *f;
  probe.page = probe.batch = 0;
  probe.limit = f->batch;
  probe.after_rowid = 0;
  if (f->desc) {
    probe.rowid_to = f->after_rowid ? f->after_rowid - 1 : max_rowid(s);
    probe.rowid_from = probe.rowid_to - NH_PAGE_WALK;
  } else {
    probe.rowid_from = f->after_rowid;
    probe.rowid_to = f->after_rowid + NH_PAGE_WALK;
  }
  sqlite3_stmt *st = prepare(s, &probe, 2);
  if (!st) return 0;
  int walks = sqlite3_step(st) == SQLITE_ROW && sqlite3_column_int64(st, 0) >= f->batch;
  sqlite3_finalize(st);
  return walks;
}

int nh_store_events(nh_store_t *s, const nh_event_filter_t *f, nh_audit_cb cb, void *data, int64_t *last_rowid)
{
  nh_event_filter_t walk;
  if (f->page && f->batch > 0 && (f->status || f->status_in[0]) && page_walks(s, f)) {
    walk = *f;
    walk.page = 0;
    f = &walk;
  }
  sqlite3_stmt *st = prepare(s, f, 0);
  if (!st) return NH_EFAIL;
  int rc, n = 0;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    nh_audit_t a = { 0 };
    nh_store_audit_read(st, &a);
    if (last_rowid) *last_rowid = sqlite3_column_int64(st, NH_AUDIT_NCOLS);
    int stop = cb(data, &a);
    nh_audit_clear(&a);
    n++;
    if (stop) {
      rc = SQLITE_DONE;
      break;
    }
  }
  if (rc != SQLITE_DONE) nh_log_error("store", "events query: %s", sqlite3_errmsg(s->db));
  sqlite3_finalize(st);
  return rc == SQLITE_DONE ? n : NH_EFAIL;
}

int64_t nh_store_events_count(nh_store_t *s, const nh_event_filter_t *f)
{
  sqlite3_stmt *st = prepare(s, f, 1);
  if (!st) return NH_EFAIL;
  int64_t n = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int64(st, 0) : NH_EFAIL;
  if (n < 0) nh_log_error("store", "events count: %s", sqlite3_errmsg(s->db));
  sqlite3_finalize(st);
  return n;
}

const char *const nh_store_statuses[] = { NH_ST_COMPLETED, NH_ST_FAILED, NH_ST_PENDING, NH_ST_DEFERRED,
                                          NH_ST_DEADLETTERED, NH_ST_UNSUPPORTED, NH_ST_SKIPPED, NULL };

const char *nh_store_status_canon(const char *status)
{
  for (int i = 0; status && nh_store_statuses[i]; i++)
    if (strcasecmp(status, nh_store_statuses[i]) == 0) return nh_store_statuses[i];
  return NULL;
}

int nh_store_audit_list(nh_store_t *s, const char *endpoint, const char *status, const char *session,
                        nh_audit_cb cb, void *data)
{
  const char *canon = nh_store_status_canon(status);
  nh_event_filter_t f = { .endpoint = endpoint, .session = session, .status = canon ? canon : status };
  return nh_store_events(s, &f, cb, data, NULL);
}

static int eq(const char *want, const char *have) { return !want || (have && strcmp(want, have) == 0); }

static int in(const char *const *list, const char *have)
{
  if (!list[0]) return 1;
  for (int i = 0; i < 8 && list[i]; i++)
    if (have && strcmp(list[i], have) == 0) return 1;
  return 0;
}

int nh_event_filter_match(const nh_event_filter_t *f, const nh_audit_t *a)
{
  if (!eq(f->status, a->status) || !eq(f->endpoint, a->endpoint) || !eq(f->session, a->session_id) ||
      !eq(f->type, a->event_type) || !eq(f->event_id, a->event_id) || !in(f->status_in, a->status) ||
      !in(f->type_in, a->event_type))
    return 0;
  if (f->payload && (!a->payload || !memmem(a->payload, nh_audit_payload_len(a), f->payload, strlen(f->payload))))
    return 0;
  if (f->error && (!a->error_text || !strcasestr(a->error_text, f->error))) return 0;
  if (f->since_ms && a->updated_at < f->since_ms) return 0;
  if (f->before_ms && a->updated_at >= f->before_ms) return 0;
  if (f->cutoff_ms && a->updated_at > f->cutoff_ms) return 0;
  for (int i = 0; i < 4 && f->not_status[i]; i++)
    if (a->status && strcmp(a->status, f->not_status[i]) == 0) return 0;
  if (f->need_payload && !a->payload) return 0;
  if (f->group) {
    if (!nh_audit_unresolved_failure(a->status)) return 0;
    char g[NH_FAILGROUP_ID_LEN + 1];
    nh_failgroup_id(a->endpoint, a->error_type, a->error_text, g);
    if (strcmp(g, f->group) != 0) return 0;
  }
  return 1;
}

int nh_store_endpoints(nh_store_t *s, int (*cb)(void *data, const char *endpoint), void *data)
{
  /* min(endpoint) > x, one index seek per endpoint (audit_session starts with endpoint) */
  static const char *const sql =
    "WITH RECURSIVE e(x) AS (SELECT min(endpoint) FROM audit UNION ALL"
    " SELECT (SELECT min(endpoint) FROM audit WHERE endpoint > e.x) FROM e WHERE e.x IS NOT NULL)"
    " SELECT x FROM e WHERE x IS NOT NULL";
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(s->db, sql, -1, &st, NULL) != SQLITE_OK) return NH_EFAIL;
  int rc, n = 0;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    n++;
    if (cb(data, (const char *)sqlite3_column_text(st, 0))) {
      rc = SQLITE_DONE;
      break;
    }
  }
  sqlite3_finalize(st);
  return rc == SQLITE_DONE ? n : NH_EFAIL;
}

int64_t nh_store_history_last_id(nh_store_t *s)
{
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(s->db, "SELECT max(id) FROM history", -1, &st, NULL) != SQLITE_OK) return NH_EFAIL;
  int64_t id = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int64(st, 0) : NH_EFAIL;
  sqlite3_finalize(st);
  return id;
}

int nh_store_history_after(nh_store_t *s, int64_t after_id, int limit,
                           int (*cb)(void *data, const char *endpoint, const char *event_id), void *data,
                           int64_t *last)
{
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(s->db, "SELECT id, endpoint, event_id FROM history WHERE id > ?1 ORDER BY id LIMIT ?2", -1,
                         &st, NULL) != SQLITE_OK)
    return NH_EFAIL;
  sqlite3_bind_int64(st, 1, after_id);
  sqlite3_bind_int(st, 2, limit);
  int rc, n = 0;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    *last = sqlite3_column_int64(st, 0);
    n++;
    if (cb(data, (const char *)sqlite3_column_text(st, 1), (const char *)sqlite3_column_text(st, 2))) {
      rc = SQLITE_DONE;
      break;
    }
  }
  sqlite3_finalize(st);
  return rc == SQLITE_DONE ? n : NH_EFAIL;
}

/* ---- sessions ---- */

int nh_store_sessions_list(nh_store_t *s, const char *endpoint, int blocked_only, nh_session_cb cb, void *data)
{
  sqlbuf_t b = { 0 };
  add(&b, "SELECT session_id, blocked_by, draining, retry_due, next_park_seq, endpoint FROM sessions WHERE 1");
  if (endpoint) add(&b, " AND endpoint = :endpoint");
  if (blocked_only) add(&b, " AND blocked_by IS NOT NULL");
  add(&b, " ORDER BY endpoint, session_id");
  sqlite3_stmt *st = NULL;
  int rc = sqlite3_prepare_v2(s->db, b.p, -1, &st, NULL);
  free(b.p);
  if (rc != SQLITE_OK) {
    nh_log_error("store", "sessions list: %s", sqlite3_errmsg(s->db));
    s->failed = 1;
    return NH_EFAIL;
  }
  bind_name(st, ":endpoint", endpoint);
  int n = 0;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    nh_session_state_t ss = { 0 };
    nh_store_session_read(st, 1, &ss);
    int stop = cb(data, (const char *)sqlite3_column_text(st, 5), (const char *)sqlite3_column_text(st, 0), &ss);
    nh_session_state_clear(&ss);
    n++;
    if (stop) {
      rc = SQLITE_DONE;
      break;
    }
  }
  if (rc != SQLITE_DONE) {
    nh_log_error("store", "sessions list: %s", sqlite3_errmsg(s->db));
    s->failed = 1;
  }
  sqlite3_finalize(st);
  return n;
}

/* ---- failure groups ---- */

int nh_store_failgroups(nh_store_t *s, const char *endpoint, nh_failgroup_cb cb, void *data)
{
  /* One pass over the partial group index (only unresolved failures are in it), reading
   * the index alone: the rowids of each group's first and last event come with it, and
   * only those two rows are read. (min(created_at), max(updated_at) and a newest-by-
   * updated_at sample read every row of every group: 113 ms for 100,000 failures.)
   * first_seen: when the group's oldest event arrived; the sample is its newest event,
   * whose last change is last_seen. */
  sqlbuf_t b = { 0 };
  add(&b, "SELECT g.fail_group, g.endpoint, g.n, f.created_at, l.updated_at, l.event_id, l.error_type, l.error_text"
          " FROM (SELECT fail_group, endpoint, count(*) AS n, min(rowid) AS first, max(rowid) AS last"
          " FROM audit WHERE fail_group IS NOT NULL");
  if (endpoint) add(&b, " AND endpoint = :endpoint");
  add(&b, " GROUP BY fail_group, endpoint) g JOIN audit f ON f.rowid = g.first JOIN audit l ON l.rowid = g.last"
          " ORDER BY g.n DESC, g.fail_group");
  sqlite3_stmt *st = NULL;
  int rc = sqlite3_prepare_v2(s->db, b.p, -1, &st, NULL);
  free(b.p);
  if (rc != SQLITE_OK) {
    nh_log_error("store", "failure groups: %s", sqlite3_errmsg(s->db));
    sqlite3_finalize(st);
    return NH_EFAIL;
  }
  bind_name(st, ":endpoint", endpoint);
  int n = 0;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    nh_failgroup_row_t g = { 0 };
    g.group = (const char *)sqlite3_column_text(st, 0);
    g.endpoint = (const char *)sqlite3_column_text(st, 1);
    g.count = sqlite3_column_int64(st, 2);
    g.first_ms = sqlite3_column_int64(st, 3);
    g.last_ms = sqlite3_column_int64(st, 4);
    g.sample_event_id = (const char *)sqlite3_column_text(st, 5);
    g.error_type = (const char *)sqlite3_column_text(st, 6);
    g.sample_text = (const char *)sqlite3_column_text(st, 7);
    int stop = cb(data, &g);
    n++;
    if (stop) {
      rc = SQLITE_DONE;
      break;
    }
  }
  if (rc != SQLITE_DONE) nh_log_error("store", "failure groups: %s", sqlite3_errmsg(s->db));
  sqlite3_finalize(st);
  return rc == SQLITE_DONE ? n : NH_EFAIL;
}

int nh_store_failgroup_endpoint(nh_store_t *s, const char *group, char *endpoint, size_t len)
{
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(s->db, "SELECT endpoint FROM audit WHERE fail_group = ?1 LIMIT 1", -1, &st, NULL) !=
      SQLITE_OK)
    return NH_EFAIL;
  nh_sqlite_bind_text(st, 1, group);
  int rc = sqlite3_step(st);
  if (rc == SQLITE_ROW && endpoint) snprintf(endpoint, len, "%s", (const char *)sqlite3_column_text(st, 0));
  sqlite3_finalize(st);
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) return NH_EFAIL;
  return rc == SQLITE_ROW;
}

/* ---- idempotent publishing ---- */

int nh_store_published_seen(nh_store_t *s, const char *message_id, int64_t since, int64_t *at)
{
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(s->db, "SELECT at FROM published WHERE message_id = ?1", -1, &st, NULL) != SQLITE_OK)
    return NH_EFAIL;
  nh_sqlite_bind_text(st, 1, message_id);
  int rc = sqlite3_step(st);
  int64_t prev = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
  sqlite3_finalize(st);
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) return NH_EFAIL;
  if (rc == SQLITE_ROW && prev >= since) {
    if (at) *at = prev;
    return 1;
  }
  return 0;
}

int nh_store_published_claim(nh_store_t *s, const char *message_id, int64_t now, int64_t since, int64_t *at)
{
  int seen = nh_store_published_seen(s, message_id, since, at);
  if (seen) return seen == 1 ? 0 : NH_EFAIL;
  sqlite3_stmt *st = NULL;
  int rc;
  if (sqlite3_prepare_v2(s->db, "INSERT OR REPLACE INTO published(message_id, at) VALUES (?1, ?2)", -1, &st, NULL) !=
      SQLITE_OK)
    return NH_EFAIL;
  nh_sqlite_bind_text(st, 1, message_id);
  sqlite3_bind_int64(st, 2, now);
  rc = nh_sqlite_step_done(s->db, st, "published claim");
  sqlite3_finalize(st);
  if (rc) s->failed = 1;
  return rc ? NH_EFAIL : 1;
}

/* ---- running hosts ---- */

int nh_store_host_put(nh_store_t *s, const char *owner, const char *endpoints_csv, int64_t started_at, int64_t now)
{
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(s->db, "INSERT OR REPLACE INTO hosts(owner, endpoints, started_at, seen_at) VALUES (?1,?2,?3,?4)",
                         -1, &st, NULL) != SQLITE_OK)
    return NH_EFAIL;
  nh_sqlite_bind_text(st, 1, owner);
  nh_sqlite_bind_text(st, 2, endpoints_csv);
  sqlite3_bind_int64(st, 3, started_at);
  sqlite3_bind_int64(st, 4, now);
  int rc = nh_sqlite_step_done(s->db, st, "host put");
  sqlite3_finalize(st);
  return rc;
}

int nh_store_host_del(nh_store_t *s, const char *owner)
{
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(s->db, "DELETE FROM hosts WHERE owner = ?1", -1, &st, NULL) != SQLITE_OK) return NH_EFAIL;
  nh_sqlite_bind_text(st, 1, owner);
  int rc = nh_sqlite_step_done(s->db, st, "host delete");
  sqlite3_finalize(st);
  return rc;
}

int nh_store_hosts_serving(nh_store_t *s, const char *endpoint, int64_t since)
{
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(s->db, "SELECT owner FROM hosts WHERE seen_at >= ?2 AND instr(endpoints, ',' || ?1 || ',') > 0",
                         -1, &st, NULL) != SQLITE_OK)
    return NH_EFAIL;
  nh_sqlite_bind_text(st, 1, endpoint);
  sqlite3_bind_int64(st, 2, since);
  int n = 0, rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW)
    if (!nh_owner_dead((const char *)sqlite3_column_text(st, 0))) n++;
  sqlite3_finalize(st);
  return rc == SQLITE_DONE ? n : NH_EFAIL;
}

/* ---- bulk runs ---- */

int nh_store_bulk_get(nh_store_t *s, const char *key, nh_bulk_run_t *out)
{
  memset(out, 0, sizeof *out);
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(s->db, "SELECT cutoff, started_at, owner, queued FROM bulk_runs WHERE key = ?1", -1, &st,
                         NULL) != SQLITE_OK)
    return NH_EFAIL;
  nh_sqlite_bind_text(st, 1, key);
  int rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) {
    out->cutoff_ms = sqlite3_column_int64(st, 0);
    out->started_ms = sqlite3_column_int64(st, 1);
    out->owner = nh_sqlite_col_strdup(st, 2);
    out->queued = sqlite3_column_int64(st, 3);
  }
  sqlite3_finalize(st);
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) return NH_EFAIL;
  return rc == SQLITE_ROW;
}

static int exec_bound(nh_store_t *s, const char *sql, const char *key, const nh_bulk_run_t *run)
{
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(s->db, sql, -1, &st, NULL) != SQLITE_OK) {
    nh_log_error("store", "bulk run: %s", sqlite3_errmsg(s->db));
    s->failed = 1;
    return NH_EFAIL;
  }
  nh_sqlite_bind_text(st, 1, key);
  if (run) {
    sqlite3_bind_int64(st, 2, run->cutoff_ms);
    sqlite3_bind_int64(st, 3, run->started_ms);
    nh_sqlite_bind_text(st, 4, run->owner);
    sqlite3_bind_int64(st, 5, run->queued);
  }
  int rc = nh_sqlite_step_done(s->db, st, "bulk run");
  sqlite3_finalize(st);
  if (rc) s->failed = 1;
  return rc;
}

int nh_store_bulk_put(nh_store_t *s, const char *key, const nh_bulk_run_t *run)
{
  return exec_bound(s, "INSERT OR REPLACE INTO bulk_runs(key, cutoff, started_at, owner, queued)"
                       " VALUES (?1, ?2, ?3, ?4, ?5)", key, run);
}

int nh_store_bulk_done(nh_store_t *s, const char *key)
{
  return exec_bound(s, "DELETE FROM bulk_runs WHERE key = ?1", key, NULL);
}

/* ---- retention ---- */

struct names {
  char **v;
  int n;
};

static int collect_name(void *data, const char *name)
{
  struct names *ns = data;
  ns->v = nh_xrealloc(ns->v, sizeof *ns->v * (size_t)(ns->n + 1));
  ns->v[ns->n++] = nh_xstrdup(name);
  return 0;
}

/* Resolved: nothing left for anyone to do. DeadLettered stays until an operator skips
 * it (then it is Skipped); Failed, Pending and Deferred are the work of the outage. */
static const char *const resolved[] = { NH_ST_COMPLETED, NH_ST_SKIPPED, NH_ST_UNSUPPORTED, NULL };

struct purge_ctx {
  nh_store_t *s;
  int64_t before;
  int max, deleted;
  sqlite3_stmt *pick, *del_audit, *del_hist;
  int failed;
};

/* One endpoint: the oldest resolved rows first, through audit_status
 * (status, endpoint, updated_at), so each batch reads only what it deletes. */
static int purge_endpoint(void *data, const char *endpoint)
{
  struct purge_ctx *c = data;
  for (int i = 0; resolved[i] && c->deleted < c->max && !c->failed; i++) {
    nh_sqlite_bind_text(c->pick, 1, resolved[i]);
    nh_sqlite_bind_text(c->pick, 2, endpoint);
    sqlite3_bind_int64(c->pick, 3, c->before);
    sqlite3_bind_int(c->pick, 4, c->max - c->deleted);
    int64_t rowids[1000];
    char *eids[1000];
    int n = 0, rc;
    while (n < 1000 && (rc = sqlite3_step(c->pick)) == SQLITE_ROW) {
      rowids[n] = sqlite3_column_int64(c->pick, 0);
      eids[n++] = nh_sqlite_col_strdup(c->pick, 1);
    }
    sqlite3_reset(c->pick);
    for (int k = 0; k < n; k++) {
      nh_sqlite_bind_text(c->del_hist, 1, eids[k]);
      nh_sqlite_bind_text(c->del_hist, 2, endpoint);
      if (nh_sqlite_step_done(c->s->db, c->del_hist, "purge history")) c->failed = 1;
      sqlite3_bind_int64(c->del_audit, 1, rowids[k]);
      if (nh_sqlite_step_done(c->s->db, c->del_audit, "purge audit")) c->failed = 1;
      free(eids[k]);
    }
    c->deleted += n;
    if (n == 0) continue;
  }
  return c->deleted >= c->max || c->failed;
}

static int exec_count(nh_store_t *s, const char *sql, int64_t before, int64_t *out)
{
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(s->db, sql, -1, &st, NULL) != SQLITE_OK) return NH_EFAIL;
  sqlite3_bind_int64(st, 1, before);
  int rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) *out += sqlite3_column_int64(st, 0);
  else if (rc != SQLITE_DONE) *out = -1;
  if (strncmp(sql, "DELETE", 6) == 0 && rc == SQLITE_DONE) *out += sqlite3_changes(s->db);
  sqlite3_finalize(st);
  return rc == SQLITE_ROW || rc == SQLITE_DONE ? NH_OK : NH_EFAIL;
}

int nh_store_purge(nh_store_t *s, int64_t resolved_before, int64_t inbox_before, int max_rows,
                   nh_purge_counts_t *counts)
{
  struct purge_ctx c = { .s = s, .before = resolved_before, .max = max_rows };
  int rc = NH_OK;
  if (resolved_before > 0) {
    if (sqlite3_prepare_v2(s->db,
                           "SELECT rowid, event_id FROM audit a WHERE status = ?1 AND endpoint = ?2 AND updated_at < ?3"
                           " AND NOT EXISTS (SELECT 1 FROM operator_pending p WHERE p.event_id = a.event_id"
                           " AND p.endpoint = a.endpoint) ORDER BY updated_at LIMIT ?4",
                           -1, &c.pick, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(s->db, "DELETE FROM audit WHERE rowid = ?1", -1, &c.del_audit, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(s->db, "DELETE FROM history WHERE event_id = ?1 AND endpoint = ?2", -1, &c.del_hist,
                           NULL) != SQLITE_OK) {
      nh_log_error("store", "purge: %s", sqlite3_errmsg(s->db));
      rc = NH_EFAIL;
    } else {
      int64_t h0 = sqlite3_total_changes64(s->db);
      /* the endpoints first: no deletes while the endpoint scan is open */
      struct names eps = { 0 };
      if (nh_store_endpoints(s, collect_name, &eps) < 0) c.failed = 1;
      for (int i = 0; i < eps.n; i++) {
        if (!c.failed && c.deleted < c.max) purge_endpoint(&c, eps.v[i]);
        free(eps.v[i]);
      }
      free(eps.v);
      if (c.failed) rc = NH_EFAIL;
      if (counts) {
        counts->events += c.deleted;
        counts->history += sqlite3_total_changes64(s->db) - h0 - c.deleted;
      }
    }
    sqlite3_finalize(c.pick);
    sqlite3_finalize(c.del_audit);
    sqlite3_finalize(c.del_hist);
  }
  int64_t inbox = 0, processed = 0;
  if (rc == NH_OK && resolved_before > 0 &&
      exec_count(s, "DELETE FROM processed WHERE (endpoint, message_id, event_id) IN"
                    " (SELECT endpoint, message_id, event_id FROM processed WHERE at < ?1 LIMIT 1000)",
                 resolved_before, &processed))
    rc = NH_EFAIL;
  int64_t dedup = 0;   /* claims past the dedup window guard nothing any more */
  if (rc == NH_OK &&
      exec_count(s, "DELETE FROM published WHERE message_id IN"
                    " (SELECT message_id FROM published WHERE at < ?1 LIMIT 1000)",
                 nh_time_now_ms() - NH_DEDUP_WINDOW_MS, &dedup))
    rc = NH_EFAIL;
  if (rc == NH_OK && inbox_before > 0 &&
      exec_count(s, "DELETE FROM inbox WHERE (endpoint, message_id) IN"
                    " (SELECT endpoint, message_id FROM inbox WHERE at < ?1 LIMIT 1000)",
                 inbox_before, &inbox))
    rc = NH_EFAIL;
  if (rc) {
    s->failed = 1;
    return NH_EFAIL;
  }
  if (counts) {
    counts->inbox += inbox;
    counts->processed += processed;
  }
  return c.deleted + (int)inbox + (int)processed;
}

struct count_ctx {
  nh_store_t *s;
  int64_t before, n;
  int failed;
};

static int count_endpoint(void *data, const char *endpoint)
{
  struct count_ctx *c = data;
  for (int i = 0; resolved[i]; i++) {
    nh_event_filter_t f = { .endpoint = endpoint, .status = resolved[i], .before_ms = c->before, .without_request = 1 };
    int64_t n = nh_store_events_count(c->s, &f);
    if (n < 0) c->failed = 1;
    else c->n += n;
  }
  return c->failed;
}

int nh_store_purge_count(nh_store_t *s, int64_t resolved_before, int64_t inbox_before, nh_purge_counts_t *counts)
{
  memset(counts, 0, sizeof *counts);
  struct count_ctx c = { .s = s, .before = resolved_before };
  if (resolved_before > 0 && (nh_store_endpoints(s, count_endpoint, &c) < 0 || c.failed)) return NH_EFAIL;
  counts->events = c.n;
  if (inbox_before > 0 && exec_count(s, "SELECT count(*) FROM inbox WHERE at < ?1", inbox_before, &counts->inbox))
    return NH_EFAIL;
  return NH_OK;
}
