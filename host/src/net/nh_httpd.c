/* HTTP server on libmicrohttpd, driven by the uv loop (see nh_httpd.h).
 *
 * MHD runs in external-loop epoll mode: it owns an epoll fd holding its listening
 * socket, its connections and its inter-thread channel (an eventfd, present because
 * suspend/resume is on). We watch that epoll fd with one uv_poll_t and call MHD_run on
 * readiness; a uv_timer_t follows MHD_get_timeout (connection timeouts, and 0 when MHD
 * still has buffered work). MHD_resume_connection writes to the eventfd, which makes the
 * epoll fd readable; we also "kick" the timer to 0 so the next pass runs even so.
 *
 * The listening socket is ours (socket/bind/listen), handed to MHD with
 * MHD_OPTION_LISTEN_SOCKET: bind errors come back with their errno, port 0 works, and
 * the socket is close-on-exec (a child started with os.execute must not inherit it).
 *
 * Paths and query values reach us as sent: the unescape callback is the identity, so a
 * %2F inside one path segment stays inside that segment; the Lua side decodes after
 * splitting.
 *
 * A stream (nh_httpd_stream_start) is a response from a content-reader callback of
 * unknown size (chunked). The reader hands MHD what the application buffered; with
 * nothing buffered it suspends the connection and returns 0 (MHD's way of waiting
 * without spinning), and a write resumes it. A suspended connection is invisible to
 * MHD, so its socket is watched for the peer's close by a uv_poll_t of its own (EPOLLRDHUP
 * only: nothing is read there, MHD's epoll set is untouched). The response's free
 * callback is the one place a stream ends: on_close, if the application still holds it,
 * then the memory. */
#include "nh_httpd.h"
#include "core/nh_log.h"
#include "core/nh_queue.h"
#include "core/nh_runtime.h"
#include "core/nh_util.h"

#include <microhttpd.h>

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#define NH_HTTPD_DEFAULT_MAX_BODY (1u << 20)
#define NH_HTTPD_DEFAULT_MAX_HEADERS 64
#define NH_HTTPD_DEFAULT_IDLE_S 60
/* A body over max_body is read and thrown away so the client gets its 413; past this
 * much more, the connection is simply closed. */
#define NH_HTTPD_DISCARD_CAP (16u << 20)
#define NH_HTTPD_DEFAULT_STREAM_MAX (1u << 20)
/* The most a stream's reader is asked for at once (MHD's own buffer bounds it too). */
#define NH_HTTPD_STREAM_BLOCK 16384

enum req_state {
  R_BODY,      /* headers seen, collecting the body */
  R_WAIT,      /* handed to the application, connection suspended */
  R_READY,     /* answered: response built, waiting for MHD to call us again */
  R_SENT,      /* response queued */
};

struct nh_httpd_req {
  nh_httpd_t *srv;                 /* NULL once orphaned (the connection is gone) */
  struct MHD_Connection *conn;
  enum req_state state;
  int suspended;
  int too_big;
  int counted;                     /* included in the server's inflight count */
  char *method, *path;
  char *body;
  size_t len, cap, discarded;
  struct MHD_Response *resp;
  unsigned status;
  nh_queue_t node;                 /* the server's live requests (srv->reqs) */
};

struct nh_httpd_stream {
  nh_httpd_t *srv;
  struct MHD_Connection *conn;     /* valid while MHD holds the response */
  nh_queue_t node;                 /* srv->streams */
  char *buf;
  size_t off, len, cap, limit;     /* unsent bytes: buf[off..len) */
  int app;                         /* the application holds the handle (until end or on_close) */
  int ended;                       /* end the body once the buffer is sent */
  int failed;                      /* dropped for not reading, or the peer closed: abort the body */
  int suspended;                   /* parked by the reader with nothing to send */
  uv_poll_t *hup;                  /* watches for the peer's close while suspended */
  nh_httpd_stream_close_cb on_close;
  void *ud;
};

