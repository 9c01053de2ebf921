/* Unit tests for core/nh_metrics.c: the exact exposition of counters, gauges and
 * histograms after a known sequence (numbers as Prometheus reads them: integers as
 * digits, NaN, +Inf, -Inf), label values escaped (backslash, quote, newline) and HELP
 * text, lookups that find the series they created (NULL reads "", values that join the
 * same stay apart), the NH_METRIC_MAX_SERIES bound (new label sets go to _overflow),
 * collectors, clear and reset, and the `--metrics off` switch. promtool checks a
 * rendered exposition when it is installed. */
#include "nh_test.h"

#include "core/nh_metrics.h"

#include <math.h>

/* Every test starts and ends with an empty registry, metrics on. */
static void fresh_cleanup(void *arg)
{
  (void)arg;
  nh_metrics_reset();
  nh_metrics_set_enabled(1);
}

static void fresh(void)
{
  nh_metrics_reset();
  nh_metrics_set_enabled(1);
  nh_test_on_cleanup(fresh_cleanup, NULL);
}

/* The exposition; freed by the test's cleanups. */
static const char *render(void)
{
  size_t len = 0;
  char *text = nh_metrics_render(&len);
  nh_test_on_cleanup(free, text);
  if (strlen(text) != len) FAIL("render: length %zu, but the text has %zu bytes", len, strlen(text));
  return text;
}

static const double small_buckets[3] = { 0.5, 1, 2.5 };

TEST(counter_gauge_histogram_render_exactly)
{
  fresh();
  static nh_metric_t events = NH_METRIC_DEF(NH_METRIC_COUNTER, "t_events_total", "Events seen", "endpoint", "outcome");
  static nh_metric_t depth = NH_METRIC_DEF(NH_METRIC_GAUGE, "t_depth", "Queue depth", "queue");
  static nh_metric_t lat = NH_HISTOGRAM_DEF("t_latency_seconds", "Latency", small_buckets, "endpoint");
  static nh_metric_t plain = NH_METRIC_DEF(NH_METRIC_COUNTER, "t_plain_total", "No labels, never counted");
  static nh_metric_t plain_h = NH_HISTOGRAM_DEF("t_plain_seconds", "No labels, never observed", small_buckets);

  nh_metric_add(&events, 1, "Erp", "completed");
  nh_metric_add(&events, 1, "Crm", "completed");
  nh_metric_add(&events, 2, "Erp", "completed");
  nh_metric_add(&events, 1, "Erp", "failed");
  nh_metric_add(&plain, 0);   /* registers it: one sample, 0 */
  nh_metric_set(&depth, 7, "a");
  nh_metric_add(&depth, -2, "a");
  nh_metric_set(&depth, -2.5, "b");
  nh_metric_set(&depth, 0.1, "c");
  nh_metric_set(&depth, 1e20, "d");
  nh_metric_set(&depth, NAN, "e");
  nh_metric_set(&depth, INFINITY, "f");
  nh_metric_set(&depth, -INFINITY, "g");
  nh_metric_set(&depth, 9007199254740991.0, "h");    /* 2^53 - 1: digits */
  nh_metric_set(&depth, 9007199254740992.0, "i");    /* 2^53: %.17g, the same digits */
  nh_metric_set(&depth, -0.0, "j");
  nh_metric_set(&depth, -12345678901.0, "k");
  nh_metric_observe(&lat, 0.25, "Erp");
  nh_metric_observe(&lat, 0.5, "Erp");   /* le is inclusive */
  nh_metric_observe(&lat, 1, "Erp");
  nh_metric_observe(&lat, 3, "Erp");     /* only +Inf */
  nh_metric_observe(&lat, 1.5, "Crm");
  nh_metric_observe(&plain_h, 0, NULL);   /* registered now; observed once */
  nh_metric_series_t *s = nh_metric_series(&lat, (const char *const[]){ "Erp" });
  ASSERT_TRUE(nh_metric_series_value(s) == 4);

  ASSERT_EQ_STR(render(),
                "# HELP t_events_total Events seen\n"
                "# TYPE t_events_total counter\n"
                "t_events_total{endpoint=\"Erp\",outcome=\"completed\"} 3\n"
                "t_events_total{endpoint=\"Crm\",outcome=\"completed\"} 1\n"
                "t_events_total{endpoint=\"Erp\",outcome=\"failed\"} 1\n"
                "# HELP t_plain_total No labels, never counted\n"
                "# TYPE t_plain_total counter\n"
                "t_plain_total 0\n"
                "# HELP t_depth Queue depth\n"
                "# TYPE t_depth gauge\n"
                "t_depth{queue=\"a\"} 5\n"
                "t_depth{queue=\"b\"} -2.5\n"
                "t_depth{queue=\"c\"} 0.10000000000000001\n"
                "t_depth{queue=\"d\"} 1e+20\n"
                "t_depth{queue=\"e\"} NaN\n"
                "t_depth{queue=\"f\"} +Inf\n"
                "t_depth{queue=\"g\"} -Inf\n"
                "t_depth{queue=\"h\"} 9007199254740991\n"
                "t_depth{queue=\"i\"} 9007199254740992\n"
                "t_depth{queue=\"j\"} 0\n"
                "t_depth{queue=\"k\"} -12345678901\n"
                "# HELP t_latency_seconds Latency\n"
                "# TYPE t_latency_seconds histogram\n"
                "t_latency_seconds_bucket{endpoint=\"Erp\",le=\"0.5\"} 2\n"
                "t_latency_seconds_bucket{endpoint=\"Erp\",le=\"1\"} 3\n"
                "t_latency_seconds_bucket{endpoint=\"Erp\",le=\"2.5\"} 3\n"
                "t_latency_seconds_bucket{endpoint=\"Erp\",le=\"+Inf\"} 4\n"
                "t_latency_seconds_sum{endpoint=\"Erp\"} 4.75\n"
                "t_latency_seconds_count{endpoint=\"Erp\"} 4\n"
                "t_latency_seconds_bucket{endpoint=\"Crm\",le=\"0.5\"} 0\n"
                "t_latency_seconds_bucket{endpoint=\"Crm\",le=\"1\"} 0\n"
                "t_latency_seconds_bucket{endpoint=\"Crm\",le=\"2.5\"} 1\n"
                "t_latency_seconds_bucket{endpoint=\"Crm\",le=\"+Inf\"} 1\n"
                "t_latency_seconds_sum{endpoint=\"Crm\"} 1.5\n"
                "t_latency_seconds_count{endpoint=\"Crm\"} 1\n"
                "# HELP t_plain_seconds No labels, never observed\n"
                "# TYPE t_plain_seconds histogram\n"
                "t_plain_seconds_bucket{le=\"0.5\"} 1\n"
                "t_plain_seconds_bucket{le=\"1\"} 1\n"
                "t_plain_seconds_bucket{le=\"2.5\"} 1\n"
                "t_plain_seconds_bucket{le=\"+Inf\"} 1\n"
                "t_plain_seconds_sum 0\n"
                "t_plain_seconds_count 1\n");
}

