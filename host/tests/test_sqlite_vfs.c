/* Unit tests for core/nh_sqlite_vfs: a commit's WAL frames go down in far fewer writes,
 * every commit is in the file when COMMIT returns (a process killed right after loses
 * nothing, under synchronous NORMAL and FULL), a transaction that spilled and rolled back
 * leaves nothing behind, and a write that fails (the file size limit standing in for a
 * full disk) fails its commit and loses none of the earlier ones. The files are checked
 * through sqlite's own "unix" VFS, without the shim. */
#include "nh_test.h"

#include "core/nh_sqlite_vfs.h"

#include <signal.h>
#include <sqlite3.h>
#include <sys/resource.h>
#include <sys/wait.h>

static sqlite3 *open_db(const char *path, const char *vfs, const char *sync)
{
  sqlite3 *db = NULL;
  int rc = sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, vfs);
  if (rc != SQLITE_OK) return NULL;
  char sql[160];
  snprintf(sql, sizeof sql,
           "PRAGMA journal_mode=WAL; PRAGMA synchronous=%s;"
           " CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, pad TEXT)", sync);
  if (sqlite3_exec(db, sql, NULL, NULL, NULL) != SQLITE_OK) {
    sqlite3_close(db);
    return NULL;
  }
  return db;
}

/* One transaction of n rows of about 600 bytes each; the sqlite result of its COMMIT. */
static int insert_rows(sqlite3 *db, int first, int n)
{
  if (sqlite3_exec(db, "BEGIN", NULL, NULL, NULL) != SQLITE_OK) return SQLITE_ERROR;
  sqlite3_stmt *st = NULL;
  sqlite3_prepare_v2(db, "INSERT INTO t(id, pad) VALUES (?1, printf('%.600c', 'x'))", -1, &st, NULL);
  for (int i = 0; i < n; i++) {
    sqlite3_bind_int(st, 1, first + i);
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) {
      sqlite3_finalize(st);
      sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
      return rc;
    }
  }
  sqlite3_finalize(st);
  int rc = sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
  if (rc != SQLITE_OK) sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
  return rc;
}

/* Rows and integrity as sqlite's own VFS reads the file (a fresh connection: it recovers
 * the WAL from the file, as after a crash). -1 when the file is damaged. */
