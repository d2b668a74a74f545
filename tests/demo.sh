#!/usr/bin/env bash
# dipam's main job end to end on embedded defaults: dipam as the main plugin with host-local as
# its IPAM, a network agent's router/health/ingress addresses from the same range, a dipamd
# crash they survive, a CNI GC that frees a stale pod and keeps them, and a DEL made while
# dipamd is down, spooled and released at the next start. Each step is checked; everything
# (dipamd, network namespaces, temp dirs) is cleaned up at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/deps.sh demo
cargo run --quiet -p dipam-lifecycle --bin dipam-demo
