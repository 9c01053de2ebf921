/* The operator API's routes on a PostgreSQL store, reads and actions (nh_admin_int.h). On
 * sqlite a route reads the local file on the loop, between pumps. A PostgreSQL read is a
 * network round trip, and the loop never waits for one: the route runs on libuv's thread
 * pool instead, on a blocking connection of its own (a few are kept for the next
 * requests), and its answer is captured there and sent from the loop once the work is
 * done. The request stays
 * suspended meanwhile (net/nh_httpd.c); if the client or the listener goes away, the
 * answer frees it.
 *
 * A route that runs here reads through nh_admin_store.c, which takes c->pg when it is set,
 * queues requests with the CLI's PostgreSQL code, and touches nothing of the listener but
 * its options and the bulk rate table (locked): no cache (they are the loop's), no stream,
 * no queue, no header but the copy taken on the loop. The live stream reads here too, in
 * two halves (nh_admin_pg_defer_then: its reads, then the stream opened from the loop), and
 * its poller takes a connection of the same pool for each tick (nh_admin_stream_pg.c). */
#include "nh_admin_int.h"
#include "core/nh_log.h"
#include "core/nh_util.h"
#include "store/nh_pg.h"
#include "store/nh_pg_link.h"
#include "store/nh_pg_ops.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define NH_ADMIN_PG_IDLE 4         /* connections kept for the next requests */
#define NH_ADMIN_PG_READ_MS 30000   /* what a route's statements may take (a bulk run's each) */

struct nh_admin_pg {
  char *url;
  pthread_mutex_t lock;
  nh_pg_db_t *idle[NH_ADMIN_PG_IDLE];
  int nidle;
  int jobs;                  /* routes out on the pool: the listener is freed after the last */
  int closed;                /* nh_admin_close ran: free at the last job's end */
};

typedef struct job {
  uv_work_t w;
  nh_admin_t *a;
  nh_admin_call_t c;         /* owns its parameters and captures (taken from the caller) */
  nh_admin_route_fn fn;
  nh_admin_pg_fn fn_ud;      /* or this, with ud (nh_admin_pg_defer_then) */
  nh_admin_pg_then_fn then;  /* on the loop when it answered nothing */
  void *ud;
  nh_admin_answer_t out;
  char **hdr;                /* the request's headers, name and value pairs, read on the loop */
  int nhdr;
} job_t;

/* Set while a route runs on the pool: nh_admin_answer keeps the answer there, and
 * nh_admin_header reads the job's copy of the headers (the connection is the loop's). */
static _Thread_local nh_admin_answer_t *capturing;
static _Thread_local const job_t *running;

nh_admin_answer_t *nh_admin_capturing(void) { return capturing; }

static void keep_header(void *ud, const char *key, size_t klen, const char *val, size_t vlen)
{
  job_t *j = ud;
  j->hdr = nh_xrealloc(j->hdr, sizeof *j->hdr * (size_t)(j->nhdr + 2));
  j->hdr[j->nhdr++] = nh_xstrndup(key, klen);
  j->hdr[j->nhdr++] = nh_xstrndup(val ? val : "", val ? vlen : 0);
}

char *nh_admin_pg_header(const char *name)
{
  for (int i = 0; running && i + 1 < running->nhdr; i += 2)
    if (strcasecmp(running->hdr[i], name) == 0) return nh_xstrdup(running->hdr[i + 1]);
  return NULL;
}

static void job_free(job_t *j)
{
  nh_admin_call_clear(&j->c);
  for (int i = 0; i < j->nhdr; i++) free(j->hdr[i]);
  free(j->hdr);
  free(j);
}

nh_admin_pg_t *nh_admin_pg_new(const char *url)
{
  nh_admin_pg_t *p = nh_xcalloc(1, sizeof *p);
  p->url = nh_xstrdup(url);
  pthread_mutex_init(&p->lock, NULL);
  return p;
}

static void pg_free(nh_admin_pg_t *p)
{
  for (int i = 0; i < p->nidle; i++) nh_pg_db_free(p->idle[i]);
  pthread_mutex_destroy(&p->lock);
  free(p->url);
  free(p);
}

nh_pg_db_t *nh_admin_pg_take(nh_admin_pg_t *p, nh_error_t *err)
{
  nh_pg_db_t *db = NULL;
  pthread_mutex_lock(&p->lock);
  if (p->nidle > 0) db = p->idle[--p->nidle];
  pthread_mutex_unlock(&p->lock);
  if (db) return db;
  /* the link's guards (nh_pg_link.h): a server that hangs or vanishes ends the read in
   * about 30 s, not after TCP's minutes, so it cannot hold a thread of the pool for long */
  char extra[512];
  PGconn *conn = NULL;
  if (nh_pg_connect_with(p->url, nh_pg_link_conninfo(NH_ADMIN_PG_READ_MS, extra, sizeof extra), &conn, err))
    return NULL;
  return nh_pg_db_new(conn);
}

