/* The query-plan test (outage scale): every statement the store and the transports
 * prepare, and the operator queries built from filters, must reach the rows they touch
 * through an index. A full scan ("SCAN t", with or without an index) of a table that
 * grows with traffic makes the cost of a pump grow with the backlog; this test fails on
 * one and prints the statement with its plan. */
#include "nh_test.h"
#include "core/nh_runtime.h"

#include "core/nh_log.h"
#include "net/nh_http_client.h"
#include "store/nh_store.h"
#include "transport/nh_amqp.h"
#include "transport/nh_embedded.h"

#include <sqlite3.h>
#include <uv.h>

/* Tables whose size follows the traffic or the backlog. */
static const char *const growing[] = { "queue", "parked", "sessions", "audit", "history", "processed", "inbox",
                                       "dead_letters", "amqp_deliveries", "operator_log", NULL };

/* A line of the plan that scans a growing table, or NULL. `aliases` are extra names
 * (the plan names a table by its alias: "SCAN q"). */
static const char *scans_growing(const char *detail)
{
  static const char *const alias_of[][2] = { { "q", "queue" }, { "l", "session_locks" }, { "g", "audit" },
                                             { "a2", "audit" }, { "p", "operator_pending" }, { NULL, NULL } };
  if (strncmp(detail, "SCAN ", 5) != 0) return NULL;
  char name[64];
  size_t n = strcspn(detail + 5, " ");
  if (n >= sizeof name) n = sizeof name - 1;
  memcpy(name, detail + 5, n);
  name[n] = '\0';
  const char *table = name;
  for (int i = 0; alias_of[i][0]; i++)
    if (strcmp(name, alias_of[i][0]) == 0) table = alias_of[i][1];
  for (int i = 0; growing[i]; i++)
    if (strcmp(table, growing[i]) == 0) return growing[i];
  return NULL;
}

/* Plan of `sql` as text, one detail per line; *bad gets the first growing table scanned. */
static char *plan_of(sqlite3 *db, const char *sql, const char **bad)
{
  static char out[4096];
  out[0] = '\0';
  *bad = NULL;
  char *eqp = sqlite3_mprintf("EXPLAIN QUERY PLAN %s", sql);
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(db, eqp, -1, &st, NULL) != SQLITE_OK) FAIL("cannot explain %s: %s", sql, sqlite3_errmsg(db));
  sqlite3_free(eqp);
  while (sqlite3_step(st) == SQLITE_ROW) {
    const char *detail = (const char *)sqlite3_column_text(st, 3);
    size_t len = strlen(out);
    snprintf(out + len, sizeof out - len, "    %s\n", detail);
    const char *t = scans_growing(detail);
    if (t && !*bad) *bad = t;
  }
  sqlite3_finalize(st);
  return out;
}

static void on_msg(void *data, nh_msg_t *m) { (void)data; nh_msg_clear(m); free(m); }

TEST(every_prepared_statement_is_bounded_by_an_index)
{
  nh_store_t *s = NULL;
  nh_error_t err = {0};
  ASSERT_EQ_INT(nh_store_open(&s, nh_test_path("plans.db"), NH_STORE_CREATE, &err), NH_OK);
  nh_transport_t *emb = nh_embedded_init(nh_store_db(s), "test:1:plans", &err);
  ASSERT_TRUE(emb != NULL);
  emb->on_message = on_msg;
  nh_runtime_t rt;
  nh_runtime_init(&rt);
  nh_transport_t *amqp = nh_amqp_init(&rt.loop, s, "amqp://guest:guest@127.0.0.1:1", "test:1:amqp", NULL, NULL, &err);
  if (!amqp) FAIL("nh_amqp_init: %s", err.msg);

  sqlite3 *db = nh_store_db(s);
  int checked = 0, bad_count = 0;
  for (sqlite3_stmt *st = sqlite3_next_stmt(db, NULL); st; st = sqlite3_next_stmt(db, st)) {
    const char *sql = sqlite3_sql(st);
    if (!sql || strncmp(sql, "EXPLAIN", 7) == 0) continue;
    const char *bad;
    char *plan = plan_of(db, sql, &bad);
    checked++;
    if (bad) {
      bad_count++;
      fprintf(stderr, "full scan of %s:\n  %s\n%s", bad, sql, plan);
    }
  }
  /* store + embedded + amqp: the count guards against the loop silently seeing none */
  ASSERT_CMP_INT(checked, >=, 50);
  ASSERT_EQ_INT(bad_count, 0);
  nh_amqp_stop(amqp, NULL, NULL);   /* closes the (never opened) connection's timers */
  uv_run(&rt.loop, UV_RUN_DEFAULT);
  amqp->vt->close(amqp);
  emb->vt->close(emb);
  ASSERT_EQ_INT(nh_runtime_close(&rt), 0);   /* with the management API's HTTP client */
  nh_store_close(s);
}

