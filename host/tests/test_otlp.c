/* The OTLP/HTTP JSON exporter (net/nh_otlp.h) against a real receiver: the project's
 * HTTP server on the same loop, on a free port, keeping every POST. The body's JSON
 * shape is checked member by member; batching by size and by time, a full queue, a
 * collector that is down, slow or answers 500, and stop (with nothing, something queued,
 * an export in flight, a collector that never answers) each leave the loop closing
 * cleanly. No sleeps: the loop runs until a condition holds, with a deadline. */
#include "nh_test.h"

#include "core/nh_log.h"
#include "core/nh_runtime.h"
#include "core/nh_trace.h"
#include "core/nh_util.h"
#include "net/nh_httpd.h"
#include "net/nh_otlp.h"

#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <strings.h>

#define MAX_POSTS 32
#define MAX_HELD 8
#define MAX_EXPORTERS 4
#define FOREVER_MS (3600 * 1000)   /* a flush timer that never fires within a test */

typedef struct fixture fixture_t;

typedef struct post {
  char *method, *path, *ctype, *body;
  uint64_t failures_before;   /* the watched exporter's export_failures when it arrived */
} post_t;

typedef struct receiver {
  fixture_t *fx;
  nh_httpd_t *srv;
  int port;
  unsigned status;            /* the answer; 0: 200 */
  int hold;                   /* this many next requests get no answer (until released) */
  nh_httpd_req_t *held[MAX_HELD];
  int nheld;
  post_t posts[MAX_POSTS];
  int nposts;                 /* requests received, held ones too */
} receiver_t;

typedef struct ex_slot {
  fixture_t *fx;
  nh_otlp_t *x;               /* NULL once its stop is done */
} ex_slot_t;

struct fixture {
  nh_runtime_t rt;
  uv_timer_t tick;            /* UV_RUN_ONCE returns at least this often, so deadlines are seen */
  receiver_t rx[2];
  ex_slot_t ex[MAX_EXPORTERS];
  nh_otlp_t *watched;         /* posts record its failures so far */
  json_t *docs[MAX_POSTS];
  int ndocs;
  nh_test_capture_t log;      /* stderr while a test reads the log lines */
};

/* ---------------------------------------------------------------- the receiver */

typedef struct header_find {
  const char *name;
  char *value;
} header_find_t;

static void header_cb(void *ud, const char *key, size_t klen, const char *val, size_t vlen)
{
  header_find_t *h = ud;
  if (!h->value && strlen(h->name) == klen && strncasecmp(key, h->name, klen) == 0) h->value = nh_xstrndup(val, vlen);
}

static void on_request(void *data, nh_httpd_req_t *r)
{
  receiver_t *rx = data;
  nh_error_t err = { 0 };
  if (rx->nposts < MAX_POSTS) {
    post_t *p = &rx->posts[rx->nposts++];
    size_t len;
    const char *body = nh_httpd_req_body(r, &len);
    header_find_t h = { "Content-Type", NULL };
    nh_httpd_req_headers(r, header_cb, &h);
    p->method = nh_xstrdup(nh_httpd_req_method(r));
    p->path = nh_xstrdup(nh_httpd_req_path(r));
    p->ctype = h.value;
    p->body = nh_xstrndup(body ? body : "", body ? len : 0);
    if (rx->fx->watched) {
      nh_otlp_stats_t st;
      nh_otlp_stats(rx->fx->watched, &st);
      p->failures_before = st.export_failures;
    }
  }
  if (rx->hold > 0 && rx->nheld < MAX_HELD) {
    rx->hold--;
    rx->held[rx->nheld++] = r;
    return;
  }
  static const nh_httpd_header_t json_ct[] = { { "Content-Type", "application/json" } };
  nh_httpd_respond(r, rx->status ? rx->status : 200, json_ct, 1, "{}", 2, &err);
}

static void receiver_start(fixture_t *fx, receiver_t *rx, int port)
{
  rx->fx = fx;
  nh_httpd_opts_t o = { .port = port, .on_request = on_request, .data = rx };
  nh_error_t err = { 0 };
  char code[32];
  rx->srv = nh_httpd_start(&fx->rt.loop, &o, &err, code);
  if (!rx->srv) FAIL("nh_httpd_start: %s", err.msg);
  rx->port = nh_httpd_port(rx->srv);
}

/* Answers the held requests (their clients may be gone: the server just frees them). */
static void receiver_release(receiver_t *rx)
{
  static const nh_httpd_header_t json_ct[] = { { "Content-Type", "application/json" } };
  nh_error_t err = { 0 };
  for (int i = 0; i < rx->nheld; i++) nh_httpd_respond(rx->held[i], 200, json_ct, 1, "{}", 2, &err);
  rx->nheld = 0;
}

