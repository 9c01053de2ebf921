/* The event filters shared by `events`, `failures` and the bulk operator commands
 * (`resubmit --all`, `skip --all`): parsed and checked against the store once, here, so
 * every command refuses the same bad input the same way. */
#include "nh_cli.h"
#include "core/nh_failgroup.h"
#include "core/nh_util.h"
#include "store/nh_pg_ops.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct known {
  const char *want;
  int found, n;
  char list[512];
};

static int collect_endpoint(void *data, const char *ep)
{
  struct known *k = data;
  if (strcmp(ep, k->want) == 0) k->found = 1;
  size_t len = strlen(k->list);
  if (len < sizeof k->list - 64)
    snprintf(k->list + len, sizeof k->list - len, "%s%s", k->n++ ? ", " : "", ep);
  return 0;
}

static int unknown_endpoint(const char *cmd, const nh_event_filter_t *f, const struct known *k)
{
  if (k->found) return NH_EXIT_OK;
  if (k->n) return nh_usage_error(cmd, "unknown --endpoint %s (this store has events of %s)", f->endpoint, k->list);
  return nh_usage_error(cmd, "unknown --endpoint %s (this store has no events yet)", f->endpoint);
}

static int parse_time(const char *cmd, const char *opt, const char *v, int64_t now, int64_t *out)
{
  if (!v) return NH_EXIT_OK;
  int64_t t = nh_time_parse_ms(v, now);
  if (t < 0)
    return nh_usage_error(cmd, "%s %s is not a time: give ISO-8601 UTC (2026-12-03, 2026-12-03T06:00:00Z) or an "
                               "age such as 30m, 2h or 7d", opt, v);
  *out = t;
  return NH_EXIT_OK;
}

/* The store's names the filters are checked against, on either store: the endpoints with
 * events (each to cb), and the endpoint of a failure group (1, 0: none, NH_EFAIL). */
typedef struct names {
  int (*endpoints)(void *ctx, int (*cb)(void *, const char *), void *data);
  int (*group_endpoint)(void *ctx, const char *group, char *endpoint, size_t len);
  const char *(*errmsg)(void *ctx);
  void *ctx;
} names_t;

static int parse(const nh_args_t *a, const char *cmd, const names_t *names, nh_event_filter_t *f)
{
  memset(f, 0, sizeof *f);
  f->endpoint = nh_args_get(a, "--endpoint");
  f->session = nh_args_get(a, "--session");
  f->type = nh_args_get(a, "--type");
  f->error = nh_args_get(a, "--error");
  f->group = nh_args_get(a, "--group");
  const char *status = nh_args_get(a, "--status");
  if (status && !(f->status = nh_store_status_canon(status)))
    return nh_usage_error(cmd, "unknown --status %s (one of completed, failed, pending, deferred, deadlettered, "
                               "unsupported, skipped%s)", status,
                          strcmp(cmd, "events") == 0 ? "; queued and running list unfinished work" : "");
  int64_t now = nh_time_now_ms();
  int rc = parse_time(cmd, "--since", nh_args_get(a, "--since"), now, &f->since_ms);
  if (!rc) rc = parse_time(cmd, "--before", nh_args_get(a, "--before"), now, &f->before_ms);
  if (rc) return rc;
  if (f->since_ms && f->before_ms && f->since_ms >= f->before_ms)
    return nh_usage_error(cmd, "--since is not before --before: nothing can match");
  const char *empty[] = { "--endpoint", "--session", "--type", "--error", "--group" };
  for (size_t i = 0; i < sizeof empty / sizeof empty[0]; i++) {
    const char *v = nh_args_get(a, empty[i]);
    if (v && !*v) return nh_usage_error(cmd, "%s needs a value", empty[i]);
  }
  if (!names) return NH_EXIT_OK;
  if (f->endpoint) {
    struct known k = { .want = f->endpoint };
    if (names->endpoints(names->ctx, collect_endpoint, &k) < 0) {
      fprintf(stderr, "nimbus-host %s: store: %s\n", cmd, names->errmsg(names->ctx));
      return NH_EXIT_FAIL;
    }
    if ((rc = unknown_endpoint(cmd, f, &k))) return rc;
  }
  if (f->group) {
    size_t n = strspn(f->group, "0123456789abcdef");
    if (n != NH_FAILGROUP_ID_LEN || f->group[n])
      return nh_usage_error(cmd, "--group %s is not a failure group id: 12 hex digits, as nimbus-host failures lists "
                                 "them", f->group);
    /* A group is one endpoint's (its id hashes the endpoint in): with the endpoint too,
     * the group's index gives a bulk batch its rows in order, nothing sorted. */
    static char group_ep[256];
    int g = names->group_endpoint(names->ctx, f->group, group_ep, sizeof group_ep);
    if (g == 1 && !f->endpoint) f->endpoint = group_ep;
    if (g < 0) {
      fprintf(stderr, "nimbus-host %s: store: %s\n", cmd, names->errmsg(names->ctx));
      return NH_EXIT_FAIL;
    }
    /* not an error: a group that was resolved a moment ago is empty, and a script that
     * runs the same command again must not fail for it */
    if (g == 0)
      fprintf(stderr, "note: no unresolved event is in failure group %s (resolved already, or mistyped: see "
                      "nimbus-host failures)\n", f->group);
  }
  return NH_EXIT_OK;
}

