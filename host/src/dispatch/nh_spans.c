/* Traces on the dispatcher's side (docs/observability.md, Traces): a handler run is a
 * CONSUMER span, child of the context its message arrived with; what the handler
 * publishes carries that span as its parent; a publish outside any handler starts a
 * trace of its own with a PRODUCER span. Ids are minted and the traceparent travels
 * whether or not spans are exported (--otlp), so a later host can continue the trace. */
#include "nh_dispatch_int.h"
#include "core/nh_log.h"
#include "core/nh_metrics.h"
#include "core/nh_runtime.h"
#include "core/nh_util.h"
#include "net/nh_otlp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static nh_metric_t m_invalid = NH_METRIC_DEF(NH_METRIC_COUNTER, "nimbus_trace_context_invalid_total",
  "Incoming traceparent values that were malformed (the handler started a new trace)");

static nh_otlp_t *exporter(nh_dispatch_t *d) { return nh_runtime_of(d->loop)->otlp; }

void nh_dispatch_spans_start(void) { nh_metric_add(&m_invalid, 0); }

void nh_dispatch_span_begin(nh_dispatch_t *d, nh_job_t *job)
{
  nh_msg_t *m = &job->msg;
  nh_trace_ctx_t parent;
  job->span_has_parent = 0;
  if (m->traceparent && nh_trace_parse(m->traceparent, &parent) == 0) {
    nh_trace_new_child(&parent, &job->span);
    memcpy(job->span_parent, parent.span_id, sizeof job->span_parent);
    job->span_has_parent = 1;
  } else {
    if (m->traceparent) {
      nh_metric_add(&m_invalid, 1);
      nh_log_debug("trace", "%s %s: malformed traceparent '%.80s' ignored: a new trace starts", job->ep->name,
                   m->event_id ? m->event_id : "", m->traceparent);
    }
    nh_trace_new_root(&job->span);
    /* The event's trace from now on: its audit row keeps this, so a retry or a
     * resubmit runs in the same trace, as a child of this first run. */
    char tp[NH_TRACEPARENT_LEN + 1];
    nh_trace_format(&job->span, tp);
    free(m->traceparent);
    m->traceparent = nh_xstrdup(tp);
  }
  /* tracestate travels only beside the traceparent it belongs to, and only when valid */
  if (m->tracestate && (!job->span_has_parent || !nh_tracestate_valid(m->tracestate))) {
    free(m->tracestate);
    m->tracestate = NULL;
  }
  job->span_start_ns = nh_trace_now_ns();
  job->span_set = 1;
}

static const char *outcome_name(const nh_job_t *job)
{
  switch (job->out.kind) {
  case NH_OUT_COMPLETED: return "completed";
  case NH_OUT_FAILED: return "failed";
  case NH_OUT_HANDOFF: return "handed_off";
  case NH_OUT_DEADLETTER: return "dead_lettered";
  case NH_OUT_UNSUPPORTED: return "unsupported";
  case NH_OUT_TRANSIENT: return "retrying";
  case NH_OUT_CANCELLED: return "cancelled";
  }
  return "unknown";
}


void nh_dispatch_span_end(nh_dispatch_t *d, nh_job_t *job)
{
  nh_otlp_t *x = exporter(d);
  if (!x || !job->span_set || !(job->span.flags & NH_TRACE_SAMPLED)) return;
  const nh_msg_t *m = &job->msg;
  const nh_outcome_t *o = &job->out;
  char cancelled[160] = "";
  const char *error_text = o->error_text, *error_type = o->error_type;
  if (o->kind == NH_OUT_CANCELLED) {
    snprintf(cancelled, sizeof cancelled, "handler cancelled: %s",
             job->cancel != NH_CANCEL_NONE ? nh_dispatch_cancel_name(job->cancel) : "the host is stopping");
    error_text = cancelled;
    error_type = "HandlerCancelled";
  }
  int error = o->kind != NH_OUT_COMPLETED && o->kind != NH_OUT_HANDOFF;
  nh_span_attr_t attrs[] = {
    NH_SPAN_STR("messaging.system", "nimbus"),
    NH_SPAN_STR("messaging.operation", "process"),
    NH_SPAN_STR("messaging.destination.name", job->ep->name),
    NH_SPAN_STR("messaging.message.id", m->message_id),
    NH_SPAN_STR("nimbus.event_id", m->event_id),
    NH_SPAN_STR("nimbus.event_type", m->event_type),
    NH_SPAN_STR("nimbus.session_id", m->session_id),
    NH_SPAN_STR("nimbus.run_kind", nh_run_kind_name(job->kind)),
    NH_SPAN_NUM("nimbus.retry_count", m->retry_count),
    NH_SPAN_NUM("nimbus.delivery_count", m->delivery_count),
    NH_SPAN_STR("nimbus.outcome", outcome_name(job)),
    NH_SPAN_STR(error && error_type ? "error.type" : NULL, error_type),
  };
  char name[160];
  snprintf(name, sizeof name, "process %.140s", m->event_type ? m->event_type : "");
  nh_span_t s = {
    .name = name, .kind = NH_SPAN_CONSUMER, .has_parent = job->span_has_parent,
    .start_ns = job->span_start_ns,
    .end_ns = job->span_start_ns + (int64_t)(job->finished_ns - job->started_ns),
    .error = error, .status_message = error ? error_text : NULL,
    .attrs = attrs, .nattrs = (int)(sizeof attrs / sizeof attrs[0]),
  };
  memcpy(s.trace_id, job->span.trace_id, sizeof s.trace_id);
  memcpy(s.span_id, job->span.span_id, sizeof s.span_id);
  memcpy(s.parent_span_id, job->span_parent, sizeof s.parent_span_id);
  nh_otlp_add(x, &s);
}

void nh_dispatch_span_root_publish(nh_dispatch_t *d, const char *event_type, const char *to,
                                   char out[NH_TRACEPARENT_LEN + 1])
{
  nh_trace_ctx_t c;
  nh_trace_new_root(&c);
  nh_trace_format(&c, out);
  nh_otlp_t *x = exporter(d);
  if (!x) return;
  nh_span_attr_t attrs[] = {
    NH_SPAN_STR("messaging.system", "nimbus"),
    NH_SPAN_STR("messaging.operation", "publish"),
    NH_SPAN_STR("nimbus.event_type", event_type),
    NH_SPAN_STR(to ? "messaging.destination.name" : NULL, to),
  };
  char name[160];
  snprintf(name, sizeof name, "publish %.140s", event_type ? event_type : "");
  int64_t now = nh_trace_now_ns();
  nh_span_t s = { .name = name, .kind = NH_SPAN_PRODUCER, .start_ns = now, .end_ns = now,
                  .attrs = attrs, .nattrs = (int)(sizeof attrs / sizeof attrs[0]) };
  memcpy(s.trace_id, c.trace_id, sizeof s.trace_id);
  memcpy(s.span_id, c.span_id, sizeof s.span_id);
  nh_otlp_add(x, &s);
}
