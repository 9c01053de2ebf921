/* Unit tests for the streaming responses of net/nh_httpd.h: a real server on a free port,
 * real clients on plain sockets (the test reads them itself, so it decides who is slow).
 * Writes arrive in order, chunked; a client that goes away is reported once; a client
 * that does not read is dropped past the cap with the buffer bounded; closing the server
 * with streams open ends them and leaves no handle and no allocation behind (ASan). */
#include "nh_test.h"

#include "core/nh_log.h"
#include "core/nh_runtime.h"
#include "core/nh_util.h"
#include "net/nh_httpd.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#define MAX_STREAMS 16
#define CLIENT_BUF (1u << 20)

typedef struct fixture fixture_t;

typedef struct slot {
  fixture_t *fx;
  nh_httpd_stream_t *st;   /* NULL once ended or closed */
  int closes;              /* on_close calls */
} slot_t;

struct fixture {
  nh_runtime_t rt;
  nh_httpd_t *srv;
  uv_timer_t keeper;   /* server handles do not keep the loop alive: uv_run would not poll */
  int port;
  slot_t slots[MAX_STREAMS];
  int nstreams;
  const nh_httpd_header_t *stream_headers;   /* what the next stream starts with */
  size_t nheaders;
  int start_failed;
};

typedef struct client {
  int fd;
  char *buf;   /* all bytes received, NUL-terminated */
  size_t len;
  int eof;
} client_t;

/* ---------------------------------------------------------------- server side */

static void on_close(void *ud)
{
  slot_t *sl = ud;
  sl->closes++;
  sl->st = NULL;
}

static const nh_httpd_header_t sse_headers[] = { { "Content-Type", "text/event-stream" },
                                                 { "Cache-Control", "no-store" } };

static void on_request(void *data, nh_httpd_req_t *r)
{
  fixture_t *fx = data;
  nh_error_t err = { 0 };
  if (strcmp(nh_httpd_req_path(r), "/plain") == 0) {
    nh_httpd_respond(r, 200, NULL, 0, "hello", 5, &err);
    return;
  }
  slot_t *sl = &fx->slots[fx->nstreams];
  sl->fx = fx;
  sl->st = nh_httpd_stream_start(r, 200, fx->stream_headers, fx->nheaders, on_close, sl, &err);
  if (!sl->st) {
    fx->start_failed++;
    return;
  }
  fx->nstreams++;
  nh_httpd_stream_write(sl->st, "hello\n", 6);   /* at once, as an SSE route sends its first event */
}

static void never(uv_timer_t *t) { (void)t; }

static void fixture_free(void *p)
{
  fixture_t *fx = p;
  uv_close((uv_handle_t *)&fx->keeper, NULL);
  nh_httpd_close(fx->srv);
  nh_runtime_close(&fx->rt);
  free(fx);
}

static fixture_t *fixture_start(size_t stream_max)
{
  fixture_t *fx = nh_xcalloc(1, sizeof *fx);
  ASSERT_EQ_INT(nh_runtime_init(&fx->rt), 0);
  uv_timer_init(&fx->rt.loop, &fx->keeper);
  uv_timer_start(&fx->keeper, never, 3600 * 1000, 0);
  fx->stream_headers = sse_headers;
  fx->nheaders = 2;
  nh_httpd_opts_t o = { .port = 0, .on_request = on_request, .data = fx, .stream_max_buffer = stream_max };
  nh_error_t err = { 0 };
  char code[32];
  fx->srv = nh_httpd_start(&fx->rt.loop, &o, &err, code);
  if (!fx->srv) FAIL("nh_httpd_start: %s", err.msg);
  fx->port = nh_httpd_port(fx->srv);
  nh_test_on_cleanup(fixture_free, fx);
  return fx;
}

/* Closes the server and the runtime now; 0 when no handle was left open. */
static int fixture_close(fixture_t *fx)
{
  nh_test_cancel_cleanup(fixture_free, fx);
  uv_close((uv_handle_t *)&fx->keeper, NULL);
  nh_httpd_close(fx->srv);
  fx->srv = NULL;
  int left = nh_runtime_close(&fx->rt);
  free(fx);
  return left;
}

/* ---------------------------------------------------------------- client side */

static void client_free(void *p)
{
  client_t *c = p;
  if (c->fd >= 0) close(c->fd);
  free(c->buf);
  free(c);
}

