/* Connecting to the PostgreSQL store: the same libpq state machine (PQconnectStartParams,
 * then PQconnectPoll until it says OK or FAILED) driven two ways, by poll(2) for the CLI
 * and by a uv_poll_t on the host's loop, under a deadline either way (libpq enforces
 * connect_timeout only in its own blocking PQconnectdb). */
#include "nh_pg_int.h"
#include "core/nh_util.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int64_t mono_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---------------------------------------------------------------- blocking */

int nh_pg_connect(const char *url, PGconn **out, nh_error_t *err)
{
  *out = NULL;
  nh_pg_target_t t;
  int rc = nh_pg_target_init(&t, url, err);
  int64_t deadline = t.timeout_s > 0 ? mono_ms() + (int64_t)t.timeout_s * 1000 : 0;
  for (int i = 0; rc == NH_OK && i < t.nhosts; i++) {
    const char *name = nh_pg_target_name(&t, i);
    if (!name) continue;
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM }, *ai = NULL;
    int g = getaddrinfo(name, NULL, &hints, &ai);
    if (g != 0 || nh_pg_target_found(&t, i, ai) == 0)
      rc = nh_pg_explain_unresolved(&t, name, g != 0 ? gai_strerror(g) : "no IPv4 or IPv6 address", err);
    if (ai) freeaddrinfo(ai);
  }
  if (rc) {
    nh_pg_target_free(&t);
    return rc;
  }
  nh_pg_target_params(&t);
  PGconn *conn = nh_pg_target_start(&t);
  if (PQstatus(conn) == CONNECTION_BAD) rc = nh_pg_explain_params(conn, &t, err);
  PostgresPollingStatusType st = rc ? PGRES_POLLING_FAILED : PGRES_POLLING_WRITING;
  while (st != PGRES_POLLING_OK && st != PGRES_POLLING_FAILED) {
    if (st == PGRES_POLLING_READING || st == PGRES_POLLING_WRITING) {
      /* PQsocket each time: libpq opens a new socket for each address it moves on to */
      struct pollfd p = { .fd = PQsocket(conn), .events = st == PGRES_POLLING_READING ? POLLIN : POLLOUT };
      int wait = -1;
      if (deadline) {
        int64_t left = deadline - mono_ms();
        wait = left > 0 ? (int)left : 0;
      }
      int n = poll(&p, 1, wait);
      if (n < 0 && errno == EINTR) continue;
      if (n == 0) {
        rc = nh_pg_explain_timeout(conn, &t, NULL, err);
        break;
      }
    }
    st = PQconnectPoll(conn);
  }
  if (!rc && st == PGRES_POLLING_FAILED) rc = nh_pg_explain_connect(conn, &t, err);
  nh_pg_target_free(&t);
  if (rc) {
    PQfinish(conn);
    return rc;
  }
  nh_pg_conn_ready(conn);
  *out = conn;
  return NH_OK;
}

/* ---------------------------------------------------------------- on the loop */

struct nh_pg_connect {
  uv_loop_t *loop;
  nh_pg_connect_cb cb;
  void *data;
  nh_pg_target_t t;
  uv_timer_t timer;             /* the deadline; also what defers cb when the URL is refused at once */
  uv_poll_t *poll;              /* on the connection's socket, replaced when the socket is */
  int poll_fd;
  uv_getaddrinfo_t *gai;        /* the lookup under way */
  int next;                     /* the host entry to look up next */
  PGconn *conn;
  int handles;                  /* handles open; cb runs when the last has closed */
  int done, rc;
  nh_error_t err;
};

static void on_closed(uv_handle_t *h)
{
  nh_pg_connect_t *req = h->data;
  if (h != (uv_handle_t *)&req->timer) free(h);
  if (--req->handles > 0) return;
  req->cb(req->data, req->rc ? NULL : req->conn, req->rc ? &req->err : NULL);
  nh_pg_target_free(&req->t);
  free(req);
}

static void close_poll(nh_pg_connect_t *req)
{
  if (!req->poll) return;
  uv_close((uv_handle_t *)req->poll, on_closed);
  req->poll = NULL;
}

/* The outcome is known (rc, with req->err filled when not NH_OK): close everything, and
 * cb follows from on_closed. A lookup still running in the thread pool cannot be
 * stopped: it is left to free itself. */
static void finish(nh_pg_connect_t *req, int rc)
{
  if (req->done) return;
  req->done = 1;
  req->rc = rc;
  if (req->gai) {
    uv_cancel((uv_req_t *)req->gai);
    req->gai->data = NULL;
    req->gai = NULL;
  }
  /* the poll handle first: it must stop watching the socket before PQfinish closes it */
  close_poll(req);
  if (rc && req->conn) {
    PQfinish(req->conn);
    req->conn = NULL;
  }
  if (!rc) nh_pg_conn_ready(req->conn);
  uv_timer_stop(&req->timer);
  uv_close((uv_handle_t *)&req->timer, on_closed);
}

static void on_poll(uv_poll_t *h, int status, int events);

/* Waits for the socket to become readable or writable, as PQconnectPoll asked. libpq
 * may have closed the socket and opened another (the next address or host), and the
 * new one often gets the same number: so the old registration is always dropped
 * (uv_poll_stop) before arming, and a new number gets a new handle. */
