/* One AMQP connection: proton's connection driver pumped from a uv_tcp_t on the loop
 * thread (no proton thread, no proactor). Name lookup with uv_getaddrinfo, TLS with
 * pn_ssl (peer verification on unless the URL says verify=0), SASL PLAIN forced when
 * credentials are given (proton would otherwise pick ANONYMOUS and a wrong password
 * would "work"), heartbeats from the idle time-out, and reconnection with jittered
 * exponential backoff until closed. */
#include "nh_amqp_int.h"
#include "core/nh_log.h"
#include "core/nh_util.h"

#include <proton/condition.h>
#include <proton/connection.h>
#include <proton/event.h>
#include <proton/sasl.h>
#include <proton/ssl.h>
#include <proton/transport.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NH_BACKOFF_MIN_MS 250
#define NH_BACKOFF_MAX_MS 30000
#define NH_READ_CHUNK 65536
#define NH_STABLE_MS 10000

typedef enum { C_IDLE, C_RESOLVING, C_CONNECTING, C_OPEN, C_CLOSING_TCP, C_WAITING, C_CLOSED } cstate_t;

struct nh_amqp_conn {
  uv_loop_t *loop;
  const nh_amqp_url_t *url;
  char *container;
  nh_amqp_conn_cbs_t cbs;
  void *data;
  cstate_t state;
  int stopping;                  /* closed for good: no reconnect */
  int attempt;                   /* failed attempts since the last open */
  int up;                        /* the remote open arrived on this connection */
  uint64_t up_since;
  int fatal;
  char why[512];                 /* what ended the connection */
  int why_io;                    /* why is a socket error (a protocol condition may replace it) */
  uv_getaddrinfo_t gai;
  uv_connect_t connect_req;
  uv_tcp_t tcp;
  int tcp_open;
  uv_timer_t tick, retry;
  int writes;                    /* uv_write requests in flight */
  int flushing, again;           /* inside nh_amqp_conn_flush; asked again meanwhile */
  pn_connection_driver_t drv;
  int drv_open;
  pn_ssl_domain_t *ssl;
  void (*closed_cb)(void *);
  void *closed_data;
  int handles;                   /* timers still to close at the end */
  char rbuf[NH_READ_CHUNK];
};

static void try_connect(nh_amqp_conn_t *c);
static void teardown(nh_amqp_conn_t *c);

pn_connection_t *nh_amqp_conn_pn(nh_amqp_conn_t *c)
{
  return c->state == C_OPEN && c->drv_open && c->up ? c->drv.connection : NULL;
}

static void retry_cb(uv_timer_t *t)
{
  nh_amqp_conn_t *c = t->data;
  if (!c->stopping) try_connect(c);
}

static void schedule_retry(nh_amqp_conn_t *c)
{
  c->state = C_WAITING;
  if (c->fatal) return;   /* the owner is told (on_down) and closes us */
  int64_t delay = nh_backoff_ms(NH_BACKOFF_MIN_MS, NH_BACKOFF_MAX_MS, ++c->attempt);
  nh_log_warn("amqp", "%s: %s; reconnecting in %.1f s", c->url->display, c->why, (double)delay / 1000.0);
  uv_timer_start(&c->retry, retry_cb, (uint64_t)delay, 0);
}

static void timer_closed(uv_handle_t *h)
{
  nh_amqp_conn_t *c = h->data;
  if (--c->handles == 0 && c->closed_cb) {
    void (*cb)(void *) = c->closed_cb;
    c->closed_cb = NULL;
    cb(c->closed_data);
  }
}

/* Closed for good: the timers go last, then the owner hears it. */
static void finalize(nh_amqp_conn_t *c)
{
  if (c->state == C_CLOSED) return;
  c->state = C_CLOSED;
  c->handles = 2;
  uv_close((uv_handle_t *)&c->retry, timer_closed);
  uv_close((uv_handle_t *)&c->tick, timer_closed);
}

