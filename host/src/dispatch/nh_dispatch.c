/* Dispatcher loop: one pump per loop iteration while there is work, an adaptive poll
 * timer (2 ms doubling to 50 ms) when idle so another process's messages are seen
 * quickly without a busy loop. Each pump is one store transaction: it commits the
 * effects of every finished task, then fetches new work, then starts handlers. The
 * callbacks Lua calls the host through are in nh_vmhost.c, lock renewal in nh_renew.c. */
#include "nh_dispatch_int.h"
#include "nh_checkpointer.h"
#include "core/nh_log.h"
#include "core/nh_util.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NH_POLL_MIN_MS 1
#define NH_POLL_MAX_MS 50
#define NH_POLL_MAX_PG_MS 200
/* Idle about 30 ms (the polls after 2, 4, 8 and 16 ms found nothing): the WAL is copied
 * back now, not at the next 16 MB. A shorter pause is a gap between a producer's batches, and copying in
 * each one was 15% of a busy embedded host's CPU (many small checkpoints, each with an
 * fsync of the database file). */
#define NH_POLL_IDLE_CKPT_MS 16

static void pump(nh_dispatch_t *d);
static void maybe_stopped(nh_dispatch_t *d);

static void idle_cb(uv_idle_t *h)
{
  nh_dispatch_t *d = h->data;
  uv_idle_stop(h);
  pump(d);
}

void nh_dispatch_kick(nh_dispatch_t *d)
{
  if (uv_is_closing((uv_handle_t *)&d->idle)) return;
  if (!uv_is_active((uv_handle_t *)&d->idle)) uv_idle_start(&d->idle, idle_cb);
}

static void timer_cb(uv_timer_t *h) { pump(h->data); }

/* A push transport (AMQP) has messages buffered: pump soon rather than at the next poll. */
static void wake(void *data)
{
  nh_dispatch_t *d = data;
  if (d->started && !d->closing) nh_dispatch_kick(d);
}

/* The endpoint being registered (pending) wins over a live one of the same name. */
nh_endpoint_t *nh_dispatch_find_endpoint(nh_dispatch_t *d, const char *name)
{
  for (nh_endpoint_t *ep = d->pending_eps; ep; ep = ep->next)
    if (strcmp(ep->name, name) == 0) return ep;
  for (nh_endpoint_t *ep = d->endpoints; ep; ep = ep->next)
    if (strcmp(ep->name, name) == 0) return ep;
  return NULL;
}

/* ---------------------------------------------------------------- jobs */

void nh_dispatch_job_finished(nh_dispatch_t *d, nh_job_t *job)
{
  nh_queue_remove(&job->run_node);
  job->finished_ns = uv_hrtime();
  nh_dispatch_span_end(d, job);
  d->running--;
  nh_queue_insert_tail(&d->done, &job->done_node);
  nh_dispatch_kick(d);
}

static nh_job_t *job_new(nh_dispatch_t *d, nh_endpoint_t *ep, nh_job_src_t src)
{
  nh_job_t *job = nh_xcalloc(1, sizeof *job);
  job->d = d;
  job->ep = ep;
  job->src = src;
  job->retry_in_ms = -1;
  nh_queue_init(&job->pubs);
  nh_outcome_init(&job->out);
  nh_queue_init(&job->run_node);
  nh_queue_init(&job->fresh_node);
  nh_queue_init(&job->done_node);
  return job;
}

/* Routes a fetched job inside the open transaction, in its own savepoint: settled here,
 * or queued to run. A job whose routing fails is undone alone and its session released,
 * so one bad message cannot hold back the batch; it is delivered again later. */
static void accept_job(nh_dispatch_t *d, nh_job_t *job)
{
  size_t mark = nh_story_mark(&d->story);
  int r = nh_uow_savepoint(d->uow) ? NH_EFAIL : nh_dispatch_route(d, job);
  if (r >= 0 && nh_uow_savepoint_end(d->uow)) r = NH_EFAIL;
  else if (r < 0) nh_uow_savepoint_rollback(d->uow);
  if (r < 0) nh_story_rollback(&d->story, mark);
  if (r < 0) {
    if (r != NH_ESTATE) {
      nh_log_error("dispatch", "%s: could not route message %s (session %s); it stays queued", job->ep->name,
                   job->msg.message_id, job->msg.session_id);
      d->tr->vt->unlock_session(d->tr, job->ep->name, job->msg.session_id);
    }
    nh_job_free(job);
    return;
  }
  if (r == 0) {
    nh_job_free(job);
    return;
  }
  job->ep->in_flight++;
  nh_queue_insert_tail(&d->fresh, &job->fresh_node);
}

static void on_message(void *data, nh_msg_t *msg)
{
  nh_dispatch_t *d = data;
  if (strcmp(msg->endpoint, d->reply_ep) == 0) {
    nh_dispatch_take_reply(d, msg);
    nh_msg_clear(msg);
    free(msg);
    return;
  }
  nh_endpoint_t *ep = d->receiving_ep;
  if (!ep || strcmp(ep->name, msg->endpoint) != 0) ep = nh_dispatch_find_endpoint(d, msg->endpoint);
  if (!ep) {   /* not one of ours (cannot happen with the embedded transport) */
    assert(strcmp(d->tr->vt->name, "embedded") != 0);
    nh_msg_clear(msg);
    free(msg);
    return;
  }
  nh_job_t *job = job_new(d, ep, NH_JOB_QUEUE);
  job->msg = *msg;
  free(msg);
  job->kind = job->msg.type == NH_MT_RESUBMIT ? NH_RUN_RESUBMIT : NH_RUN_EVENT;
  accept_job(d, job);
}

