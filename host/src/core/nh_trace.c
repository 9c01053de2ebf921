/* W3C Trace Context (nh_trace.h): traceparent parse/format, id minting, tracestate check. */
#include "nh_trace.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------- ids */

/* xoshiro256** (Blackman and Vigna): fast, 256 bits of state, so ids minted by the
 * hosts of a fleet do not meet. One state per thread, so no lock and no data race if a
 * worker thread ever mints an id. A forked child would repeat its parent's sequence:
 * the fork generation makes every thread of the child seed again. */
static _Thread_local uint64_t rng_s[4];
static _Thread_local unsigned rng_gen;   /* fork generation seeded for; 0: never */
static unsigned fork_gen = 1;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void rng_forked(void) { fork_gen++; }
static void rng_register_fork(void) { pthread_atfork(NULL, NULL, rng_forked); }

static uint64_t splitmix64(uint64_t *x)
{
  uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* getrandom(2) for all 256 bits; if the kernel refuses (no entropy syscall in some
 * sandbox), splitmix64 over time, pid and an address: still unique per process. */
static void rng_seed(void)
{
  pthread_once(&atfork_once, rng_register_fork);
  size_t got = 0;
  while (got < sizeof rng_s) {
    ssize_t n = getrandom((char *)rng_s + got, sizeof rng_s - got, 0);
    if (n > 0) got += (size_t)n;
    else if (n < 0 && errno != EINTR) break;
  }
  if (got < sizeof rng_s) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    x ^= ((uint64_t)getpid() << 40) ^ (uint64_t)(uintptr_t)&got;
    for (int i = 0; i < 4; i++) rng_s[i] = splitmix64(&x);
  }
  if (!(rng_s[0] | rng_s[1] | rng_s[2] | rng_s[3])) rng_s[0] = 1;   /* the one state it cannot leave */
  rng_gen = fork_gen;
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_next(void)
{
  if (rng_gen != fork_gen) rng_seed();
  uint64_t *s = rng_s;
  const uint64_t result = rotl(s[1] * 5, 7) * 9;
  const uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

static int all_zero(const uint8_t *b, size_t n)
{
  for (size_t i = 0; i < n; i++)
    if (b[i]) return 0;
  return 1;
}

/* n random bytes, never all zero (an all-zero id is the spec's "invalid"). */
static void random_id(uint8_t *out, size_t n)
{
  do {
    for (size_t i = 0; i < n; i += 8) {
      uint64_t r = rng_next();
      size_t k = n - i < 8 ? n - i : 8;
      memcpy(out + i, &r, k);
    }
  } while (all_zero(out, n));
}

void nh_trace_new_root(nh_trace_ctx_t *out)
{
  random_id(out->trace_id, sizeof out->trace_id);
  random_id(out->span_id, sizeof out->span_id);
  out->flags = NH_TRACE_SAMPLED;
}

void nh_trace_new_child(const nh_trace_ctx_t *parent, nh_trace_ctx_t *out)
{
  if (out != parent) {
    memcpy(out->trace_id, parent->trace_id, sizeof out->trace_id);
    out->flags = parent->flags;
  }
  random_id(out->span_id, sizeof out->span_id);
}

int nh_trace_id_of(const char *traceparent, char out[33])
{
  nh_trace_ctx_t c;
  out[0] = '\0';
  if (!traceparent || nh_trace_parse(traceparent, &c) != 0) return 0;
  nh_trace_hex(c.trace_id, sizeof c.trace_id, out);
  return 1;
}

int64_t nh_trace_now_ns(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---------------------------------------------------------------- traceparent */

void nh_trace_hex(const uint8_t *bytes, size_t n, char *out)
{
  static const char digits[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = digits[bytes[i] >> 4];
    out[2 * i + 1] = digits[bytes[i] & 0xf];
  }
  out[2 * n] = '\0';
}

/* Lower-case only: the spec's HEXDIGLC. */
static int hex_digit(char c)
{
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

/* 2n hex digits into n bytes; -1 on anything else. */
static int hex_decode(const char *s, size_t n, uint8_t *out)
{
  for (size_t i = 0; i < n; i++) {
    int hi = hex_digit(s[2 * i]), lo = hex_digit(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return -1;
    out[i] = (uint8_t)(hi << 4 | lo);
  }
  return 0;
}

static int is_ows(char c) { return c == ' ' || c == '\t'; }

int nh_trace_parse(const char *traceparent, nh_trace_ctx_t *out)
{
  if (!traceparent) return -1;
  const char *s = traceparent, *e = s + strlen(s);
  while (s < e && is_ows(*s)) s++;
  while (e > s && is_ows(e[-1])) e--;
  size_t len = (size_t)(e - s);
  uint8_t version;
  if (len < NH_TRACEPARENT_LEN || hex_decode(s, 1, &version) != 0 || version == 0xff) return -1;
  /* 00 is exactly its four fields; a later version may append fields after a '-' */
  if (version == 0 ? len != NH_TRACEPARENT_LEN : len > NH_TRACEPARENT_LEN && s[NH_TRACEPARENT_LEN] != '-')
    return -1;
  if (s[2] != '-' || s[35] != '-' || s[52] != '-') return -1;
  nh_trace_ctx_t c;
  if (hex_decode(s + 3, 16, c.trace_id) != 0 || hex_decode(s + 36, 8, c.span_id) != 0 ||
      hex_decode(s + 53, 1, &c.flags) != 0)
    return -1;
  if (all_zero(c.trace_id, sizeof c.trace_id) || all_zero(c.span_id, sizeof c.span_id)) return -1;
  *out = c;
  return 0;
}

void nh_trace_format(const nh_trace_ctx_t *c, char out[56])
{
  memcpy(out, "00-", 3);
  nh_trace_hex(c->trace_id, sizeof c->trace_id, out + 3);
  out[35] = '-';
  nh_trace_hex(c->span_id, sizeof c->span_id, out + 36);
  out[52] = '-';
  nh_trace_hex(&c->flags, 1, out + 53);   /* writes the NUL at 55 */
}

/* ---------------------------------------------------------------- tracestate */

#define TS_MAX_LEN 512
#define TS_MAX_MEMBERS 32

static int key_char(char c)
{
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '*' || c == '/';
}

/* simple-key = lcalpha 0*255(keychar); multi-tenant-key = tenant "@" system, with
 * tenant = (lcalpha / DIGIT) 0*240(keychar) and system = lcalpha 0*13(keychar). */
static int key_valid(const char *k, size_t n)
{
  const char *at = memchr(k, '@', n);
  if (!at) {
    if (n < 1 || n > 256 || !(k[0] >= 'a' && k[0] <= 'z')) return 0;
  } else {
    size_t tn = (size_t)(at - k), sn = n - tn - 1;
    if (tn < 1 || tn > 241 || sn < 1 || sn > 14) return 0;
    if (!((k[0] >= 'a' && k[0] <= 'z') || (k[0] >= '0' && k[0] <= '9'))) return 0;
    if (!(at[1] >= 'a' && at[1] <= 'z')) return 0;
  }
  for (size_t i = 0; i < n; i++)
    if (k + i != at && !key_char(k[i])) return 0;
  return 1;
}

/* value = 0*255(chr) nblk-chr: printable ASCII (space allowed) but ',' and '=', and
 * not ending in a space (the member is trimmed already, so that is a trailing OWS). */
static int value_valid(const char *v, size_t n)
{
  if (n < 1 || n > 256 || v[n - 1] == ' ') return 0;
  for (size_t i = 0; i < n; i++)
    if (v[i] < 0x20 || v[i] > 0x7e || v[i] == ',' || v[i] == '=') return 0;
  return 1;
}

int nh_tracestate_valid(const char *tracestate)
{
  if (!tracestate || strlen(tracestate) > TS_MAX_LEN) return 0;
  const char *keys[TS_MAX_MEMBERS];
  size_t klens[TS_MAX_MEMBERS];
  int n = 0;
  for (const char *p = tracestate;;) {
    const char *comma = strchr(p, ',');
    const char *b = p, *e = comma ? comma : p + strlen(p);
    while (b < e && is_ows(*b)) b++;
    while (e > b && is_ows(e[-1])) e--;
    if (b < e) {   /* an empty member is allowed and does not count */
      const char *eq = memchr(b, '=', (size_t)(e - b));
      if (!eq || n == TS_MAX_MEMBERS) return 0;
      size_t klen = (size_t)(eq - b);
      if (!key_valid(b, klen) || !value_valid(eq + 1, (size_t)(e - eq - 1))) return 0;
      for (int i = 0; i < n; i++)
        if (klens[i] == klen && memcmp(keys[i], b, klen) == 0) return 0;
      keys[n] = b;
      klens[n++] = klen;
    }
    if (!comma) return 1;
    p = comma + 1;
  }
}
