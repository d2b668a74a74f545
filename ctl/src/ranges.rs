//! `dipamctl install --ranges-from-node`'s rewrite: host-local's `ranges`, in the conflist
//! being installed (`--conflist`) or adopted (`--wrap`), become the node's pod CIDRs, one
//! range set per family (host-local's documented shape: `ranges` is a list of range sets, and
//! a range set of one range gives a pod one address from it; two sets give one address of
//! each family, dual-stack).
//!
//! Only the host-local object dipam delegates to changes: `ranges` is set, and the legacy
//! single-range keys (`subnet`, `rangeStart`, `rangeEnd`, `gateway`) are removed, because
//! host-local adds such a range to `ranges` rather than replacing it (a template's range would
//! then be handed out on every node beside the node's own). Every other key keeps its value
//! and its text, and the rest of the file is untouched; the result is checked against the same
//! change made on the parsed value, as for `--wrap`.

use ipnet::IpNet;
use serde_json::{Map, Value, json};

use super::wrap::{Doc, WrapError, check, indent_at, span, splice};

/// host-local's keys for its one legacy range (`IPAMConfig.Range`, inlined): replaced by
/// `ranges`.
const LEGACY_RANGE_KEYS: [&str; 4] = ["subnet", "rangeStart", "rangeEnd", "gateway"];

/// A conflist with the node's ranges written in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WithRanges {
    pub text: String,
    /// The plugin whose host-local got them.
    pub plugin: usize,
    /// What host-local had before: its `ranges` (and legacy range), compact JSON, or "".
    pub before: String,
}

/// host-local's `ranges` for `cidrs`: one range set per CIDR.
pub fn ranges_value(cidrs: &[IpNet]) -> Value {
    Value::Array(
        cidrs
            .iter()
            .map(|c| json!([{ "subnet": c.to_string() }]))
            .collect(),
    )
}

