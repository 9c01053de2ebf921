/* Small helpers shared by every module: time, ids, allocation, strings. */
#ifndef NH_UTIL_H
#define NH_UTIL_H

/* NH_ASAN: built with AddressSanitizer (gcc says so with __SANITIZE_ADDRESS__, clang
 * with __has_feature). The host's own block pools step aside then, so the sanitizer sees
 * every allocation. */
#if defined(__SANITIZE_ADDRESS__)
#define NH_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define NH_ASAN 1
#endif
#endif
#ifndef NH_ASAN
#define NH_ASAN 0
#endif

#include <stddef.h>
#include <stdint.h>

/* Wall-clock milliseconds since the Unix epoch (store timestamps are in this unit). */
int64_t nh_time_now_ms(void);
/* Formats ms-since-epoch as ISO-8601 UTC with milliseconds: 2026-12-02T13:49:59.123Z */
void nh_time_iso8601(int64_t ms, char *out, size_t outlen);

/* A duration such as 45s, 30m, 2h, 7d (a bare number is seconds) in ms; -1 if malformed. */
int64_t nh_duration_parse_ms(const char *s);
/* A point in time for operator filters: ISO-8601 UTC (2026-12-03, 2026-12-03T06:00,
 * 2026-12-03T06:00:00[.123][Z]) or a duration ago (30m, 2h, 7d). -1 if malformed. */
int64_t nh_time_parse_ms(const char *s, int64_t now_ms);

/* Random RFC 4122 version-4 UUID, lower-case, 36 chars + NUL. */
void nh_uuid_v4(char out[37]);
/* Time-ordered UUID (RFC 9562 version 7): ms timestamp first, then random bits. Ids
 * the host mints are v7 so index inserts keyed by them append instead of scattering
 * over random B-tree pages (about twice the throughput of v4 keys, see make bench). */
void nh_uuid_v7(char out[37]);
/* The 16 bytes of a UUID as lower-case 8-4-4-4-12 text. */
void nh_uuid_format(const unsigned char u[16], char out[37]);
/* Uniform double in [0, 1). */
double nh_random_unit(void);
/* A reconnect's wait after `failed` failed attempts (1 or more): first_ms doubled per
 * attempt up to max_ms, then a random point in its upper half, so hosts that lost the
 * same server together do not come back in step. */
int64_t nh_backoff_ms(int64_t first_ms, int64_t max_ms, int failed);

/* Allocation that aborts on exhaustion (Neovim's xmalloc): callers never check. */
/* Says so on stderr and aborts: what nh_x* do when an allocation fails (and callers of
 * allocating library calls, PQsetvalue say, whose failure is the same). */
_Noreturn void nh_oom(void);
void *nh_xmalloc(size_t n);
void *nh_xcalloc(size_t n, size_t size);
void *nh_xrealloc(void *p, size_t n);
char *nh_xstrdup(const char *s);       /* NULL in, NULL out */
char *nh_xstrndup(const char *s, size_t n);

/* Owners of locks and outbox rows are "hostname:pid:tag". 1 if `owner` names a
 * process on this machine that no longer runs (its leftovers can be taken over). */
int nh_owner_dead(const char *owner);

/* <directory of the running binary>/../share/nimbus-host/<what>, where `make install` puts
 * the Lua runtime and the console; 0, or -1 when the binary's path is unknown. */
int nh_share_dir(const char *what, char *out, size_t len);

/* Reads a whole file; returns NULL and sets *err (static text) on failure. */
char *nh_file_read(const char *path, size_t *len, const char **err);

#endif
