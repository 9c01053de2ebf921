/* nimbus.sqlite.core: adapter-owned sqlite databases (the Lua face is lua/nimbus/sqlite.lua).
 *
 * Every call runs synchronously on the loop thread. That is acceptable because the calls
 * are meant to be short (an indexed lookup, a few inserts: micro- to milliseconds, much
 * less than handing the work to a thread and back would cost), and it buys a strong
 * property: no statement and no transaction ever spans a loop iteration, so two tasks of
 * one process never interleave inside a transaction and never contend for a lock. The
 * price is that a long query, or a wait for another process's write lock (up to
 * busy_timeout), blocks the whole loop; adapters keep queries small and indexed.
 *
 * db:tx runs fn through lua_pcall for the same reason: fn is not yieldable, so a host
 * call that waits (nimbus.sleep, nimbus.http...) raises inside a transaction instead of
 * holding the write lock across the loop.
 *
 * Errors follow luv: SQL failures (syntax, constraints, busy, I/O) return
 * `nil, "sqlite: <msg> (in: <sql>)", "SQLITE_<CODE>"`; misuse (bad argument types, a
 * wrong parameter count, two statements in one string, a closed db) raises. */
#include "nh_lmodules.h"
#include "nh_lasync.h"
#include "nh_vm_int.h"

#include <lauxlib.h>
#include <sqlite3.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define DB_MT "nimbus.sqlite.db"
#define GUARD_MT "nimbus.sqlite.guard"
#define BLOB_MT "nimbus.sqlite.blob"

#define CACHE_SIZE 32     /* prepared statements kept per db, least recently used evicted */
#define MAX_ACTIVE 8      /* statements running at once on one db (re-entry from __gc) */
#define SQL_SNIPPET 80    /* bytes of SQL quoted in error messages */

typedef struct cached {
  char *sql;              /* NULL: free slot */
  size_t len;
  uint64_t hash;
  sqlite3_stmt *st;
  uint64_t used;          /* LRU clock */
  int busy;               /* running right now: a re-entrant call must not share it */
} cached_t;

typedef struct active {
  sqlite3_stmt *st;
  int slot;               /* cache slot, or -1 for a one-off statement */
} active_t;

typedef struct ldb {
  sqlite3 *db;            /* NULL once closed */
  int in_tx;
  int depth;              /* entries used in act[] */
  uint64_t clock;
  active_t act[MAX_ACTIVE];
  cached_t cache[CACHE_SIZE];
} ldb_t;

/* ---------------------------------------------------------------- errors */

static const char *code_name(int rc)
{
#define C(x) case SQLITE_##x: return "SQLITE_" #x;
  switch (rc & 0xff) {
    C(OK) C(ERROR) C(INTERNAL) C(PERM) C(ABORT) C(BUSY) C(LOCKED) C(NOMEM) C(READONLY)
    C(INTERRUPT) C(IOERR) C(CORRUPT) C(NOTFOUND) C(FULL) C(CANTOPEN) C(PROTOCOL) C(EMPTY)
    C(SCHEMA) C(TOOBIG) C(CONSTRAINT) C(MISMATCH) C(MISUSE) C(NOLFS) C(AUTH) C(FORMAT)
    C(RANGE) C(NOTADB) C(NOTICE) C(WARNING) C(ROW) C(DONE)
  }
#undef C
  return "SQLITE_ERROR";
}

static int is_blank(const char *s, size_t len)
{
  for (size_t i = 0; i < len; i++)
    if (s[i] != ' ' && s[i] != '\t' && s[i] != '\n' && s[i] != '\r') return 0;
  return 1;
}

/* The SQL quoted in messages: whitespace runs folded to one space (multi-line SQL stays
 * on one log line), cut at SQL_SNIPPET bytes without splitting a UTF-8 sequence. */
