/* Moving an endpoint's messages to its queues of another partition count, over AMQP 1.0
 * (nimbus-host partitions, docs/broker-partitions.md). Each source queue is read in order;
 * a message's new queue is its session's partition (the group-id's bucket, p0 without
 * one). A message whose new queue is its own stays where it is: it is held unsettled and
 * given back when the receiving session ends, and RabbitMQ puts it back in its place. Any
 * other is sent, the bytes as received, unsettled, to its new queue, and accepted on its
 * old one only once the broker accepted the copy: a crash duplicates, never loses.
 *
 * Where a source ends: a marker message (message-id NH_MOVE_SENTINEL + a uuid) is sent
 * to its tail first; reading stops at it, so the move needs no message counts (the
 * management API's lag behind) and no drain (which crashes RabbitMQ 3.10's classic
 * queues, docs/broker-partitions.md). A marker left by an interrupted run is dropped.
 * A marker that never comes back (a max-length or TTL policy dropped it) would make the
 * move wait for ever: with nothing read or confirmed for stall_ms it stops, saying so. */
#include "nh_amqp_int.h"
#include "core/nh_log.h"
#include "core/nh_util.h"

#include <proton/condition.h>
#include <proton/connection.h>
#include <proton/delivery.h>
#include <proton/disposition.h>
#include <proton/event.h>
#include <proton/link.h>
#include <proton/message.h>
#include <proton/session.h>
#include <proton/terminus.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NH_MOVE_SENTINEL "nimbus-partitions-end:"
#define NH_MOVE_WINDOW 256   /* per source: messages read, not yet settled there */
#define NH_MOVE_GUARD_MS 3000   /* how often the consumers are looked at during the move */

typedef struct item {
  pn_delivery_t *src;          /* NULL: the source's end marker */
  char *bytes;
  size_t len;
  struct item *next;
} item_t;

typedef struct dest {
  char *queue;
  pn_link_t *snd;
  item_t *head, *tail;         /* to send, in the order read */
} dest_t;

typedef struct src {
  char *queue;
  pn_link_t *rcv;
  int done;                    /* its end marker came back */
} src_t;

struct nh_amqp_move {
  uv_loop_t *loop;
  const nh_amqp_url_t *url;
  nh_amqp_conn_t *conn;
  uv_timer_t guard;              /* a host that starts consuming meanwhile stops the move */
  nh_rmq_consumers_t *guard_call;
  int open_handles;              /* the connection and the guard: done once both closed */
  char *endpoint;
  int partitions;
  src_t *src;
  int nsrc;
  dest_t *dst;                 /* the new partitions' queues, then sources that are not one */
  int ndst;
  pn_session_t *rssn;          /* the receivers' session: its end gives back what stays */
  int ending, ended, closed;
  int unconfirmed;             /* copies sent, the broker's outcome not back */
  uint64_t stall_ms;           /* nothing read or confirmed for that long: stopped */
  uint64_t progress_at;        /* loop time of the last message read or confirmed */
  uint64_t tag;
  char marker[80];
  long moved, stayed;
  char *buf;
  size_t cap;
  char why[600];
  void (*done)(void *, const char *);
  void *data;
};

static char *copy_of(const char *bytes, size_t len)
{
  char *c = nh_xmalloc(len ? len : 1);
  memcpy(c, bytes, len);
  return c;
}

static dest_t *dest_of(nh_amqp_move_t *m, const char *queue)
{
  for (int i = 0; i < m->ndst; i++)
    if (strcmp(m->dst[i].queue, queue) == 0) return &m->dst[i];
  return NULL;
}

static src_t *src_of(nh_amqp_move_t *m, pn_link_t *l)
{
  for (int i = 0; i < m->nsrc; i++)
    if (m->src[i].rcv == l) return &m->src[i];
  return NULL;
}

static void handle_closed(void *data)
{
  nh_amqp_move_t *m = data;
  if (--m->open_handles > 0) return;
  m->closed = 1;
  if (m->done) m->done(m->data, m->why[0] ? m->why : NULL);
}

