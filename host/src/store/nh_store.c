/* Store: open/close, migrations, transactions, statement cache. The row-level
 * operations live in nh_store_rows.c. */
#include "nh_store_int.h"
#include "nh_pg.h"
#include "nh_store_schema.h"
#include "core/nh_failgroup.h"
#include "core/nh_log.h"
#include "core/nh_metrics.h"
#include "core/nh_sqlite.h"
#include "core/nh_sqlprof.h"
#include "core/nh_util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* "NHst": marks a file as ours so a foreign sqlite database is refused, not scribbled on. */
#define NH_APPLICATION_ID 0x4E487374

static const char *const stmt_sql[NH_SQL_COUNT] = {
  [NH_SQL_AUDIT_PUT] =
    "INSERT INTO audit(endpoint, event_id, session_id, event_type, status, sub_status, error_text, error_type,"
    " handoff_reason, external_job_id, expected_by, message_id, correlation_id, originating_message_id,"
    " retry_count, payload, result, created_at, updated_at, error_stack, fail_group, attempts, queue_time_ms,"
    " processing_time_ms, overdue_at, traceparent)"
    " VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17,?18,?18,?19,?20,?21,?22,?23,?24,?25)"
    " ON CONFLICT(event_id, endpoint) DO UPDATE SET session_id=excluded.session_id,"
    " event_type=excluded.event_type, status=excluded.status, sub_status=excluded.sub_status,"
    " error_text=excluded.error_text, error_type=excluded.error_type, handoff_reason=excluded.handoff_reason,"
    " external_job_id=excluded.external_job_id, expected_by=excluded.expected_by,"
    " message_id=excluded.message_id, correlation_id=excluded.correlation_id,"
    " originating_message_id=excluded.originating_message_id, retry_count=excluded.retry_count,"
    " payload=excluded.payload, result=excluded.result, updated_at=excluded.updated_at,"
    " error_stack=excluded.error_stack, fail_group=excluded.fail_group, attempts=excluded.attempts,"
    " queue_time_ms=excluded.queue_time_ms, processing_time_ms=excluded.processing_time_ms,"
    " overdue_at=excluded.overdue_at, traceparent=excluded.traceparent",
  [NH_SQL_AUDIT_GET] = "SELECT " NH_AUDIT_COLS " FROM audit WHERE endpoint = ?1 AND event_id = ?2",
  [NH_SQL_AUDIT_FIND] = "SELECT " NH_AUDIT_COLS " FROM audit WHERE event_id = ?1",
  [NH_SQL_AUDIT_FIND_PREFIX] =
    "SELECT " NH_AUDIT_COLS " FROM audit WHERE event_id >= ?1 AND event_id < ?1 || x'ff' LIMIT 2",
  [NH_SQL_AUDIT_RETEXT] =
    "UPDATE audit SET error_text = ?3 WHERE endpoint = ?1 AND session_id = ?2 AND status = 'Deferred'",
  [NH_SQL_HISTORY_ADD] =
    "INSERT INTO history(endpoint, event_id, message_id, message_type, status, detail, at, error_text, error_type,"
    " error_stack, previous_payload) VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11)",
  [NH_SQL_HISTORY_LIST] =
    "SELECT at, message_id, message_type, status, detail, error_text, error_type, error_stack, previous_payload"
    " FROM history WHERE endpoint = ?1 AND event_id = ?2 ORDER BY id",
  [NH_SQL_SESSION_GET] =
    "SELECT blocked_by, draining, retry_due, next_park_seq FROM sessions WHERE endpoint = ?1 AND session_id = ?2",
  [NH_SQL_SESSION_PUT] =
    /* an upsert, not INSERT OR REPLACE: that deletes and re-inserts the row and its
     * index entries on every change of a session's state */
    "INSERT INTO sessions(endpoint, session_id, blocked_by, draining, retry_due, next_park_seq)"
    " VALUES (?1,?2,?3,?4,?5,?6) ON CONFLICT(endpoint, session_id) DO UPDATE SET blocked_by = excluded.blocked_by,"
    " draining = excluded.draining, retry_due = excluded.retry_due, next_park_seq = excluded.next_park_seq",
  [NH_SQL_SESSION_DEL] = "DELETE FROM sessions WHERE endpoint = ?1 AND session_id = ?2",
  /* Each through its partial index (migration 2): the cost is the rows returned, however
   * many sessions are blocked without a retry due. */
  [NH_SQL_SESSIONS_RETRY_DUE] =
    "SELECT session_id, blocked_by, draining, retry_due, next_park_seq FROM sessions WHERE endpoint = ?1"
    " AND blocked_by IS NOT NULL AND retry_due IS NOT NULL AND retry_due <= ?2 ORDER BY retry_due LIMIT ?3",
  [NH_SQL_SESSIONS_DRAINING] =
    "SELECT session_id, blocked_by, draining, retry_due, next_park_seq FROM sessions WHERE endpoint = ?1"
    " AND blocked_by IS NULL AND draining = 1 AND session_id > ?2 ORDER BY session_id LIMIT ?3",
  [NH_SQL_PARK] =
    "INSERT INTO parked(endpoint, session_id, park_seq, message_id, event_id, event_type, message_type,"
    " correlation_id, originating_message_id, parent_message_id, from_, retry_count, enqueued_at, body,"
    " error_text, error_type, reply_to, traceparent, tracestate)"
    " VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17,?18,?19)",
  [NH_SQL_PARKED_HEAD] =
    "SELECT park_seq, message_id, event_id, event_type, message_type, correlation_id, originating_message_id,"
    " parent_message_id, from_, retry_count, enqueued_at, body, error_text, error_type, reply_to, traceparent,"
    " tracestate FROM parked"
    " WHERE endpoint = ?1 AND session_id = ?2 ORDER BY park_seq LIMIT 1",
  [NH_SQL_PARKED_WINDOW] =
    "SELECT park_seq, message_id, event_id, event_type, message_type, correlation_id, originating_message_id,"
    " parent_message_id, from_, retry_count, enqueued_at, body, error_text, error_type, reply_to, traceparent,"
    " tracestate FROM parked"
    " WHERE endpoint = ?1 AND session_id = ?2 AND park_seq > ?3 ORDER BY park_seq LIMIT ?4",
  [NH_SQL_PARKED_COUNT_EVENT] = "SELECT count(*) FROM parked WHERE endpoint = ?1 AND event_id = ?2",
  [NH_SQL_PARKED_DEL] = "DELETE FROM parked WHERE endpoint = ?1 AND session_id = ?2 AND park_seq = ?3",
  [NH_SQL_PARKED_DEL_EVENT] = "DELETE FROM parked WHERE endpoint = ?1 AND event_id = ?2",
  [NH_SQL_PARKED_COUNT] = "SELECT count(*) FROM parked WHERE endpoint = ?1 AND session_id = ?2",
  [NH_SQL_PARKED_ANY] = "SELECT 1 FROM parked WHERE endpoint = ?1 AND session_id = ?2 LIMIT 1",
  [NH_SQL_INBOX_HAS] = "SELECT 1 FROM inbox WHERE endpoint = ?1 AND message_id = ?2",
  [NH_SQL_INBOX_ADD] = "INSERT OR IGNORE INTO inbox(endpoint, message_id, at) VALUES (?1,?2,?3)",
  /* every recorded outcome of a delivery writes a history row with its MessageId in the
   * same transaction; an operator's "Requested" row and a "Cancelled" run are not outcomes */
  [NH_SQL_PROCESSED_HAS] = "SELECT 1 FROM history WHERE event_id = ?3 AND endpoint = ?1 AND message_id = ?2"
                           " AND status NOT IN ('Requested', 'Cancelled') LIMIT 1",
  [NH_SQL_OPPENDING_ADD] =
    "INSERT OR REPLACE INTO operator_pending(message_id, endpoint, event_id, action, expected_status, at)"
    " VALUES (?1,?2,?3,?4,?5,?6)",
  [NH_SQL_OPPENDING_GET] = "SELECT expected_status FROM operator_pending WHERE message_id = ?1",
  [NH_SQL_OPPENDING_HAS] = "SELECT 1 FROM operator_pending WHERE event_id = ?2 AND endpoint = ?1 LIMIT 1",
  [NH_SQL_OPPENDING_DONE] = "DELETE FROM operator_pending WHERE message_id = ?1",
  [NH_SQL_OPLOG_ADD] =
    "INSERT INTO operator_log(at, actor, action, endpoint, event_id, session_id, detail)"
    " VALUES (?1,?2,?3,?4,?5,?6,?7)",
  [NH_SQL_TX_BEGIN] = "BEGIN IMMEDIATE",
  [NH_SQL_TX_COMMIT] = "COMMIT",
  [NH_SQL_TX_SAVEPOINT] = "SAVEPOINT job",
  [NH_SQL_TX_RELEASE] = "RELEASE job",
  [NH_SQL_TX_ROLLBACK_TO] = "ROLLBACK TO job",
};

