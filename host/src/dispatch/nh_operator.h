/* Operator actions and hand-off settlements (CLI, Lua status checkers, scripts): each
 * is checked against the event's audit row, then sent as a control message through the
 * event's own session queue, so the host owning the endpoint applies it in order with
 * the session's other work. At most one request per event waits at a time. */
#ifndef NH_OPERATOR_H
#define NH_OPERATOR_H

#include "core/nh_error.h"
#include "store/nh_store.h"
#include "transport/nh_transport.h"

typedef enum { NH_OP_RESUBMIT, NH_OP_SKIP, NH_OP_HANDOFF_COMPLETE, NH_OP_HANDOFF_FAIL } nh_op_kind_t;

typedef struct nh_op_req {
  nh_op_kind_t kind;
  const char *event_id;        /* full id, or a unique prefix of 8+ characters */
  const char *endpoint;        /* optional: must match when given */
  const char *session_id;      /* optional: must match when given (hand-off coordinates) */
  const char *message_id;      /* optional: must match when given */
  const char *body;            /* resubmit: new body; handoff complete: result JSON */
  const char *error_text;      /* handoff fail */
  const char *error_type;
  const char *actor;           /* "cli", "checker NAME", "admin API": in the event's history */
  const char *who;             /* the operator log's actor (an API token's name); NULL: the OS user */
  const char *reason;          /* why (skip, a failed hand-off): kept in the history and the log */
  int no_oplog;                /* a bulk run logs itself once instead of once per event */
  int force;                   /* resubmit a Completed or Skipped event (runs its handler again) */
} nh_op_req_t;

/* Validates and queues the request in its own store transaction. NH_ENOTFOUND: unknown
 * event; NH_EUSAGE: an ambiguous id prefix or a coordinate that does not match; NH_ESTATE: the event is in the wrong state or already has a request waiting
 * (err says which); NH_EFAIL: store failure. On success `ev` (optional) receives the
 * event's audit row. */
int nh_operator_submit(nh_store_t *s, nh_transport_t *t, const nh_op_req_t *req, nh_audit_t *ev, nh_error_t *err);
/* The same check and queueing for an event already read (`ev`), inside the caller's
 * open store transaction: bulk runs queue a batch per transaction. */
int nh_operator_queue(nh_store_t *s, nh_transport_t *t, const nh_op_req_t *req, const nh_audit_t *ev,
                      nh_error_t *err);
/* The same for a command on a PostgreSQL store (blocking: the CLI's), through db. */
struct nh_pg_db;
int nh_operator_submit_pg(struct nh_pg_db *db, const nh_op_req_t *req, nh_audit_t *ev, nh_error_t *err);
/* nh_operator_queue's checks and writes on PostgreSQL for an event already read, in a
 * transaction of its own (a bulk run's, one event at a time). */
int nh_operator_queue_pg(struct nh_pg_db *db, const nh_op_req_t *req, const nh_audit_t *ev, nh_error_t *err);
/* The same on a host's loop, through its PostgreSQL link (store/nh_pg_link.h): the read,
 * the checks and the write as three batches, none waited for. done runs once, from the
 * loop (ev: the event's row on success, NULL otherwise; err: NULL on success). NH_OK, or
 * an error now (said in err, done not called) when the link takes no more batches. A full
 * event id only (no prefix). */
struct nh_pg_link;
typedef void (*nh_operator_done_cb)(void *data, const nh_audit_t *ev, const nh_error_t *err);
int nh_operator_submit_link(struct nh_pg_link *link, const nh_op_req_t *req, nh_operator_done_cb done, void *data,
                            nh_error_t *err);
const char *nh_operator_name(nh_op_kind_t kind);

#endif
