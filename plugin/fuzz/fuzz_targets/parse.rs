//! Fuzzes what the plugin reads from the runtime: CNI_* variables and the stdin config.
//! The first bytes pick the command and environment values; the rest is stdin. The socket
//! path never exists, so no call leaves the process. The property: no panic, and every
//! outcome is exit 0, or exit 1 with one CNI error JSON on stdout.
#![no_main]

use libfuzzer_sys::fuzz_target;

const COMMANDS: [&str; 8] = [
    "ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION", "", "BOGUS",
];

fuzz_target!(|data: &[u8]| {
    let (head, stdin) = data.split_at(data.len().min(4));
    let pick = |i: usize| head.get(i).copied().unwrap_or(0) as usize;
    let command = COMMANDS[pick(0) % COMMANDS.len()].to_owned();
    let cid = ["c1", "", "-x", "A_b.9", "a/b"][pick(1) % 5].to_owned();
    let ifname = ["eth0", "", "eth0:1", "0123456789abcdef"][pick(2) % 4].to_owned();
    let netns = ["/var/run/netns/x", ""][pick(3) % 2].to_owned();
    let getenv = move |k: &str| -> Option<String> {
        match k {
            "CNI_COMMAND" => Some(command.clone()),
            "CNI_CONTAINERID" => Some(cid.clone()),
            "CNI_IFNAME" => Some(ifname.clone()),
            "CNI_NETNS" => Some(netns.clone()),
            "CNI_PATH" => Some("/nonexistent".into()),
            _ => None,
        }
    };
    // Keep runs hermetic: point any socketPath at nowhere.
    let text = String::from_utf8_lossy(stdin).replace("socketPath", "socketPathX");
    let mut out = Vec::new();
    let mut err = Vec::new();
    let code = dipam_plugin::run(
        &["dipam".into()],
        &getenv,
        &mut text.as_bytes(),
        &mut out,
        &mut err,
    );
    assert!(code == 0 || code == 1);
    if code == 1 {
        let v: serde_json_check::Value = serde_json_check::from_slice(&out).expect("error JSON");
        assert!(v.get("code").is_some());
    }
});

mod serde_json_check {
    pub use serde_json::{Value, from_slice};
}
