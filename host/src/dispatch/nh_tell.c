/* Telling a committed pump's story (nh_story.h): one log line per thing an operator must
 * hear of (docs/observability.md, "Log lines"), the metrics, and the lifecycle hooks.
 * Also the dispatcher's gauges: the store-wide ones (blocked sessions, parked events,
 * pending hand-offs) are read from the store once per endpoint and then kept in step by
 * the notes, so a scrape never scans the store (on PostgreSQL, shared by hosts on several
 * machines, read again now and then: nh_gauges_pg.c). */
#include "nh_dispatch_int.h"
#include "core/nh_log.h"
#include "core/nh_metrics.h"
#include "core/nh_util.h"

#include <string.h>

static nh_metric_t m_events = NH_METRIC_DEF(NH_METRIC_COUNTER, "nimbus_events_total",
  "Event outcomes recorded, by endpoint, event type and outcome", "endpoint", "type", "outcome");
static nh_metric_t m_retries = NH_METRIC_DEF(NH_METRIC_COUNTER, "nimbus_retries_scheduled_total",
  "Retries scheduled after a failure (kind: transient or policy)", "endpoint", "kind");
static nh_metric_t m_handoffs_opened = NH_METRIC_DEF(NH_METRIC_COUNTER, "nimbus_handoffs_opened_total",
  "Hand-offs opened (ctx:mark_pending_handoff)", "endpoint");
static nh_metric_t m_handoffs_overdue = NH_METRIC_DEF(NH_METRIC_COUNTER, "nimbus_handoffs_overdue_total",
  "Pending hand-offs flagged overdue (their expected_by passed), once each", "endpoint");
static nh_metric_t m_handoffs_settled = NH_METRIC_DEF(NH_METRIC_COUNTER, "nimbus_handoffs_settled_total",
  "Pending hand-offs settled, by result (completed, failed, skipped, resubmitted)", "endpoint", "result");
static nh_metric_t m_operator = NH_METRIC_DEF(NH_METRIC_COUNTER, "nimbus_operator_actions_total",
  "Operator requests applied or rejected by this host", "endpoint", "action", "result");
static nh_metric_t m_blocks = NH_METRIC_DEF(NH_METRIC_COUNTER, "nimbus_session_blocks_total",
  "Sessions blocked (a failure, a retry or a hand-off holds their later events)", "endpoint");
static nh_metric_t m_unblocks = NH_METRIC_DEF(NH_METRIC_COUNTER, "nimbus_session_unblocks_total",
  "Blocked sessions released", "endpoint");
static nh_metric_t m_dead_letters = NH_METRIC_DEF(NH_METRIC_COUNTER, "nimbus_dead_letters_total",
  "Messages dead-lettered, by reason (handler, malformed, max_deliveries, unknown)", "endpoint", "reason");
static nh_metric_t m_locks_lost = NH_METRIC_DEF(NH_METRIC_COUNTER, "nimbus_locks_lost_total",
  "Session locks found lost when recording an outcome (the outcome discarded, the message delivered again)",
  "endpoint");
static nh_metric_t m_handler_s = NH_HISTOGRAM_DEF("nimbus_handler_duration_seconds",
  "Handler run time, from start to its outcome", nh_metric_buckets_fast, "endpoint", "type");
static nh_metric_t m_queue_s = NH_HISTOGRAM_DEF("nimbus_queue_time_seconds",
  "Time from enqueue to the handler's start (retries and parked replays included)", nh_metric_buckets_slow,
  "endpoint");
static nh_metric_t m_e2e_s = NH_HISTOGRAM_DEF("nimbus_end_to_end_seconds",
  "Time from enqueue to the Completed outcome committed", nh_metric_buckets_slow, "endpoint");

static nh_metric_t g_blocked = NH_METRIC_DEF(NH_METRIC_GAUGE, "nimbus_sessions_blocked",
  "Sessions blocked now", "endpoint");
