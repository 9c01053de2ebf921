/* Schema migrations for the store component. Each entry moves the schema from
 * version i to i+1; never edit a shipped entry, append a new one. */
#ifndef NH_STORE_SCHEMA_H
#define NH_STORE_SCHEMA_H

static const char *const nh_store_migrations[] = {
  /* 1: initial schema */
  "CREATE TABLE audit ("
  "  endpoint TEXT NOT NULL, event_id TEXT NOT NULL, session_id TEXT NOT NULL,"
  "  event_type TEXT, status TEXT NOT NULL, sub_status TEXT,"
  "  error_text TEXT, error_type TEXT, handoff_reason TEXT, external_job_id TEXT,"
  "  expected_by INTEGER, message_id TEXT, correlation_id TEXT, originating_message_id TEXT,"
  "  retry_count INTEGER NOT NULL DEFAULT 0, payload TEXT, result TEXT, error_stack TEXT,"
  "  created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL,"
  "  PRIMARY KEY (event_id, endpoint));"   /* event_id first: serves lookups by id alone */
  "CREATE INDEX audit_status ON audit(endpoint, status);"
  "CREATE INDEX audit_session ON audit(endpoint, session_id);"
  "CREATE TABLE history ("
  "  id INTEGER PRIMARY KEY, endpoint TEXT NOT NULL, event_id TEXT NOT NULL,"
  "  message_id TEXT, message_type TEXT, status TEXT, detail TEXT, at INTEGER NOT NULL);"
  "CREATE INDEX history_event ON history(event_id);"
  "CREATE TABLE sessions ("
  "  endpoint TEXT NOT NULL, session_id TEXT NOT NULL, blocked_by TEXT,"
  "  draining INTEGER NOT NULL DEFAULT 0, retry_due INTEGER, next_park_seq INTEGER NOT NULL DEFAULT 1,"
  "  PRIMARY KEY (endpoint, session_id)) WITHOUT ROWID;"
  "CREATE TABLE parked ("
  "  endpoint TEXT NOT NULL, session_id TEXT NOT NULL, park_seq INTEGER NOT NULL,"
  "  message_id TEXT, event_id TEXT, event_type TEXT, message_type TEXT, correlation_id TEXT,"
  "  originating_message_id TEXT, parent_message_id TEXT, from_ TEXT, retry_count INTEGER,"
  "  enqueued_at INTEGER, body TEXT, error_text TEXT, error_type TEXT, reply_to TEXT,"
  "  PRIMARY KEY (endpoint, session_id, park_seq)) WITHOUT ROWID;"
  "CREATE TABLE inbox ("
  "  endpoint TEXT NOT NULL, message_id TEXT NOT NULL, at INTEGER NOT NULL,"
  "  PRIMARY KEY (endpoint, message_id)) WITHOUT ROWID;"
  "CREATE TABLE processed ("
  "  endpoint TEXT NOT NULL, message_id TEXT NOT NULL, event_id TEXT NOT NULL, at INTEGER NOT NULL,"
  "  PRIMARY KEY (endpoint, message_id, event_id)) WITHOUT ROWID;"
  "CREATE TABLE operator_pending ("
  "  message_id TEXT PRIMARY KEY, endpoint TEXT NOT NULL, event_id TEXT NOT NULL, action TEXT,"
  "  expected_status TEXT, at INTEGER NOT NULL)"
  "  WITHOUT ROWID;"
  "CREATE INDEX operator_pending_event ON operator_pending(event_id);"
  "CREATE TABLE operator_log ("
  "  id INTEGER PRIMARY KEY, at INTEGER NOT NULL, actor TEXT, action TEXT NOT NULL,"
  "  endpoint TEXT, event_id TEXT, session_id TEXT, detail TEXT);",

  /* 2: outage scale. Every hot statement is bounded by an index to the rows of its batch
   * (spec: host/tests/test_store_plans.c runs EXPLAIN QUERY PLAN over all of them):
   * due retries and draining sessions are found through partial indexes instead of a scan
   * of every blocked session; a session's Deferred rows and a parked event are found
   * without reading the rest of the session; audit rows carry their failure group. */
  "CREATE INDEX sessions_retry ON sessions(endpoint, retry_due)"
  "  WHERE blocked_by IS NOT NULL AND retry_due IS NOT NULL;"
  "CREATE INDEX sessions_draining ON sessions(endpoint, session_id) WHERE blocked_by IS NULL AND draining = 1;"
  "CREATE INDEX parked_event ON parked(endpoint, event_id);"
  "ALTER TABLE audit ADD COLUMN fail_group TEXT;"
  "DROP INDEX audit_status;"
  "DROP INDEX audit_session;"
  "CREATE INDEX audit_status ON audit(status, endpoint, updated_at);"
  "CREATE INDEX audit_session ON audit(endpoint, session_id, status);"
  "CREATE INDEX audit_group ON audit(fail_group, endpoint) WHERE fail_group IS NOT NULL;"
  "ALTER TABLE history ADD COLUMN error_text TEXT;"   /* every failed attempt keeps its error */
  "ALTER TABLE history ADD COLUMN error_type TEXT;"
  "ALTER TABLE history ADD COLUMN error_stack TEXT;"
  "ALTER TABLE history ADD COLUMN previous_payload TEXT;"   /* the body a resubmit replaced */
  "CREATE INDEX inbox_at ON inbox(at);"           /* retention deletes by age */
  "CREATE INDEX processed_at ON processed(at);"
  "CREATE TABLE hosts ("                            /* running hosts and their endpoints */
  "  owner TEXT PRIMARY KEY, endpoints TEXT NOT NULL, started_at INTEGER NOT NULL, seen_at INTEGER NOT NULL)"
  "  WITHOUT ROWID;"
  "CREATE TABLE published ("                        /* publishes with a MessageId the caller chose */
  "  message_id TEXT PRIMARY KEY, at INTEGER NOT NULL) WITHOUT ROWID;"
  "CREATE INDEX published_at ON published(at);"
  "CREATE TABLE bulk_runs ("
  "  key TEXT PRIMARY KEY, cutoff INTEGER NOT NULL, started_at INTEGER NOT NULL, owner TEXT,"
  "  queued INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID;",

  /* 3: transient failures retried under the endpoint's `transient` policy: how many
   * attempts the event has had (while Pending+Retrying, and when they ran out). */
  "ALTER TABLE audit ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0;",

  /* 4: observability (docs/observability.md). The latest handler run's queue and
   * processing times; when a hand-off was flagged overdue (once); the W3C trace context
   * an event arrived with (a retry runs in the same trace), also on parked rows. The
   * partial index holds only the hand-offs not flagged yet, so the overdue scan reads the
   * ones due and nothing else. */
  "ALTER TABLE audit ADD COLUMN queue_time_ms INTEGER;"
  "ALTER TABLE audit ADD COLUMN processing_time_ms INTEGER;"
  "ALTER TABLE audit ADD COLUMN overdue_at INTEGER;"
  "ALTER TABLE audit ADD COLUMN traceparent TEXT;"
  "ALTER TABLE parked ADD COLUMN traceparent TEXT;"
  "ALTER TABLE parked ADD COLUMN tracestate TEXT;"
  "CREATE INDEX audit_handoff_due ON audit(expected_by)"
  "  WHERE status = 'Pending' AND sub_status = 'Handoff' AND expected_by IS NOT NULL AND overdue_at IS NULL;",
};

#endif
