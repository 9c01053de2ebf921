/* The embedded transport's tables and statements in PostgreSQL's dialect (nh_pg_queue.h).
 * Each statement is its twin of nh_embedded.c's q_sql; what differs, and why:
 * - INSERT OR REPLACE is INSERT ... ON CONFLICT (the primary key) DO UPDATE;
 * - sqlite's order without ORDER BY (a WITHOUT ROWID table's primary key) is spelled out;
 * - max() of two values is greatest();
 * - parameters whose type PostgreSQL cannot infer are cast.
 * HEADS_AND_LOCK is PostgreSQL's own: on sqlite one writer at a time makes "scan, then lock
 * each head" safe; here several hosts scan at once (see its comment). */
#include "nh_pg_queue.h"
#include "nh_pg_int.h"
#include "core/nh_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- schema */

#define T "text COLLATE \"C\""

/* The end state of sqlite's embedded_migrations 1-5 as one entry: no PostgreSQL queue was
 * ever written, so there is nothing to step through. As in nh_pg_schema.h: text is
 * COLLATE "C" (byte order, as sqlite), integers bigint, bodies bytea (a NUL, bytes that
 * are not UTF-8), WITHOUT ROWID tables plain ones with the same key. queue.seq is an
 * identity (AUTOINCREMENT: never reused, so a dead letter's seq stays unique). The heads
 * scan reads queue_endpoint in seq order; no index on (endpoint, session_id, seq), which
 * sqlite dropped (version 3) for what it cost every enqueue and settle, nor on
 * session_locks.owner (version 5). */
static const char *const queue_migrations[] = {
  /* 1: sqlite's 1-5 */
  "CREATE TABLE subscriptions (event_type " T " NOT NULL, endpoint " T " NOT NULL,"
  "  command bigint NOT NULL DEFAULT 0, PRIMARY KEY (event_type, endpoint));"
  "CREATE TABLE queue ("
  "  seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, endpoint " T " NOT NULL, session_id " T " NOT NULL,"
  "  message_id " T " NOT NULL, event_id " T ", event_type " T ", message_type " T " NOT NULL,"
  "  correlation_id " T ", originating_message_id " T ", parent_message_id " T ", from_ " T ","
  "  retry_count bigint NOT NULL DEFAULT 0, delivery_count bigint NOT NULL DEFAULT 0,"
  "  releases bigint NOT NULL DEFAULT 0, reply_to " T ","
  "  enqueued_at bigint NOT NULL, visible_at bigint NOT NULL, body bytea, error_text " T ", error_type " T ","
  "  traceparent " T ", tracestate " T ");"
  "CREATE INDEX queue_endpoint ON queue(endpoint, seq);"
  "CREATE TABLE session_locks (endpoint " T " NOT NULL, session_id " T " NOT NULL, owner " T ","
  "  locked_until bigint NOT NULL, PRIMARY KEY (endpoint, session_id));"
  "CREATE TABLE dead_letters ("
  "  seq bigint PRIMARY KEY, endpoint " T " NOT NULL, session_id " T ", message_id " T ", event_id " T ","
  "  event_type " T ", message_type " T ", body bytea, reason " T ", delivery_count bigint, at bigint NOT NULL);",
};

#undef T

_Static_assert(sizeof queue_migrations / sizeof queue_migrations[0] == NH_PG_QUEUE_SCHEMA_VERSION,
               "NH_PG_QUEUE_SCHEMA_VERSION must count the entries of queue_migrations");

/* The queue's list for the migrator (nh_pg_int.h). Its advisory lock: "NHst" (as the
 * store's) and 2; the store's is "NHst" and 1 (nh_pg.c). Different keys: the two lists are
 * independent. The version lives in a table of its own rather than a second row of
 * nimbus_schema: nimbus_schema is one row by a unique index, and nh_pg_migrate and the link
 * read it as the store's version (a row keyed 'queue' would need both changed). */
static const nh_pg_migrations_t queue_list = {
  .lock = "5640885475334946818",
  .table = "nimbus_queue_schema",
  .whose = "embedded queue",
  .what = "the embedded queue",
  .steps = queue_migrations,
  .count = NH_PG_QUEUE_SCHEMA_VERSION,
};

