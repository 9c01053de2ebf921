/* Event filters for the admin API (nh_admin_int.h): the events list takes them as query
 * parameters, bulk actions as members of their JSON body; both come here as one JSON
 * object, so the names, the checks and the error texts are the same. */
#include "nh_admin_int.h"
#include "core/nh_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int nh_admin_endpoint_known(nh_admin_call_t *c, const char *endpoint)
{
  struct known_ep k = { endpoint, 0 };
  return nh_admin_rd_endpoints(c, match_endpoint, &k) < 0 ? NH_EFAIL : k.found;
}

/* A string member, or NULL; 400 when it is there but not a non-empty string. */
static int member_str(nh_admin_call_t *c, json_t *from, const char *name, const char **out)
{
  json_t *v = json_object_get(from, name);
  *out = NULL;
  if (!v || json_is_null(v)) return 0;
  if (!json_is_string(v) || !json_string_length(v)) {
    nh_admin_error(c->r, 400, name, "%s: a non-empty string", name);
    return 1;
  }
  *out = json_string_value(v);
  return 0;
}

/* "a,b" or ["a", "b"] into `into` (kept in keep), at most 8. */
static int member_list(nh_admin_call_t *c, json_t *from, const char *name, json_t *keep, const char **into)
{
  json_t *v = json_object_get(from, name);
  if (!v || json_is_null(v)) return 0;
  json_t *items = json_array();
  json_object_set_new(keep, name, items);
  if (json_is_string(v)) {
    const char *s = json_string_value(v);
    while (*s) {
      const char *comma = strchr(s, ',');
      size_t n = comma ? (size_t)(comma - s) : strlen(s);
      if (n) json_array_append_new(items, json_stringn(s, n));
      s += n + (comma ? 1 : 0);
    }
  } else if (json_is_array(v)) {
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e) {
      if (!json_is_string(e) || !json_string_length(e)) {
        nh_admin_error(c->r, 400, name, "%s: a list of non-empty strings", name);
        return 1;
      }
      json_array_append(items, e);
    }
  }
  if (!json_array_size(items) || json_array_size(items) > 8) {
    nh_admin_error(c->r, 400, name, "%s: one to eight values, comma-separated or as a JSON array", name);
    return 1;
  }
  for (size_t i = 0; i < json_array_size(items); i++) into[i] = json_string_value(json_array_get(items, i));
  return 0;
}

static int member_time(nh_admin_call_t *c, json_t *from, const char *name, int64_t *out)
{
  const char *s;
  if (member_str(c, from, name, &s)) return 1;
  if (!s) return 0;
  int64_t t = nh_time_parse_ms(s, nh_time_now_ms());
  if (t < 0) {
    nh_admin_error(c->r, 400, name, "%s %s is not a time: give ISO-8601 UTC (2026-12-03T06:00:00Z) or an age such "
                   "as 30m, 2h or 7d", name, s);
    return 1;
  }
  *out = t;
  return 0;
}

int nh_admin_filter_parse(nh_admin_call_t *c, json_t *from, nh_admin_filter_t *out)
{
  memset(out, 0, sizeof *out);
  nh_event_filter_t *f = &out->f;
  out->keep = json_object();
  json_object_set(out->keep, "from", from);   /* the strings below point into it */
  if (member_str(c, from, "endpoint", &f->endpoint) || member_str(c, from, "session", &f->session) ||
      member_str(c, from, "event_id", &f->event_id) || member_str(c, from, "payload", &f->payload) ||
      member_str(c, from, "error", &f->error) || member_str(c, from, "group", &f->group) ||
      member_list(c, from, "status", out->keep, f->status_in) ||
      member_list(c, from, "type", out->keep, f->type_in) || member_time(c, from, "since", &f->since_ms) ||
      member_time(c, from, "before", &f->before_ms))
    return 1;
  for (int i = 0; i < 8 && f->status_in[i]; i++) {
    const char *canon = nh_store_status_canon(f->status_in[i]);
    if (!canon) {
      nh_admin_error(c->r, 400, "status", "unknown status %s (known: Completed, Failed, Pending, Deferred, "
                     "DeadLettered, Unsupported, Skipped)", f->status_in[i]);
      return 1;
    }
    f->status_in[i] = canon;
  }
  if (f->since_ms && f->before_ms && f->since_ms >= f->before_ms) {
    nh_admin_error(c->r, 400, "since", "since is not before before: nothing can match");
    return 1;
  }
  if (f->endpoint) {
    int known = nh_admin_endpoint_known(c, f->endpoint);
    if (known < 0) {
      nh_admin_store_error(c);
      return 1;
    }
    if (!known) {
      nh_admin_error(c->r, 400, "endpoint", "unknown endpoint %s (GET /api/v1/endpoints lists them)", f->endpoint);
      return 1;
    }
  }
  /* a group names one endpoint: its index is (endpoint, fail_group) */
  char ep[256];
  if (f->group && !f->endpoint) {
    int got = nh_admin_rd_failgroup_endpoint(c, f->group, ep, sizeof ep);
    if (got < 0) {
      nh_admin_store_error(c);
      return 1;
    }
    if (got > 0) {
      json_object_set_new(out->keep, "group_endpoint", json_string(ep));
      f->endpoint = json_string_value(json_object_get(out->keep, "group_endpoint"));
    }
  }
  return 0;
}

void nh_admin_filter_clear(nh_admin_filter_t *out)
{
  json_decref(out->keep);
  out->keep = NULL;
}
