/* The PostgreSQL store's row operations (store/nh_pg_ops.c, nh_pg_exec.c, nh_pg_rows.c)
 * against a real server, as a parity suite: each group runs the same sequence on a fresh
 * sqlite store (nh_store_open on a temp file) and on a fresh PostgreSQL database (migrated
 * with nh_pg_migrate) and compares what the reads return, field by field. Then the
 * pipelined executor: a 1,000-write batch commits as one round trip, a failing statement
 * or a killed connection commits nothing and says which statement, and a timing figure
 * (printed, not asserted) of batched against one-by-one writes.
 *
 * NH_PG_URL names the test cluster (the ctest fixture "postgres": scripts/postgres.sh) and
 * NH_PG_ADMIN_URL a superuser, through which each test makes its own database (nh_pgtest.h).
 * Without either the suite reports itself skipped (77), except under CI=true. */
#include "nh_test.h"
#include "nh_test_sql.h"
#include "nh_pgtest.h"

#include "core/nh_util.h"
#include "store/nh_pg.h"
#include "store/nh_pg_ops.h"
#include "store/nh_store.h"

#include <pthread.h>
#include <uv.h>

static const nh_pgtest_server_t *srv;   /* NH_PG_URL's server */

/* ---------------------------------------------------------------- the server */

/* A scratch database (nh_pgtest_scratch_db) migrated to the current schema; its URL in url. */
static void scratch_store(char *url, size_t len)
{
  if ((size_t)snprintf(url, len, "%s", nh_pgtest_url("dbname", nh_pgtest_scratch_db(), NULL)) >= len)
    FAIL("the scratch database's URL is longer than %zu bytes", len - 1);
  PGconn *c = NULL;
  nh_error_t err = { 0 };
  if (nh_pg_connect(url, &c, &err)) FAIL("%s", err.msg);
  int rc = nh_pg_migrate(c, NULL, NULL, &err);
  PQfinish(c);
  if (rc) FAIL("migrate: %s", err.msg);
}

static void free_db(void *db) { nh_pg_db_free(db); }

static nh_pg_db_t *open_db(const char *url)
{
  PGconn *c = NULL;
  nh_error_t err = { 0 };
  if (nh_pg_connect(url, &c, &err)) FAIL("%s", err.msg);
  nh_pg_db_t *db = nh_pg_db_new(c);
  nh_test_on_cleanup(free_db, db);
  return db;
}

/* ---------------------------------------------------------------- both stores */

typedef struct pair {
  nh_store_t *lite;
  nh_pg_db_t *pg;
  char url[1024];
} pair_t;

static void close_pair(void *p)
{
  pair_t *b = p;
  nh_store_close(b->lite);
  free(b);
}

static pair_t *pair_open(void)
{
  pair_t *b = calloc(1, sizeof *b);
  nh_test_on_cleanup(close_pair, b);
  nh_error_t err = { 0 };
  if (nh_store_open(&b->lite, nh_test_path("lite.db"), NH_STORE_CREATE, &err)) FAIL("sqlite: %s", err.msg);
  scratch_store(b->url, sizeof b->url);
  b->pg = open_db(b->url);
  return b;
}

static sqlite3 *lite(pair_t *b) { return nh_store_db(b->lite); }
static PGconn *pgc(pair_t *b) { return nh_pg_db_conn(b->pg); }

/* Both stores returned the same (the two calls are independent: either may run first);
 * the value, for the caller to check. */
static int both(const char *call, int l, int p)
{
  if (l != p) FAIL("%s: %d on sqlite, %d on PostgreSQL", call, l, p);
  return l;
}
#define BOTH(call_lite, call_pg) both(#call_pg, (call_lite), (call_pg))

/* ---------------------------------------------------------------- field by field */

static void same_str(const char *what, const char *l, const char *p)
{
  if ((l == NULL) != (p == NULL) || (l && strcmp(l, p) != 0))
    FAIL("%s: sqlite %s%s%s, PostgreSQL %s%s%s", what, l ? "\"" : "", l ? l : "NULL", l ? "\"" : "", p ? "\"" : "",
         p ? p : "NULL", p ? "\"" : "");
}

static void same_i64(const char *what, int64_t l, int64_t p)
{
  if (l != p) FAIL("%s: sqlite %lld, PostgreSQL %lld", what, (long long)l, (long long)p);
}

static void hex(const char *p, size_t n, char *out, size_t len)
{
  size_t o = 0;
  for (size_t i = 0; i < n && o + 3 < len; i++) o += (size_t)snprintf(out + o, len - o, "%02x", (unsigned char)p[i]);
  out[o] = '\0';
}

static void same_bytes(const char *what, const char *l, size_t ln, const char *p, size_t pn)
{
  if ((l == NULL) != (p == NULL) || ln != pn || (l && memcmp(l, p, ln) != 0)) {
    char a[256], b[256];
    hex(l ? l : "", l ? ln : 0, a, sizeof a);
    hex(p ? p : "", p ? pn : 0, b, sizeof b);
    FAIL("%s: sqlite %s (%zu bytes: %s), PostgreSQL %s (%zu bytes: %s)", what, l ? "" : "NULL", ln, a,
         p ? "" : "NULL", pn, b);
  }
}

#define S(f) same_str(#f, l->f, p->f)
#define I(f) same_i64(#f, l->f, p->f)

static void same_audit(const nh_audit_t *l, const nh_audit_t *p)
{
  S(endpoint); S(event_id); S(session_id); S(event_type); S(status); S(sub_status); S(error_text); S(error_type);
  S(handoff_reason); S(external_job_id); I(expected_by); S(message_id); S(correlation_id);
  S(originating_message_id); I(retry_count); I(attempts); S(result); S(error_stack); I(created_at); I(updated_at);
  I(queue_time_ms); I(processing_time_ms); I(overdue_at); S(traceparent); S(replaced_payload);
  same_bytes("payload", l->payload, nh_audit_payload_len(l), p->payload, nh_audit_payload_len(p));
}

static void same_msg(const nh_msg_t *l, const nh_msg_t *p)
{
  S(endpoint); S(session_id); S(message_id); S(event_id); S(event_type); I(type); S(correlation_id);
  S(originating_message_id); S(parent_message_id); S(from); S(reply_to); I(retry_count); I(enqueued_at);
  S(error_text); S(error_type); S(traceparent); S(tracestate);
  same_bytes("body", l->body, l->body_len, p->body, p->body_len);
}

static void same_session(const nh_session_state_t *l, const nh_session_state_t *p)
{
  I(exists); S(blocked_by); I(draining); I(retry_due); I(next_park_seq);
}

#undef S
#undef I

/* The audit row of (endpoint, event) read from both stores: the same, and kept in *out
 * (sqlite's; the caller clears it) for further checks. */
static void audit_both(pair_t *b, const char *ep, const char *id, nh_audit_t *out)
{
  nh_audit_t l, p;
  int found = BOTH(nh_store_audit_get(b->lite, ep, id, &l), nh_pgs_audit_get(b->pg, ep, id, &p));
  if (found != 1) FAIL("no audit row %s/%s in either store", ep, id);
  same_audit(&l, &p);
  nh_audit_clear(&p);
  *out = l;
}

static int64_t count_lite(pair_t *b, const char *table)
{
  return nh_test_q1i(lite(b), "SELECT count(*) FROM %s", table);
}

static int64_t count_pg(PGconn *c, const char *table)
{
  return atoll(nh_pgtest_q1(c, "SELECT count(*) FROM %s", table));
}

static void same_count(pair_t *b, const char *table, int64_t want)
{
  same_i64(table, count_lite(b, table), count_pg(pgc(b), table));
  ASSERT_EQ_INT(count_lite(b, table), want);
}

/* A payload with a NUL and bytes that are not UTF-8, as bodies may be. */
static const char body_bytes[] = "{\"k\":\"a\0b\xff\xfe\x80\"}";
#define BODY_LEN (sizeof body_bytes - 1)

static nh_audit_t audit_of(const char *ep, const char *id, const char *session, const char *status, int64_t at)
{
  nh_audit_t a;
  memset(&a, 0, sizeof a);
  a.endpoint = (char *)ep;
  a.event_id = (char *)id;
  a.session_id = (char *)session;
  a.event_type = "CustomerChanged";
  a.status = (char *)status;
  a.message_id = "m-1";
  a.updated_at = at;
  a.queue_time_ms = -1;
  a.processing_time_ms = -1;
  return a;
}

static void put_both(pair_t *b, const nh_audit_t *a)
{
  BOTH(nh_store_audit_put(b->lite, a), nh_pgs_audit_put(b->pg, a));
}

/* ---------------------------------------------------------------- audit */

TEST(parity_audit_put_get)
{
  pair_t *b = pair_open();
  nh_audit_t a = audit_of("Erp", "e-1", "s-1", NH_ST_PENDING, 1000);
  a.sub_status = "";                 /* empty, not NULL */
  a.error_text = NULL;
  a.error_type = "";
  a.handoff_reason = "waiting for the import";
  a.external_job_id = "job-7";
  a.expected_by = 5000;
  a.correlation_id = "c-1";
  a.originating_message_id = "o-1";
  a.retry_count = 3;
  a.attempts = 2;
  a.payload = (char *)body_bytes;
  a.payload_len = BODY_LEN;
  a.result = "{}";
  a.error_stack = "stack\ttraceback: über";   /* UTF-8 text stays text */
  a.queue_time_ms = 0;                          /* 0 is a time; -1 is none */
  a.processing_time_ms = 12;
  a.overdue_at = 4000;
  a.traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
  put_both(b, &a);
  nh_audit_t got;
  audit_both(b, "Erp", "e-1", &got);
  ASSERT_EQ_INT(nh_audit_payload_len(&got), BODY_LEN);
  ASSERT_TRUE(memcmp(got.payload, body_bytes, BODY_LEN) == 0);
  ASSERT_EQ_STR(got.sub_status, "");
  ASSERT_NULL(got.error_text);
  ASSERT_EQ_INT(got.created_at, 1000);
  ASSERT_EQ_INT(got.queue_time_ms, 0);
  nh_audit_clear(&got);

  /* the upsert keeps created_at, changes the rest, and a failure gets its group */
  nh_audit_t f = audit_of("Erp", "e-1", "s-1", NH_ST_FAILED, 2000);
  f.error_text = "order 4711 not found";
  f.error_type = "NotFound";
  f.payload = "";                   /* an empty payload, not a NULL one */
  f.payload_len = 0;
  put_both(b, &f);
  audit_both(b, "Erp", "e-1", &got);
  ASSERT_EQ_INT(got.created_at, 1000);
  ASSERT_EQ_INT(got.updated_at, 2000);
  ASSERT_EQ_STR(got.payload, "");
  ASSERT_EQ_INT(got.queue_time_ms, -1);
  ASSERT_EQ_INT(got.expected_by, 0);
  nh_audit_clear(&got);
  char group[64];
  snprintf(group, sizeof group, "%s", nh_test_q1s(lite(b), "SELECT fail_group FROM audit"));
  ASSERT_EQ_INT(strlen(group), 12);
  same_str("fail_group", group, nh_pgtest_q1(pgc(b), "SELECT fail_group FROM audit"));

  /* resolved: the group goes; a NULL payload stays NULL */
  nh_audit_t c = audit_of("Erp", "e-1", "s-1", NH_ST_COMPLETED, 3000);
  put_both(b, &c);
  audit_both(b, "Erp", "e-1", &got);
  ASSERT_NULL(got.payload);
  nh_audit_clear(&got);
  ASSERT_EQ_STR(nh_test_q1s(lite(b), "SELECT coalesce(fail_group, 'none') FROM audit"), "none");
  ASSERT_EQ_STR(nh_pgtest_q1(pgc(b), "SELECT coalesce(fail_group, 'none') FROM audit"), "none");

  /* updated_at 0 is now, on both */
  int64_t t0 = nh_time_now_ms();
  nh_audit_t n = audit_of("Erp", "e-2", "s-2", NH_ST_COMPLETED, 0);
  put_both(b, &n);
  int64_t t1 = nh_time_now_ms();
  nh_audit_t l, p;
  ASSERT_EQ_INT(nh_store_audit_get(b->lite, "Erp", "e-2", &l), 1);
  ASSERT_EQ_INT(nh_pgs_audit_get(b->pg, "Erp", "e-2", &p), 1);
  int64_t lu = l.updated_at, pu = p.updated_at, pc = p.created_at;
  nh_audit_clear(&l);
  nh_audit_clear(&p);
  ASSERT_TRUE(lu >= t0 && lu <= t1);
  ASSERT_TRUE(pu >= t0 && pu <= t1);
  ASSERT_EQ_INT(pc, pu);

  /* a missing row, and another endpoint's */
  BOTH(nh_store_audit_get(b->lite, "Erp", "e-3", &l), nh_pgs_audit_get(b->pg, "Erp", "e-3", &p));
  ASSERT_EQ_INT(nh_pgs_audit_get(b->pg, "Crm", "e-1", &p), 0);
  same_count(b, "audit", 2);
}

static void find_both(pair_t *b, const char *id, int want_rc, const char *want_ep)
{
  nh_audit_t l, p;
  nh_error_t le = { 0 }, pe = { 0 };
  memset(&l, 0, sizeof l);
  memset(&p, 0, sizeof p);
  int lrc = nh_store_audit_find(b->lite, id, &l, &le), prc = nh_pgs_audit_find(b->pg, id, &p, &pe);
  if (lrc != prc) FAIL("find %s: sqlite %d (%s), PostgreSQL %d (%s)", id, lrc, le.msg, prc, pe.msg);
  if (lrc != want_rc) FAIL("find %s: %d (%s), not %d", id, lrc, le.msg, want_rc);
  if (lrc == NH_OK) {
    same_audit(&l, &p);
    ASSERT_EQ_STR(l.endpoint, want_ep);
  } else {
    same_str("error", le.msg, pe.msg);
  }
  nh_audit_clear(&l);
  nh_audit_clear(&p);
}

TEST(parity_audit_find_by_id_and_prefix)
{
  pair_t *b = pair_open();
  static const char *const ids[][2] = {
    { "Erp", "0190aaaa-0000-7000-8000-000000000001" },
    { "Erp", "0190aaaa-0000-7000-8000-000000000002" },
    { "Erp", "0190bbbb-0000-7000-8000-000000000003" },
    { "Erp", "0190cccc-0000-7000-8000-000000000004" },   /* the same id in two endpoints */
    { "Crm", "0190cccc-0000-7000-8000-000000000004" },
    { "Erp", "évènement-Ä-1" },                           /* multi-byte characters */
    { "Erp", "abcdefg\xF4\x8F\xBF\xBFx" },                /* U+10FFFF after the prefix */
    { "Erp", "abcdefg\xF4\x8F\xBF\xBF\xF4\x8F\xBF\xBFy" },
    { "Erp", "\xF4\x8F\xBF\xBF\xF4\x8F\xBF\xBF\xF4\x8F\xBF\xBF\xF4\x8F\xBF\xBF\xF4\x8F\xBF\xBF\xF4\x8F\xBF\xBF"
             "\xF4\x8F\xBF\xBF\xF4\x8F\xBF\xBF\xF4\x8F\xBF\xBF" },   /* nothing above its range */
    { "Erp", "surrogat\xED\x9F\xBFz" },                   /* U+D7FF: the next character is U+E000 */
    { "Erp", "surrogat\xEE\x80\x80" },
  };
  for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
    nh_audit_t a = audit_of(ids[i][0], ids[i][1], "s", NH_ST_COMPLETED, 100 + (int64_t)i);
    put_both(b, &a);
  }
  find_both(b, "0190aaaa-0000-7000-8000-000000000002", NH_OK, "Erp");   /* exact */
  find_both(b, "0190cccc-0000-7000-8000-000000000004", NH_OK, "Crm");   /* exact: the first endpoint */
  find_both(b, "0190bbbb", NH_OK, "Erp");                               /* a unique prefix */
  find_both(b, "0190aaaa", NH_EUSAGE, NULL);                            /* two events */
  find_both(b, "0190cccc", NH_EUSAGE, NULL);                            /* one id, two endpoints */
  find_both(b, "0190", NH_ENOTFOUND, NULL);                             /* too short for a prefix */
  find_both(b, "0190dddd", NH_ENOTFOUND, NULL);
  find_both(b, "évènement", NH_OK, "Erp");
  find_both(b, "évènemenu", NH_ENOTFOUND, NULL);
  find_both(b, "abcdefg\xF4\x8F\xBF\xBF", NH_EUSAGE, NULL);
  find_both(b, "abcdefg\xF4\x8F\xBF\xBF\xF4\x8F\xBF\xBF", NH_OK, "Erp");
  find_both(b, "\xF4\x8F\xBF\xBF\xF4\x8F\xBF\xBF", NH_OK, "Erp");
  find_both(b, "surrogat\xED\x9F\xBF", NH_OK, "Erp");
  find_both(b, "surrogat", NH_EUSAGE, NULL);
  find_both(b, "\xff\xfe\xfd\xfc\xfb\xfa\xf9\xf8", NH_ENOTFOUND, NULL);     /* not UTF-8: no id starts so */
  find_both(b, "\xff\xfe", NH_ENOTFOUND, NULL);
  ASSERT_FALSE(nh_pg_db_failed(b->pg));
}

