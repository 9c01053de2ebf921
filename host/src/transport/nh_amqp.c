/* The AMQP 1.0 transport. How it keeps the host's guarantees on a broker that cannot
 * join a sqlite transaction:
 *
 * - Receiving: one receiver per endpoint (RabbitMQ: the queue /amq/queue/<endpoint>;
 *   Service Bus: <topic>/Subscriptions/<endpoint>). Credit keeps at most a window of
 *   four times the endpoint's concurrency (NH_WINDOW_FACTOR; at least NH_MIN_WINDOW;
 *   reply queues NH_REPLY_WINDOW) buffered, in handlers or granted, and is topped up
 *   only once that has fallen to half the window (nh_amqp_topup), so a slow handler
 *   means no credit and the broker keeps the messages. Deliveries are
 *   buffered in arrival order; receive() hands out session heads only (the first
 *   buffered message of each session whose store lock this process can take), which
 *   keeps per-session FIFO on brokers that do not enforce group exclusivity.
 * - Settling: a settlement asked for inside a store transaction is held until that
 *   transaction commits, then sent (accepted / rejected with the reason); a rollback
 *   drops it and puts the messages handed out in that transaction back. Deliveries of
 *   a lost connection are never settled afterwards: the broker redelivers them and
 *   the store's processed table settles an already recorded outcome without running
 *   the handler again.
 * - Attempts: a broker may not count deliveries (RabbitMQ does not), so redeliveries
 *   are counted in the store (amqp_deliveries), only for messages the broker marks as
 *   redelivered (not first acquirer, or a delivery-count above 0): nothing is written
 *   on the happy path.
 * - Sending: messages go to an outbox table in the same transaction as the outcome
 *   that published them; after the commit they are sent (events to the topic
 *   exchange, routing key = subject = event type; replies to /amq/queue/<queue>; on
 *   Service Bus events only, to the topic, whose subscriptions filter on the subject)
 *   and deleted once the broker accepted them. A crash in between sends them again
 *   (at least once; receivers see the same MessageId and so the same EventId).
 * - Control messages (resubmit, skip, hand-off settlement) and session locks stay in
 *   the store (the embedded transport on the same file): operators act on the store
 *   whatever the broker, and their requests are serialised with the session's work. */
#include "nh_amqp_priv.h"
#include "nh_embedded.h"
#include "core/nh_log.h"
#include "core/nh_sqlite.h"
#include "core/nh_strset.h"
#include "core/nh_util.h"
#include "store/nh_uow.h"

#include <libpq-fe.h>

#include <proton/condition.h>
#include <proton/connection.h>
#include <proton/delivery.h>
#include <proton/disposition.h>
#include <proton/event.h>
#include <proton/link.h>
#include <proton/session.h>
#include <proton/terminus.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const amqp_migrations[] = {
  "CREATE TABLE amqp_outbox (seq INTEGER PRIMARY KEY AUTOINCREMENT, owner TEXT NOT NULL, address TEXT NOT NULL,"
  "  message BLOB NOT NULL, created_at INTEGER NOT NULL);"
  "CREATE TABLE amqp_deliveries (endpoint TEXT NOT NULL, message_id TEXT NOT NULL, count INTEGER NOT NULL,"
  "  PRIMARY KEY (endpoint, message_id)) WITHOUT ROWID;",
};

static const char *const a_sql[A_COUNT] = {
  [A_OUT_ADD] = "INSERT INTO amqp_outbox(address, message, created_at, owner) VALUES (?1, ?2, ?3, ?4)",
  /* each process sends its own rows (a CLI publish shares the host's store) */
  [A_OUT_NEXT] = "SELECT seq, address, message FROM amqp_outbox WHERE seq > ?1 AND owner = ?3 ORDER BY seq LIMIT ?2",
  [A_OUT_DEL] = "DELETE FROM amqp_outbox WHERE seq = ?1",
  [A_DLV_BUMP] = "INSERT INTO amqp_deliveries(endpoint, message_id, count) VALUES (?1, ?2, 1)"
                 " ON CONFLICT(endpoint, message_id) DO UPDATE SET count = count + 1 RETURNING count",
  [A_DLV_DEL] = "DELETE FROM amqp_deliveries WHERE endpoint = ?1 AND message_id = ?2",
  [A_OUT_LEFT] = "SELECT count(*) FROM amqp_outbox WHERE seq > ?1 AND owner = ?2",
  [A_OUT_OWNERS] = "SELECT DISTINCT owner FROM amqp_outbox WHERE owner <> ?1",
  [A_OUT_CLAIM] = "UPDATE amqp_outbox SET owner = ?1 WHERE owner = ?2",
  [A_OUT_DROP] = "DELETE FROM amqp_outbox WHERE owner = ?1 AND seq >= ?2",
  [A_OUT_ONE] = "SELECT seq, address, message FROM amqp_outbox WHERE seq = ?1",
};

const char *const *nh_amqp_sql_migrations(int *count)
{
  *count = (int)(sizeof amqp_migrations / sizeof amqp_migrations[0]);
  return amqp_migrations;
}

const char *nh_amqp_sql(int id) { return id >= 0 && id < A_COUNT ? a_sql[id] : NULL; }

int nh_amqp_is_url(const char *s)
{
  return s && (strncmp(s, "amqp://", 7) == 0 || strncmp(s, "amqps://", 8) == 0);
}


void nh_amqp_status(amqp_t *a, nh_amqp_status_t st, const char *msg)
{
  if (st == NH_AMQP_FATAL) {
    if (a->fatal) return;
    a->fatal = 1;
  }
  if (a->status_cb) a->status_cb(a->status_data, st, msg);
}

void nh_amqp_wake(amqp_t *a)
{
  if (a->base.on_wake) a->base.on_wake(a->base.cb_data);
}

/* ---------------------------------------------------------------- deliveries */

rec_t *nh_amqp_rec_get(amqp_t *a, uint64_t id)
{
  for (rec_t *r = a->buckets[id & (NH_BUCKETS - 1)]; r; r = r->hnext)
    if (r->id == id) return r;
  return NULL;
}

static void buf_remove(rec_t *r)
{
  aep_t *ep = r->ep;
  if (!r->buffered) return;
  nh_queue_remove(&r->node);
  r->buffered = 0;
  ep->nbuf--;
  r->part->nbuf--;
}

/* In handlers: the endpoint's count, and its queue's (its credit window, nh_amqp_topup). */
static void inflight_add(rec_t *r, int n)
{
  r->ep->inflight += n;
  r->part->inflight += n;
}

/* Back into the buffer at its arrival position, ahead of its session's later messages. */
static void buf_insert(rec_t *r)
{
  aep_t *ep = r->ep;
  if (r->buffered) return;
  nh_queue_t *at = nh_queue_tail(&ep->buf);
  while (at != &ep->buf && nh_queue_data(at, rec_t, node)->id > r->id) at = nh_queue_prev(at);
  nh_queue_insert_head(at, &r->node);   /* right after at (at the head when at is ep->buf) */
  r->buffered = 1;
  r->part->nbuf++;
  if (++ep->nbuf > ep->max_nbuf) ep->max_nbuf = ep->nbuf;
}