void nh_admin_pg_give(nh_admin_pg_t *p, nh_pg_db_t *db)
{
  int kept = 0;
  if (PQstatus(nh_pg_db_conn(db)) == CONNECTION_OK && PQtransactionStatus(nh_pg_db_conn(db)) == PQTRANS_IDLE) {
    pthread_mutex_lock(&p->lock);
    if (p->nidle < NH_ADMIN_PG_IDLE) {
      p->idle[p->nidle++] = db;
      kept = 1;
    }
    pthread_mutex_unlock(&p->lock);
  }
  if (!kept) nh_pg_db_free(db);
}

static void work(uv_work_t *w)
{
  job_t *j = w->data;
  nh_admin_pg_t *p = j->a->pg;
  nh_error_t err = {0};
  nh_pg_db_t *db = nh_admin_pg_take(p, &err);
  if (!db) {
    j->out.status = 503;
    j->out.body = json_pack("{s:s}", "error", err.msg);   /* the URL in it is shown masked */
    return;
  }
  j->c.pg = db;
  capturing = &j->out;
  running = j;
  if (j->fn) j->fn(&j->c);
  else j->fn_ud(&j->c, j->ud);
  running = NULL;
  capturing = NULL;
  j->c.pg = NULL;
  nh_admin_pg_give(p, db);
}

void nh_admin_pg_hold(nh_admin_pg_t *p) { p->jobs++; }

void nh_admin_pg_release(nh_admin_t *a)
{
  nh_admin_pg_t *p = a->pg;
  if (--p->jobs == 0 && p->closed) {
    pg_free(p);
    free(a);
  }
}

/* The second half of a route in two: it opens a stream (or answers) from the loop unless
 * the first answered or the listener closed meanwhile; ud is its to free either way. */
static int then_continue(job_t *j)
{
  int go = !j->out.status && !j->a->pg->closed;
  if (go) {
    j->then(&j->c, j->ud, 1);
    return 1;
  }
  if (!j->out.status) {   /* closed: the request is only freed */
    j->out.status = 503;
    j->out.body = json_pack("{s:s}", "error", "the listener is closing");
  }
  j->then(&j->c, j->ud, 0);
  return 0;
}

static void after(uv_work_t *w, int status)
{
  job_t *j = w->data;
  (void)status;   /* never cancelled: uv_cancel is not called on these */
  if (j->then && then_continue(j)) {
    nh_admin_t *a = j->a;
    job_free(j);
    nh_admin_pg_release(a);
    return;
  }
  if (!j->out.status) {   /* a route that answered nothing is a bug: say so rather than hang */
    j->out.status = 500;
    json_decref(j->out.body);
    j->out.body = json_pack("{s:s}", "error", "internal error: the route gave no answer");
  }
  /* frees the request if it was orphaned */
  nh_admin_answer_retry(j->c.r, j->out.status, j->out.body, j->out.retry_after);
  nh_admin_t *a = j->a;
  job_free(j);
  nh_admin_pg_release(a);
}

static void queue_job(nh_admin_call_t *c, job_t *j)
{
  j->a = c->a;
  j->c = *c;
  j->w.data = j;
  memset(&c->q, 0, sizeof c->q);   /* the job owns them now */
  memset(c->cap, 0, sizeof c->cap);
  nh_httpd_req_headers(c->r, keep_header, j);
  c->a->pg->jobs++;
  if (uv_queue_work(c->a->loop, &j->w, work, after)) {   /* never fails for a valid loop */
    c->a->pg->jobs--;
    nh_admin_error(c->r, 500, NULL, "cannot queue the read");
    if (j->then) j->then(&j->c, j->ud, 0);
    job_free(j);
  }
}

void nh_admin_pg_defer(nh_admin_call_t *c, nh_admin_route_fn fn)
{
  job_t *j = nh_xcalloc(1, sizeof *j);
  j->fn = fn;
  queue_job(c, j);
}

void nh_admin_pg_defer_then(nh_admin_call_t *c, nh_admin_pg_fn fn, nh_admin_pg_then_fn then, void *ud)
{
  job_t *j = nh_xcalloc(1, sizeof *j);
  j->fn_ud = fn;
  j->then = then;
  j->ud = ud;
  queue_job(c, j);
}

int nh_admin_pg_close(nh_admin_pg_t *p)
{
  if (!p) return 0;
  if (p->jobs > 0) {   /* the last job's end frees it, and the listener */
    p->closed = 1;
    return 1;
  }
  pg_free(p);
  return 0;
}
