/* Commands on a PostgreSQL store (docs/store-backends.md), blocking as a command may: one
 * connection, a few round trips.
 * - publish: the message queued in the store's queue tables for each subscribing endpoint
 *   (or the one --to names), all copies in one transaction, and the hosts listening woken
 *   (NOTIFY, sent at the commit);
 * - resubmit, skip, handoff complete|fail of one event: nh_operator_submit_pg. */
#include "nh_cli.h"
#include "core/nh_util.h"
#include "dispatch/nh_operator.h"
#include "store/nh_pg_ops.h"
#include "store/nh_pg_queue.h"

#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The endpoints to queue for: `to` if it has ever subscribed here, else every subscriber of
 * the type. NULL with *why set when there is none (or the query failed). */
static PGresult *endpoints_of(PGconn *c, const nh_msg_t *m, const char *to, char *why, size_t len)
{
  const char *sql = to ? "SELECT DISTINCT endpoint FROM subscriptions WHERE endpoint = $1"
                       : "SELECT endpoint FROM subscriptions WHERE event_type = $1 ORDER BY endpoint";
  const char *arg = to ? to : m->event_type;
  PGresult *r = PQexecParams(c, sql, 1, NULL, &arg, NULL, NULL, 0);
  if (PQresultStatus(r) != PGRES_TUPLES_OK) {
    snprintf(why, len, "reading the subscriptions: %s", PQresultErrorMessage(r));
    PQclear(r);
    return NULL;
  }
  if (PQntuples(r) == 0) {
    if (to)
      snprintf(why, len, "--to %s: no such endpoint in this store; start its host once first", to);
    else
      snprintf(why, len, "no endpoint subscribes to %s, so nothing was queued; start a host whose adapter handles "
               "it (ep:on(\"%s\", ...)) first, or address an endpoint with --to", m->event_type, m->event_type);
    PQclear(r);
    return NULL;
  }
  return r;
}

/* The connection for a command that writes: the store's schema and the queue's migrated
 * (a store no host has started on yet can take requests). NULL after saying why. */
static nh_pg_db_t *open_db(const char *cmd, const char *url, int *exit_code)
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

int nh_cli_publish_pg(const char *url, const nh_msg_t *m, const char *to, int given_id)
{
  if (given_id)
    return nh_usage_error("publish", "--message-id on a PostgreSQL store is not built yet (docs/store-backends.md)");
  int rc = NH_EXIT_OK;
  nh_pg_db_t *db = open_db("publish", url, &rc);
  if (!db) return rc;
  char why[1024];
  PGresult *eps = endpoints_of(nh_pg_db_conn(db), m, to, why, sizeof why);
  if (!eps) {
    nh_pg_db_free(db);
    fprintf(stderr, "nimbus-host publish: %s\n", why);
    return NH_EXIT_FAIL;
  }
  int n = PQntuples(eps);
  char (*eids)[37] = nh_xcalloc((size_t)n, sizeof *eids);
  nh_error_t err = {0};
  nh_pg_args_t a;
  rc = nh_pg_batch_begin(db, &err);
  for (int i = 0; rc == NH_OK && i < n; i++) {
    const char *ep = PQgetvalue(eps, i, 0);
    if (to && m->event_id) snprintf(eids[i], sizeof eids[i], "%s", m->event_id);
    else nh_uuid_v7(eids[i]);   /* each consuming endpoint's copy is its own audit event */
    rc = nh_pgq_batch_add(db, nh_pgqargs_insert(&a, m, ep, eids[i]), &a, NULL, NULL, &err);
    if (rc == NH_OK) rc = nh_pgq_batch_add(db, nh_pgqargs_notify(&a, ep), &a, NULL, NULL, &err);
  }
  if (rc == NH_OK) rc = nh_pg_batch_commit(db, &err);
  else nh_pg_batch_abandon(db);
  if (rc) {
    fprintf(stderr, "nimbus-host publish: %s; nothing was queued\n", err.msg);
  } else {
    printf("%s\n", m->message_id);   /* stdout stays the MessageId (scripts read it) */
    for (int i = 0; i < n; i++) fprintf(stderr, "queued as event %s for %s\n", eids[i], PQgetvalue(eps, i, 0));
  }
  free(eids);
  PQclear(eps);
  nh_pg_db_free(db);
  return rc ? NH_EXIT_FAIL : NH_EXIT_OK;
}

int nh_cli_submit_pg(const char *cmd, const char *url, const nh_op_req_t *req)
{
  int rc = NH_EXIT_OK;
  nh_pg_db_t *db = open_db(cmd, url, &rc);
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
