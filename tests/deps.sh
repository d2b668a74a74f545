#!/usr/bin/env bash
# Installs what dipam's demo and test suite need on Debian: the reference CNI plugins
# (host-local, ptp, bridge, portmap in /usr/lib/cni; portmap pulls in iptables), iproute2
# (ip netns), and a real container runtime for tests/lifecycle/tests/runtimes/podman.rs: podman 4.3
# with its CNI backend, runc (podman's own default here, crun, is not used by the tests) and
# busybox-static (the tests build their image offline from it: there is no registry).
# Also containerd (tests/lifecycle/tests/runtimes/containerd.rs runs a private instance of it, with its
# own sockets and directories, through CRI), and protoc (protobuf-compiler), which the test
# crate's CRI client (the k8s-cri crate) needs at build time; the product's crates do not.
# Also kubernetes-validate from PyPI, which bundles the Kubernetes API's JSON schemas
# (tests/lifecycle/tests/deploy/manifests.rs validates deploy/kubernetes against them), in a venv of
# Debian's python3 (python3-venv) under $DIPAM_TEST_CACHE (default /var/cache/dipam-tests);
# when it cannot be installed (no route to PyPI) the reason is recorded there and that test
# skips, saying why.
# Also Python grpcio with grpcio-tools, grpcio-health-checking and grpcio-reflection from
# PyPI, in a second venv there (grpcio): tests/lifecycle/tests/agent/agent_api.rs generates Python
# stubs from proto/ with them and runs an agent written in Python against a real dipamd,
# recording why in grpcio.unavailable when they cannot be installed, as above.
# Also the Rust standard library for musl, which the plugin is built against
# (tests/lifecycle/src/bins.rs says why); without it the plugin is built against glibc.
# Also etcd (etcd-server) for the single-node Kubernetes cluster test.
# Also the real CNI peers built from Go modules (tests/peers/build.sh; see the end), Kubernetes'
# own components among them, and the Go API module's pinned tools (buf, protoc-gen-go,
# protoc-gen-go-grpc) that api/check.sh runs.
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
# The demo is built from the test crate, so it needs protoc too.
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
# mkfs.ext4 (tests/lifecycle/tests/crash/ledger_disk.rs: a small ext4 state directory to fill up).
PATH=$PATH:/usr/sbin:/sbin command -v mkfs.ext4 >/dev/null 2>&1 || need+=(e2fsprogs)
# The demo needs only the reference plugins (`deps.sh demo`); the test suite also a runtime.
if [ "${1:-}" != "demo" ]; then
  command -v podman >/dev/null 2>&1 || need+=(podman)
  command -v runc >/dev/null 2>&1 || need+=(runc)
  # CRI-O's container monitor (tests/lifecycle/tests/runtimes/crio.rs runs CRI-O built from its Go
  # module with Debian's conmon and runc).
  command -v conmon >/dev/null 2>&1 || need+=(conmon)
  dpkg -s busybox-static >/dev/null 2>&1 || need+=(busybox-static)
  command -v containerd >/dev/null 2>&1 || need+=(containerd)
  # etcd for the single-node Kubernetes cluster (tests/lifecycle/tests/runtimes/kubernetes.rs; its
  # other components are built from Go by tests/peers/build.sh). 3.4.23 serves Kubernetes up
  # to 1.30 (1.31 wants 3.4.29+).
  command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
  dpkg -s python3-venv >/dev/null 2>&1 || need+=(python3-venv)
  # systemd-socket-activate passes dipamd its socket as systemd does
  # (tests/lifecycle/tests/deploy/activation.rs).
  command -v systemd-socket-activate >/dev/null 2>&1 || need+=(systemd)
  # man -l renders the man pages `dipamctl install` writes (tests/lifecycle/tests/docs/install_docs.rs).
  command -v man >/dev/null 2>&1 || need+=(man-db)
  # The real peers (tests/peers/build.sh, below): CRI-O runs containers through Debian's
  # conmon (above) and runc, and its C helper pinns is built with gcc and make, linked
  # statically against glibc (libc6-dev).
  command -v gcc >/dev/null 2>&1 || need+=(gcc)
  command -v make >/dev/null 2>&1 || need+=(make)
  dpkg -s libc6-dev >/dev/null 2>&1 || need+=(libc6-dev)
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
  # Debian's package enables and starts containerd.service. The tests never use it (each runs
  # its own containerd), and a node that had no containerd before should not get a running
  # one from a test setup: stop and disable what this run installed.
  if [[ " ${need[*]} " == *" containerd "* ]] && [ -d /run/systemd/system ]; then
    systemctl disable --now containerd.service >/dev/null 2>&1 ||
      echo "note: could not stop containerd.service; the tests do not need it" >&2
  fi
  # The same for etcd-server's etcd.service: the cluster test runs its own etcd.
  if [[ " ${need[*]} " == *" etcd-server "* ]] && [ -d /run/systemd/system ]; then
    systemctl disable --now etcd.service >/dev/null 2>&1 ||
      echo "note: could not stop etcd.service; the tests do not need it" >&2
  fi
