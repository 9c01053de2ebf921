/* The admin listener (nh_admin.h): routes, query parsing, JSON answers. Each request is
 * answered at once from the store (reads outside the pump's transaction, on the loop). */
#include "nh_admin.h"
#include "nh_views.h"
#include "core/nh_failgroup.h"
#include "core/nh_log.h"
#include "core/nh_util.h"
#include "dispatch/nh_operator.h"
#include "net/nh_httpd.h"
#include "transport/nh_embedded.h"

#include <curl/curl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define NH_ADMIN_PAGE 100        /* events per page unless ?limit= */
#define NH_ADMIN_PAGE_MAX 1000

struct nh_admin {
  nh_httpd_t *h;
  nh_store_t *store;
  nh_transport_t *queue;   /* operator requests go through the store's queue, as the CLI's do */
  int port;
};

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
  /* No login yet: the API shows payloads, so it answers on this machine only. */
  if (strcmp(host, "localhost") != 0 && strncmp(host, "127.", 4) != 0)
    return nh_error_set(err, NH_EUSAGE, "--admin %s: only a loopback address (127.0.0.1 or localhost) for now: the "
                        "API has no login yet", s);
  *port = (int)v;
  return NH_OK;
}

/* ---------------------------------------------------------------- answers */

static void answer(nh_httpd_req_t *r, unsigned status, json_t *body)
{
  char *s = json_dumps(body, JSON_COMPACT | JSON_PRESERVE_ORDER);
  json_decref(body);
  static const nh_httpd_header_t hdrs[] = { { "Content-Type", "application/json" },
                                            { "Cache-Control", "no-store" } };
  nh_error_t err = {0};
  nh_httpd_respond(r, status, hdrs, 2, s ? s : "{}", s ? strlen(s) : 2, &err);
  free(s);
}

/* An error: {"error": message, "field": the query parameter at fault (when one is)}. */
static void answer_error(nh_httpd_req_t *r, unsigned status, const char *field, const char *fmt, ...)
  __attribute__((format(printf, 4, 5)));
static void answer_error(nh_httpd_req_t *r, unsigned status, const char *field, const char *fmt, ...)
{
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  json_t *o = json_object();
  json_object_set_new(o, "error", json_string(msg));
  if (field) json_object_set_new(o, "field", json_string(field));
  answer(r, status, o);
}

static void answer_store_error(nh_admin_t *a, nh_httpd_req_t *r)
{
  answer_error(r, 500, NULL, "store: %s", nh_store_errmsg(a->store));
}

/* ---------------------------------------------------------------- query parameters */

#define NH_ADMIN_PARAMS 8

typedef struct params {
  char *key[NH_ADMIN_PARAMS], *val[NH_ADMIN_PARAMS];
  int n;
  char *unknown;   /* the first parameter no route takes */
} params_t;

static char *unescape(const char *s, size_t len)
{
  int n = 0;
  char *u = curl_easy_unescape(NULL, s, (int)len, &n);
  char *out = u ? nh_xstrndup(u, (size_t)n) : nh_xstrndup(s, len);
  curl_free(u);
  return out;
}

static void on_param(void *ud, const char *key, size_t klen, const char *val, size_t vlen)
{
  params_t *p = ud;
  if (p->n == NH_ADMIN_PARAMS) return;
  p->key[p->n] = unescape(key, klen);
  p->val[p->n] = val ? unescape(val, vlen) : nh_xstrdup("");
  p->n++;
}

static void params_clear(params_t *p)
{
  for (int i = 0; i < p->n; i++) {
    free(p->key[i]);
    free(p->val[i]);
  }
  p->n = 0;
}

static const char *param(const params_t *p, const char *key)
{
  for (int i = 0; i < p->n; i++)
    if (strcmp(p->key[i], key) == 0) return p->val[i];
  return NULL;
}

/* The first parameter not in `known` (NULL-terminated), or NULL. */
static const char *param_unknown(const params_t *p, const char *const *known)
{
  for (int i = 0; i < p->n; i++) {
    int ok = 0;
    for (int k = 0; known[k] && !ok; k++) ok = strcmp(p->key[i], known[k]) == 0;
    if (!ok) return p->key[i];
  }
  return NULL;
}

