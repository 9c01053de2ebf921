/* The store's commits append to its WAL; a checkpoint copies the WAL back into the
 * database so it can start over. sqlite does that inside the commit that crosses 1,000
 * pages: a 4 MB copy and an fsync on the loop thread every few hundred events, which cost
 * the happy path 15% of its rate and put the copy inside some batch's latency. Here the
 * WAL grows to NH_WAL_PAGES first (hot pages are then copied once instead of many times)
 * and the copy runs on a worker thread through a connection of its own: the one piece of
 * sqlite work off the loop thread, and it touches no state of the host. A PASSIVE
 * checkpoint takes no lock a writer needs, so commits go on meanwhile.
 *
 * sqlite starts the WAL over only when a write transaction begins with every frame copied
 * back. Under a steady load the host commits while the worker copies, so that moment never
 * came: the WAL grew to 1.5 GB over 300,000 events, each commit extended the file (the
 * kernel zeroing new blocks was 15% of the host's CPU) and its index (-shm, mapped) grew
 * the host's RSS. So once the worker's copy is back, the loop copies the pages committed
 * meanwhile itself (a small share of the copy at the host's rates), and its next commit
 * starts the WAL over. Whatever the rate of commits, the WAL then stays within
 * NH_WAL_PAGES plus what one worker's copy lets the loop write. */
#include "nh_checkpointer.h"
#include "core/nh_log.h"
#include "core/nh_util.h"

#include <stdlib.h>

/* 4 KB pages: 16 MB of WAL between checkpoints. The WAL file keeps that size once reached
 * (sqlite reuses it from the start when a checkpoint caught up). */
#define NH_WAL_PAGES 4000
/* A WAL this large means the copies do not keep up (a reader holding an old snapshot
 * stops them): say so, at most once a minute. */
#define NH_WAL_WARN_PAGES 262144

struct nh_checkpointer {
  uv_loop_t *loop;
  nh_store_t *store;
  char *path;
  sqlite3 *conn;   /* the worker's connection, kept from one copy to the next */
  uv_work_t work;
  int busy;        /* a copy is on the worker thread */
  int stopping;    /* freed when that copy is back */
  int pages;       /* WAL pages after the last commit */
  int rc;          /* written by the worker, read after it */
  int copied;      /* WAL pages in the database after the worker's copy (same) */
  nh_error_t err;
  int64_t warned_ms;
};

static void work_cb(uv_work_t *w)
{
  nh_checkpointer_t *c = w->data;
  int wal_pages = 0;
  c->copied = 0;
  c->rc = nh_store_checkpoint_file(c->path, &c->conn, &wal_pages, &c->copied, &c->err);
}

static void after_cb(uv_work_t *w, int status)
{
  nh_checkpointer_t *c = w->data;
  c->busy = 0;
  if (c->stopping) {
    nh_store_checkpoint_conn_close(c->conn);
    free(c->path);
    free(c);
    return;
  }
  if (status != 0) return;
  if (c->rc) nh_log_warn("store", "%s", c->err.msg);
  else if (c->copied > 0) nh_store_checkpoint(c->store);
}

static void start_copy(nh_checkpointer_t *c)
{
  if (c->busy || c->stopping) return;
  c->busy = 1;
  c->work.data = c;
  if (uv_queue_work(c->loop, &c->work, work_cb, after_cb) != 0) {
    c->busy = 0;
    nh_store_checkpoint(c->store);   /* no worker: copy here rather than grow the WAL */
  }
}

static void on_wal(void *data, int pages)
{
  nh_checkpointer_t *c = data;
  c->pages = pages;
  if (pages >= NH_WAL_PAGES) start_copy(c);
  if (pages >= NH_WAL_WARN_PAGES) {
    int64_t now = nh_time_now_ms();
    if (now - c->warned_ms >= 60000) {
      c->warned_ms = now;
      nh_log_warn("store", "the WAL of %s holds %d pages (%d MB) and checkpoints cannot copy it back: a reader "
                  "(a CLI command with --follow, another host) may hold an old snapshot",
                  c->path, pages, pages / 256);
    }
  }
}

nh_checkpointer_t *nh_checkpointer_start(uv_loop_t *loop, nh_store_t *store)
{
  nh_checkpointer_t *c = nh_xcalloc(1, sizeof *c);
  c->loop = loop;
  c->store = store;
  c->path = nh_xstrdup(nh_store_path(store));
  nh_store_set_wal_hook(store, on_wal, c);
  return c;
}

void nh_checkpointer_kick(nh_checkpointer_t *c)
{
  if (c && c->pages > 0) start_copy(c);
}

void nh_checkpointer_close(nh_checkpointer_t *c)
{
  if (!c) return;
  nh_store_set_wal_hook(c->store, NULL, NULL);
  c->stopping = 1;
  if (c->busy) return;   /* after_cb frees it */
  nh_store_checkpoint_conn_close(c->conn);
  free(c->path);
  free(c);
}
