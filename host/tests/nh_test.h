/* A tiny assertion framework for the nimbus-host C unit tests.
 *
 *   TEST(name) { ASSERT_EQ_INT(1 + 1, 2); }
 *   NH_TEST_MAIN()
 *
 * Tests register themselves (constructor attribute) and run in file order. Every test
 * gets a fresh temporary directory (nh_test_tmpdir(), nh_test_path("x.db")) under
 * $TMPDIR or /tmp, removed afterwards (kept when NH_TEST_KEEP is set). A failed
 * assertion prints file:line and both sides, then abandons the test (longjmp) so
 * later assertions do not run on bad state. The last line printed is exactly
 * "N passed, M failed"; the exit status is non-zero when anything failed.
 * `./test_x NAME...` runs only the tests whose names contain one of the arguments.
 *
 * Header-only: include it from exactly one translation unit per executable. */
#ifndef NH_TEST_H
#define NH_TEST_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef void (*nh_test_fn)(void);

typedef struct nh_test_case {
  const char *name;
  nh_test_fn fn;
} nh_test_case_t;

#define NH_TEST_MAX 256
/* helpers a given test file may not use */
#define NH_TEST_UNUSED __attribute__((unused))

static nh_test_case_t nh_test_cases[NH_TEST_MAX];
static int nh_test_ncases;
static jmp_buf nh_test_jmp;
static volatile int nh_test_failed_now;
static const char *nh_test_current;
static char nh_test_dir[PATH_MAX];

/* Cleanups registered by a test run after it, last first, whether it passed or not,
 * so a failed assertion does not leak the test's resources (clean ASan reports). */
#define NH_TEST_MAX_CLEANUPS 16
static struct { void (*fn)(void *); void *arg; } nh_test_cleanups[NH_TEST_MAX_CLEANUPS];
static int nh_test_ncleanups;

static void nh_test_register(const char *name, nh_test_fn fn)
{
  if (nh_test_ncases >= NH_TEST_MAX) {
    fprintf(stderr, "nh_test: too many tests (raise NH_TEST_MAX)\n");
    abort();
  }
  nh_test_cases[nh_test_ncases].name = name;
  nh_test_cases[nh_test_ncases].fn = fn;
  nh_test_ncases++;
}

#define TEST(name)                                                                                 \
  static void nh_test_fn_##name(void);                                                             \
  __attribute__((constructor)) static void nh_test_reg_##name(void)                                \
  {                                                                                                \
    nh_test_register(#name, nh_test_fn_##name);                                                    \
  }                                                                                                \
  static void nh_test_fn_##name(void)

/* ---------------------------------------------------------------- failure reporting */

__attribute__((noreturn, format(printf, 3, 4))) static void nh_test_fail(const char *file, int line,
                                                                         const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "%s:%d: %s: ", file, line, nh_test_current ? nh_test_current : "?");
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  fflush(stderr);
  nh_test_failed_now = 1;
  longjmp(nh_test_jmp, 1);
}

#define FAIL(...) nh_test_fail(__FILE__, __LINE__, __VA_ARGS__)

