//! The witness file: which commits the store has claimed durable, and in which boot, so that
//! an open can tell damage to sled's files from a tail a power cut took back.

use super::*;

/// What the witness file says (see [`Witness`]).
pub(super) enum WitnessRead {
    Missing,
    /// Present but not a witness: a garbled file proves nothing.
    Unreadable(String),
    /// An earlier build's witness: the last disk commit only.
    Legacy(u64),
    Claims(Witness0),
}

/// The claims of a witness read back.
pub(super) struct Witness0 {
    pub(super) disk: u64,
    pub(super) kernel: u64,
    pub(super) boot: String,
}

/// The witness file: `v2 <disk> <kernel> <boot id>`, numbers zero-padded so every update is
/// one in-place `pwrite` of the same byte range. `disk`: the last commit known to be on the
/// disk (its fdatasync returned). `kernel`: the last commit acknowledged at all, binding
/// only in the boot `boot`, since a power cut may take back what was only in the kernel.
pub(crate) struct Witness {
    pub(super) file: File,
    pub(super) disk: u64,
    pub(super) kernel: u64,
    pub(super) boot: String,
}

impl Witness {
    pub(super) fn write(&self) -> io::Result<()> {
        let boot = format!("{:-<BOOT_WIDTH$}", self.boot);
        self.file.write_all_at(
            format!(
                "v2 {:0WITNESS_WIDTH$} {:0WITNESS_WIDTH$} {}\n",
                self.disk,
                self.kernel,
                &boot[..BOOT_WIDTH.min(boot.len())]
            )
            .as_bytes(),
            0,
        )
    }
}

/// Width of the zero-padded numbers and of the boot id in the witness file.
pub(super) const WITNESS_WIDTH: usize = 20;
pub(super) const BOOT_WIDTH: usize = 36;

/// The id of the running boot, if the kernel says.
pub(super) fn boot_id() -> Option<String> {
    fs::read_to_string(BOOT_ID)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// The number of the last commit recorded in the store; 0 for a store never committed to.
pub(crate) fn read_seq(db: &sled::Db, dir: &Path) -> Result<u64, StoreError> {
    let Some(raw) = db.get(SEQ_KEY).map_err(|e| map_sled(dir, e))? else {
        return Ok(0);
    };
    let bytes: [u8; 8] = raw.as_ref().try_into().map_err(|_| StoreError::Corrupt {
        path: dir.to_path_buf(),
        detail: format!(
            "commit sequence number has {} bytes instead of 8",
            raw.len()
        ),
    })?;
    Ok(u64::from_be_bytes(bytes))
}

/// What the witness file at `path` says.
pub(super) fn read_witness(path: &Path) -> Result<WitnessRead, StoreError> {
    let text = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(WitnessRead::Missing),
        Err(source) => {
            return Err(StoreError::Io {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    let Ok(text) = std::str::from_utf8(&text) else {
        return Ok(WitnessRead::Unreadable("not text".into()));
    };
    let fields: Vec<&str> = text.split_whitespace().collect();
    let number = |s: &str| s.parse::<u64>().ok();
    Ok(match fields.as_slice() {
        [n] => match number(n) {
            Some(n) => WitnessRead::Legacy(n),
            None => WitnessRead::Unreadable(format!("{:?}", text.trim())),
        },
        ["v2", disk, kernel, boot] => match (number(disk), number(kernel)) {
            (Some(disk), Some(kernel)) => WitnessRead::Claims(Witness0 {
                disk,
                kernel,
                boot: boot.trim_end_matches('-').to_string(),
            }),
            _ => WitnessRead::Unreadable(format!("{:?}", text.trim())),
        },
        [] => WitnessRead::Unreadable("empty".into()),
        _ => WitnessRead::Unreadable(format!("{:?}", text.trim())),
    })
}
