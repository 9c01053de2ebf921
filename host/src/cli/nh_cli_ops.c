/* Commands that write: publish, and the operator actions (resubmit, skip, hand-off
 * settlement). Operator actions are validated against the audit row here, then sent
 * as control messages through the event's own session queue, so the host that owns
 * the endpoint applies them in order with the session's other work. */
#include "nh_cli.h"
#include "core/nh_runtime.h"
#include "core/nh_trace.h"
#include "core/nh_util.h"
#include "dispatch/nh_operator.h"
#include "store/nh_pg.h"
#include "store/nh_pg_link.h"
#include "store/nh_pg_ops.h"
#include "store/nh_store.h"
#include "transport/nh_amqp.h"
#include "transport/nh_embedded.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <uv.h>

typedef struct cli_ctx {
  nh_store_t *store;
  nh_transport_t *tr;
} cli_ctx_t;

static int open_ctx(cli_ctx_t *c, const char *cmd, const char *path, int create)
{
  nh_error_t err = {0};
  memset(c, 0, sizeof *c);
  if (nh_store_open(&c->store, path, create ? NH_STORE_CREATE : 0, &err)) {
    fprintf(stderr, "nimbus-host %s: %s\n", cmd, err.msg);
    return err.code == NH_EFAIL ? NH_EXIT_FAIL : NH_EXIT_USAGE;
  }
  char owner[64];
  snprintf(owner, sizeof owner, "cli:%ld", (long)getpid());
  c->tr = nh_embedded_init(nh_store_db(c->store), owner, &err);
  if (!c->tr) {
    fprintf(stderr, "nimbus-host %s: %s\n", cmd, err.msg);
    nh_store_close(c->store);
    return NH_EXIT_FAIL;
  }
  return NH_EXIT_OK;
}

static void close_ctx(cli_ctx_t *c)
{
  if (c->tr) c->tr->vt->close(c->tr);
  nh_store_close(c->store);
}

#define NH_PUBLISH_CONFIRM_MS 30000

typedef struct amqp_pub {
  nh_transport_t *tr;
  nh_store_t *store;             /* sqlite; on PostgreSQL: */
  nh_pg_link_t *link;            /* the transport's */
  nh_pg_db_t *pgdb;              /* blocking: the claim and the outbox row */
  const char *given_id;
  nh_msg_t *m;
  const char *to;
  uv_timer_t poll;
  int polling;
  int64_t deadline;
  int done, failed, sent, dedup, duplicate;
  char why[1024];
} amqp_pub_t;

/* publish --message-id: the MessageId is claimed in the store (in the caller's open
 * transaction); 0 when it was published within the dedup window, after saying so. */
void nh_cli_said_published(const char *message_id, int64_t at)
{
  char when[40];
  nh_time_iso8601(at, when, sizeof when);
  fprintf(stderr, "nimbus-host publish: MessageId %s was already published at %s (within the dedup window of "
                  "24 h): not stored again\n", message_id, when);
}

static int claim_message_id(nh_store_t *s, const char *message_id)
{
  int64_t now = nh_time_now_ms(), at = 0;
  int c = nh_store_published_claim(s, message_id, now, now - NH_DEDUP_WINDOW_MS, &at);
  if (c == 0) nh_cli_said_published(message_id, at);
  return c;
}

static void pub_finish(amqp_pub_t *p)
{
  if (p->done) return;
  p->done = 1;
  if (p->polling) uv_close((uv_handle_t *)&p->poll, NULL);
  nh_amqp_stop(p->tr, NULL, NULL);
  if (p->link) nh_pg_link_close(p->link, NULL, NULL);   /* nothing is out on it: unconfirmed counted it */
  p->link = NULL;
}

static void pub_fail(amqp_pub_t *p, const char *why)
{
  if (p->done) return;
  p->failed = 1;
  snprintf(p->why, sizeof p->why, "%s", why);
  pub_finish(p);
}

static void pub_status(void *data, nh_amqp_status_t st, const char *msg)
{
  amqp_pub_t *p = data;
  if (st != NH_AMQP_FATAL) return;
  /* refused for good (credentials, TLS): nothing may be sent later behind the user's back */
  if (p->sent) nh_amqp_outbox_discard(p->tr);
  p->sent = 0;
  pub_fail(p, msg);
}

