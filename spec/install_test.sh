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
assert(require("nimbus").endpoint, "nimbus module incomplete")
LUA
got=$(env -u NIMBUS_LUA_DIR "$PREFIX/bin/nimbus-host" -l "$PREFIX/where.lua")
want="$PREFIX/bin/../share/nimbus-host/lua/nimbus/init.lua"
if [[ "$got" != "$want" ]]; then
  echo "installed host loaded nimbus from $got, expected $want" >&2
  echo "0 passed, 1 failed"
  exit 1
fi
echo "1 passed, 0 failed"
