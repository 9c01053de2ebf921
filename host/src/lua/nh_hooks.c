/* Lifecycle hooks (nh_vm.h): nimbus.on(name, fn) in Lua counts the function here
 * (core.hook_add); the dispatcher fires a hook after its outcome committed, and each
 * function runs as a task calling nimbus._hook(name, i, info). */
#include "nh_task.h"
#include "nh_vm_int.h"
#include "core/nh_log.h"
#include "core/nh_metrics.h"
#include "core/nh_util.h"

#include <lauxlib.h>
#include <stdlib.h>
#include <string.h>

#define NH_HOOK_DEADLINE_S 30.0

static const char *const hook_names[NH_HOOK_COUNT] = { "event_failed", "dead_lettered", "session_blocked",
                                                       "session_unblocked", "handoff_overdue" };

static nh_metric_t m_hook_runs = NH_METRIC_DEF(NH_METRIC_COUNTER, "nimbus_hook_runs_total",
  "Lifecycle hook runs (nimbus.on), by hook and result (ok, error, killed)", "hook", "result");

const char *nh_hook_name(nh_hook_t h) { return h < NH_HOOK_COUNT ? hook_names[h] : "?"; }

int nh_hook_find(const char *name)
{
  for (int i = 0; i < NH_HOOK_COUNT; i++)
    if (strcmp(name, hook_names[i]) == 0) return i;
  return -1;
}

int nh_vm_hook_wanted(nh_vm_t *vm, nh_hook_t h) { return h < NH_HOOK_COUNT && vm->hooks[h] > 0; }

size_t nh_vm_memory(nh_vm_t *vm) { return vm->mem; }

typedef struct hook_run {
  nh_hook_t hook;
  char *endpoint;
} hook_run_t;

static void hook_done(nh_task_t *t, nh_task_status_t status, int nres)
{
  (void)nres;
  hook_run_t *r = nh_task_data(t);
  const char *name = nh_hook_name(r->hook);
  nh_log_field_t f[] = { NH_LOG_STR("endpoint", r->endpoint), NH_LOG_STR("hook", name) };
  const char *result = "ok";
  if (status == NH_TASK_ERROR) {
    result = "error";
    nh_log_fields(NH_LOG_ERROR, "lua", f, 2, "hook %s failed (the outcome stands): %s", name,
                  lua_tostring(nh_task_thread(t), -1));
  } else if (status == NH_TASK_KILLED) {
    result = "killed";
    nh_log_fields(NH_LOG_ERROR, "lua", f, 2, "hook %s stopped: %s (the outcome stands)", name,
                  nh_task_kill_name(nh_task_kill(t)));
  } else if (status == NH_TASK_CANCELLED) {
    result = "cancelled";
  }
  nh_metric_add(&m_hook_runs, 1, name, result);
  free(r->endpoint);
  free(r);
}

static void set_int(lua_State *L, const char *k, int64_t v)
{
  lua_pushinteger(L, (lua_Integer)v);
  lua_setfield(L, -2, k);
}

static void push_info(lua_State *L, nh_hook_t h, const nh_hook_info_t *in)
{
  lua_createtable(L, 0, 14);
  nh_lua_set_str(L, "hook", nh_hook_name(h));
  nh_lua_set_str(L, "endpoint", in->endpoint);
  nh_lua_set_str(L, "event_id", in->event_id);
  nh_lua_set_str(L, "session_id", in->session_id);
  nh_lua_set_str(L, "event_type", in->event_type);
  nh_lua_set_str(L, "message_id", in->message_id);
  nh_lua_set_str(L, "status", in->status);
  nh_lua_set_str(L, "error", in->error);
  nh_lua_set_str(L, "error_type", in->error_type);
  nh_lua_set_str(L, "blocked_by", in->blocked_by);
  nh_lua_set_str(L, "detail", in->detail);
  nh_lua_set_str(L, "action", in->action);
  nh_lua_set_str(L, "external_job_id", in->external_job_id);
  if (in->retry_in_ms >= 0) set_int(L, "retry_in_ms", in->retry_in_ms);
  if (in->attempt) set_int(L, "attempt", in->attempt);
  if (in->expected_by) {
    char ts[40];
    nh_time_iso8601(in->expected_by, ts, sizeof ts);
    nh_lua_set_str(L, "expected_by", ts);
  }
  char now[40];
  nh_time_iso8601(nh_time_now_ms(), now, sizeof now);
  nh_lua_set_str(L, "at", now);
}

int nh_vm_hook_fire(nh_vm_t *vm, nh_hook_t h, const nh_hook_info_t *info)
{
  if (!nh_vm_hook_wanted(vm, h) || vm->hook_ref == LUA_NOREF) return 0;
  int n = vm->hooks[h];
  for (int i = 1; i <= n; i++) {
    hook_run_t *r = nh_xcalloc(1, sizeof *r);
    r->hook = h;
    r->endpoint = nh_xstrdup(info->endpoint);
    nh_task_opts_t opts = { .kind = NH_TASK_KIND_HOOK, .deadline_s = NH_HOOK_DEADLINE_S, .on_done = hook_done,
                            .data = r };
    nh_task_t *t = nh_task_new(vm, &opts);
    lua_State *co = nh_task_thread(t);
    lua_rawgeti(co, LUA_REGISTRYINDEX, vm->hook_ref);
    lua_pushstring(co, nh_hook_name(h));
    lua_pushinteger(co, i);
    push_info(co, h, info);
    nh_task_start_later(t, 3);   /* from a loop callback of its own, never inside the pump */
  }
  return n;
}
