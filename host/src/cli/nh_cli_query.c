/* Read-only commands: events, show, sessions. */
#include "nh_cli.h"
#include "core/nh_util.h"
#include "store/nh_store.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *const statuses[] = {
  NH_ST_COMPLETED, NH_ST_FAILED, NH_ST_PENDING, NH_ST_DEFERRED, NH_ST_DEADLETTERED, NH_ST_UNSUPPORTED, NH_ST_SKIPPED,
  NULL,
};

static int open_store(nh_store_t **s, const char *cmd, const char *path)
{
  nh_error_t err = {0};
  if (nh_store_open(s, path, 0, &err)) {
    fprintf(stderr, "nimbus-host %s: %s\n", cmd, err.msg);
    return err.code == NH_EFAIL ? NH_EXIT_FAIL : NH_EXIT_USAGE;
  }
  return NH_EXIT_OK;
}

static json_t *jstr(const char *s) { return s ? json_string(s) : json_null(); }

static json_t *jtime(int64_t ms)
{
  if (!ms) return json_null();
  char buf[40];
  nh_time_iso8601(ms, buf, sizeof buf);
  return json_string(buf);
}

static json_t *audit_json(const nh_audit_t *a)
{
  json_t *o = json_object();
  json_object_set_new(o, "endpoint", jstr(a->endpoint));
  json_object_set_new(o, "event_id", jstr(a->event_id));
  json_object_set_new(o, "session_id", jstr(a->session_id));
  json_object_set_new(o, "event_type", jstr(a->event_type));
  json_object_set_new(o, "status", jstr(a->status));
  json_object_set_new(o, "sub_status", jstr(a->sub_status));
  json_object_set_new(o, "error_text", jstr(a->error_text));
  json_object_set_new(o, "error_type", jstr(a->error_type));
  json_object_set_new(o, "handoff_reason", jstr(a->handoff_reason));
  json_object_set_new(o, "external_job_id", jstr(a->external_job_id));
  json_object_set_new(o, "expected_by", jtime(a->expected_by));
  json_object_set_new(o, "message_id", jstr(a->message_id));
  json_object_set_new(o, "retry_count", json_integer(a->retry_count));
  json_object_set_new(o, "updated_at", jtime(a->updated_at));
  return o;
}

static void print_json_line(json_t *o)
{
  char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
  puts(s);
  free(s);
  json_decref(o);
}

struct list_ctx {
  int json;
  int n;
};

static int print_event(void *data, const nh_audit_t *a)
{
  struct list_ctx *c = data;
  if (c->json) {
    print_json_line(audit_json(a));
  } else {
    if (c->n == 0) printf("%-36s  %-20s  %-16s  %-24s  %-13s  %s\n", "EVENT_ID", "ENDPOINT", "SESSION", "TYPE", "STATUS", "DETAIL");
    char status[32];
    snprintf(status, sizeof status, "%s%s%s", a->status, a->sub_status ? "+" : "", a->sub_status ? a->sub_status : "");
    const char *detail = a->error_text ? a->error_text : a->handoff_reason ? a->handoff_reason : "";
    const char *nl = strchr(detail, '\n');
    printf("%-36s  %-20s  %-16s  %-24s  %-13s  %.*s\n", a->event_id, a->endpoint, a->session_id,
           a->event_type ? a->event_type : "-", status, nl ? (int)(nl - detail) : 120, detail);
  }
  c->n++;
  return 0;
}

int nh_cmd_events(int argc, char **argv)
{
  static const nh_opt_spec_t specs[] = {
    { "--endpoint", 1 }, { "--status", 1 }, { "--session", 1 }, { "--json", 0 }, { NULL, 0 },
  };
  nh_args_t a;
  int rc = nh_args_parse(&a, "events", argc, argv, 2, specs);
  if (rc) return rc;
  if (a.npos) return nh_usage_error("events", "unexpected argument %s", a.pos[0]);
  const char *status = nh_args_get(&a, "--status");
  if (status) {
    const char *canon = NULL;
    for (int i = 0; statuses[i]; i++)
      if (strcasecmp(status, statuses[i]) == 0) canon = statuses[i];
    if (!canon)
      return nh_usage_error("events", "unknown --status %s (one of completed, failed, pending, deferred, "
                                      "deadlettered, unsupported, skipped)", status);
    status = canon;
  }
  nh_store_t *s;
  if ((rc = open_store(&s, "events", a.store))) return rc;
  struct list_ctx c = { nh_args_has(&a, "--json"), 0 };
  rc = nh_store_audit_list(s, nh_args_get(&a, "--endpoint"), status, nh_args_get(&a, "--session"), print_event, &c);
  nh_store_close(s);
  if (rc < 0) return NH_EXIT_FAIL;
  if (!c.json && c.n == 0) printf("no events\n");
  return NH_EXIT_OK;
}

struct hist_ctx {
  int json;
  json_t *arr;
};

static int print_history(void *data, int64_t at, const char *mid, const char *type, const char *status,
                         const char *detail)
{
  struct hist_ctx *c = data;
  char ts[40];
  nh_time_iso8601(at, ts, sizeof ts);
  if (c->json) {
    json_t *o = json_object();
    json_object_set_new(o, "at", json_string(ts));
    json_object_set_new(o, "message_id", jstr(mid));
    json_object_set_new(o, "message_type", jstr(type));
    json_object_set_new(o, "status", jstr(status));
    json_object_set_new(o, "detail", jstr(detail));
    json_array_append_new(c->arr, o);
  } else {
    printf("  %s  %-24s  %-13s  %s\n", ts, type ? type : "-", status ? status : "-", detail ? detail : "");
  }
  return 0;
}

