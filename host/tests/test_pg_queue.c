/* The embedded transport's tables and statements on PostgreSQL (store/nh_pg_queue.c)
 * against a real server:
 * - its migration, apart from the store's (own version table, own advisory lock), by the
 *   store's migrator (the same refusals and explanations);
 * - parity: the same sequence run through the real sqlite transport (nh_embedded.c:
 *   subscribe, send, receive, lock/unlock/renew, settle complete/release/dead-letter,
 *   session_next) and through the PostgreSQL operations, comparing the messages handed
 *   out field by field and in order, the queue, the session locks and the dead letters;
 * - heads_and_lock for several hosts: two connections running it at once over 200
 *   sessions take each exactly once; one mid-statement (its transaction open) is skipped,
 *   not waited for; an expired lease is taken over by the other owner, a live one is not;
 * - the one executor: the queue's operations run on nh_pg_exec.c's executor like the
 *   store's, and in one batch with them (a pump's settlement and its store rows): one
 *   round trip, each prepared once per connection, all committed or nothing.
 *
 * NH_PG_URL names the test cluster (the ctest fixture "postgres") and NH_PG_ADMIN_URL a
 * superuser, through which each test makes its own database (nh_pgtest.h). Without
 * either the suite reports itself skipped (77), except under CI=true. Time is the `now`
 * argument, never a sleep. */
#include "nh_test.h"
#include "nh_test_sql.h"
#include "nh_pgtest.h"

#include "core/nh_util.h"
#include "store/nh_pg.h"
#include "store/nh_pg_queue.h"
#include "store/nh_store.h"
#include "transport/nh_embedded.h"

#include <poll.h>

#define OWNER_A "test-host-a"
#define OWNER_B "test-host-b"
#define LOCK_MS 30000
#define MAX_GOT 64

/* ---------------------------------------------------------------- PostgreSQL */

/* A connection to url with the queue tables migrated and the executor on it. */
static nh_pg_db_t *queue_conn(const char *url) { return nh_pgtest_db(url, nh_pg_queue_migrate, "queue"); }

/* Runs op (built into a); FAILs on an error. The caller PQclear()s. */
static PGresult *run(nh_pg_db_t *q, nh_pgqop_t op, nh_pg_args_t *a)
{
  nh_error_t err = { 0 };
  PGresult *r = NULL;
  if (nh_pgq_run(q, op, a, &r, &err)) FAIL("%s: %s", nh_pgqop_name(op), err.msg);
  return r;
}

static int run_affected(nh_pg_db_t *q, nh_pgqop_t op, nh_pg_args_t *a)
{
  PGresult *r = run(q, op, a);
  int n = nh_pg_affected(r);
  PQclear(r);
  return n;
}

/* ---------------------------------------------------------------- messages */

typedef struct got {
  int n;
  nh_msg_t m[MAX_GOT];
} got_t;

static void got_clear(got_t *g)
{
  for (int i = 0; i < g->n; i++) nh_msg_clear(&g->m[i]);
  g->n = 0;
}

static void got_free(void *g)
{
  got_clear(g);
  free(g);
}

static got_t *got_new(void)
{
  got_t *g = calloc(1, sizeof *g);
  nh_test_on_cleanup(got_free, g);
  return g;
}

/* heads_and_lock's rows into g (cleared first); returns how many. */
static int take_rows(got_t *g, PGresult *r, const char *ep)
{
  got_clear(g);
  if (PQntuples(r) > MAX_GOT) FAIL("%d rows, more than %d", PQntuples(r), MAX_GOT);
  for (int i = 0; i < PQntuples(r); i++) nh_pgq_row(r, i, ep, &g->m[g->n++]);
  PQclear(r);
  return g->n;
}

static int pg_receive(nh_pg_db_t *q, got_t *g, const char *ep, int max, int64_t now, const char *owner)
{
  nh_pg_args_t a;
  nh_pgqop_t op = nh_pgqargs_heads_and_lock(&a, ep, now, max, owner, now + LOCK_MS);
  return take_rows(g, run(q, op, &a), ep);
}

static void same_str(const char *what, int i, const char *l, const char *p)
{
  if ((l == NULL) != (p == NULL) || (l && strcmp(l, p) != 0))
    FAIL("message %d, %s: sqlite %s, PostgreSQL %s", i, what, l ? l : "NULL", p ? p : "NULL");
}

static void same_i64(const char *what, int i, int64_t l, int64_t p)
{
  if (l != p) FAIL("message %d, %s: sqlite %lld, PostgreSQL %lld", i, what, (long long)l, (long long)p);
}

#define S(f) same_str(#f, i, l->f, p->f)
#define I(f) same_i64(#f, i, l->f, p->f)

static void same_msg(int i, const nh_msg_t *l, const nh_msg_t *p)
{
  I(seq); S(endpoint); S(session_id); S(message_id); S(event_id); S(event_type); I(type); S(correlation_id);
  S(originating_message_id); S(parent_message_id); S(from); S(reply_to); I(retry_count); I(delivery_count);
  I(release_count); I(enqueued_at); S(error_text); S(error_type); S(traceparent); S(tracestate);
  I(body_len);
  if ((l->body == NULL) != (p->body == NULL) || (l->body && memcmp(l->body, p->body, l->body_len) != 0))
    FAIL("message %d: the bodies differ", i);
}

#undef S
#undef I

static void same_msgs(const got_t *l, const got_t *p)
{
  if (l->n != p->n) FAIL("sqlite handed out %d messages, PostgreSQL %d", l->n, p->n);
  for (int i = 0; i < l->n; i++) same_msg(i, &l->m[i], &p->m[i]);
}

/* ---------------------------------------------------------------- both */

typedef struct pair {
  nh_store_t *store;
  nh_transport_t *tr, *tr_b;    /* owner A and owner B on the sqlite file */
  got_t *lite;                  /* what the sqlite transport handed out */
  got_t *pg;                    /* what heads_and_lock returned */
  char eps[8][64], eids[8][64];   /* the copies the last sqlite send queued */
  int ncopies;
  nh_pg_db_t *q;
} pair_t;

static void on_msg(void *data, nh_msg_t *m)
{
  got_t *g = data;
  if (g->n < MAX_GOT) g->m[g->n++] = *m;
  else nh_msg_clear(m);
  free(m);
}

static void on_sent(void *data, const char *ep, const char *eid)
{
  pair_t *b = data;
  if (b->ncopies >= 8) return;
  snprintf(b->eps[b->ncopies], sizeof b->eps[0], "%s", ep);
  snprintf(b->eids[b->ncopies++], sizeof b->eids[0], "%s", eid);
}

static void close_pair(void *p)
{
  pair_t *b = p;
  if (b->tr_b) b->tr_b->vt->close(b->tr_b);
  if (b->tr) b->tr->vt->close(b->tr);
  nh_store_close(b->store);
  free(b);
}

static pair_t *pair_open(void)
{
  pair_t *b = calloc(1, sizeof *b);
  b->lite = got_new();
  b->pg = got_new();
  nh_test_on_cleanup(close_pair, b);
  nh_error_t err = { 0 };
  if (nh_store_open(&b->store, nh_test_path("lite.db"), NH_STORE_CREATE, &err)) FAIL("sqlite: %s", err.msg);
  b->tr = nh_embedded_init(nh_store_db(b->store), OWNER_A, &err);
  b->tr_b = b->tr ? nh_embedded_init(nh_store_db(b->store), OWNER_B, &err) : NULL;
  if (!b->tr_b) FAIL("nh_embedded_init: %s", err.msg);
  b->tr->on_message = b->tr_b->on_message = on_msg;
  b->tr->cb_data = b->tr_b->cb_data = b->lite;
  b->tr->lock_ms = b->tr_b->lock_ms = LOCK_MS;
  nh_embedded_on_sent(b->tr, on_sent, b);
  b->q = queue_conn(nh_pgtest_scratch_url());
  return b;
}

