#include "nh_fuzz.h"

#include <stdlib.h>
#include <string.h>

char *nh_fuzz_cstr(const uint8_t *data, size_t size)
{
  char *s = malloc(size + 1);
  memcpy(s, data, size);
  s[size] = '\0';
  return s;
}
