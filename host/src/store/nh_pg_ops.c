/* The PostgreSQL store's row statements, their argument builders and their row readers.
 * Each statement is its sqlite twin's (nh_store.c stmt_sql, nh_store_rows.c,
 * nh_store_query.c) in PostgreSQL's dialect; what differs, and why:
 * - INSERT OR REPLACE and upserts are INSERT ... ON CONFLICT (the primary key) DO UPDATE
 *   of every column; INSERT OR IGNORE is ON CONFLICT DO NOTHING, and since sqlite's IGNORE
 *   also skips a row with a NULL where NOT NULL is declared, those inserts skip it too.
 * - sqlite's LIMIT without ORDER BY returns rows in the index's order; here that order is
 *   spelled out (it is the same index), so both stores return the same row.
 * - Reading then deleting (oppending_take) is one DELETE ... RETURNING, and a claim of a
 *   published MessageId one upsert that also says what it found. */
#include "nh_pg_ops.h"
#include "nh_store_int.h"
#include "core/nh_util.h"

#include <arpa/inet.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The audit columns in the order nh_pgrow_audit reads them: the sqlite store's. */
#define AUDIT_COLS NH_AUDIT_COLS

/* An audit row (alias a) that retention may delete: resolved (Completed, Skipped,
 * Unsupported), last changed before `before`, no operator request waiting for it. The
 * deletes and the dry run's count share it, so a dry run counts what a purge deletes. */
#define PURGEABLE(before)                                                            \
  "status IN ('Completed', 'Skipped', 'Unsupported') AND updated_at < " before          \
  " AND NOT EXISTS (SELECT 1 FROM operator_pending p WHERE p.event_id = a.event_id"     \
  " AND p.endpoint = a.endpoint)"

/* The columns an audit put writes, and what it does to a row already there. */
#define AUDIT_PUT_COLS                                                                            \
  "endpoint, event_id, session_id, event_type, status, sub_status, error_text, error_type,"         \
  " handoff_reason, external_job_id, expected_by, message_id, correlation_id, originating_message_id," \
  " retry_count, payload, result, created_at, updated_at, error_stack, fail_group, attempts, queue_time_ms," \
  " processing_time_ms, overdue_at, traceparent"
#define AUDIT_PUT_UPSERT \
  " ON CONFLICT (event_id, endpoint) DO UPDATE SET session_id = excluded.session_id," \
  " event_type = excluded.event_type, status = excluded.status, sub_status = excluded.sub_status," \
  " error_text = excluded.error_text, error_type = excluded.error_type, handoff_reason = excluded.handoff_reason," \
  " external_job_id = excluded.external_job_id, expected_by = excluded.expected_by," \
  " message_id = excluded.message_id, correlation_id = excluded.correlation_id," \
  " originating_message_id = excluded.originating_message_id, retry_count = excluded.retry_count," \
  " payload = excluded.payload, result = excluded.result, updated_at = excluded.updated_at," \
  " error_stack = excluded.error_stack, fail_group = excluded.fail_group, attempts = excluded.attempts," \
  " queue_time_ms = excluded.queue_time_ms, processing_time_ms = excluded.processing_time_ms," \
  " overdue_at = excluded.overdue_at, traceparent = excluded.traceparent"

#define HISTORY_COLS \
  "endpoint, event_id, message_id, message_type, status, detail, at, error_text, error_type, error_stack," \
  " previous_payload"

