/* Metrics registry and Prometheus text exposition (nh_metrics.h).
 *
 * Costs, since both paths are hot:
 * - Updating an existing series allocates nothing: the label values are hashed where they
 *   are (a word at a time) and compared against the series' stored copies. Only a new
 *   series allocates, once: the struct, its histogram counts, the values and its rendered
 *   label set `{a="x",b="y"}` (escaped there, once).
 * - Rendering appends to one buffer that starts at the previous exposition's size and
 *   doubles when short; each line reserves its worst case once and is then copied without
 *   further checks. Integral values (counters, bucket counts, most gauges) are written by a
 *   digit loop, other values with %.17g (exact), and NaN, +Inf, -Inf as Prometheus spells them. */
#include "nh_metrics.h"
#include "nh_util.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct nh_metric_series {
  uint64_t hash;                              /* of the label values (hash_values) */
  const nh_metric_t *family;
  nh_metric_series_t *next;                   /* the family's, in creation order */
  double value;                               /* counters, gauges */
  uint64_t *counts;                           /* histograms: per bucket (not cumulative), then +Inf */
  double sum;
  uint64_t count;
  const char *values[NH_METRIC_MAX_LABELS];   /* the raw values, in this allocation */
  size_t vlen[NH_METRIC_MAX_LABELS];
  const char *lbl;                            /* `{a="x",b="y"}` escaped; "" without labels */
  size_t lbl_len;
};

const double nh_metric_buckets_fast[14] = { 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                            0.25,  0.5,    1,     2.5,  5,     10,  60 };
const double nh_metric_buckets_slow[18] = { 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                            1,     2.5,    5,     10,   30,    60,   300, 900, 3600 };

static nh_metric_t *families, *families_last;
static int metrics_on = 1;

#define METRICS_OFF_TEXT "# metrics are off (nimbus-host run --metrics off)\n"

void nh_metrics_set_enabled(int on) { metrics_on = on != 0; }
int nh_metrics_enabled(void) { return metrics_on; }

typedef struct collector {
  nh_metrics_collect_cb cb;
  void *data;
  struct collector *next;
} collector_t;
static collector_t *collectors;

static void family_register(nh_metric_t *m)
{
  int n = 0;
  while (n < NH_METRIC_MAX_LABELS && m->labels[n]) n++;
  m->nlabels = n;
  m->registered = 1;
  m->next = NULL;
  if (families_last) families_last->next = m;
  else families = m;
  families_last = m;
}

/* ---------------------------------------------------------------- series lookup */

static inline uint64_t mix(uint64_t h, uint64_t w)
{
  h = (h ^ w) * 0x9e3779b97f4a7c15ULL;
  return h ^ (h >> 29);
}

/* The label values' hash, 8 bytes at a time (each value's length mixed into its last
 * word, so ("ab","") and ("a","b") hash apart), and their lengths. NULL reads "".
 * Collisions only cost a comparison: lookups compare the values themselves. */
static uint64_t hash_values(int n, const char *const *values, size_t *lens)
{
  uint64_t h = 0x243f6a8885a308d3ULL;
  for (int i = 0; i < n; i++) {
    const char *v = values[i] ? values[i] : "";
    size_t len = strlen(v), j = 0;
    uint64_t w;
    for (; j + 8 <= len; j += 8) {
      memcpy(&w, v + j, 8);
      h = mix(h, w);
    }
    w = 0;
    for (unsigned k = 0; j < len; j++, k += 8) w |= (uint64_t)(unsigned char)v[j] << k;
    h = mix(h, w ^ ((uint64_t)len << 56) ^ (uint64_t)i << 48);
    lens[i] = len;
  }
  h ^= h >> 33;   /* the slot index takes the low bits */
  h *= 0xff51afd7ed558ccdULL;
  return h ^ (h >> 33);
}

static int same_values(const nh_metric_series_t *s, int n, const char *const *values, const size_t *lens)
{
  for (int i = 0; i < n; i++)
    if (s->vlen[i] != lens[i] || memcmp(s->values[i], values[i] ? values[i] : "", lens[i]) != 0) return 0;
  return 1;
}

static nh_metric_series_t *lookup(const nh_metric_t *m, uint64_t h, const char *const *values, const size_t *lens)
{
  if (!m->nslots) return NULL;
  size_t mask = m->nslots - 1;
  for (size_t i = (size_t)h & mask; m->slots[i]; i = (i + 1) & mask) {
    const nh_metric_series_t *s = m->slots[i];
    if (s->hash == h && same_values(s, m->nlabels, values, lens)) return m->slots[i];
  }
  return NULL;
}

static void slot_put(nh_metric_series_t **slots, size_t nslots, nh_metric_series_t *s)
{
  size_t i = (size_t)s->hash & (nslots - 1);
  while (slots[i]) i = (i + 1) & (nslots - 1);
  slots[i] = s;
}

