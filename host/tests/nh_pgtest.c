/* The PostgreSQL test suites' shared helpers (nh_pgtest.h). nh_test.h is header-only and
 * its state lives in each suite's translation unit, so this file does not include it:
 * failing a test and running something after it go through the hooks the suite gives
 * nh_pgtest_setup. */
#include "nh_pgtest.h"

#include <ctype.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store/nh_pg.h"
#include "store/nh_pg_ops.h"

static nh_pgtest_hooks_t hooks;
static nh_pgtest_server_t server;
static PQconninfoOption *url_opts;   /* NH_PG_URL as libpq parsed it: nh_pgtest_url's base */
static PGconn *admin_conn;
static int scratch_seq;

/* ---------------------------------------------------------------- failing the test */

__attribute__((noreturn, format(printf, 3, 4))) static void fail_at(const char *file, int line, const char *fmt, ...)
{
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (hooks.fail) hooks.fail(file, line, msg);
  /* no test to fail: a helper called before nh_pgtest_setup */
  fprintf(stderr, "%s:%d: %s (nh_pgtest_setup was not called)\n", file, line, msg);
  abort();
}

/* As nh_test.h's FAIL: says where and why, and abandons the test. */
#define FAIL(...) fail_at(__FILE__, __LINE__, __VA_ARGS__)

static void after_test(void (*fn)(void *), void *arg)
{
  if (!hooks.on_cleanup) FAIL("no cleanup hook: call nh_pgtest_setup first");
  hooks.on_cleanup(fn, arg);
}

__attribute__((format(printf, 1, 2))) static char *xprintf(const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char *out = n < 0 ? NULL : malloc((size_t)n + 1);
  if (!out) FAIL("out of memory formatting \"%s\"", fmt);
  va_start(ap, fmt);
  vsnprintf(out, (size_t)n + 1, fmt, ap);
  va_end(ap);
  return out;
}

/* ---------------------------------------------------------------- the environment */

static int is_set(const char *v) { return v && *v; }

/* Copies one of NH_PG_URL's parts; -1 (said) when it does not fit. */
static int keep_part(const char *suite, const char *what, char *dst, size_t len, const char *v)
{
  if ((size_t)snprintf(dst, len, "%s", v) < len) return 0;
  fprintf(stderr, "%s: NH_PG_URL's %s is longer than %zu bytes: use a shorter one\n", suite, what, len - 1);
  return -1;
}

static int parse_url(const char *suite)
{
  char *why = NULL;
  char *lower = strdup(server.url);
  if (!lower) return -1;
  /* libpq takes the scheme in lower case only; nimbus-host takes it in any case */
  for (char *c = lower; *c && *c != ':'; c++) *c = (char)tolower((unsigned char)*c);
  url_opts = PQconninfoParse(lower, &why);
  free(lower);
  if (!url_opts) {
    size_t n = why ? strcspn(why, "\n") : 0;
    fprintf(stderr, "%s: NH_PG_URL does not parse: %.*s; write it as postgresql://USER:PASSWORD@HOST:PORT/DATABASE\n",
            suite, why ? (int)n : 13, why ? why : "out of memory");
    PQfreemem(why);
    return -1;
  }
  struct { const char *keyword, *what; char *dst; size_t len; } parts[] = {
    { "host", "host", server.host, sizeof server.host },
    { "port", "port", server.port, sizeof server.port },
    { "user", "user", server.user, sizeof server.user },
    { "password", "password", server.password, sizeof server.password },
    { "dbname", "database", server.dbname, sizeof server.dbname },
  };
  snprintf(server.port, sizeof server.port, "5432");
  int rc = 0;
  for (const PQconninfoOption *o = url_opts; o->keyword && !rc; o++)
    for (size_t i = 0; i < sizeof parts / sizeof parts[0] && !rc; i++)
      if (o->val && *o->val && !strcmp(o->keyword, parts[i].keyword))
        rc = keep_part(suite, parts[i].what, parts[i].dst, parts[i].len, o->val);
  if (!rc && !*server.user) {
    fprintf(stderr, "%s: NH_PG_URL must name its user (postgresql://USER:PASSWORD@HOST:PORT/DATABASE)\n", suite);
    rc = -1;
  }
  if (rc) {
    PQconninfoFree(url_opts);
    url_opts = NULL;
  }
  return rc;
}

