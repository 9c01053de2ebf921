/* Embedded transport. Queue rows are ordered by `seq`; a session's head is its lowest
 * seq. Session locks (session_locks) keep two processes sharing one file from running
 * the same session, and expire so a crashed process's sessions are picked up again. */
#include "nh_embedded.h"
#include "core/nh_log.h"
#include "core/nh_sqlite.h"
#include "core/nh_strset.h"
#include "core/nh_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const embedded_migrations[] = {
  "CREATE TABLE subscriptions (event_type TEXT NOT NULL, endpoint TEXT NOT NULL, command INTEGER NOT NULL DEFAULT 0,"
  "  PRIMARY KEY (event_type, endpoint)) WITHOUT ROWID;"
  "CREATE TABLE queue ("
  "  seq INTEGER PRIMARY KEY AUTOINCREMENT, endpoint TEXT NOT NULL, session_id TEXT NOT NULL,"
  "  message_id TEXT NOT NULL, event_id TEXT, event_type TEXT, message_type TEXT NOT NULL,"
  "  correlation_id TEXT, originating_message_id TEXT, parent_message_id TEXT, from_ TEXT,"
  "  retry_count INTEGER NOT NULL DEFAULT 0, delivery_count INTEGER NOT NULL DEFAULT 0,"
  "  releases INTEGER NOT NULL DEFAULT 0, reply_to TEXT,"
  "  enqueued_at INTEGER NOT NULL, visible_at INTEGER NOT NULL, body TEXT, error_text TEXT, error_type TEXT);"
  "CREATE INDEX queue_endpoint ON queue(endpoint, seq);"
  "CREATE TABLE session_locks (endpoint TEXT NOT NULL, session_id TEXT NOT NULL, owner TEXT,"
  "  locked_until INTEGER NOT NULL, PRIMARY KEY (endpoint, session_id)) WITHOUT ROWID;"
  "CREATE INDEX session_locks_owner ON session_locks(owner);"
  "CREATE TABLE dead_letters ("
  "  seq INTEGER PRIMARY KEY, endpoint TEXT NOT NULL, session_id TEXT, message_id TEXT, event_id TEXT,"
  "  event_type TEXT, message_type TEXT, body TEXT, reason TEXT, delivery_count INTEGER, at INTEGER NOT NULL);",
  /* 2: a session's queued rows without reading the rest of the endpoint's queue
   * (session_next parks a blocked session's backlog; it read every row after the head). */
  "CREATE INDEX queue_session ON queue(endpoint, session_id, seq);",
  /* 3: that index made every enqueue and settle write a page at a random place (half the
   * publish rate); session_next now takes the rows the head scan already saw. */
  "DROP INDEX queue_session;",
  /* 4: the W3C trace context travels with each message (docs/observability.md, Traces) */
  "ALTER TABLE queue ADD COLUMN traceparent TEXT;"
  "ALTER TABLE queue ADD COLUMN tracestate TEXT;",
  /* 5: the owner index served one query at start-up (reap_dead_owners), and cost every
   * session lock an index insert and every unlock an index delete: a second B-tree
   * written twice per event. The table holds only locked (and recently released)
   * sessions, so the start-up scan reads a few pages. */
  "DROP INDEX session_locks_owner;",
};

enum {
  Q_SUB_DEL, Q_SUB_ADD, Q_SUB_CONFLICT, Q_SUBSCRIBERS, Q_INSERT, Q_HEADS, Q_LOCK, Q_UNLOCK, Q_RENEW, Q_DELIVERED,
  Q_DELETE, Q_DEAD, Q_RELEASE_LOCK, Q_RELEASED, Q_OWNERS, Q_ROW, Q_DROP_OWNER, Q_COUNT
};

