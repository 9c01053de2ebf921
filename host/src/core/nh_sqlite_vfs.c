/* The WAL-write gathering VFS (nh_sqlite_vfs.h). */
#include "nh_sqlite_vfs.h"
#include "nh_error.h"

#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* 32 pages of 4 KiB: a flush per 32 frames is already 64 times fewer syscalls, and the
 * buffer is taken only by a connection that writes (readers never write the WAL). */
#define GATHER_CAP (128 * 1024)
#define FRAME_HDR 24
#define WAL_HDR 32
#define WAL_WRITE_LOCK 0   /* sqlite's wal.c: the wal-index lock a writer holds */
#define MAX_WRITERS 8

typedef struct gfile gfile_t;
struct gfile {
  sqlite3_file base;       /* methods: gather_io (a -wal file) or main_io (a database) */
  sqlite3_file *real;      /* the default VFS's file, in the same allocation after this */
  const char *name;        /* sqlite's, valid until close */
  /* A database and its -wal file, paired at the WAL's first write (made while the
   * database's connection holds the WAL write lock): when that lock is let go, whatever
   * the WAL still buffers belongs to a transaction that did not commit and is dropped, so
   * it can never be written over frames another connection commits next. */
  gfile_t *peer;
  int pgsz;                /* -wal: the page size in its header (0: not known yet, -1: unreadable) */
  unsigned char *buf;
  sqlite3_int64 off;       /* file offset of buf[0] */
  int len;
  /* A commit frame's header was written: it and every write until the next transaction's
   * first (non-commit) frame header go down at once. That covers the commit frame's page,
   * the padding frames and split writes synchronous=FULL adds around its sync point, and a
   * commit header whose checksum sqlite rewrites after the frame (walRewriteChecksums). */
  int through;
};

static sqlite3_vfs gather_vfs;
static sqlite3_vfs *below;
static sqlite3_io_methods gather_io, main_io;
static _Atomic uint64_t n_asked, n_done, n_dropped;

/* Databases this thread's connections hold the WAL write lock of (a connection is used
 * by one thread at a time; a thread rarely writes two databases at once). */
static __thread gfile_t *writers[MAX_WRITERS];
static __thread int nwriters;

static void writer_forget(gfile_t *m)
{
  for (int i = 0; i < nwriters; i++)
    if (writers[i] == m) {
      writers[i] = writers[--nwriters];
      return;
    }
}

/* The database holding the write lock whose -wal file this is, or NULL. */
static gfile_t *writer_of(const gfile_t *w)
{
  size_t n = strlen(w->name);
  for (int i = 0; i < nwriters; i++) {
    size_t m = strlen(writers[i]->name);
    if (m + 4 == n && strncmp(w->name, writers[i]->name, m) == 0 && strcmp(w->name + m, "-wal") == 0)
      return writers[i];
  }
  return NULL;
}

static int write_down(gfile_t *f, const void *p, int amt, sqlite3_int64 off)
{
  atomic_fetch_add_explicit(&n_done, 1, memory_order_relaxed);
  return f->real->pMethods->xWrite(f->real, p, amt, off);
}

static int flush(gfile_t *f)
{
  if (!f->len) return SQLITE_OK;
  int len = f->len;
  f->len = 0;
  return write_down(f, f->buf, len, f->off);
}

static int be32(const unsigned char *b) { return (int)((unsigned)b[0] << 24 | b[1] << 16 | b[2] << 8 | b[3]); }

/* A frame header is 24 bytes at a frame's start: a 24-byte piece of a page that
 * synchronous=FULL splits at its sync point is not one. The page size is in the WAL
 * header, written by this file or (a WAL that existed before) read back once. */
