/* The PostgreSQL store's connection on the loop (store/nh_pg_link.c) against the test
 * cluster, on a real libuv loop: batches one after another, a failing statement, a
 * builder that gives up, the backend terminated while idle and while a batch waits for a
 * lock (the report checked against what the database holds), a server that accepts and
 * never answers (the connect deadline, then retries with backoff), the batch deadline,
 * LISTEN/NOTIFY across a reconnect, batches queued while the store cannot be reached and
 * the queue's bound, a store of another schema version, closing with a batch in flight,
 * and what each connection carries so that a dropped one leaves nothing behind on the
 * server (statement_timeout and idle_in_transaction_session_timeout from the batch
 * deadline, TCP keepalives; the URL's own settings winning). Every test closes the link
 * and then the loop, which must find no handle left.
 *
 * Nothing sleeps: the loop runs until a condition holds, under a deadline timer that
 * fails the test (a tick timer wakes the loop for conditions read from the server).
 *
 * NH_PG_URL names the test cluster (the ctest fixture "postgres": scripts/postgres.sh) and
 * NH_PG_ADMIN_URL a superuser, through which each test makes its own database and
 * terminates backends (nh_pgtest.h). Without either the suite reports itself skipped (77),
 * except under CI=true. */
#include "nh_test.h"
#include "nh_pgtest.h"

#include "core/nh_log.h"
#include "core/nh_util.h"
#include "store/nh_pg.h"
#include "store/nh_pg_link.h"
#include "store/nh_pg_ops.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <uv.h>

enum { DEADLINE_MS = 30000, MAX_JOBS = 128, MAX_PEERS = 32 };

typedef struct fx fx_t;

/* One batch: an inbox row m-ID and a history row e-ID, and what a test wants of it. */
typedef enum { JOB_OK, JOB_FAILS, JOB_GIVES_UP } job_kind_t;

typedef struct job {
  fx_t *fx;
  int id;
  job_kind_t kind;
  int chain;                    /* when done, submit job id+1, up to this id */
  int built, results, done;
  int backend;                  /* the backend it was built on */
  nh_pg_batch_outcome_t outcome;
  char err[600];
} job_t;

/* A server that accepts connections and never says a word. */
typedef struct silent {
  uv_tcp_t server;
  uv_tcp_t *peers[MAX_PEERS];
  int accepted;
  int port;
} silent_t;

struct fx {
  uv_loop_t loop;
  uv_timer_t deadline, tick;
  int expired;
  nh_pg_link_t *link;
  int closed;                   /* close's callback ran */
  char url[1024];
  PGconn *other;                /* the test's own connection to the scratch database */
  char trace[4096];             /* states, outcomes and the close, in the order they came */
  int ready, lost, failed;      /* states said */
  char state_err[1024];         /* the error of the last LOST or FAILED */
  int backend;                  /* the link's backend, as the last builder saw it */
  char tcp[128];                /* ... and its socket's keepalive options (tcp_opts) */
  nh_pg_db_stats_t db_stats;    /* ... and its executor's figures */
  job_t jobs[MAX_JOBS];
  char notes[16][64];           /* notifications: "channel:payload" */
  int nnotes;
  silent_t *silent;
  nh_test_capture_t log;      /* stderr while a test reads the log lines */
};

static const char *outcome_name(nh_pg_batch_outcome_t o)
{
  return o == NH_PG_COMMITTED ? "COMMITTED" : o == NH_PG_NOT_COMMITTED ? "NOT_COMMITTED" : "UNKNOWN";
}

static void trace(fx_t *fx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void trace(fx_t *fx, const char *fmt, ...)
{
  size_t n = strlen(fx->trace);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(fx->trace + n, sizeof fx->trace - n, fmt, ap);
  va_end(ap);
}

/* ---------------------------------------------------------------- the loop */

static void on_test_deadline(uv_timer_t *t) { ((fx_t *)t->data)->expired = 1; }
static void on_tick(uv_timer_t *t) { (void)t; }

typedef int (*cond_fn)(fx_t *fx, void *arg);

/* Runs the loop until cond holds; the test fails when the deadline timer fires first. */
static void run_until_at(fx_t *fx, cond_fn cond, void *arg, const char *what, const char *file, int line)
{
  fx->expired = 0;
  uv_timer_start(&fx->deadline, on_test_deadline, DEADLINE_MS, 0);
  uv_timer_start(&fx->tick, on_tick, 5, 5);
  while (!cond(fx, arg)) {
    if (fx->expired) {
      uv_timer_stop(&fx->tick);
      nh_test_fail(file, line, "timed out (%d s) waiting for %s; so far: %s", DEADLINE_MS / 1000, what, fx->trace);
    }
    uv_run(&fx->loop, UV_RUN_ONCE);
  }
  uv_timer_stop(&fx->deadline);
  uv_timer_stop(&fx->tick);
}
#define RUN_UNTIL(fx, cond, arg, what) run_until_at(fx, cond, arg, what, __FILE__, __LINE__)

static int is_ready(fx_t *fx, void *n) { return fx->ready >= (int)(intptr_t)n; }
static int is_lost(fx_t *fx, void *n) { return fx->lost >= (int)(intptr_t)n; }
static int is_failed(fx_t *fx, void *arg) { (void)arg; return fx->failed > 0; }
static int is_closed(fx_t *fx, void *arg) { (void)arg; return fx->closed; }
static int job_done(fx_t *fx, void *j) { (void)fx; return ((job_t *)j)->done; }
static int notes_reach(fx_t *fx, void *n) { return fx->nnotes >= (int)(intptr_t)n; }

static int jobs_done(fx_t *fx, void *n)
{
  for (int i = 0; i < (int)(intptr_t)n; i++)
    if (!fx->jobs[i].done) return 0;
  return 1;
}

static int attempts_reach(fx_t *fx, void *n)
{
  nh_pg_link_stats_t s;
  nh_pg_link_stats(fx->link, &s);
  return s.attempts >= (int64_t)(intptr_t)n;
}

/* ---------------------------------------------------------------- log capture */

static void capture_start(fx_t *fx) { nh_test_capture_start(&fx->log); }
static void capture_end(fx_t *fx) { nh_test_capture_end(&fx->log); }

/* Lines of the captured log holding `what`. */
static int log_lines(fx_t *fx, const char *what)
{
  int n = 0;
  for (const char *p = nh_test_read_file(fx->log.path); (p = strstr(p, what)) != NULL; p++) n++;
  return n;
}

/* ---------------------------------------------------------------- the link's callbacks */

static void on_state(void *data, nh_pg_link_state_t st, const nh_error_t *err)
{
  fx_t *fx = data;
  static const char *const names[] = { "CONNECTING", "READY", "LOST", "FAILED", "CLOSED" };
  trace(fx, "%s ", names[st]);
  if (st == NH_PG_LINK_READY) fx->ready++;
  if (st == NH_PG_LINK_LOST) fx->lost++;
  if (st == NH_PG_LINK_FAILED) fx->failed++;
  if (err) snprintf(fx->state_err, sizeof fx->state_err, "%s", err->msg);
}

static void on_closed(void *data)
{
  fx_t *fx = data;
  fx->closed = 1;
  trace(fx, "closed");
}

static void on_result(void *data, const nh_pg_optab_t *tab, int op, const PGresult *res)
{
  (void)tab;
  (void)op;
  (void)res;
  ((job_t *)data)->results++;
}

static void submit_job(fx_t *fx, int id, job_kind_t kind);

/* A connection of the test's own with the inbox table locked (ACCESS EXCLUSIVE) in an open
 * transaction: a batch of the link (inbox_add first) waits for it until its ROLLBACK. */
static PGconn *hold_inbox(fx_t *fx)
{
  PGconn *holder = nh_pgtest_connect(fx->url);
  nh_pgtest_q1(holder, "BEGIN");
  nh_pgtest_q1(holder, "LOCK TABLE inbox IN ACCESS EXCLUSIVE MODE");
  return holder;
}

/* A socket's keepalive settings, as the kernel holds them: "keepalive=1 idle=10 interval=5
 * count=3 user_timeout=25000" (user_timeout where the system has it). */
static void tcp_opts(int fd, char *buf, size_t len)
{
  static const struct { int level, name; const char *label; } o[] = {
    { SOL_SOCKET, SO_KEEPALIVE, "keepalive" }, { IPPROTO_TCP, TCP_KEEPIDLE, "idle" },
    { IPPROTO_TCP, TCP_KEEPINTVL, "interval" }, { IPPROTO_TCP, TCP_KEEPCNT, "count" },
#ifdef TCP_USER_TIMEOUT
    { IPPROTO_TCP, TCP_USER_TIMEOUT, "user_timeout" },
#endif
  };
  size_t n = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < sizeof o / sizeof o[0]; i++) {
    int v = -1;
    socklen_t vl = sizeof v;
    if (getsockopt(fd, o[i].level, o[i].name, &v, &vl) != 0) v = -1;
    n += (size_t)snprintf(buf + n, len - n, "%s%s=%d", n ? " " : "", o[i].label, v);
    if (n >= len) break;
  }
}

