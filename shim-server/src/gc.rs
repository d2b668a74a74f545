//! Garbage collection of one network: what the runtime's CNI GC asks for, what `dipamctl gc`
//! asks for, and what the periodic reconcile may do.
//!
//! The valid set is the union of the runtime's list, every agent-owned attachment, every
//! attachment with an operation in flight or interrupted (state `adding`/`deleting`), and every
//! attachment younger than the grace period: a pod being created while GC runs never loses
//! its address (whereabouts#207, F17). GC holds the network exclusively, so no ADD or DEL of
//! that network runs meanwhile (spec 1.1 §3).
//!
//! Collected are (1) committed pod records outside the valid set: released through the
//! delegate's DEL with their recorded config, then dropped from the ledger; and (2) for
//! delegates that implement GC (advertise 1.1.0), whatever their own GC frees when given the
//! augmented valid list under both keys; or, for host-local, which has no GC, the
//! reservations its store holds that are in neither the ledger nor the valid set: released by
//! running host-local's DEL for them, never by touching its files.
//!
//! Input: the valid list is checked entry by entry before anything is planned ([`valid_input`],
//! [`parse_list`]); one entry dipamd cannot read refuses the whole GC, since guessing it stale
//! could free a running pod. Interlocks: a GC that would free more than `max_free_share` of the
//! network's pod attachments is refused whole, at any network size (calico#5044: a bad list
//! once freed every healthy pod); only an operator's `--force` overrides it.
//!
//! The warm pool's entries are always valid, like the agent's. A pod served from the pool is
//! matched against the runtime's list under its own key, but the delegate knows it by the
//! pool entry's key: the valid set handed to the delegate's GC, and the one its store is
//! compared with, name that key.

use std::{
    collections::HashSet,
    time::{Duration, SystemTime},
};

use dipam_proto::v1::{GcItem, Mode};
use dipam_state::{AttachmentRecord, AttachmentState, Owner};
use rscni_types::version::SpecVersion;
use serde_json::{Value, json};
use tracing::{info, warn};

use crate::{
    clock::now,
    delegate::{
        Invocation,
        config::{DelegateConf, result_ips},
        store,
    },
    error::ShimError,
    shim::Shim,
    validate,
};

/// GC safety settings (dipamd flags).
#[derive(Debug, Clone)]
pub struct GcPolicy {
    pub grace: Duration,
    pub max_free_share: f64,
    /// Accept an empty, null or absent valid list (it would free every pod of the network).
    pub allow_empty: bool,
}

impl Default for GcPolicy {
    fn default() -> Self {
        Self {
            grace: Duration::from_secs(60),
            max_free_share: 0.5,
            allow_empty: false,
        }
    }
}

/// What counts as valid.
#[derive(Debug, Clone)]
pub enum Valid {
    /// The runtime's (or operator's) list of (container ID, ifname).
    List(Vec<(String, String)>),
    /// Everything the ledger knows: collect only what the delegate holds behind dipamd's back.
    Ledger,
}

/// The key CNI 1.1 names the valid list under (libcni >= 1.2.0).
pub const VALID_KEY: &str = "cni.dev/valid-attachments";
/// The legacy duplicate libcni >= 1.2.3 also sends (containernetworking/cni#1103); the
/// spec-v1.1.0 tag's text names only this one.
pub const LEGACY_KEY: &str = "cni.dev/attachments";
/// How much of an offending entry an error quotes: enough to find it in the runtime's list,
/// never the whole of a hostile one.
const QUOTE: usize = 120;

pub use crate::error::InputError;

/// What a CNI GC request says is valid (spec 1.1 "GC"; libcni's `GCArgs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValidInput {
    /// Neither key: the runtime passed no `GCArgs` (cnitool: "all network interfaces should
    /// be GC'ed").
    Absent,
    /// JSON null: `GCArgs` without a list (CRI-O for a network that has no pods).
    Null,
    /// A list, possibly empty.
    List(Vec<(String, String)>),
}

