/* Bulk operator actions: `resubmit --all` and `skip --all` with the event filters.
 *
 * The matching events are queued as ordinary operator requests (nh_operator_queue, the
 * path of a single resubmit) in batches, one store transaction per batch, so a killed
 * command leaves whole batches behind. A run keeps a snapshot time in `bulk_runs`: it
 * acts only on events unchanged since it first started, and leaves out events that
 * already have a request waiting. Running an interrupted command again therefore
 * queues exactly the rest: what the first run queued either still waits (left out) or
 * has been applied by the host (changed since the snapshot, left out). */
#include "nh_cli.h"
#include "core/nh_util.h"
#include "dispatch/nh_operator.h"
#include "transport/nh_embedded.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NH_BULK_BATCH 2000   /* requests per store transaction (NIMBUS_BULK_BATCH overrides) */
#define NH_BULK_SHOW 10       /* events listed by --dry-run */

typedef struct batch {
  nh_audit_t *rows;
  int n, cap;
} batch_t;

/* cap 0: a bulk batch (NIMBUS_BULK_BATCH or the default) */
static batch_t *batch_new(int cap)
{
  batch_t *b = nh_xcalloc(1, sizeof *b);
  const char *env = getenv("NIMBUS_BULK_BATCH");
  b->cap = cap > 0 ? cap : env && atoi(env) > 0 ? atoi(env) : NH_BULK_BATCH;
  b->rows = nh_xcalloc((size_t)b->cap, sizeof *b->rows);
  return b;
}

/* Takes the row (its strings) instead of copying: the store clears what is left. */
static int take_row(void *data, const nh_audit_t *a)
{
  batch_t *b = data;
  b->rows[b->n++] = *a;
  memset((nh_audit_t *)a, 0, sizeof *a);
  return b->n == b->cap;
}

static void batch_clear(batch_t *b)
{
  for (int i = 0; i < b->n; i++) nh_audit_clear(&b->rows[i]);
  b->n = 0;
}

static void batch_free(batch_t *b)
{
  batch_clear(b);
  free(b->rows);
  free(b);
}

typedef struct ep_count {
  char name[128];
  long long n;
} ep_count_t;

static void count_endpoint(ep_count_t *eps, int *neps, const char *ep)
{
  for (int i = 0; i < *neps; i++)
    if (strcmp(eps[i].name, ep) == 0) {
      eps[i].n++;
      return;
    }
  if (*neps == 32) return;
  snprintf(eps[*neps].name, sizeof eps[*neps].name, "%s", ep);
  eps[(*neps)++].n = 1;
}

static void progress(int tty, long long done, long long total)
{
  if (!tty) return;
  fprintf(stderr, "\r  queued %lld of %lld (%d%%)", done, total, total ? (int)(done * 100 / total) : 100);
  fflush(stderr);
}

/* The statuses an action cannot apply to (as nh_operator_queue would refuse them), so a
 * dry run counts exactly what a real run queues. */
static void eligible_only(int kind, int force, nh_event_filter_t *f)
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

typedef struct bulk {
  nh_store_t *s;
  nh_transport_t *tr;
  const char *key;
  nh_bulk_run_t *run;
  nh_op_req_t req;
  batch_t *b;
  int tty, neps, batches;
  long long total, queued, refused;
  const char *kill_after;   /* the crash test's hook: die like a killed process after K batches */
  ep_count_t eps[32];
  char first_refusal[512];
} bulk_t;

/* Queues every event f matches, a batch per transaction. */
static int queue_pass(bulk_t *B, nh_event_filter_t *f)
{
  batch_t *b = B->b;
  f->batch = b->cap;
  for (;;) {
    /* The batch is read before the write lock is taken, so the hosts commit meanwhile
     * (read inside it, a group of 100,000 held them up 94 ms a batch); each row is read
     * again under the lock, and one that changed since the run started is left out, as
     * the cutoff leaves it out of the read. */
    int64_t last_rowid = 0;
    if (nh_store_events(B->s, f, take_row, b, &last_rowid) < 0) return NH_EFAIL;
    if (b->n == 0) return NH_OK;
    if (nh_store_begin(B->s)) return NH_EFAIL;
    for (int i = 0; i < b->n; i++) {
      nh_audit_t now;
      int got = nh_store_audit_get(B->s, b->rows[i].endpoint, b->rows[i].event_id, &now);
      if (got < 0) return NH_EFAIL;
      if (got == 0 || now.updated_at > f->cutoff_ms) {
        if (got) nh_audit_clear(&now);
        continue;
      }
      nh_audit_clear(&b->rows[i]);
      b->rows[i] = now;
      nh_error_t qerr = {0};
      B->req.event_id = b->rows[i].event_id;
      int q = nh_operator_queue(B->s, B->tr, &B->req, &b->rows[i], &qerr);
      if (q == NH_EFAIL) return NH_EFAIL;
      if (q) {
        if (!B->refused++) snprintf(B->first_refusal, sizeof B->first_refusal, "%s", qerr.msg);
        continue;
      }
      B->queued++;
      count_endpoint(B->eps, &B->neps, b->rows[i].endpoint);
    }
    /* keyset: the next batch starts after the last row of this one */
    f->after_rowid = last_rowid;
    B->run->queued = B->queued;
    if (nh_store_bulk_put(B->s, B->key, B->run) || nh_store_commit(B->s)) return NH_EFAIL;
    int last = b->n < b->cap;
    batch_clear(b);
    if (B->kill_after && ++B->batches == atoi(B->kill_after)) raise(SIGKILL);
    progress(B->tty, B->queued + B->refused, B->total);
    if (last) return NH_OK;
  }
}