struct nh_httpd {
  uv_loop_t *loop;
  struct MHD_Daemon *d;
  uv_poll_t poll;
  uv_timer_t timer;
  int open_handles;
  int port;
  size_t max_body;
  unsigned max_headers;
  size_t stream_max;
  nh_httpd_request_cb on_request;
  void *data;
  int in_run;           /* inside MHD_run: stopping the daemon must wait */
  int closing, close_pending;
  int inflight;         /* requests handed to the application and not yet sent */
  int quiesced;         /* no longer accepting (a retiring generation) */
  nh_queue_t reqs;                 /* live requests, newest first */
  nh_queue_t streams;              /* streams whose response MHD still holds */
  struct sockaddr_storage bound;   /* for listening_here() */
  socklen_t bound_len;
  const void *owner;
  char *owner_key;
  nh_queue_t reg_node;             /* registry, while listening */
};

/* Servers of this runtime that listen now (all VM generations): the runtime's list
 * under this key. */
static const char registry_key = 'r';
static nh_queue_t *registry(uv_loop_t *loop) { return nh_runtime_list(nh_runtime_of(loop), &registry_key); }

/* Harmless when s is not registered (quiesced already, or never started). */
static void reg_remove(nh_httpd_t *s) { nh_queue_remove(&s->reg_node); }

/* Another generation of this process (a VM being replaced) listens on this address. */
static int listening_here(uv_loop_t *loop, const struct sockaddr *sa, socklen_t len, const void *owner,
                          const char *key)
{
  nh_queue_t *q, *reg = registry(loop);
  nh_queue_foreach(q, reg) {
    const nh_httpd_t *s = nh_queue_data(q, nh_httpd_t, reg_node);
    if (s->bound_len == len && memcmp(&s->bound, sa, len) == 0 && s->owner != owner && key && s->owner_key &&
        strcmp(s->owner_key, key) == 0)
      return 1;
  }
  return 0;
}

/* ---------------------------------------------------------------- helpers */

static void req_link(nh_httpd_t *s, nh_httpd_req_t *r) { nh_queue_insert_head(&s->reqs, &r->node); }

/* Harmless on a request unlinked already (do_close, then on_completed). */
static void req_unlink(nh_httpd_req_t *r) { nh_queue_remove(&r->node); }

static void req_free(nh_httpd_req_t *r)
{
  if (r->resp) MHD_destroy_response(r->resp);
  free(r->method);
  free(r->path);
  free(r->body);
  free(r);
}

static void timer_cb(uv_timer_t *h);

/* An idle server does not keep the loop alive (an interpreter-mode script ends when
 * its work is done), but a request in flight does, until its response is sent. */
static void inflight_add(nh_httpd_t *s, nh_httpd_req_t *r, int delta)
{
  if ((delta > 0) == (r->counted != 0)) return;
  r->counted = delta > 0;
  int was = s->inflight;
  s->inflight += delta;
  if (s->closing) return;
  if (was == 0 && s->inflight > 0) {
    uv_ref((uv_handle_t *)&s->poll);
    uv_ref((uv_handle_t *)&s->timer);
  } else if (was > 0 && s->inflight == 0) {
    uv_unref((uv_handle_t *)&s->poll);
    uv_unref((uv_handle_t *)&s->timer);
  }
}

static void kick(nh_httpd_t *s)
{
  if (s->d && !s->closing) uv_timer_start(&s->timer, timer_cb, 0, 0);
}

static struct MHD_Response *json_error_response(const char *json)
{
  struct MHD_Response *resp =
      MHD_create_response_from_buffer(strlen(json), (void *)json, MHD_RESPMEM_PERSISTENT);
  if (resp) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
  return resp;
}

/* Queues a short JSON error; `json` must be a static string. */
static enum MHD_Result queue_error(nh_httpd_req_t *r, unsigned status, const char *json)
{
  struct MHD_Response *resp = json_error_response(json);
  if (!resp) return MHD_NO;
  enum MHD_Result rc = MHD_queue_response(r->conn, status, resp);
  MHD_destroy_response(resp);
  r->state = R_SENT;
  return rc;
}

static enum MHD_Result queue_ready(nh_httpd_req_t *r)
{
  struct MHD_Response *resp = r->resp;
  r->resp = NULL;
  r->state = R_SENT;
  enum MHD_Result rc = MHD_queue_response(r->conn, r->status, resp);
  MHD_destroy_response(resp);
  if (rc != MHD_YES) nh_log_warn("httpd", "could not queue the %u response to %s %s", r->status, r->method, r->path);
  return rc;
}

/* ---------------------------------------------------------------- MHD callbacks */