static nh_metric_t g_parked = NH_METRIC_DEF(NH_METRIC_GAUGE, "nimbus_events_parked",
  "Events parked behind a blocked or draining session", "endpoint");
static nh_metric_t g_pending = NH_METRIC_DEF(NH_METRIC_GAUGE, "nimbus_handoffs_pending",
  "Hand-offs waiting to be settled", "endpoint");
static nh_metric_t g_in_flight = NH_METRIC_DEF(NH_METRIC_GAUGE, "nimbus_handlers_in_flight",
  "Handlers running now", "endpoint");
static nh_metric_t g_lua_mem = NH_METRIC_DEF(NH_METRIC_GAUGE, "nimbus_lua_memory_bytes",
  "Memory of each adapter's Lua VM (the current generation)", "adapter");
static nh_metric_t g_generation = NH_METRIC_DEF(NH_METRIC_GAUGE, "nimbus_reload_generation",
  "Successful hot reloads since start (0: the first load)");
static nh_metric_t m_reload_failures = NH_METRIC_DEF(NH_METRIC_COUNTER, "nimbus_reload_failures_total",
  "Hot reloads refused (the old generation kept running)");
static nh_metric_t g_retiring = NH_METRIC_DEF(NH_METRIC_GAUGE, "nimbus_lua_generations_retiring",
  "Old VM generations still finishing their handlers after a reload");
static nh_metric_t g_connected = NH_METRIC_DEF(NH_METRIC_GAUGE, "nimbus_transport_connected",
  "1 when the transport can receive and send (a broker: connected, topology declared)", "transport");
static nh_metric_t g_buffered = NH_METRIC_DEF(NH_METRIC_GAUGE, "nimbus_transport_buffered_deliveries",
  "Deliveries received from the broker, not yet handed to a handler", "transport");
static nh_metric_t g_credit = NH_METRIC_DEF(NH_METRIC_GAUGE, "nimbus_transport_credit",
  "Link credit granted to the broker, over all receivers", "transport");
static nh_metric_t g_unconfirmed = NH_METRIC_DEF(NH_METRIC_GAUGE, "nimbus_transport_unconfirmed_sends",
  "Messages sent to the broker whose outcome has not come back", "transport");
static nh_metric_t m_renewals = NH_METRIC_DEF(NH_METRIC_COUNTER, "nimbus_lock_renewals_total",
  "Session locks renewed while their handler ran");
static nh_metric_t m_renew_lost = NH_METRIC_DEF(NH_METRIC_COUNTER, "nimbus_lock_renewals_lost_total",
  "Renewals that found the lock gone (the handler cancelled, its message delivered again)");
static nh_metric_t m_cancelled = NH_METRIC_DEF(NH_METRIC_COUNTER, "nimbus_handlers_cancelled_total",
  "Handlers the host ended (lock.renew_max, is_alive false or raising, lock lost)");
static nh_metric_t m_pumps = NH_METRIC_DEF(NH_METRIC_COUNTER, "nimbus_dispatch_transactions_total",
  "Dispatcher transactions that fetched work");
static nh_metric_t m_fetched = NH_METRIC_DEF(NH_METRIC_COUNTER, "nimbus_dispatch_fetched_total",
  "Messages fetched by the dispatcher (queue heads, retries and parked replays)");
static nh_metric_t g_store_bytes = NH_METRIC_DEF(NH_METRIC_GAUGE, "nimbus_store_size_bytes",
  "Size of the store file", "file");

/* ---------------------------------------------------------------- labels */

typedef enum {
  O_COMPLETED, O_FAILED, O_RETRYING, O_HANDED_OFF, O_DEAD_LETTERED, O_UNSUPPORTED, O_PARKED, O_SKIPPED,
  O_DUPLICATE, O_OTHER
} outcome_t;

/* The outcome labels (docs/observability.md), by outcome_t. */
static const char *const outcome_names[] = { "completed", "failed", "retrying", "handed_off", "dead_lettered",
                                             "unsupported", "parked", "skipped", "duplicate", "other" };