struct due_ctx {
  nh_dispatch_t *d;
  nh_endpoint_t *ep;
  int64_t now;
  int taken;
  int failed;
};

/* The due session's job (its lock taken), from its state. */
static int due_job(struct due_ctx *c, const char *session, const nh_session_state_t *st)
{
  nh_dispatch_t *d = c->d;
  nh_job_t *job;
  if (st->blocked_by) {
    nh_audit_t a;
    int got = nh_uow_audit_get(d->uow, c->ep->name, st->blocked_by, &a);
    if (got != 1 && nh_uow_missed(d->uow)) {   /* not read yet: this pass is void anyway */
      d->tr->vt->unlock_session(d->tr, c->ep->name, session);
      return 0;
    }
    if (got != 1) {
      nh_log_error("dispatch", "%s: session %s is blocked by %s, which has no audit row; unblocking the session",
                   c->ep->name, session, st->blocked_by);
      nh_session_state_t copy = *st;
      copy.retry_due = 0;
      copy.blocked_by = NULL;
      copy.draining = nh_uow_parked_any(d->uow, c->ep->name, session) > 0;
      if (nh_uow_session_put(d->uow, c->ep->name, session, &copy)) c->failed = 1;
      d->tr->vt->unlock_session(d->tr, c->ep->name, session);
      return 0;
    }
    job = job_new(d, c->ep, NH_JOB_RETRY);
    job->kind = NH_RUN_RETRY;
    nh_msg_t *m = &job->msg;
    m->endpoint = nh_xstrdup(c->ep->name);
    m->session_id = nh_xstrdup(session);
    m->event_id = a.event_id, a.event_id = NULL;
    m->event_type = a.event_type, a.event_type = NULL;
    m->message_id = a.message_id, a.message_id = NULL;
    m->correlation_id = a.correlation_id, a.correlation_id = NULL;
    m->originating_message_id = a.originating_message_id, a.originating_message_id = NULL;
    m->traceparent = a.traceparent, a.traceparent = NULL;
    m->body_len = nh_audit_payload_len(&a);
    m->body = a.payload, a.payload = NULL;
    m->type = NH_MT_EVENT;
    m->retry_count = a.retry_count + (nh_audit_retrying(&a) ? 0 : 1);   /* a transient attempt is not a retry */
    m->enqueued_at = a.created_at;
    nh_audit_clear(&a);
  } else {
    job = job_new(d, c->ep, NH_JOB_PARKED);
    job->kind = NH_RUN_REPLAY;
    int head = nh_uow_parked_head(d->uow, c->ep->name, session, &job->msg, &job->park_seq);
    if (head < 0 || (d->store && nh_store_failed(d->store))) {
      c->failed = 1;
      nh_job_free(job);
      d->tr->vt->unlock_session(d->tr, c->ep->name, session);
      return 0;
    }
    if (head != 1 && nh_uow_missed(d->uow)) {   /* not read yet: this pass is void anyway */
      nh_job_free(job);
      d->tr->vt->unlock_session(d->tr, c->ep->name, session);
      return 0;
    }
    if (head != 1) {
      /* Drained: the session is free again. */
      nh_session_state_t copy = *st;
      copy.draining = 0;
      if (nh_uow_session_put(d->uow, c->ep->name, session, &copy)) c->failed = 1;
      d->tr->vt->unlock_session(d->tr, c->ep->name, session);
      nh_job_free(job);
      return 0;
    }
  }
  c->taken++;
  accept_job(d, job);
  return 0;
}

/* A session with a due retry or parked messages to replay. */
static int on_due_session(void *data, const char *endpoint, const char *session, const nh_session_state_t *scanned)
{
  struct due_ctx *c = data;
  nh_dispatch_t *d = c->d;
  (void)endpoint;   /* always c->ep->name: the query is per endpoint */
  assert(strcmp(endpoint, c->ep->name) == 0);
  if (c->failed || d->tr->vt->lock_session(d->tr, c->ep->name, session, c->now) != 1) return 0;
  /* The scan's row may predate this pass: its jobs applied before the scan, and a unit of
   * work that keeps its writes until the commit (store/nh_uow.h) or a scan read before the
   * pass (PostgreSQL) shows the row as it was. The session's state now is the unit's. */
  nh_session_state_t now_st;
  const nh_session_state_t *st = scanned;
  if (nh_uow_can_miss(d->uow)) {
    /* a state not read yet comes back free, so not due: this pass is void anyway, and
     * the sessions after it are still looked at, so their reads are made in this pass */
    if (nh_uow_session_get(d->uow, c->ep->name, session, &now_st)) c->failed = 1;
    int due = !c->failed && (now_st.blocked_by ? now_st.retry_due && now_st.retry_due <= c->now : now_st.draining);
    if (!due) {
      nh_session_state_clear(&now_st);
      d->tr->vt->unlock_session(d->tr, c->ep->name, session);
      return 0;
    }
    st = &now_st;
  }
  int rc = due_job(c, session, st);
  if (st == &now_st) nh_session_state_clear(&now_st);
  return rc;
}

/* Due retries and parked replays (work the store holds for blocked and draining sessions). */
static int fetch_due(nh_dispatch_t *d, nh_endpoint_t *ep, int64_t now, int *fetched)
{
  int cap = ep->concurrency - ep->in_flight;
  if (cap <= 0) return NH_OK;
  struct due_ctx c = { d, ep, now, 0, 0 };
  /* in-flight sessions may still look due; ask for enough rows to see past them */
  if (nh_uow_sessions_due(d->uow, ep->name, now, cap + ep->in_flight, &ep->due_cursor, on_due_session, &c) < 0 ||
      c.failed)
    return NH_EFAIL;
  *fetched += c.taken;
  return NH_OK;
}

