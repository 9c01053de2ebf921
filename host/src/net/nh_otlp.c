/* The OTLP/HTTP JSON span exporter of nh_otlp.h.
 *
 * Each span is encoded to its OTLP/JSON text when it is added, so a queued span costs
 * one allocation of its own size and a batch is only those texts joined between a
 * prefix (resource and scope, encoded once at start) and a suffix. One uv_timer: the
 * flush timer, and while stopping the stop deadline. */
#include "nh_otlp.h"
#include "core/nh_log.h"
#include "core/nh_metrics.h"
#include "core/nh_trace.h"
#include "core/nh_util.h"
#include "net/nh_http_client.h"

#include <curl/curl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define OTLP_SUBSYS "otlp"
#define OTLP_SCOPE "nimbus-host"
#define OTLP_PATH "/v1/traces"
#define OTLP_MAX_STR 4096          /* bytes of a name, value or message; longer is cut */
#define OTLP_MAX_ATTRS 128         /* OpenTelemetry's default attribute count limit */
#define OTLP_MAX_QUEUE 1000000     /* spans: a bigger queue_max is surely a typo */
#define OTLP_QUEUE_BYTES (64u << 20)   /* encoded spans queued at most, whatever their size */
#define OTLP_STOP_MS 2000          /* the whole of stop: in-flight export and the last one */

static const char suffix[] = "]}]}]}";

typedef struct sbuf {
  char *p;
  size_t len, cap;
} sbuf_t;

typedef struct slot {
  char *json;        /* the span's OTLP/JSON object */
  size_t len;
  uint64_t enq_ms;   /* uv_now when queued: the flush deadline of a partial batch */
} slot_t;

struct nh_otlp {
  uv_loop_t *loop;
  uv_timer_t timer;
  char *url;                 /* with /v1/traces when given a base URL */
  char *log_url;             /* the same without user info, for log lines */
  char **headers;            /* Content-Type, then the caller's */
  int nheaders;
  char *prefix;              /* {"resourceSpans":[{"resource":...,"scopeSpans":[{...,"spans":[ */
  size_t prefix_len;
  slot_t *slots;             /* ring of queue_max */
  int cap, head, count;
  size_t bytes;              /* of the queued texts */
  int batch_max, flush_ms;
  double timeout_s;
  nh_http_call_t *call;      /* the export in flight, or NULL */
  int call_spans;
  int failing;               /* in a failure streak: warned once already */
  uint64_t streak_failures, streak_dropped;
  int stopping, closing;
  uint64_t stop_deadline;    /* uv_now ms */
  void (*done)(void *);
  void *done_data;
  nh_otlp_stats_t st;
  sbuf_t scratch;            /* where spans are encoded; each keeps a copy of its exact size */
};

static void after_export(nh_otlp_t *x);

/* ---------------------------------------------------------------- metrics */

static nh_metric_t m_spans = NH_METRIC_DEF(NH_METRIC_COUNTER, "nimbus_otlp_spans_total",
  "Trace spans by what became of them: exported, dropped_queue_full, dropped_export_failed", "result");
static nh_metric_t m_failures = NH_METRIC_DEF(NH_METRIC_COUNTER, "nimbus_otlp_export_failures_total",
  "OTLP export requests refused, timed out or answered with a non-2xx status");

/* Read at each scrape from the exporter's own counts (nothing per span). */
static void collect(void *data)
{
  const nh_otlp_t *x = data;
  nh_metric_set(&m_spans, (double)x->st.exported, "exported");
  nh_metric_set(&m_spans, (double)x->st.dropped_full, "dropped_queue_full");
  nh_metric_set(&m_spans, (double)x->st.dropped_failed, "dropped_export_failed");
  nh_metric_set(&m_failures, (double)x->st.export_failures);
}

/* ---------------------------------------------------------------- encoding */

