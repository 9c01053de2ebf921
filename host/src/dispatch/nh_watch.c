/* Watching the adapter files for saves (nh_dispatch_watch): hot reload's trigger.
 *
 * A reload follows a save as soon as the save is complete,
 * never while a .lua file of an adapter directory is half written. On Linux the directories
 * are watched with inotify itself (libuv's uv_fs_event does not report IN_CLOSE_WRITE): a
 * rename into place or a close after writing completes a save; a file modified and still
 * open is waited for. Elsewhere (uv_fs_event) a change counts as complete once the file has
 * been quiet for NH_RELOAD_SETTLE_MS. */
#include "nh_dispatch_int.h"
#include "core/nh_log.h"
#include "core/nh_util.h"

#include <stdlib.h>
#include <string.h>

#if defined(__linux__) && !defined(NH_RELOAD_NO_INOTIFY)
#define NH_WATCH_INOTIFY 1
#include <errno.h>
#include <sys/inotify.h>
#include <unistd.h>
#else
#define NH_WATCH_INOTIFY 0
#endif

#define NH_RELOAD_QUIET_MS 5        /* completed saves closer together than this give one reload */
#define NH_RELOAD_SETTLE_MS 50      /* a file modified that nothing holds open: quiet time that ends the save */
#define NH_RELOAD_STALL_MS 5000     /* a file modified and still open: loaded as it is after this long unchanged */
#define NH_RELOAD_GRACE_MS 500      /* a load failure is reported (after a last try) this long after the last change */
#define NH_RELOAD_BURST 5           /* reloads in a row at once; while saves keep coming, then ... */
#define NH_RELOAD_REFILL_MS 200     /* ... one per this interval (what comes meanwhile is coalesced) */

/* ---------------------------------------------------------------- watching
 *
 * Events on .lua files of the adapter directories (other names: editors' swap and temp
 * files) feed a small state machine; the reload timer runs it (watch_tick):
 *   - a file modified (or created) since its last close is being written: nothing loads
 *     until it is closed after writing, renamed away or deleted. If nothing had it open
 *     (as far as IN_OPEN and the closes tell: truncate(2), or events relayed without
 *     open/close, as Docker Desktop does from a macOS host) it counts as complete after
 *     NH_RELOAD_SETTLE_MS without a change; if something has it open, after
 *     NH_RELOAD_STALL_MS (a writer that never closes). uv_fs_event reports no opens and
 *     no closes: there every event is such a write, complete after NH_RELOAD_SETTLE_MS;
 *   - a completed change (a close after writing, a rename into place, a deletion, an
 *     attribute change) loads every adapter NH_RELOAD_QUIET_MS later, so a burst of saves
 *     (several files, a checkout) gives one reload. Up to NH_RELOAD_BURST reloads follow one
 *     another at once; while saves keep coming, then one per NH_RELOAD_REFILL_MS;
 *   - the read of the files is bracketed (inotify): a change that arrived while an adapter
 *     loaded means it may have read half a save; the new VM is dropped before the swap
 *     (NH_RL_SUPERSEDED) and loaded again once the save is complete;
 *   - a file that fails to load right after a change may be the first part of a save made
 *     in two writes: the failure is held, and reported (after one last try) only if no
 *     change came for NH_RELOAD_GRACE_MS. A later successful load drops it unreported.
 * SIGHUP loads every adapter at once and reports failures at once. */

typedef struct {
  int dir;               /* index into nh_watch.dirs */
  char *name;
  int opens;             /* opens seen minus closes seen */
  int writing;           /* modified since its last close after writing, rename or deletion */
  int64_t last;          /* monotonic ms: its last change */
} nh_wfile_t;

#if !NH_WATCH_INOTIFY
typedef struct {
  uv_fs_event_t h;
  struct nh_watch *w;
  int dir;
} nh_fs_watcher_t;
#endif

