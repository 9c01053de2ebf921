/* `nimbus-host purge`: retention by hand. Deletes resolved events (Completed, Skipped,
 * Unsupported) last changed before a time, with their history, and old inbox entries,
 * in small transactions (a running host keeps working between them); never an
 * unresolved event. On sqlite the freed pages are given back (stores created with
 * incremental vacuum) or reused (older stores); on PostgreSQL the same deletes as the
 * hosts' retention run on a blocking connection, and the space is PostgreSQL's to reuse
 * (autovacuum). */
#include "nh_cli.h"
#include "core/nh_util.h"
#include "store/nh_pg.h"
#include "store/nh_pg_ops.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#define NH_PURGE_BATCH 2000

static int parse_before(const char *opt, const char *v, int64_t now, int64_t *out)
{
  if (!v) return NH_EXIT_OK;
  if (!strchr(v, '-') && nh_duration_parse_ms(v) == 0)
    return nh_usage_error("purge", "%s %s would delete every resolved event up to this moment; give an age of 1s or "
                                   "more (7d, 12h, 30m)", opt, v);
  int64_t t = nh_time_parse_ms(v, now);
  if (t < 0)
    return nh_usage_error("purge", "%s %s is not a time: give an age (7d, 12h, 30m) or ISO-8601 UTC "
                                   "(2026-12-01T00:00:00Z)", opt, v);
  if (t > now) return nh_usage_error("purge", "%s %s is in the future", opt, v);
  *out = t;
  return NH_EXIT_OK;
}

static double file_mb(const char *path)
{
  struct stat st;
  char wal[4200];
  double mb = stat(path, &st) == 0 ? (double)st.st_size : 0;
  snprintf(wal, sizeof wal, "%s-wal", path);
  if (stat(wal, &st) == 0) mb += (double)st.st_size;
  return mb / (1024.0 * 1024.0);
}

static void said_dry_run(const nh_purge_counts_t *c)
{
  printf("%lld resolved events and %lld inbox entries would be deleted (dry run: nothing was deleted)\n",
         (long long)c->events, (long long)c->inbox);
}

/* One sentence for both stores (scripts read "deleted N resolved events"); mb < 0: the
 * size could not be read, the rows are said alone. */
static void said_deleted(const nh_purge_counts_t *c, double mb, double before_mb)
{
  printf("deleted %lld resolved events (%lld history rows), %lld inbox and %lld processed entries",
         (long long)c->events, (long long)c->history, (long long)c->inbox, (long long)c->processed);
  if (mb >= 0 && before_mb >= 0) printf("; store %.1f MB (was %.1f MB)", mb, before_mb);
  printf("\n");
}

/* A batch failed: the ones before it were committed, each its own transaction. */
static void said_failed(const char *prefix, const char *why)
{
  fprintf(stderr, "nimbus-host purge: %s%s; what was deleted so far stays deleted, run it again for the rest\n",
          prefix, why);
}

static double pg_mb(nh_pg_db_t *db)
{
  int64_t n = nh_pgs_database_bytes(db);
  return n < 0 ? -1 : (double)n / (1024.0 * 1024.0);
}

/* On PostgreSQL: each batch its own transaction, committed before the next, so hosts
 * serving the store wait for none of it for long; rows a host's retention is deleting at
 * the same time are skipped, not waited for (the statements' SKIP LOCKED). */
static int purge_pg(const char *url, int64_t resolved, int64_t inbox, int dry)
{
  int rc = NH_EXIT_OK;
  nh_pg_db_t *db = nh_cli_pg_open("purge", url, &rc);
  if (!db) return rc;
  nh_error_t err = {0};
  nh_purge_counts_t c = { 0 };
  if (dry) {
    if (nh_pgs_purge_count(db, resolved, inbox, &c, &err) == NH_OK) said_dry_run(&c);
    else fprintf(stderr, "nimbus-host purge: %s\n", err.msg);
    nh_pg_db_free(db);
    return err.code ? NH_EXIT_FAIL : NH_EXIT_OK;
  }
  double before_mb = pg_mb(db);
  int n;
  while ((n = nh_pgs_purge(db, resolved, inbox, NH_PURGE_BATCH, &c, &err)) > 0) {}
  if (n < 0) said_failed("", err.msg);   /* the message names the store (password masked) */
  else said_deleted(&c, pg_mb(db), before_mb);
  nh_pg_db_free(db);
  return n < 0 ? NH_EXIT_FAIL : NH_EXIT_OK;
}

int nh_cmd_purge(int argc, char **argv)
{
  static const nh_opt_spec_t specs[] = { { "--resolved-before", 1 }, { "--inbox-before", 1 }, { "--dry-run", 0 },
                                         { NULL, 0 } };
  nh_args_t a;
  int rc = nh_args_parse(&a, "purge", argc, argv, 2, specs);
  if (rc) return rc;
  if (a.npos) return nh_usage_error("purge", "unexpected argument %s", a.pos[0]);
  const char *rb = nh_args_get(&a, "--resolved-before"), *ib = nh_args_get(&a, "--inbox-before");
  if (!rb && !ib) return nh_usage_error("purge", "say what to delete: --resolved-before AGE (and/or --inbox-before AGE)");
  int64_t now = nh_time_now_ms(), resolved = 0, inbox = 0;
  if ((rc = parse_before("--resolved-before", rb, now, &resolved)) || (rc = parse_before("--inbox-before", ib, now, &inbox)))
    return rc;

  if (nh_pg_url_is(a.store)) return purge_pg(a.store, resolved, inbox, nh_args_has(&a, "--dry-run"));

  nh_error_t err = {0};
  nh_store_t *s = NULL;
  if (nh_store_open(&s, a.store, 0, &err)) {
    fprintf(stderr, "nimbus-host purge: %s\n", err.msg);
    return err.code == NH_EFAIL ? NH_EXIT_FAIL : NH_EXIT_USAGE;
  }
  nh_purge_counts_t c = { 0 };
  if (nh_args_has(&a, "--dry-run")) {
    rc = nh_store_purge_count(s, resolved, inbox, &c);
    if (rc == NH_OK) said_dry_run(&c);
    else fprintf(stderr, "nimbus-host purge: store: %s\n", nh_store_errmsg(s));
    nh_store_close(s);
    return rc == NH_OK ? NH_EXIT_OK : NH_EXIT_FAIL;
  }
  double before_mb = file_mb(a.store);
  for (;;) {
    if (nh_store_begin(s)) break;
    int n = nh_store_purge(s, resolved, inbox, NH_PURGE_BATCH, &c);
    if (n < 0 || nh_store_commit(s)) {
      nh_store_rollback(s);
      said_failed("store: ", nh_store_errmsg(s));
      nh_store_close(s);
      return NH_EXIT_FAIL;
    }
    nh_store_vacuum_step(s, 8192);
    if (n == 0) break;
  }
  if (!rb) c.events = c.history = 0;
  nh_store_checkpoint(s);
  said_deleted(&c, file_mb(a.store), before_mb);
  nh_store_close(s);
  return NH_EXIT_OK;
}
