/* The embedded transport on a PostgreSQL store (docs/store-backends.md, "The embedded
 * transport on PostgreSQL"): the same queue, session locks and dead letters as
 * nh_embedded.c, in the store's database, for hosts on any number of machines.
 *
 * Nothing here waits for the server. Inside a pump's pass (nh_uow_open) every statement
 * goes through the pump's unit of work: a read the unit does not have yet is a miss that
 * voids the pass, and its fill reads it (taking the heads of free sessions with their
 * leases is such a read: HEADS_AND_LOCK, FOR UPDATE SKIP LOCKED, so hosts scanning at
 * once never get one session); a write joins the pass's commit, so a message is settled
 * in the same transaction as its outcome (NH_CAP_ATOMIC_SETTLE). Outside a pass (a lease
 * renewed, a message given back after a failed commit) writes go in batches of their own
 * on the link, one at a time, the next gathering what comes meanwhile.
 *
 * A lease is the last word on who may record an outcome: the pass asks whether this host
 * still holds it (HELD) before it records one, and the commit ends it with UNLOCK_OWNED,
 * which fails the whole commit if another host took the session over in between.
 *
 * Hosts never wait for each other in a circle over leases (nh_pg_queue.c, "Lease keys"):
 * a fill leaves a session whose lease another transaction is writing for the next pump
 * (its LOCK answers "not free now"), and a batch that ends or renews leases takes their
 * keys first, in one order (the commit's, side_guards). */
#include "nh_embedded.h"
#include "core/nh_log.h"
#include "core/nh_strset.h"
#include "core/nh_util.h"
#include "store/nh_pg_link.h"
#include "store/nh_pg_queue.h"
#include "store/nh_pg_set.h"
#include "store/nh_uow.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A write outside a pass, waiting for its batch; a renewal remembers its session. */
typedef struct side {
  nh_pg_opcopy_t *op;
  char *renew_key;   /* "endpoint\x1fsession" of a RENEW, else NULL */
  struct pgq *q;
} side_t;

typedef struct side_list {
  side_t *items;
  int n, cap;
} side_list_t;

/* A read of this pump that takes leases in the fill that makes it: the endpoint's head
 * scan, or one session's lock for the due scan. */
typedef struct leasing {
  char *key;        /* the unit's */
  char *endpoint;
  int heads;        /* 1: HEADS_AND_LOCK (rows), 0: LOCK (a row when taken) */
} leasing_t;

typedef struct pgq {
  nh_transport_t base;
  nh_pg_link_t *link;
  nh_pg_db_t *sync;   /* a blocking connection: subscriptions (start-up, reload) */
  nh_uow_t *uow;      /* the pump's (the dispatcher attaches it: pgq_attach) */
  char *owner;
  side_list_t waiting, out;   /* writes outside a pass: gathering, and the batch on the link */
  int sending;
  int closing;        /* closed with a batch out: freed when it is over */
  char **lost;        /* leases a renewal found gone ("endpoint\x1fsession"), told at the next renew */
  int nlost;
  char *key;          /* scratch for the unit's keys */
  size_t key_cap;
  /* Leases a fill takes belong to the pump, whatever pass reads them; a later pass may not
   * ask again (its free slots went to replays, the due scan stopped sooner). So the reads
   * that take them are remembered for the pump, what the committing pass handed over is
   * remembered for the pass, and the rest is given back (nh_uow_hooks_t). */
  leasing_t *leasings;
  int nleasings, leasings_cap;
  nh_strset_t used;   /* "endpoint\x1fsession" handed over in this pass (a set: a pass's end
                         asks it of every lease its fills took, hundreds) */
  char **woken;       /* endpoints this pass queued for: one NOTIFY each as it commits */
  int nwoken;
} pgq_t;

/* ---------------------------------------------------------------- keys */

/* "q<what>\x1fa\x1fb..." in q->key: one question the pass asks the unit. */
static const char *key_of(pgq_t *q, const char *what, const char *a, const char *b, int64_t n)
{
  size_t need = strlen(what) + (a ? strlen(a) : 0) + (b ? strlen(b) : 0) + 48;
  if (need > q->key_cap) {
    q->key_cap = need * 2;
    q->key = nh_xrealloc(q->key, q->key_cap);
  }
  snprintf(q->key, q->key_cap, "q%s\x1f%s\x1f%s\x1f%lld", what, a ? a : "", b ? b : "", (long long)n);
  return q->key;
}

