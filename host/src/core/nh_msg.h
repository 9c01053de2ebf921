/* The plain message struct the dispatcher passes between transport, store and Lua.
 * A message a transport hands out owns every string (heap copies), so it outlives the
 * sqlite row or AMQP frame it came from; one built only to be sent may point at
 * borrowed strings (send() copies what it keeps) and is then not cleared. */
#ifndef NH_MSG_H
#define NH_MSG_H

#include <stddef.h>
#include <stdint.h>

/* NimBus message types that reach an endpoint. Retries are not messages here: the
 * retry due time lives in the session state (see dispatch/). */
typedef enum {
  NH_MT_EVENT = 0,        /* EventRequest */
  NH_MT_RESUBMIT,         /* ResubmissionRequest (operator) */
  NH_MT_SKIP,             /* SkipRequest (operator) */
  NH_MT_HANDOFF_COMPLETE, /* HandoffCompletedRequest */
  NH_MT_HANDOFF_FAIL,     /* HandoffFailedRequest */
  NH_MT_REPLY,            /* a reply to nimbus.request, addressed to the requester's reply queue */
  NH_MT_UNKNOWN
} nh_msg_type_t;

typedef struct nh_msg {
  int64_t seq;            /* transport position (embedded: queue row id) */
  uint64_t tr_id;         /* broker transports: the delivery this came from (not owned; 0: none) */
  char *endpoint;
  char *session_id;
  char *message_id;
  char *event_id;
  char *event_type;
  nh_msg_type_t type;
  char *correlation_id;
  char *originating_message_id;
  char *parent_message_id;
  char *from;
  char *reply_to;         /* requests: the requester's reply queue */
  int retry_count;
  int delivery_count;
  int release_count;      /* transient releases so far (backoff), not failed deliveries */
  int64_t enqueued_at;    /* ms since epoch */
  /* JSON payload: the event, a resubmit's (possibly edited) payload, a hand-off's
   * result, or a reply's value */
  char *body;
  size_t body_len;
  /* a failed hand-off's error, an error reply's error, or (NH_MT_UNKNOWN from a broker
   * transport) why the message was refused or could not be decoded */
  char *error_text;
  char *error_type;
  /* W3C trace context of the span that sent it (docs/observability.md, Traces), as
   * received: checked where it is used (core/nh_trace.h), NULL when it came without */
  char *traceparent;
  char *tracestate;
} nh_msg_t;

/* The wire name of a type ("EventRequest", ..., "ReplyResponse"; "Unknown" out of range). */
const char *nh_msg_type_name(nh_msg_type_t t);
/* The type a wire name stands for; NH_MT_UNKNOWN for NULL or an unknown name. */
nh_msg_type_t nh_msg_type_parse(const char *s);
void nh_msg_clear(nh_msg_t *m);   /* frees owned strings, zeroes the struct */
/* Overwrites dst (without freeing it) with a deep copy of src: every owned string is
 * duplicated (body by body_len); the other fields, tr_id included, are copied as they are. */
void nh_msg_copy(nh_msg_t *dst, const nh_msg_t *src);

/* A fresh event for a publish, borrowing every string (nothing to free): a session and a
 * correlation id of its own, written into ids (two UUIDs), when the caller gave none. */
typedef struct nh_msg_ids { char session[37], correlation[37]; } nh_msg_ids_t;
void nh_msg_event(nh_msg_t *m, nh_msg_ids_t *ids, const char *type, const char *body, size_t body_len,
                  const char *session, const char *correlation_id, const char *message_id);

/* A message of the embedded queue not finished yet, for `events --status queued|running`
 * (on sqlite nh_embedded_list, on PostgreSQL nh_pgq_unfinished): on the AMQP transport only
 * operator requests wait there; the broker holds the rest. `running` is a session's head
 * while a live owner holds the session's lock; `queued` is everything else, `owner` is NULL
 * then and `visible_at` may lie ahead. */
typedef struct nh_queued_row {
  const char *endpoint, *session_id, *event_id, *event_type, *message_type, *owner;
  int64_t enqueued_at, visible_at;
  int running, delivery_count;
} nh_queued_row_t;
/* Whether a row read in seq order, whose session's lock has a live owner, is that session's
 * head (the first of its session met: running); `locked` remembers the sessions met. The
 * rule of both stores' listings (nh_embedded_list, nh_pgq_unfinished). */
struct nh_strset;
int nh_queued_running(struct nh_strset *locked, const char *endpoint, const char *session);

#endif
