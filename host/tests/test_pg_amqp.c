/* The AMQP transport's tables and statements on PostgreSQL (store/nh_pg_amqp.c) against a
 * real server:
 * - its migration, apart from the store's and the queue's (own version table, own
 *   advisory lock), by the store's migrator: hosts migrating together end at one version,
 *   a newer AMQP schema is refused naming both versions;
 * - parity: the same sequences run through nh_amqp.c's own sqlite migrations and
 *   statements (nh_amqp_sql_migrations, nh_amqp_sql) on a sqlite file and through the
 *   PostgreSQL operations, every result and then the whole table compared row by row: an
 *   outbox across two owners (add, next after a seq, left, owners, a claim by a third
 *   owner, drop, one, delete) and delivery counts (bumped three times, deleted);
 * - an encoded message holding NULs and bytes that are not UTF-8 comes back identical;
 * - the one executor: AMQP and store operations in one batch commit together or not at all.
 *
 * NH_PG_URL names the test cluster (the ctest fixture "postgres") and NH_PG_ADMIN_URL a
 * superuser, through which each test makes its own database (nh_pgtest.h). Without
 * either the suite reports itself skipped (77), except under CI=true. */
#include "nh_test.h"
#include "nh_pgtest.h"

#include "core/nh_sqlite.h"
#include "core/nh_util.h"
#include "store/nh_pg.h"
#include "store/nh_pg_amqp.h"
#include "store/nh_pg_queue.h"
#include "transport/nh_amqp_priv.h"

#include <stdarg.h>

/* The operations are a_sql's, index for index: the tests below pair them by that. */
/* OUT_ADOPT, the last, has no twin: on sqlite every process runs on one machine. */
_Static_assert((int)NH_PGA_COUNT == (int)A_COUNT + 5,
               "one PostgreSQL operation per statement of nh_amqp.c, and OUT_ADOPT and four set twins");
_Static_assert(NH_PGA_OUT_ADD == (int)A_OUT_ADD && NH_PGA_OUT_NEXT == (int)A_OUT_NEXT &&
               NH_PGA_OUT_DEL == (int)A_OUT_DEL && NH_PGA_DLV_BUMP == (int)A_DLV_BUMP &&
               NH_PGA_DLV_DEL == (int)A_DLV_DEL && NH_PGA_OUT_LEFT == (int)A_OUT_LEFT &&
               NH_PGA_OUT_OWNERS == (int)A_OUT_OWNERS && NH_PGA_OUT_CLAIM == (int)A_OUT_CLAIM &&
               NH_PGA_OUT_DROP == (int)A_OUT_DROP && NH_PGA_OUT_ONE == (int)A_OUT_ONE,
               "nh_pgaop_t follows nh_amqp_priv.h's A_* order");

#define OWNER_A "host-a-1111"
#define OWNER_B "host-b-2222"
#define OWNER_C "host-c-3333"
#define ADDR_EV "/exchanges/nimbus"
#define ADDR_RE "/amq/queue/_reply.host-a"
#define DUMP_MAX 16384

/* ---------------------------------------------------------------- PostgreSQL */

/* A connection to url with the AMQP tables migrated and the executor on it. */
static nh_pg_db_t *amqp_conn(const char *url) { return nh_pgtest_db(url, nh_pg_amqp_migrate, "amqp"); }

static PGresult *pg_run(nh_pg_db_t *q, nh_pgaop_t op, nh_pg_args_t *a)
{
  nh_error_t err = { 0 };
  PGresult *r = NULL;
  if (nh_pga_run(q, op, a, &r, &err)) FAIL("%s: %s", nh_pgaop_name(op), err.msg);
  return r;
}

/* ---------------------------------------------------------------- rows as text
 *
 * Both dialects' rows in one form, "col|col|...\n" a row: integers in decimal, blobs and
 * bytea as x<hex> (put_hex), NULL as NULL, text as it is. Rows compare equal when every value is. */

typedef struct dump {
  char s[DUMP_MAX];
  size_t n;
  int rows;
} dump_t;

