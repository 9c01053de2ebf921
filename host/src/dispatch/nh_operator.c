/* Operator requests (nh_operator.h): checks the event's state and coordinates, refuses a
 * second request while one waits, then sends the control message to the event's
 * endpoint and session and records it (pending request, operator log, "Requested"
 * history row), all in one store transaction (the caller's, for nh_operator_queue). */
#include "nh_operator.h"
#include "core/nh_util.h"
#include "store/nh_pg_link.h"
#include "store/nh_pg_ops.h"
#include "store/nh_pg_queue.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const op_names[] = { "resubmit", "skip", "handoff complete", "handoff fail" };
static const nh_msg_type_t op_types[] = { NH_MT_RESUBMIT, NH_MT_SKIP, NH_MT_HANDOFF_COMPLETE, NH_MT_HANDOFF_FAIL };

const char *nh_operator_name(nh_op_kind_t kind) { return op_names[kind]; }

static int is_status(const nh_audit_t *a, const char *status) { return a->status && strcmp(a->status, status) == 0; }

/* The event's session state (for a parked event's blocker), from either store. */
typedef int (*session_get_fn)(void *store, const char *endpoint, const char *session, nh_session_state_t *st);

static int sqlite_session_get(void *s, const char *ep, const char *session, nh_session_state_t *st)
{
  return nh_store_session_get(s, ep, session, st);
}

static int pg_session_get(void *db, const char *ep, const char *session, nh_session_state_t *st)
{
  return nh_pgs_session_get(db, ep, session, st);
}

static int check_state(session_get_fn session_get, void *s, const nh_op_req_t *r, const nh_audit_t *ev,
                       nh_error_t *err)
{
  switch (r->kind) {
  case NH_OP_RESUBMIT:
    if (is_status(ev, NH_ST_DEFERRED)) {
      nh_session_state_t st;
      memset(&st, 0, sizeof st);
      session_get(s, ev->endpoint, ev->session_id, &st);
      nh_error_set(err, NH_ESTATE,
                   "event %s is parked (Deferred) behind %s in session %s and will replay in order; resubmit or "
                   "skip the blocking event instead",
                   ev->event_id, st.blocked_by ? st.blocked_by : "earlier work", ev->session_id);
      nh_session_state_clear(&st);
      return NH_ESTATE;
    }
    if (!r->force && (is_status(ev, NH_ST_COMPLETED) || is_status(ev, NH_ST_SKIPPED)))
      return nh_error_set(err, NH_ESTATE,
                          "event %s is %s: resubmitting runs its handler again and repeats its side effects; add "
                          "--force if that is what you want", ev->event_id, ev->status);
    if (!r->body && !ev->payload)
      return nh_error_set(err, NH_ESTATE, "event %s has no stored payload; pass a new body", ev->event_id);
    return NH_OK;
  case NH_OP_SKIP:
    if (is_status(ev, NH_ST_COMPLETED) || is_status(ev, NH_ST_SKIPPED))
      return nh_error_set(err, NH_ESTATE, "event %s is already %s; there is nothing to skip", ev->event_id, ev->status);
    return NH_OK;
  case NH_OP_HANDOFF_COMPLETE:
  case NH_OP_HANDOFF_FAIL:
    if (!is_status(ev, NH_ST_PENDING) || !ev->sub_status || strcmp(ev->sub_status, "Handoff") != 0)
      return nh_error_set(err, NH_ESTATE, "event %s is %s%s%s, not Pending+Handoff; nothing changed", ev->event_id,
                          ev->status, ev->sub_status ? "+" : "", ev->sub_status ? ev->sub_status : "");
    if (r->kind == NH_OP_HANDOFF_FAIL && (!r->error_text || !*r->error_text))
      return nh_error_set(err, NH_EUSAGE, "a failed hand-off needs an error text");
    return NH_OK;
  }
  return NH_OK;
}

static int coords_match(const nh_op_req_t *r, const nh_audit_t *ev, nh_error_t *err)
{
  if (r->endpoint && strcmp(r->endpoint, ev->endpoint) != 0)
    return nh_error_set(err, NH_EUSAGE, "event %s belongs to endpoint %s, not %s", ev->event_id, ev->endpoint,
                        r->endpoint);
  if (r->session_id && strcmp(r->session_id, ev->session_id) != 0)
    return nh_error_set(err, NH_EUSAGE, "event %s is in session %s, not %s", ev->event_id, ev->session_id,
                        r->session_id);
  if (r->message_id && ev->message_id && strcmp(r->message_id, ev->message_id) != 0)
    return nh_error_set(err, NH_ESTATE, "event %s's latest message is %s, not %s (it moved on since)", ev->event_id,
                        ev->message_id, r->message_id);
  return NH_OK;
}

