/* The unit of work over PostgreSQL (store/nh_uow_pg.c) against the test cluster, on a
 * real uv loop and the store's link:
 * - parity: one pass of the state machine's reads and writes (sessions, audit rows and
 *   their retext, history, inbox, operator requests, parks, deletes by seq and by event,
 *   a savepoint rolled back) runs on a sqlite store, directly, and on PostgreSQL through
 *   the cache; every answer the pass read, and the stores after the commit, are the same;
 * - a pass reads its own writes, and a parked head read after the pass deleted a whole
 *   window of rows is the first row of the next window (its own key, filled);
 * - round trips: every key a pass missed is read by one batch, every write goes with one
 *   commit batch;
 * - a commit that fails writes nothing, and the unit can run the pass again;
 * - freeing the unit while its batch is out waits for the batch, and calls nothing.
 *
 * NH_PG_URL names the test cluster (the ctest fixture "postgres") and NH_PG_ADMIN_URL a
 * superuser, through which each test makes its own database (nh_pgtest.h). Without
 * either the suite reports itself skipped (77), except under CI=true. */
#include "nh_test.h"
#include "nh_test_sql.h"
#include "nh_pgtest.h"

#include "core/nh_util.h"
#include "store/nh_pg.h"
#include "store/nh_pg_link.h"
#include "store/nh_pg_ops.h"
#include "store/nh_pg_queue.h"
#include "store/nh_store.h"
#include "store/nh_uow.h"

#include <stdarg.h>
#include <uv.h>

#define DEADLINE_MS 20000

typedef struct fx {
  uv_loop_t loop;
  uv_timer_t deadline;
  int expired;
  char url[1024];
  nh_pg_link_t *link;
  int ready, closed;
  nh_pg_db_t *db;          /* blocking, for seeding and looking */
  nh_store_t *lite;        /* the sqlite twin */
  int done;                /* the last fill or commit is over */
  int ok;
  nh_uow_outcome_t outcome;
  char why[512];
} fx_t;

/* ---------------------------------------------------------------- the loop */

static void on_deadline(uv_timer_t *t)
{
  ((fx_t *)t->data)->expired = 1;
  uv_stop(t->loop);
}

/* Runs the loop until *flag. The callbacks that set it also uv_stop the loop: the link
 * may finish a batch inside a timer's callback (it sends from one, and a short answer can
 * be read at once), and a UV_RUN_ONCE turn that ran timers first still blocks in its poll. */
static int loop_until(fx_t *fx, const int *flag)
{
  fx->expired = 0;
  uv_timer_start(&fx->deadline, on_deadline, DEADLINE_MS, 0);
  while (!*flag && !fx->expired) uv_run(&fx->loop, UV_RUN_DEFAULT);
  uv_timer_stop(&fx->deadline);
  return *flag;
}

static void run_until_at(fx_t *fx, const int *flag, const char *what, const char *file, int line)
{
  if (!loop_until(fx, flag)) nh_test_fail(file, line, "no %s within %d ms", what, DEADLINE_MS);
}
#define RUN_UNTIL(fx, flag, what) run_until_at(fx, flag, what, __FILE__, __LINE__)

static void on_state(void *data, nh_pg_link_state_t st, const nh_error_t *err)
{
  (void)err;
  fx_t *fx = data;
  if (st == NH_PG_LINK_READY) {
    fx->ready = 1;
    uv_stop(&fx->loop);
  }
}

static void on_closed(void *data)
{
  fx_t *fx = data;
  fx->closed = 1;
  uv_stop(&fx->loop);
}

static void fx_free(void *p)
{
  fx_t *fx = p;
  if (fx->link && !fx->closed) {
    nh_pg_link_close(fx->link, on_closed, fx);
    loop_until(fx, &fx->closed);
  }
  uv_close((uv_handle_t *)&fx->deadline, NULL);
  uv_run(&fx->loop, UV_RUN_DEFAULT);
  if (uv_loop_close(&fx->loop) != 0) fprintf(stderr, "test_uow_pg: the loop still had handles\n");
  if (fx->db) nh_pg_db_free(fx->db);
  if (fx->lite) nh_store_close(fx->lite);
  free(fx);
}

/* A scratch database with the store migrated, the link on it (ready), a blocking
 * connection beside it, and a fresh sqlite store. */
static fx_t *fx_new(void)
{
  fx_t *fx = nh_xcalloc(1, sizeof *fx);
  uv_loop_init(&fx->loop);
  uv_timer_init(&fx->loop, &fx->deadline);
  fx->deadline.data = fx;
  nh_test_on_cleanup(fx_free, fx);
  snprintf(fx->url, sizeof fx->url, "%s", nh_pgtest_url("dbname", nh_pgtest_scratch_db(), NULL));
  PGconn *c = NULL;
  nh_error_t err = { 0 };
  if (nh_pg_connect(fx->url, &c, &err)) FAIL("%s", err.msg);
  if (nh_pg_migrate(c, NULL, NULL, &err)) {
    PQfinish(c);
    FAIL("migrate: %s", err.msg);
  }
  fx->db = nh_pg_db_new(c);
  nh_pg_link_opts_t o = { .on_state = on_state, .data = fx };
  if (nh_pg_link_open(&fx->loop, fx->url, &o, &fx->link, &err)) FAIL("link: %s", err.msg);
  RUN_UNTIL(fx, &fx->ready, "ready link");
  if (nh_store_open(&fx->lite, nh_test_path("twin.db"), NH_STORE_CREATE, &err)) FAIL("sqlite: %s", err.msg);
  return fx;
}

/* ---------------------------------------------------------------- fill and commit */

static void on_fill(void *data, int ok, const nh_error_t *err)
{
  fx_t *fx = data;
  fx->ok = ok;
  snprintf(fx->why, sizeof fx->why, "%s", err ? err->msg : "");
  fx->done = 1;
  uv_stop(&fx->loop);   /* it may come from a timer's callback: see run_until_at */
}

static void on_commit(void *data, nh_uow_outcome_t outcome, const nh_error_t *err)
{
  fx_t *fx = data;
  fx->outcome = outcome;
  snprintf(fx->why, sizeof fx->why, "%s", err ? err->msg : "");
  fx->done = 1;
  uv_stop(&fx->loop);
}

static void fill(fx_t *fx, nh_uow_t *u)
{
  nh_error_t err = { 0 };
  fx->done = 0;
  if (nh_uow_fill(u, on_fill, fx, &err)) FAIL("fill: %s", err.msg);
  ASSERT_TRUE(nh_uow_busy(u));
  RUN_UNTIL(fx, &fx->done, "fill");
  if (!fx->ok) FAIL("fill failed: %s", fx->why);
}

