/* RabbitMQ topology through its management HTTP API, on the loop (nh_http_client):
 * the topic exchange events are published to, one durable queue per endpoint bound to
 * the endpoint's event types, and beside it a dead-letter queue `<endpoint>.dead-letter`
 * fed through the exchange `<exchange>.dead-letter`, so a dead-lettered message stays
 * readable on the broker. Reply queues are not durable and expire 10 minutes after
 * their process stopped consuming. Every call is idempotent, so it runs again after a
 * reconnect or a reload without harm. */
#include "nh_amqp_int.h"
#include "core/nh_log.h"
#include "core/nh_util.h"
#include "net/nh_http_client.h"

#include <curl/curl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NH_RMQ_RETRY_MIN_MS 500
#define NH_RMQ_RETRY_MAX_MS 10000
#define NH_REPLY_QUEUE_EXPIRES_MS 600000

typedef struct nh_rmq_decl nh_rmq_decl_t;

typedef struct step {
  const char *method;
  char *path;   /* after /api */
  char *body;
  const char *what;
  /* A read whose answer decides: NULL to go on, else why not (freed by the caller). */
  char *(*check)(nh_rmq_decl_t *d, const char *body, size_t len);
} step_t;

struct nh_rmq_decl {
  uv_loop_t *loop;
  const nh_amqp_url_t *url;
  char *base;           /* management URL with the credentials in it */
  step_t *steps;
  int nsteps, at;
  int64_t retry_ms;
  nh_http_call_t *call;
  uv_timer_t timer;
  void (*done)(void *, const char *);
  void *data;
  char *name;           /* the endpoint */
  int partitions;
};

static char *esc(const char *s)
{
  char *e = curl_easy_escape(NULL, s, 0);
  char *out = nh_xstrdup(e);
  curl_free(e);
  return out;
}

