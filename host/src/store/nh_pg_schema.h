/* The store's schema migrations in PostgreSQL's dialect: entry i moves the schema from
 * version i to i+1 and matches entry i of nh_store_schema.h (sqlite), so that version N
 * holds the same tables, columns and indexes on both backends (host/tests/test_pg.c
 * compares them). Never edit a shipped entry; append one here with each sqlite one. (Entry 1
 * was edited once, audit.result made bytea, while the host still refused to run on
 * PostgreSQL: no store in service had it.)
 *
 * What differs from sqlite, and why:
 * - audit has no rowid to page by insert order: `seq` (an identity, unique index
 *   audit_seq) stands in for it; history.id and operator_log.id are identities.
 * - sqlite INTEGER (ms timestamps, counters, flags) is bigint: sqlite's integers are 64-bit.
 * - text is COLLATE "C": sqlite compares text byte by byte, and keyset paging
 *   (session_id > $1 ORDER BY session_id) must page the same way on both, whatever the
 *   database's default collation (a locale's order also keeps LIKE 'prefix%' off the index).
 * - message bodies (audit.payload, parked.body, history.previous_payload, and audit.result,
 *   a hand-off's completion body) are bytea: a body may hold a NUL or bytes that are not
 *   UTF-8, which sqlite keeps and PostgreSQL's text refuses.
 * - WITHOUT ROWID tables are plain tables with the same primary key.
 * The version lives in the one-row table nimbus_schema, which nh_pg_migrate creates. */
#ifndef NH_PG_SCHEMA_H
#define NH_PG_SCHEMA_H

#define NH_PG_T "text COLLATE \"C\""