/* ---- sqlite */

static int sqlite_endpoints(void *ctx, int (*cb)(void *, const char *), void *data)
{
  return nh_store_endpoints(ctx, cb, data);
}

static int sqlite_group_endpoint(void *ctx, const char *group, char *endpoint, size_t len)
{
  return nh_store_failgroup_endpoint(ctx, group, endpoint, len);
}

static const char *sqlite_errmsg(void *ctx) { return nh_store_errmsg(ctx); }

int nh_cli_filter_parse(const nh_args_t *a, const char *cmd, nh_store_t *s, nh_event_filter_t *f)
{
  names_t names = { sqlite_endpoints, sqlite_group_endpoint, sqlite_errmsg, s };
  return parse(a, cmd, s ? &names : NULL, f);
}

/* ---- PostgreSQL */

typedef struct pg_names {
  nh_pg_db_t *db;
  nh_error_t err;
} pg_names_t;

/* The endpoints that have events, in order (nh_pgs_endpoints: one index probe each). */
static int pg_endpoints(void *ctx, int (*cb)(void *, const char *), void *data)
{
  pg_names_t *p = ctx;
  int n = nh_pgs_endpoints(p->db, cb, data);
  if (n < 0) p->err = *nh_pg_db_error(p->db);
  return n;
}

static int pg_group_endpoint(void *ctx, const char *group, char *endpoint, size_t len)
{
  pg_names_t *p = ctx;
  return nh_pgs_failgroup_endpoint(p->db, group, endpoint, len, &p->err);
}

static const char *pg_errmsg(void *ctx) { return ((pg_names_t *)ctx)->err.msg; }

int nh_cli_filter_parse_pg(const nh_args_t *a, const char *cmd, struct nh_pg_db *db, nh_event_filter_t *f)
{
  pg_names_t p = { .db = db };
  names_t names = { pg_endpoints, pg_group_endpoint, pg_errmsg, &p };
  return parse(a, cmd, &names, f);
}

/* Writes the filters given as "--endpoint E --status S ..." for messages and keys. */
void nh_cli_filter_describe(const nh_event_filter_t *f, const nh_args_t *a, char *out, size_t len)
{
  static const char *const opts[] = { "--endpoint", "--status", "--type", "--session", "--error", "--group",
                                      "--since", "--before", NULL };
  size_t n = 0;
  out[0] = '\0';
  for (int i = 0; opts[i] && n < len; i++) {
    const char *v = nh_args_get(a, opts[i]);
    if (i == 1) v = f->status;   /* canonical spelling */
    if (v) n += (size_t)snprintf(out + n, len - n, "%s%s %s", n ? " " : "", opts[i], v);
  }
}

