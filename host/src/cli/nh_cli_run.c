/* `nimbus-host run ADAPTER.lua...`: owns the loop for the host's lifetime. */
#include "nh_cli.h"
#include "core/nh_log.h"
#include "core/nh_metrics.h"
#include "admin/nh_admin.h"
#include "core/nh_runtime.h"
#include "core/nh_util.h"
#include "dispatch/nh_dispatch.h"
#include "lua/nh_vm.h"
#include "net/nh_otlp.h"
#include "store/nh_pg.h"
#include "store/nh_pg_link.h"
#include "store/nh_store.h"
#include "transport/nh_amqp.h"
#include "transport/nh_embedded.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#define NH_DRAIN_MS 10000

typedef struct host {
  uv_loop_t *loop;
  nh_dispatch_t *d;
  nh_transport_t *tr;
  int amqp;
  uv_signal_t sigint, sigterm, sighup;
  int stopping, stopped, signals;
  int status;                    /* exit status */
  const char *store;
  char desc[2048];
  int no_reload;
  nh_admin_t *admin;             /* the operator API, when --admin asked for it */
  nh_pg_link_t *link;            /* a PostgreSQL store's connection on the loop */
  char *shown;                   /* its URL, password masked */
} host_t;

static void close_signals(host_t *h)
{
  if (!h->signals) return;
  h->signals = 0;
  uv_close((uv_handle_t *)&h->sigint, NULL);
  uv_close((uv_handle_t *)&h->sigterm, NULL);
  uv_close((uv_handle_t *)&h->sighup, NULL);
}

static void on_stopped(void *data)
{
  host_t *h = data;
  h->stopped = 1;
  /* The signal handles stay open, unreferenced, until the loop is done: closed now, a stop
   * signal still on its way (`timeout` sends one to the host and one to its process group)
   * would find the default action and kill the host before it says "stopped". */
  if (h->signals) {
    uv_unref((uv_handle_t *)&h->sigint);
    uv_unref((uv_handle_t *)&h->sigterm);
    uv_unref((uv_handle_t *)&h->sighup);
  }
  nh_admin_stop(h->admin);   /* a bulk run still stepping would keep the loop running */
  /* the broker connection outlives the drain: the last settlements go out first */
  if (h->amqp) nh_amqp_stop(h->tr, NULL, NULL);
  /* so does the store's: the dispatcher has nothing out on it once stopped (its unit is
   * freed at close, after the loop ends, and needs no link then) */
  if (h->link) nh_pg_link_close(h->link, NULL, NULL);
  h->link = NULL;
}

static void log_ready(host_t *h, const char *transport)
{
  nh_log_info("host", "ready: store %s, transport %s, endpoints: %s%s", h->store, transport, h->desc,
              h->no_reload ? "" : " (reloading on change)");
}

/* AMQP: "ready" once connected with the topology declared; a fatal error (bad
 * credentials, a missing vhost, TLS verification) stops the host with status 1. */
static void on_amqp_status(void *data, nh_amqp_status_t st, const char *msg)
{
  host_t *h = data;
  if (st == NH_AMQP_READY) {
    log_ready(h, msg);
    return;
  }
  nh_log_error("host", "cannot use the AMQP transport: %s; stopping", msg);
  fprintf(stderr, "nimbus-host: AMQP transport: %s\n", msg);
  h->status = NH_EXIT_FAIL;
  if (!h->stopping) {
    h->stopping = 1;
    nh_dispatch_stop(h->d, NH_DRAIN_MS, on_stopped, h);
  }
}

/* The PostgreSQL link gave up (the store's schema is another version's): nothing can be
 * recorded any more, so the host stops, as with a fatal broker error. */
static void on_link_state(void *data, nh_pg_link_state_t st, const nh_error_t *err)
{
  host_t *h = data;
  if (st != NH_PG_LINK_FAILED) return;
  nh_log_error("host", "cannot use the PostgreSQL store: %s; stopping", err ? err->msg : "?");
  fprintf(stderr, "nimbus-host: store %s: %s\n", h->shown, err ? err->msg : "?");
  h->status = NH_EXIT_FAIL;
  if (!h->stopping) {
    h->stopping = 1;
    nh_dispatch_stop(h->d, NH_DRAIN_MS, on_stopped, h);
  }
}

