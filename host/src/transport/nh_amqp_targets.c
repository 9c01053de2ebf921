/* Endpoints this process sends to without consuming them (`nimbus.publish{ to = ... }`,
 * `publish --to`): how many partitions each has on the broker, asked of the management API
 * once, so that a message reaches its session's partition queue.
 *
 * An outbox row names the endpoint's own queue (/amq/queue/<Ep>) when the send did not know
 * better. RabbitMQ accepts a message for a queue that does not exist and drops it, so such a
 * row is not sent before the answer is in: it is held (a->held), and sent once the endpoint
 * is known, re-addressed to its session's partition when it has partitions. An endpoint with
 * no queue at all (no host ran it yet, or a misspelt name) is asked about again every
 * NH_TARGET_RETRY_MS, its rows held and said in the log: nothing is dropped, and the rest of
 * the outbox goes on meanwhile. docs/broker-partitions.md, "Sending to an endpoint". */
#include "nh_amqp_priv.h"
#include "core/nh_log.h"
#include "core/nh_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NH_TARGET_RETRY_MS 5000
#define NH_TARGET_TELL_EVERY 12   /* an endpoint still missing is said again every minute */

enum { T_KNOWN, T_ASKING, T_WAITING };

struct atarget {
  char *name;
  int nparts;
  int state;
  int asked;                     /* probes answered "none" or failed in a row */
};

typedef struct target_probe {
  amqp_t *a;
  char *name;
} target_probe_t;

static struct atarget *target_find(amqp_t *a, const char *name)
{
  for (int i = 0; i < a->ntargets; i++)
    if (strcmp(a->targets[i].name, name) == 0) return &a->targets[i];
  return NULL;
}

static struct atarget *target_add(amqp_t *a, const char *name, int nparts, int state)
{
  a->targets = nh_xrealloc(a->targets, sizeof *a->targets * (size_t)(a->ntargets + 1));
  a->targets[a->ntargets] = (struct atarget){ nh_xstrdup(name), nparts, state, 0 };
  return &a->targets[a->ntargets++];
}

void nh_amqp_target_partitions(nh_transport_t *t, const char *endpoint, int n)
{
  amqp_t *a = (amqp_t *)t;
  struct atarget *tg = target_find(a, endpoint);
  if (!tg) tg = target_add(a, endpoint, n, T_KNOWN);
  tg->nparts = n;
  tg->state = T_KNOWN;
}

int nh_amqp_parts_of(amqp_t *a, const char *endpoint)
{
  aep_t *ep = nh_amqp_ep_find(a, endpoint);
  if (ep) return ep->nparts;
  struct atarget *tg = target_find(a, endpoint);
  return tg && tg->state == T_KNOWN ? tg->nparts : 1;
}

/* ---------------------------------------------------------------- held rows */

static int seq_cmp(const void *x, const void *y)
{
  int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
  return (a > b) - (a < b);
}

static void hold(amqp_t *a, int64_t seq)
{
  for (int i = 0; i < a->nheld; i++)
    if (a->held[i] == seq) return;
  a->held = nh_amqp_grow(a->held, &a->cheld, a->nheld + 1, sizeof *a->held);
  a->held[a->nheld++] = seq;
}

/* An endpoint became known: every held row is sent again, alone, in the order written (one
 * of an endpoint still unknown is held again as it comes round). */
static void release_held(amqp_t *a)
{
  if (a->nheld == 0) return;
  qsort(a->held, (size_t)a->nheld, sizeof *a->held, seq_cmp);
  a->resend = nh_amqp_grow(a->resend, &a->cresend, a->nresend + a->nheld, sizeof *a->resend);
  memcpy(a->resend + a->nresend, a->held, sizeof *a->held * (size_t)a->nheld);
  a->nresend += a->nheld;
  a->nheld = 0;
  nh_amqp_outbox_pump(a);
}

/* ---------------------------------------------------------------- asking the broker */

static void target_ask(amqp_t *a, struct atarget *tg);

static void retry_tick(uv_timer_t *t)
{
  amqp_t *a = t->data;
  if (!a || a->shutting_down) return;
  for (int i = 0; i < a->ntargets; i++)
    if (a->targets[i].state == T_WAITING) target_ask(a, &a->targets[i]);
}

static void retry_closed(uv_handle_t *h) { free(h); }

static void retry_later(amqp_t *a)
{
  if (!a->target_timer) {
    a->target_timer = nh_xcalloc(1, sizeof *a->target_timer);
    uv_timer_init(a->loop, a->target_timer);
    a->target_timer->data = a;
  }
  if (!uv_is_active((uv_handle_t *)a->target_timer)) uv_timer_start(a->target_timer, retry_tick, NH_TARGET_RETRY_MS, 0);
}

