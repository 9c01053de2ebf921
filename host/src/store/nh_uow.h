/* The unit of work: what the outcome state machine reads from and writes to the store during a pump
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
 * error about the value read, count a metric): check nh_uow_missed first.
 *
 * Over PostgreSQL (nh_uow_new_pg; nh_uow_pg.c, nh_uow_cache.c, nh_uow_batch.c) reads
 * answer from a per-pump cache, a void pass is followed by nh_uow_fill, and a pass's writes
 * are a list sent with its COMMIT by nh_uow_commit. NH_UOW_CACHED runs that same unit over
 * sqlite, so the dispatcher's suites exercise it. */
#ifndef NH_UOW_H
#define NH_UOW_H

#include "core/nh_error.h"
#include "nh_store.h"

typedef struct nh_uow nh_uow_t;
struct nh_pg_link;

/* Flags; the debugging ones (never set in production) make sqlite behave as a server does. */
typedef enum {
  NH_UOW_DIRECT = 0,         /* reads answered at once, commits done at once */
  NH_UOW_COLD = 1,           /* NIMBUS_STORE_COLD_READS: the first read of a key in a pump misses */
  NH_UOW_LATE_COMMIT = 2,    /* NIMBUS_STORE_LATE_COMMIT: the dispatcher gets its commit's result on a later
                                loop turn (the commit itself happened), so what follows a commit runs with the
                                loop having moved on meanwhile: handlers ending, timers, operator calls */
  NH_UOW_CACHED = 4,         /* NIMBUS_STORE_CACHED: PostgreSQL's cache and write list over sqlite (nh_uow_batch.c):
                                reads answer from a cache a pass fills only by missing (read before the next
                                pass), writes are kept and go to the store just before its commit
                                (nh_uow_commit). The state machine meets the PostgreSQL unit's semantics (its
                                own writes seen through overlays, windows of parked rows) under every suite */
  NH_UOW_IN_DOUBT = 8,       /* NIMBUS_STORE_IN_DOUBT, with CACHED: every other commit is told UNKNOWN after it
                                committed, as a server's is when the connection goes before the COMMIT's
                                answer: the dispatcher must not record or run anything of it again */
} nh_uow_mode_t;

/* NH_UOW_COLD: after this many void passes of one pump, reads go to the store, so a pump
 * whose new keys never end still ends. (A cache needs no cap: each fill reads every key
 * missed so far, and a pump's keys are finite.) */
#define NH_UOW_MAX_PASSES 16

nh_uow_t *nh_uow_new(nh_store_t *s, unsigned mode);   /* nh_uow_mode_t flags */
/* A unit of work over a PostgreSQL store's link (nh_uow_pg.c, docs/store-backends.md "The
 * PostgreSQL unit of work"): reads answer from a cache that nh_uow_fill fills, a key
 * not in it is a miss; a pass's writes are kept in a list (its reads see them) and sent
 * with its COMMIT by nh_uow_commit, one batch each. The link must outlive the unit. */
nh_uow_t *nh_uow_new_pg(struct nh_pg_link *link);
/* On PostgreSQL with a fill or a commit still out on the link, the unit is freed once
 * that is over (its callback is not called). */
void nh_uow_free(nh_uow_t *u);
unsigned nh_uow_mode(const nh_uow_t *u);

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
  uint64_t fills;       /* PostgreSQL: read batches sent (each one round trip) */
  uint64_t filled;      /* ... keys they read */
  uint64_t commits;     /* PostgreSQL: commit batches sent */
  uint64_t writes;      /* ... writes they carried */
  uint64_t statements;  /* ... statements those writes took (nh_pg_set.h: a set of rows is one) */
} nh_uow_stats_t;
void nh_uow_stats(const nh_uow_t *u, nh_uow_stats_t *out);

/* ---- the pass's transaction. On sqlite these are the store's (nh_store_begin, ...). On
 * PostgreSQL they act on the write list: a savepoint marks it, its rollback drops what
 * came after (and what the pass's reads saw of it), begin and rollback empty it. */