/* A hand-off's result is its completion's body (dispatch/nh_outcome.c route_handoff): any
 * bytes, kept as they are on both stores, as the payload is. */
TEST(parity_audit_result_keeps_bytes_that_are_not_utf8)
{
  pair_t *b = pair_open();
  static const struct { const char *id, *result; } r[] = {
    { "r-bad", "{\"done\":\"\xff\xfe\x80 \xC0\xAF \xE2\x82\"}" },   /* not UTF-8 */
    { "r-utf8", "{\"done\":\"Grüße, 東京, 🍕\"}" },                  /* multibyte text, byte for byte */
    { "r-empty", "" },                                                /* empty, not NULL */
    { "r-null", NULL },
  };
  for (size_t i = 0; i < sizeof r / sizeof r[0]; i++) {
    nh_audit_t a = audit_of("Erp", r[i].id, "s-1", NH_ST_COMPLETED, 100);
    a.sub_status = "Handoff";
    a.result = (char *)r[i].result;
    put_both(b, &a);
  }
  for (size_t i = 0; i < sizeof r / sizeof r[0]; i++) {
    nh_audit_t got;
    audit_both(b, "Erp", r[i].id, &got);   /* compares result with strcmp: every byte */
    int same = r[i].result ? got.result && strcmp(got.result, r[i].result) == 0 : got.result == NULL;
    nh_audit_clear(&got);
    if (!same) FAIL("%s: the result read back is not the one written", r[i].id);
  }
  /* the server holds the bytes themselves, not a cleaned copy */
  ASSERT_EQ_STR(nh_pgtest_q1(pgc(b), "SELECT encode(result, 'hex') FROM audit WHERE event_id = 'r-bad'"),
                "7b22646f6e65223a22fffe8020c0af20e282227d");
  char len[24];
  snprintf(len, sizeof len, "%zu", strlen(r[1].result));
  ASSERT_EQ_STR(nh_pgtest_q1(pgc(b), "SELECT octet_length(result) FROM audit WHERE event_id = 'r-utf8'"), len);
  /* the other readers of audit rows too */
  find_both(b, "r-bad", NH_OK, "Erp");
  ASSERT_FALSE(nh_pg_db_failed(b->pg));
}

/* find on PostgreSQL, its row compared with sqlite's but for the event id, which PostgreSQL
 * keeps escaped (store/nh_pg_ops.c): that one must be want_pg_id. */
static void find_escaped_both(pair_t *b, const char *id, const char *want_pg_id)
{
  nh_audit_t l, p;
  nh_error_t le = { 0 }, pe = { 0 };
  memset(&l, 0, sizeof l);
  memset(&p, 0, sizeof p);
  int lrc = nh_store_audit_find(b->lite, id, &l, &le), prc = nh_pgs_audit_find(b->pg, id, &p, &pe);
  if (lrc != NH_OK || prc != NH_OK) FAIL("find %s: sqlite %d (%s), PostgreSQL %d (%s)", want_pg_id, lrc, le.msg, prc,
                                         pe.msg);
  int escaped = p.event_id && strcmp(p.event_id, want_pg_id) == 0, raw = strcmp(l.event_id, id) == 0;
  free(p.event_id);
  p.event_id = nh_xstrdup(l.event_id);
  same_audit(&l, &p);
  nh_audit_clear(&l);
  nh_audit_clear(&p);
  if (!escaped || !raw) FAIL("find %s: the event id read back is not the one written", want_pg_id);
}

TEST(parity_audit_find_an_id_that_is_not_utf8)
{
  pair_t *b = pair_open();
  /* ids that differ only in a byte that is not UTF-8; one too short for a prefix, so only
   * the lookup by exact id can find it */
  static const char *const ids[] = { "e-\xFF", "e-\xFE", "bin-\xFF\xFE\xFD\xFC-1", "bin-\xFF\xFE\xFD\xFC-2" };
  for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
    nh_audit_t a = audit_of("Erp", ids[i], "s-1", NH_ST_COMPLETED, 100 + (int64_t)i);
    a.result = "{\"r\":\"\xFF\"}";
    put_both(b, &a);
  }
  find_escaped_both(b, "e-\xFF", "e-\\xFF");
  find_escaped_both(b, "e-\xFE", "e-\\xFE");
  find_escaped_both(b, "bin-\xFF\xFE\xFD\xFC-2", "bin-\\xFF\\xFE\\xFD\\xFC-2");
  find_both(b, "e-\xFD", NH_ENOTFOUND, NULL);
  /* a prefix with such bytes, as sqlite matches it */
  find_both(b, "bin-\xFF\xFE\xFD\xFC", NH_EUSAGE, NULL);
  find_both(b, "bin-\xFF\xFE\xFD\xFB", NH_ENOTFOUND, NULL);
  ASSERT_FALSE(nh_pg_db_failed(b->pg));
}

typedef struct seen {
  char (*ids)[16];
  int n, stop_after;
} seen_t;

static int collect_handoff(void *data, const nh_audit_t *a)
{
  seen_t *s = data;
  snprintf(s->ids[s->n], 16, "%s", a->event_id);
  s->n++;
  return s->stop_after && s->n >= s->stop_after;
}

TEST(parity_audit_retext_and_handoffs)
{
  pair_t *b = pair_open();
  nh_audit_t a;
  const char *deferred[][2] = { { "d-1", "s-1" }, { "d-2", "s-1" }, { "d-3", "s-2" } };
  for (int i = 0; i < 3; i++) {
    a = audit_of("Erp", deferred[i][0], deferred[i][1], NH_ST_DEFERRED, 100);
    a.error_text = "blocked by x";
    put_both(b, &a);
  }
  a = audit_of("Erp", "f-1", "s-1", NH_ST_FAILED, 100);
  a.error_text = "boom";
  put_both(b, &a);
  BOTH(nh_store_audit_retext_deferred(b->lite, "Erp", "s-1", "blocked by f-1"),
       nh_pgs_audit_retext_deferred(b->pg, "Erp", "s-1", "blocked by f-1"));
  const char *all[] = { "d-1", "d-2", "d-3", "f-1" }, *want[] = { "blocked by f-1", "blocked by f-1", "blocked by x",
                                                                   "boom" };
  for (int i = 0; i < 4; i++) {
    nh_audit_t got;
    audit_both(b, "Erp", all[i], &got);
    ASSERT_EQ_STR(got.error_text, want[i]);
    nh_audit_clear(&got);
  }

  /* hand-offs: due (tied expected_by in insert order), not yet due, flagged, not pending */
  static const struct { const char *id, *status, *sub; int64_t by, overdue; } h[] = {
    { "h-1", NH_ST_PENDING, "Handoff", 500, 0 },  { "h-2", NH_ST_PENDING, "Handoff", 300, 0 },
    { "h-3", NH_ST_PENDING, "Handoff", 300, 0 },  { "h-4", NH_ST_PENDING, "Handoff", 900, 0 },
    { "h-5", NH_ST_PENDING, "Handoff", 200, 250 }, { "h-6", NH_ST_COMPLETED, "Handoff", 100, 0 },
    { "h-7", NH_ST_PENDING, "Retrying", 100, 0 },
  };
  for (size_t i = 0; i < sizeof h / sizeof h[0]; i++) {
    a = audit_of("Erp", h[i].id, "s-h", h[i].status, 100);
    a.sub_status = (char *)h[i].sub;
    a.expected_by = h[i].by;
    a.overdue_at = h[i].overdue;
    put_both(b, &a);
  }
  static char lseen[8][16], pseen[8][16];
  seen_t ls = { lseen, 0, 0 }, ps = { pseen, 0, 0 };
  nh_audit_cb collect = collect_handoff;
  BOTH(nh_store_handoffs_due(b->lite, 600, 10, collect, &ls), nh_pgs_handoffs_due(b->pg, 600, 10, collect, &ps));
  ASSERT_EQ_INT(ls.n, 3);
  ASSERT_EQ_INT(ps.n, ls.n);
  for (int i = 0; i < ls.n; i++) same_str("hand-off due", lseen[i], pseen[i]);
  ASSERT_EQ_STR(lseen[0], "h-2");
  ASSERT_EQ_STR(lseen[1], "h-3");
  ASSERT_EQ_STR(lseen[2], "h-1");
  /* the limit, and a callback that stops */
  ls.n = ps.n = 0;
  BOTH(nh_store_handoffs_due(b->lite, 600, 2, collect, &ls), nh_pgs_handoffs_due(b->pg, 600, 2, collect, &ps));
  ASSERT_EQ_INT(ls.n, 2);
  ASSERT_EQ_INT(ps.n, 2);
  ls.n = ps.n = 0;
  ls.stop_after = ps.stop_after = 1;
  BOTH(nh_store_handoffs_due(b->lite, 600, 10, collect, &ls), nh_pgs_handoffs_due(b->pg, 600, 10, collect, &ps));
  ASSERT_EQ_INT(ps.n, 1);
  /* flagged once; then by nobody; then no longer due */
  ASSERT_EQ_INT(BOTH(nh_store_handoff_flag_overdue(b->lite, "Erp", "h-2", 650),
                     nh_pgs_handoff_flag_overdue(b->pg, "Erp", "h-2", 650)), 1);
  ASSERT_EQ_INT(BOTH(nh_store_handoff_flag_overdue(b->lite, "Erp", "h-2", 660),
                     nh_pgs_handoff_flag_overdue(b->pg, "Erp", "h-2", 660)), 0);
  ASSERT_EQ_INT(BOTH(nh_store_handoff_flag_overdue(b->lite, "Erp", "h-6", 660),
                     nh_pgs_handoff_flag_overdue(b->pg, "Erp", "h-6", 660)), 0);
  nh_audit_t got;
  audit_both(b, "Erp", "h-2", &got);
  ASSERT_EQ_INT(got.overdue_at, 650);
  nh_audit_clear(&got);
  ls.n = ps.n = 0;
  ls.stop_after = ps.stop_after = 0;
  BOTH(nh_store_handoffs_due(b->lite, 600, 10, collect, &ls), nh_pgs_handoffs_due(b->pg, 600, 10, collect, &ps));
  ASSERT_EQ_INT(ps.n, 2);
  ASSERT_EQ_STR(pseen[0], "h-3");
}

/* ---------------------------------------------------------------- history */

typedef struct hist {
  int n, stop_after;
  int64_t at[8];
  char *f[8][8];   /* message_id, message_type, status, detail, error_text, error_type, error_stack, previous */
} hist_t;

static int collect_history(void *data, const nh_history_row_t *r)
{
  hist_t *h = data;
  const char *v[8] = { r->message_id, r->message_type, r->status, r->detail, r->error_text, r->error_type,
                       r->error_stack, r->previous_payload };
  h->at[h->n] = r->at;
  for (int i = 0; i < 8; i++) h->f[h->n][i] = v[i] ? strdup(v[i]) : NULL;
  h->n++;
  return h->stop_after && h->n >= h->stop_after;
}

static void free_hist(void *p)
{
  hist_t *h = p;
  for (int r = 0; r < h->n; r++)
    for (int i = 0; i < 8; i++) free(h->f[r][i]);
  h->n = 0;
}

TEST(parity_history_and_processed)
{
  pair_t *b = pair_open();
  static hist_t lh, ph;
  memset(&lh, 0, sizeof lh);
  memset(&ph, 0, sizeof ph);
  nh_test_on_cleanup(free_hist, &lh);
  nh_test_on_cleanup(free_hist, &ph);
  int64_t t0 = nh_time_now_ms();
  BOTH(nh_store_history_add(b->lite, "Erp", "e-1", "m-1", "EventRequest", "Requested", NULL),
       nh_pgs_history_add(b->pg, "Erp", "e-1", "m-1", "EventRequest", "Requested", NULL));
  nh_history_extra_t x = { .error_text = "order 17 not found", .error_type = "", .error_stack = NULL,
                           .previous_payload = "{\"old\":\"\xff\xfe\"}" };
  BOTH(nh_store_history_add_ex(b->lite, "Erp", "e-1", "m-2", "ResubmissionRequest", "Failed", "", &x),
       nh_pgs_history_add_ex(b->pg, "Erp", "e-1", "m-2", "ResubmissionRequest", "Failed", "", &x));
  BOTH(nh_store_history_add(b->lite, "Erp", "e-1", "m-3", "EventRequest", "Completed", "done"),
       nh_pgs_history_add(b->pg, "Erp", "e-1", "m-3", "EventRequest", "Completed", "done"));
  BOTH(nh_store_history_add(b->lite, "Crm", "e-1", "m-9", "EventRequest", "Cancelled", NULL),
       nh_pgs_history_add(b->pg, "Crm", "e-1", "m-9", "EventRequest", "Cancelled", NULL));
  int64_t t1 = nh_time_now_ms();
  ASSERT_EQ_INT(BOTH(nh_store_history_list(b->lite, "Erp", "e-1", collect_history, &lh),
                     nh_pgs_history_list(b->pg, "Erp", "e-1", collect_history, &ph)), 3);
  static const char *const names[8] = { "message_id", "message_type", "status", "detail", "error_text", "error_type",
                                        "error_stack", "previous_payload" };
  for (int r = 0; r < 3; r++) {
    ASSERT_TRUE(lh.at[r] >= t0 && lh.at[r] <= t1);
    ASSERT_TRUE(ph.at[r] >= t0 && ph.at[r] <= t1);
    for (int i = 0; i < 8; i++) same_str(names[i], lh.f[r][i], ph.f[r][i]);
  }
  ASSERT_EQ_STR(ph.f[0][2], "Requested");
  ASSERT_NULL(ph.f[0][3]);
  ASSERT_EQ_STR(ph.f[1][3], "");
  ASSERT_EQ_STR(ph.f[1][7], "{\"old\":\"\xff\xfe\"}");
  ASSERT_EQ_STR(ph.f[2][2], "Completed");
  free_hist(&lh);
  free_hist(&ph);
  lh.stop_after = ph.stop_after = 1;
  ASSERT_EQ_INT(BOTH(nh_store_history_list(b->lite, "Erp", "e-1", collect_history, &lh),
                     nh_pgs_history_list(b->pg, "Erp", "e-1", collect_history, &ph)), 1);
  ASSERT_EQ_INT(BOTH(nh_store_history_list(b->lite, "Erp", "e-2", collect_history, &lh),
                     nh_pgs_history_list(b->pg, "Erp", "e-2", collect_history, &ph)), 0);

  /* a delivery's outcome is recorded by its history row; a request or a cancelled run is none */
  ASSERT_EQ_INT(BOTH(nh_store_processed_has(b->lite, "Erp", "m-1", "e-1"),
                     nh_pgs_processed_has(b->pg, "Erp", "m-1", "e-1")), 0);
  ASSERT_EQ_INT(BOTH(nh_store_processed_has(b->lite, "Erp", "m-2", "e-1"),
                     nh_pgs_processed_has(b->pg, "Erp", "m-2", "e-1")), 1);
  ASSERT_EQ_INT(BOTH(nh_store_processed_has(b->lite, "Erp", "m-3", "e-1"),
                     nh_pgs_processed_has(b->pg, "Erp", "m-3", "e-1")), 1);
  ASSERT_EQ_INT(BOTH(nh_store_processed_has(b->lite, "Crm", "m-9", "e-1"),
                     nh_pgs_processed_has(b->pg, "Crm", "m-9", "e-1")), 0);
  ASSERT_EQ_INT(BOTH(nh_store_processed_has(b->lite, "Crm", "m-3", "e-1"),
                     nh_pgs_processed_has(b->pg, "Crm", "m-3", "e-1")), 0);
  ASSERT_EQ_INT(BOTH(nh_store_processed_has(b->lite, "Erp", "m-3", "e-2"),
                     nh_pgs_processed_has(b->pg, "Erp", "m-3", "e-2")), 0);
}

