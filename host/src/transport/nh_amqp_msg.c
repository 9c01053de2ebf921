/* Mapping between nh_msg_t and AMQP messages (the NimBus wire contract on AMQP 1.0,
 * docs/design.md section 10):
 *   properties: message-id, correlation-id, group-id = SessionId, subject = EventTypeId
 *               (on RabbitMQ, for the exchange: the routing key, EventTypeId and the session's
 *               bucket, nh_amqp_routing_key),
 *               reply-to, content-type application/json, creation-time = enqueued at
 *   application-properties: MessageType, EventTypeId, EventId (when known), To, From,
 *               OriginatingMessageId, ParentMessageId ("self" when none), RetryCount,
 *               ReplyTo, ErrorText / ErrorType (error replies), traceparent and tracestate
 *               (W3C trace context; the Service Bus profile adds Diagnostic-Id, the name
 *               the Azure SDKs use for the same value)
 *   body: one data section holding the JSON payload; header durable. */
#include "nh_amqp_int.h"
#include "core/nh_trace.h"
#include "core/nh_util.h"

#include <inttypes.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <proton/codec.h>
#include <proton/delivery.h>
#include <proton/link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void put_prop(pn_data_t *p, const char *key, const char *val)
{
  if (!val) return;
  pn_data_put_string(p, pn_bytes(strlen(key), key));
  pn_data_put_string(p, pn_bytes(strlen(val), val));
}

static pn_atom_t atom_str(const char *s)
{
  pn_atom_t a;
  memset(&a, 0, sizeof a);
  a.type = PN_STRING;
  a.u.as_bytes = pn_bytes(strlen(s), s);
  return a;
}

/* FNV-1a (32 bits) over the session id's bytes: stable across versions and machines. */
unsigned nh_amqp_session_bucket(const char *session)
{
  uint32_t h = 2166136261u;
  for (const unsigned char *p = (const unsigned char *)session; *p; p++) h = (h ^ *p) * 16777619u;
  return h & (NH_AMQP_BUCKETS - 1);
}

void nh_amqp_bucket_words(unsigned bucket, int nbits, char *out)
{
  for (int i = nbits - 1; i >= 0; i--) {
    *out++ = '.';
    *out++ = (char)('0' + ((bucket >> i) & 1));
  }
  *out = '\0';
}

void nh_amqp_routing_key(const char *type, const char *session, char *out, size_t len)
{
  char words[2 * NH_AMQP_BUCKET_BITS + 1];
  nh_amqp_bucket_words(nh_amqp_session_bucket(session), NH_AMQP_BUCKET_BITS, words);
  snprintf(out, len, "%s%s", type, words);
}

/* The event type of a routing key, without the session's bucket words ("Ev.0.1.1.0.0.1.0.1"). */
static char *type_of_key(const char *key)
{
  if (!key) return NULL;
  size_t n = strlen(key), tail = 2 * NH_AMQP_BUCKET_BITS;
  int bucketed = n > tail;
  for (size_t i = n - tail; bucketed && i < n; i += 2)
    bucketed = key[i] == '.' && (key[i + 1] == '0' || key[i + 1] == '1');
  return bucketed ? nh_xstrndup(key, n - tail) : nh_xstrdup(key);
}