static const char *const q_sql[Q_COUNT] = {
  [Q_SUB_DEL] = "DELETE FROM subscriptions WHERE endpoint = ?1",
  [Q_SUB_ADD] = "INSERT OR REPLACE INTO subscriptions(event_type, endpoint, command) VALUES (?1, ?2, ?3)",
  /* other endpoints consuming this type, when one of the two declares it a command */
  [Q_SUB_CONFLICT] =
    "SELECT endpoint FROM subscriptions WHERE event_type = ?1 AND endpoint <> ?2 AND (command = 1 OR ?3 = 1)",
  [Q_SUBSCRIBERS] = "SELECT endpoint FROM subscriptions WHERE event_type = ?1 ORDER BY endpoint",
  [Q_INSERT] =
    "INSERT INTO queue(endpoint, session_id, message_id, event_id, event_type, message_type, correlation_id,"
    " originating_message_id, parent_message_id, from_, retry_count, enqueued_at, visible_at, body,"
    " error_text, error_type, reply_to, traceparent, tracestate)"
    " VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?12,?13,?14,?15,?16,?17,?18)",
  /* Rows of sessions locked by anyone (this process included: a lock of ours means the
   * session is in flight here) are filtered here; the C side keeps only the first
   * row it sees of each session, which is that session's head. */
  [Q_HEADS] =
    "SELECT seq, session_id, message_id, event_id, event_type, message_type, correlation_id,"
    " originating_message_id, parent_message_id, from_, retry_count, delivery_count, enqueued_at,"
    " visible_at, body, error_text, error_type, releases, reply_to, traceparent, tracestate FROM queue q WHERE q.endpoint = ?1 AND NOT EXISTS"
    " (SELECT 1 FROM session_locks l WHERE l.endpoint = ?1 AND l.session_id = q.session_id"
    "  AND l.locked_until > ?2) ORDER BY q.seq LIMIT ?3",
  [Q_LOCK] =
    "INSERT INTO session_locks(endpoint, session_id, owner, locked_until) VALUES (?1, ?2, ?3, ?4)"
    " ON CONFLICT(endpoint, session_id) DO UPDATE SET owner = excluded.owner, locked_until = excluded.locked_until"
    " WHERE session_locks.locked_until <= ?5",
  [Q_UNLOCK] = "DELETE FROM session_locks WHERE endpoint = ?1 AND session_id = ?2 AND owner = ?3",
  [Q_RENEW] = "UPDATE session_locks SET locked_until = ?4 WHERE endpoint = ?1 AND session_id = ?2 AND owner = ?3",
  /* a transient release is not a failed delivery: give the count back, count the release */
  [Q_RELEASED] = "UPDATE queue SET delivery_count = max(delivery_count - 1, 0), releases = releases + 1 WHERE seq = ?1",
  [Q_DELIVERED] = "UPDATE queue SET delivery_count = delivery_count + 1 WHERE seq = ?1",
  [Q_DELETE] = "DELETE FROM queue WHERE seq = ?1",
  [Q_DEAD] =
    "INSERT INTO dead_letters(seq, endpoint, session_id, message_id, event_id, event_type, message_type, body,"
    " reason, delivery_count, at) SELECT seq, endpoint, session_id, message_id, event_id, event_type,"
    " message_type, body, ?2, delivery_count, ?3 FROM queue WHERE seq = ?1",
  /* A released message keeps its place; holding the session (no owner) until the delay
   * ends keeps the session's later messages behind it. Only our own lock is turned. */
  [Q_RELEASE_LOCK] =
    "UPDATE session_locks SET owner = NULL, locked_until = ?3 WHERE endpoint = ?1 AND session_id = ?2 AND owner = ?4",
  [Q_OWNERS] = "SELECT DISTINCT owner FROM session_locks WHERE owner IS NOT NULL",
  /* one row a head scan saw, if it is still there (session_next) */
  [Q_ROW] =
    "SELECT seq, session_id, message_id, event_id, event_type, message_type, correlation_id,"
    " originating_message_id, parent_message_id, from_, retry_count, delivery_count, enqueued_at,"
    " visible_at, body, error_text, error_type, releases, reply_to, traceparent, tracestate FROM queue"
    " WHERE seq = ?1 AND endpoint = ?2 AND session_id = ?3",
  [Q_DROP_OWNER] = "DELETE FROM session_locks WHERE owner = ?1",
};

/* A row the last head scan passed over because its session's head came first. */
typedef struct follower {
  int64_t seq;
  uint64_t session_hash;
} follower_t;

