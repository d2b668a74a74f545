#!/usr/bin/env bash
# Installs what dipam's demo and test suite need on Debian: the reference CNI plugins
# (host-local, ptp, bridge, portmap in /usr/lib/cni; portmap pulls in iptables), iproute2
# (ip netns), and a real container runtime for tests/lifecycle/tests/podman.rs: podman 4.3
# with its CNI backend, runc (podman's own default here, crun, is not used by the tests) and
# busybox-static (the tests build their image offline from it: there is no registry).
# Also the Rust standard library for musl, which the plugin is built against
# (tests/lifecycle/src/bins.rs says why); without it the plugin is built against glibc.
# Idempotent; a no-op when everything is present.
set -euo pipefail
host=$(rustc -vV | sed -n 's/^host: //p')
musl=${host/-linux-gnu/-linux-musl}
if [ "$musl" != "$host" ] && command -v rustup >/dev/null 2>&1 &&
  ! rustup target list --installed | grep -qx "$musl"; then
  echo "installing: Rust target $musl"
  rustup target add "$musl" ||
    echo "note: could not add the Rust target $musl; the plugin is built against glibc" >&2
fi
need=()
[ -x /usr/lib/cni/host-local ] || need+=(containernetworking-plugins)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v iptables >/dev/null 2>&1 || need+=(iptables)
# mkfs.ext4 (tests/lifecycle/tests/ledger_disk.rs: a small ext4 state directory to fill up).
PATH=$PATH:/usr/sbin:/sbin command -v mkfs.ext4 >/dev/null 2>&1 || need+=(e2fsprogs)
# The demo needs only the reference plugins (`deps.sh demo`); the test suite also a runtime.
if [ "${1:-}" != "demo" ]; then
  command -v podman >/dev/null 2>&1 || need+=(podman)
  command -v runc >/dev/null 2>&1 || need+=(runc)
  dpkg -s busybox-static >/dev/null 2>&1 || need+=(busybox-static)
fi
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "missing: ${need[*]}; run as root (or: sudo apt-get install -y ${need[*]})" >&2
    exit 1
  fi
  echo "installing: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # runc named explicitly so that podman's "crun | runc" dependency is met by runc.
  apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
