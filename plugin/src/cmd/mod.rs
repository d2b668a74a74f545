//! One module per CNI verb. In IPAM mode every verb but VERSION is a plain forward to dipamd.
//! In main mode ADD, DEL and CHECK also build, remove and verify the pod's datapath
//! (crate::datapath) around that forward; GC and STATUS stay plain forwards.

pub mod add;
pub mod check;
pub mod del;
pub mod gc;
pub mod status;
pub mod version;

use dipam_proto::v1::{CniRequest, Mode as WireMode, RetiredLink};
use rscni_types::types::Cmd;

use crate::{
    client,
    conf::{Mode, PluginConf},
    datapath::Attachment,
    env::CmdArgs,
    error::PluginError,
    retry::Budget,
};

/// How long a STATUS waits for a dipamd that does not serve and that no process is starting
/// or draining: the gap between one dipamd's exit and the next one's first step, which holds
/// the creation of its process (a container's, in a DaemonSet): up to 5.0 s seen on a loaded
/// 2-CPU node, where a 5 s bound failed a STATUS mid-upgrade.
const STATUS_WAIT: std::time::Duration = std::time::Duration::from_secs(15);

/// Everything a verb needs: the validated environment and config, and the raw stdin.
pub struct Ctx<'a> {
    pub args: &'a CmdArgs,
    pub conf: &'a PluginConf,
    pub stdin: &'a [u8],
    pub request_id: &'a str,
    /// When this plugin process started (Unix ms): dipamd orders a key's operations by it.
    pub issued_at_ms: u64,
    /// The same instant on a clock that does not step: what dipamd actually orders by.
    pub issued_at: Option<dipam_proto::v1::BootStamp>,
}

impl Ctx<'_> {
    /// The attachment this call is about (main mode's datapath key).
    pub fn attachment(&self) -> Attachment<'_> {
        Attachment {
            network: &self.conf.name,
            container_id: &self.args.container_id,
            ifname: &self.args.ifname,
        }
    }

    /// Sends this call to dipamd unchanged (CNI over RPC) and returns what it answered.
    pub fn forward(&self) -> Result<Vec<u8>, PluginError> {
        self.forward_as(self.args.command)
    }

    /// Sends this call's config and environment to dipamd as `command`: a main-mode ADD that
    /// fails after IPAM rolls back with a DEL of the same attachment (spec §4).
    pub fn forward_as(&self, command: Cmd) -> Result<Vec<u8>, PluginError> {
        self.forward_with(command, None).map(|a| a.result)
    }

    /// [`Self::forward_as`], returning all of dipamd's answer; for a main-mode DEL that
    /// retired the pod's host veth, also hands its deletion to dipamd (`retired_link_taken`
    /// is false when spooled, or from a dipamd that cannot: the caller then deletes it).
    pub fn forward_with(
        &self,
        command: Cmd,
        retired_link: Option<RetiredLink>,
    ) -> Result<client::Answer, PluginError> {
        let req = self.request(command, retired_link);
        let mut budget = Budget::new(self.conf.timeout);
        // A STATUS waits, within the deadline, for as long as a dipamd is starting or
        // draining (it holds the socket's lock), and 15 s past the last sign of one: a runtime
        // asks it on every status poll (containerd 2 for each of kubelet's), a failure marks
        // the node's network not ready, and a loaded node's start took 6.4 s (a fixed 5 s
        // failed it); but one blocked for the deadline on a dipamd that stays down blocks
        // the runtime's own status answer (CRI-O's then timed out), and "not ready" soon is
        // the right answer there.
        if command == Cmd::Status {
            budget = budget.retrying_for(STATUS_WAIT);
        }
        if command != Cmd::Del {
            return client::call_reply(&self.conf.socket, budget, command, req);
        }
        // A DEL is not waited for while the spool can take it: a spooled DEL is as certain
        // as an answered one (every dipamd drains the spool before it serves anything), and
        // the runtime's teardown goes on at once. Only a DEL the spool cannot take waits for
        // dipamd to serve again, within the deadline.
        let e = match client::call_reply(&self.conf.socket, budget.once(), command, req.clone()) {
            Err(e) if e.daemon_unreachable() => e,
            other => return other,
        };
        let spooled = || {
            let mut spooled = req.clone();
            spooled.retired_link = None;
            spooled
        };
        let refused = match self.spool(spooled(), &e) {
            Ok(answer) => return Ok(answer),
            Err(refused) => refused,
        };
        if !e.dipamd_may_serve_again() {
            return Err(refused);
        }
        match client::call_reply(&self.conf.socket, budget, command, req.clone()) {
            // A dipamd that started meanwhile may have published its spool already.
            Err(e) if e.daemon_unreachable() => self.spool(spooled(), &e),
            other => other,
        }
    }

    /// A main-mode ADD: the result as early as dipamd has it (client::call_add_early).
    pub fn forward_add_early(&self) -> Result<client::Early, PluginError> {
        client::call_add_early(
            &self.conf.socket,
            Budget::new(self.conf.timeout),
            self.request(Cmd::Add, None),
        )
    }

    /// This call's config and environment as a request for `command`.
    fn request(&self, command: Cmd, retired_link: Option<RetiredLink>) -> CniRequest {
        CniRequest {
            protocol_version: dipam_proto::PROTOCOL_VERSION,
            request_id: self.request_id.to_owned(),
            command: <&str>::from(command).to_owned(),
            container_id: self.args.container_id.clone(),
            netns: self.args.netns.clone(),
            ifname: self.args.ifname.clone(),
            cni_args: self.args.args.clone(),
            cni_path: self.args.path.clone(),
            stdin: self.stdin.to_vec(),
            mode: match self.conf.mode {
                Mode::Ipam => WireMode::Ipam,
                Mode::Main => WireMode::Main,
            } as i32,
            issued_at_ms: self.issued_at_ms,
            issued_at: self.issued_at.clone(),
            retired_link,
        }
    }

    /// dipamd is down (or died mid-call): the release must not be lost, and the runtime may
    /// not retry, so the DEL is spooled durably for dipamd to replay, and DEL succeeds; but
    /// only into the spool the dipamd of this socket published (crate::spool). Otherwise the
    /// DEL fails with code 11 and the runtime retries it.
    fn spool(&self, req: CniRequest, cause: &PluginError) -> Result<client::Answer, PluginError> {
        match crate::spool::write(&self.conf.socket, self.conf.spool_dir.as_deref(), &req) {
            Ok(spooled) => {
                if let Some(w) = &spooled.warning {
                    eprintln!("dipam: {w}");
                }
                eprintln!(
                    "dipam: {cause}; DEL spooled to {} for dipamd to replay",
                    spooled.path.display()
                );
                Ok(client::Answer::default())
            }
            Err(reason) => Err(PluginError::Spool {
                socket: self.conf.socket.clone(),
                reason,
                unreachable: cause.to_string(),
            }),
        }
    }
}
