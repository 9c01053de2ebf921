/* The PostgreSQL store's connection on the loop (nh_pg_link.h).
 *
 * A link has at most one connection (conn_t) and runs one thing on it at a time, its
 * phase: the new connection's first query (the schema version, then LISTEN on every
 * channel: one simple query, one round trip), a LISTEN for channels added since, a batch
 * (nh_pg_exec.c's, driven by nh_pg_batch_poll), or nothing (idle: the socket is still
 * watched, for NOTIFY and for the server closing it). One uv_poll per connection watches
 * the socket: readable always, writable while libpq holds output it could not send.
 * Three timers: the deadline of the phase under way, the backoff before the next attempt,
 * and a zero-delay kick that starts queued work from the loop rather than inside submit.
 *
 * A connection that fails (lost, its deadline passed, or its first query refused) is
 * dropped and another attempted after a backoff; the executor's prepared statements
 * belong to the dropped one (a new nh_pg_db_t per connection prepares them again). */
#include "nh_pg_link.h"
#include "nh_pg.h"
#include "core/nh_log.h"
#include "core/nh_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct batch {
  struct batch *next;
  nh_pg_link_build_cb build;
  nh_pg_link_done_cb done;
  void *data;
  nh_pg_batch_outcome_t outcome;   /* set once over, while it waits for close to say it */
  nh_error_t err;
} batch_t;

typedef struct listener {
  char *channel;
  nh_pg_link_notify_cb cb;
  void *data;
  int sent;   /* LISTEN has been sent on the current connection */
} listener_t;

typedef enum { P_SETUP, P_LISTEN, P_BATCH, P_IDLE } phase_t;

/* One connection. Freed when its poll handle has closed: libuv must stop watching the
 * socket before PQfinish closes it. */
typedef struct conn {
  nh_pg_link_t *link;
  uv_poll_t poll;
  nh_pg_db_t *db;
  PGconn *pg;                  /* db's */
  int events;                  /* what the poll watches */
  int results;                 /* results of the query under way taken so far */
  int version;                 /* the schema version its first query read (-1: none) */
  PGresult *failed;            /* the query's first failed result */
  int failed_at;               /* ... its number (0: the version's SELECT) */
  PQnoticeReceiver chained;    /* nh_pg_conn_ready's receiver (which takes no argument) */
  char said[300];              /* an error the server sent outside any query: why it is closing */
} conn_t;

struct nh_pg_link {
  uv_loop_t *loop;
  char *url, *shown;           /* shown: the password masked */
  char *extra;                 /* the settings each connection adds to the URL's (nh_pg_link_conninfo) */
  nh_pg_link_opts_t opts;
  nh_pg_link_state_t state;
  nh_error_t err;
  nh_pg_connect_t *connecting; /* the attempt under way */
  conn_t *conn;
  phase_t phase;
  uv_timer_t deadline, retry, kick;
  int handles;                 /* the timers and the poll handles not yet closed */
  batch_t *head, *tail;        /* waiting */
  int waiting;
  batch_t *inflight;
  int in_build;                /* a builder is running: close waits for it to return */
  int build_failed;
  nh_error_t build_err;
  batch_t *over;               /* said once the link has closed (close) */
  listener_t *listeners;
  int nlisteners;
  int attempts;                /* failures (the loss, then failed attempts) since the connection was last ready */
  uint64_t down_since;         /* uv_now when the outage began */
  int64_t down_attempts;       /* stats.attempts then */
  int closing;
  int shut;                    /* closing has started: the handles are closing */
  nh_pg_link_close_cb close_cb;
  void *close_data;
  nh_pg_link_stats_t stats;
};

static void advance(nh_pg_link_t *link);
static void shutdown_link(nh_pg_link_t *link);
static void on_poll(uv_poll_t *h, int status, int events);

/* ---------------------------------------------------------------- small things */

static void say_state(nh_pg_link_t *link, nh_pg_link_state_t state, const nh_error_t *err)
{
  link->state = state;
  if (link->opts.on_state) link->opts.on_state(link->opts.data, state, err);
}

static void arm(conn_t *c, int events)
{
  if (c->events == events) return;
  c->events = events;
  uv_poll_start(&c->poll, events, on_poll);
}

static int uv_events(int want)
{
  return UV_READABLE | (want & NH_PG_WANT_WRITE ? UV_WRITABLE : 0);
}


