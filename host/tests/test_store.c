/* Unit tests for store/: open/create, refusal of foreign files, migrations, the audit
 * projection, history, session state, parked FIFOs, inbox, processed, oplog and
 * transactions. */
#include "nh_test.h"
#include "nh_test_sql.h"

#include "core/nh_log.h"
#include "core/nh_util.h"
#include "core/nh_failgroup.h"
#include "store/nh_store.h"
#include "store/nh_store_schema.h"
#include "core/nh_runtime.h"
#include "dispatch/nh_checkpointer.h"

#include <sqlite3.h>
#include <sys/stat.h>
#include <uv.h>

/* ---------------------------------------------------------------- helpers */

static nh_store_t *open_store(const char *name)
{
  nh_store_t *s = NULL;
  nh_error_t err = {0};
  int rc = nh_store_open(&s, nh_test_path(name), NH_STORE_CREATE, &err);
  if (rc) FAIL("nh_store_open(%s) = %d: %s", name, rc, err.msg);
  return s;
}

#define q1 nh_test_q1s
#define q1i nh_test_q1i

static void put_audit(nh_store_t *s, const char *ep, const char *eid, const char *session, const char *status,
                      int64_t at)
{
  nh_audit_t a = {0};
  a.endpoint = (char *)ep;
  a.event_id = (char *)eid;
  a.session_id = (char *)session;
  a.event_type = "Thing";
  a.status = (char *)status;
  a.message_id = "m-1";
  a.payload = "{\"n\":1}";
  a.updated_at = at;
  if (nh_store_audit_put(s, &a)) FAIL("audit put %s/%s: %s", ep, eid, nh_store_errmsg(s));
}

static nh_msg_t make_msg(const char *ep, const char *session, const char *eid, const char *body)
{
  nh_msg_t m;
  memset(&m, 0, sizeof m);
  m.endpoint = (char *)ep;
  m.session_id = (char *)session;
  m.message_id = (char *)eid;   /* distinct per message is all the store needs */
  m.event_id = (char *)eid;
  m.event_type = "Thing";
  m.type = NH_MT_EVENT;
  m.correlation_id = "corr";
  m.from = "Src";
  m.retry_count = 2;
  m.enqueued_at = 1234;
  m.body = (char *)body;
  m.body_len = body ? strlen(body) : 0;
  return m;
}

/* ---------------------------------------------------------------- open / create */

TEST(open_creates_wal_store)
{
  nh_store_t *s = open_store("nimbus.db");
  ASSERT_EQ_STR(nh_store_path(s), nh_test_path("nimbus.db"));
  sqlite3 *db = nh_store_db(s);
  ASSERT_EQ_STR(q1(db, "PRAGMA journal_mode"), "wal");
  ASSERT_EQ_INT(q1i(db, "SELECT version FROM nh_schema WHERE component = 'store'"), 4);
  ASSERT_EQ_INT(q1i(db, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN "
                        "('audit','history','sessions','parked','inbox','processed','operator_log')"),
                7);
  nh_store_close(s);
  struct stat sb;
  ASSERT_EQ_INT(stat(nh_test_path("nimbus.db"), &sb), 0);
}

TEST(open_without_create_reports_missing_store)
{
  nh_store_t *s = (nh_store_t *)1;
  nh_error_t err = {0};
  int rc = nh_store_open(&s, nh_test_path("absent.db"), 0, &err);
  ASSERT_EQ_INT(rc, NH_ENOTFOUND);
  ASSERT_NULL(s);
  ASSERT_CONTAINS(err.msg, "does not exist");
  ASSERT_CONTAINS(err.msg, "absent.db");
  struct stat sb;
  ASSERT_TRUE(stat(nh_test_path("absent.db"), &sb) != 0);   /* nothing created */
}

TEST(open_refuses_foreign_sqlite_file)
{
  const char *path = nh_test_path("foreign.db");
  sqlite3 *db;
  ASSERT_EQ_INT(sqlite3_open(path, &db), SQLITE_OK);
  ASSERT_EQ_INT(sqlite3_exec(db, "CREATE TABLE customers(id INTEGER PRIMARY KEY, name TEXT);"
                                 "INSERT INTO customers(name) VALUES ('Ada');",
                             NULL, NULL, NULL),
                SQLITE_OK);
  sqlite3_close(db);

  nh_store_t *s = NULL;
  nh_error_t err = {0};
  int rc = nh_store_open(&s, path, NH_STORE_CREATE, &err);
  ASSERT_EQ_INT(rc, NH_EUSAGE);
  ASSERT_NULL(s);
  ASSERT_CONTAINS(err.msg, "not a nimbus-host store");
  ASSERT_CONTAINS(err.msg, "foreign.db");

  /* and it really was not touched */
  ASSERT_EQ_INT(sqlite3_open(path, &db), SQLITE_OK);
  ASSERT_EQ_INT(q1i(db, "SELECT count(*) FROM sqlite_master WHERE name = 'audit'"), 0);
  ASSERT_EQ_INT(q1i(db, "PRAGMA application_id"), 0);
  ASSERT_EQ_STR(q1(db, "SELECT name FROM customers"), "Ada");
  sqlite3_close(db);
}

TEST(open_refuses_non_sqlite_file)
{
  const char *path = nh_test_path("notes.txt");
  ASSERT_EQ_INT(nh_test_write_file(path, "this is not a database, just some text that is long enough\n"), 0);
  nh_store_t *s = NULL;
  nh_error_t err = {0};
  int rc = nh_store_open(&s, path, NH_STORE_CREATE, &err);
  ASSERT_NE_INT(rc, NH_OK);
  ASSERT_NULL(s);
  ASSERT_CONTAINS(err.msg, "notes.txt");
  ASSERT_EQ_STR(nh_test_read_file(path), "this is not a database, just some text that is long enough\n");
}

TEST(open_reports_missing_directory)
{
  const char *path = nh_test_path("no/such/dir/nimbus.db");
  nh_store_t *s = NULL;
  nh_error_t err = {0};
  int rc = nh_store_open(&s, path, NH_STORE_CREATE, &err);
  ASSERT_EQ_INT(rc, NH_EUSAGE);
  ASSERT_NULL(s);
  ASSERT_CONTAINS(err.msg, "directory");
  ASSERT_CONTAINS(err.msg, "no/such/dir");
  ASSERT_CONTAINS(err.msg, "does not exist");
}

TEST(open_refuses_directory_path)
{
  nh_store_t *s = NULL;
  nh_error_t err = {0};
  int rc = nh_store_open(&s, nh_test_tmpdir(), NH_STORE_CREATE, &err);
  ASSERT_EQ_INT(rc, NH_EUSAGE);
  ASSERT_NULL(s);
  ASSERT_CONTAINS(err.msg, "is a directory");
}

