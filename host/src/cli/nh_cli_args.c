/* Command-line plumbing shared by the subcommands: option parsing against a per-command
 * spec (--name value or --name=value; --store anywhere, default $NIMBUS_STORE, then
 * ./nimbus.db), usage errors (exit 2), JSON / @file arguments checked before use, and
 * the UTF-8 check for session ids. */
#include "nh_cli.h"
#include "core/nh_util.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int nh_usage_error(const char *cmd, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "nimbus-host%s%s: ", cmd ? " " : "", cmd ? cmd : "");
  vfprintf(stderr, fmt, ap);
  fputs(" (see nimbus-host --help)\n", stderr);
  va_end(ap);
  return NH_EXIT_USAGE;
}

int nh_args_parse(nh_args_t *a, const char *cmd, int argc, char **argv, int first, const nh_opt_spec_t *specs)
{
  memset(a, 0, sizeof *a);
  a->cmd = cmd;
  a->store = getenv("NIMBUS_STORE");
  if (!a->store || !*a->store) a->store = "./nimbus.db";
  int only_pos = 0;
  for (int i = first; i < argc; i++) {
    const char *s = argv[i];
    if (!only_pos && strcmp(s, "--") == 0) {
      only_pos = 1;
      continue;
    }
    if (only_pos || s[0] != '-' || s[1] == '\0') {
      if (a->npos == 64) return nh_usage_error(cmd, "too many arguments");
      a->pos[a->npos++] = s;
      continue;
    }
    /* --name=value is accepted as well as --name value */
    char name[64];
    const char *eq = strchr(s, '=');
    const char *inline_val = NULL;
    if (eq && eq - s < (long)sizeof name) {
      memcpy(name, s, (size_t)(eq - s));
      name[eq - s] = '\0';
      inline_val = eq + 1;
    } else {
      snprintf(name, sizeof name, "%s", s);
    }
    int takes = -1;
    if (strcmp(name, "--store") == 0) takes = 1;
    for (const nh_opt_spec_t *sp = specs; sp && sp->name && takes < 0; sp++)
      if (strcmp(sp->name, name) == 0) takes = sp->takes_value;
    if (takes < 0) return nh_usage_error(cmd, "unknown option %s", name);
    const char *val = NULL;
    if (takes) {
      if (inline_val) val = inline_val;
      else if (i + 1 < argc) val = argv[++i];
      else return nh_usage_error(cmd, "option %s needs a value", name);
    } else if (inline_val) {
      return nh_usage_error(cmd, "option %s takes no value", name);
    }
    if (strcmp(name, "--store") == 0) {
      if (!*val) return nh_usage_error(cmd, "--store needs a path");
      a->store = val;
      continue;
    }
    if (a->nopts == 64) return nh_usage_error(cmd, "too many options");
    a->names[a->nopts] = NULL;
    for (const nh_opt_spec_t *sp = specs; sp && sp->name; sp++)
      if (strcmp(sp->name, name) == 0) a->names[a->nopts] = sp->name;
    a->values[a->nopts++] = val ? val : "";
  }
  return NH_EXIT_OK;
}

const char *nh_args_get(const nh_args_t *a, const char *name)
{
  const char *v = NULL;
  for (int i = 0; i < a->nopts; i++)
    if (strcmp(a->names[i], name) == 0) v = a->values[i];   /* last one wins */
  return v;
}

int nh_args_has(const nh_args_t *a, const char *name) { return nh_args_get(a, name) != NULL; }

int nh_args_long(const char *s, long lo, long hi, long *out)
{
  char *end = NULL;
  long v = strtol(s, &end, 10);
  if (!*s || *end || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

char *nh_cli_json_arg(const char *cmd, const char *what, const char *arg)
{
  char *text;
  if (arg[0] == '@') {
    const char *err = NULL;
    text = nh_file_read(arg + 1, NULL, &err);
    if (!text) {
      nh_usage_error(cmd, "cannot read %s file %s: %s", what, arg + 1, err);
      return NULL;
    }
  } else {
    text = nh_xstrdup(arg);
  }
  json_error_t jerr;
  json_t *j = json_loads(text, JSON_DECODE_ANY, &jerr);
  if (!j) {
    nh_usage_error(cmd, "%s is not valid JSON (line %d, column %d: %s)", what, jerr.line, jerr.column, jerr.text);
    free(text);
    return NULL;
  }
  json_decref(j);
  return text;
}

char *nh_cli_json_object_arg(const char *cmd, const char *what, const char *arg)
{
  char *text = nh_cli_json_arg(cmd, what, arg);
  if (!text) return NULL;
  json_t *j = json_loads(text, JSON_DECODE_ANY, NULL);
  int object = json_is_object(j);
  json_decref(j);
  if (!object) {
    /* the host would dead-letter it ("payload must be a JSON object"): refuse it here */
    nh_usage_error(cmd, "%s must be a JSON object ({...}), as handlers receive it as a table of fields", what);
    free(text);
    return NULL;
  }
  return text;
}

/* Session ids travel in JSON and AMQP strings: they must be UTF-8. */
int nh_cli_valid_utf8(const char *s)
{
  const unsigned char *p = (const unsigned char *)s;
  while (*p) {
    int n = *p < 0x80 ? 0 : (*p >> 5) == 6 ? 1 : (*p >> 4) == 14 ? 2 : (*p >> 3) == 30 ? 3 : -1;
    if (n < 0) return 0;
    p++;
    for (int i = 0; i < n; i++, p++)
      if ((*p & 0xC0) != 0x80) return 0;
  }
  return 1;
}