int nh_pgtest_setup(const nh_pgtest_hooks_t *h, const char *argv0, int flags, const char *skipped)
{
  hooks = *h;
  const char *slash = strrchr(argv0, '/');
  const char *suite = slash ? slash + 1 : argv0;
  server.url = getenv("NH_PG_URL");
  server.admin_url = is_set(getenv("NH_PG_ADMIN_URL")) ? getenv("NH_PG_ADMIN_URL") : NULL;
  int no_url = !is_set(server.url), no_admin = (flags & NH_PGTEST_NEED_ADMIN_URL) && !server.admin_url;
  if (no_url || no_admin) {
    const char *missing = !no_url ? "NH_PG_ADMIN_URL is" : no_admin ? "NH_PG_URL and NH_PG_ADMIN_URL are"
                                                                    : "NH_PG_URL is";
    const char *ci = getenv("CI");
    if (ci && (!strcmp(ci, "true") || !strcmp(ci, "1"))) {
      fprintf(stderr, "%s: %s not set, and under CI the PostgreSQL tests must run: run them through ctest (the "
                      "fixture \"postgres\" starts a cluster and sets NH_PG_URL and NH_PG_ADMIN_URL)\n",
              suite, missing);
      return 1;
    }
    fprintf(stderr, "%s: %s not set: %s. To run it all: scripts/postgres.sh start, then "
                    "NH_PG_URL=$(scripts/postgres.sh url) NH_PG_ADMIN_URL=$(scripts/postgres.sh admin-url) %s\n",
            suite, missing, skipped, argv0);
    return 77;
  }
  return parse_url(suite) ? 1 : 0;
}

const nh_pgtest_server_t *nh_pgtest_server(void) { return &server; }

void nh_pgtest_teardown(void)
{
  PQfinish(admin_conn);
  admin_conn = NULL;
  PQconninfoFree(url_opts);
  url_opts = NULL;
}

/* ---------------------------------------------------------------- URLs */

/* Appends s to out (len bytes, *o used), percent-encoded (but for RFC 3986's unreserved
 * characters) when `encode`; -1 when it does not fit. */
static int put(char *out, size_t len, size_t *o, const char *s, int encode)
{
  for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
    if (len - *o < 4) return -1;
    if (!encode || isalnum(*c) || strchr("-._~", *c)) out[(*o)++] = (char)*c;
    else *o += (size_t)snprintf(out + *o, len - *o, "%%%02X", *c);
  }
  out[*o] = '\0';
  return 0;
}

enum { URL_MAX_SET = 8 };

typedef struct url_set {
  int n;
  const char *key[URL_MAX_SET], *val[URL_MAX_SET];
} url_set_t;

static const PQconninfoOption *url_option(const char *keyword)
{
  for (const PQconninfoOption *o = url_opts; o->keyword; o++)
    if (!strcmp(o->keyword, keyword)) return o;
  return NULL;
}

/* The value of `keyword` in the URL being made: the caller's, else NH_PG_URL's. */
static const char *url_value(const url_set_t *set, const PQconninfoOption *o)
{
  for (int i = 0; i < set->n; i++)
    if (!strcmp(set->key[i], o->keyword)) return set->val[i];
  return o->val;
}