static nh_uow_outcome_t commit(fx_t *fx, nh_uow_t *u)
{
  nh_error_t err = { 0 };
  fx->done = 0;
  if (nh_uow_commit(u, on_commit, fx, &err)) FAIL("commit: %s", err.msg);
  RUN_UNTIL(fx, &fx->done, "commit");
  return fx->outcome;
}

/* ---------------------------------------------------------------- what a pass read */

typedef struct said {
  char text[8192];
  size_t len;
} said_t;

static void say(said_t *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(said_t *s, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(s->text + s->len, sizeof s->text - s->len, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= sizeof s->text - s->len) FAIL("the pass said more than %zu bytes", sizeof s->text);
  s->len += (size_t)n;
}

typedef void (*pass_fn)(nh_uow_t *u, said_t *said);

/* The pass on sqlite, reading and writing at once in one transaction. */
static void run_sqlite(fx_t *fx, pass_fn pass, said_t *said)
{
  nh_uow_t *u = nh_uow_new(fx->lite, NH_UOW_DIRECT);
  nh_uow_pass_begin(u);
  ASSERT_EQ_INT(nh_uow_begin(u), NH_OK);
  memset(said, 0, sizeof *said);
  pass(u, said);
  ASSERT_FALSE(nh_uow_missed(u));
  ASSERT_EQ_INT(nh_store_commit(fx->lite), NH_OK);
  nh_uow_end(u);
  nh_uow_free(u);
}

/* The pass on PostgreSQL as a pump runs it: again after each fill of what it missed,
 * until it misses nothing; then its commit. Returns the passes it took. */
static int run_pg(fx_t *fx, nh_uow_t *u, pass_fn pass, said_t *said)
{
  int passes = 0;
  for (;;) {
    ASSERT_TRUE(++passes <= NH_UOW_MAX_PASSES);
    nh_uow_pass_begin(u);
    ASSERT_EQ_INT(nh_uow_begin(u), NH_OK);
    memset(said, 0, sizeof *said);
    pass(u, said);
    if (!nh_uow_missed(u)) break;
    nh_uow_rollback(u);
    fill(fx, u);
  }
  nh_uow_outcome_t o = commit(fx, u);
  if (o != NH_UOW_COMMITTED) FAIL("commit: outcome %d: %s", (int)o, fx->why);
  nh_uow_end(u);
  return passes;
}

/* ---------------------------------------------------------------- seeding both stores alike */

static nh_msg_t parked_msg(const char *session, const char *event_id, const char *message_id)
{
  nh_msg_t m;
  memset(&m, 0, sizeof m);
  m.endpoint = "Ep";
  m.session_id = (char *)session;
  m.event_id = (char *)event_id;
  m.message_id = (char *)message_id;
  m.event_type = "Thing";
  m.type = NH_MT_EVENT;
  m.body = "{\"n\":1}\0tail";   /* a NUL inside: bodies are bytes */
  m.body_len = 12;
  m.enqueued_at = 1700000000000;
  return m;
}

/* Session s1 blocked by e1 with 20 parked rows: park_seq i holds event e<i+1>, except
 * that seq 5 holds e5 as seq 4 does (an event parked twice); e1 Failed with its history;
 * e9 Deferred behind it; inbox entry m0; an operator request req-1 on e1. */
static void seed_both(fx_t *fx)
{
  nh_session_state_t st = { .exists = 1, .blocked_by = "e1", .next_park_seq = 21 };
  nh_audit_t failed = { .endpoint = "Ep", .event_id = "e1", .session_id = "s1", .event_type = "Thing",
                        .status = NH_ST_FAILED, .error_text = "boom", .message_id = "m1",
                        .payload = "{}", .payload_len = 2 };
  nh_audit_t deferred = { .endpoint = "Ep", .event_id = "e9", .session_id = "s1", .event_type = "Thing",
                          .status = NH_ST_DEFERRED, .error_text = "behind e1", .message_id = "m9",
                          .updated_at = 2000 };
  ASSERT_EQ_INT(nh_store_begin(fx->lite), NH_OK);
  ASSERT_EQ_INT(nh_store_session_put(fx->lite, "Ep", "s1", &st), NH_OK);
  ASSERT_EQ_INT(nh_pgs_session_put(fx->db, "Ep", "s1", &st), NH_OK);
  ASSERT_EQ_INT(nh_store_audit_put(fx->lite, &failed), NH_OK);
  ASSERT_EQ_INT(nh_pgs_audit_put(fx->db, &failed), NH_OK);
  ASSERT_EQ_INT(nh_store_audit_put(fx->lite, &deferred), NH_OK);
  ASSERT_EQ_INT(nh_pgs_audit_put(fx->db, &deferred), NH_OK);
  ASSERT_EQ_INT(nh_store_history_add(fx->lite, "Ep", "e1", "m1", "EventRequest", NH_ST_FAILED, "boom"), NH_OK);
  ASSERT_EQ_INT(nh_pgs_history_add(fx->db, "Ep", "e1", "m1", "EventRequest", NH_ST_FAILED, "boom"), NH_OK);
  for (int seq = 1; seq <= 20; seq++) {
    char ev[16], msg[16];
    snprintf(ev, sizeof ev, "e%d", seq == 5 ? 5 : seq + 1);
    snprintf(msg, sizeof msg, "m%d-%d", seq + 1, seq);
    nh_msg_t m = parked_msg("s1", ev, msg);
    ASSERT_EQ_INT(nh_store_park(fx->lite, &m, seq), NH_OK);
    ASSERT_EQ_INT(nh_pgs_park(fx->db, &m, seq), NH_OK);
  }
  ASSERT_EQ_INT(nh_store_inbox_add(fx->lite, "Ep", "m0"), NH_OK);
  ASSERT_EQ_INT(nh_pgs_inbox_add(fx->db, "Ep", "m0"), NH_OK);
  ASSERT_EQ_INT(nh_store_oppending_add(fx->lite, "req-1", "Ep", "e1", "resubmit", NH_ST_FAILED), NH_OK);
  ASSERT_EQ_INT(nh_pgs_oppending_add(fx->db, "req-1", "Ep", "e1", "resubmit", NH_ST_FAILED), NH_OK);
  /* due work: two retries due, one not yet, five draining sessions */
  const char *due[] = { "r1", "r2", "r3", "d1", "d2", "d3", "d4", "d5" };
  for (int i = 0; i < 8; i++) {
    nh_session_state_t ds = { .exists = 1, .next_park_seq = 1 };
    if (due[i][0] == 'r') {
      ds.blocked_by = "eR";
      ds.retry_due = i == 2 ? INT64_MAX / 2 : 1000 + i;
    } else {
      ds.draining = 1;
    }
    ASSERT_EQ_INT(nh_store_session_put(fx->lite, "Ep", due[i], &ds), NH_OK);
    ASSERT_EQ_INT(nh_pgs_session_put(fx->db, "Ep", due[i], &ds), NH_OK);
  }
  ASSERT_EQ_INT(nh_store_commit(fx->lite), NH_OK);
}

/* ---------------------------------------------------------------- the pass */

static void say_session(nh_uow_t *u, said_t *s, const char *session)
{
  nh_session_state_t st;
  ASSERT_EQ_INT(nh_uow_session_get(u, "Ep", session, &st), NH_OK);
  say(s, "session %s: exists %d blocked %s draining %d retry %lld next %lld\n", session, st.exists,
      st.blocked_by ? st.blocked_by : "-", st.draining, (long long)st.retry_due, (long long)st.next_park_seq);
  nh_session_state_clear(&st);
}

static int64_t e1_created;   /* e1's creation time as the pass first read it */

static void say_audit(nh_uow_t *u, said_t *s, const char *event_id)
{
  nh_audit_t a;
  if (nh_uow_audit_get(u, "Ep", event_id, &a) != 1) {
    say(s, "audit %s: none\n", event_id);
    return;
  }
  say(s, "audit %s: %s/%s session %s text %s msg %s retries %d payload %zu created %s\n", a.event_id, a.status,
      a.sub_status ? a.sub_status : "-", a.session_id, a.error_text ? a.error_text : "-",
      a.message_id ? a.message_id : "-", a.retry_count, nh_audit_payload_len(&a),
      a.created_at == e1_created ? "as e1's" : "its own");
  nh_audit_clear(&a);
}

/* Reads the head and says it; deletes it when asked. Returns 0 when there is none. */
static int say_head(nh_uow_t *u, said_t *s, const char *session, int delete)
{
  nh_msg_t m;
  int64_t seq = 0;
  if (nh_uow_parked_head(u, "Ep", session, &m, &seq) != 1) {
    say(s, "head %s: none\n", session);
    return 0;
  }
  say(s, "head %s: %lld %s %s body %zu %s\n", session, (long long)seq, m.event_id, m.message_id, m.body_len,
      m.body_len == 12 && memcmp(m.body, "{\"n\":1}\0tail", 12) == 0 ? "same" : "differs");
  if (delete) ASSERT_EQ_INT(nh_uow_parked_delete(u, "Ep", session, seq), NH_OK);
  nh_msg_clear(&m);
  return 1;
}

static int say_due_one(void *data, const char *endpoint, const char *session, const nh_session_state_t *st)
{
  say(data, " %s/%s/%s/%d", endpoint, session, st->blocked_by ? st->blocked_by : "-", st->draining);
  return 0;
}

/* The due scan, round and round: retries first, then draining sessions from the cursor. */
static void say_due(nh_uow_t *u, said_t *s)
{
  char *cursor = NULL;
  const int limits[] = { 10, 3, 3, 1, 4, 6 };
  for (int i = 0; i < 6; i++) {
    say(s, "due %d:", limits[i]);
    int n = nh_uow_sessions_due(u, "Ep", nh_time_now_ms(), limits[i], &cursor, say_due_one, s);
    say(s, " = %d, cursor %s\n", n, cursor ? cursor : "-");
  }
  free(cursor);
}

/* What the state machine does, in one pass, to a blocked session and around it. */
static void the_pass(nh_uow_t *u, said_t *s)
{
  say_due(u, s);
  say_session(u, s, "s1");
  say_session(u, s, "s2");
  nh_audit_t first;
  e1_created = nh_uow_audit_get(u, "Ep", "e1", &first) == 1 ? first.created_at : -1;
  nh_audit_clear(&first);
  say_audit(u, s, "e1");
  say_audit(u, s, "e9");
  say_audit(u, s, "e404");
  say(s, "inbox m0 %d mX %d\n", nh_uow_inbox_has(u, "Ep", "m0"), nh_uow_inbox_has(u, "Ep", "mX"));
  say(s, "done m1/e1 %d m2/e2 %d\n", nh_uow_processed_has(u, "Ep", "m1", "e1"),
      nh_uow_processed_has(u, "Ep", "m2-1", "e2"));

  char *expected = NULL;
  int had = nh_uow_oppending_take(u, "req-1", &expected);
  say(s, "request req-1 %d %s\n", had, expected ? expected : "-");
  free(expected);
  had = nh_uow_oppending_take(u, "req-1", &expected);   /* taken by this pass already */
  say(s, "request req-1 again %d %s\n", had, expected ? expected : "-");
  free(expected);

  /* skip e5: both its rows go */
  say(s, "removed e5: %d\n", nh_uow_parked_delete_event(u, "Ep", "e5"));
  say(s, "removed e5 again: %d\n", nh_uow_parked_delete_event(u, "Ep", "e5"));

  /* replay 16 heads, beyond the first window of rows */
  for (int i = 0; i < 16; i++) say_head(u, s, "s1", 1);
  say(s, "any s1 %d s2 %d\n", nh_uow_parked_any(u, "Ep", "s1"), nh_uow_parked_any(u, "Ep", "s2"));

  /* new parks: counted for their event, seen as heads after the base rows */
  nh_msg_t a = parked_msg("s1", "e30", "m30");
  nh_msg_t b = parked_msg("s2", "e31", "m31");
  ASSERT_EQ_INT(nh_uow_park(u, &a, 21), NH_OK);
  ASSERT_EQ_INT(nh_uow_park(u, &a, 22), NH_OK);
  ASSERT_EQ_INT(nh_uow_park(u, &b, 1), NH_OK);
  say(s, "any s2 %d\n", nh_uow_parked_any(u, "Ep", "s2"));
  say_head(u, s, "s2", 0);
  say(s, "removed e30: %d\n", nh_uow_parked_delete_event(u, "Ep", "e30"));
  while (say_head(u, s, "s1", 0) && say_head(u, s, "s1", 1)) {}

  /* the audit: a put read back, a retext of the session's Deferred rows */
  nh_audit_t done = { .endpoint = "Ep", .event_id = "e2", .session_id = "s1", .event_type = "Thing",
                      .status = NH_ST_COMPLETED, .message_id = "m2-1", .payload = "{\"x\":\"\0\"}",
                      .payload_len = 9 };
  ASSERT_EQ_INT(nh_uow_audit_put(u, &done), NH_OK);
  say_audit(u, s, "e2");
  ASSERT_EQ_INT(nh_uow_audit_retext_deferred(u, "Ep", "s1", "behind e1, then e2"), NH_OK);
  say_audit(u, s, "e9");
  nh_audit_t again = { .endpoint = "Ep", .event_id = "e1", .session_id = "s1", .event_type = "Thing",
                       .status = NH_ST_COMPLETED, .message_id = "m1", .retry_count = 1 };
  ASSERT_EQ_INT(nh_uow_audit_put(u, &again), NH_OK);
  say_audit(u, s, "e1");

  /* history records an outcome; a request does not */
  ASSERT_EQ_INT(nh_uow_history_add(u, "Ep", "e2", "m2-1", "EventRequest", NH_ST_COMPLETED, "ok", NULL), NH_OK);
  nh_history_extra_t x = { .error_text = "e", .error_type = "T", .error_stack = "st", .previous_payload = "{}" };
  ASSERT_EQ_INT(nh_uow_history_add(u, "Ep", "e3", "m3-2", "ResubmissionRequest", "Requested", "asked", &x), NH_OK);
  say(s, "done m2/e2 %d m3/e3 %d\n", nh_uow_processed_has(u, "Ep", "m2-1", "e2"),
      nh_uow_processed_has(u, "Ep", "m3-2", "e3"));
  ASSERT_EQ_INT(nh_uow_inbox_add(u, "Ep", "m7"), NH_OK);
  say(s, "inbox m7 %d\n", nh_uow_inbox_has(u, "Ep", "m7"));

  /* a job's savepoint rolled back: what it wrote is gone, from reads and from the commit */
  nh_session_state_t free_st = { .next_park_seq = 9 };
  ASSERT_EQ_INT(nh_uow_session_put(u, "Ep", "s1", &free_st), NH_OK);
  say_session(u, s, "s1");
  ASSERT_EQ_INT(nh_uow_savepoint(u), NH_OK);
  nh_session_state_t blocked = { .exists = 1, .blocked_by = "eZ", .next_park_seq = 3 };
  ASSERT_EQ_INT(nh_uow_session_put(u, "Ep", "s2", &blocked), NH_OK);
  ASSERT_EQ_INT(nh_uow_inbox_add(u, "Ep", "m8"), NH_OK);
  say_session(u, s, "s2");
  nh_uow_savepoint_rollback(u);
  say_session(u, s, "s1");   /* what came before the savepoint stays */
  say_session(u, s, "s2");
  say(s, "inbox m8 %d\n", nh_uow_inbox_has(u, "Ep", "m8"));
  nh_session_state_t draining = { .exists = 1, .draining = 1, .next_park_seq = 2 };
  ASSERT_EQ_INT(nh_uow_session_put(u, "Ep", "s2", &draining), NH_OK);
  say_session(u, s, "s2");
}

/* The store's rows, in one string, by SQL that both dialects read alike but for the
 * aggregate. */
static const char *const dump_rows[] = {
  "session_id || '/' || COALESCE(blocked_by, '-') || '/' || draining || '/' || next_park_seq AS r FROM sessions"
  " ORDER BY session_id",
  "session_id || '/' || park_seq || '/' || event_id || '/' || message_id AS r FROM parked"
  " ORDER BY session_id, park_seq",
  "event_id || '/' || status || '/' || COALESCE(error_text, '-') || '/' || retry_count AS r FROM audit"
  " ORDER BY event_id",
  "event_id || '/' || COALESCE(message_id, '-') || '/' || status || '/' || COALESCE(error_type, '-') AS r"
  " FROM history ORDER BY event_id, status",
  "message_id AS r FROM inbox ORDER BY message_id",
  "message_id AS r FROM operator_pending ORDER BY message_id",
};

static void dump_sqlite(fx_t *fx, said_t *s)
{
  memset(s, 0, sizeof *s);
  for (size_t i = 0; i < sizeof dump_rows / sizeof *dump_rows; i++)
    say(s, "%s\n", nh_test_q1s(nh_store_db(fx->lite), "SELECT group_concat(r, ',') FROM (SELECT %s)",
                               dump_rows[i]));
}

static void dump_pg(fx_t *fx, said_t *s)
{
  memset(s, 0, sizeof *s);
  for (size_t i = 0; i < sizeof dump_rows / sizeof *dump_rows; i++)
    say(s, "%s\n", nh_pgtest_q1(nh_pg_db_conn(fx->db), "SELECT string_agg(r, ',') FROM (SELECT %s) AS t",
                                dump_rows[i]));
}

/* ---------------------------------------------------------------- tests */

TEST(a_pass_reads_and_writes_on_postgresql_as_on_sqlite)
{
  fx_t *fx = fx_new();
  seed_both(fx);
  said_t lite, pg;
  run_sqlite(fx, the_pass, &lite);
  nh_uow_t *u = nh_uow_new_pg(fx->link);
  int passes = run_pg(fx, u, the_pass, &pg);
  nh_uow_stats_t st;
  nh_uow_stats(u, &st);
  nh_uow_free(u);
  ASSERT_EQ_STR(pg.text, lite.text);
  /* the answers are the store's, not the empty ones of a miss */
  ASSERT_CONTAINS(lite.text, "session s1: exists 1 blocked e1 draining 0 retry 0 next 21\n");
  ASSERT_CONTAINS(lite.text, "due 3: Ep/r1/eR/0 Ep/r2/eR/0 Ep/d1/-/1 = 3, cursor d1\n");
  ASSERT_CONTAINS(lite.text, "due 10: Ep/r1/eR/0 Ep/r2/eR/0 Ep/d1/-/1 Ep/d2/-/1 Ep/d3/-/1 Ep/d4/-/1 Ep/d5/-/1 = 7, "
                             "cursor -\n");
  ASSERT_CONTAINS(lite.text, "due 6: Ep/r1/eR/0 Ep/r2/eR/0 Ep/d5/-/1 Ep/d1/-/1 Ep/d2/-/1 Ep/d3/-/1 = 6, cursor d3\n");
  ASSERT_CONTAINS(lite.text, "request req-1 1 Failed\nrequest req-1 again 0 -\n");
  ASSERT_CONTAINS(lite.text, "removed e5: 2\nremoved e5 again: 0\n");
  ASSERT_CONTAINS(lite.text, "head s1: 18 e19 m19-18 body 12 same\n");
  ASSERT_CONTAINS(lite.text, "removed e30: 2\n");
  ASSERT_CONTAINS(lite.text, "audit e9: Deferred/- session s1 text behind e1, then e2");
  ASSERT_CONTAINS(lite.text, "audit e1: Completed/- session s1 text - msg m1 retries 1 payload 0 created as e1's\n");

  /* the first pass misses the keys it reads first; the head after the first window
   * of rows is another key, filled by another batch */
  ASSERT_TRUE(passes >= 3);
  ASSERT_EQ_INT((int)st.fills, passes - 1);
  ASSERT_EQ_INT((int)st.restarts + 1, passes);
  ASSERT_EQ_INT((int)st.commits, 1);
  nh_pg_link_stats_t ls;
  nh_pg_link_stats(fx->link, &ls);
  ASSERT_EQ_INT((int)ls.batches, passes);   /* a fill or the commit: one batch each */

  said_t dl, dp;
  dump_sqlite(fx, &dl);
  dump_pg(fx, &dp);
  ASSERT_EQ_STR(dp.text, dl.text);
  ASSERT_CONTAINS(dl.text, "s2/-/1/2\n");   /* the savepoint's blocked s2 never reached the store */
  ASSERT_FALSE(strstr(dl.text, "m8") != NULL);
}

/* One miss per key however often a pass reads it, and one batch for all of them. */
static void hundred_sessions(nh_uow_t *u, said_t *s)
{
  int blocked = 0;
  for (int round = 0; round < 2; round++)
    for (int i = 0; i < 100; i++) {
      char session[16];
      snprintf(session, sizeof session, "s%03d", i);
      nh_session_state_t st;
      ASSERT_EQ_INT(nh_uow_session_get(u, "Ep", session, &st), NH_OK);
      blocked += st.blocked_by != NULL;
      nh_session_state_clear(&st);
    }
  say(s, "blocked %d\n", blocked);
}

TEST(every_key_a_pass_missed_is_read_by_one_batch)
{
  fx_t *fx = fx_new();
  for (int i = 0; i < 100; i += 3) {
    char session[16];
    snprintf(session, sizeof session, "s%03d", i);
    nh_session_state_t st = { .exists = 1, .blocked_by = "eX", .next_park_seq = 1 };
    ASSERT_EQ_INT(nh_pgs_session_put(fx->db, "Ep", session, &st), NH_OK);
  }
  nh_uow_t *u = nh_uow_new_pg(fx->link);
  said_t said;
  ASSERT_EQ_INT(run_pg(fx, u, hundred_sessions, &said), 2);
  ASSERT_EQ_STR(said.text, "blocked 68\n");   /* 34 sessions, read twice each */
  nh_uow_stats_t st;
  nh_uow_stats(u, &st);
  ASSERT_EQ_INT((int)st.misses, 100);
  ASSERT_EQ_INT((int)st.fills, 1);
  ASSERT_EQ_INT((int)st.filled, 100);
  nh_uow_free(u);
}

/* Many rows of each table: each row's bytes as given (a NUL inside, NULLs), the second
 * put of one event after the first, and what one would read of the other. */
static void many_rows(nh_uow_t *u, said_t *s)
{
  (void)s;
  for (int i = 0; i < 50; i++) {
    char ev[16], msg[16];
    snprintf(ev, sizeof ev, "e%02d", i);
    snprintf(msg, sizeof msg, "m%02d", i);
    nh_audit_t a = { .endpoint = "Ep", .event_id = ev, .session_id = "s1", .event_type = "Thing",
                     .status = NH_ST_PENDING, .message_id = msg, .retry_count = i, .payload = "{\0}",
                     .payload_len = 3, .queue_time_ms = -1, .processing_time_ms = -1 };
    ASSERT_EQ_INT(nh_uow_audit_put(u, &a), NH_OK);
    nh_history_extra_t x = { .error_text = i % 2 ? "odd" : NULL, .previous_payload = i % 3 ? NULL : "p\xff" };
    ASSERT_EQ_INT(nh_uow_history_add(u, "Ep", ev, msg, "EventRequest", NH_ST_PENDING, NULL, &x), NH_OK);
  }
  nh_audit_t again = { .endpoint = "Ep", .event_id = "e00", .session_id = "s1", .event_type = "Thing",
                       .status = NH_ST_COMPLETED, .error_text = "second", .message_id = "m00", .retry_count = 7,
                       .queue_time_ms = 3, .processing_time_ms = 4 };
  ASSERT_EQ_INT(nh_uow_audit_put(u, &again), NH_OK);
  ASSERT_EQ_INT(nh_uow_history_add(u, "Ep", "e00", "m00", "EventRequest", NH_ST_COMPLETED, "done", NULL), NH_OK);
}

TEST(a_commits_rows_go_as_one_statement_per_table_and_a_repeated_key_after_the_first)
{
  fx_t *fx = fx_new();
  said_t lite, pg;
  run_sqlite(fx, many_rows, &lite);
  nh_uow_t *u = nh_uow_new_pg(fx->link);
  ASSERT_EQ_INT(run_pg(fx, u, many_rows, &pg), 1);
  nh_uow_stats_t st;
  nh_uow_stats(u, &st);
  nh_uow_free(u);
  /* 102 writes: the first 100 as two statements (audit, history), sent when e00 comes
   * again; then that put and its history row as two more */
  ASSERT_EQ_INT((int)st.writes, 102);
  ASSERT_EQ_INT((int)st.statements, 4);
  said_t dl, dp;
  dump_sqlite(fx, &dl);
  dump_pg(fx, &dp);
  ASSERT_EQ_STR(dp.text, dl.text);
  ASSERT_CONTAINS(dp.text, "e00/Completed/second/7,e01/Pending/-/1,");
  PGconn *c = nh_pg_db_conn(fx->db);
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT string_agg(DISTINCT encode(payload, 'hex'), ',') FROM audit WHERE event_id <> 'e00'"),
                "7b007d");
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT count(*) || '/' || count(error_text) || '/' || count(previous_payload) || '/' ||"
                                " string_agg(DISTINCT encode(previous_payload, 'hex'), ',') FROM history"),
                "51/25/17/70ff");
  /* rows in the order written: ids (history) and seqs (audit) follow the list */
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT string_agg(event_id, ',' ORDER BY seq) FROM audit WHERE event_id < 'e03'"),
                "e00,e01,e02");
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT string_agg(status, ',' ORDER BY id) FROM history WHERE event_id = 'e00'"),
                "Pending,Completed");
}

