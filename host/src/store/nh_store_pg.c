/* `--store postgresql://...` (or $NIMBUS_STORE) (docs/store-backends.md). The database is
 * reached and its schema brought to this version, so that every connection, rights and
 * version problem is reported with what to do. A host runs on it (nh_cli_run.c), and
 * `publish` writes to it; the other commands refuse it, saying so, until they can. */
#include "nh_pg.h"
#include "nh_store.h"

#include <stdio.h>
#include <stdlib.h>

int nh_store_pg_connect(const char *url, int flags, PGconn **out, int *from, int *to, nh_error_t *err)
{
  *out = NULL;
  if (nh_pg_url_check(url, err)) return err->code;
  PGconn *conn = NULL;
  if (nh_pg_connect(url, &conn, err)) return err->code;
  int rc;
  if (flags & NH_STORE_READONLY) {
    rc = nh_pg_schema_version(conn, from, err);
    *to = *from;
  } else {
    rc = nh_pg_migrate(conn, from, to, err);
  }
  if (rc == NH_OK && *to == 0) {   /* a reader on an empty database: nothing to read, nothing made */
    char *shown = nh_pg_url_display(url);
    rc = nh_error_set(err, NH_EUSAGE, "store %s: PostgreSQL answers, but the database holds no nimbus-host store yet",
                      shown);
    free(shown);
  }
  if (rc) {
    PQfinish(conn);
    return err->code;
  }
  *out = conn;
  return NH_OK;
}

int nh_store_open_pg(const char *url, int flags, nh_error_t *err)
{
  PGconn *conn = NULL;
  int from = 0, to = 0;
  if (nh_store_pg_connect(url, flags, &conn, &from, &to, err)) return err->code;
  PQfinish(conn);
  char *shown = nh_pg_url_display(url);
  char was[48] = "";
  if (from != to) snprintf(was, sizeof was, ", migrated from version %d", from);
  nh_error_set(err, NH_EUSAGE,
                 "store %s: PostgreSQL answers and the store's schema is at version %d%s; but this command runs "
                 "on a sqlite store only for now (hosts with or without a broker, `publish`, `events`, `sessions`, `failures`, `show`, `resubmit`, "
                 "`skip` (one event or --all), `handoff` and `purge` run on PostgreSQL; the rest is being built: "
                 "docs/store-backends.md). Pass --store PATH, a sqlite file, for it",
                 shown, to, was);
  free(shown);
  return NH_EUSAGE;
}
