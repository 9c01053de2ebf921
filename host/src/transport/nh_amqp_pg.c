/* The AMQP transport's tables on a PostgreSQL store (docs/store-backends.md, "A broker
 * beside a PostgreSQL store"): amqp_outbox and amqp_deliveries in the store's database,
 * so hosts on several machines keep one audit trail, one set of blocked sessions and one
 * outbox, with the broker carrying the events.
 *
 * The loop never waits for the server:
 * - Inside the pump's pass (nh_uow_open) a statement goes through the pump's unit of work.
 *   A delivery count not read yet is a miss: the pass is void and its fill bumps and reads
 *   it (the next pass finds it). An outbox row and a count's deletion join the pass's
 *   commit, so a handler's publishes are written with its outcome, as on sqlite.
 * - The transaction's phases come from the unit (nh_uow_set_txn_hook): settlements are held
 *   until the pump's commit came back COMMITTED; a commit that did not, or is in doubt,
 *   drops them and puts the deliveries back in their buffers (the store recognises a
 *   recorded outcome when they are handed out again).
 * - Everything else is a batch of its own on the link, one at a time, the next gathering
 *   what comes meanwhile: accepted rows deleted, rows read to be sent (the released ones
 *   by seq, then the owner's rows after the last one sent: one writer per owner, and its
 *   batches run one at a time on one connection, so seq order is commit order), and every
 *   NH_AMQP_PG_ADOPT_MS the rows of hosts on other machines that stopped refreshing their
 *   row in the hosts table (sent again from here: at least once, as after a crash).
 * A batch that fails is made again at the next tick of the timer (NH_AMQP_PG_TICK_MS) or
 * the next acceptance, whichever comes first: nothing it carried is dropped. */
#include "nh_amqp_priv.h"
#include "nh_embedded.h"
#include "core/nh_log.h"
#include "core/nh_util.h"
#include "store/nh_pg_amqp.h"
#include "store/nh_pg_link.h"
#include "store/nh_pg_set.h"
#include "store/nh_uow.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NH_AMQP_PG_TICK_MS 5000
#define NH_AMQP_PG_ADOPT_MS 30000
/* A row is taken from a host gone for this long (its hosts row not refreshed): well
 * beyond the refresh period, and beyond any `publish` command still waiting for the broker. */
#define NH_AMQP_PG_GONE_MS 60000

struct amqp_pg {
  amqp_t *a;
  nh_pg_link_t *link;
  nh_uow_t *uow;
  uv_timer_t tick;
  int ticking;
  int64_t adopted_at;
  nh_pg_opcopy_t **waiting;   /* writes outside a pass, for the next batch */
  int nwaiting, cwaiting;
  nh_pg_opcopy_t **out;       /* ... and the batch's */
  int nout, cout;
  int want_read, want_adopt;
  int sending;                /* a batch is out */
  int failed;                 /* the last batch failed: the next waits for the tick */
  int closing;                /* the transport is closed: free everything when the batch is over */
  /* the batch out, as built */
  uint64_t gen;               /* a->conn_gen */
  int reads, adopts;
  int ndel;                   /* a->acked[0, ndel) */
  int nres;                   /* a->resend[0, nres) */
  int res_done;               /* of them, sent (or gone) */
  int blocked;                /* a sender had no credit: what follows waits for PN_LINK_FLOW */
  int rows;                   /* OUT_NEXT's rows */
  int64_t expect;             /* a command's row (nh_amqp_pg_outbox_batch): pending until sent past it */
};

static void kick(amqp_pg_t *p);

/* ---------------------------------------------------------------- the batch's results */

/* The rows answer the connection the batch was built for, and that one is still up. */
static int current(amqp_pg_t *p) { return !p->closing && p->gen == p->a->conn_gen && p->a->ssn; }