static void write_bad_audit(nh_uow_t *u, said_t *s)
{
  (void)s;
  nh_session_state_t st = { .exists = 1, .blocked_by = "e1", .next_park_seq = 1 };
  ASSERT_EQ_INT(nh_uow_session_put(u, "Ep", "s1", &st), NH_OK);
  ASSERT_EQ_INT(nh_uow_inbox_add(u, "Ep", "m1"), NH_OK);
  nh_audit_t a = { .endpoint = "Ep", .event_id = "e1", .session_id = NULL, .status = NH_ST_FAILED };
  ASSERT_EQ_INT(nh_uow_audit_put(u, &a), NH_OK);   /* session_id NOT NULL: the server refuses it */
}

TEST(a_commit_that_fails_writes_nothing)
{
  fx_t *fx = fx_new();
  nh_uow_t *u = nh_uow_new_pg(fx->link);
  said_t said;
  nh_uow_pass_begin(u);
  ASSERT_EQ_INT(nh_uow_begin(u), NH_OK);
  write_bad_audit(u, &said);
  ASSERT_FALSE(nh_uow_missed(u));   /* writes alone read nothing */
  ASSERT_EQ_INT(commit(fx, u), NH_UOW_NOT_COMMITTED);
  ASSERT_CONTAINS(fx->why, "audit_put");
  PGconn *c = nh_pg_db_conn(fx->db);
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT count(*) FROM sessions"), "0");
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT count(*) FROM inbox"), "0");
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT count(*) FROM audit"), "0");

  /* the unit is usable again: the next pass starts from nothing and commits */
  nh_uow_end(u);
  nh_uow_pass_begin(u);
  ASSERT_EQ_INT(nh_uow_begin(u), NH_OK);
  ASSERT_EQ_INT(nh_uow_inbox_add(u, "Ep", "m1"), NH_OK);
  ASSERT_EQ_INT(commit(fx, u), NH_UOW_COMMITTED);
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT count(*) FROM inbox"), "1");
  nh_uow_end(u);
  nh_uow_free(u);
}

