/* Tests of the PostgreSQL store's connection and schema layer (store/nh_pg*.c) against a
 * real server. NH_PG_URL names a database the tests may create tables in (the ctest
 * fixture "postgres": scripts/postgres.sh); NH_PG_ADMIN_URL a superuser, through which
 * each test makes its own scratch databases and roles (unset: NH_PG_URL's role if it is
 * a superuser, else role postgres on NH_PG_URL's host and port, without a password).
 * Without NH_PG_URL only the URL tests run and the rest is skipped (exit 77), except
 * under CI=true, where that is a failure. */
#include "nh_test.h"
#include "nh_pgtest.h"

#include "core/nh_sqlite.h"
#include "store/nh_pg.h"
#include "store/nh_pg_schema.h"
#include "store/nh_store_schema.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sqlite3.h>
#include <sys/socket.h>
#include <uv.h>

static const nh_pgtest_server_t *srv;   /* NH_PG_URL's server */

/* ---------------------------------------------------------------- helpers */

static const char *hostport(void)
{
  static char b[300];
  snprintf(b, sizeof b, "%s:%s", srv->host, srv->port);
  return b;
}

static void finish_conn(void *c) { PQfinish(c); }

static void close_fd(void *p) { close((int)(intptr_t)p); }

/* A TCP socket on 127.0.0.1: bound only (a connection to it is refused), or listening
 * and never accepting (a connection is made by the kernel, then nothing answers). */
static int local_socket(int listening, char port[16])
{
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
  socklen_t len = sizeof a;
  if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || (listening && listen(fd, 8) != 0) ||
      getsockname(fd, (struct sockaddr *)&a, &len) != 0)
    FAIL("a local socket: %s", strerror(errno));
  nh_test_on_cleanup(close_fd, (void *)(intptr_t)fd);
  snprintf(port, 16, "%d", ntohs(a.sin_port));
  return fd;
}

/* ---------------------------------------------------------------- on a loop */

typedef struct async {
  int calls, rc;
  PGconn *conn;
  nh_error_t err;
  nh_pg_connect_t *req;
} async_t;

static void on_conn(void *data, PGconn *conn, const nh_error_t *err)
{
  async_t *a = data;
  a->calls++;
  a->conn = conn;
  if (err) {
    a->err = *err;
    a->rc = err->code;
  }
}

/* Runs the loop until nothing is left, then closes it: every handle must be closed. */
static void run_and_close(uv_loop_t *loop, async_t *a)
{
  uv_run(loop, UV_RUN_DEFAULT);
  int closed = uv_loop_close(loop);
  if (a->calls != 1) FAIL("the connect callback ran %d times, not once", a->calls);
  if (a->conn) nh_test_on_cleanup(finish_conn, a->conn);
  if (closed != 0) FAIL("the loop does not close after the callback: %s (a handle left open)", uv_err_name(closed));
}

static int connect_async(const char *url, PGconn **out, nh_error_t *err)
{
  uv_loop_t loop;
  uv_loop_init(&loop);
  async_t a = { 0 };
  nh_pg_connect_start(&loop, url, on_conn, &a);
  run_and_close(&loop, &a);
  *out = a.conn;
  *err = a.err;
  return a.rc;
}

/* Both ways of connecting fail with `code`, say every needle and never `secret`. */
static void expect_fail_both(const char *url, int code, const char *secret, const char *const *needles)
{
  nh_error_t e1 = {0}, e2 = {0};
  PGconn *c = NULL;
  int rc = nh_pg_connect(url, &c, &e1);
  if (c) nh_test_on_cleanup(finish_conn, c);
  if (rc != code) FAIL("blocking connect to %s: rc %d, not %d: %s", url, rc, code, e1.msg);
  c = NULL;
  rc = connect_async(url, &c, &e2);
  if (rc != code) FAIL("connect on the loop to %s: rc %d, not %d: %s", url, rc, code, e2.msg);
  ASSERT_NULL(c);
  for (; *needles; needles++) {
    ASSERT_CONTAINS(e1.msg, *needles);
    ASSERT_CONTAINS(e2.msg, *needles);
  }
  if (secret) {
    ASSERT_TRUE(strstr(e1.msg, secret) == NULL);
    ASSERT_TRUE(strstr(e2.msg, secret) == NULL);
  }
}

/* ---------------------------------------------------------------- URLs (no server) */

TEST(url_is)
{
  ASSERT_TRUE(nh_pg_url_is("postgresql://u@h/db"));
  ASSERT_TRUE(nh_pg_url_is("postgres://h"));
  ASSERT_TRUE(nh_pg_url_is("PostgreSQL://h/db"));
  ASSERT_TRUE(nh_pg_url_is("POSTGRES://"));
  ASSERT_FALSE(nh_pg_url_is("nimbus.db"));
  ASSERT_FALSE(nh_pg_url_is("./postgresql://x"));
  ASSERT_FALSE(nh_pg_url_is("postgresql:/h/db"));
  ASSERT_FALSE(nh_pg_url_is("postgresq://h"));
  ASSERT_FALSE(nh_pg_url_is("mysql://h/db"));
  ASSERT_FALSE(nh_pg_url_is(""));
  ASSERT_FALSE(nh_pg_url_is(NULL));
}

