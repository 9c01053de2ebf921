/* Changing an endpoint's partition count on RabbitMQ (nimbus-host partitions,
 * docs/broker-partitions.md): its queues from the management API, a marker queue that
 * says a migration is under way (hosts refuse to start while it exists, and a second run
 * knows what to finish), the new queues and bindings (nh_rmq_declare), the old bindings
 * removed, every message moved in order over AMQP (nh_amqp_move.c), the old queues and
 * the marker deleted. Every step is idempotent, so running it again after an interruption
 * finishes the job.
 *
 * A command, not the host: it runs the loop itself (uv_run until each step is answered)
 * and so reads as the sequence it is. */
#include "nh_amqp.h"
#include "nh_amqp_int.h"
#include "core/nh_util.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NH_MIGRATE_DECLARE_MS 60000
#define NH_MIGRATE_DELETE_TRIES 300   /* 100 ms apart: the last acceptances reach the queue */

typedef struct mig {
  uv_loop_t *loop;
  nh_amqp_url_t url;
  char *vh;                      /* the vhost, escaped for a path */
  const char *ep;
  int partitions;
  int stall_s;                   /* the move stops after that long with nothing moved */
  long status;                   /* the last call's HTTP status */
  nh_error_t *err;
  char foreign[600];             /* bindings removed that no host makes ("Ep.p0: Order.#, ...") */
} mig_t;

typedef struct answer {
  int done;
  long status;
  json_t *json;
  char error[256];               /* no answer: why */
  char why[1024];
} answer_t;

static void answered(void *data, nh_http_res_t *res)
{
  answer_t *a = data;
  a->done = 1;
  a->status = res->status;
  snprintf(a->error, sizeof a->error, "%s", res->error);
  if (res->status >= 200 && res->status < 300 && res->body_len)
    a->json = json_loadb(res->body, res->body_len, 0, NULL);
  else if (res->status >= 300)
    snprintf(a->why, sizeof a->why, "HTTP %ld: %.400s", res->status, res->body ? res->body : "");
}

static void wait_for(mig_t *g, const int *flag)
{
  while (!*flag) uv_run(g->loop, UV_RUN_ONCE);
}

/* One management API call, waited for: its HTTP status (and JSON answer in *out, to
 * free), or -1 with g->err set (the API cannot be reached, or refused the user). */
