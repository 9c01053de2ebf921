/* The unit of work's state, shared by its two backends: nh_uow.c (sqlite, direct or
 * cold) and nh_uow_pg.c (PostgreSQL: a cache filled by pipelines, writes sent with the
 * commit). */
#ifndef NH_UOW_INT_H
#define NH_UOW_INT_H

#include "core/nh_strset.h"
#include "nh_uow.h"

typedef struct nh_uowpg nh_uowpg_t;

struct nh_uow {
  nh_store_t *store;    /* sqlite; NULL on PostgreSQL */
  nh_uowpg_t *pg;       /* PostgreSQL's cache and write list; NULL on sqlite */
  unsigned mode;        /* nh_uow_mode_t flags */
  nh_strset_t known;    /* COLD: keys missed in an earlier pass of this pump: read from the store */
  nh_strset_t fresh;    /* COLD: keys missed in this pass: missed again until the next, so a void
                           pass sees one answer per key */
  int missed;           /* this pass read a key it did not have */
  int pass;             /* passes of this pump so far */
  int open;             /* a pass's transaction is open (nh_uow_open) */
  int committed;        /* this pump's commit came back COMMITTED (told to hooks.pump_end) */
  nh_uow_hooks_t hooks;
  nh_store_txn_cb txn_cb;       /* PostgreSQL: a broker transport's (nh_uow_set_txn_hook) */
  void *txn_data;
  int commit_sent;      /* PostgreSQL: this pump's commit went out: its end tells COMMIT or ROLLBACK */
  nh_uow_commit_cb commit_cb;   /* the caller's, behind commit_seen */
  void *commit_data;
  char *key;            /* scratch for building keys */
  size_t key_cap;
  nh_uow_stats_t stats;
};

/* Builds the key of a read (its kind and up to three parts, joined by a unit separator)
 * in u->key; returns it. */
const char *nh_uow_key(nh_uow_t *u, char kind, const char *a, const char *b, const char *c);

/* ---- PostgreSQL (nh_uow_pg.c): each as its nh_uow_* twin */
nh_uowpg_t *nh_uowpg_new(nh_uow_t *u, struct nh_pg_link *link);
/* NH_UOW_CACHED: the cache and the write list over the sqlite store: a fill reads it at
 * once, a commit sends the list into the store's open transaction and commits it. */
nh_uowpg_t *nh_uowpg_new_local(nh_uow_t *u, nh_store_t *store);
/* Frees at once, or (a batch of it still out on the link) once that batch is over. */
void nh_uowpg_free(nh_uowpg_t *p);
void nh_uowpg_pass_begin(nh_uowpg_t *p);
void nh_uowpg_end(nh_uowpg_t *p);

int nh_uowpg_session_get(nh_uowpg_t *p, const char *endpoint, const char *session, nh_session_state_t *st);
int nh_uowpg_audit_get(nh_uowpg_t *p, const char *endpoint, const char *event_id, nh_audit_t *out);
int nh_uowpg_inbox_has(nh_uowpg_t *p, const char *endpoint, const char *message_id);
int nh_uowpg_parked_any(nh_uowpg_t *p, const char *endpoint, const char *session);
int nh_uowpg_parked_head(nh_uowpg_t *p, const char *endpoint, const char *session, nh_msg_t *out, int64_t *park_seq);
int nh_uowpg_processed_has(nh_uowpg_t *p, const char *endpoint, const char *message_id, const char *event_id);
int nh_uowpg_oppending_take(nh_uowpg_t *p, const char *message_id, char **expected_status);
int nh_uowpg_sessions_due(nh_uowpg_t *p, const char *endpoint, int limit, char **cursor, nh_session_cb cb,
                          void *data);

int nh_uowpg_session_put(nh_uowpg_t *p, const char *endpoint, const char *session, const nh_session_state_t *st);
int nh_uowpg_audit_put(nh_uowpg_t *p, const nh_audit_t *a);
int nh_uowpg_audit_retext_deferred(nh_uowpg_t *p, const char *endpoint, const char *session, const char *text);
int nh_uowpg_history_add(nh_uowpg_t *p, const char *endpoint, const char *event_id, const char *message_id,
                         const char *message_type, const char *status, const char *detail,
                         const nh_history_extra_t *x);
int nh_uowpg_park(nh_uowpg_t *p, const nh_msg_t *m, int64_t park_seq);
int nh_uowpg_parked_delete(nh_uowpg_t *p, const char *endpoint, const char *session, int64_t park_seq);
int nh_uowpg_parked_delete_event(nh_uowpg_t *p, const char *endpoint, const char *event_id);
int nh_uowpg_inbox_add(nh_uowpg_t *p, const char *endpoint, const char *message_id);

int nh_uowpg_op(nh_uowpg_t *p, const struct nh_pg_optab *tab, int op, struct nh_pg_args *args, nh_error_t *err);
int nh_uowpg_op_peek(nh_uowpg_t *p, const char *key, const struct pg_result **out);
int nh_uowpg_op_read(nh_uowpg_t *p, const char *key, const struct nh_pg_optab *tab, int op, struct nh_pg_args *args,
                     const struct pg_result **out);

void nh_uowpg_savepoint(nh_uowpg_t *p);
void nh_uowpg_savepoint_end(nh_uowpg_t *p);
void nh_uowpg_savepoint_rollback(nh_uowpg_t *p);
void nh_uowpg_rollback(nh_uowpg_t *p);
int nh_uowpg_fill(nh_uowpg_t *p, nh_uow_fill_cb cb, void *data, nh_error_t *err);
int nh_uowpg_commit(nh_uowpg_t *p, nh_uow_commit_cb cb, void *data, nh_error_t *err);
int nh_uowpg_busy(const nh_uowpg_t *p);

#endif