static int frame_header(gfile_t *f, int amt, sqlite3_int64 off)
{
  if (amt != FRAME_HDR) return 0;
  if (!f->pgsz) {
    unsigned char h[WAL_HDR];
    f->pgsz = f->real->pMethods->xRead(f->real, h, WAL_HDR, 0) == SQLITE_OK ? be32(h + 8) : 0;
    if (f->pgsz <= 0) f->pgsz = -1;   /* read once, not at every header */
  }
  if (f->pgsz <= 0) return 1;
  return off >= WAL_HDR && (off - WAL_HDR) % (f->pgsz + FRAME_HDR) == 0;
}

/* Bytes 4-7 of a frame header: the database size after a commit, 0 in other frames. */
static int commit_header(const void *p)
{
  const unsigned char *h = p;
  return (h[4] | h[5] | h[6] | h[7]) != 0;
}

static int g_write(sqlite3_file *file, const void *p, int amt, sqlite3_int64 off)
{
  gfile_t *f = (gfile_t *)file;
  atomic_fetch_add_explicit(&n_asked, 1, memory_order_relaxed);
  if (off == 0 && amt >= WAL_HDR) f->pgsz = be32((const unsigned char *)p + 8);   /* a new WAL header */
  if (!f->peer && (f->peer = writer_of(f)) != NULL) f->peer->peer = f;
  if (!f->peer) {   /* not under a write lock this file can see (exclusive mode): as it comes */
    int rc = flush(f);
    return rc != SQLITE_OK ? rc : write_down(f, p, amt, off);
  }
  if (frame_header(f, amt, off)) f->through = commit_header(p);
  int contiguous = f->len && off == f->off + f->len && f->len + amt <= GATHER_CAP;
  if (!contiguous) {
    int rc = flush(f);
    if (rc != SQLITE_OK) return rc;
  }
  if (!f->buf && amt < GATHER_CAP) f->buf = malloc(GATHER_CAP);   /* no memory: write through */
  if (!f->buf || amt >= GATHER_CAP) return write_down(f, p, amt, off);
  if (!f->len) f->off = off;
  memcpy(f->buf + f->len, p, (size_t)amt);
  f->len += amt;
  return f->through ? flush(f) : SQLITE_OK;
}

static int g_read(sqlite3_file *file, void *p, int amt, sqlite3_int64 off)
{
  gfile_t *f = (gfile_t *)file;
  int rc = flush(f);
  return rc != SQLITE_OK ? rc : f->real->pMethods->xRead(f->real, p, amt, off);
}

/* Nothing committed is ever left in the buffer (a commit goes down at its commit frame):
 * what is left is a transaction's that did not commit, and is dropped. */
static int g_close(sqlite3_file *file)
{
  gfile_t *f = (gfile_t *)file;
  atomic_fetch_add_explicit(&n_dropped, (uint64_t)f->len, memory_order_relaxed);
  free(f->buf);
  f->buf = NULL;
  f->len = 0;
  if (f->peer) f->peer->peer = NULL;
  return f->real->pMethods->xClose(f->real);
}

static int g_truncate(sqlite3_file *file, sqlite3_int64 size)
{
  gfile_t *f = (gfile_t *)file;
  int rc = flush(f);
  return rc != SQLITE_OK ? rc : f->real->pMethods->xTruncate(f->real, size);
}

static int g_sync(sqlite3_file *file, int flags)
{
  gfile_t *f = (gfile_t *)file;
  int rc = flush(f);
  return rc != SQLITE_OK ? rc : f->real->pMethods->xSync(f->real, flags);
}

static int g_size(sqlite3_file *file, sqlite3_int64 *size)
{
  gfile_t *f = (gfile_t *)file;
  int rc = flush(f);
  return rc != SQLITE_OK ? rc : f->real->pMethods->xFileSize(f->real, size);
}