static void receiver_close(receiver_t *rx)
{
  if (rx->srv) nh_httpd_close(rx->srv);
  rx->srv = NULL;
  receiver_release(rx);
}

static void receiver_free(receiver_t *rx)
{
  receiver_close(rx);
  for (int i = 0; i < rx->nposts; i++) {
    free(rx->posts[i].method);
    free(rx->posts[i].path);
    free(rx->posts[i].ctype);
    free(rx->posts[i].body);
  }
  rx->nposts = 0;
}

/* ---------------------------------------------------------------- the loop */

typedef int (*cond_fn)(void *arg);

static void tick(uv_timer_t *t) { (void)t; }

/* Runs the loop until cond(arg) holds; fails after 15 s. */
static void pump_until(fixture_t *fx, cond_fn cond, void *arg, const char *what)
{
  int64_t deadline = nh_test_mono_ms() + 15000;
  while (!cond(arg)) {
    if (nh_test_mono_ms() > deadline) FAIL("timed out waiting for %s", what);
    uv_run(&fx->rt.loop, UV_RUN_ONCE);
  }
}

/* ---------------------------------------------------------------- log capture */

static void capture_start(fixture_t *fx) { nh_test_capture_start(&fx->log); }
static void capture_end(fixture_t *fx) { nh_test_capture_end(&fx->log); }

/* Lines of the captured log with both texts. */
static int log_count(fixture_t *fx, const char *a, const char *b)
{
  int n = 0;
  const char *p = nh_test_read_file(fx->log.path);
  while (*p) {
    const char *eol = strchr(p, '\n');
    size_t len = eol ? (size_t)(eol - p) : strlen(p);
    char line[4096];
    snprintf(line, sizeof line, "%.*s", (int)len, p);
    if (strstr(line, a) && strstr(line, b)) n++;
    p += len + (eol ? 1 : 0);
  }
  return n;
}

/* ---------------------------------------------------------------- fixture */

static void stopped(void *data)
{
  ex_slot_t *s = data;
  s->x = NULL;
}

static int all_stopped(void *arg)
{
  fixture_t *fx = arg;
  for (int i = 0; i < MAX_EXPORTERS; i++)
    if (fx->ex[i].x) return 0;
  return 1;
}

/* After a failed test: stops what is left (each stop ends within its 2 s). */
static void fixture_free(void *p)
{
  fixture_t *fx = p;
  capture_end(fx);
  for (int i = 0; i < MAX_EXPORTERS; i++)
    if (fx->ex[i].x) nh_otlp_stop(fx->ex[i].x, stopped, &fx->ex[i]);
  for (int i = 0; i < 2; i++) receiver_release(&fx->rx[i]);
  int64_t deadline = nh_test_mono_ms() + 5000;
  while (!all_stopped(fx) && nh_test_mono_ms() < deadline) uv_run(&fx->rt.loop, UV_RUN_ONCE);
  for (int i = 0; i < 2; i++) receiver_free(&fx->rx[i]);
  uv_close((uv_handle_t *)&fx->tick, NULL);
  nh_runtime_close(&fx->rt);
  for (int i = 0; i < fx->ndocs; i++) json_decref(fx->docs[i]);
  free(fx);
}

static fixture_t *fixture_start(void)
{
  fixture_t *fx = nh_xcalloc(1, sizeof *fx);
  fx->log.saved = -1;
  ASSERT_EQ_INT(nh_runtime_init(&fx->rt), 0);
  uv_timer_init(&fx->rt.loop, &fx->tick);
  uv_timer_start(&fx->tick, tick, 10, 10);
  nh_test_on_cleanup(fixture_free, fx);
  receiver_start(fx, &fx->rx[0], 0);
  return fx;
}

/* Closes the receivers and the runtime; 0 when no handle was left open and the loop
 * closed (nh_runtime_close counts a loop that would not close as one more). */
static int fixture_close(fixture_t *fx)
{
  ASSERT_TRUE(all_stopped(fx));
  nh_test_cancel_cleanup(fixture_free, fx);
  capture_end(fx);
  for (int i = 0; i < 2; i++) receiver_free(&fx->rx[i]);
  uv_close((uv_handle_t *)&fx->tick, NULL);
  int left = nh_runtime_close(&fx->rt);
  for (int i = 0; i < fx->ndocs; i++) json_decref(fx->docs[i]);
  free(fx);
  return left;
}

static char *url_of(const receiver_t *rx, const char *path)
{
  static char bufs[4][128];
  static int next;
  char *b = bufs[next++ & 3];
  snprintf(b, sizeof bufs[0], "http://127.0.0.1:%d%s", rx->port, path);
  return b;
}