/* Length of the valid UTF-8 sequence at p (of n bytes left), 0 when invalid. */
static size_t utf8_seq(const unsigned char *p, size_t n)
{
  unsigned c = p[0], cp, min;
  size_t len;
  if (c < 0x80) return 1;
  if ((c & 0xe0) == 0xc0) len = 2, min = 0x80;
  else if ((c & 0xf0) == 0xe0) len = 3, min = 0x800;
  else if ((c & 0xf8) == 0xf0) len = 4, min = 0x10000;
  else return 0;
  if (len > n) return 0;
  cp = c & (0x7fu >> len);
  for (size_t i = 1; i < len; i++) {
    if ((p[i] & 0xc0) != 0x80) return 0;
    cp = cp << 6 | (p[i] & 0x3fu);
  }
  if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  return len;
}

/* A span is encoded once per handler run, on the loop thread, so it is written straight
 * into one buffer in its fixed OTLP/JSON shape (building a jansson tree and dumping it
 * was 18% of a traced host's CPU, docs/observability.md). Only the resource prefix,
 * made once, goes through jansson. Strings are escaped as RFC 8259 asks and cut to
 * OTLP_MAX_STR bytes at a character boundary; bytes that are not valid UTF-8 (whatever
 * an adapter or a peer sent) become '?' rather than costing the span. */
static void sb_reserve(sbuf_t *b, size_t more)
{
  if (b->len + more <= b->cap) return;
  size_t cap = b->cap ? b->cap : 512;
  while (cap < b->len + more) cap *= 2;
  b->p = nh_xrealloc(b->p, cap);
  b->cap = cap;
}

static void sb_put(sbuf_t *b, const char *s, size_t n)
{
  sb_reserve(b, n);
  memcpy(b->p + b->len, s, n);
  b->len += n;
}

#define SB_LIT(b, lit) sb_put((b), (lit), sizeof(lit) - 1)

static void sb_str(sbuf_t *b, const char *s)
{
  if (!s) s = "";
  size_t n = strlen(s);
  if (n > OTLP_MAX_STR) {
    n = OTLP_MAX_STR;
    while (n > 0 && ((unsigned char)s[n] & 0xc0) == 0x80) n--;
  }
  sb_reserve(b, n * 6 + 2);   /* the worst case: every byte a \u00XX */
  char *o = b->p + b->len;
  *o++ = '"';
  static const char hex[] = "0123456789abcdef";
  for (size_t i = 0; i < n;) {
    unsigned char c = (unsigned char)s[i];
    if (c >= 0x80) {
      size_t k = utf8_seq((const unsigned char *)s + i, n - i);
      if (k == 0) {
        *o++ = '?';
        i++;
      } else {
        memcpy(o, s + i, k);
        o += k;
        i += k;
      }
      continue;
    }
    i++;
    if (c == '"' || c == '\\') {
      *o++ = '\\';
      *o++ = (char)c;
    } else if (c < 0x20) {
      *o++ = '\\';
      switch (c) {
      case '\n': *o++ = 'n'; break;
      case '\r': *o++ = 'r'; break;
      case '\t': *o++ = 't'; break;
      default:
        *o++ = 'u', *o++ = '0', *o++ = '0', *o++ = hex[c >> 4], *o++ = hex[c & 15];
      }
    } else {
      *o++ = (char)c;
    }
  }
  *o++ = '"';
  b->len = (size_t)(o - b->p);
}

static void sb_hex_id(sbuf_t *b, const uint8_t *id, size_t n)
{
  char hex[35];
  hex[0] = '"';
  nh_trace_hex(id, n, hex + 1);
  hex[2 * n + 1] = '"';
  sb_put(b, hex, 2 * n + 2);
}

/* OTLP/JSON writes 64-bit integers as decimal strings (JavaScript loses precision past 2^53). */
static void sb_int64_string(sbuf_t *b, int64_t v)
{
  char buf[24];
  int n = snprintf(buf, sizeof buf, "\"%" PRId64 "\"", v);
  sb_put(b, buf, (size_t)n);
}

