/* Replays inputs through a fuzz target without libFuzzer: each argument is a file or a
 * directory of files. Exits 0 when every input ran (a crash or a sanitizer report ends
 * the process with its own status), 2 when an argument cannot be read. */
#include "nh_fuzz.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int run_file(const char *path)
{
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "fuzz replay: cannot open %s\n", path);
    return 2;
  }
  size_t cap = 4096, n = 0;
  uint8_t *buf = malloc(cap);
  size_t got;
  while ((got = fread(buf + n, 1, cap - n, f)) > 0) {
    n += got;
    if (n == cap) buf = realloc(buf, cap *= 2);
  }
  fclose(f);
  LLVMFuzzerTestOneInput(buf, n);
  free(buf);
  return 0;
}

static int run_path(const char *path, int *count)
{
  struct stat sb;
  if (stat(path, &sb) != 0) {
    fprintf(stderr, "fuzz replay: no such file or directory: %s\n", path);
    return 2;
  }
  if (!S_ISDIR(sb.st_mode)) {
    (*count)++;
    return run_file(path);
  }
  DIR *d = opendir(path);
  if (!d) return 2;
  struct dirent *e;
  int rc = 0;
  while (!rc && (e = readdir(d))) {
    if (e->d_name[0] == '.') continue;   /* ., .., .gitkeep */
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", path, e->d_name);
    rc = run_path(p, count);
  }
  closedir(d);
  return rc;
}

int main(int argc, char **argv)
{
  int count = 0;
  for (int i = 1; i < argc; i++)
    if (run_path(argv[i], &count)) return 2;
  printf("%s: %d inputs replayed\n", argv[0], count);
  return 0;
}