static char *session_key(const char *endpoint, const char *session)
{
  size_t len = strlen(endpoint) + strlen(session) + 2;
  char *k = nh_xmalloc(len);
  snprintf(k, len, "%s\x1f%s", endpoint, session);
  return k;
}

/* ---------------------------------------------------------------- leases of the pump */

static void leasing_note(pgq_t *q, const char *key, const char *endpoint, int heads)
{
  for (int i = 0; i < q->nleasings; i++)
    if (strcmp(q->leasings[i].key, key) == 0) return;
  if (q->nleasings == q->leasings_cap) {
    q->leasings_cap = q->leasings_cap ? q->leasings_cap * 2 : 16;
    q->leasings = nh_xrealloc(q->leasings, sizeof *q->leasings * (size_t)q->leasings_cap);
  }
  q->leasings[q->nleasings++] = (leasing_t){ nh_xstrdup(key), nh_xstrdup(endpoint), heads };
}

static void used_note(pgq_t *q, const char *endpoint, const char *session)
{
  char *k = session_key(endpoint, session);
  nh_strset_add(&q->used, k);
  free(k);
}

/* k is session_key(endpoint, session): compared in place, with no key built per lookup
 * (a pass's end looks up every lease its fills took). */
static int key_is(const char *k, const char *endpoint, const char *session)
{
  size_t n = strlen(endpoint);
  return strncmp(k, endpoint, n) == 0 && k[n] == '\x1f' && strcmp(k + n + 1, session) == 0;
}

static int used_has(pgq_t *q, const char *endpoint, const char *session)
{
  if (!q->used.count) return 0;
  char *k = session_key(endpoint, session);
  int has = nh_strset_has(&q->used, k);
  free(k);
  return has;
}

static void used_clear(pgq_t *q)
{
  nh_strset_clear(&q->used);
}

static void leasings_clear(pgq_t *q)
{
  for (int i = 0; i < q->nleasings; i++) {
    free(q->leasings[i].key);
    free(q->leasings[i].endpoint);
  }
  q->nleasings = 0;
}

static int write_op(pgq_t *q, nh_pgqop_t op, nh_pg_args_t *args);

/* Each lease a fill of this pump took: (session, seq of the head row or 0) to cb. */
static void leases_each(pgq_t *q, void (*cb)(pgq_t *, const char *, const char *, int64_t))
{
  for (int i = 0; i < q->nleasings; i++) {
    leasing_t *l = &q->leasings[i];
    const PGresult *r;
    if (!nh_uow_op_peek(q->uow, l->key, (const struct pg_result **)&r)) continue;   /* never read */
    for (int row = 0; row < PQntuples(r); row++) {
      if (l->heads) cb(q, l->endpoint, PQgetvalue(r, row, 1), nh_pg_col_i64(r, row, 0));
      else cb(q, l->endpoint, PQgetvalue(r, row, 0), 0);
    }
  }
}

static void give_back_unused(pgq_t *q, const char *endpoint, const char *session, int64_t seq)
{
  if (used_has(q, endpoint, session)) return;
  nh_pg_args_t a;
  if (seq > 0) write_op(q, nh_pgqargs_released(&a, seq), &a);   /* not a failed delivery */
  write_op(q, nh_pgqargs_unlock(&a, endpoint, session, q->owner), &a);
}

static void woken_clear(pgq_t *q)
{
  for (int i = 0; i < q->nwoken; i++) free(q->woken[i]);
  q->nwoken = 0;
}

static void woken_note(pgq_t *q, const char *endpoint)
{
  for (int i = 0; i < q->nwoken; i++)
    if (strcmp(q->woken[i], endpoint) == 0) return;
  q->woken = nh_xrealloc(q->woken, sizeof *q->woken * (size_t)(q->nwoken + 1));
  q->woken[q->nwoken++] = nh_xstrdup(endpoint);
}

static void on_pass_begin(void *data)
{
  used_clear(data);
  woken_clear(data);
}

/* The committing pass: leases it did not hand over end with its commit, and the hosts
 * listening hear of what it queued (once per endpoint: a NOTIFY per row cost the server
 * a statement per event). */
static void on_pass_end(void *data)
{
  pgq_t *q = data;
  leases_each(q, give_back_unused);
  nh_pg_args_t a;
  for (int i = 0; i < q->nwoken; i++) write_op(q, nh_pgqargs_notify(&a, q->woken[i]), &a);
  woken_clear(q);
}