static void pub_poll(uv_timer_t *t)
{
  amqp_pub_t *p = t->data;
  if (p->done) return;
  if (p->sent && nh_amqp_unconfirmed(p->tr) == 0) {
    pub_finish(p);
  } else if (nh_time_now_ms() > p->deadline) {
    char why[300];
    snprintf(why, sizeof why, "the broker did not confirm the message within %d s (see the log above); it stays in "
             "this store's outbox and the next host started on this store sends it", NH_PUBLISH_CONFIRM_MS / 1000);
    pub_fail(p, why);
  }
}

/* Someone consumes it (RabbitMQ drops what no binding routes): queue it, send it. With
 * --to, found is the endpoint's partition count (1: its one queue). */
static void pub_probed(void *data, int found, const char *why)
{
  amqp_pub_t *p = data;
  if (found < 0) {
    pub_fail(p, why);
    return;
  }
  if (found == 0) {
    char msg[600];
    if (p->to)
      snprintf(msg, sizeof msg, "the broker has no queue %s, so nothing was sent; start a host with that endpoint "
               "first (it declares its queue)", p->to);
    else
      snprintf(msg, sizeof msg, "no endpoint subscribes to %s (no queue is bound to it on the broker), so nothing "
               "was sent; start a host whose adapter handles it (ep:on(\"%s\", ...)) first, or address an endpoint "
               "with --to", p->m->event_type, p->m->event_type);
    pub_fail(p, msg);
    return;
  }
  /* the endpoint's layout (found = its partition count): with partitions, the session's
   * queue, though this process consumes none of them; either way no second question */
  if (p->to) nh_amqp_target_partitions(p->tr, p->to, found);
  nh_error_t err = {0};
  int copies = 0;
  if (p->pgdb) {
    char failed[sizeof p->why];
    int w = nh_cli_outbox_publish_pg(p->pgdb, p->tr, p->m, p->to, p->given_id, failed, sizeof failed);
    if (w < 0) {
      pub_fail(p, failed);
    } else if (w == 1) {
      p->duplicate = 1;
      pub_finish(p);
    } else {
      p->sent = 1;
      p->deadline = nh_time_now_ms() + NH_PUBLISH_CONFIRM_MS;
      nh_amqp_start(p->tr);
    }
    return;
  }
  if (nh_store_begin(p->store) == NH_OK && p->dedup) {
    int c = claim_message_id(p->store, p->m->message_id);
    if (c <= 0) {
      nh_store_rollback(p->store);
      if (c == 0) {
        p->duplicate = 1;
        pub_finish(p);
      } else {
        pub_fail(p, nh_store_errmsg(p->store));
      }
      return;
    }
  } else if (!nh_store_in_tx(p->store)) {
    pub_fail(p, nh_store_errmsg(p->store));
    return;
  }
  if (p->tr->vt->send(p->tr, p->m, p->to, &copies, &err) || nh_store_commit(p->store)) {
    nh_store_rollback(p->store);
    pub_fail(p, err.msg[0] ? err.msg : nh_store_errmsg(p->store));
    return;
  }
  p->sent = 1;
  p->deadline = nh_time_now_ms() + NH_PUBLISH_CONFIRM_MS;
  nh_amqp_start(p->tr);
}

/* `publish --transport amqp://...`: the message goes through the store's outbox like
 * every other send, and the command returns once the broker accepted it. */
/* On a PostgreSQL store: the outbox there (a blocking connection writes the row with the
 * MessageId's claim), and the transport on a link of its own sends it. */
static nh_transport_t *publish_amqp_pg(uv_loop_t *loop, amqp_pub_t *p, const char *url, const char *store_url,
                                       const char *owner, nh_error_t *err)
{
  int rc = NH_EXIT_OK;
  PGconn *conn = NULL;
  int from = 0, to = 0;
  if (!(p->pgdb = nh_cli_pg_open("publish", store_url, &rc))) {
    nh_error_set(err, rc == NH_EXIT_USAGE ? NH_EUSAGE : NH_EFAIL, "the store could not be opened (said above)");
    return NULL;
  }
  if (nh_store_pg_connect(store_url, 0, &conn, &from, &to, err)) return NULL;
  if (nh_pg_link_open(loop, store_url, NULL, &p->link, err)) {
    PQfinish(conn);
    return NULL;
  }
  return nh_amqp_init_pg(loop, p->link, conn, url, owner, pub_status, p, err);
}