/* What went wrong with the store file, said so that the advice fits the cause: a full
 * disk or a read-only mount must never be answered with "pass --store with another path"
 * (that would send the operator to a new, empty store no host reads). */
static int store_error(nh_error_t *err, sqlite3 *db, int code, const char *path, const char *doing)
{
  const char *why = db ? sqlite3_errmsg(db) : sqlite3_errstr(code);
  switch (code & 0xff) {
  case SQLITE_FULL:
    return nh_error_set(err, NH_EFAIL, "store %s: the disk is full while %s (%s); free some space and run it again",
                        path, doing, why);
  case SQLITE_READONLY:
    return nh_error_set(err, NH_EFAIL, "store %s is read-only (%s while %s): this command writes to it; check the "
                        "file system's mount and the file's permissions", path, why, doing);
  case SQLITE_IOERR:
    return nh_error_set(err, NH_EFAIL, "store %s: disk I/O error while %s (%s); check the disk and its free space",
                        path, doing, why);
  case SQLITE_CANTOPEN:
  case SQLITE_PERM:
  case SQLITE_AUTH:
    return nh_error_set(err, NH_EFAIL, "cannot open store %s while %s (%s): check the permissions of the file and "
                        "of its directory, and whether the file system is mounted read-only", path, doing, why);
  case SQLITE_CORRUPT:
    return nh_error_set(err, NH_EFAIL, "store %s is damaged (%s); restore it from a backup", path, why);
  case SQLITE_NOTADB:
    return nh_error_set(err, NH_EUSAGE, "%s is not a nimbus-host store (%s); pass --store with another path", path,
                        why);
  default:
    return nh_error_set(err, NH_EFAIL, "store %s: %s while %s", path, why, doing);
  }
}