static nh_otlp_t *exporter_start(fixture_t *fx, const nh_otlp_opts_t *o)
{
  nh_error_t err = { 0 };
  nh_otlp_t *x = nh_otlp_start(&fx->rt.loop, o, &err);
  if (!x) FAIL("nh_otlp_start: %s", err.msg);
  for (int i = 0; i < MAX_EXPORTERS; i++)
    if (!fx->ex[i].x) {
      fx->ex[i].fx = fx;
      fx->ex[i].x = x;
      return x;
    }
  FAIL("too many exporters");
}

static ex_slot_t *slot_of(fixture_t *fx, nh_otlp_t *x)
{
  for (int i = 0; i < MAX_EXPORTERS; i++)
    if (fx->ex[i].x == x) return &fx->ex[i];
  FAIL("not an exporter of the fixture");
}

static int slot_done(void *arg) { return ((ex_slot_t *)arg)->x == NULL; }

/* Stops x and runs the loop until its done callback ran. */
static void exporter_stop(fixture_t *fx, nh_otlp_t *x)
{
  ex_slot_t *s = slot_of(fx, x);
  if (fx->watched == x) fx->watched = NULL;
  nh_otlp_stop(x, stopped, s);
  pump_until(fx, slot_done, s, "the exporter's stop to finish");
}

/* ---------------------------------------------------------------- spans */

typedef struct span_buf {
  nh_span_t s;
  char name[64];
} span_buf_t;

/* A span named name, ids fresh from nh_trace, times far past 2^53 ns. */
static nh_span_t make_span(span_buf_t *b, const char *name, nh_span_kind_t kind)
{
  memset(b, 0, sizeof *b);
  snprintf(b->name, sizeof b->name, "%s", name);
  nh_trace_ctx_t c;
  nh_trace_new_root(&c);
  b->s.name = b->name;
  b->s.kind = kind;
  memcpy(b->s.trace_id, c.trace_id, 16);
  memcpy(b->s.span_id, c.span_id, 8);
  b->s.start_ns = 1767225600123456789LL;
  b->s.end_ns = 1767225600987654321LL;
  return b->s;
}

static void add_named(nh_otlp_t *x, const char *prefix, int from, int n)
{
  for (int i = from; i < from + n; i++) {
    char name[64];
    span_buf_t b;
    snprintf(name, sizeof name, "%s%d", prefix, i);
    nh_span_t s = make_span(&b, name, NH_SPAN_INTERNAL);
    nh_otlp_add(x, &s);
  }
}

/* ---------------------------------------------------------------- JSON checks */

static json_t *member(json_t *o, const char *key)
{
  json_t *v = json_is_object(o) ? json_object_get(o, key) : NULL;
  if (!v) FAIL("no member \"%s\"", key);
  return v;
}

static const char *str_member(json_t *o, const char *key)
{
  json_t *v = member(o, key);
  if (!json_is_string(v)) FAIL("member \"%s\" is not a string", key);
  return json_string_value(v);
}

static json_t *array_member(json_t *o, const char *key, size_t n)
{
  json_t *v = member(o, key);
  if (!json_is_array(v)) FAIL("member \"%s\" is not an array", key);
  ASSERT_EQ_INT(json_array_size(v), n);
  return v;
}

static void expect_int(json_t *o, const char *key, long long want)
{
  json_t *v = member(o, key);
  if (!json_is_integer(v)) FAIL("member \"%s\" is not an integer", key);
  ASSERT_EQ_INT(json_integer_value(v), want);
}

/* {"key":key,"value":{<kind>:want}} with nothing else. */
static void expect_kv(json_t *kv, const char *key, const char *kind, const char *want)
{
  ASSERT_EQ_INT(json_object_size(kv), 2);
  ASSERT_EQ_STR(str_member(kv, "key"), key);
  json_t *v = member(kv, "value");
  ASSERT_EQ_INT(json_object_size(v), 1);
  ASSERT_EQ_STR(str_member(v, kind), want);
}

static void expect_hex_id(json_t *o, const char *key, const uint8_t *id, size_t n)
{
  char hex[33];
  nh_trace_hex(id, n, hex);
  ASSERT_EQ_STR(str_member(o, key), hex);
}

/* The body of post i as JSON, its envelope checked: one resourceSpans with service.name
 * (and `extra` = "key=value" more, or NULL), one scopeSpans of scope nimbus-host. Returns
 * the spans array, which must hold nspans. */