void nh_amqp_msg_encode(pn_message_t *pm, const nh_msg_t *m, const char *to, int flags)
{
  pn_message_clear(pm);
  pn_message_set_durable(pm, true);
  if (m->message_id) pn_message_set_id(pm, atom_str(m->message_id));
  if (m->correlation_id) pn_message_set_correlation_id(pm, atom_str(m->correlation_id));
  if (m->session_id) pn_message_set_group_id(pm, m->session_id);
  if (m->event_type && (flags & NH_AMQP_ENC_BUCKETS) && !to && m->session_id) {
    char key[1024];   /* the exchange routes on it: a session's events of every type to one partition */
    nh_amqp_routing_key(m->event_type, m->session_id, key, sizeof key);
    pn_message_set_subject(pm, key);
  } else if (m->event_type) {
    pn_message_set_subject(pm, m->event_type);
  }
  if (m->reply_to) pn_message_set_reply_to(pm, m->reply_to);
  pn_message_set_content_type(pm, "application/json");
  pn_message_set_creation_time(pm, m->enqueued_at ? m->enqueued_at : nh_time_now_ms());
  pn_data_t *p = pn_message_properties(pm);
  pn_data_put_map(p);
  pn_data_enter(p);
  put_prop(p, "MessageType", nh_msg_type_name(m->type));
  put_prop(p, "EventTypeId", m->event_type);
  put_prop(p, "EventId", m->event_id);
  put_prop(p, "To", to ? to : m->event_type);
  put_prop(p, "From", m->from);
  put_prop(p, "OriginatingMessageId", m->originating_message_id ? m->originating_message_id : "self");
  put_prop(p, "ParentMessageId", m->parent_message_id ? m->parent_message_id : "self");
  put_prop(p, "ReplyTo", m->reply_to);
  put_prop(p, "ErrorText", m->error_text);
  put_prop(p, "ErrorType", m->error_type);
  put_prop(p, "traceparent", m->traceparent);
  put_prop(p, "tracestate", m->tracestate);
  if (flags & NH_AMQP_ENC_SERVICEBUS) put_prop(p, "Diagnostic-Id", m->traceparent);
  pn_data_put_string(p, pn_bytes(strlen("RetryCount"), "RetryCount"));
  pn_data_put_int(p, m->retry_count);
  pn_data_exit(p);
  pn_data_t *b = pn_message_body(pm);
  pn_message_set_inferred(pm, true);   /* a binary body goes out as a data section */
  pn_data_put_binary(b, pn_bytes(m->body_len, m->body ? m->body : ""));
}

/* ---------------------------------------------------------------- decode */

