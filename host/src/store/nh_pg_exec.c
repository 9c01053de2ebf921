/* The PostgreSQL store's executor: operations prepared once per connection, run one at a
 * time or many in a batch, always through libpq's pipeline mode. A pipeline is a list of
 * items sent back to back (a prepare the first time an operation is used, then the
 * operation; a batch adds BEGIN before and COMMIT after) and ended by one sync; their
 * results come back in the same order. Nothing waits for the server while a pipeline is
 * sent, so one pipeline is one round trip.
 *
 * The connection is non-blocking and pump() never waits: it sends what libpq holds and
 * takes the results that have arrived. Only wait_socket() waits (poll(2) on libpq's
 * socket); a loop drives the same pump from a uv_poll instead (nh_pg_batch_poll).
 *
 * A failed item aborts the rest of its pipeline (the server skips them until the sync):
 * in a batch, COMMIT is among them, and the transaction, left failed, is rolled back by
 * a second pipeline. Callbacks run only for a batch that committed.
 *
 * Operations come from operation tables (nh_pg_optab_t): the store's and the embedded
 * queue's, mixed freely in one batch. What a connection has prepared is kept per table. */
#include "nh_pg.h"
#include "nh_pg_ops.h"
#include "core/nh_log.h"
#include "core/nh_util.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { ITEM_PREPARE, ITEM_OP, ITEM_BEGIN, ITEM_COMMIT, ITEM_ROLLBACK } item_kind_t;

typedef struct item {
  item_kind_t kind;
  const nh_pg_optab_t *tab;   /* ITEM_PREPARE, ITEM_OP: the operation, tab's op */
  int op;
  int seq;                  /* ITEM_OP: the operation's number in its batch, from 1 */
  nh_pg_result_cb cb;
  void *data;
  PGresult *res;            /* kept until the pipeline is over */
} item_t;

typedef enum { IDLE, ADDING, WAITING, ROLLING_BACK } phase_t;
enum { UNPREPARED, PREPARE_SENT, PREPARED };

/* The tables a connection may run operations of: the store's and the queue's, and room. */
#define MAX_TABLES 4

/* What a connection has prepared of one table, one state per operation. */
typedef struct prepared {
  const nh_pg_optab_t *tab;
  unsigned char *state;
} prepared_t;

struct nh_pg_db {
  PGconn *conn;
  prepared_t prepared[MAX_TABLES];
  int ntables;
  nh_pg_db_stats_t stats;
  int failed;
  nh_error_t last;
  /* the pipeline under way */
  phase_t phase;
  int batch;                /* BEGIN ... COMMIT around it (else one operation, nh_pg_db_run) */
  item_t *items;
  int nitems, cap;
  int nops;
  int next;                 /* the item whose result comes next */
  int got;                  /* ... has come (its NULL is still to come) */
  int failed_at;            /* the first item that failed (-1: none) */
  int lost;                 /* the connection is gone */
  int send_failed;          /* an item could not be sent: err holds why */
  int commit_sent;
  nh_pg_batch_outcome_t outcome;   /* of the last batch, once it is over */
  nh_error_t err;
};

nh_pg_db_t *nh_pg_db_new(PGconn *conn)
{
  nh_pg_db_t *db = nh_xcalloc(1, sizeof *db);
  db->conn = conn;
  db->failed_at = -1;
  /* the executor waits itself (wait_socket): libpq must never block in a send */
  PQsetnonblocking(conn, 1);
  return db;
}

static void drop_items(nh_pg_db_t *db)
{
  for (int i = 0; i < db->nitems; i++) PQclear(db->items[i].res);
  db->nitems = 0;
}

PGconn *nh_pg_db_detach(nh_pg_db_t *db)
{
  PGconn *conn = db->conn;
  drop_items(db);
  free(db->items);
  for (int i = 0; i < db->ntables; i++) free(db->prepared[i].state);
  free(db);
  return conn;
}

void nh_pg_db_free(nh_pg_db_t *db)
{
  if (db) PQfinish(nh_pg_db_detach(db));
}

PGconn *nh_pg_db_conn(nh_pg_db_t *db) { return db->conn; }
void nh_pg_db_stats(nh_pg_db_t *db, nh_pg_db_stats_t *out) { *out = db->stats; }
int nh_pg_db_failed(nh_pg_db_t *db) { return db->failed; }
const nh_error_t *nh_pg_db_error(nh_pg_db_t *db) { return &db->last; }
void nh_pg_db_clear_failed(nh_pg_db_t *db) { db->failed = 0; }

