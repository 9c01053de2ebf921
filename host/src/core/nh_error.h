/* Errors at module boundaries: 0 or a negative code, detail in an out-parameter
 * (Neovim's Error / api_set_error). */
#ifndef NH_ERROR_H
#define NH_ERROR_H

#include <stdarg.h>

enum {
  NH_OK = 0,
  NH_EFAIL = -1,     /* runtime failure */
  NH_EUSAGE = -2,    /* bad input from the user */
  NH_ENOTFOUND = -3,
  NH_ESTATE = -4,    /* valid request, wrong state */
};

typedef struct nh_error {
  int code;
  char msg[512];
} nh_error_t;

int nh_error_set(nh_error_t *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