fi

# kubernetes-validate, pinned: its version decides the Kubernetes versions it bundles schemas
# for (1.25 to 1.37 in 1.37.0) and what it reports. Reinstalled when the pin changes; a
# venv left incomplete by an interrupted install has no .complete stamp and is redone.
kv_version=1.37.0
if [ "${1:-}" != "demo" ]; then
  cache=${DIPAM_TEST_CACHE:-/var/cache/dipam-tests}
  venv=$cache/kubernetes-validate
  unavailable=$cache/kubernetes-validate.unavailable
  if [ ! -f "$venv/.complete" ] ||
    [ "$("$venv/bin/kubernetes-validate" --version 2>/dev/null)" != "$kv_version" ]; then
    echo "installing: kubernetes-validate $kv_version (PyPI) into $venv"
    # Debian's python3, not whichever python3 comes first in PATH (pyenv and the like).
    if out=$( (rm -rf "$venv" && mkdir -p "$cache" &&
      /usr/bin/python3 -m venv "$venv" &&
      "$venv/bin/pip" install -q --disable-pip-version-check \
        "kubernetes-validate==$kv_version" &&
      [ "$("$venv/bin/kubernetes-validate" --version)" = "$kv_version" ] &&
      touch "$venv/.complete") 2>&1); then
      rm -f "$unavailable"
    else
      why="kubernetes-validate $kv_version could not be installed into $venv: $(printf '%s' "$out" | tail -n 5)"
      echo "note: $why" >&2
      # Read by tests/lifecycle/tests/deploy/manifests.rs, which then skips and prints it.
      { mkdir -p "$cache" && printf '%s\n' "$why" >"$unavailable"; } 2>/dev/null ||
        echo "note: could not record that in $unavailable either" >&2
    fi
  fi
fi

