//! A claim or unclaim from the Agent service: one slot reconciled at once, its address
//! published under the claim's container ID, and the refusals a caller can act on (a claim
//! changed under the same name, an address another holder has).

use super::*;

/// What the Claim and Unclaim RPCs answer: the caller's own claim as the agent's list now
/// shows it (or, once released, as it was).
#[derive(Debug)]
pub struct Outcome {
    pub claim: AgentAddress,
}

/// The claim's address in the published list (with its changed mark), or `fallback`.
pub(super) fn published(
    r: &Reconciler,
    container_id: &str,
    fallback: AgentAddress,
) -> AgentAddress {
    r.agent
        .snapshot()
        .addresses
        .into_iter()
        .find(|a| a.container_id == container_id)
        .unwrap_or(fallback)
}

/// The published list with `entry` in place of the address of its container ID (or added,
/// or, for `None`, without it).
pub(super) async fn replace_published(
    r: &Reconciler,
    container_id: &str,
    entry: Option<AgentAddress>,
) {
    publish_with(r, |snap| {
        let mut addresses: Vec<AgentAddress> = snap
            .addresses
            .iter()
            .filter(|a| a.container_id != container_id)
            .cloned()
            .collect();
        addresses.extend(entry);
        (addresses, snap.waiting.clone())
    })
    .await;
}

/// Who holds `ip` in the ledger (other than `key`), named for an error message: a pod by its
/// container ID (cut to 64 characters) and ifname, a claim by its name.
pub(super) async fn holder_of(
    r: &Reconciler,
    ip: IpAddr,
    key: &AttachmentKey,
) -> Result<Option<String>, ShimError> {
    // Streamed, keeping only the holders: this read held every record of the ledger.
    let not = key.clone();
    let records = r
        .core
        .ledger(move |l| {
            l.list_where(None, |r| {
                r.key != not
                    && r.result
                        .as_ref()
                        .is_some_and(|res| result_addrs(res).contains(&ip))
            })
        })
        .await?;
    Ok(records.into_iter().next().map(|r| {
        let id = crate::l1_leaves::validate::clip(&r.key.container_id, 64);
        match &r.owner {
            Owner::Pod => format!("pod {id}/{} on network {}", r.key.ifname, r.key.network),
            Owner::Pool => format!("the warm pool's entry {id}"),
            Owner::Agent { role } => match role.strip_prefix("claim:") {
                Some(name) => format!("agent claim {name:?}"),
                None => format!("the agent's {role} address"),
            },
        }
    }))
}

/// Refuses a claim whose name exists with another family or address (`old`): a claim's name
/// is its identity. `slot`: the claim's slot, whose held address counts as its own.
pub(super) fn refuse_changed(
    r: &Reconciler,
    slot: &Slot,
    c: &Claim,
    old: &ClaimSpec,
) -> Result<(), ShimError> {
    let held = r
        .agent
        .snapshot()
        .addresses
        .into_iter()
        .find(|a| a.container_id == slot.container_id)
        .and_then(|a| a.ip.split('/').next()?.parse::<IpAddr>().ok());
    let same_ip = c.spec.ip.is_none() || c.spec.ip == old.ip || c.spec.ip == held;
    if old.family != c.spec.family || !same_ip {
        return Err(ShimError::ClaimExists {
            msg: format!("claim {:?} exists with another family or address", c.name),
            details: format!(
                "it is {}{}; a claim's name is its identity: unclaim it first, or choose \
                 another name. Nothing was changed",
                old.family,
                old.ip.map(|i| format!(" at {i}")).unwrap_or_default()
            ),
        });
    }
    Ok(())
}