TEST(families_without_labels_always_have_their_sample)
{
  fresh();
  static nh_metric_t c = NH_METRIC_DEF(NH_METRIC_GAUGE, "t_generation", "Reloads");
  static nh_metric_t h = NH_HISTOGRAM_DEF("t_wait_seconds", "Waits", small_buckets);
  static nh_metric_t l = NH_METRIC_DEF(NH_METRIC_GAUGE, "t_labelled", "Labelled", "k");
  nh_metric_series(&c, NULL);   /* registers without a series of its own: NULL values are fine */
  nh_metric_clear(&c);
  nh_metric_series(&h, NULL);
  nh_metric_clear(&h);
  nh_metric_series(&l, (const char *const[]){ "x" });
  nh_metric_clear(&l);   /* a labelled family without series: HELP and TYPE only */
  ASSERT_EQ_STR(render(),
                "# HELP t_generation Reloads\n"
                "# TYPE t_generation gauge\n"
                "t_generation 0\n"
                "# HELP t_wait_seconds Waits\n"
                "# TYPE t_wait_seconds histogram\n"
                "t_wait_seconds_bucket{le=\"0.5\"} 0\n"
                "t_wait_seconds_bucket{le=\"1\"} 0\n"
                "t_wait_seconds_bucket{le=\"2.5\"} 0\n"
                "t_wait_seconds_bucket{le=\"+Inf\"} 0\n"
                "t_wait_seconds_sum 0\n"
                "t_wait_seconds_count 0\n"
                "# HELP t_labelled Labelled\n"
                "# TYPE t_labelled gauge\n");
}

