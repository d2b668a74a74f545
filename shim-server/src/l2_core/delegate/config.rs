//! The config a delegate receives, derived from the runtime's request.
//!
//! - IPAM mode (`{"type":"ptp","ipam":{"type":"dipam","delegate":{...}}}`): the request config
//!   with `ipam` replaced by the `delegate` object. Everything else (name, cniVersion,
//!   runtimeConfig, args, prevResult, capabilities) goes through as received.
//! - Main mode (`{"type":"dipam","ipam":{...}}`): the request config unchanged, as a main
//!   plugin hands it to its IPAM (spec §4).

use std::net::IpAddr;

use dipam_proto::v1::Mode;
use rscni_types::version::SpecVersion;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::l1_leaves::error::ShimError;

/// A request config turned into a delegate config.
#[derive(Debug, Clone)]
pub struct DelegateConf {
    /// The delegate's plugin type (its binary name).
    pub kind: String,
    pub network: String,
    /// The request's cniVersion: results go back in exactly this version.
    pub version: SpecVersion,
    pub conf: Value,
}

fn config_error(msg: impl Into<String>, details: impl Into<String>) -> ShimError {
    ShimError::Config {
        msg: msg.into(),
        details: details.into(),
    }
}

/// `"type":"dipam"` with `ipam.delegate`: the config and the mode disagree on whether dipam
/// creates the pod's interface (such a config once ran IPAM mode and created none).
fn mixed_shape() -> ShimError {
    config_error(
        "dipam is the main plugin here (\"type\":\"dipam\"), but ipam.delegate is set, which \
         only IPAM mode uses",
        "as the main plugin, name the real IPAM in ipam (\"ipam\":{\"type\":\"host-local\",...}); \
         as the IPAM of another plugin, set the top-level type to that plugin and keep \
         ipam.delegate",
    )
}

/// Requests come from any client, not only the plugin, which refuses these shapes too: an
/// IPAM-mode request whose config has `"type":"dipam"` at the top is refused for every verb
/// but DEL, which older versions ran in IPAM mode and which must still release what they
/// allocated.
pub fn refuse_mixed_shape(stdin: &[u8], mode: Mode, command: &str) -> Result<(), ShimError> {
    if mode != Mode::Ipam || command == "DEL" {
        return Ok(());
    }
    let conf: Value = serde_json::from_slice(stdin).unwrap_or_default();
    if conf.get("type").and_then(Value::as_str) == Some("dipam") {
        return Err(mixed_shape());
    }
    Ok(())
}

