/* Read-only commands: events, show, sessions. */
#include "nh_cli.h"
#include "admin/nh_views.h"
#include "core/nh_failgroup.h"
#include "core/nh_idcursor.h"
#include "core/nh_trace.h"
#include "core/nh_util.h"
#include "store/nh_pg.h"
#include "store/nh_pg_ops.h"
#include "store/nh_store.h"
#include "transport/nh_embedded.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <signal.h>
#include <unistd.h>


static int open_store(nh_store_t **s, const char *cmd, const char *path)
{
  nh_error_t err = {0};
  if (nh_store_open(s, path, NH_STORE_READONLY, &err)) {   /* reading works on a read-only store too */
    fprintf(stderr, "nimbus-host %s: %s\n", cmd, err.msg);
    return err.code == NH_EFAIL ? NH_EXIT_FAIL : NH_EXIT_USAGE;
  }
  return NH_EXIT_OK;
}

/* One event's reads from either store (show): a sqlite file, or a PostgreSQL store read
 * through a blocking connection (its schema not migrated: a reader changes nothing). */
typedef struct reader {
  nh_store_t *s;
  nh_pg_db_t *pg;
} reader_t;

static int reader_open(reader_t *r, const char *cmd, const char *store)
{
  memset(r, 0, sizeof *r);
  if (!nh_pg_url_is(store)) return open_store(&r->s, cmd, store);
  PGconn *conn = NULL;
  nh_error_t err = {0};
  int from = 0, to = 0;
  if (nh_store_pg_connect(store, NH_STORE_READONLY, &conn, &from, &to, &err)) {
    fprintf(stderr, "nimbus-host %s: %s\n", cmd, err.msg);
    return err.code == NH_EFAIL ? NH_EXIT_FAIL : NH_EXIT_USAGE;
  }
  r->pg = nh_pg_db_new(conn);
  return NH_EXIT_OK;
}

static void reader_close(reader_t *r)
{
  nh_store_close(r->s);
  nh_pg_db_free(r->pg);
}

static int reader_audit_find(reader_t *r, const char *event_id, nh_audit_t *ev, nh_error_t *err)
{
  return r->pg ? nh_pgs_audit_find(r->pg, event_id, ev, err) : nh_store_audit_find(r->s, event_id, ev, err);
}

static int reader_session_get(reader_t *r, const char *endpoint, const char *session, nh_session_state_t *st)
{
  return r->pg ? nh_pgs_session_get(r->pg, endpoint, session, st) : nh_store_session_get(r->s, endpoint, session, st);
}

static int reader_history_list(reader_t *r, const char *endpoint, const char *event_id, nh_history_cb cb, void *data)
{
  return r->pg ? nh_pgs_history_list(r->pg, endpoint, event_id, cb, data)
               : nh_store_history_list(r->s, endpoint, event_id, cb, data);
}

static int reader_audit_get(reader_t *r, const char *endpoint, const char *event_id, nh_audit_t *ev)
{
  return r->pg ? nh_pgs_audit_get(r->pg, endpoint, event_id, ev) : nh_store_audit_get(r->s, endpoint, event_id, ev);
}

static int reader_parked_count(reader_t *r, const char *endpoint, const char *session)
{
  return r->pg ? nh_pgs_parked_count(r->pg, endpoint, session) : nh_store_parked_count(r->s, endpoint, session);
}

static int reader_sessions_list(reader_t *r, const char *endpoint, int blocked_only, nh_session_cb cb, void *data)
{
  return r->pg ? nh_pgs_sessions_list(r->pg, endpoint, blocked_only, cb, data)
               : nh_store_sessions_list(r->s, endpoint, blocked_only, cb, data);
}

static void print_json_line(json_t *o)
{
  char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
  puts(s);
  free(s);
  json_decref(o);
}

/* Table output: columns as wide as their content. The first rows are held back to
 * measure them (all of them unless there are very many; later rows are cut to fit). */
#define NH_TABLE_MEASURE 2000
enum { C_ID, C_EP, C_SESSION, C_TYPE, C_STATUS, C_DETAIL, C_COUNT };
static const char *const col_names[C_COUNT] = { "EVENT_ID", "ENDPOINT", "SESSION", "TYPE", "STATUS", "DETAIL" };

typedef struct row {
  char *col[C_COUNT];
} row_t;