impl ValidInput {
    /// Whether this input names nothing as valid, which would free every pod of the network.
    pub fn names_nothing(&self) -> bool {
        match self {
            Self::Absent | Self::Null => true,
            Self::List(l) => l.is_empty(),
        }
    }

    /// How this input names nothing, for the refusal.
    pub fn describe(&self) -> &'static str {
        match self {
            Self::Absent => "absent (neither cni.dev/valid-attachments nor cni.dev/attachments)",
            Self::Null => "null",
            Self::List(_) => "an empty list",
        }
    }
}

/// Reads the valid list of a CNI GC request, checking every entry. Both keys are read: libcni
/// 1.2.3 and later send the same list under each, 1.2.0-1.2.2 only `cni.dev/valid-attachments`;
/// where both carry a list, their union is valid (a longer valid list frees less). A key that
/// is null counts as absent when the other carries a list. Any entry that is not exactly
/// `{"containerID": <id>, "ifname": <name>}` refuses the whole GC.
pub fn valid_input(conf: &Value) -> Result<ValidInput, InputError> {
    let mut null = false;
    let mut list: Option<Vec<(String, String)>> = None;
    for key in [VALID_KEY, LEGACY_KEY] {
        match conf.get(key) {
            None => {}
            Some(Value::Null) => null = true,
            Some(v) => list
                .get_or_insert_with(Vec::new)
                .extend(parse_list(v, key)?),
        }
    }
    Ok(match list {
        Some(l) => ValidInput::List(l),
        None if null => ValidInput::Null,
        None => ValidInput::Absent,
    })
}

/// Checks a list of valid attachments found at `source` (a key, or a file for `dipamctl gc
/// --valid`): a JSON array of objects with exactly the keys `containerID` and `ifname`
/// (case-sensitive, as libcni writes them), both strings that pass the identifier rules
/// (validate.rs). The first offending entry is named by index and (bounded) content.
pub fn parse_list(v: &Value, source: &str) -> Result<Vec<(String, String)>, InputError> {
    const SHAPE: &str = r#"[{"containerID": "<id>", "ifname": "<name>"}, ...]"#;
    let list = v.as_array().ok_or_else(|| InputError {
        msg: format!("{source} is {}, not a list of attachments", kind(v)),
        details: format!(
            "expected {SHAPE}, found {}; the whole GC is refused and nothing was freed",
            quote(v)
        ),
    })?;
    list.iter()
        .enumerate()
        .map(|(i, e)| {
            entry(e).map_err(|why| InputError {
                msg: format!("{source}[{i}] is not a valid attachment: {}", quote(e)),
                details: format!(
                    "{why}; each entry must be exactly {{\"containerID\": \"<id>\", \
                     \"ifname\": \"<name>\"}} (keys are case-sensitive); the whole GC is \
                     refused and nothing was freed"
                ),
            })
        })
        .collect()
}

fn entry(e: &Value) -> Result<(String, String), String> {
    let o = e
        .as_object()
        .ok_or_else(|| format!("it is {}, not an object", kind(e)))?;
    if let Some(k) = o.keys().find(|k| *k != "containerID" && *k != "ifname") {
        let hint = if k.eq_ignore_ascii_case("containerID") || k.eq_ignore_ascii_case("ifname") {
            " (wrong case)"
        } else {
            ""
        };
        return Err(format!(
            "key {} is not allowed{hint}",
            quote(&Value::String(k.clone()))
        ));
    }
    let field = |k: &str| match o.get(k) {
        None => Err(format!("\"{k}\" is missing")),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(format!("\"{k}\" is {}, not a string", kind(other))),
    };
    let (cid, ifname) = (field("containerID")?, field("ifname")?);
    if validate::container_id(&cid).is_err() {
        return Err(
            "\"containerID\" is not a container ID (letters, digits, '_', '.', '-', \
                    starting with a letter or digit)"
                .into(),
        );
    }
    if validate::ifname(&ifname).is_err() {
        return Err(
            "\"ifname\" is not an interface name (1-15 characters, no '/', ':' or \
                    white space, not '.' or '..')"
                .into(),
        );
    }
    Ok((cid, ifname))
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// `v` as JSON, cut to [`QUOTE`] bytes.
fn quote(v: &Value) -> String {
    let s = v.to_string();
    if s.len() <= QUOTE {
        return s;
    }
    let mut end = QUOTE;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes)", &s[..end], s.len())
}

