/* W3C Trace Context (core/nh_trace.h): the spec's valid and malformed traceparent forms
 * (the cases of its test suite, w3c/trace-context test/test.py), round trips, minted ids
 * and tracestate. */
#include "nh_test.h"

#include "core/nh_trace.h"

#include <sys/wait.h>

#define TID "4bf92f3577b34da6a3ce929d0e0e4736"
#define PID "00f067aa0ba902b7"
#define TP(ver, flags) ver "-" TID "-" PID "-" flags

static const nh_trace_ctx_t zero_ctx;

static void expect_hex(const uint8_t *b, size_t n, const char *hex)
{
  char got[65];
  nh_trace_hex(b, n, got);
  ASSERT_EQ_STR(got, hex);
}

static void expect_bad(const char *tp)
{
  nh_trace_ctx_t c = zero_ctx;
  if (nh_trace_parse(tp, &c) != -1) FAIL("parsed a malformed traceparent: \"%s\"", tp);
  ASSERT_TRUE(memcmp(&c, &zero_ctx, sizeof c) == 0);   /* out untouched */
}

static void expect_good(const char *tp, uint8_t flags)
{
  nh_trace_ctx_t c;
  if (nh_trace_parse(tp, &c) != 0) FAIL("did not parse a valid traceparent: \"%s\"", tp);
  expect_hex(c.trace_id, 16, TID);
  expect_hex(c.span_id, 8, PID);
  ASSERT_EQ_INT(c.flags, flags);
}

TEST(parses_the_spec_examples)
{
  expect_good(TP("00", "01"), 0x01);
  expect_good(TP("00", "00"), 0x00);
  expect_good(TP("00", "09"), 0x09);   /* unknown flags are kept (level 2 adds 02) */
  nh_trace_ctx_t c;
  ASSERT_EQ_INT(nh_trace_parse("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", &c), 0);
  expect_hex(c.trace_id, 16, "0af7651916cd43dd8448eb211c80319c");
  expect_hex(c.span_id, 8, "b7ad6b7169203331");
  ASSERT_EQ_INT(c.flags, 1);
}

TEST(tolerates_header_whitespace)
{
  expect_good(" " TP("00", "01"), 1);
  expect_good("\t" TP("00", "01"), 1);
  expect_good(TP("00", "01") " ", 1);
  expect_good(TP("00", "01") "\t", 1);
  expect_good(" \t " TP("00", "01") " \t ", 1);
  expect_bad(TP("00", "01") "\n");
  expect_bad(TP("00", "01") " x");
}

TEST(future_versions_are_read_by_their_first_four_fields)
{
  expect_good(TP("cc", "01"), 1);
  expect_good(TP("cc", "01") "-what-the-future-will-be-like", 1);
  expect_good(TP("01", "00") "-", 0);
  expect_good(TP("fe", "01") "-x", 1);
  /* extra data that is not a field after a '-' */
  expect_bad(TP("cc", "01") ".what-the-future-will-be-like");
  expect_bad(TP("cc", "01") "what");
  expect_bad(TP("cc", "012"));
  /* the four fields must still be well formed */
  expect_bad("cc-" TID "-" PID "-0x-future");
  expect_bad("cc-" TID "-" PID "x01-future");
  expect_bad("cc-00000000000000000000000000000000-" PID "-01-future");
}

TEST(rejects_every_malformed_form)
{
  /* version */
  expect_bad(TP("ff", "01"));
  expect_bad(TP("FF", "01"));
  expect_bad(TP("0A", "01"));
  expect_bad(TP(".0", "01"));
  expect_bad(TP("0.", "01"));
  expect_bad(TP("000", "01"));
  expect_bad(TP("0000", "01"));
  expect_bad(TP("0", "01"));
  expect_bad("-" TID "-" PID "-01");
  /* version 00 is exactly 55 characters */
  expect_bad(TP("00", "01") ".");
  expect_bad(TP("00", "01") "-what-the-future-will-be-like");
  expect_bad(TP("00", "01") "-");
  /* trace id */
  expect_bad("00-00000000000000000000000000000000-" PID "-01");
  expect_bad("00-4BF92F3577B34DA6A3CE929D0E0E4736-" PID "-01");
  expect_bad("00-4bf92f3577b34da6a3ce929d0e0e473A-" PID "-01");
  expect_bad("00-.bf92f3577b34da6a3ce929d0e0e4736-" PID "-01");
  expect_bad("00-4bf92f3577b34da6a3ce929d0e0e473.-" PID "-01");
  expect_bad("00-4bf92f3577b34da6a3ce929d0e0e4736a-" PID "-01");   /* too long */
  expect_bad("00-4bf92f3577b34da6a3ce929d0e0e473-" PID "-01");     /* too short */
  expect_bad("00-4bf92f3577b34da6a3ce929d0e0e473-" PID "-012");    /* short id, right length */
  expect_bad("00-g bf92f3577b34da6a3ce929d0e0e473-" PID "-01");
  /* parent id */
  expect_bad("00-" TID "-0000000000000000-01");
  expect_bad("00-" TID "-00F067AA0BA902B7-01");
  expect_bad("00-" TID "-.0f067aa0ba902b7-01");
  expect_bad("00-" TID "-00f067aa0ba902b.-01");
  expect_bad("00-" TID "-00f067aa0ba902b7a-01");
  expect_bad("00-" TID "-00f067aa0ba902b-01");
  /* flags */
  expect_bad(TP("00", ".0"));
  expect_bad(TP("00", "0."));
  expect_bad(TP("00", "0A"));
  expect_bad(TP("00", "-1"));
  expect_bad(TP("00", "001"));
  expect_bad(TP("00", "1"));
  expect_bad(TP("00", ""));
  /* separators */
  expect_bad("00_" TID "-" PID "-01");
  expect_bad("00-" TID "_" PID "-01");
  expect_bad("00-" TID "-" PID "_01");
  expect_bad("00 " TID " " PID " 01");
  expect_bad("00-" TID PID "-01-");
  /* nothing at all */
  expect_bad("");
  expect_bad("   ");
  expect_bad(NULL);
}