/* Connects (rcvbuf > 0: that small a receive buffer, for a slow reader) and sends a GET. */
static client_t *client_get(fixture_t *fx, const char *path, int rcvbuf)
{
  client_t *c = nh_xcalloc(1, sizeof *c);
  c->buf = nh_xcalloc(1, CLIENT_BUF + 1);
  c->fd = socket(AF_INET, SOCK_STREAM, 0);
  nh_test_on_cleanup(client_free, c);
  ASSERT_TRUE(c->fd >= 0);
  if (rcvbuf > 0) setsockopt(c->fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
  struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)fx->port) };
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  ASSERT_EQ_INT(connect(c->fd, (struct sockaddr *)&sa, sizeof sa), 0);
  char req[256];
  /* plain answers end the connection, so the client sees them complete at EOF */
  int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n%s\r\n", path,
                   strcmp(path, "/plain") == 0 ? "Connection: close\r\n" : "");
  ASSERT_EQ_INT(send(c->fd, req, (size_t)n, 0), n);
  return c;
}

static void client_read(client_t *c)
{
  while (c->fd >= 0 && !c->eof && c->len < CLIENT_BUF) {
    ssize_t n = recv(c->fd, c->buf + c->len, CLIENT_BUF - c->len, MSG_DONTWAIT);
    if (n > 0) {
      c->len += (size_t)n;
      c->buf[c->len] = '\0';
    } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      c->eof = 1;
    } else {
      return;
    }
  }
}

static void client_hangup(client_t *c)
{
  close(c->fd);
  c->fd = -1;
}

/* The body of a chunked response so far (static buffer); *done once the last chunk came. */
static const char *client_body(const client_t *c, int *done)
{
  static char body[CLIENT_BUF + 1];
  size_t out = 0;
  *done = 0;
  body[0] = '\0';
  const char *p = strstr(c->buf, "\r\n\r\n");
  if (!p) return body;
  p += 4;
  const char *end = c->buf + c->len;
  while (p < end) {
    char *eol;
    unsigned long size = strtoul(p, &eol, 16);
    if (eol + 2 > end || eol[0] != '\r') break;
    const char *data = eol + 2;
    if (size == 0) {
      *done = 1;
      break;
    }
    if (data + size + 2 > end) break;   /* not all in yet */
    memcpy(body + out, data, size);
    out += size;
    p = data + size + 2;
  }
  body[out] = '\0';
  return body;
}

static int client_has(const client_t *c, const char *text)
{
  int done;
  return strstr(client_body(c, &done), text) != NULL;
}

/* ---------------------------------------------------------------- the loop */

typedef int (*cond_fn)(void *arg);

/* Runs the loop and reads the clients until cond(arg) holds; fails after 10 s. */
static void pump_until(fixture_t *fx, client_t **clients, int nclients, cond_fn cond, void *arg, const char *what)
{
  int64_t deadline = nh_test_mono_ms() + 10000;
  for (;;) {
    uv_run(&fx->rt.loop, UV_RUN_NOWAIT);
    for (int i = 0; i < nclients; i++) client_read(clients[i]);
    if (cond(arg)) return;
    if (nh_test_mono_ms() > deadline) FAIL("timed out waiting for %s", what);
    poll(NULL, 0, 1);
  }
}

/* Runs the loop for about ms milliseconds. */
static void pump_for(fixture_t *fx, client_t **clients, int nclients, int ms)
{
  int64_t until = nh_test_mono_ms() + ms;
  while (nh_test_mono_ms() < until) {
    uv_run(&fx->rt.loop, UV_RUN_NOWAIT);
    for (int i = 0; i < nclients; i++) client_read(clients[i]);
    poll(NULL, 0, 1);
  }
}

typedef struct want_streams {
  fixture_t *fx;
  int n;
} want_streams_t;

static int have_streams(void *arg)
{
  want_streams_t *w = arg;
  return w->fx->nstreams >= w->n;
}

static void wait_streams(fixture_t *fx, client_t **clients, int nclients, int n)
{
  want_streams_t w = { fx, n };
  pump_until(fx, clients, nclients, have_streams, &w, "the streams to start");
}

typedef struct want_text {
  client_t *c;
  const char *text;
} want_text_t;

static int has_text(void *arg)
{
  want_text_t *w = arg;
  return client_has(w->c, w->text);
}

static void wait_text(fixture_t *fx, client_t **clients, int nclients, client_t *c, const char *text)
{
  want_text_t w = { c, text };
  pump_until(fx, clients, nclients, has_text, &w, text);
}

typedef struct want_raw {
  client_t *c;
  const char *text;
} want_raw_t;

static int has_raw(void *arg)
{
  want_raw_t *w = arg;
  return strstr(w->c->buf, w->text) != NULL;
}

static int body_done(void *arg)
{
  int done;
  client_body(arg, &done);
  return done;
}

static int closed_once(void *arg) { return ((slot_t *)arg)->closes >= 1; }

static int client_eof(void *arg) { return ((client_t *)arg)->eof; }

/* ---------------------------------------------------------------- tests */

