/* The bulk operator engine (nh_bulk.h), on either store: sqlite (a batch per transaction)
 * or PostgreSQL (a command's blocking connection: each event's request a transaction of
 * its own, as `resubmit EVENT_ID` writes it; the run's record after each batch). */
#include "nh_bulk.h"
#include "core/nh_util.h"
#include "store/nh_pg_ops.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NH_BULK_BATCH 2000   /* requests per store transaction (NIMBUS_BULK_BATCH overrides) */

struct nh_bulk {
  nh_store_t *s;
  nh_transport_t *tr;
  nh_pg_db_t *pg;              /* a PostgreSQL store's (s and tr NULL) */
  nh_bulk_opts_t o;
  nh_op_req_t req;
  nh_event_filter_t pass[2];   /* skip without a status: the parked first, then the rest */
  int npass, cur;
  nh_bulk_run_t run;
  nh_audit_t *rows;
  int n, cap, batches;
  const char *kill_after;      /* the crash test's hook: die like a killed process after K batches */
  nh_error_t err;              /* PostgreSQL: why a read failed */
  nh_bulk_result_t res;
};

/* The statuses an action cannot apply to (as nh_operator_queue would refuse them), so a
 * dry run counts exactly what a real run queues. */
static void eligible_only(nh_op_kind_t kind, int force, nh_event_filter_t *f)
{
  if (kind == NH_OP_RESUBMIT) {
    f->not_status[0] = NH_ST_DEFERRED;   /* parked: replays in order by itself */
    if (!force) {                        /* resolved: running them again repeats their side effects */
      f->not_status[1] = NH_ST_COMPLETED;
      f->not_status[2] = NH_ST_SKIPPED;
    }
    f->need_payload = 1;
  } else {
    f->not_status[0] = NH_ST_COMPLETED;
    f->not_status[1] = NH_ST_SKIPPED;
  }
  f->without_request = 1;
}

static void set_filter(nh_bulk_t *b, const nh_event_filter_t *f)
{
  const nh_bulk_opts_t *o = &b->o;
  const char *env = getenv("NIMBUS_BULK_BATCH");
  b->cap = env && atoi(env) > 0 ? atoi(env) : NH_BULK_BATCH;
  b->rows = nh_xcalloc((size_t)b->cap, sizeof *b->rows);
  b->kill_after = getenv("NIMBUS_TEST_BULK_KILL_AFTER");
  b->req = (nh_op_req_t){ .kind = o->kind, .actor = o->actor, .who = o->who, .reason = o->reason,
                          .no_oplog = 1, .force = o->force };
  nh_event_filter_t base = *f;
  eligible_only(o->kind, o->force, &base);
  base.batch = b->cap;
  base.desc = 0;
  int has_status = base.status || base.status_in[0];
  if (o->kind == NH_OP_SKIP && !has_status) {
    /* Parked events first: skipped while their blocker still blocks, they are taken off
     * the parked queue. Skipped after it, they would have replayed already. */
    b->pass[0] = base;
    b->pass[0].status = NH_ST_DEFERRED;
    b->pass[1] = base;
    b->pass[1].not_status[2] = NH_ST_DEFERRED;
    b->npass = 2;
  } else {
    b->pass[0] = base;
    b->npass = 1;
  }
}

nh_bulk_t *nh_bulk_new(nh_store_t *s, nh_transport_t *tr, const nh_event_filter_t *f, const nh_bulk_opts_t *o)
{
  nh_bulk_t *b = nh_xcalloc(1, sizeof *b);
  b->s = s;
  b->tr = tr;
  b->o = *o;
  set_filter(b, f);
  return b;
}

nh_bulk_t *nh_bulk_new_pg(nh_pg_db_t *db, const nh_event_filter_t *f, const nh_bulk_opts_t *o)
{
  nh_bulk_t *b = nh_xcalloc(1, sizeof *b);
  b->pg = db;
  b->o = *o;
  set_filter(b, f);
  return b;
}

/* ---------------------------------------------------------------- either store */

static int run_get(nh_bulk_t *b, nh_bulk_run_t *prev)
{
  return b->pg ? nh_pgs_bulk_get(b->pg, b->o.key, prev) : nh_store_bulk_get(b->s, b->o.key, prev);
}

