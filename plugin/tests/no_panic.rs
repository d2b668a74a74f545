//! A deterministic mutation pass over the seed configs, on stable Rust, in every CI run: the
//! plugin's env and stdin parsing never panics, and every outcome is exit 0, or exit 1 with a
//! CNI error JSON on stdout. (The coverage-guided version is plugin/fuzz, run with cargo fuzz.)

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use std::path::Path;

const COMMANDS: [&str; 7] = ["ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION", "BOGUS"];

fn seeds() -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/parse");
    let mut out: Vec<Vec<u8>> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .collect();
    out.sort();
    assert!(!out.is_empty());
    out
}

/// xorshift64, for reproducible mutations.
fn next(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

fn mutate(seed: &[u8], rng: &mut u64) -> Vec<u8> {
    let mut b = seed.to_vec();
    for _ in 0..=(next(rng) % 4) {
        if b.is_empty() {
            break;
        }
        let i = (next(rng) as usize) % b.len();
        match next(rng) % 6 {
            0 => b[i] = next(rng) as u8,
            1 => b.truncate(i),
            2 => {
                b.remove(i);
            }
            3 => b.insert(i, b"{}[]\",:0\\"[(next(rng) % 9) as usize]),
            4 => b
                .splice(i..i, b"\"cniVersion\":\"0.2.0\",".iter().copied())
                .for_each(drop),
            _ => b[i] = b'"',
        }
    }
    b
}

/// The socket and timeout every seed is given: a path under a file fails to connect with
/// ENOTDIR, which the plugin does not wait out (a missing socket it would, until
/// `timeoutSeconds`: plugin/src/retry.rs), and the short timeout bounds the mutants that turn
/// the path into a missing one.
const HERMETIC: &str = "\"socketPath\": \"/dev/null/dipam.sock\",\"timeoutSeconds\":0.001";

/// A mutant of `seed` that the plugin would not send to a real socket, nor wait long for: one
/// whose mutation renamed `socketPath` or `timeoutSeconds`, or moved them out of the section
/// the plugin reads (a mangled `type`), would reach the node's default socket and wait for
/// it up to 55 s.
fn hermetic_mutant(seed: &[u8], rng: &mut u64) -> Vec<u8> {
    loop {
        // As the test sends it: invalid UTF-8 replaced (which can make a mutant parse).
        let m = String::from_utf8_lossy(&mutate(seed, rng))
            .into_owned()
            .into_bytes();
        use rscni_types::types::Cmd;
        let hermetic = [Cmd::Add, Cmd::Del, Cmd::Check, Cmd::Gc, Cmd::Status]
            .into_iter()
            .all(|cmd| {
                dipam_plugin::conf::PluginConf::parse(&m, cmd).map_or(true, |c| {
                    c.socket == Path::new("/dev/null/dipam.sock")
                        && c.timeout < std::time::Duration::from_secs(1)
                })
            });
        if hermetic {
            return m;
        }
    }
}

#[test]
fn mutated_inputs_never_panic() {
    let mut rng = 0x5eed_u64;
    let mut runs = 0;
    for seed in seeds() {
        // Hermetic: no socketPath points anywhere real.
        let seed = String::from_utf8(seed)
            .unwrap()
            .replace("\"socketPath\": \"/run/dipam/dipam.sock\"", HERMETIC)
            .into_bytes();
        assert!(String::from_utf8_lossy(&seed).contains(HERMETIC));
        for i in 0..400 {
            let input = if i == 0 {
                seed.clone()
            } else {
                hermetic_mutant(&seed, &mut rng)
            };
            let command = COMMANDS[(next(&mut rng) % COMMANDS.len() as u64) as usize];
            let getenv = |k: &str| -> Option<String> {
                match k {
                    "CNI_COMMAND" => Some(command.into()),
                    "CNI_CONTAINERID" => Some("c1".into()),
                    "CNI_IFNAME" => Some("eth0".into()),
                    "CNI_NETNS" => Some("/var/run/netns/none".into()),
                    _ => None,
                }
            };
            let mut out = Vec::new();
            let mut err = Vec::new();
            // DELs that cannot reach dipamd are spooled; keep them out of the real spool.
            let input = String::from_utf8_lossy(&input).replace(
                "\"socketPath\"",
                "\"spoolDir\":\"/tmp/dipam-no-panic-spool\",\"socketPath\"",
            );
            let code = dipam_plugin::run(
                &["dipam".into()],
                &getenv,
                &mut input.as_bytes(),
                &mut out,
                &mut err,
            );
            assert!(code == 0 || code == 1, "{command} {input:?}: exit {code}");
            if code == 1 {
                let v: serde_json::Value = serde_json::from_slice(&out)
                    .unwrap_or_else(|e| panic!("{command} {input:?}: stdout not JSON: {e}"));
                assert!(v["code"].as_u64().is_some(), "{v}");
                assert!(v["msg"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
            }
            runs += 1;
        }
    }
    assert!(runs >= 2_400);
    let _ = std::fs::remove_dir_all("/tmp/dipam-no-panic-spool");
}
