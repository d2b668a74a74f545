//! `dipamctl install --wrap FILE` and `--unwrap FILE`: put dipam in front of the IPAM a node's
//! own conflist already uses (its CNI's, kubenet-style ptp/bridge + host-local, what podman
//! writes), and take it out again.
//!
//! Exactly one value of the file changes, and the file's text is spliced rather than
//! re-serialized, so every other byte (key order, indentation, the other plugins) stays as it
//! was:
//!
//! - **IPAM mode** (a main plugin with `ipam`, e.g. ptp + host-local): the `ipam` object
//!   becomes `{"type": "dipam", "delegate": <the old ipam object, verbatim>}`, re-indented one
//!   level. dipamd hands the delegate the request config with `ipam` replaced by `delegate`
//!   (docs/cfp.md §6.4), which is the config the old chain gave it.
//! - **Main mode** (a plugin that *is* the IPAM, e.g. `{"type": "host-local", "ipam": {...}}`
//!   as the chain's main plugin): only `"type"` becomes `"dipam"`. dipamd hands the IPAM the
//!   request config unchanged (§6.4), but dipam as the main plugin also creates the pod's
//!   interface, which the IPAM alone did not: so only with `--main-mode`.
//!
//! `socketPath` is written only when dipamd's socket is not the plugin's default. Unwrapping
//! puts the delegate (or the IPAM's own type) back and drops dipam's own keys, which never
//! reached the delegate: the result is the original's JSON value. Every rewrite is checked
//! against the same transformation done on the parsed value, so a splice that changed anything
//! else is an error, never a written file.

use std::{fmt, ops::Range};

use dipam_proto::cni::SUPPORTED_VERSIONS;
use serde::{Deserialize, de};
use serde_json::{Map, Value, value::RawValue};

/// Where the plugin looks for dipamd unless a config says otherwise (the plugin's
/// `DEFAULT_SOCKET`): a wrapped config names a socket only when it is another one.
pub const DEFAULT_SOCKET: &str = "/run/dipam/dipam.sock";

const DIPAM: &str = "dipam";

/// dipam's own keys: read by the plugin, never passed to a delegate (docs/cfp.md §6.4), so
/// unwrapping drops them.
const DIPAM_KEYS: [&str; 3] = ["socketPath", "spoolDir", "timeoutSeconds"];

/// IPAM plugins a chain may run as its main plugin. Such a plugin reads its settings from its
/// own `ipam` object, so putting dipam into that object (IPAM mode) would break it.
const IPAM_PLUGINS: [&str; 6] = [
    "host-local",
    "static",
    "dhcp",
    "whereabouts",
    "azure-vnet-ipam",
    "calico-ipam",
];

/// Which plugin to rewrite, and whether dipam may become the main plugin.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Choice {
    /// `--plugin-index N`: the plugin to rewrite, for a conflist where several carry an IPAM.
    pub plugin: Option<usize>,
    /// `--main-mode`: the chosen plugin is the IPAM itself, and dipam takes its place as the
    /// main plugin (or, unwrapping, gives it back).
    pub main_mode: bool,
}

/// How dipam sits (or sat) in the rewritten plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `{"type": "ptp", "ipam": {"type": "dipam", "delegate": {...}}}`
    Ipam,
    /// `{"type": "dipam", "ipam": {"type": "host-local", ...}}`
    Main,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Ipam => "IPAM mode",
            Mode::Main => "main mode",
        })
    }
}

/// A rewritten conflist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rewritten {
    /// The whole new file.
    pub text: String,
    /// The index of the rewritten plugin in `plugins`.
    pub plugin: usize,
    /// Its main plugin's type in the original (e.g. "ptp", or "host-local" in main mode).
    pub main: String,
    /// The IPAM dipam delegates to, e.g. "host-local".
    pub delegate: String,
    pub mode: Mode,
}

