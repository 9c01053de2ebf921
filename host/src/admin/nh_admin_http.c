/* The admin listener's answers and request parsing (nh_admin_int.h). */
#include "nh_admin_int.h"
#include "core/nh_util.h"

#include <curl/curl.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

void nh_admin_answer_retry(nh_httpd_req_t *r, unsigned status, json_t *body, const char *retry_after)
{
  nh_admin_answer_t *kept = nh_admin_capturing();
  if (kept) {   /* on the pool: the loop sends it (nh_admin_pg.c) */
    json_decref(kept->body);
    kept->status = status;
    kept->body = body;
    snprintf(kept->retry_after, sizeof kept->retry_after, "%s", retry_after ? retry_after : "");
    return;
  }
  char *s = json_dumps(body, JSON_COMPACT | JSON_PRESERVE_ORDER);
  json_decref(body);
  const nh_httpd_header_t hdrs[] = { { "Content-Type", "application/json" },
                                     { "Cache-Control", "no-store" },
                                     { "X-Content-Type-Options", "nosniff" },
                                     { "Retry-After", retry_after } };
  nh_error_t err = {0};
  nh_httpd_respond(r, status, hdrs, retry_after && *retry_after ? 4 : 3, s ? s : "{}", s ? strlen(s) : 2, &err);
  free(s);
}

void nh_admin_answer(nh_httpd_req_t *r, unsigned status, json_t *body)
{
  nh_admin_answer_retry(r, status, body, NULL);
}

void nh_admin_error(nh_httpd_req_t *r, unsigned status, const char *field, const char *fmt, ...)
{
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  json_t *o = json_object();
  json_object_set_new(o, "error", json_string(msg));
  if (field) json_object_set_new(o, "field", json_string(field));
  nh_admin_answer(r, status, o);
}

void nh_admin_store_error(nh_admin_call_t *c)
{
  nh_admin_error(c->r, 500, NULL, "store: %s", c->pg ? c->pg_err : nh_store_errmsg(c->a->store));
}

char *nh_admin_unescape(const char *s, size_t len)
{
  int n = 0;
  char *u = curl_easy_unescape(NULL, s, (int)len, &n);
  char *out = u ? nh_xstrndup(u, (size_t)n) : nh_xstrndup(s, len);
  curl_free(u);
  return out;
}

const char *nh_admin_param(const nh_admin_call_t *c, const char *key)
{
  for (int i = 0; i < c->q.n; i++)
    if (strcmp(c->q.key[i], key) == 0) return c->q.val[i];
  return NULL;
}

static void list_known(char *buf, size_t len, const char *const *known)
{
  buf[0] = '\0';
  for (int k = 0; known[k]; k++) {
    size_t n = strlen(buf);
    snprintf(buf + n, len - n, "%s%s", k ? ", " : "", known[k]);
  }
}

static int check_names(nh_admin_call_t *c, const char *what, const char *name, const char *const *known)
{
  for (int k = 0; known[k]; k++)
    if (strcmp(name, known[k]) == 0) return 0;
  char list[512];
  list_known(list, sizeof list, known);
  nh_admin_error(c->r, 400, name, "unknown %s %s (known: %s)", what, name, list);
  return 1;
}

int nh_admin_params_check(nh_admin_call_t *c, const char *const *known)
{
  for (int i = 0; i < c->q.n; i++)
    if (check_names(c, "parameter", c->q.key[i], known)) return 1;
  return 0;
}

int nh_admin_fields_check(nh_admin_call_t *c, json_t *in, const char *const *known)
{
  const char *key;
  json_t *v;
  json_object_foreach(in, key, v) {
    if (check_names(c, "field", key, known)) return 1;
  }
  return 0;
}

struct hdr_find {
  const char *want;
  char *value;
};

static void on_header(void *ud, const char *key, size_t klen, const char *val, size_t vlen)
{
  struct hdr_find *h = ud;
  if (!h->value && strlen(h->want) == klen && strncasecmp(key, h->want, klen) == 0)
    h->value = nh_xstrndup(val ? val : "", val ? vlen : 0);
}

char *nh_admin_header(nh_httpd_req_t *r, const char *name)
{
  if (nh_admin_capturing()) return nh_admin_pg_header(name);   /* on the pool: not the loop's connection */
  struct hdr_find h = { name, NULL };
  nh_httpd_req_headers(r, on_header, &h);
  return h.value;
}

json_t *nh_admin_body_object(nh_admin_call_t *c)
{
  size_t len = 0;
  const char *raw = nh_httpd_req_body(c->r, &len);
  if (!len) return json_object();
  json_error_t jerr;
  json_t *in = json_loadb(raw, len, 0, &jerr);
  if (!in) {
    nh_admin_error(c->r, 400, NULL, "the body is not JSON: %s (line %d, column %d)", jerr.text, jerr.line,
                   jerr.column);
    return NULL;
  }
  if (!json_is_object(in)) {
    nh_admin_error(c->r, 400, NULL, "the body must be a JSON object");
    json_decref(in);
    return NULL;
  }
  return in;
}

int nh_admin_parse_long(nh_admin_call_t *c, const char *field, const char *s, long lo, long hi, long *out)
{
  char *end = NULL;
  long v = s ? strtol(s, &end, 10) : 0;
  if (!s || !*s || *end || v < lo || v > hi) {
    nh_admin_error(c->r, 400, field, "%s %s: a whole number from %ld to %ld", field, s ? s : "(empty)", lo, hi);
    return 1;
  }
  *out = v;
  return 0;
}


/* What identifies the store's state: this connection's changes, and data_version, which
 * moves when another connection (another host, the CLI) commits. */
static void store_key(nh_admin_t *a, int64_t *changes, int64_t *version)
{
  sqlite3 *db = nh_store_db(a->store);
  *changes = sqlite3_total_changes64(db);
  *version = -1;
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(db, "PRAGMA data_version", -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
    *version = sqlite3_column_int64(st, 0);
  sqlite3_finalize(st);
}

json_t *nh_admin_cache_get(nh_admin_t *a, nh_admin_cached_t *c)
{
  store_key(a, &c->next_changes, &c->next_version);
  if (!c->v || c->next_changes != c->changes || c->next_version != c->version ||
      nh_time_now_ms() - c->at >= NH_ADMIN_CACHE_MS)
    return NULL;
  return json_incref(c->v);
}

void nh_admin_cache_put(nh_admin_t *a, nh_admin_cached_t *c, json_t *v)
{
  json_decref(c->v);
  c->v = json_incref(v);
  c->changes = c->next_changes;
  c->version = c->next_version;
  c->at = nh_time_now_ms();
  (void)a;
}

void nh_admin_cache_clear(nh_admin_cached_t *c)
{
  json_decref(c->v);
  c->v = NULL;
}
