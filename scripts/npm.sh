#!/usr/bin/env bash
# Installs the npm packages of the browser specs (spec/browser/package-lock.json: playwright-core,
# ajv) into spec/browser/node_modules when they are missing or the lock changed. No browser
# download: the specs drive Debian's chromium (scripts/deps.sh installs it).
set -euo pipefail
dir="$(cd "$(dirname "$0")/../spec/browser" && pwd)"
stamp="$dir/node_modules/.nimbus-lock"
if [[ -f "$stamp" ]] && cmp -s "$stamp" "$dir/package-lock.json"; then
  exit 0
fi
echo "installing the browser specs' npm packages (spec/browser/package-lock.json)" >&2
( cd "$dir" && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error )
cp "$dir/package-lock.json" "$stamp"
