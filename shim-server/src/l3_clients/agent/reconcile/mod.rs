//! The agent reconcile pass: make the ledger and the delegate hold exactly the agent addresses
//! that are enabled, and nothing else.
//!
//! For each enabled (role, family):
//! - with a committed record: CHECK it with the delegate (where its version has CHECK) and keep
//!   it; if the delegate lost it (store wiped behind dipamd's back), release and ADD again,
//!   asking for the same address, and report it;
//! - without a record: DEL first (a previous life may have left a reservation under the same
//!   key), then ADD, asking for the address this slot last held where the delegate supports
//!   requested IPs (host-local: CNI_ARGS `IP=`; azure-vnet-ipam: `ipam.ipAddress`).
//!
//! Every agent record that is not enabled (a role turned off, a family dropped, the network
//! renamed) is released, and retried on every pass until the delegate agrees: this closes the
//! "feature turned off leaks its address" gap of the delegated-IPAM CFP.
//!
//! ADDs go through the same intent-before-exec path as pods
//! ([`crate::l2_core::core::attach::attach`]), so a crash at any point leaves a record that start-up
//! replay or the next pass resolves.
//!
//! The enabled slots are the roles' (predefined claims) and the agent's claims (claims.rs).
//! A claim or unclaim from the Agent service reconciles its one slot at once ([`claim`],
//! [`unclaim`]) rather than waiting for the loop; the loop's pass covers every slot.
//!
//! Every list published carries a generation kept in the ledger (`agent/generation`, written
//! before the list is sent), so it increases across restarts as well, and the changed marks
//! (`agent/changed/<container ID>`) that stay until a client reads the claim again.

use std::{collections::BTreeSet, net::IpAddr, sync::Arc, time::Duration};

use dipam_proto::v1::{AgentAddress, AgentListReply, CniRequest};
use dipam_state::{AttachmentKey, AttachmentRecord, AttachmentState, Owner};
use serde_json::Value;
use tracing::{info, warn};

use super::{
    Agent, AgentConfig, Family, ROLES, Slot,
    claims::{self, CLAIM_SETTING, Claim, ClaimSpec},
    conflist::Base,
};
use crate::{
    l1_leaves::error::ShimError,
    l2_core::core::{Core, Prepared},
    l2_core::delegate::{config::result_addrs, version},
    l3_clients::spool::SpoolState,
};

mod claim;
mod request;

pub use claim::{Outcome, claim, unclaim};
use request::{prepare, refuse_unsupported_request, request_ip};

const ROLE_SETTING: &str = "agent/role/";
const FLAGS_SETTING: &str = "agent/flags";
const LAST_IP_SETTING: &str = "agent/last-ip/";
const GENERATION_SETTING: &str = "agent/generation";
const CHANGED_SETTING: &str = "agent/changed/";

/// What the agent's work reaches: the core, the agent's own state, and the spool's (which
/// learns every config dipamd prepares: a `spoolDir` other than dipamd's is reported).
#[derive(Clone)]
pub struct Reconciler {
    pub core: Arc<Core>,
    pub agent: Arc<Agent>,
    pub spool: Arc<SpoolState>,
}

impl Reconciler {
    /// [`Core::prepare`], and the spool learns the network's config (as `Node::prepare`).
    fn prepare(
        &self,
        req: CniRequest,
        attachment: bool,
        caller: crate::l1_leaves::access::Caller,
    ) -> Result<Prepared, ShimError> {
        let p = self.core.prepare(req, attachment, caller)?;
        self.spool
            .note_config(&p.req.stdin, &p.dc.network, &self.core.identity.spool_dir);
        Ok(p)
    }
}

