/* sqlite helpers (nh_sqlite.h): per-component schema migrations (table nh_schema, one
 * transaction per step), NULL-aware text binding, column copies, and a step-and-reset
 * that logs a failure. */
#include "nh_sqlite.h"
#include "nh_log.h"
#include "nh_util.h"

#include <stdlib.h>
#include <string.h>

static int exec_simple(sqlite3 *db, const char *sql, nh_error_t *err)
{
  char *emsg = NULL;
  if (sqlite3_exec(db, sql, NULL, NULL, &emsg) != SQLITE_OK) {
    nh_error_set(err, NH_EFAIL, "%s", emsg ? emsg : sqlite3_errmsg(db));
    sqlite3_free(emsg);
    return NH_EFAIL;
  }
  return NH_OK;
}

int nh_sqlite_migrate(sqlite3 *db, const char *component, const char *const *migrations, int n,
                      nh_error_t *err)
{
  if (exec_simple(db, "CREATE TABLE IF NOT EXISTS nh_schema (component TEXT PRIMARY KEY, version INTEGER NOT NULL)",
                  err))
    return NH_EFAIL;
  for (;;) {
    if (exec_simple(db, "BEGIN IMMEDIATE", err)) return NH_EFAIL;
    sqlite3_stmt *st = NULL;
    int version = 0;
    if (sqlite3_prepare_v2(db, "SELECT version FROM nh_schema WHERE component = ?", -1, &st, NULL) != SQLITE_OK)
      goto fail_db;
    nh_sqlite_bind_text(st, 1, component);
    if (sqlite3_step(st) == SQLITE_ROW) version = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    st = NULL;
    if (version > n) {
      exec_simple(db, "ROLLBACK", NULL);
      return nh_error_set(err, NH_EFAIL,
                          "the store's %s schema is version %d, newer than this nimbus-host knows (%d): "
                          "upgrade nimbus-host or use another --store",
                          component, version, n);
    }
    if (version == n) return exec_simple(db, "COMMIT", err);
    if (exec_simple(db, migrations[version], err)) {
      exec_simple(db, "ROLLBACK", NULL);
      return NH_EFAIL;
    }
    if (sqlite3_prepare_v2(db, "INSERT OR REPLACE INTO nh_schema(component, version) VALUES (?, ?)", -1, &st,
                           NULL) != SQLITE_OK)
      goto fail_db;
    nh_sqlite_bind_text(st, 1, component);
    sqlite3_bind_int(st, 2, version + 1);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) goto fail_db;
    if (exec_simple(db, "COMMIT", err)) return NH_EFAIL;
    continue;
  fail_db:
    nh_error_set(err, NH_EFAIL, "%s", sqlite3_errmsg(db));
    exec_simple(db, "ROLLBACK", NULL);
    return NH_EFAIL;
  }
}

void nh_sqlite_bind_text(sqlite3_stmt *st, int idx, const char *s)
{
  if (s) sqlite3_bind_text(st, idx, s, -1, SQLITE_TRANSIENT);
  else sqlite3_bind_null(st, idx);
}

void nh_sqlite_bind_static(sqlite3_stmt *st, int idx, const char *s)
{
  if (s) sqlite3_bind_text(st, idx, s, -1, SQLITE_STATIC);
  else sqlite3_bind_null(st, idx);
}

char *nh_sqlite_col_strdup(sqlite3_stmt *st, int col)
{
  if (sqlite3_column_type(st, col) == SQLITE_NULL) return NULL;
  const unsigned char *t = sqlite3_column_text(st, col);
  return nh_xstrndup((const char *)t, (size_t)sqlite3_column_bytes(st, col));
}

char *nh_sqlite_col_body(sqlite3_stmt *st, int col, size_t *len)
{
  *len = 0;
  if (sqlite3_column_type(st, col) == SQLITE_NULL) return NULL;
  const unsigned char *t = sqlite3_column_text(st, col);   /* text first, then its byte count */
  size_t n = (size_t)sqlite3_column_bytes(st, col);
  char *d = nh_xmalloc(n + 1);
  if (t && n) memcpy(d, t, n);
  else n = 0;
  d[n] = '\0';
  *len = n;
  return d;
}

int64_t nh_sqlite_col_i64(sqlite3_stmt *st, int col) { return sqlite3_column_int64(st, col); }

int nh_sqlite_step_done(sqlite3 *db, sqlite3_stmt *st, const char *what)
{
  int rc = sqlite3_step(st);
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  if (rc != SQLITE_DONE && rc != SQLITE_ROW) {
    nh_log_error("store", "%s: %s", what, sqlite3_errmsg(db));
    return NH_EFAIL;
  }
  return NH_OK;
}
