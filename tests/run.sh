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
# No module cycle in any crate, between its folders or between the files of one folder, and
# no edge up the layers a crate declares (docs/architecture.md, "Checking the layers").
cargo run "${locked[@]}" -q -p dipam-layers -- shim-server ctl plugin state proto tests/lifecycle tools/layers
# The API docs build, and every intra-doc link resolves: a moved item breaks the links to it.
RUSTDOCFLAGS="-D rustdoc::broken_intra_doc_links -D warnings" \
  cargo doc "${locked[@]}" --no-deps --workspace
# The Go module (api/) and the proto: buf lint, breaking changes against the previous commit,
# the generated code up to date, go vet and the unit tests (api/check.sh says how).
bash api/check.sh
cargo test "${locked[@]}" --workspace