static enum MHD_Result on_access(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                 const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
  (void)version;
  nh_httpd_t *s = cls;
  nh_httpd_req_t *r = *con_cls;

  if (!r) {   /* first call: request line and headers are in */
    r = nh_xcalloc(1, sizeof *r);
    r->srv = s;
    r->conn = c;
    r->state = R_BODY;
    req_link(s, r);
    *con_cls = r;
    if (s->closing)
      return queue_error(r, MHD_HTTP_SERVICE_UNAVAILABLE, "{\"error\":\"server shutting down\"}");
    int nh = MHD_get_connection_values(c, MHD_HEADER_KIND, NULL, NULL);
    if (nh > 0 && (unsigned)nh > s->max_headers)
      return queue_error(r, MHD_HTTP_REQUEST_HEADER_FIELDS_TOO_LARGE, "{\"error\":\"too many request headers\"}");
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl) {
      char *end;
      errno = 0;
      unsigned long long n = strtoull(cl, &end, 10);
      /* MHD itself rejects a malformed Content-Length with 400 before calling us */
      if (errno == 0 && end != cl && n > s->max_body)
        return queue_error(r, 413 /* Content Too Large */, "{\"error\":\"request body too large\"}");
      if (errno == 0 && end != cl && n > 0) {   /* reserve, but not more than 64 KiB before data comes */
        r->cap = n < 65536 ? (size_t)n : 65536;
        r->body = nh_xmalloc(r->cap);
      }
    }
    return MHD_YES;
  }

  if (r->state == R_READY) return queue_ready(r);

  if (*upload_size) {
    size_t n = *upload_size;
    *upload_size = 0;
    if (r->state != R_BODY) return MHD_YES;
    if (!r->too_big && n > s->max_body - r->len) {
      r->too_big = 1;
      free(r->body);
      r->body = NULL;
      r->len = r->cap = 0;
    }
    if (r->too_big) {
      r->discarded += n;
      return r->discarded > NH_HTTPD_DISCARD_CAP ? MHD_NO : MHD_YES;
    }
    if (r->len + n > r->cap) {
      size_t cap = r->cap ? r->cap : 4096;
      while (cap < r->len + n) cap *= 2;
      if (cap > s->max_body) cap = s->max_body;
      r->body = nh_xrealloc(r->body, cap);
      r->cap = cap;
    }
    memcpy(r->body + r->len, upload, n);
    r->len += n;
    return MHD_YES;
  }

  if (r->state != R_BODY) return MHD_YES;   /* not expected: R_WAIT is suspended, R_SENT done */
  if (r->too_big) return queue_error(r, 413 /* Content Too Large */, "{\"error\":\"request body too large\"}");

  if (s->closing)
    return queue_error(r, MHD_HTTP_SERVICE_UNAVAILABLE, "{\"error\":\"server shutting down\"}");
  /* the whole request is in */
  r->method = nh_xstrdup(method);
  r->path = nh_xstrdup(url);
  r->state = R_WAIT;
  inflight_add(s, r, 1);
  s->on_request(s->data, r);
  if (r->state == R_READY) return queue_ready(r);   /* answered on the spot */
  MHD_suspend_connection(c);
  r->suspended = 1;
  return MHD_YES;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
  (void)c;
  (void)toe;
  nh_httpd_t *s = cls;
  nh_httpd_req_t *r = *con_cls;
  if (!r) return;
  *con_cls = NULL;
  req_unlink(r);
  inflight_add(s, r, -1);
  if (r->state == R_WAIT) {
    /* the application still owns it: nh_httpd_respond will free it */
    r->srv = NULL;
    r->conn = NULL;
    r->suspended = 0;
    return;
  }
  req_free(r);
}

static size_t unescape_none(void *cls, struct MHD_Connection *c, char *s)
{
  (void)cls;
  (void)c;
  return strlen(s);
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
  (void)cls;
  char buf[512];
  vsnprintf(buf, sizeof buf, fmt, ap);
  size_t n = strlen(buf);
  while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r')) buf[--n] = '\0';
  /* a stream whose client left ends its body with an error, on purpose: not news */
  if (strstr(buf, "application error generating response")) nh_log_debug("httpd", "libmicrohttpd: %s", buf);
  else nh_log_info("httpd", "libmicrohttpd: %s", buf);
}

/* ---------------------------------------------------------------- loop glue */

static void do_close(nh_httpd_t *s);
static void stream_resume(nh_httpd_stream_t *st, int kick_now);

