//! Garbage collection of one network: what the runtime's CNI GC asks for, what `dipamctl gc`
//! asks for, and what the periodic reconcile may do.
//!
//! The valid set is the union of the runtime's list, every agent-owned attachment, every
//! attachment with an operation in flight or interrupted (state `adding`/`deleting`, or its key
//! locked), every attachment younger than the grace period, and every attachment whose ADD
//! finished after the GC began (core/births.rs; on the boot clock, so neither a grace of 0
//! nor a wall-clock step lets one through): a pod being created while GC runs never loses its
//! address (whereabouts#207, F17). GC locks what it frees, not the
//! network (collect.rs, keylock.rs): a pod's ADD on the network waits for no GC.
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

pub mod admit;
pub mod collect;
pub mod evidence;
pub mod input;
pub mod runtime;

use std::time::Duration;

use dipam_proto::v1::{GcItem, Mode};
use serde_json::Value;

use crate::l1_leaves::validate;

/// The GC's own state, held by the daemon's context: its policy (the flags), its counters,
/// and the runtime-aware GC when dipamd runs with --cri-endpoint.
#[derive(Debug)]
pub struct Gc {
    pub policy: GcPolicy,
    pub stats: GcStats,
    pub runtime: std::sync::OnceLock<runtime::RuntimeGc>,
    /// The evidence pass's looks (evidence.rs).
    pub evidence: evidence::Evidence,
    /// Slots of the GCs freeing now, on any network ([`RUNNING`]); each holds one to its end
    /// (collect/mod.rs).
    pub running: std::sync::Arc<tokio::sync::Semaphore>,
}

/// How many GCs may free at once, across networks. A freeing GC runs to its end after its
/// caller leaves (collect/mod.rs), so without a bound a root caller naming one network after
/// another, and hanging up on each, would leave dipamd running that many GCs, each with its
/// delegate DELs. One per network already; a node has a handful of networks, and a GC past
/// these waits for a slot with its caller, and leaves nothing behind if that caller gives up.
pub const RUNNING: usize = 4;

impl Gc {
    /// Looks at the node for the evidence that an address is in use (liveness.rs), with the
    /// runtime's sandbox list when dipamd has one.
    pub async fn scan(&self) -> crate::l3_clients::liveness::Scan {
        let runtime = self.runtime.get().map(|r| r.client.clone());
        crate::l3_clients::liveness::scan(runtime.as_deref()).await
    }

    pub fn new(policy: GcPolicy) -> Self {
        Self {
            policy,
            stats: GcStats::default(),
            runtime: std::sync::OnceLock::new(),
            evidence: evidence::Evidence::default(),
            running: std::sync::Arc::new(tokio::sync::Semaphore::new(RUNNING)),
        }
    }
}

/// What the GC's work reaches: the core, the GC's own state, and the agent's (whose conflist
/// names one of the networks GC knows).
#[derive(Clone)]
pub struct Collector {
    pub core: std::sync::Arc<crate::l2_core::core::Core>,
    pub gc: std::sync::Arc<Gc>,
    pub agent: std::sync::Arc<crate::l3_clients::agent::Agent>,
    /// The veth teardown worker (teardown.rs), when the daemon started one.
    pub teardown: std::sync::Arc<std::sync::OnceLock<crate::l3_clients::teardown::Teardown>>,
}

impl Collector {
    /// Before GC releases `rec`'s address: the host veth dipam's main mode made for it (and
    /// with it the host's route to the address) goes first, as a DEL's would
    /// (teardown.rs `retire`). Without the teardown worker it stays; a later ADD handed the
    /// address is then refused (165), naming it.
    pub async fn retire_datapath(&self, rec: &dipam_state::AttachmentRecord) {
        if rec.owner != dipam_state::Owner::Pod {
            return;
        }
        if let Some(t) = self.teardown.get() {
            let k = &rec.key;
            t.retire(vec![(
                k.network.clone(),
                k.container_id.clone(),
                k.ifname.clone(),
            )])
            .await;
        }
    }
}

