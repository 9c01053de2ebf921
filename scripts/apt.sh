#!/usr/bin/env bash
# Sourced by scripts/deps.sh, rabbitmq.sh and postgres.sh: installs the Debian packages a
# script needs, only those missing; as a normal user prints the command to run as root.
#
#   source scripts/apt.sh
#   nh_apt_install NAME PACKAGE...   NAME prefixes the messages ("postgres: installing: ...")
#
# Returns 0 when everything is installed (or was just installed), 1 when packages are
# missing and we are not root (the command is on stderr). The package scripts cannot start
# services here (policy-rc.d exits 101), which is what we want: the scripts run their
# servers themselves.

nh_apt_missing() {
  local p status
  for p in "$@"; do
    status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    [[ "$status" == "install ok installed" ]] || echo "$p"
  done
}

nh_apt_install() {
  local name=$1 missing
  shift
  mapfile -t missing < <(nh_apt_missing "$@")
  [[ ${#missing[@]} -eq 0 ]] && return 0
  local cmd="apt-get install -y --no-install-recommends ${missing[*]}"
  if [[ $(id -u) -ne 0 ]]; then
    echo "$name: missing Debian packages: ${missing[*]}" >&2
    echo "$name: run as root:  apt-get update && $cmd" >&2
    return 1
  fi
  echo "$name: installing: ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # shellcheck disable=SC2086
  $cmd -qq >/dev/null
}