TEST(label_values_and_help_are_escaped)
{
  fresh();
  static nh_metric_t m = NH_METRIC_DEF(NH_METRIC_COUNTER, "t_esc_total", "Back\\slash, \"quotes\" and a\nnewline",
                                       "path", "other");
  static nh_metric_t h = NH_HISTOGRAM_DEF("t_esc_seconds", "H", small_buckets, "path");
  nh_metric_add(&m, 1, "C:\\dir \"x\"\nnext", "plain");
  nh_metric_add(&m, 1, "C:\\dir \"x\"\nnext", "plain");   /* the same series: raw values are compared */
  nh_metric_add(&m, 1, "\\\\", "\"");
  nh_metric_observe(&h, 2, "a\"b");
  ASSERT_EQ_STR(render(),
                "# HELP t_esc_total Back\\\\slash, \"quotes\" and a\\nnewline\n"
                "# TYPE t_esc_total counter\n"
                "t_esc_total{path=\"C:\\\\dir \\\"x\\\"\\nnext\",other=\"plain\"} 2\n"
                "t_esc_total{path=\"\\\\\\\\\",other=\"\\\"\"} 1\n"
                "# HELP t_esc_seconds H\n"
                "# TYPE t_esc_seconds histogram\n"
                "t_esc_seconds_bucket{path=\"a\\\"b\",le=\"0.5\"} 0\n"
                "t_esc_seconds_bucket{path=\"a\\\"b\",le=\"1\"} 0\n"
                "t_esc_seconds_bucket{path=\"a\\\"b\",le=\"2.5\"} 1\n"
                "t_esc_seconds_bucket{path=\"a\\\"b\",le=\"+Inf\"} 1\n"
                "t_esc_seconds_sum{path=\"a\\\"b\"} 2\n"
                "t_esc_seconds_count{path=\"a\\\"b\"} 1\n");
}

TEST(lookups_find_their_series)
{
  fresh();
  static nh_metric_t m = NH_METRIC_DEF(NH_METRIC_COUNTER, "t_pairs_total", "Pairs", "a", "b");
  /* NULL reads "" */
  nh_metric_add(&m, 1, NULL, "x");
  nh_metric_add(&m, 1, "", "x");
  ASSERT_TRUE(nh_metric_series_value(nh_metric_series(&m, (const char *const[]){ "", "x" })) == 2);
  /* values that would join into the same text are different series */
  nh_metric_add(&m, 1, "ab", "");
  nh_metric_add(&m, 1, "a", "b");
  nh_metric_add(&m, 1, "a\x1f" "b", "");
  nh_metric_add(&m, 1, "a", "\x1f" "b");
  ASSERT_TRUE(nh_metric_series_value(nh_metric_series(&m, (const char *const[]){ "ab", "" })) == 1);
  ASSERT_TRUE(nh_metric_series_value(nh_metric_series(&m, (const char *const[]){ "a", "b" })) == 1);
  ASSERT_TRUE(nh_metric_series_value(nh_metric_series(&m, (const char *const[]){ "a\x1f" "b", "" })) == 1);
  /* many series (the table grows several times), each found again; long values too */
  char a[64], b[64];
  for (int i = 0; i < 3000; i++) {
    snprintf(a, sizeof a, "endpoint-with-a-long-name-%d", i);
    snprintf(b, sizeof b, "t%d", i % 7);
    nh_metric_add(&m, i, a, b);
  }
  for (int i = 0; i < 3000; i++) {
    snprintf(a, sizeof a, "endpoint-with-a-long-name-%d", i);
    snprintf(b, sizeof b, "t%d", i % 7);
    nh_metric_add(&m, 1, a, b);
    nh_metric_series_t *s = nh_metric_series(&m, (const char *const[]){ a, b });
    if (nh_metric_series_value(s) != i + 1) FAIL("series %s/%s: %g, expected %d", a, b, nh_metric_series_value(s), i + 1);
  }
  const char *text = render();
  ASSERT_CONTAINS(text, "t_pairs_total{a=\"endpoint-with-a-long-name-2999\",b=\"t3\"} 3000\n");
  ASSERT_CONTAINS(text, "t_pairs_total{a=\"\",b=\"x\"} 2\n");
}

