/* The AMQP transport's tables and statements in PostgreSQL's dialect (stage 3 groundwork,
 * docs/store-backends.md): amqp_outbox, the transactional outbox of sends waiting for the
 * broker's outcome, and amqp_deliveries, the delivery counts of broker messages, as a
 * migration list of their own, and every statement of nh_amqp.c's a_sql as an operation
 * with an argument builder (and readers where rows come back), in the style of
 * nh_pg_queue.h.
 *
 * The operations are a table of nh_pg_exec.c's executor (nh_pga_optab), run one at a time
 * (nh_pga_run) or in batches beside the store's and the queue's (nh_pga_batch_add: one
 * transaction, one round trip), so a pump can write its outcome and the outbox rows it
 * publishes in one commit. host/tests/test_pg_amqp.c runs the same sequences through
 * nh_amqp.c's own sqlite statements and through these, and compares the rows. */
#ifndef NH_PG_AMQP_H
#define NH_PG_AMQP_H

#include <libpq-fe.h>
#include <stddef.h>
#include <stdint.h>

#include "core/nh_error.h"
#include "nh_pg_ops.h"

/* The AMQP schema version this nimbus-host writes (entries of its migration list). */
#define NH_PG_AMQP_SCHEMA_VERSION 1

/* Brings amqp_outbox and amqp_deliveries to NH_PG_AMQP_SCHEMA_VERSION, blocking, with the
 * store's migrator (nh_pg_int.h): one transaction per migration under an advisory lock of
 * its own (neither the store's nor the queue's), the version in the one-row table
 * nimbus_amqp_schema. A newer AMQP schema is refused, naming both versions. */
int nh_pg_amqp_migrate(PGconn *conn, nh_error_t *err);
/* The AMQP schema version the connection sees (0: no AMQP tables yet). */
int nh_pg_amqp_schema_version(PGconn *conn, int *version, nh_error_t *err);

/* One prepared statement each, a_sql's (nh_amqp_priv.h's A_* order). */
typedef enum nh_pgaop {
  NH_PGA_OUT_ADD,
  NH_PGA_OUT_NEXT,
  NH_PGA_OUT_DEL,
  NH_PGA_DLV_BUMP,
  NH_PGA_DLV_DEL,
  NH_PGA_OUT_LEFT,
  NH_PGA_OUT_OWNERS,
  NH_PGA_OUT_CLAIM,
  NH_PGA_OUT_DROP,
  NH_PGA_OUT_ONE,
  NH_PGA_OUT_ADOPT,   /* PostgreSQL only: rows of processes on other machines that are gone */
  /* PostgreSQL only: the set twins of row operations (nh_pg_opdef_t's set) */
  NH_PGA_OUT_ADD_SET,
  NH_PGA_DLV_BUMP_SET,
  NH_PGA_DLV_DEL_SET,
  NH_PGA_OUT_DEL_SET,
  NH_PGA_COUNT
} nh_pgaop_t;

/* The AMQP operations as a table of the executor (nh_pg_ops.h), NH_PGA_COUNT of them. */
extern const nh_pg_optab_t nh_pga_optab;

const char *nh_pgaop_name(nh_pgaop_t op);
const char *nh_pgaop_sql(nh_pgaop_t op);
int nh_pgaop_nparams(nh_pgaop_t op);

/* ---------------------------------------------------------------- arguments
 *
 * Each builder resets `a`, fills it as nh_amqp.c binds its twin (owners, addresses,
 * endpoints and message ids through nh_pg_args_key, the encoded message as bytea) and
 * returns the operation. Nothing is allocated unless a text is not UTF-8 (nh_pg_ops.h). */

/* An encoded message for `address`, written by `owner` at `created_at` (0: now). Returns
 * the row's seq (RETURNING seq: sqlite's last_insert_rowid, the transport's first_own_seq). */
nh_pgaop_t nh_pgaargs_out_add(nh_pg_args_t *a, const char *owner, const char *address, const void *message,
                              size_t len, int64_t created_at);
/* Up to `limit` of owner's rows after seq `after`, in seq order (seq, address, message). */
nh_pgaop_t nh_pgaargs_out_next(nh_pg_args_t *a, const char *owner, int64_t after, int limit);
nh_pgaop_t nh_pgaargs_out_del(nh_pg_args_t *a, int64_t seq);
/* Counts one more delivery of the message; returns the count (1 the first time). */
nh_pgaop_t nh_pgaargs_dlv_bump(nh_pg_args_t *a, const char *endpoint, const char *message_id);
nh_pgaop_t nh_pgaargs_dlv_del(nh_pg_args_t *a, const char *endpoint, const char *message_id);
/* How many of owner's rows lie after seq `after` (one bigint). */
nh_pgaop_t nh_pgaargs_out_left(nh_pg_args_t *a, const char *owner, int64_t after);
/* The owners of outbox rows other than `me`, each once (in byte order: sqlite's DISTINCT
 * gives no order, and the transport asks for none). */
nh_pgaop_t nh_pgaargs_out_owners(nh_pg_args_t *a, const char *me);
/* `owner` takes every row of `from` (a process that is no longer running). */
nh_pgaop_t nh_pgaargs_out_claim(nh_pg_args_t *a, const char *owner, const char *from);
/* owner's rows from seq `first` on (what a process wrote itself, dropped on request). */
nh_pgaop_t nh_pgaargs_out_drop(nh_pg_args_t *a, const char *owner, int64_t first);
/* One row by seq (seq, address, message): a message the broker released, sent again. */
nh_pgaop_t nh_pgaargs_out_one(nh_pg_args_t *a, int64_t seq);
/* `owner` takes every row written before `before` (ms) by an owner with no row in the
 * store's hosts table seen since then: a host on another machine that died (a process of
 * this machine is recognised at once, OUT_OWNERS and OUT_CLAIM). Returns the seqs taken.
 * sqlite has no twin: its processes all run on one machine. A `publish` command is no
 * host, so `before` must lie well behind any publish still waiting for the broker. */
nh_pgaop_t nh_pgaargs_out_adopt(nh_pg_args_t *a, const char *owner, int64_t before);

/* ---------------------------------------------------------------- readers */

/* A row of OUT_NEXT or OUT_ONE. address and message point into the result (valid while
 * it is); message holds len bytes as written (a NUL, bytes that are not UTF-8). */
typedef struct nh_pga_out_row {
  int64_t seq;
  const char *address;
  const char *message;
  size_t len;
} nh_pga_out_row_t;

void nh_pga_out_row(const PGresult *r, int row, nh_pga_out_row_t *out);
/* DLV_BUMP's count, OUT_LEFT's count: the one bigint of the first row (0 with none). */
int64_t nh_pga_count(const PGresult *r);
/* An owner OUT_OWNERS returned (valid while r is). */
const char *nh_pga_owner(const PGresult *r, int row);

/* ---------------------------------------------------------------- executor */

/* nh_pg_db_run_op and nh_pg_batch_add_op for the AMQP operations (nh_pg_ops.h): one
 * operation blocking, or added to a batch that may hold the store's and the queue's
 * operations too; cb (may be NULL) gets the result once the batch has committed, with tab
 * &nh_pga_optab. */
int nh_pga_run(nh_pg_db_t *db, nh_pgaop_t op, nh_pg_args_t *args, PGresult **res, nh_error_t *err);
int nh_pga_batch_add(nh_pg_db_t *db, nh_pgaop_t op, nh_pg_args_t *args, nh_pg_result_cb cb, void *data,
                     nh_error_t *err);

#endif
