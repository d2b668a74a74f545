//! Adoption: recording the reservations the delegate holds for running pods that dipamd never
//! saw. A node that already runs pods when dipam is put in front of its IPAM (`dipamctl
//! install --wrap`) has one reservation per pod in host-local's store and none in the ledger;
//! left so, every tool that compares the two called them orphans and offered to free them,
//! and freeing one handed a running pod's address to the next pod.
//!
//! A reservation is adopted only on evidence that its pod is alive (liveness.rs); it becomes
//! a committed pod record under the (container ID, ifname) the delegate holds it by, with the
//! network's delegate config, exactly as `dipamctl recover` writes one. The pod's DEL then
//! releases it through dipamd like any other. Adoption frees nothing. It runs in every
//! reconcile round (and the first, at start) and on an operator's `dipamctl adopt`, which
//! `dipamctl install --wrap` calls.

use std::{collections::BTreeMap, net::IpAddr, time::SystemTime};

use dipam_proto::v1::GcItem;
use dipam_state::AttachmentKey;
use tracing::info;

use crate::{
    l1_leaves::clock::now,
    l1_leaves::error::ShimError,
    l2_core::core::Core,
    l2_core::delegate::{config::DelegateConf, import, store},
    l3_clients::gc::GcPolicy,
    l3_clients::liveness::{Scan, Verdict},
};

/// What one adoption found and did.
#[derive(Debug, Default)]
pub struct Report {
    /// Recorded now (outcome "adopted"), or would be (a dry run: "planned").
    pub adopted: Vec<GcItem>,
    /// Nothing on the node uses them (outcome "dead"): freeable by `dipamctl gc --use-ledger`.
    pub dead: Vec<GcItem>,
    /// No evidence, but the look was partial, or the reservation is too young (outcome
    /// "kept").
    pub unverified: Vec<GcItem>,
    /// Alive but not recorded, and why (outcome "skipped").
    pub skipped: Vec<GcItem>,
}

fn item(cid: &str, ifname: &str, ips: &[IpAddr], outcome: &str, reason: String) -> GcItem {
    GcItem {
        kind: "orphan".into(),
        container_id: cid.into(),
        ifname: ifname.into(),
        ips: ips.iter().map(ToString::to_string).collect(),
        reason,
        outcome: outcome.into(),
        error: String::new(),
        keep: Vec::new(),
    }
}

/// One unrecorded (container ID, ifname) of the store, its addresses and their verdicts.
struct Group {
    ips: Vec<IpAddr>,
    alive: Option<String>,
    unknown: Option<String>,
    young: bool,
}

/// Adopts, in the network of `dc`, every unrecorded reservation that `scan` shows in use.
pub async fn adopt(
    core: &Core,
    policy: &GcPolicy,
    dc: &DelegateConf,
    scan: &Scan,
    dry_run: bool,
) -> Result<Report, ShimError> {
    // A delegate whose store dipamd cannot read (azure-vnet-ipam keeps its own state file)
    // has nothing to adopt from, and nothing is at risk either: no GC or reconcile of dipamd
    // can see, so none can free, a reservation it never recorded there. Failing here made
    // `dipamctl install --wrap --in-place` of such a network exit 1 after a good rewrite.
    let Some(dir) = store::readable_dir(&dc.kind, &dc.conf, &dc.network) else {
        info!(
            network = %dc.network,
            delegate = %dc.kind,
            "nothing to adopt: the delegate's store is not one dipamd reads (its reservations \
             stay the delegate's own, and no GC of dipamd frees them)"
        );
        return Ok(Report::default());
    };
    let groups = unrecorded(core, policy, dc, &dir, scan).await?;
    let mut report = Report::default();
    let (probe_send, at) = (core.resolve(dc, "").await, now());
    for ((cid, ifname), g) in groups {
        let Some(why) = g.alive.clone() else {
            not_alive(&mut report, &cid, &ifname, g);
            continue;
        };
        let skip = |reason: String| item(&cid, &ifname, &g.ips, "skipped", reason);
        if ifname.is_empty() {
            report.skipped.push(skip(format!(
                "{why}; but a legacy id-only reservation names no interface, so no DEL could \
                 release it by its key: it stays the delegate's"
            )));
            continue;
        }
        if crate::l1_leaves::keys::internal(&cid) == Some(crate::l1_leaves::keys::Internal::Pool) {
            report.skipped.push(skip(format!(
                "{why}; but it is held under a warm-pool ID, which is never recorded for a pod"
            )));
            continue;
        }
        if dry_run {
            report
                .adopted
                .push(item(&cid, &ifname, &g.ips, "planned", why));
            continue;
        }
        let send = match &probe_send {
            Ok((_, send)) => send,
            Err(e) => {
                report.skipped.push(skip(format!("{why}; but {e}")));
                continue;
            }
        };
        let imp = Import {
            dc,
            send: *send,
            at,
        };
        record(core, &imp, &mut report, (&cid, &ifname), &g.ips, why).await?;
    }
    Ok(report)
}

