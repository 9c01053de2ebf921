/* Endpoint options: parsed from the adapter's Lua table, strictly (an unknown key is
 * an error, because a misspelt `max_retries` silently meaning "no retries" is worse). */
#include "nh_dispatch_int.h"
#include "core/nh_util.h"

#include <lauxlib.h>
#include <stdlib.h>
#include <string.h>

static int check_keys(lua_State *L, int t, const char *where, const char *const *allowed, nh_error_t *err)
{
  lua_pushnil(L);
  while (lua_next(L, t)) {
    lua_pop(L, 1);
    const char *k = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
    int ok = 0;
    for (int i = 0; k && allowed[i]; i++) ok |= strcmp(k, allowed[i]) == 0;
    if (!ok) {
      nh_error_set(err, NH_EUSAGE, "unknown option %s%s%s (allowed:", where, *where ? "." : "",
                   k ? k : "(non-string key)");
      size_t len = strlen(err->msg);
      for (int i = 0; allowed[i] && len < sizeof err->msg - 40; i++)
        len += (size_t)snprintf(err->msg + len, sizeof err->msg - len, " %s", allowed[i]);
      snprintf(err->msg + len, sizeof err->msg - len, ")");
      lua_pop(L, 1);
      return NH_EUSAGE;
    }
  }
  return NH_OK;
}

/* Reads t[key] as a number of seconds into *ms; absent keeps the default. */
static int get_seconds(lua_State *L, int t, const char *key, int64_t *ms, double min, nh_error_t *err)
{
  lua_getfield(L, t, key);
  int rc = NH_OK;
  if (!lua_isnil(L, -1)) {
    if (!lua_isnumber(L, -1) || lua_tonumber(L, -1) < min)
      rc = nh_error_set(err, NH_EUSAGE, "%s must be a number of seconds >= %g", key, min);
    else
      *ms = (int64_t)(lua_tonumber(L, -1) * 1000.0);
  }
  lua_pop(L, 1);
  return rc;
}

static int get_int(lua_State *L, int t, const char *key, int *out, int min, int max, nh_error_t *err)
{
  lua_getfield(L, t, key);
  int rc = NH_OK;
  if (!lua_isnil(L, -1)) {
    if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) < min || lua_tointeger(L, -1) > max)
      rc = nh_error_set(err, NH_EUSAGE, "%s must be an integer from %d to %d", key, min, max);
    else
      *out = (int)lua_tointeger(L, -1);
  }
  lua_pop(L, 1);
  return rc;
}

static int get_choice(lua_State *L, int t, const char *key, const char *const *names, int *out, nh_error_t *err)
{
  lua_getfield(L, t, key);
  int rc = NH_OK;
  if (!lua_isnil(L, -1)) {
    const char *v = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
    int found = -1;
    for (int i = 0; v && names[i]; i++)
      if (strcmp(v, names[i]) == 0) found = i;
    if (found < 0) rc = nh_error_set(err, NH_EUSAGE, "%s must be one of %s, %s, %s", key, names[0], names[1], names[2]);
    else *out = found;
  }
  lua_pop(L, 1);
  return rc;
}

static const char *const strategy_names[] = { "fixed", "linear", "exponential", NULL };
static const char *const jitter_names[] = { "none", "full", "bounded", NULL };

/* Fields shared by the default policy, per-type policies and rules. */
static int parse_policy(lua_State *L, int t, nh_retry_policy_t *p, nh_error_t *err)
{
  int s = (int)p->strategy, j = (int)p->jitter;
  if (get_int(L, t, "max_retries", &p->max_retries, 0, 1000, err) ||
      get_choice(L, t, "strategy", strategy_names, &s, err) || get_seconds(L, t, "base", &p->base_ms, 0, err) ||
      get_seconds(L, t, "max_delay", &p->max_delay_ms, 0, err) || get_choice(L, t, "jitter", jitter_names, &j, err))
    return NH_EUSAGE;
  p->strategy = (nh_retry_strategy_t)s;
  p->jitter = (nh_retry_jitter_t)j;
  lua_getfield(L, t, "jitter_factor");
  if (lua_isnumber(L, -1)) p->jitter_factor = lua_tonumber(L, -1);
  lua_pop(L, 1);
  return NH_OK;
}