static const char *const nh_pg_migrations[] = {
  /* 1: initial schema */
  "CREATE TABLE audit ("
  "  endpoint " NH_PG_T " NOT NULL, event_id " NH_PG_T " NOT NULL, session_id " NH_PG_T " NOT NULL,"
  "  event_type " NH_PG_T ", status " NH_PG_T " NOT NULL, sub_status " NH_PG_T ","
  "  error_text " NH_PG_T ", error_type " NH_PG_T ", handoff_reason " NH_PG_T ", external_job_id " NH_PG_T ","
  "  expected_by bigint, message_id " NH_PG_T ", correlation_id " NH_PG_T ", originating_message_id " NH_PG_T ","
  "  retry_count bigint NOT NULL DEFAULT 0, payload bytea, result bytea, error_stack " NH_PG_T ","
  "  created_at bigint NOT NULL, updated_at bigint NOT NULL,"
  "  seq bigint GENERATED ALWAYS AS IDENTITY,"
  "  PRIMARY KEY (event_id, endpoint));"   /* event_id first: serves lookups by id alone */
  "CREATE UNIQUE INDEX audit_seq ON audit(seq);"
  "CREATE INDEX audit_status ON audit(endpoint, status);"
  "CREATE INDEX audit_session ON audit(endpoint, session_id);"
  "CREATE TABLE history ("
  "  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, endpoint " NH_PG_T " NOT NULL,"
  "  event_id " NH_PG_T " NOT NULL, message_id " NH_PG_T ", message_type " NH_PG_T ", status " NH_PG_T ","
  "  detail " NH_PG_T ", at bigint NOT NULL);"
  "CREATE INDEX history_event ON history(event_id);"
  "CREATE TABLE sessions ("
  "  endpoint " NH_PG_T " NOT NULL, session_id " NH_PG_T " NOT NULL, blocked_by " NH_PG_T ","
  "  draining bigint NOT NULL DEFAULT 0, retry_due bigint, next_park_seq bigint NOT NULL DEFAULT 1,"
  "  PRIMARY KEY (endpoint, session_id));"
  "CREATE TABLE parked ("
  "  endpoint " NH_PG_T " NOT NULL, session_id " NH_PG_T " NOT NULL, park_seq bigint NOT NULL,"
  "  message_id " NH_PG_T ", event_id " NH_PG_T ", event_type " NH_PG_T ", message_type " NH_PG_T ","
  "  correlation_id " NH_PG_T ", originating_message_id " NH_PG_T ", parent_message_id " NH_PG_T ","
  "  from_ " NH_PG_T ", retry_count bigint, enqueued_at bigint, body bytea, error_text " NH_PG_T ","
  "  error_type " NH_PG_T ", reply_to " NH_PG_T ","
  "  PRIMARY KEY (endpoint, session_id, park_seq));"
  "CREATE TABLE inbox ("
  "  endpoint " NH_PG_T " NOT NULL, message_id " NH_PG_T " NOT NULL, at bigint NOT NULL,"
  "  PRIMARY KEY (endpoint, message_id));"
  "CREATE TABLE processed ("
  "  endpoint " NH_PG_T " NOT NULL, message_id " NH_PG_T " NOT NULL, event_id " NH_PG_T " NOT NULL,"
  "  at bigint NOT NULL, PRIMARY KEY (endpoint, message_id, event_id));"
  "CREATE TABLE operator_pending ("
  "  message_id " NH_PG_T " PRIMARY KEY, endpoint " NH_PG_T " NOT NULL, event_id " NH_PG_T " NOT NULL,"
  "  action " NH_PG_T ", expected_status " NH_PG_T ", at bigint NOT NULL);"
  "CREATE INDEX operator_pending_event ON operator_pending(event_id);"
  "CREATE TABLE operator_log ("
  "  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, at bigint NOT NULL, actor " NH_PG_T ","
  "  action " NH_PG_T " NOT NULL, endpoint " NH_PG_T ", event_id " NH_PG_T ", session_id " NH_PG_T ","
  "  detail " NH_PG_T ");",

  /* 2: outage scale (see nh_store_schema.h): partial indexes for due retries and
   * draining sessions, failure groups, every failed attempt's error in history, hosts,
   * idempotent publishes and bulk runs. No failure-group backfill follows it here, as it
   * does on sqlite: no PostgreSQL store was ever written at version 1. */
  "CREATE INDEX sessions_retry ON sessions(endpoint, retry_due)"
  "  WHERE blocked_by IS NOT NULL AND retry_due IS NOT NULL;"
  "CREATE INDEX sessions_draining ON sessions(endpoint, session_id) WHERE blocked_by IS NULL AND draining = 1;"
  "CREATE INDEX parked_event ON parked(endpoint, event_id);"
  "ALTER TABLE audit ADD COLUMN fail_group " NH_PG_T ";"
  "DROP INDEX audit_status;"
  "DROP INDEX audit_session;"
  "CREATE INDEX audit_status ON audit(status, endpoint, updated_at);"
  "CREATE INDEX audit_session ON audit(endpoint, session_id, status);"
  "CREATE INDEX audit_group ON audit(fail_group, endpoint) WHERE fail_group IS NOT NULL;"
  "ALTER TABLE history ADD COLUMN error_text " NH_PG_T ";"
  "ALTER TABLE history ADD COLUMN error_type " NH_PG_T ";"
  "ALTER TABLE history ADD COLUMN error_stack " NH_PG_T ";"
  "ALTER TABLE history ADD COLUMN previous_payload bytea;"
  "CREATE INDEX inbox_at ON inbox(at);"
  "CREATE INDEX processed_at ON processed(at);"
  "CREATE TABLE hosts ("
  "  owner " NH_PG_T " PRIMARY KEY, endpoints " NH_PG_T " NOT NULL, started_at bigint NOT NULL,"
  "  seen_at bigint NOT NULL);"
  "CREATE TABLE published ("
  "  message_id " NH_PG_T " PRIMARY KEY, at bigint NOT NULL);"
  "CREATE INDEX published_at ON published(at);"
  "CREATE TABLE bulk_runs ("
  "  key " NH_PG_T " PRIMARY KEY, cutoff bigint NOT NULL, started_at bigint NOT NULL, owner " NH_PG_T ","
  "  queued bigint NOT NULL DEFAULT 0);",

  /* 3: attempts of a transient failure */
  "ALTER TABLE audit ADD COLUMN attempts bigint NOT NULL DEFAULT 0;",

  /* 4: observability: run times, overdue hand-offs (partial index of those not flagged
   * yet), the W3C trace context on audit and parked rows */
  "ALTER TABLE audit ADD COLUMN queue_time_ms bigint;"
  "ALTER TABLE audit ADD COLUMN processing_time_ms bigint;"
  "ALTER TABLE audit ADD COLUMN overdue_at bigint;"
  "ALTER TABLE audit ADD COLUMN traceparent " NH_PG_T ";"
  "ALTER TABLE parked ADD COLUMN traceparent " NH_PG_T ";"
  "ALTER TABLE parked ADD COLUMN tracestate " NH_PG_T ";"
  "CREATE INDEX audit_handoff_due ON audit(expected_by)"
  "  WHERE status = 'Pending' AND sub_status = 'Handoff' AND expected_by IS NOT NULL AND overdue_at IS NULL;",
};

#undef NH_PG_T

#endif
