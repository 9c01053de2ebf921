/* Server-Sent Events: GET /api/v1/stream (docs/admin-api.md): the clients, their frames, and
 * the poller of a sqlite store. On PostgreSQL the poller reads on the thread pool instead
 * (nh_admin_stream_pg.c), through the same clients and frames (nh_admin_stream_int.h).
 *
 * One poller serves every client. While at least one is connected a timer reads the
 * history rows written since its last tick (every change of an event writes one), reads
 * the audit row of each event they touch once, however many rows it had, and sends it as
 * `event: status` to each client whose filter it passes; `event: counts` (the /endpoints
 * answer) follows when rows came, at most every COUNTS_MS. A tick costs the same for one
 * client as for ten but for the copies into each client's buffer, and the store is read
 * between pumps on the loop thread, as every route reads it. No client, no timer running.
 *
 * Bounded: a tick sends at most about TICK_BYTES of status events (whole batches of
 * BATCH_ROWS rows, at least one), so a burst of changes costs the loop a few milliseconds
 * a tick, and a client that reads never comes near its buffer's cap (nh_httpd drops one
 * that does not read). Under a sustained load the stream lags behind; once it lags by more
 * than MAX_LAG_ROWS history rows it skips to the newest row and sends counts, so an
 * operator sees where things are now rather than minutes ago.
 *
 * Resuming: the last status event of each batch a client gets carries `id: N`, N the last
 * history row of the batch. A client that reconnects with `Last-Event-ID: N` gets the
 * events touched after N first (one tick's budget of them), so a short break misses
 * nothing; events seen only in part come again (a status event is the event's latest
 * state: twice is harmless). */
#include "nh_admin_stream_int.h"
#include "nh_views.h"
#include "core/nh_log.h"
#include "core/nh_util.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TICK_MS NH_STREAM_TICK_MS
#define COUNTS_MS NH_STREAM_COUNTS_MS
#define KEEPALIVE_MS 15000
#define RETRY_MS 2000          /* the client's reconnection delay (the `retry:` field) */
#define BATCH_ROWS NH_STREAM_BATCH_ROWS
#define TICK_BYTES NH_STREAM_TICK_BYTES
#define TICK_ROWS NH_STREAM_TICK_ROWS
#define MAX_LAG_ROWS NH_STREAM_MAX_LAG_ROWS

typedef nh_stream_client_t client_t;   /* this file's short names */
typedef nh_stream_touched_t touched_t;
typedef nh_stream_touched_set_t touched_set_t;

/* ---------------------------------------------------------------- touched events */

static int collect_row(void *data, const char *endpoint, const char *event_id)
{
  if (endpoint && event_id) nh_admin_stream_touched_add(data, endpoint, event_id, NULL);
  return 0;
}

/* ---------------------------------------------------------------- events sent in a tick */

/* The events one tick sent already (a later batch of the same tick may touch one again:
 * its state was read after that change, so it went out as it is now). Open addressing
 * over "endpoint\n event_id" keys. */
typedef struct seen_set {
  char **slot;
  size_t cap, n;
} seen_set_t;

static uint64_t key_hash(const char *k)
{
  uint64_t h = 1469598103934665603ull;   /* FNV-1a */
  for (; *k; k++) h = (h ^ (unsigned char)*k) * 1099511628211ull;
  return h;
}

static void seen_put(seen_set_t *s, char *key)
{
  size_t i = key_hash(key) & (s->cap - 1);
  while (s->slot[i]) i = (i + 1) & (s->cap - 1);
  s->slot[i] = key;
  s->n++;
}

static void seen_grow(seen_set_t *s)
{
  seen_set_t bigger = { nh_xcalloc(s->cap ? s->cap * 2 : 256, sizeof(char *)), s->cap ? s->cap * 2 : 256, 0 };
  for (size_t i = 0; i < s->cap; i++)
    if (s->slot[i]) seen_put(&bigger, s->slot[i]);
  free(s->slot);
  *s = bigger;
}

