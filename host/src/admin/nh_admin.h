/* The admin listener: the operator's HTTP API under /api/v1, served on the loop by the
 * same HTTP stack as nimbus.http.serve (net/nh_httpd.c), reading the host's store between
 * pumps. This first part answers the reads (endpoints with their counts, events with
 * filters and a cursor, one event with its history, failure groups) and the single-event
 * actions (resubmit, skip); bulk and hand-off actions, the OpenAPI document, the stream and
 * the page come next (docs/architecture.md, "Admin API"). */
#ifndef NH_ADMIN_H
#define NH_ADMIN_H

#include <uv.h>

#include "core/nh_error.h"
#include "store/nh_store.h"

typedef struct nh_admin nh_admin_t;

/* Parses --admin's value: "off", "PORT", ":PORT" or "HOST:PORT" (HOST an IPv4 address or
 * "localhost"; the port 0 asks for a free one). Returns 0 and *off = 1 for "off". */
int nh_admin_parse_addr(const char *s, char *host, size_t hostlen, int *port, int *off, nh_error_t *err);
/* Listens on host:port (a port in use is an error naming it). */
nh_admin_t *nh_admin_start(uv_loop_t *loop, nh_store_t *store, const char *host, int port, nh_error_t *err);
/* Closes the listener and its connections; the memory goes with the handles (run the loop). */
void nh_admin_close(nh_admin_t *a);

#endif