static int check_ours(sqlite3 *db, const char *path, nh_error_t *err)
{
  sqlite3_stmt *st = NULL;
  int prc = sqlite3_prepare_v2(db, "PRAGMA application_id", -1, &st, NULL);
  if (prc != SQLITE_OK || (prc = sqlite3_step(st)) != SQLITE_ROW) {
    int code = sqlite3_extended_errcode(db);
    sqlite3_finalize(st);
    return store_error(err, db, code ? code : prc, path, "reading its header");
  }
  int app = sqlite3_column_int(st, 0);
  sqlite3_finalize(st);
  if (app == NH_APPLICATION_ID) return NH_OK;
  int tables = 0;
  if (sqlite3_prepare_v2(db, "SELECT count(*) FROM sqlite_master", -1, &st, NULL) == SQLITE_OK &&
      sqlite3_step(st) == SQLITE_ROW)
    tables = sqlite3_column_int(st, 0);
  sqlite3_finalize(st);
  if (app != 0 || tables > 0)
    return nh_error_set(err, NH_EUSAGE,
                        "%s is an sqlite database but not a nimbus-host store; refusing to touch it "
                        "(pass --store with another path)",
                        path);
  char sql[64];
  snprintf(sql, sizeof sql, "PRAGMA application_id = %d", NH_APPLICATION_ID);
  if (sqlite3_exec(db, sql, NULL, NULL, NULL) != SQLITE_OK)
    return store_error(err, db, sqlite3_extended_errcode(db), path, "creating it");
  return NH_OK;
}

