//! The plan over the ledger, made in one pass over the network's records that decodes one at
//! a time (docs/cfp.md §7.4): each record's reasons are decided as it is read, and the plan
//! holds what it frees (the stale records, whole) and, of what it keeps, only the names its
//! lists need and the compact line `dipamctl gc --dry-run` reports. A GC of 250 stale
//! attachments on a node of 10,000 held every decoded record (config, result) at once
//! (docs/performance.md, run 32).

use std::sync::Arc;

use super::*;
use crate::l2_core::delegate::store::HeldAs;

/// A (container ID, ifname) as the plan holds it: each name one copy shared by every set and
/// entry of the plan that names it ([`Names`]).
pub(super) type Pair = (Arc<str>, Arc<str>);

/// The plan over the ledger: what is kept and why, and what is stale.
pub(super) struct Planned {
    /// The valid set: the runtime's list, or every record (`--use-ledger`).
    pub listed: HashSet<Pair>,
    /// What the delegate is told to keep beside the valid set: every kept record that is not
    /// in it, and the delegate's key of each kept record where that differs (a pod served from
    /// the warm pool). At 10,000 pods nearly every kept record is listed: a set of the valid
    /// set and these together was a third set of ~10,000 pairs (docs/performance.md, run 44).
    pub also_kept: HashSet<Pair>,
    /// The delegate's key of every record of the network (kept or stale), when its store is
    /// read (orphans.rs): a reservation one of them stands for is no orphan.
    pub known: HashSet<Pair>,
    /// The network's pods' committed records, for the share interlock.
    pub pods: usize,
    pub stale: Vec<AttachmentRecord>,
    /// One per stale record, in `stale`'s order, then one per orphan.
    pub items: Vec<GcItem>,
    pub kept: Vec<GcItem>,
}

/// One copy of each name a GC meets: the delegate's store's (orphans.rs), the valid list's,
/// then each record's, so a listed record's id, its reservation's, its entry's and the sets'
/// are one allocation, and every "eth0" is one. At 10,000 pods each set, and each
/// reservation, held its own copy of every id (docs/performance.md, run 44).
#[derive(Default)]
pub(super) struct Names(HashSet<Arc<str>>);

impl Names {
    fn name(&mut self, s: &str) -> Arc<str> {
        if let Some(n) = self.0.get(s) {
            return Arc::clone(n);
        }
        let n: Arc<str> = Arc::from(s);
        self.0.insert(Arc::clone(&n));
        n
    }

    pub(super) fn pair(&mut self, container_id: &str, ifname: &str) -> Pair {
        (self.name(container_id), self.name(ifname))
    }
}

/// A record as the pass keeps it: a stale candidate whole (it is freed unless an operation
/// holds it or its ADD finished after the GC began), any other as the little the plan needs.
/// (A candidate is boxed: a record is several times a compact entry's size, and every entry
/// of the pass is as large as its largest kind.)
enum Entry {
    Candidate(Box<AttachmentRecord>, Pair),
    Kept(Compact),
}

/// What the plan holds of a record it keeps.
struct Compact {
    /// The record's (container ID, ifname).
    pair: Pair,
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

/// What the pass over the ledger returns, and the sets it fills as it reads.
struct Pass {
    names: Names,
    /// The records whose reasons are decided after the read: every stale candidate, and
    /// every kept record when the plan lists them (`list_kept`).
    entries: Vec<Entry>,
    listed: HashSet<Pair>,
    also_kept: HashSet<Pair>,
    known: HashSet<Pair>,
    /// Whether `known` is made: the delegate's store is read.
    want_known: bool,
    pods: usize,
}

impl Pass {
    /// Notes the delegate's key of a record, kept or stale (see [`Planned::known`]).
    fn know(&mut self, k: &Compact) {
        if !self.want_known {
            return;
        }
        let held = match k.delegate.differs() {
            Some((c, i)) => self.names.pair(c, i),
            None => k.pair.clone(),
        };
        self.known.insert(held);
    }