TEST(url_check_accepts)
{
  static const char *const good[] = {
    "postgresql://nimbus:secret@127.0.0.1:5432/nimbus",
    "postgres://db.example.com/nimbus",
    "POSTGRESQL://nimbus@db.example.com/nimbus",   /* libpq wants the scheme in lower case: we give it that */
    "postgresql://",                               /* libpq's defaults: the local socket, the user's name */
    "postgresql:///nimbus",
    "postgresql://h1:5432,h2:5433/nimbus?connect_timeout=5&sslmode=disable&target_session_attrs=read-write",
    "postgresql:///nimbus?host=/var/run/postgresql&port=5432",
    "postgresql://[::1]:5432/nimbus",
    "postgresql://h/nimbus?client_encoding=utf8&application_name=billing",
    NULL,
  };
  for (int i = 0; good[i]; i++) {
    nh_error_t err = {0};
    if (nh_pg_url_check(good[i], &err) != NH_OK) FAIL("%s refused: %s", good[i], err.msg);
  }
}

static void expect_refused(const char *url, const char *needle)
{
  nh_error_t err = {0};
  int rc = nh_pg_url_check(url, &err);
  if (rc != NH_EUSAGE) FAIL("%s: rc %d, not NH_EUSAGE (%s)", url, rc, err.msg);
  ASSERT_CONTAINS(err.msg, needle);
  ASSERT_TRUE(strstr(err.msg, "secret") == NULL);
}

TEST(url_check_refuses_saying_why_with_the_password_masked)
{
  expect_refused("postgresql://nimbus:secret@127.0.0.1/db?bogus=1",
                 "malformed store URL postgresql://nimbus:***@127.0.0.1/db?bogus=1: invalid URI query parameter: "
                 "\"bogus\"; write it as postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE");
  expect_refused("postgresql://nimbus:secret@[::1/db", "malformed store URL postgresql://nimbus:***@[::1/db: ");
  expect_refused("postgresql://nimbus:secret@h:99999/db",
                 "store URL postgresql://nimbus:***@h:99999/db: port \"99999\" is not a number from 1 to 65535");
  expect_refused("postgresql://h1:5432,h2:x/db?password=secret", "port \"x\" is not a number");
  expect_refused("postgresql://h/db?connect_timeout=soon&password=secret",
                 "connect_timeout \"soon\" is not a whole number of seconds");
  expect_refused("postgresql://u:secret@h/db?replication=database", "a replication connection cannot hold a store");
  expect_refused("postgresql://u:secret@h/db?client_encoding=LATIN1", "client_encoding LATIN1: the store talks UTF8");
  expect_refused("mysql://u:secret@h/db",
                 "store mysql://u:***@h/db is not a PostgreSQL URL: write it as postgresql://");
}

TEST(url_display_masks_every_password)
{
  static const char *const cases[][2] = {
    { "postgresql://nimbus:nimbus@127.0.0.1:5432/db", "postgresql://nimbus:***@127.0.0.1:5432/db" },
    { "postgresql://nimbus@h/db", "postgresql://nimbus@h/db" },
    { "postgresql://h:5432/db", "postgresql://h:5432/db" },
    { "postgresql://u:@h/db", "postgresql://u:***@h/db" },
    { "POSTGRES://U:S@H", "POSTGRES://U:***@H" },
    { "postgresql://h/db?user=u&password=secret&sslmode=require",
      "postgresql://h/db?user=u&password=***&sslmode=require" },
    { "postgresql://h/db?pass%77ord=secret", "postgresql://h/db?pass%77ord=***" },   /* libpq decodes the name */
    { "postgresql://u:p@ss/w@rd@h/db", "postgresql://u:***@h/db" },                  /* '@' and '/' in it, unencoded */
    { "postgresql://u:secret@[::1/db", "postgresql://u:***@[::1/db" },               /* malformed: masked too */
    { "postgresql:///db?host=/tmp&password=x&port=5", "postgresql:///db?host=/tmp&password=***&port=5" },
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *shown = nh_pg_url_display(cases[i][0]);
    if (strcmp(shown, cases[i][1]) != 0) {
      char tmp[512];
      snprintf(tmp, sizeof tmp, "%s", shown);
      free(shown);
      FAIL("nh_pg_url_display(%s) = %s, not %s", cases[i][0], tmp, cases[i][1]);
    }
    free(shown);
  }
  ASSERT_NULL(nh_pg_url_display(NULL));
}

TEST(url_malformed_fails_both_connects)
{
  static const char *const needles[] = { "malformed store URL postgresql://u:***@h/db?bogus=1", NULL };
  nh_error_t e1 = {0}, e2 = {0};
  PGconn *c = NULL;
  ASSERT_EQ_INT(nh_pg_connect("postgresql://u:secret@h/db?bogus=1", &c, &e1), NH_EUSAGE);
  ASSERT_NULL(c);
  ASSERT_EQ_INT(connect_async("postgresql://u:secret@h/db?bogus=1", &c, &e2), NH_EUSAGE);
  ASSERT_NULL(c);
  ASSERT_CONTAINS(e1.msg, needles[0]);
  ASSERT_CONTAINS(e2.msg, needles[0]);
}