/* 1 if the event was not sent yet in this tick (it is now marked), 0 if it was. */
static int seen_add(seen_set_t *s, const touched_t *t)
{
  size_t n = strlen(t->endpoint) + strlen(t->event_id) + 2;
  char *key = nh_xmalloc(n);
  snprintf(key, n, "%s\n%s", t->endpoint, t->event_id);
  if (2 * (s->n + 1) > s->cap) seen_grow(s);
  for (size_t i = key_hash(key) & (s->cap - 1); s->slot[i]; i = (i + 1) & (s->cap - 1))
    if (strcmp(s->slot[i], key) == 0) {
      free(key);
      return 0;
    }
  seen_put(s, key);
  return 1;
}

static void seen_clear(seen_set_t *s)
{
  for (size_t i = 0; i < s->cap; i++) free(s->slot[i]);
  free(s->slot);
  memset(s, 0, sizeof *s);
}

/* Leaves out of a batch the events the tick sent already. */
static void touched_drop_seen(touched_set_t *t, seen_set_t *seen)
{
  size_t out = 0;
  for (size_t i = 0; i < t->n; i++) {
    if (seen_add(seen, &t->v[i])) {
      t->v[out++] = t->v[i];
    } else {
      free(t->v[i].endpoint);
      free(t->v[i].event_id);
    }
  }
  t->n = out;
}

/* ---------------------------------------------------------------- sending */

int nh_admin_stream_wants(const client_t *cl, const char *endpoint)
{
  return !cl->endpoint || strcmp(cl->endpoint, endpoint) == 0;
}

void nh_admin_stream_write(client_t *cl, const char *s, size_t len)
{
  /* -1: gone or dropped for not reading; its on_close follows from the loop */
  nh_httpd_stream_write(cl->hs, s, len);
}

/* Writes `frame` to `only`, or to every client when NULL. */
void nh_admin_stream_broadcast(struct nh_admin_stream *st, client_t *only, const char *frame, size_t len)
{
  if (only) {
    nh_admin_stream_write(only, frame, len);
    return;
  }
  nh_queue_t *q;
  nh_queue_foreach(q, &st->clients) nh_admin_stream_write(nh_queue_data(q, client_t, node), frame, len);
}

/* "event: NAME\ndata: JSON\n\n" (takes body); NULL when it cannot be encoded. Compact
 * JSON has no raw newline, so one data line holds it. */
char *nh_admin_stream_frame(const char *event, json_t *body, size_t *len)
{
  char *json = json_dumps(body, JSON_COMPACT | JSON_PRESERVE_ORDER);
  json_decref(body);
  if (!json) return NULL;
  size_t n = strlen(json) + strlen(event) + 32;
  char *frame = nh_xmalloc(n);
  *len = (size_t)snprintf(frame, n, "event: %s\ndata: %s\n\n", event, json);
  free(json);
  return frame;
}

static void send_counts(struct nh_admin_stream *st, client_t *only)
{
  nh_admin_call_t as = { .a = st->a };   /* the stream's own read, on the loop (sqlite) */
  json_t *counts = nh_admin_endpoints_json(&as);
  if (!counts) {
    nh_log_warn("admin", "stream: cannot read the endpoint counts: %s", nh_store_errmsg(st->a->store));
    return;
  }
  size_t len;
  char *frame = nh_admin_stream_frame("counts", counts, &len);
  if (frame) nh_admin_stream_broadcast(st, only, frame, len);
  free(frame);
}

/* For each client (or `only`) the index of its last matching event: that one carries the id. */
static void mark_last_matches(struct nh_admin_stream *st, client_t *only, const touched_set_t *t)
{
  nh_queue_t *q;
  nh_queue_foreach(q, &st->clients) {
    client_t *cl = nh_queue_data(q, client_t, node);
    cl->last_match = SIZE_MAX;
    if (only && cl != only) continue;
    for (size_t i = t->n; i-- > 0;)
      if (nh_admin_stream_wants(cl, t->v[i].endpoint)) {
        cl->last_match = i;
        break;
      }
  }
}