/// Why a conflist is not rewritten. Each says what to do instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WrapError {
    #[error("not valid JSON: {0}")]
    NotJson(String),
    #[error("{0}")]
    Shape(String),
    #[error(
        "cniVersion {0} is not one dipam can carry ({supported}): the chain would fail every \
         ADD with code 1; move the conflist to one of them first",
        supported = SUPPORTED_VERSIONS.join(", ")
    )]
    Version(String),
    #[error(
        "no plugin carries an IPAM (an \"ipam\" object, or an IPAM plugin such as host-local \
         run as the main plugin): there is nothing for dipam to delegate to"
    )]
    NoIpam,
    #[error(
        "plugins[{0}] already uses dipam: nothing to wrap (`dipamctl install --unwrap` \
         restores the IPAM it delegates to)"
    )]
    AlreadyDipam(usize),
    #[error("no plugin uses dipam: nothing to unwrap")]
    NotDipam,
    #[error("{0}")]
    NotThere(String),
    #[error("several plugins {0}: choose one with --plugin-index N")]
    Ambiguous(String),
    #[error("{0}")]
    MainMode(String),
    #[error("{0}")]
    Unusable(String),
    #[error(
        "internal error: the rewritten text differs from the intended change ({0}); nothing \
         was written, please report this with the conflist"
    )]
    Splice(String),
}

/// `--wrap`: dipam in front of the IPAM of one plugin. `socket` is dipamd's socket when it is
/// not [`DEFAULT_SOCKET`].
pub fn wrap(text: &str, choice: Choice, socket: Option<&str>) -> Result<Rewritten, WrapError> {
    let doc = Doc::parse(text)?;
    let kinds: Vec<Kind> = doc.plugins.iter().map(Kind::of).collect();
    let i = chosen(&doc, &kinds, choice.plugin)?;
    let main = doc.type_of(i);
    let plugin = &doc.plugins[i];
    let ipam = plugin.get("ipam");
    let ipam_type = ipam
        .and_then(|v| v.get("type"))
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty());
    let Some(delegate) = ipam_type else {
        return Err(WrapError::Unusable(format!(
            "plugins[{i}] ({main}) has no ipam.type: an IPAM plugin reads its settings from an \
             \"ipam\" object naming its type, and dipam needs that type to run it"
        )));
    };
    // dipamd refuses such a delegate name (code 7, docs/cfp.md §6.1): refuse it now.
    if delegate.contains('/') || delegate == "." || delegate == ".." {
        return Err(WrapError::Unusable(format!(
            "plugins[{i}].ipam.type {delegate:?} is not a plugin's file name"
        )));
    }
    let mode = if kinds[i] == Kind::Bare {
        if !choice.main_mode {
            return Err(WrapError::MainMode(format!(
                "plugins[{i}] is the IPAM {main} itself, run as the main plugin: dipam can only \
                 take its place as the main plugin, which also creates the pod's interface \
                 (a veth with the addresses and routes); pass --main-mode if that is what \
                 this network should do"
            )));
        }
        Mode::Main
    } else {
        if choice.main_mode {
            return Err(WrapError::MainMode(format!(
                "--main-mode replaces a plugin that is itself the IPAM, but plugins[{i}] \
                 ({main}) has its own IPAM ({delegate}): without --main-mode dipam becomes \
                 {main}'s IPAM and {main} stays"
            )));
        }
        Mode::Ipam
    };

    let sock = socket.map(|s| Value::from(s).to_string());
    let mut expected = doc.value.clone();
    let target = &mut expected["plugins"][i];
    let (range, new) = match mode {
        Mode::Ipam => {
            let mut wrapper = Map::new();
            wrapper.insert("type".into(), DIPAM.into());
            if let Some(s) = socket {
                wrapper.insert("socketPath".into(), s.into());
            }
            wrapper.insert("delegate".into(), target["ipam"].take());
            target["ipam"] = Value::Object(wrapper);
            let span = doc.entry(i, &["ipam"])?;
            let new = wrapper_text(text, span.clone(), sock.as_deref());
            (span, new)
        }
        Mode::Main => {
            target["type"] = DIPAM.into();
            if let Some(s) = socket {
                target["socketPath"] = s.into();
            }
            let span = doc.entry(i, &["type"])?;
            let new = match &sock {
                None => "\"dipam\"".to_owned(),
                Some(s) => {
                    let ws = doc.ws_before_key(i, "type")?;
                    format!("\"dipam\",{ws}\"socketPath\": {s}")
                }
            };
            (span, new)
        }
    };
    let out = splice(text, vec![(range, new)]);
    check(&out, &expected)?;
    Ok(Rewritten {
        text: out,
        plugin: i,
        main,
        delegate: delegate.to_owned(),
        mode,
    })
}

