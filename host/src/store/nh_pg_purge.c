/* Retention's deletes on a PostgreSQL store: one batch's statements, added to a batch by
 * the host's background retention (dispatch/nh_retention.c, on the link) and by
 * `nimbus-host purge` (blocking, the CLI's connection), so that what a host deletes in the
 * background and what an operator deletes by hand stay the same rows; the dry run's count
 * and the database's size. */
#include "nh_pg_ops.h"
#include "core/nh_util.h"

#include <stdlib.h>

/* A batch's counts, taken from its results once it has committed (a batch that fails
 * runs no callback, so nothing of it is counted). */
static void on_purged(void *data, const nh_pg_optab_t *tab, int op, const PGresult *res)
{
  nh_purge_counts_t *c = data;
  (void)tab;
  int64_t n = nh_pg_col_i64(res, 0, 0);
  switch (op) {
  case NH_PGOP_PURGE_RESOLVED:
    c->events += n;
    c->history += nh_pg_col_i64(res, 0, 1);
    break;
  case NH_PGOP_PURGE_PROCESSED: c->processed += n; break;
  case NH_PGOP_PURGE_INBOX: c->inbox += n; break;
  default: break;   /* published claims: housekeeping, not reported (as on sqlite) */
  }
}

int nh_pg_purge_add(nh_pg_db_t *db, int64_t resolved_before, int64_t inbox_before, int max_rows,
                    nh_purge_counts_t *counts, nh_error_t *err)
{
  nh_pg_args_t a;
  int rc = NH_OK;
  /* what nh_store_purge deletes: processed entries (schema 1's, no longer written) go
   * with the resolved cutoff */
  if (resolved_before > 0 &&
      ((rc = nh_pg_batch_add(db, nh_pgargs_purge(&a, NH_PGOP_PURGE_RESOLVED, resolved_before, max_rows), &a,
                             on_purged, counts, err)) ||
       (rc = nh_pg_batch_add(db, nh_pgargs_purge(&a, NH_PGOP_PURGE_PROCESSED, resolved_before, 1000), &a, on_purged,
                             counts, err))))
    return rc;
  if (inbox_before > 0 &&
      (rc = nh_pg_batch_add(db, nh_pgargs_purge(&a, NH_PGOP_PURGE_INBOX, inbox_before, 1000), &a, on_purged, counts,
                            err)))
    return rc;
  /* claims past the dedup window guard nothing any more */
  return nh_pg_batch_add(db, nh_pgargs_purge(&a, NH_PGOP_PURGE_PUBLISHED, nh_time_now_ms() - NH_DEDUP_WINDOW_MS, 1000),
                         &a, on_purged, counts, err);
}

int nh_pgs_purge(nh_pg_db_t *db, int64_t resolved_before, int64_t inbox_before, int max_rows,
                 nh_purge_counts_t *counts, nh_error_t *err)
{
  nh_purge_counts_t c = { 0 };
  int rc = nh_pg_batch_begin(db, err);
  if (rc == NH_OK) rc = nh_pg_purge_add(db, resolved_before, inbox_before, max_rows, &c, err);
  if (rc == NH_OK) {
    rc = nh_pg_batch_commit(db, err);
  } else {
    nh_pg_batch_abandon(db);   /* a no-op if the batch never began */
  }
  if (rc) return NH_EFAIL;
  counts->events += c.events;
  counts->history += c.history;
  counts->inbox += c.inbox;
  counts->processed += c.processed;
  return (int)(c.events + c.inbox + c.processed);
}

int nh_pgs_purge_count(nh_pg_db_t *db, int64_t resolved_before, int64_t inbox_before, nh_purge_counts_t *counts,
                       nh_error_t *err)
{
  nh_pg_args_t a;
  PGresult *r = NULL;
  *counts = (nh_purge_counts_t){ 0 };
  /* a time of 0 matches no row (every time is after the epoch), as sqlite's skip */
  if (nh_pg_db_run(db, nh_pgargs_purge_count(&a, resolved_before, inbox_before), &a, &r, err)) return NH_EFAIL;
  counts->events = nh_pg_col_i64(r, 0, 0);
  counts->inbox = nh_pg_col_i64(r, 0, 1);
  PQclear(r);
  return NH_OK;
}

int64_t nh_pgs_database_bytes(nh_pg_db_t *db)
{
  PGresult *r = PQexec(nh_pg_db_conn(db), "SELECT pg_database_size(current_database())");
  int64_t n = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 ? strtoll(PQgetvalue(r, 0, 0), NULL, 10) : -1;
  PQclear(r);
  return n;
}
