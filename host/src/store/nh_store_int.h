/* Store internals shared by the store's files (nh_store.c, nh_store_rows.c,
 * nh_store_query.c, nh_store_wal.c). */
#ifndef NH_STORE_INT_H
#define NH_STORE_INT_H

#include "nh_store.h"

enum {
  NH_SQL_AUDIT_PUT,
  NH_SQL_AUDIT_GET,
  NH_SQL_AUDIT_FIND,
  NH_SQL_AUDIT_FIND_PREFIX,
  NH_SQL_AUDIT_RETEXT,
  NH_SQL_HISTORY_ADD,
  NH_SQL_HISTORY_LIST,
  NH_SQL_SESSION_GET,
  NH_SQL_SESSION_PUT,
  NH_SQL_SESSION_DEL,
  NH_SQL_SESSIONS_RETRY_DUE,
  NH_SQL_SESSIONS_DRAINING,
  NH_SQL_PARK,
  NH_SQL_PARKED_HEAD,
  NH_SQL_PARKED_DEL,
  NH_SQL_PARKED_DEL_EVENT,
  NH_SQL_PARKED_COUNT,
  NH_SQL_PARKED_ANY,
  NH_SQL_PARKED_WINDOW,
  NH_SQL_PARKED_COUNT_EVENT,
  NH_SQL_INBOX_HAS,
  NH_SQL_INBOX_ADD,
  NH_SQL_PROCESSED_HAS,
  NH_SQL_OPLOG_ADD,
  NH_SQL_OPPENDING_ADD,
  NH_SQL_OPPENDING_HAS,
  NH_SQL_OPPENDING_DONE,
  NH_SQL_OPPENDING_GET,
  /* transaction control, prepared once: sqlite3_exec parsed these twice per event */
  NH_SQL_TX_BEGIN,
  NH_SQL_TX_COMMIT,
  NH_SQL_TX_SAVEPOINT,
  NH_SQL_TX_RELEASE,
  NH_SQL_TX_ROLLBACK_TO,
  NH_SQL_COUNT
};

#define NH_AUDIT_COLS                                                                              \
  "endpoint, event_id, session_id, event_type, status, sub_status, error_text, error_type,"        \
  " handoff_reason, external_job_id, expected_by, message_id, correlation_id, originating_message_id," \
  " retry_count, payload, result, created_at, updated_at, error_stack, attempts, queue_time_ms,"          \
  " processing_time_ms, overdue_at, traceparent"
#define NH_AUDIT_NCOLS 25   /* a listing's own columns start here */

/* Row readers shared with the listing queries (nh_store_query.c). */
void nh_store_audit_read(sqlite3_stmt *st, nh_audit_t *a);        /* NH_AUDIT_COLS from column 0 */
void nh_store_session_read(sqlite3_stmt *st, int col, nh_session_state_t *out);

struct nh_store {
  sqlite3 *db;
  char *path;
  int in_tx;
  uint64_t tx_started_ns;        /* monotonic, for nimbus_store_transaction_seconds */
  nh_store_txn_cb txn_cb;    /* a broker transport's hook: see nh_store_set_txn_hook */
  void *txn_data;
  int64_t busy_since;        /* when the current wait for the write lock began (on_busy) */
  nh_store_wal_cb wal_cb;    /* a host's checkpointer: see nh_store_set_wal_hook */
  void *wal_data;
  int failed;        /* a statement failed since the last begin/savepoint: do not commit */
  int outer_failed;  /* ... before the current savepoint */
  sqlite3_stmt *stmt[NH_SQL_COUNT];
};

#endif