/// The plugin to wrap: `plugin` (--plugin-index) if it carries an IPAM, else the one plugin
/// that does; refused where dipam is there already.
fn chosen(doc: &Doc<'_>, kinds: &[Kind], plugin: Option<usize>) -> Result<usize, WrapError> {
    match plugin {
        Some(i) => {
            doc.check_index(i)?;
            match kinds[i] {
                Kind::DipamMain | Kind::DipamIpam => Err(WrapError::AlreadyDipam(i)),
                Kind::Other => Err(WrapError::NotThere(format!(
                    "plugins[{i}] ({}) carries no IPAM",
                    doc.type_of(i)
                ))),
                Kind::Carrier | Kind::Bare => Ok(i),
            }
        }
        None => {
            if let Some(i) = kinds
                .iter()
                .position(|k| matches!(k, Kind::DipamMain | Kind::DipamIpam))
            {
                return Err(WrapError::AlreadyDipam(i));
            }
            doc.single(
                kinds,
                |k| matches!(k, Kind::Carrier | Kind::Bare),
                "carry an IPAM",
            )?
            .ok_or(WrapError::NoIpam)
        }
    }
}

/// `--unwrap`: the IPAM dipam delegates to, back in dipam's place.
pub fn unwrap(text: &str, choice: Choice) -> Result<Rewritten, WrapError> {
    let doc = Doc::parse(text)?;
    let kinds: Vec<Kind> = doc.plugins.iter().map(Kind::of).collect();
    let uses_dipam = |k: &Kind| matches!(k, Kind::DipamMain | Kind::DipamIpam);
    let i = match choice.plugin {
        Some(i) => {
            doc.check_index(i)?;
            if !uses_dipam(&kinds[i]) {
                return Err(WrapError::NotThere(format!(
                    "plugins[{i}] ({}) does not use dipam: nothing to unwrap there",
                    doc.type_of(i)
                )));
            }
            i
        }
        None => doc
            .single(&kinds, uses_dipam, "use dipam")?
            .ok_or(WrapError::NotDipam)?,
    };
    let main = doc.type_of(i);
    let mut expected = doc.value.clone();
    let target = &mut expected["plugins"][i];
    if kinds[i] == Kind::DipamMain {
        let delegate = target["ipam"]["type"]
            .as_str()
            .filter(|t| !t.is_empty() && *t != DIPAM)
            .ok_or_else(|| {
                WrapError::Unusable(format!(
                    "plugins[{i}] is dipam as the main plugin without ipam.type: there is no \
                     IPAM to give its place back to"
                ))
            })?
            .to_owned();
        if !choice.main_mode {
            return Err(WrapError::MainMode(format!(
                "plugins[{i}] is dipam as the main plugin, which creates the pod's interface; \
                 unwrapping makes its IPAM ({delegate}) the main plugin, which creates none: \
                 pass --main-mode if that is what this network had before"
            )));
        }
        target["type"] = delegate.clone().into();
        let obj = target.as_object_mut().ok_or(WrapError::NotDipam)?;
        for key in DIPAM_KEYS {
            obj.remove(key);
        }
        let mut edits = vec![(
            doc.entry(i, &["type"])?,
            Value::from(delegate.clone()).to_string(),
        )];
        edits.extend(doc.removals(i, &DIPAM_KEYS)?);
        let out = splice(text, edits);
        check(&out, &expected)?;
        return Ok(Rewritten {
            text: out,
            plugin: i,
            main: delegate.clone(),
            delegate,
            mode: Mode::Main,
        });
    }
    if choice.main_mode {
        return Err(WrapError::MainMode(format!(
            "--main-mode gives a main plugin's place back to its IPAM, but in plugins[{i}] \
             dipam is the IPAM of {main}: unwrap it without --main-mode"
        )));
    }
    let original = target["ipam"]["delegate"].take();
    let delegate = original
        .get("type")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| {
            WrapError::Unusable(format!(
                "plugins[{i}].ipam has no delegate object with a type: there is no IPAM to \
                 restore"
            ))
        })?
        .to_owned();
    target["ipam"] = original;
    let ipam = doc.entry(i, &["ipam"])?;
    let inner = doc.entry(i, &["ipam", "delegate"])?;
    let new = dedent(text, ipam.clone(), inner);
    let out = splice(text, vec![(ipam, new)]);
    check(&out, &expected)?;
    Ok(Rewritten {
        text: out,
        plugin: i,
        main,
        delegate,
        mode: Mode::Ipam,
    })
}

