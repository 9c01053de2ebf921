/* The PostgreSQL store's connection on the host's loop: one long-lived connection that
 * never blocks the loop, runs batches (nh_pg_ops.h) one at a time, reconnects after a
 * loss, and delivers NOTIFY payloads (docs/store-backends.md, stage 3).
 *
 *   nh_pg_link_open(loop, url, &opts, &link, &err);      connects in the background
 *   nh_pg_link_submit(link, build, done, data, &err);    build adds the batch's operations
 *   ...                                                  done says COMMITTED, NOT_COMMITTED or UNKNOWN
 *   nh_pg_link_close(link, closed, data);                closed runs once every handle is
 *
 * The schema is not migrated here: nh_pg_migrate runs once, blocking, before the loop
 * starts (the CLI does it for every command). A migration waits on its advisory lock
 * behind another host's and runs DDL of unbounded length; the host can serve nothing
 * before the schema is current anyway, and the migrations' explanations (the GRANT a role
 * lacks) stay in one place. What the link does on each new connection, without blocking,
 * is read the schema version: a store of another version than this host's (a newer host
 * migrated it during a rolling upgrade, an older backup was restored) stops the link
 * (NH_PG_LINK_FAILED), since retrying cannot mend it.
 *
 * No callback runs inside a call of this API: each runs from the loop. */
#ifndef NH_PG_LINK_H
#define NH_PG_LINK_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "core/nh_error.h"
#include "nh_pg_ops.h"

typedef struct nh_pg_link nh_pg_link_t;

typedef enum nh_pg_link_state {
  NH_PG_LINK_CONNECTING,   /* the first connection is being made (the state open leaves it in) */
  NH_PG_LINK_READY,        /* connected, schema version checked, channels listened to: batches run */
  NH_PG_LINK_LOST,         /* no connection: retrying with backoff; batches wait */
  NH_PG_LINK_FAILED,       /* given up (the store's schema is not this host's version): only close is left */
  NH_PG_LINK_CLOSED,       /* closed: the last call of on_state, just before close's callback */
} nh_pg_link_state_t;

/* A change of state. err says why for LOST (the error that took the connection, or that
 * the first attempt failed with) and FAILED; NULL otherwise. LOST is said once per outage,
 * not once per failed attempt (nh_pg_link_error has the latest). */
typedef void (*nh_pg_link_state_cb)(void *data, nh_pg_link_state_t state, const nh_error_t *err);

typedef struct nh_pg_link_opts {
  int batch_timeout_ms;   /* a batch (or a new connection's first query) unanswered this long drops the
                             connection, and the server's timeouts follow from it (below);
                             0: NH_PG_LINK_BATCH_TIMEOUT_MS */
  int backoff_first_ms;   /* the delay before the first retry; 0: 100 */
  int backoff_max_ms;     /* what it doubles up to; 0: 5000. Each delay is jittered down to half */
  int max_waiting;        /* batches that may wait for the connection (or for the one in flight); 0: 64 */
  nh_pg_link_state_cb on_state;   /* may be NULL */
  void *data;
} nh_pg_link_opts_t;

#define NH_PG_LINK_BATCH_TIMEOUT_MS 30000
#define NH_PG_LINK_BACKOFF_FIRST_MS 100
#define NH_PG_LINK_BACKOFF_MAX_MS 5000
#define NH_PG_LINK_MAX_WAITING 64

/* Checks the URL and the options at once (NH_EUSAGE, said), then connects on `loop`
 * (opts may be NULL: every default). *out is valid until close's callback has run. */
int nh_pg_link_open(uv_loop_t *loop, const char *url, const nh_pg_link_opts_t *opts, nh_pg_link_t **out,
                    nh_error_t *err);

nh_pg_link_state_t nh_pg_link_state(const nh_pg_link_t *link);
/* Why the link is LOST (the latest failed attempt) or FAILED; code 0 when READY. */
const nh_error_t *nh_pg_link_error(const nh_pg_link_t *link);

/* ---------------------------------------------------------------- batches */

/* Adds the batch's operations with nh_pg_batch_add on db (BEGIN is sent: add nothing
 * else, commit nothing). NH_OK commits the batch; anything else abandons it, and done gets
 * NOT_COMMITTED with this error. The connection may differ from one batch to the next. */
typedef int (*nh_pg_link_build_cb)(void *data, nh_pg_db_t *db, nh_error_t *err);
/* The batch is over. COMMITTED (err NULL): every result callback its builder gave has run.
 * NOT_COMMITTED: nothing of it happened (a statement failed, the builder gave up, the
 * connection went before COMMIT was sent, the link closed first). UNKNOWN: the connection
 * went, or the batch's deadline passed, after COMMIT was sent and before its result: treat
 * the work as not settled and let redelivery sort it out. err says what happened. */
typedef void (*nh_pg_link_done_cb)(void *data, nh_pg_batch_outcome_t outcome, const nh_error_t *err);