/* Sends event i of t (its latest state) to the clients that want it; the frame's bytes. */
static size_t send_status(struct nh_admin_stream *st, client_t *only, const touched_set_t *t, size_t i, int64_t id)
{
  nh_audit_t ev = { 0 };
  int found = nh_store_audit_get(st->a->store, t->v[i].endpoint, t->v[i].event_id, &ev);
  if (found <= 0) return 0;   /* gone already (retention), or the store failed: the next change sends it */
  size_t len;
  char *frame = nh_admin_stream_frame("status", nh_view_audit(&ev), &len);
  nh_audit_clear(&ev);
  if (!frame) return 0;
  char idline[40];
  int idlen = snprintf(idline, sizeof idline, "id: %lld\n", (long long)id);
  nh_queue_t *q;
  nh_queue_foreach(q, &st->clients) {
    client_t *cl = nh_queue_data(q, client_t, node);
    if ((only && cl != only) || !nh_admin_stream_wants(cl, t->v[i].endpoint)) continue;
    if (cl->last_match == i) nh_admin_stream_write(cl, idline, (size_t)idlen);
    nh_admin_stream_write(cl, frame, len);
  }
  free(frame);
  return len;
}

/* Whether anyone wants an event of this endpoint (only those are read). */
static int anyone_wants(struct nh_admin_stream *st, client_t *only, const char *endpoint)
{
  if (only) return nh_admin_stream_wants(only, endpoint);
  nh_queue_t *q;
  nh_queue_foreach(q, &st->clients)
    if (nh_admin_stream_wants(nh_queue_data(q, client_t, node), endpoint)) return 1;
  return 0;
}

/* Sends one batch; the bytes of status events it sent. */
static size_t send_batch(struct nh_admin_stream *st, client_t *only, touched_set_t *t, seen_set_t *seen, int64_t id)
{
  nh_admin_stream_touched_dedupe(t);
  touched_drop_seen(t, seen);
  mark_last_matches(st, only, t);
  size_t bytes = 0;
  for (size_t i = 0; i < t->n; i++)
    if (anyone_wants(st, only, t->v[i].endpoint)) bytes += send_status(st, only, t, i, id);
  return bytes;
}

typedef enum { CAUGHT_UP, BUDGET_SPENT, READ_FAILED } send_end_t;

/* Sends the events touched after `from` to every client (or `only`), a tick's budget of
 * them. *upto: the last row read; *rows: how many. */
static send_end_t send_changes(struct nh_admin_stream *st, client_t *only, int64_t from, int64_t *upto, int *rows)
{
  seen_set_t seen = { 0 };
  size_t bytes = 0;
  send_end_t end = BUDGET_SPENT;
  *upto = from;
  *rows = 0;
  while (bytes < TICK_BYTES && *rows < TICK_ROWS) {
    touched_set_t t = { 0 };
    int64_t last = *upto;
    int n = nh_store_history_after(st->a->store, *upto, BATCH_ROWS, collect_row, &t, &last);
    if (n < 0) {
      nh_log_warn("admin", "stream: cannot read the history: %s", nh_store_errmsg(st->a->store));
      nh_admin_stream_touched_clear(&t);
      end = READ_FAILED;
      break;
    }
    *upto = last;
    *rows += n;
    bytes += send_batch(st, only, &t, &seen, last);
    nh_admin_stream_touched_clear(&t);
    if (n < BATCH_ROWS) {
      end = CAUGHT_UP;
      break;
    }
  }
  seen_clear(&seen);
  return end;
}

/* Far behind the store under a sustained load: skip to now (counts follow). */
static void skip_if_lagging(struct nh_admin_stream *st)
{
  int64_t newest = nh_store_history_last_id(st->a->store);
  if (newest - st->last_id <= MAX_LAG_ROWS) return;
  nh_log_debug("admin", "stream: %lld history rows behind; skipping to the newest", (long long)(newest - st->last_id));
  st->last_id = newest;
  st->counts_due = 1;
}

