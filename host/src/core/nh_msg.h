/* The plain message struct the dispatcher passes between transport, store and Lua.
 * Every string is owned by the message (heap copies) so a message outlives the
 * sqlite row or AMQP frame it came from. */
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
  char *body;             /* JSON payload (event) or operator arguments (control messages) */
  size_t body_len;
  /* control-message arguments (resubmit --body, handoff result / error) */
  char *error_text;
  char *error_type;
} nh_msg_t;

const char *nh_msg_type_name(nh_msg_type_t t);
nh_msg_type_t nh_msg_type_parse(const char *s);
void nh_msg_clear(nh_msg_t *m);
void nh_msg_copy(nh_msg_t *dst, const nh_msg_t *src);   /* deep copy of every owned string */   /* frees owned strings, zeroes the struct */

#endif
