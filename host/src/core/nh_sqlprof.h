/* Developer aid: NIMBUS_SQL_PROFILE=FILE makes every store connection of the process
 * count its statements (runs and time inside sqlite3_step), and append a table of them,
 * most expensive first, to FILE when the process exits. Used to find where an event's
 * cost goes (docs/architecture.md, "Cost at outage scale"); off, it costs one getenv. */
#ifndef NH_SQLPROF_H
#define NH_SQLPROF_H

#include <sqlite3.h>

void nh_sqlprof_attach(sqlite3 *db);

#endif