static void on_one(void *data, const nh_pg_optab_t *tab, int op, const PGresult *res)
{
  (void)tab, (void)op;
  amqp_pg_t *p = data;
  if (!current(p) || p->blocked) return;
  if (PQntuples(res) > 0) {   /* none: deleted meanwhile, nothing to send */
    nh_pga_out_row_t row;
    nh_pga_out_row(res, 0, &row);
    if (!nh_amqp_outbox_send(p->a, row.seq, row.address, row.message, row.len)) {
      p->blocked = 1;
      return;
    }
  }
  p->res_done++;
}

static void on_next(void *data, const nh_pg_optab_t *tab, int op, const PGresult *res)
{
  (void)tab, (void)op;
  amqp_pg_t *p = data;
  amqp_t *a = p->a;
  p->rows = PQntuples(res);
  if (!current(p) || p->blocked) return;
  for (int i = 0; i < p->rows; i++) {
    nh_pga_out_row_t row;
    nh_pga_out_row(res, i, &row);
    if (!nh_amqp_outbox_acked(a, row.seq) && !nh_amqp_outbox_send(a, row.seq, row.address, row.message, row.len)) {
      p->blocked = 1;
      return;
    }
    a->last_sent = row.seq;
  }
}

static void on_adopted(void *data, const nh_pg_optab_t *tab, int op, const PGresult *res)
{
  (void)tab, (void)op;
  amqp_pg_t *p = data;
  amqp_t *a = p->a;
  int n = PQntuples(res);
  if (n == 0 || p->closing) return;
  /* below the cursor, most likely: each is sent on its own, as a released row is */
  for (int i = 0; i < n; i++) {
    a->resend = nh_amqp_grow(a->resend, &a->cresend, a->nresend + 1, sizeof *a->resend);
    a->resend[a->nresend++] = nh_pg_col_i64(res, i, 0);
  }
  p->want_read = 1;
  nh_log_info("amqp", "sending %d outbox message(s) left by hosts that stopped refreshing their presence for %d s",
              n, NH_AMQP_PG_GONE_MS / 1000);
}

/* ---------------------------------------------------------------- the batch */

static void list_free(nh_pg_opcopy_t **l, int *n)
{
  for (int i = 0; i < *n; i++) nh_pg_opcopy_free(l[i]);
  *n = 0;
}

static void pg_destroy(amqp_pg_t *p)
{
  list_free(p->waiting, &p->nwaiting);
  list_free(p->out, &p->nout);
  free(p->waiting);
  free(p->out);
  amqp_t *a = p->a;
  free(p);
  free(a);
}

static int build(void *data, nh_pg_db_t *db, nh_error_t *err)
{
  amqp_pg_t *p = data;
  amqp_t *a = p->a;
  nh_pg_args_t args;
  /* the writes as set statements (store/nh_pg_set.h): the acked rows' deletes one */
  nh_pg_sets_t g;
  nh_pg_sets_init(&g);
  int rc = NH_OK;
  for (int i = 0; i < p->nout && rc == NH_OK; i++) {
    nh_pg_opcopy_args(p->out[i], &args);
    rc = nh_pg_sets_add(&g, db, p->out[i]->tab, p->out[i]->op, &args, NULL, NULL, err);
  }
  p->gen = a->conn_gen;
  p->ndel = a->nacked;
  for (int i = 0; i < p->ndel && rc == NH_OK; i++) {
    nh_pgaop_t op = nh_pgaargs_out_del(&args, a->acked[i]);
    rc = nh_pg_sets_add(&g, db, &nh_pga_optab, (int)op, &args, NULL, NULL, err);
  }
  if (rc == NH_OK) rc = nh_pg_sets_flush(&g, db, err);
  nh_pg_sets_free(&g);
  if (rc) return err->code;
  if (p->adopts) {
    nh_pgaop_t op = nh_pgaargs_out_adopt(&args, a->owner, nh_time_now_ms() - NH_AMQP_PG_GONE_MS);
    if (nh_pga_batch_add(db, op, &args, on_adopted, p, err)) return err->code;
  }
  p->res_done = p->blocked = p->rows = 0;
  p->nres = 0;
  if (p->reads && a->ssn) {
    p->nres = a->nresend;
    for (int i = 0; i < p->nres; i++)
      if (nh_pga_batch_add(db, nh_pgaargs_out_one(&args, a->resend[i]), &args, on_one, p, err)) return err->code;
    nh_pgaop_t op = nh_pgaargs_out_next(&args, a->owner, a->last_sent, NH_OUTBOX_BATCH);
    if (nh_pga_batch_add(db, op, &args, on_next, p, err)) return err->code;
  }
  return NH_OK;
}

