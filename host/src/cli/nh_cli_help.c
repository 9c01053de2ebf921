#include "nh_cli.h"

#include <stdio.h>

void nh_cli_help(void)
{
  fputs(
    "usage:\n"
    "  nimbus-host ADAPTER.lua [MORE.lua ...]   run adapters (same as `nimbus-host run ...`)\n"
    "      --store PATH          store file (default ./nimbus.db, or $NIMBUS_STORE)\n"
    "      --transport URL       embedded (default), or amqp[s]://user:password@host:port[/vhost]\n"
    "                            [?management=URL|none&ca=FILE&verify=0&idle=S&exchange=NAME&profile=servicebus]\n"
    "      --log-format text|json   --log-level debug|info|warn|error   --no-reload\n"
    "  nimbus-host publish TYPE [JSON|@file] [--session S] [--correlation-id C] [--to ENDPOINT] [--raw]\n"
    "      [--transport URL]     send over AMQP; returns once the broker accepted it\n"
    "  nimbus-host events [--endpoint E] [--status failed|pending|deferred|...] [--session S] [--json]\n"
    "  nimbus-host show EVENT_ID [--json]     history and current state of one event\n"
    "  nimbus-host resubmit EVENT_ID [--body JSON|@file]\n"
    "  nimbus-host skip EVENT_ID\n"
    "  nimbus-host handoff complete EVENT_ID [--result JSON]\n"
    "  nimbus-host handoff fail EVENT_ID --error TEXT [--type T]\n"
    "  nimbus-host sessions [--endpoint E] [--blocked] [--json]\n"
    "  nimbus-host -l SCRIPT.lua [ARGS]       run a plain Lua script inside the host\n"
    "  nimbus-host --version | --help\n"
    "every subcommand takes --store PATH anywhere on its command line.\n"
    "exit codes: 0 ok, 1 runtime failure, 2 usage error.\n",
    stdout);
}