typedef struct embedded {
  nh_transport_t base;
  sqlite3 *db;
  char *owner;
  /* The later rows of each session seen by the last head scan, in seq order (see
   * emb_session_next): up to one scan of them, replaced by the next scan. */
  char *fol_endpoint;
  follower_t *fol;
  int nfol, fol_cap;
  nh_embedded_sent_cb sent_cb;   /* told each copy a send queued (the CLI prints the EventIds) */
  void *sent_data;
  sqlite3_stmt *q[Q_COUNT];
} embedded_t;

static int step(embedded_t *e, int id, const char *what)
{
  return nh_sqlite_step_done(e->db, e->q[id], what);
}

/* Another endpoint (not one of `skip`) consuming `type`, when one of the two declares
 * it a command: NH_EUSAGE with both names, else NH_OK. */
static int sub_conflict(embedded_t *e, const char *endpoint, const char *type, int cmd, const char *const *skip,
                        int nskip, nh_error_t *err)
{
  sqlite3_stmt *c = e->q[Q_SUB_CONFLICT];
  nh_sqlite_bind_static(c, 1, type);
  nh_sqlite_bind_static(c, 2, endpoint);
  sqlite3_bind_int(c, 3, cmd);
  char *other = NULL;
  while (!other && sqlite3_step(c) == SQLITE_ROW) {
    const char *o = (const char *)sqlite3_column_text(c, 0);
    int skipped = 0;
    for (int k = 0; k < nskip; k++) skipped |= strcmp(o, skip[k]) == 0;
    if (!skipped) other = nh_xstrdup(o);
  }
  sqlite3_reset(c);
  sqlite3_clear_bindings(c);
  if (!other) return NH_OK;
  nh_embedded_conflict(err, type, other);
  free(other);
  return NH_EUSAGE;
}

int nh_embedded_conflict(nh_error_t *err, const char *type, const char *other)
{
  return nh_error_set(err, NH_EUSAGE,
                      "%s is a command and can have exactly one consuming endpoint, but %s already consumes it; "
                      "remove one of the handlers (a stale registration of an endpoint that no longer exists is "
                      "cleared by starting it once without the handler)",
                      type, other);
}

static int emb_subscribe_check(nh_transport_t *t, const char *endpoint, const char *const *types, const int *commands,
                               int n, const char *const *replacing, int nreplacing, nh_error_t *err)
{
  embedded_t *e = (embedded_t *)t;
  for (int i = 0; i < n; i++) {
    int rc = sub_conflict(e, endpoint, types[i], commands && commands[i], replacing, nreplacing, err);
    if (rc) return rc;
  }
  return NH_OK;
}

static int emb_subscribe(nh_transport_t *t, const char *endpoint, const char *const *types, const int *commands, int n,
                         nh_error_t *err)
{
  embedded_t *e = (embedded_t *)t;
  nh_sqlite_bind_static(e->q[Q_SUB_DEL], 1, endpoint);
  if (step(e, Q_SUB_DEL, "unsubscribe"))
    return nh_error_set(err, NH_EFAIL, "subscribing %s: %s", endpoint, sqlite3_errmsg(e->db));
  for (int i = 0; i < n; i++) {
    int cmd = commands && commands[i];
    int rc = sub_conflict(e, endpoint, types[i], cmd, NULL, 0, err);
    if (rc) return rc;
    nh_sqlite_bind_static(e->q[Q_SUB_ADD], 1, types[i]);
    nh_sqlite_bind_static(e->q[Q_SUB_ADD], 2, endpoint);
    sqlite3_bind_int(e->q[Q_SUB_ADD], 3, cmd);
    if (step(e, Q_SUB_ADD, "subscribe"))
      return nh_error_set(err, NH_EFAIL, "subscribing %s: %s", endpoint, sqlite3_errmsg(e->db));
  }
  return NH_OK;
}