static int build_job(void *data, nh_pg_db_t *db, nh_error_t *err)
{
  job_t *j = data;
  j->built++;
  j->backend = j->fx->backend = PQbackendPID(nh_pg_db_conn(db));
  tcp_opts(PQsocket(nh_pg_db_conn(db)), j->fx->tcp, sizeof j->fx->tcp);
  char id[32], mid[32];
  snprintf(id, sizeof id, "e-%d", j->id);
  snprintf(mid, sizeof mid, "m-%d", j->id);
  nh_pg_args_t a;
  nh_pgop_t op = nh_pgargs_inbox_add(&a, "Erp", mid);
  if (nh_pg_batch_add(db, op, &a, on_result, j, err)) return NH_EFAIL;
  op = nh_pgargs_history_add(&a, "Erp", id, mid, "EventRequest", "Completed", NULL, NULL);
  if (nh_pg_batch_add(db, op, &a, on_result, j, err)) return NH_EFAIL;
  if (j->kind == JOB_FAILS) {
    nh_audit_t au;
    memset(&au, 0, sizeof au);
    au.endpoint = "Erp";
    au.event_id = id;
    au.session_id = "s";
    au.status = NULL;   /* NOT NULL in the table */
    op = nh_pgargs_audit_put(&a, &au);
    if (nh_pg_batch_add(db, op, &a, on_result, j, err)) return NH_EFAIL;
  }
  nh_pg_db_stats(db, &j->fx->db_stats);
  if (j->kind == JOB_GIVES_UP) return nh_error_set(err, NH_EUSAGE, "test: the builder of job %d gives up", j->id);
  return NH_OK;
}

static void on_done(void *data, nh_pg_batch_outcome_t outcome, const nh_error_t *err)
{
  job_t *j = data;
  j->done++;
  j->outcome = outcome;
  snprintf(j->err, sizeof j->err, "%s", err ? err->msg : "");
  trace(j->fx, "done:%d:%s ", j->id, outcome_name(outcome));
  if (outcome == NH_PG_COMMITTED && err) snprintf(j->err, sizeof j->err, "an error with COMMITTED: %s", err->msg);
  if (j->id < j->chain) {
    j->fx->jobs[j->id + 1].chain = j->chain;
    submit_job(j->fx, j->id + 1, JOB_OK);
  }
}

static int try_submit(fx_t *fx, int id, job_kind_t kind, nh_error_t *err)
{
  if (id >= MAX_JOBS) FAIL("job %d: raise MAX_JOBS", id);
  job_t *j = &fx->jobs[id];
  j->fx = fx;
  j->id = id;
  j->kind = kind;
  return nh_pg_link_submit(fx->link, build_job, on_done, j, err);
}

static void submit_job(fx_t *fx, int id, job_kind_t kind)
{
  nh_error_t err = { 0 };
  if (try_submit(fx, id, kind, &err)) FAIL("submit job %d: %s", id, err.msg);
}

static void on_note(void *data, const char *channel, const char *payload)
{
  fx_t *fx = data;
  if (fx->nnotes < 16) snprintf(fx->notes[fx->nnotes++], sizeof fx->notes[0], "%s:%s", channel, payload);
}

/* ---------------------------------------------------------------- fixture */

/* The rows job `id` writes that the database holds: 0, or 2 (its inbox and history rows). */
static int rows_of(fx_t *fx, int id)
{
  return atoi(nh_pgtest_q1(fx->other, "SELECT (SELECT count(*) FROM inbox WHERE message_id = 'm-%d') + "
                                      "(SELECT count(*) FROM history WHERE event_id = 'e-%d')", id, id));
}

/* The report against the database: COMMITTED holds both rows, NOT_COMMITTED neither, and
 * UNKNOWN one or the other but never half. */
static void report_matches_at(fx_t *fx, int id, const char *file, int line)
{
  job_t *j = &fx->jobs[id];
  int rows = rows_of(fx, id);
  int ok = j->outcome == NH_PG_COMMITTED ? rows == 2 : j->outcome == NH_PG_NOT_COMMITTED ? rows == 0
                                                                                         : rows == 0 || rows == 2;
  if (!ok) nh_test_fail(file, line, "job %d reported %s, and the database holds %d of its 2 rows", id,
                        outcome_name(j->outcome), rows);
}
#define REPORT_MATCHES(fx, id) report_matches_at(fx, id, __FILE__, __LINE__)

static void close_walk(uv_handle_t *h, void *arg)
{
  (void)arg;
  if (!uv_is_closing(h)) uv_close(h, NULL);
}

static void silent_free(silent_t *s);

/* After a failed test: closes what is left, bounded (a link closes within a loop turn or
 * two), so the next test starts clean. */
static void fx_free(void *p)
{
  fx_t *fx = p;
  capture_end(fx);
  if (fx->link && !fx->closed) {
    nh_pg_link_close(fx->link, on_closed, fx);
    int64_t deadline = nh_test_mono_ms() + 10000;
    uv_timer_start(&fx->tick, on_tick, 5, 5);
    while (!fx->closed && nh_test_mono_ms() < deadline) uv_run(&fx->loop, UV_RUN_ONCE);
  }
  if (fx->silent) silent_free(fx->silent);
  uv_walk(&fx->loop, close_walk, NULL);
  uv_run(&fx->loop, UV_RUN_DEFAULT);
  if (uv_loop_close(&fx->loop)) fprintf(stderr, "warning: the loop would not close after a failed test\n");
  free(fx);
}

/* A loop, and a scratch database migrated to the current schema (no database: url left
 * empty, for tests that bring their own). */
