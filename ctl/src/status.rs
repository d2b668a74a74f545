//! `dipamctl status`: is dipamd ready? Versions, uptime, state directory, attachment count,
//! the DEL spool, the warm pool, the delegates probed so far; `--ready` makes "not ready" a
//! failure, for readiness probes. It also says how many of `dipamctl doctor`'s checks fail,
//! so that a node that is ready but misconfigured does not look healthy.

use std::io::Write;

use dipam_proto::v1::{
    DoctorRequest, RangeStatus, SpoolStatus, StatusReply, StatusRequest, admin_client::AdminClient,
};
use serde_json::{Value, json};
use tonic::transport::Channel;

use super::{error::CtlError, output};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Exit non-zero unless dipamd is ready (for readiness probes). Skips counting doctor's
    /// failing checks, which execs every delegate.
    #[arg(long)]
    ready: bool,
    /// Count each range from the delegate's store, read now, instead of the ledger: finds the
    /// orphans (reservations no attachment accounts for) too, but reads every reservation, so
    /// it takes longer as the node fills (~1 s at 2,500 pods with host-local). Without it the
    /// counts come from the ledger, kept at every commit, and cost the same at any size.
    #[arg(long)]
    stores: bool,
}

pub async fn run(
    args: Args,
    channel: Channel,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CtlError> {
    let mut client = AdminClient::new(channel);
    let s = client
        .get_status(StatusRequest {
            protocol_version: dipam_proto::PROTOCOL_VERSION,
            stores: args.stores,
        })
        .await
        .map_err(CtlError::Rpc)?
        .into_inner();
    // Not under --ready: that is the readiness probe, run every few seconds, and doctor
    // execs every delegate and reads every store.
    let doctor = if args.ready {
        Err(NotCounted::Ready)
    } else {
        doctor_count(&mut client, args.stores)
            .await
            .map_err(NotCounted::Rpc)
    };
    if json {
        let mut v = to_json(&s);
        v["doctor"] = match &doctor {
            Ok((checks, failed)) => {
                json!({"checks": checks, "failed": failed, "storesCompared": args.stores})
            }
            Err(e) => json!({"error": e.to_string()}),
        };
        output::json(out, &v)?;
    } else {
        table(&s, out)?;
        let skipped = if args.stores {
            ""
        } else {
            " (stores not compared with the ledger: --stores)"
        };
        match &doctor {
            Ok((checks, 0)) => writeln!(out, "doctor:       all {checks} check(s) pass{skipped}")?,
            Ok((checks, failed)) => writeln!(
                out,
                "doctor:       {failed} of {checks} check(s) fail{skipped} (`dipamctl doctor` \
                 says which and what to fix)"
            )?,
            Err(e) => writeln!(out, "doctor:       not counted: {e}")?,
        }
    }
    if args.ready && !s.ready {
        return Err(CtlError::Failed(format!(
            "dipamd is not ready: {}",
            s.not_ready.join("; ")
        )));
    }
    Ok(())
}

/// How many of doctor's checks there are and how many fail, as `dipamctl doctor` counts them.
/// An older dipamd without Doctor, or one that fails it, gives the reason instead.
/// Why `status` shows no count of doctor's checks.
#[derive(Debug, thiserror::Error)]
enum NotCounted {
    #[error("skipped under --ready")]
    Ready,
    #[error("{:?}: {}", .0.code(), .0.message())]
    Rpc(tonic::Status),
}

/// Without `stores`, doctor leaves out its comparisons of each store with the ledger (they
/// read every reservation and record: status would grow with the node); the status line says
/// so, and the `divergence:` line gives what the last reconcile found.
async fn doctor_count(
    client: &mut AdminClient<Channel>,
    stores: bool,
) -> Result<(usize, usize), tonic::Status> {
    let reply = client
        .doctor(DoctorRequest {
            protocol_version: dipam_proto::PROTOCOL_VERSION,
            skip_stores: !stores,
        })
        .await?
        .into_inner();
    Ok((
        reply.checks.len(),
        reply.checks.iter().filter(|c| !c.ok).count(),
    ))
}

fn to_json(s: &StatusReply) -> Value {
    json!({
        "ready": s.ready,
        "notReady": s.not_ready,
        "daemonVersion": s.daemon_version,
        "protocol": {"daemon": s.protocol_version, "daemonMin": s.min_protocol_version, "client": dipam_proto::PROTOCOL_VERSION, "plugins": s.plugin_protocols},
        "socket": s.socket,
        "stateDir": s.state_dir,
        "attachments": s.attachments,
        "uptimeSeconds": s.uptime_seconds,
        "conflist": s.conflist,
        "conflictsDetected": s.conflicts_detected,
        "divergence": {"missing": s.divergence_missing, "orphans": s.divergence_orphans, "unrecordedAlive": s.divergence_unrecorded_alive},
        "gc": {"freed": s.gc_freed, "refused": s.gc_refused},
        "agentReestablished": s.agent_reestablished,
        "warmPool": {
            "size": s.warm_pool, "target": s.warm_pool, "minimum": s.pool_minimum,
            "maxAbove": s.pool_max_above, "releaseAfterMs": s.pool_release_after_ms,
            "hits": s.pool_hits, "misses": s.pool_misses,
            "bypassed": s.pool_bypassed,
            "pools": s.pools.iter().map(|p| json!({
                "network": p.network, "configDigest": p.config_digest,
                "ready": p.ready, "target": p.target, "hits": p.hits,
                "misses": p.misses, "refillFailures": p.refill_failures,
                "lastError": p.last_error, "source": p.source,
                "inUse": p.in_use, "refills": p.refills, "releases": p.releases,
                "rescues": p.rescues, "rangeShort": p.range_short,
                "rangeFree": (p.range_free >= 0).then_some(p.range_free),
            })).collect::<Vec<_>>(),
        },
        "delegates": s.delegates.iter().map(|d| json!({"type": d.r#type, "path": d.path, "supportedVersions": d.supported_versions})).collect::<Vec<_>>(),
        "teardown": {
            "by": s.teardown, "deleted": s.teardown_deleted,
            "failures": s.teardown_failures, "lastError": s.teardown_last_error,
        },
        "privilegeFailures": {
            "count": s.privilege_failures, "lastError": s.privilege_last_error,
        },
        "runtimeGc": s.runtime_gc.as_ref().map(|r| {
            let (at, at_ms) = dipam_shim::l1_leaves::clock::json_time(dipam_shim::l1_leaves::clock::ms_or_secs(r.last_pass_at_ms, r.last_pass_at));
            json!({
                "endpoint": r.endpoint, "passes": r.passes, "freed": r.freed,
                "refusing": r.refusing, "refusingDetail": r.refusing_detail,
                "refusals": r.refusals, "sandboxes": r.sandboxes, "pending": r.pending,
                "keptGrace": r.kept_grace, "lastPassAt": at, "lastPassAtMs": at_ms,
            })
        }),
        "ranges": s.ranges.iter().map(range_json).collect::<Vec<_>>(),
        "spool": s.spool.as_ref().map(|p| json!({
            "dir": p.dir, "pointer": p.pointer, "depth": p.depth,
            "quarantined": p.quarantined, "untrusted": p.untrusted,
            "unpublished": p.unpublished, "mismatched": p.mismatched,
            "inherited": p.inherited,
        })),
    })
}

/// One range: what is not known is `null`, never 0.
fn range_json(r: &RangeStatus) -> Value {
    json!({
        "network": r.network, "family": r.family, "size": r.size,
        "allocated": allocated(r), "pods": r.pods, "agent": r.agent, "pool": r.pool,
        "orphans": r.orphans, "free": r.free, "ranges": r.ranges,
        "sizeUnknown": (!r.unknown.is_empty()).then_some(&r.unknown),
        "counted": (!r.counted.is_empty()).then_some(&r.counted),
    })
}

/// Addresses held in the delegate's store (or, where it cannot be read, recorded).
fn allocated(r: &RangeStatus) -> u64 {
    r.pods + r.agent + r.pool + r.orphans.unwrap_or(0)
}

/// A count of addresses as an operator reads it: an IPv6 /64 holds 2^64 - 2 addresses a
/// pod can get, which printed whole (18446744073709551614) reads as noise. Counts past
/// 2^32 are written as the power of two they sit just under, or rounded.
fn count(n: u64) -> String {
    if n < 1 << 32 {
        return n.to_string();
    }
    let bits = 64 - n.leading_zeros();
    let gap = (1u128 << bits) - u128::from(n);
    match gap {
        0 => format!("2^{bits}"),
        1..=16 => format!("2^{bits}-{gap}"),
        // Just above a power of two (a /63 less its reserved addresses is below 2^64 too).
        _ if n.is_power_of_two() => format!("2^{}", bits - 1),
        _ => format!("~{:.2e}", n as f64),
    }
}

/// `net1 ipv4: 5/253 allocated (3 pods, 1 agent, 0 pool, 1 orphan), 248 free; 10.1.0.2-10.1.0.254`
fn range_line(r: &RangeStatus) -> String {
    let held = match r.size {
        Some(size) => format!("{}/{} allocated", allocated(r), count(size)),
        None => format!("{} allocated", allocated(r)),
    };
    let mut who = format!("{} pod, {} agent, {} pool", r.pods, r.agent, r.pool);
    if let Some(o) = r.orphans {
        who.push_str(&format!(", {o} orphan"));
    }
    let mut line = format!("{} {}: {held} ({who})", r.network, r.family);
    if let Some(free) = r.free {
        line.push_str(&format!(", {} free", count(free)));
    }
    if r.size.is_some() {
        line.push_str(&format!("; {}", r.ranges.join(", ")));
    } else {
        line.push_str(&format!("; size unknown: {}", r.unknown));
    }
    // Counted from the ledger, a range's free addresses include the store's orphans, which
    // only a read of the store finds: say so where the count is.
    if r.counted == "ledger" && r.size.is_some() {
        line.push_str(" (as the ledger records them; orphans: --stores)");
    }
    line
}

fn table(s: &StatusReply, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "ready:        {}",
        if s.ready {
            "yes".to_string()
        } else {
            format!("no ({})", s.not_ready.join("; "))
        }
    )?;
    writeln!(
        out,
        "daemon:       dipamd {} (protocol v{}, serves v{}+; this client v{})",
        s.daemon_version,
        s.protocol_version,
        s.min_protocol_version,
        dipam_proto::PROTOCOL_VERSION
    )?;
    if !s.plugin_protocols.is_empty() {
        writeln!(
            out,
            "plugins:      protocol {} seen since start",
            s.plugin_protocols
                .iter()
                .map(|v| format!("v{v}"))
                .collect::<Vec<_>>()
                .join(", ")
        )?;
    }
    writeln!(out, "socket:       {}", s.socket)?;
    writeln!(out, "state dir:    {}", s.state_dir)?;
    writeln!(out, "attachments:  {}", s.attachments)?;
    if let Some(p) = &s.spool {
        spool(p, out)?;
    }
    if !s.conflist.is_empty() {
        writeln!(out, "conflist:     {}", s.conflist)?;
    }
    outcomes(s, out)?;
    if s.warm_pool > 0 || s.pool_minimum > 0 || !s.pools.is_empty() {
        warm_pool(s, out)?;
    }
    writeln!(
        out,
        "veths:        deleted by {}; {} deleted, {} failed{}",
        s.teardown,
        s.teardown_deleted,
        s.teardown_failures,
        if s.teardown_last_error.is_empty() {
            String::new()
        } else {
            format!(" (last: {})", s.teardown_last_error)
        }
    )?;
    writeln!(
        out,
        "privileges:   {} operation(s) not permitted{}",
        s.privilege_failures,
        if s.privilege_last_error.is_empty() {
            String::new()
        } else {
            format!(" (last: {})", s.privilege_last_error)
        }
    )?;
    writeln!(out, "uptime:       {}s", s.uptime_seconds)?;
    for d in &s.delegates {
        writeln!(
            out,
            "delegate:     {} at {} (CNI {})",
            d.r#type,
            d.path,
            d.supported_versions.join(", ")
        )?;
    }
    Ok(())
}

/// What dipamd found and did: conflicts, divergence, ranges, GC and the runtime GC.
fn outcomes(s: &StatusReply, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "conflicts:    {} refused, {} agent addresses re-established",
        s.conflicts_detected, s.agent_reestablished
    )?;
    writeln!(
        out,
        "divergence:   {} recorded address(es) missing from the delegate's store, \
         {} orphaned reservation(s) (unrecorded, unused), {} unrecorded in use (kept)",
        s.divergence_missing, s.divergence_orphans, s.divergence_unrecorded_alive
    )?;
    for r in &s.ranges {
        writeln!(out, "range:        {}", range_line(r))?;
    }
    writeln!(
        out,
        "gc:           {} freed, {} refused",
        s.gc_freed, s.gc_refused
    )?;
    if let Some(r) = &s.runtime_gc {
        writeln!(
            out,
            "runtime gc:   {}: {} pass(es), {} freed, {} refused; last pass: {} sandbox(es), \
             {} missed once, {} kept by grace",
            r.endpoint, r.passes, r.freed, r.refusals, r.sandboxes, r.pending, r.kept_grace
        )?;
        if !r.refusing.is_empty() {
            writeln!(out, "  refusing ({}): {}", r.refusing, r.refusing_detail)?;
        }
    }
    Ok(())
}

fn spool(p: &SpoolStatus, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "spool:        {} ({} DEL(s) waiting, {} quarantined since start; \
         published in {})",
        p.dir, p.depth, p.quarantined, p.pointer
    )?;
    for problem in [&p.untrusted, &p.unpublished]
        .into_iter()
        .filter(|x| !x.is_empty())
    {
        writeln!(out, "  problem: {problem}")?;
    }
    for m in &p.mismatched {
        writeln!(
            out,
            "  mismatch: network {m} names a spoolDir dipamd does not drain \
             (the plugin ignores it)"
        )?;
    }
    for i in &p.inherited {
        writeln!(out, "  inherited: {i} (a previous dipamd's spool)")?;
    }
    Ok(())
}

fn warm_pool(s: &StatusReply, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "warm pool:    target {} per network (minimum {}, up to {} above on demand, \
         surplus released after {} s); {} ADDs served from it, {} found it empty, \
         {} bypassed it (own addresses)",
        s.warm_pool,
        s.pool_minimum,
        s.pool_max_above,
        s.pool_release_after_ms as f64 / 1000.0,
        s.pool_hits,
        s.pool_misses,
        s.pool_bypassed
    )?;
    for p in &s.pools {
        writeln!(
            out,
            "  {}: {}/{} ready, {} in use, {} made, {} released, {} rescued{} \
             (config {}, from {}){}",
            p.network,
            p.ready,
            p.target,
            p.in_use,
            p.refills,
            p.releases,
            p.rescues,
            match (p.range_free, p.range_short) {
                (f, true) => format!("; range has {f} free, below the target: not refilling"),
                (f, false) if f >= 0 => format!("; {f} free in the range"),
                _ => String::new(),
            },
            p.config_digest.get(..12).unwrap_or(&p.config_digest),
            if p.source.is_empty() {
                "an older config: releasing"
            } else {
                p.source.as_str()
            },
            if p.refill_failures > 0 {
                format!(
                    "; refill failed {} time(s), retrying: {}",
                    p.refill_failures, p.last_error
                )
            } else {
                String::new()
            }
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::count;

    #[test]
    fn counts_read_as_an_operator_would() {
        assert_eq!(count(253), "253");
        assert_eq!(count((1 << 32) - 1), "4294967295");
        // An IPv6 /64 less host-local's two reserved addresses.
        assert_eq!(count(u64::MAX - 1), "2^64-2");
        assert_eq!(count(u64::MAX), "2^64-1");
        assert_eq!(count(1 << 40), "2^40");
        assert_eq!(count((1 << 40) - 2), "2^40-2");
        assert_eq!(count((1 << 40) + 12345), "~1.10e12");
    }
}
