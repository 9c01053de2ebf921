/* Logging: one line per event on stderr, text or JSON, with a subsystem tag. */
#ifndef NH_LOG_H
#define NH_LOG_H

#include <stdarg.h>

typedef enum { NH_LOG_DEBUG, NH_LOG_INFO, NH_LOG_WARN, NH_LOG_ERROR } nh_log_level_t;

void nh_log_set_json(int on);
void nh_log_set_level(nh_log_level_t level);
void nh_log_write(nh_log_level_t level, const char *subsys, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void nh_log_writev(nh_log_level_t level, const char *subsys, const char *fmt, va_list ap);

#define nh_log_debug(sub, ...) nh_log_write(NH_LOG_DEBUG, sub, __VA_ARGS__)
#define nh_log_info(sub, ...)  nh_log_write(NH_LOG_INFO, sub, __VA_ARGS__)
#define nh_log_warn(sub, ...)  nh_log_write(NH_LOG_WARN, sub, __VA_ARGS__)
#define nh_log_error(sub, ...) nh_log_write(NH_LOG_ERROR, sub, __VA_ARGS__)

#endif