/// At start: the generation and changed marks the last dipamd left; and if the configured
/// roles changed since the last start, the operator's new configuration wins over roles the
/// agent allocated or released at runtime.
pub async fn init(r: &Reconciler) -> Result<(), ShimError> {
    let (generation, changed) = r
        .core
        .ledger(|l| {
            let g = l
                .setting(GENERATION_SETTING)?
                .and_then(|g| g.parse::<u64>().ok())
                .unwrap_or(0);
            let changed = l
                .settings(CHANGED_SETTING)?
                .into_iter()
                .map(|(k, v)| (k.trim_start_matches(CHANGED_SETTING).to_owned(), v))
                .collect::<std::collections::HashMap<_, _>>();
            Ok((g, changed))
        })
        .await?;
    r.agent.resume(generation, changed);
    let Some(cfg) = r.agent.config.clone() else {
        return keep_unmanaged(r).await;
    };
    let flags = cfg.roles.iter().cloned().collect::<Vec<_>>().join(",");
    r.core
        .ledger(move |l| {
            if l.setting(FLAGS_SETTING)?.as_deref() != Some(flags.as_str()) {
                for (name, _) in l.settings(ROLE_SETTING)? {
                    l.set_setting(&name, None)?;
                }
                l.set_setting(FLAGS_SETTING, Some(&flags))?;
            }
            Ok(())
        })
        .await?;
    let records = agent_records(r).await?;
    r.agent.reindex(&records);
    Ok(())
}

/// The agent's records, from the census (census.rs): a pass runs at start and every few
/// seconds, and once read (and held) every record of the ledger to find the agent's few.
pub(super) async fn agent_records(r: &Reconciler) -> Result<Vec<AttachmentRecord>, ShimError> {
    r.core
        .ledger(|l| l.select(|e| e.holder == dipam_state::Holder::Agent))
        .await
}

/// Why an agent record stays while dipamd runs without agent management.
pub const KEPT_UNMANAGED: &str = "kept: agent management is off (dipamd has no --conflist), and \
     dipamd cannot tell a feature turned off from a flag lost in a restart, so it releases \
     nothing; the address is never handed to a pod. To release it, start dipamd with --conflist \
     for this network and --agent-roles without this role";

/// Agent management is off (no --conflist), yet the ledger may hold agent records from when
/// it was on. They were once kept silently forever, listed nowhere. Releasing them here would
/// take the agent's addresses away after a restart that merely lost a flag, so they are kept,
/// indexed (no pod gets one) and listed by `dipamctl agent list`, status and doctor with the
/// reason and what releases them.
async fn keep_unmanaged(r: &Reconciler) -> Result<(), ShimError> {
    let records = agent_records(r).await?;
    r.agent.reindex(&records);
    let specs = claim_specs(r).await?;
    let kept: Vec<AgentAddress> = records
        .iter()
        .filter_map(|r| {
            let Owner::Agent { role } = &r.owner else {
                return None;
            };
            let addrs = r.result.as_ref().map(result_addrs).unwrap_or_default();
            let family = addrs.first().map_or(Family::V4, |ip| {
                if ip.is_ipv6() { Family::V6 } else { Family::V4 }
            });
            let claim = role.strip_prefix("claim:");
            let spec = claim.and_then(|n| specs.get(n));
            let slot = Slot {
                role: role.clone(),
                name: claim.map_or_else(|| format!("{role}-{}", family.as_str()), str::to_owned),
                family,
                container_id: r.key.container_id.clone(),
                ifname: r.key.ifname.clone(),
                netns: r.netns.clone(),
                args: r.cni_args.clone(),
                requested: spec.and_then(|s| s.ip),
                labels: spec.map(|s| s.labels.clone()).unwrap_or_default(),
                predefined: claim.is_none(),
            };
            Some(address(
                &slot,
                &r.key.network,
                r.result.as_ref(),
                "kept",
                KEPT_UNMANAGED,
            ))
        })
        .collect();
    if !kept.is_empty() {
        warn!(
            count = kept.len(),
            "agent records in the ledger while agent management is off: {KEPT_UNMANAGED}"
        );
    }
    publish(r, kept, String::new()).await;
    Ok(())
}

/// Every claim spec in the ledger, by name.
async fn claim_specs(
    r: &Reconciler,
) -> Result<std::collections::BTreeMap<String, ClaimSpec>, ShimError> {
    let raw = r.core.ledger(|l| l.settings(CLAIM_SETTING)).await?;
    Ok(claims::decode_all(raw))
}

