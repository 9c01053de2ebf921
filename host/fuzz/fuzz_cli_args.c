/* The CLI argument parser and the values it hands on: one argument per line of the
 * input, parsed as `publish` and as `events` options, then every value through the
 * duration, time and UTF-8 checks the commands use. */
#include "nh_fuzz.h"
#include "cli/nh_cli.h"
#include "core/nh_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const nh_opt_spec_t specs[] = {
  { "--session", 1 }, { "--correlation-id", 1 }, { "--to", 1 }, { "--raw", 0 }, { "--message-id", 1 },
  { "--endpoint", 1 }, { "--status", 1 }, { "--since", 1 }, { "--before", 1 }, { "--limit", 1 },
  { "--json", 0 }, { "--all", 0 }, { "--dry-run", 0 }, { NULL, 0 },
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  char *s = nh_fuzz_cstr(data, size);
  char *argv[40];
  int argc = 0;
  argv[argc++] = "nimbus-host";
  argv[argc++] = "publish";
  for (char *p = s, *line; argc < 39 && (line = strsep(&p, "\n"));) argv[argc++] = line;
  argv[argc] = NULL;
  static FILE *devnull;
  if (!devnull) devnull = fopen("/dev/null", "w");
  FILE *saved = stderr;
  stderr = devnull;   /* the parser explains every refusal on stderr */
  nh_args_t a;
  if (nh_args_parse(&a, "publish", argc, argv, 2, specs) == 0) {
    for (int i = 0; i < a.nopts; i++) {
      if (!a.values[i]) continue;
      nh_duration_parse_ms(a.values[i]);
      nh_time_parse_ms(a.values[i], 1764720000000LL);
      nh_cli_valid_utf8(a.values[i]);
    }
    nh_args_get(&a, "--session");
    nh_args_has(&a, "--raw");
  }
  stderr = saved;
  free(s);
  return 0;
}
