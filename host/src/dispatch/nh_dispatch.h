/* The dispatcher: the only module that sees both the transport and Lua. It pulls
 * session heads, consults session state, runs handlers as Lua tasks, maps results to
 * outcomes (docs/design.md section 6) and writes every effect, settlement included, in
 * one store transaction per batch. */
#ifndef NH_DISPATCH_H
#define NH_DISPATCH_H

#include <uv.h>

#include "core/nh_error.h"
#include "store/nh_store.h"
#include "transport/nh_transport.h"

typedef struct nh_dispatch nh_dispatch_t;

/* Lifecycle, libuv's words (docs/architecture.md): init (no I/O yet), start, stop
 * (graceful, a callback when done), close (handles closed; memory freed by the last
 * close callback, so run the loop afterwards). */
nh_dispatch_t *nh_dispatch_init(uv_loop_t *loop, nh_store_t *store, nh_transport_t *transport, const char *lua_dir);
/* The same on a PostgreSQL store: the pump's reads and writes go through a unit of work on
 * `link` (store/nh_uow.h), which must outlive the dispatcher (close it after close's
 * callbacks have run). What is not built on PostgreSQL yet is said once at init. */
struct nh_pg_link;
nh_dispatch_t *nh_dispatch_init_pg(uv_loop_t *loop, struct nh_pg_link *link, nh_transport_t *transport,
                                   const char *lua_dir);
/* Loads one adapter file into its own VM and registers its endpoints. */
int nh_dispatch_load(nh_dispatch_t *d, const char *adapter_path, nh_error_t *err);
/* Subscribes endpoints and starts pulling work. */
int nh_dispatch_start(nh_dispatch_t *d, nh_error_t *err);
/* --retention AGE: resolved events and inbox entries older than age_ms are deleted in
 * the background; the adapter's nimbus.retention{...} no longer changes it. */
void nh_dispatch_set_retention_fixed(nh_dispatch_t *d, int64_t age_ms);
/* The process's owner id ("host:pid:tag"): with it the host lists itself and its
 * endpoints in the store's `hosts` table while it runs. */
void nh_dispatch_set_owner(nh_dispatch_t *d, const char *owner);
/* Stops taking new work, lets running tasks finish until `drain_ms`, then cancels the
 * rest without settling; calls on_stopped once everything is committed. */
void nh_dispatch_stop(nh_dispatch_t *d, int64_t drain_ms, void (*on_stopped)(void *), void *data);
/* Closes the VMs and every handle (after nh_dispatch_stop's callback, or instead of it
 * when starting failed). */
void nh_dispatch_close(nh_dispatch_t *d);
/* Hot reload: watch the adapters' directories (debounced), and reload on request
 * (SIGHUP). A reload builds new VMs; on any load error the running ones keep serving. */
int nh_dispatch_watch(nh_dispatch_t *d, nh_error_t *err);
void nh_dispatch_request_reload(nh_dispatch_t *d);
/* 1 when the store takes writes and the transport is connected; else 0, why in `why`. */
int nh_dispatch_ready(nh_dispatch_t *d, char *why, size_t len);
int nh_dispatch_endpoint_count(nh_dispatch_t *d);
/* Writes "Name (types...)" for each endpoint into buf, for the ready line. */
void nh_dispatch_describe(nh_dispatch_t *d, char *buf, size_t len);

#endif
