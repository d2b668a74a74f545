//! ADD: record the intent, run the delegate, commit its result, answer in the config's version.
//!
//! Crash safety: the record is written in state `adding` (durably) before the delegate runs, so
//! a daemon killed at any point leaves a trace that the next start turns into a delegate DEL
//! (recovery.rs). The result is committed durably before the plugin may use it: a main-mode
//! plugin (AddEarly) gets it while the commit runs, to configure the pod meanwhile, but prints
//! it only once the stream's last reply says the commit is done ([`EARLY`]).

use dipam_proto::v1::CniRequest;
use dipam_state::{AttachmentRecord, AttachmentState, Durability, Owner, Store};
use tracing::{info, warn};

use crate::{
    clock::now,
    delegate::version,
    error::ShimError,
    shim::{Prepared, Shim},
};

tokio::task_local! {
    /// Set when this ADD was answered from the ledger (CniReply.replayed); read by the service
    /// once the handler is done (service.rs).
    pub static REPLAYED: std::cell::Cell<bool>;

    /// Set by AddEarly (service.rs): where a fresh result goes the moment it is known, before
    /// its commit, so that the plugin's netlink work overlaps the commit's fdatasync (~0.5 ms
    /// of every main-mode ADD, docs/performance.md). A fresh result (the delegate's, or a
    /// warm pool entry's before the take's commit) goes here; a replayed answer is durable
    /// already and is simply the stream's one reply.
    pub static EARLY: std::cell::RefCell<Option<tokio::sync::oneshot::Sender<Vec<u8>>>>;
}

/// Hands `result` to an AddEarly stream, if this ADD is one.
fn offer_early(result: &[u8]) {
    if let Some(tx) = take_early() {
        let _ = tx.send(result.to_vec());
    }
}

/// This AddEarly's sender, for a step that offers its result off this task (the warm pool's
/// take, between its checks and its commit on the blocking pool); [`restore_early`] gives an
/// unused one back.
pub(crate) fn take_early() -> Option<tokio::sync::oneshot::Sender<Vec<u8>>> {
    EARLY
        .try_with(|early| early.borrow_mut().take())
        .ok()
        .flatten()
}

/// Puts back a sender [`take_early`] took and did not use.
pub(crate) fn restore_early(tx: Option<tokio::sync::oneshot::Sender<Vec<u8>>>) {
    if let Some(tx) = tx {
        let _ = EARLY.try_with(|early| *early.borrow_mut() = Some(tx));
    }
}

pub async fn run<S: Store>(shim: &Shim<S>, req: CniRequest) -> Result<Vec<u8>, ShimError> {
    let p = shim.prepare(req, true)?;
    crate::keys::refuse_runtime("ADD", &p.req.container_id)?;
    if let Some(why) = shim
        .misconfigured
        .lock()
        .ok()
        .and_then(|m| m.get(&p.dc.network).cloned())
    {
        return Err(ShimError::Misconfigured {
            network: p.dc.network.clone(),
            why,
        });
    }
    let _guard = shim.locks.lock(&p.key).await;
    if !p.caller.is_root() {
        refuse_foreign_container_id(shim, &p).await?;
    }
    // With the warm pool on: one commit hands a ready entry to the pod, no delegate exec.
    if let Some(result) = crate::pool::take(shim, &p).await? {
        return Ok(result);
    }
    attach(shim, &p, Owner::Pod).await
}

