/* Unit tests for dispatch/nh_retry.c: delay strategies, jitter, caps, policy selection
 * and the attempt limit. */
#include "nh_test.h"

#include "dispatch/nh_retry.h"

static nh_retry_policy_t policy(nh_retry_strategy_t s, int64_t base, int max_retries)
{
  nh_retry_policy_t p;
  nh_retry_policy_init(&p);
  p.strategy = s;
  p.base_ms = base;
  p.max_retries = max_retries;
  return p;
}

TEST(policy_init_defaults)
{
  nh_retry_policy_t p;
  memset(&p, 0x5a, sizeof p);
  nh_retry_policy_init(&p);
  ASSERT_EQ_INT(p.max_retries, 0);
  ASSERT_EQ_INT(p.strategy, NH_RETRY_FIXED);
  ASSERT_EQ_INT(p.base_ms, 1000);
  ASSERT_EQ_INT(p.max_delay_ms, 0);
  ASSERT_EQ_INT(p.jitter, NH_JITTER_NONE);
}

TEST(delay_fixed)
{
  nh_retry_policy_t p = policy(NH_RETRY_FIXED, 250, 5);
  for (int n = 0; n < 10; n++) ASSERT_EQ_INT(nh_retry_delay_ms(&p, n, 0.0), 250);
}

TEST(delay_linear)
{
  nh_retry_policy_t p = policy(NH_RETRY_LINEAR, 100, 5);
  ASSERT_EQ_INT(nh_retry_delay_ms(&p, 0, 0.0), 100);
  ASSERT_EQ_INT(nh_retry_delay_ms(&p, 1, 0.0), 200);
  ASSERT_EQ_INT(nh_retry_delay_ms(&p, 2, 0.0), 300);
  ASSERT_EQ_INT(nh_retry_delay_ms(&p, 9, 0.0), 1000);
}

TEST(delay_exponential)
{
  nh_retry_policy_t p = policy(NH_RETRY_EXPONENTIAL, 100, 5);
  ASSERT_EQ_INT(nh_retry_delay_ms(&p, 0, 0.0), 100);
  ASSERT_EQ_INT(nh_retry_delay_ms(&p, 1, 0.0), 200);
  ASSERT_EQ_INT(nh_retry_delay_ms(&p, 2, 0.0), 400);
  ASSERT_EQ_INT(nh_retry_delay_ms(&p, 5, 0.0), 3200);
  /* huge attempt numbers neither overflow nor go negative */
  int64_t big = nh_retry_delay_ms(&p, 1000, 0.0);
  ASSERT_CMP_INT(big, >, 0);
  ASSERT_CMP_INT(big, >=, nh_retry_delay_ms(&p, 30, 0.0));
}

TEST(max_delay_caps_every_strategy)
{
  nh_retry_strategy_t ss[] = { NH_RETRY_FIXED, NH_RETRY_LINEAR, NH_RETRY_EXPONENTIAL };
  for (int i = 0; i < 3; i++) {
    nh_retry_policy_t p = policy(ss[i], 1000, 5);
    p.max_delay_ms = 2500;
    for (int n = 0; n < 20; n++) {
      int64_t d = nh_retry_delay_ms(&p, n, 0.0);
      ASSERT_CMP_INT(d, <=, 2500);
      ASSERT_CMP_INT(d, >=, 1000);
    }
    p.jitter = NH_JITTER_FULL;
    ASSERT_CMP_INT(nh_retry_delay_ms(&p, 19, 0.999), <=, 2500);   /* jitter does not escape the cap */
  }
  nh_retry_policy_t p = policy(NH_RETRY_EXPONENTIAL, 1000, 5);
  p.max_delay_ms = 2500;
  ASSERT_EQ_INT(nh_retry_delay_ms(&p, 1, 0.0), 2000);
  ASSERT_EQ_INT(nh_retry_delay_ms(&p, 2, 0.0), 2500);
  ASSERT_EQ_INT(nh_retry_delay_ms(&p, 50, 0.0), 2500);
}

