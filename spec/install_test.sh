#!/usr/bin/env bash
# An installed nimbus-host finds its Lua runtime under <prefix>/share/nimbus-host/lua,
# not in the source tree it was built from.
set -euo pipefail
BUILD=$1
PREFIX=$(mktemp -d)
trap 'rm -rf "$PREFIX"' EXIT
cmake --install "$BUILD" --prefix "$PREFIX" >/dev/null
cat > "$PREFIX/where.lua" <<'LUA'
print(package.searchpath("nimbus", package.path))
print(package.searchpath("adapters.http_forward", package.path))
assert(require("nimbus").endpoint, "nimbus module incomplete")
LUA
got=$(env -u NIMBUS_LUA_DIR "$PREFIX/bin/nimbus-host" -l "$PREFIX/where.lua")
# the host resolves its directories (realpath): compare with the prefix's own real path
share=$(cd "$PREFIX/share/nimbus-host" && pwd -P)
want="$share/lua/nimbus/init.lua
$share/adapters/http_forward.lua"
if [[ "$got" != "$want" ]]; then
  echo "installed host loaded nimbus and the adapter library from:" >&2
  echo "$got" >&2
  echo "expected:" >&2
  echo "$want" >&2
  echo "0 passed, 1 failed"
  exit 1
fi
# ... and the console's files under <prefix>/share/nimbus-host/console
cat > "$PREFIX/a.lua" <<'LUA'
require("nimbus").endpoint("Ep"):on("T", function() end)
LUA
log="$PREFIX/host.log"
env -u NIMBUS_CONSOLE_DIR "$PREFIX/bin/nimbus-host" "$PREFIX/a.lua" --store "$PREFIX/s.db" --admin 127.0.0.1:0 \
  --no-reload >"$log" 2>&1 &
pid=$!
for _ in $(seq 1 200); do grep -q "operator API on" "$log" && break; sleep 0.05; done
kill "$pid"; wait "$pid" || true
want="files in $(cd "$PREFIX/share/nimbus-host/console" && pwd -P))"
if ! grep -qF "$want" "$log"; then
  echo "installed host did not serve the console from its prefix (want: $want):" >&2
  cat "$log" >&2
  echo "1 passed, 1 failed"
  exit 1
fi
echo "2 passed, 0 failed"
