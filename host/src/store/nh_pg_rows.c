/* The nh_store_* row functions on PostgreSQL, blocking: each builds its operation's
 * arguments (nh_pg_ops.c), runs it (nh_pg_db_run: one round trip) and reads the result
 * back into the store's structs. What each returns, and on which error, is its sqlite
 * twin's (nh_store_rows.c, nh_store_query.c): a "has" that fails answers 0 and marks the
 * db failed, as sqlite's marks the store. */
#include "nh_pg_ops.h"
#include "core/nh_log.h"
#include "core/nh_util.h"

#include <stdlib.h>
#include <string.h>

/* Every statement goes through here: a failure is logged and marks the db failed, so a
 * caller's transaction can refuse to commit on it (as sqlite's sstep does). */
static int op_run(nh_pg_db_t *db, nh_pgop_t op, nh_pg_args_t *a, PGresult **res)
{
  nh_error_t err = { 0 };
  int rc = nh_pg_db_run(db, op, a, res, &err);
  if (rc) {
    nh_log_error("store", "%s", err.msg);
    nh_pg_db_set_failed(db, &err);
  }
  return rc;
}

/* A statement run for its effect: NH_OK or NH_EFAIL. */
static int done(nh_pg_db_t *db, nh_pgop_t op, nh_pg_args_t *a)
{
  return op_run(db, op, a, NULL) ? NH_EFAIL : NH_OK;
}

/* A statement asking whether a row exists: 1 or 0 (0 too when it failed: db marked). */
static int exists(nh_pg_db_t *db, nh_pgop_t op, nh_pg_args_t *a)
{
  PGresult *r = NULL;
  if (op_run(db, op, a, &r)) return 0;
  int found = PQntuples(r) > 0;
  PQclear(r);
  return found;
}

/* ---- audit ---- */

int nh_pgs_audit_put(nh_pg_db_t *db, const nh_audit_t *au)
{
  nh_pg_args_t a;
  return done(db, nh_pgargs_audit_put(&a, au), &a);
}

int nh_pgs_audit_get(nh_pg_db_t *db, const char *endpoint, const char *event_id, nh_audit_t *out)
{
  nh_pg_args_t a;
  PGresult *r = NULL;
  if (op_run(db, nh_pgargs_audit_get(&a, endpoint, event_id), &a, &r)) return NH_EFAIL;
  int found = PQntuples(r) > 0;
  if (found) nh_pgrow_audit(r, 0, out);
  PQclear(r);
  return found;
}

/* An id that is not UTF-8 (a binary AMQP id made an event id) is looked up as it was
 * written: escaped by the builders (nh_pg_ops.c), so it is found as sqlite finds it. */
int nh_pgs_audit_find(nh_pg_db_t *db, const char *event_id, nh_audit_t *out, nh_error_t *err)
{
  nh_pg_args_t a;
  PGresult *r = NULL;
  if (op_run(db, nh_pgargs_audit_find(&a, event_id), &a, &r))
    return nh_error_set(err, NH_EFAIL, "%s", nh_pg_db_error(db)->msg);
  int found = PQntuples(r) > 0;
  if (found) nh_pgrow_audit(r, 0, out);
  PQclear(r);
  if (found) return NH_OK;
  if (strlen(event_id) < 8)
    return nh_error_set(err, NH_ENOTFOUND, "no event with id %s (ids are 36 characters; a prefix needs 8 or more)",
                        event_id);
  if (op_run(db, nh_pgargs_audit_find_prefix(&a, event_id), &a, &r))
    return nh_error_set(err, NH_EFAIL, "%s", nh_pg_db_error(db)->msg);
  int n = PQntuples(r);
  if (n == 1) nh_pgrow_audit(r, 0, out);
  PQclear(r);
  if (n == 1) return NH_OK;
  if (n > 1)
    return nh_error_set(err, NH_EUSAGE, "event id prefix %s matches several events; give more characters",
                        event_id);
  return nh_error_set(err, NH_ENOTFOUND, "no event with id %s in this store (see `nimbus-host events`)", event_id);
}

int nh_pgs_audit_retext_deferred(nh_pg_db_t *db, const char *endpoint, const char *session, const char *text)
{
  nh_pg_args_t a;
  return done(db, nh_pgargs_audit_retext(&a, endpoint, session, text), &a);
}

