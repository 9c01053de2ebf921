/* amqp[s]:// URLs, parsed with libcurl's URL API (curl_url) rather than by hand. */
#include "nh_amqp_int.h"
#include "core/nh_util.h"

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *part(CURLU *h, CURLUPart what)
{
  char *v = NULL;
  if (curl_url_get(h, what, &v, CURLU_URLDECODE) != CURLUE_OK) return NULL;
  char *out = nh_xstrdup(v);
  curl_free(v);
  return out;
}

static char *unescape(const char *s, size_t n)
{
  int len = 0;
  char *v = curl_easy_unescape(NULL, s, (int)n, &len);
  if (!v) return nh_xstrndup(s, n);
  char *out = nh_xstrndup(v, (size_t)len);
  curl_free(v);
  return out;
}

static int query_param(nh_amqp_url_t *u, const char *key, const char *val, nh_error_t *err)
{
  if (strcmp(key, "management") == 0) {
    u->no_management = strcmp(val, "none") == 0;
    free(u->management);
    u->management = nh_xstrdup(val);
    size_t n = strlen(u->management);
    while (n > 0 && u->management[n - 1] == '/') u->management[--n] = '\0';
  } else if (strcmp(key, "ca") == 0) {
    free(u->ca);
    u->ca = nh_xstrdup(val);
  } else if (strcmp(key, "verify") == 0) {
    u->verify = !(strcmp(val, "0") == 0 || strcmp(val, "false") == 0 || strcmp(val, "no") == 0);
  } else if (strcmp(key, "idle") == 0) {
    char *end;
    double s = strtod(val, &end);
    if (*end || s < 0 || s > 3600) return nh_error_set(err, NH_EUSAGE, "idle=%s: give seconds, 0 to 3600", val);
    u->idle_ms = (int)(s * 1000);
  } else if (strcmp(key, "exchange") == 0) {
    if (!*val) return nh_error_set(err, NH_EUSAGE, "exchange= needs a name");
    free(u->exchange);
    u->exchange = nh_xstrdup(val);
  } else if (strcmp(key, "profile") == 0) {
    if (strcmp(val, "servicebus") == 0) u->servicebus = 1;
    else if (strcmp(val, "generic") == 0) u->servicebus = 0;
    else return nh_error_set(err, NH_EUSAGE, "profile=%s: give generic (RabbitMQ and other brokers) or servicebus", val);
  } else if (strcmp(key, "control") == 0) {
    if (strcmp(val, "trusted") == 0) u->trusted_control = 1;
    else if (strcmp(val, "store") == 0) u->trusted_control = 0;
    else return nh_error_set(err, NH_EUSAGE, "control=%s: give store (the default: operator requests come from the "
                             "store only) or trusted (also obey them from the broker)", val);
  } else {
    return nh_error_set(err, NH_EUSAGE,
                        "unknown parameter %s in the transport URL (known: management, ca, verify, idle, exchange, "
                        "profile, control)",
                        key);
  }
  return NH_OK;
}

int nh_amqp_url_parse(const char *s, nh_amqp_url_t *u, nh_error_t *err)
{
  memset(u, 0, sizeof *u);
  u->verify = 1;
  u->idle_ms = 30000;
  CURLU *h = curl_url();
  if (!h) return nh_error_set(err, NH_EFAIL, "out of memory");
  int rc = NH_OK;
  if (curl_url_set(h, CURLUPART_URL, s, CURLU_NON_SUPPORT_SCHEME) != CURLUE_OK) {
    rc = nh_error_set(err, NH_EUSAGE, "--transport %s is not a URL: amqp://user:password@host:5672[/vhost]", s);
    goto out;
  }
  char *scheme = part(h, CURLUPART_SCHEME);
  if (!scheme || (strcmp(scheme, "amqp") != 0 && strcmp(scheme, "amqps") != 0)) {
    free(scheme);
    rc = nh_error_set(err, NH_EUSAGE, "--transport %s: the scheme must be amqp:// or amqps://", s);
    goto out;
  }
  u->tls = strcmp(scheme, "amqps") == 0;
  free(scheme);
  u->host = part(h, CURLUPART_HOST);
  if (!u->host || !*u->host) {
    rc = nh_error_set(err, NH_EUSAGE, "--transport %s: no host", s);
    goto out;
  }
  u->user = part(h, CURLUPART_USER);
  u->password = part(h, CURLUPART_PASSWORD);
  size_t hl = strlen(u->host);
  const char *sfx = ".servicebus.windows.net";
  if (hl > strlen(sfx) && strcmp(u->host + hl - strlen(sfx), sfx) == 0) u->servicebus = 1;   /* ?profile= overrides */
  char *port = part(h, CURLUPART_PORT);
  u->port = port ? atoi(port) : (u->tls ? 5671 : 5672);
  free(port);
  if (u->port <= 0 || u->port > 65535) {
    rc = nh_error_set(err, NH_EUSAGE, "--transport %s: bad port", s);
    goto out;
  }
  char *path = part(h, CURLUPART_PATH);
  if (path && path[0] == '/' && path[1]) u->vhost = nh_xstrdup(path + 1);
  free(path);
  char *query = NULL;
  if (curl_url_get(h, CURLUPART_QUERY, &query, 0) == CURLUE_OK && query) {
    for (char *p = query; *p && rc == NH_OK;) {
      char *amp = strchr(p, '&');
      size_t n = amp ? (size_t)(amp - p) : strlen(p);
      char *eq = memchr(p, '=', n);
      char *key = unescape(p, eq ? (size_t)(eq - p) : n);
      char *val = eq ? unescape(eq + 1, n - (size_t)(eq + 1 - p)) : nh_xstrdup("");
      rc = query_param(u, key, val, err);
      free(key);
      free(val);
      p += n + (amp ? 1 : 0);
    }
    curl_free(query);
  }
  if (rc) goto out;
  if (!u->exchange) u->exchange = nh_xstrdup("nimbus.events");
  if (!u->management) {
    char buf[512];
    snprintf(buf, sizeof buf, "http://%s:15672", u->host);
    u->management = nh_xstrdup(buf);
  }
  char disp[768];
  snprintf(disp, sizeof disp, "%s://%s%s%s:%d/%s", u->tls ? "amqps" : "amqp", u->user ? u->user : "",
           u->user ? "@" : "", u->host, u->port, u->vhost ? u->vhost : "");
  u->display = nh_xstrdup(disp);
out:
  curl_url_cleanup(h);
  if (rc) nh_amqp_url_clear(u);
  return rc;
}

void nh_amqp_url_clear(nh_amqp_url_t *u)
{
  free(u->user);
  free(u->password);
  free(u->host);
  free(u->vhost);
  free(u->management);
  free(u->ca);
  free(u->exchange);
  free(u->display);
  memset(u, 0, sizeof *u);
}