/* Session heads from the transport (new arrivals, operator requests). */
static int fetch_queue(nh_dispatch_t *d, nh_endpoint_t *ep, int64_t now, int *fetched)
{
  int cap = ep->concurrency - ep->in_flight;
  if (cap <= 0) return NH_OK;
  d->receiving_ep = ep;
  int n = d->tr->vt->receive(d->tr, ep->name, cap, now);
  d->receiving_ep = NULL;
  if (n < 0) return NH_EFAIL;
  *fetched += n;
  return NH_OK;
}

static int fetch(nh_dispatch_t *d, int64_t now, int *fetched)
{
  *fetched = 0;
  for (nh_endpoint_t *ep = d->endpoints; ep; ep = ep->next) {
    if (ep->concurrency - ep->in_flight <= 0 || ep->retired) continue;
    /* Replays come first (they were waiting longest), but when they took every free slot
     * the queue goes first in the next pump: during the recovery of a large outage, new
     * arrivals and operator requests still move instead of waiting for the whole drain. */
    if (ep->queue_starved) {
      ep->queue_starved = 0;
      if (fetch_queue(d, ep, now, fetched) || fetch_due(d, ep, now, fetched)) return NH_EFAIL;
      continue;
    }
    if (fetch_due(d, ep, now, fetched)) return NH_EFAIL;
    if (ep->concurrency - ep->in_flight <= 0) ep->queue_starved = 1;
    else if (fetch_queue(d, ep, now, fetched)) return NH_EFAIL;
  }
  if (!nh_queue_empty(&d->requests)) {   /* replies for this process's waiting requests */
    int n = d->tr->vt->receive(d->tr, d->reply_ep, 256, now);
    if (n < 0) return NH_EFAIL;
    *fetched += n;
  }
  return NH_OK;
}

static void start_fresh(nh_dispatch_t *d)
{
  nh_queue_t batch;   /* this pump's jobs: a handler runs inside nh_vm_task_start */
  nh_queue_move(&d->fresh, &batch);
  while (!nh_queue_empty(&batch)) {
    nh_job_t *job = nh_queue_data(nh_queue_head(&batch), nh_job_t, fresh_node);
    nh_queue_remove(&job->fresh_node);
    nh_msg_t *m = &job->msg;
    nh_task_args_t args = {
      .endpoint = job->ep->name, .event_type = m->event_type, .body = m->body, .body_len = m->body_len,
      .event_id = m->event_id, .message_id = m->message_id, .session_id = m->session_id,
      .correlation_id = m->correlation_id, .originating_message_id = m->originating_message_id,
      .kind = job->kind, .retry_count = m->retry_count, .delivery_count = m->delivery_count,
      .enqueued_at = m->enqueued_at, .data = job,
      .deadline_s = job->ep->timeout_s, .cpu_budget_s = job->ep->cpu_budget_s, .trace = &job->span,
    };
    d->running++;
    job->started_ms = nh_time_now_ms();
    job->started_ns = uv_hrtime();
    nh_dispatch_span_begin(d, job);
    job->vm = job->ep->vm;
    nh_queue_insert_head(&d->running_jobs, &job->run_node);
    nh_error_t err = {0};
    if (nh_vm_task_start(job->vm, &args, &job->task, &err)) {
      nh_log_error("dispatch", "%s: cannot start a task: %s", job->ep->name, err.msg);
      job->out.kind = NH_OUT_CANCELLED;
      nh_dispatch_job_finished(d, job);
    }
  }
}

static void discard_fresh(nh_dispatch_t *d)
{
  nh_queue_t *q, *n;
  nh_queue_foreach_safe(q, n, &d->fresh) {
    nh_job_t *job = nh_queue_data(q, nh_job_t, fresh_node);
    nh_queue_remove(q);
    job->ep->in_flight--;
    nh_job_free(job);
  }
}

static void maybe_stopped(nh_dispatch_t *d);

/* A job's message handed back unsettled: a broker transport keeps the delivery, the
 * embedded one just frees the session; a retry or a replay frees its session (unlock: 0
 * when the session's lock was lost, so not ours to free). */
static void give_back(nh_dispatch_t *d, nh_job_t *job, int unlock)
{
  if (job->src == NH_JOB_QUEUE) d->tr->vt->settle(d->tr, &job->msg, NH_SETTLE_RELEASE, 0, NULL);
  else if (unlock) d->tr->vt->unlock_session(d->tr, job->ep->name, job->msg.session_id);
}

/* After a commit in doubt (store/nh_uow.h, UNKNOWN): the jobs it recorded, or did not, are
 * given back unsettled, and the sessions of the jobs it fetched are freed. Applying them
 * again could record an outcome twice; the store decides instead: a message whose outcome
 * was recorded is recognised when it comes again (its history row), one whose was not
 * runs again, a parked replay or a retry is due again or done. */
static void give_back_in_doubt(nh_dispatch_t *d)
{
  nh_queue_t *lists[2] = { &d->pump_applied, &d->pump_retry };
  for (int i = 0; i < 2; i++)
    while (!nh_queue_empty(lists[i])) {
      nh_job_t *job = nh_queue_data(nh_queue_head(lists[i]), nh_job_t, done_node);
      nh_queue_remove(&job->done_node);
      give_back(d, job, 1);
      job->ep->in_flight--;
      nh_job_free(job);
    }
  nh_queue_t *q;
  nh_queue_foreach(q, &d->fresh) {
    nh_job_t *job = nh_queue_data(q, nh_job_t, fresh_node);
    d->tr->vt->unlock_session(d->tr, job->ep->name, job->msg.session_id);
  }
  discard_fresh(d);
}

