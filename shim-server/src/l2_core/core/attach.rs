//! The ADD flow for any owner (a runtime's pod, a warm-pool entry, the agent's addresses):
//! refuse a stale ADD, answer a repeated one from the ledger, write the intent, run the
//! delegate, take up its result and commit it, or roll back.
//!
//! Crash safety: the record is written in state `adding` (durably) before the delegate reads
//! its config, so a daemon killed at any point leaves a trace that the next start turns into
//! a delegate DEL (replay/interrupted.rs). The result is committed durably before the plugin may
//! use it: a main-mode plugin (AddEarly) gets it while the commit runs, to configure the pod
//! meanwhile, but prints it only once the stream's last reply says the commit is done
//! ([`Early`]).

use dipam_state::{AttachmentRecord, AttachmentState, Durability, Owner};
use tokio::sync::oneshot;
use tracing::{debug, info, warn};

use super::{Core, Prepared};
use crate::{
    l1_leaves::clock::now, l1_leaves::error::ShimError, l2_core::delegate::Gated,
    l2_core::delegate::version,
};

/// Where a fresh ADD result goes the moment it is known, before its commit, for an AddEarly
/// stream (service.rs): the plugin's netlink work then overlaps the commit's fdatasync
/// (~0.5 ms of every main-mode ADD, docs/performance.md). A fresh result (the delegate's, or
/// a warm pool entry's before the take's commit) goes here; a replayed answer is durable
/// already and is simply the stream's one reply. Empty for a plain ADD.
///
/// It also knows whether the ADD's requester still waits for its answer ([`Self::watched`]):
/// an ADD runs to its end in a task of its own whoever leaves (service.rs), and one whose
/// plugin left is then rolled back (rpc/add/mod.rs).
#[derive(Debug, Default)]
pub struct Early {
    tx: Option<oneshot::Sender<Vec<u8>>>,
    /// Whether the stream had a sender: once it is gone, a result was offered.
    stream: bool,
    /// Alive while the requester waits; `None`: dipamd's own ADD, which no one leaves.
    requester: Option<std::sync::Weak<()>>,
}

impl Early {
    /// An AddEarly stream's sender.
    pub fn to(tx: oneshot::Sender<Vec<u8>>) -> Self {
        Self {
            tx: Some(tx),
            stream: true,
            requester: None,
        }
    }

    /// The same, for an ADD whose requester waits while `waiting` lives.
    pub fn watched(mut self, waiting: &std::sync::Arc<()>) -> Self {
        self.requester = Some(std::sync::Arc::downgrade(waiting));
        self
    }

    /// Whether the requester left before its answer (its plugin was killed, or its
    /// runtime's timeout passed).
    pub fn requester_left(&self) -> bool {
        self.requester
            .as_ref()
            .is_some_and(|w| w.strong_count() == 0)
    }

    /// Whether a result went out early: the plugin may have wired the pod with it.
    pub fn offered(&self) -> bool {
        self.stream && self.tx.is_none()
    }

    /// Hands `result` to the AddEarly stream, if this ADD is one (at most once).
    pub fn offer(&mut self, result: &[u8]) {
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(result.to_vec());
        }
    }

    /// The sender, for a step that offers its result off this task (the warm pool's take,
    /// between its checks and its commit on the blocking pool); [`Self::restore`] gives an
    /// unused one back.
    pub fn take(&mut self) -> Option<oneshot::Sender<Vec<u8>>> {
        self.tx.take()
    }

    /// Puts back a sender [`Self::take`] took and did not use.
    pub fn restore(&mut self, tx: Option<oneshot::Sender<Vec<u8>>>) {
        if tx.is_some() {
            self.tx = tx;
        }
    }
}

/// A successful ADD: the result in the request's version, and whether it was answered from
/// the ledger (a repeated ADD; CniReply.replayed).
#[derive(Debug)]
pub struct Added {
    pub result: Vec<u8>,
    pub replayed: bool,
}

