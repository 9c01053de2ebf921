/* Lua's store calls on a PostgreSQL store: a status checker's list of pending hand-offs,
 * settling a hand-off, a publish outside a handler (and a request's, nh_request.c), and
 * the read that tells a handler whether its own MessageId was published (nh_vmhost.c)
 * (docs/store-backends.md). On sqlite they are answered at once; here each becomes
 * batches on the host's link and the calling task waits for the answer (nh_later_t), so
 * the loop never waits for a round trip.
 *
 * Nothing here touches the dispatcher once the call returned: the answers may come while
 * the host stops (the link's close answers every batch), when only the link and the
 * handle are sure to be there. The hosts that serve the endpoints, this one among them,
 * learn of what was queued from its NOTIFY. */
#include "nh_bridge.h"
#include "nh_dispatch_int.h"
#include "nh_operator.h"
#include "nh_pgcalls.h"
#include "core/nh_log.h"
#include "core/nh_util.h"
#include "store/nh_pg_link.h"
#include "store/nh_pg_queue.h"

#include <stdlib.h>
#include <string.h>

static void say(nh_error_t *e, nh_pg_batch_outcome_t outcome, const nh_error_t *err, const char *what)
{
  nh_error_set(e, NH_EFAIL, "store: %s%s: %s", what,
               outcome == NH_PG_UNKNOWN ? " may or may not have happened (the connection went at its commit)"
                                              : " did not happen",
               err && err->msg[0] ? err->msg : "no answer");
}

/* ---------------------------------------------------------------- pending hand-offs */

typedef struct pending {
  nh_later_t *later;
  nh_audit_t *rows;
  int n;
  char *endpoint;
} pending_t;

static void pending_free(pending_t *p)
{
  for (int i = 0; i < p->n; i++) nh_audit_clear(&p->rows[i]);
  free(p->rows);
  free(p->endpoint);
  free(p);
}

static void on_pending_rows(void *data, const nh_pg_optab_t *tab, int op, const PGresult *res)
{
  pending_t *p = data;
  (void)tab, (void)op;
  int n = PQntuples(res);
  p->rows = nh_xcalloc((size_t)n + 1, sizeof *p->rows);
  for (p->n = 0; p->n < n; p->n++) nh_pgrow_audit(res, p->n, &p->rows[p->n]);
}

static int pending_build(void *data, nh_pg_db_t *db, nh_error_t *err)
{
  pending_t *p = data;
  nh_pg_args_t a;
  return nh_pg_batch_add(db, nh_pgargs_handoffs_pending(&a, p->endpoint), &a, on_pending_rows, p, err);
}

static void pending_done(void *data, nh_pg_batch_outcome_t outcome, const nh_error_t *err)
{
  pending_t *p = data;
  if (outcome != NH_PG_COMMITTED) {
    nh_error_t e = {0};
    nh_error_set(&e, NH_EFAIL, "store: cannot list the pending hand-offs of %s: %s", p->endpoint,
                 err && err->msg[0] ? err->msg : "no answer");
    nh_later_fail(p->later, &e);
  } else {
    lua_State *co = nh_later_thread(p->later);
    if (co) {
      lua_createtable(co, p->n, 0);
      for (int i = 0; i < p->n; i++) nh_bridge_push_handoff(co, &p->rows[i], i + 1);
    }
    nh_later_done(p->later, co ? 1 : 0);
  }
  pending_free(p);
}

int nh_pgcall_pending_handoffs(nh_pg_link_t *link, const char *endpoint, nh_later_t *later, nh_error_t *err)
{
  if (!later)
    return nh_error_set(err, NH_EUSAGE, "on a PostgreSQL store, pending hand-offs are listed from a task (a status "
                        "checker, a handler, nimbus.spawn), where the answer can be waited for");
  pending_t *p = nh_xcalloc(1, sizeof *p);
  p->later = later;
  p->endpoint = nh_xstrdup(endpoint);
  if (nh_pg_link_submit(link, pending_build, pending_done, p, err)) {
    pending_free(p);
    return err->code;
  }
  return NH_LATER;
}

/* ---------------------------------------------------------------- settling a hand-off */

static void handoff_done(void *data, const nh_audit_t *ev, const nh_error_t *err)
{
  nh_later_t *later = data;
  (void)ev;
  if (err) return nh_later_fail(later, err);
  lua_State *co = nh_later_thread(later);
  if (co) lua_pushboolean(co, 1);
  nh_later_done(later, co ? 1 : 0);
}

