/* AMQP transport internals shared by its files. */
#ifndef NH_AMQP_INT_H
#define NH_AMQP_INT_H

#include <proton/connection_driver.h>
#include <proton/message.h>
#include <stdint.h>
#include <uv.h>

#include "core/nh_error.h"
#include "core/nh_msg.h"
#include "net/nh_http_client.h"

/* ---------------------------------------------------------------- URL (nh_amqp_url.c) */

typedef struct nh_amqp_url {
  int tls;
  char *user, *password, *host, *vhost;   /* vhost NULL: the broker's default */
  int port;
  char *management;                       /* RabbitMQ management API base, no trailing / */
  int no_management;                      /* management=none: queues and bindings exist already */
  int servicebus;                         /* the Azure Service Bus profile (CBS, $management) */
  int trusted_control;                    /* control=trusted: obey operator requests from the broker */
  char *ca;                               /* TLS: trusted CA file (default: the system's) */
  int verify;                             /* TLS: verify the peer's name and chain */
  int idle_ms;                            /* AMQP idle time-out we announce */
  char *exchange;                         /* the topic exchange events are published to */
  char *display;                          /* the URL without the password */
} nh_amqp_url_t;

int nh_amqp_url_parse(const char *s, nh_amqp_url_t *u, nh_error_t *err);
void nh_amqp_url_clear(nh_amqp_url_t *u);

/* ---------------------------------------------------------------- connection (nh_amqp_conn.c) */

typedef struct nh_amqp_conn nh_amqp_conn_t;

typedef struct nh_amqp_conn_cbs {
  void (*on_up)(void *data, pn_connection_t *c);     /* remote open: begin sessions, attach links */
  void (*on_event)(void *data, pn_event_t *e);       /* every other event */
  /* The connection is gone (before any reconnect). fatal: no reconnect will follow. */
  void (*on_down)(void *data, const char *why, int fatal);
} nh_amqp_conn_cbs_t;

nh_amqp_conn_t *nh_amqp_conn_init(uv_loop_t *loop, const nh_amqp_url_t *url, const char *container,
                                 const nh_amqp_conn_cbs_t *cbs, void *data);
void nh_amqp_conn_start(nh_amqp_conn_t *c);
/* Runs proton's events and writes what it produced; call after changing link state. */
void nh_amqp_conn_flush(nh_amqp_conn_t *c);
/* Closes cleanly and for good (no reconnect); `done` runs once the handles are closed,
 * after which the caller frees with nh_amqp_conn_free. */
void nh_amqp_conn_close(nh_amqp_conn_t *c, void (*done)(void *), void *data);
void nh_amqp_conn_free(nh_amqp_conn_t *c);
pn_connection_t *nh_amqp_conn_pn(nh_amqp_conn_t *c);   /* NULL while not open */

/* ---------------------------------------------------------------- messages (nh_amqp_msg.c) */

/* nh_msg_t -> AMQP message: the NimBus wire properties as application properties,
 * SessionId as group-id, the JSON payload as one data section, durable. */
/* to: a direct send (its queue). flags: NH_AMQP_ENC_SERVICEBUS (the Service Bus profile:
 * Diagnostic-Id), NH_AMQP_ENC_BUCKETS (a send through the exchange has the routing key
 * nh_amqp_routing_key as subject; without it, and on a direct send, the subject is the type:
 * Service Bus filters on it, and a topology made by hand, management=none, binds it). */
enum { NH_AMQP_ENC_SERVICEBUS = 1, NH_AMQP_ENC_BUCKETS = 2 };
void nh_amqp_msg_encode(pn_message_t *pm, const nh_msg_t *m, const char *to, int flags);

/* Partitions on RabbitMQ (docs/broker-partitions.md): a session's bucket is the low
 * NH_AMQP_BUCKET_BITS bits of a stable hash of its id; the routing key is the event type
 * followed by the bucket's bits as words, most significant first ("Ev.0.1.1.0.0.1.0.1"),
 * so partition i of 2^k binds "Ev", 8-k words "*" and the k low bits of i ("Ev.*.*.*.*.*.1.0.1"
 * for i = 5 of 8), and one queue binds "Ev.*.*.*.*.*.*.*.*" and "Ev". */
#define NH_AMQP_BUCKET_BITS 8
#define NH_AMQP_BUCKETS (1u << NH_AMQP_BUCKET_BITS)
unsigned nh_amqp_session_bucket(const char *session);
/* The low nbits of bucket as words ".b.b.b", most significant first, into out (2 * nbits + 1). */
void nh_amqp_bucket_words(unsigned bucket, int nbits, char *out);
void nh_amqp_routing_key(const char *type, const char *session, char *out, size_t len);
/* AMQP message -> nh_msg_t (owned strings). A message the host cannot take is returned
 * with type NH_MT_UNKNOWN and error_text saying why (it is then dead-lettered). */
