/* NimBus-compatible routes (docs/admin-api.md, "NimBus-compatible routes"): scripts written
 * against NimBus's operator API keep working, with NimBus's paths, header and field names.
 * Each route translates NimBus's names onto the /api/v1 machinery (the event filter, the
 * keyset paging, nh_admin_submit) rather than reading the store its own way, so the two
 * APIs cannot disagree about what an event is or what an action may do. */
#include "nh_admin_int.h"
#include "nh_views.h"
#include "core/nh_util.h"
#include "dispatch/nh_operator.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NIMBUS_API_VERSION "2"
#define NIMBUS_PAGE 100          /* maxSearchItemsCount unless given */
#define NIMBUS_PAGE_MAX 1000
#define NIMBUS_LIST_MAX 8        /* values of a list filter (the event filter holds 8) */

/* NimBus clients send `api-version: 2`; another version expects other shapes, so it is
 * refused rather than half understood. 1 if it answered. */
static int api_version_bad(nh_admin_call_t *c)
{
  char *v = nh_admin_header(c->r, "api-version");
  int bad = !v || strcmp(v, NIMBUS_API_VERSION) != 0;
  if (bad)
    nh_admin_error(c->r, 400, "api-version", "the NimBus-compatible routes need the header api-version: %s (got %s)",
                   NIMBUS_API_VERSION, v ? v : "none");
  free(v);
  return bad;
}

/* What every route checks first: the header, and no query string (none takes one). */
static int refused(nh_admin_call_t *c)
{
  static const char *const none[] = { NULL };
  return api_version_bad(c) || nh_admin_params_check(c, none);
}

/* ---------------------------------------------------------------- POST /api/endpoint/status/count */

/* The body: a JSON array of endpoint names. NULL with 400 answered otherwise. */
static json_t *endpoint_list(nh_admin_call_t *c)
{
  size_t len = 0;
  const char *raw = nh_httpd_req_body(c->r, &len);
  json_error_t jerr;
  json_t *in = len ? json_loadb(raw, len, 0, &jerr) : NULL;
  if (!in || !json_is_array(in)) {
    nh_admin_error(c->r, 400, NULL, "the body must be a JSON array of endpoint names%s%s", in || !len ? "" : ": ",
                   in || !len ? "" : jerr.text);
    json_decref(in);
    return NULL;
  }
  size_t i;
  json_t *e;
  json_array_foreach(in, i, e) {
    if (!json_is_string(e) || !json_string_length(e)) {
      char field[32];
      snprintf(field, sizeof field, "[%zu]", i);
      nh_admin_error(c->r, 400, field, "item %zu of the body: an endpoint name (a non-empty string)", i);
      json_decref(in);
      return NULL;
    }
  }
  return in;
}

/* The counts member of /api/v1/endpoints for `name`, NULL when the store has no event of it. */
static json_t *counts_of(json_t *endpoints, const char *name)
{
  size_t i;
  json_t *ep;
  json_array_foreach(json_object_get(endpoints, "endpoints"), i, ep) {
    if (strcmp(json_string_value(json_object_get(ep, "endpoint")), name) == 0) return json_object_get(ep, "counts");
  }
  return NULL;
}

static json_int_t count_of(json_t *counts, const char *status)
{
  return json_integer_value(json_object_get(counts, status));   /* absent (no events yet): 0 */
}

static json_t *status_count(const char *name, json_t *counts)
{
  json_t *o = json_object();
  json_object_set_new(o, "endpointId", json_string(name));
  json_object_set_new(o, "failedCount", json_integer(count_of(counts, NH_ST_FAILED)));
  json_object_set_new(o, "deferredCount", json_integer(count_of(counts, NH_ST_DEFERRED)));
  json_object_set_new(o, "pendingCount", json_integer(count_of(counts, NH_ST_PENDING)));
  json_object_set_new(o, "unsupportedCount", json_integer(count_of(counts, NH_ST_UNSUPPORTED)));
  json_object_set_new(o, "deadletterCount", json_integer(count_of(counts, NH_ST_DEADLETTERED)));
  json_object_set_new(o, "completedCount", json_integer(count_of(counts, NH_ST_COMPLETED)));
  json_object_set_new(o, "skippedCount", json_integer(count_of(counts, NH_ST_SKIPPED)));
  return o;
}

/* Answers one entry per name asked, in the order asked. An endpoint the store has no
 * event of counts zero everywhere, as in NimBus, where an endpoint exists before its
 * first event: a script polling a quiet endpoint must not break. */
void nh_admin_nimbus_status_count(nh_admin_call_t *c)
{
  if (refused(c)) return;
  json_t *names = endpoint_list(c);
  if (!names) return;
  json_t *all = nh_admin_endpoints_json(c);   /* the same counts as GET /api/v1/endpoints */
  if (!all) {
    json_decref(names);
    nh_admin_store_error(c);
    return;
  }
  json_t *out = json_array();
  size_t i;
  json_t *e;
  json_array_foreach(names, i, e) {
    const char *name = json_string_value(e);
    json_array_append_new(out, status_count(name, counts_of(all, name)));
  }
  json_decref(all);
  json_decref(names);
  nh_admin_answer(c->r, 200, out);
}