static void guard_closed(uv_handle_t *h) { handle_closed(h->data); }

static void finish(nh_amqp_move_t *m, const char *why)
{
  if (m->closed || m->ending == 2) return;
  m->ending = 2;
  if (why && !m->why[0]) snprintf(m->why, sizeof m->why, "%s", why);
  nh_rmq_consumers_cancel(m->guard_call);
  m->guard_call = NULL;
  uv_close((uv_handle_t *)&m->guard, guard_closed);
  /* what was not accepted (held, or a copy not confirmed) goes back to its queue */
  nh_amqp_conn_close(m->conn, handle_closed, m);
}

/* The command checked that nothing consumed the queues, but the management API shows a
 * consumer some seconds late: a source with a consumer beside this one (a host that was
 * starting) would take messages, the end marker among them, and the move would wait for
 * ever. Stopped, saying so; what is not moved stays. */
static void guard_seen(void *data, json_t *consumers, const char *why)
{
  nh_amqp_move_t *m = data;
  m->guard_call = NULL;
  if (!consumers || m->ending) {
    if (why) nh_log_debug("amqp", "partitions move: %s", why);
    return;
  }
  for (int i = 0; i < m->nsrc; i++) {
    int n = nh_rmq_consumers_on(consumers, m->src[i].queue);
    if (n > 1 && !m->src[i].done) {
      char buf[600];
      snprintf(buf, sizeof buf, "another consumer appeared on %s during the move (%d consumers): stop every host "
               "of %s and run the command again", m->src[i].queue, n, m->endpoint);
      finish(m, buf);
      return;
    }
  }
}

/* Nothing read and nothing confirmed for stall_ms: say what it waits for, the first cause
 * first (no connection; no credit to send, so no copy and no end marker goes; copies not
 * answered, so no credit to read; an end marker that did not come back), and stop. What
 * was not moved stays where it is, and running the command again goes on. */
static int stalled(nh_amqp_move_t *m)
{
  if (m->ending || uv_now(m->loop) - m->progress_at < m->stall_ms) return 0;
  double s = (double)m->stall_ms / 1000.0;
  int to_send = 0;
  for (int i = 0; i < m->ndst; i++) to_send |= m->dst[i].head != NULL;
  char open[400] = "";
  size_t at = 0;
  for (int i = 0; i < m->nsrc && at < sizeof open - 1; i++)
    if (!m->src[i].done)
      at += (size_t)snprintf(open + at, sizeof open - at, "%s%s", at ? ", " : "", m->src[i].queue);
  char buf[1200];
  if (!m->rssn)   /* a TCP peer that never answers the AMQP open (a hung broker, a wrong port) */
    snprintf(buf, sizeof buf, "the broker did not open the AMQP connection in %.0f s: check the broker and the port "
             "of the transport URL, then run the command again", s);
  else if (to_send)
    snprintf(buf, sizeof buf, "the broker gave no credit to send to the new queues for %.0f s (a memory or disk alarm "
             "blocks publishers: rabbitmq-diagnostics alarms); run the command again once it is cleared", s);
  else if (m->unconfirmed)
    snprintf(buf, sizeof buf, "the broker answered none of the %d copies sent to it for %.0f s; run the command "
             "again", m->unconfirmed, s);
  else
    snprintf(buf, sizeof buf, "nothing came from %s for %.0f s, and the end marker this command sent to its tail did "
             "not come back: a policy on the queue (max-length, message-ttl: rabbitmqctl list_policies -p %s) may "
             "have dropped it. Remove such a policy and run the command again", open[0] ? open : "the old queues", s,
             m->url->vhost ? m->url->vhost : "/");
  finish(m, buf);
  return 1;
}

static void guard_tick(uv_timer_t *t)
{
  nh_amqp_move_t *m = t->data;
  if (stalled(m)) return;
  if (!m->ending && !m->guard_call) m->guard_call = nh_rmq_consumers(m->loop, m->url, guard_seen, m);
}

static void push(dest_t *d, item_t *it)
{
  if (d->tail) d->tail->next = it;
  else d->head = it;
  d->tail = it;
}

