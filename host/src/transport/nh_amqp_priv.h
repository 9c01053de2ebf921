/* The AMQP transport's state, shared by nh_amqp.c (the vtable, receiving and settling),
 * nh_amqp_outbox.c (sending) and nh_amqp_topo.c (topology, readiness, probes, Service
 * Bus tokens and lock renewal). Not for other modules: they use nh_amqp.h. */
#ifndef NH_AMQP_PRIV_H
#define NH_AMQP_PRIV_H

#include <proton/condition.h>
#include <proton/delivery.h>
#include <proton/link.h>
#include <proton/session.h>
#include <sqlite3.h>

#include "nh_amqp.h"
#include "nh_amqp_int.h"
#include "core/nh_queue.h"

#define NH_BUCKETS 4096
#define NH_OUTBOX_BATCH 256
#define NH_REPLY_WINDOW 256
#define NH_MIN_WINDOW 16
#ifndef NH_WINDOW_FACTOR
#define NH_WINDOW_FACTOR 4
#endif

enum { A_OUT_ADD, A_OUT_NEXT, A_OUT_DEL, A_DLV_BUMP, A_DLV_DEL, A_OUT_LEFT, A_OUT_OWNERS, A_OUT_CLAIM, A_OUT_DROP, A_OUT_ONE, A_COUNT };

typedef struct aep aep_t;
typedef struct apart apart_t;
typedef struct amqp amqp_t;
typedef struct amqp_pg amqp_pg_t;
struct nh_uow;
struct nh_pg_link;
struct pg_conn;

typedef struct rec {
  uint64_t id;                   /* arrival order; the handle in nh_msg_t.tr_id */
  struct rec *hnext;             /* hash chain */
  nh_queue_t node;               /* the endpoint's buffer (ep->buf), while buffered */
  aep_t *ep;
  apart_t *part;                 /* the queue (and receiver) it came from */
  pn_delivery_t *dlv;
  nh_msg_t msg;
  int buffered;
  int handouts;                  /* times handed to the dispatcher by this process */
  int base;                      /* deliveries before this process saw it (store count) */
  int redelivered;               /* the broker says another consumer had it first */
  int persisted;                 /* an amqp_deliveries row exists */
  int lock_lost;                 /* Service Bus: a renew-lock answer said the lock is gone */
} rec_t;

/* One queue of an endpoint and its receiver: the endpoint's queue, or with partitions
 * one of its `<endpoint>.p<i>` (docs/broker-partitions.md). */
struct apart {
  aep_t *ep;
  char *queue;
  char *address;                 /* the receiver's source */
  pn_link_t *link;
  pn_session_t *ssn;             /* with partitions, the receiver's own session (nh_amqp_part_yield) */
  int attached;
  int nbuf, inflight;            /* its deliveries buffered, in handlers */
  int yielding;                  /* handing it on (nh_amqp_spread.c): 1 finishing, 2 ending its session */
  uint64_t yield_since;          /* loop time (ms) the hand-on began, then its session's end was sent */
  /* A Service Bus session receiver (ep->sessions, nh_amqp_sbs.c): */
  int sbs;                       /* enum in nh_amqp_sbs.c: idle, asking, holding, ending */
  uint64_t sbs_since;            /* loop time it entered that state */
  char *sid;                     /* the session it holds (granted at the attach) */
  int64_t lock_span;             /* the lock's length (ms), from the grant */
  uint64_t lock_end;             /* loop time the session lock ends, as last told */
  uint64_t last_ms;              /* loop time of its last delivery or settlement */
  uint64_t retry_at;             /* loop time the next attach may go out (idle) */
  uint64_t grant;                /* bumped at each grant: a renewal's answer is for one grant */
  int renewing;
  uint64_t renew_sent, renew_after;   /* loop times: the renewal out; none before (after a failure) */
};