/* ---------------------------------------------------------------- routes */

struct ep_ctx {
  nh_admin_t *a;
  json_t *arr;
  int failed;
};

static int endpoint_counts(void *data, const char *endpoint)
{
  struct ep_ctx *c = data;
  json_t *o = json_object(), *counts = json_object();
  json_object_set_new(o, "endpoint", json_string(endpoint));
  for (int i = 0; nh_store_statuses[i]; i++) {
    nh_event_filter_t f = { .endpoint = endpoint, .status = nh_store_statuses[i] };
    int64_t n = nh_store_events_count(c->a->store, &f);
    if (n < 0) c->failed = 1;
    json_object_set_new(counts, nh_store_statuses[i], json_integer(n < 0 ? 0 : n));
  }
  json_object_set_new(o, "counts", counts);
  json_object_set_new(o, "live_hosts",
                      json_integer(nh_store_hosts_serving(c->a->store, endpoint, nh_time_now_ms() - 30000)));
  json_array_append_new(c->arr, o);
  return c->failed;
}

/* GET /api/v1/endpoints: every endpoint with events, its count per status, its live hosts. */
static void get_endpoints(nh_admin_t *a, nh_httpd_req_t *r)
{
  struct ep_ctx c = { a, json_array(), 0 };
  if (nh_store_endpoints(a->store, endpoint_counts, &c) < 0 || c.failed) {
    json_decref(c.arr);
    answer_store_error(a, r);
    return;
  }
  json_t *o = json_object();
  json_object_set_new(o, "endpoints", c.arr);
  answer(r, 200, o);
}

static int collect_event(void *data, const nh_audit_t *ev)
{
  json_array_append_new(data, nh_view_audit(ev));
  return 0;
}

/* An endpoint the store knows, or 0 with the answer given. */
struct known_ep {
  const char *want;
  int found;
};

static int match_endpoint(void *data, const char *endpoint)
{
  struct known_ep *k = data;
  k->found = k->found || strcmp(k->want, endpoint) == 0;
  return k->found;
}

/* GET /api/v1/events?endpoint=&status=&type=&session=&limit=&after=: oldest first, a page at a
 * time; `next` is the cursor of the following page (null on the last). */
static void get_events(nh_admin_t *a, nh_httpd_req_t *r, const params_t *p)
{
  static const char *const known[] = { "endpoint", "status", "type", "session", "limit", "after", NULL };
  const char *bad = param_unknown(p, known);
  if (bad) {
    answer_error(r, 400, bad, "unknown parameter %s (known: endpoint, status, type, session, limit, after)", bad);
    return;
  }
  nh_event_filter_t f = { .endpoint = param(p, "endpoint"), .type = param(p, "type"), .session = param(p, "session") };
  const char *status = param(p, "status");
  if (status) {
    f.status = nh_store_status_canon(status);
    if (!f.status) {
      answer_error(r, 400, "status", "unknown status %s (known: Completed, Failed, Pending, Deferred, DeadLettered, "
                   "Unsupported, Skipped)", status);
      return;
    }
  }
  if (f.endpoint) {
    struct known_ep k = { f.endpoint, 0 };
    if (nh_store_endpoints(a->store, match_endpoint, &k) < 0) {
      answer_store_error(a, r);
      return;
    }
    if (!k.found) {
      answer_error(r, 400, "endpoint", "unknown endpoint %s (GET /api/v1/endpoints lists them)", f.endpoint);
      return;
    }
  }
  long limit = NH_ADMIN_PAGE;
  const char *ls = param(p, "limit");
  if (ls) {
    char *end = NULL;
    limit = strtol(ls, &end, 10);
    if (!*ls || *end || limit < 1 || limit > NH_ADMIN_PAGE_MAX) {
      answer_error(r, 400, "limit", "limit %s: a whole number from 1 to %d", ls, NH_ADMIN_PAGE_MAX);
      return;
    }
  }
  const char *after = param(p, "after");
  if (after) {
    char *end = NULL;
    long long v = strtoll(after, &end, 10);
    if (!*after || *end || v < 0) {
      answer_error(r, 400, "after", "after %s: the cursor a previous page gave as next", after);
      return;
    }
    f.after_rowid = v;
  }
  f.batch = (int)limit;   /* insert order, keyset on rowid: pages neither skip nor repeat rows */
  json_t *events = json_array();
  int64_t last = 0;
  int n = nh_store_events(a->store, &f, collect_event, events, &last);
  if (n < 0) {
    json_decref(events);
    answer_store_error(a, r);
    return;
  }
  json_t *o = json_object();
  json_object_set_new(o, "events", events);
  if (n == limit) {
    char next[32];
    snprintf(next, sizeof next, "%lld", (long long)last);
    json_object_set_new(o, "next", json_string(next));
  } else {
    json_object_set_new(o, "next", json_null());
  }
  answer(r, 200, o);
}

