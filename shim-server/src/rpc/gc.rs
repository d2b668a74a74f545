//! GC: forwarded to delegates that implement CNI 1.1 GC, with every attachment dipamd has in
//! flight added to the valid list so that a GC racing an ADD never frees its address.

use dipam_proto::v1::CniRequest;
use dipam_state::Store;
use rscni_types::version::SpecVersion;
use serde_json::{Value, json};
use tracing::info;

use crate::{error::ShimError, shim::Shim};

pub async fn run<S: Store>(shim: &Shim<S>, req: CniRequest) -> Result<Vec<u8>, ShimError> {
    let mut p = shim.prepare(req, false)?;
    // An absent or null list would tell the delegate that nothing is valid (cnitool sends
    // none meaning "GC everything"); refuse rather than free every address on the node.
    let Some(mut valid) =
        p.dc.conf
            .get("cni.dev/valid-attachments")
            .or_else(|| p.dc.conf.get("cni.dev/attachments"))
            .and_then(Value::as_array)
            .cloned()
    else {
        return Err(ShimError::Config {
            msg: "GC without a valid-attachments list refused".into(),
            details: "cni.dev/valid-attachments is absent or null; dipamd will not free every \
                      attachment of the network on that basis"
                .into(),
        });
    };
    let (probe, _) = shim.resolve(&p.dc, &p.req.cni_path).await?;
    let gc = SpecVersion::new(1, 1, 0);
    if !probe.supported.contains(&gc) {
        info!(delegate = %p.dc.kind, "delegate does not implement GC; nothing forwarded");
        return Ok(Vec::new());
    }
    let network = p.dc.network.clone();
    for key in shim.locks.in_flight() {
        if key.network == network {
            valid.push(json!({"containerID": key.container_id, "ifname": key.ifname}));
        }
    }
    p.dc.conf["cni.dev/valid-attachments"] = Value::Array(valid.clone());
    p.dc.conf["cni.dev/attachments"] = Value::Array(valid);
    let stdin = p.dc.bytes_for(None)?;
    shim.run_delegate(&p, &probe, "GC", stdin).await?;
    Ok(Vec::new())
}