static const nh_pg_opdef_t ops[NH_PGOP_COUNT] = {
  [NH_PGOP_AUDIT_PUT] = { "nh_audit_put",
    "INSERT INTO audit(" AUDIT_PUT_COLS ")"
    " VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17,$18,$18,$19,$20,$21,$22,$23,$24,$25)"
    AUDIT_PUT_UPSERT, 25, .set = NH_PGOP_AUDIT_PUT_SET, .rel = "audit", .key = 2 },
  [NH_PGOP_AUDIT_GET] = { "nh_audit_get",
    "SELECT " AUDIT_COLS " FROM audit WHERE endpoint = $1 AND event_id = $2", 2 },
  /* sqlite returns the first row of the primary key (event_id, endpoint) */
  [NH_PGOP_AUDIT_FIND] = { "nh_audit_find",
    "SELECT " AUDIT_COLS " FROM audit WHERE event_id = $1 ORDER BY endpoint LIMIT 1", 1 },
  /* $2 || $3: the upper end of the prefix's range (nh_pgargs_audit_find_prefix) */
  [NH_PGOP_AUDIT_FIND_PREFIX] = { "nh_audit_find_prefix",
    "SELECT " AUDIT_COLS " FROM audit WHERE event_id >= $1::text AND event_id < $2::text || $3::text"
    " ORDER BY event_id, endpoint LIMIT 2", 3 },
  [NH_PGOP_AUDIT_FIND_PREFIX_OPEN] = { "nh_audit_find_prefix_open",
    "SELECT " AUDIT_COLS " FROM audit WHERE event_id >= $1::text ORDER BY event_id, endpoint LIMIT 2", 1 },
  [NH_PGOP_AUDIT_RETEXT] = { "nh_audit_retext",
    "UPDATE audit SET error_text = $3 WHERE endpoint = $1 AND session_id = $2 AND status = 'Deferred'", 3 },
  /* seq breaks ties as sqlite's rowid does in the partial index audit_handoff_due */
  [NH_PGOP_HANDOFFS_DUE] = { "nh_handoffs_due",
    "SELECT " AUDIT_COLS " FROM audit WHERE status = 'Pending' AND sub_status = 'Handoff'"
    " AND expected_by IS NOT NULL AND overdue_at IS NULL AND expected_by < $1 ORDER BY expected_by, seq LIMIT $2",
    2 },
  [NH_PGOP_HANDOFF_FLAG_OVERDUE] = { "nh_handoff_flag_overdue",
    "UPDATE audit SET overdue_at = $3 WHERE endpoint = $1 AND event_id = $2"
    " AND overdue_at IS NULL AND status = 'Pending' AND sub_status = 'Handoff'", 3 },
  [NH_PGOP_HISTORY_ADD] = { "nh_history_add",
    "INSERT INTO history(" HISTORY_COLS ") VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11)", 11,
    .set = NH_PGOP_HISTORY_ADD_SET, .rel = "history" },
  [NH_PGOP_HISTORY_LIST] = { "nh_history_list",
    "SELECT at, message_id, message_type, status, detail, error_text, error_type, error_stack, previous_payload"
    " FROM history WHERE endpoint = $1 AND event_id = $2 ORDER BY id", 2 },
  [NH_PGOP_SESSION_GET] = { "nh_session_get",
    "SELECT blocked_by, draining, retry_due, next_park_seq FROM sessions WHERE endpoint = $1 AND session_id = $2",
    2, .set = NH_PGOP_SESSION_GET_SET },
  [NH_PGOP_SESSION_PUT] = { "nh_session_put",
    "INSERT INTO sessions(endpoint, session_id, blocked_by, draining, retry_due, next_park_seq)"
    " VALUES ($1,$2,$3,$4,$5,$6) ON CONFLICT (endpoint, session_id) DO UPDATE SET blocked_by = excluded.blocked_by,"
    " draining = excluded.draining, retry_due = excluded.retry_due, next_park_seq = excluded.next_park_seq", 6 },
  [NH_PGOP_SESSION_DEL] = { "nh_session_del", "DELETE FROM sessions WHERE endpoint = $1 AND session_id = $2", 2 },
  /* session_id breaks ties as the primary key does behind sqlite's sessions_retry index */
  [NH_PGOP_SESSIONS_RETRY_DUE] = { "nh_sessions_retry_due",
    "SELECT session_id, blocked_by, draining, retry_due, next_park_seq FROM sessions WHERE endpoint = $1"
    " AND blocked_by IS NOT NULL AND retry_due IS NOT NULL AND retry_due <= $2 ORDER BY retry_due, session_id"
    " LIMIT $3", 3 },
  [NH_PGOP_SESSIONS_DRAINING] = { "nh_sessions_draining",
    "SELECT session_id, blocked_by, draining, retry_due, next_park_seq FROM sessions WHERE endpoint = $1"
    " AND blocked_by IS NULL AND draining = 1 AND session_id > $2 ORDER BY session_id LIMIT $3", 3 },
  [NH_PGOP_SESSIONS_LIST] = { "nh_sessions_list",
    "SELECT session_id, blocked_by, draining, retry_due, next_park_seq, endpoint FROM sessions"
    " WHERE (NOT $1::boolean OR blocked_by IS NOT NULL) ORDER BY endpoint, session_id", 1 },
  [NH_PGOP_SESSIONS_LIST_ENDPOINT] = { "nh_sessions_list_endpoint",
    "SELECT session_id, blocked_by, draining, retry_due, next_park_seq, endpoint FROM sessions"
    " WHERE endpoint = $1 AND (NOT $2::boolean OR blocked_by IS NOT NULL) ORDER BY endpoint, session_id", 2 },
  [NH_PGOP_PARK] = { "nh_park",
    "INSERT INTO parked(endpoint, session_id, park_seq, message_id, event_id, event_type, message_type,"
    " correlation_id, originating_message_id, parent_message_id, from_, retry_count, enqueued_at, body,"
    " error_text, error_type, reply_to, traceparent, tracestate)"
    " VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17,$18,$19)", 19 },
  [NH_PGOP_PARKED_HEAD] = { "nh_parked_head",
    "SELECT park_seq, message_id, event_id, event_type, message_type, correlation_id, originating_message_id,"
    " parent_message_id, from_, retry_count, enqueued_at, body, error_text, error_type, reply_to, traceparent,"
    " tracestate FROM parked WHERE endpoint = $1 AND session_id = $2 ORDER BY park_seq LIMIT 1", 2 },
  [NH_PGOP_PARKED_DEL] = { "nh_parked_del",
    "DELETE FROM parked WHERE endpoint = $1 AND session_id = $2 AND park_seq = $3", 3 },
  [NH_PGOP_PARKED_DEL_EVENT] = { "nh_parked_del_event", "DELETE FROM parked WHERE endpoint = $1 AND event_id = $2",
    2 },
  [NH_PGOP_PARKED_COUNT] = { "nh_parked_count",
    "SELECT count(*) FROM parked WHERE endpoint = $1 AND session_id = $2", 2 },
  [NH_PGOP_PARKED_ANY] = { "nh_parked_any",
    "SELECT true FROM parked WHERE endpoint = $1 AND session_id = $2 LIMIT 1", 2 },
  [NH_PGOP_INBOX_HAS] = { "nh_inbox_has", "SELECT true FROM inbox WHERE endpoint = $1 AND message_id = $2", 2 },
  [NH_PGOP_INBOX_ADD] = { "nh_inbox_add",
    "INSERT INTO inbox(endpoint, message_id, at) SELECT $1::text, $2::text, $3::bigint"
    " WHERE $1::text IS NOT NULL AND $2::text IS NOT NULL ON CONFLICT DO NOTHING", 3 },
  /* a delivery's recorded outcome is a history row from its message (nh_store.h) */
  [NH_PGOP_PROCESSED_HAS] = { "nh_processed_has",
    "SELECT true FROM history WHERE event_id = $3 AND endpoint = $1 AND message_id = $2"
    " AND status NOT IN ('Requested', 'Cancelled') LIMIT 1", 3 },
  [NH_PGOP_OPPENDING_ADD] = { "nh_oppending_add",
    "INSERT INTO operator_pending(message_id, endpoint, event_id, action, expected_status, at)"
    " VALUES ($1,$2,$3,$4,$5,$6) ON CONFLICT (message_id) DO UPDATE SET endpoint = excluded.endpoint,"
    " event_id = excluded.event_id, action = excluded.action, expected_status = excluded.expected_status,"
    " at = excluded.at", 6 },
  [NH_PGOP_OPPENDING_HAS] = { "nh_oppending_has",
    "SELECT true FROM operator_pending WHERE event_id = $2 AND endpoint = $1 LIMIT 1", 2 },
  [NH_PGOP_OPPENDING_TAKE] = { "nh_oppending_take",
    "DELETE FROM operator_pending WHERE message_id = $1 RETURNING expected_status", 1 },
  [NH_PGOP_OPLOG_ADD] = { "nh_oplog_add",
    "INSERT INTO operator_log(at, actor, action, endpoint, event_id, session_id, detail)"
    " VALUES ($1,$2,$3,$4,$5,$6,$7)", 7 },
  [NH_PGOP_PUBLISHED_SEEN] = { "nh_published_seen", "SELECT at FROM published WHERE message_id = $1", 1 },
  /* Claims unless claimed since $3; answers (the claim's time or NULL, the time it found
   * or NULL). `prev` reads the snapshot the statement started with: a claim another host
   * committed after that (the upsert waited for it, then left it) shows as two NULLs. */
  [NH_PGOP_PUBLISHED_CLAIM] = { "nh_published_claim",
    "WITH prev AS (SELECT at FROM published WHERE message_id = $1),"
    " claim AS (INSERT INTO published(message_id, at) VALUES ($1, $2) ON CONFLICT (message_id)"
    "  DO UPDATE SET at = excluded.at WHERE published.at < $3 RETURNING at)"
    " SELECT (SELECT at FROM claim), (SELECT at FROM prev)", 3 },
  [NH_PGOP_HOST_PUT] = { "nh_host_put",
    "INSERT INTO hosts(owner, endpoints, started_at, seen_at) VALUES ($1,$2,$3,$4) ON CONFLICT (owner)"
    " DO UPDATE SET endpoints = excluded.endpoints, started_at = excluded.started_at, seen_at = excluded.seen_at",
    4 },
  [NH_PGOP_HOST_DEL] = { "nh_host_del", "DELETE FROM hosts WHERE owner = $1", 1 },
  [NH_PGOP_HOSTS_SERVING] = { "nh_hosts_serving",
    "SELECT owner FROM hosts WHERE seen_at >= $2 AND strpos(endpoints, ',' || $1::text || ',') > 0", 2 },
  [NH_PGOP_BULK_GET] = { "nh_bulk_get", "SELECT cutoff, started_at, owner, queued FROM bulk_runs WHERE key = $1", 1 },
  [NH_PGOP_BULK_PUT] = { "nh_bulk_put",
    "INSERT INTO bulk_runs(key, cutoff, started_at, owner, queued) VALUES ($1,$2,$3,$4,$5) ON CONFLICT (key)"
    " DO UPDATE SET cutoff = excluded.cutoff, started_at = excluded.started_at, owner = excluded.owner,"
    " queued = excluded.queued", 5 },
  [NH_PGOP_BULK_DONE] = { "nh_bulk_done", "DELETE FROM bulk_runs WHERE key = $1", 1 },
  [NH_PGOP_PARKED_WINDOW] = { "nh_parked_window",
    "SELECT park_seq, message_id, event_id, event_type, message_type, correlation_id, originating_message_id,"
    " parent_message_id, from_, retry_count, enqueued_at, body, error_text, error_type, reply_to, traceparent,"
    " tracestate FROM parked WHERE endpoint = $1 AND session_id = $2 AND park_seq > $3 ORDER BY park_seq"
    " LIMIT $4", 4 },
  [NH_PGOP_PARKED_COUNT_EVENT] = { "nh_parked_count_event",
    "SELECT count(*) FROM parked WHERE endpoint = $1 AND event_id = $2", 2 },
  [NH_PGOP_OPPENDING_GET] = { "nh_oppending_get",
    "SELECT expected_status FROM operator_pending WHERE message_id = $1", 1 },
  /* the index audit_status (status, endpoint, updated_at) finds them; seq is insertion
   * order, as sqlite's rowid is for nh_store_audit_list */
  [NH_PGOP_HANDOFFS_PENDING] = { "nh_handoffs_pending",
    "SELECT " AUDIT_COLS " FROM audit WHERE status = 'Pending' AND endpoint = $1 AND sub_status = 'Handoff'"
    " ORDER BY seq", 1 },
  /* a publish's claim in the transaction that queues it: taken since $3, the cast fails
   * (the count is part of the text, or PostgreSQL would fold the cast and fail always) */
  [NH_PGOP_PUBLISHED_CLAIM_OR_FAIL] = { "nh_published_claim_or_fail",
    "WITH claim AS (INSERT INTO published(message_id, at) VALUES ($1, $2) ON CONFLICT (message_id)"
    "  DO UPDATE SET at = excluded.at WHERE published.at < $3 RETURNING 1)"
    " SELECT CASE WHEN count(*) = 0 THEN ('MessageId already published: ' || $1::text ||"
    " repeat(' ', count(*)::int))::int ELSE 1 END FROM claim", 3 },
  /* the flag and its history row together: of two hosts scanning at once, one flags it */
  [NH_PGOP_HANDOFF_OVERDUE_MARK] = { "nh_handoff_overdue_mark",
    "WITH f AS (UPDATE audit SET overdue_at = $3 WHERE endpoint = $1 AND event_id = $2"
    "  AND overdue_at IS NULL AND status = 'Pending' AND sub_status = 'Handoff' RETURNING endpoint, event_id, message_id)"
    " INSERT INTO history(endpoint, event_id, message_id, message_type, status, detail, at)"
    " SELECT endpoint, event_id, message_id, 'HandoffOverdue', 'Pending', $4, $3 FROM f RETURNING 1", 4 },
  /* resolved: nothing left for anyone to do (nh_store_query.c says which); rows another
   * host is deleting are skipped, not waited for */
  [NH_PGOP_PURGE_RESOLVED] = { "nh_purge_resolved",
    "WITH pick AS (SELECT endpoint, event_id FROM audit a WHERE " PURGEABLE("$1")
    "  ORDER BY updated_at LIMIT $2 FOR UPDATE SKIP LOCKED),"
    " h AS (DELETE FROM history x USING pick WHERE x.event_id = pick.event_id AND x.endpoint = pick.endpoint"
    "  RETURNING 1),"
    " d AS (DELETE FROM audit x USING pick WHERE x.event_id = pick.event_id AND x.endpoint = pick.endpoint"
    "  RETURNING 1)"
    " SELECT (SELECT count(*) FROM d), (SELECT count(*) FROM h)", 2 },
  [NH_PGOP_PURGE_PROCESSED] = { "nh_purge_processed",
    "WITH d AS (DELETE FROM processed WHERE ctid IN (SELECT ctid FROM processed WHERE at < $1 LIMIT $2) RETURNING 1)"
    " SELECT count(*) FROM d", 2 },
  [NH_PGOP_PURGE_PUBLISHED] = { "nh_purge_published",
    "WITH d AS (DELETE FROM published WHERE ctid IN (SELECT ctid FROM published WHERE at < $1 LIMIT $2) RETURNING 1)"
    " SELECT count(*) FROM d", 2 },
  [NH_PGOP_PURGE_INBOX] = { "nh_purge_inbox",
    "WITH d AS (DELETE FROM inbox WHERE ctid IN (SELECT ctid FROM inbox WHERE at < $1 LIMIT $2) RETURNING 1)"
    " SELECT count(*) FROM d", 2 },
  /* `purge --dry-run`: what PURGE_RESOLVED and PURGE_INBOX would delete in all, by the
   * same conditions (PURGEABLE), none locked */
  [NH_PGOP_PURGE_COUNT] = { "nh_purge_count",
    "SELECT (SELECT count(*) FROM audit a WHERE " PURGEABLE("$1") "),"
    " (SELECT count(*) FROM inbox WHERE at < $2)", 2 },
  /* sqlite's three counts (nh_store_console.c), by the same indexes: sessions' key
   * starts with the endpoint, audit_status is (endpoint, status), parked's key too */
  [NH_PGOP_ENDPOINT_GAUGES] = { "nh_endpoint_gauges",
    "SELECT (SELECT count(*) FROM sessions WHERE endpoint = $1 AND blocked_by IS NOT NULL),"
    " (SELECT count(*) FROM audit WHERE endpoint = $1 AND status = 'Pending' AND sub_status = 'Handoff'),"
    " (SELECT count(*) FROM parked WHERE endpoint = $1)", 1 },
  /* The set twins: the rows in the order given (ORDINALITY), so that seq and id follow
   * the write list as the row statements' do. */
  [NH_PGOP_AUDIT_PUT_SET] = { "nh_audit_put_set",
    "INSERT INTO audit(" AUDIT_PUT_COLS ")"
    " SELECT c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11::bigint, c12, c13, c14, c15::bigint, c16, c17,"
    " c18::bigint, c18::bigint, c19, c20, c21::bigint, c22::bigint, c23::bigint, c24::bigint, c25"
    " FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[],"
    " $9::text[], $10::text[], $11::text[], $12::text[], $13::text[], $14::text[], $15::text[], $16::bytea[],"
    " $17::bytea[], $18::text[], $19::text[], $20::text[], $21::text[], $22::text[], $23::text[], $24::text[],"
    " $25::text[]) WITH ORDINALITY AS u(c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14, c15, c16,"
    " c17, c18, c19, c20, c21, c22, c23, c24, c25, o) ORDER BY o" AUDIT_PUT_UPSERT, 25,
    .types = "tttttttttttttttbbtttttttt" },
  [NH_PGOP_HISTORY_ADD_SET] = { "nh_history_add_set",
    "INSERT INTO history(" HISTORY_COLS ")"
    " SELECT c1, c2, c3, c4, c5, c6, c7::bigint, c8, c9, c10, c11"
    " FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[],"
    " $9::text[], $10::text[], $11::bytea[]) WITH ORDINALITY AS u(c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, o)"
    " ORDER BY o", 11, .types = "ttttttttttb" },
  /* A read's twin answers each row's ordinal first (nh_pg_set.h). Each row a lookup of
   * the primary key, whatever the statistics say: a LATERAL subquery with a LIMIT is never
   * flattened into a join, which a plan made while the table was small could run as a scan
   * of every session (thousands, in an outage) per fill. */
  [NH_PGOP_SESSION_GET_SET] = { "nh_session_get_set",
    "SELECT u.o, s.blocked_by, s.draining, s.retry_due, s.next_park_seq"
    " FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS u(e, k, o)"
    " CROSS JOIN LATERAL (SELECT blocked_by, draining, retry_due, next_park_seq FROM sessions"
    "  WHERE endpoint = u.e AND session_id = u.k LIMIT 1) s ORDER BY u.o", 2, .types = "tt" },
};