static int collect_history(void *data, const nh_history_row_t *row)
{
  json_array_append_new(data, nh_view_history(row));
  return 0;
}

/* GET /api/v1/events/{id}: the event (by id or a unique prefix of 8 or more characters),
 * its payload and its whole history. */
static void get_event(nh_admin_t *a, nh_httpd_req_t *r, const char *id)
{
  nh_audit_t ev;
  memset(&ev, 0, sizeof ev);
  nh_error_t err = {0};
  if (nh_store_audit_find(a->store, id, &ev, &err)) {
    answer_error(r, err.code == NH_ENOTFOUND ? 404 : err.code == NH_EUSAGE ? 400 : 500, NULL, "%s", err.msg);
    return;
  }
  json_t *o = nh_view_audit(&ev);
  json_object_set_new(o, "correlation_id", nh_view_str(ev.correlation_id));
  json_object_set_new(o, "created_at", nh_view_time(ev.created_at));
  json_t *payload = ev.payload ? json_loadb(ev.payload, nh_audit_payload_len(&ev), 0, NULL) : NULL;
  json_object_set_new(o, "payload", payload ? payload : nh_view_str(ev.payload));
  json_t *hist = json_array();
  int rc = nh_store_history_list(a->store, ev.endpoint, ev.event_id, collect_history, hist);
  json_object_set_new(o, "history", hist);
  nh_audit_clear(&ev);
  if (rc < 0) {
    json_decref(o);
    answer_store_error(a, r);
    return;
  }
  answer(r, 200, o);
}

static int collect_group(void *data, const nh_failgroup_row_t *g)
{
  char masked[512];
  nh_failgroup_mask(g->sample_text, masked, sizeof masked);
  json_array_append_new(data, nh_view_failgroup(g, masked));
  return 0;
}

/* GET /api/v1/failures?endpoint=: the failure groups of unresolved events, largest first. */
static void get_failures(nh_admin_t *a, nh_httpd_req_t *r, const params_t *p)
{
  static const char *const known[] = { "endpoint", NULL };
  const char *bad = param_unknown(p, known);
  if (bad) {
    answer_error(r, 400, bad, "unknown parameter %s (known: endpoint)", bad);
    return;
  }
  json_t *arr = json_array();
  if (nh_store_failgroups(a->store, param(p, "endpoint"), collect_group, arr) < 0) {
    json_decref(arr);
    answer_store_error(a, r);
    return;
  }
  json_t *o = json_object();
  json_object_set_new(o, "groups", arr);
  answer(r, 200, o);
}

/* ---------------------------------------------------------------- actions */

struct hdrs {
  const char *want;
  char *value;
};

static void on_header(void *ud, const char *key, size_t klen, const char *val, size_t vlen)
{
  struct hdrs *h = ud;
  if (!h->value && strlen(h->want) == klen && strncasecmp(key, h->want, klen) == 0)
    h->value = nh_xstrndup(val ? val : "", val ? vlen : 0);
}

static char *header(nh_httpd_req_t *r, const char *name)
{
  struct hdrs h = { name, NULL };
  nh_httpd_req_headers(r, on_header, &h);
  return h.value;
}