static long call(mig_t *g, const char *method, const char *body, json_t **out, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static long call(mig_t *g, const char *method, const char *body, json_t **out, const char *fmt, ...)
{
  char path[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(path, sizeof path, fmt, ap);
  va_end(ap);
  answer_t a = { 0 };
  if (!nh_rmq_call(g->loop, &g->url, method, path, body, answered, &a, g->err)) return -1;
  wait_for(g, &a.done);
  g->status = a.status;
  nh_http_res_t res = { .status = a.status };
  snprintf(res.error, sizeof res.error, "%s", a.error);
  char why[1024];
  if (nh_rmq_why(&g->url, &res, why, sizeof why)) {
    nh_error_set(g->err, NH_EFAIL, "%s", why);
    json_decref(a.json);
    return -1;
  }
  if (out) *out = a.json;
  else json_decref(a.json);
  if (a.status >= 300 && a.status != 404) {
    nh_error_set(g->err, NH_EFAIL, "%s %s: %s", method, path, a.why);
    return -1;
  }
  return a.status;
}

/* "Ep" or "Ep.p0 .. Ep.p3": the queues of `partitions`. */
static void layout(const char *ep, int partitions, char *out, size_t len)
{
  if (partitions <= 1) snprintf(out, len, "%s", ep);
  else snprintf(out, len, "%s.p0 .. %s.p%d", ep, ep, partitions - 1);
}

/* Is q one of the endpoint's queues under `partitions`? */
static int in_layout(const char *ep, int partitions, const char *q, int *index)
{
  int i = 0, kind = nh_rmq_queue_of(ep, q, &i);
  if (index) *index = i;
  return partitions == 1 ? kind == 1 : kind == 2 && i < partitions;
}

typedef struct queues {
  char **names;                  /* the endpoint's queues on the broker */
  int n;
  int from, to;                  /* the marker's, when a migration is under way */
  int marker;
  int bare, top;                 /* the queue `ep`; the highest partition index, -1 none */
} queues_t;

static void queues_free(queues_t *q)
{
  for (int i = 0; i < q->n; i++) free(q->names[i]);
  free(q->names);
}

static int list_queues(mig_t *g, queues_t *q)
{
  json_t *arr = NULL;
  long st = call(g, "GET", NULL, &arr, "/queues/%s?columns=name", g->vh);
  if (st == 404) return nh_error_set(g->err, NH_EFAIL, "the vhost %s does not exist on the broker",
                                     g->url.vhost ? g->url.vhost : "/");
  if (st < 0) return NH_EFAIL;
  memset(q, 0, sizeof *q);
  q->top = -1;
  q->names = nh_xcalloc(json_array_size(arr) + 1, sizeof *q->names);
  size_t i;
  json_t *it;
  json_array_foreach(arr, i, it) {
    const char *name = json_string_value(json_object_get(it, "name"));
    int idx = 0, kind = name ? nh_rmq_queue_of(g->ep, name, &idx) : 0;
    if (name && nh_rmq_migration_of(g->ep, name, &q->from, &q->to)) q->marker = 1;
    if (!kind) continue;
    q->names[q->n++] = nh_xstrdup(name);
    if (kind == 1) q->bare = 1;
    else if (idx > q->top) q->top = idx;
  }
  json_decref(arr);
  return NH_OK;
}

/* Refused while anything consumes one of the endpoint's queues: a host would run the
 * messages being moved, out of order. */
static int check_consumers(mig_t *g, const queues_t *q)
{
  json_t *arr = NULL;
  if (call(g, "GET", NULL, &arr, "/consumers/%s?columns=queue.name", g->vh) < 0) return NH_EFAIL;
  char list[1024] = "";
  size_t used = 0;
  int total = 0;
  for (int k = 0; k < q->n; k++) {
    int n = nh_rmq_consumers_on(arr, q->names[k]);
    if (n && used < sizeof list - 1)
      used += (size_t)snprintf(list + used, sizeof list - used, "%s%d consumer(s) on %s", total ? ", " : "", n,
                               q->names[k]);
    total += n;
  }
  json_decref(arr);
  if (total)
    return nh_error_set(g->err, NH_EFAIL, "stop every host that consumes %s first (%s), then run this again: a "
                        "host would run the messages being moved out of order", g->ep, list);
  return NH_OK;
}

/* The event types bound to the endpoint's queues (a routing key is the type, then the
 * bucket's words; a single queue also binds the bare type), and each queue's bindings. */
/* A key no host binds: no bucket words (n, nh_rmq_binding_type) and a wildcard of its own
 * (an operator's `#`, `Order.#`); hosts bind a type with bucket words, or a bare type. */
static int made_by_no_host(const char *rk, size_t n)
{
  return n == 0 && (strchr(rk, '*') || strchr(rk, '#'));
}

static int read_bindings(mig_t *g, const queues_t *q, json_t **bindings, char ***types, int *ntypes)
{
  for (int k = 0; k < q->n; k++) {
    char *qe = nh_rmq_esc(q->names[k]);
    long st = call(g, "GET", NULL, &bindings[k], "/queues/%s/%s/bindings", g->vh, qe);
    free(qe);
    if (st < 0) return NH_EFAIL;
    size_t i;
    json_t *b;
    json_array_foreach(bindings[k], i, b) {
      const char *src = json_string_value(json_object_get(b, "source"));
      const char *rk = json_string_value(json_object_get(b, "routing_key"));
      if (!src || !rk || strcmp(src, g->url.exchange) != 0) continue;
      size_t n = nh_rmq_binding_type(rk);
      if (made_by_no_host(rk, n)) continue;
      char *type = n ? nh_xstrndup(rk, n) : nh_xstrdup(rk);
      int seen = 0;
      for (int t = 0; t < *ntypes && !seen; t++) seen = strcmp((*types)[t], type) == 0;
      if (seen) {
        free(type);
        continue;
      }
      *types = nh_xrealloc(*types, sizeof **types * (size_t)(*ntypes + 1));
      (*types)[(*ntypes)++] = type;
    }
  }
  return NH_OK;
}

static void declared(void *data, const char *why)
{
  answer_t *a = data;
  a->done = 1;
  if (why) snprintf(a->why, sizeof a->why, "%s", why);
}

static void declare_timeout(uv_timer_t *t)
{
  answer_t *a = t->data;
  a->done = 1;
  snprintf(a->why, sizeof a->why, "declaring the new queues did not finish within %d s (see the log above)",
           NH_MIGRATE_DECLARE_MS / 1000);
}

static void timer_closed(uv_handle_t *h) { *(int *)h->data = 1; }

/* The new queues and their bindings, as a host declares them, beside the old ones. */
static int declare_new(mig_t *g, char **types, int ntypes)
{
  answer_t a = { 0 };
  nh_rmq_decl_t *d = nh_rmq_declare(g->loop, &g->url, g->ep, NH_RMQ_MIGRATING, g->partitions,
                                    (const char *const *)types, ntypes, declared, &a);
  uv_timer_t t;
  uv_timer_init(g->loop, &t);
  t.data = &a;
  uv_timer_start(&t, declare_timeout, NH_MIGRATE_DECLARE_MS, 0);
  wait_for(g, &a.done);
  nh_rmq_cancel(d);
  int closed = 0;
  t.data = &closed;
  uv_close((uv_handle_t *)&t, timer_closed);
  wait_for(g, &closed);
  if (a.why[0]) return nh_error_set(g->err, NH_EFAIL, "%s", a.why);
  return NH_OK;
}

/* Unbinds what the new layout does not bind: the old queues' keys, so that new events
 * reach the new queues only. */
static int unbind_old(mig_t *g, const queues_t *q, json_t **bindings)
{
  for (int k = 0; k < q->n; k++) {
    int idx = 0, keep = in_layout(g->ep, g->partitions, q->names[k], &idx);
    size_t i;
    json_t *b;
    json_array_foreach(bindings[k], i, b) {
      const char *src = json_string_value(json_object_get(b, "source"));
      const char *rk = json_string_value(json_object_get(b, "routing_key"));
      const char *props = json_string_value(json_object_get(b, "properties_key"));
      if (!src || !rk || !props || strcmp(src, g->url.exchange) != 0) continue;
      size_t n = nh_rmq_binding_type(rk);
      if (keep && n) {
        char type[600], want[700];
        snprintf(type, sizeof type, "%.*s", (int)n, rk);
        nh_rmq_binding_key(type, g->partitions, idx, want, sizeof want);
        if (strcmp(want, rk) == 0) continue;
      }
      if (keep && !n && g->partitions == 1) continue;   /* a single queue's bare type */
      if (made_by_no_host(rk, n)) {   /* someone's own: said at the end */
        size_t at = strlen(g->foreign);
        snprintf(g->foreign + at, sizeof g->foreign - at, "%s%s: %s", at ? ", " : "", q->names[k], rk);
      }
      char *qe = nh_rmq_esc(q->names[k]), *ex = nh_rmq_esc(g->url.exchange), *pe = nh_rmq_esc(props);
      long st = call(g, "DELETE", NULL, NULL, "/bindings/%s/e/%s/q/%s/%s", g->vh, ex, qe, pe);
      free(qe);
      free(ex);
      free(pe);
      if (st < 0) return NH_EFAIL;
    }
  }
  return NH_OK;
}

static void moved(void *data, const char *why)
{
  answer_t *a = data;
  a->done = 1;
  if (why) snprintf(a->why, sizeof a->why, "%s", why);
}

static void pause_cb(uv_timer_t *t) { uv_close((uv_handle_t *)t, timer_closed); }

static void pause_ms(mig_t *g, uint64_t ms)
{
  uv_timer_t t;
  int closed = 0;
  uv_timer_init(g->loop, &t);
  t.data = &closed;
  uv_timer_start(&t, pause_cb, ms, 0);
  wait_for(g, &closed);
}

/* Deletes queue `name` once it is empty: the broker takes the last acceptances a moment
 * after the move's session ended. */
static int delete_empty(mig_t *g, const char *name)
{
  char *qe = nh_rmq_esc(name);
  long st = -1;
  for (int tries = 0; tries < NH_MIGRATE_DELETE_TRIES; tries++) {
    st = call(g, "DELETE", NULL, NULL, "/queues/%s/%s?if-empty=true", g->vh, qe);
    if (st >= 0 || g->status != 400) break;   /* 400: not empty (yet) */
    nh_error_set(g->err, NH_EFAIL, "queue %s still holds messages %d s after the move: RabbitMQ has not applied "
                 "every acceptance the move sent (seen once with a slowed-down broker), or something sends to the "
                 "queue directly. Run the command again: it moves what is left", name,
                 NH_MIGRATE_DELETE_TRIES / 10);
    pause_ms(g, 100);
  }
  free(qe);
  return st >= 0 ? NH_OK : NH_EFAIL;
}

static int migrate(mig_t *g, char *said, size_t len)
{
  queues_t q;
  if (list_queues(g, &q)) return NH_EFAIL;
  int rc = NH_EFAIL, ntypes = 0;
  char **types = NULL;
  json_t **bindings = nh_xcalloc((size_t)q.n + 1, sizeof *bindings);
  int from = q.marker ? q.from : q.bare ? 1 : q.top + 1;
  char was[1300], will[1300], marker[600];
  layout(g->ep, from, was, sizeof was);
  layout(g->ep, g->partitions, will, sizeof will);
  if (q.marker && q.to != g->partitions) {
    nh_error_set(g->err, NH_EFAIL, "a migration of %s from %d to %d partition(s) is under way or was interrupted: "
                 "finish it first (nimbus-host partitions %s %d)", g->ep, q.from, q.to, g->ep, q.to);
    goto out;
  }
  if (!q.marker && q.n == 0) {
    nh_error_set(g->err, NH_EFAIL, "endpoint %s has no queues on the broker yet: a host with the endpoint declares "
                 "them (start it with partitions = %d)", g->ep, g->partitions);
    goto out;
  }
  if (!q.marker && q.bare && q.top >= 0) {
    nh_error_set(g->err, NH_EFAIL, "endpoint %s has both a queue %s and partition queues up to %s.p%d, and no "
                 "migration is under way: see which holds what (rabbitmqctl list_queues) and delete the stray ones",
                 g->ep, g->ep, g->ep, q.top);
    goto out;
  }
  if (!q.marker && from == g->partitions) {
    snprintf(said, len, "%s already has %d partition(s) (%s): nothing to do", g->ep, from, will);
    rc = NH_OK;
    goto out;
  }
  if (check_consumers(g, &q)) goto out;
  nh_rmq_migration_marker(g->ep, from, g->partitions, marker, sizeof marker);
  char *me = nh_rmq_esc(marker);
  long st = call(g, "PUT", "{\"durable\":true}", NULL, "/queues/%s/%s", g->vh, me);
  if (st < 0 || read_bindings(g, &q, bindings, &types, &ntypes) || declare_new(g, types, ntypes) ||
      unbind_old(g, &q, bindings)) {
    free(me);
    goto out;
  }
  answer_t a = { 0 };
  nh_amqp_move_t *m = nh_amqp_move(g->loop, &g->url, g->ep, g->partitions, (const char *const *)q.names, q.n,
                                   g->stall_s, moved, &a);
  wait_for(g, &a.done);
  long n_moved = 0, n_stayed = 0;
  nh_amqp_move_counts(m, &n_moved, &n_stayed);
  nh_amqp_move_free(m);
  if (a.why[0]) {
    nh_error_set(g->err, NH_EFAIL, "%s (%ld message(s) moved so far; the rest stay where they were)", a.why,
                 n_moved);
    free(me);
    goto out;
  }
  for (int k = 0; k < q.n; k++)
    if (!in_layout(g->ep, g->partitions, q.names[k], NULL) && delete_empty(g, q.names[k])) {
      free(me);
      goto out;
    }
  st = call(g, "DELETE", NULL, NULL, "/queues/%s/%s", g->vh, me);
  free(me);
  if (st < 0) goto out;
  snprintf(said, len, "%s: moved %ld message(s) from %d partition(s) (%s) to %d (%s)", g->ep, n_moved, from, was,
           g->partitions, will);
  if (n_stayed) snprintf(said + strlen(said), len - strlen(said), "; %ld were in their new queue already", n_stayed);
  if (g->foreign[0])
    snprintf(said + strlen(said), len - strlen(said), "; removed binding(s) no host makes (%s): bind them again by "
             "hand if they are still wanted", g->foreign);
  rc = NH_OK;
out:
  for (int k = 0; k < q.n; k++) json_decref(bindings[k]);
  free(bindings);
  for (int t = 0; t < ntypes; t++) free(types[t]);
  free(types);
  queues_free(&q);
  return rc;
}

int nh_amqp_partitions_migrate(uv_loop_t *loop, const char *url, const char *endpoint, int partitions, int stall_s,
                               char *said, size_t len, nh_error_t *err)
{
  mig_t g = { .loop = loop, .ep = endpoint, .partitions = partitions, .stall_s = stall_s, .err = err };
  if (nh_amqp_url_parse(url, &g.url, err)) return NH_EUSAGE;
  int rc;
  if (g.url.servicebus)
    rc = nh_error_set(err, NH_EUSAGE, "partitions are for RabbitMQ: on Service Bus a session-enabled subscription "
                      "keeps sessions in order (docs/servicebus-amqp.md)");
  else if (g.url.no_management)
    rc = nh_error_set(err, NH_EUSAGE, "moving partitions needs the RabbitMQ management API (the transport URL has "
                      "management=none)");
  else {
    g.vh = nh_rmq_esc(g.url.vhost ? g.url.vhost : "/");
    rc = migrate(&g, said, len);
    free(g.vh);
  }
  nh_amqp_url_clear(&g.url);
  return rc;
}