static outcome_t outcome_of(const nh_note_t *n)
{
  const char *st = n->status ? n->status : "", *sub = n->sub_status;
  if (strcmp(st, NH_ST_PENDING) == 0) return sub && strcmp(sub, NH_SUB_RETRYING) == 0 ? O_RETRYING : O_HANDED_OFF;
  if (strcmp(st, NH_ST_COMPLETED) == 0) return O_COMPLETED;
  if (strcmp(st, NH_ST_FAILED) == 0) return O_FAILED;
  if (strcmp(st, NH_ST_DEADLETTERED) == 0) return O_DEAD_LETTERED;
  if (strcmp(st, NH_ST_UNSUPPORTED) == 0) return O_UNSUPPORTED;
  if (strcmp(st, NH_ST_DEFERRED) == 0) return O_PARKED;
  if (strcmp(st, NH_ST_SKIPPED) == 0)
    return n->error && strcmp(n->error, "DuplicateDetected") == 0 ? O_DUPLICATE : O_SKIPPED;
  return O_OTHER;
}

static const char *dead_letter_reason(const nh_note_t *n)
{
  if (n->error_type && strcmp(n->error_type, "MalformedPayload") == 0) return "malformed";
  if (n->error_type && strcmp(n->error_type, "DeadLetter") == 0) {
    if (n->detail && strncmp(n->detail, "delivered ", 10) == 0) return "max_deliveries";
    return "malformed";   /* routed without a handler: no EventId, an unknown MessageType */
  }
  return "handler";
}

/* ---------------------------------------------------------------- telling */

enum { F_ENDPOINT, F_EVENT, F_SESSION, F_TYPE, F_COMMON };

static int common_fields(const nh_note_t *n, nh_log_field_t *f)
{
  f[F_ENDPOINT] = NH_LOG_STR("endpoint", n->endpoint);
  f[F_EVENT] = NH_LOG_STR("event_id", n->event_id);
  f[F_SESSION] = NH_LOG_STR("session", n->session);
  f[F_TYPE] = NH_LOG_STR("type", n->type);
  return F_COMMON;
}

static nh_log_level_t audit_level(outcome_t o, const nh_note_t *n)
{
  switch (o) {
  case O_FAILED: case O_DEAD_LETTERED: return NH_LOG_ERROR;
  case O_RETRYING: case O_UNSUPPORTED: return NH_LOG_WARN;
  case O_HANDED_OFF: case O_SKIPPED: case O_DUPLICATE: return NH_LOG_INFO;
  default:
    /* completed and parked: one of each an event, the counters tell them; unless an
     * operator or a hand-off's settlement caused it */
    return n->action || n->delta ? NH_LOG_INFO : NH_LOG_DEBUG;
  }
}

