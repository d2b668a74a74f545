//! Man pages for dipamctl (one per command, as git has `git-remote(1)`), dipamd and the dipam
//! plugin, rendered at run time with clap_mangen from the same clap definitions that parse
//! the command lines, and for the plugin from its help text and config key table
//! (`dipam_plugin::conf::KEYS`, the table its parser reads keys through). No page is checked
//! in, so none can describe a flag or key the binaries do not have.
//!
//! `dipamctl install` puts them under the man directory beside dipamctl (install/man_pages.rs);
//! `dipamctl man` prints one, or writes them all into a directory.

use std::{
    io::Write,
    path::{Path, PathBuf},
};

use clap::CommandFactory;
use clap_mangen::{
    Man,
    roff::{Roff, bold, roman},
};
use dipam_plugin::{conf::KEYS, help};
use serde_json::json;

use super::{
    atomic,
    error::{CtlError, PageError},
};

/// One rendered page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    /// `dipamctl`, `dipamctl-agent-watch`, `dipamd`, `dipam`.
    pub name: String,
    /// The manual section: 8 (daemons) for dipamd, 1 (commands) for the others.
    pub section: &'static str,
    /// The page in roff, as man reads it.
    pub roff: Vec<u8>,
}

impl Page {
    /// The page's file name, e.g. `dipamctl-status.1`.
    pub fn file_name(&self) -> String {
        format!("{}.{}", self.name, self.section)
    }

    /// Where it goes under a man directory such as /usr/local/share/man: `man1/NAME.1`.
    pub fn path_under(&self, man_dir: &Path) -> PathBuf {
        man_dir
            .join(format!("man{}", self.section))
            .join(self.file_name())
    }
}

/// The version pages name: the crate's (dipamd, dipamctl and dipam are built together).
const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Every page: dipamctl and each of its commands, dipamd, dipam.
pub fn pages() -> Vec<Page> {
    let mut out = Vec::new();
    // The NAME lines: the binaries' short `about` is the package's description, which
    // names both programs.
    let mut ctl = super::Args::command()
        .version(VERSION)
        .about("inspect and operate dipamd, the dipam shim daemon")
        .disable_help_subcommand(true);
    // Gives each command its display name (`dipamctl-agent-watch`) and the global flags.
    ctl.build();
    command_pages(&ctl, &mut out);
    let dipamd = dipam_shim::l7_daemon::daemon::Args::command()
        .version(VERSION)
        .about("the dipam shim daemon, which runs the delegated IPAM for the dipam CNI plugin");
    out.push(render(dipamd, "8", |_| Ok(())));
    out.push(plugin_page());
    out
}

/// `cmd`'s page and those of its commands, depth first.
fn command_pages(cmd: &clap::Command, out: &mut Vec<Page>) {
    out.push(render(cmd.clone(), "1", |_| Ok(())));
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        command_pages(sub, out);
    }
}

/// Renders `cmd` as clap_mangen does, with `extra` sections before VERSION and a SEE ALSO
/// that links the three programs.
fn render(
    mut cmd: clap::Command,
    section: &'static str,
    extra: impl FnOnce(&mut Vec<u8>) -> std::io::Result<()>,
) -> Page {
    // Adds --help and --version, as the command line has them.
    cmd.build();
    let name = cmd
        .get_display_name()
        .unwrap_or_else(|| cmd.get_name())
        .to_owned();
    let has_options = cmd.get_arguments().any(|a| !a.is_hide_set());
    let has_commands = cmd.has_subcommands();
    // A command's page has no VERSION: clap gives a version to the program only.
    let has_version = cmd.get_version().is_some();
    let man = Man::new(cmd).section(section).manual("dipam");
    let mut roff = Vec::new();
    // Writes into memory cannot fail.
    let _ = (|| {
        man.render_title(&mut roff)?;
        man.render_name_section(&mut roff)?;
        man.render_synopsis_section(&mut roff)?;
        man.render_description_section(&mut roff)?;
        if has_options {
            man.render_options_section(&mut roff)?;
        }
        if has_commands {
            man.render_subcommands_section(&mut roff)?;
        }
        extra(&mut roff)?;
        if has_version {
            man.render_version_section(&mut roff)?;
        }
        see_also(&name).to_writer(&mut roff)
    })();
    Page {
        name,
        section,
        roff,
    }
}

/// The other two programs (and, from a command's page, dipamctl's own).
fn see_also(name: &str) -> Roff {
    let mut refs: Vec<&str> = ["dipamctl(1)", "dipamd(8)", "dipam(1)"]
        .into_iter()
        .filter(|r| r.split('(').next() != Some(name))
        .collect();
    if name.starts_with("dipamctl-") {
        refs.retain(|r| *r != "dipamctl(1)");
        refs.insert(0, "dipamctl(1)");
    }
    let mut roff = Roff::default();
    roff.control("SH", ["SEE ALSO"]);
    roff.text([roman(refs.join(", "))]);
    roff
}