static json_t *post_spans(fixture_t *fx, receiver_t *rx, int i, const char *service, const char *extra, size_t nspans)
{
  ASSERT_CMP_INT(rx->nposts, >, i);
  post_t *p = &rx->posts[i];
  ASSERT_EQ_STR(p->method, "POST");
  ASSERT_EQ_STR(p->ctype, "application/json");
  json_error_t jerr;
  json_t *doc = json_loads(p->body, 0, &jerr);
  if (!doc) FAIL("body is not JSON (%s): %s", jerr.text, p->body);
  ASSERT_CMP_INT(fx->ndocs, <, MAX_POSTS);
  fx->docs[fx->ndocs++] = doc;
  ASSERT_EQ_INT(json_object_size(doc), 1);
  json_t *rs = json_array_get(array_member(doc, "resourceSpans", 1), 0);
  ASSERT_EQ_INT(json_object_size(rs), 2);
  json_t *res = member(rs, "resource");
  ASSERT_EQ_INT(json_object_size(res), 1);
  json_t *attrs = array_member(res, "attributes", extra ? 2 : 1);
  expect_kv(json_array_get(attrs, 0), "service.name", "stringValue", service);
  if (extra) {
    char key[64];
    const char *eq = strchr(extra, '=');
    snprintf(key, sizeof key, "%.*s", (int)(eq - extra), extra);
    expect_kv(json_array_get(attrs, 1), key, "stringValue", eq + 1);
  }
  json_t *ss = json_array_get(array_member(rs, "scopeSpans", 1), 0);
  ASSERT_EQ_INT(json_object_size(ss), 2);
  json_t *scope = member(ss, "scope");
  ASSERT_EQ_INT(json_object_size(scope), 1);
  ASSERT_EQ_STR(str_member(scope, "name"), "nimbus-host");
  return array_member(ss, "spans", nspans);
}

static void expect_names(json_t *spans, const char *prefix, int from)
{
  for (size_t i = 0; i < json_array_size(spans); i++) {
    char want[64];
    snprintf(want, sizeof want, "%s%d", prefix, from + (int)i);
    ASSERT_EQ_STR(str_member(json_array_get(spans, i), "name"), want);
  }
}

/* ---------------------------------------------------------------- conditions */

typedef struct want {
  fixture_t *fx;
  receiver_t *rx;
  nh_otlp_t *x;
  int n;
} want_t;

static int have_posts(void *arg)
{
  want_t *w = arg;
  return w->rx->nposts >= w->n;
}

static int have_held(void *arg)
{
  want_t *w = arg;
  return w->rx->nheld >= w->n;
}

static nh_otlp_stats_t stats_of(nh_otlp_t *x)
{
  nh_otlp_stats_t st;
  nh_otlp_stats(x, &st);
  return st;
}

static int have_exported(void *arg)
{
  want_t *w = arg;
  return stats_of(w->x).exported >= (uint64_t)w->n;
}

static int have_failures(void *arg)
{
  want_t *w = arg;
  return stats_of(w->x).export_failures >= (uint64_t)w->n;
}

#define WAIT_POSTS(fx, rxp, count) pump_until(fx, have_posts, &(want_t){ fx, rxp, NULL, count }, #count " requests")
#define WAIT_HELD(fx, rxp, count) pump_until(fx, have_held, &(want_t){ fx, rxp, NULL, count }, #count " held requests")
#define WAIT_EXPORTED(fx, xp, count) pump_until(fx, have_exported, &(want_t){ fx, NULL, xp, count }, #count " spans exported")
#define WAIT_FAILURES(fx, xp, count) pump_until(fx, have_failures, &(want_t){ fx, NULL, xp, count }, #count " failed exports")

static void expect_stats(nh_otlp_t *x, uint64_t queued, uint64_t exported, uint64_t full, uint64_t failed, uint64_t failures)
{
  nh_otlp_stats_t st = stats_of(x);
  ASSERT_EQ_INT(st.queued, queued);
  ASSERT_EQ_INT(st.exported, exported);
  ASSERT_EQ_INT(st.dropped_full, full);
  ASSERT_EQ_INT(st.dropped_failed, failed);
  ASSERT_EQ_INT(st.export_failures, failures);
}

/* ---------------------------------------------------------------- tests */

