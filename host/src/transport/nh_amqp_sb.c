/* Azure Service Bus: claims-based security ($cbs put-token with a SAS token) and the
 * entity management node (<entity>/$management: com.microsoft:renew-lock), both
 * request/response exchanges over a sender/receiver link pair (docs/servicebus-amqp.md
 * sections 2 and 6). Requests are matched to replies by message-id / correlation-id. */
#include "nh_amqp_int.h"
#include "core/nh_log.h"
#include "core/nh_queue.h"
#include "core/nh_util.h"

#include <curl/curl.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <proton/codec.h>
#include <proton/delivery.h>
#include <proton/link.h>
#include <proton/session.h>
#include <proton/terminus.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct sb_req {
  char id[40];
  void (*done)(void *, int, const char *);
  void *data;
  char *bytes;        /* encoded, waiting for credit */
  size_t len;
  struct sb_node *node;
  nh_queue_t entry;              /* sb->reqs */
} sb_req_t;

typedef struct sb_node {   /* one request/response node: $cbs or <entity>/$management */
  char *address;
  char reply[64];
  pn_link_t *snd, *rcv;
  nh_queue_t entry;              /* sb->nodes */
} sb_node_t;

struct nh_sb {
  const nh_amqp_url_t *url;
  pn_session_t *ssn;
  nh_queue_t nodes;              /* this connection's; newest first */
  nh_queue_t reqs;               /* unanswered, newest first */
  pn_message_t *pm;
  uint64_t seq;
  char *buf;
  size_t cap;
};

/* ---------------------------------------------------------------- SAS tokens */

static char *urlenc(const char *s)
{
  char *e = curl_easy_escape(NULL, s, 0);
  char *out = nh_xstrdup(e);
  curl_free(e);
  return out;
}

int nh_sb_sas_token(const char *audience, const char *key_name, const char *key, int64_t expiry, char *out,
                    size_t outlen)
{
  char *sr = urlenc(audience);
  char to_sign[2048];
  snprintf(to_sign, sizeof to_sign, "%s\n%lld", sr, (long long)expiry);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int maclen = 0;
  HMAC(EVP_sha256(), key, (int)strlen(key), (const unsigned char *)to_sign, strlen(to_sign), mac, &maclen);
  unsigned char b64[128];
  EVP_EncodeBlock(b64, mac, (int)maclen);
  char *sig = urlenc((const char *)b64), *skn = urlenc(key_name);
  int n = snprintf(out, outlen, "SharedAccessSignature sr=%s&sig=%s&se=%lld&skn=%s", sr, sig, (long long)expiry, skn);
  free(sr);
  free(sig);
  free(skn);
  return n > 0 && (size_t)n < outlen ? NH_OK : NH_EFAIL;
}

/* ---------------------------------------------------------------- nodes and requests */

nh_sb_t *nh_sb_new(const nh_amqp_url_t *url)
{
  nh_sb_t *sb = nh_xcalloc(1, sizeof *sb);
  sb->url = url;
  nh_queue_init(&sb->nodes);
  nh_queue_init(&sb->reqs);
  sb->pm = pn_message();
  return sb;
}

/* Unanswered requests end with status -1 (no answer) so their owners can let go. */
static void reqs_drop(nh_sb_t *sb)
{
  while (!nh_queue_empty(&sb->reqs)) {
    sb_req_t *r = nh_queue_data(nh_queue_head(&sb->reqs), sb_req_t, entry);
    nh_queue_remove(&r->entry);
    r->done(r->data, -1, NULL);
    free(r->bytes);
    free(r);
  }
}

void nh_sb_down(nh_sb_t *sb)
{
  sb->ssn = NULL;
  reqs_drop(sb);   /* unanswered: the next connection starts over */
  while (!nh_queue_empty(&sb->nodes)) {
    sb_node_t *n = nh_queue_data(nh_queue_head(&sb->nodes), sb_node_t, entry);
    nh_queue_remove(&n->entry);
    free(n->address);
    free(n);
  }
}