TEST(reopen_keeps_data_and_migrations_are_idempotent)
{
  nh_store_t *s = open_store("nimbus.db");
  put_audit(s, "Ep", "ev-reopen-1", "s1", NH_ST_COMPLETED, 1000);
  nh_store_close(s);

  for (int round = 0; round < 3; round++) {
    s = open_store("nimbus.db");
    sqlite3 *db = nh_store_db(s);
    ASSERT_EQ_INT(q1i(db, "SELECT version FROM nh_schema WHERE component = 'store'"), 4);
    ASSERT_EQ_INT(q1i(db, "SELECT count(*) FROM nh_schema"), 1);
    ASSERT_EQ_STR(q1(db, "PRAGMA journal_mode"), "wal");
    nh_audit_t a = {0};
    ASSERT_EQ_INT(nh_store_audit_get(s, "Ep", "ev-reopen-1", &a), 1);
    ASSERT_EQ_STR(a.status, NH_ST_COMPLETED);
    nh_audit_clear(&a);
    nh_store_close(s);
  }
}

TEST(open_refuses_newer_schema)
{
  nh_store_t *s = open_store("nimbus.db");
  ASSERT_EQ_INT(sqlite3_exec(nh_store_db(s), "UPDATE nh_schema SET version = 99 WHERE component = 'store'", NULL,
                             NULL, NULL),
                SQLITE_OK);
  nh_store_close(s);
  nh_error_t err = {0};
  s = NULL;
  ASSERT_NE_INT(nh_store_open(&s, nh_test_path("nimbus.db"), NH_STORE_CREATE, &err), NH_OK);
  ASSERT_NULL(s);
  ASSERT_CONTAINS(err.msg, "newer");
}

/* ---------------------------------------------------------------- audit */

TEST(audit_put_get_roundtrip_all_fields)
{
  nh_store_t *s = open_store("nimbus.db");
  nh_audit_t a = {0};
  a.endpoint = "ErpEndpoint";
  a.event_id = "0b8f2c3e-1111-4222-8333-444455556666";
  a.session_id = "acct-7";
  a.event_type = "CrmAccountCreated";
  a.status = NH_ST_PENDING;
  a.sub_status = "Handoff";
  a.error_text = "text";
  a.error_type = "Type";
  a.handoff_reason = "Awaiting ERP DMF import job";
  a.external_job_id = "DMF-1a2b";
  a.expected_by = 1790000000123;
  a.message_id = "msg-1";
  a.correlation_id = "corr-1";
  a.originating_message_id = "orig-1";
  a.retry_count = 3;
  a.payload = "{\"AccountId\":7}";
  a.result = "{\"ok\":true}";
  a.error_stack = "stack traceback:\n\t[C]: in ?";
  a.updated_at = 1700000000000;
  ASSERT_EQ_INT(nh_store_audit_put(s, &a), NH_OK);

  nh_audit_t b = {0};
  ASSERT_EQ_INT(nh_store_audit_get(s, "ErpEndpoint", a.event_id, &b), 1);
  ASSERT_EQ_STR(b.endpoint, "ErpEndpoint");
  ASSERT_EQ_STR(b.event_id, a.event_id);
  ASSERT_EQ_STR(b.session_id, "acct-7");
  ASSERT_EQ_STR(b.event_type, "CrmAccountCreated");
  ASSERT_EQ_STR(b.status, NH_ST_PENDING);
  ASSERT_EQ_STR(b.sub_status, "Handoff");
  ASSERT_EQ_STR(b.error_text, "text");
  ASSERT_EQ_STR(b.error_type, "Type");
  ASSERT_EQ_STR(b.handoff_reason, "Awaiting ERP DMF import job");
  ASSERT_EQ_STR(b.external_job_id, "DMF-1a2b");
  ASSERT_EQ_INT(b.expected_by, 1790000000123);
  ASSERT_EQ_STR(b.message_id, "msg-1");
  ASSERT_EQ_STR(b.correlation_id, "corr-1");
  ASSERT_EQ_STR(b.originating_message_id, "orig-1");
  ASSERT_EQ_INT(b.retry_count, 3);
  ASSERT_EQ_STR(b.payload, "{\"AccountId\":7}");
  ASSERT_EQ_STR(b.result, "{\"ok\":true}");
  ASSERT_EQ_STR(b.error_stack, "stack traceback:\n\t[C]: in ?");
  ASSERT_EQ_INT(b.created_at, 1700000000000);
  ASSERT_EQ_INT(b.updated_at, 1700000000000);
  nh_audit_clear(&b);
  ASSERT_NULL(b.status);

  /* absent row, and the same event id on another endpoint is another row */
  ASSERT_EQ_INT(nh_store_audit_get(s, "OtherEndpoint", a.event_id, &b), 0);
  ASSERT_EQ_INT(nh_store_audit_get(s, "ErpEndpoint", "nope", &b), 0);
  nh_store_close(s);
}

TEST(audit_upsert_updates_and_keeps_created_at)
{
  nh_store_t *s = open_store("nimbus.db");
  put_audit(s, "Ep", "ev-1", "s1", NH_ST_FAILED, 1000);
  nh_audit_t a = {0};
  a.endpoint = "Ep";
  a.event_id = "ev-1";
  a.session_id = "s1";
  a.status = NH_ST_COMPLETED;
  a.retry_count = 1;
  a.updated_at = 5000;
  ASSERT_EQ_INT(nh_store_audit_put(s, &a), NH_OK);
  nh_audit_t b = {0};
  ASSERT_EQ_INT(nh_store_audit_get(s, "Ep", "ev-1", &b), 1);
  ASSERT_EQ_STR(b.status, NH_ST_COMPLETED);
  ASSERT_EQ_INT(b.retry_count, 1);
  ASSERT_EQ_INT(b.created_at, 1000);
  ASSERT_EQ_INT(b.updated_at, 5000);
  ASSERT_NULL(b.payload);   /* upsert replaces fields, it does not merge */
  ASSERT_NULL(b.error_text);
  ASSERT_EQ_INT(b.expected_by, 0);
  nh_audit_clear(&b);
  ASSERT_EQ_INT(q1i(nh_store_db(s), "SELECT count(*) FROM audit"), 1);

  /* updated_at = 0 means "now" */
  int64_t before = nh_time_now_ms();
  a.updated_at = 0;
  ASSERT_EQ_INT(nh_store_audit_put(s, &a), NH_OK);
  ASSERT_EQ_INT(nh_store_audit_get(s, "Ep", "ev-1", &b), 1);
  ASSERT_CMP_INT(b.updated_at, >=, before);
  ASSERT_CMP_INT(b.updated_at, <=, nh_time_now_ms());
  ASSERT_EQ_INT(b.created_at, 1000);
  nh_audit_clear(&b);
  nh_store_close(s);
}

