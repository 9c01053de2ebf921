/* Command-line interface: argument parsing shared by every subcommand, and the
 * subcommands themselves (docs/design.md section 5). Exit codes: 0 ok, 1 runtime failure,
 * 2 usage error with a one-line reason. */
#ifndef NH_CLI_H
#define NH_CLI_H

#include <stddef.h>
#include <stdio.h>

#include "admin/nh_admin.h"
#include "store/nh_store.h"

#define NH_EXIT_OK 0
#define NH_EXIT_FAIL 1
#define NH_EXIT_USAGE 2

typedef struct nh_opt_spec {
  const char *name;     /* "--store" */
  int takes_value;
} nh_opt_spec_t;

typedef struct nh_args {
  const char *cmd;
  const char *pos[64];
  int npos;
  const char *names[64];
  const char *values[64];
  int nopts;
  const char *store;
} nh_args_t;

/* Parses argv[first..] against `specs` (--store is always accepted). Prints the
 * reason and returns NH_EXIT_USAGE on bad input. `--` ends option parsing. */
int nh_args_parse(nh_args_t *a, const char *cmd, int argc, char **argv, int first, const nh_opt_spec_t *specs);
const char *nh_args_get(const nh_args_t *a, const char *name);
int nh_args_has(const nh_args_t *a, const char *name);
/* s as a whole decimal number from lo to hi: 0 with *out set, else -1. */
int nh_args_long(const char *s, long lo, long hi, long *out);
int nh_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* publish on a PostgreSQL store (nh_cli_pgpub.c): m queued for `to` or for every
 * subscriber of its type, in one transaction; prints what the sqlite path prints. given_id:
 * --message-id was given (refused there for now). Returns the exit code. */
/* given_id: m's MessageId is the caller's (--message-id): published once within the window */
int nh_cli_publish_pg(const char *url, const nh_msg_t *m, const char *to, const char *given_id);
/* `publish --transport amqp://` on a PostgreSQL store: the MessageId's claim (given_id)
 * and the outbox row in one transaction on db, the row tr's to send. 0 written, 1 a
 * duplicate (said), -1 failed (why says so). */
struct nh_transport;
struct nh_pg_db;
int nh_cli_outbox_publish_pg(struct nh_pg_db *db, struct nh_transport *tr, const nh_msg_t *m, const char *to,
                             const char *given_id, char *why, size_t len);
/* A PostgreSQL store for a command that writes: connected, its schema and the queue's
 * migrated. NULL after saying why, with *exit_code set. */
struct nh_pg_db;
struct nh_pg_db *nh_cli_pg_open(const char *cmd, const char *url, int *exit_code);
/* publish --message-id found the id published at `at`: says so on stderr */
void nh_cli_said_published(const char *message_id, int64_t at);
/* resubmit, skip, handoff of one event on a PostgreSQL store (nh_cli_pg.c); the exit code. */
struct nh_op_req;
int nh_cli_submit_pg(const char *cmd, const char *url, const struct nh_op_req *req);

/* Reads a JSON argument: inline text or @file; validates it. Returns NULL after
 * printing the reason. */
char *nh_cli_json_arg(const char *cmd, const char *what, const char *arg);
/* The same, and it must be a JSON object (event payloads). */
char *nh_cli_json_object_arg(const char *cmd, const char *what, const char *arg);
int nh_cli_valid_utf8(const char *s);

/* Event filters (nh_cli_filter.c): the options --endpoint --status --type --session
 * --error --group --since --before, checked against the store (an unknown endpoint or
 * group is a usage error naming what exists). Returns an exit code (0: ok). */
#define NH_CLI_FILTER_OPTS                                                                          \
  { "--endpoint", 1 }, { "--status", 1 }, { "--type", 1 }, { "--session", 1 }, { "--error", 1 },    \
  { "--group", 1 }, { "--since", 1 }, { "--before", 1 }
/* s NULL: no store to check the names against. */
int nh_cli_filter_parse(const nh_args_t *a, const char *cmd, nh_store_t *s, nh_event_filter_t *f);
/* The same on a PostgreSQL store. */
struct nh_pg_db;
int nh_cli_filter_parse_pg(const nh_args_t *a, const char *cmd, struct nh_pg_db *db, nh_event_filter_t *f);
void nh_cli_filter_describe(const nh_event_filter_t *f, const nh_args_t *a, char *out, size_t len);

/* The admin listener's address and logins: --admin ADDR (else $NIMBUS_ADMIN, else
 * 127.0.0.1:7070; off) and --admin-token-file (nh_cli_console.c). An exit code. */
typedef struct nh_admin_addr {
  nh_admin_opts_t opts;
  char host[256];
  int off;
} nh_admin_addr_t;
int nh_cli_admin_addr(const nh_args_t *a, const char *cmd, nh_admin_addr_t *out);

int nh_cmd_run(int argc, char **argv, int first);
/* `[--store PATH] -l SCRIPT.lua [ARGS]` (nh_cli_script.c): the index of -l in argv when
 * argv is that shape, else 0. */
int nh_cli_script_at(int argc, char **argv);
int nh_cmd_script(int argc, char **argv, int at);
/* Runs a Lua script inside the host (what -l does) with the script vm host (hand-offs,
 * publishes into $NIMBUS_STORE); returns the exit status (busted's own os.exit wins). */
int nh_cli_run_lua(const char *argv0, const char *script, int argc, char **argv);
/* The adapter author's commands: new NAME, test [SPEC...], check ADAPTER.lua... */
int nh_cmd_new(int argc, char **argv);
int nh_cmd_test(int argc, char **argv);
int nh_cmd_check(int argc, char **argv);
int nh_cmd_console(int argc, char **argv);
int nh_cmd_publish(int argc, char **argv);
/* nimbus-host partitions ENDPOINT P --transport amqp://... (nh_cli_partitions.c) */
int nh_cmd_partitions(int argc, char **argv);
int nh_cmd_events(int argc, char **argv);
int nh_cmd_show(int argc, char **argv);
int nh_cmd_resubmit(int argc, char **argv);
int nh_cmd_skip(int argc, char **argv);
int nh_cmd_handoff(int argc, char **argv);
int nh_cmd_sessions(int argc, char **argv);
int nh_cmd_failures(int argc, char **argv);
int nh_cmd_purge(int argc, char **argv);
/* resubmit --all / skip --all (nh_cli_bulk.c); kind: NH_OP_RESUBMIT or NH_OP_SKIP */
int nh_cli_bulk(int kind, const nh_args_t *a);
void nh_cli_help(void);
void nh_cli_help_to(FILE *out);

#endif