struct list_ctx {
  int json;
  long long n;
  row_t *held;
  int nheld;
  int width[C_COUNT];
  int measured;     /* widths fixed, rows print as they come */
};

static void row_make(row_t *r, const nh_audit_t *a)
{
  char status[40];
  snprintf(status, sizeof status, "%s%s%s%s", a->status, a->sub_status ? "+" : "", a->sub_status ? a->sub_status : "",
           nh_audit_overdue(a) ? " (overdue)" : "");
  const char *detail = a->error_text ? a->error_text : a->handoff_reason ? a->handoff_reason : "";
  char retrying[200];
  if (nh_audit_retrying(a)) {   /* Pending+Retrying: which attempt failed, and why */
    snprintf(retrying, sizeof retrying, "attempt %d: %.*s", a->attempts, (int)strcspn(detail, "\n"), detail);
    detail = retrying;
  }
  size_t dl = strcspn(detail, "\n");
  if (dl > 160) dl = 160;
  r->col[C_ID] = nh_xstrdup(a->event_id);
  r->col[C_EP] = nh_xstrdup(a->endpoint);
  r->col[C_SESSION] = nh_xstrdup(a->session_id);
  r->col[C_TYPE] = nh_xstrdup(a->event_type ? a->event_type : "-");
  r->col[C_STATUS] = nh_xstrdup(status);
  r->col[C_DETAIL] = nh_xstrndup(detail, dl);
}

static void row_print(struct list_ctx *c, row_t *r)
{
  for (int i = 0; i < C_COUNT; i++) {
    if (i == C_DETAIL) printf("%s\n", r->col[i]);
    else printf("%-*.*s  ", c->width[i], c->width[i], r->col[i]);
    free(r->col[i]);
  }
}

static void table_flush(struct list_ctx *c)
{
  if (c->measured) return;
  c->measured = 1;
  for (int i = 0; i < C_COUNT; i++) c->width[i] = (int)strlen(col_names[i]);
  for (int k = 0; k < c->nheld; k++)
    for (int i = 0; i < C_COUNT; i++) {
      int w = (int)strlen(c->held[k].col[i]);
      if (w > c->width[i]) c->width[i] = w;
    }
  if (c->nheld) {
    row_t head;
    for (int i = 0; i < C_COUNT; i++) head.col[i] = nh_xstrdup(col_names[i]);
    row_print(c, &head);
  }
  for (int k = 0; k < c->nheld; k++) row_print(c, &c->held[k]);
  free(c->held);
  c->held = NULL;
  c->nheld = 0;
}

static int print_event(void *data, const nh_audit_t *a)
{
  struct list_ctx *c = data;
  c->n++;
  if (c->json) {
    print_json_line(nh_view_audit(a));
    return 0;
  }
  row_t r;
  row_make(&r, a);
  if (c->measured) {
    row_print(c, &r);
    return 0;
  }
  if (!c->held) c->held = nh_xmalloc(sizeof *c->held * NH_TABLE_MEASURE);
  c->held[c->nheld++] = r;
  if (c->nheld == NH_TABLE_MEASURE) table_flush(c);
  return 0;
}

/* --follow: every audit change after the listing, read from the append-only history
 * (its id is an index, so each poll reads only what is new). */
struct follow_ctx {
  nh_store_t *s;
  const nh_event_filter_t *f;
  struct list_ctx *list;
};

static int follow_one(void *data, const char *endpoint, const char *event_id)
{
  struct follow_ctx *fc = data;
  nh_audit_t a;
  memset(&a, 0, sizeof a);
  if (nh_store_audit_get(fc->s, endpoint, event_id, &a) == 1 && nh_event_filter_match(fc->f, &a))
    print_event(fc->list, &a);
  nh_audit_clear(&a);
  return 0;
}

static volatile sig_atomic_t follow_stop;
static void on_follow_signal(int sig) { (void)sig; follow_stop = 1; }

static int follow(nh_store_t *s, const nh_event_filter_t *f, struct list_ctx *c, int64_t from_id)
{
  signal(SIGINT, on_follow_signal);
  signal(SIGTERM, on_follow_signal);
  struct follow_ctx fc = { s, f, c };
  int64_t last = from_id;
  while (!follow_stop) {
    int n = nh_store_history_after(s, last, 1000, follow_one, &fc, &last);
    if (n < 0) return NH_EXIT_FAIL;
    fflush(stdout);
    if (n < 1000) usleep(250 * 1000);   /* a poll of the history tail: nothing to wait on across processes */
  }
  return NH_EXIT_OK;
}

