/* The C side of nimbus.http.request: starts a curl transfer and parks the task until
 * it completes. Expected failures (timeout, refused, DNS) come back as nil, msg, code.
 * Inside a handler the call is a CLIENT span, child of the handler's, and the request
 * carries its traceparent (docs/observability.md, Traces). */
#include "nh_lmodules.h"
#include "nh_lasync.h"
#include "nh_task.h"
#include "core/nh_metrics.h"
#include "core/nh_runtime.h"
#include "core/nh_util.h"
#include "net/nh_http_client.h"
#include "net/nh_otlp.h"

#include <lauxlib.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <stdio.h>

typedef struct http_op {
  nh_op_t op;
  nh_task_t *task;
  uv_loop_t *loop;
  nh_http_call_t *call;
  uint64_t started_ns;
  char host[128];                /* the URL's host[:port], the metric's label */
  /* the client span, when the task runs in one */
  int has_span;
  nh_trace_ctx_t span;
  uint8_t parent_span[8];
  int64_t start_ns;              /* unix epoch */
  char method[16];
  char *url;                     /* without user info */
} http_op_t;

static nh_metric_t m_http = NH_HISTOGRAM_DEF("nimbus_http_client_request_duration_seconds",
  "nimbus.http.request calls, by the URL's host and the status class (2xx .. 5xx, or error)",
  nh_metric_buckets_fast, "host", "status_class");

/* host[:port] of an http(s) URL, without user info; "" when it has none. */
static void url_host(const char *url, char *out, size_t len)
{
  const char *p = strstr(url, "://");
  p = p ? p + 3 : url;
  size_t n = strcspn(p, "/?#");
  const char *at = memchr(p, '@', n);
  if (at) n -= (size_t)(at + 1 - p), p = at + 1;
  if (n >= len) n = len - 1;
  memcpy(out, p, n);
  out[n] = '\0';
}

static void http_observe(const http_op_t *h, const nh_http_res_t *res)
{
  static const char *const classes[] = { "1xx", "2xx", "3xx", "4xx", "5xx" };
  const char *cls = "error";
  if (!res->error_code && res->status >= 100 && res->status < 600) cls = classes[res->status / 100 - 1];
  nh_metric_observe(&m_http, (double)(uv_hrtime() - h->started_ns) / 1e9, h->host, cls);
}

/* The URL without "user:password@" (a span must not carry credentials). */
static char *url_without_userinfo(const char *url)
{
  const char *p = strstr(url, "://");
  const char *auth = p ? p + 3 : url;
  size_t n = strcspn(auth, "/?#");
  const char *at = memchr(auth, '@', n);
  if (!at) return nh_xstrdup(url);
  size_t head = (size_t)(auth - url), tail = strlen(at + 1);
  char *out = nh_xmalloc(head + tail + 1);
  memcpy(out, url, head);
  memcpy(out + head, at + 1, tail + 1);
  return out;
}


static void http_span_end(uv_loop_t *loop, const http_op_t *h, const nh_http_res_t *res)
{
  nh_otlp_t *x = nh_runtime_of(loop)->otlp;
  if (!x || !h->has_span || !(h->span.flags & NH_TRACE_SAMPLED)) return;
  char addr[128];
  snprintf(addr, sizeof addr, "%s", h->host);
  int64_t port = 0;
  char *colon = strrchr(addr, ':');
  if (colon && !strchr(colon, ']')) {
    port = strtol(colon + 1, NULL, 10);
    *colon = '\0';
  } else {
    port = strncmp(h->url, "https:", 6) == 0 ? 443 : 80;
  }
  int error = res->error_code != NULL || res->status >= 500;
  char why[300];
  if (res->error_code) snprintf(why, sizeof why, "%s: %s", res->error_code, res->error);
  else snprintf(why, sizeof why, "HTTP %ld", res->status);
  nh_span_attr_t attrs[] = {
    NH_SPAN_STR("http.request.method", h->method),
    NH_SPAN_STR("url.full", h->url),
    NH_SPAN_STR("server.address", addr),
    NH_SPAN_NUM("server.port", port),
    NH_SPAN_NUM(res->error_code ? NULL : "http.response.status_code", res->status),
    NH_SPAN_STR(res->error_code ? "error.type" : NULL, res->error_code),
  };
  char name[32];
  snprintf(name, sizeof name, "HTTP %s", h->method);
  nh_span_t s = { .name = name, .kind = NH_SPAN_CLIENT, .has_parent = 1, .start_ns = h->start_ns,
                  .end_ns = h->start_ns + (int64_t)(uv_hrtime() - h->started_ns), .error = error,
                  .status_message = error ? why : NULL, .attrs = attrs,
                  .nattrs = (int)(sizeof attrs / sizeof attrs[0]) };
  memcpy(s.trace_id, h->span.trace_id, sizeof s.trace_id);
  memcpy(s.span_id, h->span.span_id, sizeof s.span_id);
  memcpy(s.parent_span_id, h->parent_span, sizeof s.parent_span_id);
  nh_otlp_add(x, &s);
}

