/* The helpers of nh_util.h: wall-clock time, ISO-8601 and duration parsing, a process
 * PRNG (xorshift128+) with UUID v4 / v7 ids, allocation that aborts on exhaustion,
 * whole-file reads, and whether a store owner ("host:pid:...") is a dead local process. */
#define _GNU_SOURCE   /* strptime, timegm */
#include "nh_util.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int64_t nh_time_now_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void nh_time_iso8601(int64_t ms, char *out, size_t outlen)
{
  time_t secs = (time_t)(ms / 1000);
  struct tm tm;
  gmtime_r(&secs, &tm);
  char base[32];
  strftime(base, sizeof base, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(out, outlen, "%s.%03dZ", base, (int)(ms % 1000));
}

int64_t nh_duration_parse_ms(const char *s)
{
  if (!s || !*s) return -1;
  char *end;
  double v = strtod(s, &end);
  if (end == s || !(v >= 0)) return -1;   /* also NaN */
  double unit = 1000;
  if (*end) {
    switch (*end) {
    case 's': unit = 1000; break;
    case 'm': unit = 60e3; break;
    case 'h': unit = 3600e3; break;
    case 'd': unit = 86400e3; break;
    case 'w': unit = 7 * 86400e3; break;
    default: return -1;
    }
    if (end[1]) return -1;
  }
  double ms = v * unit;
  if (ms >= 9.0e18) return -1;   /* inf, or more than an int64 of ms holds (found by fuzz_cli_args) */
  return (int64_t)ms;
}

int64_t nh_time_parse_ms(const char *s, int64_t now_ms)
{
  if (!s || !*s) return -1;
  if (!strchr(s, '-')) {   /* no date: a duration ago */
    int64_t d = nh_duration_parse_ms(s);
    return d < 0 ? -1 : now_ms - d;
  }
  static const char *const formats[] = { "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M",
                                         "%Y-%m-%d %H:%M", "%Y-%m-%d" };
  for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++) {
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    const char *rest = strptime(s, formats[i], &tm);
    if (!rest) continue;
    int64_t ms = 0;
    if (*rest == '.') {   /* fraction of a second: up to milliseconds count */
      rest++;
      int64_t scale = 100;
      while (isdigit((unsigned char)*rest)) {
        ms += (*rest - '0') * scale;
        scale /= 10;
        rest++;
      }
    }
    if (*rest == 'Z') rest++;
    if (*rest) continue;
    return (int64_t)timegm(&tm) * 1000 + ms;
  }
  return -1;
}

/* xorshift128+ seeded from /dev/urandom: ids need uniqueness, not cryptographic strength.
 * One per thread: the admin API's routes on a PostgreSQL store run on libuv's pool
 * (admin/nh_admin_pg.c), and two threads stepping one state could draw the same id. */
static _Thread_local uint64_t rng_s[2];

static void rng_seed(void)
{
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  ssize_t got = -1;
  if (fd >= 0) {
    got = read(fd, rng_s, sizeof rng_s);
    close(fd);
  }
  if (got != (ssize_t)sizeof rng_s) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    rng_s[0] = (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32);
    rng_s[1] = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull;
  }
  if (!rng_s[0] && !rng_s[1]) rng_s[1] = 1;
}

static uint64_t rng_next(void)
{
  if (!rng_s[0] && !rng_s[1]) rng_seed();
  uint64_t s1 = rng_s[0];
  const uint64_t s0 = rng_s[1];
  rng_s[0] = s0;
  s1 ^= s1 << 23;
  rng_s[1] = s1 ^ s0 ^ (s1 >> 17) ^ (s0 >> 26);
  return rng_s[1] + s0;
}

double nh_random_unit(void) { return (double)(rng_next() >> 11) / 9007199254740992.0; }

int64_t nh_backoff_ms(int64_t first_ms, int64_t max_ms, int failed)
{
  int64_t cap = first_ms;
  for (int i = 1; i < failed && cap < max_ms; i++) cap *= 2;
  if (cap > max_ms) cap = max_ms;
  return cap - (int64_t)(nh_random_unit() * (double)(cap / 2));
}