static char *atom_text(pn_atom_t a)
{
  char buf[64];
  switch (a.type) {
  case PN_STRING:
  case PN_SYMBOL:
  case PN_BINARY:
    return a.u.as_bytes.size ? nh_xstrndup(a.u.as_bytes.start, a.u.as_bytes.size) : NULL;
  case PN_ULONG:
    snprintf(buf, sizeof buf, "%" PRIu64, (uint64_t)a.u.as_ulong);
    return nh_xstrdup(buf);
  case PN_UUID: {
    const unsigned char *u = (const unsigned char *)a.u.as_uuid.bytes;
    snprintf(buf, sizeof buf, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
             u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
    return nh_xstrdup(buf);
  }
  default:
    return NULL;
  }
}

/* The value at the cursor as text (strings, symbols, numbers, booleans). */
static char *data_text(pn_data_t *d)
{
  char buf[64];
  switch (pn_data_type(d)) {
  case PN_STRING: {
    pn_bytes_t b = pn_data_get_string(d);
    return nh_xstrndup(b.start, b.size);
  }
  case PN_SYMBOL: {
    pn_bytes_t b = pn_data_get_symbol(d);
    return nh_xstrndup(b.start, b.size);
  }
  case PN_INT: snprintf(buf, sizeof buf, "%d", pn_data_get_int(d)); return nh_xstrdup(buf);
  case PN_UINT: snprintf(buf, sizeof buf, "%u", pn_data_get_uint(d)); return nh_xstrdup(buf);
  case PN_LONG: snprintf(buf, sizeof buf, "%" PRId64, (int64_t)pn_data_get_long(d)); return nh_xstrdup(buf);
  case PN_ULONG: snprintf(buf, sizeof buf, "%" PRIu64, (uint64_t)pn_data_get_ulong(d)); return nh_xstrdup(buf);
  case PN_SHORT: snprintf(buf, sizeof buf, "%d", pn_data_get_short(d)); return nh_xstrdup(buf);
  case PN_BOOL: return nh_xstrdup(pn_data_get_bool(d) ? "true" : "false");
  default: return NULL;
  }
}

static void malformed(nh_msg_t *m, const char *why)
{
  if (m->type == NH_MT_UNKNOWN && m->error_text) return;   /* keep the first reason */
  m->type = NH_MT_UNKNOWN;
  free(m->error_text);
  m->error_text = nh_xstrdup(why);
}

ssize_t nh_amqp_dlv_bytes(pn_delivery_t *d, char **buf, size_t *cap)
{
  pn_link_t *l = pn_delivery_link(d);
  size_t size = pn_delivery_pending(d);
  if (size > *cap) {
    *cap = size;
    *buf = nh_xrealloc(*buf, *cap);
  }
  ssize_t got = pn_link_recv(l, *buf, size);
  pn_link_advance(l);
  return got;
}

int nh_amqp_msg_read(pn_delivery_t *d, pn_message_t *pm, char **buf, size_t *cap)
{
  ssize_t got = nh_amqp_dlv_bytes(d, buf, cap);
  return got < 0 ? NH_EFAIL : nh_amqp_msg_decode_bytes(pm, *buf, (size_t)got);
}

/* The sections' descriptors (AMQP 1.0, 3.2): the properties, and the first body section. */
#define SECTION_PROPERTIES 0x73
#define SECTION_BODY_FIRST 0x75

static void peek_string(pn_data_t *d, char *out, size_t len)
{
  pn_type_t t = pn_data_type(d);
  pn_bytes_t b = t == PN_STRING ? pn_data_get_string(d) : t == PN_SYMBOL ? pn_data_get_symbol(d) : pn_bytes(0, NULL);
  snprintf(out, len, "%.*s", (int)b.size, b.start ? b.start : "");
}

int nh_amqp_msg_peek(const char *bytes, size_t len, char *message_id, size_t idlen, char *group_id, size_t glen)
{
  message_id[0] = group_id[0] = '\0';
  pn_data_t *d = pn_data(0);
  int rc = NH_EFAIL;
  for (size_t off = 0; off < len;) {
    pn_data_clear(d);
    ssize_t n = pn_data_decode(d, bytes + off, len - off);
    if (n <= 0) break;
    off += (size_t)n;
    pn_data_rewind(d);
    if (!pn_data_next(d) || pn_data_type(d) != PN_DESCRIBED) break;
    pn_data_enter(d);
    pn_data_next(d);
    uint64_t code = pn_data_type(d) == PN_ULONG ? pn_data_get_ulong(d) : 0;
    if (code >= SECTION_BODY_FIRST) {   /* the body: no properties section */
      rc = NH_OK;
      break;
    }
    if (code != SECTION_PROPERTIES) continue;
    pn_data_next(d);
    pn_data_enter(d);
    for (int field = 0; field <= 10 && pn_data_next(d); field++) {
      if (field == 0) peek_string(d, message_id, idlen);     /* message-id (ours are strings) */
      if (field == 10) peek_string(d, group_id, glen);       /* group-id: the SessionId */
    }
    rc = NH_OK;
    break;
  }
  pn_data_free(d);
  return rc;
}

int nh_amqp_msg_decode_bytes(pn_message_t *pm, const char *bytes, size_t len)
{
  pn_message_clear(pm);
  /* proton asserts (aborts the process) on an empty buffer: an empty transfer from a
   * peer is a malformed message, not a reason to die (found by host/fuzz/fuzz_amqp_msg) */
  if (!bytes || len == 0) return NH_EFAIL;
  return pn_message_decode(pm, bytes, len) == 0 ? NH_OK : NH_EFAIL;
}

/* A timestamp message annotation (ms), or 0. */
static int64_t annotation_time(pn_message_t *pm, const char *key)
{
  pn_data_t *a = pn_message_annotations(pm);
  int64_t t = 0;
  pn_data_rewind(a);
  if (!pn_data_next(a) || pn_data_type(a) != PN_MAP) return 0;
  pn_data_enter(a);
  while (pn_data_next(a)) {
    pn_type_t kt = pn_data_type(a);
    pn_bytes_t k = kt == PN_SYMBOL ? pn_data_get_symbol(a) : kt == PN_STRING ? pn_data_get_string(a) : pn_bytes(0, "");
    if (!pn_data_next(a)) break;
    if (k.size == strlen(key) && memcmp(k.start, key, k.size) == 0 && pn_data_type(a) == PN_TIMESTAMP)
      t = pn_data_get_timestamp(a);
  }
  pn_data_exit(a);
  return t;
}

void nh_amqp_msg_decode(pn_message_t *pm, const char *endpoint, nh_msg_t *m)
{
  memset(m, 0, sizeof *m);
  m->endpoint = nh_xstrdup(endpoint);
  m->message_id = atom_text(pn_message_get_id(pm));
  m->correlation_id = atom_text(pn_message_get_correlation_id(pm));
  m->session_id = nh_xstrdup(pn_message_get_group_id(pm));
  m->reply_to = nh_xstrdup(pn_message_get_reply_to(pm));
  int64_t created = pn_message_get_creation_time(pm);
  if (created <= 0) created = annotation_time(pm, "x-opt-enqueued-time");   /* Service Bus stamps this */
  m->enqueued_at = created > 0 ? created : nh_time_now_ms();
  char *mtype = NULL, *etype = NULL, *retry = NULL, *diag = NULL;
  pn_data_t *p = pn_message_properties(pm);
  pn_data_rewind(p);
  if (pn_data_next(p) && pn_data_type(p) == PN_MAP) {
    pn_data_enter(p);
    while (pn_data_next(p)) {
      char *key = data_text(p);
      if (!pn_data_next(p)) {
        free(key);
        break;
      }
      char **slot = NULL;
      if (!key) continue;
      if (strcmp(key, "MessageType") == 0) slot = &mtype;
      else if (strcmp(key, "EventTypeId") == 0) slot = &etype;
      else if (strcmp(key, "EventId") == 0) slot = &m->event_id;
      else if (strcmp(key, "From") == 0) slot = &m->from;
      else if (strcmp(key, "OriginatingMessageId") == 0) slot = &m->originating_message_id;
      else if (strcmp(key, "ParentMessageId") == 0) slot = &m->parent_message_id;
      else if (strcmp(key, "RetryCount") == 0) slot = &retry;
      else if (strcmp(key, "ErrorText") == 0) slot = &m->error_text;
      else if (strcmp(key, "ErrorType") == 0) slot = &m->error_type;
      else if (strcmp(key, "ReplyTo") == 0 && !m->reply_to) slot = &m->reply_to;
      else if (strcmp(key, "traceparent") == 0) slot = &m->traceparent;
      else if (strcmp(key, "tracestate") == 0) slot = &m->tracestate;
      else if (strcmp(key, "Diagnostic-Id") == 0) slot = &diag;
      free(key);
      if (slot) {
        free(*slot);
        *slot = data_text(p);
      }
    }
    pn_data_exit(p);
  }
  /* "self" is NimBus's way of saying "this message is the origin" */
  if (m->originating_message_id && strcmp(m->originating_message_id, "self") == 0) {
    free(m->originating_message_id);
    m->originating_message_id = NULL;
  }
  if (m->parent_message_id && strcmp(m->parent_message_id, "self") == 0) {
    free(m->parent_message_id);
    m->parent_message_id = NULL;
  }
  /* Service Bus senders of the Azure SDKs set only Diagnostic-Id; an older SDK's
   * "|id.span." form is not a traceparent and is left out */
  nh_trace_ctx_t tc;
  if (!m->traceparent && diag && nh_trace_parse(diag, &tc) == 0) m->traceparent = diag, diag = NULL;
  free(diag);
  m->retry_count = retry ? atoi(retry) : 0;
  free(retry);
  m->event_type = etype ? etype : type_of_key(pn_message_get_subject(pm));
  m->type = mtype ? nh_msg_type_parse(mtype) : NH_MT_EVENT;

  /* the body: a data section (or an amqp-value string/binary) holding JSON */
  pn_data_t *b = pn_message_body(pm);
  pn_data_rewind(b);
  if (pn_data_next(b)) {
    pn_type_t t = pn_data_type(b);
    if (t == PN_BINARY || t == PN_STRING) {
      pn_bytes_t v = t == PN_BINARY ? pn_data_get_binary(b) : pn_data_get_string(b);
      m->body = nh_xstrndup(v.start, v.size);
      m->body_len = v.size;
    } else if (t != PN_NULL) {
      malformed(m, "the body is not a data section or a string (expected UTF-8 JSON)");
    }
  }

  if (!m->message_id) {
    char id[37];
    nh_uuid_v7(id);
    m->message_id = nh_xstrdup(id);
    malformed(m, "the message has no message-id");
  }
  if (!mtype) malformed(m, "the message has no MessageType application property");
  else if (m->type == NH_MT_UNKNOWN) {
    char why[200];
    snprintf(why, sizeof why, "unknown MessageType %.100s", mtype);
    malformed(m, why);
  }
  free(mtype);
  if (!m->event_type || !*m->event_type) malformed(m, "the message has no EventTypeId (application property or subject)");
  if (!m->session_id || !*m->session_id) {
    free(m->session_id);
    m->session_id = nh_xstrdup(m->message_id);   /* so it can still be locked and dead-lettered */
    malformed(m, "the message has no group-id (SessionId)");
  }
  if (!m->event_id || !*m->event_id) {
    char eid[37];
    nh_amqp_event_id(endpoint, m->message_id, created, eid);
    free(m->event_id);
    m->event_id = nh_xstrdup(eid);
  }
}

/* EVP_sha1() is fetched from the provider again at every EVP_DigestInit_ex (OpenSSL 3):
 * a quarter of this function's cost. Fetched once; kept for the process. */
static pthread_once_t sha1_once = PTHREAD_ONCE_INIT;
static EVP_MD *sha1_md;
static void sha1_fetch(void) { sha1_md = EVP_MD_fetch(NULL, "SHA1", NULL); }

/* The name is "endpoint\nmessage-id" hashed with SHA-1 under nimbus-host's own namespace.
 * Without a creation time: RFC 9562 version 5. With one: version 8 with the creation
 * time in the first 48 bits (the layout of version 7) and the hash in the rest, so the
 * ids of a stream of messages grow with time: audit and history inserts then append
 * instead of dirtying a random B-tree page each (random keys cost about half the
 * throughput, see make bench). Both are the same for every copy of one message. */
void nh_amqp_event_id(const char *endpoint, const char *message_id, int64_t created_ms, char out[37])
{
  static const unsigned char ns[16] = { 0x6f, 0x1c, 0x2b, 0x0e, 0x8a, 0x2d, 0x4b, 0x7e,
                                        0x9c, 0x55, 0x2d, 0x1f, 0x0e, 0x7a, 0x9b, 0x31 };
  pthread_once(&sha1_once, sha1_fetch);
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, sha1_md ? sha1_md : EVP_sha1(), NULL);
  EVP_DigestUpdate(ctx, ns, sizeof ns);
  EVP_DigestUpdate(ctx, endpoint, strlen(endpoint));
  EVP_DigestUpdate(ctx, "\n", 1);
  EVP_DigestUpdate(ctx, message_id, strlen(message_id));
  EVP_DigestFinal_ex(ctx, md, &len);
  EVP_MD_CTX_free(ctx);
  if (created_ms > 0) {
    uint64_t t = (uint64_t)created_ms;
    for (int i = 0; i < 6; i++) md[i] = (unsigned char)(t >> (40 - 8 * i));
    md[6] = (unsigned char)((md[6] & 0x0f) | 0x80);
  } else {
    md[6] = (unsigned char)((md[6] & 0x0f) | 0x50);
  }
  md[8] = (unsigned char)((md[8] & 0x3f) | 0x80);
  nh_uuid_format(md, out);   /* snprintf with sixteen %02x cost half of the whole id */
}
