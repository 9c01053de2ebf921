/* Inside the admin listener (nh_admin.h): the listener's state, one request as a route
 * sees it, and the helpers every route answers with. Routes live by subject:
 * nh_admin_reads.c (GET /api/v1/...), nh_admin_actions.c (POST actions),
 * nh_admin_static.c (the page and the OpenAPI document), nh_admin_stream.c (SSE; its
 * PostgreSQL poller nh_admin_stream_pg.c),
 * nh_admin_nimbus.c (the NimBus-compatible routes). nh_admin.c routes and owns the rest. */
#ifndef NH_ADMIN_INT_H
#define NH_ADMIN_INT_H

#include <jansson.h>

#include "admin/nh_admin.h"
#include "net/nh_httpd.h"
#include "transport/nh_transport.h"

#define NH_ADMIN_PARAMS 16
#define NH_ADMIN_CAPTURES 3
#define NH_ADMIN_LIVE_MS 30000   /* a host refreshes its row every 10 s: one silent for 30 s is gone */

typedef enum { NH_ROLE_NONE, NH_ROLE_READER, NH_ROLE_OPERATOR } nh_admin_role_t;

struct nh_admin_stream;
struct nh_pg_db;
typedef struct nh_admin_pg nh_admin_pg_t;

/* An answer kept until the store changes, and at most NH_ADMIN_CACHE_MS: the overview
 * counts a million rows' index in 60 ms, and every console and stream asks for it. Never
 * older than the store (a window of staleness while events flow let a stream's last
 * counts event miss the last change); the age limit is for what moves with the clock
 * alone (a host that died writes nothing, a hand-off becomes overdue). */
#define NH_ADMIN_CACHE_MS 5000
typedef struct nh_admin_cached {
  json_t *v;
  int64_t changes, version, at;
  int64_t next_changes, next_version;   /* the key read before the value was computed */
} nh_admin_cached_t;

struct nh_admin {
  uv_loop_t *loop;
  nh_httpd_t *h;
  nh_store_t *store;
  nh_transport_t *queue;   /* operator requests go through the store's queue, as the CLI's do */
  char host[256];
  int port;
  char *console_dir;       /* the page's files (NULL: not found; the API still answers) */
  struct nh_admin_tokens *tokens;   /* NULL: loopback without logins */
  struct nh_admin_stream *stream;
  struct nh_admin_bulk *bulks;      /* bulk actions running (stepped on the loop) */
  int ready;                        /* adapters loaded: /readyz asks ready_check */
  nh_admin_ready_cb ready_check;    /* store and transport usable (nh_dispatch_ready) */
  void *ready_data;
  nh_admin_cached_t endpoints_cache, failures_cache;
  int console_only;                 /* `nimbus-host console`: no adapters here */
  nh_admin_pg_t *pg;                /* a PostgreSQL store: its reads run on the pool (nh_admin_pg.c) */
};

typedef struct nh_admin_params {
  char *key[NH_ADMIN_PARAMS], *val[NH_ADMIN_PARAMS];
  int n;
} nh_admin_params_t;

/* One request as a route sees it. */
typedef struct nh_admin_call {
  nh_admin_t *a;
  nh_httpd_req_t *r;
  const char *method, *path;
  nh_admin_params_t q;                 /* the query string, unescaped */
  char *cap[NH_ADMIN_CAPTURES];        /* the {} segments of the route's pattern, unescaped */
  nh_admin_role_t role;                /* what the caller may do */
  char who[128];                       /* who it is, for the operator log */
  struct nh_pg_db *pg;                 /* set while the route runs on the pool (a PostgreSQL store) */
  char pg_err[512];                    /* the last PostgreSQL read's error (nh_admin_store.c) */
} nh_admin_call_t;

typedef void (*nh_admin_route_fn)(nh_admin_call_t *c);
void nh_admin_call_clear(nh_admin_call_t *c);   /* frees its parameters and captures */

/* ---- routes on a PostgreSQL store (nh_admin_pg.c): run on libuv's thread pool, each on a
 * blocking connection of a small pool, the answer captured and sent from the loop */
typedef struct nh_admin_answer {
  unsigned status;
  json_t *body;
  char retry_after[24];   /* a Retry-After header, when set */
} nh_admin_answer_t;
nh_admin_pg_t *nh_admin_pg_new(const char *url);
void nh_admin_pg_defer(nh_admin_call_t *c, nh_admin_route_fn fn);   /* takes c's parameters and captures */
nh_admin_answer_t *nh_admin_capturing(void);   /* non-NULL on the pool: answers are kept there */
char *nh_admin_pg_header(const char *name);     /* on the pool: the header, read on the loop (caller frees) */
/* A route in two halves (the live stream's opening): fn(c, ud) on the pool as a deferred
 * route; then, on the loop, then(c, ud, 1) when fn answered nothing, which must answer
 * c->r or start a stream on it; then(c, ud, 0) when fn answered or the listener closed
 * meanwhile (the answer is sent for it). ud is then's to free either way. */
