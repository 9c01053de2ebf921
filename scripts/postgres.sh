#!/usr/bin/env bash
# PostgreSQL (Debian's, the newest installed major) as a plain background process, for the tests of the
# PostgreSQL store.
#
#   scripts/postgres.sh install        apt-get install postgresql libpq-dev (only what is missing)
#   scripts/postgres.sh start          initdb on first use, start on 127.0.0.1, wait until it answers (idempotent)
#   scripts/postgres.sh stop           fast shutdown, wait until it is gone (idempotent)
#   scripts/postgres.sh status         exit 0 if running and answering
#   scripts/postgres.sh url            the URL tests use: postgresql://nimbus:nimbus@127.0.0.1:$NH_PG_PORT/nimbus
#   scripts/postgres.sh admin-url      the superuser URL (role postgres over the cluster's unix socket)
#   scripts/postgres.sh createdb NAME  a fresh database owned by role nimbus; prints its URL
#   scripts/postgres.sh dropdb NAME    drops it, ending its open connections (idempotent)
#
# Listens on 127.0.0.1:$NH_PG_PORT only (default 55432, so a system PostgreSQL on 5432 does not clash); its
# unix socket is in $NH_PG_DIR/run. All state lives in $NH_PG_DIR (default build/postgres): data/ (the
# cluster; its postgresql.conf includes nimbus.conf, rewritten with pg_hba.conf at every start),
# postgres.log (the server's log), initdb.log. $NH_PG_TIMEOUT (60 s) bounds start and stop;
# $NH_PG_BIN names another directory of PostgreSQL binaries.
# Roles: `postgres`, the superuser, trusted on the unix socket only (its directory is 0700: only the
# cluster's OS user and root reach it); `nimbus`, password `nimbus` (scram-sha-256, on 127.0.0.1 and on the
# socket), which owns the database `nimbus` and every database `createdb` makes. Nothing is trusted over
# TCP, so a wrong or missing password is refused as on a real server. createdb/dropdb connect as the
# superuser through $NH_PG_ADMIN_URL when it is set, else through the socket.
#
# Why it looks like this (what was found on the Debian machines the project runs on):
# - There is no systemd and policy-rc.d forbids apt from starting services; Debian's own cluster
#   (/etc/postgresql, pg_ctlcluster) belongs to the system and port 5432. We run our own postmaster.
# - initdb, postgres and pg_ctl refuse to run as root. As root they run as the OS user `postgres` (made by
#   the package) through setpriv, which execs: the pid we launch is the postmaster itself. The state dir is
#   chowned to that user, and every directory above it must be searchable by it (mktemp -d makes 0700
#   directories: the check says which one is in the way). We never call pg_ctl: stop signals the
#   postmaster (SIGINT is a fast shutdown), which root and the owner both may.
# - initdb names the bootstrap superuser after the OS user running it (alice, or postgres): -U postgres
#   gives everyone the same admin URL.
# - initdb takes its locale from the environment (in containers LANG is often unset or names a locale that
#   was never generated): --locale=C -E UTF8, so sorting and server messages are the same everywhere.
# - A stale postmaster.pid from a killed run: postgres ignores one whose pid is dead but refuses to start
#   when that pid was reused by another process, which is common after a container restart. Our
#   processes are known by /proc/PID/exe (a postgres binary) and /proc/PID/cwd (the postmaster and every
#   backend run in the data dir). The pid file is removed only once no process of the cluster is left: it
#   holds the key of the shared memory segment that keeps a new postmaster from starting beside orphaned
#   backends still writing; that segment is removed too, and only when nothing is attached to it.
# - The socket path must fit in sun_path (107 bytes): a deep NH_PG_DIR is refused with that reason.
# - A data dir made by an older major (before an upgrade of the packages) is started with that major's
#   binaries while they are installed; the newest major would refuse its files.
# - The caller's PG* variables (PGHOST, PGUSER, PGPASSWORD, PGSERVICE, ...) would redirect our own psql
#   calls: they are unset here.
# - Two starts at once (two ctest runs in one build tree) would both initdb: start and stop take a lock.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)