TEST(a_full_batch_goes_at_once_in_the_exact_otlp_shape)
{
  fixture_t *fx = fixture_start();
  receiver_t *rx = &fx->rx[0];
  const nh_otlp_attr_t res[] = { { "service.instance.id", "host-1" } };
  nh_otlp_opts_t o = { .url = url_of(rx, ""), .service_name = "svc-a", .resource_attrs = res, .nresource_attrs = 1,
                       .batch_max = 3, .flush_ms = FOREVER_MS };
  nh_otlp_t *x = exporter_start(fx, &o);

  span_buf_t b0, b1, b2;
  const nh_span_attr_t attrs0[] = { { "http.method", "POST", 0, 0 },
                                    { "http.status_code", NULL, 200, 1 },
                                    { "big", NULL, -9007199254740993LL, 1 },
                                    { NULL, "skipped", 0, 0 },
                                    { "empty", NULL, 0, 0 } };
  nh_span_t s0 = make_span(&b0, "POST /orders", NH_SPAN_SERVER);
  memcpy(s0.parent_span_id, "\x01\x02\x03\x04\x05\x06\x07\x08", 8);
  s0.has_parent = 1;
  s0.attrs = attrs0;
  s0.nattrs = 5;
  s0.status_message = "not an error: not sent";
  nh_span_t s1 = make_span(&b1, "GET crm", NH_SPAN_CLIENT);
  s1.error = 1;
  /* escaped as JSON asks, and cut to 4 KiB at a character boundary (a 2-byte é at 4095) */
  static char long_msg[5000];
  memset(long_msg, 'x', sizeof long_msg - 1);
  memcpy(long_msg, "refused: \"q\" \\ \n\t\x01 \xc3\xa9", 21);
  memcpy(long_msg + 4095, "\xc3\xa9", 2);
  s1.status_message = long_msg;
  nh_span_t s2 = make_span(&b2, "bad \xff name \xc3", (nh_span_kind_t)99);
  s2.start_ns = -5;
  nh_otlp_add(x, &s0);
  nh_otlp_add(x, &s1);
  expect_stats(x, 2, 0, 0, 0, 0);
  nh_otlp_add(x, &s2);
  WAIT_POSTS(fx, rx, 1);   /* the timer is an hour: only the batch size sent it */
  WAIT_EXPORTED(fx, x, 3);
  expect_stats(x, 3, 3, 0, 0, 0);
  ASSERT_EQ_STR(rx->posts[0].path, "/v1/traces");   /* appended to a base URL */

  json_t *spans = post_spans(fx, rx, 0, "svc-a", "service.instance.id=host-1", 3);
  json_t *j0 = json_array_get(spans, 0), *j1 = json_array_get(spans, 1), *j2 = json_array_get(spans, 2);
  ASSERT_EQ_INT(json_object_size(j0), 9);
  expect_hex_id(j0, "traceId", s0.trace_id, 16);
  expect_hex_id(j0, "spanId", s0.span_id, 8);
  ASSERT_EQ_STR(str_member(j0, "parentSpanId"), "0102030405060708");
  ASSERT_EQ_STR(str_member(j0, "name"), "POST /orders");
  expect_int(j0, "kind", 2);
  ASSERT_EQ_STR(str_member(j0, "startTimeUnixNano"), "1767225600123456789");
  ASSERT_EQ_STR(str_member(j0, "endTimeUnixNano"), "1767225600987654321");
  json_t *a0 = array_member(j0, "attributes", 4);
  expect_kv(json_array_get(a0, 0), "http.method", "stringValue", "POST");
  expect_kv(json_array_get(a0, 1), "http.status_code", "intValue", "200");
  expect_kv(json_array_get(a0, 2), "big", "intValue", "-9007199254740993");
  expect_kv(json_array_get(a0, 3), "empty", "stringValue", "");
  json_t *st0 = member(j0, "status");
  ASSERT_EQ_INT(json_object_size(st0), 2);
  expect_int(st0, "code", 0);
  ASSERT_EQ_STR(str_member(st0, "message"), "");

  ASSERT_EQ_INT(json_object_size(j1), 8);   /* no parentSpanId for a root */
  ASSERT_NULL(json_object_get(j1, "parentSpanId"));
  expect_hex_id(j1, "traceId", s1.trace_id, 16);
  expect_hex_id(j1, "spanId", s1.span_id, 8);
  expect_int(j1, "kind", 3);
  array_member(j1, "attributes", 0);
  json_t *st1 = member(j1, "status");
  expect_int(st1, "code", 2);
  const char *msg = str_member(st1, "message");
  ASSERT_EQ_INT((int)strlen(msg), 4095);
  ASSERT_TRUE(strncmp(msg, "refused: \"q\" \\ \n\t\x01 \xc3\xa9xxx", 24) == 0);
  ASSERT_TRUE(msg[4094] == 'x');

  ASSERT_EQ_STR(str_member(j2, "name"), "bad ? name ?");   /* invalid UTF-8 replaced, not fatal */
  expect_int(j2, "kind", 1);                               /* out of range: internal */
  ASSERT_EQ_STR(str_member(j2, "startTimeUnixNano"), "0");

  exporter_stop(fx, x);
  ASSERT_EQ_INT(rx->nposts, 1);
  ASSERT_EQ_INT(fixture_close(fx), 0);
}

