/* nh-uow-pg-bench: what a pump's store work costs through the unit of work
 * (host/src/store/nh_uow.h), on sqlite and on PostgreSQL, before a host runs on PostgreSQL
 * (docs/store-backends.md). The happy path of an event, in pumps of --batch events: read
 * the session's state, then record the outcome (audit row, history row; a session with a
 * row is freed, one without is left alone, as the state machine does).
 * On sqlite the pump reads and writes at once inside one transaction; on PostgreSQL the
 * first pass misses every session, one batch reads them, the second pass writes, and one
 * more batch commits: two round trips per pump, the loop free meanwhile. A transport's own
 * statements (the queue row's delete) are left out on both.
 *
 *   nh-uow-pg-bench --store postgresql://... | --store /path/x.db [--events N] [--sessions S] [--batch B]
 *
 * Prints one JSON line: store, events, batch, seconds, events_per_s, pumps, round_trips
 * (PostgreSQL: batches on the link), passes. */
#include "core/nh_util.h"
#include "store/nh_pg.h"
#include "store/nh_pg_link.h"
#include "store/nh_store.h"
#include "store/nh_uow.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

typedef struct bench {
  uv_loop_t loop;
  nh_pg_link_t *link;
  int ready, closed, done, ok;
  nh_uow_outcome_t outcome;
  char why[512];
} bench_t;

static void die(const char *what, const char *why)
{
  fprintf(stderr, "nh-uow-pg-bench: %s: %s\n", what, why);
  exit(1);
}

static void on_state(void *data, nh_pg_link_state_t st, const nh_error_t *err)
{
  bench_t *b = data;
  if (st == NH_PG_LINK_READY) {
    b->ready = 1;
    uv_stop(&b->loop);
  }
  if (st == NH_PG_LINK_FAILED || (st == NH_PG_LINK_LOST && !b->ready)) die("store", err ? err->msg : "link lost");
}

static void on_closed(void *data)
{
  bench_t *b = data;
  b->closed = 1;
  uv_stop(&b->loop);
}

static void on_fill(void *data, int ok, const nh_error_t *err)
{
  bench_t *b = data;
  b->ok = ok;
  if (!ok) snprintf(b->why, sizeof b->why, "%s", err ? err->msg : "?");
  b->done = 1;
  uv_stop(&b->loop);
}

static void on_commit(void *data, nh_uow_outcome_t outcome, const nh_error_t *err)
{
  bench_t *b = data;
  b->outcome = outcome;
  if (outcome != NH_UOW_COMMITTED) snprintf(b->why, sizeof b->why, "%s", err ? err->msg : "?");
  b->done = 1;
  uv_stop(&b->loop);
}

/* A result can come from a timer's callback (the link sends a batch from one and may read
 * its whole answer at once): uv_stop, not UV_RUN_ONCE, ends the wait, since a loop turn
 * that ran timers first would still block in its poll. */
static void wait_done(bench_t *b)
{
  while (!b->done) uv_run(&b->loop, UV_RUN_DEFAULT);
  b->done = 0;
}

/* One event's store work in a pass: its session's state read, its outcome recorded. */
static void event(nh_uow_t *u, int i, int sessions)
{
  char session[32], id[32];
  snprintf(session, sizeof session, "s%d", i % sessions);
  snprintf(id, sizeof id, "e%d", i);
  nh_session_state_t st;
  if (nh_uow_session_get(u, "Bench", session, &st)) die("session get", "failed");
  int had_row = st.exists;
  nh_session_state_clear(&st);
  nh_audit_t a = { .endpoint = "Bench", .event_id = id, .session_id = session, .event_type = "Thing",
                   .status = NH_ST_COMPLETED, .message_id = id, .payload = "{\"n\":1}", .payload_len = 7,
                   .queue_time_ms = -1, .processing_time_ms = 1 };
  nh_session_state_t free_st = { .next_park_seq = 1 };
  /* a free session with no row is left alone, as the state machine leaves it (nh_outcome.c) */
  if (nh_uow_audit_put(u, &a) ||
      nh_uow_history_add(u, "Bench", id, id, "EventRequest", NH_ST_COMPLETED, "handled", NULL) ||
      (had_row && nh_uow_session_put(u, "Bench", session, &free_st)))
    die("write", "failed");
}

