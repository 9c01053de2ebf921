/* nh-amqp-bench: AMQP 1.0 load tool for the RabbitMQ benchmark (spec/bench/amqp.lua).
 *
 *   nh-amqp-bench send    URL ADDRESS N SESSIONS [PAYLOAD_BYTES]
 *   nh-amqp-bench consume URL QUEUE N [CREDIT]
 *
 * URL is amqp://user:pass@host:port/vhost (user, pass, port and vhost optional; %XX escapes
 * are decoded; a ?query is ignored; the vhost is sent as the AMQP open hostname "vhost:NAME",
 * as RabbitMQ expects).
 *
 * send: N messages to ADDRESS (e.g. /exchange/nimbus.events/BenchEvent) with the nimbus-host
 *   wire contract (durable; message-id a fresh UUID, correlation-id the same string, group-id
 *   "s<i % SESSIONS>", subject and EventTypeId = the last path segment of ADDRESS, content-type
 *   application/json, application-properties MessageType/EventTypeId/To/OriginatingMessageId/
 *   ParentMessageId/RetryCount, one data section {"n":i,"pad":"xxx..."}). Unsettled: at most
 *   NH_BENCH_WINDOW (1000) are in flight; exits once every one is accepted (1 if any is not).
 *   NH_BENCH_BUCKETS=1: the link goes to the exchange alone and the subject is the routing key
 *   of a host with partitions, the type followed by the 8 bits of the session's bucket as
 *   words (docs/broker-partitions.md).
 *   Prints {"sent":N,"accepted":N,"seconds":S,"rate":R,...}.
 * consume: N messages from /amq/queue/QUEUE (rcv-settle-mode first, credit CREDIT (1000),
 *   topped up at half); each is read and accepted, nothing else. Never grants more than N
 *   credit in total, so nothing beyond N is taken off the queue. Prints
 *   {"consumed":N,"seconds":S,"rate":R,"cpu_s":C,"max_rss_kb":K,...}.
 * "seconds" runs from the link attach (the broker's answer) to the last outcome; connect_s is
 * process start to attach. cpu_s and max_rss_kb are the whole process (getrusage).
 *
 * NH_BENCH_TIMEOUT (seconds, default 300): give up with exit status 1. Diagnostics on stderr.
 * A bench tool, not part of the host: it uses the proton proactor. */
#include <proton/condition.h>
#include <proton/connection.h>
#include <proton/delivery.h>
#include <proton/disposition.h>
#include <proton/event.h>
#include <proton/link.h>
#include <proton/message.h>
#include <proton/proactor.h>
#include <proton/sasl.h>
#include <proton/session.h>
#include <proton/terminus.h>
#include <proton/transport.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

enum { MODE_SEND, MODE_CONSUME };

typedef struct {
  char user[256], pass[256], host[256], port[16], vhost[256];
} bench_url_t;

typedef struct {
  int mode;
  bench_url_t url;
  char address[512];
  char event_type[512];
  long n, sessions, payload, window, credit;
  long buckets;                  /* send: the routing key carries the session's bucket */
  /* send */
  long sent, settled, accepted, rejected;
  char first_bad_state[64];
  /* consume */
  long received, granted, extra; /* extra: delivered beyond N, released */
  char *scratch;
  size_t scratch_size;

  pn_proactor_t *proactor;
  pn_connection_t *conn;
  pn_link_t *link;
  pn_message_t *msg;
  pn_rwbytes_t buf;
  char *body;
  size_t body_cap;
  unsigned char uuid_base[16];

  double t_start, t_open, t_first, t_last;
  bool closing, finished;
  int exit_code;
} bench_t;

