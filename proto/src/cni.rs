//! The CNI facts the plugin, dipamd and dipamctl must agree on: the spec versions dipam speaks,
//! the rules for names that become ledger keys and delegate arguments, and the table of error
//! codes. Each is written here once; the plugin, dipamd, `dipamctl install` and docs/cfp.md §9
//! (checked by a test below) all take them from here.

/// The CNI spec versions dipam accepts in a network config, oldest first; the last is the one
/// dipam answers in when the input names none. A config's `cniVersion` must match one exactly
/// (libcni's reconciler does the same; docs/sources.md §2.2). 0.1.0 and 0.2.0 are absent:
/// their ADD result uses the `ip4`/`ip6` layout dipam does not produce.
pub const SUPPORTED_VERSIONS: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// `SUPPORTED_VERSIONS` as a runtime reads them: "0.3.0, 0.3.1, ...".
pub fn supported_versions_list() -> String {
    SUPPORTED_VERSIONS.join(", ")
}

/// The name rules a runtime's values must pass before they become ledger keys, file names of
/// a delegate's store or a delegate's environment (docs/sources.md §2.9: libcni's
/// `pkg/utils/utils.go`). The plugin checks them before dipamd is called, and dipamd checks
/// them again (any local root process can speak to its socket); each side words its own
/// message.
pub mod names {
    /// The longest interface name the kernel accepts (`IFNAMSIZ - 1`).
    pub const IFNAME_MAX: usize = 15;

    /// `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`, libcni's rule for container IDs and network names.
    /// An empty name fails it.
    pub fn is_valid_name(s: &str) -> bool {
        let mut chars = s.chars();
        chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
            && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
    }

    /// Why an interface name is refused, in the order the rules are checked.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum IfnameError {
        Empty,
        /// Longer than [`IFNAME_MAX`] bytes.
        TooLong,
        /// `.` or `..`, which the kernel reserves.
        Dots,
        /// Contains `/`, `:` or white space (the kernel's `dev_valid_name`).
        BadChar,
    }

    /// The kernel's interface name rule (`dev_valid_name`), which the spec defers to.
    pub fn check_ifname(s: &str) -> Result<(), IfnameError> {
        if s.is_empty() {
            Err(IfnameError::Empty)
        } else if s.len() > IFNAME_MAX {
            Err(IfnameError::TooLong)
        } else if s == "." || s == ".." {
            Err(IfnameError::Dots)
        } else if s.chars().any(|c| c == '/' || c == ':' || c.is_whitespace()) {
            Err(IfnameError::BadChar)
        } else {
            Ok(())
        }
    }
}

/// Every CNI error code dipam's plugin or dipamd returns. 0-99 are the spec's (docs/sources.md
/// §3.2); dipam's own start at 150 so that they never collide with a code dipamd passes
/// through from a delegate (azure-vnet-ipam uses 100, Go's skel 999). 150-159 are dipamd's
/// (the plugin reuses 150 and 155 for the same meaning), 160-169 the plugin's main-mode
/// datapath's, 170-179 dipamd's GC. What each means for an operator: docs/cfp.md §9.
pub mod codes {
    // The spec's codes (SPEC.md §5 "Error").
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    pub const UNKNOWN_CONTAINER: u32 = 3;
    pub const INVALID_ENV: u32 = 4;
    pub const IO_FAILURE: u32 = 5;
    pub const DECODE_FAILURE: u32 = 6;
    pub const INVALID_CONFIG: u32 = 7;
    pub const TRY_AGAIN_LATER: u32 = 11;
    /// STATUS: the plugin cannot serve ADD now.
    pub const NOT_AVAILABLE: u32 = 50;
    /// STATUS: existing pods may have limited connectivity.
    pub const LIMITED_CONNECTIVITY: u32 = 51;

