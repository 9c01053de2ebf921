/* Row-level store operations. Every function resets its statement before returning
 * so cached statements never hold a read transaction open. */
#include "nh_store_int.h"
#include "core/nh_failgroup.h"
#include "core/nh_log.h"
#include "core/nh_sqlite.h"
#include "core/nh_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* every statement here is reset with its bindings cleared before its caller's strings go */
#define T(st, i, v) nh_sqlite_bind_static(st, i, v)

static sqlite3_stmt *stmt(nh_store_t *s, int id) { return s->stmt[id]; }

/* Every step goes through here: a failed read must never pass for "no row", so any
 * error marks the store failed and the open transaction (or savepoint) cannot commit. */
static int sstep(nh_store_t *s, sqlite3_stmt *st)
{
  int rc = sqlite3_step(st);
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
    if (!s->failed) nh_log_error("store", "%s", sqlite3_errmsg(s->db));
    s->failed = 1;
  }
  return rc;
}

static int done(nh_store_t *s, sqlite3_stmt *st, const char *what)
{
  int rc = nh_sqlite_step_done(s->db, st, what);
  if (rc) s->failed = 1;
  return rc;
}

static void finish(sqlite3_stmt *st)
{
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
}

/* ---- audit ---- */

int nh_audit_unresolved_failure(const char *status)
{
  return status && (strcmp(status, NH_ST_FAILED) == 0 || strcmp(status, NH_ST_DEADLETTERED) == 0);
}

int nh_audit_retrying(const nh_audit_t *a)
{
  return a->status && strcmp(a->status, NH_ST_PENDING) == 0 && a->sub_status &&
         strcmp(a->sub_status, NH_SUB_RETRYING) == 0;
}

size_t nh_audit_payload_len(const nh_audit_t *a)
{
  if (!a->payload) return 0;
  return a->payload_len ? a->payload_len : strlen(a->payload);
}

int nh_store_handoffs_due(nh_store_t *s, int64_t now, int limit, nh_audit_cb cb, void *data)
{
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(s->db,
                         "SELECT " NH_AUDIT_COLS " FROM audit WHERE status = 'Pending' AND sub_status = 'Handoff'"
                         " AND expected_by IS NOT NULL AND overdue_at IS NULL AND expected_by < ?1"
                         " ORDER BY expected_by LIMIT ?2", -1, &st, NULL) != SQLITE_OK) {
    nh_log_error("store", "overdue hand-offs: %s", sqlite3_errmsg(s->db));
    return NH_EFAIL;
  }
  sqlite3_bind_int64(st, 1, now);
  sqlite3_bind_int(st, 2, limit);
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    nh_audit_t a;
    nh_store_audit_read(st, &a);
    int stop = cb(data, &a);
    nh_audit_clear(&a);
    if (stop) break;
  }
  int ok = rc == SQLITE_ROW || rc == SQLITE_DONE;
  if (!ok) nh_log_error("store", "overdue hand-offs: %s", sqlite3_errmsg(s->db));
  sqlite3_finalize(st);
  return ok ? NH_OK : NH_EFAIL;
}

int nh_store_handoff_flag_overdue(nh_store_t *s, const char *endpoint, const char *event_id, int64_t at)
{
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(s->db, "UPDATE audit SET overdue_at = ?3 WHERE endpoint = ?1 AND event_id = ?2"
                                " AND overdue_at IS NULL AND status = 'Pending' AND sub_status = 'Handoff'",
                         -1, &st, NULL) != SQLITE_OK) {
    nh_log_error("store", "flag overdue: %s", sqlite3_errmsg(s->db));
    return NH_EFAIL;
  }
  T(st, 1, endpoint); T(st, 2, event_id);
  sqlite3_bind_int64(st, 3, at);
  int rc = sqlite3_step(st);
  sqlite3_finalize(st);
  if (rc != SQLITE_DONE) {
    s->failed = 1;
    nh_log_error("store", "flag overdue: %s", sqlite3_errmsg(s->db));
    return NH_EFAIL;
  }
  return sqlite3_changes(s->db) > 0;
}

