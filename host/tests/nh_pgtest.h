/* What the PostgreSQL test suites (test_pg*.c) share: the test cluster named
 * by the environment, the superuser connection, scratch databases and roles made per test
 * and dropped after it, URLs to the cluster, connections closed after the test, and
 * one-value queries.
 *
 *   NH_PGTEST_MAIN()     (or a main of its own around nh_pgtest_setup and nh_pgtest_teardown)
 *
 * NH_PG_URL names a database the tests may create tables in (the ctest fixture "postgres":
 * scripts/postgres.sh), NH_PG_ADMIN_URL a superuser. A helper that cannot do its part fails
 * the running test, saying why. Include this after nh_test.h. */
#ifndef NH_PGTEST_H
#define NH_PGTEST_H

#include <libpq-fe.h>

/* What nh_test.h gives the suite's own translation unit, where its state lives (it is
 * header-only): failing the running test (does not return), running fn(arg) after it. */
typedef struct nh_pgtest_hooks {
  void (*fail)(const char *file, int line, const char *msg);
  void (*on_cleanup)(void (*fn)(void *), void *arg);
} nh_pgtest_hooks_t;

/* NH_PG_URL's parts as libpq reads them ("" where it gives none; port "5432"). */
typedef struct nh_pgtest_server {
  const char *url;         /* NH_PG_URL */
  const char *admin_url;   /* NH_PG_ADMIN_URL, or NULL */
  char host[256], port[16], user[128], password[128], dbname[128];
} nh_pgtest_server_t;

/* nh_pgtest_setup's flags. */
#define NH_PGTEST_NEED_ADMIN_URL 1   /* without NH_PG_ADMIN_URL the suite is skipped too */

/* Reads the environment; argv0 names the suite in messages. 0: run. 77: skipped (said on
 * stderr with how to run it, `skipped` saying what happens instead), because NH_PG_URL
 * (or, with NH_PGTEST_NEED_ADMIN_URL, NH_PG_ADMIN_URL) is not set. 1: the suite must fail
 * (said on stderr): CI is true or 1 and they are not set, or NH_PG_URL does not parse or
 * names no user. */
int nh_pgtest_setup(const nh_pgtest_hooks_t *hooks, const char *argv0, int flags, const char *skipped);
/* The server, once nh_pgtest_setup returned 0. */
const nh_pgtest_server_t *nh_pgtest_server(void);
/* Closes the superuser connection and frees what setup kept. */
void nh_pgtest_teardown(void);

/* The superuser connection (kept for the run): NH_PG_ADMIN_URL; unset, NH_PG_URL's role if
 * it is a superuser, else role postgres on NH_PG_URL's server without a password. */
PGconn *nh_pgtest_admin(void);
/* Runs SQL (a printf format) through the superuser connection. */
void nh_pgtest_admin_sql(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A fresh database owned by NH_PG_URL's role, dropped after the test; its name. */
const char *nh_pgtest_scratch_db(void);
/* A login role nh_test_<pid>_<suffix> with a password, dropped after the test; its name.
 * Make it before the databases it gets rights in: cleanups run last first, and a role
 * cannot be dropped while a database grants it something. */
const char *nh_pgtest_scratch_role(const char *suffix, const char *password);

/* NH_PG_URL with parameters replaced, added or (a NULL value) dropped: `key, value` pairs
 * of libpq's keywords ending in a NULL key, e.g. nh_pgtest_url("dbname", db, NULL). Every
 * parameter but the database goes in the query, percent-encoded. In one of 8 rotating
 * buffers (enough for one expression). */
const char *nh_pgtest_url(const char *key, ...) __attribute__((sentinel));

/* A blocking connection to url, closed after the test. */
PGconn *nh_pgtest_connect(const char *url);

/* A fresh scratch database's URL (the database dropped after the test), in a buffer of its own
 * that the next call reuses. */
const char *nh_pgtest_scratch_url(void);
/* The executor (nh_pg_ops.h) on a new connection to url, after `migrate` (a schema's
 * nh_pg_*_migrate; NULL: none) ran on it, freed after the test; `what` names the schema when
 * the migration fails. */
struct nh_pg_db;
struct nh_error;
struct nh_pg_db *nh_pgtest_db(const char *url, int (*migrate)(PGconn *, struct nh_error *), const char *what);
/* Hosts starting together: `migrate` run on n (at most 8) new connections to url at once,
 * one thread each. FAILs the test with the first host's error, if any. */
void nh_pgtest_migrate_together(const char *url, int (*migrate)(PGconn *, struct nh_error *), int n);

/* The first value of the first row of SQL (a printf format) as text: "" for NULL,
 * "(no row)" without one. In one of 8 rotating buffers. */
const char *nh_pgtest_q1(PGconn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#ifdef NH_TEST_H
NH_TEST_UNUSED static void nh_pgtest_fail_test(const char *file, int line, const char *msg)
{
  nh_test_fail(file, line, "%s", msg);
}

/* The hooks of the suite that includes this (after nh_test.h), for nh_pgtest_setup. */
#define NH_PGTEST_HOOKS (&(const nh_pgtest_hooks_t){ nh_pgtest_fail_test, nh_test_on_cleanup })

/* The main of a suite that needs the cluster and its superuser (skipped, 77, without them). */
#define NH_PGTEST_MAIN()                                                                          \
  int main(int argc, char **argv)                                                                 \
  {                                                                                               \
    int rc = nh_pgtest_setup(NH_PGTEST_HOOKS, argv[0], NH_PGTEST_NEED_ADMIN_URL, "skipped");      \
    if (rc) return rc;                                                                            \
    rc = nh_test_run_all(argc, argv);                                                             \
    nh_pgtest_teardown();                                                                         \
    return rc;                                                                                    \
  }
#endif

#endif