int nh_pgcall_handoff(nh_pg_link_t *link, const nh_handoff_req_t *h, nh_later_t *later, nh_error_t *err)
{
  if (!later)
    return nh_error_set(err, NH_ESTATE, "on a PostgreSQL store, a hand-off is settled from a task (a status checker, "
                        "a handler, nimbus.spawn), where the answer can be waited for");
  nh_op_req_t req;
  nh_bridge_handoff_req(h, &req);
  int rc = nh_operator_submit_link(link, &req, handoff_done, later, err);
  return rc ? rc : NH_LATER;
}

/* ---------------------------------------------------------------- publishing outside a handler */

/* READ: the subscribers when the message fans out, the MessageId's last publish when the
 * caller chose it. WRITE: the claim of that MessageId and a copy for each endpoint, in one
 * transaction (a subscription changing between is the publish CLI's race too: the message
 * goes where the subscriptions said at the read). RECHECK: a WRITE that failed while the
 * MessageId was claimed meanwhile (the claim fails its transaction) was a duplicate. */
enum { PUB_READ, PUB_WRITE, PUB_RECHECK };

typedef struct pub {
  nh_pg_link_t *link;
  nh_pgcall_sent_cb done;
  void *data;
  nh_msg_t m;
  char *to, *given;
  char **eps;                  /* where the copies go: `to`, or the subscribers read */
  int neps, phase;
  int64_t now, seen_at;        /* seen_at: the MessageId's last publish, 0: none */
  nh_error_t failed;           /* WRITE's error, said when RECHECK finds no claim */
} pub_t;

static void pub_free(pub_t *p)
{
  nh_msg_clear(&p->m);
  free(p->to);
  free(p->given);
  for (int i = 0; i < p->neps; i++) free(p->eps[i]);
  free(p->eps);
  free(p);
}

static void on_pub_read(void *data, const nh_pg_optab_t *tab, int op, const PGresult *res)
{
  pub_t *p = data;
  int n = PQntuples(res);
  if (tab == &nh_pg_store_optab && op == NH_PGOP_PUBLISHED_SEEN) {
    p->seen_at = n > 0 ? nh_pg_col_i64(res, 0, 0) : 0;
    return;
  }
  p->eps = nh_xcalloc((size_t)n + 1, sizeof *p->eps);
  for (p->neps = 0; p->neps < n; p->neps++) p->eps[p->neps] = nh_xstrdup(PQgetvalue(res, p->neps, 0));
}

static int pub_build(void *data, nh_pg_db_t *db, nh_error_t *err)
{
  pub_t *p = data;
  nh_pg_args_t a;
  int rc = NH_OK;
  if (p->phase != PUB_WRITE) {
    if (p->phase == PUB_READ && !p->to &&
        (rc = nh_pgq_batch_add(db, nh_pgqargs_subscribers(&a, p->m.event_type), &a, on_pub_read, p, err)))
      return rc;
    return p->given ? nh_pg_batch_add(db, nh_pgargs_published_seen(&a, p->given), &a, on_pub_read, p, err) : NH_OK;
  }
  if (p->given &&
      (rc = nh_pg_batch_add(db, nh_pgargs_published_claim_or_fail(&a, p->given, p->now, p->now - NH_DEDUP_WINDOW_MS),
                            &a, NULL, NULL, err)))
    return rc;
  for (int i = 0; i < p->neps; i++) {
    char eid[37];
    if (p->to && p->m.event_id) snprintf(eid, sizeof eid, "%s", p->m.event_id);
    else nh_uuid_v7(eid);   /* each consuming endpoint's copy is its own audit event */
    if ((rc = nh_pgq_batch_add_copy(db, &p->m, p->eps[i], eid, err))) return rc;
  }
  return NH_OK;
}

static void pub_answer(pub_t *p, int duplicate)
{
  if (duplicate) nh_dispatch_log_duplicate("publish", p->given, p->seen_at);
  p->done(p->data, &p->m, duplicate ? 0 : p->neps, duplicate, NULL);
  pub_free(p);
}

static int pub_seen(const pub_t *p) { return p->given && nh_published_recently(p->seen_at, p->now); }

