/* Unit tests for transport/nh_embedded.c: subscriptions and fan-out, direct sends,
 * session-head delivery, session locks across two "processes" (two transports on two
 * sqlite connections to one file), lock expiry and renewal, settlement and
 * Time is driven through the `now` argument, never by sleeping. */
#include "nh_test.h"
#include "nh_test_sql.h"

#include "core/nh_log.h"
#include "core/nh_util.h"
#include "store/nh_store.h"
#include "transport/nh_embedded.h"

#include <sqlite3.h>
#include <sys/wait.h>

/* ---------------------------------------------------------------- fixture */

#define MAX_GOT 64

typedef struct proc {
  nh_store_t *store;
  nh_transport_t *tr;
  int ngot;
  nh_msg_t *got[MAX_GOT];
  int overflow;
} proc_t;

/* Runs inside the transport: never asserts (a longjmp would cross sqlite frames). */
static void on_msg(void *data, nh_msg_t *m)
{
  proc_t *p = data;
  if (p->ngot >= MAX_GOT) {
    p->overflow = 1;
    nh_msg_clear(m);
    free(m);
    return;
  }
  p->got[p->ngot++] = m;
}

static void proc_forget(proc_t *p)
{
  for (int i = 0; i < p->ngot; i++) {
    nh_msg_clear(p->got[i]);
    free(p->got[i]);
  }
  p->ngot = 0;
}

static void proc_free(void *arg)
{
  proc_t *p = arg;
  proc_forget(p);
  if (p->tr) p->tr->vt->close(p->tr);
  nh_store_close(p->store);
  free(p);
}

/* A "process": its own sqlite connection to the test's store and its own transport. */
static proc_t *proc_open(const char *owner)
{
  proc_t *p = calloc(1, sizeof *p);
  nh_test_on_cleanup(proc_free, p);
  nh_error_t err = {0};
  if (nh_store_open(&p->store, nh_test_path("nimbus.db"), NH_STORE_CREATE, &err)) FAIL("store open: %s", err.msg);
  p->tr = nh_embedded_init(nh_store_db(p->store), owner, &err);
  if (!p->tr) FAIL("nh_embedded_init: %s", err.msg);
  p->tr->on_message = on_msg;
  p->tr->cb_data = p;
  return p;
}

static void proc_close(proc_t *p)
{
  nh_test_cancel_cleanup(proc_free, p);
  proc_free(p);
}

static int receive(proc_t *p, const char *ep, int max, int64_t now)
{
  proc_forget(p);
  int n = p->tr->vt->receive(p->tr, ep, max, now);
  if (p->overflow) FAIL("more than %d deliveries", MAX_GOT);
  if (n != p->ngot) FAIL("receive returned %d but delivered %d", n, p->ngot);
  return n;
}

static void subscribe(proc_t *p, const char *ep, const char *t1, const char *t2)
{
  const char *types[2] = { t1, t2 };
  nh_error_t err = {0};
  if (p->tr->vt->subscribe(p->tr, ep, types, NULL, t2 ? 2 : 1, &err)) FAIL("subscribe %s: %s", ep, err.msg);
}

/* Sends one message; to == NULL fans out. Returns the number of copies. */
static int send_msg(proc_t *p, const char *to, nh_msg_type_t type, const char *event_type, const char *session,
                    const char *event_id, const char *message_id, const char *body)
{
  nh_msg_t m;
  memset(&m, 0, sizeof m);
  m.session_id = (char *)session;
  m.message_id = (char *)message_id;
  m.event_id = (char *)event_id;
  m.event_type = (char *)event_type;
  m.type = type;
  m.correlation_id = "corr-1";
  m.originating_message_id = "orig-1";
  m.parent_message_id = "parent-1";
  m.from = "Tests";
  m.traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  m.tracestate = "vendor=abc";
  m.body = (char *)body;
  m.body_len = body ? strlen(body) : 0;
  if (type == NH_MT_HANDOFF_FAIL) {
    m.error_text = "job failed";
    m.error_type = "JobError";
  }
  m.enqueued_at = nh_time_now_ms();
  nh_error_t err = {0};
  int copies = -1;
  if (nh_store_begin(p->store)) FAIL("begin");
  if (p->tr->vt->send(p->tr, &m, to, &copies, &err)) FAIL("send: %s", err.msg);
  if (nh_store_commit(p->store)) FAIL("commit");
  return copies;
}

static int send_event(proc_t *p, const char *to, const char *session, const char *event_id, const char *body)
{
  char mid[37];
  nh_uuid_v4(mid);
  return send_msg(p, to, NH_MT_EVENT, "Thing", session, event_id, mid, body);
}