static void sqlite_tick(struct nh_admin_stream *st, uint64_t now)
{
  int64_t upto;
  int rows;
  send_end_t end = send_changes(st, NULL, st->last_id, &upto, &rows);
  st->last_id = upto;
  if (rows > 0) st->counts_due = 1;
  if (end == BUDGET_SPENT) skip_if_lagging(st);
  if (st->counts_due && now - st->counts_at >= COUNTS_MS) {
    st->counts_due = 0;
    st->counts_at = now;
    send_counts(st, NULL);
  }
}

static void on_tick(uv_timer_t *timer)
{
  struct nh_admin_stream *st = timer->data;
  uint64_t now = uv_now(timer->loop);
  if (st->pg) nh_admin_stream_pg_tick(st);   /* its reads go to the pool; what they bring is sent later */
  else sqlite_tick(st, now);
  if (now - st->keepalive_at >= KEEPALIVE_MS) {
    st->keepalive_at = now;
    static const char ka[] = ": keep-alive\n\n";
    nh_admin_stream_broadcast(st, NULL, ka, sizeof ka - 1);
  }
}

/* ---------------------------------------------------------------- clients */

static void client_free(client_t *cl)
{
  free(cl->endpoint);
  free(cl->seeds);
  free(cl);
}

static void client_unlink(client_t *cl)
{
  struct nh_admin_stream *st = cl->st;
  nh_queue_remove(&cl->node);
  if (--st->nclients > 0) return;
  uv_timer_stop(&st->timer);   /* nobody listens: no polling */
  if (st->pg) nh_admin_stream_pg_emptied(st);
}

/* The client went away, was dropped for not reading, or the server closed. */
static void on_client_close(void *ud)
{
  client_t *cl = ud;
  client_unlink(cl);
  client_free(cl);
}

/* The listener's stream state, made with its first client. */
struct nh_admin_stream *nh_admin_stream_of(nh_admin_t *a)
{
  if (a->stream) return a->stream;
  struct nh_admin_stream *st = nh_xcalloc(1, sizeof *st);
  st->a = a;
  nh_queue_init(&st->clients);
  uv_timer_init(a->loop, &st->timer);
  st->timer.data = st;
  uv_unref((uv_handle_t *)&st->timer);   /* a stream never holds the host up at shutdown */
  a->stream = st;
  return st;
}

/* An endpoint with events, or one a live host serves (it may have none yet). 1 with the
 * answer given when it is neither. */
int nh_admin_stream_refuse_endpoint(nh_admin_call_t *c, const char *endpoint)
{
  int known = nh_admin_endpoint_known(c, endpoint);
  if (known < 0) {
    nh_admin_store_error(c);
    return 1;
  }
  if (known || nh_admin_live_hosts(c, endpoint) > 0) return 0;
  nh_admin_error(c->r, 400, "endpoint", "unknown endpoint %s (GET /api/v1/endpoints lists them)", endpoint);
  return 1;
}

/* The Last-Event-ID a reconnecting client sends; -1 when none or not ours. */
static int64_t last_event_id(nh_admin_call_t *c)
{
  char *h = nh_admin_header(c->r, "Last-Event-ID");
  char *end = NULL;
  long long v = h ? strtoll(h, &end, 10) : -1;
  if (h && (!*h || *end || v < 0)) v = -1;
  free(h);
  return v;
}

/* Events a reconnecting client missed: those touched after `resume`, a tick's budget of
 * them, when that is ours and not too far back (else it starts from now; its counts event
 * shows where things are). */
static void catch_up(struct nh_admin_stream *st, client_t *cl, int64_t resume)
{
  if (resume < 0 || resume >= st->last_id || st->last_id - resume > MAX_LAG_ROWS) return;
  int64_t upto;
  int rows;
  send_changes(st, cl, resume, &upto, &rows);
}

void nh_admin_stream_start_timer(struct nh_admin_stream *st)
{
  uint64_t now = uv_now(st->a->loop);
  st->counts_due = 0;
  st->counts_at = st->keepalive_at = now;
  uv_timer_start(&st->timer, on_tick, TICK_MS, TICK_MS);
}