static sqlite3 *lite_db(pair_t *b) { return nh_store_db(b->store); }

static int lite_receive(pair_t *b, const char *ep, int max, int64_t now)
{
  got_clear(b->lite);
  int n = b->tr->vt->receive(b->tr, ep, max, now);
  if (n != b->lite->n) FAIL("receive returned %d but handed out %d", n, b->lite->n);
  return n;
}

/* Receives on both; they handed out the same; how many. */
static int receive_both(pair_t *b, const char *ep, int max, int64_t now)
{
  int n = lite_receive(b, ep, max, now);
  pg_receive(b->q, b->pg, ep, max, now, OWNER_A);
  same_msgs(b->lite, b->pg);
  return n;
}

/* The rows of SQL (one text column; the same text on both dialects) joined by newlines. */
static void dump_lite(sqlite3 *db, const char *sql, char *out, size_t len)
{
  sqlite3_stmt *st;
  if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) FAIL("sqlite %s: %s", sql, sqlite3_errmsg(db));
  size_t o = 0;
  out[0] = '\0';
  while (sqlite3_step(st) == SQLITE_ROW)
    o += (size_t)snprintf(out + o, len - o, "%s\n", (const char *)sqlite3_column_text(st, 0));
  sqlite3_finalize(st);
  if (o >= len) FAIL("dump longer than %zu bytes", len);
}

static void dump_pg(PGconn *c, const char *sql, char *out, size_t len)
{
  PGresult *r = PQexec(c, sql);
  if (PQresultStatus(r) != PGRES_TUPLES_OK) FAIL("PostgreSQL %s: %s", sql, PQresultErrorMessage(r));
  size_t o = 0;
  out[0] = '\0';
  for (int i = 0; i < PQntuples(r) && o < len; i++) o += (size_t)snprintf(out + o, len - o, "%s\n", PQgetvalue(r, i, 0));
  PQclear(r);
  if (o >= len) FAIL("dump longer than %zu bytes", len);
}

static const char *const queue_dump =
  "SELECT CAST(seq AS TEXT) || '|' || endpoint || '|' || session_id || '|' || message_id || '|' ||"
  " coalesce(event_id, '-') || '|' || coalesce(event_type, '-') || '|' || message_type || '|' ||"
  " coalesce(correlation_id, '-') || '|' || coalesce(reply_to, '-') || '|' || CAST(retry_count AS TEXT) || '|' ||"
  " CAST(delivery_count AS TEXT) || '|' || CAST(releases AS TEXT) || '|' || CAST(enqueued_at AS TEXT) || '|' ||"
  " CAST(visible_at AS TEXT) || '|' || coalesce(traceparent, '-') FROM queue ORDER BY seq";
/* A delayed release's end is the transport's clock (nh_time_now_ms): checked apart. */
static const char *const locks_dump =
  "SELECT endpoint || '|' || session_id || '|' || coalesce(owner, '-') || '|' ||"
  " CASE WHEN owner IS NULL THEN 'held' ELSE CAST(locked_until AS TEXT) END FROM session_locks"
  " ORDER BY endpoint, session_id";
static const char *const dead_dump =
  "SELECT CAST(seq AS TEXT) || '|' || endpoint || '|' || coalesce(session_id, '-') || '|' ||"
  " coalesce(message_id, '-') || '|' || coalesce(event_id, '-') || '|' || coalesce(event_type, '-') || '|' ||"
  " coalesce(message_type, '-') || '|' || coalesce(reason, '-') || '|' || CAST(delivery_count AS TEXT)"
  " FROM dead_letters ORDER BY seq";
static const char *const subs_dump =
  "SELECT event_type || '|' || endpoint || '|' || CAST(command AS TEXT) FROM subscriptions"
  " ORDER BY event_type, endpoint";

/* The table reads the same on both; returns sqlite's dump (static) for further checks. */
static const char *same_table(pair_t *b, const char *what, const char *sql)
{
  static char l[16384];
  char p[16384];
  dump_lite(lite_db(b), sql, l, sizeof l);
  dump_pg(nh_pg_db_conn(b->q), sql, p, sizeof p);
  if (strcmp(l, p) != 0) FAIL("%s differ:\n-- sqlite\n%s-- PostgreSQL\n%s", what, l, p);
  return l;
}

static void same_tables(pair_t *b)
{
  same_table(b, "queue rows", queue_dump);
  same_table(b, "session locks", locks_dump);
  same_table(b, "dead letters", dead_dump);
}

/* emb_subscribe's statements: replace the endpoint's subscriptions; the first conflicting
 * endpoint's name into conflict ("" if none). */
static void pg_subscribe(pair_t *b, const char *ep, const char *const *types, const int *cmds, int n)
{
  nh_pg_args_t a;
  run_affected(b->q, nh_pgqargs_sub_del(&a, ep), &a);
  for (int i = 0; i < n; i++) {
    PGresult *r = run(b->q, nh_pgqargs_sub_conflict(&a, types[i], ep, cmds[i]), &a);
    int conflicts = PQntuples(r);
    PQclear(r);
    if (conflicts) FAIL("subscribing %s to %s: a conflict on PostgreSQL only", ep, types[i]);
    run_affected(b->q, nh_pgqargs_sub_add(&a, types[i], ep, cmds[i]), &a);
  }
}

static void subscribe_both(pair_t *b, const char *ep, const char *const *types, const int *cmds, int n)
{
  nh_error_t err = { 0 };
  if (b->tr->vt->subscribe(b->tr, ep, types, cmds, n, &err)) FAIL("subscribe %s: %s", ep, err.msg);
  pg_subscribe(b, ep, types, cmds, n);
}

/* Sends m through the sqlite transport (to NULL: fan-out), then queues the same copies
 * on PostgreSQL: a fan-out's endpoints are SUBSCRIBERS', checked against sqlite's, with
 * the event ids sqlite gave them. Returns the copies. */
static int send_both(pair_t *b, const char *to, const nh_msg_t *m)
{
  nh_error_t err = { 0 };
  int copies = 0;
  b->ncopies = 0;
  if (b->tr->vt->send(b->tr, m, to, &copies, &err)) FAIL("send: %s", err.msg);
  if (copies != b->ncopies) FAIL("send said %d copies, told %d", copies, b->ncopies);
  nh_pg_args_t a;
  if (!to) {
    PGresult *r = run(b->q, nh_pgqargs_subscribers(&a, m->event_type), &a);
    if (PQntuples(r) != copies) FAIL("%d subscribers of %s on PostgreSQL, %d copies on sqlite", PQntuples(r),
                                     m->event_type, copies);
    for (int i = 0; i < copies; i++) ASSERT_EQ_STR(PQgetvalue(r, i, 0), b->eps[i]);
    PQclear(r);
  }
  for (int i = 0; i < copies; i++) {
    PGresult *r = run(b->q, nh_pgqargs_insert(&a, m, b->eps[i], b->eids[i]), &a);
    ASSERT_EQ_INT(PQntuples(r), 1);   /* RETURNING seq */
    PQclear(r);
  }
  return copies;
}

