/* Connecting to the PostgreSQL store: the same libpq state machine (PQconnectStartParams,
 * then PQconnectPoll until it says OK or FAILED) driven two ways, by poll(2) for the CLI
 * and by a uv_poll_t on the host's loop, under a deadline either way (libpq enforces
 * connect_timeout only in its own blocking PQconnectdb). Either way a caller may add
 * settings of its own beneath the URL's (the link's timeouts and keepalives: nh_pg_link.h). */
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

/* ---------------------------------------------------------------- the caller's settings */

/* A caller's settings, parsed (NULL when there are none). Only nimbus-host writes them,
 * so one libpq refuses is said as nimbus-host's bug, not the URL's. */
static int extra_parse(const char *extra, PQconninfoOption **out, nh_error_t *err)
{
  *out = NULL;
  if (!extra || !*extra) return NH_OK;
  char *why = NULL;
  *out = PQconninfoParse(extra, &why);
  if (*out) return NH_OK;
  nh_error_set(err, NH_EUSAGE, "connection settings \"%s\" (a bug of nimbus-host): %s", extra,
               why ? why : "out of memory");
  err->msg[strcspn(err->msg, "\n")] = '\0';
  PQfreemem(why);
  return NH_EUSAGE;
}

static int key_at(const char **keys, int n, const char *key)
{
  for (int i = 0; i < n; i++)
    if (!strcmp(keys[i], key)) return i;
  return -1;
}

/* The options libpq would send were none given here: the URL's, else PGOPTIONS' (or a
 * PGSERVICE file's), which giving options ourselves would otherwise silence. Caller frees. */
static char *own_options(const char **keys, const char **vals, int n)
{
  int at = key_at(keys, n, "options");
  if (at >= 0) return nh_xstrdup(vals[at]);
  char *own = NULL;
  PQconninfoOption *defs = PQconndefaults();
  for (const PQconninfoOption *o = defs; o && o->keyword; o++)
    if (!strcmp(o->keyword, "options") && o->val) own = nh_xstrdup(o->val);
  PQconninfoFree(defs);
  return own;
}

/* Adds `extra` to t's parameters (built by nh_pg_target_params) beneath the URL's: a
 * keyword the URL sets keeps the URL's value; options are joined, extra's first, since
 * the server applies -c settings in order and the last wins. *joined holds the joined
 * options (the caller frees it once the connection has started: libpq copies). */
static void extra_add(nh_pg_target_t *t, const PQconninfoOption *extra, char **joined)
{
  *joined = NULL;
  if (!extra) return;
  int n = 0, m = 0;
  while (t->keys[n]) n++;
  for (const PQconninfoOption *o = extra; o->keyword; o++) m += o->val != NULL;
  const char **keys = nh_xcalloc((size_t)(n + m + 1), sizeof *keys);
  const char **vals = nh_xcalloc((size_t)(n + m + 1), sizeof *vals);
  memcpy(keys, t->keys, sizeof *keys * (size_t)n);
  memcpy(vals, t->vals, sizeof *vals * (size_t)n);
  int k = n;
  for (const PQconninfoOption *o = extra; o->keyword; o++) {
    if (!o->val) continue;
    int at = key_at(keys, n, o->keyword);
    if (!strcmp(o->keyword, "options")) {
      char *own = own_options(keys, vals, n);
      size_t len = strlen(o->val) + (own ? strlen(own) : 0) + 2;
      *joined = nh_xmalloc(len);
      snprintf(*joined, len, "%s%s%s", o->val, own && *own ? " " : "", own ? own : "");
      free(own);
      if (at >= 0) {
        vals[at] = *joined;
        continue;
      }
      keys[k] = o->keyword;
      vals[k++] = *joined;
    } else if (at < 0) {
      keys[k] = o->keyword;
      vals[k++] = o->val;
    }
  }
  free(t->keys);
  free(t->vals);
  t->keys = keys;
  t->vals = vals;
}

/* ---------------------------------------------------------------- blocking */

int nh_pg_connect(const char *url, PGconn **out, nh_error_t *err)
{
  return nh_pg_connect_with(url, NULL, out, err);
}

int nh_pg_connect_with(const char *url, const char *extra, PGconn **out, nh_error_t *err)
{
  *out = NULL;
  PQconninfoOption *more = NULL;
  nh_pg_target_t t;
  int rc = nh_pg_target_init(&t, url, err);
  if (!rc) rc = extra_parse(extra, &more, err);
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
    PQconninfoFree(more);
    return rc;
  }
  nh_pg_target_params(&t);
  char *joined = NULL;
  extra_add(&t, more, &joined);
  PGconn *conn = nh_pg_target_start(&t);
  free(joined);
  PQconninfoFree(more);
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
  PQconninfoOption *extra;      /* the caller's settings (NULL: none) */
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
  PQconninfoFree(req->extra);
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
  char *joined = NULL;
  extra_add(&req->t, req->extra, &joined);
  req->conn = nh_pg_target_start(&req->t);
  free(joined);
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
  return nh_pg_connect_start_with(loop, url, NULL, cb, data);
}

nh_pg_connect_t *nh_pg_connect_start_with(uv_loop_t *loop, const char *url, const char *extra, nh_pg_connect_cb cb,
                                          void *data)
{
  nh_pg_connect_t *req = nh_xcalloc(1, sizeof *req);
  req->loop = loop;
  req->cb = cb;
  req->data = data;
  uv_timer_init(loop, &req->timer);
  req->timer.data = req;
  req->handles = 1;
  int rc = nh_pg_target_init(&req->t, url, &req->err);
  if (!rc) rc = extra_parse(extra, &req->extra, &req->err);
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
