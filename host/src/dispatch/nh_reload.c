/* Hot reload: VM generations. A reload builds a complete new VM per adapter file and
 * loads the adapter there; on any load error the running VM keeps serving and the error
 * is logged with file and line. On success the endpoints move to the new VM: new
 * messages go there, while tasks already running finish on the old one, which is closed
 * once its last task ends (or at a drain deadline). Per-session order holds across the
 * swap because a session's next message is only dispatched after the previous one is
 * settled. Status checkers of the old generation stop at the swap; HTTP servers of the
 * new one bind beside the old ones (SO_REUSEPORT), so no listening socket is dropped. */
#include "nh_dispatch_int.h"
#include "core/nh_log.h"
#include "core/nh_util.h"

#include <stdlib.h>
#include <string.h>

#define NH_RELOAD_DEBOUNCE_MS 200
#define NH_RETIRE_DEADLINE_MS 60000

int nh_dispatch_subscribe_all(nh_dispatch_t *d, nh_error_t *err)
{
  if (nh_store_begin(d->store)) return nh_error_set(err, NH_EFAIL, "store: %s", nh_store_errmsg(d->store));
  for (nh_endpoint_t *ep = d->endpoints; ep; ep = ep->next) {
    if (ep->retired) continue;
    if (ep->lock_ms < d->tr->lock_ms || ep == d->endpoints) d->tr->lock_ms = ep->lock_ms;
    if (d->tr->vt->subscribe(d->tr, ep->name, (const char *const *)ep->types, ep->commands, ep->ntypes, err)) {
      nh_store_rollback(d->store);
      return NH_EFAIL;
    }
    if (d->tr->vt->set_capacity) d->tr->vt->set_capacity(d->tr, ep->name, ep->concurrency);
  }
  /* this process's reply queue: a broker transport declares and consumes it */
  if (!d->started && d->tr->vt->subscribe(d->tr, d->reply_ep, NULL, NULL, 0, err)) {
    nh_store_rollback(d->store);
    return NH_EFAIL;
  }
  if (nh_store_commit(d->store)) return nh_error_set(err, NH_EFAIL, "store: cannot commit subscriptions");
  if (d->started) nh_dispatch_renew_start(d);   /* a reload may have shortened the lock */
  return NH_OK;
}

/* Moves the settings of a freshly registered endpoint into the live one of that name,
 * so jobs in flight keep a valid pointer. */
static void adopt(nh_endpoint_t *live, nh_endpoint_t *fresh)
{
  live->vm = fresh->vm;
  live->concurrency = fresh->concurrency;
  live->inbox = fresh->inbox;
  live->lock_ms = fresh->lock_ms;
  live->renew_max_ms = fresh->renew_max_ms;
  live->timeout_s = fresh->timeout_s;
  live->cpu_budget_s = fresh->cpu_budget_s;
  nh_retry_config_free(&live->retry);
  live->retry = fresh->retry;
  memset(&fresh->retry, 0, sizeof fresh->retry);
  for (int i = 0; i < live->ntypes; i++) free(live->types[i]);
  free(live->types);
  free(live->commands);
  live->types = fresh->types;
  live->commands = fresh->commands;
  live->ntypes = fresh->ntypes;
  fresh->types = NULL;
  fresh->commands = NULL;
  fresh->ntypes = 0;
  live->retired = 0;
  nh_endpoint_free(fresh);
}

static void retire(nh_dispatch_t *d, nh_vm_t *old)
{
  nh_vm_stop_timers(old);   /* its status checkers: the new generation runs its own */
  d->retiring = nh_xrealloc(d->retiring, sizeof *d->retiring * (size_t)(d->nretiring + 1));
  d->retiring[d->nretiring++] = old;
  nh_vm_set_deadline(old, nh_time_now_ms() + NH_RETIRE_DEADLINE_MS);
}

/* The endpoints a refused generation registered. */
static void drop_pending(nh_dispatch_t *d)
{
  while (d->pending_eps) {
    nh_endpoint_t *ep = d->pending_eps;
    d->pending_eps = ep->next;
    nh_endpoint_free(ep);
  }
}

