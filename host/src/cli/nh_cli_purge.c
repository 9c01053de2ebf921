/* `nimbus-host purge`: retention by hand. Deletes resolved events (Completed, Skipped,
 * Unsupported) last changed before a time, with their history, and old inbox entries,
 * in small transactions (a running host keeps working between them); never an
 * unresolved event. The freed pages are given back (stores created with incremental
 * vacuum) or reused (older stores). */
#include "nh_cli.h"
#include "core/nh_util.h"

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

  nh_error_t err = {0};
  nh_store_t *s = NULL;
  if (nh_store_open(&s, a.store, 0, &err)) {
    fprintf(stderr, "nimbus-host purge: %s\n", err.msg);
    return err.code == NH_EFAIL ? NH_EXIT_FAIL : NH_EXIT_USAGE;
  }
  nh_purge_counts_t c = { 0 };
  if (nh_args_has(&a, "--dry-run")) {
    rc = nh_store_purge_count(s, resolved, inbox, &c);
    if (rc == NH_OK)
      printf("%lld resolved events and %lld inbox entries would be deleted (dry run: nothing was deleted)\n",
             (long long)c.events, (long long)c.inbox);
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
      fprintf(stderr, "nimbus-host purge: store: %s; what was deleted so far stays deleted, run it again for the "
                      "rest\n", nh_store_errmsg(s));
      nh_store_close(s);
      return NH_EXIT_FAIL;
    }
    nh_store_vacuum_step(s, 8192);
    if (n == 0) break;
  }
  if (!rb) c.events = c.history = 0;
  nh_store_checkpoint(s);
  printf("deleted %lld resolved events (%lld history rows), %lld inbox and %lld processed entries; store %.1f MB "
         "(was %.1f MB)\n", (long long)c.events, (long long)c.history, (long long)c.inbox, (long long)c.processed,
         file_mb(a.store), before_mb);
  nh_store_close(s);
  return NH_EXIT_OK;
}