impl DelegateConf {
    pub fn from_request(stdin: &[u8], mode: Mode) -> Result<Self, ShimError> {
        let mut conf: Value = serde_json::from_slice(stdin)
            .map_err(|e| ShimError::Decode(format!("network config is not valid JSON: {e}")))?;
        let Some(obj) = conf.as_object_mut() else {
            return Err(ShimError::Decode(
                "network config must be a JSON object".into(),
            ));
        };
        let network = obj
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        crate::l1_leaves::validate::network_name(&network)?;
        let version = obj
            .get("cniVersion")
            .and_then(Value::as_str)
            .unwrap_or_default();
        // Not the parser's message: it quotes the whole value, which can be 1 MiB.
        let version = version.parse::<SpecVersion>().map_err(|_| {
            ShimError::Decode(format!(
                "invalid version format: {}",
                crate::l1_leaves::validate::shown(version)
            ))
        })?;
        if mode == Mode::Main && obj.get("ipam").and_then(|i| i.get("delegate")).is_some() {
            return Err(mixed_shape());
        }
        if mode == Mode::Ipam {
            let delegate = obj
                .get("ipam")
                .and_then(|i| i.get("delegate"))
                .filter(|d| d.is_object())
                .cloned()
                .ok_or_else(|| {
                    config_error(
                        "ipam.delegate is missing",
                        "dipam as an IPAM plugin needs the real IPAM config in ipam.delegate",
                    )
                })?;
            obj.insert("ipam".into(), delegate);
        }
        let kind = conf
            .get("ipam")
            .and_then(|i| i.get("type"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        crate::l1_leaves::validate::bounded(
            "the delegate type",
            kind.as_bytes(),
            crate::l1_leaves::validate::limits::NAME,
            7,
        )?;
        // dipamd running dipam as its delegate would wait on its own key lock until the
        // delegate timeout, and every DEL of the key would fail the same way.
        if kind == "dipam" {
            return Err(config_error(
                "the delegate IPAM must not be dipam",
                "ipam.delegate.type (IPAM mode) or ipam.type (main mode) names the real IPAM \
                 dipamd runs, e.g. host-local; dipam cannot be its own delegate",
            ));
        }
        if kind.is_empty() {
            return Err(config_error(
                "the delegate IPAM has no type",
                "set ipam.type (main mode) or ipam.delegate.type (IPAM mode) to the IPAM plugin \
                 to run, e.g. host-local",
            ));
        }
        Ok(Self {
            kind,
            network,
            version,
            conf,
        })
    }

    /// A digest of what determines the allocation: the config without the parts that vary
    /// between calls for the same attachment (prevResult, cniVersion). A repeated ADD with the
    /// same digest gets the recorded result back (host-local would answer "duplicate").
    pub fn digest(&self) -> String {
        let mut c = self.conf.clone();
        if let Some(o) = c.as_object_mut() {
            o.remove("prevResult");
            o.remove("cniVersion");
        }
        let mut canonical = String::new();
        canonicalize(&c, &mut canonical);
        let hash = Sha256::digest(canonical.as_bytes());
        hash.iter().take(16).map(|b| format!("{b:02x}")).collect()
    }

    /// The bytes to send to the delegate at `send` (the version chosen for it).
    pub fn bytes_for(&self, send: Option<SpecVersion>) -> Result<Vec<u8>, ShimError> {
        let mut c = self.conf.clone();
        if let Some(v) = send {
            super::version::convert_config(&mut c, v)?;
        }
        serde_json::to_vec(&c).map_err(|e| ShimError::Internal(e.to_string()))
    }

    /// Refuses an ADD the delegate would answer right once and wrongly after that.
    /// azure-vnet-ipam without `ipam.subnet` asks for a whole address pool on every ADD, and
    /// hands out a pool that holds an address only once: the first ADD works, every later one
    /// fails "no available address pools" (`cni/ipam/ipam.go` `Add`, `ipam/pool.go`
    /// `requestPool`; Azure's own CNI requests the pool once and then passes its subnet).
    pub fn check_for_add(&self) -> Result<(), ShimError> {
        if self.kind != "azure-vnet-ipam" {
            return Ok(());
        }
        let subnet = self
            .conf
            .get("ipam")
            .and_then(|i| i.get("subnet"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        if subnet.parse::<ipnet::IpNet>().is_ok() {
            return Ok(());
        }
        Err(config_error(
            if subnet.is_empty() {
                "azure-vnet-ipam needs ipam.subnet".to_owned()
            } else {
                format!(
                    "azure-vnet-ipam's ipam.subnet {} is not a CIDR",
                    crate::l1_leaves::validate::shown(subnet)
                )
            },
            "set \"subnet\" in the azure-vnet-ipam config to the pool's prefix (the subnet \
             of the node's interface, e.g. \"10.240.0.0/16\"): without it every ADD asks for \
             a whole pool, and only the first one gets an address. Nothing was allocated",
        ))
    }

    /// Delegates that cannot release an address from the container ID alone get what they need
    /// from the ADD result: azure-vnet-ipam's DEL fails with "pool id not found" unless
    /// `ipam.subnet` (and `ipam.ipAddress`) are set, which Azure's own CNI injects
    /// (docs/sources.md §8). `result` is the recorded result, else the runtime's
    /// prevResult. Returns false when the delegate needs such data and none is available: it
    /// could not release anything, and nothing dipam allocated is unaccounted for (every ADD
    /// through dipam is recorded before the delegate runs).
    pub fn inject_for_del(&mut self, result: Option<&Value>) -> bool {
        if !matches!(self.kind.as_str(), "azure-vnet-ipam") {
            return true;
        }
        let Some(addr) = result
            .and_then(|r| r.get("ips"))
            .and_then(Value::as_array)
            .and_then(|ips| ips.first())
            .and_then(|ip| ip.get("address"))
            .and_then(Value::as_str)
            .and_then(|a| a.parse::<ipnet::IpNet>().ok())
        else {
            return false;
        };
        if let Some(ipam) = self.conf.get_mut("ipam").and_then(Value::as_object_mut) {
            ipam.entry("subnet")
                .or_insert_with(|| Value::String(addr.trunc().to_string()));
            ipam.entry("ipAddress")
                .or_insert_with(|| Value::String(addr.addr().to_string()));
        }
        true
    }
}

/// Deterministic JSON text with sorted keys.
fn canonicalize(v: &Value, out: &mut String) {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String((*k).clone()).to_string());
                out.push(':');
                canonicalize(&m[*k], out);
            }
            out.push('}');
        }
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonicalize(x, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// The addresses of a result (CIDR text), for comparisons and listings.
pub fn result_ips(result: &Value) -> Vec<String> {
    result
        .get("ips")
        .and_then(Value::as_array)
        .map(|ips| {
            ips.iter()
                .filter_map(|ip| ip.get("address")?.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The bare addresses of a result, for matching regardless of prefix notation.
pub fn result_addrs(result: &Value) -> Vec<IpAddr> {
    result_ips(result)
        .iter()
        .filter_map(|a| a.parse::<ipnet::IpNet>().ok().map(|n| n.addr()))
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const IPAM: &str = r#"{"cniVersion":"1.1.0","name":"net1","type":"ptp","runtimeConfig":{"ips":["10.77.0.9"]},
        "ipam":{"type":"dipam","socketPath":"/s","delegate":{"type":"host-local","ranges":[[{"subnet":"10.77.0.0/16"}]]}}}"#;

    #[test]
    fn ipam_mode_swaps_in_the_delegate_and_keeps_the_rest() {
        let d = DelegateConf::from_request(IPAM.as_bytes(), Mode::Ipam).unwrap();
        assert_eq!(d.kind, "host-local");
        assert_eq!(d.network, "net1");
        assert_eq!(d.conf["ipam"]["ranges"][0][0]["subnet"], "10.77.0.0/16");
        assert!(d.conf["ipam"].get("delegate").is_none());
        assert_eq!(d.conf["runtimeConfig"]["ips"][0], "10.77.0.9");
        assert_eq!(d.conf["type"], "ptp");
    }

    /// Any client may send these, not only the plugin: dipam as its own delegate (which would
    /// wait on its own key until the delegate timeout) and a config whose shape contradicts
    /// the mode are refused with code 7.
    #[test]
    fn self_delegation_and_mixed_shapes_are_refused() {
        let cases = [
            (
                r#"{"cniVersion":"1.0.0","name":"n","type":"ptp","ipam":{"type":"dipam","delegate":{"type":"dipam"}}}"#,
                Mode::Ipam,
            ),
            (
                r#"{"cniVersion":"1.0.0","name":"n","type":"dipam","ipam":{"type":"dipam"}}"#,
                Mode::Main,
            ),
            (
                r#"{"cniVersion":"1.0.0","name":"n","type":"dipam","ipam":{"type":"host-local","delegate":{"type":"host-local"}}}"#,
                Mode::Main,
            ),
            (
                r#"{"cniVersion":"1.0.0","name":"n","type":"dipam","ipam":{"type":"dipam","delegate":{"type":"host-local"}}}"#,
                Mode::Ipam,
            ),
        ];
        for (conf, mode) in &cases[..3] {
            let e = DelegateConf::from_request(conf.as_bytes(), *mode).unwrap_err();
            assert_eq!(e.code_and_details().0, 7, "{conf}: {e}");
        }
        let (ipam_under_dipam, mode) = cases[3];
        let e = refuse_mixed_shape(ipam_under_dipam.as_bytes(), mode, "ADD").unwrap_err();
        assert_eq!(e.code_and_details().0, 7);
        // A DEL of it runs, as older versions ran it: what they allocated is released.
        refuse_mixed_shape(ipam_under_dipam.as_bytes(), mode, "DEL").unwrap();
        DelegateConf::from_request(ipam_under_dipam.as_bytes(), mode).unwrap();
    }

    #[test]
    fn main_mode_is_unchanged() {
        let raw =
            r#"{"cniVersion":"0.4.0","name":"n","type":"dipam","ipam":{"type":"host-local"}}"#;
        let d = DelegateConf::from_request(raw.as_bytes(), Mode::Main).unwrap();
        assert_eq!(d.conf, serde_json::from_str::<Value>(raw).unwrap());
    }

    #[test]
    fn digest_ignores_prev_result_and_version_only() {
        let a = DelegateConf::from_request(IPAM.as_bytes(), Mode::Ipam).unwrap();
        let mut b = a.clone();
        b.conf["prevResult"] = json!({"ips": []});
        b.conf["cniVersion"] = json!("0.4.0");
        assert_eq!(a.digest(), b.digest());
        b.conf["ipam"]["ranges"][0][0]["subnet"] = json!("10.78.0.0/16");
        assert_ne!(a.digest(), b.digest());
    }

    #[test]
    fn azure_del_gets_subnet_and_address_from_the_record() {
        let raw = r#"{"cniVersion":"1.0.0","name":"az","type":"ptp","ipam":{"type":"dipam","delegate":{"type":"azure-vnet-ipam"}}}"#;
        let mut d = DelegateConf::from_request(raw.as_bytes(), Mode::Ipam).unwrap();
        assert!(!d.clone().inject_for_del(None));
        assert!(d.inject_for_del(Some(&json!({"ips":[{"address":"10.78.0.5/24"}]}))));
        assert_eq!(d.conf["ipam"]["subnet"], "10.78.0.0/24");
        assert_eq!(d.conf["ipam"]["ipAddress"], "10.78.0.5");
    }

    #[test]
    fn bad_requests_are_named() {
        let code = |s: &str| match DelegateConf::from_request(s.as_bytes(), Mode::Ipam) {
            Err(ShimError::Decode(_)) => 6,
            Err(ShimError::Config { .. }) => 7,
            Err(ShimError::Version(_)) => 1,
            other => panic!("{other:?}"),
        };
        assert_eq!(code("nope"), 6);
        assert_eq!(code(r#"{"cniVersion":"1.0.0","name":"n","ipam":{}}"#), 7);
        assert_eq!(
            code(r#"{"cniVersion":"1.0.0","name":"../x","ipam":{"delegate":{"type":"h"}}}"#),
            7
        );
        assert_eq!(
            code(r#"{"cniVersion":"x.y","name":"n","ipam":{"delegate":{"type":"h"}}}"#),
            6
        );
        // Nothing quoted whole.
        let huge = "9".repeat(1 << 20);
        for conf in [
            json!({"cniVersion": huge, "name": "n", "ipam": {"delegate": {"type": "h"}}}),
            json!({"cniVersion": "1.0.0", "name": huge, "ipam": {"delegate": {"type": "h"}}}),
            json!({"cniVersion": "1.0.0", "name": "n", "ipam": {"delegate": {"type": huge}}}),
        ] {
            let e =
                DelegateConf::from_request(conf.to_string().as_bytes(), Mode::Ipam).unwrap_err();
            assert!(e.to_string().len() < 200, "{}", e.to_string().len());
        }
    }
}