static int emb_lock_session(nh_transport_t *t, const char *endpoint, const char *session, int64_t now)
{
  embedded_t *e = (embedded_t *)t;
  sqlite3_stmt *st = e->q[Q_LOCK];
  nh_sqlite_bind_static(st, 1, endpoint);
  nh_sqlite_bind_static(st, 2, session);
  nh_sqlite_bind_static(st, 3, e->owner);
  sqlite3_bind_int64(st, 4, now + t->lock_ms);
  sqlite3_bind_int64(st, 5, now);
  if (step(e, Q_LOCK, "session lock")) return NH_EFAIL;
  return sqlite3_changes(e->db) > 0;
}

/* Reads a queue row selected with the columns of Q_HEADS into m (owned strings). */
static void read_row(sqlite3_stmt *st, const char *endpoint, nh_msg_t *m)
{
  memset(m, 0, sizeof *m);
  m->seq = sqlite3_column_int64(st, 0);
  m->endpoint = nh_xstrdup(endpoint);
  m->session_id = nh_sqlite_col_strdup(st, 1);
  m->message_id = nh_sqlite_col_strdup(st, 2);
  m->event_id = nh_sqlite_col_strdup(st, 3);
  m->event_type = nh_sqlite_col_strdup(st, 4);
  m->type = nh_msg_type_parse((const char *)sqlite3_column_text(st, 5));
  m->correlation_id = nh_sqlite_col_strdup(st, 6);
  m->originating_message_id = nh_sqlite_col_strdup(st, 7);
  m->parent_message_id = nh_sqlite_col_strdup(st, 8);
  m->from = nh_sqlite_col_strdup(st, 9);
  m->retry_count = sqlite3_column_int(st, 10);
  m->delivery_count = sqlite3_column_int(st, 11) + 1;
  m->enqueued_at = sqlite3_column_int64(st, 12);
  m->body = nh_sqlite_col_body(st, 14, &m->body_len);
  m->error_text = nh_sqlite_col_strdup(st, 15);
  m->error_type = nh_sqlite_col_strdup(st, 16);
  m->release_count = sqlite3_column_int(st, 17);
  m->reply_to = nh_sqlite_col_strdup(st, 18);
  m->traceparent = nh_sqlite_col_strdup(st, 19);
  m->tracestate = nh_sqlite_col_strdup(st, 20);
}

static int emb_receive(nh_transport_t *t, const char *endpoint, int max, int64_t now)
{
  embedded_t *e = (embedded_t *)t;
  if (max <= 0) return 0;
  sqlite3_stmt *st = e->q[Q_HEADS];
  int scan = max * 4 + 256;   /* room for a batch of followers even when max is 1 */
  nh_sqlite_bind_static(st, 1, endpoint);
  sqlite3_bind_int64(st, 2, now);
  sqlite3_bind_int(st, 3, scan);
  nh_strset_t seen;
  nh_strset_init(&seen, (size_t)max);   /* it grows if the scan meets more sessions */
  if (!e->fol_endpoint || strcmp(e->fol_endpoint, endpoint) != 0) {
    free(e->fol_endpoint);
    e->fol_endpoint = nh_xstrdup(endpoint);
  }
  e->nfol = 0;
  /* Read the heads first, then lock: writes must not interleave with the open scan. */
  int n = 0, cap = 0;
  nh_msg_t *heads = NULL;   /* grown as rows come: an idle poll allocates nothing */
  while (sqlite3_step(st) == SQLITE_ROW) {
    const char *session = (const char *)sqlite3_column_text(st, 1);
    /* With every head taken, the scan goes on only through later rows of sessions it
     * has seen (a blocked session's backlog, for session_next) and ends at a new one. */
    int follower = n == max ? nh_strset_has(&seen, session) : !nh_strset_add(&seen, session);
    if (n == max && !follower) break;
    if (follower) {
      if (e->nfol == e->fol_cap) {
        e->fol_cap = e->fol_cap ? e->fol_cap * 2 : 256;
        e->fol = nh_xrealloc(e->fol, sizeof *e->fol * (size_t)e->fol_cap);
      }
      e->fol[e->nfol++] = (follower_t){sqlite3_column_int64(st, 0), nh_strset_hash(session)};
      continue;
    }
    if (sqlite3_column_int64(st, 13) > now) continue;   /* head not visible yet: session waits */
    if (n == cap) {
      cap = cap ? cap * 2 : 16;
      heads = nh_xrealloc(heads, sizeof *heads * (size_t)cap);
    }
    nh_msg_t *m = &heads[n++];
    read_row(st, endpoint, m);
  }
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  nh_strset_free(&seen);

  int delivered = 0;
  for (int i = 0; i < n; i++) {
    nh_msg_t *m = &heads[i];
    if (emb_lock_session(t, endpoint, m->session_id, now) == 1) {
      sqlite3_bind_int64(e->q[Q_DELIVERED], 1, m->seq);
      step(e, Q_DELIVERED, "delivery count");
      nh_msg_t *owned = nh_xmalloc(sizeof *owned);
      *owned = *m;
      t->on_message(t->cb_data, owned);
      delivered++;
    } else {
      nh_msg_clear(m);
    }
  }
  free(heads);
  return delivered;
}

