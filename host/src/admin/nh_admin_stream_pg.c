/* The live stream on a PostgreSQL store (nh_admin_stream_int.h): the same events as on sqlite
 * (nh_admin_stream.c), read another way.
 *
 * The loop never waits for the database. Opening a stream is a route in two halves
 * (nh_admin_pg_defer_then): the endpoint check, the newest history id and the counts are read
 * on the pool, then the stream starts from the loop. Each tick of the one poller sends its
 * reads to the pool (uv_queue_work) with a connection of the listener's pool: the history
 * after the cursor and in its gaps, each row with its event as it is now (one statement a
 * batch), the catch-up of clients that just came, the newest id when it lags, the counts
 * when due. The frames are built there, and the loop writes them in the after-work callback
 * to the clients still in the list (the work names them by serial: one may have gone). One
 * tick's work is out at a time; a tick that finds it still out is skipped.
 *
 * History ids are handed out at insert, not commit: id 11 can be visible before 10. The
 * cursor (core/nh_idcursor.h) keeps the ids read above its low mark and reads the gaps below
 * them again until they fill or are given up (GAP_MS), so a late commit is sent, not
 * skipped. The stream starts at the newest id read before the counts, its SEED_BACK ids
 * below taken as they were then (the counts show them), as `events --follow` starts.
 *
 * Ids and resuming: an `id: N` line says N is the cursor's low mark after the batch, so
 * every history row up to N was sent (or given up); rows above it that came already are sent
 * again to a client that resumes from N (a status event is the event's latest state: twice
 * is harmless). A client gets an id line only once it has everything the poller sent since
 * it came, and only a higher one than its last. Resuming with Last-Event-ID N: the first
 * client starts the cursor at N; a later one is caught up with the rows after N up to where
 * the cursor is (a tick's budget of them a tick, the next tick going on where it stopped),
 * what comes later reaching it through the cursor. A client without one is caught up from
 * the newest id it read when it came, so what the poller sent while it was opening reaches
 * it too. N further back than MAX_LAG_ROWS, or past the newest, is not ours: it starts from
 * now, as on sqlite. */
#include "nh_admin_stream_int.h"
#include "nh_views.h"
#include "core/nh_idcursor.h"
#include "core/nh_log.h"
#include "core/nh_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GAP_MS 30000     /* a missing id waited for this long is given up: longer than any transaction of the host's */
#define MAX_GAPS 16      /* gaps read again per statement (the highest: a late commit is near the top) */
#define SEED_BACK 1000   /* ids below the newest that may still commit when the stream starts (as events --follow) */

struct nh_stream_pg {
  nh_idcursor_t cur;     /* the loop's between ticks, the work's while it is out */
  int started;           /* the cursor has its start (else the next tick starts it at the first client) */
  int restart;           /* the last client left: the next tick drops the cursor, as sqlite forgets last_id */
  int busy;              /* a tick's work is out */
  uint64_t serials;
};

/* ---------------------------------------------------------------- one tick's work */

typedef struct frame {
  char *endpoint, *text;
  size_t len;
} frame_t;

typedef struct batch {
  uint64_t only;         /* 0: every client's; else the serial of the client it catches up */
  int64_t id;            /* its id line: the cursor's low mark after it; -1: none (a catch-up) */
  frame_t *v;
  size_t n;
} batch_t;

typedef struct catchup {
  uint64_t serial;
  char *endpoint;        /* its client's filter (NULL: all) */
  int64_t from;          /* read after this; after the work: where it stopped */
  int done;
} catchup_t;