static void push_snippet(lua_State *L, const char *sql, size_t len)
{
  char out[SQL_SNIPPET + 4];
  size_t n = 0, i = 0;
  int space = 0;
  while (i < len && (sql[i] == ' ' || sql[i] == '\t' || sql[i] == '\n' || sql[i] == '\r')) i++;
  for (; i < len && n < SQL_SNIPPET; i++) {
    char c = sql[i];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      space = 1;
      continue;
    }
    if (space && n < SQL_SNIPPET - 1) out[n++] = ' ';
    space = 0;
    out[n++] = c;
  }
  if (i < len && !is_blank(sql + i, len - i)) {
    /* drop a multi-byte sequence the cut left incomplete */
    size_t lead = n;
    while (lead > 0 && ((unsigned char)out[lead - 1] & 0xC0) == 0x80) lead--;
    if (lead > 0 && ((unsigned char)out[lead - 1] & 0xC0) == 0xC0) {
      unsigned char b = (unsigned char)out[lead - 1];
      size_t need = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
      if (n - (lead - 1) < need) n = lead - 1;
    }
    memcpy(out + n, "...", 3);
    n += 3;
  }
  lua_pushlstring(L, out, n);
}

/* Pushes nil and the message; the caller releases the statement, then pushes the code. */
static void push_sql_error(lua_State *L, ldb_t *d, const char *sql, size_t len)
{
  lua_pushnil(L);
  lua_pushfstring(L, "sqlite: %s (in: ", sqlite3_errmsg(d->db));
  push_snippet(L, sql, len);
  lua_pushliteral(L, ")");
  lua_concat(L, 3);
}

static int return_sql_error(lua_State *L, ldb_t *d, int rc, const char *sql, size_t len)
{
  push_sql_error(L, d, sql, len);
  lua_pushstring(L, code_name(rc));
  return 3;
}

/* ---------------------------------------------------------------- statements */

static uint64_t sql_hash(const char *s, size_t len)
{
  uint64_t h = 1469598103934665603ull;   /* FNV-1a */
  for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
  return h;
}

static ldb_t *check_open(lua_State *L, const char *method)
{
  ldb_t *d = luaL_checkudata(L, 1, DB_MT);
  if (!d->db) luaL_error(L, "nimbus.sqlite: db:%s on a closed database", method);
  return d;
}

/* Prepares sql, refusing an empty string and trailing statements. A tail is accepted only
 * if sqlite finds nothing in it (whitespace, comments, semicolons). */
static int prepare(lua_State *L, ldb_t *d, const char *sql, size_t len, unsigned flags,
                   sqlite3_stmt **out, const char *method)
{
  /* sqlite stops reading at a zero byte: whatever follows would be silently ignored */
  if (memchr(sql, 0, len)) luaL_error(L, "nimbus.sqlite: db:%s: the SQL text contains a zero byte", method);
  const char *tail = NULL;
  /* len + 1: Lua strings end in a zero, which spares sqlite a terminated copy */
  int rc = sqlite3_prepare_v3(d->db, sql, (int)len + 1, flags, out, &tail);
  if (rc != SQLITE_OK) return rc;
  if (!*out) luaL_error(L, "nimbus.sqlite: db:%s: no SQL statement (the string is empty or only comments)", method);
  size_t rest = tail && tail < sql + len ? len - (size_t)(tail - sql) : 0;
  if (rest && !is_blank(tail, rest)) {
    sqlite3_stmt *next = NULL;
    int rc2 = sqlite3_prepare_v2(d->db, tail, (int)rest, &next, NULL);
    sqlite3_finalize(next);
    if (rc2 != SQLITE_OK || next) {
      sqlite3_finalize(*out);
      *out = NULL;
      push_snippet(L, tail, rest);
      luaL_error(L, "nimbus.sqlite: db:%s: one statement per call (more SQL follows the first "
                    "statement: %s)", method, lua_tostring(L, -1));
    }
  }
  return SQLITE_OK;
}

/* Finds or prepares the statement for sql and pushes the db's guard as a to-be-closed
 * slot: however the caller leaves (return, error, memory error while building rows), the
 * guard resets the statement, so no half-run statement keeps a read snapshot open. The
 * caller may release early with lua_closeslot. Returns an sqlite code; on an error
 * nothing is pushed. */
