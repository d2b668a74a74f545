//! Config keys read the way the delegates read them. host-local, static, dhcp, whereabouts
//! and azure-vnet-ipam parse their config with Go's encoding/json, which matches an object's
//! key to a struct field case-insensitively (with Unicode simple folding: `ſ` is `s`, the
//! Kelvin sign `K` is `k`) and, when several keys match one field, keeps the last one
//! (encoding/json `Unmarshal`: "preferring an exact match but also accepting a
//! case-insensitive match"; decode.go assigns each matching key in turn). A check of the exact
//! key `dataDir` once let an allowed uid send `DataDir`, `datadir` or `DATADIR`: dipamd saw
//! host-local's default store, host-local used the caller's directory, and root overwrote a
//! root-only file through the caller's link (docs/cfp.md, "Threat model").
//!
//! So every key dipamd reads from a delegate config is found here, the delegate's way, and a
//! non-root caller's config may not be ambiguous: two keys of one object that fold to one
//! name, or a key dipamd reads spelled any other way, are refused before the delegate runs.

use serde_json::{Map, Value};

use crate::{l1_leaves::access::Caller, l1_leaves::error::ShimError};

/// `key` as Go's encoding/json compares it (bytes.EqualFold). Non-ASCII letters are lowered
/// whole, which may join a few more keys than Go does: for a refusal that errs on the safe
/// side.
pub fn fold(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for c in key.chars() {
        match c {
            // The two non-ASCII letters whose simple-fold orbit holds an ASCII one.
            '\u{17f}' => out.push('s'),
            '\u{212a}' => out.push('k'),
            c if c.is_ascii() => out.push(c.to_ascii_lowercase()),
            c => out.extend(c.to_lowercase()),
        }
    }
    out
}

/// The value a Go delegate reads for the field `name` of `obj`: the last key that folds to
/// `name`, in the order dipamd serializes the object (serde_json's map order, the one the
/// delegate receives).
pub fn get<'a>(obj: &'a Value, name: &str) -> Option<&'a Value> {
    let want = fold(name);
    obj.as_object()?
        .iter()
        .rev()
        .find(|(k, _)| fold(k) == want)
        .map(|(_, v)| v)
}

/// Keys dipamd itself reads, by the object they are read from: the delegate config's top
/// level (delegate/config.rs, the agent and pool) and its `ipam` object (the store's place,
/// the delegate type, azure-vnet-ipam's subnet, host-local's ranges).
const READ_AT_TOP: &[&str] = &[
    "cniVersion",
    "name",
    "type",
    "ipam",
    "args",
    "runtimeConfig",
    "prevResult",
    "capabilities",
];
const READ_IN_IPAM: &[&str] = &[
    "type",
    "dataDir",
    "subnet",
    "ranges",
    "rangeStart",
    "rangeEnd",
    "gateway",
    "routes",
    "ipAddress",
    "delegate",
];

fn ambiguous(msg: String, details: String) -> ShimError {
    ShimError::Config { msg, details }
}

/// Refuses a non-root caller's delegate config that a Go delegate could read otherwise than
/// dipamd does: two keys of one object (anywhere in it) that fold to one name, or, at the top
/// level and in `ipam`, a key dipamd reads spelled another way (`DataDir`, `IPAM`, `Name`).
/// Root's configs are the node's own and are left as they are.
pub fn refuse_ambiguous(conf: &Value, caller: Caller) -> Result<(), ShimError> {
    if caller.is_root() {
        return Ok(());
    }
    if let Some(top) = conf.as_object() {
        misspelled(top, READ_AT_TOP, "")?;
        if let Some(ipam) = top.get("ipam").and_then(Value::as_object) {
            misspelled(ipam, READ_IN_IPAM, "ipam.")?;
        }
    }
    duplicates(conf, "")
}

