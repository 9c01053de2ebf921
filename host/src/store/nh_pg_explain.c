/* PostgreSQL errors said for an operator: what went wrong, where (the store URL with its
 * password masked, or the connection's user@host:port/database) and what to do, with the
 * SQLSTATE or libpq condition each comes from. */
#include "nh_pg_int.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *nh_pg_quote_ident(PGconn *conn, const char *name, char *buf, size_t len)
{
  char *q = conn && name ? PQescapeIdentifier(conn, name, strlen(name)) : NULL;
  snprintf(buf, len, "%s", q ? q : (name ? name : ""));
  PQfreemem(q);
  return buf;
}

const char *nh_pg_quote_shell(const char *word, char *buf, size_t len)
{
  int plain = *word != '\0';
  for (const char *c = word; *c; c++)
    if (!isalnum((unsigned char)*c) && !strchr("_-./:@%+=", *c)) plain = 0;
  if (plain) {
    snprintf(buf, len, "%s", word);
    return buf;
  }
  size_t o = 0;
  if (len < 3) return "''";
  buf[o++] = '\'';
  for (const char *c = word; *c && o + 5 < len; c++) {
    if (*c == '\'') {   /* close the quote, an escaped quote, open it again */
      memcpy(buf + o, "'\\''", 4);
      o += 4;
    } else {
      buf[o++] = *c;
    }
  }
  buf[o++] = '\'';
  buf[o] = '\0';
  return buf;
}

/* "H:P" for messages, and the -h/-p options of pg_isready and createdb. A socket
 * directory is a host for those tools too. */
typedef struct hostport {
  char text[300];   /* 127.0.0.1:5432, [::1]:5432, socket /run/postgresql/.s.PGSQL.5432 */
  char opts[300];   /* -h 127.0.0.1 -p 5432 */
} hostport_t;

static void hostport(PGconn *conn, hostport_t *hp)
{
  const char *host = conn ? PQhost(conn) : NULL, *port = conn ? PQport(conn) : NULL;
  char qh[256], qp[32];
  if (!port || !*port) port = "5432";
  nh_pg_quote_shell(port, qp, sizeof qp);
  if (!host || !*host) {
    snprintf(hp->text, sizeof hp->text, "the default socket, port %s", port);
    snprintf(hp->opts, sizeof hp->opts, "-p %s", qp);
    return;
  }
  nh_pg_quote_shell(host, qh, sizeof qh);
  if (*host == '/' || *host == '@') snprintf(hp->text, sizeof hp->text, "socket %s/.s.PGSQL.%s", host, port);
  else if (strchr(host, ':')) snprintf(hp->text, sizeof hp->text, "[%s]:%s", host, port);
  else snprintf(hp->text, sizeof hp->text, "%s:%s", host, port);
  snprintf(hp->opts, sizeof hp->opts, "-h %s -p %s", qh, qp);
}

/* libpq's message on one line: continuation lines joined, the server's LOCATION
 * (a source file and line of PostgreSQL itself) left out. */
static void tidy(const char *msg, char *out, size_t len)
{
  size_t o = 0;
  out[0] = '\0';
  for (const char *line = msg ? msg : ""; *line && o + 1 < len;) {
    const char *end = strchr(line, '\n');
    if (!end) end = line + strlen(line);
    while (line < end && isspace((unsigned char)*line)) line++;
    if (line < end && strncmp(line, "LOCATION:", 9) != 0) {
      int n = snprintf(out + o, len - o, "%s%.*s", o ? " " : "", (int)(end - line), line);
      o = n < 0 ? o : (o + (size_t)n >= len ? len - 1 : o + (size_t)n);
    }
    line = *end ? end + 1 : end;
  }
}

/* The SQLSTATE a server sent when it refused a connection. A failed connection has no
 * PGresult for PQresultErrorField; at PQERRORS_VERBOSE (nh_pg_target_start sets it)
 * libpq writes each server error as "SEVERITY:  SQLSTATE: message", and this reads the
 * code (and the message after it, into text) back from there. "" when none came. */
static void conn_sqlstate(const char *msg, char code[6], char *text, size_t len)
{
  code[0] = '\0';
  text[0] = '\0';
  for (const char *p = msg ? strstr(msg, ":  ") : NULL; p; p = strstr(p + 1, ":  ")) {
    const char *c = p + 3;
    int ok = 1;
    for (int i = 0; i < 5 && ok; i++) ok = isdigit((unsigned char)c[i]) || isupper((unsigned char)c[i]);
    if (!ok || c[5] != ':' || c[6] != ' ') continue;
    memcpy(code, c, 5);
    code[5] = '\0';
    snprintf(text, len, "%.*s", (int)strcspn(c + 7, "\n"), c + 7);
    return;
  }
}

