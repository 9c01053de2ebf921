/* The admin listener (nh_admin.h): the route table, who may call what, the listener's
 * life. Routes answer from the store on the loop thread, between pumps (no transaction of
 * the pump is open then); bulk actions step a batch per loop turn. Without a store (a
 * PostgreSQL one: its reads would wait for the network on the loop) only the routes of the
 * host's own state answer, the others say so. */
#include "nh_admin_int.h"
#include "nh_admin_tokens.h"
#include "core/nh_log.h"
#include "core/nh_metrics.h"
#include "core/nh_util.h"
#include "transport/nh_embedded.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

int nh_admin_parse_addr(const char *s, char *host, size_t hostlen, int *port, int *off, nh_error_t *err)
{
  *off = 0;
  if (strcmp(s, "off") == 0) {
    *off = 1;
    return NH_OK;
  }
  const char *colon = strrchr(s, ':');
  const char *p = colon ? colon + 1 : s;
  size_t hl = colon ? (size_t)(colon - s) : 0;
  char *end = NULL;
  long v = strtol(p, &end, 10);
  if (!*p || *end || v < 0 || v > 65535)
    return nh_error_set(err, NH_EUSAGE, "--admin %s: expected off, PORT or HOST:PORT (a port from 0 to 65535)", s);
  if (hl >= hostlen) return nh_error_set(err, NH_EUSAGE, "--admin %s: the host is too long", s);
  snprintf(host, hostlen, "%.*s", (int)hl, s);
  if (!*host) snprintf(host, hostlen, "127.0.0.1");
  *port = (int)v;
  return NH_OK;
}

int nh_admin_is_loopback(const char *host)
{
  return strcmp(host, "localhost") == 0 || strncmp(host, "127.", 4) == 0 || strcmp(host, "::1") == 0;
}

/* ---------------------------------------------------------------- routes */

typedef enum { PUBLIC, READER, OPERATOR } need_t;

typedef struct route {
  const char *method;
  const char *pattern;   /* segments; "{}" takes one segment; a trailing "*" the rest */
  need_t need;
  int json;              /* the body must be JSON from this origin (actions, and NimBus's POST reads) */
  nh_admin_route_fn fn;
  enum { SQLITE, OWN, ANY } store;   /* what it reads: the sqlite store only (for now), nothing of
                                      * the store or the store its own way (the stream), either
                                      * store (on PostgreSQL on the pool) */
} route_t;

static const route_t routes[] = {
  { "GET", "/api/v1/endpoints", READER, 0, nh_admin_get_endpoints, ANY },
  { "GET", "/api/v1/events", READER, 0, nh_admin_get_events, ANY },
  { "GET", "/api/v1/events/{}", READER, 0, nh_admin_get_event, ANY },
  { "GET", "/api/v1/sessions", READER, 0, nh_admin_get_sessions, ANY },
  { "GET", "/api/v1/failures", READER, 0, nh_admin_get_failures, ANY },
  { "GET", "/api/v1/whoami", READER, 0, nh_admin_get_whoami, OWN },
  { "GET", "/api/v1/stream", READER, 0, nh_admin_get_stream, OWN },   /* on PostgreSQL it sends its reads to the pool */
  { "GET", "/api/v1/openapi.json", PUBLIC, 0, nh_admin_get_openapi, OWN },
  { "POST", "/api/v1/events/{}/resubmit", OPERATOR, 1, nh_admin_post_resubmit, ANY },
  { "POST", "/api/v1/events/{}/skip", OPERATOR, 1, nh_admin_post_skip, ANY },
  { "POST", "/api/v1/events/{}/handoff/complete", OPERATOR, 1, nh_admin_post_handoff_complete, ANY },
  { "POST", "/api/v1/events/{}/handoff/fail", OPERATOR, 1, nh_admin_post_handoff_fail, ANY },
  { "POST", "/api/v1/bulk/resubmit", OPERATOR, 1, nh_admin_post_bulk_resubmit, ANY },
  { "POST", "/api/v1/bulk/skip", OPERATOR, 1, nh_admin_post_bulk_skip, ANY },
  /* NimBus's operator API (docs/admin-api.md) */
  { "POST", "/api/endpoint/status/count", READER, 1, nh_admin_nimbus_status_count, ANY },
  { "POST", "/api/event/{}/getByFilter", READER, 1, nh_admin_nimbus_get_by_filter, ANY },
  { "POST", "/api/event/resubmit/{}/{}", OPERATOR, 1, nh_admin_nimbus_resubmit, ANY },
  { "POST", "/api/event/skip/{}/{}", OPERATOR, 1, nh_admin_nimbus_skip, ANY },
  { "GET", "/healthz", PUBLIC, 0, nh_admin_get_health, OWN },
  { "GET", "/metrics", READER, 0, nh_admin_get_metrics, OWN },
  { "GET", "/readyz", PUBLIC, 0, nh_admin_get_ready, OWN },
  { "GET", "/", PUBLIC, 0, nh_admin_get_static, OWN },
  { "GET", "/console", PUBLIC, 0, nh_admin_get_static, OWN },
  { "GET", "/console/*", PUBLIC, 0, nh_admin_get_static, OWN },
};