/* ---------------------------------------------------------------- sessions */

static void session_both(pair_t *b, const char *ep, const char *id, nh_session_state_t *out)
{
  nh_session_state_t l, p;
  BOTH(nh_store_session_get(b->lite, ep, id, &l), nh_pgs_session_get(b->pg, ep, id, &p));
  same_session(&l, &p);
  nh_session_state_clear(&p);
  *out = l;
}

static void put_session(pair_t *b, const char *ep, const char *id, const char *blocked_by, int draining,
                        int64_t retry_due, int64_t next_seq)
{
  nh_session_state_t st = { .blocked_by = (char *)blocked_by, .draining = draining, .retry_due = retry_due,
                            .next_park_seq = next_seq };
  BOTH(nh_store_session_put(b->lite, ep, id, &st), nh_pgs_session_put(b->pg, ep, id, &st));
}

TEST(parity_session_get_put)
{
  pair_t *b = pair_open();
  nh_session_state_t st;
  session_both(b, "Erp", "s-1", &st);
  ASSERT_EQ_INT(st.exists, 0);
  ASSERT_EQ_INT(st.next_park_seq, 1);
  put_session(b, "Erp", "s-1", "e-1", 0, 7000, 4);
  session_both(b, "Erp", "s-1", &st);
  ASSERT_EQ_INT(st.exists, 1);
  ASSERT_EQ_STR(st.blocked_by, "e-1");
  ASSERT_EQ_INT(st.retry_due, 7000);
  nh_session_state_clear(&st);
  put_session(b, "Erp", "s-1", NULL, 1, 0, 0);   /* draining; next_park_seq 0 is 1 */
  session_both(b, "Erp", "s-1", &st);
  ASSERT_NULL(st.blocked_by);
  ASSERT_EQ_INT(st.draining, 1);
  ASSERT_EQ_INT(st.next_park_seq, 1);
  put_session(b, "Erp", "s-2", "", 0, 0, 9);      /* blocked by "" is blocked */
  session_both(b, "Erp", "s-2", &st);
  ASSERT_EQ_STR(st.blocked_by, "");
  nh_session_state_clear(&st);
  same_count(b, "sessions", 2);
  /* a free session leaves no row */
  put_session(b, "Erp", "s-1", NULL, 0, 0, 5);
  session_both(b, "Erp", "s-1", &st);
  ASSERT_EQ_INT(st.exists, 0);
  same_count(b, "sessions", 1);
  put_session(b, "Erp", "s-9", NULL, 0, 0, 1);   /* one that never had a row */
  same_count(b, "sessions", 1);
}

typedef struct sess_log {
  int n, stop_after;
  char line[64][96];
} sess_log_t;

static int collect_session(void *data, const char *ep, const char *id, const nh_session_state_t *st)
{
  sess_log_t *s = data;
  snprintf(s->line[s->n++], sizeof s->line[0], "%s/%s b=%s d=%d r=%lld n=%lld", ep, id,
           st->blocked_by ? st->blocked_by : "NULL", st->draining, (long long)st->retry_due,
           (long long)st->next_park_seq);
  return s->stop_after && s->n >= s->stop_after;
}

static void same_log(const sess_log_t *l, const sess_log_t *p)
{
  if (l->n != p->n) FAIL("sessions: %d on sqlite, %d on PostgreSQL", l->n, p->n);
  for (int i = 0; i < l->n; i++) same_str("session", l->line[i], p->line[i]);
}

static void free_cursor(void *p) { free(*(char **)p); }

TEST(parity_sessions_due_and_list)
{
  pair_t *b = pair_open();
  /* due retries (two tied), one not yet due, draining sessions, a free one, another endpoint */
  put_session(b, "Erp", "r-b", "e-1", 0, 100, 2);
  put_session(b, "Erp", "r-a", "e-2", 1, 100, 2);
  put_session(b, "Erp", "r-c", "e-3", 0, 50, 2);
  put_session(b, "Erp", "r-later", "e-4", 0, 10000, 2);
  put_session(b, "Erp", "blocked-no-retry", "e-5", 0, 0, 3);
  const char *drain[] = { "d-1", "d-2", "d-3", "d-4", "d-5", "D-0", "d-ä" };
  for (int i = 0; i < 7; i++) put_session(b, "Erp", drain[i], NULL, 1, 0, 2 + i);
  put_session(b, "Crm", "d-1", NULL, 1, 0, 2);
  put_session(b, "Crm", "r-1", "e-9", 0, 10, 2);

  static sess_log_t l, p;
  static char *lc, *pc;
  lc = pc = NULL;
  nh_test_on_cleanup(free_cursor, &lc);
  nh_test_on_cleanup(free_cursor, &pc);
  /* rounds of 4 with a cursor: retries first, then draining sessions from the cursor on,
   * wrapping round at the end */
  for (int round = 0; round < 5; round++) {
    memset(&l, 0, sizeof l);
    memset(&p, 0, sizeof p);
    BOTH(nh_store_sessions_due(b->lite, "Erp", 1000, 4, &lc, collect_session, &l),
         nh_pgs_sessions_due(b->pg, "Erp", 1000, 4, &pc, collect_session, &p));
    same_log(&l, &p);
    same_str("cursor", lc, pc);
  }
  memset(&l, 0, sizeof l);
  memset(&p, 0, sizeof p);
  ASSERT_EQ_INT(BOTH(nh_store_sessions_due(b->lite, "Erp", 1000, 20, NULL, collect_session, &l),
                     nh_pgs_sessions_due(b->pg, "Erp", 1000, 20, NULL, collect_session, &p)), 10);
  same_log(&l, &p);
  ASSERT_CONTAINS(p.line[0], "Erp/r-c ");
  ASSERT_CONTAINS(p.line[1], "Erp/r-a ");
  ASSERT_CONTAINS(p.line[2], "Erp/r-b ");
  ASSERT_CONTAINS(p.line[3], "Erp/D-0 ");   /* byte order: upper case first */
  ASSERT_CONTAINS(p.line[9], "Erp/d-ä ");

  /* lists: all, blocked only, one endpoint, and a callback that stops */
  for (int mode = 0; mode < 5; mode++) {
    const char *ep = mode >= 2 ? (mode == 4 ? "Nobody" : "Crm") : NULL;
    int blocked = mode == 1 || mode == 3;
    memset(&l, 0, sizeof l);
    memset(&p, 0, sizeof p);
    BOTH(nh_store_sessions_list(b->lite, ep, blocked, collect_session, &l),
         nh_pgs_sessions_list(b->pg, ep, blocked, collect_session, &p));
    same_log(&l, &p);
  }
  memset(&l, 0, sizeof l);
  memset(&p, 0, sizeof p);
  l.stop_after = p.stop_after = 3;
  ASSERT_EQ_INT(BOTH(nh_store_sessions_list(b->lite, NULL, 0, collect_session, &l),
                     nh_pgs_sessions_list(b->pg, NULL, 0, collect_session, &p)), 3);
  same_log(&l, &p);
  ASSERT_CONTAINS(p.line[0], "Crm/d-1 ");
}

/* ---------------------------------------------------------------- parked */

static nh_msg_t msg_of(const char *session, const char *id, const char *body, size_t len)
{
  nh_msg_t m;
  memset(&m, 0, sizeof m);
  m.endpoint = "Erp";
  m.session_id = (char *)session;
  m.message_id = (char *)id;
  m.event_id = (char *)id;
  m.event_type = "OrderPlaced";
  m.type = NH_MT_EVENT;
  m.correlation_id = "corr";
  m.from = "Crm";
  m.retry_count = 2;
  m.enqueued_at = 1234;
  m.body = (char *)body;
  m.body_len = len;
  return m;
}

static int head_both(pair_t *b, const char *session, nh_msg_t *out, int64_t *seq)
{
  nh_msg_t l, p;
  int64_t ls = -1, ps = -1;
  int found = BOTH(nh_store_parked_head(b->lite, "Erp", session, &l, &ls),
                   nh_pgs_parked_head(b->pg, "Erp", session, &p, &ps));
  if (!found) return 0;
  same_i64("park_seq", ls, ps);
  same_msg(&l, &p);
  nh_msg_clear(&p);
  *out = l;
  *seq = ls;
  return 1;
}

TEST(parity_parked)
{
  pair_t *b = pair_open();
  nh_msg_t m1 = msg_of("s-1", "p-1", body_bytes, BODY_LEN);
  m1.type = NH_MT_RESUBMIT;
  m1.originating_message_id = "";
  m1.parent_message_id = "parent";
  m1.reply_to = "replies";
  m1.error_text = "why";
  m1.error_type = "";
  m1.traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
  m1.tracestate = "k=v";
  nh_msg_t m2 = msg_of("s-1", "p-2", "", 0);      /* an empty body */
  nh_msg_t m3 = msg_of("s-1", "p-3", NULL, 0);    /* none */
  nh_msg_t m4 = msg_of("s-2", "p-1", "{}", 2);
  BOTH(nh_store_park(b->lite, &m1, 1), nh_pgs_park(b->pg, &m1, 1));
  BOTH(nh_store_park(b->lite, &m2, 2), nh_pgs_park(b->pg, &m2, 2));
  BOTH(nh_store_park(b->lite, &m3, 3), nh_pgs_park(b->pg, &m3, 3));
  BOTH(nh_store_park(b->lite, &m4, 1), nh_pgs_park(b->pg, &m4, 1));
  ASSERT_EQ_INT(BOTH(nh_store_parked_count(b->lite, "Erp", "s-1"), nh_pgs_parked_count(b->pg, "Erp", "s-1")), 3);
  ASSERT_EQ_INT(BOTH(nh_store_parked_any(b->lite, "Erp", "s-1"), nh_pgs_parked_any(b->pg, "Erp", "s-1")), 1);
  ASSERT_EQ_INT(BOTH(nh_store_parked_any(b->lite, "Erp", "s-3"), nh_pgs_parked_any(b->pg, "Erp", "s-3")), 0);
  /* the same park_seq twice is refused by both */
  ASSERT_EQ_INT(BOTH(nh_store_park(b->lite, &m4, 1), nh_pgs_park(b->pg, &m4, 1)), NH_EFAIL);
  ASSERT_CONTAINS(nh_pg_db_error(b->pg)->msg, "(SQLSTATE 23505) while running park");
  nh_pg_db_clear_failed(b->pg);

  nh_msg_t h;
  int64_t seq;
  ASSERT_TRUE(head_both(b, "s-1", &h, &seq));
  ASSERT_EQ_INT(seq, 1);
  ASSERT_EQ_INT(h.type, NH_MT_RESUBMIT);
  ASSERT_EQ_INT(h.body_len, BODY_LEN);
  ASSERT_TRUE(memcmp(h.body, body_bytes, BODY_LEN) == 0);
  ASSERT_EQ_STR(h.originating_message_id, "");
  ASSERT_EQ_STR(h.error_type, "");
  nh_msg_clear(&h);
  BOTH(nh_store_parked_delete(b->lite, "Erp", "s-1", 1), nh_pgs_parked_delete(b->pg, "Erp", "s-1", 1));
  ASSERT_TRUE(head_both(b, "s-1", &h, &seq));
  ASSERT_EQ_INT(seq, 2);
  ASSERT_EQ_STR(h.body, "");
  nh_msg_clear(&h);
  ASSERT_EQ_INT(BOTH(nh_store_parked_delete_event(b->lite, "Erp", "p-2"),
                     nh_pgs_parked_delete_event(b->pg, "Erp", "p-2")), 1);
  ASSERT_TRUE(head_both(b, "s-1", &h, &seq));
  ASSERT_EQ_INT(seq, 3);
  ASSERT_NULL(h.body);
  nh_msg_clear(&h);
  ASSERT_EQ_INT(BOTH(nh_store_parked_delete_event(b->lite, "Erp", "p-1"),
                     nh_pgs_parked_delete_event(b->pg, "Erp", "p-1")), 1);   /* s-2's */
  ASSERT_EQ_INT(BOTH(nh_store_parked_delete_event(b->lite, "Erp", "p-1"),
                     nh_pgs_parked_delete_event(b->pg, "Erp", "p-1")), 0);
  BOTH(nh_store_parked_delete(b->lite, "Erp", "s-1", 3), nh_pgs_parked_delete(b->pg, "Erp", "s-1", 3));
  ASSERT_FALSE(head_both(b, "s-1", &h, &seq));
  ASSERT_EQ_INT(BOTH(nh_store_parked_count(b->lite, "Erp", "s-1"), nh_pgs_parked_count(b->pg, "Erp", "s-1")), 0);
  same_count(b, "parked", 0);
}

/* ---------------------------------------------------------------- inbox, operator requests, log */

TEST(parity_inbox)
{
  pair_t *b = pair_open();
  ASSERT_EQ_INT(BOTH(nh_store_inbox_has(b->lite, "Erp", "m-1"), nh_pgs_inbox_has(b->pg, "Erp", "m-1")), 0);
  BOTH(nh_store_inbox_add(b->lite, "Erp", "m-1"), nh_pgs_inbox_add(b->pg, "Erp", "m-1"));
  BOTH(nh_store_inbox_add(b->lite, "Erp", "m-1"), nh_pgs_inbox_add(b->pg, "Erp", "m-1"));   /* again: ignored */
  ASSERT_EQ_INT(BOTH(nh_store_inbox_has(b->lite, "Erp", "m-1"), nh_pgs_inbox_has(b->pg, "Erp", "m-1")), 1);
  ASSERT_EQ_INT(BOTH(nh_store_inbox_has(b->lite, "Crm", "m-1"), nh_pgs_inbox_has(b->pg, "Crm", "m-1")), 0);
  /* a message without an id: sqlite's OR IGNORE skips the row, and so does PostgreSQL */
  ASSERT_EQ_INT(BOTH(nh_store_inbox_add(b->lite, "Erp", NULL), nh_pgs_inbox_add(b->pg, "Erp", NULL)), NH_OK);
  ASSERT_EQ_INT(BOTH(nh_store_inbox_has(b->lite, "Erp", NULL), nh_pgs_inbox_has(b->pg, "Erp", NULL)), 0);
  BOTH(nh_store_inbox_add(b->lite, "Erp", ""), nh_pgs_inbox_add(b->pg, "Erp", ""));
  ASSERT_EQ_INT(BOTH(nh_store_inbox_has(b->lite, "Erp", ""), nh_pgs_inbox_has(b->pg, "Erp", "")), 1);
  same_count(b, "inbox", 2);
  ASSERT_FALSE(nh_pg_db_failed(b->pg));
}