/* The server's errors outside a query (the FATAL it sends before closing an idle
 * connection) come through the notice receiver: kept, to say why the connection went. */
static void on_notice(void *arg, const PGresult *res)
{
  conn_t *c = arg;
  const char *sev = PQresultErrorField(res, PG_DIAG_SEVERITY_NONLOCALIZED);
  if (sev && (!strcmp(sev, "FATAL") || !strcmp(sev, "PANIC"))) {
    const char *code = PQresultErrorField(res, PG_DIAG_SQLSTATE);
    const char *msg = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
    snprintf(c->said, sizeof c->said, "\"%s\" (SQLSTATE %s)", msg ? msg : "", code ? code : "none");
  }
  if (c->chained) c->chained(NULL, res);
}

/* ---------------------------------------------------------------- connections */

static void on_conn_closed(uv_handle_t *h)
{
  conn_t *c = h->data;
  nh_pg_link_t *link = c->link;
  nh_pg_db_free(c->db);
  free(c);
  link->handles--;
  if (link->closing && link->handles == 0 && !link->connecting) shutdown_link(link);
}

static void drop_conn(nh_pg_link_t *link)
{
  conn_t *c = link->conn;
  if (!c) return;
  link->conn = NULL;
  uv_timer_stop(&link->deadline);
  for (int i = 0; i < link->nlisteners; i++) link->listeners[i].sent = 0;
  PQclear(c->failed);
  c->failed = NULL;
  uv_close((uv_handle_t *)&c->poll, on_conn_closed);
}

static void on_retry(uv_timer_t *t);

/* The connection went, or an attempt failed: said once per outage (a warning and LOST),
 * then attempts follow with backoff until one is ready. */
static void connection_failed(nh_pg_link_t *link, const nh_error_t *err)
{
  drop_conn(link);
  link->err = *err;
  link->attempts++;
  if (link->state != NH_PG_LINK_LOST) {
    link->stats.losses++;
    link->down_since = uv_now(link->loop);
    link->down_attempts = link->stats.attempts;
    nh_log_warn("store", "%s; retrying (after %d ms, doubling up to %d ms, jittered); batches wait meanwhile", err->msg,
                link->opts.backoff_first_ms, link->opts.backoff_max_ms);
    say_state(link, NH_PG_LINK_LOST, err);
    if (link->closing) return;
  } else {
    nh_log_debug("store", "attempt %d failed: %s", link->attempts, err->msg);
  }
  uv_timer_start(&link->retry, on_retry,
                 (uint64_t)nh_backoff_ms(link->opts.backoff_first_ms, link->opts.backoff_max_ms, link->attempts), 0);
}

/* The store refuses this host for good: every waiting batch is told, and only close is
 * left. */
static void give_up(nh_pg_link_t *link, const nh_error_t *err)
{
  drop_conn(link);
  uv_timer_stop(&link->retry);
  link->err = *err;
  nh_log_error("store", "%s", err->msg);
  say_state(link, NH_PG_LINK_FAILED, err);
  while (link->head && !link->closing) {
    batch_t *b = link->head;
    link->head = b->next;
    if (!link->head) link->tail = NULL;
    link->waiting--;
    b->done(b->data, NH_PG_NOT_COMMITTED, err);
    free(b);
  }
}

static void became_ready(nh_pg_link_t *link)
{
  double down_s = (double)(uv_now(link->loop) - link->down_since) / 1000.0;
  if (link->state == NH_PG_LINK_LOST && link->stats.connects > 0)
    nh_log_info("store", "store %s: connected again at attempt %lld, after %.1f s without a connection",
                link->shown, (long long)(link->stats.attempts - link->down_attempts), down_s);
  else if (link->state == NH_PG_LINK_LOST)
    nh_log_info("store", "store %s: connected at attempt %lld, %.1f s after the first failed", link->shown,
                (long long)link->stats.attempts, down_s);
  else
    nh_log_debug("store", "store %s: connected", link->shown);
  link->stats.connects++;
  link->attempts = 0;
  memset(&link->err, 0, sizeof link->err);
  link->phase = P_IDLE;
  arm(link->conn, UV_READABLE);
  say_state(link, NH_PG_LINK_READY, NULL);
  advance(link);
}

