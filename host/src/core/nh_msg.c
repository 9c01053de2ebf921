/* nh_msg_t helpers: the wire names of message types, and freeing / deep-copying the
 * strings a message owns. */
#include "nh_msg.h"
#include "nh_strset.h"
#include "nh_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const type_names[] = {
  "EventRequest", "ResubmissionRequest", "SkipRequest",
  "HandoffCompletedRequest", "HandoffFailedRequest", "ReplyResponse", "Unknown",
};

const char *nh_msg_type_name(nh_msg_type_t t)
{
  return (unsigned)t <= NH_MT_UNKNOWN ? type_names[t] : "Unknown";
}

nh_msg_type_t nh_msg_type_parse(const char *s)
{
  if (!s) return NH_MT_UNKNOWN;
  for (int i = 0; i < NH_MT_UNKNOWN; i++)
    if (strcmp(s, type_names[i]) == 0) return (nh_msg_type_t)i;
  return NH_MT_UNKNOWN;
}

void nh_msg_clear(nh_msg_t *m)
{
  free(m->endpoint);
  free(m->session_id);
  free(m->message_id);
  free(m->event_id);
  free(m->event_type);
  free(m->correlation_id);
  free(m->originating_message_id);
  free(m->parent_message_id);
  free(m->from);
  free(m->reply_to);
  free(m->body);
  free(m->error_text);
  free(m->error_type);
  free(m->traceparent);
  free(m->tracestate);
  memset(m, 0, sizeof *m);
}

void nh_msg_copy(nh_msg_t *dst, const nh_msg_t *s)
{
  *dst = *s;
  dst->endpoint = nh_xstrdup(s->endpoint);
  dst->session_id = nh_xstrdup(s->session_id);
  dst->message_id = nh_xstrdup(s->message_id);
  dst->event_id = nh_xstrdup(s->event_id);
  dst->event_type = nh_xstrdup(s->event_type);
  dst->correlation_id = nh_xstrdup(s->correlation_id);
  dst->originating_message_id = nh_xstrdup(s->originating_message_id);
  dst->parent_message_id = nh_xstrdup(s->parent_message_id);
  dst->from = nh_xstrdup(s->from);
  dst->reply_to = nh_xstrdup(s->reply_to);
  dst->body = s->body ? nh_xstrndup(s->body, s->body_len) : NULL;
  dst->error_text = nh_xstrdup(s->error_text);
  dst->error_type = nh_xstrdup(s->error_type);
  dst->traceparent = nh_xstrdup(s->traceparent);
  dst->tracestate = nh_xstrdup(s->tracestate);
}

void nh_msg_event(nh_msg_t *m, nh_msg_ids_t *ids, const char *type, const char *body, size_t body_len,
                  const char *session, const char *correlation_id, const char *message_id)
{
  memset(m, 0, sizeof *m);
  if (!session) nh_uuid_v7(ids->session);
  if (!correlation_id) nh_uuid_v7(ids->correlation);
  m->session_id = (char *)(session ? session : ids->session);
  m->message_id = (char *)message_id;
  m->event_type = (char *)type;
  m->type = NH_MT_EVENT;
  m->correlation_id = (char *)(correlation_id ? correlation_id : ids->correlation);
  m->body = (char *)body;
  m->body_len = body_len;
  m->enqueued_at = nh_time_now_ms();
}

int nh_queued_running(struct nh_strset *locked, const char *endpoint, const char *session)
{
  size_t len = strlen(endpoint) + strlen(session) + 2;
  char *key = nh_xmalloc(len);
  snprintf(key, len, "%s\x1f%s", endpoint, session);
  int first = nh_strset_add(locked, key);
  free(key);
  return first;
}