static void free_str(void *p) { free(*(char **)p); }

TEST(parity_operator_requests_and_log)
{
  pair_t *b = pair_open();
  static char *ls, *ps;
  ls = ps = NULL;
  nh_test_on_cleanup(free_str, &ls);
  nh_test_on_cleanup(free_str, &ps);
  ASSERT_EQ_INT(BOTH(nh_store_oppending_has(b->lite, "Erp", "e-1"), nh_pgs_oppending_has(b->pg, "Erp", "e-1")), 0);
  BOTH(nh_store_oppending_add(b->lite, "op-1", "Erp", "e-1", "resubmit", "Failed"),
       nh_pgs_oppending_add(b->pg, "op-1", "Erp", "e-1", "resubmit", "Failed"));
  BOTH(nh_store_oppending_add(b->lite, "op-2", "Erp", "e-2", "skip", NULL),
       nh_pgs_oppending_add(b->pg, "op-2", "Erp", "e-2", "skip", NULL));
  ASSERT_EQ_INT(BOTH(nh_store_oppending_has(b->lite, "Erp", "e-1"), nh_pgs_oppending_has(b->pg, "Erp", "e-1")), 1);
  ASSERT_EQ_INT(BOTH(nh_store_oppending_has(b->lite, "Crm", "e-1"), nh_pgs_oppending_has(b->pg, "Crm", "e-1")), 0);
  /* the same request id again replaces it */
  BOTH(nh_store_oppending_add(b->lite, "op-1", "Erp", "e-1", "skip", "DeadLettered"),
       nh_pgs_oppending_add(b->pg, "op-1", "Erp", "e-1", "skip", "DeadLettered"));
  same_count(b, "operator_pending", 2);
  same_str("action", nh_test_q1s(lite(b), "SELECT action FROM operator_pending WHERE message_id = 'op-1'"),
           nh_pgtest_q1(pgc(b), "SELECT action FROM operator_pending WHERE message_id = 'op-1'"));
  /* taken once: deleted and returned; the second take finds nothing */
  ASSERT_EQ_INT(BOTH(nh_store_oppending_take(b->lite, "op-1", &ls), nh_pgs_oppending_take(b->pg, "op-1", &ps)), 1);
  same_str("expected_status", ls, ps);
  ASSERT_EQ_STR(ps, "DeadLettered");
  free(ls);
  free(ps);
  ls = ps = NULL;
  ASSERT_EQ_INT(BOTH(nh_store_oppending_take(b->lite, "op-1", &ls), nh_pgs_oppending_take(b->pg, "op-1", &ps)), 0);
  ASSERT_NULL(ps);
  ASSERT_EQ_INT(BOTH(nh_store_oppending_take(b->lite, "op-2", &ls), nh_pgs_oppending_take(b->pg, "op-2", &ps)), 1);
  ASSERT_NULL(ls);
  ASSERT_NULL(ps);
  ASSERT_EQ_INT(BOTH(nh_store_oppending_has(b->lite, "Erp", "e-1"), nh_pgs_oppending_has(b->pg, "Erp", "e-1")), 0);
  same_count(b, "operator_pending", 0);

  /* the log: a NULL actor is the OS user (or "operator") */
  int64_t t0 = nh_time_now_ms();
  BOTH(nh_store_oplog_add(b->lite, NULL, "resubmit", "Erp", "e-1", "s-1", "{\"body\":1}"),
       nh_pgs_oplog_add(b->pg, NULL, "resubmit", "Erp", "e-1", "s-1", "{\"body\":1}"));
  BOTH(nh_store_oplog_add(b->lite, "admin API (token ops-1)", "skip", NULL, NULL, NULL, NULL),
       nh_pgs_oplog_add(b->pg, "admin API (token ops-1)", "skip", NULL, NULL, NULL, NULL));
  int64_t t1 = nh_time_now_ms();
  static const char *const cols[] = { "actor", "action", "coalesce(endpoint, 'NULL')", "coalesce(event_id, 'NULL')",
                                      "coalesce(session_id, 'NULL')", "coalesce(detail, 'NULL')" };
  for (int row = 1; row <= 2; row++)
    for (size_t i = 0; i < sizeof cols / sizeof cols[0]; i++) {
      char lv[256];
      snprintf(lv, sizeof lv, "%s", nh_test_q1s(lite(b), "SELECT %s FROM operator_log WHERE id = %d", cols[i], row));
      same_str(cols[i], lv, nh_pgtest_q1(pgc(b), "SELECT %s FROM operator_log WHERE id = %d", cols[i], row));
    }
  const char *user = getenv("USER");
  ASSERT_EQ_STR(nh_pgtest_q1(pgc(b), "SELECT actor FROM operator_log WHERE id = 1"), user ? user : "operator");
  int64_t at = atoll(nh_pgtest_q1(pgc(b), "SELECT at FROM operator_log WHERE id = 2"));
  ASSERT_TRUE(at >= t0 && at <= t1);
}

/* ---------------------------------------------------------------- the operator API's reads */

/* What a read passed to its callback, a line per row, compared line by line. */
typedef struct row_log {
  int n, stop_after;
  char line[96][200];
} row_log_t;

static void same_rows(const char *what, const row_log_t *l, const row_log_t *p)
{
  if (l->n != p->n) FAIL("%s: %d rows on sqlite, %d on PostgreSQL", what, l->n, p->n);
  for (int i = 0; i < l->n; i++) same_str(what, l->line[i], p->line[i]);
}

static int log_event(void *data, const nh_audit_t *a)
{
  row_log_t *g = data;
  char body[64] = "NULL";
  if (a->payload) hex(a->payload, nh_audit_payload_len(a), body, sizeof body);
  snprintf(g->line[g->n++], sizeof g->line[0], "%s/%s %s s=%s t=%s u=%lld p=%s", a->endpoint, a->event_id, a->status,
           a->session_id, a->event_type ? a->event_type : "NULL", (long long)a->updated_at, body);
  return g->stop_after && g->n >= g->stop_after;
}

/* 40 events over two endpoints in insert order: statuses, sessions and types in turn,
 * payloads with a needle, its other case, LIKE's wildcards, a NUL and bytes that are not
 * UTF-8, none; then every seventh changed again (an upsert: it keeps its place in insert
 * order, and uses up an identity value on PostgreSQL), then 5 more, whose seqs are not
 * sqlite's rowids: the two stores' cursors differ while their rows may not. */
static void fill_events(pair_t *b)
{
  static const char *const statuses[] = { NH_ST_FAILED, NH_ST_COMPLETED, NH_ST_FAILED, NH_ST_DEFERRED,
                                          NH_ST_PENDING };
  static const char *const payloads[] = { "{\"order\":\"order-42\"}", "{\"order\":\"Order-42\"}",
                                          "{\"n\":\"100%_done\"}", NULL, "{\"x\":1}" };
  for (int i = 0; i < 40; i++) {
    char id[16], session[16];
    snprintf(id, sizeof id, "e-%02d", i);
    snprintf(session, sizeof session, "s-%d", i % 6);
    nh_audit_t a = audit_of(i % 4 == 3 ? "Crm" : "Erp", id, session, statuses[i % 5], 1000 + i);
    a.event_type = i % 3 ? "OrderPlaced" : "CustomerChanged";
    if (i % 11 == 10) {
      a.payload = (char *)body_bytes;
      a.payload_len = BODY_LEN;
    } else {
      a.payload = (char *)payloads[i % 5];
    }
    if (a.status[0] == 'F') a.error_text = "order not found";
    put_both(b, &a);
  }
  for (int i = 0; i < 40; i += 7) {
    char id[16], session[16];
    snprintf(id, sizeof id, "e-%02d", i);
    snprintf(session, sizeof session, "s-%d", i % 6);
    nh_audit_t a = audit_of(i % 4 == 3 ? "Crm" : "Erp", id, session, NH_ST_FAILED, 5000 + i);
    a.event_type = i % 3 ? "OrderPlaced" : "CustomerChanged";
    a.payload = "{\"order\":\"order-42\",\"again\":true}";
    a.error_text = "still not found";
    put_both(b, &a);
  }
  for (int i = 40; i < 45; i++) {   /* after the gaps on PostgreSQL */
    char id[16];
    snprintf(id, sizeof id, "e-%02d", i);
    nh_audit_t a = audit_of("Erp", id, "s-late", NH_ST_COMPLETED, 6000 + i);
    a.payload = "{\"late\":true}";
    put_both(b, &a);
  }
}

/* The filter's rows on both stores, all at once (no page): the same, in *all (sqlite's),
 * with the count of both stores agreeing. */
static void events_both(pair_t *b, const nh_event_filter_t *f, row_log_t *all)
{
  static row_log_t p;
  memset(all, 0, sizeof *all);
  memset(&p, 0, sizeof p);
  nh_error_t err = { 0 };
  int n = nh_pgs_events(b->pg, f, log_event, &p, NULL, &err);
  if (n < 0) FAIL("PostgreSQL: %s", err.msg);
  both("rows", nh_store_events(b->lite, f, log_event, all, NULL), n);
  same_rows("events", all, &p);
  int64_t pc = nh_pgs_events_count(b->pg, f, &err);
  if (pc < 0) FAIL("PostgreSQL count: %s", err.msg);
  same_i64("count", nh_store_events_count(b->lite, f), pc);
  ASSERT_EQ_INT(pc, all->n);
}

/* The API's pages (nh_admin_get_events: batch, page, after, desc) through every row the
 * filter matches, `size` a page, each store with its own cursor: each page the same on
 * both, a full page followed by the next, and together the rows of `all` in insert order
 * (newest first when desc). Returns the pages read. */
static int pages_both(pair_t *b, const nh_event_filter_t *base, int size, int desc, const row_log_t *all)
{
  static row_log_t l, p, seen;
  memset(&seen, 0, sizeof seen);
  int64_t lcur = 0, pcur = 0;
  int pages = 0;
  for (;;) {
    nh_event_filter_t lf = *base, pf = *base;
    lf.batch = pf.batch = size;
    lf.page = pf.page = 1;
    lf.desc = pf.desc = desc;
    lf.after_rowid = lcur;
    pf.after_rowid = pcur;
    memset(&l, 0, sizeof l);
    memset(&p, 0, sizeof p);
    nh_error_t err = { 0 };
    int pn = nh_pgs_events(b->pg, &pf, log_event, &p, &pcur, &err);
    if (pn < 0) FAIL("PostgreSQL page: %s", err.msg);
    both("rows of the page", nh_store_events(b->lite, &lf, log_event, &l, &lcur), pn);
    same_rows("page", &l, &p);
    pages++;
    for (int i = 0; i < l.n; i++) memcpy(seen.line[seen.n++], l.line[i], sizeof l.line[0]);
    if (l.n < size) break;
    if (pages > 60) FAIL("the pages do not end");
  }
  ASSERT_EQ_INT(seen.n, all->n);
  for (int i = 0; i < all->n; i++) same_str("paged row", all->line[desc ? all->n - 1 - i : i], seen.line[i]);
  return pages;
}

TEST(parity_api_event_pages_either_way_with_a_cursor)
{
  pair_t *b = pair_open();
  fill_events(b);
  static row_log_t all;
  /* insert order: a bulk batch of everything, which pages must add up to */
  nh_event_filter_t every = { .batch = 1000 };
  events_both(b, &every, &all);
  ASSERT_EQ_INT(all.n, 45);
  ASSERT_CONTAINS(all.line[0], "Erp/e-00 Failed");   /* changed again, still first */
  ASSERT_EQ_INT(pages_both(b, &(nh_event_filter_t){ 0 }, 7, 0, &all), 7);
  ASSERT_EQ_INT(pages_both(b, &(nh_event_filter_t){ 0 }, 7, 1, &all), 7);
  ASSERT_EQ_INT(pages_both(b, &(nh_event_filter_t){ 0 }, 9, 0, &all), 6);   /* the last page empty */
  ASSERT_EQ_INT(pages_both(b, &(nh_event_filter_t){ 0 }, 9, 1, &all), 6);
  ASSERT_EQ_INT(pages_both(b, &(nh_event_filter_t){ 0 }, 1000, 1, &all), 1);

  /* the reader's filters, with the statuses of the API (a list: sqlite's page planner
   * probes, then walks or reads the index; the rows are the same either way) */
  nh_event_filter_t fs[] = {
    { .status_in = { NH_ST_FAILED } },
    { .status_in = { NH_ST_FAILED, NH_ST_DEFERRED }, .endpoint = "Erp" },
    { .endpoint = "Crm", .type_in = { "OrderPlaced" } },
    { .session = "s-2", .since_ms = 1010, .before_ms = 5000 },
    { .error = "NOT FOUND", .endpoint = "Erp" },
    { .status_in = { NH_ST_FAILED }, .payload = "order-42", .endpoint = "Erp" },
  };
  for (size_t i = 0; i < sizeof fs / sizeof fs[0]; i++) {
    nh_event_filter_t f = fs[i];
    f.batch = 1000;
    events_both(b, &f, &all);
    if (!all.n) FAIL("filter %zu matches nothing: the test proves nothing", i);
    for (int desc = 0; desc < 2; desc++) {
      pages_both(b, &fs[i], 2, desc, &all);
      pages_both(b, &fs[i], 3, desc, &all);
    }
  }

  /* newest first from the start: the newest row inserted comes first on both */
  static row_log_t l, p;
  memset(&l, 0, sizeof l);
  memset(&p, 0, sizeof p);
  nh_event_filter_t newest = { .batch = 1, .page = 1, .desc = 1 };
  nh_error_t err = { 0 };
  BOTH(nh_store_events(b->lite, &newest, log_event, &l, NULL), nh_pgs_events(b->pg, &newest, log_event, &p, NULL, &err));
  same_rows("newest", &l, &p);
  ASSERT_CONTAINS(p.line[0], "Erp/e-44 ");

  /* a callback that stops, and the NimBus route's probe after a full page (batch 1, no
   * page flag, after the last row): nothing left on either */
  memset(&l, 0, sizeof l);
  memset(&p, 0, sizeof p);
  l.stop_after = p.stop_after = 3;
  int64_t lcur = 0, pcur = 0;
  nh_event_filter_t page = { .batch = 10, .page = 1 };
  ASSERT_EQ_INT(BOTH(nh_store_events(b->lite, &page, log_event, &l, &lcur),
                     nh_pgs_events(b->pg, &page, log_event, &p, &pcur, &err)), 3);
  same_rows("stopped", &l, &p);
  nh_event_filter_t lprobe = { .batch = 1, .after_rowid = nh_test_q1i(lite(b), "SELECT max(rowid) FROM audit") };
  nh_event_filter_t pprobe = { .batch = 1, .after_rowid = atoll(nh_pgtest_q1(pgc(b), "SELECT max(seq) FROM audit")) };
  ASSERT_EQ_INT(BOTH(nh_store_events(b->lite, &lprobe, log_event, &l, NULL),
                     nh_pgs_events(b->pg, &pprobe, log_event, &p, NULL, &err)), 0);
  /* the seqs are not sqlite's rowids (the upserts used some up): the cursor is each store's own */
  ASSERT_TRUE(pprobe.after_rowid > lprobe.after_rowid);

  /* sqlite's page planner probe is no filter of PostgreSQL's: refused, said */
  nh_event_filter_t probe = { .rowid_from = 1, .rowid_to = 10 };
  memset(&err, 0, sizeof err);
  ASSERT_EQ_INT(nh_pgs_events(b->pg, &probe, log_event, &p, NULL, &err), NH_EFAIL);
  ASSERT_EQ_INT(err.code, NH_EUSAGE);
  ASSERT_CONTAINS(err.msg, "page planner");
}