/// The ADD flow for any owner (a runtime's pod, the warm pool's entries, the agent's own
/// addresses). The caller holds the key's lock. Returns the result rendered in the request's
/// version.
pub async fn attach(
    core: &Core,
    p: &Prepared,
    owner: Owner,
    early: &mut Early,
) -> Result<Added, ShimError> {
    core.refuse_stale(p)?;
    p.dc.check_for_add()?;
    let digest = p.dc.digest();
    if let Some(result) = replay_or_finish(core, p, &digest).await? {
        return Ok(Added {
            result,
            replayed: true,
        });
    }
    let (probe, send) = core.resolve(&p.dc, &p.req.cni_path).await?;
    let stdin = p.dc.bytes_for(send)?;
    let rec = intent(p, &owner, Core::effective(&p.dc, send), &stdin, digest);
    let (rec, rendered, out) = exec_and_commit(core, p, &probe, stdin, rec, early).await?;
    core.committed(&rec);
    // At debug: a runtime's ADD gets its one info line, with the same IPs, from the service.
    debug!(
        key = %p.key,
        delegate = %p.dc.kind,
        ips = ?crate::l2_core::delegate::config::result_ips(rec.result.as_ref().unwrap_or(&serde_json::Value::Null)),
        delegate_ms = crate::l1_leaves::clock::log_ms(out.elapsed),
        "attachment added"
    );
    Ok(Added {
        result: rendered,
        replayed: false,
    })
}

/// What the ledger already holds for the key: the answer to a repeated ADD (`Some`), a
/// refusal, or nothing left to stand in the way (`None`: an interrupted operation is finished
/// first).
async fn replay_or_finish(
    core: &Core,
    p: &Prepared,
    digest: &str,
) -> Result<Option<Vec<u8>>, ShimError> {
    let Some(existing) = core.lookup(&p.key)? else {
        return Ok(None);
    };
    p.authorize(&existing, "ADD")?;
    match existing.state {
        AttachmentState::Committed if existing.config_digest == digest => {
            // A repeated ADD (a runtime retry after a timeout, F2): the same answer again,
            // without a second delegate ADD that host-local would refuse as a duplicate.
            info!(key = %p.key, "repeated ADD; answering from the ledger");
            let result = existing
                .result
                .ok_or_else(|| ShimError::Internal(format!("{} has no result", p.key)))?;
            let parsed = serde_json::from_value(result)
                .map_err(|e| ShimError::Internal(format!("recorded result: {e}")))?;
            version::render(p.dc.version, parsed).map(Some)
        }
        AttachmentState::Committed => Err(ShimError::ExistsWithOtherConfig {
            key: p.key.to_string(),
        }),
        AttachmentState::Adding | AttachmentState::Deleting => {
            // An earlier operation on this key was interrupted and its release failed;
            // finish that release before allocating again, so nothing is held twice.
            warn!(key = %p.key, state = existing.state.as_str(), "finishing an interrupted operation before ADD");
            core.release_recorded(&existing).await?;
            core.forget(&existing).await?;
            Ok(None)
        }
    }
}

/// The write-ahead intent of an ADD: the record in state `adding`, with everything needed to
/// release it through the delegate after a crash (the config sent, the environment).
fn intent(
    p: &Prepared,
    owner: &Owner,
    effective: rscni_types::version::SpecVersion,
    stdin: &[u8],
    digest: String,
) -> AttachmentRecord {
    let t = now();
    AttachmentRecord {
        key: p.key.clone(),
        owner: owner.clone(),
        state: AttachmentState::Adding,
        delegate_type: p.dc.kind.clone(),
        delegate_version: effective.to_string(),
        delegate_config: String::from_utf8_lossy(stdin).into_owned(),
        netns: p.req.netns.clone(),
        cni_args: p.req.cni_args.clone(),
        cni_path: p.req.cni_path.clone(),
        result: None,
        config_digest: digest,
        request_id: p.req.request_id.clone(),
        created_at: t,
        updated_at: t,
        issued_ms: p.req.issued_at_ms,
        issued_at: p.issued.clone(),
        delegate_key: None,
        creator_uid: p.caller.recorded_uid(),
        cri_pod: crate::l1_leaves::cri_args::for_record(owner, &p.key, &p.req.cni_args),
    }
}