/* A body with a NUL and bytes that are not UTF-8, as bodies may be. */
static const char body_bytes[] = "{\"k\":\"a\0b\xff\xfe\x80\"}";

static nh_msg_t msg_of(const char *session, const char *event_id, const char *message_id, int64_t at)
{
  nh_msg_t m;
  memset(&m, 0, sizeof m);
  m.session_id = (char *)session;
  m.event_id = (char *)event_id;
  m.message_id = (char *)message_id;
  m.event_type = "Thing";
  m.type = NH_MT_EVENT;
  m.correlation_id = "corr-1";
  m.originating_message_id = "orig-1";
  m.parent_message_id = "parent-1";
  m.from = "Tests";
  m.traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  m.tracestate = "vendor=abc";
  m.body = "{\"n\":1}";
  m.body_len = 7;
  m.enqueued_at = at;
  return m;
}

/* The head handed out of `session` (sqlite's copy), or FAIL. */
static const nh_msg_t *head_of(pair_t *b, const char *session)
{
  for (int i = 0; i < b->lite->n; i++)
    if (strcmp(b->lite->m[i].session_id, session) == 0) return &b->lite->m[i];
  FAIL("no head of %s handed out", session);
}

/* ---------------------------------------------------------------- migration */

TEST(queue_schema_migrates_once_beside_the_store)
{
  const char *url = nh_pgtest_scratch_url();
  PGconn *c = nh_pgtest_connect(url);
  nh_error_t err = { 0 };
  int v = -1;
  ASSERT_EQ_INT(nh_pg_queue_schema_version(c, &v, &err), NH_OK);
  ASSERT_EQ_INT(v, 0);
  /* hosts starting together: each migrates or waits for the other, none fails */
  nh_pgtest_migrate_together(url, nh_pg_queue_migrate, 3);
  ASSERT_EQ_INT(nh_pg_queue_schema_version(c, &v, &err), NH_OK);
  ASSERT_EQ_INT(v, NH_PG_QUEUE_SCHEMA_VERSION);
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT count(*) FROM nimbus_queue_schema"), "1");
  /* the store's migrations and version are their own */
  int from = -1, to = -1;
  if (nh_pg_migrate(c, &from, &to, &err)) FAIL("store migrate: %s", err.msg);
  ASSERT_EQ_INT(from, 0);
  ASSERT_EQ_INT(to, NH_PG_SCHEMA_VERSION);
  ASSERT_EQ_INT(nh_pg_queue_migrate(c, &err), NH_OK);
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT version FROM nimbus_queue_schema"), "1");

  /* the dialect: seq an identity, bodies bytea, text compared byte by byte */
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT is_identity FROM information_schema.columns WHERE table_name = 'queue'"
                                " AND column_name = 'seq'"), "YES");
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT string_agg(table_name || '.' || data_type, ',' ORDER BY table_name)"
                                " FROM information_schema.columns WHERE column_name = 'body'"
                                " AND table_name IN ('queue', 'dead_letters')"),
                "dead_letters.bytea,queue.bytea");
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT count(*) FROM information_schema.columns WHERE table_name IN"
                                " ('queue', 'subscriptions', 'session_locks', 'dead_letters') AND data_type = 'text'"
                                " AND collation_name IS DISTINCT FROM 'C'"), "0");
  ASSERT_CONTAINS(nh_pgtest_q1(c, "SELECT pg_get_indexdef('queue_endpoint'::regclass)"), "(endpoint, seq)");
  /* with the planner's choice forced off a sequential scan, the heads scan runs on it */
  nh_pgtest_q1(c, "SET enable_seqscan = off");
  PGresult *r = PQexec(c, "EXPLAIN SELECT seq FROM queue WHERE endpoint = 'Ep' ORDER BY seq LIMIT 10");
  int on_index = 0;
  for (int i = 0; i < PQntuples(r); i++) on_index |= strstr(PQgetvalue(r, i, 0), "queue_endpoint") != NULL;
  PQclear(r);
  ASSERT_TRUE(on_index);

  /* a newer queue schema is refused, naming both versions */
  nh_pgtest_q1(c, "UPDATE nimbus_queue_schema SET version = 7");
  ASSERT_EQ_INT(nh_pg_queue_migrate(c, &err), NH_EFAIL);
  ASSERT_CONTAINS(err.msg, "version 7, newer than this nimbus-host knows (1)");
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT version FROM nimbus_queue_schema"), "7");
}

/* The store's migrator, so the store's explanations: a role that may not create the
 * queue's tables is told the right and the GRANT, and nothing is left half-made. */