/// The delegate config `rec` was added with.
pub fn recorded_conf(
    rec: &dipam_state::AttachmentRecord,
) -> Option<crate::l2_core::delegate::config::DelegateConf> {
    let conf = serde_json::from_str(&rec.delegate_config).ok()?;
    Some(crate::l2_core::delegate::config::DelegateConf {
        kind: rec.delegate_type.clone(),
        network: rec.key.network.clone(),
        version: rec
            .delegate_version
            .parse()
            .unwrap_or(rscni_types::version::SpecVersion::CURRENT),
        conf,
    })
}

/// The delegate's store a record's addresses live in (None: one dipamd cannot read).
pub fn record_store(rec: &dipam_state::AttachmentRecord) -> Option<std::path::PathBuf> {
    let conf = serde_json::from_str(&rec.delegate_config).ok()?;
    crate::l2_core::delegate::store::readable_dir(&rec.delegate_type, &conf, &rec.key.network)
}

/// The scopes the node-level checks judge apart: one per network, creator (None: root) and
/// delegate store. A non-root caller's records never decide anything for root's pods or the
/// node's readiness (docs/cfp.md, "Threat model"): each scope's verdict binds its own creator.
pub async fn scopes(
    core: &crate::l2_core::core::Core,
    agent: &crate::l3_clients::agent::Agent,
) -> Result<
    Vec<(crate::l2_core::delegate::config::DelegateConf, Option<u32>)>,
    crate::l1_leaves::error::ShimError,
> {
    let mut out: Vec<(crate::l2_core::delegate::config::DelegateConf, Option<u32>)> = Vec::new();
    if let Some(dc) = agent.delegate_conf() {
        out.push((dc, None));
    }
    // One record per group of the ledger's census (same network, creator and config less
    // its per-pod parts), not every record: every scope is a union of groups, and reading
    // and decoding every record's config made `dipamctl status` and doctor grow with the
    // node (docs/performance.md, "Density").
    for (_, _, rec) in core.ledger(|l| l.groups()).await? {
        let Some(dc) = recorded_conf(&rec) else {
            continue;
        };
        let seen = out
            .iter()
            .any(|(d, c)| same_scope(d, *c, &dc, rec.creator_uid));
        if !seen {
            out.push((dc, rec.creator_uid));
        }
    }
    Ok(out)
}

/// Whether a record added with `dc` by `creator` belongs to the scope of `scope` and
/// `scope_creator`: same network, same creator, and the same delegate store (a record of
/// another delegate type on the network joins the scope it shares network and creator with).
fn same_scope(
    scope: &crate::l2_core::delegate::config::DelegateConf,
    scope_creator: Option<u32>,
    dc: &crate::l2_core::delegate::config::DelegateConf,
    creator: Option<u32>,
) -> bool {
    let store_of = |dc: &crate::l2_core::delegate::config::DelegateConf| {
        crate::l2_core::delegate::store::readable_dir(&dc.kind, &dc.conf, &dc.network)
    };
    scope.network == dc.network
        && scope_creator == creator
        && (scope.kind != dc.kind || store_of(scope) == store_of(dc))
}

/// The index in `scopes` (as [`scopes`] returns them) of the scope `rec` belongs to.
pub fn scope_of(
    scopes: &[(crate::l2_core::delegate::config::DelegateConf, Option<u32>)],
    rec: &dipam_state::AttachmentRecord,
) -> Option<usize> {
    let dc = recorded_conf(rec)?;
    scopes
        .iter()
        .position(|(d, c)| same_scope(d, *c, &dc, rec.creator_uid))
}

/// GC safety settings (dipamd flags).
#[derive(Debug, Clone)]
pub struct GcPolicy {
    pub grace: Duration,
    pub max_free_share: f64,
    /// Accept an empty, null or absent valid list (it would free every pod of the network).
    pub allow_empty: bool,
    /// Delegate DELs a GC runs at a time (`--gc-parallel`).
    pub parallel: usize,
}