TEST(url_bad_parameter_value_fails_both_connects)
{
  /* libpq checks sslmode's value only when a connection starts: before any I/O */
  static const char *const needles[] = {
    "store URL postgresql://u:***@127.0.0.1:1/db?sslmode=bogus: invalid sslmode value: \"bogus\"; correct that "
    "parameter of the URL", NULL,
  };
  expect_fail_both("postgresql://u:secret@127.0.0.1:1/db?sslmode=bogus", NH_EUSAGE, "secret", needles);
}

TEST(url_schema_versions_match_sqlite)
{
  ASSERT_EQ_INT(sizeof nh_pg_migrations / sizeof nh_pg_migrations[0], NH_PG_SCHEMA_VERSION);
  ASSERT_EQ_INT(sizeof nh_store_migrations / sizeof nh_store_migrations[0], NH_PG_SCHEMA_VERSION);
}

/* ---------------------------------------------------------------- connecting */

TEST(connect_blocking)
{
  PGconn *c = nh_pgtest_connect(srv->url);
  ASSERT_EQ_INT(PQstatus(c), CONNECTION_OK);
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SHOW application_name"), "nimbus-host");
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SHOW client_encoding"), "UTF8");
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT current_user"), srv->user);
  /* a name the URL gives wins over ours */
  c = nh_pgtest_connect(nh_pgtest_url("application_name", "billing", NULL));
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SHOW application_name"), "billing");
}

