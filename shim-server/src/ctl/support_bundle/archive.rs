//! The bundle's name and its tar.gz, written whole or not at all.

use std::path::Path;

use crate::ctl::error::ArchiveError;

/// The node's name, for the bundle's file name.
pub(super) fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "node".to_owned())
}

/// The bundle's name stamp (`20261124T071500Z`) and its RFC 3339 time to the second.
pub(super) fn utc_at(ms: u64) -> (String, String) {
    let rfc = crate::clock::rfc3339_ms(ms);
    let stamp: String = rfc[..19]
        .chars()
        .filter(|c| !matches!(c, '-' | ':'))
        .collect();
    (format!("{stamp}Z"), format!("{}Z", &rfc[..19]))
}

/// Writes the tar.gz: to a temporary file beside the target, 0600, then renamed, so that a
/// bundle that exists is whole.
pub(super) fn write_archive(
    path: &Path,
    files: &[(String, Vec<u8>)],
    root: &str,
) -> Result<(), ArchiveError> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("partial");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|source| ArchiveError::File {
            path: tmp.clone(),
            source,
        })?;
    let gz = flate2::write::GzEncoder::new(f, flate2::Compression::default());
    let mut tar = tar::Builder::new(gz);
    let mtime = crate::clock::now();
    for (name, bytes) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(bytes.len() as u64);
        h.set_mode(0o600);
        h.set_mtime(mtime);
        h.set_cksum();
        tar.append_data(&mut h, format!("{root}/{name}"), bytes.as_slice())
            .map_err(|source| ArchiveError::Add {
                name: name.clone(),
                source,
            })?;
    }
    let gz = tar.into_inner().map_err(ArchiveError::Finish)?;
    let f = gz.finish().map_err(ArchiveError::Finish)?;
    f.sync_all().map_err(ArchiveError::Finish)?;
    std::fs::rename(&tmp, path).map_err(|source| ArchiveError::File {
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_time_stamp_is_utc_civil_time() {
        let (stamp, rfc) = utc_at(crate::clock::now_ms());
        assert_eq!(stamp.len(), "20261124T071500Z".len(), "{stamp}");
        assert!(rfc.ends_with('Z') && rfc.len() == 20, "{rfc}");
        assert_eq!(&stamp[..4], &rfc[..4]);
    }
}