/* --follow on PostgreSQL. History ids commit out of order there (two hosts, or a pump and
 * an operator request, each its own transaction), so the cursor waits for the gaps below
 * what it read (core/nh_idcursor.h), and a row is printed once, when it first shows. */
#define NH_FOLLOW_GAP_MS 30000   /* far longer than any transaction of the host's */
#define NH_FOLLOW_BACK 1000      /* ids below the listing's last one that may still come */

struct follow_pg_ctx {
  nh_idcursor_t cur;
  const nh_event_filter_t *f;
  struct list_ctx *list;
  int64_t now, seed_to, read_to;
};

static void follow_pg_row(void *data, int64_t id, const nh_audit_t *a)
{
  struct follow_pg_ctx *fc = data;
  if (nh_idcursor_take(&fc->cur, id, fc->now) && a && nh_event_filter_match(fc->f, a)) print_event(fc->list, a);
}

/* the ids up to the listing's last one that are there already: taken without printing
 * (the listing showed their events), so that only the late ones below it print */
static void follow_pg_seed(void *data, int64_t id, const nh_audit_t *a)
{
  (void)a;
  struct follow_pg_ctx *fc = data;
  if (id <= fc->seed_to) nh_idcursor_take(&fc->cur, id, fc->now);
  fc->read_to = id;
}

static int follow_pg(nh_pg_db_t *db, const nh_event_filter_t *f, struct list_ctx *c, int64_t from_id)
{
  signal(SIGINT, on_follow_signal);
  signal(SIGTERM, on_follow_signal);
  struct follow_pg_ctx fc = { .f = f, .list = c, .now = nh_time_now_ms(), .seed_to = from_id };
  fc.read_to = from_id > NH_FOLLOW_BACK ? from_id - NH_FOLLOW_BACK : 0;
  nh_idcursor_init(&fc.cur, fc.read_to, NH_FOLLOW_GAP_MS);
  nh_error_t err = {0};
  int rc = NH_EXIT_OK, n = 1000;
  while (n == 1000 && fc.read_to < from_id)
    n = nh_pgs_history_after(db, fc.read_to, NULL, 0, 1000, follow_pg_seed, &fc, &err);
  while (!follow_stop && n >= 0) {
    fc.now = nh_time_now_ms();
    nh_idcursor_advance(&fc.cur, fc.now);
    int64_t gaps[2 * 16];
    int ngaps = nh_idcursor_gaps(&fc.cur, gaps, 16);
    n = nh_pgs_history_after(db, nh_idcursor_top(&fc.cur), gaps, ngaps, 1000, follow_pg_row, &fc, &err);
    fflush(stdout);
    if (n >= 0 && n < 1000) usleep(250 * 1000);   /* a poll of the history tail, as on sqlite */
  }
  if (n < 0) {
    fprintf(stderr, "nimbus-host events: --follow: %s\n", err.msg);
    rc = NH_EXIT_FAIL;
  }
  nh_idcursor_free(&fc.cur);
  return rc;
}

/* ---- events --status queued|running: the embedded queue ---- */

struct unfinished_ctx {
  struct list_ctx *list;
  const char *type;
  long long n;
  int count;
};

static int print_unfinished(void *data, const nh_queued_row_t *r)
{
  struct unfinished_ctx *u = data;
  if (u->type && (!r->event_type || strcmp(u->type, r->event_type) != 0)) return 0;
  u->n++;
  if (u->count) return 0;
  char detail[300] = "", at[40];
  int64_t now = nh_time_now_ms();
  if (r->running) {
    snprintf(detail, sizeof detail, "in a handler on %s", r->owner ? r->owner : "?");
  } else if (r->visible_at > now) {
    nh_time_iso8601(r->visible_at, at, sizeof at);
    snprintf(detail, sizeof detail, "delayed until %s", at);
  }
  if (r->message_type && strcmp(r->message_type, "EventRequest") != 0) {
    size_t len = strlen(detail);
    snprintf(detail + len, sizeof detail - len, "%s%s", len ? "; " : "", r->message_type);
  }
  if (r->delivery_count > 0) {
    size_t len = strlen(detail);
    snprintf(detail + len, sizeof detail - len, "%sdelivered %d time%s", len ? "; " : "", r->delivery_count,
             r->delivery_count == 1 ? "" : "s");
  }
  nh_audit_t a = { 0 };
  a.endpoint = (char *)r->endpoint;
  a.event_id = (char *)(r->event_id ? r->event_id : "-");
  a.session_id = (char *)r->session_id;
  a.event_type = (char *)r->event_type;
  a.status = (char *)(r->running ? "Running" : "Queued");
  a.error_text = detail[0] ? detail : NULL;
  a.updated_at = r->enqueued_at;
  print_event(u->list, &a);
  return 0;
}