/// `Agent.Claim`: records the claim, then establishes its one slot at once. A requested IP
/// that someone holds is refused before anything is recorded, naming the holder; a requested
/// IP the delegate refuses for a new claim is refused the same way and the claim forgotten
/// (the delegate's ADD was rolled back by the ADD path): nothing is left half-allocated.
/// Other failures keep the claim, reported failed with the reason and retried by the loop.
pub async fn claim(r: &Reconciler, c: Claim) -> Result<Outcome, ShimError> {
    let Some(cfg) = r.agent.config.clone() else {
        return Err(not_configured());
    };
    let _one = r.agent.pass.lock().await;
    let specs = claim_specs(r).await?;
    let existing = specs.get(&c.name).cloned();
    if existing.is_none() && specs.len() >= claims::limits::CLAIMS {
        return Err(ShimError::TooMany {
            what: "claims",
            count: specs.len() + 1,
            limit: claims::limits::CLAIMS,
        });
    }
    if let Some(old) = &existing {
        refuse_changed(r, &Slot::claim(&cfg, &c.name, &c.spec), &c, old)?;
    }
    let base = cfg.source.load();
    // The same spec again (an agent restarting, a retried call): keep what it asked first,
    // take the new labels.
    let spec = ClaimSpec {
        ip: c.spec.ip.or(existing.as_ref().and_then(|o| o.ip)),
        ..c.spec.clone()
    };
    let slot = Slot::claim(&cfg, &c.name, &spec);
    let network = base.as_ref().map(|b| b.network.clone()).unwrap_or_default();
    let key = AttachmentKey::new(&network, &slot.container_id, &slot.ifname);
    if existing.is_none()
        && let Some(ip) = spec.ip
        && let Some(holder) = holder_of(r, ip, &key).await?
    {
        return Ok(Outcome {
            claim: address(
                &slot,
                &network,
                None,
                "failed",
                &format!("requested IP {ip} is held by {holder}; nothing was claimed"),
            ),
        });
    }
    let name = format!("{CLAIM_SETTING}{}", c.name);
    let text = serde_json::to_string(&spec).map_err(|e| ShimError::Internal(e.to_string()))?;
    r.core
        .ledger(move |l| l.set_setting(&name, Some(&text)))
        .await?;
    let base = match base {
        Ok(b) => b,
        Err(missing) => {
            let a = address(&slot, "", None, "pending", &missing.to_string());
            replace_published(r, &slot.container_id, Some(a.clone())).await;
            return Ok(Outcome { claim: a });
        }
    };
    let existing_rec = r.core.lookup(&key)?;
    let fresh = existing.is_none() && existing_rec.is_none();
    let a = match establish(r, &base, &slot, &key, existing_rec).await {
        Ok(a) => a,
        Err(e) if fresh && spec.ip.is_some() => {
            // The delegate refused the requested IP of a new claim: forget it, so that
            // nothing of it stays (its ADD was rolled back).
            let name = format!("{CLAIM_SETTING}{}", c.name);
            r.core.ledger(move |l| l.set_setting(&name, None)).await?;
            let ip = spec.ip.map(|i| i.to_string()).unwrap_or_default();
            let why =
                match holder_of(r, spec.ip.unwrap_or(IpAddr::from([0, 0, 0, 0])), &key).await? {
                    Some(h) => format!("held by {h}"),
                    None => crate::l1_leaves::validate::clip(&error_text(&e), 512),
                };
            let a = address(
                &slot,
                &base.network,
                None,
                "failed",
                &format!("requested IP {ip} is not available: {why}; nothing was claimed"),
            );
            return Ok(Outcome { claim: a });
        }
        Err(e) => {
            warn!(claim = %slot.name, error = %e, "claim not established; will retry");
            address(&slot, &base.network, None, "failed", &error_text(&e))
        }
    };
    let records = agent_records(r).await?;
    r.agent.reindex(&records);
    replace_published(r, &slot.container_id, Some(a.clone())).await;
    let out = published(r, &slot.container_id, a);
    // The caller reads its claim now: a change it is told of here is no longer news.
    drop(_one);
    clear_changed(r, std::slice::from_ref(&slot.container_id)).await?;
    Ok(Outcome { claim: out })
}

/// `Agent.Unclaim`: forgets the claim's spec first (a crash after that leaves a record no
/// claim wants, which the next pass releases), then releases its address at once.
pub async fn unclaim(r: &Reconciler, name: &str) -> Result<Outcome, ShimError> {
    let Some(cfg) = r.agent.config.clone() else {
        return Err(not_configured());
    };
    let _one = r.agent.pass.lock().await;
    let spec = claim_specs(r)
        .await?
        .remove(name)
        .unwrap_or_else(|| ClaimSpec {
            family: Family::V4.as_str().into(),
            ip: None,
            labels: Default::default(),
        });
    let slot = Slot::claim(&cfg, name, &spec);
    let setting = format!("{CLAIM_SETTING}{name}");
    r.core
        .ledger(move |l| l.set_setting(&setting, None))
        .await?;
    let cid = slot.container_id.clone();
    let records: Vec<AttachmentRecord> = r
        .core
        .ledger(move |l| l.list_where(None, |r| r.key.container_id == cid))
        .await?;
    let network = records
        .first()
        .map(|r| r.key.network.clone())
        .unwrap_or_default();
    let left = release_unwanted(r, &records, &[]).await;
    let records = agent_records(r).await?;
    r.agent.reindex(&records);
    let outcome = match left.into_iter().next() {
        Some(releasing) => {
            replace_published(r, &slot.container_id, Some(releasing.clone())).await;
            releasing
        }
        None => {
            forget_slot(r, &slot.container_id).await?;
            replace_published(r, &slot.container_id, None).await;
            address(&slot, &network, None, "released", "")
        }
    };
    Ok(Outcome { claim: outcome })
}

pub(super) fn not_configured() -> ShimError {
    ShimError::Config {
        msg: "agent addresses are not configured".into(),
        details: "start dipamd with --conflist (or --conf-dir and --network) and --node-name"
            .into(),
    }
}