static double now_s(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void die(const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  fputs("nh-amqp-bench: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  exit(1);
}

static void usage(void)
{
  fputs("usage: nh-amqp-bench send    URL ADDRESS N SESSIONS [PAYLOAD_BYTES]\n"
        "       nh-amqp-bench consume URL QUEUE N [CREDIT]\n"
        "URL: amqp://user:pass@host:port/vhost\n",
        stderr);
  exit(2);
}

static long parse_long(const char *s, const char *what, long min)
{
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < min) die("bad %s '%s' (an integer >= %ld)", what, s, min);
  return v;
}

static long env_long(const char *name, long def, long min)
{
  const char *s = getenv(name);
  return s && *s ? parse_long(s, name, min) : def;
}

static int hexval(int c)
{
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* Copies [s, s+len) into dst (size cap), decoding %XX. */
static void copy_decoded(char *dst, size_t cap, const char *s, size_t len, const char *what)
{
  size_t o = 0;
  for (size_t i = 0; i < len; i++) {
    int c = (unsigned char)s[i];
    if (c == '%' && i + 2 < len && hexval(s[i + 1]) >= 0 && hexval(s[i + 2]) >= 0) {
      c = hexval(s[i + 1]) * 16 + hexval(s[i + 2]);
      i += 2;
    }
    if (o + 1 >= cap) die("URL %s is too long", what);
    dst[o++] = (char)c;
  }
  dst[o] = 0;
}

static void parse_url(const char *url, bench_url_t *u)
{
  memset(u, 0, sizeof *u);
  const char *p = url;
  if (strncmp(p, "amqp://", 7) != 0) die("URL '%s' does not start with amqp://", url);
  p += 7;
  const char *slash = strchr(p, '/');
  const char *auth_end = p + strcspn(p, "@/");
  const char *hostpart = p;
  if (*auth_end == '@') {
    const char *colon = memchr(p, ':', (size_t)(auth_end - p));
    if (colon) {
      copy_decoded(u->user, sizeof u->user, p, (size_t)(colon - p), "user");
      copy_decoded(u->pass, sizeof u->pass, colon + 1, (size_t)(auth_end - colon - 1), "password");
    } else {
      copy_decoded(u->user, sizeof u->user, p, (size_t)(auth_end - p), "user");
    }
    hostpart = auth_end + 1;
    slash = strchr(hostpart, '/');
  }
  size_t hlen = slash ? (size_t)(slash - hostpart) : strlen(hostpart);
  const char *colon = memchr(hostpart, ':', hlen);
  if (colon) {
    copy_decoded(u->host, sizeof u->host, hostpart, (size_t)(colon - hostpart), "host");
    copy_decoded(u->port, sizeof u->port, colon + 1, hlen - (size_t)(colon - hostpart) - 1, "port");
  } else {
    copy_decoded(u->host, sizeof u->host, hostpart, hlen, "host");
  }
  if (!u->host[0]) snprintf(u->host, sizeof u->host, "127.0.0.1");
  if (!u->port[0]) snprintf(u->port, sizeof u->port, "5672");
  if (slash && slash[1]) /* a query (?management=... for the host) is not ours: ignored */
    copy_decoded(u->vhost, sizeof u->vhost, slash + 1, strcspn(slash + 1, "?#"), "vhost");
}

/* ------------------------------------------------------------------ message building */

static void random_bytes(unsigned char *b, size_t n)
{
  int fd = open("/dev/urandom", O_RDONLY);
  size_t got = 0;
  if (fd >= 0) {
    while (got < n) {
      ssize_t r = read(fd, b + got, n - got);
      if (r <= 0) break;
      got += (size_t)r;
    }
    close(fd);
  }
  if (got < n) { /* no urandom: time and pid are unique enough for a bench */
    uint64_t x = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(now_s() * 1e9);
    for (size_t i = got; i < n; i++) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      b[i] = (unsigned char)(x >> 56);
    }
  }
}

/* A version-4 style UUID: the random base with the sequence number mixed into its last 8 bytes. */
static void make_uuid(const bench_t *b, uint64_t seq, char out[37])
{
  unsigned char u[16];
  memcpy(u, b->uuid_base, 16);
  for (int i = 0; i < 8; i++) u[8 + i] ^= (unsigned char)(seq >> (8 * (7 - i)));
  u[6] = (unsigned char)((u[6] & 0x0f) | 0x40);
  u[8] = (unsigned char)((u[8] & 0x3f) | 0x80);
  static const char hex[] = "0123456789abcdef";
  int o = 0;
  for (int i = 0; i < 16; i++) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out[o++] = '-';
    out[o++] = hex[u[i] >> 4];
    out[o++] = hex[u[i] & 15];
  }
  out[o] = 0;
}