TEST(format_and_parse_round_trip)
{
  nh_trace_ctx_t c, back;
  ASSERT_EQ_INT(nh_trace_parse(TP("00", "01"), &c), 0);
  char out[56];
  nh_trace_format(&c, out);
  ASSERT_EQ_STR(out, TP("00", "01"));
  /* a future version is written back as 00 */
  ASSERT_EQ_INT(nh_trace_parse(TP("cc", "00") "-more", &c), 0);
  nh_trace_format(&c, out);
  ASSERT_EQ_STR(out, TP("00", "00"));
  for (int i = 0; i < 100; i++) {
    nh_trace_new_root(&c);
    c.flags = (uint8_t)i;
    nh_trace_format(&c, out);
    ASSERT_EQ_INT(strlen(out), NH_TRACEPARENT_LEN);
    ASSERT_EQ_INT(nh_trace_parse(out, &back), 0);
    ASSERT_TRUE(memcmp(&c, &back, sizeof c) == 0);
  }
}

TEST(hex_is_lower_case_and_terminated)
{
  const uint8_t b[] = { 0x00, 0x0f, 0xa5, 0xff };
  char out[9];
  memset(out, 'x', sizeof out);
  nh_trace_hex(b, 4, out);
  ASSERT_EQ_STR(out, "000fa5ff");
  nh_trace_hex(b, 0, out);
  ASSERT_EQ_STR(out, "");
}

TEST(a_root_is_sampled_with_non_zero_ids)
{
  static const uint8_t z[16];
  nh_trace_ctx_t c;
  nh_trace_new_root(&c);
  ASSERT_EQ_INT(c.flags, NH_TRACE_SAMPLED);
  ASSERT_TRUE(memcmp(c.trace_id, z, 16) != 0);
  ASSERT_TRUE(memcmp(c.span_id, z, 8) != 0);
}

TEST(children_keep_the_trace_and_flags_with_a_fresh_span_id)
{
  nh_trace_ctx_t root, child, grandchild;
  ASSERT_EQ_INT(nh_trace_parse(TP("00", "00"), &root), 0);   /* not sampled: stays so */
  nh_trace_new_child(&root, &child);
  ASSERT_TRUE(memcmp(child.trace_id, root.trace_id, 16) == 0);
  ASSERT_EQ_INT(child.flags, 0);
  ASSERT_TRUE(memcmp(child.span_id, root.span_id, 8) != 0);
  nh_trace_new_child(&child, &grandchild);
  ASSERT_TRUE(memcmp(grandchild.trace_id, root.trace_id, 16) == 0);
  ASSERT_TRUE(memcmp(grandchild.span_id, child.span_id, 8) != 0);
  ASSERT_TRUE(memcmp(grandchild.span_id, root.span_id, 8) != 0);
  /* in place */
  nh_trace_ctx_t same = child;
  nh_trace_new_child(&same, &same);
  ASSERT_TRUE(memcmp(same.trace_id, child.trace_id, 16) == 0);
  ASSERT_EQ_INT(same.flags, child.flags);
  ASSERT_TRUE(memcmp(same.span_id, child.span_id, 8) != 0);
}

#define NROOTS 10000

static int cmp16(const void *a, const void *b) { return memcmp(a, b, 16); }
static int cmp8(const void *a, const void *b) { return memcmp(a, b, 8); }

TEST(ten_thousand_roots_have_distinct_ids)
{
  static uint8_t tids[NROOTS][16], sids[NROOTS][8];
  for (int i = 0; i < NROOTS; i++) {
    nh_trace_ctx_t c;
    nh_trace_new_root(&c);
    memcpy(tids[i], c.trace_id, 16);
    memcpy(sids[i], c.span_id, 8);
  }
  qsort(tids, NROOTS, 16, cmp16);
  qsort(sids, NROOTS, 8, cmp8);
  for (int i = 1; i < NROOTS; i++) {
    ASSERT_TRUE(memcmp(tids[i - 1], tids[i], 16) != 0);
    ASSERT_TRUE(memcmp(sids[i - 1], sids[i], 8) != 0);
  }
}

