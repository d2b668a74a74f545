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
//! ADDs go through the same intent-before-exec path as pods (rpc::add::attach), so a crash at
//! any point leaves a record that start-up replay or the next pass resolves.

use std::{collections::BTreeSet, net::IpAddr, time::Duration};

use dipam_proto::v1::{AgentAddress, CniRequest};
use dipam_state::{AttachmentKey, AttachmentRecord, AttachmentState, Owner};
use serde_json::Value;
use tracing::{info, warn};

use super::{AgentConfig, Family, ROLES, Slot, conflist::Base};
use crate::{
    core::Prepared,
    delegate::{config::result_addrs, version},
    error::ShimError,
    node::Node,
};

const ROLE_SETTING: &str = "agent/role/";
const FLAGS_SETTING: &str = "agent/flags";
const LAST_IP_SETTING: &str = "agent/last-ip/";

/// At start: if the configured roles changed since the last start, the operator's new
/// configuration wins over roles the agent allocated or released at runtime.
pub async fn init(node: &Node) -> Result<(), ShimError> {
    let Some(cfg) = node.agent.config.clone() else {
        return keep_unmanaged(node).await;
    };
    let flags = cfg.roles.iter().cloned().collect::<Vec<_>>().join(",");
    node.ledger(move |l| {
        if l.setting(FLAGS_SETTING)?.as_deref() != Some(flags.as_str()) {
            for (name, _) in l.settings(ROLE_SETTING)? {
                l.set_setting(&name, None)?;
            }
            l.set_setting(FLAGS_SETTING, Some(&flags))?;
        }
        Ok(())
    })
    .await?;
    let records = node.ledger(|l| l.list(None)).await?;
    node.agent.reindex(&records);
    Ok(())
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
async fn keep_unmanaged(node: &Node) -> Result<(), ShimError> {
    let records = node.ledger(|l| l.list(None)).await?;
    node.agent.reindex(&records);
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
            let slot = Slot {
                role: role.clone(),
                family,
                container_id: r.key.container_id.clone(),
                ifname: r.key.ifname.clone(),
                netns: r.netns.clone(),
                args: r.cni_args.clone(),
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
    node.agent.publish(kept, String::new());
    report_addresses(node);
    Ok(())
}

/// Enables (`on`) or disables a role at runtime; persists across restarts until the
/// configured roles change.
pub async fn set_role(node: &Node, role: &str, on: bool) -> Result<(), ShimError> {
    if !ROLES.contains(&role) {
        // Never the role itself in full: a 1 MiB role echoed into the status message broke
        // the client's HTTP/2 header limit.
        return Err(ShimError::Invalid {
            msg: format!("unknown agent role {}", crate::validate::shown(role)),
            details: format!("roles are {}", ROLES.join(", ")),
        });
    }
    if node.agent.config.is_none() {
        return Err(ShimError::Config {
            msg: "agent addresses are not configured".into(),
            details: "start dipamd with --conflist (or --conf-dir and --network) and --node-name"
                .into(),
        });
    }
    let name = format!("{ROLE_SETTING}{role}");
    let value = if on { "on" } else { "off" };
    node.ledger(move |l| l.set_setting(&name, Some(value)))
        .await
}

async fn effective_roles(node: &Node, cfg: &AgentConfig) -> Result<BTreeSet<String>, ShimError> {
    let overrides = node.ledger(|l| l.settings(ROLE_SETTING)).await?;
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
pub async fn pass(node: &Node) -> Result<(), ShimError> {
    let Some(cfg) = node.agent.config.clone() else {
        return Ok(());
    };
    let _one = node.agent.pass.lock().await;
    let roles = effective_roles(node, &cfg).await?;
    let slots: Vec<Slot> = roles
        .iter()
        .flat_map(|r| cfg.families.iter().map(move |f| (r, *f)))
        .map(|(r, f)| Slot::new(&cfg, r, f))
        .collect();
    let base = match cfg.source.load() {
        Ok(b) => b,
        Err(missing) => {
            let waiting = missing.to_string();
            if node.agent.snapshot().waiting != waiting {
                warn!("{waiting}; agent addresses wait, pod requests are served meanwhile");
            }
            let pending = slots
                .iter()
                .map(|s| address(s, "", None, "pending", &waiting))
                .collect();
            node.agent.publish(pending, waiting);
            report_addresses(node);
            return Ok(());
        }
    };

    let records: Vec<AttachmentRecord> = node
        .ledger(|l| l.list(None))
        .await?
        .into_iter()
        .filter(|r| matches!(r.owner, Owner::Agent { .. }))
        .collect();
    let mut addresses = Vec::new();
    let mut wanted = Vec::new();
    for slot in &slots {
        let key = AttachmentKey::new(&base.network, &slot.container_id, &slot.ifname);
        wanted.push(key.clone());
        let existing = records.iter().find(|r| r.key == key).cloned();
        let a = match establish(node, &base, slot, &key, existing).await {
            Ok(a) => a,
            Err(e) => {
                warn!(role = %slot.role, family = slot.family.as_str(), error = %e, "agent address not established; will retry");
                address(slot, &base.network, None, "failed", &error_text(&e))
            }
        };
        addresses.push(a);
    }
    for rec in records.iter().filter(|r| !wanted.contains(&r.key)) {
        let _guard = node.locks.lock(&rec.key).await;
        match release(node, rec).await {
            Ok(()) => {
                info!(key = %rec.key, owner = %rec.owner.label(), "agent address released (role disabled)")
            }
            Err(e) => {
                warn!(key = %rec.key, error = %e, "agent address release failed; will retry");
                let role = match &rec.owner {
                    Owner::Agent { role } => role.clone(),
                    Owner::Pod | Owner::Pool => String::new(),
                };
                let ips = rec.result.as_ref().map(result_addrs).unwrap_or_default();
                addresses.push(AgentAddress {
                    role,
                    family: ips
                        .first()
                        .map(|ip| if ip.is_ipv4() { "ipv4" } else { "ipv6" })
                        .unwrap_or_default()
                        .into(),
                    ip: rec
                        .result
                        .as_ref()
                        .map(crate::delegate::config::result_ips)
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
    let records = node.ledger(|l| l.list(None)).await?;
    node.agent.reindex(&records);
    node.agent.publish(addresses, String::new());
    report_addresses(node);
    Ok(())
}

/// Reports the published agent addresses by state (the metrics' gauge).
fn report_addresses(node: &Node) {
    if !node.events.listened() {
        return;
    }
    let mut by: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
    for a in node.agent.snapshot().addresses {
        *by.entry(a.state).or_default() += 1;
    }
    let rows: Vec<(&str, u64)> = by.iter().map(|(s, n)| (s.as_str(), *n)).collect();
    node.events
        .emit(crate::events::Event::AgentAddresses(&rows));
}

/// The retry loop: passes until every address is established, then a periodic CHECK.
pub async fn run(node: std::sync::Arc<Node>, check_every: Duration) {
    if node.agent.config.is_none() {
        return;
    }
    loop {
        if let Err(e) = pass(&node).await {
            warn!(error = %e, "agent reconcile pass failed");
        }
        let snap = node.agent.snapshot();
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
            () = node.agent.wake.notified() => {}
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
    }
}

/// Builds the ADD/DEL/CHECK request for a slot, the way a runtime would call dipam.
fn prepare(node: &Node, base: &Base, slot: &Slot, command: &str) -> Result<Prepared, ShimError> {
    let req = CniRequest {
        protocol_version: dipam_proto::PROTOCOL_VERSION,
        request_id: format!("agent-{}-{}", slot.role, slot.family.as_str()),
        command: command.into(),
        container_id: slot.container_id.clone(),
        netns: slot.netns.clone(),
        ifname: slot.ifname.clone(),
        cni_args: slot.args.clone(),
        cni_path: String::new(),
        stdin: serde_json::to_vec(&base.request).map_err(|e| ShimError::Internal(e.to_string()))?,
        mode: base.mode as i32,
        issued_at_ms: crate::clock::now_ms(),
        issued_at: crate::order::now().map(|b| dipam_proto::v1::BootStamp {
            boot_id: b.boot_id,
            ns: b.ns,
        }),
        retired_link: None,
    };
    let mut p = node.prepare(req, true, crate::access::Caller::ROOT)?;
    // host-local hands out one address per range set: keep only this family's, so that
    // each (role, family) holds exactly one address.
    if p.dc.kind == "host-local"
        && let Some(ranges) = p.dc.conf["ipam"]["ranges"].as_array().cloned()
    {
        let kept: Vec<Value> = ranges
            .into_iter()
            .filter(|set| {
                set.get(0)
                    .and_then(|r| r["subnet"].as_str())
                    .and_then(|s| s.parse::<ipnet::IpNet>().ok())
                    .is_some_and(|n| slot.family.matches(&n.addr()))
            })
            .collect();
        if kept.is_empty() {
            return Err(ShimError::Config {
                msg: format!("the delegate config has no {} range", slot.family.as_str()),
                details: format!(
                    "{} lists no {} subnet in ipam ranges; drop that family from \
                     --agent-families or add a range",
                    base.path.display(),
                    slot.family.as_str()
                ),
            });
        }
        p.dc.conf["ipam"]["ranges"] = Value::Array(kept);
    }
    Ok(p)
}

/// Asks the delegate for `ip` where it supports requested addresses.
fn request_ip(p: &mut Prepared, ip: IpAddr) {
    match p.dc.kind.as_str() {
        "host-local" => p.req.cni_args.push_str(&format!(";IP={ip}")),
        "azure-vnet-ipam" => p.dc.conf["ipam"]["ipAddress"] = Value::String(ip.to_string()),
        _ => {}
    }
}

/// Makes one enabled slot hold its address; returns what the agent should see.
async fn establish(
    node: &Node,
    base: &Base,
    slot: &Slot,
    key: &AttachmentKey,
    existing: Option<AttachmentRecord>,
) -> Result<AgentAddress, ShimError> {
    let _guard = node.locks.lock(key).await;
    let owner = Owner::Agent {
        role: slot.role.clone(),
    };
    let mut requested: Option<IpAddr> = None;
    let mut message = String::new();
    match existing {
        Some(rec) if rec.state == AttachmentState::Committed => {
            match verify(node, base, slot, &rec).await {
                Ok(()) => {
                    return Ok(address(
                        slot,
                        &base.network,
                        rec.result.as_ref(),
                        "ready",
                        "",
                    ));
                }
                Err(why) => {
                    requested = mine(&rec, slot.family);
                    warn!(key = %key, reason = %error_text(&why), "the delegate no longer holds this agent address; re-establishing it");
                    release(node, &rec).await.ok();
                    node.agent
                        .reestablished
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    node.events.emit(crate::events::Event::AgentReestablished);
                    message = format!(
                        "re-established: the delegate had lost it ({})",
                        error_text(&why)
                    );
                }
            }
        }
        Some(rec) => {
            requested = mine(&rec, slot.family);
            release(node, &rec).await?;
        }
        None => {
            // A reservation from a previous life under the same key (ledger lost, or a crash
            // before the intent of a much older version) would make host-local refuse the ADD
            // as a duplicate: DEL first, ignoring "not found".
            let p = prepare(node, base, slot, "DEL")?;
            let (probe, send) = node.resolve(&p.dc, "").await?;
            let mut dc = p.dc.clone();
            if dc.inject_for_del(None) {
                let _ = node
                    .run_delegate(&p, &probe, "DEL", dc.bytes_for(send)?)
                    .await;
            }
        }
    }
    if requested.is_none() {
        let name = format!("{LAST_IP_SETTING}{}", slot.container_id);
        requested = node
            .ledger(move |l| l.setting(&name))
            .await?
            .and_then(|s| s.parse().ok());
    }

    let mut p = prepare(node, base, slot, "ADD")?;
    if let Some(ip) = requested {
        request_ip(&mut p, ip);
    }
    let added = match crate::core::attach::attach(
        node,
        &p,
        owner.clone(),
        &mut crate::core::attach::Early::default(),
    )
    .await
    {
        Ok(out) => out,
        Err(e) if requested.is_some() && matches!(e, ShimError::Delegate(_)) => {
            // The old address is taken (by a pod, while the agent's was not held): take
            // another rather than go without; the agent learns the new one from Watch.
            warn!(key = %key, requested = ?requested, error = %e, "the previous agent address is not available; taking another");
            message = format!(
                "address changed: {} was not available",
                requested.map(|i| i.to_string()).unwrap_or_default()
            );
            let p = prepare(node, base, slot, "ADD")?;
            crate::core::attach::attach(
                node,
                &p,
                owner.clone(),
                &mut crate::core::attach::Early::default(),
            )
            .await?
        }
        Err(e) => return Err(e),
    };
    let result: Value =
        serde_json::from_slice(&added.result).map_err(|e| ShimError::Internal(e.to_string()))?;
    let Some(ip) = result_addrs(&result)
        .into_iter()
        .find(|ip| slot.family.matches(ip))
    else {
        // The delegate answered with another family only (a pool of the wrong family).
        if let Some(rec) = node.lookup(key)? {
            release(node, &rec).await.ok();
        }
        return Err(ShimError::Config {
            msg: format!("the delegate gave no {} address", slot.family.as_str()),
            details: format!("it answered {}", String::from_utf8_lossy(&added.result)),
        });
    };
    let name = format!("{LAST_IP_SETTING}{}", slot.container_id);
    let text = ip.to_string();
    node.ledger(move |l| l.set_setting(&name, Some(&text)))
        .await?;
    if message.is_empty() {
        info!(key = %key, %ip, "agent address established");
    } else {
        warn!(key = %key, %ip, "{message}");
    }
    Ok(address(
        slot,
        &base.network,
        Some(&result),
        "ready",
        &message,
    ))
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

/// CHECKs a committed agent address with the delegate, where its version has CHECK.
async fn verify(
    node: &Node,
    base: &Base,
    slot: &Slot,
    rec: &AttachmentRecord,
) -> Result<(), ShimError> {
    let mut p = prepare(node, base, slot, "CHECK")?;
    let (probe, send) = node.resolve(&p.dc, "").await?;
    let effective = crate::core::Core::effective(&p.dc, send);
    let floor = rscni_types::version::SpecVersion::new(0, 4, 0);
    if !(crate::core::Core::delegate_allows(&probe, effective, floor) && effective >= floor) {
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
    node.run_delegate(&p, &probe, "CHECK", stdin)
        .await
        .map(|_| ())
}

/// Releases a recorded agent address and forgets it (caller holds the key's lock).
async fn release(node: &Node, rec: &AttachmentRecord) -> Result<(), ShimError> {
    node.release(rec).await
}