typedef struct tick {
  uv_work_t w;
  struct nh_admin_stream *st;
  nh_admin_t *a;         /* st->a goes NULL when the listener closes: this one is released */
  nh_idcursor_t *cur;
  uint64_t at;           /* loop time of the tick */
  /* in: what the clients want (copied: a client may go while the work is out) */
  char **want;
  int nwant, want_all;
  catchup_t *cu;
  int ncu;
  int counts_due, counts_ok;
  /* out */
  batch_t *b;
  size_t nb;
  int rows;              /* rows new to the cursor */
  int budget_spent;
  int64_t skipped;       /* rows skipped for lagging behind */
  char *counts;          /* the counts frame */
  size_t counts_len;
  int failed, counts_failed;
  char err[512];
} tick_t;

/* The rows of one read, and what to keep of them. */
typedef struct reading {
  nh_idcursor_t *cur;    /* the main read's; NULL in a catch-up, which takes nothing */
  int64_t now, upto;     /* a catch-up reads up to upto */
  int64_t last;          /* a catch-up: the last id read */
  int beyond;            /* a catch-up read past upto */
  int taken;
  char *const *want;
  int nwant, all;
  nh_stream_touched_set_t set;
} reading_t;

static int reading_wants(const reading_t *r, const char *endpoint)
{
  if (r->all) return 1;
  for (int i = 0; i < r->nwant; i++)
    if (strcmp(r->want[i], endpoint) == 0) return 1;
  return 0;
}

static void read_row(void *data, int64_t id, const nh_audit_t *a)
{
  reading_t *r = data;
  if (r->cur) {
    if (!nh_idcursor_take(r->cur, id, r->now)) return;
    r->taken++;
  } else if (id > r->upto) {
    r->beyond = 1;   /* the cursor's: it sends that to everyone */
    return;
  } else {
    r->last = id;
  }
  /* a gone event (retention) sends nothing; an unwanted one is not encoded */
  if (a && a->endpoint && a->event_id && reading_wants(r, a->endpoint))
    nh_admin_stream_touched_add(&r->set, a->endpoint, a->event_id, nh_view_audit(a));
}

/* Encodes the batch's events (each once, as its last row read it); its bytes. */
static size_t batch_add(tick_t *t, nh_stream_touched_set_t *set, uint64_t only, int64_t id)
{
  nh_admin_stream_touched_dedupe(set);
  batch_t b = { only, id, NULL, 0 };
  size_t bytes = 0;
  if (set->n) b.v = nh_xcalloc(set->n, sizeof *b.v);
  for (size_t i = 0; i < set->n; i++) {
    size_t len = 0;
    char *text = nh_admin_stream_frame("status", set->v[i].view, &len);
    set->v[i].view = NULL;   /* taken */
    if (!text) continue;
    b.v[b.n++] = (frame_t){ nh_xstrdup(set->v[i].endpoint), text, len };
    bytes += len;
  }
  nh_admin_stream_touched_clear(set);
  if (!b.n) {
    free(b.v);
    return 0;
  }
  t->b = nh_xrealloc(t->b, (t->nb + 1) * sizeof *t->b);
  t->b[t->nb++] = b;
  return bytes;
}

static void tick_failed(tick_t *t, nh_admin_call_t *c, reading_t *r)
{
  nh_admin_stream_touched_clear(&r->set);
  t->failed = 1;
  snprintf(t->err, sizeof t->err, "%s", c->pg_err);
}

/* A client that came: the rows after its start up to the cursor's top when the work began
 * (what is above comes to it through the cursor), a tick's budget of them. */
static void read_catchup(tick_t *t, nh_admin_call_t *c, catchup_t *cu, int64_t top)
{
  size_t bytes = 0;
  int rows = 0;
  while (bytes < NH_STREAM_TICK_BYTES && rows < NH_STREAM_TICK_ROWS) {
    reading_t r = { .upto = top, .last = cu->from, .want = &cu->endpoint, .nwant = 1, .all = !cu->endpoint };
    int n = nh_admin_rd_history_follow(c, cu->from, NULL, 0, NH_STREAM_BATCH_ROWS, read_row, &r);
    if (n < 0) {
      tick_failed(t, c, &r);
      return;
    }
    cu->from = r.last;
    rows += n;
    bytes += batch_add(t, &r.set, cu->serial, -1);
    if (n < NH_STREAM_BATCH_ROWS || r.beyond || cu->from >= top) {
      cu->done = 1;
      return;
    }
  }
}