int nh_audit_overdue(const nh_audit_t *a)
{
  return a->overdue_at && a->status && a->sub_status && strcmp(a->status, NH_ST_PENDING) == 0 &&
         strcmp(a->sub_status, "Handoff") == 0;
}

void nh_audit_clear(nh_audit_t *a)
{
  free(a->endpoint); free(a->event_id); free(a->session_id); free(a->event_type);
  free(a->status); free(a->sub_status); free(a->error_text); free(a->error_type);
  free(a->handoff_reason); free(a->external_job_id); free(a->message_id);
  free(a->correlation_id); free(a->originating_message_id); free(a->payload); free(a->result); free(a->error_stack);
  free(a->replaced_payload); free(a->traceparent);
  memset(a, 0, sizeof *a);
}

int nh_store_audit_put(nh_store_t *s, const nh_audit_t *a)
{
  sqlite3_stmt *st = stmt(s, NH_SQL_AUDIT_PUT);
  T(st, 1, a->endpoint); T(st, 2, a->event_id); T(st, 3, a->session_id); T(st, 4, a->event_type);
  T(st, 5, a->status); T(st, 6, a->sub_status); T(st, 7, a->error_text); T(st, 8, a->error_type);
  T(st, 9, a->handoff_reason); T(st, 10, a->external_job_id);
  if (a->expected_by) sqlite3_bind_int64(st, 11, a->expected_by); else sqlite3_bind_null(st, 11);
  T(st, 12, a->message_id); T(st, 13, a->correlation_id); T(st, 14, a->originating_message_id);
  sqlite3_bind_int(st, 15, a->retry_count);
  if (a->payload) sqlite3_bind_text(st, 16, a->payload, (int)nh_audit_payload_len(a), SQLITE_STATIC);
  else sqlite3_bind_null(st, 16);
  T(st, 17, a->result);
  sqlite3_bind_int64(st, 18, a->updated_at ? a->updated_at : nh_time_now_ms());
  T(st, 19, a->error_stack);
  char group[NH_FAILGROUP_ID_LEN + 1];
  if (nh_audit_unresolved_failure(a->status)) {
    nh_failgroup_id(a->endpoint, a->error_type, a->error_text, group);
    T(st, 20, group);
  } else {
    sqlite3_bind_null(st, 20);
  }
  sqlite3_bind_int(st, 21, a->attempts);
  if (a->queue_time_ms >= 0) sqlite3_bind_int64(st, 22, a->queue_time_ms); else sqlite3_bind_null(st, 22);
  if (a->processing_time_ms >= 0) sqlite3_bind_int64(st, 23, a->processing_time_ms); else sqlite3_bind_null(st, 23);
  if (a->overdue_at) sqlite3_bind_int64(st, 24, a->overdue_at); else sqlite3_bind_null(st, 24);
  T(st, 25, a->traceparent);
  return done(s, st, "audit put");
}

void nh_store_audit_read(sqlite3_stmt *st, nh_audit_t *a)
{
  memset(a, 0, sizeof *a);   /* callers pass uninitialised structs; fields not stored must be NULL */
  a->endpoint = nh_sqlite_col_strdup(st, 0);
  a->event_id = nh_sqlite_col_strdup(st, 1);
  a->session_id = nh_sqlite_col_strdup(st, 2);
  a->event_type = nh_sqlite_col_strdup(st, 3);
  a->status = nh_sqlite_col_strdup(st, 4);
  a->sub_status = nh_sqlite_col_strdup(st, 5);
  a->error_text = nh_sqlite_col_strdup(st, 6);
  a->error_type = nh_sqlite_col_strdup(st, 7);
  a->handoff_reason = nh_sqlite_col_strdup(st, 8);
  a->external_job_id = nh_sqlite_col_strdup(st, 9);
  a->expected_by = nh_sqlite_col_i64(st, 10);
  a->message_id = nh_sqlite_col_strdup(st, 11);
  a->correlation_id = nh_sqlite_col_strdup(st, 12);
  a->originating_message_id = nh_sqlite_col_strdup(st, 13);
  a->retry_count = sqlite3_column_int(st, 14);
  a->payload = nh_sqlite_col_body(st, 15, &a->payload_len);
  a->result = nh_sqlite_col_strdup(st, 16);
  a->created_at = nh_sqlite_col_i64(st, 17);
  a->updated_at = nh_sqlite_col_i64(st, 18);
  a->error_stack = nh_sqlite_col_strdup(st, 19);
  a->attempts = sqlite3_column_int(st, 20);
  a->queue_time_ms = sqlite3_column_type(st, 21) == SQLITE_NULL ? -1 : sqlite3_column_int64(st, 21);
  a->processing_time_ms = sqlite3_column_type(st, 22) == SQLITE_NULL ? -1 : sqlite3_column_int64(st, 22);
  a->overdue_at = nh_sqlite_col_i64(st, 23);
  a->traceparent = nh_sqlite_col_strdup(st, 24);
}