static int list_unfinished(reader_t *rd, const nh_args_t *a, int running, int limit, int count)
{
  struct list_ctx c = { .json = nh_args_has(a, "--json") };
  struct unfinished_ctx u = { &c, nh_args_get(a, "--type"), 0, count };
  const char *endpoint = nh_args_get(a, "--endpoint"), *session = nh_args_get(a, "--session");
  int64_t now = nh_time_now_ms();
  if (rd->pg) {
    nh_error_t err = {0};
    if (nh_pgq_unfinished(rd->pg, endpoint, session, running, now, u.type ? 0 : limit, print_unfinished, &u, &err) < 0) {
      fprintf(stderr, "nimbus-host events: %s\n", err.msg);
      return NH_EXIT_FAIL;
    }
  } else if (nh_embedded_list(nh_store_db(rd->s), endpoint, session, running, now, u.type ? 0 : limit,
                              print_unfinished, &u) < 0) {
    /* a store no host has run on yet has no queue table */
    if (strstr(nh_store_errmsg(rd->s), "no such table") == NULL) {
      fprintf(stderr, "nimbus-host events: store: %s\n", nh_store_errmsg(rd->s));
      return NH_EXIT_FAIL;
    }
  }
  if (count) {
    printf("%lld\n", u.n);
    return NH_EXIT_OK;
  }
  if (!c.json) table_flush(&c);
  if (!c.json && u.n == 0) printf("nothing %s\n", running ? "is running" : "is queued");
  return NH_EXIT_OK;
}

/* events on a PostgreSQL store: the audit trail with the reader's filters, then (--follow)
 * every change. */
static int events_pg(const nh_args_t *a, int limit, int count)
{
  nh_event_filter_t f;
  reader_t rd;
  int rc = reader_open(&rd, "events", a->store);
  if (rc) return rc;
  if ((rc = nh_cli_filter_parse_pg(a, "events", rd.pg, &f))) {
    reader_close(&rd);
    return rc;
  }
  f.limit = limit;
  nh_error_t err = {0};
  if (count) {
    int64_t n = nh_pgs_events_count(rd.pg, &f, &err);
    if (n >= 0) printf("%lld\n", (long long)n);
    else fprintf(stderr, "nimbus-host events: %s\n", err.msg);
    reader_close(&rd);
    return n < 0 ? (err.code == NH_EUSAGE ? NH_EXIT_USAGE : NH_EXIT_FAIL) : NH_EXIT_OK;
  }
  int follow_on = nh_args_has(a, "--follow");
  int64_t from = follow_on ? nh_pgs_history_last_id(rd.pg, &err) : 0;
  struct list_ctx c = { .json = nh_args_has(a, "--json") };
  int n = from < 0 ? NH_EFAIL : nh_pgs_events(rd.pg, &f, print_event, &c, NULL, &err);
  if (n < 0) fprintf(stderr, "nimbus-host events: %s\n", err.msg);
  if (!c.json) table_flush(&c);
  if (n == 0 && !c.json && !follow_on) printf("no events match\n");
  rc = n < 0 ? (err.code == NH_EUSAGE ? NH_EXIT_USAGE : NH_EXIT_FAIL) : NH_EXIT_OK;
  if (!rc && follow_on) {
    fflush(stdout);
    f.limit = 0;
    rc = follow_pg(rd.pg, &f, &c, from);
  }
  reader_close(&rd);
  return rc;
}

