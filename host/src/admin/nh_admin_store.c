/* The store reads of the operator API's routes, on either store (nh_admin_int.h): the
 * sqlite store's on the loop, or, for a route running on the pool (nh_admin_pg.c), the
 * PostgreSQL twin of each on the route's own connection. A PostgreSQL failure leaves its
 * message in c->pg_err for nh_admin_store_error. */
#include "nh_admin_int.h"
#include "core/nh_util.h"
#include "store/nh_pg_ops.h"

#include <stdio.h>

/* NH_EFAIL after keeping the error for the answer: the call's own, or the one the
 * connection kept (some reads answer 0 on failure, as their sqlite twins do: a failed
 * read must still not pass for "none") */
static int pg_failed(nh_admin_call_t *c, const nh_error_t *err)
{
  const nh_error_t *kept = nh_pg_db_error(c->pg);
  snprintf(c->pg_err, sizeof c->pg_err, "%s",
           err && err->msg[0] ? err->msg : kept && kept->msg[0] ? kept->msg : PQerrorMessage(nh_pg_db_conn(c->pg)));
  return NH_EFAIL;
}

/* n, or NH_EFAIL when the read failed (said by n or by the connection's state) */
static int64_t pg_result(nh_admin_call_t *c, int64_t n, const nh_error_t *err)
{
  return n < 0 || nh_pg_db_failed(c->pg) ? pg_failed(c, err) : n;
}

int nh_admin_rd_events(nh_admin_call_t *c, const nh_event_filter_t *f, nh_audit_cb cb, void *data, int64_t *last)
{
  if (!c->pg) return nh_store_events(c->a->store, f, cb, data, last);
  nh_error_t err = {0};
  nh_pg_db_clear_failed(c->pg);
  return (int)pg_result(c, nh_pgs_events(c->pg, f, cb, data, last, &err), &err);
}

int64_t nh_admin_rd_events_count(nh_admin_call_t *c, const nh_event_filter_t *f)
{
  if (!c->pg) return nh_store_events_count(c->a->store, f);
  nh_error_t err = {0};
  nh_pg_db_clear_failed(c->pg);
  return pg_result(c, nh_pgs_events_count(c->pg, f, &err), &err);
}

int nh_admin_rd_endpoints(nh_admin_call_t *c, int (*cb)(void *data, const char *endpoint), void *data)
{
  if (!c->pg) return nh_store_endpoints(c->a->store, cb, data);
  nh_pg_db_clear_failed(c->pg);
  return (int)pg_result(c, nh_pgs_endpoints(c->pg, cb, data), NULL);
}

int nh_admin_rd_endpoint_stats(nh_admin_call_t *c, const char *endpoint, int64_t now, nh_endpoint_stats_t *out)
{
  if (!c->pg) return nh_store_endpoint_stats(c->a->store, endpoint, now, out);
  nh_pg_db_clear_failed(c->pg);
  return pg_result(c, nh_pgs_endpoint_stats(c->pg, endpoint, now, out), NULL) < 0 ? NH_EFAIL : NH_OK;
}

int nh_admin_rd_audit_find(nh_admin_call_t *c, const char *id, nh_audit_t *ev, nh_error_t *err)
{
  if (!c->pg) return nh_store_audit_find(c->a->store, id, ev, err);
  return nh_pgs_audit_find(c->pg, id, ev, err);   /* says what failed in err, as sqlite's */
}

int nh_admin_rd_history_list(nh_admin_call_t *c, const char *endpoint, const char *event_id, nh_history_cb cb,
                             void *data)
{
  if (!c->pg) return nh_store_history_list(c->a->store, endpoint, event_id, cb, data);
  nh_pg_db_clear_failed(c->pg);
  return (int)pg_result(c, nh_pgs_history_list(c->pg, endpoint, event_id, cb, data), NULL);
}

int nh_admin_rd_oplog_list(nh_admin_call_t *c, const char *endpoint, const char *event_id, nh_oplog_cb cb, void *data)
{
  if (!c->pg) return nh_store_oplog_list(c->a->store, endpoint, event_id, cb, data);
  nh_pg_db_clear_failed(c->pg);
  return (int)pg_result(c, nh_pgs_oplog_list(c->pg, endpoint, event_id, cb, data), NULL);
}

int nh_admin_rd_oppending_has(nh_admin_call_t *c, const char *endpoint, const char *event_id)
{
  if (!c->pg) return nh_store_oppending_has(c->a->store, endpoint, event_id);
  nh_pg_db_clear_failed(c->pg);
  return (int)pg_result(c, nh_pgs_oppending_has(c->pg, endpoint, event_id), NULL);
}

int nh_admin_rd_blocked_sessions(nh_admin_call_t *c, const char *endpoint, const char *after_endpoint,
                                 const char *after_session, int limit, nh_blocked_cb cb, void *data)
{
  if (!c->pg)
    return nh_store_blocked_sessions(c->a->store, endpoint, after_endpoint, after_session, limit, cb, data);
  nh_pg_db_clear_failed(c->pg);
  return (int)pg_result(c, nh_pgs_blocked_sessions(c->pg, endpoint, after_endpoint, after_session, limit, cb, data), NULL);
}

int nh_admin_rd_failgroups(nh_admin_call_t *c, const char *endpoint, nh_failgroup_cb cb, void *data)
{
  if (!c->pg) return nh_store_failgroups(c->a->store, endpoint, cb, data);
  nh_error_t err = {0};
  nh_pg_db_clear_failed(c->pg);
  return (int)pg_result(c, nh_pgs_failgroups(c->pg, endpoint, cb, data, &err), &err);
}

int nh_admin_rd_failgroup_endpoint(nh_admin_call_t *c, const char *group, char *endpoint, size_t len)
{
  if (!c->pg) return nh_store_failgroup_endpoint(c->a->store, group, endpoint, len);
  nh_error_t err = {0};
  nh_pg_db_clear_failed(c->pg);
  return (int)pg_result(c, nh_pgs_failgroup_endpoint(c->pg, group, endpoint, len, &err), &err);
}

int64_t nh_admin_rd_history_last_id(nh_admin_call_t *c)
{
  if (!c->pg) return nh_store_history_last_id(c->a->store);
  nh_error_t err = {0};
  nh_pg_db_clear_failed(c->pg);
  return pg_result(c, nh_pgs_history_last_id(c->pg, &err), &err);
}

int nh_admin_rd_history_follow(nh_admin_call_t *c, int64_t after, const int64_t *gaps, int ngaps, int limit,
                               void (*cb)(void *data, int64_t id, const nh_audit_t *a), void *data)
{
  if (!c->pg) return NH_EFAIL;   /* PostgreSQL's: sqlite's history commits in order (nh_store_history_after) */
  nh_error_t err = {0};
  nh_pg_db_clear_failed(c->pg);
  return (int)pg_result(c, nh_pgs_history_after(c->pg, after, gaps, ngaps, limit, cb, data, &err), &err);
}

int nh_admin_live_hosts(nh_admin_call_t *c, const char *endpoint)
{
  int64_t since = nh_time_now_ms() - NH_ADMIN_LIVE_MS;
  if (!c->pg) return nh_store_hosts_serving(c->a->store, endpoint, since);
  nh_pg_db_clear_failed(c->pg);
  return (int)pg_result(c, nh_pgs_hosts_serving(c->pg, endpoint, since), NULL);
}
