/* POST actions (docs/admin-api.md, "Actions"): single-event actions through
 * nh_operator_submit and bulk actions through the bulk engine (dispatch/nh_bulk.h), the
 * code paths of the CLI's `resubmit`, `skip`, `handoff` and `--all` commands. */
#include "nh_admin_int.h"
#include "nh_views.h"
#include "core/nh_util.h"
#include "dispatch/nh_bulk.h"
#include "dispatch/nh_operator.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NH_BULK_SAMPLE 10
#define NH_BULK_PER_MINUTE 6     /* real bulk runs per identity per minute */
#define NH_BULK_WHO 32           /* identities remembered for the limit */

void nh_admin_submit(nh_admin_call_t *c, nh_op_req_t *req)
{
  nh_admin_t *a = c->a;
  char actor[192];
  snprintf(actor, sizeof actor, "admin API (%s)", c->who);
  req->actor = actor;
  req->who = c->who;
  nh_audit_t ev;
  memset(&ev, 0, sizeof ev);
  nh_error_t err = {0};
  /* on a PostgreSQL store on the pool (nh_admin_pg.c), as the CLI queues it */
  int rc = c->pg ? nh_operator_submit_pg(c->pg, req, &ev, &err) : nh_operator_submit(a->store, a->queue, req, &ev, &err);
  if (rc == NH_ESTATE) {
    /* what the event is now, for the caller to decide */
    nh_audit_t now;
    nh_error_t ferr = {0};
    memset(&now, 0, sizeof now);
    json_t *o = json_object();
    json_object_set_new(o, "error", json_string(err.msg));
    if (nh_admin_rd_audit_find(c, req->event_id, &now, &ferr) == NH_OK) {
      json_object_set_new(o, "event", nh_view_audit(&now));
      nh_audit_clear(&now);
    }
    nh_admin_answer(c->r, 409, o);
    return;
  }
  if (rc) {
    /* an unknown event; the caller's bad input (an ambiguous prefix, a coordinate that does
     * not match the event, a missing error text); the store */
    nh_admin_error(c->r, rc == NH_ENOTFOUND ? 404 : rc == NH_EUSAGE ? 400 : 500, NULL, "%s", err.msg);
    return;
  }
  json_t *o = json_object();
  json_object_set_new(o, "queued", json_string(nh_operator_name(req->kind)));
  json_object_set_new(o, "event", nh_view_audit(&ev));
  json_object_set_new(o, "live_hosts", json_integer(nh_admin_live_hosts(c, ev.endpoint)));
  nh_audit_clear(&ev);
  nh_admin_answer(c->r, 202, o);
}

/* A string member (absent or null: NULL); 400 when it is something else. 1 if it answered. */
static int opt_string(nh_admin_call_t *c, json_t *in, const char *name, int required, const char **out)
{
  json_t *v = json_object_get(in, name);
  *out = v && json_is_string(v) ? json_string_value(v) : NULL;
  if (v && !json_is_null(v) && !json_is_string(v)) {
    nh_admin_error(c->r, 400, name, "%s: a string", name);
    return 1;
  }
  if (required && (!*out || !**out)) {
    nh_admin_error(c->r, 400, name, "%s is required", name);
    return 1;
  }
  return 0;
}

static int opt_bool(nh_admin_call_t *c, json_t *in, const char *name, int *out)
{
  json_t *v = json_object_get(in, name);
  *out = v && json_is_true(v);
  if (v && !json_is_boolean(v)) {
    nh_admin_error(c->r, 400, name, "%s: true or false", name);
    return 1;
  }
  return 0;
}

/* An object member as compact JSON text (caller frees; NULL when absent). */
static int opt_object_text(nh_admin_call_t *c, json_t *in, const char *name, const char *what, char **out)
{
  json_t *v = json_object_get(in, name);
  *out = NULL;
  if (!v || json_is_null(v)) return 0;
  if (!json_is_object(v)) {
    nh_admin_error(c->r, 400, name, "%s: %s, as a JSON object", name, what);
    return 1;
  }
  *out = json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER);
  return 0;
}

void nh_admin_post_resubmit(nh_admin_call_t *c)
{
  static const char *const known[] = { "body", "force", NULL };
  json_t *in = nh_admin_body_object(c);
  if (!in) return;
  char *text = NULL;
  int force = 0;
  if (!nh_admin_fields_check(c, in, known) && !opt_bool(c, in, "force", &force) &&
      !opt_object_text(c, in, "body", "the event's new body", &text)) {
    nh_op_req_t req = { .kind = NH_OP_RESUBMIT, .event_id = c->cap[0], .body = text, .force = force };
    nh_admin_submit(c, &req);
  }
  free(text);
  json_decref(in);
}

