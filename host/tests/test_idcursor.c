/* Unit tests for core/nh_idcursor: ids that commit out of order are each taken once, a
 * late one below the top is still taken, and a gap that never fills is given up after
 * gap_ms, not before. */
#include "nh_test.h"

#include "core/nh_idcursor.h"

TEST(takes_each_id_once_and_moves_over_a_run)
{
  nh_idcursor_t c;
  nh_idcursor_init(&c, 10, 1000);
  ASSERT_EQ_INT(nh_idcursor_take(&c, 10, 0), 0);   /* at or below low: seen before */
  ASSERT_EQ_INT(nh_idcursor_take(&c, 11, 0), 1);
  ASSERT_EQ_INT(nh_idcursor_take(&c, 12, 0), 1);
  ASSERT_EQ_INT(nh_idcursor_take(&c, 12, 0), 0);
  nh_idcursor_advance(&c, 0);
  ASSERT_EQ_INT(c.low, 12);
  ASSERT_EQ_INT(c.n, 0);
  ASSERT_EQ_INT(nh_idcursor_top(&c), 12);
  nh_idcursor_free(&c);
}

TEST(waits_for_a_late_id_below_the_top)
{
  nh_idcursor_t c;
  nh_idcursor_init(&c, 0, 1000);
  ASSERT_EQ_INT(nh_idcursor_take(&c, 1, 0), 1);
  ASSERT_EQ_INT(nh_idcursor_take(&c, 3, 0), 1);   /* 2's transaction has not committed yet */
  ASSERT_EQ_INT(nh_idcursor_take(&c, 5, 0), 1);
  nh_idcursor_advance(&c, 500);
  ASSERT_EQ_INT(c.low, 1);
  ASSERT_EQ_INT(nh_idcursor_top(&c), 5);
  int64_t g[8];
  ASSERT_EQ_INT(nh_idcursor_gaps(&c, g, 4), 2);
  ASSERT_EQ_INT(g[0], 1);
  ASSERT_EQ_INT(g[1], 3);
  ASSERT_EQ_INT(g[2], 3);
  ASSERT_EQ_INT(g[3], 5);
  ASSERT_EQ_INT(nh_idcursor_gaps(&c, g, 1), 1);   /* the highest gap first */
  ASSERT_EQ_INT(g[0], 3);
  ASSERT_EQ_INT(g[1], 5);
  ASSERT_EQ_INT(nh_idcursor_take(&c, 2, 600), 1);   /* it commits: taken, once */
  ASSERT_EQ_INT(nh_idcursor_take(&c, 2, 600), 0);
  nh_idcursor_advance(&c, 600);
  ASSERT_EQ_INT(c.low, 3);
  nh_idcursor_free(&c);
}

TEST(gives_a_gap_up_after_gap_ms_not_before)
{
  nh_idcursor_t c;
  nh_idcursor_init(&c, 0, 1000);
  ASSERT_EQ_INT(nh_idcursor_take(&c, 2, 100), 1);   /* 1 rolled back: never comes */
  ASSERT_EQ_INT(nh_idcursor_take(&c, 4, 700), 1);   /* 3 too */
  nh_idcursor_advance(&c, 1099);
  ASSERT_EQ_INT(c.low, 0);
  nh_idcursor_advance(&c, 1100);   /* 2 was taken gap_ms ago: 1 is given up, 3 not yet */
  ASSERT_EQ_INT(c.low, 2);
  ASSERT_EQ_INT(nh_idcursor_take(&c, 1, 1100), 0);   /* too late: below low */
  nh_idcursor_advance(&c, 1700);
  ASSERT_EQ_INT(c.low, 4);
  ASSERT_EQ_INT(c.n, 0);
  int64_t g[2];
  ASSERT_EQ_INT(nh_idcursor_gaps(&c, g, 1), 0);
  nh_idcursor_free(&c);
}

TEST(keeps_many_ids_in_order)
{
  nh_idcursor_t c;
  nh_idcursor_init(&c, 0, 1000);
  for (int64_t id = 1000; id >= 2; id--) ASSERT_EQ_INT(nh_idcursor_take(&c, id, 0), 1);   /* grows past its first size */
  nh_idcursor_advance(&c, 0);
  ASSERT_EQ_INT(c.low, 0);   /* 1 still missing */
  ASSERT_EQ_INT(nh_idcursor_take(&c, 1, 0), 1);
  nh_idcursor_advance(&c, 0);
  ASSERT_EQ_INT(c.low, 1000);
  nh_idcursor_free(&c);
}

NH_TEST_MAIN()