static void http_op_free(http_op_t *h)
{
  free(h->url);
  free(h);
}

static void http_cancel(nh_op_t *op)
{
  http_op_t *h = (http_op_t *)op;
  nh_http_cancel(h->call);
  http_op_free(h);
}

static void http_done(void *data, nh_http_res_t *res)
{
  http_op_t *h = data;
  nh_task_t *t = h->task;
  lua_State *co = nh_task_thread(t);
  http_observe(h, res);
  http_span_end(h->loop, h, res);
  http_op_free(h);
  int n;
  if (res->error_code) {
    lua_pushnil(co);
    lua_pushstring(co, res->error);
    lua_pushstring(co, res->error_code);
    n = 3;
  } else {
    lua_pushinteger(co, res->status);
    lua_createtable(co, 0, res->nheaders);
    for (int i = 0; i < res->nheaders; i++) {
      lua_pushstring(co, res->header_values[i]);
      lua_setfield(co, -2, res->header_names[i]);   /* a repeated header: the last one wins */
    }
    lua_pushlstring(co, res->body ? res->body : "", res->body_len);
    n = 3;
  }
  nh_task_complete(t, n);
}

/* core.request(method, url, headers{name=value}, body|nil, timeout_s) */
static int l_request(lua_State *L)
{
  const char *method = luaL_checkstring(L, 1);
  const char *url = luaL_checkstring(L, 2);
  size_t blen = 0;
  const char *body = lua_isnoneornil(L, 4) ? NULL : luaL_checklstring(L, 4, &blen);
  double timeout = luaL_optnumber(L, 5, 30.0);
  nh_task_t *t = nh_task_check(L, "nimbus.http.request");
  int nh = 0, has_traceparent = 0;
  const char **hdrs = NULL;
  if (lua_istable(L, 3)) {
    lua_pushnil(L);
    while (lua_next(L, 3)) {
      if (!lua_checkstack(L, 3)) {   /* not luaL_checkstack: raising here would leak hdrs */
        free(hdrs);
        return luaL_error(L, "nimbus.http.request: too many request headers (%d)", nh);
      }
      if (lua_type(L, -2) == LUA_TSTRING && (lua_type(L, -1) == LUA_TSTRING || lua_type(L, -1) == LUA_TNUMBER)) {
        if (strcasecmp(lua_tostring(L, -2), "traceparent") == 0) has_traceparent = 1;
        hdrs = nh_xrealloc(hdrs, sizeof *hdrs * (size_t)(nh + 1));
        hdrs[nh++] = lua_pushfstring(L, "%s: %s", lua_tostring(L, -2), lua_tostring(L, -1));
        lua_insert(L, -3);   /* keep the string alive below the key for the rest of the call */
      }
      lua_pop(L, 1);
    }
  }
  http_op_t *h = nh_xcalloc(1, sizeof *h);
  h->op.cancel = http_cancel;
  h->task = t;
  h->loop = nh_lua_loop(L);
  h->started_ns = uv_hrtime();
  url_host(url, h->host, sizeof h->host);
  const nh_trace_ctx_t *parent = nh_task_trace(t);
  char tp_line[16 + NH_TRACEPARENT_LEN];
  if (parent) {
    h->has_span = 1;
    nh_trace_new_child(parent, &h->span);
    memcpy(h->parent_span, parent->span_id, sizeof h->parent_span);
    h->start_ns = nh_trace_now_ns();
    snprintf(h->method, sizeof h->method, "%s", method);
    h->url = url_without_userinfo(url);
    if (!has_traceparent) {   /* the caller's own traceparent header wins */
      char tp[NH_TRACEPARENT_LEN + 1];
      nh_trace_format(&h->span, tp);
      snprintf(tp_line, sizeof tp_line, "traceparent: %s", tp);
      hdrs = nh_xrealloc(hdrs, sizeof *hdrs * (size_t)(nh + 1));
      hdrs[nh++] = tp_line;
    }
  }
  nh_http_req_t req = { method, url, hdrs, nh, body, blen, timeout };
  nh_error_t err = {0};
  h->call = nh_http_request(nh_lua_loop(L), &req, http_done, h, &err);
  free(hdrs);
  if (!h->call) {
    http_op_free(h);
    lua_pushnil(L);
    lua_pushstring(L, err.msg);
    lua_pushliteral(L, "EIO");
    return 3;
  }
  return nh_task_yield(L, t, &h->op);
}

int nh_lhttp_open(lua_State *L)
{
  static const luaL_Reg fns[] = { { "request", l_request }, { NULL, NULL } };
  luaL_newlib(L, fns);
  return 1;
}
