/* Lock renewal and liveness of running handlers (docs/architecture.md, "Lock renewal and
 * liveness"). Session locks are renewed on their own timer, independent of what the
 * handlers do (the CPU budget gives the loop back), so they stay ours however long the
 * handlers take and also while the host drains at shutdown. A handler past its renewal
 * cap or not alive any more is cancelled and recorded as a failure (the endpoint's retry
 * policy decides what follows); one whose lock is gone is cancelled with nothing recorded
 * or settled (another owner may have the message), and it is delivered again. */
#include "nh_dispatch_int.h"
#include "core/nh_log.h"
#include "core/nh_util.h"

#include <stdlib.h>

const char *nh_dispatch_cancel_name(nh_cancel_t c)
{
  switch (c) {
  case NH_CANCEL_RENEW_CAP: return "renewal cap (lock.renew_max) reached";
  case NH_CANCEL_NOT_ALIVE: return "is_alive returned false";
  case NH_CANCEL_ALIVE_RAISED: return "is_alive raised";
  case NH_CANCEL_LOCK_LOST: return "lock lost";
  case NH_CANCEL_NONE: break;
  }
  return "cancelled";
}

/* Decides whether a running handler keeps its lock: NH_CANCEL_NONE to renew, or why it ends. */
static nh_cancel_t keep_reason(nh_job_t *job, int64_t now)
{
  nh_endpoint_t *ep = job->ep;
  if (ep->renew_max_ms > 0 && now - job->started_ms >= ep->renew_max_ms) return NH_CANCEL_RENEW_CAP;
  nh_error_t err = {0};
  int alive = nh_vm_task_alive(job->vm, job->msg.event_id, &err);   /* its generation, not the endpoint's */
  if (alive < 0) {
    nh_log_warn("dispatch", "%s %s: is_alive raised: %s", ep->name, job->msg.event_id, err.msg);
    free(job->cancel_detail);
    job->cancel_detail = nh_xstrdup(err.msg);   /* into the failure the cancellation becomes */
    return NH_CANCEL_ALIVE_RAISED;
  }
  return alive ? NH_CANCEL_NONE : NH_CANCEL_NOT_ALIVE;
}

static void renew_cb(uv_timer_t *h)
{
  nh_dispatch_t *d = h->data;
  if (d->pumping || nh_queue_empty(&d->running_jobs)) return;
  int64_t now = nh_time_now_ms();
  /* decide first (is_alive runs Lua), then write, then cancel (cancelling re-enters and
   * takes the job off the list: work on a copy of it) */
  int n = 0;
  nh_queue_t *q;
  nh_queue_foreach(q, &d->running_jobs) n++;
  nh_job_t **jobs = nh_xmalloc(sizeof *jobs * (size_t)n);
  nh_cancel_t *why = nh_xmalloc(sizeof *why * (size_t)n);
  int i = 0;
  nh_queue_foreach(q, &d->running_jobs) {
    nh_job_t *j = nh_queue_data(q, nh_job_t, run_node);
    jobs[i] = j;
    why[i++] = j->task ? keep_reason(j, now) : NH_CANCEL_NONE;
  }
  /* on sqlite the renewals are one transaction; on PostgreSQL the transport batches them */
  if (!d->store || nh_store_begin(d->store) == NH_OK) {
    for (i = 0; i < n; i++) {
      if (why[i] != NH_CANCEL_NONE || !jobs[i]->task) continue;
      int held = d->tr->vt->renew(d->tr, jobs[i]->ep->name, jobs[i]->msg.session_id, now);
      if (held == 1) {
        d->renewals++;
        nh_log_debug("dispatch", "%s %s (session %s): lock renewed", jobs[i]->ep->name, jobs[i]->msg.event_id,
                     jobs[i]->msg.session_id);
      } else if (held == 0) {
        d->renew_failures++;
        why[i] = NH_CANCEL_LOCK_LOST;
      }
    }
    if (d->store && nh_store_commit(d->store)) nh_store_rollback(d->store);
  }
  for (i = 0; i < n; i++) {
    if (why[i] == NH_CANCEL_NONE || !jobs[i]->task) continue;
    d->cancellations++;
    nh_log_warn("dispatch", "%s %s (session %s): %s after %.1f s; cancelling the handler, %s", jobs[i]->ep->name,
                jobs[i]->msg.event_id, jobs[i]->msg.session_id, nh_dispatch_cancel_name(why[i]),
                (double)(now - jobs[i]->started_ms) / 1000.0,
                why[i] == NH_CANCEL_LOCK_LOST ? "the message is released unsettled for redelivery"
                                              : "recorded as a failure under the endpoint's retry policy");
    jobs[i]->cancel = why[i];
    nh_vm_task_cancel(jobs[i]->task);   /* task_done: the job moves to `done` as cancelled */
  }
  free(jobs);
  free(why);
}

void nh_dispatch_renew_start(nh_dispatch_t *d)
{
  uint64_t every = (uint64_t)(d->tr->lock_ms / 3 > 0 ? d->tr->lock_ms / 3 : 1);
  uv_timer_start(&d->renew_timer, renew_cb, every, every);
}