/* Queues a batch: built and sent once the connection is ready and the batch before it is
 * over (never two at once), its results read as they come. NH_ESTATE (said, done never
 * called) when max_waiting batches already wait, or the link is FAILED or closing. */
int nh_pg_link_submit(nh_pg_link_t *link, nh_pg_link_build_cb build, nh_pg_link_done_cb done, void *data,
                      nh_error_t *err);

/* ---------------------------------------------------------------- notifications */

/* A NOTIFY on a channel listened to: its payload ("" when none). */
typedef void (*nh_pg_link_notify_cb)(void *data, const char *channel, const char *payload);

/* LISTEN on `channel` (a name of 1 to 63 bytes, taken as it is: case kept), now and on
 * every connection after this one. A NOTIFY sent while the link had no connection is not
 * seen: a listener that must not miss work looks for it again when the link is READY.
 * NH_EUSAGE for a bad or already listened name, NH_ESTATE once FAILED or closing. */
int nh_pg_link_listen(nh_pg_link_t *link, const char *channel, nh_pg_link_notify_cb cb, void *data,
                      nh_error_t *err);

/* ---------------------------------------------------------------- closing */

typedef void (*nh_pg_link_close_cb)(void *data);
/* Drops the connection and closes every handle of the link. From the loop, in this order:
 * the batch in flight gets done (NOT_COMMITTED, or UNKNOWN once its COMMIT was sent), the
 * waiting ones NOT_COMMITTED, on_state CLOSED, then cb (may be NULL); the link is freed
 * after it. Once only. */
void nh_pg_link_close(nh_pg_link_t *link, nh_pg_link_close_cb cb, void *data);

/* ---------------------------------------------------------------- what each connection carries */

/* The link drops a connection whose batch is unanswered at its deadline, but the server
 * notices a dropped client only when it next reads from or writes to the socket: a
 * backend waiting for a lock, or left in the transaction of a pipeline half received,
 * would hold its locks for as long. So each connection of the link asks the server to
 * bound both, in libpq's options (-c, sent with the startup packet: no round trip, in
 * force before the first query):
 *
 *   statement_timeout                    batch_timeout_ms + NH_PG_LINK_STATEMENT_MARGIN_MS
 *   idle_in_transaction_session_timeout  batch_timeout_ms + NH_PG_LINK_IDLE_MARGIN_MS
 *
 * Both lie beyond the link's own deadline, so neither ends a batch the link still waits
 * for (a batch's statements all run within its deadline, and a pipeline is sent whole,
 * so its transaction is never idle for long). And TCP keepalives: the first probe after
 * NH_PG_LINK_KEEPALIVE_IDLE_S of silence, one every NH_PG_LINK_KEEPALIVE_INTERVAL_S,
 * NH_PG_LINK_KEEPALIVE_COUNT unanswered drop the connection; with tcp_user_timeout (where
 * libpq knows it) data left unacknowledged as long does too. A server that vanished (a
 * lost machine, a cut network) is noticed in 25 s, idle or mid-batch, not after TCP's
 * minutes (hours, idle).
 *
 * The URL's settings win: a keyword the URL sets keeps the URL's value, and the URL's
 * options (PGOPTIONS' when it has none) are sent after the link's, so a statement_timeout
 * of its own is the one the server keeps (it applies -c settings in order). The URL is
 * the operator's word for this store (a stricter ceiling a DBA requires, a longer one for
 * a slow disk, 0 while investigating) where the link's values are only a backstop derived
 * from its deadline. A value below batch_timeout_ms has the server cancel slow batches
 * (reported NOT_COMMITTED, SQLSTATE 57014); 0 or a larger one loosens the bound.
 * (A service file's options or keepalives are not merged: the link's replace them.) */
#define NH_PG_LINK_STATEMENT_MARGIN_MS 1000
#define NH_PG_LINK_IDLE_MARGIN_MS 3000
#define NH_PG_LINK_KEEPALIVE_IDLE_S 10
#define NH_PG_LINK_KEEPALIVE_INTERVAL_S 5
#define NH_PG_LINK_KEEPALIVE_COUNT 3

/* Those settings for batch_timeout_ms (0: the default), as a libpq connection string
 * ("keepalives=1 ... options='-c statement_timeout=...'") in buf; returns buf. */
const char *nh_pg_link_conninfo(int batch_timeout_ms, char *buf, size_t len);

/* ---------------------------------------------------------------- figures */

typedef struct nh_pg_link_stats {
  int64_t attempts;   /* connections started */
  int64_t connects;   /* ... that became READY */
  int64_t losses;     /* outages (each said by one LOST) */
  int64_t batches;    /* batches over, whatever their outcome */
  int64_t notifies;   /* payloads delivered */
} nh_pg_link_stats_t;
void nh_pg_link_stats(const nh_pg_link_t *link, nh_pg_link_stats_t *out);

#endif
