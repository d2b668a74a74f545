//! The request configuration on stdin: validated here, forwarded to dipamd byte for byte.
//!
//! dipam reads only what it needs to reach dipamd (socket path, timeout, mode) and, as the main
//! plugin, what shapes the pod's datapath (`mtu`, `dns`, `prevResult`); the delegate's config is
//! dipamd's business. Unknown keys are ignored (spec §1 "Other keys"), and `runtimeConfig` is
//! never interpreted: it goes to dipamd and on to the delegate byte for byte, whatever casing
//! the runtime used (containerd sends `HostPort`, podman `hostPort`: docs/sources.md §9).
//!
//! dipam's own keys are [`KEYS`], and the parser reads them only through [`Key::get`]: that
//! table is what `dipam --help`, the man page dipam(1) and docs/configuration.md list, so an
//! operator never meets a key the plugin reads but no document names (the tests below fail
//! when the table and the parser, the help or the docs disagree).

use std::{path::PathBuf, time::Duration};

use rscni_types::{
    types::{CNIResult, Cmd, Dns, NetConf},
    version::{PluginInfo, SpecVersion},
};
use serde_json::Value;

use crate::error::PluginError;

/// What dipam speaks, from the one list of supported versions (dipam_proto::cni): the
/// config's cniVersion is negotiated against it here, and VERSION (cmd/version.rs) prints it.
pub fn plugin_info() -> PluginInfo {
    PluginInfo::new(
        SpecVersion::CURRENT,
        dipam_proto::cni::SUPPORTED_VERSIONS
            .iter()
            .filter_map(|v| v.parse().ok())
            .collect(),
    )
}

/// Where dipamd listens unless the config says otherwise.
pub const DEFAULT_SOCKET: &str = "/run/dipam/dipam.sock";

/// How long the plugin waits for dipamd. Shorter than any runtime's CNI timeout (kubelet's
/// runtime request timeout is 2 minutes), and longer than dipamd's own delegate timeout, so
/// that a hung delegate is reported by dipamd with details rather than cut off here.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(55);

/// How dipam was placed in the network config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `{"type":"ptp","ipam":{"type":"dipam","delegate":{...}}}`
    Ipam,
    /// `{"type":"dipam","ipam":{"type":"host-local",...}}`
    Main,
}

/// What the plugin needs from the config.
#[derive(Debug, Clone)]
pub struct PluginConf {
    /// The cniVersion string exactly as written: errors and results echo it.
    pub cni_version: String,
    pub version: SpecVersion,
    pub name: String,
    pub mode: Mode,
    pub socket: PathBuf,
    pub timeout: Duration,
    /// The config's `spoolDir`, if any. Not where a DEL goes: that is the spool dipamd
    /// publishes beside `socket` (crate::spool); a `spoolDir` naming another directory is
    /// only reported.
    pub spool_dir: Option<PathBuf>,
    /// Main mode: the MTU of both ends of the pod's veth (`mtu`); the kernel's default (1500)
    /// when absent.
    pub mtu: Option<u32>,
    /// Main mode: DNS settings from the config (`dns`), which override the IPAM's when set, as
    /// in the reference ptp plugin.
    pub dns: Option<Dns>,
    /// The previous result: the earlier plugin's for a chained ADD, the runtime's cached final
    /// result for CHECK and DEL (spec §3).
    pub prev_result: Option<CNIResult>,
    /// A DEL of a config naming dipam as its own delegate (refused for every other verb):
    /// nothing can have been allocated through it, so the DEL succeeds without a call.
    pub self_delegated: bool,
}

/// The MTUs a veth accepts (ETH_MIN_MTU..=ETH_MAX_MTU in the kernel).
const MTU_RANGE: std::ops::RangeInclusive<u64> = 68..=65535;

