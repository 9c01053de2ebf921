/* Presence: the host's row in the store's `hosts` table (its owner id and endpoints),
 * refreshed every NH_PRESENCE_EVERY_MS and removed at stop, so operator commands can say
 * when no running host serves an endpoint. A SIGKILLed host's row stays behind; readers
 * ignore rows of dead local processes and rows not refreshed for a while. */
#include "nh_dispatch_int.h"
#include "core/nh_log.h"
#include "core/nh_util.h"

#include <stdlib.h>
#include <string.h>

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
  if (nh_store_begin(d->store) == NH_OK) {
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
  if (!d->owner || !d->store) return;   /* PostgreSQL: the hosts table is not written yet */
  if (!d->started_ms) d->started_ms = nh_time_now_ms();
  write_row(d);
  uv_timer_start(&d->presence_timer, presence_cb, NH_PRESENCE_EVERY_MS, NH_PRESENCE_EVERY_MS);
}

void nh_dispatch_presence_end(nh_dispatch_t *d)
{
  uv_timer_stop(&d->presence_timer);
  if (!d->owner || !d->started_ms || !d->store) return;
  if (nh_store_begin(d->store) == NH_OK) {
    if (nh_store_host_del(d->store, d->owner) || nh_store_commit(d->store)) nh_store_rollback(d->store);
  }
}