static void put(dump_t *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(dump_t *d, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  int w = vsnprintf(d->s + d->n, sizeof d->s - d->n, fmt, ap);
  va_end(ap);
  if (w < 0 || (size_t)w >= sizeof d->s - d->n) FAIL("a dump longer than %d bytes", DUMP_MAX);
  d->n += (size_t)w;
}

/* Short values in full; a long one (a message of 256 KiB) as its length and a 64-bit
 * FNV-1a of every byte, computed alike on both sides. */
static void put_hex(dump_t *d, const unsigned char *p, size_t len)
{
  if (len > 64) {
    uint64_t h = 14695981039346656037ULL;
    for (size_t i = 0; i < len; i++) h = (h ^ p[i]) * 1099511628211ULL;
    put(d, "x[%zu bytes, fnv %016llx]", len, (unsigned long long)h);
    return;
  }
  put(d, "x");
  for (size_t i = 0; i < len; i++) put(d, "%02x", p[i]);
}

static void lite_row(dump_t *d, sqlite3_stmt *st)
{
  for (int c = 0; c < sqlite3_column_count(st); c++) {
    if (c) put(d, "|");
    switch (sqlite3_column_type(st, c)) {
    case SQLITE_INTEGER: put(d, "%lld", (long long)sqlite3_column_int64(st, c)); break;
    case SQLITE_BLOB: put_hex(d, sqlite3_column_blob(st, c), (size_t)sqlite3_column_bytes(st, c)); break;
    case SQLITE_NULL: put(d, "NULL"); break;
    default: put(d, "%s", (const char *)sqlite3_column_text(st, c));
    }
  }
  put(d, "\n");
  d->rows++;
}

#define OID_BYTEA 17
#define OID_INT8 20
#define OID_INT4 23

/* A binary-format result (the executor's, or pg_dump_sql's). */
static void pg_rows(dump_t *d, const PGresult *r)
{
  for (int i = 0; i < PQntuples(r); i++) {
    for (int c = 0; c < PQnfields(r); c++) {
      if (c) put(d, "|");
      Oid t = PQftype(r, c);
      if (PQgetisnull(r, i, c)) put(d, "NULL");
      else if (t == OID_INT8 || t == OID_INT4) put(d, "%lld", (long long)nh_pg_col_i64(r, i, c));
      else if (t == OID_BYTEA) put_hex(d, (const unsigned char *)PQgetvalue(r, i, c), (size_t)PQgetlength(r, i, c));
      else put(d, "%s", PQgetvalue(r, i, c));
    }
    put(d, "\n");
    d->rows++;
  }
}

/* The lines of d in byte order (for a statement that asks for no order). */
static int cmp_line(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void sort_lines(dump_t *d)
{
  char copy[DUMP_MAX], *lines[512];
  int n = 0;
  memcpy(copy, d->s, d->n + 1);
  for (char *save = NULL, *l = strtok_r(copy, "\n", &save); l && n < 512; l = strtok_r(NULL, "\n", &save))
    lines[n++] = l;
  qsort(lines, (size_t)n, sizeof *lines, cmp_line);
  d->n = 0;
  d->s[0] = '\0';
  for (int i = 0; i < n; i++) put(d, "%s\n", lines[i]);
}

/* ---------------------------------------------------------------- both */

typedef struct pair {
  sqlite3 *lite;
  sqlite3_stmt *q[A_COUNT];     /* nh_amqp.c's statements, prepared from its own text */
  nh_pg_db_t *pg;
} pair_t;

static void close_pair(void *p)
{
  pair_t *b = p;
  for (int i = 0; i < A_COUNT; i++) sqlite3_finalize(b->q[i]);
  sqlite3_close(b->lite);
  free(b);
}

/* A sqlite file migrated by nh_amqp.c's own list, its statements prepared, and a scratch
 * PostgreSQL database migrated by nh_pg_amqp_migrate. */
static pair_t *pair_open(void)
{
  pair_t *b = calloc(1, sizeof *b);
  nh_test_on_cleanup(close_pair, b);
  if (sqlite3_open(nh_test_path("amqp.db"), &b->lite) != SQLITE_OK) FAIL("sqlite open");
  int n = 0;
  const char *const *steps = nh_amqp_sql_migrations(&n);
  nh_error_t err = { 0 };
  if (nh_sqlite_migrate(b->lite, "amqp", steps, n, &err)) FAIL("sqlite amqp migrate: %s", err.msg);
  for (int i = 0; i < A_COUNT; i++)
    if (sqlite3_prepare_v2(b->lite, nh_amqp_sql(i), -1, &b->q[i], NULL) != SQLITE_OK)
      FAIL("sqlite %s: %s", nh_amqp_sql(i), sqlite3_errmsg(b->lite));
  b->pg = amqp_conn(nh_pgtest_scratch_url());
  return b;
}

/* nh_amqp.c's statement of op, reset and unbound, for the caller to bind as nh_amqp.c does. */
static sqlite3_stmt *lq(pair_t *b, nh_pgaop_t op)
{
  sqlite3_stmt *st = b->q[op];
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  return st;
}

/* What a statement did on each side: its rows and, for a write, the rows it changed. */
typedef struct outcome {
  dump_t lite, pg;
  int lite_changes, pg_changes;
} outcome_t;

#define UNORDERED 1

/* Runs the sqlite statement of op (bound by the caller) and op with args a; both must
 * return the same rows and change as many. Returns the outcome (static: until the next). */
static const outcome_t *both(pair_t *b, nh_pgaop_t op, nh_pg_args_t *a, int flags)
{
  static outcome_t o;
  memset(&o, 0, sizeof o);
  sqlite3_stmt *st = b->q[op];
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) lite_row(&o.lite, st);
  if (rc != SQLITE_DONE) FAIL("sqlite %s: %s", nh_amqp_sql(op), sqlite3_errmsg(b->lite));
  o.lite_changes = sqlite3_stmt_readonly(st) ? 0 : sqlite3_changes(b->lite);
  sqlite3_reset(st);
  PGresult *r = pg_run(b->pg, op, a);
  pg_rows(&o.pg, r);
  /* a write's rows (INSERT ... RETURNING too); a SELECT's count is not a change */
  const char *cmd = PQcmdStatus(r);
  o.pg_changes = strncmp(cmd, "SELECT", 6) == 0 ? 0 : nh_pg_affected(r);
  PQclear(r);
  if (flags & UNORDERED) {
    sort_lines(&o.lite);
    sort_lines(&o.pg);
  }
  if (strcmp(o.lite.s, o.pg.s) != 0)
    FAIL("%s returned different rows:\n-- sqlite\n%s-- PostgreSQL\n%s", nh_pgaop_name(op), o.lite.s, o.pg.s);
  if (o.lite_changes != o.pg_changes)
    FAIL("%s changed %d rows on sqlite, %d on PostgreSQL", nh_pgaop_name(op), o.lite_changes, o.pg_changes);
  return &o;
}

/* The same SQL on both (valid in both dialects), compared row by row. */
static void same_table(pair_t *b, const char *what, const char *sql)
{
  dump_t l = { .n = 0 }, p = { .n = 0 };
  sqlite3_stmt *st;
  if (sqlite3_prepare_v2(b->lite, sql, -1, &st, NULL) != SQLITE_OK) FAIL("sqlite %s: %s", sql, sqlite3_errmsg(b->lite));
  while (sqlite3_step(st) == SQLITE_ROW) lite_row(&l, st);
  sqlite3_finalize(st);
  PGresult *r = PQexecParams(nh_pg_db_conn(b->pg), sql, 0, NULL, NULL, NULL, NULL, 1);
  if (PQresultStatus(r) != PGRES_TUPLES_OK) FAIL("PostgreSQL %s: %s", sql, PQresultErrorMessage(r));
  pg_rows(&p, r);
  PQclear(r);
  if (strcmp(l.s, p.s) != 0) FAIL("%s differ:\n-- sqlite\n%s-- PostgreSQL\n%s", what, l.s, p.s);
}

static const char *const outbox_dump = "SELECT seq, owner, address, message, created_at FROM amqp_outbox ORDER BY seq";
static const char *const deliveries_dump =
  "SELECT endpoint, message_id, count FROM amqp_deliveries ORDER BY endpoint, message_id";

static void same_outbox(pair_t *b) { same_table(b, "outbox rows", outbox_dump); }

/* ---------------------------------------------------------------- the statements, bound as nh_amqp.c binds them */

/* nh_amqp_outbox_add: returns the seq, sqlite's last_insert_rowid and PostgreSQL's
 * RETURNING seq, which must agree. */
static int64_t add_both(pair_t *b, const char *owner, const char *address, const void *msg, size_t len, int64_t at)
{
  sqlite3_stmt *st = lq(b, NH_PGA_OUT_ADD);
  nh_sqlite_bind_text(st, 1, address);
  sqlite3_bind_blob(st, 2, msg, (int)len, SQLITE_TRANSIENT);
  sqlite3_bind_int64(st, 3, at);
  nh_sqlite_bind_text(st, 4, owner);
  nh_pg_args_t a;
  nh_pgaop_t op = nh_pgaargs_out_add(&a, owner, address, msg, len, at);
  if (sqlite3_step(st) != SQLITE_DONE) FAIL("sqlite outbox add: %s", sqlite3_errmsg(b->lite));
  int changes = sqlite3_changes(b->lite);
  int64_t lite_seq = sqlite3_last_insert_rowid(b->lite);
  sqlite3_reset(st);
  PGresult *r = pg_run(b->pg, op, &a);
  ASSERT_EQ_INT(PQntuples(r), 1);
  int64_t pg_seq = nh_pga_count(r);
  ASSERT_EQ_INT(nh_pg_affected(r), changes);
  PQclear(r);
  if (lite_seq != pg_seq) FAIL("the new row is seq %lld on sqlite, %lld on PostgreSQL", (long long)lite_seq,
                               (long long)pg_seq);
  return lite_seq;
}

/* nh_amqp_outbox_pump's read */
static const outcome_t *next_both(pair_t *b, const char *owner, int64_t after, int limit)
{
  sqlite3_stmt *st = lq(b, NH_PGA_OUT_NEXT);
  sqlite3_bind_int64(st, 1, after);
  sqlite3_bind_int(st, 2, limit);
  nh_sqlite_bind_text(st, 3, owner);
  nh_pg_args_t a;
  return both(b, nh_pgaargs_out_next(&a, owner, after, limit), &a, 0);
}

/* nh_amqp_unconfirmed's count */
static int left_both(pair_t *b, const char *owner, int64_t after)
{
  sqlite3_stmt *st = lq(b, NH_PGA_OUT_LEFT);
  sqlite3_bind_int64(st, 1, after);
  nh_sqlite_bind_text(st, 2, owner);
  nh_pg_args_t a;
  return atoi(both(b, nh_pgaargs_out_left(&a, owner, after), &a, 0)->lite.s);
}

/* nh_amqp_outbox_claim's list (sqlite asks for no order: compared as sets of lines, so a
 * duplicate still shows) */
static const outcome_t *owners_both(pair_t *b, const char *me)
{
  nh_sqlite_bind_text(lq(b, NH_PGA_OUT_OWNERS), 1, me);
  nh_pg_args_t a;
  return both(b, nh_pgaargs_out_owners(&a, me), &a, UNORDERED);
}

static int claim_both(pair_t *b, const char *owner, const char *from)
{
  sqlite3_stmt *st = lq(b, NH_PGA_OUT_CLAIM);
  nh_sqlite_bind_text(st, 1, owner);
  nh_sqlite_bind_text(st, 2, from);
  nh_pg_args_t a;
  return both(b, nh_pgaargs_out_claim(&a, owner, from), &a, 0)->lite_changes;
}

/* nh_amqp_outbox_discard */
static int drop_both(pair_t *b, const char *owner, int64_t first)
{
  sqlite3_stmt *st = lq(b, NH_PGA_OUT_DROP);
  nh_sqlite_bind_text(st, 1, owner);
  sqlite3_bind_int64(st, 2, first);
  nh_pg_args_t a;
  return both(b, nh_pgaargs_out_drop(&a, owner, first), &a, 0)->lite_changes;
}

/* the resend of a released row */
static const outcome_t *one_both(pair_t *b, int64_t seq)
{
  sqlite3_bind_int64(lq(b, NH_PGA_OUT_ONE), 1, seq);
  nh_pg_args_t a;
  return both(b, nh_pgaargs_out_one(&a, seq), &a, 0);
}

/* an accepted row's delete */
static int del_both(pair_t *b, int64_t seq)
{
  sqlite3_bind_int64(lq(b, NH_PGA_OUT_DEL), 1, seq);
  nh_pg_args_t a;
  return both(b, nh_pgaargs_out_del(&a, seq), &a, 0)->lite_changes;
}

/* handout's count of a redelivery: the count after it */
static int bump_both(pair_t *b, const char *endpoint, const char *message_id)
{
  sqlite3_stmt *st = lq(b, NH_PGA_DLV_BUMP);
  nh_sqlite_bind_text(st, 1, endpoint);
  nh_sqlite_bind_text(st, 2, message_id);
  nh_pg_args_t a;
  const outcome_t *o = both(b, nh_pgaargs_dlv_bump(&a, endpoint, message_id), &a, 0);
  ASSERT_EQ_INT(o->lite.rows, 1);
  ASSERT_EQ_INT(o->lite_changes, 1);
  return atoi(o->lite.s);
}

/* a settlement's delete of the count */
static int dlv_del_both(pair_t *b, const char *endpoint, const char *message_id)
{
  sqlite3_stmt *st = lq(b, NH_PGA_DLV_DEL);
  nh_sqlite_bind_text(st, 1, endpoint);
  nh_sqlite_bind_text(st, 2, message_id);
  nh_pg_args_t a;
  return both(b, nh_pgaargs_dlv_del(&a, endpoint, message_id), &a, 0)->lite_changes;
}

/* ---------------------------------------------------------------- migration */

TEST(amqp_schema_migrates_once_beside_the_store_and_the_queue)
{
  const char *url = nh_pgtest_scratch_url();
  PGconn *c = nh_pgtest_connect(url);
  nh_error_t err = { 0 };
  int v = -1;
  ASSERT_EQ_INT(nh_pg_amqp_schema_version(c, &v, &err), NH_OK);
  ASSERT_EQ_INT(v, 0);
  /* two hosts starting together: one migrates, the other waits for it and finds it done */
  nh_pgtest_migrate_together(url, nh_pg_amqp_migrate, 2);
  ASSERT_EQ_INT(nh_pg_amqp_schema_version(c, &v, &err), NH_OK);
  ASSERT_EQ_INT(v, NH_PG_AMQP_SCHEMA_VERSION);
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT count(*) || ':' || min(version) FROM nimbus_amqp_schema"), "1:1");
  /* the store's and the queue's migrations and versions are their own */
  int from = -1, to = -1;
  if (nh_pg_migrate(c, &from, &to, &err)) FAIL("store migrate: %s", err.msg);
  ASSERT_EQ_INT(from, 0);
  ASSERT_EQ_INT(to, NH_PG_SCHEMA_VERSION);
  ASSERT_EQ_INT(nh_pg_queue_schema_version(c, &v, &err), NH_OK);
  ASSERT_EQ_INT(v, 0);
  if (nh_pg_queue_migrate(c, &err)) FAIL("queue migrate: %s", err.msg);
  ASSERT_EQ_INT(nh_pg_amqp_migrate(c, &err), NH_OK);
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT version FROM nimbus_amqp_schema"), "1");

  /* the dialect: seq an identity, the message bytea, integers bigint, text byte-ordered */
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT is_identity FROM information_schema.columns"
                                " WHERE table_name = 'amqp_outbox' AND column_name = 'seq'"), "YES");
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT data_type FROM information_schema.columns"
                                " WHERE table_name = 'amqp_outbox' AND column_name = 'message'"), "bytea");
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT string_agg(table_name || '.' || column_name, ',' ORDER BY table_name,"
                                " column_name) FROM information_schema.columns WHERE table_name IN"
                                " ('amqp_outbox', 'amqp_deliveries') AND data_type = 'bigint'"),
                "amqp_deliveries.count,amqp_outbox.created_at,amqp_outbox.seq");
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT count(*) FROM information_schema.columns WHERE table_name IN"
                                " ('amqp_outbox', 'amqp_deliveries') AND data_type = 'text'"
                                " AND collation_name IS DISTINCT FROM 'C'"), "0");
  ASSERT_CONTAINS(nh_pgtest_q1(c, "SELECT pg_get_indexdef('amqp_deliveries_pkey'::regclass)"),
                  "(endpoint, message_id)");

  /* a newer AMQP schema is refused, naming both versions, and left as it is */
  nh_pgtest_q1(c, "UPDATE nimbus_amqp_schema SET version = 7");
  ASSERT_EQ_INT(nh_pg_amqp_migrate(c, &err), NH_EFAIL);
  ASSERT_CONTAINS(err.msg, "the AMQP transport's schema is version 7, newer than this nimbus-host knows (1)");
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT version FROM nimbus_amqp_schema"), "7");
  /* and that refusal is the AMQP list's alone: the store and the queue still migrate */
  ASSERT_EQ_INT(nh_pg_migrate(c, NULL, NULL, &err), NH_OK);
  ASSERT_EQ_INT(nh_pg_queue_migrate(c, &err), NH_OK);
}

