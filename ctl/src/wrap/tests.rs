use std::{fs, path::Path};

use serde_json::{Value, json};

use super::*;
use crate::install::validate_conflist;

const PTP: &str = r#"{
  "cniVersion": "1.0.0",
  "name": "kubenet",
  "plugins": [
    {
      "type": "ptp",
      "mtu": 1460,
      "ipam": {
        "type": "host-local",
        "ranges": [[{ "subnet": "10.244.1.0/24" }]],
        "routes": [{ "dst": "0.0.0.0/0" }]
      }
    },
    { "type": "portmap", "capabilities": { "portMappings": true } }
  ]
}
"#;

const PODMAN: &str = include_str!("../../../tests/lifecycle/fixtures/podman-4.3.1-bridge.conflist");

fn parse(s: &str) -> Value {
    serde_json::from_str(s).unwrap()
}

fn ipam_mode() -> Choice {
    Choice::default()
}

fn main_mode() -> Choice {
    Choice {
        plugin: None,
        main_mode: true,
    }
}

#[test]
fn wrapping_changes_only_the_ipam_value_and_unwrapping_gives_back_every_byte() {
    let w = wrap(PTP, ipam_mode(), None).unwrap();
    assert_eq!(
        w.text,
        r#"{
  "cniVersion": "1.0.0",
  "name": "kubenet",
  "plugins": [
    {
      "type": "ptp",
      "mtu": 1460,
      "ipam": {
        "type": "dipam",
        "delegate": {
          "type": "host-local",
          "ranges": [[{ "subnet": "10.244.1.0/24" }]],
          "routes": [{ "dst": "0.0.0.0/0" }]
        }
      }
    },
    { "type": "portmap", "capabilities": { "portMappings": true } }
  ]
}
"#
    );
    assert_eq!(
        (w.plugin, w.main.as_str(), w.delegate.as_str(), w.mode),
        (0, "ptp", "host-local", Mode::Ipam)
    );
    assert_eq!(validate_conflist(w.text.as_bytes()).unwrap(), "kubenet");
    let u = unwrap(&w.text, ipam_mode()).unwrap();
    assert_eq!(u.text, PTP);
    assert_eq!((u.plugin, u.delegate.as_str()), (0, "host-local"));
}

#[test]
fn podman_conflist_keeps_its_layout_around_the_wrapped_ipam() {
    let w = wrap(PODMAN, ipam_mode(), None).unwrap();
    // The text before and after the ipam object is untouched: key order, podman's
    // 3-space indentation, the other plugins, no final newline.
    let start = PODMAN.find("\"ipam\": ").unwrap() + "\"ipam\": ".len();
    let tail = PODMAN
        .find("\n         },\n         \"capabilities\"")
        .unwrap()
        + 11;
    assert!(w.text.starts_with(&PODMAN[..start]), "{}", w.text);
    assert!(w.text.ends_with(&PODMAN[tail..]), "{}", w.text);
    assert!(
        w.text[start..].starts_with(
            "{\n            \"type\": \"dipam\",\n            \"delegate\": {\n               \"type\": \"host-local\","
        ),
        "{}",
        w.text
    );
    let mut expected = parse(PODMAN);
    let old = expected["plugins"][0]["ipam"].take();
    expected["plugins"][0]["ipam"] = json!({"type": "dipam", "delegate": old});
    assert_eq!(parse(&w.text), expected);
    assert_eq!(validate_conflist(w.text.as_bytes()).unwrap(), "podnet");
    assert_eq!(unwrap(&w.text, ipam_mode()).unwrap().text, PODMAN);
}

#[test]
fn a_socket_other_than_the_default_is_written_and_dropped_again() {
    let w = wrap(PTP, ipam_mode(), Some("/run/other/dipam.sock")).unwrap();
    let v = parse(&w.text);
    assert_eq!(
        v["plugins"][0]["ipam"]["socketPath"],
        "/run/other/dipam.sock"
    );
    assert!(
        w.text
            .contains("\"type\": \"dipam\",\n        \"socketPath\": \"/run/other/dipam.sock\",\n")
    );
    validate_conflist(w.text.as_bytes()).unwrap();
    assert_eq!(unwrap(&w.text, ipam_mode()).unwrap().text, PTP);
}