/* "LISTEN a; LISTEN b" for the channels not yet listened to on c, after `first` (which
 * may be NULL); NULL when there is nothing to send. Marks them sent. */
static char *listen_sql(nh_pg_link_t *link, conn_t *c, const char *first)
{
  size_t len = first ? strlen(first) : 0, cap = len + 1;
  char *sql = nh_xmalloc(cap);
  memcpy(sql, first ? first : "", len + 1);
  for (int i = 0; i < link->nlisteners; i++) {
    listener_t *l = &link->listeners[i];
    if (l->sent) continue;
    char *q = PQescapeIdentifier(c->pg, l->channel, strlen(l->channel));
    if (!q) continue;   /* out of memory: the next connection tries again */
    size_t n = strlen(q);
    cap = len + n + 12;
    sql = nh_xrealloc(sql, cap);
    len += (size_t)snprintf(sql + len, cap - len, "%sLISTEN %s", len ? "; " : "", q);
    PQfreemem(q);
    l->sent = 1;
  }
  if (len == 0) {
    free(sql);
    return NULL;
  }
  return sql;
}

static void on_deadline(uv_timer_t *t);
static void query_step(nh_pg_link_t *link);

/* A simple query (several statements, one round trip) in phase `phase`, under the deadline. */
static void send_query(nh_pg_link_t *link, phase_t phase, const char *sql)
{
  conn_t *c = link->conn;
  c->results = 0;
  c->failed_at = -1;
  link->phase = phase;
  if (!PQsendQuery(c->pg, sql)) {
    nh_error_t e;
    nh_pg_explain_result(c->pg, NULL, phase == P_SETUP ? "reading the schema version" : "sending LISTEN", &e);
    connection_failed(link, &e);
    return;
  }
  uv_timer_start(&link->deadline, on_deadline, (uint64_t)link->opts.batch_timeout_ms, 0);
  query_step(link);
}

static void on_connected(void *data, PGconn *pg, const nh_error_t *err)
{
  nh_pg_link_t *link = data;
  link->connecting = NULL;
  if (link->closing) {
    PQfinish(pg);
    if (link->handles == 0) shutdown_link(link);
    return;
  }
  if (err) {
    connection_failed(link, err);
    return;
  }
  conn_t *c = nh_xcalloc(1, sizeof *c);
  c->link = link;
  c->pg = pg;
  c->db = nh_pg_db_new(pg);
  c->version = -1;
  c->chained = PQsetNoticeReceiver(pg, on_notice, c);
  int r = uv_poll_init(link->loop, &c->poll, PQsocket(pg));
  if (r < 0) {
    nh_error_t e;
    nh_error_set(&e, NH_EFAIL, "store %s: cannot watch the connection's socket on the loop: %s", link->shown,
                 uv_strerror(r));
    nh_pg_db_free(c->db);
    free(c);
    connection_failed(link, &e);
    return;
  }
  c->poll.data = c;
  link->handles++;
  link->conn = c;
  char *sql = listen_sql(link, c, "SELECT version FROM nimbus_schema");
  send_query(link, P_SETUP, sql);
  free(sql);
}

static void attempt(nh_pg_link_t *link)
{
  link->stats.attempts++;
  link->connecting = nh_pg_connect_start_with(link->loop, link->url, link->extra, on_connected, link);
}

static void on_retry(uv_timer_t *t)
{
  nh_pg_link_t *link = t->data;
  if (!link->closing) attempt(link);
}

/* ---------------------------------------------------------------- notifications */

static void deliver_notifies(nh_pg_link_t *link)
{
  conn_t *c = link->conn;
  PGnotify *n;
  while (c && !link->closing && (n = PQnotifies(c->pg)) != NULL) {
    for (int i = 0; i < link->nlisteners; i++)
      if (!strcmp(link->listeners[i].channel, n->relname)) {
        link->stats.notifies++;
        link->listeners[i].cb(link->listeners[i].data, n->relname, n->extra ? n->extra : "");
        break;
      }
    PQfreemem(n);
  }
}

/* ---------------------------------------------------------------- the first query, and LISTEN */

static void take_result(conn_t *c, PGresult *r)
{
  ExecStatusType st = PQresultStatus(r);
  if (c->results == 0 && st == PGRES_TUPLES_OK && c->link->phase == P_SETUP)
    c->version = PQntuples(r) > 0 && !PQgetisnull(r, 0, 0) ? atoi(PQgetvalue(r, 0, 0)) : 0;
  if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK && !c->failed) {
    c->failed = r;
    c->failed_at = c->results;
  } else {
    PQclear(r);
  }
  c->results++;
}