/// The host-local that dipam runs in the conflist: in plugin `only` when given, else the
/// only one there is. Its plugin's index, and the path to it inside that plugin.
fn host_local(
    doc: &Doc<'_>,
    only: Option<usize>,
) -> Result<(usize, &'static [&'static str]), WrapError> {
    let mut found = Vec::new();
    let mut others = Vec::new();
    for (i, p) in doc.plugins.iter().enumerate() {
        if only.is_some_and(|o| o != i) {
            continue;
        }
        let path: &[&str] = if p["type"] == "dipam" {
            &["ipam"]
        } else if p["ipam"]["type"] == "dipam" {
            &["ipam", "delegate"]
        } else {
            continue;
        };
        let ipam = path.iter().fold(p, |v, k| &v[*k]);
        match ipam["type"].as_str() {
            Some("host-local") if ipam.is_object() => found.push((i, path)),
            other => others.push(format!(
                "plugins[{i}] delegates to {}",
                other.unwrap_or("no IPAM type")
            )),
        }
    }
    match found[..] {
        [one] => Ok(one),
        [] => {
            let why = if others.is_empty() {
                "no plugin uses dipam".to_owned()
            } else {
                others.join(", ")
            };
            Err(WrapError::Unusable(format!(
                "--ranges-from-node writes host-local's ranges, but dipam runs no host-local \
                 here ({why})"
            )))
        }
        _ => Err(WrapError::Ambiguous(format!(
            "run host-local through dipam ({}); --ranges-from-node gives one node's ranges \
                 to one of them",
            found
                .iter()
                .map(|(i, _)| format!("plugins[{i}]"))
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// Writes `cidrs` as the `ranges` of the host-local that dipam runs in `text`: the one in
/// plugin `only` when given (the plugin `--wrap` rewrote), else the only one there is.
pub fn set_ranges(
    text: &str,
    cidrs: &[IpNet],
    only: Option<usize>,
) -> Result<WithRanges, WrapError> {
    let doc = Doc::parse(text)?;
    let (i, path) = host_local(&doc, only)?;
    let ranges = ranges_value(cidrs);

    // The intended value.
    let mut expected = doc.value.clone();
    let target = path
        .iter()
        .fold(&mut expected["plugins"][i], |v, k| &mut v[*k]);
    let obj: &mut Map<String, Value> = target
        .as_object_mut()
        .ok_or_else(|| WrapError::Splice("host-local is not an object".into()))?;
    let mut before = Map::new();
    for key in LEGACY_RANGE_KEYS.iter().chain(&["ranges"]) {
        if let Some(v) = obj.remove(*key) {
            before.insert((*key).to_owned(), v);
        }
    }
    obj.insert("ranges".into(), ranges.clone());

    // The text: the object's entries in their order and with their values' own text, ranges
    // where it was (else after "type"), laid out as the object was.
    let (obj_span, entries) = doc.object(i, path)?;
    let old = &text[obj_span.clone()];
    let ranges_text = compact(&ranges);
    let mut out: Vec<String> = Vec::new();
    let mut placed = false;
    for (key, raw) in &entries.0 {
        if key == "ranges" {
            if !placed {
                out.push(format!("\"ranges\": {ranges_text}"));
                placed = true;
            }
            continue;
        }
        if LEGACY_RANGE_KEYS.contains(&key.as_str()) {
            continue;
        }
        let value = &text[span(text, raw)?];
        out.push(format!("{}: {value}", Value::from(key.as_str())));
    }
    if !placed {
        let after_type = entries
            .0
            .iter()
            .filter(|(k, _)| !LEGACY_RANGE_KEYS.contains(&k.as_str()) && k != "ranges")
            .position(|(k, _)| k == "type")
            .map_or(out.len(), |p| p + 1);
        out.insert(after_type, format!("\"ranges\": {ranges_text}"));
    }
    let new = if old.contains('\n') {
        let nl = if old.contains("\r\n") { "\r\n" } else { "\n" };
        let outer = indent_at(text, obj_span.end - 1).unwrap_or_default();
        let first_key = obj_span.start
            + 1
            + old[1..]
                .find(|c: char| !c.is_ascii_whitespace())
                .unwrap_or(0);
        let pad = indent_at(text, first_key)
            .map(str::to_owned)
            .unwrap_or_else(|| format!("{outer}  "));
        format!(
            "{{{nl}{pad}{}{nl}{outer}}}",
            out.join(&format!(",{nl}{pad}"))
        )
    } else {
        format!("{{{}}}", out.join(", "))
    };
    let text_out = splice(text, vec![(obj_span, new)]);
    check(&text_out, &expected)?;
    Ok(WithRanges {
        text: text_out,
        plugin: i,
        before: if before.is_empty() {
            String::new()
        } else {
            Value::Object(before).to_string()
        },
    })
}

/// `[[{"subnet": "10.244.1.0/24"}], ...]` on one line, with a space after each colon and
/// comma as a person would write it.
fn compact(ranges: &Value) -> String {
    let sets: Vec<String> = ranges
        .as_array()
        .into_iter()
        .flatten()
        .map(|set| {
            let items: Vec<String> = set
                .as_array()
                .into_iter()
                .flatten()
                .map(|r| {
                    let fields: Vec<String> = r
                        .as_object()
                        .into_iter()
                        .flatten()
                        .map(|(k, v)| format!("{}: {v}", Value::from(k.as_str())))
                        .collect();
                    format!("{{{}}}", fields.join(", "))
                })
                .collect();
            format!("[{}]", items.join(", "))
        })
        .collect();
    format!("[{}]", sets.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidrs(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|c| c.parse().unwrap()).collect()
    }

    const TEMPLATE: &str = r#"{
  "cniVersion": "1.0.0",
  "name": "dipam",
  "plugins": [
    {
      "type": "dipam",
      "socketPath": "/run/dipam/dipam.sock",
      "ipam": {
        "type": "host-local",
        "routes": [{ "dst": "0.0.0.0/0" }]
      }
    },
    { "type": "portmap", "capabilities": { "portMappings": true } }
  ]
}
"#;

    #[test]
    fn a_template_without_ranges_gets_one_set_per_family_after_its_type() {
        let r = set_ranges(
            TEMPLATE,
            &cidrs(&["10.244.7.0/24", "fd00:10:244:7::/64"]),
            None,
        )
        .unwrap();
        assert_eq!(r.plugin, 0);
        assert_eq!(r.before, "");
        let want = TEMPLATE.replace(
            "\"type\": \"host-local\",\n",
            "\"type\": \"host-local\",\n        \"ranges\": [[{\"subnet\": \"10.244.7.0/24\"}], \
             [{\"subnet\": \"fd00:10:244:7::/64\"}]],\n",
        );
        assert_eq!(r.text, want);
    }

    #[test]
    fn existing_ranges_and_a_legacy_subnet_are_replaced_and_nothing_else_moves() {
        // IPAM mode, one line, a legacy range beside ranges (host-local would hand out both).
        let text = r#"{"cniVersion":"0.4.0","name":"k","plugins":[{"type":"ptp","mtu":1460,"ipam":{"type":"dipam","delegate":{"type":"host-local","subnet":"10.0.0.0/16","gateway":"10.0.0.1","dataDir":"/x","ranges":[[{"subnet":"10.1.0.0/24"}]],"routes":[{"dst":"0.0.0.0/0"}]}}}]}"#;
        let r = set_ranges(text, &cidrs(&["10.244.9.0/24"]), None).unwrap();
        assert_eq!(
            r.text,
            r#"{"cniVersion":"0.4.0","name":"k","plugins":[{"type":"ptp","mtu":1460,"ipam":{"type":"dipam","delegate":{"type": "host-local", "dataDir": "/x", "ranges": [[{"subnet": "10.244.9.0/24"}]], "routes": [{"dst":"0.0.0.0/0"}]}}}]}"#
        );
        let before: Value = serde_json::from_str(&r.before).unwrap();
        assert_eq!(before["subnet"], "10.0.0.0/16");
        assert_eq!(before["ranges"][0][0]["subnet"], "10.1.0.0/24");
    }

    #[test]
    fn only_host_local_run_by_dipam_is_rewritten() {
        let azure = r#"{"cniVersion":"1.0.0","name":"a","plugins":[{"type":"dipam","ipam":{"type":"azure-vnet-ipam"}}]}"#;
        let e = set_ranges(azure, &cidrs(&["10.0.0.0/24"]), None).unwrap_err();
        assert!(
            e.to_string()
                .contains("no host-local here (plugins[0] delegates to azure-vnet-ipam)"),
            "{e}"
        );
        let plain = r#"{"cniVersion":"1.0.0","name":"a","plugins":[{"type":"ptp","ipam":{"type":"host-local"}}]}"#;
        let e = set_ranges(plain, &cidrs(&["10.0.0.0/24"]), None).unwrap_err();
        assert!(e.to_string().contains("no plugin uses dipam"), "{e}");
        let two = r#"{"cniVersion":"1.0.0","name":"a","plugins":[
            {"type":"dipam","ipam":{"type":"host-local"}},
            {"type":"ptp","ipam":{"type":"dipam","delegate":{"type":"host-local"}}}]}"#;
        let e = set_ranges(two, &cidrs(&["10.0.0.0/24"]), None).unwrap_err();
        assert!(e.to_string().contains("plugins[0], plugins[1]"), "{e}");
        let r = set_ranges(two, &cidrs(&["10.0.0.0/24"]), Some(1)).unwrap();
        let v: Value = serde_json::from_str(&r.text).unwrap();
        assert_eq!(v["plugins"][0]["ipam"].get("ranges"), None);
        assert_eq!(
            v["plugins"][1]["ipam"]["delegate"]["ranges"],
            json!([[{"subnet": "10.0.0.0/24"}]])
        );
    }
}