#[test]
fn one_line_and_tab_indented_conflists() {
    let one = r#"{"cniVersion":"0.4.0","name":"n","plugins":[{"type":"bridge","ipam":{"type":"host-local","subnet":"10.1.0.0/24"}}]}"#;
    let w = wrap(one, ipam_mode(), None).unwrap();
    assert_eq!(
        w.text,
        r#"{"cniVersion":"0.4.0","name":"n","plugins":[{"type":"bridge","ipam":{"type": "dipam", "delegate": {"type":"host-local","subnet":"10.1.0.0/24"}}}]}"#
    );
    assert_eq!(unwrap(&w.text, ipam_mode()).unwrap().text, one);

    let tabs = "{\n\t\"cniVersion\": \"0.3.1\",\n\t\"name\": \"t\",\n\t\"plugins\": [{\n\t\t\"type\": \"ptp\",\n\t\t\"ipam\": {\n\t\t\t\"type\": \"static\"\n\t\t}\n\t}]\n}";
    let w = wrap(tabs, ipam_mode(), None).unwrap();
    assert!(
        w.text
            .contains("\"ipam\": {\n\t\t\t\"type\": \"dipam\",\n\t\t\t\"delegate\": {\n\t\t\t\t\"type\": \"static\"\n\t\t\t}\n\t\t}"),
        "{}",
        w.text
    );
    assert_eq!(unwrap(&w.text, ipam_mode()).unwrap().text, tabs);
}

#[test]
fn unwrap_keeps_a_hand_written_delegate_verbatim_when_it_cannot_be_dedented() {
    // dipam's own keys go; a delegate whose lines are not one level deeper stays as written.
    let hand = r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"ptp","ipam":{"type":"dipam","socketPath":"/x.sock","timeoutSeconds":5,
"delegate":{"type":"host-local",
"subnet":"10.2.0.0/24"}}}]}"#;
    let u = unwrap(hand, ipam_mode()).unwrap();
    assert!(
        u.text
            .contains("\"ipam\":{\"type\":\"host-local\",\n\"subnet\""),
        "{}",
        u.text
    );
    assert_eq!(
        parse(&u.text)["plugins"][0]["ipam"],
        json!({"type": "host-local", "subnet": "10.2.0.0/24"})
    );
}

const BARE: &str = r#"{
  "cniVersion": "1.0.0",
  "name": "bare",
  "plugins": [
    {
      "type": "host-local",
      "capabilities": { "ips": true },
      "ipam": { "type": "host-local", "ranges": [[{ "subnet": "10.3.0.0/24" }]] }
    }
  ]
}"#;

#[test]
fn an_ipam_run_as_the_main_plugin_is_wrapped_only_in_main_mode() {
    let e = wrap(BARE, ipam_mode(), None).unwrap_err();
    assert!(matches!(e, WrapError::MainMode(_)), "{e}");
    assert!(e.to_string().contains("--main-mode"), "{e}");

    let w = wrap(BARE, main_mode(), None).unwrap();
    assert_eq!(
        w.text,
        BARE.replacen("\"type\": \"host-local\"", "\"type\": \"dipam\"", 1)
    );
    assert_eq!((w.mode, w.delegate.as_str()), (Mode::Main, "host-local"));
    validate_conflist(w.text.as_bytes()).unwrap();
    // Unwrapping main mode needs the same consent.
    assert!(matches!(
        unwrap(&w.text, ipam_mode()).unwrap_err(),
        WrapError::MainMode(_)
    ));
    assert_eq!(unwrap(&w.text, main_mode()).unwrap().text, BARE);

    let w = wrap(BARE, main_mode(), Some("/run/x/dipam.sock")).unwrap();
    assert!(w.text.contains(
        "\"type\": \"dipam\",\n      \"socketPath\": \"/run/x/dipam.sock\",\n      \"capabilities\""
    ), "{}", w.text);
    assert_eq!(unwrap(&w.text, main_mode()).unwrap().text, BARE);

    // --main-mode on a plugin that has its own IPAM is a mistake, not a request.
    assert!(matches!(
        wrap(PTP, main_mode(), None).unwrap_err(),
        WrapError::MainMode(_)
    ));
}

#[test]
fn unwrapping_main_mode_drops_dipams_keys_wherever_they_are() {
    let hand = r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"socketPath":"/a.sock","spoolDir":"/s","type":"dipam","mtu":1400,"timeoutSeconds":3,"ipam":{"type":"host-local"}}]}"#;
    let u = unwrap(hand, main_mode()).unwrap();
    assert_eq!(
        u.text,
        r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"host-local","mtu":1400,"ipam":{"type":"host-local"}}]}"#
    );
}