/// What a GC frees, and what it keeps and why.
#[derive(Debug, Default)]
pub struct Plan {
    /// Planned (dry run), freed or failed.
    pub items: Vec<GcItem>,
    /// Outcome "kept", with `keep` naming each reason.
    pub kept: Vec<GcItem>,
}

fn item(kind: &str, cid: &str, ifname: &str, ips: Vec<String>, reason: String) -> GcItem {
    GcItem {
        kind: kind.into(),
        container_id: cid.into(),
        ifname: ifname.into(),
        ips,
        reason,
        outcome: "planned".into(),
        error: String::new(),
        keep: Vec::new(),
    }
}

fn kept(kind: &str, cid: &str, ifname: &str, ips: Vec<String>, why: Vec<(&str, String)>) -> GcItem {
    let reason = why
        .iter()
        .map(|(_, text)| text.as_str())
        .collect::<Vec<_>>()
        .join("; ");
    GcItem {
        outcome: "kept".into(),
        keep: why.into_iter().map(|(code, _)| code.to_owned()).collect(),
        ..item(kind, cid, ifname, ips, reason)
    }
}

fn age(secs: u64) -> String {
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s => format!("{}h", s / 3600),
    }
}

/// Plans and (unless `dry_run`) runs GC of the network of `dc`. `force` overrides the share
/// interlock (`dipamctl gc --force`); nothing else does.
pub async fn collect(
    shim: &Shim,
    dc: &DelegateConf,
    cni_path: &str,
    valid: Valid,
    dry_run: bool,
    force: bool,
) -> Result<Plan, ShimError> {
    let network = dc.network.clone();
    let _exclusive = shim.locks.exclusive(&network).await;
    let net = network.clone();
    let records: Vec<AttachmentRecord> = shim.ledger(move |l| l.list(Some(&net))).await?;
    let t = now();
    let grace = shim.gc.grace.as_secs();

    let listed: HashSet<(String, String)> = match &valid {
        Valid::List(l) => l.iter().cloned().collect(),
        Valid::Ledger => records
            .iter()
            .map(|r| (r.key.container_id.clone(), r.key.ifname.clone()))
            .collect(),
    };
    // Every reason a record is kept, as (code, text) for `dipamctl gc --dry-run`.
    let reasons = |r: &AttachmentRecord| {
        let mut why: Vec<(&str, String)> = Vec::new();
        if listed.contains(&(r.key.container_id.clone(), r.key.ifname.clone())) {
            why.push((
                "valid-list",
                match valid {
                    Valid::List(_) => "in the valid list".into(),
                    Valid::Ledger => "in the ledger (--use-ledger)".into(),
                },
            ));
        }
        match &r.owner {
            Owner::Agent { role } => why.push(("agent", format!("the agent's {role} address"))),
            Owner::Pool => why.push(("pool", "a warm-pool entry".into())),
            Owner::Pod => {}
        }
        if r.state != AttachmentState::Committed {
            why.push((
                "in-flight",
                format!(
                    "an operation is in flight or was interrupted (state {})",
                    r.state.as_str()
                ),
            ));
        }
        let old = t.saturating_sub(r.created_at);
        if old < grace {
            why.push((
                "grace",
                format!(
                    "added {} ago, inside the grace period (--gc-grace {grace}s)",
                    age(old)
                ),
            ));
        }
        why
    };
    let mut keep: HashSet<(String, String)> = HashSet::new();
    let mut kept_items = Vec::new();
    let mut stale: Vec<&AttachmentRecord> = Vec::new();
    for r in &records {
        let why = reasons(r);
        if why.is_empty() {
            stale.push(r);
            continue;
        }
        keep.insert((r.key.container_id.clone(), r.key.ifname.clone()));
        kept_items.push(kept(
            "ledger",
            &r.key.container_id,
            &r.key.ifname,
            r.result.as_ref().map(result_ips).unwrap_or_default(),
            why,
        ));
    }
    keep.extend(listed.iter().cloned());
    // What the delegate is told to keep, and its store compared with: `keep` plus the
    // delegate's key of every kept record (a pod served from the warm pool).
    let delegate_pair = |r: &AttachmentRecord| {
        let (c, i) = r.delegate_ids();
        (c.to_owned(), i.to_owned())
    };
    let delegate_keep: HashSet<(String, String)> = keep
        .iter()
        .cloned()
        .chain(
            records
                .iter()
                .filter(|r| keep.contains(&(r.key.container_id.clone(), r.key.ifname.clone())))
                .map(delegate_pair),
        )
        .collect();
    let pods = records
        .iter()
        .filter(|r| r.owner == Owner::Pod && r.state == AttachmentState::Committed)
        .count();
    // The share interlock (calico#5044: a bad list once freed every healthy pod). It holds at
    // every size: freeing the only pod of a network, or both of two, is exactly what a
    // truncated list does, so it takes an operator's --force (or --gc-max-free-share 1).
    if !force && !stale.is_empty() && stale.len() as f64 > shim.gc.max_free_share * pods as f64 {
        shim.gc_stats
            .refused
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        shim.events.emit(crate::events::Event::GcRefused);
        return Err(ShimError::GcRefused {
            network,
            reason: format!(
                "it would free {} of the network's {pods} pod attachments, more than the \
                 allowed share {:.0}% (dipamd --gc-max-free-share; `dipamctl gc --force \
                 --dry-run` shows what it would free, and without --dry-run frees it)",
                stale.len(),
                shim.gc.max_free_share * 100.0
            ),
        });
    }
    let mut items: Vec<GcItem> = stale
        .iter()
        .map(|r| {
            item(
                "ledger",
                &r.key.container_id,
                &r.key.ifname,
                r.result.as_ref().map(result_ips).unwrap_or_default(),
                format!(
                    "not in the valid list; added {} ago{}",
                    age(t.saturating_sub(r.created_at)),
                    r.delegate_key
                        .as_ref()
                        .map(|d| format!(
                            "; {} holds it as {}/{}",
                            r.delegate_type, d.container_id, d.ifname
                        ))
                        .unwrap_or_default()
                ),
            )
        })
        .collect();

    let (probe, send) = shim.resolve(dc, cni_path).await?;
    let native_gc = probe.supported.contains(&SpecVersion::new(1, 1, 0));
    // Orphans: in the delegate's own store, unknown to the ledger and to the valid set.
    let mut orphans = Vec::new();
    if !native_gc && let Some(dir) = store::readable_dir(&dc.kind, &dc.conf, &network) {
        let known: HashSet<(String, String)> = records.iter().map(delegate_pair).collect();
        let known_ids: HashSet<&str> = known.iter().map(|(c, _)| c.as_str()).collect();
        let keep_ids: HashSet<&str> = delegate_keep.iter().map(|(c, _)| c.as_str()).collect();
        let reservations = store::reservations(&dir)
            .map_err(|e| ShimError::Internal(format!("reading {}: {e}", dir.display())))?;
        for r in reservations {
            let pair = (r.container_id.clone(), r.ifname.clone());
            // Legacy id-only files (empty ifname) match by container ID.
            let (recorded, listed) = if r.ifname.is_empty() {
                (
                    known_ids.contains(r.container_id.as_str()),
                    keep_ids.contains(r.container_id.as_str()),
                )
            } else {
                (known.contains(&pair), delegate_keep.contains(&pair))
            };
            if recorded {
                // The ledger's record stands for it (kept or collected above).
                continue;
            }
            let age = r
                .modified
                .and_then(|m| SystemTime::now().duration_since(m).ok());
            let young = age.is_some_and(|d| d < shim.gc.grace);
            if listed || young {
                let mut why = Vec::new();
                if listed {
                    why.push((
                        "valid-list",
                        format!(
                            "held by {} and in the valid list, unknown to dipamd",
                            dc.kind
                        ),
                    ));
                }
                if young {
                    why.push((
                        "grace",
                        format!(
                            "reserved {} ago, inside the grace period (--gc-grace {grace}s)",
                            self::age(age.map_or(0, |d| d.as_secs()))
                        ),
                    ));
                }
                kept_items.push(kept(
                    "orphan",
                    &r.container_id,
                    &r.ifname,
                    vec![r.ip.to_string()],
                    why,
                ));
                continue;
            }
            items.push(item(
                "orphan",
                &r.container_id,
                &r.ifname,
                vec![r.ip.to_string()],
                format!(
                    "held by {} in {} but unknown to dipamd and not in the valid list",
                    dc.kind,
                    dir.display()
                ),
            ));
            orphans.push(r);
        }
    }
    if dry_run {
        return Ok(Plan {
            items,
            kept: kept_items,
        });
    }

    let mut n = 0;
    for rec in stale {
        let it = &mut items[n];
        n += 1;
        let mut marked = rec.clone();
        marked.state = AttachmentState::Deleting;
        marked.updated_at = t;
        let outcome = async {
            shim.ledger(move |l| l.put(&marked)).await?;
            shim.release_recorded(rec).await?;
            let key = rec.key.clone();
            shim.ledger(move |l| l.remove(&key)).await?;
            shim.attachment_delta(rec, -1);
            Ok(())
        }
        .await;
        finish(shim, it, outcome);
    }
    if native_gc {
        let mut conf = dc.conf.clone();
        let list: Vec<Value> = delegate_keep
            .iter()
            .map(|(c, i)| json!({"containerID": c, "ifname": i}))
            .collect();
        conf["cni.dev/valid-attachments"] = Value::Array(list.clone());
        conf["cni.dev/attachments"] = Value::Array(list);
        let inv = Invocation {
            command: "GC".into(),
            path: shim.exec.delegate_cni_path(cni_path),
            stdin: serde_json::to_vec(&conf).map_err(|e| ShimError::Internal(e.to_string()))?,
            ..Invocation::default()
        };
        shim.exec.call(&dc.kind, &probe, &inv).await?;
        info!(network = %network, delegate = %dc.kind, kept = delegate_keep.len(), "delegate GC run with the augmented valid list");
    }
    for (r, it) in orphans.iter().zip(items.iter_mut().skip(n)) {
        let mut conf = dc.conf.clone();
        if let Some(o) = conf.as_object_mut() {
            o.remove("cni.dev/valid-attachments");
            o.remove("cni.dev/attachments");
        }
        let d = DelegateConf { conf, ..dc.clone() };
        let outcome = async {
            let inv = Invocation {
                command: "DEL".into(),
                container_id: r.container_id.clone(),
                // host-local releases `<id>\r\n<ifname>`, and falls back to legacy id-only
                // files when nothing matches: any valid ifname reaches those.
                ifname: if r.ifname.is_empty() {
                    "eth0".into()
                } else {
                    r.ifname.clone()
                },
                path: shim.exec.delegate_cni_path(cni_path),
                stdin: d.bytes_for(send)?,
                ..Invocation::default()
            };
            shim.exec.call(&dc.kind, &probe, &inv).await.map(|_| ())
        }
        .await;
        finish(shim, it, outcome);
    }
    Ok(Plan {
        items,
        kept: kept_items,
    })
}