# promtool, from Debian's prometheus package, for tests/lifecycle/tests/observability/alerts.rs (`promtool
# check rules` and `promtool test rules` on deploy/prometheus/alerts.yaml). Only the one
# binary is taken out of the package (apt-get download + dpkg-deb), into $DIPAM_TEST_CACHE:
# installing the package would also start a Prometheus server on the machine. Redone when
# the package's version changes; when it cannot be had, the reason is recorded and that test
# skips, saying why.
if [ "${1:-}" != "demo" ]; then
  cache=${DIPAM_TEST_CACHE:-/var/cache/dipam-tests}
  prom=$cache/prometheus
  unavailable=$cache/prometheus.unavailable
  want=$(apt-cache policy prometheus 2>/dev/null | sed -n 's/^ *Candidate: //p')
  if [ -z "$want" ] || [ "$want" = "(none)" ]; then
    [ "$(id -u)" -eq 0 ] && apt-get update -qq >/dev/null 2>&1 || true
    want=$(apt-cache policy prometheus 2>/dev/null | sed -n 's/^ *Candidate: //p')
  fi
  if [ ! -x "$prom/usr/bin/promtool" ] || [ "$(cat "$prom/.version" 2>/dev/null)" != "$want" ]; then
    echo "installing: promtool from Debian's prometheus $want into $prom"
    if out=$( (set -e
      rm -rf "$prom" && mkdir -p "$prom/deb"
      cd "$prom/deb" && apt-get download -q -o APT::Sandbox::User=root prometheus
      dpkg-deb --fsys-tarfile prometheus_*.deb | tar -x -C "$prom" ./usr/bin/promtool
      rm -rf "$prom/deb"
      "$prom/usr/bin/promtool" --version >/dev/null
      printf '%s\n' "$want" >"$prom/.version") 2>&1); then
      rm -f "$unavailable"
    else
      why="promtool (Debian's prometheus $want) could not be installed into $prom: $(printf '%s' "$out" | tail -n 5)"
      echo "note: $why" >&2
      # Read by tests/lifecycle/tests/observability/alerts.rs, which then skips and prints it.
      { mkdir -p "$cache" && printf '%s\n' "$why" >"$unavailable"; } 2>/dev/null ||
        echo "note: could not record that in $unavailable either" >&2
    fi
  fi
fi

# grpcio and friends, pinned together (they are released in lockstep; protobuf is what
# grpcio-tools 1.85 generates code for). The same rules as kubernetes-validate's venv.
grpcio_version=1.85.1
protobuf_version=7.36.2
if [ "${1:-}" != "demo" ]; then
  cache=${DIPAM_TEST_CACHE:-/var/cache/dipam-tests}
  venv=$cache/grpcio
  unavailable=$cache/grpcio.unavailable
  probe='import grpc, grpc_tools.protoc, grpc_health.v1.health_pb2, grpc_reflection.v1alpha.proto_reflection_descriptor_database; print(grpc.__version__)'
  if [ ! -f "$venv/.complete" ] ||
    [ "$("$venv/bin/python" -c "$probe" 2>/dev/null)" != "$grpcio_version" ]; then
    echo "installing: grpcio $grpcio_version, grpcio-tools (PyPI) into $venv"
    if out=$( (rm -rf "$venv" && mkdir -p "$cache" &&
      /usr/bin/python3 -m venv "$venv" &&
      "$venv/bin/pip" install -q --disable-pip-version-check \
        "grpcio==$grpcio_version" "grpcio-tools==$grpcio_version" \
        "grpcio-health-checking==$grpcio_version" "grpcio-reflection==$grpcio_version" \
        "protobuf==$protobuf_version" &&
      [ "$("$venv/bin/python" -c "$probe")" = "$grpcio_version" ] &&
      touch "$venv/.complete") 2>&1); then
      rm -f "$unavailable"
    else
      why="grpcio $grpcio_version could not be installed into $venv: $(printf '%s' "$out" | tail -n 5)"
      echo "note: $why" >&2
      # Read by tests/lifecycle/tests/agent/agent_api.rs, which then skips and prints it.
      { mkdir -p "$cache" && printf '%s\n' "$why" >"$unavailable"; } 2>/dev/null ||
        echo "note: could not record that in $unavailable either" >&2
    fi
  fi
fi

# The real peers, built from the Go module proxy at the versions pinned in tests/peers/pins:
# libcni (cnitool and the project's driver), today's reference plugins, azure-vnet-ipam,
# containerd 2 with crictl, and CRI-O. A no-op once built; with CI set, a peer that cannot
# be built fails the run (tests/peers/build.sh says which and why).
if [ "${1:-}" != "demo" ]; then
  bash "$(dirname "$0")/peers/build.sh"
fi