TEST(a_void_pass_cannot_commit_and_a_unit_without_misses_has_nothing_to_fill)
{
  fx_t *fx = fx_new();
  nh_uow_t *u = nh_uow_new_pg(fx->link);
  nh_error_t err = { 0 };
  nh_uow_pass_begin(u);
  ASSERT_EQ_INT(nh_uow_fill(u, on_fill, fx, &err), NH_ESTATE);
  ASSERT_CONTAINS(err.msg, "nothing to fill");
  ASSERT_EQ_INT(nh_uow_inbox_has(u, "Ep", "m1"), 0);
  ASSERT_TRUE(nh_uow_missed(u));
  ASSERT_EQ_INT(nh_uow_commit(u, on_commit, fx, &err), NH_ESTATE);
  ASSERT_CONTAINS(err.msg, "void");
  nh_uow_end(u);
  nh_uow_free(u);

  /* sqlite has neither */
  nh_uow_t *lite = nh_uow_new(fx->lite, NH_UOW_DIRECT);
  ASSERT_EQ_INT(nh_uow_fill(lite, on_fill, fx, &err), NH_ESTATE);
  ASSERT_EQ_INT(nh_uow_commit(lite, on_commit, fx, &err), NH_ESTATE);
  nh_uow_free(lite);
}