/* The rows new to the cursor, a tick's budget of them. */
static void read_changes(tick_t *t, nh_admin_call_t *c)
{
  size_t bytes = 0;
  int rows = 0;
  t->budget_spent = 1;
  while (bytes < NH_STREAM_TICK_BYTES && rows < NH_STREAM_TICK_ROWS) {
    reading_t r = { .cur = t->cur, .now = nh_time_now_ms(), .want = t->want, .nwant = t->nwant, .all = t->want_all };
    nh_idcursor_advance(t->cur, r.now);
    int64_t gaps[2 * MAX_GAPS];
    int ngaps = nh_idcursor_gaps(t->cur, gaps, MAX_GAPS);
    int n = nh_admin_rd_history_follow(c, nh_idcursor_top(t->cur), gaps, ngaps, NH_STREAM_BATCH_ROWS, read_row, &r);
    if (n < 0) {
      tick_failed(t, c, &r);
      return;
    }
    nh_idcursor_advance(t->cur, r.now);   /* the low mark over what came: the batch's id */
    rows += n;
    t->rows += r.taken;
    bytes += batch_add(t, &r.set, 0, t->cur->low);
    if (n < NH_STREAM_BATCH_ROWS) {
      t->budget_spent = 0;
      return;
    }
  }
}

/* Far behind the store under a sustained load: skip to now (counts follow). */
static void skip_if_lagging(tick_t *t, nh_admin_call_t *c)
{
  int64_t newest = nh_admin_rd_history_last_id(c);
  int64_t behind = newest - nh_idcursor_top(t->cur);
  if (newest < 0 || behind <= NH_STREAM_MAX_LAG_ROWS) return;
  t->skipped = behind;
  nh_idcursor_free(t->cur);
  nh_idcursor_init(t->cur, newest, GAP_MS);
}

/* On the pool: the tick's reads, and the frames of what they found. */
static void tick_work(uv_work_t *w)
{
  tick_t *t = w->data;
  nh_error_t err = { 0 };
  nh_admin_call_t c = { .a = t->a };
  c.pg = nh_admin_pg_take(t->a->pg, &err);
  if (!c.pg) {
    t->failed = 1;
    snprintf(t->err, sizeof t->err, "%s", err.msg);
    return;
  }
  int64_t top = nh_idcursor_top(t->cur);   /* catch-ups first: the cursor moves on after */
  for (int i = 0; i < t->ncu && !t->failed; i++) read_catchup(t, &c, &t->cu[i], top);
  if (!t->failed) read_changes(t, &c);
  if (!t->failed && t->budget_spent) skip_if_lagging(t, &c);
  if (!t->failed && t->counts_ok && (t->counts_due || t->rows > 0 || t->skipped)) {
    json_t *counts = nh_admin_endpoints_json(&c);
    if (counts) {
      t->counts = nh_admin_stream_frame("counts", counts, &t->counts_len);
    } else {
      t->counts_failed = 1;
      snprintf(t->err, sizeof t->err, "%s", c.pg_err);
    }
  }
  nh_admin_pg_give(t->a->pg, c.pg);
}

static void tick_free(tick_t *t)
{
  for (size_t i = 0; i < t->nb; i++) {
    for (size_t k = 0; k < t->b[i].n; k++) {
      free(t->b[i].v[k].endpoint);
      free(t->b[i].v[k].text);
    }
    free(t->b[i].v);
  }
  free(t->b);
  for (int i = 0; i < t->nwant; i++) free(t->want[i]);
  free(t->want);
  for (int i = 0; i < t->ncu; i++) free(t->cu[i].endpoint);
  free(t->cu);
  free(t->counts);
  free(t);
}

