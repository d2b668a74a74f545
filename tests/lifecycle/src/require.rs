//! The one rule for a test that needs something from outside dipam: a real peer, a runtime,
//! a tool, root. Under `CI=true` (any `CI` but empty or `false`) a missing one fails the test,
//! naming what installs it: CI runs tests/deps.sh, so missing there is a bug. Elsewhere the
//! test says so in one line that cannot be missed and returns, passing without running.

use std::path::PathBuf;

/// Whether this is CI, where nothing a test needs may be missing.
pub fn on_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false")
}

/// What happens to test `test` (its `module_path!()`) when `why` is missing: under CI a
/// failure; elsewhere the SKIPPED line, after which the caller returns.
#[track_caller]
pub fn missing(test: &str, why: &str) {
    verdict(on_ci(), test, why);
}

#[track_caller]
fn verdict(ci: bool, test: &str, why: &str) {
    if ci {
        panic!("{test} cannot run on CI: {why}");
    }
    eprintln!("\n*** SKIPPED {test}: {why} ***\n");
}

/// Why a test cannot run here for not being root, if it cannot: network namespaces, veths and
/// a rootful runtime need it.
pub fn root() -> Option<String> {
    (!crate::is_root()).then(|| "lifecycle tests need root (network namespaces)".to_owned())
}

/// `tool` on the PATH (or in /usr/sbin, /sbin), or why not: `installs` says what installs it.
pub fn tool(tool: &str, installs: &str) -> Result<PathBuf, String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
        .ok_or_else(|| format!("{tool} is not installed ({installs})"))
}

/// Returns early from a test when something it needs is missing, under the rule above. Each
/// argument is why one need is missing, or `None` when it is met (`containerd::unavailable()`,
/// `crio::unavailable()`, `podman::unavailable(..)`, `require::root()`), or a `Result` whose
/// value the test keeps (`let tool = require!(require::tool("x", "package x"));`).
#[macro_export]
macro_rules! require {
    ($missing:expr) => {
        match $crate::require::Need::need($missing) {
            Ok(v) => v,
            Err(why) => {
                $crate::require::missing(module_path!(), &why);
                return;
            }
        }
    };
    ($($missing:expr),+ $(,)?) => {
        $( $crate::require!($missing); )+
    };
}

/// What [`require!`] takes: why a need is missing (`Option<String>`, `None` when met), or the
/// thing needed (`Result<T, String>`).
pub trait Need {
    type Met;
    fn need(self) -> Result<Self::Met, String>;
}

impl Need for Option<String> {
    type Met = ();
    fn need(self) -> Result<(), String> {
        self.map_or(Ok(()), Err)
    }
}

impl<T> Need for Result<T, String> {
    type Met = T;
    fn need(self) -> Result<T, String> {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn needs(missing: Option<String>, ci: bool) -> bool {
        if let Err(why) = missing.need() {
            verdict(ci, "t", &why);
            return false;
        }
        true
    }

    #[test]
    #[should_panic(expected = "t cannot run on CI: podman is not installed (tests/deps.sh)")]
    fn on_ci_a_missing_need_fails_naming_what_installs_it() {
        needs(Some("podman is not installed (tests/deps.sh)".into()), true);
    }

    #[test]
    fn elsewhere_a_missing_need_skips_and_a_met_one_runs() {
        assert!(!needs(Some("podman is not installed".into()), false));
        assert!(needs(None, true));
        assert_eq!(tool("sh", "").map(|p| p.is_file()), Ok(true));
        assert!(
            tool("no-such-tool-here", "package x")
                .unwrap_err()
                .contains("package x")
        );
    }
}