void nh_admin_post_skip(nh_admin_call_t *c)
{
  static const char *const known[] = { "reason", NULL };
  json_t *in = nh_admin_body_object(c);
  if (!in) return;
  const char *reason;
  if (!nh_admin_fields_check(c, in, known) && !opt_string(c, in, "reason", 0, &reason)) {
    nh_op_req_t req = { .kind = NH_OP_SKIP, .event_id = c->cap[0], .reason = reason };
    nh_admin_submit(c, &req);
  }
  json_decref(in);
}

void nh_admin_post_handoff_complete(nh_admin_call_t *c)
{
  static const char *const known[] = { "result", NULL };
  json_t *in = nh_admin_body_object(c);
  if (!in) return;
  char *text = NULL;
  if (!nh_admin_fields_check(c, in, known) && !opt_object_text(c, in, "result", "what the work produced", &text)) {
    nh_op_req_t req = { .kind = NH_OP_HANDOFF_COMPLETE, .event_id = c->cap[0], .body = text };
    nh_admin_submit(c, &req);
  }
  free(text);
  json_decref(in);
}

void nh_admin_post_handoff_fail(nh_admin_call_t *c)
{
  static const char *const known[] = { "error", "reason", "error_type", NULL };
  json_t *in = nh_admin_body_object(c);
  if (!in) return;
  const char *error, *reason, *type;
  if (!nh_admin_fields_check(c, in, known) && !opt_string(c, in, "error", 1, &error) &&
      !opt_string(c, in, "reason", 1, &reason) && !opt_string(c, in, "error_type", 0, &type)) {
    nh_op_req_t req = { .kind = NH_OP_HANDOFF_FAIL, .event_id = c->cap[0], .error_text = error,
                        .error_type = type, .reason = reason };
    nh_admin_submit(c, &req);
  }
  json_decref(in);
}

/* ---------------------------------------------------------------- bulk */

typedef struct nh_admin_bulk {
  struct nh_admin_bulk *next;
  nh_admin_t *a;
  nh_httpd_req_t *r;        /* answered when the run ends */
  nh_bulk_t *b;
  nh_admin_filter_t af;
  uv_idle_t step;           /* one batch per turn of the loop (I/O is polled between) */
  char key[700], owner[200], who[128], reason[512], actor[192];
  int has_reason;
} bulk_run_t;

struct who_times {
  char who[128];
  int64_t at[NH_BULK_PER_MINUTE];
};

/* 1 (429 answered) when `who` started NH_BULK_PER_MINUTE runs in the last minute. The
 * table is the process's: a lock, since on a PostgreSQL store this runs on the pool. */
static pthread_mutex_t seen_lock = PTHREAD_MUTEX_INITIALIZER;

static int rate_limited_locked(nh_admin_call_t *c);

static int rate_limited(nh_admin_call_t *c)
{
  pthread_mutex_lock(&seen_lock);
  int limited = rate_limited_locked(c);
  pthread_mutex_unlock(&seen_lock);
  return limited;
}

static int rate_limited_locked(nh_admin_call_t *c)
{
  static struct who_times seen[NH_BULK_WHO];
  int64_t now = nh_time_now_ms();
  struct who_times *w = NULL, *oldest = &seen[0];
  for (int i = 0; i < NH_BULK_WHO && !w; i++) {
    if (seen[i].who[0] && strcmp(seen[i].who, c->who) == 0) w = &seen[i];
    /* a free slot first, else the identity whose last run is the oldest */
    else if (oldest->who[0] && (!seen[i].who[0] || seen[i].at[0] < oldest->at[0])) oldest = &seen[i];
  }
  if (!w) {
    w = oldest;
    memset(w, 0, sizeof *w);
    size_t n = strnlen(c->who, sizeof w->who - 1);
    memcpy(w->who, c->who, n);
    w->who[n] = '\0';
  }
  /* at[] newest first */
  if (w->at[NH_BULK_PER_MINUTE - 1] && now - w->at[NH_BULK_PER_MINUTE - 1] < 60000) {
    long wait = (long)((60000 - (now - w->at[NH_BULK_PER_MINUTE - 1])) / 1000) + 1;
    char after[24];
    snprintf(after, sizeof after, "%ld", wait);
    json_t *o = json_object();
    json_object_set_new(o, "error", json_sprintf("%s started %d bulk actions in the last minute; try again in %ld s",
                                                 c->who, NH_BULK_PER_MINUTE, wait));
    nh_admin_answer_retry(c->r, 429, o, after);
    return 1;
  }
  memmove(&w->at[1], &w->at[0], sizeof w->at[0] * (NH_BULK_PER_MINUTE - 1));
  w->at[0] = now;
  return 0;
}