/* ---------------------------------------------------------------- parity */

/* Each operation takes the parameters its sqlite twin takes. */
TEST(every_statement_has_its_twin_with_the_same_parameters)
{
  pair_t *b = pair_open();
  for (int i = 0; i < A_COUNT; i++) {
    ASSERT_NOT_NULL(nh_amqp_sql(i));
    if (sqlite3_bind_parameter_count(b->q[i]) != nh_pgaop_nparams(i))
      FAIL("%s: %d parameters on sqlite, %d on PostgreSQL", nh_pgaop_name(i), sqlite3_bind_parameter_count(b->q[i]),
           nh_pgaop_nparams(i));
  }
  ASSERT_NULL(nh_amqp_sql(A_COUNT));
  ASSERT_NULL(nh_amqp_sql(-1));
}

TEST(outbox_across_two_owners_reads_the_same_on_both)
{
  pair_t *b = pair_open();
  int64_t t0 = nh_time_now_ms();
  /* A and B write interleaved (a host and a CLI publish sharing the store) */
  int64_t s1 = add_both(b, OWNER_A, ADDR_EV, "a-one", 5, t0);
  int64_t s2 = add_both(b, OWNER_B, ADDR_EV, "b-one", 5, t0 + 1);
  int64_t s3 = add_both(b, OWNER_A, ADDR_RE, "a-two", 5, t0 + 2);
  int64_t s4 = add_both(b, OWNER_A, ADDR_EV, "a-three", 7, t0 + 3);
  int64_t s5 = add_both(b, OWNER_B, ADDR_RE, "b-two", 5, t0 + 4);
  ASSERT_EQ_INT(s1, 1);
  ASSERT_EQ_INT(s5, 5);
  same_outbox(b);

  /* next: each owner its own rows after the cursor, in seq order, at most the limit */
  const outcome_t *o = next_both(b, OWNER_A, 0, 2);
  ASSERT_EQ_INT(o->lite.rows, 2);
  char want[256];
  snprintf(want, sizeof want, "%lld|" ADDR_EV "|x612d6f6e65\n%lld|" ADDR_RE "|x612d74776f\n", (long long)s1,
           (long long)s3);
  ASSERT_EQ_STR(o->lite.s, want);
  o = next_both(b, OWNER_A, s3, 10);
  ASSERT_EQ_INT(o->lite.rows, 1);
  ASSERT_EQ_INT(atoi(o->lite.s), s4);
  ASSERT_EQ_INT(next_both(b, OWNER_A, s4, 10)->lite.rows, 0);
  ASSERT_EQ_INT(next_both(b, OWNER_B, 0, 10)->lite.rows, 2);
  ASSERT_EQ_INT(next_both(b, OWNER_C, 0, 10)->lite.rows, 0);

  /* left: what is after the cursor, the owner's only */
  ASSERT_EQ_INT(left_both(b, OWNER_A, 0), 3);
  ASSERT_EQ_INT(left_both(b, OWNER_A, s1), 2);
  ASSERT_EQ_INT(left_both(b, OWNER_B, s2), 1);
  ASSERT_EQ_INT(left_both(b, OWNER_C, 0), 0);

  /* owners: everyone but the asker, each once */
  ASSERT_EQ_STR(owners_both(b, OWNER_A)->lite.s, OWNER_B "\n");
  ASSERT_EQ_STR(owners_both(b, OWNER_C)->lite.s, OWNER_A "\n" OWNER_B "\n");

  /* C takes over B's rows (B stopped): B has none left, C sends them from its cursor */
  ASSERT_EQ_INT(claim_both(b, OWNER_C, OWNER_B), 2);
  ASSERT_EQ_INT(claim_both(b, OWNER_C, OWNER_B), 0);
  same_outbox(b);
  ASSERT_EQ_STR(owners_both(b, OWNER_A)->lite.s, OWNER_C "\n");
  ASSERT_EQ_INT(next_both(b, OWNER_B, 0, 10)->lite.rows, 0);
  ASSERT_EQ_INT(next_both(b, OWNER_C, 0, 10)->lite.rows, 2);
  ASSERT_EQ_INT(left_both(b, OWNER_C, 0), 2);

  /* drop: A discards what it wrote from s3 on; rows below, and other owners', stay */
  ASSERT_EQ_INT(drop_both(b, OWNER_A, s3), 2);
  ASSERT_EQ_INT(drop_both(b, OWNER_A, s3), 0);
  same_outbox(b);
  ASSERT_EQ_INT(left_both(b, OWNER_A, 0), 1);

  /* one: a row by seq while it is there, whoever owns it */
  o = one_both(b, s2);
  snprintf(want, sizeof want, "%lld|" ADDR_EV "|x622d6f6e65\n", (long long)s2);
  ASSERT_EQ_STR(o->lite.s, want);
  ASSERT_EQ_INT(one_both(b, s4)->lite.rows, 0);   /* dropped */

  /* delete: once */
  ASSERT_EQ_INT(del_both(b, s1), 1);
  ASSERT_EQ_INT(del_both(b, s1), 0);
  ASSERT_EQ_INT(one_both(b, s1)->lite.rows, 0);
  same_outbox(b);
  ASSERT_EQ_INT(left_both(b, OWNER_A, 0), 0);

  /* seqs are never reused (AUTOINCREMENT, an identity): after deleting the highest */
  ASSERT_EQ_INT(del_both(b, s5), 1);
  ASSERT_EQ_INT(add_both(b, OWNER_A, ADDR_EV, "a-four", 6, t0 + 5), s5 + 1);
  same_outbox(b);
}

