/* GET /api/v1/... (docs/admin-api.md, "Reads"). */
#include "nh_admin_int.h"
#include "nh_views.h"
#include "core/nh_failgroup.h"
#include "core/nh_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NH_ADMIN_PAGE 100        /* rows per page unless ?limit= */
#define NH_ADMIN_PAGE_MAX 1000

struct ep_ctx {
  nh_admin_call_t *c;
  json_t *arr;
  int failed;
};

static int endpoint_row(void *data, const char *endpoint)
{
  struct ep_ctx *c = data;
  json_t *o = json_object(), *counts = json_object();
  json_object_set_new(o, "endpoint", json_string(endpoint));
  for (int i = 0; nh_store_statuses[i]; i++) {
    nh_event_filter_t f = { .endpoint = endpoint, .status = nh_store_statuses[i] };
    int64_t n = nh_admin_rd_events_count(c->c, &f);
    if (n < 0) c->failed = 1;
    json_object_set_new(counts, nh_store_statuses[i], json_integer(n < 0 ? 0 : n));
  }
  json_object_set_new(o, "counts", counts);
  json_object_set_new(o, "live_hosts", json_integer(nh_admin_live_hosts(c->c, endpoint)));
  nh_endpoint_stats_t st;
  if (nh_admin_rd_endpoint_stats(c->c, endpoint, nh_time_now_ms(), &st)) c->failed = 1;
  json_object_set_new(o, "blocked_sessions", json_integer(st.blocked_sessions));
  json_object_set_new(o, "handoffs_pending", json_integer(st.handoffs_pending));
  json_object_set_new(o, "handoffs_overdue", json_integer(st.handoffs_overdue));
  json_array_append_new(c->arr, o);
  return c->failed;
}

json_t *nh_admin_endpoints_json(nh_admin_call_t *call)
{
  nh_admin_t *a = call->a;
  /* the cache is the loop's: a route on the pool (PostgreSQL) reads every time */
  json_t *cached = call->pg ? NULL : nh_admin_cache_get(a, &a->endpoints_cache);
  if (cached) return cached;
  struct ep_ctx c = { call, json_array(), 0 };
  if (nh_admin_rd_endpoints(call, endpoint_row, &c) < 0 || c.failed) {
    json_decref(c.arr);
    return NULL;
  }
  json_t *o = json_object();
  json_object_set_new(o, "endpoints", c.arr);
  if (!call->pg) nh_admin_cache_put(a, &a->endpoints_cache, o);
  return o;
}

void nh_admin_get_endpoints(nh_admin_call_t *c)
{
  static const char *const known[] = { NULL };
  if (nh_admin_params_check(c, known)) return;
  json_t *o = nh_admin_endpoints_json(c);
  if (!o) {
    nh_admin_store_error(c);
    return;
  }
  nh_admin_answer(c->r, 200, o);
}

static int collect_event(void *data, const nh_audit_t *ev)
{
  json_array_append_new(data, nh_view_audit(ev));
  return 0;
}

/* The query parameters as the filter's JSON object (one parser for them and bulk bodies). */
static json_t *filter_params(nh_admin_call_t *c)
{
  static const char *const names[] = { "endpoint", "status", "type", "session", "event_id", "payload", "error",
                                       "group", "since", "before", NULL };
  json_t *o = json_object();
  for (int i = 0; names[i]; i++) {
    const char *v = nh_admin_param(c, names[i]);
    if (v) json_object_set_new(o, names[i], json_string(v));
  }
  return o;
}

static int page_args(nh_admin_call_t *c, long *limit, long long *after)
{
  *limit = NH_ADMIN_PAGE;
  *after = 0;
  const char *ls = nh_admin_param(c, "limit");
  if (ls && nh_admin_parse_long(c, "limit", ls, 1, NH_ADMIN_PAGE_MAX, limit)) return 1;
  const char *as = nh_admin_param(c, "after");
  if (as) {
    char *end = NULL;
    *after = strtoll(as, &end, 10);
    if (!*as || *end || *after <= 0) {
      nh_admin_error(c->r, 400, "after", "after %s: the cursor a previous page gave as next", as);
      return 1;
    }
  }
  return 0;
}

static void set_next(json_t *o, int full, long long last)
{
  if (!full) {
    json_object_set_new(o, "next", json_null());
    return;
  }
  char next[32];
  snprintf(next, sizeof next, "%lld", last);
  json_object_set_new(o, "next", json_string(next));
}

