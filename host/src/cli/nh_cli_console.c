/* The admin listener's options for `run` and `console`, and `nimbus-host console --store
 * PATH`: the operator console and API for a store without adapters (an operator's box;
 * with a shared store, one console for every host). */
#include "nh_cli.h"
#include "admin/nh_admin.h"
#include "core/nh_log.h"
#include "core/nh_runtime.h"
#include "store/nh_pg.h"
#include "store/nh_pg_ops.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int nh_cli_admin_addr(const nh_args_t *a, const char *cmd, nh_admin_addr_t *out)
{
  memset(out, 0, sizeof *out);
  /* --admin, else $NIMBUS_ADMIN (a test suite runs many hosts at once: a free port each),
   * else the default */
  const char *addr = nh_args_get(a, "--admin");
  if (!addr) addr = getenv("NIMBUS_ADMIN");
  if (!addr || !*addr) addr = NH_ADMIN_DEFAULT;
  nh_error_t err = {0};
  if (nh_admin_parse_addr(addr, out->host, sizeof out->host, &out->opts.port, &out->off, &err))
    return nh_usage_error(cmd, "%s", err.msg);
  out->opts.host = out->host;
  out->opts.token_file = nh_args_get(a, "--admin-token-file");
  if (out->off && out->opts.token_file) return nh_usage_error(cmd, "--admin-token-file without a listener (--admin off)");
  if (out->opts.token_file && access(out->opts.token_file, R_OK) != 0)
    return nh_usage_error(cmd, "--admin-token-file %s: no such file or not readable", out->opts.token_file);
  return NH_EXIT_OK;
}

typedef struct console {
  uv_signal_t sigint, sigterm;
  nh_admin_t *admin;
} console_t;

static void on_stop(uv_signal_t *s, int signum)
{
  console_t *c = s->data;
  nh_log_info("console", "%s received: stopping", signum == SIGINT ? "SIGINT" : "SIGTERM");
  nh_admin_close(c->admin);
  c->admin = NULL;
  uv_close((uv_handle_t *)&c->sigint, NULL);
  uv_close((uv_handle_t *)&c->sigterm, NULL);
}

int nh_cmd_console(int argc, char **argv)
{
  static const nh_opt_spec_t specs[] = { { "--admin", 1 }, { "--admin-token-file", 1 }, { "--log-format", 1 },
                                         { NULL, 0 } };
  nh_args_t a;
  int rc = nh_args_parse(&a, "console", argc, argv, 2, specs);
  if (rc) return rc;
  if (a.npos) return nh_usage_error("console", "unexpected %s: console takes only options (--store PATH --admin ADDR)",
                                    a.pos[0]);
  const char *fmt = nh_args_get(&a, "--log-format");
  if (fmt && strcmp(fmt, "json") != 0 && strcmp(fmt, "text") != 0)
    return nh_usage_error("console", "--log-format must be text or json, not %s", fmt);
  nh_log_set_json(fmt && strcmp(fmt, "json") == 0);
  nh_admin_addr_t addr;
  if ((rc = nh_cli_admin_addr(&a, "console", &addr))) return rc;
  if (addr.off) return nh_usage_error("console", "--admin off leaves the console nothing to do");
  addr.opts.console_only = 1;
  nh_error_t err = {0};
  nh_store_t *store = NULL;
  int pg = nh_pg_url_is(a.store);
  if (pg) {
    /* the hosts' PostgreSQL store: checked (reachable, its schema known, migrated if no host
     * has started on it yet) on one connection, then served as a host serves it, its reads
     * and requests on the thread pool's own connections */
    nh_pg_db_t *db = nh_cli_pg_open("console", a.store, &rc);
    if (!db) return rc;
    nh_pg_db_free(db);
    addr.opts.pg_url = a.store;
  } else if (nh_store_open(&store, a.store, 0, &err)) {
    fprintf(stderr, "nimbus-host console: %s (give the store of the hosts with --store PATH)\n", err.msg);
    return err.code == NH_EUSAGE ? NH_EXIT_USAGE : NH_EXIT_FAIL;
  }
  nh_runtime_t rt;
  nh_runtime_init(&rt);
  console_t c = { 0 };
  c.admin = nh_admin_start(&rt.loop, store, &addr.opts, &err);
  if (!c.admin) {
    fprintf(stderr, "nimbus-host console: %s\n", err.msg);
    nh_runtime_close(&rt);
    nh_store_close(store);
    return NH_EXIT_USAGE;
  }
  nh_admin_set_ready(c.admin, NULL, NULL);
  uv_signal_init(&rt.loop, &c.sigint);
  uv_signal_init(&rt.loop, &c.sigterm);
  c.sigint.data = c.sigterm.data = &c;
  uv_signal_start(&c.sigint, on_stop, SIGINT);
  uv_signal_start(&c.sigterm, on_stop, SIGTERM);
  char *shown = pg ? nh_pg_url_display(a.store) : NULL;
  nh_log_info("console", "serving the store %s (no adapters run here; actions wait for the hosts that own the "
              "endpoints)", shown ? shown : a.store);
  free(shown);
  nh_runtime_run(&rt, UV_RUN_DEFAULT);
  nh_runtime_close_parts(&rt);
  uv_run(&rt.loop, UV_RUN_DEFAULT);
  rc = nh_runtime_close(&rt) ? NH_EXIT_FAIL : NH_EXIT_OK;
  if (rc) nh_log_warn("console", "event loop closed with handles still open");
  nh_store_close(store);
  return rc;
}