TEST(delivery_counts_read_the_same_on_both)
{
  pair_t *b = pair_open();
  ASSERT_EQ_INT(bump_both(b, "EpA", "m-1"), 1);
  ASSERT_EQ_INT(bump_both(b, "EpA", "m-1"), 2);
  ASSERT_EQ_INT(bump_both(b, "EpA", "m-1"), 3);
  /* the count is per endpoint and message */
  ASSERT_EQ_INT(bump_both(b, "EpB", "m-1"), 1);
  ASSERT_EQ_INT(bump_both(b, "EpA", "m-2"), 1);
  same_table(b, "delivery counts", deliveries_dump);
  ASSERT_EQ_INT(dlv_del_both(b, "EpA", "m-1"), 1);
  ASSERT_EQ_INT(dlv_del_both(b, "EpA", "m-1"), 0);
  same_table(b, "delivery counts", deliveries_dump);
  /* deleted, a redelivery starts again at 1 */
  ASSERT_EQ_INT(bump_both(b, "EpA", "m-1"), 1);
  same_table(b, "delivery counts", deliveries_dump);

  /* binary message ids that differ only in bytes that are not UTF-8 keep their own
   * counts, and are found again to delete (PostgreSQL stores them escaped, so only the
   * statements' results are compared here, not the table) */
  ASSERT_EQ_INT(bump_both(b, "EpA", "bin-\xff"), 1);
  ASSERT_EQ_INT(bump_both(b, "EpA", "bin-\xff"), 2);
  ASSERT_EQ_INT(bump_both(b, "EpA", "bin-\xfe"), 1);
  ASSERT_EQ_INT(dlv_del_both(b, "EpA", "bin-\xff"), 1);
  ASSERT_EQ_INT(bump_both(b, "EpA", "bin-\xfe"), 2);
}