/* /readyz: not while stopping, nor while the store or the transport cannot be used. */
static int host_ready(void *data, char *why, size_t len)
{
  host_t *h = data;
  if (h->stopping) {
    snprintf(why, len, "stopping");
    return 0;
  }
  return nh_dispatch_ready(h->d, why, len);
}

static void on_signal(uv_signal_t *s, int signum)
{
  host_t *h = s->data;
  if (h->stopped) return;   /* the dispatcher is done: only closing is left */
  if (signum == SIGHUP) {
    nh_log_info("host", "SIGHUP received: reloading the adapters");
    nh_dispatch_request_reload(h->d);
    return;
  }
  if (h->stopping) {
    nh_log_warn("host", "second stop signal: cancelling running tasks now");
    nh_dispatch_stop(h->d, 0, on_stopped, h);
    return;
  }
  h->stopping = 1;
  nh_log_info("host", "%s received: finishing running handlers (up to %d s), then stopping",
              signum == SIGINT ? "SIGINT" : "SIGTERM", NH_DRAIN_MS / 1000);
  nh_dispatch_stop(h->d, NH_DRAIN_MS, on_stopped, h);
}

static void owner_id(char *buf, size_t len)
{
  char hostn[128] = "localhost", uuid[37];
  gethostname(hostn, sizeof hostn - 1);
  nh_uuid_v4(uuid);
  snprintf(buf, len, "%s:%ld:%.8s", hostn, (long)getpid(), uuid);
}

/* --otlp: the exporter lives as long as the loop runs handlers; service.instance.id is
 * the host's owner id (the one the `hosts` table and the console show). */
static nh_otlp_t *start_otlp(uv_loop_t *loop, const char *url, const char *owner, nh_error_t *err)
{
  nh_otlp_attr_t res[] = { { "service.instance.id", owner }, { "service.version", NH_VERSION } };
  nh_otlp_opts_t o = { .url = url, .service_name = "nimbus-host", .resource_attrs = res, .nresource_attrs = 2 };
  nh_otlp_t *x = nh_otlp_start(loop, &o, err);
  if (x) nh_log_info("host", "exporting trace spans to %s (OTLP/HTTP JSON)", url);
  return x;
}

static void otlp_stopped(void *data) { *(int *)data = 1; }

/* Sends the last spans (within 2 s) while the HTTP client is still up: the handlers
 * have ended, so nothing adds spans after this. */
static void stop_otlp(nh_runtime_t *rt)
{
  if (!rt->otlp) return;
  int stopped = 0;
  nh_otlp_t *x = rt->otlp;
  rt->otlp = NULL;
  nh_otlp_stop(x, otlp_stopped, &stopped);
  while (!stopped && uv_run(&rt->loop, UV_RUN_ONCE)) {}
}