static int publish_amqp(const char *url, const char *store_path, nh_msg_t *m, const char *to, const char *given_id)
{
  nh_error_t err = {0};
  nh_store_t *store = NULL;
  int pg = nh_pg_url_is(store_path);
  if (!pg && nh_store_open(&store, store_path, NH_STORE_CREATE, &err)) {
    fprintf(stderr, "nimbus-host publish: %s\n", err.msg);
    return err.code == NH_EUSAGE ? NH_EXIT_USAGE : NH_EXIT_FAIL;
  }
  nh_runtime_t rt;
  nh_runtime_init(&rt);
  uv_loop_t *loop = &rt.loop;
  amqp_pub_t p;
  memset(&p, 0, sizeof p);
  p.store = store;
  p.m = m;
  p.to = to;
  p.dedup = given_id != NULL;
  p.given_id = given_id;
  char owner[200], hostn[128] = "localhost";
  gethostname(hostn, sizeof hostn - 1);
  snprintf(owner, sizeof owner, "%s:%ld:publish", hostn, (long)getpid());
  p.tr = pg ? publish_amqp_pg(loop, &p, url, store_path, owner, &err)
            : nh_amqp_init(loop, store, url, owner, pub_status, &p, &err);
  int rc = NH_EXIT_OK;
  if (!p.tr && pg) {
    if (p.pgdb) fprintf(stderr, "nimbus-host publish: %s\n", err.msg);
    rc = err.code == NH_EUSAGE ? NH_EXIT_USAGE : NH_EXIT_FAIL;
    if (p.link) nh_pg_link_close(p.link, NULL, NULL);
    uv_run(loop, UV_RUN_DEFAULT);
  } else if (!p.tr) {
    fprintf(stderr, "nimbus-host publish: --transport: %s\n", err.msg);
    rc = err.code == NH_EUSAGE ? NH_EXIT_USAGE : NH_EXIT_FAIL;
  } else {
    uv_timer_init(loop, &p.poll);
    p.poll.data = &p;
    p.polling = 1;
    uv_timer_start(&p.poll, pub_poll, 5, 5);
    p.deadline = nh_time_now_ms() + NH_PUBLISH_CONFIRM_MS;
    if (nh_amqp_probe(p.tr, m->event_type, to, pub_probed, &p, &err)) {
      if (err.code == NH_ENOTFOUND) pub_probed(&p, 1, NULL);   /* management=none: nobody to ask */
      else pub_fail(&p, err.msg);
    }
    uv_run(loop, UV_RUN_DEFAULT);
    if (store && p.sent && !p.failed && nh_store_begin(store) == NH_OK)   /* deletes the accepted outbox row */
      nh_store_commit(store);
    p.tr->vt->close(p.tr);
    nh_runtime_close_parts(&rt);   /* the management API's HTTP client */
    uv_run(loop, UV_RUN_DEFAULT);
    if (p.failed) {
      fprintf(stderr, "nimbus-host publish: %s\n", p.why);
      rc = NH_EXIT_FAIL;
    } else {
      printf("%s\n", m->message_id);   /* a duplicate too: the caller's id, already published */
    }
  }
  nh_runtime_close(&rt);
  nh_store_close(store);
  nh_pg_db_free(p.pgdb);
  return rc;
}

struct sent_ctx {
  char eid[8][37], ep[8][128];
  int n, more;
};

static void on_sent(void *data, const char *endpoint, const char *event_id)
{
  struct sent_ctx *sc = data;
  if (sc->n == 8) {
    sc->more++;
    return;
  }
  snprintf(sc->eid[sc->n], sizeof sc->eid[sc->n], "%s", event_id);
  snprintf(sc->ep[sc->n], sizeof sc->ep[sc->n], "%s", endpoint);
  sc->n++;
}