TEST(queue_migration_without_create_says_which_grant)
{
  const char *role = nh_pgtest_scratch_role("qlimited", "qlimited-pw");
  const char *db = nh_pgtest_scratch_db();
  PGconn *c = nh_pgtest_connect(nh_pgtest_url("user", role, "password", "qlimited-pw", "dbname", db, NULL));
  nh_error_t err = { 0 };
  ASSERT_EQ_INT(nh_pg_queue_migrate(c, &err), NH_EFAIL);
  char want[512];
  snprintf(want, sizeof want, "role \"%s\" may not create tables in schema \"public\" of database \"%s\"", role, db);
  ASSERT_CONTAINS(err.msg, want);
  ASSERT_CONTAINS(err.msg, "while migrating the embedded queue to version 1");
  snprintf(want, sizeof want, "GRANT CREATE ON SCHEMA \"public\" TO \"%s\";", role);
  ASSERT_CONTAINS(err.msg, want);
  ASSERT_EQ_INT(PQtransactionStatus(c), PQTRANS_IDLE);
  PGconn *owner = nh_pgtest_connect(nh_pgtest_url("dbname", db, NULL));
  ASSERT_EQ_STR(nh_pgtest_q1(owner, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"), "0");
}

/* ---------------------------------------------------------------- parity */

TEST(same_sequence_same_messages_locks_and_dead_letters)
{
  pair_t *b = pair_open();
  nh_pg_args_t a;
  int64_t t0 = nh_time_now_ms();
  const char *ta[] = { "Thing", "Other" }, *tb[] = { "Thing" };
  const int c0[] = { 0, 0 };
  subscribe_both(b, "EpA", ta, c0, 2);
  subscribe_both(b, "EpB", tb, c0, 1);
  same_table(b, "subscriptions", subs_dump);
  /* a third consumer declaring Thing a command conflicts, with EpA first on both */
  const int c1[] = { 1 };
  nh_error_t err = { 0 };
  ASSERT_EQ_INT(b->tr->vt->subscribe_check(b->tr, "EpC", tb, c1, 1, NULL, 0, &err), NH_EUSAGE);
  ASSERT_CONTAINS(err.msg, "EpA already consumes it");
  PGresult *r = run(b->q, nh_pgqargs_sub_conflict(&a, "Thing", "EpC", 1), &a);
  ASSERT_EQ_INT(PQntuples(r), 2);
  ASSERT_EQ_STR(PQgetvalue(r, 0, 0), "EpA");
  PQclear(r);
  r = run(b->q, nh_pgqargs_sub_conflict(&a, "Thing", "EpC", 0), &a);
  ASSERT_EQ_INT(PQntuples(r), 0);   /* neither side a command */
  PQclear(r);

  /* sends: a fan-out with a body holding a NUL and bytes that are not UTF-8, direct
   * sends with and without an event id, a control message, a reply queue, one for later */
  nh_msg_t m = msg_of("s1", NULL, "m-1", t0 - 1000);
  m.body = (char *)body_bytes;
  m.body_len = sizeof body_bytes - 1;
  ASSERT_EQ_INT(send_both(b, NULL, &m), 2);
  m = msg_of("s1", "e-2", "m-2", t0 - 900);
  send_both(b, "EpA", &m);
  m = msg_of("s2", "e-3", "m-3", t0 - 800);
  m.type = NH_MT_HANDOFF_FAIL;
  m.error_text = "job failed";
  m.error_type = "JobError";
  m.body = NULL;
  m.body_len = 0;
  send_both(b, "EpA", &m);
  m = msg_of("s3", NULL, "m-4", t0 - 700);
  m.reply_to = "_reply.host-1";
  m.retry_count = 2;
  m.body = "";
  m.body_len = 0;
  send_both(b, "EpA", &m);
  m = msg_of("s2", "e-5", "m-5", t0 - 600);
  send_both(b, "EpA", &m);
  m = msg_of("s4", "e-6", "m-6", t0 + 60000);   /* not visible until then */
  send_both(b, "EpA", &m);
  same_table(b, "queue rows", queue_dump);

  /* heads in seq order, max respected, locked sessions and invisible heads left */
  ASSERT_EQ_INT(receive_both(b, "EpA", 2, t0), 2);
  ASSERT_EQ_STR(b->lite->m[0].session_id, "s1");
  ASSERT_EQ_STR(b->lite->m[0].message_id, "m-1");
  ASSERT_EQ_INT(b->lite->m[0].body_len, sizeof body_bytes - 1);
  ASSERT_EQ_STR(b->lite->m[1].event_id, "e-3");
  ASSERT_EQ_INT(b->lite->m[1].delivery_count, 1);
  int64_t s1_head = b->lite->m[0].seq, s2_head = b->lite->m[1].seq;
  same_tables(b);
  ASSERT_EQ_INT(receive_both(b, "EpA", 10, t0), 1);
  ASSERT_EQ_STR(b->lite->m[0].session_id, "s3");
  ASSERT_EQ_STR(b->lite->m[0].reply_to, "_reply.host-1");
  int64_t s3_head = b->lite->m[0].seq;
  ASSERT_EQ_INT(receive_both(b, "EpA", 10, t0), 0);
  ASSERT_EQ_INT(receive_both(b, "EpB", 10, t0), 1);   /* EpB's copy of the fan-out: its own lock */
  same_tables(b);

  /* complete s1's head: settled, still locked until unlocked; unlocked once */
  nh_msg_t h = { .seq = s1_head, .endpoint = "EpA", .session_id = "s1" };
  ASSERT_EQ_INT(b->tr->vt->settle(b->tr, &h, NH_SETTLE_COMPLETE, 0, NULL), NH_OK);
  ASSERT_EQ_INT(run_affected(b->q, nh_pgqargs_delete(&a, s1_head), &a), 1);
  ASSERT_EQ_INT(receive_both(b, "EpA", 10, t0), 0);
  ASSERT_EQ_INT(b->tr->vt->unlock_session(b->tr, "EpA", "s1"), 1);
  ASSERT_EQ_INT(run_affected(b->q, nh_pgqargs_unlock(&a, "EpA", "s1", OWNER_A), &a), 1);
  ASSERT_EQ_INT(b->tr->vt->unlock_session(b->tr, "EpA", "s1"), 0);
  ASSERT_EQ_INT(run_affected(b->q, nh_pgqargs_unlock(&a, "EpA", "s1", OWNER_A), &a), 0);
  ASSERT_EQ_INT(receive_both(b, "EpA", 10, t0), 1);
  ASSERT_EQ_STR(b->lite->m[0].event_id, "e-2");
  same_tables(b);

  /* release s2's head for 5 s: the delivery given back, the session held without owner */
  h = (nh_msg_t){ .seq = s2_head, .endpoint = "EpA", .session_id = "s2" };
  int64_t before = nh_time_now_ms();
  ASSERT_EQ_INT(b->tr->vt->settle(b->tr, &h, NH_SETTLE_RELEASE, 5000, NULL), NH_OK);
  ASSERT_EQ_INT(run_affected(b->q, nh_pgqargs_released(&a, s2_head), &a), 1);
  ASSERT_EQ_INT(run_affected(b->q, nh_pgqargs_release_lock(&a, "EpA", "s2", nh_time_now_ms() + 5000, OWNER_A), &a),
                1);
  int64_t after = nh_time_now_ms();
  ASSERT_CMP_INT(nh_test_q1i(lite_db(b), "SELECT locked_until FROM session_locks WHERE session_id = 's2'"), >=,
                 before + 5000);
  ASSERT_CMP_INT(atoll(nh_pgtest_q1(nh_pg_db_conn(b->q), "SELECT locked_until FROM session_locks"
                                                        " WHERE session_id = 's2'")), <=, after + 5000);
  same_tables(b);
  ASSERT_EQ_INT(receive_both(b, "EpA", 10, t0), 0);

  /* dead-letter s3's head: moved with its reason and delivery count */
  h = (nh_msg_t){ .seq = s3_head, .endpoint = "EpA", .session_id = "s3" };
  before = nh_time_now_ms();
  ASSERT_EQ_INT(b->tr->vt->settle(b->tr, &h, NH_SETTLE_DEAD_LETTER, 0, "poison: ✗ no handler"), NH_OK);
  ASSERT_EQ_INT(run_affected(b->q, nh_pgqargs_dead(&a, s3_head, "poison: ✗ no handler", nh_time_now_ms()), &a), 1);
  ASSERT_EQ_INT(run_affected(b->q, nh_pgqargs_delete(&a, s3_head), &a), 1);
  after = nh_time_now_ms();
  const char *dead = same_table(b, "dead letters", dead_dump);
  ASSERT_CONTAINS(dead, "|EpA|s3|m-4|");
  ASSERT_CONTAINS(dead, "|poison: ✗ no handler|1");
  ASSERT_CMP_INT(atoll(nh_pgtest_q1(nh_pg_db_conn(b->q), "SELECT at FROM dead_letters")), >=, before);
  ASSERT_CMP_INT(atoll(nh_pgtest_q1(nh_pg_db_conn(b->q), "SELECT at FROM dead_letters")), <=, after);
  ASSERT_EQ_STR(nh_pgtest_q1(nh_pg_db_conn(b->q), "SELECT octet_length(body) FROM dead_letters"), "0");
  same_tables(b);

  /* renew: the lease runs from the renewal; owner B cannot take a live lock, then can */
  ASSERT_EQ_INT(b->tr->vt->renew(b->tr, "EpA", "s1", t0 + 1000), 1);
  ASSERT_EQ_INT(run_affected(b->q, nh_pgqargs_renew(&a, "EpA", "s1", OWNER_A, t0 + 1000 + LOCK_MS), &a), 1);
  ASSERT_EQ_INT(b->tr_b->vt->renew(b->tr_b, "EpA", "s1", t0 + 1000), 0);
  ASSERT_EQ_INT(run_affected(b->q, nh_pgqargs_renew(&a, "EpA", "s1", OWNER_B, t0 + 1000 + LOCK_MS), &a), 0);
  same_tables(b);
  ASSERT_EQ_INT(b->tr_b->vt->lock_session(b->tr_b, "EpA", "s1", t0), 0);
  ASSERT_EQ_INT(run_affected(b->q, nh_pgqargs_lock(&a, "EpA", "s1", OWNER_B, t0 + LOCK_MS, t0), &a), 0);
  int64_t t1 = t0 + 2 * LOCK_MS;
  ASSERT_EQ_INT(b->tr_b->vt->lock_session(b->tr_b, "EpA", "s1", t1), 1);
  ASSERT_EQ_INT(run_affected(b->q, nh_pgqargs_lock(&a, "EpA", "s1", OWNER_B, t1 + LOCK_MS, t1), &a), 1);
  same_tables(b);

  /* owners, as reap_dead_owners lists them */
  char l[1024], p[1024];
  dump_lite(lite_db(b), "SELECT DISTINCT owner FROM session_locks WHERE owner IS NOT NULL ORDER BY owner", l,
            sizeof l);
  r = run(b->q, nh_pgqargs_owners(&a), &a);
  size_t o = 0;
  for (int i = 0; i < PQntuples(r); i++) o += (size_t)snprintf(p + o, sizeof p - o, "%s\n", PQgetvalue(r, i, 0));
  p[o] = '\0';
  PQclear(r);
  ASSERT_EQ_STR(p, l);
  ASSERT_EQ_STR(p, OWNER_A "\n" OWNER_B "\n");

  /* later: every lease expired, the released delay over, s4 visible. s1 comes again
   * (delivered twice), s2's head with its release counted and the delivery given back */
  ASSERT_EQ_INT(receive_both(b, "EpA", 10, t0 + 10 * LOCK_MS), 3);
  ASSERT_EQ_STR(b->lite->m[0].event_id, "e-2");
  ASSERT_EQ_INT(b->lite->m[0].delivery_count, 2);
  ASSERT_EQ_STR(head_of(b, "s2")->event_id, "e-3");
  ASSERT_EQ_INT(head_of(b, "s2")->release_count, 1);
  ASSERT_EQ_INT(head_of(b, "s2")->delivery_count, 1);
  ASSERT_EQ_STR(head_of(b, "s4")->event_id, "e-6");
  same_tables(b);

  /* a dead owner's locks dropped (reap_dead_owners' statement) */
  sqlite3_exec(lite_db(b), "DELETE FROM session_locks WHERE owner = '" OWNER_A "'", NULL, NULL, NULL);
  ASSERT_EQ_INT(run_affected(b->q, nh_pgqargs_drop_owner(&a, OWNER_A), &a), sqlite3_changes(lite_db(b)));
  same_tables(b);
}

TEST(session_next_and_row_read_what_sqlite_reads)
{
  pair_t *b = pair_open();
  nh_pg_args_t a;
  int64_t t0 = nh_time_now_ms();
  char eid[16], mid[16];
  for (int i = 0; i < 6; i++) {
    snprintf(eid, sizeof eid, "e-%d", i);
    snprintf(mid, sizeof mid, "m-%d", i);
    /* s1: rows 0, 2, 3, 5 (5 not visible yet); s2: rows 1, 4 */
    nh_msg_t m = msg_of(i == 1 || i == 4 ? "s2" : "s1", eid, mid, i == 5 ? t0 + 60000 : t0 - 1000 + i);
    send_both(b, "Ep", &m);
  }
  ASSERT_EQ_INT(receive_both(b, "Ep", 10, t0), 2);
  int64_t head = head_of(b, "s1")->seq;

  /* the session's next visible rows, in order, no delivery counted; the invisible row
   * ends the batch on both */
  got_t *l = got_new(), *p = got_new();
  l->n = b->tr->vt->session_next(b->tr, "Ep", "s1", head, 10, l->m, t0);
  PGresult *r = run(b->q, nh_pgqargs_session_next(&a, "Ep", "s1", head, 10), &a);
  for (int i = 0; i < PQntuples(r) && nh_pgq_visible(r, i, t0); i++) nh_pgq_row(r, i, "Ep", &p->m[p->n++]);
  ASSERT_EQ_INT(PQntuples(r), 3);   /* the invisible one is read, and cut by the caller */
  PQclear(r);
  same_msgs(l, p);
  ASSERT_EQ_INT(l->n, 2);
  ASSERT_EQ_STR(l->m[0].event_id, "e-2");
  ASSERT_EQ_STR(l->m[1].event_id, "e-3");
  /* max, and after a later seq */
  got_clear(l);
  got_clear(p);
  int64_t second = atoll(nh_pgtest_q1(nh_pg_db_conn(b->q), "SELECT seq FROM queue WHERE event_id = 'e-2'"));
  l->n = b->tr->vt->session_next(b->tr, "Ep", "s1", second, 1, l->m, t0);
  r = run(b->q, nh_pgqargs_session_next(&a, "Ep", "s1", second, 1), &a);
  take_rows(p, r, "Ep");
  same_msgs(l, p);
  ASSERT_EQ_STR(l->m[0].event_id, "e-3");
  same_table(b, "queue rows", queue_dump);

  /* ROW: a row by seq while it is there and is the session's; gone once deleted */
  r = run(b->q, nh_pgqargs_row(&a, second, "Ep", "s1"), &a);
  ASSERT_EQ_INT(PQntuples(r), 1);
  take_rows(p, r, "Ep");
  ASSERT_EQ_STR(p->m[0].event_id, "e-2");
  r = run(b->q, nh_pgqargs_row(&a, second, "Ep", "s2"), &a);
  ASSERT_EQ_INT(PQntuples(r), 0);
  PQclear(r);
  nh_msg_t h = { .seq = second, .endpoint = "Ep", .session_id = "s1" };
  ASSERT_EQ_INT(b->tr->vt->settle(b->tr, &h, NH_SETTLE_COMPLETE, 0, NULL), NH_OK);
  ASSERT_EQ_INT(run_affected(b->q, nh_pgqargs_delete(&a, second), &a), 1);
  r = run(b->q, nh_pgqargs_row(&a, second, "Ep", "s1"), &a);
  ASSERT_EQ_INT(PQntuples(r), 0);
  PQclear(r);
  /* with that row gone, sqlite's batch ends at it; the query goes on to the next */
  got_clear(l);
  l->n = b->tr->vt->session_next(b->tr, "Ep", "s1", head, 10, l->m, t0);
  ASSERT_EQ_INT(l->n, 0);
  r = run(b->q, nh_pgqargs_session_next(&a, "Ep", "s1", head, 10), &a);
  ASSERT_EQ_STR(nh_pg_col_text(r, 0, 3), "e-3");
  PQclear(r);
  same_table(b, "queue rows", queue_dump);
}

/* ---------------------------------------------------------------- several hosts */

#define SESSIONS 200

/* NSESS sessions on Ep with `rows` rows each, every one visible at t0: one batch. */
static void fill(nh_pg_db_t *q, int nsess, int rows, int64_t t0)
{
  nh_pg_args_t a;
  nh_error_t err = { 0 };
  char s[16], e[32];
  if (nh_pg_batch_begin(q, &err)) FAIL("%s", err.msg);
  for (int k = 0; k < rows; k++)
    for (int i = 0; i < nsess; i++) {
      snprintf(s, sizeof s, "s%03d", i);
      snprintf(e, sizeof e, "e%03d-%d", i, k);
      nh_msg_t m = msg_of(s, e, e, t0 - 1000);
      if (nh_pgq_batch_add(q, nh_pgqargs_insert(&a, &m, "Ep", e), &a, NULL, NULL, &err)) FAIL("%s", err.msg);
    }
  if (nh_pg_batch_commit(q, &err)) FAIL("fill: %s", err.msg);
}

/* One host's heads_and_lock in flight: the sessions it took are counted into taken[]
 * when its batch commits; rows is how many (-1 until then). */
typedef struct heads {
  int *taken;
  int rows;
} heads_t;

static void on_heads(void *data, const nh_pg_optab_t *tab, int op, const PGresult *r)
{
  heads_t *h = data;
  if (tab != &nh_pgq_optab || op != NH_PGQ_HEADS_AND_LOCK) return;   /* rows stays -1: the caller fails */
  h->rows = PQntuples(r);
  for (int i = 0; i < h->rows; i++) h->taken[atoi(nh_pg_col_text(r, i, 1) + 1)]++;
}

/* A DROP_OWNER's result: how many leases it ended, into rows. */
static void on_dropped(void *data, const nh_pg_optab_t *tab, int op, const PGresult *r)
{
  heads_t *h = data;
  if (tab == &nh_pgq_optab && op == NH_PGQ_DROP_OWNER) h->rows = nh_pg_affected(r);
}

/* Sends op as a batch of its own and returns at once (heads_within waits for it): several
 * hosts' can be running on the server before any result is read. */
static void send_op(nh_pg_db_t *q, nh_pgqop_t op, nh_pg_args_t *a, nh_pg_result_cb cb, heads_t *h)
{
  nh_error_t err = { 0 };
  h->rows = -1;
  if (nh_pg_batch_begin(q, &err) || nh_pgq_batch_add(q, op, a, cb, h, &err) || nh_pg_batch_send_commit(q, &err))
    FAIL("%s", err.msg);
}

static void send_heads(nh_pg_db_t *q, heads_t *h, int max, int64_t now, const char *owner, int64_t until)
{
  nh_pg_args_t a;
  send_op(q, nh_pgqargs_heads_and_lock(&a, "Ep", now, max, owner, until), &a, on_heads, h);
}

/* Drives the batch sent on q for up to ms: the rows it took, or -1 if it has not
 * committed by then (it is still waiting for something). */
static int heads_within(nh_pg_db_t *q, heads_t *h, int ms)
{
  int64_t end = nh_test_mono_ms() + ms;
  nh_error_t err = { 0 };
  int rc = NH_OK, want;
  while ((want = nh_pg_batch_poll(q, &rc, &err)) != 0) {
    int64_t left = end - nh_test_mono_ms();
    if (left <= 0) return -1;
    struct pollfd p = { .fd = PQsocket(nh_pg_db_conn(q)), .events = POLLIN };
    if (want & NH_PG_WANT_WRITE) p.events |= POLLOUT;
    poll(&p, 1, (int)left);
  }
  if (rc) FAIL("batch: %s", err.msg);
  if (h->rows < 0) FAIL("the batch committed without its result");
  return h->rows;
}

/* Counts each session a result took into taken[]; returns how many rows. */
static int tally(PGresult *r, int *taken)
{
  int n = PQntuples(r);
  for (int i = 0; i < n; i++) taken[atoi(nh_pg_col_text(r, i, 1) + 1)]++;
  PQclear(r);
  return n;
}

/* heads_and_lock, waited for (30 s at most). */
static int take_heads(nh_pg_db_t *q, int *taken, int max, int64_t now, const char *owner, int64_t until)
{
  heads_t h = { taken, -1 };
  send_heads(q, &h, max, now, owner, until);
  int n = heads_within(q, &h, 30000);
  if (n < 0) FAIL("heads_and_lock did not answer in 30 s");
  return n;
}

TEST(two_hosts_at_once_take_every_session_exactly_once)
{
  const char *url = nh_pgtest_scratch_url();
  nh_pg_db_t *qa = queue_conn(url), *qb = queue_conn(url);
  int64_t t0 = nh_time_now_ms();
  fill(qa, SESSIONS, 2, t0);   /* two rows each: a session's second row must never pass for its head */
  int taken[SESSIONS] = { 0 };
  int got_a = 0, got_b = 0, rounds = 0;
  heads_t ha = { taken, -1 }, hb = { taken, -1 };
  for (;;) {
    /* both statements running on the server before either result is read */
    send_heads(qa, &ha, 16, t0, OWNER_A, t0 + LOCK_MS);
    send_heads(qb, &hb, 16, t0, OWNER_B, t0 + LOCK_MS);
    int na = heads_within(qa, &ha, 30000), nb = heads_within(qb, &hb, 30000);
    if (na < 0 || nb < 0) FAIL("a host waited 30 s for the other");
    got_a += na;
    got_b += nb;
    if (na == 0 && nb == 0) break;
    if (++rounds > SESSIONS) FAIL("still taking sessions after %d rounds", rounds);
  }
  for (int i = 0; i < SESSIONS; i++)
    if (taken[i] != 1) FAIL("session s%03d taken %d times", i, taken[i]);
  ASSERT_EQ_INT(got_a + got_b, SESSIONS);
  ASSERT_CMP_INT(got_a, >, 0);
  ASSERT_CMP_INT(got_b, >, 0);
  PGconn *c = nh_pg_db_conn(qa);
  /* each lease is its taker's, each head delivered once, no second row touched */
  ASSERT_EQ_INT(atoi(nh_pgtest_q1(c, "SELECT count(*) FROM session_locks WHERE owner = '" OWNER_A "'")), got_a);
  ASSERT_EQ_INT(atoi(nh_pgtest_q1(c, "SELECT count(*) FROM session_locks WHERE owner = '" OWNER_B "'")), got_b);
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT count(*) FROM queue WHERE event_id LIKE '%%-0' AND delivery_count = 1"),
                "200");
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT count(*) FROM queue WHERE event_id LIKE '%%-1' AND delivery_count = 0"),
                "200");
}