static void rec_free(amqp_t *a, rec_t *r)
{
  rec_t **pp = &a->buckets[r->id & (NH_BUCKETS - 1)];
  while (*pp && *pp != r) pp = &(*pp)->hnext;
  if (*pp) *pp = r->hnext;
  buf_remove(r);
  nh_msg_clear(&r->msg);
  free(r);
}

/* Every delivery of a connection that is gone: the broker gives them to a consumer again. */
static void recs_drop_all(amqp_t *a)
{
  for (int i = 0; i < NH_BUCKETS; i++) {
    rec_t *r = a->buckets[i];
    while (r) {
      rec_t *next = r->hnext;
      nh_msg_clear(&r->msg);
      free(r);
      r = next;
    }
    a->buckets[i] = NULL;
  }
  nh_queue_t *q;
  nh_queue_foreach(q, &a->eps) {
    aep_t *ep = nh_queue_data(q, aep_t, node);
    nh_queue_init(&ep->buf);   /* its deliveries are freed above */
    ep->nbuf = ep->inflight = 0;
    for (int i = 0; i < ep->nparts; i++) {
      apart_t *p = &ep->parts[i];
      p->link = NULL;
      p->ssn = NULL;   /* freed with the connection */
      p->attached = 0;
      p->yielding = 0;
      p->nbuf = p->inflight = 0;
      nh_amqp_sbs_reset(p);
    }
    ep->declared = 0;   /* declared again on the next connection */
  }
  a->ntxh = 0;
}

aep_t *nh_amqp_ep_find(amqp_t *a, const char *name)
{
  nh_queue_t *q;
  nh_queue_foreach(q, &a->eps) {
    aep_t *ep = nh_queue_data(q, aep_t, node);
    if (strcmp(ep->name, name) == 0) return ep;
  }
  return NULL;
}

/* The queue whose receiver is link l, or (l NULL) whose own session is s. */
static apart_t *part_find(amqp_t *a, pn_link_t *l, pn_session_t *s)
{
  nh_queue_t *q;
  nh_queue_foreach(q, &a->eps) {
    aep_t *ep = nh_queue_data(q, aep_t, node);
    for (int i = 0; i < ep->nparts; i++)
      if (l ? ep->parts[i].link == l : ep->parts[i].ssn == s) return &ep->parts[i];
  }
  return NULL;
}

static apart_t *part_by_link(amqp_t *a, pn_link_t *l) { return part_find(a, l, NULL); }

int nh_amqp_ep_attached(const aep_t *ep)
{
  if (ep->sessions) return ep->sessions_seen;   /* a session granted, or none to grant yet: it works */
  for (int i = 0; i < ep->nparts; i++)
    if (!ep->parts[i].attached) return 0;
  return 1;
}

/* Credit = free capacity: at most a window (4 x the endpoint's concurrency) buffered or
 * in handlers. Credit is granted again only once what is on hand has fallen to half the
 * window: one flow frame per half window, and a bound on brokers that do not keep to the
 * credit. RabbitMQ 3.x is one: it also gives credit back on every settlement (as 0-9-1
 * acks do) and adds our flows on top (rabbitmq-server#2597), which with top-ups at every
 * batch let 11,000 messages pile up behind a 1,024 window (make bench). With partitions
 * each queue has its share of the window: a host given one partition gets no more than
 * its share, and one given all of them no more than the whole. */
void nh_amqp_topup(aep_t *ep)
{
  int window = ep->reply ? NH_REPLY_WINDOW : ep->capacity * NH_WINDOW_FACTOR;
  window /= ep->nparts;
  if (window < NH_MIN_WINDOW) window = NH_MIN_WINDOW;
  for (int i = 0; i < ep->nparts; i++) {
    apart_t *p = &ep->parts[i];
    if (!p->link || !p->attached || p->yielding) continue;
    int credit = pn_link_credit(p->link);
    int have = p->nbuf + p->inflight + (credit > 0 ? credit : 0);
    if (have <= window / 2) pn_link_flow(p->link, window - have);
  }
}

/* ---------------------------------------------------------------- handing a partition on */

/* A partitioned endpoint's receivers have an AMQP session each. RabbitMQ 3.10's AMQP 1.0
 * plugin keeps a delivery that was unsettled when its link detached unacknowledged on the
 * session's channel until the session ends, so a detach could hold a message back while
 * the next host runs its session's later ones; and a drain crashes the session on a
 * classic queue (rabbit_classic_queue:handle_event, send_drained). Ending the session is
 * what gives every unsettled delivery back, in its place, before the next consumer in line
 * is made active. */
#ifndef NH_YIELD_WAIT_MS
#define NH_YIELD_WAIT_MS 30000   /* a handler running longer: the hand-on is given up, tried later */
#endif
#ifndef NH_YIELD_END_MS
#define NH_YIELD_END_MS 15000
#endif

void nh_amqp_part_yield(apart_t *p)
{
  if (p->yielding || !p->link || !p->ssn) return;
  p->yielding = 1;   /* no more credit, and nothing more of it handed to handlers */
  p->yield_since = uv_now(p->ep->a->loop);
  nh_amqp_part_steps(p->ep->a);
}

static void part_step(amqp_t *a, apart_t *p)
{
  if (p->yielding != 1) return;
  if (p->inflight && uv_now(a->loop) - p->yield_since >= NH_YIELD_WAIT_MS) {
    /* a long handler (lock renewals, is_alive) must not freeze the partition's other
     * sessions behind it: serve them again; a later look at the consumers may pick it again */
    nh_log_info("amqp", "%s: still in a handler after %d ms; keeping the partition for now", p->queue,
                NH_YIELD_WAIT_MS);
    p->yielding = 0;
    nh_amqp_topup(p->ep);
    nh_amqp_wake(a);
    return;
  }
  if (p->inflight) return;   /* what is in handlers is settled here, by this host */
  /* buffered, never handed out: unsettled, the broker gives them back when the session ends */
  nh_queue_t *q, *next;
  nh_queue_foreach_safe(q, next, &p->ep->buf) {
    rec_t *r = nh_queue_data(q, rec_t, node);
    if (r->part == p) rec_free(a, r);
  }
  pn_session_close(p->ssn);
  p->yielding = 2;
  p->yield_since = uv_now(a->loop);
}

/* A session end the broker never answered: what that session held may stay held there, so
 * end the whole connection, which gives everything back (every partition moves). */
static int part_stuck(amqp_t *a, apart_t *p)
{
  if (p->yielding != 2 || uv_now(a->loop) - p->yield_since < NH_YIELD_END_MS) return 0;
  nh_log_warn("amqp", "%s: the broker did not answer the end of the partition's session within %d ms; reconnecting, "
              "which gives back everything this host held", p->queue, NH_YIELD_END_MS);
  pn_connection_close(pn_session_connection(a->ssn));
  if (a->conn) nh_amqp_conn_flush(a->conn);
  return 1;
}

void nh_amqp_part_steps(amqp_t *a)
{
  nh_queue_t *q;
  int any = 0;
  nh_queue_foreach(q, &a->eps) {
    aep_t *ep = nh_queue_data(q, aep_t, node);
    for (int i = 0; i < ep->nparts; i++)
      if (ep->parts[i].yielding == 1) {
        part_step(a, &ep->parts[i]);
        any = 1;
      }
  }
  if (any && a->conn) nh_amqp_conn_flush(a->conn);
}