fn misspelled(obj: &Map<String, Value>, read: &[&str], at: &str) -> Result<(), ShimError> {
    for key in obj.keys() {
        let folded = fold(key);
        if let Some(exact) = read.iter().find(|r| fold(r) == folded && **r != key) {
            return Err(ambiguous(
                format!(
                    "the network config's {at}{} must be spelled {at}{exact}",
                    crate::l1_leaves::validate::shown(key)
                ),
                format!(
                    "the delegate matches config keys without regard to case, so it would read \
                     this key as {at}{exact}, while dipamd checks {at}{exact} as spelled; spell \
                     it {exact:?}. Nothing was allocated"
                ),
            ));
        }
    }
    Ok(())
}

/// Walks `v` for objects with two keys the delegate would read as one.
fn duplicates(v: &Value, at: &str) -> Result<(), ShimError> {
    match v {
        Value::Object(obj) => {
            let mut seen = std::collections::HashMap::with_capacity(obj.len());
            for (key, inner) in obj {
                if let Some(first) = seen.insert(fold(key), key) {
                    return Err(ambiguous(
                        format!(
                            "the network config's {at} has both {} and {}",
                            crate::l1_leaves::validate::shown(first),
                            crate::l1_leaves::validate::shown(key)
                        ),
                        "the delegate matches config keys without regard to case and keeps the \
                         last of them, so which one it reads depends on the order it gets them \
                         in; keep one. Nothing was allocated"
                            .to_owned(),
                    ));
                }
                duplicates(
                    inner,
                    &format!("{at}{}.", crate::l1_leaves::validate::clip(key, 64)),
                )?;
            }
            Ok(())
        }
        Value::Array(items) => items.iter().try_for_each(|i| duplicates(i, at)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOBODY: Caller = Caller {
        uid: 65534,
        admin: false,
    };

    #[test]
    fn keys_fold_as_go_folds_them() {
        for k in ["DataDir", "datadir", "DATADIR", "dataDIR"] {
            assert_eq!(fold(k), fold("dataDir"), "{k}");
        }
        assert_eq!(fold("\u{17f}ubnet"), "subnet");
        assert_eq!(fold("\u{212a}ind"), "kind");
        assert_ne!(fold("data_dir"), fold("dataDir"));
    }

    #[test]
    fn the_delegate_reads_the_last_key_that_folds_to_the_field() {
        let conf = json!({"ipam": {"dataDir": "/a", "datadir": "/b"}});
        assert_eq!(get(&conf["ipam"], "dataDir"), Some(&json!("/b")));
        assert_eq!(get(&conf["ipam"], "DATADIR"), Some(&json!("/b")));
        assert_eq!(get(&json!({"IPAM": 1}), "ipam"), Some(&json!(1)));
        assert_eq!(get(&json!({}), "ipam"), None);
    }

    #[test]
    fn a_non_root_callers_ambiguous_config_is_refused() {
        let ok = json!({"cniVersion": "1.0.0", "name": "n",
            "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.0.0.0/24"}]]}});
        assert!(refuse_ambiguous(&ok, NOBODY).is_ok());
        for bad in [
            json!({"name": "n", "ipam": {"type": "host-local", "DataDir": "/tmp/x"}}),
            json!({"name": "n", "ipam": {"type": "host-local", "datadir": "/tmp/x"}}),
            json!({"name": "n", "IPAM": {"type": "host-local"}, "ipam": {}}),
            json!({"name": "n", "Name": "../../x", "ipam": {}}),
            json!({"name": "n", "ipam": {"ranges": [[{"subnet": "a", "Subnet": "b"}]]}}),
            json!({"name": "n", "ipam": {"type": "host-local", "\u{17f}ubnet": "a"}}),
        ] {
            let e = refuse_ambiguous(&bad, NOBODY).unwrap_err();
            assert_eq!(e.code_and_details().0, 7, "{bad}: {e}");
            assert!(refuse_ambiguous(&bad, Caller::ROOT).is_ok());
        }
    }
}
