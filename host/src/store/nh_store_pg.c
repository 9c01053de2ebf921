/* `--store postgresql://...` (or $NIMBUS_STORE): stage 1 of the PostgreSQL store
 * (docs/store-backends.md). The database is reached and its schema brought to this
 * version, so that every connection, rights and version problem is reported now with what
 * to do, as it will be once hosts run on it; running on it is refused, saying so, until
 * the state machine can (stages 2 and 3). */
#include "nh_pg.h"
#include "nh_store.h"

#include <stdio.h>
#include <stdlib.h>

int nh_store_open_pg(const char *url, int flags, nh_error_t *err)
{
  if (nh_pg_url_check(url, err)) return err->code;
  PGconn *conn = NULL;
  if (nh_pg_connect(url, &conn, err)) return err->code;
  int from = 0, to = 0, rc;
  if (flags & NH_STORE_READONLY) {
    rc = nh_pg_schema_version(conn, &from, err);
    to = from;
  } else {
    rc = nh_pg_migrate(conn, &from, &to, err);
  }
  PQfinish(conn);
  if (rc) return err->code;
  char *shown = nh_pg_url_display(url);
  char was[48] = "";
  if (from != to) snprintf(was, sizeof was, ", migrated from version %d", from);
  if (to == 0)
    nh_error_set(err, NH_EUSAGE, "store %s: PostgreSQL answers, but the database holds no nimbus-host store yet",
                 shown);
  else
    nh_error_set(err, NH_EUSAGE,
                 "store %s: PostgreSQL answers and the store's schema is at version %d%s; but this nimbus-host runs "
                 "adapters and operator commands on a sqlite store only (the PostgreSQL store is being built: "
                 "docs/store-backends.md). Pass --store PATH, a sqlite file, for now",
                 shown, to, was);
  free(shown);
  return NH_EUSAGE;
}