TEST(connect_on_the_loop)
{
  PGconn *c = NULL;
  nh_error_t err = {0};
  if (connect_async(srv->url, &c, &err)) FAIL("%s", err.msg);
  ASSERT_EQ_INT(PQstatus(c), CONNECTION_OK);
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SHOW application_name"), "nimbus-host");
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SHOW client_encoding"), "UTF8");
  /* the socket is free for the caller's own poll handle: ours is closed */
  uv_loop_t loop;
  uv_loop_init(&loop);
  uv_poll_t p;
  ASSERT_EQ_INT(uv_poll_init(&loop, &p, PQsocket(c)), 0);
  uv_close((uv_handle_t *)&p, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  ASSERT_EQ_INT(uv_loop_close(&loop), 0);
}

TEST(connect_on_the_loop_looks_names_up)
{
  /* a name: uv_getaddrinfo first, then each address as hostaddr (localhost may give ::1,
   * where nothing listens, before 127.0.0.1) */
  if (strcmp(srv->host, "127.0.0.1") != 0) {   /* the name must reach the same server */
    fprintf(stderr, "connect_on_the_loop_looks_names_up: not run: NH_PG_URL's host is %s, not 127.0.0.1\n", srv->host);
    return;
  }
  const char *url = nh_pgtest_url("host", "localhost", NULL);
  PGconn *c = NULL;
  nh_error_t err = {0};
  if (connect_async(url, &c, &err)) FAIL("%s", err.msg);
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT inet_client_addr()::text"), "127.0.0.1/32");
  ASSERT_EQ_STR(PQhost(c), "localhost");
  PGconn *b = nh_pgtest_connect(url);
  ASSERT_EQ_STR(nh_pgtest_q1(b, "SELECT 1"), "1");
}

TEST(connect_moves_to_the_next_host_on_a_new_socket)
{
  /* The first host refuses: libpq closes that socket and opens another, which usually
   * gets the same descriptor number; the loop must watch the new one. */
  char dead[16];
  local_socket(0, dead);
  char hosts[600], ports[64];
  snprintf(hosts, sizeof hosts, "127.0.0.1,%s", srv->host);
  snprintf(ports, sizeof ports, "%s,%s", dead, srv->port);
  const char *url = nh_pgtest_url("host", hosts, "port", ports, NULL);
  PGconn *c = NULL;
  nh_error_t err = {0};
  if (connect_async(url, &c, &err)) FAIL("%s", err.msg);
  ASSERT_EQ_STR(PQport(c), srv->port);
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT 41 + 1"), "42");
  c = nh_pgtest_connect(url);
  ASSERT_EQ_STR(PQport(c), srv->port);
}

TEST(connect_cancelled)
{
  /* at once (the connection is started, its socket watched) */
  uv_loop_t loop;
  uv_loop_init(&loop);
  async_t a = { 0 };
  nh_pg_connect_cancel(nh_pg_connect_start(&loop, srv->url, on_conn, &a));
  run_and_close(&loop, &a);
  ASSERT_EQ_INT(a.rc, NH_ESTATE);
  ASSERT_NULL(a.conn);
  ASSERT_CONTAINS(a.err.msg, "connecting was cancelled");
  ASSERT_TRUE(strstr(a.err.msg, ":***@") || strstr(a.err.msg, "password=***") || !*srv->password);

  /* while the name is being looked up in the thread pool */
  uv_loop_init(&loop);
  memset(&a, 0, sizeof a);
  nh_pg_connect_cancel(nh_pg_connect_start(&loop, nh_pgtest_url("host", "localhost", NULL),
                                           on_conn, &a));
  run_and_close(&loop, &a);
  ASSERT_EQ_INT(a.rc, NH_ESTATE);
  ASSERT_NULL(a.conn);
}

typedef struct cancel_when {
  uv_poll_t listener;
  async_t a;
} cancel_when_t;

static void on_listener(uv_poll_t *h, int status, int events)
{
  cancel_when_t *w = h->data;
  nh_pg_connect_cancel(w->a.req);
  uv_close((uv_handle_t *)h, NULL);
}

TEST(connect_cancelled_while_waiting_for_the_server)
{
  char port[16];
  int fd = local_socket(1, port);
  uv_loop_t loop;
  uv_loop_init(&loop);
  cancel_when_t w = { 0 };
  /* the listening socket turns readable once the connection is in its backlog */
  uv_poll_init(&loop, &w.listener, fd);
  w.listener.data = &w;
  uv_poll_start(&w.listener, UV_READABLE, on_listener);
  const char *url = nh_pgtest_url("host", "127.0.0.1", "port", port, "user", "nimbus", "password", "secret",
                                  "dbname", "db", NULL);
  w.a.req = nh_pg_connect_start(&loop, url, on_conn, &w.a);
  run_and_close(&loop, &w.a);
  ASSERT_EQ_INT(w.a.rc, NH_ESTATE);
  ASSERT_CONTAINS(w.a.err.msg, "connecting was cancelled");
}

/* ---------------------------------------------------------------- connection errors */

TEST(connect_refused)
{
  char port[16], where[1024], hint[1024];
  local_socket(0, port);   /* bound, not listening: refused, and no other process takes the port */
  snprintf(where, sizeof where, "no PostgreSQL server answers on 127.0.0.1:%s (connection refused); is it running?",
           port);
  snprintf(hint, sizeof hint, "`pg_isready -h 127.0.0.1 -p %s`", port);
  const char *url = nh_pgtest_url("host", "127.0.0.1", "port", port, "user", "nimbus", "password", "secret",
                                  "dbname", "nimbus", NULL);
  const char *const needles[] = { where, hint, "password=***", NULL };
  expect_fail_both(url, NH_EFAIL, "secret", needles);
}

TEST(connect_host_not_resolvable)
{
  const char *url = "postgresql://nimbus:secret@nimbus-test-no-such-host.invalid:5432/nimbus";
  const char *const needles[] = {
    "store postgresql://nimbus:***@nimbus-test-no-such-host.invalid:5432/nimbus: host "
    "\"nimbus-test-no-such-host.invalid\" cannot be resolved (",
    "check the host name in the URL", NULL,
  };
  expect_fail_both(url, NH_EFAIL, "secret", needles);
}

TEST(connect_timeout)
{
  char port[16], where[1024], hint[1024];
  local_socket(1, port);   /* the kernel completes the handshake; nobody ever answers */
  snprintf(where, sizeof where, "no answer from 127.0.0.1:%s within 1 s (connect_timeout)", port);
  snprintf(hint, sizeof hint, "`pg_isready -h 127.0.0.1 -p %s`", port);
  const char *url = nh_pgtest_url("host", "127.0.0.1", "port", port, "user", "nimbus", "password", "secret",
                                  "dbname", "nimbus", "connect_timeout", "1", NULL);
  const char *const needles[] = { where, hint, "raise connect_timeout", NULL };
  expect_fail_both(url, NH_EFAIL, "secret", needles);
}

TEST(connect_wrong_password)
{
  const char *url = nh_pgtest_url("password", "not-the-password", NULL);
  char who[1024];
  snprintf(who, sizeof who, "password authentication failed for user \"%s\" on %s (SQLSTATE 28P01); the password "
           "came from the URL", srv->user, hostport());
  const char *const needles[] = { who, "PGPASSWORD", "~/.pgpass", "password=***", NULL };
  expect_fail_both(url, NH_EUSAGE, "not-the-password", needles);
}

TEST(connect_without_a_password)
{
  unsetenv("PGPASSWORD");
  setenv("PGPASSFILE", nh_test_path("no-pgpass"), 1);
  const char *url = nh_pgtest_url("password", NULL, NULL);
  char who[1024];
  snprintf(who, sizeof who, "the server on %s asks user \"%s\" for a password and none was given", hostport(),
           srv->user);
  const char *const needles[] = { who, "PGPASSWORD", "~/.pgpass", NULL };
  expect_fail_both(url, NH_EUSAGE, NULL, needles);
  /* from the password file, then: it is named as the source when it is wrong */
  char line[1024];
  snprintf(line, sizeof line, "*:*:*:%s:not-the-password\n", srv->user);
  ASSERT_EQ_INT(nh_test_write_file(nh_test_path("pgpass"), line), 0);
  chmod(nh_test_path("pgpass"), 0600);
  setenv("PGPASSFILE", nh_test_path("pgpass"), 1);
  const char *const from_file[] = { "SQLSTATE 28P01); the password came from the password file (PGPASSFILE", NULL };
  expect_fail_both(url, NH_EUSAGE, "not-the-password", from_file);
  unsetenv("PGPASSFILE");
}

TEST(connect_no_such_role)
{
  /* With password authentication the server answers 28P01 for a role that does not
   * exist too (it does not tell who exists); with trust it would be 28000. */
  const char *url = nh_pgtest_url("user", "nh_test_no_such_role", "password", "secret", NULL);
  const char *const needles[] = { "user \"nh_test_no_such_role\"", "create the role if it does not exist: CREATE ROLE "
                                  "\"nh_test_no_such_role\" LOGIN", NULL };
  expect_fail_both(url, NH_EUSAGE, "secret", needles);
}

TEST(connect_missing_database)
{
  char db[64], createdb[1024], create[1024], where[1024];
  snprintf(db, sizeof db, "nh_test_%d_missing", (int)getpid());
  snprintf(where, sizeof where, "database \"%s\" does not exist on %s (SQLSTATE 3D000)", db, hostport());
  snprintf(createdb, sizeof createdb, "`createdb -h %s -p %s -U %s %s`", srv->host, srv->port, srv->user, db);
  snprintf(create, sizeof create, "CREATE DATABASE \"%s\" OWNER \"%s\";", db, srv->user);
  const char *const needles[] = { where, createdb, create, NULL };
  expect_fail_both(nh_pgtest_url("dbname", db, NULL), NH_ENOTFOUND, NULL, needles);
}

/* ---------------------------------------------------------------- statements */

TEST(exec_params_and_errors)
{
  PGconn *c = nh_pgtest_connect(srv->url);
  const char *const p[] = { "41", NULL };
  PGresult *r = NULL;
  nh_error_t err = {0};
  ASSERT_EQ_INT(nh_pg_exec(c, "SELECT $1::int + 1, $2::text IS NULL", 2, p, &r, &err), NH_OK);
  ASSERT_EQ_STR(PQgetvalue(r, 0, 0), "42");
  ASSERT_EQ_STR(PQgetvalue(r, 0, 1), "t");
  PQclear(r);
  ASSERT_EQ_INT(nh_pg_exec(c, "SELEC 1", 0, NULL, &r, &err), NH_EFAIL);
  ASSERT_NULL(r);
  char where[1024];
  snprintf(where, sizeof where, "store postgresql://%s%s@%s/%s: syntax error at or near \"SELEC\" (SQLSTATE 42601) "
           "while running `SELEC 1`", srv->user, *srv->password ? ":***" : "", hostport(), srv->dbname);
  ASSERT_CONTAINS(err.msg, where);
}

TEST(exec_on_a_lost_connection)
{
  PGconn *c = nh_pgtest_connect(srv->url);
  char sql[128];
  /* waits (up to 10 s) until the backend is gone */
  snprintf(sql, sizeof sql, "SELECT pg_terminate_backend(%d, 10000)", PQbackendPID(c));
  ASSERT_EQ_STR(nh_pgtest_q1(nh_pgtest_admin(), "%s", sql), "t");
  nh_error_t err = {0};
  ASSERT_EQ_INT(nh_pg_exec(c, "SELECT 1", 0, NULL, NULL, &err), NH_EFAIL);
  char where[1024];
  snprintf(where, sizeof where, "the connection to %s was lost while running `SELECT 1`", hostport());
  ASSERT_CONTAINS(err.msg, where);
  ASSERT_CONTAINS(err.msg, "is the server still running? `pg_isready -h ");
}

/* ---------------------------------------------------------------- schema */

static const char *const pk_of[][2] = {
  { "audit", "event_id,endpoint" },
  { "bulk_runs", "key" },
  { "history", "id" },
  { "hosts", "owner" },
  { "inbox", "endpoint,message_id" },
  { "operator_log", "id" },
  { "operator_pending", "message_id" },
  { "parked", "endpoint,session_id,park_seq" },
  { "processed", "endpoint,message_id,event_id" },
  { "published", "message_id" },
  { "sessions", "endpoint,session_id" },
};

static const char *pg_pk(PGconn *c, const char *table)
{
  return nh_pgtest_q1(c,
                      "SELECT coalesce(string_agg(a.attname, ',' ORDER BY array_position(i.indkey::int2[],"
                      " a.attnum)), '') FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid"
                      " AND a.attnum = ANY(i.indkey) WHERE i.indrelid = to_regclass('%s') AND i.indisprimary",
                      table);
}

TEST(migrate_from_empty_and_again)
{
  const char *db = nh_pgtest_scratch_db();
  PGconn *c = nh_pgtest_connect(nh_pgtest_url("dbname", db, NULL));
  int from = -1, to = -1, v = -1;
  nh_error_t err = {0};
  ASSERT_EQ_INT(nh_pg_schema_version(c, &v, &err), NH_OK);
  ASSERT_EQ_INT(v, 0);
  if (nh_pg_migrate(c, &from, &to, &err)) FAIL("%s", err.msg);
  ASSERT_EQ_INT(from, 0);
  ASSERT_EQ_INT(to, NH_PG_SCHEMA_VERSION);
  /* a second run is a no-op */
  if (nh_pg_migrate(c, &from, &to, &err)) FAIL("%s", err.msg);
  ASSERT_EQ_INT(from, NH_PG_SCHEMA_VERSION);
  ASSERT_EQ_INT(to, NH_PG_SCHEMA_VERSION);
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT count(*) || ':' || max(version) FROM nimbus_schema"), "1:4");
  /* one row only */
  PGresult *r = PQexec(c, "INSERT INTO nimbus_schema VALUES (5)");
  ASSERT_EQ_STR(PQresultErrorField(r, PG_DIAG_SQLSTATE), "23505");
  PQclear(r);
  /* every table, with its primary key */
  for (size_t i = 0; i < sizeof pk_of / sizeof pk_of[0]; i++) {
    const char *pk = pg_pk(c, pk_of[i][0]);
    if (strcmp(pk, pk_of[i][1]) != 0) FAIL("primary key of %s: (%s), not (%s)", pk_of[i][0], pk, pk_of[i][1]);
  }
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()"), "12");
  /* identities where sqlite has a rowid the store pages or orders by */
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT string_agg(table_name || '.' || column_name || ':' || identity_generation,"
                                " ' ' ORDER BY table_name) FROM information_schema.columns"
                                " WHERE table_schema = current_schema() AND is_identity = 'YES'"),
                "audit.seq:ALWAYS history.id:ALWAYS operator_log.id:ALWAYS");
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT indisunique FROM pg_index WHERE indexrelid = to_regclass('audit_seq')"), "t");
  /* text compares byte by byte, as on sqlite */
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT count(*) FROM pg_attribute a JOIN pg_class k ON k.oid = a.attrelid"
                                " WHERE k.relnamespace = current_schema()::regnamespace AND k.relkind = 'r'"
                                " AND a.atttypid = 'text'::regtype"
                                " AND a.attcollation <> 'pg_catalog.\"C\"'::regcollation"),
                "0");
  /* bodies are bytes: a NUL survives */
  ASSERT_EQ_STR(nh_pgtest_q1(c, "INSERT INTO audit(endpoint, event_id, session_id, status, payload, created_at,"
                                " updated_at) VALUES ('E', 'e1', 's', 'Completed', '\\x7b00227d'::bytea, 1, 1)"
                                " RETURNING length(payload)"),
                "4");
}