static void give_back_any(pgq_t *q, const char *endpoint, const char *session, int64_t seq)
{
  (void)seq;
  nh_pg_args_t a;
  write_op(q, nh_pgqargs_unlock(&a, endpoint, session, q->owner), &a);   /* outside a pass: a batch of its own */
}

/* A pump whose commit did not come back COMMITTED handed nothing over that lasts: the
 * dispatcher drops or gives back its fetched jobs, and every lease its fills took ends. */
static void on_pump_end(void *data, int committed)
{
  pgq_t *q = data;
  if (!committed) leases_each(q, give_back_any);
  leasings_clear(q);
  used_clear(q);
}

/* Losses are rare and told once: a short list. */
static void lost_add(pgq_t *q, const char *k)
{
  q->lost = nh_xrealloc(q->lost, sizeof *q->lost * (size_t)(q->nlost + 1));
  q->lost[q->nlost++] = nh_xstrdup(k);
}

/* 1 if the session's lease was noted lost (it is not any more). */
static int lost_take(pgq_t *q, const char *endpoint, const char *session)
{
  for (int i = 0; i < q->nlost; i++) {
    if (!key_is(q->lost[i], endpoint, session)) continue;
    free(q->lost[i]);
    q->lost[i] = q->lost[--q->nlost];
    return 1;
  }
  return 0;
}

/* ---------------------------------------------------------------- writes outside a pass */

static void side_send(pgq_t *q);

static void side_list_free(side_list_t *l)
{
  for (int i = 0; i < l->n; i++) {
    nh_pg_opcopy_free(l->items[i].op);
    free(l->items[i].renew_key);
  }
  l->n = 0;
}

static void on_renewed(void *data, const nh_pg_optab_t *tab, int op, const PGresult *res)
{
  (void)tab;
  (void)op;
  side_t *s = data;
  if (nh_pg_affected(res) == 0) lost_add(s->q, s->renew_key);
}

/* The batch's lease keys first, in one statement and one order (nh_pg_queue.c, "Lease
 * keys"): renewals and lease ends of sessions another host's batch touches too (a lease
 * lost, taken over) never wait for each other in a circle. */
static int side_guards(pgq_t *q, nh_pg_db_t *db, nh_error_t *err)
{
  nh_pg_sets_t g;
  nh_pg_sets_init(&g);
  int rc = NH_OK;
  for (int i = 0; i < q->out.n && rc == NH_OK; i++) rc = nh_pg_sets_add_guard(&g, db, q->out.items[i].op, err);
  if (rc == NH_OK) rc = nh_pg_sets_flush(&g, db, err);
  nh_pg_sets_free(&g);
  return rc;
}

static int side_build(void *data, nh_pg_db_t *db, nh_error_t *err)
{
  pgq_t *q = data;
  if (side_guards(q, db, err)) return err->code;
  for (int i = 0; i < q->out.n; i++) {
    side_t *s = &q->out.items[i];
    if (nh_pg_opcopy_send(db, s->op, s->renew_key ? on_renewed : NULL, s, err)) return err->code;
  }
  return NH_OK;
}

static void pgq_free(pgq_t *q);

static void side_done(void *data, nh_pg_batch_outcome_t outcome, const nh_error_t *err)
{
  pgq_t *q = data;
  if (outcome != NH_PG_COMMITTED && !q->closing)
    nh_log_warn("embedded", "%d queue write(s) outside a pump not made (%s): a lease left behind expires "
                "(the transport's lock time) and its session is taken again",
                q->out.n, err && err->msg[0] ? err->msg : "the connection went");
  side_list_free(&q->out);
  q->sending = 0;
  if (q->closing) {
    pgq_free(q);
    return;
  }
  side_send(q);
}

static void side_send(pgq_t *q)
{
  if (q->sending || q->waiting.n == 0) return;
  side_list_t t = q->out;   /* the (empty) out list's storage is reused */
  q->out = q->waiting;
  q->waiting = t;
  q->sending = 1;
  nh_error_t err = {0};
  if (nh_pg_link_submit(q->link, side_build, side_done, q, &err)) side_done(q, NH_PG_NOT_COMMITTED, &err);
}