#define POLICY_KEYS "max_retries", "strategy", "base", "max_delay", "jitter", "jitter_factor"

static int parse_retry(nh_endpoint_t *ep, lua_State *L, int t, nh_error_t *err)
{
  static const char *const keys[] = { POLICY_KEYS, "rules", "types", NULL };
  static const char *const rule_keys[] = { POLICY_KEYS, "match", "types", NULL };
  static const char *const type_keys[] = { POLICY_KEYS, NULL };
  if (check_keys(L, t, "retry", keys, err)) return NH_EUSAGE;
  nh_retry_config_t *c = &ep->retry;
  nh_retry_policy_init(&c->def);
  if (parse_policy(L, t, &c->def, err)) return NH_EUSAGE;
  lua_getfield(L, t, "max_retries");
  c->has_default = !lua_isnil(L, -1);
  lua_pop(L, 1);

  lua_getfield(L, t, "types");
  if (!lua_isnil(L, -1)) {
    if (!lua_istable(L, -1)) return nh_error_set(err, NH_EUSAGE, "retry.types must map event types to policies");
    int tt = lua_gettop(L);
    lua_pushnil(L);
    while (lua_next(L, tt)) {
      if (lua_type(L, -2) != LUA_TSTRING || !lua_istable(L, -1))
        return nh_error_set(err, NH_EUSAGE, "retry.types entries must be EventType = { max_retries = ... }");
      if (check_keys(L, lua_gettop(L), "retry.types", type_keys, err)) return NH_EUSAGE;
      c->per_type = nh_xrealloc(c->per_type, sizeof *c->per_type * (size_t)(c->ntypes + 1));
      nh_retry_type_policy_t *tp = &c->per_type[c->ntypes++];
      tp->event_type = nh_xstrdup(lua_tostring(L, -2));
      tp->policy = c->def;   /* unspecified fields inherit the endpoint default */
      if (parse_policy(L, lua_gettop(L), &tp->policy, err)) return NH_EUSAGE;
      lua_pop(L, 1);
    }
  }
  lua_pop(L, 1);

  lua_getfield(L, t, "rules");
  if (!lua_isnil(L, -1)) {
    if (!lua_istable(L, -1)) return nh_error_set(err, NH_EUSAGE, "retry.rules must be a list of { match = ... }");
    int rt = lua_gettop(L);
    int n = (int)luaL_len(L, rt);
    for (int i = 1; i <= n; i++) {
      lua_rawgeti(L, rt, i);
      int r = lua_gettop(L);
      if (!lua_istable(L, r)) return nh_error_set(err, NH_EUSAGE, "retry.rules[%d] must be a table", i);
      if (check_keys(L, r, "retry.rules", rule_keys, err)) return NH_EUSAGE;
      lua_getfield(L, r, "match");
      if (lua_type(L, -1) != LUA_TSTRING)
        return nh_error_set(err, NH_EUSAGE, "retry.rules[%d].match must be a string", i);
      c->rules = nh_xrealloc(c->rules, sizeof *c->rules * (size_t)(c->nrules + 1));
      nh_retry_rule_t *rule = &c->rules[c->nrules++];
      memset(rule, 0, sizeof *rule);
      rule->match = nh_xstrdup(lua_tostring(L, -1));
      lua_pop(L, 1);
      rule->policy = c->def;
      if (parse_policy(L, r, &rule->policy, err)) return NH_EUSAGE;
      lua_getfield(L, r, "types");
      if (lua_istable(L, -1)) {
        int m = (int)luaL_len(L, -1);
        rule->types = nh_xcalloc((size_t)m + 1, sizeof *rule->types);
        for (int k = 1; k <= m; k++) {
          lua_rawgeti(L, -1, k);
          if (lua_type(L, -1) == LUA_TSTRING) rule->types[rule->ntypes++] = nh_xstrdup(lua_tostring(L, -1));
          lua_pop(L, 1);
        }
      }
      lua_pop(L, 2);
    }
  }
  lua_pop(L, 1);
  return NH_OK;
}

/* transient = { max_attempts = 20, base = 1, max_delay = 60 }: exponential with bounded
 * jitter; attempts counts the first run too. */