/// Refuses a non-root caller's ADD under a container ID that another caller's attachment
/// uses, in any network. Delegates release by container ID (host-local frees every
/// reservation of that ID and ifname in its directory, azure-vnet-ipam keys by the ID
/// alone), and the caller chooses the delegate's config: its own attachment under a root
/// pod's ID, DELed with a config pointing at that pod's store, would free the pod's address.
/// Container IDs are not secret (`ps` shows them), so this is checked, not assumed.
async fn refuse_foreign_container_id<S: Store>(
    shim: &Shim<S>,
    p: &Prepared,
) -> Result<(), ShimError> {
    let cid = p.req.container_id.clone();
    let others = shim
        .ledger(move |l| {
            Ok(l.list(None)?
                .into_iter()
                .filter(|r| r.key.container_id == cid || r.delegate_ids().0 == cid)
                .collect::<Vec<_>>())
        })
        .await?;
    match others.iter().find(|r| !p.caller.owns(r.creator_uid)) {
        None => Ok(()),
        Some(r) => {
            warn!(uid = p.caller.uid, key = %p.key, other = %r.key, "refused: container ID in use by another caller");
            Err(ShimError::Forbidden {
                msg: format!(
                    "uid {} may not ADD under container ID {}: another caller's attachment \
                     uses it",
                    p.caller.uid,
                    crate::validate::shown(&p.req.container_id)
                ),
                details: "a non-root caller's container IDs must not be another caller's; \
                          nothing was allocated"
                    .into(),
            })
        }
    }
}