static void run_mhd(nh_httpd_t *s)
{
  if (!s->d || s->closing) return;
  s->in_run++;
  MHD_run(s->d);
  s->in_run--;
  if (s->close_pending) {
    do_close(s);
    return;
  }
  MHD_UNSIGNED_LONG_LONG ms;
  if (MHD_get_timeout(s->d, &ms) == MHD_YES)
    uv_timer_start(&s->timer, timer_cb, (uint64_t)ms, 0);
  else
    uv_timer_stop(&s->timer);
}

static void poll_cb(uv_poll_t *h, int status, int events)
{
  (void)events;
  nh_httpd_t *s = h->data;
  if (status < 0) nh_log_warn("httpd", "poll error on the server's epoll fd: %s", uv_strerror(status));
  run_mhd(s);
}

static void timer_cb(uv_timer_t *h) { run_mhd(h->data); }

static void handle_closed(uv_handle_t *h)
{
  nh_httpd_t *s = h->data;
  if (--s->open_handles == 0) {
    free(s->owner_key);
    free(s);
  }
}

void nh_httpd_quiesce(nh_httpd_t *s)
{
  if (!s || s->closing || !s->d || s->quiesced) return;
  s->quiesced = 1;
  reg_remove(s);
  MHD_socket fd = MHD_quiesce_daemon(s->d);
  if (fd != MHD_INVALID_SOCKET) close(fd);
}

static void do_close(nh_httpd_t *s)
{
  s->close_pending = 0;
  reg_remove(s);
  /* stop watching the epoll fd before MHD closes it */
  uv_poll_stop(&s->poll);
  uv_close((uv_handle_t *)&s->poll, handle_closed);
  uv_timer_stop(&s->timer);
  uv_close((uv_handle_t *)&s->timer, handle_closed);
  /* MHD_stop_daemon panics on suspended connections: resume them first. The stop then
   * closes every connection; on_completed orphans requests the application holds. */
  int answered = 0;
  nh_queue_t *q;
  nh_queue_foreach(q, &s->reqs) {
    nh_httpd_req_t *r = nh_queue_data(q, nh_httpd_req_t, node);
    if (r->suspended) {
      r->suspended = 0;
      MHD_resume_connection(r->conn);
    }
    answered += r->state == R_READY;
  }
  /* Streams end now: resumed, their readers give what is buffered, then the end of the
   * body (s->closing). The pass below sends it when the sockets take it. */
  nh_queue_foreach(q, &s->streams) {
    stream_resume(nh_queue_data(q, nh_httpd_stream_t, node), 0);
    answered++;
  }
  /* Best effort: one last pass queues and writes the answers that are ready (the 503s
   * of routes cancelled because their VM is closing). New requests get 503 now. */
  if (answered) {
    s->in_run++;
    MHD_run(s->d);
    s->in_run--;
  }
  MHD_stop_daemon(s->d);
  s->d = NULL;
  /* on_completed only runs for connections MHD told the application about */
  while (!nh_queue_empty(&s->reqs)) {
    nh_httpd_req_t *r = nh_queue_data(nh_queue_head(&s->reqs), nh_httpd_req_t, node);
    req_unlink(r);
    if (r->state == R_WAIT) {
      r->srv = NULL;
      r->conn = NULL;
    } else {
      req_free(r);
    }
  }
}

void nh_httpd_close(nh_httpd_t *s)
{
  if (!s || s->closing) return;
  s->closing = 1;
  if (s->in_run) s->close_pending = 1;
  else do_close(s);
}

/* ---------------------------------------------------------------- start */

static int fail_errno(nh_error_t *err, char errname[32], int e, const char *what, const char *host, int port)
{
  snprintf(errname, 32, "%s", uv_err_name(-e));
  return nh_error_set(err, NH_EFAIL, "cannot %s %s:%d: %s", what, host, port, strerror(e));
}