/// Publishes the agent's list for List and Watch if it changed: its generation is written to
/// the ledger first, so that no dipamd after this one reuses it (a watcher orders messages by
/// (instance_id, generation)). A ledger that takes no writes (a full disk) does not hold the
/// list back: the agent needs its addresses more than a generation that survives restarts;
/// the instance id still tells a restart apart.
pub async fn publish(r: &Reconciler, addresses: Vec<AgentAddress>, waiting: String) {
    publish_with(r, move |_| (addresses, waiting)).await;
}

/// Publishes the list `f` makes from the current one, both under the publishing lock: an
/// edit of the list (one claim's entry, a cleared mark) never publishes over a newer list
/// that was sent while it was being made. Entries are kept in one order (the roles', then
/// the claims', by name), so that the same list never reads as a change.
async fn publish_with(
    r: &Reconciler,
    f: impl FnOnce(&AgentListReply) -> (Vec<AgentAddress>, String),
) {
    let _one = r.agent.publishing.lock().await;
    let (mut addresses, waiting) = f(&r.agent.snapshot());
    addresses.sort_by(|a, b| (!a.predefined, &a.name).cmp(&(!b.predefined, &b.name)));
    let Some((addresses, generation)) = r.agent.next(addresses, &waiting) else {
        return;
    };
    let text = generation.to_string();
    if let Err(e) = r
        .core
        .ledger(move |l| l.set_setting(GENERATION_SETTING, Some(&text)))
        .await
    {
        warn!(error = %e, generation, "the agent list's generation could not be kept in the ledger; publishing it anyway");
    }
    r.agent.publish(addresses, waiting, generation);
    report_addresses(r);
}

/// Marks (`Some(previous)`) or clears the change of `container_id`'s address; republishes
/// when it changed something.
async fn set_changed(
    r: &Reconciler,
    container_id: &str,
    previous: Option<String>,
) -> Result<bool, ShimError> {
    let differs = match r.agent.changed.lock() {
        Ok(mut c) => match &previous {
            Some(p) => c.insert(container_id.to_owned(), p.clone()).as_ref() != Some(p),
            None => c.remove(container_id).is_some(),
        },
        Err(_) => false,
    };
    if differs {
        let name = format!("{CHANGED_SETTING}{container_id}");
        r.core
            .ledger(move |l| l.set_setting(&name, previous.as_deref()))
            .await?;
    }
    Ok(differs)
}

/// A client read these claims (List, or Claim of one): their changed marks are cleared, and
/// the list is republished without them. The reply the client reads still carries the marks.
pub async fn clear_changed(r: &Reconciler, container_ids: &[String]) -> Result<(), ShimError> {
    let mut any = false;
    for id in container_ids {
        any |= set_changed(r, id, None).await?;
    }
    if any {
        publish_with(r, |snap| (snap.addresses.clone(), snap.waiting.clone())).await;
    }
    Ok(())
}

/// Enables (`on`) or disables a role at runtime; persists across restarts until the
/// configured roles change.
pub async fn set_role(r: &Reconciler, role: &str, on: bool) -> Result<(), ShimError> {
    if !ROLES.contains(&role) {
        // Never the role itself in full: a 1 MiB role echoed into the status message broke
        // the client's HTTP/2 header limit.
        return Err(ShimError::Invalid {
            msg: format!(
                "unknown agent role {}",
                crate::l1_leaves::validate::shown(role)
            ),
            details: format!("roles are {}", ROLES.join(", ")),
        });
    }
    if r.agent.config.is_none() {
        return Err(ShimError::Config {
            msg: "agent addresses are not configured".into(),
            details: "start dipamd with --conflist (or --conf-dir and --network) and --node-name"
                .into(),
        });
    }
    let name = format!("{ROLE_SETTING}{role}");
    let value = if on { "on" } else { "off" };
    r.core
        .ledger(move |l| l.set_setting(&name, Some(value)))
        .await
}

async fn effective_roles(r: &Reconciler, cfg: &AgentConfig) -> Result<BTreeSet<String>, ShimError> {
    let overrides = r.core.ledger(|l| l.settings(ROLE_SETTING)).await?;
    let mut roles = cfg.roles.clone();
    for (name, value) in overrides {
        let role = name.trim_start_matches(ROLE_SETTING).to_owned();
        match value.as_str() {
            "on" => {
                roles.insert(role);
            }
            _ => {
                roles.remove(&role);
            }
        }
    }
    Ok(roles)
}

