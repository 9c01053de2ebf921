#!/usr/bin/env bash
# `make demo`: runs the CrmErpDemo (samples/crm-erp) in one host on the embedded default.
# It prints the API URLs, plays a short narrated run (DEMO_QUIET=1 skips it) and keeps
# running until Ctrl-C. DEMO_EXIT=1 stops the host once the narration is done (tests).
# The store and the demo's databases live in DEMO_DIR (default build/demo).
set -euo pipefail
NH=${1:-build/host/nimbus-host}
NH=$(cd "$(dirname "$NH")" && pwd)/$(basename "$NH")
cd "$(dirname "$0")/.."
DIR=${DEMO_DIR:-build/demo}
mkdir -p "$DIR"
export NIMBUS_STORE="$DIR/nimbus.db"
LOG="$DIR/host.log"
echo "CrmErpDemo: store $NIMBUS_STORE, host log $LOG (tail -f it in another terminal)"
ADMIN=${NIMBUS_ADMIN:-127.0.0.1:7070}
case "$ADMIN" in
  off) ;;
  *:0) echo "console: on a free port; the host log names it (operator API on ...)" ;;
  *:*) echo "console: http://$ADMIN/console/" ;;
  *) echo "console: http://127.0.0.1:$ADMIN/console/" ;;
esac
# Ctrl-C reaches the host too (same process group): it finishes its handlers and stops.
trap '' INT
if ! "$NH" samples/crm-erp/demo.lua --store "$NIMBUS_STORE" 2>>"$LOG"; then
  echo "the demo host stopped with an error; the end of $LOG:" >&2
  tail -n 20 "$LOG" >&2
  exit 1
fi