static void attrs_encode(sbuf_t *b, const nh_span_attr_t *attrs, int n)
{
  SB_LIT(b, "[");
  int kept = 0;
  for (int i = 0; i < n && kept < OTLP_MAX_ATTRS; i++) {
    if (!attrs[i].key) continue;
    if (kept++) SB_LIT(b, ",");
    SB_LIT(b, "{\"key\":");
    sb_str(b, attrs[i].key);
    if (attrs[i].is_num) {
      SB_LIT(b, ",\"value\":{\"intValue\":");
      sb_int64_string(b, attrs[i].num);
    } else {
      SB_LIT(b, ",\"value\":{\"stringValue\":");
      sb_str(b, attrs[i].str);
    }
    SB_LIT(b, "}}");
  }
  SB_LIT(b, "]");
}

/* Encodes s into the exporter's scratch buffer (grown once, reused: no reallocation per
 * span) and returns a copy of the exact size. */
static char *span_encode(sbuf_t *scratch, const nh_span_t *s, size_t *len)
{
  int kind = (int)s->kind;
  if (kind < NH_SPAN_INTERNAL || kind > NH_SPAN_CONSUMER) kind = NH_SPAN_INTERNAL;
  sbuf_t b = *scratch;
  b.len = 0;
  sb_reserve(&b, 2048);
  SB_LIT(&b, "{\"traceId\":");
  sb_hex_id(&b, s->trace_id, sizeof s->trace_id);
  SB_LIT(&b, ",\"spanId\":");
  sb_hex_id(&b, s->span_id, sizeof s->span_id);
  if (s->has_parent) {
    SB_LIT(&b, ",\"parentSpanId\":");
    sb_hex_id(&b, s->parent_span_id, sizeof s->parent_span_id);
  }
  SB_LIT(&b, ",\"name\":");
  sb_str(&b, s->name);
  char num[16];
  sb_put(&b, num, (size_t)snprintf(num, sizeof num, ",\"kind\":%d", kind));
  /* fixed64 nanoseconds: a negative time (a bug upstream) is sent as 0, not as a huge one */
  SB_LIT(&b, ",\"startTimeUnixNano\":");
  sb_int64_string(&b, s->start_ns < 0 ? 0 : s->start_ns);
  SB_LIT(&b, ",\"endTimeUnixNano\":");
  sb_int64_string(&b, s->end_ns < 0 ? 0 : s->end_ns);
  SB_LIT(&b, ",\"attributes\":");
  attrs_encode(&b, s->attrs, s->attrs ? s->nattrs : 0);
  /* the spec gives a description to ERROR only; UNSET, not OK, is what instrumentation sets */
  if (s->error) SB_LIT(&b, ",\"status\":{\"code\":2,\"message\":");
  else SB_LIT(&b, ",\"status\":{\"code\":0,\"message\":");
  sb_str(&b, s->error ? s->status_message : NULL);
  SB_LIT(&b, "}}");
  *scratch = b;
  *len = b.len;
  char *out = nh_xmalloc(b.len + 1);
  memcpy(out, b.p, b.len);
  out[b.len] = '\0';
  return out;
}

/* jansson for the prefix (once per process): it refuses invalid UTF-8, which becomes '?' */
static json_t *text(const char *s)
{
  if (!s) s = "";
  size_t n = strlen(s);
  json_t *j = json_stringn(s, n);
  if (j) return j;
  char *clean = nh_xstrndup(s, n);
  for (size_t i = 0; i < n;) {
    size_t k = utf8_seq((unsigned char *)clean + i, n - i);
    if (k == 0) clean[i++] = '?';
    else i += k;
  }
  j = json_stringn(clean, n);
  free(clean);
  return j;
}

static json_t *key_value(const char *key, json_t *value)
{
  json_t *kv = json_object();
  json_object_set_new(kv, "key", text(key));
  json_object_set_new(kv, "value", value);
  return kv;
}