struct aep {
  struct amqp *a;
  char *name;
  apart_t *parts;                /* nparts = partitions (1 on Service Bus and for replies) */
  int nparts;
  char *entity;                  /* Service Bus: the subscription path (token audience) */
  char **types;
  int ntypes;
  int capacity;
  int sessions;                  /* Service Bus: nparts session receivers (0: message locks) */
  int sessions_seen;             /* each receiver has had an answer (a session or none yet): ready */
  int reply;                     /* this process's reply queue */
  int declared;
  int ever_declared;             /* its queues exist: their number is fixed while the host runs */
  nh_rmq_decl_t *decl;
  nh_queue_t buf;                /* buffered deliveries, in arrival (id) order */
  int nbuf, inflight;
  int max_nbuf;                  /* the most ever buffered (a broker may send past the credit) */
  nh_queue_t node;               /* a->eps */
};

typedef struct sender {
  char *address;
  pn_link_t *link;
  nh_queue_t node;               /* a->senders */
} sender_t;

typedef struct pend {
  uint64_t id;
  nh_settle_t how;
  char *reason;
} pend_t;

struct amqp {
  nh_transport_t base;
  nh_transport_t *emb;
  uv_loop_t *loop;
  nh_store_t *store;             /* sqlite (store, db, q); NULL on PostgreSQL (pg) */
  sqlite3 *db;
  amqp_pg_t *pg;                 /* the tables on a PostgreSQL store (nh_amqp_pg.c); NULL on sqlite */
  uint64_t conn_gen;             /* bumped at each connection's start and end: what a read answers is for it */
  char *owner;
  sqlite3_stmt *q[A_COUNT];
  nh_amqp_url_t url;
  nh_amqp_conn_t *conn;
  pn_session_t *ssn;
  pn_message_t *pm;
  char *buf;
  size_t bufcap;
  nh_queue_t eps;                /* newest first */
  nh_queue_t senders;            /* one per address, this connection's; newest first */
  rec_t *buckets[NH_BUCKETS];
  uint64_t next_id;
  pend_t *pend;                  /* settlements waiting for the open transaction */
  int npend, cpend;
  uint64_t *txh;                 /* deliveries handed out in the open transaction */
  int ntxh, ctxh;
  int sp_npend, sp_ntxh, in_sp;  /* marks at the open savepoint (one job's) */
  int64_t *resend;               /* outbox rows the broker released, or held ones now known: sent again, alone */
  int nresend, cresend;
  int64_t first_own_seq;         /* the first outbox row this process wrote (0: none) */
  int64_t *acked;                /* outbox rows the broker accepted, to delete */
  int nacked, cacked, deleting;
  int64_t last_sent;             /* highest outbox seq sent on this connection */
  int unconfirmed;               /* sent on this connection, outcome not back yet */
  int outbox_dirty;
  int in_tx;
  int started, ready_sent, fatal, shutting_down;
  nh_amqp_status_cb status_cb;
  void *status_data;
  void (*shutdown_cb)(void *);
  void *shutdown_data;
  nh_queue_t probes;             /* struct aprobe (nh_amqp_topo.c), newest first */
  struct atarget *targets;       /* endpoints sent to, not consumed (nh_amqp_targets.c) */
  int ntargets, targets_off;
  int64_t *held;                 /* outbox rows for an endpoint not known yet: sent once it is */
  int nheld, cheld;
  uv_timer_t *target_timer;      /* asks again about endpoints the broker had no queue for */
  nh_sb_t *sb;                   /* Service Bus profile */
  uv_timer_t sb_refresh;         /* puts the tokens again before they expire */
  int sb_timer;
  int topic_ok;                  /* Service Bus: the token for the topic was accepted */
  uv_timer_t spread_timer;       /* partitions spread over hosts (nh_amqp_spread.c) */
  int spread_on, spread_warned;
  nh_rmq_consumers_t *spread_call;
  uint64_t spread_gen;           /* conn_gen when the consumers were asked for */
  uv_timer_t sbs_timer;          /* Service Bus session receivers: renewals, idle releases (nh_amqp_sbs.c) */
  int sbs_on;
  int quiescing;                 /* the host is stopping: no new sessions (nh_amqp_sbs_quiesce) */
};