int nh_pg_queue_schema_version(PGconn *conn, int *version, nh_error_t *err)
{
  return nh_pg_migrations_version(conn, &queue_list, version, err);
}

int nh_pg_queue_migrate(PGconn *conn, nh_error_t *err)
{
  return nh_pg_migrations_run(conn, &queue_list, NH_PG_QUEUE_SCHEMA_VERSION, NULL, NULL, err);
}

/* ---------------------------------------------------------------- operations */

/* The columns nh_pgq_row reads, in nh_embedded.c's read_row order (visible_at is 13). */
#define ROW_COLS                                                                                  \
  "seq, session_id, message_id, event_id, event_type, message_type, correlation_id,"                \
  " originating_message_id, parent_message_id, from_, retry_count, delivery_count, enqueued_at,"   \
  " visible_at, body, error_text, error_type, releases, reply_to, traceparent, tracestate"

/* The columns a queue insert writes. */
#define INSERT_COLS                                                                               \
  "endpoint, session_id, message_id, event_id, event_type, message_type, correlation_id,"           \
  " originating_message_id, parent_message_id, from_, retry_count, enqueued_at, visible_at, body,"  \
  " error_text, error_type, reply_to, traceparent, tracestate"

/* Lease keys. Hosts sharing a store take session leases in their fills (LOCK, one per
 * session; HEADS_AND_LOCK, a scan's worth) in whatever order their passes met the
 * sessions: a broker's deliveries as they arrived, due sessions by id, heads by seq. An
 * upsert locks the row it conflicts with even when its WHERE (the lease expired) fails,
 * and waits for a row another transaction holds, or has inserted or deleted and not yet
 * committed; so two fills holding deliveries of the same sessions (around a partition
 * move, a reconnect) each held one row and waited for the other's: deadlock detected
 * (40P01), the fill failed and was retried a second later, three times running, until
 * the leases of the host's running handlers expired and their outcomes were discarded.
 * Putting a fill's statements in session order cannot mend it: a scan's sessions are
 * known only inside its statement, and fills and commits touch leases in several.
 *
 * So every transaction that writes a session's lease row holds the session's lease key
 * (a transaction-scoped advisory lock on LEASE_KEY, a pair of int4: a key space of its
 * own, apart from the bigint keys of the inserts' session order and of the migrations)
 * from before it touches the row until it ends, and
 * - a fill only tries it (pg_try_advisory_xact_lock) and leaves a session whose key
 *   another transaction holds alone: "not free now", as a live lease answers, asked again
 *   by the next pump. A fill that got the key meets no transaction still writing the row
 *   and none can start to before it ends, so it never waits for a lease row or key: no
 *   circle of waits over leases goes through it;
 * - a commit or a batch outside a pump (lease ends, renewals: the opdefs' `guard`) takes
 *   the keys of all its rows in its first statement, in key order, blocking
 *   (LEASE_KEY_SET): for a key it waits only for fills, which wait for no key or lease,
 *   and for batches that take their keys in the same order, and never while it holds
 *   anything but keys;
 * - DROP_OWNER (a restarted host ends the leases of its dead predecessor at once, one
 *   statement) takes the keys of the owner's rows as a commit does, then deletes them.
 *   (Leaving a row whose key was held to expire instead left a killed host's session
 *   to wait out its lease while the live hosts' fills kept trying its key.)
 * The key only orders the writers of a row; what they write is decided as before: a fill
 * takes a lease only where there is none or it expired, a lease end or a renewal only
 * matches its owner's row. Two sessions whose keys collide wait for each other or are
 * skipped for a pump, nothing worse. */
#define LEASE_CLASS "1313370988"   /* "NHsl" */
#define LEASE_HASH(e, s) "hashtext(" e " || chr(31) || " s ")"
#define LEASE_KEY(e, s) LEASE_CLASS ", " LEASE_HASH(e, s)