int nh_cmd_events(int argc, char **argv)
{
  static const nh_opt_spec_t specs[] = {
    NH_CLI_FILTER_OPTS, { "--json", 0 }, { "--limit", 1 }, { "--count", 0 }, { "--follow", 0 }, { NULL, 0 },
  };
  nh_args_t a;
  int rc = nh_args_parse(&a, "events", argc, argv, 2, specs);
  if (rc) return rc;
  if (a.npos) return nh_usage_error("events", "unexpected argument %s", a.pos[0]);
  int limit = 0;
  const char *lim = nh_args_get(&a, "--limit");
  if (lim) {
    long v;
    if (nh_args_long(lim, 1, 100000000, &v)) return nh_usage_error("events", "--limit %s: give a positive number", lim);
    limit = (int)v;
  }
  int count = nh_args_has(&a, "--count"), follow_on = nh_args_has(&a, "--follow");
  if (count && (follow_on || lim)) return nh_usage_error("events", "--count prints a number; it takes no --limit or --follow");
  const char *status = nh_args_get(&a, "--status");
  if (status && (strcasecmp(status, "queued") == 0 || strcasecmp(status, "running") == 0)) {
    static const char *const audit_only[] = { "--error", "--group", "--since", "--before", "--follow", NULL };
    for (int i = 0; audit_only[i]; i++)
      if (nh_args_has(&a, audit_only[i]))
        return nh_usage_error("events", "%s applies to the audit trail, not to --status %s", audit_only[i], status);
    reader_t rd;
    if ((rc = reader_open(&rd, "events", a.store))) return rc;
    rc = list_unfinished(&rd, &a, strcasecmp(status, "running") == 0, limit, count);
    reader_close(&rd);
    return rc;
  }
  if (nh_pg_url_is(a.store)) return events_pg(&a, limit, count);
  nh_store_t *s;
  if ((rc = open_store(&s, "events", a.store))) return rc;
  nh_event_filter_t f;
  if ((rc = nh_cli_filter_parse(&a, "events", s, &f))) {
    nh_store_close(s);
    return rc;
  }
  f.limit = limit;
  if (count) {
    long long n = nh_store_events_count(s, &f);
    if (n >= 0) printf("%lld\n", n);
    nh_store_close(s);
    return n < 0 ? NH_EXIT_FAIL : NH_EXIT_OK;
  }
  struct list_ctx c = { .json = nh_args_has(&a, "--json") };
  int64_t from = follow_on ? nh_store_history_last_id(s) : 0;
  rc = nh_store_events(s, &f, print_event, &c, NULL) < 0 ? NH_EXIT_FAIL : NH_EXIT_OK;
  if (!c.json) table_flush(&c);
  if (!rc && !c.json && c.n == 0 && !follow_on) printf("no events match\n");
  if (!rc && follow_on) {
    fflush(stdout);
    f.limit = 0;
    rc = follow(s, &f, &c, from);
  }
  nh_store_close(s);
  return rc;
}

/* ---- failures: the failure groups of unresolved events ---- */

struct fail_ctx {
  int json, n;
};

static int print_group(void *data, const nh_failgroup_row_t *g)
{
  struct fail_ctx *c = data;
  char masked[512], last[40];
  nh_failgroup_mask(g->sample_text, masked, sizeof masked);
  nh_time_iso8601(g->last_ms, last, sizeof last);
  if (c->json) {
    print_json_line(nh_view_failgroup(g, masked));
  } else {
    if (c->n == 0) printf("%-12s  %8s  %-20s  %-16s  %-24s  %s\n", "GROUP", "COUNT", "ENDPOINT", "ERROR_TYPE",
                          "LAST_SEEN", "MESSAGE");
    printf("%-12s  %8lld  %-20s  %-16s  %-24s  %s\n", g->group, (long long)g->count, g->endpoint,
           g->error_type ? g->error_type : "-", last, masked);
  }
  c->n++;
  return 0;
}

