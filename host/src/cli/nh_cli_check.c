/* `nimbus-host check ADAPTER.lua...`: loads each adapter in check mode (nh_vm_check: no
 * store, no transport, no port, no database file, nothing sent) and reports every
 * problem it finds, each as "file:line: message", then a one-line summary. Exit 1 when
 * there is a problem, 0 when there is none, 2 for bad arguments.
 *
 * In one adapter: syntax errors, an error raised by the main chunk, and what the runtime
 * records in check mode instead of raising (unknown or bad options of nimbus.endpoint,
 * ep:on / ep:command / ep:reply, ep:checker and nimbus.every, with "did you mean"; a
 * second handler for a type; a checker on an endpoint that handles nothing). Across
 * adapters: an endpoint defined twice, and a command with two consuming endpoints. The
 * endpoint options also go through the host's own parser (dispatch/nh_endpoint.c), so
 * check refuses exactly what `nimbus-host run` would. */
#include "nh_cli.h"
#include "core/nh_runtime.h"
#include "core/nh_util.h"
#include "dispatch/nh_dispatch_int.h"
#include "lua/nh_vm.h"

#include <ctype.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---------------------------------------------------------------- the check vm host */

static int check_register(void *data, nh_vm_t *vm, lua_State *L, const char *name, int opts, nh_error_t *err)
{
  (void)data;
  (void)vm;
  nh_endpoint_t *ep = nh_xcalloc(1, sizeof *ep);
  ep->name = nh_xstrdup(name);
  int rc = nh_endpoint_parse(ep, L, opts, err);
  nh_endpoint_free(ep);
  return rc;
}

/* Publishes at load time are accepted and dropped: nothing is sent in check mode. */
static int check_publish(void *data, void *task_data, const char *type, const char *body, size_t body_len,
                         const char *session, const char *correlation_id, const char *to, const char *given_id,
                         char message_id[37], int *duplicate, nh_later_t *later, nh_error_t *err)
{
  (void)data, (void)task_data, (void)type, (void)body, (void)body_len, (void)session, (void)correlation_id;
  (void)to, (void)given_id, (void)duplicate, (void)later, (void)err;
  nh_uuid_v7(message_id);
  return NH_OK;
}

static int check_retention(void *data, const char *resolved, const char *inbox, nh_error_t *err)
{
  (void)data;
  if (resolved && nh_duration_parse_ms(resolved) <= 0)
    return nh_error_set(err, NH_EUSAGE, "resolved = %s: give an age of 1s or more, such as \"7d\", \"12h\" or \"30m\"",
                        resolved);
  if (inbox && nh_duration_parse_ms(inbox) <= 0)
    return nh_error_set(err, NH_EUSAGE, "inbox = %s: give an age of 1s or more, such as \"30d\"", inbox);
  return NH_OK;
}

/* ---------------------------------------------------------------- reports */

typedef struct decl {
  const char *adapter, *endpoint, *type, *kind, *where;   /* borrowed from the reports */
} decl_t;

typedef struct check {
  json_t *reports;            /* one per adapter, kept for the cross-adapter pass */
  int problems, endpoints, handlers, checkers;
} check_t;

static const char *str(json_t *o, const char *k)
{
  const char *v = json_string_value(json_object_get(o, k));
  return v ? v : "?";
}

