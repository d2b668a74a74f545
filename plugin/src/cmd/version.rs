//! CNI VERSION, answered without dipamd: podman runs it on every network load, and it must
//! work while the daemon is down (spec §2.3, docs/sources.md §10.1).

use rscni_types::version::SpecVersion;
use serde_json::{Value, json};

pub use crate::conf::plugin_info;

/// The VERSION reply. The spec says to echo the input cniVersion; stdin may be empty, so fall
/// back to the newest version dipam supports.
pub fn reply(stdin: &[u8]) -> Value {
    let info = plugin_info();
    let echoed = serde_json::from_slice::<Value>(stdin)
        .ok()
        .and_then(|v| v.get("cniVersion")?.as_str()?.parse::<SpecVersion>().ok())
        .unwrap_or(SpecVersion::CURRENT);
    json!({
        "cniVersion": echoed.to_string(),
        "supportedVersions": info.supported_versions().iter().map(ToString::to_string).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use rscni_types::version::PluginInfo;

    use super::*;

    #[test]
    fn lists_every_supported_version_and_echoes_input() {
        let v = reply(br#"{"cniVersion":"0.4.0"}"#);
        assert_eq!(v["cniVersion"], "0.4.0");
        assert_eq!(
            v["supportedVersions"],
            json!(["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"])
        );
        assert_eq!(reply(b"")["cniVersion"], "1.1.0");
    }

    /// Every listed version parses (none is silently dropped by `plugin_info`), the newest is
    /// the one dipam answers in, and rscni speaks each of them.
    #[test]
    fn the_version_list_is_whole() {
        let list = dipam_proto::cni::SUPPORTED_VERSIONS;
        assert_eq!(plugin_info().supported_versions().len(), list.len());
        assert_eq!(
            list.last().copied(),
            Some(&*SpecVersion::CURRENT.to_string())
        );
        for v in list {
            let parsed: SpecVersion = v.parse().unwrap();
            assert!(PluginInfo::default().validate(parsed).is_ok(), "{v}");
        }
    }
}