/// The role a plugin of the chain plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `"type": "dipam"`.
    DipamMain,
    /// `"ipam": {"type": "dipam", ...}`.
    DipamIpam,
    /// A main plugin with its own `ipam` (IPAM mode's place).
    Carrier,
    /// An IPAM plugin run as the main plugin (main mode's place).
    Bare,
    /// Neither (portmap, firewall, tuning, ...).
    Other,
}

impl Kind {
    fn of(p: &Value) -> Self {
        let ty = p.get("type").and_then(Value::as_str).unwrap_or_default();
        let ipam_type = p
            .get("ipam")
            .and_then(|i| i.get("type"))
            .and_then(Value::as_str);
        if ty == DIPAM {
            Kind::DipamMain
        } else if ipam_type == Some(DIPAM) {
            Kind::DipamIpam
        } else if IPAM_PLUGINS.contains(&ty) || (!ty.is_empty() && ipam_type == Some(ty)) {
            Kind::Bare
        } else if p.get("ipam").is_some() {
            Kind::Carrier
        } else {
            Kind::Other
        }
    }
}

/// A parsed conflist: its value, and where each plugin is in the text.
pub(super) struct Doc<'a> {
    text: &'a str,
    pub(super) value: Value,
    pub(super) plugins: Vec<Value>,
    raw_plugins: Vec<&'a RawValue>,
}

impl<'a> Doc<'a> {
    pub(super) fn parse(text: &'a str) -> Result<Self, WrapError> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| WrapError::NotJson(e.to_string()))?;
        let obj = value
            .as_object()
            .ok_or_else(|| WrapError::Shape("a conflist must be a JSON object".into()))?;
        let version = obj
            .get("cniVersion")
            .and_then(Value::as_str)
            .ok_or_else(|| WrapError::Shape("cniVersion is missing".into()))?;
        if !SUPPORTED_VERSIONS.contains(&version) {
            return Err(WrapError::Version(format!("{version:?}")));
        }
        // CNI 1.1 `cniVersions`: a runtime may pick any listed version it supports.
        if let Some(list) = obj.get("cniVersions").and_then(Value::as_array) {
            for v in list {
                if !v.as_str().is_some_and(|v| SUPPORTED_VERSIONS.contains(&v)) {
                    return Err(WrapError::Version(format!("{v} (in cniVersions)")));
                }
            }
        }
        let plugins = obj
            .get("plugins")
            .and_then(Value::as_array)
            .filter(|p| !p.is_empty())
            .ok_or_else(|| {
                WrapError::Shape(
                    "plugins is missing or empty: --wrap adopts a conflist (a single plugin's \
                     .conf is not one)"
                        .into(),
                )
            })?
            .clone();
        if let Some(i) = plugins.iter().position(|p| !p.is_object()) {
            return Err(WrapError::Shape(format!("plugins[{i}] is not an object")));
        }
        let top: Entries<'a> =
            serde_json::from_str(text).map_err(|e| WrapError::NotJson(e.to_string()))?;
        let raw = top
            .get("plugins")
            .ok_or_else(|| WrapError::Splice("plugins not found in the text".into()))?;
        let raw_plugins: Vec<&'a RawValue> =
            serde_json::from_str(raw.get()).map_err(|e| WrapError::Splice(e.to_string()))?;
        Ok(Self {
            text,
            value,
            plugins,
            raw_plugins,
        })
    }

    fn type_of(&self, i: usize) -> String {
        self.plugins[i]["type"]
            .as_str()
            .unwrap_or("no type")
            .to_owned()
    }

    fn check_index(&self, i: usize) -> Result<(), WrapError> {
        if i >= self.plugins.len() {
            return Err(WrapError::NotThere(format!(
                "--plugin-index {i}: the conflist has {} plugin(s), numbered from 0",
                self.plugins.len()
            )));
        }
        Ok(())
    }