TEST(writes_arrive_in_order_chunked_and_end_cleanly)
{
  fixture_t *fx = fixture_start(0);
  client_t *c = client_get(fx, "/stream", 0);
  wait_streams(fx, &c, 1, 1);
  slot_t *sl = &fx->slots[0];
  char expect[8192] = "hello\n", line[32];
  for (int i = 0; i < 200; i++) {
    snprintf(line, sizeof line, "line %d\n", i);
    strcat(expect, line);
    ASSERT_EQ_INT(nh_httpd_stream_write(sl->st, line, strlen(line)), 0);
    /* some writes meet a resting (suspended) connection, the others a burst in progress */
    if (i % 10 == 9) wait_text(fx, &c, 1, c, line);
  }
  nh_httpd_stream_end(sl->st);
  sl->st = NULL;
  pump_until(fx, &c, 1, body_done, c, "the end of the body");
  int done;
  ASSERT_EQ_STR(client_body(c, &done), expect);
  ASSERT_CONTAINS(c->buf, "HTTP/1.1 200");
  ASSERT_CONTAINS(c->buf, "Content-Type: text/event-stream");
  ASSERT_CONTAINS(c->buf, "Cache-Control: no-store");
  ASSERT_TRUE(strcasestr(c->buf, "Transfer-Encoding: chunked") != NULL);
  ASSERT_EQ_INT(sl->closes, 0);   /* ended by the application: no on_close */
  ASSERT_EQ_INT(fixture_close(fx), 0);
}

TEST(other_requests_are_answered_while_streams_rest)
{
  fixture_t *fx = fixture_start(0);
  client_t *s1 = client_get(fx, "/stream", 0), *s2 = client_get(fx, "/stream", 0);
  client_t *all[3] = { s1, s2, NULL };
  wait_streams(fx, all, 2, 2);
  wait_text(fx, all, 2, s2, "hello");
  all[2] = client_get(fx, "/plain", 0);
  pump_until(fx, all, 3, client_eof, all[2], "the plain answer") ;
  ASSERT_CONTAINS(all[2]->buf, "hello");
  /* the two streams still take writes, each its own */
  ASSERT_EQ_INT(nh_httpd_stream_write(fx->slots[0].st, "one\n", 4), 0);
  ASSERT_EQ_INT(nh_httpd_stream_write(fx->slots[1].st, "two\n", 4), 0);
  wait_text(fx, all, 2, s1, "one\n");
  wait_text(fx, all, 2, s2, "two\n");
  ASSERT_FALSE(client_has(s1, "two"));
  ASSERT_EQ_INT(fixture_close(fx), 0);
}

TEST(a_client_that_disconnects_while_idle_is_reported_once)
{
  fixture_t *fx = fixture_start(0);
  client_t *c = client_get(fx, "/stream", 0);
  wait_streams(fx, &c, 1, 1);
  wait_text(fx, &c, 1, c, "hello");
  pump_for(fx, &c, 1, 20);   /* the stream rests, suspended: only the socket watch can tell */
  client_hangup(c);
  pump_until(fx, &c, 1, closed_once, &fx->slots[0], "on_close after the client hung up");
  pump_for(fx, &c, 1, 50);
  ASSERT_EQ_INT(fx->slots[0].closes, 1);
  ASSERT_EQ_INT(fixture_close(fx), 0);
}

TEST(a_client_that_disconnects_with_data_pending_is_reported_once)
{
  fixture_t *fx = fixture_start(0);
  client_t *c = client_get(fx, "/stream", 4096);
  wait_streams(fx, &c, 1, 1);
  slot_t *sl = &fx->slots[0];
  static char chunk[16384];
  memset(chunk, 'x', sizeof chunk);
  for (int i = 0; i < 32; i++) ASSERT_EQ_INT(nh_httpd_stream_write(sl->st, chunk, sizeof chunk), 0);
  pump_for(fx, NULL, 0, 20);   /* the client reads nothing: the sockets fill up */
  client_hangup(c);
  pump_until(fx, NULL, 0, closed_once, sl, "on_close after the client hung up mid-body");
  pump_for(fx, NULL, 0, 50);
  ASSERT_EQ_INT(sl->closes, 1);
  ASSERT_EQ_INT(fixture_close(fx), 0);
}