/// Runs the delegate's ADD for the intent `rec` and commits its result; on any failure the
/// intent is rolled back (the allocation released when the delegate may hold one). Returns
/// the committed record, the bytes to answer, and the exec's output.
async fn exec_and_commit(
    core: &Core,
    p: &Prepared,
    probe: &crate::l2_core::delegate::Probe,
    stdin: Vec<u8>,
    rec: AttachmentRecord,
    early: &mut Early,
) -> Result<(AttachmentRecord, Vec<u8>, crate::l2_core::delegate::Output), ShimError> {
    let intent = rec.clone();
    // The intent is made durable while the delegate starts; it reads its config only after
    // (exec::run_gated): write-ahead without paying the commit and the exec in sequence.
    let gate = async {
        core.ledger(move |l| l.put(&intent)).await?;
        core.attachment_delta(&rec, 1);
        crate::l1_leaves::fault::hit("add-after-intent");
        Ok(())
    };
    // The result is taken up the moment the delegate has written it, while it is still
    // exiting (exec::collect): checked, rendered, offered to an AddEarly plugin and
    // committed, so that the commit overlaps the delegate's exit. The ADD succeeds only if
    // the delegate then exits 0 having written nothing else; otherwise it is rolled back like
    // a failed commit.
    let (peek, peeked) = oneshot::channel();
    let exec = core.run_delegate_gated(p, probe, "ADD", stdin, gate, Some(peek));
    let taken_early = async {
        let stdout = peeked.await.ok()?;
        // A CNI error is a JSON document too (spec §6: `code`, `msg`); it waits for the exit.
        let doc = serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&stdout);
        if doc.map_or(true, |d| d.contains_key("code")) {
            return None;
        }
        Some((take_up(core, p, &rec, &stdout, early).await, stdout))
    };
    let (out, taken_early) = tokio::join!(exec, taken_early);
    let out = match out {
        // The delegate never read its config: nothing to release, nothing written to undo.
        Gated::GateFailed(e) => return Err(e),
        Gated::Ran(Ok(out)) => out,
        Gated::Ran(Err(e)) => {
            // A delegate that wrote a result holds an address, whatever its exit says.
            let release =
                may_hold_allocation(&e) || taken_early.as_ref().is_some_and(|(t, _)| t.parsed());
            rollback(core, &rec, release).await;
            return Err(e);
        }
    };
    let bad_output = |exit: String| ShimError::DelegateBadOutput {
        kind: p.dc.kind.clone(),
        command: "ADD".into(),
        exit,
        stdout: crate::l1_leaves::error::excerpt(&out.stdout),
        stderr: crate::l1_leaves::error::excerpt(&out.stderr),
    };
    let taken = match taken_early {
        Some((taken, peeked)) if peeked.trim_ascii() == out.stdout.trim_ascii() => taken,
        // Offered, then contradicted: the plugin may be configuring the pod with a result
        // the delegate did not stand by.
        Some((taken, _)) if taken.parsed() => {
            TakenUp::Refused(bad_output("wrote more after its result".into()))
        }
        Some(_) | None => take_up(core, p, &rec, &out.stdout, early).await,
    };
    match taken {
        TakenUp::Committed(rec, rendered) => Ok((rec, rendered, out)),
        TakenUp::Refused(e) => {
            rollback(core, &rec, true).await;
            if matches!(e, ShimError::Conflict { .. }) {
                // Only now is the address free again for the owner that lost it.
                core.recheck_owners();
            }
            Err(e)
        }
        TakenUp::Unparsable(detail) => {
            rollback(core, &rec, true).await;
            Err(bad_output(format!(
                "exited 0 but its result does not parse ({detail})"
            )))
        }
    }
}

/// What became of a delegate's ADD stdout ([`take_up`]). Anything but `Committed` is rolled
/// back by the caller.
// One per ADD, moved a few times on its way out: boxing the record would add an allocation
// to every ADD for nothing.
#[allow(clippy::large_enum_variant)]
enum TakenUp {
    /// The committed record and the bytes to answer.
    Committed(AttachmentRecord, Vec<u8>),
    /// The stdout does not parse as a result (the detail).
    Unparsable(String),
    /// The result was refused (an address someone else holds, a version it cannot be
    /// rendered in), or its commit failed.
    Refused(ShimError),
}

impl TakenUp {
    /// Whether the stdout was a result: the delegate then holds an address.
    fn parsed(&self) -> bool {
        !matches!(self, Self::Unparsable(_))
    }
}

