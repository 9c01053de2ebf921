/* The AMQP 1.0 transport (qpid-proton's connection driver on the host's libuv loop).
 *
 * Events travel over the broker: publishing sends to a topic exchange (routing key =
 * event type), each endpoint consumes its own durable queue bound to its types. The
 * store stays the source of truth: session locks, operator control messages and the
 * outbox of messages to send live in the same sqlite file, so an outcome, the
 * messages it publishes and the settlement of the message that caused it are decided
 * in one local transaction; the broker is told after it commits. */
#ifndef NH_AMQP_H
#define NH_AMQP_H

#include <uv.h>

#include "nh_transport.h"
#include "store/nh_store.h"

typedef enum {
  NH_AMQP_READY,   /* connected, topology declared, every receiver attached (first time only) */
  NH_AMQP_FATAL,   /* a configuration error retrying cannot fix (credentials, vhost, TLS) */
} nh_amqp_status_t;

typedef void (*nh_amqp_status_cb)(void *data, nh_amqp_status_t status, const char *msg);

/* 1 if `s` names an AMQP transport (amqp:// or amqps://). */
int nh_amqp_is_url(const char *s);

/* Parses the URL and prepares the transport; nothing connects before nh_amqp_start.
 * amqp[s]://user:password@host[:port][/vhost][?management=URL&ca=FILE&verify=0&idle=S&exchange=NAME] */
nh_transport_t *nh_amqp_init(uv_loop_t *loop, nh_store_t *store, const char *url, const char *owner,
                            nh_amqp_status_cb cb, void *cb_data, nh_error_t *err);
/* Connects (and reconnects with backoff until stopped). Call after subscribing. */
/* The same transport beside a PostgreSQL store (docs/store-backends.md): its outbox and
 * delivery counts in the store's database, written with the pump's transaction; control
 * messages and session locks in the store's queue (the embedded transport on PostgreSQL).
 * conn (a blocking connection, the store migrated) is taken over whatever happens; link
 * must outlive the transport. */
struct nh_pg_link;
struct pg_conn;
nh_transport_t *nh_amqp_init_pg(uv_loop_t *loop, struct nh_pg_link *link, struct pg_conn *conn, const char *url,
                               const char *owner, nh_amqp_status_cb cb, void *cb_data, nh_error_t *err);
/* A command's publish beside a PostgreSQL store: the message, encoded and addressed as
 * the transport sends it, added to db's open batch (the caller's: a MessageId's claim in
 * the same transaction), its row this transport's to send once the caller committed and
 * started it; nh_amqp_unconfirmed counts it until it was sent, accepted and deleted. */
struct nh_pg_db;
int nh_amqp_pg_outbox_batch(nh_transport_t *t, struct nh_pg_db *db, const nh_msg_t *m, const char *to,
                            nh_error_t *err);
void nh_amqp_start(nh_transport_t *t);
/* Closes the connection cleanly (after the last disposition is written) and every
 * handle; `done` runs when the transport no longer holds the loop. */
void nh_amqp_stop(nh_transport_t *t, void (*done)(void *), void *data);
/* Drops this process's unsent outbox rows (a publish that failed for good). */
int nh_amqp_outbox_discard(nh_transport_t *t);
/* Messages in the store's outbox not yet accepted by the broker. */
int nh_amqp_unconfirmed(nh_transport_t *t);
/* Asks the broker whether the exchange routes `event_type` to any queue (to == NULL):
 * done(data, 1|0, NULL); or endpoint `to`'s partition count there (1: its queue, P: its
 * queues `to.p<i>`, 0: none); or done(data, -1, why). */
int nh_amqp_probe(nh_transport_t *t, const char *event_type, const char *to, void (*done)(void *, int, const char *),
                  void *data, nh_error_t *err);
/* Sends to endpoint `endpoint` (which this process does not consume) go to the queue of
 * the session's partition among n (what nh_amqp_probe found); no receiver, no declaring. */
void nh_amqp_target_partitions(nh_transport_t *t, const char *endpoint, int n);
/* nimbus-host partitions (nh_amqp_migrate.c, docs/broker-partitions.md): gives endpoint
 * `endpoint` on the RabbitMQ at `url` `partitions` queues, moving every message of its
 * old ones in order, refused while a host consumes them; runs `loop` until done, or until
 * `stall_s` seconds pass with nothing moved. NH_OK with what was done in `said`; NH_EUSAGE
 * (a URL or profile that cannot) or NH_EFAIL with err saying why and what to do. Running
 * it again finishes an interrupted run. */
int nh_amqp_partitions_migrate(uv_loop_t *loop, const char *url, const char *endpoint, int partitions, int stall_s,
                               char *said, size_t len, nh_error_t *err);

#endif