static const nh_pg_opdef_t ops[NH_PGQ_COUNT] = {
  [NH_PGQ_SUB_DEL] = { "nhq_sub_del", "DELETE FROM subscriptions WHERE endpoint = $1", 1 },
  [NH_PGQ_SUB_ADD] = { "nhq_sub_add",
    "INSERT INTO subscriptions(event_type, endpoint, command) VALUES ($1, $2, $3)"
    " ON CONFLICT (event_type, endpoint) DO UPDATE SET command = excluded.command", 3 },
  [NH_PGQ_SUB_CONFLICT] = { "nhq_sub_conflict",
    "SELECT endpoint FROM subscriptions WHERE event_type = $1 AND endpoint <> $2 AND (command = 1 OR $3::bigint = 1)"
    " ORDER BY endpoint", 3 },
  [NH_PGQ_SUBSCRIBERS] = { "nhq_subscribers",
    "SELECT endpoint FROM subscriptions WHERE event_type = $1 ORDER BY endpoint", 1 },
  /* seq is taken at the insert, but a transaction commits when it commits: two writers of
   * one session could commit seq 11 before 10, and a head scan in between hand out 11
   * first. So each insert first takes the session's transaction-scoped advisory lock: a
   * second writer of the session waits for the first to end before it takes its seq, and
   * a session's rows become visible in seq order (other sessions' writers do not wait). */
  [NH_PGQ_INSERT] = { "nhq_insert",
    "INSERT INTO queue(" INSERT_COLS ")"
    " SELECT $1::text, $2::text, $3::text, $4::text, $5::text, $6::text, $7::text, $8::text, $9::text, $10::text,"
    " $11::bigint, $12::bigint, $12::bigint, $13::bytea, $14::text, $15::text, $16::text, $17::text, $18::text"
    " FROM (SELECT pg_advisory_xact_lock(hashtextextended($1::text || chr(31) || $2::text, 0))) session_order"
    " RETURNING seq", 18, .set = NH_PGQ_INSERT_SET, .rel = "queue" },
  [NH_PGQ_HEADS] = { "nhq_heads",
    "SELECT " ROW_COLS " FROM queue q WHERE q.endpoint = $1 AND NOT EXISTS"
    " (SELECT 1 FROM session_locks l WHERE l.endpoint = $1 AND l.session_id = q.session_id"
    "  AND l.locked_until > $2) ORDER BY q.seq LIMIT $3", 3 },
  /* no row: the lease is another host's, or its key is held (Lease keys, above) */
  [NH_PGQ_LOCK] = { "nhq_lock",
    "INSERT INTO session_locks(endpoint, session_id, owner, locked_until)"
    " SELECT $1::text, $2::text, $3::text, $4::bigint"
    " WHERE pg_try_advisory_xact_lock(" LEASE_KEY("$1::text", "$2::text") ")"
    " ON CONFLICT (endpoint, session_id) DO UPDATE SET owner = excluded.owner, locked_until = excluded.locked_until"
    " WHERE session_locks.locked_until <= $5 RETURNING session_id", 5 },
  [NH_PGQ_UNLOCK] = { "nhq_unlock",
    "DELETE FROM session_locks WHERE endpoint = $1 AND session_id = $2 AND owner = $3", 3, .guard = NH_PGQ_LEASE_KEY },
  [NH_PGQ_RENEW] = { "nhq_renew",
    "UPDATE session_locks SET locked_until = $4 WHERE endpoint = $1 AND session_id = $2 AND owner = $3", 4,
    .guard = NH_PGQ_LEASE_KEY },
  [NH_PGQ_DELIVERED] = { "nhq_delivered", "UPDATE queue SET delivery_count = delivery_count + 1 WHERE seq = $1", 1 },
  [NH_PGQ_DELETE] = { "nhq_delete", "DELETE FROM queue WHERE seq = $1", 1, .set = NH_PGQ_DELETE_SET, .rel = "queue" },
  [NH_PGQ_DEAD] = { "nhq_dead",
    "INSERT INTO dead_letters(seq, endpoint, session_id, message_id, event_id, event_type, message_type, body,"
    " reason, delivery_count, at) SELECT seq, endpoint, session_id, message_id, event_id, event_type,"
    " message_type, body, $2, delivery_count, $3 FROM queue WHERE seq = $1", 3 },
  [NH_PGQ_RELEASE_LOCK] = { "nhq_release_lock",
    "UPDATE session_locks SET owner = NULL, locked_until = $3 WHERE endpoint = $1 AND session_id = $2"
    " AND owner = $4", 4, .guard = NH_PGQ_LEASE_KEY },
  [NH_PGQ_RELEASED] = { "nhq_released",
    "UPDATE queue SET delivery_count = greatest(delivery_count - 1, 0), releases = releases + 1 WHERE seq = $1", 1 },
  [NH_PGQ_OWNERS] = { "nhq_owners",
    "SELECT DISTINCT owner FROM session_locks WHERE owner IS NOT NULL ORDER BY owner", 0 },
  [NH_PGQ_ROW] = { "nhq_row",
    "SELECT " ROW_COLS " FROM queue WHERE seq = $1 AND endpoint = $2 AND session_id = $3", 3 },
  /* the keys of the owner's leases first, in key order (an uncorrelated condition:
   * evaluated once, before any row is deleted), then its rows (Lease keys, above) */
  [NH_PGQ_DROP_OWNER] = { "nhq_drop_owner",
    "DELETE FROM session_locks WHERE owner = $1 AND (SELECT count(*) FROM (SELECT k, pg_advisory_xact_lock("
    LEASE_CLASS ", k) FROM (SELECT DISTINCT " LEASE_HASH("l.endpoint", "l.session_id") " AS k FROM session_locks l"
    " WHERE l.owner = $1 ORDER BY 1) ks) key_order) >= 0", 1 },
  /* The head scan for several hosts, one statement ($1 endpoint, $2 now, $3 max heads,
   * $4 owner, $5 lease end, $6 rows to scan):
   * - scan/heads: as the sqlite transport, the endpoint's rows of sessions with no live
   *   lease in seq order (queue_endpoint), each session's first row its head. Heads are
   *   chosen before any row lock is asked for: skipping a head locked by another host
   *   must not make that session's second row look like its head.
   * - cand: the first $3 of those heads visible now, locked FOR UPDATE SKIP LOCKED (the
   *   LIMIT above the lock: skipped rows do not count). A host whose statement is taking
   *   some of them right now has them locked until it commits: they are skipped, not
   *   waited for, so hosts scanning together take the next sessions, not none.
   * - leased: the lease, taken only where there is none or it expired by $2. This is what
   *   makes two hosts never hold one session: a host whose snapshot predates another's
   *   committed lease still meets it here (ON CONFLICT reads the latest row, and its
   *   WHERE is checked on it). A lease not committed yet is not met: only sessions
   *   whose lease key this statement gets are leased (Lease keys, above), and one
   *   another transaction is writing is skipped, not waited for, as the queue rows are.
   *   An expired lease (a host that died, a released session's delay over) is taken
   *   over.
   * - taken: the leased heads counted as delivered (sqlite's DELIVERED), returned with
   *   the count before this delivery so that nh_pgq_row reads all row operations alike.
   * The shape is chosen so that the plan stays linear whatever the statistics say (a
   * queue table's swing from empty to a backlog, or a database not analyzed yet, make
   * every estimate 1 row; measured with auto_explain under spec/bench/pg_host.lua): the
   * live leases as a hashed NOT IN (session_id is never NULL), not an anti-join the
   * planner ran as a scan of every lease per queue row; cand's rows by `seq = ANY` of an
   * array (index lookups), not a join it ran as a sequential scan of the queue; and the
   * leased sessions as an IN tested IS TRUE: a test PostgreSQL cannot turn into a semi
   * join (it did, OFFSET 0 or not, and scanned the CTE once per candidate: 8 of a call's
   * 11 ms), so it stays a hashed subplan. 30 ms became 5-15 ms per call of 256 heads, then
   * about 6 ms. */
  [NH_PGQ_HEADS_AND_LOCK] = { "nhq_heads_and_lock",
    "WITH scan AS ("
    "  SELECT q.seq, q.session_id, q.visible_at FROM queue q WHERE q.endpoint = $1 AND q.session_id NOT IN"
    "   (SELECT l.session_id FROM session_locks l WHERE l.endpoint = $1 AND l.locked_until > $2::bigint)"
    "  ORDER BY q.seq LIMIT $6),"
    " heads AS (SELECT DISTINCT ON (session_id) seq, visible_at FROM scan ORDER BY session_id, seq),"
    " cand AS (SELECT q.seq, q.session_id FROM queue q WHERE q.seq = ANY (ARRAY"
    "   (SELECT seq FROM heads WHERE visible_at <= $2::bigint))"
    "  ORDER BY q.seq LIMIT $3 FOR UPDATE SKIP LOCKED),"
    " leased AS (INSERT INTO session_locks(endpoint, session_id, owner, locked_until)"
    "  SELECT $1::text, session_id, $4::text, $5::bigint FROM cand"
    "  WHERE pg_try_advisory_xact_lock(" LEASE_KEY("$1::text", "session_id") ")"
    "  ON CONFLICT (endpoint, session_id) DO UPDATE SET owner = excluded.owner, locked_until = excluded.locked_until"
    "  WHERE session_locks.locked_until <= $2::bigint RETURNING session_id),"
    " taken AS (UPDATE queue q SET delivery_count = q.delivery_count + 1 FROM cand c"
    "  WHERE q.seq = c.seq AND (c.session_id IN (SELECT session_id FROM leased)) IS TRUE RETURNING q.*)"
    " SELECT seq, session_id, message_id, event_id, event_type, message_type, correlation_id,"
    " originating_message_id, parent_message_id, from_, retry_count, delivery_count - 1, enqueued_at,"
    " visible_at, body, error_text, error_type, releases, reply_to, traceparent, tracestate FROM taken ORDER BY seq",
    6 },
  [NH_PGQ_SESSION_NEXT] = { "nhq_session_next",
    "SELECT " ROW_COLS " FROM queue WHERE endpoint = $1 AND seq > $3 AND session_id = $2 ORDER BY seq LIMIT $4", 4 },
  [NH_PGQ_HELD] = { "nhq_held",
    "SELECT count(*) FROM session_locks WHERE endpoint = $1 AND session_id = $2 AND owner = $3", 3,
    .set = NH_PGQ_HELD_SET },
  /* The cast of a text that is no number is the error that fails the batch: it reads
   * "invalid input syntax for type integer: "session lock lost: <session>"" in the log.
   * The text includes the count (repeat(' ', 0) is empty) so that the planner cannot fold
   * the cast into a constant, which it would evaluate, and fail on, whatever the CASE. */
  [NH_PGQ_UNLOCK_OWNED] = { "nhq_unlock_owned",
    "WITH d AS (DELETE FROM session_locks WHERE endpoint = $1 AND session_id = $2 AND owner = $3 RETURNING 1)"
    " SELECT CASE WHEN count(*) = 0 THEN ('session lock lost: ' || $2::text || repeat(' ', count(*)::int))::int"
    " ELSE 1 END FROM d", 3, .set = NH_PGQ_UNLOCK_OWNED_SET, .rel = "session_locks", .key = 2,
    .guard = NH_PGQ_LEASE_KEY },
  [NH_PGQ_NOTIFY] = { "nhq_notify", "SELECT pg_notify('" NH_PGQ_CHANNEL "', $1)", 1 },
  /* the guard of the lease writes (Lease keys, above): always sent as its set twin */
  [NH_PGQ_LEASE_KEY] = { "nhq_lease_key", "SELECT pg_advisory_xact_lock(" LEASE_KEY("$1::text", "$2::text") ")", 2,
    .set = NH_PGQ_LEASE_KEY_SET },
  /* The set twins (nh_pg_opdef_t's set). INSERT's takes every session's advisory lock
   * before its first row (an uncorrelated condition: evaluated once, first), in the
   * order of the locks' keys, so that two writers of the same sessions never wait for
   * each other in a circle; then inserts in the order given. */
  [NH_PGQ_INSERT_SET] = { "nhq_insert_set",
    "INSERT INTO queue(" INSERT_COLS ")"
    " SELECT c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11::bigint, c12::bigint, c12::bigint, c13, c14, c15, c16,"
    " c17, c18 FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[],"
    " $8::text[], $9::text[], $10::text[], $11::text[], $12::text[], $13::bytea[], $14::text[], $15::text[],"
    " $16::text[], $17::text[], $18::text[]) WITH ORDINALITY AS u(c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11,"
    " c12, c13, c14, c15, c16, c17, c18, o)"
    " WHERE (SELECT count(*) FROM (SELECT h, pg_advisory_xact_lock(h) FROM (SELECT DISTINCT"
    "  hashtextextended(e || chr(31) || s, 0) AS h FROM unnest($1::text[], $2::text[]) AS k(e, s) ORDER BY 1) hs)"
    "  session_order) >= 0"
    " ORDER BY o RETURNING seq", 18, .types = "ttttttttttttbttttt" },
  [NH_PGQ_DELETE_SET] = { "nhq_delete_set", "DELETE FROM queue WHERE seq = ANY ($1::text[]::bigint[])", 1,
    .types = "t" },
  /* fails as UNLOCK_OWNED does, naming the sessions whose lease was lost */
  [NH_PGQ_UNLOCK_OWNED_SET] = { "nhq_unlock_owned_set",
    "WITH u AS (SELECT * FROM unnest($1::text[], $2::text[], $3::text[]) AS u(e, s, o)),"
    " d AS (DELETE FROM session_locks l USING u WHERE l.endpoint = u.e AND l.session_id = u.s AND l.owner = u.o"
    "  RETURNING l.endpoint, l.session_id)"
    " SELECT CASE WHEN count(*) = cardinality($1::text[]) THEN 1 ELSE ('session lock lost: ' ||"
    " (SELECT string_agg(u.s, ', ') FROM u WHERE (u.e, u.s) NOT IN (SELECT endpoint, session_id FROM d)) ||"
    " repeat(' ', count(*)::int))::int END FROM d", 3, .types = "ttt" },
  /* every session's lease key, once, in key order (as INSERT_SET's advisory locks) */
  [NH_PGQ_LEASE_KEY_SET] = { "nhq_lease_key_set",
    "SELECT count(*) FROM (SELECT k, pg_advisory_xact_lock(" LEASE_CLASS ", k) FROM (SELECT DISTINCT "
    LEASE_HASH("e", "s") " AS k FROM unnest($1::text[], $2::text[]) AS u(e, s) ORDER BY 1) ks) key_order", 2,
    .types = "tt" },
  [NH_PGQ_HELD_SET] = { "nhq_held_set",
    "SELECT u.o, (SELECT count(*) FROM session_locks l WHERE l.endpoint = u.e AND l.session_id = u.s"
    " AND l.owner = u.w) FROM unnest($1::text[], $2::text[], $3::text[]) WITH ORDINALITY AS u(e, s, w, o)"
    " ORDER BY u.o", 3, .types = "ttt" },
};