fn finish(shim: &Shim, it: &mut GcItem, outcome: Result<(), ShimError>) {
    match outcome {
        Ok(()) => {
            it.outcome = "freed".into();
            shim.gc_stats
                .freed
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            shim.events.emit(crate::events::Event::GcFreed(1));
            info!(kind = %it.kind, container_id = %it.container_id, ifname = %it.ifname, ips = ?it.ips, reason = %it.reason, "GC freed");
        }
        Err(e) => {
            it.outcome = "failed".into();
            it.error = e.to_string();
            warn!(kind = %it.kind, container_id = %it.container_id, error = %e, "GC could not free; carrying on");
        }
    }
}

/// The mode a request config is in, for configs that did not come through the plugin.
pub fn mode_of(conf: &Value) -> Mode {
    if conf["ipam"]["type"] == "dipam" {
        Mode::Ipam
    } else {
        Mode::Main
    }
}

/// Counters for status.
#[derive(Debug, Default)]
pub struct GcStats {
    pub refused: std::sync::atomic::AtomicU64,
    pub freed: std::sync::atomic::AtomicU64,
    pub missing: std::sync::atomic::AtomicU64,
    pub orphans: std::sync::atomic::AtomicU64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(c: &str, i: &str) -> (String, String) {
        (c.into(), i.into())
    }

