//! The operator's RPCs (dipamctl): daemon status and the attachment listing.

use dipam_proto::v1::{
    Attachment, CniRequest, DelegateInfo, ExplainReply, ExplainRequest, GcReply, GcRequest,
    ListAttachmentsReply, ListAttachmentsRequest, Mode, StatusReply,
};

use crate::{
    delegate::config::result_ips,
    error::ShimError,
    gc::{self, Valid},
    node::Node,
};

pub async fn status(shim: &Node) -> Result<StatusReply, ShimError> {
    let mut not_ready = shim.agent.not_ready();
    // A ledger that cannot take commits (a full disk) fails every ADD and DEL: that is the
    // first thing status must say, and counting must not fail the whole report.
    if let Some(fault) = shim.ledger.store().fault() {
        not_ready.insert(0, fault);
    }
    let attachments = match shim.ledger(|l| l.count()).await {
        Ok(n) => n as u64,
        Err(e) => {
            not_ready.push(format!("cannot count the attachments: {e}"));
            0
        }
    };
    Ok(StatusReply {
        protocol_version: dipam_proto::PROTOCOL_VERSION,
        min_protocol_version: dipam_proto::MIN_PROTOCOL_VERSION,
        daemon_version: env!("CARGO_PKG_VERSION").into(),
        ready: not_ready.is_empty(),
        not_ready,
        conflicts_detected: shim
            .agent
            .conflicts
            .load(std::sync::atomic::Ordering::Relaxed),
        agent_reestablished: shim
            .agent
            .reestablished
            .load(std::sync::atomic::Ordering::Relaxed),
        divergence_missing: shim
            .gc_stats
            .missing
            .load(std::sync::atomic::Ordering::Relaxed),
        divergence_orphans: shim
            .gc_stats
            .orphans
            .load(std::sync::atomic::Ordering::Relaxed),
        gc_refused: shim
            .gc_stats
            .refused
            .load(std::sync::atomic::Ordering::Relaxed),
        gc_freed: shim
            .gc_stats
            .freed
            .load(std::sync::atomic::Ordering::Relaxed),
        warm_pool: shim.pool.size() as u32,
        pool_hits: shim.pool.hits.load(std::sync::atomic::Ordering::Relaxed),
        pool_misses: shim.pool.misses.load(std::sync::atomic::Ordering::Relaxed),
        pool_bypassed: shim
            .pool
            .bypassed
            .load(std::sync::atomic::Ordering::Relaxed),
        pools: shim.pool.status(),
        teardown_deleted: shim.teardown.get().map_or(0, |t| {
            t.stats.deleted.load(std::sync::atomic::Ordering::Relaxed)
        }),
        teardown_failures: shim.teardown.get().map_or(0, |t| {
            t.stats.failures.load(std::sync::atomic::Ordering::Relaxed)
        }),
        teardown_last_error: shim
            .teardown
            .get()
            .map(|t| t.stats.last_error())
            .unwrap_or_default(),
        teardown: crate::teardown::who(shim.teardown.get()),
        privilege_failures: shim.denials.count(),
        privilege_last_error: shim.denials.last(),
        spool: Some(crate::spool::drain::status(shim)),
        plugin_protocols: {
            let bits = shim
                .plugin_protocols
                .load(std::sync::atomic::Ordering::Relaxed);
            (0..64).filter(|v| bits & (1 << v) != 0).collect()
        },
        conflist: shim
            .agent
            .config
            .as_ref()
            .map(|c| c.source.to_string())
            .unwrap_or_default(),
        state_dir: shim.identity.state_dir.display().to_string(),
        socket: shim.identity.socket.display().to_string(),
        attachments,
        uptime_seconds: shim.started.elapsed().as_secs(),
        delegates: shim
            .exec
            .probed()
            .into_iter()
            .map(|p| DelegateInfo {
                r#type: p
                    .path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                path: p.path.display().to_string(),
                supported_versions: p.supported.iter().map(ToString::to_string).collect(),
            })
            .collect(),
    })
}

/// `dipamctl explain`: the container's ledger records and its recorded history. A warm-pool ID
/// also finds the pod its address went to (the delegate's executions are recorded under it).
pub async fn explain(shim: &Node, req: ExplainRequest) -> Result<ExplainReply, ShimError> {
    crate::validate::container_id(&req.container_id)?;
    let cid = req.container_id.clone();
    let (records, events) = shim
        .ledger(move |l| {
            let records: Vec<_> = l
                .list(None)?
                .into_iter()
                .filter(|r| r.key.container_id == cid || r.delegate_ids().0 == cid)
                .collect();
            Ok((records, crate::history::read(l, &cid)?))
        })
        .await?;
    let all = list_from(records, "");
    Ok(ExplainReply {
        protocol_version: dipam_proto::PROTOCOL_VERSION,
        attachments: all,
        events: events.iter().map(ToString::to_string).collect(),
        events_dropped: shim.history.get().map_or(0, crate::history::Sink::dropped),
    })
}

