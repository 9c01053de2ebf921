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

# shellcheck source=scripts/apt.sh
source "$(dirname "${BASH_SOURCE[0]}")/apt.sh"
nh_apt_install nimbus-host "${packages[@]}"