/* A WAL store on a read-only mount cannot be read the usual way (sqlite wants to create
 * its -shm file): nobody can be writing it, so it is read as immutable. */
static int read_immutable(sqlite3 **db, const char *path)
{
  char *uri = sqlite3_mprintf("file:%s?immutable=1", path);
  sqlite3 *ro = NULL;
  int rc = sqlite3_open_v2(uri, &ro, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI | SQLITE_OPEN_NOMUTEX, NULL);
  sqlite3_free(uri);
  if (rc != SQLITE_OK) {
    sqlite3_close(ro);
    return 0;
  }
  sqlite3_close(*db);
  *db = ro;
  return 1;
}

static int schema_version(sqlite3 *db);

/* Reading commands (events, show, sessions, failures) on a read-only connection: no
 * pragmas that write, no migrations (a store that needs one is upgraded by a host). */
static int open_readonly_rest(nh_store_t **out, sqlite3 *db, const char *path, nh_error_t *err)
{
  sqlite3_busy_timeout(db, 10000);
  int v = schema_version(db);
  int want = (int)(sizeof nh_store_migrations / sizeof nh_store_migrations[0]);
  if (v < want) {   /* an older store: upgrade it first, which needs a writable one */
    sqlite3_close(db);
    return nh_store_open(out, path, 0, err);
  }
  if (v > want) {
    sqlite3_close(db);
    return nh_error_set(err, NH_EFAIL, "store %s has schema %d, newer than this nimbus-host reads (%d): use the "
                        "nimbus-host that wrote it", path, v, want);
  }
  nh_store_t *s = nh_xcalloc(1, sizeof *s);
  s->db = db;
  s->path = nh_xstrdup(path);
  for (int i = 0; i < NH_SQL_COUNT; i++) {
    if (sqlite3_prepare_v3(db, stmt_sql[i], -1, SQLITE_PREPARE_PERSISTENT, &s->stmt[i], NULL) != SQLITE_OK) {
      store_error(err, db, sqlite3_extended_errcode(db), path, "reading it");
      nh_store_close(s);
      return NH_EFAIL;
    }
  }
  *out = s;
  return NH_OK;
}

/* Waiting for another connection's write lock (a host's batch, a CLI command): up to
 * 10 s, trying again every 0.2 ms and then every 1 ms. sqlite's own busy timeout sleeps
 * 1, 2, 5, 10 ... 100 ms between tries, and a busy host leaves the lock free only for
 * moments between its batches: a CLI command beside it slept through them. */
static int on_busy(void *data, int tries)
{
  nh_store_t *s = data;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  int64_t now = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
  if (tries == 0) s->busy_since = now;
  if (now - s->busy_since >= 10000) return 0;
  usleep(tries < 50 ? 200 : 1000);
  return 1;
}

/* The store's schema version before migrating (0: a new file). */
static int schema_version(sqlite3 *db)
{
  sqlite3_stmt *st = NULL;
  int v = 0;
  if (sqlite3_prepare_v2(db, "SELECT version FROM nh_schema WHERE component = 'store'", -1, &st, NULL) == SQLITE_OK &&
      sqlite3_step(st) == SQLITE_ROW)
    v = sqlite3_column_int(st, 0);
  sqlite3_finalize(st);
  return v;
}

/* Failed and DeadLettered rows written before failure groups existed (schema 1) get
 * theirs once, right after the migration to schema 2. */