/// The ADD flow for any owner (a runtime's pod, or the agent's own addresses). The caller
/// holds the key's lock. Returns the result rendered in the request's version.
pub async fn attach<S: Store>(
    shim: &Shim<S>,
    p: &Prepared,
    owner: Owner,
) -> Result<Vec<u8>, ShimError> {
    let digest = p.dc.digest();
    // An ADD issued before a DEL of the same attachment that dipamd already processed (a slow
    // or retried plugin, F4): it must not bring the attachment back.
    // Ordered on the boot clock (order.rs): the wall clock steps.
    if let Some(del_issued) = shim.tombstone(&p.key)
        && crate::order::before(
            crate::order::from_wire(p.req.issued_at.as_ref()).as_ref(),
            Some(&del_issued),
        ) == Some(true)
    {
        return Err(ShimError::StaleAdd {
            key: p.key.to_string(),
        });
    }

    if let Some(existing) = shim.lookup(&p.key)? {
        p.authorize(&existing, "ADD")?;
        match existing.state {
            AttachmentState::Committed if existing.config_digest == digest => {
                // A repeated ADD (a runtime retry after a timeout, F2): the same answer again,
                // without a second delegate ADD that host-local would refuse as a duplicate.
                info!(key = %p.key, "repeated ADD; answering from the ledger");
                let _ = REPLAYED.try_with(|r| r.set(true));
                let result = existing
                    .result
                    .ok_or_else(|| ShimError::Internal(format!("{} has no result", p.key)))?;
                let parsed = serde_json::from_value(result)
                    .map_err(|e| ShimError::Internal(format!("recorded result: {e}")))?;
                return version::render(p.dc.version, parsed);
            }
            AttachmentState::Committed => {
                return Err(ShimError::ExistsWithOtherConfig {
                    key: p.key.to_string(),
                });
            }
            AttachmentState::Adding | AttachmentState::Deleting => {
                // An earlier operation on this key was interrupted and its release failed;
                // finish that release before allocating again, so nothing is held twice.
                warn!(key = %p.key, state = existing.state.as_str(), "finishing an interrupted operation before ADD");
                shim.release_recorded(&existing).await?;
                let key = p.key.clone();
                shim.ledger(move |l| l.remove(&key)).await?;
                shim.attachment_delta(&existing, -1);
            }
        }
    }

    let (probe, send) = shim.resolve(&p.dc, &p.req.cni_path).await?;
    let stdin = p.dc.bytes_for(send)?;
    let t = now();
    let rec = AttachmentRecord {
        key: p.key.clone(),
        owner: owner.clone(),
        state: AttachmentState::Adding,
        delegate_type: p.dc.kind.clone(),
        delegate_version: Shim::<S>::effective(&p.dc, send).to_string(),
        delegate_config: String::from_utf8_lossy(&stdin).into_owned(),
        netns: p.req.netns.clone(),
        cni_args: p.req.cni_args.clone(),
        cni_path: p.req.cni_path.clone(),
        result: None,
        config_digest: digest,
        request_id: p.req.request_id.clone(),
        created_at: t,
        updated_at: t,
        issued_ms: p.req.issued_at_ms,
        issued_at: crate::order::from_wire(p.req.issued_at.as_ref()),
        delegate_key: None,
        creator_uid: p.caller.recorded_uid(),
    };
    let intent = rec.clone();
    // The intent is made durable while the delegate starts; it reads its config only after
    // (exec::run_gated): write-ahead without paying the commit and the exec in sequence.
    let gate = async {
        shim.ledger(move |l| l.put(&intent)).await?;
        if shim.events.listened() {
            shim.events.emit(crate::events::Event::AttachmentDelta {
                network: &p.key.network,
                owner: &owner.label(),
                delta: 1,
            });
        }
        crate::fault::hit("add-after-intent");
        Ok(())
    };
    // The result is taken up the moment the delegate has written it, while it is still
    // exiting (exec::collect): checked, rendered, offered to an AddEarly plugin and
    // committed, so that the commit overlaps the delegate's exit. The ADD succeeds only if
    // the delegate then exits 0 having written nothing else; otherwise it is rolled back like
    // a failed commit.
    let (peek, peeked) = tokio::sync::oneshot::channel();
    let exec = shim.run_delegate_gated(p, &probe, "ADD", stdin, gate, Some(peek));
    let early = async {
        let stdout = peeked.await.ok()?;
        // A CNI error is a JSON document too (spec §6: `code`, `msg`); it waits for the exit.
        let doc = serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&stdout);
        if doc.map_or(true, |d| d.contains_key("code")) {
            return None;
        }
        Some((take_up(shim, p, &rec, &owner, &stdout).await, stdout))
    };
    let (out, early) = tokio::join!(exec, early);
    let out = match out? {
        Ok(out) => out,
        Err(e) => {
            // A delegate that wrote a result holds an address, whatever its exit says.
            let release = may_hold_allocation(&e) || matches!(early, Some((Ok(_), _)));
            rollback(shim, &rec, release).await;
            return Err(e);
        }
    };
    let bad_output = |exit: String| ShimError::DelegateBadOutput {
        kind: p.dc.kind.clone(),
        command: "ADD".into(),
        exit,
        stdout: crate::error::excerpt(&out.stdout),
        stderr: crate::error::excerpt(&out.stderr),
    };
    let taken = match early {
        Some((taken, peeked)) if peeked.trim_ascii() == out.stdout.trim_ascii() => taken,
        // Offered, then contradicted: the plugin may be configuring the pod with a result
        // the delegate did not stand by.
        Some((Ok(_), _)) => Ok(Err(bad_output("wrote more after its result".into()))),
        Some((Err(_), _)) | None => take_up(shim, p, &rec, &owner, &out.stdout).await,
    };
    let (rec, rendered) = match taken {
        Ok(Ok(taken)) => taken,
        Ok(Err(e)) => {
            rollback(shim, &rec, true).await;
            return Err(e);
        }
        Err(detail) => {
            rollback(shim, &rec, true).await;
            return Err(bad_output(format!(
                "exited 0 but its result does not parse ({detail})"
            )));
        }
    };
    shim.agent.note_committed(&rec);
    info!(
        key = %p.key,
        delegate = %p.dc.kind,
        ips = ?crate::delegate::config::result_ips(rec.result.as_ref().unwrap_or(&serde_json::Value::Null)),
        delegate_ms = out.elapsed.as_secs_f64() * 1e3,
        "attachment added"
    );
    Ok(rendered)
}

