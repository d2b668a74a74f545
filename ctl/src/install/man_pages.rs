//! The man pages `install` puts under the man directory (`ctl/man.rs` renders them): before
//! the plugin, so that a man directory that cannot be written (a read-only /usr) fails the
//! install before the node's CNI setup changed, and --man-dir or --no-man-pages fixes it.

use std::path::PathBuf;

use super::Options;
use crate::{atomic::Placed, error::InstallError, man};

/// The man pages step: every page written under --man-dir, atomically; none with
/// --no-man-pages.
pub(super) fn write(opts: &Options) -> Result<Option<(PathBuf, Vec<Placed>)>, InstallError> {
    let Some(dir) = &opts.man_dir else {
        return Ok(None);
    };
    let pages = man::pages();
    let placed = man::write_pages(&pages, |p| p.path_under(dir))?;
    Ok(Some((dir.clone(), placed)))
}