/* ---------------------------------------------------------------- POST /api/event/{endpoint}/getByFilter */

/* NimBus's clients serialise every member of their filter class, unset ones as null, ""
 * or []: those mean "no filter", never an error. */
static int unset(json_t *v)
{
  return !v || json_is_null(v) || (json_is_string(v) && !json_string_length(v)) ||
         (json_is_array(v) && !json_array_size(v));
}

static void field_error(nh_admin_call_t *c, const char *name, const char *what)
{
  char field[128];
  snprintf(field, sizeof field, "eventFilter.%.100s", name);
  nh_admin_error(c->r, 400, field, "%s: %s", field, what);
}

/* A string member of eventFilter copied to `into` under the filter's name; 1 with 400. */
static int map_str(nh_admin_call_t *c, json_t *from, const char *name, json_t *into, const char *as)
{
  json_t *v = json_object_get(from, name);
  if (unset(v)) return 0;
  if (!json_is_string(v)) {
    field_error(c, name, "a string");
    return 1;
  }
  json_object_set(into, as, v);
  return 0;
}

/* A list member (resolutionStatus, eventTypeId): a string or an array of 1..8 strings. */
static int map_list(nh_admin_call_t *c, json_t *from, const char *name, json_t *into, const char *as, int statuses)
{
  json_t *v = json_object_get(from, name);
  if (unset(v)) return 0;
  json_t *list = json_is_string(v) ? json_pack("[O]", v) : json_is_array(v) ? json_incref(v) : NULL;
  size_t i;
  json_t *e;
  int bad = !list || json_array_size(list) > NIMBUS_LIST_MAX;
  json_array_foreach(list, i, e) bad = bad || !json_is_string(e) || !json_string_length(e);
  if (bad) {
    field_error(c, name, "a list of one to eight non-empty strings");
    json_decref(list);
    return 1;
  }
  json_array_foreach(list, i, e) {
    if (statuses && !nh_store_status_canon(json_string_value(e))) {
      char what[256];
      snprintf(what, sizeof what, "unknown status %.100s (known: Completed, Failed, Pending, Deferred, DeadLettered, "
               "Unsupported, Skipped)", json_string_value(e));
      field_error(c, name, what);
      json_decref(list);
      return 1;
    }
  }
  json_object_set_new(into, as, list);
  return 0;
}

/* eventFilter in NimBus's names -> the members nh_admin_filter_parse takes. Unknown
 * members that are set are refused: a filter silently ignored would match too much. */
static int map_filter(nh_admin_call_t *c, json_t *ef, json_t *into)
{
  static const char *const known[] = { "sessionId", "eventId", "resolutionStatus", "eventTypeId", "payload", NULL };
  if (unset(ef)) return 0;
  if (!json_is_object(ef)) {
    nh_admin_error(c->r, 400, "eventFilter", "eventFilter: a JSON object");
    return 1;
  }
  const char *key;
  json_t *v;
  json_object_foreach(ef, key, v) {
    int ok = unset(v);
    for (int k = 0; known[k] && !ok; k++) ok = strcmp(key, known[k]) == 0;
    if (!ok) {
      field_error(c, key, "unknown member (known: sessionId, eventId, resolutionStatus, eventTypeId, payload)");
      return 1;
    }
  }
  if (map_str(c, ef, "sessionId", into, "session") || map_str(c, ef, "eventId", into, "event_id") ||
      map_str(c, ef, "payload", into, "payload"))
    return 1;
  return map_list(c, ef, "resolutionStatus", into, "status", 1) || map_list(c, ef, "eventTypeId", into, "type", 0);
}

/* The page size and the cursor. The continuation token is the rowid of the last event of
 * the previous page: keyset paging in insert order, as /api/v1/events, so pages neither
 * skip nor repeat an event that was there when the first page was read. */
static int paging(nh_admin_call_t *c, json_t *in, long *max, int64_t *after)
{
  json_t *m = json_object_get(in, "maxSearchItemsCount"), *t = json_object_get(in, "continuationToken");
  *max = NIMBUS_PAGE;
  *after = 0;
  if (m && !json_is_null(m)) {
    if (!json_is_integer(m) || json_integer_value(m) < 1 || json_integer_value(m) > NIMBUS_PAGE_MAX) {
      nh_admin_error(c->r, 400, "maxSearchItemsCount", "maxSearchItemsCount: a whole number from 1 to %d",
                     NIMBUS_PAGE_MAX);
      return 1;
    }
    *max = (long)json_integer_value(m);
  }
  if (unset(t)) return 0;
  const char *s = json_is_string(t) ? json_string_value(t) : "";
  char *end = NULL;
  long long v = strtoll(s, &end, 10);
  if (!*s || *end || v < 1) {
    nh_admin_error(c->r, 400, "continuationToken",
                   "continuationToken: the continuationToken of the previous page, or \"\" for the first");
    return 1;
  }
  *after = v;
  return 0;
}