TEST(a_host_mid_statement_is_skipped_and_expired_leases_are_taken_over)
{
  const char *url = nh_pgtest_scratch_url();
  nh_pg_db_t *qa = queue_conn(url), *qb = queue_conn(url);
  int64_t t0 = nh_time_now_ms();
  fill(qa, 20, 1, t0);
  int taken[SESSIONS] = { 0 };

  /* A takes s000-s004 and has not committed yet: B neither waits nor gets those */
  PGconn *ca = nh_pg_db_conn(qa);
  nh_pg_args_t a;
  nh_error_t err = { 0 };
  PGresult *r = NULL;
  PQclear(PQexec(ca, "BEGIN"));
  if (nh_pgq_run(qa, nh_pgqargs_heads_and_lock(&a, "Ep", t0, 5, OWNER_A, t0 + LOCK_MS), &a, &r, &err))
    FAIL("%s", err.msg);
  ASSERT_EQ_INT(tally(r, taken), 5);
  for (int i = 0; i < 5; i++) ASSERT_EQ_INT(taken[i], 1);
  heads_t hb = { taken, -1 };
  send_heads(qb, &hb, 5, t0, OWNER_B, t0 + 3 * LOCK_MS);
  int nb = heads_within(qb, &hb, 10000);
  PQclear(PQexec(ca, "COMMIT"));
  if (nb < 0) FAIL("B waited for A's open transaction instead of skipping its sessions");
  ASSERT_EQ_INT(nb, 5);
  for (int i = 5; i < 10; i++) ASSERT_EQ_INT(taken[i], 1);
  /* A committed: B, whose next scan sees A's leases, takes the next ones */
  ASSERT_EQ_INT(take_heads(qb, taken, 5, t0 + 1, OWNER_B, t0 + 3 * LOCK_MS), 5);
  for (int i = 0; i < 15; i++) ASSERT_EQ_INT(taken[i], 1);

  /* a live lease is not taken over: before A's end, A's sessions stay A's */
  int64_t t1 = t0 + LOCK_MS;   /* A's leases end here (locked_until <= now: expired) */
  memset(taken, 0, sizeof taken);
  ASSERT_EQ_INT(take_heads(qb, taken, 50, t1 - 1, OWNER_B, t0 + 3 * LOCK_MS), 5);
  for (int i = 15; i < 20; i++) ASSERT_EQ_INT(taken[i], 1);
  ASSERT_EQ_STR(nh_pgtest_q1(ca, "SELECT count(*) FROM session_locks WHERE owner = '" OWNER_A "'"), "5");

  /* A died: at its leases' end B takes its five sessions over, and nothing of its own */
  memset(taken, 0, sizeof taken);
  ASSERT_EQ_INT(take_heads(qb, taken, 50, t1, OWNER_B, t0 + 3 * LOCK_MS), 5);
  for (int i = 0; i < 5; i++) ASSERT_EQ_INT(taken[i], 1);
  ASSERT_EQ_STR(nh_pgtest_q1(ca, "SELECT count(*) FROM session_locks WHERE owner = '" OWNER_B "'"), "20");
  ASSERT_EQ_STR(nh_pgtest_q1(ca, "SELECT delivery_count FROM queue WHERE session_id = 's000'"), "2");
  /* and A, back, finds every session leased by B */
  memset(taken, 0, sizeof taken);
  ASSERT_EQ_INT(take_heads(qa, taken, 50, t1, OWNER_A, t1 + LOCK_MS), 0);
}