/// Takes up a delegate's ADD stdout for the intent `rec`: parses it, refuses addresses held by
/// someone else, renders it in the request's version, offers it to an AddEarly plugin and
/// commits the attachment.
async fn take_up(
    core: &Core,
    p: &Prepared,
    rec: &AttachmentRecord,
    stdout: &[u8],
    early: &mut Early,
) -> TakenUp {
    crate::l1_leaves::fault::hit("add-after-exec");
    let parsed = match version::parse_result(stdout) {
        Ok(parsed) => parsed,
        Err(detail) => return TakenUp::Unparsable(detail.to_string()),
    };
    let mut rec = rec.clone();
    rec.result = match serde_json::to_value(&parsed) {
        Ok(v) => Some(v),
        Err(e) => return TakenUp::Refused(ShimError::Internal(e.to_string())),
    };
    // An address that belongs to someone else in the ledger means two allocators share the
    // range, or the delegate's store was wiped (cilium#46799): refuse it, never hand it out.
    if let Err(e) = core.check_conflict(&rec).await {
        return TakenUp::Refused(e);
    }
    // And one that another attachment of the network holds (two allocators on one range):
    // refused the same way, before any plugin sees it.
    if let Err(e) = core.claim_addresses(&rec).await {
        return TakenUp::Refused(e);
    }
    rec.state = AttachmentState::Committed;
    rec.updated_at = now();
    // Rendered before the commit, so that a result that cannot be rendered is rolled back
    // rather than committed for a pod that never gets it.
    let rendered = match version::render(p.dc.version, parsed) {
        Ok(r) => r,
        Err(e) => return TakenUp::Refused(e),
    };
    early.offer(&rendered);
    if crate::l1_leaves::fault::armed("add-before-commit") {
        // The worst instant of an early answer: the plugin has had the result long enough to
        // configure the pod with it, and it is not durable yet.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    crate::l1_leaves::fault::hit("add-before-commit");
    let commit = rec.clone();
    // A pod's result needs to survive a dipamd kill, not a power cut (Durability::SurvivesProcessCrash):
    // the intent is on the disk, so a cut that loses this commit leaves `adding`, which the
    // next start releases through the delegate, and the pod died with the node. The agent's
    // addresses must outlive a reboot (the agent comes back expecting them): on the disk.
    let durability = match rec.owner {
        Owner::Pod => Durability::SurvivesProcessCrash,
        _ => Durability::SurvivesPowerCut,
    };
    if let Err(e) = core.ledger(move |l| l.put_with(&commit, durability)).await {
        return TakenUp::Refused(e);
    }
    crate::l1_leaves::fault::hit("add-after-commit");
    TakenUp::Committed(rec, rendered)
}

/// Whether a failed delegate ADD may have left a reservation behind. A well-formed CNI error
/// means the delegate refused cleanly (host-local releases its partial work itself); an exec
/// that never started holds nothing. A crash, a hang, garbage, or a message only on stderr
/// (a Go panic) may have reserved an address.
fn may_hold_allocation(e: &ShimError) -> bool {
    match e {
        ShimError::Delegate(f) => f.code == crate::l1_leaves::error::codes::DELEGATE_BAD_OUTPUT,
        ShimError::DelegateNotFound { .. } | ShimError::DelegateSpawn { .. } => false,
        _ => true,
    }
}

/// Undoes an ADD that will not be answered with success. With `release`, the delegate's
/// allocation is freed first; if that fails, the record stays (state `adding`) so that the
/// runtime's DEL or the next start frees it: never forgotten, never leaked.
async fn rollback(core: &Core, rec: &AttachmentRecord, release: bool) {
    if release && let Err(e) = core.release_recorded(rec).await {
        warn!(key = %rec.key, error = %e, "rollback DEL failed; keeping the record for the next DEL or restart");
        return;
    }
    if let Err(e) = core.forget(rec).await {
        warn!(key = %rec.key, error = %e, "could not drop the record of a failed ADD");
    }
}

/// Releases what a fresh ADD committed for a requester that left before its answer (its
/// plugin killed mid-ADD, or its runtime's timeout passed). No one got the result, so no pod
/// uses it, and a runtime that never DELs (its own caller gone too) would leak it. Under the
/// key's lock, through [`Core::release`]: marked `deleting` durably, released by
/// the delegate, forgotten, so that a dipamd killed at any point finishes it at its next
/// start, and a runtime's DEL meanwhile finds the record. An AddEarly result already offered
/// is left for the runtime's DEL: the plugin may have wired the pod with it.
pub async fn roll_back_unanswered(core: &Core, p: &Prepared) -> ShimError {
    let key = p.key.to_string();
    let released = match core.lookup(&p.key) {
        Ok(Some(rec)) => match core.release(&rec).await {
            Ok(()) => true,
            Err(e) => {
                warn!(%key, error = %e, "could not release the ADD of a plugin that left; its record stays for the runtime's DEL, GC or the next start");
                false
            }
        },
        Ok(None) => true,
        Err(e) => {
            warn!(%key, error = %e, "could not read the ADD of a plugin that left");
            false
        }
    };
    if released {
        warn!(%key, "the plugin left before its ADD was answered; released what the ADD allocated");
    }
    ShimError::RequesterLeft { key, released }
}
