/* Spreading an endpoint's partitions over the live hosts (docs/broker-partitions.md,
 * "Spreading"). RabbitMQ's single active consumer gives a partition queue to the consumer
 * that attached first, so the host started first would be active on all of them and the
 * others would only stand by. Every couple of seconds each host reads the vhost's
 * consumers from the management API; while it is active on more than its share it hands
 * one partition on (nh_amqp_part_yield: nothing more handed to handlers, what is in them
 * settled by this host, then the end of the partition's AMQP session, which gives the
 * rest back in place), the broker activates the next waiting consumer, and this host
 * attaches again at the end of the line. The store's session lock keeps each session in
 * order across the move, as at a failover. The management API shows a move some seconds
 * late (its statistics interval), so nothing moves while a partition shows no active
 * consumer. */
#include "nh_amqp_priv.h"
#include "core/nh_log.h"
#include "core/nh_util.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#ifndef NH_SPREAD_MS
#define NH_SPREAD_MS 2000   /* between two looks at the consumers, +- a quarter (hosts out of step) */
#endif

int nh_amqp_spread_pick(int nparts, int nhosts, const int *owner, const int *waiting, const int *load, int *out)
{
  if (nhosts < 2 || nparts < 2) return 0;
  for (int i = 0; i < nparts; i++)   /* a move not shown whole yet: look again later */
    if (owner[i] < 0 || owner[i] >= nhosts) return 0;
  int *count = nh_xcalloc((size_t)nhosts, sizeof *count);
  for (int i = 0; i < nparts; i++) count[owner[i]]++;
  int lo = nparts / nhosts, hi = (nparts + nhosts - 1) / nhosts, under = 0;
  for (int h = 0; h < nhosts; h++)
    if (count[h] < lo) under = 1;
  int mine = count[0];
  free(count);
  int want = mine > hi ? mine - hi : mine > lo && under ? 1 : 0;
  int n = 0;
  while (n < want) {   /* ones with another host in line, the least loaded first */
    int best = -1;
    for (int i = 0; i < nparts; i++) {
      int taken = 0;
      for (int k = 0; k < n; k++) taken |= out[k] == i;
      if (owner[i] == 0 && waiting[i] > 0 && !taken && (best < 0 || load[i] < load[best])) best = i;
    }
    if (best < 0) break;
    out[n++] = best;
  }
  return n;
}

static void spread_arm(amqp_t *a)
{
  uint64_t ms = (uint64_t)(NH_SPREAD_MS * (0.75 + nh_random_unit() / 2));
  uv_timer_start(&a->spread_timer, nh_amqp_spread_tick, ms, 0);
}

/* The index of a host's connection name in names (this host first), added when new. */
static int host_index(const char ***names, int *n, int *cap, const char *name)
{
  for (int i = 0; i < *n; i++)
    if (strcmp((*names)[i], name) == 0) return i;
  *names = nh_amqp_grow(*names, cap, *n + 1, sizeof **names);
  (*names)[*n] = name;
  return (*n)++;
}

/* The partition number of queue q of an endpoint of nparts (`<ep>.p<i>`), or -1. */
static int part_of(const aep_t *ep, const char *q)
{
  size_t n = strlen(ep->name);
  if (strncmp(q, ep->name, n) != 0 || q[n] != '.' || q[n + 1] != 'p') return -1;
  char *end;
  long i = strtol(q + n + 2, &end, 10);
  if (*end || end == q + n + 2 || i < 0 || i >= ep->nparts) return -1;
  return strcmp(ep->parts[i].queue, q) == 0 ? (int)i : -1;
}

