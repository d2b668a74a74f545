//! The restrictions a deployment puts on dipamd that a test can apply to a process: the
//! capability lines of deploy/systemd/dipamd.service (`CapabilityBoundingSet`,
//! `AmbientCapabilities`, `NoNewPrivileges`) and the DaemonSet's `securityContext` in
//! deploy/kubernetes/dipam.yaml (`capabilities.add/drop`, `allowPrivilegeEscalation`), parsed
//! from the shipped files and applied through util-linux's `setpriv`.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::{bins, yaml};

/// Linux capability numbers (include/uapi/linux/capability.h), by name without `CAP_`.
const CAPS: [&str; 41] = [
    "chown",
    "dac_override",
    "dac_read_search",
    "fowner",
    "fsetid",
    "kill",
    "setgid",
    "setuid",
    "setpcap",
    "linux_immutable",
    "net_bind_service",
    "net_broadcast",
    "net_admin",
    "net_raw",
    "ipc_lock",
    "ipc_owner",
    "sys_module",
    "sys_rawio",
    "sys_chroot",
    "sys_ptrace",
    "sys_pacct",
    "sys_admin",
    "sys_boot",
    "sys_nice",
    "sys_resource",
    "sys_time",
    "sys_tty_config",
    "mknod",
    "lease",
    "audit_write",
    "audit_control",
    "setfcap",
    "mac_override",
    "mac_admin",
    "syslog",
    "wake_alarm",
    "block_suspend",
    "audit_read",
    "perfmon",
    "bpf",
    "checkpoint_restore",
];

/// What containerd (and CRI-O, Docker) give a non-privileged container unless told otherwise
/// (containerd's oci.defaultUnixCaps).
const RUNTIME_DEFAULT_CAPS: [&str; 14] = [
    "chown",
    "dac_override",
    "fsetid",
    "fowner",
    "mknod",
    "net_raw",
    "setgid",
    "setuid",
    "setfcap",
    "setpcap",
    "net_bind_service",
    "sys_chroot",
    "kill",
    "audit_write",
];

/// The restrictions a deployment puts on dipamd that a test can apply to a process.
#[derive(Debug, Clone)]
pub struct Restrictions {
    /// Capability names, lower case, without `cap_`.
    pub bounding: BTreeSet<String>,
    pub ambient: BTreeSet<String>,
    pub no_new_privs: bool,
}

impl Restrictions {
    /// `setpriv` with these restrictions, execing what follows.
    pub fn setpriv(&self) -> Vec<String> {
        let list = |set: &BTreeSet<String>| {
            std::iter::once("-all".to_owned())
                .chain(set.iter().map(|c| format!("+{c}")))
                .collect::<Vec<_>>()
                .join(",")
        };
        let mut argv = vec![
            "setpriv".to_owned(),
            "--bounding-set".into(),
            list(&self.bounding),
            // Ambient capabilities must be inheritable too.
            "--inh-caps".into(),
            list(&self.ambient),
            "--ambient-caps".into(),
            list(&self.ambient),
        ];
        if self.no_new_privs {
            argv.push("--no-new-privs".into());
        }
        argv
    }

    /// The capability mask a root process has under these restrictions (after exec, root's
    /// permitted and effective sets are its bounding set).
    pub fn mask(&self) -> u64 {
        self.bounding.iter().fold(0, |m, c| m | 1 << cap_bit(c))
    }
}

fn cap_bit(name: &str) -> usize {
    CAPS.iter()
        .position(|c| *c == name)
        .unwrap_or_else(|| panic!("unknown capability {name:?}"))
}

/// `CAP_NET_ADMIN` or `NET_ADMIN` -> `net_admin`.
pub fn cap_name(word: &str) -> String {
    let lower = word.to_ascii_lowercase();
    let name = lower.strip_prefix("cap_").unwrap_or(&lower).to_owned();
    cap_bit(&name);
    name
}

/// The restrictions of a systemd unit's `[Service]` section. Several lines of one setting add
/// up, an empty one resets it (systemd.exec(5)); an inverted list (`~`) is refused, so the
/// test never guesses.
pub fn unit_restrictions(text: &str) -> Restrictions {
    let mut bounding: Option<BTreeSet<String>> = None;
    let mut ambient = BTreeSet::new();
    let mut no_new_privs = false;
    for line in text.lines().map(str::trim) {
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let words = || -> BTreeSet<String> {
            assert!(
                !value.trim_start().starts_with('~'),
                "{key}=~ (an inverted list) is not handled by this test"
            );
            value.split_whitespace().map(cap_name).collect()
        };
        match key.trim() {
            "CapabilityBoundingSet" if value.trim().is_empty() => {
                bounding = Some(BTreeSet::new());
            }
            "CapabilityBoundingSet" => bounding.get_or_insert_default().extend(words()),
            "AmbientCapabilities" if value.trim().is_empty() => ambient.clear(),
            "AmbientCapabilities" => ambient.extend(words()),
            "NoNewPrivileges" => no_new_privs = value.trim() == "yes" || value.trim() == "true",
            _ => {}
        }
    }
    Restrictions {
        bounding: bounding.expect("the unit must bound dipamd's capabilities"),
        ambient,
        no_new_privs,
    }
}

pub fn shipped_unit() -> Restrictions {
    let path = bins::workspace().join("deploy/systemd/dipamd.service");
    unit_restrictions(&std::fs::read_to_string(path).expect("read the shipped unit"))
}

/// The DaemonSet of the shipped manifest (deploy/kubernetes/dipam.yaml), as tests read it:
/// the restrictions and the flags they run dipamd with are the ones users deploy.
pub fn shipped_daemonset() -> Value {
    let path = bins::workspace().join("deploy/kubernetes/dipam.yaml");
    let docs = yaml::parse(&std::fs::read_to_string(&path).expect("read the manifest"))
        .expect("the manifest parses");
    docs.into_iter()
        .find(|d| d["kind"] == "DaemonSet")
        .expect("a DaemonSet")
}

/// The restrictions of the DaemonSet's dipamd container: the runtime's default set minus
/// `drop` (ALL: everything) plus `add`; `allowPrivilegeEscalation: false` is no_new_privs.
pub fn daemonset_restrictions() -> Restrictions {
    let ds = shipped_daemonset();
    let c = ds["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("the DaemonSet's containers")
        .iter()
        .find(|c| c["name"] == "dipamd")
        .expect("a dipamd container");
    let sc = &c["securityContext"];
    assert_ne!(
        sc["privileged"], true,
        "a privileged dipamd has every capability: nothing to test, nothing bounded"
    );
    let names = |v: &Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .map(|s| s.as_str().expect("a capability name").to_owned())
            .collect()
    };
    let drop = names(&sc["capabilities"]["drop"]);
    let mut bounding: BTreeSet<String> = if drop.iter().any(|d| d == "ALL") {
        BTreeSet::new()
    } else {
        let dropped: BTreeSet<String> = drop.iter().map(|d| cap_name(d)).collect();
        RUNTIME_DEFAULT_CAPS
            .iter()
            .map(|c| (*c).to_owned())
            .filter(|c| !dropped.contains(c))
            .collect()
    };
    bounding.extend(
        names(&sc["capabilities"]["add"])
            .iter()
            .map(|a| cap_name(a)),
    );
    Restrictions {
        bounding,
        ambient: BTreeSet::new(),
        no_new_privs: sc["allowPrivilegeEscalation"] == false,
    }
}