static json_t *string_value(const char *s)
{
  json_t *v = json_object();
  json_object_set_new(v, "stringValue", text(s));
  return v;
}

/* Resource and scope, the same for every request: encoded once. */
static char *prefix_encode(const char *service, const nh_otlp_attr_t *attrs, int n, size_t *len)
{
  json_t *a = json_array();
  json_array_append_new(a, key_value("service.name", string_value(service)));
  for (int i = 0; i < n; i++) json_array_append_new(a, key_value(attrs[i].key, string_value(attrs[i].value)));
  json_t *res = json_object();
  json_object_set_new(res, "attributes", a);
  char *rs = json_dumps(res, JSON_COMPACT | JSON_PRESERVE_ORDER);
  json_decref(res);
  size_t cap = strlen(rs) + 128;
  char *p = nh_xmalloc(cap);
  int w = snprintf(p, cap, "{\"resourceSpans\":[{\"resource\":%s,\"scopeSpans\":[{\"scope\":{\"name\":\"%s\"},\"spans\":[",
                   rs, OTLP_SCOPE);
  free(rs);
  *len = (size_t)w;
  return p;
}

/* ---------------------------------------------------------------- options */

/* The request URL: checked, with /v1/traces when the path is empty or "/". Also the
 * URL without user info, for the log. */
static int url_resolve(const char *url, char **out, char **log_url, nh_error_t *err)
{
  if (!url || !*url) return nh_error_set(err, NH_EUSAGE, "otlp: a collector URL is required (http://host:4318)");
  if (strncasecmp(url, "http://", 7) != 0 && strncasecmp(url, "https://", 8) != 0)
    return nh_error_set(err, NH_EUSAGE, "otlp: invalid URL '%s': it must start with http:// or https://", url);
  CURLU *u = curl_url();
  CURLUcode rc = curl_url_set(u, CURLUPART_URL, url, 0);
  if (rc != CURLUE_OK) {
    curl_url_cleanup(u);
    return nh_error_set(err, NH_EUSAGE, "otlp: invalid URL '%s': %s", url, curl_url_strerror(rc));
  }
  char *path = NULL, *full = NULL, *bare = NULL;
  curl_url_get(u, CURLUPART_PATH, &path, 0);
  if (!path || !*path || strcmp(path, "/") == 0) curl_url_set(u, CURLUPART_PATH, OTLP_PATH, 0);
  curl_free(path);
  curl_url_get(u, CURLUPART_URL, &full, 0);
  curl_url_set(u, CURLUPART_USER, NULL, 0);
  curl_url_set(u, CURLUPART_PASSWORD, NULL, 0);
  curl_url_get(u, CURLUPART_URL, &bare, 0);
  curl_url_cleanup(u);
  *out = nh_xstrdup(full);
  *log_url = nh_xstrdup(bare ? bare : full);
  curl_free(full);
  curl_free(bare);
  return 0;
}

static int check_count(const char *name, int v, int dflt, int max, int *out, nh_error_t *err)
{
  if (v < 0 || v > max) return nh_error_set(err, NH_EUSAGE, "otlp: %s must be between 1 and %d (0: %d), not %d", name, max, dflt, v);
  *out = v ? v : dflt;
  return 0;
}

static int check_attrs(const nh_otlp_opts_t *o, nh_error_t *err)
{
  if (o->service_name && !*o->service_name) return nh_error_set(err, NH_EUSAGE, "otlp: service_name is empty");
  if (o->nresource_attrs < 0 || (o->nresource_attrs > 0 && !o->resource_attrs))
    return nh_error_set(err, NH_EUSAGE, "otlp: resource_attrs is missing for nresource_attrs %d", o->nresource_attrs);
  for (int i = 0; i < o->nresource_attrs; i++) {
    const nh_otlp_attr_t *a = &o->resource_attrs[i];
    if (!a->key || !*a->key) return nh_error_set(err, NH_EUSAGE, "otlp: resource attribute %d has no key", i + 1);
    if (!a->value) return nh_error_set(err, NH_EUSAGE, "otlp: resource attribute '%s' has no value", a->key);
    if (strcmp(a->key, "service.name") == 0)
      return nh_error_set(err, NH_EUSAGE, "otlp: give service.name as service_name, not as a resource attribute");
    for (int j = 0; j < i; j++)
      if (strcmp(o->resource_attrs[j].key, a->key) == 0)
        return nh_error_set(err, NH_EUSAGE, "otlp: resource attribute '%s' is given twice", a->key);
  }
  return 0;
}

