/* End-to-end tests of dispatch/ with a real Lua VM, the embedded transport and the
 * store (docs/design.md section 6). Each test writes a small adapter into its temp dir,
 * enqueues messages through transport->vt->send inside a store transaction and runs
 * the uv loop until a condition on the store holds (with a deadline, no fixed sleeps).
 * Handlers append a line to a log file per call, so tests count handler runs.
 *
 * NH_TEST_STORE_PG=1 runs them on a PostgreSQL store instead (a scratch database of the
 * test cluster per test, nh_pgtest.h): the dispatcher on the link (nh_dispatch_init_pg),
 * the embedded queue on PostgreSQL (nh_embedded_pg.c); messages are enqueued and the store
 * looked at through blocking connections of the test's own. ctest's test_dispatch_pg
 * names the tests that run so (the rest use what is not built on PostgreSQL yet). */
#include "nh_test.h"
#include "nh_test_sql.h"
#include "nh_pgtest.h"

#include "core/nh_log.h"
#include "core/nh_metrics.h"
#include "core/nh_runtime.h"
#include "core/nh_util.h"
#include "dispatch/nh_dispatch.h"
#include "lua/nh_vm.h"
#include "store/nh_pg.h"
#include "store/nh_pg_link.h"
#include "store/nh_pg_ops.h"
#include "store/nh_pg_queue.h"
#include "store/nh_store.h"
#include "transport/nh_embedded.h"

#include <sqlite3.h>
#include <stdarg.h>
#include <uv.h>

#define WAIT_MS 15000

/* ---------------------------------------------------------------- fixture */

typedef struct env {
  nh_runtime_t rt;   /* its loop: rt.loop */
  nh_store_t *store;
  nh_transport_t *tr;
  nh_dispatch_t *d;
  int stopped;
  int loop_ok;
  char log[PATH_MAX + 64];
  /* NH_TEST_STORE_PG */
  int pg;
  nh_pg_link_t *link;
  int link_closed;
  nh_pg_db_t *pgdb;   /* blocking: enqueueing, the store's rows */
  PGconn *look;       /* blocking: the tests' own SQL */
  const char *url_for_link;
} env_t;

static int pg_mode(void)
{
  const char *v = getenv("NH_TEST_STORE_PG");
  return v && *v && strcmp(v, "0") != 0;
}

/* Every adapter starts with this: `nimbus`, and record(s) appending a line to LOG. */
static const char *const prelude =
  "local nimbus = require('nimbus')\n"
  "local LOG = [[%s]]\n"
  "local function record(s)\n"
  "  local f = assert(io.open(LOG, 'a'))\n"
  "  f:write(tostring(s), '\\n')\n"
  "  f:close()\n"
  "end\n";

/* Also ends the loop turn: on PostgreSQL the stop may complete in a timer's callback (the
 * link ends a batch in its kick timer), and a UV_RUN_ONCE turn that ran timers first
 * still blocks in its poll, which nothing else might end once the dispatcher stopped. */
static void on_stopped(void *data)
{
  env_t *e = data;
  e->stopped = 1;
  uv_stop(&e->rt.loop);
}
static void on_link_closed(void *data) { ((env_t *)data)->link_closed = 1; }

/* Runs the loop until its last handle is closed and its last piece of worker-thread work
 * (a WAL checkpoint) is back, with a deadline so a leaked handle fails the test instead
 * of hanging it (uv_loop_close then says EBUSY). */
static void loop_finish(uv_loop_t *loop)
{
  int64_t deadline = nh_test_mono_ms() + 10000;
  while (uv_run(loop, UV_RUN_ONCE) && nh_test_mono_ms() < deadline) {
  }
}

/* Stops and frees everything; returns nh_runtime_close's result. Never asserts: it also
 * runs as the cleanup of a failed test, with tasks possibly still suspended. */
static int env_teardown(env_t *e)
{
  int rc = 0;
  if (e->d) {
    e->stopped = 0;
    nh_dispatch_stop(e->d, 0, on_stopped, e);
    int64_t deadline = nh_test_mono_ms() + WAIT_MS;
    while (!e->stopped && nh_test_mono_ms() < deadline) uv_run(&e->rt.loop, UV_RUN_ONCE);
    nh_dispatch_close(e->d);
    e->d = NULL;
  }
  if (e->link) nh_pg_link_close(e->link, on_link_closed, e);   /* after the dispatcher, whose unit uses it */
  e->link = NULL;
  if (e->loop_ok) loop_finish(&e->rt.loop);
  if (e->tr) e->tr->vt->close(e->tr);
  e->tr = NULL;
  nh_store_close(e->store);
  e->store = NULL;
  nh_pg_db_free(e->pgdb);
  e->pgdb = NULL;
  if (e->loop_ok) rc = nh_runtime_close(&e->rt);
  e->loop_ok = 0;
  nh_log_set_level(NH_LOG_INFO);
  return rc;
}

static void env_cleanup(void *arg)
{
  env_teardown(arg);
  free(arg);
}

/* The PostgreSQL store: a scratch database (dropped after the test: made before the
 * env's cleanup is registered, so that cleanup runs first), migrated, with the link, the
 * queue transport and the test's own connections. */
static void env_pg(env_t *e)
{
  const char *url = nh_pgtest_scratch_url();
  nh_error_t err = {0};
  PGconn *c = PQconnectdb(url);
  int from = 0, to = 0;
  if (nh_pg_migrate(c, &from, &to, &err)) FAIL("migrate: %s", err.msg);
  e->pgdb = nh_pg_db_new(c);
  e->look = nh_pgtest_connect(url);
  e->pg = 1;
  e->url_for_link = url;
}

/* The prelude and body as the test dir's file `name`; its path. */
static const char *write_adapter(env_t *e, const char *name, const char *body)
{
  size_t n = strlen(prelude) + strlen(e->log) + strlen(body) + 1;
  char *src = malloc(n);
  snprintf(src, n, prelude, e->log);
  strcat(src, body);
  const char *adapter = nh_test_path(name);
  int wrc = nh_test_write_file(adapter, src);
  free(src);
  if (wrc) FAIL("cannot write %s", adapter);
  return adapter;
}

static env_t *env_start(const char *adapter_body)
{
  env_t *e = calloc(1, sizeof *e);
  if (pg_mode()) env_pg(e);
  nh_test_on_cleanup(env_cleanup, e);
  if (!getenv("NH_TEST_VERBOSE")) nh_log_set_level(NH_LOG_ERROR);
  snprintf(e->log, sizeof e->log, "%s", nh_test_path("calls.log"));
  const char *adapter = write_adapter(e, "adapter.lua", adapter_body);

  nh_error_t err = {0};
  if (e->pg) {
    ASSERT_EQ_INT(nh_runtime_init(&e->rt), 0);
    e->loop_ok = 1;
    if (nh_pg_link_open(&e->rt.loop, e->url_for_link, NULL, &e->link, &err)) FAIL("link: %s", err.msg);
    e->tr = nh_embedded_pg_init(e->link, PQconnectdb(e->url_for_link), "test-host", &err);
    if (!e->tr) FAIL("transport: %s", err.msg);
    e->d = nh_dispatch_init_pg(&e->rt.loop, e->link, e->tr, nh_vm_lua_dir(NULL));
    if (nh_dispatch_load(e->d, adapter, &err)) FAIL("load adapter: %s", err.msg);
    if (nh_dispatch_start(e->d, &err)) FAIL("start: %s", err.msg);
    return e;
  }
  if (nh_store_open(&e->store, nh_test_path("nimbus.db"), NH_STORE_CREATE, &err)) FAIL("store: %s", err.msg);
  e->tr = nh_embedded_init(nh_store_db(e->store), "test-host", &err);
  if (!e->tr) FAIL("transport: %s", err.msg);
  ASSERT_EQ_INT(nh_runtime_init(&e->rt), 0);
  e->loop_ok = 1;
  e->d = nh_dispatch_init(&e->rt.loop, e->store, e->tr, nh_vm_lua_dir(NULL));
  if (nh_dispatch_load(e->d, adapter, &err)) FAIL("load adapter: %s", err.msg);
  if (nh_dispatch_start(e->d, &err)) FAIL("start: %s", err.msg);
  return e;
}

