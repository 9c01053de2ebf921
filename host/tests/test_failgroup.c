/* Unit tests for core/nh_failgroup: what is masked, what is kept, and that the id is
 * stable and tells groups apart. */
#include "nh_test.h"

#include "core/nh_failgroup.h"

static const char *mask(const char *s)
{
  static char out[512];
  nh_failgroup_mask(s, out, sizeof out);
  return out;
}

TEST(masks_variable_parts)
{
  ASSERT_EQ_STR(mask("ERP unavailable: connection to erp-7 refused (order 123)"),
                "ERP unavailable: connection to erp-<n> refused (order <n>)");
  ASSERT_EQ_STR(mask("customer 0b5e2c1a-3f4d-4e5f-8a9b-0c1d2e3f4a5b not found"), "customer <uuid> not found");
  ASSERT_EQ_STR(mask("job DMF-1a2b3c4d5e6f rejected"), "job DMF-<id> rejected");
  ASSERT_EQ_STR(mask("bad postal code \"12345\" for 'Oslo'"), "bad postal code \"<s>\" for '<s>'");
  ASSERT_EQ_STR(mask("GET https://erp.example/api/orders?id=42&x=y failed: 503"),
                "GET https://erp.example/api/orders?<q> failed: <n>");
  ASSERT_EQ_STR(mask("adapter.lua:17: boom"), "adapter.lua:<n>: boom");
  /* where the adapter is installed does not split a group */
  ASSERT_EQ_STR(mask("/srv/nimbus/adapters/erp.lua:17: ERP down"), "erp.lua:<n>: ERP down");
  ASSERT_EQ_STR(mask("/tmp/nh-func.x1/adapters/erp.lua:17: ERP down"), "erp.lua:<n>: ERP down");
}

TEST(keeps_words_and_apostrophes)
{
  ASSERT_EQ_STR(mask("can't reach the ERP"), "can't reach the ERP");
  ASSERT_EQ_STR(mask("it's Bob's order"), "it's Bob's order");
  ASSERT_EQ_STR(mask("why?"), "why?");
  ASSERT_EQ_STR(mask("abcdef deadbeef"), "abcdef deadbeef");   /* hex-looking words without a digit stay */
}

TEST(only_the_first_line_counts)
{
  ASSERT_EQ_STR(mask("boom 1\nstack traceback:\n  x.lua:3: in function"), "boom <n>");
  ASSERT_EQ_STR(mask("trailing  \n"), "trailing");
  ASSERT_EQ_STR(mask(NULL), "");
}

TEST(cuts_long_text_safely)
{
  char big[2000];
  memset(big, 'a', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  char out[16];
  nh_failgroup_mask(big, out, sizeof out);
  ASSERT_EQ_INT((long long)strlen(out), 15);
}

TEST(group_id_is_stable_and_separates)
{
  char a[13], b[13], c[13], d[13], e[13];
  nh_failgroup_id("Erp", "Error", "ERP down (order 1)", a);
  nh_failgroup_id("Erp", "Error", "ERP down (order 99999)", b);
  nh_failgroup_id("Crm", "Error", "ERP down (order 1)", c);
  nh_failgroup_id("Erp", "Timeout", "ERP down (order 1)", d);
  nh_failgroup_id("Erp", NULL, "ERP down (order 1)", e);
  ASSERT_EQ_STR(a, b);
  ASSERT_NE_STR(a, c);
  ASSERT_NE_STR(a, d);
  ASSERT_NE_STR(a, e);
  ASSERT_EQ_INT((long long)strlen(a), 12);
  /* pinned: an id must not change between releases (operators keep them in runbooks) */
  char pinned[13];
  nh_failgroup_id("Erp", "Error", "ERP down", pinned);
  ASSERT_EQ_STR(pinned, "4999b308ee04");
}

NH_TEST_MAIN()