void nh_amqp_msg_decode(pn_message_t *pm, const char *endpoint, nh_msg_t *m);
/* Bytes of one transfer into pm: NH_OK, or NH_EFAIL for what is not an AMQP message. */
int nh_amqp_msg_decode_bytes(pn_message_t *pm, const char *bytes, size_t len);
/* Reads a complete incoming delivery (advancing its link) and decodes it into pm,
 * growing *buf as needed. 0 when decoded, < 0 when the bytes are not a message. */
int nh_amqp_msg_read(pn_delivery_t *d, pn_message_t *pm, char **buf, size_t *cap);
/* Reads a complete incoming delivery's bytes into *buf (grown as needed), advancing its
 * link: their length, or < 0. */
ssize_t nh_amqp_dlv_bytes(pn_delivery_t *d, char **buf, size_t *cap);
/* The message-id (when a string) and group-id of an encoded message, read from its
 * properties section without decoding the rest: NH_OK ("" for what it lacks), or NH_EFAIL
 * for bytes that are not sections. */
int nh_amqp_msg_peek(const char *bytes, size_t len, char *message_id, size_t idlen, char *group_id, size_t glen);
/* The EventId an endpoint gives a message whose publisher set none: name-based on the
 * endpoint and MessageId (and time-ordered by the message's creation time when it has
 * one), so a redelivered copy gets the same. */
void nh_amqp_event_id(const char *endpoint, const char *message_id, int64_t created_ms, char out[37]);

/* ---------------------------------------------------------------- RabbitMQ topology (nh_amqp_rmq.c) */

typedef struct nh_rmq_decl nh_rmq_decl_t;
/* Declares the exchange, the endpoint's queue (partitions 1: `name`; else `name.p0` ..
 * `name.p<partitions-1>`, each single-active-consumer) and its bindings (per event type
 * `type.*.*.*.*.*.*.*.*` and `type`, or for partition i of 2^k `type`, 8-k `.*` words and the
 * k bits of i) through the management API, in
 * order, asynchronously; first it refuses queues of another partition count that still
 * exist. done(data, NULL) on success; done(data, why) on a failure retrying cannot fix
 * (credentials, vhost, an inequivalent queue, another partition count): transient ones
 * (broker unreachable, 5xx) are retried inside with backoff. */
/* flags: NH_RMQ_REPLY (the process's reply queue: not durable, expires), NH_RMQ_MIGRATING
 * (nimbus-host partitions: queues of another count and the migration's marker may exist). */
enum { NH_RMQ_REPLY = 1, NH_RMQ_MIGRATING = 2 };
nh_rmq_decl_t *nh_rmq_declare(uv_loop_t *loop, const nh_amqp_url_t *url, const char *name, int flags,
                              int partitions, const char *const *types, int ntypes,
                              void (*done)(void *, const char *), void *data);
/* The routing key partition i of `partitions` binds for `type` ("Ev.*.*.*.*.*.*.1.0" for
 * 2 of 4; "Ev.*.*.*.*.*.*.*.*" for one queue, which binds the bare type too). */
void nh_rmq_binding_key(const char *type, int partitions, int i, char *out, size_t len);
/* The length of the event type in a routing key that ends in the bucket's words (`*`, 0
 * or 1, NH_AMQP_BUCKET_BITS of them), or 0 when it does not. */
size_t nh_rmq_binding_type(const char *rk);
/* Is q a queue of endpoint `name`: 0 no, 1 the queue `name`, 2 partition `name.p<index>`. */
int nh_rmq_queue_of(const char *name, const char *q, int *index);
/* The queue that marks a partitions migration of `name` under way (nimbus-host partitions):
 * hosts refuse to start while it exists; 1 and from, to when q is one. */
void nh_rmq_migration_marker(const char *name, int from, int to, char *out, size_t len);
int nh_rmq_migration_of(const char *name, const char *q, int *from, int *to);
/* One management API call: <management>/api<path> (path escaped by the caller, nh_rmq_esc:
 * a string to free), with the URL's credentials. */
nh_http_call_t *nh_rmq_call(uv_loop_t *loop, const nh_amqp_url_t *url, const char *method, const char *path,
                            const char *body, nh_http_done_cb done, void *data, nh_error_t *err);
char *nh_rmq_esc(const char *s);
/* Says why in `why` and returns 1 for the answers no retry fixes the same way everywhere
 * (401/403: the user is refused; 0: the management API is not reachable), else 0. */
int nh_rmq_why(const nh_amqp_url_t *url, const nh_http_res_t *res, char *why, size_t len);
/* The queue of partition i of an endpoint with `partitions` (the endpoint's name when 1). */
void nh_rmq_partition_queue(const char *endpoint, int partitions, int i, char *out, size_t len);
void nh_rmq_cancel(nh_rmq_decl_t *decl);
/* Does anything consume `routing_key` on the exchange (a binding with that key or #):
 * done(data, 1|0, NULL)? With `queue` (an endpoint), its partition count on the broker:
 * 1 for the queue `queue`, P for `queue.p0` .. `queue.p<P-1>`, 0 for none. Else (data, -1, why). */