static int already_pending(const nh_audit_t *ev, nh_error_t *err)
{
  return nh_error_set(err, NH_ESTATE,
                      "a request for event %s is already queued and not yet applied by the host; wait for it "
                      "(nimbus-host show %s)",
                      ev->event_id, ev->event_id);
}

/* The control message for the event's endpoint and session (borrowing r's and ev's
 * strings), and the history and log detail. */
static void request_msg(const nh_op_req_t *r, const nh_audit_t *ev, const char *mid, nh_msg_t *out, char *detail,
                        size_t dlen)
{
  nh_msg_t m;
  memset(&m, 0, sizeof m);
  m.session_id = ev->session_id;
  m.message_id = (char *)mid;
  m.event_id = ev->event_id;
  m.event_type = ev->event_type;
  m.type = op_types[r->kind];
  m.correlation_id = ev->correlation_id;
  m.originating_message_id = ev->originating_message_id ? ev->originating_message_id : ev->message_id;
  m.parent_message_id = ev->message_id;
  m.from = "Manager";
  m.traceparent = ev->traceparent;   /* a resubmitted run shows in the event's own trace */
  const char *body = r->kind == NH_OP_RESUBMIT ? (r->body ? r->body : ev->payload) : r->body;
  m.body = (char *)body;
  m.body_len = body == ev->payload ? nh_audit_payload_len(ev) : body ? strlen(body) : 0;
  m.error_text = (char *)r->error_text;
  m.error_type = (char *)r->error_type;
  m.enqueued_at = nh_time_now_ms();
  *out = m;
  snprintf(detail, dlen, "%s%s by %s%s%.400s", op_names[r->kind],
           r->kind == NH_OP_RESUBMIT && r->body ? " with a new body" : "", r->actor ? r->actor : "operator",
           r->reason && *r->reason ? ": " : "", r->reason ? r->reason : "");
}

int nh_operator_queue(nh_store_t *s, nh_transport_t *t, const nh_op_req_t *r, const nh_audit_t *ev, nh_error_t *err)
{
  int rc = check_state(sqlite_session_get, s, r, ev, err);
  if (rc) return rc;
  if (nh_store_oppending_has(s, ev->endpoint, ev->event_id)) return already_pending(ev, err);
  char mid[37], detail[640];
  nh_uuid_v7(mid);
  nh_msg_t m;
  request_msg(r, ev, mid, &m, detail, sizeof detail);
  int copies = 0;
  if (t->vt->send(t, &m, ev->endpoint, &copies, err) ||
      nh_store_oppending_add(s, mid, ev->endpoint, ev->event_id, op_names[r->kind], ev->status) ||
      (!r->no_oplog && nh_store_oplog_add(s, r->who, op_names[r->kind], ev->endpoint, ev->event_id, ev->session_id, detail)) ||
      nh_store_history_add(s, ev->endpoint, ev->event_id, mid, nh_msg_type_name(m.type), "Requested", detail)) {
    if (!err->msg[0]) nh_error_set(err, NH_EFAIL, "store: cannot queue the request");
    return NH_EFAIL;
  }
  return NH_OK;
}

int nh_operator_submit(nh_store_t *s, nh_transport_t *t, const nh_op_req_t *r, nh_audit_t *out, nh_error_t *err)
{
  nh_audit_t ev;
  memset(&ev, 0, sizeof ev);
  if (!r->event_id || !*r->event_id) return nh_error_set(err, NH_EUSAGE, "no event id given");
  /* Check and queue in one write transaction: no host can change the event between. */
  if (nh_store_begin(s)) return nh_error_set(err, NH_EFAIL, "store busy: %s", nh_store_errmsg(s));
  int rc = nh_store_audit_find(s, r->event_id, &ev, err);
  if (rc) {
    nh_store_rollback(s);
    return rc;
  }
  if ((rc = coords_match(r, &ev, err)) || (rc = nh_operator_queue(s, t, r, &ev, err))) goto fail;
  if (nh_store_commit(s)) {
    rc = nh_error_set(err, NH_EFAIL, "store: cannot queue the request: %s", nh_store_errmsg(s));
    goto fail;
  }
  if (out) *out = ev;
  else nh_audit_clear(&ev);
  return NH_OK;
fail:
  nh_store_rollback(s);
  nh_audit_clear(&ev);
  return rc;
}