static void side_add(pgq_t *q, nh_pgqop_t op, nh_pg_args_t *args, const char *renew_key)
{
  side_list_t *l = &q->waiting;
  if (l->n == l->cap) {
    l->cap = l->cap ? l->cap * 2 : 16;
    l->items = nh_xrealloc(l->items, sizeof *l->items * (size_t)l->cap);
  }
  l->items[l->n++] = (side_t){ nh_pg_opcopy_new(&nh_pgq_optab, op, args), renew_key ? nh_xstrdup(renew_key) : NULL, q };
  side_send(q);
}

/* A write: in the pass's commit when a pass is open, else in a batch of its own. */
static int write_op(pgq_t *q, nh_pgqop_t op, nh_pg_args_t *args)
{
  if (q->uow && nh_uow_open(q->uow)) {
    nh_error_t err = {0};
    if (nh_uow_op(q->uow, &nh_pgq_optab, op, args, &err)) {
      nh_log_error("embedded", "%s", err.msg);
      return NH_EFAIL;
    }
    return NH_OK;
  }
  side_add(q, op, args, NULL);
  return NH_OK;
}

/* A read of the pass: 1 with *res, 0 when the unit does not have it yet (the pass is void). */
static int read_op(pgq_t *q, const char *key, nh_pgqop_t op, nh_pg_args_t *args, const PGresult **res)
{
  *res = NULL;
  if (!q->uow || !nh_uow_open(q->uow)) {
    nh_pg_args_release(args);
    return 0;
  }
  int rc = nh_uow_op_read(q->uow, key, &nh_pgq_optab, op, args, (const struct pg_result **)res);
  return rc == 1;
}

/* ---------------------------------------------------------------- subscriptions (blocking) */

static int sync_run(pgq_t *q, nh_pgqop_t op, nh_pg_args_t *args, PGresult **res, nh_error_t *err)
{
  return nh_pgq_run(q->sync, op, args, res, err);
}

static int sub_conflict(pgq_t *q, const char *endpoint, const char *type, int cmd, const char *const *skip, int nskip,
                        nh_error_t *err)
{
  nh_pg_args_t a;
  PGresult *r = NULL;
  if (sync_run(q, nh_pgqargs_sub_conflict(&a, type, endpoint, cmd), &a, &r, err)) return err->code;
  const char *other = NULL;
  for (int i = 0; !other && i < PQntuples(r); i++) {
    const char *o = PQgetvalue(r, i, 0);
    int skipped = 0;
    for (int k = 0; k < nskip; k++) skipped |= strcmp(o, skip[k]) == 0;
    if (!skipped) other = o;
  }
  if (other) nh_embedded_conflict(err, type, other);
  PQclear(r);
  return other ? NH_EUSAGE : NH_OK;
}

static int pgq_subscribe_check(nh_transport_t *t, const char *endpoint, const char *const *types, const int *commands,
                               int n, const char *const *replacing, int nreplacing, nh_error_t *err)
{
  pgq_t *q = (pgq_t *)t;
  for (int i = 0; i < n; i++) {
    int rc = sub_conflict(q, endpoint, types[i], commands && commands[i], replacing, nreplacing, err);
    if (rc) return rc;
  }
  return NH_OK;
}

/* One transaction: another host reading subscriptions sees the old set or the new one. */
static int pgq_subscribe(nh_transport_t *t, const char *endpoint, const char *const *types, const int *commands, int n,
                         nh_error_t *err)
{
  pgq_t *q = (pgq_t *)t;
  int rc = pgq_subscribe_check(t, endpoint, types, commands, n, NULL, 0, err);
  if (rc) return rc;
  nh_pg_args_t a;
  if (nh_pg_batch_begin(q->sync, err)) return err->code;
  nh_pgqop_t op = nh_pgqargs_sub_del(&a, endpoint);
  if (nh_pgq_batch_add(q->sync, op, &a, NULL, NULL, err)) goto fail;
  for (int i = 0; i < n; i++) {
    op = nh_pgqargs_sub_add(&a, types[i], endpoint, commands && commands[i]);
    if (nh_pgq_batch_add(q->sync, op, &a, NULL, NULL, err)) goto fail;
  }
  if (nh_pg_batch_commit(q->sync, err)) return err->code ? err->code : NH_EFAIL;
  return NH_OK;
fail:
  nh_pg_batch_abandon(q->sync);
  return err->code ? err->code : NH_EFAIL;
}

/* ---------------------------------------------------------------- the pass's reads */