/* Polls (10 s at most) until one transaction of look's database waits for a lock. */
static void wait_for_a_waiter(PGconn *look, const char *otherwise)
{
  int64_t deadline = nh_test_mono_ms() + 10000;
  while (strcmp(nh_pgtest_q1(look, "SELECT count(*) FROM pg_locks WHERE NOT granted AND pid IN"
                                   " (SELECT pid FROM pg_stat_activity WHERE datname = current_database())"),
                "1") != 0) {
    if (nh_test_mono_ms() > deadline) FAIL("%s", otherwise);
    usleep(2000);
  }
}

/* Sessions whose lease a transaction is writing (a fill's LOCKs, not committed yet: the
 * lease keys are held, nh_pg_queue.c): another host's head scan leaves them for later
 * instead of waiting for them, and a restarted host's DROP_OWNER waits for their keys
 * before it touches a row, so the fill, asking for another of the dead owner's leases
 * meanwhile, is answered at once instead of each waiting for the other (40P01). */
TEST(leases_another_transaction_is_writing_are_skipped_by_a_scan_and_waited_for_in_key_order)
{
  const char *url = nh_pgtest_scratch_url();
  nh_pg_db_t *qa = queue_conn(url), *qb = queue_conn(url);
  PGconn *ca = nh_pg_db_conn(qa), *look = nh_pgtest_connect(url);
  int64_t t0 = nh_time_now_ms();
  fill(qa, 3, 1, t0);
  ASSERT_EQ_STR(nh_pgtest_q1(look, "INSERT INTO session_locks VALUES ('Ep', 's010', 'dead', %lld),"
                                   " ('Ep', 's011', 'dead', %lld) RETURNING 1",
                             (long long)(t0 + LOCK_MS), (long long)(t0 + LOCK_MS)),
                "1");
  nh_pg_args_t a;
  PQclear(PQexec(ca, "BEGIN"));
  PGresult *r = run(qa, nh_pgqargs_lock(&a, "Ep", "s001", OWNER_A, t0 + LOCK_MS, t0), &a);
  ASSERT_EQ_INT(PQntuples(r), 1);   /* a new lease, not committed */
  PQclear(r);
  r = run(qa, nh_pgqargs_lock(&a, "Ep", "s011", OWNER_A, t0 + LOCK_MS, t0), &a);
  ASSERT_EQ_INT(PQntuples(r), 0);   /* a live lease: not taken, but its row is locked */
  PQclear(r);

  int taken[SESSIONS] = { 0 };
  heads_t hb = { taken, -1 };
  send_heads(qb, &hb, 10, t0, OWNER_B, t0 + LOCK_MS);
  if (heads_within(qb, &hb, 10000) < 0) {
    PQclear(PQexec(ca, "ROLLBACK"));
    FAIL("B's head scan waited for A's transaction instead of skipping its session");
  }
  ASSERT_EQ_INT(hb.rows, 2);
  ASSERT_EQ_INT(taken[0] + taken[1] * 10 + taken[2] * 100, 101);

  heads_t dropped = { NULL, -1 };
  send_op(qb, nh_pgqargs_drop_owner(&a, "dead"), &a, on_dropped, &dropped);
  wait_for_a_waiter(look, "DROP_OWNER did not wait for A's transaction");
  r = run(qa, nh_pgqargs_lock(&a, "Ep", "s010", OWNER_A, t0 + LOCK_MS, t0), &a);
  ASSERT_EQ_INT(PQntuples(r), 0);   /* not free now (its key is DROP_OWNER's), or a live lease */
  PQclear(r);
  PQclear(PQexec(ca, "COMMIT"));
  ASSERT_EQ_INT(heads_within(qb, &dropped, 10000), 2);
  ASSERT_EQ_STR(nh_pgtest_q1(look, "SELECT string_agg(session_id || '=' || owner, ',' ORDER BY session_id)"
                                   " FROM session_locks"),
                "s000=" OWNER_B ",s001=" OWNER_A ",s002=" OWNER_B);
  ASSERT_EQ_STR(nh_pgtest_q1(look, "SELECT delivery_count FROM queue WHERE session_id = 's001'"), "0");
}