/* The write of a request on PostgreSQL, in the caller's batch: the message (and the NOTIFY
 * that wakes the hosts), the pending request, the operator log and the history row. */
static int pg_add_writes(nh_pg_db_t *db, const nh_op_req_t *r, const nh_audit_t *ev, nh_error_t *err)
{
  char mid[37], detail[640];
  nh_uuid_v7(mid);
  nh_msg_t m;
  request_msg(r, ev, mid, &m, detail, sizeof detail);
  nh_pg_args_t a;
  int rc;
  if ((rc = nh_pgq_batch_add_copy(db, &m, ev->endpoint, ev->event_id, err)) ||
      (rc = nh_pg_batch_add(db, nh_pgargs_oppending_add(&a, mid, ev->endpoint, ev->event_id, op_names[r->kind],
                                                        ev->status),
                            &a, NULL, NULL, err)) ||
      (!r->no_oplog && (rc = nh_pg_batch_add(db, nh_pgargs_oplog_add(&a, r->who, op_names[r->kind], ev->endpoint,
                                                                      ev->event_id, ev->session_id, detail),
                                             &a, NULL, NULL, err))))
    return rc;
  return nh_pg_batch_add(db, nh_pgargs_history_add(&a, ev->endpoint, ev->event_id, mid, nh_msg_type_name(m.type),
                                                   "Requested", detail, NULL),
                         &a, NULL, NULL, err);
}

/* On PostgreSQL (a command, blocking): the checks read first, then the message, the pending
 * request, the operator log and the history row as one transaction. A host changing the
 * event in between is caught where the request is applied: the pending row names the
 * status it was made for. */
int nh_operator_queue_pg(nh_pg_db_t *db, const nh_op_req_t *r, const nh_audit_t *ev, nh_error_t *err)
{
  int rc = check_state(pg_session_get, db, r, ev, err);
  if (rc) return rc;
  int pending = nh_pgs_oppending_has(db, ev->endpoint, ev->event_id);
  if (pending < 0) return nh_error_set(err, NH_EFAIL, "store: cannot read the pending requests");
  if (pending) return already_pending(ev, err);
  if ((rc = nh_pg_batch_begin(db, err)) || (rc = pg_add_writes(db, r, ev, err))) {
    nh_pg_batch_abandon(db);
    return rc;
  }
  return nh_pg_batch_commit(db, err);
}

int nh_operator_submit_pg(nh_pg_db_t *db, const nh_op_req_t *r, nh_audit_t *out, nh_error_t *err)
{
  nh_audit_t ev;
  memset(&ev, 0, sizeof ev);
  if (!r->event_id || !*r->event_id) return nh_error_set(err, NH_EUSAGE, "no event id given");
  int rc = nh_pgs_audit_find(db, r->event_id, &ev, err);
  if (rc) return rc;
  if ((rc = coords_match(r, &ev, err)) || (rc = nh_operator_queue_pg(db, r, &ev, err))) {
    nh_audit_clear(&ev);
    return rc;
  }
  if (out) *out = ev;
  else nh_audit_clear(&ev);
  return NH_OK;
}

/* ---------------------------------------------------------------- on a host's link */

/* The request's journey on the link: FIND reads the event, CHECK its session and whether
 * a request already waits, WRITE queues it. Each is a batch; the checks run between. */
enum { SUB_FIND, SUB_CHECK, SUB_WRITE };

typedef struct submit {
  nh_pg_link_t *link;
  nh_op_req_t r;
  char *own[10];               /* r's strings, copied: the caller's go when it returns */
  int phase, found, pending;
  nh_audit_t ev;
  nh_session_state_t st;       /* CHECK's read, for check_state's message */
  nh_operator_done_cb done;
  void *data;
} submit_t;

static const char *keep(submit_t *s, int i, const char *v) { return s->own[i] = v ? nh_xstrdup(v) : NULL; }

static void submit_free(submit_t *s)
{
  for (size_t i = 0; i < sizeof s->own / sizeof s->own[0]; i++) free(s->own[i]);
  nh_audit_clear(&s->ev);
  nh_session_state_clear(&s->st);
  free(s);
}

static void submit_end(submit_t *s, const nh_error_t *err)
{
  s->done(s->data, err ? NULL : &s->ev, err);
  submit_free(s);
}