TEST(parity_api_payload_substring)
{
  pair_t *b = pair_open();
  fill_events(b);
  static row_log_t all;
  /* each needle: what it must match on both (sqlite's instr), by the API's page and a
   * NimBus batch (no page flag) */
  static const struct { const char *needle; int want; } cases[] = {
    { "order-42", 11 },          /* 7 of their own, 4 more changed again */
    { "Order-42", 7 },           /* case-sensitive */
    { "100%_done", 6 },          /* LIKE's wildcards are plain characters here */
    { "%", 6 },
    { "_", 6 },
    { "b\xff\xfe", 2 },          /* after a NUL, bytes that are not UTF-8 */
    { "\"k\":\"a", 2 },
    { "no such text", 0 },
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    nh_event_filter_t f = { .payload = cases[i].needle, .batch = 1000 };
    events_both(b, &f, &all);
    if (all.n != cases[i].want) FAIL("payload %s: %d rows, expected %d", cases[i].needle, all.n, cases[i].want);
    nh_event_filter_t pf = { .payload = cases[i].needle };
    pages_both(b, &pf, 5, 0, &all);
    pages_both(b, &pf, 5, 1, &all);
    /* with the endpoint and an unpaged read (the CLI's and follow's order) too */
    nh_event_filter_t ef = { .payload = cases[i].needle, .endpoint = "Erp" };
    events_both(b, &ef, &all);
  }
}

static int log_oplog(void *data, const nh_oplog_row_t *r)
{
  row_log_t *g = data;
  snprintf(g->line[g->n++], sizeof g->line[0], "%s|%s|%s", r->actor ? r->actor : "NULL", r->action,
           r->detail ? r->detail : "NULL");
  return g->stop_after && g->n >= g->stop_after;
}

static int64_t oplog_at_lo, oplog_at_hi;

static int check_oplog_at(void *data, const nh_oplog_row_t *r)
{
  (void)data;
  if (r->at < oplog_at_lo || r->at > oplog_at_hi)
    FAIL("operator log at %lld, not within [%lld, %lld]", (long long)r->at, (long long)oplog_at_lo,
         (long long)oplog_at_hi);
  return 0;
}