static void watch_failed(nh_pg_connect_t *req, int r)
{
  finish(req, nh_error_set(&req->err, NH_EFAIL, "store %s: cannot watch the connection's socket on the loop: %s",
                           req->t.shown, uv_strerror(r)));
}

static void arm(nh_pg_connect_t *req, PostgresPollingStatusType st)
{
  int fd = PQsocket(req->conn);
  if (fd < 0) {
    finish(req, nh_pg_explain_connect(req->conn, &req->t, &req->err));
    return;
  }
  if (req->poll && req->poll_fd != fd) close_poll(req);
  if (req->poll) {
    uv_poll_stop(req->poll);
  } else {
    uv_poll_t *p = nh_xmalloc(sizeof *p);
    int r = uv_poll_init(req->loop, p, fd);
    if (r < 0) {
      free(p);
      watch_failed(req, r);
      return;
    }
    p->data = req;
    req->poll = p;
    req->poll_fd = fd;
    req->handles++;
  }
  int r = uv_poll_start(req->poll, st == PGRES_POLLING_READING ? UV_READABLE : UV_WRITABLE, on_poll);
  if (r < 0) watch_failed(req, r);   /* without a watch nothing would move the attempt on */
}

static void step(nh_pg_connect_t *req)
{
  for (;;) {
    PostgresPollingStatusType st = PQconnectPoll(req->conn);
    switch (st) {
    case PGRES_POLLING_READING:
    case PGRES_POLLING_WRITING:
      arm(req, st);
      return;
    case PGRES_POLLING_OK:
      finish(req, NH_OK);
      return;
    case PGRES_POLLING_FAILED:
      finish(req, nh_pg_explain_connect(req->conn, &req->t, &req->err));
      return;
    default:   /* PGRES_POLLING_ACTIVE, unused since PostgreSQL 7.4: ask again */
      continue;
    }
  }
}

static void on_poll(uv_poll_t *h, int status, int events)
{
  (void)status;   /* an error on the socket is libpq's to find and report */
  (void)events;
  nh_pg_connect_t *req = h->data;
  if (!req->done) step(req);
}

static void on_timer(uv_timer_t *h)
{
  nh_pg_connect_t *req = h->data;
  const char *name = req->gai ? nh_pg_target_name(&req->t, req->next) : NULL;
  finish(req, nh_pg_explain_timeout(req->conn, &req->t, name, &req->err));
}

static void begin(nh_pg_connect_t *req)
{
  nh_pg_target_params(&req->t);
  req->conn = nh_pg_target_start(&req->t);
  if (PQstatus(req->conn) == CONNECTION_BAD) {
    finish(req, nh_pg_explain_params(req->conn, &req->t, &req->err));
    return;
  }
  arm(req, PGRES_POLLING_WRITING);   /* PQconnectStart's documented first wait */
}

static void lookup_next(nh_pg_connect_t *req);

static void on_gai(uv_getaddrinfo_t *g, int status, struct addrinfo *res)
{
  nh_pg_connect_t *req = g->data;
  if (!req) {   /* abandoned by finish */
    uv_freeaddrinfo(res);
    free(g);
    return;
  }
  req->gai = NULL;
  const char *name = nh_pg_target_name(&req->t, req->next);
  if (status < 0 || nh_pg_target_found(&req->t, req->next, res) == 0)
    finish(req, nh_pg_explain_unresolved(&req->t, name, status < 0 ? uv_strerror(status) : "no IPv4 or IPv6 address",
                                         &req->err));
  uv_freeaddrinfo(res);
  free(g);
  if (req->done) return;
  req->next++;
  lookup_next(req);
}

static void lookup_next(nh_pg_connect_t *req)
{
  for (; req->next < req->t.nhosts; req->next++) {
    const char *name = nh_pg_target_name(&req->t, req->next);
    if (!name) continue;
    const struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
    uv_getaddrinfo_t *g = nh_xmalloc(sizeof *g);
    g->data = req;
    int r = uv_getaddrinfo(req->loop, g, on_gai, name, NULL, &hints);
    if (r < 0) {
      free(g);
      finish(req, nh_pg_explain_unresolved(&req->t, name, uv_strerror(r), &req->err));
      return;
    }
    req->gai = g;
    return;
  }
  begin(req);
}

nh_pg_connect_t *nh_pg_connect_start(uv_loop_t *loop, const char *url, nh_pg_connect_cb cb, void *data)
{
  nh_pg_connect_t *req = nh_xcalloc(1, sizeof *req);
  req->loop = loop;
  req->cb = cb;
  req->data = data;
  uv_timer_init(loop, &req->timer);
  req->timer.data = req;
  req->handles = 1;
  int rc = nh_pg_target_init(&req->t, url, &req->err);
  if (rc) {
    finish(req, rc);
    return req;
  }
  if (req->t.timeout_s > 0) uv_timer_start(&req->timer, on_timer, (uint64_t)req->t.timeout_s * 1000, 0);
  lookup_next(req);
  return req;
}

void nh_pg_connect_cancel(nh_pg_connect_t *req)
{
  if (!req || req->done) return;
  finish(req, nh_error_set(&req->err, NH_ESTATE, "store %s: connecting was cancelled", req->t.shown));
}
