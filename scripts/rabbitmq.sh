#!/usr/bin/env bash
# RabbitMQ 3.10 (Debian 12) as a plain background process, for the AMQP 1.0 transport tests.
#
#   scripts/rabbitmq.sh install   apt-get install rabbitmq-server python3-qpid-proton (only what is missing)
#   scripts/rabbitmq.sh start     start on 127.0.0.1 and wait until ready (idempotent)
#   scripts/rabbitmq.sh stop      stop cleanly (idempotent)
#   scripts/rabbitmq.sh status    exit 0 if running and ready
#
# Listens on 127.0.0.1 only: AMQP 0-9-1 and AMQP 1.0 on $NH_RMQ_PORT (5672), management HTTP API on
# $NH_RMQ_MGMT_PORT (15672), AMQP over TLS on $NH_RMQ_TLS_PORT (5671, certificates for localhost made in
# $NH_RMQ_DIR/tls), Erlang distribution on $NH_RMQ_DIST_PORT (25672), epmd on 4369.
# All state (mnesia, logs, config, cookie) lives in $NH_RMQ_DIR (default build/rabbitmq). User guest/guest,
# which RabbitMQ only accepts from localhost. The Erlang node name is $NH_RMQ_NODE (default nimbus@localhost):
# a second broker beside the first needs its own name, state dir and ports (epmd on 4369 is shared).
#
# Why it looks like this (what was found on the Debian machines the project runs on):
# - There is no systemd and policy-rc.d forbids apt from starting services, so we run the server ourselves.
# - We call /usr/lib/rabbitmq/bin/*, not /usr/sbin/rabbitmqctl: the /usr/sbin wrappers su to user rabbitmq,
#   which reads a different .erlang.cookie and is then rejected by our node ("Invalid challenge reply").
# - HOME is the state dir, so the server and the CLI share one .erlang.cookie. It must exist before any CLI
#   call, otherwise the CLI stalls ~6.5 s.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)