#define WAIT_FOR_MS(e, cond, ms)                                                                   \
  do {                                                                                             \
    int64_t nh_dl_ = nh_test_mono_ms() + (ms);                                                     \
    while (!(cond)) {                                                                              \
      if (nh_test_mono_ms() > nh_dl_) FAIL("timed out after %d ms waiting for %s", (ms), #cond);    \
      uv_run(&(e)->rt.loop, UV_RUN_ONCE);                                                             \
    }                                                                                              \
  } while (0)
#define WAIT_FOR(e, cond) WAIT_FOR_MS(e, cond, WAIT_MS)

/* Runs the loop for a number of iterations (to show that something does NOT happen,
 * after the state it would follow from has been reached). */
static void spin(env_t *e, int iterations)
{
  for (int i = 0; i < iterations; i++) uv_run(&e->rt.loop, UV_RUN_NOWAIT);
}

/* Graceful stop (drain), then teardown; the loop must close with no handle left. */
static void env_stop(env_t *e)
{
  e->stopped = 0;
  nh_dispatch_stop(e->d, 2000, on_stopped, e);
  WAIT_FOR(e, e->stopped);
  nh_test_cancel_cleanup(env_cleanup, e);
  int rc = env_teardown(e);
  free(e);
  ASSERT_EQ_INT(rc, 0);
}

/* Enqueues m for `ep` (NULL: fans it out by type) as a producer beside the host would;
 * returns the copies queued. */
static int send_msg(env_t *e, const nh_msg_t *m, const char *ep)
{
  nh_error_t err = {0};
  int copies = 0;
  if (!e->pg) {
    if (nh_store_begin(e->store)) FAIL("begin: %s", nh_store_errmsg(e->store));
    if (e->tr->vt->send(e->tr, m, ep, &copies, &err)) FAIL("send: %s", err.msg);
    if (nh_store_commit(e->store)) FAIL("commit");
    return copies;
  }
  nh_pg_args_t a;
  PGresult *r = NULL;
  int n = 1;
  if (!ep) {
    if (nh_pgq_run(e->pgdb, nh_pgqargs_subscribers(&a, m->event_type), &a, &r, &err)) FAIL("subscribers: %s", err.msg);
    n = PQntuples(r);
  }
  for (int i = 0; i < n; i++) {
    char eid[37];
    if (!ep) nh_uuid_v7(eid);
    const char *to = ep ? ep : PQgetvalue(r, i, 0);
    if (nh_pgq_run(e->pgdb, nh_pgqargs_insert(&a, m, to, ep ? m->event_id : eid), &a, NULL, &err))
      FAIL("enqueue: %s", err.msg);
    copies++;
  }
  if (r) PQclear(r);
  return copies;
}

/* Several sends as one producer's transaction: sqlite's; on PostgreSQL each is its own
 * (one producer's commits come in seq order, which is all the tests need). */
static void tx_begin(env_t *e)
{
  if (!e->pg && nh_store_begin(e->store)) FAIL("begin: %s", nh_store_errmsg(e->store));
}

static void tx_commit(env_t *e)
{
  if (!e->pg && nh_store_commit(e->store)) FAIL("commit");
}

static void send_in_tx(env_t *e, const nh_msg_t *m, const char *ep)
{
  nh_error_t err = {0};
  int copies = 0;
  if (e->pg) copies = send_msg(e, m, ep);
  else if (e->tr->vt->send(e->tr, m, ep, &copies, &err)) FAIL("send: %s", err.msg);
  if (copies < 1) FAIL("send to %s: no copy queued", ep);
}

/* Enqueues one message for `ep` (to_all: fan out by type instead) in a transaction;
 * the body is body_len bytes (it may hold a NUL). */
static void send_full_n(env_t *e, const char *ep, nh_msg_type_t type, const char *event_type, const char *session,
                        const char *event_id, const char *body, size_t body_len, const char *error_text,
                        const char *error_type)
{
  char mid[37];
  nh_uuid_v4(mid);
  nh_msg_t m;
  memset(&m, 0, sizeof m);
  m.session_id = (char *)session;
  m.message_id = mid;
  m.event_id = (char *)event_id;
  m.event_type = (char *)event_type;
  m.type = type;
  m.correlation_id = "corr-test";
  m.from = "Tests";
  m.body = (char *)body;
  m.body_len = body_len;
  m.error_text = (char *)error_text;
  m.error_type = (char *)error_type;
  m.enqueued_at = nh_time_now_ms();
  int copies = send_msg(e, &m, ep);
  if (copies < 1) FAIL("send %s to %s: no copy queued", event_type, ep ? ep : "(fan-out)");
}

static void send_full(env_t *e, const char *ep, nh_msg_type_t type, const char *event_type, const char *session,
                      const char *event_id, const char *body, const char *error_text, const char *error_type)
{
  send_full_n(e, ep, type, event_type, session, event_id, body, body ? strlen(body) : 0, error_text, error_type);
}

static void send_event(env_t *e, const char *session, const char *event_id, const char *body)
{
  send_full(e, "Ep", NH_MT_EVENT, "Thing", session, event_id, body, NULL, NULL);
}

static void send_control(env_t *e, nh_msg_type_t type, const char *session, const char *event_id, const char *body)
{
  send_full(e, "Ep", type, "Thing", session, event_id, body, NULL, NULL);
}

static const char *status_of(env_t *e, const char *ep, const char *event_id)
{
  static char buf[64];
  nh_audit_t a;
  memset(&a, 0, sizeof a);
  buf[0] = '\0';
  if ((e->pg ? nh_pgs_audit_get(e->pgdb, ep, event_id, &a) : nh_store_audit_get(e->store, ep, event_id, &a)) == 1) {
    snprintf(buf, sizeof buf, "%s", NH_TEST_STR(a.status));
    nh_audit_clear(&a);
  }
  return buf;
}

static int is_status(env_t *e, const char *event_id, const char *status)
{
  return strcmp(status_of(e, "Ep", event_id), status) == 0;
}

static void get_audit(env_t *e, const char *event_id, nh_audit_t *a)
{
  memset(a, 0, sizeof *a);
  int got = e->pg ? nh_pgs_audit_get(e->pgdb, "Ep", event_id, a) : nh_store_audit_get(e->store, "Ep", event_id, a);
  if (got != 1) FAIL("no audit row for %s", event_id);
}

/* One value of the tests' own SQL, written in sqlite's words; on PostgreSQL a cast to BLOB
 * is one to bytea, and a truth value ("t", "f") reads as 1 or 0. */
static const char *q1v(env_t *e, const char *fmt, va_list ap)
{
  char sql[4096];
  vsnprintf(sql, sizeof sql, fmt, ap);
  if (!e->pg) return nh_test_q1s(nh_store_db(e->store), "%s", sql);
  char pg[4200] = "";
  const char *b = strstr(sql, " AS BLOB)");
  if (b) snprintf(pg, sizeof pg, "%.*s AS bytea)%s", (int)(b - sql), sql, b + 9);
  else if (strncmp(sql, "SELECT body FROM", 16) == 0)   /* a bytea body, as the (ASCII) text it holds */
    snprintf(pg, sizeof pg, "SELECT encode(body, 'escape')%s", sql + 11);
  const char *v = nh_pgtest_q1(e->look, "%s", b || pg[0] == 'S' ? pg : sql);
  return strcmp(v, "t") == 0 ? "1" : strcmp(v, "f") == 0 ? "0" : v;
}

static const char *q1s(env_t *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static const char *q1s(env_t *e, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  const char *v = q1v(e, fmt, ap);
  va_end(ap);
  return v;
}

static long long q1i(env_t *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static long long q1i(env_t *e, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  long long n = atoll(q1v(e, fmt, ap));
  va_end(ap);
  return n;
}

/* The tests' own change to the store (sqlite's words, which both speak here). */
static void exec_sql(env_t *e, const char *sql)
{
  if (!e->pg) {
    if (sqlite3_exec(nh_store_db(e->store), sql, NULL, NULL, NULL) != SQLITE_OK) FAIL("%s failed", sql);
    return;
  }
  PGresult *r = PQexec(e->look, sql);
  int ok = PQresultStatus(r) == PGRES_COMMAND_OK;
  if (!ok) FAIL("%s: %s", sql, PQresultErrorMessage(r));
  PQclear(r);
}

static int queued(env_t *e) { return (int)q1i(e, "SELECT count(*) FROM queue WHERE endpoint = 'Ep'"); }
static int parked(env_t *e, const char *session)
{
  return e->pg ? nh_pgs_parked_count(e->pgdb, "Ep", session) : nh_store_parked_count(e->store, "Ep", session);
}

static int session_get(env_t *e, const char *session, nh_session_state_t *st)
{
  return e->pg ? nh_pgs_session_get(e->pgdb, "Ep", session, st) : nh_store_session_get(e->store, "Ep", session, st);
}

/* Lines of the handler log starting with `prefix`. */
static int calls(env_t *e, const char *prefix)
{
  const char *log = nh_test_read_file(e->log);
  int n = 0;
  size_t len = strlen(prefix);
  for (const char *line = log; *line;) {
    if (strncmp(line, prefix, len) == 0) n++;
    const char *nl = strchr(line, '\n');
    if (!nl) break;
    line = nl + 1;
  }
  return n;
}

static const char *blocked_by(env_t *e, const char *session)
{
  static char buf[128];
  nh_session_state_t st;
  buf[0] = '\0';
  if (session_get(e, session, &st)) FAIL("session get");
  if (st.blocked_by) snprintf(buf, sizeof buf, "%s", st.blocked_by);
  nh_session_state_clear(&st);
  return buf;
}

static int session_exists(env_t *e, const char *session)
{
  nh_session_state_t st;
  if (session_get(e, session, &st)) FAIL("session get");
  int x = st.exists;
  nh_session_state_clear(&st);
  return x;
}

static int history_has(env_t *e, const char *event_id, const char *status)
{
  return q1i(e, "SELECT count(*) FROM history WHERE endpoint = 'Ep' AND event_id = '%s' AND status = '%s'", event_id,
             status) > 0;
}

/* The standard adapter: records "<event_id>:<kind>:<n>", fails when event.fail is set. */
static const char *const basic_adapter =
  "local ep = nimbus.endpoint('Ep', {})\n"
  "ep:on('Thing', function(event, ctx)\n"
  "  record(ctx.event_id .. ':' .. ctx.kind .. ':' .. tostring(event.n))\n"
  "  if event.fail then error('boom ' .. tostring(event.n)) end\n"
  "end)\n";

/* ---------------------------------------------------------------- tests */

TEST(completed)
{
  env_t *e = env_start( basic_adapter);
  ASSERT_EQ_INT(nh_dispatch_endpoint_count(e->d), 1);
  char desc[256];
  nh_dispatch_describe(e->d, desc, sizeof desc);
  ASSERT_EQ_STR(desc, "Ep (Thing)");
  ASSERT_EQ_INT(q1i(e, "SELECT count(*) FROM subscriptions WHERE endpoint = 'Ep' AND event_type = 'Thing'"), 1);

  send_event(e, "s1", "ev1", "{\"n\":1}");
  WAIT_FOR(e, is_status(e, "ev1", NH_ST_COMPLETED));
  nh_audit_t a;
  get_audit(e, "ev1", &a);
  ASSERT_EQ_STR(a.session_id, "s1");
  ASSERT_EQ_STR(a.event_type, "Thing");
  ASSERT_EQ_STR(a.payload, "{\"n\":1}");
  ASSERT_EQ_STR(a.correlation_id, "corr-test");
  ASSERT_NOT_NULL(a.message_id);
  ASSERT_NULL(a.sub_status);
  ASSERT_NULL(a.error_text);
  ASSERT_EQ_INT(a.retry_count, 0);
  nh_audit_clear(&a);
  ASSERT_EQ_STR(nh_test_read_file(e->log), "ev1:event:1\n");
  ASSERT_EQ_INT(queued(e), 0);
  ASSERT_FALSE(session_exists(e, "s1"));
  ASSERT_TRUE(history_has(e, "ev1", NH_ST_COMPLETED));
  ASSERT_EQ_INT(q1i(e, "SELECT count(*) FROM session_locks"), 0);   /* unlocked after commit */

  /* a fan-out publish reaches the endpoint as a fresh event */
  nh_msg_t m;
  memset(&m, 0, sizeof m);
  m.session_id = "s2";
  m.message_id = "fan-mid";
  m.event_type = "Thing";
  m.body = "{\"n\":2}";
  m.body_len = strlen(m.body);
  ASSERT_EQ_INT(send_msg(e, &m, NULL), 1);
  WAIT_FOR(e, q1i(e, "SELECT count(*) FROM audit WHERE message_id = 'fan-mid' AND status = 'Completed'") == 1);
  ASSERT_EQ_INT(calls(e, ""), 2);
  env_stop(e);
}

/* Events {"n": i} for i < count, ids ev<i>, round robin over sessions s0..s<nsessions-1>,
 * in one transaction. */
static void send_numbered(env_t *e, int count, int nsessions)
{
  tx_begin(e);
  for (int i = 0; i < count; i++) {
    char session[16], eid[16], body[32], mid[37];
    snprintf(session, sizeof session, "s%d", i % nsessions);
    snprintf(eid, sizeof eid, "ev%03d", i);
    snprintf(body, sizeof body, "{\"n\":%d}", i);
    nh_uuid_v4(mid);
    nh_msg_t m;
    memset(&m, 0, sizeof m);
    m.session_id = session;
    m.message_id = mid;
    m.event_id = eid;
    m.event_type = "Thing";
    m.body = body;
    m.body_len = strlen(body);
    send_in_tx(e, &m, "Ep");
  }
  tx_commit(e);
}

TEST(many_sessions_all_complete_in_session_order)
{
  env_t *e = env_start(
            "local ep = nimbus.endpoint('Ep', { concurrency = 4 })\n"
            "ep:on('Thing', function(event, ctx) record(ctx.session_id .. ':' .. event.n) end)\n");
  send_numbered(e, 60, 6);
  WAIT_FOR(e, q1i(e, "SELECT count(*) FROM audit WHERE status = 'Completed'") == 60);
  ASSERT_EQ_INT(calls(e, ""), 60);
  /* within each session the handler saw the messages in send order */
  const char *log = nh_test_read_file(e->log);
  int last[6] = { -1, -1, -1, -1, -1, -1 };
  for (const char *p = log; *p;) {
    int s, n;
    if (sscanf(p, "s%d:%d", &s, &n) != 2) FAIL("bad log line near %.20s", p);
    ASSERT_CMP_INT(n, >, last[s]);
    ASSERT_EQ_INT(n % 6, s);
    last[s] = n;
    p = strchr(p, '\n');
    if (!p) break;
    p++;
  }
  env_stop(e);
}

TEST(a_blocked_backlog_is_parked_in_order_and_a_skip_behind_it_stays_in_order)
{
  env_t *e = env_start( basic_adapter);
  send_event(e, "s1", "ev0", "{\"n\":0,\"fail\":true}");
  WAIT_FOR(e, is_status(e, "ev0", NH_ST_FAILED));
  char id[32], body[32];
  for (int i = 1; i <= 40; i++) {
    snprintf(id, sizeof id, "p%02d", i);
    snprintf(body, sizeof body, "{\"n\":%d}", i);
    send_event(e, "s1", id, body);
  }
  /* a control message behind the backlog stays in order: not parked with it */
  send_full(e, "Ep", NH_MT_SKIP, "Thing", "s1", "ev0", NULL, NULL, NULL);
  send_event(e, "s2", "other", "{\"n\":99}");
  WAIT_FOR(e, is_status(e, "ev0", NH_ST_SKIPPED) && is_status(e, "other", NH_ST_COMPLETED) &&
                 is_status(e, "p40", NH_ST_COMPLETED));
  /* parked in order and replayed in order after the skip */
  for (int i = 1; i <= 40; i++) {
    snprintf(id, sizeof id, "p%02d", i);
    ASSERT_EQ_STR(status_of(e, "Ep", id), NH_ST_COMPLETED);
  }
  const char *log = nh_test_read_file(e->log);
  const char *prev = strstr(log, "p01:");
  ASSERT_TRUE(prev != NULL);
  for (int i = 2; i <= 40; i++) {
    snprintf(id, sizeof id, "p%02d:", i);
    const char *at = strstr(log, id);
    ASSERT_TRUE(at != NULL && at > prev);
    prev = at;
  }
  ASSERT_EQ_INT(calls(e, "p"), 40);
  env_stop(e);
}

TEST(failure_blocks_and_parks_siblings)
{
  env_t *e = env_start( basic_adapter);
  send_event(e, "s1", "ev1", "{\"n\":1,\"fail\":true}");
  send_event(e, "s1", "ev2", "{\"n\":2}");
  send_event(e, "s1", "ev3", "{\"n\":3}");
  send_event(e, "s2", "ev4", "{\"n\":4}");
  WAIT_FOR(e, parked(e, "s1") == 2 && is_status(e, "ev4", NH_ST_COMPLETED));
  nh_audit_t a;
  get_audit(e, "ev1", &a);
  ASSERT_EQ_STR(a.status, NH_ST_FAILED);
  ASSERT_CONTAINS(a.error_text, "boom 1");
  ASSERT_EQ_STR(a.error_type, "LuaError");
  ASSERT_CONTAINS(a.error_stack, "traceback");
  ASSERT_EQ_INT(a.retry_count, 0);
  nh_audit_clear(&a);
  ASSERT_EQ_STR(status_of(e, "Ep", "ev2"), NH_ST_DEFERRED);
  ASSERT_EQ_STR(status_of(e, "Ep", "ev3"), NH_ST_DEFERRED);
  get_audit(e, "ev2", &a);
  ASSERT_CONTAINS(a.error_text, "blocked by ev1");
  nh_audit_clear(&a);
  ASSERT_EQ_STR(blocked_by(e, "s1"), "ev1");
  ASSERT_FALSE(session_exists(e, "s2"));
  ASSERT_EQ_INT(queued(e), 0);   /* parked messages left the queue */
  ASSERT_EQ_INT(calls(e, "ev1:"), 1);
  ASSERT_EQ_INT(calls(e, "ev2:"), 0);
  ASSERT_EQ_INT(calls(e, "ev3:"), 0);
  /* parked in arrival order */
  nh_msg_t head;
  int64_t seq;
  ASSERT_EQ_INT(e->pg ? nh_pgs_parked_head(e->pgdb, "Ep", "s1", &head, &seq)
                     : nh_store_parked_head(e->store, "Ep", "s1", &head, &seq), 1);
  ASSERT_EQ_STR(head.event_id, "ev2");
  nh_msg_clear(&head);

  /* a new arrival keeps parking behind the block */
  send_event(e, "s1", "ev5", "{\"n\":5}");
  WAIT_FOR(e, parked(e, "s1") == 3);
  ASSERT_EQ_STR(status_of(e, "Ep", "ev5"), NH_ST_DEFERRED);
  ASSERT_EQ_STR(status_of(e, "Ep", "ev1"), NH_ST_FAILED);
  env_stop(e);
}

TEST(skip_unblocks_and_replays_in_order)
{
  env_t *e = env_start( basic_adapter);
  send_event(e, "s1", "ev1", "{\"n\":1,\"fail\":true}");
  send_event(e, "s1", "ev2", "{\"n\":2}");
  send_event(e, "s1", "ev3", "{\"n\":3}");
  send_event(e, "s1", "ev4", "{\"n\":4}");
  WAIT_FOR(e, parked(e, "s1") == 3);
  send_control(e, NH_MT_SKIP, "s1", "ev1", NULL);
  WAIT_FOR(e, is_status(e, "ev4", NH_ST_COMPLETED));
  ASSERT_EQ_STR(status_of(e, "Ep", "ev1"), NH_ST_SKIPPED);
  ASSERT_EQ_STR(status_of(e, "Ep", "ev2"), NH_ST_COMPLETED);
  ASSERT_EQ_STR(status_of(e, "Ep", "ev3"), NH_ST_COMPLETED);
  ASSERT_EQ_STR(nh_test_read_file(e->log), "ev1:event:1\nev2:replay:2\nev3:replay:3\nev4:replay:4\n");
  ASSERT_EQ_INT(parked(e, "s1"), 0);
  WAIT_FOR(e, !session_exists(e, "s1"));
  ASSERT_EQ_INT(queued(e), 0);
  ASSERT_TRUE(history_has(e, "ev1", NH_ST_SKIPPED));

  /* the session is free again: a new event runs at once */
  send_event(e, "s1", "ev9", "{\"n\":9}");
  WAIT_FOR(e, is_status(e, "ev9", NH_ST_COMPLETED));
  ASSERT_EQ_INT(calls(e, "ev9:event:"), 1);
  env_stop(e);
}

TEST(skip_of_a_parked_event_removes_it_and_keeps_the_block)
{
  env_t *e = env_start( basic_adapter);
  send_event(e, "s1", "ev1", "{\"n\":1,\"fail\":true}");
  send_event(e, "s1", "ev2", "{\"n\":2}");
  send_event(e, "s1", "ev3", "{\"n\":3}");
  WAIT_FOR(e, parked(e, "s1") == 2);
  send_control(e, NH_MT_SKIP, "s1", "ev2", NULL);
  WAIT_FOR(e, is_status(e, "ev2", NH_ST_SKIPPED));
  ASSERT_EQ_INT(parked(e, "s1"), 1);
  ASSERT_EQ_STR(blocked_by(e, "s1"), "ev1");
  ASSERT_EQ_STR(status_of(e, "Ep", "ev1"), NH_ST_FAILED);
  ASSERT_EQ_STR(status_of(e, "Ep", "ev3"), NH_ST_DEFERRED);
  /* then skipping the blocker replays only what is left */
  send_control(e, NH_MT_SKIP, "s1", "ev1", NULL);
  WAIT_FOR(e, is_status(e, "ev3", NH_ST_COMPLETED));
  ASSERT_EQ_INT(calls(e, "ev2:"), 0);
  ASSERT_EQ_STR(status_of(e, "Ep", "ev2"), NH_ST_SKIPPED);
  env_stop(e);
}

TEST(resubmit_with_body_completes_and_replays)
{
  env_t *e = env_start( basic_adapter);
  send_event(e, "s1", "ev1", "{\"n\":1,\"fail\":true}");
  send_event(e, "s1", "ev2", "{\"n\":2}");
  send_event(e, "s1", "ev3", "{\"n\":3}");
  WAIT_FOR(e, parked(e, "s1") == 2);
  /* resubmitting a parked event is refused: it will replay in order anyway */
  send_control(e, NH_MT_RESUBMIT, "s1", "ev2", "{\"n\":22}");
  WAIT_FOR(e, history_has(e, "ev2", "Rejected"));
  ASSERT_EQ_STR(status_of(e, "Ep", "ev2"), NH_ST_DEFERRED);
  ASSERT_EQ_INT(calls(e, "ev2:"), 0);

  send_control(e, NH_MT_RESUBMIT, "s1", "ev1", "{\"n\":10}");
  WAIT_FOR(e, is_status(e, "ev3", NH_ST_COMPLETED));
  ASSERT_EQ_STR(status_of(e, "Ep", "ev1"), NH_ST_COMPLETED);
  ASSERT_EQ_STR(status_of(e, "Ep", "ev2"), NH_ST_COMPLETED);
  ASSERT_EQ_STR(nh_test_read_file(e->log), "ev1:event:1\nev1:resubmit:10\nev2:replay:2\nev3:replay:3\n");
  nh_audit_t a;
  get_audit(e, "ev1", &a);
  ASSERT_EQ_STR(a.payload, "{\"n\":10}");   /* the audit keeps the body that ran */
  ASSERT_NULL(a.error_text);
  nh_audit_clear(&a);
  WAIT_FOR(e, !session_exists(e, "s1"));
  env_stop(e);
}

TEST(resubmit_that_fails_again_keeps_the_block)
{
  env_t *e = env_start( basic_adapter);
  send_event(e, "s1", "ev1", "{\"n\":1,\"fail\":true}");
  send_event(e, "s1", "ev2", "{\"n\":2}");
  WAIT_FOR(e, parked(e, "s1") == 1);
  send_control(e, NH_MT_RESUBMIT, "s1", "ev1", "{\"n\":11,\"fail\":true}");
  WAIT_FOR(e, calls(e, "ev1:resubmit:11") == 1 && queued(e) == 0);
  WAIT_FOR(e, history_has(e, "ev1", NH_ST_FAILED) &&
                 q1i(e, "SELECT count(*) FROM history WHERE event_id = 'ev1'") >= 2);
  nh_audit_t a;
  get_audit(e, "ev1", &a);
  ASSERT_EQ_STR(a.status, NH_ST_FAILED);
  ASSERT_CONTAINS(a.error_text, "boom 11");
  nh_audit_clear(&a);
  ASSERT_EQ_STR(blocked_by(e, "s1"), "ev1");
  ASSERT_EQ_INT(parked(e, "s1"), 1);
  ASSERT_EQ_INT(calls(e, "ev2:"), 0);
  env_stop(e);
}

static const char *const handoff_adapter =
  "local ep = nimbus.endpoint('Ep', {})\n"
  "ep:on('Thing', function(event, ctx)\n"
  "  record(ctx.event_id .. ':' .. ctx.kind)\n"
  "  ctx:mark_pending_handoff{ reason = 'Awaiting ERP DMF import job',\n"
  "                            external_job_id = 'DMF-' .. ctx.event_id, expected_by = 30 }\n"
  "  if event.fail_after then error('failed after marking') end\n"
  "end)\n";

TEST(handoff_complete_and_fail)
{
  env_t *e = env_start( handoff_adapter);
  int64_t t0 = nh_time_now_ms();
  send_event(e, "s1", "ev1", "{\"n\":1}");
  send_event(e, "s1", "ev2", "{\"n\":2}");
  WAIT_FOR(e, is_status(e, "ev1", NH_ST_PENDING) && parked(e, "s1") == 1);
  nh_audit_t a;
  get_audit(e, "ev1", &a);
  ASSERT_EQ_STR(a.sub_status, "Handoff");
  ASSERT_EQ_STR(a.handoff_reason, "Awaiting ERP DMF import job");
  ASSERT_EQ_STR(a.external_job_id, "DMF-ev1");
  ASSERT_CMP_INT(a.expected_by, >=, t0 + 30000);
  ASSERT_CMP_INT(a.expected_by, <=, nh_time_now_ms() + 30000);
  nh_audit_clear(&a);
  ASSERT_EQ_STR(blocked_by(e, "s1"), "ev1");
  ASSERT_EQ_STR(status_of(e, "Ep", "ev2"), NH_ST_DEFERRED);

  /* completing the hand-off never runs the handler again; ev2 replays (and hands off too) */
  send_control(e, NH_MT_HANDOFF_COMPLETE, "s1", "ev1", "{\"importedRecordId\":42}");
  WAIT_FOR(e, is_status(e, "ev1", NH_ST_COMPLETED) && is_status(e, "ev2", NH_ST_PENDING));
  get_audit(e, "ev1", &a);
  ASSERT_NULL(a.sub_status);
  ASSERT_EQ_STR(a.result, "{\"importedRecordId\":42}");
  nh_audit_clear(&a);
  ASSERT_EQ_INT(calls(e, "ev1:"), 1);
  ASSERT_EQ_INT(calls(e, "ev2:replay"), 1);
  ASSERT_EQ_STR(blocked_by(e, "s1"), "ev2");

  /* failing it records the error verbatim and keeps the session blocked */
  send_full(e, "Ep", NH_MT_HANDOFF_FAIL, "Thing", "s1", "ev2", NULL, "DMF rejected: invalid postal code 'X1'",
            "DmfValidationError");
  WAIT_FOR(e, is_status(e, "ev2", NH_ST_FAILED));
  get_audit(e, "ev2", &a);
  ASSERT_EQ_STR(a.error_text, "DMF rejected: invalid postal code 'X1'");
  ASSERT_EQ_STR(a.error_type, "DmfValidationError");
  ASSERT_NULL(a.sub_status);
  nh_audit_clear(&a);
  ASSERT_EQ_STR(blocked_by(e, "s1"), "ev2");
  ASSERT_EQ_INT(calls(e, "ev2:"), 1);

  /* a settlement for an event that is not Pending+Handoff changes nothing */
  send_control(e, NH_MT_HANDOFF_COMPLETE, "s1", "ev2", "{}");
  WAIT_FOR(e, history_has(e, "ev2", "Rejected"));
  ASSERT_EQ_STR(status_of(e, "Ep", "ev2"), NH_ST_FAILED);
  ASSERT_EQ_STR(blocked_by(e, "s1"), "ev2");
  send_control(e, NH_MT_HANDOFF_COMPLETE, "s1", "ev1", "{\"late\":true}");   /* late duplicate */
  WAIT_FOR(e, history_has(e, "ev1", "Rejected"));
  get_audit(e, "ev1", &a);
  ASSERT_EQ_STR(a.status, NH_ST_COMPLETED);
  ASSERT_EQ_STR(a.result, "{\"importedRecordId\":42}");
  nh_audit_clear(&a);
  ASSERT_EQ_INT(calls(e, ""), 2);
  env_stop(e);
}

TEST(error_after_mark_pending_handoff_wins)
{
  env_t *e = env_start( handoff_adapter);
  send_event(e, "s1", "ev1", "{\"fail_after\":true}");
  WAIT_FOR(e, is_status(e, "ev1", NH_ST_FAILED));
  nh_audit_t a;
  get_audit(e, "ev1", &a);
  ASSERT_NULL(a.sub_status);
  ASSERT_NULL(a.handoff_reason);
  ASSERT_CONTAINS(a.error_text, "failed after marking");
  nh_audit_clear(&a);
  ASSERT_EQ_STR(blocked_by(e, "s1"), "ev1");
  env_stop(e);
}

TEST(retry_then_failed)
{
  env_t *e = env_start(
            "local ep = nimbus.endpoint('Ep', { retry = { max_retries = 2, base = 0.01 } })\n"
            "ep:on('Thing', function(event, ctx)\n"
            "  record(ctx.event_id .. ':' .. ctx.kind .. ':' .. ctx.retry_count)\n"
            "  error('always fails')\n"
            "end)\n");
  send_event(e, "s1", "ev1", "{}");
  send_event(e, "s1", "ev2", "{}");
  WAIT_FOR(e, calls(e, "ev1:") == 3 && is_status(e, "ev1", NH_ST_FAILED) &&
                 q1i(e, "SELECT retry_count FROM audit WHERE event_id = 'ev1'") == 2 &&
                 q1i(e, "SELECT retry_due IS NULL FROM sessions WHERE session_id = 's1'") == 1);
  ASSERT_EQ_STR(nh_test_read_file(e->log), "ev1:event:0\nev1:retry:1\nev1:retry:2\n");
  ASSERT_EQ_STR(blocked_by(e, "s1"), "ev1");
  ASSERT_EQ_INT(parked(e, "s1"), 1);
  ASSERT_EQ_STR(status_of(e, "Ep", "ev2"), NH_ST_DEFERRED);
  ASSERT_EQ_INT(q1i(e, "SELECT count(*) FROM history WHERE event_id = 'ev1' AND message_type = 'RetryRequest'"), 2);
  /* no further attempt is scheduled, however long the loop runs */
  spin(e, 50);
  ASSERT_EQ_INT(calls(e, "ev1:"), 3);
  env_stop(e);
}

/* Fails an event until its retry_count reaches the body's fail_until. */
static const char FAIL_UNTIL_ADAPTER[] =
  "local ep = nimbus.endpoint('Ep', { retry = { max_retries = 3, base = 0.01 } })\n"
  "ep:on('Thing', function(event, ctx)\n"
  "  record(ctx.event_id .. ':' .. ctx.kind .. ':' .. ctx.retry_count)\n"
  "  if event.fail_until and ctx.retry_count < event.fail_until then error('not yet') end\n"
  "end)\n";

TEST(retry_that_succeeds_unblocks_and_replays)
{
  env_t *e = env_start(FAIL_UNTIL_ADAPTER);
  send_event(e, "s1", "ev1", "{\"fail_until\":2}");
  send_event(e, "s1", "ev2", "{}");
  WAIT_FOR(e, is_status(e, "ev2", NH_ST_COMPLETED));
  ASSERT_EQ_STR(status_of(e, "Ep", "ev1"), NH_ST_COMPLETED);
  ASSERT_EQ_INT(q1i(e, "SELECT retry_count FROM audit WHERE event_id = 'ev1'"), 2);
  ASSERT_EQ_STR(nh_test_read_file(e->log), "ev1:event:0\nev1:retry:1\nev1:retry:2\nev2:replay:0\n");
  WAIT_FOR(e, !session_exists(e, "s1"));
  env_stop(e);
}

/* Bodies are bytes: one with a NUL in it runs whole on the retry (taken from the audit
 * row) and on the parked replay (from the parked row); the audit keeps the body each ran. */
TEST(body_with_a_nul_byte_arrives_whole_through_retry_and_parked_replay)
{
  env_t *e = env_start(FAIL_UNTIL_ADAPTER);
  static const char b1[] = "{\"fail_until\":1}\0after the NUL 1";
  static const char b2[] = "{\"n\":2}\0after the NUL 2";
  send_full_n(e, "Ep", NH_MT_EVENT, "Thing", "s1", "ev1", b1, sizeof b1 - 1, NULL, NULL);
  send_full_n(e, "Ep", NH_MT_EVENT, "Thing", "s1", "ev2", b2, sizeof b2 - 1, NULL, NULL);
  WAIT_FOR(e, is_status(e, "ev2", NH_ST_COMPLETED));
  ASSERT_EQ_STR(nh_test_read_file(e->log), "ev1:event:0\nev1:retry:1\nev2:replay:0\n");
  nh_audit_t a;
  get_audit(e, "ev1", &a);
  ASSERT_EQ_STR(a.status, NH_ST_COMPLETED);
  ASSERT_EQ_INT(a.payload_len, sizeof b1 - 1);
  ASSERT_TRUE(memcmp(a.payload, b1, sizeof b1) == 0);   /* and the trailing NUL */
  nh_audit_clear(&a);
  get_audit(e, "ev2", &a);
  ASSERT_EQ_INT(a.payload_len, sizeof b2 - 1);
  ASSERT_TRUE(memcmp(a.payload, b2, sizeof b2) == 0);
  nh_audit_clear(&a);
  ASSERT_EQ_INT(q1i(e, "SELECT length(CAST(payload AS BLOB)) FROM audit WHERE event_id = 'ev1'"), sizeof b1 - 1);
  ASSERT_EQ_INT(q1i(e, "SELECT length(CAST(payload AS BLOB)) FROM audit WHERE event_id = 'ev2'"), sizeof b2 - 1);
  env_stop(e);
}

TEST(retry_rule_selects_policy_by_error_text)
{
  env_t *e = env_start(
            "local ep = nimbus.endpoint('Ep', { retry = { max_retries = 0, base = 0.01,\n"
            "  rules = { { match = 'TIMEOUT', max_retries = 1 } } } })\n"
            "ep:on('Thing', function(event, ctx)\n"
            "  record(ctx.event_id .. ':' .. ctx.retry_count)\n"
            "  error(event.msg)\n"
            "end)\n");
  send_event(e, "s1", "ev1", "{\"msg\":\"upstream timeout\"}");
  send_event(e, "s2", "ev2", "{\"msg\":\"bad request\"}");
  WAIT_FOR(e, calls(e, "ev1:") == 2 && q1i(e, "SELECT retry_count FROM audit WHERE event_id = 'ev1'") == 1 &&
                 is_status(e, "ev2", NH_ST_FAILED) &&
                 q1i(e, "SELECT count(*) FROM sessions WHERE retry_due IS NOT NULL") == 0);
  ASSERT_EQ_INT(calls(e, "ev2:"), 1);
  env_stop(e);
}

TEST(permanent_failure_on_a_retry_unblocks_and_replays)
{
  env_t *e = env_start(
            "local ep = nimbus.endpoint('Ep', { retry = { max_retries = 5, base = 0.01 } })\n"
            "ep:on('Thing', function(event, ctx)\n"
            "  record(ctx.event_id .. ':' .. ctx.kind)\n"
            "  if event.bad and ctx.retry_count == 0 then error('first attempt fails') end\n"
            "  if event.bad then error(nimbus.permanent('give up')) end\n"
            "end)\n");
  send_event(e, "s1", "ev1", "{\"bad\":true}");
  send_event(e, "s1", "ev2", "{}");
  WAIT_FOR(e, is_status(e, "ev2", NH_ST_COMPLETED));
  ASSERT_EQ_STR(status_of(e, "Ep", "ev1"), NH_ST_DEADLETTERED);
  ASSERT_EQ_STR(nh_test_read_file(e->log), "ev1:event\nev1:retry\nev2:replay\n");
  WAIT_FOR(e, !session_exists(e, "s1"));
  env_stop(e);
}

TEST(permanent_dead_letters_without_blocking)
{
  env_t *e = env_start(
            "local ep = nimbus.endpoint('Ep', {})\n"
            "ep:on('Thing', function(event, ctx)\n"
            "  record(ctx.event_id)\n"
            "  if event.bad then error(nimbus.permanent('bad payload: no AccountId')) end\n"
            "end)\n");
  send_event(e, "s1", "ev1", "{\"bad\":true}");
  send_event(e, "s1", "ev2", "{}");
  WAIT_FOR(e, is_status(e, "ev2", NH_ST_COMPLETED));
  nh_audit_t a;
  get_audit(e, "ev1", &a);
  ASSERT_EQ_STR(a.status, NH_ST_DEADLETTERED);
  ASSERT_EQ_STR(a.error_text, "bad payload: no AccountId");
  ASSERT_EQ_STR(a.error_type, "PermanentFailure");
  nh_audit_clear(&a);
  ASSERT_EQ_INT(q1i(e, "SELECT count(*) FROM dead_letters WHERE event_id = 'ev1'"), 1);
  ASSERT_EQ_STR(q1s(e, "SELECT reason FROM dead_letters WHERE event_id = 'ev1'"), "bad payload: no AccountId");
  ASSERT_EQ_INT(calls(e, "ev2"), 1);
  ASSERT_EQ_INT(parked(e, "s1"), 0);
  ASSERT_FALSE(session_exists(e, "s1"));
  ASSERT_EQ_STR(status_of(e, "Ep", "ev2"), NH_ST_COMPLETED);   /* never Deferred */
  ASSERT_FALSE(history_has(e, "ev2", NH_ST_DEFERRED));
  env_stop(e);
}

TEST(unsupported_event_type)
{
  env_t *e = env_start( basic_adapter);
  send_full(e, "Ep", NH_MT_EVENT, "Nobody", "s1", "ev1", "{}", NULL, NULL);
  send_event(e, "s1", "ev2", "{\"n\":2}");
  WAIT_FOR(e, is_status(e, "ev2", NH_ST_COMPLETED));
  nh_audit_t a;
  get_audit(e, "ev1", &a);
  ASSERT_EQ_STR(a.status, NH_ST_UNSUPPORTED);
  ASSERT_CONTAINS(a.error_text, "Nobody");
  nh_audit_clear(&a);
  ASSERT_EQ_INT(calls(e, "ev1"), 0);
  ASSERT_EQ_INT(q1i(e, "SELECT count(*) FROM dead_letters"), 0);
  ASSERT_EQ_INT(queued(e), 0);
  ASSERT_FALSE(session_exists(e, "s1"));
  env_stop(e);
}

TEST(malformed_json_is_dead_lettered)
{
  env_t *e = env_start( basic_adapter);
  send_event(e, "s1", "ev1", "{not json");
  send_event(e, "s2", "ev2", "42");
  send_event(e, "s1", "ev3", "{\"n\":3}");
  WAIT_FOR(e, is_status(e, "ev3", NH_ST_COMPLETED) && is_status(e, "ev2", NH_ST_DEADLETTERED));
  nh_audit_t a;
  get_audit(e, "ev1", &a);
  ASSERT_EQ_STR(a.status, NH_ST_DEADLETTERED);
  ASSERT_EQ_STR(a.error_type, "MalformedPayload");
  ASSERT_CONTAINS(a.error_text, "malformed JSON");
  nh_audit_clear(&a);
  get_audit(e, "ev2", &a);
  ASSERT_EQ_STR(a.error_type, "MalformedPayload");
  ASSERT_CONTAINS(a.error_text, "JSON object");
  nh_audit_clear(&a);
  ASSERT_EQ_INT(q1i(e, "SELECT count(*) FROM dead_letters WHERE event_id IN ('ev1', 'ev2')"), 2);
  ASSERT_EQ_STR(q1s(e, "SELECT body FROM dead_letters WHERE event_id = 'ev1'"), "{not json");
  ASSERT_EQ_INT(calls(e, "ev1"), 0);
  ASSERT_EQ_INT(calls(e, "ev2"), 0);
  ASSERT_EQ_INT(calls(e, "ev3"), 1);
  ASSERT_FALSE(session_exists(e, "s1"));   /* dead-lettering does not block */
  env_stop(e);
}

TEST(json_array_payload_is_dead_lettered)
{
  /* _run says "payload must be a JSON object", but a JSON array decodes to a Lua
   * table too; the handler must not run on it. */
  env_t *e = env_start( basic_adapter);
  send_event(e, "s1", "ev1", "[1, 2, 3]");
  WAIT_FOR(e, strcmp(status_of(e, "Ep", "ev1"), "") != 0);
  ASSERT_EQ_STR(status_of(e, "Ep", "ev1"), NH_ST_DEADLETTERED);
  ASSERT_EQ_INT(calls(e, "ev1"), 0);
  env_stop(e);
}

TEST(message_without_event_id_is_dead_lettered)
{
  env_t *e = env_start( basic_adapter);
  /* the embedded transport always assigns one; simulate a foreign producer */
  send_event(e, "s1", "ev1", "{\"n\":1}");
  exec_sql(e, "UPDATE queue SET event_id = NULL");
  WAIT_FOR(e, queued(e) == 0);
  ASSERT_EQ_INT(q1i(e, "SELECT count(*) FROM dead_letters WHERE reason LIKE '%%EventId%%'"), 1);
  ASSERT_EQ_INT(calls(e, ""), 0);
  env_stop(e);
}

TEST(too_many_deliveries_dead_letters)
{
  env_t *e = env_start( basic_adapter);
  send_event(e, "s1", "ev1", "{\"n\":1}");
  exec_sql(e, "UPDATE queue SET delivery_count = 10");
  WAIT_FOR(e, is_status(e, "ev1", NH_ST_DEADLETTERED));
  ASSERT_EQ_INT(calls(e, ""), 0);
  ASSERT_EQ_INT(q1i(e, "SELECT count(*) FROM dead_letters WHERE event_id = 'ev1'"), 1);
  env_stop(e);
}

TEST(redelivered_blocker_is_settled_without_handler_and_not_parked)
{
  env_t *e = env_start( basic_adapter);
  send_event(e, "s1", "ev1", "{\"n\":1,\"fail\":true}");
  WAIT_FOR(e, is_status(e, "ev1", NH_ST_FAILED) && queued(e) == 0);
  ASSERT_EQ_STR(blocked_by(e, "s1"), "ev1");
  /* a second queue copy of the blocking event (the broker redelivered it) */
  send_event(e, "s1", "ev1", "{\"n\":1,\"fail\":true}");
  WAIT_FOR(e, queued(e) == 0);
  WAIT_FOR(e, history_has(e, "ev1", "Redelivered"));
  ASSERT_EQ_INT(calls(e, "ev1:"), 1);
  ASSERT_EQ_INT(parked(e, "s1"), 0);
  ASSERT_EQ_STR(status_of(e, "Ep", "ev1"), NH_ST_FAILED);
  ASSERT_EQ_STR(blocked_by(e, "s1"), "ev1");
  ASSERT_EQ_INT(q1i(e, "SELECT count(*) FROM dead_letters"), 0);
  env_stop(e);
}

TEST(publish_is_sent_only_when_the_handler_completes)
{
  env_t *e = env_start(
            "local ep = nimbus.endpoint('Ep', {})\n"
            "ep:on('Thing', function(event, ctx)\n"
            "  local id = nimbus.publish('Out', { n = event.n }, { to = 'Sink', session = 'out-' .. event.n })\n"
            "  record(ctx.event_id .. ':' .. tostring(id))\n"
            "  if event.fail then error('failed after publishing') end\n"
            "end)\n");
  send_event(e, "s1", "ev1", "{\"n\":1,\"fail\":true}");
  send_event(e, "s2", "ev2", "{\"n\":2}");
  WAIT_FOR(e, is_status(e, "ev1", NH_ST_FAILED) && is_status(e, "ev2", NH_ST_COMPLETED));
  ASSERT_EQ_INT(q1i(e, "SELECT count(*) FROM queue WHERE endpoint = 'Sink'"), 1);
  ASSERT_EQ_STR(q1s(e, "SELECT body FROM queue WHERE endpoint = 'Sink'"), "{\"n\":2}");
  ASSERT_EQ_STR(q1s(e, "SELECT session_id || '|' || event_type || '|' || from_ || '|' || correlation_id"
                        " FROM queue WHERE endpoint = 'Sink'"),
                "out-2|Out|Ep|corr-test");
  nh_audit_t a;
  get_audit(e, "ev2", &a);
  ASSERT_EQ_STR(q1s(e, "SELECT parent_message_id FROM queue WHERE endpoint = 'Sink'"), a.message_id);
  nh_audit_clear(&a);
  /* the id publish returned is the message id that was sent */
  char expect[128];
  snprintf(expect, sizeof expect, "ev2:%s", q1s(e, "SELECT message_id FROM queue WHERE endpoint = 'Sink'"));
  ASSERT_EQ_INT(calls(e, expect), 1);
  ASSERT_EQ_INT(calls(e, "ev1:"), 1);
  env_stop(e);
}

TEST(publish_in_a_handoff_is_sent)
{
  env_t *e = env_start(
            "local ep = nimbus.endpoint('Ep', {})\n"
            "ep:on('Thing', function(event, ctx)\n"
            "  nimbus.publish('JobStarted', { n = 1 }, { to = 'Sink' })\n"
            "  ctx:mark_pending_handoff{ reason = 'job' }\n"
            "end)\n");
  send_event(e, "s1", "ev1", "{}");
  WAIT_FOR(e, is_status(e, "ev1", NH_ST_PENDING));
  ASSERT_EQ_INT(q1i(e, "SELECT count(*) FROM queue WHERE endpoint = 'Sink' AND event_type = 'JobStarted'"), 1);
  env_stop(e);
}

TEST(transient_failure_is_pending_retrying_and_blocks_the_session_until_its_next_attempt)
{
  env_t *e = env_start(
            "local ep = nimbus.endpoint('Ep', { transient = { base = 0.2 } })\n"
            "local attempts = 0\n"
            "ep:on('Thing', function(event, ctx)\n"
            "  attempts = attempts + 1\n"
            "  record(ctx.event_id .. ':' .. attempts .. ':' .. ctx.retry_count)\n"
            "  if ctx.event_id == 'ev1' and attempts == 1 then error(nimbus.transient('ERP busy')) end\n"
            "end)\n");
  send_event(e, "s1", "ev1", "{}");
  send_event(e, "s1", "ev2", "{}");
  WAIT_FOR(e, is_status(e, "ev1", NH_ST_PENDING));
  ASSERT_EQ_STR(q1s(e, "SELECT sub_status FROM audit WHERE event_id = 'ev1'"), NH_SUB_RETRYING);
  ASSERT_EQ_INT(q1i(e, "SELECT attempts FROM audit WHERE event_id = 'ev1'"), 1);
  ASSERT_CONTAINS(q1s(e, "SELECT error_text FROM audit WHERE event_id = 'ev1'"), "ERP busy");
  ASSERT_EQ_STR(q1s(e, "SELECT blocked_by FROM sessions WHERE session_id = 's1'"), "ev1");
  ASSERT_CMP_INT(q1i(e, "SELECT retry_due FROM sessions WHERE session_id = 's1'"), >, 0);
  WAIT_FOR(e, is_status(e, "ev2", NH_ST_DEFERRED));   /* the sibling waits its turn */
  WAIT_FOR(e, is_status(e, "ev2", NH_ST_COMPLETED));
  ASSERT_EQ_STR(status_of(e, "Ep", "ev1"), NH_ST_COMPLETED);
  /* the second attempt is not a retry of a failure: retry_count stays 0 */
  ASSERT_EQ_STR(nh_test_read_file(e->log), "ev1:1:0\nev1:2:0\nev2:3:0\n");
  ASSERT_CONTAINS(q1s(e, "SELECT detail FROM history WHERE event_id = 'ev1' AND status = 'Pending'"),
                  "transient failure (attempt 1 of 20); next attempt in");
  ASSERT_CONTAINS(q1s(e, "SELECT error_text FROM history WHERE event_id = 'ev1' AND status = 'Pending'"), "ERP busy");
  env_stop(e);
}

TEST(transient_failures_end_failed_with_the_last_error_when_the_attempts_are_used_up)
{
  env_t *e = env_start(
            "local ep = nimbus.endpoint('Ep', { transient = { max_attempts = 3, base = 0.01 } })\n"
            "local attempts = 0\n"
            "ep:on('Thing', function(event, ctx)\n"
            "  attempts = attempts + 1\n"
            "  record('call')\n"
            "  error(nimbus.transient('ERP busy ' .. attempts))\n"
            "end)\n");
  send_event(e, "s1", "ev1", "{}");
  WAIT_FOR(e, is_status(e, "ev1", NH_ST_FAILED));
  ASSERT_EQ_INT(calls(e, "call"), 3);
  ASSERT_EQ_INT(q1i(e, "SELECT attempts FROM audit WHERE event_id = 'ev1'"), 3);
  ASSERT_CONTAINS(q1s(e, "SELECT error_text FROM audit WHERE event_id = 'ev1'"), "ERP busy 3");
  ASSERT_EQ_STR(q1s(e, "SELECT blocked_by FROM sessions WHERE session_id = 's1'"), "ev1");
  ASSERT_EQ_INT(q1i(e, "SELECT retry_due IS NULL FROM sessions WHERE session_id = 's1'"), 1);
  ASSERT_CONTAINS(q1s(e, "SELECT detail FROM history WHERE event_id = 'ev1' AND status = 'Failed'"),
                  "attempt 3 of 3): attempts used up");
  ASSERT_EQ_INT(q1i(e, "SELECT count(*) FROM history WHERE event_id = 'ev1' AND error_text LIKE 'ERP busy %%'"), 3);
  spin(e, 20);
  ASSERT_EQ_INT(calls(e, "call"), 3);   /* no further attempt */
  env_stop(e);
}

TEST(a_transient_retry_after_delays_the_next_attempt_up_to_the_policy_max_delay)
{
  env_t *e = env_start(
            "local ep = nimbus.endpoint('Ep', { transient = { base = 0.01, max_delay = 600 } })\n"
            "ep:on('Thing', function(event, ctx)\n"
            "  record('call ' .. ctx.event_id)\n"
            "  error(nimbus.transient('throttled', { retry_after = event.after }))\n"
            "end)\n");
  int64_t t0 = nh_time_now_ms();
  send_event(e, "s1", "ev1", "{\"after\": 300}");    /* longer than the policy's 10 ms: it wins */
  send_event(e, "s2", "ev2", "{\"after\": 5000}");   /* longer than max_delay: capped at 600 s */
  send_event(e, "s3", "ev3", "{}");                   /* none: the policy's delay */
  WAIT_FOR(e, is_status(e, "ev1", NH_ST_PENDING) && is_status(e, "ev2", NH_ST_PENDING) &&
              is_status(e, "ev3", NH_ST_PENDING));
  int64_t t1 = nh_time_now_ms();
  int64_t due1 = q1i(e, "SELECT retry_due FROM sessions WHERE session_id = 's1'");
  int64_t due2 = q1i(e, "SELECT retry_due FROM sessions WHERE session_id = 's2'");
  int64_t due3 = q1i(e, "SELECT retry_due FROM sessions WHERE session_id = 's3'");
  ASSERT_CMP_INT(due1, >=, t0 + 300000);
  ASSERT_CMP_INT(due1, <=, t1 + 300000);
  ASSERT_CMP_INT(due2, >=, t0 + 600000);
  ASSERT_CMP_INT(due2, <=, t1 + 600000);
  ASSERT_CMP_INT(due3, <, t0 + 300000);
  ASSERT_CONTAINS(q1s(e, "SELECT detail FROM history WHERE event_id = 'ev1' AND status = 'Pending'"),
                  "next attempt in 300000 ms");
  ASSERT_CONTAINS(q1s(e, "SELECT detail FROM history WHERE event_id = 'ev2' AND status = 'Pending'"),
                  "next attempt in 600000 ms");
  WAIT_FOR(e, calls(e, "call ev3") >= 2);   /* the policy's attempt came, the others are not due */
  ASSERT_EQ_INT(calls(e, "call ev1"), 1);
  ASSERT_EQ_INT(calls(e, "call ev2"), 1);
  env_stop(e);
}

TEST(inbox_skips_duplicate_message_ids)
{
  env_t *e = env_start(
            "local ep = nimbus.endpoint('Ep', { inbox = true })\n"
            "ep:on('Thing', function(event, ctx) record(ctx.event_id) end)\n");
  for (int i = 0; i < 2; i++) {
    nh_msg_t m;
    memset(&m, 0, sizeof m);
    m.session_id = "s1";
    m.message_id = "same-mid";
    m.event_id = i == 0 ? "ev1" : "ev2";
    m.event_type = "Thing";
    m.body = "{}";
    m.body_len = 2;
    tx_begin(e);
    send_in_tx(e, &m, "Ep");
    tx_commit(e);
  }
  WAIT_FOR(e, is_status(e, "ev2", NH_ST_SKIPPED));
  ASSERT_EQ_STR(status_of(e, "Ep", "ev1"), NH_ST_COMPLETED);
  ASSERT_EQ_INT(calls(e, "ev2"), 0);
  ASSERT_EQ_INT(e->pg ? nh_pgs_inbox_has(e->pgdb, "Ep", "same-mid") : nh_store_inbox_has(e->store, "Ep", "same-mid"), 1);
  env_stop(e);
}

TEST(load_rejects_bad_adapters)
{
  /* unknown endpoint option, syntax error, no endpoint: each a clear error, no leak */
  static const char *const bad[] = {
    "nimbus.endpoint('Ep', { retries = 3 })\n",
    "local x = = 1\n",
    "local y = 1\n",
    "nimbus.endpoint('Ep', { transient = 5 })\n",
    "nimbus.endpoint('Ep', { transient = { max_attempts = 0 } })\n",
    "nimbus.endpoint('Ep', { transient = { tries = 3 } })\n",
    "nimbus.endpoint('Ep', { transient = { base = -1 } })\n",
  };
  static const char *const expect[] = { "retries", "adapter.lua:", "defines no endpoint", "transient must be a table",
                                        "max_attempts must be an integer from 1", "unknown option transient.tries",
                                        "base must be a number of seconds" };
  for (int i = 0; i < 7; i++) {
    nh_runtime_t rt;
    ASSERT_EQ_INT(nh_runtime_init(&rt), 0);
    uv_loop_t *loop = &rt.loop;
    nh_store_t *s = NULL;
    nh_error_t err = {0};
    ASSERT_EQ_INT(nh_store_open(&s, nh_test_path("nimbus.db"), NH_STORE_CREATE, &err), NH_OK);
    nh_transport_t *tr = nh_embedded_init(nh_store_db(s), "test-host", &err);
    ASSERT_NOT_NULL(tr);
    char src[512];
    snprintf(src, sizeof src, "local nimbus = require('nimbus')\n%s", bad[i]);
    ASSERT_EQ_INT(nh_test_write_file(nh_test_path("adapter.lua"), src), 0);
    nh_dispatch_t *d = nh_dispatch_init(loop, s, tr, nh_vm_lua_dir(NULL));
    memset(&err, 0, sizeof err);
    ASSERT_EQ_INT(nh_dispatch_load(d, nh_test_path("adapter.lua"), &err), NH_EUSAGE);
    ASSERT_CONTAINS(err.msg, expect[i]);
    ASSERT_EQ_INT(nh_dispatch_endpoint_count(d), 0);
    nh_dispatch_close(d);
    loop_finish(loop);
    tr->vt->close(tr);
    nh_store_close(s);
    ASSERT_EQ_INT(nh_runtime_close(&rt), 0);
  }
}

/* ---- handlers that yield to the loop (what nimbus.sleep / http will do) ---- */

TEST(yielding_handler_completes)
{
  env_t *e = env_start(
            "local ep = nimbus.endpoint('Ep', {})\n"
            "ep:on('Thing', function(event, ctx)\n"
            "  for i = 1, 10 do coroutine.yield() end\n"
            "  record(ctx.event_id)\n"
            "end)\n");
  send_event(e, "s1", "ev1", "{}");
  send_event(e, "s1", "ev2", "{}");
  send_event(e, "s2", "ev3", "{}");
  WAIT_FOR(e, is_status(e, "ev2", NH_ST_COMPLETED) && is_status(e, "ev3", NH_ST_COMPLETED));
  ASSERT_EQ_INT(calls(e, "ev1"), 1);
  ASSERT_EQ_INT(calls(e, "ev2"), 1);
  ASSERT_EQ_INT(calls(e, "ev3"), 1);
  env_stop(e);
}

/* The value of a series in the metrics exposition ("name{labels}"), 0 while it has none. */
static double metric_value(const char *series)
{
  size_t len = 0;
  char *text = nh_metrics_render(&len);
  char *at = strstr(text, series);
  double v = at ? strtod(at + strlen(series), NULL) : 0;
  free(text);
  return v;
}

/* A batch is recorded in one go; when one job of it cannot be (its session lock was
 * taken over while its handler ran), the batch is applied again job by job: the others
 * commit, that one's outcome is dropped and its message is delivered again. The loss is
 * told (logged, counted) once, however often the job is applied again (job by job, in a
 * pass run again after a miss). */
TEST(a_lost_lock_in_a_batch_drops_that_outcome_only)
{
  const char *lost_series = "nimbus_locks_lost_total{endpoint=\"Ep\"}";
  double lost_before = metric_value(lost_series);
  char body[1024];
  snprintf(body, sizeof body,
           "local GO = [[%s]]\n"
           "local ep = nimbus.endpoint('Ep', {})\n"
           "ep:on('Thing', function(event, ctx)\n"
           "  record('start ' .. ctx.event_id)\n"
           "  while not io.open(GO) do coroutine.yield() end\n"
           "  record('done ' .. ctx.event_id)\n"
           "end)\n",
           nh_test_path("go"));
  env_t *e = env_start(body);
  send_event(e, "s1", "ev1", "{}");
  send_event(e, "s2", "ev2", "{}");
  send_event(e, "s3", "ev3", "{}");
  WAIT_FOR(e, calls(e, "start ") == 3);   /* all three hold their session */
  ASSERT_EQ_INT(q1i(e, "UPDATE session_locks SET owner = 'thief', locked_until = 9000000000000 "
                       "WHERE session_id = 's2' RETURNING 1"), 1);
  if (nh_test_write_file(nh_test_path("go"), "")) FAIL("cannot write the go file");
  WAIT_FOR(e, is_status(e, "ev1", NH_ST_COMPLETED) && is_status(e, "ev3", NH_ST_COMPLETED));
  spin(e, 50);
  ASSERT_EQ_STR(status_of(e, "Ep", "ev2"), "");   /* nothing recorded for it */
  ASSERT_EQ_INT(queued(e), 1);
  ASSERT_EQ_INT(calls(e, "done ev2"), 1);
  ASSERT_EQ_INT((int)(metric_value(lost_series) - lost_before), 1);
  /* the thief lets go: the message is delivered again and completes */
  ASSERT_EQ_INT(q1i(e, "DELETE FROM session_locks WHERE owner = 'thief' RETURNING 1"), 1);
  WAIT_FOR(e, is_status(e, "ev2", NH_ST_COMPLETED));
  ASSERT_EQ_INT(calls(e, "done ev1"), 1);
  ASSERT_EQ_INT(calls(e, "done ev2"), 2);
  ASSERT_EQ_INT(calls(e, "done ev3"), 1);
  ASSERT_EQ_INT(queued(e), 0);
  env_stop(e);
}

TEST(yielding_retry_runs_once_per_attempt)
{
  /* While a retry's handler is suspended the session's retry is still "due" in the
   * store; it must not be picked up and started a second time. */
  env_t *e = env_start(
            "local ep = nimbus.endpoint('Ep', { retry = { max_retries = 1, base = 0.01 } })\n"
            "ep:on('Thing', function(event, ctx)\n"
            "  record(ctx.event_id .. ':' .. ctx.kind)\n"
            "  for i = 1, 20 do coroutine.yield() end\n"
            "  error('always fails')\n"
            "end)\n");
  send_event(e, "s1", "ev1", "{}");
  WAIT_FOR(e, is_status(e, "ev1", NH_ST_FAILED) &&
                 q1i(e, "SELECT retry_count FROM audit WHERE event_id = 'ev1'") == 1 &&
                 q1i(e, "SELECT retry_due IS NULL FROM sessions WHERE session_id = 's1'") == 1);
  spin(e, 50);
  ASSERT_EQ_INT(calls(e, "ev1:event"), 1);
  ASSERT_EQ_INT(calls(e, "ev1:retry"), 1);
  env_stop(e);
}

TEST(yielding_replay_runs_each_parked_message_once)
{
  /* While a parked message's handler is suspended the session is still draining with
   * that message at the head of the parked queue; it must not start again. */
  env_t *e = env_start(
            "local ep = nimbus.endpoint('Ep', {})\n"
            "ep:on('Thing', function(event, ctx)\n"
            "  record(ctx.event_id .. ':' .. ctx.kind)\n"
            "  if event.fail then error('boom') end\n"
            "  for i = 1, 20 do coroutine.yield() end\n"
            "end)\n");
  send_event(e, "s1", "ev1", "{\"fail\":true}");
  send_event(e, "s1", "ev2", "{}");
  send_event(e, "s1", "ev3", "{}");
  WAIT_FOR(e, parked(e, "s1") == 2);
  send_control(e, NH_MT_SKIP, "s1", "ev1", NULL);
  WAIT_FOR(e, is_status(e, "ev3", NH_ST_COMPLETED) && !session_exists(e, "s1"));
  spin(e, 20);
  ASSERT_EQ_INT(calls(e, "ev2:"), 1);
  ASSERT_EQ_INT(calls(e, "ev3:"), 1);
  ASSERT_EQ_STR(nh_test_read_file(e->log), "ev1:event\nev2:replay\nev3:replay\n");
  env_stop(e);
}

TEST(stop_with_running_task_cancels_without_settling)
{
  env_t *e = env_start(
            "local ep = nimbus.endpoint('Ep', {})\n"
            "ep:on('Thing', function(event, ctx)\n"
            "  record(ctx.event_id)\n"
            "  while true do coroutine.yield() end\n"
            "end)\n");
  send_event(e, "s1", "ev1", "{}");
  WAIT_FOR(e, calls(e, "ev1") == 1);
  nh_dispatch_stop(e->d, 50, on_stopped, e);   /* drain deadline: the task never ends */
  WAIT_FOR(e, e->stopped);
  ASSERT_EQ_STR(status_of(e, "Ep", "ev1"), "");
  ASSERT_EQ_INT(queued(e), 1);   /* still there for the next host */
  ASSERT_EQ_INT(q1i(e, "SELECT count(*) FROM session_locks"), 0);   /* released, not left to expire */
  env_stop(e);
}

/* ---------------------------------------------------------------- cost at outage scale */

/* sqlite VM steps since the last call, summed over every statement of the connection:
 * a deterministic measure of the rows the store touched (a scan adds steps per row). */
static long long vm_steps(env_t *e)
{
  long long n = 0;
  sqlite3 *db = nh_store_db(e->store);
  for (sqlite3_stmt *st = sqlite3_next_stmt(db, NULL); st; st = sqlite3_next_stmt(db, st))
    n += sqlite3_stmt_status(st, SQLITE_STMTSTATUS_VM_STEP, 1);
  return n;
}

/* One message of `type` per session and round, `per` rounds over `nsessions` sessions
 * (interleaved, as an outage's traffic arrives), all in one transaction. Event ids are
 * "<tag>-<session>-<round>". */
static void send_rounds_of(env_t *e, nh_msg_type_t type, int nsessions, int per, const char *tag, const char *body)
{
  tx_begin(e);
  for (int r = 0; r < per; r++) {
    for (int i = 0; i < nsessions; i++) {
      char mid[37], eid[64], session[32];
      nh_uuid_v7(mid);
      snprintf(eid, sizeof eid, "%s-%d-%d", tag, i, r);
      snprintf(session, sizeof session, "s%d", i);
      nh_msg_t m;
      memset(&m, 0, sizeof m);
      m.session_id = session;
      m.message_id = mid;
      m.event_id = eid;
      m.event_type = "Thing";
      m.type = type;
      m.body = (char *)body;
      m.body_len = body ? strlen(body) : 0;
      m.enqueued_at = nh_time_now_ms();
      send_in_tx(e, &m, "Ep");
    }
  }
  tx_commit(e);
}

static void send_rounds(env_t *e, int nsessions, int per, const char *tag, const char *body)
{
  send_rounds_of(e, NH_MT_EVENT, nsessions, per, tag, body);
}

static int count_status(env_t *e, const char *status)
{
  return (int)q1i(e, "SELECT count(*) FROM audit WHERE endpoint = 'Ep' AND status = '%s'", status);
}

/* thousands of events: valgrind runs them 50x slower than the plain build */
#define BIG_WAIT_MS 240000

/* Blocks `nblocked` sessions, parks `background` events in each, then measures the
 * store work (VM steps) per event parked for 3 more events per session, and per event
 * replayed once every blocker is skipped. */
static double park_steps_per_event(int nblocked, int background, double *replay)
{
  env_t *e = env_start("local ep = nimbus.endpoint('Ep', { concurrency = 64, retry = { max_retries = 0 } })\n"
                       "ep:on('Thing', function(event) if event.fail then error('ERP down') end end)\n");
  send_rounds(e, nblocked, 1, "head", "{\"fail\":true}");
  WAIT_FOR_MS(e, count_status(e, NH_ST_FAILED) == nblocked, BIG_WAIT_MS);
  if (background) {
    send_rounds(e, nblocked, background, "bg", "{}");
    WAIT_FOR_MS(e, count_status(e, NH_ST_DEFERRED) == nblocked * background, BIG_WAIT_MS);
  }
  vm_steps(e);
  send_rounds(e, nblocked, 3, "late", "{}");
  WAIT_FOR_MS(e, count_status(e, NH_ST_DEFERRED) == nblocked * (background + 3), BIG_WAIT_MS);
  double per = (double)vm_steps(e) / (nblocked * 3);
  send_rounds_of(e, NH_MT_SKIP, nblocked, 1, "head", NULL);   /* skip every blocker: head-<i>-0 */
  WAIT_FOR_MS(e, count_status(e, NH_ST_COMPLETED) == nblocked * (background + 3), BIG_WAIT_MS);
  *replay = (double)vm_steps(e) / (nblocked * (background + 3));
  ASSERT_EQ_INT(q1i(e, "SELECT count(*) FROM sessions"), 0);
  env_stop(e);
  static const char *const files[] = { "nimbus.db", "nimbus.db-wal", "nimbus.db-shm", "calls.log" };
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) unlink(nh_test_path(files[i]));   /* a fresh store next */
  return per;
}

/* Issue 10: parking costs the same per event with few or many blocked sessions and
 * parked events. Before the partial indexes, every pump scanned all blocked sessions for
 * due retries and each park scanned the endpoint's queue for the session's next rows. */
TEST(parking_and_replay_cost_do_not_grow_with_the_backlog)
{
  double small_replay, large_replay;
  double small = park_steps_per_event(50, 0, &small_replay);
  double large = park_steps_per_event(1000, 4, &large_replay);
  fprintf(stderr, "  store VM steps per parked event: %.0f (50 blocked) vs %.0f (1000 blocked, 4000 parked)\n"
          "  per replayed event: %.0f vs %.0f\n", small, large, small_replay, large_replay);
  ASSERT_CMP_INT((long long)large, <, (long long)(small * 1.5));
  ASSERT_CMP_INT((long long)large_replay, <, (long long)(small_replay * 1.5));
}

/* During the recovery of a large outage the replays fill every slot; a new arrival in a
 * free session must still be taken long before the whole backlog has replayed. */
TEST(new_arrivals_move_while_a_large_backlog_replays)
{
  env_t *e = env_start("local ep = nimbus.endpoint('Ep', { concurrency = 4, retry = { max_retries = 0 } })\n"
                       "ep:on('Thing', function(event) if event.fail then error('ERP down') end end)\n");
  send_rounds(e, 200, 1, "head", "{\"fail\":true}");
  WAIT_FOR_MS(e, count_status(e, NH_ST_FAILED) == 200, BIG_WAIT_MS);
  send_rounds(e, 200, 5, "bg", "{}");
  WAIT_FOR_MS(e, count_status(e, NH_ST_DEFERRED) == 1000, BIG_WAIT_MS);
  send_rounds_of(e, NH_MT_SKIP, 200, 1, "head", NULL);
  WAIT_FOR_MS(e, count_status(e, NH_ST_COMPLETED) >= 8, BIG_WAIT_MS);   /* the replay is under way */
  send_full(e, "Ep", NH_MT_EVENT, "Thing", "fresh-session", "fresh", "{}", NULL, NULL);
  WAIT_FOR_MS(e, is_status(e, "fresh", NH_ST_COMPLETED), BIG_WAIT_MS);
  int replayed = count_status(e, NH_ST_COMPLETED) - 1;
  fprintf(stderr, "  the new arrival completed after %d of 1000 replays\n", replayed);
  ASSERT_CMP_INT(replayed, <, 500);
  WAIT_FOR_MS(e, count_status(e, NH_ST_COMPLETED) == 1001, BIG_WAIT_MS);
  env_stop(e);
}

/* A second host on the same store and loop: its own connection(s), transport and
 * dispatcher, owner "test-host-2", running adapter source `body` (after the prelude). */
typedef struct host2 {
  nh_store_t *store;
  nh_pg_link_t *link;
  nh_transport_t *tr;
  nh_dispatch_t *d;
  int stopped, link_closed;
} host2_t;

static void host2_stopped(void *data)
{
  host2_t *h = data;
  h->stopped = 1;
}

static void host2_link_closed(void *data) { ((host2_t *)data)->link_closed = 1; }

static void host2_start(env_t *e, host2_t *h, const char *body)
{
  const char *adapter = write_adapter(e, "adapter2.lua", body);
  nh_error_t err = {0};
  if (e->pg) {
    if (nh_pg_link_open(&e->rt.loop, e->url_for_link, NULL, &h->link, &err)) FAIL("link: %s", err.msg);
    h->tr = nh_embedded_pg_init(h->link, PQconnectdb(e->url_for_link), "test-host-2", &err);
    if (!h->tr) FAIL("transport: %s", err.msg);
    h->d = nh_dispatch_init_pg(&e->rt.loop, h->link, h->tr, nh_vm_lua_dir(NULL));
  } else {
    if (nh_store_open(&h->store, nh_test_path("nimbus.db"), 0, &err)) FAIL("store: %s", err.msg);
    h->tr = nh_embedded_init(nh_store_db(h->store), "test-host-2", &err);
    if (!h->tr) FAIL("transport: %s", err.msg);
    h->d = nh_dispatch_init(&e->rt.loop, h->store, h->tr, nh_vm_lua_dir(NULL));
  }
  if (nh_dispatch_load(h->d, adapter, &err)) FAIL("load adapter: %s", err.msg);
  if (nh_dispatch_start(h->d, &err)) FAIL("start: %s", err.msg);
}

static void host2_stop(env_t *e, host2_t *h)
{
  nh_dispatch_stop(h->d, 2000, host2_stopped, h);
  WAIT_FOR(e, h->stopped);
  nh_dispatch_close(h->d);
  if (h->link) {
    nh_pg_link_close(h->link, host2_link_closed, h);
    WAIT_FOR(e, h->link_closed);
  }
  h->tr->vt->close(h->tr);
  nh_store_close(h->store);
}

/* Two hosts share one store's queue (on PostgreSQL, as hosts on two machines would): every
 * event is handled once, each session's in order, and both hosts take part. */
TEST(two_hosts_share_the_queue_each_event_once_in_session_order)
{
  const char *handler = "ep:on('Thing', function(event, ctx)\n"
                        "  for i = 1, 3 do coroutine.yield() end\n"
                        "  record(HOST .. ':' .. ctx.session_id .. ':' .. event.n)\n"
                        "end)\n";
  char a[512], b[512];
  snprintf(a, sizeof a, "local HOST = 'A'\nlocal ep = nimbus.endpoint('Ep', { concurrency = 2 })\n%s", handler);
  snprintf(b, sizeof b, "local HOST = 'B'\nlocal ep = nimbus.endpoint('Ep', { concurrency = 2 })\n%s", handler);
  env_t *e = env_start(a);
  host2_t h2 = {0};
  host2_start(e, &h2, b);
  enum { SESSIONS = 20, PER = 10 };
  send_numbered(e, SESSIONS * PER, SESSIONS);
  WAIT_FOR(e, q1i(e, "SELECT count(*) FROM audit WHERE status = 'Completed'") == SESSIONS * PER);
  host2_stop(e, &h2);
  ASSERT_EQ_INT(calls(e, ""), SESSIONS * PER);   /* once each */
  int last[SESSIONS], seen[SESSIONS] = {0}, by_a = 0, by_b = 0;
  for (int i = 0; i < SESSIONS; i++) last[i] = -1;
  for (const char *p = nh_test_read_file(e->log); *p;) {
    char host;
    int sn, n;
    if (sscanf(p, "%c:s%d:%d", &host, &sn, &n) != 3 || sn < 0 || sn >= SESSIONS) FAIL("bad log line near %.20s", p);
    ASSERT_CMP_INT(n, >, last[sn]);   /* in session order, whichever host ran it */
    last[sn] = n;
    seen[sn]++;
    by_a += host == 'A';
    by_b += host == 'B';
    const char *nl = strchr(p, '\n');
    if (!nl) break;
    p = nl + 1;
  }
  for (int i = 0; i < SESSIONS; i++) ASSERT_EQ_INT(seen[i], PER);
  ASSERT_CMP_INT(by_a, >, 0);
  ASSERT_CMP_INT(by_b, >, 0);
  ASSERT_EQ_INT(q1i(e, "SELECT count(*) FROM session_locks"), 0);
  env_stop(e);
}

int main(int argc, char **argv)
{
  if (!pg_mode()) return nh_test_run_all(argc, argv);
  int rc = nh_pgtest_setup(NH_PGTEST_HOOKS, argv[0], NH_PGTEST_NEED_ADMIN_URL, "skipped");
  if (rc) return rc;
  rc = nh_test_run_all(argc, argv);
  nh_pgtest_teardown();
  return rc;
}