static void slots_grow(nh_metric_t *m)
{
  size_t n = m->nslots ? m->nslots * 2 : 16;
  nh_metric_series_t **slots = nh_xcalloc(n, sizeof *slots);
  for (nh_metric_series_t *s = m->first; s; s = s->next) slot_put(slots, n, s);
  free(m->slots);
  m->slots = slots;
  m->nslots = n;
}

/* Label values escape backslash, double quote and newline (the text format's rules);
 * HELP text backslash and newline. Returns the end; dst has room for 2 * len bytes. */
static char *escape_to(char *dst, const char *s, size_t len, int quote)
{
  for (size_t i = 0; i < len; i++) {
    char c = s[i];
    if (c == '\\') *dst++ = '\\', *dst++ = '\\';
    else if (c == '\n') *dst++ = '\\', *dst++ = 'n';
    else if (quote && c == '"') *dst++ = '\\', *dst++ = '"';
    else *dst++ = c;
  }
  return dst;
}

/* One allocation: the struct, the histogram's counts, the values (NUL-terminated), then
 * the rendered label set. */
static nh_metric_series_t *series_new(nh_metric_t *m, uint64_t h, const char *const *values, const size_t *lens)
{
  size_t ncounts = m->type == NH_METRIC_HISTOGRAM ? (size_t)m->nbuckets + 1 : 0;
  size_t text = 0, lbl_max = m->nlabels ? 2 : 0;   /* the braces */
  for (int i = 0; i < m->nlabels; i++) {
    text += lens[i] + 1;
    lbl_max += strlen(m->labels[i]) + 4 + 2 * lens[i];   /* name="value", and its comma */
  }
  size_t size = sizeof(nh_metric_series_t) + ncounts * sizeof(uint64_t) + text + lbl_max + 1;
  nh_metric_series_t *s = nh_xcalloc(1, size);
  char *p = (char *)(s + 1);
  if (ncounts) {
    s->counts = (uint64_t *)(void *)p;
    p += ncounts * sizeof(uint64_t);
  }
  s->hash = h;
  s->family = m;
  for (int i = 0; i < m->nlabels; i++) {
    memcpy(p, values[i] ? values[i] : "", lens[i]);
    p[lens[i]] = '\0';
    s->values[i] = p;
    s->vlen[i] = lens[i];
    p += lens[i] + 1;
  }
  char *l = p;
  s->lbl = l;
  if (m->nlabels) {
    *l++ = '{';
    for (int i = 0; i < m->nlabels; i++) {
      size_t nl = strlen(m->labels[i]);
      if (i) *l++ = ',';
      memcpy(l, m->labels[i], nl);
      l += nl;
      *l++ = '=', *l++ = '"';
      l = escape_to(l, s->values[i], lens[i], 1);
      *l++ = '"';
    }
    *l++ = '}';
  }
  *l = '\0';
  s->lbl_len = (size_t)(l - s->lbl);

  if (m->last) m->last->next = s;
  else m->first = s;
  m->last = s;
  m->nseries++;
  if ((m->nseries + 1) * 2 > m->nslots) slots_grow(m);   /* also puts s in its slot */
  else slot_put(m->slots, m->nslots, s);
  return s;
}

nh_metric_series_t *nh_metric_series(nh_metric_t *m, const char *const *values)
{
  if (!m->registered) family_register(m);
  size_t lens[NH_METRIC_MAX_LABELS];
  uint64_t h = hash_values(m->nlabels, values, lens);
  nh_metric_series_t *s = lookup(m, h, values, lens);
  if (s) return s;
  if (m->nseries >= NH_METRIC_MAX_SERIES) {
    static const char *const over[NH_METRIC_MAX_LABELS] = { "_overflow", "_overflow", "_overflow", "_overflow" };
    values = over;
    h = hash_values(m->nlabels, values, lens);
    if ((s = lookup(m, h, values, lens))) return s;
  }
  return series_new(m, h, values, lens);
}

void nh_metric_series_add(nh_metric_series_t *s, double v)
{
  if (metrics_on) s->value += v;
}

void nh_metric_series_set(nh_metric_series_t *s, double v)
{
  if (metrics_on) s->value = v;
}

double nh_metric_series_value(const nh_metric_series_t *s) { return s->counts ? (double)s->count : s->value; }

