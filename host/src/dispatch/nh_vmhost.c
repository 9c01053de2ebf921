/* The VM host: the callbacks the Lua side calls the dispatcher through (nh_vm_host_t),
 * registering endpoints, publishing, settling hand-offs, and the end of a handler task.
 * A task's end comes as what happened to it (nh_task_result_t); what that means for the
 * event, which outcome and which error type, is decided here, not in lua/. */
#include "nh_bridge.h"
#include "nh_dispatch_int.h"
#include "nh_pgcalls.h"
#include "core/nh_log.h"
#include "core/nh_util.h"
#include "store/nh_pg_ops.h"

#include <stdlib.h>
#include <string.h>

static int pending_has(nh_dispatch_t *d, const char *name)
{
  for (nh_endpoint_t *ep = d->pending_eps; ep; ep = ep->next)
    if (strcmp(ep->name, name) == 0) return 1;
  return 0;
}

static int host_register_endpoint(void *data, nh_vm_t *vm, lua_State *L, const char *name, int opts, nh_error_t *err)
{
  nh_dispatch_t *d = data;
  nh_endpoint_t *have = nh_dispatch_find_endpoint(d, name);
  /* A reload re-registers the endpoints of the generation it replaces; anything else
   * with a taken name is a second definition. */
  if (have && !have->retired && (pending_has(d, name) || !d->reloading || have->vm != d->reloading))
    return nh_error_set(err, NH_EUSAGE, "endpoint %s is already defined by another adapter", name);
  nh_endpoint_t *ep = nh_xcalloc(1, sizeof *ep);
  ep->name = nh_xstrdup(name);
  ep->vm = vm;
  if (nh_endpoint_parse(ep, L, opts, err)) {
    nh_endpoint_free(ep);
    return NH_EUSAGE;
  }
  ep->next = d->pending_eps;
  d->pending_eps = ep;
  return NH_OK;
}

void nh_dispatch_log_duplicate(const char *who, const char *message_id, int64_t at)
{
  char when[40];
  nh_time_iso8601(at, when, sizeof when);
  nh_log_info("dispatch", "%s: MessageId %s was already published at %s (within the dedup window of 24 h): "
              "not published again", who, message_id, when);
}

void nh_dispatch_pub_claims_clear(nh_dispatch_t *d)
{
  for (int i = 0; i < d->npub_claims; i++) free(d->pub_claims[i]);
  free(d->pub_claims);
  d->pub_claims = NULL;
  d->npub_claims = 0;
}

/* The claim in the pump's unit (PostgreSQL): the MessageId's last publish is a read of the
 * pass (a miss voids the pass; its empty answer meanwhile is never committed), the claim a
 * write that fails the whole commit when another host claimed it since the read: the
 * outcomes are then applied again, and the next pass reads that claim. A MessageId claimed
 * twice in one pass is a duplicate the second time (the set the pass keeps). 1, 0 or at. */
static int pg_claim(nh_dispatch_t *d, const char *message_id, int64_t now, int64_t *at)
{
  for (int i = 0; i < d->npub_claims; i++)
    if (strcmp(d->pub_claims[i], message_id) == 0) {
      *at = now;
      return 0;
    }
  char key[256];
  snprintf(key, sizeof key, "pub:%.240s", message_id);
  nh_pg_args_t a;
  const PGresult *r = NULL;
  int rc = nh_uow_op_read(d->uow, key, &nh_pg_store_optab, nh_pgargs_published_seen(&a, message_id), &a, &r);
  if (rc < 0) return NH_EFAIL;
  if (rc == 1 && PQntuples(r) > 0 && nh_published_recently(*at = nh_pg_col_i64(r, 0, 0), now)) return 0;
  nh_error_t err = {0};
  if (nh_uow_op(d->uow, &nh_pg_store_optab,
                nh_pgargs_published_claim_or_fail(&a, message_id, now, now - NH_DEDUP_WINDOW_MS), &a, &err))
    return NH_EFAIL;
  d->pub_claims = nh_xrealloc(d->pub_claims, sizeof *d->pub_claims * (size_t)(d->npub_claims + 1));
  d->pub_claims[d->npub_claims++] = nh_xstrdup(message_id);
  return 1;
}

/* A MessageId the publisher chose: 1 if it was published within the dedup window
 * (said in the log), 0 if not, NH_EFAIL. claim: record it in the open transaction.
 * On PostgreSQL the claim goes through the pump's unit (pg_claim); the handler was told
 * by a read of its own (job_pub_seen), or 0 where it could not wait (a coroutine of its
 * own), and a duplicate is dropped when its outcome commits, said in the log. */
