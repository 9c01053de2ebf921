/* Overdue hand-offs: a pending hand-off whose expected_by passed is flagged once (the
 * audit row's overdue_at, a history row), and told as every other story is, after the
 * commit: a warning line, nimbus_handoffs_overdue_total and the handoff_overdue hook.
 * Only the endpoints this host serves are flagged here, so the hook runs where the adapter
 * is; the conditional UPDATE keeps two hosts on one store from flagging one twice. */
#include "nh_dispatch_int.h"
#include "core/nh_log.h"
#include "core/nh_util.h"
#include "store/nh_pg_link.h"
#include "store/nh_pg_ops.h"

#include <stdio.h>
#include <stdlib.h>

#define NH_OVERDUE_EVERY_MS 1000
#define NH_OVERDUE_BATCH 200

struct due_ctx {
  nh_dispatch_t *d;
  int64_t now;
  int failed, seen, flagged;
};

static void overdue_detail(const nh_audit_t *a, char *detail, size_t len)
{
  char exp[40];
  nh_time_iso8601(a->expected_by, exp, sizeof exp);
  snprintf(detail, len, "hand-off overdue: expected by %s%s%s", exp, a->external_job_id ? ", job " : "",
           a->external_job_id ? a->external_job_id : "");
}

static void overdue_note(nh_story_t *story, const nh_audit_t *a, const char *detail)
{
  nh_note_t *n = nh_story_add(story, NH_NOTE_OVERDUE);
  nh_note_set(&n->endpoint, a->endpoint);
  nh_note_set(&n->event_id, a->event_id);
  nh_note_set(&n->session, a->session_id);
  nh_note_set(&n->type, a->event_type);
  nh_note_set(&n->message_id, a->message_id);
  nh_note_set(&n->status, a->status);
  nh_note_set(&n->sub_status, a->sub_status);
  nh_note_set(&n->detail, detail);
  nh_note_set(&n->external_job_id, a->external_job_id);
  n->expected_by = a->expected_by;
}

static int served(nh_dispatch_t *d, const char *endpoint)
{
  nh_endpoint_t *ep = nh_dispatch_find_endpoint(d, endpoint);
  return ep && !ep->retired;
}

/* A full batch that flagged something may have more behind it: scan again at once. One
 * that flagged nothing (the endpoints of other hosts fill it) waits for the next tick. */
static int more(int seen, int flagged) { return seen >= NH_OVERDUE_BATCH && flagged > 0; }

static int on_due(void *data, const nh_audit_t *a)
{
  struct due_ctx *c = data;
  c->seen++;
  if (!served(c->d, a->endpoint)) return 0;
  int flagged = nh_store_handoff_flag_overdue(c->d->store, a->endpoint, a->event_id, c->now);
  if (flagged < 0) {
    c->failed = 1;
    return 1;
  }
  if (!flagged) return 0;
  char detail[256];
  overdue_detail(a, detail, sizeof detail);
  if (nh_store_history_add(c->d->store, a->endpoint, a->event_id, a->message_id, "HandoffOverdue", NH_ST_PENDING,
                           detail)) {
    c->failed = 1;
    return 1;
  }
  overdue_note(&c->d->story, a, detail);
  c->flagged++;
  return 0;
}

static void pg_scan(nh_dispatch_t *d);

static void overdue_cb(uv_timer_t *h)
{
  nh_dispatch_t *d = h->data;
  if (!d->store) return pg_scan(d);
  if (d->stopping || d->pumping) return;
  struct due_ctx c = { d, nh_time_now_ms(), 0, 0, 0 };
  if (nh_store_begin(d->store)) return;
  if (nh_store_handoffs_due(d->store, c.now, NH_OVERDUE_BATCH, on_due, &c)) c.failed = 1;
  if (!c.failed && nh_store_commit(d->store) == NH_OK) {
    nh_dispatch_tell(d);
    if (more(c.seen, c.flagged)) uv_timer_start(&d->overdue_timer, overdue_cb, 0, NH_OVERDUE_EVERY_MS);
    return;
  }
  nh_store_rollback(d->store);
  nh_story_rollback(&d->story, 0);
}