static int acquire(lua_State *L, ldb_t *d, const char *sql, size_t len, sqlite3_stmt **out,
                   const char *method)
{
  if (len >= 0x7fffffff) luaL_error(L, "nimbus.sqlite: db:%s: SQL text too long", method);
  if (d->depth >= MAX_ACTIVE) luaL_error(L, "nimbus.sqlite: db:%s: too many nested statements", method);
  luaL_checkstack(L, 8, NULL);
  uint64_t h = sql_hash(sql, len);
  int slot = -1, free_slot = -1, lru = -1;
  for (int i = 0; i < CACHE_SIZE; i++) {
    cached_t *c = &d->cache[i];
    if (!c->sql) {
      if (free_slot < 0) free_slot = i;
      continue;
    }
    if (c->hash == h && c->len == len && memcmp(c->sql, sql, len) == 0) {
      slot = i;
      break;
    }
    if (!c->busy && (lru < 0 || c->used < d->cache[lru].used)) lru = i;
  }
  sqlite3_stmt *st;
  if (slot >= 0 && !d->cache[slot].busy) {
    st = d->cache[slot].st;
  } else if (slot >= 0) {   /* re-entered with the same SQL: a one-off copy */
    int rc = prepare(L, d, sql, len, 0, &st, method);
    if (rc != SQLITE_OK) return rc;
    slot = -1;
  } else {
    int rc = prepare(L, d, sql, len, SQLITE_PREPARE_PERSISTENT, &st, method);
    if (rc != SQLITE_OK) return rc;
    slot = free_slot >= 0 ? free_slot : lru;   /* depth < CACHE_SIZE: one is not busy */
    cached_t *c = &d->cache[slot];
    char *copy = malloc(len + 1);
    if (!copy) {
      sqlite3_finalize(st);
      luaL_error(L, "nimbus.sqlite: out of memory");
    }
    if (c->sql) {
      sqlite3_finalize(c->st);
      free(c->sql);
    }
    memcpy(copy, sql, len);
    copy[len] = '\0';
    *c = (cached_t){ .sql = copy, .len = len, .hash = h, .st = st };
  }
  if (slot >= 0) {
    d->cache[slot].busy = 1;
    d->cache[slot].used = ++d->clock;
  }
  d->act[d->depth++] = (active_t){ st, slot };
  lua_getiuservalue(L, 1, 1);   /* the guard */
  lua_toclose(L, -1);
  *out = st;
  return SQLITE_OK;
}

/* __close of the guard: releases the innermost running statement (closes run LIFO). */
static int guard_close(lua_State *L)
{
  ldb_t *d = *(ldb_t **)lua_touserdata(L, 1);
  if (d->depth == 0) return 0;
  active_t *a = &d->act[--d->depth];
  sqlite3_reset(a->st);
  sqlite3_clear_bindings(a->st);
  if (a->slot >= 0) d->cache[a->slot].busy = 0;
  else sqlite3_finalize(a->st);
  return 0;
}

/* ---------------------------------------------------------------- binding */

/* Binds the value at idx to parameter i; method and name (NULL: positional) word errors. */
static void bind_value(lua_State *L, ldb_t *d, sqlite3_stmt *st, int i, int idx, const char *method,
                       const char *name)
{
  int rc;
  switch (lua_type(L, idx)) {
  case LUA_TNIL:
    rc = sqlite3_bind_null(st, i);
    break;
  case LUA_TBOOLEAN:
    rc = sqlite3_bind_int(st, i, lua_toboolean(L, idx));
    break;
  case LUA_TNUMBER:
    if (lua_isinteger(L, idx)) rc = sqlite3_bind_int64(st, i, (sqlite3_int64)lua_tointeger(L, idx));
    else rc = sqlite3_bind_double(st, i, (double)lua_tonumber(L, idx));
    break;
  case LUA_TSTRING: {
    size_t len;
    const char *s = lua_tolstring(L, idx, &len);
    /* text with an embedded zero would be cut by every sqlite text function: keep its bytes */
    if (memchr(s, 0, len)) rc = sqlite3_bind_blob64(st, i, s, len, SQLITE_TRANSIENT);
    else rc = sqlite3_bind_text64(st, i, s, len, SQLITE_TRANSIENT, SQLITE_UTF8);
    break;
  }
  case LUA_TUSERDATA:
    if (luaL_testudata(L, idx, BLOB_MT)) {
      size_t len;
      lua_getiuservalue(L, idx, 1);
      const char *s = lua_tolstring(L, -1, &len);
      rc = sqlite3_bind_blob64(st, i, s, len, SQLITE_TRANSIENT);
      lua_pop(L, 1);
      break;
    }
    /* fallthrough */
  default:
    if (!name) name = lua_pushfstring(L, "%d", i);
    luaL_error(L, "nimbus.sqlite: db:%s: parameter %s: cannot bind a %s value (bind nil, booleans, "
                  "numbers, strings or nimbus.sqlite.blob(s))", method, name, luaL_typename(L, idx));
    return;
  }
  if (rc != SQLITE_OK && !name) name = lua_pushfstring(L, "%d", i);
  if (rc != SQLITE_OK) luaL_error(L, "nimbus.sqlite: db:%s: parameter %s: %s", method, name, sqlite3_errmsg(d->db));
}

