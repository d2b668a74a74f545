//! `--ranges-from-node NODE`: host-local's ranges in the conflist (given, or the node's own
//! being wrapped) set to the node's own pod CIDRs, its Node object's `spec.podCIDRs` read from
//! the API server (`ctl/kube.rs`; the rewrite is `ctl/ranges.rs`). They are read after every
//! local check and before anything is written.

use std::time::Duration;

use serde_json::{Value, json};

use super::{Options, conflist::validate_conflist, wrap_files::Prepared};
use crate::{
    error::{AdoptError, InstallError},
    kube::{self, ApiConfig, Backoff, PodCidrs},
    ranges,
};

/// Where `--ranges-from-node` reads the node's pod CIDRs, and whether it waits for them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangesFrom {
    pub node: String,
    pub api: ApiConfig,
    /// `--wait`: while the node has no podCIDR yet (or the API server does not answer), try
    /// again with this back-off instead of failing.
    pub wait: Option<Backoff>,
}

/// The node's pod CIDRs, as written into host-local's `ranges`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRanges {
    pub cidrs: PodCidrs,
    /// The plugin whose host-local got them.
    pub plugin: usize,
    /// What host-local had instead (compact JSON), or "".
    pub replaced: String,
}

impl NodeRanges {
    pub(super) fn json(&self) -> Value {
        json!({
            "node": self.cidrs.node,
            "field": self.cidrs.field,
            "cidrs": self.cidrs.cidrs.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "ranges": ranges::ranges_value(&self.cidrs.cidrs),
            "plugin": self.plugin,
            "replaced": (!self.replaced.is_empty()).then(|| {
                serde_json::from_str::<Value>(&self.replaced).unwrap_or(Value::Null)
            }),
        })
    }

    pub(super) fn line(&self) -> String {
        format!(
            "ranges:    node {} {}: {} (host-local of plugins[{}])",
            self.cidrs.node, self.cidrs.field, self.cidrs, self.plugin
        )
    }
}

/// The node's pod CIDRs from the API server, as `r` says, waiting if it says so.
pub fn node_pod_cidrs(
    r: &RangesFrom,
    log: impl FnMut(&str),
    sleep: impl FnMut(Duration),
) -> Result<PodCidrs, InstallError> {
    kube::wait_for_pod_cidrs(
        &r.node,
        r.wait,
        || kube::node_pod_cidrs(&r.api, &r.node),
        log,
        sleep,
    )
    .map_err(|source| InstallError::Kube {
        node: r.node.clone(),
        source,
    })
}

/// The `--ranges-from-node` step: asks `cidrs` (only with --ranges-from-node) and writes them
/// into the conflist to install or the one being wrapped; none without the flag.
pub(super) fn apply(
    opts: &Options,
    cidrs: impl FnOnce(&RangesFrom) -> Result<PodCidrs, InstallError>,
    conflist: &mut Option<(Vec<u8>, String)>,
    adopted: &mut Option<Prepared>,
) -> Result<Option<NodeRanges>, InstallError> {
    match &opts.ranges {
        None => Ok(None),
        Some(from) => node_ranges(opts, cidrs(from)?, conflist, adopted).map(Some),
    }
}

/// `--ranges-from-node`: the conflist (given, or the node's own being wrapped) with
/// host-local's ranges set to the node's pod CIDRs, validated as dipam would.
fn node_ranges(
    opts: &Options,
    cidrs: PodCidrs,
    conflist: &mut Option<(Vec<u8>, String)>,
    adopted: &mut Option<Prepared>,
) -> Result<NodeRanges, InstallError> {
    let (source, text, only) = match (&*conflist, &*adopted) {
        (Some((bytes, _)), _) => (
            opts.conflist.clone().unwrap_or_default(),
            String::from_utf8(bytes.clone()).map_err(InstallError::NotUtf8)?,
            None,
        ),
        (None, Some(p)) => (
            p.source.clone(),
            p.rewritten.text.clone(),
            Some(p.rewritten.plugin),
        ),
        (None, None) => {
            return Err(InstallError::RangesWithoutConflist);
        }
    };
    let at = |e: AdoptError| InstallError::Adopt {
        path: source.clone(),
        source: e,
    };
    let with = ranges::set_ranges(&text, &cidrs.cidrs, only).map_err(|e| at(e.into()))?;
    validate_conflist(with.text.as_bytes()).map_err(|e| at(AdoptError::RangesRefused(e)))?;
    match (conflist, adopted) {
        (Some((bytes, _)), _) => *bytes = with.text.clone().into_bytes(),
        (None, Some(p)) => p.rewritten.text = with.text.clone(),
        (None, None) => {}
    }
    Ok(NodeRanges {
        cidrs,
        plugin: with.plugin,
        replaced: with.before,
    })
}
