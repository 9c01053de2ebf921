/* PostgreSQL store URLs: recognising, checking (libpq parses them), masking the password
 * for messages, and the connection target built from one (nh_pg_int.h). */
#include "nh_pg_int.h"
#include "core/nh_log.h"
#include "core/nh_util.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#define NH_PG_FORM "postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?PARAM=VALUE&...]"
#define NH_PG_MAX_ADDRS 8   /* addresses tried per host name, like a short DNS answer */

static const char *const schemes[] = { "postgresql://", "postgres://" };

int nh_pg_url_is(const char *store)
{
  if (!store) return 0;
  for (size_t i = 0; i < sizeof schemes / sizeof schemes[0]; i++)
    if (strncasecmp(store, schemes[i], strlen(schemes[i])) == 0) return 1;
  return 0;
}

/* ---------------------------------------------------------------- masking */

/* A query parameter's name, percent-decoded as libpq decodes it, is "password". */
static int key_is_password(const char *k, const char *end)
{
  char name[16];
  size_t n = 0;
  while (k < end) {
    if (n == sizeof name - 1) return 0;
    if (*k == '%' && end - k >= 3 && isxdigit((unsigned char)k[1]) && isxdigit((unsigned char)k[2])) {
      char hex[3] = { k[1], k[2], 0 };
      name[n++] = (char)strtol(hex, NULL, 16);
      k += 3;
    } else {
      name[n++] = *k++;
    }
  }
  name[n] = '\0';
  return strcasecmp(name, "password") == 0;
}

static const char stars[] = "***";

static char *put(char *o, const char *from, const char *to)
{
  memcpy(o, from, (size_t)(to - from));
  return o + (to - from);
}

/* Masked on the text, not on libpq's parse: the malformed URL libpq cannot parse is the
 * one an error quotes. It errs on the side of masking: from the first ':' after the
 * scheme to the last '@' before the query (a password holding '@' or '/' stays hidden). */
char *nh_pg_url_display(const char *url)
{
  if (!url) return NULL;
  size_t n = strlen(url);
  char *out = nh_xmalloc(2 * n + 16), *o = out;
  const char *end = url + n, *q = strchr(url, '?'), *auth_end = q ? q : end;
  const char *p = url, *sep = strstr(url, "://");
  if (sep && sep < auth_end) {
    const char *a = sep + 3, *at = NULL;
    for (const char *c = a; c < auth_end; c++)
      if (*c == '@') at = c;
    const char *colon = at ? memchr(a, ':', (size_t)(at - a)) : NULL;
    if (colon) {
      o = put(o, url, colon + 1);
      o = put(o, stars, stars + 3);
      p = at;
    }
  }
  o = put(o, p, auth_end);
  if (q) {
    *o++ = '?';
    for (p = q + 1;;) {
      const char *amp = strchr(p, '&'), *pe = amp ? amp : end;
      const char *eq = memchr(p, '=', (size_t)(pe - p));
      if (eq && key_is_password(p, eq)) {
        o = put(o, p, eq + 1);
        o = put(o, stars, stars + 3);
      } else {
        o = put(o, p, pe);
      }
      if (!amp) break;
      *o++ = '&';
      p = amp + 1;
    }
  }
  *o = '\0';
  return out;
}

/* ---------------------------------------------------------------- checking */

static const char *opt(const PQconninfoOption *o, const char *key)
{
  for (; o && o->keyword; o++)
    if (strcmp(o->keyword, key) == 0) return o->val;
  return NULL;
}

/* A comma-separated list of libpq's (host, hostaddr, port): libpq splits them on every
 * comma, without escapes, and so does this. */
static char **split(const char *list, int *n)
{
  int count = 1;
  for (const char *c = list; *c; c++) count += *c == ',';
  char **v = nh_xcalloc((size_t)count, sizeof *v);
  const char *s = list;
  for (int i = 0; i < count; i++) {
    const char *e = strchr(s, ',');
    if (!e) e = s + strlen(s);
    v[i] = nh_xstrndup(s, (size_t)(e - s));
    s = *e ? e + 1 : e;
  }
  *n = count;
  return v;
}

static void free_list(char **v, int n)
{
  for (int i = 0; v && i < n; i++) free(v[i]);
  free(v);
}

