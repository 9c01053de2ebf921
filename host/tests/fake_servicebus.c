/* fake-servicebus: an in-memory stand-in for one Azure Service Bus topic, for tests of the
 * host's Service Bus profile (docs/servicebus-amqp.md) where no namespace is reachable.
 *
 *   fake-servicebus --port N --log FILE --key-name K --key SECRET --topic nimbus.events
 *                   --sub Endpoint=Type1,Type2 [--sub ...] [--missing Endpoint]
 *                   [--lock-duration S | --lock-duration-ms N] [--sessions Endpoint ...]
 *                   [--session-wait-ms N]
 *
 * --lock-duration (seconds, default 30) / --lock-duration-ms: message locks and session locks.
 * --sessions Endpoint (repeatable; Endpoint given with --sub): that subscription requires
 * sessions. --session-wait-ms (default 1000): how long a next-available session attach waits.
 * Listens on 127.0.0.1:N (0 = any free port; prints "listening PORT" once ready) and speaks
 * AMQP 1.0 as the server side of proton's connection driver, pumped with poll(2); SASL
 * ANONYMOUS only (the client authenticates over $cbs). Everything is in memory; every notable
 * event is one JSON line appended to FILE (see the README of each handler below):
 *
 *   start, stop, open, close, disconnect, transport-error, attach, detach, put-token, transfer,
 *   deliver, disposition, lock-expired, lock-released, renew-lock, management, error,
 *   session-accept, session-timeout, session-refused, session-lock-lost, renew-session-lock,
 *   session-release
 *
 * Behaviour, as Service Bus answers a raw AMQP client:
 * - $cbs: put-token requests (application-properties operation/type/name, body = the SAS
 *   token) are verified against --key-name/--key (HMAC-SHA256 over urlenc(audience)\nexpiry,
 *   skn, se in the future, sr = name) and answered on the reply link (correlation-id =
 *   message-id, status-code 200 or 401, status-description). Tokens belong to the connection.
 * - A link to an entity needs a valid token for sb://HOST/<entity> (HOST = the open frame's
 *   hostname, else 127.0.0.1), for the link's own address, or for the namespace sb://HOST/;
 *   otherwise it is detached with amqp:unauthorized-access. A missing entity is answered with
 *   an attach without source (receivers) or target (senders), then a detach amqp:not-found.
 * - The topic accepts unsettled transfers (accepted, settled) and copies each message to every
 *   subscription whose type list holds its subject or its EventTypeId application property.
 * - <topic>/Subscriptions/<Endpoint>: peek-lock deliveries in sequence order while the link has
 *   credit, unsettled, tag = a random 16-byte lock token (.NET Guid byte order), message
 *   annotations x-opt-locked-until, x-opt-sequence-number, x-opt-enqueued-time, header
 *   delivery-count = earlier deliveries. Client dispositions: accepted removes, rejected moves
 *   to <sub>/$DeadLetterQueue (DeadLetterReason / DeadLetterErrorDescription from the error
 *   info), released / modified make it available again (delivery-count + 1). Every client
 *   disposition is answered with a settled disposition of the same outcome (rcv-settle-mode
 *   second handshake); one for a lock that expired or is unknown is answered rejected
 *   com.microsoft:message-lock-lost. A lock that passes its locked-until is lost: the message
 *   is available again. A lock held by a link that detaches (or whose connection drops) is
 *   released at once (a simplification: Service Bus waits for the lock to expire).
 * - <sub>/$management: com.microsoft:renew-lock {lock-tokens: uuid[]} answered with statusCode
 *   200 {expirations: timestamp[]}, or 410 "The lock supplied is invalid" when a token is not a
 *   lock currently held. Other operations: statusCode 501.
 *
 * Sessions (message groups), on a --sessions subscription only (the others, and every
 * dead-letter queue, behave as above):
 * - A message's session is its properties.group-id. A topic transfer that a session-enabled
 *   subscription would get but that has no group-id (NULL or "") is rejected as a whole
 *   (amqp:invalid-field "The SessionId was not set on a message, ...") and copied nowhere; its
 *   transfer line carries outcome "rejected", condition and description, routed [].
 * - A receiver must carry com.microsoft:session-filter in its source's filter map (else
 *   amqp:not-allowed "... requires sessions to create a non-sessionful message receiver.");
 *   one on a subscription that is not session-enabled is refused too ("... does not require
 *   sessions to create a sessionful message receiver."). A value that is neither a string nor
 *   null: amqp:invalid-field. Refusals detach like the others (+ the tracking suffix).
 * - Filter = a session id: refused with com.microsoft:session-cannot-be-locked (log
 *   session-refused) when another link holds it, else granted (messages or not).
 *   Filter = null (next available): the session of the lowest-sequence available message
 *   among the sessions no link holds. None: the attach waits unanswered, first come first
 *   served, until a session frees up (a message for it arrives, a session lock is released or
 *   lost) or --session-wait-ms passes: then com.microsoft:timeout "... No session was
 *   available to accept." (log session-timeout). A waiting link the client detaches is dropped
 *   (answered attach + detach, no other line); its connection going away drops it silently.
 * - The grant (log session-accept): the attach answer echoes the client's source with
 *   com.microsoft:session-filter = the session id, and the link properties hold
 *   com.microsoft:locked-until-utc = the session lock's end in .NET ticks (unix ms * 10000 +
 *   621355968000000000); the session lock lasts the lock duration.
 * - A session receiver gets only its session's messages, in sequence order, one per credit,
 *   peek-locked as above but with x-opt-locked-until 253402300799999 (year 9999: the session
 *   lock covers them; no message-lock expiry there). Dispositions as above; one that finds no
 *   lock is answered com.microsoft:session-lock-lost instead of message-lock-lost.
 * - Session lock expiry (log session-lock-lost, then detach by fake): the link is detached with
 *   com.microsoft:session-lock-lost "The session lock has expired on the MessageSession. Accept
 *   a new MessageSession." (+ suffix); its unsettled messages are available again
 *   (delivery-count + 1, lock-released lines) and the session is free for others.
 * - A client detach of a session receiver, or its connection going away, releases the session
 *   at once (log session-release, why "link detached" / "session ended" / "connection gone" /
 *   "link gone"), its
 *   messages as for any link.
 * - <sub>/$management com.microsoft:renew-session-lock {session-id: string}: 200 {expiration:
 *   timestamp} (locked-until = now + lock duration) when a link of the same connection holds
 *   that session, else 410 com.microsoft:session-lock-lost (log renew-session-lock).
 *   com.microsoft:renew-lock on a session-enabled subscription: 400 amqp:not-allowed.
 * - deliver and disposition lines carry "session" (the group-id) when there is one.
 * - SIGTERM / SIGINT: exit 0. SIGUSR1: every connection is dropped at once (its socket closed,
 *   no AMQP close: a broker outage as a client sees it); the topic, subscriptions and messages
 *   stay, and what the connections held is released. SIGUSR2: every session lock held now
 *   expires at once (as if no renewal had come in time).
 *
 * Test tool only: one process, one thread, no TLS. */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <poll.h>
#include <proton/codec.h>
#include <proton/condition.h>
#include <proton/connection.h>
#include <proton/connection_driver.h>
#include <proton/delivery.h>
#include <proton/disposition.h>
#include <proton/event.h>
#include <proton/link.h>
#include <proton/message.h>
#include <proton/sasl.h>
#include <proton/session.h>
#include <proton/terminus.h>
#include <proton/transport.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------ small utilities */

static void *xmalloc(size_t n)
{
  void *p = malloc(n ? n : 1);
  if (!p) {
    fprintf(stderr, "fake-servicebus: out of memory\n");
    exit(3);
  }
  return p;
}

static void *xcalloc(size_t n, size_t m)
{
  void *p = calloc(n ? n : 1, m ? m : 1);
  if (!p) {
    fprintf(stderr, "fake-servicebus: out of memory\n");
    exit(3);
  }
  return p;
}

static char *xstrndup(const char *s, size_t n)
{
  char *p = xmalloc(n + 1);
  memcpy(p, s, n);
  p[n] = 0;
  return p;
}

static char *xstrdup(const char *s) { return s ? xstrndup(s, strlen(s)) : NULL; }

static int64_t now_ms(void)   /* wall clock, for timestamps, locks and SAS expiry */
{
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t mono_ms(void)  /* monotonic, for proton's ticks */
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* growable string */
typedef struct {
  char *p;
  size_t n, cap;
} sbuf_t;

static void sb_add(sbuf_t *b, const char *s, size_t n)
{
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + n + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
      fprintf(stderr, "fake-servicebus: out of memory\n");
      exit(3);
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
}

static void sb_puts(sbuf_t *b, const char *s) { sb_add(b, s, strlen(s)); }

static void sb_printf(sbuf_t *b, const char *fmt, ...)
{
  char tmp[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n < sizeof tmp) {
    sb_add(b, tmp, (size_t)n);
    return;
  }
  char *big = xmalloc((size_t)n + 1);
  va_start(ap, fmt);
  vsnprintf(big, (size_t)n + 1, fmt, ap);
  va_end(ap);
  sb_add(b, big, (size_t)n);
  free(big);
}

/* A JSON string. binary: bytes >= 0x80 are escaped one by one (as U+0080..U+00FF);
 * otherwise the text is assumed to be UTF-8 and copied. */
static void sb_json_str(sbuf_t *b, const char *s, size_t n, int binary)
{
  sb_add(b, "\"", 1);
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)s[i];
    switch (ch) {
    case '"': sb_add(b, "\\\"", 2); break;
    case '\\': sb_add(b, "\\\\", 2); break;
    case '\n': sb_add(b, "\\n", 2); break;
    case '\r': sb_add(b, "\\r", 2); break;
    case '\t': sb_add(b, "\\t", 2); break;
    default:
      if (ch < 0x20 || ch == 0x7f || (binary && ch >= 0x80)) sb_printf(b, "\\u%04x", ch);
      else sb_add(b, (const char *)&ch, 1);
    }
  }
  sb_add(b, "\"", 1);
}

static void sb_json_cstr(sbuf_t *b, const char *s)
{
  if (!s) sb_puts(b, "null");
  else sb_json_str(b, s, strlen(s), 0);
}

/* JSON object fields: "key": appended with a comma unless the object just opened */
static void jkey(sbuf_t *b, const char *key)
{
  if (b->n && b->p[b->n - 1] != '{' && b->p[b->n - 1] != '[') sb_add(b, ",", 1);
  sb_json_cstr(b, key);
  sb_add(b, ":", 1);
}

static void jstr(sbuf_t *b, const char *key, const char *val)
{
  jkey(b, key);
  sb_json_cstr(b, val);
}

static void jint(sbuf_t *b, const char *key, int64_t v)
{
  jkey(b, key);
  sb_printf(b, "%" PRId64, v);
}

static void jbool(sbuf_t *b, const char *key, int v)
{
  jkey(b, key);
  sb_puts(b, v ? "true" : "false");
}

static void uuid_text(const unsigned char *u, char out[37])
{
  snprintf(out, 37, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2], u[3],
           u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}