/// The store's reservations the ledger does not know, by (container ID, ifname), with the
/// scan's verdict on their addresses.
async fn unrecorded(
    core: &Core,
    policy: &GcPolicy,
    dc: &DelegateConf,
    dir: &std::path::Path,
    scan: &Scan,
) -> Result<BTreeMap<(String, String), Group>, ShimError> {
    let held = store::read(dir.to_path_buf())
        .await
        .map_err(|e| ShimError::Internal(format!("reading {}: {e}", dir.display())))?;
    let net = dc.network.clone();
    let records = core.ledger(move |l| l.list(Some(&net))).await?;
    let known = store::Known::of(&records);
    let mut groups: BTreeMap<(String, String), Group> = BTreeMap::new();
    for r in &held {
        if known.accounts_for(r) {
            continue;
        }
        let g = groups
            .entry((r.container_id.clone(), r.ifname.clone()))
            .or_insert(Group {
                ips: Vec::new(),
                alive: None,
                unknown: None,
                young: false,
            });
        g.ips.push(r.ip);
        g.young |= r
            .modified
            .and_then(|m| SystemTime::now().duration_since(m).ok())
            .is_some_and(|age| age < policy.grace);
        match scan.verdict(r.ip, &r.container_id) {
            Verdict::Alive(why) => {
                g.alive.get_or_insert(why);
            }
            Verdict::Unknown(why) => {
                g.unknown.get_or_insert(why);
            }
            Verdict::Dead => {}
        }
    }
    Ok(groups)
}

/// A group no evidence shows in use: kept when unverified or young, else reported dead.
fn not_alive(report: &mut Report, cid: &str, ifname: &str, g: Group) {
    match (g.unknown, g.young) {
        (Some(partial), _) => report
            .unverified
            .push(item(cid, ifname, &g.ips, "kept", partial)),
        (None, true) => report.unverified.push(item(
            cid,
            ifname,
            &g.ips,
            "kept",
            "reserved inside the grace period (--gc-grace): an ADD may still be \
             recording it"
                .into(),
        )),
        (None, false) => report.dead.push(item(
            cid,
            ifname,
            &g.ips,
            "dead",
            "no network namespace holds it, no host route leads to it, and no \
             runtime lists its container"
                .into(),
        )),
    }
}

/// What every record of one adoption shares: the network's config, the version it is
/// rendered at for the delegate, and when the records are made.
struct Import<'a> {
    dc: &'a DelegateConf,
    send: Option<rscni_types::version::SpecVersion>,
    at: u64,
}

/// Records one group a running pod uses, under its key's lock, unless an ADD recorded it
/// meanwhile; what stands in the way is reported as skipped.
async fn record(
    core: &Core,
    imp: &Import<'_>,
    report: &mut Report,
    (cid, ifname): (&str, &str),
    ips: &[IpAddr],
    why: String,
) -> Result<(), ShimError> {
    let Import { dc, send, at } = *imp;
    let skip = |reason: String| item(cid, ifname, ips, "skipped", reason);
    let config = match dc.bytes_for(send).map(String::from_utf8) {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return Err(ShimError::Internal(e.to_string())),
        Err(e) => return Err(e),
    };
    let delegate = import::Delegate {
        dc,
        config,
        version: send.unwrap_or(dc.version).to_string(),
    };
    let key = AttachmentKey::new(&dc.network, cid, ifname);
    let Some(_guard) = core.locks.try_lock(&key) else {
        report.skipped.push(skip(format!(
            "{why}; an operation on {key} is in flight: the next reconcile looks again"
        )));
        return Ok(());
    };
    if core.lookup(&key)?.is_some() {
        // Recorded by an ADD since the store was read: it is dipamd's already.
        return Ok(());
    }
    let (rec, outside) = import::record(&delegate, cid, ifname, ips, import::ADOPTED, at);
    let Some(rec) = rec else {
        report.skipped.push(skip(format!(
            "{why}; but {} lie outside every range the network's config has",
            outside
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        )));
        return Ok(());
    };
    match core.import(&rec).await? {
        Some(holder) => report.skipped.push(skip(format!("{why}; but {holder}"))),
        None => {
            info!(key = %key, ips = ?ips, evidence = %why, "adopted a running pod's reservation");
            report.adopted.push(item(cid, ifname, ips, "adopted", why));
        }
    }
    Ok(())
}