/* The run's record written (sqlite: in the open transaction, or one of its own). */
static int run_put(nh_bulk_t *b, const nh_bulk_run_t *run, int in_tx)
{
  if (b->pg) return nh_pgs_bulk_put(b->pg, b->o.key, run);
  if (in_tx) return nh_store_bulk_put(b->s, b->o.key, run);
  if (nh_store_begin(b->s) || nh_store_bulk_put(b->s, b->o.key, run) || nh_store_commit(b->s)) {
    nh_store_rollback(b->s);
    return NH_EFAIL;
  }
  return NH_OK;
}

static int64_t count(nh_bulk_t *b, const nh_event_filter_t *f)
{
  return b->pg ? nh_pgs_events_count(b->pg, f, &b->err) : nh_store_events_count(b->s, f);
}

static int read_events(nh_bulk_t *b, const nh_event_filter_t *f, nh_audit_cb cb, void *data, int64_t *last)
{
  return b->pg ? nh_pgs_events(b->pg, f, cb, data, last, &b->err) : nh_store_events(b->s, f, cb, data, last);
}

const char *nh_bulk_errmsg(const nh_bulk_t *b)
{
  if (!b->pg) return nh_store_errmsg(b->s);
  return b->err.msg[0] ? b->err.msg : nh_pg_db_error(b->pg)->msg;
}


int nh_bulk_prepare(nh_bulk_t *b, nh_error_t *err)
{
  nh_bulk_run_t prev = { 0 };
  int resumed = run_get(b, &prev);
  if (resumed < 0) return nh_error_set(err, NH_EFAIL, "store: %s", nh_bulk_errmsg(b));
  if (resumed && prev.owner && !nh_owner_dead(prev.owner)) {
    nh_error_set(err, NH_ESTATE, "the same bulk action is already running (%s, since %lld s); wait for it",
                 prev.owner, (long long)((nh_time_now_ms() - prev.started_ms) / 1000));
    free(prev.owner);
    return NH_ESTATE;
  }
  free(prev.owner);
  int64_t now = nh_time_now_ms();
  b->res.resumed = resumed;
  b->res.resumed_started_ms = resumed ? prev.started_ms : 0;
  b->res.resumed_queued = resumed ? prev.queued : 0;
  int64_t cutoff = resumed ? prev.cutoff_ms : now;
  b->run = (nh_bulk_run_t){ .cutoff_ms = cutoff, .started_ms = resumed ? prev.started_ms : now,
                            .owner = (char *)b->o.owner };
  b->res.total = 0;
  for (int i = 0; i < b->npass; i++) {
    b->pass[i].cutoff_ms = cutoff;
    int64_t n = count(b, &b->pass[i]);
    if (n < 0) return nh_error_set(err, NH_EFAIL, "store: %s", nh_bulk_errmsg(b));
    b->res.total += n;
  }
  return NH_OK;
}

int nh_bulk_sample(nh_bulk_t *b, int n, nh_audit_cb cb, void *data)
{
  int got = 0;
  for (int i = 0; i < b->npass && got < n; i++) {
    nh_event_filter_t first = b->pass[i];
    first.batch = n - got;   /* the first the real run queues: the same order */
    int k = read_events(b, &first, cb, data, NULL);
    if (k < 0) return NH_EFAIL;
    got += k;
  }
  return got;
}

int nh_bulk_nothing(nh_bulk_t *b)
{
  if (!b->res.resumed) return NH_OK;
  if (b->pg) return nh_pgs_bulk_done(b->pg, b->o.key);
  if (nh_store_begin(b->s) || nh_store_bulk_done(b->s, b->o.key) || nh_store_commit(b->s)) {
    nh_store_rollback(b->s);
    return NH_EFAIL;
  }
  return NH_OK;
}

int nh_bulk_start(nh_bulk_t *b) { return run_put(b, &b->run, 0); }

/* Takes the row (its strings) instead of copying: the store clears what is left. */
static int take_row(void *data, const nh_audit_t *a)
{
  nh_bulk_t *b = data;
  b->rows[b->n++] = *a;
  memset((nh_audit_t *)a, 0, sizeof *a);
  return b->n == b->cap;
}

static void rows_clear(nh_bulk_t *b)
{
  for (int i = 0; i < b->n; i++) nh_audit_clear(&b->rows[i]);
  b->n = 0;
}

static void count_endpoint(nh_bulk_result_t *r, const char *ep)
{
  for (int i = 0; i < r->neps; i++)
    if (strcmp(r->eps[i].name, ep) == 0) {
      r->eps[i].n++;
      return;
    }
  if (r->neps == NH_BULK_EPS) return;
  snprintf(r->eps[r->neps].name, sizeof r->eps[r->neps].name, "%s", ep);
  r->eps[r->neps++].n = 1;
}