static void pub_done(void *data, nh_pg_batch_outcome_t outcome, const nh_error_t *err)
{
  pub_t *p = data;
  nh_error_t e = {0};
  switch (p->phase) {
  case PUB_READ:
    if (outcome != NH_PG_COMMITTED) {
      say(&e, NH_PG_NOT_COMMITTED, err, "the publish");   /* only read so far */
      break;
    }
    if (pub_seen(p)) return pub_answer(p, 1);
    if (p->neps == 0) return pub_answer(p, 0);
    p->phase = PUB_WRITE;
    if (nh_pg_link_submit(p->link, pub_build, pub_done, p, &e) == NH_OK) return;
    break;
  case PUB_WRITE:
    if (outcome == NH_PG_COMMITTED) return pub_answer(p, 0);
    say(&e, outcome, err, "the publish");
    if (!p->given || outcome != NH_PG_NOT_COMMITTED) break;
    p->failed = e;
    p->phase = PUB_RECHECK;
    if (nh_pg_link_submit(p->link, pub_build, pub_done, p, &e) == NH_OK) return;
    break;
  default:
    if (outcome == NH_PG_COMMITTED && pub_seen(p)) return pub_answer(p, 1);
    e = p->failed;
    break;
  }
  p->done(p->data, &p->m, 0, 0, &e);
  pub_free(p);
}

int nh_pgcall_send(nh_pg_link_t *link, const nh_msg_t *m, const char *to, const char *given_id,
                   nh_pgcall_sent_cb done, void *data, nh_error_t *err)
{
  pub_t *p = nh_xcalloc(1, sizeof *p);
  p->link = link;
  p->done = done;
  p->data = data;
  nh_msg_copy(&p->m, m);
  p->given = given_id ? nh_xstrdup(given_id) : NULL;
  p->now = nh_time_now_ms();
  if (to) {
    p->to = nh_xstrdup(to);
    p->eps = nh_xcalloc(1, sizeof *p->eps);
    p->eps[p->neps++] = nh_xstrdup(to);
  }
  p->phase = to && !given_id ? PUB_WRITE : PUB_READ;
  if (nh_pg_link_submit(link, pub_build, pub_done, p, err)) {
    pub_free(p);
    return err->code;
  }
  return NH_OK;
}

/* nimbus.publish's answer: (MessageId, duplicate) or (nil, why, code) */
static void published(void *data, const nh_msg_t *m, int copies, int duplicate, const nh_error_t *err)
{
  nh_later_t *later = data;
  if (err) return nh_later_fail(later, err);
  if (copies == 0 && !duplicate) nh_log_warn("dispatch", "published %s but no endpoint subscribes to it", m->event_type);
  lua_State *co = nh_later_thread(later);
  if (co) {
    lua_pushstring(co, m->message_id);
    lua_pushboolean(co, duplicate);
  }
  nh_later_done(later, co ? 2 : 0);
}

int nh_pgcall_publish(nh_pg_link_t *link, const nh_msg_t *m, const char *to, const char *given_id,
                      nh_later_t *later, nh_error_t *err)
{
  if (!later)
    return nh_error_set(err, NH_ESTATE, "on a PostgreSQL store, publishing outside a handler is done from a task "
                        "(a status checker, nimbus.every, nimbus.spawn, an HTTP route), where the answer can be "
                        "waited for; not inside db:tx, a metamethod or a coroutine of the task's own");
  int rc = nh_pgcall_send(link, m, to, given_id, published, later, err);
  return rc ? rc : NH_LATER;
}

/* ---------------------------------------------------------------- a MessageId's last publish */

typedef struct seen {
  char *message_id;
  int64_t at;
  nh_pgcall_seen_cb done;
  void *data;
} seen_t;

static void on_seen(void *data, const nh_pg_optab_t *tab, int op, const PGresult *res)
{
  seen_t *s = data;
  (void)tab, (void)op;
  if (PQntuples(res) > 0) s->at = nh_pg_col_i64(res, 0, 0);
}

static int seen_build(void *data, nh_pg_db_t *db, nh_error_t *err)
{
  seen_t *s = data;
  nh_pg_args_t a;
  return nh_pg_batch_add(db, nh_pgargs_published_seen(&a, s->message_id), &a, on_seen, s, err);
}

static void seen_done(void *data, nh_pg_batch_outcome_t outcome, const nh_error_t *err)
{
  seen_t *s = data;
  nh_error_t e = {0};
  if (outcome != NH_PG_COMMITTED)
    nh_error_set(&e, NH_EFAIL, "store: cannot read whether MessageId %s was published: %s", s->message_id,
                 err && err->msg[0] ? err->msg : "no answer");
  s->done(s->data, s->at, outcome == NH_PG_COMMITTED ? NULL : &e);
  free(s->message_id);
  free(s);
}

int nh_pgcall_published_at(nh_pg_link_t *link, const char *message_id, nh_pgcall_seen_cb done, void *data,
                           nh_error_t *err)
{
  seen_t *s = nh_xcalloc(1, sizeof *s);
  s->message_id = nh_xstrdup(message_id);
  s->done = done;
  s->data = data;
  if (nh_pg_link_submit(link, seen_build, seen_done, s, err)) {
    free(s->message_id);
    free(s);
    return err->code;
  }
  return NH_OK;
}