static void pump(nh_amqp_move_t *m, dest_t *d)
{
  while (d->head && pn_link_credit(d->snd) > 0) {
    item_t *it = d->head;
    d->head = it->next;
    if (!d->head) d->tail = NULL;
    m->tag++;
    pn_delivery_t *out = pn_delivery(d->snd, pn_dtag((const char *)&m->tag, sizeof m->tag));
    pn_delivery_set_context(out, it->src);
    pn_link_send(d->snd, it->bytes, it->len);
    pn_link_advance(d->snd);
    m->unconfirmed++;
    free(it->bytes);
    free(it);
  }
}

static void end_marker(nh_amqp_move_t *m, dest_t *d)
{
  pn_message_t *pm = pn_message();
  pn_data_put_string(pn_message_id(pm), pn_bytes(strlen(m->marker), m->marker));
  pn_message_set_subject(pm, "nimbus.partitions-end");
  char bytes[512];
  size_t len = sizeof bytes;
  if (pn_message_encode(pm, bytes, &len) != 0) len = 0;   /* cannot happen: it is this small */
  pn_message_free(pm);
  item_t *it = nh_xcalloc(1, sizeof *it);
  it->bytes = copy_of(bytes, len);
  it->len = len;
  push(d, it);
}

static void check_done(nh_amqp_move_t *m)
{
  if (m->ending) return;
  for (int i = 0; i < m->nsrc; i++)
    if (!m->src[i].done) return;
  for (int i = 0; i < m->ndst; i++)
    if (m->dst[i].head) return;
  if (m->unconfirmed) return;
  /* every source read to its end and every move settled: ending the session gives back
   * what stays (held unsettled), in its place; its END answered means the broker has
   * taken every acceptance sent before it */
  m->ending = 1;
  pn_session_close(m->rssn);
}

static void on_up(void *data, pn_connection_t *c)
{
  nh_amqp_move_t *m = data;
  m->progress_at = uv_now(m->loop);
  pn_session_t *sssn = pn_session(c);
  pn_session_open(sssn);
  m->rssn = pn_session(c);
  pn_session_open(m->rssn);
  char name[700], addr[600];
  for (int i = 0; i < m->ndst; i++) {
    dest_t *d = &m->dst[i];
    snprintf(name, sizeof name, "nimbus-partitions-to-%s", d->queue);
    snprintf(addr, sizeof addr, "/amq/queue/%s", d->queue);
    d->snd = pn_sender(sssn, name);
    pn_terminus_set_address(pn_link_target(d->snd), addr);
    pn_link_set_snd_settle_mode(d->snd, PN_SND_UNSETTLED);
    pn_link_open(d->snd);
  }
  for (int i = 0; i < m->nsrc; i++) {
    src_t *s = &m->src[i];
    end_marker(m, dest_of(m, s->queue));   /* before anything this run forwards to it */
    snprintf(name, sizeof name, "nimbus-partitions-from-%s", s->queue);
    snprintf(addr, sizeof addr, "/amq/queue/%s", s->queue);
    s->rcv = pn_receiver(m->rssn, name);
    pn_terminus_set_address(pn_link_source(s->rcv), addr);
    pn_terminus_set_address(pn_link_target(s->rcv), name);
    pn_link_set_snd_settle_mode(s->rcv, PN_SND_UNSETTLED);
    pn_link_set_rcv_settle_mode(s->rcv, PN_RCV_FIRST);
    pn_link_open(s->rcv);
    pn_link_flow(s->rcv, NH_MOVE_WINDOW);
  }
}

/* A message read from source s: dropped (an end marker), held (it stays), or queued for
 * its new partition's queue. */
