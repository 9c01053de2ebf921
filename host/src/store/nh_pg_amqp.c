/* The AMQP transport's tables and statements in PostgreSQL's dialect (nh_pg_amqp.h).
 * Each statement is its twin of nh_amqp.c's a_sql; what differs, and why:
 * - numbered ?N parameters are $N, in the same positions, so the builders bind what
 *   nh_amqp.c binds where it binds it;
 * - OUT_ADD returns its seq (PostgreSQL has no last_insert_rowid);
 * - ON CONFLICT's update names the existing row's column (amqp_deliveries.count);
 * - OUT_OWNERS is ordered: sqlite's DISTINCT happens to come out sorted, PostgreSQL's
 *   (a hash aggregate) need not, and a caller claiming owners one by one is easier to
 *   reason about, and to test, in one order.
 *
 * Open for stage 3: OUT_NEXT is a cursor on seq ("after the last sent"), which assumes
 * seq order is commit order. On sqlite one writer at a time makes it so; on PostgreSQL
 * two transactions of one owner (the pump's commit and a publish outside a handler, each a
 * batch of its own on the link) can commit seq 11 before seq 10, and a cursor at 11 never
 * sends 10 until the process restarts. The transport will need a per-owner
 * transaction-scoped advisory lock around OUT_ADD, or to re-read below its cursor. */
#include "nh_pg_amqp.h"
#include "nh_pg_int.h"
#include "core/nh_util.h"

#include <string.h>

/* ---------------------------------------------------------------- schema */

#define T "text COLLATE \"C\""

/* The end state of sqlite's amqp_migrations (one entry there too) as one entry. As in
 * nh_pg_schema.h: text is COLLATE "C" (byte order, as sqlite), integers bigint, the
 * encoded message bytea (AMQP's encoding is binary: NULs, bytes that are not UTF-8).
 * amqp_outbox.seq is an identity (AUTOINCREMENT: never reused, so a seq the broker's
 * outcome names, the delivery tag, can only be that row); a WITHOUT ROWID table a plain
 * one with the same key. No index on owner, as on sqlite: the outbox holds what waits for
 * the broker, a few rows, and OUT_NEXT walks the primary key from its cursor. */
static const char *const amqp_migrations[] = {
  /* 1: sqlite's 1 */
  "CREATE TABLE amqp_outbox (seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, owner " T " NOT NULL,"
  "  address " T " NOT NULL, message bytea NOT NULL, created_at bigint NOT NULL);"
  "CREATE TABLE amqp_deliveries (endpoint " T " NOT NULL, message_id " T " NOT NULL, count bigint NOT NULL,"
  "  PRIMARY KEY (endpoint, message_id));",
};

#undef T

_Static_assert(sizeof amqp_migrations / sizeof amqp_migrations[0] == NH_PG_AMQP_SCHEMA_VERSION,
               "NH_PG_AMQP_SCHEMA_VERSION must count the entries of amqp_migrations");

/* The AMQP list for the migrator (nh_pg_int.h). Its advisory lock: "NHst" and 3; the
 * store's is 1 (nh_pg.c), the queue's 2 (nh_pg_queue.c): the three lists are independent,
 * and a host migrating one never waits for another's. The version has a table of its own
 * for the reason the queue's has (nimbus_schema is the store's one row). */
static const nh_pg_migrations_t amqp_list = {
  .lock = "5640885475334946819",
  .table = "nimbus_amqp_schema",
  .whose = "AMQP transport",
  .what = "the AMQP transport's tables",
  .steps = amqp_migrations,
  .count = NH_PG_AMQP_SCHEMA_VERSION,
};

int nh_pg_amqp_schema_version(PGconn *conn, int *version, nh_error_t *err)
{
  return nh_pg_migrations_version(conn, &amqp_list, version, err);
}

int nh_pg_amqp_migrate(PGconn *conn, nh_error_t *err)
{
  return nh_pg_migrations_run(conn, &amqp_list, NH_PG_AMQP_SCHEMA_VERSION, NULL, NULL, err);
}

/* ---------------------------------------------------------------- operations */