void nh_pg_db_set_failed(nh_pg_db_t *db, const nh_error_t *err)
{
  db->failed = 1;
  if (err) db->last = *err;
}

/* The operation's name as messages show it: "audit_put". */
static const char *shown(const nh_pg_optab_t *tab, int op) { return tab->ops[op].name + tab->prefix; }

/* The connection's prepare states of tab's operations, made on first use (NULL: more
 * tables than MAX_TABLES). A table is found by its address: each is one constant. */
static unsigned char *prepared_of(nh_pg_db_t *db, const nh_pg_optab_t *tab)
{
  for (int i = 0; i < db->ntables; i++)
    if (db->prepared[i].tab == tab) return db->prepared[i].state;
  if (db->ntables == MAX_TABLES) return NULL;
  prepared_t *p = &db->prepared[db->ntables++];
  p->tab = tab;
  p->state = nh_xcalloc((size_t)tab->count, 1);
  return p->state;
}

static item_t *push(nh_pg_db_t *db, item_kind_t kind, const nh_pg_optab_t *tab, int op)
{
  if (db->nitems == db->cap) {
    db->cap = db->cap ? db->cap * 2 : 16;
    db->items = nh_xrealloc(db->items, sizeof *db->items * (size_t)db->cap);
  }
  item_t *it = &db->items[db->nitems++];
  memset(it, 0, sizeof *it);
  it->kind = kind;
  it->tab = tab;
  it->op = op;
  return it;
}

/* ---------------------------------------------------------------- sending */

static int send_failed(nh_pg_db_t *db, const char *doing, nh_error_t *err)
{
  if (!db->send_failed) {
    db->send_failed = 1;
    nh_pg_explain_result(db->conn, NULL, doing, &db->err);
  }
  if (err) *err = db->err;
  return NH_EFAIL;
}

static int start(nh_pg_db_t *db, int batch, nh_error_t *err)
{
  if (db->phase != IDLE)
    return nh_error_set(err, NH_ESTATE, "store: a batch is under way on this connection: commit it first "
                        "(a bug of nimbus-host)");
  db->batch = batch;
  db->nops = 0;
  db->next = db->got = 0;
  db->failed_at = -1;
  db->lost = db->send_failed = db->commit_sent = 0;
  memset(&db->err, 0, sizeof db->err);
  if (!PQenterPipelineMode(db->conn)) {
    nh_pg_explain_result(db->conn, NULL, batch ? "starting a batch" : "starting a statement", err);
    return NH_EFAIL;
  }
  db->phase = ADDING;
  return NH_OK;
}

static int send_plain(nh_pg_db_t *db, item_kind_t kind, const char *sql, nh_error_t *err)
{
  if (!PQsendQueryParams(db->conn, sql, 0, NULL, NULL, NULL, NULL, 0)) return send_failed(db, sql, err);
  push(db, kind, NULL, -1);
  db->stats.statements++;
  return NH_OK;
}

static int send_op(nh_pg_db_t *db, const nh_pg_optab_t *tab, int op, const nh_pg_args_t *args, nh_pg_result_cb cb,
                   void *data, nh_error_t *err)
{
  char doing[96];
  int known = op >= 0 && op < tab->count;
  if (!known || args->n != tab->ops[op].nparams)
    return nh_error_set(err, NH_EUSAGE, "%s: operation %d given %d parameters, not %d (a bug of nimbus-host)",
                        tab->what, op, args->n, known ? tab->ops[op].nparams : 0);
  unsigned char *prepared = prepared_of(db, tab);
  if (!prepared)
    return nh_error_set(err, NH_EUSAGE, "%s: more than %d operation tables on one connection (a bug of "
                        "nimbus-host)", tab->what, MAX_TABLES);
  if (db->send_failed) {
    *err = db->err;
    return NH_EFAIL;
  }
  const nh_pg_opdef_t *def = &tab->ops[op];
  if (prepared[op] == UNPREPARED) {
    if (!PQsendPrepare(db->conn, def->name, def->sql, def->nparams, NULL)) {
      snprintf(doing, sizeof doing, "preparing %s", shown(tab, op));
      return send_failed(db, doing, err);
    }
    push(db, ITEM_PREPARE, tab, op);
    prepared[op] = PREPARE_SENT;
    db->stats.prepares++;
  }
  /* binary results: bodies as their bytes, numbers as 8 bytes (nh_pg_col_*) */
  if (!PQsendQueryPrepared(db->conn, def->name, args->n, args->values, args->lengths, args->formats, 1)) {
    snprintf(doing, sizeof doing, "sending %s", shown(tab, op));
    return send_failed(db, doing, err);
  }
  item_t *it = push(db, ITEM_OP, tab, op);
  it->seq = ++db->nops;
  it->cb = cb;
  it->data = data;
  db->stats.statements++;
  return NH_OK;
}