TEST(jitter_never_shortens)
{
  nh_retry_jitter_t js[] = { NH_JITTER_NONE, NH_JITTER_FULL, NH_JITTER_BOUNDED };
  nh_retry_strategy_t ss[] = { NH_RETRY_FIXED, NH_RETRY_LINEAR, NH_RETRY_EXPONENTIAL };
  double us[] = { 0.0, 0.001, 0.25, 0.5, 0.75, 0.999999 };
  for (int s = 0; s < 3; s++)
    for (int j = 0; j < 3; j++)
      for (int n = 0; n < 6; n++)
        for (int k = 0; k < 6; k++) {
          nh_retry_policy_t base = policy(ss[s], 300, 5);
          nh_retry_policy_t p = base;
          p.jitter = js[j];
          int64_t plain = nh_retry_delay_ms(&base, n, 0.0);
          int64_t d = nh_retry_delay_ms(&p, n, us[k]);
          if (d < plain) FAIL("strategy %d jitter %d n %d u %g: %lld < %lld", s, j, n, us[k], (long long)d,
                              (long long)plain);
        }
}

TEST(jitter_bounds)
{
  nh_retry_policy_t p = policy(NH_RETRY_FIXED, 1000, 3);
  p.jitter = NH_JITTER_FULL;
  ASSERT_EQ_INT(nh_retry_delay_ms(&p, 0, 0.0), 1000);
  ASSERT_EQ_INT(nh_retry_delay_ms(&p, 0, 0.5), 1500);
  ASSERT_CMP_INT(nh_retry_delay_ms(&p, 0, 0.9999), <, 2000);
  p.jitter = NH_JITTER_BOUNDED;
  p.jitter_factor = 0.25;
  ASSERT_EQ_INT(nh_retry_delay_ms(&p, 0, 0.0), 1000);
  ASSERT_EQ_INT(nh_retry_delay_ms(&p, 0, 0.5), 1125);
  ASSERT_CMP_INT(nh_retry_delay_ms(&p, 0, 0.9999), <, 1250);
  p.jitter = NH_JITTER_NONE;
  ASSERT_EQ_INT(nh_retry_delay_ms(&p, 0, 0.9), 1000);
}

/* ---------------------------------------------------------------- selection */

typedef struct {
  nh_retry_config_t c;
  nh_retry_rule_t rules[4];
  nh_retry_type_policy_t types[2];
  char *rule_types[1];
} cfg_t;

/* default: 1 retry; per type "Slow": 4; rules: "timeout" (any type) 7, "busy" only for
 * "Order" 9, "TIMEOUT again" never reached because the first "timeout" rule matches first. */
static void make_cfg(cfg_t *f)
{
  memset(f, 0, sizeof *f);
  f->c.has_default = 1;
  f->c.def = policy(NH_RETRY_FIXED, 10, 1);

  f->rules[0].match = "timeout";
  f->rules[0].policy = policy(NH_RETRY_FIXED, 10, 7);
  f->rule_types[0] = "Order";
  f->rules[1].match = "busy";
  f->rules[1].types = f->rule_types;
  f->rules[1].ntypes = 1;
  f->rules[1].policy = policy(NH_RETRY_FIXED, 10, 9);
  f->rules[2].match = "timeout again";
  f->rules[2].policy = policy(NH_RETRY_FIXED, 10, 11);
  f->c.rules = f->rules;
  f->c.nrules = 3;

  f->types[0].event_type = "Slow";
  f->types[0].policy = policy(NH_RETRY_FIXED, 10, 4);
  f->c.per_type = f->types;
  f->c.ntypes = 1;
}

TEST(select_first_matching_rule_case_insensitive_substring)
{
  cfg_t f;
  make_cfg(&f);
  const nh_retry_policy_t *p = nh_retry_select(&f.c, "Any", "HTTP request TIMEOUT after 2 s");
  ASSERT_TRUE(p == &f.rules[0].policy);
  ASSERT_EQ_INT(p->max_retries, 7);
  /* the first matching rule wins even when a later one matches too */
  ASSERT_TRUE(nh_retry_select(&f.c, "Any", "timeout again") == &f.rules[0].policy);
  /* rules come before the per-type policy */
  ASSERT_TRUE(nh_retry_select(&f.c, "Slow", "a Timeout") == &f.rules[0].policy);
}

TEST(select_type_restricted_rule)
{
  cfg_t f;
  make_cfg(&f);
  ASSERT_TRUE(nh_retry_select(&f.c, "Order", "ERP Busy, try later") == &f.rules[1].policy);
  ASSERT_TRUE(nh_retry_select(&f.c, "order", "erp busy") == &f.rules[1].policy);   /* type is case-insensitive */
  /* other types skip the rule and fall through to their type policy or the default */
  ASSERT_TRUE(nh_retry_select(&f.c, "Invoice", "ERP busy") == &f.c.def);
  ASSERT_TRUE(nh_retry_select(&f.c, "Slow", "ERP busy") == &f.types[0].policy);
  ASSERT_TRUE(nh_retry_select(&f.c, NULL, "ERP busy") == &f.c.def);
}

