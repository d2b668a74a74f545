//! The tools tests/deps.sh installs into its cache, `$DIPAM_TEST_CACHE` (default
//! /var/cache/dipam-tests), for tests that need something from PyPI: each in a venv that
//! deps.sh stamps `.complete` only once the install is whole, or, when it could not be
//! installed (no route to PyPI), the reason in `<venv>.unavailable`.

use std::path::PathBuf;

/// tests/deps.sh's cache.
pub fn cache() -> PathBuf {
    std::env::var_os("DIPAM_TEST_CACHE")
        .map_or_else(|| PathBuf::from("/var/cache/dipam-tests"), PathBuf::from)
}

/// `exe` (a path inside the venv `venv` of the cache), or `None` after saying loudly why
/// not when deps.sh recorded that it could not install `what`. Never a silent pass: with
/// neither the whole venv nor a recorded reason, this panics. `test` is the calling test's
/// `module_path!()`, for the SKIPPED line.
pub fn venv_tool(test: &str, what: &str, venv: &str, exe: &str) -> Option<PathBuf> {
    let dir = cache().join(venv);
    let path = dir.join(exe);
    // An interrupted install is redone by deps.sh, never used here.
    if path.is_file() && dir.join(".complete").is_file() {
        return Some(path);
    }
    let marker = cache().join(format!("{venv}.unavailable"));
    match std::fs::read_to_string(&marker) {
        Ok(why) => {
            eprintln!(
                "\n*** SKIPPED {test}: {} (recorded by tests/deps.sh in {}) ***\n",
                why.trim(),
                marker.display()
            );
            None
        }
        Err(_) => panic!(
            "{what} is not installed (completely) at {}: run tests/deps.sh, which installs it \
             (or records in {} why it cannot)",
            dir.display(),
            marker.display()
        ),
    }
}