static int send_sync(nh_pg_db_t *db, nh_error_t *err)
{
  if (!PQpipelineSync(db->conn)) return send_failed(db, "ending a pipeline", err);
  db->stats.pipelines++;
  db->phase = db->phase == ROLLING_BACK ? ROLLING_BACK : WAITING;
  return NH_OK;
}

/* ---------------------------------------------------------------- results */

/* What the failed item was doing, for nh_pg_explain_result. */
static void describe(nh_pg_db_t *db, const item_t *it, char *out, size_t len)
{
  const char *none = "; nothing of the batch was committed";
  switch (it ? it->kind : ITEM_OP) {
  case ITEM_PREPARE:
    snprintf(out, len, "preparing %s%s", shown(it->tab, it->op), db->batch ? none : "");
    break;
  case ITEM_BEGIN:
    snprintf(out, len, "starting a batch of %d statements", db->nops);
    break;
  case ITEM_COMMIT:
    if (db->lost)
      snprintf(out, len, "committing a batch of %d statements; whether it was committed is unknown: read the rows "
               "back to know", db->nops);
    else
      snprintf(out, len, "committing a batch of %d statements%s", db->nops, none);
    break;
  case ITEM_ROLLBACK:
    snprintf(out, len, "rolling back a failed batch");
    break;
  case ITEM_OP:
    /* The server saying why it stopped at this statement proves it never got to COMMIT.
     * A connection that just broke proves nothing: the results of a batch that committed
     * may be what was lost. */
    if (db->batch && db->lost && db->commit_sent && !(it && it->res && PQresultErrorField(it->res, PG_DIAG_SQLSTATE)))
      none = "; whether the batch was committed is unknown: read its rows back to know";
    if (!it) snprintf(out, len, "waiting for the results of %s%s", db->batch ? "a batch" : "a statement",
                      db->batch ? none : "");
    else if (db->batch)
      snprintf(out, len, "running statement %d of a batch of %d (%s)%s", it->seq, db->nops, shown(it->tab, it->op),
               none);
    else
      snprintf(out, len, "running %s", shown(it->tab, it->op));
    break;
  }
}

static int failed_result(const PGresult *r)
{
  ExecStatusType st = PQresultStatus(r);
  return st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK && st != PGRES_PIPELINE_ABORTED;
}

static void took(nh_pg_db_t *db, PGresult *r)
{
  if (db->next >= db->nitems) {   /* a result with no item: libpq's own (a lost connection) */
    if (db->failed_at < 0 && failed_result(r)) {
      db->lost = 1;
      nh_pg_explain_result(db->conn, r, "waiting for results", &db->err);
    }
    PQclear(r);
    return;
  }
  item_t *it = &db->items[db->next];
  if (it->res) {   /* a second result for one item: an error after its rows */
    if (failed_result(r) && !failed_result(it->res)) {
      PQclear(it->res);
      it->res = r;
    } else {
      PQclear(r);
    }
  } else {
    it->res = r;
  }
  db->got = 1;
  if (it->kind == ITEM_PREPARE)
    prepared_of(db, it->tab)[it->op] = PQresultStatus(it->res) == PGRES_COMMAND_OK ? PREPARED : UNPREPARED;
  if (db->failed_at < 0 && failed_result(it->res)) db->failed_at = db->next;
}

/* Explains the first failure into db->err (once). */
static void explain_failure(nh_pg_db_t *db)
{
  if (db->err.code) return;
  char doing[256];
  const item_t *it = db->failed_at >= 0 ? &db->items[db->failed_at]
                     : db->next < db->nitems ? &db->items[db->next] : NULL;
  describe(db, it, doing, sizeof doing);
  nh_pg_explain_result(db->conn, it ? it->res : NULL, doing, &db->err);
}