/* The connection (or the attempt) is over: tell the owner, then retry unless closed. */
static void ended(nh_amqp_conn_t *c)
{
  int was_up = c->up;
  c->up = 0;
  /* the backoff starts over only after a connection that lasted: one the broker drops
   * right after the open (a session error, say) keeps backing off */
  if (was_up && uv_now(c->loop) - c->up_since >= NH_STABLE_MS) c->attempt = 0;
  if (c->cbs.on_down) c->cbs.on_down(c->data, c->why, c->fatal || c->stopping);
  if (c->fatal) nh_log_error("amqp", "%s: %s", c->url->display, c->why);
  else if (was_up && !c->stopping) nh_log_warn("amqp", "%s: connection lost: %s", c->url->display, c->why);
  if (c->stopping) {
    finalize(c);
    return;
  }
  schedule_retry(c);
}

static void on_tcp_closed(uv_handle_t *h)
{
  nh_amqp_conn_t *c = h->data;
  c->tcp_open = 0;
  if (c->drv_open) {
    pn_connection_driver_destroy(&c->drv);
    c->drv_open = 0;
  }
  ended(c);
}

static void teardown(nh_amqp_conn_t *c)
{
  if (c->state == C_CLOSING_TCP) return;
  c->state = C_CLOSING_TCP;
  uv_timer_stop(&c->tick);
  if (c->tcp_open) {
    uv_close((uv_handle_t *)&c->tcp, on_tcp_closed);
  } else {
    if (c->drv_open) {
      pn_connection_driver_destroy(&c->drv);
      c->drv_open = 0;
    }
    ended(c);
  }
}

static void note_condition(nh_amqp_conn_t *c, pn_condition_t *cond, const char *where)
{
  /* the protocol's reason beats what the socket said afterwards (a reset, EOF) */
  if (!cond || !pn_condition_is_set(cond) || (c->why[0] && !c->why_io)) return;
  c->why_io = 0;
  const char *name = pn_condition_get_name(cond), *desc = pn_condition_get_description(cond);
  snprintf(c->why, sizeof c->why, "%s: %s%s%s", where, name ? name : "error", desc ? ": " : "", desc ? desc : "");
  if (name && strcmp(name, "amqp:unauthorized-access") == 0) {
    c->fatal = 1;
    snprintf(c->why, sizeof c->why, "authentication failed for user %s (%s%s%s): check the user and password in "
             "--transport", c->url->user ? c->url->user : "(none)", name, desc ? ": " : "", desc ? desc : "");
  } else if (desc && (strstr(desc, "certificate verify failed") || strstr(desc, "certificate"))) {
    c->fatal = 1;
    snprintf(c->why, sizeof c->why, "TLS verification of %s failed (%s): give the broker's CA with ?ca=FILE, or "
             "?verify=0 to skip the check (insecure)", c->url->host, desc);
  } else if (name && strcmp(name, "amqp:not-found") == 0 && strcmp(where, "broker closed the connection") == 0) {
    c->fatal = 1;   /* e.g. RabbitMQ: the vhost does not exist */
  }
}

static void tick_cb(uv_timer_t *t);

static void arm_tick(nh_amqp_conn_t *c)
{
  if (!c->drv_open) return;
  int64_t now = (int64_t)uv_now(c->loop);
  int64_t next = pn_transport_tick(c->drv.transport, now);   /* heartbeats and idle time-out */
  if (next > 0) uv_timer_start(&c->tick, tick_cb, (uint64_t)(next > now ? next - now : 0), 0);
}

static void write_cb(uv_write_t *req, int status)
{
  nh_amqp_conn_t *c = req->data;
  free(req);
  c->writes--;
  if (status < 0 && status != UV_ECANCELED && c->drv_open && !c->why[0])
    snprintf(c->why, sizeof c->why, "write: %s", uv_strerror(status));
  if (status < 0 && c->drv_open) pn_connection_driver_write_close(&c->drv);
  if (c->state == C_OPEN) nh_amqp_conn_flush(c);
}

static void flush_once(nh_amqp_conn_t *c);

/* Handlers of the events it runs may ask for a flush again (sending, attaching): such a
 * nested call only marks another round, so proton's current event is not recycled
 * underneath the outer loop. */