/// Where one of dipam's keys is read: which shape of config (see [`Mode`]) accepts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// At the top level, when dipam is the main plugin.
    Main,
    /// Inside `ipam`, when dipam is the IPAM of another plugin.
    Ipam,
    /// In either, wherever dipam's keys are for the config's shape.
    Both,
}

impl Place {
    /// Whether a config of `mode` accepts a key of this place.
    pub fn accepts(self, mode: Mode) -> bool {
        matches!(
            (self, mode),
            (Place::Both, _) | (Place::Main, Mode::Main) | (Place::Ipam, Mode::Ipam)
        )
    }
}

/// One of dipam's own config keys, with what its documentation says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key {
    /// The JSON key, as written in a conflist.
    pub name: &'static str,
    pub place: Place,
    /// Its default as docs/configuration.md's tables give it: a value, `none`, or `required`.
    pub default: &'static str,
    /// One line for `dipam --help` and the man page.
    pub summary: &'static str,
}

impl Key {
    /// The key's value in `obj` (the config, or its `ipam`, as the mode says). The parser
    /// reads dipam's keys only through this, so that [`KEYS`] is complete.
    pub fn get<'a>(&self, obj: &'a Value) -> Option<&'a Value> {
        #[cfg(test)]
        tests::READ.with(|r| r.borrow_mut().push(self.name));
        obj.get(self.name)
    }
}

pub const IPAM: Key = Key {
    name: "ipam",
    place: Place::Main,
    default: "required",
    summary: "the real IPAM (host-local, ...), which dipamd runs",
};
pub const DELEGATE: Key = Key {
    name: "delegate",
    place: Place::Ipam,
    default: "required",
    summary: "the real IPAM, which dipamd runs with it as `ipam`",
};
pub const SOCKET_PATH: Key = Key {
    name: "socketPath",
    place: Place::Both,
    default: DEFAULT_SOCKET,
    summary: "dipamd's --socket",
};
pub const TIMEOUT_SECONDS: Key = Key {
    name: "timeoutSeconds",
    place: Place::Both,
    default: "55",
    summary: "seconds to wait for dipamd, 0 < s <= 3600",
};
pub const SPOOL_DIR: Key = Key {
    name: "spoolDir",
    place: Place::Both,
    default: "none",
    summary: "not used (a DEL while dipamd is down goes to dipamd's own spool): remove it",
};
pub const MTU: Key = Key {
    name: "mtu",
    place: Place::Main,
    default: "the kernel's (1500)",
    summary: "the MTU of the pod's veth, 68-65535",
};
pub const DNS: Key = Key {
    name: "dns",
    place: Place::Main,
    default: "the IPAM's",
    summary: "the result's DNS (nameservers, domain, search, options)",
};

/// Every key dipam reads, in the order its documentation lists them.
pub static KEYS: [Key; 7] = [
    IPAM,
    DELEGATE,
    SOCKET_PATH,
    SPOOL_DIR,
    TIMEOUT_SECONDS,
    MTU,
    DNS,
];

/// The cniVersion to echo in an error: the config's own when it has one (spec §5 "Error").
pub fn error_version(stdin: &[u8]) -> String {
    serde_json::from_slice::<Value>(stdin)
        .ok()
        .and_then(|v| v.get("cniVersion")?.as_str().map(str::to_owned))
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| SpecVersion::CURRENT.to_string())
}

fn config_error(msg: impl Into<String>, details: impl Into<String>) -> PluginError {
    PluginError::Config {
        msg: msg.into(),
        details: details.into(),
    }
}