static void problem(check_t *c, const char *where, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void problem(check_t *c, const char *where, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  if (where && *where) printf("%s: ", where);
  vprintf(fmt, ap);
  putchar('\n');
  va_end(ap);
  c->problems++;
}

/* Prints one adapter's own problems and counts what it declares. */
static void report_adapter(check_t *c, const char *path, json_t *r)
{
  size_t i;
  json_t *p, *ep;
  json_array_foreach(json_object_get(r, "problems"), i, p) problem(c, str(p, "where"), "%s", str(p, "message"));
  const char *error = json_string_value(json_object_get(r, "error"));
  if (error) {
    /* syntax and runtime errors read "file:line: message" (Lua shortens a long path);
     * anything else gets the adapter's path */
    const char *at = strstr(error, ".lua:");
    problem(c, at && isdigit((unsigned char)at[5]) ? NULL : path, "%s", error);
  }
  json_array_foreach(json_object_get(r, "endpoints"), i, ep) {
    c->endpoints++;
    c->handlers += (int)json_array_size(json_object_get(ep, "handlers"));
    c->checkers += (int)json_array_size(json_object_get(ep, "checkers"));
  }
}

/* Across adapters: an endpoint defined twice; a command with more than one consumer
 * (the host refuses both at start). */
static void report_across(check_t *c)
{
  size_t n = 0, i, j, k;
  json_t *r, *ep, *h;
  json_array_foreach(c->reports, i, r) json_array_foreach(json_object_get(r, "endpoints"), j, ep)
    n += json_array_size(json_object_get(ep, "handlers")) + 1;
  decl_t *d = nh_xcalloc(n + 1, sizeof *d);
  size_t nd = 0;
  json_array_foreach(c->reports, i, r) {
    json_array_foreach(json_object_get(r, "endpoints"), j, ep) {
      const char *name = str(ep, "name"), *where = str(ep, "where");
      for (size_t x = 0; x < nd; x++)
        if (!d[x].type && strcmp(d[x].endpoint, name) == 0) {
          problem(c, where, "nimbus.endpoint(%s): endpoint %s is already defined by another adapter (at %s); an "
                  "endpoint is defined once per host: rename one", name, name, d[x].where);
          break;
        }
      d[nd++] = (decl_t){ .endpoint = name, .where = where };
      json_array_foreach(json_object_get(ep, "handlers"), k, h)
        d[nd++] = (decl_t){ .endpoint = name, .type = str(h, "type"), .kind = str(h, "kind"), .where = str(h, "where") };
    }
  }
  /* d[x] against every earlier declaration of the same type on another endpoint */
  for (size_t x = 0; x < nd; x++) {
    if (!d[x].type) continue;
    for (size_t y = 0; y < x; y++) {
      if (!d[y].type || strcmp(d[x].type, d[y].type) != 0 || strcmp(d[x].endpoint, d[y].endpoint) == 0) continue;
      if (strcmp(d[x].kind, "command") != 0 && strcmp(d[y].kind, "command") != 0) continue;
      problem(c, d[x].where, "%s is a command and can have exactly one consuming endpoint, but %s consumes it (at %s) "
              "and %s too; keep one ep:command(\"%s\", ...) (an event for many endpoints is ep:on on each)",
              d[x].type, d[y].endpoint, d[y].where, d[x].endpoint, d[x].type);
      break;
    }
  }
  free(d);
}

/* ---------------------------------------------------------------- the command */

int nh_cmd_check(int argc, char **argv)
{
  nh_args_t a;
  int rc = nh_args_parse(&a, "check", argc, argv, 2, NULL);
  if (rc) return rc;
  if (a.npos == 0) return nh_usage_error("check", "no adapter given: nimbus-host check ADAPTER.lua [MORE.lua ...]");
  for (int i = 0; i < a.npos; i++)
    if (access(a.pos[i], R_OK) != 0)
      return nh_usage_error("check", "cannot read adapter %s: no such file or not readable", a.pos[i]);

  nh_vm_host_t host = { .register_endpoint = check_register, .publish = check_publish,
                        .set_retention = check_retention };
  check_t c = { .reports = json_array() };
  const char *lua_dir = nh_vm_lua_dir(argv[0]);
  nh_runtime_t rt;
  nh_runtime_init(&rt);
  int status = NH_EXIT_OK;
  for (int i = 0; i < a.npos && status == NH_EXIT_OK; i++) {
    nh_error_t err = {0};
    char *json = nh_vm_check(&rt.loop, a.pos[i], lua_dir, &host, &err);
    json_error_t jerr;
    json_t *r = json ? json_loads(json, 0, &jerr) : NULL;
    free(json);
    if (!r) {
      fprintf(stderr, "nimbus-host check: %s\n", err.msg[0] ? err.msg : "the runtime's report is not JSON");
      status = NH_EXIT_FAIL;
      break;
    }
    report_adapter(&c, a.pos[i], r);
    json_array_append_new(c.reports, r);
  }
  if (status == NH_EXIT_OK) {
    report_across(&c);
    if (c.problems)
      printf("nimbus-host check: %d problem%s in %d adapter%s\n", c.problems, c.problems == 1 ? "" : "s", a.npos,
             a.npos == 1 ? "" : "s");
    else
      printf("nimbus-host check: %d adapter%s, %d endpoint%s, %d handler%s, %d checker%s: no problems\n", a.npos,
             a.npos == 1 ? "" : "s", c.endpoints, c.endpoints == 1 ? "" : "s", c.handlers, c.handlers == 1 ? "" : "s",
             c.checkers, c.checkers == 1 ? "" : "s");
    status = c.problems ? NH_EXIT_FAIL : NH_EXIT_OK;
  }
  json_decref(c.reports);
  nh_runtime_close(&rt);
  return status;
}