    // dipamd's (and the plugin's, for 150 and 155).
    pub const INTERNAL: u32 = 150;
    pub const EXISTS_WITH_OTHER_CONFIG: u32 = 151;
    pub const DELEGATE_NOT_FOUND: u32 = 152;
    pub const DELEGATE_TIMEOUT: u32 = 153;
    pub const DELEGATE_BAD_OUTPUT: u32 = 154;
    /// The caller may not do this: dipamd's in-band refusal of a non-root caller, and the
    /// plugin's mapping of a PERMISSION_DENIED status (docs/cfp.md §9).
    pub const PERMISSION_DENIED: u32 = 155;
    pub const AGENT_CONFLICT: u32 = 156;
    pub const NO_RECORD: u32 = 157;
    pub const PREV_RESULT_MISMATCH: u32 = 158;
    pub const MISCONFIGURED: u32 = 159;

    // The plugin's main-mode datapath. None of the spec's codes fit these: 4 and 7 say the
    // input is wrong, while here the input is valid and the kernel state is not what it must
    // be. Go plugins (ptp) report them as 999.
    /// CNI_IFNAME already exists in the container (spec §ADD: MUST error).
    pub const INTERFACE_EXISTS: u32 = 160;
    /// CNI_NETNS cannot be opened or entered, or is the plugin's own netns.
    pub const NETNS: u32 = 161;
    /// A kernel (netlink, sysctl) step of the datapath failed.
    pub const DATAPATH: u32 = 162;
    /// CHECK found the pod's datapath different from prevResult.
    pub const CHECK_FAILED: u32 = 163;
    /// The IPAM result cannot be applied by a point-to-point datapath.
    pub const IPAM_RESULT: u32 = 164;
    /// ADD: the host already routes the address the IPAM handed out to another live veth
    /// (another pod holds it); nothing was taken over.
    pub const ADDRESS_IN_USE: u32 = 165;

    // dipamd's GC.
    pub const GC_REFUSED: u32 = 170;
    pub const GC_INCOMPLETE: u32 = 171;
}

/// Who returns a code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Both the plugin and dipamd.
    Both,
    Plugin,
    Dipamd,
}

/// One row of [`TABLE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Code {
    pub code: u32,
    pub name: &'static str,
    pub source: Source,
}

/// Every code dipam returns itself (a delegate's own codes pass through unchanged and are not
/// listed). docs/cfp.md §9 describes each of them.
pub const TABLE: &[Code] = &[
    row(
        codes::INCOMPATIBLE_VERSION,
        "INCOMPATIBLE_VERSION",
        Source::Both,
    ),
    row(
        codes::UNKNOWN_CONTAINER,
        "UNKNOWN_CONTAINER",
        Source::Dipamd,
    ),
    row(codes::INVALID_ENV, "INVALID_ENV", Source::Both),
    row(codes::IO_FAILURE, "IO_FAILURE", Source::Plugin),
    row(codes::DECODE_FAILURE, "DECODE_FAILURE", Source::Both),
    row(codes::INVALID_CONFIG, "INVALID_CONFIG", Source::Both),
    row(codes::TRY_AGAIN_LATER, "TRY_AGAIN_LATER", Source::Both),
    row(codes::NOT_AVAILABLE, "NOT_AVAILABLE", Source::Both),
    row(
        codes::LIMITED_CONNECTIVITY,
        "LIMITED_CONNECTIVITY",
        Source::Dipamd,
    ),
    row(codes::INTERNAL, "INTERNAL", Source::Both),
    row(
        codes::EXISTS_WITH_OTHER_CONFIG,
        "EXISTS_WITH_OTHER_CONFIG",
        Source::Dipamd,
    ),
    row(
        codes::DELEGATE_NOT_FOUND,
        "DELEGATE_NOT_FOUND",
        Source::Dipamd,
    ),
    row(codes::DELEGATE_TIMEOUT, "DELEGATE_TIMEOUT", Source::Dipamd),
    row(
        codes::DELEGATE_BAD_OUTPUT,
        "DELEGATE_BAD_OUTPUT",
        Source::Dipamd,
    ),
    row(codes::PERMISSION_DENIED, "PERMISSION_DENIED", Source::Both),
    row(codes::AGENT_CONFLICT, "AGENT_CONFLICT", Source::Dipamd),
    row(codes::NO_RECORD, "NO_RECORD", Source::Dipamd),
    row(
        codes::PREV_RESULT_MISMATCH,
        "PREV_RESULT_MISMATCH",
        Source::Dipamd,
    ),
    row(codes::MISCONFIGURED, "MISCONFIGURED", Source::Dipamd),
    row(codes::INTERFACE_EXISTS, "INTERFACE_EXISTS", Source::Plugin),
    row(codes::NETNS, "NETNS", Source::Plugin),
    row(codes::DATAPATH, "DATAPATH", Source::Plugin),
    row(codes::CHECK_FAILED, "CHECK_FAILED", Source::Plugin),
    row(codes::IPAM_RESULT, "IPAM_RESULT", Source::Plugin),
    row(codes::ADDRESS_IN_USE, "ADDRESS_IN_USE", Source::Plugin),
    row(codes::GC_REFUSED, "GC_REFUSED", Source::Dipamd),
    row(codes::GC_INCOMPLETE, "GC_INCOMPLETE", Source::Dipamd),
];