int nh_cmd_failures(int argc, char **argv)
{
  static const nh_opt_spec_t specs[] = { { "--endpoint", 1 }, { "--json", 0 }, { NULL, 0 } };
  nh_args_t a;
  int rc = nh_args_parse(&a, "failures", argc, argv, 2, specs);
  if (rc) return rc;
  if (a.npos) return nh_usage_error("failures", "unexpected argument %s", a.pos[0]);
  reader_t rd;
  if ((rc = reader_open(&rd, "failures", a.store))) return rc;
  nh_event_filter_t f;
  if ((rc = rd.pg ? nh_cli_filter_parse_pg(&a, "failures", rd.pg, &f) : nh_cli_filter_parse(&a, "failures", rd.s, &f))) {
    reader_close(&rd);
    return rc;
  }
  struct fail_ctx c = { nh_args_has(&a, "--json"), 0 };
  nh_error_t err = {0};
  int n = rd.pg ? nh_pgs_failgroups(rd.pg, f.endpoint, print_group, &c, &err)
                : nh_store_failgroups(rd.s, f.endpoint, print_group, &c);
  reader_close(&rd);
  if (n < 0) {
    if (err.msg[0]) fprintf(stderr, "nimbus-host failures: %s\n", err.msg);
    return NH_EXIT_FAIL;
  }
  if (!c.json && n == 0) printf("no unresolved failures\n");
  else if (!c.json)
    printf("\nresubmit or skip a group: nimbus-host resubmit --all --group GROUP (add --dry-run to see it first)\n");
  return NH_EXIT_OK;
}

struct hist_ctx {
  int json;
  json_t *arr;
};