/* Returns 1 if we held the lock, 0 if not (it expired and another owner took it). */
static int emb_unlock_session(nh_transport_t *t, const char *endpoint, const char *session)
{
  embedded_t *e = (embedded_t *)t;
  nh_sqlite_bind_static(e->q[Q_UNLOCK], 1, endpoint);
  nh_sqlite_bind_static(e->q[Q_UNLOCK], 2, session);
  nh_sqlite_bind_static(e->q[Q_UNLOCK], 3, e->owner);
  if (step(e, Q_UNLOCK, "session unlock")) return NH_EFAIL;
  return sqlite3_changes(e->db) > 0;
}

static int emb_renew(nh_transport_t *t, const char *endpoint, const char *session, int64_t now)
{
  embedded_t *e = (embedded_t *)t;
  nh_sqlite_bind_static(e->q[Q_RENEW], 1, endpoint);
  nh_sqlite_bind_static(e->q[Q_RENEW], 2, session);
  nh_sqlite_bind_static(e->q[Q_RENEW], 3, e->owner);
  sqlite3_bind_int64(e->q[Q_RENEW], 4, now + t->lock_ms);
  if (step(e, Q_RENEW, "lock renew")) return NH_EFAIL;
  return sqlite3_changes(e->db) > 0;
}

static int emb_settle(nh_transport_t *t, const nh_msg_t *m, nh_settle_t how, int64_t delay_ms, const char *reason)
{
  embedded_t *e = (embedded_t *)t;
  /* Retries and parked replays are not queue rows: only a release (which holds the
   * session) applies to them. */
  if (m->seq <= 0 && how != NH_SETTLE_RELEASE) return NH_OK;
  switch (how) {
  case NH_SETTLE_COMPLETE:
    sqlite3_bind_int64(e->q[Q_DELETE], 1, m->seq);
    return step(e, Q_DELETE, "settle complete");
  case NH_SETTLE_DEAD_LETTER:
    sqlite3_bind_int64(e->q[Q_DEAD], 1, m->seq);
    nh_sqlite_bind_static(e->q[Q_DEAD], 2, reason);
    sqlite3_bind_int64(e->q[Q_DEAD], 3, nh_time_now_ms());
    if (step(e, Q_DEAD, "dead-letter")) return NH_EFAIL;
    sqlite3_bind_int64(e->q[Q_DELETE], 1, m->seq);
    return step(e, Q_DELETE, "dead-letter delete");
  case NH_SETTLE_RELEASE:
    if (delay_ms <= 0) return emb_unlock_session(t, m->endpoint, m->session_id) < 0 ? NH_EFAIL : NH_OK;
    if (m->seq > 0) {
      sqlite3_bind_int64(e->q[Q_RELEASED], 1, m->seq);
      if (step(e, Q_RELEASED, "release count")) return NH_EFAIL;
    }
    nh_sqlite_bind_static(e->q[Q_RELEASE_LOCK], 1, m->endpoint);
    nh_sqlite_bind_static(e->q[Q_RELEASE_LOCK], 2, m->session_id);
    sqlite3_bind_int64(e->q[Q_RELEASE_LOCK], 3, nh_time_now_ms() + delay_ms);
    nh_sqlite_bind_static(e->q[Q_RELEASE_LOCK], 4, e->owner);
    return step(e, Q_RELEASE_LOCK, "release");
  }
  return NH_EFAIL;
}