static void put_str(pn_data_t *d, const char *s) { pn_data_put_string(d, pn_bytes(strlen(s), s)); }

static void init_message(bench_t *b)
{
  b->msg = pn_message();
  if (!b->msg) die("out of memory");
  pn_message_set_inferred(b->msg, true); /* a binary body is sent as one data section */
  pn_message_set_durable(b->msg, true);
  pn_message_set_subject(b->msg, b->event_type);
  pn_message_set_content_type(b->msg, "application/json");
  pn_data_t *props = pn_message_properties(b->msg);
  pn_data_put_map(props);
  pn_data_enter(props);
  put_str(props, "MessageType");          put_str(props, "EventRequest");
  put_str(props, "EventTypeId");          put_str(props, b->event_type);
  put_str(props, "To");                   put_str(props, b->event_type);
  put_str(props, "OriginatingMessageId"); put_str(props, "self");
  put_str(props, "ParentMessageId");      put_str(props, "self");
  put_str(props, "RetryCount");           pn_data_put_int(props, 0);
  pn_data_exit(props);
  b->body_cap = (size_t)b->payload + 64;
  b->body = malloc(b->body_cap);
  if (!b->body) die("out of memory");
  random_bytes(b->uuid_base, sizeof b->uuid_base);
}

static void send_one(bench_t *b)
{
  long i = ++b->sent;
  char id[37], group[32];
  make_uuid(b, (uint64_t)i, id);
  snprintf(group, sizeof group, "s%ld", i % b->sessions);
  pn_atom_t atom = { .type = PN_STRING, .u.as_bytes = pn_bytes(strlen(id), id) };
  pn_message_set_id(b->msg, atom);
  pn_message_set_correlation_id(b->msg, atom);
  pn_message_set_group_id(b->msg, group);
  if (b->buckets) {   /* FNV-1a of the session, low 8 bits, as the host routes (nh_amqp_msg.c) */
    uint32_t h = 2166136261u;
    for (const char *c = group; *c; c++) h = (h ^ (unsigned char)*c) * 16777619u;
    char key[600];
    int k = snprintf(key, sizeof key, "%s", b->event_type);
    for (int bit = 7; bit >= 0 && k < (int)sizeof key - 3; bit--)
      k += snprintf(key + k, sizeof key - (size_t)k, ".%u", (h >> bit) & 1u);
    pn_message_set_subject(b->msg, key);
  }
  struct timespec wall;
  clock_gettime(CLOCK_REALTIME, &wall);   /* as nimbus-host's own publishers stamp it */
  pn_message_set_creation_time(b->msg, (pn_timestamp_t)wall.tv_sec * 1000 + wall.tv_nsec / 1000000);
  int len = snprintf(b->body, b->body_cap, "{\"n\":%ld,\"pad\":\"", i);
  memset(b->body + len, 'x', (size_t)b->payload);
  len += (int)b->payload;
  memcpy(b->body + len, "\"}", 2);
  len += 2;
  pn_data_t *body = pn_message_body(b->msg);
  pn_data_clear(body);
  pn_data_put_binary(body, pn_bytes((size_t)len, b->body));

  uint64_t tag = (uint64_t)i;
  pn_delivery(b->link, pn_dtag((const char *)&tag, sizeof tag));
  if (pn_message_send(b->msg, b->link, &b->buf) < 0)
    die("encoding message %ld: %s", i, pn_error_text(pn_message_error(b->msg)));
}