nh_httpd_t *nh_httpd_start(uv_loop_t *loop, const nh_httpd_opts_t *o, nh_error_t *err, char errname[32])
{
  errname[0] = '\0';
  const char *host = o->host ? o->host : "127.0.0.1";
  if (o->port < 0 || o->port > 65535) {
    snprintf(errname, 32, "EINVAL");
    nh_error_set(err, NH_EUSAGE, "port must be 0..65535, got %d", o->port);
    return NULL;
  }
  union {
    struct sockaddr sa;
    struct sockaddr_in in4;
    struct sockaddr_in6 in6;
  } addr;
  memset(&addr, 0, sizeof addr);
  socklen_t alen;
  int ipv6 = 0;
  const char *numeric = strcmp(host, "localhost") == 0 ? "127.0.0.1" : host;
  if (uv_ip4_addr(numeric, o->port, &addr.in4) == 0) {
    alen = sizeof addr.in4;
  } else if (uv_ip6_addr(numeric, o->port, &addr.in6) == 0) {
    alen = sizeof addr.in6;
    ipv6 = 1;
  } else {
    snprintf(errname, 32, "EINVAL");
    nh_error_set(err, NH_EUSAGE, "bad host \"%s\": give a numeric IPv4 or IPv6 address, or localhost", host);
    return NULL;
  }
  if (!MHD_is_feature_supported(MHD_FEATURE_EPOLL)) {
    snprintf(errname, 32, "ENOTSUP");
    nh_error_set(err, NH_EFAIL, "this libmicrohttpd was built without epoll support");
    return NULL;
  }

  int fd = socket(addr.sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    fail_errno(err, errname, errno, "create a socket for", host, o->port);
    return NULL;
  }
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);   /* TIME_WAIT */
  /* SO_REUSEPORT lets a reloaded adapter's server bind beside the previous generation's,
   * so the port never stops listening. It would also let a second process share the
   * port silently, so unless this process already listens there, a plain probe bind
   * first reports a port taken by anyone else. */
  if (o->port != 0 && !listening_here(loop, &addr.sa, alen, o->owner, o->owner_key)) {
    int probe = socket(addr.sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (probe >= 0) {
      setsockopt(probe, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      int brc = bind(probe, &addr.sa, alen);
      int e = errno;
      close(probe);
      if (brc != 0) {
        fail_errno(err, errname, e, "listen on", host, o->port);
        close(fd);
        return NULL;
      }
    }
  }
  setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
  if (bind(fd, &addr.sa, alen) != 0) {
    fail_errno(err, errname, errno, "listen on", host, o->port);
    close(fd);
    return NULL;
  }
  if (listen(fd, 511) != 0) {
    fail_errno(err, errname, errno, "listen on", host, o->port);
    close(fd);
    return NULL;
  }
  alen = sizeof addr;
  getsockname(fd, &addr.sa, &alen);
  int port = ntohs(ipv6 ? addr.in6.sin6_port : addr.in4.sin_port);

  nh_httpd_t *s = nh_xcalloc(1, sizeof *s);
  s->loop = loop;
  s->port = port;
  memcpy(&s->bound, &addr, alen);
  s->bound_len = alen;
  s->owner = o->owner;
  s->owner_key = o->owner_key ? strdup(o->owner_key) : NULL;
  s->max_body = o->max_body ? o->max_body : NH_HTTPD_DEFAULT_MAX_BODY;
  s->max_headers = o->max_headers ? o->max_headers : NH_HTTPD_DEFAULT_MAX_HEADERS;
  s->stream_max = o->stream_max_buffer ? o->stream_max_buffer : NH_HTTPD_DEFAULT_STREAM_MAX;
  s->on_request = o->on_request;
  s->data = o->data;
  nh_queue_init(&s->reqs);
  nh_queue_init(&s->streams);
  nh_queue_init(&s->reg_node);

  struct MHD_OptionItem ops[] = {
    { MHD_OPTION_LISTEN_SOCKET, fd, NULL },
    { MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)on_completed, s },
    { MHD_OPTION_CONNECTION_TIMEOUT, o->idle_timeout_s ? o->idle_timeout_s : NH_HTTPD_DEFAULT_IDLE_S, NULL },
    { MHD_OPTION_UNESCAPE_CALLBACK, (intptr_t)unescape_none, NULL },
    { o->max_connections ? MHD_OPTION_CONNECTION_LIMIT : MHD_OPTION_END, o->max_connections, NULL },
    { MHD_OPTION_END, 0, NULL },
  };
  unsigned flags = MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG | (ipv6 ? MHD_USE_IPv6 : 0);
  /* the logger goes first, or MHD warns that earlier messages may go to stderr */
  s->d = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, on_access, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
                          MHD_OPTION_ARRAY, ops, MHD_OPTION_END);
  if (!s->d) {
    snprintf(errname, 32, "EIO");
    nh_error_set(err, NH_EFAIL, "libmicrohttpd could not start a server on %s:%d", host, port);
    close(fd);
    free(s);
    return NULL;
  }
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_EPOLL_FD);
  int rc = info ? uv_poll_init(loop, &s->poll, info->epoll_fd) : UV_EINVAL;
  if (rc != 0) {
    snprintf(errname, 32, "%s", uv_err_name(rc));
    nh_error_set(err, NH_EFAIL, "cannot watch the server's epoll fd: %s", uv_strerror(rc));
    MHD_stop_daemon(s->d);
    free(s);
    return NULL;
  }
  uv_timer_init(loop, &s->timer);
  s->poll.data = s->timer.data = s;
  s->open_handles = 2;
  uv_poll_start(&s->poll, UV_READABLE, poll_cb);
  uv_unref((uv_handle_t *)&s->poll);
  uv_unref((uv_handle_t *)&s->timer);
  nh_queue_insert_head(registry(loop), &s->reg_node);
  return s;
}

