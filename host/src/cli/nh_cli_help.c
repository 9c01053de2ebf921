/* `nimbus-host --help`: the usage text, to stdout or to a given stream. */
#include "nh_cli.h"

#include <stdio.h>

void nh_cli_help(void) { nh_cli_help_to(stdout); }

void nh_cli_help_to(FILE *out)
{
  fputs(
    "usage:\n"
    "  nimbus-host ADAPTER.lua [MORE.lua ...]   run adapters (same as `nimbus-host run ...`)\n"
    "      --store PATH          store file (default ./nimbus.db, or $NIMBUS_STORE)\n"
    "      --transport URL       embedded (default), or amqp[s]://user:password@host:port[/vhost]\n"
    "                            [?management=URL|none&ca=FILE&verify=0&idle=S&exchange=NAME&profile=servicebus]\n"
    "      --log-format text|json   --log-level debug|info|warn|error   --no-reload\n"
    "      --retention AGE       delete resolved events older than AGE (7d) in the background\n"
    "      --admin ADDR          the operator console and API (http://ADDR/console/, /api/v1): HOST:PORT,\n"
    "                            PORT (0: a free one) or off; default 127.0.0.1:7070, or $NIMBUS_ADMIN\n"
    "      --admin-token-file F  logins (lines of TOKEN ROLE NAME; roles reader, operator): required\n"
    "                            when ADDR is not a loopback address\n"
    "      --metrics on|off      count Prometheus metrics for /metrics (default on)\n"
    "      --otlp URL            export trace spans with OTLP/HTTP (JSON) to URL (http://HOST:4318),\n"
    "                            or $NIMBUS_OTLP; without it only the trace headers travel\n"
    "  nimbus-host console [--store PATH] [--admin ADDR] [--admin-token-file F]\n"
    "                            the console and API for a store, without running adapters\n"
    "  nimbus-host publish TYPE [JSON|@file] [--session S] [--correlation-id C] [--to ENDPOINT] [--raw]\n"
    "      [--transport URL]     send over AMQP; returns once the broker accepted it\n"
    "      [--message-id ID]     idempotent: the same ID within 24 h is stored once\n"
    "      [--traceparent TP [--tracestate TS]]   continue a W3C trace (docs/observability.md)\n"
    "  nimbus-host events [FILTERS] [--limit N] [--count] [--follow] [--json]\n"
    "      --status queued|running   work not finished yet (the embedded queue), oldest first\n"
    "  nimbus-host show EVENT_ID [--json]     history and current state of one event\n"
    "  nimbus-host resubmit EVENT_ID [--body JSON|@file] [--force]   --force: a Completed or Skipped one\n"
    "  nimbus-host resubmit --all FILTERS [--dry-run] [--force]   every matching event, in batches\n"
    "  nimbus-host skip EVENT_ID [--reason WHY] | skip --all FILTERS [--dry-run] [--reason WHY]\n"
    "  nimbus-host failures [--endpoint E] [--json]   unresolved failures grouped by masked error\n"
    "  nimbus-host purge --resolved-before AGE|TIME [--inbox-before AGE|TIME] [--dry-run]\n"
    "                            delete resolved events (Completed, Skipped, Unsupported) and their history\n"
    "  nimbus-host handoff complete EVENT_ID [--result JSON]\n"
    "  nimbus-host handoff fail EVENT_ID --error TEXT [--type T] [--reason WHY]\n"
    "  nimbus-host sessions [--endpoint E] [--blocked] [--json]\n"
    "  nimbus-host [--store PATH] -l SCRIPT.lua [ARGS]\n"
    "                            run a plain Lua script inside the host; its nimbus.publish goes into the store\n"
    "adapter authors:\n"
    "  nimbus-host new NAME\n"
    "                            scaffold NAME/NAME.lua (an endpoint, one handler), NAME/NAME_spec.lua and\n"
    "                            NAME/.luarc.json (editor types); never overwrites\n"
    "  nimbus-host test [SPEC...] [-- BUSTED-OPTIONS]\n"
    "                            busted inside the host with nimbus.testing (default: ./*_spec.lua and spec/);\n"
    "                            exits with busted's status\n"
    "  nimbus-host check ADAPTER.lua [MORE.lua ...]\n"
    "                            load adapters without a store, a transport, a port or a database file and report\n"
    "                            every problem as file:line (exit 1 if any)\n"
    "  nimbus-host --version | --help\n"
    "FILTERS: --endpoint E  --status completed|failed|pending|deferred|deadlettered|unsupported|skipped\n"
    "         --type T  --session S  --error TEXT (substring)  --group G (see failures)\n"
    "         --since T  --before T (last change; ISO-8601 UTC or an age: 30m, 2h, 7d)\n"
    "         --all needs --endpoint, --status or --group; an interrupted --all run picks up where it\n"
    "         stopped when run again.\n"
    "every subcommand takes --store PATH anywhere on its command line.\n"
    "exit codes: 0 ok, 1 runtime failure, 2 usage error.\n",
    out);
}