    /// The one plugin whose kind passes `want`: none, or an error naming them all.
    fn single(
        &self,
        kinds: &[Kind],
        want: impl Fn(&Kind) -> bool,
        what: &str,
    ) -> Result<Option<usize>, WrapError> {
        let found: Vec<usize> = (0..kinds.len()).filter(|&i| want(&kinds[i])).collect();
        match found[..] {
            [] => Ok(None),
            [i] => Ok(Some(i)),
            _ => Err(WrapError::Ambiguous(format!(
                "{what} ({})",
                found
                    .iter()
                    .map(|&i| format!("plugins[{i}]: {}", self.type_of(i)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }

    /// The object that is plugin `i` followed along `path`, as its text's entries.
    pub(super) fn object(
        &self,
        i: usize,
        path: &[&str],
    ) -> Result<(Range<usize>, Entries<'a>), WrapError> {
        let mut raw = self.raw_plugins[i];
        for key in path {
            let entries: Entries<'a> = serde_json::from_str(raw.get())
                .map_err(|e| WrapError::Splice(format!("{key}: {e}")))?;
            raw = entries
                .get(key)
                .ok_or_else(|| WrapError::Splice(format!("{key} not found")))?;
        }
        let entries =
            serde_json::from_str(raw.get()).map_err(|e| WrapError::Splice(e.to_string()))?;
        Ok((span(self.text, raw)?, entries))
    }

    /// Where the value at `path` (from plugin `i`) is in the text.
    fn entry(&self, i: usize, path: &[&str]) -> Result<Range<usize>, WrapError> {
        let (last, parents) = path
            .split_last()
            .ok_or_else(|| WrapError::Splice("empty path".into()))?;
        let (_, entries) = self.object(i, parents)?;
        let raw = entries
            .get(last)
            .ok_or_else(|| WrapError::Splice(format!("{last} not found")))?;
        span(self.text, raw)
    }

    /// The whitespace before `key`'s entry in plugin `i` (a newline and the indentation, in a
    /// pretty file), so that a key added after it is laid out the same way.
    fn ws_before_key(&self, i: usize, key: &str) -> Result<&'a str, WrapError> {
        let (obj, entries) = self.object(i, &[])?;
        let j = entries
            .0
            .iter()
            .rposition(|(k, _)| k == key)
            .ok_or_else(|| WrapError::Splice(format!("{key} not found")))?;
        let after = self.after_separator(obj.start, &entries, j)?;
        let start = self.key_start(after);
        Ok(&self.text[after..start])
    }

    /// Where the text before entry `j`'s key starts: after the `{` or the comma after the
    /// previous value.
    fn after_separator(
        &self,
        open: usize,
        entries: &Entries<'a>,
        j: usize,
    ) -> Result<usize, WrapError> {
        if j == 0 {
            return Ok(open + 1);
        }
        let prev = span(self.text, entries.0[j - 1].1)?.end;
        let comma = self.text[prev..]
            .find(',')
            .ok_or_else(|| WrapError::Splice("no comma after a value".into()))?;
        Ok(prev + comma + 1)
    }

    fn key_start(&self, from: usize) -> usize {
        from + self.text[from..]
            .find(|c: char| !c.is_ascii_whitespace())
            .unwrap_or(0)
    }

    /// The edits that remove `keys` from plugin `i`, leaving the others' layout alone: an
    /// entry after another goes with the comma before it, a leading run of removed entries
    /// goes with the comma after it.
    fn removals(&self, i: usize, keys: &[&str]) -> Result<Vec<(Range<usize>, String)>, WrapError> {
        let (obj, entries) = self.object(i, &[])?;
        let gone: Vec<bool> = entries
            .0
            .iter()
            .map(|(k, _)| keys.contains(&k.as_str()))
            .collect();
        let end = |j: usize| span(self.text, entries.0[j].1).map(|r| r.end);
        let mut edits = Vec::new();
        let lead = gone.iter().take_while(|g| **g).count();
        if lead > 0 {
            // "type" is kept, so a kept entry follows the leading run.
            let first = self.key_start(obj.start + 1);
            let kept = self.key_start(self.after_separator(obj.start, &entries, lead)?);
            edits.push((first..kept, String::new()));
        }
        for (j, _) in gone.iter().enumerate().skip(lead).filter(|(_, g)| **g) {
            edits.push((end(j - 1)?..end(j)?, String::new()));
        }
        Ok(edits)
    }
}

/// A JSON object's entries in the file's order, each value as its exact text in the file.
pub(super) struct Entries<'a>(pub(super) Vec<(String, &'a RawValue)>);

impl<'a> Entries<'a> {
    /// The value of `key`; the last one if the key repeats, as serde_json's `Value` takes it.
    fn get(&self, key: &str) -> Option<&'a RawValue> {
        self.0.iter().rev().find(|(k, _)| k == key).map(|(_, v)| *v)
    }
}

impl<'de> Deserialize<'de> for Entries<'de> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> de::Visitor<'de> for Visit {
            type Value = Entries<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
                let mut v = Vec::new();
                while let Some(entry) = m.next_entry::<String, &'de RawValue>()? {
                    v.push(entry);
                }
                Ok(Entries(v))
            }
        }
        d.deserialize_map(Visit)
    }
}

