/* The HTTP client of nh_http_client.h: one curl multi handle per runtime (its loop's),
 * closed with it, a uv_poll per socket and a uv_timer for curl's timeouts.
 * http and https only; response bodies over 64 MiB fail with EMSGSIZE. */
#include "nh_http_client.h"
#include "core/nh_log.h"
#include "core/nh_queue.h"
#include "core/nh_runtime.h"
#include "core/nh_util.h"

#include <ctype.h>
#include <curl/curl.h>
#include <stdlib.h>
#include <string.h>

#define NH_HTTP_MAX_BODY (64u << 20)

struct nh_http_call {
  CURL *easy;
  struct curl_slist *hdrs;
  char *req_body;
  nh_http_done_cb cb;
  void *data;
  nh_http_res_t res;
  size_t cap;
  int too_big;
  struct client *client;
  nh_queue_t node;              /* client->calls */
};

/* One multi handle per runtime (the loop's), made at its first request and closed with
 * the runtime: a part of it (core/nh_runtime.h). */
typedef struct client {
  nh_rt_part_t part;
  uv_loop_t *loop;
  CURLM *multi;
  uv_timer_t timer;
  nh_queue_t calls;             /* in flight, newest first */
} client_t;

static const char client_key = 'h';   /* its part's key: the address */
static int curl_users;                /* clients open: curl's global state lives while any does */

typedef struct sock_ctx {
  uv_poll_t poll;
  curl_socket_t fd;
  client_t *client;
} sock_ctx_t;

static void check_done(client_t *client);

static void poll_cb(uv_poll_t *h, int status, int events)
{
  sock_ctx_t *s = h->data;
  int flags = 0, running = 0;
  if (status < 0) flags = CURL_CSELECT_ERR;
  if (events & UV_READABLE) flags |= CURL_CSELECT_IN;
  if (events & UV_WRITABLE) flags |= CURL_CSELECT_OUT;
  curl_multi_socket_action(s->client->multi, s->fd, flags, &running);
  check_done(s->client);
}

static void poll_closed(uv_handle_t *h) { free(h->data); }

static int socket_cb(CURL *easy, curl_socket_t fd, int what, void *userp, void *sockp)
{
  (void)easy;
  client_t *client = userp;
  sock_ctx_t *s = sockp;
  if (what == CURL_POLL_REMOVE) {
    if (s) {
      uv_poll_stop(&s->poll);
      uv_close((uv_handle_t *)&s->poll, poll_closed);
      curl_multi_assign(client->multi, fd, NULL);
    }
    return 0;
  }
  if (!s) {
    s = nh_xcalloc(1, sizeof *s);
    s->fd = fd;
    s->client = client;
    if (uv_poll_init_socket(client->loop, &s->poll, fd) != 0) {
      free(s);
      return -1;
    }
    s->poll.data = s;
    curl_multi_assign(client->multi, fd, s);
  }
  int events = 0;
  if (what & CURL_POLL_IN) events |= UV_READABLE;
  if (what & CURL_POLL_OUT) events |= UV_WRITABLE;
  uv_poll_start(&s->poll, events, poll_cb);
  return 0;
}

static void timer_fired(uv_timer_t *h)
{
  client_t *client = h->data;
  int running = 0;
  curl_multi_socket_action(client->multi, CURL_SOCKET_TIMEOUT, 0, &running);
  check_done(client);
}

static int timer_cb(CURLM *multi, long timeout_ms, void *userp)
{
  (void)multi;
  client_t *client = userp;
  if (timeout_ms < 0) uv_timer_stop(&client->timer);
  else uv_timer_start(&client->timer, timer_fired, (uint64_t)timeout_ms, 0);   /* 0: next iteration */
  return 0;
}

static void client_close(nh_rt_part_t *part);

