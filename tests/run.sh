#!/usr/bin/env bash
# The whole test suite: installs what it needs, checks formatting and lints, then runs every
# unit and lifecycle test (the lifecycle tests need root for network namespaces).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/deps.sh
locked=()
[ -n "${CI:-}" ] && locked=(--locked)
cargo fmt --all -- --check
cargo clippy "${locked[@]}" --workspace --all-targets -- -D warnings
cargo test "${locked[@]}" --workspace