void nh_admin_get_events(nh_admin_call_t *c)
{
  static const char *const known[] = { "endpoint", "status", "type", "session", "event_id", "payload", "error",
                                       "group", "since", "before", "order", "limit", "after", NULL };
  if (nh_admin_params_check(c, known)) return;
  const char *order = nh_admin_param(c, "order");
  if (order && strcmp(order, "oldest") != 0 && strcmp(order, "newest") != 0) {
    nh_admin_error(c->r, 400, "order", "order %s: oldest or newest", order);
    return;
  }
  long limit;
  long long after;
  if (page_args(c, &limit, &after)) return;
  json_t *params = filter_params(c);
  nh_admin_filter_t af;
  int bad = nh_admin_filter_parse(c, params, &af);
  json_decref(params);
  if (bad) {
    nh_admin_filter_clear(&af);
    return;
  }
  /* keyset on rowid (insert order): pages neither skip nor repeat rows */
  af.f.batch = (int)limit;
  af.f.page = 1;
  af.f.after_rowid = after;
  af.f.desc = order && strcmp(order, "newest") == 0;
  json_t *events = json_array();
  int64_t last = 0;
  int n = nh_admin_rd_events(c, &af.f, collect_event, events, &last);
  nh_admin_filter_clear(&af);
  if (n < 0) {
    json_decref(events);
    nh_admin_store_error(c);
    return;
  }
  json_t *o = json_object();
  json_object_set_new(o, "events", events);
  set_next(o, n == limit, (long long)last);
  nh_admin_answer(c->r, 200, o);
}

static int collect_history(void *data, const nh_history_row_t *row)
{
  json_array_append_new(data, nh_view_history(row));
  return 0;
}

static int collect_oplog(void *data, const nh_oplog_row_t *r)
{
  json_t *o = json_object();
  json_object_set_new(o, "at", nh_view_time(r->at));
  json_object_set_new(o, "actor", nh_view_str(r->actor));
  json_object_set_new(o, "action", nh_view_str(r->action));
  json_object_set_new(o, "detail", nh_view_str(r->detail));
  json_array_append_new(data, o);
  return 0;
}

/* GET /api/v1/events/{id}: by id or a unique prefix of 8 or more characters. */
void nh_admin_get_event(nh_admin_call_t *c)
{
  static const char *const known[] = { NULL };
  if (nh_admin_params_check(c, known)) return;
  nh_audit_t ev;
  memset(&ev, 0, sizeof ev);
  nh_error_t err = {0};
  if (nh_admin_rd_audit_find(c, c->cap[0], &ev, &err)) {
    nh_admin_error(c->r, err.code == NH_ENOTFOUND ? 404 : err.code == NH_EUSAGE ? 400 : 500, NULL, "%s", err.msg);
    return;
  }
  json_t *o = nh_view_audit(&ev);
  json_object_set_new(o, "correlation_id", nh_view_str(ev.correlation_id));
  json_object_set_new(o, "created_at", nh_view_time(ev.created_at));
  json_t *payload = ev.payload ? json_loadb(ev.payload, nh_audit_payload_len(&ev), JSON_DECODE_ANY, NULL) : NULL;
  json_object_set_new(o, "payload", payload ? payload
                                    : ev.payload ? json_stringn(ev.payload, nh_audit_payload_len(&ev)) : json_null());
  json_t *hist = json_array(), *log = json_array();
  int rc = nh_admin_rd_history_list(c, ev.endpoint, ev.event_id, collect_history, hist);
  json_object_set_new(o, "history", hist);
  if (rc >= 0) rc = nh_admin_rd_oplog_list(c, ev.endpoint, ev.event_id, collect_oplog, log);
  json_object_set_new(o, "operator_log", log);
  int waiting = rc >= 0 ? nh_admin_rd_oppending_has(c, ev.endpoint, ev.event_id) : 0;
  json_object_set_new(o, "request_waiting", json_boolean(waiting > 0));
  nh_audit_clear(&ev);
  if (rc < 0 || waiting < 0) {
    json_decref(o);
    nh_admin_store_error(c);
    return;
  }
  nh_admin_answer(c->r, 200, o);
}

struct sess_ctx {
  json_t *arr;
  char *last_ep, *last_session;   /* the cursor: whole, however long a session id is */
};

