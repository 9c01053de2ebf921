/* The PostgreSQL store's statements run blocking (the CLI, migrations at start) and the
 * migrator of versioned migration lists (nh_pg_int.h): the store's, whose version lives in
 * the one-row table nimbus_schema, the embedded queue's (nh_pg_queue.c) and the AMQP
 * transport's (nh_pg_amqp.c), each with its own version table and advisory lock. */
#include "nh_pg_int.h"
#include "nh_pg_schema.h"
#include "nh_store_schema.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(sizeof nh_pg_migrations / sizeof nh_pg_migrations[0] == NH_PG_SCHEMA_VERSION,
               "NH_PG_SCHEMA_VERSION must count the entries of nh_pg_migrations");
_Static_assert(sizeof nh_store_migrations / sizeof nh_store_migrations[0] == NH_PG_SCHEMA_VERSION,
               "every sqlite migration (nh_store_schema.h) needs its PostgreSQL entry in nh_pg_schema.h");

/* The advisory lock every migrating host takes: "NHst" (the sqlite store's application
 * id) and 1. Advisory locks are per database, like the store. */
#define NH_PG_MIGRATE_LOCK "5640885475334946817"

int nh_pg_exec(PGconn *conn, const char *sql, int nparams, const char *const *params, PGresult **res,
               nh_error_t *err)
{
  if (res) *res = NULL;
  PGresult *r = PQexecParams(conn, sql, nparams, NULL, params, NULL, NULL, 0);
  ExecStatusType st = PQresultStatus(r);
  if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) {
    if (res) *res = r;
    else PQclear(r);
    return NH_OK;
  }
  char doing[128];
  size_t n = strcspn(sql, "\n");
  snprintf(doing, sizeof doing, "running `%.*s%s`", (int)(n > 72 ? 72 : n), sql, n > 72 || sql[n] ? " ..." : "");
  int rc = nh_pg_explain_result(conn, r, doing, err);
  PQclear(r);
  return rc;
}

/* Several statements in one string (a migration): the simple query protocol. */
static int exec_script(PGconn *conn, const char *sql, PGresult **failed)
{
  PGresult *r = PQexec(conn, sql);
  ExecStatusType st = PQresultStatus(r);
  if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) {
    PQclear(r);
    return NH_OK;
  }
  *failed = r;
  return NH_EFAIL;
}

static void rollback(PGconn *conn)
{
  PQclear(PQexec(conn, "ROLLBACK"));
}

/* One query with text parameters; NH_OK with *r, or NH_EFAIL with *failed to explain. */
static int query(PGconn *conn, const char *sql, const char *param, PGresult **r, PGresult **failed)
{
  *r = PQexecParams(conn, sql, param ? 1 : 0, NULL, param ? &param : NULL, NULL, NULL, 0);
  if (PQresultStatus(*r) == PGRES_TUPLES_OK || PQresultStatus(*r) == PGRES_COMMAND_OK) return NH_OK;
  *failed = *r;
  *r = NULL;
  return NH_EFAIL;
}

/* The version and whether the list's version table exists (-1: it does, but has no
 * row). On an error *failed gets the result, for the caller to explain. The table's name
 * is the list's own (a constant of this program), so it is spelled into the SQL. */
static int read_version(PGconn *conn, const nh_pg_migrations_t *m, int *version, int *exists, PGresult **failed)
{
  char sql[128];
  PGresult *r;
  *version = 0;
  *exists = 0;
  if (query(conn, "SELECT to_regclass($1) IS NOT NULL", m->table, &r, failed)) return NH_EFAIL;
  int found = strcmp(PQgetvalue(r, 0, 0), "t") == 0;
  PQclear(r);
  if (!found) return NH_OK;
  snprintf(sql, sizeof sql, "SELECT version FROM %s", m->table);
  if (query(conn, sql, NULL, &r, failed)) return NH_EFAIL;
  *exists = PQntuples(r) > 0 ? 1 : -1;
  if (*exists > 0) *version = atoi(PQgetvalue(r, 0, 0));
  PQclear(r);
  return NH_OK;
}