/* One event to "Ep" inside the caller's transaction, enqueued (visible) at `at`. */
static void send_in_tx(proc_t *p, const char *session, const char *event_id, int64_t at)
{
  nh_msg_t m;
  memset(&m, 0, sizeof m);
  m.session_id = (char *)session;
  m.message_id = (char *)event_id;
  m.event_id = (char *)event_id;
  m.event_type = "Thing";
  m.enqueued_at = at;
  int copies;
  nh_error_t err = {0};
  if (p->tr->vt->send(p->tr, &m, "Ep", &copies, &err)) FAIL("send: %s", err.msg);
}

#define q1i(p, ...) nh_test_q1i(nh_store_db((p)->store), __VA_ARGS__)
#define q1s(p, ...) nh_test_q1s(nh_store_db((p)->store), __VA_ARGS__)

/* ---------------------------------------------------------------- tests */

TEST(new_transport_has_capabilities_and_schema)
{
  proc_t *a = proc_open("owner-a");
  ASSERT_EQ_STR(a->tr->vt->name, "embedded");
  ASSERT_TRUE(a->tr->caps & NH_CAP_LOCK_EXPIRES);
  ASSERT_TRUE(a->tr->caps & NH_CAP_ATOMIC_SETTLE);
  ASSERT_TRUE(a->tr->caps & NH_CAP_DEAD_LETTER);
  ASSERT_TRUE(a->tr->caps & NH_CAP_SCHEDULED_SEND);
  ASSERT_CMP_INT(a->tr->lock_ms, >, 0);
  ASSERT_EQ_INT(q1i(a, "SELECT version FROM nh_schema WHERE component = 'embedded'"), 5);
  /* locks are written twice per event: no secondary index on them (migration 5) */
  ASSERT_EQ_INT(q1i(a, "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND tbl_name = 'session_locks'"
                       " AND sql IS NOT NULL"), 0);
  proc_close(a);
  /* reopening migrates nothing twice */
  a = proc_open("owner-a");
  ASSERT_EQ_INT(q1i(a, "SELECT version FROM nh_schema WHERE component = 'embedded'"), 5);
  proc_close(a);
}

TEST(fan_out_one_copy_per_subscriber_with_fresh_event_ids)
{
  proc_t *a = proc_open("owner-a");
  subscribe(a, "EpA", "Thing", NULL);
  subscribe(a, "EpB", "Other", "Thing");
  subscribe(a, "EpC", "Other", NULL);
  ASSERT_EQ_INT(send_msg(a, NULL, NH_MT_EVENT, "Thing", "s1", "publisher-eid", "mid-1", "{\"n\":1}"), 2);
  ASSERT_EQ_INT(q1i(a, "SELECT count(*) FROM queue"), 2);
  ASSERT_EQ_INT(q1i(a, "SELECT count(*) FROM queue WHERE endpoint = 'EpA'"), 1);
  ASSERT_EQ_INT(q1i(a, "SELECT count(*) FROM queue WHERE endpoint = 'EpB'"), 1);
  ASSERT_EQ_INT(q1i(a, "SELECT count(*) FROM queue WHERE endpoint = 'EpC'"), 0);
  ASSERT_EQ_INT(q1i(a, "SELECT count(DISTINCT message_id) FROM queue"), 1);
  ASSERT_EQ_INT(q1i(a, "SELECT count(DISTINCT event_id) FROM queue"), 2);
  ASSERT_EQ_INT(q1i(a, "SELECT count(*) FROM queue WHERE event_id = 'publisher-eid' OR event_id IS NULL"), 0);
  ASSERT_EQ_INT(q1i(a, "SELECT count(*) FROM queue WHERE length(event_id) = 36"), 2);

  ASSERT_EQ_INT(receive(a, "EpA", 10, nh_time_now_ms()), 1);
  const nh_msg_t *m = a->got[0];
  ASSERT_EQ_STR(m->endpoint, "EpA");
  ASSERT_EQ_STR(m->session_id, "s1");
  ASSERT_EQ_STR(m->message_id, "mid-1");
  ASSERT_EQ_STR(m->event_type, "Thing");
  ASSERT_EQ_INT(m->type, NH_MT_EVENT);
  ASSERT_EQ_STR(m->correlation_id, "corr-1");
  ASSERT_EQ_STR(m->originating_message_id, "orig-1");
  ASSERT_EQ_STR(m->parent_message_id, "parent-1");
  ASSERT_EQ_STR(m->from, "Tests");
  ASSERT_EQ_STR(m->body, "{\"n\":1}");
  ASSERT_EQ_INT(m->body_len, 7);
  ASSERT_EQ_INT(m->delivery_count, 1);
  ASSERT_CMP_INT(m->seq, >, 0);
  ASSERT_CMP_INT(m->enqueued_at, >, 0);
  char eid_a[64];
  snprintf(eid_a, sizeof eid_a, "%s", m->event_id);
  ASSERT_EQ_INT(receive(a, "EpB", 10, nh_time_now_ms()), 1);
  ASSERT_EQ_STR(a->got[0]->message_id, "mid-1");
  ASSERT_NE_STR(a->got[0]->event_id, eid_a);

  /* a second publish gets yet other event ids */
  ASSERT_EQ_INT(send_msg(a, NULL, NH_MT_EVENT, "Thing", "s9", NULL, "mid-2", "{}"), 2);
  ASSERT_EQ_INT(q1i(a, "SELECT count(DISTINCT event_id) FROM queue"), 4);

  /* nobody subscribes: no copies, nothing queued */
  ASSERT_EQ_INT(send_msg(a, NULL, NH_MT_EVENT, "Unheard", "s1", NULL, "mid-3", "{}"), 0);
  ASSERT_EQ_INT(q1i(a, "SELECT count(*) FROM queue WHERE message_id = 'mid-3'"), 0);
  proc_close(a);
}

