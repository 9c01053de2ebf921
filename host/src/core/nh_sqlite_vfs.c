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

typedef struct gfile {
  sqlite3_file base;       /* methods: gather_io */
  sqlite3_file *real;      /* the default VFS's file, in the same allocation after this */
  unsigned char *buf;
  sqlite3_int64 off;       /* file offset of buf[0] */
  int len;
  /* A commit frame's header was written: it and every write until the next transaction's
   * first (non-commit) frame header go down at once. That covers the commit frame's page,
   * the padding frames and split writes synchronous=FULL adds around its sync point, and a
   * commit header whose checksum sqlite rewrites after the frame (walRewriteChecksums). */
  int through;
} gfile_t;

static sqlite3_vfs gather_vfs;
static sqlite3_vfs *below;
static sqlite3_io_methods gather_io;
static _Atomic uint64_t n_asked, n_done;

static int flush(gfile_t *f)
{
  if (!f->len) return SQLITE_OK;
  int len = f->len;
  f->len = 0;
  atomic_fetch_add_explicit(&n_done, 1, memory_order_relaxed);
  return f->real->pMethods->xWrite(f->real, f->buf, len, f->off);
}

static int write_down(gfile_t *f, const void *p, int amt, sqlite3_int64 off)
{
  atomic_fetch_add_explicit(&n_done, 1, memory_order_relaxed);
  return f->real->pMethods->xWrite(f->real, p, amt, off);
}

/* Bytes 4-7 of a frame header: the database size after a commit, 0 in other frames. */
static int commit_header(const void *p, int amt)
{
  const unsigned char *h = p;
  return amt == FRAME_HDR && (h[4] | h[5] | h[6] | h[7]) != 0;
}

static int g_write(sqlite3_file *file, const void *p, int amt, sqlite3_int64 off)
{
  gfile_t *f = (gfile_t *)file;
  atomic_fetch_add_explicit(&n_asked, 1, memory_order_relaxed);
  if (amt == FRAME_HDR) f->through = commit_header(p, amt);
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

static int g_close(sqlite3_file *file)
{
  gfile_t *f = (gfile_t *)file;
  int rc = flush(f);
  free(f->buf);
  f->buf = NULL;
  int crc = f->real->pMethods->xClose(f->real);
  return rc != SQLITE_OK ? rc : crc;
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

/* Only WAL files are wrapped; every other file is opened by the VFS below straight into
 * sqlite's allocation (which is large enough for ours), so it pays nothing. */
static int g_open(sqlite3_vfs *vfs, const char *name, sqlite3_file *file, int flags, int *out_flags)
{
  (void)vfs;
  if (!(flags & SQLITE_OPEN_WAL)) return below->xOpen(below, name, file, flags, out_flags);
  gfile_t *f = (gfile_t *)file;
  memset(f, 0, sizeof *f);
  f->real = (sqlite3_file *)(f + 1);
  int rc = below->xOpen(below, name, f->real, flags, out_flags);
  if (rc != SQLITE_OK) {
    f->base.pMethods = NULL;   /* sqlite closes nothing that did not open */
    return rc;
  }
  f->base.pMethods = &gather_io;
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
