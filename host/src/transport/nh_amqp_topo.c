/* AMQP topology and readiness: declaring (RabbitMQ's management API) or opening (Service
 * Bus SAS tokens) each endpoint's queue before its receiver attaches, "ready" once every
 * receiver is attached, the broker probes behind publish and nimbus.request, and Service
 * Bus lock renewal and token refresh. */
#include "nh_amqp_priv.h"
#include "core/nh_log.h"
#include "core/nh_sqlite.h"
#include "core/nh_util.h"

#include <proton/condition.h>
#include <proton/connection.h>
#include <proton/disposition.h>
#include <proton/terminus.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Probes in flight: a shutdown answers them "unknown" so their owners can free. */
typedef struct aprobe {
  amqp_t *a;
  nh_rmq_probe_t *h;
  void (*done)(void *, int, const char *);
  void *data;
  nh_queue_t node;               /* a->probes */
} aprobe_t;

static void aprobe_done(void *data, int found, const char *why)
{
  aprobe_t *p = data;
  nh_queue_remove(&p->node);
  p->done(p->data, found, why);
  free(p);
}

int nh_amqp_probe(nh_transport_t *t, const char *event_type, const char *to, void (*done)(void *, int, const char *),
                  void *data, nh_error_t *err)
{
  amqp_t *a = (amqp_t *)t;
  if (a->url.no_management || a->sb) return nh_error_set(err, NH_ENOTFOUND, "no management API to ask");
  aprobe_t *p = nh_xcalloc(1, sizeof *p);
  p->a = a;
  p->done = done;
  p->data = data;
  p->h = nh_rmq_probe(a->loop, &a->url, event_type, to, aprobe_done, p, err);
  if (!p->h) {
    free(p);
    return NH_EFAIL;
  }
  nh_queue_insert_head(&a->probes, &p->node);
  return NH_OK;
}

void nh_amqp_probes_cancel(amqp_t *a)
{
  while (!nh_queue_empty(&a->probes)) {
    aprobe_t *p = nh_queue_data(nh_queue_head(&a->probes), aprobe_t, node);
    nh_queue_remove(&p->node);
    nh_rmq_probe_cancel(p->h);
    p->done(p->data, -1, "the transport is shutting down");
    free(p);
  }
}

typedef struct renew_ctx {
  amqp_t *a;
  uint64_t id;
} renew_ctx_t;

static void lock_answer(void *data, int code, const char *desc)
{
  renew_ctx_t *c = data;
  rec_t *r = code < 0 ? NULL : nh_amqp_rec_get(c->a, c->id);
  if (r && code != 200) {
    nh_log_warn("amqp", "%s: renewing the lock of %s failed (status %d%s%s)", r->ep->name, r->msg.message_id, code,
                desc ? ": " : "", desc ? desc : "");
    r->lock_lost = 1;
  }
  free(c);
}

/* Service Bus: renew the peek-lock of the session's message in a handler. The answer
 * comes later; a refused renewal makes the next one report the lock lost. */
int nh_amqp_sb_renew(amqp_t *a, const char *endpoint, const char *session)
{
  for (int i = 0; i < NH_BUCKETS; i++)
    for (rec_t *r = a->buckets[i]; r; r = r->hnext) {
      if (r->buffered || strcmp(r->ep->name, endpoint) != 0 || strcmp(r->msg.session_id, session) != 0) continue;
      if (r->lock_lost) return 0;
      if (!r->dlv || r->ep->sessions) continue;   /* a session receiver's lock covers it (nh_amqp_sbs.c) */
      renew_ctx_t *c = nh_xmalloc(sizeof *c);
      c->a = a;
      c->id = r->id;
      nh_sb_renew_lock(a->sb, r->ep->entity, r->dlv, lock_answer, c);
    }
  if (a->conn) nh_amqp_conn_flush(a->conn);
  return 1;
}

/* A receiver per queue of the endpoint. With partitions every host attaches to every
 * partition; RabbitMQ's single active consumer gives each to one of them at a time, and
 * the others' receivers wait, credit granted, until it moves to them. */