struct nh_watch {
  nh_dispatch_t *d;
  char **dirs;
  int ndirs;
#if NH_WATCH_INOTIFY
  int fd;
  int *wds;              /* per dir: its inotify watch, -1 once gone */
  uv_poll_t poll;
#else
  nh_fs_watcher_t **fs;  /* per dir */
  int open_handles;
#endif
  nh_wfile_t *files;     /* open or being written; the others are forgotten */
  int nfiles;
  int changed;           /* a change not loaded yet */
  int dirty;             /* a change came since the current attempt began */
  int forced;            /* SIGHUP: load everything now */
  int64_t last_change;   /* monotonic ms */
  int64_t quiet_until;
  double tokens;         /* reloads that may start at once (at most NH_RELOAD_BURST) */
  int64_t tokens_at;
  char *held;            /* per adapter: its last load failed and is not reported yet */
  int64_t held_until;
};

static int64_t mono_ms(void) { return (int64_t)(uv_hrtime() / 1000000u); }

static int is_lua(const char *name)
{
  size_t n = strlen(name);
  return n >= 4 && strcmp(name + n - 4, ".lua") == 0;
}

static nh_wfile_t *file_get(struct nh_watch *w, int dir, const char *name)
{
  for (int k = 0; k < w->nfiles; k++)
    if (w->files[k].dir == dir && strcmp(w->files[k].name, name) == 0) return &w->files[k];
  w->files = nh_xrealloc(w->files, sizeof *w->files * (size_t)(w->nfiles + 1));
  nh_wfile_t *f = &w->files[w->nfiles++];
  memset(f, 0, sizeof *f);
  f->dir = dir;
  f->name = nh_xstrdup(name);
  return f;
}

/* forgets the files neither open nor being written */
static void files_prune(struct nh_watch *w)
{
  for (int k = 0; k < w->nfiles;) {
    if (w->files[k].opens <= 0 && !w->files[k].writing) {
      free(w->files[k].name);
      w->files[k] = w->files[--w->nfiles];
      continue;
    }
    k++;
  }
}

/* when a file being written counts as complete without a close */
static int64_t file_expiry(const nh_wfile_t *f)
{
  return f->last + (f->opens > 0 ? NH_RELOAD_STALL_MS : NH_RELOAD_SETTLE_MS);
}

static void note_change(struct nh_watch *w, int64_t now)
{
  w->changed = 1;
  w->dirty = 1;
  w->last_change = now;
  w->quiet_until = now + NH_RELOAD_QUIET_MS;
}

static void refill(struct nh_watch *w, int64_t now)
{
  w->tokens += (double)(now - w->tokens_at) / NH_RELOAD_REFILL_MS;
  if (w->tokens > NH_RELOAD_BURST) w->tokens = NH_RELOAD_BURST;
  w->tokens_at = now;
}

/* when the next reload may start (rate limit) */
static int64_t token_due(struct nh_watch *w, int64_t now)
{
  refill(w, now);
  return w->tokens >= 1 ? now : now + (int64_t)((1 - w->tokens) * NH_RELOAD_REFILL_MS) + 1;
}

#if NH_WATCH_INOTIFY

#define NH_WATCH_MASK (IN_OPEN | IN_CLOSE_NOWRITE | IN_CLOSE_WRITE | IN_MODIFY | IN_CREATE | IN_MOVED_TO | \
                       IN_MOVED_FROM | IN_DELETE | IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF)

static void on_inotify(struct nh_watch *w, const struct inotify_event *ev, int64_t now)
{
  if (ev->mask & IN_Q_OVERFLOW) {   /* events were lost: assume a change, let it settle */
    for (int k = 0; k < w->nfiles; k++) w->files[k].opens = 0;
    note_change(w, now);
    w->quiet_until = now + NH_RELOAD_SETTLE_MS;
    files_prune(w);
    return;
  }
  int dir = -1;
  for (int i = 0; i < w->ndirs && dir < 0; i++)
    if (w->wds[i] == ev->wd) dir = i;
  if (dir < 0) return;
  if (ev->mask & IN_IGNORED) {
    nh_log_warn("reload", "%s is gone: its adapters are no longer watched for changes", w->dirs[dir]);
    w->wds[dir] = -1;
    return;
  }
  if (ev->mask & (IN_DELETE_SELF | IN_MOVE_SELF)) {   /* its adapters fail to load: reported */
    note_change(w, now);
    return;
  }
  if (!ev->len || (ev->mask & IN_ISDIR) || !is_lua(ev->name)) return;
  nh_wfile_t *f = file_get(w, dir, ev->name);
  if (ev->mask & IN_OPEN) {   /* a reader (this host loading it, too) or a writer: no change yet */
    f->opens++;
  } else if (ev->mask & IN_CLOSE_NOWRITE) {
    f->opens--;
  } else {
    if (ev->mask & IN_CLOSE_WRITE) {   /* a save in place is complete */
      f->opens--;
      f->writing = 0;
    } else if (ev->mask & (IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE)) {   /* another file, or none, by this name */
      f->opens = 0;
      f->writing = 0;
    } else if (ev->mask & (IN_MODIFY | IN_CREATE)) {
      f->writing = 1;   /* IN_CREATE: IN_OPEN comes with it, unless it is a link (then IN_CLOSE_WRITE never comes) */
    }
    /* IN_ATTRIB (touch, chmod): a change that ends no write */
    f->last = now;
    note_change(w, now);
  }
  files_prune(w);
}