static int pgq_receive(nh_transport_t *t, const char *endpoint, int max, int64_t now)
{
  pgq_t *q = (pgq_t *)t;
  if (max <= 0) return 0;
  nh_pg_args_t a;
  const PGresult *r;
  /* One key per endpoint and pump: the heads leased by the fill are the pump's, whatever
   * pass reads them (a pass run again sees the same heads). */
  nh_pgqop_t op = nh_pgqargs_heads_and_lock(&a, endpoint, now, max, q->owner, now + t->lock_ms);
  const char *key = key_of(q, "heads", endpoint, NULL, 0);
  if (q->uow && nh_uow_open(q->uow)) leasing_note(q, key, endpoint, 1);
  if (!read_op(q, key, op, &a, &r)) return 0;
  int n = PQntuples(r), delivered = 0;
  /* Beyond max (a pass with fewer free slots than the one that asked): given back at the
   * pass's end, as every lease of the pump it does not hand over. */
  for (int i = 0; i < n && delivered < max; i++) {
    nh_msg_t *m = nh_xcalloc(1, sizeof *m);
    nh_pgq_row(r, i, endpoint, m);
    lost_take(q, endpoint, m->session_id);   /* a new lease: an older one's loss is old news */
    used_note(q, endpoint, m->session_id);
    t->on_message(t->cb_data, m);
    delivered++;
  }
  return delivered;
}

static int pgq_lock_session(nh_transport_t *t, const char *endpoint, const char *session, int64_t now)
{
  pgq_t *q = (pgq_t *)t;
  /* The read's answer is the pump's, whoever asks: a session this pass has handed over
   * already (a queued message's, a retry's, a broker delivery's) is not free to take again */
  if (q->uow && nh_uow_open(q->uow) && used_has(q, endpoint, session)) return 0;
  nh_pg_args_t a;
  const PGresult *r;
  nh_pgqop_t op = nh_pgqargs_lock(&a, endpoint, session, q->owner, now + t->lock_ms, now);
  const char *key = key_of(q, "lock", endpoint, session, 0);
  if (q->uow && nh_uow_open(q->uow)) leasing_note(q, key, endpoint, 0);
  if (!read_op(q, key, op, &a, &r)) return 0;
  if (PQntuples(r) == 0) return 0;
  lost_take(q, endpoint, session);
  used_note(q, endpoint, session);
  return 1;
}

static int pgq_session_next(nh_transport_t *t, const char *endpoint, const char *session, int64_t after_seq, int max,
                            nh_msg_t *out, int64_t now)
{
  pgq_t *q = (pgq_t *)t;
  nh_pg_args_t a;
  const PGresult *r;
  nh_pgqop_t op = nh_pgqargs_session_next(&a, endpoint, session, after_seq, max);
  if (!read_op(q, key_of(q, "next", endpoint, session, after_seq), op, &a, &r)) return 0;
  int n = 0;
  for (int i = 0; i < PQntuples(r) && n < max; i++) {
    if (!nh_pgq_visible(r, i, now)) break;   /* it and what follows wait */
    nh_pgq_row(r, i, endpoint, &out[n++]);   /* counted as sqlite's session_next counts it: parking keeps no count */
  }
  return n;
}

/* ---------------------------------------------------------------- the pass's writes */

/* In a pass: 1 if this host still holds the lease (the outcome may be recorded; the
 * commit ends the lease, and fails if it went meanwhile), 0 if another host has it. A
 * pass that has not read it yet says 1: the pass is void and runs again. Outside a pass
 * (a message given back): the lease ends in a batch of its own. */
static int pgq_unlock_session(nh_transport_t *t, const char *endpoint, const char *session)
{
  pgq_t *q = (pgq_t *)t;
  nh_pg_args_t a;
  if (!q->uow || !nh_uow_open(q->uow)) {
    nh_pgqop_t op = nh_pgqargs_unlock(&a, endpoint, session, q->owner);
    side_add(q, op, &a, NULL);
    return 1;
  }
  const PGresult *r;
  nh_pgqop_t op = nh_pgqargs_held(&a, endpoint, session, q->owner);
  if (!read_op(q, key_of(q, "held", endpoint, session, 0), op, &a, &r)) return 1;
  if (nh_pg_col_i64(r, 0, 0) == 0) return 0;
  op = nh_pgqargs_unlock_owned(&a, endpoint, session, q->owner);
  return write_op(q, op, &a) ? NH_EFAIL : 1;
}