/* out and waiting trade places: their items, counts and storage */
static void lists_swap(amqp_pg_t *p)
{
  nh_pg_opcopy_t **items = p->out;
  int n = p->nout, cap = p->cout;
  p->out = p->waiting;
  p->nout = p->nwaiting;
  p->cout = p->cwaiting;
  p->waiting = items;
  p->nwaiting = n;
  p->cwaiting = cap;
}

static void done(void *data, nh_pg_batch_outcome_t outcome, const nh_error_t *err)
{
  amqp_pg_t *p = data;
  amqp_t *a = p->a;
  p->sending = 0;
  if (p->closing) {
    pg_destroy(p);
    return;
  }
  if (outcome == NH_PG_COMMITTED) {
    list_free(p->out, &p->nout);
    if (p->ndel > 0) {
      memmove(a->acked, a->acked + p->ndel, sizeof *a->acked * (size_t)(a->nacked - p->ndel));
      a->nacked -= p->ndel;
    }
    if (p->gen == a->conn_gen && p->res_done > 0) {   /* a new connection emptied the list */
      memmove(a->resend, a->resend + p->res_done, sizeof *a->resend * (size_t)(a->nresend - p->res_done));
      a->nresend -= p->res_done;
    }
    if (p->reads && p->gen == a->conn_gen && !p->blocked && p->rows == NH_OUTBOX_BATCH) p->want_read = 1;
    if (p->reads && p->gen != a->conn_gen) p->want_read = 1;
    if (a->conn) nh_amqp_conn_flush(a->conn);
  } else {
    /* nothing of it happened: its writes and its deletes go in the next, its reads again
     * (stopping, the link closes under it: what is left is done by the next start) */
    if (!a->shutting_down)
      nh_log_warn("amqp", "the outbox's batch on PostgreSQL %s (%s); made again within %d s",
                  outcome == NH_PG_UNKNOWN ? "may not have committed" : "did not commit",
                  err && err->msg[0] ? err->msg : "the connection went", NH_AMQP_PG_TICK_MS / 1000);
    for (int i = 0; i < p->nwaiting; i++) {   /* the batch's writes first, then what came since */
      p->out = nh_amqp_grow(p->out, &p->cout, p->nout + 1, sizeof *p->out);
      p->out[p->nout++] = p->waiting[i];
    }
    p->nwaiting = 0;
    lists_swap(p);
    if (p->reads) p->want_read = 1;
    if (p->adopts) p->want_adopt = 1;
    p->failed = 1;
    return;
  }
  kick(p);
}

/* Sends a batch now if there is something to do and none is out. */
static void kick(amqp_pg_t *p)
{
  amqp_t *a = p->a;
  if (p->sending || p->failed || p->closing) return;
  if (!p->nwaiting && !p->want_read && !p->want_adopt && !a->nacked) return;
  lists_swap(p);   /* the (empty) out list's storage gathers the next */
  p->reads = p->want_read && a->ssn && !a->in_tx;
  if (p->reads) p->want_read = 0;
  p->adopts = p->want_adopt;
  p->want_adopt = 0;
  p->ndel = 0;
  if (!p->nout && !p->reads && !p->adopts && !a->nacked) return;
  p->sending = 1;
  nh_error_t err = { 0 };
  if (nh_pg_link_submit(p->link, build, done, p, &err)) done(p, NH_PG_NOT_COMMITTED, &err);
}

static void side_add(amqp_pg_t *p, nh_pgaop_t op, nh_pg_args_t *args)
{
  p->waiting = nh_amqp_grow(p->waiting, &p->cwaiting, p->nwaiting + 1, sizeof *p->waiting);
  p->waiting[p->nwaiting++] = nh_pg_opcopy_new(&nh_pga_optab, (int)op, args);
}