typedef struct nh_rmq_probe nh_rmq_probe_t;
nh_rmq_probe_t *nh_rmq_probe(uv_loop_t *loop, const nh_amqp_url_t *url, const char *routing_key, const char *queue,
                             void (*done)(void *, int, const char *), void *data, nh_error_t *err);
void nh_rmq_probe_cancel(nh_rmq_probe_t *p);   /* done is not called */

/* The vhost's consumers (GET /api/consumers/<vhost>: queue.name, active,
 * channel_details.connection_name): done(data, array, NULL), or (data, NULL, why). */
typedef struct nh_rmq_consumers nh_rmq_consumers_t;
struct json_t;
nh_rmq_consumers_t *nh_rmq_consumers(uv_loop_t *loop, const nh_amqp_url_t *url,
                                     void (*done)(void *, struct json_t *, const char *), void *data);
void nh_rmq_consumers_cancel(nh_rmq_consumers_t *c);   /* done is not called */
/* How many rows of such a list consume `queue`. */
int nh_rmq_consumers_on(struct json_t *consumers, const char *queue);

/* Spreading partitions over live hosts (nh_amqp_spread.c). One endpoint's partitions as
 * the broker shows them: owner[i] the host active on partition i (0: this host, -1: none,
 * -2: more than one, else another), waiting[i] how many other hosts' consumers wait on it, load[i] what this
 * host has of it buffered or in handlers. Puts in out (nparts room) the partitions this
 * host should hand on and returns how many: none unless every partition shows one active
 * consumer; while this host is active on more than its share (nparts / hosts, rounded
 * up), as many as it has beyond that; while it has more than the share rounded down and
 * another host less, one. Only partitions with another host in line, the least loaded
 * first. */
int nh_amqp_spread_pick(int nparts, int nhosts, const int *owner, const int *waiting, const int *load, int *out);

/* ---------------------------------------------------------------- moving messages (nh_amqp_move.c) */

/* Moves every message of the queues `sources` to endpoint's queues under `partitions` (its
 * session's partition, p0 without a group-id), over one connection of its own: a message
 * already in its new queue stays in place; any other is copied, the bytes as received, and
 * accepted on its old queue once the broker accepted the copy. done(data, NULL) once every
 * source was read to its end and the connection closed, else done(data, why) (nothing
 * lost: run again), also after stall_s seconds with nothing read or confirmed. Free with
 * nh_amqp_move_free after done. */
typedef struct nh_amqp_move nh_amqp_move_t;
nh_amqp_move_t *nh_amqp_move(uv_loop_t *loop, const nh_amqp_url_t *url, const char *endpoint, int partitions,
                             const char *const *sources, int nsources, int stall_s,
                             void (*done)(void *, const char *), void *data);
/* Messages copied to another queue, and those that stayed in theirs. */
void nh_amqp_move_counts(const nh_amqp_move_t *m, long *moved, long *stayed);
void nh_amqp_move_free(nh_amqp_move_t *m);

/* ---------------------------------------------------------------- Azure Service Bus (nh_amqp_sb.c) */

#define NH_SB_TOKEN_TTL_S 3600   /* SAS tokens are put again well before this */

typedef struct nh_sb nh_sb_t;
nh_sb_t *nh_sb_new(const nh_amqp_url_t *url);
void nh_sb_free(nh_sb_t *sb);
void nh_sb_up(nh_sb_t *sb, pn_session_t *ssn);   /* a new connection: start over */
void nh_sb_down(nh_sb_t *sb);                    /* unanswered requests are called with status -1 */
/* put-token for sb://<host>/<entity>; done(data, status-code, status-description). */
void nh_sb_put_token(nh_sb_t *sb, const char *entity, void (*done)(void *, int, const char *), void *data);
/* com.microsoft:renew-lock of one peek-locked delivery of `entity`; done(data, statusCode, why). */
void nh_sb_renew_lock(nh_sb_t *sb, const char *entity, pn_delivery_t *dlv, void (*done)(void *, int, const char *),
                      void *data);
/* com.microsoft:renew-session-lock of `session` held by receiver `link` on `entity`;
 * done(data, statusCode, why), inside which nh_sb_answer_expiration says until when (ms,
 * 0 when the answer has none). */
void nh_sb_renew_session(nh_sb_t *sb, const char *entity, const char *session, const char *link,
                         void (*done)(void *, int, const char *), void *data);
int64_t nh_sb_answer_expiration(nh_sb_t *sb);
/* Leaves d on the value of `key` (a symbol or string key) in the map d holds and returns
 * 1, or 0 when there is none. */
int nh_amqp_map_find(pn_data_t *d, const char *key);
/* 1 if the event belongs to one of its links (handled). */
int nh_sb_event(nh_sb_t *sb, pn_event_t *e);
int nh_sb_sas_token(const char *audience, const char *key_name, const char *key, int64_t expiry, char *out,
                    size_t outlen);

#endif
