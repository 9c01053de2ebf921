/* The admin listener: the operator console and its API (docs/admin-api.md), served on the
 * loop by the same HTTP stack as nimbus.http.serve (net/nh_httpd.c), reading the store
 * between pumps. `nimbus-host run` starts one (default 127.0.0.1:7070), and so does
 * `nimbus-host console` for a store without adapters. */
#ifndef NH_ADMIN_H
#define NH_ADMIN_H

#include <uv.h>

#include "core/nh_error.h"
#include "store/nh_store.h"

typedef struct nh_admin nh_admin_t;

#define NH_ADMIN_DEFAULT "127.0.0.1:7070"

/* Parses --admin's value: "off", "PORT", ":PORT" or "HOST:PORT" (HOST an IP address or
 * "localhost"; the port 0 asks for a free one). Returns 0 and *off = 1 for "off". */
int nh_admin_parse_addr(const char *s, char *host, size_t hostlen, int *port, int *off, nh_error_t *err);
int nh_admin_is_loopback(const char *host);

typedef struct nh_admin_opts {
  const char *host;
  int port;
  const char *token_file;   /* --admin-token-file: required off loopback */
  int console_only;         /* `nimbus-host console`: no adapters in this process */
  const char *pg_url;       /* a PostgreSQL store (store NULL): the reads it serves run on the thread pool */
} nh_admin_opts_t;

/* Listens (a port in use is an error naming it and what to do). */
nh_admin_t *nh_admin_start(uv_loop_t *loop, nh_store_t *store, const nh_admin_opts_t *opts, nh_error_t *err);
/* The adapters are loaded: /readyz answers from now on what `check` says (NULL: ready).
 * check returns 1 when ready, else 0 with the reason in why. */
typedef int (*nh_admin_ready_cb)(void *data, char *why, size_t len);
void nh_admin_set_ready(nh_admin_t *a, nh_admin_ready_cb check, void *data);
/* Closes the listener, its streams and bulk runs; memory goes with the handles (run the loop). */
/* The host is stopping: bulk runs still stepping end now (503 to their callers; the
 * batches queued so far stay queued), so they do not hold the loop after the drain. */
void nh_admin_stop(nh_admin_t *a);
void nh_admin_close(nh_admin_t *a);

#endif
