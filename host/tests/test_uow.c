/* Unit tests for store/nh_uow.c: the state machine's reads in a pump. Direct reads answer
 * from the store; cold reads miss once per key and pump, with the empty answer, and read
 * the store from the next pass on (the restart path a server backend takes). */
#include "nh_test.h"

#include "core/nh_util.h"
#include "store/nh_store.h"
#include "store/nh_uow.h"

#include <stdlib.h>
#include <string.h>

static nh_store_t *open_store(void)
{
  nh_store_t *s = NULL;
  nh_error_t err = {0};
  if (nh_store_open(&s, nh_test_path("uow.db"), NH_STORE_CREATE, &err)) FAIL("nh_store_open: %s", err.msg);
  return s;
}

static nh_msg_t event(const char *session, const char *id)
{
  nh_msg_t m;
  memset(&m, 0, sizeof m);
  m.endpoint = "Ep";
  m.session_id = (char *)session;
  m.event_id = (char *)id;
  m.message_id = (char *)id;
  m.event_type = "Thing";
  m.type = NH_MT_EVENT;
  m.body = "{}";
  m.body_len = 2;
  return m;
}

/* One of each thing the state machine reads: a blocked session with a parked message,
 * its blocker's audit row and history, an inbox entry and an operator request. */
static void fill(nh_store_t *s)
{
  ASSERT_EQ_INT(nh_store_begin(s), NH_OK);
  nh_session_state_t st = { .exists = 1, .blocked_by = "e1", .next_park_seq = 2 };
  ASSERT_EQ_INT(nh_store_session_put(s, "Ep", "s1", &st), NH_OK);
  nh_audit_t a = { .endpoint = "Ep", .event_id = "e1", .session_id = "s1", .event_type = "Thing",
                   .status = NH_ST_FAILED, .message_id = "e1" };
  ASSERT_EQ_INT(nh_store_audit_put(s, &a), NH_OK);
  ASSERT_EQ_INT(nh_store_history_add(s, "Ep", "e1", "e1", "EventRequest", NH_ST_FAILED, "boom"), NH_OK);
  nh_msg_t m = event("s1", "e2");
  ASSERT_EQ_INT(nh_store_park(s, &m, 1), NH_OK);
  ASSERT_EQ_INT(nh_store_inbox_add(s, "Ep", "e0"), NH_OK);
  ASSERT_EQ_INT(nh_store_oppending_add(s, "req-1", "Ep", "e1", "resubmit", NH_ST_FAILED), NH_OK);
  ASSERT_EQ_INT(nh_store_commit(s), NH_OK);
}

/* Every read once; returns how many gave the store's answer (6 of them). */
static int read_all(nh_uow_t *u)
{
  int real = 0;
  nh_session_state_t st;
  ASSERT_EQ_INT(nh_uow_session_get(u, "Ep", "s1", &st), NH_OK);
  real += st.blocked_by && strcmp(st.blocked_by, "e1") == 0;
  nh_session_state_clear(&st);
  nh_audit_t a;
  if (nh_uow_audit_get(u, "Ep", "e1", &a) == 1) {
    real += strcmp(a.status, NH_ST_FAILED) == 0;
    nh_audit_clear(&a);
  }
  real += nh_uow_inbox_has(u, "Ep", "e0") == 1;
  real += nh_uow_parked_any(u, "Ep", "s1") == 1;
  nh_msg_t head;
  memset(&head, 0, sizeof head);
  int64_t seq = 0;
  if (nh_uow_parked_head(u, "Ep", "s1", &head, &seq) == 1) {
    real += seq == 1 && head.event_id && strcmp(head.event_id, "e2") == 0;
    nh_msg_clear(&head);
  }
  real += nh_uow_processed_has(u, "Ep", "e1", "e1") == 1;
  return real;
}

TEST(direct_reads_answer_from_the_store_and_never_miss)
{
  nh_store_t *s = open_store();
  fill(s);
  nh_uow_t *u = nh_uow_new(s, NH_UOW_DIRECT);
  nh_uow_pass_begin(u);
  ASSERT_EQ_INT(read_all(u), 6);
  ASSERT_EQ_INT(nh_uow_missed(u), 0);
  nh_uow_end(u);
  nh_uow_stats_t us;
  nh_uow_stats(u, &us);
  ASSERT_EQ_INT((int)us.misses, 0);
  nh_uow_free(u);
  nh_store_close(s);
}