const nh_pg_optab_t nh_pg_store_optab = { "store", 3, ops, NH_PGOP_COUNT };   /* "nh_" */

static int known(nh_pgop_t op) { return (unsigned)op < NH_PGOP_COUNT; }
const char *nh_pgop_name(nh_pgop_t op) { return known(op) ? ops[op].name : "nh_unknown"; }
const char *nh_pgop_sql(nh_pgop_t op) { return known(op) ? ops[op].sql : NULL; }
int nh_pgop_nparams(nh_pgop_t op) { return known(op) ? ops[op].nparams : 0; }

/* ---------------------------------------------------------------- arguments */

void nh_pg_args_reset(nh_pg_args_t *a)
{
  a->n = 0;
  a->nowned = 0;
}

void nh_pg_args_release(nh_pg_args_t *a)
{
  for (int i = 0; i < a->nowned; i++) free(a->owned[i]);
  a->nowned = 0;
}

/* A builder with more parameters than the struct holds is a bug of this file. */
static int slot(nh_pg_args_t *a)
{
  if (a->n >= NH_PG_MAX_ARGS) {
    fprintf(stderr, "nh_pg_args: more than %d parameters\n", NH_PG_MAX_ARGS);
    abort();
  }
  return a->n++;
}

static void put_text(nh_pg_args_t *a, const char *s)
{
  int i = slot(a);
  a->values[i] = s;
  a->lengths[i] = 0;
  a->formats[i] = 0;
}