/* Takes in the events queued so far; never blocks. */
static void watch_drain(struct nh_watch *w)
{
  if (w->fd < 0) return;
  char buf[8192] __attribute__((aligned(__alignof__(struct inotify_event))));
  for (;;) {
    ssize_t n = read(w->fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
        nh_log_warn("reload", "watching adapters failed: %s", strerror(errno));
      return;
    }
    int64_t now = mono_ms();
    for (char *p = buf; p < buf + n;) {
      const struct inotify_event *ev = (const struct inotify_event *)p;
      p += sizeof *ev + ev->len;
      on_inotify(w, ev, now);
    }
  }
}

#else

static void watch_drain(struct nh_watch *w) { (void)w; }   /* uv_fs_event delivers on the loop only */

#endif

/* from here on, a change makes what is loading superseded */
void nh_dispatch_reload_begins(nh_dispatch_t *d)
{
  if (d->watch) d->watch->dirty = 0;
}

int nh_dispatch_reload_superseded(nh_dispatch_t *d)
{
  struct nh_watch *w = d->watch;
  if (!w) return 0;
  watch_drain(w);
  return w->dirty;
}

static void watch_tick(uv_timer_t *h);

/* the earliest expiry of the files being written, -1: none */
static int64_t writing_due(struct nh_watch *w)
{
  int64_t due = -1;
  for (int k = 0; k < w->nfiles; k++)
    if (w->files[k].writing && (due < 0 || file_expiry(&w->files[k]) < due)) due = file_expiry(&w->files[k]);
  return due;
}

/* Arms the reload timer for what is due next, or stops it. */
static void watch_schedule(nh_dispatch_t *d)
{
  struct nh_watch *w = d->watch;
  if (!w || d->stopping) return;
  int64_t now = mono_ms(), due = -1;
  if (w->forced) {
    due = now;
  } else if (w->changed && writing_due(w) >= 0) {
    due = writing_due(w);   /* a close comes as an event: this is when none came */
  } else if (w->changed) {
    due = token_due(w, now);
    if (w->quiet_until > due) due = w->quiet_until;
  } else {
    for (int i = 0; i < d->nadapters && due < 0; i++)
      if (w->held[i]) due = w->held_until;
  }
  if (due < 0) {
    uv_timer_stop(&d->reload_timer);
    return;
  }
  uv_timer_start(&d->reload_timer, watch_tick, (uint64_t)(due > now ? due - now : 0), 0);
}

/* One round of loads. report = 0: a failure is held (see above); held_only: only the
 * adapters whose failure is held (their last try). */
static void watch_attempt(nh_dispatch_t *d, int report, int held_only)
{
  struct nh_watch *w = d->watch;
  nh_dispatch_reload_begins(d);
  for (int i = 0; i < d->nadapters; i++) {
    if (held_only && !w->held[i]) continue;
    nh_error_t e = {0};
    int rc = nh_dispatch_reload_adapter(d, i, report, &e);
    if (rc == NH_RL_SUPERSEDED) {   /* w->changed is set again: the rest loads at the next attempt */
      nh_log_debug("reload", "%s changed while it was loading; loading it again once the save is complete",
                   d->adapters[i].path);
      break;
    }
    w->held[i] = rc == NH_RL_FAILED && !report;
    if (w->held[i])
      nh_log_debug("reload", "%s did not load (%s); trying it again before reporting, in case it was half written",
                   d->adapters[i].path, e.msg);
  }
  w->held_until = w->last_change + NH_RELOAD_GRACE_MS;
  nh_dispatch_close_retired(d, 0);
}