static void tell_audit(const nh_note_t *n, int64_t now)
{
  outcome_t o = outcome_of(n);
  const char *outcome = outcome_names[o];
  nh_metric_add(&m_events, 1, n->endpoint, n->type ? n->type : "", outcome);
  if (o == O_DEAD_LETTERED) nh_metric_add(&m_dead_letters, 1, n->endpoint, dead_letter_reason(n));
  if (n->retry_in_ms >= 0 && (o == O_RETRYING || o == O_FAILED))
    nh_metric_add(&m_retries, 1, n->endpoint, o == O_RETRYING ? "transient" : "policy");
  if (n->delta > 0) nh_metric_add(&m_handoffs_opened, 1, n->endpoint);
  if (n->delta < 0) {
    const char *result = n->action && !strcmp(n->action, "skip") ? "skipped"
                         : n->action && !strcmp(n->action, "resubmit") ? "resubmitted"
                         : outcome;
    nh_metric_add(&m_handoffs_settled, 1, n->endpoint, result);
  }
  if (n->delta) nh_metric_add(&g_pending, n->delta, n->endpoint);
  if (n->action) nh_metric_add(&m_operator, 1, n->endpoint, n->action, "applied");
  if (n->handler_s >= 0) {
    nh_metric_observe(&m_handler_s, n->handler_s, n->endpoint, n->type ? n->type : "");
    if (n->enqueued_at > 0 && n->started_at >= n->enqueued_at)
      nh_metric_observe(&m_queue_s, (double)(n->started_at - n->enqueued_at) / 1000.0, n->endpoint);
  }
  if (o == O_COMPLETED && n->enqueued_at > 0 && now >= n->enqueued_at)
    nh_metric_observe(&m_e2e_s, (double)(now - n->enqueued_at) / 1000.0, n->endpoint);

  nh_log_level_t level = audit_level(o, n);
  if (!nh_log_enabled(level)) return;
  nh_log_field_t f[16];
  int k = common_fields(n, f);
  f[k++] = NH_LOG_STR("outcome", outcome);
  int has_error = o == O_FAILED || o == O_RETRYING || o == O_DEAD_LETTERED || o == O_UNSUPPORTED;
  f[k++] = NH_LOG_STR("error", has_error ? n->error : NULL);
  f[k++] = NH_LOG_STR("error_type", has_error ? n->error_type : NULL);
  f[k++] = NH_LOG_STR("action", n->action);
  if (n->attempt) f[k++] = NH_LOG_INT("attempt", n->attempt), f[k++] = NH_LOG_INT("max_attempts", n->max_attempts);
  if (n->retry_in_ms >= 0 && (o == O_RETRYING || o == O_FAILED)) f[k++] = NH_LOG_INT("retry_in_ms", n->retry_in_ms);
  if (n->handler_s >= 0)
    f[k++] = (nh_log_field_t){ .key = "handler_ms", .kind = NH_LF_NUM, .num = (double)(int64_t)(n->handler_s * 1e6) / 1e3 };
  nh_log_fields(level, "dispatch", f, k, "%s", n->detail ? n->detail : outcome);
}

static void tell_session(const nh_note_t *n)
{
  nh_metric_add(&g_blocked, n->delta, n->endpoint);
  nh_metric_add(n->delta > 0 ? &m_blocks : &m_unblocks, 1, n->endpoint);
  nh_log_field_t f[8];
  int k = common_fields(n, f);
  f[F_EVENT].str = NULL;   /* blocking: the blocker; unblocking: the event whose outcome released it */
  f[k++] = NH_LOG_STR("blocked_by", n->blocked_by);
  if (n->delta < 0) f[k++] = NH_LOG_STR("released_by", n->event_id);
  f[k++] = NH_LOG_STR("action", n->action);
  if (n->delta > 0)
    nh_log_fields(NH_LOG_WARN, "dispatch", f, k, "session %s blocked by %s: its later events park until it is "
                  "resolved", n->session, n->blocked_by);
  else
    nh_log_fields(NH_LOG_INFO, "dispatch", f, k, "session %s unblocked; parked events replay in order", n->session);
}

static void tell_rejected(const nh_note_t *n)
{
  if (n->action) nh_metric_add(&m_operator, 1, n->endpoint, n->action, "rejected");
  nh_log_field_t f[8];
  int k = common_fields(n, f);
  f[k++] = NH_LOG_STR("action", n->action);
  nh_log_fields(NH_LOG_WARN, "dispatch", f, k, "%s", n->detail);
}

static void tell_dead_letter(const nh_note_t *n)
{
  nh_metric_add(&m_events, 1, n->endpoint, n->type ? n->type : "", "dead_lettered");
  nh_metric_add(&m_dead_letters, 1, n->endpoint,
                n->detail && !strncmp(n->detail, "delivered ", 10) ? "max_deliveries" : "malformed");
  nh_log_field_t f[8];
  int k = common_fields(n, f);
  f[k++] = NH_LOG_STR("message_id", n->message_id);
  f[k++] = NH_LOG_STR("error", n->detail);
  nh_log_fields(NH_LOG_ERROR, "dispatch", f, k, "message dead-lettered: %s", n->detail);
}