static const nh_httpd_header_t sse_headers[] = {
  { "Content-Type", "text/event-stream" },
  { "Cache-Control", "no-store" },
  { "X-Content-Type-Options", "nosniff" },
  { "X-Accel-Buffering", "no" },   /* a proxy in front must pass events on as they come */
};

/* Opens the stream and sends its head: the retry delay and the counts now. */
client_t *nh_admin_stream_client_open(nh_admin_call_t *c, struct nh_admin_stream *st, const char *endpoint,
                                      json_t *counts)
{
  client_t *cl = nh_xcalloc(1, sizeof *cl);
  cl->st = st;
  cl->endpoint = nh_xstrdup(endpoint);
  nh_queue_init(&cl->node);
  nh_error_t err = { 0 };
  cl->hs = nh_httpd_stream_start(c->r, 200, sse_headers, sizeof sse_headers / sizeof sse_headers[0],
                                 on_client_close, cl, &err);
  if (!cl->hs) {
    nh_log_warn("admin", "stream: %s", err.msg);
    json_decref(counts);
    client_free(cl);
    return NULL;
  }
  nh_queue_insert_tail(&st->clients, &cl->node);
  st->nclients++;
  char head[32];
  int n = snprintf(head, sizeof head, "retry: %d\n\n", RETRY_MS);
  nh_admin_stream_write(cl, head, (size_t)n);
  size_t len;
  char *frame = nh_admin_stream_frame("counts", counts, &len);
  if (frame) nh_admin_stream_write(cl, frame, len);
  free(frame);
  return cl;
}

void nh_admin_get_stream(nh_admin_call_t *c)
{
  static const char *const known[] = { "endpoint", "access_token", NULL };
  if (nh_admin_params_check(c, known)) return;
  if (!c->a->store) {   /* PostgreSQL: its reads on the pool (nh_admin_stream_pg.c) */
    nh_admin_stream_pg_open(c, last_event_id(c));
    return;
  }
  const char *endpoint = nh_admin_param(c, "endpoint");
  if (endpoint && nh_admin_stream_refuse_endpoint(c, endpoint)) return;
  /* what can fail is read before the stream starts, while an error can still be a 500 */
  int first = !c->a->stream || c->a->stream->nclients == 0;
  int64_t now_id = first ? nh_store_history_last_id(c->a->store) : 0;
  json_t *counts = now_id >= 0 ? nh_admin_endpoints_json(c) : NULL;
  if (!counts) {
    nh_admin_store_error(c);
    return;
  }
  int64_t resume = last_event_id(c);
  struct nh_admin_stream *st = nh_admin_stream_of(c->a);
  client_t *cl = nh_admin_stream_client_open(c, st, endpoint, counts);
  if (!cl) return;
  if (first) {
    st->last_id = now_id;
    nh_admin_stream_start_timer(st);
  }
  catch_up(st, cl, resume);
}

void nh_admin_stream_free(struct nh_admin_stream *st)
{
  if (!st->timer_closed || (st->pg && nh_admin_stream_pg_busy(st))) return;   /* the later of the two frees it */
  nh_admin_stream_pg_free(st->pg);
  free(st);
}

static void stream_freed(uv_handle_t *h)
{
  struct nh_admin_stream *st = h->data;
  st->timer_closed = 1;
  nh_admin_stream_free(st);
}

void nh_admin_stream_close(nh_admin_t *a)
{
  struct nh_admin_stream *st = a->stream;
  if (!st) return;
  a->stream = NULL;
  /* ended here, each stream sends what it holds and the end of its body */
  while (!nh_queue_empty(&st->clients)) {
    client_t *cl = nh_queue_data(nh_queue_head(&st->clients), client_t, node);
    nh_queue_remove(&cl->node);
    nh_httpd_stream_end(cl->hs);
    client_free(cl);
  }
  st->nclients = 0;
  st->a = NULL;
  uv_timer_stop(&st->timer);
  /* the memory goes with the handle, or with the PostgreSQL tick's work when that is still out */
  uv_close((uv_handle_t *)&st->timer, stream_freed);
}