const nh_pg_optab_t nh_pgq_optab = { "queue", 4, ops, NH_PGQ_COUNT };   /* "nhq_" */

static int known(nh_pgqop_t op) { return (unsigned)op < NH_PGQ_COUNT; }
const char *nh_pgqop_name(nh_pgqop_t op) { return known(op) ? ops[op].name : "nhq_unknown"; }
const char *nh_pgqop_sql(nh_pgqop_t op) { return known(op) ? ops[op].sql : NULL; }
int nh_pgqop_nparams(nh_pgqop_t op) { return known(op) ? ops[op].nparams : 0; }

/* ---------------------------------------------------------------- arguments */

/* prose, and ids or names the queue compares (nh_pg_ops.h) */
#define TXT(v) nh_pg_args_text(a, v)
#define KEY(v) nh_pg_args_key(a, v)
#define I64(v) nh_pg_args_i64(a, v)

static nh_pgqop_t one_key(nh_pg_args_t *a, nh_pgqop_t op, const char *k)
{
  nh_pg_args_reset(a);
  KEY(k);
  return op;
}

static nh_pgqop_t one_seq(nh_pg_args_t *a, nh_pgqop_t op, int64_t seq)
{
  nh_pg_args_reset(a);
  I64(seq);
  return op;
}

nh_pgqop_t nh_pgqargs_sub_del(nh_pg_args_t *a, const char *endpoint) { return one_key(a, NH_PGQ_SUB_DEL, endpoint); }