void nh_amqp_conn_flush(nh_amqp_conn_t *c)
{
  if (c->flushing) {
    c->again = 1;
    return;
  }
  c->flushing = 1;
  do {
    c->again = 0;
    flush_once(c);
  } while (c->again);
  c->flushing = 0;
}

static void flush_once(nh_amqp_conn_t *c)
{
  if (c->state != C_OPEN || !c->drv_open) return;
  for (;;) {
    pn_event_t *e;
    while ((e = pn_connection_driver_next_event(&c->drv))) {
      switch (pn_event_type(e)) {
      case PN_CONNECTION_REMOTE_OPEN:
        c->up = 1;
        c->up_since = uv_now(c->loop);
        c->why[0] = '\0';
        nh_log_info("amqp", "AMQP connected to %s", c->url->display);
        if (c->cbs.on_up) c->cbs.on_up(c->data, c->drv.connection);
        break;
      case PN_CONNECTION_REMOTE_CLOSE:
        note_condition(c, pn_connection_remote_condition(c->drv.connection), "broker closed the connection");
        pn_connection_close(c->drv.connection);
        break;
      case PN_TRANSPORT_ERROR:
        note_condition(c, pn_transport_condition(c->drv.transport), "transport error");
        /* e.g. a failed SASL outcome: do not wait for the broker to drop the socket
         * (RabbitMQ takes seconds after a failed login) */
        if (!pn_connection_driver_read_closed(&c->drv)) pn_connection_driver_read_close(&c->drv);
        break;
      default:
        break;
      }
      if (c->cbs.on_event) c->cbs.on_event(c->data, e);
    }
    /* a refused login: proton reports it only once the socket closes, and RabbitMQ
     * keeps it open for seconds after a failed login */
    if (c->url->user && !c->url->servicebus && !c->fatal &&
        pn_sasl_outcome(pn_sasl(c->drv.transport)) == PN_SASL_AUTH) {
      snprintf(c->why, sizeof c->why, "authentication failed for user %s (SASL PLAIN refused): check the user and "
               "password in --transport", c->url->user);
      c->why_io = 0;
      c->fatal = 1;
      if (!pn_connection_driver_read_closed(&c->drv)) pn_connection_driver_read_close(&c->drv);
      if (!pn_connection_driver_write_closed(&c->drv)) pn_connection_driver_write_close(&c->drv);
    }
    pn_bytes_t wb = pn_connection_driver_write_buffer(&c->drv);
    if (wb.size == 0) break;
    uv_write_t *req = nh_xmalloc(sizeof *req + wb.size);
    char *copy = (char *)(req + 1);
    memcpy(copy, wb.start, wb.size);
    uv_buf_t buf = uv_buf_init(copy, (unsigned)wb.size);
    req->data = c;
    int rc = uv_write(req, (uv_stream_t *)&c->tcp, &buf, 1, write_cb);
    if (rc < 0) {
      free(req);
      if (!c->why[0]) snprintf(c->why, sizeof c->why, "write: %s", uv_strerror(rc));
      pn_connection_driver_write_close(&c->drv);
      continue;
    }
    c->writes++;
    pn_connection_driver_write_done(&c->drv, wb.size);
  }
  if (pn_connection_driver_finished(&c->drv)) {
    if (!c->why[0]) snprintf(c->why, sizeof c->why, "connection closed");
    if (c->writes == 0) teardown(c);   /* else the last write's callback comes back here */
    return;
  }
  arm_tick(c);
}

static void tick_cb(uv_timer_t *t)
{
  nh_amqp_conn_t *c = t->data;
  if (c->state == C_OPEN) nh_amqp_conn_flush(c);
}

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
  nh_amqp_conn_t *c = h->data;
  (void)suggested;
  *buf = uv_buf_init(c->rbuf, sizeof c->rbuf);
}