static void hex_text(const unsigned char *p, size_t n, char *out)
{
  for (size_t i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", p[i]);
  out[2 * n] = 0;
}

/* .NET Guid byte order <-> RFC 4122: bytes 0-3, 4-5 and 6-7 reversed (its own inverse). */
static void guid_swap(const unsigned char *in, unsigned char *out)
{
  out[0] = in[3];
  out[1] = in[2];
  out[2] = in[1];
  out[3] = in[0];
  out[4] = in[5];
  out[5] = in[4];
  out[6] = in[7];
  out[7] = in[6];
  memcpy(out + 8, in + 8, 8);
}

/* The pn_data value at the cursor as JSON. Map keys that are not text are rendered as
 * JSON and then quoted. Described values: {"descriptor":..,"value":..}. */
static void json_data(sbuf_t *b, pn_data_t *d);

static void json_data(sbuf_t *b, pn_data_t *d)
{
  switch (pn_data_type(d)) {
  case PN_NULL: sb_puts(b, "null"); break;
  case PN_BOOL: sb_puts(b, pn_data_get_bool(d) ? "true" : "false"); break;
  case PN_UBYTE: sb_printf(b, "%u", pn_data_get_ubyte(d)); break;
  case PN_BYTE: sb_printf(b, "%d", pn_data_get_byte(d)); break;
  case PN_USHORT: sb_printf(b, "%u", pn_data_get_ushort(d)); break;
  case PN_SHORT: sb_printf(b, "%d", pn_data_get_short(d)); break;
  case PN_UINT: sb_printf(b, "%u", pn_data_get_uint(d)); break;
  case PN_INT: sb_printf(b, "%d", pn_data_get_int(d)); break;
  case PN_CHAR: sb_printf(b, "%u", (unsigned)pn_data_get_char(d)); break;
  case PN_ULONG: sb_printf(b, "%" PRIu64, (uint64_t)pn_data_get_ulong(d)); break;
  case PN_LONG: sb_printf(b, "%" PRId64, (int64_t)pn_data_get_long(d)); break;
  case PN_TIMESTAMP: sb_printf(b, "%" PRId64, (int64_t)pn_data_get_timestamp(d)); break;
  case PN_FLOAT: sb_printf(b, "%.9g", (double)pn_data_get_float(d)); break;
  case PN_DOUBLE: sb_printf(b, "%.17g", pn_data_get_double(d)); break;
  case PN_UUID: {
    char u[37];
    uuid_text((const unsigned char *)pn_data_get_uuid(d).bytes, u);
    sb_json_cstr(b, u);
    break;
  }
  case PN_BINARY: {
    pn_bytes_t x = pn_data_get_binary(d);
    sb_json_str(b, x.start, x.size, 1);
    break;
  }
  case PN_STRING: {
    pn_bytes_t x = pn_data_get_string(d);
    sb_json_str(b, x.start, x.size, 0);
    break;
  }
  case PN_SYMBOL: {
    pn_bytes_t x = pn_data_get_symbol(d);
    sb_json_str(b, x.start, x.size, 0);
    break;
  }
  case PN_DESCRIBED:
    sb_puts(b, "{\"descriptor\":");
    pn_data_enter(d);
    if (pn_data_next(d)) json_data(b, d);
    else sb_puts(b, "null");
    sb_puts(b, ",\"value\":");
    if (pn_data_next(d)) json_data(b, d);
    else sb_puts(b, "null");
    pn_data_exit(d);
    sb_puts(b, "}");
    break;
  case PN_ARRAY:
  case PN_LIST: {
    int described = pn_data_type(d) == PN_ARRAY && pn_data_is_array_described(d);
    sb_puts(b, "[");
    pn_data_enter(d);
    if (described) pn_data_next(d);   /* the array's descriptor */
    int first = 1;
    while (pn_data_next(d)) {
      if (!first) sb_puts(b, ",");
      first = 0;
      json_data(b, d);
    }
    pn_data_exit(d);
    sb_puts(b, "]");
    break;
  }
  case PN_MAP: {
    sb_puts(b, "{");
    pn_data_enter(d);
    int first = 1;
    while (pn_data_next(d)) {
      if (!first) sb_puts(b, ",");
      first = 0;
      pn_type_t kt = pn_data_type(d);
      if (kt == PN_STRING || kt == PN_SYMBOL) {
        json_data(b, d);
      } else {
        sbuf_t k = {0};
        json_data(&k, d);
        sb_json_str(b, k.p ? k.p : "", k.n, 0);
        free(k.p);
      }
      sb_puts(b, ":");
      if (pn_data_next(d)) json_data(b, d);
      else sb_puts(b, "null");
    }
    pn_data_exit(d);
    sb_puts(b, "}");
    break;
  }
  default: sb_puts(b, "null"); break;
  }
}

/* A whole pn_data (its first value) as a JSON field; null when empty. */
static void jdata(sbuf_t *b, const char *key, pn_data_t *d)
{
  jkey(b, key);
  if (!d) {
    sb_puts(b, "null");
    return;
  }
  pn_data_rewind(d);
  if (pn_data_next(d)) json_data(b, d);
  else sb_puts(b, "null");
  pn_data_rewind(d);
}

/* A message id / correlation id as text (strings, ulongs, uuids, binaries). */
static char *atom_text(pn_atom_t a)
{
  char buf[64];
  switch (a.type) {
  case PN_STRING:
  case PN_SYMBOL:
  case PN_BINARY: return xstrndup(a.u.as_bytes.start, a.u.as_bytes.size);
  case PN_ULONG: snprintf(buf, sizeof buf, "%" PRIu64, (uint64_t)a.u.as_ulong); return xstrdup(buf);
  case PN_LONG: snprintf(buf, sizeof buf, "%" PRId64, (int64_t)a.u.as_long); return xstrdup(buf);
  case PN_UUID: uuid_text((const unsigned char *)a.u.as_uuid.bytes, buf); return xstrdup(buf);
  default: return NULL;
  }
}

/* The value of key `key` (string or symbol) in the map p holds, as text, or NULL: the
 * application properties, or an amqp-value map body ($management requests). */
static char *map_text(pn_data_t *p, const char *key)
{
  char *out = NULL;
  pn_data_rewind(p);
  if (pn_data_next(p) && pn_data_type(p) == PN_MAP) {
    pn_data_enter(p);
    while (pn_data_next(p)) {
      pn_type_t kt = pn_data_type(p);
      pn_bytes_t k = kt == PN_STRING ? pn_data_get_string(p) : kt == PN_SYMBOL ? pn_data_get_symbol(p) : pn_bytes(0, NULL);
      if (!pn_data_next(p)) break;
      if (k.size == strlen(key) && memcmp(k.start, key, k.size) == 0) {
        char buf[64];
        switch (pn_data_type(p)) {
        case PN_STRING: {
          pn_bytes_t v = pn_data_get_string(p);
          out = xstrndup(v.start, v.size);
          break;
        }
        case PN_SYMBOL: {
          pn_bytes_t v = pn_data_get_symbol(p);
          out = xstrndup(v.start, v.size);
          break;
        }
        case PN_INT: snprintf(buf, sizeof buf, "%d", pn_data_get_int(p)); out = xstrdup(buf); break;
        case PN_LONG: snprintf(buf, sizeof buf, "%" PRId64, (int64_t)pn_data_get_long(p)); out = xstrdup(buf); break;
        case PN_UINT: snprintf(buf, sizeof buf, "%u", pn_data_get_uint(p)); out = xstrdup(buf); break;
        default: break;
        }
        break;
      }
    }
    pn_data_exit(p);
  }
  pn_data_rewind(p);
  return out;
}

static char *app_prop(pn_message_t *m, const char *key) { return map_text(pn_message_properties(m), key); }

/* percent-decoding (+ is not a space in SAS tokens' sr: sr is a URI) */
static char *url_decode(const char *s, size_t n)
{
  char *out = xmalloc(n + 1);
  size_t j = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] == '%' && i + 2 < n && isxdigit((unsigned char)s[i + 1]) && isxdigit((unsigned char)s[i + 2])) {
      char h[3] = {s[i + 1], s[i + 2], 0};
      out[j++] = (char)strtol(h, NULL, 16);
      i += 2;
    } else {
      out[j++] = s[i];
    }
  }
  out[j] = 0;
  return out;
}

/* ------------------------------------------------------------------ configuration */

typedef struct qmsg qmsg_t;
typedef struct queue queue_t;
typedef struct linfo linfo_t;
typedef struct conn conn_t;

struct qmsg {
  qmsg_t *next;
  int64_t seq;
  char *bytes;              /* the message as it was sent to the topic (re-annotated per delivery) */
  size_t len;
  uint32_t delivery_count;  /* deliveries so far */
  int64_t enqueued;
  char *message_id;
  int locked;
  unsigned char lock[16];   /* the delivery tag of the current delivery (.NET Guid order) */
  int64_t locked_until;
  pn_delivery_t *dlv;       /* the current delivery while locked */
  linfo_t *holder;          /* the link it went out on while locked */
  char *session;            /* properties.group-id (the Service Bus SessionId), or NULL */
};

struct queue {
  queue_t *next;
  char *name;               /* Endpoint (subscription name) */
  char *address;            /* <topic>/Subscriptions/<name>, or that + /$DeadLetterQueue */
  char **types;
  int ntypes;
  int is_dlq;
  int sessions;             /* --sessions: requires sessions (its dead-letter queue does not) */
  queue_t *dlq;
  qmsg_t *head, *tail;
  int64_t next_seq;
};

/* L_SESSION_WAIT: a session receiver asking for the next available session, not answered yet */
enum { L_CBS_IN = 1, L_CBS_OUT, L_TOPIC_IN, L_QUEUE_OUT, L_MGMT_IN, L_MGMT_OUT, L_REFUSED, L_SESSION_WAIT };

typedef struct outmsg {
  struct outmsg *next;
  char *bytes;
  size_t len;
} outmsg_t;

struct linfo {
  linfo_t *next;            /* every link of every connection */
  conn_t *conn;
  pn_link_t *link;
  int kind;
  char *address;            /* the entity address (source of a client receiver, target of a client sender) */
  char *reply_addr;         /* CBS_OUT / MGMT_OUT: the target address the client named */
  queue_t *q;               /* QUEUE_OUT, MGMT_*: the subscription (or dead-letter queue) */
  outmsg_t *out_head, *out_tail;
  uint64_t out_seq;
  int closed;
  char *name;               /* the link name (logged after proton's link is gone) */
  /* session receivers (QUEUE_OUT on a session-enabled subscription, or SESSION_WAIT) */
  char *granted;            /* the session last granted (kept after its lock is gone, for logs) */
  char *session;            /* the session whose lock this link holds; NULL once released */
  int64_t session_until;    /* that lock's locked-until (wall clock ms) */
  int64_t wait_until;       /* SESSION_WAIT: refused with com.microsoft:timeout at this time */
  uint64_t wait_seq;        /* SESSION_WAIT: arrival order (first come, first served) */
};

struct conn {
  conn_t *next;
  int id;
  int fd;
  pn_connection_driver_t drv;
  char *hostname;           /* from the open frame; 127.0.0.1 when absent */
  char **tokens;            /* audiences with a valid token on this connection */
  int ntokens;
  int want_write;
  int dead;
};

static struct {
  int port;
  const char *log_path;
  const char *key_name;
  const char *key;
  const char *topic;
  int64_t lock_ms;           /* message and session locks */
  int64_t session_wait_ms;   /* how long a next-available session attach waits */
  char **missing;
  int nmissing;
} cfg = {.lock_ms = 30000, .session_wait_ms = 1000};

static FILE *g_log;
static queue_t *g_queues;
static linfo_t *g_links;
static conn_t *g_conns;
static int g_next_conn = 1;
static uint64_t g_wait_seq;
static volatile sig_atomic_t g_stop;
static volatile sig_atomic_t g_drop;   /* SIGUSR1: drop every connection (an outage; the state stays) */
static volatile sig_atomic_t g_expire; /* SIGUSR2: every session lock expires now */
static int g_sigpipe[2] = {-1, -1};

static void log_line(sbuf_t *b)
{
  sb_puts(b, "}");
  fprintf(g_log, "%s\n", b->p);
  fflush(g_log);
  free(b->p);
  b->p = NULL;
  b->n = b->cap = 0;
}

static void log_begin(sbuf_t *b, const char *ev, conn_t *c)
{
  memset(b, 0, sizeof *b);
  sb_puts(b, "{");
  jstr(b, "ev", ev);
  if (c) jint(b, "conn", c->id);
  jint(b, "ts", now_ms());
}

