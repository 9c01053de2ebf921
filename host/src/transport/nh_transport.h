/* The transport interface: one vtable, implemented by the embedded (sqlite) queue
 * (nh_embedded.h) and by AMQP 1.0 (nh_amqp.h). Transports never see Lua; they trade nh_msg_t with the dispatcher. */
#ifndef NH_TRANSPORT_H
#define NH_TRANSPORT_H

#include <stdint.h>

#include "core/nh_error.h"
#include "core/nh_msg.h"

enum {
  NH_CAP_LOCK_EXPIRES = 1u << 0,    /* an unsettled message comes back after its lock expires */
  NH_CAP_BROKER_SESSIONS = 1u << 1, /* the broker gives session locks across processes */
  NH_CAP_SCHEDULED_SEND = 1u << 2,  /* release(delay) and visible-at are honoured */
  NH_CAP_DEAD_LETTER = 1u << 3,
  NH_CAP_ATOMIC_SETTLE = 1u << 4,   /* settle() joins the store's open transaction */
};

typedef enum { NH_SETTLE_COMPLETE, NH_SETTLE_RELEASE, NH_SETTLE_DEAD_LETTER } nh_settle_t;

typedef struct nh_transport nh_transport_t;
struct nh_uow;

/* What /metrics and /readyz show of a transport (nh_transport_vtbl_t.stats). */
typedef struct nh_transport_stats {
  int connected;                 /* able to receive and send now (a broker: the connection and its session are up) */
  int64_t buffered;              /* deliveries received, not yet handed to the dispatcher */
  int64_t credit;                /* link credit granted to the broker, summed over the receivers */
  int64_t unconfirmed;           /* sent, the broker's outcome not back yet */
  const char *why;               /* not connected: why (the last error), or NULL */
} nh_transport_stats_t;

/* Receives ownership of msg (free with nh_msg_clear + free). The transport has already
 * taken the session lock for msg->session_id (the AMQP transport takes none for the
 * replies on a process's own reply queue). */
typedef void (*nh_transport_msg_cb)(void *data, nh_msg_t *msg);

typedef struct nh_transport_vtbl {
  const char *name;
  /* commands[i]: types[i] is a command; subscribing refuses a second consuming endpoint. */
  int (*subscribe)(nh_transport_t *t, const char *endpoint, const char *const *types, const int *commands, int n,
                   nh_error_t *err);
  /* Would subscribe() accept these? Writes nothing (a reload checks before it swaps).
   * Subscriptions of the endpoints in `replacing` (the generation being replaced) do not
   * count as conflicts. */
  int (*subscribe_check)(nh_transport_t *t, const char *endpoint, const char *const *types, const int *commands,
                         int n, const char *const *replacing, int nreplacing, nh_error_t *err);
  /* Pull transports deliver up to `max` session heads through on_message; returns how many. */
  int (*receive)(nh_transport_t *t, const char *endpoint, int max, int64_t now);
  int (*lock_session)(nh_transport_t *t, const char *endpoint, const char *session, int64_t now);
  /* Optional (pull transports): the next visible messages of a session this process has
   * locked, after `after_seq`, in order; up to max into out[] (owned by the caller).
   * Lets a blocked session's backlog be parked at once instead of one per pump. */
  int (*session_next)(nh_transport_t *t, const char *endpoint, const char *session, int64_t after_seq, int max,
                      nh_msg_t *out, int64_t now);
  /* 1 if this process held the lock, 0 if it had lost it, < 0 on error. */
  int (*unlock_session)(nh_transport_t *t, const char *endpoint, const char *session);
  /* Extends one session lock: 1 renewed, 0 not ours any more (lost), < 0 error. */
  int (*renew)(nh_transport_t *t, const char *endpoint, const char *session, int64_t now);
  int (*settle)(nh_transport_t *t, const nh_msg_t *m, nh_settle_t how, int64_t delay_ms, const char *reason);
  /* to_endpoint NULL: fan out by event type, one copy (fresh EventId) per subscriber. */
  int (*send)(nh_transport_t *t, const nh_msg_t *m, const char *to_endpoint, int *copies, nh_error_t *err);
  void (*close)(nh_transport_t *t);
  /* Optional: how many messages of an endpoint the dispatcher can take at once (its
   * concurrency); a broker transport sizes its credit from it (AMQP: a window of
   * NH_WINDOW_FACTOR times this, see nh_amqp_topup). */
  void (*set_capacity)(nh_transport_t *t, const char *endpoint, int n);
  /* Optional, before subscribe: the endpoint's sessions are spread over n broker queues,
   * each consumed by one process at a time (RabbitMQ: docs/broker-partitions.md). Refuses
   * (NH_EUSAGE) a change of n for an endpoint already consuming: it would reorder sessions. */
  int (*set_partitions)(nh_transport_t *t, const char *endpoint, int n, nh_error_t *err);
  /* Optional, before subscribe: n > 0 consumes the endpoint through n session receivers,
   * each holding one broker session (Service Bus session-enabled subscriptions:
   * docs/servicebus-amqp.md); 0: message locks. Refuses (NH_EUSAGE) what the broker
   * profile cannot do, and a change for an endpoint already consuming. */
  int (*set_sessions)(nh_transport_t *t, const char *endpoint, int n, nh_error_t *err);
  /* Optional: the host is stopping (its drain began): take on no new work that the drain
   * would only give back (Service Bus: no new sessions; those with nothing in handlers let go). */
  void (*quiesce)(nh_transport_t *t);
  /* Optional, for transports whose send cannot tell how many endpoints consume a type
   * (a broker's fan-out): asks, and calls done(data, 1 | 0 | -1 unknown) later. */
  int (*probe)(nh_transport_t *t, const char *event_type, void (*done)(void *, int), void *data);
  /* Optional: connection state and buffers (NULL: always connected, nothing buffered). */
  void (*stats)(nh_transport_t *t, nh_transport_stats_t *out);
  /* Optional: the pump's unit of work (store/nh_uow.h), given by the dispatcher, for a
   * transport whose statements join the pump's transaction through it (the embedded
   * queue on PostgreSQL: its reads fill with the pump's, its writes commit with them). */
  void (*attach)(nh_transport_t *t, struct nh_uow *uow);
} nh_transport_vtbl_t;

struct nh_transport {
  const nh_transport_vtbl_t *vt;
  unsigned caps;
  int64_t lock_ms;               /* lock duration */
  nh_transport_msg_cb on_message;
  void (*on_wake)(void *cb_data);   /* a push transport has new messages: pump soon */
  void *cb_data;
};

#endif
