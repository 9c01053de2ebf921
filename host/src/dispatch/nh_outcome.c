/* The outcome state machine (docs/design.md section 6). Every function here runs inside
 * the dispatcher's open store transaction while this process holds the session lock,
 * so the session state it reads cannot change underneath it. */
#include "nh_dispatch_int.h"
#include "core/nh_log.h"
#include "core/nh_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void set(char **field, const char *v)
{
  free(*field);
  *field = nh_xstrdup(v);
}

static int is_handoff(const char *status, const char *sub)
{
  return status && sub && strcmp(status, NH_ST_PENDING) == 0 && strcmp(sub, "Handoff") == 0;
}

/* ---------------------------------------------------------------- the story (nh_story.h) */

static const char *operator_action(nh_msg_type_t t)
{
  switch (t) {
  case NH_MT_RESUBMIT: return "resubmit";
  case NH_MT_SKIP: return "skip";
  case NH_MT_HANDOFF_COMPLETE: return "handoff_complete";
  case NH_MT_HANDOFF_FAIL: return "handoff_fail";
  default: return NULL;
  }
}

static nh_note_t *note_job(nh_dispatch_t *d, nh_job_t *job, nh_note_kind_t kind)
{
  const nh_msg_t *m = &job->msg;
  nh_note_t *n = nh_story_add(&d->story, kind);
  nh_note_set(&n->endpoint, job->ep->name);
  nh_note_set(&n->event_id, m->event_id);
  nh_note_set(&n->session, m->session_id);
  nh_note_set(&n->type, m->event_type);
  nh_note_set(&n->message_id, m->message_id);
  nh_note_set(&n->action, operator_action(m->type));
  n->enqueued_at = m->enqueued_at;
  return n;
}

/* The audit row `a` is about to be written: its status change is a note. */
static void note_audit(nh_dispatch_t *d, nh_job_t *job, const nh_audit_t *a, const char *detail)
{
  nh_note_t *n = note_job(d, job, NH_NOTE_AUDIT);
  if (a->event_type) nh_note_set(&n->type, a->event_type);
  nh_note_set(&n->status, a->status);
  nh_note_set(&n->sub_status, a->sub_status);
  nh_note_set(&n->error, a->error_text);
  nh_note_set(&n->error_type, a->error_type);
  nh_note_set(&n->detail, detail);
  n->delta = is_handoff(a->status, a->sub_status) - job->was_handoff;
  n->retry_in_ms = job->retry_in_ms;
  n->attempt = job->attempt;
  n->max_attempts = job->max_attempts;
  if (job->finished_ns > job->started_ns && job->started_ms) {
    n->handler_s = (double)(job->finished_ns - job->started_ns) / 1e9;
    n->started_at = job->started_ms;
  }
}

/* A session's blocker changed from `was` to st->blocked_by. */
static void note_session(nh_dispatch_t *d, nh_job_t *job, const char *was, const nh_session_state_t *st)
{
  if (!was == !st->blocked_by) return;
  nh_note_t *n = note_job(d, job, NH_NOTE_SESSION);
  n->delta = st->blocked_by ? 1 : -1;
  nh_note_set(&n->blocked_by, st->blocked_by ? st->blocked_by : was);
}

/* Parked rows of an endpoint added or removed; runs of parks fold into one note. */
static void note_parked(nh_dispatch_t *d, const char *endpoint, int delta)
{
  nh_story_t *s = &d->story;
  if (s->n && s->notes[s->n - 1].kind == NH_NOTE_PARKED && strcmp(s->notes[s->n - 1].endpoint, endpoint) == 0) {
    s->notes[s->n - 1].delta += delta;
    return;
  }
  nh_note_t *n = nh_story_add(s, NH_NOTE_PARKED);
  nh_note_set(&n->endpoint, endpoint);
  n->delta = delta;
}

/* An operator request rejected (the history says why): told as a warning. */
static void note_rejected(nh_dispatch_t *d, nh_job_t *job, const char *detail)
{
  nh_note_t *n = note_job(d, job, NH_NOTE_REJECTED);
  nh_note_set(&n->detail, detail);
}