/* Runs the adapters' functions for the hook (the current generation's). */
static void fire(nh_dispatch_t *d, nh_hook_t h, const nh_note_t *n)
{
  nh_hook_info_t info = { .endpoint = n->endpoint, .event_id = n->event_id, .session_id = n->session,
                          .event_type = n->type, .message_id = n->message_id, .status = n->status,
                          .error = n->error, .error_type = n->error_type, .blocked_by = n->blocked_by,
                          .detail = n->detail, .action = n->action, .retry_in_ms = n->retry_in_ms,
                          .attempt = n->attempt };
  if (n->kind == NH_NOTE_DEADLETTER) info.error = n->detail, info.status = NH_ST_DEADLETTERED;
  if (h == NH_HOOK_SESSION_BLOCKED || h == NH_HOOK_SESSION_UNBLOCKED) info.status = NULL;
  info.external_job_id = n->external_job_id;
  info.expected_by = n->expected_by;
  for (int i = 0; i < d->nadapters; i++) nh_vm_hook_fire(d->adapters[i].vm, h, &info);
}

static int hook_of(const nh_note_t *n)
{
  switch (n->kind) {
  case NH_NOTE_AUDIT: {
    outcome_t o = outcome_of(n);
    return o == O_FAILED ? NH_HOOK_EVENT_FAILED : o == O_DEAD_LETTERED ? NH_HOOK_DEAD_LETTERED : -1;
  }
  case NH_NOTE_DEADLETTER: return NH_HOOK_DEAD_LETTERED;
  case NH_NOTE_SESSION: return n->delta > 0 ? NH_HOOK_SESSION_BLOCKED : NH_HOOK_SESSION_UNBLOCKED;
  case NH_NOTE_OVERDUE: return NH_HOOK_HANDOFF_OVERDUE;
  default: return -1;
  }
}

static void tell_overdue(const nh_note_t *n)
{
  nh_metric_add(&m_handoffs_overdue, 1, n->endpoint);
  nh_log_field_t f[8];
  int k = common_fields(n, f);
  f[k++] = NH_LOG_STR("external_job_id", n->external_job_id);
  char exp[40];
  nh_time_iso8601(n->expected_by, exp, sizeof exp);
  f[k++] = NH_LOG_STR("expected_by", exp);
  nh_log_fields(NH_LOG_WARN, "dispatch", f, k, "%s; the session stays blocked until it is settled", n->detail);
}

void nh_dispatch_tell(nh_dispatch_t *d) { nh_dispatch_tell_story(d, &d->story); }

void nh_dispatch_tell_story(nh_dispatch_t *d, nh_story_t *s)
{
  int64_t now = nh_time_now_ms();   /* the commit's time: end of the end-to-end times */
  for (size_t i = 0; i < s->n; i++) {
    const nh_note_t *n = &s->notes[i];
    int h = hook_of(n);
    if (h >= 0) fire(d, (nh_hook_t)h, n);
    switch (n->kind) {
    case NH_NOTE_AUDIT: tell_audit(n, now); break;
    case NH_NOTE_SESSION: tell_session(n); break;
    case NH_NOTE_PARKED: nh_metric_add(&g_parked, n->delta, n->endpoint); break;
    case NH_NOTE_REJECTED: tell_rejected(n); break;
    case NH_NOTE_DEADLETTER: tell_dead_letter(n); break;
    case NH_NOTE_OVERDUE: tell_overdue(n); break;
    }
  }
  nh_story_rollback(s, 0);
}

void nh_dispatch_count_lock_lost(const char *endpoint) { nh_metric_add(&m_locks_lost, 1, endpoint); }

/* ---------------------------------------------------------------- gauges */

/* The store-wide gauges of endpoints not read yet (at start, after a reload). */
void nh_dispatch_gauges_set(const char *endpoint, int64_t blocked, int64_t pending, int64_t parked)
{
  nh_metric_set(&g_blocked, (double)blocked, endpoint);
  nh_metric_set(&g_pending, (double)pending, endpoint);
  nh_metric_set(&g_parked, (double)parked, endpoint);
}

