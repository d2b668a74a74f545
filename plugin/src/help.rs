//! What `dipam --help` prints. dipamctl renders the same parts as the man page dipam(1), and
//! both list the config keys from the parser's own table (`conf::KEYS`), so neither can name
//! a key the plugin does not read or miss one it does.

use crate::conf::{KEYS, Key, Place};

/// The one-line description.
pub const ABOUT: &str = "a delegated-IPAM CNI plugin";

/// What dipam is and how a runtime runs it.
pub const DESCRIPTION: &str = "\
dipam is run by a container runtime (containerd, podman, CRI-O) through libcni, never by hand:
the runtime sets CNI_COMMAND, CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME, CNI_ARGS and CNI_PATH and
writes the network config on stdin. dipam forwards ADD, DEL, CHECK, GC and STATUS to the dipamd
daemon over a unix socket (default /run/dipam/dipam.sock); dipamd runs the delegated IPAM plugin
(host-local, azure-vnet-ipam, ...) and records every attachment. VERSION is answered locally.";

/// The two shapes of config, each as an example.
pub const EXAMPLES: &str = "\
Use it as the main plugin (dipam creates the pod's veth, addresses and routes):
  {\"type\":\"dipam\",\"socketPath\":\"/run/dipam/dipam.sock\",\"mtu\":1500,
   \"ipam\":{\"type\":\"host-local\",\"ranges\":[[{\"subnet\":\"10.77.0.0/16\"}]],
           \"routes\":[{\"dst\":\"0.0.0.0/0\"}]}}

or as the IPAM of another plugin:
  {\"type\":\"ptp\",\"ipam\":{\"type\":\"dipam\",\"socketPath\":\"/run/dipam/dipam.sock\",
   \"delegate\":{\"type\":\"host-local\",\"ranges\":[[{\"subnet\":\"10.77.0.0/16\"}]]}}}";

/// The heading of the key list.
pub const KEYS_HEADING: &str =
    "Config keys read by dipam (top level in main mode, in ipam in IPAM mode; others are ignored):";

/// Where to go next.
pub const FOOTER: &str = "\
Try it: CNI_COMMAND=VERSION dipam
Operate it: dipamctl status, dipamctl attachments
Manual: man dipam (installed by dipamctl install)";

/// A key's description: which mode reads it, what it is, its default.
pub fn describe(key: &Key) -> String {
    let mode = match key.place {
        Place::Main => "main mode: ",
        Place::Ipam => "IPAM mode: ",
        Place::Both => "",
    };
    let default = match key.default {
        "none" => String::new(),
        "required" => " (required)".to_owned(),
        d => format!(" (default {d})"),
    };
    format!("{mode}{}{default}", key.summary)
}

/// `dipam --help`.
pub fn text() -> String {
    let keys: String = KEYS
        .iter()
        .map(|k| format!("  {:<16} {}\n", k.name, describe(k)))
        .collect();
    format!("dipam: {ABOUT}.\n\n{DESCRIPTION}\n\n{EXAMPLES}\n\n{KEYS_HEADING}\n{keys}\n{FOOTER}")
}