static fx_t *fx_new(int with_db)
{
  fx_t *fx = nh_xcalloc(1, sizeof *fx);
  fx->log.saved = -1;
  uv_loop_init(&fx->loop);
  uv_timer_init(&fx->loop, &fx->deadline);
  uv_timer_init(&fx->loop, &fx->tick);
  fx->deadline.data = fx;
  nh_test_on_cleanup(fx_free, fx);
  if (!with_db) return fx;
  snprintf(fx->url, sizeof fx->url, "%s", nh_pgtest_url("dbname", nh_pgtest_scratch_db(), NULL));
  PGconn *c = NULL;
  nh_error_t err = { 0 };
  if (nh_pg_connect(fx->url, &c, &err)) FAIL("%s", err.msg);
  int rc = nh_pg_migrate(c, NULL, NULL, &err);
  PQfinish(c);
  if (rc) FAIL("migrate: %s", err.msg);
  fx->other = nh_pgtest_connect(fx->url);
  return fx;
}

static void fx_open_url(fx_t *fx, const char *url, nh_pg_link_opts_t o)
{
  o.on_state = on_state;
  o.data = fx;
  nh_error_t err = { 0 };
  if (nh_pg_link_open(&fx->loop, url, &o, &fx->link, &err)) FAIL("open: %s", err.msg);
}

/* Opens the link on the scratch database and waits until it is ready. */
static void fx_open(fx_t *fx, nh_pg_link_opts_t o)
{
  fx_open_url(fx, fx->url, o);
  ASSERT_EQ_INT(nh_pg_link_state(fx->link), NH_PG_LINK_CONNECTING);
  RUN_UNTIL(fx, is_ready, (void *)1, "the link to be ready");
}

/* Closes the test's own handles and the loop, once the link has closed: the loop must
 * close, so the link left no handle open. */
static void fx_end(fx_t *fx)
{
  ASSERT_TRUE(fx->closed);
  if (fx->silent) silent_free(fx->silent);
  fx->silent = NULL;
  uv_close((uv_handle_t *)&fx->deadline, NULL);
  uv_close((uv_handle_t *)&fx->tick, NULL);
  uv_run(&fx->loop, UV_RUN_DEFAULT);
  ASSERT_EQ_INT(uv_loop_close(&fx->loop), 0);
  nh_test_cancel_cleanup(fx_free, fx);
  capture_end(fx);
  free(fx);
}

/* Closes the link (its callbacks come from the loop, not inside close), then fx_end. */
static void fx_close(fx_t *fx)
{
  nh_pg_link_close(fx->link, on_closed, fx);
  ASSERT_FALSE(fx->closed);
  RUN_UNTIL(fx, is_closed, NULL, "the link to close");
  ASSERT_CONTAINS(fx->trace, "CLOSED closed");
  fx_end(fx);
}

/* The backend's wait, as pg_stat_activity shows it ("Lock" while it waits for one). */
static int waits_for_lock(fx_t *fx, void *arg)
{
  (void)arg;
  return fx->backend && !strcmp(nh_pgtest_q1(nh_pgtest_admin(), "SELECT wait_event_type FROM pg_stat_activity "
                                             "WHERE pid = %d", fx->backend), "Lock");
}

static int backend_gone(fx_t *fx, void *pid)
{
  return !strcmp(nh_pgtest_q1(nh_pgtest_admin(), "SELECT count(*) FROM pg_stat_activity WHERE pid = %d",
                              (int)(intptr_t)pid), "0");
}

static void terminate(fx_t *fx, int pid)
{
  ASSERT_EQ_STR(nh_pgtest_q1(nh_pgtest_admin(), "SELECT pg_terminate_backend(%d)", pid), "t");
  (void)fx;
}

/* ---------------------------------------------------------------- tests */

TEST(open_run_100_batches_in_a_row_then_close_every_handle)
{
  fx_t *fx = fx_new(1);
  fx_open(fx, (nh_pg_link_opts_t){ 0 });
  ASSERT_EQ_STR(fx->trace, "READY ");
  ASSERT_EQ_INT(nh_pg_link_error(fx->link)->code, 0);
  fx->jobs[0].chain = 99;   /* each done submits the next */
  submit_job(fx, 0, JOB_OK);
  ASSERT_EQ_INT(fx->jobs[0].built, 0);   /* built from the loop, not inside submit */
  RUN_UNTIL(fx, jobs_done, (void *)100, "100 batches");
  for (int i = 0; i < 100; i++) {
    job_t *j = &fx->jobs[i];
    if (j->outcome != NH_PG_COMMITTED || j->done != 1 || j->built != 1 || j->results != 2)
      FAIL("job %d: %s, done %d, built %d, %d results: %s", i, outcome_name(j->outcome), j->done, j->built,
           j->results, j->err);
  }
  ASSERT_EQ_STR(nh_pgtest_q1(fx->other, "SELECT count(*) FROM inbox"), "100");
  ASSERT_EQ_STR(nh_pgtest_q1(fx->other, "SELECT count(*) FROM history"), "100");
  /* one connection, each operation prepared once on it, one pipeline per batch */
  nh_pg_link_stats_t s;
  nh_pg_link_stats(fx->link, &s);
  ASSERT_EQ_INT(s.attempts, 1);
  ASSERT_EQ_INT(s.connects, 1);
  ASSERT_EQ_INT(s.batches, 100);
  ASSERT_EQ_INT(fx->db_stats.prepares, 2);
  ASSERT_EQ_INT(fx->db_stats.pipelines, 99);   /* seen by the 100th builder, before its own */
  fx_close(fx);
}

TEST(bad_url_options_and_channels_are_refused_at_once)
{
  fx_t *fx = fx_new(0);
  nh_pg_link_t *link = NULL;
  nh_error_t err = { 0 };
  ASSERT_EQ_INT(nh_pg_link_open(&fx->loop, "postgresql://u:secret@h:99999/db", NULL, &link, &err), NH_EUSAGE);
  ASSERT_CONTAINS(err.msg, "port \"99999\" is not a number from 1 to 65535");
  ASSERT_TRUE(strstr(err.msg, "secret") == NULL);
  ASSERT_NULL(link);
  nh_pg_link_opts_t o = { .batch_timeout_ms = -5 };
  ASSERT_EQ_INT(nh_pg_link_open(&fx->loop, nh_pgtest_server()->url, &o, &link, &err), NH_EUSAGE);
  ASSERT_CONTAINS(err.msg, "store link option batch_timeout_ms is -5: give a number of milliseconds above 0");
  o = (nh_pg_link_opts_t){ .max_waiting = -1 };
  ASSERT_EQ_INT(nh_pg_link_open(&fx->loop, nh_pgtest_server()->url, &o, &link, &err), NH_EUSAGE);
  ASSERT_CONTAINS(err.msg, "max_waiting is -1: give a number of batches above 0");
  o = (nh_pg_link_opts_t){ .backoff_first_ms = 6000 };
  ASSERT_EQ_INT(nh_pg_link_open(&fx->loop, nh_pgtest_server()->url, &o, &link, &err), NH_EUSAGE);
  ASSERT_CONTAINS(err.msg, "backoff_first_ms (6000) is above backoff_max_ms (5000)");
  ASSERT_NULL(link);
  /* nothing was left on the loop by the refusals */
  ASSERT_EQ_INT(uv_run(&fx->loop, UV_RUN_NOWAIT), 0);

  /* channels: checked at once, on a link that is still connecting */
  fx_open_url(fx, nh_pgtest_server()->url, (nh_pg_link_opts_t){ 0 });
  ASSERT_EQ_INT(nh_pg_link_listen(fx->link, "", on_note, fx, &err), NH_EUSAGE);
  ASSERT_CONTAINS(err.msg, "a channel name is 1 to 63 bytes of UTF-8");
  char longname[80];
  memset(longname, 'c', 64);
  longname[64] = '\0';
  ASSERT_EQ_INT(nh_pg_link_listen(fx->link, longname, on_note, fx, &err), NH_EUSAGE);
  ASSERT_EQ_INT(nh_pg_link_listen(fx->link, "bad\xff", on_note, fx, &err), NH_EUSAGE);
  ASSERT_EQ_INT(nh_pg_link_listen(fx->link, "nh_wake", NULL, fx, &err), NH_EUSAGE);
  ASSERT_CONTAINS(err.msg, "LISTEN on \"nh_wake\" needs a callback");
  ASSERT_EQ_INT(nh_pg_link_submit(fx->link, build_job, NULL, NULL, &err), NH_EUSAGE);
  ASSERT_CONTAINS(err.msg, "a batch needs a builder and a done callback");
  ASSERT_EQ_INT(nh_pg_link_listen(fx->link, "nh_wake", on_note, fx, &err), NH_OK);
  ASSERT_EQ_INT(nh_pg_link_listen(fx->link, "nh_wake", on_note, fx, &err), NH_EUSAGE);
  ASSERT_CONTAINS(err.msg, "channel \"nh_wake\" is listened to already");
  fx_close(fx);
}