int nh_cmd_publish(int argc, char **argv)
{
  static const nh_opt_spec_t specs[] = {
    { "--session", 1 }, { "--correlation-id", 1 }, { "--to", 1 }, { "--raw", 0 }, { "--transport", 1 },
    { "--message-id", 1 }, { "--traceparent", 1 }, { "--tracestate", 1 }, { NULL, 0 },
  };
  nh_args_t a;
  int rc = nh_args_parse(&a, "publish", argc, argv, 2, specs);
  if (rc) return rc;
  if (a.npos < 1) return nh_usage_error("publish", "missing event type: nimbus-host publish TYPE [JSON|@file]");
  if (a.npos > 2) return nh_usage_error("publish", "too many arguments; quote the JSON payload");
  const char *transport = nh_args_get(&a, "--transport");
  if (transport && strcmp(transport, "embedded") != 0 && !nh_amqp_is_url(transport))
    return nh_usage_error("publish", "--transport %s: give embedded (the default) or amqp[s]://user:password@host:port[/vhost]",
                          transport);
  const char *type = a.pos[0];
  if (!*type) return nh_usage_error("publish", "the event type is empty: nimbus-host publish TYPE [JSON|@file]");
  const char *sess_arg = nh_args_get(&a, "--session");
  if (sess_arg && (!*sess_arg || !nh_cli_valid_utf8(sess_arg)))
    return nh_usage_error("publish", "--session must be a non-empty UTF-8 text");
  char *body;
  if (a.npos < 2) {
    body = nh_xstrdup("{}");
  } else if (nh_args_has(&a, "--raw")) {
    /* --raw sends the bytes unchecked: for testing how endpoints treat malformed input. */
    const char *err = NULL;
    body = a.pos[1][0] == '@' ? nh_file_read(a.pos[1] + 1, NULL, &err) : nh_xstrdup(a.pos[1]);
    if (!body) return nh_usage_error("publish", "cannot read %s: %s", a.pos[1] + 1, err);
  } else if (!(body = nh_cli_json_object_arg("publish", "the payload", a.pos[1]))) {
    return NH_EXIT_USAGE;
  }
  const char *given_id = nh_args_get(&a, "--message-id");
  if (given_id && (!*given_id || strlen(given_id) > 200 || !nh_cli_valid_utf8(given_id))) {
    free(body);
    return nh_usage_error("publish", "--message-id must be a UTF-8 text of 1 to 200 characters");
  }
  char mid[37];
  nh_uuid_v7(mid);
  nh_msg_t m;
  nh_msg_ids_t ids;
  nh_msg_event(&m, &ids, type, body, strlen(body), nh_args_get(&a, "--session"), nh_args_get(&a, "--correlation-id"),
               given_id ? given_id : mid);
  /* --traceparent continues the caller's trace (docs/observability.md, Traces) */
  nh_trace_ctx_t tc;
  m.traceparent = (char *)nh_args_get(&a, "--traceparent");
  m.tracestate = (char *)nh_args_get(&a, "--tracestate");
  if (m.traceparent && nh_trace_parse(m.traceparent, &tc) != 0) {
    free(body);
    return nh_usage_error("publish", "--traceparent %s is not a W3C traceparent: give "
                                     "00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>, ids not all zero",
                          m.traceparent);
  }
  if (m.tracestate && (!m.traceparent || !nh_tracestate_valid(m.tracestate))) {
    free(body);
    return nh_usage_error("publish", m.traceparent ? "--tracestate is not a valid W3C tracestate (key=value,...)"
                                                   : "--tracestate goes with --traceparent");
  }
  if (nh_amqp_is_url(transport)) {
    rc = publish_amqp(transport, a.store, &m, nh_args_get(&a, "--to"), given_id);
    free(body);
    return rc;
  }
  if (nh_pg_url_is(a.store)) {
    rc = nh_cli_publish_pg(a.store, &m, nh_args_get(&a, "--to"), given_id);
    free(body);
    return rc;
  }
  cli_ctx_t c;
  if ((rc = open_ctx(&c, "publish", a.store, 1))) {
    free(body);
    return rc;
  }
  nh_error_t err = {0};
  int copies = 0;
  rc = NH_EXIT_OK;
  const char *to = nh_args_get(&a, "--to");
  if (to) {
    char known[400];
    int k = nh_embedded_endpoint_known(nh_store_db(c.store), to, known, sizeof known);
    if (k == 0) {
      close_ctx(&c);
      free(body);
      return nh_usage_error("publish", "--to %s: no such endpoint in this store (%s%s); start its host once first",
                            to, known[0] ? "known: " : "none has started yet", known);
    }
  }
  struct sent_ctx sc = { 0 };
  nh_embedded_on_sent(c.tr, on_sent, &sc);
  /* one transaction: the MessageId claim (with --message-id), the copies, or nothing */
  int claimed = 1, failed = nh_store_begin(c.store) != NH_OK;
  if (!failed && given_id) failed = (claimed = claim_message_id(c.store, given_id)) < 0;
  if (!failed && claimed == 1) failed = c.tr->vt->send(c.tr, &m, to, &copies, &err) != NH_OK;
  if (!failed && claimed == 0) {
    nh_store_rollback(c.store);   /* published before: stdout still names it */
    printf("%s\n", m.message_id);
  } else if (!failed && copies == 0) {
    nh_store_rollback(c.store);   /* nothing queued: the MessageId stays free for a retry */
    fprintf(stderr,
            "nimbus-host publish: no endpoint subscribes to %s, so nothing was queued; start a host whose adapter "
            "handles it (ep:on(\"%s\", ...)) first, or address an endpoint with --to\n",
            type, type);
    rc = NH_EXIT_FAIL;
  } else if (failed || nh_store_commit(c.store)) {
    nh_error_t why = {0};
    nh_store_explain(c.store, "queueing the message", &why);   /* before the rollback clears the error */
    nh_store_rollback(c.store);
    fprintf(stderr, "nimbus-host publish: %s; nothing was queued\n", err.msg[0] ? err.msg : why.msg);
    rc = NH_EXIT_FAIL;
  } else {
    printf("%s\n", m.message_id);
    /* stdout stays the MessageId (scripts read it); `show` takes these */
    for (int i = 0; i < sc.n; i++) fprintf(stderr, "queued as event %s for %s\n", sc.eid[i], sc.ep[i]);
    if (sc.more) fprintf(stderr, "... and %d more copies\n", sc.more);
  }
  free(body);
  close_ctx(&c);
  return rc;
}