TEST(audit_find_exact_and_by_prefix)
{
  nh_store_t *s = open_store("nimbus.db");
  put_audit(s, "EpA", "abcdef01-0000-4000-8000-000000000001", "s1", NH_ST_COMPLETED, 1000);
  put_audit(s, "EpB", "abcdef01-0000-4000-8000-000000000002", "s2", NH_ST_FAILED, 1001);
  put_audit(s, "EpB", "12345678-aaaa-4000-8000-000000000003", "s3", NH_ST_FAILED, 1002);

  nh_audit_t a = {0};
  nh_error_t err = {0};
  ASSERT_EQ_INT(nh_store_audit_find(s, "abcdef01-0000-4000-8000-000000000002", &a, &err), NH_OK);
  ASSERT_EQ_STR(a.endpoint, "EpB");
  ASSERT_EQ_STR(a.status, NH_ST_FAILED);
  nh_audit_clear(&a);

  /* unique prefix of 8+ characters */
  ASSERT_EQ_INT(nh_store_audit_find(s, "12345678", &a, &err), NH_OK);
  ASSERT_EQ_STR(a.event_id, "12345678-aaaa-4000-8000-000000000003");
  nh_audit_clear(&a);
  ASSERT_EQ_INT(nh_store_audit_find(s, "abcdef01-0000-4000-8000-0000000000", &a, &err), NH_EUSAGE);
  ASSERT_CONTAINS(err.msg, "several");
  ASSERT_NULL(a.event_id);
  ASSERT_EQ_INT(nh_store_audit_find(s, "abcdef01-0000-4000-8000-00000000000", &a, &err), NH_EUSAGE);
  ASSERT_EQ_INT(nh_store_audit_find(s, "abcdef01-0000-4000-8000-000000000001", &a, &err), NH_OK);
  ASSERT_EQ_STR(a.endpoint, "EpA");
  nh_audit_clear(&a);

  /* prefixes shorter than 8 characters are not searched */
  memset(&err, 0, sizeof err);
  ASSERT_EQ_INT(nh_store_audit_find(s, "1234567", &a, &err), NH_ENOTFOUND);
  ASSERT_CONTAINS(err.msg, "8");
  ASSERT_NULL(a.event_id);

  /* no match at all */
  memset(&err, 0, sizeof err);
  ASSERT_EQ_INT(nh_store_audit_find(s, "ffffffff", &a, &err), NH_ENOTFOUND);
  ASSERT_CONTAINS(err.msg, "ffffffff");
  ASSERT_NULL(a.event_id);
  nh_store_close(s);
}

typedef struct {
  int n;
  char ids[16][64];
  int stop_after;
} collect_t;

static int collect_audit(void *data, const nh_audit_t *a)
{
  collect_t *c = data;
  if (c->n < 16) snprintf(c->ids[c->n], sizeof c->ids[0], "%s", a->event_id);
  c->n++;
  return c->stop_after && c->n >= c->stop_after;
}

TEST(audit_list_filters)
{
  nh_store_t *s = open_store("nimbus.db");
  put_audit(s, "EpA", "e1", "s1", NH_ST_COMPLETED, 1000);
  put_audit(s, "EpA", "e2", "s2", NH_ST_FAILED, 1001);
  put_audit(s, "EpB", "e3", "s1", NH_ST_FAILED, 1002);
  put_audit(s, "EpA", "e4", "s1", NH_ST_DEFERRED, 1003);

  collect_t c = {0};
  ASSERT_EQ_INT(nh_store_audit_list(s, NULL, NULL, NULL, collect_audit, &c), 4);
  ASSERT_EQ_INT(c.n, 4);
  ASSERT_EQ_STR(c.ids[0], "e1");   /* creation order */
  ASSERT_EQ_STR(c.ids[3], "e4");

  memset(&c, 0, sizeof c);
  ASSERT_EQ_INT(nh_store_audit_list(s, "EpA", NULL, NULL, collect_audit, &c), 3);
  ASSERT_EQ_STR(c.ids[0], "e1");
  ASSERT_EQ_STR(c.ids[1], "e2");
  ASSERT_EQ_STR(c.ids[2], "e4");

  memset(&c, 0, sizeof c);
  ASSERT_EQ_INT(nh_store_audit_list(s, NULL, "failed", NULL, collect_audit, &c), 2);   /* case-insensitive */
  ASSERT_EQ_STR(c.ids[0], "e2");
  ASSERT_EQ_STR(c.ids[1], "e3");

  memset(&c, 0, sizeof c);
  ASSERT_EQ_INT(nh_store_audit_list(s, "EpA", NULL, "s1", collect_audit, &c), 2);
  ASSERT_EQ_STR(c.ids[0], "e1");
  ASSERT_EQ_STR(c.ids[1], "e4");

  memset(&c, 0, sizeof c);
  ASSERT_EQ_INT(nh_store_audit_list(s, "EpA", NH_ST_FAILED, "s1", collect_audit, &c), 0);
  ASSERT_EQ_INT(c.n, 0);

  /* the callback can stop the scan */
  memset(&c, 0, sizeof c);
  c.stop_after = 2;
  nh_store_audit_list(s, NULL, NULL, NULL, collect_audit, &c);
  ASSERT_EQ_INT(c.n, 2);
  nh_store_close(s);
}

/* ---------------------------------------------------------------- history */

typedef struct {
  int n;
  char rows[16][128];
} hist_t;

static int collect_history(void *data, const nh_history_row_t *r)
{
  hist_t *h = data;
  if (r->at <= 0) FAIL("history row without a timestamp");
  if (h->n < 16)
    snprintf(h->rows[h->n], sizeof h->rows[0], "%s|%s|%s|%s", NH_TEST_STR(r->message_id), NH_TEST_STR(r->message_type),
             NH_TEST_STR(r->status), NH_TEST_STR(r->detail));
  h->n++;
  return 0;
}

TEST(history_is_append_only_in_order)
{
  nh_store_t *s = open_store("nimbus.db");
  ASSERT_EQ_INT(nh_store_history_add(s, "Ep", "e1", "m1", "EventRequest", "Failed", "boom"), NH_OK);
  ASSERT_EQ_INT(nh_store_history_add(s, "Ep", "e2", "m9", "EventRequest", "Completed", NULL), NH_OK);
  ASSERT_EQ_INT(nh_store_history_add(s, "Ep", "e1", "m2", "ResubmissionRequest", "Completed", "ok"), NH_OK);
  ASSERT_EQ_INT(nh_store_history_add(s, "Other", "e1", "m3", "EventRequest", "Completed", NULL), NH_OK);
  ASSERT_EQ_INT(nh_store_history_add(s, "Ep", "e1", "m4", "SkipRequest", "Skipped", NULL), NH_OK);
  hist_t h = {0};
  ASSERT_EQ_INT(nh_store_history_list(s, "Ep", "e1", collect_history, &h), 3);
  ASSERT_EQ_STR(h.rows[0], "m1|EventRequest|Failed|boom");
  ASSERT_EQ_STR(h.rows[1], "m2|ResubmissionRequest|Completed|ok");
  ASSERT_EQ_STR(h.rows[2], "m4|SkipRequest|Skipped|(null)");
  memset(&h, 0, sizeof h);
  ASSERT_EQ_INT(nh_store_history_list(s, "Ep", "none", collect_history, &h), 0);
  nh_store_close(s);
}

