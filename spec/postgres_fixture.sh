#!/usr/bin/env bash
# ctest fixture "postgres" (spec/CMakeLists.txt): the PostgreSQL cluster for the tests of the PostgreSQL store.
#
#   spec/postgres_fixture.sh start   scripts/postgres.sh start, unless a cluster already answers
#   spec/postgres_fixture.sh stop    scripts/postgres.sh stop, only if `start` above launched it
#
# A cluster that was up before the tests (one a developer started by hand) is used as it is and left
# running; the tests only ever touch databases of their own (scripts/postgres.sh createdb). Which case
# applies is remembered in $NH_PG_DIR/started-by-ctest. Env as for scripts/postgres.sh (NH_PG_DIR,
# NH_PG_PORT, NH_PG_ADMIN_URL, ...).
#
# Another server answering on the port is only usable if the tests can reach it as they would reach
# ours: as nimbus/nimbus over TCP and as the superuser through NH_PG_ADMIN_URL. By default that URL names
# the socket in $NH_PG_DIR, which a cluster of another state dir (another build tree on the same port)
# does not have: then the start fails and says how to separate them.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
pg=$here/../scripts/postgres.sh
PG_DIR=${NH_PG_DIR:?NH_PG_DIR must name the cluster state dir}
PORT=${NH_PG_PORT:-55432}
marker=$PG_DIR/started-by-ctest

answers() {   # some server accepts connections on our port
  pg_isready -q -h 127.0.0.1 -p "$PORT" -t 5 >/dev/null 2>&1
}

usable() {    # ... and takes the connections the tests make; prints why not
  local url admin err
  url=${NH_PG_URL:-$("$pg" url)}
  admin=${NH_PG_ADMIN_URL:-$("$pg" admin-url)}
  err=$(PGCONNECT_TIMEOUT=10 psql -X -q -A -t -d "$url" -c 'SELECT 1' 2>&1 >/dev/null) ||
    { echo "$url: $err"; return 1; }
  err=$(PGCONNECT_TIMEOUT=10 psql -X -q -A -t -d "$admin" -c 'SELECT 1' 2>&1 >/dev/null) ||
    { echo "$admin: $err"; return 1; }
}

case "${1:-}" in
  start)
    mkdir -p "$PG_DIR"
    if "$pg" status >/dev/null 2>&1; then
      # ours from an earlier run that never got to stop (marker kept), or one started by hand
      [[ -e "$marker" ]] || echo "postgres fixture: the cluster of $PG_DIR is already running; leaving it running"
      exit 0
    fi
    if answers; then
      if ! why=$(usable); then
        echo "postgres fixture: ERROR: a PostgreSQL server that is not the cluster of $PG_DIR answers on 127.0.0.1:$PORT, and the tests cannot use it ($why)." >&2
        echo "postgres fixture: stop it (the state dir it was started with: NH_PG_DIR=... scripts/postgres.sh stop), or give this build tree its own port: cmake -DNH_PG_PORT=55433 ." >&2
        exit 1
      fi
      rm -f "$marker"
      echo "postgres fixture: another PostgreSQL answers on 127.0.0.1:$PORT and takes the tests' connections; using it, leaving it running"
      exit 0
    fi
    touch "$marker"      # before the start: a start that fails half-way is still cleaned up by stop
    exec "$pg" start
    ;;
  stop)
    if [[ ! -e "$marker" ]]; then
      echo "postgres fixture: the cluster was not started by these tests; leaving it running"
      exit 0
    fi
    "$pg" stop
    rm -f "$marker"
    ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
