//! The plan over the ledger, made in one pass over the network's records that decodes one at
//! a time (docs/cfp.md §7.4): each record's reasons are decided as it is read, and the plan
//! holds what it frees (the stale records, whole) and, of what it keeps, only the names its
//! lists need and the compact line `dipamctl gc --dry-run` reports. A GC of 250 stale
//! attachments on a node of 10,000 held every decoded record (config, result) at once
//! (docs/performance.md, run 32).

use super::*;
use crate::l2_core::delegate::store::HeldAs;

/// The plan over the ledger: what is kept and why, and what is stale.
pub(super) struct Planned {
    /// The valid set: the runtime's list, or every record (`--use-ledger`).
    pub listed: HashSet<(String, String)>,
    /// What the delegate is told to keep, and its store compared with: the valid set, every
    /// kept record, and the delegate's key of each (a pod served from the warm pool).
    pub delegate_keep: HashSet<(String, String)>,
    /// The delegate's key of every record of the network (kept or stale), when its store is
    /// read (orphans.rs): a reservation one of them stands for is no orphan.
    pub known: HashSet<(String, String)>,
    /// The network's pods' committed records, for the share interlock.
    pub pods: usize,
    pub stale: Vec<AttachmentRecord>,
    /// One per stale record, in `stale`'s order, then one per orphan.
    pub items: Vec<GcItem>,
    pub kept: Vec<GcItem>,
}

/// A record as the pass keeps it: a stale candidate whole (it is freed unless an operation
/// holds it or its ADD finished after the GC began), any other as the little the plan needs.
/// (A candidate is boxed: a record is several times a compact entry's size, and every entry
/// of the pass is as large as its largest kind.)
enum Entry {
    Candidate(Box<AttachmentRecord>),
    Kept(Compact),
}

/// What the plan holds of a record it keeps.
struct Compact {
    container_id: String,
    ifname: String,
    /// The delegate's key, where it is not the record's (a pod served from the warm pool).
    delegate: HeldAs,
    ips: Vec<String>,
    listed: bool,
    /// The owner's reason and an interrupted operation's, in that order (none for a pod's
    /// committed record, the common case: no allocation).
    other: Vec<(&'static str, String)>,
    committed: bool,
    /// Seconds since it was added.
    old: u64,
}

impl Compact {
    fn pair(&self) -> (String, String) {
        (self.container_id.clone(), self.ifname.clone())
    }