int nh_pg_migrations_version(PGconn *conn, const nh_pg_migrations_t *m, int *version, nh_error_t *err)
{
  int exists;
  PGresult *failed = NULL;
  if (read_version(conn, m, version, &exists, &failed) == NH_OK) return NH_OK;
  char doing[96];
  snprintf(doing, sizeof doing, "reading %s version", m->what);
  int rc = nh_pg_explain_result(conn, failed, doing, err);
  PQclear(failed);
  return rc;
}

/* What a failure while migrating was doing: "migrating the schema to version 3". */
static void migrating(const nh_pg_migrations_t *m, int version, char *doing, size_t len)
{
  if (version > 0) snprintf(doing, len, "migrating %s to version %d", m->what, version);
  else snprintf(doing, len, "migrating %s", m->what);
}

/* A migration refused with 42501: which right is missing, on what, and who can grant it
 * (asked of the server once the failed transaction is rolled back). */
static int explain_denied(PGconn *conn, const nh_pg_migrations_t *m, const PGresult *res, int version,
                          nh_error_t *err)
{
  char doing[96], where[512], qu[160], qd[160], qs[160], qo[160];
  migrating(m, version, doing, sizeof doing);
  const char *const table[] = { m->table };
  PGresult *r = PQexecParams(conn,
    "SELECT current_user, current_database(), current_schema(),"
    " current_schema() IS NOT NULL AND has_schema_privilege(current_schema(), 'CREATE'),"
    " (SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = current_database()),"
    " (SELECT tableowner FROM pg_tables WHERE schemaname = current_schema() AND tablename = $1)",
    1, NULL, table, NULL, NULL, 0);
  if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1 || PQgetisnull(r, 0, 2)) {
    PQclear(r);
    return nh_pg_explain_result(conn, res, doing, err);
  }
  const char *user = PQgetvalue(r, 0, 0), *db = PQgetvalue(r, 0, 1), *schema = PQgetvalue(r, 0, 2);
  int can_create = strcmp(PQgetvalue(r, 0, 3), "t") == 0;
  const char *dbowner = PQgetvalue(r, 0, 4), *owner = PQgetisnull(r, 0, 5) ? NULL : PQgetvalue(r, 0, 5);
  const char *primary = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
  if (!primary) primary = "permission denied";
  nh_pg_conn_display(conn, where, sizeof where);
  nh_pg_quote_ident(conn, user, qu, sizeof qu);
  nh_pg_quote_ident(conn, schema, qs, sizeof qs);
  int rc;
  if (!can_create) {
    nh_pg_quote_ident(conn, db, qd, sizeof qd);
    rc = nh_error_set(err, NH_EFAIL,
                      "store %s: role %s may not create tables in schema %s of database %s (SQLSTATE 42501: %s) "
                      "while %s: as the owner of the database (role \"%s\") or a superuser run "
                      "GRANT CREATE ON SCHEMA %s TO %s; or use a role that has that right",
                      where, qu, qs, qd, primary, doing, dbowner, qs, qu);
  } else if (owner && strcmp(owner, user) != 0) {
    nh_pg_quote_ident(conn, owner, qo, sizeof qo);
    rc = nh_error_set(err, NH_EFAIL,
                      "store %s: role %s does not own the %s's tables in schema %s (their owner is %s), which "
                      "migrations read and alter (SQLSTATE 42501: %s) while %s: run this nimbus-host once as role "
                      "%s, or as %s or a superuser run GRANT %s TO %s;",
                      where, qu, m->whose, qs, qo, primary, doing, qo, qo, qo, qu);
  } else {
    rc = nh_pg_explain_result(conn, res, doing, err);
  }
  PQclear(r);
  return rc;
}

/* 42501 is said with the right and the object it is about; anything else as it came. */
static int explain_failed(PGconn *conn, const nh_pg_migrations_t *m, PGresult *failed, int version,
                          nh_error_t *err)
{
  const char *code = PQresultErrorField(failed, PG_DIAG_SQLSTATE);
  rollback(conn);
  char doing[96];
  migrating(m, version, doing, sizeof doing);
  int rc = code && strcmp(code, "42501") == 0 ? explain_denied(conn, m, failed, version, err)
                                               : nh_pg_explain_result(conn, failed, doing, err);
  PQclear(failed);
  return rc;
}