static int backfill_groups(nh_store_t *s)
{
  static const char *const sel =
    "SELECT rowid, endpoint, error_type, error_text FROM audit WHERE status IN ('Failed', 'DeadLettered')"
    " AND fail_group IS NULL";
  sqlite3_stmt *st = NULL, *up = NULL;
  if (sqlite3_prepare_v2(s->db, sel, -1, &st, NULL) != SQLITE_OK) return NH_EFAIL;
  int rc = sqlite3_step(st);
  if (rc != SQLITE_ROW) {
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? NH_OK : NH_EFAIL;
  }
  if (sqlite3_prepare_v2(s->db, "UPDATE audit SET fail_group = ?2 WHERE rowid = ?1", -1, &up, NULL) != SQLITE_OK ||
      nh_store_begin(s)) {
    sqlite3_finalize(st);
    sqlite3_finalize(up);
    return NH_EFAIL;
  }
  for (; rc == SQLITE_ROW; rc = sqlite3_step(st)) {
    char group[NH_FAILGROUP_ID_LEN + 1];
    nh_failgroup_id((const char *)sqlite3_column_text(st, 1), (const char *)sqlite3_column_text(st, 2),
                    (const char *)sqlite3_column_text(st, 3), group);
    sqlite3_bind_int64(up, 1, sqlite3_column_int64(st, 0));
    nh_sqlite_bind_text(up, 2, group);
    if (nh_sqlite_step_done(s->db, up, "failure group backfill")) s->failed = 1;
  }
  sqlite3_finalize(st);
  sqlite3_finalize(up);
  return rc == SQLITE_DONE ? nh_store_commit(s) : (nh_store_rollback(s), NH_EFAIL);
}

int nh_store_open(nh_store_t **out, const char *path, int flags, nh_error_t *err)
{
  *out = NULL;
  if (nh_pg_url_is(path)) return nh_store_open_pg(path, flags, err);
  struct stat sb;
  int exists = stat(path, &sb) == 0;
  if (!exists && !(flags & NH_STORE_CREATE))
    return nh_error_set(err, NH_ENOTFOUND,
                        "store %s does not exist: start the host first (nimbus-host ADAPTER.lua) or pass "
                        "--store with the right path",
                        path);
  if (!exists) {
    /* Name the missing directory ourselves: sqlite only says "unable to open". */
    char *dir = nh_xstrdup(path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) {
      *slash = '\0';
      if (stat(dir, &sb) != 0) {
        nh_error_set(err, NH_EUSAGE, "cannot create store %s: directory %s does not exist (%s)", path, dir,
                     strerror(errno));
        free(dir);
        return NH_EUSAGE;
      }
    }
    free(dir);
  } else if (S_ISDIR(sb.st_mode)) {
    return nh_error_set(err, NH_EUSAGE, "store path %s is a directory; pass a file path to --store", path);
  }

  int readonly = (flags & NH_STORE_READONLY) != 0;
  if (readonly && !exists)
    return nh_error_set(err, NH_ENOTFOUND, "store %s does not exist: start the host first (nimbus-host ADAPTER.lua) "
                        "or pass --store with the right path", path);
  sqlite3 *db = NULL;
  int oflags = readonly ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;
  int orc = sqlite3_open_v2(path, &db, oflags | SQLITE_OPEN_NOMUTEX, NULL);
  if (orc != SQLITE_OK) {
    int code = db ? sqlite3_extended_errcode(db) : orc;
    store_error(err, db, code, path, "opening it");
    sqlite3_close(db);
    return NH_EFAIL;
  }
  nh_sqlprof_attach(db);
  /* A peer host holding the write lock for one batch is normal; wait for it. */
  sqlite3_busy_timeout(db, 10000);
  /* New stores free pages incrementally (retention gives them back, nh_store_vacuum_step);
   * the mode can only be chosen before the first table exists. */
  if (!exists) sqlite3_exec(db, "PRAGMA auto_vacuum=INCREMENTAL", NULL, NULL, NULL);
  int rc = check_ours(db, path, err);
  if (rc && readonly && read_immutable(&db, path)) rc = check_ours(db, path, err);
  if (rc) {
    sqlite3_close(db);
    return rc;
  }
  if (readonly) return open_readonly_rest(out, db, path, err);
  /* WAL lets CLI readers run beside a writing host; NORMAL is durable across process
   * crashes (the guarantee SIGKILL tests need), only a power cut may lose the last commits. */
  /* temp_store=MEMORY: the per-job savepoints keep their sub-journals in memory instead
   * of writing every touched page to a temporary file (13x the I/O per event otherwise). */
  if (sqlite3_exec(db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=OFF;"
                       " PRAGMA temp_store=MEMORY;", NULL,
                   NULL, NULL) != SQLITE_OK) {
    store_error(err, db, sqlite3_extended_errcode(db), path, "setting it up");
    sqlite3_close(db);
    return NH_EFAIL;
  }
  /* A host checkpoints on a thread of its own once the WAL reaches 4,000 pages
   * (dispatch/nh_checkpointer.c); a CLI command writing beside it would otherwise copy
   * the host's WAL back in each of its own commits (sqlite's default: past 1,000 pages). */
  sqlite3_wal_autocheckpoint(db, NH_STORE_WAL_AUTOCHECKPOINT);
  int was = schema_version(db);
  if (nh_sqlite_migrate(db, "store", nh_store_migrations,
                        (int)(sizeof nh_store_migrations / sizeof nh_store_migrations[0]), err)) {
    char tmp[sizeof err->msg];
    snprintf(tmp, sizeof tmp, "%s", err->msg);
    nh_error_set(err, NH_EFAIL, "store %s: %s", path, tmp);
    sqlite3_close(db);
    return NH_EFAIL;
  }
  nh_store_t *s = nh_xcalloc(1, sizeof *s);
  s->db = db;
  s->path = nh_xstrdup(path);
  sqlite3_busy_handler(db, on_busy, s);
  for (int i = 0; i < NH_SQL_COUNT; i++) {
    if (sqlite3_prepare_v3(db, stmt_sql[i], -1, SQLITE_PREPARE_PERSISTENT, &s->stmt[i], NULL) != SQLITE_OK) {
      nh_error_set(err, NH_EFAIL, "store %s: preparing statement %d: %s", path, i, sqlite3_errmsg(db));
      nh_store_close(s);
      return NH_EFAIL;
    }
  }
  if (was < 2 && backfill_groups(s)) {
    nh_error_set(err, NH_EFAIL, "store %s: %s", path, sqlite3_errmsg(db));
    nh_store_close(s);
    return NH_EFAIL;
  }
  *out = s;
  return NH_OK;
}