/* ---------------------------------------------------------------- back on the loop */

static nh_stream_client_t *client_of(struct nh_admin_stream *st, uint64_t serial)
{
  nh_queue_t *q;
  nh_queue_foreach(q, &st->clients) {
    nh_stream_client_t *cl = nh_queue_data(q, nh_stream_client_t, node);
    if (cl->serial == serial) return cl;
  }
  return NULL;
}

static int batch_for(const batch_t *b, const nh_stream_client_t *cl)
{
  return !b->only || b->only == cl->serial;
}

/* Writes a batch to the clients it is for that want its events; the id line goes on each
 * one's last. */
static void send_batch(struct nh_admin_stream *st, const batch_t *b)
{
  nh_queue_t *q;
  nh_queue_foreach(q, &st->clients) {
    nh_stream_client_t *cl = nh_queue_data(q, nh_stream_client_t, node);
    cl->last_match = SIZE_MAX;
    for (size_t i = b->n; batch_for(b, cl) && i-- > 0;)
      if (nh_admin_stream_wants(cl, b->v[i].endpoint)) {
        cl->last_match = i;
        break;
      }
  }
  char idline[40];
  int idlen = snprintf(idline, sizeof idline, "id: %lld\n", (long long)b->id);
  for (size_t i = 0; i < b->n; i++) {
    nh_queue_foreach(q, &st->clients) {
      nh_stream_client_t *cl = nh_queue_data(q, nh_stream_client_t, node);
      if (cl->last_match == SIZE_MAX || i > cl->last_match || !nh_admin_stream_wants(cl, b->v[i].endpoint)) continue;
      if (i == cl->last_match && b->id > cl->id_sent && cl->state == NH_STREAM_READY) {
        nh_admin_stream_write(cl, idline, (size_t)idlen);
        cl->id_sent = b->id;
      }
      nh_admin_stream_write(cl, b->v[i].text, b->v[i].len);
    }
  }
}

static void deliver(struct nh_admin_stream *st, tick_t *t)
{
  if (t->failed) nh_log_warn("admin", "stream: cannot read the history: %s", t->err);
  for (size_t i = 0; i < t->nb; i++)
    if (t->b[i].only) send_batch(st, &t->b[i]);
  /* caught up: its id lines start with the batches of the cursor that follow; else the
   * next tick goes on where this one stopped */
  for (int i = 0; i < t->ncu; i++) {
    nh_stream_client_t *cl = client_of(st, t->cu[i].serial);
    if (!cl) continue;
    cl->state = t->cu[i].done ? NH_STREAM_READY : NH_STREAM_PENDING;
    cl->from = t->cu[i].from;
  }
  for (size_t i = 0; i < t->nb; i++)
    if (!t->b[i].only) send_batch(st, &t->b[i]);
  if (t->rows > 0 || t->skipped) st->counts_due = 1;
  if (t->skipped)
    nh_log_debug("admin", "stream: %lld history rows behind; skipping to the newest", (long long)t->skipped);
  if (t->counts_failed) nh_log_warn("admin", "stream: cannot read the endpoint counts: %s", t->err);
  if (t->counts) {
    st->counts_due = 0;
    st->counts_at = t->at;
    nh_admin_stream_broadcast(st, NULL, t->counts, t->counts_len);
  }
}

static void tick_after(uv_work_t *w, int status)
{
  tick_t *t = w->data;
  struct nh_admin_stream *st = t->st;
  nh_admin_t *a = t->a;
  (void)status;   /* never cancelled */
  st->pg->busy = 0;
  if (st->a) deliver(st, t);
  else nh_admin_stream_free(st);   /* the listener closed meanwhile: freed with its timer's close */
  tick_free(t);
  nh_admin_pg_release(a);
}

/* ---------------------------------------------------------------- sending a tick out */