/* The store this host can run on: the schema version it migrated to at start. */
static int check_version(nh_pg_link_t *link, int v, nh_error_t *err)
{
  if (v == NH_PG_SCHEMA_VERSION) return NH_OK;
  if (v <= 0)
    return nh_error_set(err, NH_EFAIL, "store %s: the database holds no nimbus-host store (no schema version): "
                        "nimbus-host creates it when it starts; start it again with this store", link->shown);
  if (v > NH_PG_SCHEMA_VERSION)
    return nh_error_set(err, NH_EFAIL, "store %s: the store's schema is version %d, newer than this nimbus-host "
                        "knows (%d): a newer nimbus-host migrated it; upgrade this one before starting it again",
                        link->shown, v, NH_PG_SCHEMA_VERSION);
  return nh_error_set(err, NH_EFAIL, "store %s: the store's schema is version %d, older than this nimbus-host's "
                      "(%d), which it migrated at start (was an older backup restored?): start nimbus-host again "
                      "to migrate it", link->shown, v, NH_PG_SCHEMA_VERSION);
}

static void query_done(nh_pg_link_t *link)
{
  conn_t *c = link->conn;
  uv_timer_stop(&link->deadline);
  nh_error_t e;
  const char *doing = link->phase == P_SETUP ? "reading the schema version" : "sending LISTEN";
  if (PQstatus(c->pg) == CONNECTION_BAD) {
    nh_pg_explain_result(c->pg, c->failed, doing, &e);
    connection_failed(link, &e);
    return;
  }
  if (c->failed) {
    const char *code = PQresultErrorField(c->failed, PG_DIAG_SQLSTATE);
    if (link->phase == P_SETUP && c->failed_at == 0 && code && !strcmp(code, "42P01")) {   /* no nimbus_schema */
      check_version(link, 0, &e);
      give_up(link, &e);
      return;
    }
    /* a server that refuses these (a role without the right to read the table) may be
     * mended while we retry */
    nh_pg_explain_result(c->pg, c->failed, doing, &e);
    connection_failed(link, &e);
    return;
  }
  if (link->phase == P_SETUP) {
    if (check_version(link, c->version, &e)) {
      give_up(link, &e);
      return;
    }
    became_ready(link);
    return;
  }
  link->phase = P_IDLE;
  arm(c, UV_READABLE);
  advance(link);
}

/* Sends and reads what it can of the query under way, never waiting. */
static void query_step(nh_pg_link_t *link)
{
  conn_t *c = link->conn;
  int flush = PQflush(c->pg);
  int input = PQconsumeInput(c->pg);
  /* after a failed read libpq may still hand out results: the server's last words first */
  while (!PQisBusy(c->pg)) {
    PGresult *r = PQgetResult(c->pg);
    if (!r) {
      deliver_notifies(link);
      if (!link->closing) query_done(link);
      return;
    }
    take_result(c, r);
  }
  deliver_notifies(link);
  if (link->closing) return;
  if (flush < 0 || !input || PQstatus(c->pg) == CONNECTION_BAD) {
    nh_error_t e;
    nh_pg_explain_result(c->pg, c->failed, link->phase == P_SETUP ? "reading the schema version" : "sending LISTEN",
                         &e);
    connection_failed(link, &e);
    return;
  }
  arm(c, UV_READABLE | (flush > 0 ? UV_WRITABLE : 0));
}

/* ---------------------------------------------------------------- batches */

static void batch_over(nh_pg_link_t *link, nh_pg_batch_outcome_t outcome, const nh_error_t *err)
{
  batch_t *b = link->inflight;
  link->inflight = NULL;
  uv_timer_stop(&link->deadline);
  link->stats.batches++;
  b->done(b->data, outcome, outcome == NH_PG_COMMITTED ? NULL : err);
  free(b);
}

