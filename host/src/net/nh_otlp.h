/* OTLP/HTTP span exporter (JSON encoding) on the uv loop: `--otlp URL`.
 * https://opentelemetry.io/docs/specs/otlp/
 *
 * The host hands finished spans to nh_otlp_add, which copies each one (as its OTLP/JSON
 * text) into a bounded queue and returns; it never blocks and never waits for the
 * collector. Spans go out in batches, POSTed with the non-blocking HTTP client
 * (net/nh_http_client.h): when batch_max are queued, or flush_ms after the oldest queued
 * one, with at most one request in flight. Telemetry must never hurt the host, so
 * nothing is retried: a full queue drops the new span, a failed export (refused,
 * timeout, non-2xx) drops its batch; both are counted (nh_otlp_stats). A failure streak
 * logs one warning (subsystem "otlp"), the first success after it one info line.
 *
 * The exporter's timer does not keep the loop alive by itself (like the HTTP server's);
 * a request in flight and a stop in progress do. Stop it (and let its done callback
 * run) before the runtime closes: the runtime's HTTP client abandons calls in flight. */
#ifndef NH_OTLP_H
#define NH_OTLP_H

#include <stdint.h>
#include <uv.h>

#include "core/nh_error.h"

typedef enum {
  NH_SPAN_INTERNAL = 1,
  NH_SPAN_SERVER,
  NH_SPAN_CLIENT,
  NH_SPAN_PRODUCER,
  NH_SPAN_CONSUMER
} nh_span_kind_t;   /* OTLP's SpanKind numbers */

typedef struct nh_span_attr {
  const char *key;   /* NULL: skipped */
  const char *str;   /* a string value (NULL: "") unless is_num */
  int64_t num;
  int is_num;        /* an int value (OTLP intValue) */
} nh_span_attr_t;

/* Initialisers for an nh_span_attr_t array (a NULL key leaves the attribute out). */
#define NH_SPAN_STR(k, v) { (k), (v), 0, 0 }
#define NH_SPAN_NUM(k, v) { (k), NULL, (v), 1 }

/* What the host fills in; nh_otlp_add copies what it needs, the caller keeps ownership.
 * Strings longer than 4 KiB are cut (at a UTF-8 boundary; invalid UTF-8 bytes become
 * '?'); past 128 attributes the rest are left out. */
typedef struct nh_span {
  const char *name;
  nh_span_kind_t kind;                 /* out of range: internal */
  uint8_t trace_id[16], span_id[8], parent_span_id[8];
  int has_parent;                      /* 0: a root span, no parentSpanId */
  int64_t start_ns, end_ns;            /* unix epoch nanoseconds */
  int error;                           /* status ERROR (2) with status_message; else UNSET (0) */
  const char *status_message;          /* may be NULL */
  const nh_span_attr_t *attrs;
  int nattrs;
} nh_span_t;

typedef struct nh_otlp_attr {
  const char *key, *value;
} nh_otlp_attr_t;

typedef struct nh_otlp_opts {
  /* Required; http:// or https://. A base URL (path empty or "/") gets /v1/traces
   * appended, as the spec does for OTEL_EXPORTER_OTLP_ENDPOINT; another path is kept. */
  const char *url;
  const char *service_name;              /* resource service.name; NULL: "nimbus-host" */
  const nh_otlp_attr_t *resource_attrs;  /* more resource attributes (service.instance.id, ...) */
  int nresource_attrs;
  const char *const *headers;            /* extra "Name: value" request lines (Authorization) */
  int nheaders;
  int queue_max;                         /* spans queued at most; 0: 2048 */
  int batch_max;                         /* spans per request; 0: 512 (or queue_max if smaller) */
  int flush_ms;                          /* a partial batch goes this long after its oldest span; 0: 1000 */
  double timeout_s;                      /* per export request; 0: 5 */
} nh_otlp_opts_t;

typedef struct nh_otlp nh_otlp_t;

typedef struct nh_otlp_stats {
  uint64_t queued;            /* spans taken into the queue */
  uint64_t exported;          /* spans the collector accepted (2xx) */
  uint64_t dropped_full;      /* spans refused: queue full (or the exporter stopping) */
  uint64_t dropped_failed;    /* spans of failed exports, and those left when stop gave up */
  uint64_t export_failures;   /* failed export requests */
} nh_otlp_stats_t;

/* NULL with err set (NH_EUSAGE) when an option is invalid; the message names it. */
nh_otlp_t *nh_otlp_start(uv_loop_t *loop, const nh_otlp_opts_t *opts, nh_error_t *err);
/* Copies span into the queue, or drops it (counted) when the queue is full (queue_max
 * spans, or 64 MiB of encoded spans). Safe from any callback on the loop's thread,
 * including an HTTP client's: it only arms the timer, the export starts from the loop. */
void nh_otlp_add(nh_otlp_t *x, const nh_span_t *span);
void nh_otlp_stats(const nh_otlp_t *x, nh_otlp_stats_t *out);
/* Sends what is queued in one last request, waiting at most 2 s in all (an export in
 * flight is waited for within the same 2 s, then cancelled), closes the timer, frees
 * x and then calls done(data) from the close callback (done may be NULL). With nothing
 * queued or in flight it closes at once. x must not be used after this call. */
void nh_otlp_stop(nh_otlp_t *x, void (*done)(void *data), void *data);

#endif