void nh_sb_free(nh_sb_t *sb)
{
  if (!sb) return;
  nh_sb_down(sb);
  pn_message_free(sb->pm);
  free(sb->buf);
  free(sb);
}

void nh_sb_up(nh_sb_t *sb, pn_session_t *ssn)
{
  nh_sb_down(sb);
  sb->ssn = ssn;
}

static sb_node_t *node_for(nh_sb_t *sb, const char *address)
{
  nh_queue_t *q;
  nh_queue_foreach(q, &sb->nodes) {
    sb_node_t *n = nh_queue_data(q, sb_node_t, entry);
    if (strcmp(n->address, address) == 0) return n;
  }
  sb_node_t *n = nh_xcalloc(1, sizeof *n);
  n->address = nh_xstrdup(address);
  char id[37], name[600];
  nh_uuid_v4(id);
  snprintf(n->reply, sizeof n->reply, "nh-reply-%.8s", id);
  snprintf(name, sizeof name, "nh-req:%s", address);
  n->snd = pn_sender(sb->ssn, name);
  pn_terminus_set_address(pn_link_target(n->snd), address);
  pn_link_set_snd_settle_mode(n->snd, PN_SND_SETTLED);
  pn_link_open(n->snd);
  snprintf(name, sizeof name, "nh-rsp:%s", address);
  n->rcv = pn_receiver(sb->ssn, name);
  pn_terminus_set_address(pn_link_source(n->rcv), address);
  pn_terminus_set_address(pn_link_target(n->rcv), n->reply);
  pn_link_set_snd_settle_mode(n->rcv, PN_SND_SETTLED);
  pn_link_set_rcv_settle_mode(n->rcv, PN_RCV_FIRST);
  pn_link_open(n->rcv);
  pn_link_flow(n->rcv, 64);
  nh_queue_insert_head(&sb->nodes, &n->entry);
  return n;
}

static void flush_node(nh_sb_t *sb, sb_node_t *n)
{
  nh_queue_t *q;
  nh_queue_foreach(q, &sb->reqs) {
    if (pn_link_credit(n->snd) <= 0) break;
    sb_req_t *r = nh_queue_data(q, sb_req_t, entry);
    if (r->node != n || !r->bytes) continue;
    pn_delivery(n->snd, pn_dtag(r->id, strlen(r->id)));
    pn_link_send(n->snd, r->bytes, r->len);
    pn_link_advance(n->snd);
    free(r->bytes);
    r->bytes = NULL;
  }
}

/* Encodes sb->pm (its body and application properties set by the caller) as a request
 * to `address` and queues it until the node's sender has credit. */
static void request(nh_sb_t *sb, const char *address, void (*done)(void *, int, const char *), void *data)
{
  sb_node_t *n = node_for(sb, address);
  sb_req_t *r = nh_xcalloc(1, sizeof *r);
  snprintf(r->id, sizeof r->id, "nh-req-%llu", (unsigned long long)++sb->seq);
  r->done = done;
  r->data = data;
  r->node = n;
  pn_atom_t id = { .type = PN_STRING };
  id.u.as_bytes = pn_bytes(strlen(r->id), r->id);
  pn_message_set_id(sb->pm, id);
  pn_message_set_reply_to(sb->pm, n->reply);
  for (;;) {
    size_t size = sb->cap;
    int rc = pn_message_encode(sb->pm, sb->buf, &size);
    if (rc == PN_OVERFLOW) {
      sb->cap = sb->cap ? sb->cap * 2 : 2048;
      sb->buf = nh_xrealloc(sb->buf, sb->cap);
      continue;
    }
    r->bytes = nh_xmalloc(size);
    memcpy(r->bytes, sb->buf, size);
    r->len = size;
    break;
  }
  nh_queue_insert_head(&sb->reqs, &r->entry);
  flush_node(sb, n);
}

