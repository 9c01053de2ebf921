/* The names of the run kinds and kill reasons, and freeing what outcomes and task
 * results own (nh_outcome_types.h). */
#include "nh_outcome_types.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *nh_run_kind_name(nh_run_kind_t k)
{
  switch (k) {
  case NH_RUN_EVENT: return "event";
  case NH_RUN_RESUBMIT: return "resubmit";
  case NH_RUN_RETRY: return "retry";
  case NH_RUN_REPLAY: return "replay";
  }
  return "event";
}

const char *nh_task_kill_name(nh_task_kill_t k)
{
  switch (k) {
  case NH_KILL_CPU_BUDGET: return "CPU budget exceeded";
  case NH_KILL_DEADLINE: return "deadline exceeded";
  case NH_KILL_NONE: break;
  }
  return "killed";
}

void nh_outcome_init(nh_outcome_t *o)
{
  memset(o, 0, sizeof *o);
  o->expected_by_s = -1;
  o->retry_after_s = -1;
}

int64_t nh_outcome_retry_delay_ms(const nh_outcome_t *o, int64_t delay_ms, int64_t cap_ms)
{
  if (!(o->retry_after_s > 0)) return delay_ms;   /* none given (or NaN): the policy decides */
  if (delay_ms >= cap_ms) return delay_ms;       /* the policy waits that long anyway */
  double want = ceil(o->retry_after_s * 1000.0);
  if (want > (double)cap_ms) return cap_ms;
  return (int64_t)want > delay_ms ? (int64_t)want : delay_ms;
}

void nh_outcome_clear(nh_outcome_t *o)
{
  free(o->error_text);
  free(o->error_type);
  free(o->error_stack);
  free(o->handoff_reason);
  free(o->external_job_id);
  free(o->reply);
  nh_outcome_init(o);
}

void nh_task_result_init(nh_task_result_t *r)
{
  memset(r, 0, sizeof *r);
  nh_outcome_init(&r->out);
}

void nh_task_result_clear(nh_task_result_t *r)
{
  nh_outcome_clear(&r->out);
  free(r->error_msg);
  nh_task_result_init(r);
}
