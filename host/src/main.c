/* nimbus-host: CLI entry. Subcommands are in src/cli/. */
#include "cli/nh_cli.h"
#include "core/nh_sqlite.h"
#include "core/nh_sqlite_vfs.h"

#include <malloc.h>
#include <stdio.h>
#include <sqlite3.h>
#include <string.h>
#include <uv.h>

#ifndef NH_VERSION
#define NH_VERSION "0.0.0"
#endif

int main(int argc, char **argv)
{
  /* One thread uses sqlite: no global mutex around every allocation for memory
   * statistics nobody reads (7 % of the host's time under load, make bench). */
  sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0);
  nh_sqlite_use_pool();   /* small blocks recycled by size, not malloc'd (core/nh_sqlite.c) */
  nh_sqlite_vfs_install();   /* a commit's WAL frames in one write (core/nh_sqlite_vfs.h) */
  /* One malloc arena: the loop thread does nearly all allocation, and the one other
   * thread that allocates (the checkpointer's, dispatch/nh_checkpointer.c) got an arena of
   * its own that kept 0.5 MB of the host's RSS for a few allocations a second. */
  mallopt(M_ARENA_MAX, 1);
  if (argc < 2) {
    nh_cli_help_to(stderr);   /* a usage error: stderr, exit 2 */
    return NH_EXIT_USAGE;
  }
  const char *cmd = argv[1];
  if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
    printf("nimbus-host %s (Lua 5.4, libuv %s)\n", NH_VERSION, uv_version_string());
    return NH_EXIT_OK;
  }
  if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
    nh_cli_help();
    return NH_EXIT_OK;
  }
  int script_at = nh_cli_script_at(argc, argv);   /* [--store PATH] -l SCRIPT.lua */
  if (script_at) return nh_cmd_script(argc, argv, script_at);
  if (strcmp(cmd, "new") == 0) return nh_cmd_new(argc, argv);
  if (strcmp(cmd, "test") == 0) return nh_cmd_test(argc, argv);
  if (strcmp(cmd, "check") == 0) return nh_cmd_check(argc, argv);
  if (strcmp(cmd, "run") == 0) return nh_cmd_run(argc, argv, 2);
  if (strcmp(cmd, "publish") == 0) return nh_cmd_publish(argc, argv);
  if (strcmp(cmd, "partitions") == 0) return nh_cmd_partitions(argc, argv);
  if (strcmp(cmd, "events") == 0) return nh_cmd_events(argc, argv);
  if (strcmp(cmd, "show") == 0) return nh_cmd_show(argc, argv);
  if (strcmp(cmd, "resubmit") == 0) return nh_cmd_resubmit(argc, argv);
  if (strcmp(cmd, "skip") == 0) return nh_cmd_skip(argc, argv);
  if (strcmp(cmd, "handoff") == 0) return nh_cmd_handoff(argc, argv);
  if (strcmp(cmd, "sessions") == 0) return nh_cmd_sessions(argc, argv);
  if (strcmp(cmd, "failures") == 0) return nh_cmd_failures(argc, argv);
  if (strcmp(cmd, "purge") == 0) return nh_cmd_purge(argc, argv);
  if (strcmp(cmd, "console") == 0) return nh_cmd_console(argc, argv);
  size_t len = strlen(cmd);
  if (len > 4 && strcmp(cmd + len - 4, ".lua") == 0) return nh_cmd_run(argc, argv, 1);
  if (cmd[0] == '-') {
    /* options before the adapter: nimbus-host --store x.db adapter.lua */
    for (int i = 1; i < argc; i++) {
      size_t l = strlen(argv[i]);
      if (l > 4 && strcmp(argv[i] + l - 4, ".lua") == 0) return nh_cmd_run(argc, argv, 1);
    }
  }
  return nh_usage_error(NULL, "unknown command or option '%s' (adapters end in .lua)", cmd);
}