TEST(failing_statement_or_builder_is_not_committed_and_the_next_batch_is)
{
  fx_t *fx = fx_new(1);
  fx_open(fx, (nh_pg_link_opts_t){ 0 });
  submit_job(fx, 0, JOB_FAILS);
  submit_job(fx, 1, JOB_OK);
  submit_job(fx, 2, JOB_GIVES_UP);
  submit_job(fx, 3, JOB_OK);
  RUN_UNTIL(fx, jobs_done, (void *)4, "4 batches");
  ASSERT_EQ_STR(fx->trace, "READY done:0:NOT_COMMITTED done:1:COMMITTED done:2:NOT_COMMITTED done:3:COMMITTED ");
  ASSERT_CONTAINS(fx->jobs[0].err, "null value in column \"status\" of relation \"audit\" violates not-null "
                                   "constraint (SQLSTATE 23502) while running statement 3 of a batch of 3 "
                                   "(audit_put); nothing of the batch was committed");
  ASSERT_EQ_INT(fx->jobs[0].results, 0);   /* result callbacks run for a committed batch only */
  ASSERT_EQ_STR(fx->jobs[2].err, "test: the builder of job 2 gives up");
  ASSERT_EQ_INT(fx->jobs[2].results, 0);
  for (int i = 0; i < 4; i++) REPORT_MATCHES(fx, i);
  ASSERT_EQ_INT(rows_of(fx, 0), 0);
  ASSERT_EQ_INT(rows_of(fx, 2), 0);
  /* the same connection all along: a failed batch does not cost it */
  nh_pg_link_stats_t s;
  nh_pg_link_stats(fx->link, &s);
  ASSERT_EQ_INT(s.connects, 1);
  ASSERT_EQ_INT(fx->lost, 0);
  fx_close(fx);
}

TEST(backend_terminated_while_idle_reconnects_with_one_warning_and_one_info_line)
{
  fx_t *fx = fx_new(1);
  fx_open(fx, (nh_pg_link_opts_t){ 0 });
  submit_job(fx, 0, JOB_OK);
  RUN_UNTIL(fx, job_done, &fx->jobs[0], "the first batch");
  int first = fx->backend;
  capture_start(fx);
  terminate(fx, first);
  RUN_UNTIL(fx, is_ready, (void *)2, "the link to be ready again");
  submit_job(fx, 1, JOB_OK);
  RUN_UNTIL(fx, job_done, &fx->jobs[1], "the batch after the reconnect");
  capture_end(fx);
  ASSERT_EQ_STR(fx->trace, "READY done:0:COMMITTED LOST READY done:1:COMMITTED ");
  ASSERT_CONTAINS(fx->state_err, "was lost while idle, after the server said \"terminating connection due to "
                                 "administrator command\" (SQLSTATE 57P01)");
  ASSERT_CONTAINS(fx->state_err, "is the server still running? `pg_isready");
  ASSERT_NE_INT(fx->jobs[1].backend, first);
  ASSERT_EQ_INT(rows_of(fx, 1), 2);
  /* a new executor for the new connection: the operations were prepared again on it */
  ASSERT_EQ_INT(fx->db_stats.prepares, 2);
  ASSERT_EQ_INT(fx->db_stats.pipelines, 0);
  ASSERT_EQ_INT(fx->jobs[1].results, 2);
  ASSERT_EQ_INT(log_lines(fx, " warn  [store]"), 1);
  ASSERT_EQ_INT(log_lines(fx, " info  [store]"), 1);
  ASSERT_EQ_INT(log_lines(fx, "[store] "), 2);
  ASSERT_EQ_INT(log_lines(fx, "57P01"), 1);
  ASSERT_EQ_INT(log_lines(fx, "; retrying (after 100 ms, doubling up to 5000 ms, jittered); batches wait"), 1);
  ASSERT_EQ_INT(log_lines(fx, "connected again at attempt 1, "), 1);   /* the first retry worked */
  nh_pg_link_stats_t s;
  nh_pg_link_stats(fx->link, &s);
  ASSERT_EQ_INT(s.losses, 1);
  ASSERT_EQ_INT(s.connects, 2);
  ASSERT_EQ_INT(nh_pg_link_error(fx->link)->code, 0);
  fx_close(fx);
}

TEST(backend_terminated_while_a_batch_waits_for_a_lock_is_reported_as_it_happened)
{
  fx_t *fx = fx_new(1);
  fx_open(fx, (nh_pg_link_opts_t){ 0 });
  submit_job(fx, 0, JOB_OK);   /* prepares the operations: the next batch waits in its statement */
  RUN_UNTIL(fx, job_done, &fx->jobs[0], "the first batch");
  PGconn *holder = hold_inbox(fx);
  submit_job(fx, 1, JOB_OK);
  RUN_UNTIL(fx, waits_for_lock, NULL, "the batch to wait for the lock");
  int pid = fx->backend;
  terminate(fx, pid);
  RUN_UNTIL(fx, job_done, &fx->jobs[1], "the batch's outcome");
  nh_pgtest_q1(holder, "ROLLBACK");
  RUN_UNTIL(fx, backend_gone, (void *)(intptr_t)pid, "the terminated backend to be gone");
  /* the server said why it stopped at the batch's first statement: nothing was committed */
  ASSERT_EQ_INT(fx->jobs[1].outcome, NH_PG_NOT_COMMITTED);
  ASSERT_CONTAINS(fx->jobs[1].err, "was lost while running statement 1 of a batch of 2 (inbox_add); nothing of the "
                                   "batch was committed (SQLSTATE 57P01: terminating connection due to administrator "
                                   "command)");
  REPORT_MATCHES(fx, 1);
  /* and the link carries on */
  RUN_UNTIL(fx, is_ready, (void *)2, "the link to be ready again");
  submit_job(fx, 2, JOB_OK);
  RUN_UNTIL(fx, job_done, &fx->jobs[2], "the batch after the reconnect");
  ASSERT_EQ_STR(fx->trace, "READY done:0:COMMITTED done:1:NOT_COMMITTED LOST READY done:2:COMMITTED ");
  REPORT_MATCHES(fx, 2);
  fx_close(fx);
}