int nh_httpd_port(const nh_httpd_t *s) { return s->port; }

/* ---------------------------------------------------------------- requests */

const char *nh_httpd_req_method(const nh_httpd_req_t *r) { return r->method; }
const char *nh_httpd_req_path(const nh_httpd_req_t *r) { return r->path; }

const char *nh_httpd_req_body(const nh_httpd_req_t *r, size_t *len)
{
  *len = r->len;
  return r->body ? r->body : "";
}

void nh_httpd_req_drop_body(nh_httpd_req_t *r)
{
  free(r->body);
  r->body = NULL;
  r->len = r->cap = 0;
}

typedef struct kv_iter {
  nh_httpd_kv_cb cb;
  void *ud;
} kv_iter_t;

static enum MHD_Result kv_trampoline(void *cls, enum MHD_ValueKind kind, const char *key, size_t klen,
                                     const char *val, size_t vlen)
{
  (void)kind;
  kv_iter_t *it = cls;
  if (key) it->cb(it->ud, key, klen, val, vlen);
  return MHD_YES;
}

static int iterate(nh_httpd_req_t *r, enum MHD_ValueKind kind, nh_httpd_kv_cb cb, void *ud)
{
  if (!r->conn) return 0;
  kv_iter_t it = { cb, ud };
  return MHD_get_connection_values_n(r->conn, kind, kv_trampoline, &it);
}

int nh_httpd_req_headers(nh_httpd_req_t *r, nh_httpd_kv_cb cb, void *ud)
{
  return iterate(r, MHD_HEADER_KIND, cb, ud);
}

int nh_httpd_req_query(nh_httpd_req_t *r, nh_httpd_kv_cb cb, void *ud)
{
  return iterate(r, MHD_GET_ARGUMENT_KIND, cb, ud);
}

static int check_status(unsigned status, nh_error_t *err)
{
  if (status >= 200 && status <= 999) return 0;
  return nh_error_set(err, NH_EUSAGE, "status %u is not a final HTTP status (200..999)", status);
}