/* ---- the same tables, columns and indexes as sqlite at every version */

static void cat(char *out, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void cat(char *out, size_t len, const char *fmt, ...)
{
  size_t n = strlen(out);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(out + n, len - n, fmt, ap);
  va_end(ap);
}

static int is_body(const char *table, const char *col)
{
  static const char *const bodies[][2] = {
    { "audit", "payload" }, { "parked", "body" }, { "history", "previous_payload" },
    { "audit", "result" },   /* a hand-off's completion body */
  };
  for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++)
    if (!strcmp(bodies[i][0], table) && !strcmp(bodies[i][1], col)) return 1;
  return 0;
}

static sqlite3_stmt *lite(sqlite3 *db, const char *sql, const char *arg)
{
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) FAIL("%s: %s", sql, sqlite3_errmsg(db));
  if (arg) sqlite3_bind_text(st, 1, arg, -1, SQLITE_TRANSIENT);
  return st;
}

/* "table(col:type ...; pk=a,b; name[u][p](c1,c2) ...)" per table, sorted. sqlite's
 * INTEGER is PostgreSQL's bigint, TEXT text, a body bytea. */
static void describe_sqlite(sqlite3 *db, char *out, size_t len)
{
  out[0] = '\0';
  sqlite3_stmt *t = lite(db, "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
                             " AND name <> 'nh_schema' ORDER BY name", NULL);
  while (sqlite3_step(t) == SQLITE_ROW) {
    const char *table = (const char *)sqlite3_column_text(t, 0);
    cat(out, len, "%s(", table);
    sqlite3_stmt *c = lite(db, "SELECT name, upper(type) FROM pragma_table_info(?1) ORDER BY name", table);
    while (sqlite3_step(c) == SQLITE_ROW) {
      const char *col = (const char *)sqlite3_column_text(c, 0), *type = (const char *)sqlite3_column_text(c, 1);
      cat(out, len, "%s:%s ", col, is_body(table, col) ? "bytea" : strcmp(type, "INTEGER") == 0 ? "bigint"
                                   : strcmp(type, "TEXT") == 0 ? "text" : type);
    }
    sqlite3_finalize(c);
    cat(out, len, "; pk=");
    c = lite(db, "SELECT name FROM pragma_table_info(?1) WHERE pk > 0 ORDER BY pk", table);
    for (int i = 0; sqlite3_step(c) == SQLITE_ROW; i++) cat(out, len, "%s%s", i ? "," : "", sqlite3_column_text(c, 0));
    sqlite3_finalize(c);
    cat(out, len, ";");
    c = lite(db, "SELECT name, \"unique\", partial FROM pragma_index_list(?1) WHERE origin = 'c' ORDER BY name", table);
    while (sqlite3_step(c) == SQLITE_ROW) {
      const char *name = (const char *)sqlite3_column_text(c, 0);
      cat(out, len, " %s%s%s(", name, sqlite3_column_int(c, 1) ? "[u]" : "", sqlite3_column_int(c, 2) ? "[p]" : "");
      sqlite3_stmt *ic = lite(db, "SELECT name FROM pragma_index_info(?1) ORDER BY seqno", name);
      for (int i = 0; sqlite3_step(ic) == SQLITE_ROW; i++)
        cat(out, len, "%s%s", i ? "," : "", sqlite3_column_text(ic, 0));
      sqlite3_finalize(ic);
      cat(out, len, ")");
    }
    sqlite3_finalize(c);
    cat(out, len, ")\n");
  }
  sqlite3_finalize(t);
}