TEST(subscribe_replaces_the_endpoint_subscriptions)
{
  proc_t *a = proc_open("owner-a");
  subscribe(a, "EpA", "Thing", "Other");
  subscribe(a, "EpA", "Other", NULL);
  ASSERT_EQ_INT(send_msg(a, NULL, NH_MT_EVENT, "Thing", "s1", NULL, "m1", "{}"), 0);
  ASSERT_EQ_INT(send_msg(a, NULL, NH_MT_EVENT, "Other", "s1", NULL, "m2", "{}"), 1);
  proc_close(a);
}

TEST(direct_send_to_endpoint)
{
  proc_t *a = proc_open("owner-a");
  subscribe(a, "EpA", "Thing", NULL);
  /* --to: exactly one copy, to an endpoint that need not subscribe, keeping the event id */
  ASSERT_EQ_INT(send_msg(a, "EpZ", NH_MT_EVENT, "Thing", "s1", "given-eid", "m1", "{}"), 1);
  ASSERT_EQ_INT(q1i(a, "SELECT count(*) FROM queue"), 1);
  ASSERT_EQ_INT(q1i(a, "SELECT count(*) FROM queue WHERE endpoint = 'EpZ' AND event_id = 'given-eid'"), 1);
  /* without an event id one is made */
  ASSERT_EQ_INT(send_msg(a, "EpZ", NH_MT_EVENT, "Thing", "s2", NULL, "m2", "{}"), 1);
  ASSERT_EQ_INT(q1i(a, "SELECT length(event_id) FROM queue WHERE message_id = 'm2'"), 36);
  ASSERT_EQ_INT(receive(a, "EpA", 10, nh_time_now_ms()), 0);
  ASSERT_EQ_INT(receive(a, "EpZ", 10, nh_time_now_ms()), 2);
  proc_close(a);
}