int nh_cmd_run(int argc, char **argv, int first)
{
  static const nh_opt_spec_t specs[] = {
    { "--transport", 1 }, { "--admin", 1 }, { "--log-format", 1 }, { "--no-reload", 0 }, { "--log-level", 1 },
    { "--retention", 1 }, { "--admin-token-file", 1 }, { "--metrics", 1 }, { "--otlp", 1 }, { NULL, 0 },
  };
  nh_args_t a;
  int rc = nh_args_parse(&a, "run", argc, argv, first, specs);
  if (rc) return rc;
  if (a.npos == 0) return nh_usage_error("run", "no adapter file given: nimbus-host ADAPTER.lua");
  const char *fmt = nh_args_get(&a, "--log-format");
  if (fmt && strcmp(fmt, "json") != 0 && strcmp(fmt, "text") != 0)
    return nh_usage_error("run", "--log-format must be text or json, not %s", fmt);
  nh_log_set_json(fmt && strcmp(fmt, "json") == 0);
  const char *lvl = nh_args_get(&a, "--log-level");
  if (lvl) {
    if (strcmp(lvl, "debug") == 0) nh_log_set_level(NH_LOG_DEBUG);
    else if (strcmp(lvl, "info") == 0) nh_log_set_level(NH_LOG_INFO);
    else if (strcmp(lvl, "warn") == 0) nh_log_set_level(NH_LOG_WARN);
    else if (strcmp(lvl, "error") == 0) nh_log_set_level(NH_LOG_ERROR);
    else return nh_usage_error("run", "--log-level must be debug, info, warn or error");
  }
  const char *transport = nh_args_get(&a, "--transport");
  if (transport && strcmp(transport, "embedded") != 0 && !nh_amqp_is_url(transport))
    return nh_usage_error("run", "--transport %s: give embedded (the default) or amqp[s]://user:password@host:port[/vhost]",
                          transport);
  int64_t retention_ms = 0;
  const char *retention = nh_args_get(&a, "--retention");
  if (retention && (retention_ms = nh_duration_parse_ms(retention)) <= 0)
    return nh_usage_error("run", "--retention %s: give the age after which resolved events are deleted, 1s or more "
                                 "(7d, 12h, 30m)", retention);
  const char *metrics = nh_args_get(&a, "--metrics");
  if (metrics && strcmp(metrics, "on") != 0 && strcmp(metrics, "off") != 0)
    return nh_usage_error("run", "--metrics must be on or off, not %s", metrics);
  nh_metrics_set_enabled(!metrics || strcmp(metrics, "on") == 0);
  const char *otlp_url = nh_args_get(&a, "--otlp");
  if (!otlp_url && getenv("NIMBUS_OTLP") && *getenv("NIMBUS_OTLP")) otlp_url = getenv("NIMBUS_OTLP");
  nh_admin_addr_t admin;
  if ((rc = nh_cli_admin_addr(&a, "run", &admin))) return rc;
  for (int i = 0; i < a.npos; i++)
    if (access(a.pos[i], R_OK) != 0)
      return nh_usage_error("run", "cannot read adapter %s: no such file or not readable", a.pos[i]);

  nh_error_t err = {0};
  nh_store_t *store = NULL;
  PGconn *pgconn = NULL;   /* a PostgreSQL store: migrated now, then the queue transport's */
  int pg = nh_pg_url_is(a.store);
  int from = 0, to = 0;
  if (pg ? nh_store_pg_connect(a.store, 0, &pgconn, &from, &to, &err)
         : nh_store_open(&store, a.store, NH_STORE_CREATE, &err)) {
    fprintf(stderr, "nimbus-host: %s\n", err.msg);
    return err.code == NH_EUSAGE ? NH_EXIT_USAGE : NH_EXIT_FAIL;
  }
  char owner[200];
  owner_id(owner, sizeof owner);
  nh_runtime_t rt;   /* the loop and what lives per loop: closed below, in one place */
  nh_runtime_init(&rt);
  uv_loop_t *loop = &rt.loop;
  host_t h = { .loop = loop, .store = a.store, .no_reload = nh_args_has(&a, "--no-reload") };
  if (pg) {
    h.shown = nh_pg_url_display(a.store);
    h.store = h.shown;
    if (from != to) nh_log_info("host", "store %s migrated from version %d to %d", h.shown, from, to);
  }
  if (otlp_url && !(rt.otlp = start_otlp(loop, otlp_url, owner, &err))) {
    fprintf(stderr, "nimbus-host: --otlp %s: %s\n", otlp_url, err.msg);
    nh_store_close(store);
    if (pgconn) PQfinish(pgconn);
    free(h.shown);
    nh_runtime_close(&rt);
    return NH_EXIT_USAGE;
  }
  h.amqp = nh_amqp_is_url(transport);
  nh_transport_t *tr = NULL;
  if (pg) {
    nh_pg_link_opts_t lo = { .on_state = on_link_state, .data = &h };
    if (nh_pg_link_open(loop, a.store, &lo, &h.link, &err) != NH_OK)
      PQfinish(pgconn);
    else if (h.amqp)   /* the broker carries the events, the store's queue the operators' requests */
      tr = nh_amqp_init_pg(loop, h.link, pgconn, transport, owner, on_amqp_status, &h, &err);
    else
      tr = nh_embedded_pg_init(h.link, pgconn, owner, &err);
  } else {
    tr = h.amqp ? nh_amqp_init(loop, store, transport, owner, on_amqp_status, &h, &err)
                : nh_embedded_init(nh_store_db(store), owner, &err);
  }
  if (!tr) {
    fprintf(stderr, "nimbus-host: %s%s: %s\n", h.amqp ? "--transport " : "store ", h.amqp ? "" : h.store, err.msg);
    if (h.link) nh_pg_link_close(h.link, NULL, NULL);
    uv_run(loop, UV_RUN_DEFAULT);
    nh_store_close(store);
    free(h.shown);
    nh_runtime_close(&rt);
    return err.code == NH_EUSAGE ? NH_EXIT_USAGE : NH_EXIT_FAIL;
  }
  h.tr = tr;
  h.d = pg ? nh_dispatch_init_pg(loop, h.link, tr, nh_vm_lua_dir(argv[0]))
           : nh_dispatch_init(loop, store, tr, nh_vm_lua_dir(argv[0]));
  if (retention_ms > 0) nh_dispatch_set_retention_fixed(h.d, retention_ms);
  nh_dispatch_set_owner(h.d, owner);
  int status = NH_EXIT_OK;
  for (int i = 0; i < a.npos && status == NH_EXIT_OK; i++) {
    if (nh_dispatch_load(h.d, a.pos[i], &err)) {
      fprintf(stderr, "nimbus-host: cannot load adapter: %s\n", err.msg);   /* err: "file:line: message" */
      status = err.code == NH_EUSAGE ? NH_EXIT_USAGE : NH_EXIT_FAIL;
    }
  }
  if (status == NH_EXIT_OK && nh_dispatch_start(h.d, &err)) {
    fprintf(stderr, "nimbus-host: %s\n", err.msg);
    status = err.code == NH_EUSAGE ? NH_EXIT_USAGE : NH_EXIT_FAIL;
  }
  if (status == NH_EXIT_OK && !nh_args_has(&a, "--no-reload") && nh_dispatch_watch(h.d, &err)) {
    fprintf(stderr, "nimbus-host: %s\n", err.msg);
    status = NH_EXIT_FAIL;
  }
  /* on PostgreSQL without the store: its reads on the thread pool (nh_admin_pg.c) */
  if (pg) admin.opts.pg_url = a.store;
  if (status == NH_EXIT_OK && !admin.off && !(h.admin = nh_admin_start(loop, pg ? NULL : store, &admin.opts, &err))) {
    fprintf(stderr, "nimbus-host: %s\n", err.msg);
    status = NH_EXIT_USAGE;
  }
  nh_admin_set_ready(h.admin, host_ready, &h);
  if (status == NH_EXIT_OK) {
    uv_signal_init(loop, &h.sigint);
    uv_signal_init(loop, &h.sigterm);
    uv_signal_init(loop, &h.sighup);
    h.sigint.data = h.sigterm.data = h.sighup.data = &h;
    uv_signal_start(&h.sigint, on_signal, SIGINT);
    uv_signal_start(&h.sigterm, on_signal, SIGTERM);
    uv_signal_start(&h.sighup, on_signal, SIGHUP);
    h.signals = 1;
    nh_dispatch_describe(h.d, h.desc, sizeof h.desc);
    if (h.amqp) nh_amqp_start(tr);   /* logs ready: once connected */
    else log_ready(&h, "embedded");
    nh_runtime_run(&rt, UV_RUN_DEFAULT);
    nh_log_info("host", "stopped");
    status = h.status;
  } else if (h.amqp) {
    nh_amqp_stop(tr, NULL, NULL);
  }
  close_signals(&h);
  nh_admin_close(h.admin);
  nh_dispatch_close(h.d);
  if (h.link) nh_pg_link_close(h.link, NULL, NULL);   /* after the dispatcher, whose unit of work uses it */
  stop_otlp(&rt);
  nh_runtime_close_parts(&rt);     /* the HTTP client, before the loop runs the close callbacks */
  uv_run(loop, UV_RUN_DEFAULT);
  tr->vt->close(tr);
  if (nh_runtime_close(&rt)) nh_log_warn("host", "event loop closed with handles still open");
  nh_store_close(store);
  free(h.shown);
  return status;
}
