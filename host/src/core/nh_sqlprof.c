/* NIMBUS_SQL_PROFILE (nh_sqlprof.h): a sqlite trace callback adds up, per statement text,
 * the runs and the time each run took; an atexit handler appends the table to the file. */
#include "nh_sqlprof.h"
#include "nh_util.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct prof_stmt {
  char *sql;
  long runs;
  int64_t ns;
} prof_stmt_t;

static prof_stmt_t *stmts;   /* process-wide: the table is written once, at exit */
static int nstmts, cap;
static const char *out_path;

/* Statements running now and when each started. sqlite's own profile time comes from the
 * VFS clock, in whole milliseconds: a 5 us statement then counts 0 or 1000 us, and one that
 * always starts just before a millisecond boundary (after a timer) looks 100 times dearer
 * than it is. A few statements are open at once (a cursor whose rows start others). */
typedef struct prof_open {
  sqlite3_stmt *stmt;
  int64_t t0;
} prof_open_t;
static prof_open_t open_stmts[32];
static int nopen;

static int64_t now_ns(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

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

static int on_trace(unsigned type, void *ctx, void *p, void *x)
{
  (void)ctx;
  sqlite3_stmt *stmt = p;
  int64_t now = now_ns();
  int o = 0;
  while (o < nopen && open_stmts[o].stmt != stmt) o++;
  if (type == SQLITE_TRACE_STMT) {
    /* also called again inside a running statement (triggers): keep the first start */
    if (o == nopen && nopen < (int)(sizeof open_stmts / sizeof *open_stmts))
      open_stmts[nopen++] = (prof_open_t){stmt, now};
    return 0;
  }
  int64_t ns = *(const int64_t *)x;   /* the coarse clock when the start was not seen */
  if (o < nopen) {
    ns = now - open_stmts[o].t0;
    open_stmts[o] = open_stmts[--nopen];
  }
  const char *sql = sqlite3_sql(stmt);
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
  stmts[i].ns += ns;
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
  if (out_path) sqlite3_trace_v2(db, SQLITE_TRACE_STMT | SQLITE_TRACE_PROFILE, on_trace, NULL);
}