int nh_uow_begin(nh_uow_t *u);
/* 1 between nh_uow_begin and the pass's end (its rollback, its commit sent, nh_uow_end):
 * a write made now joins the pass's transaction. A transport's writes outside a pass (a
 * lock renewed, a message given back after a failed commit) go in batches of their own. */
int nh_uow_open(const nh_uow_t *u);
void nh_uow_rollback(nh_uow_t *u);
int nh_uow_savepoint(nh_uow_t *u);
int nh_uow_savepoint_end(nh_uow_t *u);
void nh_uow_savepoint_rollback(nh_uow_t *u);

/* ---- a unit with a cache only (nh_uow_batched; NH_ESTATE otherwise). On PostgreSQL each
 * is a batch on the link and its callback runs from the loop; with NH_UOW_CACHED the
 * sqlite store does it at once and the callback runs inside the call. */

/* After a void pass (its writes rolled back): reads every key the pump missed so far, as one batch on the link.
 * cb runs from the loop once it is over: ok 1, the next pass finds those keys; ok 0
 * (err says why: the connection went, a statement failed), they are still missing. */
typedef void (*nh_uow_fill_cb)(void *data, int ok, const nh_error_t *err);
int nh_uow_fill(nh_uow_t *u, nh_uow_fill_cb cb, void *data, nh_error_t *err);

/* Ends a pass that missed nothing: its writes and COMMIT as one batch on the link. cb
 * runs from the loop once it is over, with the link's outcome: COMMITTED, NOT_COMMITTED
 * (nothing of it happened) or UNKNOWN (the connection went after COMMIT was sent). */
typedef enum nh_uow_outcome { NH_UOW_COMMITTED, NH_UOW_NOT_COMMITTED, NH_UOW_UNKNOWN } nh_uow_outcome_t;
typedef void (*nh_uow_commit_cb)(void *data, nh_uow_outcome_t outcome, const nh_error_t *err);
int nh_uow_commit(nh_uow_t *u, nh_uow_commit_cb cb, void *data, nh_error_t *err);

/* 1 if the unit reads through a cache and commits its own write list (PostgreSQL,
 * NH_UOW_CACHED): a void pass is followed by nh_uow_fill, a pass that missed nothing ends
 * with nh_uow_commit. Otherwise the store's own commit ends it (nh_store_commit). */
int nh_uow_batched(const nh_uow_t *u);

/* 1 if a read can miss (COLD, CACHED, PostgreSQL): the pump must be able to run its pass again. */
int nh_uow_can_miss(const nh_uow_t *u);

/* ---- another table's operations (the embedded queue's, the AMQP transport's: nh_pg_optab_t
 * of nh_pg_ops.h), PostgreSQL only (NH_ESTATE otherwise): a transport's statements join
 * the pump's batches. args are copied, and released (as nh_pg_batch_add does). */
struct nh_pg_optab;
struct nh_pg_args;
struct pg_result;
/* A write, in the commit batch after the writes recorded before it. The pass's reads know
 * nothing of it: a table's writer keeps its own view of what it wrote. */
int nh_uow_op(nh_uow_t *u, const struct nh_pg_optab *tab, int op, struct nh_pg_args *args, nh_error_t *err);
/* A read, keyed by the caller (a key names one question: "q:lock:<endpoint>:<session>", say).
 * 1 with its result in *out (the unit's, valid until nh_uow_end), or 0: a miss (the pass is
 * void; the next fill reads it, with these arguments); NH_ESTATE on a unit without a link. */
int nh_uow_op_read(nh_uow_t *u, const char *key, const struct nh_pg_optab *tab, int op, struct nh_pg_args *args,
                   const struct pg_result **out);

/* What was read, without asking for it: 1 with the result if the unit has key, else 0 (no
 * miss: the pass goes on). */
int nh_uow_op_peek(nh_uow_t *u, const char *key, const struct pg_result **out);

/* For a table whose reads have effects (the queue's head scan takes leases in the fill
 * that reads it): told when each pass begins; at the end of a pass that commits, just
 * before its batch goes (nh_uow_open still 1: writes made now join it); and when the pump
 * ends (nh_uow_end, the cache still readable), whether its commit came back COMMITTED.
 * What a fill took and the pass that commits did not use must be given back by them. */