TEST(a_base_url_gets_v1_traces_and_a_full_path_is_kept)
{
  fixture_t *fx = fixture_start();
  receiver_t *rx = &fx->rx[0];
  nh_otlp_opts_t o = { .url = url_of(rx, "/"), .batch_max = 1 };
  nh_otlp_t *a = exporter_start(fx, &o);
  add_named(a, "a", 0, 1);
  WAIT_POSTS(fx, rx, 1);
  ASSERT_EQ_STR(rx->posts[0].path, "/v1/traces");
  post_spans(fx, rx, 0, "nimbus-host", NULL, 1);   /* the default service.name */
  o.url = url_of(rx, "/collector/v1/traces?tenant=7");
  nh_otlp_t *b = exporter_start(fx, &o);
  add_named(b, "b", 0, 1);
  WAIT_POSTS(fx, rx, 2);
  ASSERT_EQ_STR(rx->posts[1].path, "/collector/v1/traces");
  exporter_stop(fx, a);
  exporter_stop(fx, b);
  ASSERT_EQ_INT(fixture_close(fx), 0);
}

TEST(a_partial_batch_goes_after_flush_ms)
{
  fixture_t *fx = fixture_start();
  receiver_t *rx = &fx->rx[0];
  nh_otlp_opts_t o = { .url = url_of(rx, ""), .flush_ms = 20 };   /* batch_max 512 */
  nh_otlp_t *x = exporter_start(fx, &o);
  add_named(x, "t", 0, 2);
  WAIT_POSTS(fx, rx, 1);
  WAIT_EXPORTED(fx, x, 2);
  expect_names(post_spans(fx, rx, 0, "nimbus-host", NULL, 2), "t", 0);
  add_named(x, "t", 2, 3);   /* the timer starts again with the next span */
  WAIT_POSTS(fx, rx, 2);
  WAIT_EXPORTED(fx, x, 5);
  expect_names(post_spans(fx, rx, 1, "nimbus-host", NULL, 3), "t", 2);
  expect_stats(x, 5, 5, 0, 0, 0);
  exporter_stop(fx, x);
  ASSERT_EQ_INT(fixture_close(fx), 0);
}

TEST(a_full_queue_drops_new_spans_and_counts_them)
{
  fixture_t *fx = fixture_start();
  receiver_t *rx = &fx->rx[0];
  nh_otlp_opts_t o = { .url = url_of(rx, ""), .queue_max = 4, .batch_max = 4, .flush_ms = FOREVER_MS };
  nh_otlp_t *x = exporter_start(fx, &o);
  add_named(x, "q", 0, 10);   /* the loop does not run: the first 4 fill the queue */
  expect_stats(x, 4, 0, 6, 0, 0);
  WAIT_EXPORTED(fx, x, 4);
  expect_names(post_spans(fx, rx, 0, "nimbus-host", NULL, 4), "q", 0);
  add_named(x, "r", 0, 4);    /* room again */
  WAIT_EXPORTED(fx, x, 8);
  expect_names(post_spans(fx, rx, 1, "nimbus-host", NULL, 4), "r", 0);
  expect_stats(x, 8, 8, 6, 0, 0);
  exporter_stop(fx, x);
  ASSERT_EQ_INT(fixture_close(fx), 0);
}

TEST(a_collector_that_is_down_costs_batches_not_the_loop)
{
  fixture_t *fx = fixture_start();
  receiver_t *live = &fx->rx[0], *dead = &fx->rx[1];
  receiver_start(fx, dead, 0);   /* a port that was free a moment ago, now closed: refused */
  int port = dead->port;
  receiver_close(dead);
  capture_start(fx);
  nh_otlp_opts_t o = { .url = url_of(dead, ""), .batch_max = 2, .flush_ms = FOREVER_MS };
  nh_otlp_t *x = exporter_start(fx, &o);
  nh_otlp_opts_t lo = { .url = url_of(live, ""), .batch_max = 1 };
  nh_otlp_t *ok = exporter_start(fx, &lo);
  for (int round = 1; round <= 3; round++) {
    add_named(x, "down", 2 * round, 2);
    WAIT_FAILURES(fx, x, round);
    add_named(ok, "up", round, 1);   /* the same loop still serves everything else */
    WAIT_POSTS(fx, live, round);
  }
  expect_stats(x, 6, 0, 0, 6, 3);
  WAIT_EXPORTED(fx, ok, 3);
  /* the collector comes back on its port */
  receiver_start(fx, dead, port);
  add_named(x, "back", 0, 2);
  WAIT_EXPORTED(fx, x, 2);
  expect_names(post_spans(fx, dead, 0, "nimbus-host", NULL, 2), "back", 0);
  expect_stats(x, 8, 2, 0, 6, 3);
  capture_end(fx);
  ASSERT_EQ_INT(log_count(fx, "warn", "[otlp]"), 1);   /* one line for the streak of 3 */
  ASSERT_EQ_INT(log_count(fx, "warn", "ECONNREFUSED"), 1);
  ASSERT_EQ_INT(log_count(fx, "info", "span export works again"), 1);
  ASSERT_EQ_INT(log_count(fx, "info", "dropped_spans=6"), 1);
  exporter_stop(fx, x);
  exporter_stop(fx, ok);
  ASSERT_EQ_INT(fixture_close(fx), 0);
}