PG_DIR=${NH_PG_DIR:-$root/build/postgres}
case "$PG_DIR" in /*) ;; *) PG_DIR=$PWD/$PG_DIR ;; esac
PG_DIR=${PG_DIR%/}
PORT=${NH_PG_PORT:-55432}
TIMEOUT=${NH_PG_TIMEOUT:-60}          # seconds, for start and for stop
DATA=$PG_DIR/data
RUN=$PG_DIR/run                       # unix socket directory
LOG=$PG_DIR/postgres.log
INITDB_LOG=$PG_DIR/initdb.log
OS_USER=postgres                      # who runs the cluster when we are root
PACKAGES=(postgresql libpq-dev)

while read -r v; do unset "$v"; done < <(compgen -e | grep '^PG' || true)
export PGCONNECT_TIMEOUT=10

say() { echo "postgres: $*"; }
launched=0   # set once this run has launched a postmaster: only then is the log about this failure
fail() {
  echo "postgres: ERROR: $*" >&2
  if (( launched )) && [[ -s "$LOG" ]]; then
    echo "--- $LOG since this start (last lines)" >&2
    # from our last marker line on: the earlier runs' lines are not about this failure
    awk '/^---- .* scripts\/postgres\.sh start$/ { n = 0 } { line[++n] = $0 } END { for (i = (n > 30 ? n - 29 : 1); i <= n; i++) print line[i] }' "$LOG" >&2
    echo "postgres: the whole log: less $LOG" >&2
  fi
  exit 1
}

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

if [[ ! "$PORT" =~ ^[0-9]{1,5}$ ]] || (( PORT < 1 || PORT > 65535 )); then
  fail "NH_PG_PORT=$PORT is not a TCP port (1-65535)"
fi
if [[ ! "$TIMEOUT" =~ ^[0-9]{1,6}$ ]] || (( TIMEOUT < 1 )); then
  fail "NH_PG_TIMEOUT=$TIMEOUT is not a whole number of seconds above 0"
fi

is_root() { [[ $(id -u) -eq 0 ]]; }

# The binaries: those of the major that made the data dir, else the newest installed.
BIN=
pick_bin() {
  [[ -n "$BIN" ]] && return 0
  if [[ -n "${NH_PG_BIN:-}" ]]; then
    BIN=${NH_PG_BIN%/}
    [[ -x "$BIN/postgres" ]] || fail "NH_PG_BIN=$NH_PG_BIN has no postgres binary"
    return 0
  fi
  local installed   # major versions, oldest first
  installed=$(find /usr/lib/postgresql -mindepth 3 -maxdepth 3 -path '*/bin/postgres' 2>/dev/null |
              sed 's,^/usr/lib/postgresql/,,; s,/bin/postgres$,,' | sort -V || true)
  [[ -n "$installed" ]] || fail "no PostgreSQL server is installed (no /usr/lib/postgresql/*/bin/postgres); run: $0 install"
  if [[ -s "$DATA/PG_VERSION" ]]; then
    local v; v=$(tr -dc 0-9. < "$DATA/PG_VERSION")
    BIN=/usr/lib/postgresql/$v/bin
    [[ -x "$BIN/postgres" ]] ||
      fail "the cluster in $DATA was made by PostgreSQL $v, which is not installed (installed: ${installed//$'\n'/ }). It only holds test data: rm -rf $PG_DIR and start again"
    return 0
  fi
  BIN=/usr/lib/postgresql/$(tail -n 1 <<<"$installed")/bin
}

# Runs a command as the cluster's OS user (ourselves unless we are root) in directory $1 (initdb warns
# when it cannot go back to a cwd that user may not read).
as_owner() {
  local dir=$1; shift
  if is_root; then
    (cd "$dir" && exec setpriv --reuid="$OS_USER" --regid="$OS_USER" --init-groups -- "$@")
  else
    (cd "$dir" && exec "$@")
  fi
}