    /// What the delegate's store names it by.
    fn held_as(&self) -> (String, String) {
        let (c, i) = self.delegate.ids(&self.container_id, &self.ifname);
        (c.to_owned(), i.to_owned())
    }
}

/// What the pass over the ledger returns.
struct Pass {
    entries: Vec<Entry>,
    listed: HashSet<(String, String)>,
    pods: usize,
}

/// Reads the network's records one at a time and plans over them. `busy` (the keys with an
/// operation in flight) is taken after the read, as it always was: an operation that started
/// while the ledger was read keeps its record.
pub(super) async fn plan(
    c: &Collector,
    network: &str,
    valid: Valid,
    began: GcStart,
    known: bool,
    list_kept: bool,
) -> Result<Planned, ShimError> {
    let grace = c.gc.policy.grace.as_secs();
    let from_ledger = matches!(valid, Valid::Ledger);
    let listed: HashSet<(String, String)> = match valid {
        Valid::List(l) => l.into_iter().collect(),
        Valid::Ledger => HashSet::new(),
    };
    let net = network.to_owned();
    let t = now();
    let pass = c
        .core
        .ledger(move |l| {
            let mut pass = Pass {
                entries: Vec::new(),
                listed,
                pods: 0,
            };
            l.for_each(Some(&net), |r, _| {
                let pair = (r.key.container_id.clone(), r.key.ifname.clone());
                if from_ledger {
                    pass.listed.insert(pair.clone());
                }
                if r.owner == Owner::Pod && r.state == AttachmentState::Committed {
                    pass.pods += 1;
                }
                let listed = pass.listed.contains(&pair);
                pass.entries.push(sort(r, listed, grace, t));
                Ok(())
            })?;
            Ok(pass)
        })
        .await?;
    // Keys with an operation in flight (held or awaited): kept, like `adding`/`deleting`.
    let busy: HashSet<AttachmentKey> = c
        .core
        .locks
        .in_flight()
        .into_iter()
        .filter(|k| k.network == network)
        .collect();
    let judge = Judge {
        c,
        network,
        busy: &busy,
        from_ledger,
        began,
    };
    Ok(judge.decide(pass, t, known, list_kept))
}

/// A record's reasons that its own fields give (listed, owner, state, grace): none, a stale
/// candidate, kept whole; else what its kept line needs.
fn sort(r: AttachmentRecord, listed: bool, grace: u64, t: u64) -> Entry {
    let old = t.saturating_sub(r.created_at);
    let mut other: Vec<(&'static str, String)> = Vec::new();
    match &r.owner {
        Owner::Agent { role } => other.push(("agent", format!("the agent's {role} address"))),
        Owner::Pool => other.push(("pool", "a warm-pool entry".into())),
        Owner::Pod => {}
    }
    let committed = r.state == AttachmentState::Committed;
    if !committed {
        other.push(interrupted(&r));
    }
    if !listed && other.is_empty() && old >= grace {
        return Entry::Candidate(Box::new(r));
    }
    let delegate = HeldAs::of(&r);
    Entry::Kept(Compact {
        ips: r.result.as_ref().map(result_ips).unwrap_or_default(),
        container_id: r.key.container_id,
        ifname: r.key.ifname,
        delegate,
        listed,
        other,
        committed,
        old,
    })
}

/// What a record's remaining reasons are judged by, after the read: the keys in flight, the
/// valid set's kind, and when the GC began.
struct Judge<'a> {
    c: &'a Collector,
    network: &'a str,
    busy: &'a HashSet<AttachmentKey>,
    from_ledger: bool,
    began: GcStart,
}

impl Judge<'_> {
    /// Every reason a record is kept, as (code, text) for `dipamctl gc --dry-run`, in the
    /// order the plan always gave them: listed, owner, interrupted or in flight, born after
    /// the GC began, grace. None: stale.
    fn reasons(&self, k: &Compact) -> Vec<(&'static str, String)> {
        let grace = self.c.gc.policy.grace.as_secs();
        let key = AttachmentKey::new(self.network, k.container_id.as_str(), k.ifname.as_str());
        let mut why: Vec<(&'static str, String)> = Vec::new();
        if k.listed {
            why.push((
                "valid-list",
                match self.from_ledger {
                    false => "in the valid list".into(),
                    true => "in the ledger (--use-ledger)".into(),
                },
            ));
        }
        why.extend(k.other.iter().cloned());
        if k.committed && self.busy.contains(&key) {
            why.push((
                "in-flight",
                "an operation on it is in flight (its key is locked)".into(),
            ));
        }
        if let Some(text) = born_after(self.c, &key, self.began) {
            why.push((BORN_AFTER_GC, text.into()));
        }
        if k.old < grace {
            why.push((
                "grace",
                format!(
                    "added {} ago, inside the grace period (--gc-grace {grace}s)",
                    age(k.old)
                ),
            ));
        }
        why
    }

    /// Turns the pass's entries into the plan, in the ledger's order: a candidate an
    /// operation holds, or whose ADD finished after the GC began, is kept after all.
    /// `list_kept`: a line (with its reasons) for every kept record, as `dipamctl gc` prints;
    /// otherwise only for the candidates kept after all, which the runtime-aware pass reports.
    fn decide(&self, pass: Pass, t: u64, want_known: bool, list_kept: bool) -> Planned {
        let Pass {
            entries,
            listed,
            pods,
        } = pass;
        let mut keep: HashSet<(String, String)> = HashSet::new();
        let mut known: HashSet<(String, String)> = HashSet::new();
        let mut kept_items = Vec::new();
        let mut stale: Vec<AttachmentRecord> = Vec::new();
        for e in entries {
            let (k, why) = match e {
                Entry::Candidate(r) => {
                    let k = Compact {
                        ips: Vec::new(),
                        container_id: r.key.container_id.clone(),
                        ifname: r.key.ifname.clone(),
                        delegate: HeldAs::of(&r),
                        listed: false,
                        other: Vec::new(),
                        committed: true,
                        old: t.saturating_sub(r.created_at),
                    };
                    if want_known {
                        known.insert(k.held_as());
                    }
                    let why = self.reasons(&k);
                    if why.is_empty() {
                        stale.push(*r);
                        continue;
                    }
                    let ips = r.result.as_ref().map(result_ips).unwrap_or_default();
                    (Compact { ips, ..k }, why)
                }
                Entry::Kept(k) => {
                    if want_known {
                        known.insert(k.held_as());
                    }
                    if !list_kept {
                        // No line: a CNI GC's reply and the passes' reports carry none, and
                        // at 10,000 attachments a line with its reasons for each of the
                        // runtime's pods was megabytes per GC (docs/performance.md, run 39).
                        keep_names(&mut keep, &k);
                        continue;
                    }
                    let why = self.reasons(&k);
                    (k, why)
                }
            };
            keep_names(&mut keep, &k);
            kept_items.push(kept("ledger", &k.container_id, &k.ifname, k.ips, why));
        }
        let mut delegate_keep = keep;
        delegate_keep.extend(listed.iter().cloned());
        let items = stale.iter().map(|r| stale_item(r, t)).collect();
        Planned {
            listed,
            delegate_keep,
            known,
            pods,
            stale,
            items,
            kept: kept_items,
        }
    }
}

/// Keeps `k` under its own name and, for a pod served from the warm pool, the name its
/// delegate holds it by.
fn keep_names(keep: &mut HashSet<(String, String)>, k: &Compact) {
    keep.insert(k.pair());
    if let Some(d) = k.delegate.differs() {
        keep.insert(d.clone());
    }
}

/// The plan's line for a stale record.
fn stale_item(r: &AttachmentRecord, t: u64) -> GcItem {
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
}
