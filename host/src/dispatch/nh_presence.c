/* Presence: the host's row in the store's `hosts` table (its owner id and endpoints),
 * refreshed every NH_PRESENCE_EVERY_MS and removed at stop, so operator commands can say
 * when no running host serves an endpoint. A SIGKILLed host's row stays behind; readers
 * ignore rows of dead local processes and rows not refreshed for a while. */
#include "nh_dispatch_int.h"
#include "core/nh_log.h"
#include "core/nh_util.h"
#include "store/nh_pg_link.h"
#include "store/nh_pg_ops.h"

#include <stdlib.h>
#include <string.h>

/* On PostgreSQL the row is a batch of its own on the link, not waited for: a refresh that
 * does not make it is made by the next one, and readers ignore a row not refreshed for 30 s
 * or of a process that is gone. */
static int pg_build(void *data, nh_pg_db_t *db, nh_error_t *err)
{
  return nh_pg_opcopy_send(db, data, NULL, NULL, err);
}

static void pg_done(void *data, nh_pg_batch_outcome_t outcome, const nh_error_t *err)
{
  (void)outcome, (void)err;
  nh_pg_opcopy_free(data);
}

static void pg_write(nh_dispatch_t *d, nh_pgop_t op, nh_pg_args_t *a)
{
  nh_pg_opcopy_t *c = nh_pg_opcopy_new(&nh_pg_store_optab, (int)op, a);
  if (nh_pg_link_submit(d->link, pg_build, pg_done, c, NULL)) nh_pg_opcopy_free(c);
}

static void write_row(nh_dispatch_t *d)
{
  size_t len = 2;
  for (nh_endpoint_t *ep = d->endpoints; ep; ep = ep->next)
    if (!ep->retired) len += strlen(ep->name) + 1;
  char *csv = nh_xmalloc(len);
  strcpy(csv, ",");
  for (nh_endpoint_t *ep = d->endpoints; ep; ep = ep->next)
    if (!ep->retired) {
      strcat(csv, ep->name);
      strcat(csv, ",");
    }
  int64_t now = nh_time_now_ms();
  if (!d->store) {
    nh_pg_args_t a;
    pg_write(d, nh_pgargs_host_put(&a, d->owner, csv, d->started_ms, now), &a);
  } else if (nh_store_begin(d->store) == NH_OK) {
    if (nh_store_host_put(d->store, d->owner, csv, d->started_ms, now) || nh_store_commit(d->store))
      nh_store_rollback(d->store);
  }
  free(csv);
}

static void presence_cb(uv_timer_t *h)
{
  nh_dispatch_t *d = h->data;
  if (!d->pumping && !d->stopping) write_row(d);
}

void nh_dispatch_set_owner(nh_dispatch_t *d, const char *owner)
{
  free(d->owner);
  d->owner = nh_xstrdup(owner);
}

void nh_dispatch_presence_update(nh_dispatch_t *d)
{
  if (!d->owner) return;
  if (!d->started_ms) d->started_ms = nh_time_now_ms();
  write_row(d);
  uv_timer_start(&d->presence_timer, presence_cb, NH_PRESENCE_EVERY_MS, NH_PRESENCE_EVERY_MS);
}

void nh_dispatch_presence_end(nh_dispatch_t *d)
{
  uv_timer_stop(&d->presence_timer);
  if (!d->owner || !d->started_ms) return;
  if (!d->store) {
    nh_pg_args_t a;
    pg_write(d, nh_pgargs_host_del(&a, d->owner), &a);
  } else if (nh_store_begin(d->store) == NH_OK) {
    if (nh_store_host_del(d->store, d->owner) || nh_store_commit(d->store)) nh_store_rollback(d->store);
  }
}
