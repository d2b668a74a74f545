//! The runtime's CNI_* variables, read once through an injected `getenv` (tests never touch the
//! process environment). Rules: docs/sources.md §2.1 and §2.9.

use dipam_proto::cni::names;
use rscni_types::types::Cmd;

use crate::error::PluginError;

/// What the runtime told the plugin through the environment, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmdArgs {
    pub command: Cmd,
    pub container_id: String,
    pub netns: String,
    pub ifname: String,
    pub args: String,
    pub path: String,
}

/// libcni sets every CNI_* variable and uses "" for the ones a command does not need, so an
/// empty value counts as absent (spec §2.1).
fn var(getenv: &dyn Fn(&str) -> Option<String>, key: &str) -> String {
    getenv(key).unwrap_or_default()
}

/// Reads the command alone: VERSION must be answerable before anything else is validated.
pub fn command(getenv: &dyn Fn(&str) -> Option<String>) -> Result<Option<Cmd>, PluginError> {
    match var(getenv, "CNI_COMMAND").as_str() {
        "" => Ok(None),
        other => other.parse::<Cmd>().map(Some).map_err(PluginError::from),
    }
}

impl CmdArgs {
    /// Reads and validates the variables `command` needs. Missing ones are reported together,
    /// by name, with code 4 (spec §3.2: "msg MUST name them").
    pub fn from_env(
        command: Cmd,
        getenv: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, PluginError> {
        let container_id = var(getenv, "CNI_CONTAINERID");
        let netns = var(getenv, "CNI_NETNS");
        let ifname = var(getenv, "CNI_IFNAME");
        let required: &[&'static str] = match command {
            Cmd::Add | Cmd::Check => &["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"],
            // The netns may already be gone at DEL (containerd sends ""): spec §2.5.
            Cmd::Del => &["CNI_CONTAINERID", "CNI_IFNAME"],
            Cmd::Gc | Cmd::Status | Cmd::Version => &[],
        };
        let missing: Vec<&'static str> = required
            .iter()
            .copied()
            .filter(|k| match *k {
                "CNI_CONTAINERID" => container_id.is_empty(),
                "CNI_NETNS" => netns.is_empty(),
                _ => ifname.is_empty(),
            })
            .collect();
        if !missing.is_empty() {
            return Err(PluginError::MissingEnv(missing));
        }
        // Identifiers become ledger keys and host-local file contents: reject what the spec
        // rejects before anything reaches dipamd (§2.9).
        // The rules are dipam_proto::cni::names (dipamd applies the same); the messages are
        // the ones libcni's skel prints.
        if !container_id.is_empty() && !names::is_valid_name(&container_id) {
            return Err(PluginError::InvalidEnv(format!(
                "invalid characters in containerID: {container_id}"
            )));
        }
        if let Err(e) = names::check_ifname(&ifname) {
            let msg = match e {
                // Absent: reported above when the command needs it.
                names::IfnameError::Empty => None,
                names::IfnameError::TooLong => Some(format!(
                    "interface name is too long: interface name should be less than {} \
                     characters: {ifname}",
                    names::IFNAME_MAX + 1
                )),
                names::IfnameError::Dots => Some("interface name is . or ..".to_owned()),
                names::IfnameError::BadChar => Some(format!(
                    "interface name contains / or : or whitespace characters: {ifname}"
                )),
            };
            if let Some(msg) = msg {
                return Err(PluginError::InvalidEnv(msg));
            }
        }
        Ok(Self {
            command,
            container_id,
            netns,
            ifname,
            args: var(getenv, "CNI_ARGS"),
            path: var(getenv, "CNI_PATH"),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect();
        move |k: &str| map.get(k).cloned()
    }

    #[test]
    fn add_needs_all_three_and_names_them() {
        let err = CmdArgs::from_env(Cmd::Add, &env(&[("CNI_IFNAME", "")])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "required env variables [CNI_CONTAINERID,CNI_NETNS,CNI_IFNAME] missing"
        );
    }

    #[test]
    fn del_accepts_an_empty_netns() {
        let args = CmdArgs::from_env(
            Cmd::Del,
            &env(&[
                ("CNI_CONTAINERID", "Abc_1.x-2"),
                ("CNI_IFNAME", "eth0"),
                ("CNI_NETNS", ""),
            ]),
        )
        .unwrap();
        assert_eq!(args.netns, "");
        assert_eq!(args.container_id, "Abc_1.x-2");
    }

    #[test]
    fn bad_identifiers_are_code_4() {
        for (cid, ifname) in [
            ("-leading-dash", "eth0"),
            ("has/slash", "eth0"),
            ("ok", "this-name-is-too-long"),
            ("ok", "a:b"),
            ("ok", ".."),
            ("ok", "sp ace"),
        ] {
            let e = CmdArgs::from_env(
                Cmd::Add,
                &env(&[
                    ("CNI_CONTAINERID", cid),
                    ("CNI_IFNAME", ifname),
                    ("CNI_NETNS", "/x"),
                ]),
            )
            .unwrap_err();
            assert_eq!(e.to_cni(false).code, 4, "{cid} {ifname}: {e}");
        }
    }

    /// The name rules moved from rscni to dipam_proto::cni::names (shared with dipamd): the
    /// verdicts and messages are rscni's, unchanged.
    #[test]
    fn name_rules_and_messages_match_rscni() {
        use rscni_types::types::{ContainerId, InterfaceName};
        for (cid, ifname) in [
            ("ok", "eth0"),
            ("Abc_1.x-2", "net1"),
            ("-leading-dash", "eth0"),
            ("has/slash", "eth0"),
            ("é", "eth0"),
            ("ok", "this-name-is-too-long"),
            ("ok", "exactly15chars_"),
            ("ok", "a:b"),
            ("ok", "a/b"),
            ("ok", ".."),
            ("ok", "."),
            ("ok", "sp ace"),
            ("ok", "tab\tx"),
        ] {
            let ours = CmdArgs::from_env(
                Cmd::Add,
                &env(&[
                    ("CNI_CONTAINERID", cid),
                    ("CNI_IFNAME", ifname),
                    ("CNI_NETNS", "/x"),
                ]),
            )
            .err()
            .map(|e| e.to_string());
            let theirs = cid
                .parse::<ContainerId>()
                .err()
                .or_else(|| ifname.parse::<InterfaceName>().err())
                .map(|e| PluginError::from(e).to_string());
            assert_eq!(ours, theirs, "{cid} {ifname}");
        }
    }

    #[test]
    fn gc_and_status_need_no_container_vars() {
        assert!(CmdArgs::from_env(Cmd::Gc, &env(&[])).is_ok());
        assert!(CmdArgs::from_env(Cmd::Status, &env(&[])).is_ok());
    }

    #[test]
    fn unknown_command_is_code_4_and_named() {
        let e = command(&env(&[("CNI_COMMAND", "FROB")])).unwrap_err();
        assert_eq!(e.to_cni(false).code, 4);
        assert!(e.to_string().contains("FROB"), "{e}");
        assert_eq!(command(&env(&[])).unwrap(), None);
    }
}