static void drive_batch(nh_pg_link_t *link)
{
  conn_t *c = link->conn;
  int rc = NH_OK;
  nh_error_t e = { 0 };
  int want = nh_pg_batch_poll(c->db, &rc, &e);   /* result callbacks may run (and close the link) */
  if (link->closing) return;
  deliver_notifies(link);
  if (link->closing) return;
  if (want) {
    arm(c, uv_events(want));
    return;
  }
  nh_pg_batch_outcome_t outcome = rc == NH_OK ? NH_PG_COMMITTED : nh_pg_batch_outcome(c->db);
  int broken = PQstatus(c->pg) == CONNECTION_BAD;
  /* a builder that gave up: its reason, unless the connection went meanwhile */
  const nh_error_t *why = link->build_failed && !broken ? &link->build_err : &e;
  batch_over(link, outcome, why);
  if (link->closing) return;
  if (broken) {
    if (!e.code) nh_pg_explain_result(c->pg, NULL, "ending a batch that committed", &e);   /* gone just after */
    connection_failed(link, &e);
    return;
  }
  link->phase = P_IDLE;
  arm(c, UV_READABLE);
  advance(link);
}

static void run_batch(nh_pg_link_t *link)
{
  conn_t *c = link->conn;
  batch_t *b = link->inflight;
  nh_error_t e = { 0 };
  link->build_failed = 0;
  if (nh_pg_batch_begin(c->db, &e) != NH_OK) {
    /* BEGIN alone commits nothing: the batch keeps its place for the next connection */
    b->next = link->head;
    link->head = b;
    if (!link->tail) link->tail = b;
    link->waiting++;
    link->inflight = NULL;
    connection_failed(link, &e);
    return;
  }
  link->in_build = 1;
  int rc = b->build(b->data, c->db, &e);
  link->in_build = 0;
  if (link->closing) {
    shutdown_link(link);
    return;
  }
  if (rc != NH_OK) {
    if (!e.code)
      nh_error_set(&e, rc, "store %s: a batch's builder failed (code %d) without saying why", link->shown, rc);
    link->build_failed = 1;
    link->build_err = e;
    nh_pg_batch_send_abandon(c->db, NULL);
  } else {
    nh_pg_batch_send_commit(c->db, NULL);
  }
  link->phase = P_BATCH;
  uv_timer_start(&link->deadline, on_deadline, (uint64_t)link->opts.batch_timeout_ms, 0);
  drive_batch(link);
}

/* Starts what waits, when the connection is ready and nothing runs on it: LISTEN for new
 * channels first, then the next batch. */
static void advance(nh_pg_link_t *link)
{
  if (link->closing || link->state != NH_PG_LINK_READY || !link->conn || link->phase != P_IDLE || link->inflight)
    return;
  char *sql = listen_sql(link, link->conn, NULL);
  if (sql) {
    send_query(link, P_LISTEN, sql);
    free(sql);
    return;
  }
  if (!link->head) return;
  link->inflight = link->head;
  link->head = link->head->next;
  if (!link->head) link->tail = NULL;
  link->waiting--;
  run_batch(link);
}

static void on_kick(uv_timer_t *t) { advance(t->data); }

static void kick(nh_pg_link_t *link)
{
  if (link->state == NH_PG_LINK_READY && link->phase == P_IDLE && !link->inflight)
    uv_timer_start(&link->kick, on_kick, 0, 0);
}

/* ---------------------------------------------------------------- the socket and the deadline */

static void idle_read(nh_pg_link_t *link)
{
  conn_t *c = link->conn;
  int input = PQconsumeInput(c->pg);
  deliver_notifies(link);
  if (link->closing) return;
  if (input && PQstatus(c->pg) != CONNECTION_BAD) return;
  char doing[400] = "idle";
  if (*c->said) snprintf(doing, sizeof doing, "idle, after the server said %s", c->said);
  nh_error_t e;
  nh_pg_explain_result(c->pg, NULL, doing, &e);
  connection_failed(link, &e);
}

static void on_poll(uv_poll_t *h, int status, int events)
{
  (void)events;
  conn_t *c = h->data;
  nh_pg_link_t *link = c->link;
  if (link->conn != c || link->closing) return;
  if (status < 0) {
    nh_error_t e;
    nh_error_set(&e, NH_EFAIL, "store %s: watching the connection's socket failed (%s): the connection was dropped",
                 link->shown, uv_strerror(status));
    if (link->phase == P_BATCH) {
      batch_over(link, nh_pg_batch_outcome(c->db), &e);
      if (link->closing) return;
    }
    connection_failed(link, &e);
    return;
  }
  switch (link->phase) {
  case P_SETUP:
  case P_LISTEN: query_step(link); break;
  case P_BATCH: drive_batch(link); break;
  case P_IDLE: idle_read(link); break;
  }
}