/* ---- text that is not UTF-8
 *
 * sqlite keeps any bytes in a text column; PostgreSQL's text refuses what is not UTF-8
 * (SQLSTATE 22021), and with it the whole batch. Such text does reach the store: a Lua
 * error made from a message body, a handler's error fields, the ids of broker messages.
 * So every text parameter that is not UTF-8 is sent cleaned, each byte that does not
 * start a well-formed sequence (a lone 0xFF; each byte of a sequence cut short, of an
 * overlong form, of a surrogate, of a code point past U+10FFFF) replaced, the valid
 * sequences around it kept as they are:
 *
 * - in prose (error texts, types and stacks, details, statuses) by U+FFFD, what
 *   any lossy decoder shows (nh_pg_args_text);
 * - in ids and names the store compares (endpoint, event, session and message ids, the
 *   other ids of a message, blocked_by, owners, keys) by the four characters \xFF
 *   (nh_pg_args_key). U+FFFD there would make one key of ids that differ only in bytes
 *   that are not UTF-8, and such ids are not exotic: an AMQP message-id may be binary
 *   (nh_amqp_msg.c takes its bytes as they are), and random binary ids are mostly such
 *   bytes, so among many messages some pairs would meet, and the inbox would drop the
 *   second as a redelivery of the first, silently. Escaped, two ids still meet only if
 *   a valid id spells "\xFF" itself where the other has the byte: a producer would have
 *   to pick its ids so, and a producer can already reuse an id outright. Refusing such
 *   ids instead would fail, on every attempt, the batch that carries the message, and
 *   the builders have no way to say why (the executor sends what they give it).
 *   Reads escape their keys the same way, so a row is found by the id it was written with.
 *
 * Valid text, the common path, is sent from the caller's pointer as before: no copy, no
 * allocation, one pass over its bytes. A cleaned copy belongs to the args until they are
 * sent: nh_pg_db_run and nh_pg_batch_add release it (nh_pg_args_release), sent or not. */

static int utf8_char(const unsigned char *s, size_t left, uint32_t *cp);

/* The length of the well-formed sequence at p, 0 if none starts there. A C string's NUL
 * is no continuation byte: a sequence cut short by it fails there, nothing past it is read. */
static int seq_len(const unsigned char *p)
{
  uint32_t cp;
  return *p < 0x80 ? 1 : utf8_char(p, 4, &cp);
}

/* The first byte of s that does not start a well-formed sequence, or NULL. */
static const char *utf8_bad(const char *s)
{
  const unsigned char *p = (const unsigned char *)s;
  for (int n; *p; p += n)
    if ((n = seq_len(p)) == 0) return (const char *)p;
  return NULL;
}

/* s cleaned from its first bad byte on (see above): a copy the args own. */
static const char *clean(nh_pg_args_t *a, const char *s, const char *bad, int key)
{
  size_t head = (size_t)(bad - s);
  char *out = nh_xmalloc(head + strlen(bad) * 4 + 1), *o = out + head;   /* at most 4 bytes for 1 */
  memcpy(out, s, head);
  for (const unsigned char *p = (const unsigned char *)bad; *p;) {
    int n = seq_len(p);
    if (n) {
      memcpy(o, p, (size_t)n);
      o += n;
      p += n;
    } else if (key) {
      static const char digits[] = "0123456789ABCDEF";
      *o++ = '\\';
      *o++ = 'x';
      *o++ = digits[*p >> 4];
      *o++ = digits[*p++ & 0xF];
    } else {
      memcpy(o, "\xEF\xBF\xBD", 3);   /* U+FFFD */
      o += 3;
      p++;
    }
  }
  *o = '\0';
  a->owned[a->nowned++] = out;   /* at most one per parameter: slot() bounds both */
  return out;
}

