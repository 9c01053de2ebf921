/* `nimbus-host [--store PATH] -l SCRIPT.lua [ARGS]`: a plain Lua script inside the host
 * (busted runs this way), and the vm host such scripts get. Hand-offs are settled and
 * listed through the store (dispatch/nh_bridge.c); nimbus.publish goes into the store
 * given before -l (else $NIMBUS_STORE, else ./nimbus.db) with the embedded transport, the
 * way `nimbus-host publish` does: the store is opened at the first publish and kept open
 * while the script runs, so seeding a thousand events opens it once. */
#include "nh_cli.h"
#include "core/nh_runtime.h"
#include "core/nh_util.h"
#include "dispatch/nh_bridge.h"
#include "lua/nh_vm.h"
#include "store/nh_store.h"
#include "transport/nh_embedded.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct script_host {
  nh_store_t *store;
  nh_transport_t *tr;
} script_host_t;

static const char *store_path(void)
{
  const char *env = getenv("NIMBUS_STORE");
  return env && *env ? env : "./nimbus.db";
}

/* NH_ESTATE in err: there is no store to publish to (nimbus.publish raises it). */
static int open_store(script_host_t *sh, nh_error_t *err)
{
  if (sh->tr) return NH_OK;
  const char *path = store_path();
  nh_error_t e = {0};
  if (nh_store_open(&sh->store, path, 0, &e))
    return nh_error_set(err, NH_ESTATE, "%s (a script publishes into the store given before -l: nimbus-host --store "
                        "PATH -l SCRIPT.lua, or $NIMBUS_STORE)", e.msg);
  char owner[64];
  snprintf(owner, sizeof owner, "script:%ld", (long)getpid());
  sh->tr = nh_embedded_init(nh_store_db(sh->store), owner, &e);
  if (!sh->tr) {
    nh_store_close(sh->store);
    sh->store = NULL;
    return nh_error_set(err, NH_ESTATE, "store %s: %s", path, e.msg);
  }
  return NH_OK;
}

static int script_publish(void *data, void *task_data, const char *type, const char *body, size_t body_len,
                          const char *session, const char *correlation_id, const char *to, const char *given_id,
                          char message_id[37], int *duplicate, nh_later_t *later, nh_error_t *err)
{
  (void)later;   /* answered now */
  (void)task_data;
  script_host_t *sh = data;
  if (open_store(sh, err)) return err->code;
  nh_store_t *s = sh->store;
  if (to) {
    char known[400];
    int k = nh_embedded_endpoint_known(nh_store_db(s), to, known, sizeof known);
    if (k == 0)
      return nh_error_set(err, NH_ENOTFOUND, "no endpoint %s in store %s (%s%s): start its host once first", to,
                          store_path(), known[0] ? "known: " : "none has started yet", known);
  }
  nh_uuid_v7(message_id);
  nh_msg_t m;
  nh_msg_ids_t ids;
  nh_msg_event(&m, &ids, type, body, body_len, session, correlation_id, given_id ? given_id : message_id);
  /* one transaction: the MessageId claim, the copies, or nothing */
  if (nh_store_begin(s)) return nh_error_set(err, NH_EFAIL, "store busy: %s", nh_store_errmsg(s));
  if (given_id) {
    int64_t now = nh_time_now_ms(), at = 0;
    int c = nh_store_published_claim(s, given_id, now, now - NH_DEDUP_WINDOW_MS, &at);
    if (c <= 0) {
      nh_store_rollback(s);
      if (c < 0) return nh_error_set(err, NH_EFAIL, "store: %s", nh_store_errmsg(s));
      *duplicate = 1;   /* published within the dedup window: not again */
      return NH_OK;
    }
  }
  int copies = 0;
  if (sh->tr->vt->send(sh->tr, &m, to, &copies, err)) {
    nh_store_rollback(s);
    return NH_EFAIL;
  }
  if (copies == 0) {
    nh_store_rollback(s);   /* nothing queued: the MessageId stays free for a retry */
    return nh_error_set(err, NH_ENOTFOUND, "no endpoint subscribes to %s in store %s, so nothing was queued; start a "
                        "host whose adapter handles it (ep:on(\"%s\", ...)) on that store once first, or address an "
                        "endpoint with { to = ... }", type, store_path(), type);
  }
  if (nh_store_commit(s)) {
    nh_error_t why = {0};
    nh_store_explain(s, "queueing the message", &why);
    nh_store_rollback(s);
    return nh_error_set(err, NH_EFAIL, "%s; nothing was queued", why.msg);
  }
  return NH_OK;
}

static void script_host_close(script_host_t *sh)
{
  if (sh->tr) sh->tr->vt->close(sh->tr);
  if (sh->store) nh_store_close(sh->store);
  sh->tr = NULL;
  sh->store = NULL;
}

int nh_cli_run_lua(const char *argv0, const char *script, int argc, char **argv)
{
  script_host_t sh = { 0 };
  nh_vm_host_t host = *nh_bridge_script_host();
  host.data = &sh;
  host.publish = script_publish;
  nh_runtime_t rt;
  nh_runtime_init(&rt);
  int rc = nh_vm_run_script(&rt.loop, script, argc, argv, nh_vm_lua_dir(argv0), &host);
  script_host_close(&sh);
  nh_runtime_close(&rt);
  return rc;
}

int nh_cli_script_at(int argc, char **argv)
{
  /* options before -l are the host's; everything after the script is the script's */
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "-l") == 0) return i;
    if (strcmp(argv[i], "--store") == 0 && i + 1 < argc) i++;
    else if (strncmp(argv[i], "--store=", 8) != 0) return 0;
  }
  return 0;
}

int nh_cmd_script(int argc, char **argv, int at)
{
  for (int i = 1; i < at; i++) {
    const char *path = strcmp(argv[i], "--store") == 0 ? argv[++i] : argv[i] + 8;
    if (!*path) return nh_usage_error("-l", "--store needs a path");
    setenv("NIMBUS_STORE", path, 1);   /* hand-offs (h.store unset) and publishes use it */
  }
  if (at + 1 >= argc) return nh_usage_error("-l", "missing script: nimbus-host [--store PATH] -l SCRIPT.lua [ARGS]");
  return nh_cli_run_lua(argv[0], argv[at + 1], argc - at - 2, argv + at + 2);
}