# Processes of our cluster: a postgres binary whose cwd is our data dir.
data_real() { realpath -m -- "$DATA"; }
is_ours() {   # $1 = pid
  local exe
  [[ "$(readlink "/proc/$1/cwd" 2>/dev/null)" == "$(data_real)" ]] || return 1
  exe=$(readlink "/proc/$1/exe" 2>/dev/null) || return 1
  exe=${exe##*/}
  [[ "$exe" == postgres || "$exe" == "postgres (deleted)" ]]
}
cluster_pids() {
  local d p; d=$(data_real)
  find /proc -mindepth 2 -maxdepth 2 -name cwd -printf '%h %l\n' 2>/dev/null |
    awk -v d="$d" '$1 ~ /^\/proc\/[0-9]+$/ && substr($0, index($0, " ") + 1) == d { print substr($1, 7) }' |
    while read -r p; do is_ours "$p" && echo "$p"; done || true
}

# pid of our running postmaster, or nothing (the pid file alone is not trusted: pids are reused)
node_pid() {
  local pid
  [[ -s "$DATA/postmaster.pid" ]] || return 0
  pid=$(head -n 1 "$DATA/postmaster.pid" 2>/dev/null | tr -dc 0-9)
  [[ -n "$pid" ]] && is_ours "$pid" && echo "$pid"
  return 0
}
node_port() { sed -n 4p "$DATA/postmaster.pid" 2>/dev/null | tr -dc 0-9; }

answers() {   # the server on our port accepts connections
  pick_bin
  "$BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT" -t 3 >/dev/null 2>&1
}

port_busy() {
  ss -Hltn "( sport = :$1 )" 2>/dev/null | grep -q .
}

admin_conninfo() {
  if [[ -n "${NH_PG_ADMIN_URL:-}" ]]; then echo "$NH_PG_ADMIN_URL"
  else echo "host=$RUN port=$PORT user=postgres dbname=postgres"; fi
}

# psql as the superuser; SQL on stdin (psql variables are interpolated there, not in -c). Extra args
# (-v name=value) go before the connection.
admin_psql() {
  pick_bin
  "$BIN/psql" -X -q -A -t -v ON_ERROR_STOP=1 "$@" -d "$(admin_conninfo)"
}

url_of() { echo "postgresql://nimbus:nimbus@127.0.0.1:$PORT/$1"; }

# The socket directory goes in the query (host=/dir); the characters a URL query gives a meaning are
# percent-encoded (libpq decodes them).
admin_url() {
  local d=${RUN//%/%25}
  d=${d// /%20}; d=${d//&/%26}; d=${d//#/%23}; d=${d//+/%2B}; d=${d//=/%3D}
  echo "postgresql://postgres@/postgres?host=$d&port=$PORT"
}

cmd_install() {
  # shellcheck source=scripts/apt.sh
  source "$here/apt.sh"
  nh_apt_install postgres "${PACKAGES[@]}" || exit 1
  say "installed: ${PACKAGES[*]}"
  # The postinst makes Debian's cluster "main" but cannot start it; we never use it.
}

lock() {   # serialises start and stop of one state dir
  mkdir -p "$PG_DIR"
  exec 9>>"$PG_DIR/script.lock"
  flock -w "$TIMEOUT" 9 || fail "another scripts/postgres.sh start/stop of $PG_DIR holds $PG_DIR/script.lock for over ${TIMEOUT}s"
}

# The first directory above $PG_DIR that the cluster's OS user cannot enter, or nothing.
blocking_parent() {
  local d=$PG_DIR
  while [[ "$d" != / && -n "$d" ]]; do
    d=$(dirname "$d")
    as_owner / test -x "$d" 2>/dev/null || { echo "$d"; return 0; }
  done
}

prepare_dirs() {
  mkdir -p "$PG_DIR" "$RUN"
  chmod 700 "$RUN"
  if is_root; then
    id "$OS_USER" >/dev/null 2>&1 ||
      fail "PostgreSQL refuses to run as root and there is no OS user '$OS_USER' to run it as (the postgresql package makes it: $0 install)"
    command -v setpriv >/dev/null || fail "setpriv (util-linux) is needed to run PostgreSQL as '$OS_USER'"
    chown -R "$OS_USER:" "$PG_DIR"
    if ! as_owner / test -w "$PG_DIR" -a -x "$PG_DIR"; then
      local b; b=$(blocking_parent)
      fail "the OS user '$OS_USER' (PostgreSQL refuses to run as root) cannot reach $PG_DIR${b:+: $b is not searchable by it ($(stat -c '%A %U' "$b"))}. Set NH_PG_DIR to a directory it can reach, or chmod o+x the directories above"
    fi
  fi
}

run_initdb() {
  [[ -s "$DATA/PG_VERSION" ]] && return 0
  if [[ -e "$DATA" ]]; then
    say "removing $DATA: an initdb that never finished (no PG_VERSION)"
    rm -rf "$DATA"
  fi
  say "initdb $DATA ($("$BIN/postgres" --version))"
  # --auth=trust only for the moment between initdb and our pg_hba.conf (written before the first start)
  if ! as_owner "$PG_DIR" "$BIN/initdb" -D "$DATA" -U postgres --auth=trust -E UTF8 --locale=C > "$INITDB_LOG" 2>&1; then
    echo "--- last lines of $INITDB_LOG" >&2
    tail -n 20 "$INITDB_LOG" >&2
    rm -rf "$DATA"
    fail "initdb failed; the whole output: less $INITDB_LOG"
  fi
}

# single quotes doubled, for a string in postgresql.conf
conf_str() { printf "'%s'" "${1//\'/\'\'}"; }

write_config() {
  grep -q "^include_if_exists = 'nimbus.conf'" "$DATA/postgresql.conf" ||
    printf "\n# the settings of scripts/postgres.sh\ninclude_if_exists = 'nimbus.conf'\n" >> "$DATA/postgresql.conf"
  cat > "$DATA/nimbus.conf" <<EOF
# written by scripts/postgres.sh start; edits are overwritten
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = $(conf_str "$RUN")
max_connections = 200
shared_buffers = 32MB
# the store's tests check durability: nothing here trades it for speed
fsync = on
synchronous_commit = on
full_page_writes = on
password_encryption = 'scram-sha-256'
# the log goes to stderr, which the script sends to $LOG
logging_collector = off
log_destination = 'stderr'
log_line_prefix = '%m [%p] %q%u@%d '
lc_messages = 'C'
EOF
  cat > "$DATA/pg_hba.conf" <<'EOF'
# written by scripts/postgres.sh start; edits are overwritten
# TYPE  DATABASE  USER      ADDRESS         METHOD
local   all       postgres                  trust
local   all       all                       scram-sha-256
host    all       all       127.0.0.1/32    scram-sha-256
EOF
  if is_root; then chown "$OS_USER:" "$DATA/nimbus.conf" "$DATA/pg_hba.conf" "$DATA/postgresql.conf"; fi
}

# Leftovers of a killed run, with no postmaster of ours alive: wait for orphaned backends to exit (they
# notice the postmaster's death), then remove the stale pid file, its shared memory and socket locks.
clear_leftovers() {
  local deadline=$(( $(date +%s) + TIMEOUT )) pids
  while pids=$(cluster_pids); [[ -n "$pids" ]]; do
    if (( $(date +%s) >= deadline )); then
      fail "processes of the cluster in $DATA are still alive without a postmaster after ${TIMEOUT}s: $(tr '\n' ' ' <<<"$pids")(a killed run's backends; kill them, then start again)"
    fi
    sleep 0.2
  done
  if [[ -e "$DATA/postmaster.pid" ]]; then
    local shmid nattch
    shmid=$(sed -n 7p "$DATA/postmaster.pid" | awk '{ print $2 }')
    if [[ "$shmid" =~ ^[0-9]+$ ]] && command -v ipcs >/dev/null; then
      nattch=$(ipcs -m 2>/dev/null | awk -v id="$shmid" '$2 == id { print $6 }')
      if [[ -n "$nattch" ]]; then
        [[ "$nattch" == 0 ]] ||
          fail "the shared memory segment $shmid of the killed cluster in $DATA still has $nattch processes attached (ipcs -m -i $shmid); end them, then start again"
        ipcrm -m "$shmid" 2>/dev/null || true
      fi
    fi
    say "removing the stale $DATA/postmaster.pid (pid $(head -n 1 "$DATA/postmaster.pid") is no running postmaster of this cluster)"
    rm -f "$DATA/postmaster.pid"
  fi
  rm -f "$RUN"/.s.PGSQL.*
}

# Roles and database the tests rely on; repeated at every start, so a changed password is repaired.
setup_roles() {
  admin_psql > /dev/null <<'SQL' || fail "cannot set up the roles nimbus/postgres through $(admin_conninfo)"
DO $$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'nimbus') THEN
    CREATE ROLE nimbus LOGIN PASSWORD 'nimbus';
  ELSE
    ALTER ROLE nimbus LOGIN PASSWORD 'nimbus';
  END IF;
END $$;
SELECT 'CREATE DATABASE nimbus OWNER nimbus' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'nimbus') \gexec
SQL
}

wait_ready() {   # $1 = start time, $2 = pid of the postmaster we just launched (if any)
  launched=1
  local t0=$1 pid=${2:-} deadline=$(( $(date +%s) + TIMEOUT ))
  until answers; do
    if [[ -n "$pid" ]] && ! kill -0 "$pid" 2>/dev/null; then
      fail "postgres exited during start"
    fi
    (( $(date +%s) < deadline )) || fail "127.0.0.1:$PORT not accepting connections after ${TIMEOUT}s (pg_isready)"
    sleep 0.1
  done
  setup_roles
  # the path the tests take: TCP and a password
  local err
  err=$("$BIN/psql" -X -q -A -t -d "$(url_of nimbus)" -c 'SELECT 1' 2>&1 >/dev/null) ||
    fail "the cluster answers but $(url_of nimbus) does not: $err"
  say "ready in $(elapsed "$t0")s (pid $(node_pid); $(url_of nimbus); log $LOG)"
}

cmd_start() {
  local t0; t0=$(now)
  lock
  pick_bin
  local sock="$RUN/.s.PGSQL.$PORT"
  (( ${#sock} <= 107 )) ||
    fail "the unix socket path $sock is ${#sock} bytes, over the 107 a socket address holds; choose a shorter NH_PG_DIR"
  local pid; pid=$(node_pid)
  if [[ -n "$pid" ]]; then
    local p; p=$(node_port)
    [[ "$p" == "$PORT" ]] ||
      fail "the cluster of $PG_DIR already runs (pid $pid) on port $p, not $PORT; stop it first: NH_PG_DIR=$PG_DIR NH_PG_PORT=$p $0 stop"
    if answers; then setup_roles; say "already running (pid $pid; $(url_of nimbus))"; return 0; fi
    say "postmaster $pid is up but not answering yet; waiting"
    wait_ready "$t0"; return 0
  fi
  clear_leftovers
  if port_busy "$PORT"; then
    fail "port $PORT is already in use by another process: $(ss -Hltnp "( sport = :$PORT )" | head -n 1). Stop it, or set NH_PG_PORT (cmake -DNH_PG_PORT=... for the tests)"
  fi
  prepare_dirs
  run_initdb
  write_config
  : >> "$LOG"
  echo "---- $(date -Is) scripts/postgres.sh start" >> "$LOG"
  if is_root; then chown "$OS_USER:" "$LOG"; fi
  # setsid: the server must not share the caller's process group (a Ctrl-C in make must not kill it
  # half-way; 'stop' is the way to end it). The postmaster works in the data dir (cwd), which is how
  # is_ours recognises its processes. 9>&-: the server must not inherit the script's lock, or it would
  # hold it for its whole life.
  as_owner "$PG_DIR" setsid "$BIN/postgres" -D "$DATA" >> "$LOG" 2>&1 < /dev/null 9>&- &
  local launcher=$!
  say "starting PostgreSQL $("$BIN/postgres" --version | awk '{ print $3 }') on 127.0.0.1:$PORT (state $PG_DIR)"
  wait_ready "$t0" "$launcher"
}

wait_gone() {   # $1 = pid, $2 = seconds; 0 once it is gone
  local deadline=$(( $(date +%s) + $2 ))
  while kill -0 "$1" 2>/dev/null; do
    (( $(date +%s) < deadline )) || return 1
    sleep 0.1
  done
}

cmd_stop() {
  local t0; t0=$(now)
  [[ -d "$PG_DIR" ]] || { say "not running (no $PG_DIR)"; return 0; }
  lock
  local pid; pid=$(node_pid)
  if [[ -z "$pid" ]]; then
    say "not running"
  else
    say "stopping the cluster of $PG_DIR (pid $pid)"
    kill -INT "$pid" 2>/dev/null || true     # fast shutdown: roll back open transactions, checkpoint, exit
    if ! wait_gone "$pid" "$TIMEOUT"; then
      echo "postgres: postmaster $pid still alive after ${TIMEOUT}s; immediate shutdown (look at $LOG)" >&2
      kill -QUIT "$pid" 2>/dev/null || true
      wait_gone "$pid" 10 || kill -9 "$pid" 2>/dev/null || true
    fi
    kill -0 "$pid" 2>/dev/null && fail "postmaster $pid survived kill -9"
    say "stopped in $(elapsed "$t0")s"
  fi
  # backends orphaned by a killed postmaster exit by themselves; these did not
  local left; left=$(cluster_pids)
  if [[ -n "$left" ]]; then
    echo "postgres: killing processes left over from the cluster: $(tr '\n' ' ' <<<"$left")" >&2
    # shellcheck disable=SC2086
    kill -9 $left 2>/dev/null || true
  fi
}

cmd_status() {
  local pid; pid=$(node_pid)
  [[ -n "$pid" ]] || { say "not running (state $PG_DIR)"; exit 1; }
  local p; p=$(node_port)
  [[ "$p" == "$PORT" ]] || { say "running (pid $pid) on port $p, not on NH_PG_PORT=$PORT"; exit 1; }
  answers || { say "running (pid $pid) but 127.0.0.1:$PORT does not accept connections; look at $LOG"; exit 1; }
  say "running and answering (pid $pid; $(url_of nimbus))"
}

check_name() {   # $1 = command, $2 = database name
  local name=${2:-}
  [[ -n "$name" ]] || { echo "usage: $0 $1 NAME" >&2; exit 2; }
  if [[ ! "$name" =~ ^[a-z_][a-z0-9_]*$ || ${#name} -gt 63 ]]; then
    echo "postgres: ERROR: $1: invalid database name '$name': use 1 to 63 lower-case letters, digits and '_', not starting with a digit (names that SQL needs no quotes for)" >&2
    exit 2
  fi
  case "$name" in
    nimbus|postgres|template0|template1)
      echo "postgres: ERROR: $1: '$name' is one of the cluster's own databases; pick another name" >&2
      exit 2 ;;
  esac
}

# psql's error, or a hint when the superuser connection itself failed
admin_failed() {   # $1 = what, $2 = stderr file
  local err; err=$(cat "$2"); rm -f "$2"
  if grep -qiE 'connection to server|No such file or directory|could not connect' <<<"$err"; then
    fail "$1: cannot connect as the superuser through $(admin_conninfo): $err
Is the cluster running? $0 status (start it: $0 start)"
  fi
  fail "$1: $err"
}

cmd_createdb() {
  check_name createdb "${1:-}"
  local err; err=$(mktemp)
  if ! admin_psql -v "name=$1" > /dev/null 2>"$err" <<'SQL'; then
CREATE DATABASE :"name" OWNER nimbus;
SQL
    grep -q "already exists" "$err" && { rm -f "$err"; fail "createdb: database $1 already exists; drop it first ($0 dropdb $1) or pick another name"; }
    admin_failed "createdb $1" "$err"
  fi
  rm -f "$err"
  url_of "$1"
}

cmd_dropdb() {
  check_name dropdb "${1:-}"
  local err; err=$(mktemp)
  # FORCE: a test that crashed may still hold connections to it
  admin_psql -v "name=$1" > /dev/null 2>"$err" <<'SQL' || admin_failed "dropdb $1" "$err"
DROP DATABASE IF EXISTS :"name" WITH (FORCE);
SQL
  rm -f "$err"
}

usage() {
  echo "usage: $0 install|start|stop|status|url|admin-url|createdb NAME|dropdb NAME   (state dir: \$NH_PG_DIR, default build/postgres; port \$NH_PG_PORT, default 55432)" >&2
  exit 2
}

case "${1:-}" in
  install)   cmd_install ;;
  start)     cmd_start ;;
  stop)      cmd_stop ;;
  status)    cmd_status ;;
  url)       url_of nimbus ;;
  admin-url) admin_url ;;
  createdb)  cmd_createdb "${2:-}" ;;
  dropdb)    cmd_dropdb "${2:-}" ;;
  *) usage ;;
esac