static int empty_batch(void *data, nh_pg_db_t *db, nh_error_t *err)
{
  (void)data;
  (void)db;
  (void)err;
  return NH_OK;
}

static void after_empty(void *data, nh_pg_batch_outcome_t outcome, const nh_error_t *err)
{
  (void)err;
  fx_t *fx = data;
  ASSERT_EQ_INT(outcome, NH_PG_COMMITTED);
  fx->done = 1;
  uv_stop(&fx->loop);
}

TEST(a_unit_freed_with_its_commit_out_waits_for_it_and_calls_nothing)
{
  fx_t *fx = fx_new();
  nh_uow_t *u = nh_uow_new_pg(fx->link);
  nh_uow_pass_begin(u);
  ASSERT_EQ_INT(nh_uow_begin(u), NH_OK);
  ASSERT_EQ_INT(nh_uow_inbox_add(u, "Ep", "m1"), NH_OK);
  nh_error_t err = { 0 };
  fx->done = 0;
  ASSERT_EQ_INT(nh_uow_commit(u, on_commit, fx, &err), NH_OK);
  nh_uow_free(u);   /* the host stops with the commit out */
  /* the batch is over once the link has sent a second one after it (batches run in order) */
  fx->done = 0;
  ASSERT_EQ_INT(nh_pg_link_submit(fx->link, empty_batch, after_empty, fx, &err), NH_OK);
  RUN_UNTIL(fx, &fx->done, "the batch after the orphaned commit");
  nh_pg_link_stats_t ls = { 0 };
  nh_pg_link_stats(fx->link, &ls);
  ASSERT_EQ_INT((int)ls.batches, 2);
  fx->done = 0;
  ASSERT_FALSE(fx->done);
  ASSERT_EQ_STR(nh_pgtest_q1(nh_pg_db_conn(fx->db), "SELECT count(*) FROM inbox"), "1");
}

