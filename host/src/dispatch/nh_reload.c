/* Hot reload: VM generations. A reload builds a complete new VM per adapter file and
 * loads the adapter there; on any load error the running VM keeps serving and the error
 * is logged with file and line. On success the endpoints move to the new VM: new
 * messages go there, while tasks already running finish on the old one, which is closed
 * once its last task ends (or at a drain deadline). Per-session order holds across the
 * swap because a session's next message is only dispatched after the previous one is
 * settled. Status checkers of the old generation stop at the swap; HTTP servers of the
 * new one bind beside the old ones (SO_REUSEPORT), so no listening socket is dropped.
 *
 * Watching the files for saves is dispatch/nh_watch.c. */
#include "nh_dispatch_int.h"
#include "core/nh_log.h"
#include "core/nh_util.h"

#include <stdlib.h>
#include <string.h>

#define NH_RETIRE_DEADLINE_MS 60000

/* An endpoint option only a broker transport acts on (partitions, sessions): given to the
 * transport when it has the setter; else, set beyond its default, said once at start to
 * have no effect here. */
static int broker_option(nh_dispatch_t *d, nh_endpoint_t *ep,
                         int (*set)(nh_transport_t *, const char *, int, nh_error_t *), const char *name, int n,
                         int dflt, const char *for_what, nh_error_t *err)
{
  if (set) return set(d->tr, ep->name, n, err);
  if (n > dflt && !d->started)
    nh_log_info("dispatch", "%s: %s = %d is for %s; the %s transport keeps sessions in order across hosts through "
                "the store, so it has no effect here", ep->name, name, n, for_what, d->tr->vt->name);
  return NH_OK;
}

int nh_dispatch_subscribe_all(nh_dispatch_t *d, nh_error_t *err)
{
  /* sqlite: one transaction; PostgreSQL: the transport writes each endpoint's set in one */
  if (d->store && nh_store_begin(d->store))
    return nh_error_set(err, NH_EFAIL, "store: %s", nh_store_errmsg(d->store));
  for (nh_endpoint_t *ep = d->endpoints; ep; ep = ep->next) {
    if (ep->retired) continue;
    if (ep->lock_ms < d->tr->lock_ms || ep == d->endpoints) d->tr->lock_ms = ep->lock_ms;
    if (broker_option(d, ep, d->tr->vt->set_partitions, "partitions", ep->partitions, 1, "a broker (RabbitMQ)", err) ||
        broker_option(d, ep, d->tr->vt->set_sessions, "sessions", ep->sessions, 0,
                      "Service Bus session-enabled subscriptions", err)) {
      if (d->store) nh_store_rollback(d->store);
      return NH_EFAIL;
    }
    if (d->tr->vt->subscribe(d->tr, ep->name, (const char *const *)ep->types, ep->commands, ep->ntypes, err)) {
      if (d->store) nh_store_rollback(d->store);
      return NH_EFAIL;
    }
    if (d->tr->vt->set_capacity) d->tr->vt->set_capacity(d->tr, ep->name, ep->concurrency);
  }
  /* this process's reply queue: a broker transport declares and consumes it */
  if (!d->started && d->tr->vt->subscribe(d->tr, d->reply_ep, NULL, NULL, 0, err)) {
    if (d->store) nh_store_rollback(d->store);
    return NH_EFAIL;
  }
  if (d->store && nh_store_commit(d->store)) return nh_error_set(err, NH_EFAIL, "store: cannot commit subscriptions");
  if (d->started) nh_dispatch_renew_start(d);   /* a reload may have shortened the lock */
  return NH_OK;
}

/* Moves the settings of a freshly registered endpoint into the live one of that name,
 * so jobs in flight keep a valid pointer. */
