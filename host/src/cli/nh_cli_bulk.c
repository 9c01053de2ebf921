/* Bulk operator actions from the CLI: `resubmit --all` and `skip --all` with the event
 * filters, run by the engine the admin API uses too (dispatch/nh_bulk.h: batches, one
 * store transaction each, resumable after a kill), on sqlite or PostgreSQL. This file only
 * parses, reports progress and prints. */
#include "nh_cli.h"
#include "core/nh_util.h"
#include "dispatch/nh_bulk.h"
#include "store/nh_pg.h"
#include "store/nh_pg_ops.h"
#include "transport/nh_embedded.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NH_BULK_SHOW 10       /* events listed by --dry-run */

static void progress(int tty, long long done, long long total)
{
  if (!tty) return;
  fprintf(stderr, "\r  queued %lld of %lld (%d%%)", done, total, total ? (int)(done * 100 / total) : 100);
  fflush(stderr);
}

static int print_row(void *data, const nh_audit_t *a)
{
  (void)data;
  printf("  %s  %s  %s  %s  %s\n", a->event_id, a->endpoint, a->session_id, a->event_type ? a->event_type : "-",
         a->status);
  return 0;
}

static int dry_run(nh_bulk_t *b, const char *verb)
{
  const nh_bulk_result_t *r = nh_bulk_result(b);
  if (r->resumed)
    printf("an interrupted run of this command (started %lld s ago) is resumed by the next real run: counted as it "
           "would queue\n", (long long)((nh_time_now_ms() - r->resumed_started_ms) / 1000));
  printf("%lld event%s would be %s (dry run: nothing was queued)\n", r->total, r->total == 1 ? "" : "s", verb);
  int rc = nh_bulk_sample(b, NH_BULK_SHOW, print_row, NULL);
  if (r->total > NH_BULK_SHOW) printf("  ... and %lld more\n", r->total - NH_BULK_SHOW);
  return rc < 0 ? NH_EXIT_FAIL : NH_EXIT_OK;
}

/* The store's `hosts` rows (sqlite's s, or PostgreSQL's pg) say which endpoints no host
 * serves. */
static void report(const nh_bulk_result_t *r, nh_store_t *s, nh_pg_db_t *pg, const char *cmd, const char *store)
{
  printf("queued %lld %s request%s", r->queued, cmd, r->queued == 1 ? "" : "s");
  for (int i = 0; i < r->neps; i++) printf("%s %s (%lld)", i ? "," : " for", r->eps[i].name, r->eps[i].n);
  printf("; the hosts owning the endpoints apply them in session order\n");
  if (r->refused) printf("%lld not queued, for example: %s\n", r->refused, r->first_refusal);
  /* a host refreshes its row every 10 s: one silent for 30 s is gone */
  char *shown = pg ? nh_pg_url_display(store) : NULL;   /* the password masked */
  for (int i = 0; i < r->neps; i++)
    if ((pg ? nh_pgs_hosts_serving(pg, r->eps[i].name, nh_time_now_ms() - 30000)
            : nh_store_hosts_serving(s, r->eps[i].name, nh_time_now_ms() - 30000)) == 0)
      printf("note: no running host serves %s; its requests wait in the store until one starts "
             "(nimbus-host ADAPTER.lua --store %s)\n", r->eps[i].name, shown ? shown : store);
  free(shown);
}

/* Runs the whole bulk action; an exit code. */
static int run(nh_bulk_t *b, nh_store_t *s, nh_pg_db_t *pg, const char *cmd, const char *store)
{
  const nh_bulk_result_t *r = nh_bulk_result(b);
  if (r->resumed) {
    char at[40];
    nh_time_iso8601(r->resumed_started_ms, at, sizeof at);
    printf("resuming the run started at %s that did not finish (%lld requests queued then); events that changed "
           "since then are left out: run the command again afterwards for those\n", at, r->resumed_queued);
  }
  if (nh_bulk_start(b)) goto failed;
  int tty = isatty(2);
  progress(tty, 0, r->total);
  int more;
  while ((more = nh_bulk_step(b)) > 0) progress(tty, r->queued + r->refused, r->total);
  if (more < 0) goto failed;
  progress(tty, r->queued + r->refused, r->total);
  if (tty) fputc('\n', stderr);
  if (nh_bulk_finish(b)) goto failed;
  report(r, s, pg, cmd, store);
  return NH_EXIT_OK;
failed:
  fprintf(stderr, "\nnimbus-host %s: store: %s; the batches queued so far stay queued: run the same command again "
                  "to queue the rest\n", cmd, nh_bulk_errmsg(b));
  return NH_EXIT_FAIL;
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
  nh_pg_db_t *db = NULL;
  nh_transport_t *tr = NULL;
  int rc = NH_EXIT_OK;
  if (nh_pg_url_is(a->store)) {   /* the requests written through a blocking connection */
    if (!(db = nh_cli_pg_open(cmd, a->store, &rc))) return rc;
  } else if (nh_store_open(&s, a->store, 0, &err)) {
    fprintf(stderr, "nimbus-host %s: %s\n", cmd, err.msg);
    return err.code == NH_EFAIL ? NH_EXIT_FAIL : NH_EXIT_USAGE;
  }
  nh_event_filter_t f;
  char filters[512], key[600];
  char host[128] = "localhost", owner[200], emb_owner[64];
  if ((rc = db ? nh_cli_filter_parse_pg(a, cmd, db, &f) : nh_cli_filter_parse(a, cmd, s, &f))) goto done;
  nh_cli_filter_describe(&f, a, filters, sizeof filters);
  snprintf(key, sizeof key, "%s %s", cmd, filters);
  gethostname(host, sizeof host - 1);
  snprintf(owner, sizeof owner, "%s:%ld:bulk", host, (long)getpid());
  snprintf(emb_owner, sizeof emb_owner, "cli:%ld", (long)getpid());
  if (s && !(tr = nh_embedded_init(nh_store_db(s), emb_owner, &err))) {
    fprintf(stderr, "nimbus-host %s: %s\n", cmd, err.msg);
    rc = NH_EXIT_FAIL;
    goto done;
  }
  nh_bulk_opts_t o = { .kind = (nh_op_kind_t)kind, .force = nh_args_has(a, "--force"), .key = key, .owner = owner,
                       .actor = "cli (bulk)", .reason = nh_args_get(a, "--reason") };
  nh_bulk_t *b = db ? nh_bulk_new_pg(db, &f, &o) : nh_bulk_new(s, tr, &f, &o);
  if (nh_bulk_prepare(b, &err)) {
    fprintf(stderr, "nimbus-host %s: %s\n", cmd, err.msg);
    rc = NH_EXIT_FAIL;
  } else if (nh_args_has(a, "--dry-run")) {
    rc = dry_run(b, verb);
  } else if (nh_bulk_result(b)->total == 0) {
    printf("no events match %s (nothing to do)\n", filters);
    rc = nh_bulk_nothing(b) ? NH_EXIT_FAIL : NH_EXIT_OK;
    if (rc) fprintf(stderr, "nimbus-host %s: store: %s\n", cmd, nh_bulk_errmsg(b));
  } else {
    rc = run(b, s, db, cmd, a->store);
  }
  nh_bulk_free(b);
done:
  if (tr) tr->vt->close(tr);
  if (s) nh_store_close(s);
  if (db) nh_pg_db_free(db);
  return rc;
}