/* An action must come as JSON from this origin: a page of another site can post a form
 * (text/plain, urlencoded) without asking, but not JSON, and its Origin names it. */
static int action_allowed(nh_admin_t *a, nh_httpd_req_t *r)
{
  char *type = header(r, "Content-Type"), *origin = header(r, "Origin");
  int json = type && strncasecmp(type, "application/json", 16) == 0;
  char same1[64], same2[64];
  snprintf(same1, sizeof same1, "http://127.0.0.1:%d", a->port);
  snprintf(same2, sizeof same2, "http://localhost:%d", a->port);
  int same = !origin || strcmp(origin, same1) == 0 || strcmp(origin, same2) == 0;
  if (!json)
    answer_error(r, 415, NULL, "actions take a JSON body: send Content-Type: application/json");
  else if (!same)
    answer_error(r, 403, NULL, "actions are taken from this API's own origin only, not from %s", origin);
  free(type);
  free(origin);
  return json && same;
}

/* POST /api/v1/events/{id}/resubmit {"body": {...}?, "force": false} and
 * POST /api/v1/events/{id}/skip {}: queued like the CLI's (nh_operator_submit: the same
 * checks, one request per event at a time, the operator log), applied by the host that
 * owns the endpoint. 202 with the event; 409 when the event cannot take it now. */
static void post_action(nh_admin_t *a, nh_httpd_req_t *r, const char *id, nh_op_kind_t kind)
{
  if (!action_allowed(a, r)) return;
  size_t len = 0;
  const char *raw = nh_httpd_req_body(r, &len);
  json_error_t jerr;
  json_t *in = len ? json_loadb(raw, len, 0, &jerr) : json_object();
  if (!in || !json_is_object(in)) {
    answer_error(r, 400, NULL, "the body must be a JSON object%s%s", in ? "" : ": ", in ? "" : jerr.text);
    json_decref(in);
    return;
  }
  json_t *body = json_object_get(in, "body"), *force = json_object_get(in, "force");
  const char *key;
  json_t *v;
  json_object_foreach(in, key, v) {
    if (strcmp(key, "force") == 0 || (kind == NH_OP_RESUBMIT && strcmp(key, "body") == 0)) continue;
    answer_error(r, 400, key, "unknown field %s (%s)", key, kind == NH_OP_RESUBMIT ? "body, force" : "force");
    json_decref(in);
    return;
  }
  if ((body && !json_is_object(body)) || (force && !json_is_boolean(force))) {
    answer_error(r, 400, body && !json_is_object(body) ? "body" : "force", "%s",
                 body && !json_is_object(body) ? "body: the event's new JSON object" : "force: true or false");
    json_decref(in);
    return;
  }
  char *text = body ? json_dumps(body, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
  nh_op_req_t req = { .kind = kind, .event_id = id, .body = text, .actor = "admin API",
                      .force = force && json_is_true(force) };
  nh_audit_t ev;
  memset(&ev, 0, sizeof ev);
  nh_error_t err = {0};
  int rc = nh_operator_submit(a->store, a->queue, &req, &ev, &err);
  free(text);
  json_decref(in);
  if (rc) {
    unsigned status = rc == NH_ESTATE ? 409 : rc == NH_EUSAGE ? 404 : 500;
    if (rc == NH_ESTATE) {
      /* what the event is now, for the caller to decide */
      nh_audit_t now;
      nh_error_t ferr = {0};
      memset(&now, 0, sizeof now);
      json_t *o = json_object();
      json_object_set_new(o, "error", json_string(err.msg));
      if (nh_store_audit_find(a->store, id, &now, &ferr) == NH_OK) {
        json_object_set_new(o, "event", nh_view_audit(&now));
        nh_audit_clear(&now);
      }
      answer(r, status, o);
    } else {
      answer_error(r, status, NULL, "%s", err.msg);
    }
    return;
  }
  json_t *o = json_object();
  json_object_set_new(o, "queued", json_string(nh_operator_name(kind)));
  json_object_set_new(o, "event", nh_view_audit(&ev));
  json_object_set_new(o, "live_hosts", json_integer(nh_store_hosts_serving(a->store, ev.endpoint,
                                                                             nh_time_now_ms() - 30000)));
  nh_audit_clear(&ev);
  answer(r, 202, o);
}

static void on_request(void *data, nh_httpd_req_t *r)
{
  nh_admin_t *a = data;
  const char *method = nh_httpd_req_method(r);
  const char *path = nh_httpd_req_path(r);
  params_t p = { 0 };
  nh_httpd_req_query(r, on_param, &p);
  /* /api/v1/events/ID, /api/v1/events/ID/resubmit, /api/v1/events/ID/skip */
  static const char events_prefix[] = "/api/v1/events/";
  size_t np = sizeof events_prefix - 1;
  const char *id = strncmp(path, events_prefix, np) == 0 && path[np] && path[np] != '/' ? path + np : NULL;
  const char *slash = id ? strchr(id, '/') : NULL;
  int action = slash && (strcmp(slash, "/resubmit") == 0 || strcmp(slash, "/skip") == 0);
  int read = !slash && (id || strcmp(path, "/api/v1/endpoints") == 0 || strcmp(path, "/api/v1/events") == 0 ||
                        strcmp(path, "/api/v1/failures") == 0);
  if (!action && !read) {
    answer_error(r, 404, NULL, "no route %s %s (the API is under /api/v1: endpoints, events, events/ID, "
                 "events/ID/resubmit, events/ID/skip, failures)", method, path);
  } else if (action && strcmp(method, "POST") != 0) {
    answer_error(r, 405, NULL, "%s %s: actions are POST", method, path);
  } else if (action) {
    char *eid = unescape(id, (size_t)(slash - id));
    post_action(a, r, eid, strcmp(slash, "/skip") == 0 ? NH_OP_SKIP : NH_OP_RESUBMIT);
    free(eid);
  } else if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
    answer_error(r, 405, NULL, "%s %s: only GET is served here", method, path);
  } else if (id) {
    char *eid = unescape(id, strlen(id));
    get_event(a, r, eid);
    free(eid);
  } else if (strcmp(path, "/api/v1/endpoints") == 0) {
    get_endpoints(a, r);
  } else if (strcmp(path, "/api/v1/events") == 0) {
    get_events(a, r, &p);
  } else {
    get_failures(a, r, &p);
  }
  params_clear(&p);
}

