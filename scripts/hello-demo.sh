#!/usr/bin/env bash
# `make demo`: runs samples/hello on the embedded default and walks through a failure,
# its resubmit and the in-order replay of the parked siblings. DEMO_EXIT=1 stops the
# host at the end instead of leaving it running.
set -euo pipefail
NH=${1:-build/host/nimbus-host}
NH=$(cd "$(dirname "$NH")" && pwd)/$(basename "$NH")
cd "$(dirname "$0")/.."
OWN_DIR=0
[[ -n "${DEMO_DIR:-}" ]] || OWN_DIR=1
DIR=${DEMO_DIR:-$(mktemp -d -t nimbus-demo.XXXXXX)}
STORE="$DIR/nimbus.db"
LOG="$DIR/host.log"
export NIMBUS_STORE="$STORE"

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
wait_for() {   # wait_for DESCRIPTION COMMAND...: poll up to 10 s
  local what=$1; shift
  for _ in $(seq 1 200); do "$@" >/dev/null 2>&1 && return 0; sleep 0.05; done
  echo "demo: timed out waiting for $what (log: $LOG)" >&2; exit 1
}
count_status() { "$NH" events --status "$1" --json | grep -c . || true; }

"$NH" samples/hello/adapter.lua >"$LOG" 2>&1 &
HOST=$!
trap 'kill $HOST 2>/dev/null || true' EXIT
wait_for "the host to start" grep -q 'ready:' "$LOG"
say "host running: store $STORE, log $LOG"

say "publishing 4 orders for customer alice; the second one fails"
"$NH" publish OrderPlaced '{"order_id":"A-1","sku":"BOOK"}' --session alice >/dev/null
"$NH" publish OrderPlaced '{"order_id":"A-2","sku":"BROKEN"}' --session alice >/dev/null
"$NH" publish OrderPlaced '{"order_id":"A-3","sku":"PEN"}' --session alice >/dev/null
"$NH" publish OrderPlaced '{"order_id":"A-4","sku":"INK"}' --session alice >/dev/null
say "and one big order for bob that waits for a manager (a hand-off)"
"$NH" publish OrderPlaced '{"order_id":"B-1","sku":"SOFA","total":2400}' --session bob >/dev/null
wait_for "the failure (after 2 automatic retries)" sh -c "'$NH' events --status failed --json | grep -q '\"retry_count\":2'"
wait_for "the parked siblings" sh -c "[ \$('$NH' events --status deferred --json | grep -c .) -ge 2 ]"
"$NH" events
say "alice's session is blocked by the failed order; A-3 and A-4 are parked (Deferred)"
"$NH" sessions

FAILED=$("$NH" events --status failed --json | head -n1 | sed 's/.*"event_id":"\([^"]*\)".*/\1/')
say "the operator fixes the order and resubmits it with a new body"
echo "\$ nimbus-host resubmit $FAILED --body '{\"order_id\":\"A-2\",\"sku\":\"BOOK\"}'"
"$NH" resubmit "$FAILED" --body '{"order_id":"A-2","sku":"BOOK"}'
wait_for "the replay" sh -c "[ \$('$NH' events --status deferred --json | grep -c .) -eq 0 ]"
"$NH" events --endpoint OrderService
say "the parked orders replayed in order; ShippingService got one copy per accepted order"
"$NH" events --endpoint ShippingService

PENDING=$("$NH" events --status pending --json | head -n1 | sed 's/.*"event_id":"\([^"]*\)".*/\1/')
say "the manager approves bob's order: the hand-off completes without running the handler again"
"$NH" handoff complete "$PENDING" --result '{"approved_by":"carol"}'
wait_for "the hand-off" sh -c "[ \$('$NH' events --status pending --json | grep -c .) -eq 0 ]"
"$NH" show "$PENDING"

if [[ "${DEMO_EXIT:-0}" == 1 ]]; then
  kill -TERM $HOST; wait $HOST
  trap - EXIT
  say "demo finished"
  # a run that stops on its own (the tests) leaves no store behind; a failed one keeps it
  # for its log (the path is in the message)
  if [[ $OWN_DIR == 1 ]]; then rm -rf "$DIR"; fi
  exit 0
fi
say "the host keeps running. Try, in another terminal:"
cat <<TRY
  export NIMBUS_STORE=$STORE
  $NH publish OrderPlaced '{"order_id":"C-1","sku":"BROKEN"}' --session carol
  $NH events --status failed
  $NH skip EVENT_ID
Ctrl-C stops the host.
TRY
trap 'kill -TERM $HOST 2>/dev/null || true' INT TERM
wait $HOST || true