static int sample_row(void *data, const nh_audit_t *a)
{
  json_array_append_new(data, nh_view_audit(a));
  return 0;
}

static void run_closed(uv_handle_t *h)
{
  bulk_run_t *run = h->data;
  nh_admin_filter_clear(&run->af);
  free(run);
}

static void run_unlink(bulk_run_t *run)
{
  for (bulk_run_t **p = &run->a->bulks; *p; p = &(*p)->next)
    if (*p == run) {
      *p = run->next;
      break;
    }
}

static void run_end(bulk_run_t *run, unsigned status, json_t *answer)
{
  run_unlink(run);
  nh_admin_answer(run->r, status, answer);
  nh_bulk_free(run->b);
  uv_idle_stop(&run->step);
  uv_close((uv_handle_t *)&run->step, run_closed);
}

/* c: the call whose store is read for the live hosts (a run stepping on the loop has
 * none left: it makes one for the sqlite store) */
static json_t *result_json(nh_admin_call_t *c, const nh_bulk_result_t *r)
{
  json_t *o = json_object(), *eps = json_array();
  json_object_set_new(o, "matched", json_integer(r->total));
  json_object_set_new(o, "queued", json_integer(r->queued));
  json_object_set_new(o, "refused", json_integer(r->refused));
  json_object_set_new(o, "first_refusal", r->refused ? json_string(r->first_refusal) : json_null());
  for (int i = 0; i < r->neps; i++)
    json_array_append_new(eps, json_pack("{s:s,s:I,s:i}", "endpoint", r->eps[i].name, "queued",
                                         (json_int_t)r->eps[i].n, "live_hosts",
                                         nh_admin_live_hosts(c, r->eps[i].name)));
  json_object_set_new(o, "endpoints", eps);
  return o;
}

/* An idle handle, not a 0 ms timer: a timer re-armed from its own callback is due at
 * once and runs again in the same pass, so the loop never polled until the run ended. */
static void run_step(uv_idle_t *t)
{
  bulk_run_t *run = t->data;
  int more = nh_bulk_step(run->b);
  if (more > 0) return;
  if (more < 0 || nh_bulk_finish(run->b)) {
    nh_bulk_abandon(run->b);   /* this process is alive: without it the same action would be "running" */
    json_t *o = json_object();
    json_object_set_new(o, "error", json_sprintf("store: %s; the batches queued so far stay queued: the same action "
                                                 "again queues the rest", nh_bulk_errmsg(run->b)));
    run_end(run, 500, o);
    return;
  }
  nh_admin_call_t on = { .a = run->a };   /* the run's own reads, on the loop (sqlite) */
  run_end(run, 200, result_json(&on, nh_bulk_result(run->b)));
}

/* A run on a PostgreSQL store, on the pool: its batches one after the other, then the
 * answer (the loop steps sqlite's a batch per turn instead; here nothing waits on this
 * thread). */
static void bulk_run_pg(nh_admin_call_t *c, bulk_run_t *run)
{
  int more;
  while ((more = nh_bulk_step(run->b)) > 0) {}
  if (more < 0 || nh_bulk_finish(run->b)) {
    nh_bulk_abandon(run->b);
    json_t *o = json_object();
    json_object_set_new(o, "error", json_sprintf("store: %s; the batches queued so far stay queued: the same action "
                                                 "again queues the rest", nh_bulk_errmsg(run->b)));
    nh_admin_answer(c->r, 500, o);
  } else {
    nh_admin_answer(c->r, 200, result_json(c, nh_bulk_result(run->b)));
  }
  nh_bulk_free(run->b);
  nh_admin_filter_clear(&run->af);
  free(run);
}