static int insert_copy(embedded_t *e, const nh_msg_t *m, const char *endpoint, const char *event_id)
{
  sqlite3_stmt *st = e->q[Q_INSERT];
  nh_sqlite_bind_static(st, 1, endpoint);
  nh_sqlite_bind_static(st, 2, m->session_id);
  nh_sqlite_bind_static(st, 3, m->message_id);
  nh_sqlite_bind_static(st, 4, event_id);
  nh_sqlite_bind_static(st, 5, m->event_type);
  nh_sqlite_bind_static(st, 6, nh_msg_type_name(m->type));
  nh_sqlite_bind_static(st, 7, m->correlation_id);
  nh_sqlite_bind_static(st, 8, m->originating_message_id);
  nh_sqlite_bind_static(st, 9, m->parent_message_id);
  nh_sqlite_bind_static(st, 10, m->from);
  sqlite3_bind_int(st, 11, m->retry_count);
  sqlite3_bind_int64(st, 12, m->enqueued_at ? m->enqueued_at : nh_time_now_ms());
  if (m->body) sqlite3_bind_text(st, 13, m->body, (int)m->body_len, SQLITE_STATIC);
  else sqlite3_bind_null(st, 13);
  nh_sqlite_bind_static(st, 14, m->error_text);
  nh_sqlite_bind_static(st, 15, m->error_type);
  nh_sqlite_bind_static(st, 16, m->reply_to);
  nh_sqlite_bind_static(st, 17, m->traceparent);
  nh_sqlite_bind_static(st, 18, m->tracestate);
  return step(e, Q_INSERT, "enqueue");
}

static int emb_send(nh_transport_t *t, const nh_msg_t *m, const char *to_endpoint, int *copies, nh_error_t *err)
{
  embedded_t *e = (embedded_t *)t;
  *copies = 0;
  if (to_endpoint) {
    char fresh[37];
    const char *eid = m->event_id;
    if (!eid) {
      nh_uuid_v7(fresh);
      eid = fresh;
    }
    if (insert_copy(e, m, to_endpoint, eid))
      return nh_error_set(err, NH_EFAIL, "enqueue to %s: %s", to_endpoint, sqlite3_errmsg(e->db));
    *copies = 1;
    if (e->sent_cb) e->sent_cb(e->sent_data, to_endpoint, eid);
    return NH_OK;
  }
  /* Fan-out: collect subscribers first, then insert (no writes during the scan). */
  sqlite3_stmt *st = e->q[Q_SUBSCRIBERS];
  nh_sqlite_bind_static(st, 1, m->event_type);
  char **eps = NULL;
  int n = 0;
  while (sqlite3_step(st) == SQLITE_ROW) {
    eps = nh_xrealloc(eps, sizeof *eps * (size_t)(n + 1));
    eps[n++] = nh_sqlite_col_strdup(st, 0);
  }
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  int rc = NH_OK;
  for (int i = 0; i < n; i++) {
    char eid[37];
    nh_uuid_v7(eid);   /* each consuming endpoint's copy is its own audit event */
    if (rc == NH_OK && insert_copy(e, m, eps[i], eid))
      rc = nh_error_set(err, NH_EFAIL, "enqueue to %s: %s", eps[i], sqlite3_errmsg(e->db));
    else if (rc == NH_OK) {
      (*copies)++;
      if (e->sent_cb) e->sent_cb(e->sent_data, eps[i], eid);
    }
    free(eps[i]);
  }
  free(eps);
  return rc;
}

static void emb_close(nh_transport_t *t)
{
  embedded_t *e = (embedded_t *)t;
  for (int i = 0; i < Q_COUNT; i++) sqlite3_finalize(e->q[i]);
  free(e->fol_endpoint);
  free(e->fol);
  free(e->owner);
  free(e);
}

/* Owners are "host:pid:tag". A lock held by a dead process on this machine would
 * otherwise keep its sessions idle until the lock expires; free those at once. */