static client_t *client_open(uv_loop_t *loop, nh_error_t *err)
{
  nh_runtime_t *rt = nh_runtime_of(loop);
  nh_rt_part_t *part = nh_runtime_part(rt, &client_key);
  if (part) return nh_queue_data(part, client_t, part);
  if (curl_users == 0 && curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
    nh_error_set(err, NH_EFAIL, "libcurl failed to start");
    return NULL;
  }
  curl_users++;
  client_t *client = nh_xcalloc(1, sizeof *client);
  client->loop = loop;
  client->multi = curl_multi_init();
  curl_multi_setopt(client->multi, CURLMOPT_SOCKETFUNCTION, socket_cb);
  curl_multi_setopt(client->multi, CURLMOPT_SOCKETDATA, client);
  curl_multi_setopt(client->multi, CURLMOPT_TIMERFUNCTION, timer_cb);
  curl_multi_setopt(client->multi, CURLMOPT_TIMERDATA, client);
  uv_timer_init(loop, &client->timer);
  client->timer.data = client;
  nh_queue_init(&client->calls);
  nh_runtime_add_part(rt, &client->part, &client_key, client_close);
  return client;
}

static size_t body_cb(char *ptr, size_t size, size_t n, void *userp)
{
  nh_http_call_t *c = userp;
  size_t len = size * n;
  if (c->res.body_len + len > NH_HTTP_MAX_BODY) {
    c->too_big = 1;
    return 0;   /* aborts the transfer with CURLE_WRITE_ERROR */
  }
  if (c->res.body_len + len + 1 > c->cap) {
    while (c->res.body_len + len + 1 > c->cap) c->cap = c->cap ? c->cap * 2 : 4096;
    c->res.body = nh_xrealloc(c->res.body, c->cap);
  }
  memcpy(c->res.body + c->res.body_len, ptr, len);
  c->res.body_len += len;
  c->res.body[c->res.body_len] = '\0';
  return len;
}

static void headers_clear(nh_http_res_t *r)
{
  for (int i = 0; i < r->nheaders; i++) {
    free(r->header_names[i]);
    free(r->header_values[i]);
  }
  free(r->header_names);
  free(r->header_values);
  r->header_names = r->header_values = NULL;
  r->nheaders = 0;
}

static size_t header_cb(char *ptr, size_t size, size_t n, void *userp)
{
  nh_http_call_t *c = userp;
  size_t len = size * n;
  /* A new status line (after a 100 Continue, say) starts the final header set again. */
  if (len >= 5 && strncmp(ptr, "HTTP/", 5) == 0) {
    headers_clear(&c->res);
    return len;
  }
  const char *colon = memchr(ptr, ':', len);
  if (!colon) return len;
  size_t nlen = (size_t)(colon - ptr);
  const char *v = colon + 1, *end = ptr + len;
  while (v < end && (*v == ' ' || *v == '\t')) v++;
  while (end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' ')) end--;
  int i = c->res.nheaders++;
  c->res.header_names = nh_xrealloc(c->res.header_names, sizeof(char *) * (size_t)c->res.nheaders);
  c->res.header_values = nh_xrealloc(c->res.header_values, sizeof(char *) * (size_t)c->res.nheaders);
  c->res.header_names[i] = nh_xstrndup(ptr, nlen);
  for (char *p = c->res.header_names[i]; *p; p++) *p = (char)tolower((unsigned char)*p);
  c->res.header_values[i] = nh_xstrndup(v, (size_t)(end - v));
  return len;
}

static void call_free(nh_http_call_t *c)
{
  nh_queue_remove(&c->node);
  curl_multi_remove_handle(c->client->multi, c->easy);
  curl_easy_cleanup(c->easy);
  curl_slist_free_all(c->hdrs);
  free(c->req_body);
  headers_clear(&c->res);
  free(c->res.body);
  free(c);
}

static void set_error(nh_http_call_t *c, CURLcode rc, const char *detail)
{
  const char *code;
  switch (rc) {
  case CURLE_OPERATION_TIMEDOUT: code = "ETIMEDOUT"; break;
  case CURLE_COULDNT_CONNECT: code = "ECONNREFUSED"; break;
  case CURLE_COULDNT_RESOLVE_HOST:
  case CURLE_COULDNT_RESOLVE_PROXY: code = "ENOTFOUND"; break;
  case CURLE_URL_MALFORMAT:
  case CURLE_UNSUPPORTED_PROTOCOL: code = "EINVAL"; break;
  case CURLE_PEER_FAILED_VERIFICATION:
  case CURLE_SSL_CONNECT_ERROR: code = "ETLS"; break;
  case CURLE_GOT_NOTHING:
  case CURLE_RECV_ERROR:
  case CURLE_SEND_ERROR: code = "ECONNRESET"; break;
  default: code = "EHTTP"; break;
  }
  if (c->too_big) {
    code = "EMSGSIZE";
    snprintf(c->res.error, sizeof c->res.error, "response body larger than %u bytes", NH_HTTP_MAX_BODY);
    c->res.error_code = code;
    return;
  }
  c->res.error_code = code;
  snprintf(c->res.error, sizeof c->res.error, "%s", detail && *detail ? detail : curl_easy_strerror(rc));
}