nh_pgqop_t nh_pgqargs_sub_add(nh_pg_args_t *a, const char *event_type, const char *endpoint, int command)
{
  nh_pg_args_reset(a);
  KEY(event_type); KEY(endpoint); I64(command != 0);
  return NH_PGQ_SUB_ADD;
}

nh_pgqop_t nh_pgqargs_sub_conflict(nh_pg_args_t *a, const char *event_type, const char *endpoint, int command)
{
  nh_pgqargs_sub_add(a, event_type, endpoint, command);
  return NH_PGQ_SUB_CONFLICT;
}

nh_pgqop_t nh_pgqargs_subscribers(nh_pg_args_t *a, const char *event_type)
{
  return one_key(a, NH_PGQ_SUBSCRIBERS, event_type);
}

nh_pgqop_t nh_pgqargs_insert(nh_pg_args_t *a, const nh_msg_t *m, const char *endpoint, const char *event_id)
{
  nh_pg_args_reset(a);
  KEY(endpoint); KEY(m->session_id); KEY(m->message_id); KEY(event_id); KEY(m->event_type);
  TXT(nh_msg_type_name(m->type)); KEY(m->correlation_id); KEY(m->originating_message_id);
  KEY(m->parent_message_id); KEY(m->from);
  I64(m->retry_count);
  I64(m->enqueued_at ? m->enqueued_at : nh_time_now_ms());
  nh_pg_args_bytes(a, m->body, m->body_len);
  TXT(m->error_text); TXT(m->error_type); KEY(m->reply_to); TXT(m->traceparent); TXT(m->tracestate);
  return NH_PGQ_INSERT;
}