/* Arguments from `first` on: either one value per parameter, or a single table whose
 * fields bind :name/@name/$name parameters and whose array part binds ? and ?NNN. */
static void bind_args(lua_State *L, ldb_t *d, sqlite3_stmt *st, int first, int nargs, const char *method)
{
  int nparams = sqlite3_bind_parameter_count(st);
  if (nargs == 1 && lua_type(L, first) == LUA_TTABLE) {
    int guard = lua_gettop(L);
    for (int i = 1; i <= nparams; i++) {
      const char *name = sqlite3_bind_parameter_name(st, i);
      if (name && name[0] != '?') lua_getfield(L, first, name + 1);
      else lua_geti(L, first, i);   /* a missing field binds NULL: tables cannot hold nil */
      int v = lua_gettop(L);
      bind_value(L, d, st, i, v, method, name);
      lua_settop(L, guard);
    }
    return;
  }
  if (nargs != nparams)
    luaL_error(L, "nimbus.sqlite: db:%s: the statement has %d parameter%s, got %d value%s%s", method, nparams,
               nparams == 1 ? "" : "s", nargs, nargs == 1 ? "" : "s",
               nparams > 0 && nargs == 0 ? " (pass one value per ?, or a table for :name parameters)" : "");
  for (int i = 1; i <= nargs; i++) bind_value(L, d, st, i, first + i - 1, method, NULL);
}

/* ---------------------------------------------------------------- rows */

static void push_names(lua_State *L, sqlite3_stmt *st, int ncol)
{
  luaL_checkstack(L, ncol + 4, "too many result columns");
  for (int c = 0; c < ncol; c++) {
    const char *name = sqlite3_column_name(st, c);
    if (!name) luaL_error(L, "nimbus.sqlite: out of memory");
    lua_pushstring(L, name);
  }
}

/* A row as a table keyed by column name; NULL columns are absent. */
static void push_row(lua_State *L, sqlite3_stmt *st, int ncol, int names)
{
  lua_createtable(L, 0, ncol);
  for (int c = 0; c < ncol; c++) {
    switch (sqlite3_column_type(st, c)) {
    case SQLITE_NULL:
      continue;
    case SQLITE_INTEGER:
      lua_pushinteger(L, (lua_Integer)sqlite3_column_int64(st, c));
      break;
    case SQLITE_FLOAT:
      lua_pushnumber(L, (lua_Number)sqlite3_column_double(st, c));
      break;
    case SQLITE_BLOB: {
      const void *p = sqlite3_column_blob(st, c);
      lua_pushlstring(L, p ? p : "", (size_t)sqlite3_column_bytes(st, c));
      break;
    }
    default: {
      const unsigned char *p = sqlite3_column_text(st, c);
      lua_pushlstring(L, p ? (const char *)p : "", (size_t)sqlite3_column_bytes(st, c));
      break;
    }
    }
    lua_pushvalue(L, names + c);
    lua_insert(L, -2);
    lua_rawset(L, -3);
  }
}

/* ---------------------------------------------------------------- methods */

/* The common start of exec/rows/first: the open db, its SQL, a prepared statement with
 * its arguments bound, and the guard slot that resets it however the call ends. Non-zero
 * (with c->nret results pushed) when the SQL does not prepare. */