/* The rest is the file below's own. */
#define REAL(file) (((gfile_t *)(file))->real)
static int g_lock(sqlite3_file *file, int l) { return REAL(file)->pMethods->xLock(REAL(file), l); }
static int g_unlock(sqlite3_file *file, int l) { return REAL(file)->pMethods->xUnlock(REAL(file), l); }
static int g_check_lock(sqlite3_file *file, int *out)
{
  return REAL(file)->pMethods->xCheckReservedLock(REAL(file), out);
}
static int g_fcntl(sqlite3_file *file, int op, void *arg)
{
  return REAL(file)->pMethods->xFileControl(REAL(file), op, arg);
}
static int g_sector(sqlite3_file *file) { return REAL(file)->pMethods->xSectorSize(REAL(file)); }
static int g_device(sqlite3_file *file) { return REAL(file)->pMethods->xDeviceCharacteristics(REAL(file)); }
static int g_shm_map(sqlite3_file *file, int pg, int sz, int extend, void volatile **out)
{
  return REAL(file)->pMethods->xShmMap(REAL(file), pg, sz, extend, out);
}
static int g_shm_lock(sqlite3_file *file, int ofs, int n, int flags)
{
  return REAL(file)->pMethods->xShmLock(REAL(file), ofs, n, flags);
}

/* A database: its file below's, and the WAL write lock watched (see gfile_t.peer). */
static int m_write(sqlite3_file *file, const void *p, int amt, sqlite3_int64 off)
{
  return REAL(file)->pMethods->xWrite(REAL(file), p, amt, off);
}

static int m_shm_lock(sqlite3_file *file, int ofs, int n, int flags)
{
  gfile_t *m = (gfile_t *)file;
  int rc = m->real->pMethods->xShmLock(m->real, ofs, n, flags);
  if (rc != SQLITE_OK || ofs != WAL_WRITE_LOCK || n != 1 || !(flags & SQLITE_SHM_EXCLUSIVE)) return rc;
  if (flags & SQLITE_SHM_LOCK) {
    if (nwriters < MAX_WRITERS) writers[nwriters++] = m;
  } else {
    writer_forget(m);
    if (m->peer && m->peer->len) {   /* a transaction's frames that did not commit */
      atomic_fetch_add_explicit(&n_dropped, (uint64_t)m->peer->len, memory_order_relaxed);
      m->peer->len = 0;
    }
  }
  return rc;
}

static int m_close(sqlite3_file *file)
{
  gfile_t *m = (gfile_t *)file;
  writer_forget(m);
  if (m->peer) m->peer->peer = NULL;
  return m->real->pMethods->xClose(m->real);
}
static void g_shm_barrier(sqlite3_file *file) { REAL(file)->pMethods->xShmBarrier(REAL(file)); }
static int g_shm_unmap(sqlite3_file *file, int del) { return REAL(file)->pMethods->xShmUnmap(REAL(file), del); }
static int g_fetch(sqlite3_file *file, sqlite3_int64 off, int amt, void **out)
{
  return REAL(file)->pMethods->xFetch(REAL(file), off, amt, out);
}
static int g_unfetch(sqlite3_file *file, sqlite3_int64 off, void *p)
{
  return REAL(file)->pMethods->xUnfetch(REAL(file), off, p);
}

/* WAL files and databases are wrapped; every other file (journals, temporary files) is
 * opened by the VFS below straight into sqlite's allocation (large enough for ours). */
static int g_open(sqlite3_vfs *vfs, const char *name, sqlite3_file *file, int flags, int *out_flags)
{
  (void)vfs;
  int wal = (flags & SQLITE_OPEN_WAL) != 0;
  if ((!wal && !(flags & SQLITE_OPEN_MAIN_DB)) || !name) return below->xOpen(below, name, file, flags, out_flags);
  gfile_t *f = (gfile_t *)file;
  memset(f, 0, sizeof *f);
  f->name = name;
  f->real = (sqlite3_file *)(f + 1);
  int rc = below->xOpen(below, name, f->real, flags, out_flags);
  if (rc != SQLITE_OK) {
    f->base.pMethods = NULL;   /* sqlite closes nothing that did not open */
    return rc;
  }
  f->base.pMethods = wal ? &gather_io : &main_io;
  return SQLITE_OK;
}