void nh_amqp_part_check_ends(amqp_t *a)
{
  nh_queue_t *q;
  nh_queue_foreach(q, &a->eps) {
    aep_t *ep = nh_queue_data(q, aep_t, node);
    for (int i = 0; a->ssn && i < ep->nparts; i++)
      if (part_stuck(a, &ep->parts[i])) return;
  }
}

void nh_amqp_part_forget(amqp_t *a, apart_t *p)
{
  for (int i = 0; i < NH_BUCKETS; i++) {
    rec_t *r = a->buckets[i];
    while (r) {
      rec_t *next = r->hnext;
      if (r->part == p && r->buffered) {
        rec_free(a, r);
      } else if (r->part == p && r->dlv) {
        r->dlv = NULL;   /* freed with its link; its outcome is recorded, not settled (apply_settlements) */
        r->lock_lost = 1;
      }
      r = next;
    }
  }
}

/* The broker ended the session of a partition this host handed on: attach again, in a new
 * session, at the end of the line. */
static void part_yielded(amqp_t *a, apart_t *p)
{
  pn_session_free(p->ssn);   /* and its link and deliveries */
  p->ssn = NULL;
  p->link = NULL;
  p->attached = 0;
  p->yielding = 0;
  if (a->shutting_down) return;   /* no new session on a closing connection */
  nh_log_info("amqp", "%s: handed on; attached again, waiting in line", p->queue);
  nh_amqp_attach(a, p->ep);
}

void *nh_amqp_grow(void *p, int *cap, int need, size_t size)
{
  if (need <= *cap) return p;
  int n = *cap ? *cap * 2 : 64;
  while (n < need) n *= 2;
  *cap = n;
  return nh_xrealloc(p, size * (size_t)n);
}

/* ---------------------------------------------------------------- the vtable */

static int am_subscribe(nh_transport_t *t, const char *endpoint, const char *const *types, const int *commands, int n,
                        nh_error_t *err);

static int am_subscribe_check(nh_transport_t *t, const char *endpoint, const char *const *types, const int *commands,
                              int n, const char *const *replacing, int nreplacing, nh_error_t *err)
{
  amqp_t *a = (amqp_t *)t;   /* commands are checked on the store's table, as subscribe does */
  return a->emb->vt->subscribe_check(a->emb, endpoint, types, commands, n, replacing, nreplacing, err);
}

static int am_lock_session(nh_transport_t *t, const char *endpoint, const char *session, int64_t now)
{
  amqp_t *a = (amqp_t *)t;
  a->emb->lock_ms = t->lock_ms;
  return a->emb->vt->lock_session(a->emb, endpoint, session, now);
}

static int am_unlock_session(nh_transport_t *t, const char *endpoint, const char *session)
{
  amqp_t *a = (amqp_t *)t;
  return a->emb->vt->unlock_session(a->emb, endpoint, session);
}

static int am_renew(nh_transport_t *t, const char *endpoint, const char *session, int64_t now)
{
  amqp_t *a = (amqp_t *)t;
  if (a->sb && a->ssn && nh_amqp_sb_renew(a, endpoint, session) == 0) return 0;
  a->emb->lock_ms = t->lock_ms;
  return a->emb->vt->renew(a->emb, endpoint, session, now);
}

/* Hands a delivery to the dispatcher: NH_OK, 1 when its delivery count is not read yet
 * (PostgreSQL: the pass is void, and its fill reads it), or NH_EFAIL. */
static int handout(amqp_t *a, rec_t *r)
{
  aep_t *ep = r->ep;
  if (r->redelivered && !r->persisted && a->pg) {
    int count = nh_amqp_pg_dlv_bump(a, ep->name, r->msg.message_id);
    if (count == 0) return 1;
    if (count < 0) return NH_EFAIL;
    r->base = count;
    r->persisted = 1;
  } else if (r->redelivered && !r->persisted) {
    sqlite3_stmt *st = a->q[A_DLV_BUMP];
    nh_sqlite_bind_text(st, 1, ep->name);
    nh_sqlite_bind_text(st, 2, r->msg.message_id);
    int rc = sqlite3_step(st);
    int count = rc == SQLITE_ROW ? sqlite3_column_int(st, 0) : -1;
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    if (count < 0) {
      nh_log_error("amqp", "counting a redelivery: %s", sqlite3_errmsg(a->db));
      return NH_EFAIL;
    }
    r->base = count;
    r->persisted = 1;
  }
  buf_remove(r);
  r->handouts++;
  inflight_add(r, 1);
  a->txh = nh_amqp_grow(a->txh, &a->ctxh, a->ntxh + 1, sizeof *a->txh);
  a->txh[a->ntxh++] = r->id;
  nh_msg_t *m = nh_xmalloc(sizeof *m);
  nh_msg_copy(m, &r->msg);
  m->tr_id = r->id;
  m->delivery_count = r->base + r->handouts;
  a->base.on_message(a->base.cb_data, m);
  return NH_OK;
}

static int am_receive(nh_transport_t *t, const char *endpoint, int max, int64_t now)
{
  amqp_t *a = (amqp_t *)t;
  a->emb->on_message = t->on_message;
  a->emb->cb_data = t->cb_data;
  a->emb->lock_ms = t->lock_ms;
  int n = a->emb->vt->receive(a->emb, endpoint, max, now);   /* control messages in the store */
  if (n < 0) return n;
  aep_t *ep = nh_amqp_ep_find(a, endpoint);
  if (!ep || nh_queue_empty(&ep->buf) || n >= max) return n;
  int rc = NH_OK;
  if (ep->reply) {   /* replies: one per request, matched by correlation id; no session order */
    nh_queue_t *q, *next;
    nh_queue_foreach_safe(q, next, &ep->buf) {   /* a hand-out leaves the buffer */
      if (n >= max || rc != NH_OK) break;
      int got = handout(a, nh_queue_data(q, rec_t, node));
      if (got < 0) rc = got;
      else if (got == NH_OK) n++;
    }
  } else {
    nh_strset_t seen;
    nh_strset_init(&seen, (size_t)(max < ep->nbuf ? max : ep->nbuf));   /* grows as needed */
    nh_queue_t *q, *next;
    nh_queue_foreach_safe(q, next, &ep->buf) {   /* a hand-out leaves the buffer */
      if (n >= max || rc != NH_OK) break;
      rec_t *r = nh_queue_data(q, rec_t, node);
      if (r->part->yielding) continue;   /* being handed on: its sessions go to the next host */
      if (!nh_strset_add(&seen, r->msg.session_id)) continue;   /* not its session's head */
      int got = a->emb->vt->lock_session(a->emb, endpoint, r->msg.session_id, now);
      if (got < 0) {
        rc = NH_EFAIL;
      } else if (got == 1) {   /* 0: not free now (another host's, or not read yet): nothing handed out */
        got = handout(a, r);
        if (got < 0) rc = got;
        else if (got == NH_OK) n++;
      }
    }
    nh_strset_free(&seen);
  }
  nh_amqp_topup(ep);
  return rc ? rc : n;
}