/// `--gc-parallel`'s default: docs/performance.md (run 13) measured host-local's DELs on a
/// 2-CPU node; more at once only queue on host-local's directory lock and the CPUs, and slow
/// the pods' ADDs that run beside the GC.
pub const DEFAULT_PARALLEL: u16 = 2;

impl Default for GcPolicy {
    fn default() -> Self {
        Self {
            grace: Duration::from_secs(60),
            max_free_share: 0.5,
            allow_empty: false,
            parallel: usize::from(DEFAULT_PARALLEL),
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

pub use crate::l1_leaves::error::InputError;

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
        .map(|(i, e)| checked_entry(e, source, i))
        .collect()
}

/// Entry `i` of the list at `source`, checked: the pair, or the error that names it.
fn checked_entry(e: &Value, source: &str, i: usize) -> Result<(String, String), InputError> {
    entry(e).map_err(|why| InputError {
        msg: format!("{source}[{i}] is not a valid attachment: {}", quote(e)),
        details: format!(
            "{why}; each entry must be exactly {{\"containerID\": \"<id>\", \
             \"ifname\": \"<name>\"}} (keys are case-sensitive); the whole GC is \
             refused and nothing was freed"
        ),
    })
}

/// Why one entry of a valid list is not an attachment (the `why` of [`parse_list`]'s error).
#[derive(Debug, thiserror::Error)]
enum BadEntry {
    #[error("it is {0}, not an object")]
    NotAnObject(&'static str),
    #[error("key {key} is not allowed{}", if *.wrong_case { " (wrong case)" } else { "" })]
    Key { key: String, wrong_case: bool },
    #[error("\"{0}\" is missing")]
    Missing(&'static str),
    #[error("\"{0}\" is {1}, not a string")]
    NotAString(&'static str, &'static str),
    #[error(
        "\"containerID\" is not a container ID (letters, digits, '_', '.', '-', starting with \
         a letter or digit)"
    )]
    ContainerId,
    #[error(
        "\"ifname\" is not an interface name (1-15 characters, no '/', ':' or white space, \
         not '.' or '..')"
    )]
    Ifname,
}

fn entry(e: &Value) -> Result<(String, String), BadEntry> {
    let o = e
        .as_object()
        .ok_or_else(|| BadEntry::NotAnObject(kind(e)))?;
    if let Some(k) = o.keys().find(|k| *k != "containerID" && *k != "ifname") {
        return Err(BadEntry::Key {
            key: quote(&Value::String(k.clone())),
            wrong_case: k.eq_ignore_ascii_case("containerID") || k.eq_ignore_ascii_case("ifname"),
        });
    }
    let field = |k: &'static str| match o.get(k) {
        None => Err(BadEntry::Missing(k)),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(BadEntry::NotAString(k, kind(other))),
    };
    let (cid, ifname) = (field("containerID")?, field("ifname")?);
    if validate::container_id(&cid).is_err() {
        return Err(BadEntry::ContainerId);
    }
    if validate::ifname(&ifname).is_err() {
        return Err(BadEntry::Ifname);
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

/// Why a record that is not `committed` is kept by every GC: an operation on it is in
/// flight, or was interrupted and is finished by the next start or the runtime's DEL.
pub(crate) fn interrupted(r: &dipam_state::AttachmentRecord) -> (&'static str, String) {
    (
        "in-flight",
        format!(
            "an operation is in flight or was interrupted (state {})",
            r.state.as_str()
        ),
    )
}

fn age(secs: u64) -> String {
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s => format!("{}h", s / 3600),
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
    /// Unrecorded reservations in use (or not provably unused) at the last reconcile: kept.
    pub unrecorded_alive: std::sync::atomic::AtomicU64,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

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