TEST(select_per_type_then_default)
{
  cfg_t f;
  make_cfg(&f);
  ASSERT_TRUE(nh_retry_select(&f.c, "Slow", "boom") == &f.types[0].policy);
  ASSERT_TRUE(nh_retry_select(&f.c, "Fast", "boom") == &f.c.def);
  ASSERT_TRUE(nh_retry_select(&f.c, "Slow", NULL) == &f.types[0].policy);
  f.c.has_default = 0;
  ASSERT_NULL(nh_retry_select(&f.c, "Fast", "boom"));
  ASSERT_TRUE(nh_retry_select(&f.c, "Slow", "boom") == &f.types[0].policy);
  nh_retry_config_t empty;
  memset(&empty, 0, sizeof empty);
  ASSERT_NULL(nh_retry_select(&empty, "Any", "timeout"));
}

TEST(next_respects_max_retries)
{
  cfg_t f;
  make_cfg(&f);
  /* default allows 1 retry: 2 attempts */
  ASSERT_EQ_INT(nh_retry_next(&f.c, "Fast", "boom", 0), 10);
  ASSERT_EQ_INT(nh_retry_next(&f.c, "Fast", "boom", 1), -1);
  ASSERT_EQ_INT(nh_retry_next(&f.c, "Fast", "boom", 5), -1);
  /* per type 4 retries: 5 attempts */
  for (int done = 0; done < 4; done++) ASSERT_EQ_INT(nh_retry_next(&f.c, "Slow", "boom", done), 10);
  ASSERT_EQ_INT(nh_retry_next(&f.c, "Slow", "boom", 4), -1);
  /* rule: 7 retries */
  ASSERT_EQ_INT(nh_retry_next(&f.c, "Slow", "timeout", 6), 10);
  ASSERT_EQ_INT(nh_retry_next(&f.c, "Slow", "timeout", 7), -1);
  /* max_retries 0 never retries; no policy never retries */
  f.c.def.max_retries = 0;
  ASSERT_EQ_INT(nh_retry_next(&f.c, "Fast", "boom", 0), -1);
  f.c.has_default = 0;
  ASSERT_EQ_INT(nh_retry_next(&f.c, "Fast", "boom", 0), -1);
}

TEST(next_delay_follows_strategy_and_jitter)
{
  nh_retry_config_t c;
  memset(&c, 0, sizeof c);
  c.has_default = 1;
  c.def = policy(NH_RETRY_EXPONENTIAL, 100, 3);
  ASSERT_EQ_INT(nh_retry_next(&c, "T", "e", 0), 100);
  ASSERT_EQ_INT(nh_retry_next(&c, "T", "e", 1), 200);
  ASSERT_EQ_INT(nh_retry_next(&c, "T", "e", 2), 400);
  ASSERT_EQ_INT(nh_retry_next(&c, "T", "e", 3), -1);
  c.def.jitter = NH_JITTER_BOUNDED;
  c.def.jitter_factor = 0.5;
  for (int i = 0; i < 200; i++) {
    int64_t d = nh_retry_next(&c, "T", "e", 1);
    ASSERT_CMP_INT(d, >=, 200);
    ASSERT_CMP_INT(d, <, 300);
  }
}

TEST(config_free_releases_owned_config)
{
  nh_retry_config_t c;
  memset(&c, 0, sizeof c);
  c.nrules = 1;
  c.rules = calloc(1, sizeof *c.rules);
  c.rules[0].match = strdup("timeout");
  c.rules[0].ntypes = 2;
  c.rules[0].types = calloc(3, sizeof(char *));
  c.rules[0].types[0] = strdup("A");
  c.rules[0].types[1] = strdup("B");
  c.ntypes = 1;
  c.per_type = calloc(1, sizeof *c.per_type);
  c.per_type[0].event_type = strdup("Slow");
  nh_retry_config_free(&c);   /* leaks show under ASan / valgrind */
  ASSERT_NULL(c.rules);
  ASSERT_EQ_INT(c.nrules, 0);
  ASSERT_NULL(c.per_type);
}

NH_TEST_MAIN()