static void spread_endpoint(aep_t *ep, json_t *list, const char *me)
{
  for (int i = 0; i < ep->nparts; i++)   /* one move at a time, with every receiver in place */
    if (ep->parts[i].yielding || !ep->parts[i].attached) return;
  int P = ep->nparts, nhosts = 0, cap = 0;
  int *owner = nh_xmalloc((size_t)P * sizeof *owner), *waiting = nh_xcalloc((size_t)P, sizeof *waiting),
      *load = nh_xmalloc((size_t)P * sizeof *load);
  const char **names = NULL;
  host_index(&names, &nhosts, &cap, me);
  for (int i = 0; i < P; i++) {
    owner[i] = -1;
    load[i] = ep->parts[i].nbuf + ep->parts[i].inflight;
  }
  size_t k;
  json_t *c;
  json_array_foreach(list, k, c) {
    const char *q = json_string_value(json_object_get(json_object_get(c, "queue"), "name"));
    const char *conn = json_string_value(json_object_get(json_object_get(c, "channel_details"), "connection_name"));
    int i = q && conn ? part_of(ep, q) : -1;
    if (i < 0) continue;
    int h = host_index(&names, &nhosts, &cap, conn);
    if (json_is_true(json_object_get(c, "active"))) owner[i] = owner[i] == -1 ? h : -2;   /* two: a view mid-move */
    else if (h != 0) waiting[i]++;
  }
  int *pick = nh_xmalloc((size_t)P * sizeof *pick);
  int n = nh_amqp_spread_pick(P, nhosts, owner, waiting, load, pick), mine = 0;
  for (int i = 0; i < P; i++) mine += owner[i] == 0;
  for (int j = 0; j < n; j++) {
    nh_log_info("amqp", "%s: handing partition %s on to a waiting host (active here on %d of %d partitions, %d hosts "
                "consume them)", ep->name, ep->parts[pick[j]].queue, mine, P, nhosts);
    nh_amqp_part_yield(&ep->parts[pick[j]]);
  }
  free(pick);
  free(names);
  free(owner);
  free(waiting);
  free(load);
}

static void spread_answer(void *data, json_t *list, const char *why)
{
  amqp_t *a = data;
  a->spread_call = NULL;
  if (!a->shutting_down) spread_arm(a);
  if (!list) {
    if (!a->spread_warned) nh_log_warn("amqp", "spreading partitions over hosts: %s (tried again every %d ms)", why,
                                       NH_SPREAD_MS);
    a->spread_warned = 1;
    return;
  }
  a->spread_warned = 0;
  if (a->spread_gen != a->conn_gen || !a->ssn) return;   /* another connection's consumers */
  /* this host's connection: the one consuming its own reply queue */
  const char *me = NULL;
  nh_queue_t *q;
  nh_queue_foreach(q, &a->eps) {
    aep_t *ep = nh_queue_data(q, aep_t, node);
    if (!ep->reply) continue;
    size_t k;
    json_t *c;
    json_array_foreach(list, k, c) {
      const char *name = json_string_value(json_object_get(json_object_get(c, "queue"), "name"));
      if (name && strcmp(name, ep->parts[0].queue) == 0)
        me = json_string_value(json_object_get(json_object_get(c, "channel_details"), "connection_name"));
    }
  }
  if (!me) return;
  nh_queue_foreach(q, &a->eps) {
    aep_t *ep = nh_queue_data(q, aep_t, node);
    if (ep->nparts > 1) spread_endpoint(ep, list, me);
  }
  if (a->conn) nh_amqp_conn_flush(a->conn);
}

void nh_amqp_spread_tick(uv_timer_t *t)
{
  amqp_t *a = t->data;
  if (a->shutting_down) return;
  nh_amqp_part_steps(a);        /* a hand-on waiting for a transient release's handler */
  nh_amqp_part_check_ends(a);
  int any = 0;
  nh_queue_t *q;
  nh_queue_foreach(q, &a->eps) any |= nh_queue_data(q, aep_t, node)->nparts > 1;
  if (!any || !a->ssn || !a->ready_sent) {
    spread_arm(a);
    return;
  }
  a->spread_gen = a->conn_gen;
  a->spread_call = nh_rmq_consumers(a->loop, &a->url, spread_answer, a);
  if (!a->spread_call) spread_arm(a);
}

void nh_amqp_spread_start(amqp_t *a)
{
  if (a->sb || a->url.no_management || a->spread_on) return;   /* partitions are refused there */
  uv_timer_init(a->loop, &a->spread_timer);
  uv_unref((uv_handle_t *)&a->spread_timer);   /* it never keeps the loop alive by itself */
  a->spread_timer.data = a;
  a->spread_on = 1;
  spread_arm(a);
}

void nh_amqp_spread_stop(amqp_t *a)
{
  nh_rmq_consumers_cancel(a->spread_call);
  a->spread_call = NULL;
  if (!a->spread_on) return;
  a->spread_on = 0;
  uv_close((uv_handle_t *)&a->spread_timer, NULL);
}