/* Two writers of one session: the second waits for the first's commit before it takes its
 * seq, so the session's rows become visible in seq order (a scan never sees 11 without 10). */
TEST(a_second_writer_of_a_session_waits_for_the_first_so_seq_is_commit_order)
{
  const char *url = nh_pgtest_scratch_url();
  nh_pg_db_t *qa = queue_conn(url), *qb = queue_conn(url);
  PGconn *ca = nh_pg_db_conn(qa), *cb = nh_pg_db_conn(qb), *look = nh_pgtest_connect(url);
  nh_msg_t m;
  memset(&m, 0, sizeof m);
  m.session_id = "s1";
  m.message_id = "m1";
  m.event_type = "Thing";
  m.enqueued_at = 1;
  nh_pg_args_t a;
  PQclear(PQexec(ca, "BEGIN"));
  PGresult *r = run(qa, nh_pgqargs_insert(&a, &m, "Ep", "e1"), &a);
  long long first = atoll(PQgetvalue(r, 0, 0));
  PQclear(r);
  /* B writes the same session from its own transaction, with the same statement */
  PQclear(PQexec(cb, "BEGIN"));
  m.message_id = "m2";
  nh_pgqargs_insert(&a, &m, "Ep", "e2");
  if (!PQsendQueryParams(cb, nh_pgqop_sql(NH_PGQ_INSERT), a.n, NULL, a.values, a.lengths, a.formats, 0))
    FAIL("send: %s", PQerrorMessage(cb));
  nh_pg_args_release(&a);
  wait_for_a_waiter(look, "B's insert did not wait for A's transaction");
  /* another session's writer does not wait */
  m.session_id = "s2";
  m.message_id = "m3";
  PQclear(run(nh_pgtest_db(url, NULL, "queue"), nh_pgqargs_insert(&a, &m, "Ep", "e3"), &a));
  PQclear(PQexec(ca, "COMMIT"));
  r = PQgetResult(cb);   /* B's insert, once A committed */
  ASSERT_EQ_INT(PQresultStatus(r), PGRES_TUPLES_OK);
  long long second = atoll(PQgetvalue(r, 0, 0));
  PQclear(r);
  while ((r = PQgetResult(cb))) PQclear(r);
  PQclear(PQexec(cb, "COMMIT"));
  ASSERT_CMP_INT((int)(second - first), >, 1);   /* B's seq came after A's commit (e3's came between) */
  ASSERT_EQ_STR(nh_pgtest_q1(look, "SELECT string_agg(event_id, ',' ORDER BY seq) FROM queue WHERE session_id = 's1'"),
                "e1,e2");
}