static int check_headers(const nh_otlp_opts_t *o, nh_error_t *err)
{
  if (o->nheaders < 0 || (o->nheaders > 0 && !o->headers))
    return nh_error_set(err, NH_EUSAGE, "otlp: headers is missing for nheaders %d", o->nheaders);
  for (int i = 0; i < o->nheaders; i++) {
    const char *h = o->headers[i];
    if (!h || !strchr(h, ':') || h[0] == ':' || strpbrk(h, "\r\n"))
      return nh_error_set(err, NH_EUSAGE, "otlp: header %d is not one \"Name: value\" line", i + 1);
  }
  return 0;
}

static int check_opts(const nh_otlp_opts_t *o, nh_otlp_t *x, nh_error_t *err)
{
  if (check_count("queue_max", o->queue_max, 2048, OTLP_MAX_QUEUE, &x->cap, err) ||
      check_count("batch_max", o->batch_max, x->cap < 512 ? x->cap : 512, OTLP_MAX_QUEUE, &x->batch_max, err) ||
      check_count("flush_ms", o->flush_ms, 1000, 3600 * 1000, &x->flush_ms, err))
    return NH_EUSAGE;
  if (x->batch_max > x->cap)
    return nh_error_set(err, NH_EUSAGE, "otlp: batch_max (%d) is larger than queue_max (%d)", x->batch_max, x->cap);
  if (!(o->timeout_s >= 0 && o->timeout_s <= 600))   /* also NaN */
    return nh_error_set(err, NH_EUSAGE, "otlp: timeout_s must be between 0 and 600 seconds (0: 5), not %g", o->timeout_s);
  x->timeout_s = o->timeout_s > 0 ? o->timeout_s : 5.0;
  if (check_attrs(o, err) || check_headers(o, err)) return NH_EUSAGE;
  return 0;
}

/* ---------------------------------------------------------------- the exporter */

nh_otlp_t *nh_otlp_start(uv_loop_t *loop, const nh_otlp_opts_t *opts, nh_error_t *err)
{
  nh_otlp_t tmp = { 0 };
  if (!opts) {
    nh_error_set(err, NH_EUSAGE, "otlp: no options");
    return NULL;
  }
  if (check_opts(opts, &tmp, err) != 0 || url_resolve(opts->url, &tmp.url, &tmp.log_url, err) != 0) return NULL;
  nh_otlp_t *x = nh_xmalloc(sizeof *x);
  *x = tmp;
  x->loop = loop;
  x->slots = nh_xcalloc((size_t)x->cap, sizeof *x->slots);
  x->nheaders = opts->nheaders + 1;
  x->headers = nh_xcalloc((size_t)x->nheaders, sizeof *x->headers);
  x->headers[0] = nh_xstrdup("Content-Type: application/json");
  for (int i = 0; i < opts->nheaders; i++) x->headers[i + 1] = nh_xstrdup(opts->headers[i]);
  x->prefix = prefix_encode(opts->service_name ? opts->service_name : "nimbus-host", opts->resource_attrs,
                            opts->nresource_attrs, &x->prefix_len);
  uv_timer_init(loop, &x->timer);
  x->timer.data = x;
  uv_unref((uv_handle_t *)&x->timer);   /* queued spans alone do not hold the process */
  nh_metrics_on_collect(collect, x);
  collect(x);   /* the families show (at 0) from the first scrape */
  return x;
}