/* check_state's session reader, answered from CHECK's read */
static int read_session(void *data, const char *ep, const char *session, nh_session_state_t *st)
{
  (void)ep, (void)session;
  const nh_session_state_t *have = data;
  if (have->blocked_by) st->blocked_by = nh_xstrdup(have->blocked_by);
  return NH_OK;
}

static void on_row(void *data, const nh_pg_optab_t *tab, int op, const PGresult *res)
{
  submit_t *s = data;
  (void)tab;
  if (PQntuples(res) == 0) return;
  if (op == NH_PGOP_AUDIT_FIND) {
    nh_pgrow_audit(res, 0, &s->ev);
    s->found = 1;
  } else if (op == NH_PGOP_SESSION_GET) {
    nh_pgrow_session(res, 0, 0, &s->st);
  } else if (op == NH_PGOP_OPPENDING_HAS) {
    s->pending = 1;
  }
}

static int submit_build(void *data, nh_pg_db_t *db, nh_error_t *err)
{
  submit_t *s = data;
  nh_pg_args_t a;
  switch (s->phase) {
  case SUB_FIND:
    return nh_pg_batch_add(db, nh_pgargs_audit_find(&a, s->r.event_id), &a, on_row, s, err);
  case SUB_CHECK:
    if (nh_pg_batch_add(db, nh_pgargs_session_get(&a, s->ev.endpoint, s->ev.session_id), &a, on_row, s, err))
      return err->code;
    return nh_pg_batch_add(db, nh_pgargs_oppending_has(&a, s->ev.endpoint, s->ev.event_id), &a, on_row, s, err);
  default:
    return pg_add_writes(db, &s->r, &s->ev, err);
  }
}

static void submit_next(submit_t *s);

static void submit_done(void *data, nh_pg_batch_outcome_t outcome, const nh_error_t *err)
{
  submit_t *s = data;
  nh_error_t e = {0};
  if (outcome == NH_PG_UNKNOWN && s->phase == SUB_WRITE) {
    nh_error_set(&e, NH_EFAIL, "store: the connection went while the request for event %s was committing: it may "
                 "or may not be queued (nimbus-host show %s says)", s->r.event_id, s->r.event_id);
    return submit_end(s, &e);
  }
  if (outcome != NH_PG_COMMITTED) {
    nh_error_set(&e, NH_EFAIL, "store: %s", err && err->msg[0] ? err->msg : "the request was not queued");
    return submit_end(s, &e);
  }
  switch (s->phase) {
  case SUB_FIND:
    if (!s->found) {
      nh_error_set(&e, NH_ENOTFOUND, "no event with id %s in this store (see `nimbus-host events`)", s->r.event_id);
      return submit_end(s, &e);
    }
    if (coords_match(&s->r, &s->ev, &e)) return submit_end(s, &e);
    break;
  case SUB_CHECK:
    if (check_state(read_session, &s->st, &s->r, &s->ev, &e)) return submit_end(s, &e);
    if (s->pending) {
      already_pending(&s->ev, &e);
      return submit_end(s, &e);
    }
    break;
  default:
    return submit_end(s, NULL);
  }
  s->phase++;
  submit_next(s);
}

static void submit_next(submit_t *s)
{
  nh_error_t e = {0};
  if (nh_pg_link_submit(s->link, submit_build, submit_done, s, &e)) submit_end(s, &e);
}

int nh_operator_submit_link(nh_pg_link_t *link, const nh_op_req_t *r, nh_operator_done_cb done, void *data,
                            nh_error_t *err)
{
  if (!r->event_id || !*r->event_id) return nh_error_set(err, NH_EUSAGE, "no event id given");
  submit_t *s = nh_xcalloc(1, sizeof *s);
  s->link = link;
  s->r = *r;
  s->r.event_id = keep(s, 0, r->event_id);
  s->r.endpoint = keep(s, 1, r->endpoint);
  s->r.session_id = keep(s, 2, r->session_id);
  s->r.message_id = keep(s, 3, r->message_id);
  s->r.body = keep(s, 4, r->body);
  s->r.error_text = keep(s, 5, r->error_text);
  s->r.error_type = keep(s, 6, r->error_type);
  s->r.actor = keep(s, 7, r->actor);
  s->r.who = keep(s, 8, r->who);
  s->r.reason = keep(s, 9, r->reason);
  s->done = done;
  s->data = data;
  if (nh_pg_link_submit(link, submit_build, submit_done, s, err)) {
    submit_free(s);
    return err->code;
  }
  return NH_OK;
}
