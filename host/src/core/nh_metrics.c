/* Metrics registry and Prometheus text exposition (nh_metrics.h). */
#include "nh_metrics.h"
#include "nh_util.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct nh_metric_series {
  char *key;                         /* the label values joined by \x1f (the hash key) */
  const char *values[NH_METRIC_MAX_LABELS];   /* into key_copy */
  char *key_copy;                    /* the values, NUL-separated */
  double value;                      /* counters, gauges */
  uint64_t *counts;                  /* histograms: per bucket (not cumulative), then +Inf */
  double sum;
  uint64_t count;
  const nh_metric_t *family;
  nh_metric_series_t *next;
};

const double nh_metric_buckets_fast[14] = { 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                            0.25,  0.5,    1,     2.5,  5,     10,  60 };
const double nh_metric_buckets_slow[18] = { 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                            1,     2.5,    5,     10,   30,    60,   300, 900, 3600 };

static nh_metric_t *families, *families_last;

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

static uint64_t hash_key(const char *key)
{
  uint64_t h = 1469598103934665603ULL;
  for (const unsigned char *p = (const unsigned char *)key; *p; p++) h = (h ^ *p) * 1099511628211ULL;
  return h;
}

static void slots_grow(nh_metric_t *m)
{
  size_t n = m->nslots ? m->nslots * 2 : 16;
  nh_metric_series_t **slots = nh_xcalloc(n, sizeof *slots);
  for (nh_metric_series_t *s = m->first; s; s = s->next) {
    size_t i = (size_t)hash_key(s->key) & (n - 1);
    while (slots[i]) i = (i + 1) & (n - 1);
    slots[i] = s;
  }
  free(m->slots);
  m->slots = slots;
  m->nslots = n;
}

static char *join_values(const nh_metric_t *m, const char *const *values)
{
  size_t len = 1;
  for (int i = 0; i < m->nlabels; i++) len += strlen(values[i] ? values[i] : "") + 1;
  char *key = nh_xmalloc(len), *p = key;
  for (int i = 0; i < m->nlabels; i++) {
    const char *v = values[i] ? values[i] : "";
    size_t n = strlen(v);
    memcpy(p, v, n);
    p += n;
    if (i + 1 < m->nlabels) *p++ = '\x1f';
  }
  *p = '\0';
  return key;
}

static nh_metric_series_t *series_new(nh_metric_t *m, char *key)
{
  nh_metric_series_t *s = nh_xcalloc(1, sizeof *s);
  s->key = key;
  s->key_copy = nh_xstrdup(key);
  s->family = m;
  char *p = s->key_copy;
  for (int i = 0; i < m->nlabels; i++) {
    s->values[i] = p;
    char *sep = strchr(p, '\x1f');
    if (sep) *sep = '\0', p = sep + 1;
    else p += strlen(p);
  }
  if (m->type == NH_METRIC_HISTOGRAM) s->counts = nh_xcalloc((size_t)m->nbuckets + 1, sizeof *s->counts);
  if (m->last) m->last->next = s;
  else m->first = s;
  m->last = s;
  m->nseries++;
  return s;
}

static nh_metric_series_t *lookup(nh_metric_t *m, const char *key)
{
  if (!m->nslots) return NULL;
  size_t i = (size_t)hash_key(key) & (m->nslots - 1);
  for (; m->slots[i]; i = (i + 1) & (m->nslots - 1))
    if (strcmp(m->slots[i]->key, key) == 0) return m->slots[i];
  return NULL;
}

nh_metric_series_t *nh_metric_series(nh_metric_t *m, const char *const *values)
{
  if (!m->registered) family_register(m);
  char *key = join_values(m, values);
  nh_metric_series_t *s = lookup(m, key);
  if (s) {
    free(key);
    return s;
  }
  if (m->nseries >= NH_METRIC_MAX_SERIES) {
    free(key);
    const char *over[NH_METRIC_MAX_LABELS] = { "_overflow", "_overflow", "_overflow", "_overflow" };
    key = join_values(m, over);
    s = lookup(m, key);
    if (s) {
      free(key);
      return s;
    }
  }
  if ((m->nseries + 1) * 2 > m->nslots) slots_grow(m);
  s = series_new(m, key);
  size_t i = (size_t)hash_key(key) & (m->nslots - 1);
  while (m->slots[i]) i = (i + 1) & (m->nslots - 1);
  m->slots[i] = s;
  return s;
}

void nh_metric_series_add(nh_metric_series_t *s, double v) { s->value += v; }
void nh_metric_series_set(nh_metric_series_t *s, double v) { s->value = v; }
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
  if (!s->counts) return;   /* not a histogram */
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
  VALUES_FROM_ARGS(m, v, values);
  nh_metric_series_add(nh_metric_series(m, values), v);
}

void nh_metric_set(nh_metric_t *m, double v, ...)
{
  VALUES_FROM_ARGS(m, v, values);
  nh_metric_series_set(nh_metric_series(m, values), v);
}

