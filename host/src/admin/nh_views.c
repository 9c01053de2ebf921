/* JSON views of store rows (nh_views.h). */
#include "nh_views.h"
#include "core/nh_trace.h"
#include "core/nh_util.h"

json_t *nh_view_str(const char *s) { return s ? json_string(s) : json_null(); }

json_t *nh_view_time(int64_t ms)
{
  if (!ms) return json_null();
  char buf[40];
  nh_time_iso8601(ms, buf, sizeof buf);
  return json_string(buf);
}

json_t *nh_view_audit(const nh_audit_t *a)
{
  json_t *o = json_object();
  json_object_set_new(o, "endpoint", nh_view_str(a->endpoint));
  json_object_set_new(o, "event_id", nh_view_str(a->event_id));
  json_object_set_new(o, "session_id", nh_view_str(a->session_id));
  json_object_set_new(o, "event_type", nh_view_str(a->event_type));
  json_object_set_new(o, "status", nh_view_str(a->status));
  json_object_set_new(o, "sub_status", nh_view_str(a->sub_status));
  json_object_set_new(o, "error_text", nh_view_str(a->error_text));
  json_object_set_new(o, "error_type", nh_view_str(a->error_type));
  json_object_set_new(o, "handoff_reason", nh_view_str(a->handoff_reason));
  json_object_set_new(o, "external_job_id", nh_view_str(a->external_job_id));
  json_object_set_new(o, "expected_by", nh_view_time(a->expected_by));
  json_object_set_new(o, "message_id", nh_view_str(a->message_id));
  json_object_set_new(o, "retry_count", json_integer(a->retry_count));
  json_object_set_new(o, "attempts", json_integer(a->attempts));
  json_object_set_new(o, "queue_time_ms", a->queue_time_ms >= 0 ? json_integer(a->queue_time_ms) : json_null());
  json_object_set_new(o, "processing_time_ms",
                      a->processing_time_ms >= 0 ? json_integer(a->processing_time_ms) : json_null());
  json_object_set_new(o, "overdue", json_boolean(nh_audit_overdue(a)));
  json_object_set_new(o, "overdue_at", nh_view_time(a->overdue_at));
  char tid[33];
  json_object_set_new(o, "trace_id", nh_trace_id_of(a->traceparent, tid) ? json_string(tid) : json_null());
  json_object_set_new(o, "updated_at", nh_view_time(a->updated_at));
  return o;
}

json_t *nh_view_history(const nh_history_row_t *r)
{
  json_t *o = json_object();
  json_object_set_new(o, "at", nh_view_time(r->at));
  json_object_set_new(o, "message_id", nh_view_str(r->message_id));
  json_object_set_new(o, "message_type", nh_view_str(r->message_type));
  json_object_set_new(o, "status", nh_view_str(r->status));
  json_object_set_new(o, "detail", nh_view_str(r->detail));
  if (r->error_text) json_object_set_new(o, "error_text", nh_view_str(r->error_text));
  if (r->error_type) json_object_set_new(o, "error_type", nh_view_str(r->error_type));
  if (r->error_stack) json_object_set_new(o, "error_stack", nh_view_str(r->error_stack));
  if (r->previous_payload) json_object_set_new(o, "previous_payload", nh_view_str(r->previous_payload));
  return o;
}

json_t *nh_view_failgroup(const nh_failgroup_row_t *g, const char *message)
{
  json_t *o = json_object();
  json_object_set_new(o, "group", nh_view_str(g->group));
  json_object_set_new(o, "endpoint", nh_view_str(g->endpoint));
  json_object_set_new(o, "error_type", nh_view_str(g->error_type));
  json_object_set_new(o, "message", nh_view_str(message));
  json_object_set_new(o, "count", json_integer(g->count));
  json_object_set_new(o, "first_seen", nh_view_time(g->first_ms));
  json_object_set_new(o, "last_seen", nh_view_time(g->last_ms));
  json_object_set_new(o, "sample_event_id", nh_view_str(g->sample_event_id));
  json_object_set_new(o, "sample_error_text", nh_view_str(g->sample_text));
  return o;
}