/* ---------------------------------------------------------------- on PostgreSQL */

/* Two batches on the link beside the pump's: the due hand-offs read, then each one of an
 * endpoint served here flagged with its history row (one statement: of two hosts scanning
 * at once, one flags it and tells it). Told from a story of the scan's own, since a pump
 * may be between its fill and its commit meanwhile. */
typedef struct scan {
  nh_dispatch_t *d;
  int64_t now;
  nh_audit_t *rows;            /* the due ones of endpoints served here */
  int *flagged;
  int n, seen, marking, next;
} scan_t;

static void scan_free(scan_t *s)
{
  for (int i = 0; i < s->n; i++) nh_audit_clear(&s->rows[i]);
  free(s->rows);
  free(s->flagged);
  s->d->overdue_scanning = 0;
  free(s);
}

static void on_scan_result(void *data, const nh_pg_optab_t *tab, int op, const PGresult *res)
{
  scan_t *s = data;
  (void)tab, (void)op;
  if (s->marking) {
    s->flagged[s->next++] = PQntuples(res) > 0;
    return;
  }
  s->seen = PQntuples(res);
  s->rows = nh_xcalloc((size_t)s->seen + 1, sizeof *s->rows);
  s->flagged = nh_xcalloc((size_t)s->seen + 1, sizeof *s->flagged);
  for (int i = 0; i < s->seen; i++) {
    nh_pgrow_audit(res, i, &s->rows[s->n]);
    if (served(s->d, s->rows[s->n].endpoint)) s->n++;
    else nh_audit_clear(&s->rows[s->n]);
  }
}

static int scan_build(void *data, nh_pg_db_t *db, nh_error_t *err)
{
  scan_t *s = data;
  nh_pg_args_t a;
  if (!s->marking)
    return nh_pg_batch_add(db, nh_pgargs_handoffs_due(&a, s->now, NH_OVERDUE_BATCH), &a, on_scan_result, s, err);
  for (int i = 0; i < s->n; i++) {
    char detail[256];
    overdue_detail(&s->rows[i], detail, sizeof detail);
    int rc = nh_pg_batch_add(db, nh_pgargs_handoff_overdue_mark(&a, s->rows[i].endpoint, s->rows[i].event_id, s->now,
                                                                detail),
                             &a, on_scan_result, s, err);
    if (rc) return rc;
  }
  return NH_OK;
}

static void scan_done(void *data, nh_pg_batch_outcome_t outcome, const nh_error_t *err)
{
  scan_t *s = data;
  nh_dispatch_t *d = s->d;
  (void)err;   /* the next tick tries again; a lost connection is the link's to say */
  if (outcome != NH_PG_COMMITTED || d->stopping) return scan_free(s);
  if (!s->marking && s->n > 0) {
    s->marking = 1;
    if (nh_pg_link_submit(d->link, scan_build, scan_done, s, NULL) == NH_OK) return;
    return scan_free(s);
  }
  nh_story_t story = {0};
  char detail[256];
  int flagged = 0;
  for (int i = 0; s->marking && i < s->n; i++)
    if (s->flagged[i]) {
      overdue_detail(&s->rows[i], detail, sizeof detail);
      overdue_note(&story, &s->rows[i], detail);
      flagged++;
    }
  nh_dispatch_tell_story(d, &story);
  nh_story_free(&story);
  if (more(s->seen, flagged)) uv_timer_start(&d->overdue_timer, overdue_cb, 0, NH_OVERDUE_EVERY_MS);
  scan_free(s);
}

static void pg_scan(nh_dispatch_t *d)
{
  if (d->stopping || d->overdue_scanning) return;
  scan_t *s = nh_xcalloc(1, sizeof *s);
  s->d = d;
  s->now = nh_time_now_ms();
  d->overdue_scanning = 1;
  if (nh_pg_link_submit(d->link, scan_build, scan_done, s, NULL)) scan_free(s);
}

void nh_dispatch_overdue_start(nh_dispatch_t *d)
{
  uv_timer_start(&d->overdue_timer, overdue_cb, NH_OVERDUE_EVERY_MS, NH_OVERDUE_EVERY_MS);
}