void nh_otlp_stats(const nh_otlp_t *x, nh_otlp_stats_t *out) { *out = x->st; }

/* Takes the n oldest spans off the queue into one request body. */
static char *batch_take(nh_otlp_t *x, int n, size_t *len)
{
  size_t total = x->prefix_len + sizeof suffix;
  for (int i = 0; i < n; i++) total += x->slots[(x->head + i) % x->cap].len + 1;
  char *body = nh_xmalloc(total), *p = body;
  memcpy(p, x->prefix, x->prefix_len);
  p += x->prefix_len;
  for (int i = 0; i < n; i++) {
    slot_t *sl = &x->slots[x->head];
    if (i) *p++ = ',';
    memcpy(p, sl->json, sl->len);
    p += sl->len;
    x->bytes -= sl->len;
    free(sl->json);
    sl->json = NULL;
    x->head = (x->head + 1) % x->cap;
  }
  x->count -= n;
  memcpy(p, suffix, sizeof suffix - 1);
  p += sizeof suffix - 1;
  *len = (size_t)(p - body);
  return body;
}

static void export_failed(nh_otlp_t *x, int n, const char *why)
{
  x->st.export_failures++;
  x->st.dropped_failed += (uint64_t)n;
  x->streak_failures++;
  x->streak_dropped += (uint64_t)n;
  if (x->failing) return;   /* one line per streak: a collector that stays down is not news */
  x->failing = 1;
  nh_log_fields(NH_LOG_WARN, OTLP_SUBSYS,
                (nh_log_field_t[]){ NH_LOG_STR("url", x->log_url), NH_LOG_STR("error", why) }, 2,
                "span export failed; spans are dropped until the collector answers again");
}

static void export_ok(nh_otlp_t *x, int n)
{
  x->st.exported += (uint64_t)n;
  if (!x->failing) return;
  nh_log_fields(NH_LOG_INFO, OTLP_SUBSYS,
                (nh_log_field_t[]){ NH_LOG_STR("url", x->log_url), NH_LOG_INT("failed_exports", x->streak_failures),
                                    NH_LOG_INT("dropped_spans", x->streak_dropped) },
                3, "span export works again");
  x->failing = 0;
  x->streak_failures = x->streak_dropped = 0;
}

static void export_done(void *data, nh_http_res_t *res)
{
  nh_otlp_t *x = data;
  int n = x->call_spans;
  x->call = NULL;
  x->call_spans = 0;
  if (res->status >= 200 && res->status < 300) {
    export_ok(x, n);
  } else {
    char why[300];
    if (res->status) snprintf(why, sizeof why, "HTTP status %ld", res->status);
    else snprintf(why, sizeof why, "%s: %s", res->error_code ? res->error_code : "EHTTP", res->error);
    export_failed(x, n, why);
  }
  after_export(x);
}

static void export_start(nh_otlp_t *x, int n, double timeout_s)
{
  size_t len;
  char *body = batch_take(x, n, &len);
  nh_http_req_t req = { .method = "POST", .url = x->url, .headers = (const char *const *)x->headers,
                        .nheaders = x->nheaders, .body = body, .body_len = len, .timeout_s = timeout_s };
  nh_error_t err = { 0 };
  x->call = nh_http_request(x->loop, &req, export_done, x, &err);
  free(body);   /* the client keeps its own copy */
  if (x->call) {
    x->call_spans = n;
    return;
  }
  export_failed(x, n, err.msg);
  after_export(x);
}

static void flush_due(uv_timer_t *t)
{
  nh_otlp_t *x = t->data;
  if (!x->call && x->count > 0) export_start(x, x->count < x->batch_max ? x->count : x->batch_max, x->timeout_s);
}

/* Arms the flush timer for what is queued: at once for a full batch, else flush_ms after
 * the oldest span. With an export in flight its completion comes back here. */