static PGresult *rows(PGconn *c, const char *sql, const char *arg)
{
  PGresult *r = NULL;
  nh_error_t err = {0};
  const char *const p[] = { arg };
  if (nh_pg_exec(c, sql, arg ? 1 : 0, arg ? p : NULL, &r, &err)) FAIL("%s", err.msg);
  return r;
}

/* The same description of the current schema; audit.seq and audit_seq, which stand in
 * for sqlite's rowid, are left out. */
static void describe_pg(PGconn *conn, char *out, size_t len)
{
  out[0] = '\0';
  PGresult *t = rows(conn, "SELECT relname FROM pg_class WHERE relnamespace = current_schema()::regnamespace"
                           " AND relkind = 'r' AND relname <> 'nimbus_schema' ORDER BY relname COLLATE \"C\"", NULL);
  for (int i = 0; i < PQntuples(t); i++) {
    const char *table = PQgetvalue(t, i, 0);
    cat(out, len, "%s(", table);
    PGresult *c = rows(conn, "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute"
                             " WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped"
                             " ORDER BY attname COLLATE \"C\"", table);
    for (int k = 0; k < PQntuples(c); k++)
      if (strcmp(table, "audit") || strcmp(PQgetvalue(c, k, 0), "seq"))
        cat(out, len, "%s:%s ", PQgetvalue(c, k, 0), PQgetvalue(c, k, 1));
    PQclear(c);
    cat(out, len, "; pk=%s;", pg_pk(conn, table));
    c = rows(conn, "SELECT k.relname, i.indisunique, i.indpred IS NOT NULL,"
                   " (SELECT string_agg(a.attname, ',' ORDER BY array_position(i.indkey::int2[], a.attnum))"
                   "  FROM pg_attribute a WHERE a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey))"
                   " FROM pg_index i JOIN pg_class k ON k.oid = i.indexrelid"
                   " WHERE i.indrelid = to_regclass($1) AND NOT i.indisprimary ORDER BY k.relname COLLATE \"C\"",
           table);
    for (int k = 0; k < PQntuples(c); k++)
      if (strcmp(PQgetvalue(c, k, 0), "audit_seq"))
        cat(out, len, " %s%s%s(%s)", PQgetvalue(c, k, 0), strcmp(PQgetvalue(c, k, 1), "t") ? "" : "[u]",
            strcmp(PQgetvalue(c, k, 2), "t") ? "" : "[p]", PQgetvalue(c, k, 3));
    PQclear(c);
    cat(out, len, ")\n");
  }
  PQclear(t);
}