static void send_some(bench_t *b)
{
  while (b->sent < b->n && pn_link_credit(b->link) > 0 && b->sent - b->settled < b->window) send_one(b);
}

/* ------------------------------------------------------------------ events */

static void close_conn(bench_t *b)
{
  if (b->closing) return;
  b->closing = true;
  pn_proactor_cancel_timeout(b->proactor); /* else the proactor never becomes inactive */
  pn_connection_close(b->conn);
}

static void fail_condition(bench_t *b, const char *where, pn_condition_t *c)
{
  if (c && pn_condition_is_set(c)) {
    fprintf(stderr, "nh-amqp-bench: %s: %s: %s\n", where, pn_condition_get_name(c),
            pn_condition_get_description(c) ? pn_condition_get_description(c) : "");
  } else {
    fprintf(stderr, "nh-amqp-bench: %s\n", where);
  }
  b->exit_code = 1;
}

static void top_up_credit(bench_t *b)
{
  int cur = pn_link_credit(b->link);
  if (cur > b->credit / 2) return;
  long give = b->credit - cur;
  if (give > b->n - b->granted) give = b->n - b->granted;
  if (give <= 0) return;
  pn_link_flow(b->link, (int)give);
  b->granted += give;
}

static void on_delivery(bench_t *b, pn_delivery_t *d)
{
  if (b->mode == MODE_SEND) {
    if (!pn_delivery_updated(d)) return;
    uint64_t st = pn_delivery_remote_state(d);
    if (!st && !pn_delivery_settled(d)) return; /* no outcome yet */
    if (st == PN_ACCEPTED) {
      b->accepted++;
    } else {
      if (!b->rejected++)
        snprintf(b->first_bad_state, sizeof b->first_bad_state, "%s",
                 st ? pn_disposition_type_name(st) : "settled without outcome");
    }
    pn_delivery_settle(d);
    b->settled++;
    if (b->settled == b->n) {
      b->t_last = now_s();
      b->finished = true;
      close_conn(b);
    } else {
      send_some(b);
    }
    return;
  }
  /* consume */
  if (!pn_delivery_readable(d) || pn_delivery_partial(d)) return;
  for (;;) {
    ssize_t r = pn_link_recv(b->link, b->scratch, b->scratch_size);
    if (r == PN_EOS || r == 0) break;
    if (r < 0) die("pn_link_recv: %zd", r);
  }
  pn_link_advance(b->link);
  if (b->received >= b->n) {
    /* RabbitMQ 3.10 can deliver past the credit granted (it seems to take the link-credit of
     * a flow frame as absolute, not net of the deliveries in flight): give those back. */
    pn_delivery_update(d, PN_RELEASED);
    pn_delivery_settle(d);
    b->extra++;
    return;
  }
  pn_delivery_update(d, PN_ACCEPTED);
  pn_delivery_settle(d);
  if (!b->received++) b->t_first = now_s();
  if (b->received == b->n) {
    b->t_last = now_s();
    b->finished = true;
    close_conn(b);
  } else {
    top_up_credit(b);
  }
}