static int am_settle(nh_transport_t *t, const nh_msg_t *m, nh_settle_t how, int64_t delay_ms, const char *reason)
{
  amqp_t *a = (amqp_t *)t;
  if (m->seq > 0 || m->tr_id == 0) return a->emb->vt->settle(a->emb, m, how, delay_ms, reason);
  rec_t *r = nh_amqp_rec_get(a, m->tr_id);
  if (!r) {
    /* its connection is gone: the broker redelivers it; only the session hold applies */
    return how == NH_SETTLE_RELEASE ? a->emb->vt->settle(a->emb, m, how, delay_ms, reason) : NH_OK;
  }
  if (how == NH_SETTLE_RELEASE && !r->dlv) {   /* its link went (nh_amqp_part_forget): the broker has it again */
    inflight_add(r, -1);
    rec_free(a, r);
    return a->emb->vt->settle(a->emb, m, how, delay_ms, reason);
  }
  if (how == NH_SETTLE_RELEASE) {
    /* Kept here, unsettled, in its place; the store's session hold (delay) keeps the
     * session's later messages behind it. A transient release is not a delivery. */
    if (!r->buffered) {
      inflight_add(r, -1);
      if (delay_ms > 0) {
        r->handouts--;
        r->msg.release_count++;
      }
      buf_insert(r);
    }
    return a->emb->vt->settle(a->emb, m, how, delay_ms, reason);
  }
  if (r->persisted && a->pg) {
    if (nh_amqp_pg_dlv_del(a, r->ep->name, r->msg.message_id)) return NH_EFAIL;
  } else if (r->persisted) {
    nh_sqlite_bind_text(a->q[A_DLV_DEL], 1, r->ep->name);
    nh_sqlite_bind_text(a->q[A_DLV_DEL], 2, r->msg.message_id);
    if (nh_sqlite_step_done(a->db, a->q[A_DLV_DEL], "amqp delivery count")) return NH_EFAIL;
  }
  a->pend = nh_amqp_grow(a->pend, &a->cpend, a->npend + 1, sizeof *a->pend);
  a->pend[a->npend++] = (pend_t){ r->id, how, nh_xstrdup(reason) };
  return NH_OK;
}

int nh_amqp_address(amqp_t *a, const char *to, const char *session, char *address, size_t len, nh_error_t *err)
{
  if (a->sb && to)
    return nh_error_set(err, NH_EUSAGE, "the Service Bus profile sends to the topic %s only: no --to %s and no "
                        "replies (request/reply needs the generic profile)", a->url.exchange, to);
  int nparts = to && !a->sb ? nh_amqp_parts_of(a, to) : 1;
  if (a->sb) {
    snprintf(address, len, "%s", a->url.exchange);   /* subscriptions filter on the label */
  } else if (to && nparts > 1) {   /* partitions (ours, or a probed target's): the session's queue, p0 without one */
    char queue[512];
    unsigned i = session ? nh_amqp_session_bucket(session) & (unsigned)(nparts - 1) : 0;
    nh_rmq_partition_queue(to, nparts, (int)i, queue, sizeof queue);
    snprintf(address, len, "/amq/queue/%s", queue);
  } else if (to) {
    snprintf(address, len, "/amq/queue/%s", to);
  } else {
    snprintf(address, len, "/exchange/%s", a->url.exchange);   /* subject = routing key */
  }
  return NH_OK;
}

static int am_send(nh_transport_t *t, const nh_msg_t *m, const char *to_endpoint, int *copies, nh_error_t *err)
{
  amqp_t *a = (amqp_t *)t;
  *copies = 0;
  if (to_endpoint && m->type != NH_MT_EVENT && m->type != NH_MT_REPLY)
    return a->emb->vt->send(a->emb, m, to_endpoint, copies, err);   /* operator control messages */
  char address[600];
  if (nh_amqp_address(a, to_endpoint, m->session_id, address, sizeof address, err)) return err->code;
  int rc = nh_amqp_outbox_add(a, address, m, to_endpoint, err);
  if (rc == NH_OK) *copies = 1;   /* the broker fans out; how many copies is not known here */
  return rc;
}

static void am_set_capacity(nh_transport_t *t, const char *endpoint, int n)
{
  aep_t *ep = nh_amqp_ep_find((amqp_t *)t, endpoint);
  if (ep) {
    ep->capacity = n;
    nh_amqp_topup(ep);
  }
}

/* ---------------------------------------------------------------- after the store transaction */

static void apply_settlements(amqp_t *a)
{
  for (int i = 0; i < a->npend; i++) {
    pend_t *p = &a->pend[i];
    rec_t *r = nh_amqp_rec_get(a, p->id);
    if (r && !r->dlv) {   /* its link went (a lost Service Bus session): the broker gives it out again */
      inflight_add(r, -1);
      nh_amqp_sbs_touch(r->part);
      rec_free(a, r);
    } else if (r) {
      if (p->how == NH_SETTLE_DEAD_LETTER) {
        pn_disposition_t *ds = pn_delivery_local(r->dlv);
        pn_condition_t *cond = pn_disposition_condition(ds);
        const char *why = p->reason ? p->reason : "dead-lettered by nimbus-host";
        pn_condition_set_name(cond, a->sb ? "com.microsoft:dead-letter" : "nimbus:dead-letter");
        pn_condition_set_description(cond, why);
        pn_data_t *info = pn_condition_info(cond);
        pn_data_put_map(info);
        pn_data_enter(info);
        pn_data_put_symbol(info, pn_bytes(strlen("DeadLetterReason"), "DeadLetterReason"));
        pn_data_put_string(info, pn_bytes(strlen(why), why));
        pn_data_put_symbol(info, pn_bytes(strlen("DeadLetterErrorDescription"), "DeadLetterErrorDescription"));
        pn_data_put_string(info, pn_bytes(strlen(why), why));
        pn_data_exit(info);
        pn_delivery_update(r->dlv, PN_REJECTED);
      } else {
        pn_delivery_update(r->dlv, PN_ACCEPTED);
      }
      /* rcv-settle-mode second (Service Bus): settled when the broker confirms */
      if (!a->sb) pn_delivery_settle(r->dlv);
      inflight_add(r, -1);
      nh_amqp_sbs_touch(r->part);
      rec_free(a, r);
    }
    free(p->reason);
  }
  if (a->npend) {
    nh_queue_t *q;
    nh_queue_foreach(q, &a->eps) nh_amqp_topup(nh_queue_data(q, aep_t, node));
    nh_amqp_part_steps(a);
  }
  a->npend = 0;
}

/* Deliveries handed out since index `from` of txh go back to their buffers. */
static void give_back(amqp_t *a, int from)
{
  for (int i = from; i < a->ntxh; i++) {
    rec_t *r = nh_amqp_rec_get(a, a->txh[i]);
    if (r && !r->buffered) {
      inflight_add(r, -1);
      r->handouts--;
      if (r->dlv) buf_insert(r);
      else rec_free(a, r);   /* its link went (nh_amqp_part_forget): the broker gives it out again */
    }
  }
  if (a->ntxh > from) nh_amqp_wake(a);
  a->ntxh = from;
}