/* Loads the event's audit row, or starts one from the message. */
static void audit_load(nh_dispatch_t *d, nh_job_t *job, nh_audit_t *a)
{
  const nh_msg_t *m = &job->msg;
  /* A first delivery from the queue has no row yet (event ids are fresh per copy):
   * skip the read on the hot path; the upsert keeps created_at if one exists. */
  int first = job->src == NH_JOB_QUEUE && m->type == NH_MT_EVENT && m->delivery_count <= 1;
  if (first || nh_uow_audit_get(d->uow, job->ep->name, m->event_id, a) != 1) {
    memset(a, 0, sizeof *a);
    a->endpoint = nh_xstrdup(job->ep->name);
    a->event_id = nh_xstrdup(m->event_id);
    a->created_at = nh_time_now_ms();
    a->queue_time_ms = a->processing_time_ms = -1;
  }
  job->was_handoff = is_handoff(a->status, a->sub_status);
  set(&a->session_id, m->session_id);
  if (m->event_type) set(&a->event_type, m->event_type);
  if (m->type == NH_MT_EVENT || m->type == NH_MT_RESUBMIT || m->type == NH_MT_UNKNOWN) {   /* unknown: malformed */
    set(&a->message_id, m->message_id);
    if (m->correlation_id) set(&a->correlation_id, m->correlation_id);
    if (m->originating_message_id) set(&a->originating_message_id, m->originating_message_id);
    if (m->traceparent) set(&a->traceparent, m->traceparent);   /* a retry runs in this trace */
    if (m->body) {
      /* a resubmit with a new body: the history keeps the one it replaces */
      if (a->payload && (nh_audit_payload_len(a) != m->body_len || memcmp(a->payload, m->body, m->body_len) != 0)) {
        free(a->replaced_payload);
        a->replaced_payload = a->payload;
      } else {
        free(a->payload);
      }
      a->payload = nh_xstrndup(m->body, m->body_len);
      a->payload_len = m->body_len;
    }
  }
  a->updated_at = 0;
}

static void audit_status(nh_audit_t *a, const char *status, const char *text, const char *type, const char *stack)
{
  set(&a->status, status);
  set(&a->sub_status, NULL);
  set(&a->error_text, text);
  set(&a->error_type, type);
  set(&a->error_stack, stack);
}

static int audit_write(nh_dispatch_t *d, nh_job_t *job, nh_audit_t *a, const char *detail)
{
  note_audit(d, job, a, detail);
  int rc = nh_uow_audit_put(d->uow, a);
  /* each attempt keeps its own error (the audit row shows only the latest) */
  int failed = nh_audit_unresolved_failure(a->status) || nh_audit_retrying(a);
  nh_history_extra_t x = { failed ? a->error_text : NULL, failed ? a->error_type : NULL,
                           failed ? a->error_stack : NULL, a->replaced_payload };
  if (!rc)
    rc = nh_uow_history_add(d->uow, job->ep->name, a->event_id, job->msg.message_id,
                            job->src == NH_JOB_RETRY ? "RetryRequest" : nh_msg_type_name(job->msg.type),
                                 a->status, detail, &x);
  nh_audit_clear(a);
  return rc;
}

/* On a broker, whose settlement is not atomic with the store, a redelivery whose outcome
 * was committed is recognised by that outcome's history row (nh_store_processed_has):
 * every path that settles a delivery here writes one first, in this transaction. */
static int settle(nh_dispatch_t *d, nh_job_t *job, nh_settle_t how, int64_t delay, const char *reason)
{
  if (job->src != NH_JOB_QUEUE && how != NH_SETTLE_RELEASE) return NH_OK;
  nh_transport_t *t = d->tr;
  return t->vt->settle(t, &job->msg, how, delay, reason);
}

/* Ends our hold on the session. If the lock is no longer ours (it expired and another
 * process took the session), everything this job wrote must be undone: NH_ESTATE tells
 * the pump to roll the job's savepoint back. The loss is told once per job: the same job
 * is applied again, and finds the same loss, when its batch is applied again job by job
 * (begin_and_apply: twice a pass), in every pass run again after a miss or a failed fill,
 * and after a failed commit (a partitions run on PostgreSQL logged one loss eight times).
 * Another loss of the session is another job's (a new delivery). */
static int unlock(nh_dispatch_t *d, nh_job_t *job)
{
  int held = d->tr->vt->unlock_session(d->tr, job->ep->name, job->msg.session_id);
  if (held < 0) return NH_EFAIL;
  if (held == 0) {
    if (!job->lock_loss_told) {
      job->lock_loss_told = 1;
      nh_dispatch_count_lock_lost(job->ep->name);   /* a fact whether or not this transaction commits */
      nh_log_warn("dispatch", "%s: lost the lock on session %s while handling %s; its outcome is discarded and "
                  "the message will be delivered again", job->ep->name, job->msg.session_id,
                  job->msg.event_id ? job->msg.event_id : job->msg.message_id);
    }
    return NH_ESTATE;
  }
  return NH_OK;
}

/* Clears the block and, if anything is parked, starts draining. */
static void unblock(nh_dispatch_t *d, nh_job_t *job, nh_session_state_t *st)
{
  set(&st->blocked_by, NULL);
  st->retry_due = 0;
  st->draining = nh_uow_parked_any(d->uow, job->ep->name, job->msg.session_id) > 0;
}