/// Takes up a delegate's ADD stdout for the intent `rec`: parses it, refuses addresses held by
/// someone else, renders it in the request's version, offers it to an AddEarly plugin and
/// commits the attachment. Returns the committed record and the bytes to answer. Outer
/// error: stdout does not parse as a result (the detail); inner: the result was refused, or
/// the commit failed. Either way the caller rolls back.
async fn take_up<S: Store>(
    shim: &Shim<S>,
    p: &Prepared,
    rec: &AttachmentRecord,
    owner: &Owner,
    stdout: &[u8],
) -> Result<Result<(AttachmentRecord, Vec<u8>), ShimError>, String> {
    crate::fault::hit("add-after-exec");
    let parsed = version::parse_result(stdout)?;
    let mut rec = rec.clone();
    rec.result = match serde_json::to_value(&parsed) {
        Ok(v) => Some(v),
        Err(e) => return Ok(Err(ShimError::Internal(e.to_string()))),
    };
    // An address that belongs to someone else in the ledger means two allocators share the
    // range, or the delegate's store was wiped (cilium#46799): refuse it, never hand it out.
    if let Err(e) = shim.check_conflict(&rec).await {
        return Ok(Err(e));
    }
    // And one that another attachment of the network holds (two allocators on one range):
    // refused the same way, before any plugin sees it.
    if let Err(e) = shim.claim_addresses(&rec).await {
        return Ok(Err(e));
    }
    rec.state = AttachmentState::Committed;
    rec.updated_at = now();
    // Rendered before the commit, so that a result that cannot be rendered is rolled back
    // rather than committed for a pod that never gets it.
    let rendered = match version::render(p.dc.version, parsed) {
        Ok(r) => r,
        Err(e) => return Ok(Err(e)),
    };
    offer_early(&rendered);
    if crate::fault::armed("add-before-commit") {
        // The worst instant of an early answer: the plugin has had the result long enough to
        // configure the pod with it, and it is not durable yet.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    crate::fault::hit("add-before-commit");
    let commit = rec.clone();
    // A pod's result needs to survive a dipamd kill, not a power cut (Durability::SurvivesProcessCrash):
    // the intent is on the disk, so a cut that loses this commit leaves `adding`, which the
    // next start releases through the delegate, and the pod died with the node. The agent's
    // addresses must outlive a reboot (the agent comes back expecting them): on the disk.
    let durability = match owner {
        Owner::Pod => Durability::SurvivesProcessCrash,
        _ => Durability::SurvivesPowerCut,
    };
    if let Err(e) = shim.ledger(move |l| l.put_with(&commit, durability)).await {
        return Ok(Err(e));
    }
    crate::fault::hit("add-after-commit");
    Ok(Ok((rec, rendered)))
}

/// Whether a failed delegate ADD may have left a reservation behind. A well-formed CNI error
/// means the delegate refused cleanly (host-local releases its partial work itself); an exec
/// that never started holds nothing. A crash, a hang, garbage, or a message only on stderr
/// (a Go panic) may have reserved an address.
fn may_hold_allocation(e: &ShimError) -> bool {
    match e {
        ShimError::Delegate(f) => f.code == crate::error::codes::DELEGATE_BAD_OUTPUT,
        ShimError::DelegateNotFound { .. } | ShimError::DelegateSpawn { .. } => false,
        _ => true,
    }
}

/// Undoes an ADD that will not be answered with success. With `release`, the delegate's
/// allocation is freed first; if that fails, the record stays (state `adding`) so that the
/// runtime's DEL or the next start frees it: never forgotten, never leaked.
async fn rollback<S: Store>(shim: &Shim<S>, rec: &AttachmentRecord, release: bool) {
    if release && let Err(e) = shim.release_recorded(rec).await {
        warn!(key = %rec.key, error = %e, "rollback DEL failed; keeping the record for the next DEL or restart");
        return;
    }
    let key = rec.key.clone();
    match shim.ledger(move |l| l.remove(&key)).await {
        Ok(()) => shim.attachment_delta(rec, -1),
        Err(e) => warn!(key = %rec.key, error = %e, "could not drop the record of a failed ADD"),
    }
}
