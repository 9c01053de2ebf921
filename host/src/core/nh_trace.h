/* W3C Trace Context (level 1): the traceparent header's ids, parsed, formatted and minted,
 * and a check of tracestate. https://www.w3.org/TR/trace-context/
 *
 *   traceparent = version "-" trace-id "-" parent-id "-" trace-flags
 *                 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
 *
 * Ids are minted by a per-thread xoshiro256** seeded once from getrandom(2) (and again in
 * a forked child): they are not secrets, but two of them must never meet. */
#ifndef NH_TRACE_H
#define NH_TRACE_H

#include <stddef.h>
#include <stdint.h>

typedef struct nh_trace_ctx {
  uint8_t trace_id[16];
  uint8_t span_id[8];    /* the parent-id field of the header: the span that sent it */
  uint8_t flags;         /* bit 0: sampled */
} nh_trace_ctx_t;

#define NH_TRACE_SAMPLED 0x01
#define NH_TRACEPARENT_LEN 55   /* version 00, without the NUL */

/* 0 and *out filled, or -1 (out untouched) when the header is malformed by the spec:
 * lower-case hex only; version ff is invalid; version 00 is exactly 55 characters; a
 * higher version is read by its first four fields when what follows them is nothing or
 * starts with '-'; an all-zero trace id or parent id is invalid. Spaces and tabs around
 * the value are ignored (HTTP header whitespace). */
int nh_trace_parse(const char *traceparent, nh_trace_ctx_t *out);
/* Always version 00: 55 characters and a NUL. */
void nh_trace_format(const nh_trace_ctx_t *c, char out[56]);
/* A new trace: random non-zero trace id and span id, flags 01 (sampled). */
void nh_trace_new_root(nh_trace_ctx_t *out);
/* A span inside parent's trace: the same trace id and flags, a new random span id.
 * out may be parent itself. */
void nh_trace_new_child(const nh_trace_ctx_t *parent, nh_trace_ctx_t *out);
/* The trace id of a traceparent as 32 hex digits into out: 1, or 0 (out "") when it is
 * NULL or malformed. For showing which trace an event is in. */
int nh_trace_id_of(const char *traceparent, char out[33]);
/* The wall clock in unix epoch nanoseconds (span start and end times). */
int64_t nh_trace_now_ns(void);
/* n bytes as 2n lower-case hex digits and a NUL (out holds 2n+1). */
void nh_trace_hex(const uint8_t *bytes, size_t n, char *out);

/* 1 when tracestate is well formed, 0 otherwise (callers drop an invalid one and keep
 * traceparent): at most 512 characters and 32 list members, each key=value with the
 * spec's key grammar (lcalpha start; tenant@system form), a value of 1..256 printable
 * ASCII characters without ',' or '=' and not ending in a space, no key twice. Empty
 * members (", ,") are allowed, and an empty header is valid. */
int nh_tracestate_valid(const char *tracestate);

#endif