/* 1 if the batch, ending now or just over without its commit confirmed, may have been
 * committed: COMMIT went to libpq (and so perhaps to the server), and no result proves the
 * server stopped before it. A statement the server refused proves it (whatever the error,
 * 57P01 too: the server was there, and skips the rest of the pipeline, COMMIT included),
 * and so does COMMIT refused for a reason of its own (40001, a deferred constraint). COMMIT
 * answered with the connection's end (08xxx, 57P0x) is not proof: a backend terminated
 * while waiting for a synchronous standby has committed locally. Nor is COMMIT's success
 * followed by a loss: the batch did commit, but its callbacks cannot run (libpq gives no
 * SQLSTATE for its own errors, so a lost connection is never taken for the server's word). */
static int in_doubt(const nh_pg_db_t *db)
{
  if (!db->batch || !db->commit_sent) return 0;
  for (int i = 0; i < db->nitems; i++) {
    const item_t *it = &db->items[i];
    const char *code = it->res ? PQresultErrorField(it->res, PG_DIAG_SQLSTATE) : NULL;
    if (it->kind == ITEM_COMMIT) {
      if (!it->res || PQresultStatus(it->res) == PGRES_COMMAND_OK) return 1;
      if (PQresultStatus(it->res) == PGRES_PIPELINE_ABORTED) return 0;
      return !code || strncmp(code, "08", 2) == 0 || strncmp(code, "57P0", 4) == 0;
    }
    if (it->res && (PQresultStatus(it->res) == PGRES_PIPELINE_ABORTED || (failed_result(it->res) && code)))
      return 0;
  }
  return 1;
}

/* The pipeline is over, the connection idle again (or gone). */
static void finish(nh_pg_db_t *db)
{
  for (int i = 0; i < db->ntables; i++) {
    prepared_t *p = &db->prepared[i];
    for (int op = 0; op < p->tab->count; op++)
      if (p->state[op] == PREPARE_SENT) p->state[op] = UNPREPARED;   /* skipped, or never answered */
  }
  if (!db->lost && !PQexitPipelineMode(db->conn) && !db->err.code)
    nh_pg_explain_result(db->conn, NULL, "leaving pipeline mode", &db->err);
  db->phase = IDLE;
}

/* The sync came back: done, or (a batch whose transaction failed) roll back first. */
static int synced(nh_pg_db_t *db)
{
  int failed = db->failed_at >= 0 || db->send_failed;
  if (failed) explain_failure(db);
  /* failed (INERROR), or never told to commit (a send failed: INTRANS) */
  PGTransactionStatusType tx = PQtransactionStatus(db->conn);
  if (db->phase == WAITING && db->batch && (tx == PQTRANS_INERROR || tx == PQTRANS_INTRANS)) {
    db->phase = ROLLING_BACK;
    db->next = db->nitems;
    db->got = 0;
    nh_error_t ignored;
    /* the sync may not be flushed yet: a loop must also wait to write, or it waits for ever */
    if (send_plain(db, ITEM_ROLLBACK, "ROLLBACK", &ignored) == NH_OK && send_sync(db, &ignored) == NH_OK)
      return NH_PG_WANT_READ | (PQflush(db->conn) > 0 ? NH_PG_WANT_WRITE : 0);
    db->lost = PQstatus(db->conn) == CONNECTION_BAD;
  }
  finish(db);
  return 0;
}

static int lost(nh_pg_db_t *db)
{
  db->lost = 1;
  explain_failure(db);
  finish(db);
  return 0;
}

/* Sends, receives, never waits: what to wait for next, or 0 when the pipeline is over. */
static int pump(nh_pg_db_t *db)
{
  if (db->phase != WAITING && db->phase != ROLLING_BACK) return 0;
  int flush = PQflush(db->conn);
  int input = PQconsumeInput(db->conn);
  /* after a failed send or read libpq may still hold the server's last words (57P01,
   * say): they are read below, before the connection is declared lost */
  while (!PQisBusy(db->conn)) {
    PGresult *r = PQgetResult(db->conn);
    if (!r) {
      if (PQstatus(db->conn) == CONNECTION_BAD) return lost(db);
      if (!db->got) break;   /* the next item's results have not started */
      db->next++;
      db->got = 0;
      continue;
    }
    if (PQresultStatus(r) == PGRES_PIPELINE_SYNC) {
      PQclear(r);
      return synced(db);
    }
    took(db, r);
  }
  if (flush < 0 || !input || PQstatus(db->conn) == CONNECTION_BAD) return lost(db);
  return NH_PG_WANT_READ | (flush > 0 ? NH_PG_WANT_WRITE : 0);
}

