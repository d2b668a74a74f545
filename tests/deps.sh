#!/usr/bin/env bash
# Installs what dipam's demo and test suite need on Debian: the reference CNI plugins
# (host-local, ptp, bridge in /usr/lib/cni) and iproute2 (ip netns). Idempotent; a no-op when
# everything is present.
set -euo pipefail
need=()
[ -x /usr/lib/cni/host-local ] || need+=(containernetworking-plugins)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "missing: ${need[*]}; run as root (or: sudo apt-get install -y ${need[*]})" >&2
    exit 1
  fi
  echo "installing: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
