//! The DEL spool: when dipamd cannot be reached, a DEL is written durably to a directory and
//! the runtime is told it succeeded. dipamd drains the spool at start, before it serves
//! anything, and every few seconds while running (shim-server/src/spool.rs).
//!
//! Why: a runtime may not retry a failed DEL (kubelet gives up on a deleted pod), and a lost
//! DEL is a leaked address (F3). Each file is written to a temporary name, fsynced, renamed
//! into place and the directory fsynced: after `write` returns, the release survives a crash
//! of the node. The request carries the time the plugin was started, so a drained DEL can
//! never delete a newer attachment of the same key (dipamd compares it with the ADD's).

use std::{
    fs::{File, OpenOptions},
    io::Write,
    os::unix::fs::{DirBuilderExt, OpenOptionsExt},
    path::{Path, PathBuf},
};

use dipam_proto::v1::CniRequest;
use serde_json::json;

/// Where a spooled DEL goes unless the config says otherwise; dipamd's default
/// `--spool-dir` is `<state-dir>/spool` with state dir `/var/lib/dipam`.
pub const DEFAULT_DIR: &str = "/var/lib/dipam/spool";

/// The spool file format version.
pub const FORMAT: u32 = 1;

/// Writes `req` (a DEL) durably into `dir` and returns the file's path.
pub fn write(dir: &Path, req: &CniRequest) -> std::io::Result<PathBuf> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let body = json!({
        "format": FORMAT,
        "requestId": req.request_id,
        "issuedAtMs": req.issued_at_ms,
        "command": req.command,
        "containerId": req.container_id,
        "netns": req.netns,
        "ifname": req.ifname,
        "cniArgs": req.cni_args,
        "cniPath": req.cni_path,
        "mode": req.mode,
        "stdin": String::from_utf8_lossy(&req.stdin),
    });
    // Names sort by issue time, so dipamd replays DELs in the order they were issued.
    let name = format!(
        "{:016}-{}-{}.json",
        req.issued_at_ms,
        std::process::id(),
        req.request_id
    );
    let tmp = dir.join(format!(".tmp-{name}"));
    let path = dir.join(&name);
    {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(body.to_string().as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, &path)?;
    File::open(dir)?.sync_all()?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_atomically_and_readable() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("spool");
        let req = CniRequest {
            request_id: "abc".into(),
            issued_at_ms: 42,
            command: "DEL".into(),
            container_id: "c1".into(),
            ifname: "eth0".into(),
            stdin: br#"{"name":"n"}"#.to_vec(),
            ..CniRequest::default()
        };
        let p = write(&dir, &req).unwrap();
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 1, "no temporary file left: {names:?}");
        assert!(names[0].starts_with("0000000000000042-"));
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap();
        assert_eq!(v["containerId"], "c1");
        assert_eq!(v["stdin"], r#"{"name":"n"}"#);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
    }
}
