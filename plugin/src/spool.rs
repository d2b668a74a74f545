//! The DEL spool: when dipamd cannot be reached, a DEL is written durably into the spool of
//! the dipamd that serves the config's socket, and the runtime is told it succeeded. dipamd
//! drains the spool at start, before it serves anything, and every few seconds while running
//! (shim-server/src/l3_clients/spool/).
//!
//! Why: a runtime may not retry a failed DEL (kubelet gives up on a deleted pod), and a lost
//! DEL is a leaked address (F3). But a DEL reported as success must be released for certain:
//! the spool used is the one dipamd published beside its socket (`<socket>.spool`, see
//! `dipam_proto::spool`), checked to be that very directory and to meet the spool's trust
//! rule. When there is none (dipamd has not run since boot, the socket is not dipamd's) or it
//! cannot be used, the DEL fails with code 11 and the runtime retries it; it is never
//! reported as success into a directory no dipamd reads. Each file is written to a temporary
//! name, fsynced, renamed into place and the directory fsynced: after `write` returns, the
//! release survives a crash of the node. The request carries the time the plugin was
//! started, so a drained DEL can never delete a newer attachment of the same key (dipamd
//! compares it with the ADD's).

use std::{
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use dipam_proto::{
    spool::{self, Pointer},
    v1::CniRequest,
};
use serde_json::json;

/// Where a DEL was spooled.
#[derive(Debug)]
pub struct Spooled {
    pub path: PathBuf,
    /// The config's `spoolDir` names another directory than dipamd's (it is not used).
    pub warning: Option<String>,
}

/// Writes `req` (a DEL) durably into the spool dipamd published beside `socket`. The error
/// says why no spool dipamd reads could be written.
pub fn write(
    socket: &Path,
    conf_dir: Option<&Path>,
    req: &CniRequest,
) -> Result<Spooled, SpoolError> {
    let pointer_path = spool::pointer_path(socket);
    let pointer = spool::read_pointer(socket).map_err(|e| {
        if e.not_found() {
            SpoolError::NoPointer {
                socket: socket.to_owned(),
                pointer: pointer_path.clone(),
            }
        } else {
            SpoolError::Pointer(e)
        }
    })?;
    let not_dipamds = || SpoolError::NotDipamds {
        pointer: pointer_path.clone(),
        dir: pointer.dir.clone(),
    };
    let dir = spool::open_dir(&pointer.dir).map_err(|e| {
        if e.not_found() {
            not_dipamds()
        } else {
            SpoolError::Rule(e)
        }
    })?;
    match spool::identity(&dir) {
        Ok((dev, ino)) if dev == pointer.dev && ino == pointer.ino => {}
        Ok(_) => return Err(not_dipamds()),
        Err(source) => {
            return Err(SpoolError::Identity {
                dir: pointer.dir.clone(),
                source,
            });
        }
    }
    let body = json!({
        "format": spool::FORMAT,
        "requestId": req.request_id,
        "issuedAtMs": req.issued_at_ms,
        "issuedAt": req.issued_at.as_ref().map(|b| json!({"bootId": b.boot_id, "ns": b.ns})),
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
    spool::write_file(&dir, &name, body.to_string().as_bytes(), 0o600).map_err(|source| {
        SpoolError::Write {
            dir: pointer.dir.clone(),
            source,
        }
    })?;
    Ok(Spooled {
        path: pointer.dir.join(&name),
        warning: conf_dir.and_then(|c| other_dir(c, &pointer)),
    })
}

/// Why no spool dipamd reads could be written: the DEL fails, and the runtime retries it.
#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    #[error(
        "no dipamd has published a spool beside {} ({} is missing: dipamd has not run since \
         boot, or socketPath names a socket no dipamd serves), so nothing would replay it",
        socket.display(),
        pointer.display()
    )]
    NoPointer { socket: PathBuf, pointer: PathBuf },
    #[error("dipamd's spool pointer cannot be trusted: {0}")]
    Pointer(#[source] spool::Untrusted),
    #[error(
        "{} names dipamd's spool {}, but that path is another directory here (or none): dipamd \
         runs in another mount namespace where it is not the host's directory. Mount the host's \
         directory into dipamd at the same path (deploy/kubernetes/dipam.yaml)",
        pointer.display(),
        dir.display()
    )]
    NotDipamds { pointer: PathBuf, dir: PathBuf },
    #[error("dipamd's spool fails the spool rule: {0}")]
    Rule(#[source] spool::Untrusted),
    #[error("{}: {source}", dir.display())]
    Identity {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("writing into {}: {source}", dir.display())]
    Write {
        dir: PathBuf,
        source: std::io::Error,
    },
}