TEST(a_forked_child_mints_other_ids)
{
  nh_trace_ctx_t mine;
  nh_trace_new_root(&mine);   /* seeded before the fork */
  int fds[2];
  ASSERT_EQ_INT(pipe(fds), 0);
  pid_t pid = fork();
  ASSERT_TRUE(pid >= 0);
  if (pid == 0) {
    nh_trace_ctx_t c;
    nh_trace_new_root(&c);
    ssize_t w = write(fds[1], &c, sizeof c);
    _exit(w == (ssize_t)sizeof c ? 0 : 1);
  }
  close(fds[1]);
  nh_trace_ctx_t theirs, next;
  ssize_t r = read(fds[0], &theirs, sizeof theirs);
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_EQ_INT(r, sizeof theirs);
  nh_trace_new_root(&next);   /* what the parent mints next: the child must not repeat it */
  ASSERT_TRUE(memcmp(theirs.trace_id, next.trace_id, 16) != 0);
  ASSERT_TRUE(memcmp(theirs.span_id, next.span_id, 8) != 0);
}

TEST(tracestate_checks)
{
  ASSERT_EQ_INT(nh_tracestate_valid("rojo=00f067aa0ba902b7"), 1);
  ASSERT_EQ_INT(nh_tracestate_valid("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"), 1);
  ASSERT_EQ_INT(nh_tracestate_valid("rojo=00f067aa0ba902b7 ,\tcongo=t61rcWkgMzE "), 1);
  ASSERT_EQ_INT(nh_tracestate_valid("fw529a3039@dt=a b,vendor-1/x*_=1"), 1);
  ASSERT_EQ_INT(nh_tracestate_valid("foo=1,,bar=2, ,"), 1);   /* empty members are allowed */
  ASSERT_EQ_INT(nh_tracestate_valid(""), 1);
  ASSERT_EQ_INT(nh_tracestate_valid("k=~!\"#$%&'()*+-./:;<>?@[\\]^_`{|}"), 1);

  ASSERT_EQ_INT(nh_tracestate_valid(NULL), 0);
  ASSERT_EQ_INT(nh_tracestate_valid("foo"), 0);             /* no '=' */
  ASSERT_EQ_INT(nh_tracestate_valid("foo="), 0);            /* empty value */
  ASSERT_EQ_INT(nh_tracestate_valid("=bar"), 0);            /* empty key */
  ASSERT_EQ_INT(nh_tracestate_valid("foo=bar=baz"), 0);     /* '=' in the value */
  ASSERT_EQ_INT(nh_tracestate_valid("Foo=bar"), 0);         /* upper-case key */
  ASSERT_EQ_INT(nh_tracestate_valid("1foo=bar"), 0);        /* simple key starts with a letter */
  ASSERT_EQ_INT(nh_tracestate_valid("foo.bar=1"), 0);
  ASSERT_EQ_INT(nh_tracestate_valid("foo=b\x01r"), 0);      /* control character */
  ASSERT_EQ_INT(nh_tracestate_valid("foo=b\xc3\xa9"), 0);   /* not ASCII */
  ASSERT_EQ_INT(nh_tracestate_valid("foo=1,foo=2"), 0);     /* the same key twice */
  ASSERT_EQ_INT(nh_tracestate_valid("@v=1"), 0);
  ASSERT_EQ_INT(nh_tracestate_valid("t@=1"), 0);
  ASSERT_EQ_INT(nh_tracestate_valid("t@1v=1"), 0);          /* system id starts with a letter */
  ASSERT_EQ_INT(nh_tracestate_valid("t@abcdefghijklmno=1"), 0);   /* system id of 15 */
  ASSERT_EQ_INT(nh_tracestate_valid("t@abcdefghijklmn=1"), 1);    /* of 14 */
  ASSERT_EQ_INT(nh_tracestate_valid("a@b@c=1"), 0);

  /* 32 members, not 33 */
  char buf[1024] = "";
  for (int i = 0; i < 32; i++) snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%sk%d=v", i ? "," : "", i);
  ASSERT_EQ_INT(nh_tracestate_valid(buf), 1);
  strcat(buf, ",k32=v");
  ASSERT_EQ_INT(nh_tracestate_valid(buf), 0);

  /* 512 characters, not 513; a value of 256, not 257 */
  char big[600];
  memset(big, 'v', sizeof big);
  memcpy(big, "k=", 2);
  big[512] = '\0';
  ASSERT_EQ_INT(nh_tracestate_valid(big), 0);   /* value of 510 */
  char v256[300] = "k=";
  memset(v256 + 2, 'v', 256);
  v256[258] = '\0';
  ASSERT_EQ_INT(nh_tracestate_valid(v256), 1);
  v256[258] = 'v';
  v256[259] = '\0';
  ASSERT_EQ_INT(nh_tracestate_valid(v256), 0);
  memset(buf, 0, sizeof buf);
  for (int i = 0; strlen(buf) < 500; i++)
    snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%sk%d=%s", i ? "," : "", i, "vvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvv");
  ASSERT_TRUE(strlen(buf) > 512);
  ASSERT_EQ_INT(nh_tracestate_valid(buf), 0);
}

NH_TEST_MAIN()
