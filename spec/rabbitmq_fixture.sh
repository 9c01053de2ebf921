#!/usr/bin/env bash
# ctest fixture "rabbitmq" (spec/CMakeLists.txt): the broker for the functional_amqp_* tests.
#
#   spec/rabbitmq_fixture.sh start   scripts/rabbitmq.sh start, unless a broker already answers
#   spec/rabbitmq_fixture.sh stop    scripts/rabbitmq.sh stop, only if `start` above launched it
#
# A broker that was up before the tests (one a developer started by hand, or the one of the other
# build tree: build/ and build-asan/ share the ports and the node name) is used as it is and left
# running; the tests only ever touch vhosts of their own. Which case applies is remembered in
# $NH_RMQ_DIR/started-by-ctest. Env as for scripts/rabbitmq.sh (NH_RMQ_DIR, NH_RMQ_PORT, ...).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
rmq=$here/../scripts/rabbitmq.sh
RMQ_DIR=${NH_RMQ_DIR:?NH_RMQ_DIR must name the broker state dir}
MGMT_PORT=${NH_RMQ_MGMT_PORT:-15672}
marker=$RMQ_DIR/started-by-ctest

answers() {   # some broker's management API answers guest on our port
  curl -fsS -o /dev/null --max-time 5 -u guest:guest "http://127.0.0.1:$MGMT_PORT/api/overview" 2>/dev/null
}

case "${1:-}" in
  start)
    mkdir -p "$RMQ_DIR"
    if "$rmq" status >/dev/null 2>&1; then
      # ours from an earlier run that never got to stop (marker kept), or one started by hand
      [[ -e "$marker" ]] || echo "rabbitmq fixture: the broker of $RMQ_DIR is already running; leaving it running"
      exit 0
    fi
    if answers; then
      rm -f "$marker"
      echo "rabbitmq fixture: another broker answers on 127.0.0.1:$MGMT_PORT; using it, leaving it running"
      exit 0
    fi
    touch "$marker"      # before the start: a start that fails half-way is still cleaned up by stop
    exec "$rmq" start
    ;;
  stop)
    if [[ ! -e "$marker" ]]; then
      echo "rabbitmq fixture: the broker was not started by these tests; leaving it running"
      exit 0
    fi
    "$rmq" stop
    rm -f "$marker"
    ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