static void drop_pending(amqp_t *a, int from)
{
  for (int i = from; i < a->npend; i++) free(a->pend[i].reason);
  a->npend = from;
}

static void txn_hook(void *data, nh_txn_phase_t phase)
{
  amqp_t *a = data;
  switch (phase) {
  case NH_TXN_SAVEPOINT:
    a->in_sp = 1;
    a->sp_npend = a->npend;
    a->sp_ntxh = a->ntxh;
    break;
  case NH_TXN_SAVEPOINT_END:
    a->in_sp = 0;
    break;
  case NH_TXN_SAVEPOINT_ROLLBACK:
    /* one job undone (its lock lost, a write failed): neither its settlement nor its
     * hand-out happened; the dispatcher applies it again or lets it be delivered again */
    if (a->in_sp) {
      drop_pending(a, a->sp_npend);
      give_back(a, a->sp_ntxh);
    }
    a->in_sp = 0;
    break;
  case NH_TXN_BEGIN:
    a->in_tx = 1;
    /* accepted outbox rows go with this transaction (and come back if it rolls back); on
     * PostgreSQL in batches of their own (nh_amqp_pg_acked) */
    for (int i = 0; !a->pg && i < a->nacked; i++) {
      sqlite3_bind_int64(a->q[A_OUT_DEL], 1, a->acked[i]);
      nh_sqlite_step_done(a->db, a->q[A_OUT_DEL], "amqp outbox delete");
    }
    if (!a->pg) a->deleting = a->nacked;
    break;
  case NH_TXN_COMMIT:
    a->in_tx = 0;
    if (a->deleting) {
      memmove(a->acked, a->acked + a->deleting, sizeof *a->acked * (size_t)(a->nacked - a->deleting));
      a->nacked -= a->deleting;
      a->deleting = 0;
    }
    a->ntxh = 0;
    apply_settlements(a);
    if (a->outbox_dirty) nh_amqp_outbox_pump(a);
    if (a->conn) nh_amqp_conn_flush(a->conn);
    break;
  case NH_TXN_ROLLBACK:
    a->in_tx = 0;
    a->in_sp = 0;
    if (!a->pg) a->deleting = 0;
    /* on sqlite the rows it wrote are gone; on PostgreSQL a pump asked for during its round
     * trips (credit, a new connection) is still due */
    if (a->pg && a->outbox_dirty) nh_amqp_outbox_pump(a);
    a->outbox_dirty = 0;
    drop_pending(a, 0);
    give_back(a, 0);   /* handed out for nothing */
    break;
  }
}

/* ---------------------------------------------------------------- the outbox */

/* ---------------------------------------------------------------- connection events */

static void on_up(void *data, pn_connection_t *c)
{
  amqp_t *a = data;
  a->conn_gen++;
  a->ssn = pn_session(c);
  pn_session_open(a->ssn);
  a->last_sent = 0;
  a->unconfirmed = 0;
  if (a->sb) {
    nh_sb_up(a->sb, a->ssn);
    a->topic_ok = 0;
    nh_sb_put_token(a->sb, a->url.exchange, nh_amqp_topic_token, a);
  }
  /* Declared again on every connection: a restarted broker has lost the reply queue
   * (not durable), and attaching to a missing queue ends the whole AMQP session. */
  nh_queue_t *q;
  nh_queue_foreach(q, &a->eps) {
    aep_t *ep = nh_queue_data(q, aep_t, node);
    if (ep->declared) nh_amqp_attach(a, ep);
    else if (!ep->decl) nh_amqp_declare(a, ep);   /* one in progress attaches when it is done */
  }
  nh_amqp_outbox_pump(a);
}

static void on_down(void *data, const char *why, int fatal)
{
  amqp_t *a = data;
  a->conn_gen++;
  a->ssn = NULL;
  a->topic_ok = 0;
  a->nresend = 0;   /* the next connection sends every row not accepted yet */
  a->nheld = 0;
  if (a->sb) nh_sb_down(a->sb);
  nh_queue_t *q, *next;
  nh_queue_foreach_safe(q, next, &a->senders) {
    sender_t *s = nh_queue_data(q, sender_t, node);
    free(s->address);
    free(s);
  }
  nh_queue_init(&a->senders);
  recs_drop_all(a);
  a->unconfirmed = 0;
  a->last_sent = 0;
  if (fatal && !a->shutting_down) nh_amqp_status(a, NH_AMQP_FATAL, why);
}

/* Operator requests (resubmit, skip, hand-off settlement) come from the store, written
 * by the CLI or the API after their checks; anyone who can publish to the broker must not
 * be able to skip or settle events. One arriving here is dead-lettered under an audit row
 * of its own (an EventId of its MessageId), so it cannot touch the event it names. */
static void refuse_control(aep_t *ep, nh_msg_t *m)
{
  nh_msg_type_t t = m->type;
  if (t != NH_MT_RESUBMIT && t != NH_MT_SKIP && t != NH_MT_HANDOFF_COMPLETE && t != NH_MT_HANDOFF_FAIL) return;
  char why[300], eid[37];
  snprintf(why, sizeof why, "%s from the broker refused: operator requests are taken from the store only (nimbus-host "
           "resubmit, skip, handoff); add control=trusted to the transport URL to obey them from a trusted channel",
           nh_msg_type_name(t));
  m->type = NH_MT_UNKNOWN;
  free(m->error_text);
  m->error_text = nh_xstrdup(why);
  nh_amqp_event_id(ep->name, m->message_id, 0, eid);
  free(m->event_id);
  m->event_id = nh_xstrdup(eid);
}

static void receive_delivery(amqp_t *a, apart_t *part, pn_delivery_t *d)
{
  aep_t *ep = part->ep;
  rec_t *r = nh_xcalloc(1, sizeof *r);
  r->id = ++a->next_id;
  r->ep = ep;
  r->part = part;
  r->dlv = d;
  if (nh_amqp_msg_read(d, a->pm, &a->buf, &a->bufcap) != NH_OK) {
    char id[37];
    nh_uuid_v7(id);
    memset(&r->msg, 0, sizeof r->msg);
    r->msg.endpoint = nh_xstrdup(ep->name);
    r->msg.message_id = nh_xstrdup(id);
    r->msg.session_id = nh_xstrdup(id);
    char eid[37];
    nh_amqp_event_id(ep->name, id, 0, eid);
    r->msg.event_id = nh_xstrdup(eid);
    r->msg.type = NH_MT_UNKNOWN;
    r->msg.error_text = nh_xstrdup("the AMQP message could not be decoded");
    r->msg.enqueued_at = nh_time_now_ms();
  } else {
    nh_amqp_msg_decode(a->pm, ep->name, &r->msg);
    r->redelivered = !pn_message_is_first_acquirer(a->pm) || pn_message_get_delivery_count(a->pm) > 0;
    if (!a->url.trusted_control) refuse_control(ep, &r->msg);
  }
  rec_t **b = &a->buckets[r->id & (NH_BUCKETS - 1)];
  r->hnext = *b;
  *b = r;
  r->buffered = 0;
  buf_insert(r);
}