static void incoming(nh_amqp_move_t *m, src_t *s, pn_delivery_t *dlv)
{
  m->progress_at = uv_now(m->loop);
  ssize_t n = nh_amqp_dlv_bytes(dlv, &m->buf, &m->cap);
  /* the whole group-id, however long: a session's partition is a hash of all of it, as
   * its publishers computed it (a cut one would put its old and new events apart) */
  char mid[200], *group = n < 0 ? NULL : nh_xmalloc((size_t)n + 1);
  if (n < 0 || nh_amqp_msg_peek(m->buf, (size_t)n, mid, sizeof mid, group, (size_t)n + 1)) {
    free(group);
    snprintf(m->why, sizeof m->why, "a message in %s is not an AMQP message: left in its place, nothing more moved",
             s->queue);
    finish(m, NULL);
    return;
  }
  unsigned bucket = group[0] ? nh_amqp_session_bucket(group) : 0;
  free(group);
  if (strncmp(mid, NH_MOVE_SENTINEL, strlen(NH_MOVE_SENTINEL)) == 0) {
    pn_delivery_update(dlv, PN_ACCEPTED);   /* ours, or an interrupted run's: dropped */
    pn_delivery_settle(dlv);
    if (strcmp(mid, m->marker) == 0) s->done = 1;
    else pn_link_flow(s->rcv, 1);
    return;
  }
  char queue[600];
  nh_rmq_partition_queue(m->endpoint, m->partitions, (int)(bucket & (unsigned)(m->partitions - 1)), queue,
                         sizeof queue);
  if (s->done || strcmp(queue, s->queue) == 0) {   /* stays: held, given back at the end */
    if (!s->done) {
      m->stayed++;
      pn_link_flow(s->rcv, 1);
    }
    return;
  }
  item_t *it = nh_xcalloc(1, sizeof *it);
  it->src = dlv;
  it->bytes = copy_of(m->buf, (size_t)n);
  it->len = (size_t)n;
  dest_t *d = dest_of(m, queue);
  push(d, it);
  pump(m, d);
}

/* The broker's outcome for a copy (or an end marker): the original is accepted only now. */
static void outcome(nh_amqp_move_t *m, pn_delivery_t *out)
{
  uint64_t st = pn_delivery_remote_state(out);
  if (!st) return;
  pn_delivery_t *src = pn_delivery_get_context(out);
  const char *to = pn_terminus_get_address(pn_link_target(pn_delivery_link(out)));
  pn_delivery_settle(out);
  m->unconfirmed--;
  m->progress_at = uv_now(m->loop);
  if (st != PN_ACCEPTED) {
    snprintf(m->why, sizeof m->why, "the broker did not take a message sent to %s (%s): nothing more moved; run "
             "the command again", to, pn_disposition_type_name(st));
    finish(m, NULL);
    return;
  }
  if (!src) return;   /* an end marker */
  src_t *s = src_of(m, pn_delivery_link(src));
  pn_delivery_update(src, PN_ACCEPTED);
  pn_delivery_settle(src);
  m->moved++;
  if (s && !s->done) pn_link_flow(s->rcv, 1);
}

static void closed_by_peer(nh_amqp_move_t *m, pn_condition_t *cond, const char *what)
{
  char why[600];
  snprintf(why, sizeof why, "the broker closed the %s: %s %s", what,
           pn_condition_get_name(cond) ? pn_condition_get_name(cond) : "(no condition)",
           pn_condition_get_description(cond) ? pn_condition_get_description(cond) : "");
  finish(m, why);
}

static void on_event(void *data, pn_event_t *e)
{
  nh_amqp_move_t *m = data;
  if (m->ending == 2) return;
  switch (pn_event_type(e)) {
  case PN_DELIVERY: {
    pn_delivery_t *dlv = pn_event_delivery(e);
    pn_link_t *l = pn_delivery_link(dlv);
    if (pn_link_is_sender(l)) {
      if (pn_delivery_updated(dlv)) outcome(m, dlv);
    } else if (pn_delivery_readable(dlv) && !pn_delivery_partial(dlv)) {
      src_t *s = src_of(m, l);
      if (s) incoming(m, s, dlv);
    }
    break;
  }
  case PN_LINK_FLOW: {
    pn_link_t *l = pn_event_link(e);
    for (int i = 0; i < m->ndst; i++)
      if (m->dst[i].snd == l) pump(m, &m->dst[i]);
    break;
  }
  case PN_LINK_REMOTE_CLOSE:
    if (!m->ending) closed_by_peer(m, pn_link_remote_condition(pn_event_link(e)), "link");
    break;
  case PN_SESSION_REMOTE_CLOSE:
    if (pn_event_session(e) == m->rssn && m->ending == 1) {
      m->ended = 1;
      finish(m, NULL);
    } else {
      closed_by_peer(m, pn_session_remote_condition(pn_event_session(e)), "session");
    }
    return;
  case PN_CONNECTION_REMOTE_CLOSE:
    closed_by_peer(m, pn_connection_remote_condition(pn_event_connection(e)), "connection");
    return;
  default:
    break;
  }
  check_done(m);
}