typedef struct call {
  ldb_t *d;
  const char *sql;
  size_t len;
  sqlite3_stmt *st;
  int guard, nret;
} call_t;

static int call_begin(lua_State *L, call_t *c, const char *what)
{
  c->d = check_open(L, what);
  c->sql = luaL_checklstring(L, 2, &c->len);
  int nargs = lua_gettop(L) - 2;
  int rc = acquire(L, c->d, c->sql, c->len, &c->st, what);
  if (rc != SQLITE_OK) {
    c->nret = return_sql_error(L, c->d, rc, c->sql, c->len);
    return 1;
  }
  c->guard = lua_gettop(L);
  bind_args(L, c->d, c->st, 3, nargs, what);
  return 0;
}

static int l_exec(lua_State *L)
{
  call_t c;
  if (call_begin(L, &c, "exec")) return c.nret;
  ldb_t *d = c.d;
  const char *sql = c.sql;
  size_t len = c.len;
  sqlite3_stmt *st = c.st;
  int guard = c.guard, rc;
  sqlite3_int64 before = sqlite3_total_changes64(d->db);
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {}
  if (rc != SQLITE_DONE) {
    push_sql_error(L, d, sql, len);
    lua_closeslot(L, guard);
    lua_pushstring(L, code_name(rc));
    return 3;
  }
  /* sqlite3_changes keeps the last INSERT/UPDATE/DELETE's count across other statements
   * (CREATE, SELECT): report it only if this statement changed rows. */
  sqlite3_int64 changes = sqlite3_total_changes64(d->db) != before ? sqlite3_changes64(d->db) : 0;
  lua_closeslot(L, guard);
  lua_pushinteger(L, (lua_Integer)changes);
  lua_pushinteger(L, (lua_Integer)sqlite3_last_insert_rowid(d->db));
  return 2;
}

static int l_rows(lua_State *L)
{
  call_t c;
  if (call_begin(L, &c, "rows")) return c.nret;
  ldb_t *d = c.d;
  const char *sql = c.sql;
  size_t len = c.len;
  sqlite3_stmt *st = c.st;
  int guard = c.guard, rc;
  lua_newtable(L);
  /* Column names are read after the first step: a step may re-prepare the statement
   * (the schema changed since it was cached) and `SELECT *` then has other columns. */
  int ncol = 0, names = guard + 2;
  lua_Integer n = 0;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    if (n == 0) push_names(L, st, ncol = sqlite3_column_count(st));
    push_row(L, st, ncol, names);
    lua_rawseti(L, guard + 1, ++n);
  }
  if (rc != SQLITE_DONE) {
    push_sql_error(L, d, sql, len);
    lua_closeslot(L, guard);
    lua_pushstring(L, code_name(rc));
    return 3;
  }
  lua_settop(L, guard + 1);
  lua_closeslot(L, guard);
  return 1;
}

static int l_first(lua_State *L)
{
  call_t c;
  if (call_begin(L, &c, "first")) return c.nret;
  ldb_t *d = c.d;
  const char *sql = c.sql;
  size_t len = c.len;
  sqlite3_stmt *st = c.st;
  int guard = c.guard, rc;
  rc = sqlite3_step(st);
  if (rc == SQLITE_ROW) {
    int ncol = sqlite3_column_count(st);   /* after the step, as in db:rows */
    push_names(L, st, ncol);
    push_row(L, st, ncol, guard + 1);
  } else if (rc == SQLITE_DONE) {
    lua_pushnil(L);
  } else {
    push_sql_error(L, d, sql, len);
    lua_closeslot(L, guard);
    lua_pushstring(L, code_name(rc));
    return 3;
  }
  lua_closeslot(L, guard);
  return 1;
}

static int run_plain(ldb_t *d, const char *sql)
{
  return sqlite3_exec(d->db, sql, NULL, NULL, NULL);
}

/* db:tx(fn): BEGIN IMMEDIATE (take the write lock up front, so a busy database fails here
 * and not halfway through fn), fn(db), COMMIT. If fn raises: ROLLBACK, then re-raise the
 * same error value. Returns true and fn's results, or nil, msg, code when BEGIN or COMMIT
 * fails (a failed COMMIT is rolled back). */
