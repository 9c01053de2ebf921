/* Logging (nh_log.h) to stderr, one line per call: "ts level [subsys] msg k=v ...", or a
 * JSON object with ts, level, subsys, msg and the fields; calls below the set level
 * (default info) print nothing. A line is built in memory and written with one fwrite,
 * so lines of this process never interleave. */
#include "nh_log.h"
#include "nh_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int log_json;
static nh_log_level_t log_min = NH_LOG_INFO;

static const char *const level_names[] = { "debug", "info", "warn", "error" };

/* Names the line's own members take: a field of that name would make a second one. */
static const char *const reserved[] = { "ts", "level", "subsys", "msg" };

void nh_log_set_json(int on) { log_json = on; }
void nh_log_set_level(nh_log_level_t level) { log_min = level; }
int nh_log_enabled(nh_log_level_t level) { return level >= log_min; }

/* The line being built: on the stack while it fits, on the heap past that, so a long
 * error or traceback is never cut (a cut JSON line would not parse). */
typedef struct line {
  char *buf;
  size_t len, cap;
  char small[1024];
} line_t;

static void put(line_t *l, const char *s, size_t n)
{
  if (l->len + n > l->cap) {
    size_t cap = l->cap * 2 > l->len + n ? l->cap * 2 : l->len + n;
    char *b = nh_xmalloc(cap);
    memcpy(b, l->buf, l->len);
    if (l->buf != l->small) free(l->buf);
    l->buf = b;
    l->cap = cap;
  }
  memcpy(l->buf + l->len, s, n);
  l->len += n;
}

static void puts_(line_t *l, const char *s) { put(l, s, strlen(s)); }

static void putf(line_t *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void putf(line_t *l, const char *fmt, ...)
{
  char tmp[64];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n > 0) put(l, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

static void put_escaped(line_t *l, const char *s)
{
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') { char e[2] = { '\\', (char)c }; put(l, e, 2); }
    else if (c == '\n') puts_(l, "\\n");
    else if (c == '\t') puts_(l, "\\t");
    else if (c == '\r') puts_(l, "\\r");
    else if (c < 0x20) putf(l, "\\u%04x", c);
    else put(l, (const char *)&c, 1);
  }
}

/* A text value: bare when it has no space, quote or '=' in it, else quoted and escaped. */
static void put_text_value(line_t *l, const char *s)
{
  if (*s && !strpbrk(s, " \t\n\r\"=")) {
    puts_(l, s);
    return;
  }
  puts_(l, "\"");
  put_escaped(l, s);
  puts_(l, "\"");
}

static int is_reserved(const char *key)
{
  for (size_t i = 0; i < sizeof reserved / sizeof reserved[0]; i++)
    if (strcmp(key, reserved[i]) == 0) return 1;
  return 0;
}

static void put_field(line_t *l, const nh_log_field_t *f)
{
  char num[40];
  const char *text = f->str;
  if (f->kind == NH_LF_INT) snprintf(num, sizeof num, "%lld", (long long)f->i), text = num;
  else if (f->kind == NH_LF_NUM) snprintf(num, sizeof num, "%.14g", f->num), text = num;   /* as Lua prints */
  else if (f->kind == NH_LF_BOOL) text = f->i ? "true" : "false";
  if (!text) return;
  if (log_json) {
    puts_(l, ",\"");
    if (is_reserved(f->key)) puts_(l, "field_");   /* never a second "msg" member */
    put_escaped(l, f->key);
    puts_(l, "\":");
    if (f->kind == NH_LF_STR) {
      puts_(l, "\"");
      put_escaped(l, text);
      puts_(l, "\"");
    } else {
      puts_(l, text);
    }
  } else {
    puts_(l, " ");
    puts_(l, f->key);
    puts_(l, "=");
    put_text_value(l, text);
  }
}

static void emit(nh_log_level_t level, const char *subsys, const nh_log_field_t *fields, int n, const char *fmt,
                 va_list ap)
{
  char msg[4096];
  vsnprintf(msg, sizeof msg, fmt, ap);
  char ts[40];
  nh_time_iso8601(nh_time_now_ms(), ts, sizeof ts);
  line_t l;
  l.buf = l.small;
  l.len = 0;
  l.cap = sizeof l.small;
  if (log_json) {
    puts_(&l, "{\"ts\":\"");
    puts_(&l, ts);
    puts_(&l, "\",\"level\":\"");
    puts_(&l, level_names[level]);
    puts_(&l, "\",\"subsys\":\"");
    put_escaped(&l, subsys);
    puts_(&l, "\",\"msg\":\"");
    put_escaped(&l, msg);
    puts_(&l, "\"");
    for (int i = 0; i < n; i++) put_field(&l, &fields[i]);
    puts_(&l, "}\n");
  } else {
    putf(&l, "%s %-5s [", ts, level_names[level]);
    puts_(&l, subsys);
    puts_(&l, "] ");
    puts_(&l, msg);
    for (int i = 0; i < n; i++) put_field(&l, &fields[i]);
    puts_(&l, "\n");
  }
  fwrite(l.buf, 1, l.len, stderr);
  fflush(stderr);
  if (l.buf != l.small) free(l.buf);
}

void nh_log_writev(nh_log_level_t level, const char *subsys, const char *fmt, va_list ap)
{
  if (level < log_min) return;
  emit(level, subsys, NULL, 0, fmt, ap);
}

void nh_log_write(nh_log_level_t level, const char *subsys, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  nh_log_writev(level, subsys, fmt, ap);
  va_end(ap);
}

void nh_log_fields(nh_log_level_t level, const char *subsys, const nh_log_field_t *fields, int n, const char *fmt, ...)
{
  if (level < log_min) return;
  va_list ap;
  va_start(ap, fmt);
  emit(level, subsys, fields, n, fmt, ap);
  va_end(ap);
}