static int check_subscriptions(nh_dispatch_t *d, nh_adapter_t *a, nh_error_t *err)
{
  if (!d->tr->vt->subscribe_check) return NH_OK;
  int n = 0;
  for (nh_endpoint_t *ep = d->endpoints; ep; ep = ep->next) n++;
  for (nh_endpoint_t *ep = d->pending_eps; ep; ep = ep->next) n++;
  const char **replacing = nh_xcalloc((size_t)n + 1, sizeof *replacing);
  int k = 0;
  for (nh_endpoint_t *ep = d->endpoints; ep; ep = ep->next)
    if (ep->vm == a->vm) replacing[k++] = ep->name;
  for (nh_endpoint_t *ep = d->pending_eps; ep; ep = ep->next) replacing[k++] = ep->name;
  int rc = NH_OK;
  for (nh_endpoint_t *ep = d->pending_eps; ep && rc == NH_OK; ep = ep->next) {
    nh_error_t cerr = {0};
    rc = d->tr->vt->subscribe_check(d->tr, ep->name, (const char *const *)ep->types, ep->commands, ep->ntypes,
                                    replacing, k, &cerr);
    if (rc) nh_error_set(err, NH_EUSAGE, "%s: endpoint %s: %s", a->path, ep->name, cerr.msg);
  }
  free(replacing);
  return rc;
}

static int reload_one(nh_dispatch_t *d, nh_adapter_t *a, nh_error_t *err)
{
  nh_vm_host_t host;
  d->reloading = a->vm;
  nh_vm_t *vm = nh_vm_init(d->loop, a->path, d->lua_dir, nh_dispatch_vm_host(d, &host), err);
  if (vm && nh_vm_subscriptions(vm, nh_dispatch_collect_types, d, err)) {
    nh_vm_close(vm);
    vm = NULL;
  }
  d->reloading = NULL;
  if (!vm || !d->pending_eps) {
    if (vm) {
      nh_error_set(err, NH_EUSAGE, "%s defines no endpoint", a->path);
      nh_vm_close(vm);
    }
    drop_pending(d);
    return NH_EFAIL;
  }
  /* Validate, then swap (Fluent Bit's rule): a subscription the store would refuse (a
   * command another endpoint consumes) refuses the reload; the old generation keeps
   * serving with its subscriptions untouched. */
  if (check_subscriptions(d, a, err)) {
    nh_vm_close(vm);
    drop_pending(d);
    return NH_EFAIL;
  }
  /* swap: endpoints of the old generation not defined any more stop taking work */
  for (nh_endpoint_t *ep = d->endpoints; ep; ep = ep->next)
    if (ep->vm == a->vm) ep->retired = 1;
  while (d->pending_eps) {
    nh_endpoint_t *fresh = d->pending_eps;
    d->pending_eps = fresh->next;
    nh_endpoint_t *live = NULL;
    for (nh_endpoint_t *ep = d->endpoints; ep; ep = ep->next)
      if (strcmp(ep->name, fresh->name) == 0) live = ep;
    if (live) {
      adopt(live, fresh);
    } else {
      fresh->next = d->endpoints;
      d->endpoints = fresh;
    }
  }
  for (nh_endpoint_t *ep = d->endpoints; ep; ep = ep->next)
    if (ep->retired && ep->vm == a->vm)
      nh_log_warn("reload", "endpoint %s is no longer defined by %s; it takes no new work", ep->name, a->path);
  nh_vm_t *old = a->vm;
  a->vm = vm;
  retire(d, old);
  nh_error_t serr = {0};
  if (nh_dispatch_subscribe_all(d, &serr))
    nh_log_error("reload", "%s reloaded, but its subscriptions could not be stored (%s); new event types get "
                 "no messages until the next reload", a->path, serr.msg);
  if (d->started) nh_dispatch_presence_update(d);   /* the endpoint list may have changed */
  return NH_OK;
}