static int all_digits(const char *s)
{
  if (!*s) return 0;
  for (; *s; s++)
    if (!isdigit((unsigned char)*s)) return 0;
  return 1;
}

/* What libpq accepts but a store cannot use, or would only find out at connect time. */
static int check_opts(const PQconninfoOption *o, const char *shown, nh_error_t *err)
{
  const char *v = opt(o, "port");
  if (v) {
    int n = 0;
    char **ports = split(v, &n);
    for (int i = 0; i < n; i++) {
      long p = all_digits(ports[i]) ? strtol(ports[i], NULL, 10) : 0;
      if (*ports[i] && (p < 1 || p > 65535)) {
        nh_error_set(err, NH_EUSAGE, "store URL %s: port \"%s\" is not a number from 1 to 65535; write it as %s",
                     shown, ports[i], NH_PG_FORM);
        free_list(ports, n);
        return NH_EUSAGE;
      }
    }
    free_list(ports, n);
  }
  v = opt(o, "connect_timeout");
  if (v && !all_digits(v))
    return nh_error_set(err, NH_EUSAGE, "store URL %s: connect_timeout \"%s\" is not a whole number of seconds "
                        "(0: wait forever)", shown, v);
  if (opt(o, "replication"))
    return nh_error_set(err, NH_EUSAGE, "store URL %s: a replication connection cannot hold a store; remove "
                        "replication= from the URL", shown);
  v = opt(o, "client_encoding");
  if (v && strcasecmp(v, "UTF8") != 0 && strcasecmp(v, "UTF-8") != 0)
    return nh_error_set(err, NH_EUSAGE, "store URL %s: client_encoding %s: the store talks UTF8 to the server; "
                        "remove client_encoding= from the URL", shown, v);
  return NH_OK;
}

/* libpq parses the URL; it recognises the scheme in lower case only. */
static int parse(const char *url, const char *shown, PQconninfoOption **out, nh_error_t *err)
{
  *out = NULL;
  if (!nh_pg_url_is(url))
    return nh_error_set(err, NH_EUSAGE, "store %s is not a PostgreSQL URL: write it as %s", shown ? shown : "(none)",
                        NH_PG_FORM);
  char *norm = nh_xstrdup(url);
  for (char *c = norm; *c && *c != ':'; c++) *c = (char)tolower((unsigned char)*c);
  char *why = NULL;
  PQconninfoOption *o = PQconninfoParse(norm, &why);
  if (!o) {
    /* libpq may quote the URL, password and all: the masked one goes in its place */
    char reason[256];
    const char *at = why ? strstr(why, norm) : NULL;
    if (at) snprintf(reason, sizeof reason, "%.*s%s%s", (int)(at - why), why, shown, at + strlen(norm));
    else snprintf(reason, sizeof reason, "%s", why ? why : "out of memory");
    reason[strcspn(reason, "\n")] = '\0';
    PQfreemem(why);
    free(norm);
    return nh_error_set(err, NH_EUSAGE, "malformed store URL %s: %s; write it as %s", shown, reason, NH_PG_FORM);
  }
  free(norm);
  int rc = check_opts(o, shown, err);
  if (rc) {
    PQconninfoFree(o);
    return rc;
  }
  *out = o;
  return NH_OK;
}

int nh_pg_url_check(const char *url, nh_error_t *err)
{
  char *shown = nh_pg_url_display(url);
  PQconninfoOption *o = NULL;
  int rc = parse(url, shown, &o, err);
  PQconninfoFree(o);
  free(shown);
  return rc;
}

/* ---------------------------------------------------------------- the target */

/* A host entry libpq would look up by name: not a socket directory ('/', or '@' for an
 * abstract socket), not empty (the default socket), not a numeric address. */
static int is_name(const char *h)
{
  unsigned char buf[sizeof(struct in6_addr)];
  return *h && *h != '/' && *h != '@' && inet_pton(AF_INET, h, buf) != 1 && inet_pton(AF_INET6, h, buf) != 1;
}

