//! Test helper: running a script a test has just written.
//!
//! Another test thread may fork while the script is still open for writing, and its child
//! holds the file open until it execs: an exec of the script meanwhile fails with ETXTBSY
//! (seen once in CI, where a probe then skipped the script). Forks after the write cannot
//! inherit it, so the wait ends within the other child's exec.

use std::{fmt::Debug, io, time::Duration};

/// Runs `f` until it does not fail with ETXTBSY (for at most about a second) and returns what
/// it gave; any other error, or a second of ETXTBSY, fails the test naming `what`.
pub(crate) fn retry<T>(what: &dyn Debug, mut f: impl FnMut() -> io::Result<T>) -> T {
    for _ in 0..100 {
        match f() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) => {
                std::thread::sleep(Duration::from_millis(10));
            }
            other => return other.unwrap_or_else(|e| panic!("{what:?}: {e}")),
        }
    }
    panic!("{what:?}: text file busy for a second");
}