static int bucket_of(const double *b, int n, double v)
{
  int lo = 0, hi = n;   /* the first bound >= v, or n (+Inf) */
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (b[mid] >= v) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

void nh_metric_series_observe(nh_metric_series_t *s, double v)
{
  if (!metrics_on || !s->counts) return;   /* off, or not a histogram */
  s->counts[bucket_of(s->family->buckets, s->family->nbuckets, v)]++;
  s->sum += v;
  s->count++;
}

#define VALUES_FROM_ARGS(m, v, values)                                       \
  const char *values[NH_METRIC_MAX_LABELS] = { 0 };                          \
  do {                                                                       \
    va_list ap;                                                              \
    va_start(ap, v);                                                         \
    if (!(m)->registered) family_register(m);                                \
    for (int i_ = 0; i_ < (m)->nlabels; i_++) values[i_] = va_arg(ap, const char *); \
    va_end(ap);                                                              \
  } while (0)

void nh_metric_add(nh_metric_t *m, double v, ...)
{
  if (!metrics_on) return;
  VALUES_FROM_ARGS(m, v, values);
  nh_metric_series(m, values)->value += v;
}

void nh_metric_set(nh_metric_t *m, double v, ...)
{
  if (!metrics_on) return;
  VALUES_FROM_ARGS(m, v, values);
  nh_metric_series(m, values)->value = v;
}

void nh_metric_observe(nh_metric_t *m, double v, ...)
{
  if (!metrics_on) return;
  VALUES_FROM_ARGS(m, v, values);
  nh_metric_series_observe(nh_metric_series(m, values), v);
}

void nh_metric_clear(nh_metric_t *m)
{
  for (nh_metric_series_t *s = m->first, *n; s; s = n) {
    n = s->next;
    free(s);
  }
  free(m->slots);
  m->slots = NULL;
  m->nslots = m->nseries = 0;
  m->first = m->last = NULL;
}

void nh_metrics_on_collect(nh_metrics_collect_cb cb, void *data)
{
  collector_t *c = nh_xcalloc(1, sizeof *c);
  c->cb = cb;
  c->data = data;
  c->next = collectors;
  collectors = c;
}

void nh_metrics_off_collect(nh_metrics_collect_cb cb, void *data)
{
  for (collector_t **p = &collectors; *p; p = &(*p)->next) {
    if ((*p)->cb == cb && (*p)->data == data) {
      collector_t *c = *p;
      *p = c->next;
      free(c);
      return;
    }
  }
}

void nh_metrics_reset(void)
{
  for (nh_metric_t *m = families, *n; m; m = n) {
    n = m->next;
    nh_metric_clear(m);
    m->registered = 0;
    m->next = NULL;
  }
  families = families_last = NULL;
  while (collectors) {
    collector_t *c = collectors;
    collectors = c->next;
    free(c);
  }
}

/* ---------------------------------------------------------------- exposition */

typedef struct buf {
  char *p;
  size_t len, cap;
} buf_t;

/* Room for n more bytes and the NUL; doubles. */
static inline char *reserve(buf_t *b, size_t n)
{
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (b->len + n + 1 > cap) cap *= 2;
    b->p = nh_xrealloc(b->p, cap);
    b->cap = cap;
  }
  return b->p + b->len;
}

static inline char *cpy(char *d, const char *s, size_t n)
{
  memcpy(d, s, n);
  return d + n;
}

static const char digits2[201] = "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
                                 "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
                                 "8081828384858687888990919293949596979899";

/* Decimal digits of v at d; returns the end. */
static char *put_u64(char *d, uint64_t v)
{
  char tmp[20], *e = tmp + sizeof tmp, *p = e;
  while (v >= 100) {
    unsigned r = (unsigned)(v % 100);
    v /= 100;
    p -= 2;
    memcpy(p, digits2 + 2 * r, 2);
  }
  if (v >= 10) {
    p -= 2;
    memcpy(p, digits2 + 2 * v, 2);
  } else {
    *--p = (char)('0' + v);
  }
  return cpy(d, p, (size_t)(e - p));
}

#define NUMBER_MAX 32   /* the longest a value renders: %.17g is at most 24 characters */

/* A sample value as the text format reads it: integers (exact in a double) as digits,
 * others with %.17g (round-trips), and NaN, +Inf, -Inf. */
static char *put_number(char *d, double v)
{
  if (isnan(v)) return cpy(d, "NaN", 3);
  if (isinf(v)) return cpy(d, v > 0 ? "+Inf" : "-Inf", 4);
  if (v > -9007199254740992.0 && v < 9007199254740992.0 && v == (double)(int64_t)v) {
    if (v < 0) {
      *d++ = '-';
      return put_u64(d, (uint64_t)(-(int64_t)v));
    }
    return put_u64(d, (uint64_t)(int64_t)v);
  }
  int n = snprintf(d, NUMBER_MAX, "%.17g", v);
  return d + (n > 0 && n < NUMBER_MAX ? n : 0);
}