/* A transport's statements join the pump's batches: a queue row read through the cache,
 * and a queue row's delete sent with the store's writes in one commit, all or nothing. */
TEST(another_tables_reads_and_writes_join_the_pumps_batches)
{
  fx_t *fx = fx_new();
  nh_error_t err = { 0 };
  if (nh_pg_queue_migrate(nh_pg_db_conn(fx->db), &err)) FAIL("queue migrate: %s", err.msg);
  PGconn *c = nh_pg_db_conn(fx->db);
  nh_msg_t m = parked_msg("s1", "e1", "m1");
  nh_pg_args_t a;
  nh_pgqop_t qop = nh_pgqargs_insert(&a, &m, "Ep", "e1");
  PGresult *r = NULL;
  if (nh_pg_db_run_op(fx->db, &nh_pgq_optab, qop, &a, &r, &err)) FAIL("insert: %s", err.msg);
  PQclear(r);
  int64_t seq = atoll(nh_pgtest_q1(c, "SELECT seq FROM queue"));

  nh_uow_t *u = nh_uow_new_pg(fx->link);
  const PGresult *got = NULL;
  for (int pass = 0; pass < 2; pass++) {
    nh_uow_pass_begin(u);
    ASSERT_EQ_INT(nh_uow_begin(u), NH_OK);
    qop = nh_pgqargs_row(&a, seq, "Ep", "s1");
    int have = nh_uow_op_read(u, "queue-row:1", &nh_pgq_optab, qop, &a, &got);
    ASSERT_EQ_INT(have, pass);   /* a miss, then the row */
    if (!have) {
      ASSERT_TRUE(nh_uow_missed(u));
      nh_uow_rollback(u);
      fill(fx, u);
    }
  }
  ASSERT_EQ_INT(PQntuples(got), 1);

  /* the delete and a store write go in one batch; a failing store write takes the delete
   * with it */
  ASSERT_EQ_INT(nh_uow_op(u, &nh_pgq_optab, nh_pgqargs_delete(&a, seq), &a, &err), NH_OK);
  nh_audit_t bad = { .endpoint = "Ep", .event_id = "e1", .status = NH_ST_COMPLETED };   /* no session: refused */
  ASSERT_EQ_INT(nh_uow_audit_put(u, &bad), NH_OK);
  ASSERT_EQ_INT(commit(fx, u), NH_UOW_NOT_COMMITTED);
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT count(*) FROM queue"), "1");
  nh_uow_end(u);

  nh_uow_pass_begin(u);
  ASSERT_EQ_INT(nh_uow_begin(u), NH_OK);
  ASSERT_EQ_INT(nh_uow_op(u, &nh_pgq_optab, nh_pgqargs_delete(&a, seq), &a, &err), NH_OK);
  ASSERT_EQ_INT(nh_uow_inbox_add(u, "Ep", "m1"), NH_OK);
  nh_pg_link_stats_t before, after;
  nh_pg_link_stats(fx->link, &before);
  ASSERT_EQ_INT(commit(fx, u), NH_UOW_COMMITTED);
  nh_pg_link_stats(fx->link, &after);
  ASSERT_EQ_INT((int)(after.batches - before.batches), 1);
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT count(*) FROM queue"), "0");
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT count(*) FROM inbox"), "1");
  nh_uow_end(u);
  nh_uow_free(u);

  /* a unit without a link has neither */
  nh_uow_t *lite = nh_uow_new(fx->lite, NH_UOW_CACHED);
  ASSERT_EQ_INT(nh_uow_op(lite, &nh_pgq_optab, nh_pgqargs_delete(&a, seq), &a, &err), NH_ESTATE);
  qop = nh_pgqargs_row(&a, seq, "Ep", "s1");
  ASSERT_EQ_INT(nh_uow_op_read(lite, "queue-row:1", &nh_pgq_optab, qop, &a, &got), NH_ESTATE);
  nh_uow_free(lite);
}