static void target_probed(void *data, int found, const char *why)
{
  target_probe_t *p = data;
  amqp_t *a = p->a;
  /* cancelled by a stopping transport: the held rows stay in the outbox for the next start */
  struct atarget *tg = a->targets_off || a->shutting_down ? NULL : target_find(a, p->name);
  if (tg && found >= 1) {
    tg->state = T_KNOWN;
    tg->nparts = found;
    if (found > 1)
      nh_log_info("amqp", "sending to endpoint %s: %d partition queues (%s.p0 .. %s.p%d), each message to its "
                  "session's", tg->name, found, tg->name, tg->name, found - 1);
    else if (tg->asked)
      nh_log_info("amqp", "sending to endpoint %s: its queue is there now; the held messages go", tg->name);
    tg->asked = 0;
    release_held(a);
  } else if (tg) {
    tg->state = T_WAITING;
    if (tg->asked++ % NH_TARGET_TELL_EVERY == 0) {
      if (found == 0)
        nh_log_error("amqp", "sending to endpoint %s: the broker has no queue %s (nor partition queues %s.p0 ..), and "
                     "RabbitMQ would drop what is sent there; its messages wait in the outbox, asked again every %d s. "
                     "Start a host that runs %s (it declares the queues), or correct the `to` of the nimbus.publish",
                     tg->name, tg->name, tg->name, NH_TARGET_RETRY_MS / 1000, tg->name);
      else
        nh_log_warn("amqp", "sending to endpoint %s: cannot ask the broker for its queues (%s); its messages wait in "
                    "the outbox, asked again every %d s", tg->name, why ? why : "no answer", NH_TARGET_RETRY_MS / 1000);
    }
    retry_later(a);
  }
  free(p->name);
  free(p);
}

static void target_ask(amqp_t *a, struct atarget *tg)
{
  tg->state = T_ASKING;
  target_probe_t *p = nh_xcalloc(1, sizeof *p);
  p->a = a;
  p->name = nh_xstrdup(tg->name);
  nh_error_t err = {0};
  if (nh_amqp_probe(&a->base, NULL, tg->name, target_probed, p, &err)) target_probed(p, -1, err.msg);
}

/* A queue this process declared, or a partition queue of an endpoint it knows. */
static int known_queue(amqp_t *a, const char *queue)
{
  int idx;
  nh_queue_t *q;
  nh_queue_foreach(q, &a->eps) {
    aep_t *ep = nh_queue_data(q, aep_t, node);
    if (nh_rmq_queue_of(ep->name, queue, &idx)) return 1;
  }
  for (int i = 0; i < a->ntargets; i++)
    if (a->targets[i].nparts > 1 && nh_rmq_queue_of(a->targets[i].name, queue, &idx) == 2) return 1;
  return 0;
}

/* Is `name` an endpoint to ask the broker about? Service Bus has no --to; without the
 * management API nobody can be asked (documented); reply queues are made by their
 * requester and are there. */
static int askable(amqp_t *a, const char *name)
{
  return !a->sb && !a->url.no_management && !a->targets_off && strncmp(name, "_reply.", 7) != 0 &&
         !known_queue(a, name);
}

int nh_amqp_target_resolve(amqp_t *a, int64_t seq, const char *address, const void *message, size_t len,
                           char *out, size_t outlen)
{
  static const char prefix[] = "/amq/queue/";
  if (strncmp(address, prefix, sizeof prefix - 1) != 0) return 0;
  const char *name = address + sizeof prefix - 1;
  struct atarget *tg = target_find(a, name);
  if (!tg) {   /* the first row for it: this process's, one taken over at start, or one from before a restart */
    if (!askable(a, name)) return 0;
    tg = target_add(a, name, 1, T_ASKING);
    target_ask(a, tg);
  }
  if (tg->state != T_KNOWN) {
    hold(a, seq);
    return -1;
  }
  if (tg->nparts <= 1) return 0;
  char mid[200], *group = nh_xmalloc(len + 1);
  unsigned bucket = 0;
  if (nh_amqp_msg_peek(message, len, mid, sizeof mid, group, len + 1) == NH_OK && group[0])
    bucket = nh_amqp_session_bucket(group);
  free(group);
  char queue[512];
  nh_rmq_partition_queue(tg->name, tg->nparts, (int)(bucket & (unsigned)(tg->nparts - 1)), queue, sizeof queue);
  snprintf(out, outlen, "%s%s", prefix, queue);
  return 1;
}

void nh_amqp_targets_stop(amqp_t *a)
{
  if (a->target_timer) uv_timer_stop(a->target_timer);
}

void nh_amqp_targets_free(amqp_t *a)
{
  a->targets_off = 1;   /* a probe cancelled after this answers into nothing */
  if (a->target_timer) {
    a->target_timer->data = NULL;
    uv_close((uv_handle_t *)a->target_timer, retry_closed);
    a->target_timer = NULL;
  }
  for (int i = 0; i < a->ntargets; i++) free(a->targets[i].name);
  free(a->targets);
  a->targets = NULL;
  a->ntargets = 0;
  free(a->held);
  a->held = NULL;
  a->nheld = a->cheld = 0;
}