int nh_dispatch_pub_dedup(nh_dispatch_t *d, const char *who, const char *message_id, int claim)
{
  int64_t now = nh_time_now_ms(), at = 0;
  if (!d->store && !claim) return 0;
  int rc = !d->store ? pg_claim(d, message_id, now, &at)
           : claim   ? nh_store_published_claim(d->store, message_id, now, now - NH_DEDUP_WINDOW_MS, &at)
                     : nh_store_published_seen(d->store, message_id, now - NH_DEDUP_WINDOW_MS, &at);
  if (rc < 0) return NH_EFAIL;
  int seen = claim ? rc == 0 : rc == 1;
  if (seen) nh_dispatch_log_duplicate(who, message_id, at);
  return seen;
}

/* A handler's publish with a MessageId of its own, on PostgreSQL: the handler waits for
 * the read of the id's last publish, and is told whether it is a duplicate as on sqlite. */
typedef struct job_pub {
  nh_later_t *later;
  nh_job_t *job;               /* alive while its handler's task is (nh_later_thread) */
  nh_pub_t *pub;
} job_pub_t;

static void job_pub_seen(void *data, int64_t at, const nh_error_t *err)
{
  job_pub_t *jp = data;
  lua_State *co = nh_later_thread(jp->later);
  nh_pub_t *p = jp->pub;
  int duplicate = nh_published_recently(at, nh_time_now_ms());
  if (err) {
    nh_later_fail(jp->later, err);
  } else if (!co) {
    nh_later_done(jp->later, 0);
  } else {
    if (duplicate) {
      nh_dispatch_log_duplicate(jp->job->ep->name, p->given_id, at);
    } else {
      nh_queue_insert_tail(&jp->job->pubs, &p->node);
      p = NULL;
    }
    lua_pushstring(co, jp->pub->given_id);
    lua_pushboolean(co, duplicate);
    nh_later_done(jp->later, 2);
  }
  if (p) nh_pub_free(p);
  free(jp);
}

static int host_publish(void *data, void *task_data, const char *type, const char *body, size_t body_len,
                        const char *session, const char *correlation_id, const char *to, const char *given_id,
                        char message_id[37], int *duplicate, nh_later_t *later, nh_error_t *err)
{
  nh_dispatch_t *d = data;
  nh_uuid_v7(message_id);
  nh_job_t *job = task_data;
  if (job) {
    /* Sent only when the handler's outcome commits: a failed handler publishes nothing. */
    nh_pub_t *p = nh_xcalloc(1, sizeof *p);
    p->type = nh_xstrdup(type);
    p->body = nh_xstrndup(body, body_len);
    p->body_len = body_len;
    p->session = nh_xstrdup(session);
    p->correlation_id = nh_xstrdup(correlation_id);
    p->to = nh_xstrdup(to);
    p->given_id = nh_xstrdup(given_id);
    memcpy(p->message_id, message_id, 37);
    /* The claim is made when the outcome commits (a failed handler claims nothing);
     * what the caller is told now is whether the id is already taken. */
    if (given_id && !d->store && later) {
      job_pub_t *jp = nh_xcalloc(1, sizeof *jp);
      *jp = (job_pub_t){ later, job, p };
      if (nh_pgcall_published_at(d->link, given_id, job_pub_seen, jp, err) == NH_OK) return NH_LATER;
      free(jp);
      nh_pub_free(p);
      return err->code;
    }
    if (given_id && (*duplicate = nh_dispatch_pub_dedup(d, job->ep->name, given_id, 0)) != 0) {
      nh_pub_free(p);
      if (*duplicate < 0)
        return nh_error_set(err, NH_EFAIL, "store: %s",
                            d->store ? nh_store_errmsg(d->store) : "cannot read the dedup claims");
      return NH_OK;
    }
    nh_queue_insert_tail(&job->pubs, &p->node);
    return NH_OK;
  }
  nh_msg_t m;
  nh_msg_ids_t ids;
  nh_msg_event(&m, &ids, type, body, body_len, session, correlation_id, given_id ? given_id : message_id);
  if (!d->store) {
    char tp[NH_TRACEPARENT_LEN + 1];
    nh_dispatch_span_root_publish(d, type, to, tp);
    m.traceparent = tp;
    return nh_pgcall_publish(d->link, &m, to, given_id, later, err);
  }
  if (nh_store_begin(d->store)) return nh_error_set(err, NH_EFAIL, "store busy: %s", nh_store_errmsg(d->store));
  if (given_id && (*duplicate = nh_dispatch_pub_dedup(d, "publish", given_id, 1)) != 0) {
    nh_store_rollback(d->store);
    if (*duplicate < 0) return nh_error_set(err, NH_EFAIL, "store: %s", nh_store_errmsg(d->store));
    return NH_OK;
  }
  char tp[NH_TRACEPARENT_LEN + 1];
  nh_dispatch_span_root_publish(d, type, to, tp);
  m.traceparent = tp;
  int copies = 0;
  if (d->tr->vt->send(d->tr, &m, to, &copies, err)) {
    nh_store_rollback(d->store);
    return NH_EFAIL;
  }
  if (nh_store_commit(d->store)) return nh_error_set(err, NH_EFAIL, "store commit failed");
  if (copies == 0) nh_log_warn("dispatch", "published %s but no endpoint subscribes to it", type);
  if (d->started) nh_dispatch_kick(d);
  return NH_OK;
}