static void link_lost(amqp_t *a, pn_link_t *l, pn_condition_t *cond)
{
  const char *addr = pn_link_is_receiver(l) ? pn_terminus_get_address(pn_link_source(l))
                                            : pn_terminus_get_address(pn_link_target(l));
  const char *name = cond ? pn_condition_get_name(cond) : NULL, *desc = cond ? pn_condition_get_description(cond) : NULL;
  if (a->sb && name && (strcmp(name, "amqp:not-found") == 0 || strcmp(name, "amqp:unauthorized-access") == 0)) {
    /* the topology is provisioned outside the host: say what is missing and stop */
    char why[1400];
    if (strcmp(name, "amqp:not-found") == 0)
      snprintf(why, sizeof why, "Service Bus: %s does not exist on %s (%s): create the topic %s and, per endpoint, a "
               "subscription named after it with a filter on its event types (sys.Label)", addr ? addr : "?",
               a->url.host, desc ? desc : name, a->url.exchange);
    else
      snprintf(why, sizeof why, "Service Bus refused access to %s: %s", addr ? addr : "?", desc ? desc : name);
    nh_amqp_status(a, NH_AMQP_FATAL, why);
    return;
  }
  apart_t *p = pn_link_is_receiver(l) ? part_by_link(a, l) : NULL;
  if (a->sb && p && name && strcmp(name, "amqp:not-allowed") == 0) {   /* sessionful ones: nh_amqp_sbs_closed */
    char why[1400];
    snprintf(why, sizeof why, "Service Bus refused a receiver on %s (%s): a session-enabled subscription needs "
             "session receivers: set sessions = N (how many sessions this host handles at once) on "
             "nimbus.endpoint(\"%s\", ...)", addr ? addr : "?", desc ? desc : name, p->ep->name);
    nh_amqp_status(a, NH_AMQP_FATAL, why);
    return;
  }
  nh_log_error("amqp", "the broker closed the link %s: %s%s%s; reconnecting", addr ? addr : "?",
               name ? name : "no reason given", desc ? ": " : "", desc ? desc : "");
  /* a detached link (queue deleted, say) ends the connection: the reconnect declares
   * the topology again and attaches every link afresh */
  pn_connection_close(pn_session_connection(pn_link_session(l)));
}

static void on_event(void *data, pn_event_t *e)
{
  amqp_t *a = data;
  if (a->sb && nh_sb_event(a->sb, e)) return;
  switch (pn_event_type(e)) {
  case PN_LINK_REMOTE_OPEN: {
    pn_link_t *l = pn_event_link(e);
    if (pn_link_is_receiver(l)) {
      apart_t *p = part_by_link(a, l);
      if (p && p->ep->sessions) {
        nh_amqp_sbs_opened(a, p);
        break;
      }
      /* Service Bus refuses a link with an attach without a source, then a detach
       * saying why: that is not attached */
      if (p && pn_terminus_get_address(pn_link_remote_source(l))) {
        p->attached = 1;
        nh_amqp_topup(p->ep);
        nh_amqp_check_ready(a);
      }
    } else {
      nh_amqp_outbox_pump(a);
    }
    break;
  }
  case PN_LINK_REMOTE_CLOSE:
  case PN_LINK_REMOTE_DETACH: {   /* RabbitMQ answers with detach, not close (docs/environment.md section 5) */
    pn_link_t *l = pn_event_link(e);
    apart_t *p = pn_link_is_receiver(l) ? part_by_link(a, l) : NULL;
    if (p && p->yielding == 2) break;   /* its session is ending */
    if (p && p->ep->sessions && nh_amqp_sbs_closed(a, p, pn_link_remote_condition(l))) break;
    if (!a->shutting_down) link_lost(a, l, pn_link_remote_condition(l));
    break;
  }
  case PN_SESSION_REMOTE_CLOSE: {
    apart_t *p = part_find(a, NULL, pn_event_session(e));
    if (p && p->ep->sessions && nh_amqp_sbs_closing(p)) {
      nh_amqp_sbs_ended(a, p);
      break;
    }
    if (p && p->yielding == 2) {
      part_yielded(a, p);
      break;
    }
    if (!a->shutting_down) {
      pn_condition_t *c = pn_session_remote_condition(pn_event_session(e));
      nh_log_error("amqp", "the broker ended the AMQP session: %s %s; reconnecting",
                   pn_condition_get_name(c) ? pn_condition_get_name(c) : "",
                   pn_condition_get_description(c) ? pn_condition_get_description(c) : "");
      pn_connection_close(pn_session_connection(pn_event_session(e)));
    }
    break;
  }
  case PN_LINK_FLOW:
    if (pn_link_is_sender(pn_event_link(e))) nh_amqp_outbox_pump(a);
    break;
  case PN_DELIVERY: {
    pn_delivery_t *d = pn_event_delivery(e);
    pn_link_t *l = pn_delivery_link(d);
    if (pn_link_is_receiver(l)) {
      apart_t *part = part_by_link(a, l);
      aep_t *ep = part ? part->ep : NULL;
      if (!pn_delivery_readable(d) && pn_delivery_updated(d)) {   /* mode second: the broker's answer */
        /* the same outcome back means done (a dead-letter comes back as rejected) */
        if (pn_delivery_remote_state(d) != pn_delivery_local_state(d)) {
          pn_condition_t *c = pn_disposition_condition(pn_delivery_remote(d));
          nh_log_warn("amqp", "the broker refused a settlement on %s: %s %s (the message comes back)",
                      ep ? ep->name : "?", pn_condition_get_name(c) ? pn_condition_get_name(c) : "",
                      pn_condition_get_description(c) ? pn_condition_get_description(c) : "");
        }
        if (pn_delivery_settled(d)) pn_delivery_settle(d);
        break;
      }
      if (!ep || !pn_delivery_readable(d) || pn_delivery_partial(d)) break;
      if (part->yielding == 2) break;   /* its session is ending: unsettled, the broker gives it back */
      if (nh_amqp_sbs_closing(part)) break;   /* a session let go: the same */
      nh_amqp_sbs_touch(part);
      receive_delivery(a, part, d);
      nh_amqp_wake(a);
    } else if (pn_delivery_updated(d)) {
      nh_amqp_outbox_outcome(a, d);
      if (a->outbox_dirty) nh_amqp_outbox_pump(a);
    }
    break;
  }
  default:
    break;
  }
}

static void parts_free(aep_t *ep)
{
  for (int i = 0; i < ep->nparts; i++) {
    free(ep->parts[i].queue);
    free(ep->parts[i].address);
    free(ep->parts[i].sid);
  }
  free(ep->parts);
  ep->parts = NULL;
  ep->nparts = 0;
}

/* The endpoint's queues and their receivers' sources, before any is attached. */
static void parts_make(amqp_t *a, aep_t *ep, int n)
{
  parts_free(ep);
  ep->parts = nh_xcalloc((size_t)n, sizeof *ep->parts);
  ep->nparts = n;
  for (int i = 0; i < n; i++) {
    apart_t *p = &ep->parts[i];
    char queue[600], buf[1024];
    nh_rmq_partition_queue(ep->name, n, i, queue, sizeof queue);
    if (a->sb) snprintf(buf, sizeof buf, "%s", ep->entity);
    else snprintf(buf, sizeof buf, "/amq/queue/%s", queue);
    p->ep = ep;
    p->queue = nh_xstrdup(queue);
    p->address = nh_xstrdup(buf);
  }
}

