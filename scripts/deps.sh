#!/usr/bin/env bash
# Installs the Debian packages nimbus-host needs (as root), or prints the command.
set -euo pipefail

packages=(
  gcc g++ make cmake pkg-config
  liblua5.4-dev lua5.4 lua-cjson lua-busted
  libuv1-dev libsqlite3-dev sqlite3 libjansson-dev libcurl4-openssl-dev libmicrohttpd-dev
  valgrind python3 wrk curl
  clang libclang-rt-14-dev
  libqpid-proton11-dev libssl-dev rabbitmq-server python3-qpid-proton openssl
  nodejs chromium prometheus
  postgresql libpq-dev
)

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done

if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi

cmd="apt-get install -y --no-install-recommends ${missing[*]}"
if [[ $(id -u) -ne 0 ]]; then
  echo "nimbus-host needs these Debian packages: ${missing[*]}" >&2
  echo "run as root:  apt-get update && $cmd" >&2
  exit 1
fi

echo "installing: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086
$cmd -qq