/* An AMQP message as nh_amqp_outbox_add stores it is proton's encoding: binary, with
 * NULs, and a body that may hold anything. */
TEST(an_encoded_message_with_nul_and_non_utf8_bytes_comes_back_identical)
{
  pair_t *b = pair_open();
  static const char small[] = "\0Sp\xc0\x02\x01\x41\0Sr\xff\xfe\x80\xc3(\0\0\0";
  size_t big_len = 256 * 1024;
  char *big = malloc(big_len);
  nh_test_on_cleanup(free, big);
  for (size_t i = 0; i < big_len; i++) big[i] = (char)(i * 7 + (i >> 8));   /* every byte value */
  int64_t t0 = nh_time_now_ms();
  int64_t s1 = add_both(b, OWNER_A, ADDR_EV, small, sizeof small - 1, t0);
  int64_t s2 = add_both(b, OWNER_A, ADDR_EV, big, big_len, t0);
  int64_t s3 = add_both(b, OWNER_A, ADDR_EV, "", 0, t0);   /* empty, not NULL */
  same_outbox(b);

  struct { int64_t seq; const char *bytes; size_t len; } want[] = {
    { s1, small, sizeof small - 1 }, { s2, big, big_len }, { s3, "", 0 } };
  nh_pg_args_t a;
  for (int i = 0; i < 3; i++) {
    /* PostgreSQL: the reader gives the bytes as written */
    PGresult *r = pg_run(b->pg, nh_pgaargs_out_one(&a, want[i].seq), &a);
    ASSERT_EQ_INT(PQntuples(r), 1);
    nh_pga_out_row_t row;
    nh_pga_out_row(r, 0, &row);
    ASSERT_EQ_INT(row.seq, want[i].seq);
    ASSERT_EQ_STR(row.address, ADDR_EV);
    ASSERT_NOT_NULL(row.message);
    if (row.len != want[i].len || memcmp(row.message, want[i].bytes, row.len) != 0)
      FAIL("message %d: PostgreSQL gave %zu bytes back, not the %zu written", i, row.len, want[i].len);
    PQclear(r);
    /* sqlite: its own statement, as send_row reads it */
    sqlite3_stmt *st = lq(b, NH_PGA_OUT_ONE);
    sqlite3_bind_int64(st, 1, want[i].seq);
    ASSERT_EQ_INT(sqlite3_step(st), SQLITE_ROW);
    size_t n = (size_t)sqlite3_column_bytes(st, 2);
    if (n != want[i].len || (n && memcmp(sqlite3_column_blob(st, 2), want[i].bytes, n) != 0))
      FAIL("message %d: sqlite gave %zu bytes back, not the %zu written", i, n, want[i].len);
    sqlite3_reset(st);
  }
  /* and through next, in one result, as the pump reads them */
  PGresult *r = pg_run(b->pg, nh_pgaargs_out_next(&a, OWNER_A, 0, 10), &a);
  ASSERT_EQ_INT(PQntuples(r), 3);
  nh_pga_out_row_t row;
  nh_pga_out_row(r, 1, &row);
  ASSERT_EQ_INT(row.len, big_len);
  ASSERT_TRUE(memcmp(row.message, big, big_len) == 0);
  PQclear(r);
}