TEST(backend_terminated_inside_commit_is_unknown_and_nothing_is_half_written)
{
  fx_t *fx = fx_new(1);
  /* a deferred trigger that waits, at COMMIT, for an advisory lock another session holds */
  nh_pgtest_q1(fx->other, "CREATE FUNCTION nh_test_wait() RETURNS trigger LANGUAGE plpgsql AS "
                          "$$BEGIN PERFORM pg_advisory_xact_lock(4242); RETURN NULL; END$$");
  nh_pgtest_q1(fx->other, "CREATE CONSTRAINT TRIGGER nh_test_wait AFTER INSERT ON history DEFERRABLE INITIALLY "
                          "DEFERRED FOR EACH ROW EXECUTE FUNCTION nh_test_wait()");
  fx_open(fx, (nh_pg_link_opts_t){ 0 });
  PGconn *holder = nh_pgtest_connect(fx->url);
  nh_pgtest_q1(holder, "SELECT pg_advisory_lock(4242)");
  submit_job(fx, 0, JOB_OK);
  RUN_UNTIL(fx, waits_for_lock, NULL, "the batch's COMMIT to wait for the lock");
  int pid = fx->backend;
  terminate(fx, pid);
  RUN_UNTIL(fx, job_done, &fx->jobs[0], "the batch's outcome");
  nh_pgtest_q1(holder, "SELECT pg_advisory_unlock(4242)");
  RUN_UNTIL(fx, backend_gone, (void *)(intptr_t)pid, "the terminated backend to be gone");
  /* the server ended the connection while running COMMIT: the link cannot know */
  ASSERT_EQ_INT(fx->jobs[0].outcome, NH_PG_UNKNOWN);
  ASSERT_CONTAINS(fx->jobs[0].err, "was lost while committing a batch of 2 statements; whether it was committed is "
                                   "unknown: read the rows back to know (SQLSTATE 57P01");
  REPORT_MATCHES(fx, 0);
  printf("  terminated inside COMMIT: reported UNKNOWN; the database holds %d of its 2 rows\n", rows_of(fx, 0));
  fx_close(fx);
}

TEST(batch_deadline_drops_the_connection_and_says_unknown)
{
  fx_t *fx = fx_new(1);
  fx_open(fx, (nh_pg_link_opts_t){ .batch_timeout_ms = 300 });
  submit_job(fx, 0, JOB_OK);
  RUN_UNTIL(fx, job_done, &fx->jobs[0], "the first batch");
  int pid = fx->backend;
  PGconn *holder = hold_inbox(fx);
  submit_job(fx, 1, JOB_OK);
  RUN_UNTIL(fx, job_done, &fx->jobs[1], "the batch's deadline");
  /* its COMMIT was sent, and no answer says the server stopped before it */
  ASSERT_EQ_INT(fx->jobs[1].outcome, NH_PG_UNKNOWN);
  ASSERT_CONTAINS(fx->jobs[1].err, "no answer to a batch within 300 ms (batch_timeout_ms): the connection was "
                                   "dropped, and whether the batch was committed is unknown");
  RUN_UNTIL(fx, is_ready, (void *)2, "the link to be ready again");
  ASSERT_CONTAINS(fx->state_err, "no answer to a batch within 300 ms");
  /* the dropped backend still holds the batch: let it go on, and see it end all or nothing */
  nh_pgtest_q1(holder, "ROLLBACK");
  RUN_UNTIL(fx, backend_gone, (void *)(intptr_t)pid, "the dropped backend to be gone");
  REPORT_MATCHES(fx, 1);
  printf("  dropped at its deadline: reported UNKNOWN; the database holds %d of its 2 rows\n", rows_of(fx, 1));
  submit_job(fx, 2, JOB_OK);
  RUN_UNTIL(fx, job_done, &fx->jobs[2], "the batch after the reconnect");
  ASSERT_EQ_STR(fx->trace, "READY done:0:COMMITTED done:1:UNKNOWN LOST READY done:2:COMMITTED ");
  fx_close(fx);
}

/* ---- a server that never answers */

static void on_silent_closed(uv_handle_t *h) { free(h); }

static void on_peer(uv_stream_t *server, int status)
{
  silent_t *s = server->data;
  if (status < 0 || s->accepted >= MAX_PEERS) return;
  uv_tcp_t *peer = nh_xmalloc(sizeof *peer);
  uv_tcp_init(server->loop, peer);
  if (uv_accept(server, (uv_stream_t *)peer) != 0) {
    uv_close((uv_handle_t *)peer, on_silent_closed);
    return;
  }
  s->peers[s->accepted++] = peer;   /* kept open, never read nor written */
}

static silent_t *silent_start(fx_t *fx)
{
  silent_t *s = nh_xcalloc(1, sizeof *s);
  fx->silent = s;
  uv_tcp_init(&fx->loop, &s->server);
  s->server.data = s;
  struct sockaddr_in addr;
  uv_ip4_addr("127.0.0.1", 0, &addr);
  ASSERT_EQ_INT(uv_tcp_bind(&s->server, (const struct sockaddr *)&addr, 0), 0);
  ASSERT_EQ_INT(uv_listen((uv_stream_t *)&s->server, 16, on_peer), 0);
  struct sockaddr_storage name;
  int len = sizeof name;
  ASSERT_EQ_INT(uv_tcp_getsockname(&s->server, (struct sockaddr *)&name, &len), 0);
  s->port = ntohs(((struct sockaddr_in *)&name)->sin_port);
  return s;
}

static void on_server_closed(uv_handle_t *h) { free(h->data); }

static void silent_free(silent_t *s)
{
  for (int i = 0; i < s->accepted; i++) uv_close((uv_handle_t *)s->peers[i], on_silent_closed);
  uv_close((uv_handle_t *)&s->server, on_server_closed);
}

static int accepted_reach(fx_t *fx, void *n) { return fx->silent->accepted >= (int)(intptr_t)n; }

TEST(server_that_never_answers_hits_the_connect_deadline_then_retries_with_backoff)
{
  fx_t *fx = fx_new(0);
  silent_t *s = silent_start(fx);
  char port[16];
  snprintf(port, sizeof port, "%d", s->port);
  capture_start(fx);
  fx_open_url(fx, nh_pgtest_url("host", "127.0.0.1", "port", port, "connect_timeout", "1", NULL),
              (nh_pg_link_opts_t){ 0 });
  submit_job(fx, 0, JOB_OK);   /* waits for a connection */
  RUN_UNTIL(fx, is_lost, (void *)1, "the first attempt's deadline");
  char want[128];
  snprintf(want, sizeof want, "no answer from 127.0.0.1:%d within 1 s (connect_timeout)", s->port);
  ASSERT_CONTAINS(fx->state_err, want);
  ASSERT_EQ_INT(nh_pg_link_state(fx->link), NH_PG_LINK_LOST);
  /* the attempts go on, each to its deadline, with a backoff between them */
  RUN_UNTIL(fx, accepted_reach, (void *)3, "three connections to the silent server");
  RUN_UNTIL(fx, attempts_reach, (void *)3, "three attempts");
  nh_pg_link_stats_t st;
  nh_pg_link_stats(fx->link, &st);
  ASSERT_CMP_INT(st.attempts, >, 1);
  ASSERT_EQ_INT(st.connects, 0);
  ASSERT_EQ_INT(st.losses, 1);
  ASSERT_CONTAINS(nh_pg_link_error(fx->link)->msg, want);
  ASSERT_EQ_INT(fx->jobs[0].built, 0);
  ASSERT_EQ_INT(fx->jobs[0].done, 0);
  capture_end(fx);
  /* one LOST, one warning, for the whole outage */
  ASSERT_EQ_STR(fx->trace, "LOST ");
  ASSERT_EQ_INT(log_lines(fx, " warn  [store]"), 1);
  ASSERT_EQ_INT(log_lines(fx, "[store] "), 1);
  /* closing while the link retries: the waiting batch is told, every handle closes */
  fx_close(fx);
}

