/* `nimbus-host new NAME`: scaffolds an adapter a new user can run, test and check at once:
 * NAME/NAME.lua (an endpoint with one handler), NAME/NAME_spec.lua (a nimbus.testing spec
 * that passes) and NAME/.luarc.json (LuaLS: Lua 5.4, the nimbus type definitions of this
 * host's lua/types, busted's). Nothing is overwritten: when one of the files exists the
 * command refuses before writing any. */
#include "nh_cli.h"
#include "core/nh_util.h"
#include "lua/nh_vm.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NAME_MAX_LEN 64

static const char adapter_tpl[] =
  "-- @NAME@: a nimbus-host adapter (made by `nimbus-host new @NAME@`).\n"
  "--\n"
  "--   nimbus-host @NAME@.lua                run it (the store ./nimbus.db is created on first use)\n"
  "--   nimbus-host publish @TYPE@ '{\"name\":\"Ada\"}' --session ada\n"
  "--   nimbus-host events                    what became of each event\n"
  "--   nimbus-host test                      run @NAME@_spec.lua\n"
  "--   nimbus-host check @NAME@.lua          find mistakes in it without running it\n"
  "local nimbus = require(\"nimbus\")\n"
  "\n"
  "-- A failed event is retried (here 3 times, 1 s, 2 s, 4 s apart), then it blocks its\n"
  "-- session until an operator resubmits or skips it (nimbus-host failures).\n"
  "local ep = nimbus.endpoint(\"@EP@\", {\n"
  "  retry = { max_retries = 3, strategy = \"exponential\", base = 1 },\n"
  "})\n"
  "\n"
  "-- One handler per event type: `event` is the decoded JSON payload, `ctx` where it came\n"
  "-- from (ctx.event_id, ctx.session_id, ctx.retry_count...). Returning normally completes\n"
  "-- the event; an error fails it.\n"
  "ep:on(\"@TYPE@\", function(event, ctx)\n"
  "  if type(event.name) ~= \"string\" or event.name == \"\" then\n"
  "    -- it can never succeed: dead-lettered at once, and its session is not blocked\n"
  "    error(nimbus.permanent(\"@TYPE@ needs a name\"))\n"
  "  end\n"
  "  nimbus.log.info(\"hello\", { name = event.name, session = ctx.session_id })\n"
  "end)\n";

static const char spec_tpl[] =
  "-- Specs for @NAME@.lua on nimbus.testing (no broker, no store, a fake clock and fake\n"
  "-- HTTP). `nimbus-host test` runs them with busted inside the host.\n"
  "local testing = require(\"nimbus.testing\")\n"
  "\n"
  "-- the adapter beside this file, wherever busted runs from\n"
  "local here = debug.getinfo(1, \"S\").source:match(\"^@(.*/)\") or \"./\"\n"
  "\n"
  "describe(\"@EP@\", function()\n"
  "  local app\n"
  "  before_each(function() app = testing.load(here .. \"@NAME@.lua\") end)   -- a fresh adapter per test\n"
  "\n"
  "  it(\"says hello to a named sender\", function()\n"
  "    local out = app:send(\"@EP@\", \"@TYPE@\", { name = \"Ada\" }, { session_id = \"ada\" })\n"
  "    testing.assert_completed(out)\n"
  "    assert.matches(\"hello .*name=Ada\", out.logs[1].message)\n"
  "  end)\n"
  "\n"
  "  it(\"dead-letters an event without a name\", function()\n"
  "    testing.assert_dead_lettered(app:send(\"@EP@\", \"@TYPE@\", {}), \"needs a name\")\n"
  "  end)\n"
  "\n"
  "  it(\"dead-letters a payload that is not JSON\", function()\n"
  "    testing.assert_dead_lettered(app:send(\"@EP@\", \"@TYPE@\", \"{oops\"), \"malformed JSON\")\n"
  "  end)\n"
  "end)\n";

/* LuaLS reads ${3rd} as its own bundled library definitions (busted, luassert). */
static const char luarc_tpl[] =
  "{\n"
  "  \"$schema\": \"https://raw.githubusercontent.com/LuaLS/vscode-lua/master/setting/schema.json\",\n"
  "  \"runtime.version\": \"Lua 5.4\",\n"
  "  \"workspace.library\": [\n"
  "    \"@TYPES@\",\n"
  "    \"${3rd}/busted/library\",\n"
  "    \"${3rd}/luassert/library\"\n"
  "  ],\n"
  "  \"workspace.checkThirdParty\": false\n"
  "}\n";

/* "order-sync" -> "OrderSync": the endpoint's name, and its event type's stem. */
static void camel(const char *name, char *out, size_t len)
{
  size_t k = 0;
  int up = 1;
  for (const char *p = name; *p && k + 1 < len; p++) {
    if (*p == '-' || *p == '_') {
      up = 1;
      continue;
    }
    out[k++] = up ? (char)toupper((unsigned char)*p) : *p;
    up = 0;
  }
  out[k] = '\0';
}

/* JSON string contents: the path may hold quotes or backslashes. */
static void json_escape(const char *s, char *out, size_t len)
{
  size_t k = 0;
  for (; *s && k + 7 < len; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') out[k++] = '\\', out[k++] = (char)c;
    else if (c < 0x20) k += (size_t)snprintf(out + k, len - k, "\\u%04x", c);
    else out[k++] = (char)c;
  }
  out[k] = '\0';
}

typedef struct subst {
  const char *key, *value;
} subst_t;