TEST(a_cold_read_misses_once_with_the_empty_answer_then_reads_the_store)
{
  nh_store_t *s = open_store();
  fill(s);
  nh_uow_t *u = nh_uow_new(s, NH_UOW_COLD);
  nh_uow_pass_begin(u);
  /* the empty answers: a free session, no audit row, nothing in the inbox or parked, no outcome */
  nh_session_state_t st;
  ASSERT_EQ_INT(nh_uow_session_get(u, "Ep", "s1", &st), NH_OK);
  ASSERT_TRUE(st.blocked_by == NULL && !st.exists && st.next_park_seq == 1);
  ASSERT_EQ_INT(read_all(u), 0);
  ASSERT_EQ_INT(nh_uow_missed(u), 1);
  /* the next pass of the same pump has them */
  nh_uow_pass_begin(u);
  ASSERT_EQ_INT(nh_uow_missed(u), 0);
  ASSERT_EQ_INT(read_all(u), 6);
  ASSERT_EQ_INT(nh_uow_missed(u), 0);
  /* a key not read before still misses in a later pass */
  ASSERT_EQ_INT(nh_uow_inbox_has(u, "Ep", "never"), 0);
  ASSERT_EQ_INT(nh_uow_missed(u), 1);
  nh_uow_stats_t us;
  nh_uow_stats(u, &us);
  ASSERT_EQ_INT((int)us.passes, 2);
  ASSERT_EQ_INT((int)us.restarts, 1);
  ASSERT_EQ_INT((int)us.misses, 7);
  /* a new pump starts cold again */
  nh_uow_end(u);
  nh_uow_pass_begin(u);
  ASSERT_EQ_INT(read_all(u), 0);
  ASSERT_EQ_INT(nh_uow_missed(u), 1);
  nh_uow_free(u);
  nh_store_close(s);
}

TEST(a_missed_operator_request_is_not_taken)
{
  nh_store_t *s = open_store();
  fill(s);
  nh_uow_t *u = nh_uow_new(s, NH_UOW_COLD);
  nh_uow_pass_begin(u);
  char *expected = (char *)"unset";
  ASSERT_EQ_INT(nh_uow_oppending_take(u, "req-1", &expected), 0);
  ASSERT_TRUE(expected == NULL);
  ASSERT_EQ_INT(nh_store_oppending_has(s, "Ep", "e1"), 1);   /* still there for the next pass */
  nh_uow_pass_begin(u);
  ASSERT_EQ_INT(nh_uow_oppending_take(u, "req-1", &expected), 1);
  ASSERT_EQ_STR(expected, NH_ST_FAILED);
  free(expected);
  ASSERT_EQ_INT(nh_store_oppending_has(s, "Ep", "e1"), 0);
  nh_uow_free(u);
  nh_store_close(s);
}

TEST(keys_are_told_apart_by_kind_and_every_part)
{
  nh_store_t *s = open_store();
  fill(s);
  nh_uow_t *u = nh_uow_new(s, NH_UOW_COLD);
  nh_uow_pass_begin(u);
  ASSERT_EQ_INT(nh_uow_parked_any(u, "Ep", "s1"), 0);
  nh_uow_pass_begin(u);
  ASSERT_EQ_INT(nh_uow_parked_any(u, "Ep", "s1"), 1);
  ASSERT_EQ_INT(nh_uow_missed(u), 0);
  /* the same strings under another read, split differently, or on another endpoint: misses */
  nh_session_state_t st;
  ASSERT_EQ_INT(nh_uow_session_get(u, "Ep", "s1", &st), NH_OK);
  nh_session_state_clear(&st);
  ASSERT_EQ_INT(nh_uow_missed(u), 1);
  nh_uow_pass_begin(u);
  ASSERT_EQ_INT(nh_uow_parked_any(u, "Eps", "1"), 0);
  ASSERT_EQ_INT(nh_uow_missed(u), 1);
  nh_uow_pass_begin(u);
  ASSERT_EQ_INT(nh_uow_processed_has(u, "Ep", "e1", "e1x"), 0);
  ASSERT_EQ_INT(nh_uow_missed(u), 1);
  nh_uow_free(u);
  nh_store_close(s);
}

TEST(after_the_pass_cap_reads_go_to_the_store)
{
  nh_store_t *s = open_store();
  fill(s);
  nh_uow_t *u = nh_uow_new(s, NH_UOW_COLD);
  char key[32];
  for (int i = 0; i < NH_UOW_MAX_PASSES; i++) {   /* a new key every pass: never done */
    nh_uow_pass_begin(u);
    snprintf(key, sizeof key, "m%d", i);
    ASSERT_EQ_INT(nh_uow_inbox_has(u, "Ep", key), 0);
    ASSERT_EQ_INT(nh_uow_missed(u), 1);
  }
  nh_uow_pass_begin(u);
  ASSERT_EQ_INT(nh_uow_inbox_has(u, "Ep", "e0"), 1);   /* never read before, answered anyway */
  ASSERT_EQ_INT(nh_uow_missed(u), 0);
  nh_uow_end(u);
  nh_uow_pass_begin(u);   /* the cap is per pump */
  ASSERT_EQ_INT(nh_uow_inbox_has(u, "Ep", "e0"), 0);
  ASSERT_EQ_INT(nh_uow_missed(u), 1);
  nh_uow_free(u);
  nh_store_close(s);
}

NH_TEST_MAIN()