static void check_done(client_t *client)
{
  CURLMsg *msg;
  int left;
  while ((msg = curl_multi_info_read(client->multi, &left))) {
    if (msg->msg != CURLMSG_DONE) continue;
    nh_http_call_t *c = NULL;
    curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&c);
    CURLcode rc = msg->data.result;
    if (rc == CURLE_OK) {
      curl_easy_getinfo(c->easy, CURLINFO_RESPONSE_CODE, &c->res.status);
    } else {
      set_error(c, rc, NULL);
      c->res.status = 0;
    }
    c->cb(c->data, &c->res);
    call_free(c);
  }
}

nh_http_call_t *nh_http_request(uv_loop_t *loop, const nh_http_req_t *req, nh_http_done_cb cb, void *data,
                                nh_error_t *err)
{
  client_t *client = client_open(loop, err);
  if (!client) return NULL;
  nh_http_call_t *c = nh_xcalloc(1, sizeof *c);
  c->client = client;
  c->cb = cb;
  c->data = data;
  c->easy = curl_easy_init();
  CURL *e = c->easy;
  curl_easy_setopt(e, CURLOPT_URL, req->url);
  curl_easy_setopt(e, CURLOPT_PRIVATE, c);
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, body_cb);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, c);
  curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, header_cb);
  curl_easy_setopt(e, CURLOPT_HEADERDATA, c);
  double t = req->timeout_s > 0 ? req->timeout_s : 30.0;
  curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)(t * 1000.0));
  curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)((t < 10.0 ? t : 10.0) * 1000.0));
  const char *method = req->method ? req->method : "GET";
  if (strcmp(method, "GET") == 0) {
    curl_easy_setopt(e, CURLOPT_HTTPGET, 1L);
  } else if (strcmp(method, "HEAD") == 0) {
    curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
  } else {
    curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
  }
  if (req->body) {
    c->req_body = nh_xstrndup(req->body, req->body_len);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, c->req_body);
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)req->body_len);
    if (strcmp(method, "GET") == 0) curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, "GET");
  }
  /* No "Expect: 100-continue" round trip for bodies: local APIs answer at once. */
  c->hdrs = curl_slist_append(c->hdrs, "Expect:");
  for (int i = 0; i < req->nheaders; i++) c->hdrs = curl_slist_append(c->hdrs, req->headers[i]);
  curl_easy_setopt(e, CURLOPT_HTTPHEADER, c->hdrs);
  nh_queue_insert_head(&client->calls, &c->node);
  CURLMcode mrc = curl_multi_add_handle(client->multi, e);
  if (mrc != CURLM_OK) {
    nh_error_set(err, NH_EFAIL, "HTTP client: %s", curl_multi_strerror(mrc));
    call_free(c);
    return NULL;
  }
  return c;
}

void nh_http_cancel(nh_http_call_t *c) { call_free(c); }

static void timer_closed(uv_handle_t *h)
{
  client_t *client = h->data;
  curl_multi_cleanup(client->multi);   /* closes the sockets of its connection cache */
  free(client);
  if (--curl_users == 0) curl_global_cleanup();
}

/* The runtime closes it: calls in flight are abandoned (their callbacks do not run). */
static void client_close(nh_rt_part_t *part)
{
  client_t *client = nh_queue_data(part, client_t, part);
  while (!nh_queue_empty(&client->calls))
    call_free(nh_queue_data(nh_queue_head(&client->calls), nh_http_call_t, node));
  uv_timer_stop(&client->timer);
  uv_close((uv_handle_t *)&client->timer, timer_closed);
}