int nh_dispatch_reload(nh_dispatch_t *d, int which, nh_error_t *err)
{
  int failures = 0;
  for (int i = 0; i < d->nadapters; i++) {
    if (which >= 0 && i != which) continue;
    nh_error_t e = {0};
    uint64_t t0 = uv_hrtime();
    if (reload_one(d, &d->adapters[i], &e)) {
      failures++;
      d->reload_failures++;
      nh_log_error("reload", "reload of %s failed; the running version keeps serving:\n  %s", d->adapters[i].path,
                   e.msg);
      if (err) *err = e;
    } else {
      d->reloads++;
      nh_log_info("reload", "reloaded %s in %.1f ms (generation %llu)", d->adapters[i].path,
                  (double)(uv_hrtime() - t0) / 1e6, (unsigned long long)d->reloads);
    }
  }
  nh_dispatch_close_retired(d, 0);
  return failures ? NH_EFAIL : NH_OK;
}

void nh_dispatch_close_retired(nh_dispatch_t *d, int force)
{
  int64_t now = nh_time_now_ms();
  for (int i = 0; i < d->nretiring;) {
    nh_vm_t *vm = d->retiring[i];
    int past = now >= nh_vm_deadline(vm);
    if (force || past || nh_vm_live_tasks(vm) == 0) {
      if (!force && past && nh_vm_live_tasks(vm) > 0)
        nh_log_warn("reload", "old generation of %s still has %d task(s) after the drain deadline; cancelling them",
                    nh_vm_path(vm), nh_vm_live_tasks(vm));
      d->retiring[i] = d->retiring[--d->nretiring];
      for (nh_endpoint_t *ep = d->endpoints; ep; ep = ep->next)
        if (ep->vm == vm) ep->vm = NULL;   /* a dropped endpoint: nothing points at the closed VM */
      nh_vm_close(vm);   /* cancels what is left: those messages are delivered again */
      continue;
    }
    i++;
  }
}

/* ---------------------------------------------------------------- watching */

static void reload_timer_cb(uv_timer_t *h)
{
  nh_dispatch_t *d = h->data;
  if (d->stopping) return;
  nh_dispatch_reload(d, -1, NULL);
}

void nh_dispatch_request_reload(nh_dispatch_t *d)
{
  if (d->stopping) return;
  /* restarting the timer on every event coalesces a burst of saves into one reload */
  uv_timer_start(&d->reload_timer, reload_timer_cb, NH_RELOAD_DEBOUNCE_MS, 0);
}

static void fs_event_cb(uv_fs_event_t *h, const char *filename, int events, int status)
{
  (void)events;
  nh_dispatch_t *d = h->data;
  if (status < 0) {
    nh_log_warn("reload", "watching adapters failed: %s", uv_strerror(status));
    return;
  }
  size_t n = filename ? strlen(filename) : 0;
  /* editors save by rename and leave swap files behind: only .lua files count */
  if (filename && (n < 4 || strcmp(filename + n - 4, ".lua") != 0)) return;
  nh_dispatch_request_reload(d);
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

static void watcher_closed(uv_handle_t *h) { free(h); }

int nh_dispatch_watch(nh_dispatch_t *d, nh_error_t *err)
{
  d->watchers = nh_xcalloc((size_t)d->nadapters, sizeof *d->watchers);
  for (int i = 0; i < d->nadapters; i++) {
    char *dir = dir_of(d->adapters[i].path);
    int dup = 0;
    for (int j = 0; j < i && !dup; j++) {
      char *other = dir_of(d->adapters[j].path);
      dup = strcmp(dir, other) == 0;
      free(other);
    }
    if (!dup) {
      uv_fs_event_t *w = nh_xcalloc(1, sizeof *w);
      uv_fs_event_init(d->loop, w);
      w->data = d;
      int rc = uv_fs_event_start(w, fs_event_cb, dir, 0);
      if (rc) {
        nh_error_set(err, NH_EFAIL, "cannot watch %s for changes: %s (use --no-reload)", dir, uv_strerror(rc));
        uv_close((uv_handle_t *)w, watcher_closed);
        free(dir);
        return NH_EFAIL;
      }
      d->watchers[d->nwatchers++] = w;
    }
    free(dir);
  }
  return NH_OK;
}

void nh_dispatch_unwatch(nh_dispatch_t *d)
{
  for (int i = 0; i < d->nwatchers; i++) {
    uv_fs_event_stop(d->watchers[i]);
    uv_close((uv_handle_t *)d->watchers[i], watcher_closed);
  }
  free(d->watchers);
  d->watchers = NULL;
  d->nwatchers = 0;
}