static int l_tx(lua_State *L)
{
  ldb_t *d = check_open(L, "tx");
  luaL_checktype(L, 2, LUA_TFUNCTION);
  if (d->in_tx || !sqlite3_get_autocommit(d->db))
    return luaL_error(L, "nimbus.sqlite: db:tx: a transaction is already open on this database "
                         "(db:tx does not nest; a manual BEGIN also counts)");
  lua_settop(L, 2);
  int rc = run_plain(d, "BEGIN IMMEDIATE");
  if (rc != SQLITE_OK) return return_sql_error(L, d, rc, "BEGIN IMMEDIATE", 15);
  d->in_tx = 1;
  lua_pushvalue(L, 2);
  lua_pushvalue(L, 1);
  int status = lua_pcall(L, 1, LUA_MULTRET, 0);
  d->in_tx = 0;
  if (status != LUA_OK) {
    if (!sqlite3_get_autocommit(d->db)) run_plain(d, "ROLLBACK");
    return lua_error(L);
  }
  if (sqlite3_get_autocommit(d->db))
    return luaL_error(L, "nimbus.sqlite: db:tx: the transaction ended inside fn (a COMMIT or ROLLBACK "
                         "through db:exec, or an error sqlite answered with a rollback), so nothing "
                         "was committed here; return normally to commit, raise to roll back");
  rc = run_plain(d, "COMMIT");
  if (rc != SQLITE_OK) {
    int nret = return_sql_error(L, d, rc, "COMMIT", 6);
    if (!sqlite3_get_autocommit(d->db)) run_plain(d, "ROLLBACK");
    return nret;
  }
  int nres = lua_gettop(L) - 2;
  luaL_checkstack(L, 1, NULL);
  lua_pushboolean(L, 1);
  lua_insert(L, 3);
  return nres + 1;
}

static void db_close(ldb_t *d)
{
  if (!d->db) return;
  for (int i = 0; i < CACHE_SIZE; i++) {
    if (!d->cache[i].sql) continue;
    sqlite3_finalize(d->cache[i].st);
    free(d->cache[i].sql);
    d->cache[i].sql = NULL;
  }
  while (d->depth > 0) {
    active_t *a = &d->act[--d->depth];
    if (a->slot < 0) sqlite3_finalize(a->st);
  }
  sqlite3_close_v2(d->db);   /* rolls back an open transaction */
  d->db = NULL;
}

/* db:close(), also __close: idempotent. */
static int l_close(lua_State *L)
{
  ldb_t *d = luaL_checkudata(L, 1, DB_MT);
  if (!d->db) return 0;
  if (d->in_tx) return luaL_error(L, "nimbus.sqlite: db:close inside db:tx (raise to roll back instead)");
  if (d->depth)
    return luaL_error(L, "nimbus.sqlite: db:close while a statement of this database is running "
                         "(called from a __gc or metamethod during a query)");
  db_close(d);
  return 0;
}

static int l_gc(lua_State *L)
{
  db_close(luaL_checkudata(L, 1, DB_MT));
  return 0;
}

static int l_tostring(lua_State *L)
{
  ldb_t *d = luaL_checkudata(L, 1, DB_MT);
  if (!d->db) {
    lua_pushliteral(L, "nimbus.sqlite.db (closed)");
  } else {
    const char *file = sqlite3_db_filename(d->db, "main");
    lua_pushfstring(L, "nimbus.sqlite.db (%s)", file && *file ? file : ":memory:");
  }
  return 1;
}

/* ---------------------------------------------------------------- module */

