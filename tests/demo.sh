#!/usr/bin/env bash
# dipam's main job end to end on embedded defaults: one pod through ADD, CHECK and DEL with
# ptp + dipam + host-local in a fresh network namespace, the ledger shown at each step.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/deps.sh demo
cargo run --quiet -p dipam-lifecycle --bin dipam-demo
