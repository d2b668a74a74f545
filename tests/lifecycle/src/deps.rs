//! The tools tests/deps.sh installs into its cache, `$DIPAM_TEST_CACHE` (default
//! /var/cache/dipam-tests), for tests that need something from PyPI: each in a venv that
//! deps.sh stamps `.complete` only once the install is whole, or, when it could not be
//! installed (no route to PyPI), the reason in `<venv>.unavailable`.

use std::path::{Path, PathBuf};

/// tests/deps.sh's cache.
pub fn cache() -> PathBuf {
    std::env::var_os("DIPAM_TEST_CACHE")
        .map_or_else(|| PathBuf::from("/var/cache/dipam-tests"), PathBuf::from)
}

/// `exe` (a path inside the venv `venv` of the cache), or `None` after saying loudly why
/// not (a failure on CI: require.rs) when deps.sh recorded that it could not install `what`.
/// Never a silent pass: with neither the whole venv nor a recorded reason, this panics.
/// `test` is the calling test's `module_path!()`, for the SKIPPED line.
pub fn venv_tool(test: &str, what: &str, venv: &str, exe: &str) -> Option<PathBuf> {
    let dir = cache().join(venv);
    let path = dir.join(exe);
    // An interrupted install is redone by deps.sh, never used here.
    let whole = path.is_file() && dir.join(".complete").is_file();
    installed(test, what, &path, whole, venv)
}

/// `path`, which deps.sh installs into its cache as `name`, when `whole`; else `None` under
/// require.rs's rule when deps.sh recorded in `<name>.unavailable` why it could not install
/// `what`, and a panic when it recorded nothing.
pub fn installed(test: &str, what: &str, path: &Path, whole: bool, name: &str) -> Option<PathBuf> {
    if whole {
        return Some(path.to_owned());
    }
    let marker = cache().join(format!("{name}.unavailable"));
    match std::fs::read_to_string(&marker) {
        Ok(why) => {
            let why = format!(
                "{} (recorded by tests/deps.sh in {})",
                why.trim(),
                marker.display()
            );
            crate::require::missing(test, &why);
            None
        }
        Err(_) => panic!(
            "{what} is not installed (completely) at {}: run tests/deps.sh, which installs it \
             (or records in {} why it cannot)",
            path.display(),
            marker.display()
        ),
    }
}