static int v_delete(sqlite3_vfs *v, const char *name, int sync)
{
  (void)v;
  return below->xDelete(below, name, sync);
}
static int v_access(sqlite3_vfs *v, const char *name, int flags, int *out)
{
  (void)v;
  return below->xAccess(below, name, flags, out);
}
static int v_full(sqlite3_vfs *v, const char *name, int n, char *out)
{
  (void)v;
  return below->xFullPathname(below, name, n, out);
}
static void *v_dlopen(sqlite3_vfs *v, const char *name)
{
  (void)v;
  return below->xDlOpen(below, name);
}
static void v_dlerror(sqlite3_vfs *v, int n, char *out)
{
  (void)v;
  below->xDlError(below, n, out);
}
static void (*v_dlsym(sqlite3_vfs *v, void *h, const char *sym))(void)
{
  (void)v;
  return below->xDlSym(below, h, sym);
}
static void v_dlclose(sqlite3_vfs *v, void *h)
{
  (void)v;
  below->xDlClose(below, h);
}
static int v_random(sqlite3_vfs *v, int n, char *out)
{
  (void)v;
  return below->xRandomness(below, n, out);
}
static int v_sleep(sqlite3_vfs *v, int us)
{
  (void)v;
  return below->xSleep(below, us);
}
static int v_time(sqlite3_vfs *v, double *out)
{
  (void)v;
  return below->xCurrentTime(below, out);
}
static int v_lasterr(sqlite3_vfs *v, int n, char *out)
{
  (void)v;
  return below->xGetLastError ? below->xGetLastError(below, n, out) : 0;
}
static int v_time64(sqlite3_vfs *v, sqlite3_int64 *out)
{
  (void)v;
  return below->xCurrentTimeInt64(below, out);
}

static int install_rc = NH_EFAIL;
static pthread_once_t install_once = PTHREAD_ONCE_INIT;

static void install(void)
{
  below = sqlite3_vfs_find(NULL);
  if (!below || below->iVersion < 2) return;
  /* Version 3 as the unix VFS's files; sqlite asks a WAL file for no xShm or xFetch. */
  gather_io = (sqlite3_io_methods){
    3, g_close, g_read, g_write, g_truncate, g_sync, g_size, g_lock, g_unlock, g_check_lock, g_fcntl,
    g_sector, g_device, g_shm_map, g_shm_lock, g_shm_barrier, g_shm_unmap, g_fetch, g_unfetch,
  };
  main_io = gather_io;
  main_io.xClose = m_close;
  main_io.xWrite = m_write;
  main_io.xShmLock = m_shm_lock;
  gather_vfs = (sqlite3_vfs){
    .iVersion = 2,
    .szOsFile = (int)sizeof(gfile_t) + below->szOsFile,
    .mxPathname = below->mxPathname,
    .zName = "nh-gather",
    .xOpen = g_open,
    .xDelete = v_delete,
    .xAccess = v_access,
    .xFullPathname = v_full,
    .xDlOpen = v_dlopen,
    .xDlError = v_dlerror,
    .xDlSym = v_dlsym,
    .xDlClose = v_dlclose,
    .xRandomness = v_random,
    .xSleep = v_sleep,
    .xCurrentTime = v_time,
    .xGetLastError = v_lasterr,
    .xCurrentTimeInt64 = v_time64,
  };
  if (sqlite3_vfs_register(&gather_vfs, 1) == SQLITE_OK) install_rc = NH_OK;
}

int nh_sqlite_vfs_install(void)
{
  pthread_once(&install_once, install);
  return install_rc;
}

void nh_sqlite_vfs_counts(uint64_t *asked, uint64_t *done)
{
  if (asked) *asked = atomic_load_explicit(&n_asked, memory_order_relaxed);
  if (done) *done = atomic_load_explicit(&n_done, memory_order_relaxed);
}

uint64_t nh_sqlite_vfs_dropped(void) { return atomic_load_explicit(&n_dropped, memory_order_relaxed); }