/* ---------------------------------------------------------------- sessions */

TEST(session_state_put_get)
{
  nh_store_t *s = open_store("nimbus.db");
  nh_session_state_t st;
  ASSERT_EQ_INT(nh_store_session_get(s, "Ep", "s1", &st), NH_OK);
  ASSERT_EQ_INT(st.exists, 0);
  ASSERT_NULL(st.blocked_by);
  ASSERT_EQ_INT(st.draining, 0);
  ASSERT_EQ_INT(st.retry_due, 0);
  ASSERT_EQ_INT(st.next_park_seq, 1);

  st.blocked_by = nh_xstrdup("ev-block");
  st.retry_due = 123456;
  st.next_park_seq = 4;
  ASSERT_EQ_INT(nh_store_session_put(s, "Ep", "s1", &st), NH_OK);
  nh_session_state_clear(&st);

  ASSERT_EQ_INT(nh_store_session_get(s, "Ep", "s1", &st), NH_OK);
  ASSERT_EQ_INT(st.exists, 1);
  ASSERT_EQ_STR(st.blocked_by, "ev-block");
  ASSERT_EQ_INT(st.draining, 0);
  ASSERT_EQ_INT(st.retry_due, 123456);
  ASSERT_EQ_INT(st.next_park_seq, 4);

  /* overwrite: unblocked but draining */
  free(st.blocked_by);
  st.blocked_by = NULL;
  st.retry_due = 0;
  st.draining = 1;
  ASSERT_EQ_INT(nh_store_session_put(s, "Ep", "s1", &st), NH_OK);
  nh_session_state_clear(&st);
  ASSERT_EQ_INT(nh_store_session_get(s, "Ep", "s1", &st), NH_OK);
  ASSERT_EQ_INT(st.exists, 1);
  ASSERT_NULL(st.blocked_by);
  ASSERT_EQ_INT(st.draining, 1);
  ASSERT_EQ_INT(st.retry_due, 0);
  ASSERT_EQ_INT(st.next_park_seq, 4);
  nh_session_state_clear(&st);

  /* sessions are per endpoint */
  ASSERT_EQ_INT(nh_store_session_get(s, "Other", "s1", &st), NH_OK);
  ASSERT_EQ_INT(st.exists, 0);
  nh_store_close(s);
}

TEST(free_session_deletes_its_row)
{
  nh_store_t *s = open_store("nimbus.db");
  sqlite3 *db = nh_store_db(s);
  nh_session_state_t st;
  nh_store_session_get(s, "Ep", "s1", &st);
  st.blocked_by = nh_xstrdup("ev");
  ASSERT_EQ_INT(nh_store_session_put(s, "Ep", "s1", &st), NH_OK);
  nh_session_state_clear(&st);
  ASSERT_EQ_INT(q1i(db, "SELECT count(*) FROM sessions"), 1);

  ASSERT_EQ_INT(nh_store_session_get(s, "Ep", "s1", &st), NH_OK);
  ASSERT_EQ_INT(st.exists, 1);
  free(st.blocked_by);
  st.blocked_by = NULL;   /* free, nothing parked, no retry */
  ASSERT_EQ_INT(nh_store_session_put(s, "Ep", "s1", &st), NH_OK);
  nh_session_state_clear(&st);
  ASSERT_EQ_INT(q1i(db, "SELECT count(*) FROM sessions"), 0);
  ASSERT_EQ_INT(nh_store_session_get(s, "Ep", "s1", &st), NH_OK);
  ASSERT_EQ_INT(st.exists, 0);
  ASSERT_EQ_INT(st.next_park_seq, 1);

  /* putting a free state for a session that never had a row writes nothing */
  ASSERT_EQ_INT(nh_store_session_put(s, "Ep", "s2", &st), NH_OK);
  ASSERT_EQ_INT(q1i(db, "SELECT count(*) FROM sessions"), 0);
  nh_store_close(s);
}

typedef struct {
  int n;
  char ids[16][64];
} sess_t;

static int collect_session(void *data, const char *endpoint, const char *session, const nh_session_state_t *st)
{
  sess_t *c = data;
  if (!st->exists) FAIL("session callback with exists = 0");
  if (c->n < 16) snprintf(c->ids[c->n], sizeof c->ids[0], "%s", session);
  c->n++;
  return 0;
}

static int has_id(const sess_t *c, const char *id)
{
  for (int i = 0; i < c->n && i < 16; i++)
    if (strcmp(c->ids[i], id) == 0) return 1;
  return 0;
}

static void put_session(nh_store_t *s, const char *ep, const char *session, const char *blocked, int draining,
                        int64_t retry_due)
{
  nh_session_state_t st = {0};
  st.exists = 1;
  st.blocked_by = (char *)blocked;
  st.draining = draining;
  st.retry_due = retry_due;
  st.next_park_seq = 1;
  if (nh_store_session_put(s, ep, session, &st)) FAIL("session put %s", session);
}

TEST(sessions_due_retry_and_draining)
{
  nh_store_t *s = open_store("nimbus.db");
  int64_t now = 1000000;
  put_session(s, "Ep", "retry-due", "e1", 0, now - 1);
  put_session(s, "Ep", "retry-exactly-now", "e2", 0, now);
  put_session(s, "Ep", "retry-later", "e3", 0, now + 5000);
  put_session(s, "Ep", "blocked-no-retry", "e4", 0, 0);
  put_session(s, "Ep", "draining", NULL, 1, 0);
  put_session(s, "Ep", "blocked-and-draining", "e5", 1, 0);   /* blocked wins: no replay */
  put_session(s, "Other", "other-due", "e6", 0, now - 1);

  sess_t c = {0};
  ASSERT_EQ_INT(nh_store_sessions_due(s, "Ep", now, 100, NULL, collect_session, &c), 3);
  ASSERT_EQ_INT(c.n, 3);
  ASSERT_TRUE(has_id(&c, "retry-due"));
  ASSERT_TRUE(has_id(&c, "retry-exactly-now"));
  ASSERT_TRUE(has_id(&c, "draining"));

  /* the later retry becomes due with time */
  memset(&c, 0, sizeof c);
  ASSERT_EQ_INT(nh_store_sessions_due(s, "Ep", now + 5000, 100, NULL, collect_session, &c), 4);
  ASSERT_TRUE(has_id(&c, "retry-later"));
  ASSERT_FALSE(has_id(&c, "blocked-no-retry"));
  ASSERT_FALSE(has_id(&c, "blocked-and-draining"));

  /* limit */
  memset(&c, 0, sizeof c);
  ASSERT_EQ_INT(nh_store_sessions_due(s, "Ep", now, 2, NULL, collect_session, &c), 2);
  nh_store_close(s);
}