typedef struct nh_uow_hooks {
  void (*pass_begin)(void *data);
  void (*pass_end)(void *data);
  void (*pump_end)(void *data, int committed);
  void *data;
} nh_uow_hooks_t;
void nh_uow_set_hooks(nh_uow_t *u, const nh_uow_hooks_t *hooks);

/* A broker transport cannot join the pump's transaction: it holds the settlements it is
 * asked for until the transaction that recorded their outcomes commits, and gives back
 * what it handed out in one that did not (nh_store_set_txn_hook, the same phases). On
 * sqlite the store tells them itself, and this hook is never called. On PostgreSQL the
 * unit tells them: BEGIN, the savepoints and ROLLBACK as the pass makes them (a void pass
 * is rolled back), and once its commit is over (nh_uow_end), COMMIT if it came back
 * COMMITTED, else ROLLBACK (NOT_COMMITTED, and UNKNOWN: what the transport held back is
 * dropped and its deliveries come again, where the store recognises a recorded outcome). */
void nh_uow_set_txn_hook(nh_uow_t *u, nh_store_txn_cb cb, void *data);

/* 1 while a fill or a commit is out on the link: no pass may start. */
int nh_uow_busy(const nh_uow_t *u);

/* The reads, each as its nh_store_* twin (nh_store.h); on a miss, the empty answer. */
int nh_uow_session_get(nh_uow_t *u, const char *endpoint, const char *session, nh_session_state_t *st);
int nh_uow_audit_get(nh_uow_t *u, const char *endpoint, const char *event_id, nh_audit_t *out);
int nh_uow_inbox_has(nh_uow_t *u, const char *endpoint, const char *message_id);
int nh_uow_parked_any(nh_uow_t *u, const char *endpoint, const char *session);
int nh_uow_parked_head(nh_uow_t *u, const char *endpoint, const char *session, nh_msg_t *out, int64_t *park_seq);
int nh_uow_processed_has(nh_uow_t *u, const char *endpoint, const char *message_id, const char *event_id);
/* The due scan (nh_store_sessions_due): due retries, then draining sessions from *cursor
 * on. Over a cache (PostgreSQL, NH_UOW_CACHED) the scan is a read like the others, made
 * when it is filled (its `now` then), so it may predate the pass: take each session's
 * state from nh_uow_session_get, not from the scan. A miss gives no session and leaves
 * *cursor as it was. */
int nh_uow_sessions_due(nh_uow_t *u, const char *endpoint, int64_t now, int limit, char **cursor, nh_session_cb cb,
                        void *data);
/* Reads and removes the request (a miss removes nothing). */
int nh_uow_oppending_take(nh_uow_t *u, const char *message_id, char **expected_status);

/* The writes, each as its nh_store_* twin. On sqlite they are statements in the pump's
 * transaction at once; on a server they will be the pump's list, sent with its commit as
 * one pipeline (docs/store-backends.md). */
int nh_uow_session_put(nh_uow_t *u, const char *endpoint, const char *session, const nh_session_state_t *st);
int nh_uow_audit_put(nh_uow_t *u, const nh_audit_t *a);
int nh_uow_audit_retext_deferred(nh_uow_t *u, const char *endpoint, const char *session, const char *text);
/* x may be NULL (a status and a detail only) */
int nh_uow_history_add(nh_uow_t *u, const char *endpoint, const char *event_id, const char *message_id,
                       const char *message_type, const char *status, const char *detail,
                       const nh_history_extra_t *x);
int nh_uow_park(nh_uow_t *u, const nh_msg_t *m, int64_t park_seq);
int nh_uow_parked_delete(nh_uow_t *u, const char *endpoint, const char *session, int64_t park_seq);
/* The number of rows removed, or NH_EFAIL. */
int nh_uow_parked_delete_event(nh_uow_t *u, const char *endpoint, const char *event_id);
int nh_uow_inbox_add(nh_uow_t *u, const char *endpoint, const char *message_id);

#endif
