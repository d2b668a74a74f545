//! The git commit `dipamctl --version` shows beside the crate version, as dipamd's does: the
//! same code as shim-server/build.rs uses (see there for where the commit comes from).

use std::process::Command;

include!("../shim-server/build_commit.rs");

fn main() {
    emit_git_commit();
}