/* Where the password the server refused came from, in libpq's order of precedence. */
static const char *password_source(const nh_pg_target_t *t)
{
  const char *pw = NULL;
  for (const PQconninfoOption *o = t->opts; o && o->keyword; o++)
    if (strcmp(o->keyword, "password") == 0) pw = o->val;
  if (pw && *pw) return "the URL";
  const char *env = getenv("PGPASSWORD");
  if (env && *env) return "PGPASSWORD";
  return "the password file (PGPASSFILE, else ~/.pgpass)";
}

int nh_pg_explain_connect(PGconn *conn, const nh_pg_target_t *t, nh_error_t *err)
{
  if (!conn) return nh_error_set(err, NH_EFAIL, "store %s: out of memory while connecting", t->shown);
  /* a copy: PQescapeIdentifier (nh_pg_quote_ident) clears the connection's message */
  char msg[1024], code[6], text[256], said[400], qu[160], qd[160], su[160], sd[160];
  snprintf(msg, sizeof msg, "%s", PQerrorMessage(conn));
  conn_sqlstate(msg, code, text, sizeof text);
  tidy(msg, said, sizeof said);
  hostport_t hp;
  hostport(conn, &hp);
  const char *user = PQuser(conn) ? PQuser(conn) : "", *db = PQdb(conn) ? PQdb(conn) : "";
  nh_pg_quote_ident(conn, user, qu, sizeof qu);
  nh_pg_quote_ident(conn, db, qd, sizeof qd);
  nh_pg_quote_shell(user, su, sizeof su);
  nh_pg_quote_shell(db, sd, sizeof sd);

  if (strcmp(code, "28P01") == 0)
    return nh_error_set(err, NH_EUSAGE,
                        "store %s: password authentication failed for user \"%s\" on %s (SQLSTATE 28P01); the "
                        "password came from %s: correct it there (a password comes from the URL, else PGPASSWORD, "
                        "else ~/.pgpass), or create the role if it does not exist: "
                        "CREATE ROLE %s LOGIN PASSWORD '...';",
                        t->shown, user, hp.text, password_source(t), qu);
  if (!*code && PQconnectionNeedsPassword(conn))
    return nh_error_set(err, NH_EUSAGE,
                        "store %s: the server on %s asks user \"%s\" for a password and none was given (libpq: "
                        "no password supplied): put it in the URL (postgresql://%s:PASSWORD@...), in PGPASSWORD or "
                        "in ~/.pgpass", t->shown, hp.text, user, user);
  if (strcmp(code, "28000") == 0)
    return nh_error_set(err, NH_EUSAGE,
                        "store %s: the server on %s refused user \"%s\" (SQLSTATE 28000: %s): if the role does not "
                        "exist, create it (`createuser %s --login --pwprompt %s`); if pg_hba.conf has no line for "
                        "this client, user and database, add one and reload the server", t->shown, hp.text, user, text,
                        hp.opts, su);
  if (strcmp(code, "3D000") == 0)
    return nh_error_set(err, NH_ENOTFOUND,
                        "store %s: database \"%s\" does not exist on %s (SQLSTATE 3D000): create it with "
                        "`createdb %s -U %s %s`, or in psql as a superuser: CREATE DATABASE %s OWNER %s;",
                        t->shown, db, hp.text, hp.opts, su, sd, qd, qu);
  if (strcmp(code, "42501") == 0)
    return nh_error_set(err, NH_EUSAGE,
                        "store %s: user \"%s\" may not connect to database \"%s\" (SQLSTATE 42501: %s): as the "
                        "owner of the database or a superuser run GRANT CONNECT ON DATABASE %s TO %s;",
                        t->shown, user, db, text, qd, qu);
  if (strcmp(code, "53300") == 0)
    return nh_error_set(err, NH_EFAIL,
                        "store %s: the server on %s has no connection slot left (SQLSTATE 53300: %s): raise its "
                        "max_connections, or run fewer hosts or CLI commands against it at once", t->shown, hp.text,
                        text);
  if (strncmp(code, "57P", 3) == 0)
    return nh_error_set(err, NH_EFAIL,
                        "store %s: the server on %s is starting, stopping or recovering (SQLSTATE %s: %s): try "
                        "again once `pg_isready %s` says it accepts connections", t->shown, hp.text, code, text,
                        hp.opts);
  if (*code)
    return nh_error_set(err, NH_EFAIL, "store %s: the server on %s refused the connection (SQLSTATE %s: %s)",
                        t->shown, hp.text, code, text);
  /* No server answered: libpq writes the system's message, strerror(3)'s text in this
   * process's locale, which is what it is compared with. */
  const char *host = PQhost(conn);
  int on_socket = host && (*host == '/' || *host == '@' || !*host);
  if (strstr(msg, strerror(ECONNREFUSED)) || (on_socket && strstr(msg, strerror(ENOENT))))
    return nh_error_set(err, NH_EFAIL,
                        "store %s: no PostgreSQL server answers on %s (connection refused); is it running? "
                        "`pg_isready %s`", t->shown, hp.text, hp.opts);
  return nh_error_set(err, NH_EFAIL, "store %s: cannot connect: %s", t->shown, said);
}