static void ep_free(aep_t *ep)
{
  for (int i = 0; i < ep->ntypes; i++) free(ep->types[i]);
  free(ep->types);
  parts_free(ep);
  free(ep->name);
  free(ep->entity);
  free(ep);
}

static aep_t *ep_get(amqp_t *a, const char *endpoint)
{
  aep_t *ep = nh_amqp_ep_find(a, endpoint);
  if (ep) return ep;
  ep = nh_xcalloc(1, sizeof *ep);
  ep->a = a;
  ep->name = nh_xstrdup(endpoint);
  ep->reply = strncmp(endpoint, "_reply.", 7) == 0;
  if (a->sb) {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s/Subscriptions/%s", a->url.exchange, endpoint);
    ep->entity = nh_xstrdup(buf);
  }
  ep->capacity = 64;
  parts_make(a, ep, 1);
  nh_queue_init(&ep->buf);
  nh_queue_insert_head(&a->eps, &ep->node);
  return ep;
}

static int am_set_partitions(nh_transport_t *t, const char *endpoint, int n, nh_error_t *err)
{
  amqp_t *a = (amqp_t *)t;
  aep_t *ep = nh_amqp_ep_find(a, endpoint);
  if (ep && (ep->sessions ? 1 : ep->nparts) == n) return NH_OK;
  if (n > 1 && a->sb)
    return nh_error_set(err, NH_EUSAGE, "%s: partitions = %d is for RabbitMQ; on Service Bus a session-enabled "
                        "subscription keeps sessions in order across hosts (leave partitions out)", endpoint, n);
  if (n > 1 && a->url.no_management)
    return nh_error_set(err, NH_EUSAGE, "%s: partitions = %d needs the RabbitMQ management API to declare its queues "
                        "(the transport URL has management=none)", endpoint, n);
  if (ep && (ep->ever_declared || ep->decl))
    return nh_error_set(err, NH_EUSAGE, "%s: partitions cannot change from %d to %d while the host runs: that would "
                        "reorder its sessions. Stop every host of it, move its messages with `nimbus-host partitions "
                        "%s %d --transport ...`, then start with the new value (docs/broker-partitions.md)", endpoint,
                        ep->nparts, n, endpoint, n);
  parts_make(a, ep ? ep : ep_get(a, endpoint), n);
  return NH_OK;
}

static void am_quiesce(nh_transport_t *t) { nh_amqp_sbs_quiesce((amqp_t *)t); }

/* Service Bus sessions: n session receivers in place of the one receiver (nh_amqp_sbs.c). */
static int am_set_sessions(nh_transport_t *t, const char *endpoint, int n, nh_error_t *err)
{
  amqp_t *a = (amqp_t *)t;
  aep_t *ep = nh_amqp_ep_find(a, endpoint);
  if ((ep ? ep->sessions : 0) == n) return NH_OK;
  if (n > 0 && !a->sb)
    return nh_error_set(err, NH_EUSAGE, "%s: sessions = %d is for Service Bus session-enabled subscriptions; on "
                        "RabbitMQ an endpoint keeps its sessions in order across hosts with partitions = P "
                        "(docs/broker-partitions.md)", endpoint, n);
  if (ep && (ep->ever_declared || ep->declared))
    return nh_error_set(err, NH_EUSAGE, "%s: sessions cannot change from %d to %d while the host runs: restart it with "
                        "the new value", endpoint, ep->sessions, n);
  if (!ep) ep = ep_get(a, endpoint);
  parts_make(a, ep, n > 0 ? n : 1);
  ep->sessions = n;
  if (n > 0 && a->started) nh_amqp_sbs_start(a);   /* else at the start: its stop is sure to follow */
  return NH_OK;
}

static int am_subscribe(nh_transport_t *t, const char *endpoint, const char *const *types, const int *commands, int n,
                        nh_error_t *err)
{
  amqp_t *a = (amqp_t *)t;
  int reply = strncmp(endpoint, "_reply.", 7) == 0;
  if (!reply && a->emb->vt->subscribe(a->emb, endpoint, types, commands, n, err)) {
    aep_t *ep = nh_amqp_ep_find(a, endpoint);
    if (ep && !ep->types && !ep->ever_declared && !ep->decl) {   /* made by set_partitions just now */
      nh_queue_remove(&ep->node);
      ep_free(ep);
    }
    return NH_EFAIL;
  }
  aep_t *ep = ep_get(a, endpoint);
  for (int i = 0; i < ep->ntypes; i++) free(ep->types[i]);
  free(ep->types);
  ep->types = nh_xcalloc((size_t)(n > 0 ? n : 1), sizeof(char *));
  ep->ntypes = n;
  for (int i = 0; i < n; i++) ep->types[i] = nh_xstrdup(types[i]);
  if (a->started) nh_amqp_declare(a, ep);   /* a reload: new bindings (old ones stay, see docs) */
  return NH_OK;
}

/* ---------------------------------------------------------------- lifecycle */

void nh_amqp_start(nh_transport_t *t)
{
  amqp_t *a = (amqp_t *)t;
  if (a->started) return;
  a->started = 1;
  if (a->sb) {
    uint64_t every = (uint64_t)NH_SB_TOKEN_TTL_S * 750;
    uv_timer_init(a->loop, &a->sb_refresh);
    a->sb_refresh.data = a;
    a->sb_timer = 1;
    uv_timer_start(&a->sb_refresh, nh_amqp_sb_refresh, every, every);
  }
  nh_amqp_spread_start(a);
  nh_queue_t *q;
  nh_queue_foreach(q, &a->eps) {
    aep_t *ep = nh_queue_data(q, aep_t, node);
    if (ep->sessions) nh_amqp_sbs_start(a);
    nh_amqp_declare(a, ep);
  }
  nh_amqp_conn_start(a->conn);
}

static void conn_closed(void *data)
{
  amqp_t *a = data;
  if (a->shutdown_cb) {
    void (*cb)(void *) = a->shutdown_cb;
    a->shutdown_cb = NULL;
    cb(a->shutdown_data);
  }
}

void nh_amqp_stop(nh_transport_t *t, void (*done)(void *), void *data)
{
  amqp_t *a = (amqp_t *)t;
  int held = 0;
  for (int i = 0; i < NH_BUCKETS; i++)
    for (rec_t *r = a->buckets[i]; r; r = r->hnext) held++;
  if (held) nh_log_info("amqp", "stopping: %d delivery(ies) unsettled (the broker gives them out again)", held);
  nh_queue_t *q;
  nh_queue_foreach(q, &a->eps) {
    aep_t *ep = nh_queue_data(q, aep_t, node);
    if (!ep->reply) nh_log_info("amqp", "%s: at most %d message(s) were buffered at once", ep->name, ep->max_nbuf);
  }
  a->shutting_down = 1;
  a->shutdown_cb = done;
  a->shutdown_data = data;
  nh_queue_foreach(q, &a->eps) {
    aep_t *ep = nh_queue_data(q, aep_t, node);
    nh_rmq_cancel(ep->decl);
    ep->decl = NULL;
  }
  nh_amqp_probes_cancel(a);
  nh_amqp_targets_stop(a);
  nh_amqp_spread_stop(a);
  nh_amqp_sbs_stop(a);
  if (a->sb_timer) {
    a->sb_timer = 0;
    uv_close((uv_handle_t *)&a->sb_refresh, NULL);
  }
  if (a->pg) nh_amqp_pg_stop(a);
  nh_amqp_conn_close(a->conn, conn_closed, a);
}