TEST(parity_api_operator_log)
{
  pair_t *b = pair_open();
  oplog_at_lo = nh_time_now_ms();
  struct { const char *actor, *action, *ep, *id, *detail; } rows[] = {
    { "cli (alice)", "resubmit", "Erp", "e-1", "{\"body\":1}" },
    { "admin API (token ops-1)", "skip", "Crm", "e-1", NULL },        /* another endpoint's e-1 */
    { NULL, "skip", "Erp", "e-1", NULL },                             /* the OS user */
    { "cli (bob)", "resubmit --all", "Erp", NULL, "{\"count\":3}" },  /* a bulk run's row */
    { "cli (bob)", "handoff complete", "Erp", "e-2", "détail" },
    { "cli (carol)", "resubmit", "Erp", "e-1", "third" },
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
    BOTH(nh_store_oplog_add(b->lite, rows[i].actor, rows[i].action, rows[i].ep, rows[i].id, "s-1", rows[i].detail),
         nh_pgs_oplog_add(b->pg, rows[i].actor, rows[i].action, rows[i].ep, rows[i].id, "s-1", rows[i].detail));
  oplog_at_hi = nh_time_now_ms();
  static row_log_t l, p;
  static const char *const asks[][2] = { { "Erp", "e-1" }, { "Crm", "e-1" }, { "Erp", "e-2" }, { "Erp", "e-9" },
                                         { "Shop", "e-1" } };
  static const int want[] = { 3, 1, 1, 0, 0 };
  for (size_t i = 0; i < sizeof asks / sizeof asks[0]; i++) {
    memset(&l, 0, sizeof l);
    memset(&p, 0, sizeof p);
    ASSERT_EQ_INT(BOTH(nh_store_oplog_list(b->lite, asks[i][0], asks[i][1], log_oplog, &l),
                       nh_pgs_oplog_list(b->pg, asks[i][0], asks[i][1], log_oplog, &p)), want[i]);
    same_rows("operator log", &l, &p);
  }
  /* oldest first; the times are each store's clock, within the writes */
  memset(&p, 0, sizeof p);
  nh_pgs_oplog_list(b->pg, "Erp", "e-1", log_oplog, &p);
  ASSERT_CONTAINS(p.line[0], "cli (alice)|resubmit|");
  ASSERT_CONTAINS(p.line[2], "cli (carol)|resubmit|third");
  ASSERT_EQ_INT(nh_pgs_oplog_list(b->pg, "Erp", "e-1", check_oplog_at, NULL), 3);
  ASSERT_EQ_INT(nh_store_oplog_list(b->lite, "Erp", "e-1", check_oplog_at, NULL), 3);
  /* a callback that stops */
  memset(&l, 0, sizeof l);
  memset(&p, 0, sizeof p);
  l.stop_after = p.stop_after = 2;
  ASSERT_EQ_INT(BOTH(nh_store_oplog_list(b->lite, "Erp", "e-1", log_oplog, &l),
                     nh_pgs_oplog_list(b->pg, "Erp", "e-1", log_oplog, &p)), 2);
  same_rows("operator log", &l, &p);
  ASSERT_FALSE(nh_pg_db_failed(b->pg));
}

static int log_blocked(void *data, const nh_blocked_row_t *r)
{
  row_log_t *g = data;
#define N(s) ((s) ? (s) : "NULL")
  snprintf(g->line[g->n++], sizeof g->line[0], "%s/%s by=%s due=%lld st=%s sub=%s t=%s err=%s hr=%s since=%lld parked=%lld",
           N(r->endpoint), N(r->session_id), N(r->blocked_by), (long long)r->retry_due, N(r->status),
           N(r->sub_status), N(r->event_type), N(r->error_text), N(r->handoff_reason), (long long)r->since,
           (long long)r->parked);
#undef N
  return g->stop_after && g->n >= g->stop_after;
}

/* Blocked sessions a page of `limit` at a time from the cursor of the last row (the
 * API's), each page the same on both; every row in the end, in *all (sqlite's). */
static int blocked_pages_both(pair_t *b, const char *endpoint, int limit, row_log_t *all)
{
  static row_log_t l, p;
  static char ep[64], session[64];
  const char *after_ep = NULL, *after_s = NULL;
  memset(all, 0, sizeof *all);
  int pages = 0;
  for (;;) {
    memset(&l, 0, sizeof l);
    memset(&p, 0, sizeof p);
    int n = BOTH(nh_store_blocked_sessions(b->lite, endpoint, after_ep, after_s, limit, log_blocked, &l),
                 nh_pgs_blocked_sessions(b->pg, endpoint, after_ep, after_s, limit, log_blocked, &p));
    same_rows("blocked sessions", &l, &p);
    pages++;
    for (int i = 0; i < l.n; i++) memcpy(all->line[all->n++], l.line[i], sizeof l.line[0]);
    if (n < limit) break;
    /* the cursor: the last row's endpoint and session, as collect_session keeps them */
    if (sscanf(l.line[l.n - 1], "%63[^/]/%63[^ ]", ep, session) != 2) FAIL("row %s", l.line[l.n - 1]);
    after_ep = ep;
    after_s = session;
  }
  return pages;
}

TEST(parity_api_blocked_sessions)
{
  pair_t *b = pair_open();
  /* blockers: a failure, a hand-off, a retry due, one whose audit row is gone; the
   * sessions of two endpoints, one draining (not blocked), parked messages behind some */
  nh_audit_t f = audit_of("Erp", "e-1", "s-1", NH_ST_FAILED, 2000);
  f.error_text = "order 4711 not found";
  put_both(b, &f);
  nh_audit_t h = audit_of("Erp", "e-2", "s-2", NH_ST_PENDING, 3000);
  h.sub_status = "Handoff";
  h.handoff_reason = "waiting for the import";
  put_both(b, &h);
  nh_audit_t r = audit_of("Crm", "e-3", "s-1", NH_ST_PENDING, 4000);
  r.sub_status = NH_SUB_RETRYING;
  r.error_text = "timeout";
  put_both(b, &r);
  nh_audit_t other = audit_of("Crm", "e-1", "s-9", NH_ST_COMPLETED, 4500);   /* Crm's e-1: not Erp's blocker */
  put_both(b, &other);
  put_session(b, "Erp", "s-1", "e-1", 0, 0, 4);
  put_session(b, "Erp", "s-2", "e-2", 0, 0, 2);
  put_session(b, "Erp", "s-3", "e-gone", 0, 0, 1);
  put_session(b, "Erp", "S-0", "e-1", 0, 0, 1);     /* byte order: upper case first */
  put_session(b, "Erp", "s-ä", "e-2", 0, 0, 1);
  put_session(b, "Erp", "d-1", NULL, 1, 0, 3);      /* draining: not blocked */
  put_session(b, "Crm", "s-1", "e-3", 0, 9000, 2);
  put_session(b, "Crm", "s-2", "e-1", 0, 0, 1);
  put_session(b, "Erp-2", "s-1", "e-1", 0, 0, 1);   /* an endpoint after Erp, none of its events */
  for (int i = 1; i <= 3; i++) {
    nh_msg_t m = msg_of("s-1", i == 1 ? "p-1" : i == 2 ? "p-2" : "p-3", "{}", 2);
    BOTH(nh_store_park(b->lite, &m, i), nh_pgs_park(b->pg, &m, i));
  }
  nh_msg_t m = msg_of("d-1", "p-4", "{}", 2);
  BOTH(nh_store_park(b->lite, &m, 1), nh_pgs_park(b->pg, &m, 1));
  m = msg_of("s-2", "p-5", NULL, 0);
  BOTH(nh_store_park(b->lite, &m, 1), nh_pgs_park(b->pg, &m, 1));

  static row_log_t all, again;
  ASSERT_EQ_INT(blocked_pages_both(b, NULL, 100, &all), 1);
  ASSERT_EQ_INT(all.n, 8);
  ASSERT_CONTAINS(all.line[0], "Crm/s-1 by=e-3 due=9000 st=Pending sub=Retrying t=CustomerChanged err=timeout");
  ASSERT_CONTAINS(all.line[1], "Crm/s-2 by=e-1 due=0 st=Completed");
  ASSERT_CONTAINS(all.line[2], "Erp/S-0 by=e-1");
  ASSERT_CONTAINS(all.line[3], "Erp/s-1 by=e-1 due=0 st=Failed sub=NULL t=CustomerChanged err=order 4711 not found "
                               "hr=NULL since=2000 parked=3");
  ASSERT_CONTAINS(all.line[4], "Erp/s-2 by=e-2 due=0 st=Pending sub=Handoff t=CustomerChanged err=NULL "
                               "hr=waiting for the import since=3000 parked=1");
  ASSERT_CONTAINS(all.line[5], "Erp/s-3 by=e-gone due=0 st=NULL sub=NULL t=NULL err=NULL hr=NULL since=0 parked=0");
  ASSERT_CONTAINS(all.line[6], "Erp/s-ä ");
  ASSERT_CONTAINS(all.line[7], "Erp-2/s-1 ");
  /* pages of 1, 2, 3 with the cursor: the same rows, in the same order */
  for (int limit = 1; limit <= 3; limit++) {
    blocked_pages_both(b, NULL, limit, &again);
    same_rows("paged blocked sessions", &all, &again);
  }
  /* one endpoint, paged too */
  ASSERT_EQ_INT(blocked_pages_both(b, "Erp", 2, &again), 3);
  ASSERT_EQ_INT(again.n, 5);
  ASSERT_CONTAINS(again.line[0], "Erp/S-0 ");
  blocked_pages_both(b, "Nobody", 2, &again);
  ASSERT_EQ_INT(again.n, 0);

  /* a cursor with a session and no endpoint (the endpoint is "" then), limit 0, and a
   * callback that stops */
  static row_log_t l, p;
  memset(&l, 0, sizeof l);
  memset(&p, 0, sizeof p);
  ASSERT_EQ_INT(BOTH(nh_store_blocked_sessions(b->lite, NULL, NULL, "s-1", 100, log_blocked, &l),
                     nh_pgs_blocked_sessions(b->pg, NULL, NULL, "s-1", 100, log_blocked, &p)), 8);
  same_rows("cursor without an endpoint", &l, &p);
  ASSERT_EQ_INT(BOTH(nh_store_blocked_sessions(b->lite, NULL, NULL, NULL, 0, log_blocked, &l),
                     nh_pgs_blocked_sessions(b->pg, NULL, NULL, NULL, 0, log_blocked, &p)), 0);
  memset(&l, 0, sizeof l);
  memset(&p, 0, sizeof p);
  l.stop_after = p.stop_after = 2;
  ASSERT_EQ_INT(BOTH(nh_store_blocked_sessions(b->lite, "Erp", "Erp", "S-0", 100, log_blocked, &l),
                     nh_pgs_blocked_sessions(b->pg, "Erp", "Erp", "S-0", 100, log_blocked, &p)), 2);
  same_rows("stopped", &l, &p);
  ASSERT_CONTAINS(p.line[0], "Erp/s-1 ");
  ASSERT_FALSE(nh_pg_db_failed(b->pg));
}

static int log_endpoint(void *data, const char *endpoint)
{
  row_log_t *g = data;
  snprintf(g->line[g->n++], sizeof g->line[0], "%s", endpoint);
  return g->stop_after && g->n >= g->stop_after;
}

TEST(parity_api_endpoints)
{
  pair_t *b = pair_open();
  static row_log_t l, p;
  memset(&l, 0, sizeof l);
  memset(&p, 0, sizeof p);
  ASSERT_EQ_INT(BOTH(nh_store_endpoints(b->lite, log_endpoint, &l), nh_pgs_endpoints(b->pg, log_endpoint, &p)), 0);
  static const char *const eps[] = { "Erp", "Crm", "erp", "Erp-2", "Zoo", "Ärger", "Crm", "Erp" };
  for (size_t i = 0; i < sizeof eps / sizeof eps[0]; i++) {
    char id[16];
    snprintf(id, sizeof id, "e-%zu", i);
    nh_audit_t a = audit_of(eps[i], id, "s-1", NH_ST_COMPLETED, 1000);
    put_both(b, &a);
  }
  /* only sessions, no events: not an endpoint of these reads */
  put_session(b, "Shop", "s-1", "e-1", 0, 0, 1);
  ASSERT_EQ_INT(BOTH(nh_store_endpoints(b->lite, log_endpoint, &l), nh_pgs_endpoints(b->pg, log_endpoint, &p)), 6);
  same_rows("endpoints", &l, &p);
  ASSERT_EQ_STR(p.line[0], "Crm");   /* byte order */
  ASSERT_EQ_STR(p.line[1], "Erp");
  ASSERT_EQ_STR(p.line[2], "Erp-2");
  ASSERT_EQ_STR(p.line[3], "Zoo");
  ASSERT_EQ_STR(p.line[4], "erp");
  ASSERT_EQ_STR(p.line[5], "Ärger");
  memset(&l, 0, sizeof l);
  memset(&p, 0, sizeof p);
  l.stop_after = p.stop_after = 2;
  ASSERT_EQ_INT(BOTH(nh_store_endpoints(b->lite, log_endpoint, &l), nh_pgs_endpoints(b->pg, log_endpoint, &p)), 2);
  same_rows("endpoints", &l, &p);
}

static void same_stats(pair_t *b, const char *endpoint, int64_t now, int64_t blocked, int64_t pending,
                       int64_t overdue, int64_t parked)
{
  nh_endpoint_stats_t l, p;
  BOTH(nh_store_endpoint_stats(b->lite, endpoint, now, &l), nh_pgs_endpoint_stats(b->pg, endpoint, now, &p));
  same_i64("blocked_sessions", l.blocked_sessions, p.blocked_sessions);
  same_i64("handoffs_pending", l.handoffs_pending, p.handoffs_pending);
  same_i64("handoffs_overdue", l.handoffs_overdue, p.handoffs_overdue);
  same_i64("parked", nh_store_endpoint_parked(b->lite, endpoint), nh_pgs_endpoint_parked(b->pg, endpoint));
  ASSERT_EQ_INT(p.blocked_sessions, blocked);
  ASSERT_EQ_INT(p.handoffs_pending, pending);
  ASSERT_EQ_INT(p.handoffs_overdue, overdue);
  ASSERT_EQ_INT(nh_pgs_endpoint_parked(b->pg, endpoint), parked);
}

TEST(parity_api_endpoint_stats)
{
  pair_t *b = pair_open();
  same_stats(b, "Erp", 5000, 0, 0, 0, 0);
  /* hand-offs: due at 4000, due at 6000, no deadline, one flagged overdue already (still
   * counted: the figure is expected_by against now), Pending but retrying, another
   * endpoint's, and a completed one that had a deadline */
  struct { const char *ep, *id, *status, *sub; int64_t expected_by, overdue_at; } rows[] = {
    { "Erp", "h-1", NH_ST_PENDING, "Handoff", 4000, 0 },
    { "Erp", "h-2", NH_ST_PENDING, "Handoff", 6000, 0 },
    { "Erp", "h-3", NH_ST_PENDING, "Handoff", 0, 0 },
    { "Erp", "h-4", NH_ST_PENDING, "Handoff", 1000, 1500 },
    { "Erp", "r-1", NH_ST_PENDING, NH_SUB_RETRYING, 1000, 0 },
    { "Crm", "h-1", NH_ST_PENDING, "Handoff", 1000, 0 },
    { "Erp", "c-1", NH_ST_COMPLETED, NULL, 1000, 0 },
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    nh_audit_t a = audit_of(rows[i].ep, rows[i].id, "s-1", rows[i].status, 1000);
    a.sub_status = (char *)rows[i].sub;
    a.expected_by = rows[i].expected_by;
    a.overdue_at = rows[i].overdue_at;
    put_both(b, &a);
  }
  put_session(b, "Erp", "s-1", "h-1", 0, 0, 3);
  put_session(b, "Erp", "s-2", "h-2", 0, 7000, 1);
  put_session(b, "Erp", "s-3", NULL, 1, 0, 1);   /* draining */
  put_session(b, "Crm", "s-1", "h-1", 0, 0, 1);
  for (int i = 1; i <= 2; i++) {
    nh_msg_t m = msg_of("s-1", i == 1 ? "p-1" : "p-2", "{}", 2);
    BOTH(nh_store_park(b->lite, &m, i), nh_pgs_park(b->pg, &m, i));
  }
  nh_msg_t m = msg_of("s-3", "p-3", "{}", 2);
  BOTH(nh_store_park(b->lite, &m, 1), nh_pgs_park(b->pg, &m, 1));
  same_stats(b, "Erp", 5000, 2, 4, 2, 3);
  same_stats(b, "Erp", 4000, 2, 4, 1, 3);   /* expected_by < now, not <= */
  same_stats(b, "Erp", 9000, 2, 4, 3, 3);
  same_stats(b, "Crm", 5000, 1, 1, 1, 0);
  same_stats(b, "Nobody", 5000, 0, 0, 0, 0);
  ASSERT_FALSE(nh_pg_db_failed(b->pg));
}

/* ---------------------------------------------------------------- published, hosts, bulk runs */

TEST(parity_published_claim_window)
{
  pair_t *b = pair_open();
  int64_t la = -1, pa = -1;
  /* first claim; again inside the window: refused, with when */
  ASSERT_EQ_INT(BOTH(nh_store_published_claim(b->lite, "m-1", 1000, 0, &la),
                     nh_pgs_published_claim(b->pg, "m-1", 1000, 0, &pa)), 1);
  ASSERT_EQ_INT(BOTH(nh_store_published_claim(b->lite, "m-1", 2000, 500, &la),
                     nh_pgs_published_claim(b->pg, "m-1", 2000, 500, &pa)), 0);
  same_i64("at", la, pa);
  ASSERT_EQ_INT(pa, 1000);
  ASSERT_EQ_INT(BOTH(nh_store_published_claim(b->lite, "m-1", 2000, 1000, &la),
                     nh_pgs_published_claim(b->pg, "m-1", 2000, 1000, &pa)), 0);   /* the window's edge */
  la = pa = -1;
  ASSERT_EQ_INT(BOTH(nh_store_published_seen(b->lite, "m-1", 1000, &la),
                     nh_pgs_published_seen(b->pg, "m-1", 1000, &pa)), 1);
  ASSERT_EQ_INT(pa, 1000);
  ASSERT_EQ_INT(BOTH(nh_store_published_seen(b->lite, "m-1", 1001, &la),
                     nh_pgs_published_seen(b->pg, "m-1", 1001, &pa)), 0);
  ASSERT_EQ_INT(BOTH(nh_store_published_seen(b->lite, "m-2", 0, &la), nh_pgs_published_seen(b->pg, "m-2", 0, &pa)),
                0);
  /* outside the window: claimed again, the old claim replaced */
  ASSERT_EQ_INT(BOTH(nh_store_published_claim(b->lite, "m-1", 90000, 1001, &la),
                     nh_pgs_published_claim(b->pg, "m-1", 90000, 1001, &pa)), 1);
  same_str("at", nh_test_q1s(lite(b), "SELECT at FROM published"), nh_pgtest_q1(pgc(b), "SELECT at FROM published"));
  ASSERT_EQ_STR(nh_pgtest_q1(pgc(b), "SELECT at FROM published"), "90000");
  same_count(b, "published", 1);
}

/* ---------------------------------------------------------------- purge */

/* A row's time set by hand on both stores (the writers stamp now) */
static void age_both(pair_t *b, const char *sql)
{
  char *msg = NULL;
  if (sqlite3_exec(lite(b), sql, NULL, NULL, &msg) != SQLITE_OK) FAIL("sqlite %s: %s", sql, msg);
  nh_pgtest_q1(pgc(b), "%s", sql);
}

static void purge_counts_both(pair_t *b, int64_t resolved, int64_t inbox, int64_t events, int64_t inbox_n)
{
  nh_purge_counts_t l, p;
  nh_error_t err = { 0 };
  ASSERT_EQ_INT(nh_store_purge_count(b->lite, resolved, inbox, &l), NH_OK);
  if (nh_pgs_purge_count(b->pg, resolved, inbox, &p, &err)) FAIL("%s", err.msg);
  same_i64("events", l.events, p.events);
  same_i64("inbox", l.inbox, p.inbox);
  ASSERT_EQ_INT(p.events, events);
  ASSERT_EQ_INT(p.inbox, inbox_n);
}

/* `purge` (nh_pg_purge.c): its dry run counts what its deletes take, as sqlite's does;
 * resolved events with their history, never an unresolved one, a newer one or one with a
 * request waiting; processed entries by the resolved cutoff, inbox entries by their own. */
TEST(parity_purge_counts_and_deletes_the_same_rows)
{
  pair_t *b = pair_open();
  static const struct { const char *ep, *id, *status; int64_t at; } rows[] = {
    { "Erp", "e-c1", NH_ST_COMPLETED, 100 }, { "Erp", "e-c2", NH_ST_SKIPPED, 200 },
    { "Erp", "e-c3", NH_ST_UNSUPPORTED, 300 }, { "Erp", "e-req", NH_ST_COMPLETED, 400 },
    { "Erp", "e-new", NH_ST_COMPLETED, 5000 }, { "Erp", "e-f", NH_ST_FAILED, 100 },
    { "Erp", "e-d", NH_ST_DEFERRED, 100 }, { "Erp", "e-dl", NH_ST_DEADLETTERED, 100 },
    { "Erp", "e-p", NH_ST_PENDING, 100 }, { "Crm", "e-c1", NH_ST_COMPLETED, 150 }, { "Crm", "e-x", NH_ST_FAILED, 100 },
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    nh_audit_t a = audit_of(rows[i].ep, rows[i].id, "s-1", rows[i].status, rows[i].at);
    put_both(b, &a);
  }
  static const char *const hist[][2] = { { "Erp", "e-c1" }, { "Erp", "e-c1" }, { "Crm", "e-c1" }, { "Erp", "e-f" },
                                         { "Erp", "e-new" } };
  for (size_t i = 0; i < sizeof hist / sizeof hist[0]; i++)
    BOTH(nh_store_history_add(b->lite, hist[i][0], hist[i][1], "m-1", "EventRequest", "Completed", NULL),
         nh_pgs_history_add(b->pg, hist[i][0], hist[i][1], "m-1", "EventRequest", "Completed", NULL));
  BOTH(nh_store_oppending_add(b->lite, "op-1", "Erp", "e-req", "resubmit", "Completed"),
       nh_pgs_oppending_add(b->pg, "op-1", "Erp", "e-req", "resubmit", "Completed"));
  static const char *const inbox[] = { "m-old1", "m-old2", "m-new" };
  for (size_t i = 0; i < 3; i++)
    BOTH(nh_store_inbox_add(b->lite, "Erp", inbox[i]), nh_pgs_inbox_add(b->pg, "Erp", inbox[i]));
  age_both(b, "UPDATE inbox SET at = 100 WHERE message_id <> 'm-new'");
  /* processed rows are schema 1's, only ever deleted now */
  age_both(b, "INSERT INTO processed(endpoint, message_id, event_id, at) VALUES ('Erp', 'm-1', 'e-c1', 100),"
              " ('Erp', 'm-2', 'e-new', 9000)");

  purge_counts_both(b, 1000, 1000, 4, 2);
  purge_counts_both(b, 0, 1000, 0, 2);
  purge_counts_both(b, 1000, 0, 4, 0);
  same_count(b, "audit", 11);   /* counting deleted nothing */

  /* two events a call: the same calls, the same totals */
  nh_purge_counts_t l = { 0 }, p = { 0 };
  nh_error_t err = { 0 };
  for (int call = 0;; call++) {
    if (call > 10) FAIL("purge does not end");
    int ln = nh_store_purge(b->lite, 1000, 1000, 2, &l);
    int pn = nh_pgs_purge(b->pg, 1000, 1000, 2, &p, &err);
    if (pn < 0) FAIL("%s", err.msg);
    same_i64("rows deleted by the call", ln, pn);
    if (pn == 0) break;
  }
  same_i64("events", l.events, p.events);
  same_i64("history", l.history, p.history);
  same_i64("inbox", l.inbox, p.inbox);
  same_i64("processed", l.processed, p.processed);
  ASSERT_EQ_INT(p.events, 4);
  ASSERT_EQ_INT(p.history, 3);
  ASSERT_EQ_INT(p.inbox, 2);
  ASSERT_EQ_INT(p.processed, 1);
  same_count(b, "audit", 7);
  same_count(b, "history", 2);
  same_count(b, "inbox", 1);
  same_count(b, "processed", 1);
  same_str("kept", nh_test_q1s(lite(b), "SELECT group_concat(endpoint || '/' || event_id, ',') FROM"
                                        " (SELECT endpoint, event_id FROM audit ORDER BY endpoint, event_id)"),
           nh_pgtest_q1(pgc(b), "SELECT string_agg(endpoint || '/' || event_id, ',' ORDER BY endpoint, event_id)"
                                " FROM audit"));
  purge_counts_both(b, 1000, 1000, 0, 0);
  ASSERT_FALSE(nh_pg_db_failed(b->pg));
}

TEST(parity_hosts_serving)
{
  pair_t *b = pair_open();
  char self[128] = "", alive[200], dead[200];
  gethostname(self, sizeof self - 1);
  snprintf(alive, sizeof alive, "%s:%d:host", self, (int)getpid());
  /* Linux's PID_MAX_LIMIT: pids stay below it, so it names no process, ever */
  snprintf(dead, sizeof dead, "%s:%d:host", self, 4194304);
  BOTH(nh_store_host_put(b->lite, alive, ",Erp,Crm,", 100, 5000), nh_pgs_host_put(b->pg, alive, ",Erp,Crm,", 100, 5000));
  BOTH(nh_store_host_put(b->lite, dead, ",Erp,", 100, 5000), nh_pgs_host_put(b->pg, dead, ",Erp,", 100, 5000));
  BOTH(nh_store_host_put(b->lite, "elsewhere:1:host", ",Erp,Shop,", 100, 5000),
       nh_pgs_host_put(b->pg, "elsewhere:1:host", ",Erp,Shop,", 100, 5000));
  BOTH(nh_store_host_put(b->lite, "stale:1:host", ",Erp,", 100, 10), nh_pgs_host_put(b->pg, "stale:1:host", ",Erp,", 100, 10));
  ASSERT_EQ_INT(BOTH(nh_store_hosts_serving(b->lite, "Erp", 1000), nh_pgs_hosts_serving(b->pg, "Erp", 1000)), 2);
  ASSERT_EQ_INT(BOTH(nh_store_hosts_serving(b->lite, "Erp", 0), nh_pgs_hosts_serving(b->pg, "Erp", 0)), 3);
  ASSERT_EQ_INT(BOTH(nh_store_hosts_serving(b->lite, "Crm", 1000), nh_pgs_hosts_serving(b->pg, "Crm", 1000)), 1);
  ASSERT_EQ_INT(BOTH(nh_store_hosts_serving(b->lite, "Er", 0), nh_pgs_hosts_serving(b->pg, "Er", 0)), 0);
  ASSERT_EQ_INT(BOTH(nh_store_hosts_serving(b->lite, "Shop", 0), nh_pgs_hosts_serving(b->pg, "Shop", 0)), 1);
  /* put again refreshes; del removes */
  BOTH(nh_store_host_put(b->lite, "stale:1:host", ",Erp,", 100, 6000), nh_pgs_host_put(b->pg, "stale:1:host", ",Erp,", 100, 6000));
  ASSERT_EQ_INT(BOTH(nh_store_hosts_serving(b->lite, "Erp", 1000), nh_pgs_hosts_serving(b->pg, "Erp", 1000)), 3);
  BOTH(nh_store_host_del(b->lite, alive), nh_pgs_host_del(b->pg, alive));
  ASSERT_EQ_INT(BOTH(nh_store_hosts_serving(b->lite, "Crm", 0), nh_pgs_hosts_serving(b->pg, "Crm", 0)), 0);
  same_count(b, "hosts", 3);
}

TEST(parity_bulk_runs)
{
  pair_t *b = pair_open();
  nh_bulk_run_t l, p;
  ASSERT_EQ_INT(BOTH(nh_store_bulk_get(b->lite, "k", &l), nh_pgs_bulk_get(b->pg, "k", &p)), 0);
  ASSERT_NULL(p.owner);
  nh_bulk_run_t run = { .cutoff_ms = 1000, .started_ms = 900, .queued = 0, .owner = "h:1:bulk" };
  BOTH(nh_store_bulk_put(b->lite, "k", &run), nh_pgs_bulk_put(b->pg, "k", &run));
  run.queued = 250;
  run.owner = NULL;
  BOTH(nh_store_bulk_put(b->lite, "k", &run), nh_pgs_bulk_put(b->pg, "k", &run));
  ASSERT_EQ_INT(BOTH(nh_store_bulk_get(b->lite, "k", &l), nh_pgs_bulk_get(b->pg, "k", &p)), 1);
  same_i64("cutoff", l.cutoff_ms, p.cutoff_ms);
  same_i64("started", l.started_ms, p.started_ms);
  same_i64("queued", l.queued, p.queued);
  same_str("owner", l.owner, p.owner);
  ASSERT_EQ_INT(p.queued, 250);
  free(l.owner);
  free(p.owner);
  BOTH(nh_store_bulk_done(b->lite, "k"), nh_pgs_bulk_done(b->pg, "k"));
  ASSERT_EQ_INT(BOTH(nh_store_bulk_get(b->lite, "k", &l), nh_pgs_bulk_get(b->pg, "k", &p)), 0);
}

/* ---------------------------------------------------------------- text that is not UTF-8 */

/* sqlite keeps any bytes in a text column; PostgreSQL's text takes UTF-8 only (bodies are
 * bytea for that reason). The builders send such text cleaned, so that a write never
 * fails on it: prose with U+FFFD for each bad byte, ids with \xNN (store/nh_pg_ops.c says
 * why). */
#define FFFD "\xEF\xBF\xBD"
/* A lone 0xFF, a 3-byte sequence cut short, an overlong '/', a surrogate (U+D800), a code
 * point past U+10FFFF, a 4-byte sequence cut short by the end; valid text around them. */
#define BAD_TEXT                                                                             \
  "Grüße \xFF, cut \xE2\x82" "x, overlong \xC0\xAF, surrogate \xED\xA0\x80, big \xF4\x90\x80\x80, " \
  "東京 \xF0\x9F\x8D"
#define BAD_CLEAN                                                                                   \
  "Grüße " FFFD ", cut " FFFD FFFD "x, overlong " FFFD FFFD ", surrogate " FFFD FFFD FFFD ", big " \
  FFFD FFFD FFFD FFFD ", 東京 " FFFD FFFD FFFD
static const char valid_text[] = "Grüße, 東京, 🍕";

enum { AUDIT_ARG_ERROR_TEXT = 6, AUDIT_ARG_ERROR_STACK = 18 };   /* nh_pgargs_audit_put's $7, $19 */

TEST(builders_send_valid_text_as_it_is_and_clean_a_copy_of_the_rest)
{
  nh_audit_t au = audit_of("Erp", "e-1", "s-1", NH_ST_FAILED, 100);
  au.error_text = (char *)valid_text;
  au.error_stack = BAD_TEXT;
  nh_pg_args_t a;
  nh_pgargs_audit_put(&a, &au);
  /* the common path: the caller's own pointers, nothing copied */
  ASSERT_TRUE(a.values[0] == au.endpoint);
  ASSERT_TRUE(a.values[AUDIT_ARG_ERROR_TEXT] == valid_text);
  /* the rest: a copy, U+FFFD for each byte that starts no well-formed sequence */
  const char *stack = a.values[AUDIT_ARG_ERROR_STACK];
  ASSERT_TRUE(stack != au.error_stack);
  ASSERT_EQ_STR(stack, BAD_CLEAN);
  ASSERT_TRUE(nh_pg_utf8_valid(stack, strlen(stack)));
  /* a later builder with nothing to clean leaves that copy alone */
  nh_pg_args_t b;
  nh_pgargs_inbox_add(&b, "Erp", "m-1");
  ASSERT_EQ_STR(stack, BAD_CLEAN);
  /* an id gets each bad byte as \xNN instead */
  nh_pgargs_inbox_add(&b, "Erp", "m-\xFF\xC0\xAF-\xE2\x82");
  ASSERT_EQ_STR(b.values[1], "m-\\xFF\\xC0\\xAF-\\xE2\\x82");
  /* long text: every byte of it */
  enum { N = 50000 };
  char *big = malloc(2 * N + 1);
  for (int i = 0; i < N; i++) memcpy(big + 2 * i, "a\xFF", 2);
  big[2 * N] = '\0';
  au.error_stack = big;
  nh_pg_args_release(&a);   /* args built again give back their copies first */
  nh_pg_args_release(&b);
  nh_pgargs_audit_put(&a, &au);
  nh_pgargs_bulk_get(&b, big);
  const char *text = a.values[AUDIT_ARG_ERROR_STACK], *key = b.values[0];
  size_t tn = strlen(text), kn = strlen(key);
  int text_ok = tn == 4 * N && memcmp(text + tn - 4, "a" FFFD, 4) == 0 && nh_pg_utf8_valid(text, tn);
  int key_ok = kn == 5 * N && memcmp(key + kn - 5, "a\\xFF", 5) == 0;
  free(big);
  nh_pg_args_release(&a);
  nh_pg_args_release(&b);
  ASSERT_TRUE(text_ok);
  ASSERT_TRUE(key_ok);
  /* each args owns its copies: many may be held at once before any is sent */
  nh_pg_args_t held[20];
  char id[16], want[16];
  for (int i = 0; i < 20; i++) {
    snprintf(id, sizeof id, "m-\xFF-%d", i);
    nh_pgargs_inbox_add(&held[i], "Erp", id);
  }
  int all = 1;
  for (int i = 0; i < 20; i++) {
    snprintf(want, sizeof want, "m-\\xFF-%d", i);
    all &= strcmp(held[i].values[1], want) == 0;
    nh_pg_args_release(&held[i]);
  }
  ASSERT_TRUE(all);
}

TEST(text_that_is_not_utf8_is_cleaned_and_its_batch_commits)
{
  char url[1024];
  scratch_store(url, sizeof url);
  nh_pg_db_t *db = open_db(url);
  static hist_t ph;
  memset(&ph, 0, sizeof ph);
  nh_test_on_cleanup(free_hist, &ph);
  nh_audit_t au = audit_of("Erp", "e-1", "s-1", NH_ST_FAILED, 100);
  au.error_text = BAD_TEXT;
  au.error_stack = "stack " BAD_TEXT;
  au.error_type = (char *)valid_text;
  au.handoff_reason = (char *)valid_text;
  nh_history_extra_t x = { .error_text = BAD_TEXT, .error_type = valid_text, .error_stack = "at " BAD_TEXT };
  nh_error_t err = { 0 };
  if (nh_pg_batch_begin(db, &err)) FAIL("%s", err.msg);
  nh_pg_args_t a;
  nh_pgop_t op = nh_pgargs_audit_put(&a, &au);
  if (nh_pg_batch_add(db, op, &a, NULL, NULL, &err)) FAIL("%s", err.msg);
  op = nh_pgargs_history_add(&a, "Erp", "e-1", "m-1", "EventRequest", "Failed", "detail " BAD_TEXT, &x);
  if (nh_pg_batch_add(db, op, &a, NULL, NULL, &err)) FAIL("%s", err.msg);
  if (nh_pg_batch_commit(db, &err)) FAIL("the batch did not commit: %s", err.msg);
  ASSERT_EQ_INT(nh_pg_batch_outcome(db), NH_PG_COMMITTED);

  nh_audit_t got;
  ASSERT_EQ_INT(nh_pgs_audit_get(db, "Erp", "e-1", &got), 1);
  char *text = nh_xstrdup(got.error_text), *stack = nh_xstrdup(got.error_stack);
  char *type = nh_xstrdup(got.error_type), *reason = nh_xstrdup(got.handoff_reason);
  nh_audit_clear(&got);
  int same = strcmp(text, BAD_CLEAN) == 0 && strcmp(stack, "stack " BAD_CLEAN) == 0 &&
             strcmp(type, valid_text) == 0 && strcmp(reason, valid_text) == 0;
  if (!same) FAIL("audit read back: error_text \"%s\", error_stack \"%s\", error_type \"%s\", handoff_reason \"%s\"",
                  text, stack, type, reason);
  free(text); free(stack); free(type); free(reason);

  ASSERT_EQ_INT(nh_pgs_history_list(db, "Erp", "e-1", collect_history, &ph), 1);
  ASSERT_EQ_STR(ph.f[0][3], "detail " BAD_CLEAN);
  ASSERT_EQ_STR(ph.f[0][4], BAD_CLEAN);
  ASSERT_EQ_STR(ph.f[0][5], valid_text);   /* byte for byte: strcmp */
  ASSERT_EQ_STR(ph.f[0][6], "at " BAD_CLEAN);
  /* valid multibyte text is stored as its bytes, not re-encoded */
  ASSERT_EQ_STR(nh_pgtest_q1(nh_pg_db_conn(db), "SELECT octet_length(error_type) FROM history"), "21");
  ASSERT_EQ_INT(strlen(valid_text), 21);

  /* one statement at a time too */
  au.event_id = "e-2";
  ASSERT_EQ_INT(nh_pgs_audit_put(db, &au), NH_OK);
  ASSERT_EQ_INT(nh_pgs_audit_retext_deferred(db, "Erp", "s-1", BAD_TEXT), NH_OK);
  ASSERT_FALSE(nh_pg_db_failed(db));
  ASSERT_EQ_STR(nh_pgtest_q1(nh_pg_db_conn(db), "SELECT error_text FROM audit WHERE event_id = 'e-2'"), BAD_CLEAN);
}

TEST(ids_that_are_not_utf8_stay_apart_and_are_found_by_what_was_written)
{
  char url[1024];
  scratch_store(url, sizeof url);
  nh_pg_db_t *db = open_db(url);
  PGconn *c = nh_pg_db_conn(db);
  /* two message ids that U+FFFD would make one: the second is no redelivery of the first */
  ASSERT_EQ_INT(nh_pgs_inbox_add(db, "Erp", "m-\xFF"), NH_OK);
  ASSERT_EQ_INT(nh_pgs_inbox_has(db, "Erp", "m-\xFE"), 0);
  ASSERT_EQ_INT(nh_pgs_inbox_add(db, "Erp", "m-\xFE"), NH_OK);
  ASSERT_EQ_INT(nh_pgs_inbox_has(db, "Erp", "m-\xFF"), 1);
  ASSERT_EQ_INT(nh_pgs_inbox_has(db, "Erp", "m-\xFE"), 1);
  ASSERT_EQ_INT(nh_pgs_inbox_has(db, "Erp", "m-\xFD"), 0);
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT string_agg(message_id, ' ' ORDER BY message_id) FROM inbox"),
                "m-\\xFE m-\\xFF");
  /* an audit row and a session under such ids: found by the bytes they were written with,
   * and by the escaped id a read gave back */
  nh_audit_t au = audit_of("Erp", "e-\xC0\xAF", "s-\xED\xA0\x80", NH_ST_COMPLETED, 100);
  au.message_id = "m-\xFF";
  ASSERT_EQ_INT(nh_pgs_audit_put(db, &au), NH_OK);
  nh_audit_t got;
  ASSERT_EQ_INT(nh_pgs_audit_get(db, "Erp", "e-\xC0\xAE", &got), 0);
  ASSERT_EQ_INT(nh_pgs_audit_get(db, "Erp", "e-\xC0\xAF", &got), 1);
  char *eid = nh_xstrdup(got.event_id), *sid = nh_xstrdup(got.session_id), *mid = nh_xstrdup(got.message_id);
  nh_audit_clear(&got);
  int same = strcmp(eid, "e-\\xC0\\xAF") == 0 && strcmp(sid, "s-\\xED\\xA0\\x80") == 0 && strcmp(mid, "m-\\xFF") == 0;
  int again = nh_pgs_audit_get(db, "Erp", eid, &got);
  if (again == 1) nh_audit_clear(&got);
  if (!same) FAIL("ids read back: %s %s %s", eid, sid, mid);
  free(eid); free(sid); free(mid);
  ASSERT_EQ_INT(again, 1);
  nh_session_state_t st = { .blocked_by = "e-\xC0\xAF", .next_park_seq = 2 };
  ASSERT_EQ_INT(nh_pgs_session_put(db, "Erp", "s-\xED\xA0\x80", &st), NH_OK);
  nh_session_state_t rd;
  ASSERT_EQ_INT(nh_pgs_session_get(db, "Erp", "s-\xED\xA0\x81", &rd), NH_OK);
  ASSERT_EQ_INT(rd.exists, 0);
  ASSERT_EQ_INT(nh_pgs_session_get(db, "Erp", "s-\xED\xA0\x80", &rd), NH_OK);
  ASSERT_EQ_INT(rd.exists, 1);
  int blocked_ok = rd.blocked_by && strcmp(rd.blocked_by, "e-\\xC0\\xAF") == 0;
  nh_session_state_clear(&rd);
  ASSERT_TRUE(blocked_ok);
  ASSERT_FALSE(nh_pg_db_failed(db));
}

