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

use std::{
    collections::{BTreeMap, HashSet},
    net::IpAddr,
    time::SystemTime,
};

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
    let known = known(core, &dc.network, &held).await?;
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

/// What the network's records account for of the store's reservations `held`, read in one
/// streamed pass that decodes one record at a time (`Ledger::for_each`) and keeps only the
/// delegate's key of a record whose container ID the store holds: nothing else decides an
/// adoption. Each reconcile round once held every record of the network decoded (configs,
/// CNI_ARGS, result: 1–2 KiB each) while live reservations existed.
async fn known(
    core: &Core,
    network: &str,
    held: &[store::Reservation],
) -> Result<store::Known, ShimError> {
    let ids: HashSet<String> = held.iter().map(|r| r.container_id.clone()).collect();
    let net = network.to_owned();
    let pairs = core
        .ledger(move |l| {
            let mut pairs: HashSet<(String, String)> = HashSet::new();
            l.for_each(Some(&net), |r, _| {
                let (cid, ifname) = r.delegate_ids();
                if ids.contains(cid) {
                    pairs.insert((cid.to_owned(), ifname.to_owned()));
                }
                Ok(())
            })?;
            Ok(pairs)
        })
        .await?;
    Ok(store::Known::of_pairs(pairs))
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

#[cfg(test)]
mod tests {
    //! Adoption on a dense node: real sled on disk, 3,000 records shaped as a runtime's pods
    //! leave them, host-local's real directory layout with one file per pod.

    use dipam_state::DelegateKey;

    use super::*;
    use crate::testing::{
        dense::{self, NET},
        held,
    };

    const N: usize = 3_000;

    /// It finds exactly the reservations no record accounts for (a pod served from the warm
    /// pool and a legacy id-only file are accounted for), judges each, and holds a fraction
    /// of what the network's records take decoded: it once held them all.
    #[test]
    fn adoption_on_a_dense_node_finds_the_unrecorded_and_holds_no_record() {
        let _one = held::one_at_a_time();
        let rt = held::runtime();
        let (dir, data, mut records) = dense::unsaved(N);
        // A pod served from the warm pool: the store names the pool entry's ID.
        let pool_id = "dipam-pool-n1-5";
        records[5].delegate_key = Some(DelegateKey {
            container_id: pool_id.into(),
            ifname: "eth0".into(),
            netns: String::new(),
            cni_args: String::new(),
        });
        let d = dense::node(&records, dir);
        for i in 0..N {
            let owner = match i {
                5 => format!("{pool_id}\r\neth0"),
                // host-local's legacy file: the container ID alone.
                6 => dense::cid(i),
                _ => format!("{}\r\neth0", dense::cid(i)),
            };
            d.reserve(dense::ip(i), &owner);
        }
        drop(records);
        let (alive, dead, pooled) = ("10.60.200.1", "10.60.200.2", "10.60.200.3");
        d.reserve(alive.parse().unwrap(), "a1\r\neth0");
        d.reserve(dead.parse().unwrap(), "d1\r\neth0");
        d.reserve(pooled.parse().unwrap(), "dipam-pool-n1-99\r\neth0");
        let scan = crate::l3_clients::liveness::fixed(
            &[(alive, "netns cni-a1"), (pooled, "netns cni-p")],
            &[],
        );
        let dc = DelegateConf {
            kind: "host-local".into(),
            network: NET.into(),
            version: rscni_types::version::SpecVersion::CURRENT,
            conf: dense::config(&data),
        };
        let node = d.node.clone();
        let whole = d.whole(&rt);
        let (report, peak) =
            held::measure(&rt, adopt(&node.core, &node.gc.policy, &dc, &scan, true));
        let report = report.expect("adoption runs");
        let names = |items: &[GcItem]| -> Vec<(String, String, Vec<String>)> {
            items
                .iter()
                .map(|i| (i.container_id.clone(), i.outcome.clone(), i.ips.clone()))
                .collect()
        };
        let one = |cid: &str, outcome: &str, ip: &str| {
            vec![(cid.into(), outcome.into(), vec![ip.into()])]
        };
        assert_eq!(names(&report.adopted), one("a1", "planned", alive));
        assert_eq!(names(&report.dead), one("d1", "dead", dead));
        assert_eq!(
            names(&report.skipped),
            one("dipam-pool-n1-99", "skipped", pooled)
        );
        assert!(report.unverified.is_empty(), "{:?}", report.unverified);
        eprintln!("whole network decoded: {whole} B; adoption's peak: {peak} B");
        assert!(
            peak * 4 < whole,
            "adoption held {peak} B at its peak, the network's records take {whole} B decoded"
        );
    }
}