int nh_pg_target_init(nh_pg_target_t *t, const char *url, nh_error_t *err)
{
  memset(t, 0, sizeof *t);
  t->shown = nh_pg_url_display(url);
  int rc = parse(url, t->shown, &t->opts, err);
  if (rc) return rc;
  /* What libpq fills in for an option the URL leaves out (PGHOST, PGPORT, ...). */
  PQconninfoOption *defs = PQconndefaults();
  const char *host = opt(t->opts, "host"), *hostaddr = opt(t->opts, "hostaddr");
  const char *port = opt(t->opts, "port"), *timeout = opt(t->opts, "connect_timeout");
  const char *service = opt(t->opts, "service");
  if (!host) host = opt(defs, "host");
  if (!hostaddr) hostaddr = opt(defs, "hostaddr");
  if (!port) port = opt(defs, "port");
  if (!timeout) timeout = opt(defs, "connect_timeout");
  if (!service) service = opt(defs, "service");
  t->timeout_s = NH_PG_CONNECT_TIMEOUT_S;
  if (timeout && all_digits(timeout)) t->timeout_s = (int)strtol(timeout, NULL, 10);
  t->host = split(host ? host : "", &t->nhosts);
  int nports = 0;
  char **ports = split(port ? port : "", &nports);
  /* A port list that does not match the hosts is libpq's to report; a service file may
   * name other hosts; a hostaddr given is used as is: none of these is looked up here. */
  int ok = (nports == 1 || nports == t->nhosts) && !(hostaddr && *hostaddr) && !(service && *service);
  t->port = nh_xcalloc((size_t)t->nhosts, sizeof *t->port);
  t->addrs = nh_xcalloc((size_t)t->nhosts, sizeof *t->addrs);
  for (int i = 0; i < t->nhosts; i++) {
    t->port[i] = nh_xstrdup(ports[nports == 1 ? 0 : (i < nports ? i : 0)]);
    if (ok && is_name(t->host[i])) t->lookup = 1;
  }
  free_list(ports, nports);
  PQconninfoFree(defs);
  return NH_OK;
}

void nh_pg_target_free(nh_pg_target_t *t)
{
  free(t->shown);
  PQconninfoFree(t->opts);
  free_list(t->port, t->nhosts);
  free_list(t->addrs, t->nhosts);
  free_list(t->host, t->nhosts);
  free(t->keys);
  free(t->vals);
  for (int i = 0; i < 3; i++) free(t->lists[i]);
  memset(t, 0, sizeof *t);
}

const char *nh_pg_target_name(const nh_pg_target_t *t, int i)
{
  return t->lookup && i < t->nhosts && is_name(t->host[i]) ? t->host[i] : NULL;
}

/* Appends `item` to a comma-separated list (an empty item is kept: ",x" is two entries). */
static void list_add(char **list, int *count, const char *item)
{
  size_t had = *list ? strlen(*list) : 0, n = strlen(item);
  *list = nh_xrealloc(*list, had + n + 2);
  char *o = *list + had;
  if (*count) *o++ = ',';
  memcpy(o, item, n + 1);
  (*count)++;
}

int nh_pg_target_found(nh_pg_target_t *t, int i, const struct addrinfo *ai)
{
  int count = 0;
  for (; ai && count < NH_PG_MAX_ADDRS; ai = ai->ai_next) {
    if (ai->ai_family != AF_INET && ai->ai_family != AF_INET6) continue;
    char ip[64];
    if (getnameinfo(ai->ai_addr, ai->ai_addrlen, ip, sizeof ip, NULL, 0, NI_NUMERICHOST) != 0) continue;
    int seen = 0;   /* one address per protocol comes back once per socket type asked */
    if (t->addrs[i]) {
      int n = 0;
      char **have = split(t->addrs[i], &n);
      for (int k = 0; k < n; k++) seen |= strcmp(have[k], ip) == 0;
      free_list(have, n);
    }
    if (seen) continue;
    list_add(&t->addrs[i], &count, ip);
  }
  return count;
}