void nh_uuid_format(const unsigned char u[16], char out[37])
{
  static const char hex[] = "0123456789abcdef";
  int j = 0;
  for (int i = 0; i < 16; i++) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out[j++] = '-';
    out[j++] = hex[u[i] >> 4];
    out[j++] = hex[u[i] & 15];
  }
  out[j] = '\0';
}

void nh_uuid_v4(char out[37])
{
  uint64_t a = rng_next(), b = rng_next();
  unsigned char u[16];
  memcpy(u, &a, 8);
  memcpy(u + 8, &b, 8);
  u[6] = (u[6] & 0x0f) | 0x40;
  u[8] = (u[8] & 0x3f) | 0x80;
  nh_uuid_format(u, out);
}

void nh_uuid_v7(char out[37])
{
  /* Within one millisecond a counter in rand_a keeps ids from this thread ordered (the
   * loop's; a route on the admin API's pool has its own, and its own random state) */
  static _Thread_local int64_t last_ms;
  static _Thread_local unsigned seq;
  int64_t ms = nh_time_now_ms();
  if (ms <= last_ms) {
    ms = last_ms;
    if (++seq > 0xfff) {   /* counter exhausted: borrow the next millisecond */
      ms = ++last_ms;
      seq = 0;
    }
  } else {
    last_ms = ms;
    seq = 0;
  }
  uint64_t r = rng_next();
  unsigned char u[16];
  for (int i = 0; i < 6; i++) u[i] = (unsigned char)((uint64_t)ms >> (8 * (5 - i)));
  u[6] = (unsigned char)(0x70 | ((seq >> 8) & 0x0f));
  u[7] = (unsigned char)(seq & 0xff);
  memcpy(u + 8, &r, 8);
  u[8] = (u[8] & 0x3f) | 0x80;
  nh_uuid_format(u, out);
}

void nh_oom(void)
{
  fputs("nimbus-host: out of memory\n", stderr);
  abort();
}

void *nh_xmalloc(size_t n)
{
  void *p = malloc(n ? n : 1);
  if (!p) nh_oom();
  return p;
}

void *nh_xcalloc(size_t n, size_t size)
{
  void *p = calloc(n ? n : 1, size ? size : 1);
  if (!p) nh_oom();
  return p;
}

void *nh_xrealloc(void *p, size_t n)
{
  void *q = realloc(p, n ? n : 1);
  if (!q) nh_oom();
  return q;
}

char *nh_xstrdup(const char *s)
{
  return s ? nh_xstrndup(s, strlen(s)) : NULL;
}

char *nh_xstrndup(const char *s, size_t n)
{
  if (!s) return NULL;
  char *d = nh_xmalloc(n + 1);
  memcpy(d, s, n);
  d[n] = '\0';
  return d;
}

char *nh_file_read(const char *path, size_t *len, const char **err)
{
  FILE *f = fopen(path, "rb");
  if (!f) {
    *err = strerror(errno);
    return NULL;
  }
  size_t cap = 4096, n = 0;
  char *buf = nh_xmalloc(cap);
  size_t got;
  while ((got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
    n += got;
    if (cap - n - 1 == 0) buf = nh_xrealloc(buf, cap *= 2);
  }
  int bad = ferror(f);
  fclose(f);
  if (bad) {
    free(buf);
    *err = "read error";
    return NULL;
  }
  buf[n] = '\0';
  if (len) *len = n;
  return buf;
}

int nh_owner_dead(const char *owner)
{
  char self[128] = "";
  gethostname(self, sizeof self - 1);
  size_t n = strlen(self);
  if (!owner || strncmp(owner, self, n) != 0 || owner[n] != ':') return 0;
  long pid = strtol(owner + n + 1, NULL, 10);
  return pid > 0 && kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

int nh_share_dir(const char *what, char *out, size_t len)
{
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return -1;
  exe[n] = '\0';
  char *slash = strrchr(exe, '/');
  if (!slash) return -1;
  *slash = '\0';
  int w = snprintf(out, len, "%s/../share/nimbus-host/%s", exe, what);
  return w < 0 || (size_t)w >= len ? -1 : 0;
}