static const nh_pg_opdef_t ops[NH_PGA_COUNT] = {
  [NH_PGA_OUT_ADD] = { "nha_out_add",
    "INSERT INTO amqp_outbox(address, message, created_at, owner) VALUES ($1, $2, $3, $4) RETURNING seq", 4,
    .set = NH_PGA_OUT_ADD_SET, .rel = "amqp_outbox" },
  [NH_PGA_OUT_NEXT] = { "nha_out_next",
    "SELECT seq, address, message FROM amqp_outbox WHERE seq > $1 AND owner = $3 ORDER BY seq LIMIT $2", 3 },
  [NH_PGA_OUT_DEL] = { "nha_out_del", "DELETE FROM amqp_outbox WHERE seq = $1", 1, .set = NH_PGA_OUT_DEL_SET,
    .rel = "amqp_outbox" },
  [NH_PGA_DLV_BUMP] = { "nha_dlv_bump",
    "INSERT INTO amqp_deliveries(endpoint, message_id, count) VALUES ($1, $2, 1)"
    " ON CONFLICT (endpoint, message_id) DO UPDATE SET count = amqp_deliveries.count + 1 RETURNING count", 2,
    .set = NH_PGA_DLV_BUMP_SET, .rel = "amqp_deliveries", .key = 2 },
  [NH_PGA_DLV_DEL] = { "nha_dlv_del", "DELETE FROM amqp_deliveries WHERE endpoint = $1 AND message_id = $2", 2,
    .set = NH_PGA_DLV_DEL_SET, .rel = "amqp_deliveries", .key = 2 },
  [NH_PGA_OUT_LEFT] = { "nha_out_left", "SELECT count(*) FROM amqp_outbox WHERE seq > $1 AND owner = $2", 2 },
  [NH_PGA_OUT_OWNERS] = { "nha_out_owners",
    "SELECT DISTINCT owner FROM amqp_outbox WHERE owner <> $1 ORDER BY owner", 1 },
  [NH_PGA_OUT_CLAIM] = { "nha_out_claim", "UPDATE amqp_outbox SET owner = $1 WHERE owner = $2", 2 },
  [NH_PGA_OUT_DROP] = { "nha_out_drop", "DELETE FROM amqp_outbox WHERE owner = $1 AND seq >= $2", 2 },
  [NH_PGA_OUT_ONE] = { "nha_out_one", "SELECT seq, address, message FROM amqp_outbox WHERE seq = $1", 1 },
  [NH_PGA_OUT_ADOPT] = { "nha_out_adopt",
    "UPDATE amqp_outbox SET owner = $1 WHERE owner <> $1 AND created_at < $2"
    " AND owner NOT IN (SELECT owner FROM hosts WHERE seen_at >= $2) RETURNING seq", 2 },
  /* The set twins (host/src/store/nh_pg_set.h): rows in the order given, so that one
   * owner's outbox seqs follow its list; a bump answers each row's ordinal first. */
  [NH_PGA_OUT_ADD_SET] = { "nha_out_add_set",
    "INSERT INTO amqp_outbox(address, message, created_at, owner) SELECT a, m, c::bigint, w"
    " FROM unnest($1::text[], $2::bytea[], $3::text[], $4::text[]) WITH ORDINALITY AS u(a, m, c, w, o)"
    " ORDER BY o RETURNING seq", 4, .types = "tbtt" },
  [NH_PGA_DLV_BUMP_SET] = { "nha_dlv_bump_set",
    "WITH u AS (SELECT * FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS u(e, m, o)),"
    " b AS (INSERT INTO amqp_deliveries(endpoint, message_id, count) SELECT e, m, 1 FROM u ORDER BY o"
    "  ON CONFLICT (endpoint, message_id) DO UPDATE SET count = amqp_deliveries.count + 1"
    "  RETURNING endpoint, message_id, count)"
    " SELECT u.o, b.count FROM u JOIN b ON b.endpoint = u.e AND b.message_id = u.m ORDER BY u.o", 2,
    .types = "tt" },
  [NH_PGA_DLV_DEL_SET] = { "nha_dlv_del_set",
    "DELETE FROM amqp_deliveries d USING unnest($1::text[], $2::text[]) AS u(e, m)"
    " WHERE d.endpoint = u.e AND d.message_id = u.m", 2, .types = "tt" },
  [NH_PGA_OUT_DEL_SET] = { "nha_out_del_set", "DELETE FROM amqp_outbox WHERE seq = ANY ($1::text[]::bigint[])", 1,
    .types = "t" },
};

const nh_pg_optab_t nh_pga_optab = { "amqp", 4, ops, NH_PGA_COUNT };   /* "nha_" */

static int known(nh_pgaop_t op) { return (unsigned)op < NH_PGA_COUNT; }
const char *nh_pgaop_name(nh_pgaop_t op) { return known(op) ? ops[op].name : "nha_unknown"; }
const char *nh_pgaop_sql(nh_pgaop_t op) { return known(op) ? ops[op].sql : NULL; }
int nh_pgaop_nparams(nh_pgaop_t op) { return known(op) ? ops[op].nparams : 0; }

/* ---------------------------------------------------------------- arguments */

/* Owners, addresses, endpoints and message ids are all compared or used as names: keys
 * (nh_pg_ops.h), so two binary message ids differing only in bytes that are not UTF-8
 * keep two delivery counts. */
