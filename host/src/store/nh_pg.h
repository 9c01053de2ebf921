/* The PostgreSQL store: URLs, connections (blocking for the CLI, asynchronous on a libuv
 * loop for the host), the schema's versioned migrations, and errors said for an operator.
 *
 * Every error names what went wrong, where (the store URL with its password masked, or
 * the connection's user, host, port and database) and what to do, with the SQLSTATE or
 * libpq condition it comes from. */
#ifndef NH_PG_H
#define NH_PG_H

#include <libpq-fe.h>
#include <uv.h>

#include "core/nh_error.h"

/* The schema version this nimbus-host writes: the number of entries of nh_pg_migrations,
 * equal to the sqlite store's (version N holds the same tables on both backends). */
#define NH_PG_SCHEMA_VERSION 4

/* Seconds a connection attempt may take when the URL has no connect_timeout (libpq's
 * own default waits forever on a host that drops packets). */
#define NH_PG_CONNECT_TIMEOUT_S 10

/* 1 if `store` is a PostgreSQL URL (postgresql:// or postgres://, scheme in any case). */
int nh_pg_url_is(const char *store);
/* NH_OK, or NH_EUSAGE with the reason and the URL (password masked) in err. */
int nh_pg_url_check(const char *url, nh_error_t *err);
/* The URL with its password masked (userinfo and ?password=), for logs; caller frees. */
char *nh_pg_url_display(const char *url);
/* postgresql://USER[:***]@HOST:PORT/DB of an open (or failed) connection, for messages. */
void nh_pg_conn_display(PGconn *conn, char *buf, size_t len);

/* Blocking connect (the CLI, tests). On success *out is an open connection in UTF8 with
 * application_name nimbus-host (unless the URL names another); the caller PQfinish()es it. */
int nh_pg_connect(const char *url, PGconn **out, nh_error_t *err);

/* Asynchronous connect on `loop`: host names are looked up with uv_getaddrinfo, then
 * PQconnectPoll is driven by a uv_poll_t on the connection's socket, under a deadline
 * (connect_timeout, else NH_PG_CONNECT_TIMEOUT_S). cb runs exactly once, from the loop,
 * after every handle of the attempt is closed: with the connection (err NULL; the
 * callee owns it) or with NULL and the error (cancelled: NH_ESTATE). The returned
 * handle is valid until cb runs. */
typedef struct nh_pg_connect nh_pg_connect_t;
typedef void (*nh_pg_connect_cb)(void *data, PGconn *conn, const nh_error_t *err);
nh_pg_connect_t *nh_pg_connect_start(uv_loop_t *loop, const char *url, nh_pg_connect_cb cb, void *data);

/* Both with `extra`, a libpq connection string (NULL or "": nothing), added beneath the
 * URL's settings: a keyword the URL sets keeps the URL's value, options are joined with
 * `extra`'s first (the server applies -c settings in order, the last wins). The link
 * connects this way (its timeouts and keepalives, nh_pg_link.h); so may a test or a tool
 * that must meet the server as the link does. */
int nh_pg_connect_with(const char *url, const char *extra, PGconn **out, nh_error_t *err);
nh_pg_connect_t *nh_pg_connect_start_with(uv_loop_t *loop, const char *url, const char *extra, nh_pg_connect_cb cb,
                                          void *data);
/* Abandons the attempt: cb still runs once, later, with NH_ESTATE "cancelled". A no-op
 * once the outcome is known. */
void nh_pg_connect_cancel(nh_pg_connect_t *req);

/* One statement with text parameters (NULL: SQL NULL), blocking. NH_OK with the result
 * in *res (caller PQclear()s; res may be NULL to drop it), or the error explained. */
int nh_pg_exec(PGconn *conn, const char *sql, int nparams, const char *const *params, PGresult **res,
               nh_error_t *err);
/* A failed statement's result (NULL: no result came back) said for an operator: the
 * server's message, its SQLSTATE and what to do, while `doing` (a short phrase). */
int nh_pg_explain_result(PGconn *conn, const PGresult *res, const char *doing, nh_error_t *err);

/* The schema version of the store the connection sees (0: no store yet). */
int nh_pg_schema_version(PGconn *conn, int *version, nh_error_t *err);
/* Brings the store to NH_PG_SCHEMA_VERSION: one transaction per migration, each under
 * pg_advisory_xact_lock so that hosts starting together never run one twice. A newer
 * store is refused (naming both versions); a current one is left alone. *from and *to
 * (either may be NULL) get the versions before and after. */
int nh_pg_migrate(PGconn *conn, int *from, int *to, nh_error_t *err);
/* The same up to `target` (<= NH_PG_SCHEMA_VERSION): for tests of each version. */
int nh_pg_migrate_to(PGconn *conn, int target, int *from, int *to, nh_error_t *err);

#endif