impl PluginConf {
    /// Parses and validates stdin for `cmd`: JSON (code 6), network name (7), version and the
    /// version floors CHECK >= 0.4.0, GC/STATUS >= 1.1.0 (1), dipam's own keys (7).
    pub fn parse(stdin: &[u8], cmd: Cmd) -> Result<Self, PluginError> {
        let (raw, conf) = decode(stdin)?;
        let version = plugin_info().negotiate(&conf, cmd)?;

        // The spec's `ipam` (where dipam's keys are in IPAM mode; the real IPAM in main mode).
        let ipam = raw.get("ipam");
        let (mode, dipam_keys) = mode_of(&raw, ipam, cmd)?;
        let dipam_keys = dipam_keys.unwrap_or(&Value::Null);
        let socket = match SOCKET_PATH.get(dipam_keys) {
            None | Some(Value::Null) => PathBuf::from(DEFAULT_SOCKET),
            Some(Value::String(s)) if !s.is_empty() => PathBuf::from(s),
            Some(other) => {
                return Err(config_error(
                    "socketPath must be a non-empty string",
                    format!("got {other}"),
                ));
            }
        };
        let spool_dir = match SPOOL_DIR.get(dipam_keys) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s.starts_with('/') => Some(PathBuf::from(s)),
            Some(other) => {
                return Err(config_error(
                    "spoolDir must be an absolute path",
                    format!("got {other}"),
                ));
            }
        };
        let timeout = match TIMEOUT_SECONDS.get(dipam_keys) {
            None | Some(Value::Null) => DEFAULT_TIMEOUT,
            Some(v) => match v.as_f64() {
                Some(s) if s > 0.0 && s <= 3600.0 => Duration::from_secs_f64(s),
                _ => {
                    return Err(config_error(
                        "timeoutSeconds must be a number of seconds between 0 and 3600",
                        format!("got {v}"),
                    ));
                }
            },
        };
        // In IPAM mode the top-level keys belong to the main plugin (ptp's own `mtu`).
        let own = |key: &Key| key.place.accepts(mode).then(|| key.get(&raw)).flatten();
        let mtu = match own(&MTU) {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_u64().filter(|m| MTU_RANGE.contains(m)) {
                Some(m) => u32::try_from(m).ok(),
                None => {
                    return Err(config_error(
                        "mtu must be a whole number between 68 and 65535",
                        format!("got {v}; a veth accepts MTUs from 68 to 65535"),
                    ));
                }
            },
        };
        Ok(Self {
            cni_version: conf.cni_version.clone(),
            version,
            name: conf.name,
            mode,
            socket,
            timeout,
            spool_dir,
            mtu,
            dns: conf.dns.filter(|_| own(&DNS).is_some()),
            prev_result: conf.prev_result,
            self_delegated: mode == Mode::Ipam
                && ipam
                    .and_then(|i| i.get(DELEGATE.name))
                    .and_then(|d| d.get("type"))
                    .and_then(Value::as_str)
                    == Some("dipam"),
        })
    }
}

/// The config on stdin as JSON (code 6) and as the spec's keys, with a valid network name
/// (code 7).
fn decode(stdin: &[u8]) -> Result<(Value, NetConf), PluginError> {
    let raw: Value = serde_json::from_slice(stdin)
        .map_err(|e| PluginError::Decode(format!("network config is not valid JSON: {e}")))?;
    if !raw.is_object() {
        return Err(PluginError::Decode(
            "network config must be a JSON object".into(),
        ));
    }
    // runtimeConfig is the runtime's and the delegate's business, in whatever key casing the
    // runtime chose; typed parsing would reject containerd's capitalised portMappings.
    // GC's valid list is dipamd's to check, entry by entry, with an error that names the
    // entry (code 7); typed parsing would answer some shapes with a bare serde message and
    // let others (an extra key) through.
    let mut typed = raw.clone();
    if let Some(obj) = typed.as_object_mut() {
        obj.remove("runtimeConfig");
        obj.remove("cni.dev/valid-attachments");
        obj.remove("cni.dev/attachments");
    }
    let conf: NetConf = serde_json::from_value(typed)
        .map_err(|e| PluginError::Decode(format!("network config: {e}")))?;
    // libcni's rule (dipam_proto::cni::names, which dipamd applies too), in its words.
    if conf.name.is_empty() {
        return Err(config_error("missing network name", ""));
    }
    if !dipam_proto::cni::names::is_valid_name(&conf.name) {
        return Err(config_error(
            format!("invalid characters found in network name: {}", conf.name),
            "",
        ));
    }
    Ok((raw, conf))
}

