/* The store services of nh_bridge.h: pending hand-offs pushed to Lua as a table,
 * hand-off settlements through nh_operator_submit, and the vm host of `nimbus-host -l`,
 * which opens the store per call (the path given, else $NIMBUS_STORE, else ./nimbus.db). */
#include "nh_bridge.h"
#include "nh_operator.h"
#include "core/nh_util.h"
#include "store/nh_pg.h"
#include "store/nh_pg_ops.h"
#include "store/nh_pg_queue.h"
#include "transport/nh_embedded.h"

#include <lauxlib.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void nh_bridge_push_handoff(lua_State *L, const nh_audit_t *a, int index)
{
  luaL_checkstack(L, 4, "pending hand-offs");
  lua_createtable(L, 0, 10);
  nh_lua_set_str(L, "endpoint", a->endpoint);
  nh_lua_set_str(L, "event_id", a->event_id);
  nh_lua_set_str(L, "session_id", a->session_id);
  nh_lua_set_str(L, "message_id", a->message_id);
  nh_lua_set_str(L, "event_type", a->event_type);
  nh_lua_set_str(L, "reason", a->handoff_reason);
  nh_lua_set_str(L, "external_job_id", a->external_job_id);
  nh_lua_set_str(L, "correlation_id", a->correlation_id);
  nh_lua_set_str(L, "payload", a->payload);   /* decoded on the Lua side */
  if (a->expected_by) {
    char ts[40];
    nh_time_iso8601(a->expected_by, ts, sizeof ts);
    nh_lua_set_str(L, "expected_by", ts);
    lua_pushinteger(L, a->expected_by);
    lua_setfield(L, -2, "expected_by_ms");
  }
  lua_rawseti(L, -2, index);
}

struct push_ctx {
  lua_State *L;
  int n;
};

static int push_one(void *data, const nh_audit_t *a)
{
  struct push_ctx *c = data;
  if (a->sub_status && strcmp(a->sub_status, "Handoff") == 0) nh_bridge_push_handoff(c->L, a, ++c->n);
  return 0;
}

int nh_bridge_push_handoffs(lua_State *L, nh_store_t *s, const char *endpoint, nh_error_t *err)
{
  lua_newtable(L);
  struct push_ctx c = { L, 0 };
  if (nh_store_audit_list(s, endpoint, NH_ST_PENDING, NULL, push_one, &c) < 0) {
    lua_pop(L, 1);
    return nh_error_set(err, NH_EFAIL, "store: cannot list pending hand-offs");
  }
  return NH_OK;
}

void nh_bridge_handoff_req(const nh_handoff_req_t *h, nh_op_req_t *out)
{
  nh_op_req_t req = {
    .kind = h->complete ? NH_OP_HANDOFF_COMPLETE : NH_OP_HANDOFF_FAIL, .event_id = h->event_id,
    .endpoint = h->endpoint, .session_id = h->session_id, .message_id = h->message_id, .body = h->result,
    .error_text = h->error_text, .error_type = h->error_type, .actor = h->actor,
  };
  *out = req;
}

int nh_bridge_handoff(nh_store_t *s, nh_transport_t *t, const nh_handoff_req_t *h, nh_error_t *err)
{
  nh_op_req_t req;
  nh_bridge_handoff_req(h, &req);
  return nh_operator_submit(s, t, &req, NULL, err);
}

/* ---------------------------------------------------------------- interpreter mode */

static const char *store_path(const char *given)
{
  if (given && *given) return given;
  const char *env = getenv("NIMBUS_STORE");
  return env && *env ? env : "./nimbus.db";
}

static int open_both(const char *path, nh_store_t **s, nh_transport_t **t, nh_error_t *err)
{
  if (nh_store_open(s, store_path(path), 0, err)) return err->code;
  char owner[64];
  snprintf(owner, sizeof owner, "script:%ld", (long)getpid());
  *t = nh_embedded_init(nh_store_db(*s), owner, err);
  if (!*t) {
    nh_store_close(*s);
    return NH_EFAIL;
  }
  return NH_OK;
}

/* A PostgreSQL store for a script: a blocking connection (a script may wait), the schema
 * and the queue's migrated as for any command. */
static nh_pg_db_t *pg_open(const char *url, nh_error_t *err)
{
  PGconn *conn = NULL;
  int from = 0, to = 0;
  if (nh_store_pg_connect(url, 0, &conn, &from, &to, err) || nh_pg_queue_migrate(conn, err)) {
    if (conn) PQfinish(conn);
    return NULL;
  }
  return nh_pg_db_new(conn);
}

static int pg_pending(lua_State *L, const char *url, const char *endpoint, nh_error_t *err)
{
  nh_pg_db_t *db = pg_open(url, err);
  if (!db) return err->code;
  nh_pg_args_t a;
  PGresult *r = NULL;
  int rc = nh_pg_db_run(db, nh_pgargs_handoffs_pending(&a, endpoint), &a, &r, err);
  if (rc == NH_OK) {
    lua_createtable(L, PQntuples(r), 0);
    for (int i = 0; i < PQntuples(r); i++) {
      nh_audit_t au;
      nh_pgrow_audit(r, i, &au);
      nh_bridge_push_handoff(L, &au, i + 1);
      nh_audit_clear(&au);
    }
  }
  PQclear(r);
  nh_pg_db_free(db);
  return rc;
}

static int pg_handoff(const char *url, const nh_handoff_req_t *h, nh_error_t *err)
{
  nh_pg_db_t *db = pg_open(url, err);
  if (!db) return err->code;
  nh_op_req_t req;
  nh_bridge_handoff_req(h, &req);
  int rc = nh_operator_submit_pg(db, &req, NULL, err);
  nh_pg_db_free(db);
  return rc;
}

/* A script answers at once: the store is a local file, or a server a script may wait for. */
static int script_pending(void *data, lua_State *L, const char *endpoint, nh_later_t *later, nh_error_t *err)
{
  (void)data;
  (void)later;
  if (nh_pg_url_is(store_path(NULL))) return pg_pending(L, store_path(NULL), endpoint, err);
  nh_store_t *s;
  if (nh_store_open(&s, store_path(NULL), 0, err)) return err->code;
  int rc = nh_bridge_push_handoffs(L, s, endpoint, err);
  nh_store_close(s);
  return rc;
}

static int script_handoff(void *data, const nh_handoff_req_t *req, nh_later_t *later, nh_error_t *err)
{
  (void)data;
  (void)later;
  if (nh_pg_url_is(store_path(req->store))) return pg_handoff(store_path(req->store), req, err);
  nh_store_t *s = NULL;
  nh_transport_t *t = NULL;
  int rc = open_both(req->store, &s, &t, err);
  if (rc) return rc;
  rc = nh_bridge_handoff(s, t, req, err);
  t->vt->close(t);
  nh_store_close(s);
  return rc;
}

const nh_vm_host_t *nh_bridge_script_host(void)
{
  static const nh_vm_host_t host = { .pending_handoffs = script_pending, .handoff = script_handoff };
  return &host;
}