nh_pgqop_t nh_pgqargs_heads(nh_pg_args_t *a, const char *endpoint, int64_t now, int scan)
{
  one_key(a, NH_PGQ_HEADS, endpoint);
  I64(now); I64(scan);
  return NH_PGQ_HEADS;
}

nh_pgqop_t nh_pgqargs_heads_and_lock(nh_pg_args_t *a, const char *endpoint, int64_t now, int max, const char *owner,
                                     int64_t until)
{
  one_key(a, NH_PGQ_HEADS_AND_LOCK, endpoint);
  I64(now); I64(max > 0 ? max : 0); KEY(owner); I64(until);
  I64((int64_t)(max > 0 ? max : 0) * 4 + 256);   /* the sqlite transport's scan */
  return NH_PGQ_HEADS_AND_LOCK;
}

nh_pgqop_t nh_pgqargs_lock(nh_pg_args_t *a, const char *endpoint, const char *session, const char *owner,
                           int64_t until, int64_t now)
{
  nh_pg_args_reset(a);
  KEY(endpoint); KEY(session); KEY(owner); I64(until); I64(now);
  return NH_PGQ_LOCK;
}

nh_pgqop_t nh_pgqargs_unlock(nh_pg_args_t *a, const char *endpoint, const char *session, const char *owner)
{
  nh_pg_args_reset(a);
  KEY(endpoint); KEY(session); KEY(owner);
  return NH_PGQ_UNLOCK;
}

