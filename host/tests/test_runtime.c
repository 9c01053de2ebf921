/* Unit tests for core/nh_runtime.h: a loop finds its runtime, parts are found by key and
 * closed newest first with the runtime, a registry list is unlinked at close, and a
 * handle someone forgot is reported and closed so the loop still closes. */
#include "nh_test.h"

#include "core/nh_log.h"
#include "core/nh_runtime.h"

#include <string.h>

typedef struct part {
  nh_rt_part_t part;
  char *order;          /* the closes append their names here */
  const char *name;
  uv_timer_t timer;     /* closed by the part's close, as a module's handles are */
  int closed_cb;
} part_t;

static void timer_closed(uv_handle_t *h) { ((part_t *)h->data)->closed_cb = 1; }

static void part_close(nh_rt_part_t *p)
{
  part_t *pt = nh_queue_data(p, part_t, part);
  strcat(pt->order, pt->name);
  uv_close((uv_handle_t *)&pt->timer, timer_closed);
}

static const char key_a = 'a', key_b = 'b';

TEST(parts_are_found_by_key_and_closed_newest_first_with_their_handles)
{
  nh_runtime_t rt;
  ASSERT_EQ_INT(nh_runtime_init(&rt), 0);
  ASSERT_TRUE(nh_runtime_of(&rt.loop) == &rt);
  char order[8] = "";
  part_t a = { .order = order, .name = "a" }, b = { .order = order, .name = "b" };
  uv_timer_init(&rt.loop, &a.timer);
  uv_timer_init(&rt.loop, &b.timer);
  a.timer.data = &a;
  b.timer.data = &b;
  ASSERT_TRUE(nh_runtime_part(&rt, &key_a) == NULL);
  nh_runtime_add_part(&rt, &a.part, &key_a, part_close);
  nh_runtime_add_part(&rt, &b.part, &key_b, part_close);
  ASSERT_TRUE(nh_runtime_part(&rt, &key_a) == &a.part);
  ASSERT_TRUE(nh_runtime_part(&rt, &key_b) == &b.part);
  ASSERT_EQ_INT(nh_runtime_close(&rt), 0);
  ASSERT_EQ_STR(order, "ba");
  ASSERT_TRUE(a.closed_cb && b.closed_cb);
}

typedef struct member {
  nh_queue_t node;
} member_t;

static const char key_list = 'l';

TEST(a_list_part_is_one_per_key_and_leaves_its_members_unlinked)
{
  nh_runtime_t rt;
  ASSERT_EQ_INT(nh_runtime_init(&rt), 0);
  nh_queue_t *l = nh_runtime_list(&rt, &key_list);
  ASSERT_TRUE(nh_runtime_list(&rt, &key_list) == l);
  member_t m1, m2;
  nh_queue_init(&m1.node);
  nh_queue_init(&m2.node);
  nh_queue_insert_tail(l, &m1.node);
  nh_queue_insert_tail(l, &m2.node);
  nh_queue_remove(&m1.node);   /* its owner closed it */
  ASSERT_EQ_INT(nh_runtime_close(&rt), 0);
  /* the one left on the list is unlinked: its owner may still remove it safely */
  ASSERT_TRUE(nh_queue_empty(&m2.node));
  nh_queue_remove(&m2.node);
}

static void never(uv_timer_t *t) { (void)t; }

TEST(a_handle_left_open_is_reported_and_closed)
{
  nh_log_set_level(NH_LOG_ERROR);   /* the warnings are expected */
  nh_runtime_t rt;
  ASSERT_EQ_INT(nh_runtime_init(&rt), 0);
  uv_timer_t forgotten, stopped;
  uv_timer_init(&rt.loop, &forgotten);
  uv_timer_init(&rt.loop, &stopped);
  uv_timer_start(&forgotten, never, 60000, 60000);   /* would keep uv_run going for ever */
  ASSERT_EQ_INT(nh_runtime_close(&rt), 2);
}

static int running_seen = -1;

static void look(uv_idle_t *idle)
{
  running_seen = ((nh_runtime_t *)idle->data)->running;
  uv_close((uv_handle_t *)idle, NULL);
}

TEST(running_is_set_while_run_runs_the_loop)
{
  nh_runtime_t rt;
  ASSERT_EQ_INT(nh_runtime_init(&rt), 0);
  uv_idle_t idle;
  uv_idle_init(&rt.loop, &idle);
  idle.data = &rt;
  uv_idle_start(&idle, look);
  nh_runtime_run(&rt, UV_RUN_DEFAULT);
  ASSERT_EQ_INT(running_seen, 1);
  ASSERT_EQ_INT(rt.running, 0);
  ASSERT_EQ_INT(nh_runtime_close(&rt), 0);
}

NH_TEST_MAIN()