/// The ledger's attachments. Root and --admin-uid see all; another caller only those it
/// created (their netns paths and results are no one else's business).
pub async fn list(
    shim: &Node,
    caller: crate::access::Caller,
    req: ListAttachmentsRequest,
) -> Result<ListAttachmentsReply, ShimError> {
    use crate::validate::{bounded, limits};
    bounded(
        "the network filter",
        req.network.as_bytes(),
        limits::NETWORK,
        7,
    )?;
    bounded("the owner filter", req.owner.as_bytes(), limits::NAME, 7)?;
    let network = (!req.network.is_empty()).then(|| req.network.clone());
    let mut records = shim.ledger(move |l| l.list(network.as_deref())).await?;
    if !caller.admin {
        records.retain(|r| caller.owns(r.creator_uid));
    }
    Ok(ListAttachmentsReply {
        protocol_version: dipam_proto::PROTOCOL_VERSION,
        attachments: list_from(records, &req.owner),
    })
}

/// Ledger records as wire attachments, filtered by owner ("" for all; "agent" for every role;
/// "pool" for the warm pool's entries).
fn list_from(records: Vec<dipam_state::AttachmentRecord>, owner: &str) -> Vec<Attachment> {
    records
        .into_iter()
        .filter(|r| {
            owner.is_empty()
                || r.owner.label() == owner
                || r.owner.label().starts_with(&format!("{owner}:"))
        })
        .map(|r| Attachment {
            delegate_container_id: r
                .delegate_key
                .as_ref()
                .map(|d| d.container_id.clone())
                .unwrap_or_default(),
            delegate_ifname: r
                .delegate_key
                .as_ref()
                .map(|d| d.ifname.clone())
                .unwrap_or_default(),
            ips: r.result.as_ref().map(result_ips).unwrap_or_default(),
            result_json: r
                .result
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default(),
            network: r.key.network,
            container_id: r.key.container_id,
            ifname: r.key.ifname,
            owner: r.owner.label(),
            state: r.state.as_str().into(),
            delegate_type: r.delegate_type,
            config_digest: r.config_digest,
            netns: r.netns,
            created_at: r.created_at,
            updated_at: r.updated_at,
            creator_uid: r.creator_uid,
        })
        .collect()
}

/// `dipamctl gc`: one network, the operator's valid list or the ledger as the valid set, and
/// a dry run that frees nothing.
pub async fn gc(shim: &Node, req: GcRequest) -> Result<GcReply, ShimError> {
    let (stdin, mode) = if req.config.is_empty() {
        let base = shim
            .agent
            .config
            .as_ref()
            .ok_or_else(|| ShimError::Config {
                msg: "no network config to collect".into(),
                details: "pass the network's conflist (dipamctl gc --conflist FILE), or start \
                          dipamd with --conflist"
                    .into(),
            })?
            .source
            .load()
            .map_err(|m| ShimError::Config {
                msg: m.to_string(),
                details: String::new(),
            })?;
        (
            serde_json::to_vec(&base.request).map_err(|e| ShimError::Internal(e.to_string()))?,
            base.mode,
        )
    } else {
        let mode = Mode::try_from(req.mode).unwrap_or(Mode::Ipam);
        (req.config.clone(), mode)
    };
    let p = shim.prepare(
        CniRequest {
            protocol_version: req.protocol_version,
            request_id: "dipamctl-gc".into(),
            command: "GC".into(),
            stdin,
            mode: mode as i32,
            ..CniRequest::default()
        },
        false,
        crate::access::Caller::ROOT,
    )?;
    let valid = if req.use_ledger {
        Valid::Ledger
    } else {
        // dipamctl checked the file; any local root process may call this RPC, so the entries
        // are checked again, by the same rule as a runtime's list.
        let entries = serde_json::Value::Array(
            req.valid
                .iter()
                .map(|a| serde_json::json!({"containerID": a.container_id, "ifname": a.ifname}))
                .collect(),
        );
        let list = gc::parse_list(&entries, "valid").map_err(|e| {
            shim.gc_stats
                .refused
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            shim.events.emit(crate::events::Event::GcRefused);
            ShimError::GcInput(e)
        })?;
        if list.is_empty() && !shim.gc.allow_empty {
            shim.gc_stats
                .refused
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            shim.events.emit(crate::events::Event::GcRefused);
            return Err(ShimError::GcRefused {
                network: p.dc.network.clone(),
                reason: "no valid attachments given, which would free every pod of the \
                         network; pass --valid FILE or --use-ledger"
                    .into(),
            });
        }
        Valid::List(list)
    };
    let network = p.dc.network.clone();
    match gc::collect::collect(shim, &p.dc, "", valid, req.dry_run, req.force).await {
        Ok(plan) => Ok(GcReply {
            protocol_version: dipam_proto::PROTOCOL_VERSION,
            network,
            items: plan.items,
            refused: String::new(),
            kept: plan.kept,
        }),
        Err(ShimError::GcRefused { reason, .. }) => Ok(GcReply {
            protocol_version: dipam_proto::PROTOCOL_VERSION,
            network,
            items: Vec::new(),
            refused: reason,
            kept: Vec::new(),
        }),
        Err(e) => Err(e),
    }
}