int nh_pgs_handoffs_due(nh_pg_db_t *db, int64_t now, int limit, nh_audit_cb cb, void *data)
{
  nh_pg_args_t a;
  PGresult *r = NULL;
  if (op_run(db, nh_pgargs_handoffs_due(&a, now, limit), &a, &r)) return NH_EFAIL;
  for (int i = 0; i < PQntuples(r); i++) {
    nh_audit_t au;
    nh_pgrow_audit(r, i, &au);
    int stop = cb(data, &au);
    nh_audit_clear(&au);
    if (stop) break;
  }
  PQclear(r);
  return NH_OK;
}

int nh_pgs_handoff_flag_overdue(nh_pg_db_t *db, const char *endpoint, const char *event_id, int64_t at)
{
  nh_pg_args_t a;
  PGresult *r = NULL;
  if (op_run(db, nh_pgargs_handoff_flag_overdue(&a, endpoint, event_id, at), &a, &r)) return NH_EFAIL;
  int n = nh_pg_affected(r);
  PQclear(r);
  return n > 0;
}

/* ---- history ---- */

int nh_pgs_history_add_ex(nh_pg_db_t *db, const char *endpoint, const char *event_id, const char *message_id,
                          const char *message_type, const char *status, const char *detail,
                          const nh_history_extra_t *x)
{
  nh_pg_args_t a;
  return done(db, nh_pgargs_history_add(&a, endpoint, event_id, message_id, message_type, status, detail, x), &a);
}

int nh_pgs_history_add(nh_pg_db_t *db, const char *endpoint, const char *event_id, const char *message_id,
                       const char *message_type, const char *status, const char *detail)
{
  return nh_pgs_history_add_ex(db, endpoint, event_id, message_id, message_type, status, detail, NULL);
}

int nh_pgs_history_list(nh_pg_db_t *db, const char *endpoint, const char *event_id, nh_history_cb cb, void *data)
{
  nh_pg_args_t a;
  PGresult *r = NULL;
  if (op_run(db, nh_pgargs_history_list(&a, endpoint, event_id), &a, &r)) return 0;
  int n = 0;
  for (int i = 0; i < PQntuples(r); i++) {
    nh_history_row_t h;
    nh_pgrow_history(r, i, &h);
    n++;
    if (cb(data, &h)) break;
  }
  PQclear(r);
  return n;
}

/* ---- sessions ---- */

int nh_pgs_session_get(nh_pg_db_t *db, const char *endpoint, const char *session, nh_session_state_t *out)
{
  memset(out, 0, sizeof *out);
  out->next_park_seq = 1;
  nh_pg_args_t a;
  PGresult *r = NULL;
  if (op_run(db, nh_pgargs_session_get(&a, endpoint, session), &a, &r)) return NH_EFAIL;
  if (PQntuples(r) > 0) nh_pgrow_session(r, 0, 0, out);
  PQclear(r);
  return NH_OK;
}

int nh_pgs_session_put(nh_pg_db_t *db, const char *endpoint, const char *session, const nh_session_state_t *st)
{
  nh_pg_args_t a;
  return done(db, nh_pgargs_session_put(&a, endpoint, session, st), &a);
}

/* Up to `limit` sessions of the result to cb; the last one's id into *last (if given). */
static int sessions_collect(nh_pg_db_t *db, nh_pgop_t op, nh_pg_args_t *a, const char *endpoint, int limit,
                            char **last, nh_session_cb cb, void *data)
{
  PGresult *r = NULL;
  if (op_run(db, op, a, &r)) return 0;
  int n = PQntuples(r) < limit ? PQntuples(r) : limit;
  if (last && n > 0) {
    free(*last);
    *last = nh_pg_col_strdup(r, n - 1, 0);
  }
  for (int i = 0; i < n; i++) {
    nh_session_state_t st = { 0 };
    nh_pgrow_session(r, i, 1, &st);
    cb(data, endpoint, nh_pg_col_text(r, i, 0), &st);
    nh_session_state_clear(&st);
  }
  PQclear(r);
  return n;
}

/* nh_store_sessions_due's order and cursor, step for step. */
int nh_pgs_sessions_due(nh_pg_db_t *db, const char *endpoint, int64_t now, int limit, char **cursor,
                        nh_session_cb cb, void *data)
{
  nh_pg_args_t a;
  nh_pgop_t op = nh_pgargs_sessions_retry_due(&a, endpoint, now, limit);
  int n = sessions_collect(db, op, &a, endpoint, limit, NULL, cb, data);
  if (n >= limit) return n;
  int was_from_start = !cursor || !*cursor;
  op = nh_pgargs_sessions_draining(&a, endpoint, cursor && *cursor ? *cursor : "", limit - n);
  int m = sessions_collect(db, op, &a, endpoint, limit - n, cursor, cb, data);
  if (cursor && m < limit - n && *cursor) {
    /* reached the end: start over next time (now, if we began mid-way and have room) */
    free(*cursor);
    *cursor = NULL;
    if (!was_from_start) {
      op = nh_pgargs_sessions_draining(&a, endpoint, "", limit - n - m);
      m += sessions_collect(db, op, &a, endpoint, limit - n - m, cursor, cb, data);
    }
  }
  return n + m;
}