static void am_close(nh_transport_t *t)
{
  amqp_t *a = (amqp_t *)t;
  if (a->store) nh_store_set_txn_hook(a->store, NULL, NULL);
  nh_amqp_targets_free(a);   /* first: a target probe cancelled below then answers into nothing */
  nh_amqp_probes_cancel(a);
  on_down(a, "closed", 0);   /* senders and deliveries */
  nh_queue_t *q, *next;
  nh_queue_foreach_safe(q, next, &a->eps) {
    ep_free(nh_queue_data(q, aep_t, node));
  }
  for (int i = 0; i < a->npend; i++) free(a->pend[i].reason);
  free(a->pend);
  free(a->txh);
  free(a->acked);
  free(a->resend);
  free(a->buf);
  if (a->pm) pn_message_free(a->pm);
  for (int i = 0; i < A_COUNT; i++) sqlite3_finalize(a->q[i]);
  nh_amqp_conn_free(a->conn);
  nh_sb_free(a->sb);
  nh_amqp_url_clear(&a->url);
  if (a->emb) a->emb->vt->close(a->emb);
  free(a->owner);
  if (a->pg && nh_amqp_pg_free(a)) return;   /* `a` goes with its last batch */
  free(a);
}

static void am_stats(nh_transport_t *t, nh_transport_stats_t *out)
{
  amqp_t *a = (amqp_t *)t;
  memset(out, 0, sizeof *out);
  out->connected = a->ssn != NULL && a->ready_sent;
  out->unconfirmed = a->unconfirmed;
  nh_queue_t *q;
  nh_queue_foreach(q, &a->eps) {
    aep_t *ep = nh_queue_data(q, aep_t, node);
    out->buffered += ep->nbuf;
    for (int i = 0; a->ssn && i < ep->nparts; i++)
      if (ep->parts[i].link) out->credit += pn_link_credit(ep->parts[i].link);
  }
  if (!out->connected) out->why = a->ssn ? "connected, declaring the topology" : "not connected to the broker";
}

/* The pump's unit of work: on PostgreSQL it tells the transaction's phases (sqlite's
 * store tells them itself), and the queue's statements and the transport's join it. */
static void am_attach(nh_transport_t *t, struct nh_uow *uow)
{
  amqp_t *a = (amqp_t *)t;
  if (!a->pg) return;
  if (a->emb->vt->attach) a->emb->vt->attach(a->emb, uow);
  nh_uow_set_txn_hook(uow, txn_hook, a);
  nh_amqp_pg_attach(a, uow);
}

static const nh_transport_vtbl_t amqp_vtbl = {
  .name = "amqp",
  .subscribe = am_subscribe,
  .subscribe_check = am_subscribe_check,
  .receive = am_receive,
  .lock_session = am_lock_session,
  .session_next = NULL,   /* the broker's backlog is not ours to read ahead */
  .unlock_session = am_unlock_session,
  .renew = am_renew,
  .settle = am_settle,
  .send = am_send,
  .close = am_close,
  .set_capacity = am_set_capacity,
  .set_partitions = am_set_partitions,
  .set_sessions = am_set_sessions,
  .quiesce = am_quiesce,
  .probe = nh_amqp_vt_probe,
  .stats = am_stats,
  .attach = am_attach,
};

/* What both stores share: the URL parsed, the connection set up (not started). */
static amqp_t *amqp_new(uv_loop_t *loop, const char *url, const char *owner, nh_amqp_status_cb cb, void *cb_data,
                        nh_error_t *err)
{
  amqp_t *a = nh_xcalloc(1, sizeof *a);
  nh_queue_init(&a->eps);
  nh_queue_init(&a->senders);
  nh_queue_init(&a->probes);
  a->base.vt = &amqp_vtbl;
  a->base.caps = NH_CAP_DEAD_LETTER | NH_CAP_SCHEDULED_SEND;
  a->base.lock_ms = 30000;
  a->loop = loop;
  a->status_cb = cb;
  a->status_data = cb_data;
  a->owner = nh_xstrdup(owner);
  if (nh_amqp_url_parse(url, &a->url, err)) {
    free(a->owner);
    free(a);
    return NULL;
  }
  return a;
}

/* After the store's part: the Service Bus profile and the connection (not started). */
static void amqp_connect_prepare(amqp_t *a, const char *owner)
{
  if (a->url.servicebus) a->sb = nh_sb_new(&a->url);
  a->pm = pn_message();
  nh_amqp_conn_cbs_t cbs = { on_up, on_event, on_down };
  a->conn = nh_amqp_conn_init(a->loop, &a->url, owner, &cbs, a);
}

nh_transport_t *nh_amqp_init(uv_loop_t *loop, nh_store_t *store, const char *url, const char *owner,
                            nh_amqp_status_cb cb, void *cb_data, nh_error_t *err)
{
  amqp_t *a = amqp_new(loop, url, owner, cb, cb_data, err);
  if (!a) return NULL;
  a->store = store;
  a->db = nh_store_db(store);
  if (nh_sqlite_migrate(a->db, "amqp", amqp_migrations, (int)(sizeof amqp_migrations / sizeof amqp_migrations[0]),
                        err) ||
      !(a->emb = nh_embedded_init(a->db, owner, err))) {
    nh_amqp_url_clear(&a->url);
    free(a->owner);
    free(a);
    return NULL;
  }
  for (int i = 0; i < A_COUNT; i++) {
    if (sqlite3_prepare_v3(a->db, a_sql[i], -1, SQLITE_PREPARE_PERSISTENT, &a->q[i], NULL) != SQLITE_OK) {
      nh_error_set(err, NH_EFAIL, "amqp transport: %s", sqlite3_errmsg(a->db));
      am_close(&a->base);
      return NULL;
    }
  }
  nh_amqp_outbox_claim(a);
  amqp_connect_prepare(a, owner);
  nh_store_set_txn_hook(store, txn_hook, a);
  return &a->base;
}

nh_transport_t *nh_amqp_init_pg(uv_loop_t *loop, struct nh_pg_link *link, struct pg_conn *conn, const char *url,
                               const char *owner, nh_amqp_status_cb cb, void *cb_data, nh_error_t *err)
{
  amqp_t *a = amqp_new(loop, url, owner, cb, cb_data, err);
  if (!a) {
    PQfinish(conn);
    return NULL;
  }
  if (nh_amqp_pg_open(a, link, conn, err)) {   /* conn is its, whatever happens */
    nh_amqp_url_clear(&a->url);
    free(a->owner);
    if (!nh_amqp_pg_free(a)) free(a);   /* nothing of its is out on the link yet: freed at once */
    return NULL;
  }
  amqp_connect_prepare(a, owner);
  return &a->base;
}