#define NH_APPLY_ATTEMPTS 3

/* Writes each finished job's effects in its own savepoint. Returns the jobs to keep
 * for another attempt (their writes failed); drops jobs whose lock was lost or that
 * failed too often (their messages are delivered again: nothing was recorded). */
static void apply_done(nh_dispatch_t *d, nh_queue_t *applied, nh_queue_t *retry)
{
  while (!nh_queue_empty(&d->done)) {
    nh_job_t *job = nh_queue_data(nh_queue_head(&d->done), nh_job_t, done_node);
    nh_queue_remove(&job->done_node);
    size_t mark = nh_story_mark(&d->story);
    int rc = nh_uow_savepoint(d->uow) ? NH_EFAIL : nh_dispatch_apply(d, job);
    if (rc == NH_OK && nh_uow_savepoint_end(d->uow)) rc = NH_EFAIL;
    else if (rc != NH_OK) nh_uow_savepoint_rollback(d->uow);
    if (rc != NH_OK) nh_story_rollback(&d->story, mark);
    if (rc == NH_OK || rc == NH_ESTATE || ++job->apply_failures >= NH_APPLY_ATTEMPTS || d->force_stop) {
      if (rc != NH_OK && rc != NH_ESTATE)
        nh_log_error("dispatch", "%s: giving up recording the outcome of %s (session %s) after %d attempts; the "
                     "message will be delivered again", job->ep->name, job->msg.event_id, job->msg.session_id,
                     job->apply_failures);
      /* Nothing of it was recorded: hand the message back unsettled (a lost lock is not ours
       * to free) */
      if (rc != NH_OK) give_back(d, job, rc != NH_ESTATE);
      nh_queue_insert_tail(applied, &job->done_node);
    } else {
      nh_queue_insert_tail(retry, &job->done_node);
    }
  }
}

/* The happy path: every finished job applied with no savepoint of its own. Inside a
 * savepoint sqlite copies each page a job touches into the statement journal (a tenth of
 * the host's instructions at 256 jobs a batch, docs/architecture.md "Where an event's CPU
 * goes"); without them the transaction is the only undo. Stops at the first job that
 * fails: the caller then rolls the transaction back and applies the batch again job by
 * job (apply_done). Every job taken is in `applied`, in order. */
static int apply_fast(nh_dispatch_t *d, nh_queue_t *applied)
{
  while (!nh_queue_empty(&d->done)) {
    nh_job_t *job = nh_queue_data(nh_queue_head(&d->done), nh_job_t, done_node);
    nh_queue_remove(&job->done_node);
    nh_queue_insert_tail(applied, &job->done_node);
    if (nh_dispatch_apply(d, job) != NH_OK || (d->store && nh_store_failed(d->store))) return NH_EFAIL;
  }
  return NH_OK;
}

/* jobs, in their order, back at the head of the done queue */
static void requeue_front(nh_dispatch_t *d, nh_queue_t *jobs)
{
  nh_queue_t rest;
  nh_queue_move(&d->done, &rest);
  nh_queue_move(jobs, &d->done);
  while (!nh_queue_empty(&rest)) {
    nh_queue_t *q = nh_queue_head(&rest);
    nh_queue_remove(q);
    nh_queue_insert_tail(&d->done, q);
  }
}

/* Opens the pump's transaction and records the finished jobs: all at once, or, when one
 * of them fails (a lost lock, a write error), again from the start with a savepoint per
 * job so the others still commit. Nothing of the first attempt stays: its writes, its
 * story and the transport's settlements go with the rollback. */
static int begin_and_apply(nh_dispatch_t *d, nh_queue_t *applied, nh_queue_t *retry)
{
  nh_dispatch_pub_claims_clear(d);
  if (nh_uow_begin(d->uow)) return NH_EFAIL;
  if (apply_fast(d, applied) == NH_OK) return NH_OK;
  nh_uow_rollback(d->uow);
  nh_story_rollback(&d->story, 0);
  requeue_front(d, applied);
  nh_dispatch_pub_claims_clear(d);
  if (nh_uow_begin(d->uow)) return NH_EFAIL;
  apply_done(d, applied, retry);
  return NH_OK;
}

static void free_jobs(nh_queue_t *jobs)
{
  while (!nh_queue_empty(jobs)) {
    nh_job_t *job = nh_queue_data(nh_queue_head(jobs), nh_job_t, done_node);
    nh_queue_remove(&job->done_node);
    job->ep->in_flight--;
    nh_job_free(job);
  }
}

/* Back on the done queue, in their order, for the next pump. */
static void requeue_done(nh_dispatch_t *d, nh_queue_t *jobs)
{
  while (!nh_queue_empty(jobs)) {
    nh_queue_t *q = nh_queue_head(jobs);
    nh_queue_remove(q);
    nh_queue_insert_tail(&d->done, q);
  }
}

/* Where each endpoint's fetch starts, kept when a pass begins so that a void pass (a
 * store read the unit of work did not have, store/nh_uow.h) is run again over the same
 * sessions. Only a unit that can miss needs it. */