static void add(nh_rmq_decl_t *d, const char *method, const char *what, json_t *body, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static void add(nh_rmq_decl_t *d, const char *method, const char *what, json_t *body, const char *fmt, ...)
{
  char path[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(path, sizeof path, fmt, ap);
  va_end(ap);
  d->steps = nh_xrealloc(d->steps, sizeof *d->steps * (size_t)(d->nsteps + 1));
  step_t *s = &d->steps[d->nsteps++];
  s->method = method;
  s->path = nh_xstrdup(path);
  s->body = body ? json_dumps(body, JSON_COMPACT) : NULL;
  s->what = what;
  s->check = NULL;
  json_decref(body);
}

static void run_step(nh_rmq_decl_t *d);

static void timer_cb(uv_timer_t *t) { run_step(t->data); }

static void finish(nh_rmq_decl_t *d, const char *why)
{
  void (*cb)(void *, const char *) = d->done;
  d->done = NULL;
  if (cb) cb(d->data, why);   /* may cancel (free) d */
}

static void on_done(void *data, nh_http_res_t *res)
{
  nh_rmq_decl_t *d = data;
  d->call = NULL;
  step_t *s = &d->steps[d->at];
  char why[1024];
  if (res->status >= 200 && res->status < 300) {
    d->retry_ms = NH_RMQ_RETRY_MIN_MS;
    char *refused = s->check ? s->check(d, res->body ? res->body : "", res->body_len) : NULL;
    if (refused) {
      snprintf(why, sizeof why, "%s", refused);
      free(refused);
      finish(d, why);
      return;
    }
    if (++d->at == d->nsteps) {
      finish(d, NULL);
      return;
    }
    run_step(d);
    return;
  }
  int fatal = 0;
  if (nh_rmq_why(d->url, res, why, sizeof why)) {
    fatal = res->status != 0;
  } else if (res->status == 404) {
    snprintf(why, sizeof why, "%s: not found (HTTP 404) at %s: does the vhost %s exist?", s->what, d->url->management,
             d->url->vhost ? d->url->vhost : "/");
    fatal = 1;
  } else if ((res->status == 400 || res->status == 406) && res->body &&
             strstr(res->body, "x-single-active-consumer")) {
    snprintf(why, sizeof why, "%s: the queue exists on the broker without x-single-active-consumer (declared before "
             "the endpoint had partitions), and RabbitMQ cannot change that on a queue: let the hosts that consume it "
             "drain it, delete it (rabbitmqctl delete_queue NAME, or the management UI), then start again (HTTP %ld: "
             "%.300s)", s->what, res->status, res->body);
    fatal = 1;
  } else if (res->status == 400 || res->status == 406) {
    snprintf(why, sizeof why, "%s: the broker refused it (HTTP %ld): %.400s", s->what, res->status,
             res->body ? res->body : "");
    fatal = 1;
  } else {
    snprintf(why, sizeof why, "%s: HTTP %ld from %s: %.300s", s->what, res->status, d->url->management,
             res->body ? res->body : "");
  }
  if (fatal) {
    finish(d, why);
    return;
  }
  nh_log_warn("amqp", "%s; retrying in %.1f s", why, (double)d->retry_ms / 1000.0);
  uv_timer_start(&d->timer, timer_cb, (uint64_t)d->retry_ms, 0);
  d->retry_ms = d->retry_ms * 2 > NH_RMQ_RETRY_MAX_MS ? NH_RMQ_RETRY_MAX_MS : d->retry_ms * 2;
}

static void run_step(nh_rmq_decl_t *d)
{
  step_t *s = &d->steps[d->at];
  char url[4096];
  snprintf(url, sizeof url, "%s/api%s", d->base, s->path);
  static const char *const hdrs[] = { "Content-Type: application/json" };
  nh_http_req_t req = { .method = s->method, .url = url, .headers = hdrs, .nheaders = 1, .body = s->body,
                        .body_len = s->body ? strlen(s->body) : 0, .timeout_s = 10 };
  nh_error_t err = {0};
  d->call = nh_http_request(d->loop, &req, on_done, d, &err);
  if (!d->call) finish(d, err.msg);
}

static char *base_with_credentials(const nh_amqp_url_t *u)
{
  CURLU *h = curl_url();
  char *out = NULL;
  if (curl_url_set(h, CURLUPART_URL, u->management, 0) == CURLUE_OK) {
    if (u->user) curl_url_set(h, CURLUPART_USER, u->user, CURLU_URLENCODE);
    if (u->password) curl_url_set(h, CURLUPART_PASSWORD, u->password, CURLU_URLENCODE);
    char *s = NULL;
    if (curl_url_get(h, CURLUPART_URL, &s, 0) == CURLUE_OK) {
      out = nh_xstrdup(s);
      curl_free(s);
    }
  }
  curl_url_cleanup(h);
  if (!out) out = nh_xstrdup(u->management);
  size_t n = strlen(out);
  while (n > 0 && out[n - 1] == '/') out[--n] = '\0';
  return out;
}

int nh_rmq_why(const nh_amqp_url_t *u, const nh_http_res_t *res, char *why, size_t len)
{
  if (res->status == 401 || res->status == 403)
    snprintf(why, len, "the RabbitMQ management API at %s refused user %s (HTTP %ld): authentication failed; "
             "check the user and password in --transport", u->management, u->user ? u->user : "(none)", res->status);
  else if (res->status == 0)
    snprintf(why, len, "cannot reach the RabbitMQ management API at %s (%s); is the rabbitmq_management "
             "plugin enabled? (give its address with ?management=URL)", u->management, res->error);
  else
    return 0;
  return 1;
}

nh_http_call_t *nh_rmq_call(uv_loop_t *loop, const nh_amqp_url_t *url, const char *method, const char *path,
                            const char *body, nh_http_done_cb done, void *data, nh_error_t *err)
{
  char *base = base_with_credentials(url);
  char full[4096];
  snprintf(full, sizeof full, "%s/api%s", base, path);
  free(base);
  static const char *const hdrs[] = { "Content-Type: application/json" };
  nh_http_req_t req = { .method = method, .url = full, .headers = hdrs, .nheaders = body ? 1 : 0, .body = body,
                        .body_len = body ? strlen(body) : 0, .timeout_s = 10 };
  return nh_http_request(loop, &req, done, data, err);
}

char *nh_rmq_esc(const char *s) { return esc(s); }

void nh_rmq_partition_queue(const char *endpoint, int partitions, int i, char *out, size_t len)
{
  if (partitions <= 1) snprintf(out, len, "%s", endpoint);
  else snprintf(out, len, "%s.p%d", endpoint, i);
}

#define ANY_BUCKET ".*.*.*.*.*.*.*.*"

static int log2_of(int n)
{
  int k = 0;
  while ((1 << k) < n) k++;
  return k;
}

int nh_rmq_queue_of(const char *name, const char *q, int *index)
{
  size_t n = strlen(name);
  if (strncmp(q, name, n) != 0) return 0;
  if (q[n] == '\0') return 1;
  if (q[n] != '.' || q[n + 1] != 'p' || !q[n + 2] || strlen(q + n + 2) > 3) return 0;
  for (const char *c = q + n + 2; *c; c++)
    if (*c < '0' || *c > '9') return 0;
  if (index) *index = atoi(q + n + 2);
  return 2;
}

void nh_rmq_migration_marker(const char *name, int from, int to, char *out, size_t len)
{
  snprintf(out, len, "%s.migrating-%d-to-%d", name, from, to);
}

int nh_rmq_migration_of(const char *name, const char *q, int *from, int *to)
{
  size_t n = strlen(name);
  char tail;
  return strncmp(q, name, n) == 0 && sscanf(q + n, ".migrating-%d-to-%d%c", from, to, &tail) == 2;
}

void nh_rmq_binding_key(const char *type, int partitions, int i, char *out, size_t len)
{
  int bits = log2_of(partitions < 1 ? 1 : partitions);
  char words[2 * NH_AMQP_BUCKET_BITS + 1];
  nh_amqp_bucket_words((unsigned)i, bits, words);
  /* exactly the bucket's words after the type: `*` for the bits the partition does not
   * choose on, so a type with dots of its own ("Order.Created") never matches "Order" */
  _Static_assert(sizeof ANY_BUCKET - 1 == 2 * NH_AMQP_BUCKET_BITS, "one `.*` per bucket bit");
  snprintf(out, len, "%s%.*s%s", type, 2 * (NH_AMQP_BUCKET_BITS - bits), ANY_BUCKET, words);
}

size_t nh_rmq_binding_type(const char *rk)
{
  size_t n = strlen(rk);
  const char *w = rk + n;
  for (int words = 0; words < NH_AMQP_BUCKET_BITS; words++, w -= 2)
    if (w - rk < 3 || w[-2] != '.' || (w[-1] != '*' && w[-1] != '0' && w[-1] != '1')) return 0;
  return (size_t)(w - rk);
}

/* A queue of another partition count still there would keep getting copies of the
 * endpoint's events through its bindings, and its backlog would run out of order
 * beside the new queues: refused until it is drained and deleted. */
static char *check_layout(nh_rmq_decl_t *d, const char *body, size_t len)
{
  json_t *arr = json_loadb(body, len, 0, NULL);
  char *why = NULL;
  size_t i;
  json_t *q;
  json_array_foreach(arr, i, q) {
    const char *qn = json_string_value(json_object_get(q, "name"));
    int from, to;
    if (qn && nh_rmq_migration_of(d->name, qn, &from, &to)) {
      char buf[800];
      snprintf(buf, sizeof buf, "endpoint %s: a migration of its partitions from %d to %d is under way or was "
               "interrupted (queue %s): finish it with `nimbus-host partitions %s %d --transport ...`, then start "
               "the hosts with partitions = %d", d->name, from, to, qn, d->name, to, to);
      why = nh_xstrdup(buf);
      break;
    }
    if (!qn || !nh_rmq_queue_of(d->name, qn, NULL)) continue;
    int mine = 0;
    for (int p = 0; p < d->partitions && !mine; p++) {
      char want[600];
      nh_rmq_partition_queue(d->name, d->partitions, p, want, sizeof want);
      mine = strcmp(want, qn) == 0;
    }
    if (mine) continue;
    char buf[1600];
    json_int_t msgs = json_integer_value(json_object_get(q, "messages"));
    snprintf(buf, sizeof buf, "endpoint %s has partitions = %d, but queue %s of another partition count is on the "
             "broker (%lld message(s)): changing the partitions of an endpoint would reorder its sessions. Run the "
             "endpoint with its old partitions until that queue is empty, stop every host of it, delete the old "
             "queue(s) (rabbitmqctl delete_queue %s), then start with partitions = %d; or move its messages with "
             "`nimbus-host partitions %s %d --transport ...` (docs/broker-partitions.md)",
             d->name, d->partitions, qn, (long long)msgs, qn, d->partitions, d->name, d->partitions);
    why = nh_xstrdup(buf);
    break;
  }
  json_decref(arr);
  return why;
}

/* Partition queue names do not carry the count (Ep.p0 is the first queue for P = 2 and for
 * P = 4), so a host started with P = 4 beside the queues of P = 2 finds only names it
 * expects. Their bindings tell: a key chooses on log2(P) bucket bits. Binding P = 4's keys
 * beside P = 2's would route a session's events to two queues (twice, out of order). */
static char *check_bound_count(nh_rmq_decl_t *d, const char *body, size_t len)
{
  json_t *arr = json_loadb(body, len, 0, NULL);
  char *why = NULL;
  int want = log2_of(d->partitions);
  size_t i;
  json_t *b;
  json_array_foreach(arr, i, b) {
    const char *dst = json_string_value(json_object_get(b, "destination"));
    const char *rk = json_string_value(json_object_get(b, "routing_key"));
    if (!dst || !rk || nh_rmq_queue_of(d->name, dst, NULL) != 2 || nh_rmq_binding_type(rk) == 0) continue;
    int bits = 0;
    for (const char *w = rk + strlen(rk); bits < NH_AMQP_BUCKET_BITS && w[-1] != '*'; w -= 2) bits++;
    if (bits == want) continue;
    char buf[1600];
    snprintf(buf, sizeof buf, "endpoint %s has partitions = %d, but its queue %s on the broker is bound for "
             "partitions = %d (binding %s): the queues of the old count are still there, and binding both counts "
             "would route a session's events to two queues. Start the hosts with partitions = %d, or move the "
             "endpoint's messages to %d partitions with `nimbus-host partitions %s %d --transport ...` first "
             "(docs/broker-partitions.md)", d->name, d->partitions, dst, 1 << bits, rk, 1 << bits, d->partitions,
             d->name, d->partitions);
    why = nh_xstrdup(buf);
    break;
  }
  json_decref(arr);
  return why;
}

nh_rmq_decl_t *nh_rmq_declare(uv_loop_t *loop, const nh_amqp_url_t *url, const char *name, int flags,
                              int partitions, const char *const *types, int ntypes,
                              void (*done)(void *, const char *), void *data)
{
  nh_rmq_decl_t *d = nh_xcalloc(1, sizeof *d);
  d->loop = loop;
  d->url = url;
  d->done = done;
  d->data = data;
  d->name = nh_xstrdup(name);
  d->partitions = partitions < 1 ? 1 : partitions;
  const char *queue = name;
  d->retry_ms = NH_RMQ_RETRY_MIN_MS;
  d->base = base_with_credentials(url);
  uv_timer_init(loop, &d->timer);
  d->timer.data = d;
  char *vh = esc(url->vhost ? url->vhost : "/");
  char *q = esc(queue);
  if (flags & NH_RMQ_REPLY) {
    add(d, "PUT", "declaring the reply queue", json_pack("{s:b, s:b, s:{s:i}}", "durable", 0, "auto_delete", 0,
        "arguments", "x-expires", NH_REPLY_QUEUE_EXPIRES_MS), "/queues/%s/%s", vh, q);
  } else {
    char dlx[512], dlq[512];
    snprintf(dlx, sizeof dlx, "%s.dead-letter", url->exchange);
    snprintf(dlq, sizeof dlq, "%s.dead-letter", queue);
    char *ex = esc(url->exchange), *dx = esc(dlx), *dq = esc(dlq);
    add(d, "PUT", "declaring the exchange", json_pack("{s:s, s:b}", "type", "topic", "durable", 1),
        "/exchanges/%s/%s", vh, ex);
    add(d, "PUT", "declaring the dead-letter exchange", json_pack("{s:s, s:b}", "type", "direct", "durable", 1),
        "/exchanges/%s/%s", vh, dx);
    add(d, "PUT", "declaring the dead-letter queue", json_pack("{s:b}", "durable", 1), "/queues/%s/%s", vh, dq);
    add(d, "POST", "binding the dead-letter queue", json_pack("{s:s}", "routing_key", queue), "/bindings/%s/e/%s/q/%s",
        vh, dx, dq);
    if (!(flags & NH_RMQ_MIGRATING)) {   /* the migration itself has both counts for a while */
      add(d, "GET", "listing the endpoint's queues", NULL, "/queues/%s?columns=name,messages", vh);
      d->steps[d->nsteps - 1].check = check_layout;
      if (d->partitions > 1) {
        add(d, "GET", "listing the exchange's bindings", NULL,
            "/exchanges/%s/%s/bindings/source?columns=destination,routing_key", vh, ex);
        d->steps[d->nsteps - 1].check = check_bound_count;
      }
    }
    for (int p = 0; p < d->partitions; p++) {
      char pq[600];
      nh_rmq_partition_queue(name, d->partitions, p, pq, sizeof pq);
      char *pqe = esc(pq);
      json_t *args = json_pack("{s:s, s:s}", "x-dead-letter-exchange", dlx, "x-dead-letter-routing-key", queue);
      if (d->partitions > 1) json_object_set_new(args, "x-single-active-consumer", json_true());
      add(d, "PUT", d->partitions > 1 ? "declaring a partition queue" : "declaring the endpoint queue",
          json_pack("{s:b, s:o}", "durable", 1, "arguments", args), "/queues/%s/%s", vh, pqe);
      for (int i = 0; i < ntypes; i++) {
        char key[700];
        nh_rmq_binding_key(types[i], d->partitions, p, key, sizeof key);
        add(d, "POST", "binding the endpoint queue", json_pack("{s:s}", "routing_key", key),
            "/bindings/%s/e/%s/q/%s", vh, ex, pqe);
        if (d->partitions == 1)   /* and the bare type: senders that add no bucket (older, by hand) */
          add(d, "POST", "binding the endpoint queue", json_pack("{s:s}", "routing_key", types[i]),
              "/bindings/%s/e/%s/q/%s", vh, ex, pqe);
      }
      free(pqe);
    }
    free(ex);
    free(dx);
    free(dq);
  }
  free(vh);
  free(q);
  uv_timer_start(&d->timer, timer_cb, 0, 0);   /* never calls back before the caller has d */
  return d;
}

static void timer_closed(uv_handle_t *h) { free(h->data); }

void nh_rmq_cancel(nh_rmq_decl_t *d)
{
  if (!d) return;
  if (d->call) nh_http_cancel(d->call);
  for (int i = 0; i < d->nsteps; i++) {
    free(d->steps[i].path);
    free(d->steps[i].body);
  }
  free(d->steps);
  free(d->base);
  free(d->name);
  uv_close((uv_handle_t *)&d->timer, timer_closed);
}

/* ---------------------------------------------------------------- is anyone listening? */

struct nh_rmq_probe {
  uv_loop_t *loop;
  nh_http_call_t *call;
  const nh_amqp_url_t *url;
  char *key, *queue;
  int listed;                    /* the queue was missing: the vhost's queues were asked for */
  void (*done)(void *, int, const char *);
  void *data;
};
typedef struct nh_rmq_probe probe_t;

static void probe_free(probe_t *p)
{
  free(p->key);
  free(p->queue);
  free(p);
}

void nh_rmq_probe_cancel(nh_rmq_probe_t *p)
{
  if (p->call) nh_http_cancel(p->call);
  probe_free(p);
}

/* Does a binding with key rk take events of `type`: "type", "#", or the host's own "type"
 * followed by the bucket's words (nh_rmq_declare)? */
static int binds_type(const char *rk, const char *type)
{
  if (strcmp(rk, "#") == 0 || strcmp(rk, type) == 0) return 1;
  size_t n = nh_rmq_binding_type(rk);
  return n > 0 && n == strlen(type) && strncmp(rk, type, n) == 0;
}

/* The partition count of endpoint `name` from the vhost's queue list: P when `name.p0` ..
 * `name.p<P-1>` are there (P a power of two), 0 when none is; -1 (why said) otherwise. */
static int count_partitions(const char *name, nh_http_res_t *res, char *why, size_t len)
{
  json_t *arr = json_loadb(res->body ? res->body : "", res->body_len, 0, NULL);
  int n = 0, top = -1, idx;
  size_t i;
  json_t *q;
  json_array_foreach(arr, i, q) {
    const char *qn = json_string_value(json_object_get(q, "name"));
    if (qn && nh_rmq_queue_of(name, qn, &idx) == 2) {
      n++;
      if (idx > top) top = idx;
    }
  }
  json_decref(arr);
  if (n == 0 || (n == top + 1 && (n & (n - 1)) == 0 && n <= 256)) return n;
  snprintf(why, len, "the queues of endpoint %s are %d partition queue(s) up to %s.p%d, not one partition count: "
           "finish its partitions migration (nimbus-host partitions %s P) first", name, n, name, top, name);
  return -1;
}

static void probe_done(void *data, nh_http_res_t *res);

/* GET <management>/api<fmt> for the probe, fmt taking the vhost and then the queue (or
 * exchange) name, both escaped (%.0s drops the name): 0, or -1 when it could not be sent. */
static int probe_get(probe_t *p, const char *fmt, nh_error_t *err)
{
  char *vh = esc(p->url->vhost ? p->url->vhost : "/");
  char *name = esc(p->queue ? p->queue : p->url->exchange);
  char path[1200];
  snprintf(path, sizeof path, fmt, vh, name);
  free(vh);
  free(name);
  nh_error_t ignored = {0};
  p->call = nh_rmq_call(p->loop, p->url, "GET", path, NULL, probe_done, p, err ? err : &ignored);
  return p->call ? 0 : -1;
}

static void probe_done(void *data, nh_http_res_t *res)
{
  probe_t *p = data;
  p->call = NULL;
  char why[1024] = "";
  int found = -1;
  if (nh_rmq_why(p->url, res, why, sizeof why)) {
    /* said why */
  } else if (res->status == 404 && p->queue && !p->listed) {
    /* no queue named after the endpoint: it may have partitions (Ep.p0 ..), listed next */
    p->listed = 1;
    if (probe_get(p, "/queues/%s?columns=name%.0s", NULL) == 0) return;
    snprintf(why, sizeof why, "listing the queues of the vhost failed");
  } else if (res->status == 404) {
    found = 0;   /* no such exchange or queue: nobody consumes it */
  } else if (res->status == 200 && p->queue && p->listed) {
    found = count_partitions(p->queue, res, why, sizeof why);
  } else if (res->status == 200 && p->queue) {
    found = 1;
  } else if (res->status == 200) {
    json_t *arr = json_loadb(res->body ? res->body : "", res->body_len, 0, NULL);
    found = 0;
    size_t i;
    json_t *b;
    json_array_foreach(arr, i, b) {
      const char *rk = json_string_value(json_object_get(b, "routing_key"));
      if (rk && binds_type(rk, p->key)) found = 1;
    }
    json_decref(arr);
  } else {
    snprintf(why, sizeof why, "HTTP %ld from the management API at %s", res->status, p->url->management);
  }
  p->done(p->data, found, found < 0 ? why : NULL);
  probe_free(p);
}

nh_rmq_probe_t *nh_rmq_probe(uv_loop_t *loop, const nh_amqp_url_t *url, const char *routing_key, const char *queue,
                             void (*done)(void *, int, const char *), void *data, nh_error_t *err)
{
  probe_t *p = nh_xcalloc(1, sizeof *p);
  p->loop = loop;
  p->url = url;
  p->key = nh_xstrdup(routing_key);
  p->queue = nh_xstrdup(queue);
  p->done = done;
  p->data = data;
  if (probe_get(p, queue ? "/queues/%s/%s" : "/exchanges/%s/%s/bindings/source", err)) {
    probe_free(p);
    return NULL;
  }
  return p;
}

/* ---------------------------------------------------------------- who consumes what */

struct nh_rmq_consumers {
  nh_http_call_t *call;
  void (*done)(void *, json_t *, const char *);
  void *data;
};

static void consumers_done(void *data, nh_http_res_t *res)
{
  nh_rmq_consumers_t *c = data;
  c->call = NULL;
  json_t *arr = res->status == 200 ? json_loadb(res->body ? res->body : "", res->body_len, 0, NULL) : NULL;
  char why[512] = "";
  if (res->status == 0) snprintf(why, sizeof why, "the management API did not answer: %s", res->error);
  else if (res->status != 200) snprintf(why, sizeof why, "HTTP %ld from the management API", res->status);
  else if (!json_is_array(arr)) snprintf(why, sizeof why, "the management API's consumer list is not a JSON array");
  c->done(c->data, json_is_array(arr) ? arr : NULL, why[0] ? why : NULL);
  json_decref(arr);
  free(c);
}

nh_rmq_consumers_t *nh_rmq_consumers(uv_loop_t *loop, const nh_amqp_url_t *url,
                                     void (*done)(void *, json_t *, const char *), void *data)
{
  nh_rmq_consumers_t *c = nh_xcalloc(1, sizeof *c);
  c->done = done;
  c->data = data;
  char *base = base_with_credentials(url);
  char *vh = esc(url->vhost ? url->vhost : "/");
  char path[4096];
  /* only what the spreading reads: the list is one row per consumer of the vhost */
  snprintf(path, sizeof path, "%s/api/consumers/%s?columns=queue.name,active,channel_details.connection_name", base,
           vh);
  free(base);
  free(vh);
  nh_http_req_t req = { .method = "GET", .url = path, .timeout_s = 10 };
  nh_error_t err = {0};
  c->call = nh_http_request(loop, &req, consumers_done, c, &err);
  if (!c->call) {
    free(c);
    return NULL;
  }
  return c;
}

int nh_rmq_consumers_on(json_t *consumers, const char *queue)
{
  int n = 0;
  size_t i;
  json_t *c;
  json_array_foreach(consumers, i, c) {
    const char *qn = json_string_value(json_object_get(json_object_get(c, "queue"), "name"));
    if (qn && strcmp(qn, queue) == 0) n++;
  }
  return n;
}

void nh_rmq_consumers_cancel(nh_rmq_consumers_t *c)
{
  if (!c) return;
  if (c->call) nh_http_cancel(c->call);
  free(c);
}
