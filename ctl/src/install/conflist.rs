//! The conflist `install` puts into the CNI config directory: its file name, the checks the
//! dipam plugin and a runtime will make (so that a mistake is refused at install time instead
//! of failing every pod), the ranges every host-local needs, and the cniVersion worth a
//! warning. The checks against this node's own plugins and runtimes are `ctl/compat.rs`.

use std::{fs, path::Path};

use serde_json::Value;

use super::{Options, PLUGIN_NAME};
use crate::{
    atomic::{Placed, replace_atomically},
    error::{ConflistError, InstallError},
};

// The cniVersions the plugin accepts (dipam_proto::cni); anything else fails every ADD
// with code 1, so it is refused here, before a runtime sees it.
use dipam_proto::cni::SUPPORTED_VERSIONS;

/// The `--conflist` step: the file read and checked as dipam would, with its network name;
/// none without --conflist.
pub(super) fn read(opts: &Options) -> Result<Option<(Vec<u8>, String)>, InstallError> {
    let Some(path) = &opts.conflist else {
        return Ok(None);
    };
    let bytes = fs::read(path).map_err(|source| InstallError::ReadConflist {
        path: path.clone(),
        source,
    })?;
    let network = validate_conflist(&bytes).map_err(|e| at(path, e))?;
    Ok(Some((bytes, network)))
}

/// The checks once the conflist is final (after --ranges-from-node): every host-local has
/// ranges, and, unless told otherwise, this node's plugins and runtimes take it
/// (`compat.rs`). What `--force` installed despite, for a warning.
pub(super) fn check_final(
    opts: &Options,
    conflist: Option<&(Vec<u8>, String)>,
) -> Result<Option<String>, InstallError> {
    let (Some((bytes, _)), Some(path)) = (conflist, &opts.conflist) else {
        return Ok(None);
    };
    has_ranges(bytes).map_err(|e| at(path, e))?;
    match &opts.node_check {
        Some(check) => {
            check
                .run(bytes, &opts.cni_bin_dir)
                .map_err(|source| InstallError::NodeCheck {
                    path: path.clone(),
                    source,
                })
        }
        None => Ok(None),
    }
}

fn at(path: &Path, source: ConflistError) -> InstallError {
    InstallError::Conflist {
        path: path.to_owned(),
        source,
    }
}

/// A conflist's file name: a plain name that libcni loads as a list.
pub(super) fn validate_file_name(name: &str) -> Result<(), ConflistError> {
    if name.is_empty() || name.contains('/') || name.starts_with('.') {
        return Err(ConflistError::FileName(name.to_owned()));
    }
    // libcni loads *.conf and *.json as a single plugin's config, which a list is not.
    if !name.ends_with(".conflist") {
        return Err(ConflistError::Extension(name.to_owned()));
    }
    Ok(())
}

/// Checks a conflist the way a runtime and the dipam plugin will, so that a mistake is
/// refused at install time instead of failing every pod. Returns the network name.
pub fn validate_conflist(bytes: &[u8]) -> Result<String, ConflistError> {
    let v: Value = serde_json::from_slice(bytes)?;
    let obj = v.as_object().ok_or(ConflistError::NotObject)?;
    let text = |key: &str| {
        obj.get(key)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    };
    let version = text("cniVersion").ok_or(ConflistError::NoVersion)?;
    if !SUPPORTED_VERSIONS.contains(&version) {
        return Err(ConflistError::Version(version.to_owned()));
    }
    let name = text("name").ok_or(ConflistError::NoName)?;
    if !dipam_proto::cni::names::is_valid_name(name) {
        return Err(ConflistError::Name(name.to_owned()));
    }
    let plugins = obj
        .get("plugins")
        .and_then(Value::as_array)
        .filter(|p| !p.is_empty())
        .ok_or(ConflistError::NoPlugins)?;
    let mut uses_dipam = false;
    for (i, p) in plugins.iter().enumerate() {
        if let Some(keys) = dipam_keys(i, p)? {
            uses_dipam = true;
            check_dipam_keys(i, keys)?;
        }
    }
    if !uses_dipam {
        return Err(ConflistError::NoDipam);
    }
    Ok(name.to_owned())
}