static void put_str(pn_data_t *d, const char *k, const char *v)
{
  pn_data_put_string(d, pn_bytes(strlen(k), k));
  pn_data_put_string(d, pn_bytes(strlen(v), v));
}

void nh_sb_put_token(nh_sb_t *sb, const char *entity, void (*done)(void *, int, const char *), void *data)
{
  char audience[1024], token[2048];
  snprintf(audience, sizeof audience, "sb://%s/%s", sb->url->host, entity);
  int64_t expiry = nh_time_now_ms() / 1000 + NH_SB_TOKEN_TTL_S;
  nh_sb_sas_token(audience, sb->url->user ? sb->url->user : "", sb->url->password ? sb->url->password : "", expiry,
                  token, sizeof token);
  pn_message_clear(sb->pm);
  pn_data_t *p = pn_message_properties(sb->pm);
  pn_data_put_map(p);
  pn_data_enter(p);
  put_str(p, "operation", "put-token");
  put_str(p, "type", "servicebus.windows.net:sastoken");
  put_str(p, "name", audience);
  pn_data_exit(p);
  pn_data_put_string(pn_message_body(sb->pm), pn_bytes(strlen(token), token));
  request(sb, "$cbs", done, data);
}

/* A lock token is the delivery tag in .NET Guid byte order; $management wants the uuid. */
static pn_uuid_t lock_uuid(pn_delivery_tag_t tag)
{
  pn_uuid_t u;
  memset(&u, 0, sizeof u);
  if (tag.size != 16) return u;
  const unsigned char *b = (const unsigned char *)tag.start;
  static const int order[16] = { 3, 2, 1, 0, 5, 4, 7, 6, 8, 9, 10, 11, 12, 13, 14, 15 };
  for (int i = 0; i < 16; i++) u.bytes[i] = (char)b[order[i]];
  return u;
}

/* A $management request in sb->pm: `op` on behalf of receiver `link` (the link that holds
 * the lock: Service Bus then renews on that link's session). Returns the body to fill. */
static pn_data_t *mgmt_request(nh_sb_t *sb, const char *op, const char *link)
{
  pn_message_clear(sb->pm);
  pn_data_t *p = pn_message_properties(sb->pm);
  pn_data_put_map(p);
  pn_data_enter(p);
  put_str(p, "operation", op);
  if (link) put_str(p, "associated-link-name", link);
  pn_data_exit(p);
  return pn_message_body(sb->pm);
}

void nh_sb_renew_lock(nh_sb_t *sb, const char *entity, pn_delivery_t *dlv, void (*done)(void *, int, const char *),
                      void *data)
{
  char address[1024];
  snprintf(address, sizeof address, "%s/$management", entity);
  pn_data_t *b = mgmt_request(sb, "com.microsoft:renew-lock", pn_link_name(pn_delivery_link(dlv)));
  pn_data_put_map(b);
  pn_data_enter(b);
  pn_data_put_string(b, pn_bytes(strlen("lock-tokens"), "lock-tokens"));
  pn_data_put_array(b, false, PN_UUID);
  pn_data_enter(b);
  pn_data_put_uuid(b, lock_uuid(pn_delivery_tag(dlv)));
  pn_data_exit(b);
  pn_data_exit(b);
  request(sb, address, done, data);
}

/* com.microsoft:renew-session-lock {"session-id"}: the answer's body holds the new
 * "expiration" (nh_sb_answer_expiration, inside done). */
void nh_sb_renew_session(nh_sb_t *sb, const char *entity, const char *session, const char *link,
                         void (*done)(void *, int, const char *), void *data)
{
  char address[1024];
  snprintf(address, sizeof address, "%s/$management", entity);
  pn_data_t *b = mgmt_request(sb, "com.microsoft:renew-session-lock", link);
  pn_data_put_map(b);
  pn_data_enter(b);
  put_str(b, "session-id", session);
  pn_data_exit(b);
  request(sb, address, done, data);
}