/* ---------------------------------------------------------------- one executor */

static char done_log[512];

static void on_result(void *data, const nh_pg_optab_t *tab, int op, const PGresult *res)
{
  (void)res;
  int64_t *seq = data;
  if (seq) *seq = nh_pga_count(res);
  size_t o = strlen(done_log);
  snprintf(done_log + o, sizeof done_log - o, "%s%s:%s", o ? " " : "", tab->what, tab->ops[op].name);
}

/* A pump's transaction on PostgreSQL: the outcome's store rows, the event it publishes
 * (an outbox row) and the settled delivery's count removed. A NULL message fails OUT_ADD
 * (message is NOT NULL). */
static void add_outcome(nh_pg_db_t *q, const char *mid, const char *message, int64_t *seq)
{
  nh_pg_args_t a;
  nh_error_t err = { 0 };
  if (nh_pg_batch_add_op(q, &nh_pg_store_optab, nh_pgargs_inbox_add(&a, "EpA", mid), &a, on_result, NULL, &err) ||
      nh_pga_batch_add(q, nh_pgaargs_out_add(&a, OWNER_A, ADDR_EV, message, message ? strlen(message) : 0, 0), &a,
                       on_result, seq, &err) ||
      nh_pga_batch_add(q, nh_pgaargs_dlv_del(&a, "EpA", mid), &a, on_result, NULL, &err) ||
      nh_pg_batch_add_op(q, &nh_pg_store_optab, nh_pgargs_oplog_add(&a, "tests", "settle", "EpA", mid, "s1", NULL),
                         &a, on_result, NULL, &err))
    FAIL("%s", err.msg);
}