static json_t *nimbus_event(const nh_audit_t *ev)
{
  json_t *o = json_object();
  json_object_set_new(o, "eventId", nh_view_str(ev->event_id));
  json_object_set_new(o, "sessionId", nh_view_str(ev->session_id));
  json_object_set_new(o, "eventTypeId", nh_view_str(ev->event_type));
  json_object_set_new(o, "resolutionStatus", nh_view_str(ev->status));
  json_object_set_new(o, "lastMessageId", nh_view_str(ev->message_id));
  json_object_set_new(o, "pendingSubStatus", nh_view_str(ev->sub_status));
  json_object_set_new(o, "handoffReason", nh_view_str(ev->handoff_reason));
  json_object_set_new(o, "externalJobId", nh_view_str(ev->external_job_id));
  json_object_set_new(o, "expectedBy", nh_view_time(ev->expected_by));
  /* always the whole path, errorText null when there is no error: a script reading
   * messageContent.errorContent.errorText never trips on a missing level */
  json_object_set_new(o, "messageContent", json_pack("{s:{s:o}}", "errorContent", "errorText",
                                                     nh_view_str(ev->error_text)));
  return o;
}

static int collect(void *data, const nh_audit_t *ev)
{
  json_array_append_new(data, nimbus_event(ev));
  return 0;
}

static int stop_at_first(void *data, const nh_audit_t *ev)
{
  (void)ev;
  *(int *)data = 1;
  return 1;
}

/* The page's events and the next page's token (JSON null on the last page). A full page
 * looks one row further, so the last page says it is the last instead of sending the
 * client to an empty one. */
static int read_page(nh_admin_call_t *c, nh_event_filter_t *f, long max, int64_t after, json_t *events,
                     json_t **token)
{
  f->batch = (int)max;
  f->after_rowid = after;
  int64_t last = 0;
  int n = nh_admin_rd_events(c, f, collect, events, &last);
  if (n < 0) return 1;
  int more = 0;
  if (n == max) {
    f->batch = 1;
    f->after_rowid = last;
    if (nh_admin_rd_events(c, f, stop_at_first, &more, NULL) < 0) return 1;
  }
  char next[32];
  snprintf(next, sizeof next, "%lld", (long long)last);
  *token = more ? json_string(next) : json_null();
  return 0;
}

/* 1 with 404 answered when the store has no event of `endpoint` (the path names it). */
static int endpoint_unknown(nh_admin_call_t *c, const char *endpoint)
{
  int known = nh_admin_endpoint_known(c, endpoint);
  if (known < 0) nh_admin_store_error(c);
  else if (!known) nh_admin_error(c->r, 404, NULL, "unknown endpoint %s (GET /api/v1/endpoints lists them)", endpoint);
  return known != 1;
}

static void answer_page(nh_admin_call_t *c, nh_event_filter_t *f, long max, int64_t after)
{
  json_t *events = json_array(), *token = NULL;
  if (read_page(c, f, max, after, events, &token)) {
    json_decref(events);
    nh_admin_store_error(c);
    return;
  }
  nh_admin_answer(c->r, 200, json_pack("{s:o,s:o}", "events", events, "continuationToken", token));
}

void nh_admin_nimbus_get_by_filter(nh_admin_call_t *c)
{
  static const char *const known[] = { "continuationToken", "eventFilter", "maxSearchItemsCount", NULL };
  if (refused(c)) return;
  json_t *in = nh_admin_body_object(c);
  if (!in) return;
  json_t *mapped = json_pack("{s:s}", "endpoint", c->cap[0]);
  long max;
  int64_t after;
  nh_admin_filter_t af = { 0 };
  if (!nh_admin_fields_check(c, in, known) && !paging(c, in, &max, &after) &&
      !map_filter(c, json_object_get(in, "eventFilter"), mapped) && !endpoint_unknown(c, c->cap[0]) &&
      !nh_admin_filter_parse(c, mapped, &af))
    answer_page(c, &af.f, max, after);
  if (af.keep) nh_admin_filter_clear(&af);   /* set by nh_admin_filter_parse, even when it refused */
  json_decref(mapped);
  json_decref(in);
}

/* ---------------------------------------------------------------- resubmit, skip */

/* POST /api/event/{resubmit|skip}/{eventId}/{lastMessageId}: the action of /api/v1 with
 * the event's latest message as a precondition, so a script acting on what it read a
 * while ago is refused (409) once the event has moved on instead of acting on news it
 * has not seen. Neither takes a body member (an empty body or {}). */
static void nimbus_action(nh_admin_call_t *c, nh_op_kind_t kind)
{
  static const char *const none[] = { NULL };
  if (refused(c)) return;
  json_t *in = nh_admin_body_object(c);
  if (!in) return;
  if (nh_admin_fields_check(c, in, none)) {
    json_decref(in);
    return;
  }
  json_decref(in);
  nh_op_req_t req = { .kind = kind, .event_id = c->cap[0], .message_id = c->cap[1] };
  nh_admin_submit(c, &req);
}

void nh_admin_nimbus_resubmit(nh_admin_call_t *c) { nimbus_action(c, NH_OP_RESUBMIT); }
void nh_admin_nimbus_skip(nh_admin_call_t *c) { nimbus_action(c, NH_OP_SKIP); }