nh_pgqop_t nh_pgqargs_held(nh_pg_args_t *a, const char *endpoint, const char *session, const char *owner)
{
  nh_pgqargs_unlock(a, endpoint, session, owner);
  return NH_PGQ_HELD;
}

nh_pgqop_t nh_pgqargs_unlock_owned(nh_pg_args_t *a, const char *endpoint, const char *session, const char *owner)
{
  nh_pgqargs_unlock(a, endpoint, session, owner);
  return NH_PGQ_UNLOCK_OWNED;
}

nh_pgqop_t nh_pgqargs_notify(nh_pg_args_t *a, const char *endpoint)
{
  nh_pg_args_reset(a);
  KEY(endpoint);
  return NH_PGQ_NOTIFY;
}

nh_pgqop_t nh_pgqargs_renew(nh_pg_args_t *a, const char *endpoint, const char *session, const char *owner,
                            int64_t until)
{
  nh_pgqargs_unlock(a, endpoint, session, owner);
  I64(until);
  return NH_PGQ_RENEW;
}

nh_pgqop_t nh_pgqargs_delivered(nh_pg_args_t *a, int64_t seq) { return one_seq(a, NH_PGQ_DELIVERED, seq); }
nh_pgqop_t nh_pgqargs_delete(nh_pg_args_t *a, int64_t seq) { return one_seq(a, NH_PGQ_DELETE, seq); }
nh_pgqop_t nh_pgqargs_released(nh_pg_args_t *a, int64_t seq) { return one_seq(a, NH_PGQ_RELEASED, seq); }

nh_pgqop_t nh_pgqargs_dead(nh_pg_args_t *a, int64_t seq, const char *reason, int64_t at)
{
  one_seq(a, NH_PGQ_DEAD, seq);
  TXT(reason); I64(at);
  return NH_PGQ_DEAD;
}