static int count_plain(const char *path)
{
  sqlite3 *db = NULL;
  if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, "unix") != SQLITE_OK) {
    sqlite3_close(db);
    return -1;
  }
  int n = -1;
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW &&
      strcmp((const char *)sqlite3_column_text(st, 0), "ok") == 0) {
    sqlite3_finalize(st);
    st = NULL;
    if (sqlite3_prepare_v2(db, "SELECT count(*) FROM t", -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
      n = sqlite3_column_int(st, 0);
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  return n;
}

/* A cache of 10 pages: 400 rows of a transaction spill frames into the WAL before it
 * ends, and it is rolled back. */
static int spill_and_roll_back(sqlite3 *db)
{
  int rc = sqlite3_exec(db, "PRAGMA cache_size=10; BEGIN", NULL, NULL, NULL);
  if (rc == SQLITE_OK)
    rc = sqlite3_exec(db,
                      "WITH RECURSIVE n(i) AS (SELECT 100 UNION ALL SELECT i + 1 FROM n WHERE i < 499)"
                      " INSERT INTO t SELECT i, printf('%.600c', 'y') FROM n",
                      NULL, NULL, NULL);
  int rb = sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
  return rc != SQLITE_OK ? rc : rb;
}

TEST(a_commit_s_frames_go_down_in_a_few_writes)
{
  ASSERT_EQ_INT(nh_sqlite_vfs_install(), 0);
  ASSERT_EQ_STR(sqlite3_vfs_find(NULL)->zName, "nh-gather");
  sqlite3 *db = open_db(nh_test_path("a.db"), NULL, "NORMAL");
  ASSERT_NOT_NULL(db);
  uint64_t asked0, done0, asked, done;
  nh_sqlite_vfs_counts(&asked0, &done0);
  ASSERT_EQ_INT(insert_rows(db, 1, 200), SQLITE_OK);   /* about 30 pages */
  nh_sqlite_vfs_counts(&asked, &done);
  ASSERT_CMP_INT(asked - asked0, >=, 60);     /* two writes per frame asked */
  ASSERT_CMP_INT(done - done0, <=, 4);        /* a full buffer, the commit frame, its page */
  ASSERT_EQ_INT(count_plain(nh_test_path("a.db")), 200);   /* while the writer is still open */
  sqlite3_close(db);
  ASSERT_EQ_INT(count_plain(nh_test_path("a.db")), 200);
}

/* A child commits `commits` transactions, then is killed before it closes anything. */
static void commit_then_die(const char *path, const char *sync, int commits)
{
  pid_t pid = fork();
  ASSERT_CMP_INT(pid, >=, 0);
  if (pid == 0) {
    sqlite3 *db = open_db(path, NULL, sync);
    if (!db) _exit(3);
    for (int i = 0; i < commits; i++)
      if (insert_rows(db, 1 + i * 7, 7) != SQLITE_OK) _exit(4);
    raise(SIGKILL);
    _exit(5);
  }
  int status = 0;
  ASSERT_EQ_INT(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
}

TEST(every_commit_is_in_the_file_when_a_killed_process_stops)
{
  ASSERT_EQ_INT(nh_sqlite_vfs_install(), 0);
  commit_then_die(nh_test_path("normal.db"), "NORMAL", 25);
  ASSERT_EQ_INT(count_plain(nh_test_path("normal.db")), 175);
  commit_then_die(nh_test_path("full.db"), "FULL", 25);   /* padding frames at the sync point */
  ASSERT_EQ_INT(count_plain(nh_test_path("full.db")), 175);
}

TEST(a_spilled_transaction_rolled_back_leaves_nothing)
{
  ASSERT_EQ_INT(nh_sqlite_vfs_install(), 0);
  sqlite3 *db = open_db(nh_test_path("spill.db"), NULL, "NORMAL");
  ASSERT_NOT_NULL(db);
  ASSERT_EQ_INT(insert_rows(db, 1, 10), SQLITE_OK);
  ASSERT_EQ_INT(spill_and_roll_back(db), SQLITE_OK);
  ASSERT_EQ_INT(insert_rows(db, 1000, 5), SQLITE_OK);
  ASSERT_EQ_INT(count_plain(nh_test_path("spill.db")), 15);
  sqlite3_close(db);
  ASSERT_EQ_INT(count_plain(nh_test_path("spill.db")), 15);
}

/* The frames a rolled-back transaction left in one connection's buffer must never reach
 * the file: another connection commits at those offsets next. (Here sqlite's own rollback
 * reads the WAL, which writes the buffer while the lock is still held; the shim drops what
 * is left when the lock goes, for the paths that do not.) */
TEST(a_rollback_s_frames_never_overwrite_another_connection_s_commit)
{
  ASSERT_EQ_INT(nh_sqlite_vfs_install(), 0);
  const char *path = nh_test_path("two.db");
  sqlite3 *x = open_db(path, NULL, "NORMAL");
  sqlite3 *y = open_db(path, NULL, "NORMAL");
  ASSERT_NOT_NULL(x);
  ASSERT_NOT_NULL(y);
  ASSERT_EQ_INT(insert_rows(x, 1, 10), SQLITE_OK);
  ASSERT_EQ_INT(spill_and_roll_back(x), SQLITE_OK);
  ASSERT_EQ_INT(insert_rows(y, 1000, 300), SQLITE_OK);   /* over the offsets x's frames had */
  sqlite3_close(x);   /* what x still held must not be written now */
  ASSERT_EQ_INT(count_plain(path), 310);
  ASSERT_EQ_INT(insert_rows(y, 5000, 3), SQLITE_OK);
  sqlite3_close(y);
  ASSERT_EQ_INT(count_plain(path), 313);
}

TEST(a_failed_write_fails_its_commit_and_keeps_the_earlier_ones)
{
  ASSERT_EQ_INT(nh_sqlite_vfs_install(), 0);
  const char *path = nh_test_path("full-disk.db");
  pid_t pid = fork();
  ASSERT_CMP_INT(pid, >=, 0);
  if (pid == 0) {
    signal(SIGXFSZ, SIG_IGN);   /* a write past the limit fails with EFBIG instead */
    sqlite3 *db = open_db(path, NULL, "NORMAL");
    if (!db || insert_rows(db, 1, 20) != SQLITE_OK) _exit(3);
    /* No file may grow past 200 KiB from here: the next transaction's 600 KiB cannot. */
    struct rlimit rl;
    if (getrlimit(RLIMIT_FSIZE, &rl) != 0) _exit(4);
    rlim_t hard = rl.rlim_max;
    rl.rlim_cur = 200 * 1024;   /* the soft limit only: it can be raised again */
    if (setrlimit(RLIMIT_FSIZE, &rl) != 0) _exit(4);
    int rc = insert_rows(db, 100, 1000);
    if (rc == SQLITE_OK) _exit(5);
    /* The connection goes on once there is room again. */
    rl.rlim_cur = hard;
    if (setrlimit(RLIMIT_FSIZE, &rl) != 0) _exit(6);
    if (insert_rows(db, 5000, 3) != SQLITE_OK) _exit(7);
    raise(SIGKILL);
    _exit(8);
  }
  int status = 0;
  ASSERT_EQ_INT(waitpid(pid, &status, 0), pid);
  if (WIFEXITED(status)) fprintf(stderr, "child exited with %d\n", WEXITSTATUS(status));
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  ASSERT_EQ_INT(count_plain(path), 23);
}

NH_TEST_MAIN()