const fn row(code: u32, name: &'static str, source: Source) -> Code {
    Code { code, name, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_version_parses_and_they_ascend() {
        let parsed: Vec<(u32, u32, u32)> = SUPPORTED_VERSIONS
            .iter()
            .map(|v| {
                let p: Vec<u32> = v.split('.').map(|n| n.parse().expect(v)).collect();
                assert_eq!(p.len(), 3, "{v} is not MAJOR.MINOR.PATCH");
                (p[0], p[1], p[2])
            })
            .collect();
        assert!(parsed.windows(2).all(|w| w[0] < w[1]), "{parsed:?}");
        assert_eq!(
            supported_versions_list(),
            "0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0"
        );
    }

    #[test]
    fn every_code_is_unique_and_in_its_range() {
        let mut seen = std::collections::HashSet::new();
        for c in TABLE {
            assert!(seen.insert(c.code), "code {} twice", c.code);
            assert!(
                c.code < 100 || (150..200).contains(&c.code),
                "{} {}: 100-149 may collide with delegates' codes",
                c.code,
                c.name
            );
            if (160..170).contains(&c.code) {
                assert_eq!(c.source, Source::Plugin, "{}", c.name);
            }
        }
        let names: std::collections::HashSet<_> = TABLE.iter().map(|c| c.name).collect();
        assert_eq!(names.len(), TABLE.len(), "a name twice");
    }

    /// docs/cfp.md §9 is the operator's copy of the table: every code must have its row there.
    #[test]
    fn cfp_section_9_describes_every_code() {
        let cfp = include_str!("../../docs/cfp.md");
        let start = cfp.find("\n## 9. ").expect("cfp.md has §9");
        let end = cfp[start + 1..]
            .find("\n## ")
            .map_or(cfp.len(), |e| start + 1 + e);
        let section = &cfp[start..end];
        for c in TABLE {
            assert!(
                section.contains(&format!("\n| {} |", c.code)),
                "docs/cfp.md §9 has no row for code {} ({})",
                c.code,
                c.name
            );
        }
        // And no row for a code dipam does not return.
        for line in section.lines() {
            let Some(code) = line
                .strip_prefix("| ")
                .and_then(|l| l.split(" |").next())
                .and_then(|n| n.trim().parse::<u32>().ok())
            else {
                continue;
            };
            assert!(
                TABLE.iter().any(|c| c.code == code),
                "docs/cfp.md §9 lists code {code}, which no part of dipam returns"
            );
        }
    }

    #[test]
    fn name_rules() {
        for ok in ["a", "ABC_def.1-2", "0abc"] {
            assert!(names::is_valid_name(ok), "{ok}");
        }
        for bad in ["", "-a", "_a", "a b", "a/b", "a\0b", "é"] {
            assert!(!names::is_valid_name(bad), "{bad:?}");
        }
        use names::{IfnameError as E, check_ifname};
        assert_eq!(check_ifname("eth0"), Ok(()));
        assert_eq!(check_ifname("a".repeat(15).as_str()), Ok(()));
        assert_eq!(check_ifname(""), Err(E::Empty));
        assert_eq!(check_ifname("a".repeat(16).as_str()), Err(E::TooLong));
        assert_eq!(check_ifname(".."), Err(E::Dots));
        for bad in ["a:b", "a/b", "a b", "a\tb"] {
            assert_eq!(check_ifname(bad), Err(E::BadChar), "{bad:?}");
        }
    }
}