int nh_store_audit_get(nh_store_t *s, const char *endpoint, const char *event_id, nh_audit_t *out)
{
  sqlite3_stmt *st = stmt(s, NH_SQL_AUDIT_GET);
  T(st, 1, endpoint); T(st, 2, event_id);
  int rc = sstep(s, st);
  int found = 0;
  if (rc == SQLITE_ROW) {
    nh_store_audit_read(st, out);
    found = 1;
  } else if (rc != SQLITE_DONE) {
    nh_log_error("store", "audit get: %s", sqlite3_errmsg(s->db));
    found = NH_EFAIL;
  }
  finish(st);
  return found;
}

int nh_store_audit_find(nh_store_t *s, const char *event_id, nh_audit_t *out, nh_error_t *err)
{
  sqlite3_stmt *st = stmt(s, NH_SQL_AUDIT_FIND);
  T(st, 1, event_id);
  int rc = sstep(s, st);
  if (rc == SQLITE_ROW) {
    nh_store_audit_read(st, out);
    finish(st);
    return NH_OK;
  }
  finish(st);
  if (strlen(event_id) < 8)
    return nh_error_set(err, NH_ENOTFOUND, "no event with id %s (ids are 36 characters; a prefix needs 8 or more)",
                        event_id);
  st = stmt(s, NH_SQL_AUDIT_FIND_PREFIX);
  T(st, 1, event_id);
  int n = 0;
  while (sstep(s, st) == SQLITE_ROW) {
    if (n == 0) nh_store_audit_read(st, out);
    n++;
  }
  finish(st);
  if (n == 1) return NH_OK;
  if (n > 1) {
    nh_audit_clear(out);
    return nh_error_set(err, NH_EUSAGE, "event id prefix %s matches several events; give more characters",
                        event_id);
  }
  return nh_error_set(err, NH_ENOTFOUND, "no event with id %s in this store (see `nimbus-host events`)", event_id);
}

int nh_store_audit_retext_deferred(nh_store_t *s, const char *endpoint, const char *session, const char *text)
{
  sqlite3_stmt *st = stmt(s, NH_SQL_AUDIT_RETEXT);
  T(st, 1, endpoint); T(st, 2, session); T(st, 3, text);
  return done(s, st, "audit retext");
}

/* ---- history ---- */

int nh_store_history_add_ex(nh_store_t *s, const char *endpoint, const char *event_id, const char *message_id,
                            const char *message_type, const char *status, const char *detail,
                            const nh_history_extra_t *x)
{
  sqlite3_stmt *st = stmt(s, NH_SQL_HISTORY_ADD);
  T(st, 1, endpoint); T(st, 2, event_id); T(st, 3, message_id); T(st, 4, message_type);
  T(st, 5, status); T(st, 6, detail);
  sqlite3_bind_int64(st, 7, nh_time_now_ms());
  if (x) {
    T(st, 8, x->error_text); T(st, 9, x->error_type); T(st, 10, x->error_stack); T(st, 11, x->previous_payload);
  }
  return done(s, st, "history add");
}