typedef void (*nh_admin_pg_fn)(nh_admin_call_t *c, void *ud);
typedef void (*nh_admin_pg_then_fn)(nh_admin_call_t *c, void *ud, int go);
void nh_admin_pg_defer_then(nh_admin_call_t *c, nh_admin_pg_fn fn, nh_admin_pg_then_fn then, void *ud);
/* Work of the listener's own on the pool (the stream's ticks): hold on the loop before
 * queueing it, release on the loop when it is back (the last release after nh_admin_close
 * frees the pool and the listener); take a connection on the pool thread and give it back. */
void nh_admin_pg_hold(nh_admin_pg_t *p);
void nh_admin_pg_release(nh_admin_t *a);
struct nh_pg_db *nh_admin_pg_take(nh_admin_pg_t *p, nh_error_t *err);   /* NULL with err said */
void nh_admin_pg_give(nh_admin_pg_t *p, struct nh_pg_db *db);   /* back to the pool when still good, else closed */
/* 1 if routes are still out: the last one frees the pool and the listener. */
int nh_admin_pg_close(nh_admin_pg_t *p);

/* ---- answers (nh_admin_http.c) */
void nh_admin_answer(nh_httpd_req_t *r, unsigned status, json_t *body);   /* takes body */
/* The same with a Retry-After header (seconds, as text) */
void nh_admin_answer_retry(nh_httpd_req_t *r, unsigned status, json_t *body, const char *retry_after);
/* {"error": message, "field": the parameter or body field at fault (NULL: none)} */
void nh_admin_error(nh_httpd_req_t *r, unsigned status, const char *field, const char *fmt, ...)
  __attribute__((format(printf, 4, 5)));
void nh_admin_store_error(nh_admin_call_t *c);
char *nh_admin_unescape(const char *s, size_t len);
const char *nh_admin_param(const nh_admin_call_t *c, const char *key);
/* Answers 400 naming the first query parameter not in `known` (NULL-terminated). 1 if it did. */
int nh_admin_params_check(nh_admin_call_t *c, const char *const *known);
/* The request header `name` (caller frees), NULL when absent. */
char *nh_admin_header(nh_httpd_req_t *r, const char *name);
/* The body as a JSON object, or NULL with 400 answered (an empty body is {}). */
json_t *nh_admin_body_object(nh_admin_call_t *c);
/* Answers 400 naming the first member of `in` not in `known`. 1 if it did. */
int nh_admin_fields_check(nh_admin_call_t *c, json_t *in, const char *const *known);
/* Parses a whole number in [lo, hi]; 400 naming `field` otherwise. 1 if it answered. */
int nh_admin_parse_long(nh_admin_call_t *c, const char *field, const char *s, long lo, long hi, long *out);
/* 1 if the store has events of the endpoint, 0 if not, NH_EFAIL. */
int nh_admin_endpoint_known(nh_admin_call_t *c, const char *endpoint);

/* ---- the store reads of the routes, on either store (nh_admin_store.c): the sqlite
 * store's nh_store_* or, when c->pg is set, their PostgreSQL twins (nh_pgs_*) */
int nh_admin_rd_events(nh_admin_call_t *c, const nh_event_filter_t *f, nh_audit_cb cb, void *data, int64_t *last);
int64_t nh_admin_rd_events_count(nh_admin_call_t *c, const nh_event_filter_t *f);
int nh_admin_rd_endpoints(nh_admin_call_t *c, int (*cb)(void *data, const char *endpoint), void *data);
int nh_admin_rd_endpoint_stats(nh_admin_call_t *c, const char *endpoint, int64_t now, nh_endpoint_stats_t *out);
int nh_admin_rd_audit_find(nh_admin_call_t *c, const char *id, nh_audit_t *ev, nh_error_t *err);
int nh_admin_rd_history_list(nh_admin_call_t *c, const char *endpoint, const char *event_id, nh_history_cb cb,
                             void *data);
int nh_admin_rd_oplog_list(nh_admin_call_t *c, const char *endpoint, const char *event_id, nh_oplog_cb cb, void *data);
int nh_admin_rd_oppending_has(nh_admin_call_t *c, const char *endpoint, const char *event_id);
int nh_admin_rd_blocked_sessions(nh_admin_call_t *c, const char *endpoint, const char *after_endpoint,
                                 const char *after_session, int limit, nh_blocked_cb cb, void *data);