/* After the parked row park_seq of a session was replayed: whether any may be left.
 * Replays go in park order and park_seq only grows, so what is left has a higher seq and
 * no query is needed (at 100,000 draining sessions the lookup cost 3 us a replay). A row
 * skipped out of order can leave draining set with nothing parked; the next due scan then
 * finds no head and clears it. */
static int parked_after(const nh_session_state_t *st, int64_t park_seq)
{
  return park_seq + 1 < st->next_park_seq;
}

static int is_blocker(const nh_session_state_t *st, const char *event_id)
{
  return st->blocked_by && event_id && strcmp(st->blocked_by, event_id) == 0;
}

/* ---------------------------------------------------------------- routing */

static int park_one(nh_dispatch_t *d, nh_job_t *job, nh_session_state_t *st)
{
  nh_msg_t *m = &job->msg;
  char text[512];
  if (st->blocked_by) snprintf(text, sizeof text, "Session %s is blocked by %s", m->session_id, st->blocked_by);
  else snprintf(text, sizeof text, "Session %s is replaying parked messages", m->session_id);
  int64_t seq = st->next_park_seq > 0 ? st->next_park_seq : 1;
  st->next_park_seq = seq + 1;
  nh_audit_t a;
  audit_load(d, job, &a);
  audit_status(&a, NH_ST_DEFERRED, text, NULL, NULL);
  note_parked(d, job->ep->name, 1);
  if (nh_uow_park(d->uow, m, seq) || nh_uow_session_put(d->uow, m->endpoint, m->session_id, st) ||
      audit_write(d, job, &a, text))
    return NH_EFAIL;
  return settle(d, job, NH_SETTLE_COMPLETE, 0, NULL);
}

#define NH_PARK_BATCH 255

/* Parks the head and, where the transport can hand them over, the rest of the session's
 * plain events queued behind it (up to a batch), so a blocked session's backlog does not
 * hold up other sessions for one pump per message. A control message, the blocker itself
 * or an inbox duplicate ends the batch: those are routed on their own, in order. */
static int route_park(nh_dispatch_t *d, nh_job_t *job, nh_session_state_t *st)
{
  int rc = park_one(d, job, st);
  if (rc || !d->tr->vt->session_next || job->msg.seq <= 0) return rc;
  nh_msg_t *next = nh_xcalloc(NH_PARK_BATCH, sizeof *next);
  int n = d->tr->vt->session_next(d->tr, job->ep->name, job->msg.session_id, job->msg.seq, NH_PARK_BATCH, next,
                                  nh_time_now_ms());
  int i = 0;
  for (; i < n && rc == NH_OK; i++) {
    nh_msg_t *m = &next[i];
    if (m->type != NH_MT_EVENT || !m->event_id || is_blocker(st, m->event_id) || m->delivery_count > NH_MAX_DELIVERIES ||
        (job->ep->inbox && m->message_id && nh_uow_inbox_has(d->uow, job->ep->name, m->message_id)))
      break;
    nh_job_t tmp;
    memset(&tmp, 0, sizeof tmp);
    tmp.d = d;
    tmp.ep = job->ep;
    tmp.src = NH_JOB_QUEUE;
    tmp.msg = *m;
    tmp.retry_in_ms = -1;
    rc = park_one(d, &tmp, st);
  }
  for (int k = 0; k < n; k++) nh_msg_clear(&next[k]);
  free(next);
  return rc;
}

/* Skip: never runs the handler. */
static int route_skip(nh_dispatch_t *d, nh_job_t *job, nh_session_state_t *st)
{
  nh_msg_t *m = &job->msg;
  nh_audit_t a;
  audit_load(d, job, &a);
  audit_status(&a, NH_ST_SKIPPED, NULL, NULL, NULL);
  int removed = nh_uow_parked_delete_event(d->uow, job->ep->name, m->event_id);
  if (removed > 0) note_parked(d, job->ep->name, -removed);
  char *was = nh_xstrdup(st->blocked_by);
  if (is_blocker(st, m->event_id)) unblock(d, job, st);
  if (removed > 0 && !st->blocked_by)
    st->draining = nh_uow_parked_any(d->uow, job->ep->name, m->session_id) > 0;
  int rc = nh_uow_session_put(d->uow, m->endpoint, m->session_id, st) ||
           audit_write(d, job, &a, removed > 0 ? "skipped by operator (removed from the parked queue)"
                                               : "skipped by operator");
  note_session(d, job, was, st);
  free(was);
  if (rc) return NH_EFAIL;
  return settle(d, job, NH_SETTLE_COMPLETE, 0, NULL);
}