/// One reconcile pass. Publishes the resulting list for List and Watch.
pub async fn pass(r: &Reconciler) -> Result<(), ShimError> {
    let Some(cfg) = r.agent.config.clone() else {
        return Ok(());
    };
    let _one = r.agent.pass.lock().await;
    let roles = effective_roles(r, &cfg).await?;
    let mut slots: Vec<Slot> = roles
        .iter()
        .flat_map(|r| cfg.families.iter().map(move |f| (r, *f)))
        .map(|(r, f)| Slot::new(&cfg, r, f))
        .collect();
    for (name, spec) in claim_specs(r).await? {
        slots.push(Slot::claim(&cfg, &name, &spec));
    }
    let base = match cfg.source.load() {
        Ok(b) => b,
        Err(missing) => {
            let waiting = missing.to_string();
            if r.agent.snapshot().waiting != waiting {
                warn!("{waiting}; agent addresses wait, pod requests are served meanwhile");
            }
            let pending = slots
                .iter()
                .map(|s| address(s, "", None, "pending", &waiting))
                .collect();
            publish(r, pending, waiting).await;
            return Ok(());
        }
    };

    let records: Vec<AttachmentRecord> = agent_records(r).await?;
    let mut addresses = Vec::new();
    let mut wanted = Vec::new();
    for slot in &slots {
        let key = AttachmentKey::new(&base.network, &slot.container_id, &slot.ifname);
        wanted.push(key.clone());
        let existing = records.iter().find(|r| r.key == key).cloned();
        let a = match establish(r, &base, slot, &key, existing).await {
            Ok(a) => a,
            Err(e) => {
                warn!(claim = %slot.name, family = slot.family.as_str(), error = %e, "agent address not established; will retry");
                address(slot, &base.network, None, "failed", &error_text(&e))
            }
        };
        addresses.push(a);
    }
    let releasing = release_unwanted(r, &records, &wanted).await;
    addresses.extend(releasing);
    let records = agent_records(r).await?;
    r.agent.reindex(&records);
    publish(r, addresses, String::new()).await;
    Ok(())
}

/// Releases every agent record not in `wanted`; returns those that could not be released
/// yet (retried by the next pass), as the agent should see them.
async fn release_unwanted(
    r: &Reconciler,
    records: &[AttachmentRecord],
    wanted: &[AttachmentKey],
) -> Vec<AgentAddress> {
    let mut addresses = Vec::new();
    for rec in records.iter().filter(|r| !wanted.contains(&r.key)) {
        let _guard = r.core.locks.lock(&rec.key).await;
        match release(r, rec).await {
            Ok(()) => {
                info!(key = %rec.key, owner = %rec.owner.label(), "agent address released (no longer enabled or claimed)");
                if let Err(e) = forget_slot(r, &rec.key.container_id).await {
                    warn!(key = %rec.key, error = %e, "the released address's settings stay");
                }
            }
            Err(e) => {
                warn!(key = %rec.key, error = %e, "agent address release failed; will retry");
                let role = match &rec.owner {
                    Owner::Agent { role } => role.clone(),
                    Owner::Pod | Owner::Pool => String::new(),
                };
                let ips = rec.result.as_ref().map(result_addrs).unwrap_or_default();
                let family = ips
                    .first()
                    .map(|ip| if ip.is_ipv4() { Family::V4 } else { Family::V6 });
                let claim = role.strip_prefix("claim:").map(str::to_owned);
                addresses.push(AgentAddress {
                    name: claim.clone().unwrap_or_else(|| {
                        format!("{role}-{}", family.map(Family::as_str).unwrap_or_default())
                    }),
                    predefined: claim.is_none(),
                    role,
                    family: family.map(Family::as_str).unwrap_or_default().into(),
                    address_family: family.map_or(0, |f| f.proto() as i32),
                    claim_state: dipam_proto::v1::ClaimState::Releasing as i32,
                    ip: rec
                        .result
                        .as_ref()
                        .map(crate::l2_core::delegate::config::result_ips)
                        .and_then(|v| v.first().cloned())
                        .unwrap_or_default(),
                    state: "releasing".into(),
                    network: rec.key.network.clone(),
                    container_id: rec.key.container_id.clone(),
                    ifname: rec.key.ifname.clone(),
                    message: error_text(&e),
                    ..AgentAddress::default()
                });
            }
        }
    }
    addresses
}