int nh_pgs_sessions_list(nh_pg_db_t *db, const char *endpoint, int blocked_only, nh_session_cb cb, void *data)
{
  nh_pg_args_t a;
  PGresult *r = NULL;
  if (op_run(db, nh_pgargs_sessions_list(&a, endpoint, blocked_only), &a, &r)) return NH_EFAIL;
  int n = 0;
  for (int i = 0; i < PQntuples(r); i++) {
    nh_session_state_t st = { 0 };
    nh_pgrow_session(r, i, 1, &st);
    int stop = cb(data, nh_pg_col_text(r, i, 5), nh_pg_col_text(r, i, 0), &st);
    nh_session_state_clear(&st);
    n++;
    if (stop) break;
  }
  PQclear(r);
  return n;
}

/* ---- parked ---- */

int nh_pgs_park(nh_pg_db_t *db, const nh_msg_t *m, int64_t park_seq)
{
  nh_pg_args_t a;
  return done(db, nh_pgargs_park(&a, m, park_seq), &a);
}

int nh_pgs_parked_head(nh_pg_db_t *db, const char *endpoint, const char *session, nh_msg_t *out, int64_t *park_seq)
{
  nh_pg_args_t a;
  PGresult *r = NULL;
  if (op_run(db, nh_pgargs_parked_head(&a, endpoint, session), &a, &r)) return 0;
  int found = PQntuples(r) > 0;
  if (found) nh_pgrow_parked(r, 0, endpoint, session, out, park_seq);
  PQclear(r);
  return found;
}

int nh_pgs_parked_delete(nh_pg_db_t *db, const char *endpoint, const char *session, int64_t park_seq)
{
  nh_pg_args_t a;
  return done(db, nh_pgargs_parked_delete(&a, endpoint, session, park_seq), &a);
}

int nh_pgs_parked_delete_event(nh_pg_db_t *db, const char *endpoint, const char *event_id)
{
  nh_pg_args_t a;
  PGresult *r = NULL;
  if (op_run(db, nh_pgargs_parked_delete_event(&a, endpoint, event_id), &a, &r)) return NH_EFAIL;
  int n = nh_pg_affected(r);
  PQclear(r);
  return n;
}

int nh_pgs_parked_count(nh_pg_db_t *db, const char *endpoint, const char *session)
{
  nh_pg_args_t a;
  PGresult *r = NULL;
  if (op_run(db, nh_pgargs_parked_count(&a, endpoint, session), &a, &r)) return 0;
  int n = PQntuples(r) > 0 ? (int)nh_pg_col_i64(r, 0, 0) : 0;
  PQclear(r);
  return n;
}

int nh_pgs_parked_any(nh_pg_db_t *db, const char *endpoint, const char *session)
{
  nh_pg_args_t a;
  PGresult *r = NULL;
  if (op_run(db, nh_pgargs_parked_any(&a, endpoint, session), &a, &r)) return NH_EFAIL;
  int found = PQntuples(r) > 0;
  PQclear(r);
  return found;
}

/* ---- inbox / processed / operator requests and log ---- */

int nh_pgs_inbox_has(nh_pg_db_t *db, const char *endpoint, const char *message_id)
{
  nh_pg_args_t a;
  return exists(db, nh_pgargs_inbox_has(&a, endpoint, message_id), &a);
}

int nh_pgs_inbox_add(nh_pg_db_t *db, const char *endpoint, const char *message_id)
{
  nh_pg_args_t a;
  return done(db, nh_pgargs_inbox_add(&a, endpoint, message_id), &a);
}

int nh_pgs_processed_has(nh_pg_db_t *db, const char *endpoint, const char *message_id, const char *event_id)
{
  nh_pg_args_t a;
  return exists(db, nh_pgargs_processed_has(&a, endpoint, message_id, event_id), &a);
}

int nh_pgs_oppending_add(nh_pg_db_t *db, const char *message_id, const char *endpoint, const char *event_id,
                         const char *action, const char *expected_status)
{
  nh_pg_args_t a;
  return done(db, nh_pgargs_oppending_add(&a, message_id, endpoint, event_id, action, expected_status), &a);
}