static void watch_tick(uv_timer_t *h)
{
  nh_dispatch_t *d = h->data;
  struct nh_watch *w = d->watch;
  if (d->stopping || !w) return;
  watch_drain(w);
  int64_t now = mono_ms();
  for (int k = 0; k < w->nfiles; k++) {
    nh_wfile_t *f = &w->files[k];
    if (f->writing && file_expiry(f) <= now) {
      nh_log_debug("reload", "%s/%s: no close after its last change (%s open); taking it as complete",
                   w->dirs[f->dir], f->name, f->opens > 0 ? "still" : "not");
      f->writing = 0;
    }
  }
  files_prune(w);
  if (w->forced) {
    w->forced = 0;
    w->changed = 0;
    watch_attempt(d, 1, 0);
  } else if (w->changed) {
    if (writing_due(w) < 0 && now >= w->quiet_until && token_due(w, now) <= now) {
      w->tokens -= 1;
      w->changed = 0;
      watch_attempt(d, 0, 0);
    }
  } else if (now >= w->held_until && memchr(w->held, 1, (size_t)d->nadapters)) {
    watch_attempt(d, 1, 1);   /* no change since the failure: its last try, reported */
  }
  watch_schedule(d);
}

static void reload_timer_cb(uv_timer_t *h)
{
  nh_dispatch_t *d = h->data;
  if (d->stopping) return;
  nh_dispatch_reload(d, -1, NULL);
}

void nh_dispatch_request_reload(nh_dispatch_t *d)
{
  if (d->stopping) return;
  if (d->watch) {
    d->watch->forced = 1;
    watch_schedule(d);
  } else {
    uv_timer_start(&d->reload_timer, reload_timer_cb, 0, 0);   /* signals in a row: one reload */
  }
}

static char *dir_of(const char *path)
{
  char *dir = nh_xstrdup(path);
  char *slash = strrchr(dir, '/');
  if (!slash) strcpy(dir, ".");
  else if (slash == dir) dir[1] = '\0';
  else *slash = '\0';
  return dir;
}

static void watch_free(struct nh_watch *w)
{
  for (int i = 0; i < w->ndirs; i++) free(w->dirs[i]);
  free(w->dirs);
  for (int k = 0; k < w->nfiles; k++) free(w->files[k].name);
  free(w->files);
  free(w->held);
#if NH_WATCH_INOTIFY
  free(w->wds);
#else
  free(w->fs);
#endif
  free(w);
}

#if NH_WATCH_INOTIFY

static void poll_cb(uv_poll_t *h, int status, int events)
{
  (void)events;
  struct nh_watch *w = h->data;
  if (status < 0) nh_log_warn("reload", "watching adapters failed: %s", uv_strerror(status));
  watch_drain(w);
  watch_schedule(w->d);
}

static void poll_closed(uv_handle_t *h)
{
  struct nh_watch *w = h->data;
  close(w->fd);
  watch_free(w);
}

/* On failure w is freed. */
static int watch_start(struct nh_watch *w, nh_error_t *err)
{
  const char *what = w->dirs[0];
  int rc = 0;
  w->fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (w->fd < 0) rc = uv_translate_sys_error(errno);
  w->wds = nh_xcalloc((size_t)w->ndirs, sizeof *w->wds);
  for (int i = 0; i < w->ndirs && !rc; i++) {
    w->wds[i] = inotify_add_watch(w->fd, w->dirs[i], NH_WATCH_MASK);
    if (w->wds[i] < 0) {
      what = w->dirs[i];
      rc = uv_translate_sys_error(errno);
    }
  }
  if (!rc) rc = uv_poll_init(w->d->loop, &w->poll, w->fd);
  if (rc) {
    nh_error_set(err, NH_EFAIL, "cannot watch %s for changes: %s (use --no-reload)", what, uv_strerror(rc));
    if (w->fd >= 0) close(w->fd);
    watch_free(w);
    return NH_EFAIL;
  }
  w->poll.data = w;
  rc = uv_poll_start(&w->poll, UV_READABLE, poll_cb);
  if (rc) {
    nh_error_set(err, NH_EFAIL, "cannot watch %s for changes: %s (use --no-reload)", what, uv_strerror(rc));
    uv_close((uv_handle_t *)&w->poll, poll_closed);   /* closes the descriptor, frees w */
    return NH_EFAIL;
  }
  return NH_OK;
}