/// Where `raw`, borrowed from `text`, lies in it.
pub(super) fn span(text: &str, raw: &RawValue) -> Result<Range<usize>, WrapError> {
    let s = raw.get();
    let start = (s.as_ptr() as usize)
        .checked_sub(text.as_ptr() as usize)
        .filter(|start| start + s.len() <= text.len())
        .ok_or_else(|| WrapError::Splice("a value outside the text".into()))?;
    Ok(start..start + s.len())
}

/// The leading whitespace of the line that holds `pos`, if only whitespace precedes `pos` on
/// it.
pub(super) fn indent_at(text: &str, pos: usize) -> Option<&str> {
    let line = text[..pos].rfind('\n').map_or(0, |n| n + 1);
    let before = &text[line..pos];
    before
        .chars()
        .all(|c| c == ' ' || c == '\t')
        .then_some(before)
}

/// `{"type": "dipam", "delegate": <the ipam at span>}`, laid out as the file is: on one line
/// for a one-line ipam, else one level deeper, with the ipam's lines indented by one more
/// level (JSON strings hold no raw newline, so every newline in it is layout).
fn wrapper_text(text: &str, span: Range<usize>, socket: Option<&str>) -> String {
    let old = &text[span.clone()];
    if !old.contains('\n') {
        let sock = socket
            .map(|s| format!("\"socketPath\": {s}, "))
            .unwrap_or_default();
        return format!("{{\"type\": \"dipam\", {sock}\"delegate\": {old}}}");
    }
    let nl = if old.contains("\r\n") { "\r\n" } else { "\n" };
    let outer = indent_at(text, span.end - 1).unwrap_or_default();
    // The indentation of the ipam's first key, less the closing brace's, is one level.
    let first_key = span.start
        + 1
        + old[1..]
            .find(|c: char| !c.is_ascii_whitespace())
            .unwrap_or(0);
    let unit = indent_at(text, first_key)
        .and_then(|inner| inner.strip_prefix(outer))
        .filter(|u| !u.is_empty())
        .unwrap_or("  ");
    let pad = format!("{outer}{unit}");
    let delegate = old.replace('\n', &format!("\n{unit}"));
    let sock = socket
        .map(|s| format!("{nl}{pad}\"socketPath\": {s},"))
        .unwrap_or_default();
    format!("{{{nl}{pad}\"type\": \"dipam\",{sock}{nl}{pad}\"delegate\": {delegate}{nl}{outer}}}")
}

/// The delegate at `inner` as the new ipam at `outer`'s place: one level less indented when
/// every one of its lines is (undoing `wrapper_text`), else verbatim.
fn dedent(text: &str, outer: Range<usize>, inner: Range<usize>) -> String {
    let old = &text[inner.clone()];
    let levels = (
        indent_at(text, outer.end - 1),
        indent_at(text, inner.end - 1),
    );
    if let (Some(o), Some(i)) = levels
        && let Some(extra) = i.strip_prefix(o).filter(|e| !e.is_empty())
    {
        let pat = format!("\n{extra}");
        if old.matches('\n').count() == old.matches(pat.as_str()).count() {
            return old.replace(pat.as_str(), "\n");
        }
    }
    old.to_owned()
}

/// `text` with each range replaced (the ranges do not overlap).
pub(super) fn splice(text: &str, mut edits: Vec<(Range<usize>, String)>) -> String {
    edits.sort_by_key(|(r, _)| std::cmp::Reverse(r.start));
    let mut out = text.to_owned();
    for (range, new) in edits {
        out.replace_range(range, &new);
    }
    out
}

/// The spliced text must parse to exactly the intended value.
pub(super) fn check(out: &str, expected: &Value) -> Result<(), WrapError> {
    let got: Value = serde_json::from_str(out).map_err(|e| WrapError::Splice(e.to_string()))?;
    if &got != expected {
        return Err(WrapError::Splice(format!("got {got}, expected {expected}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
