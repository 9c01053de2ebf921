/* The C side of nimbus.http.request: starts a curl transfer and parks the task until
 * it completes. Expected failures (timeout, refused, DNS) come back as nil, msg, code. */
#include "nh_lmodules.h"
#include "nh_lasync.h"
#include "nh_task.h"
#include "core/nh_metrics.h"
#include "core/nh_util.h"
#include "net/nh_http_client.h"

#include <lauxlib.h>
#include <stdlib.h>
#include <string.h>

typedef struct http_op {
  nh_op_t op;
  nh_task_t *task;
  nh_http_call_t *call;
  uint64_t started_ns;
  char host[128];                /* the URL's host[:port], the metric's label */
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

static void http_cancel(nh_op_t *op)
{
  http_op_t *h = (http_op_t *)op;
  nh_http_cancel(h->call);
  free(h);
}

static void http_done(void *data, nh_http_res_t *res)
{
  http_op_t *h = data;
  nh_task_t *t = h->task;
  lua_State *co = nh_task_thread(t);
  http_observe(h, res);
  free(h);
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
  int nh = 0;
  const char **hdrs = NULL;
  if (lua_istable(L, 3)) {
    lua_pushnil(L);
    while (lua_next(L, 3)) {
      if (!lua_checkstack(L, 3)) {   /* not luaL_checkstack: raising here would leak hdrs */
        free(hdrs);
        return luaL_error(L, "nimbus.http.request: too many request headers (%d)", nh);
      }
      if (lua_type(L, -2) == LUA_TSTRING && (lua_type(L, -1) == LUA_TSTRING || lua_type(L, -1) == LUA_TNUMBER)) {
        hdrs = nh_xrealloc(hdrs, sizeof *hdrs * (size_t)(nh + 1));
        hdrs[nh++] = lua_pushfstring(L, "%s: %s", lua_tostring(L, -2), lua_tostring(L, -1));
        lua_insert(L, -3);   /* keep the string alive below the key for the rest of the call */
      }
      lua_pop(L, 1);
    }
  }
  nh_http_req_t req = { method, url, hdrs, nh, body, blen, timeout };
  http_op_t *h = nh_xcalloc(1, sizeof *h);
  h->op.cancel = http_cancel;
  h->task = t;
  h->started_ns = uv_hrtime();
  url_host(url, h->host, sizeof h->host);
  nh_error_t err = {0};
  h->call = nh_http_request(nh_lua_loop(L), &req, http_done, h, &err);
  free(hdrs);
  if (!h->call) {
    free(h);
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