/* The statements that make the version table (exists 0) or give it its row (-1). */
static void init_script(const nh_pg_migrations_t *m, int exists, char *sql, size_t len)
{
  const char *t = m->table;
  if (exists == 0)
    snprintf(sql, len,
             "CREATE TABLE %s (version int NOT NULL);"
             "CREATE UNIQUE INDEX %s_one_row ON %s ((true));"
             "INSERT INTO %s VALUES (0);", t, t, t, t);
  else
    snprintf(sql, len, "INSERT INTO %s VALUES (0);", t);
}

/* One migration (v to v+1) in its own transaction; *v gets the version found, and the
 * caller stops when it is at or past target. */
static int migrate_step(PGconn *conn, const nh_pg_migrations_t *m, int target, int *v, int *first, nh_error_t *err)
{
  const char *const lock[] = { m->lock };
  int exists = 0;
  PGresult *failed = NULL;
  char sql[512];
  if (nh_pg_exec(conn, "BEGIN", 0, NULL, NULL, err)) return NH_EFAIL;
  /* Held to COMMIT: a host starting beside us waits here, then finds our version. */
  if (nh_pg_exec(conn, "SELECT pg_advisory_xact_lock($1::bigint)", 1, lock, NULL, err)) {
    rollback(conn);
    return NH_EFAIL;
  }
  if (read_version(conn, m, v, &exists, &failed)) return explain_failed(conn, m, failed, -1, err);
  if (*first < 0) *first = *v;
  if (*v > m->count) {
    rollback(conn);
    char where[512];
    nh_pg_conn_display(conn, where, sizeof where);
    return nh_error_set(err, NH_EFAIL,
                        "store %s: the %s's schema is version %d, newer than this nimbus-host knows (%d): "
                        "upgrade nimbus-host or use another --store", where, m->whose, *v, m->count);
  }
  if (*v >= target) return nh_pg_exec(conn, "COMMIT", 0, NULL, NULL, err);
  if (exists <= 0) {
    init_script(m, exists, sql, sizeof sql);
    if (exec_script(conn, sql, &failed)) return explain_failed(conn, m, failed, *v + 1, err);
  }
  if (exec_script(conn, m->steps[*v], &failed)) return explain_failed(conn, m, failed, *v + 1, err);
  char next[16];
  snprintf(next, sizeof next, "%d", *v + 1);
  snprintf(sql, sizeof sql, "UPDATE %s SET version = $1::int", m->table);
  const char *const p[] = { next };
  if (nh_pg_exec(conn, sql, 1, p, NULL, err)) {
    rollback(conn);
    return NH_EFAIL;
  }
  if (nh_pg_exec(conn, "COMMIT", 0, NULL, NULL, err)) return NH_EFAIL;
  *v += 1;
  return NH_OK;
}

int nh_pg_migrations_run(PGconn *conn, const nh_pg_migrations_t *m, int target, int *from, int *to,
                         nh_error_t *err)
{
  if (target < 0 || target > m->count)
    return nh_error_set(err, NH_EUSAGE, "schema version %d does not exist: this nimbus-host knows 0 to %d", target,
                        m->count);
  int v = 0, first = -1, rc;
  do rc = migrate_step(conn, m, target, &v, &first, err);
  while (rc == NH_OK && v < target);
  if (from) *from = first < 0 ? 0 : first;
  if (to) *to = v;
  return rc;
}

/* ---------------------------------------------------------------- the store's */

static const nh_pg_migrations_t store_migrations = {
  .lock = NH_PG_MIGRATE_LOCK,
  .table = "nimbus_schema",
  .whose = "store",
  .what = "the schema",
  .steps = nh_pg_migrations,
  .count = NH_PG_SCHEMA_VERSION,
};

int nh_pg_schema_version(PGconn *conn, int *version, nh_error_t *err)
{
  return nh_pg_migrations_version(conn, &store_migrations, version, err);
}

int nh_pg_migrate_to(PGconn *conn, int target, int *from, int *to, nh_error_t *err)
{
  return nh_pg_migrations_run(conn, &store_migrations, target, from, to, err);
}

int nh_pg_migrate(PGconn *conn, int *from, int *to, nh_error_t *err)
{
  return nh_pg_migrate_to(conn, NH_PG_SCHEMA_VERSION, from, to, err);
}