/* Adds the headers but Content-Length (MHD computes it, or chunks). 0, or -1 with err. */
static int add_headers(struct MHD_Response *resp, const nh_httpd_header_t *h, size_t nh, nh_error_t *err)
{
  for (size_t i = 0; i < nh; i++) {
    if (!h[i].name || !h[i].value) continue;
    if (strcasecmp(h[i].name, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0) continue;
    if (MHD_add_response_header(resp, h[i].name, h[i].value) != MHD_YES) {
      nh_error_set(err, NH_EUSAGE, "invalid response header %s (empty value, space or newline in it?)", h[i].name);
      return -1;
    }
  }
  return 0;
}

static struct MHD_Response *build_response(unsigned status, const nh_httpd_header_t *h, size_t nh, const char *body,
                                           size_t len, nh_error_t *err)
{
  if (check_status(status, err)) return NULL;
  struct MHD_Response *resp = MHD_create_response_from_buffer(len, (void *)(len ? body : ""), MHD_RESPMEM_MUST_COPY);
  if (!resp) {
    nh_error_set(err, NH_EFAIL, "out of memory building a response");
    return NULL;
  }
  if (add_headers(resp, h, nh, err)) {
    MHD_destroy_response(resp);
    return NULL;
  }
  return resp;
}

/* Hands a built response to a waiting request: queued on the next MHD pass (at once when
 * we are inside on_request). */
static void req_answer(nh_httpd_req_t *r, struct MHD_Response *resp, unsigned status)
{
  nh_httpd_req_drop_body(r);
  r->resp = resp;
  r->status = status;
  r->state = R_READY;
  if (r->suspended) {
    r->suspended = 0;
    MHD_resume_connection(r->conn);
    kick(r->srv);
  }
}

int nh_httpd_respond(nh_httpd_req_t *r, unsigned status, const nh_httpd_header_t *headers, size_t nheaders,
                     const char *body, size_t len, nh_error_t *err)
{
  if (!r->srv) {   /* orphaned: the server or the connection went away */
    req_free(r);
    return 0;
  }
  if (r->state != R_WAIT) return nh_error_set(err, NH_ESTATE, "request already answered");
  int rc = 0;
  struct MHD_Response *resp = build_response(status, headers, nheaders, body, len, err);
  if (!resp) {
    rc = -1;
    status = MHD_HTTP_INTERNAL_SERVER_ERROR;
    resp = json_error_response("{\"error\":\"internal error\"}");
  }
  req_answer(r, resp, status);
  return rc;
}

/* ---------------------------------------------------------------- streams */

static void hup_closed(uv_handle_t *h) { free(h); }

/* Closed while the connection is still suspended, so its descriptor is still open (MHD
 * closes it only after a resume): libuv's removal of it from the loop's epoll set cannot
 * hit a reused descriptor number. */
static void stream_unwatch(nh_httpd_stream_t *st)
{
  if (!st->hup) return;
  uv_close((uv_handle_t *)st->hup, hup_closed);
  st->hup = NULL;
}

static void stream_resume(nh_httpd_stream_t *st, int kick_now)
{
  if (!st->suspended) return;
  stream_unwatch(st);
  st->suspended = 0;
  MHD_resume_connection(st->conn);
  if (kick_now) kick(st->srv);
}

static void stream_drop_buffer(nh_httpd_stream_t *st)
{
  free(st->buf);
  st->buf = NULL;
  st->off = st->len = st->cap = 0;
}

/* The client closed its end (or the socket failed): abort the body, so MHD closes the
 * connection and the free callback reports it. A client that half-closes and still reads
 * is taken as gone too: an SSE client has nothing to send, closing is leaving. */
static void on_hup(uv_poll_t *h, int status, int events)
{
  (void)status;
  (void)events;
  nh_httpd_stream_t *st = h->data;
  st->failed = 1;
  stream_drop_buffer(st);
  stream_resume(st, 1);
}

/* Best effort: without the watch the peer's close is noticed at the next write. */
static void stream_watch(nh_httpd_stream_t *st)
{
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(st->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
  if (!ci) return;
  uv_poll_t *h = nh_xmalloc(sizeof *h);
  if (uv_poll_init_socket(st->srv->loop, h, ci->connect_fd) != 0) {
    free(h);
    return;
  }
  h->data = st;
  uv_unref((uv_handle_t *)h);
  if (uv_poll_start(h, UV_DISCONNECT, on_hup) != 0) {
    uv_close((uv_handle_t *)h, hup_closed);
    return;
  }
  st->hup = h;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *out, size_t max)
{
  (void)pos;
  nh_httpd_stream_t *st = cls;
  if (st->failed) return MHD_CONTENT_READER_END_WITH_ERROR;
  size_t n = st->len - st->off;
  if (n) {
    if (n > max) n = max;
    memcpy(out, st->buf + st->off, n);
    st->off += n;
    /* drained: the buffer is kept (at most the limit) for the next burst; letting it go
     * and growing it again each time cost a page fault per 4 KiB, a tenth of a tick */
    if (st->off == st->len) st->off = st->len = 0;
    return (ssize_t)n;
  }
  if (st->ended || st->srv->closing) return MHD_CONTENT_READER_END_OF_STREAM;
  /* nothing to send: rest until a write (0 with the connection suspended does not spin) */
  MHD_suspend_connection(st->conn);
  st->suspended = 1;
  stream_watch(st);
  return 0;
}

/* MHD let go of the response (sent, aborted, or the connection or server closed). */
static void stream_released(void *cls)
{
  nh_httpd_stream_t *st = cls;
  stream_unwatch(st);
  nh_queue_remove(&st->node);
  st->conn = NULL;
  if (st->app) {
    st->app = 0;
    st->on_close(st->ud);
  }
  free(st->buf);
  free(st);
}

/* Room for `more` bytes after the unsent ones (the caller checked the limit). */
static void stream_reserve(nh_httpd_stream_t *st, size_t more)
{
  if (st->off && st->len + more > st->cap) {
    memmove(st->buf, st->buf + st->off, st->len - st->off);
    st->len -= st->off;
    st->off = 0;
  }
  if (st->len + more <= st->cap) return;
  size_t cap = st->cap ? st->cap : 4096;
  while (cap < st->len + more) cap *= 2;
  if (cap > st->limit) cap = st->limit;
  st->buf = nh_xrealloc(st->buf, cap);
  st->cap = cap;
}

nh_httpd_stream_t *nh_httpd_stream_start(nh_httpd_req_t *r, unsigned status, const nh_httpd_header_t *headers,
                                         size_t nheaders, nh_httpd_stream_close_cb on_close, void *ud,
                                         nh_error_t *err)
{
  if (!r->srv) {   /* orphaned: the connection or the server went away */
    req_free(r);
    nh_error_set(err, NH_ESTATE, "the client went away before the stream started");
    return NULL;
  }
  if (r->state != R_WAIT) {
    nh_error_set(err, NH_ESTATE, "request already answered");
    return NULL;
  }
  nh_httpd_t *s = r->srv;
  nh_httpd_stream_t *st = nh_xcalloc(1, sizeof *st);
  st->srv = s;
  st->conn = r->conn;
  st->limit = s->stream_max;
  st->on_close = on_close;
  st->ud = ud;
  nh_queue_init(&st->node);
  struct MHD_Response *resp = NULL;
  if (check_status(status, err) == 0) {
    resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, NH_HTTPD_STREAM_BLOCK, stream_read, st,
                                             stream_released);
    if (!resp) nh_error_set(err, NH_EFAIL, "out of memory building a response");
  }
  if (resp && add_headers(resp, headers, nheaders, err)) {
    MHD_destroy_response(resp);   /* frees st: stream_released, with st->app still 0 */
    resp = NULL;
    st = NULL;
  }
  if (!resp) {
    free(st);
    req_answer(r, json_error_response("{\"error\":\"internal error\"}"), MHD_HTTP_INTERNAL_SERVER_ERROR);
    return NULL;
  }
  st->app = 1;
  nh_queue_insert_tail(&s->streams, &st->node);
  req_answer(r, resp, status);
  /* a stream never ends by itself: it must not keep the loop (and the process) alive */
  inflight_add(s, r, -1);
  return st;
}

/* Drops a client that does not read. A connection blocked on a full socket is not
 * suspended, and MHD would wait for it until its idle timeout: shutting the socket down
 * (not closing it, MHD owns the descriptor) makes MHD's next send fail, so it closes the
 * connection now and the free callback reports it. */
static void stream_drop(nh_httpd_stream_t *st)
{
  nh_log_warn("httpd", "dropping a stream client that does not read (%zu bytes waiting, limit %zu)",
              st->len - st->off, st->limit);
  st->failed = 1;
  stream_drop_buffer(st);
  if (st->suspended) {
    stream_resume(st, 1);
    return;
  }
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(st->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
  if (ci) shutdown(ci->connect_fd, SHUT_RDWR);
  kick(st->srv);
}

int nh_httpd_stream_write(nh_httpd_stream_t *st, const char *data, size_t len)
{
  if (!st->app || st->failed || st->ended || st->srv->closing) return -1;
  if (!len) return 0;
  size_t pending = st->len - st->off;   /* never above limit */
  if (len > st->limit - pending) {
    stream_drop(st);
    return -1;
  }
  stream_reserve(st, len);
  memcpy(st->buf + st->len, data, len);
  st->len += len;
  stream_resume(st, 1);
  return 0;
}

size_t nh_httpd_stream_buffered(const nh_httpd_stream_t *st) { return st->len - st->off; }

void nh_httpd_stream_end(nh_httpd_stream_t *st)
{
  if (!st || !st->app) return;
  st->app = 0;
  st->ended = 1;
  stream_resume(st, 1);
}