#define KEY(v) nh_pg_args_key(a, v)
#define I64(v) nh_pg_args_i64(a, v)

nh_pgaop_t nh_pgaargs_out_add(nh_pg_args_t *a, const char *owner, const char *address, const void *message,
                              size_t len, int64_t created_at)
{
  nh_pg_args_reset(a);
  KEY(address);
  nh_pg_args_bytes(a, message, len);
  I64(created_at ? created_at : nh_time_now_ms());
  KEY(owner);
  return NH_PGA_OUT_ADD;
}

nh_pgaop_t nh_pgaargs_out_next(nh_pg_args_t *a, const char *owner, int64_t after, int limit)
{
  nh_pg_args_reset(a);
  I64(after); I64(limit > 0 ? limit : 0); KEY(owner);
  return NH_PGA_OUT_NEXT;
}

static nh_pgaop_t one_seq(nh_pg_args_t *a, nh_pgaop_t op, int64_t seq)
{
  nh_pg_args_reset(a);
  I64(seq);
  return op;
}

nh_pgaop_t nh_pgaargs_out_del(nh_pg_args_t *a, int64_t seq) { return one_seq(a, NH_PGA_OUT_DEL, seq); }
nh_pgaop_t nh_pgaargs_out_one(nh_pg_args_t *a, int64_t seq) { return one_seq(a, NH_PGA_OUT_ONE, seq); }

nh_pgaop_t nh_pgaargs_out_adopt(nh_pg_args_t *a, const char *owner, int64_t before)
{
  nh_pg_args_reset(a);
  KEY(owner); I64(before);
  return NH_PGA_OUT_ADOPT;
}

static nh_pgaop_t two_keys(nh_pg_args_t *a, nh_pgaop_t op, const char *k1, const char *k2)
{
  nh_pg_args_reset(a);
  KEY(k1); KEY(k2);
  return op;
}

nh_pgaop_t nh_pgaargs_dlv_bump(nh_pg_args_t *a, const char *endpoint, const char *message_id)
{
  return two_keys(a, NH_PGA_DLV_BUMP, endpoint, message_id);
}

nh_pgaop_t nh_pgaargs_dlv_del(nh_pg_args_t *a, const char *endpoint, const char *message_id)
{
  return two_keys(a, NH_PGA_DLV_DEL, endpoint, message_id);
}

nh_pgaop_t nh_pgaargs_out_claim(nh_pg_args_t *a, const char *owner, const char *from)
{
  return two_keys(a, NH_PGA_OUT_CLAIM, owner, from);
}

nh_pgaop_t nh_pgaargs_out_left(nh_pg_args_t *a, const char *owner, int64_t after)
{
  one_seq(a, NH_PGA_OUT_LEFT, after);
  KEY(owner);
  return NH_PGA_OUT_LEFT;
}

nh_pgaop_t nh_pgaargs_out_owners(nh_pg_args_t *a, const char *me)
{
  nh_pg_args_reset(a);
  KEY(me);
  return NH_PGA_OUT_OWNERS;
}

nh_pgaop_t nh_pgaargs_out_drop(nh_pg_args_t *a, const char *owner, int64_t first)
{
  nh_pg_args_reset(a);
  KEY(owner); I64(first);
  return NH_PGA_OUT_DROP;
}

/* ---------------------------------------------------------------- readers */

void nh_pga_out_row(const PGresult *r, int row, nh_pga_out_row_t *out)
{
  out->seq = nh_pg_col_i64(r, row, 0);
  out->address = nh_pg_col_text(r, row, 1);
  /* binary results: a bytea arrives as its bytes, PQgetlength of them */
  out->message = PQgetisnull(r, row, 2) ? NULL : PQgetvalue(r, row, 2);
  out->len = out->message ? (size_t)PQgetlength(r, row, 2) : 0;
}

int64_t nh_pga_count(const PGresult *r) { return PQntuples(r) > 0 ? nh_pg_col_i64(r, 0, 0) : 0; }

const char *nh_pga_owner(const PGresult *r, int row) { return nh_pg_col_text(r, row, 0); }

/* ---------------------------------------------------------------- executor */

int nh_pga_run(nh_pg_db_t *db, nh_pgaop_t op, nh_pg_args_t *args, PGresult **res, nh_error_t *err)
{
  return nh_pg_db_run_op(db, &nh_pga_optab, (int)op, args, res, err);
}

int nh_pga_batch_add(nh_pg_db_t *db, nh_pgaop_t op, nh_pg_args_t *args, nh_pg_result_cb cb, void *data,
                     nh_error_t *err)
{
  return nh_pg_batch_add_op(db, &nh_pga_optab, (int)op, args, cb, data, err);
}