static char *expand(const char *tpl, const subst_t *subs, int n)
{
  size_t cap = strlen(tpl) + 1;
  for (const char *p = tpl; (p = strchr(p, '@')); p++)
    for (int i = 0; i < n; i++)
      if (strncmp(p, subs[i].key, strlen(subs[i].key)) == 0) cap += strlen(subs[i].value);
  char *out = nh_xmalloc(cap), *o = out;
  for (const char *p = tpl; *p;) {
    int hit = 0;
    for (int i = 0; i < n && !hit; i++) {
      size_t kl = strlen(subs[i].key);
      if (strncmp(p, subs[i].key, kl) == 0) {
        size_t vl = strlen(subs[i].value);
        memcpy(o, subs[i].value, vl);
        o += vl;
        p += kl;
        hit = 1;
      }
    }
    if (!hit) *o++ = *p++;
  }
  *o = '\0';
  return out;
}

/* Creates path with `text`; never replaces an existing file (O_EXCL). */
static int write_new(const char *path, const char *text)
{
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (fd < 0) {
    fprintf(stderr, "nimbus-host new: cannot create %s: %s\n", path, strerror(errno));
    return -1;
  }
  size_t len = strlen(text), off = 0;
  while (off < len) {
    ssize_t w = write(fd, text + off, len - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      fprintf(stderr, "nimbus-host new: cannot write %s: %s\n", path, strerror(errno));
      close(fd);
      return -1;
    }
    off += (size_t)w;
  }
  if (close(fd) != 0) {
    fprintf(stderr, "nimbus-host new: cannot write %s: %s\n", path, strerror(errno));
    return -1;
  }
  return 0;
}

/* The directory the .luarc.json points at: this host's lua/types, absolute. */
static void types_dir(const char *argv0, char *out, size_t len)
{
  char dir[PATH_MAX], real[PATH_MAX];
  snprintf(dir, sizeof dir, "%.*s/types", PATH_MAX - 16, nh_vm_lua_dir(argv0));
  snprintf(out, len, "%.*s", PATH_MAX - 1, realpath(dir, real) ? real : dir);
}

int nh_cmd_new(int argc, char **argv)
{
  nh_args_t a;
  int rc = nh_args_parse(&a, "new", argc, argv, 2, NULL);
  if (rc) return rc;
  if (a.npos != 1)
    return nh_usage_error("new", a.npos ? "give one NAME: nimbus-host new NAME" : "missing NAME: nimbus-host new NAME");
  const char *name = a.pos[0];
  int ok = isalpha((unsigned char)name[0]) && strlen(name) <= NAME_MAX_LEN;
  for (const char *p = name; ok && *p; p++) ok = isalnum((unsigned char)*p) || *p == '_' || *p == '-';
  if (!ok)
    return nh_usage_error("new", "NAME %s: start with a letter, then letters, digits, '_' or '-' (at most %d): it "
                                 "names the directory, the files and the endpoint",
                          name, NAME_MAX_LEN);
  char ep[NAME_MAX_LEN + 1], type[NAME_MAX_LEN + 16], types[PATH_MAX], types_json[2 * PATH_MAX];
  camel(name, ep, sizeof ep);
  snprintf(type, sizeof type, "%sRequested", ep);
  types_dir(argv[0], types, sizeof types);
  json_escape(types, types_json, sizeof types_json);

  char paths[3][PATH_MAX];
  snprintf(paths[0], sizeof paths[0], "%s/%s.lua", name, name);
  snprintf(paths[1], sizeof paths[1], "%s/%s_spec.lua", name, name);
  snprintf(paths[2], sizeof paths[2], "%s/.luarc.json", name);
  struct stat sb;
  if (stat(name, &sb) == 0 && !S_ISDIR(sb.st_mode))
    return nh_usage_error("new", "%s exists and is not a directory; choose another NAME", name);
  for (int i = 0; i < 3; i++)
    if (lstat(paths[i], &sb) == 0)
      return nh_usage_error("new", "%s already exists: nothing was written (new never overwrites; choose another "
                                   "NAME or move it away)", paths[i]);
  if (mkdir(name, 0755) != 0 && errno != EEXIST) {
    fprintf(stderr, "nimbus-host new: cannot create directory %s: %s\n", name, strerror(errno));
    return NH_EXIT_FAIL;
  }
  const subst_t subs[] = { { "@NAME@", name }, { "@EP@", ep }, { "@TYPE@", type }, { "@TYPES@", types_json } };
  const char *tpls[3] = { adapter_tpl, spec_tpl, luarc_tpl };
  for (int i = 0; i < 3; i++) {
    char *text = expand(tpls[i], subs, 4);
    int w = write_new(paths[i], text);
    free(text);
    if (w) {
      for (int j = 0; j < i; j++) unlink(paths[j]);   /* all three or none */
      return NH_EXIT_FAIL;
    }
  }
  printf("created %s, %s and %s\n", paths[0], paths[1], paths[2]);
  if (stat(types, &sb) != 0)
    fprintf(stderr, "note: %s does not exist (NIMBUS_LUA_DIR?): editors will not find the nimbus type definitions\n",
            types);
  char cmds[3][PATH_MAX];
  snprintf(cmds[0], sizeof cmds[0], "nimbus-host test");
  snprintf(cmds[1], sizeof cmds[1], "nimbus-host check %s.lua", name);
  snprintf(cmds[2], sizeof cmds[2], "nimbus-host %s.lua", name);
  int w = (int)strlen(cmds[1]) + 2;
  printf("next, in %s/:\n  %-*s# runs %s_spec.lua\n  %-*s# finds mistakes without running it\n"
         "  %-*s# runs it; then, from another terminal there:\n"
         "  nimbus-host publish %s '{\"name\":\"Ada\"}' --session ada && nimbus-host events\n",
         name, w, cmds[0], name, w, cmds[1], w, cmds[2], type);
  return NH_EXIT_OK;
}