static void pass_mark(nh_dispatch_t *d, int restore)
{
  if (!nh_uow_can_miss(d->uow)) return;
  for (nh_endpoint_t *ep = d->endpoints; ep; ep = ep->next) {
    if (restore) {
      free(ep->due_cursor);
      ep->due_cursor = ep->pass_cursor;
      ep->pass_cursor = NULL;
      ep->queue_starved = ep->pass_starved;
    } else {
      free(ep->pass_cursor);
      ep->pass_cursor = ep->due_cursor ? nh_xstrdup(ep->due_cursor) : NULL;
      ep->pass_starved = ep->queue_starved;
    }
  }
}

static void pump_committed(nh_dispatch_t *d, int ok);

/* What a void pass missed has been read (ok), or could not be: the pump runs again, now
 * or after a second. */
static void filled(nh_dispatch_t *d, int ok)
{
  d->filling = 0;
  if (ok) {
    nh_dispatch_kick(d);
    return;
  }
  d->store_failing = 1;
  if (d->stopping) maybe_stopped(d);
  uv_timer_start(&d->timer, timer_cb, 1000, 0);
}

/* NIMBUS_STORE_LATE_COMMIT: the store's result (a commit's or a fill's) arrives on a
 * later loop turn, as it will from a database server (store/nh_uow.h). */
static void late_result_cb(uv_timer_t *h)
{
  nh_dispatch_t *d = h->data;
  if (d->late_fill) {
    d->late_fill = 0;
    filled(d, d->commit_ok);
  } else {
    pump_committed(d, d->commit_ok);
  }
}

/* Tells the result now, or (NIMBUS_STORE_LATE_COMMIT) on a later loop turn. */
static void store_result(nh_dispatch_t *d, int fill, int ok)
{
  if (!(nh_uow_mode(d->uow) & NH_UOW_LATE_COMMIT)) {
    if (fill) filled(d, ok);
    else pump_committed(d, ok);
    return;
  }
  d->late_fill = fill;
  d->commit_ok = ok;
  uv_timer_start(&d->commit_timer, late_result_cb, 0, 0);
}

static void on_uow_filled(void *data, int ok, const nh_error_t *err)
{
  nh_dispatch_t *d = data;
  if (!ok) nh_log_error("dispatch", "store: reading what the pump needs failed: %s; retrying in 1 s",
                        err ? err->msg : "unknown error");
  store_result(d, 1, ok);
}

/* A void pass: nothing of it happened (its transaction is rolled back). Every job goes
 * back where it was, and the pump runs again once the unit of work has what the pass
 * missed: on the next loop turn (NH_UOW_COLD reads it then), or once a fill has read it
 * (a cache: PostgreSQL, NH_UOW_CACHED). */
static void pass_again(nh_dispatch_t *d, nh_queue_t *applied, nh_queue_t *retry)
{
  nh_story_rollback(&d->story, 0);
  if (!nh_queue_empty(&d->requests)) nh_dispatch_deliver_replies(d, 0);
  requeue_front(d, retry);
  requeue_front(d, applied);
  discard_fresh(d);
  pass_mark(d, 1);
  d->pumping = 0;
  if (!nh_uow_batched(d->uow)) {
    nh_dispatch_kick(d);
    return;
  }
  d->filling = 1;
  nh_error_t err = { 0 };
  if (nh_uow_fill(d->uow, on_uow_filled, d, &err)) on_uow_filled(d, 0, &err);
}

/* A unit whose commit is a batch of its own (store/nh_uow.h): its result resumes the pump. */
static void on_uow_committed(void *data, nh_uow_outcome_t outcome, const nh_error_t *err)
{
  nh_dispatch_t *d = data;
  int ok = outcome == NH_UOW_COMMITTED;
  d->commit_in_doubt = outcome == NH_UOW_UNKNOWN;   /* pump_committed gives its jobs back */
  if (!ok)
    nh_log_error("dispatch", "store: the pump's transaction %s: %s",
                 outcome == NH_UOW_UNKNOWN ? "may not have committed" : "did not commit",
                 err ? err->msg : "unknown error");
  nh_uow_end(d->uow);
  store_result(d, 0, ok);
}

/* One pump: a pass that applies the finished jobs and fetches new work in one store
 * transaction, then (pump_committed) what follows its commit. A pump never overlaps
 * another: while its commit is out, `committing` holds the next one back. */
static void pump(nh_dispatch_t *d)
{
  if (d->pumping || d->committing || d->filling) return;
  d->pumping = 1;
  int64_t now = nh_time_now_ms();
  int ok = 0;
  d->pump_fetched = 0;
  d->pump_had_done = !nh_queue_empty(&d->done);
  pass_mark(d, 0);
  nh_uow_pass_begin(d->uow);
  if (begin_and_apply(d, &d->pump_applied, &d->pump_retry) == NH_OK) {
    ok = 1;
    if (!d->stopping && fetch(d, now, &d->pump_fetched)) ok = 0;
    if (ok && nh_uow_missed(d->uow)) {
      nh_uow_rollback(d->uow);
      pass_again(d, &d->pump_applied, &d->pump_retry);
      return;
    }
    if (ok && nh_uow_batched(d->uow)) {
      d->pumping = 0;
      d->committing = 1;
      nh_error_t err = { 0 };
      if (nh_uow_commit(d->uow, on_uow_committed, d, &err)) on_uow_committed(d, NH_UOW_NOT_COMMITTED, &err);
      return;
    }
    if (ok && nh_store_commit(d->store)) ok = 0;
    if (!ok) nh_uow_rollback(d->uow);
  }
  nh_uow_end(d->uow);
  d->pumping = 0;
  d->committing = 1;
  store_result(d, 0, ok);
}

/* The pump's transaction committed (ok) or did not: settle what it recorded (tell, start
 * the handlers it fetched), or put its work back, then decide when to pump next. */