static void handle(bench_t *b, pn_event_t *e)
{
  switch (pn_event_type(e)) {
  case PN_CONNECTION_INIT: {
    pn_connection_t *c = pn_event_connection(e);
    pn_connection_set_container(c, b->mode == MODE_SEND ? "nh-amqp-bench-send" : "nh-amqp-bench-consume");
    if (b->url.vhost[0]) {
      char hn[300];
      snprintf(hn, sizeof hn, "vhost:%s", b->url.vhost);
      pn_connection_set_hostname(c, hn);
    } else {
      pn_connection_set_hostname(c, b->url.host);
    }
    if (b->url.user[0]) pn_connection_set_user(c, b->url.user);
    if (b->url.pass[0]) pn_connection_set_password(c, b->url.pass);
    pn_connection_open(c);
    pn_session_t *s = pn_session(c);
    pn_session_open(s);
    if (b->mode == MODE_SEND) {
      b->link = pn_sender(s, "nh-amqp-bench-sender");
      pn_terminus_set_address(pn_link_target(b->link), b->address);
      pn_link_set_snd_settle_mode(b->link, PN_SND_UNSETTLED);
    } else {
      b->link = pn_receiver(s, "nh-amqp-bench-receiver");
      pn_terminus_set_address(pn_link_source(b->link), b->address);
      pn_link_set_snd_settle_mode(b->link, PN_SND_UNSETTLED);
      pn_link_set_rcv_settle_mode(b->link, PN_RCV_FIRST);
    }
    pn_link_open(b->link);
    if (b->mode == MODE_CONSUME) top_up_credit(b);
    break;
  }
  case PN_LINK_REMOTE_OPEN:
    if (pn_event_link(e) == b->link && b->t_open == 0) b->t_open = now_s();
    break;
  case PN_LINK_FLOW:
    if (b->mode == MODE_SEND && pn_event_link(e) == b->link) send_some(b);
    break;
  case PN_DELIVERY:
    on_delivery(b, pn_event_delivery(e));
    break;
  case PN_LINK_REMOTE_CLOSE:
  case PN_LINK_REMOTE_DETACH:
    if (!b->finished) {
      fail_condition(b, "the broker detached the link", pn_link_remote_condition(pn_event_link(e)));
      close_conn(b);
    }
    break;
  case PN_SESSION_REMOTE_CLOSE:
    if (!b->finished) {
      fail_condition(b, "the broker ended the session", pn_session_remote_condition(pn_event_session(e)));
      close_conn(b);
    }
    break;
  case PN_CONNECTION_REMOTE_CLOSE:
    if (!b->finished) fail_condition(b, "the broker closed the connection",
                                     pn_connection_remote_condition(pn_event_connection(e)));
    close_conn(b);
    break;
  case PN_TRANSPORT_CLOSED:
    if (!b->finished) fail_condition(b, "connection lost", pn_transport_condition(pn_event_transport(e)));
    pn_proactor_cancel_timeout(b->proactor); /* nothing left to wait for: become inactive */
    break;
  case PN_PROACTOR_TIMEOUT:
    if (b->mode == MODE_SEND)
      die("timed out: %ld of %ld sent, %ld settled (%ld accepted)", b->sent, b->n, b->settled, b->accepted);
    die("timed out: %ld of %ld consumed (credit granted %ld)", b->received, b->n, b->granted);
    break;
  default:
    break;
  }
}

/* ------------------------------------------------------------------ main */

static void print_result(bench_t *b)
{
  double secs = b->t_last - b->t_open;
  double rate = secs > 0 ? (double)b->n / secs : 0;
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  double cpu = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
               (double)ru.ru_stime.tv_usec / 1e6;
  if (b->mode == MODE_SEND) {
    printf("{\"sent\":%ld,\"accepted\":%ld,\"seconds\":%.6f,\"rate\":%.1f,\"connect_s\":%.6f,\"window\":%ld,"
           "\"payload\":%ld,\"cpu_s\":%.3f,\"max_rss_kb\":%ld}\n",
           b->sent, b->accepted, secs, rate, b->t_open - b->t_start, b->window, b->payload, cpu, ru.ru_maxrss);
  } else {
    printf("{\"consumed\":%ld,\"seconds\":%.6f,\"rate\":%.1f,\"connect_s\":%.6f,\"first_s\":%.6f,\"credit\":%ld,"
           "\"released_extra\":%ld,\"cpu_s\":%.3f,\"max_rss_kb\":%ld}\n",
           b->received, secs, rate, b->t_open - b->t_start, b->t_first - b->t_open, b->credit, b->extra, cpu,
           ru.ru_maxrss);
  }
  fflush(stdout);
}