int64_t nh_sb_answer_expiration(nh_sb_t *sb)
{
  pn_data_t *b = pn_message_body(sb->pm);
  return nh_amqp_map_find(b, "expiration") && pn_data_type(b) == PN_TIMESTAMP ? pn_data_get_timestamp(b) : 0;
}

int nh_amqp_map_find(pn_data_t *d, const char *key)
{
  pn_data_rewind(d);
  if (!pn_data_next(d) || pn_data_type(d) != PN_MAP) return 0;
  pn_data_enter(d);
  while (pn_data_next(d)) {
    pn_type_t t = pn_data_type(d);
    pn_bytes_t k = t == PN_SYMBOL ? pn_data_get_symbol(d) : t == PN_STRING ? pn_data_get_string(d) : pn_bytes(0, "");
    int hit = k.size == strlen(key) && memcmp(k.start, key, k.size) == 0;
    if (!pn_data_next(d)) break;
    if (hit) return 1;
  }
  return 0;
}

/* ---------------------------------------------------------------- events */

static char *app_text(pn_message_t *m, const char *key, int *num)
{
  pn_data_t *p = pn_message_properties(m);
  if (!nh_amqp_map_find(p, key)) return NULL;
  switch (pn_data_type(p)) {
  case PN_INT: *num = pn_data_get_int(p); break;
  case PN_LONG: *num = (int)pn_data_get_long(p); break;
  case PN_UINT: *num = (int)pn_data_get_uint(p); break;
  case PN_STRING: return nh_xstrndup(pn_data_get_string(p).start, pn_data_get_string(p).size);
  default: break;
  }
  return NULL;
}

int nh_sb_event(nh_sb_t *sb, pn_event_t *e)
{
  pn_link_t *l = pn_event_link(e);
  if (!l) return 0;
  sb_node_t *n = NULL;
  nh_queue_t *q;
  nh_queue_foreach(q, &sb->nodes) {
    sb_node_t *m = nh_queue_data(q, sb_node_t, entry);
    if (m->snd == l || m->rcv == l) {
      n = m;
      break;
    }
  }
  if (!n) return 0;
  switch (pn_event_type(e)) {
  case PN_LINK_FLOW:
    if (l == n->snd) flush_node(sb, n);
    break;
  case PN_DELIVERY: {
    pn_delivery_t *d = pn_event_delivery(e);
    if (l != n->rcv || !pn_delivery_readable(d) || pn_delivery_partial(d)) break;
    int decoded = nh_amqp_msg_read(d, sb->pm, &sb->buf, &sb->cap);
    pn_delivery_update(d, PN_ACCEPTED);
    pn_delivery_settle(d);
    pn_link_flow(l, 1);
    if (decoded != NH_OK) break;
    pn_atom_t corr = pn_message_get_correlation_id(sb->pm);
    if (corr.type != PN_STRING) break;
    sb_req_t *r = NULL;
    nh_queue_foreach(q, &sb->reqs) {
      sb_req_t *c = nh_queue_data(q, sb_req_t, entry);
      if (strlen(c->id) == corr.u.as_bytes.size && memcmp(c->id, corr.u.as_bytes.start, corr.u.as_bytes.size) == 0) {
        r = c;
        break;
      }
    }
    if (!r) break;
    nh_queue_remove(&r->entry);
    int status = 0;
    char *desc = app_text(sb->pm, "status-description", &status);
    if (!desc) desc = app_text(sb->pm, "statusDescription", &status);
    status = 0;
    free(app_text(sb->pm, "status-code", &status));   /* $cbs spells it with a hyphen, */
    if (!status) free(app_text(sb->pm, "statusCode", &status));   /* $management in camel case */
    r->done(r->data, status, desc);
    free(desc);
    free(r->bytes);
    free(r);
    break;
  }
  default:
    break;
  }
  return 1;
}