int nh_pg_explain_params(PGconn *conn, const nh_pg_target_t *t, nh_error_t *err)
{
  if (!conn) return nh_error_set(err, NH_EFAIL, "store %s: out of memory while connecting", t->shown);
  char said[400];
  tidy(PQerrorMessage(conn), said, sizeof said);
  return nh_error_set(err, NH_EUSAGE, "store URL %s: %s; correct that parameter of the URL", t->shown, said);
}

int nh_pg_explain_timeout(PGconn *conn, const nh_pg_target_t *t, const char *name, nh_error_t *err)
{
  if (!conn)
    return nh_error_set(err, NH_EFAIL,
                        "store %s: looking up host \"%s\" took longer than %d s (connect_timeout): check the DNS "
                        "resolver of this machine (/etc/resolv.conf), or put the server's address in the URL",
                        t->shown, name ? name : "", t->timeout_s);
  hostport_t hp;
  hostport(conn, &hp);
  return nh_error_set(err, NH_EFAIL,
                      "store %s: no answer from %s within %d s (connect_timeout): is the server up, and its port "
                      "open to this machine? `pg_isready %s`; on a slow network raise connect_timeout in the URL "
                      "(?connect_timeout=30)", t->shown, hp.text, t->timeout_s, hp.opts);
}

int nh_pg_explain_unresolved(const nh_pg_target_t *t, const char *name, const char *why, nh_error_t *err)
{
  return nh_error_set(err, NH_EFAIL,
                      "store %s: host \"%s\" cannot be resolved (%s): check the host name in the URL (or PGHOST)",
                      t->shown, name ? name : "", why);
}

/* Conditions that mean the connection is gone, whatever the statement was. */
static int conn_lost(PGconn *conn, const char *code)
{
  if (code && (strncmp(code, "08", 2) == 0 || strcmp(code, "57P01") == 0 || strcmp(code, "57P02") == 0 ||
               strcmp(code, "57P03") == 0))
    return 1;
  return PQstatus(conn) == CONNECTION_BAD;
}

int nh_pg_explain_result(PGconn *conn, const PGresult *res, const char *doing, nh_error_t *err)
{
  char where[512], said[400], qu[160], qd[160];
  nh_pg_conn_display(conn, where, sizeof where);
  const char *code = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
  const char *primary = res ? PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) : NULL;
  const char *detail = res ? PQresultErrorField(res, PG_DIAG_MESSAGE_DETAIL) : NULL;
  const char *hint = res ? PQresultErrorField(res, PG_DIAG_MESSAGE_HINT) : NULL;
  const char *user = PQuser(conn) ? PQuser(conn) : "", *db = PQdb(conn) ? PQdb(conn) : "";
  if (!primary) {
    tidy(res && *PQresultErrorMessage(res) ? PQresultErrorMessage(res) : PQerrorMessage(conn), said, sizeof said);
    primary = said;
  }
  if (conn_lost(conn, code)) {
    hostport_t hp;
    hostport(conn, &hp);
    return nh_error_set(err, NH_EFAIL,
                        "store %s: the connection to %s was lost while %s (%s%s%s%s): is the server still running? "
                        "`pg_isready %s`", where, hp.text, doing, code ? "SQLSTATE " : "", code ? code : "",
                        code ? ": " : "", primary, hp.opts);
  }
  if (!code) code = "";
  nh_pg_quote_ident(conn, user, qu, sizeof qu);
  nh_pg_quote_ident(conn, db, qd, sizeof qd);
  if (strcmp(code, "42501") == 0)
    return nh_error_set(err, NH_EFAIL,
                        "store %s: permission denied while %s (SQLSTATE 42501: %s): role %s lacks that right; ask "
                        "the owner of database %s or a superuser to grant it (the store's migrations need "
                        "GRANT CREATE ON SCHEMA public TO %s;)", where, doing, primary, qu, qd, qu);
  if (strcmp(code, "25006") == 0)
    return nh_error_set(err, NH_EFAIL,
                        "store %s: the server is a read-only standby (SQLSTATE 25006: %s) while %s: point the URL at "
                        "the primary (with several hosts, add ?target_session_attrs=read-write)",
                        where, primary, doing);
  if (strcmp(code, "53100") == 0)
    return nh_error_set(err, NH_EFAIL, "store %s: the database server's disk is full (SQLSTATE 53100: %s) while %s: "
                        "free space on it", where, primary, doing);
  return nh_error_set(err, NH_EFAIL, "store %s: %s (SQLSTATE %s) while %s%s%s%s%s", where, primary,
                      *code ? code : "none", doing, detail ? "; " : "", detail ? detail : "", hint ? "; hint: " : "",
                      hint ? hint : "");
}