TEST(store_and_amqp_operations_commit_in_one_batch_or_not_at_all)
{
  nh_pg_db_t *q = amqp_conn(nh_pgtest_scratch_url());
  PGconn *c = nh_pg_db_conn(q);
  nh_error_t err = { 0 };
  if (nh_pg_migrate(c, NULL, NULL, &err)) FAIL("store migrate: %s", err.msg);
  nh_pg_args_t a;
  PQclear(pg_run(q, nh_pgaargs_dlv_bump(&a, "EpA", "m-1"), &a));
  PQclear(pg_run(q, nh_pgaargs_dlv_bump(&a, "EpA", "m-2"), &a));
  nh_pg_db_stats_t st0, st1;
  nh_pg_db_stats(q, &st0);

  /* both tables' operations in one pipeline, the results told in order with their table */
  done_log[0] = '\0';
  int64_t seq = 0;
  if (nh_pg_batch_begin(q, &err)) FAIL("%s", err.msg);
  add_outcome(q, "m-1", "encoded-1", &seq);
  if (nh_pg_batch_commit(q, &err)) FAIL("%s", err.msg);
  ASSERT_EQ_STR(done_log, "store:nh_inbox_add amqp:nha_out_add amqp:nha_dlv_del store:nh_oplog_add");
  ASSERT_EQ_INT(seq, 1);
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT owner || '|' || address || '|' || convert_from(message, 'UTF8')"
                                " FROM amqp_outbox"), OWNER_A "|" ADDR_EV "|encoded-1");
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT string_agg(message_id, ',') FROM amqp_deliveries"), "m-2");
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT message_id FROM inbox"), "m-1");
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT count(*) FROM operator_log"), "1");
  nh_pg_db_stats(q, &st1);
  ASSERT_EQ_INT(st1.pipelines - st0.pipelines, 1);   /* one round trip */
  ASSERT_EQ_INT(st1.prepares - st0.prepares, 4);     /* each prepared once on this connection */

  /* an AMQP statement failing after store and AMQP writes: nothing of either is
   * committed, and the error names the statement */
  done_log[0] = '\0';
  if (nh_pg_batch_begin(q, &err)) FAIL("%s", err.msg);
  add_outcome(q, "m-2", "encoded-2", NULL);
  add_outcome(q, "m-3", NULL, NULL);
  ASSERT_EQ_INT(nh_pg_batch_commit(q, &err), NH_EFAIL);
  ASSERT_CONTAINS(err.msg, "statement 6 of a batch of 8 (out_add)");
  ASSERT_CONTAINS(err.msg, "23502");
  ASSERT_CONTAINS(err.msg, "nothing of the batch was committed");
  ASSERT_EQ_STR(done_log, "");   /* no callback ran */
  ASSERT_EQ_INT(nh_pg_batch_outcome(q), NH_PG_NOT_COMMITTED);
  ASSERT_EQ_INT(PQtransactionStatus(c), PQTRANS_IDLE);
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT count(*) FROM amqp_outbox"), "1");
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT string_agg(message_id, ',') FROM amqp_deliveries"), "m-2");
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT count(*) FROM inbox"), "1");
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT count(*) FROM operator_log"), "1");

  /* the seq the failed batch took is not handed out again: the next row is after it */
  if (nh_pg_batch_begin(q, &err)) FAIL("%s", err.msg);
  add_outcome(q, "m-2", "encoded-2", &seq);
  if (nh_pg_batch_commit(q, &err)) FAIL("%s", err.msg);
  ASSERT_CMP_INT(seq, >, 2);
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT count(*) FROM amqp_deliveries"), "0");

  /* misuse of an AMQP operation is refused by the AMQP table's name */
  nh_pgaargs_out_del(&a, seq);
  a.n = 3;
  ASSERT_EQ_INT(nh_pga_run(q, NH_PGA_OUT_DEL, &a, NULL, &err), NH_EUSAGE);
  ASSERT_CONTAINS(err.msg, "amqp: operation");
  ASSERT_CONTAINS(err.msg, "given 3 parameters, not 1");
}