TEST(control_messages_roundtrip_their_fields)
{
  proc_t *a = proc_open("owner-a");
  ASSERT_EQ_INT(send_msg(a, "Ep", NH_MT_HANDOFF_FAIL, "Thing", "s1", "e1", "m1", NULL), 1);
  ASSERT_EQ_INT(receive(a, "Ep", 10, nh_time_now_ms()), 1);
  ASSERT_EQ_INT(a->got[0]->type, NH_MT_HANDOFF_FAIL);
  ASSERT_EQ_STR(a->got[0]->error_text, "job failed");
  ASSERT_EQ_STR(a->got[0]->error_type, "JobError");
  ASSERT_EQ_STR(a->got[0]->traceparent, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
  ASSERT_EQ_STR(a->got[0]->tracestate, "vendor=abc");
  ASSERT_NULL(a->got[0]->body);
  ASSERT_EQ_INT(a->got[0]->body_len, 0);
  proc_close(a);
}

TEST(receive_delivers_session_heads_in_seq_order)
{
  proc_t *a = proc_open("owner-a");
  send_event(a, "Ep", "s1", "a1", "{\"n\":1}");
  send_event(a, "Ep", "s2", "b1", "{\"n\":2}");
  send_event(a, "Ep", "s1", "a2", "{\"n\":3}");
  send_event(a, "Ep", "s3", "c1", "{\"n\":4}");
  send_event(a, "Ep", "s2", "b2", "{\"n\":5}");
  send_event(a, "Other", "s1", "o1", "{}");
  int64_t now = nh_time_now_ms();   /* after the sends: rows enqueued later are not visible yet */

  ASSERT_EQ_INT(receive(a, "Ep", 10, now), 3);
  ASSERT_EQ_STR(a->got[0]->event_id, "a1");
  ASSERT_EQ_STR(a->got[1]->event_id, "b1");
  ASSERT_EQ_STR(a->got[2]->event_id, "c1");
  ASSERT_CMP_INT(a->got[0]->seq, <, a->got[1]->seq);
  ASSERT_CMP_INT(a->got[1]->seq, <, a->got[2]->seq);
  int64_t seq_a1 = a->got[0]->seq;

  /* the sessions are now locked by us: nothing more until a head is settled */
  ASSERT_EQ_INT(receive(a, "Ep", 10, now), 0);

  nh_msg_t head;
  memset(&head, 0, sizeof head);
  head.seq = seq_a1;
  head.endpoint = "Ep";
  head.session_id = "s1";
  ASSERT_EQ_INT(a->tr->vt->settle(a->tr, &head, NH_SETTLE_COMPLETE, 0, NULL), NH_OK);
  /* settling does not unlock; the dispatcher unlocks after its commit */
  ASSERT_EQ_INT(receive(a, "Ep", 10, now), 0);
  ASSERT_EQ_INT(a->tr->vt->unlock_session(a->tr, "Ep", "s1"), 1);
  ASSERT_EQ_INT(receive(a, "Ep", 10, now), 1);
  ASSERT_EQ_STR(a->got[0]->event_id, "a2");
  proc_close(a);
}

TEST(receive_respects_max)
{
  proc_t *a = proc_open("owner-a");
  for (int i = 0; i < 5; i++) {
    char s[8], e[8];
    snprintf(s, sizeof s, "s%d", i);
    snprintf(e, sizeof e, "e%d", i);
    send_event(a, "Ep", s, e, "{}");
  }
  int64_t now = nh_time_now_ms();   /* after the sends: rows enqueued later are not visible yet */
  ASSERT_EQ_INT(receive(a, "Ep", 0, now), 0);
  ASSERT_EQ_INT(receive(a, "Ep", 2, now), 2);
  ASSERT_EQ_STR(a->got[0]->event_id, "e0");
  ASSERT_EQ_STR(a->got[1]->event_id, "e1");
  ASSERT_EQ_INT(receive(a, "Ep", 10, now), 3);
  ASSERT_EQ_STR(a->got[0]->event_id, "e2");
  proc_close(a);
}

TEST(many_messages_in_one_session_do_not_hide_other_sessions)
{
  /* The head scan is bounded; a session with a long backlog must not starve the rest. */
  proc_t *a = proc_open("owner-a");
  int64_t now = nh_time_now_ms();
  ASSERT_EQ_INT(nh_store_begin(a->store), NH_OK);
  for (int i = 0; i < 300; i++) {
    char eid[16];
    snprintf(eid, sizeof eid, "big-%03d", i);
    send_in_tx(a, "big", eid, now);
  }
  ASSERT_EQ_INT(nh_store_commit(a->store), NH_OK);
  send_event(a, "Ep", "small", "small-1", "{}");
  now = nh_time_now_ms();
  ASSERT_EQ_INT(receive(a, "Ep", 1, now), 1);
  ASSERT_EQ_STR(a->got[0]->event_id, "big-000");
  /* "big" is locked now; the next receive must reach "small" behind its backlog */
  ASSERT_EQ_INT(receive(a, "Ep", 1, now), 1);
  ASSERT_EQ_STR(a->got[0]->session_id, "small");
  proc_close(a);
}

TEST(locked_session_is_not_delivered_to_another_owner)
{
  proc_t *a = proc_open("owner-a");
  proc_t *b = proc_open("owner-b");
  a->tr->lock_ms = b->tr->lock_ms = 1000;
  send_event(a, "Ep", "s1", "a1", "{}");
  send_event(a, "Ep", "s1", "a2", "{}");
  send_event(a, "Ep", "s2", "b1", "{}");
  int64_t now = nh_time_now_ms();   /* after the sends: rows enqueued later are not visible yet */

  ASSERT_EQ_INT(receive(a, "Ep", 1, now), 1);   /* a takes s1 only */
  ASSERT_EQ_STR(a->got[0]->session_id, "s1");
  ASSERT_EQ_INT(q1i(b, "SELECT count(*) FROM session_locks WHERE owner = 'owner-a'"), 1);

  ASSERT_EQ_INT(receive(b, "Ep", 10, now + 10), 1);   /* b gets s2, never s1 */
  ASSERT_EQ_STR(b->got[0]->session_id, "s2");
  ASSERT_EQ_INT(receive(b, "Ep", 10, now + 999), 0);

  /* lock_session directly: b cannot take a's session */
  ASSERT_EQ_INT(b->tr->vt->lock_session(b->tr, "Ep", "s1", now + 500), 0);
  /* unlock by a non-owner changes nothing */
  ASSERT_EQ_INT(b->tr->vt->unlock_session(b->tr, "Ep", "s1"), 0);   /* not b's lock */
  ASSERT_EQ_INT(q1i(a, "SELECT count(*) FROM session_locks WHERE session_id = 's1' AND owner = 'owner-a'"), 1);
  proc_close(a);
  proc_close(b);
}

TEST(lock_session_is_a_fresh_acquisition)
{
  /* A live lock of our own means the session is in flight here: taking it again must
   * fail, or the dispatcher starts a second job for the session (retries/replays). */
  proc_t *a = proc_open("owner-a");
  a->tr->lock_ms = 1000;
  int64_t now = nh_time_now_ms();
  ASSERT_EQ_INT(a->tr->vt->lock_session(a->tr, "Ep", "s1", now), 1);
  ASSERT_EQ_INT(a->tr->vt->lock_session(a->tr, "Ep", "s1", now + 10), 0);
  ASSERT_EQ_INT(q1i(a, "SELECT locked_until FROM session_locks WHERE session_id = 's1'"), now + 1000);
  /* after an unlock, or once our own lock has expired, it can be taken again */
  ASSERT_EQ_INT(a->tr->vt->unlock_session(a->tr, "Ep", "s1"), 1);
  ASSERT_EQ_INT(a->tr->vt->lock_session(a->tr, "Ep", "s1", now + 20), 1);
  ASSERT_EQ_INT(a->tr->vt->lock_session(a->tr, "Ep", "s1", now + 1020), 1);
  proc_close(a);
}

TEST(lock_expiry_lets_another_owner_take_the_session)
{
  proc_t *a = proc_open("owner-a");
  proc_t *b = proc_open("owner-b");
  a->tr->lock_ms = b->tr->lock_ms = 1000;
  send_event(a, "Ep", "s1", "a1", "{}");
  int64_t now = nh_time_now_ms();   /* after the sends: rows enqueued later are not visible yet */
  ASSERT_EQ_INT(receive(a, "Ep", 10, now), 1);
  ASSERT_EQ_INT(a->got[0]->delivery_count, 1);
  ASSERT_EQ_INT(receive(b, "Ep", 10, now + 999), 0);
  /* a "crashed": its lock runs out and b gets the same message again */
  ASSERT_EQ_INT(receive(b, "Ep", 10, now + 1000), 1);
  ASSERT_EQ_STR(b->got[0]->event_id, "a1");
  ASSERT_EQ_INT(b->got[0]->delivery_count, 2);
  ASSERT_EQ_STR(q1s(b, "SELECT owner FROM session_locks WHERE session_id = 's1'"), "owner-b");
  /* and now a cannot take it back */
  ASSERT_EQ_INT(receive(a, "Ep", 10, now + 1500), 0);
  ASSERT_EQ_INT(a->tr->vt->lock_session(a->tr, "Ep", "s1", now + 1500), 0);
  proc_close(a);
  proc_close(b);
}

TEST(renew_extends_one_lock_of_the_owner_and_reports_a_lost_one)
{
  proc_t *a = proc_open("owner-a");
  proc_t *b = proc_open("owner-b");
  a->tr->lock_ms = 1000;
  b->tr->lock_ms = 10000;
  send_event(a, "Ep", "s1", "a1", "{}");
  send_event(a, "Ep", "s2", "b1", "{}");
  send_event(a, "Ep", "s3", "c1", "{}");
  int64_t now = nh_time_now_ms();   /* after the sends: rows enqueued later are not visible yet */
  ASSERT_EQ_INT(receive(a, "Ep", 2, now), 2);   /* s1, s2 */
  ASSERT_EQ_INT(receive(b, "Ep", 2, now), 1);   /* s3 */

  ASSERT_EQ_INT(a->tr->vt->renew(a->tr, "Ep", "s1", now + 900), 1);
  ASSERT_EQ_INT(a->tr->vt->renew(a->tr, "Ep", "s3", now + 900), 0);   /* b's, not a's */
  ASSERT_EQ_INT(q1i(a, "SELECT locked_until FROM session_locks WHERE session_id = 's1'"), now + 1900);
  ASSERT_EQ_INT(q1i(a, "SELECT locked_until FROM session_locks WHERE session_id = 's2'"), now + 1000);
  ASSERT_EQ_INT(q1i(a, "SELECT locked_until FROM session_locks WHERE session_id = 's3'"), now + 10000);
  ASSERT_EQ_INT(receive(b, "Ep", 10, now + 1500), 1);   /* s2 expired; s1 renewed: still a's */
  ASSERT_EQ_INT(receive(b, "Ep", 10, now + 1900), 1);   /* past the renewed expiry: s1 */
  ASSERT_EQ_INT(a->tr->vt->renew(a->tr, "Ep", "s1", now + 1900), 0);   /* a lost it */
  ASSERT_EQ_INT(b->tr->vt->renew(b->tr, "Ep", "s1", now + 1900), 1);
  proc_close(a);
  proc_close(b);
}

TEST(settle_complete_deletes_the_row)
{
  proc_t *a = proc_open("owner-a");
  send_event(a, "Ep", "s1", "a1", "{}");
  send_event(a, "Ep", "s1", "a2", "{}");
  ASSERT_EQ_INT(receive(a, "Ep", 10, nh_time_now_ms()), 1);
  ASSERT_EQ_INT(a->tr->vt->settle(a->tr, a->got[0], NH_SETTLE_COMPLETE, 0, NULL), NH_OK);
  ASSERT_EQ_INT(q1i(a, "SELECT count(*) FROM queue WHERE event_id = 'a1'"), 0);
  ASSERT_EQ_INT(q1i(a, "SELECT count(*) FROM queue WHERE event_id = 'a2'"), 1);
  ASSERT_EQ_INT(q1i(a, "SELECT count(*) FROM dead_letters"), 0);
  /* settling a message that is not from the queue (seq 0) is a no-op */
  nh_msg_t fake;
  memset(&fake, 0, sizeof fake);
  fake.endpoint = "Ep";
  fake.session_id = "s1";
  ASSERT_EQ_INT(a->tr->vt->settle(a->tr, &fake, NH_SETTLE_COMPLETE, 0, NULL), NH_OK);
  ASSERT_EQ_INT(q1i(a, "SELECT count(*) FROM queue"), 1);
  proc_close(a);
}

TEST(settle_dead_letter_moves_to_dead_letters)
{
  proc_t *a = proc_open("owner-a");
  send_event(a, "Ep", "s1", "a1", "{\"bad\":true}");
  ASSERT_EQ_INT(receive(a, "Ep", 10, nh_time_now_ms()), 1);
  ASSERT_EQ_INT(a->tr->vt->settle(a->tr, a->got[0], NH_SETTLE_DEAD_LETTER, 0, "malformed payload"), NH_OK);
  ASSERT_EQ_INT(q1i(a, "SELECT count(*) FROM queue"), 0);
  ASSERT_EQ_INT(q1i(a, "SELECT count(*) FROM dead_letters"), 1);
  ASSERT_EQ_STR(q1s(a, "SELECT endpoint || '|' || session_id || '|' || event_id || '|' || message_type || '|' ||"
                        " body || '|' || reason || '|' || delivery_count FROM dead_letters"),
                "Ep|s1|a1|EventRequest|{\"bad\":true}|malformed payload|1");
  ASSERT_CMP_INT(q1i(a, "SELECT at FROM dead_letters"), >, 0);
  proc_close(a);
}

TEST(release_without_delay_redelivers_at_once)
{
  proc_t *a = proc_open("owner-a");
  send_event(a, "Ep", "s1", "a1", "{}");
  int64_t now = nh_time_now_ms();   /* after the sends: rows enqueued later are not visible yet */
  ASSERT_EQ_INT(receive(a, "Ep", 10, now), 1);
  ASSERT_EQ_INT(a->tr->vt->settle(a->tr, a->got[0], NH_SETTLE_RELEASE, 0, NULL), NH_OK);
  ASSERT_EQ_INT(receive(a, "Ep", 10, now), 1);
  ASSERT_EQ_STR(a->got[0]->event_id, "a1");
  ASSERT_EQ_INT(a->got[0]->delivery_count, 2);
  proc_close(a);
}

TEST(release_with_delay_hides_the_session_until_then)
{
  proc_t *a = proc_open("owner-a");
  proc_t *b = proc_open("owner-b");
  send_event(a, "Ep", "s1", "a1", "{}");
  send_event(a, "Ep", "s1", "a2", "{}");
  send_event(a, "Ep", "s2", "b1", "{}");
  int64_t t0 = nh_time_now_ms();
  ASSERT_EQ_INT(receive(a, "Ep", 1, t0), 1);
  ASSERT_EQ_STR(a->got[0]->event_id, "a1");
  ASSERT_EQ_INT(a->tr->vt->settle(a->tr, a->got[0], NH_SETTLE_RELEASE, 60000, NULL), NH_OK);
  ASSERT_EQ_INT(a->tr->vt->unlock_session(a->tr, "Ep", "s1"), 0);   /* the hold is nobody's */
  int64_t t1 = nh_time_now_ms();
  /* neither owner sees s1 (not even its later message) before the delay ends; s2 flows */
  ASSERT_EQ_INT(receive(b, "Ep", 10, t1), 1);
  ASSERT_EQ_STR(b->got[0]->session_id, "s2");
  ASSERT_EQ_INT(b->tr->vt->settle(b->tr, b->got[0], NH_SETTLE_COMPLETE, 0, NULL), NH_OK);
  ASSERT_EQ_INT(receive(a, "Ep", 10, t1 + 30000), 0);
  ASSERT_EQ_INT(b->tr->vt->lock_session(b->tr, "Ep", "s1", t1 + 30000), 0);
  /* after the delay the released head comes back first; a release is not a failed
   * delivery (the count is given back) but is counted for the backoff */
  ASSERT_EQ_INT(receive(b, "Ep", 10, t1 + 60000 + 2000), 1);
  ASSERT_EQ_STR(b->got[0]->event_id, "a1");
  ASSERT_EQ_INT(b->got[0]->delivery_count, 1);
  ASSERT_EQ_INT(b->got[0]->release_count, 1);
  proc_close(a);
  proc_close(b);
}

TEST(delivery_count_increments_per_delivery)
{
  proc_t *a = proc_open("owner-a");
  a->tr->lock_ms = 100;
  send_event(a, "Ep", "s1", "a1", "{}");
  int64_t now = nh_time_now_ms();   /* after the sends: rows enqueued later are not visible yet */
  for (int i = 1; i <= 5; i++) {
    ASSERT_EQ_INT(receive(a, "Ep", 10, now + (i - 1) * 100), 1);
    ASSERT_EQ_INT(a->got[0]->delivery_count, i);
    ASSERT_EQ_INT(q1i(a, "SELECT delivery_count FROM queue WHERE event_id = 'a1'"), i);
  }
  proc_close(a);
}

TEST(send_inside_rolled_back_transaction_is_discarded)
{
  proc_t *a = proc_open("owner-a");
  nh_msg_t m;
  memset(&m, 0, sizeof m);
  m.session_id = "s1";
  m.message_id = "m1";
  m.event_id = "e1";
  m.event_type = "Thing";
  int copies = 0;
  nh_error_t err = {0};
  ASSERT_EQ_INT(nh_store_begin(a->store), NH_OK);
  ASSERT_EQ_INT(a->tr->vt->send(a->tr, &m, "Ep", &copies, &err), NH_OK);
  ASSERT_EQ_INT(copies, 1);
  nh_store_rollback(a->store);
  ASSERT_EQ_INT(q1i(a, "SELECT count(*) FROM queue"), 0);
  ASSERT_EQ_INT(receive(a, "Ep", 10, nh_time_now_ms()), 0);
  proc_close(a);
}

TEST(reaps_locks_of_dead_local_processes)
{
  /* Owners are "host:pid:tag"; a lock of a pid that no longer runs is dropped on open. */
  proc_t *a = proc_open("owner-a");
  char host[128] = "";
  gethostname(host, sizeof host - 1);
  pid_t child = fork();
  if (child == 0) _exit(0);
  int status;
  waitpid(child, &status, 0);
  char sql[512];
  snprintf(sql, sizeof sql,
           "INSERT INTO session_locks(endpoint, session_id, owner, locked_until) VALUES"
           " ('Ep', 's1', '%s:%ld:dead', 9000000000000), ('Ep', 's2', '%s:%ld:live', 9000000000000)",
           host, (long)child, host, (long)getpid());
  ASSERT_EQ_INT(sqlite3_exec(nh_store_db(a->store), sql, NULL, NULL, NULL), SQLITE_OK);
  proc_t *b = proc_open("owner-b");
  ASSERT_EQ_INT(q1i(b, "SELECT count(*) FROM session_locks WHERE session_id = 's1'"), 0);
  ASSERT_EQ_INT(q1i(b, "SELECT count(*) FROM session_locks WHERE session_id = 's2'"), 1);
  proc_close(a);
  proc_close(b);
}

TEST(a_command_accepts_exactly_one_consuming_endpoint)
{
  proc_t *a = proc_open("owner-a");
  const char *types[] = { "PlaceOnHold", "Evt" };
  int commands[] = { 1, 0 };
  nh_error_t err = {0};
  ASSERT_EQ_INT(a->tr->vt->subscribe(a->tr, "Erp", types, commands, 2, &err), NH_OK);
  /* the same endpoint again (a restart) is fine */
  ASSERT_EQ_INT(a->tr->vt->subscribe(a->tr, "Erp", types, commands, 2, &err), NH_OK);
  /* a second consumer of the command is refused, whether or not it calls it a command */
  const char *one[] = { "PlaceOnHold" };
  int plain[] = { 0 };
  ASSERT_EQ_INT(a->tr->vt->subscribe(a->tr, "Crm", one, plain, 1, &err), NH_EUSAGE);
  ASSERT_TRUE(strstr(err.msg, "Erp already consumes it") != NULL);
  ASSERT_EQ_INT(a->tr->vt->subscribe(a->tr, "Crm", one, commands, 1, &err), NH_EUSAGE);
  /* events may have many consumers */
  const char *evt[] = { "Evt" };
  ASSERT_EQ_INT(a->tr->vt->subscribe(a->tr, "Crm", evt, plain, 1, &err), NH_OK);
  proc_close(a);
}

/* session_next: the rest of a session, as its head scan saw it (docs/architecture.md). */
static int next_of(proc_t *p, const char *session, int64_t after, int64_t now, nh_msg_t *out, int max)
{
  return p->tr->vt->session_next(p->tr, "Ep", session, after, max, out, now);
}

static void clear_msgs(nh_msg_t *m, int n)
{
  for (int i = 0; i < n; i++) nh_msg_clear(&m[i]);
}

TEST(session_next_hands_over_the_rest_of_a_session_in_order)
{
  proc_t *a = proc_open("owner-a");
  send_event(a, "Ep", "s1", "a1", "{}");
  send_event(a, "Ep", "s1", "a2", "{\"n\":2}");
  send_event(a, "Ep", "s2", "b1", "{}");
  send_event(a, "Ep", "s1", "a3", "{}");
  send_event(a, "Ep", "s2", "b2", "{}");
  send_event(a, "Ep", "s1", "a4", "{}");
  int64_t now = nh_time_now_ms();
  ASSERT_EQ_INT(receive(a, "Ep", 10, now), 2);
  ASSERT_EQ_STR(a->got[0]->event_id, "a1");
  int64_t a1 = a->got[0]->seq;
  nh_msg_t out[8];
  int n = next_of(a, "s1", a1, now, out, 8);
  ASSERT_EQ_INT(n, 3);
  ASSERT_EQ_STR(out[0].event_id, "a2");
  ASSERT_EQ_STR(out[0].body, "{\"n\":2}");
  ASSERT_EQ_STR(out[0].session_id, "s1");
  ASSERT_EQ_STR(out[1].event_id, "a3");
  ASSERT_EQ_STR(out[2].event_id, "a4");
  int64_t a2 = out[0].seq, a3 = out[1].seq;
  clear_msgs(out, n);
  /* up to max, and after any seq of the session */
  n = next_of(a, "s1", a1, now, out, 2);
  ASSERT_EQ_INT(n, 2);
  ASSERT_EQ_STR(out[1].event_id, "a3");
  clear_msgs(out, n);
  n = next_of(a, "s1", a3, now, out, 8);
  ASSERT_EQ_INT(n, 1);
  ASSERT_EQ_STR(out[0].event_id, "a4");
  clear_msgs(out, n);
  /* the other session's rows are its own; an unknown endpoint or session has none */
  n = next_of(a, "s2", a1, now, out, 8);
  ASSERT_EQ_INT(n, 1);
  ASSERT_EQ_STR(out[0].event_id, "b2");
  clear_msgs(out, n);
  ASSERT_EQ_INT(next_of(a, "s9", 0, now, out, 8), 0);
  ASSERT_EQ_INT(a->tr->vt->session_next(a->tr, "Other", "s1", 0, 8, out, now), 0);
  /* a row settled since the scan ends the batch there: nothing after it is handed over
   * out of order */
  nh_msg_t gone;
  memset(&gone, 0, sizeof gone);
  gone.seq = a2;
  ASSERT_EQ_INT(a->tr->vt->settle(a->tr, &gone, NH_SETTLE_COMPLETE, 0, NULL), NH_OK);
  ASSERT_EQ_INT(next_of(a, "s1", a1, now, out, 8), 0);
  proc_close(a);
}

TEST(session_next_gives_nothing_the_scan_could_not_see_whole)
{
  proc_t *a = proc_open("owner-a");
  send_event(a, "Ep", "s1", "a1", "{}");
  send_event(a, "Ep", "s1", "a2", "{}");
  int64_t now = nh_time_now_ms();
  ASSERT_EQ_INT(receive(a, "Ep", 10, now), 1);
  int64_t a1 = a->got[0]->seq;
  send_event(a, "Ep", "s1", "a3", "{}");   /* after the scan */
  send_event(a, "Ep", "s2", "b1", "{}");
  now = nh_time_now_ms();
  nh_msg_t out[8];
  int n = next_of(a, "s1", a1, now, out, 8);
  ASSERT_EQ_INT(n, 1);   /* a2 only: a3 came after the scan */
  ASSERT_EQ_STR(out[0].event_id, "a2");
  clear_msgs(out, n);
  /* a later scan skips s1 (locked by us): it knows none of s1's rows, so it hands over none */
  ASSERT_EQ_INT(receive(a, "Ep", 10, now), 1);
  ASSERT_EQ_STR(a->got[0]->event_id, "b1");
  ASSERT_EQ_INT(next_of(a, "s1", a1, now, out, 8), 0);
  proc_close(a);
}

TEST(session_next_stops_at_a_row_not_visible_yet_and_works_with_max_1)
{
  proc_t *a = proc_open("owner-a");
  int64_t now = nh_time_now_ms();
  ASSERT_EQ_INT(nh_store_begin(a->store), NH_OK);
  for (int i = 0; i < 6; i++) {
    char eid[16];
    snprintf(eid, sizeof eid, "e%d", i);
    send_in_tx(a, "s1", eid, i == 4 ? now + 60000 : now);   /* e4 is not visible for a minute */
  }
  ASSERT_EQ_INT(nh_store_commit(a->store), NH_OK);
  send_event(a, "Ep", "s2", "b1", "{}");
  /* one head asked for: the scan still reads on through s1's backlog (not into s2) */
  ASSERT_EQ_INT(receive(a, "Ep", 1, now), 1);
  ASSERT_EQ_STR(a->got[0]->event_id, "e0");
  nh_msg_t out[8];
  int n = next_of(a, "s1", a->got[0]->seq, now, out, 8);
  ASSERT_EQ_INT(n, 3);
  ASSERT_EQ_STR(out[0].event_id, "e1");
  ASSERT_EQ_STR(out[2].event_id, "e3");   /* e4 waits, and e5 behind it */
  clear_msgs(out, n);
  proc_close(a);
}

NH_TEST_MAIN()