static void on_down(void *data, const char *why, int fatal)
{
  (void)fatal;
  nh_amqp_move_t *m = data;
  if (m->ending == 2) return;
  char buf[600];
  snprintf(buf, sizeof buf, "the AMQP connection ended: %s", why ? why : "");
  finish(m, buf);   /* no reconnect: running the command again goes on from where this stopped */
}

nh_amqp_move_t *nh_amqp_move(uv_loop_t *loop, const nh_amqp_url_t *url, const char *endpoint, int partitions,
                             const char *const *sources, int nsources, int stall_s,
                             void (*done)(void *, const char *), void *data)
{
  nh_amqp_move_t *m = nh_xcalloc(1, sizeof *m);
  m->loop = loop;
  m->stall_ms = (uint64_t)(stall_s > 0 ? stall_s : 1) * 1000;
  m->progress_at = uv_now(loop);   /* the connection's set-up counts too */
  m->url = url;
  m->endpoint = nh_xstrdup(endpoint);
  m->partitions = partitions;
  m->done = done;
  m->data = data;
  char uuid[37];
  nh_uuid_v7(uuid);
  snprintf(m->marker, sizeof m->marker, "%s%s", NH_MOVE_SENTINEL, uuid);
  m->dst = nh_xcalloc((size_t)(partitions + nsources), sizeof *m->dst);
  for (int i = 0; i < partitions; i++) {
    char q[600];
    nh_rmq_partition_queue(endpoint, partitions, i, q, sizeof q);
    m->dst[m->ndst++].queue = nh_xstrdup(q);
  }
  m->src = nh_xcalloc((size_t)(nsources > 0 ? nsources : 1), sizeof *m->src);
  for (int i = 0; i < nsources; i++) {
    m->src[m->nsrc++].queue = nh_xstrdup(sources[i]);
    if (!dest_of(m, sources[i])) m->dst[m->ndst++].queue = nh_xstrdup(sources[i]);   /* for its end marker */
  }
  static const nh_amqp_conn_cbs_t cbs = { on_up, on_event, on_down };
  char container[128];
  snprintf(container, sizeof container, "nimbus-host-partitions-%s", uuid);
  m->conn = nh_amqp_conn_init(loop, url, container, &cbs, m);
  m->open_handles = 2;
  uv_timer_init(loop, &m->guard);
  m->guard.data = m;
  uint64_t tick = m->stall_ms < NH_MOVE_GUARD_MS ? m->stall_ms : NH_MOVE_GUARD_MS;
  uv_timer_start(&m->guard, guard_tick, tick, tick);
  nh_amqp_conn_start(m->conn);
  return m;
}

void nh_amqp_move_counts(const nh_amqp_move_t *m, long *moved, long *stayed)
{
  *moved = m->moved;
  *stayed = m->stayed;
}

void nh_amqp_move_free(nh_amqp_move_t *m)
{
  if (!m) return;
  for (int i = 0; i < m->ndst; i++) {
    for (item_t *it = m->dst[i].head, *next; it; it = next) {
      next = it->next;
      free(it->bytes);
      free(it);
    }
    free(m->dst[i].queue);
  }
  for (int i = 0; i < m->nsrc; i++) free(m->src[i].queue);
  free(m->dst);
  free(m->src);
  free(m->buf);
  free(m->endpoint);
  nh_amqp_conn_free(m->conn);
  free(m);
}