nh_pgqop_t nh_pgqargs_release_lock(nh_pg_args_t *a, const char *endpoint, const char *session, int64_t until,
                                   const char *owner)
{
  nh_pg_args_reset(a);
  KEY(endpoint); KEY(session); I64(until); KEY(owner);
  return NH_PGQ_RELEASE_LOCK;
}

nh_pgqop_t nh_pgqargs_owners(nh_pg_args_t *a)
{
  nh_pg_args_reset(a);
  return NH_PGQ_OWNERS;
}

nh_pgqop_t nh_pgqargs_row(nh_pg_args_t *a, int64_t seq, const char *endpoint, const char *session)
{
  one_seq(a, NH_PGQ_ROW, seq);
  KEY(endpoint); KEY(session);
  return NH_PGQ_ROW;
}

nh_pgqop_t nh_pgqargs_drop_owner(nh_pg_args_t *a, const char *owner) { return one_key(a, NH_PGQ_DROP_OWNER, owner); }

nh_pgqop_t nh_pgqargs_session_next(nh_pg_args_t *a, const char *endpoint, const char *session, int64_t after_seq,
                                   int max)
{
  nh_pg_args_reset(a);
  KEY(endpoint); KEY(session); I64(after_seq); I64(max > 0 ? max : 0);
  return NH_PGQ_SESSION_NEXT;
}

/* ---------------------------------------------------------------- readers */

void nh_pgq_row(const PGresult *r, int row, const char *endpoint, nh_msg_t *m)
{
  memset(m, 0, sizeof *m);
  m->seq = nh_pg_col_i64(r, row, 0);
  m->endpoint = nh_xstrdup(endpoint);
  m->session_id = nh_pg_col_strdup(r, row, 1);
  m->message_id = nh_pg_col_strdup(r, row, 2);
  m->event_id = nh_pg_col_strdup(r, row, 3);
  m->event_type = nh_pg_col_strdup(r, row, 4);
  m->type = nh_msg_type_parse(nh_pg_col_text(r, row, 5));
  m->correlation_id = nh_pg_col_strdup(r, row, 6);
  m->originating_message_id = nh_pg_col_strdup(r, row, 7);
  m->parent_message_id = nh_pg_col_strdup(r, row, 8);
  m->from = nh_pg_col_strdup(r, row, 9);
  m->retry_count = (int)nh_pg_col_i64(r, row, 10);
  m->delivery_count = (int)nh_pg_col_i64(r, row, 11) + 1;
  m->enqueued_at = nh_pg_col_i64(r, row, 12);
  m->body = nh_pg_col_body(r, row, 14, &m->body_len);
  m->error_text = nh_pg_col_strdup(r, row, 15);
  m->error_type = nh_pg_col_strdup(r, row, 16);
  m->release_count = (int)nh_pg_col_i64(r, row, 17);
  m->reply_to = nh_pg_col_strdup(r, row, 18);
  m->traceparent = nh_pg_col_strdup(r, row, 19);
  m->tracestate = nh_pg_col_strdup(r, row, 20);
}

int nh_pgq_visible(const PGresult *r, int row, int64_t now) { return nh_pg_col_i64(r, row, 13) <= now; }

/* ---------------------------------------------------------------- executor */

int nh_pgq_run(nh_pg_db_t *db, nh_pgqop_t op, nh_pg_args_t *args, PGresult **res, nh_error_t *err)
{
  return nh_pg_db_run_op(db, &nh_pgq_optab, (int)op, args, res, err);
}

int nh_pgq_batch_add(nh_pg_db_t *db, nh_pgqop_t op, nh_pg_args_t *args, nh_pg_result_cb cb, void *data,
                     nh_error_t *err)
{
  return nh_pg_batch_add_op(db, &nh_pgq_optab, (int)op, args, cb, data, err);
}

int nh_pgq_batch_add_copy(nh_pg_db_t *db, const nh_msg_t *m, const char *endpoint, const char *event_id,
                          nh_error_t *err)
{
  nh_pg_args_t a;
  int rc = nh_pgq_batch_add(db, nh_pgqargs_insert(&a, m, endpoint, event_id), &a, NULL, NULL, err);
  return rc ? rc : nh_pgq_batch_add(db, nh_pgqargs_notify(&a, endpoint), &a, NULL, NULL, err);
}