/* ---------------------------------------------------------------- the pipeline */

static int cb_log[2048], cb_n;
static char cb_taken[64];

static void on_result(void *data, const nh_pg_optab_t *tab, int op, const PGresult *res)
{
  cb_log[cb_n++] = (int)(intptr_t)data;
  if (tab == &nh_pg_store_optab && op == NH_PGOP_OPPENDING_TAKE && PQntuples(res) == 1)
    snprintf(cb_taken, sizeof cb_taken, "%s", nh_pg_col_text(res, 0, 0));
  if (PQresultStatus(res) != PGRES_COMMAND_OK && PQresultStatus(res) != PGRES_TUPLES_OK)
    cb_log[cb_n - 1] = -1;
}

/* Adds write i of a mixed batch (audit upserts, history, sessions, parks, inbox, requests). */
static void add_write(nh_pg_db_t *db, int i)
{
  char id[32], session[32];
  snprintf(id, sizeof id, "e-%d", i / 6);
  snprintf(session, sizeof session, "s-%d", i / 6 % 50);
  nh_pg_args_t a;
  nh_pgop_t op;
  switch (i % 6) {
  case 0: {
    nh_audit_t au = audit_of("Erp", id, session, NH_ST_COMPLETED, 1000 + i);
    au.payload = (char *)body_bytes;
    au.payload_len = BODY_LEN;
    op = nh_pgargs_audit_put(&a, &au);
    break;
  }
  case 1: op = nh_pgargs_history_add(&a, "Erp", id, id, "EventRequest", "Completed", NULL, NULL); break;
  case 2: {
    nh_session_state_t st = { .blocked_by = id, .next_park_seq = i };
    op = nh_pgargs_session_put(&a, "Erp", session, &st);
    break;
  }
  case 3: {
    nh_msg_t m = msg_of(session, id, body_bytes, BODY_LEN);
    op = nh_pgargs_park(&a, &m, i);
    break;
  }
  case 4: op = nh_pgargs_inbox_add(&a, "Erp", id); break;
  default: op = nh_pgargs_oppending_add(&a, id, "Erp", id, "resubmit", "Failed"); break;
  }
  nh_error_t err = { 0 };
  if (nh_pg_batch_add(db, op, &a, on_result, (void *)(intptr_t)i, &err)) FAIL("add %d: %s", i, err.msg);
}

TEST(batch_of_1000_writes_commits_together_in_one_round_trip)
{
  char url[1024];
  scratch_store(url, sizeof url);
  nh_pg_db_t *db = open_db(url);
  PGconn *other = nh_pgtest_connect(url);
  cb_n = 0;
  cb_taken[0] = '\0';
  nh_pg_db_stats_t s0, s1;
  nh_pg_db_stats(db, &s0);
  nh_error_t err = { 0 };
  if (nh_pg_batch_begin(db, &err)) FAIL("%s", err.msg);
  for (int i = 0; i < 999; i++) add_write(db, i);
  /* and one read of the batch's own write: the request added as write 5 */
  nh_pg_args_t a;
  nh_pgop_t op = nh_pgargs_oppending_take(&a, "e-0");
  if (nh_pg_batch_add(db, op, &a, on_result, (void *)(intptr_t)999, &err)) FAIL("%s", err.msg);
  /* nothing is visible before the commit, though the server may have run much of it */
  ASSERT_EQ_INT(count_pg(other, "audit"), 0);
  ASSERT_EQ_INT(cb_n, 0);
  if (nh_pg_batch_commit(db, &err)) FAIL("commit: %s", err.msg);
  nh_pg_db_stats(db, &s1);
  ASSERT_EQ_INT(cb_n, 1000);
  for (int i = 0; i < 1000; i++)
    if (cb_log[i] != i) FAIL("callback %d got the result of write %d", i, cb_log[i]);
  ASSERT_EQ_STR(cb_taken, "Failed");
  ASSERT_EQ_INT(count_pg(other, "audit"), 167);
  ASSERT_EQ_INT(count_pg(other, "history"), 167);
  ASSERT_EQ_INT(count_pg(other, "sessions"), 50);
  ASSERT_EQ_INT(count_pg(other, "parked"), 166);
  ASSERT_EQ_INT(count_pg(other, "inbox"), 166);
  ASSERT_EQ_INT(count_pg(other, "operator_pending"), 165);   /* 166 added, one taken */
  ASSERT_EQ_INT(atoll(nh_pgtest_q1(other, "SELECT length(payload) FROM audit WHERE event_id = 'e-7'")), BODY_LEN);
  ASSERT_EQ_STR(nh_pgtest_q1(other, "SELECT count(*) FROM audit WHERE created_at = updated_at"), "167");
  int64_t pipelines = s1.pipelines - s0.pipelines, statements = s1.statements - s0.statements;
  ASSERT_EQ_INT(pipelines, 1);
  ASSERT_EQ_INT(statements, 1002);   /* BEGIN, 1,000, COMMIT */
  ASSERT_EQ_INT(s1.prepares - s0.prepares, 7);
  printf("  1,000 writes in one batch: %lld round trip (pipeline), %lld statements (BEGIN, 1,000, COMMIT), "
         "%lld prepares (first use of each operation)\n", (long long)pipelines, (long long)statements,
         (long long)(s1.prepares - s0.prepares));
  /* prepared once per connection: a second batch prepares nothing */
  cb_n = 0;
  if (nh_pg_batch_begin(db, &err)) FAIL("%s", err.msg);
  for (int i = 1200; i < 1206; i++) add_write(db, i);
  if (nh_pg_batch_commit(db, &err)) FAIL("commit: %s", err.msg);
  nh_pg_db_stats(db, &s0);
  ASSERT_EQ_INT(s0.prepares, s1.prepares);
  ASSERT_EQ_INT(cb_n, 6);
  ASSERT_EQ_INT(PQtransactionStatus(nh_pg_db_conn(db)), PQTRANS_IDLE);
}