static void watch_stop(struct nh_watch *w)
{
  uv_poll_stop(&w->poll);
  uv_close((uv_handle_t *)&w->poll, poll_closed);
}

#else

static void fs_event_cb(uv_fs_event_t *h, const char *filename, int events, int status)
{
  (void)events;
  nh_fs_watcher_t *fw = (nh_fs_watcher_t *)h;
  struct nh_watch *w = fw->w;
  if (status < 0) {
    nh_log_warn("reload", "watching adapters failed: %s", uv_strerror(status));
    return;
  }
  /* editors save by rename and leave swap files behind: only .lua files count */
  if (filename && !is_lua(filename)) return;
  int64_t now = mono_ms();
  /* no open or close events here: any event may be part of a write, complete once quiet */
  nh_wfile_t *f = file_get(w, fw->dir, filename ? filename : "");
  f->writing = 1;
  f->last = now;
  note_change(w, now);
  watch_schedule(w->d);
}

static void fs_closed(uv_handle_t *h)
{
  nh_fs_watcher_t *fw = (nh_fs_watcher_t *)h;
  struct nh_watch *w = fw->w;
  free(fw);
  if (--w->open_handles == 0) watch_free(w);
}

static void watch_stop(struct nh_watch *w)
{
  int n = w->open_handles;
  if (!n) {
    watch_free(w);
    return;
  }
  for (int i = 0; i < w->ndirs; i++) {
    if (!w->fs[i]) continue;
    uv_fs_event_stop(&w->fs[i]->h);
    uv_close((uv_handle_t *)&w->fs[i]->h, fs_closed);   /* the last one frees w */
  }
}

static int watch_start(struct nh_watch *w, nh_error_t *err)
{
  w->fs = nh_xcalloc((size_t)w->ndirs, sizeof *w->fs);
  for (int i = 0; i < w->ndirs; i++) {
    nh_fs_watcher_t *fw = nh_xcalloc(1, sizeof *fw);
    fw->w = w;
    fw->dir = i;
    uv_fs_event_init(w->d->loop, &fw->h);
    w->fs[i] = fw;
    w->open_handles++;
    int rc = uv_fs_event_start(&fw->h, fs_event_cb, w->dirs[i], 0);
    if (rc) {
      nh_error_set(err, NH_EFAIL, "cannot watch %s for changes: %s (use --no-reload)", w->dirs[i], uv_strerror(rc));
      watch_stop(w);   /* frees w */
      return NH_EFAIL;
    }
  }
  return NH_OK;
}

#endif

int nh_dispatch_watch(nh_dispatch_t *d, nh_error_t *err)
{
  struct nh_watch *w = nh_xcalloc(1, sizeof *w);
  w->d = d;
  w->dirs = nh_xcalloc((size_t)d->nadapters + 1, sizeof *w->dirs);
  for (int i = 0; i < d->nadapters; i++) {
    char *dir = dir_of(d->adapters[i].path);
    int dup = 0;
    for (int j = 0; j < w->ndirs && !dup; j++) dup = strcmp(dir, w->dirs[j]) == 0;
    if (dup) free(dir);
    else w->dirs[w->ndirs++] = dir;
  }
  w->held = nh_xcalloc((size_t)d->nadapters + 1, 1);
  w->tokens = NH_RELOAD_BURST;
  w->tokens_at = mono_ms();
#if NH_WATCH_INOTIFY
  w->fd = -1;
#endif
  if (!w->ndirs) {
    watch_free(w);
    return NH_OK;
  }
  if (watch_start(w, err)) return NH_EFAIL;   /* w is freed */
  d->watch = w;
  return NH_OK;
}

void nh_dispatch_unwatch(nh_dispatch_t *d)
{
  struct nh_watch *w = d->watch;
  if (!w) return;
  d->watch = NULL;
  watch_stop(w);
}
