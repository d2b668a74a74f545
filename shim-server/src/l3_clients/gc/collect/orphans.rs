//! Orphans: reservations in the delegate's own store (host-local's directory) that no
//! ledger record knows. Planned (kept when listed, young, or not shown unused), then released
//! through the delegate's DEL, each under its own key's lock.

use super::*;

/// A reservation of the delegate's store as the GC holds it, its names shared with the plan's
/// ([`Names`]). At 10,000 pods the store's reservations, each with its own id, were 2.1 MB of
/// what a GC held at its peak (docs/performance.md, run 44).
pub(super) struct Reserved {
    pub ip: std::net::IpAddr,
    /// (container ID, ifname); the ifname empty for host-local's legacy id-only files.
    pub pair: Pair,
    pub modified: Option<SystemTime>,
}

impl Reserved {
    /// The store's reservations with an owner, each taken up as the store's reader meets it
    /// ([`store::fold_held`]): no `Vec` of the store's own form and two strings per address
    /// first, and by address, as the store's reader lists them.
    pub async fn read(dir: std::path::PathBuf) -> std::io::Result<(Names, Vec<Self>)> {
        let (names, mut out) =
            store::fold_held(dir, (Names::default(), Vec::new()), Self::add).await?;
        out.sort_unstable_by_key(|r| r.ip);
        out.shrink_to_fit();
        Ok((names, out))
    }

    fn add((names, out): &mut (Names, Vec<Self>), r: store::Held<'_>) {
        out.push(Self {
            ip: r.ip,
            pair: names.pair(r.container_id, r.ifname),
            modified: r.modified,
        });
    }
}

/// Orphans: reservations in the delegate's own store, unknown to the ledger and to the valid
/// set. Kept when listed, young, or not shown unused; the rest are planned for release
/// (their items appended after the stale records') and returned.
pub(super) async fn plan_orphans(
    c: &Collector,
    dc: &DelegateConf,
    seen: &Seen,
    reservations: Option<Vec<Reserved>>,
    planned: &mut Planned,
) -> Vec<Reserved> {
    let (Some(dir), Some(reservations)) = (&seen.dir, reservations) else {
        return Vec::new();
    };
    let candidates = unrecorded(c, dc, reservations, planned);
    // An unrecorded reservation is freed only when nothing on the node uses its address
    // (liveness.rs): a running pod dipamd never saw (a node adopted with pods running)
    // lost its address to the next pod when this freed it.
    let scan = match candidates.is_empty() {
        true => crate::l3_clients::liveness::Scan::default(),
        false => c.gc.scan().await,
    };
    let mut orphans = Vec::new();
    for r in candidates {
        let kept_why = match scan.verdict(r.ip, &r.pair.0) {
            Verdict::Dead => None,
            Verdict::Alive(why) => Some(("alive", format!("{why}: adopt it, never free it"))),
            Verdict::Unknown(why) => Some(("unverified", format!("not shown unused: {why}"))),
        };
        if let Some(why) = kept_why {
            planned.kept.push(kept(
                "orphan",
                &r.pair.0,
                &r.pair.1,
                vec![r.ip.to_string()],
                vec![why],
            ));
            continue;
        }
        planned.items.push(item(
            "orphan",
            &r.pair.0,
            &r.pair.1,
            vec![r.ip.to_string()],
            format!(
                "held by {} in {} but unknown to dipamd and not in the valid list; nothing \
                 on the node uses it",
                dc.kind,
                dir.display()
            ),
        ));
        orphans.push(r);
    }
    orphans
}