/// Reports the published agent addresses by state (the metrics' gauge).
fn report_addresses(r: &Reconciler) {
    if !r.core.events.listened() {
        return;
    }
    let mut by: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
    for a in r.agent.snapshot().addresses {
        *by.entry(a.state).or_default() += 1;
    }
    let rows: Vec<(&str, u64)> = by.iter().map(|(s, n)| (s.as_str(), *n)).collect();
    r.core
        .events
        .emit(crate::l1_leaves::events::Event::AgentAddresses(&rows));
}

/// The retry loop: passes until every address is established, then a periodic CHECK.
pub async fn run(r: Reconciler, check_every: Duration) {
    if r.agent.config.is_none() {
        return;
    }
    loop {
        if let Err(e) = pass(&r).await {
            warn!(error = %e, "agent reconcile pass failed");
        }
        let snap = r.agent.snapshot();
        let delay = if !snap.waiting.is_empty() {
            // Watching for the conflist: cheap (one stat), and the agent's addresses follow
            // within half a second of the file appearing.
            Duration::from_millis(500)
        } else if snap.addresses.iter().any(|a| a.state != "ready") {
            Duration::from_secs(3)
        } else {
            check_every
        };
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = r.agent.wake.notified() => {}
        }
    }
}

fn error_text(e: &ShimError) -> String {
    match e.code_and_details() {
        (_, d) if d.is_empty() => e.to_string(),
        (_, d) => format!("{e}: {d}"),
    }
}