void nh_amqp_attach(amqp_t *a, aep_t *ep)
{
  if (!a->ssn || !ep->declared || (ep->reply && (a->url.no_management || a->sb))) return;
  for (int i = 0; i < ep->nparts; i++) {
    apart_t *p = &ep->parts[i];
    if (p->link || (ep->sessions && uv_now(a->loop) < p->retry_at)) continue;
    char name[700];
    if (ep->sessions) {   /* unique per link: the broker tells a session's receivers apart by name */
      char id[37];
      nh_uuid_v4(id);
      snprintf(name, sizeof name, "nh-recv:%s:%d:%.8s", p->queue, i, id);
    } else {
      snprintf(name, sizeof name, "nh-recv:%s", p->queue);
    }
    pn_session_t *ssn = a->ssn;
    if (ep->nparts > 1 || ep->sessions) {   /* ended to let a Service Bus session go (nh_amqp_sbs.c) */   /* a session of its own, ended to hand the partition on (nh_amqp_part_yield) */
      p->ssn = ssn = pn_session(pn_session_connection(a->ssn));
      pn_session_open(ssn);
    }
    p->link = pn_receiver(ssn, name);
    pn_terminus_set_address(pn_link_source(p->link), p->address);
    pn_terminus_set_address(pn_link_target(p->link), name);   /* unique per link, as the SDKs do */
    pn_link_set_snd_settle_mode(p->link, PN_SND_UNSETTLED);
    /* Service Bus peek-lock is mode second; RabbitMQ settles on our disposition */
    pn_link_set_rcv_settle_mode(p->link, a->sb ? PN_RCV_SECOND : PN_RCV_FIRST);
    if (ep->sessions) nh_amqp_sbs_filter(p);
    pn_link_open(p->link);
  }
}

static void set_attached(aep_t *ep)
{
  for (int i = 0; i < ep->nparts; i++) ep->parts[i].attached = 1;
}

static void token_refused(amqp_t *a, const char *entity, int code, const char *desc)
{
  char why[1024];
  snprintf(why, sizeof why, "Service Bus refused the SAS token for sb://%s/%s (status %d%s%s): check the key name "
           "(user) and key (password) in --transport and that the policy may send/listen there",
           a->url.host, entity, code, desc ? ": " : "", desc ? desc : "");
  nh_amqp_status(a, NH_AMQP_FATAL, why);
}

void nh_amqp_topic_token(void *data, int code, const char *desc)
{
  if (code < 0) return;   /* the connection went first: the next one asks again */
  amqp_t *a = data;
  if (code != 200 && code != 202) {
    token_refused(a, a->url.exchange, code, desc);
    return;
  }
  a->topic_ok = 1;
  nh_amqp_outbox_pump(a);
}

void nh_amqp_check_ready(amqp_t *a)
{
  if (a->ready_sent || !a->ssn) return;
  nh_queue_t *q;
  nh_queue_foreach(q, &a->eps) {
    const aep_t *ep = nh_queue_data(q, aep_t, node);
    if (!ep->declared || !nh_amqp_ep_attached(ep)) return;
  }
  a->ready_sent = 1;
  nh_amqp_status(a, NH_AMQP_READY, a->url.display);
}

/* ---------------------------------------------------------------- topology */

static void declared(void *data, const char *why);

static void sub_token(void *data, int code, const char *desc)
{
  if (code < 0) return;   /* the connection went first: the next one asks again */
  aep_t *ep = data;
  amqp_t *a = ep->a;
  if (code != 200 && code != 202) {
    token_refused(a, ep->entity, code, desc);
    return;
  }
  ep->declared = ep->ever_declared = 1;
  nh_amqp_attach(a, ep);
  if (a->conn) nh_amqp_conn_flush(a->conn);
  nh_amqp_check_ready(a);
}