/// The reservations no ledger record stands for and that are neither listed nor young: the
/// candidates for release. The listed and the young are kept, and said so in `planned`.
fn unrecorded(
    c: &Collector,
    dc: &DelegateConf,
    reservations: Vec<Reserved>,
    planned: &mut Planned,
) -> Vec<Reserved> {
    let grace = c.gc.policy.grace.as_secs();
    let (listed_set, also_kept, known) = (&planned.listed, &planned.also_kept, &planned.known);
    // Legacy id-only files (empty ifname) match by container ID: the sets' ids, made only
    // when the store has such a file (at 10,000 pods each was a table of 10,000 ids).
    let (known_ids, keep_ids): (HashSet<&str>, HashSet<&str>) =
        match reservations.iter().any(|r| r.pair.1.is_empty()) {
            true => (
                known.iter().map(|(c, _)| &**c).collect(),
                listed_set
                    .iter()
                    .chain(also_kept)
                    .map(|(c, _)| &**c)
                    .collect(),
            ),
            false => Default::default(),
        };
    let mut candidates = Vec::new();
    for r in reservations {
        let (recorded, listed) = if r.pair.1.is_empty() {
            (
                known_ids.contains(&*r.pair.0),
                keep_ids.contains(&*r.pair.0),
            )
        } else {
            (
                known.contains(&r.pair),
                listed_set.contains(&r.pair) || also_kept.contains(&r.pair),
            )
        };
        if recorded {
            // The ledger's record stands for it (kept or collected above).
            continue;
        }
        let age = r
            .modified
            .and_then(|m| SystemTime::now().duration_since(m).ok());
        let young = age.is_some_and(|d| d < c.gc.policy.grace);
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
            planned.kept.push(kept(
                "orphan",
                &r.pair.0,
                &r.pair.1,
                vec![r.ip.to_string()],
                why,
            ));
            continue;
        }
        candidates.push(r);
    }
    candidates
}

/// The orphans' DELs, `parallel` at a time (fewer while a pod's operation is in flight), with
/// the network's config stripped of any valid list; one outcome per orphan, in order.
pub(super) async fn release_orphans(
    c: &Collector,
    d: &Delegate<'_>,
    orphans: &[Reserved],
    parallel: usize,
) -> Vec<Released> {
    let network = &d.dc.network;
    let mut conf = d.dc.conf.clone();
    if let Some(o) = conf.as_object_mut() {
        o.remove("cni.dev/valid-attachments");
        o.remove("cni.dev/attachments");
    }
    let stripped = DelegateConf {
        conf,
        ..d.dc.clone()
    };
    match stripped.bytes_for(d.send) {
        _ if orphans.is_empty() => Vec::new(),
        Ok(stdin) => {
            let mut outcomes: Vec<Option<Released>> = orphans.iter().map(|_| None).collect();
            let mut next = orphans.iter().enumerate();
            let mut running = FuturesUnordered::new();
            loop {
                while running.len() < limit(c, network, parallel)
                    && let Some((i, r)) = next.next()
                {
                    let (probe, kind, stdin) = (d.probe, &d.dc.kind, &stdin);
                    running.push(async move {
                        let outcome =
                            release_orphan(c, network, r, probe, d.cni_path, kind, stdin).await;
                        (i, outcome)
                    });
                }
                match running.next().await {
                    Some((i, outcome)) => outcomes[i] = Some(outcome),
                    None => break,
                }
            }
            outcomes
                .into_iter()
                .map(|o| o.unwrap_or(Released::Busy(IN_FLIGHT, "not reached")))
                .collect()
        }
        Err(e) => {
            let e = e.to_string();
            orphans
                .iter()
                .map(|_| Released::Failed(ShimError::Internal(e.clone())))
                .collect()
        }
    }
}

/// Releases a reservation the delegate holds behind dipamd's back, under its own key's lock
/// (busy: kept) and only if the ledger still does not know that key.
async fn release_orphan(
    c: &Collector,
    network: &str,
    r: &Reserved,
    probe: &crate::l2_core::delegate::Probe,
    cni_path: &str,
    kind: &str,
    stdin: &[u8],
) -> Released {
    // host-local releases `<id>\r\n<ifname>`, and falls back to legacy id-only files when
    // nothing matches: any valid ifname reaches those.
    let ifname = if r.pair.1.is_empty() {
        "eth0".to_owned()
    } else {
        r.pair.1.to_string()
    };
    let key = AttachmentKey::new(network, &*r.pair.0, &ifname);
    let Some(_guard) = c.core.locks.try_lock(&key) else {
        return Released::Busy(IN_FLIGHT, "an operation on its key started after the plan");
    };
    match c.core.lookup(&key) {
        Ok(None) => {}
        Ok(Some(_)) => {
            return Released::Busy(IN_FLIGHT, "recorded by an ADD that started after the plan");
        }
        Err(e) => return Released::Failed(e),
    }
    let _releasing = c.core.addrs.releasing_ips(&key, vec![r.ip]);
    let inv = Invocation {
        command: "DEL".into(),
        container_id: r.pair.0.to_string(),
        ifname,
        path: c.core.exec.delegate_cni_path(cni_path),
        stdin: stdin.to_vec(),
        ..Invocation::default()
    };
    match c.core.exec.call(kind, probe, &inv).await {
        Ok(_) => Released::Freed,
        Err(e) => Released::Failed(e),
    }
}