/* Hand-off settlement: never runs the handler; only a Pending+Handoff event is settled. */
static int route_handoff(nh_dispatch_t *d, nh_job_t *job, nh_session_state_t *st)
{
  nh_msg_t *m = &job->msg;
  nh_audit_t a;
  int found = nh_uow_audit_get(d->uow, job->ep->name, m->event_id, &a) == 1;
  int pending = found && a.status && strcmp(a.status, NH_ST_PENDING) == 0 && a.sub_status &&
                strcmp(a.sub_status, "Handoff") == 0;
  if (!pending) {
    char detail[256];
    snprintf(detail, sizeof detail, "%s rejected: the event is %s, not Pending+Handoff", nh_msg_type_name(m->type),
             found && a.status ? a.status : "unknown");
    note_rejected(d, job, detail);
    if (found) nh_audit_clear(&a);
    if (nh_uow_history_add(d->uow, job->ep->name, m->event_id, m->message_id, nh_msg_type_name(m->type),
                           "Rejected", detail, NULL))
      return NH_EFAIL;
    return settle(d, job, NH_SETTLE_COMPLETE, 0, NULL);
  }
  a.updated_at = 0;
  job->was_handoff = 1;
  char *was = nh_xstrdup(st->blocked_by);
  const char *detail;
  if (m->type == NH_MT_HANDOFF_COMPLETE) {
    audit_status(&a, NH_ST_COMPLETED, NULL, NULL, NULL);
    free(a.result);
    a.result = m->body ? nh_xstrndup(m->body, m->body_len) : NULL;
    if (is_blocker(st, m->event_id)) unblock(d, job, st);
    detail = "hand-off completed";
  } else {
    audit_status(&a, NH_ST_FAILED, m->error_text ? m->error_text : "hand-off failed",
                 m->error_type ? m->error_type : "HandoffFailed", NULL);
    detail = "hand-off failed; the session stays blocked until resubmit or skip";
  }
  int rc = nh_uow_session_put(d->uow, m->endpoint, m->session_id, st) || audit_write(d, job, &a, detail);
  note_session(d, job, was, st);
  free(was);
  if (rc) return NH_EFAIL;
  return settle(d, job, NH_SETTLE_COMPLETE, 0, NULL);
}

static int route_dead_letter(nh_dispatch_t *d, nh_job_t *job, const char *reason)
{
  if (!job->msg.event_id) {
    nh_note_t *n = note_job(d, job, NH_NOTE_DEADLETTER);
    nh_note_set(&n->detail, reason);
  } else {
    nh_audit_t a;
    audit_load(d, job, &a);
    audit_status(&a, NH_ST_DEADLETTERED, reason, "DeadLetter", NULL);
    if (audit_write(d, job, &a, reason)) return NH_EFAIL;
  }
  return settle(d, job, NH_SETTLE_DEAD_LETTER, 0, reason);
}

/* An operator request made when the event had `expected` status, arriving after the
 * event moved on (a retry completed it, a hand-off was settled): applying it now would
 * act on a state the operator never saw, so it is rejected and recorded. */
static int stale_request(nh_dispatch_t *d, nh_job_t *job, const char *expected)
{
  nh_audit_t a;
  memset(&a, 0, sizeof a);
  if (nh_uow_audit_get(d->uow, job->ep->name, job->msg.event_id, &a) != 1) return 0;
  int stale = a.status && strcmp(a.status, expected) != 0;
  if (stale) {
    char detail[256];
    snprintf(detail, sizeof detail, "%s rejected: the event changed from %s to %s after the request was made",
             nh_msg_type_name(job->msg.type), expected, a.status);
    note_rejected(d, job, detail);
    nh_uow_history_add(d->uow, job->ep->name, job->msg.event_id, job->msg.message_id,
                       nh_msg_type_name(job->msg.type), "Rejected", detail, NULL);
  }
  nh_audit_clear(&a);
  return stale;
}

/* A parked message settled without its handler: drop it and keep draining. */
static int parked_done(nh_dispatch_t *d, nh_job_t *job, nh_session_state_t *st)
{
  if (nh_uow_parked_delete(d->uow, job->ep->name, job->msg.session_id, job->park_seq)) return NH_EFAIL;
  note_parked(d, job->ep->name, -1);
  if (!st->blocked_by) st->draining = parked_after(st, job->park_seq);
  return nh_uow_session_put(d->uow, job->ep->name, job->msg.session_id, st);
}