/* The one place the executor waits. */
static void wait_socket(nh_pg_db_t *db, int want)
{
  struct pollfd p = { .fd = PQsocket(db->conn), .events = POLLIN };
  if (p.fd < 0) return;   /* gone: the next pump finds out */
  if (want & NH_PG_WANT_WRITE) p.events |= POLLOUT;
  while (poll(&p, 1, -1) < 0 && errno == EINTR) {}
}

static int run_to_end(nh_pg_db_t *db)
{
  int want;
  while ((want = pump(db)) != 0) wait_socket(db, want);
  return db->err.code ? db->err.code : NH_OK;
}

/* ---------------------------------------------------------------- one operation */

int nh_pg_db_run_op(nh_pg_db_t *db, const nh_pg_optab_t *tab, int op, nh_pg_args_t *args, PGresult **res,
                    nh_error_t *err)
{
  if (res) *res = NULL;
  int rc = start(db, 0, err);
  if (rc) {
    nh_pg_args_release(args);
    return rc;
  }
  rc = send_op(db, tab, op, args, NULL, NULL, err);
  nh_pg_args_release(args);   /* libpq has copied them, or they will not be sent */
  if (rc == NH_OK) rc = send_sync(db, err);
  if (rc) {
    /* what was sent still comes back: read it, then say the first thing that failed */
    nh_error_t first = *err;
    if (db->phase == ADDING && send_sync(db, NULL) != NH_OK) lost(db);
    run_to_end(db);
    drop_items(db);
    *err = db->err.code ? db->err : first;
    return err->code ? err->code : NH_EFAIL;
  }
  rc = run_to_end(db);
  if (rc) {
    *err = db->err;
  } else {
    for (int i = 0; i < db->nitems; i++)
      if (db->items[i].kind == ITEM_OP && res) {
        *res = db->items[i].res;
        db->items[i].res = NULL;
      }
  }
  drop_items(db);
  return rc;
}

int nh_pg_db_run(nh_pg_db_t *db, nh_pgop_t op, nh_pg_args_t *args, PGresult **res, nh_error_t *err)
{
  return nh_pg_db_run_op(db, &nh_pg_store_optab, (int)op, args, res, err);
}

/* ---------------------------------------------------------------- batches */

int nh_pg_batch_begin(nh_pg_db_t *db, nh_error_t *err)
{
  if (db->phase == IDLE && PQtransactionStatus(db->conn) != PQTRANS_IDLE)
    return nh_error_set(err, NH_ESTATE, "store: a batch cannot start inside an open transaction on its connection "
                        "(a bug of nimbus-host)");
  int rc = start(db, 1, err);
  if (rc) return rc;
  if (send_plain(db, ITEM_BEGIN, "BEGIN", err)) return NH_EFAIL;
  return NH_OK;
}

int nh_pg_batch_add_op(nh_pg_db_t *db, const nh_pg_optab_t *tab, int op, nh_pg_args_t *args, nh_pg_result_cb cb,
                       void *data, nh_error_t *err)
{
  int rc = db->phase != ADDING || !db->batch
               ? nh_error_set(err, NH_ESTATE, "store: no batch is open on this connection (a bug of nimbus-host)")
               : send_op(db, tab, op, args, cb, data, err);
  nh_pg_args_release(args);   /* libpq has copied them, or they will not be sent */
  return rc;
}

int nh_pg_batch_add(nh_pg_db_t *db, nh_pgop_t op, nh_pg_args_t *args, nh_pg_result_cb cb, void *data,
                    nh_error_t *err)
{
  return nh_pg_batch_add_op(db, &nh_pg_store_optab, (int)op, args, cb, data, err);
}

int nh_pg_batch_send_commit(nh_pg_db_t *db, nh_error_t *err)
{
  if (db->phase != ADDING || !db->batch)
    return nh_error_set(err, NH_ESTATE, "store: no batch is open on this connection (a bug of nimbus-host)");
  if (!db->send_failed) db->commit_sent = send_plain(db, ITEM_COMMIT, "COMMIT", NULL) == NH_OK;
  /* even after a failed send: the sync lets the server skip the rest and answer */
  if (send_sync(db, NULL) != NH_OK) {
    db->phase = WAITING;
    lost(db);
  }
  return NH_OK;
}