    #[test]
    fn valid_input_reads_both_keys_and_tells_absent_null_and_empty_apart() {
        let both = json!({VALID_KEY:[{"containerID":"a","ifname":"eth0"}],
                          LEGACY_KEY:[{"containerID":"a","ifname":"eth0"}]});
        let ValidInput::List(l) = valid_input(&both).unwrap() else {
            panic!()
        };
        assert!(l.iter().all(|p| *p == pair("a", "eth0")));
        let legacy = json!({LEGACY_KEY:[{"containerID":"b","ifname":"eth1"}]});
        assert_eq!(
            valid_input(&legacy).unwrap(),
            ValidInput::List(vec![pair("b", "eth1")])
        );
        // Different lists under the two keys: both are valid.
        let differ = json!({VALID_KEY:[{"containerID":"a","ifname":"eth0"}],
                            LEGACY_KEY:[{"containerID":"b","ifname":"eth0"}]});
        let ValidInput::List(l) = valid_input(&differ).unwrap() else {
            panic!()
        };
        assert!(l.contains(&pair("a", "eth0")) && l.contains(&pair("b", "eth0")));
        let empty = valid_input(&json!({VALID_KEY: []})).unwrap();
        assert_eq!(empty, ValidInput::List(vec![]));
        assert!(empty.names_nothing());
        let null = valid_input(&json!({VALID_KEY: null, LEGACY_KEY: null})).unwrap();
        assert_eq!(null, ValidInput::Null);
        assert!(null.names_nothing());
        assert_eq!(valid_input(&json!({})).unwrap(), ValidInput::Absent);
        // A null key beside a list: the list.
        assert_eq!(
            valid_input(&json!({VALID_KEY: null, LEGACY_KEY: [{"containerID":"c","ifname":"e"}]}))
                .unwrap(),
            ValidInput::List(vec![pair("c", "e")])
        );
    }

