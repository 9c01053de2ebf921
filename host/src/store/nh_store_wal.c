/* WAL checkpoints. By default sqlite copies the WAL back into the database inside the
 * commit that crosses 1,000 pages: on the loop thread, in the middle of a batch, about
 * every 250 events (4 MB of I/O and an fsync each time). A host moves that work to a
 * thread of its own (dispatch/nh_checkpointer.c) through these two calls. */
#include "nh_store_int.h"

#include <stdio.h>

static int on_commit(void *data, sqlite3 *db, const char *name, int pages)
{
  (void)db;
  (void)name;
  nh_store_t *s = data;
  if (s->wal_cb) s->wal_cb(s->wal_data, pages);
  return SQLITE_OK;
}

void nh_store_set_wal_hook(nh_store_t *s, nh_store_wal_cb cb, void *data)
{
  s->wal_cb = cb;
  s->wal_data = data;
  if (cb) sqlite3_wal_hook(s->db, on_commit, s);
  else sqlite3_wal_autocheckpoint(s->db, NH_STORE_WAL_AUTOCHECKPOINT);   /* sqlite's own again */
}

int nh_store_checkpoint_file(const char *path, sqlite3 **conn, int *wal_pages, int *copied, nh_error_t *err)
{
  /* Its own connection: this runs on a worker thread, and a connection is used by one
   * thread at a time (the store's stays on the loop thread; a kept one goes from one
   * worker call to the next, never two at once). A PASSIVE checkpoint takes no lock a
   * writer needs, so the host keeps committing while it copies. */
  sqlite3 *db = conn ? *conn : NULL;
  int rc = SQLITE_OK;
  if (!db) {
    rc = sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL);
    /* A fresh connection has not read the file yet, so sqlite does not know it is in WAL
     * mode: the checkpoint alone returned "not WAL" (-1 pages) and copied nothing, and
     * the WAL grew without end. A statement first makes it look. */
    if (rc == SQLITE_OK) rc = sqlite3_exec(db, "PRAGMA cache_size=8; PRAGMA journal_mode=WAL", NULL, NULL, NULL);
  }
  if (rc == SQLITE_OK) rc = sqlite3_wal_checkpoint_v2(db, NULL, SQLITE_CHECKPOINT_PASSIVE, wal_pages, copied);
  int ok = rc == SQLITE_OK || rc == SQLITE_BUSY;   /* busy: another process is checkpointing */
  if (!ok) nh_error_set(err, NH_EFAIL, "checkpoint of %s: %s", path, db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
  else if (rc == SQLITE_OK && *wal_pages < 0)
    ok = 0, nh_error_set(err, NH_EFAIL, "checkpoint of %s: the file is not in WAL mode", path);
  if (conn && ok) {
    *conn = db;
  } else {   /* a failed one is opened afresh next time */
    sqlite3_close(db);
    if (conn) *conn = NULL;
  }
  return ok ? NH_OK : NH_EFAIL;
}

void nh_store_checkpoint_conn_close(sqlite3 *conn)
{
  sqlite3_close(conn);
}