/* A failed batch waits for this; adopting orphaned rows happens every NH_AMQP_PG_ADOPT_MS. */
static void on_tick(uv_timer_t *h)
{
  amqp_pg_t *p = h->data;
  int64_t now = nh_time_now_ms();
  if (now - p->adopted_at >= NH_AMQP_PG_ADOPT_MS) {
    p->adopted_at = now;
    p->want_adopt = 1;
  }
  p->failed = 0;
  kick(p);
}

/* ---------------------------------------------------------------- the transport's calls */

void nh_amqp_pg_pump(amqp_t *a)
{
  a->pg->want_read = 1;
  kick(a->pg);
}

void nh_amqp_pg_acked(amqp_t *a) { kick(a->pg); }

int nh_amqp_pg_dlv_bump(amqp_t *a, const char *endpoint, const char *message_id)
{
  amqp_pg_t *p = a->pg;
  if (!p->uow || !nh_uow_open(p->uow)) {
    nh_log_error("amqp", "counting a redelivery outside the pump's transaction");
    return NH_EFAIL;
  }
  size_t len = strlen(endpoint) + strlen(message_id) + 8;
  char *key = nh_xmalloc(len);
  snprintf(key, len, "a\x1f" "dlv\x1f%s\x1f%s", endpoint, message_id);
  nh_pg_args_t args;
  const PGresult *r = NULL;
  nh_pgaop_t op = nh_pgaargs_dlv_bump(&args, endpoint, message_id);
  int got = nh_uow_op_read(p->uow, key, &nh_pga_optab, (int)op, &args, (const struct pg_result **)&r);
  free(key);
  if (got < 0) return NH_EFAIL;
  if (got == 0) return 0;
  int64_t count = nh_pga_count(r);
  return count > 0 ? (int)count : 1;
}

/* A write: in the pass's commit when a pass is open, else in a batch of its own. */
static int write_op(amqp_pg_t *p, nh_pgaop_t op, nh_pg_args_t *args, nh_error_t *err)
{
  if (p->uow && nh_uow_open(p->uow)) return nh_uow_op(p->uow, &nh_pga_optab, (int)op, args, err);
  side_add(p, op, args);
  return NH_OK;
}

int nh_amqp_pg_dlv_del(amqp_t *a, const char *endpoint, const char *message_id)
{
  nh_pg_args_t args;
  nh_error_t err = { 0 };
  if (write_op(a->pg, nh_pgaargs_dlv_del(&args, endpoint, message_id), &args, &err)) {
    nh_log_error("amqp", "deleting a delivery count: %s", err.msg);
    return NH_EFAIL;
  }
  if (!a->in_tx) kick(a->pg);
  return NH_OK;
}

int nh_amqp_pg_out_add(amqp_t *a, const char *address, const void *message, size_t len, nh_error_t *err)
{
  nh_pg_args_t args;
  nh_pgaop_t op = nh_pgaargs_out_add(&args, a->owner, address, message, len, nh_time_now_ms());
  if (write_op(a->pg, op, &args, err)) return err->code ? err->code : NH_EFAIL;
  /* outside a pass, the batch that writes it reads it back to send it */
  if (!(a->pg->uow && nh_uow_open(a->pg->uow))) nh_amqp_pg_pump(a);
  return NH_OK;
}

void nh_amqp_pg_attach(amqp_t *a, nh_uow_t *uow) { a->pg->uow = uow; }

/* ---------------------------------------------------------------- a command's publish */

static void on_written(void *data, const nh_pg_optab_t *tab, int op, const PGresult *res)
{
  (void)tab, (void)op;
  amqp_pg_t *p = data;
  int64_t seq = nh_pga_count(res);   /* RETURNING seq: the one bigint */
  if (seq > p->expect) p->expect = seq;
}