static void mgmt_token(void *data, int code, const char *desc)
{
  if (code < 0) return;   /* the connection went first: the next one asks again */
  aep_t *ep = data;
  if (code != 200 && code != 202)
    nh_log_warn("amqp", "%s: Service Bus refused the token for %s/$management (status %d%s%s): lock renewals will "
                "fail", ep->name, ep->entity, code, desc ? ": " : "", desc ? desc : "");
}

void nh_amqp_declare(amqp_t *a, aep_t *ep)
{
  if (a->sb) {   /* the topology exists already; the token opens it (on a connection) */
    if (ep->reply) {   /* no reply queues on Service Bus: nimbus.request times out */
      ep->declared = 1;
      set_attached(ep);
      nh_amqp_check_ready(a);
    } else if (a->ssn) {
      char mgmt[1100];
      snprintf(mgmt, sizeof mgmt, "%s/$management", ep->entity);   /* its own audience (renew-lock) */
      nh_sb_put_token(a->sb, mgmt, mgmt_token, ep);
      nh_sb_put_token(a->sb, ep->entity, sub_token, ep);
    }
    return;
  }
  if (a->url.no_management) {   /* provisioned outside the host */
    ep->declared = 1;
    if (ep->reply) set_attached(ep);   /* no reply queue without the API: requests time out */
    else nh_amqp_attach(a, ep);
    nh_amqp_check_ready(a);
    return;
  }
  if (ep->decl) nh_rmq_cancel(ep->decl);
  ep->decl = nh_rmq_declare(a->loop, &a->url, ep->name, ep->reply ? NH_RMQ_REPLY : 0, ep->nparts,
                            (const char *const *)ep->types, ep->ntypes, declared, ep);
}

static void declared(void *data, const char *why)
{
  aep_t *ep = data;
  amqp_t *a = ep->a;
  nh_rmq_cancel(ep->decl);
  ep->decl = NULL;
  if (why) {   /* transient failures are retried inside; this one is final */
    nh_amqp_status(a, NH_AMQP_FATAL, why);
    return;
  }
  nh_log_debug("amqp", "%s: queue and bindings declared", ep->name);
  if (ep->nparts > 1 && !ep->ever_declared)
    nh_log_info("amqp", "%s: %d partition queues (%s .. %s), each consumed by one host at a time", ep->name,
                ep->nparts, ep->parts[0].queue, ep->parts[ep->nparts - 1].queue);
  ep->declared = ep->ever_declared = 1;
  nh_amqp_attach(a, ep);
  if (a->conn) nh_amqp_conn_flush(a->conn);
  nh_amqp_check_ready(a);
}

/* Tokens live NH_SB_TOKEN_TTL_S; Service Bus detaches an entity's links when its token
 * expires, so every token is put again at three quarters of that. */
void nh_amqp_sb_refresh(uv_timer_t *h)
{
  amqp_t *a = h->data;
  if (!a->ssn) return;
  nh_log_debug("amqp", "refreshing the Service Bus tokens");
  nh_sb_put_token(a->sb, a->url.exchange, nh_amqp_topic_token, a);
  nh_queue_t *q;
  nh_queue_foreach(q, &a->eps) {
    aep_t *ep = nh_queue_data(q, aep_t, node);
    if (!ep->reply && ep->declared) nh_sb_put_token(a->sb, ep->entity, sub_token, ep);
  }
  if (a->conn) nh_amqp_conn_flush(a->conn);
}

typedef struct vprobe {
  void (*done)(void *, int);
  void *data;
} vprobe_t;

static void vprobe_done(void *data, int found, const char *why)
{
  vprobe_t *v = data;
  if (why) nh_log_debug("amqp", "probe: %s", why);
  v->done(v->data, found);
  free(v);
}

int nh_amqp_vt_probe(nh_transport_t *t, const char *event_type, void (*done)(void *, int), void *data)
{
  vprobe_t *v = nh_xmalloc(sizeof *v);
  v->done = done;
  v->data = data;
  nh_error_t err = {0};
  if (nh_amqp_probe(t, event_type, NULL, vprobe_done, v, &err)) {
    free(v);
    return NH_EFAIL;
  }
  return NH_OK;
}