/// dipam(1): the plugin has no clap parser (it reads CNI_* variables and a config on stdin),
/// so its command is described here from the texts `dipam --help` prints.
fn plugin_page() -> Page {
    let cmd = clap::Command::new("dipam")
        .version(VERSION)
        .about(help::ABOUT)
        .long_about(help::DESCRIPTION);
    render(cmd, "1", |w| {
        let mut roff = Roff::default();
        roff.control("SH", ["CONFIGURATION"]);
        roff.text([roman(help::KEYS_HEADING)]);
        for k in &KEYS {
            roff.control("TP", []);
            roff.text([bold(k.name)]);
            roff.text([roman(help::describe(k))]);
        }
        roff.control("SH", ["EXAMPLES"]);
        roff.control("nf", []);
        for line in help::EXAMPLES.lines() {
            roff.text([roman(line)]);
        }
        roff.control("fi", []);
        roff.control("SH", ["ENVIRONMENT"]);
        for (var, meaning) in [
            ("CNI_COMMAND", "ADD, DEL, CHECK, GC, STATUS or VERSION."),
            (
                "CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME",
                "The attachment (CNI_NETNS may be empty for DEL).",
            ),
            (
                "CNI_ARGS, CNI_PATH",
                "Passed on to dipamd, which runs the delegate with them.",
            ),
        ] {
            roff.control("TP", []);
            roff.text([bold(var)]);
            roff.text([roman(meaning)]);
        }
        roff.to_writer(w)
    })
}

/// `dipamctl man`'s flags.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The page to print, e.g. `dipamctl man dipamd | man -l -`: dipamctl, dipamctl-COMMAND
    /// (dipamctl-agent-watch), dipamd or dipam.
    #[arg(
        value_name = "PAGE",
        default_value = "dipamctl",
        conflicts_with = "out_dir"
    )]
    page: String,
    /// Write every page into DIR instead (files NAME.SECTION, each atomically), e.g. for a
    /// package; `dipamctl install` puts them where man looks.
    #[arg(long, value_name = "DIR")]
    out_dir: Option<PathBuf>,
}

/// Prints one page, or writes them all and lists them (a line each, or JSON).
pub fn run(args: Args, json: bool, out: &mut dyn Write) -> Result<(), CtlError> {
    let pages = pages();
    let Some(dir) = args.out_dir else {
        let page = pages
            .iter()
            .find(|p| p.name == args.page || p.file_name() == args.page)
            .ok_or_else(|| {
                CtlError::Usage(format!(
                    "no man page {:?}; there are: {}",
                    args.page,
                    pages
                        .iter()
                        .map(|p| p.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })?;
        out.write_all(&page.roff)?;
        return Ok(());
    };
    let placed = write_pages(&pages, |p| dir.join(p.file_name()))?;
    if json {
        let list: Vec<_> = pages
            .iter()
            .zip(&placed)
            .map(|(p, pl)| json!({"name": p.name, "section": p.section, "path": pl.path, "changed": pl.changed}))
            .collect();
        writeln!(out, "{:#}", json!({ "pages": list }))?;
    } else {
        for pl in &placed {
            let state = if pl.changed { "written" } else { "unchanged" };
            writeln!(out, "{} {state}", pl.path.display())?;
        }
    }
    Ok(())
}

/// Writes each page to `path(page)` atomically (mode 0644), leaving identical ones alone;
/// what was done to each, in the same order.
pub fn write_pages(
    pages: &[Page],
    path: impl Fn(&Page) -> PathBuf,
) -> Result<Vec<atomic::Placed>, PageError> {
    pages
        .iter()
        .map(|p| {
            let target = path(p);
            let dir = target.parent().unwrap_or_else(|| Path::new("."));
            atomic::replace_atomically(dir, &p.file_name(), &p.roff, 0o644).map_err(|source| {
                PageError {
                    path: target.clone(),
                    source,
                }
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(p: &Page) -> String {
        String::from_utf8(p.roff.clone()).unwrap()
    }

    #[test]
    fn every_command_has_a_page_and_dipamctls_names_them() {
        let pages = pages();
        let names: Vec<&str> = pages.iter().map(|p| p.name.as_str()).collect();
        for want in [
            "dipamctl",
            "dipamctl-status",
            "dipamctl-install",
            "dipamctl-agent",
            "dipamctl-agent-watch",
            "dipamctl-man",
            "dipamd",
            "dipam",
        ] {
            assert!(names.contains(&want), "no {want} in {names:?}");
        }
        assert!(!names.iter().any(|n| n.ends_with("-help")), "{names:?}");
        let ctl = text(&pages[0]);
        for sub in super::super::Args::command().get_subcommands() {
            assert!(
                ctl.contains(&format!("dipamctl-{}(1)", sub.get_name()).replace('-', "\\-")),
                "{}",
                sub.get_name()
            );
        }
        let dipamd = pages.iter().find(|p| p.name == "dipamd").unwrap();
        assert_eq!(dipamd.section, "8");
        assert!(text(dipamd).contains(".TH dipamd 8"), "{}", text(dipamd));
    }

    #[test]
    fn the_plugin_page_names_every_config_key() {
        let pages = pages();
        let page = text(pages.iter().find(|p| p.name == "dipam").unwrap());
        for k in &KEYS {
            assert!(page.contains(&format!("\\fB{}\\fR", k.name)), "{}", k.name);
        }
        assert!(page.contains("spoolDir"));
    }

    #[test]
    fn out_dir_writes_every_page_once() {
        let dir = tempfile::tempdir().unwrap();
        let args = |json| {
            let mut out = Vec::new();
            run(
                Args {
                    page: "dipamctl".into(),
                    out_dir: Some(dir.path().to_owned()),
                },
                json,
                &mut out,
            )
            .unwrap();
            String::from_utf8(out).unwrap()
        };
        let first = args(false);
        assert!(first.contains("dipamd.8 written"), "{first}");
        let again: serde_json::Value = serde_json::from_str(&args(true)).unwrap();
        let listed = again["pages"].as_array().unwrap();
        assert_eq!(listed.len(), pages().len());
        assert!(listed.iter().all(|p| p["changed"] == false), "{again}");
        assert!(dir.path().join("dipam.1").is_file());
    }
}
