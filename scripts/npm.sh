#!/usr/bin/env bash
# Installs the npm packages of the browser specs (spec/browser/package-lock.json: playwright-core,
# ajv) into spec/browser/node_modules when they are missing or the lock changed. No browser
# download: the specs drive Debian's chromium (scripts/deps.sh installs it).
#
#   scripts/npm.sh             the browser specs' packages (make test)
#   scripts/npm.sh node-peer   the Node.js peer of the AMQP bench (spec/bench/node-peer: rhea and
#                              better-sqlite3), run by spec/bench/amqp.lua when they are missing
#
# node-peer: better-sqlite3 is a native addon. Its install script first asks prebuild-install for
# a binary from GitHub, then falls back to node-gyp, which downloads the Node headers from
# nodejs.org; neither is reachable from a machine that only sees Debian and the npm registry. So
# it is built from source (npm_config_build_from_source: no GitHub request) against the headers
# of the running node (npm_config_nodedir: its prefix, which must hold include/node/node_api.h;
# the nodejs package installs /usr/include/node): g++, make and python3 are needed, about 2
# minutes on 2 cores. The stamp holds the lock and the node ABI: a new node rebuilds it.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

if [[ "${1:-}" == "node-peer" ]]; then
  dir="$root/spec/bench/node-peer"
  stamp="$dir/node_modules/.nimbus-lock"
  command -v node >/dev/null || { echo "npm.sh node-peer: no node on PATH" >&2; exit 1; }
  command -v npm >/dev/null || { echo "npm.sh node-peer: no npm on PATH" >&2; exit 1; }
  abi="$(node -p 'process.version + " abi " + process.versions.modules')"
  want="$(cat "$dir/package-lock.json"; echo "node $abi")"
  if [[ -f "$stamp" ]] && [[ "$(cat "$stamp")" == "$want" ]]; then
    exit 0
  fi
  nodedir="$(dirname "$(dirname "$(readlink -f "$(command -v node)")")")"
  if [[ ! -f "$nodedir/include/node/node_api.h" ]]; then
    echo "npm.sh node-peer: no Node headers in $nodedir/include/node (node $abi); better-sqlite3 cannot" \
         "be built without downloading them from nodejs.org" >&2
    exit 1
  fi
  for tool in g++ make python3; do
    command -v "$tool" >/dev/null || { echo "npm.sh node-peer: $tool is needed to build better-sqlite3" >&2; exit 1; }
  done
  echo "installing the AMQP bench's Node.js peer (spec/bench/node-peer/package-lock.json: rhea, better-sqlite3" \
       "built from source against $nodedir/include/node, node $abi; about 2 minutes)" >&2
  rm -f "$stamp"
  ( cd "$dir" && npm_config_build_from_source=true npm_config_nodedir="$nodedir" npm_config_jobs=max \
      npm ci --no-audit --no-fund --no-update-notifier --loglevel=error )
  ( cd "$dir" && node -e 'new (require("better-sqlite3"))(":memory:").prepare("select 1").get(); require("rhea")' )
  printf '%s' "$want" > "$stamp"
  exit 0
fi

dir="$root/spec/browser"
stamp="$dir/node_modules/.nimbus-lock"
if [[ -f "$stamp" ]] && cmp -s "$stamp" "$dir/package-lock.json"; then
  exit 0
fi
echo "installing the browser specs' npm packages (spec/browser/package-lock.json)" >&2
( cd "$dir" && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error )
cp "$dir/package-lock.json" "$stamp"