static void log_error(conn_t *c, const char *fmt, ...)
{
  char tmp[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  sbuf_t b;
  log_begin(&b, "error", c);
  jstr(&b, "what", tmp);
  log_line(&b);
}

static queue_t *queue_find(const char *address)
{
  for (queue_t *q = g_queues; q; q = q->next)
    if (strcasecmp(q->address, address) == 0) return q;
  return NULL;
}

static queue_t *queue_new(const char *name, const char *address, int is_dlq)
{
  queue_t *q = xcalloc(1, sizeof *q);
  q->name = xstrdup(name);
  q->address = xstrdup(address);
  q->is_dlq = is_dlq;
  q->next_seq = 1;
  q->next = g_queues;
  g_queues = q;
  return q;
}

/* --sub Endpoint=T1,T2 */
static void add_subscription(const char *spec)
{
  const char *eq = strchr(spec, '=');
  if (!eq || eq == spec) {
    fprintf(stderr, "fake-servicebus: --sub wants Endpoint=Type1,Type2, not %s\n", spec);
    exit(2);
  }
  char *name = xstrndup(spec, (size_t)(eq - spec));
  sbuf_t a = {0};
  sb_printf(&a, "%s/Subscriptions/%s", cfg.topic, name);
  if (queue_find(a.p)) {
    fprintf(stderr, "fake-servicebus: subscription %s given twice\n", name);
    exit(2);
  }
  queue_t *q = queue_new(name, a.p, 0);
  char *types = xstrdup(eq + 1);
  for (char *save = NULL, *t = strtok_r(types, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    q->types = realloc(q->types, sizeof(char *) * (size_t)(q->ntypes + 1));
    q->types[q->ntypes++] = xstrdup(t);
  }
  free(types);
  sbuf_t d = {0};
  sb_printf(&d, "%s/$DeadLetterQueue", a.p);
  q->dlq = queue_new(name, d.p, 1);
  free(a.p);
  free(d.p);
  free(name);
}

/* ------------------------------------------------------------------ links: bookkeeping */

static void out_free_all(linfo_t *li)
{
  while (li->out_head) {
    outmsg_t *o = li->out_head;
    li->out_head = o->next;
    free(o->bytes);
    free(o);
  }
  li->out_tail = NULL;
}

static void pump_queue(queue_t *q);
static void serve_waiters(queue_t *q);
static void refuse(conn_t *c, linfo_t *li, const char *condition, const char *fmt, ...);
static void tracking_suffix(char *out, size_t n);
static void copy_value(pn_data_t *dst, pn_data_t *src);

/* x-opt-locked-until of a session's messages: 9999-12-31T23:59:59.999Z */
#define FAR_LOCKED_UNTIL INT64_C(253402300799999)
/* .NET DateTime ticks (100 ns since 0001-01-01) at the Unix epoch */
#define NET_EPOCH_TICKS INT64_C(621355968000000000)
#define SESSION_FILTER "com.microsoft:session-filter"
#define SESSION_LOCK_LOST_DESC "The session lock has expired on the MessageSession. Accept a new MessageSession."

/* Gives back every lock held through li (the link went away). */
static void release_holder(linfo_t *li, const char *why)
{
  int any = 0;
  for (queue_t *q = g_queues; q; q = q->next) {
    for (qmsg_t *m = q->head; m; m = m->next) {
      if (m->locked && m->holder == li) {
        m->locked = 0;
        m->holder = NULL;
        m->dlv = NULL;
        m->delivery_count++;
        any = 1;
        sbuf_t b;
        log_begin(&b, "lock-released", li->conn);
        jstr(&b, "address", q->address);
        jstr(&b, "message_id", m->message_id);
        jstr(&b, "why", why);
        log_line(&b);
      }
    }
  }
  (void)any;
}

/* The entries of the map src holds into the map dst is in (entered), but those whose key
 * `skip` says to leave out (called with src on the key). */
static void copy_map_except(pn_data_t *dst, pn_data_t *src, int (*skip)(pn_data_t *))
{
  pn_data_rewind(src);
  if (pn_data_next(src) && pn_data_type(src) == PN_MAP) {
    pn_data_enter(src);
    while (pn_data_next(src)) {
      int leave = skip(src);
      if (!leave) copy_value(dst, src);
      if (!pn_data_next(src)) break;
      if (!leave) copy_value(dst, src);
    }
    pn_data_exit(src);
  }
  pn_data_rewind(src);
}

static int is_dead_letter_key(pn_data_t *d)
{
  pn_bytes_t k = pn_data_type(d) == PN_STRING ? pn_data_get_string(d) : pn_bytes(0, NULL);
  return (k.size == strlen("DeadLetterReason") && memcmp(k.start, "DeadLetterReason", k.size) == 0) ||
         (k.size == strlen("DeadLetterErrorDescription") && memcmp(k.start, "DeadLetterErrorDescription", k.size) == 0);
}

/* Gives back the session lock li holds (if any); the caller pumps the queue, which hands the
 * session to a waiting receiver. */
static void release_session(linfo_t *li, const char *why)
{
  if (!li->session) return;
  sbuf_t b;
  log_begin(&b, "session-release", li->conn);
  jstr(&b, "address", li->address);
  jstr(&b, "link", li->name);
  jstr(&b, "session", li->session);
  jstr(&b, "why", why);
  log_line(&b);
  free(li->session);
  li->session = NULL;
}

/* Frees li itself (already unlinked from g_links, its locks given back or moot). */
static void linfo_destroy(linfo_t *li)
{
  if (li->link) pn_link_set_context(li->link, NULL);
  out_free_all(li);
  free(li->address);
  free(li->reply_addr);
  free(li->name);
  free(li->session);
  free(li->granted);
  free(li);
}

static void linfo_free(linfo_t *li)
{
  release_holder(li, "link gone");
  release_session(li, "link gone");
  for (linfo_t **pp = &g_links; *pp; pp = &(*pp)->next) {
    if (*pp == li) {
      *pp = li->next;
      break;
    }
  }
  linfo_destroy(li);
}

/* ------------------------------------------------------------------ sending */

static char *encode_message(pn_message_t *m, size_t *len)
{
  pn_rwbytes_t buf = {0, NULL};
  ssize_t n = pn_message_encode2(m, &buf);
  if (n < 0) {
    free(buf.start);
    *len = 0;
    return NULL;
  }
  *len = (size_t)n;
  return buf.start;
}

/* Sends what is queued on a reply link while it has credit. */
static void pump_out(linfo_t *li)
{
  if (li->closed || !li->link) return;
  pn_link_t *l = li->link;
  while (li->out_head && pn_link_credit(l) > 0) {
    outmsg_t *o = li->out_head;
    li->out_head = o->next;
    if (!li->out_head) li->out_tail = NULL;
    uint64_t tag = ++li->out_seq;
    pn_delivery_t *d = pn_delivery(l, pn_dtag((const char *)&tag, sizeof tag));
    pn_link_send(l, o->bytes, o->len);
    pn_link_advance(l);
    if (pn_link_snd_settle_mode(l) != PN_SND_UNSETTLED) pn_delivery_settle(d);
    free(o->bytes);
    free(o);
  }
}

/* The reply link of connection c whose target address is `addr`. */
static linfo_t *reply_link(conn_t *c, int kind, const char *addr)
{
  if (!addr) return NULL;
  for (linfo_t *li = g_links; li; li = li->next)
    if (li->conn == c && li->kind == kind && !li->closed && li->reply_addr && strcmp(li->reply_addr, addr) == 0)
      return li;
  return NULL;
}

static void queue_reply(conn_t *c, int kind, const char *reply_to, pn_message_t *m)
{
  linfo_t *li = reply_link(c, kind, reply_to);
  if (!li) {
    log_error(c, "no %s reply link with target address %s: the response is dropped",
              kind == L_CBS_OUT ? "$cbs" : "$management", reply_to ? reply_to : "(no reply-to)");
    return;
  }
  outmsg_t *o = xcalloc(1, sizeof *o);
  o->bytes = encode_message(m, &o->len);
  if (!o->bytes) {
    free(o);
    log_error(c, "cannot encode a reply");
    return;
  }
  if (li->out_tail) li->out_tail->next = o;
  else li->out_head = o;
  li->out_tail = o;
  pump_out(li);
}

static void put_str_kv(pn_data_t *d, const char *k, const char *v)
{
  pn_data_put_string(d, pn_bytes(strlen(k), k));
  pn_data_put_string(d, pn_bytes(strlen(v), v));
}

/* The message annotations of one delivery. */
static void annotate(pn_message_t *pm, qmsg_t *m, queue_t *q)
{
  pn_data_t *a = pn_message_annotations(pm);
  pn_data_clear(a);
  pn_data_put_map(a);
  pn_data_enter(a);
  pn_data_put_symbol(a, pn_bytes(strlen("x-opt-locked-until"), "x-opt-locked-until"));
  pn_data_put_timestamp(a, m->locked_until);
  pn_data_put_symbol(a, pn_bytes(strlen("x-opt-sequence-number"), "x-opt-sequence-number"));
  pn_data_put_long(a, m->seq);
  pn_data_put_symbol(a, pn_bytes(strlen("x-opt-enqueued-time"), "x-opt-enqueued-time"));
  pn_data_put_timestamp(a, m->enqueued);
  if (q->is_dlq) {
    pn_data_put_symbol(a, pn_bytes(strlen("x-opt-deadletter-source"), "x-opt-deadletter-source"));
    pn_data_put_string(a, pn_bytes(strlen(q->name), q->name));
  }
  pn_data_exit(a);
}

/* Delivers available messages of q on its receivers' credit. A session receiver gets only
 * its session's messages; a session-enabled subscription first hands free sessions to the
 * receivers waiting for one. */
static void pump_queue(queue_t *q)
{
  if (q->sessions) serve_waiters(q);
  for (linfo_t *li = g_links; li; li = li->next) {
    if (li->kind != L_QUEUE_OUT || li->q != q || li->closed || !li->link) continue;
    if (q->sessions && !li->session) continue;
    pn_link_t *l = li->link;
    for (qmsg_t *m = q->head; m && pn_link_credit(l) > 0; m = m->next) {
      if (m->locked) continue;
      if (li->session && (!m->session || strcmp(m->session, li->session) != 0)) continue;
      pn_message_t *pm = pn_message();
      if (pn_message_decode(pm, m->bytes, m->len) != 0) {
        log_error(li->conn, "cannot decode stored message %s", m->message_id ? m->message_id : "?");
        pn_message_free(pm);
        continue;
      }
      RAND_bytes(m->lock, sizeof m->lock);
      /* the session lock covers a session's messages: Service Bus stamps them "never" */
      m->locked_until = li->session ? FAR_LOCKED_UNTIL : now_ms() + cfg.lock_ms;
      pn_message_set_delivery_count(pm, m->delivery_count);
      annotate(pm, m, q);
      size_t len;
      char *bytes = encode_message(pm, &len);
      pn_message_free(pm);
      if (!bytes) continue;
      pn_delivery_t *d = pn_delivery(l, pn_dtag((const char *)m->lock, sizeof m->lock));
      pn_link_send(l, bytes, len);
      pn_link_advance(l);
      free(bytes);
      m->locked = 1;
      m->dlv = d;
      m->holder = li;
      unsigned char u[16];
      char uuid[37], tag[33];
      guid_swap(m->lock, u);
      uuid_text(u, uuid);
      hex_text(m->lock, 16, tag);
      sbuf_t b;
      log_begin(&b, "deliver", li->conn);
      jstr(&b, "address", q->address);
      jstr(&b, "link", pn_link_name(l));
      jstr(&b, "message_id", m->message_id);
      if (m->session) jstr(&b, "session", m->session);
      jint(&b, "sequence_number", m->seq);
      jint(&b, "delivery_count", m->delivery_count);
      jstr(&b, "delivery_tag", tag);
      jstr(&b, "lock_token", uuid);
      jint(&b, "locked_until", m->locked_until);
      log_line(&b);
    }
    if (pn_link_get_drain(l)) pn_link_drained(l);
  }
}

/* ------------------------------------------------------------------ sessions */

/* The live link holding the lock of session `id` of q, or NULL. */
static linfo_t *session_holder(queue_t *q, const char *id)
{
  for (linfo_t *li = g_links; li; li = li->next)
    if (li->kind == L_QUEUE_OUT && li->q == q && !li->closed && li->session && strcmp(li->session, id) == 0)
      return li;
  return NULL;
}

/* "Next available session": the session of q's lowest-sequence available message among the
 * sessions no link holds (q's list is in sequence order), or NULL. */
static const char *next_available_session(queue_t *q)
{
  for (qmsg_t *m = q->head; m; m = m->next)
    if (!m->locked && m->session && *m->session && !session_holder(q, m->session)) return m->session;
  return NULL;
}

static int is_session_filter_key(pn_data_t *d)
{
  pn_type_t t = pn_data_type(d);
  pn_bytes_t k = t == PN_SYMBOL ? pn_data_get_symbol(d) : t == PN_STRING ? pn_data_get_string(d) : pn_bytes(0, NULL);
  return k.size == strlen(SESSION_FILTER) && memcmp(k.start, SESSION_FILTER, k.size) == 0;
}

/* Looks for com.microsoft:session-filter in a source's filter map. Returns 0 when absent;
 * else 1 with *id = the session asked for (NULL = next available), or 2 when its value is
 * neither null nor a string. A described value counts as its value. */
static int session_filter(pn_data_t *f, char **id)
{
  int found = 0;
  *id = NULL;
  pn_data_rewind(f);
  if (pn_data_next(f) && pn_data_type(f) == PN_MAP) {
    pn_data_enter(f);
    while (pn_data_next(f)) {
      int ours = is_session_filter_key(f);
      if (!pn_data_next(f)) break;
      if (!ours) continue;
      int described = pn_data_type(f) == PN_DESCRIBED;
      pn_type_t vt = PN_NULL;
      if (described) {
        pn_data_enter(f);
        pn_data_next(f);   /* the descriptor */
        if (pn_data_next(f)) vt = pn_data_type(f);
      } else {
        vt = pn_data_type(f);
      }
      if (vt == PN_NULL) {
        found = 1;
      } else if (vt == PN_STRING || vt == PN_SYMBOL) {
        pn_bytes_t v = vt == PN_STRING ? pn_data_get_string(f) : pn_data_get_symbol(f);
        *id = xstrndup(v.start, v.size);
        found = 1;
      } else {
        found = 2;
      }
      if (described) pn_data_exit(f);
      break;
    }
    pn_data_exit(f);
  }
  pn_data_rewind(f);
  return found;
}

/* Gives session `id` of li's subscription to li and answers its attach: the client's source
 * with the filter naming the session granted, and the link property
 * com.microsoft:locked-until-utc (.NET ticks). requested: what the client asked for. */
static void grant_session(linfo_t *li, const char *id, const char *requested)
{
  pn_link_t *l = li->link;
  li->kind = L_QUEUE_OUT;
  free(li->granted);
  li->granted = xstrdup(id);
  free(li->session);
  li->session = xstrdup(id);
  li->session_until = now_ms() + cfg.lock_ms;
  pn_data_t *rf = pn_terminus_filter(pn_link_remote_source(l));
  pn_data_t *f = pn_terminus_filter(pn_link_source(l));
  pn_data_clear(f);
  pn_data_put_map(f);
  pn_data_enter(f);
  copy_map_except(f, rf, is_session_filter_key);
  pn_data_put_symbol(f, pn_bytes(strlen(SESSION_FILTER), SESSION_FILTER));
  pn_data_put_string(f, pn_bytes(strlen(id), id));
  pn_data_exit(f);
  pn_data_t *p = pn_link_properties(l);
  pn_data_clear(p);
  pn_data_put_map(p);
  pn_data_enter(p);
  pn_data_put_symbol(p, pn_bytes(strlen("com.microsoft:locked-until-utc"), "com.microsoft:locked-until-utc"));
  pn_data_put_long(p, li->session_until * 10000 + NET_EPOCH_TICKS);
  pn_data_exit(p);
  pn_link_open(l);
  sbuf_t b;
  log_begin(&b, "session-accept", li->conn);
  jstr(&b, "address", li->address);
  jstr(&b, "link", li->name);
  jstr(&b, "requested", requested);
  jstr(&b, "session", id);
  jint(&b, "locked_until", li->session_until);
  log_line(&b);
}

/* A waiting attach whose link, session or connection is going away is not served. */
static int waiter_alive(linfo_t *li)
{
  pn_link_t *l = li->link;
  if (!l || li->closed || (pn_link_state(l) & PN_REMOTE_CLOSED)) return 0;
  pn_session_t *s = pn_link_session(l);
  if (pn_session_state(s) & PN_REMOTE_CLOSED) return 0;
  if (pn_connection_state(pn_session_connection(s)) & PN_REMOTE_CLOSED) return 0;
  return !pn_transport_closed(li->conn->drv.transport);
}

/* Hands q's available sessions to its waiting attaches, first come first served. */
static void serve_waiters(queue_t *q)
{
  for (;;) {
    linfo_t *first = NULL;
    for (linfo_t *li = g_links; li; li = li->next)
      if (li->kind == L_SESSION_WAIT && li->q == q && waiter_alive(li) && (!first || li->wait_seq < first->wait_seq))
        first = li;
    if (!first) return;
    const char *id = next_available_session(q);
    if (!id) return;
    grant_session(first, id, NULL);
  }
}

/* The session lock passed its locked-until: the link is detached with session-lock-lost, its
 * unsettled deliveries become available again and the session is free for others. */
static void session_lock_lost(linfo_t *li)
{
  char tail[256];
  tracking_suffix(tail, sizeof tail);
  char desc[512];
  snprintf(desc, sizeof desc, "%s%s", SESSION_LOCK_LOST_DESC, tail);
  sbuf_t b;
  log_begin(&b, "session-lock-lost", li->conn);
  jstr(&b, "address", li->address);
  jstr(&b, "link", li->name);
  jstr(&b, "session", li->session);
  log_line(&b);
  pn_link_t *l = li->link;
  pn_condition_t *cond = pn_link_condition(l);
  pn_condition_set_name(cond, "com.microsoft:session-lock-lost");
  pn_condition_set_description(cond, desc);
  pn_link_close(l);
  li->closed = 1;
  log_begin(&b, "detach", li->conn);
  jstr(&b, "by", "fake");
  jstr(&b, "address", li->address);
  jstr(&b, "link", li->name);
  jstr(&b, "role", "receiver");
  jstr(&b, "condition", "com.microsoft:session-lock-lost");
  jstr(&b, "description", desc);
  log_line(&b);
  release_holder(li, "session lock lost");
  free(li->session);   /* logged as session-lock-lost above, not as a session-release */
  li->session = NULL;
  pump_queue(li->q);
}

static void session_wait_timeout(linfo_t *li)
{
  sbuf_t b;
  log_begin(&b, "session-timeout", li->conn);
  jstr(&b, "address", li->address);
  jstr(&b, "link", li->name);
  log_line(&b);
  char tail[256];
  tracking_suffix(tail, sizeof tail);
  refuse(li->conn, li, "com.microsoft:timeout",
         "The operation did not complete within the allotted timeout. No session was available to accept.%s", tail);
}

/* Session locks past their locked-until, waiting attaches past their deadline. Returns the
 * next such time (or 0). */
static int64_t expire_sessions(void)
{
  int64_t now = now_ms(), next = 0;
  for (linfo_t *li = g_links; li; li = li->next) {
    int64_t t;
    if (li->kind == L_QUEUE_OUT && li->session && !li->closed && li->link) {
      t = li->session_until;
      if (t <= now) {
        session_lock_lost(li);
        continue;
      }
    } else if (li->kind == L_SESSION_WAIT && li->link) {
      t = li->wait_until;
      if (t <= now) {
        session_wait_timeout(li);
        continue;
      }
    } else {
      continue;
    }
    if (!next || t < next) next = t;
  }
  return next;
}

/* Message-lock expiry: locks past their locked-until are lost (not on a session-enabled
 * subscription: there the session lock covers them); then session locks and waiting session
 * attaches. Returns the next expiry (or 0). */
static int64_t expire_locks(void)
{
  int64_t now = now_ms(), next = 0;
  for (queue_t *q = g_queues; q; q = q->next) {
    int any = 0;
    if (q->sessions) continue;
    for (qmsg_t *m = q->head; m; m = m->next) {
      if (!m->locked) continue;
      if (m->locked_until <= now) {
        sbuf_t b;
        char uuid[37];
        unsigned char u[16];
        guid_swap(m->lock, u);
        uuid_text(u, uuid);
        log_begin(&b, "lock-expired", m->holder ? m->holder->conn : NULL);
        jstr(&b, "address", q->address);
        jstr(&b, "message_id", m->message_id);
        jstr(&b, "lock_token", uuid);
        log_line(&b);
        m->locked = 0;
        m->dlv = NULL;
        m->holder = NULL;
        m->delivery_count++;
        any = 1;
      } else if (!next || m->locked_until < next) {
        next = m->locked_until;
      }
    }
    if (any) pump_queue(q);
  }
  int64_t ns = expire_sessions();
  if (ns && (!next || ns < next)) next = ns;
  return next;
}

/* ------------------------------------------------------------------ authorization */

static const char *conn_host(conn_t *c) { return c->hostname && *c->hostname ? c->hostname : "127.0.0.1"; }

static int has_token(conn_t *c, const char *audience)
{
  for (int i = 0; i < c->ntokens; i++)
    if (strcasecmp(c->tokens[i], audience) == 0) return 1;
  return 0;
}

/* A valid token for sb://HOST/<entity>, sb://HOST/<address> or the namespace? */
static int authorized(conn_t *c, const char *entity, const char *address)
{
  sbuf_t a = {0};
  int ok = 0;
  const char *host = conn_host(c);
  sb_printf(&a, "sb://%s/", host);
  if (has_token(c, a.p)) ok = 1;
  a.n = 0;
  sb_printf(&a, "sb://%s", host);
  if (!ok && has_token(c, a.p)) ok = 1;
  a.n = 0;
  sb_printf(&a, "sb://%s/%s", host, entity);
  if (!ok && has_token(c, a.p)) ok = 1;
  a.n = 0;
  sb_printf(&a, "sb://%s/%s", host, address);
  if (!ok && has_token(c, a.p)) ok = 1;
  free(a.p);
  return ok;
}

/* ------------------------------------------------------------------ SAS tokens */

/* Checks a put-token request; returns 1 when the token is valid, else 0 with `why`. */
static int verify_token(conn_t *c, const char *type, const char *name, const char *token, char *why, size_t whylen,
                        long long *expiry_out)
{
  static const char prefix[] = "SharedAccessSignature ";
  if (!type || strcmp(type, "servicebus.windows.net:sastoken") != 0) {
    snprintf(why, whylen, "token type is %s, expected servicebus.windows.net:sastoken", type ? type : "(none)");
    return 0;
  }
  if (!name || !*name) {
    snprintf(why, whylen, "no name (audience) application property");
    return 0;
  }
  if (!token) {
    snprintf(why, whylen, "the body is not an amqp-value string");
    return 0;
  }
  if (strncmp(token, prefix, sizeof prefix - 1) != 0) {
    snprintf(why, whylen, "the token does not start with \"SharedAccessSignature \"");
    return 0;
  }
  const char *fields = token + sizeof prefix - 1;
  char *sr = NULL, *sig = NULL, *se = NULL, *skn = NULL;
  char *copy = xstrdup(fields);
  for (char *save = NULL, *kv = strtok_r(copy, "&", &save); kv; kv = strtok_r(NULL, "&", &save)) {
    char *eq = strchr(kv, '=');
    if (!eq) continue;
    *eq = 0;
    char **slot = strcmp(kv, "sr") == 0 ? &sr : strcmp(kv, "sig") == 0 ? &sig : strcmp(kv, "se") == 0 ? &se
                : strcmp(kv, "skn") == 0 ? &skn : NULL;
    if (slot && !*slot) *slot = xstrdup(eq + 1);
  }
  free(copy);
  int ok = 0;
  char *sr_dec = NULL, *sig_dec = NULL, *skn_dec = NULL;
  if (!sr || !sig || !se || !skn) {
    snprintf(why, whylen, "the token lacks %s", !sr ? "sr" : !sig ? "sig" : !se ? "se" : "skn");
    goto out;
  }
  sr_dec = url_decode(sr, strlen(sr));
  sig_dec = url_decode(sig, strlen(sig));
  skn_dec = url_decode(skn, strlen(skn));
  if (strcmp(skn_dec, cfg.key_name) != 0) {
    snprintf(why, whylen, "skn is %s, expected %s", skn_dec, cfg.key_name);
    goto out;
  }
  char *end = NULL;
  long long expiry = strtoll(se, &end, 10);
  *expiry_out = expiry;
  if (!*se || *end) {
    snprintf(why, whylen, "se is not an integer: %s", se);
    goto out;
  }
  if (expiry * 1000 <= now_ms()) {
    snprintf(why, whylen, "the token expired (se=%lld, now=%lld)", expiry, (long long)(now_ms() / 1000));
    goto out;
  }
  if (strcmp(sr_dec, name) != 0) {
    snprintf(why, whylen, "sr decodes to %s but the name property is %s", sr_dec, name);
    goto out;
  }
  /* signature over the token's own (encoded) sr, a newline and the expiry */
  sbuf_t msg = {0};
  sb_printf(&msg, "%s\n%s", sr, se);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int maclen = 0;
  HMAC(EVP_sha256(), cfg.key, (int)strlen(cfg.key), (const unsigned char *)msg.p, msg.n, mac, &maclen);
  free(msg.p);
  unsigned char b64[4 * ((EVP_MAX_MD_SIZE + 2) / 3) + 1];
  EVP_EncodeBlock(b64, mac, (int)maclen);
  if (strcmp((const char *)b64, sig_dec) != 0) {
    snprintf(why, whylen, "the signature does not match (wrong key, or not HMAC-SHA256 over urlenc(audience), a newline and se)");
    goto out;
  }
  /* the audience must be this namespace (sb://HOST) or an entity in it (sb://HOST/...) */
  sbuf_t ns = {0};
  sb_printf(&ns, "sb://%s", conn_host(c));
  int in_ns = strcasecmp(name, ns.p) == 0 || (strncasecmp(name, ns.p, ns.n) == 0 && name[ns.n] == '/');
  if (!in_ns) {
    snprintf(why, whylen, "the audience %s is not in this namespace (%s/...)", name, ns.p);
    free(ns.p);
    goto out;
  }
  free(ns.p);
  ok = 1;
  snprintf(why, whylen, "ok");
out:
  free(sr);
  free(sig);
  free(se);
  free(skn);
  free(sr_dec);
  free(sig_dec);
  free(skn_dec);
  return ok;
}

/* The amqp-value string body, or NULL. */
static char *body_string(pn_message_t *m)
{
  pn_data_t *b = pn_message_body(m);
  char *out = NULL;
  pn_data_rewind(b);
  if (pn_data_next(b)) {
    if (pn_data_type(b) == PN_STRING) {
      pn_bytes_t v = pn_data_get_string(b);
      out = xstrndup(v.start, v.size);
    }
  }
  pn_data_rewind(b);
  return out;
}

static void set_reply_basics(pn_message_t *r, pn_message_t *req)
{
  pn_atom_t id = pn_message_get_id(req);
  if (id.type != PN_NULL) pn_message_set_correlation_id(r, id);
  const char *to = pn_message_get_reply_to(req);
  if (to) pn_message_set_address(r, to);
}

static void handle_put_token(conn_t *c, pn_message_t *m)
{
  char *op = app_prop(m, "operation");
  char *type = app_prop(m, "type");
  char *name = app_prop(m, "name");
  char *token = body_string(m);
  char *mid = atom_text(pn_message_get_id(m));
  const char *reply_to = pn_message_get_reply_to(m);
  char why[512];
  int valid = 0, status;
  long long expiry = 0;
  if (!op || strcmp(op, "put-token") != 0) {
    snprintf(why, sizeof why, "operation is %s, expected put-token", op ? op : "(none)");
    status = 400;
  } else {
    valid = verify_token(c, type, name, token, why, sizeof why, &expiry);
    status = valid ? 200 : 401;
  }
  if (valid && !has_token(c, name)) {
    c->tokens = realloc(c->tokens, sizeof(char *) * (size_t)(c->ntokens + 1));
    c->tokens[c->ntokens++] = xstrdup(name);
  }
  sbuf_t b;
  log_begin(&b, "put-token", c);
  jstr(&b, "audience", name);
  jstr(&b, "token_type", type);
  jbool(&b, "valid", valid);
  jstr(&b, "why", why);
  jstr(&b, "operation", op);
  jstr(&b, "message_id", mid);
  jstr(&b, "reply_to", reply_to);
  jint(&b, "status", status);
  if (expiry) jint(&b, "expires_in_s", expiry - now_ms() / 1000);
  jdata(&b, "app", pn_message_properties(m));
  log_line(&b);

  pn_message_t *r = pn_message();
  set_reply_basics(r, m);
  pn_data_t *p = pn_message_properties(r);
  pn_data_put_map(p);
  pn_data_enter(p);
  pn_data_put_string(p, pn_bytes(strlen("status-code"), "status-code"));
  pn_data_put_int(p, status);
  put_str_kv(p, "status-description", valid ? "Accepted" : why);
  pn_data_exit(p);
  queue_reply(c, L_CBS_OUT, reply_to, r);
  pn_message_free(r);
  free(op);
  free(type);
  free(name);
  free(token);
  free(mid);
}

/* ------------------------------------------------------------------ $management */

static qmsg_t *find_lock(queue_t *q, const unsigned char tag[16])
{
  for (qmsg_t *m = q->head; m; m = m->next)
    if (m->locked && memcmp(m->lock, tag, 16) == 0) return m;
  return NULL;
}

/* expirations: renew-lock's {expirations: timestamp[]}; expiration: renew-session-lock's
 * {expiration: timestamp} (each only with status 200; the body is an empty map otherwise). */
static void mgmt_reply(conn_t *c, pn_message_t *req, int status, const char *desc, const char *condition,
                       int64_t *expirations, int nexp, const int64_t *expiration)
{
  pn_message_t *r = pn_message();
  set_reply_basics(r, req);
  pn_data_t *p = pn_message_properties(r);
  pn_data_put_map(p);
  pn_data_enter(p);
  pn_data_put_string(p, pn_bytes(strlen("statusCode"), "statusCode"));
  pn_data_put_int(p, status);
  put_str_kv(p, "statusDescription", desc);
  if (condition) {
    pn_data_put_string(p, pn_bytes(strlen("errorCondition"), "errorCondition"));
    pn_data_put_symbol(p, pn_bytes(strlen(condition), condition));
  }
  pn_data_exit(p);
  pn_data_t *body = pn_message_body(r);
  pn_data_put_map(body);
  pn_data_enter(body);
  if (expirations) {
    pn_data_put_string(body, pn_bytes(strlen("expirations"), "expirations"));
    pn_data_put_array(body, false, PN_TIMESTAMP);
    pn_data_enter(body);
    for (int i = 0; i < nexp; i++) pn_data_put_timestamp(body, expirations[i]);
    pn_data_exit(body);
  }
  if (expiration) {
    pn_data_put_string(body, pn_bytes(strlen("expiration"), "expiration"));
    pn_data_put_timestamp(body, *expiration);
  }
  pn_data_exit(body);
  queue_reply(c, L_MGMT_OUT, pn_message_get_reply_to(req), r);
  pn_message_free(r);
}

/* The value of key `key` in an amqp-value map body, as text, or NULL. */
static char *body_map_str(pn_message_t *m, const char *key) { return map_text(pn_message_body(m), key); }

/* com.microsoft:renew-session-lock {session-id}: only the connection whose link holds the
 * session lock may renew it. */
static void renew_session_lock(conn_t *c, linfo_t *li, pn_message_t *m, const char *mid)
{
  char *sid = body_map_str(m, "session-id");
  int status = 200;
  const char *desc = "OK", *cond = NULL;
  int64_t until = 0;
  if (!sid) {
    status = 400;
    desc = "session-id must be a string";
    cond = "com.microsoft:argument-error";
  } else if (!li->q || !li->q->sessions) {
    status = 400;
    desc = "The entity does not require sessions: there is no session lock to renew.";
    cond = "amqp:not-allowed";
  } else {
    linfo_t *h = session_holder(li->q, sid);
    if (!h || h->conn != c) {
      status = 410;
      desc = SESSION_LOCK_LOST_DESC;
      cond = "com.microsoft:session-lock-lost";
    } else {
      until = h->session_until = now_ms() + cfg.lock_ms;
    }
  }
  sbuf_t b;
  log_begin(&b, "renew-session-lock", c);
  jstr(&b, "address", li->address);
  jstr(&b, "session", sid);
  jint(&b, "status", status);
  jstr(&b, "message_id", mid);
  jstr(&b, "status_description", desc);
  if (status == 200) jint(&b, "locked_until", until);
  log_line(&b);
  mgmt_reply(c, m, status, desc, cond, NULL, 0, status == 200 ? &until : NULL);
  free(sid);
}

static void handle_management(conn_t *c, linfo_t *li, pn_message_t *m)
{
  char *op = app_prop(m, "operation");
  char *assoc = app_prop(m, "associated-link-name");
  char *mid = atom_text(pn_message_get_id(m));
  if (op && strcmp(op, "com.microsoft:renew-session-lock") == 0) {
    renew_session_lock(c, li, m, mid);
    goto done;
  }
  if (!op || strcmp(op, "com.microsoft:renew-lock") != 0) {
    sbuf_t b;
    log_begin(&b, "management", c);
    jstr(&b, "address", li->address);
    jstr(&b, "operation", op);
    jstr(&b, "message_id", mid);
    jdata(&b, "app", pn_message_properties(m));
    jdata(&b, "body", pn_message_body(m));
    jint(&b, "status", 501);
    log_line(&b);
    mgmt_reply(c, m, 501, "The operation is not implemented by fake-servicebus", "com.microsoft:not-implemented",
               NULL, 0, NULL);
    goto done;
  }
  /* body: amqp-value map {"lock-tokens": array<uuid>} */
  unsigned char (*tokens)[16] = NULL;
  int ntok = 0, malformed = 0;
  pn_data_t *body = pn_message_body(m);
  pn_data_rewind(body);
  if (pn_data_next(body) && pn_data_type(body) == PN_MAP) {
    pn_data_enter(body);
    while (pn_data_next(body)) {
      pn_type_t kt = pn_data_type(body);
      pn_bytes_t k = kt == PN_STRING ? pn_data_get_string(body) : kt == PN_SYMBOL ? pn_data_get_symbol(body)
                                                                                : pn_bytes(0, NULL);
      if (!pn_data_next(body)) break;
      if (k.size == strlen("lock-tokens") && memcmp(k.start, "lock-tokens", k.size) == 0) {
        pn_type_t vt = pn_data_type(body);
        if (vt != PN_ARRAY && vt != PN_LIST) {
          malformed = 1;
          continue;
        }
        if (vt == PN_ARRAY && pn_data_get_array_type(body) != PN_UUID) malformed = 1;
        pn_data_enter(body);
        if (vt == PN_ARRAY && pn_data_is_array_described(body)) pn_data_next(body);
        while (pn_data_next(body)) {
          if (pn_data_type(body) != PN_UUID) {
            malformed = 1;
            continue;
          }
          tokens = realloc(tokens, sizeof *tokens * (size_t)(ntok + 1));
          memcpy(tokens[ntok++], pn_data_get_uuid(body).bytes, 16);
        }
        pn_data_exit(body);
      }
    }
    pn_data_exit(body);
  } else {
    malformed = 1;
  }
  pn_data_rewind(body);
  int64_t *exp = xcalloc((size_t)(ntok ? ntok : 1), sizeof *exp);
  int status = 200;
  const char *desc = "OK", *cond = NULL;
  if (malformed || ntok == 0) {
    status = 400;
    desc = "lock-tokens must be a non-empty array of uuid";
    cond = "com.microsoft:argument-error";
  } else if (li->q && li->q->sessions) {
    /* session receivers renew the session lock instead: it covers their messages */
    status = 400;
    desc = "The entity requires sessions: its messages are covered by their session's lock, renew it with "
           "com.microsoft:renew-session-lock (com.microsoft:renew-lock is for messages received without a session).";
    cond = "amqp:not-allowed";
  } else {
    int64_t until = now_ms() + cfg.lock_ms;
    for (int i = 0; i < ntok; i++) {
      unsigned char tag[16];
      guid_swap(tokens[i], tag);
      if (!li->q || !find_lock(li->q, tag)) {
        status = 410;
        desc = "The lock supplied is invalid. Either the lock expired, or the message has already been removed "
               "from the queue.";
        cond = "com.microsoft:message-lock-lost";
      }
    }
    if (status == 200) {
      for (int i = 0; i < ntok; i++) {
        unsigned char tag[16];
        guid_swap(tokens[i], tag);
        qmsg_t *qm = find_lock(li->q, tag);
        qm->locked_until = until;
        exp[i] = until;
      }
    }
  }
  sbuf_t b;
  log_begin(&b, "renew-lock", c);
  jstr(&b, "address", li->address);
  jstr(&b, "message_id", mid);
  jstr(&b, "associated_link_name", assoc);
  jkey(&b, "lock_tokens");
  sb_puts(&b, "[");
  for (int i = 0; i < ntok; i++) {
    char u[37];
    uuid_text(tokens[i], u);
    if (i) sb_puts(&b, ",");
    sb_json_cstr(&b, u);
  }
  sb_puts(&b, "]");
  jint(&b, "status", status);
  jstr(&b, "status_description", desc);
  log_line(&b);
  mgmt_reply(c, m, status, desc, cond, status == 200 ? exp : NULL, ntok, NULL);
  free(exp);
  free(tokens);
done:
  free(op);
  free(assoc);
  free(mid);
}

/* ------------------------------------------------------------------ the topic */

static int type_matches(queue_t *q, const char *t)
{
  if (!t) return 0;
  for (int i = 0; i < q->ntypes; i++)
    if (strcmp(q->types[i], t) == 0) return 1;
  return 0;
}

/* A message for the topic: copied to every subscription whose types match. One without a
 * group-id (SessionId) that a session-enabled subscription would get is rejected as a whole
 * (copied nowhere), as Service Bus does: returns PN_REJECTED with `cond` set. */
static uint64_t handle_topic(conn_t *c, linfo_t *li, pn_message_t *m, const char *bytes, size_t len,
                             pn_condition_t *cond)
{
  const char *subject = pn_message_get_subject(m);
  const char *gid = pn_message_get_group_id(m);
  char *etype = app_prop(m, "EventTypeId");
  char *mid = atom_text(pn_message_get_id(m));
  int no_session = 0;
  for (queue_t *q = g_queues; q; q = q->next)
    if (q->sessions && !q->is_dlq && (type_matches(q, subject) || type_matches(q, etype)) && (!gid || !*gid))
      no_session = 1;
  sbuf_t b;
  log_begin(&b, "transfer", c);
  jstr(&b, "address", li->address);
  jstr(&b, "message_id", mid);
  jstr(&b, "subject", subject);
  jstr(&b, "group_id", pn_message_get_group_id(m));
  jkey(&b, "correlation_id");
  {
    char *cid = atom_text(pn_message_get_correlation_id(m));
    sb_json_cstr(&b, cid);
    free(cid);
  }
  jstr(&b, "reply_to", pn_message_get_reply_to(m));
  jstr(&b, "content_type", pn_message_get_content_type(m));
  jdata(&b, "app", pn_message_properties(m));
  jdata(&b, "annotations", pn_message_annotations(m));
  jdata(&b, "body", pn_message_body(m));
  if (no_session) {
    static const char desc[] = "The SessionId was not set on a message, and it cannot be sent to the entity. Entities "
                               "that have session support enabled can only receive messages that have the SessionId "
                               "set to a valid value.";
    pn_condition_set_name(cond, "amqp:invalid-field");
    pn_condition_set_description(cond, desc);
    jstr(&b, "outcome", "rejected");
    jstr(&b, "condition", "amqp:invalid-field");
    jstr(&b, "description", desc);
  }
  jkey(&b, "routed");
  sb_puts(&b, "[");
  int n = 0;
  int64_t now = now_ms();
  for (queue_t *q = g_queues; q; q = q->next) {
    if (no_session) break;
    if (q->is_dlq || !(type_matches(q, subject) || type_matches(q, etype))) continue;
    qmsg_t *qm = xcalloc(1, sizeof *qm);
    qm->seq = q->next_seq++;
    qm->bytes = xmalloc(len);
    memcpy(qm->bytes, bytes, len);
    qm->len = len;
    qm->enqueued = now;
    qm->message_id = xstrdup(mid);
    qm->session = gid && *gid ? xstrdup(gid) : NULL;
    if (q->tail) q->tail->next = qm;
    else q->head = qm;
    q->tail = qm;
    if (n++) sb_puts(&b, ",");
    sb_json_cstr(&b, q->name);
  }
  sb_puts(&b, "]");
  log_line(&b);
  if (!no_session)
    for (queue_t *q = g_queues; q; q = q->next) pump_queue(q);
  free(etype);
  free(mid);
  return no_session ? PN_REJECTED : PN_ACCEPTED;
}

/* ------------------------------------------------------------------ dispositions on subscriptions */

static const char *outcome_name(uint64_t st)
{
  switch (st) {
  case PN_ACCEPTED: return "accepted";
  case PN_REJECTED: return "rejected";
  case PN_RELEASED: return "released";
  case PN_MODIFIED: return "modified";
  case PN_RECEIVED: return "received";
  case 0: return "none";
  default: return "other";
  }
}

static void unlink_msg(queue_t *q, qmsg_t *m)
{
  qmsg_t *prev = NULL;
  for (qmsg_t *x = q->head; x; prev = x, x = x->next) {
    if (x != m) continue;
    if (prev) prev->next = m->next;
    else q->head = m->next;
    if (q->tail == m) q->tail = prev;
    m->next = NULL;
    return;
  }
}

static void free_msg(qmsg_t *m)
{
  free(m->bytes);
  free(m->message_id);
  free(m->session);
  free(m);
}

/* Appends the value at src's cursor to dst (recursively). */
static void copy_value(pn_data_t *dst, pn_data_t *src)
{
  switch (pn_data_type(src)) {
  case PN_NULL: pn_data_put_null(dst); break;
  case PN_BOOL: pn_data_put_bool(dst, pn_data_get_bool(src)); break;
  case PN_UBYTE: pn_data_put_ubyte(dst, pn_data_get_ubyte(src)); break;
  case PN_BYTE: pn_data_put_byte(dst, pn_data_get_byte(src)); break;
  case PN_USHORT: pn_data_put_ushort(dst, pn_data_get_ushort(src)); break;
  case PN_SHORT: pn_data_put_short(dst, pn_data_get_short(src)); break;
  case PN_UINT: pn_data_put_uint(dst, pn_data_get_uint(src)); break;
  case PN_INT: pn_data_put_int(dst, pn_data_get_int(src)); break;
  case PN_CHAR: pn_data_put_char(dst, pn_data_get_char(src)); break;
  case PN_ULONG: pn_data_put_ulong(dst, pn_data_get_ulong(src)); break;
  case PN_LONG: pn_data_put_long(dst, pn_data_get_long(src)); break;
  case PN_TIMESTAMP: pn_data_put_timestamp(dst, pn_data_get_timestamp(src)); break;
  case PN_FLOAT: pn_data_put_float(dst, pn_data_get_float(src)); break;
  case PN_DOUBLE: pn_data_put_double(dst, pn_data_get_double(src)); break;
  case PN_DECIMAL32: pn_data_put_decimal32(dst, pn_data_get_decimal32(src)); break;
  case PN_DECIMAL64: pn_data_put_decimal64(dst, pn_data_get_decimal64(src)); break;
  case PN_DECIMAL128: pn_data_put_decimal128(dst, pn_data_get_decimal128(src)); break;
  case PN_UUID: pn_data_put_uuid(dst, pn_data_get_uuid(src)); break;
  case PN_BINARY: pn_data_put_binary(dst, pn_data_get_binary(src)); break;
  case PN_STRING: pn_data_put_string(dst, pn_data_get_string(src)); break;
  case PN_SYMBOL: pn_data_put_symbol(dst, pn_data_get_symbol(src)); break;
  case PN_DESCRIBED:
  case PN_LIST:
  case PN_MAP:
  case PN_ARRAY: {
    pn_type_t t = pn_data_type(src);
    if (t == PN_DESCRIBED) pn_data_put_described(dst);
    else if (t == PN_LIST) pn_data_put_list(dst);
    else if (t == PN_MAP) pn_data_put_map(dst);
    else pn_data_put_array(dst, pn_data_is_array_described(src), pn_data_get_array_type(src));
    pn_data_enter(src);
    pn_data_enter(dst);
    while (pn_data_next(src)) copy_value(dst, src);
    pn_data_exit(dst);
    pn_data_exit(src);
    break;
  }
  default: pn_data_put_null(dst); break;
  }
}

/* Moves m to q's dead-letter queue, adding DeadLetterReason / DeadLetterErrorDescription. */
static void dead_letter(queue_t *q, qmsg_t *m, const char *reason, const char *description)
{
  unlink_msg(q, m);
  if (!q->dlq) {
    free_msg(m);
    return;
  }
  pn_message_t *pm = pn_message();
  if (pn_message_decode(pm, m->bytes, m->len) == 0) {
    /* rebuild the application properties with the two dead-letter keys */
    pn_data_t *old = pn_data(0);
    pn_data_copy(old, pn_message_properties(pm));
    pn_data_t *p = pn_message_properties(pm);
    pn_data_clear(p);
    pn_data_put_map(p);
    pn_data_enter(p);
    copy_map_except(p, old, is_dead_letter_key);
    if (reason) put_str_kv(p, "DeadLetterReason", reason);
    if (description) put_str_kv(p, "DeadLetterErrorDescription", description);
    pn_data_exit(p);
    pn_data_free(old);
    size_t len;
    char *bytes = encode_message(pm, &len);
    if (bytes) {
      free(m->bytes);
      m->bytes = bytes;
      m->len = len;
    }
  }
  pn_message_free(pm);
  m->locked = 0;
  m->dlv = NULL;
  m->holder = NULL;
  m->seq = q->dlq->next_seq++;
  if (q->dlq->tail) q->dlq->tail->next = m;
  else q->dlq->head = m;
  q->dlq->tail = m;
  pump_queue(q->dlq);
}

/* A string entry of a condition's info map, or NULL. */
static char *info_str(pn_condition_t *cond, const char *key)
{
  pn_data_t *d = pn_condition_info(cond);
  char *out = NULL;
  pn_data_rewind(d);
  if (pn_data_next(d) && pn_data_type(d) == PN_MAP) {
    pn_data_enter(d);
    while (pn_data_next(d)) {
      pn_type_t kt = pn_data_type(d);
      pn_bytes_t k = kt == PN_STRING ? pn_data_get_string(d) : kt == PN_SYMBOL ? pn_data_get_symbol(d) : pn_bytes(0, NULL);
      if (!pn_data_next(d)) break;
      if (k.size == strlen(key) && memcmp(k.start, key, k.size) == 0 && pn_data_type(d) == PN_STRING) {
        pn_bytes_t v = pn_data_get_string(d);
        out = xstrndup(v.start, v.size);
        break;
      }
    }
    pn_data_exit(d);
  }
  pn_data_rewind(d);
  return out;
}

static char g_handled;   /* delivery context: this delivery's disposition was answered */

static void handle_queue_disposition(conn_t *c, linfo_t *li, pn_delivery_t *d)
{
  if (pn_delivery_get_context(d) == &g_handled) return;
  uint64_t st = pn_delivery_remote_state(d);
  int remote_settled = pn_delivery_settled(d);
  if (st == 0 && !remote_settled) return;   /* nothing decided yet */
  if (st == PN_RECEIVED && !remote_settled) return;
  queue_t *q = li->q;
  qmsg_t *m = NULL;
  for (qmsg_t *x = q ? q->head : NULL; x; x = x->next)
    if (x->locked && x->dlv == d) {
      m = x;
      break;
    }
  pn_delivery_tag_t tag = pn_delivery_tag(d);
  char uuid[37] = "";
  if (tag.size == 16) {
    unsigned char u[16];
    guid_swap((const unsigned char *)tag.start, u);
    uuid_text(u, uuid);
  }
  pn_disposition_t *rd = pn_delivery_remote(d);
  pn_condition_t *rc = pn_disposition_condition(rd);
  sbuf_t b;
  log_begin(&b, "disposition", c);
  jstr(&b, "address", li->address);
  jstr(&b, "link", li->name);
  jstr(&b, "message_id", m ? m->message_id : NULL);
  if (m && m->session) jstr(&b, "session", m->session);
  else if (li->granted) jstr(&b, "session", li->granted);
  jstr(&b, "lock_token", uuid[0] ? uuid : NULL);
  jstr(&b, "outcome", outcome_name(st));
  jbool(&b, "settled", remote_settled);
  if (st == PN_REJECTED) {
    jstr(&b, "condition", pn_condition_get_name(rc));
    jstr(&b, "description", pn_condition_get_description(rc));
    jdata(&b, "info", pn_condition_info(rc));
  }
  if (st == PN_MODIFIED) {
    jbool(&b, "delivery_failed", pn_disposition_is_failed(rd));
    jbool(&b, "undeliverable_here", pn_disposition_is_undeliverable(rd));
    jdata(&b, "annotations", pn_disposition_annotations(rd));
  }
  jbool(&b, "lock_lost", m == NULL);
  log_line(&b);

  pn_disposition_t *ld = pn_delivery_local(d);
  if (!m && li->granted) {
    /* a session receiver's messages go back only with its session lock */
    pn_condition_t *lc = pn_disposition_condition(ld);
    pn_condition_set_name(lc, "com.microsoft:session-lock-lost");
    pn_condition_set_description(lc, SESSION_LOCK_LOST_DESC);
    pn_delivery_update(d, PN_REJECTED);
  } else if (!m) {
    /* the lock expired (or the message was taken back): Service Bus answers message-lock-lost */
    pn_condition_t *lc = pn_disposition_condition(ld);
    pn_condition_set_name(lc, "com.microsoft:message-lock-lost");
    pn_condition_set_description(lc, "The lock supplied is invalid. Either the lock expired, or the message has "
                                     "already been removed from the queue.");
    pn_delivery_update(d, PN_REJECTED);
  } else {
    switch (st) {
    case PN_ACCEPTED:
      unlink_msg(q, m);
      free_msg(m);
      break;
    case PN_REJECTED: {
      char *reason = info_str(rc, "DeadLetterReason");
      char *desc = info_str(rc, "DeadLetterErrorDescription");
      dead_letter(q, m, reason ? reason : pn_condition_get_name(rc), desc ? desc : pn_condition_get_description(rc));
      free(reason);
      free(desc);
      break;
    }
    default:   /* released, modified, or settled without an outcome */
      m->locked = 0;
      m->dlv = NULL;
      m->holder = NULL;
      m->delivery_count++;
      break;
    }
    /* answer with the same outcome, settled (the rcv-settle-mode second handshake) */
    if (st == PN_REJECTED) pn_condition_copy(pn_disposition_condition(ld), rc);
    if (st == PN_MODIFIED) {
      pn_disposition_set_failed(ld, pn_disposition_is_failed(rd));
      pn_disposition_set_undeliverable(ld, pn_disposition_is_undeliverable(rd));
    }
    if (st) pn_delivery_update(d, st);
  }
  pn_delivery_set_context(d, &g_handled);
  pn_delivery_settle(d);
  if (q) pump_queue(q);
}

/* ------------------------------------------------------------------ links */

static void refuse(conn_t *c, linfo_t *li, const char *condition, const char *fmt, ...)
{
  char desc[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(desc, sizeof desc, fmt, ap);
  va_end(ap);
  li->kind = L_REFUSED;
  pn_link_t *l = li->link;
  pn_link_open(l);
  pn_condition_t *cond = pn_link_condition(l);
  pn_condition_set_name(cond, condition);
  pn_condition_set_description(cond, desc);
  pn_link_close(l);
  li->closed = 1;
  sbuf_t b;
  log_begin(&b, "detach", c);
  jstr(&b, "by", "fake");
  jstr(&b, "address", li->address);
  jstr(&b, "link", pn_link_name(l));
  jstr(&b, "role", pn_link_is_sender(l) ? "receiver" : "sender");
  jstr(&b, "condition", condition);
  jstr(&b, "description", desc);
  log_line(&b);
}

static int ends_with_ci(const char *s, const char *suffix)
{
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcasecmp(s + n - m, suffix) == 0;
}

static void tracking_suffix(char *out, size_t n)
{
  unsigned char r[16];
  char u[37];
  RAND_bytes(r, sizeof r);
  r[6] = (unsigned char)((r[6] & 0x0f) | 0x40);
  r[8] = (unsigned char)((r[8] & 0x3f) | 0x80);
  uuid_text(r, u);
  time_t t = time(NULL);
  struct tm tm;
  gmtime_r(&t, &tm);
  char ts[32];
  strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(out, n, " To know more visit https://aka.ms/sbResourceMgrExceptions. TrackingId:%s_G1, Timestamp:%s", u, ts);
}

static void on_link_remote_open(conn_t *c, pn_link_t *l)
{
  linfo_t *li = xcalloc(1, sizeof *li);
  li->conn = c;
  li->link = l;
  li->next = g_links;
  g_links = li;
  pn_link_set_context(l, li);
  int client_receiver = pn_link_is_sender(l);   /* our sender = the client's receiver */
  const char *src = pn_terminus_get_address(pn_link_remote_source(l));
  const char *tgt = pn_terminus_get_address(pn_link_remote_target(l));
  const char *address = client_receiver ? src : tgt;
  li->address = xstrdup(address);
  li->name = xstrdup(pn_link_name(l));

  sbuf_t b;
  log_begin(&b, "attach", c);
  jstr(&b, "role", client_receiver ? "receiver" : "sender");
  jstr(&b, "address", address);
  jstr(&b, "link", pn_link_name(l));
  jstr(&b, "source", src);
  jstr(&b, "target", tgt);
  jint(&b, "rcv_settle_mode", (int)pn_link_remote_rcv_settle_mode(l));
  jint(&b, "snd_settle_mode", (int)pn_link_remote_snd_settle_mode(l));
  jdata(&b, "properties", pn_link_remote_properties(l));
  jdata(&b, "filter", pn_terminus_filter(pn_link_remote_source(l)));
  log_line(&b);

  /* answer with the client's own termini and settle modes */
  pn_terminus_copy(pn_link_source(l), pn_link_remote_source(l));
  pn_terminus_copy(pn_link_target(l), pn_link_remote_target(l));
  pn_link_set_snd_settle_mode(l, pn_link_remote_snd_settle_mode(l));
  pn_link_set_rcv_settle_mode(l, pn_link_remote_rcv_settle_mode(l));

  if (!address || !*address) {
    refuse(c, li, "amqp:invalid-field", "the link has no %s address", client_receiver ? "source" : "target");
    return;
  }
  if (strcmp(address, "$cbs") == 0) {
    li->kind = client_receiver ? L_CBS_OUT : L_CBS_IN;
    if (client_receiver) li->reply_addr = xstrdup(tgt);
  } else {
    const char *host = conn_host(c);
    char entity[1024];
    int mgmt = ends_with_ci(address, "/$management");
    snprintf(entity, sizeof entity, "%.*s", (int)(strlen(address) - (mgmt ? strlen("/$management") : 0)), address);
    int is_topic = strcasecmp(entity, cfg.topic) == 0;
    queue_t *q = is_topic ? NULL : queue_find(entity);
    if (!is_topic && !q) {
      /* not found: the attach carries no source (receiver) / no target (sender) */
      pn_terminus_set_type(client_receiver ? pn_link_source(l) : pn_link_target(l), PN_UNSPECIFIED);
      char tail[256];
      tracking_suffix(tail, sizeof tail);
      refuse(c, li, "amqp:not-found", "The messaging entity 'sb://%s/%s' could not be found.%s", host, entity, tail);
      return;
    }
    /* a dead-letter queue is covered by its subscription's token */
    char parent[1024];
    snprintf(parent, sizeof parent, "%s", entity);
    if (q && q->is_dlq) parent[strlen(parent) - strlen("/$DeadLetterQueue")] = 0;
    if (!authorized(c, entity, address) && !authorized(c, parent, address)) {
      char tail[256];
      tracking_suffix(tail, sizeof tail);
      refuse(c, li, "amqp:unauthorized-access",
             "Unauthorized access. '%s' claim(s) are required to perform this operation. Resource: 'sb://%s/%s'. "
             "No valid token was put on $cbs for this entity on this connection.%s",
             mgmt ? "Manage,Listen" : client_receiver ? "Listen" : "Send", host, address, tail);
      return;
    }
    if (mgmt) {
      li->kind = client_receiver ? L_MGMT_OUT : L_MGMT_IN;
      li->q = q;
      if (client_receiver) li->reply_addr = xstrdup(tgt);
    } else if (is_topic) {
      if (client_receiver) {
        refuse(c, li, "amqp:not-allowed", "Cannot receive from topic '%s': receive from a subscription "
               "(%s/Subscriptions/<name>).", cfg.topic, cfg.topic);
        return;
      }
      li->kind = L_TOPIC_IN;
    } else {
      if (!client_receiver) {
        refuse(c, li, "amqp:not-allowed", "Cannot send to '%s': a subscription only receives from its topic.", address);
        return;
      }
      li->q = q;
      char *want = NULL;
      int sf = session_filter(pn_terminus_filter(pn_link_remote_source(l)), &want);
      if (q->sessions != (sf != 0)) {
        char tail[256];
        tracking_suffix(tail, sizeof tail);
        refuse(c, li, "amqp:not-allowed", q->sessions
               ? "It is not possible for an entity that requires sessions to create a non-sessionful message receiver.%s"
               : "It is not possible for an entity that does not require sessions to create a sessionful message "
                 "receiver.%s", tail);
        free(want);
        return;
      }
      if (sf == 2) {
        refuse(c, li, "amqp:invalid-field", "The value of %s must be a session id (string) or null.", SESSION_FILTER);
        return;
      }
      if (sf == 1 && want) {
        /* a named session: granted unless another link holds it (messages or not) */
        if (session_holder(q, want)) {
          char tail[256];
          tracking_suffix(tail, sizeof tail);
          sbuf_t sb;
          log_begin(&sb, "session-refused", c);
          jstr(&sb, "address", address);
          jstr(&sb, "link", li->name);
          jstr(&sb, "session", want);
          jstr(&sb, "condition", "com.microsoft:session-cannot-be-locked");
          log_line(&sb);
          refuse(c, li, "com.microsoft:session-cannot-be-locked",
                 "The requested session '%s' cannot be accepted. It may be locked by another receiver.%s", want, tail);
          free(want);
          return;
        }
        grant_session(li, want, want);
        free(want);
        pump_queue(q);
        return;
      }
      if (sf == 1) {
        /* next available: wait in line; pump_queue answers it when a session is free */
        li->kind = L_SESSION_WAIT;
        li->wait_until = now_ms() + cfg.session_wait_ms;
        li->wait_seq = ++g_wait_seq;
        pump_queue(q);
        return;
      }
      li->kind = L_QUEUE_OUT;
    }
  }
  pn_link_open(l);
  if (!client_receiver) pn_link_flow(l, 100);
  if (li->kind == L_QUEUE_OUT) pump_queue(li->q);
}

static void on_link_remote_close(conn_t *c, pn_link_t *l)
{
  linfo_t *li = pn_link_get_context(l);
  pn_condition_t *rc = pn_link_remote_condition(l);
  sbuf_t b;
  log_begin(&b, "detach", c);
  jstr(&b, "by", "client");
  jstr(&b, "address", li ? li->address : NULL);
  jstr(&b, "link", pn_link_name(l));
  jstr(&b, "role", pn_link_is_sender(l) ? "receiver" : "sender");
  jstr(&b, "condition", pn_condition_is_set(rc) ? pn_condition_get_name(rc) : NULL);
  jstr(&b, "description", pn_condition_is_set(rc) ? pn_condition_get_description(rc) : NULL);
  log_line(&b);
  if (li) {
    if (li->kind == L_SESSION_WAIT) {
      /* a waiting attach the client gave up on: dropped, answered with attach + detach so
       * the client can free the handle */
      li->kind = L_REFUSED;
      pn_link_open(l);
    }
    release_holder(li, "link detached");
    release_session(li, "link detached");
    li->closed = 1;
    out_free_all(li);
    if (li->q) pump_queue(li->q);
  }
  if (pn_link_state(l) & PN_LOCAL_ACTIVE) pn_link_close(l);
}

/* a message (whole) arrived on one of our receivers */
static void on_incoming(conn_t *c, linfo_t *li, pn_delivery_t *d)
{
  pn_link_t *l = pn_delivery_link(d);
  if (pn_delivery_get_context(d) == &g_handled) {
    /* already read and answered; the client settles now (mode second) */
    if (pn_delivery_settled(d)) pn_delivery_settle(d);
    return;
  }
  if (!pn_delivery_readable(d) || pn_delivery_partial(d)) return;
  size_t cap = pn_delivery_pending(d) + 1, len = 0;
  char *buf = xmalloc(cap);
  for (;;) {
    if (len == cap) {
      cap *= 2;
      buf = realloc(buf, cap);
    }
    ssize_t n = pn_link_recv(l, buf + len, cap - len);
    if (n <= 0) break;
    len += (size_t)n;
  }
  pn_link_advance(l);
  uint64_t outcome = PN_ACCEPTED;
  pn_message_t *m = pn_message();
  if (pn_message_decode(m, buf, len) != 0) {
    log_error(c, "undecodable message on %s: %s", li && li->address ? li->address : "?",
              pn_error_text(pn_message_error(m)));
    pn_condition_set_name(pn_disposition_condition(pn_delivery_local(d)), "amqp:decode-error");
    outcome = PN_REJECTED;
  } else if (li) {
    switch (li->kind) {
    case L_CBS_IN: handle_put_token(c, m); break;
    case L_MGMT_IN: handle_management(c, li, m); break;
    case L_TOPIC_IN:
      outcome = handle_topic(c, li, m, buf, len, pn_disposition_condition(pn_delivery_local(d)));
      break;
    default: outcome = PN_REJECTED; break;
    }
  }
  pn_message_free(m);
  free(buf);
  pn_delivery_update(d, outcome);
  if (pn_delivery_settled(d) || pn_link_rcv_settle_mode(l) == PN_RCV_FIRST) {
    pn_delivery_settle(d);
  } else {
    pn_delivery_set_context(d, &g_handled);
  }
  if (pn_link_credit(l) < 50 && !(li && li->closed)) pn_link_flow(l, 100 - pn_link_credit(l));
}

static void on_delivery(conn_t *c, pn_delivery_t *d)
{
  pn_link_t *l = pn_delivery_link(d);
  linfo_t *li = pn_link_get_context(l);
  if (pn_link_is_receiver(l)) {
    on_incoming(c, li, d);
    return;
  }
  /* our sender: the client decided (or settled) */
  if (li && li->kind == L_QUEUE_OUT) {
    handle_queue_disposition(c, li, d);
  } else if (pn_delivery_settled(d)) {
    pn_delivery_settle(d);   /* a reply the client settled */
  }
}

/* ------------------------------------------------------------------ connections */

static void handle_event(conn_t *c, pn_event_t *e)
{
  switch (pn_event_type(e)) {
  case PN_CONNECTION_REMOTE_OPEN: {
    pn_connection_t *pc = pn_event_connection(e);
    const char *h = pn_connection_remote_hostname(pc);
    free(c->hostname);
    c->hostname = xstrdup(h && *h ? h : "127.0.0.1");
    pn_transport_t *t = pn_event_transport(e);
    const char *mech = t ? pn_sasl_get_mech(pn_sasl(t)) : NULL;
    sbuf_t b;
    log_begin(&b, "open", c);
    jstr(&b, "hostname", h);
    jstr(&b, "sasl", mech);
    jstr(&b, "user", t ? pn_transport_get_user(t) : NULL);
    jstr(&b, "container", pn_connection_remote_container(pc));
    jint(&b, "idle_timeout_ms", t ? (int64_t)pn_transport_get_remote_idle_timeout(t) : 0);
    log_line(&b);
    pn_connection_set_container(pc, "fake-servicebus");
    pn_connection_open(pc);
    break;
  }
  case PN_SESSION_REMOTE_OPEN: {
    pn_session_t *s = pn_event_session(e);
    if (!(pn_session_state(s) & PN_LOCAL_ACTIVE)) pn_session_open(s);
    break;
  }
  case PN_LINK_REMOTE_OPEN: {
    pn_link_t *l = pn_event_link(e);
    if (!(pn_link_state(l) & PN_LOCAL_ACTIVE)) on_link_remote_open(c, l);
    break;
  }
  case PN_LINK_FLOW: {
    pn_link_t *l = pn_event_link(e);
    linfo_t *li = pn_link_get_context(l);
    if (!li || !pn_link_is_sender(l)) break;
    if (li->kind == L_SESSION_WAIT) break;   /* credit counts once a session is granted */
    if (li->kind == L_QUEUE_OUT) pump_queue(li->q);
    else pump_out(li);
    if (pn_link_get_drain(l)) pn_link_drained(l);
    break;
  }
  case PN_DELIVERY: on_delivery(c, pn_event_delivery(e)); break;
  case PN_LINK_REMOTE_CLOSE:
  case PN_LINK_REMOTE_DETACH: on_link_remote_close(c, pn_event_link(e)); break;
  case PN_LINK_FINAL: {
    linfo_t *li = pn_link_get_context(pn_event_link(e));
    if (li) {
      /* a session still held here (its AMQP session ended without a detach) goes to others */
      queue_t *q = li->session ? li->q : NULL;
      li->link = NULL;
      linfo_free(li);
      if (q) pump_queue(q);
    }
    break;
  }
  case PN_SESSION_REMOTE_CLOSE: {
    /* an AMQP session's end detaches its links: what they held (message and session locks)
     * goes back at once, as at a detach (its links' FINAL comes only when they are freed) */
    pn_session_t *s = pn_event_session(e);
    for (linfo_t *li = g_links; li; li = li->next) {
      if (li->conn != c || !li->link || li->closed || pn_link_session(li->link) != s) continue;
      release_holder(li, "session ended");
      release_session(li, "session ended");
      li->closed = 1;
      out_free_all(li);
    }
    for (queue_t *q = g_queues; q; q = q->next) pump_queue(q);
    if (pn_session_state(s) & PN_LOCAL_ACTIVE) pn_session_close(s);
    break;
  }
  case PN_CONNECTION_REMOTE_CLOSE: {
    pn_connection_t *pc = pn_event_connection(e);
    pn_condition_t *rc = pn_connection_remote_condition(pc);
    sbuf_t b;
    log_begin(&b, "close", c);
    jstr(&b, "condition", pn_condition_is_set(rc) ? pn_condition_get_name(rc) : NULL);
    jstr(&b, "description", pn_condition_is_set(rc) ? pn_condition_get_description(rc) : NULL);
    log_line(&b);
    if (pn_connection_state(pc) & PN_LOCAL_ACTIVE) pn_connection_close(pc);
    break;
  }
  case PN_TRANSPORT_ERROR: {
    pn_condition_t *tc = pn_transport_condition(pn_event_transport(e));
    sbuf_t b;
    log_begin(&b, "transport-error", c);
    jstr(&b, "condition", pn_condition_get_name(tc));
    jstr(&b, "description", pn_condition_get_description(tc));
    log_line(&b);
    break;
  }
  case PN_TRANSPORT_CLOSED: {
    sbuf_t b;
    log_begin(&b, "disconnect", c);
    log_line(&b);
    break;
  }
  default: break;
  }
}

static void conn_new(int fd)
{
  conn_t *c = xcalloc(1, sizeof *c);
  c->fd = fd;
  c->id = g_next_conn++;
  if (pn_connection_driver_init(&c->drv, NULL, NULL) != 0) {
    fprintf(stderr, "fake-servicebus: pn_connection_driver_init failed\n");
    close(fd);
    free(c);
    return;
  }
  pn_transport_set_server(c->drv.transport);
  pn_sasl_t *sasl = pn_sasl(c->drv.transport);
  pn_sasl_allowed_mechs(sasl, "ANONYMOUS");
  pn_transport_require_auth(c->drv.transport, true);
  pn_connection_driver_bind(&c->drv);
  c->next = g_conns;
  g_conns = c;
}

static void conn_free(conn_t *c)
{
  /* every link context of this connection goes (and with it the locks it held) */
  for (linfo_t *li = g_links, *nx; li; li = nx) {
    nx = li->next;
    if (li->conn == c) {
      if (li->link) pn_link_set_context(li->link, NULL);
      li->link = NULL;
      release_session(li, "connection gone");
      linfo_free(li);
    }
  }
  for (queue_t *q = g_queues; q; q = q->next) pump_queue(q);
  pn_connection_driver_destroy(&c->drv);
  close(c->fd);
  for (int i = 0; i < c->ntokens; i++) free(c->tokens[i]);
  free(c->tokens);
  free(c->hostname);
  free(c);
}

/* At exit: everything is freed without a log line (nothing is released to anyone), so that a
 * leak check under valgrind shows what the fake lost while it ran, not what it still held. */
static void teardown(void)
{
  while (g_links) {
    linfo_t *li = g_links;
    g_links = li->next;
    linfo_destroy(li);
  }
  while (g_conns) {
    conn_t *c = g_conns;
    g_conns = c->next;
    pn_connection_driver_destroy(&c->drv);
    close(c->fd);
    for (int i = 0; i < c->ntokens; i++) free(c->tokens[i]);
    free(c->tokens);
    free(c->hostname);
    free(c);
  }
  while (g_queues) {
    queue_t *q = g_queues;
    g_queues = q->next;
    while (q->head) {
      qmsg_t *m = q->head;
      q->head = m->next;
      free_msg(m);
    }
    for (int i = 0; i < q->ntypes; i++) free(q->types[i]);
    free(q->types);
    free(q->name);
    free(q->address);
    free(q);
  }
  for (int i = 0; i < cfg.nmissing; i++) free(cfg.missing[i]);
  free(cfg.missing);
}

static int process_events(void)
{
  int any = 0;
  for (conn_t *c = g_conns; c; c = c->next) {
    pn_event_t *e;
    while ((e = pn_connection_driver_next_event(&c->drv))) {
      handle_event(c, e);
      any = 1;
    }
  }
  return any;
}

static void do_write(conn_t *c)
{
  c->want_write = 0;
  for (;;) {
    pn_bytes_t wb = pn_connection_driver_write_buffer(&c->drv);
    if (!wb.size) return;
    ssize_t n = send(c->fd, wb.start, wb.size, MSG_NOSIGNAL);
    if (n > 0) {
      pn_connection_driver_write_done(&c->drv, (size_t)n);
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      c->want_write = 1;
      return;
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      pn_connection_driver_write_close(&c->drv);
      return;
    }
  }
}

static void do_read(conn_t *c)
{
  pn_rwbytes_t rb = pn_connection_driver_read_buffer(&c->drv);
  if (!rb.size) return;
  ssize_t n = recv(c->fd, rb.start, rb.size, 0);
  if (n > 0) pn_connection_driver_read_done(&c->drv, (size_t)n);
  else if (n == 0) pn_connection_driver_read_close(&c->drv);
  else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
    pn_connection_driver_read_close(&c->drv);
    pn_connection_driver_write_close(&c->drv);
  }
}

static void on_signal(int sig)
{
  if (sig == SIGUSR1) g_drop = 1;
  else if (sig == SIGUSR2) g_expire = 1;
  else g_stop = 1;
  if (g_sigpipe[1] >= 0) {
    char x = 1;
    ssize_t r = write(g_sigpipe[1], &x, 1);
    (void)r;
  }
}

static void usage(void)
{
  fprintf(stderr,
          "usage: fake-servicebus --port N --log FILE --key-name K --key SECRET --topic TOPIC\n"
          "                       --sub Endpoint=Type1,Type2 [--sub ...] [--missing Endpoint]\n"
          "                       [--lock-duration S | --lock-duration-ms N] [--sessions Endpoint ...]\n"
          "                       [--session-wait-ms N]\n");
  exit(2);
}

int main(int argc, char **argv)
{
  const char **subs = xcalloc((size_t)argc, sizeof *subs);
  const char **sessions = xcalloc((size_t)argc, sizeof *sessions);
  int nsubs = 0, nsessions = 0;
  cfg.port = -1;
  cfg.missing = xcalloc((size_t)argc, sizeof *cfg.missing);
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) usage();
    if (!v) usage();
    if (strcmp(a, "--port") == 0) cfg.port = atoi(v);
    else if (strcmp(a, "--log") == 0) cfg.log_path = v;
    else if (strcmp(a, "--key-name") == 0) cfg.key_name = v;
    else if (strcmp(a, "--key") == 0) cfg.key = v;
    else if (strcmp(a, "--topic") == 0) cfg.topic = v;
    else if (strcmp(a, "--sub") == 0) subs[nsubs++] = v;
    else if (strcmp(a, "--missing") == 0) cfg.missing[cfg.nmissing++] = xstrdup(v);
    else if (strcmp(a, "--lock-duration") == 0) cfg.lock_ms = (int64_t)(atof(v) * 1000.0);
    else if (strcmp(a, "--lock-duration-ms") == 0) cfg.lock_ms = strtoll(v, NULL, 10);
    else if (strcmp(a, "--sessions") == 0) sessions[nsessions++] = v;
    else if (strcmp(a, "--session-wait-ms") == 0) cfg.session_wait_ms = strtoll(v, NULL, 10);
    else usage();
    i++;
  }
  if (cfg.port < 0 || cfg.port > 65535 || !cfg.log_path || !cfg.key_name || !cfg.key || !cfg.topic || cfg.lock_ms <= 0 ||
      cfg.lock_ms > INT32_MAX || cfg.session_wait_ms < 0 || cfg.session_wait_ms > INT32_MAX)
    usage();
  for (int i = 0; i < nsubs; i++) add_subscription(subs[i]);
  for (int i = 0; i < nsessions; i++) {
    sbuf_t a = {0};
    sb_printf(&a, "%s/Subscriptions/%s", cfg.topic, sessions[i]);
    queue_t *q = queue_find(a.p);
    if (!q) {
      fprintf(stderr, "fake-servicebus: --sessions %s names no --sub\n", sessions[i]);
      exit(2);
    }
    q->sessions = 1;
    free(a.p);
  }
  free(sessions);
  for (int i = 0; i < cfg.nmissing; i++) {
    sbuf_t a = {0};
    sb_printf(&a, "%s/Subscriptions/%s", cfg.topic, cfg.missing[i]);
    if (queue_find(a.p)) {
      fprintf(stderr, "fake-servicebus: %s is both --sub and --missing\n", cfg.missing[i]);
      exit(2);
    }
    free(a.p);
  }
  free(subs);

  g_log = fopen(cfg.log_path, "a");
  if (!g_log) {
    fprintf(stderr, "fake-servicebus: cannot open %s: %s\n", cfg.log_path, strerror(errno));
    return 1;
  }

  if (pipe(g_sigpipe) != 0) return 1;
  fcntl(g_sigpipe[0], F_SETFL, O_NONBLOCK);
  fcntl(g_sigpipe[1], F_SETFL, O_NONBLOCK);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGUSR1, &sa, NULL);
  sigaction(SIGUSR2, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);

  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in sin;
  memset(&sin, 0, sizeof sin);
  sin.sin_family = AF_INET;
  sin.sin_port = htons((uint16_t)cfg.port);
  sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(lfd, (struct sockaddr *)&sin, sizeof sin) != 0 || listen(lfd, 64) != 0) {
    fprintf(stderr, "fake-servicebus: cannot listen on 127.0.0.1:%d: %s\n", cfg.port, strerror(errno));
    return 1;
  }
  socklen_t sl = sizeof sin;
  getsockname(lfd, (struct sockaddr *)&sin, &sl);
  fcntl(lfd, F_SETFL, O_NONBLOCK);
  int port = ntohs(sin.sin_port);

  {
    sbuf_t b;
    log_begin(&b, "start", NULL);
    jint(&b, "port", port);
    jstr(&b, "topic", cfg.topic);
    jint(&b, "lock_duration_ms", cfg.lock_ms);
    jint(&b, "session_wait_ms", cfg.session_wait_ms);
    jkey(&b, "subscriptions");
    sb_puts(&b, "[");
    int n = 0;
    for (queue_t *q = g_queues; q; q = q->next) {
      if (q->is_dlq) continue;
      if (n++) sb_puts(&b, ",");
      sb_json_cstr(&b, q->address);
    }
    sb_puts(&b, "]");
    jkey(&b, "sessions");
    sb_puts(&b, "[");
    n = 0;
    for (queue_t *q = g_queues; q; q = q->next) {
      if (!q->sessions) continue;
      if (n++) sb_puts(&b, ",");
      sb_json_cstr(&b, q->address);
    }
    sb_puts(&b, "]");
    jkey(&b, "missing");
    sb_puts(&b, "[");
    for (int i = 0; i < cfg.nmissing; i++) {
      if (i) sb_puts(&b, ",");
      sb_json_cstr(&b, cfg.missing[i]);
    }
    sb_puts(&b, "]");
    log_line(&b);
  }
  printf("listening %d\n", port);
  fflush(stdout);

  struct pollfd *pfds = NULL;
  conn_t **pconn = NULL;
  size_t pcap = 0;
  while (!g_stop) {
    if (g_expire) {   /* as if no renewal had come in time: expire_sessions takes them back below */
      g_expire = 0;
      for (linfo_t *li = g_links; li; li = li->next)
        if (li->kind == L_QUEUE_OUT && li->session) li->session_until = now_ms() - 1;
    }
    /* run every connection's events until all are quiet (one connection's events can
     * create work on another: a message routed to a subscription another client reads) */
    int64_t next_lock = 0;
    for (int round = 0; round < 1000; round++) {
      int any = process_events();
      next_lock = expire_locks();
      if (!any && !process_events()) break;
    }
    int64_t mono = mono_ms(), next_tick = 0;
    for (conn_t *c = g_conns; c; c = c->next) {
      int64_t t = pn_transport_tick(c->drv.transport, mono);
      if (t && (!next_tick || t < next_tick)) next_tick = t;
    }
    process_events();
    for (conn_t *c = g_conns; c; c = c->next) do_write(c);
    /* drop finished connections */
    for (conn_t **pp = &g_conns; *pp;) {
      conn_t *c = *pp;
      if (pn_connection_driver_finished(&c->drv)) {
        *pp = c->next;
        conn_free(c);
      } else {
        pp = &c->next;
      }
    }
    size_t n = 2;
    for (conn_t *c = g_conns; c; c = c->next) n++;
    if (n > pcap) {
      pcap = n * 2;
      pfds = realloc(pfds, pcap * sizeof *pfds);
      pconn = realloc(pconn, pcap * sizeof *pconn);
    }
    pfds[0] = (struct pollfd){.fd = lfd, .events = POLLIN};
    pfds[1] = (struct pollfd){.fd = g_sigpipe[0], .events = POLLIN};
    size_t k = 2;
    for (conn_t *c = g_conns; c; c = c->next) {
      short ev = 0;
      if (!pn_connection_driver_read_closed(&c->drv)) ev |= POLLIN;
      if (c->want_write || pn_connection_driver_write_buffer(&c->drv).size) ev |= POLLOUT;
      pfds[k] = (struct pollfd){.fd = c->fd, .events = ev};
      pconn[k] = c;
      k++;
    }
    int timeout = -1;
    if (next_tick) {
      int64_t d = next_tick - mono_ms();
      timeout = d < 0 ? 0 : (int)d;
    }
    if (next_lock) {
      int64_t d = next_lock - now_ms() + 1;
      if (d < 0) d = 0;
      if (timeout < 0 || d < timeout) timeout = (int)d;
    }
    int r = poll(pfds, k, timeout);
    if (r < 0) {
      if (errno == EINTR) continue;
      perror("fake-servicebus: poll");
      return 1;
    }
    if (pfds[1].revents) {
      char tmp[16];
      while (read(g_sigpipe[0], tmp, sizeof tmp) > 0) {
      }
    }
    for (size_t i = 2; i < k; i++) {
      conn_t *c = pconn[i];
      if (pfds[i].revents & (POLLIN | POLLHUP | POLLERR)) do_read(c);
      if (pfds[i].revents & POLLOUT) do_write(c);
      if ((pfds[i].revents & (POLLHUP | POLLERR)) && !(pfds[i].revents & POLLIN)) {
        pn_connection_driver_read_close(&c->drv);
        pn_connection_driver_write_close(&c->drv);
      }
    }
    if (g_drop) {   /* the sockets close with no AMQP close: what a broker outage looks like to a client */
      g_drop = 0;
      while (g_conns) {
        conn_t *c = g_conns;
        g_conns = c->next;
        sbuf_t b;
        log_begin(&b, "disconnect", c);
        jstr(&b, "why", "SIGUSR1");
        log_line(&b);
        conn_free(c);
      }
    }
    if (pfds[0].revents & POLLIN) {
      for (;;) {
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0) break;
        fcntl(fd, F_SETFL, O_NONBLOCK);
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        conn_new(fd);
      }
    }
  }
  free(pfds);
  free(pconn);
  sbuf_t b;
  log_begin(&b, "stop", NULL);
  log_line(&b);
  fclose(g_log);
  teardown();
  close(lfd);
  int sp = g_sigpipe[1];
  g_sigpipe[1] = -1;   /* a late signal must not write to a closed (or reused) fd */
  close(sp);
  close(g_sigpipe[0]);
  return 0;
}