static void read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
  nh_amqp_conn_t *c = s->data;
  if (nread < 0) {
    if (!c->why[0]) {
      snprintf(c->why, sizeof c->why, "%s", nread == UV_EOF ? "the broker closed the socket" : uv_strerror((int)nread));
      c->why_io = 1;
    }
    uv_read_stop(s);
    pn_connection_driver_read_close(&c->drv);
    if (!pn_connection_driver_write_closed(&c->drv)) pn_connection_driver_write_close(&c->drv);
    nh_amqp_conn_flush(c);
    return;
  }
  size_t off = 0;
  while (off < (size_t)nread) {
    pn_rwbytes_t rb = pn_connection_driver_read_buffer(&c->drv);
    if (rb.size == 0) {   /* proton will not take more: the read side is closed */
      uv_read_stop(s);
      break;
    }
    size_t n = (size_t)nread - off < rb.size ? (size_t)nread - off : rb.size;
    memcpy(rb.start, buf->base + off, n);
    pn_connection_driver_read_done(&c->drv, n);
    off += n;
  }
  nh_amqp_conn_flush(c);
}

static int setup_transport(nh_amqp_conn_t *c)
{
  const nh_amqp_url_t *u = c->url;
  pn_transport_t *t = c->drv.transport;
  pn_connection_t *pc = c->drv.connection;
  pn_connection_set_container(pc, c->container);
  /* RabbitMQ picks the vhost from the open frame's hostname ("vhost:NAME") */
  char hostname[512];
  if (u->vhost && !u->servicebus) snprintf(hostname, sizeof hostname, "vhost:%s", u->vhost);
  else snprintf(hostname, sizeof hostname, "%s", u->host);
  pn_connection_set_hostname(pc, hostname);
  pn_transport_set_idle_timeout(t, (pn_millis_t)u->idle_ms);
  if (u->servicebus) {
    /* Service Bus: SASL ANONYMOUS, then a SAS token per entity over $cbs (the key
     * itself never crosses the wire) */
    pn_sasl_allowed_mechs(pn_sasl(t), "ANONYMOUS");
  } else if (u->user && *u->user) {
    pn_connection_set_user(pc, u->user);
    pn_connection_set_password(pc, u->password ? u->password : "");
    pn_sasl_t *sasl = pn_sasl(t);
    pn_sasl_allowed_mechs(sasl, "PLAIN");
    /* PLAIN in clear text is what a loopback RabbitMQ needs; over amqps it is encrypted */
    pn_sasl_set_allow_insecure_mechs(sasl, true);
  }
  if (u->tls) {
    if (!c->ssl) {
      c->ssl = pn_ssl_domain(PN_SSL_MODE_CLIENT);
      if (!c->ssl) {
        snprintf(c->why, sizeof c->why, "this proton build has no TLS support");
        c->fatal = 1;
        return -1;
      }
      if (u->ca && pn_ssl_domain_set_trusted_ca_db(c->ssl, u->ca) != 0) {
        snprintf(c->why, sizeof c->why, "cannot load the CA file %s given with ?ca=", u->ca);
        c->fatal = 1;
        return -1;
      }
      pn_ssl_domain_set_peer_authentication(c->ssl, u->verify ? PN_SSL_VERIFY_PEER_NAME : PN_SSL_ANONYMOUS_PEER,
                                            NULL);
      if (!u->verify) nh_log_warn("amqp", "%s: TLS peer verification is off (verify=0)", u->display);
    }
    pn_ssl_t *ssl = pn_ssl(t);
    if (!ssl || pn_ssl_init(ssl, c->ssl, NULL) != 0) {
      snprintf(c->why, sizeof c->why, "cannot start TLS");
      c->fatal = 1;
      return -1;
    }
    pn_ssl_set_peer_hostname(ssl, u->host);
  }
  pn_connection_open(pc);
  return 0;
}