/* ---------------------------------------------------------------- adoption (PostgreSQL only) */

/* Rows of a host on another machine that stopped refreshing its presence are taken over
 * once they are old enough; a live host's, a recent one's and the taker's own stay. */
TEST(rows_of_hosts_gone_from_the_hosts_table_are_adopted_and_no_others)
{
  nh_pg_db_t *q = amqp_conn(nh_pgtest_scratch_url());
  PGconn *c = nh_pg_db_conn(q);
  nh_error_t err = { 0 };
  if (nh_pg_migrate(c, NULL, NULL, &err)) FAIL("store migrate: %s", err.msg);
  nh_pg_args_t a;
  int64_t now = 1000000;
  struct { const char *owner; int64_t at; } rows[] = {
    { OWNER_B, now - 120000 },   /* gone (its hosts row not seen since), old: adopted */
    { OWNER_B, now - 1000 },     /* gone, but written a second ago (a publish still waiting?): stays */
    { OWNER_C, now - 120000 },   /* alive: its hosts row is fresh */
    { OWNER_A, now - 120000 },   /* the taker's own */
    { "elsewhere:77", now - 90000 },   /* no hosts row at all: a `publish` command that died, say */
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
    PQclear(pg_run(q, nh_pgaargs_out_add(&a, rows[i].owner, ADDR_EV, "m", 1, rows[i].at), &a));
  nh_pgtest_q1(c, "INSERT INTO hosts(owner, endpoints, started_at, seen_at) VALUES"
                  " ('" OWNER_B "', ',Ep,', 0, 900000), ('" OWNER_C "', ',Ep,', 0, 999000)");
  PGresult *r = pg_run(q, nh_pgaargs_out_adopt(&a, OWNER_A, now - 60000), &a);
  ASSERT_EQ_INT(PQntuples(r), 2);
  PQclear(r);
  ASSERT_EQ_STR(nh_pgtest_q1(c, "SELECT string_agg(owner || '@' || created_at, ',' ORDER BY seq) FROM amqp_outbox"),
                OWNER_A "@880000," OWNER_B "@999000," OWNER_C "@880000," OWNER_A "@880000," OWNER_A "@910000");
  /* once taken, nothing is taken twice */
  r = pg_run(q, nh_pgaargs_out_adopt(&a, OWNER_A, now - 60000), &a);
  ASSERT_EQ_INT(PQntuples(r), 0);
  PQclear(r);
}

/* ---------------------------------------------------------------- main */

NH_PGTEST_MAIN()