/* Matches path against pattern, filling c->cap with the {} segments (still escaped). */
static int match(const char *pattern, const char *path, nh_admin_call_t *c, int keep)
{
  int ncap = 0;
  const char *p = pattern, *s = path;
  while (*p && *s) {
    if (p[0] == '*') return 1;
    if (p[0] == '{' && p[1] == '}') {
      const char *end = strchr(s, '/');
      size_t n = end ? (size_t)(end - s) : strlen(s);
      if (!n || ncap == NH_ADMIN_CAPTURES) return 0;
      if (keep) c->cap[ncap] = nh_admin_unescape(s, n);
      ncap++;
      s += n;
      p += 2;
      continue;
    }
    if (*p != *s) return 0;
    p++;
    s++;
  }
  return (!*p && !*s) || strcmp(p, "*") == 0;
}

static void on_param(void *ud, const char *key, size_t klen, const char *val, size_t vlen)
{
  nh_admin_params_t *q = ud;
  if (q->n == NH_ADMIN_PARAMS) return;
  q->key[q->n] = nh_admin_unescape(key, klen);
  q->val[q->n] = val ? nh_admin_unescape(val, vlen) : nh_xstrdup("");
  q->n++;
}

void nh_admin_call_clear(nh_admin_call_t *c)
{
  for (int i = 0; i < c->q.n; i++) {
    free(c->q.key[i]);
    free(c->q.val[i]);
  }
  for (int i = 0; i < NH_ADMIN_CAPTURES; i++) free(c->cap[i]);
}

/* An action or a JSON read must come as JSON from this origin: a page of another site can
 * post a form (text/plain, urlencoded) without asking, but not JSON, and its Origin names
 * it. Same origin: the Origin is http:// + the Host the browser sent. 1 if allowed. */
static int same_origin_json(nh_admin_call_t *c)
{
  char *type = nh_admin_header(c->r, "Content-Type"), *origin = nh_admin_header(c->r, "Origin");
  char *host = nh_admin_header(c->r, "Host");
  int json = type && strncasecmp(type, "application/json", 16) == 0;
  char same[320];
  snprintf(same, sizeof same, "http://%s", host ? host : "");
  int ok_origin = !origin || (host && strcmp(origin, same) == 0);
  if (!json)
    nh_admin_error(c->r, 415, NULL, "%s %s takes a JSON body: send Content-Type: application/json", c->method, c->path);
  else if (!ok_origin)
    nh_admin_error(c->r, 403, NULL, "actions are taken from this API's own origin only, not from %s", origin);
  free(type);
  free(origin);
  free(host);
  return json && ok_origin;
}

/* Without logins only this machine may call: a page of a domain that resolves to
 * 127.0.0.1 (DNS rebinding) sends its own name as Host, and its Origin matches it. 1 if
 * the Host names a loopback address (with or without a port). */
static int host_is_loopback(nh_admin_call_t *c)
{
  char *host = nh_admin_header(c->r, "Host");
  if (!host) return 0;
  char name[256];
  snprintf(name, sizeof name, "%s", host);
  free(host);
  char *end = name[0] == '[' ? strchr(name, ']') : strrchr(name, ':');
  if (name[0] == '[') {
    if (!end) return 0;
    end[1] = '\0';
  } else if (end) {
    *end = '\0';
  }
  return strcmp(name, "localhost") == 0 || strcmp(name, "[::1]") == 0 || strncmp(name, "127.", 4) == 0;
}

