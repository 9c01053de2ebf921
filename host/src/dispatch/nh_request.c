/* Request/reply: nimbus.request sends a request (an event of the request type with a
 * reply address) and parks the task; the responder's ep:reply handler returns a table,
 * which the dispatcher sends back in the same transaction that records the request's
 * outcome (an error reply when it fails). Replies arrive on this process's own queue,
 * `_reply.<id>`, one session per request; they are matched by correlation id and handed
 * to the waiting task only after the transaction that consumed them commits. */
#include "nh_dispatch_int.h"
#include "nh_pgcalls.h"
#include "core/nh_log.h"
#include "core/nh_queue.h"
#include "core/nh_util.h"

#include <stdlib.h>
#include <string.h>

typedef struct nh_pending_req {
  nh_dispatch_t *d;
  char corr[37];
  uv_timer_t timer;
  double timeout_s;
  void (*done)(void *ud, const char *reply, const char *msg, const char *code);
  void *ud;
  int got;                     /* a reply was consumed in the open transaction */
  char *reply, *error;
  nh_queue_t node;             /* d->requests */
} nh_pending_req_t;

static nh_pending_req_t *req_of(nh_queue_t *q) { return nh_queue_data(q, nh_pending_req_t, node); }

static void req_closed(uv_handle_t *h)
{
  nh_pending_req_t *p = h->data;
  free(p->reply);
  free(p->error);
  free(p);
}

static void req_end(nh_pending_req_t *p)
{
  nh_queue_remove(&p->node);
  uv_timer_stop(&p->timer);
  uv_close((uv_handle_t *)&p->timer, req_closed);
}

/* Ends the request with an error for its task. */
static void req_fail(nh_pending_req_t *p, const char *msg, const char *code)
{
  void (*done)(void *, const char *, const char *, const char *) = p->done;
  void *ud = p->ud;
  req_end(p);
  done(ud, NULL, msg, code);
}

static void req_timeout(uv_timer_t *h)
{
  nh_pending_req_t *p = h->data;
  char msg[128];
  snprintf(msg, sizeof msg, "no reply within %.3g s", p->timeout_s);
  req_fail(p, msg, "ETIMEDOUT");
}

/* The waiting request of correlation id corr, NULL when it ended meanwhile. */
static nh_pending_req_t *req_find(nh_dispatch_t *d, const char *corr)
{
  nh_queue_t *q;
  nh_queue_foreach(q, &d->requests) {
    if (strcmp(req_of(q)->corr, corr) == 0) return req_of(q);
  }
  return NULL;
}

/* The broker knows no queue for the request type: end the request now rather than at
 * its time-out (it may have been answered or timed out meanwhile: look it up). */
typedef struct probe_ctx {
  nh_dispatch_t *d;
  char corr[37];
  char *type;
} probe_ctx_t;

static void no_replier(nh_pending_req_t *p, const char *type)
{
  char msg[300];
  snprintf(msg, sizeof msg, "no endpoint replies to %s (declare one with ep:reply)", type);
  req_fail(p, msg, "ENOREPLIER");
}

static void probed(void *data, int found)
{
  probe_ctx_t *c = data;
  nh_pending_req_t *p = req_find(c->d, c->corr);
  if (p && found == 0 && !p->got) no_replier(p, c->type);
  free(c->type);
  free(c);
}

/* On PostgreSQL the request is queued by a batch of its own (nh_pgcalls.c) while the task
 * waits: a failure, or no endpoint to reply, ends the request when the batch is done. */
static void sent_pg(void *data, const nh_msg_t *m, int copies, int duplicate, const nh_error_t *err)
{
  probe_ctx_t *c = data;
  (void)duplicate;
  nh_pending_req_t *p = req_find(c->d, c->corr);
  if (p && err) req_fail(p, err->msg, "EIO");
  else if (p && copies == 0) no_replier(p, m->event_type);
  free(c);
}

void *nh_dispatch_request(void *data, const char *type, const char *body, size_t len, const char *session,
                          const nh_trace_ctx_t *trace, double timeout_s, void (*done)(void *, const char *, const char *, const char *), void *ud,
                          nh_error_t *err)
{
  nh_dispatch_t *d = data;
  nh_pending_req_t *p = nh_xcalloc(1, sizeof *p);
  p->d = d;
  nh_uuid_v7(p->corr);
  char mid[37];
  nh_uuid_v7(mid);
  nh_msg_t m;
  memset(&m, 0, sizeof m);
  m.session_id = (char *)(session ? session : p->corr);
  m.message_id = mid;
  m.event_type = (char *)type;
  m.type = NH_MT_EVENT;
  m.correlation_id = p->corr;
  m.reply_to = d->reply_ep;
  m.body = (char *)body;
  m.body_len = len;
  m.enqueued_at = nh_time_now_ms();
  char tp[NH_TRACEPARENT_LEN + 1];   /* the requesting handler's span, else a trace of its own */
  if (trace) nh_trace_format(trace, tp);
  else nh_dispatch_span_root_publish(d, type, NULL, tp);
  m.traceparent = tp;
  int copies = 0;
  if (!d->store) {
    probe_ctx_t *c = nh_xcalloc(1, sizeof *c);
    c->d = d;
    memcpy(c->corr, p->corr, sizeof c->corr);
    if (nh_pgcall_send(d->link, &m, NULL, NULL, sent_pg, c, err)) {
      free(c);
      free(p);
      return NULL;
    }
    copies = 1;   /* or not: sent_pg says */
  } else if (nh_store_begin(d->store) || d->tr->vt->send(d->tr, &m, NULL, &copies, err) || nh_store_commit(d->store)) {
    nh_store_rollback(d->store);
    if (!err->msg[0]) nh_error_set(err, NH_EFAIL, "store: cannot send the request");
    free(p);
    return NULL;
  }
  if (copies == 0) {
    nh_error_set(err, NH_ENOTFOUND, "no endpoint replies to %s (declare one with ep:reply)", type);
    free(p);
    return NULL;
  }
  p->timeout_s = timeout_s;
  p->done = done;
  p->ud = ud;
  uv_timer_init(d->loop, &p->timer);
  p->timer.data = p;
  uv_timer_start(&p->timer, req_timeout, (uint64_t)(timeout_s * 1000.0), 0);
  nh_queue_insert_head(&d->requests, &p->node);
  if (d->tr->vt->probe) {
    probe_ctx_t *c = nh_xcalloc(1, sizeof *c);
    c->d = d;
    memcpy(c->corr, p->corr, sizeof c->corr);
    c->type = nh_xstrdup(type);
    if (d->tr->vt->probe(d->tr, type, probed, c)) {
      free(c->type);
      free(c);
    }
  }
  nh_dispatch_kick(d);
  return p;
}