int nh_dispatch_route(nh_dispatch_t *d, nh_job_t *job)
{
  nh_msg_t *m = &job->msg;
  nh_endpoint_t *ep = job->ep;
  nh_session_state_t st;
  int rc = NH_OK, run = 0;
  if (nh_uow_session_get(d->uow, ep->name, m->session_id, &st)) return NH_EFAIL;

  /* A first delivery cannot have an outcome yet (as in audit_load): only a redelivery
   * looks for one. */
  if (job->src == NH_JOB_QUEUE && !(d->tr->caps & NH_CAP_ATOMIC_SETTLE) && m->event_id && m->delivery_count > 1 &&
      nh_uow_processed_has(d->uow, ep->name, m->message_id, m->event_id)) {
    /* The outcome was committed but the settlement was lost (crash): settle only. */
    rc = d->tr->vt->settle(d->tr, m, NH_SETTLE_COMPLETE, 0, NULL);
    goto out_unlock;
  }
  if (job->src == NH_JOB_QUEUE && m->delivery_count > NH_MAX_DELIVERIES) {
    char reason[160];
    snprintf(reason, sizeof reason,
             "delivered %d times without an outcome (the host stopped while handling it each time)",
             m->delivery_count - 1);
    rc = route_dead_letter(d, job, reason);
    goto out_unlock;
  }
  if (m->type != NH_MT_EVENT && m->message_id) {
    char *expected = NULL;
    int had = nh_uow_oppending_take(d->uow, m->message_id, &expected);
    int stale = had == 1 && expected && stale_request(d, job, expected);
    free(expected);
    if (had < 0) {
      nh_session_state_clear(&st);
      return NH_EFAIL;
    }
    if (stale) {
      rc = settle(d, job, NH_SETTLE_COMPLETE, 0, NULL);
      goto out_unlock;
    }
  }
  if (!m->event_id || !*m->event_id || m->type == NH_MT_UNKNOWN) {
    /* a broker transport names what is wrong with a malformed message in error_text */
    const char *why = m->type == NH_MT_UNKNOWN ? (m->error_text ? m->error_text : "unknown message type")
                                               : "message has no EventId";
    rc = route_dead_letter(d, job, why);
    goto out_unlock;
  }

  switch (m->type) {
  case NH_MT_EVENT:
    if (ep->inbox && m->message_id && nh_uow_inbox_has(d->uow, ep->name, m->message_id)) {
      nh_audit_t a;
      audit_load(d, job, &a);
      audit_status(&a, NH_ST_SKIPPED, "DuplicateDetected", NULL, NULL);
      rc = audit_write(d, job, &a, "inbox: message already handled");
      if (!rc && job->src == NH_JOB_PARKED) rc = parked_done(d, job, &st);
      if (!rc) rc = settle(d, job, NH_SETTLE_COMPLETE, 0, NULL);
    } else if (job->src == NH_JOB_QUEUE && is_blocker(&st, m->event_id)) {
      /* A redelivered blocker is never parked behind itself: its outcome is recorded. */
      rc = nh_uow_history_add(d->uow, ep->name, m->event_id, m->message_id, "EventRequest", "Redelivered",
                              "redelivery of the session's blocking event; settled without running the handler",
                              NULL);
      if (!rc) rc = settle(d, job, NH_SETTLE_COMPLETE, 0, NULL);
    } else if (job->src == NH_JOB_QUEUE && (st.blocked_by || st.draining)) {
      rc = route_park(d, job, &st);
    } else {
      run = 1;
    }
    break;
  case NH_MT_RESUBMIT: {
    /* A parked event replays in order; running it now as well would run it twice. */
    nh_audit_t a;
    memset(&a, 0, sizeof a);
    int found = nh_uow_audit_get(d->uow, ep->name, m->event_id, &a) == 1;
    int parked = found && a.status && strcmp(a.status, NH_ST_DEFERRED) == 0;
    /* a new body is a new intent, not a duplicate of the message the inbox holds */
    int new_body = found && m->body &&
                   (!a.payload || nh_audit_payload_len(&a) != m->body_len || memcmp(a.payload, m->body, m->body_len) != 0);
    nh_audit_clear(&a);
    if (parked) {
      note_rejected(d, job, "resubmit rejected: the event is parked and will replay in order");
      rc = nh_uow_history_add(d->uow, ep->name, m->event_id, m->message_id, "ResubmissionRequest", "Rejected",
                              "resubmit rejected: the event is parked and will replay in order", NULL);
      if (!rc) rc = settle(d, job, NH_SETTLE_COMPLETE, 0, NULL);
    } else if (ep->inbox && !new_body && m->parent_message_id &&
               nh_uow_inbox_has(d->uow, ep->name, m->parent_message_id)) {
      /* the inbox already holds the message this resubmits: its effects happened once */
      nh_audit_t dup;
      audit_load(d, job, &dup);
      audit_status(&dup, NH_ST_SKIPPED, "DuplicateDetected", NULL, NULL);
      rc = audit_write(d, job, &dup, "inbox: the resubmitted message was already handled");
      if (!rc) rc = settle(d, job, NH_SETTLE_COMPLETE, 0, NULL);
    } else {
      run = 1;
    }
    break;
  }
  case NH_MT_SKIP:
    rc = route_skip(d, job, &st);
    break;
  case NH_MT_HANDOFF_COMPLETE:
  case NH_MT_HANDOFF_FAIL:
    rc = route_handoff(d, job, &st);
    break;
  default:
    rc = route_dead_letter(d, job, "unknown message type");
  }
  if (run) {
    job->st = st;   /* the lock keeps it valid until apply */
    return 1;
  }
  nh_session_state_clear(&st);
  goto out_unlock_nostate;

out_unlock:
  nh_session_state_clear(&st);
out_unlock_nostate:
  if (!rc) rc = unlock(d, job);
  return rc ? rc : 0;
}