TEST(migrate_each_version_matches_sqlite)
{
  const char *db = nh_pgtest_scratch_db();
  PGconn *c = nh_pgtest_connect(nh_pgtest_url("dbname", db, NULL));
  static char want[16384], got[16384];
  for (int v = 1; v <= NH_PG_SCHEMA_VERSION; v++) {
    sqlite3 *lite_db = NULL;
    nh_error_t err = {0};
    ASSERT_EQ_INT(sqlite3_open(":memory:", &lite_db), SQLITE_OK);
    int rc = nh_sqlite_migrate(lite_db, "store", nh_store_migrations, v, &err);
    if (rc == NH_OK) describe_sqlite(lite_db, want, sizeof want);
    sqlite3_close(lite_db);
    if (rc) FAIL("sqlite to version %d: %s", v, err.msg);
    /* step by step: each migration runs on the schema the one before left */
    int from = -1, to = -1;
    if (nh_pg_migrate_to(c, v, &from, &to, &err)) FAIL("to version %d: %s", v, err.msg);
    ASSERT_EQ_INT(from, v - 1);
    ASSERT_EQ_INT(to, v);
    describe_pg(c, got, sizeof got);
    if (strcmp(want, got) != 0) FAIL("version %d differs:\n--- sqlite\n%s--- PostgreSQL\n%s", v, want, got);
  }
}

TEST(migrate_refuses_a_newer_store)
{
  const char *db = nh_pgtest_scratch_db();
  PGconn *c = nh_pgtest_connect(nh_pgtest_url("dbname", db, NULL));
  nh_pgtest_q1(c, "CREATE TABLE nimbus_schema (version int NOT NULL)");
  nh_pgtest_q1(c, "INSERT INTO nimbus_schema VALUES (99)");
  int from = -1, to = -1, v = 0;
  nh_error_t err = {0};
  ASSERT_EQ_INT(nh_pg_schema_version(c, &v, &err), NH_OK);
  ASSERT_EQ_INT(v, 99);
  ASSERT_EQ_INT(nh_pg_migrate(c, &from, &to, &err), NH_EFAIL);
  ASSERT_CONTAINS(err.msg, "the store's schema is version 99, newer than this nimbus-host knows (4): upgrade "
                           "nimbus-host or use another --store");
  ASSERT_CONTAINS(err.msg, db);
  ASSERT_EQ_INT(from, 99);
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT to_regclass('audit') IS NULL"), "t");   /* nothing was created */
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT version FROM nimbus_schema"), "99");
}

