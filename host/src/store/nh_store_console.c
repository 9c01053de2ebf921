/* What the operator console reads beyond the event queries (nh_store.h, "console"):
 * per-endpoint figures for the overview, the blocked sessions with their blockers, and
 * an event's operator log. Read-only; each statement is prepared per call (they run per
 * page view, not per message). */
#include "nh_store_int.h"
#include "core/nh_log.h"
#include "core/nh_sqlite.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static sqlite3_stmt *prep(nh_store_t *s, const char *sql, const char *what)
{
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(s->db, sql, -1, &st, NULL) != SQLITE_OK) {
    nh_log_error("store", "%s: %s", what, sqlite3_errmsg(s->db));
    return NULL;
  }
  return st;
}

static int64_t count1(nh_store_t *s, const char *sql, const char *endpoint, int64_t now, const char *what)
{
  sqlite3_stmt *st = prep(s, sql, what);
  if (!st) return NH_EFAIL;
  nh_sqlite_bind_text(st, 1, endpoint);
  if (sqlite3_bind_parameter_count(st) > 1) sqlite3_bind_int64(st, 2, now);
  int64_t n = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int64(st, 0) : NH_EFAIL;
  if (n < 0) nh_log_error("store", "%s: %s", what, sqlite3_errmsg(s->db));
  sqlite3_finalize(st);
  return n;
}

int nh_store_endpoint_stats(nh_store_t *s, const char *endpoint, int64_t now, nh_endpoint_stats_t *out)
{
  memset(out, 0, sizeof *out);
  /* the primary key of sessions starts with the endpoint; audit_status is (status, endpoint) */
  out->blocked_sessions =
    count1(s, "SELECT count(*) FROM sessions WHERE endpoint = ?1 AND blocked_by IS NOT NULL", endpoint, 0,
           "blocked sessions");
  out->handoffs_pending =
    count1(s, "SELECT count(*) FROM audit WHERE status = 'Pending' AND endpoint = ?1 AND sub_status = 'Handoff'",
           endpoint, 0, "pending hand-offs");
  out->handoffs_overdue =
    count1(s, "SELECT count(*) FROM audit WHERE status = 'Pending' AND endpoint = ?1 AND sub_status = 'Handoff'"
              " AND expected_by IS NOT NULL AND expected_by < ?2", endpoint, now, "overdue hand-offs");
  return out->blocked_sessions < 0 || out->handoffs_pending < 0 || out->handoffs_overdue < 0 ? NH_EFAIL : NH_OK;
}

int64_t nh_store_endpoint_parked(nh_store_t *s, const char *endpoint)
{
  return count1(s, "SELECT count(*) FROM parked WHERE endpoint = ?1", endpoint, 0, "parked events");
}

int nh_store_blocked_sessions(nh_store_t *s, const char *endpoint, const char *after_endpoint,
                              const char *after_session, int limit, nh_blocked_cb cb, void *data)
{
  char sql[1024];
  snprintf(sql, sizeof sql,
           "SELECT s.endpoint, s.session_id, s.blocked_by, s.retry_due, a.status, a.sub_status, a.event_type,"
           " a.error_text, a.updated_at, a.handoff_reason,"
           " (SELECT count(*) FROM parked p WHERE p.endpoint = s.endpoint AND p.session_id = s.session_id)"
           " FROM sessions s LEFT JOIN audit a ON a.event_id = s.blocked_by AND a.endpoint = s.endpoint"
           " WHERE s.blocked_by IS NOT NULL%s%s ORDER BY s.endpoint, s.session_id LIMIT ?4",
           endpoint ? " AND s.endpoint = ?1" : "",
           after_session ? " AND (s.endpoint, s.session_id) > (?2, ?3)" : "");
  sqlite3_stmt *st = prep(s, sql, "blocked sessions");
  if (!st) return NH_EFAIL;
  if (endpoint) nh_sqlite_bind_text(st, 1, endpoint);
  if (after_session) {
    nh_sqlite_bind_text(st, 2, after_endpoint ? after_endpoint : "");
    nh_sqlite_bind_text(st, 3, after_session);
  }
  sqlite3_bind_int(st, 4, limit);
  int rc, n = 0;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    nh_blocked_row_t r = {
      .endpoint = (const char *)sqlite3_column_text(st, 0),
      .session_id = (const char *)sqlite3_column_text(st, 1),
      .blocked_by = (const char *)sqlite3_column_text(st, 2),
      .retry_due = sqlite3_column_int64(st, 3),
      .status = (const char *)sqlite3_column_text(st, 4),
      .sub_status = (const char *)sqlite3_column_text(st, 5),
      .event_type = (const char *)sqlite3_column_text(st, 6),
      .error_text = (const char *)sqlite3_column_text(st, 7),
      .since = sqlite3_column_int64(st, 8),
      .handoff_reason = (const char *)sqlite3_column_text(st, 9),
      .parked = sqlite3_column_int64(st, 10),
    };
    n++;
    if (cb(data, &r)) {
      rc = SQLITE_DONE;
      break;
    }
  }
  if (rc != SQLITE_DONE) nh_log_error("store", "blocked sessions: %s", sqlite3_errmsg(s->db));
  sqlite3_finalize(st);
  return rc == SQLITE_DONE ? n : NH_EFAIL;
}

int nh_store_oplog_list(nh_store_t *s, const char *endpoint, const char *event_id, nh_oplog_cb cb, void *data)
{
  /* no index on event_id: the log is small (one row per action, bulk runs one row each) */
  sqlite3_stmt *st = prep(s, "SELECT at, actor, action, detail FROM operator_log"
                             " WHERE event_id = ?1 AND endpoint = ?2 ORDER BY id", "operator log");
  if (!st) return NH_EFAIL;
  nh_sqlite_bind_text(st, 1, event_id);
  nh_sqlite_bind_text(st, 2, endpoint);
  int rc, n = 0;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    nh_oplog_row_t r = { .at = sqlite3_column_int64(st, 0),
                         .actor = (const char *)sqlite3_column_text(st, 1),
                         .action = (const char *)sqlite3_column_text(st, 2),
                         .detail = (const char *)sqlite3_column_text(st, 3) };
    n++;
    if (cb(data, &r)) {
      rc = SQLITE_DONE;
      break;
    }
  }
  if (rc != SQLITE_DONE) nh_log_error("store", "operator log: %s", sqlite3_errmsg(s->db));
  sqlite3_finalize(st);
  return rc == SQLITE_DONE ? n : NH_EFAIL;
}
