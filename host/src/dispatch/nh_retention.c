/* Background retention: deletes resolved events (and their history, old inbox and
 * processed entries) older than the configured age, a small batch at a time between
 * pumps, so the store stops growing under a steady load without holding the write lock
 * for long. Configured with `--retention AGE` or `nimbus.retention{...}` in Lua. On
 * PostgreSQL each tick is one batch on the link. */
#include "nh_dispatch_int.h"
#include "core/nh_log.h"
#include "core/nh_util.h"
#include "store/nh_pg_link.h"
#include "store/nh_pg_ops.h"

#include <stdlib.h>

#define NH_RETENTION_BATCH 500        /* audit rows per transaction */
#define NH_RETENTION_SLICE_MS 20      /* loop time one tick may take */
#define NH_RETENTION_IDLE_MS 30000    /* next look when nothing was old enough */
#define NH_RETENTION_BUSY_MS 50       /* next tick while a backlog is being deleted */

static void retention_cb(uv_timer_t *h);

static void told(nh_dispatch_t *d, const nh_purge_counts_t *c)
{
  d->purged += (uint64_t)c->events;
  nh_log_debug("retention", "deleted %lld resolved events, %lld history rows, %lld inbox and %lld processed entries",
               (long long)c->events, (long long)c->history, (long long)c->inbox, (long long)c->processed);
}

static void failed(void)
{
  nh_log_error("retention", "deleting resolved events failed; trying again in %d s", NH_RETENTION_IDLE_MS / 1000);
}

/* ---------------------------------------------------------------- on PostgreSQL */

/* One batch on the link a tick, each delete one statement (the resolved rows with their
 * history; a row another host is deleting is skipped, not waited for). */
typedef struct purge {
  nh_dispatch_t *d;
  nh_purge_counts_t c;
} purge_t;

static int purge_build(void *data, nh_pg_db_t *db, nh_error_t *err)
{
  purge_t *p = data;
  nh_dispatch_t *d = p->d;
  int64_t now = nh_time_now_ms();
  return nh_pg_purge_add(db, d->retention_resolved_ms > 0 ? now - d->retention_resolved_ms : 0,
                         d->retention_inbox_ms > 0 ? now - d->retention_inbox_ms : 0, NH_RETENTION_BATCH, &p->c, err);
}

static void purge_done(void *data, nh_pg_batch_outcome_t outcome, const nh_error_t *err)
{
  purge_t *p = data;
  nh_dispatch_t *d = p->d;
  int more = 0;
  if (outcome == NH_PG_COMMITTED) {
    if (p->c.events || p->c.inbox || p->c.processed) told(d, &p->c);
    more = p->c.events >= NH_RETENTION_BATCH;
  } else if (nh_pg_link_state(d->link) == NH_PG_LINK_READY) {
    nh_log_error("retention", "%s", err && err->msg[0] ? err->msg : "no answer");
    failed();
  }
  free(p);
  if (!d->stopping)
    uv_timer_start(&d->retention_timer, retention_cb, more ? NH_RETENTION_BUSY_MS : NH_RETENTION_IDLE_MS, 0);
}

static void pg_retention(nh_dispatch_t *d)
{
  purge_t *p = nh_xcalloc(1, sizeof *p);
  p->d = d;
  if (nh_pg_link_submit(d->link, purge_build, purge_done, p, NULL)) {
    free(p);
    uv_timer_start(&d->retention_timer, retention_cb, NH_RETENTION_IDLE_MS, 0);
  }
}

/* ---------------------------------------------------------------- on sqlite */

static void retention_cb(uv_timer_t *h)
{
  nh_dispatch_t *d = h->data;
  if (d->stopping || (d->retention_resolved_ms <= 0 && d->retention_inbox_ms <= 0)) return;
  if (!d->store) return pg_retention(d);   /* the timer is not started again until its batch is done */
  int64_t t0 = nh_time_now_ms(), now = t0;
  int64_t resolved = d->retention_resolved_ms > 0 ? now - d->retention_resolved_ms : 0;
  int64_t inbox = d->retention_inbox_ms > 0 ? now - d->retention_inbox_ms : 0;
  int more = 0;
  nh_purge_counts_t c = { 0 };
  do {
    if (nh_store_begin(d->store)) break;
    int n = nh_store_purge(d->store, resolved, inbox, NH_RETENTION_BATCH, &c);
    if (n < 0 || nh_store_commit(d->store)) {
      nh_store_rollback(d->store);
      failed();
      more = 0;
      break;
    }
    more = n >= NH_RETENTION_BATCH;
  } while (more && nh_time_now_ms() - t0 < NH_RETENTION_SLICE_MS);
  if (c.events || c.inbox || c.processed) {
    nh_store_vacuum_step(d->store, 4096);
    told(d, &c);
  }
  uv_timer_start(&d->retention_timer, retention_cb, more ? NH_RETENTION_BUSY_MS : NH_RETENTION_IDLE_MS, 0);
}

void nh_dispatch_retention_start(nh_dispatch_t *d)
{
  if (d->retention_resolved_ms <= 0 && d->retention_inbox_ms <= 0) {
    uv_timer_stop(&d->retention_timer);
    return;
  }
  char r[32] = "kept", i[32] = "kept";
  if (d->retention_resolved_ms > 0) snprintf(r, sizeof r, "%.0f s", (double)d->retention_resolved_ms / 1000.0);
  if (d->retention_inbox_ms > 0) snprintf(i, sizeof i, "%.0f s", (double)d->retention_inbox_ms / 1000.0);
  nh_log_info("retention", "resolved events older than %s and inbox entries older than %s are deleted", r, i);
  uv_timer_start(&d->retention_timer, retention_cb, 1000, 0);
}

int nh_dispatch_set_retention(void *data, const char *resolved, const char *inbox, nh_error_t *err)
{
  nh_dispatch_t *d = data;
  int64_t r = -1, in = -1;
  if (resolved && (r = nh_duration_parse_ms(resolved)) <= 0)
    return nh_error_set(err, NH_EUSAGE, "resolved = %s: give an age of 1s or more, such as \"7d\", \"12h\" or \"30m\"",
                        resolved);
  if (inbox && (in = nh_duration_parse_ms(inbox)) <= 0)
    return nh_error_set(err, NH_EUSAGE, "inbox = %s: give an age of 1s or more, such as \"30d\"", inbox);
  if (d->retention_fixed) return NH_OK;   /* --retention on the command line wins */
  if (r > 0) d->retention_resolved_ms = r;
  if (in > 0) d->retention_inbox_ms = in;
  if (d->started) nh_dispatch_retention_start(d);
  return NH_OK;
}

void nh_dispatch_set_retention_fixed(nh_dispatch_t *d, int64_t age_ms)
{
  d->retention_resolved_ms = d->retention_inbox_ms = age_ms;
  d->retention_fixed = 1;
  if (d->started) nh_dispatch_retention_start(d);
}
