/* The console's files and the OpenAPI document, served from the directory installed with
 * the binary (share/nimbus-host/console), the source tree's console/ when run from a build,
 * or $NIMBUS_CONSOLE_DIR. Nothing is fetched from elsewhere: the page's Content-Security-
 * Policy allows this origin only. */
#include "nh_admin_int.h"
#include "core/nh_util.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NH_STATIC_MAX (4u << 20)   /* the page's files are small; a bigger one is a mistake */

static int has_index(const char *dir)
{
  char p[2 * PATH_MAX + 64];
  struct stat sb;
  snprintf(p, sizeof p, "%s/index.html", dir);
  return stat(p, &sb) == 0;
}

char *nh_admin_console_dir(void)
{
  const char *env = getenv("NIMBUS_CONSOLE_DIR");
  if (env && *env) return has_index(env) ? realpath(env, NULL) : NULL;
  char dir[PATH_MAX];
  if (nh_share_dir("console", dir, sizeof dir) == 0 && has_index(dir)) return realpath(dir, NULL);
#ifdef NH_SOURCE_CONSOLE_DIR
  if (has_index(NH_SOURCE_CONSOLE_DIR)) return realpath(NH_SOURCE_CONSOLE_DIR, NULL);
#endif
  return NULL;
}

static const char *content_type(const char *path)
{
  static const struct { const char *ext, *type; } types[] = {
    { ".html", "text/html; charset=utf-8" }, { ".js", "text/javascript; charset=utf-8" },
    { ".css", "text/css; charset=utf-8" },   { ".json", "application/json" },
    { ".svg", "image/svg+xml" },             { ".png", "image/png" },
    { ".ico", "image/x-icon" },              { ".txt", "text/plain; charset=utf-8" },
  };
  const char *dot = strrchr(path, '.');
  for (size_t i = 0; dot && i < sizeof types / sizeof types[0]; i++)
    if (strcmp(dot, types[i].ext) == 0) return types[i].type;
  return NULL;
}

static void redirect(nh_admin_call_t *c, const char *to)
{
  const nh_httpd_header_t h[] = { { "Location", to }, { "Content-Type", "text/plain; charset=utf-8" } };
  nh_error_t err = {0};
  nh_httpd_respond(c->r, 302, h, 2, to, strlen(to), &err);
}

/* Sends dir/rel when it is a regular file inside dir; 404 otherwise. */
static void send_file(nh_admin_call_t *c, const char *rel)
{
  const char *dir = c->a->console_dir;
  if (!dir) {
    nh_admin_error(c->r, 404, NULL, "the console's files are not installed here (looked in "
                   "share/nimbus-host/console next to the binary; set NIMBUS_CONSOLE_DIR); the API still answers");
    return;
  }
  char want[PATH_MAX + 1024];
  snprintf(want, sizeof want, "%s/%s", dir, rel);
  char *real = strstr(rel, "..") ? NULL : realpath(want, NULL);
  size_t dl = strlen(dir);
  const char *type = real ? content_type(real) : NULL;
  struct stat sb;
  if (!real || strncmp(real, dir, dl) != 0 || real[dl] != '/' || !type || stat(real, &sb) != 0 ||
      !S_ISREG(sb.st_mode) || sb.st_size > (off_t)NH_STATIC_MAX) {
    free(real);
    nh_admin_error(c->r, 404, NULL, "no such file in the console: %s", rel);
    return;
  }
  FILE *f = fopen(real, "rb");
  free(real);
  char *buf = f ? nh_xmalloc((size_t)sb.st_size + 1) : NULL;
  size_t got = f ? fread(buf, 1, (size_t)sb.st_size, f) : 0;
  if (f) fclose(f);
  if (!f || got != (size_t)sb.st_size) {
    free(buf);
    nh_admin_error(c->r, 500, NULL, "cannot read the console's file %s", rel);
    return;
  }
  const nh_httpd_header_t h[] = {
    { "Content-Type", type },
    { "Cache-Control", "no-cache" },
    { "X-Content-Type-Options", "nosniff" },
    { "Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; "
                                 "form-action 'self'" },
    { "Referrer-Policy", "no-referrer" },
  };
  nh_error_t err = {0};
  nh_httpd_respond(c->r, 200, h, sizeof h / sizeof h[0], buf, got, &err);
  free(buf);
}

void nh_admin_get_static(nh_admin_call_t *c)
{
  if (strcmp(c->path, "/") == 0 || strcmp(c->path, "/console") == 0) {
    redirect(c, "/console/");
    return;
  }
  const char *rel = c->path + strlen("/console/");
  char *unesc = nh_admin_unescape(rel, strlen(rel));
  send_file(c, *unesc ? unesc : "index.html");
  free(unesc);
}

void nh_admin_get_openapi(nh_admin_call_t *c)
{
  send_file(c, "openapi.json");
}