    #[test]
    fn any_entry_not_exactly_container_id_and_ifname_refuses_the_whole_list() {
        let ok = json!({"containerID":"good","ifname":"eth0"});
        for (bad, says) in [
            (json!({"containerId":"a","ifname":"eth0"}), "wrong case"),
            (json!({"containerID":"a"}), "\"ifname\" is missing"),
            (json!({"ifname":"eth0"}), "\"containerID\" is missing"),
            (
                json!({"containerID":"a","ifname":"eth0","netns":"/x"}),
                "\"netns\" is not allowed",
            ),
            (
                json!({"containerID":1,"ifname":"eth0"}),
                "a number, not a string",
            ),
            (
                json!({"containerID":"a","ifname":null}),
                "null, not a string",
            ),
            (
                json!({"containerID":"","ifname":"eth0"}),
                "not a container ID",
            ),
            (
                json!({"containerID":"a/b","ifname":"eth0"}),
                "not a container ID",
            ),
            (
                json!({"containerID":"a","ifname":"a/b"}),
                "not an interface name",
            ),
            (json!("a"), "a string, not an object"),
            (json!(["a", "eth0"]), "a list, not an object"),
        ] {
            let e = parse_list(&json!([ok, bad]), VALID_KEY).unwrap_err();
            assert!(e.msg.starts_with(&format!("{VALID_KEY}[1] ")), "{e}");
            assert!(e.msg.contains(&quote(&bad)), "{e}");
            assert!(e.details.contains(says), "{bad}: {e}");
            assert!(e.details.contains("nothing was freed"), "{e}");
            // The same through a request, under either key.
            assert!(valid_input(&json!({LEGACY_KEY: [bad]})).is_err());
        }
        let e = parse_list(&json!({"containerID":"a","ifname":"eth0"}), "valid.json").unwrap_err();
        assert_eq!(e.msg, "valid.json is an object, not a list of attachments");
        assert!(parse_list(&json!("x"), "f").is_err());
        assert!(valid_input(&json!({VALID_KEY: {}})).is_err());
    }