/* nh_amqp.c */
void nh_amqp_status(amqp_t *a, nh_amqp_status_t st, const char *msg);
/* Where a message sent to `to` (NULL: fanned out by its type) goes: the exchange, the
 * endpoint's queue (with partitions, the queue of `session`'s partition, p0 without one),
 * or (Service Bus) the topic; NH_EUSAGE when the profile cannot. */
int nh_amqp_address(amqp_t *a, const char *to, const char *session, char *address, size_t len, nh_error_t *err);
void nh_amqp_wake(amqp_t *a);
rec_t *nh_amqp_rec_get(amqp_t *a, uint64_t id);
aep_t *nh_amqp_ep_find(amqp_t *a, const char *name);
void nh_amqp_topup(aep_t *ep);
int nh_amqp_ep_attached(const aep_t *ep);   /* every receiver of it attached */
void *nh_amqp_grow(void *p, int *cap, int need, size_t size);

/* Hands partition p on to a waiting host: no more credit and nothing more handed out,
 * what is in handlers settled here, then the end of the receiver's session (which gives
 * the rest back), and a new session and receiver that wait in line. nh_amqp_part_steps
 * moves every hand-on along (after settlements and on the spreading timer). */
void nh_amqp_part_yield(apart_t *p);
void nh_amqp_part_steps(amqp_t *a);
/* A session end unanswered for NH_YIELD_END_MS ends the connection (on the spreading timer). */
void nh_amqp_part_check_ends(amqp_t *a);

/* nh_amqp_sbs.c: Service Bus session receivers (docs/servicebus-amqp.md, "Sessions") */
void nh_amqp_sbs_start(amqp_t *a);
void nh_amqp_sbs_stop(amqp_t *a);
/* The session filter (next available) on a new receiver of a session endpoint. */
void nh_amqp_sbs_filter(apart_t *p);
/* The broker answered the attach: the session granted, or none (a detach follows). */
void nh_amqp_sbs_opened(amqp_t *a, apart_t *p);
/* The broker ended a session receiver's AMQP session (after end_part): freed; it asks again. */
void nh_amqp_sbs_ended(amqp_t *a, apart_t *p);
/* The host is stopping: ask for no more sessions; let go of those with nothing in handlers. */
void nh_amqp_sbs_quiesce(amqp_t *a);
/* The broker detached a session receiver: 1 if handled here (no reconnect). */
int nh_amqp_sbs_closed(amqp_t *a, apart_t *p, pn_condition_t *cond);
/* What a session receiver still holds of the connection: forgotten (the connection went). */
void nh_amqp_sbs_reset(apart_t *p);
/* A delivery or settlement on it: it is not idle. */
void nh_amqp_sbs_touch(apart_t *p);
/* Deliveries on it are not taken (it is being released: the broker gives them back). */
int nh_amqp_sbs_closing(const apart_t *p);
/* Drops what part p has buffered (never handed out) and cuts what is in handlers from
 * its delivery (their outcome is recorded, never settled here), with lock_lost set. */
void nh_amqp_part_forget(amqp_t *a, apart_t *p);

/* nh_amqp_spread.c */
void nh_amqp_spread_start(amqp_t *a);
void nh_amqp_spread_stop(amqp_t *a);
void nh_amqp_spread_tick(uv_timer_t *t);

/* nh_amqp.c, read-only: its sqlite migrations (their number in *count) and the text of
 * statement A_* `id` (NULL out of range), so that a test can run them on a sqlite file
 * beside their PostgreSQL twins (store/nh_pg_amqp.c, host/tests/test_pg_amqp.c). */
const char *const *nh_amqp_sql_migrations(int *count);
const char *nh_amqp_sql(int id);

