//! Delegate versions: which cniVersion to send a delegate, and converting configs and results
//! between the 0.3/0.4 layout and the 1.x layout (docs/sources.md §1, §4.2).
//!
//! Debian's host-local 1.1.1 stops at 1.0.0 and azure-vnet-ipam at 0.4.0 or 1.0.0, while a
//! runtime may configure 1.1.0. The spec wants the delegate to get "the same config"; a config
//! it would reject outright helps nobody, so dipamd sends the nearest version the delegate
//! supports and converts its result back (docs/cfp.md, "Delegate versions").

use rscni_types::{
    legacy,
    types::{CNIResult, CNIResultWithVersion},
    version::SpecVersion,
};
use serde_json::Value;

use crate::l1_leaves::error::ShimError;

/// Picks the version to send a delegate that supports `supported`, for a config at `conf`:
/// the config's own when supported; else the newest supported one below it (converting a
/// result up is lossless); else the oldest one above it. `None` when nothing is known, and
/// then the config goes unchanged.
pub fn choose(conf: SpecVersion, supported: &[SpecVersion]) -> Option<SpecVersion> {
    let known: Vec<SpecVersion> = supported
        .iter()
        .copied()
        .filter(|v| v.is_supported())
        .collect();
    if known.is_empty() || known.contains(&conf) {
        return None;
    }
    known
        .iter()
        .copied()
        .filter(|v| *v < conf)
        .max()
        .or_else(|| known.iter().copied().filter(|v| *v > conf).min())
}

/// Parses a result in any layout from 0.3.0 on (`ips[].version` is ignored; 1.1 fields kept).
pub fn parse_result(raw: &[u8]) -> Result<CNIResult, serde_json::Error> {
    serde_json::from_slice::<CNIResult>(raw)
}

/// Serializes `result` in exactly the layout of `version`: 0.3.x and 0.4.0 carry
/// `ips[].version` and drop the 1.1-only fields; 1.x does not (spec §4.1).
pub fn render(version: SpecVersion, result: CNIResult) -> Result<Vec<u8>, ShimError> {
    let out = if version.is_legacy() {
        serde_json::to_vec(&legacy::CNIResult::new(version, result))
    } else {
        serde_json::to_vec(&CNIResultWithVersion::new(version, result))
    };
    out.map_err(|e| ShimError::Internal(format!("rendering a CNI result: {e}")))
}

/// Rewrites a config for the delegate's version: `cniVersion`, and `prevResult` in the matching
/// layout, since a Go delegate parses prevResult with the creator for the config's version.
pub fn convert_config(conf: &mut Value, to: SpecVersion) -> Result<(), ShimError> {
    conf["cniVersion"] = Value::String(to.to_string());
    if let Some(prev) = conf.get("prevResult").filter(|p| !p.is_null()) {
        let parsed = serde_json::from_value::<CNIResult>(prev.clone())
            .map_err(|e| ShimError::Decode(format!("prevResult is not a valid CNI result: {e}")))?;
        let rendered = render(to, parsed)?;
        conf["prevResult"] = serde_json::from_slice(&rendered)
            .map_err(|e| ShimError::Internal(format!("re-reading a rendered result: {e}")))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn v(s: &str) -> SpecVersion {
        s.parse().unwrap()
    }

    #[test]
    fn choose_prefers_exact_then_lower_then_higher() {
        let hl: Vec<SpecVersion> = ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0"]
            .iter()
            .map(|s| v(s))
            .collect();
        assert_eq!(choose(v("1.0.0"), &hl), None);
        assert_eq!(choose(v("1.1.0"), &hl), Some(v("1.0.0")));
        assert_eq!(choose(v("0.3.1"), &[v("1.0.0")]), Some(v("1.0.0")));
        assert_eq!(choose(v("1.1.0"), &[]), None);
    }

    #[test]
    fn results_render_in_the_exact_layout() {
        let hl = br#"{"cniVersion":"1.0.0","ips":[{"address":"10.77.0.2/16","gateway":"10.77.0.1"}],"routes":[{"dst":"0.0.0.0/0"}],"dns":{}}"#;
        let r = parse_result(hl).unwrap();
        let legacy: Value =
            serde_json::from_slice(&render(v("0.4.0"), r.clone()).unwrap()).unwrap();
        assert_eq!(legacy["cniVersion"], "0.4.0");
        assert_eq!(legacy["ips"][0]["version"], "4");
        let new: Value = serde_json::from_slice(&render(v("1.1.0"), r).unwrap()).unwrap();
        assert_eq!(new["cniVersion"], "1.1.0");
        assert!(new["ips"][0].get("version").is_none());
        assert!(
            new.get("dns").is_none(),
            "empty dns is dropped in 1.x: {new}"
        );
    }

    #[test]
    fn config_conversion_rewrites_prev_result_layout() {
        let mut c = json!({
            "cniVersion": "1.1.0", "name": "n",
            "prevResult": {"cniVersion":"1.1.0","ips":[{"address":"10.0.0.2/24","interface":0}]}
        });
        convert_config(&mut c, v("0.4.0")).unwrap();
        assert_eq!(c["cniVersion"], "0.4.0");
        assert_eq!(c["prevResult"]["cniVersion"], "0.4.0");
        assert_eq!(c["prevResult"]["ips"][0]["version"], "4");
    }
}
