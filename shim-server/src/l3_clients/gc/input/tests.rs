use std::collections::HashSet;

use serde_json::{Value, json};

use super::*;

/// What the request read the old way (the config a `Value`, [`super::super::valid_input`])
/// gives: the config without the lists, and the valid set.
fn old_way(stdin: &[u8]) -> (Value, Result<ValidInput, String>) {
    let mut v: Value = serde_json::from_slice(stdin).unwrap();
    let input = super::super::valid_input(&v).map_err(|e| e.to_string());
    let o = v.as_object_mut().unwrap();
    o.remove(VALID_KEY);
    o.remove(LEGACY_KEY);
    (v, input)
}

fn as_set(i: &ValidInput) -> Option<HashSet<(String, String)>> {
    match i {
        ValidInput::List(l) => Some(l.iter().cloned().collect()),
        _ => None,
    }
}

#[test]
fn every_shape_a_runtime_sends_reads_as_the_value_path_reads_it() {
    let a = json!([{"containerID":"a","ifname":"eth0"},{"containerID":"b","ifname":"net1"}]);
    let b = json!([{"containerID":"c","ifname":"eth0"}]);
    let base = json!({"cniVersion":"1.1.0","name":"net","type":"ptp",
                      "ipam":{"type":"dipam","delegate":{"type":"host-local","n":1.5e3}}});
    let with = |pairs: &[(&str, Value)]| {
        let mut v = base.clone();
        for (k, l) in pairs {
            v[*k] = l.clone();
        }
        serde_json::to_vec(&v).unwrap()
    };
    for stdin in [
        with(&[(VALID_KEY, a.clone()), (LEGACY_KEY, a.clone())]),
        with(&[(VALID_KEY, a.clone()), (LEGACY_KEY, b.clone())]),
        with(&[(LEGACY_KEY, b.clone())]),
        with(&[(VALID_KEY, json!([]))]),
        with(&[(VALID_KEY, Value::Null), (LEGACY_KEY, Value::Null)]),
        with(&[(VALID_KEY, Value::Null), (LEGACY_KEY, b.clone())]),
        with(&[]),
        // As a runtime's encoder may write it: spaces, escapes, a key given twice.
        br#" { "name" : "net", "cni.dev/valid-attachments" : [ { "ifname" : "eth0", "containerID" : "x\u0031" } ],
              "cniVersion":"1.1.0", "cni.dev/valid-attachments": [{"containerID":"y","ifname":"eth0"}] } "#
            .to_vec(),
    ] {
        let (config, input) = read(&stdin).expect("taken whole");
        let (want_config, want) = old_way(&stdin);
        let want = want.unwrap();
        let got_config: Value = serde_json::from_slice(&config).unwrap();
        assert_eq!(got_config, want_config, "{}", String::from_utf8_lossy(&stdin));
        assert_eq!(as_set(&input), as_set(&want), "{}", String::from_utf8_lossy(&stdin));
        assert_eq!(input.names_nothing(), want.names_nothing());
        if as_set(&want).is_none() {
            assert_eq!(input, want);
        }
    }
    // libcni's second copy of the same list is not read again.
    let (_, both) = read(&with(&[(VALID_KEY, a.clone()), (LEGACY_KEY, a)])).unwrap();
    assert!(matches!(both, ValidInput::List(l) if l.len() == 2));
}

/// Whatever the `Value` path refuses (the unit tests in gc/mod.rs show its words) this path
/// does not take: the request is then read the old way, which names the entry and key.
#[test]
fn what_the_value_path_refuses_is_left_to_it() {
    let ok = json!({"containerID":"good","ifname":"eth0"});
    for bad in [
        json!({"containerId":"a","ifname":"eth0"}),
        json!({"containerID":"a"}),
        json!({"containerID":"a","ifname":"eth0","netns":"/x"}),
        json!({"containerID":1,"ifname":"eth0"}),
        json!({"containerID":"","ifname":"eth0"}),
        json!({"containerID":"a","ifname":"a/b"}),
        json!("a"),
        json!(["a", "eth0"]),
    ] {
        for key in [VALID_KEY, LEGACY_KEY] {
            let stdin =
                serde_json::to_vec(&json!({"name":"n", VALID_KEY: [ok], key: [ok, bad]})).unwrap();
            assert!(read(&stdin).is_none(), "{bad} under {key}");
            assert!(old_way(&stdin).1.is_err(), "{bad}");
        }
    }
    for stdin in [
        &br#"{"name":"n","cni.dev/valid-attachments":{}}"#[..],
        br#"{"name":"n","cni.dev/attachments":"x"}"#,
        br#"{"name":"n","cni.dev/attachments":[1e999]}"#,
        br#"[{"name":"n"}]"#,
        br#"{"name":"n""#,
        b"",
    ] {
        assert!(read(stdin).is_none(), "{}", String::from_utf8_lossy(stdin));
    }
}

/// libcni's request at 9,750 pods (the density bench's 10,000 less the stale): the list under
/// both keys, read the old way (the config a `Value`, then pairs, then the GC's set) and this
/// way, each measured with the counting allocator: what each holds at its peak.
#[test]
fn the_lists_at_9750_pods_never_become_a_value() {
    use crate::testing::held;
    const PODS: usize = 9_750;
    let _one = held::one_at_a_time();
    let rt = held::runtime();
    let list: Vec<Value> = (0..PODS)
        .map(|i| json!({"containerID": format!("{i:064x}"), "ifname": "eth0"}))
        .collect();
    let stdin = serde_json::to_vec(&json!({
        "cniVersion": "1.1.0", "name": "net", "type": "ptp",
        "ipam": {"type": "dipam", "delegate": {"type": "host-local", "subnet": "10.0.0.0/16"}},
        VALID_KEY: list, LEGACY_KEY: list,
    }))
    .unwrap();
    drop(list);
    let (old, old_peak) = held::measure(&rt, async {
        let v: Value = serde_json::from_slice(&stdin).unwrap();
        let Ok(ValidInput::List(l)) = super::super::valid_input(&v) else {
            panic!()
        };
        drop(v);
        l.into_iter().collect::<HashSet<(String, String)>>()
    });
    let (new, new_peak) = held::measure(&rt, async {
        let (config, input) = read(&stdin).unwrap();
        let _core: Value = serde_json::from_slice(&config).unwrap();
        let ValidInput::List(l) = input else { panic!() };
        l.into_iter().collect::<HashSet<(String, String)>>()
    });
    assert_eq!(old, new);
    assert_eq!(new.len(), PODS);
    eprintln!(
        "GC arrival at {PODS} pods, both keys ({} B of request): the Value way's peak {old_peak} \
         B, the split's {new_peak} B",
        stdin.len()
    );
    assert!(
        new_peak * 3 < old_peak,
        "the split held {new_peak} B at its peak, the Value way {old_peak} B"
    );
}