static void schedule(nh_otlp_t *x)
{
  if (x->call || x->stopping) return;
  if (x->count == 0) {
    uv_timer_stop(&x->timer);
    return;
  }
  uint64_t delay = 0;
  if (x->count < x->batch_max) {
    uint64_t due = x->slots[x->head].enq_ms + (uint64_t)x->flush_ms, now = uv_now(x->loop);
    delay = due > now ? due - now : 0;
  }
  uv_timer_start(&x->timer, flush_due, delay, 0);
}

void nh_otlp_add(nh_otlp_t *x, const nh_span_t *span)
{
  if (x->stopping || x->count == x->cap) {
    x->st.dropped_full++;
    return;
  }
  size_t len;
  char *json = span_encode(&x->scratch, span, &len);
  if (x->bytes + len > OTLP_QUEUE_BYTES) {   /* huge spans: the count alone would not bound memory */
    free(json);
    x->st.dropped_full++;
    return;
  }
  slot_t *sl = &x->slots[(x->head + x->count) % x->cap];
  sl->json = json;
  sl->len = len;
  sl->enq_ms = uv_now(x->loop);
  x->bytes += len;
  x->count++;
  x->st.queued++;
  /* only these two change when the next export is due */
  if (x->count == 1 || x->count == x->batch_max) schedule(x);
}

/* ---------------------------------------------------------------- stop */

static void closed(uv_handle_t *h)
{
  nh_otlp_t *x = h->data;
  void (*done)(void *) = x->done;
  void *data = x->done_data;
  collect(x);   /* the last counts stay on /metrics */
  nh_metrics_off_collect(collect, x);
  for (int i = 0; i < x->nheaders; i++) free(x->headers[i]);
  free(x->headers);
  free(x->slots);
  free(x->prefix);
  free(x->url);
  free(x->log_url);
  free(x->scratch.p);
  free(x);
  if (done) done(data);
}

/* What is still queued is dropped (stop ran out of time, or an export failed). */
static void close_now(nh_otlp_t *x)
{
  if (x->closing) return;
  x->closing = 1;
  x->st.dropped_failed += (uint64_t)x->count;
  while (x->count > 0) {
    free(x->slots[x->head].json);
    x->head = (x->head + 1) % x->cap;
    x->count--;
  }
  uv_timer_stop(&x->timer);
  uv_close((uv_handle_t *)&x->timer, closed);
}

/* Stopping, nothing in flight: the last export, with what is left of the deadline. */
static void stop_continue(nh_otlp_t *x)
{
  uint64_t now = uv_now(x->loop);
  if (x->count == 0 || now >= x->stop_deadline) {
    close_now(x);
    return;
  }
  export_start(x, x->count, (double)(x->stop_deadline - now) / 1000.0);
}

static void after_export(nh_otlp_t *x)
{
  if (x->stopping) stop_continue(x);
  else schedule(x);
}

static void stop_expired(uv_timer_t *t)
{
  nh_otlp_t *x = t->data;
  if (x->call) {
    nh_http_cancel(x->call);
    x->call = NULL;
    export_failed(x, x->call_spans, "the collector did not answer before the exporter stopped");
    x->call_spans = 0;
  }
  close_now(x);
}

void nh_otlp_stop(nh_otlp_t *x, void (*done)(void *data), void *data)
{
  if (x->stopping) return;
  x->stopping = 1;
  x->done = done;
  x->done_data = data;
  uv_timer_stop(&x->timer);
  if (!x->call && x->count == 0) {
    close_now(x);
    return;
  }
  /* the timer is the deadline now, and holds the loop until stop is done */
  uv_ref((uv_handle_t *)&x->timer);
  uv_update_time(x->loop);
  x->stop_deadline = uv_now(x->loop) + OTLP_STOP_MS;
  uv_timer_start(&x->timer, stop_expired, OTLP_STOP_MS, 0);
  if (!x->call) stop_continue(x);
}