void nh_dispatch_request_cancel(void *data, void *handle)
{
  (void)data;
  req_end(handle);
}

/* A reply read from our queue, inside the pump's transaction: consume it, and keep its
 * content for the waiting task until the commit. */
void nh_dispatch_take_reply(nh_dispatch_t *d, nh_msg_t *m)
{
  d->tr->vt->settle(d->tr, m, NH_SETTLE_COMPLETE, 0, NULL);
  d->tr->vt->unlock_session(d->tr, m->endpoint, m->session_id);
  nh_queue_t *q;
  nh_queue_foreach(q, &d->requests) {
    nh_pending_req_t *p = req_of(q);
    if (!m->correlation_id || strcmp(p->corr, m->correlation_id) != 0 || p->got) continue;
    p->got = 1;
    free(p->reply);
    free(p->error);
    p->reply = m->error_text ? NULL : nh_xstrdup(m->body ? m->body : "null");
    p->error = m->error_text ? nh_xstrdup(m->error_text) : NULL;
    return;
  }
  nh_log_debug("dispatch", "a reply for request %s came after its requester stopped waiting; dropped",
               m->correlation_id ? m->correlation_id : "?");
}

/* After the pump: deliver committed replies (ok) or forget them (rolled back: the reply
 * rows are still queued and are read again). */
void nh_dispatch_deliver_replies(nh_dispatch_t *d, int ok)
{
  for (;;) {
    /* from the head again after each one: its callback may end other requests */
    nh_pending_req_t *p = NULL;
    nh_queue_t *q;
    nh_queue_foreach(q, &d->requests) {
      if (req_of(q)->got) {
        p = req_of(q);
        break;
      }
    }
    if (!p) return;
    if (!ok) {
      nh_queue_foreach(q, &d->requests) req_of(q)->got = 0;
      return;
    }
    char *reply = p->reply, *error = p->error;
    p->reply = p->error = NULL;
    void (*done)(void *, const char *, const char *, const char *) = p->done;
    void *ud = p->ud;
    req_end(p);
    if (reply) done(ud, reply, NULL, NULL);
    else done(ud, NULL, error, "EREPLY");
    free(reply);
    free(error);
  }
}

/* The responder side: send the reply (or an error reply) of a request job. */
int nh_dispatch_send_reply(nh_dispatch_t *d, nh_job_t *job)
{
  nh_msg_t *req = &job->msg;
  nh_outcome_t *o = &job->out;
  nh_msg_t m;
  memset(&m, 0, sizeof m);
  char mid[37];
  nh_uuid_v7(mid);
  m.session_id = req->correlation_id ? req->correlation_id : mid;
  m.message_id = mid;
  m.event_id = req->event_id;
  m.event_type = req->event_type;
  m.type = NH_MT_REPLY;
  m.correlation_id = req->correlation_id;
  m.parent_message_id = req->message_id;
  m.from = job->ep->name;
  m.enqueued_at = nh_time_now_ms();
  char tp[NH_TRACEPARENT_LEN + 1];
  if (job->span_set) {
    nh_trace_format(&job->span, tp);
    m.traceparent = tp;
    m.tracestate = req->tracestate;
  }
  if (o->kind == NH_OUT_COMPLETED && o->reply) {
    m.body = o->reply;
    m.body_len = strlen(o->reply);
  } else {
    m.error_text = o->error_text ? o->error_text : (char *)"the responder did not reply";
    m.error_type = o->error_type;
  }
  int copies = 0;
  nh_error_t err = {0};
  if (d->tr->vt->send(d->tr, &m, req->reply_to, &copies, &err)) {
    nh_log_error("dispatch", "%s: sending the reply to %s: %s", job->ep->name, req->reply_to, err.msg);
    return NH_EFAIL;
  }
  return NH_OK;
}

void nh_dispatch_requests_close(nh_dispatch_t *d)
{
  while (!nh_queue_empty(&d->requests)) {
    nh_pending_req_t *p = req_of(nh_queue_head(&d->requests));
    void (*done)(void *, const char *, const char *, const char *) = p->done;
    void *ud = p->ud;
    req_end(p);
    done(ud, NULL, "the host is stopping", "ECANCELED");
  }
}