static void seed(nh_dispatch_t *d)
{
  int64_t now = nh_time_now_ms();
  for (nh_endpoint_t *ep = d->endpoints; ep; ep = ep->next) {
    if (ep->metrics_seeded || ep->retired) continue;
    ep->metrics_seeded = 1;
    nh_endpoint_stats_t st;
    if (!d->store) {
      d->gauges_read_at = 0;   /* PostgreSQL: read now, on the link (nh_gauges_pg.c) */
    } else {
      if (nh_store_endpoint_stats(d->store, ep->name, now, &st) == NH_OK) {
        nh_metric_set(&g_blocked, (double)st.blocked_sessions, ep->name);
        nh_metric_set(&g_pending, (double)st.handoffs_pending, ep->name);
      }
      int64_t parked = nh_store_endpoint_parked(d->store, ep->name);
      if (parked >= 0) nh_metric_set(&g_parked, (double)parked, ep->name);
    }
    /* every endpoint shows its counters from the start, not after its first event */
    nh_metric_add(&m_blocks, 0, ep->name);
    nh_metric_add(&m_unblocks, 0, ep->name);
    nh_metric_add(&m_handoffs_opened, 0, ep->name);
    nh_metric_add(&m_handoffs_overdue, 0, ep->name);
  }
}

static void collect(void *data)
{
  nh_dispatch_t *d = data;
  seed(d);
  nh_dispatch_gauges_pg(d);   /* on PostgreSQL: the store's figures again, now and then */
  for (nh_endpoint_t *ep = d->endpoints; ep; ep = ep->next)
    if (!ep->retired) nh_metric_set(&g_in_flight, ep->in_flight, ep->name);
  nh_metric_clear(&g_lua_mem);   /* adapters come and go with reloads */
  for (int i = 0; i < d->nadapters; i++) {
    lua_State *L = nh_vm_state(d->adapters[i].vm);
    double bytes = L ? (double)lua_gc(L, LUA_GCCOUNT) * 1024.0 + (double)lua_gc(L, LUA_GCCOUNTB) : 0;
    nh_metric_set(&g_lua_mem, bytes, d->adapters[i].path);
  }
  nh_metric_set(&g_generation, (double)d->reloads);
  nh_metric_set(&m_reload_failures, (double)d->reload_failures);
  nh_metric_set(&g_retiring, d->nretiring);
  nh_transport_stats_t ts = { .connected = 1 };
  if (d->tr->vt->stats) d->tr->vt->stats(d->tr, &ts);
  const char *tn = d->tr->vt->name;
  nh_metric_set(&g_connected, ts.connected, tn);
  nh_metric_set(&g_buffered, (double)ts.buffered, tn);
  nh_metric_set(&g_credit, (double)ts.credit, tn);
  nh_metric_set(&g_unconfirmed, (double)ts.unconfirmed, tn);
  nh_metric_set(&m_renewals, (double)d->renewals);
  nh_metric_set(&m_renew_lost, (double)d->renew_failures);
  nh_metric_set(&m_cancelled, (double)d->cancellations);
  nh_metric_set(&m_pumps, (double)d->pumps);
  nh_metric_set(&m_fetched, (double)d->pumped);
  int64_t db = 0, wal = 0;
  if (!d->store) return;   /* PostgreSQL: its size is the server's to report (pg_database_size) */
  nh_store_file_sizes(d->store, &db, &wal);
  nh_metric_set(&g_store_bytes, (double)db, "db");
  nh_metric_set(&g_store_bytes, (double)wal, "wal");
}

void nh_dispatch_metrics_start(nh_dispatch_t *d)
{
  seed(d);
  nh_dispatch_gauges_pg(d);
  nh_dispatch_spans_start();
  nh_metrics_on_collect(collect, d);
}

void nh_dispatch_metrics_stop(nh_dispatch_t *d)
{
  nh_metrics_off_collect(collect, d);
  nh_story_free(&d->story);
}