TEST(past_the_series_bound_new_label_sets_count_as_overflow)
{
  fresh();
  static nh_metric_t m = NH_METRIC_DEF(NH_METRIC_COUNTER, "t_types_total", "Types", "endpoint", "type");
  static nh_metric_t h = NH_HISTOGRAM_DEF("t_types_seconds", "Types", small_buckets, "type");
  char t[32];
  for (int i = 0; i < NH_METRIC_MAX_SERIES; i++) {
    snprintf(t, sizeof t, "T%d", i);
    nh_metric_add(&m, 1, "Ep", t);
    nh_metric_observe(&h, 0.1, t);
  }
  ASSERT_EQ_INT((int)m.nseries, NH_METRIC_MAX_SERIES);
  for (int i = 0; i < 3; i++) {   /* three new label sets, one series for them */
    snprintf(t, sizeof t, "New%d", i);
    nh_metric_add(&m, 1, "Ep", t);
    nh_metric_observe(&h, 2, t);
  }
  nh_metric_add(&m, 5, "Ep", "T42");   /* existing series still count on their own */
  ASSERT_EQ_INT((int)m.nseries, NH_METRIC_MAX_SERIES + 1);
  ASSERT_EQ_INT((int)h.nseries, NH_METRIC_MAX_SERIES + 1);
  ASSERT_TRUE(nh_metric_series_value(nh_metric_series(&m, (const char *const[]){ "Ep", "T42" })) == 6);
  ASSERT_TRUE(nh_metric_series_value(nh_metric_series(&m, (const char *const[]){ "Ep", "Other" })) == 3);
  const char *text = render();
  ASSERT_CONTAINS(text, "\nt_types_total{endpoint=\"_overflow\",type=\"_overflow\"} 3\n");
  ASSERT_CONTAINS(text, "\nt_types_seconds_bucket{type=\"_overflow\",le=\"2.5\"} 3\n");
  ASSERT_CONTAINS(text, "\nt_types_seconds_count{type=\"_overflow\"} 3\n");
  ASSERT_TRUE(strstr(text, "New0") == NULL);
}

static int collected;
static void collect(void *data)
{
  collected++;
  nh_metric_set(data, collected);
}

TEST(collectors_run_before_each_render)
{
  fresh();
  static nh_metric_t g = NH_METRIC_DEF(NH_METRIC_GAUGE, "t_collected", "Collected");
  collected = 0;
  nh_metrics_on_collect(collect, &g);
  ASSERT_CONTAINS(render(), "\nt_collected 1\n");
  ASSERT_CONTAINS(render(), "\nt_collected 2\n");
  nh_metrics_off_collect(collect, &g);
  ASSERT_CONTAINS(render(), "\nt_collected 2\n");
  ASSERT_EQ_INT(collected, 2);
}

TEST(clear_and_reset_start_over)
{
  fresh();
  static nh_metric_t m = NH_METRIC_DEF(NH_METRIC_GAUGE, "t_mem_bytes", "Memory", "adapter");
  nh_metric_set(&m, 1, "a.lua");
  nh_metric_set(&m, 2, "b.lua");
  nh_metric_clear(&m);
  nh_metric_set(&m, 3, "c.lua");
  ASSERT_EQ_STR(render(), "# HELP t_mem_bytes Memory\n# TYPE t_mem_bytes gauge\nt_mem_bytes{adapter=\"c.lua\"} 3\n");
  nh_metrics_reset();
  ASSERT_EQ_STR(render(), "");
  nh_metric_set(&m, 4, "d.lua");   /* the family registers again */
  ASSERT_EQ_STR(render(), "# HELP t_mem_bytes Memory\n# TYPE t_mem_bytes gauge\nt_mem_bytes{adapter=\"d.lua\"} 4\n");
}