TEST(batch_with_a_failing_statement_commits_nothing_and_names_it)
{
  char url[1024];
  scratch_store(url, sizeof url);
  nh_pg_db_t *db = open_db(url);
  PGconn *other = nh_pgtest_connect(url);
  cb_n = 0;
  nh_error_t err = { 0 };
  if (nh_pg_batch_begin(db, &err)) FAIL("%s", err.msg);
  for (int i = 0; i < 60; i++) add_write(db, i);
  nh_audit_t bad = audit_of("Erp", "e-bad", "s-bad", NULL, 5);   /* status is NOT NULL */
  nh_pg_args_t a;
  nh_pgop_t op = nh_pgargs_audit_put(&a, &bad);
  if (nh_pg_batch_add(db, op, &a, on_result, (void *)(intptr_t)60, &err)) FAIL("%s", err.msg);
  /* after it: more writes, one of an operation not prepared yet (its prepare is skipped too) */
  for (int i = 61; i < 70; i++) add_write(db, i);
  nh_bulk_run_t run = { .cutoff_ms = 1, .started_ms = 1, .owner = "x" };
  op = nh_pgargs_bulk_put(&a, "k", &run);
  if (nh_pg_batch_add(db, op, &a, on_result, (void *)(intptr_t)70, &err)) FAIL("%s", err.msg);
  ASSERT_EQ_INT(nh_pg_batch_commit(db, &err), NH_EFAIL);
  ASSERT_CONTAINS(err.msg, "null value in column \"status\" of relation \"audit\" violates not-null constraint "
                           "(SQLSTATE 23502) while running statement 61 of a batch of 71 (audit_put); nothing of the "
                           "batch was committed");
  ASSERT_CONTAINS(err.msg, "store postgresql://");
  ASSERT_EQ_INT(cb_n, 0);
  static const char *const tables[] = { "audit", "history", "sessions", "parked", "inbox", "operator_pending",
                                        "bulk_runs" };
  for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++)
    if (count_pg(other, tables[i]) != 0) FAIL("%s has rows of the failed batch", tables[i]);
  /* the connection is idle and usable, and the skipped prepare is made again */
  ASSERT_EQ_INT(PQtransactionStatus(nh_pg_db_conn(db)), PQTRANS_IDLE);
  if (nh_pg_batch_begin(db, &err)) FAIL("%s", err.msg);
  for (int i = 0; i < 12; i++) add_write(db, i);
  if (nh_pg_batch_add(db, op, &a, on_result, (void *)(intptr_t)12, &err)) FAIL("%s", err.msg);
  if (nh_pg_batch_commit(db, &err)) FAIL("commit after a failed batch: %s", err.msg);
  ASSERT_EQ_INT(cb_n, 13);
  ASSERT_EQ_INT(count_pg(other, "bulk_runs"), 1);
  ASSERT_EQ_INT(count_pg(other, "audit"), 2);
  /* an abandoned batch leaves nothing either */
  if (nh_pg_batch_begin(db, &err)) FAIL("%s", err.msg);
  add_write(db, 600);
  nh_pg_batch_abandon(db);
  ASSERT_EQ_INT(count_pg(other, "audit"), 2);
  ASSERT_EQ_INT(PQtransactionStatus(nh_pg_db_conn(db)), PQTRANS_IDLE);
  /* misuse is refused, saying so */
  ASSERT_EQ_INT(nh_pg_batch_add(db, op, &a, NULL, NULL, &err), NH_ESTATE);
  ASSERT_CONTAINS(err.msg, "no batch is open");
  a.n = 2;
  ASSERT_EQ_INT(nh_pg_db_run(db, NH_PGOP_BULK_PUT, &a, NULL, &err), NH_EUSAGE);
  ASSERT_CONTAINS(err.msg, "given 2 parameters, not 5");
}

/* The same batch driven by a loop: nh_pg_batch_poll from a uv_poll on the socket, never
 * waiting itself. */
typedef struct on_loop {
  nh_pg_db_t *db;
  uv_poll_t poll;
  int rc, over, wakeups;
  nh_error_t err;
} on_loop_t;

static int uv_events(int want)
{
  return (want & NH_PG_WANT_READ ? UV_READABLE : 0) | (want & NH_PG_WANT_WRITE ? UV_WRITABLE : 0);
}

static void on_socket(uv_poll_t *h, int status, int events)
{
  on_loop_t *l = h->data;
  l->wakeups++;
  int want = nh_pg_batch_poll(l->db, &l->rc, &l->err);
  if (want) {
    uv_poll_start(h, uv_events(want), on_socket);
    return;
  }
  l->over = 1;
  uv_close((uv_handle_t *)h, NULL);
}

TEST(batch_driven_from_a_uv_poll)
{
  char url[1024];
  scratch_store(url, sizeof url);
  on_loop_t l = { .db = open_db(url) };
  nh_error_t err = { 0 };
  cb_n = 0;
  if (nh_pg_batch_begin(l.db, &err)) FAIL("%s", err.msg);
  for (int i = 0; i < 600; i++) add_write(l.db, i);
  if (nh_pg_batch_send_commit(l.db, &err)) FAIL("%s", err.msg);
  uv_loop_t loop;
  uv_loop_init(&loop);
  ASSERT_EQ_INT(uv_poll_init(&loop, &l.poll, PQsocket(nh_pg_db_conn(l.db))), 0);
  l.poll.data = &l;
  uv_poll_start(&l.poll, UV_READABLE | UV_WRITABLE, on_socket);
  uv_run(&loop, UV_RUN_DEFAULT);
  ASSERT_EQ_INT(uv_loop_close(&loop), 0);
  ASSERT_TRUE(l.over);
  if (l.rc) FAIL("%s", l.err.msg);
  ASSERT_EQ_INT(cb_n, 600);
  ASSERT_CMP_INT(l.wakeups, >=, 1);
  ASSERT_EQ_INT(count_pg(nh_pg_db_conn(l.db), "audit"), 100);
  ASSERT_EQ_INT(count_pg(nh_pg_db_conn(l.db), "parked"), 100);
}

typedef struct killer {
  int pid;
  int killed;
  char why[512];
} killer_t;

/* Waits (polling, up to 60 s) until backend `pid` waits for a lock, then terminates it
 * through a superuser connection of its own. */
static void *kill_when_blocked(void *p)
{
  killer_t *k = p;
  PGconn *c = NULL;
  nh_error_t err = { 0 };
  if (nh_pg_connect(srv->admin_url, &c, &err)) {
    snprintf(k->why, sizeof k->why, "%s", err.msg);
    return NULL;
  }
  char pid[16];
  snprintf(pid, sizeof pid, "%d", k->pid);
  const char *const params[] = { pid };
  int64_t deadline = nh_test_mono_ms() + 60000;
  while (nh_test_mono_ms() < deadline) {
    PGresult *r = NULL;
    if (nh_pg_exec(c, "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1::int", 1, params, &r,
                   &err)) {
      snprintf(k->why, sizeof k->why, "%s", err.msg);
      break;
    }
    int blocked = PQntuples(r) == 1 && strcmp(PQgetvalue(r, 0, 0), "t") == 0;
    PQclear(r);
    if (blocked) {
      if (nh_pg_exec(c, "SELECT pg_terminate_backend($1::int, 10000)", 1, params, &r, &err)) {
        snprintf(k->why, sizeof k->why, "%s", err.msg);
      } else {
        k->killed = strcmp(PQgetvalue(r, 0, 0), "t") == 0;
        PQclear(r);
      }
      break;
    }
    usleep(2000);   /* the poll's interval */
  }
  if (!k->killed && !*k->why) snprintf(k->why, sizeof k->why, "the batch never waited for the lock within 60 s");
  PQfinish(c);
  return NULL;
}

TEST(batch_on_a_connection_killed_mid_batch_commits_nothing)
{
  char url[1024];
  scratch_store(url, sizeof url);
  PGconn *c = NULL;
  nh_error_t err = { 0 };
  if (nh_pg_connect(url, &c, &err)) FAIL("%s", err.msg);
  nh_pg_db_t *db = nh_pg_db_new(c);
  /* history_add prepared before: the batch then waits in its execution, not its prepare */
  if (nh_pgs_history_add(db, "Erp", "before", "m", "EventRequest", "Completed", NULL)) FAIL("history add");
  /* another session holds history: the batch stops at its history row */
  PGconn *holder = nh_pgtest_connect(url);
  nh_pgtest_q1(holder, "BEGIN");
  nh_pgtest_q1(holder, "LOCK TABLE history IN ACCESS EXCLUSIVE MODE");
  nh_pgtest_q1(holder, "SELECT 1");
  killer_t k = { .pid = PQbackendPID(c) };
  pthread_t th;
  pthread_create(&th, NULL, kill_when_blocked, &k);
  cb_n = 0;
  int rc = nh_pg_batch_begin(db, &err);
  for (int i = 0; rc == NH_OK && i < 100; i++) {
    nh_pg_args_t a;
    char id[16];
    snprintf(id, sizeof id, "e-%d", i);
    nh_audit_t au = audit_of("Erp", id, "s", NH_ST_COMPLETED, 5);
    nh_pgop_t op = i == 50 ? nh_pgargs_history_add(&a, "Erp", id, id, "EventRequest", "Completed", NULL, NULL)
                           : nh_pgargs_audit_put(&a, &au);
    rc = nh_pg_batch_add(db, op, &a, on_result, NULL, &err);
  }
  if (rc == NH_OK) rc = nh_pg_batch_commit(db, &err);
  pthread_join(th, NULL);
  nh_pgtest_q1(holder, "ROLLBACK");
  nh_pg_db_free(db);
  if (!k.killed) FAIL("the backend was not terminated: %s", k.why);
  ASSERT_EQ_INT(rc, NH_EFAIL);
  ASSERT_CONTAINS(err.msg, "was lost while running statement 51 of a batch of 100 (history_add); nothing of the "
                           "batch was committed (SQLSTATE 57P01: terminating connection due to administrator command)");
  ASSERT_CONTAINS(err.msg, "is the server still running?");
  ASSERT_EQ_INT(cb_n, 0);
  PGconn *check = nh_pgtest_connect(url);
  ASSERT_EQ_INT(count_pg(check, "audit"), 0);
  ASSERT_EQ_INT(count_pg(check, "history"), 1);   /* the one from before */
}

/* ---------------------------------------------------------------- how much a batch saves */

TEST(timing_10000_audit_and_history_writes_batched_vs_one_by_one)
{
  enum { WRITES = 10000, BATCH = 256 };
  char url1[1024], url2[1024];
  scratch_store(url1, sizeof url1);
  scratch_store(url2, sizeof url2);
  nh_pg_db_t *one = open_db(url1), *batched = open_db(url2);
  nh_error_t err = { 0 };
  char id[32];
  nh_pg_db_stats_t s0, s1;

  /* one by one: each write its own round trip, committed every BATCH writes like the batches */
  nh_pg_db_stats(one, &s0);
  int64_t t0 = nh_test_mono_ms();
  for (int i = 0; i < WRITES; i++) {
    if (i % BATCH == 0 && nh_pg_exec(nh_pg_db_conn(one), "BEGIN", 0, NULL, NULL, &err)) FAIL("%s", err.msg);
    snprintf(id, sizeof id, "e-%d", i / 2);
    nh_audit_t au = audit_of("Erp", id, "s", NH_ST_COMPLETED, 5);
    int rc = i % 2 ? nh_pgs_history_add(one, "Erp", id, id, "EventRequest", "Completed", NULL)
                   : nh_pgs_audit_put(one, &au);
    if (rc) FAIL("write %d: %s", i, nh_pg_db_error(one)->msg);
    if ((i % BATCH == BATCH - 1 || i == WRITES - 1) && nh_pg_exec(nh_pg_db_conn(one), "COMMIT", 0, NULL, NULL, &err))
      FAIL("%s", err.msg);
  }
  int64_t t_one = nh_test_mono_ms() - t0;
  nh_pg_db_stats(one, &s1);
  int64_t rt_one = s1.pipelines - s0.pipelines + (WRITES + BATCH - 1) / BATCH * 2;   /* + BEGIN and COMMIT */

  nh_pg_db_stats(batched, &s0);
  t0 = nh_test_mono_ms();
  for (int i = 0; i < WRITES; i++) {
    if (i % BATCH == 0 && nh_pg_batch_begin(batched, &err)) FAIL("%s", err.msg);
    snprintf(id, sizeof id, "e-%d", i / 2);
    nh_audit_t au = audit_of("Erp", id, "s", NH_ST_COMPLETED, 5);
    nh_pg_args_t a;
    nh_pgop_t op = i % 2 ? nh_pgargs_history_add(&a, "Erp", id, id, "EventRequest", "Completed", NULL, NULL)
                         : nh_pgargs_audit_put(&a, &au);
    if (nh_pg_batch_add(batched, op, &a, NULL, NULL, &err)) FAIL("write %d: %s", i, err.msg);
    if ((i % BATCH == BATCH - 1 || i == WRITES - 1) && nh_pg_batch_commit(batched, &err)) FAIL("%s", err.msg);
  }
  int64_t t_batched = nh_test_mono_ms() - t0;
  nh_pg_db_stats(batched, &s1);
  int64_t rt_batched = s1.pipelines - s0.pipelines;

  for (int k = 0; k < 2; k++) {
    PGconn *c = nh_pg_db_conn(k ? batched : one);
    ASSERT_EQ_INT(count_pg(c, "audit"), WRITES / 2);
    ASSERT_EQ_INT(count_pg(c, "history"), WRITES / 2);
  }
  ASSERT_EQ_INT(rt_batched, (WRITES + BATCH - 1) / BATCH);
  printf("  %d writes (audit upsert + history row per event), committed every %d: one by one %lld ms "
         "(%lld round trips), in batches %lld ms (%lld round trips): %.1fx\n", WRITES, BATCH, (long long)t_one,
         (long long)rt_one, (long long)t_batched, (long long)rt_batched,
         t_batched > 0 ? (double)t_one / (double)t_batched : 0.0);
}

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv)
{
  int rc = nh_pgtest_setup(NH_PGTEST_HOOKS, argv[0], NH_PGTEST_NEED_ADMIN_URL, "skipped");
  if (rc) return rc;
  srv = nh_pgtest_server();
  rc = nh_test_run_all(argc, argv);
  nh_pgtest_teardown();
  return rc;
}
