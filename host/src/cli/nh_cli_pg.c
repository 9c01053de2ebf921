/* Commands on a PostgreSQL store (docs/store-backends.md), blocking as a command may: one
 * connection, a few round trips.
 * - publish: the message queued in the store's queue tables for each subscribing endpoint
 *   (or the one --to names), all copies in one transaction (with the claim of its
 *   --message-id), and the hosts listening woken (NOTIFY, sent at the commit);
 * - resubmit, skip, handoff complete|fail of one event: nh_operator_submit_pg. */
#include "nh_cli.h"
#include "core/nh_util.h"
#include "dispatch/nh_operator.h"
#include "store/nh_pg_ops.h"
#include "store/nh_pg_queue.h"
#include "transport/nh_amqp.h"

#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The endpoints to queue for: `to` if it has ever subscribed here, else every subscriber of
 * the type. NULL with *why set when there is none (*usage: the caller's mistake) or the
 * query failed. */
static PGresult *endpoints_of(PGconn *c, const nh_msg_t *m, const char *to, char *why, size_t len, int *usage)
{
  const char *sql = to ? "SELECT DISTINCT endpoint FROM subscriptions WHERE endpoint = $1"
                       : "SELECT endpoint FROM subscriptions WHERE event_type = $1 ORDER BY endpoint";
  const char *arg = to ? to : m->event_type;
  *usage = 0;
  PGresult *r = PQexecParams(c, sql, 1, NULL, &arg, NULL, NULL, 0);
  if (PQresultStatus(r) != PGRES_TUPLES_OK) {
    snprintf(why, len, "reading the subscriptions: %s", PQresultErrorMessage(r));
    PQclear(r);
    return NULL;
  }
  if (PQntuples(r) > 0) return r;
  PQclear(r);
  if (to) {
    *usage = 1;
    r = PQexec(c, "SELECT string_agg(endpoint, ', ' ORDER BY endpoint) FROM"
                  " (SELECT DISTINCT endpoint FROM subscriptions WHERE endpoint NOT LIKE '\\_%') e");
    const char *known = PQresultStatus(r) == PGRES_TUPLES_OK && !PQgetisnull(r, 0, 0) ? PQgetvalue(r, 0, 0) : "";
    snprintf(why, len, "--to %s: no such endpoint in this store (%s%s); start its host once first", to,
             *known ? "known: " : "none has started yet", known);
    PQclear(r);
  } else {
    snprintf(why, len, "no endpoint subscribes to %s, so nothing was queued; start a host whose adapter handles it "
             "(ep:on(\"%s\", ...)) first, or address an endpoint with --to", m->event_type, m->event_type);
  }
  return NULL;
}

/* publish --message-id: when the id was last published, 0: never (or the read failed: the
 * claim in the transaction decides then). */
static int64_t published_at(nh_pg_db_t *db, const char *message_id)
{
  nh_pg_args_t a;
  PGresult *r = NULL;
  int64_t at = 0;
  nh_error_t err = {0};
  if (nh_pg_db_run(db, nh_pgargs_published_seen(&a, message_id), &a, &r, &err) == NH_OK && PQntuples(r) > 0)
    at = nh_pg_col_i64(r, 0, 0);
  PQclear(r);
  return at;
}

/* The connection for a command that writes: the store's schema and the queue's migrated
 * (a store no host has started on yet can take requests). NULL after saying why. */
nh_pg_db_t *nh_cli_pg_open(const char *cmd, const char *url, int *exit_code)
{
  PGconn *conn = NULL;
  nh_error_t err = {0};
  int from = 0, to = 0;
  if (nh_store_pg_connect(url, 0, &conn, &from, &to, &err) || nh_pg_queue_migrate(conn, &err)) {
    if (conn) PQfinish(conn);
    fprintf(stderr, "nimbus-host %s: %s\n", cmd, err.msg);
    *exit_code = err.code == NH_EUSAGE ? NH_EXIT_USAGE : NH_EXIT_FAIL;
    return NULL;
  }
  return nh_pg_db_new(conn);
}

int nh_cli_publish_pg(const char *url, const nh_msg_t *m, const char *to, const char *given_id)
{
  int rc = NH_EXIT_OK;
  nh_pg_db_t *db = nh_cli_pg_open("publish", url, &rc);
  if (!db) return rc;
  char why[1024];
  int usage = 0;
  PGresult *eps = endpoints_of(nh_pg_db_conn(db), m, to, why, sizeof why, &usage);
  if (!eps) {
    nh_pg_db_free(db);
    if (usage) return nh_usage_error("publish", "%s", why);
    fprintf(stderr, "nimbus-host publish: %s\n", why);
    return NH_EXIT_FAIL;
  }
  /* --message-id: published within the window, said; else claimed in the transaction that
   * queues the copies, which fails if another publisher claimed it since this read */
  int64_t now = nh_time_now_ms(), since = now - NH_DEDUP_WINDOW_MS, at = given_id ? published_at(db, given_id) : 0;
  int n = PQntuples(eps);
  char (*eids)[37] = nh_xcalloc((size_t)n, sizeof *eids);
  nh_error_t err = {0};
  nh_pg_args_t a;
  if (nh_published_recently(at, now)) goto duplicate;
  rc = nh_pg_batch_begin(db, &err);
  if (rc == NH_OK && given_id)
    rc = nh_pg_batch_add(db, nh_pgargs_published_claim_or_fail(&a, given_id, now, since), &a, NULL, NULL, &err);
  for (int i = 0; rc == NH_OK && i < n; i++) {
    const char *ep = PQgetvalue(eps, i, 0);
    if (to && m->event_id) snprintf(eids[i], sizeof eids[i], "%s", m->event_id);
    else nh_uuid_v7(eids[i]);   /* each consuming endpoint's copy is its own audit event */
    rc = nh_pgq_batch_add_copy(db, m, ep, eids[i], &err);
  }
  if (rc == NH_OK) rc = nh_pg_batch_commit(db, &err);
  else nh_pg_batch_abandon(db);
  if (rc && given_id && nh_published_recently(at = published_at(db, given_id), now)) goto duplicate;
  if (rc) {
    fprintf(stderr, "nimbus-host publish: %s; nothing was queued\n", err.msg);
  } else {
    printf("%s\n", m->message_id);   /* stdout stays the MessageId (scripts read it) */
    for (int i = 0; i < n; i++) fprintf(stderr, "queued as event %s for %s\n", eids[i], PQgetvalue(eps, i, 0));
  }
  goto done;
duplicate:
  nh_cli_said_published(given_id, at);
  printf("%s\n", m->message_id);   /* published before: stdout still names it */
  rc = NH_OK;
done:
  free(eids);
  PQclear(eps);
  nh_pg_db_free(db);
  return rc ? NH_EXIT_FAIL : NH_EXIT_OK;
}

int nh_cli_outbox_publish_pg(nh_pg_db_t *db, nh_transport_t *tr, const nh_msg_t *m, const char *to,
                             const char *given_id, char *why, size_t len)
{
  int64_t now = nh_time_now_ms(), since = now - NH_DEDUP_WINDOW_MS, at = given_id ? published_at(db, given_id) : 0;
  if (nh_published_recently(at, now)) {
    nh_cli_said_published(given_id, at);
    return 1;
  }
  nh_error_t err = {0};
  nh_pg_args_t a;
  int rc = nh_pg_batch_begin(db, &err);
  if (rc == NH_OK && given_id)
    rc = nh_pg_batch_add(db, nh_pgargs_published_claim_or_fail(&a, given_id, now, since), &a, NULL, NULL, &err);
  if (rc == NH_OK) rc = nh_amqp_pg_outbox_batch(tr, db, m, to, &err);
  if (rc == NH_OK) rc = nh_pg_batch_commit(db, &err);
  else nh_pg_batch_abandon(db);
  if (rc && given_id && nh_published_recently(at = published_at(db, given_id), now)) {
    nh_cli_said_published(given_id, at);
    return 1;
  }
  if (rc) snprintf(why, len, "%s; nothing was stored or sent", err.msg);
  return rc ? -1 : 0;
}

int nh_cli_submit_pg(const char *cmd, const char *url, const nh_op_req_t *req)
{
  int rc = NH_EXIT_OK;
  nh_pg_db_t *db = nh_cli_pg_open(cmd, url, &rc);
  if (!db) return rc;
  nh_error_t err = {0};
  nh_audit_t ev;
  rc = nh_operator_submit_pg(db, req, &ev, &err);
  nh_pg_db_free(db);
  if (rc) {
    fprintf(stderr, "nimbus-host %s: %s\n", cmd, err.msg);
    return rc == NH_EFAIL ? NH_EXIT_FAIL : NH_EXIT_USAGE;
  }
  printf("%s of event %s queued (endpoint %s, session %s); the host owning %s applies it\n", cmd, ev.event_id,
         ev.endpoint, ev.session_id, ev.endpoint);
  nh_audit_clear(&ev);
  return NH_EXIT_OK;
}