static void reap_dead_owners(embedded_t *e)
{
  char *dead[64];
  int n = 0;
  sqlite3_stmt *st = e->q[Q_OWNERS];
  while (n < 64 && sqlite3_step(st) == SQLITE_ROW) {
    const char *o = (const char *)sqlite3_column_text(st, 0);
    if (nh_owner_dead(o)) dead[n++] = nh_xstrdup(o);
  }
  sqlite3_reset(st);
  for (int i = 0; i < n; i++) {
    nh_sqlite_bind_static(e->q[Q_DROP_OWNER], 1, dead[i]);
    if (step(e, Q_DROP_OWNER, "drop dead owner") == NH_OK && sqlite3_changes(e->db) > 0)
      nh_log_info("embedded", "released session locks of %s (process no longer running)", dead[i]);
    free(dead[i]);
  }
}

/* The session's next rows come from the last head scan instead of a query of their own
 * (an index on (endpoint, session_id, seq) would cost every enqueue and settle a write at
 * a random page). That is complete: the scan reads the endpoint's rows in seq order, and
 * the rows committed by then form a prefix of seq (writers are serialised and seq only
 * grows), so a session that was not locked during the scan had all its rows up to the
 * scan's last one seen, in order. A session locked during the scan (ours since an
 * earlier receive) has no followers: its later rows come with later receives, as they
 * would without this. Each row is read again by seq; a gone or not yet visible row ends
 * the batch, so what is handed over is always the next rows of the session, in order. */
static int emb_session_next(nh_transport_t *t, const char *endpoint, const char *session, int64_t after_seq, int max,
                            nh_msg_t *out, int64_t now)
{
  embedded_t *e = (embedded_t *)t;
  if (!e->fol_endpoint || strcmp(e->fol_endpoint, endpoint) != 0) return 0;
  uint64_t h = nh_strset_hash(session);
  sqlite3_stmt *st = e->q[Q_ROW];
  int n = 0;
  for (int i = 0; i < e->nfol && n < max; i++) {
    if (e->fol[i].session_hash != h || e->fol[i].seq <= after_seq) continue;
    sqlite3_bind_int64(st, 1, e->fol[i].seq);
    nh_sqlite_bind_static(st, 2, endpoint);
    nh_sqlite_bind_static(st, 3, session);   /* a hash collision finds no row: the batch ends */
    int found = sqlite3_step(st) == SQLITE_ROW && sqlite3_column_int64(st, 13) <= now;
    if (found) read_row(st, endpoint, &out[n++]);
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    if (!found) break;   /* gone, or not visible yet: it and what follows wait */
  }
  /* No delivery counts: the caller settles what it takes in this same transaction, and
   * what it leaves is delivered (and counted) by a later receive. */
  return n;
}

static const nh_transport_vtbl_t embedded_vtbl = {
  .name = "embedded",
  .subscribe = emb_subscribe,
  .subscribe_check = emb_subscribe_check,
  .receive = emb_receive,
  .lock_session = emb_lock_session,
  .session_next = emb_session_next,
  .unlock_session = emb_unlock_session,
  .renew = emb_renew,
  .settle = emb_settle,
  .send = emb_send,
  .close = emb_close,
};

nh_transport_t *nh_embedded_init(sqlite3 *db, const char *owner, nh_error_t *err)
{
  if (nh_sqlite_migrate(db, "embedded", embedded_migrations,
                        (int)(sizeof embedded_migrations / sizeof embedded_migrations[0]), err))
    return NULL;
  embedded_t *e = nh_xcalloc(1, sizeof *e);
  e->base.vt = &embedded_vtbl;
  e->base.caps = NH_CAP_LOCK_EXPIRES | NH_CAP_BROKER_SESSIONS | NH_CAP_SCHEDULED_SEND | NH_CAP_DEAD_LETTER |
                 NH_CAP_ATOMIC_SETTLE;
  e->base.lock_ms = 30000;
  e->db = db;
  e->owner = nh_xstrdup(owner);
  for (int i = 0; i < Q_COUNT; i++) {
    if (sqlite3_prepare_v3(db, q_sql[i], -1, SQLITE_PREPARE_PERSISTENT, &e->q[i], NULL) != SQLITE_OK) {
      nh_error_set(err, NH_EFAIL, "embedded transport: %s", sqlite3_errmsg(db));
      emb_close(&e->base);
      return NULL;
    }
  }
  reap_dead_owners(e);
  return &e->base;
}

