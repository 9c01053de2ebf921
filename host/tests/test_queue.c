/* Unit tests for core/nh_queue.h: order at both ends, removal from the middle (and a
 * second removal), ordered insertion after an element, iteration that removes, move. */
#include "nh_test.h"

#include "core/nh_queue.h"

typedef struct item {
  int id;
  nh_queue_t node;
} item_t;

/* The ids from head to tail, as "1,2,3" ("" when empty); the prev links must agree. */
static const char *ids(nh_queue_t *h)
{
  static char out[256];
  int fwd[32], nf = 0, nb = 0;
  nh_queue_t *q;
  nh_queue_foreach(q, h) if (nf < 32) fwd[nf++] = nh_queue_data(q, item_t, node)->id;
  for (q = nh_queue_tail(h); q != h; q = nh_queue_prev(q), nb++)
    if (nb >= nf || nh_queue_data(q, item_t, node)->id != fwd[nf - 1 - nb]) return "prev links disagree";
  if (nb != nf) return "prev links disagree";
  size_t n = 0;
  out[0] = '\0';
  for (int i = 0; i < nf; i++) n += (size_t)snprintf(out + n, sizeof out - n, "%s%d", i ? "," : "", fwd[i]);
  return out;
}

static void fill(nh_queue_t *h, item_t *items, int n)
{
  nh_queue_init(h);
  for (int i = 0; i < n; i++) {
    items[i].id = i + 1;
    nh_queue_insert_tail(h, &items[i].node);
  }
}

TEST(insert_at_both_ends)
{
  nh_queue_t h;
  item_t a = { .id = 1 }, b = { .id = 2 }, c = { .id = 3 };
  nh_queue_init(&h);
  ASSERT_TRUE(nh_queue_empty(&h));
  ASSERT_TRUE(nh_queue_head(&h) == &h);
  ASSERT_EQ_STR(ids(&h), "");
  nh_queue_insert_tail(&h, &b.node);
  nh_queue_insert_tail(&h, &c.node);
  nh_queue_insert_head(&h, &a.node);
  ASSERT_FALSE(nh_queue_empty(&h));
  ASSERT_EQ_STR(ids(&h), "1,2,3");
  ASSERT_TRUE(nh_queue_data(nh_queue_head(&h), item_t, node) == &a);
  ASSERT_TRUE(nh_queue_data(nh_queue_tail(&h), item_t, node) == &c);
  ASSERT_TRUE(nh_queue_next(&a.node) == &b.node);
  ASSERT_TRUE(nh_queue_next(&c.node) == &h);
}

TEST(remove_from_the_middle)
{
  nh_queue_t h;
  item_t it[5];
  fill(&h, it, 5);
  nh_queue_remove(&it[2].node);
  ASSERT_EQ_STR(ids(&h), "1,2,4,5");
  ASSERT_TRUE(nh_queue_empty(&it[2].node));   /* unlinked, and says so */
  nh_queue_remove(&it[2].node);                /* a second removal changes nothing */
  ASSERT_EQ_STR(ids(&h), "1,2,4,5");
  nh_queue_remove(&it[0].node);
  nh_queue_remove(&it[4].node);
  ASSERT_EQ_STR(ids(&h), "2,4");
  nh_queue_remove(&it[1].node);
  nh_queue_remove(&it[3].node);
  ASSERT_TRUE(nh_queue_empty(&h));
  ASSERT_EQ_STR(ids(&h), "");
}

TEST(insert_after_an_element)
{
  nh_queue_t h;
  item_t it[3], x = { .id = 9 }, y = { .id = 8 };
  fill(&h, it, 3);
  nh_queue_insert_head(&it[0].node, &x.node);   /* right after 1 */
  nh_queue_insert_tail(&it[0].node, &y.node);   /* right before 1 */
  ASSERT_EQ_STR(ids(&h), "8,1,9,2,3");
}

TEST(iterate_and_remove)
{
  nh_queue_t h;
  item_t it[6];
  fill(&h, it, 6);
  nh_queue_t *q, *n;
  int seen = 0;
  nh_queue_foreach_safe(q, n, &h) {   /* drop the even ones as we go */
    item_t *e = nh_queue_data(q, item_t, node);
    seen++;
    if (e->id % 2 == 0) nh_queue_remove(q);
  }
  ASSERT_EQ_INT(seen, 6);
  ASSERT_EQ_STR(ids(&h), "1,3,5");
  nh_queue_foreach_safe(q, n, &h) nh_queue_remove(q);   /* and then all of them */
  ASSERT_TRUE(nh_queue_empty(&h));
  /* popping the head until empty: FIFO order */
  fill(&h, it, 3);
  char order[16] = "";
  while (!nh_queue_empty(&h)) {
    item_t *e = nh_queue_data(nh_queue_head(&h), item_t, node);
    nh_queue_remove(&e->node);
    snprintf(order + strlen(order), sizeof order - strlen(order), "%d", e->id);
  }
  ASSERT_EQ_STR(order, "123");
}

TEST(move_and_static_init)
{
  static nh_queue_t s = NH_QUEUE_INITIALIZER(s);
  ASSERT_TRUE(nh_queue_empty(&s));
  nh_queue_t h, n;
  item_t it[3];
  fill(&h, it, 3);
  nh_queue_move(&h, &n);
  ASSERT_TRUE(nh_queue_empty(&h));
  ASSERT_EQ_STR(ids(&n), "1,2,3");
  nh_queue_move(&h, &n);   /* an empty one leaves n empty */
  ASSERT_TRUE(nh_queue_empty(&n));
}

NH_TEST_MAIN()