TEST(sessions_due_callback_may_write)
{
  /* The dispatcher writes session state from inside the callback. */
  nh_store_t *s = open_store("nimbus.db");
  for (int i = 0; i < 40; i++) {
    char id[16];
    snprintf(id, sizeof id, "s%02d", i);
    put_session(s, "Ep", id, NULL, 1, 0);
  }
  ASSERT_EQ_INT(nh_store_begin(s), NH_OK);
  sess_t c = {0};
  int n = nh_store_sessions_due(s, "Ep", 1, 1000, NULL, collect_session, &c);
  ASSERT_EQ_INT(n, 40);
  ASSERT_EQ_INT(nh_store_commit(s), NH_OK);
  nh_store_close(s);
}

typedef struct {
  int n;
  char keys[16][128];
  int blocked[16];
} slist_t;

static int collect_list(void *data, const char *endpoint, const char *session, const nh_session_state_t *st)
{
  slist_t *c = data;
  if (c->n < 16) {
    snprintf(c->keys[c->n], sizeof c->keys[0], "%s\t%s", endpoint, session);
    c->blocked[c->n] = st->blocked_by != NULL;
  }
  c->n++;
  return 0;
}

TEST(sessions_list_filters)
{
  nh_store_t *s = open_store("nimbus.db");
  put_session(s, "EpB", "s1", "e1", 0, 0);
  put_session(s, "EpA", "s2", NULL, 1, 0);
  put_session(s, "EpA", "s1", "e2", 0, 10);
  slist_t c = {0};
  ASSERT_EQ_INT(nh_store_sessions_list(s, NULL, 0, collect_list, &c), 3);
  ASSERT_EQ_STR(c.keys[0], "EpA\ts1");
  ASSERT_EQ_STR(c.keys[1], "EpA\ts2");
  ASSERT_EQ_STR(c.keys[2], "EpB\ts1");
  memset(&c, 0, sizeof c);
  ASSERT_EQ_INT(nh_store_sessions_list(s, "EpA", 1, collect_list, &c), 1);
  ASSERT_EQ_STR(c.keys[0], "EpA\ts1");
  ASSERT_EQ_INT(c.blocked[0], 1);
  nh_store_close(s);
}

/* ---------------------------------------------------------------- parked */