int nh_embedded_list(sqlite3 *db, const char *endpoint, const char *session, int want_running, int64_t now, int limit,
                     int (*cb)(void *data, const nh_queued_row_t *r), void *data)
{
  /* A live lock with an owner means the session's head is in a handler (an owner-less
   * lock is a transient delay: still queued). The head is the session's lowest seq: the
   * first row of a locked session this scan meets, since it reads whole sessions in seq
   * order; `locked` remembers the locked sessions met (at most the running ones). */
  char sql[1024];
  snprintf(sql, sizeof sql,
           "SELECT q.endpoint, q.session_id, q.event_id, q.event_type, q.message_type, l.owner, q.enqueued_at,"
           " q.visible_at, q.delivery_count"
           " FROM queue q LEFT JOIN session_locks l ON l.endpoint = q.endpoint AND l.session_id = q.session_id"
           "  AND l.locked_until > ?3 WHERE %s %s ORDER BY q.seq",
           endpoint ? "q.endpoint = ?1" : "q.endpoint NOT LIKE '\\_reply.%' ESCAPE '\\'",
           session ? "AND q.session_id = ?2" : "");
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) return NH_EFAIL;
  nh_sqlite_bind_static(st, 1, endpoint);
  nh_sqlite_bind_static(st, 2, session);
  sqlite3_bind_int64(st, 3, now);
  int n = 0, rc;
  nh_strset_t locked;
  nh_strset_init(&locked, 64);
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    nh_queued_row_t r = {
      .endpoint = (const char *)sqlite3_column_text(st, 0),
      .session_id = (const char *)sqlite3_column_text(st, 1),
      .event_id = (const char *)sqlite3_column_text(st, 2),
      .event_type = (const char *)sqlite3_column_text(st, 3),
      .message_type = (const char *)sqlite3_column_text(st, 4),
      .enqueued_at = sqlite3_column_int64(st, 6),
      .visible_at = sqlite3_column_int64(st, 7),
      .delivery_count = sqlite3_column_int(st, 8),
    };
    if (sqlite3_column_type(st, 5) != SQLITE_NULL) r.running = nh_queued_running(&locked, r.endpoint, r.session_id);
    r.owner = r.running ? (const char *)sqlite3_column_text(st, 5) : NULL;
    if (r.running != want_running) continue;
    n++;
    if (cb(data, &r) || (limit > 0 && n >= limit)) {
      rc = SQLITE_DONE;
      break;
    }
  }
  sqlite3_finalize(st);
  nh_strset_free(&locked);
  return rc == SQLITE_DONE ? n : NH_EFAIL;
}

void nh_embedded_on_sent(nh_transport_t *t, nh_embedded_sent_cb cb, void *data)
{
  embedded_t *e = (embedded_t *)t;
  e->sent_cb = cb;
  e->sent_data = data;
}

int nh_embedded_endpoint_known(sqlite3 *db, const char *endpoint, char *known, size_t len)
{
  /* endpoints that ever subscribed here (a host registers its handled types at start) */
  sqlite3_stmt *st = NULL;
  known[0] = '\0';
  if (sqlite3_prepare_v2(db, "SELECT DISTINCT endpoint FROM subscriptions WHERE endpoint NOT LIKE '\\_reply.%' "
                             "ESCAPE '\\' ORDER BY endpoint", -1, &st, NULL) != SQLITE_OK)
    return NH_EFAIL;
  int found = 0;
  size_t n = 0;
  while (sqlite3_step(st) == SQLITE_ROW) {
    const char *ep = (const char *)sqlite3_column_text(st, 0);
    if (strcmp(ep, endpoint) == 0) found = 1;
    if (n + strlen(ep) + 3 < len) n += (size_t)snprintf(known + n, len - n, "%s%s", n ? ", " : "", ep);
  }
  sqlite3_finalize(st);
  return found;
}