/// The mode the config's shape asks for (`ipam.delegate` set: IPAM mode; else main mode),
/// refusing the shapes that cannot work outside a DEL, and where dipam's own keys are.
fn mode_of<'a>(
    raw: &'a Value,
    ipam: Option<&'a Value>,
    cmd: Cmd,
) -> Result<(Mode, Option<&'a Value>), PluginError> {
    // The shape decides the mode; only then are the mode's own keys read.
    let ipam_mode = ipam.is_some_and(|i| i.get(DELEGATE.name).is_some());
    match ipam.filter(|_| ipam_mode).and_then(|i| DELEGATE.get(i)) {
        Some(delegate) => {
            let delegate_type = delegate
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or_default();
            // `"type":"dipam"` at the top means the runtime runs dipam as the main plugin:
            // an `ipam.delegate` there would silently turn it into an IPAM that creates no
            // interface. Say which shape was meant instead of guessing.
            // A DEL still goes through, in IPAM mode as older versions ran this shape:
            // what they allocated through it is released, and the pod can go.
            if raw.get("type").and_then(Value::as_str) == Some("dipam") && cmd != Cmd::Del {
                return Err(config_error(
                    "dipam is the main plugin here (\"type\":\"dipam\"), but ipam.delegate \
                     is set, which only IPAM mode uses",
                    "as the main plugin (dipam creates the pod's veth), name the real IPAM in \
                     ipam: \"type\":\"dipam\",\"ipam\":{\"type\":\"host-local\",...}; as the \
                     IPAM of another plugin, keep ipam.delegate and set the top-level type to \
                     that plugin: \"type\":\"ptp\",\"ipam\":{\"type\":\"dipam\",\
                     \"delegate\":{\"type\":\"host-local\",...}}",
                ));
            }
            // dipamd would run dipam as its own delegate: the inner call waits for the
            // outer one's key lock until the delegate timeout, and every DEL fails alike.
            // Its DEL has nothing to release (no ADD through it ever allocated: it could
            // only wait on itself), and must not fail forever: it is answered without a
            // call (`self_delegated`).
            if delegate_type == "dipam" && cmd != Cmd::Del {
                return Err(config_error(
                    "ipam.delegate.type must not be dipam",
                    "ipam.delegate names the real IPAM dipamd runs (e.g. host-local, \
                     azure-vnet-ipam); dipam cannot be its own delegate",
                ));
            }
            if delegate_type.is_empty() {
                return Err(config_error(
                    "ipam.delegate.type is missing",
                    "dipam as an IPAM plugin runs the IPAM named in ipam.delegate, e.g. \
                     \"ipam\":{\"type\":\"dipam\",\"delegate\":{\"type\":\"host-local\",\
                     \"ranges\":[[{\"subnet\":\"10.77.0.0/16\"}]]}}",
                ));
            }
            Ok((Mode::Ipam, ipam))
        }
        None => {
            let own_type = raw.get("type").and_then(Value::as_str).unwrap_or_default();
            let ipam_type = IPAM
                .get(raw)
                .and_then(|i| i.get("type"))
                .and_then(Value::as_str)
                .unwrap_or_default();
            if ipam_type.is_empty() || ipam_type == own_type || ipam_type == "dipam" {
                return Err(config_error(
                    "no delegate IPAM configured",
                    "as the IPAM of another plugin, set ipam.delegate to the real IPAM \
                     (\"ipam\":{\"type\":\"dipam\",\"delegate\":{\"type\":\"host-local\",...}}); \
                     as the main plugin, set ipam to the real IPAM \
                     (\"type\":\"dipam\",\"ipam\":{\"type\":\"host-local\",...})",
                ));
            }
            Ok((Mode::Main, Some(raw)))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{cell::RefCell, collections::BTreeSet};

    use super::*;

    thread_local! {
        /// The keys [`Key::get`] was asked for on this thread, in order.
        pub(super) static READ: RefCell<Vec<&'static str>> = const { RefCell::new(Vec::new()) };
    }

    /// A valid value for each of dipam's keys.
    fn sample(key: &Key) -> Value {
        match key.name {
            "ipam" => serde_json::json!({"type": "host-local"}),
            "delegate" => serde_json::json!({"type": "host-local"}),
            "socketPath" => "/tmp/s.sock".into(),
            "spoolDir" => "/tmp/spool".into(),
            "timeoutSeconds" => 5.into(),
            "mtu" => 1400.into(),
            "dns" => serde_json::json!({"nameservers": ["10.0.0.53"]}),
            other => panic!("{other}: give the new key a valid value here"),
        }
    }

    /// The keys `conf` made the parser read, as a set.
    fn read_by(conf: &Value) -> (PluginConf, BTreeSet<&'static str>) {
        READ.with(|r| r.borrow_mut().clear());
        let c = PluginConf::parse(conf.to_string().as_bytes(), Cmd::Add).unwrap();
        (c, READ.with(|r| r.borrow().iter().copied().collect()))
    }

    /// The parser reads exactly the keys `KEYS` documents, each in the mode its place says,
    /// given a config that sets every one of them (plus the other mode's) everywhere.
    #[test]
    fn the_parser_reads_exactly_the_documented_keys() {
        let mut all = serde_json::Map::new();
        for k in &KEYS {
            all.insert(k.name.to_owned(), sample(k));
        }
        let expect = |mode| -> BTreeSet<&'static str> {
            KEYS.iter()
                .filter(|k| k.place.accepts(mode))
                .map(|k| k.name)
                .collect()
        };

        let mut main = Value::Object(all.clone());
        main["cniVersion"] = "1.0.0".into();
        main["name"] = "n".into();
        main["type"] = "dipam".into();
        let (c, read) = read_by(&main);
        assert_eq!(c.mode, Mode::Main);
        assert_eq!(read, expect(Mode::Main), "main mode");
        assert_eq!(
            (c.mtu, c.socket.to_str()),
            (Some(1400), Some("/tmp/s.sock"))
        );
        assert!(c.dns.is_some());

        let mut ipam = Value::Object(all.clone());
        ipam["type"] = "dipam".into();
        let mut outer = Value::Object(all);
        outer["cniVersion"] = "1.0.0".into();
        outer["name"] = "n".into();
        outer["type"] = "ptp".into();
        outer["ipam"] = ipam;
        let (c, read) = read_by(&outer);
        assert_eq!(c.mode, Mode::Ipam);
        assert_eq!(read, expect(Mode::Ipam), "IPAM mode");
        // The main plugin's own keys stay its own.
        assert_eq!((c.mtu, c.dns.is_some()), (None, false));
        assert_eq!(c.timeout, Duration::from_secs(5));
    }

    /// `dipam --help` lists every key the parser reads (spoolDir included), and nothing else
    /// as a key.
    #[test]
    fn dipam_help_lists_every_key() {
        let help = crate::help::text();
        let (_, section) = help
            .split_once(crate::help::KEYS_HEADING)
            .expect("the key list's heading");
        let listed: Vec<&str> = section
            .lines()
            .skip(1)
            .take_while(|l| !l.is_empty())
            .map(|l| l.split_whitespace().next().unwrap())
            .collect();
        let keys: Vec<&str> = KEYS.iter().map(|k| k.name).collect();
        assert_eq!(listed, keys, "{help}");
        assert!(listed.contains(&"spoolDir"));
    }

    /// docs/configuration.md's two key tables are `KEYS`, per mode, with the same defaults.
    #[test]
    fn the_configuration_reference_lists_the_same_keys() {
        let doc = include_str!("../../docs/configuration.md");
        let table = |heading: &str| -> Vec<(String, String)> {
            let at = doc
                .find(heading)
                .unwrap_or_else(|| panic!("no {heading:?}"));
            doc[at..]
                .lines()
                .skip(1)
                .take_while(|l| !l.starts_with('#'))
                .filter(|l| l.starts_with("| `"))
                .map(|l| {
                    let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                    (cells[1].replace('`', ""), cells[2].replace('`', ""))
                })
                .collect()
        };
        for (heading, mode) in [
            ("### As the main plugin", Mode::Main),
            ("### As the IPAM of another plugin", Mode::Ipam),
        ] {
            let want: Vec<(String, String)> = KEYS
                .iter()
                .filter(|k| k.place.accepts(mode))
                .map(|k| (k.name.to_owned(), k.default.to_owned()))
                .collect();
            assert_eq!(table(heading), want, "docs/configuration.md {heading}");
        }
    }

    fn parse(s: &str, cmd: Cmd) -> Result<PluginConf, PluginError> {
        PluginConf::parse(s.as_bytes(), cmd)
    }

    const IPAM: &str = r#"{"cniVersion":"1.0.0","name":"n","type":"ptp","ipam":{"type":"dipam","socketPath":"/tmp/s.sock","delegate":{"type":"host-local"}}}"#;

    #[test]
    fn ipam_mode_reads_socket_from_ipam() {
        let c = parse(IPAM, Cmd::Add).unwrap();
        assert_eq!(c.mode, Mode::Ipam);
        assert_eq!(c.socket, PathBuf::from("/tmp/s.sock"));
        assert_eq!(c.timeout, DEFAULT_TIMEOUT);
        assert_eq!(c.cni_version, "1.0.0");
    }

    #[test]
    fn main_mode_reads_socket_from_top_level() {
        let c = parse(
            r#"{"cniVersion":"0.4.0","name":"n","type":"dipam","ipam":{"type":"host-local"}}"#,
            Cmd::Add,
        )
        .unwrap();
        assert_eq!(c.mode, Mode::Main);
        assert_eq!(c.socket, PathBuf::from(DEFAULT_SOCKET));
    }

    #[test]
    fn codes_follow_the_spec() {
        let code = |s: &str, cmd| parse(s, cmd).unwrap_err().to_cni(false).code;
        assert_eq!(code("not json", Cmd::Add), 6);
        assert_eq!(code("[1,2]", Cmd::Add), 6);
        assert_eq!(
            code(
                r#"{"cniVersion":"1.0.0","type":"ptp","ipam":{"type":"dipam","delegate":{"type":"host-local"}}}"#,
                Cmd::Add
            ),
            7
        );
        assert_eq!(
            code(
                r#"{"cniVersion":"1.0.0","name":"bad/name","type":"ptp","ipam":{"type":"dipam","delegate":{"type":"x"}}}"#,
                Cmd::Add
            ),
            7
        );
        assert_eq!(
            code(
                r#"{"cniVersion":"9.9.9","name":"n","type":"ptp","ipam":{"type":"dipam","delegate":{"type":"x"}}}"#,
                Cmd::Add
            ),
            1
        );
        let v031 = IPAM.replace("1.0.0", "0.3.1");
        assert_eq!(code(&v031, Cmd::Check), 1);
        assert_eq!(code(IPAM, Cmd::Gc), 1);
        assert_eq!(code(IPAM, Cmd::Status), 1);
        assert_eq!(
            code(
                r#"{"cniVersion":"1.0.0","name":"n","type":"ptp","ipam":{"type":"dipam"}}"#,
                Cmd::Add
            ),
            7
        );
        assert_eq!(
            code(
                r#"{"cniVersion":"1.0.0","name":"n","type":"ptp","ipam":{"type":"dipam","delegate":{}}}"#,
                Cmd::Add
            ),
            7
        );
        assert_eq!(
            code(
                r#"{"cniVersion":"1.0.0","name":"n","type":"ptp","ipam":{"type":"dipam","socketPath":5,"delegate":{"type":"h"}}}"#,
                Cmd::Add
            ),
            7
        );
    }

    /// dipam as its own delegate deadlocks on its own key; `"type":"dipam"` at the top with
    /// `ipam.delegate` would run IPAM mode and create no interface. Both are refused (7) with
    /// a message that says which shape was meant.
    #[test]
    fn self_delegation_and_mixed_shapes_are_refused() {
        let cases = [
            (
                r#"{"cniVersion":"1.0.0","name":"n","type":"ptp","ipam":{"type":"dipam","delegate":{"type":"dipam"}}}"#,
                "must not be dipam",
            ),
            (
                r#"{"cniVersion":"1.0.0","name":"n","type":"dipam","ipam":{"type":"dipam","delegate":{"type":"host-local"}}}"#,
                "main plugin",
            ),
            (
                r#"{"cniVersion":"1.0.0","name":"n","type":"dipam","ipam":{"type":"host-local","delegate":{"type":"host-local"}}}"#,
                "main plugin",
            ),
        ];
        for (conf, said) in cases {
            let e = parse(conf, Cmd::Add).unwrap_err().to_cni(false);
            assert_eq!(e.code, 7, "{conf}: {e:?}");
            assert!(e.msg.contains(said), "{conf}: {}", e.msg);
            // A DEL goes through: a refused config must not keep its pod from going.
            let del = parse(conf, Cmd::Del).unwrap();
            assert_eq!(del.mode, Mode::Ipam);
            assert_eq!(del.self_delegated, said == "must not be dipam", "{conf}");
        }
    }

    #[test]
    fn main_mode_reads_mtu_dns_and_prev_result() {
        let c = parse(
            r#"{"cniVersion":"1.1.0","name":"n","type":"dipam","mtu":1400,
                "dns":{"nameservers":["10.0.0.53"]},
                "prevResult":{"cniVersion":"1.1.0","interfaces":[{"name":"lo"}]},
                "ipam":{"type":"host-local"}}"#,
            Cmd::Add,
        )
        .unwrap();
        assert_eq!(c.mtu, Some(1400));
        assert_eq!(c.dns.unwrap().nameservers, vec!["10.0.0.53".to_string()]);
        assert_eq!(c.prev_result.unwrap().interfaces[0].name, "lo");
        for bad in ["0", "67", "65536", "1500.5", "\"1500\"", "-1"] {
            let conf = format!(
                r#"{{"cniVersion":"1.1.0","name":"n","type":"dipam","mtu":{bad},"ipam":{{"type":"host-local"}}}}"#
            );
            let e = parse(&conf, Cmd::Add).unwrap_err().to_cni(false);
            assert_eq!(e.code, 7, "mtu {bad}: {e:?}");
        }
    }

    /// containerd's go-cni has no JSON tags on PortMapping: it sends `HostPort`. dipam must
    /// pass that through, not refuse it (docs/sources.md §9).
    #[test]
    fn runtime_config_in_any_casing_is_accepted() {
        for rc in [
            r#"{"portMappings":[{"HostPort":8080,"ContainerPort":80,"Protocol":"tcp","HostIP":""}]}"#,
            r#"{"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"tcp"}]}"#,
            r#"{"portMappings":"not even a list"}"#,
        ] {
            let conf = format!(
                r#"{{"cniVersion":"1.0.0","name":"n","type":"dipam","capabilities":{{"portMappings":true}},"runtimeConfig":{rc},"ipam":{{"type":"host-local"}}}}"#
            );
            assert!(parse(&conf, Cmd::Add).is_ok(), "{rc}");
        }
    }

    #[test]
    fn error_version_echoes_the_config() {
        assert_eq!(error_version(br#"{"cniVersion":"0.4.0"}"#), "0.4.0");
        assert_eq!(error_version(b"garbage"), "1.1.0");
    }
}
