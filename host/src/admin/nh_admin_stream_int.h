/* Inside the live stream, GET /api/v1/stream (docs/admin-api.md): what its two pollers share.
 * nh_admin_stream.c has the clients, the frames and the sqlite poller, which reads the store
 * on the loop; nh_admin_stream_pg.c the PostgreSQL poller, which reads on libuv's thread pool
 * and writes what it read to the clients from the loop. */
#ifndef NH_ADMIN_STREAM_INT_H
#define NH_ADMIN_STREAM_INT_H

#include "nh_admin_int.h"
#include "core/nh_queue.h"

#include <stdint.h>

#define NH_STREAM_TICK_MS 500
#define NH_STREAM_COUNTS_MS 2000
#define NH_STREAM_BATCH_ROWS 100         /* history rows per read */
#define NH_STREAM_TICK_BYTES (128u << 10)   /* status events per tick, about: far below a client's 1 MiB cap */
#define NH_STREAM_TICK_ROWS 5000         /* rows read per tick at most (filtered-out or gone events send nothing) */
#define NH_STREAM_MAX_LAG_ROWS 20000     /* further behind than this, the stream skips ahead */

struct nh_stream_pg;   /* the PostgreSQL poller's state (nh_admin_stream_pg.c) */

typedef enum {
  NH_STREAM_READY,     /* has everything the poller sent since it came: an id line tells it so */
  NH_STREAM_PENDING,   /* came on PostgreSQL: the next tick starts the cursor at it or catches it up */
  NH_STREAM_CATCHING   /* its catch-up is out in the tick's work */
} nh_stream_state_t;

typedef struct nh_stream_client {
  nh_queue_t node;                 /* st->clients */
  struct nh_admin_stream *st;
  nh_httpd_stream_t *hs;
  char *endpoint;                  /* ?endpoint=: only this endpoint's status events; NULL: all */
  size_t last_match;               /* scratch of one batch: its last matching event */
  /* PostgreSQL only (nh_admin_stream_pg.c) */
  uint64_t serial;                 /* names it to the pool's work, which must not hold a pointer */
  nh_stream_state_t state;
  int64_t from;                    /* history read for it after this id (its catch-up, or the cursor's start) */
  int64_t *seeds;                  /* ids there when it came (the cursor's start: not sent again) */
  int nseeds;
  int64_t id_sent;                 /* the last id line it got: they only grow */
} nh_stream_client_t;

struct nh_admin_stream {
  nh_admin_t *a;                   /* NULL once the listener closed */
  uv_timer_t timer;
  nh_queue_t clients;
  int nclients;
  int64_t last_id;                 /* sqlite: history rows up to this one are sent */
  uint64_t counts_at, keepalive_at;   /* loop time of the last counts event, keep-alive */
  int counts_due;                  /* rows came since the last counts event */
  int timer_closed;                /* the timer's close ran: its memory may go */
  struct nh_stream_pg *pg;         /* NULL on sqlite */
};

/* ---- frames and clients (nh_admin_stream.c), on the loop but for the frame */

/* "event: NAME\ndata: JSON\n\n" (takes body); NULL when it cannot be encoded. Safe on the pool. */
char *nh_admin_stream_frame(const char *event, json_t *body, size_t *len);
int nh_admin_stream_wants(const nh_stream_client_t *cl, const char *endpoint);
void nh_admin_stream_write(nh_stream_client_t *cl, const char *s, size_t len);
/* Writes `frame` to `only`, or to every client when NULL. */
void nh_admin_stream_broadcast(struct nh_admin_stream *st, nh_stream_client_t *only, const char *frame, size_t len);
/* Frees the state once its timer has closed and no work of the pool holds it. */
void nh_admin_stream_free(struct nh_admin_stream *st);

/* ---- the events a batch of history rows touched, one entry each (safe on the pool) */
typedef struct nh_stream_touched {
  char *endpoint, *event_id;
  size_t seq;                      /* order of its last history row in the batch */
  json_t *view;                    /* PostgreSQL: the event as the row read it (NULL on sqlite) */
} nh_stream_touched_t;

typedef struct nh_stream_touched_set {
  nh_stream_touched_t *v;
  size_t n, cap;
} nh_stream_touched_set_t;

void nh_admin_stream_touched_add(nh_stream_touched_set_t *t, const char *endpoint, const char *event_id, json_t *view);
/* One entry per event, its last, in the order of each one's latest row. */
void nh_admin_stream_touched_dedupe(nh_stream_touched_set_t *t);
void nh_admin_stream_touched_clear(nh_stream_touched_set_t *t);

/* ---- the PostgreSQL poller (nh_admin_stream_pg.c) */

/* GET /api/v1/stream on PostgreSQL, its parameters checked: the reads on the pool, then the
 * stream opens from the loop. resume: the Last-Event-ID, -1 when none. */
void nh_admin_stream_pg_open(nh_admin_call_t *c, int64_t resume);
/* A tick of the timer: sends the work out unless the last is still out. */
void nh_admin_stream_pg_tick(struct nh_admin_stream *st);
/* The last client left: the next first one starts the cursor anew, as on sqlite. */
void nh_admin_stream_pg_emptied(struct nh_admin_stream *st);
/* 1 while a tick's work is out (it frees the state when the listener closed meanwhile). */
int nh_admin_stream_pg_busy(const struct nh_admin_stream *st);
void nh_admin_stream_pg_free(struct nh_stream_pg *pg);

/* ---- shared by both openings */
/* An endpoint with events, or one a live host serves. 1 with the answer given when neither. */
int nh_admin_stream_refuse_endpoint(nh_admin_call_t *c, const char *endpoint);
/* The listener's stream state, made with its first client. */
struct nh_admin_stream *nh_admin_stream_of(nh_admin_t *a);
/* Opens the stream on c->r and sends its head (the retry delay, the counts: taken); NULL
 * when the connection is gone. The client is in the list. */
nh_stream_client_t *nh_admin_stream_client_open(nh_admin_call_t *c, struct nh_admin_stream *st, const char *endpoint,
                                                json_t *counts);
/* The timer, for a stream's first client. */
void nh_admin_stream_start_timer(struct nh_admin_stream *st);

#endif