/// Where plugin `i` keeps dipam's own keys: the plugin itself when dipam is the main plugin,
/// its `ipam` when dipam is its IPAM; none when it does not use dipam.
fn dipam_keys(i: usize, p: &Value) -> Result<Option<&Value>, ConflistError> {
    let kind = p
        .get("type")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or(ConflistError::NoType(i))?;
    let ipam = p.get("ipam");
    let ipam_type = ipam
        .and_then(|i| i.get("type"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    if kind == PLUGIN_NAME {
        if ipam_type.is_empty() || ipam_type == PLUGIN_NAME {
            return Err(ConflistError::MainWithoutIpam(i));
        }
        return Ok(Some(p));
    }
    if ipam_type != PLUGIN_NAME {
        return Ok(None);
    }
    let delegate = ipam
        .and_then(|i| i.get("delegate"))
        .and_then(|d| d.get("type"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    if delegate.is_empty() {
        return Err(ConflistError::NoDelegate {
            i,
            kind: kind.to_owned(),
        });
    }
    Ok(Some(ipam.unwrap_or(p)))
}

/// dipam's own keys, as the plugin checks them (code 7 at runtime otherwise).
fn check_dipam_keys(i: usize, keys: &Value) -> Result<(), ConflistError> {
    match keys.get("socketPath") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if !s.is_empty() => {}
        Some(other) => {
            return Err(ConflistError::SocketPath {
                i,
                got: other.clone(),
            });
        }
    }
    match keys.get("spoolDir") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s.starts_with('/') => {}
        Some(other) => {
            return Err(ConflistError::SpoolDir {
                i,
                got: other.clone(),
            });
        }
    }
    match keys.get("timeoutSeconds") {
        None | Some(Value::Null) => {}
        Some(v) if v.as_f64().is_some_and(|s| s > 0.0 && s <= 3600.0) => {}
        Some(other) => {
            return Err(ConflistError::Timeout {
                i,
                got: other.clone(),
            });
        }
    }
    Ok(())
}

/// Every host-local that dipam runs has a range to hand out: a template written for
/// `--ranges-from-node` (deploy/kubernetes's ConfigMap) installed without it would fail every
/// pod's ADD ("no IP ranges specified"); it is refused here instead.
pub(super) fn has_ranges(bytes: &[u8]) -> Result<(), ConflistError> {
    let v: Value = serde_json::from_slice(bytes)?;
    for (i, p) in v["plugins"].as_array().into_iter().flatten().enumerate() {
        let ipam = if p["type"] == PLUGIN_NAME {
            &p["ipam"]
        } else if p["ipam"]["type"] == PLUGIN_NAME {
            &p["ipam"]["delegate"]
        } else {
            continue;
        };
        let empty = |k: &str| match ipam.get(k) {
            None | Some(Value::Null) => true,
            Some(Value::Array(a)) => a.is_empty(),
            Some(Value::String(s)) => s.is_empty(),
            Some(_) => false,
        };
        if ipam["type"] == "host-local" && empty("ranges") && empty("subnet") {
            return Err(ConflistError::NoRanges(i));
        }
    }
    Ok(())
}

/// A conflist at 1.1.0 is valid and installs, but a runtime whose libcni cannot parse a 1.1.0
/// result fails every ADD with it (containerd 1.6 and 1.7, podman 4: docs/sources.md §1,
/// §10.2), after dipam allocated. Worth a warning, not a refusal: newer runtimes parse it.
pub fn version_warning(conflist: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(conflist).ok()?;
    (v.get("cniVersion")?.as_str()? == "1.1.0").then(|| {
        "the conflist is at cniVersion 1.1.0: containerd 1.6 and 1.7, podman 4 and CRI-O \
         before 1.32 (libcni before v1.2) cannot parse a 1.1.0 result and fail every pod's ADD with \
         \"unsupported CNI result version\"; use 1.0.0 on nodes that run them"
            .to_owned()
    })
}

/// Puts the conflist into the CNI config directory (mode 0644), atomically: after the
/// plugin, since the moment it appears a runtime may use the network.
pub(super) fn place(
    opts: &Options,
    conflist: Option<(Vec<u8>, String)>,
) -> Result<Option<(Placed, String)>, InstallError> {
    let Some((bytes, network)) = conflist else {
        return Ok(None);
    };
    let placed =
        replace_atomically(&opts.conf_dir, &opts.name, &bytes, 0o644).map_err(|source| {
            InstallError::PlaceConflist {
                name: opts.name.clone(),
                dir: opts.conf_dir.clone(),
                source,
            }
        })?;
    Ok(Some((placed, network)))
}