/* Runs one operator request and reports it the CLI way. */
static int submit(const char *cmd, const char *store, const nh_op_req_t *req)
{
  if (nh_pg_url_is(store)) return nh_cli_submit_pg(cmd, store, req);
  cli_ctx_t c;
  int rc = open_ctx(&c, cmd, store, 0);
  if (rc) return rc;
  nh_error_t err = {0};
  nh_audit_t ev;
  rc = nh_operator_submit(c.store, c.tr, req, &ev, &err);
  if (rc) {
    fprintf(stderr, "nimbus-host %s: %s\n", cmd, err.msg);
    close_ctx(&c);
    return rc == NH_EFAIL ? NH_EXIT_FAIL : NH_EXIT_USAGE;
  }
  printf("%s of event %s queued (endpoint %s, session %s); the host owning %s applies it\n", cmd, ev.event_id,
         ev.endpoint, ev.session_id, ev.endpoint);
  if (nh_store_hosts_serving(c.store, ev.endpoint, nh_time_now_ms() - 30000) == 0)
    printf("note: no running host serves %s; the request waits in the store until one starts\n", ev.endpoint);
  nh_audit_clear(&ev);
  close_ctx(&c);
  return NH_EXIT_OK;
}

/* The filters only make sense with --all: a lone `--status failed` must not pass for
 * "this one event". Returns an exit code. */
static int single_or_bulk(const char *cmd, const nh_args_t *a)
{
  static const char *const bulk_only[] = { "--endpoint", "--status", "--type", "--session", "--error",
                                           "--group", "--since", "--before", "--dry-run", NULL };
  for (int i = 0; bulk_only[i]; i++)
    if (nh_args_has(a, bulk_only[i]))
      return nh_usage_error(cmd, "%s selects events for --all; add --all, or give one EVENT_ID alone", bulk_only[i]);
  if (a->npos != 1)
    return nh_usage_error(cmd, "expected one EVENT_ID, or --all with filters (%s --all --endpoint E --status failed)",
                          cmd);
  return NH_EXIT_OK;
}

