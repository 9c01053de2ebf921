/* sqlite helpers shared by the store and the embedded transport (they live in one file). */
#ifndef NH_SQLITE_H
#define NH_SQLITE_H

#include <sqlite3.h>
#include <stddef.h>
#include <stdint.h>

#include "nh_error.h"

/* Brings `component` to the latest of `n` migrations, each in its own transaction. */
int nh_sqlite_migrate(sqlite3 *db, const char *component, const char *const *migrations, int n,
                      nh_error_t *err);

/* Binding helpers: NULL strings bind as SQL NULL. */
void nh_sqlite_bind_text(sqlite3_stmt *st, int idx, const char *s);
/* The same without a copy: sqlite reads s when the statement is stepped, so s must live
 * until the statement is reset and its bindings cleared (nh_sqlite_step_done does both).
 * For the per-event statements, where the copies were 4% of the host's instructions. */
void nh_sqlite_bind_static(sqlite3_stmt *st, int idx, const char *s);
char *nh_sqlite_col_strdup(sqlite3_stmt *st, int col);   /* NULL for SQL NULL */
/* A column as a message body: its bytes as stored (sqlite3_column_bytes, so an embedded
 * NUL does not cut it) plus a trailing NUL; *len gets the length. NULL and 0 for SQL NULL.
 * Every place that turns a stored row into a body or payload reads it through this. */
char *nh_sqlite_col_body(sqlite3_stmt *st, int col, size_t *len);
int64_t nh_sqlite_col_i64(sqlite3_stmt *st, int col);

/* Gives sqlite a small-block allocator (sizes up to 1 KB recycled by size class, per
 * thread; larger blocks from malloc). Call before any other sqlite call; NH_OK, or
 * NH_EFAIL when sqlite was initialised already (it keeps its own allocator then). */
int nh_sqlite_use_pool(void);

/* Runs one reset-and-step of a write statement; returns 0 or NH_EFAIL (logged). */
int nh_sqlite_step_done(sqlite3 *db, sqlite3_stmt *st, const char *what);

#endif
