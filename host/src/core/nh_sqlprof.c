#include "nh_sqlprof.h"
#include "nh_util.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct prof_stmt {
  char *sql;
  long runs;
  int64_t ns;
} prof_stmt_t;

static prof_stmt_t *stmts;   /* process-wide: the table is written once, at exit */
static int nstmts, cap;
static const char *out_path;

static int by_time(const void *a, const void *b)
{
  const prof_stmt_t *x = a, *y = b;
  return x->ns < y->ns ? 1 : x->ns > y->ns ? -1 : 0;
}

static void dump(void)
{
  FILE *f = fopen(out_path, "a");
  if (!f) return;
  qsort(stmts, (size_t)nstmts, sizeof *stmts, by_time);
  int64_t total = 0;
  for (int i = 0; i < nstmts; i++) total += stmts[i].ns;
  fprintf(f, "# nimbus-host pid %ld: %d statements, %.1f ms in sqlite3_step\n# %10s %10s %8s  sql\n",
          (long)getpid(), nstmts, (double)total / 1e6, "runs", "ms", "us/run");
  for (int i = 0; i < nstmts; i++) {
    fprintf(f, "  %10ld %10.1f %8.2f  %.200s\n", stmts[i].runs, (double)stmts[i].ns / 1e6,
            (double)stmts[i].ns / 1e3 / (double)stmts[i].runs, stmts[i].sql);
    free(stmts[i].sql);
  }
  free(stmts);
  fclose(f);
}

static int on_profile(unsigned type, void *ctx, void *p, void *x)
{
  (void)type;
  (void)ctx;
  const char *sql = sqlite3_sql((sqlite3_stmt *)p);
  if (!sql) return 0;
  int i = 0;
  while (i < nstmts && strcmp(stmts[i].sql, sql) != 0) i++;   /* a few dozen statements */
  if (i == nstmts) {
    if (nstmts == cap) {
      cap = cap ? cap * 2 : 64;
      stmts = nh_xrealloc(stmts, sizeof *stmts * (size_t)cap);
    }
    stmts[nstmts++] = (prof_stmt_t){nh_xstrdup(sql), 0, 0};
  }
  stmts[i].runs++;
  stmts[i].ns += *(const int64_t *)x;
  return 0;
}

void nh_sqlprof_attach(sqlite3 *db)
{
  static int checked;
  if (!checked) {
    checked = 1;
    out_path = getenv("NIMBUS_SQL_PROFILE");
    if (out_path && *out_path) atexit(dump);
    else out_path = NULL;
  }
  if (out_path) sqlite3_trace_v2(db, SQLITE_TRACE_PROFILE, on_profile, NULL);
}
