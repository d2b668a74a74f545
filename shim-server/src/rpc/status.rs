//! STATUS: ready when the ledger is open (it is, or dipamd would not serve), the delegate binary
//! is present and answered VERSION, and the delegate's own STATUS passes where it has one
//! (spec §2.8: a plugin that depends on a delegated IPAM MUST send it STATUS).

use dipam_proto::v1::CniRequest;
use dipam_state::Store;
use rscni_types::version::SpecVersion;

use crate::{error::ShimError, shim::Shim};

pub async fn run<S: Store>(shim: &Shim<S>, req: CniRequest) -> Result<Vec<u8>, ShimError> {
    let p = shim.prepare(req, false)?;
    // The agent's addresses are part of readiness: until they are established a pod could be
    // handed one of them by a second allocator, and the agent cannot run.
    let missing = shim.agent.not_ready();
    if !missing.is_empty() {
        return Err(ShimError::NotReady { missing });
    }
    let probe = match shim.exec.probe(&p.dc.kind, &p.req.cni_path).await {
        Ok(probe) => probe,
        Err(e) => {
            return Err(ShimError::NotReady {
                missing: vec![format!("{e}")],
            });
        }
    };
    if probe.supported.is_empty() {
        return Err(ShimError::NotReady {
            missing: vec![format!(
                "delegate {} at {} did not answer VERSION",
                p.dc.kind,
                probe.path.display()
            )],
        });
    }
    if probe.supported.contains(&SpecVersion::new(1, 1, 0)) {
        let stdin = p.dc.bytes_for(None)?;
        shim.run_delegate(&p, &probe, "STATUS", stdin).await?;
    }
    Ok(Vec::new())
}