int nh_store_history_add(nh_store_t *s, const char *endpoint, const char *event_id, const char *message_id,
                         const char *message_type, const char *status, const char *detail)
{
  return nh_store_history_add_ex(s, endpoint, event_id, message_id, message_type, status, detail, NULL);
}

int nh_store_history_list(nh_store_t *s, const char *endpoint, const char *event_id, nh_history_cb cb,
                          void *data)
{
  sqlite3_stmt *st = stmt(s, NH_SQL_HISTORY_LIST);
  T(st, 1, endpoint); T(st, 2, event_id);
  int n = 0;
  while (sstep(s, st) == SQLITE_ROW) {
    n++;
    nh_history_row_t r = {
      .at = sqlite3_column_int64(st, 0),
      .message_id = (const char *)sqlite3_column_text(st, 1),
      .message_type = (const char *)sqlite3_column_text(st, 2),
      .status = (const char *)sqlite3_column_text(st, 3),
      .detail = (const char *)sqlite3_column_text(st, 4),
      .error_text = (const char *)sqlite3_column_text(st, 5),
      .error_type = (const char *)sqlite3_column_text(st, 6),
      .error_stack = (const char *)sqlite3_column_text(st, 7),
      .previous_payload = (const char *)sqlite3_column_text(st, 8),
    };
    if (cb(data, &r)) break;
  }
  finish(st);
  return n;
}

/* ---- sessions ---- */

void nh_session_state_clear(nh_session_state_t *st)
{
  free(st->blocked_by);
  memset(st, 0, sizeof *st);
}

void nh_store_session_read(sqlite3_stmt *st, int col, nh_session_state_t *out)
{
  out->exists = 1;
  out->blocked_by = nh_sqlite_col_strdup(st, col);
  out->draining = sqlite3_column_int(st, col + 1);
  out->retry_due = nh_sqlite_col_i64(st, col + 2);
  out->next_park_seq = nh_sqlite_col_i64(st, col + 3);
}

int nh_store_session_get(nh_store_t *s, const char *endpoint, const char *session, nh_session_state_t *out)
{
  memset(out, 0, sizeof *out);
  out->next_park_seq = 1;
  sqlite3_stmt *st = stmt(s, NH_SQL_SESSION_GET);
  T(st, 1, endpoint); T(st, 2, session);
  int rc = sstep(s, st);
  if (rc == SQLITE_ROW) nh_store_session_read(st, 0, out);
  finish(st);
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
    nh_log_error("store", "session get: %s", sqlite3_errmsg(s->db));
    return NH_EFAIL;
  }
  return NH_OK;
}

int nh_store_session_put(nh_store_t *s, const char *endpoint, const char *session, const nh_session_state_t *in)
{
  /* A free session with nothing parked needs no row: keeps the table the size of the
   * trouble, not of the traffic. park_seq restarting at 1 is safe because nothing is parked. */
  if (!in->blocked_by && !in->draining && !in->retry_due) {
    sqlite3_stmt *st = stmt(s, NH_SQL_SESSION_DEL);
    T(st, 1, endpoint); T(st, 2, session);
    return done(s, st, "session delete");
  }
  sqlite3_stmt *st = stmt(s, NH_SQL_SESSION_PUT);
  T(st, 1, endpoint); T(st, 2, session); T(st, 3, in->blocked_by);
  sqlite3_bind_int(st, 4, in->draining);
  if (in->retry_due) sqlite3_bind_int64(st, 5, in->retry_due); else sqlite3_bind_null(st, 5);
  sqlite3_bind_int64(st, 6, in->next_park_seq > 0 ? in->next_park_seq : 1);
  return done(s, st, "session put");
}

/* Collects up to `limit` rows of `st` first: the callback writes to the store, which
 * must not happen while the statement is mid-scan over the same table. */