/* The cursor starts at the first client that came: after its Last-Event-ID, or after the
 * newest id it read with the ids below taken as they were (they are in its counts). */
static void start_cursor(struct nh_stream_pg *pg, nh_stream_client_t *cl, int64_t now)
{
  if (cl->nseeds < 0) {
    nh_idcursor_init(&pg->cur, cl->from, GAP_MS);
  } else {
    nh_idcursor_init(&pg->cur, cl->from > SEED_BACK ? cl->from - SEED_BACK : 0, GAP_MS);
    for (int i = 0; i < cl->nseeds; i++) nh_idcursor_take(&pg->cur, cl->seeds[i], now);
    nh_idcursor_advance(&pg->cur, now);
  }
  pg->started = 1;
  cl->state = NH_STREAM_READY;
}

/* Who came since the last tick: the cursor's start, or a catch-up each. */
static void take_pending(struct nh_admin_stream *st, tick_t *t)
{
  struct nh_stream_pg *pg = st->pg;
  int64_t now = nh_time_now_ms();
  nh_queue_t *q;
  nh_queue_foreach(q, &st->clients) {
    nh_stream_client_t *cl = nh_queue_data(q, nh_stream_client_t, node);
    if (cl->state != NH_STREAM_PENDING) continue;
    if (!pg->started) start_cursor(pg, cl, now);
    else if (cl->from >= nh_idcursor_top(&pg->cur)) cl->state = NH_STREAM_READY;   /* the cursor brings it all */
    else {
      t->cu = nh_xrealloc(t->cu, (size_t)(t->ncu + 1) * sizeof *t->cu);
      t->cu[t->ncu++] = (catchup_t){ cl->serial, nh_xstrdup(cl->endpoint), cl->from, 0 };
      cl->state = NH_STREAM_CATCHING;
    }
    free(cl->seeds);
    cl->seeds = NULL;
    cl->nseeds = -1;
  }
}

/* The endpoints the clients filter on (each once), or all. */
static void take_wants(struct nh_admin_stream *st, tick_t *t)
{
  nh_queue_t *q;
  nh_queue_foreach(q, &st->clients) {
    nh_stream_client_t *cl = nh_queue_data(q, nh_stream_client_t, node);
    if (!cl->endpoint) t->want_all = 1;
    int have = t->want_all;
    for (int i = 0; i < t->nwant && !have; i++) have = strcmp(t->want[i], cl->endpoint) == 0;
    if (have) continue;
    t->want = nh_xrealloc(t->want, (size_t)(t->nwant + 1) * sizeof *t->want);
    t->want[t->nwant++] = nh_xstrdup(cl->endpoint);
  }
}

void nh_admin_stream_pg_tick(struct nh_admin_stream *st)
{
  struct nh_stream_pg *pg = st->pg;
  if (pg->busy) return;   /* the last tick's reads are still out: this one is skipped */
  if (pg->restart) {
    nh_idcursor_free(&pg->cur);
    pg->started = pg->restart = 0;
  }
  tick_t *t = nh_xcalloc(1, sizeof *t);
  t->st = st;
  t->a = st->a;
  t->cur = &pg->cur;
  t->at = uv_now(st->a->loop);
  take_pending(st, t);
  if (!pg->started) {   /* nobody to start it at (cannot be: the list is not empty while ticking) */
    tick_free(t);
    return;
  }
  take_wants(st, t);
  t->counts_due = st->counts_due;
  t->counts_ok = t->at - st->counts_at >= NH_STREAM_COUNTS_MS;
  t->w.data = t;
  pg->busy = 1;
  nh_admin_pg_hold(st->a->pg);
  if (uv_queue_work(st->a->loop, &t->w, tick_work, tick_after)) {   /* never fails for a valid loop */
    pg->busy = 0;
    nh_admin_pg_release(st->a);
    tick_free(t);
  }
}

void nh_admin_stream_pg_emptied(struct nh_admin_stream *st)
{
  st->pg->restart = 1;
}

