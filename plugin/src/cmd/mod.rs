//! One module per CNI verb. In IPAM mode every verb but VERSION is a plain forward to dipamd.

pub mod add;
pub mod check;
pub mod del;
pub mod gc;
pub mod status;
pub mod version;

use dipam_proto::v1::{CniRequest, Mode as WireMode};

use crate::{
    client,
    conf::{Mode, PluginConf},
    env::CmdArgs,
    error::PluginError,
};

/// Everything a verb needs: the validated environment and config, and the raw stdin.
pub struct Ctx<'a> {
    pub args: &'a CmdArgs,
    pub conf: &'a PluginConf,
    pub stdin: &'a [u8],
    pub request_id: &'a str,
}

impl Ctx<'_> {
    /// Sends this call to dipamd unchanged (CNI over RPC) and returns what it answered.
    pub fn forward(&self) -> Result<Vec<u8>, PluginError> {
        let req = CniRequest {
            protocol_version: dipam_proto::PROTOCOL_VERSION,
            request_id: self.request_id.to_owned(),
            command: <&str>::from(self.args.command).to_owned(),
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
        };
        client::call(&self.conf.socket, self.conf.timeout, self.args.command, req)
    }

    /// The pod datapath (veth, addresses, routes) belongs to main-plugin mode; until this
    /// build has it, say so rather than return an IPAM-only result to the runtime.
    pub fn require_ipam_mode(&self) -> Result<(), PluginError> {
        match self.conf.mode {
            Mode::Ipam => Ok(()),
            Mode::Main => Err(PluginError::Config {
                msg: "dipam as the main plugin is not supported by this build".into(),
                details: "use dipam as the IPAM of a main plugin: \
                          {\"type\":\"ptp\",\"ipam\":{\"type\":\"dipam\",\"delegate\":{...}}}"
                    .into(),
            }),
        }
    }
}