static void on_deadline(uv_timer_t *t)
{
  nh_pg_link_t *link = t->data;
  conn_t *c = link->conn;
  if (!c || link->closing) return;
  int ms = link->opts.batch_timeout_ms;
  nh_error_t e;
  if (link->phase == P_BATCH) {
    /* PQcancel would block the loop: the connection is dropped instead */
    nh_pg_batch_outcome_t outcome = nh_pg_batch_outcome(c->db);
    nh_error_set(&e, NH_EFAIL, "store %s: no answer to a batch within %d ms (batch_timeout_ms): the connection was "
                 "dropped, and %s", link->shown, ms,
                 outcome == NH_PG_UNKNOWN ? "whether the batch was committed is unknown (its COMMIT had been sent): "
                                            "read its rows back to know"
                                          : "nothing of the batch was committed");
    batch_over(link, outcome, &e);
    if (link->closing) return;
  } else {
    nh_error_set(&e, NH_EFAIL, "store %s: no answer within %d ms (batch_timeout_ms) to %s: the connection was "
                 "dropped; is the server overloaded?", link->shown, ms,
                 link->phase == P_SETUP ? "the schema version's query" : "LISTEN");
  }
  connection_failed(link, &e);
}

/* ---------------------------------------------------------------- what each connection carries */

/* libpq versions before 12 refuse a connection string naming tcp_user_timeout: asked of
 * the library loaded, not of the headers built against. */
static int libpq_knows(const char *keyword)
{
  PQconninfoOption *defs = PQconndefaults();
  int found = 0;
  for (const PQconninfoOption *o = defs; o && o->keyword && !found; o++) found = !strcmp(o->keyword, keyword);
  PQconninfoFree(defs);
  return found;
}

/* The deadline plus a margin, within what the server takes (an int of milliseconds). */
static long long beyond(int batch_timeout_ms, int margin_ms)
{
  long long ms = (long long)batch_timeout_ms + margin_ms;
  return ms > 2147483647LL ? 2147483647LL : ms;
}

const char *nh_pg_link_conninfo(int batch_timeout_ms, char *buf, size_t len)
{
  if (batch_timeout_ms <= 0) batch_timeout_ms = NH_PG_LINK_BATCH_TIMEOUT_MS;
  /* tcp_user_timeout matches the keepalives' worst case: the same 25 s, whether the
   * connection is idle (probes unanswered) or sending (data unacknowledged) */
  int user_timeout_s = NH_PG_LINK_KEEPALIVE_IDLE_S + NH_PG_LINK_KEEPALIVE_INTERVAL_S * NH_PG_LINK_KEEPALIVE_COUNT;
  char user_timeout[48] = "";
  if (libpq_knows("tcp_user_timeout"))
    snprintf(user_timeout, sizeof user_timeout, " tcp_user_timeout=%d", user_timeout_s * 1000);
  snprintf(buf, len, "keepalives=1 keepalives_idle=%d keepalives_interval=%d keepalives_count=%d%s "
           "options='-c statement_timeout=%lld -c idle_in_transaction_session_timeout=%lld'",
           NH_PG_LINK_KEEPALIVE_IDLE_S, NH_PG_LINK_KEEPALIVE_INTERVAL_S, NH_PG_LINK_KEEPALIVE_COUNT, user_timeout,
           beyond(batch_timeout_ms, NH_PG_LINK_STATEMENT_MARGIN_MS),
           beyond(batch_timeout_ms, NH_PG_LINK_IDLE_MARGIN_MS));
  return buf;
}

/* ---------------------------------------------------------------- the API */

static int check_opt(const char *name, int v, nh_error_t *err)
{
  if (v >= 0) return NH_OK;
  return nh_error_set(err, NH_EUSAGE, "store link option %s is %d: give a number of %s above 0 (0: the default)", name,
                      v, strcmp(name, "max_waiting") ? "milliseconds" : "batches");
}