static void on_connect(uv_connect_t *req, int status)
{
  nh_amqp_conn_t *c = req->data;
  if (c->stopping) {
    teardown(c);
    return;
  }
  if (status < 0) {
    snprintf(c->why, sizeof c->why, "cannot connect to %s:%d: %s", c->url->host, c->url->port, uv_strerror(status));
    teardown(c);
    return;
  }
  uv_tcp_nodelay(&c->tcp, 1);
  if (pn_connection_driver_init(&c->drv, NULL, NULL) != 0) {
    snprintf(c->why, sizeof c->why, "cannot create a proton connection");
    teardown(c);
    return;
  }
  c->drv_open = 1;
  if (setup_transport(c) != 0) {
    teardown(c);
    return;
  }
  c->state = C_OPEN;
  uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, read_cb);
  nh_amqp_conn_flush(c);
}

static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
  nh_amqp_conn_t *c = req->data;
  if (c->stopping || status < 0) {
    if (status < 0) snprintf(c->why, sizeof c->why, "cannot resolve %s: %s", c->url->host, uv_strerror(status));
    if (res) uv_freeaddrinfo(res);
    teardown(c);
    return;
  }
  c->state = C_CONNECTING;
  uv_tcp_init(c->loop, &c->tcp);
  c->tcp.data = c;
  c->tcp_open = 1;
  c->connect_req.data = c;
  int rc = uv_tcp_connect(&c->connect_req, &c->tcp, res->ai_addr, on_connect);
  uv_freeaddrinfo(res);
  if (rc < 0) {
    snprintf(c->why, sizeof c->why, "cannot connect to %s:%d: %s", c->url->host, c->url->port, uv_strerror(rc));
    teardown(c);
  }
}

static void try_connect(nh_amqp_conn_t *c)
{
  c->why[0] = '\0';
  c->up = 0;
  c->state = C_RESOLVING;
  char port[16];
  snprintf(port, sizeof port, "%d", c->url->port);
  struct addrinfo hints;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  c->gai.data = c;
  int rc = uv_getaddrinfo(c->loop, &c->gai, on_resolved, c->url->host, port, &hints);
  if (rc < 0) {
    snprintf(c->why, sizeof c->why, "cannot resolve %s: %s", c->url->host, uv_strerror(rc));
    teardown(c);
  }
}

nh_amqp_conn_t *nh_amqp_conn_init(uv_loop_t *loop, const nh_amqp_url_t *url, const char *container,
                                 const nh_amqp_conn_cbs_t *cbs, void *data)
{
  nh_amqp_conn_t *c = nh_xcalloc(1, sizeof *c);
  c->loop = loop;
  c->url = url;
  c->container = nh_xstrdup(container);
  c->cbs = *cbs;
  c->data = data;
  uv_timer_init(loop, &c->tick);
  uv_timer_init(loop, &c->retry);
  c->tick.data = c->retry.data = c;
  return c;
}

void nh_amqp_conn_start(nh_amqp_conn_t *c)
{
  if (c->state == C_IDLE) try_connect(c);
}

static void guard_cb(uv_timer_t *t)
{
  nh_amqp_conn_t *c = t->data;
  if (c->state != C_OPEN) return;
  /* the broker did not answer our close: drop the socket */
  if (!c->why[0]) snprintf(c->why, sizeof c->why, "no answer to close");
  teardown(c);
}

void nh_amqp_conn_close(nh_amqp_conn_t *c, void (*done)(void *), void *data)
{
  c->stopping = 1;
  c->closed_cb = done;
  c->closed_data = data;
  uv_timer_stop(&c->retry);
  switch (c->state) {
  case C_OPEN:
    if (!c->why[0]) snprintf(c->why, sizeof c->why, "closed by the host");
    pn_connection_close(c->drv.connection);
    uv_timer_start(&c->retry, guard_cb, 2000, 0);
    nh_amqp_conn_flush(c);   /* writes the close frame; teardown when the broker answers */
    break;
  case C_IDLE:
  case C_WAITING:
    finalize(c);
    break;
  default:
    break;   /* resolving/connecting/closing: their callbacks see `stopping` and end */
  }
}

void nh_amqp_conn_free(nh_amqp_conn_t *c)
{
  if (!c) return;
  if (c->ssl) pn_ssl_domain_free(c->ssl);
  free(c->container);
  free(c);
}