static int sessions_collect(nh_store_t *s, sqlite3_stmt *st, const char *endpoint, int limit, char **last,
                            nh_session_cb cb, void *data)
{
  int cap = 16, n = 0;
  char **ids = nh_xmalloc(sizeof *ids * (size_t)cap);
  nh_session_state_t *sts = nh_xmalloc(sizeof *sts * (size_t)cap);
  while (n < limit && sstep(s, st) == SQLITE_ROW) {
    if (n == cap) {
      cap *= 2;
      ids = nh_xrealloc(ids, sizeof *ids * (size_t)cap);
      sts = nh_xrealloc(sts, sizeof *sts * (size_t)cap);
    }
    ids[n] = nh_sqlite_col_strdup(st, 0);
    memset(&sts[n], 0, sizeof sts[n]);
    nh_store_session_read(st, 1, &sts[n]);
    n++;
  }
  finish(st);
  if (last && n > 0) {
    free(*last);
    *last = nh_xstrdup(ids[n - 1]);
  }
  for (int i = 0; i < n; i++) {
    cb(data, endpoint, ids[i], &sts[i]);
    free(ids[i]);
    nh_session_state_clear(&sts[i]);
  }
  free(ids);
  free(sts);
  return n;
}

int nh_store_sessions_due(nh_store_t *s, const char *endpoint, int64_t now, int limit, char **cursor,
                          nh_session_cb cb, void *data)
{
  sqlite3_stmt *st = stmt(s, NH_SQL_SESSIONS_RETRY_DUE);
  T(st, 1, endpoint);
  sqlite3_bind_int64(st, 2, now);
  sqlite3_bind_int(st, 3, limit);
  int n = sessions_collect(s, st, endpoint, limit, NULL, cb, data);
  if (n >= limit) return n;
  /* Draining sessions go round from a cursor: sessions we cannot lock (held by another
   * process, or for a transient delay) are passed over instead of filling every batch. */
  st = stmt(s, NH_SQL_SESSIONS_DRAINING);
  T(st, 1, endpoint);
  T(st, 2, cursor && *cursor ? *cursor : "");
  sqlite3_bind_int(st, 3, limit - n);
  int was_from_start = !cursor || !*cursor;
  int m = sessions_collect(s, st, endpoint, limit - n, cursor, cb, data);
  if (cursor && m < limit - n && *cursor) {
    /* reached the end: start over next time (now, if we began mid-way and have room) */
    free(*cursor);
    *cursor = NULL;
    if (!was_from_start) {
      st = stmt(s, NH_SQL_SESSIONS_DRAINING);
      T(st, 1, endpoint);
      T(st, 2, "");
      sqlite3_bind_int(st, 3, limit - n - m);
      m += sessions_collect(s, st, endpoint, limit - n - m, cursor, cb, data);
    }
  }
  return n + m;
}

/* ---- parked ---- */

int nh_store_park(nh_store_t *s, const nh_msg_t *m, int64_t park_seq)
{
  sqlite3_stmt *st = stmt(s, NH_SQL_PARK);
  T(st, 1, m->endpoint); T(st, 2, m->session_id);
  sqlite3_bind_int64(st, 3, park_seq);
  T(st, 4, m->message_id); T(st, 5, m->event_id); T(st, 6, m->event_type);
  T(st, 7, nh_msg_type_name(m->type)); T(st, 8, m->correlation_id);
  T(st, 9, m->originating_message_id); T(st, 10, m->parent_message_id); T(st, 11, m->from);
  sqlite3_bind_int(st, 12, m->retry_count);
  sqlite3_bind_int64(st, 13, m->enqueued_at);
  if (m->body) sqlite3_bind_text(st, 14, m->body, (int)m->body_len, SQLITE_STATIC);
  else sqlite3_bind_null(st, 14);
  T(st, 15, m->error_text); T(st, 16, m->error_type); T(st, 17, m->reply_to);
  T(st, 18, m->traceparent); T(st, 19, m->tracestate);
  return done(s, st, "park");
}