void nh_pg_args_text(nh_pg_args_t *a, const char *s)
{
  const char *bad = s ? utf8_bad(s) : NULL;
  put_text(a, bad ? clean(a, s, bad, 0) : s);
}

void nh_pg_args_key(nh_pg_args_t *a, const char *s)
{
  const char *bad = s ? utf8_bad(s) : NULL;
  put_text(a, bad ? clean(a, s, bad, 1) : s);
}

void nh_pg_args_bytes(nh_pg_args_t *a, const char *p, size_t len)
{
  int i = slot(a);
  a->values[i] = p;
  a->lengths[i] = p ? (int)len : 0;
  a->formats[i] = p ? 1 : 0;
}

void nh_pg_args_i64(nh_pg_args_t *a, int64_t v)
{
  int i = slot(a);
  snprintf(a->num[i], sizeof a->num[i], "%" PRId64, v);
  a->values[i] = a->num[i];
  a->lengths[i] = 0;
  a->formats[i] = 0;
}

void nh_pg_args_null(nh_pg_args_t *a) { nh_pg_args_text(a, NULL); }

/* 0 stands for "none" in the store's structs, NULL in its columns */
static void i64_or_null(nh_pg_args_t *a, int64_t v)
{
  if (v) nh_pg_args_i64(a, v);
  else nh_pg_args_null(a);
}

/* prose, and ids or names the store compares (see "text that is not UTF-8" above) */
#define TXT(v) nh_pg_args_text(a, v)
#define KEY(v) nh_pg_args_key(a, v)
#define I64(v) nh_pg_args_i64(a, v)

/* Every caller of these gives them keys. */
static nh_pgop_t two(nh_pg_args_t *a, nh_pgop_t op, const char *x, const char *y)
{
  nh_pg_args_reset(a);
  KEY(x);
  KEY(y);
  return op;
}

static nh_pgop_t one(nh_pg_args_t *a, nh_pgop_t op, const char *x)
{
  nh_pg_args_reset(a);
  KEY(x);
  return op;
}

nh_pgop_t nh_pgargs_audit_put(nh_pg_args_t *a, const nh_audit_t *au)
{
  nh_pg_args_reset(a);
  KEY(au->endpoint); KEY(au->event_id); KEY(au->session_id); TXT(au->event_type);
  TXT(au->status); TXT(au->sub_status); TXT(au->error_text); TXT(au->error_type);
  TXT(au->handoff_reason); KEY(au->external_job_id);
  i64_or_null(a, au->expected_by);
  KEY(au->message_id); KEY(au->correlation_id); KEY(au->originating_message_id);
  I64(au->retry_count);
  nh_pg_args_bytes(a, au->payload, nh_audit_payload_len(au));
  /* a hand-off's completion body: bytes, as the payload; a C string in nh_audit_t */
  nh_pg_args_bytes(a, au->result, au->result ? strlen(au->result) : 0);
  I64(au->updated_at ? au->updated_at : nh_time_now_ms());
  TXT(au->error_stack);
  if (nh_audit_unresolved_failure(au->status)) {
    nh_failgroup_id(au->endpoint, au->error_type, au->error_text, a->group);
    TXT(a->group);
  } else {
    nh_pg_args_null(a);
  }
  I64(au->attempts);
  if (au->queue_time_ms >= 0) I64(au->queue_time_ms); else nh_pg_args_null(a);
  if (au->processing_time_ms >= 0) I64(au->processing_time_ms); else nh_pg_args_null(a);
  i64_or_null(a, au->overdue_at);
  TXT(au->traceparent);
  return NH_PGOP_AUDIT_PUT;
}

nh_pgop_t nh_pgargs_audit_get(nh_pg_args_t *a, const char *endpoint, const char *event_id)
{
  return two(a, NH_PGOP_AUDIT_GET, endpoint, event_id);
}

nh_pgop_t nh_pgargs_audit_find(nh_pg_args_t *a, const char *event_id)
{
  return one(a, NH_PGOP_AUDIT_FIND, event_id);
}

/* The length of the UTF-8 sequence at s (at most `left` bytes), and its code point;
 * 0 if it is not well-formed (overlong, a surrogate, past U+10FFFF, cut short). */