/* name suffix labels ' ' value '\n' for a counter, a gauge, a histogram's _sum or _count. */
static void put_sample(buf_t *b, const nh_metric_t *m, size_t name_len, const char *suffix, size_t suffix_len,
                       const nh_metric_series_t *s, double v)
{
  size_t lbl_len = s ? s->lbl_len : 0;
  char *d = reserve(b, name_len + suffix_len + lbl_len + NUMBER_MAX + 2);
  d = cpy(d, m->name, name_len);
  d = cpy(d, suffix, suffix_len);
  if (lbl_len) d = cpy(d, s->lbl, lbl_len);
  *d++ = ' ';
  d = put_number(d, v);
  *d++ = '\n';
  b->len = (size_t)(d - b->p);
}

typedef struct le_text {
  char s[32];
  size_t n;
} le_text_t;

static void render_histogram(buf_t *b, const nh_metric_t *m, size_t name_len, const le_text_t *le,
                             const nh_metric_series_t *s)
{
  /* name_bucket{labels,le="x"} count: the label set without its closing brace */
  const char *lbl = s && s->lbl_len ? s->lbl : "{";
  size_t lbl_len = s && s->lbl_len ? s->lbl_len - 1 : 1;
  const char *sep = s && s->lbl_len ? ",le=\"" : "le=\"";
  size_t sep_len = strlen(sep);
  uint64_t cum = 0;
  for (int i = 0; i <= m->nbuckets; i++) {
    cum += s ? s->counts[i] : 0;
    char *d = reserve(b, name_len + 7 + lbl_len + sep_len + le[i].n + 3 + 20 + 1);
    d = cpy(d, m->name, name_len);
    d = cpy(d, "_bucket", 7);
    d = cpy(d, lbl, lbl_len);
    d = cpy(d, sep, sep_len);
    d = cpy(d, le[i].s, le[i].n);
    d = cpy(d, "\"} ", 3);
    d = put_u64(d, cum);
    *d++ = '\n';
    b->len = (size_t)(d - b->p);
  }
  put_sample(b, m, name_len, "_sum", 4, s, s ? s->sum : 0);
  put_sample(b, m, name_len, "_count", 6, s, s ? (double)s->count : 0);
}

static void render_family(buf_t *b, const nh_metric_t *m)
{
  static const char *const types[] = { "counter", "gauge", "histogram" };
  size_t name_len = strlen(m->name), help_len = strlen(m->help), type_len = strlen(types[m->type]);
  char *d = reserve(b, 2 * name_len + 2 * help_len + type_len + 20);
  d = cpy(d, "# HELP ", 7);
  d = cpy(d, m->name, name_len);
  *d++ = ' ';
  d = escape_to(d, m->help, help_len, 0);
  d = cpy(d, "\n# TYPE ", 8);
  d = cpy(d, m->name, name_len);
  *d++ = ' ';
  d = cpy(d, types[m->type], type_len);
  *d++ = '\n';
  b->len = (size_t)(d - b->p);

  if (m->type != NH_METRIC_HISTOGRAM) {
    if (!m->first && m->nlabels == 0) put_sample(b, m, name_len, "", 0, NULL, 0);   /* its one sample */
    for (const nh_metric_series_t *s = m->first; s; s = s->next) put_sample(b, m, name_len, "", 0, s, s->value);
    return;
  }
  /* the bucket bounds' text, once per family and render (%g, as ever: le values name series) */
  le_text_t small[32], *le = m->nbuckets < 32 ? small : nh_xmalloc(((size_t)m->nbuckets + 1) * sizeof *le);
  for (int i = 0; i < m->nbuckets; i++) {
    int n = snprintf(le[i].s, sizeof le[i].s, "%g", m->buckets[i]);
    le[i].n = n > 0 && (size_t)n < sizeof le[i].s ? (size_t)n : 0;
  }
  memcpy(le[m->nbuckets].s, "+Inf", 5);
  le[m->nbuckets].n = 4;
  if (!m->first && m->nlabels == 0) render_histogram(b, m, name_len, le, NULL);
  for (const nh_metric_series_t *s = m->first; s; s = s->next) render_histogram(b, m, name_len, le, s);
  if (le != small) free(le);
}

static size_t last_len;   /* the previous exposition's size: the next starts with that room */

char *nh_metrics_render(size_t *len)
{
  if (!metrics_on) {
    if (len) *len = sizeof METRICS_OFF_TEXT - 1;
    return nh_xstrdup(METRICS_OFF_TEXT);
  }
  for (collector_t *c = collectors; c; c = c->next) c->cb(c->data);
  buf_t b = { 0 };
  reserve(&b, last_len + last_len / 8 + 1024);
  b.p[0] = '\0';
  for (const nh_metric_t *m = families; m; m = m->next) render_family(&b, m);
  b.p[b.len] = '\0';
  last_len = b.len;
  if (len) *len = b.len;
  return b.p;
}