TEST(close_during_an_attempt_or_its_backoff_tells_the_waiting_batches)
{
  for (int during_attempt = 0; during_attempt < 2; during_attempt++) {
    fx_t *fx = fx_new(0);
    silent_t *s = silent_start(fx);
    char port[16];
    snprintf(port, sizeof port, "%d", s->port);
    capture_start(fx);
    /* closed in the attempt (long before its deadline), or in the backoff after it */
    fx_open_url(fx, nh_pgtest_url("host", "127.0.0.1", "port", port, "connect_timeout", during_attempt ? "60" : "1",
                                  NULL), (nh_pg_link_opts_t){ .backoff_first_ms = 5000 });
    submit_job(fx, 0, JOB_OK);
    submit_job(fx, 1, JOB_OK);
    if (during_attempt) RUN_UNTIL(fx, accepted_reach, (void *)1, "the attempt to reach the silent server");
    else RUN_UNTIL(fx, is_lost, (void *)1, "the first attempt's deadline");
    nh_pg_link_stats_t st;
    nh_pg_link_stats(fx->link, &st);
    ASSERT_EQ_INT(st.attempts, 1);
    nh_pg_link_close(fx->link, on_closed, fx);
    nh_error_t err = { 0 };
    ASSERT_EQ_INT(try_submit(fx, 2, JOB_OK, &err), NH_ESTATE);
    ASSERT_CONTAINS(err.msg, "the link to the store is closing: the batch was not queued");
    ASSERT_EQ_INT(nh_pg_link_listen(fx->link, "nh_wake", on_note, fx, &err), NH_ESTATE);
    ASSERT_EQ_INT(fx->jobs[0].done, 0);   /* told from the loop */
    RUN_UNTIL(fx, is_closed, NULL, "the link to close");
    ASSERT_EQ_STR(fx->trace, during_attempt ? "done:0:NOT_COMMITTED done:1:NOT_COMMITTED CLOSED closed"
                                            : "LOST done:0:NOT_COMMITTED done:1:NOT_COMMITTED CLOSED closed");
    ASSERT_CONTAINS(fx->jobs[1].err, "the link to the store was closed before the batch was sent: nothing of it was "
                                     "committed");
    ASSERT_EQ_INT(fx->jobs[0].built, 0);
    fx_end(fx);
  }
}

TEST(listen_notify_across_a_reconnect)
{
  fx_t *fx = fx_new(1);
  fx_open_url(fx, fx->url, (nh_pg_link_opts_t){ 0 });
  nh_error_t err = { 0 };
  if (nh_pg_link_listen(fx->link, "nh_wake", on_note, fx, &err)) FAIL("%s", err.msg);
  RUN_UNTIL(fx, is_ready, (void *)1, "the link to be ready");
  nh_pgtest_q1(fx->other, "SELECT pg_notify('nh_wake', 'p1')");
  RUN_UNTIL(fx, notes_reach, (void *)1, "the first notification");
  ASSERT_EQ_STR(fx->notes[0], "nh_wake:p1");
  /* a channel added on a ready link, named with capitals and a quote (kept as they are) */
  if (nh_pg_link_listen(fx->link, "Nh \"Other\"", on_note, fx, &err)) FAIL("%s", err.msg);
  submit_job(fx, 0, JOB_OK);   /* after the LISTEN: once it is done, the channel is listened to */
  RUN_UNTIL(fx, job_done, &fx->jobs[0], "a batch");
  nh_pgtest_q1(fx->other, "SELECT pg_notify('Nh \"Other\"', 'p2')");
  RUN_UNTIL(fx, notes_reach, (void *)2, "the second notification");
  ASSERT_EQ_STR(fx->notes[1], "Nh \"Other\":p2");
  /* the connection goes: both channels are listened to again on the next one */
  terminate(fx, fx->backend);
  RUN_UNTIL(fx, is_ready, (void *)2, "the link to be ready again");
  nh_pgtest_q1(fx->other, "SELECT pg_notify('nh_wake', 'p3')");
  nh_pgtest_q1(fx->other, "SELECT pg_notify('Nh \"Other\"', '')");
  nh_pgtest_q1(fx->other, "SELECT pg_notify('nh_unheard', 'x')");
  RUN_UNTIL(fx, notes_reach, (void *)4, "the notifications after the reconnect");
  ASSERT_EQ_STR(fx->notes[2], "nh_wake:p3");
  ASSERT_EQ_STR(fx->notes[3], "Nh \"Other\":");
  nh_pg_link_stats_t s;
  nh_pg_link_stats(fx->link, &s);
  ASSERT_EQ_INT(s.notifies, 4);
  ASSERT_EQ_INT(fx->nnotes, 4);
  fx_close(fx);
}

TEST(batches_wait_while_the_store_cannot_be_reached_up_to_the_bound_then_run_in_order)
{
  fx_t *fx = fx_new(1);
  const char *db = PQdb(fx->other);
  nh_pgtest_admin_sql("ALTER DATABASE \"%s\" ALLOW_CONNECTIONS false", db);
  fx_open_url(fx, fx->url, (nh_pg_link_opts_t){ .backoff_max_ms = 200 });
  RUN_UNTIL(fx, is_lost, (void *)1, "the first attempt to be refused");
  ASSERT_CONTAINS(fx->state_err, "is not currently accepting connections");
  for (int i = 0; i < NH_PG_LINK_MAX_WAITING; i++) submit_job(fx, i, JOB_OK);
  nh_error_t err = { 0 };
  ASSERT_EQ_INT(try_submit(fx, NH_PG_LINK_MAX_WAITING, JOB_OK, &err), NH_ESTATE);
  ASSERT_CONTAINS(err.msg, "64 batches already wait for the store (max_waiting), which cannot be reached now: this "
                           "one was not queued; submit it again once some are done");
  RUN_UNTIL(fx, attempts_reach, (void *)4, "more attempts");
  ASSERT_EQ_INT(fx->jobs[0].built, 0);
  nh_pgtest_admin_sql("ALTER DATABASE \"%s\" ALLOW_CONNECTIONS true", db);
  capture_start(fx);
  RUN_UNTIL(fx, jobs_done, (void *)NH_PG_LINK_MAX_WAITING, "the waiting batches");
  capture_end(fx);
  ASSERT_EQ_INT(log_lines(fx, " info  [store]"), 1);
  ASSERT_EQ_INT(log_lines(fx, "[store] "), 1);
  ASSERT_EQ_INT(log_lines(fx, ": connected at attempt "), 1);   /* never connected before: not "again" */
  char want[4096] = "LOST READY ";
  for (int i = 0; i < NH_PG_LINK_MAX_WAITING; i++)
    snprintf(want + strlen(want), sizeof want - strlen(want), "done:%d:COMMITTED ", i);
  ASSERT_EQ_STR(fx->trace, want);
  ASSERT_EQ_STR(nh_pgtest_q1(fx->other, "SELECT count(*) FROM inbox"), "64");
  /* room again */
  submit_job(fx, NH_PG_LINK_MAX_WAITING, JOB_OK);
  RUN_UNTIL(fx, job_done, &fx->jobs[NH_PG_LINK_MAX_WAITING], "one more batch");
  ASSERT_EQ_INT(fx->jobs[NH_PG_LINK_MAX_WAITING].outcome, NH_PG_COMMITTED);
  fx_close(fx);
}