/* Renewals go out in a batch of their own; what this returns is what the last one found
 * (0: the lease was gone, another host may hold the session). A loss is so noticed one
 * renewal late, well within the lease (renewals come at a fraction of it). */
static int pgq_renew(nh_transport_t *t, const char *endpoint, const char *session, int64_t now)
{
  pgq_t *q = (pgq_t *)t;
  if (lost_take(q, endpoint, session)) return 0;
  char *k = session_key(endpoint, session);
  nh_pg_args_t a;
  nh_pgqop_t op = nh_pgqargs_renew(&a, endpoint, session, q->owner, now + t->lock_ms);
  side_add(q, op, &a, k);
  free(k);
  return 1;
}

static int pgq_settle(nh_transport_t *t, const nh_msg_t *m, nh_settle_t how, int64_t delay_ms, const char *reason)
{
  pgq_t *q = (pgq_t *)t;
  nh_pg_args_t a;
  if (m->seq <= 0 && how != NH_SETTLE_RELEASE) return NH_OK;   /* retries and replays are no queue rows */
  switch (how) {
  case NH_SETTLE_COMPLETE:
    return write_op(q, nh_pgqargs_delete(&a, m->seq), &a);
  case NH_SETTLE_DEAD_LETTER:
    if (write_op(q, nh_pgqargs_dead(&a, m->seq, reason, nh_time_now_ms()), &a)) return NH_EFAIL;
    return write_op(q, nh_pgqargs_delete(&a, m->seq), &a);
  case NH_SETTLE_RELEASE:
    if (delay_ms <= 0) return write_op(q, nh_pgqargs_unlock(&a, m->endpoint, m->session_id, q->owner), &a);
    if (m->seq > 0 && write_op(q, nh_pgqargs_released(&a, m->seq), &a)) return NH_EFAIL;
    return write_op(q, nh_pgqargs_release_lock(&a, m->endpoint, m->session_id, nh_time_now_ms() + delay_ms, q->owner),
                    &a);
  }
  return NH_EFAIL;
}

static int insert_copy(pgq_t *q, const nh_msg_t *m, const char *endpoint, const char *event_id)
{
  nh_pg_args_t a;
  if (write_op(q, nh_pgqargs_insert(&a, m, endpoint, event_id), &a)) return NH_EFAIL;
  woken_note(q, endpoint);
  return NH_OK;
}

/* Only inside a pass (a handler's publishes, sent with its outcome): a send outside one
 * (a checker's or an HTTP handler's nimbus.publish, a request) is not built on PostgreSQL
 * yet, and says so. A fan-out reads the subscribers through the pass: not read yet, the
 * pass is void and nothing is counted. */
static int pgq_send(nh_transport_t *t, const nh_msg_t *m, const char *to_endpoint, int *copies, nh_error_t *err)
{
  pgq_t *q = (pgq_t *)t;
  *copies = 0;
  if (!q->uow || !nh_uow_open(q->uow))
    return nh_error_set(err, NH_ESTATE, "publishing outside a handler is not built on a PostgreSQL store yet "
                        "(docs/store-backends.md); publish from a handler");
  if (to_endpoint) {
    char fresh[37];
    const char *eid = m->event_id;
    if (!eid) {
      nh_uuid_v7(fresh);
      eid = fresh;
    }
    if (insert_copy(q, m, to_endpoint, eid)) return nh_error_set(err, NH_EFAIL, "enqueue to %s failed", to_endpoint);
    *copies = 1;
    return NH_OK;
  }
  nh_pg_args_t a;
  const PGresult *r;
  nh_pgqop_t op = nh_pgqargs_subscribers(&a, m->event_type);
  if (!read_op(q, key_of(q, "subs", m->event_type, NULL, 0), op, &a, &r)) return NH_OK;
  for (int i = 0; i < PQntuples(r); i++) {
    char eid[37];
    nh_uuid_v7(eid);   /* each consuming endpoint's copy is its own audit event */
    const char *ep = PQgetvalue(r, i, 0);
    if (insert_copy(q, m, ep, eid)) return nh_error_set(err, NH_EFAIL, "enqueue to %s failed", ep);
    (*copies)++;
  }
  return NH_OK;
}

