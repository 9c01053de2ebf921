/* Logging: one line per event on stderr, text or JSON, with a subsystem tag.
 *
 * A line may carry fields (endpoint, event_id, session, type, error, ...): in text they
 * follow the message as key=value (values with spaces or quotes are quoted); in JSON each
 * is a member of the line's object beside ts, level, subsys and msg, so a log pipeline can
 * filter on them without parsing the message. */
#ifndef NH_LOG_H
#define NH_LOG_H

#include <stdarg.h>
#include <stdint.h>

typedef enum { NH_LOG_DEBUG, NH_LOG_INFO, NH_LOG_WARN, NH_LOG_ERROR } nh_log_level_t;

typedef enum { NH_LF_STR, NH_LF_INT, NH_LF_NUM, NH_LF_BOOL, NH_LF_JSON } nh_log_kind_t;

typedef struct nh_log_field {
  const char *key;
  nh_log_kind_t kind;
  const char *str;     /* NH_LF_STR, NH_LF_JSON (JSON text, written as is in JSON lines); NULL: left out */
  int64_t i;           /* NH_LF_INT, NH_LF_BOOL */
  double num;          /* NH_LF_NUM */
} nh_log_field_t;

#define NH_LOG_STR(k, v) ((nh_log_field_t){ .key = (k), .kind = NH_LF_STR, .str = (v) })
#define NH_LOG_INT(k, v) ((nh_log_field_t){ .key = (k), .kind = NH_LF_INT, .i = (int64_t)(v) })

void nh_log_set_json(int on);
void nh_log_set_level(nh_log_level_t level);
int nh_log_enabled(nh_log_level_t level);
void nh_log_write(nh_log_level_t level, const char *subsys, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void nh_log_writev(nh_log_level_t level, const char *subsys, const char *fmt, va_list ap);
/* A line with fields; fields whose str is NULL (STR, JSON) are left out. */
void nh_log_fields(nh_log_level_t level, const char *subsys, const nh_log_field_t *fields, int n,
                   const char *fmt, ...) __attribute__((format(printf, 5, 6)));

#define nh_log_debug(sub, ...) nh_log_write(NH_LOG_DEBUG, sub, __VA_ARGS__)
#define nh_log_info(sub, ...)  nh_log_write(NH_LOG_INFO, sub, __VA_ARGS__)
#define nh_log_warn(sub, ...)  nh_log_write(NH_LOG_WARN, sub, __VA_ARGS__)
#define nh_log_error(sub, ...) nh_log_write(NH_LOG_ERROR, sub, __VA_ARGS__)

#endif
