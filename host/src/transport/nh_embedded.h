/* The embedded transport: topic-style queues in the store's sqlite file. */
#ifndef NH_EMBEDDED_H
#define NH_EMBEDDED_H

#include <sqlite3.h>

#include "nh_transport.h"

/* `db` is shared with the store so settlement joins the store transaction; `owner`
 * names this process in session locks. */
nh_transport_t *nh_embedded_new(sqlite3 *db, const char *owner, nh_error_t *err);

#endif