/* A row of PARKED_HEAD or PARKED_WINDOW. */
static void parked_row(sqlite3_stmt *st, const char *endpoint, const char *session, nh_msg_t *m, int64_t *park_seq)
{
  memset(m, 0, sizeof *m);
  *park_seq = sqlite3_column_int64(st, 0);
  m->endpoint = nh_xstrdup(endpoint);
  m->session_id = nh_xstrdup(session);
  m->message_id = nh_sqlite_col_strdup(st, 1);
  m->event_id = nh_sqlite_col_strdup(st, 2);
  m->event_type = nh_sqlite_col_strdup(st, 3);
  m->type = nh_msg_type_parse((const char *)sqlite3_column_text(st, 4));
  m->correlation_id = nh_sqlite_col_strdup(st, 5);
  m->originating_message_id = nh_sqlite_col_strdup(st, 6);
  m->parent_message_id = nh_sqlite_col_strdup(st, 7);
  m->from = nh_sqlite_col_strdup(st, 8);
  m->retry_count = sqlite3_column_int(st, 9);
  m->enqueued_at = sqlite3_column_int64(st, 10);
  m->body = nh_sqlite_col_body(st, 11, &m->body_len);
  m->error_text = nh_sqlite_col_strdup(st, 12);
  m->error_type = nh_sqlite_col_strdup(st, 13);
  m->reply_to = nh_sqlite_col_strdup(st, 14);
  m->traceparent = nh_sqlite_col_strdup(st, 15);
  m->tracestate = nh_sqlite_col_strdup(st, 16);
}

int nh_store_parked_head(nh_store_t *s, const char *endpoint, const char *session, nh_msg_t *m, int64_t *park_seq)
{
  sqlite3_stmt *st = stmt(s, NH_SQL_PARKED_HEAD);
  T(st, 1, endpoint); T(st, 2, session);
  int found = 0;
  if (sstep(s, st) == SQLITE_ROW) {
    parked_row(st, endpoint, session, m, park_seq);
    found = 1;
  }
  finish(st);
  return found;
}

int nh_store_parked_window(nh_store_t *s, const char *endpoint, const char *session, int64_t after, int limit,
                           nh_msg_t *out, int64_t *park_seqs)
{
  sqlite3_stmt *st = stmt(s, NH_SQL_PARKED_WINDOW);
  T(st, 1, endpoint); T(st, 2, session);
  sqlite3_bind_int64(st, 3, after);
  sqlite3_bind_int(st, 4, limit);
  int n = 0, rc;
  while (n < limit && (rc = sstep(s, st)) == SQLITE_ROW) {
    parked_row(st, endpoint, session, &out[n], &park_seqs[n]);
    n++;
  }
  finish(st);
  if (n < limit && rc != SQLITE_DONE) {
    for (int i = 0; i < n; i++) nh_msg_clear(&out[i]);
    nh_log_error("store", "parked window: %s", sqlite3_errmsg(s->db));
    return NH_EFAIL;
  }
  return n;
}

int nh_store_parked_count_event(nh_store_t *s, const char *endpoint, const char *event_id)
{
  sqlite3_stmt *st = stmt(s, NH_SQL_PARKED_COUNT_EVENT);
  T(st, 1, endpoint); T(st, 2, event_id);
  int rc = sstep(s, st);
  int n = rc == SQLITE_ROW ? sqlite3_column_int(st, 0) : NH_EFAIL;
  finish(st);
  return n;
}

int nh_store_parked_delete(nh_store_t *s, const char *endpoint, const char *session, int64_t park_seq)
{
  sqlite3_stmt *st = stmt(s, NH_SQL_PARKED_DEL);
  T(st, 1, endpoint); T(st, 2, session);
  sqlite3_bind_int64(st, 3, park_seq);
  return done(s, st, "parked delete");
}

int nh_store_parked_delete_event(nh_store_t *s, const char *endpoint, const char *event_id)
{
  sqlite3_stmt *st = stmt(s, NH_SQL_PARKED_DEL_EVENT);
  T(st, 1, endpoint); T(st, 2, event_id);
  if (done(s, st, "parked delete event")) return NH_EFAIL;
  return sqlite3_changes(s->db);
}

int nh_store_parked_any(nh_store_t *s, const char *endpoint, const char *session)
{
  sqlite3_stmt *st = stmt(s, NH_SQL_PARKED_ANY);
  T(st, 1, endpoint); T(st, 2, session);
  int rc = sstep(s, st);
  finish(st);
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) return NH_EFAIL;
  return rc == SQLITE_ROW;
}