/* ---------------------------------------------------------------- one executor */

/* Each committed result of a mixed batch, as "table:operation", in order. */
static char done_log[512];

static void log_done(const char *what, const char *name)
{
  size_t o = strlen(done_log);
  snprintf(done_log + o, sizeof done_log - o, "%s%s:%s", o ? " " : "", what, name);
}

static void on_any_result(void *data, const nh_pg_optab_t *tab, int op, const PGresult *res)
{
  (void)data;
  (void)res;
  log_done(tab->what, tab->ops[op].name);
}

/* A pump's transaction on PostgreSQL: the queue's settlement of a head and the store's
 * rows of its outcome. */
static void add_settlement(nh_pg_db_t *q, int64_t seq, const char *session, const char *mid)
{
  nh_pg_args_t a;
  nh_error_t err = { 0 };
  if (nh_pg_batch_add(q, nh_pgargs_inbox_add(&a, "Ep", mid), &a, on_any_result, NULL, &err) ||
      nh_pgq_batch_add(q, nh_pgqargs_delete(&a, seq), &a, on_any_result, NULL, &err) ||
      nh_pg_batch_add_op(q, &nh_pg_store_optab, nh_pgargs_oplog_add(&a, "tests", "settle", "Ep", mid, session, NULL),
                         &a, on_any_result, NULL, &err) ||
      nh_pgq_batch_add(q, nh_pgqargs_unlock(&a, "Ep", session, OWNER_A), &a, NULL, NULL, &err))
    FAIL("%s", err.msg);
}

TEST(queue_and_store_operations_commit_in_one_batch_or_not_at_all)
{
  nh_pg_db_t *q = queue_conn(nh_pgtest_scratch_url());
  PGconn *c = nh_pg_db_conn(q);
  nh_error_t err = { 0 };
  if (nh_pg_migrate(c, NULL, NULL, &err)) FAIL("store migrate: %s", err.msg);
  int64_t t0 = nh_time_now_ms();
  fill(q, 3, 1, t0);
  int taken[SESSIONS] = { 0 };
  ASSERT_EQ_INT(take_heads(q, taken, 3, t0, OWNER_A, t0 + LOCK_MS), 3);
  int64_t s0 = atoll(nh_pgtest_q1(c, "SELECT seq FROM queue WHERE session_id = 's000'"));
  int64_t s1 = atoll(nh_pgtest_q1(c, "SELECT seq FROM queue WHERE session_id = 's001'"));
  int64_t s2 = atoll(nh_pgtest_q1(c, "SELECT seq FROM queue WHERE session_id = 's002'"));
  nh_pg_db_stats_t st0, st1;
  nh_pg_db_stats(q, &st0);

  /* both tables' operations in one pipeline, the results told in order, each op told
   * with its own table */
  done_log[0] = '\0';
  if (nh_pg_batch_begin(q, &err)) FAIL("%s", err.msg);
  add_settlement(q, s0, "s000", "e000-0");
  if (nh_pg_batch_commit(q, &err)) FAIL("%s", err.msg);
  ASSERT_EQ_STR(done_log, "store:nh_inbox_add queue:nhq_delete store:nh_oplog_add");
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT count(*) FROM queue"), "2");
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT count(*) FROM session_locks WHERE session_id = 's000'"), "0");
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT message_id FROM inbox"), "e000-0");
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT count(*) FROM operator_log"), "1");
  nh_pg_db_stats(q, &st1);
  ASSERT_EQ_INT(st1.pipelines - st0.pipelines, 1);   /* one round trip */
  ASSERT_EQ_INT(st1.prepares - st0.prepares, 4);     /* each prepared once on this connection */

  /* again: nothing prepared twice, whichever table it is of */
  if (nh_pg_batch_begin(q, &err)) FAIL("%s", err.msg);
  add_settlement(q, s1, "s001", "e001-0");
  if (nh_pg_batch_commit(q, &err)) FAIL("%s", err.msg);
  nh_pg_db_stats(q, &st0);
  ASSERT_EQ_INT(st0.prepares, st1.prepares);
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT count(*) FROM queue"), "1");

  /* a queue statement failing after store writes: nothing of either is committed, and
   * the error names the statement */
  nh_pg_args_t a;
  if (nh_pg_batch_begin(q, &err)) FAIL("%s", err.msg);
  if (nh_pg_batch_add(q, nh_pgargs_inbox_add(&a, "Ep", "before"), &a, NULL, NULL, &err) ||
      nh_pgq_batch_add(q, nh_pgqargs_dead(&a, s2, "poison", t0), &a, NULL, NULL, &err) ||
      nh_pgq_batch_add(q, nh_pgqargs_dead(&a, s2, "twice", t0), &a, NULL, NULL, &err))   /* its key again */
    FAIL("%s", err.msg);
  add_settlement(q, s2, "s002", "e002-0");
  ASSERT_EQ_INT(nh_pg_batch_commit(q, &err), NH_EFAIL);
  ASSERT_CONTAINS(err.msg, "statement 3 of a batch of 7 (dead)");
  ASSERT_CONTAINS(err.msg, "23505");
  ASSERT_CONTAINS(err.msg, "nothing of the batch was committed");
  ASSERT_EQ_INT(nh_pg_batch_outcome(q), NH_PG_NOT_COMMITTED);
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT count(*) FROM queue"), "1");
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT count(*) FROM session_locks WHERE session_id = 's002'"), "1");
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT count(*) FROM inbox"), "2");
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT count(*) FROM dead_letters"), "0");
  ASSERT_EQ_INT(PQtransactionStatus(c), PQTRANS_IDLE);

  /* misuse of a queue operation is refused by the queue's name */
  nh_pgqargs_delete(&a, s2);
  a.n = 3;
  ASSERT_EQ_INT(nh_pgq_run(q, NH_PGQ_DELETE, &a, NULL, &err), NH_EUSAGE);
  ASSERT_CONTAINS(err.msg, "queue: operation");
  ASSERT_CONTAINS(err.msg, "given 3 parameters, not 1");
}

/* ---------------------------------------------------------------- main */

NH_PGTEST_MAIN()