void nh_metric_observe(nh_metric_t *m, double v, ...)
{
  VALUES_FROM_ARGS(m, v, values);
  nh_metric_series_observe(nh_metric_series(m, values), v);
}

static void series_free(nh_metric_series_t *s)
{
  free(s->key);
  free(s->key_copy);
  free(s->counts);
  free(s);
}

void nh_metric_clear(nh_metric_t *m)
{
  for (nh_metric_series_t *s = m->first, *n; s; s = n) {
    n = s->next;
    series_free(s);
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

static void put(buf_t *b, const char *s, size_t n)
{
  if (b->len + n + 1 > b->cap) {
    b->cap = (b->len + n + 1) * 2;
    b->p = nh_xrealloc(b->p, b->cap);
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
}

static void puts_(buf_t *b, const char *s) { put(b, s, strlen(s)); }

/* Label values escape backslash, double quote and newline; HELP text backslash and newline. */
static void put_escaped(buf_t *b, const char *s, int quote)
{
  for (; *s; s++) {
    if (*s == '\\') puts_(b, "\\\\");
    else if (*s == '\n') puts_(b, "\\n");
    else if (quote && *s == '"') puts_(b, "\\\"");
    else put(b, s, 1);
  }
}

static void put_number(buf_t *b, double v)
{
  char tmp[40];
  if (isnan(v)) snprintf(tmp, sizeof tmp, "NaN");
  else if (isinf(v)) snprintf(tmp, sizeof tmp, v > 0 ? "+Inf" : "-Inf");
  else if (v == floor(v) && fabs(v) < 9007199254740992.0) snprintf(tmp, sizeof tmp, "%.0f", v);
  else snprintf(tmp, sizeof tmp, "%.17g", v);
  puts_(b, tmp);
}

/* name{labels[,le="x"]} */
static void put_sample_name(buf_t *b, const nh_metric_t *m, const nh_metric_series_t *s, const char *suffix,
                            const char *le)
{
  puts_(b, m->name);
  puts_(b, suffix);
  if (!m->nlabels && !le) return;
  puts_(b, "{");
  for (int i = 0; i < m->nlabels; i++) {
    if (i) puts_(b, ",");
    puts_(b, m->labels[i]);
    puts_(b, "=\"");
    put_escaped(b, s ? s->values[i] : "", 1);
    puts_(b, "\"");
  }
  if (le) {
    if (m->nlabels) puts_(b, ",");
    puts_(b, "le=\"");
    puts_(b, le);
    puts_(b, "\"");
  }
  puts_(b, "}");
}

static void render_histogram(buf_t *b, const nh_metric_t *m, const nh_metric_series_t *s)
{
  uint64_t cum = 0;
  char le[40];
  for (int i = 0; i <= m->nbuckets; i++) {
    cum += s ? s->counts[i] : 0;
    if (i < m->nbuckets) snprintf(le, sizeof le, "%g", m->buckets[i]);
    else snprintf(le, sizeof le, "+Inf");
    put_sample_name(b, m, s, "_bucket", le);
    puts_(b, " ");
    put_number(b, (double)cum);
    puts_(b, "\n");
  }
  put_sample_name(b, m, s, "_sum", NULL);
  puts_(b, " ");
  put_number(b, s ? s->sum : 0);
  puts_(b, "\n");
  put_sample_name(b, m, s, "_count", NULL);
  puts_(b, " ");
  put_number(b, s ? (double)s->count : 0);
  puts_(b, "\n");
}

static void render_family(buf_t *b, const nh_metric_t *m)
{
  static const char *const types[] = { "counter", "gauge", "histogram" };
  puts_(b, "# HELP ");
  puts_(b, m->name);
  puts_(b, " ");
  put_escaped(b, m->help, 0);
  puts_(b, "\n# TYPE ");
  puts_(b, m->name);
  puts_(b, " ");
  puts_(b, types[m->type]);
  puts_(b, "\n");
  if (!m->first && m->nlabels == 0) {   /* a family without labels always has its one sample */
    if (m->type == NH_METRIC_HISTOGRAM) {
      render_histogram(b, m, NULL);
    } else {
      puts_(b, m->name);
      puts_(b, " 0\n");
    }
    return;
  }
  for (const nh_metric_series_t *s = m->first; s; s = s->next) {
    if (m->type == NH_METRIC_HISTOGRAM) {
      render_histogram(b, m, s);
      continue;
    }
    put_sample_name(b, m, s, "", NULL);
    puts_(b, " ");
    put_number(b, s->value);
    puts_(b, "\n");
  }
}

char *nh_metrics_render(size_t *len)
{
  for (collector_t *c = collectors; c; c = c->next) c->cb(c->data);
  buf_t b = { 0 };
  put(&b, "", 0);
  for (const nh_metric_t *m = families; m; m = m->next) render_family(&b, m);
  if (len) *len = b.len;
  return b.p;
}