const char *nh_pgtest_url(const char *key, ...)
{
  static char bufs[8][2048];
  static int next;
  if (!url_opts) FAIL("nh_pgtest_url: NH_PG_URL was not read: call nh_pgtest_setup first");
  url_set_t set = { 0 };
  va_list ap;
  va_start(ap, key);
  for (const char *k = key; k; k = va_arg(ap, const char *)) {
    if (set.n == URL_MAX_SET) {
      va_end(ap);
      FAIL("nh_pgtest_url: more than %d parameters (raise URL_MAX_SET)", URL_MAX_SET);
    }
    set.key[set.n] = k;
    set.val[set.n++] = va_arg(ap, const char *);
  }
  va_end(ap);
  for (int i = 0; i < set.n; i++)
    if (!url_option(set.key[i])) FAIL("nh_pgtest_url: \"%s\" is not a libpq connection parameter", set.key[i]);

  const PQconninfoOption *db = url_option("dbname");
  char *b = bufs[next++ & 7];
  size_t o = 0, len = sizeof bufs[0];
  const char *dbname = url_value(&set, db);
  int bad = put(b, len, &o, "postgresql:///", 0) || put(b, len, &o, dbname ? dbname : "", 1);
  const char *sep = "?";
  for (const PQconninfoOption *p = url_opts; p->keyword && !bad; p++) {
    const char *v = url_value(&set, p);
    if (p == db || !v) continue;
    bad = put(b, len, &o, sep, 0) || put(b, len, &o, p->keyword, 0) || put(b, len, &o, "=", 0) ||
          put(b, len, &o, v, 1);
    sep = "&";
  }
  if (bad) FAIL("nh_pgtest_url: the URL is longer than %zu bytes (raise the buffers)", len - 1);
  return b;
}

/* ---------------------------------------------------------------- the superuser */