/// Every example in conflist/: unwrap (main mode where dipam is the main plugin), then wrap
/// again gives the example back, except a socketPath that is the default.
#[test]
fn every_example_round_trips() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../conflist");
    let mut seen = 0;
    for e in fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_none_or(|x| x != "conflist") {
            continue;
        }
        let text = fs::read_to_string(&p).unwrap();
        let original = parse(&text);
        let choice = Choice {
            plugin: None,
            main_mode: original["plugins"][0]["type"] == "dipam",
        };
        assert!(
            matches!(wrap(&text, choice, None), Err(WrapError::AlreadyDipam(0))),
            "{}",
            p.display()
        );
        let u = unwrap(&text, choice).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert!(!u.text.contains("dipam\""), "{}: {}", p.display(), u.text);
        let w = wrap(&u.text, choice, None).unwrap();
        let mut expected = original;
        for plugin in expected["plugins"].as_array_mut().unwrap() {
            let default = |o: &Value| o.get("socketPath").is_some_and(|s| s == DEFAULT_SOCKET);
            if default(plugin) {
                plugin.as_object_mut().unwrap().remove("socketPath");
            }
            if let Some(ipam) = plugin.get_mut("ipam").filter(|i| default(i)) {
                ipam.as_object_mut().unwrap().remove("socketPath");
            }
        }
        assert_eq!(parse(&w.text), expected, "{}", p.display());
        validate_conflist(w.text.as_bytes()).unwrap();
        seen += 1;
    }
    assert!(seen >= 6, "{seen}");
}

#[test]
fn several_ipams_need_a_choice() {
    let two = r#"{"cniVersion":"1.0.0","name":"n","plugins":[
        {"type":"bridge","ipam":{"type":"host-local"}},
        {"type":"macvlan","ipam":{"type":"dhcp"}}]}"#;
    let e = wrap(two, ipam_mode(), None).unwrap_err();
    assert_eq!(
        e.to_string(),
        "several plugins carry an IPAM (plugins[0]: bridge, plugins[1]: macvlan): choose one \
         with --plugin-index N"
    );
    let w = wrap(
        two,
        Choice {
            plugin: Some(1),
            main_mode: false,
        },
        None,
    )
    .unwrap();
    let v = parse(&w.text);
    assert_eq!(v["plugins"][0]["ipam"]["type"], "host-local");
    assert_eq!(v["plugins"][1]["ipam"]["delegate"]["type"], "dhcp");
    for (i, why) in [(2, "numbered from 0"), (0, "")] {
        let r = wrap(
            &w.text,
            Choice {
                plugin: Some(i),
                main_mode: false,
            },
            None,
        );
        if why.is_empty() {
            // plugins[0] still has host-local: a second wrap may take it.
            assert!(r.is_ok());
        } else {
            assert!(r.unwrap_err().to_string().contains(why));
        }
    }
}

#[test]
fn refusals_say_why() {
    let v = |version: &str| {
        format!(
            r#"{{"cniVersion":"{version}","name":"n","plugins":[{{"type":"ptp","ipam":{{"type":"host-local"}}}}]}}"#
        )
    };
    let cases: Vec<(String, &str)> = vec![
        ("{not json".into(), "not valid JSON"),
        ("[]".into(), "JSON object"),
        (v("2.0.0"), "cniVersion \"2.0.0\" is not one dipam can carry"),
        (v("0.2.0"), "cniVersion \"0.2.0\""),
        (
            r#"{"cniVersion":"1.1.0","cniVersions":["1.1.0","9.0.0"],"name":"n","plugins":[{"type":"ptp","ipam":{"type":"host-local"}}]}"#.into(),
            "\"9.0.0\" (in cniVersions)",
        ),
        (
            r#"{"cniVersion":"1.0.0","name":"n","type":"ptp","ipam":{"type":"host-local"}}"#.into(),
            "plugins is missing",
        ),
        (
            r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"ptp"},{"type":"portmap"}]}"#.into(),
            "no plugin carries an IPAM",
        ),
        (
            r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"ptp","ipam":{"type":"dipam","delegate":{"type":"host-local"}}}]}"#.into(),
            "plugins[0] already uses dipam",
        ),
        (
            r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"ptp","ipam":{"subnet":"10.0.0.0/8"}}]}"#.into(),
            "has no ipam.type",
        ),
        (
            r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"ptp","ipam":{"type":"../sbin/x"}}]}"#.into(),
            "not a plugin's file name",
        ),
    ];
    for (input, why) in &cases {
        let e = wrap(input, ipam_mode(), None).unwrap_err().to_string();
        assert!(e.contains(why), "{input}: {e}");
    }
    // Unwrap: nothing to unwrap, or nothing to restore.
    assert_eq!(unwrap(PTP, ipam_mode()).unwrap_err(), WrapError::NotDipam);
    let e = unwrap(&v("3.0.0"), ipam_mode()).unwrap_err();
    assert!(matches!(e, WrapError::Version(_)), "{e}");
    let e = unwrap(
        r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"ptp","ipam":{"type":"dipam"}}]}"#,
        ipam_mode(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("no delegate"), "{e}");
    let e = unwrap(
        PTP,
        Choice {
            plugin: Some(1),
            main_mode: false,
        },
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("plugins[1] (portmap) does not use dipam"),
        "{e}"
    );
}