static void pgq_stats(nh_transport_t *t, nh_transport_stats_t *out)
{
  pgq_t *q = (pgq_t *)t;
  memset(out, 0, sizeof *out);
  out->connected = nh_pg_link_state(q->link) == NH_PG_LINK_READY;
  if (!out->connected) {
    const nh_error_t *e = nh_pg_link_error(q->link);
    out->why = e && e->msg[0] ? e->msg : "connecting to PostgreSQL";
  }
}

/* ---------------------------------------------------------------- lifecycle */

static void pgq_free(pgq_t *q)
{
  side_list_free(&q->waiting);
  side_list_free(&q->out);
  free(q->waiting.items);
  free(q->out.items);
  for (int i = 0; i < q->nlost; i++) free(q->lost[i]);
  free(q->lost);
  leasings_clear(q);
  free(q->leasings);
  nh_strset_free(&q->used);
  woken_clear(q);
  free(q->woken);
  nh_pg_db_free(q->sync);
  free(q->key);
  free(q->owner);
  free(q);
}

static void pgq_close(nh_transport_t *t)
{
  pgq_t *q = (pgq_t *)t;
  if (q->waiting.n)
    nh_log_warn("embedded", "closing with %d queue write(s) outside a pump not sent: their leases expire",
                q->waiting.n);
  if (q->sending) {
    q->closing = 1;   /* freed when the link says the batch is over */
    return;
  }
  pgq_free(q);
}

static void pgq_attach(nh_transport_t *t, struct nh_uow *uow)
{
  pgq_t *q = (pgq_t *)t;
  q->uow = uow;
  nh_uow_set_hooks(uow, &(nh_uow_hooks_t){ on_pass_begin, on_pass_end, on_pump_end, q });
}

static const nh_transport_vtbl_t pgq_vtbl = {
  .name = "embedded",
  .subscribe = pgq_subscribe,
  .subscribe_check = pgq_subscribe_check,
  .receive = pgq_receive,
  .lock_session = pgq_lock_session,
  .session_next = pgq_session_next,
  .unlock_session = pgq_unlock_session,
  .renew = pgq_renew,
  .settle = pgq_settle,
  .send = pgq_send,
  .close = pgq_close,
  .stats = pgq_stats,
  .attach = pgq_attach,
};

/* Leases of owners on this machine whose process is gone are dropped at once (their
 * sessions would wait for the leases to expire); other machines' expire. */
static void reap_dead_owners(pgq_t *q)
{
  nh_pg_args_t a;
  PGresult *r = NULL;
  nh_error_t err = {0};
  if (nh_pgq_run(q->sync, nh_pgqargs_owners(&a), &a, &r, &err)) return;
  for (int i = 0; i < PQntuples(r); i++) {
    const char *o = PQgetvalue(r, i, 0);
    if (!nh_owner_dead(o)) continue;
    PGresult *d = NULL;
    if (nh_pgq_run(q->sync, nh_pgqargs_drop_owner(&a, o), &a, &d, &err) == NH_OK && nh_pg_affected(d) > 0)
      nh_log_info("embedded", "released session locks of %s (process no longer running)", o);
    if (d) PQclear(d);
  }
  PQclear(r);
}

/* Another host (or `publish`) queued something: pump now rather than at the next poll. */
static void on_notify(void *data, const char *channel, const char *payload)
{
  (void)channel;
  (void)payload;
  pgq_t *q = data;
  if (q->base.on_wake) q->base.on_wake(q->base.cb_data);
}

nh_transport_t *nh_embedded_pg_init(nh_pg_link_t *link, PGconn *conn, const char *owner, nh_error_t *err)
{
  if (nh_pg_queue_migrate(conn, err)) {
    PQfinish(conn);
    return NULL;
  }
  pgq_t *q = nh_xcalloc(1, sizeof *q);
  q->base.vt = &pgq_vtbl;
  q->base.caps = NH_CAP_LOCK_EXPIRES | NH_CAP_BROKER_SESSIONS | NH_CAP_SCHEDULED_SEND | NH_CAP_DEAD_LETTER |
                 NH_CAP_ATOMIC_SETTLE;
  q->base.lock_ms = 30000;
  q->link = link;
  q->sync = nh_pg_db_new(conn);
  q->owner = nh_xstrdup(owner);
  nh_strset_init(&q->used, 64);
  reap_dead_owners(q);
  if (nh_pg_link_listen(link, NH_PGQ_CHANNEL, on_notify, q, err)) {
    pgq_free(q);
    return NULL;
  }
  return &q->base;
}