    #[test]
    fn a_hostile_entry_is_quoted_bounded() {
        let huge = "x".repeat(1 << 20);
        let e = parse_list(&json!([{ huge.clone(): "y" }]), VALID_KEY).unwrap_err();
        assert!(
            e.msg.len() < 400 && e.details.len() < 800,
            "{}",
            e.msg.len()
        );
        let e = parse_list(
            &json!([{"containerID": huge, "ifname": "é".repeat(500)}]),
            "f",
        )
        .unwrap_err();
        assert!(e.msg.len() < 400, "{}", e.msg.len());
    }
}

#[cfg(test)]
mod plan_tests {
    use dipam_state::{AttachmentKey, MemStore};

    use super::*;
    use crate::rpc::tests::{request, scripted_shim};

    const SCRIPT: &str = r#"#!/bin/sh
d=$(dirname "$0")
echo "$CNI_COMMAND $CNI_CONTAINERID" >> "$d/calls"
case "$CNI_COMMAND" in
VERSION) echo '{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0"]}' ;;
esac
"#;

    fn rec(cid: &str, owner: Owner, state: AttachmentState, created_at: u64) -> AttachmentRecord {
        AttachmentRecord {
            key: AttachmentKey::new("net", cid, "eth0"),
            owner,
            state,
            delegate_type: "fake-ipam".into(),
            delegate_version: "1.0.0".into(),
            delegate_config: r#"{"cniVersion":"1.0.0","name":"net","type":"fake-ipam"}"#.into(),
            netns: String::new(),
            cni_args: String::new(),
            cni_path: String::new(),
            result: Some(json!({"cniVersion":"1.0.0","ips":[{"address":"10.9.0.9/24"}]})),
            config_digest: String::new(),
            request_id: "t".into(),
            created_at,
            updated_at: created_at,
            issued_ms: 0,
            issued_at: None,
            delegate_key: None,
            creator_uid: None,
        }
    }

    async fn bench(
        records: Vec<AttachmentRecord>,
    ) -> (tempfile::TempDir, std::sync::Arc<Shim>, DelegateConf) {
        let (dir, shim) = scripted_shim(SCRIPT, std::sync::Arc::new(MemStore::new()));
        for r in records {
            shim.ledger(move |l| l.put(&r)).await.unwrap();
        }
        let dc = shim
            .prepare(
                request("", "1.1.0", json!({})),
                false,
                crate::access::Caller::ROOT,
            )
            .unwrap()
            .dc;
        (dir, shim, dc)
    }

    fn list(ids: &[&str]) -> Valid {
        Valid::List(
            ids.iter()
                .map(|c| ((*c).to_owned(), "eth0".to_owned()))
                .collect(),
        )
    }

    #[tokio::test]
    async fn a_plan_says_why_it_keeps_each_attachment() {
        let old = now() - 1000; // older than the default grace (60 s)
        let (_d, shim, dc) = bench(vec![
            rec("listed", Owner::Pod, AttachmentState::Committed, old),
            rec("stale", Owner::Pod, AttachmentState::Committed, old),
            rec("young", Owner::Pod, AttachmentState::Committed, now()),
            rec("busy", Owner::Pod, AttachmentState::Adding, old),
            rec(
                "dipam-router-ipv4-n1",
                Owner::Agent {
                    role: "router".into(),
                },
                AttachmentState::Committed,
                old,
            ),
            rec(
                "dipam-pool-n1-0",
                Owner::Pool,
                AttachmentState::Committed,
                old,
            ),
        ])
        .await;
        let plan = collect(&shim, &dc, "", list(&["listed"]), true, false)
            .await
            .unwrap();
        let freed: Vec<_> = plan.items.iter().map(|i| i.container_id.as_str()).collect();
        assert_eq!(freed, vec!["stale"]);
        assert_eq!(plan.items[0].outcome, "planned");
        let mut kept: Vec<_> = plan
            .kept
            .iter()
            .map(|i| {
                assert_eq!(i.outcome, "kept");
                assert!(!i.reason.is_empty());
                (i.container_id.as_str(), i.keep.join(","))
            })
            .collect();
        kept.sort();
        assert_eq!(
            kept,
            vec![
                ("busy", "in-flight".to_owned()),
                ("dipam-pool-n1-0", "pool".to_owned()),
                ("dipam-router-ipv4-n1", "agent".to_owned()),
                ("listed", "valid-list".to_owned()),
                ("young", "grace".to_owned()),
            ]
        );
        assert!(
            shim.lookup(&AttachmentKey::new("net", "stale", "eth0"))
                .unwrap()
                .is_some(),
            "a dry run freed"
        );
    }

    #[tokio::test]
    async fn freeing_all_of_a_small_network_takes_force() {
        let old = now() - 1000;
        // One pod, not in the list: 1 of 1.
        let (_d, shim, dc) = bench(vec![rec(
            "only",
            Owner::Pod,
            AttachmentState::Committed,
            old,
        )])
        .await;
        let e = collect(&shim, &dc, "", list(&["other"]), false, false)
            .await
            .unwrap_err();
        assert!(matches!(e, ShimError::GcRefused { .. }), "{e:?}");
        assert!(
            shim.lookup(&AttachmentKey::new("net", "only", "eth0"))
                .unwrap()
                .is_some()
        );
        let plan = collect(&shim, &dc, "", list(&["other"]), false, true)
            .await
            .unwrap();
        assert_eq!(plan.items[0].outcome, "freed", "{:?}", plan.items);
        assert!(
            shim.lookup(&AttachmentKey::new("net", "only", "eth0"))
                .unwrap()
                .is_none()
        );

        // Two pods: both is refused, one of two is not.
        let (_d, shim, dc) = bench(vec![
            rec("a", Owner::Pod, AttachmentState::Committed, old),
            rec("b", Owner::Pod, AttachmentState::Committed, old),
        ])
        .await;
        assert!(
            collect(&shim, &dc, "", list(&["other"]), false, false)
                .await
                .is_err()
        );
        let plan = collect(&shim, &dc, "", list(&["a"]), false, false)
            .await
            .unwrap();
        assert_eq!(plan.items.len(), 1);
        assert_eq!(plan.items[0].container_id, "b");
        assert_eq!(plan.items[0].outcome, "freed");
    }
}