static void pump_committed(nh_dispatch_t *d, int ok)
{
  int fetched = d->pump_fetched;
  int in_doubt = !ok && d->commit_in_doubt;
  d->commit_in_doubt = 0;
  d->store_failing = !ok && !in_doubt;
  if (ok) nh_dispatch_tell(d);   /* what this transaction recorded, now that it is recorded */
  else nh_story_rollback(&d->story, 0);
  /* Replies read in a commit in doubt are delivered: had it not committed, a reply comes
   * again and finds its request over (dropped); had it, it would never come again. */
  if (!nh_queue_empty(&d->requests)) nh_dispatch_deliver_replies(d, ok || in_doubt);
  if (ok && fetched > 0) {
    d->pumps++;
    d->pumped += (uint64_t)fetched;
  }
  if (ok) {
    free_jobs(&d->pump_applied);
    requeue_done(d, &d->pump_retry);
    start_fresh(d);
    if (d->nretiring) nh_dispatch_close_retired(d, 0);
  } else if (in_doubt) {
    give_back_in_doubt(d);
  } else {
    /* Nothing of this batch happened (a full disk, say): every finished job stays queued
     * and is applied again; fetched messages are fetched again later. */
    requeue_done(d, &d->pump_applied);
    requeue_done(d, &d->pump_retry);
    discard_fresh(d);
    nh_log_error("dispatch", "store transaction failed; retrying in 1 s");
    if (d->force_stop) free_jobs(&d->done);
  }
  d->committing = 0;
  if (in_doubt) ok = 1;   /* nothing says the store is failing: pump on as after a commit */

  if (d->stopping) {
    maybe_stopped(d);
    if (!nh_queue_empty(&d->done)) {
      if (ok) nh_dispatch_kick(d);
      else uv_timer_start(&d->timer, timer_cb, 1000, 0);
    }
    return;
  }
  if (!ok) {
    uv_timer_start(&d->timer, timer_cb, 1000, 0);
    return;
  }
  if (fetched > 0 || d->pump_had_done || !nh_queue_empty(&d->done)) {
    d->poll_ms = NH_POLL_MIN_MS;
    nh_dispatch_kick(d);
    uv_timer_stop(&d->timer);
  } else {
    if (d->poll_ms == NH_POLL_IDLE_CKPT_MS) nh_checkpointer_kick(d->ckpt);
    /* On PostgreSQL an idle poll is a round trip, and new work wakes the host (NOTIFY):
     * polling finds only what time makes due (retries, leases ending), and less often */
    int max = d->link ? NH_POLL_MAX_PG_MS : NH_POLL_MAX_MS;
    d->poll_ms = d->poll_ms * 2 > max ? max : d->poll_ms * 2;
    uv_timer_start(&d->timer, timer_cb, (uint64_t)d->poll_ms, 0);
  }
}

/* ---------------------------------------------------------------- lifecycle */

static int env_flag(const char *name)
{
  const char *v = getenv(name);
  return v && *v && strcmp(v, "0") != 0;
}

static nh_dispatch_t *dispatch_new(uv_loop_t *loop, nh_uow_t *uow, nh_transport_t *transport, const char *lua_dir)
{
  nh_dispatch_t *d = nh_xcalloc(1, sizeof *d);
  d->loop = loop;
  d->uow = uow;
  if (transport->vt->attach) transport->vt->attach(transport, uow);
  nh_queue_init(&d->pump_applied);
  nh_queue_init(&d->pump_retry);
  uv_timer_init(loop, &d->commit_timer);
  d->commit_timer.data = d;
  d->tr = transport;
  d->lua_dir = nh_xstrdup(lua_dir);
  nh_queue_init(&d->fresh);
  nh_queue_init(&d->running_jobs);
  nh_queue_init(&d->requests);
  nh_queue_init(&d->done);
  d->poll_ms = NH_POLL_MIN_MS;
  transport->on_message = on_message;
  transport->on_wake = wake;
  transport->cb_data = d;
  uv_idle_init(loop, &d->idle);
  d->idle.data = d;
  uv_timer_init(loop, &d->timer);
  d->timer.data = d;
  uv_timer_init(loop, &d->drain_timer);
  d->drain_timer.data = d;
  uv_timer_init(loop, &d->renew_timer);
  d->renew_timer.data = d;
  uv_timer_init(loop, &d->reload_timer);
  uv_timer_init(loop, &d->retention_timer);
  d->retention_timer.data = d;
  uv_timer_init(loop, &d->overdue_timer);
  d->overdue_timer.data = d;
  uv_timer_init(loop, &d->presence_timer);
  d->presence_timer.data = d;
  d->reload_timer.data = d;
  char id[37];
  nh_uuid_v7(id);
  snprintf(d->reply_ep, sizeof d->reply_ep, "_reply.%s", id);
  return d;
}

nh_dispatch_t *nh_dispatch_init(uv_loop_t *loop, nh_store_t *store, nh_transport_t *transport, const char *lua_dir)
{
  /* debugging switches: every pump runs its restart path, gets its commit's result on a
   * later loop turn, or reads and writes through PostgreSQL's cache (store/nh_uow.h) */
  nh_uow_t *uow = nh_uow_new(store, (env_flag("NIMBUS_STORE_COLD_READS") ? NH_UOW_COLD : 0) |
                                       (env_flag("NIMBUS_STORE_LATE_COMMIT") ? NH_UOW_LATE_COMMIT : 0) |
                                       (env_flag("NIMBUS_STORE_CACHED") ? NH_UOW_CACHED : 0) |
                                       (env_flag("NIMBUS_STORE_IN_DOUBT") ? NH_UOW_IN_DOUBT : 0));
  nh_dispatch_t *d = dispatch_new(loop, uow, transport, lua_dir);
  d->store = store;
  d->ckpt = nh_checkpointer_start(loop, store);
  return d;
}