int nh_pg_link_open(uv_loop_t *loop, const char *url, const nh_pg_link_opts_t *opts, nh_pg_link_t **out,
                    nh_error_t *err)
{
  *out = NULL;
  nh_pg_link_opts_t o = opts ? *opts : (nh_pg_link_opts_t){ 0 };
  if (check_opt("batch_timeout_ms", o.batch_timeout_ms, err) ||
      check_opt("backoff_first_ms", o.backoff_first_ms, err) || check_opt("backoff_max_ms", o.backoff_max_ms, err) ||
      check_opt("max_waiting", o.max_waiting, err))
    return NH_EUSAGE;
  if (!o.batch_timeout_ms) o.batch_timeout_ms = NH_PG_LINK_BATCH_TIMEOUT_MS;
  if (!o.backoff_first_ms) o.backoff_first_ms = NH_PG_LINK_BACKOFF_FIRST_MS;
  if (!o.backoff_max_ms) o.backoff_max_ms = NH_PG_LINK_BACKOFF_MAX_MS;
  if (!o.max_waiting) o.max_waiting = NH_PG_LINK_MAX_WAITING;
  if (o.backoff_first_ms > o.backoff_max_ms)
    return nh_error_set(err, NH_EUSAGE, "store link options: backoff_first_ms (%d) is above backoff_max_ms (%d): "
                        "the first delay cannot exceed the longest", o.backoff_first_ms, o.backoff_max_ms);
  int rc = nh_pg_url_check(url, err);
  if (rc) return rc;
  nh_pg_link_t *link = nh_xcalloc(1, sizeof *link);
  link->loop = loop;
  link->url = nh_xstrdup(url);
  link->shown = nh_pg_url_display(url);
  char extra[512];
  link->extra = nh_xstrdup(nh_pg_link_conninfo(o.batch_timeout_ms, extra, sizeof extra));
  link->opts = o;
  link->state = NH_PG_LINK_CONNECTING;
  link->phase = P_IDLE;
  uv_timer_t *timers[] = { &link->deadline, &link->retry, &link->kick };
  for (int i = 0; i < 3; i++) {
    uv_timer_init(loop, timers[i]);
    timers[i]->data = link;
  }
  link->handles = 3;
  attempt(link);
  *out = link;
  return NH_OK;
}

nh_pg_link_state_t nh_pg_link_state(const nh_pg_link_t *link) { return link->state; }
const nh_error_t *nh_pg_link_error(const nh_pg_link_t *link) { return &link->err; }
void nh_pg_link_stats(const nh_pg_link_t *link, nh_pg_link_stats_t *out) { *out = link->stats; }

int nh_pg_link_submit(nh_pg_link_t *link, nh_pg_link_build_cb build, nh_pg_link_done_cb done, void *data,
                      nh_error_t *err)
{
  if (!build || !done)
    return nh_error_set(err, NH_EUSAGE, "store %s: a batch needs a builder and a done callback (a bug of nimbus-host)",
                        link->shown);
  if (link->closing)
    return nh_error_set(err, NH_ESTATE, "store %s: the link to the store is closing: the batch was not queued",
                        link->shown);
  if (link->state == NH_PG_LINK_FAILED)
    return nh_error_set(err, NH_ESTATE, "%s; the batch was not queued", link->err.msg);
  if (link->waiting >= link->opts.max_waiting)
    return nh_error_set(err, NH_ESTATE, "store %s: %d batches already wait for the store (max_waiting)%s: this one "
                        "was not queued; submit it again once some are done", link->shown, link->waiting,
                        link->state == NH_PG_LINK_LOST ? ", which cannot be reached now"
                        : link->state == NH_PG_LINK_CONNECTING ? ", which is not connected yet" : "");
  batch_t *b = nh_xcalloc(1, sizeof *b);
  b->build = build;
  b->done = done;
  b->data = data;
  if (link->tail) link->tail->next = b;
  else link->head = b;
  link->tail = b;
  link->waiting++;
  kick(link);
  return NH_OK;
}