/* Operator queries: any filter on an indexed column (status, session, failure group)
 * must be served by its index; only a listing with no such filter reads everything. */
TEST(operator_queries_use_the_index_of_their_filter)
{
  nh_store_t *s = NULL;
  nh_error_t err = {0};
  ASSERT_EQ_INT(nh_store_open(&s, nh_test_path("plans.db"), NH_STORE_CREATE, &err), NH_OK);
  sqlite3 *db = nh_store_db(s);
  const nh_event_filter_t filters[] = {
    { .status = NH_ST_FAILED },
    { .status = NH_ST_DEFERRED, .endpoint = "Ep" },
    { .status = NH_ST_FAILED, .endpoint = "Ep", .type = "T", .error = "x", .since_ms = 1, .before_ms = 2 },
    { .status = NH_ST_FAILED, .endpoint = "Ep", .cutoff_ms = 5, .without_request = 1, .batch = 2000,
      .after_rowid = 2 },
    { .endpoint = "Ep", .session = "s1" },
    { .group = "0123456789ab" },
    { .group = "0123456789ab", .endpoint = "Ep", .status = NH_ST_FAILED, .limit = 10 },
    { .status = NH_ST_COMPLETED, .limit = 20 },
    /* the console's pages: by the status index, then only the page's rows */
    { .status = NH_ST_FAILED, .endpoint = "Ep", .batch = 100, .page = 1, .desc = 1, .after_rowid = 9 },
    { .status_in = { NH_ST_FAILED, NH_ST_DEADLETTERED }, .endpoint = "Ep", .batch = 100, .page = 1,
      .payload = "x", .error = "y" },
    { .event_id = "e1", .type_in = { "A", "B" } },
  };
  for (size_t i = 0; i < sizeof filters / sizeof filters[0]; i++) {
    for (int count = 0; count < 2; count++) {
      char *sql = nh_store_events_sql(&filters[i], count);
      const char *bad;
      char *plan = plan_of(db, sql, &bad);
      if (bad) FAIL("filter %zu%s scans %s:\n  %s\n%s", i, count ? " (count)" : "", bad, sql, plan);
      free(sql);
    }
  }
  /* the control: no indexed filter is a full scan (and the test can tell) */
  nh_event_filter_t none = { .type = "T" };
  char *sql = nh_store_events_sql(&none, 1);
  const char *bad;
  plan_of(db, sql, &bad);
  free(sql);
  ASSERT_TRUE(bad != NULL);
  /* A bulk batch of a group reads the group's index in rowid order and stops at the
   * batch: no sort of every row of the group for each batch. */
  nh_event_filter_t bulk = { .group = "0123456789ab", .endpoint = "Ep", .cutoff_ms = 5, .without_request = 1,
                             .need_payload = 1, .not_status = { NH_ST_COMPLETED, NH_ST_SKIPPED }, .batch = 2000,
                             .after_rowid = 2 };
  sql = nh_store_events_sql(&bulk, 0);
  char *plan = plan_of(db, sql, &bad);
  if (bad || strstr(plan, "TEMP B-TREE") || !strstr(plan, "audit_group"))
    FAIL("a bulk batch of a group is not read in index order:\n  %s\n%s", sql, plan);
  free(sql);
  nh_store_close(s);
}

NH_TEST_MAIN()