/* Who is calling and with what role; 1 with 401/403 answered when it may not. */
static int refuse(nh_admin_call_t *c, need_t need)
{
  if (!c->a->tokens && !host_is_loopback(c)) {
    nh_admin_error(c->r, 403, NULL, "this listener answers this machine only (Host 127.0.0.1 or localhost): it "
                   "has no logins; give --admin-token-file to serve other names");
    return 1;
  }
  if (need == PUBLIC) return 0;
  if (!c->a->tokens) {
    c->role = NH_ROLE_OPERATOR;
    snprintf(c->who, sizeof c->who, "local");
    return 0;
  }
  char *token = NULL, *auth = nh_admin_header(c->r, "Authorization");
  if (auth && strncasecmp(auth, "Bearer ", 7) == 0) token = nh_xstrdup(auth + 7);
  else if (!auth && strcmp(c->path, "/api/v1/stream") == 0 && nh_admin_param(c, "access_token"))
    token = nh_xstrdup(nh_admin_param(c, "access_token"));
  free(auth);
  const nh_admin_token_t *t = token ? nh_admin_tokens_find(c->a->tokens, token) : NULL;
  free(token);
  if (!t) {
    nh_admin_error(c->r, 401, NULL, "this listener needs a login: send Authorization: Bearer TOKEN (a token of "
                   "--admin-token-file)");
    return 1;
  }
  c->role = t->role;
  snprintf(c->who, sizeof c->who, "%s", t->name);
  if (need == OPERATOR && t->role != NH_ROLE_OPERATOR) {
    nh_admin_error(c->r, 403, NULL, "%s is a reader: %s %s needs an operator token", t->name, c->method, c->path);
    return 1;
  }
  return 0;
}

static void on_request(void *data, nh_httpd_req_t *r)
{
  nh_admin_call_t c = { .a = data, .r = r, .method = nh_httpd_req_method(r), .path = nh_httpd_req_path(r) };
  nh_httpd_req_query(r, on_param, &c.q);
  const route_t *hit = NULL;
  int path_known = 0;
  int head = strcmp(c.method, "HEAD") == 0;
  for (size_t i = 0; i < sizeof routes / sizeof routes[0] && !hit; i++) {
    if (!match(routes[i].pattern, c.path, &c, 0)) continue;
    path_known = 1;
    if (strcmp(routes[i].method, c.method) == 0 || (head && strcmp(routes[i].method, "GET") == 0)) hit = &routes[i];
  }
  if (!hit && path_known) {
    nh_admin_error(r, 405, NULL, "%s %s: not a method this route takes (reads are GET, actions POST)", c.method,
                   c.path);
  } else if (!hit) {
    nh_admin_error(r, 404, NULL, "no route %s %s (the API is under /api/v1, described by /api/v1/openapi.json; "
                   "the console is at /console/)", c.method, c.path);
  } else if (refuse(&c, hit->need) || (hit->json && !same_origin_json(&c))) {
    /* answered */
  } else if (!c.a->store && hit->store == SQLITE) {
    /* a PostgreSQL store: a route not built on it yet says so (none is, today: the kind
     * stays for the next route that reads sqlite's file alone) */
    nh_admin_error(r, 501, NULL, "%s %s: not built on a PostgreSQL store yet (docs/store-backends.md)", c.method,
                   c.path);
  } else {
    match(hit->pattern, c.path, &c, 1);
    if (!c.a->store && hit->store == ANY) nh_admin_pg_defer(&c, hit->fn);
    else hit->fn(&c);
  }
  nh_admin_call_clear(&c);
}

void nh_admin_get_health(nh_admin_call_t *c)
{
  json_t *o = json_object();
  json_object_set_new(o, "status", json_string("ok"));
  nh_admin_answer(c->r, 200, o);
}

/* 200 once the adapters are loaded while the store takes writes and the transport is
 * connected; else 503 with the reason (a load balancer or an orchestrator stops sending
 * work; an operator reads why). */
void nh_admin_get_ready(nh_admin_call_t *c)
{
  nh_admin_t *a = c->a;
  char why[256] = "";
  int ready = a->ready && (!a->ready_check || a->ready_check(a->ready_data, why, sizeof why));
  if (!a->ready) snprintf(why, sizeof why, "starting: the adapters are loading");
  json_t *o = json_object();
  json_object_set_new(o, "status", json_string(ready ? "ready" : a->ready ? "not_ready" : "starting"));
  if (!ready) json_object_set_new(o, "reason", json_string(why));
  nh_admin_answer(c->r, ready ? 200 : 503, o);
}

/* The Prometheus exposition (docs/observability.md). */
void nh_admin_get_metrics(nh_admin_call_t *c)
{
  size_t len = 0;
  char *text = nh_metrics_render(&len);
  nh_httpd_header_t h[] = { { "Content-Type", "text/plain; version=0.0.4; charset=utf-8" },
                            { "Cache-Control", "no-store" } };
  nh_error_t err = { 0 };
  nh_httpd_respond(c->r, 200, h, 2, text, len, &err);
  free(text);
}