static int print_history(void *data, const nh_history_row_t *r)
{
  struct hist_ctx *c = data;
  char ts[40];
  nh_time_iso8601(r->at, ts, sizeof ts);
  if (c->json) {
    json_array_append_new(c->arr, nh_view_history(r));
  } else {
    printf("  %s  %-24s  %-13s  %s\n", ts, r->message_type ? r->message_type : "-", r->status ? r->status : "-",
           r->detail ? r->detail : "");
    if (r->error_text) {
      size_t n = strcspn(r->error_text, "\n");
      printf("  %24s  error: %s%s%.*s\n", "", r->error_type ? r->error_type : "", r->error_type ? ": " : "", (int)n,
             r->error_text);
    }
    if (r->previous_payload) printf("  %24s  replaced payload: %s\n", "", r->previous_payload);
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
  reader_t rd;
  if ((rc = reader_open(&rd, "show", a.store))) return rc;
  nh_audit_t ev;
  nh_error_t err = {0};
  memset(&ev, 0, sizeof ev);
  if (reader_audit_find(&rd, a.pos[0], &ev, &err)) {
    fprintf(stderr, "nimbus-host show: %s\n", err.msg);
    reader_close(&rd);
    return NH_EXIT_USAGE;
  }
  struct hist_ctx c = { nh_args_has(&a, "--json"), NULL };
  int failed = 0;
  /* a transient failure's next attempt is the session's retry time while it blocks it */
  int64_t next_attempt = 0;
  if (nh_audit_retrying(&ev)) {
    nh_session_state_t st;
    memset(&st, 0, sizeof st);
    if (reader_session_get(&rd, ev.endpoint, ev.session_id, &st) == NH_OK && st.blocked_by &&
        strcmp(st.blocked_by, ev.event_id) == 0)
      next_attempt = st.retry_due;
    nh_session_state_clear(&st);
  }
  if (c.json) {
    json_t *o = nh_view_audit(&ev);
    json_object_set_new(o, "next_attempt_at", nh_view_time(next_attempt));
    json_object_set_new(o, "correlation_id", nh_view_str(ev.correlation_id));
    json_object_set_new(o, "error_stack", nh_view_str(ev.error_stack));
    json_object_set_new(o, "payload", nh_view_str(ev.payload));
    json_object_set_new(o, "result", nh_view_str(ev.result));
    json_object_set_new(o, "created_at", nh_view_time(ev.created_at));
    c.arr = json_array();
    if (reader_history_list(&rd, ev.endpoint, ev.event_id, print_history, &c) < 0) failed = 1;
    json_object_set_new(o, "history", c.arr);
    print_json_line(o);
  } else {
    char exp[40] = "-";
    if (ev.expected_by) nh_time_iso8601(ev.expected_by, exp, sizeof exp);
    printf("event      %s\nendpoint   %s\nsession    %s\ntype       %s\nstatus     %s%s%s\n", ev.event_id, ev.endpoint,
           ev.session_id, ev.event_type ? ev.event_type : "-", ev.status, ev.sub_status ? "+" : "",
           ev.sub_status ? ev.sub_status : "");
    printf("message    %s\nretries    %d\n", ev.message_id ? ev.message_id : "-", ev.retry_count);
    if (ev.processing_time_ms >= 0) {
      char queued[40] = "-";
      if (ev.queue_time_ms >= 0) snprintf(queued, sizeof queued, "%lld ms", (long long)ev.queue_time_ms);
      printf("timing     queued %s, handler %lld ms (its latest run)\n", queued, (long long)ev.processing_time_ms);
    }
    char tid[33];
    if (nh_trace_id_of(ev.traceparent, tid)) printf("trace      %s\n", tid);
    if (ev.attempts) {
      char next[40] = "";
      if (next_attempt) nh_time_iso8601(next_attempt, next, sizeof next);
      printf("attempts   %d (transient failures)%s%s\n", ev.attempts, next_attempt ? ", next attempt at " : "", next);
    }
    if (ev.error_text)
      printf("error      %s%s%s\n", ev.error_type ? ev.error_type : "", ev.error_type ? ": " : "", ev.error_text);
    if (ev.handoff_reason) printf("hand-off   %s (job %s, expected by %s)%s\n", ev.handoff_reason,
                                  ev.external_job_id ? ev.external_job_id : "-", exp,
                                  nh_audit_overdue(&ev) ? ": OVERDUE" : "");
    if (ev.result) printf("result     %s\n", ev.result);
    if (ev.payload) printf("payload    %s\n", ev.payload);
    if (ev.error_stack) printf("traceback\n%s\n", ev.error_stack);
    printf("history\n");
    if (reader_history_list(&rd, ev.endpoint, ev.event_id, print_history, &c) < 0) failed = 1;
  }
  if (rd.s && nh_store_failed(rd.s)) failed = 1;
  nh_audit_clear(&ev);
  reader_close(&rd);
  return failed ? NH_EXIT_FAIL : NH_EXIT_OK;
}

struct sess_ctx {
  reader_t *rd;
  int json, n;
};

static int print_session(void *data, const char *endpoint, const char *session, const nh_session_state_t *st)
{
  struct sess_ctx *c = data;
  int parked = reader_parked_count(c->rd, endpoint, session);
  int overdue = 0;   /* blocked by a hand-off whose expected_by passed */
  nh_audit_t b;
  if (st->blocked_by && reader_audit_get(c->rd, endpoint, st->blocked_by, &b) == 1) {
    overdue = nh_audit_overdue(&b);
    nh_audit_clear(&b);
  }
  if (c->json) {
    json_t *o = json_object();
    json_object_set_new(o, "endpoint", json_string(endpoint));
    json_object_set_new(o, "session_id", json_string(session));
    json_object_set_new(o, "blocked_by", nh_view_str(st->blocked_by));
    json_object_set_new(o, "draining", json_boolean(st->draining));
    json_object_set_new(o, "parked", json_integer(parked));
    json_object_set_new(o, "retry_due", nh_view_time(st->retry_due));
    json_object_set_new(o, "handoff_overdue", json_boolean(overdue));
    print_json_line(o);
  } else {
    if (c->n == 0) printf("%-20s  %-24s  %-36s  %-8s  %s\n", "ENDPOINT", "SESSION", "BLOCKED_BY", "PARKED", "STATE");
    char due[40] = "";
    if (st->retry_due) nh_time_iso8601(st->retry_due, due, sizeof due);
    printf("%-20s  %-24s  %-36s  %-8d  %s%s%s%s\n", endpoint, session, st->blocked_by ? st->blocked_by : "-", parked,
           st->blocked_by ? "blocked" : st->draining ? "draining" : "free", st->retry_due ? ", retry at " : "", due,
           overdue ? ", hand-off overdue" : "");
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
  reader_t rd;
  if ((rc = reader_open(&rd, "sessions", a.store))) return rc;
  struct sess_ctx c = { &rd, nh_args_has(&a, "--json"), 0 };
  int failed = reader_sessions_list(&rd, nh_args_get(&a, "--endpoint"), nh_args_has(&a, "--blocked"), print_session,
                                    &c) < 0;
  if (rd.s && nh_store_failed(rd.s)) failed = 1;
  if (failed) fprintf(stderr, "nimbus-host sessions: store: reading the sessions failed\n");
  if (!c.json && c.n == 0 && !failed) printf("no blocked or draining sessions\n");
  reader_close(&rd);
  return failed ? NH_EXIT_FAIL : NH_EXIT_OK;
}