int nh_cmd_resubmit(int argc, char **argv)
{
  static const nh_opt_spec_t specs[] = { { "--body", 1 }, { "--all", 0 }, { "--dry-run", 0 }, { "--force", 0 },
                                         NH_CLI_FILTER_OPTS, { NULL, 0 } };
  nh_args_t a;
  int rc = nh_args_parse(&a, "resubmit", argc, argv, 2, specs);
  if (rc) return rc;
  if (nh_args_has(&a, "--all")) return nh_cli_bulk(NH_OP_RESUBMIT, &a);
  if ((rc = single_or_bulk("resubmit", &a))) return rc;
  char *body = NULL;
  if (nh_args_has(&a, "--body") && !(body = nh_cli_json_object_arg("resubmit", "--body", nh_args_get(&a, "--body"))))
    return NH_EXIT_USAGE;
  nh_op_req_t req = { .kind = NH_OP_RESUBMIT, .event_id = a.pos[0], .body = body, .actor = "cli",
                      .force = nh_args_has(&a, "--force") };
  rc = submit("resubmit", a.store, &req);
  free(body);
  return rc;
}

int nh_cmd_skip(int argc, char **argv)
{
  static const nh_opt_spec_t specs[] = { { "--all", 0 }, { "--dry-run", 0 }, { "--reason", 1 }, NH_CLI_FILTER_OPTS,
                                         { NULL, 0 } };
  nh_args_t a;
  int rc = nh_args_parse(&a, "skip", argc, argv, 2, specs);
  if (rc) return rc;
  if (nh_args_has(&a, "--all")) return nh_cli_bulk(NH_OP_SKIP, &a);
  if ((rc = single_or_bulk("skip", &a))) return rc;
  nh_op_req_t req = { .kind = NH_OP_SKIP, .event_id = a.pos[0], .actor = "cli", .reason = nh_args_get(&a, "--reason") };
  return submit("skip", a.store, &req);
}

int nh_cmd_handoff(int argc, char **argv)
{
  static const nh_opt_spec_t specs[] = { { "--result", 1 }, { "--error", 1 }, { "--type", 1 }, { "--reason", 1 },
                                         { NULL, 0 } };
  nh_args_t a;
  int rc = nh_args_parse(&a, "handoff", argc, argv, 2, specs);
  if (rc) return rc;
  if (a.npos != 2 || (strcmp(a.pos[0], "complete") != 0 && strcmp(a.pos[0], "fail") != 0))
    return nh_usage_error("handoff", "usage: handoff complete EVENT_ID [--result JSON] | handoff fail EVENT_ID --error "
                                     "TEXT [--type T] [--reason WHY]");
  int complete = strcmp(a.pos[0], "complete") == 0;
  const char *etext = nh_args_get(&a, "--error");
  if (!complete && (!etext || !*etext)) return nh_usage_error("handoff", "handoff fail needs --error TEXT");
  if (complete && (etext || nh_args_has(&a, "--type") || nh_args_has(&a, "--reason")))
    return nh_usage_error("handoff", "--error, --type and --reason belong to handoff fail");
  if (!complete && nh_args_has(&a, "--result")) return nh_usage_error("handoff", "--result belongs to handoff complete");
  char *result = NULL;
  if (nh_args_has(&a, "--result") && !(result = nh_cli_json_arg("handoff", "--result", nh_args_get(&a, "--result"))))
    return NH_EXIT_USAGE;
  nh_op_req_t req = { .kind = complete ? NH_OP_HANDOFF_COMPLETE : NH_OP_HANDOFF_FAIL, .event_id = a.pos[1],
                      .body = result, .error_text = etext, .error_type = nh_args_get(&a, "--type"), .actor = "cli",
                      .reason = nh_args_get(&a, "--reason") };
  rc = submit(complete ? "handoff complete" : "handoff fail", a.store, &req);
  free(result);
  return rc;
}