/* open(path, busy_timeout_s, readonly): the Lua face validated the options. */
static int l_open(lua_State *L)
{
  lua_settop(L, 3);
  const char *path = luaL_checkstring(L, 1);
  lua_Number busy = luaL_optnumber(L, 2, 5.0);
  int readonly = lua_toboolean(L, 3);
  luaL_argcheck(L, busy >= 0 && busy <= 86400.0, 2, "busy_timeout must be between 0 and 86400 seconds");
  ldb_t *d = lua_newuserdatauv(L, sizeof *d, 1);
  memset(d, 0, sizeof *d);
  luaL_setmetatable(L, DB_MT);
  ldb_t **guard = lua_newuserdatauv(L, sizeof *guard, 0);
  *guard = d;
  luaL_setmetatable(L, GUARD_MT);
  lua_setiuservalue(L, -2, 1);

  /* `nimbus-host check` creates no file: the adapter gets an empty database in memory */
  if (nh_lua_vm(L)->check) path = ":memory:", readonly = 0;
  /* NOMUTEX: one thread uses a handle. No SQLITE_OPEN_URI: a path is a path. */
  int flags = (readonly ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE) | SQLITE_OPEN_NOMUTEX;
  int rc = sqlite3_open_v2(path, &d->db, flags, NULL);
  if (rc != SQLITE_OK) {
    lua_pushnil(L);
    lua_pushfstring(L, "sqlite: cannot open %s: %s", path, d->db ? sqlite3_errmsg(d->db) : "out of memory");
    lua_pushstring(L, code_name(rc));
    sqlite3_close(d->db);
    d->db = NULL;
    return 3;
  }
  sqlite3_busy_timeout(d->db, (int)(busy * 1000.0 + 0.5));
  /* WAL: readers never block the writer, and the other handles (the host's reload VM, a
   * second process) read while we write. synchronous=NORMAL in WAL survives a process
   * crash; a power loss may drop the last commits (the host's store makes the same
   * trade, since every fsync here would stall the loop). A read-only handle cannot
   * switch modes; the file keeps the mode its writer set. The pragma also reads the
   * header, so "not a database" surfaces here rather than on the first query. */
  const char *setup = readonly ? "PRAGMA foreign_keys=ON; SELECT count(*) FROM sqlite_schema"
                               : "PRAGMA foreign_keys=ON; PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL";
  rc = run_plain(d, setup);
  if (rc != SQLITE_OK) {
    lua_pushnil(L);
    lua_pushfstring(L, "sqlite: cannot open %s: %s", path, sqlite3_errmsg(d->db));
    lua_pushstring(L, code_name(rc));
    db_close(d);
    return 3;
  }
  lua_settop(L, 4);
  return 1;
}

/* blob(s): marks a string to be bound as a BLOB rather than TEXT. */
static int l_blob(lua_State *L)
{
  luaL_checktype(L, 1, LUA_TSTRING);
  lua_newuserdatauv(L, 0, 1);
  lua_pushvalue(L, 1);
  lua_setiuservalue(L, -2, 1);
  luaL_setmetatable(L, BLOB_MT);
  return 1;
}

static int l_blob_tostring(lua_State *L)
{
  lua_getiuservalue(L, 1, 1);
  lua_pushfstring(L, "nimbus.sqlite.blob (%d bytes)", (int)lua_rawlen(L, -1));
  return 1;
}

int nh_lsqlite_open(lua_State *L)
{
  static const luaL_Reg methods[] = {
    { "exec", l_exec }, { "rows", l_rows }, { "first", l_first }, { "tx", l_tx }, { "close", l_close },
    { NULL, NULL },
  };
  static const luaL_Reg meta[] = {
    { "__gc", l_gc }, { "__close", l_close }, { "__tostring", l_tostring }, { NULL, NULL },
  };
  if (luaL_newmetatable(L, DB_MT)) {
    luaL_setfuncs(L, meta, 0);
    luaL_newlib(L, methods);
    lua_setfield(L, -2, "__index");
    lua_pushliteral(L, "locked");
    lua_setfield(L, -2, "__metatable");
  }
  lua_pop(L, 1);
  if (luaL_newmetatable(L, GUARD_MT)) {
    lua_pushcfunction(L, guard_close);
    lua_setfield(L, -2, "__close");
  }
  lua_pop(L, 1);
  if (luaL_newmetatable(L, BLOB_MT)) {
    lua_pushcfunction(L, l_blob_tostring);
    lua_setfield(L, -2, "__tostring");
  }
  lua_pop(L, 1);

  static const luaL_Reg fns[] = { { "open", l_open }, { "blob", l_blob }, { NULL, NULL } };
  luaL_newlib(L, fns);
  lua_pushstring(L, sqlite3_libversion());
  lua_setfield(L, -2, "sqlite_version");
  return 1;
}