TEST(a_slow_collector_times_out_and_later_spans_still_go)
{
  fixture_t *fx = fixture_start();
  receiver_t *rx = &fx->rx[0];
  rx->hold = 1;   /* the first request gets no answer */
  nh_otlp_opts_t o = { .url = url_of(rx, ""), .batch_max = 2, .flush_ms = FOREVER_MS, .timeout_s = 1 };
  nh_otlp_t *x = exporter_start(fx, &o);
  fx->watched = x;
  capture_start(fx);
  add_named(x, "slow", 0, 2);
  WAIT_HELD(fx, rx, 1);
  add_named(x, "next", 0, 2);   /* a full batch, but one export is in flight already: it waits */
  expect_stats(x, 4, 0, 0, 0, 0);
  WAIT_FAILURES(fx, x, 1);
  WAIT_EXPORTED(fx, x, 2);
  ASSERT_EQ_INT(rx->nposts, 2);
  ASSERT_EQ_INT(rx->posts[1].failures_before, 1);   /* sent only after the first one ended */
  expect_names(post_spans(fx, rx, 1, "nimbus-host", NULL, 2), "next", 0);
  expect_stats(x, 4, 2, 0, 2, 1);
  capture_end(fx);
  ASSERT_EQ_INT(log_count(fx, "warn", "ETIMEDOUT"), 1);
  receiver_release(rx);   /* the collector answers the old request at last: nothing changes */
  add_named(x, "later", 0, 2);
  WAIT_EXPORTED(fx, x, 4);
  expect_stats(x, 6, 4, 0, 2, 1);
  exporter_stop(fx, x);
  ASSERT_EQ_INT(fixture_close(fx), 0);
}

TEST(a_collector_answering_500_is_a_failure)
{
  fixture_t *fx = fixture_start();
  receiver_t *rx = &fx->rx[0];
  rx->status = 500;
  nh_otlp_opts_t o = { .url = url_of(rx, ""), .batch_max = 3, .flush_ms = FOREVER_MS };
  nh_otlp_t *x = exporter_start(fx, &o);
  capture_start(fx);
  add_named(x, "e", 0, 3);
  WAIT_FAILURES(fx, x, 1);
  expect_stats(x, 3, 0, 0, 3, 1);
  ASSERT_EQ_INT(rx->nposts, 1);
  rx->status = 0;
  add_named(x, "f", 0, 3);
  WAIT_EXPORTED(fx, x, 3);
  expect_stats(x, 6, 3, 0, 3, 1);
  capture_end(fx);
  ASSERT_EQ_INT(log_count(fx, "warn", "HTTP status 500"), 1);
  ASSERT_EQ_INT(log_count(fx, "info", "span export works again"), 1);
  exporter_stop(fx, x);
  ASSERT_EQ_INT(fixture_close(fx), 0);
}

TEST(stop_sends_what_is_queued_then_closes)
{
  fixture_t *fx = fixture_start();
  receiver_t *rx = &fx->rx[0];
  nh_otlp_opts_t o = { .url = url_of(rx, ""), .batch_max = 2, .flush_ms = FOREVER_MS };
  nh_otlp_t *x = exporter_start(fx, &o);
  add_named(x, "s", 0, 5);   /* the loop does not run: all 5 are queued at stop */
  exporter_stop(fx, x);
  ASSERT_EQ_INT(rx->nposts, 1);   /* one last request with everything */
  expect_names(post_spans(fx, rx, 0, "nimbus-host", NULL, 5), "s", 0);
  ASSERT_EQ_INT(fixture_close(fx), 0);
}

TEST(stop_with_nothing_queued_closes_at_once)
{
  fixture_t *fx = fixture_start();
  nh_otlp_opts_t o = { .url = url_of(&fx->rx[0], "") };
  nh_otlp_t *x = exporter_start(fx, &o);
  exporter_stop(fx, x);
  ASSERT_EQ_INT(fx->rx[0].nposts, 0);
  ASSERT_EQ_INT(fixture_close(fx), 0);
}

