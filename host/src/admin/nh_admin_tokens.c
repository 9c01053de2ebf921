/* --admin-token-file (nh_admin_tokens.h). */
#include "nh_admin_tokens.h"
#include "core/nh_util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NH_TOKEN_MIN 16   /* shorter tokens are guessable */

struct nh_admin_tokens {
  nh_admin_token_t *v;
  int n;
};

static int line_error(nh_error_t *err, const char *path, int line, const char *why)
{
  return nh_error_set(err, NH_EUSAGE, "--admin-token-file %s:%d: %s (each line: TOKEN ROLE NAME, ROLE reader or "
                      "operator)", path, line, why);
}

nh_admin_tokens_t *nh_admin_tokens_load(const char *path, nh_error_t *err)
{
  FILE *f = fopen(path, "r");
  if (!f) {
    nh_error_set(err, NH_EUSAGE, "--admin-token-file %s: %s", path, strerror(errno));
    return NULL;
  }
  nh_admin_tokens_t *t = nh_xcalloc(1, sizeof *t);
  char buf[1024];
  int line = 0, bad = 0;
  while (!bad && fgets(buf, sizeof buf, f)) {
    line++;
    char *hash = strchr(buf, '#');
    if (hash) *hash = '\0';
    char *save = NULL, *tok = strtok_r(buf, " \t\r\n", &save);
    if (!tok) continue;
    char *role = strtok_r(NULL, " \t\r\n", &save), *name = strtok_r(NULL, " \t\r\n", &save);
    if (!role || !name) bad = line_error(err, path, line, "expected three fields");
    else if (strtok_r(NULL, " \t\r\n", &save)) bad = line_error(err, path, line, "more than three fields");
    else if (strcmp(role, "reader") != 0 && strcmp(role, "operator") != 0)
      bad = line_error(err, path, line, "unknown role");
    else if (strlen(tok) < NH_TOKEN_MIN) bad = line_error(err, path, line, "the token is shorter than 16 characters");
    if (bad) break;
    t->v = nh_xrealloc(t->v, (size_t)(t->n + 1) * sizeof *t->v);
    t->v[t->n++] = (nh_admin_token_t){ .token = nh_xstrdup(tok), .name = nh_xstrdup(name),
                                       .role = strcmp(role, "operator") == 0 ? NH_ROLE_OPERATOR : NH_ROLE_READER };
  }
  fclose(f);
  if (!bad && t->n == 0) bad = nh_error_set(err, NH_EUSAGE, "--admin-token-file %s: no tokens in it", path);
  if (bad) {
    nh_admin_tokens_free(t);
    return NULL;
  }
  return t;
}

static int same(const char *a, const char *b)
{
  size_t la = strlen(a), lb = strlen(b);
  unsigned char d = la != lb;
  for (size_t i = 0; i < la; i++) d |= (unsigned char)(a[i] ^ b[i % (lb ? lb : 1)]);
  return d == 0;
}

const nh_admin_token_t *nh_admin_tokens_find(const nh_admin_tokens_t *t, const char *token)
{
  const nh_admin_token_t *hit = NULL;
  for (int i = 0; i < t->n; i++)
    if (same(token, t->v[i].token) && !hit) hit = &t->v[i];
  return hit;
}

void nh_admin_tokens_free(nh_admin_tokens_t *t)
{
  if (!t) return;
  for (int i = 0; i < t->n; i++) {
    free(t->v[i].token);
    free(t->v[i].name);
  }
  free(t->v);
  free(t);
}