int nh_admin_stream_pg_busy(const struct nh_admin_stream *st)
{
  return st->pg->busy;
}

void nh_admin_stream_pg_free(struct nh_stream_pg *pg)
{
  if (!pg) return;
  nh_idcursor_free(&pg->cur);
  free(pg);
}

/* ---------------------------------------------------------------- opening a stream */

typedef struct opening {
  int seed;              /* the stream has no client: its cursor will start at this one */
  int64_t resume;        /* Last-Event-ID, -1 */
  int64_t now_id;        /* the newest history id, read before the counts */
  int64_t *seeds;        /* the ids up to it, SEED_BACK back (seed) */
  int nseeds, cap;
  json_t *counts;
} opening_t;

/* Last-Event-ID when it is ours to resume from (not past the newest, nor too far back). */
static int resumes(const opening_t *o)
{
  return o->resume >= 0 && o->resume <= o->now_id && o->now_id - o->resume <= NH_STREAM_MAX_LAG_ROWS;
}

static void seed_row(void *data, int64_t id, const nh_audit_t *a)
{
  opening_t *o = data;
  (void)a;
  if (id > o->now_id) return;   /* came after: the cursor sends it */
  if (o->nseeds == o->cap) {
    o->cap = o->cap ? o->cap * 2 : 256;
    o->seeds = nh_xrealloc(o->seeds, (size_t)o->cap * sizeof *o->seeds);
  }
  o->seeds[o->nseeds++] = id;
}

/* On the pool: what can fail is read before the stream starts, while an error can still be
 * an answer (captured: nh_admin_pg.c sends it). */
static void open_reads(nh_admin_call_t *c, void *ud)
{
  opening_t *o = ud;
  const char *endpoint = nh_admin_param(c, "endpoint");
  if (endpoint && nh_admin_stream_refuse_endpoint(c, endpoint)) return;
  /* the newest id before the counts: what commits after it reaches the client as status */
  o->now_id = nh_admin_rd_history_last_id(c);
  if (o->now_id < 0) {
    nh_admin_store_error(c);
    return;
  }
  if (o->seed && !resumes(o)) {
    int64_t from = o->now_id > SEED_BACK ? o->now_id - SEED_BACK : 0;
    if (nh_admin_rd_history_follow(c, from, NULL, 0, SEED_BACK, seed_row, o) < 0) {
      nh_admin_store_error(c);
      return;
    }
  } else {
    o->nseeds = -1;
  }
  o->counts = nh_admin_endpoints_json(c);
  if (!o->counts) nh_admin_store_error(c);
}

static void open_then(nh_admin_call_t *c, void *ud, int go)
{
  opening_t *o = ud;
  nh_stream_client_t *cl = NULL;
  if (go) {
    struct nh_admin_stream *st = nh_admin_stream_of(c->a);
    if (!st->pg) st->pg = nh_xcalloc(1, sizeof *st->pg);
    cl = nh_admin_stream_client_open(c, st, nh_admin_param(c, "endpoint"), o->counts);
    o->counts = NULL;   /* taken */
  }
  if (cl) {
    cl->serial = ++cl->st->pg->serials;
    cl->state = NH_STREAM_PENDING;
    cl->from = resumes(o) ? o->resume : o->now_id;
    cl->seeds = o->seeds;
    cl->nseeds = o->nseeds;
    o->seeds = NULL;
    if (cl->st->nclients == 1) nh_admin_stream_start_timer(cl->st);
  }
  json_decref(o->counts);
  free(o->seeds);
  free(o);
}

void nh_admin_stream_pg_open(nh_admin_call_t *c, int64_t resume)
{
  opening_t *o = nh_xcalloc(1, sizeof *o);
  o->seed = !c->a->stream || c->a->stream->nclients == 0;
  o->resume = resume;
  nh_admin_pg_defer_then(c, open_reads, open_then, o);
}