TEST(metrics_off_makes_updates_no_ops_and_renders_one_comment)
{
  fresh();
  static nh_metric_t c = NH_METRIC_DEF(NH_METRIC_COUNTER, "t_off_total", "Off", "k");
  static nh_metric_t g = NH_METRIC_DEF(NH_METRIC_GAUGE, "t_off_gauge", "Off", "k");
  static nh_metric_t h = NH_HISTOGRAM_DEF("t_off_seconds", "Off", small_buckets, "k");
  nh_metric_add(&c, 1, "before");
  nh_metric_series_t *s = nh_metric_series(&h, (const char *const[]){ "before" });
  nh_metrics_set_enabled(0);
  ASSERT_FALSE(nh_metrics_enabled());
  collected = 0;
  nh_metrics_on_collect(collect, &g);
  nh_metric_add(&c, 1, "before");
  nh_metric_add(&c, 1, "during");
  nh_metric_set(&g, 1, "during");
  nh_metric_observe(&h, 1, "during");
  nh_metric_series_observe(s, 1);
  nh_metric_series_add(nh_metric_series(&c, (const char *const[]){ "before" }), 1);
  ASSERT_EQ_STR(render(), "# metrics are off (nimbus-host run --metrics off)\n");
  ASSERT_EQ_INT(collected, 0);   /* collectors do not run either */
  nh_metrics_off_collect(collect, &g);
  nh_metrics_set_enabled(1);
  ASSERT_TRUE(nh_metrics_enabled());
  ASSERT_EQ_INT((int)c.nseries, 1);
  ASSERT_FALSE(g.registered);
  ASSERT_TRUE(nh_metric_series_value(s) == 0);
  ASSERT_EQ_STR(render(),
                "# HELP t_off_total Off\n"
                "# TYPE t_off_total counter\n"
                "t_off_total{k=\"before\"} 1\n"
                "# HELP t_off_seconds Off\n"
                "# TYPE t_off_seconds histogram\n"
                "t_off_seconds_bucket{k=\"before\",le=\"0.5\"} 0\n"
                "t_off_seconds_bucket{k=\"before\",le=\"1\"} 0\n"
                "t_off_seconds_bucket{k=\"before\",le=\"2.5\"} 0\n"
                "t_off_seconds_bucket{k=\"before\",le=\"+Inf\"} 0\n"
                "t_off_seconds_sum{k=\"before\"} 0\n"
                "t_off_seconds_count{k=\"before\"} 0\n");
}

TEST(a_large_exposition_renders_whole_and_promtool_accepts_it)
{
  fresh();
  static nh_metric_t ev = NH_METRIC_DEF(NH_METRIC_COUNTER, "t_big_events_total", "Events", "endpoint", "type",
                                        "outcome");
  static nh_metric_t hd = NH_HISTOGRAM_DEF("t_big_handler_seconds", "Handler \\ time\nin seconds",
                                           nh_metric_buckets_fast, "endpoint", "type");
  static nh_metric_t qt = NH_HISTOGRAM_DEF("t_big_queue_seconds", "Queue", nh_metric_buckets_slow, "endpoint");
  static nh_metric_t g = NH_METRIC_DEF(NH_METRIC_GAUGE, "t_big_values", "Odd values", "endpoint");
  char ep[32];
  for (int e = 0; e < 50; e++) {
    snprintf(ep, sizeof ep, "Ep\"%02d\\\n", e);
    for (int t = 0; t < 2; t++) {
      nh_metric_add(&ev, 1, ep, t ? "B" : "A", "completed");
      nh_metric_observe(&hd, 0.0001234 * (e + 1), ep, t ? "B" : "A");
    }
    nh_metric_observe(&qt, 1e-9 * e, ep);
    nh_metric_set(&g, e % 4 == 0 ? NAN : e % 4 == 1 ? -INFINITY : e % 4 == 2 ? 1e300 : -1.0 / 3, ep);
  }
  size_t len = 0;
  char *text = nh_metrics_render(&len);
  nh_test_on_cleanup(free, text);
  ASSERT_EQ_INT((int)strlen(text), (int)len);
  int samples = 0;
  for (const char *p = text; *p; p = strchr(p, '\n') + 1)
    if (*p != '#') samples++;
  ASSERT_EQ_INT(samples, 100 + 100 * 17 + 50 * 21 + 50);
  ASSERT_EQ_INT(text[len - 1], '\n');
  if (system("command -v promtool >/dev/null 2>&1") != 0) {
    /* make test installs it (scripts/deps.sh); only a bare developer build may lack it */
    const char *ci = getenv("CI");
    ASSERT_TRUE(!(ci && strcmp(ci, "true") == 0));
    printf("     (promtool is not installed: the exposition was not checked by it)\n");
    return;
  }
  const char *path = nh_test_path("metrics.txt");
  ASSERT_EQ_INT(nh_test_write_file(path, text), 0);
  char cmd[PATH_MAX + 64];
  snprintf(cmd, sizeof cmd, "promtool check metrics < '%s' >/dev/null 2>&1", path);
  ASSERT_EQ_INT(system(cmd), 0);
}

NH_TEST_MAIN()