int nh_store_parked_count(nh_store_t *s, const char *endpoint, const char *session)
{
  sqlite3_stmt *st = stmt(s, NH_SQL_PARKED_COUNT);
  T(st, 1, endpoint); T(st, 2, session);
  int n = 0;
  if (sstep(s, st) == SQLITE_ROW) n = sqlite3_column_int(st, 0);
  finish(st);
  return n;
}

/* ---- inbox / processed / operator log ---- */

static int exists2(nh_store_t *s, int id, const char *a, const char *b, const char *c)
{
  sqlite3_stmt *st = stmt(s, id);
  T(st, 1, a); T(st, 2, b);
  if (c) T(st, 3, c);
  int found = sstep(s, st) == SQLITE_ROW;
  finish(st);
  return found;
}

int nh_store_inbox_has(nh_store_t *s, const char *endpoint, const char *message_id)
{
  return exists2(s, NH_SQL_INBOX_HAS, endpoint, message_id, NULL);
}

int nh_store_inbox_add(nh_store_t *s, const char *endpoint, const char *message_id)
{
  sqlite3_stmt *st = stmt(s, NH_SQL_INBOX_ADD);
  T(st, 1, endpoint); T(st, 2, message_id);
  sqlite3_bind_int64(st, 3, nh_time_now_ms());
  return done(s, st, "inbox add");
}

int nh_store_processed_has(nh_store_t *s, const char *endpoint, const char *message_id, const char *event_id)
{
  return exists2(s, NH_SQL_PROCESSED_HAS, endpoint, message_id, event_id);
}

int nh_store_oppending_add(nh_store_t *s, const char *message_id, const char *endpoint, const char *event_id,
                           const char *action, const char *expected_status)
{
  sqlite3_stmt *st = stmt(s, NH_SQL_OPPENDING_ADD);
  T(st, 1, message_id); T(st, 2, endpoint); T(st, 3, event_id); T(st, 4, action); T(st, 5, expected_status);
  sqlite3_bind_int64(st, 6, nh_time_now_ms());
  return done(s, st, "operator pending add");
}

int nh_store_oppending_has(nh_store_t *s, const char *endpoint, const char *event_id)
{
  return exists2(s, NH_SQL_OPPENDING_HAS, endpoint, event_id, NULL);
}

int nh_store_oppending_get(nh_store_t *s, const char *message_id, char **expected_status)
{
  *expected_status = NULL;
  sqlite3_stmt *st = stmt(s, NH_SQL_OPPENDING_GET);
  T(st, 1, message_id);
  int rc = sstep(s, st);
  if (rc == SQLITE_ROW) *expected_status = nh_sqlite_col_strdup(st, 0);
  finish(st);
  return rc == SQLITE_ROW ? 1 : rc == SQLITE_DONE ? 0 : NH_EFAIL;
}

int nh_store_oppending_take(nh_store_t *s, const char *message_id, char **expected_status)
{
  int found = nh_store_oppending_get(s, message_id, expected_status);
  if (found != 1) return 0;   /* an error is in the store's failed state, as it was */
  sqlite3_stmt *st = stmt(s, NH_SQL_OPPENDING_DONE);
  T(st, 1, message_id);
  return done(s, st, "operator pending done") ? NH_EFAIL : 1;
}

int nh_store_oplog_add(nh_store_t *s, const char *actor, const char *action, const char *endpoint,
                       const char *event_id, const char *session, const char *detail)
{
  sqlite3_stmt *st = stmt(s, NH_SQL_OPLOG_ADD);
  sqlite3_bind_int64(st, 1, nh_time_now_ms());
  if (!actor) actor = getenv("USER");
  T(st, 2, actor ? actor : "operator");
  T(st, 3, action); T(st, 4, endpoint); T(st, 5, event_id); T(st, 6, session); T(st, 7, detail);
  return done(s, st, "operator log add");
}