static int collect_session(void *data, const nh_blocked_row_t *r)
{
  struct sess_ctx *s = data;
  json_t *o = json_object();
  json_object_set_new(o, "endpoint", nh_view_str(r->endpoint));
  json_object_set_new(o, "session_id", nh_view_str(r->session_id));
  json_object_set_new(o, "blocked_by", nh_view_str(r->blocked_by));
  json_object_set_new(o, "status", nh_view_str(r->status));
  json_object_set_new(o, "sub_status", nh_view_str(r->sub_status));
  json_object_set_new(o, "event_type", nh_view_str(r->event_type));
  json_object_set_new(o, "reason", nh_view_str(r->error_text ? r->error_text : r->handoff_reason));
  json_object_set_new(o, "since", nh_view_time(r->since));
  json_object_set_new(o, "retry_due", nh_view_time(r->retry_due));
  json_object_set_new(o, "parked", json_integer(r->parked));
  json_array_append_new(s->arr, o);
  free(s->last_ep);
  free(s->last_session);
  s->last_ep = nh_xstrdup(r->endpoint ? r->endpoint : "");
  s->last_session = nh_xstrdup(r->session_id ? r->session_id : "");
  return 0;
}

/* GET /api/v1/sessions: blocked sessions, (endpoint, session) order; the cursor is the last
 * row's "endpoint\nsession" as JSON [endpoint, session], so it stays a plain string. */
void nh_admin_get_sessions(nh_admin_call_t *c)
{
  static const char *const known[] = { "endpoint", "limit", "after", NULL };
  if (nh_admin_params_check(c, known)) return;
  long limit = NH_ADMIN_PAGE;
  const char *ls = nh_admin_param(c, "limit");
  if (ls && nh_admin_parse_long(c, "limit", ls, 1, NH_ADMIN_PAGE_MAX, &limit)) return;
  const char *after = nh_admin_param(c, "after"), *after_ep = NULL, *after_s = NULL;
  json_t *cursor = NULL;
  if (after) {
    cursor = json_loads(after, 0, NULL);
    if (!json_is_array(cursor) || json_array_size(cursor) != 2 || !json_is_string(json_array_get(cursor, 0)) ||
        !json_is_string(json_array_get(cursor, 1))) {
      json_decref(cursor);
      nh_admin_error(c->r, 400, "after", "after: the cursor a previous page gave as next");
      return;
    }
    after_ep = json_string_value(json_array_get(cursor, 0));
    after_s = json_string_value(json_array_get(cursor, 1));
  }
  struct sess_ctx s = { .arr = json_array() };
  int n = nh_admin_rd_blocked_sessions(c, nh_admin_param(c, "endpoint"), after_ep, after_s, (int)limit,
                                    collect_session, &s);
  json_decref(cursor);
  if (n < 0) {
    json_decref(s.arr);
    free(s.last_ep);
    free(s.last_session);
    nh_admin_store_error(c);
    return;
  }
  json_t *o = json_object();
  json_object_set_new(o, "sessions", s.arr);
  if (n == limit && s.last_ep) {
    json_t *next = json_pack("[ss]", s.last_ep, s.last_session);
    char *txt = json_dumps(next, JSON_COMPACT);
    json_object_set_new(o, "next", json_string(txt));
    free(txt);
    json_decref(next);
  } else {
    json_object_set_new(o, "next", json_null());
  }
  free(s.last_ep);
  free(s.last_session);
  nh_admin_answer(c->r, 200, o);
}

static int collect_group(void *data, const nh_failgroup_row_t *g)
{
  char masked[512];
  nh_failgroup_mask(g->sample_text, masked, sizeof masked);
  json_array_append_new(data, nh_view_failgroup(g, masked));
  return 0;
}

/* GET /api/v1/failures?endpoint=: the failure groups of unresolved events, largest first. */
void nh_admin_get_failures(nh_admin_call_t *c)
{
  static const char *const known[] = { "endpoint", NULL };
  if (nh_admin_params_check(c, known)) return;
  const char *endpoint = nh_admin_param(c, "endpoint");
  json_t *o = endpoint || c->pg ? NULL : nh_admin_cache_get(c->a, &c->a->failures_cache);
  if (o) {
    nh_admin_answer(c->r, 200, o);
    return;
  }
  json_t *arr = json_array();
  if (nh_admin_rd_failgroups(c, endpoint, collect_group, arr) < 0) {
    json_decref(arr);
    nh_admin_store_error(c);
    return;
  }
  o = json_object();
  json_object_set_new(o, "groups", arr);
  if (!endpoint && !c->pg) nh_admin_cache_put(c->a, &c->a->failures_cache, o);
  nh_admin_answer(c->r, 200, o);
}