int nh_pg_link_listen(nh_pg_link_t *link, const char *channel, nh_pg_link_notify_cb cb, void *data, nh_error_t *err)
{
  if (!cb)
    return nh_error_set(err, NH_EUSAGE, "store %s: LISTEN on \"%s\" needs a callback (a bug of nimbus-host)",
                        link->shown, channel);
  if (link->closing || link->state == NH_PG_LINK_FAILED)
    return nh_error_set(err, NH_ESTATE, "store %s: the link to the store is %s: cannot LISTEN on \"%s\"", link->shown,
                        link->closing ? "closing" : "stopped", channel);
  size_t len = strlen(channel);
  if (len == 0 || len > 63 || !nh_pg_utf8_valid(channel, len))
    return nh_error_set(err, NH_EUSAGE, "store %s: LISTEN channel \"%s\": a channel name is 1 to 63 bytes of UTF-8",
                        link->shown, channel);
  for (int i = 0; i < link->nlisteners; i++)
    if (!strcmp(link->listeners[i].channel, channel))
      return nh_error_set(err, NH_EUSAGE, "store %s: channel \"%s\" is listened to already (one callback per channel)",
                          link->shown, channel);
  link->listeners = nh_xrealloc(link->listeners, sizeof *link->listeners * (size_t)(link->nlisteners + 1));
  link->listeners[link->nlisteners++] = (listener_t){ .channel = nh_xstrdup(channel), .cb = cb, .data = data };
  kick(link);
  return NH_OK;
}

/* ---------------------------------------------------------------- closing */

static void on_timer_closed(uv_handle_t *h)
{
  nh_pg_link_t *link = h->data;
  link->handles--;
  if (link->handles == 0 && !link->connecting) shutdown_link(link);
}

static void park_over(nh_pg_link_t *link, batch_t *b, nh_pg_batch_outcome_t outcome, const char *why)
{
  b->outcome = outcome;
  nh_error_set(&b->err, NH_ESTATE, "store %s: the link to the store was closed %s", link->shown, why);
  b->next = link->over;
  link->over = b;
}

/* The end, once every handle has closed: the batches' outcomes, CLOSED, the callback. */
static void finish_close(nh_pg_link_t *link)
{
  /* `over` holds them last first: turn it round, to say them in order */
  batch_t *list = NULL;
  while (link->over) {
    batch_t *b = link->over;
    link->over = b->next;
    b->next = list;
    list = b;
  }
  while (list) {
    batch_t *b = list;
    list = b->next;
    b->done(b->data, b->outcome, b->outcome == NH_PG_COMMITTED ? NULL : &b->err);
    free(b);
  }
  say_state(link, NH_PG_LINK_CLOSED, NULL);
  if (link->close_cb) link->close_cb(link->close_data);
  for (int i = 0; i < link->nlisteners; i++) free(link->listeners[i].channel);
  free(link->listeners);
  free(link->url);
  free(link->shown);
  free(link->extra);
  free(link);
}

/* Called by close (or by the builder's return, when close came from inside it), then by
 * each handle's close callback: the first call starts closing, the last (no handle left,
 * no attempt under way) finishes. */
static void shutdown_link(nh_pg_link_t *link)
{
  if (link->handles == 0 && !link->connecting) {
    finish_close(link);
    return;
  }
  if (link->shut) return;   /* started already: waiting for the handles */
  link->shut = 1;
  if (link->inflight) {
    batch_t *b = link->inflight;
    link->inflight = NULL;
    nh_pg_batch_outcome_t outcome = link->conn ? nh_pg_batch_outcome(link->conn->db) : NH_PG_NOT_COMMITTED;
    park_over(link, b, outcome, outcome == NH_PG_UNKNOWN
                                    ? "while a batch waited for its result: whether it was committed is unknown "
                                      "(its COMMIT had been sent); read its rows back to know"
                                    : "before the batch was committed: nothing of it was committed");
  }
  while (link->head) {
    batch_t *b = link->head;
    link->head = b->next;
    park_over(link, b, NH_PG_NOT_COMMITTED, "before the batch was sent: nothing of it was committed");
  }
  link->tail = NULL;
  link->waiting = 0;
  if (link->connecting) nh_pg_connect_cancel(link->connecting);   /* on_connected follows */
  drop_conn(link);
  uv_timer_t *timers[] = { &link->deadline, &link->retry, &link->kick };
  for (int i = 0; i < 3; i++) {
    uv_timer_stop(timers[i]);
    uv_close((uv_handle_t *)timers[i], on_timer_closed);
  }
}

void nh_pg_link_close(nh_pg_link_t *link, nh_pg_link_close_cb cb, void *data)
{
  if (link->closing) return;
  link->closing = 1;
  link->close_cb = cb;
  link->close_data = data;
  if (!link->in_build) shutdown_link(link);
}