nh_dispatch_t *nh_dispatch_init_pg(uv_loop_t *loop, struct nh_pg_link *link, nh_transport_t *transport,
                                   const char *lua_dir)
{
  nh_dispatch_t *d = dispatch_new(loop, nh_uow_new_pg(link), transport, lua_dir);
  d->link = link;
  return d;
}

void nh_dispatch_collect_types(void *data, const char *endpoint, const char *const *types, const int *commands,
                               int n)
{
  nh_dispatch_t *d = data;
  nh_endpoint_t *ep = nh_dispatch_find_endpoint(d, endpoint);
  if (!ep) return;
  ep->types = nh_xcalloc((size_t)n + 1, sizeof *ep->types);
  ep->commands = nh_xcalloc((size_t)n + 1, sizeof *ep->commands);
  for (int i = 0; i < n; i++) {
    ep->types[i] = nh_xstrdup(types[i]);
    ep->commands[i] = commands[i];
  }
  ep->ntypes = n;
}

int nh_dispatch_load(nh_dispatch_t *d, const char *adapter_path, nh_error_t *err)
{
  nh_vm_host_t host;
  nh_vm_t *vm = nh_vm_init(d->loop, adapter_path, d->lua_dir, nh_dispatch_vm_host(d, &host), err);
  if (!vm || nh_vm_subscriptions(vm, nh_dispatch_collect_types, d, err)) {
    while (d->pending_eps) {
      nh_endpoint_t *ep = d->pending_eps;
      d->pending_eps = ep->next;
      nh_endpoint_free(ep);
    }
    if (vm) nh_vm_close(vm);
    if (err->code == 0) err->code = NH_EUSAGE;
    return err->code;
  }
  /* an adapter may only serve HTTP or run periodic tasks; one that does nothing is a mistake */
  if (!d->pending_eps && !nh_vm_has_work(vm)) {
    nh_vm_close(vm);
    return nh_error_set(err, NH_EUSAGE,
                        "%s defines no endpoint and starts nothing: call nimbus.endpoint(\"Name\") and register "
                        "handlers with :on, or serve HTTP (nimbus.http.serve) or run a periodic task (nimbus.every)",
                        adapter_path);
  }
  while (d->pending_eps) {
    nh_endpoint_t *ep = d->pending_eps;
    d->pending_eps = ep->next;
    ep->next = d->endpoints;
    d->endpoints = ep;
  }
  d->adapters = nh_xrealloc(d->adapters, sizeof *d->adapters * (size_t)(d->nadapters + 1));
  d->adapters[d->nadapters].path = nh_xstrdup(adapter_path);
  d->adapters[d->nadapters++].vm = vm;
  return NH_OK;
}

int nh_dispatch_start(nh_dispatch_t *d, nh_error_t *err)
{
  if (nh_dispatch_subscribe_all(d, err)) return NH_EFAIL;
  d->started = 1;
  nh_dispatch_metrics_start(d);
  nh_dispatch_renew_start(d);
  nh_dispatch_retention_start(d);
  nh_dispatch_overdue_start(d);
  nh_dispatch_presence_update(d);
  nh_dispatch_kick(d);
  return NH_OK;
}

static void maybe_stopped(nh_dispatch_t *d)
{
  if (!d->stopping || d->running > 0 || d->committing || d->filling || !nh_queue_empty(&d->done) || !d->on_stopped)
    return;
  void (*cb)(void *) = d->on_stopped;
  d->on_stopped = NULL;
  uv_timer_stop(&d->drain_timer);
  uv_timer_stop(&d->timer);
  uv_timer_stop(&d->commit_timer);
  uv_timer_stop(&d->renew_timer);
  uv_timer_stop(&d->reload_timer);
  uv_timer_stop(&d->retention_timer);
  uv_timer_stop(&d->overdue_timer);
  nh_dispatch_presence_end(d);
  uv_idle_stop(&d->idle);
  nh_dispatch_unwatch(d);
  /* Handlers are done; what else the adapters run (status checkers, spawned loops, served
   * requests) would keep the loop alive for ever: stop it too. */
  for (int i = 0; i < d->nadapters; i++) {
    nh_vm_stop_timers(d->adapters[i].vm);
    nh_vm_cancel_all(d->adapters[i].vm);
  }
  for (int i = 0; i < d->nretiring; i++) {
    nh_vm_stop_timers(d->retiring[i]);
    nh_vm_cancel_all(d->retiring[i]);
  }
  nh_log_info("dispatch", "lock renewals: %llu renewed, %llu lost, %llu handlers cancelled (cap, is_alive, lost lock)",
              (unsigned long long)d->renewals, (unsigned long long)d->renew_failures,
              (unsigned long long)d->cancellations);
  nh_log_info("dispatch", "%llu messages fetched in %llu transactions (%.1f per transaction)",
              (unsigned long long)d->pumped, (unsigned long long)d->pumps,
              d->pumps ? (double)d->pumped / (double)d->pumps : 0.0);
  if (nh_uow_can_miss(d->uow)) {
    nh_uow_stats_t us;
    nh_uow_stats(d->uow, &us);
    nh_log_info("dispatch", "unit of work: %llu passes, %llu of them run again after %llu store reads it did not have",
                (unsigned long long)us.passes, (unsigned long long)us.restarts, (unsigned long long)us.misses);
    if (us.commits)
      nh_log_info("dispatch", "unit of work: %llu commits wrote %llu rows in %llu statements",
                  (unsigned long long)us.commits, (unsigned long long)us.writes, (unsigned long long)us.statements);
  }
  cb(d->stopped_data);
}