/// A warning when the config's `spoolDir` is not the directory dipamd drains.
fn other_dir(conf_dir: &Path, pointer: &Pointer) -> Option<String> {
    let same =
        std::fs::metadata(conf_dir).is_ok_and(|m| m.dev() == pointer.dev && m.ino() == pointer.ino);
    (!same).then(|| {
        format!(
            "the network config's spoolDir {} is not the spool dipamd drains ({}); the DEL went \
             to dipamd's. spoolDir is no longer needed: remove it",
            conf_dir.display(),
            pointer.dir.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn req() -> CniRequest {
        CniRequest {
            request_id: "abc".into(),
            issued_at_ms: 42,
            command: "DEL".into(),
            container_id: "c1".into(),
            ifname: "eth0".into(),
            stdin: br#"{"name":"n"}"#.to_vec(),
            ..CniRequest::default()
        }
    }

    /// A published spool as dipamd leaves it: the directory 0700, the pointer beside the
    /// socket.
    fn publish(root: &Path) -> (PathBuf, PathBuf) {
        let socket = root.join("d.sock");
        let dir = root.join("state").join("spool");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let m = std::fs::metadata(&dir).unwrap();
        let p = Pointer {
            dir: dir.clone(),
            dev: m.dev(),
            ino: m.ino(),
        };
        std::fs::write(spool::pointer_path(&socket), p.to_json()).unwrap();
        (socket, dir)
    }

    #[test]
    fn written_atomically_where_dipamd_published() {
        let d = tempfile::tempdir().unwrap();
        let (socket, dir) = publish(d.path());
        let s = write(&socket, None, &req()).unwrap();
        assert!(s.warning.is_none());
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 1, "no temporary file left: {names:?}");
        assert!(names[0].starts_with("0000000000000042-"));
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(s.path).unwrap()).unwrap();
        assert_eq!(v["containerId"], "c1");
        assert_eq!(v["stdin"], r#"{"name":"n"}"#);
        let mode = std::fs::metadata(dir.join(&names[0]))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600);
        // A spoolDir in the config that is not dipamd's is not used, and said so.
        let other = d.path().join("other");
        std::fs::create_dir(&other).unwrap();
        let s = write(&socket, Some(&other), &req()).unwrap();
        assert!(s.path.starts_with(&dir));
        assert!(s.warning.unwrap().contains("not the spool dipamd drains"));
        assert_eq!(std::fs::read_dir(&other).unwrap().count(), 0);
    }

    #[test]
    fn no_pointer_or_another_directory_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let e = write(&d.path().join("none.sock"), None, &req()).unwrap_err();
        assert!(matches!(e, SpoolError::NoPointer { .. }), "{e}");
        assert!(
            e.to_string().contains("no dipamd has published a spool"),
            "{e}"
        );
        // The pointer names a directory whose identity is not the one at that path here (as
        // when dipamd's spool is inside its container, not the host's directory).
        let (socket, dir) = publish(d.path());
        std::fs::rename(&dir, d.path().join("elsewhere")).unwrap();
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let e = write(&socket, None, &req()).unwrap_err();
        assert!(matches!(e, SpoolError::NotDipamds { .. }), "{e}");
        assert!(e.to_string().contains("another mount namespace"), "{e}");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        // A pointer that is a link is never followed.
        let (socket, _) = publish(&d.path().join("b"));
        let pointer = spool::pointer_path(&socket);
        std::fs::rename(&pointer, d.path().join("real")).unwrap();
        std::os::unix::fs::symlink(d.path().join("real"), &pointer).unwrap();
        let e = write(&socket, None, &req()).unwrap_err();
        assert!(matches!(e, SpoolError::Pointer(_)), "{e}");
        assert!(e.to_string().contains("symbolic link"), "{e}");
    }
}