RMQ_DIR=${NH_RMQ_DIR:-$root/build/rabbitmq}
case "$RMQ_DIR" in /*) ;; *) RMQ_DIR=$PWD/$RMQ_DIR ;; esac
AMQP_PORT=${NH_RMQ_PORT:-5672}
MGMT_PORT=${NH_RMQ_MGMT_PORT:-15672}
TLS_PORT=${NH_RMQ_TLS_PORT:-5671}     # AMQP over TLS (amqps://), a self-signed CA made at the first start
DIST_PORT=${NH_RMQ_DIST_PORT:-25672}
TIMEOUT=${NH_RMQ_TIMEOUT:-60}          # seconds, for start and for stop
NODE=${NH_RMQ_NODE:-nimbus@localhost}
RMQ_BIN=/usr/lib/rabbitmq/bin
PACKAGES=(rabbitmq-server python3-qpid-proton curl openssl)

export HOME=$RMQ_DIR/home
export RABBITMQ_NODENAME=$NODE
export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT=$AMQP_PORT RABBITMQ_DIST_PORT=$DIST_PORT
export RABBITMQ_CONFIG_FILE=$RMQ_DIR/rabbitmq.conf
export RABBITMQ_ENABLED_PLUGINS_FILE=$RMQ_DIR/enabled_plugins
export RABBITMQ_MNESIA_BASE=$RMQ_DIR/mnesia RABBITMQ_LOG_BASE=$RMQ_DIR/log
export RABBITMQ_PID_FILE=$RMQ_DIR/rabbit.pid
export ERL_EPMD_ADDRESS=127.0.0.1 ERL_CRASH_DUMP=$RMQ_DIR/erl_crash.dump
export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"

LOG=$RMQ_DIR/log/$NODE.log     # the broker's own log
OUT=$RMQ_DIR/server.out        # stdout/stderr of rabbitmq-server (boot errors, crash reasons)
API=http://127.0.0.1:$MGMT_PORT/api

say() { echo "rabbitmq: $*"; }
launched=0   # set once this run has launched or found a node: only then are the logs about this failure
fail() {
  echo "rabbitmq: ERROR: $*" >&2
  echo "rabbitmq: look at $LOG and $OUT" >&2
  (( launched )) || exit 1
  for f in "$OUT" "$LOG"; do
    [[ -s "$f" ]] && { echo "--- last lines of $f" >&2; tail -n 15 "$f" >&2; }
  done
  exit 1
}

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# pid of our beam.smp, or nothing. The pid file alone is not trusted (pid reuse after a crash): the
# process must also be a beam whose command line names our HOME (3.10 passes the mnesia dir by environment,
# not on the command line; "-home DIR" is always there).
node_pid() {
  local pid
  if [[ -s "$RABBITMQ_PID_FILE" ]]; then
    pid=$(tr -dc 0-9 < "$RABBITMQ_PID_FILE")
    if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null &&
       tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "-home $HOME "; then
      echo "$pid"; return 0
    fi
  fi
  # A node from this state dir whose pid file was lost (e.g. deleted by hand).
  pgrep -f -- "beam.* -home $HOME " | head -n 1 || true
}

api_ok() {   # the management API answers with our credentials
  curl -fsS -o /dev/null --max-time 2 -u guest:guest "$API/overview" 2>/dev/null
}

port_busy() {  # something listens on 127.0.0.1:$1 (or on all addresses)
  ss -Hltn "( sport = :$1 )" 2>/dev/null | grep -q .
}

cmd_install() {
  # shellcheck source=scripts/apt.sh
  source "$here/apt.sh"
  nh_apt_install rabbitmq "${PACKAGES[@]}" || exit 1
  say "installed: ${PACKAGES[*]}"
}

# A CA and a server certificate for localhost / 127.0.0.1, so amqps:// is tested against the real
# broker (the transport verifies the peer by default; tests pass the CA with ?ca=).
make_tls() {
  local d=$RMQ_DIR/tls
  [[ -s "$d/server.pem" && -s "$d/ca.pem" ]] && return 0
  command -v openssl >/dev/null || fail "openssl is needed for the broker's TLS listener"
  mkdir -p "$d"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=nimbus-host test CA" \
    -keyout "$d/ca.key" -out "$d/ca.pem" >/dev/null 2>&1 || fail "openssl: cannot make the test CA"
  openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" -keyout "$d/server.key" -out "$d/server.csr" \
    >/dev/null 2>&1 || fail "openssl: cannot make the server key"
  printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' > "$d/ext.cnf"
  openssl x509 -req -in "$d/server.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial -days 3650 \
    -extfile "$d/ext.cnf" -out "$d/server.pem" >/dev/null 2>&1 || fail "openssl: cannot sign the server certificate"
  chmod 600 "$d"/*.key
}

write_config() {
  mkdir -p "$HOME" "$RMQ_DIR/mnesia" "$RMQ_DIR/log"
  make_tls
  # AMQP listener ip/port come from RABBITMQ_NODE_IP_ADDRESS / RABBITMQ_NODE_PORT.
  cat > "$RABBITMQ_CONFIG_FILE" <<EOF
# written by scripts/rabbitmq.sh start; edits are overwritten
management.tcp.ip = 127.0.0.1
management.tcp.port = $MGMT_PORT
listeners.ssl.default = 127.0.0.1:$TLS_PORT
ssl_options.cacertfile = $RMQ_DIR/tls/ca.pem
ssl_options.certfile = $RMQ_DIR/tls/server.pem
ssl_options.keyfile = $RMQ_DIR/tls/server.key
ssl_options.verify = verify_none
ssl_options.fail_if_no_peer_cert = false
# AMQP 1.0 clients that authenticate with ANONYMOUS act as guest on vhost /
amqp1_0.default_user = guest
amqp1_0.default_vhost = /
log.console = false
log.file.level = info
# how often queues report to the management API (default 5 s); hosts spreading partitions
# read who is active there (docs/broker-partitions.md), so moves show sooner
collect_statistics_interval = ${NH_RMQ_STATS_MS:-1000}
EOF
  # Plugin dependencies (management_agent, web_dispatch, amqp10_common, ...) are resolved at boot.
  echo '[rabbitmq_amqp1_0,rabbitmq_management].' > "$RABBITMQ_ENABLED_PLUGINS_FILE"
}

# epmd outlives the node. A leftover one is harmless if it answers, but one that is hung, or that still lists
# our node name without a node behind it, makes the next boot fail; kill it in those cases.
fix_epmd() {
  command -v epmd >/dev/null || return 0
  port_busy 4369 || return 0
  local names
  if ! names=$(timeout 5 epmd -names 2>/dev/null); then
    say "epmd on 4369 does not answer; killing it"
    pkill -9 -x epmd 2>/dev/null || true   # epmd is a single per-host daemon named exactly epmd
    sleep 0.5
  elif grep -q "^name ${NODE%@*} " <<<"$names"; then
    fail "epmd lists a node named '${NODE%@*}' but no node of $RMQ_DIR runs; another RabbitMQ with the same node name is up (epmd -names: $(tr '\n' ' ' <<<"$names"))"
  fi
}

wait_ready() {   # $1 = start time, $2 = pid of the launcher we just started (if any)
  launched=1
  local t0=$1 deadline=$(( $(date +%s) + TIMEOUT )) launcher=${2:-}
  # 1. the pid file (written early in boot, once distribution is up)
  until [[ -n "$(node_pid)" ]]; do
    if [[ -n "$launcher" ]] && ! kill -0 "$launcher" 2>/dev/null; then
      fail "rabbitmq-server exited during boot"
    fi
    (( $(date +%s) < deadline )) || fail "no running node after ${TIMEOUT}s (pid file $RABBITMQ_PID_FILE)"
    sleep 0.2
  done
  # 2. the rabbit application and its plugins are started
  local left=$(( deadline - $(date +%s) )); (( left > 1 )) || left=1
  if ! "$RMQ_BIN/rabbitmqctl" -q await_startup --timeout "$left" >> "$RMQ_DIR/cli.out" 2>&1; then
    # the node may still come up; the API poll below has the final word, but a dead node fails now
    [[ -n "$(node_pid)" ]] || fail "node exited during boot (rabbitmqctl await_startup: $(tail -n 1 "$RMQ_DIR/cli.out"))"
  fi
  # 3. the management API answers (also proves the listener config and the guest account)
  until api_ok; do
    [[ -n "$(node_pid)" ]] || fail "node exited during boot"
    (( $(date +%s) < deadline )) || fail "management API $API/overview not answering after ${TIMEOUT}s"
    sleep 0.2
  done
  say "ready in $(elapsed "$t0")s (pid $(node_pid); amqp://127.0.0.1:$AMQP_PORT, $API; log $LOG)"
}

cmd_start() {
  local t0; t0=$(now)
  [[ -x "$RMQ_BIN/rabbitmq-server" ]] || fail "rabbitmq-server is not installed; run: $0 install"
  mkdir -p "$HOME" "$RMQ_DIR/mnesia" "$RMQ_DIR/log"
  local pid; pid=$(node_pid)
  if [[ -n "$pid" ]]; then
    if api_ok; then say "already running (pid $pid)"; return 0; fi
    say "node $pid is up but not ready yet; waiting"
    wait_ready "$t0"; return 0
  fi
  rm -f "$RABBITMQ_PID_FILE"
  local p
  for p in "$AMQP_PORT" "$MGMT_PORT" "$DIST_PORT" "$TLS_PORT"; do
    port_busy "$p" && fail "port $p is already in use by another process: $(ss -Hltnp "( sport = :$p )" | head -n 1)"
  done
  fix_epmd
  write_config
  : > "$OUT"
  # setsid: the broker must not share the caller's process group (a Ctrl-C in make must not kill it
  # half-way; 'stop' is the way to end it).
  setsid "$RMQ_BIN/rabbitmq-server" >> "$OUT" 2>&1 < /dev/null &
  local launcher=$!
  echo "$launcher" > "$RMQ_DIR/launcher.pid"
  say "starting $NODE (state $RMQ_DIR)"
  wait_ready "$t0" "$launcher"
}

cmd_stop() {
  local t0; t0=$(now)
  local pid; pid=$(node_pid)
  if [[ -z "$pid" ]]; then
    say "not running"
  else
    say "stopping $NODE (pid $pid)"
    "$RMQ_BIN/rabbitmqctl" -q stop >/dev/null 2>&1 ||
      echo "rabbitmq: rabbitmqctl stop failed; waiting, then kill -9" >&2
    local deadline=$(( $(date +%s) + TIMEOUT ))
    while kill -0 "$pid" 2>/dev/null; do
      if (( $(date +%s) >= deadline )); then
        echo "rabbitmq: node $pid still alive after ${TIMEOUT}s; kill -9 (look at $LOG)" >&2
        kill -9 "$pid" 2>/dev/null || true
        sleep 0.5
        break
      fi
      sleep 0.2
    done
    kill -0 "$pid" 2>/dev/null && fail "node $pid survived kill -9"
    say "stopped in $(elapsed "$t0")s"
  fi
  rm -f "$RABBITMQ_PID_FILE" "$RMQ_DIR/launcher.pid"
  # epmd -daemon outlives the node; without -relaxed_command_check it refuses to die while other nodes are
  # registered, so someone else's Erlang node is never disturbed.
  if command -v epmd >/dev/null; then epmd -kill >/dev/null 2>&1 || true; fi
}

cmd_status() {
  local pid; pid=$(node_pid)
  [[ -n "$pid" ]] || { say "not running"; exit 1; }
  api_ok || { say "running (pid $pid) but $API/overview does not answer; look at $LOG"; exit 1; }
  say "running and ready (pid $pid; amqp://127.0.0.1:$AMQP_PORT, $API)"
}

case "${1:-}" in
  install) cmd_install ;;
  start)   cmd_start ;;
  stop)    cmd_stop ;;
  status)  cmd_status ;;
  *) echo "usage: $0 install|start|stop|status   (state dir: \$NH_RMQ_DIR, default build/rabbitmq)" >&2; exit 2 ;;
esac