int nh_pgs_oppending_has(nh_pg_db_t *db, const char *endpoint, const char *event_id)
{
  nh_pg_args_t a;
  return exists(db, nh_pgargs_oppending_has(&a, endpoint, event_id), &a);
}

int nh_pgs_oppending_take(nh_pg_db_t *db, const char *message_id, char **expected_status)
{
  *expected_status = NULL;
  nh_pg_args_t a;
  PGresult *r = NULL;
  if (op_run(db, nh_pgargs_oppending_take(&a, message_id), &a, &r)) return NH_EFAIL;
  int found = PQntuples(r) > 0;
  if (found) *expected_status = nh_pg_col_strdup(r, 0, 0);
  PQclear(r);
  return found;
}

int nh_pgs_oplog_add(nh_pg_db_t *db, const char *actor, const char *action, const char *endpoint,
                     const char *event_id, const char *session, const char *detail)
{
  nh_pg_args_t a;
  return done(db, nh_pgargs_oplog_add(&a, actor, action, endpoint, event_id, session, detail), &a);
}

/* ---- idempotent publishing ---- */

int nh_pgs_published_seen(nh_pg_db_t *db, const char *message_id, int64_t since, int64_t *at)
{
  nh_pg_args_t a;
  PGresult *r = NULL;
  if (op_run(db, nh_pgargs_published_seen(&a, message_id), &a, &r)) return NH_EFAIL;
  int found = PQntuples(r) > 0;
  int64_t prev = found ? nh_pg_col_i64(r, 0, 0) : 0;
  PQclear(r);
  if (found && prev >= since) {
    if (at) *at = prev;
    return 1;
  }
  return 0;
}

int nh_pgs_published_claim(nh_pg_db_t *db, const char *message_id, int64_t now, int64_t since, int64_t *at)
{
  nh_pg_args_t a;
  PGresult *r = NULL;
  if (op_run(db, nh_pgargs_published_claim(&a, message_id, now, since), &a, &r)) return NH_EFAIL;
  int claimed = !PQgetisnull(r, 0, 0), found = !PQgetisnull(r, 0, 1);
  int64_t prev = found ? nh_pg_col_i64(r, 0, 1) : 0;
  PQclear(r);
  if (claimed) return 1;
  if (found) {
    if (at) *at = prev;
    return 0;
  }
  /* another host claimed it after this statement's snapshot: read its claim */
  return nh_pgs_published_seen(db, message_id, since, at) < 0 ? NH_EFAIL : 0;
}

/* ---- running hosts ---- */

int nh_pgs_host_put(nh_pg_db_t *db, const char *owner, const char *endpoints_csv, int64_t started_at, int64_t now)
{
  nh_pg_args_t a;
  return done(db, nh_pgargs_host_put(&a, owner, endpoints_csv, started_at, now), &a);
}

int nh_pgs_host_del(nh_pg_db_t *db, const char *owner)
{
  nh_pg_args_t a;
  return done(db, nh_pgargs_host_del(&a, owner), &a);
}

int nh_pgs_hosts_serving(nh_pg_db_t *db, const char *endpoint, int64_t since)
{
  nh_pg_args_t a;
  PGresult *r = NULL;
  if (op_run(db, nh_pgargs_hosts_serving(&a, endpoint, since), &a, &r)) return NH_EFAIL;
  int n = 0;
  for (int i = 0; i < PQntuples(r); i++)
    if (!nh_owner_dead(nh_pg_col_text(r, i, 0))) n++;
  PQclear(r);
  return n;
}

/* ---- bulk runs ---- */

int nh_pgs_bulk_get(nh_pg_db_t *db, const char *key, nh_bulk_run_t *out)
{
  memset(out, 0, sizeof *out);
  nh_pg_args_t a;
  PGresult *r = NULL;
  if (op_run(db, nh_pgargs_bulk_get(&a, key), &a, &r)) return NH_EFAIL;
  int found = PQntuples(r) > 0;
  if (found) nh_pgrow_bulk(r, 0, out);
  PQclear(r);
  return found;
}

int nh_pgs_bulk_put(nh_pg_db_t *db, const char *key, const nh_bulk_run_t *run)
{
  nh_pg_args_t a;
  return done(db, nh_pgargs_bulk_put(&a, key, run), &a);
}

int nh_pgs_bulk_done(nh_pg_db_t *db, const char *key)
{
  nh_pg_args_t a;
  return done(db, nh_pgargs_bulk_done(&a, key), &a);
}