/* ---------------------------------------------------------------- outcomes */

static int64_t transient_delay(int attempt)
{
  int64_t ms = 1000;
  for (int i = 1; i < attempt && ms < 30000; i++) ms *= 2;
  return ms > 30000 ? 30000 : ms;
}

int nh_dispatch_flush_pubs(nh_dispatch_t *d, nh_job_t *job)
{
  if (nh_queue_empty(&job->pubs)) return NH_OK;   /* most handlers publish nothing */
  nh_queue_t *q;
  char tp[NH_TRACEPARENT_LEN + 1];   /* the handler's span is the parent of what it publishes */
  nh_trace_format(&job->span, tp);
  nh_queue_foreach(q, &job->pubs) {
    nh_pub_t *p = nh_queue_data(q, nh_pub_t, node);
    nh_msg_t m;
    memset(&m, 0, sizeof m);
    char session[37];
    if (!p->session) nh_uuid_v7(session);
    if (p->given_id) {
      int dup = nh_dispatch_pub_dedup(d, job->ep->name, p->given_id, 1);   /* in the outcome's transaction */
      if (dup < 0) return NH_EFAIL;
      if (dup) continue;
    }
    m.session_id = p->session ? p->session : session;
    m.message_id = p->given_id ? p->given_id : p->message_id;
    m.event_type = p->type;
    m.type = NH_MT_EVENT;
    m.correlation_id = p->correlation_id ? p->correlation_id : job->msg.correlation_id;
    m.originating_message_id = job->msg.originating_message_id ? job->msg.originating_message_id : job->msg.message_id;
    m.parent_message_id = job->msg.message_id;
    m.from = job->ep->name;
    m.traceparent = tp;
    m.tracestate = job->msg.tracestate;
    m.body = p->body;
    m.body_len = p->body_len;
    m.enqueued_at = nh_time_now_ms();
    int copies = 0;
    nh_error_t err = {0};
    if (d->tr->vt->send(d->tr, &m, p->to, &copies, &err)) {
      nh_log_error("dispatch", "%s: publishing %s: %s", job->ep->name, p->type, err.msg);
      return NH_EFAIL;
    }
    if (copies == 0 && !nh_uow_missed(d->uow))   /* a void pass has not read the subscribers yet */
      nh_log_warn("dispatch", "%s published %s but no endpoint subscribes to it", job->ep->name, p->type);
  }
  return NH_OK;
}