int main(int argc, char **argv)
{
  static bench_t bench;
  bench_t *b = &bench;
  b->t_start = now_s();
  if (argc < 2) usage();
  if (strcmp(argv[1], "send") == 0) {
    if (argc < 6 || argc > 7) usage();
    b->mode = MODE_SEND;
    b->sessions = parse_long(argv[5], "SESSIONS", 1);
    b->payload = argc > 6 ? parse_long(argv[6], "PAYLOAD_BYTES", 0) : 64;
    b->window = env_long("NH_BENCH_WINDOW", 1000, 1);
    b->buckets = env_long("NH_BENCH_BUCKETS", 0, 0);
  } else if (strcmp(argv[1], "consume") == 0) {
    if (argc < 5 || argc > 6) usage();
    b->mode = MODE_CONSUME;
    b->credit = argc > 5 ? parse_long(argv[5], "CREDIT", 1) : 1000;
    if (b->credit > 1000000) die("CREDIT is too large");
  } else {
    usage();
  }
  parse_url(argv[2], &b->url);
  b->n = parse_long(argv[4], "N", 1);
  if (b->mode == MODE_SEND) {
    if (strlen(argv[3]) >= sizeof b->address) die("ADDRESS is too long");
    snprintf(b->address, sizeof b->address, "%s", argv[3]);
    const char *last = strrchr(b->address, '/');
    const char *et = last ? last + 1 : b->address;
    memcpy(b->event_type, et, strlen(et) + 1); /* shorter than address, same size */
    if (!b->event_type[0]) die("ADDRESS '%s' ends in '/': no event type (routing key) in it", b->address);
    /* with buckets the subject is the routing key: RabbitMQ takes it only when the address
     * names the exchange alone */
    if (b->buckets && last) b->address[last - b->address] = '\0';
    init_message(b);
  } else {
    if (strlen(argv[3]) + 12 >= sizeof b->address) die("QUEUE is too long");
    snprintf(b->address, sizeof b->address, "/amq/queue/%s", argv[3]);
    b->scratch_size = 64 * 1024;
    b->scratch = malloc(b->scratch_size);
    if (!b->scratch) die("out of memory");
  }
  long timeout_s = env_long("NH_BENCH_TIMEOUT", 300, 1);

  b->proactor = pn_proactor();
  b->conn = pn_connection();
  pn_transport_t *t = pn_transport();
  if (!b->proactor || !b->conn || !t) die("out of memory");
  /* Proton would pick ANONYMOUS (offered by RabbitMQ) even with a password set. */
  pn_sasl_t *sasl = pn_sasl(t);
  if (b->url.user[0]) {
    pn_sasl_allowed_mechs(sasl, "PLAIN");
    pn_sasl_set_allow_insecure_mechs(sasl, true);
  }
  char addr[PN_MAX_ADDR];
  pn_proactor_addr(addr, sizeof addr, b->url.host, b->url.port);
  pn_proactor_set_timeout(b->proactor, (pn_millis_t)(timeout_s * 1000));
  pn_proactor_connect2(b->proactor, b->conn, t, addr);

  bool running = true;
  while (running) {
    pn_event_batch_t *batch = pn_proactor_wait(b->proactor);
    pn_event_t *e;
    while ((e = pn_event_batch_next(batch))) {
      if (pn_event_type(e) == PN_PROACTOR_INACTIVE) running = false;
      else handle(b, e);
    }
    pn_proactor_done(b->proactor, batch);
  }
  pn_proactor_free(b->proactor);

  if (!b->finished) {
    if (!b->exit_code) fprintf(stderr, "nh-amqp-bench: connection ended before the run finished\n");
    return 1;
  }
  print_result(b);
  if (b->mode == MODE_SEND && b->rejected) {
    fprintf(stderr, "nh-amqp-bench: %ld of %ld messages were not accepted (first outcome: %s)\n", b->rejected, b->n,
            b->first_bad_state);
    return 1;
  }
  if (b->exit_code) return b->exit_code;
  return 0;
}