TEST(parked_fifo_head_delete_count)
{
  nh_store_t *s = open_store("nimbus.db");
  nh_msg_t m1 = make_msg("Ep", "s1", "p1", "{\"n\":1}");
  nh_msg_t m2 = make_msg("Ep", "s1", "p2", "{\"n\":2}");
  nh_msg_t m3 = make_msg("Ep", "s1", "p3", NULL);
  nh_msg_t o1 = make_msg("Ep", "s2", "q1", "{}");
  m2.type = NH_MT_RESUBMIT;
  m2.error_text = "err text";
  m2.error_type = "ErrType";
  m2.parent_message_id = "parent";
  m2.originating_message_id = "orig";
  m2.traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";   /* replayed in its trace */
  m2.tracestate = "vendor=abc";
  /* park out of seq order: the FIFO is by park_seq, not insertion */
  ASSERT_EQ_INT(nh_store_park(s, &m2, 2), NH_OK);
  ASSERT_EQ_INT(nh_store_park(s, &m1, 1), NH_OK);
  ASSERT_EQ_INT(nh_store_park(s, &m3, 3), NH_OK);
  ASSERT_EQ_INT(nh_store_park(s, &o1, 1), NH_OK);
  ASSERT_EQ_INT(nh_store_parked_count(s, "Ep", "s1"), 3);
  ASSERT_EQ_INT(nh_store_parked_count(s, "Ep", "s2"), 1);
  ASSERT_EQ_INT(nh_store_parked_count(s, "Other", "s1"), 0);

  nh_msg_t h;
  int64_t seq = 0;
  ASSERT_EQ_INT(nh_store_parked_head(s, "Ep", "s1", &h, &seq), 1);
  ASSERT_EQ_INT(seq, 1);
  ASSERT_EQ_STR(h.endpoint, "Ep");
  ASSERT_EQ_STR(h.session_id, "s1");
  ASSERT_EQ_STR(h.event_id, "p1");
  ASSERT_EQ_STR(h.message_id, "p1");
  ASSERT_EQ_STR(h.event_type, "Thing");
  ASSERT_EQ_INT(h.type, NH_MT_EVENT);
  ASSERT_EQ_STR(h.correlation_id, "corr");
  ASSERT_EQ_STR(h.from, "Src");
  ASSERT_EQ_INT(h.retry_count, 2);
  ASSERT_EQ_INT(h.enqueued_at, 1234);
  ASSERT_EQ_STR(h.body, "{\"n\":1}");
  ASSERT_EQ_INT(h.body_len, 7);
  ASSERT_EQ_INT(h.seq, 0);   /* not a queue message */
  ASSERT_NULL(h.traceparent);
  nh_msg_clear(&h);

  ASSERT_EQ_INT(nh_store_parked_delete(s, "Ep", "s1", 1), NH_OK);
  ASSERT_EQ_INT(nh_store_parked_head(s, "Ep", "s1", &h, &seq), 1);
  ASSERT_EQ_INT(seq, 2);
  ASSERT_EQ_STR(h.event_id, "p2");
  ASSERT_EQ_INT(h.type, NH_MT_RESUBMIT);
  ASSERT_EQ_STR(h.error_text, "err text");
  ASSERT_EQ_STR(h.error_type, "ErrType");
  ASSERT_EQ_STR(h.parent_message_id, "parent");
  ASSERT_EQ_STR(h.originating_message_id, "orig");
  ASSERT_EQ_STR(h.traceparent, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
  ASSERT_EQ_STR(h.tracestate, "vendor=abc");
  nh_msg_clear(&h);
  ASSERT_EQ_INT(nh_store_parked_count(s, "Ep", "s1"), 2);

  /* delete by event id, wherever it is in the queue */
  ASSERT_EQ_INT(nh_store_parked_delete_event(s, "Ep", "p3"), 1);
  ASSERT_EQ_INT(nh_store_parked_delete_event(s, "Ep", "p3"), 0);
  ASSERT_EQ_INT(nh_store_parked_delete_event(s, "Other", "p2"), 0);
  ASSERT_EQ_INT(nh_store_parked_count(s, "Ep", "s1"), 1);

  ASSERT_EQ_INT(nh_store_parked_delete(s, "Ep", "s1", 2), NH_OK);
  ASSERT_EQ_INT(nh_store_parked_head(s, "Ep", "s1", &h, &seq), 0);
  ASSERT_EQ_INT(nh_store_parked_count(s, "Ep", "s1"), 0);
  ASSERT_EQ_INT(nh_store_parked_count(s, "Ep", "s2"), 1);   /* other sessions untouched */
  nh_store_close(s);
}

/* What the unit of work's cache reads (store/nh_uow_pg.c): a session's parked rows in
 * windows after a park_seq, an event's parked rows counted, an operator request read
 * without being taken. */
TEST(parked_windows_event_counts_and_requests_read_in_place)
{
  nh_store_t *s = open_store("nimbus.db");
  const char *events[5] = { "p1", "p2", "p2", "p3", "p4" };   /* p2 parked twice */
  for (int i = 0; i < 5; i++) {
    nh_msg_t m = make_msg("Ep", "s1", events[i], "{}");
    ASSERT_EQ_INT(nh_store_park(s, &m, (i + 1) * 10), NH_OK);
  }
  nh_msg_t other = make_msg("Ep", "s2", "p2", "{}");
  ASSERT_EQ_INT(nh_store_park(s, &other, 1), NH_OK);

  nh_msg_t rows[3];
  int64_t seqs[3];
  ASSERT_EQ_INT(nh_store_parked_window(s, "Ep", "s1", 0, 3, rows, seqs), 3);
  ASSERT_EQ_INT(seqs[0], 10);
  ASSERT_EQ_INT(seqs[2], 30);
  ASSERT_EQ_STR(rows[1].event_id, "p2");
  ASSERT_EQ_STR(rows[1].session_id, "s1");
  for (int i = 0; i < 3; i++) nh_msg_clear(&rows[i]);
  ASSERT_EQ_INT(nh_store_parked_window(s, "Ep", "s1", 30, 3, rows, seqs), 2);   /* after 30: 40, 50 */
  ASSERT_EQ_INT(seqs[0], 40);
  ASSERT_EQ_STR(rows[1].event_id, "p4");
  for (int i = 0; i < 2; i++) nh_msg_clear(&rows[i]);
  ASSERT_EQ_INT(nh_store_parked_window(s, "Ep", "s1", 50, 3, rows, seqs), 0);

  ASSERT_EQ_INT(nh_store_parked_count_event(s, "Ep", "p2"), 3);   /* both sessions */
  ASSERT_EQ_INT(nh_store_parked_count_event(s, "Ep", "p9"), 0);
  ASSERT_EQ_INT(nh_store_parked_count_event(s, "Other", "p2"), 0);

  ASSERT_EQ_INT(nh_store_oppending_add(s, "req-1", "Ep", "p1", "skip", NH_ST_FAILED), NH_OK);
  char *expected = NULL;
  ASSERT_EQ_INT(nh_store_oppending_get(s, "req-1", &expected), 1);
  ASSERT_EQ_STR(expected, NH_ST_FAILED);
  free(expected);
  ASSERT_EQ_INT(nh_store_oppending_get(s, "req-1", &expected), 1);   /* still there */
  free(expected);
  ASSERT_EQ_INT(nh_store_oppending_take(s, "req-1", &expected), 1);
  free(expected);
  ASSERT_EQ_INT(nh_store_oppending_get(s, "req-1", &expected), 0);
  ASSERT_NULL(expected);
  nh_store_close(s);
}

/* A body is bytes: one with a NUL in it comes back whole from the parked FIFO and from
 * the audit row (its payload_len), with a trailing NUL. */
TEST(body_with_a_nul_byte_comes_back_whole_from_parked_and_audit)
{
  static const char body[] = "{\"n\":1}\0after the NUL";
  const size_t len = sizeof body - 1;
  nh_store_t *s = open_store("nimbus.db");
  nh_msg_t m = make_msg("Ep", "s1", "p1", NULL);
  m.body = (char *)body;
  m.body_len = len;
  ASSERT_EQ_INT(nh_store_park(s, &m, 1), NH_OK);
  nh_msg_t h;
  int64_t seq = 0;
  ASSERT_EQ_INT(nh_store_parked_head(s, "Ep", "s1", &h, &seq), 1);
  ASSERT_EQ_INT(h.body_len, len);
  ASSERT_TRUE(memcmp(h.body, body, sizeof body) == 0);   /* and the trailing NUL */
  nh_msg_clear(&h);

  nh_audit_t a = {0};
  a.endpoint = "Ep";
  a.event_id = "e1";
  a.session_id = "s1";
  a.status = NH_ST_PENDING;
  a.payload = (char *)body;
  a.payload_len = len;
  ASSERT_EQ_INT(nh_store_audit_put(s, &a), NH_OK);
  nh_audit_t b = {0};
  ASSERT_EQ_INT(nh_store_audit_get(s, "Ep", "e1", &b), 1);
  ASSERT_EQ_INT(b.payload_len, len);
  ASSERT_EQ_INT(nh_audit_payload_len(&b), len);
  ASSERT_TRUE(memcmp(b.payload, body, sizeof body) == 0);
  nh_audit_clear(&b);
  /* a payload set as a C string (payload_len 0) is stored up to its NUL */
  put_audit(s, "Ep", "e2", "s1", NH_ST_PENDING, 1000);
  ASSERT_EQ_INT(nh_store_audit_get(s, "Ep", "e2", &b), 1);
  ASSERT_EQ_INT(b.payload_len, 7);
  ASSERT_EQ_STR(b.payload, "{\"n\":1}");
  nh_audit_clear(&b);
  nh_store_close(s);
}

TEST(parked_same_seq_twice_is_an_error)
{
  nh_store_t *s = open_store("nimbus.db");
  nh_msg_t m1 = make_msg("Ep", "s1", "p1", "{}");
  nh_msg_t m2 = make_msg("Ep", "s1", "p2", "{}");
  ASSERT_EQ_INT(nh_store_park(s, &m1, 1), NH_OK);
  nh_log_set_level(NH_LOG_ERROR + 1);   /* the expected failure is logged */
  int rc = nh_store_park(s, &m2, 1);
  nh_log_set_level(NH_LOG_INFO);
  ASSERT_NE_INT(rc, NH_OK);
  ASSERT_EQ_INT(nh_store_parked_count(s, "Ep", "s1"), 1);
  nh_store_close(s);
}

/* ---------------------------------------------------------------- inbox / processed / oplog */

TEST(inbox_add_has)
{
  nh_store_t *s = open_store("nimbus.db");
  ASSERT_EQ_INT(nh_store_inbox_has(s, "Ep", "m1"), 0);
  ASSERT_EQ_INT(nh_store_inbox_add(s, "Ep", "m1"), NH_OK);
  ASSERT_EQ_INT(nh_store_inbox_add(s, "Ep", "m1"), NH_OK);   /* idempotent */
  ASSERT_EQ_INT(nh_store_inbox_has(s, "Ep", "m1"), 1);
  ASSERT_EQ_INT(nh_store_inbox_has(s, "Other", "m1"), 0);
  ASSERT_EQ_INT(nh_store_inbox_has(s, "Ep", "m2"), 0);
  ASSERT_EQ_INT(q1i(nh_store_db(s), "SELECT count(*) FROM inbox"), 1);
  nh_store_close(s);
}

TEST(processed_has_reads_the_outcome_history)
{
  nh_store_t *s = open_store("nimbus.db");
  ASSERT_EQ_INT(nh_store_processed_has(s, "Ep", "m1", "e1"), 0);
  /* an operator's request (its own MessageId) and a cancelled run are not outcomes */
  ASSERT_EQ_INT(nh_store_history_add(s, "Ep", "e1", "m1", "SkipRequest", "Requested", "asked"), NH_OK);
  ASSERT_EQ_INT(nh_store_history_add(s, "Ep", "e1", "m1", "EventRequest", "Cancelled", "lock lost"), NH_OK);
  ASSERT_EQ_INT(nh_store_processed_has(s, "Ep", "m1", "e1"), 0);
  ASSERT_EQ_INT(nh_store_history_add(s, "Ep", "e1", "m1", "EventRequest", NH_ST_COMPLETED, "done"), NH_OK);
  ASSERT_EQ_INT(nh_store_processed_has(s, "Ep", "m1", "e1"), 1);
  ASSERT_EQ_INT(nh_store_processed_has(s, "Ep", "m1", "e2"), 0);
  ASSERT_EQ_INT(nh_store_processed_has(s, "Ep", "m2", "e1"), 0);
  ASSERT_EQ_INT(nh_store_processed_has(s, "Other", "m1", "e1"), 0);
  /* a parked message was handled too (settled, waiting in the store) */
  ASSERT_EQ_INT(nh_store_history_add(s, "Ep", "e2", "m2", "EventRequest", NH_ST_DEFERRED, "parked"), NH_OK);
  ASSERT_EQ_INT(nh_store_processed_has(s, "Ep", "m2", "e2"), 1);
  nh_store_close(s);
}

TEST(oplog_add)
{
  nh_store_t *s = open_store("nimbus.db");
  ASSERT_EQ_INT(nh_store_oplog_add(s, NULL, "skip", "Ep", "e1", "s1", "skip"), NH_OK);
  ASSERT_EQ_INT(nh_store_oplog_add(s, NULL, "resubmit", "Ep", "e2", "s2", NULL), NH_OK);
  sqlite3 *db = nh_store_db(s);
  ASSERT_EQ_INT(q1i(db, "SELECT count(*) FROM operator_log"), 2);
  ASSERT_EQ_STR(q1(db, "SELECT action || '|' || endpoint || '|' || event_id || '|' || session_id || '|' || detail"
                       " FROM operator_log ORDER BY id LIMIT 1"),
                "skip|Ep|e1|s1|skip");
  ASSERT_EQ_STR(q1(db, "SELECT action FROM operator_log ORDER BY id DESC LIMIT 1"), "resubmit");
  ASSERT_CMP_INT(q1i(db, "SELECT min(at) FROM operator_log"), >, 0);
  ASSERT_NE_STR(q1(db, "SELECT actor FROM operator_log LIMIT 1"), "");
  nh_store_close(s);
}

TEST(operator_pending_one_request_per_event)
{
  nh_store_t *s = open_store("nimbus.db");
  ASSERT_EQ_INT(nh_store_oppending_has(s, "Ep", "e1"), 0);
  ASSERT_EQ_INT(nh_store_oppending_add(s, "ctl-1", "Ep", "e1", "skip", NH_ST_FAILED), NH_OK);
  ASSERT_EQ_INT(nh_store_oppending_has(s, "Ep", "e1"), 1);
  ASSERT_EQ_INT(nh_store_oppending_has(s, "Other", "e1"), 0);
  ASSERT_EQ_INT(nh_store_oppending_has(s, "Ep", "e2"), 0);
  char *expected = NULL;
  ASSERT_EQ_INT(nh_store_oppending_take(s, "ctl-1", &expected), 1);   /* applied by the host */
  ASSERT_EQ_STR(expected, NH_ST_FAILED);
  free(expected);
  ASSERT_EQ_INT(nh_store_oppending_has(s, "Ep", "e1"), 0);
  ASSERT_EQ_INT(nh_store_oppending_take(s, "unknown", &expected), 0);
  ASSERT_TRUE(expected == NULL);
  nh_store_close(s);
}

/* ---------------------------------------------------------------- transactions */

TEST(transaction_rollback_discards_everything)
{
  nh_store_t *s = open_store("nimbus.db");
  ASSERT_EQ_INT(nh_store_begin(s), NH_OK);
  put_audit(s, "Ep", "e1", "s1", NH_ST_COMPLETED, 1000);
  put_session(s, "Ep", "s1", "e1", 0, 0);
  nh_msg_t m = make_msg("Ep", "s1", "p1", "{}");
  ASSERT_EQ_INT(nh_store_park(s, &m, 1), NH_OK);
  ASSERT_EQ_INT(nh_store_inbox_add(s, "Ep", "m1"), NH_OK);
  ASSERT_EQ_INT(nh_store_history_add(s, "Ep", "e1", "m1", "EventRequest", "Completed", NULL), NH_OK);
  /* visible inside the transaction */
  nh_audit_t a = {0};
  ASSERT_EQ_INT(nh_store_audit_get(s, "Ep", "e1", &a), 1);
  nh_audit_clear(&a);
  nh_store_rollback(s);

  ASSERT_EQ_INT(nh_store_audit_get(s, "Ep", "e1", &a), 0);
  nh_session_state_t st;
  nh_store_session_get(s, "Ep", "s1", &st);
  ASSERT_EQ_INT(st.exists, 0);
  ASSERT_EQ_INT(nh_store_parked_count(s, "Ep", "s1"), 0);
  ASSERT_EQ_INT(nh_store_inbox_has(s, "Ep", "m1"), 0);
  ASSERT_EQ_INT(q1i(nh_store_db(s), "SELECT count(*) FROM history"), 0);

  /* and the store is usable afterwards; a committed transaction persists across reopen */
  ASSERT_EQ_INT(nh_store_begin(s), NH_OK);
  put_audit(s, "Ep", "e2", "s1", NH_ST_COMPLETED, 1000);
  ASSERT_EQ_INT(nh_store_commit(s), NH_OK);
  nh_store_close(s);
  s = open_store("nimbus.db");
  ASSERT_EQ_INT(nh_store_audit_get(s, "Ep", "e2", &a), 1);
  nh_audit_clear(&a);
  ASSERT_EQ_INT(nh_store_audit_get(s, "Ep", "e1", &a), 0);
  nh_store_close(s);
}

TEST(uncommitted_writes_are_invisible_to_another_connection)
{
  nh_store_t *s1 = open_store("nimbus.db");
  nh_store_t *s2 = open_store("nimbus.db");
  ASSERT_EQ_INT(nh_store_begin(s1), NH_OK);
  put_audit(s1, "Ep", "e1", "s1", NH_ST_COMPLETED, 1000);
  nh_audit_t a = {0};
  ASSERT_EQ_INT(nh_store_audit_get(s2, "Ep", "e1", &a), 0);   /* WAL: readers are not blocked */
  ASSERT_EQ_INT(nh_store_commit(s1), NH_OK);
  ASSERT_EQ_INT(nh_store_audit_get(s2, "Ep", "e1", &a), 1);
  nh_audit_clear(&a);
  nh_store_close(s1);
  nh_store_close(s2);
}

TEST(close_with_open_transaction_rolls_back)
{
  nh_store_t *s = open_store("nimbus.db");
  ASSERT_EQ_INT(nh_store_begin(s), NH_OK);
  put_audit(s, "Ep", "e1", "s1", NH_ST_COMPLETED, 1000);
  nh_store_close(s);
  s = open_store("nimbus.db");
  nh_audit_t a = {0};
  ASSERT_EQ_INT(nh_store_audit_get(s, "Ep", "e1", &a), 0);
  nh_store_close(s);
}

/* A store of schema 1 (before failure groups): its Failed rows get their group when it is
 * opened by this version, once. */
TEST(migration_to_schema_2_backfills_failure_groups)
{
  const char *path = nh_test_path("v1.db");
  sqlite3 *db;
  ASSERT_EQ_INT(sqlite3_open(path, &db), SQLITE_OK);
  ASSERT_EQ_INT(sqlite3_exec(db, "PRAGMA application_id = 1313370996;"
                                 "CREATE TABLE nh_schema (component TEXT PRIMARY KEY, version INTEGER NOT NULL);"
                                 "INSERT INTO nh_schema VALUES ('store', 1);", NULL, NULL, NULL), SQLITE_OK);
  ASSERT_EQ_INT(sqlite3_exec(db, nh_store_migrations[0], NULL, NULL, NULL), SQLITE_OK);
  ASSERT_EQ_INT(sqlite3_exec(db, "INSERT INTO audit(endpoint, event_id, session_id, status, error_text, error_type,"
                                 " created_at, updated_at) VALUES ('Ep', 'e1', 's1', 'Failed', 'order 17 failed', 'E', 1, 1),"
                                 " ('Ep', 'e2', 's2', 'Failed', 'order 942 failed', 'E', 1, 1),"
                                 " ('Ep', 'e3', 's3', 'Completed', NULL, NULL, 1, 1)", NULL, NULL, NULL), SQLITE_OK);
  sqlite3_close(db);
  nh_store_t *s = open_store("v1.db");
  sqlite3 *sdb = nh_store_db(s);
  char want[13];
  nh_failgroup_id("Ep", "E", "order 1 failed", want);
  ASSERT_EQ_STR(q1(sdb, "SELECT fail_group FROM audit WHERE event_id = 'e1'"), want);
  ASSERT_EQ_STR(q1(sdb, "SELECT fail_group FROM audit WHERE event_id = 'e2'"), want);
  ASSERT_EQ_STR(q1(sdb, "SELECT coalesce(fail_group, 'none') FROM audit WHERE event_id = 'e3'"), "none");
  ASSERT_EQ_INT(q1i(sdb, "SELECT version FROM nh_schema WHERE component = 'store'"), 4);
  nh_store_close(s);
}

/* A host checkpoints through a connection of its own on a worker thread
 * (nh_store_checkpoint_file). On a store it has just created, that connection once saw
 * "not in WAL mode" (-1 pages) and copied nothing, so the WAL grew without end. */
TEST(checkpoint_file_copies_the_wal_of_a_new_store)
{
  nh_store_t *s = open_store("fresh.db");
  sqlite3_wal_hook(nh_store_db(s), NULL, NULL);   /* no automatic checkpoint here */
  ASSERT_EQ_INT(nh_store_begin(s), NH_OK);
  for (int i = 0; i < 200; i++) {
    char eid[32];
    snprintf(eid, sizeof eid, "ev-%d", i);
    put_audit(s, "Ep", eid, "s1", NH_ST_COMPLETED, 1000 + i);
  }
  ASSERT_EQ_INT(nh_store_commit(s), NH_OK);
  int wal = -2, copied = -2;
  nh_error_t err = {0};
  ASSERT_EQ_INT(nh_store_checkpoint_file(nh_test_path("fresh.db"), NULL, &wal, &copied, &err), NH_OK);
  ASSERT_CMP_INT(wal, >, 0);
  ASSERT_EQ_INT(copied, wal);
  /* what was copied is in the database file: a reader of the file alone sees it */
  nh_store_close(s);
  sqlite3 *db = NULL;
  ASSERT_EQ_INT(sqlite3_open_v2(nh_test_path("fresh.db"), &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
  ASSERT_EQ_STR(q1(db, "SELECT count(*) FROM audit"), "200");
  sqlite3_close(db);
}

/* A host commits without pause while the checkpointer's worker copies: the WAL must still
 * start over (before, it never did and grew by every page committed: 1.5 GB over 300,000
 * events). Commits back to back, the loop turning between them as a host's does. The
 * bound is twice what one cycle can hold (4,000 pages, then as much again written while
 * the worker copies); the commits here write about 30,000 pages. */
TEST(wal_starts_over_while_the_host_commits_without_pause)
{
  nh_store_t *s = open_store("steady.db");
  nh_runtime_t rt;
  ASSERT_EQ_INT(nh_runtime_init(&rt), 0);
  nh_checkpointer_t *c = nh_checkpointer_start(&rt.loop, s);
  char wal[PATH_MAX];
  snprintf(wal, sizeof wal, "%s-wal", nh_test_path("steady.db"));
  off_t largest = 0;
  int n = 0;
  for (int round = 0; round < 3000; round++) {
    ASSERT_EQ_INT(nh_store_begin(s), NH_OK);
    for (int i = 0; i < 10; i++, n++) {
      char eid[32];
      snprintf(eid, sizeof eid, "ev-%d", n);
      put_audit(s, "Ep", eid, eid, NH_ST_COMPLETED, 1000 + n);
    }
    ASSERT_EQ_INT(nh_store_commit(s), NH_OK);
    uv_run(&rt.loop, UV_RUN_NOWAIT);
    struct stat sb;
    if (stat(wal, &sb) == 0 && sb.st_size > largest) largest = sb.st_size;
  }
  nh_checkpointer_close(c);
  ASSERT_EQ_INT(nh_runtime_close(&rt), 0);
  ASSERT_EQ_INT(q1i(nh_store_db(s), "SELECT count(*) FROM audit"), n);
  ASSERT_CMP_INT((long long)largest, <, 2LL * 8000 * 4120);
  nh_store_close(s);
}

NH_TEST_MAIN()