TEST(store_of_another_schema_version_stops_the_link)
{
  fx_t *fx = fx_new(1);
  nh_pgtest_q1(fx->other, "UPDATE nimbus_schema SET version = 99");
  fx_open_url(fx, fx->url, (nh_pg_link_opts_t){ 0 });
  submit_job(fx, 0, JOB_OK);
  RUN_UNTIL(fx, is_failed, NULL, "the link to give up");
  ASSERT_CONTAINS(fx->state_err, "the store's schema is version 99, newer than this nimbus-host knows");
  RUN_UNTIL(fx, job_done, &fx->jobs[0], "the waiting batch");
  ASSERT_EQ_STR(fx->trace, "FAILED done:0:NOT_COMMITTED ");
  ASSERT_CONTAINS(fx->jobs[0].err, "newer than this nimbus-host knows");
  nh_error_t err = { 0 };
  ASSERT_EQ_INT(try_submit(fx, 1, JOB_OK, &err), NH_ESTATE);
  ASSERT_CONTAINS(err.msg, "newer than this nimbus-host knows");
  ASSERT_CONTAINS(err.msg, "the batch was not queued");
  ASSERT_EQ_INT(nh_pg_link_listen(fx->link, "nh_wake", on_note, fx, &err), NH_ESTATE);
  fx_close(fx);

  /* a database with no store at all */
  fx = fx_new(1);
  nh_pgtest_q1(fx->other, "DROP TABLE nimbus_schema");
  fx_open_url(fx, fx->url, (nh_pg_link_opts_t){ 0 });
  RUN_UNTIL(fx, is_failed, NULL, "the link to give up");
  ASSERT_CONTAINS(fx->state_err, "the database holds no nimbus-host store (no schema version)");
  fx_close(fx);
}

TEST(close_with_a_batch_in_flight_reports_it_first_and_leaves_no_handle)
{
  fx_t *fx = fx_new(1);
  fx_open(fx, (nh_pg_link_opts_t){ 0 });
  submit_job(fx, 0, JOB_OK);
  RUN_UNTIL(fx, job_done, &fx->jobs[0], "the first batch");
  int pid = fx->backend;
  PGconn *holder = hold_inbox(fx);
  submit_job(fx, 1, JOB_OK);
  submit_job(fx, 2, JOB_OK);
  RUN_UNTIL(fx, waits_for_lock, NULL, "the batch to wait for the lock");
  nh_pg_link_close(fx->link, on_closed, fx);
  ASSERT_EQ_INT(fx->jobs[1].done, 0);   /* told from the loop */
  RUN_UNTIL(fx, is_closed, NULL, "the link to close");
  ASSERT_EQ_STR(fx->trace, "READY done:0:COMMITTED done:1:UNKNOWN done:2:NOT_COMMITTED CLOSED closed");
  ASSERT_CONTAINS(fx->jobs[1].err, "the link to the store was closed while a batch waited for its result: whether "
                                   "it was committed is unknown");
  ASSERT_EQ_INT(fx->jobs[2].built, 0);
  nh_pgtest_q1(holder, "ROLLBACK");
  RUN_UNTIL(fx, backend_gone, (void *)(intptr_t)pid, "the dropped backend to be gone");
  REPORT_MATCHES(fx, 1);
  ASSERT_EQ_INT(rows_of(fx, 2), 0);
  fx_end(fx);
}

/* ---- what each connection carries: the server's timeouts and TCP keepalives */

/* A trigger that records, for each inbox row a batch writes, the settings its session runs
 * under: what the server took from the link's connection (pg_settings, in milliseconds). */
static void seen_install(fx_t *fx)
{
  nh_pgtest_q1(fx->other, "CREATE TABLE nh_test_seen (message_id text PRIMARY KEY, pid int, settings text)");
  nh_pgtest_q1(fx->other, "CREATE FUNCTION nh_test_seen() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN "
                          "INSERT INTO nh_test_seen SELECT NEW.message_id, pg_backend_pid(), "
                          "string_agg(name || '=' || setting, ' ' ORDER BY name) FROM pg_settings WHERE name IN "
                          "('statement_timeout', 'idle_in_transaction_session_timeout', 'lock_timeout'); "
                          "RETURN NULL; END$$");
  nh_pgtest_q1(fx->other, "CREATE TRIGGER nh_test_seen AFTER INSERT ON inbox FOR EACH ROW EXECUTE FUNCTION "
                          "nh_test_seen()");
}

/* The settings job `id`'s batch ran under, checked to come from the backend that built it. */
static const char *seen_at(fx_t *fx, int id, const char *file, int line)
{
  const char *pid = nh_pgtest_q1(fx->other, "SELECT pid FROM nh_test_seen WHERE message_id = 'm-%d'", id);
  if (atoi(pid) != fx->jobs[id].backend)
    nh_test_fail(file, line, "job %d: recorded by backend %s, built on %d", id, pid, fx->jobs[id].backend);
  return nh_pgtest_q1(fx->other, "SELECT settings FROM nh_test_seen WHERE message_id = 'm-%d'", id);
}
#define SEEN(fx, id) seen_at(fx, id, __FILE__, __LINE__)

#ifdef TCP_USER_TIMEOUT
#define USER_TIMEOUT " user_timeout=25000"
#else
#define USER_TIMEOUT ""
#endif

TEST(every_connection_bounds_statements_and_idle_transactions_beyond_the_deadline_and_keeps_tcp_alive)
{
  fx_t *fx = fx_new(1);
  seen_install(fx);
  fx_open(fx, (nh_pg_link_opts_t){ .batch_timeout_ms = 2000 });
  submit_job(fx, 0, JOB_OK);
  RUN_UNTIL(fx, job_done, &fx->jobs[0], "a batch");
  ASSERT_EQ_INT(fx->jobs[0].outcome, NH_PG_COMMITTED);
  ASSERT_EQ_STR(SEEN(fx, 0), "idle_in_transaction_session_timeout=5000 lock_timeout=0 statement_timeout=3000");
  ASSERT_EQ_STR(fx->tcp, "keepalive=1 idle=10 interval=5 count=3" USER_TIMEOUT);
  /* and the next connection, after a loss, carries the same */
  terminate(fx, fx->backend);
  RUN_UNTIL(fx, is_ready, (void *)2, "the link to be ready again");
  memset(fx->tcp, 0, sizeof fx->tcp);
  submit_job(fx, 1, JOB_OK);
  RUN_UNTIL(fx, job_done, &fx->jobs[1], "the batch after the reconnect");
  ASSERT_NE_INT(fx->jobs[1].backend, fx->jobs[0].backend);
  ASSERT_EQ_STR(SEEN(fx, 1), "idle_in_transaction_session_timeout=5000 lock_timeout=0 statement_timeout=3000");
  ASSERT_EQ_STR(fx->tcp, "keepalive=1 idle=10 interval=5 count=3" USER_TIMEOUT);
  fx_close(fx);

  /* from the default deadline (30 s): 1 s and 3 s beyond it */
  char extra[512];
  nh_pg_link_conninfo(0, extra, sizeof extra);
  ASSERT_CONTAINS(extra, "options='-c statement_timeout=31000 -c idle_in_transaction_session_timeout=33000'");
  ASSERT_CONTAINS(extra, "keepalives=1 keepalives_idle=10 keepalives_interval=5 keepalives_count=3");
  /* no more than the server takes: an int of milliseconds */
  nh_pg_link_conninfo(2147483000, extra, sizeof extra);
  ASSERT_CONTAINS(extra, "statement_timeout=2147483647 -c idle_in_transaction_session_timeout=2147483647'");
}