void nh_admin_get_whoami(nh_admin_call_t *c)
{
  json_t *o = json_object();
  json_object_set_new(o, "name", json_string(c->who));
  json_object_set_new(o, "role", json_string(c->role == NH_ROLE_OPERATOR ? "operator" : "reader"));
  json_object_set_new(o, "login_required", json_boolean(c->a->tokens != NULL));
  json_object_set_new(o, "console_only", json_boolean(c->a->console_only));
  json_object_set_new(o, "store", json_string(c->a->store ? "sqlite" : "postgresql"));
  json_object_set_new(o, "live", json_true());   /* /api/v1/stream is served on either store */
  nh_admin_answer(c->r, 200, o);
}

/* ---------------------------------------------------------------- lifecycle */

nh_admin_t *nh_admin_start(uv_loop_t *loop, nh_store_t *store, const nh_admin_opts_t *opts, nh_error_t *err)
{
  nh_admin_t *a = nh_xcalloc(1, sizeof *a);
  a->loop = loop;
  a->store = store;
  a->console_only = opts->console_only;
  snprintf(a->host, sizeof a->host, "%s", opts->host);
  if (opts->token_file && !(a->tokens = nh_admin_tokens_load(opts->token_file, err))) {
    free(a);
    return NULL;
  }
  if (!a->tokens && !nh_admin_is_loopback(opts->host)) {
    nh_error_set(err, NH_EUSAGE, "--admin %s:%d: a listener on a non-loopback address shows payloads and takes "
                 "actions, so it needs logins: give --admin-token-file FILE (lines of TOKEN ROLE NAME, roles "
                 "reader and operator), or listen on 127.0.0.1", opts->host, opts->port);
    free(a);
    return NULL;
  }
  char owner[64];
  snprintf(owner, sizeof owner, "admin:%ld", (long)getpid());
  if (store && !(a->queue = nh_embedded_init(nh_store_db(store), owner, err))) {
    nh_admin_tokens_free(a->tokens);
    free(a);
    return NULL;
  }
  a->console_dir = nh_admin_console_dir();
  nh_httpd_opts_t o = { .host = opts->host, .port = opts->port, .max_body = 10u << 20, .on_request = on_request,
                        .data = a, .owner = a, .owner_key = "nimbus-admin" };
  char code[32] = "";
  a->h = nh_httpd_start(loop, &o, err, code);
  if (!a->h) {
    char why[sizeof err->msg];
    snprintf(why, sizeof why, "%s", err->msg);
    nh_error_set(err, NH_EUSAGE, "--admin %s:%d: %s%s", opts->host, opts->port, why,
                 strcmp(code, "EADDRINUSE") == 0 ? " (another nimbus-host has the console there? give another port "
                                                   "with --admin 127.0.0.1:PORT, or --admin off)" : "");
    if (a->queue) a->queue->vt->close(a->queue);
    nh_admin_tokens_free(a->tokens);
    free(a->console_dir);
    free(a);
    return NULL;
  }
  a->port = nh_httpd_port(a->h);
  if (!store) {
    a->pg = nh_admin_pg_new(opts->pg_url);
    nh_log_info("admin", "operator API on http://%s:%d/api/v1/, console http://%s:%d/console/: on a PostgreSQL "
                "store, its reads on the thread pool (docs/store-backends.md)", opts->host, a->port, opts->host,
                a->port);
    return a;
  }
  nh_log_info("admin", "operator API on http://%s:%d/api/v1/, console http://%s:%d/console/ (%s%s)", opts->host,
              a->port, opts->host, a->port, a->console_dir ? "files in " : "its files were not found: set NIMBUS_CONSOLE_DIR",
              a->console_dir ? a->console_dir : "");
  return a;
}

void nh_admin_set_ready(nh_admin_t *a, nh_admin_ready_cb check, void *data)
{
  if (!a) return;
  a->ready = 1;
  a->ready_check = check;
  a->ready_data = data;
}

void nh_admin_stop(nh_admin_t *a)
{
  if (a) nh_admin_bulk_close(a);
}

void nh_admin_close(nh_admin_t *a)
{
  if (!a) return;
  nh_admin_bulk_close(a);
  nh_admin_stream_close(a);
  nh_httpd_close(a->h);
  if (a->queue) a->queue->vt->close(a->queue);
  nh_admin_tokens_free(a->tokens);
  nh_admin_cache_clear(&a->endpoints_cache);
  nh_admin_cache_clear(&a->failures_cache);
  free(a->console_dir);
  a->console_dir = NULL;
  if (nh_admin_pg_close(a->pg)) return;   /* reads still out on the pool: the last one frees it */
  free(a);
}