static void failed(nh_outcome_t *o, char *text, const char *type)
{
  o->kind = NH_OUT_FAILED;
  o->error_text = text;
  o->error_type = nh_xstrdup(type);
}

/* What the end of a handler task means for its event (docs/design.md section 6): the
 * outcome the runner returned, or a failure whose error type says how the task died. */
static void task_outcome(nh_task_result_t *r, nh_outcome_t *o)
{
  char buf[160];
  switch (r->status) {
  case NH_TASK_OK:
    switch (r->returned) {
    case NH_RUNNER_OUTCOME:
      *o = r->out;
      nh_outcome_init(&r->out);
      return;
    case NH_RUNNER_NO_OUTCOME:
      failed(o, nh_xstrdup("internal error: the nimbus runner returned no outcome"), "HostError");
      return;
    case NH_RUNNER_UNKNOWN_STATUS:
      failed(o, nh_xstrdup("internal error: the nimbus runner returned no known status"), "HostError");
      return;
    }
    break;
  case NH_TASK_ERROR: {
    /* An error the runner's xpcall did not catch (out of memory, or the runner itself):
     * its first line is the text, the whole traceback the stack. */
    const char *tb = r->error_msg;
    const char *nl = tb ? strchr(tb, '\n') : NULL;
    failed(o, tb ? nh_xstrndup(tb, nl ? (size_t)(nl - tb) : strlen(tb)) : nh_xstrdup("(unknown error)"),
           r->error == NH_TASK_ERR_MEMORY ? "MemoryLimit" : "LuaError");
    o->error_stack = nh_xstrdup(tb);
    return;
  }
  case NH_TASK_KILLED:
    switch (r->kill) {
    case NH_KILL_CPU_BUDGET:
      snprintf(buf, sizeof buf, "CPU budget exceeded: the handler ran %.3g s without yielding", r->cpu_budget_s);
      failed(o, nh_xstrdup(buf), "CpuBudgetExceeded");
      return;
    case NH_KILL_DEADLINE:
    case NH_KILL_NONE:
      break;
    }
    snprintf(buf, sizeof buf, "deadline exceeded: the handler ran longer than %.3g s", r->deadline_s);
    failed(o, nh_xstrdup(buf), "DeadlineExceeded");
    return;
  case NH_TASK_CANCELLED:
    break;
  }
  o->kind = NH_OUT_CANCELLED;   /* the host ended it (nh_renew.c, a stop, a closed VM): nh_dispatch_apply decides */
}

static void host_task_done(void *data, void *task_data, nh_task_result_t *r)
{
  nh_job_t *job = task_data;
  nh_outcome_clear(&job->out);
  task_outcome(r, &job->out);
  nh_task_result_clear(r);
  job->task = NULL;
  nh_dispatch_job_finished(data, job);
}

static int host_pending_handoffs(void *data, lua_State *L, const char *endpoint, nh_later_t *later, nh_error_t *err)
{
  nh_dispatch_t *d = data;
  if (!d->store) return nh_pgcall_pending_handoffs(d->link, endpoint, later, err);
  return nh_bridge_push_handoffs(L, d->store, endpoint, err);
}

static int host_handoff(void *data, const nh_handoff_req_t *req, nh_later_t *later, nh_error_t *err)
{
  nh_dispatch_t *d = data;
  if (!d->store) return nh_pgcall_handoff(d->link, req, later, err);
  int rc = nh_bridge_handoff(d->store, d->tr, req, err);
  if (rc == NH_OK && d->started) nh_dispatch_kick(d);
  return rc;
}

const nh_vm_host_t *nh_dispatch_vm_host(nh_dispatch_t *d, nh_vm_host_t *h)
{
  nh_vm_host_t host = { d, host_register_endpoint, host_publish, host_task_done, host_pending_handoffs,
                        host_handoff, nh_dispatch_request, nh_dispatch_request_cancel,
                        nh_dispatch_set_retention };
  *h = host;
  return h;
}
