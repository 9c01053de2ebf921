/* `nimbus-host test [SPEC...] [-- BUSTED-OPTIONS]`: runs busted inside the host, so specs
 * have nimbus.testing, the real nimbus.sqlite and the rest of the runtime (what
 * `nimbus-host -l $(command -v busted) SPEC...` does). SPECs are files or directories;
 * without any, the _spec.lua files of the current directory and its spec/ directory. The
 * exit status is busted's. */
#include "nh_cli.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_ARGS 512

/* busted on $PATH, as `command -v busted` finds it; NULL when it is not installed. */
static char *find_busted(char *buf, size_t len)
{
  const char *path = getenv("PATH");
  if (!path || !*path) return NULL;
  while (*path) {
    const char *end = strchr(path, ':');
    size_t n = end ? (size_t)(end - path) : strlen(path);
    struct stat sb;
    if (n == 0) snprintf(buf, len, "./busted");
    else snprintf(buf, len, "%.*s/busted", (int)n, path);
    if (stat(buf, &sb) == 0 && S_ISREG(sb.st_mode) && access(buf, X_OK) == 0) return buf;
    path += n + (end ? 1 : 0);
  }
  return NULL;
}

static int is_spec_name(const char *name)
{
  size_t n = strlen(name);
  return n > 9 && strcmp(name + n - 9, "_spec.lua") == 0;
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The default SPECs: the *_spec.lua files of . (sorted), then spec/ when it is a directory. */
static int default_specs(char **out, int max)
{
  int n = 0;
  DIR *dir = opendir(".");
  if (dir) {
    struct dirent *e;
    while ((e = readdir(dir)) && n < max - 1)
      if (is_spec_name(e->d_name)) out[n++] = strdup(e->d_name);
    closedir(dir);
  }
  qsort(out, (size_t)n, sizeof *out, by_name);
  struct stat sb;
  if (stat("spec", &sb) == 0 && S_ISDIR(sb.st_mode)) out[n++] = strdup("spec");
  return n;
}

int nh_cmd_test(int argc, char **argv)
{
  char *args[MAX_ARGS];
  int nargs = 0, nspecs = 0, own = 0;
  int dashdash = argc;
  for (int i = 2; i < argc; i++)
    if (strcmp(argv[i], "--") == 0) {
      dashdash = i;
      break;
    }
  if (argc > MAX_ARGS - 8) return nh_usage_error("test", "too many arguments");
  /* busted's options (after --) first, then the specs */
  for (int i = dashdash + 1; i < argc; i++) args[nargs++] = argv[i];
  for (int i = 2; i < dashdash; i++) {
    const char *s = argv[i];
    if (strcmp(s, "-h") == 0 || strcmp(s, "--help") == 0) {
      puts("usage: nimbus-host test [SPEC...] [-- BUSTED-OPTIONS]\n"
           "  runs busted inside the host (nimbus.testing, nimbus.sqlite and the rest of the runtime);\n"
           "  SPEC: a *_spec.lua file or a directory; default: ./*_spec.lua and ./spec/\n"
           "  BUSTED-OPTIONS: passed on, e.g. nimbus-host test -- -o TAP --filter=greets\n"
           "  the exit status is busted's (0: every spec passed)");
      return NH_EXIT_OK;
    }
    if (s[0] == '-')
      return nh_usage_error("test", "unknown option %s (busted's own options go after --: nimbus-host test SPEC -- %s)",
                            s, s);
    struct stat sb;
    if (stat(s, &sb) != 0)
      return nh_usage_error("test", "no such spec file or directory: %s", s);
    args[nargs++] = (char *)s;
    nspecs++;
  }
  if (nspecs == 0) {
    own = default_specs(args + nargs, MAX_ARGS - nargs - 1);
    if (own == 0) {
      char cwd[4096];
      return nh_usage_error("test", "no specs here: no *_spec.lua file and no spec/ directory in %s; give the "
                                    "spec files or directories to run",
                            getcwd(cwd, sizeof cwd) ? cwd : ".");
    }
    nargs += own;
  }
  char path[4096];
  const char *busted = find_busted(path, sizeof path);
  if (!busted) {
    fprintf(stderr, "nimbus-host test: busted is not installed (no busted on PATH): install it with "
                    "`apt-get install lua-busted` (Debian) or `luarocks --lua-version 5.4 install busted`, "
                    "then run nimbus-host test again\n");
    for (int i = nargs - own; i < nargs; i++) free(args[i]);
    return NH_EXIT_FAIL;
  }
  int rc = nh_cli_run_lua(argv[0], busted, nargs, args);
  for (int i = nargs - own; i < nargs; i++) free(args[i]);
  return rc;
}