static int is_superuser(PGconn *c)
{
  PGresult *r = PQexec(c, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user");
  int yes = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 && strcmp(PQgetvalue(r, 0, 0), "t") == 0;
  PQclear(r);
  return yes;
}

PGconn *nh_pgtest_admin(void)
{
  if (admin_conn) return admin_conn;
  const char *given = server.admin_url, *tries[2] = { given, NULL };
  if (!given) {
    tries[0] = server.url;
    tries[1] = nh_pgtest_url("user", "postgres", "password", NULL, "dbname", "postgres", NULL);
  }
  char why[2][600] = { "", "" };
  for (int i = 0; i < 2 && tries[i]; i++) {
    nh_error_t err = { 0 };
    PGconn *c = NULL;
    if (nh_pg_connect(tries[i], &c, &err)) {
      snprintf(why[i], sizeof why[i], "%s", err.msg);
      continue;
    }
    if (is_superuser(c)) return admin_conn = c;
    snprintf(why[i], sizeof why[i], "its role %s is not a superuser", PQuser(c));
    PQfinish(c);
  }
  FAIL("no superuser connection for the scratch databases: set NH_PG_ADMIN_URL to a superuser's URL (%s%s%s)",
       why[0], *why[1] ? "; " : "", why[1]);
}

/* Runs sql (n bytes long, as vsnprintf into it said) on c; its result (the caller clears
 * it), or the test fails. */
static PGresult *exec_sql(PGconn *c, const char *sql, int n, size_t size)
{
  if (n < 0 || (size_t)n >= size) FAIL("SQL longer than %zu bytes: %.60s...", size - 1, sql);
  PGresult *r = NULL;
  nh_error_t err = { 0 };
  if (nh_pg_exec(c, sql, 0, NULL, &r, &err)) FAIL("%s: %s", sql, err.msg);
  return r;
}

void nh_pgtest_admin_sql(const char *fmt, ...)
{
  char sql[2048];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(sql, sizeof sql, fmt, ap);
  va_end(ap);
  PQclear(exec_sql(nh_pgtest_admin(), sql, n, sizeof sql));
}

/* ---------------------------------------------------------------- scratch databases and roles */

/* A cleanup: runs `drop` (a format for `name`), warning (cleanups may not fail the test)
 * when the server refuses. */
static void drop_quietly(const char *drop, char *name)
{
  char sql[256];
  snprintf(sql, sizeof sql, drop, name);
  PGresult *r = PQexec(admin_conn, sql);
  if (PQresultStatus(r) != PGRES_COMMAND_OK) fprintf(stderr, "warning: %s: %s", sql, PQerrorMessage(admin_conn));
  PQclear(r);
  free(name);
}

static void drop_db(void *name) { drop_quietly("DROP DATABASE IF EXISTS \"%s\" WITH (FORCE)", name); }
static void drop_role(void *name) { drop_quietly("DROP ROLE IF EXISTS \"%s\"", name); }

const char *nh_pgtest_scratch_db(void)
{
  nh_pgtest_admin();
  char *name = xprintf("nh_test_%d_%d", (int)getpid(), ++scratch_seq);
  after_test(drop_db, name);
  nh_pgtest_admin_sql("DROP DATABASE IF EXISTS \"%s\" WITH (FORCE)", name);
  nh_pgtest_admin_sql("CREATE DATABASE \"%s\" OWNER \"%s\" TEMPLATE template0", name, server.user);
  return name;
}

const char *nh_pgtest_scratch_role(const char *suffix, const char *password)
{
  nh_pgtest_admin();
  char *name = xprintf("nh_test_%d_%s", (int)getpid(), suffix);
  after_test(drop_role, name);
  nh_pgtest_admin_sql("DROP ROLE IF EXISTS \"%s\"", name);
  nh_pgtest_admin_sql("CREATE ROLE \"%s\" LOGIN PASSWORD '%s'", name, password);
  return name;
}

/* ---------------------------------------------------------------- connections and queries */

static void finish_conn(void *c) { PQfinish(c); }

PGconn *nh_pgtest_connect(const char *url)
{
  nh_error_t err = { 0 };
  PGconn *c = NULL;
  if (nh_pg_connect(url, &c, &err)) FAIL("connect: %s", err.msg);
  after_test(finish_conn, c);
  return c;
}

const char *nh_pgtest_q1(PGconn *c, const char *fmt, ...)
{
  static char out[8][1024];
  static int next;
  char sql[2048];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(sql, sizeof sql, fmt, ap);
  va_end(ap);
  PGresult *r = exec_sql(c, sql, n, sizeof sql);
  char *o = out[next++ & 7];
  snprintf(o, sizeof out[0], "%s", PQntuples(r) > 0 && PQnfields(r) > 0 ? PQgetvalue(r, 0, 0) : "(no row)");
  PQclear(r);
  return o;
}

static void free_db(void *db) { nh_pg_db_free(db); }

const char *nh_pgtest_scratch_url(void)
{
  static char url[1024];
  snprintf(url, sizeof url, "%s", nh_pgtest_url("dbname", nh_pgtest_scratch_db(), NULL));
  return url;
}

nh_pg_db_t *nh_pgtest_db(const char *url, int (*migrate)(PGconn *, nh_error_t *), const char *what)
{
  PGconn *c = NULL;
  nh_error_t err = { 0 };
  if (nh_pg_connect(url, &c, &err)) FAIL("%s", err.msg);
  if (migrate && migrate(c, &err)) {
    PQfinish(c);
    FAIL("%s migrate: %s", what, err.msg);
  }
  nh_pg_db_t *db = nh_pg_db_new(c);
  hooks.on_cleanup(free_db, db);
  return db;
}

typedef struct together {
  const char *url;
  int (*migrate)(PGconn *, nh_error_t *);
  int rc;
  char msg[512];
} together_t;

static void *migrate_one(void *p)
{
  together_t *t = p;
  PGconn *c = NULL;
  nh_error_t err = { 0 };
  t->rc = nh_pg_connect(t->url, &c, &err);
  if (t->rc == NH_OK) t->rc = t->migrate(c, &err);
  snprintf(t->msg, sizeof t->msg, "%s", err.msg);
  PQfinish(c);
  return NULL;
}

void nh_pgtest_migrate_together(const char *url, int (*migrate)(PGconn *, nh_error_t *), int n)
{
  together_t t[8];
  pthread_t th[8];
  if (n > 8) n = 8;
  for (int i = 0; i < n; i++) {
    t[i] = (together_t){ url, migrate, -1, "" };
    pthread_create(&th[i], NULL, migrate_one, &t[i]);
  }
  for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < n; i++)
    if (t[i].rc) FAIL("host %d of %d migrating at once: %s", i + 1, n, t[i].msg);
}
