/* The embedded transport: topic-style queues in the store's sqlite file. */
#ifndef NH_EMBEDDED_H
#define NH_EMBEDDED_H

#include <sqlite3.h>

#include "nh_transport.h"

/* `db` is shared with the store so settlement joins the store transaction; `owner`
 * names this process in session locks. */
nh_transport_t *nh_embedded_init(sqlite3 *db, const char *owner, nh_error_t *err);

/* The same transport on a PostgreSQL store (nh_embedded_pg.c): its statements go through
 * the pump's unit of work (the dispatcher attaches it) or, outside a pump, in batches of
 * their own on `link`; `conn`, a blocking connection it takes (closed on failure too),
 * migrates the queue's tables now and writes subscriptions (at start and on reload). */
struct nh_pg_link;
struct pg_conn;
nh_transport_t *nh_embedded_pg_init(struct nh_pg_link *link, struct pg_conn *conn, const char *owner, nh_error_t *err);

/* NH_EUSAGE, said: `type` is a command another endpoint (`other`) consumes already. */
int nh_embedded_conflict(nh_error_t *err, const char *type, const char *other);

/* Called for each copy a send queues: the endpoint and the EventId it got. */
typedef void (*nh_embedded_sent_cb)(void *data, const char *endpoint, const char *event_id);
void nh_embedded_on_sent(nh_transport_t *t, nh_embedded_sent_cb cb, void *data);
/* 1 if `endpoint` has subscribed in this store, 0 if not (known gets the ones that have:
 * "A, B"), NH_EFAIL. */
int nh_embedded_endpoint_known(sqlite3 *db, const char *endpoint, char *known, size_t len);

/* Work not finished yet, for `events --status queued|running` (nh_queued_row_t,
 * core/nh_msg.h): endpoint may be NULL (all). want_running: 1 running only, 0 queued only. Stops when cb
 * returns non-zero or after `limit` rows (0: no limit). Returns the count or NH_EFAIL. */
int nh_embedded_list(sqlite3 *db, const char *endpoint, const char *session, int want_running, int64_t now, int limit,
                     int (*cb)(void *data, const nh_queued_row_t *r), void *data);

#endif