static void adopt(nh_endpoint_t *live, nh_endpoint_t *fresh)
{
  live->vm = fresh->vm;
  live->concurrency = fresh->concurrency;
  live->partitions = fresh->partitions;
  live->sessions = fresh->sessions;
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

/* A broker's partitions of a consuming endpoint are fixed while the host runs: another
 * count would put its sessions in other queues beside the backlog of the old ones. */
static int check_partitions(nh_dispatch_t *d, nh_adapter_t *a, nh_error_t *err)
{
  if (!d->tr->vt->set_partitions) return NH_OK;
  for (nh_endpoint_t *fresh = d->pending_eps; fresh; fresh = fresh->next) {
    nh_endpoint_t *live = NULL;
    for (nh_endpoint_t *ep = d->endpoints; ep && !live; ep = ep->next)
      if (strcmp(ep->name, fresh->name) == 0) live = ep;
    if (live && live->partitions != fresh->partitions)
      return nh_error_set(err, NH_EUSAGE, "%s: endpoint %s: partitions cannot change from %d to %d while the host "
                          "runs: that would reorder its sessions. Stop every host of it, move its messages with "
                          "`nimbus-host partitions %s %d --transport ...`, then start with the new value "
                          "(docs/broker-partitions.md)", a->path, fresh->name, live->partitions, fresh->partitions,
                          fresh->name, fresh->partitions);
    if (live && d->tr->vt->set_sessions && live->sessions != fresh->sessions)
      return nh_error_set(err, NH_EUSAGE, "%s: endpoint %s: sessions cannot change from %d to %d while the host runs "
                          "(on Service Bus, restart the host to change it; docs/servicebus-amqp.md)", a->path,
                          fresh->name, live->sessions, fresh->sessions);
  }
  return NH_OK;
}

static int check_subscriptions(nh_dispatch_t *d, nh_adapter_t *a, nh_error_t *err)
{
  if (check_partitions(d, a, err)) return NH_EUSAGE;
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
  if (!vm || (!d->pending_eps && !nh_vm_has_work(vm))) {
    if (vm) {
      nh_error_set(err, NH_EUSAGE, "%s defines no endpoint and starts nothing (no nimbus.http.serve, checker or "
                   "nimbus.every)", a->path);
      nh_vm_close(vm);
    }
    drop_pending(d);
    return NH_RL_FAILED;
  }
  /* Validate, then swap (Fluent Bit's rule): a subscription the store would refuse (a
   * command another endpoint consumes) refuses the reload; the old generation keeps
   * serving with its subscriptions untouched. */
  if (check_subscriptions(d, a, err)) {
    nh_vm_close(vm);
    drop_pending(d);
    return NH_RL_FAILED;
  }
  /* A .lua file of the watched directories changed while this one was read: what was read
   * may be half of a save. The new VM is dropped unseen; the next attempt reads it again. */
  if (nh_dispatch_reload_superseded(d)) {
    nh_vm_close(vm);
    drop_pending(d);
    return NH_RL_SUPERSEDED;
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
  return NH_RL_OK;
}

int nh_dispatch_reload_adapter(nh_dispatch_t *d, int i, int report, nh_error_t *err)
{
  nh_adapter_t *a = &d->adapters[i];
  uint64_t t0 = uv_hrtime();
  int rc = reload_one(d, a, err);
  if (rc == NH_RL_FAILED && nh_dispatch_reload_superseded(d)) rc = NH_RL_SUPERSEDED;
  if (rc == NH_RL_OK) {
    d->reloads++;
    nh_log_info("reload", "reloaded %s in %.1f ms (generation %llu)", a->path, (double)(uv_hrtime() - t0) / 1e6,
                (unsigned long long)d->reloads);
  } else if (rc == NH_RL_FAILED && report) {
    d->reload_failures++;
    nh_log_error("reload", "reload of %s failed; the running version keeps serving:\n  %s", a->path, err->msg);
  }
  return rc;
}

int nh_dispatch_reload(nh_dispatch_t *d, int which, nh_error_t *err)
{
  int failures = 0;
  nh_dispatch_reload_begins(d);
  for (int i = 0; i < d->nadapters; i++) {
    if (which >= 0 && i != which) continue;
    nh_error_t e = {0};
    if (nh_dispatch_reload_adapter(d, i, 1, &e) != NH_RL_OK) {
      failures++;
      if (err) *err = e;
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