int nh_admin_rd_failgroups(nh_admin_call_t *c, const char *endpoint, nh_failgroup_cb cb, void *data);
int nh_admin_rd_failgroup_endpoint(nh_admin_call_t *c, const char *group, char *endpoint, size_t len);
/* The newest history id (0: none), NH_EFAIL. */
int64_t nh_admin_rd_history_last_id(nh_admin_call_t *c);
/* PostgreSQL only (c->pg set): nh_pgs_history_after, history rows after `after` or in the
 * gaps, each with its event as it is now (NULL: gone); the rows read or NH_EFAIL. */
int nh_admin_rd_history_follow(nh_admin_call_t *c, int64_t after, const int64_t *gaps, int ngaps, int limit,
                               void (*cb)(void *data, int64_t id, const nh_audit_t *a), void *data);
/* The number of live hosts serving an endpoint. */
int nh_admin_live_hosts(nh_admin_call_t *c, const char *endpoint);

/* The cached value (a new reference) when the store has not changed since and it is
 * young enough; NULL otherwise, and the store's key then is what nh_admin_cache_put
 * files the value under (read before computing: a commit meanwhile makes it stale at
 * once). nh_admin_cache_put keeps a reference. */
json_t *nh_admin_cache_get(nh_admin_t *a, nh_admin_cached_t *c);
void nh_admin_cache_put(nh_admin_t *a, nh_admin_cached_t *c, json_t *v);
void nh_admin_cache_clear(nh_admin_cached_t *c);

/* The answer of GET /api/v1/endpoints ({"endpoints": [...]}), or NULL when the store
 * failed (the stream's counts event sends the same). */
json_t *nh_admin_endpoints_json(nh_admin_call_t *c);

/* ---- routes */
void nh_admin_get_endpoints(nh_admin_call_t *c);
void nh_admin_get_events(nh_admin_call_t *c);
void nh_admin_get_event(nh_admin_call_t *c);
void nh_admin_get_sessions(nh_admin_call_t *c);
void nh_admin_get_failures(nh_admin_call_t *c);
void nh_admin_post_resubmit(nh_admin_call_t *c);
void nh_admin_post_skip(nh_admin_call_t *c);
void nh_admin_post_handoff_complete(nh_admin_call_t *c);
void nh_admin_post_handoff_fail(nh_admin_call_t *c);
void nh_admin_post_bulk_resubmit(nh_admin_call_t *c);
void nh_admin_post_bulk_skip(nh_admin_call_t *c);
void nh_admin_get_whoami(nh_admin_call_t *c);
void nh_admin_get_health(nh_admin_call_t *c);
void nh_admin_get_ready(nh_admin_call_t *c);
void nh_admin_get_metrics(nh_admin_call_t *c);

/* the page and the OpenAPI document (nh_admin_static.c) */
char *nh_admin_console_dir(void);   /* NULL: not found */
void nh_admin_get_static(nh_admin_call_t *c);
void nh_admin_get_openapi(nh_admin_call_t *c);

/* Server-Sent Events (nh_admin_stream.c; on PostgreSQL nh_admin_stream_pg.c) */
void nh_admin_get_stream(nh_admin_call_t *c);
void nh_admin_stream_close(nh_admin_t *a);   /* ends every stream (the listener closes) */

/* NimBus-compatible routes (nh_admin_nimbus.c) */
void nh_admin_nimbus_status_count(nh_admin_call_t *c);
void nh_admin_nimbus_get_by_filter(nh_admin_call_t *c);
void nh_admin_nimbus_resubmit(nh_admin_call_t *c);
void nh_admin_nimbus_skip(nh_admin_call_t *c);

/* Ends the bulk runs still stepping (the listener closes; their requests answered 503). */
void nh_admin_bulk_close(nh_admin_t *a);

/* Queues a single-event action as the CLI does (nh_operator_submit) and answers: 202 with
 * the event, 409 with the event as it is now, 404 unknown event. */
struct nh_op_req;
void nh_admin_submit(nh_admin_call_t *c, struct nh_op_req *req);

/* Builds an event filter from query parameters or a JSON object's members (the same names:
 * endpoint, status, type, session, event_id, payload, error, group, since, before). Lists
 * (status, type) are comma-separated strings or JSON arrays. 1 with 400 answered on bad
 * input. The filter points into `keep`, which the caller frees after use. */
typedef struct nh_admin_filter {
  nh_event_filter_t f;
  json_t *keep;
} nh_admin_filter_t;
int nh_admin_filter_parse(nh_admin_call_t *c, json_t *from, nh_admin_filter_t *out);
void nh_admin_filter_clear(nh_admin_filter_t *out);

#endif