void nh_store_close(nh_store_t *s)
{
  if (!s) return;
  for (int i = 0; i < NH_SQL_COUNT; i++) sqlite3_finalize(s->stmt[i]);
  if (s->in_tx) sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
  sqlite3_close(s->db);
  free(s->path);
  free(s);
}

sqlite3 *nh_store_db(nh_store_t *s) { return s->db; }
const char *nh_store_path(nh_store_t *s) { return s->path; }
const char *nh_store_errmsg(nh_store_t *s) { return sqlite3_errmsg(s->db); }

const char *nh_store_explain(nh_store_t *s, const char *doing, nh_error_t *err)
{
  store_error(err, s->db, sqlite3_extended_errcode(s->db), s->path, doing);
  return err->msg;
}

static nh_metric_t m_tx = NH_HISTOGRAM_DEF("nimbus_store_transaction_seconds",
  "Store write transactions, from BEGIN to COMMIT or ROLLBACK", nh_metric_buckets_fast, "result");

static uint64_t mono_ns(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void tx_observe(nh_store_t *s, const char *result)
{
  if (s->tx_started_ns) nh_metric_observe(&m_tx, (double)(mono_ns() - s->tx_started_ns) / 1e9, result);
  s->tx_started_ns = 0;
}

void nh_store_file_sizes(nh_store_t *s, int64_t *db, int64_t *wal)
{
  struct stat st;
  char path[4096];
  *db = *wal = 0;
  if (!s->path) return;
  if (stat(s->path, &st) == 0) *db = (int64_t)st.st_size;
  snprintf(path, sizeof path, "%s-wal", s->path);
  if (stat(path, &st) == 0) *wal = (int64_t)st.st_size;
}

/* Steps a prepared transaction statement once: SQLITE_OK or sqlite's error code (the
 * message stays in sqlite3_errmsg until the next call on the connection). */
static int tx_step(nh_store_t *s, int id)
{
  sqlite3_stmt *st = s->stmt[id];
  int rc = sqlite3_step(st);
  sqlite3_reset(st);
  return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

int nh_store_begin(nh_store_t *s)
{
  if (tx_step(s, NH_SQL_TX_BEGIN) != SQLITE_OK) {
    nh_log_error("store", "begin: %s", sqlite3_errmsg(s->db));
    return NH_EFAIL;
  }
  s->in_tx = 1;
  s->tx_started_ns = mono_ns();
  s->failed = s->outer_failed = 0;
  if (s->txn_cb) s->txn_cb(s->txn_data, NH_TXN_BEGIN);
  return NH_OK;
}

void nh_store_set_txn_hook(nh_store_t *s, nh_store_txn_cb cb, void *data)
{
  s->txn_cb = cb;
  s->txn_data = data;
}

int nh_store_failed(nh_store_t *s) { return s->failed || s->outer_failed; }
int nh_store_in_tx(nh_store_t *s) { return s->in_tx; }

int nh_store_savepoint(nh_store_t *s)
{
  s->outer_failed |= s->failed;   /* a failure before the savepoint still blocks the commit */
  if (tx_step(s, NH_SQL_TX_SAVEPOINT) != SQLITE_OK) {
    nh_log_error("store", "savepoint: %s", sqlite3_errmsg(s->db));
    s->failed = 1;
    return NH_EFAIL;
  }
  s->failed = 0;
  if (s->txn_cb) s->txn_cb(s->txn_data, NH_TXN_SAVEPOINT);
  return NH_OK;
}

void nh_store_savepoint_rollback(nh_store_t *s)
{
  tx_step(s, NH_SQL_TX_ROLLBACK_TO);
  tx_step(s, NH_SQL_TX_RELEASE);
  s->failed = 0;
  if (s->txn_cb) s->txn_cb(s->txn_data, NH_TXN_SAVEPOINT_ROLLBACK);
}

int nh_store_savepoint_end(nh_store_t *s)
{
  if (s->failed) {
    nh_store_savepoint_rollback(s);
    return NH_EFAIL;
  }
  if (tx_step(s, NH_SQL_TX_RELEASE) != SQLITE_OK) {
    nh_log_error("store", "release savepoint: %s", sqlite3_errmsg(s->db));
    nh_store_savepoint_rollback(s);
    return NH_EFAIL;
  }
  if (s->txn_cb) s->txn_cb(s->txn_data, NH_TXN_SAVEPOINT_END);
  return NH_OK;
}

int nh_store_commit(nh_store_t *s)
{
  if (s->failed || s->outer_failed) {
    nh_log_error("store", "not committing: a statement in this transaction failed; rolled back");
    nh_store_rollback(s);
    return NH_EFAIL;
  }
  if (tx_step(s, NH_SQL_TX_COMMIT) != SQLITE_OK) {
    nh_log_error("store", "commit: %s (disk full or store unwritable? the batch is rolled back and retried)",
                 sqlite3_errmsg(s->db));
    nh_store_rollback(s);
    return NH_EFAIL;
  }
  s->in_tx = 0;
  tx_observe(s, "commit");
  if (s->txn_cb) s->txn_cb(s->txn_data, NH_TXN_COMMIT);
  return NH_OK;
}

void nh_store_vacuum_step(nh_store_t *s, int pages)
{
  char sql[64];
  snprintf(sql, sizeof sql, "PRAGMA incremental_vacuum(%d)", pages);
  sqlite3_exec(s->db, sql, NULL, NULL, NULL);
}

void nh_store_checkpoint(nh_store_t *s)
{
  int log = 0, done = 0;
  sqlite3_wal_checkpoint_v2(s->db, NULL, SQLITE_CHECKPOINT_PASSIVE, &log, &done);
}

void nh_store_rollback(nh_store_t *s)
{
  int was = s->in_tx;
  if (sqlite3_get_autocommit(s->db) == 0) sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
  s->in_tx = 0;
  if (was) tx_observe(s, "rollback");
  s->failed = s->outer_failed = 0;
  if (was && s->txn_cb) s->txn_cb(s->txn_data, NH_TXN_ROLLBACK);
}