static int parse_transient(nh_endpoint_t *ep, lua_State *L, int opts, nh_error_t *err)
{
  static const char *const keys[] = { "max_attempts", "base", "max_delay", NULL };
  nh_retry_policy_t *p = &ep->transient;
  nh_retry_policy_init(p);
  p->strategy = NH_RETRY_EXPONENTIAL;
  p->jitter = NH_JITTER_BOUNDED;
  p->max_delay_ms = 60000;
  int attempts = 20;
  lua_getfield(L, opts, "transient");
  int rc = NH_OK, t = lua_gettop(L);
  if (!lua_isnil(L, t)) {
    if (!lua_istable(L, t))
      rc = nh_error_set(err, NH_EUSAGE, "transient must be a table { max_attempts, base, max_delay }");
    else if (check_keys(L, t, "transient", keys, err) || get_int(L, t, "max_attempts", &attempts, 1, 100000, err) ||
             get_seconds(L, t, "base", &p->base_ms, 0, err) || get_seconds(L, t, "max_delay", &p->max_delay_ms, 0, err))
      rc = NH_EUSAGE;
  }
  p->max_retries = attempts - 1;
  lua_pop(L, 1);
  return rc;
}

int nh_endpoint_parse(nh_endpoint_t *ep, lua_State *L, int opts, nh_error_t *err)
{
  static const char *const keys[] = { "concurrency", "lock", "retry", "transient", "inbox", "timeout", "cpu_budget",
                                      "partitions", "sessions", NULL };
  static const char *const lock_keys[] = { "duration", "renew_max", NULL };
  opts = lua_absindex(L, opts);
  ep->concurrency = 100;
  ep->lock_ms = 30000;
  ep->renew_max_ms = 300000;
  if (check_keys(L, opts, "", keys, err) || parse_transient(ep, L, opts, err)) return NH_EUSAGE;
  if (get_int(L, opts, "concurrency", &ep->concurrency, 1, 100000, err)) return NH_EUSAGE;
  ep->partitions = 1;
  if (get_int(L, opts, "partitions", &ep->partitions, 1, 256, err)) return NH_EUSAGE;
  if (ep->partitions & (ep->partitions - 1))   /* a session's partition is the low bits of its hash */
    return nh_error_set(err, NH_EUSAGE, "partitions must be a power of two from 1 to 256 (1, 2, 4, ... 256), not %d",
                        ep->partitions);
  ep->sessions = 0;
  if (get_int(L, opts, "sessions", &ep->sessions, 0, 256, err)) return NH_EUSAGE;
  int64_t timeout_ms = 60000, cpu_ms = 1000;
  if (get_seconds(L, opts, "timeout", &timeout_ms, 0.001, err) || get_seconds(L, opts, "cpu_budget", &cpu_ms, 0.001, err))
    return NH_EUSAGE;
  ep->timeout_s = (double)timeout_ms / 1000.0;
  ep->cpu_budget_s = (double)cpu_ms / 1000.0;
  lua_getfield(L, opts, "inbox");
  ep->inbox = lua_toboolean(L, -1);
  lua_pop(L, 1);
  lua_getfield(L, opts, "lock");
  if (!lua_isnil(L, -1)) {
    int lt = lua_gettop(L);
    if (!lua_istable(L, lt)) return nh_error_set(err, NH_EUSAGE, "lock must be a table { duration, renew_max }");
    if (check_keys(L, lt, "lock", lock_keys, err) || get_seconds(L, lt, "duration", &ep->lock_ms, 0.1, err) ||
        get_seconds(L, lt, "renew_max", &ep->renew_max_ms, 0, err))
      return NH_EUSAGE;
  }
  lua_pop(L, 1);
  lua_getfield(L, opts, "retry");
  int rc = NH_OK;
  if (!lua_isnil(L, -1)) {
    if (!lua_istable(L, -1)) rc = nh_error_set(err, NH_EUSAGE, "retry must be a table");
    else rc = parse_retry(ep, L, lua_gettop(L), err);
  }
  lua_settop(L, opts);
  return rc;
}

void nh_endpoint_free(nh_endpoint_t *ep)
{
  free(ep->name);
  free(ep->due_cursor);
  free(ep->pass_cursor);
  nh_retry_config_free(&ep->retry);
  for (int i = 0; i < ep->ntypes; i++) free(ep->types[i]);
  free(ep->types);
  free(ep->commands);
  free(ep);
}
