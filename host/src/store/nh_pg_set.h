/* A commit's row writes as few statements as the tables allow (docs/store-backends.md,
 * "Set statements"). A pump commits hundreds of events at once; sent row by row, each
 * outcome costs the server half a dozen statements, each with its own executor start,
 * and that per-statement cost, not the rows, was most of PostgreSQL's time. A row
 * operation with a set twin (nh_pg_opdef_t's set) is held instead, with the other rows of
 * its operation, and the twin sent once for all of them: parameter i the array of every
 * row's parameter i, in PostgreSQL's binary array format (text and bytes as they are, no
 * quoting to do or undo).
 *
 * Holding rows back reorders writes, which is safe only where the order cannot show:
 * - each set keeps its rows in the order given (the twins insert in that order);
 * - sets of different tables commute (no trigger, no foreign key between them), and so do
 *   the two sets of the queue's (rows inserted now and rows deleted by a seq read before);
 * - an operation with no twin is a barrier: every held set goes first, then it;
 * - rows of one table repeating a key (an upsert's, a guarded delete's: the opdef's
 *   `key`) would meet in one statement, which PostgreSQL refuses for an upsert and a
 *   guard would miscount: the held sets go first and the row starts new ones. */
#ifndef NH_PG_SET_H
#define NH_PG_SET_H

#include "core/nh_strset.h"
#include "nh_pg_ops.h"

#define NH_PG_SETS 8   /* sets held at once; one more sends them all first */

/* Reads have set twins too (a fill's hundreds of session states and lease checks): the
 * twin answers the row operation's columns after a first one, the row's ordinal (1 to
 * n, ascending), and each row's caller gets a result of its own rows, as if its row
 * operation had run. */
typedef struct nh_pg_set_to {
  nh_pg_result_cb cb;
  void *data;
} nh_pg_set_to_t;

typedef struct nh_pg_set_col {
  char *p;
  size_t len, cap;
  int nulls;
} nh_pg_set_col_t;

typedef struct nh_pg_set {
  const nh_pg_optab_t *tab;
  int op;      /* the row operation */
  int rows;
  nh_pg_set_col_t col[NH_PG_MAX_ARGS];
  nh_pg_set_to_t *to;   /* each row's callback (reads) */
  int to_cap, reads;
} nh_pg_set_t;

typedef struct nh_pg_split nh_pg_split_t;

typedef struct nh_pg_sets {
  nh_pg_set_t set[NH_PG_SETS];
  int n;
  nh_strset_t keys;   /* "rel\x1fkey..." of the rows held */
  nh_pg_split_t **splits;   /* the sent read sets' callbacks: kept until nh_pg_sets_free */
  int nsplits;
  uint64_t statements;   /* statements sent for the row operations given */
} nh_pg_sets_t;

void nh_pg_sets_init(nh_pg_sets_t *g);
/* Adds a row operation to the open batch: held in its set if it has a twin, else sent
 * at once after every held set. Releases args, as nh_pg_batch_add_op does. cb (NULL for
 * none) gets the row's result once the batch has committed. */
int nh_pg_sets_add(nh_pg_sets_t *g, nh_pg_db_t *db, const nh_pg_optab_t *tab, int op, nh_pg_args_t *args,
                   nh_pg_result_cb cb, void *data, nh_error_t *err);
/* Adds the guard of a copied operation (nh_pg_opdef_t's guard), if it has one, to g: a
 * builder gives it every operation of its batch, then flushes g before the first of
 * them, so that the batch takes every guarded lock in its first statement. */
int nh_pg_sets_add_guard(nh_pg_sets_t *g, nh_pg_db_t *db, const nh_pg_opcopy_t *c, nh_error_t *err);
/* Sends every held set, in the order the sets began. */
int nh_pg_sets_flush(nh_pg_sets_t *g, nh_pg_db_t *db, nh_error_t *err);
/* Frees what the sets hold; a batch with read sets must be over first (their callbacks
 * point into g). */
void nh_pg_sets_free(nh_pg_sets_t *g);

#endif
