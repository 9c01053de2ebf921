/* PostgreSQL store internals shared by nh_pg*.c: the connection target a URL names, the
 * explanations of connection failures, and the migrator of versioned migration lists. */
#ifndef NH_PG_INT_H
#define NH_PG_INT_H

#include "nh_pg.h"

#include <netdb.h>

/* What a store URL connects to. libpq parses the URL; host names are looked up by us
 * (uv_getaddrinfo on the loop, getaddrinfo for the CLI) because PQconnectStart would
 * look them up itself and block the loop; libpq then gets each address as hostaddr
 * beside its name (the name still selects ~/.pgpass lines and checks certificates). */
typedef struct nh_pg_target {
  char *shown;                  /* the URL, password masked */
  PQconninfoOption *opts;       /* the URL parsed by libpq */
  int timeout_s;                /* connect deadline; 0: none (connect_timeout=0) */
  int nhosts;                   /* entries of the effective host list */
  char **host, **port;          /* each entry and its port */
  char **addrs;                 /* numeric addresses found for entry i ("a,b"), NULL: none looked up */
  int lookup;                   /* 1: some entry is a name to look up first */
  const char **keys, **vals;    /* PQconnectStartParams' arrays (nh_pg_target_params) */
  char *lists[3];               /* the host, hostaddr and port lists given to libpq */
} nh_pg_target_t;

int nh_pg_target_init(nh_pg_target_t *t, const char *url, nh_error_t *err);
void nh_pg_target_free(nh_pg_target_t *t);
/* The name entry i needs looked up, or NULL (a socket directory, a numeric address). */
const char *nh_pg_target_name(const nh_pg_target_t *t, int i);
/* Records the addresses found for entry i; returns how many (0: none usable). */
int nh_pg_target_found(nh_pg_target_t *t, int i, const struct addrinfo *ai);
/* Builds keys/vals: the URL's options, the addresses found, client_encoding UTF8 and
 * fallback_application_name nimbus-host. */
void nh_pg_target_params(nh_pg_target_t *t);
/* PQconnectStartParams on the target, with the SQLSTATE shown in connection errors
 * (nh_pg_explain_connect reads it from there: libpq has no other way to give it). */
PGconn *nh_pg_target_start(nh_pg_target_t *t);
/* A connection that is up: back to libpq's default error verbosity. */
void nh_pg_conn_ready(PGconn *conn);

/* A failed connection (PQstatus CONNECTION_BAD) said for an operator. */
int nh_pg_explain_connect(PGconn *conn, const nh_pg_target_t *t, nh_error_t *err);
/* PQconnectStartParams refused a parameter's value at once (sslmode=bogus, say). */
int nh_pg_explain_params(PGconn *conn, const nh_pg_target_t *t, nh_error_t *err);
/* The deadline passed: while looking up `name` (conn NULL) or while connecting. */
int nh_pg_explain_timeout(PGconn *conn, const nh_pg_target_t *t, const char *name, nh_error_t *err);
/* uv_getaddrinfo or getaddrinfo found nothing for `name`; `why` is their reason. */
int nh_pg_explain_unresolved(const nh_pg_target_t *t, const char *name, const char *why, nh_error_t *err);

/* Quoting for the commands an explanation suggests: an SQL identifier (libpq's
 * PQescapeIdentifier, which any PGconn can run, even a failed one) and a shell word
 * (single-quoted only when it needs to be). Both write into buf and return it. */
const char *nh_pg_quote_ident(PGconn *conn, const char *name, char *buf, size_t len);
const char *nh_pg_quote_shell(const char *word, char *buf, size_t len);

/* A list of versioned migrations with a version of its own: the store's (nh_pg.c), the
 * embedded queue's (nh_pg_queue.c) and the AMQP transport's (nh_pg_amqp.c). Each is
 * migrated apart, under its own advisory lock, its version in its own one-row table, so
 * none waits for nor disturbs another. */
typedef struct nh_pg_migrations {
  const char *lock;          /* pg_advisory_xact_lock's key (a bigint, as text): one per list */
  const char *table;         /* the one-row table holding the version (a constant identifier) */
  const char *whose;         /* in messages, "the store's schema is version 9": "store" */
  const char *what;          /* in messages, "migrating the schema to version 3": "the schema" */
  const char *const *steps;  /* steps[v] brings version v to v + 1 (several statements) */
  int count;                 /* the version this nimbus-host writes: the steps' number */
} nh_pg_migrations_t;

/* Brings the list to `target` (0 to m->count): one transaction per step, each under
 * pg_advisory_xact_lock(m->lock) so that hosts starting together never run one twice. A
 * newer version is refused (naming both versions); a current one is left alone; a role
 * without the rights a step needs is told which, and the GRANT that gives it. *from and
 * *to (either may be NULL) get the versions before and after. */
int nh_pg_migrations_run(PGconn *conn, const nh_pg_migrations_t *m, int target, int *from, int *to,
                         nh_error_t *err);
/* The list's version the connection sees (0: no version table, or no row in it). */
int nh_pg_migrations_version(PGconn *conn, const nh_pg_migrations_t *m, int *version, nh_error_t *err);

#endif