void nh_pg_target_params(nh_pg_target_t *t)
{
  int n = 0;
  for (const PQconninfoOption *o = t->opts; o->keyword; o++) n++;
  free(t->keys);
  free(t->vals);
  t->keys = nh_xcalloc((size_t)n + 6, sizeof *t->keys);
  t->vals = nh_xcalloc((size_t)n + 6, sizeof *t->vals);
  int k = 0;
  const char *fallback = "nimbus-host";
  for (const PQconninfoOption *o = t->opts; o->keyword; o++) {
    if (!o->val || strcmp(o->keyword, "client_encoding") == 0) continue;
    if (t->lookup && (!strcmp(o->keyword, "host") || !strcmp(o->keyword, "hostaddr") || !strcmp(o->keyword, "port")))
      continue;
    if (strcmp(o->keyword, "fallback_application_name") == 0) {
      fallback = o->val;
      continue;
    }
    t->keys[k] = o->keyword;
    t->vals[k++] = o->val;
  }
  if (t->lookup) {
    /* Each address of a name becomes an entry of its own, so libpq tries them in turn
     * as it would have tried the addresses it looked up itself. */
    int counts[3] = { 0, 0, 0 };
    for (int i = 0; i < 3; i++) {
      free(t->lists[i]);
      t->lists[i] = NULL;
    }
    for (int i = 0; i < t->nhosts; i++) {
      int na = 0;
      char **addrs = t->addrs[i] ? split(t->addrs[i], &na) : NULL;
      for (int a = 0; a < (addrs ? na : 1); a++) {
        list_add(&t->lists[0], &counts[0], t->host[i]);
        list_add(&t->lists[1], &counts[1], addrs ? addrs[a] : "");
        list_add(&t->lists[2], &counts[2], t->port[i]);
      }
      free_list(addrs, na);
    }
    static const char *const names[3] = { "host", "hostaddr", "port" };
    for (int i = 0; i < 3; i++) {
      t->keys[k] = names[i];
      t->vals[k++] = t->lists[i];
    }
  }
  t->keys[k] = "client_encoding";   /* the store reads and writes UTF8 whatever the server's encoding */
  t->vals[k++] = "UTF8";
  t->keys[k] = "fallback_application_name";   /* pg_stat_activity names us unless the URL says otherwise */
  t->vals[k++] = fallback;
  t->keys[k] = NULL;
  t->vals[k] = NULL;
}

PGconn *nh_pg_target_start(nh_pg_target_t *t)
{
  PGconn *conn = PQconnectStartParams(t->keys, t->vals, 0);
  if (conn) PQsetErrorVerbosity(conn, PQERRORS_VERBOSE);
  return conn;
}

/* The server's notices and warnings go to the host's log, not to libpq's default
 * (stderr, bypassing --log-format json). */
static void on_notice(void *data, const PGresult *res)
{
  (void)data;
  const char *sev = PQresultErrorField(res, PG_DIAG_SEVERITY_NONLOCALIZED);
  const char *code = PQresultErrorField(res, PG_DIAG_SQLSTATE);
  const char *msg = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
  nh_log_level_t level = sev && strcmp(sev, "WARNING") == 0 ? NH_LOG_WARN : NH_LOG_DEBUG;
  nh_log_write(level, "store", "PostgreSQL %s (SQLSTATE %s): %s", sev ? sev : "NOTICE", code ? code : "none",
               msg ? msg : "");
}

void nh_pg_conn_ready(PGconn *conn)
{
  PQsetErrorVerbosity(conn, PQERRORS_DEFAULT);
  PQsetNoticeReceiver(conn, on_notice, NULL);
}

void nh_pg_conn_display(PGconn *conn, char *buf, size_t len)
{
  const char *user = PQuser(conn), *host = PQhost(conn), *port = PQport(conn), *db = PQdb(conn);
  const char *pass = PQpass(conn);
  const char *mask = pass && *pass ? ":***" : "";
  if (!user) user = "";
  if (!db) db = "";
  if (!port) port = "";
  if (!host || !*host) snprintf(buf, len, "postgresql://%s%s@/%s", user, mask, db);
  else if (*host == '/' || *host == '@')
    snprintf(buf, len, "postgresql://%s%s@/%s?host=%s&port=%s", user, mask, db, host, port);
  else if (strchr(host, ':')) snprintf(buf, len, "postgresql://%s%s@[%s]:%s/%s", user, mask, host, port, db);
  else snprintf(buf, len, "postgresql://%s%s@%s:%s/%s", user, mask, host, port, db);
}
