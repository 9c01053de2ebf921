/* Logging (nh_log.h) to stderr, one line per call: "ts level [subsys] msg", or a JSON
 * object with ts, level, subsys and msg; calls below the set level (default info) print
 * nothing. */
#include "nh_log.h"
#include "nh_util.h"

#include <stdio.h>
#include <string.h>

static int log_json;
static nh_log_level_t log_min = NH_LOG_INFO;

static const char *const level_names[] = { "debug", "info", "warn", "error" };

void nh_log_set_json(int on) { log_json = on; }
void nh_log_set_level(nh_log_level_t level) { log_min = level; }

static void json_escape_to(FILE *f, const char *s)
{
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
    else if (c == '\n') fputs("\\n", f);
    else if (c == '\t') fputs("\\t", f);
    else if (c < 0x20) fprintf(f, "\\u%04x", c);
    else fputc(c, f);
  }
}

void nh_log_writev(nh_log_level_t level, const char *subsys, const char *fmt, va_list ap)
{
  if (level < log_min) return;
  char msg[4096];
  vsnprintf(msg, sizeof msg, fmt, ap);
  char ts[40];
  nh_time_iso8601(nh_time_now_ms(), ts, sizeof ts);
  if (log_json) {
    fprintf(stderr, "{\"ts\":\"%s\",\"level\":\"%s\",\"subsys\":\"%s\",\"msg\":\"", ts,
            level_names[level], subsys);
    json_escape_to(stderr, msg);
    fputs("\"}\n", stderr);
  } else {
    fprintf(stderr, "%s %-5s [%s] %s\n", ts, level_names[level], subsys, msg);
  }
  fflush(stderr);
}

void nh_log_write(nh_log_level_t level, const char *subsys, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  nh_log_writev(level, subsys, fmt, ap);
  va_end(ap);
}
