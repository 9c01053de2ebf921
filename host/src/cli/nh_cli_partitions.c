/* `nimbus-host partitions ENDPOINT P --transport amqp://...`: changes an endpoint's
 * partition count on RabbitMQ, moving its messages from the old queues to the new ones
 * in order (docs/broker-partitions.md). The work is the transport's
 * (nh_amqp_partitions_migrate); this checks the arguments and reports. */
#include "nh_cli.h"
#include "core/nh_runtime.h"
#include "transport/nh_amqp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define USAGE "usage: nimbus-host partitions ENDPOINT P --transport amqp[s]://user:password@host:port[/vhost] " \
              "[--stall-timeout SECONDS]"
#define NH_PARTITIONS_STALL_S 60   /* a move with nothing read or confirmed for that long stops */

/* P: a power of two from 1 to 256, as nimbus.endpoint takes it; else 0. */
static int parse_partitions(const char *s)
{
  long p;
  if (nh_args_long(s, 1, 256, &p) || (p & (p - 1)) != 0) return 0;
  return (int)p;
}

int nh_cmd_partitions(int argc, char **argv)
{
  static const nh_opt_spec_t specs[] = { { "--transport", 1 }, { "--stall-timeout", 1 }, { NULL, 0 } };
  nh_args_t a;
  int rc = nh_args_parse(&a, "partitions", argc, argv, 2, specs);
  if (rc) return rc;
  if (a.npos != 2) return nh_usage_error("partitions", "expected ENDPOINT and P; " USAGE);
  const char *endpoint = a.pos[0], *transport = nh_args_get(&a, "--transport");
  int partitions = parse_partitions(a.pos[1]);
  if (!*endpoint) return nh_usage_error("partitions", "the endpoint is empty; " USAGE);
  if (!partitions)
    return nh_usage_error("partitions", "P must be a power of two from 1 to 256 (1, 2, 4, ... 256), not %s", a.pos[1]);
  if (!transport || !nh_amqp_is_url(transport))
    return nh_usage_error("partitions", "partitions live on a RabbitMQ broker: give --transport amqp[s]://...; "
                          USAGE);
  long stall_s = NH_PARTITIONS_STALL_S;
  const char *stall = nh_args_get(&a, "--stall-timeout");
  if (stall && nh_args_long(stall, 1, 86400, &stall_s))
    return nh_usage_error("partitions", "--stall-timeout %s: give the seconds (1 to 86400) a move may go without "
                          "moving a message before it stops", stall);
  nh_runtime_t rt;
  nh_runtime_init(&rt);
  char said[2048] = "";
  nh_error_t err = {0};
  rc = nh_amqp_partitions_migrate(&rt.loop, transport, endpoint, partitions, (int)stall_s, said, sizeof said, &err);
  nh_runtime_close(&rt);
  if (rc == NH_OK) {
    printf("%s\n", said);
    return NH_EXIT_OK;
  }
  fprintf(stderr, "nimbus-host partitions: %s\n", err.msg);
  return rc == NH_EUSAGE ? NH_EXIT_USAGE : NH_EXIT_FAIL;
}
