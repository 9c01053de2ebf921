/* The transport URL parser: amqp[s]://user:password@host:port/vhost?params. */
#include "nh_fuzz.h"
#include "transport/nh_amqp_int.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  char *s = nh_fuzz_cstr(data, size);
  nh_amqp_url_t u;
  memset(&u, 0, sizeof u);
  nh_error_t err = {0};
  nh_amqp_url_parse(s, &u, &err);
  nh_amqp_url_clear(&u);
  free(s);
  return 0;
}