    /// Keeps `k` under its own name and, for a pod served from the warm pool, the name its
    /// delegate holds it by (those not in the valid set, [`Planned::also_kept`]).
    fn keep(&mut self, k: &Compact) {
        let held = k.delegate.differs().map(|(c, i)| self.names.pair(c, i));
        for pair in std::iter::once(k.pair.clone()).chain(held) {
            if !self.listed.contains(&pair) {
                self.also_kept.insert(pair);
            }
        }
    }
}

/// Reads the network's records one at a time and plans over them, their names and the valid
/// list's taken up into `names`. `busy` (the keys with an operation in flight) is taken after
/// the read, as it always was: an operation that started while the ledger was read keeps its
/// record.
pub(super) async fn plan(
    c: &Collector,
    network: &str,
    mut names: Names,
    valid: Valid,
    began: GcStart,
    known: bool,
    list_kept: bool,
) -> Result<Planned, ShimError> {
    let grace = c.gc.policy.grace.as_secs();
    let from_ledger = matches!(valid, Valid::Ledger);
    // The request's list goes pair by pair as its names are taken up.
    let listed: HashSet<Pair> = match valid {
        Valid::List(l) => l.into_iter().map(|(c, i)| names.pair(&c, &i)).collect(),
        Valid::Ledger => HashSet::new(),
    };
    let net = network.to_owned();
    let t = now();
    let pass = c
        .core
        .ledger(move |l| {
            let mut pass = Pass {
                names,
                entries: Vec::new(),
                listed,
                also_kept: HashSet::new(),
                known: HashSet::new(),
                want_known: known,
                pods: 0,
            };
            l.for_each(Some(&net), |r, _| {
                let pair = pass.names.pair(&r.key.container_id, &r.key.ifname);
                if from_ledger {
                    pass.listed.insert(pair.clone());
                }
                if r.owner == Owner::Pod && r.state == AttachmentState::Committed {
                    pass.pods += 1;
                }
                let listed = pass.listed.contains(&pair);
                match sort(r, pair, listed, grace, t, list_kept) {
                    // No line for it: its names are all the plan holds of it. A CNI GC's
                    // reply and the passes' reports carry no line per kept record, and at
                    // 10,000 attachments a line with its reasons for each of the runtime's
                    // pods was megabytes per GC (docs/performance.md, run 39).
                    Entry::Kept(k) if !list_kept => {
                        pass.know(&k);
                        pass.keep(&k);
                    }
                    e => pass.entries.push(e),
                }
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
    Ok(judge.decide(pass, t))
}

/// A record's reasons that its own fields give (listed, owner, state, grace): none, a stale
/// candidate, kept whole; else what its kept line needs (its addresses only if the plan
/// lists what it keeps, `with_ips`).
fn sort(
    r: AttachmentRecord,
    pair: Pair,
    listed: bool,
    grace: u64,
    t: u64,
    with_ips: bool,
) -> Entry {
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
        return Entry::Candidate(Box::new(r), pair);
    }
    let ips = match (with_ips, &r.result) {
        (true, Some(result)) => result_ips(result),
        _ => Vec::new(),
    };
    Entry::Kept(Compact {
        pair,
        delegate: HeldAs::of(&r),
        ips,
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
        let key = AttachmentKey::new(self.network, &*k.pair.0, &*k.pair.1);
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
    /// operation holds, or whose ADD finished after the GC began, is kept after all, with a
    /// line (the runtime-aware pass reports them). Every other kept record has a line only
    /// when the pass kept its entry (`list_kept`, as `dipamctl gc` prints them).
    fn decide(&self, mut pass: Pass, t: u64) -> Planned {
        let mut kept_items = Vec::new();
        let mut stale: Vec<AttachmentRecord> = Vec::new();
        for e in std::mem::take(&mut pass.entries) {
            let (k, why) = match e {
                Entry::Candidate(r, pair) => {
                    let k = Compact {
                        pair,
                        delegate: HeldAs::of(&r),
                        ips: Vec::new(),
                        listed: false,
                        other: Vec::new(),
                        committed: true,
                        old: t.saturating_sub(r.created_at),
                    };
                    pass.know(&k);
                    let why = self.reasons(&k);
                    if why.is_empty() {
                        stale.push(*r);
                        continue;
                    }
                    let ips = r.result.as_ref().map(result_ips).unwrap_or_default();
                    (Compact { ips, ..k }, why)
                }
                Entry::Kept(k) => {
                    pass.know(&k);
                    let why = self.reasons(&k);
                    (k, why)
                }
            };
            pass.keep(&k);
            kept_items.push(kept("ledger", &k.pair.0, &k.pair.1, k.ips, why));
        }
        let items = stale.iter().map(|r| stale_item(r, t)).collect();
        Planned {
            listed: pass.listed,
            also_kept: pass.also_kept,
            known: pass.known,
            pods: pass.pods,
            stale,
            items,
            kept: kept_items,
        }
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