/* {"filter": {...}, "dry_run": bool, "force": bool, "reason": "..."} */
static void post_bulk(nh_admin_call_t *c, nh_op_kind_t kind)
{
  static const char *const known_resubmit[] = { "filter", "dry_run", "force", NULL };
  static const char *const known_skip[] = { "filter", "dry_run", "reason", NULL };
  json_t *in = nh_admin_body_object(c);
  if (!in) return;
  int dry = 0, force = 0;
  const char *reason = NULL;
  json_t *filter = json_object_get(in, "filter");
  if (nh_admin_fields_check(c, in, kind == NH_OP_RESUBMIT ? known_resubmit : known_skip) ||
      opt_bool(c, in, "dry_run", &dry) || opt_bool(c, in, "force", &force) ||
      opt_string(c, in, "reason", 0, &reason)) {
    json_decref(in);
    return;
  }
  static const char *const filter_names[] = { "endpoint", "status", "type", "session", "error", "group", "since",
                                              "before", NULL };
  if (!json_is_object(filter)) {
    nh_admin_error(c->r, 400, "filter", "filter: the events to act on, as a JSON object (endpoint, status, type, "
                   "session, error, group, since, before)");
    json_decref(in);
    return;
  }
  if (nh_admin_fields_check(c, filter, filter_names)) {
    json_decref(in);
    return;
  }
  bulk_run_t *run = nh_xcalloc(1, sizeof *run);
  run->a = c->a;
  int bad = nh_admin_filter_parse(c, filter, &run->af);
  /* checked on the parsed filter: a member given as null bounds nothing */
  if (!bad && !run->af.f.endpoint && !run->af.f.status_in[0] && !run->af.f.group) {
    nh_admin_error(c->r, 400, "filter", "a bulk action needs a filter that bounds it: endpoint, status or group");
    bad = 1;
  }
  if (bad || (!dry && rate_limited(c))) {
    nh_admin_filter_clear(&run->af);
    free(run);
    json_decref(in);
    return;
  }
  /* the run's key: the action and its filter, as the CLI keys its runs by command and options */
  char *ftext = json_dumps(filter, JSON_COMPACT | JSON_SORT_KEYS);
  snprintf(run->key, sizeof run->key, "api %s %s%s", kind == NH_OP_RESUBMIT ? "resubmit" : "skip", ftext,
           force ? " force" : "");
  free(ftext);
  char host[128] = "localhost";
  gethostname(host, sizeof host - 1);
  snprintf(run->owner, sizeof run->owner, "%s:%ld:bulk", host, (long)getpid());
  snprintf(run->who, sizeof run->who, "%s", c->who);
  if (reason) snprintf(run->reason, sizeof run->reason, "%s", reason);
  snprintf(run->actor, sizeof run->actor, "admin API (%s, bulk)", c->who);
  nh_bulk_opts_t o = { .kind = kind, .force = force, .key = run->key, .owner = run->owner, .actor = run->actor,
                       .who = run->who, .reason = reason ? run->reason : NULL };
  json_decref(in);
  run->b = c->pg ? nh_bulk_new_pg(c->pg, &run->af.f, &o) : nh_bulk_new(c->a->store, c->a->queue, &run->af.f, &o);
  nh_error_t err = {0};
  int rc = nh_bulk_prepare(run->b, &err);
  const nh_bulk_result_t *r = nh_bulk_result(run->b);
  if (rc || dry || r->total == 0) {
    if (rc) {
      nh_admin_error(c->r, rc == NH_ESTATE ? 409 : 500, NULL, "%s", err.msg);
    } else if (dry) {
      json_t *sample = json_array(), *ans = json_object();
      if (nh_bulk_sample(run->b, NH_BULK_SAMPLE, sample_row, sample) < 0) {
        json_decref(sample);
        json_decref(ans);
        nh_admin_error(c->r, 500, NULL, "store: %s", nh_bulk_errmsg(run->b));
      } else {
        json_object_set_new(ans, "matched", json_integer(r->total));
        json_object_set_new(ans, "sample", sample);
        nh_admin_answer(c->r, 200, ans);
      }
    } else if (nh_bulk_nothing(run->b)) {
      nh_admin_error(c->r, 500, NULL, "store: %s", nh_bulk_errmsg(run->b));
    } else {
      nh_admin_answer(c->r, 200, result_json(c, r));
    }
    nh_bulk_free(run->b);
    nh_admin_filter_clear(&run->af);
    free(run);
    return;
  }
  if (nh_bulk_start(run->b)) {
    nh_admin_error(c->r, 500, NULL, "store: %s", nh_bulk_errmsg(run->b));
    nh_bulk_free(run->b);
    nh_admin_filter_clear(&run->af);
    free(run);
    return;
  }
  if (c->pg) {   /* on the pool (nh_admin_pg.c): the whole run here, each event its own transaction */
    bulk_run_pg(c, run);
    return;
  }
  run->r = c->r;   /* answered when the last batch is queued */
  uv_idle_init(c->a->loop, &run->step);
  run->step.data = run;
  run->next = c->a->bulks;
  c->a->bulks = run;
  uv_idle_start(&run->step, run_step);
}

void nh_admin_post_bulk_resubmit(nh_admin_call_t *c) { post_bulk(c, NH_OP_RESUBMIT); }
void nh_admin_post_bulk_skip(nh_admin_call_t *c) { post_bulk(c, NH_OP_SKIP); }

void nh_admin_bulk_close(nh_admin_t *a)
{
  while (a->bulks) {
    bulk_run_t *run = a->bulks;
    json_t *o = json_object();
    json_object_set_new(o, "error", json_string("the host is stopping; the batches queued so far stay queued: the "
                                                "same action again queues the rest"));
    run_end(run, 503, o);
  }
}