/* ---------------------------------------------------------------- hosts sharing leases */

/* A host on the fixture's store and loop: a link and a unit of its own. */
typedef struct host {
  fx_t *fx;
  const char *owner;
  nh_pg_link_t *link;
  nh_uow_t *u;
  int ready, closed, done, ok;
  char why[512];
} host_t;

static void host_on_state(void *data, nh_pg_link_state_t st, const nh_error_t *err)
{
  (void)err;
  host_t *h = data;
  if (st == NH_PG_LINK_READY) {
    h->ready = 1;
    uv_stop(&h->fx->loop);
  }
}

static void host_on_closed(void *data)
{
  host_t *h = data;
  h->closed = 1;
  uv_stop(&h->fx->loop);
}

/* Registered after the fixture: runs before fx_free closes the loop. */
static void host_free(void *p)
{
  host_t *h = p;
  if (h->u) nh_uow_free(h->u);   /* a batch still out is waited for by the link's close */
  nh_pg_link_close(h->link, host_on_closed, h);
  loop_until(h->fx, &h->closed);
  free(h);
}

static host_t *host_new(fx_t *fx, const char *owner)
{
  host_t *h = nh_xcalloc(1, sizeof *h);
  h->fx = fx;
  h->owner = owner;
  nh_error_t err = { 0 };
  nh_pg_link_opts_t o = { .on_state = host_on_state, .data = h };
  if (nh_pg_link_open(&fx->loop, fx->url, &o, &h->link, &err)) FAIL("link: %s", err.msg);
  nh_test_on_cleanup(host_free, h);
  RUN_UNTIL(fx, &h->ready, "ready link");
  h->u = nh_uow_new_pg(h->link);
  return h;
}

static void host_on_fill(void *data, int ok, const nh_error_t *err)
{
  host_t *h = data;
  h->ok = ok;
  snprintf(h->why, sizeof h->why, "%s", err ? err->msg : "");
  h->done = 1;
  uv_stop(&h->fx->loop);
}

static void host_on_commit(void *data, nh_uow_outcome_t outcome, const nh_error_t *err)
{
  host_on_fill(data, outcome == NH_UOW_COMMITTED, err);
}

/* Runs the loop (both hosts' batches run on it at once) until both are over; each must
 * have succeeded. */
static void run_until_both(fx_t *fx, host_t *a, host_t *b)
{
  RUN_UNTIL(fx, &a->done, "end of host A's batch");
  RUN_UNTIL(fx, &b->done, "end of host B's batch");
  if (!a->ok) FAIL("%s's batch failed: %s", a->owner, a->why);
  if (!b->ok) FAIL("%s's batch failed: %s", b->owner, b->why);
}

/* The gate: a statement that waits while the test holds advisory lock 4242 (shared, so
 * that both hosts pass it together once the test lets go). A batch holding it stops
 * half-way, after the leases its first statements took. */
static const nh_pg_opdef_t gate_ops[] = {
  { .name = "nht_gate", .sql = "SELECT pg_advisory_xact_lock_shared(4242)" },
};
static const nh_pg_optab_t gate_tab = { "gate", 4, gate_ops, 1 };

static void gate_close(fx_t *fx)
{
  ASSERT_EQ_STR(nh_pgtest_q1(nh_pg_db_conn(fx->db), "SELECT pg_advisory_lock(4242)"), "");
}

static void gate_open(fx_t *fx)
{
  ASSERT_EQ_STR(nh_pgtest_q1(nh_pg_db_conn(fx->db), "SELECT pg_advisory_unlock(4242)"), "t");
}

/* Turns the loop (the hosts' batches go out) until n transactions wait for an advisory
 * lock: the gate, or a lease key. */
