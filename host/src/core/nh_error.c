/* nh_error_set: fills an nh_error_t (when one is given) and returns the code, so that
 * callers can write `return nh_error_set(err, ...)`. */
#include "nh_error.h"

#include <stdio.h>

int nh_error_set(nh_error_t *err, int code, const char *fmt, ...)
{
  if (err) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    err->code = code;
  }
  return code;
}