int nh_dispatch_apply(nh_dispatch_t *d, nh_job_t *job)
{
  nh_msg_t *m = &job->msg;
  nh_endpoint_t *ep = job->ep;
  nh_outcome_t *o = &job->out;
  if (o->kind == NH_OUT_CANCELLED && job->cancel != NH_CANCEL_NONE && job->cancel != NH_CANCEL_LOCK_LOST) {
    /* The host ended it (renewal cap, is_alive): a failure like any other, under the
     * endpoint's retry policy, so it neither loops nor ends dead-lettered behind the
     * session's later events. */
    char text[1024];
    snprintf(text, sizeof text, "handler cancelled: %s%s%s", nh_dispatch_cancel_name(job->cancel),
             job->cancel_detail ? ": " : "", job->cancel_detail ? job->cancel_detail : "");
    nh_outcome_clear(o);
    o->kind = NH_OUT_FAILED;
    o->error_text = nh_xstrdup(text);
    o->error_type = nh_xstrdup("HandlerCancelled");
  }
  if (o->kind == NH_OUT_CANCELLED) {
    /* The host is stopping, or the lock is gone (another owner may have the message now):
     * nothing recorded, nothing settled, the message is delivered again. The history
     * says why. */
    if (job->cancel == NH_CANCEL_LOCK_LOST && m->event_id &&
        nh_uow_history_add(d->uow, ep->name, m->event_id, m->message_id, nh_msg_type_name(m->type), "Cancelled",
                           "handler cancelled: lock lost; not settled here, delivered again", NULL))
      return NH_EFAIL;
    return job->src == NH_JOB_QUEUE ? settle(d, job, NH_SETTLE_RELEASE, 0, NULL) : unlock(d, job);
  }
  if (o->kind == NH_OUT_TRANSIENT && m->reply_to && *m->reply_to) {
    /* A request: its reply address is on the message, not in the audit a retry runs
     * from, so it is redelivered (the requester's timeout bounds it). */
    /* a Retry-After is honoured up to the same 30 s: a requester waits no longer than that */
    int64_t delay = nh_outcome_retry_delay_ms(o, transient_delay(m->release_count + 1), 30000);
    nh_log_info("dispatch", "%s %s: transient failure, redelivering in %lld ms: %s", ep->name, m->event_id,
                (long long)delay, o->error_text ? o->error_text : "");
    if (job->src == NH_JOB_RETRY) {
      nh_session_state_t st = job->st;
      st.retry_due = nh_time_now_ms() + delay;
      int rc = nh_uow_session_put(d->uow, ep->name, m->session_id, &st);
      return rc ? rc : unlock(d, job);
    }
    return settle(d, job, NH_SETTLE_RELEASE, delay, NULL);
  }

  /* A copy: if this batch rolls back, the job is applied again from the same state. */
  nh_session_state_t st = job->st;
  st.blocked_by = nh_xstrdup(job->st.blocked_by);
  nh_audit_t a;
  audit_load(d, job, &a);
  a.retry_count = m->retry_count;
  a.overdue_at = 0;   /* a new outcome: a hand-off it opens is due afresh */
  if (job->started_ms) {
    a.processing_time_ms = (int64_t)((job->finished_ns - job->started_ns) / 1000000u);
    a.queue_time_ms = m->enqueued_at && job->started_ms >= m->enqueued_at ? job->started_ms - m->enqueued_at : -1;
  }
  int blocker = is_blocker(&st, m->event_id);
  const char *detail = NULL;
  char buf[512];
  int rc = NH_OK;

  if (o->kind != NH_OUT_HANDOFF && o->kind != NH_OUT_COMPLETED) {
    set(&a.handoff_reason, NULL);
    set(&a.external_job_id, NULL);
    a.expected_by = 0;
  }
  switch (o->kind) {
  case NH_OUT_COMPLETED:
    audit_status(&a, NH_ST_COMPLETED, NULL, NULL, NULL);
    set(&a.handoff_reason, NULL);
    set(&a.external_job_id, NULL);
    a.expected_by = 0;
    if (job->src == NH_JOB_RETRY || blocker) unblock(d, job, &st);
    if (ep->inbox && m->message_id) rc = nh_uow_inbox_add(d->uow, ep->name, m->message_id);
    if (!rc) rc = nh_dispatch_flush_pubs(d, job);
    detail = "handler completed";
    break;
  case NH_OUT_TRANSIENT: {
    /* Pending+Retrying under the endpoint's transient policy, blocking the session (its
     * later events park, order kept); then Failed when the attempts are used up. */
    int attempt = (nh_audit_retrying(&a) ? a.attempts : 0) + 1, max = ep->transient.max_retries + 1;
    a.attempts = attempt;
    job->attempt = attempt;
    job->max_attempts = max;
    if (!st.blocked_by) set(&st.blocked_by, m->event_id);
    int own = strcmp(st.blocked_by, m->event_id) == 0;
    if (attempt < max && own) {
      audit_status(&a, NH_ST_PENDING, o->error_text, o->error_type, o->error_stack);
      set(&a.sub_status, NH_SUB_RETRYING);
      /* the error's retry_after (an API's Retry-After) lengthens the wait, up to the policy's
       * max_delay, or one hour when the policy has no cap */
      int64_t cap = ep->transient.max_delay_ms > 0 ? ep->transient.max_delay_ms : 3600000;
      int64_t delay = nh_outcome_retry_delay_ms(o, nh_retry_delay_ms(&ep->transient, attempt - 1, nh_random_unit()),
                                                cap);
      st.retry_due = nh_time_now_ms() + delay;
      job->retry_in_ms = delay;
      snprintf(buf, sizeof buf, "transient failure (attempt %d of %d); next attempt in %lld ms", attempt, max,
               (long long)delay);
    } else {
      audit_status(&a, NH_ST_FAILED, o->error_text, o->error_type, o->error_stack);
      if (own) st.retry_due = 0;
      snprintf(buf, sizeof buf, "transient failure (attempt %d of %d): attempts used up; session %s blocked until "
               "resubmit or skip", attempt, max, m->session_id);
    }
    detail = buf;
    break;
  }
  case NH_OUT_FAILED: {
    audit_status(&a, NH_ST_FAILED, o->error_text, o->error_type, o->error_stack);
    if (m->type == NH_MT_RESUBMIT) {
      /* The operator owns a resubmitted event: no automatic retry, block owner unchanged. */
      if (blocker) st.retry_due = 0;
      detail = "resubmitted handler failed";
      break;
    }
    if (!st.blocked_by) set(&st.blocked_by, m->event_id);
    int64_t delay = nh_retry_next(&ep->retry, m->event_type, o->error_text, m->retry_count);
    if (delay >= 0 && strcmp(st.blocked_by, m->event_id) == 0) {
      st.retry_due = nh_time_now_ms() + delay;
      job->retry_in_ms = delay;
      snprintf(buf, sizeof buf, "handler failed; retry %d scheduled in %lld ms", m->retry_count + 1, (long long)delay);
    } else {
      st.retry_due = 0;
      snprintf(buf, sizeof buf, "handler failed; session %s blocked until resubmit or skip", m->session_id);
    }
    detail = buf;
    break;
  }
  case NH_OUT_HANDOFF:
    audit_status(&a, NH_ST_PENDING, NULL, NULL, NULL);
    set(&a.sub_status, "Handoff");
    set(&a.handoff_reason, o->handoff_reason);
    set(&a.external_job_id, o->external_job_id);
    a.expected_by = o->expected_by_s >= 0 ? nh_time_now_ms() + (int64_t)(o->expected_by_s * 1000.0) : 0;
    if (!st.blocked_by) set(&st.blocked_by, m->event_id);
    if (is_blocker(&st, m->event_id)) st.retry_due = 0;
    rc = nh_dispatch_flush_pubs(d, job);
    detail = "handed off; session blocked until the hand-off is settled";
    break;
  case NH_OUT_DEADLETTER:
    audit_status(&a, NH_ST_DEADLETTERED, o->error_text, o->error_type, o->error_stack);
    if (job->src == NH_JOB_RETRY || blocker) unblock(d, job, &st);
    detail = "dead-lettered (permanent failure); session not blocked";
    break;
  case NH_OUT_UNSUPPORTED:
    audit_status(&a, NH_ST_UNSUPPORTED, o->error_text, NULL, NULL);
    if (job->src == NH_JOB_RETRY || blocker) unblock(d, job, &st);
    detail = "no handler for this event type";
    break;
  default:
    break;
  }

  if (job->src == NH_JOB_PARKED) {
    if (!rc) rc = nh_uow_parked_delete(d->uow, ep->name, m->session_id, job->park_seq);
    note_parked(d, ep->name, -1);
    if (!st.blocked_by) {
      st.draining = parked_after(&st, job->park_seq);
    } else if (!rc && is_blocker(&st, m->event_id)) {
      /* re-blocked during the replay: the still-parked rows now wait for this event */
      char text[512];
      snprintf(text, sizeof text, "Session %s is blocked by %s", m->session_id, m->event_id);
      rc = nh_uow_audit_retext_deferred(d->uow, ep->name, m->session_id, text);
    }
  }
  /* A session that had no row when this job was routed (its lock kept it so) and is still
   * free has none to delete: the common case, a statement per event saved. */
  int untouched = !st.exists && !st.blocked_by && !st.draining && !st.retry_due;
  if (!rc && !untouched) rc = nh_uow_session_put(d->uow, ep->name, m->session_id, &st);
  if (!rc) rc = audit_write(d, job, &a, detail);
  else nh_audit_clear(&a);
  note_session(d, job, job->st.blocked_by, &st);   /* told after the outcome that caused it */
  nh_session_state_clear(&st);
  /* A failed responder sends an error reply at once; a dead-lettered request (a middleware
   * refusing it, say) sends none, so the requester times out as with NimBus. */
  if (!rc && m->reply_to && *m->reply_to && (o->kind == NH_OUT_COMPLETED || o->kind == NH_OUT_FAILED))
    rc = nh_dispatch_send_reply(d, job);
  if (!rc) {
    if (o->kind == NH_OUT_DEADLETTER) rc = settle(d, job, NH_SETTLE_DEAD_LETTER, 0, o->error_text);
    else rc = settle(d, job, NH_SETTLE_COMPLETE, 0, NULL);
  }
  if (!rc) rc = unlock(d, job);
  return rc;
}

void nh_job_free(nh_job_t *job)
{
  nh_session_state_clear(&job->st);
  nh_msg_clear(&job->msg);
  nh_outcome_clear(&job->out);
  free(job->cancel_detail);
  while (!nh_queue_empty(&job->pubs)) {
    nh_pub_t *p = nh_queue_data(nh_queue_head(&job->pubs), nh_pub_t, node);
    nh_queue_remove(&p->node);
    nh_pub_free(p);
  }
  free(job);
}

void nh_pub_free(nh_pub_t *p)
{
  free(p->type);
  free(p->body);
  free(p->session);
  free(p->correlation_id);
  free(p->to);
  free(p->given_id);
  free(p);
}
