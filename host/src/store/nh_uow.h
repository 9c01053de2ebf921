/* The unit of work: what the outcome state machine reads from the store during a pump
 * (docs/store-backends.md, "The pump as one unit of work").
 *
 * Against a local sqlite file every read is answered at once (NH_UOW_DIRECT). Against a
 * server it cannot be: the loop must not wait for a round trip. So a read may *miss*: the
 * unit answers with the value of "nothing there" (a free session, no audit row, not in
 * the inbox, nothing parked, no outcome, no request), records the key, and the pass is
 * void. The pump then rolls its transaction back (nothing of it was written or settled),
 * the backend fetches every recorded key, and the pump runs again from the start. A pass
 * that read nothing it did not have commits.
 *
 * NH_UOW_COLD does exactly that on sqlite: a key is a miss the first time a pump reads
 * it, and is read from the store (inside the transaction, under the write lock) from the
 * next pass on. It exists so every suite can run the restart path before a server is
 * involved (NIMBUS_STORE_COLD_READS=1, the functional_cold_* tests). Code between a read
 * and the end of a pass therefore must not do anything a rollback cannot undo (log an
 * error about the value read, count a metric): check nh_uow_missed first. */
#ifndef NH_UOW_H
#define NH_UOW_H

#include "nh_store.h"

typedef struct nh_uow nh_uow_t;

typedef enum { NH_UOW_DIRECT, NH_UOW_COLD } nh_uow_mode_t;

/* After this many void passes of one pump, reads go to the store (a backend that cannot
 * do that fails the pump instead): a pump whose new keys never end still ends. */
#define NH_UOW_MAX_PASSES 16

nh_uow_t *nh_uow_new(nh_store_t *s, nh_uow_mode_t mode);
void nh_uow_free(nh_uow_t *u);
nh_uow_mode_t nh_uow_mode(const nh_uow_t *u);

/* A pass over the pump's work starts (inside its transaction). */
void nh_uow_pass_begin(nh_uow_t *u);
/* The pass read a key the unit did not have: roll it back and run it again. */
int nh_uow_missed(const nh_uow_t *u);
/* The pump is over (committed or failed): its keys are forgotten. */
void nh_uow_end(nh_uow_t *u);

typedef struct nh_uow_stats {
  uint64_t passes;      /* passes run */
  uint64_t restarts;    /* of them, void (a miss) */
  uint64_t misses;      /* keys recorded */
} nh_uow_stats_t;
void nh_uow_stats(const nh_uow_t *u, nh_uow_stats_t *out);

/* The reads, each as its nh_store_* twin (nh_store.h); on a miss, the empty answer. */
int nh_uow_session_get(nh_uow_t *u, const char *endpoint, const char *session, nh_session_state_t *st);
int nh_uow_audit_get(nh_uow_t *u, const char *endpoint, const char *event_id, nh_audit_t *out);
int nh_uow_inbox_has(nh_uow_t *u, const char *endpoint, const char *message_id);
int nh_uow_parked_any(nh_uow_t *u, const char *endpoint, const char *session);
int nh_uow_parked_head(nh_uow_t *u, const char *endpoint, const char *session, nh_msg_t *out, int64_t *park_seq);
int nh_uow_processed_has(nh_uow_t *u, const char *endpoint, const char *message_id, const char *event_id);
/* Reads and removes the request (a miss removes nothing). */
int nh_uow_oppending_take(nh_uow_t *u, const char *message_id, char **expected_status);

#endif