static void unset_pgoptions(void *arg)
{
  (void)arg;
  unsetenv("PGOPTIONS");
}

TEST(settings_the_url_or_pgoptions_make_win_and_the_links_fill_in_the_rest)
{
  /* options=-c%20statement_timeout%3D123... and keepalives_idle=42 in the URL */
  fx_t *fx = fx_new(1);
  seen_install(fx);
  const char *url = nh_pgtest_url("dbname", PQdb(fx->other), "options", "-c statement_timeout=123 -c lock_timeout=4567",
                                  "keepalives_idle", "42", NULL);
  ASSERT_CONTAINS(url, "options=-c%20statement_timeout%3D123");
  /* what libpq cannot take is refused before connecting (only nimbus-host writes these) */
  PGconn *c = NULL;
  nh_error_t err = { 0 };
  ASSERT_EQ_INT(nh_pg_connect_with(url, "keepalives_idel=10", &c, &err), NH_EUSAGE);
  ASSERT_CONTAINS(err.msg, "connection settings \"keepalives_idel=10\" (a bug of nimbus-host): invalid connection "
                           "option \"keepalives_idel\"");
  ASSERT_NULL(c);
  fx_open_url(fx, url, (nh_pg_link_opts_t){ .batch_timeout_ms = 2000 });
  RUN_UNTIL(fx, is_ready, (void *)1, "the link to be ready");
  submit_job(fx, 0, JOB_OK);
  RUN_UNTIL(fx, job_done, &fx->jobs[0], "a batch");
  ASSERT_EQ_INT(fx->jobs[0].outcome, NH_PG_COMMITTED);
  ASSERT_EQ_STR(SEEN(fx, 0), "idle_in_transaction_session_timeout=5000 lock_timeout=4567 statement_timeout=123");
  ASSERT_EQ_STR(fx->tcp, "keepalive=1 idle=42 interval=5 count=3" USER_TIMEOUT);
  fx_close(fx);

  /* a URL without options: PGOPTIONS, which libpq reads only then, is kept as well */
  fx = fx_new(1);
  seen_install(fx);
  nh_test_on_cleanup(unset_pgoptions, NULL);
  setenv("PGOPTIONS", "-c lock_timeout=999", 1);
  fx_open(fx, (nh_pg_link_opts_t){ .batch_timeout_ms = 2000 });
  submit_job(fx, 0, JOB_OK);
  RUN_UNTIL(fx, job_done, &fx->jobs[0], "a batch");
  unsetenv("PGOPTIONS");
  nh_test_cancel_cleanup(unset_pgoptions, NULL);
  ASSERT_EQ_STR(SEEN(fx, 0), "idle_in_transaction_session_timeout=5000 lock_timeout=999 statement_timeout=3000");
  fx_close(fx);
}

TEST(a_batch_dropped_at_its_deadline_is_ended_by_the_server_while_its_lock_is_still_held)
{
  fx_t *fx = fx_new(1);
  fx_open(fx, (nh_pg_link_opts_t){ .batch_timeout_ms = 500 });
  submit_job(fx, 0, JOB_OK);   /* prepares the operations: the next batch waits in its statement */
  RUN_UNTIL(fx, job_done, &fx->jobs[0], "the first batch");
  PGconn *holder = hold_inbox(fx);
  submit_job(fx, 1, JOB_OK);
  RUN_UNTIL(fx, waits_for_lock, NULL, "the batch to wait for the lock");
  int pid = fx->backend;
  RUN_UNTIL(fx, job_done, &fx->jobs[1], "the batch's deadline");
  ASSERT_EQ_INT(fx->jobs[1].outcome, NH_PG_UNKNOWN);
  /* the link has let the connection go; the server, which does not read the socket while
   * the backend waits for the lock, ends it at statement_timeout (1.5 s): the lock is
   * still held, nothing else would */
  int64_t dropped = nh_test_mono_ms();
  RUN_UNTIL(fx, backend_gone, (void *)(intptr_t)pid, "the server to end the dropped batch's backend");
  int64_t took = nh_test_mono_ms() - dropped;
  ASSERT_EQ_INT(PQtransactionStatus(holder), PQTRANS_INTRANS);
  nh_pgtest_q1(holder, "ROLLBACK");
  ASSERT_EQ_INT(rows_of(fx, 1), 0);
  printf("  dropped at its 500 ms deadline: the server ended its backend %lld ms later, the lock still held\n",
         (long long)took);
  fx_close(fx);
}

static void pq_finish(void *c) { PQfinish(c); }

enum { SAID_LEN = 256 };

static void keep_notice(void *arg, const PGresult *res)
{
  const char *msg = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
  const char *code = PQresultErrorField(res, PG_DIAG_SQLSTATE);
  snprintf(arg, SAID_LEN, "%s (SQLSTATE %s)", msg ? msg : "", code ? code : "none");
}

TEST(a_transaction_left_idle_on_the_links_settings_is_ended_by_the_server)
{
  fx_t *fx = fx_new(1);
  /* a backend of the link's own making (its settings for a 100 ms deadline) whose client
   * opens a transaction, takes a lock, then neither sends nor reads */
  char extra[512];
  PGconn *c = NULL;
  nh_error_t err = { 0 };
  if (nh_pg_connect_with(fx->url, nh_pg_link_conninfo(100, extra, sizeof extra), &c, &err)) FAIL("%s", err.msg);
  nh_test_on_cleanup(pq_finish, c);
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SHOW statement_timeout"), "1100ms");
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SHOW idle_in_transaction_session_timeout"), "3100ms");
  char said[SAID_LEN] = "";
  PQsetNoticeReceiver(c, keep_notice, said);
  nh_pgtest_q1(c, "BEGIN");
  nh_pgtest_q1(c, "LOCK TABLE inbox IN SHARE MODE");
  int pid = PQbackendPID(c);
  ASSERT_EQ_STR(nh_pgtest_q1(nh_pgtest_admin(), "SELECT state FROM pg_stat_activity WHERE pid = %d", pid),
                "idle in transaction");
  RUN_UNTIL(fx, backend_gone, (void *)(intptr_t)pid, "the server to end the idle transaction");
  /* the server said why before closing (libpq hands an error outside a query to the
   * notice receiver, once asked to parse what it read), and the session is over */
  PQconsumeInput(c);
  PQisBusy(c);
  ASSERT_CONTAINS(said, "terminating connection due to idle-in-transaction timeout (SQLSTATE 25P03)");
  PGresult *r = PQexec(c, "SELECT 1");
  ASSERT_NE_INT(PQresultStatus(r), PGRES_TUPLES_OK);
  PQclear(r);
  /* its lock went with it */
  nh_pgtest_q1(fx->other, "BEGIN");
  nh_pgtest_q1(fx->other, "LOCK TABLE inbox IN ACCESS EXCLUSIVE MODE NOWAIT");
  nh_pgtest_q1(fx->other, "ROLLBACK");
  nh_test_cancel_cleanup(pq_finish, c);
  PQfinish(c);
  fx->closed = 1;   /* no link here */
  fx_end(fx);
}

/* ---------------------------------------------------------------- main */

NH_PGTEST_MAIN()