/* nh_amqp_outbox.c: sends through the store's outbox */
int nh_amqp_outbox_add(amqp_t *a, const char *address, const nh_msg_t *m, const char *to, nh_error_t *err);
/* The message as the outbox keeps it (AMQP's encoding), in a->buf: size bytes. */
int nh_amqp_outbox_encode(amqp_t *a, const nh_msg_t *m, const char *to, size_t *size, nh_error_t *err);
void nh_amqp_outbox_pump(amqp_t *a);
void nh_amqp_outbox_outcome(amqp_t *a, pn_delivery_t *d);
void nh_amqp_outbox_claim(amqp_t *a);
/* Sends one outbox row on its address's sender: 1 sent, 0 when the sender has no credit
 * (PN_LINK_FLOW pumps again). */
int nh_amqp_outbox_send(amqp_t *a, int64_t seq, const char *address, const void *message, size_t len);
/* Accepted, its delete not committed yet: a resend after a reconnect would duplicate it. */
int nh_amqp_outbox_acked(const amqp_t *a, int64_t seq);

/* nh_amqp_pg.c: the transport's tables on a PostgreSQL store. Inside the pump's pass
 * (nh_uow_open) statements go through its unit of work: a read it does not have voids the
 * pass, a write joins its commit. Outside a pass (deleting accepted rows, reading what to
 * send) they go in batches of their own on the link, one at a time, the next gathering
 * what comes meanwhile. */
int nh_amqp_pg_open(amqp_t *a, struct nh_pg_link *link, struct pg_conn *conn, nh_error_t *err);
void nh_amqp_pg_attach(amqp_t *a, struct nh_uow *uow);
/* The delivery count after one more delivery: > 0, 0 when the pass has not read it yet
 * (it is void: the fill reads it), < 0 on error. */
int nh_amqp_pg_dlv_bump(amqp_t *a, const char *endpoint, const char *message_id);
int nh_amqp_pg_dlv_del(amqp_t *a, const char *endpoint, const char *message_id);
int nh_amqp_pg_out_add(amqp_t *a, const char *address, const void *message, size_t len, nh_error_t *err);
/* Reads the rows to send (released ones, then what follows last_sent) and sends them. */
void nh_amqp_pg_pump(amqp_t *a);
/* Rows the broker accepted (a->acked) are to be deleted. */
void nh_amqp_pg_acked(amqp_t *a);
void nh_amqp_pg_stop(amqp_t *a);
/* Messages of this process not yet sent, accepted and deleted (nh_amqp_unconfirmed). */
int nh_amqp_pg_pending(amqp_t *a);
/* Frees the PostgreSQL state, and `a` with it: now (returns 0), or once the batch out on
 * the link is over (returns 1). */
int nh_amqp_pg_free(amqp_t *a);

/* nh_amqp_topo.c: topology, receivers, readiness, probes, Service Bus tokens and locks */
void nh_amqp_attach(amqp_t *a, aep_t *ep);
void nh_amqp_declare(amqp_t *a, aep_t *ep);
void nh_amqp_check_ready(amqp_t *a);
void nh_amqp_topic_token(void *data, int code, const char *desc);
int nh_amqp_sb_renew(amqp_t *a, const char *endpoint, const char *session);
void nh_amqp_sb_refresh(uv_timer_t *h);
void nh_amqp_probes_cancel(amqp_t *a);

/* nh_amqp_targets.c: endpoints sent to without consuming them */
/* The partition count of an endpoint sent to: its own, or a target's, else 1. */
int nh_amqp_parts_of(amqp_t *a, const char *endpoint);
/* Outbox row `seq` for `address`: 0 to send it as it is, 1 with the address of its
 * session's partition in out, -1 held (its endpoint is not known yet: the broker is asked
 * for its queues, and the row sent once it answered). */
int nh_amqp_target_resolve(amqp_t *a, int64_t seq, const char *address, const void *message, size_t len, char *out,
                           size_t outlen);
void nh_amqp_targets_stop(amqp_t *a);
void nh_amqp_targets_free(amqp_t *a);
int nh_amqp_vt_probe(nh_transport_t *t, const char *event_type, void (*done)(void *, int), void *data);

#endif
