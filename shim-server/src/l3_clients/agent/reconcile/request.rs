//! The delegate's request for an agent slot, made the way a runtime would call dipam, and the
//! checks on an address asked for (inside the network's ranges, a delegate that honours a
//! requested address).

use super::*;

/// Builds the ADD/DEL/CHECK request for a slot, the way a runtime would call dipam.
pub(super) fn prepare(
    r: &Reconciler,
    base: &Base,
    slot: &Slot,
    command: &str,
) -> Result<Prepared, ShimError> {
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
        issued_at_ms: crate::l1_leaves::clock::now_ms(),
        issued_at: crate::l1_leaves::order::now().map(|b| dipam_proto::v1::BootStamp {
            boot_id: b.boot_id,
            ns: b.ns,
        }),
        retired_link: None,
    };
    let mut p = r.prepare(req, true, crate::l1_leaves::access::Caller::ROOT)?;
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
            return Err(no_range_of_family(base, slot));
        }
        // Only an ADD asks for the address: a DEL or CHECK of a claim whose ranges changed
        // since must still reach the delegate.
        if command == "ADD"
            && let Some(ip) = slot.requested
        {
            refuse_outside(base, slot, ip, &kept)?;
        }
        p.dc.conf["ipam"]["ranges"] = Value::Array(kept);
    }
    Ok(p)
}

/// Whether a delegate of `kind` can be asked for a specific address (see [`request_ip`]).
fn supports_requested(kind: &str) -> bool {
    matches!(kind, "host-local" | "azure-vnet-ipam")
}

/// The delegate type of the agent network's config.
fn base_kind(r: &Reconciler, base: &Base, slot: &Slot) -> Result<String, ShimError> {
    Ok(prepare(r, base, slot, "ADD")?.dc.kind)
}

/// Asks the delegate for `ip` where it supports requested addresses.
pub(super) fn request_ip(p: &mut Prepared, ip: IpAddr) {
    match p.dc.kind.as_str() {
        "host-local" => p.req.cni_args.push_str(&format!(";IP={ip}")),
        "azure-vnet-ipam" => p.dc.conf["ipam"]["ipAddress"] = Value::String(ip.to_string()),
        _ => {}
    }
}

/// A slot whose family the network has no range of. A role's family comes from
/// `--agent-families`; a claim's from the claim itself (its requested IP or family), so
/// the fix named differs: pointing a claim at `--agent-families` would send the operator
/// to a flag that has nothing to do with it.
fn no_range_of_family(base: &Base, slot: &Slot) -> ShimError {
    let family = slot.family.as_str();
    let fix = if slot.predefined {
        format!("drop {family} from dipamd's --agent-families or add a {family} range")
    } else {
        format!(
            "claim {:?} asks for an {family} address: claim it on a network with a {family} \
             range, ask for the other family, or add a {family} range",
            slot.name
        )
    };
    ShimError::Config {
        msg: format!("the delegate config has no {family} range"),
        details: format!(
            "{} lists no {family} subnet in ipam ranges; {fix}",
            base.path.display()
        ),
    }
}

/// A claim's requested IP that none of host-local's range sets can give. host-local's own
/// answer ("requested IP address ... not available in range set ...") names neither the
/// claim nor the ranges it was asked from; this one names both, before anything is run.
fn refuse_outside(base: &Base, slot: &Slot, ip: IpAddr, sets: &[Value]) -> Result<(), ShimError> {
    let ranges: Vec<&Value> = sets.iter().filter_map(Value::as_array).flatten().collect();
    if ranges.iter().any(|r| in_range(r, ip)) {
        return Ok(());
    }
    let shown: Vec<String> = ranges.iter().map(|r| range_text(r)).collect();
    Err(ShimError::Config {
        msg: format!("requested IP {ip} is outside the network's ranges"),
        details: format!(
            "claim {:?} asks for {ip}, but {} hands out {} only: claim an address inside a \
             range, or claim without an IP",
            slot.name,
            base.path.display(),
            shown.join(", ")
        ),
    })
}

/// Whether one host-local range (`subnet`, optional `rangeStart`/`rangeEnd`) holds `ip`.
/// An unreadable range is taken to hold it: host-local then judges, as before.
fn in_range(range: &Value, ip: IpAddr) -> bool {
    let Some(subnet) = range["subnet"]
        .as_str()
        .and_then(|s| s.parse::<ipnet::IpNet>().ok())
    else {
        return true;
    };
    let bound = |k: &str| range[k].as_str().and_then(|s| s.parse::<IpAddr>().ok());
    subnet.contains(&ip)
        && bound("rangeStart").is_none_or(|start| start <= ip)
        && bound("rangeEnd").is_none_or(|end| ip <= end)
}

/// `10.1.0.0/24 (10.1.0.10-10.1.0.50)`, or the subnet alone.
fn range_text(range: &Value) -> String {
    let subnet = range["subnet"].as_str().unwrap_or("?");
    match (range["rangeStart"].as_str(), range["rangeEnd"].as_str()) {
        (None, None) => subnet.to_owned(),
        (start, end) => format!("{subnet} ({}-{})", start.unwrap_or(""), end.unwrap_or("")),
    }
}

/// A claim that asks for a particular address needs a delegate that can be asked for one.
pub(super) fn refuse_unsupported_request(
    r: &Reconciler,
    base: &Base,
    slot: &Slot,
) -> Result<(), ShimError> {
    if slot.requested.is_some() && !supports_requested(&base_kind(r, base, slot)?) {
        return Err(ShimError::Config {
            msg: "the delegate cannot be asked for a specific address".into(),
            details: format!(
                "claims with a requested IP work with host-local (CNI_ARGS IP=) and \
                 azure-vnet-ipam (ipam.ipAddress); {} uses {}: claim without an IP",
                base.path.display(),
                base_kind(r, base, slot)?
            ),
        });
    }
    Ok(())
}
