#!/usr/bin/env bash
# Runs the README's "your first adapter" walkthrough step by step, as a newcomer would.
set -euo pipefail
NH=$1
SRC=$(cd "$(dirname "$0")/.." && pwd)
DIR=$(mktemp -d)
trap 'kill $HOST 2>/dev/null || true; rm -rf "$DIR"' EXIT
fail() { echo "walkthrough: $*" >&2; exit 1; }

# the README shows the adapter file verbatim
python3 - "$SRC/README.md" "$SRC/samples/first-adapter/greeter.lua" <<'PY' || fail "README does not show samples/first-adapter/greeter.lua verbatim"
import sys
readme, adapter = open(sys.argv[1]).read(), open(sys.argv[2]).read()
sys.exit(0 if adapter.strip() in readme else 1)
PY

python3 - "$SRC/README.md" "$SRC/samples/first-adapter/greeter_spec.lua" <<'PY' || fail "README does not show samples/first-adapter/greeter_spec.lua verbatim"
import sys
readme, spec = open(sys.argv[1]).read(), open(sys.argv[2]).read()
sys.exit(0 if spec.strip() in readme else 1)
PY

cp "$SRC/samples/first-adapter/greeter.lua" "$SRC/samples/first-adapter/greeter_spec.lua" "$DIR/"
cd "$DIR"
"$NH" greeter.lua 2>host.log &
HOST=$!
for _ in $(seq 1 200); do grep -q 'ready:' host.log && break; sleep 0.05; done
grep -q 'ready:' host.log || fail "host did not start: $(cat host.log)"

"$NH" publish CustomerSignedUp '{"name":"Ada","email":"ada@example.com"}' --session ada >/dev/null
"$NH" publish CustomerSignedUp '{"name":"Bob"}' --session bob >/dev/null
"$NH" publish CustomerSignedUp '{"name":"Bob","email":"bob@example.com"}' --session bob >/dev/null

poll() { for _ in $(seq 1 200); do eval "$1" && return 0; sleep 0.05; done; fail "timed out: $1"; }
poll '[ "$("$NH" events --status deferred --json | grep -c .)" = 1 ]'
poll '[ "$("$NH" events --status failed --json | grep -c .)" = 1 ]'
FAILED=$("$NH" events --status failed --json | sed 's/.*"event_id":"\([^"]*\)".*/\1/')
"$NH" events --status failed | grep -q 'has no email' || fail "failure text missing"
"$NH" resubmit "$FAILED" --body '{"name":"Bob","email":"bob@example.org"}' >/dev/null
poll '[ "$("$NH" events --status completed --json | grep -c .)" = 3 ]'
"$NH" show "$FAILED" | grep -q 'ResubmissionRequest' || fail "history lacks the resubmit"
grep -q 'welcome mail sent.*bob@example.org' host.log || fail "resubmitted body not used"
# the README's unit-test example passes, run the way the README says
(cd "$DIR" && "$NH" -l "$(command -v busted)" greeter_spec.lua >spec.out 2>&1) || fail "greeter_spec.lua failed: $(cat "$DIR/spec.out")"
grep -q '3 successes / 0 failures / 0 errors' "$DIR/spec.out" || fail "greeter_spec.lua did not run its 3 tests: $(cat "$DIR/spec.out")"
echo "1 passed, 0 failed"
