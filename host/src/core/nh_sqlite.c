/* sqlite helpers (nh_sqlite.h): per-component schema migrations (table nh_schema, one
 * transaction per step), NULL-aware text binding, column copies, and a step-and-reset
 * that logs a failure. */
#include "nh_sqlite.h"
#include "nh_log.h"
#include "nh_util.h"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- allocator */

/* sqlite allocates and frees about 50 small blocks per event (cursors, record buffers,
 * statement scratch beyond the connection's lookaside), each through malloc and free:
 * 10,000 instructions per event of the e2e bench, 6,400 fewer with this pool (a bigger
 * lookaside did not help: the blocks are mostly larger than its slots). Here a block of up to 1 KB is taken
 * from a free list of its 16-byte size class and put back on it; sqlite asks for a
 * block's size (xSize), so each carries a 16-byte header with its size, which also keeps
 * the blocks 16-byte aligned. The lists are per thread (the loop thread and the
 * checkpointer's worker each use a connection of their own; a block freed on another
 * thread simply joins that thread's list: blocks of one class are interchangeable).
 * Slabs are never given back: each thread's pool stays at the most small blocks it held
 * at once. Under
 * AddressSanitizer sqlite keeps malloc, so the fuzz builds see each use after free. */
#define POOL_MAX 1024
#define POOL_CLASSES (POOL_MAX / 16)
#define POOL_SLAB (64 * 1024)
#define POOL_HEAD 16

typedef struct {
  void *free[POOL_CLASSES];
  char *bump;
  size_t left;
} pool_t;

static _Thread_local pool_t pool;

static size_t *head_of(void *p) { return (size_t *)((char *)p - POOL_HEAD); }

static void *pool_malloc(int n)
{
  if (n <= 0) return NULL;
  size_t size = ((size_t)n + 15) & ~(size_t)15;
  if (size > POOL_MAX) {
    size_t *h = malloc(POOL_HEAD + size);
    if (!h) return NULL;
    *h = size;
    return (char *)h + POOL_HEAD;
  }
  size_t c = size / 16 - 1;
  char *b = pool.free[c];
  if (b) {
    pool.free[c] = *(void **)b;
    return b;
  }
  if (pool.left < POOL_HEAD + size) {
    char *slab = malloc(POOL_SLAB);   /* the old slab's tail (under POOL_MAX) stays unused */
    if (!slab) return NULL;
    pool.bump = slab;
    pool.left = POOL_SLAB;
  }
  b = pool.bump + POOL_HEAD;
  *head_of(b) = size;
  pool.bump += POOL_HEAD + size;
  pool.left -= POOL_HEAD + size;
  return b;
}

static void pool_free(void *p)
{
  if (!p) return;
  size_t size = *head_of(p);
  if (size > POOL_MAX) {
    free(head_of(p));
    return;
  }
  size_t c = size / 16 - 1;
  *(void **)p = pool.free[c];
  pool.free[c] = p;
}

static int pool_size(void *p) { return p ? (int)*head_of(p) : 0; }

static void *pool_realloc(void *p, int n)
{
  if (!p) return pool_malloc(n);
  size_t old = *head_of(p), size = ((size_t)n + 15) & ~(size_t)15;
  if (old == size) return p;
  if (old > POOL_MAX && size > POOL_MAX) {
    size_t *h = realloc(head_of(p), POOL_HEAD + size);
    if (!h) return NULL;
    *h = size;
    return (char *)h + POOL_HEAD;
  }
  void *b = pool_malloc(n);
  if (!b) return NULL;
  memcpy(b, p, old < size ? old : size);
  pool_free(p);
  return b;
}

static int pool_roundup(int n) { return (n + 15) & ~15; }
static int pool_init(void *data) { (void)data; return SQLITE_OK; }
static void pool_shutdown(void *data) { (void)data; }

int nh_sqlite_use_pool(void)
{
  static const sqlite3_mem_methods m = { pool_malloc, pool_free, pool_realloc, pool_size, pool_roundup,
                                         pool_init, pool_shutdown, NULL };
  if (NH_ASAN) return NH_OK;
  return sqlite3_config(SQLITE_CONFIG_MALLOC, &m) == SQLITE_OK ? NH_OK : NH_EFAIL;
}

/* ---------------------------------------------------------------- helpers */

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