int nh_amqp_pg_outbox_batch(nh_transport_t *t, nh_pg_db_t *db, const nh_msg_t *m, const char *to, nh_error_t *err)
{
  amqp_t *a = (amqp_t *)t;
  char address[600];
  size_t size;
  if (nh_amqp_address(a, to, m->session_id, address, sizeof address, err) ||
      nh_amqp_outbox_encode(a, m, to, &size, err))
    return err->code;
  nh_pg_args_t args;
  nh_pgaop_t op = nh_pgaargs_out_add(&args, a->owner, address, a->buf, size, nh_time_now_ms());
  return nh_pga_batch_add(db, op, &args, on_written, a->pg, err);
}

int nh_amqp_pg_pending(amqp_t *a)
{
  amqp_pg_t *p = a->pg;
  return a->unconfirmed + a->nacked + (p->sending || p->nwaiting || p->want_read) + (a->last_sent < p->expect);
}

/* ---------------------------------------------------------------- lifecycle */

/* Rows of this machine's processes that are gone, taken now (blocking, before the loop
 * runs: the same claim as on sqlite); rows of other machines' are adopted as the host runs. */
static int claim_dead(amqp_t *a, nh_pg_db_t *db, nh_error_t *err)
{
  nh_pg_args_t args;
  PGresult *r = NULL;
  if (nh_pga_run(db, nh_pgaargs_out_owners(&args, a->owner), &args, &r, err)) return err->code;
  int rc = NH_OK;
  for (int i = 0; i < PQntuples(r) && rc == NH_OK; i++) {
    const char *o = nh_pga_owner(r, i);
    if (!nh_owner_dead(o)) continue;
    PGresult *c = NULL;
    rc = nh_pga_run(db, nh_pgaargs_out_claim(&args, a->owner, o), &args, &c, err);
    if (rc == NH_OK && nh_pg_affected(c) > 0)
      nh_log_info("amqp", "sending %lld outbox message(s) left by %s (no longer running)",
                  (long long)nh_pg_affected(c), o);
    if (c) PQclear(c);
  }
  PQclear(r);
  return rc;
}

int nh_amqp_pg_open(amqp_t *a, nh_pg_link_t *link, PGconn *conn, nh_error_t *err)
{
  amqp_pg_t *p = nh_xcalloc(1, sizeof *p);
  p->a = a;
  p->link = link;
  a->pg = p;
  if (nh_pg_amqp_migrate(conn, err)) {
    PQfinish(conn);
    return err->code ? err->code : NH_EFAIL;
  }
  nh_pg_db_t *db = nh_pg_db_new(conn);
  if (claim_dead(a, db, err)) {
    nh_pg_db_free(db);
    return err->code ? err->code : NH_EFAIL;
  }
  /* the queue (control messages, session locks) takes the connection on */
  if (!(a->emb = nh_embedded_pg_init(link, nh_pg_db_detach(db), a->owner, err))) return err->code ? err->code : NH_EFAIL;
  uv_timer_init(a->loop, &p->tick);
  p->tick.data = p;
  p->ticking = 1;
  p->adopted_at = nh_time_now_ms();   /* the first adoption a period after start: the hosts table settles */
  uv_timer_start(&p->tick, on_tick, NH_AMQP_PG_TICK_MS, NH_AMQP_PG_TICK_MS);
  uv_unref((uv_handle_t *)&p->tick);
  return NH_OK;
}

void nh_amqp_pg_stop(amqp_t *a)
{
  amqp_pg_t *p = a->pg;
  if (!p->ticking) return;
  p->ticking = 0;
  uv_close((uv_handle_t *)&p->tick, NULL);
}

int nh_amqp_pg_free(amqp_t *a)
{
  amqp_pg_t *p = a->pg;   /* the timer is closed: nh_amqp_stop came first, or it never started */
  if (p->sending) {
    p->closing = 1;   /* freed, with `a`, when the link says the batch is over */
    return 1;
  }
  list_free(p->waiting, &p->nwaiting);
  free(p->waiting);
  free(p->out);
  free(p);
  return 0;
}
