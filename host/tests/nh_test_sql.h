/* One-value sqlite queries for the C unit tests (include after nh_test.h, which it
 * uses for FAIL):
 *
 *   nh_test_q1i(db, "SELECT count(*) FROM queue WHERE endpoint = '%s'", ep)
 *   nh_test_q1s(db, "SELECT owner FROM session_locks")
 *
 * The SQL is a printf format (a literal % is %%). A statement that does not prepare
 * fails the test. */
#ifndef NH_TEST_SQL_H
#define NH_TEST_SQL_H

#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>

/* The first column of the first row as an integer; -1 when there is no row. */
NH_TEST_UNUSED __attribute__((format(printf, 2, 3))) static long long nh_test_q1i(sqlite3 *db, const char *fmt, ...)
{
  char sql[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(sql, sizeof sql, fmt, ap);
  va_end(ap);
  sqlite3_stmt *st;
  if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) FAIL("prepare %s: %s", sql, sqlite3_errmsg(db));
  long long v = -1;
  if (sqlite3_step(st) == SQLITE_ROW) v = sqlite3_column_int64(st, 0);
  sqlite3_finalize(st);
  return v;
}

/* The first column of the first row as text, in a static buffer; "" when there is no
 * row or the value is NULL. */
NH_TEST_UNUSED __attribute__((format(printf, 2, 3))) static const char *nh_test_q1s(sqlite3 *db, const char *fmt, ...)
{
  static char buf[2048];
  char sql[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(sql, sizeof sql, fmt, ap);
  va_end(ap);
  buf[0] = '\0';
  sqlite3_stmt *st;
  if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) FAIL("prepare %s: %s", sql, sqlite3_errmsg(db));
  if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_text(st, 0))
    snprintf(buf, sizeof buf, "%s", (const char *)sqlite3_column_text(st, 0));
  sqlite3_finalize(st);
  return buf;
}

#endif
