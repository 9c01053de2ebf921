#!/usr/bin/env bash
# `make demo` as a user runs it: the CrmErpDemo's narrated run must succeed step by step.
set -euo pipefail
NH=$1
SRC=$(cd "$(dirname "$0")/.." && pwd)
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
out=$(cd "$SRC" && DEMO_DIR="$DIR" DEMO_EXIT=1 CRM_API_PORT=0 ERP_API_PORT=0 DATAPLATFORM_DELAY=0 \
      timeout 150 scripts/demo.sh "$NH" 2>"$DIR/host.log") || { echo "demo failed:"; echo "$out"; tail -30 "$DIR/host.log"; exit 1; }
echo "$out"
for want in "CRM account linked to it: yes" "after the resubmit the ERP customer exists: yes" \
            "the DMF job settled and the customer was imported: yes" "the demo keeps running"; do
  grep -qF "$want" <<<"$out" || { echo "missing in the narration: $want"; tail -30 "$DIR/host.log"; echo "0 passed, 1 failed"; exit 1; }
done
echo "1 passed, 0 failed"
