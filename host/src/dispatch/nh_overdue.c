/* Overdue hand-offs: a pending hand-off whose expected_by passed is flagged once (the
 * audit row's overdue_at, a history row), and told as every other story is, after the
 * commit: a warning line, nimbus_handoffs_overdue_total and the handoff_overdue hook.
 * Only the endpoints this host serves are flagged here, so the hook runs where the adapter
 * is; the conditional UPDATE keeps two hosts on one store from flagging one twice. */
#include "nh_dispatch_int.h"
#include "core/nh_log.h"
#include "core/nh_util.h"

#include <stdio.h>

#define NH_OVERDUE_EVERY_MS 1000
#define NH_OVERDUE_BATCH 200

struct due_ctx {
  nh_dispatch_t *d;
  int64_t now;
  int failed, seen;
};

static int on_due(void *data, const nh_audit_t *a)
{
  struct due_ctx *c = data;
  c->seen++;
  nh_endpoint_t *ep = nh_dispatch_find_endpoint(c->d, a->endpoint);
  if (!ep || ep->retired) return 0;
  int flagged = nh_store_handoff_flag_overdue(c->d->store, a->endpoint, a->event_id, c->now);
  if (flagged < 0) {
    c->failed = 1;
    return 1;
  }
  if (!flagged) return 0;
  char exp[40], detail[256];
  nh_time_iso8601(a->expected_by, exp, sizeof exp);
  snprintf(detail, sizeof detail, "hand-off overdue: expected by %s%s%s", exp,
           a->external_job_id ? ", job " : "", a->external_job_id ? a->external_job_id : "");
  if (nh_store_history_add(c->d->store, a->endpoint, a->event_id, a->message_id, "HandoffOverdue", NH_ST_PENDING,
                           detail)) {
    c->failed = 1;
    return 1;
  }
  nh_note_t *n = nh_story_add(&c->d->story, NH_NOTE_OVERDUE);
  nh_note_set(&n->endpoint, a->endpoint);
  nh_note_set(&n->event_id, a->event_id);
  nh_note_set(&n->session, a->session_id);
  nh_note_set(&n->type, a->event_type);
  nh_note_set(&n->message_id, a->message_id);
  nh_note_set(&n->status, a->status);
  nh_note_set(&n->sub_status, a->sub_status);
  nh_note_set(&n->detail, detail);
  nh_note_set(&n->external_job_id, a->external_job_id);
  n->expected_by = a->expected_by;
  return 0;
}

static void overdue_cb(uv_timer_t *h)
{
  nh_dispatch_t *d = h->data;
  if (d->stopping || d->pumping) return;
  struct due_ctx c = { d, nh_time_now_ms(), 0, 0 };
  if (nh_store_begin(d->store)) return;
  if (nh_store_handoffs_due(d->store, c.now, NH_OVERDUE_BATCH, on_due, &c)) c.failed = 1;
  if (!c.failed && nh_store_commit(d->store) == NH_OK) {
    nh_dispatch_tell(d);
    if (c.seen >= NH_OVERDUE_BATCH) uv_timer_start(&d->overdue_timer, overdue_cb, 0, NH_OVERDUE_EVERY_MS);
    return;
  }
  nh_store_rollback(d->store);
  nh_story_rollback(&d->story, 0);
}

void nh_dispatch_overdue_start(nh_dispatch_t *d)
{
  if (!d->store) return;   /* PostgreSQL: not built yet (nh_dispatch_init_pg says so) */
  uv_timer_start(&d->overdue_timer, overdue_cb, NH_OVERDUE_EVERY_MS, NH_OVERDUE_EVERY_MS);
}