static int utf8_char(const unsigned char *s, size_t left, uint32_t *cp)
{
  static const uint32_t min[5] = { 0, 0, 0x80, 0x800, 0x10000 };
  int n = s[0] < 0x80 ? 1 : (s[0] & 0xE0) == 0xC0 ? 2 : (s[0] & 0xF0) == 0xE0 ? 3 : (s[0] & 0xF8) == 0xF0 ? 4 : 0;
  if (n == 0 || (size_t)n > left) return 0;
  uint32_t c = n == 1 ? s[0] : s[0] & (0x7F >> n);
  for (int i = 1; i < n; i++) {
    if ((s[i] & 0xC0) != 0x80) return 0;
    c = c << 6 | (s[i] & 0x3F);
  }
  if (c < min[n] || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return 0;
  *cp = c;
  return n;
}

int nh_pg_utf8_valid(const char *s, size_t len)
{
  const unsigned char *p = (const unsigned char *)s;
  uint32_t cp;
  for (size_t i = 0; i < len;) {
    if (p[i] == 0) return 0;
    int n = utf8_char(p + i, len - i, &cp);
    if (!n) return 0;
    i += (size_t)n;
  }
  return 1;
}

static int utf8_put(uint32_t c, char out[5])
{
  int n = c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
  static const unsigned char lead[5] = { 0, 0, 0xC0, 0xE0, 0xF0 };
  for (int i = n - 1; i > 0; i--) {
    out[i] = (char)(0x80 | (c & 0x3F));
    c >>= 6;
  }
  out[0] = (char)(lead[n] | c);
  out[n] = '\0';
  return n;
}

/* sqlite's range is [prefix, prefix || x'ff'): no UTF-8 byte is 0xFF, so that is exactly
 * the ids starting with the prefix. PostgreSQL's text cannot hold 0xFF; in byte order the
 * least string above every id with the prefix is the prefix cut after its last character
 * below U+10FFFF, that character incremented (past the surrogates, which no text holds).
 * A prefix of U+10FFFF only has nothing above its range: whatever is at or after it starts
 * with it, and the open range is exact. */
nh_pgop_t nh_pgargs_audit_find_prefix(nh_pg_args_t *a, const char *prefix)
{
  nh_pg_args_reset(a);
  KEY(prefix);
  /* escaped, if it was not UTF-8, as the ids were when written, so a prefix of such an id
   * finds it. Not found here, unlike on sqlite: a prefix cut inside a multibyte character
   * of a valid id (its lone lead byte is escaped; the id's is not). */
  prefix = a->values[0];
  const unsigned char *p = (const unsigned char *)prefix;
  size_t len = strlen(prefix), cut = 0;
  uint32_t last = 0, cp;
  int found = 0;
  for (size_t i = 0; i < len;) {
    int n = utf8_char(p + i, len - i, &cp);
    if (!n) break;   /* not reached: the prefix is UTF-8 now */
    if (cp < 0x10FFFF) {
      cut = i;
      last = cp;
      found = 1;
    }
    i += (size_t)n;
  }
  if (!found) return NH_PGOP_AUDIT_FIND_PREFIX_OPEN;
  nh_pg_args_bytes(a, prefix, cut);   /* text in binary format: the bytes, with their length */
  last = last + 1 == 0xD800 ? 0xE000 : last + 1;
  utf8_put(last, a->bound);
  TXT(a->bound);
  return NH_PGOP_AUDIT_FIND_PREFIX;
}

nh_pgop_t nh_pgargs_audit_retext(nh_pg_args_t *a, const char *endpoint, const char *session, const char *text)
{
  nh_pg_args_reset(a);
  KEY(endpoint); KEY(session); TXT(text);
  return NH_PGOP_AUDIT_RETEXT;
}

nh_pgop_t nh_pgargs_handoffs_due(nh_pg_args_t *a, int64_t now, int limit)
{
  nh_pg_args_reset(a);
  I64(now); I64(limit);
  return NH_PGOP_HANDOFFS_DUE;
}

nh_pgop_t nh_pgargs_handoff_flag_overdue(nh_pg_args_t *a, const char *endpoint, const char *event_id, int64_t at)
{
  nh_pg_args_reset(a);
  KEY(endpoint); KEY(event_id); I64(at);
  return NH_PGOP_HANDOFF_FLAG_OVERDUE;
}

nh_pgop_t nh_pgargs_history_add(nh_pg_args_t *a, const char *endpoint, const char *event_id, const char *message_id,
                                const char *message_type, const char *status, const char *detail,
                                const nh_history_extra_t *x)
{
  nh_pg_args_reset(a);
  KEY(endpoint); KEY(event_id); KEY(message_id); TXT(message_type); TXT(status); TXT(detail);
  I64(nh_time_now_ms());
  TXT(x ? x->error_text : NULL);
  TXT(x ? x->error_type : NULL);
  TXT(x ? x->error_stack : NULL);
  const char *prev = x ? x->previous_payload : NULL;
  nh_pg_args_bytes(a, prev, prev ? strlen(prev) : 0);
  return NH_PGOP_HISTORY_ADD;
}

nh_pgop_t nh_pgargs_history_list(nh_pg_args_t *a, const char *endpoint, const char *event_id)
{
  return two(a, NH_PGOP_HISTORY_LIST, endpoint, event_id);
}

nh_pgop_t nh_pgargs_session_get(nh_pg_args_t *a, const char *endpoint, const char *session)
{
  return two(a, NH_PGOP_SESSION_GET, endpoint, session);
}

/* A free session with nothing parked needs no row (nh_store_session_put says why). */
nh_pgop_t nh_pgargs_session_put(nh_pg_args_t *a, const char *endpoint, const char *session,
                                const nh_session_state_t *st)
{
  if (!st->blocked_by && !st->draining && !st->retry_due) return two(a, NH_PGOP_SESSION_DEL, endpoint, session);
  two(a, NH_PGOP_SESSION_PUT, endpoint, session);
  KEY(st->blocked_by);   /* an event id */
  I64(st->draining);
  i64_or_null(a, st->retry_due);
  I64(st->next_park_seq > 0 ? st->next_park_seq : 1);
  return NH_PGOP_SESSION_PUT;
}

nh_pgop_t nh_pgargs_sessions_retry_due(nh_pg_args_t *a, const char *endpoint, int64_t now, int limit)
{
  one(a, NH_PGOP_SESSIONS_RETRY_DUE, endpoint);
  I64(now); I64(limit);
  return NH_PGOP_SESSIONS_RETRY_DUE;
}

nh_pgop_t nh_pgargs_sessions_draining(nh_pg_args_t *a, const char *endpoint, const char *after, int limit)
{
  two(a, NH_PGOP_SESSIONS_DRAINING, endpoint, after ? after : "");
  I64(limit);
  return NH_PGOP_SESSIONS_DRAINING;
}

nh_pgop_t nh_pgargs_sessions_list(nh_pg_args_t *a, const char *endpoint, int blocked_only)
{
  nh_pg_args_reset(a);
  if (endpoint) KEY(endpoint);
  TXT(blocked_only ? "true" : "false");
  return endpoint ? NH_PGOP_SESSIONS_LIST_ENDPOINT : NH_PGOP_SESSIONS_LIST;
}

nh_pgop_t nh_pgargs_park(nh_pg_args_t *a, const nh_msg_t *m, int64_t park_seq)
{
  two(a, NH_PGOP_PARK, m->endpoint, m->session_id);
  I64(park_seq);
  KEY(m->message_id); KEY(m->event_id); TXT(m->event_type);
  TXT(nh_msg_type_name(m->type)); KEY(m->correlation_id);
  KEY(m->originating_message_id); KEY(m->parent_message_id); KEY(m->from);
  I64(m->retry_count);
  I64(m->enqueued_at);
  nh_pg_args_bytes(a, m->body, m->body_len);
  TXT(m->error_text); TXT(m->error_type); KEY(m->reply_to);
  TXT(m->traceparent); TXT(m->tracestate);
  return NH_PGOP_PARK;
}

nh_pgop_t nh_pgargs_parked_head(nh_pg_args_t *a, const char *endpoint, const char *session)
{
  return two(a, NH_PGOP_PARKED_HEAD, endpoint, session);
}

nh_pgop_t nh_pgargs_parked_delete(nh_pg_args_t *a, const char *endpoint, const char *session, int64_t park_seq)
{
  two(a, NH_PGOP_PARKED_DEL, endpoint, session);
  I64(park_seq);
  return NH_PGOP_PARKED_DEL;
}

nh_pgop_t nh_pgargs_parked_delete_event(nh_pg_args_t *a, const char *endpoint, const char *event_id)
{
  return two(a, NH_PGOP_PARKED_DEL_EVENT, endpoint, event_id);
}

nh_pgop_t nh_pgargs_parked_count(nh_pg_args_t *a, const char *endpoint, const char *session)
{
  return two(a, NH_PGOP_PARKED_COUNT, endpoint, session);
}

nh_pgop_t nh_pgargs_parked_any(nh_pg_args_t *a, const char *endpoint, const char *session)
{
  return two(a, NH_PGOP_PARKED_ANY, endpoint, session);
}

nh_pgop_t nh_pgargs_inbox_has(nh_pg_args_t *a, const char *endpoint, const char *message_id)
{
  return two(a, NH_PGOP_INBOX_HAS, endpoint, message_id);
}

nh_pgop_t nh_pgargs_inbox_add(nh_pg_args_t *a, const char *endpoint, const char *message_id)
{
  two(a, NH_PGOP_INBOX_ADD, endpoint, message_id);
  I64(nh_time_now_ms());
  return NH_PGOP_INBOX_ADD;
}

nh_pgop_t nh_pgargs_processed_has(nh_pg_args_t *a, const char *endpoint, const char *message_id,
                                  const char *event_id)
{
  two(a, NH_PGOP_PROCESSED_HAS, endpoint, message_id);
  KEY(event_id);
  return NH_PGOP_PROCESSED_HAS;
}

nh_pgop_t nh_pgargs_oppending_add(nh_pg_args_t *a, const char *message_id, const char *endpoint, const char *event_id,
                                  const char *action, const char *expected_status)
{
  two(a, NH_PGOP_OPPENDING_ADD, message_id, endpoint);
  KEY(event_id); TXT(action); TXT(expected_status);
  I64(nh_time_now_ms());
  return NH_PGOP_OPPENDING_ADD;
}

nh_pgop_t nh_pgargs_oppending_has(nh_pg_args_t *a, const char *endpoint, const char *event_id)
{
  return two(a, NH_PGOP_OPPENDING_HAS, endpoint, event_id);
}

nh_pgop_t nh_pgargs_oppending_take(nh_pg_args_t *a, const char *message_id)
{
  return one(a, NH_PGOP_OPPENDING_TAKE, message_id);
}

nh_pgop_t nh_pgargs_oplog_add(nh_pg_args_t *a, const char *actor, const char *action, const char *endpoint,
                              const char *event_id, const char *session, const char *detail)
{
  nh_pg_args_reset(a);
  I64(nh_time_now_ms());
  if (!actor) actor = getenv("USER");
  TXT(actor ? actor : "operator");
  TXT(action); KEY(endpoint); KEY(event_id); KEY(session); TXT(detail);
  return NH_PGOP_OPLOG_ADD;
}

nh_pgop_t nh_pgargs_published_seen(nh_pg_args_t *a, const char *message_id)
{
  return one(a, NH_PGOP_PUBLISHED_SEEN, message_id);
}

nh_pgop_t nh_pgargs_published_claim(nh_pg_args_t *a, const char *message_id, int64_t now, int64_t since)
{
  one(a, NH_PGOP_PUBLISHED_CLAIM, message_id);
  I64(now); I64(since);
  return NH_PGOP_PUBLISHED_CLAIM;
}

nh_pgop_t nh_pgargs_host_put(nh_pg_args_t *a, const char *owner, const char *endpoints_csv, int64_t started_at,
                             int64_t now)
{
  two(a, NH_PGOP_HOST_PUT, owner, endpoints_csv);
  I64(started_at); I64(now);
  return NH_PGOP_HOST_PUT;
}

nh_pgop_t nh_pgargs_host_del(nh_pg_args_t *a, const char *owner) { return one(a, NH_PGOP_HOST_DEL, owner); }

nh_pgop_t nh_pgargs_hosts_serving(nh_pg_args_t *a, const char *endpoint, int64_t since)
{
  one(a, NH_PGOP_HOSTS_SERVING, endpoint);
  I64(since);
  return NH_PGOP_HOSTS_SERVING;
}

nh_pgop_t nh_pgargs_bulk_get(nh_pg_args_t *a, const char *key) { return one(a, NH_PGOP_BULK_GET, key); }

nh_pgop_t nh_pgargs_bulk_put(nh_pg_args_t *a, const char *key, const nh_bulk_run_t *run)
{
  one(a, NH_PGOP_BULK_PUT, key);
  I64(run->cutoff_ms); I64(run->started_ms); KEY(run->owner); I64(run->queued);
  return NH_PGOP_BULK_PUT;
}

nh_pgop_t nh_pgargs_bulk_done(nh_pg_args_t *a, const char *key) { return one(a, NH_PGOP_BULK_DONE, key); }

/* ---------------------------------------------------------------- readers */

int64_t nh_pg_col_i64(const PGresult *r, int row, int col)
{
  if (PQgetisnull(r, row, col)) return 0;
  const unsigned char *p = (const unsigned char *)PQgetvalue(r, row, col);
  int len = PQgetlength(r, row, col);
  if (PQfformat(r, col) == 0) return strtoll((const char *)p, NULL, 10);
  /* binary: network byte order, of the column's width (bigint, integer, boolean) */
  uint64_t v = 0;
  for (int i = 0; i < len && i < 8; i++) v = v << 8 | p[i];
  if (len == 4) return (int32_t)(uint32_t)v;
  if (len == 2) return (int16_t)(uint16_t)v;
  return (int64_t)v;
}

const char *nh_pg_col_text(const PGresult *r, int row, int col)
{
  return PQgetisnull(r, row, col) ? NULL : PQgetvalue(r, row, col);
}

char *nh_pg_col_strdup(const PGresult *r, int row, int col)
{
  if (PQgetisnull(r, row, col)) return NULL;
  return nh_xstrndup(PQgetvalue(r, row, col), (size_t)PQgetlength(r, row, col));
}

char *nh_pg_col_body(const PGresult *r, int row, int col, size_t *len)
{
  *len = 0;
  if (PQgetisnull(r, row, col)) return NULL;
  size_t n = (size_t)PQgetlength(r, row, col);
  char *d = nh_xmalloc(n + 1);
  memcpy(d, PQgetvalue(r, row, col), n);
  d[n] = '\0';
  *len = n;
  return d;
}

static int64_t or_minus_one(const PGresult *r, int row, int col)
{
  return PQgetisnull(r, row, col) ? -1 : nh_pg_col_i64(r, row, col);
}

void nh_pgrow_audit(const PGresult *r, int row, nh_audit_t *a)
{
  memset(a, 0, sizeof *a);
  a->endpoint = nh_pg_col_strdup(r, row, 0);
  a->event_id = nh_pg_col_strdup(r, row, 1);
  a->session_id = nh_pg_col_strdup(r, row, 2);
  a->event_type = nh_pg_col_strdup(r, row, 3);
  a->status = nh_pg_col_strdup(r, row, 4);
  a->sub_status = nh_pg_col_strdup(r, row, 5);
  a->error_text = nh_pg_col_strdup(r, row, 6);
  a->error_type = nh_pg_col_strdup(r, row, 7);
  a->handoff_reason = nh_pg_col_strdup(r, row, 8);
  a->external_job_id = nh_pg_col_strdup(r, row, 9);
  a->expected_by = nh_pg_col_i64(r, row, 10);
  a->message_id = nh_pg_col_strdup(r, row, 11);
  a->correlation_id = nh_pg_col_strdup(r, row, 12);
  a->originating_message_id = nh_pg_col_strdup(r, row, 13);
  a->retry_count = (int)nh_pg_col_i64(r, row, 14);
  a->payload = nh_pg_col_body(r, row, 15, &a->payload_len);
  size_t result_len;   /* nh_audit_t keeps the result as a C string, as sqlite reads it */
  a->result = nh_pg_col_body(r, row, 16, &result_len);
  a->created_at = nh_pg_col_i64(r, row, 17);
  a->updated_at = nh_pg_col_i64(r, row, 18);
  a->error_stack = nh_pg_col_strdup(r, row, 19);
  a->attempts = (int)nh_pg_col_i64(r, row, 20);
  a->queue_time_ms = or_minus_one(r, row, 21);
  a->processing_time_ms = or_minus_one(r, row, 22);
  a->overdue_at = nh_pg_col_i64(r, row, 23);
  a->traceparent = nh_pg_col_strdup(r, row, 24);
}

void nh_pgrow_session(const PGresult *r, int row, int col, nh_session_state_t *st)
{
  st->exists = 1;
  st->blocked_by = nh_pg_col_strdup(r, row, col);
  st->draining = (int)nh_pg_col_i64(r, row, col + 1);
  st->retry_due = nh_pg_col_i64(r, row, col + 2);
  st->next_park_seq = nh_pg_col_i64(r, row, col + 3);
}

void nh_pgrow_parked(const PGresult *r, int row, const char *endpoint, const char *session, nh_msg_t *m,
                     int64_t *park_seq)
{
  memset(m, 0, sizeof *m);
  *park_seq = nh_pg_col_i64(r, row, 0);
  m->endpoint = nh_xstrdup(endpoint);
  m->session_id = nh_xstrdup(session);
  m->message_id = nh_pg_col_strdup(r, row, 1);
  m->event_id = nh_pg_col_strdup(r, row, 2);
  m->event_type = nh_pg_col_strdup(r, row, 3);
  m->type = nh_msg_type_parse(nh_pg_col_text(r, row, 4));
  m->correlation_id = nh_pg_col_strdup(r, row, 5);
  m->originating_message_id = nh_pg_col_strdup(r, row, 6);
  m->parent_message_id = nh_pg_col_strdup(r, row, 7);
  m->from = nh_pg_col_strdup(r, row, 8);
  m->retry_count = (int)nh_pg_col_i64(r, row, 9);
  m->enqueued_at = nh_pg_col_i64(r, row, 10);
  m->body = nh_pg_col_body(r, row, 11, &m->body_len);
  m->error_text = nh_pg_col_strdup(r, row, 12);
  m->error_type = nh_pg_col_strdup(r, row, 13);
  m->reply_to = nh_pg_col_strdup(r, row, 14);
  m->traceparent = nh_pg_col_strdup(r, row, 15);
  m->tracestate = nh_pg_col_strdup(r, row, 16);
}

void nh_pgrow_history(const PGresult *r, int row, nh_history_row_t *h)
{
  h->at = nh_pg_col_i64(r, row, 0);
  h->message_id = nh_pg_col_text(r, row, 1);
  h->message_type = nh_pg_col_text(r, row, 2);
  h->status = nh_pg_col_text(r, row, 3);
  h->detail = nh_pg_col_text(r, row, 4);
  h->error_text = nh_pg_col_text(r, row, 5);
  h->error_type = nh_pg_col_text(r, row, 6);
  h->error_stack = nh_pg_col_text(r, row, 7);
  h->previous_payload = nh_pg_col_text(r, row, 8);   /* libpq ends every value with a NUL */
}

void nh_pgrow_bulk(const PGresult *r, int row, nh_bulk_run_t *out)
{
  out->cutoff_ms = nh_pg_col_i64(r, row, 0);
  out->started_ms = nh_pg_col_i64(r, row, 1);
  out->owner = nh_pg_col_strdup(r, row, 2);
  out->queued = nh_pg_col_i64(r, row, 3);
}

int nh_pg_affected(const PGresult *r)
{
  const char *n = PQcmdTuples((PGresult *)r);
  return n && *n ? atoi(n) : 0;
}

nh_pgop_t nh_pgargs_parked_window(nh_pg_args_t *a, const char *endpoint, const char *session, int64_t after,
                                  int limit)
{
  two(a, NH_PGOP_PARKED_WINDOW, endpoint, session);
  I64(after);
  I64(limit);
  return NH_PGOP_PARKED_WINDOW;
}

nh_pgop_t nh_pgargs_parked_count_event(nh_pg_args_t *a, const char *endpoint, const char *event_id)
{
  return two(a, NH_PGOP_PARKED_COUNT_EVENT, endpoint, event_id);
}

nh_pgop_t nh_pgargs_oppending_get(nh_pg_args_t *a, const char *message_id)
{
  return one(a, NH_PGOP_OPPENDING_GET, message_id);
}

nh_pgop_t nh_pgargs_handoffs_pending(nh_pg_args_t *a, const char *endpoint)
{
  return one(a, NH_PGOP_HANDOFFS_PENDING, endpoint);
}

nh_pgop_t nh_pgargs_published_claim_or_fail(nh_pg_args_t *a, const char *message_id, int64_t now, int64_t since)
{
  nh_pgargs_published_claim(a, message_id, now, since);
  return NH_PGOP_PUBLISHED_CLAIM_OR_FAIL;
}

nh_pgop_t nh_pgargs_handoff_overdue_mark(nh_pg_args_t *a, const char *endpoint, const char *event_id, int64_t at,
                                         const char *detail)
{
  two(a, NH_PGOP_HANDOFF_OVERDUE_MARK, endpoint, event_id);
  I64(at);
  TXT(detail);
  return NH_PGOP_HANDOFF_OVERDUE_MARK;
}

nh_pgop_t nh_pgargs_purge(nh_pg_args_t *a, nh_pgop_t op, int64_t before, int limit)
{
  nh_pg_args_reset(a);
  I64(before);
  I64(limit);
  return op;
}

nh_pgop_t nh_pgargs_purge_count(nh_pg_args_t *a, int64_t resolved_before, int64_t inbox_before)
{
  nh_pg_args_reset(a);
  I64(resolved_before);
  I64(inbox_before);
  return NH_PGOP_PURGE_COUNT;
}

nh_pgop_t nh_pgargs_endpoint_gauges(nh_pg_args_t *a, const char *endpoint)
{
  nh_pg_args_reset(a);
  KEY(endpoint);
  return NH_PGOP_ENDPOINT_GAUGES;
}