#define ASSERT_TRUE(cond)                                                                          \
  do {                                                                                             \
    if (!(cond)) FAIL("ASSERT_TRUE(%s) failed", #cond);                                            \
  } while (0)

#define ASSERT_FALSE(cond)                                                                         \
  do {                                                                                             \
    if (cond) FAIL("ASSERT_FALSE(%s) failed", #cond);                                              \
  } while (0)

#define ASSERT_EQ_INT(a, b)                                                                        \
  do {                                                                                             \
    long long nh_a_ = (long long)(a), nh_b_ = (long long)(b);                                      \
    if (nh_a_ != nh_b_)                                                                            \
      FAIL("ASSERT_EQ_INT(%s, %s) failed: %lld != %lld", #a, #b, nh_a_, nh_b_);                    \
  } while (0)

#define ASSERT_NE_INT(a, b)                                                                        \
  do {                                                                                             \
    long long nh_a_ = (long long)(a), nh_b_ = (long long)(b);                                      \
    if (nh_a_ == nh_b_) FAIL("ASSERT_NE_INT(%s, %s) failed: both are %lld", #a, #b, nh_a_);        \
  } while (0)

/* Compare with an operator: ASSERT_CMP_INT(x, <=, 10) */
#define ASSERT_CMP_INT(a, op, b)                                                                   \
  do {                                                                                             \
    long long nh_a_ = (long long)(a), nh_b_ = (long long)(b);                                      \
    if (!(nh_a_ op nh_b_))                                                                         \
      FAIL("ASSERT_CMP_INT(%s %s %s) failed: %lld %s %lld is false", #a, #op, #b, nh_a_, #op,      \
           nh_b_);                                                                                 \
  } while (0)

#define NH_TEST_STR(s) ((s) ? (s) : "(null)")

/* NULL equals only NULL. */
#define ASSERT_EQ_STR(a, b)                                                                        \
  do {                                                                                             \
    const char *nh_a_ = (a), *nh_b_ = (b);                                                         \
    if ((nh_a_ == NULL) != (nh_b_ == NULL) || (nh_a_ && strcmp(nh_a_, nh_b_) != 0))                \
      FAIL("ASSERT_EQ_STR(%s, %s) failed:\n    left:  \"%s\"\n    right: \"%s\"", #a, #b,          \
           NH_TEST_STR(nh_a_), NH_TEST_STR(nh_b_));                                                \
  } while (0)

#define ASSERT_NE_STR(a, b)                                                                        \
  do {                                                                                             \
    const char *nh_a_ = (a), *nh_b_ = (b);                                                         \
    if ((nh_a_ == NULL && nh_b_ == NULL) || (nh_a_ && nh_b_ && strcmp(nh_a_, nh_b_) == 0))         \
      FAIL("ASSERT_NE_STR(%s, %s) failed: both are \"%s\"", #a, #b, NH_TEST_STR(nh_a_));           \
  } while (0)

#define ASSERT_CONTAINS(hay, needle)                                                               \
  do {                                                                                             \
    const char *nh_h_ = (hay), *nh_n_ = (needle);                                                  \
    if (!nh_h_ || !strstr(nh_h_, nh_n_))                                                           \
      FAIL("ASSERT_CONTAINS(%s, %s) failed:\n    haystack: \"%s\"\n    needle:   \"%s\"", #hay,    \
           #needle, NH_TEST_STR(nh_h_), nh_n_);                                                    \
  } while (0)

#define ASSERT_NULL(p)                                                                             \
  do {                                                                                             \
    if ((p) != NULL) FAIL("ASSERT_NULL(%s) failed", #p);                                           \
  } while (0)

#define ASSERT_NOT_NULL(p)                                                                         \
  do {                                                                                             \
    if ((p) == NULL) FAIL("ASSERT_NOT_NULL(%s) failed", #p);                                       \
  } while (0)

/* Registers fn(arg) to run after the current test. fn must not assert. */
NH_TEST_UNUSED static void nh_test_on_cleanup(void (*fn)(void *), void *arg)
{
  if (nh_test_ncleanups >= NH_TEST_MAX_CLEANUPS) FAIL("too many cleanups (raise NH_TEST_MAX_CLEANUPS)");
  nh_test_cleanups[nh_test_ncleanups].fn = fn;
  nh_test_cleanups[nh_test_ncleanups].arg = arg;
  nh_test_ncleanups++;
}

/* Unregisters a cleanup that the test already ran itself. */
NH_TEST_UNUSED static void nh_test_cancel_cleanup(void (*fn)(void *), void *arg)
{
  for (int i = nh_test_ncleanups - 1; i >= 0; i--)
    if (nh_test_cleanups[i].fn == fn && nh_test_cleanups[i].arg == arg) {
      memmove(&nh_test_cleanups[i], &nh_test_cleanups[i + 1], sizeof nh_test_cleanups[0] * (size_t)(nh_test_ncleanups - i - 1));
      nh_test_ncleanups--;
      return;
    }
}

static void nh_test_run_cleanups(void)
{
  while (nh_test_ncleanups > 0) {
    nh_test_ncleanups--;
    nh_test_cleanups[nh_test_ncleanups].fn(nh_test_cleanups[nh_test_ncleanups].arg);
  }
}

/* ---------------------------------------------------------------- temp directories */

NH_TEST_UNUSED static const char *nh_test_tmpdir(void) { return nh_test_dir; }

/* "<tmpdir>/<name>" in one of 8 rotating static buffers (enough for one expression). */
NH_TEST_UNUSED static const char *nh_test_path(const char *name)
{
  static char bufs[8][PATH_MAX + 64];
  static int next;
  char *b = bufs[next++ & 7];
  snprintf(b, sizeof bufs[0], "%s/%s", nh_test_dir, name);
  return b;
}

static int nh_test_rm_cb(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
  (void)sb; (void)flag; (void)ftw;
  return remove(path);
}

NH_TEST_UNUSED static void nh_test_rmtree(const char *dir) { nftw(dir, nh_test_rm_cb, 16, FTW_DEPTH | FTW_PHYS); }

NH_TEST_UNUSED static int nh_test_mkdir_fresh(void)
{
  const char *base = getenv("TMPDIR");
  if (!base || !*base) base = "/tmp";
  snprintf(nh_test_dir, sizeof nh_test_dir, "%s/nh-test-XXXXXX", base);
  return mkdtemp(nh_test_dir) ? 0 : -1;
}

/* Writes a whole file; returns 0 on success. */
NH_TEST_UNUSED static int nh_test_write_file(const char *path, const char *text)
{
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  size_t n = strlen(text);
  int ok = fwrite(text, 1, n, f) == n;
  return (fclose(f) == 0 && ok) ? 0 : -1;
}

/* Reads a whole file into a static buffer; "" when missing. */
NH_TEST_UNUSED static const char *nh_test_read_file(const char *path)
{
  static char buf[1 << 16];
  buf[0] = '\0';
  FILE *f = fopen(path, "r");
  if (!f) return buf;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = '\0';
  fclose(f);
  return buf;
}

/* stderr captured into a file of the test's own, for tests that check log lines:
 * nh_test_capture_end puts it back and shows what was captured when the test failed. */
typedef struct nh_test_capture {
  int saved;                  /* the real stderr while capturing, else -1 */
  char path[PATH_MAX + 64];
} nh_test_capture_t;

NH_TEST_UNUSED static void nh_test_capture_start(nh_test_capture_t *c)
{
  snprintf(c->path, sizeof c->path, "%s", nh_test_path("log.txt"));
  fflush(stderr);
  c->saved = dup(2);
  int fd = open(c->path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ASSERT_TRUE(c->saved >= 0 && fd >= 0);
  dup2(fd, 2);
  close(fd);
}

NH_TEST_UNUSED static void nh_test_capture_end(nh_test_capture_t *c)
{
  if (c->saved < 0) return;
  fflush(stderr);
  dup2(c->saved, 2);
  close(c->saved);
  c->saved = -1;
  if (nh_test_failed_now) fputs(nh_test_read_file(c->path), stderr);
}

NH_TEST_UNUSED static int64_t nh_test_mono_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---------------------------------------------------------------- runner */

static int nh_test_selected(const char *name, int argc, char **argv)
{
  if (argc <= 1) return 1;
  for (int i = 1; i < argc; i++)
    if (strstr(name, argv[i])) return 1;
  return 0;
}

/* setjmp lives in its own frame so no local of the runner is live across longjmp. */
static void nh_test_run_one(const nh_test_case_t *tc)
{
  if (setjmp(nh_test_jmp) == 0) tc->fn();
}

static int nh_test_run_all(int argc, char **argv)
{
  int passed = 0, failed = 0;
  setvbuf(stdout, NULL, _IOLBF, 0);
  for (int i = 0; i < nh_test_ncases; i++) {
    const nh_test_case_t *tc = &nh_test_cases[i];
    if (!nh_test_selected(tc->name, argc, argv)) continue;
    nh_test_current = tc->name;
    nh_test_failed_now = 0;
    if (nh_test_mkdir_fresh()) {
      fprintf(stderr, "%s: cannot create a temp directory under $TMPDIR or /tmp\n", tc->name);
      failed++;
      continue;
    }
    int64_t t0 = nh_test_mono_ms();
    nh_test_run_one(tc);
    nh_test_run_cleanups();
    int64_t dt = nh_test_mono_ms() - t0;
    if (getenv("NH_TEST_KEEP")) fprintf(stderr, "%s: kept %s\n", tc->name, nh_test_dir);
    else nh_test_rmtree(nh_test_dir);
    if (nh_test_failed_now) {
      printf("FAIL %s (%lld ms)\n", tc->name, (long long)dt);
      failed++;
    } else {
      printf("ok   %s (%lld ms)\n", tc->name, (long long)dt);
      passed++;
    }
  }
  nh_test_current = NULL;
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}

/* Every test runs on the sqlite VFS the host runs on (core/nh_sqlite_vfs.h). */
int nh_sqlite_vfs_install(void);
#define NH_TEST_MAIN()                                                                             \
  int main(int argc, char **argv)                                                                  \
  {                                                                                                \
    nh_sqlite_vfs_install();                                                                       \
    return nh_test_run_all(argc, argv);                                                            \
  }

#endif