fn address(
    slot: &Slot,
    network: &str,
    rec: Option<&Value>,
    state: &str,
    message: &str,
) -> AgentAddress {
    let (ip, gateway) = rec
        .and_then(|r| r.get("ips")?.as_array().cloned())
        .and_then(|ips| {
            ips.into_iter().find(|ip| {
                ip["address"]
                    .as_str()
                    .and_then(|a| a.parse::<ipnet::IpNet>().ok())
                    .is_some_and(|n| slot.family.matches(&n.addr()))
            })
        })
        .map(|ip| {
            (
                ip["address"].as_str().unwrap_or_default().to_owned(),
                ip["gateway"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .unwrap_or_default();
    AgentAddress {
        role: slot.role.clone(),
        family: slot.family.as_str().into(),
        ip,
        gateway,
        state: state.into(),
        network: network.into(),
        container_id: slot.container_id.clone(),
        ifname: slot.ifname.clone(),
        message: message.into(),
        name: slot.name.clone(),
        address_family: slot.family.proto() as i32,
        claim_state: super::claim_state(state) as i32,
        labels: slot.labels.clone().into_iter().collect(),
        requested_ip: slot.requested.map(|i| i.to_string()).unwrap_or_default(),
        // Set by publish (Agent::next) from the changed marks.
        changed: false,
        previous_ip: String::new(),
        predefined: slot.predefined,
    }
}

/// Forgets what the ledger's settings keep for a released slot: the address it last held
/// and its changed mark. A claim made again later under the same name starts afresh.
async fn forget_slot(r: &Reconciler, container_id: &str) -> Result<(), ShimError> {
    set_changed(r, container_id, None).await?;
    let name = format!("{LAST_IP_SETTING}{container_id}");
    r.core.ledger(move |l| l.set_setting(&name, None)).await
}

/// Makes one enabled slot hold its address; returns what the agent should see. Keeps an
/// address the delegate still holds, or releases what the ledger has for the slot and adds
/// it again (the address it had, when it can), then remembers the address for the next
/// time. The key's lock is held throughout.
async fn establish(
    r: &Reconciler,
    base: &Base,
    slot: &Slot,
    key: &AttachmentKey,
    existing: Option<AttachmentRecord>,
) -> Result<AgentAddress, ShimError> {
    let _guard = r.core.locks.lock(key).await;
    refuse_unsupported_request(r, base, slot)?;
    let mut b = match settle_existing(r, base, slot, key, existing).await? {
        Existing::Held(address) => return Ok(*address),
        Existing::Released(before) => before,
    };
    if b.previous.is_none() {
        let name = format!("{LAST_IP_SETTING}{}", slot.container_id);
        b.previous = r
            .core
            .ledger(move |l| l.setting(&name))
            .await?
            .and_then(|s| s.parse().ok());
    }
    if b.requested.is_none() {
        b.requested = slot.requested.or(b.previous);
    }

    let added = add(r, base, slot, key, &mut b).await?;
    let (ip, result) = the_address(r, slot, key, &added).await?;
    remember(r, slot, key, ip, b.previous, &b.message).await?;
    Ok(address(
        slot,
        &base.network,
        Some(&result),
        "ready",
        &b.message,
    ))
}

/// What the slot had before it is added again.
#[derive(Default)]
struct Before {
    /// The address to ask the delegate for: the claim's own, else the one held before.
    requested: Option<IpAddr>,
    /// The address this slot held before, if any: a different one now is a change the agent
    /// must learn of (the changed mark).
    previous: Option<IpAddr>,
    /// Why the address changed, for the agent's list; empty when nothing happened.
    message: String,
}

/// How the slot's existing record was dealt with.
enum Existing {
    /// The delegate still holds it: nothing to do.
    Held(Box<AgentAddress>),
    /// Released (or there was none): add it again.
    Released(Before),
}

/// Keeps a committed record the delegate still holds; releases any other (and, with no
/// record at all, a reservation from a previous life under the same key).
async fn settle_existing(
    r: &Reconciler,
    base: &Base,
    slot: &Slot,
    key: &AttachmentKey,
    existing: Option<AttachmentRecord>,
) -> Result<Existing, ShimError> {
    let mut b = Before::default();
    match existing {
        Some(rec) if rec.state == AttachmentState::Committed => {
            match verify(r, base, slot, &rec).await {
                Ok(()) => {
                    return Ok(Existing::Held(Box::new(address(
                        slot,
                        &base.network,
                        rec.result.as_ref(),
                        "ready",
                        "",
                    ))));
                }
                // A delegate that did not answer said nothing about the address: keep it
                // (its record and the delegate's reservation stand, so no pod gets it) and
                // check again at the next pass. Releasing it meant a DEL and an ADD into the
                // same hung delegate (a FIFO planted in host-local's store held dipamd's
                // start 40 s) and could move the agent's address.
                Err(why @ ShimError::DelegateTimeout { .. }) => {
                    warn!(key = %key, reason = %error_text(&why), "the delegate did not answer the agent address's CHECK; kept, checked again at the next pass");
                    return Ok(Existing::Held(Box::new(address(
                        slot,
                        &base.network,
                        rec.result.as_ref(),
                        "ready",
                        &format!("not verified: {}", error_text(&why)),
                    ))));
                }
                Err(why) => {
                    b.previous = mine(&rec, slot.family);
                    b.requested = slot.requested.or(b.previous);
                    warn!(key = %key, reason = %error_text(&why), "the delegate no longer holds this agent address; re-establishing it");
                    release(r, &rec).await.ok();
                    r.agent
                        .reestablished
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    r.core
                        .events
                        .emit(crate::l1_leaves::events::Event::AgentReestablished);
                    b.message = format!(
                        "re-established: the delegate had lost it ({})",
                        error_text(&why)
                    );
                }
            }
        }
        Some(rec) => {
            b.previous = mine(&rec, slot.family);
            b.requested = slot.requested.or(b.previous);
            release(r, &rec).await?;
        }
        None => {
            // A reservation from a previous life under the same key (ledger lost, or a crash
            // before the intent of a much older version) would make host-local refuse the ADD
            // as a duplicate: DEL first, ignoring "not found".
            let p = prepare(r, base, slot, "DEL")?;
            let (probe, send) = r.core.resolve(&p.dc, "").await?;
            let mut dc = p.dc.clone();
            if dc.inject_for_del(None) {
                let _ = r
                    .core
                    .run_delegate(&p, &probe, "DEL", dc.bytes_for(send)?)
                    .await;
            }
        }
    }
    Ok(Existing::Released(b))
}

/// The delegate's ADD for the slot, asking for `b.requested`; when that address is taken
/// (and the slot is not a claim of that very address), any other.
async fn add(
    r: &Reconciler,
    base: &Base,
    slot: &Slot,
    key: &AttachmentKey,
    b: &mut Before,
) -> Result<crate::l2_core::core::attach::Added, ShimError> {
    let owner = Owner::Agent {
        role: slot.role.clone(),
    };
    let mut p = prepare(r, base, slot, "ADD")?;
    if let Some(ip) = b.requested {
        request_ip(&mut p, ip);
    }
    let added = match crate::l2_core::core::attach::attach(
        &r.core,
        &p,
        owner.clone(),
        &mut crate::l2_core::core::attach::Early::default(),
    )
    .await
    {
        Ok(out) => out,
        // A claim's own requested IP is what it asked for: never another in its place.
        Err(e) if slot.requested.is_some() => return Err(e),
        Err(e) if b.requested.is_some() && matches!(e, ShimError::Delegate(_)) => {
            // The old address is taken (by a pod, while the agent's was not held): take
            // another rather than go without; the agent learns the new one from Watch.
            warn!(key = %key, requested = ?b.requested, error = %e, "the previous agent address is not available; taking another");
            b.message = format!(
                "address changed: {} was not available",
                b.requested.map(|i| i.to_string()).unwrap_or_default()
            );
            let p = prepare(r, base, slot, "ADD")?;
            crate::l2_core::core::attach::attach(
                &r.core,
                &p,
                owner.clone(),
                &mut crate::l2_core::core::attach::Early::default(),
            )
            .await?
        }
        Err(e) => return Err(e),
    };
    Ok(added)
}

/// The address of the slot's family in the delegate's result, and the result; released and
/// refused when the delegate gave another family or ignored the requested address.
async fn the_address(
    r: &Reconciler,
    slot: &Slot,
    key: &AttachmentKey,
    added: &crate::l2_core::core::attach::Added,
) -> Result<(IpAddr, Value), ShimError> {
    let result: Value =
        serde_json::from_slice(&added.result).map_err(|e| ShimError::Internal(e.to_string()))?;
    let Some(ip) = result_addrs(&result)
        .into_iter()
        .find(|ip| slot.family.matches(ip))
    else {
        // The delegate answered with another family only (a pool of the wrong family).
        if let Some(rec) = r.core.lookup(key)? {
            release(r, &rec).await.ok();
        }
        return Err(ShimError::Config {
            msg: format!("the delegate gave no {} address", slot.family.as_str()),
            details: format!(
                "it answered {}",
                crate::l1_leaves::validate::shown(&String::from_utf8_lossy(&added.result))
            ),
        });
    };
    if let Some(want) = slot.requested
        && want != ip
    {
        // The delegate ignored the request: holding another address would be a silent lie.
        if let Some(rec) = r.core.lookup(key)? {
            release(r, &rec).await.ok();
        }
        return Err(ShimError::Config {
            msg: format!("the delegate gave {ip}, not the requested {want}"),
            details: "it ignored the requested address; nothing is held for this claim".into(),
        });
    }
    Ok((ip, result))
}

/// Marks a changed address for the agent and remembers the address for the slot's next ADD.
async fn remember(
    r: &Reconciler,
    slot: &Slot,
    key: &AttachmentKey,
    ip: IpAddr,
    previous: Option<IpAddr>,
    message: &str,
) -> Result<(), ShimError> {
    match previous {
        Some(prev) if prev != ip => {
            let before = prev.to_string();
            set_changed(r, &slot.container_id, Some(before)).await?;
        }
        _ => {}
    }
    let name = format!("{LAST_IP_SETTING}{}", slot.container_id);
    let text = ip.to_string();
    r.core
        .ledger(move |l| l.set_setting(&name, Some(&text)))
        .await?;
    if message.is_empty() {
        info!(key = %key, %ip, "agent address established");
    } else {
        warn!(key = %key, %ip, "{message}");
    }
    Ok(())
}

/// The record's address of `family`.
fn mine(rec: &AttachmentRecord, family: Family) -> Option<IpAddr> {
    rec.result
        .as_ref()
        .map(result_addrs)
        .unwrap_or_default()
        .into_iter()
        .find(|ip| family.matches(ip))
}

/// Whether the delegate's CHECK looks at what it holds. azure-vnet-ipam's does not: its
/// CHECK is a no-op success (`cni/ipam/ipam.go` `Get`), so a CHECK would call an address
/// whose reservation was wiped (its state lives on /run, a tmpfs: a reboot) still held, and
/// the delegate would hand it to a pod.
fn check_is_blind(kind: &str) -> bool {
    kind == "azure-vnet-ipam"
}

/// Verifies a committed agent address with the delegate: CHECK where its version has one
/// and it looks; for a delegate whose CHECK is blind, an ADD under the same container ID
/// asking for the recorded address ([`reassert`]).
async fn verify(
    r: &Reconciler,
    base: &Base,
    slot: &Slot,
    rec: &AttachmentRecord,
) -> Result<(), ShimError> {
    let mut p = prepare(r, base, slot, "CHECK")?;
    if check_is_blind(&p.dc.kind) {
        return reassert(r, base, slot, rec).await;
    }
    let (probe, send) = r.core.resolve(&p.dc, "").await?;
    let effective = crate::l2_core::core::Core::effective(&p.dc, send);
    let floor = rscni_types::version::SpecVersion::new(0, 4, 0);
    if !(crate::l2_core::core::Core::delegate_allows(&probe, effective, floor)
        && effective >= floor)
    {
        return Ok(());
    }
    let recorded = rec
        .result
        .clone()
        .ok_or_else(|| ShimError::Internal(format!("{} has no result", rec.key)))?;
    let parsed =
        serde_json::from_value(recorded).map_err(|e| ShimError::Internal(e.to_string()))?;
    p.dc.conf["prevResult"] = serde_json::from_slice(&version::render(p.dc.version, parsed)?)
        .map_err(|e| ShimError::Internal(e.to_string()))?;
    let stdin = p.dc.bytes_for(send)?;
    r.core
        .run_delegate(&p, &probe, "CHECK", stdin)
        .await
        .map(|_| ())
}

/// The restart protocol for a delegate whose CHECK proves nothing (azure-vnet-ipam): ADD
/// again under the record's container ID, asking for the recorded address. azure-vnet-ipam
/// keys by container ID, and a requested address already held under the same ID is
/// answered with that address and no change (`ipam/pool.go` `requestAddress`); a free one
/// is reserved again (its state was lost: the reservation is restored before any pod can
/// take it); one another ID holds is refused "address in use", which is the delegate
/// saying it no longer holds ours: the caller then releases the record and takes another
/// address. The record stays committed throughout, so a crash here leaves nothing dipamd
/// does not know: at worst the reservation it was restoring, under the key it records.
async fn reassert(
    r: &Reconciler,
    base: &Base,
    slot: &Slot,
    rec: &AttachmentRecord,
) -> Result<(), ShimError> {
    let ip = mine(rec, slot.family)
        .ok_or_else(|| ShimError::Internal(format!("{} records no address", rec.key)))?;
    let mut p = prepare(r, base, slot, "ADD")?;
    request_ip(&mut p, ip);
    let (probe, send) = r.core.resolve(&p.dc, "").await?;
    let out = r
        .core
        .run_delegate(&p, &probe, "ADD", p.dc.bytes_for(send)?)
        .await?;
    let answered: Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| ShimError::Internal(format!("the delegate's ADD result is not JSON: {e}")))?;
    let got = result_addrs(&answered);
    if got.contains(&ip) {
        return Ok(());
    }
    Err(ShimError::Config {
        msg: format!(
            "asked again for {ip} under {}, the delegate answered {got:?}",
            rec.key.container_id
        ),
        details: "it holds another address for this agent attachment".into(),
    })
}

/// Releases a recorded agent address and forgets it (caller holds the key's lock).
async fn release(r: &Reconciler, rec: &AttachmentRecord) -> Result<(), ShimError> {
    r.core.release(rec).await
}