/* Queues the batch read: on sqlite under the write lock, on PostgreSQL each event's
 * request a transaction of its own. */
static int queue_rows(nh_bulk_t *b, const nh_event_filter_t *f)
{
  for (int i = 0; i < b->n; i++) {
    nh_audit_t now;
    int got = b->pg ? nh_pgs_audit_get(b->pg, b->rows[i].endpoint, b->rows[i].event_id, &now)
                    : nh_store_audit_get(b->s, b->rows[i].endpoint, b->rows[i].event_id, &now);
    if (got < 0) return NH_EFAIL;
    if (got == 0 || now.updated_at > f->cutoff_ms) {
      if (got) nh_audit_clear(&now);
      continue;
    }
    nh_audit_clear(&b->rows[i]);
    b->rows[i] = now;
    nh_error_t qerr = {0};
    b->req.event_id = b->rows[i].event_id;
    int q = b->pg ? nh_operator_queue_pg(b->pg, &b->req, &b->rows[i], &qerr)
                  : nh_operator_queue(b->s, b->tr, &b->req, &b->rows[i], &qerr);
    if (q == NH_EFAIL) return NH_EFAIL;
    if (q) {
      if (!b->res.refused++) snprintf(b->res.first_refusal, sizeof b->res.first_refusal, "%s", qerr.msg);
      continue;
    }
    b->res.queued++;
    count_endpoint(&b->res, b->rows[i].endpoint);
  }
  return NH_OK;
}

int nh_bulk_step(nh_bulk_t *b)
{
  if (b->cur == b->npass) return 0;
  nh_event_filter_t *f = &b->pass[b->cur];
  /* The batch is read before the write lock is taken, so the hosts commit meanwhile
   * (read inside it, a group of 100,000 held them up 94 ms a batch); each row is read
   * again under the lock, and one that changed since the run started is left out, as
   * the cutoff leaves it out of the read. */
  int64_t last_rowid = 0;
  if (read_events(b, f, take_row, b, &last_rowid) < 0) return NH_EFAIL;
  if (b->n == 0) {
    b->cur++;
    return b->cur < b->npass;
  }
  if (!b->pg && nh_store_begin(b->s)) return NH_EFAIL;
  if (queue_rows(b, f)) {
    rows_clear(b);
    if (!b->pg) nh_store_rollback(b->s);
    return NH_EFAIL;
  }
  f->after_rowid = last_rowid;   /* keyset: the next batch starts after the last row of this one */
  b->run.queued = b->res.queued;
  if (run_put(b, &b->run, 1) || (!b->pg && nh_store_commit(b->s))) {
    rows_clear(b);
    if (!b->pg) nh_store_rollback(b->s);
    return NH_EFAIL;
  }
  int last = b->n < b->cap;
  rows_clear(b);
  if (b->kill_after && ++b->batches == atoi(b->kill_after)) raise(SIGKILL);
  if (last) b->cur++;
  return b->cur < b->npass;
}

int nh_bulk_finish(nh_bulk_t *b)
{
  char detail[900];
  snprintf(detail, sizeof detail, "%lld events (%s)%s%s", b->res.queued, b->o.key, b->o.reason ? ": " : "",
           b->o.reason ? b->o.reason : "");
  const char *action = b->o.kind == NH_OP_RESUBMIT ? "resubmit --all" : "skip --all";
  if (b->pg)
    return nh_pgs_bulk_done(b->pg, b->o.key) || nh_pgs_oplog_add(b->pg, b->o.who, action, NULL, NULL, NULL, detail)
             ? NH_EFAIL
             : NH_OK;
  if (nh_store_begin(b->s) || nh_store_bulk_done(b->s, b->o.key) ||
      nh_store_oplog_add(b->s, b->o.who, action, NULL, NULL, NULL, detail) || nh_store_commit(b->s)) {
    nh_store_rollback(b->s);
    return NH_EFAIL;
  }
  return NH_OK;
}

int nh_bulk_abandon(nh_bulk_t *b)
{
  if (!b->pg) nh_store_rollback(b->s);
  nh_bulk_run_t run = b->run;
  run.owner = NULL;
  return run_put(b, &run, 0);
}

const nh_bulk_result_t *nh_bulk_result(const nh_bulk_t *b) { return &b->res; }

void nh_bulk_free(nh_bulk_t *b)
{
  if (!b) return;
  rows_clear(b);
  free(b->rows);
  free(b);
}