int main(int argc, char **argv)
{
  const char *store = NULL;
  int events = 20000, sessions = 1000, batch = 256;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--store") == 0) store = argv[i + 1];
    else if (strcmp(argv[i], "--events") == 0) events = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--sessions") == 0) sessions = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--batch") == 0) batch = atoi(argv[i + 1]);
    else die(argv[i], "unknown option (--store, --events, --sessions, --batch)");
  }
  if (!store || events <= 0 || sessions <= 0 || batch <= 0) die("usage", "--store URL-or-path [--events N] ...");

  bench_t b = { 0 };
  uv_loop_init(&b.loop);
  nh_error_t err = { 0 };
  nh_store_t *lite = NULL;
  nh_uow_t *u;
  int pg = nh_pg_url_is(store);
  if (pg) {
    PGconn *c = NULL;
    if (nh_pg_connect(store, &c, &err) || nh_pg_migrate(c, NULL, NULL, &err)) die("store", err.msg);
    PQfinish(c);
    nh_pg_link_opts_t o = { .on_state = on_state, .data = &b };
    if (nh_pg_link_open(&b.loop, store, &o, &b.link, &err)) die("store", err.msg);
    while (!b.ready) uv_run(&b.loop, UV_RUN_DEFAULT);
    u = nh_uow_new_pg(b.link);
  } else {
    if (nh_store_open(&lite, store, NH_STORE_CREATE, &err)) die("store", err.msg);
    u = nh_uow_new(lite, NH_UOW_DIRECT);
  }

  int64_t t0 = nh_time_now_ms();
  int pumps = 0;
  for (int first = 0; first < events; first += batch, pumps++) {
    int last = first + batch < events ? first + batch : events;
    for (;;) {
      nh_uow_pass_begin(u);
      if (nh_uow_begin(u)) die("begin", nh_store_errmsg(lite));
      for (int i = first; i < last; i++) event(u, i, sessions);
      if (!nh_uow_missed(u)) break;
      nh_uow_rollback(u);
      if (nh_uow_fill(u, on_fill, &b, &err)) die("fill", err.msg);
      wait_done(&b);
      if (!b.ok) die("fill", b.why);
    }
    if (pg) {
      if (nh_uow_commit(u, on_commit, &b, &err)) die("commit", err.msg);
      wait_done(&b);
      if (b.outcome != NH_UOW_COMMITTED) die("commit", b.why);
    } else if (nh_store_commit(lite)) {
      die("commit", nh_store_errmsg(lite));
    }
    nh_uow_end(u);
  }
  double seconds = (double)(nh_time_now_ms() - t0) / 1000.0;

  nh_uow_stats_t us;
  nh_uow_stats(u, &us);
  nh_pg_link_stats_t ls = { 0 };
  if (pg) nh_pg_link_stats(b.link, &ls);
  printf("{\"store\":\"%s\",\"events\":%d,\"batch\":%d,\"seconds\":%.3f,\"events_per_s\":%.0f,\"pumps\":%d,"
         "\"round_trips\":%lld,\"passes\":%llu}\n",
         pg ? "postgresql" : "sqlite", events, batch, seconds, seconds > 0 ? events / seconds : 0.0, pumps,
         (long long)ls.batches, (unsigned long long)us.passes);
  nh_uow_free(u);
  if (pg) {
    nh_pg_link_close(b.link, on_closed, &b);
    while (!b.closed) uv_run(&b.loop, UV_RUN_DEFAULT);
  } else {
    nh_store_close(lite);
  }
  uv_run(&b.loop, UV_RUN_DEFAULT);
  uv_loop_close(&b.loop);
  return 0;
}