int nh_cmd_show(int argc, char **argv)
{
  static const nh_opt_spec_t specs[] = { { "--json", 0 }, { NULL, 0 } };
  nh_args_t a;
  int rc = nh_args_parse(&a, "show", argc, argv, 2, specs);
  if (rc) return rc;
  if (a.npos != 1) return nh_usage_error("show", "expected one EVENT_ID");
  nh_store_t *s;
  if ((rc = open_store(&s, "show", a.store))) return rc;
  nh_audit_t ev;
  nh_error_t err = {0};
  memset(&ev, 0, sizeof ev);
  if (nh_store_audit_find(s, a.pos[0], &ev, &err)) {
    fprintf(stderr, "nimbus-host show: %s\n", err.msg);
    nh_store_close(s);
    return NH_EXIT_USAGE;
  }
  struct hist_ctx c = { nh_args_has(&a, "--json"), NULL };
  if (c.json) {
    json_t *o = audit_json(&ev);
    json_object_set_new(o, "correlation_id", jstr(ev.correlation_id));
    json_object_set_new(o, "error_stack", jstr(ev.error_stack));
    json_object_set_new(o, "payload", jstr(ev.payload));
    json_object_set_new(o, "result", jstr(ev.result));
    json_object_set_new(o, "created_at", jtime(ev.created_at));
    c.arr = json_array();
    nh_store_history_list(s, ev.endpoint, ev.event_id, print_history, &c);
    json_object_set_new(o, "history", c.arr);
    print_json_line(o);
  } else {
    char exp[40] = "-";
    if (ev.expected_by) nh_time_iso8601(ev.expected_by, exp, sizeof exp);
    printf("event      %s\nendpoint   %s\nsession    %s\ntype       %s\nstatus     %s%s%s\n", ev.event_id, ev.endpoint,
           ev.session_id, ev.event_type ? ev.event_type : "-", ev.status, ev.sub_status ? "+" : "",
           ev.sub_status ? ev.sub_status : "");
    printf("message    %s\nretries    %d\n", ev.message_id ? ev.message_id : "-", ev.retry_count);
    if (ev.error_text)
      printf("error      %s%s%s\n", ev.error_type ? ev.error_type : "", ev.error_type ? ": " : "", ev.error_text);
    if (ev.handoff_reason) printf("hand-off   %s (job %s, expected by %s)\n", ev.handoff_reason,
                                  ev.external_job_id ? ev.external_job_id : "-", exp);
    if (ev.result) printf("result     %s\n", ev.result);
    if (ev.payload) printf("payload    %s\n", ev.payload);
    if (ev.error_stack) printf("traceback\n%s\n", ev.error_stack);
    printf("history\n");
    nh_store_history_list(s, ev.endpoint, ev.event_id, print_history, &c);
  }
  int failed = nh_store_failed(s);
  nh_audit_clear(&ev);
  nh_store_close(s);
  return failed ? NH_EXIT_FAIL : NH_EXIT_OK;
}

struct sess_ctx {
  nh_store_t *s;
  int json, n;
};

static int print_session(void *data, const char *endpoint, const char *session, const nh_session_state_t *st)
{
  struct sess_ctx *c = data;
  int parked = nh_store_parked_count(c->s, endpoint, session);
  if (c->json) {
    json_t *o = json_object();
    json_object_set_new(o, "endpoint", json_string(endpoint));
    json_object_set_new(o, "session_id", json_string(session));
    json_object_set_new(o, "blocked_by", jstr(st->blocked_by));
    json_object_set_new(o, "draining", json_boolean(st->draining));
    json_object_set_new(o, "parked", json_integer(parked));
    json_object_set_new(o, "retry_due", jtime(st->retry_due));
    print_json_line(o);
  } else {
    if (c->n == 0) printf("%-20s  %-24s  %-36s  %-8s  %s\n", "ENDPOINT", "SESSION", "BLOCKED_BY", "PARKED", "STATE");
    char due[40] = "";
    if (st->retry_due) nh_time_iso8601(st->retry_due, due, sizeof due);
    printf("%-20s  %-24s  %-36s  %-8d  %s%s%s\n", endpoint, session, st->blocked_by ? st->blocked_by : "-", parked,
           st->blocked_by ? "blocked" : st->draining ? "draining" : "free", st->retry_due ? ", retry at " : "", due);
  }
  c->n++;
  return 0;
}

int nh_cmd_sessions(int argc, char **argv)
{
  static const nh_opt_spec_t specs[] = { { "--endpoint", 1 }, { "--blocked", 0 }, { "--json", 0 }, { NULL, 0 } };
  nh_args_t a;
  int rc = nh_args_parse(&a, "sessions", argc, argv, 2, specs);
  if (rc) return rc;
  if (a.npos) return nh_usage_error("sessions", "unexpected argument %s", a.pos[0]);
  nh_store_t *s;
  if ((rc = open_store(&s, "sessions", a.store))) return rc;
  struct sess_ctx c = { s, nh_args_has(&a, "--json"), 0 };
  nh_store_sessions_list(s, nh_args_get(&a, "--endpoint"), nh_args_has(&a, "--blocked"), print_session, &c);
  int failed = nh_store_failed(s);
  if (!c.json && c.n == 0 && !failed) printf("no blocked or draining sessions\n");
  nh_store_close(s);
  return failed ? NH_EXIT_FAIL : NH_EXIT_OK;
}
