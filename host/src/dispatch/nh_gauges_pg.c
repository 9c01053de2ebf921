/* The store-wide gauges on a PostgreSQL store (nh_tell.c keeps them in step between reads).
 * On sqlite they are read once per endpoint, on the loop, from the local file. Here a read
 * is a batch on the link, so the loop never waits for it; and since other hosts block and
 * release sessions too, each host reads the store's figures again at most every
 * NH_GAUGES_PG_MS, when scraped: every host then shows the store-wide value, not its own
 * share of the changes since it started. */
#include "nh_dispatch_int.h"
#include "core/nh_util.h"
#include "store/nh_pg_link.h"
#include "store/nh_pg_ops.h"

#include <stdlib.h>

#define NH_GAUGES_PG_MS 10000

typedef struct gread {
  nh_dispatch_t *d;
  int n;
  char **names;
} gread_t;

static void gread_free(gread_t *g)
{
  for (int i = 0; i < g->n; i++) free(g->names[i]);
  free(g->names);
  free(g);
}

static void on_row(void *data, const nh_pg_optab_t *tab, int op, const PGresult *res)
{
  (void)tab;
  (void)op;
  const char *endpoint = data;
  nh_dispatch_gauges_set(endpoint, nh_pg_col_i64(res, 0, 0), nh_pg_col_i64(res, 0, 1), nh_pg_col_i64(res, 0, 2));
}

static int build(void *data, nh_pg_db_t *db, nh_error_t *err)
{
  gread_t *g = data;
  for (int i = 0; i < g->n; i++) {
    nh_pg_args_t a;
    int rc = nh_pg_batch_add(db, nh_pgargs_endpoint_gauges(&a, g->names[i]), &a, on_row, g->names[i], err);
    if (rc) return rc;
  }
  return NH_OK;
}

static void done(void *data, nh_pg_batch_outcome_t outcome, const nh_error_t *err)
{
  gread_t *g = data;
  (void)outcome;   /* not read: the next scrape after NH_GAUGES_PG_MS tries again */
  (void)err;       /* a lost connection is the link's to say */
  g->d->gauges_reading = 0;
  gread_free(g);
}

void nh_dispatch_gauges_pg(nh_dispatch_t *d)
{
  int64_t now = nh_time_now_ms();
  if (!d->link || d->gauges_reading || d->stopping || (d->gauges_read_at && now - d->gauges_read_at < NH_GAUGES_PG_MS))
    return;
  gread_t *g = nh_xcalloc(1, sizeof *g);
  g->d = d;
  for (nh_endpoint_t *ep = d->endpoints; ep; ep = ep->next) {
    if (ep->retired) continue;
    g->names = nh_xrealloc(g->names, sizeof *g->names * (size_t)(g->n + 1));
    g->names[g->n++] = nh_xstrdup(ep->name);
  }
  if (!g->n || nh_pg_link_submit(d->link, build, done, g, NULL)) {
    gread_free(g);
    return;
  }
  d->gauges_reading = 1;
  d->gauges_read_at = now;
}