int nh_pg_batch_poll(nh_pg_db_t *db, int *rc, nh_error_t *err)
{
  if (db->phase == ADDING) {
    *rc = nh_error_set(err, NH_ESTATE, "store: the batch has not been sent (nh_pg_batch_send_commit first; a bug "
                       "of nimbus-host)");
    return 0;
  }
  int want = pump(db);
  if (want) return want;
  *rc = db->err.code ? db->err.code : NH_OK;
  db->outcome = *rc == NH_OK ? NH_PG_COMMITTED : in_doubt(db) ? NH_PG_UNKNOWN : NH_PG_NOT_COMMITTED;
  if (*rc) {
    *err = db->err;
  } else {
    for (int i = 0; i < db->nitems; i++) {
      item_t *it = &db->items[i];
      if (it->kind != ITEM_OP) continue;
      if (it->cb) it->cb(it->data, it->tab, it->op, it->res);
    }
  }
  drop_items(db);
  return 0;
}

int nh_pg_batch_commit(nh_pg_db_t *db, nh_error_t *err)
{
  int rc = nh_pg_batch_send_commit(db, err);
  if (rc) return rc;
  int want;
  while ((want = nh_pg_batch_poll(db, &rc, err)) != 0) wait_socket(db, want);
  return rc;
}

int nh_pg_batch_send_abandon(nh_pg_db_t *db, nh_error_t *err)
{
  if (db->phase != ADDING || !db->batch)
    return nh_error_set(err, NH_ESTATE, "store: no batch is open on this connection (a bug of nimbus-host)");
  if (!db->send_failed) send_plain(db, ITEM_ROLLBACK, "ROLLBACK", NULL);
  /* the batch's outcome: an error, so that no callback runs (unless a failure came first) */
  if (!db->err.code)
    nh_error_set(&db->err, NH_ESTATE, "store: the batch was abandoned before its commit; nothing of it was committed");
  if (send_sync(db, NULL) != NH_OK) {
    db->phase = WAITING;
    lost(db);
  }
  return NH_OK;
}

void nh_pg_batch_abandon(nh_pg_db_t *db)
{
  if (nh_pg_batch_send_abandon(db, NULL) != NH_OK) return;
  run_to_end(db);
  db->outcome = NH_PG_NOT_COMMITTED;
  drop_items(db);
}

nh_pg_batch_outcome_t nh_pg_batch_outcome(nh_pg_db_t *db)
{
  if (db->phase == IDLE) return db->outcome;
  return in_doubt(db) ? NH_PG_UNKNOWN : NH_PG_NOT_COMMITTED;
}

/* ---------------------------------------------------------------- copies */

/* Copies of a's parameters (it is released: its cleaned copies freed, as a send does). */
nh_pg_opcopy_t *nh_pg_opcopy_new(const nh_pg_optab_t *tab, int op, nh_pg_args_t *a)
{
  nh_pg_opcopy_t *c = nh_xcalloc(1, sizeof *c);
  c->tab = tab;
  c->op = op;
  c->n = a->n;
  for (int i = 0; i < a->n; i++) {
    c->formats[i] = a->formats[i];
    if (!a->values[i]) continue;
    size_t len = a->formats[i] ? (size_t)a->lengths[i] : strlen(a->values[i]);
    c->values[i] = nh_xmalloc(len + 1);
    memcpy(c->values[i], a->values[i], len);
    c->values[i][len] = '\0';
    c->lengths[i] = (int)len;
  }
  nh_pg_args_release(a);
  return c;
}

void nh_pg_opcopy_free(nh_pg_opcopy_t *c)
{
  if (!c) return;
  for (int i = 0; i < c->n; i++) free(c->values[i]);
  free(c);
}

void nh_pg_opcopy_args(const nh_pg_opcopy_t *c, nh_pg_args_t *a)
{
  nh_pg_args_reset(a);
  a->n = c->n;
  for (int i = 0; i < c->n; i++) {
    a->values[i] = c->values[i];
    a->lengths[i] = c->lengths[i];
    a->formats[i] = c->formats[i];
  }
}

/* Adds the copied operation to a batch. */
int nh_pg_opcopy_send(nh_pg_db_t *db, const nh_pg_opcopy_t *c, nh_pg_result_cb cb, void *data, nh_error_t *err)
{
  nh_pg_args_t a;
  nh_pg_opcopy_args(c, &a);
  return nh_pg_batch_add_op(db, c->tab, c->op, &a, cb, data, err);
}