TEST(a_client_that_does_not_read_is_dropped_past_the_cap)
{
  fixture_t *fx = fixture_start(0);   /* the default cap, 1 MiB */
  nh_log_set_level(NH_LOG_ERROR);     /* the drop's warning is expected */
  client_t *c = client_get(fx, "/stream", 4096);
  wait_streams(fx, &c, 1, 1);
  slot_t *sl = &fx->slots[0];
  static char chunk[16384];
  memset(chunk, 'y', sizeof chunk);
  size_t total = 0, most = 0;
  int rc = 0;
  while (total < (64u << 20) && (rc = nh_httpd_stream_write(sl->st, chunk, sizeof chunk)) == 0) {
    total += sizeof chunk;
    size_t b = nh_httpd_stream_buffered(sl->st);
    if (b > most) most = b;
    uv_run(&fx->rt.loop, UV_RUN_NOWAIT);   /* the client never reads */
  }
  nh_log_set_level(NH_LOG_INFO);
  ASSERT_EQ_INT(rc, -1);
  ASSERT_CMP_INT(most, <=, 1u << 20);
  ASSERT_CMP_INT(total, <, 64u << 20);
  ASSERT_EQ_INT(nh_httpd_stream_write(sl->st, "z", 1), -1);   /* still -1 until on_close */
  pump_until(fx, NULL, 0, closed_once, sl, "on_close of the dropped client");
  ASSERT_EQ_INT(sl->closes, 1);
  /* the server is unharmed */
  client_t *p = client_get(fx, "/plain", 0);
  pump_until(fx, &p, 1, client_eof, p, "the plain answer");
  ASSERT_CONTAINS(p->buf, "hello");
  ASSERT_EQ_INT(fixture_close(fx), 0);
}

TEST(a_small_cap_is_honoured)
{
  fixture_t *fx = fixture_start(64u << 10);
  nh_log_set_level(NH_LOG_ERROR);
  client_t *c = client_get(fx, "/stream", 4096);
  wait_streams(fx, &c, 1, 1);
  slot_t *sl = &fx->slots[0];
  static char chunk[4096];
  memset(chunk, 'w', sizeof chunk);
  int rc = 0;
  for (int i = 0; i < 100000 && rc == 0; i++) {
    rc = nh_httpd_stream_write(sl->st, chunk, sizeof chunk);
    if (rc == 0) ASSERT_CMP_INT(nh_httpd_stream_buffered(sl->st), <=, 64u << 10);
    uv_run(&fx->rt.loop, UV_RUN_NOWAIT);
  }
  nh_log_set_level(NH_LOG_INFO);
  ASSERT_EQ_INT(rc, -1);
  pump_until(fx, NULL, 0, closed_once, sl, "on_close of the dropped client");
  ASSERT_EQ_INT(fixture_close(fx), 0);
}

TEST(closing_the_server_ends_open_streams_once_and_frees_everything)
{
  fixture_t *fx = fixture_start(0);
  client_t *cl[4];
  for (int i = 0; i < 4; i++) cl[i] = client_get(fx, "/stream", 0);
  wait_streams(fx, cl, 4, 4);
  for (int i = 0; i < 4; i++) wait_text(fx, cl, 4, cl[i], "hello");
  /* one resting, one with data waiting, one ended by the application with data waiting */
  ASSERT_EQ_INT(nh_httpd_stream_write(fx->slots[1].st, "pending\n", 8), 0);
  ASSERT_EQ_INT(nh_httpd_stream_write(fx->slots[2].st, "last\n", 5), 0);
  nh_httpd_stream_end(fx->slots[2].st);
  fx->slots[2].st = NULL;
  client_hangup(cl[3]);   /* and one whose client left just now */
  nh_httpd_close(fx->srv);
  fx->srv = NULL;
  ASSERT_EQ_INT(fx->slots[0].closes, 1);
  ASSERT_EQ_INT(fx->slots[1].closes, 1);
  ASSERT_EQ_INT(fx->slots[2].closes, 0);
  ASSERT_EQ_INT(fx->slots[3].closes, 1);
  for (int i = 0; i < 3; i++) pump_until(fx, cl, 3, client_eof, cl[i], "the clients to see the close");
  for (int i = 0; i < 4; i++) ASSERT_EQ_INT(fx->slots[i].closes, i == 2 ? 0 : 1);
  ASSERT_EQ_INT(fixture_close(fx), 0);
}

TEST(a_stream_that_cannot_start_answers_500_and_never_calls_on_close)
{
  fixture_t *fx = fixture_start(0);
  static const nh_httpd_header_t bad[] = { { "X-Bad", "a\nb" } };
  fx->stream_headers = bad;
  fx->nheaders = 1;
  nh_log_set_level(NH_LOG_ERROR);
  client_t *c = client_get(fx, "/stream", 0);
  want_raw_t w = { c, "HTTP/1.1 500" };
  pump_until(fx, &c, 1, has_raw, &w, "the 500");
  nh_log_set_level(NH_LOG_INFO);
  ASSERT_EQ_INT(fx->start_failed, 1);
  ASSERT_EQ_INT(fx->nstreams, 0);
  ASSERT_CONTAINS(c->buf, "HTTP/1.1 500");
  ASSERT_EQ_INT(fx->slots[0].closes, 0);
  ASSERT_EQ_INT(fixture_close(fx), 0);
}

NH_TEST_MAIN()