TEST(stop_with_an_export_in_flight_waits_for_it_then_sends_the_rest)
{
  fixture_t *fx = fixture_start();
  receiver_t *rx = &fx->rx[0];
  rx->hold = 1;
  nh_otlp_opts_t o = { .url = url_of(rx, ""), .batch_max = 2, .flush_ms = FOREVER_MS };
  nh_otlp_t *x = exporter_start(fx, &o);
  add_named(x, "a", 0, 2);
  WAIT_HELD(fx, rx, 1);
  add_named(x, "b", 0, 3);
  ex_slot_t *s = slot_of(fx, x);
  nh_otlp_stop(x, stopped, s);
  nh_otlp_stop(x, stopped, s);   /* a second stop is harmless */
  receiver_release(rx);          /* the in-flight export succeeds, then the last one goes */
  pump_until(fx, slot_done, s, "the stop to finish");
  ASSERT_EQ_INT(rx->nposts, 2);
  expect_names(post_spans(fx, rx, 0, "nimbus-host", NULL, 2), "a", 0);
  expect_names(post_spans(fx, rx, 1, "nimbus-host", NULL, 3), "b", 0);
  ASSERT_EQ_INT(fixture_close(fx), 0);
}

TEST(stop_gives_up_on_a_collector_that_never_answers)
{
  fixture_t *fx = fixture_start();
  receiver_t *rx = &fx->rx[0];
  rx->hold = MAX_HELD;
  nh_otlp_opts_t o = { .url = url_of(rx, ""), .batch_max = 2, .flush_ms = FOREVER_MS, .timeout_s = 60 };
  nh_otlp_t *x = exporter_start(fx, &o);
  add_named(x, "stuck", 0, 3);
  WAIT_HELD(fx, rx, 1);
  capture_start(fx);
  exporter_stop(fx, x);   /* done within its 2 s, not the export's 60 */
  capture_end(fx);
  ASSERT_EQ_INT(rx->nposts, 1);
  ASSERT_EQ_INT(log_count(fx, "warn", "did not answer"), 1);
  receiver_release(rx);
  ASSERT_EQ_INT(fixture_close(fx), 0);
}

static void expect_start_error(uv_loop_t *loop, const nh_otlp_opts_t *o, const char *text)
{
  nh_error_t err = { 0 };
  nh_otlp_t *x = nh_otlp_start(loop, o, &err);
  if (x) FAIL("nh_otlp_start accepted options it should refuse (%s)", text);
  ASSERT_EQ_INT(err.code, NH_EUSAGE);
  ASSERT_CONTAINS(err.msg, text);
}

TEST(start_validates_its_options)
{
  fixture_t *fx = fixture_start();
  uv_loop_t *loop = &fx->rt.loop;
  nh_otlp_opts_t o = { 0 };
  expect_start_error(loop, NULL, "no options");
  expect_start_error(loop, &o, "URL is required");
  o.url = "";
  expect_start_error(loop, &o, "URL is required");
  const char *bad[] = { "ftp://collector:4318", "collector:4318", "http://", "http://exa mple.com/v1/traces",
                        "https://[::1/v1/traces", "http://host:99999/" };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    o.url = bad[i];
    char want[128];
    snprintf(want, sizeof want, "invalid URL '%s'", bad[i]);
    expect_start_error(loop, &o, want);
  }
  nh_otlp_opts_t good = { .url = "https://collector.example:4318" };
  o = good;
  o.queue_max = -1;
  expect_start_error(loop, &o, "queue_max");
  o = good;
  o.queue_max = 10;
  o.batch_max = 11;
  expect_start_error(loop, &o, "batch_max (11) is larger than queue_max (10)");
  o = good;
  o.flush_ms = -5;
  expect_start_error(loop, &o, "flush_ms");
  o = good;
  o.timeout_s = -1;
  expect_start_error(loop, &o, "timeout_s");
  o.timeout_s = NAN;
  expect_start_error(loop, &o, "timeout_s");
  o = good;
  o.service_name = "";
  expect_start_error(loop, &o, "service_name");
  const nh_otlp_attr_t dup[] = { { "service.instance.id", "a" }, { "service.instance.id", "b" } };
  o = good;
  o.resource_attrs = dup;
  o.nresource_attrs = 2;
  expect_start_error(loop, &o, "'service.instance.id' is given twice");
  const nh_otlp_attr_t svc[] = { { "service.name", "x" } };
  o.resource_attrs = svc;
  o.nresource_attrs = 1;
  expect_start_error(loop, &o, "service_name");
  const char *hdr[] = { "Authorization Bearer x" };
  o = good;
  o.headers = hdr;
  o.nheaders = 1;
  expect_start_error(loop, &o, "header 1");

  /* a small queue takes a batch of its size; nothing is sent, so stop closes at once */
  o = good;
  o.queue_max = 100;
  const char *auth[] = { "Authorization: Bearer x" };
  o.headers = auth;
  o.nheaders = 1;
  nh_otlp_t *x = exporter_start(fx, &o);
  exporter_stop(fx, x);
  ASSERT_EQ_INT(fixture_close(fx), 0);
}

NH_TEST_MAIN()