/* ---------------------------------------------------------------- lifecycle */

nh_admin_t *nh_admin_start(uv_loop_t *loop, nh_store_t *store, const char *host, int port, nh_error_t *err)
{
  nh_admin_t *a = nh_xcalloc(1, sizeof *a);
  a->store = store;
  nh_httpd_opts_t o = { .host = host, .port = port, .max_body = 10u << 20, .on_request = on_request, .data = a,
                        .owner = a, .owner_key = "nimbus-admin" };
  char owner[64];
  snprintf(owner, sizeof owner, "admin:%ld", (long)getpid());
  a->queue = nh_embedded_init(nh_store_db(store), owner, err);
  if (!a->queue) {
    free(a);
    return NULL;
  }
  char code[32] = "";
  a->h = nh_httpd_start(loop, &o, err, code);
  if (!a->h) {
    char why[sizeof err->msg];
    snprintf(why, sizeof why, "%s", err->msg);
    nh_error_set(err, NH_EUSAGE, "--admin %s:%d: %s%s", host, port, why,
                 strcmp(code, "EADDRINUSE") == 0 ? " (give another port with --admin, or --admin off)" : "");
    a->queue->vt->close(a->queue);
    free(a);
    return NULL;
  }
  a->port = nh_httpd_port(a->h);
  nh_log_info("admin", "operator API on http://%s:%d/api/v1/", host, a->port);
  return a;
}

void nh_admin_close(nh_admin_t *a)
{
  if (!a) return;
  nh_httpd_close(a->h);
  a->queue->vt->close(a->queue);
  free(a);
}