static void drain_timeout_cb(uv_timer_t *h)
{
  nh_dispatch_t *d = h->data;
  if (d->running > 0) {
    nh_log_warn("dispatch", "drain deadline reached; cancelling %d running task(s) without settling", d->running);
    for (int i = 0; i < d->nadapters; i++) nh_vm_cancel_all(d->adapters[i].vm);
    for (int i = 0; i < d->nretiring; i++) nh_vm_cancel_all(d->retiring[i]);
  }
  d->force_stop = 1;   /* past the deadline: stop even if outcomes cannot be written */
  pump(d);
}

void nh_dispatch_stop(nh_dispatch_t *d, int64_t drain_ms, void (*on_stopped)(void *), void *data)
{
  d->stopping = 1;
  if (d->tr->vt->quiesce) d->tr->vt->quiesce(d->tr);
  d->on_stopped = on_stopped;
  d->stopped_data = data;
  if (d->running > 0) {
    nh_log_info("dispatch", "stopping: waiting up to %lld ms for %d running task(s)", (long long)drain_ms, d->running);
    uv_timer_start(&d->drain_timer, drain_timeout_cb, (uint64_t)drain_ms, 0);
  }
  pump(d);
}

/* The struct embeds its handles, so it is freed by the last close callback: each close
 * counts itself in, each callback out (no count kept by hand beside the list). */
static void on_handle_closed(uv_handle_t *h)
{
  nh_dispatch_t *d = h->data;
  if (--d->closing == 0) free(d);
}

static void close_handle(nh_dispatch_t *d, void *handle)
{
  uv_handle_t *h = handle;
  h->data = d;
  d->closing++;
  uv_close(h, on_handle_closed);
}

void nh_dispatch_close(nh_dispatch_t *d)
{
  if (!d) return;
  d->tr->on_wake = NULL;   /* a transport that outlives this (closed after the loop ran) wakes nobody */
  nh_dispatch_unwatch(d);
  for (int i = 0; i < d->nadapters; i++) {
    nh_vm_close(d->adapters[i].vm);
    free(d->adapters[i].path);
  }
  free(d->adapters);
  nh_dispatch_close_retired(d, 1);
  free(d->retiring);
  nh_dispatch_requests_close(d);   /* after the VMs: their waiting tasks are gone */
  /* Cancelled tasks landed in `done`; they were released in the final pump or, if
   * the store failed, are simply dropped: their session locks expire. */
  while (!nh_queue_empty(&d->done)) {
    nh_job_t *job = nh_queue_data(nh_queue_head(&d->done), nh_job_t, done_node);
    nh_queue_remove(&job->done_node);
    nh_job_free(job);
  }
  /* a commit whose result never came (the loop is closing): its jobs are dropped as the
   * done ones are, their sessions' locks expire */
  free_jobs(&d->pump_applied);
  free_jobs(&d->pump_retry);
  discard_fresh(d);
  while (d->endpoints) {
    nh_endpoint_t *n = d->endpoints->next;
    nh_endpoint_free(d->endpoints);
    d->endpoints = n;
  }
  nh_dispatch_metrics_stop(d);
  free(d->lua_dir);
  d->lua_dir = NULL;
  free(d->owner);
  nh_dispatch_pub_claims_clear(d);
  d->owner = NULL;
  nh_checkpointer_close(d->ckpt);
  d->ckpt = NULL;
  nh_uow_free(d->uow);
  d->uow = NULL;
  close_handle(d, &d->presence_timer);
  close_handle(d, &d->retention_timer);
  close_handle(d, &d->overdue_timer);
  close_handle(d, &d->reload_timer);
  close_handle(d, &d->renew_timer);
  close_handle(d, &d->idle);
  close_handle(d, &d->timer);
  close_handle(d, &d->drain_timer);
  close_handle(d, &d->commit_timer);
}

int nh_dispatch_ready(nh_dispatch_t *d, char *why, size_t len)
{
  if (d->store_failing) {
    snprintf(why, len, "store: transactions are failing (disk full or the store unwritable?); see the log");
    return 0;
  }
  nh_transport_stats_t ts = { .connected = 1 };
  if (d->tr->vt->stats) d->tr->vt->stats(d->tr, &ts);
  if (!ts.connected) {
    snprintf(why, len, "transport %s: %s", d->tr->vt->name, ts.why ? ts.why : "not connected");
    return 0;
  }
  return 1;
}

int nh_dispatch_endpoint_count(nh_dispatch_t *d)
{
  int n = 0;
  for (nh_endpoint_t *ep = d->endpoints; ep; ep = ep->next) n++;
  return n;
}

void nh_dispatch_describe(nh_dispatch_t *d, char *buf, size_t len)
{
  size_t off = 0;
  buf[0] = '\0';
  for (nh_endpoint_t *ep = d->endpoints; ep && off < len; ep = ep->next) {
    off += (size_t)snprintf(buf + off, len - off, "%s%s (", off ? ", " : "", ep->name);
    for (int i = 0; i < ep->ntypes && off < len; i++)
      off += (size_t)snprintf(buf + off, len - off, "%s%s", i ? " " : "", ep->types[i]);
    if (off < len) off += (size_t)snprintf(buf + off, len - off, ")");
  }
}