static void wait_for_waiters(fx_t *fx, int n)
{
  char want[16];
  snprintf(want, sizeof want, "%d", n);
  int64_t deadline = nh_test_mono_ms() + DEADLINE_MS;
  while (strcmp(nh_pgtest_q1(nh_pg_db_conn(fx->db), "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                             " AND NOT granted AND database = (SELECT oid FROM pg_database"
                             " WHERE datname = current_database())"),
                want) != 0) {
    if (nh_test_mono_ms() > deadline) FAIL("%d batches did not come to wait within %d ms", n, DEADLINE_MS);
    uv_run(&fx->loop, UV_RUN_NOWAIT);
    usleep(2000);
  }
}

/* A read of the session's lease for the host, keyed by session. */
static int lease_read(host_t *h, const char *session, const PGresult **r)
{
  nh_pg_args_t a;
  char key[64];
  snprintf(key, sizeof key, "lock:%s", session);
  nh_pgqop_t op = nh_pgqargs_lock(&a, "Ep", session, h->owner, nh_time_now_ms() + 30000, nh_time_now_ms());
  return nh_uow_op_read(h->u, key, &nh_pgq_optab, op, &a, (const struct pg_result **)r);
}

static void gate_read(host_t *h)
{
  nh_pg_args_t a;
  nh_pg_args_reset(&a);
  const PGresult *r;
  ASSERT_EQ_INT(nh_uow_op_read(h->u, "gate", &gate_tab, 0, &a, (const struct pg_result **)&r), 0);
}

/* The host's pass asks for `first`'s lease, the gate, `second`'s lease: all missed, its
 * fill (one transaction) goes out and takes them in the order it reads them. */
static void fill_leases(host_t *h, const char *first, const char *second)
{
  const PGresult *r;
  nh_uow_pass_begin(h->u);
  ASSERT_EQ_INT(nh_uow_begin(h->u), NH_OK);
  ASSERT_EQ_INT(lease_read(h, first, &r), 0);
  gate_read(h);
  ASSERT_EQ_INT(lease_read(h, second, &r), 0);
  nh_uow_rollback(h->u);
  nh_error_t err = { 0 };
  h->done = 0;
  if (nh_uow_fill(h->u, host_on_fill, h, &err)) FAIL("fill: %s", err.msg);
}

/* What the host's fill answered for the session's lease: 1 taken, 0 not. */
static int lease_taken(host_t *h, const char *session)
{
  const PGresult *r = NULL;
  nh_uow_pass_begin(h->u);
  ASSERT_EQ_INT(nh_uow_begin(h->u), NH_OK);
  ASSERT_EQ_INT(lease_read(h, session, &r), 1);
  int taken = PQntuples(r);
  nh_uow_rollback(h->u);
  return taken;
}

static fx_t *fx_queue(void)
{
  fx_t *fx = fx_new();
  nh_error_t err = { 0 };
  if (nh_pg_queue_migrate(nh_pg_db_conn(fx->db), &err)) FAIL("queue migrate: %s", err.msg);
  return fx;
}

/* Two hosts holding deliveries of the same two sessions (a partition moving) lock them
 * in opposite orders, each in its fill: each holds one lease and asks for the other's.
 * An upsert waits for a row another transaction wrote, so this was a deadlock (40P01, a
 * failed fill); a fill now leaves a session another transaction is writing alone. */
TEST(two_hosts_fills_taking_the_same_leases_in_opposite_orders_both_finish)
{
  fx_t *fx = fx_queue();
  host_t *a = host_new(fx, "host-a"), *b = host_new(fx, "host-b");
  PGconn *c = nh_pg_db_conn(fx->db);
  /* s3 has a live lease of a third host: an upsert whose WHERE fails still locks its row */
  ASSERT_EQ_STR(nh_pgtest_q1(c, "INSERT INTO session_locks VALUES ('Ep', 's3', 'host-c', %lld) RETURNING 1",
                             (long long)nh_time_now_ms() + 600000),
                "1");
  const char *pairs[][2] = { { "s1", "s2" }, { "s3", "s4" } };   /* new rows; a live lease's row */
  for (int i = 0; i < 2; i++) {
    gate_close(fx);
    fill_leases(a, pairs[i][0], pairs[i][1]);
    fill_leases(b, pairs[i][1], pairs[i][0]);
    wait_for_waiters(fx, 2);   /* both at the gate, each holding its first session's row */
    gate_open(fx);
    run_until_both(fx, a, b);
    /* a free session went to one of them (the one that asked first), the live lease to
     * neither; the other was told "not free now" */
    for (int k = 0; k < 2; k++) {
      const char *session = pairs[i][k];
      int live = strcmp(session, "s3") == 0;
      ASSERT_EQ_INT(lease_taken(a, session) + lease_taken(b, session), live ? 0 : 1);
    }
    nh_uow_end(a->u);
    nh_uow_end(b->u);
  }
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT string_agg(session_id || '=' || owner, ',' ORDER BY session_id)"
                                " FROM session_locks WHERE owner NOT IN ('host-a', 'host-b')"),
                "s3=host-c");
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT count(DISTINCT owner) FROM session_locks WHERE session_id IN ('s1', 's2')"),
                "2");
}

/* A host's commit ends its two expired leases (its pass did not use them) while another
 * host's fill takes them over, in the other order: the commit took its first row and
 * waited for the fill's, which waited for the commit's (40P01). A commit now takes its
 * leases' keys first, in one statement, and the fill leaves what it cannot have. */
TEST(a_commit_ending_leases_and_a_fill_taking_them_over_both_finish)
{
  fx_t *fx = fx_queue();
  host_t *a = host_new(fx, "host-a"), *b = host_new(fx, "host-b");
  PGconn *c = nh_pg_db_conn(fx->db);
  ASSERT_EQ_STR(nh_pgtest_q1(c, "INSERT INTO session_locks VALUES ('Ep', 's1', 'host-a', 1), ('Ep', 's2', 'host-a', 1)"
                                " RETURNING 1"),
                "1");
  gate_close(fx);
  fill_leases(b, "s1", "s2");
  wait_for_waiters(fx, 1);
  /* the session B's fill took over first is the one whose row is locked now */
  const char *other = nh_pgtest_q1(c, "SELECT session_id FROM session_locks FOR UPDATE SKIP LOCKED");
  const char *first = strcmp(other, "s1") == 0 ? "s2" : "s1";
  ASSERT_TRUE(strcmp(other, "s1") == 0 || strcmp(other, "s2") == 0);
  nh_pg_args_t arg;
  nh_error_t err = { 0 };
  nh_uow_pass_begin(a->u);
  ASSERT_EQ_INT(nh_uow_begin(a->u), NH_OK);
  ASSERT_EQ_INT(nh_uow_op(a->u, &nh_pgq_optab, nh_pgqargs_unlock(&arg, "Ep", other, "host-a"), &arg, &err), NH_OK);
  nh_pg_args_reset(&arg);
  ASSERT_EQ_INT(nh_uow_op(a->u, &gate_tab, 0, &arg, &err), NH_OK);
  ASSERT_EQ_INT(nh_uow_op(a->u, &nh_pgq_optab, nh_pgqargs_unlock(&arg, "Ep", first, "host-a"), &arg, &err), NH_OK);
  a->done = 0;
  if (nh_uow_commit(a->u, host_on_commit, a, &err)) FAIL("commit: %s", err.msg);
  wait_for_waiters(fx, 2);   /* A's commit waits too: for the gate, or for a lease key B's fill holds */
  gate_open(fx);
  run_until_both(fx, a, b);
  nh_uow_end(a->u);
  /* B's fill took over the lease it asked for first; A's commit ended what was still its own */
  ASSERT_EQ_INT(lease_taken(b, first), 1);
  nh_uow_end(b->u);
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT count(*) FROM session_locks WHERE owner = 'host-a'"), "0");
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT owner FROM session_locks WHERE session_id = '%s'", first), "host-b");
}

NH_PGTEST_MAIN()