TEST(migrate_without_create_on_schema_public)
{
  const char *role = nh_pgtest_scratch_role("limited", "limited-pw");
  const char *db = nh_pgtest_scratch_db();
  PGconn *c = nh_pgtest_connect(nh_pgtest_url("user", role, "password", "limited-pw", "dbname", db, NULL));
  int from = -1, to = -1;
  nh_error_t err = {0};
  ASSERT_EQ_INT(nh_pg_migrate(c, &from, &to, &err), NH_EFAIL);
  char want[1024];
  snprintf(want, sizeof want, "role \"%s\" may not create tables in schema \"public\" of database \"%s\" (SQLSTATE "
           "42501: permission denied for schema public) while migrating the schema to version 1: as the owner of the "
           "database (role \"%s\") or a superuser run GRANT CREATE ON SCHEMA \"public\" TO \"%s\";",
           role, db, srv->user, role);
  ASSERT_CONTAINS(err.msg, want);
  ASSERT_TRUE(strstr(err.msg, "limited-pw") == NULL);
  /* nothing half-made */
  PGconn *owner = nh_pgtest_connect(nh_pgtest_url("dbname", db, NULL));
  ASSERT_EQ_STR(nh_pgtest_q1(owner, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"), "0");

  /* the advice works; then a store of another owner: the migration must alter its tables */
  nh_pgtest_q1(owner, "GRANT CREATE ON SCHEMA public TO \"%s\"", role);
  if (nh_pg_migrate_to(owner, 2, &from, &to, &err)) FAIL("%s", err.msg);
  ASSERT_EQ_INT(nh_pg_migrate(c, &from, &to, &err), NH_EFAIL);
  snprintf(want, sizeof want, "role \"%s\" does not own the store's tables in schema \"public\" (their owner is "
           "\"%s\"), which migrations read and alter (SQLSTATE 42501: permission denied for table nimbus_schema)",
           role, srv->user);
  ASSERT_CONTAINS(err.msg, want);
  snprintf(want, sizeof want, "GRANT \"%s\" TO \"%s\";", srv->user, role);
  ASSERT_CONTAINS(err.msg, want);
  nh_pgtest_admin_sql("GRANT \"%s\" TO \"%s\"", srv->user, role);
  if (nh_pg_migrate(c, &from, &to, &err)) FAIL("%s", err.msg);
  ASSERT_EQ_INT(from, 2);
  ASSERT_EQ_INT(to, NH_PG_SCHEMA_VERSION);
}

typedef struct migrator {
  const char *url;
  pthread_barrier_t *start;
  int rc, from, to;
  nh_error_t err;
} migrator_t;

static void *migrate_thread(void *p)
{
  migrator_t *m = p;
  PGconn *c = NULL;
  m->rc = nh_pg_connect(m->url, &c, &m->err);
  pthread_barrier_wait(m->start);   /* all connected: they migrate at the same moment */
  if (m->rc == NH_OK) m->rc = nh_pg_migrate(c, &m->from, &m->to, &m->err);
  PQfinish(c);
  return NULL;
}

TEST(migrate_concurrently)
{
  enum { N = 4 };
  const char *db = nh_pgtest_scratch_db();
  const char *url = nh_pgtest_url("dbname", db, NULL);
  pthread_barrier_t start;
  pthread_barrier_init(&start, NULL, N);
  migrator_t m[N];
  pthread_t th[N];
  for (int i = 0; i < N; i++) {
    m[i] = (migrator_t){ .url = url, .start = &start, .from = -1, .to = -1 };
    pthread_create(&th[i], NULL, migrate_thread, &m[i]);
  }
  for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
  pthread_barrier_destroy(&start);
  int from_zero = 0;
  for (int i = 0; i < N; i++) {
    if (m[i].rc) FAIL("migrator %d: %s", i, m[i].err.msg);
    ASSERT_EQ_INT(m[i].to, NH_PG_SCHEMA_VERSION);
    from_zero += m[i].from == 0;
  }
  ASSERT_CMP_INT(from_zero, >=, 1);
  PGconn *c = nh_pgtest_connect(url);
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT count(*) || ':' || max(version) FROM nimbus_schema"), "1:4");
}

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv)
{
  int rc = nh_pgtest_setup(NH_PGTEST_HOOKS, argv[0], 0, "the URL tests run, the rest is skipped");
  if (rc == 77) {
    char *only[] = { argv[0], "url_", NULL };
    return nh_test_run_all(2, only) ? 1 : 77;
  }
  if (rc) return rc;
  srv = nh_pgtest_server();
  /* the expected messages name them */
  if (!*srv->host || !*srv->dbname) {
    fprintf(stderr, "test_pg: NH_PG_URL must name the host and the database "
                    "(postgresql://USER:PASSWORD@HOST:PORT/DATABASE)\n");
    return 1;
  }
  rc = nh_test_run_all(argc, argv);
  nh_pgtest_teardown();
  return rc;
}