static int dry_run(nh_store_t *s, const nh_event_filter_t *f, long long total, const char *verb)
{
  printf("%lld event%s would be %s (dry run: nothing was queued)\n", total, total == 1 ? "" : "s", verb);
  batch_t *b = batch_new(NH_BULK_SHOW);   /* only what is listed is read */
  nh_event_filter_t first = *f;
  first.batch = NH_BULK_SHOW;   /* the first the real run queues: the same order */
  int rc = nh_store_events(s, &first, take_row, b, NULL);
  for (int i = 0; i < b->n; i++) {
    const nh_audit_t *a = &b->rows[i];
    printf("  %s  %s  %s  %s  %s\n", a->event_id, a->endpoint, a->session_id, a->event_type ? a->event_type : "-",
           a->status);
  }
  if (total > NH_BULK_SHOW) printf("  ... and %lld more\n", total - NH_BULK_SHOW);
  batch_free(b);
  return rc < 0 ? NH_EXIT_FAIL : NH_EXIT_OK;
}

int nh_cli_bulk(int kind, const nh_args_t *a)
{
  const char *cmd = kind == NH_OP_RESUBMIT ? "resubmit" : "skip";
  const char *verb = kind == NH_OP_RESUBMIT ? "resubmitted" : "skipped";
  if (a->npos) return nh_usage_error(cmd, "give either one EVENT_ID or --all with filters, not both");
  if (!nh_args_has(a, "--endpoint") && !nh_args_has(a, "--status") && !nh_args_has(a, "--group"))
    return nh_usage_error(cmd, "--all needs a filter that bounds it: say --endpoint E or --status S (or --group G)");
  if (nh_args_has(a, "--body")) return nh_usage_error(cmd, "--body applies to one event, not to --all");

  nh_error_t err = {0};
  nh_store_t *s = NULL;
  if (nh_store_open(&s, a->store, 0, &err)) {
    fprintf(stderr, "nimbus-host %s: %s\n", cmd, err.msg);
    return err.code == NH_EFAIL ? NH_EXIT_FAIL : NH_EXIT_USAGE;
  }
  nh_event_filter_t f;
  int rc = nh_cli_filter_parse(a, cmd, s, &f);
  if (rc) {
    nh_store_close(s);
    return rc;
  }
  eligible_only(kind, nh_args_has(a, "--force"), &f);

  char filters[512], key[600];
  nh_cli_filter_describe(&f, a, filters, sizeof filters);
  snprintf(key, sizeof key, "%s %s", cmd, filters);
  char host[128] = "localhost", owner[200];
  gethostname(host, sizeof host - 1);
  snprintf(owner, sizeof owner, "%s:%ld:bulk", host, (long)getpid());

  nh_bulk_run_t prev;
  int resumed = nh_store_bulk_get(s, key, &prev);
  if (resumed < 0) goto store_failed;
  if (resumed && prev.owner && !nh_owner_dead(prev.owner)) {
    fprintf(stderr, "nimbus-host %s: the same command is already running (%s, since %lld s); wait for it\n", cmd,
            prev.owner, (long long)((nh_time_now_ms() - prev.started_ms) / 1000));
    free(prev.owner);
    nh_store_close(s);
    return NH_EXIT_FAIL;
  }
  free(prev.owner);
  int64_t now = nh_time_now_ms();
  f.cutoff_ms = resumed ? prev.cutoff_ms : now;
  long long total = nh_store_events_count(s, &f);
  if (total < 0) goto store_failed;
  int dry = nh_args_has(a, "--dry-run");
  if (dry) {
    if (resumed)
      printf("an interrupted run of this command (started %lld s ago) is resumed by the next real run: counted as it "
             "would queue\n", (long long)((now - prev.started_ms) / 1000));
    rc = dry_run(s, &f, total, verb);
    nh_store_close(s);
    return rc;
  }
  if (resumed) {
    char at[40];
    nh_time_iso8601(prev.started_ms, at, sizeof at);
    printf("resuming the run started at %s that did not finish (%lld requests queued then); events that changed "
           "since then are left out: run the command again afterwards for those\n", at, (long long)prev.queued);
  }
  if (total == 0) {
    printf("no events match %s (nothing to do)\n", filters);
    if (resumed && (nh_store_begin(s) || nh_store_bulk_done(s, key) || nh_store_commit(s))) goto store_failed;
    nh_store_close(s);
    return NH_EXIT_OK;
  }

  char emb_owner[64];
  snprintf(emb_owner, sizeof emb_owner, "cli:%ld", (long)getpid());
  nh_transport_t *tr = nh_embedded_init(nh_store_db(s), emb_owner, &err);
  if (!tr) {
    fprintf(stderr, "nimbus-host %s: %s\n", cmd, err.msg);
    nh_store_close(s);
    return NH_EXIT_FAIL;
  }
  nh_bulk_run_t run = { .cutoff_ms = f.cutoff_ms, .started_ms = resumed ? prev.started_ms : now, .owner = owner };
  if (nh_store_begin(s) || nh_store_bulk_put(s, key, &run) || nh_store_commit(s)) goto store_failed_tr;

  bulk_t B = { .s = s, .tr = tr, .key = key, .run = &run, .tty = isatty(2), .total = total, .b = batch_new(0),
               .kill_after = getenv("NIMBUS_TEST_BULK_KILL_AFTER"),
               .req = { .kind = (nh_op_kind_t)kind, .actor = "cli (bulk)", .no_oplog = 1,
                        .force = nh_args_has(a, "--force") } };
  progress(B.tty, 0, total);
  int qrc;
  if (kind == NH_OP_SKIP && !f.status) {
    /* Parked events first: skipped while their blocker still blocks, they are taken
     * off the parked queue. Skipped after it, they would have replayed already. */
    nh_event_filter_t parked = f;
    parked.status = NH_ST_DEFERRED;
    qrc = queue_pass(&B, &parked);
    if (qrc == NH_OK) {
      nh_event_filter_t rest = f;
      rest.not_status[2] = NH_ST_DEFERRED;
      qrc = queue_pass(&B, &rest);
    }
  } else {
    qrc = queue_pass(&B, &f);
  }
  batch_t *b = B.b;
  if (qrc) goto store_failed_batch;
  long long queued = B.queued, refused = B.refused;
  ep_count_t *eps = B.eps;
  int neps = B.neps, tty = B.tty;
  const char *first_refusal = B.first_refusal;
  batch_free(b);
  if (tty) fputc('\n', stderr);
  char detail[700];
  snprintf(detail, sizeof detail, "%lld events (%s)", queued, filters);
  if (nh_store_begin(s) || nh_store_bulk_done(s, key) ||
      nh_store_oplog_add(s, kind == NH_OP_RESUBMIT ? "resubmit --all" : "skip --all", NULL, NULL, NULL, detail) ||
      nh_store_commit(s))
    goto store_failed_tr;
  printf("queued %lld %s request%s", queued, cmd, queued == 1 ? "" : "s");
  for (int i = 0; i < neps; i++) printf("%s %s (%lld)", i ? "," : " for", eps[i].name, eps[i].n);
  printf("; the hosts owning the endpoints apply them in session order\n");
  if (refused) printf("%lld not queued, for example: %s\n", refused, first_refusal);
  /* a host refreshes its row every 10 s: one silent for 30 s is gone */
  for (int i = 0; i < neps; i++)
    if (nh_store_hosts_serving(s, eps[i].name, nh_time_now_ms() - 30000) == 0)
      printf("note: no running host serves %s; its requests wait in the store until one starts "
             "(nimbus-host ADAPTER.lua --store %s)\n", eps[i].name, a->store);
  tr->vt->close(tr);
  nh_store_close(s);
  return NH_EXIT_OK;

store_failed_batch:
  batch_free(b);
store_failed_tr:
  nh_store_rollback(s);
  fprintf(stderr, "\nnimbus-host %s: store: %s; the batches queued so far stay queued: run the same command again "
                  "to queue the rest\n", cmd, nh_store_errmsg(s));
  tr->vt->close(tr);
  nh_store_close(s);
  return NH_EXIT_FAIL;
store_failed:
  fprintf(stderr, "nimbus-host %s: store: %s\n", cmd, nh_store_errmsg(s));
  nh_store_close(s);
  return NH_EXIT_FAIL;
}
