//! `gc-ipam`: a host-local-style CNI IPAM plugin that implements CNI 1.1 `GC` and
//! `STATUS`, for the lifecycle tests.
//!
//! **This is a test double.** No plugin packaged in Debian implements GC or STATUS:
//! host-local 1.1.1 stops at spec 1.0.0, and upstream host-local has no GC even at
//! HEAD (`docs/sources.md` §1, §7). This binary does what a future host-local
//! with GC would do. It uses host-local's on-disk format (§7.2) and host-local's
//! keying and errors for `ADD`/`DEL`/`CHECK`, and it adds `GC` (§2.7) and `STATUS`
//! (§2.8). Only the points below are promised.
//!
//! # Environment
//! - Env vars come in through the `getenv` closure given to `standin::run`;
//!   `main` passes `std::env::var`. The process environment is never changed. An
//!   empty value counts as absent, because libcni sets every `CNI_*` var and uses
//!   `""` for the ones that do not apply.
//! - `CNI_COMMAND`: `ADD`, `DEL`, `CHECK`, `GC`, `STATUS` or `VERSION`. An absent value
//!   → code 4 `required env variables [CNI_COMMAND] missing`. Any other value → code 4
//!   `unknown CNI_COMMAND: X`.
//! - `ADD`, `DEL` and `CHECK` need `CNI_CONTAINERID` and `CNI_IFNAME`. If either is
//!   absent → code 4 `required env variables [CNI_CONTAINERID,CNI_IFNAME] missing`,
//!   naming only the absent ones. The container ID must match
//!   `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$` (code 4 `invalid characters in containerID`). The
//!   ifname must be at most 15 bytes, must not be `.` or `..`, and must not contain
//!   `/`, `:` or whitespace (code 4 `invalid CNI_IFNAME`). These are libcni's rules.
//!   `GC` and `STATUS` need no attachment variables.
//! - `CNI_NETNS`, `CNI_ARGS` and `CNI_PATH` are accepted and ignored.
//!
//! # Versions
//! - `VERSION` ignores stdin and prints
//!   `{"cniVersion":"1.1.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0","1.1.0"]}`.
//! - A config `cniVersion` outside that list → code 1 `incompatible CNI versions`, with
//!   details naming the version. A missing `cniVersion` is rejected the same way
//!   (Go would read it as "0.1.0", which is not supported either).
//! - `CHECK` needs ≥ 0.4.0 (code 1 `config version does not allow CHECK`).
//! - `GC` and `STATUS` need exactly 1.1.0 (code 1 `config version does not allow GC`
//!   or `... STATUS`).
//!
//! # Config (stdin)
//! `{"cniVersion", "name", "ipam": {"type", "ranges": [[{"subnet"}]], "dataDir"?}}`.
//! Keys match case-insensitively, with an exact match preferred, as with Go's
//! `encoding/json`. Unknown keys are ignored.
//! - Input that is not a JSON object, or a known key of the wrong JSON type → code 6.
//!   Reading stdin fails → code 5.
//! - `name` is required for every command except `VERSION`, and it must match the
//!   container-ID pattern above. Otherwise → code 7. It names the store directory.
//! - `ipam.dataDir` defaults to `/var/lib/cni/gc-ipam`.
//! - Only `ADD` reads `ranges`, and it uses only the first subnet of the first range
//!   set, IPv4 or IPv6. It is required for `ADD`. A missing subnet, a subnet that is
//!   not a CIDR, a subnet with host bits set, or one too small (IPv4 /31 and /32,
//!   IPv6 /127 and /128) → code 7. `rangeStart`, `rangeEnd`, `gateway`, `routes`,
//!   further ranges, `runtimeConfig`, `args` and `CNI_ARGS` are ignored.
//!
//! # Store
//! The store directory is `<dataDir>/<name>/` (mode 0755). It uses host-local's format
//! exactly:
//! - One file per reserved IP, named by the IP's canonical text (`10.88.0.2`,
//!   `fd00::2`). It is created with `O_CREAT|O_EXCL`, mode 0644, and it holds
//!   `<containerID>\r\n<ifname>` with no trailing newline.
//! - `last_reserved_ip.0` holds the last IP reserved. It is written but never read:
//!   allocation is always lowest-free, not host-local's round robin.
//! - `lock` is an empty file. Every `ADD`, `DEL`, `CHECK` and `GC` holds an exclusive
//!   `flock(2)` on it for the whole operation. Giving up after 10 s → code 11.
//! - `gc.log`: `GC` appends one line per call (see below).
//!
//! Only top-level entries whose name parses as an IP address and that are not
//! directories count as reservations. `lock`, `last_reserved_ip.*`, `gc.log` and
//! anything else are never read as reservations and never deleted. As in host-local,
//! file contents are compared after trimming whitespace. A file holding only
//! `<containerID>` is a legacy reservation written by host-local before ifnames were
//! recorded.
//!
//! # ADD
//! - The gateway is network+1 and is never allocated. The plugin allocates the lowest
//!   free address from network+2 up to the last address, which for IPv4 is the one
//!   below broadcast.
//! - Allocations are keyed by (container ID, ifname), as in host-local. Suppose the
//!   pair already holds an address in this subnet (a `<id>\r\n<ifname>` file, or a
//!   legacy `<id>` file). Then → code 999 `<ip> has been allocated to <id>, duplicate
//!   allocation is not allowed`, and nothing changes.
//! - Subnet exhausted → code 999 `no IP addresses available in range set: <net+1>-<last>`.
//! - The result is in the config's `cniVersion`:
//!   `{"cniVersion":..,"ips":[{"address":"<ip>/<prefix>","gateway":"<net+1>"}]}`. For
//!   0.3.0/0.3.1/0.4.0 each IP also carries `"version":"4"|"6"`. There are no
//!   `interfaces`, `routes` or `dns`.
//!
//! # DEL
//! Under the lock, `DEL` deletes every reservation file whose content is
//! `<id>\r\n<ifname>`. If there is none, it deletes those whose content is the legacy
//! `<id>` (host-local's fallback). Nothing found → success. It prints nothing on
//! success. A file that cannot be removed → code 999.
//!
//! # CHECK
//! If a reservation for the pair exists (exact match or legacy fallback) → success,
//! no output. Otherwise → code 999
//! `gc-ipam: failed to find address added by container <id>`.
//!
//! # GC
//! - The valid list is `cni.dev/valid-attachments`, an array of
//!   `{"containerID","ifname"}`. If that key is absent or `null`, the plugin uses
//!   `cni.dev/attachments` instead. If both are absent or `null`, the list is empty,
//!   so **every** reservation is freed. The plugin trusts its caller; dipamd is the
//!   one with safety interlocks. A list of the wrong shape → code 6. An entry's
//!   missing `containerID` or `ifname` reads as `""`.
//! - Under the lock, every reservation file is deleted unless one of these holds:
//!   its content is `<id>\r\n<ifname>` for a pair in the list, or it is a legacy
//!   `<id>` file and some entry in the list has that container ID.
//! - Each call then appends one line to `<store dir>/gc.log`: a JSON array of the freed
//!   IPs, sorted, e.g. `["10.88.0.3"]` or `[]`. The store directory is created if it
//!   is missing.
//! - `GC` prints nothing on success. A reservation that cannot be read or removed, or
//!   a `gc.log` that cannot be written, does not stop the sweep. It is reported
//!   afterwards as code 999.
//!
//! # STATUS
//! If `<dataDir>/status-fail` exists → code 50
//! `gc-ipam: not available (status-fail marker present)`. This is a switch for tests.
//! Otherwise `STATUS` succeeds, printing nothing, if a file can be created in
//! `<dataDir>`. If `<dataDir>` does not exist, the probe uses the nearest existing
//! ancestor, and nothing is left behind. If the probe fails → code 50
//! `gc-ipam: not available (data directory not writable)`. `STATUS` takes no lock.
//!
//! # Errors
//! `{"code":N,"msg":"...","details":"..."}` on stdout, with `details` left out when
//! empty and no `cniVersion` key, like Go's `types.Error`. Exit status 1. Store I/O
//! errors are code 999, as Go's skel reports a plugin's plain errors. The plugin
//! never panics on any input.

use std::collections::{BTreeSet, HashSet};
use std::fs::{self, DirBuilder, OpenOptions};
use std::io::{self, Read, Write};
use std::net::IpAddr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use dipam_lifecycle::standin::{
    self, CniError, ERR_INVALID_CONFIG, ERR_INVALID_ENV, Env, FileLock, IpConfig, LockStep, Pool,
    array_field, decode_err, missing_env, object_field, string_field,
};
use ipnet::IpNet;
use serde::Serialize;
use serde_json::{Map, Value};

const SUPPORTED_VERSIONS: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];
const VERSION_OUTPUT: &str =
    r#"{"cniVersion":"1.1.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0","1.1.0"]}"#;
const DEFAULT_DATA_DIR: &str = "/var/lib/cni/gc-ipam";
const LOCK_FILE: &str = "lock";
const LAST_RESERVED_PREFIX: &str = "last_reserved_ip";
/// host-local's name for range set 0's last reservation.
const LAST_RESERVED_FILE: &str = "last_reserved_ip.0";
const GC_LOG: &str = "gc.log";
const STATUS_FAIL_MARKER: &str = "status-fail";
/// host-local's separator between container ID and ifname in a reservation file.
const LINE_BREAK: &str = "\r\n";
const VALID_ATTACHMENTS_KEY: &str = "cni.dev/valid-attachments";
const LEGACY_ATTACHMENTS_KEY: &str = "cni.dev/attachments";

const ERR_NOT_AVAILABLE: u32 = 50;
/// Go's `types.ErrInternal`: what skel reports for a plugin's plain errors.
const ERR_INTERNAL: u32 = 999;

/// The (container ID, ifname) pair a reservation belongs to.
#[derive(Debug, Clone)]
struct Attachment {
    id: String,
    ifname: String,
}

impl Attachment {
    /// The reservation file content host-local writes for this pair.
    fn content(&self) -> String {
        format!("{}{LINE_BREAK}{}", self.id.trim(), self.ifname)
    }
}

#[derive(Debug)]
enum Command {
    Add(Attachment),
    Del(Attachment),
    Check(Attachment),
    Gc,
    Status,
}

/// The parts of the stdin config this plugin uses.
#[derive(Debug)]
struct Config {
    cni_version: String,
    name: String,
    data_dir: PathBuf,
    /// First subnet of the first range set, unparsed.
    subnet: Option<String>,
    /// The whole top-level object, for the GC keys.
    top: Map<String, Value>,
}

impl Config {
    fn store_dir(&self) -> PathBuf {
        self.data_dir.join(&self.name)
    }
}

fn main() {
    standin::main(VERSION_OUTPUT, dispatch)
}

/// Every command but `VERSION`, which `standin::run` answers with [`VERSION_OUTPUT`].
fn dispatch(
    command: &str,
    env: &Env<'_>,
    stdin: &mut dyn Read,
) -> Result<Option<String>, CniError> {
    let command = match command {
        "ADD" => Command::Add(attachment_from_env(env)?),
        "DEL" => Command::Del(attachment_from_env(env)?),
        "CHECK" => Command::Check(attachment_from_env(env)?),
        "GC" => Command::Gc,
        "STATUS" => Command::Status,
        other => return Err(standin::unknown_command(other)),
    };

    let conf = parse_config(&standin::read_stdin(stdin)?)?;

    match command {
        Command::Add(att) => cmd_add(&conf, &att).map(Some),
        Command::Del(att) => cmd_del(&conf, &att).map(|()| None),
        Command::Check(att) => cmd_check(&conf, &att).map(|()| None),
        Command::Gc => cmd_gc(&conf).map(|()| None),
        Command::Status => cmd_status(&conf).map(|()| None),
    }
}

fn attachment_from_env(env: &Env<'_>) -> Result<Attachment, CniError> {
    let id = env.get("CNI_CONTAINERID");
    let ifname = env.get("CNI_IFNAME");
    let (id, ifname) = match (id, ifname) {
        (Some(id), Some(ifname)) => (id, ifname),
        (id, ifname) => {
            let mut missing = Vec::new();
            if id.is_none() {
                missing.push("CNI_CONTAINERID");
            }
            if ifname.is_none() {
                missing.push("CNI_IFNAME");
            }
            return Err(missing_env(&missing));
        }
    };
    standin::check_container_id(&id)?;
    if let Err(why) = validate_ifname(&ifname) {
        return Err(CniError::new(
            ERR_INVALID_ENV,
            "invalid CNI_IFNAME",
            format!("{ifname:?}: {why}"),
        ));
    }
    Ok(Attachment { id, ifname })
}

/// libcni's interface-name rule.
fn validate_ifname(ifname: &str) -> Result<(), &'static str> {
    if ifname.len() > 15 {
        return Err("interface name is longer than 15 bytes");
    }
    if ifname == "." || ifname == ".." {
        return Err("interface name cannot be . or ..");
    }
    if ifname
        .chars()
        .any(|c| c == '/' || c == ':' || c.is_whitespace())
    {
        return Err("interface name contains / or : or whitespace characters");
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Config
// ---------------------------------------------------------------------------

fn parse_config(raw: &[u8]) -> Result<Config, CniError> {
    let top = standin::parse_object(raw)?;

    let cni_version = string_field(&top, "cniVersion", "cniVersion")?;
    let name = string_field(&top, "name", "name")?;
    let empty = Map::new();
    let ipam = object_field(&top, "ipam", "ipam")?.unwrap_or(&empty);
    // Checked for type only, like a Go struct decode; the value is not used.
    string_field(ipam, "type", "ipam.type")?;
    let data_dir = string_field(ipam, "dataDir", "ipam.dataDir")?
        .unwrap_or_else(|| DEFAULT_DATA_DIR.to_owned());
    let subnet = first_subnet(ipam)?;

    // skel's order: name first, then the version.
    let Some(name) = name else {
        return Err(CniError::new(
            ERR_INVALID_CONFIG,
            "missing network name",
            "",
        ));
    };
    if !standin::valid_identifier(&name) {
        return Err(CniError::new(
            ERR_INVALID_CONFIG,
            "invalid characters found in network name",
            name,
        ));
    }
    let cni_version = match cni_version {
        Some(v) if SUPPORTED_VERSIONS.contains(&v.as_str()) => v,
        other => {
            return Err(standin::unsupported_version(
                &other.unwrap_or_default(),
                &SUPPORTED_VERSIONS,
            ));
        }
    };

    Ok(Config {
        cni_version,
        name,
        data_dir: PathBuf::from(data_dir),
        subnet,
        top,
    })
}

/// `ipam.ranges[0][0].subnet`, type-checked along the way.
fn first_subnet(ipam: &Map<String, Value>) -> Result<Option<String>, CniError> {
    let Some(ranges) = array_field(ipam, "ranges", "ipam.ranges")? else {
        return Ok(None);
    };
    let Some(set) = ranges.first() else {
        return Ok(None);
    };
    let Value::Array(set) = set else {
        return Err(decode_err(format!(
            "ipam.ranges[0] must be an array, got {set}"
        )));
    };
    let Some(range) = set.first() else {
        return Ok(None);
    };
    let Value::Object(range) = range else {
        return Err(decode_err(format!(
            "ipam.ranges[0][0] must be an object, got {range}"
        )));
    };
    string_field(range, "subnet", "ipam.ranges[0][0].subnet")
}

fn require_version(conf: &Config, op: &str, ok: &[&str], needs: &str) -> Result<(), CniError> {
    standin::require_version(&conf.cni_version, op, ok, needs)
}

// ---------------------------------------------------------------------------
// Subnet
// ---------------------------------------------------------------------------

/// The pool from `ipam.ranges[0][0].subnet`: a CIDR without host bits, with room for
/// a network address, a gateway and one allocatable address.
fn parse_subnet(text: Option<&str>) -> Result<Pool, CniError> {
    let invalid =
        |details: String| CniError::new(ERR_INVALID_CONFIG, "invalid ipam subnet", details);
    let Some(text) = text else {
        return Err(invalid(
            "ADD needs ipam.ranges[0][0].subnet (e.g. \"10.88.0.0/24\")".to_owned(),
        ));
    };
    let net: IpNet = text
        .parse()
        .map_err(|e| invalid(format!("{text:?} is not a CIDR: {e}")))?;
    if net.trunc() != net {
        return Err(invalid(format!(
            "{text:?} has host bits set; the network address is {}",
            net.trunc()
        )));
    }
    Pool::new(net).ok_or_else(|| {
        invalid(format!(
            "subnet {net} is too small (IPv4 needs ≤ /30, IPv6 ≤ /126)"
        ))
    })
}

// ---------------------------------------------------------------------------
// Store: host-local's directory layout
// ---------------------------------------------------------------------------

fn store_err(what: &str, path: &Path, err: impl std::fmt::Display) -> CniError {
    CniError::new(
        ERR_INTERNAL,
        format!("gc-ipam: failed to {what}"),
        format!("{}: {err}", path.display()),
    )
}

/// Creates the store directory if needed and takes the exclusive flock on
/// `<store dir>/lock` (held until the guard drops).
fn lock_store(dir: &Path) -> Result<FileLock, CniError> {
    DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
        .map_err(|e| store_err("create store directory", dir, e))?;
    let lock_path = dir.join(LOCK_FILE);
    FileLock::acquire(&lock_path, 0o644, "store", |step, e| {
        let what = match step {
            LockStep::Open => "open lock file",
            LockStep::Lock => "lock",
        };
        store_err(what, &lock_path, e)
    })
}

/// One reservation file.
struct Reservation {
    ip: IpAddr,
    path: PathBuf,
    /// Trimmed content, or why it could not be read.
    content: Result<String, String>,
}

impl Reservation {
    /// True if the file is `<id>\r\n<ifname>` for `att`.
    fn is_exact(&self, att: &Attachment) -> bool {
        self.content.as_deref() == Ok(att.content().as_str())
    }

    /// True if the file is a legacy `<id>`-only reservation for `att`'s container.
    fn is_legacy(&self, att: &Attachment) -> bool {
        self.content.as_deref() == Ok(att.id.trim())
    }
}

/// True if a store entry name can be a reservation: it parses as an IP address and is
/// none of the plugin's bookkeeping files.
fn reservation_ip(name: &str) -> Option<IpAddr> {
    if name == LOCK_FILE || name == GC_LOG || name.starts_with(LAST_RESERVED_PREFIX) {
        return None;
    }
    name.parse().ok()
}

/// Lists the reservation files at the top level of `dir` (sorted by IP).
fn scan(dir: &Path) -> Result<Vec<Reservation>, CniError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(store_err("read store directory", dir, e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| store_err("read store directory", dir, e))?;
        let Some(ip) = entry.file_name().to_str().and_then(reservation_ip) else {
            continue;
        };
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let path = entry.path();
        let content = fs::read_to_string(&path)
            .map(|s| s.trim().to_owned())
            .map_err(|e| format!("{}: {e}", path.display()));
        out.push(Reservation { ip, path, content });
    }
    out.sort_by_key(|r| r.ip);
    Ok(out)
}

/// Creates the reservation file for `ip` with O_EXCL. `Ok(false)` if it already exists.
fn reserve(dir: &Path, ip: IpAddr, att: &Attachment) -> Result<bool, CniError> {
    let path = dir.join(ip.to_string());
    let mut file = match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(&path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(false),
        Err(e) => return Err(store_err("create reservation", &path, e)),
    };
    if let Err(e) = file
        .write_all(att.content().as_bytes())
        .and_then(|()| file.sync_all())
    {
        drop(file);
        let _ = fs::remove_file(&path);
        return Err(store_err("write reservation", &path, e));
    }
    Ok(true)
}

/// Replaces `<dir>/<name>` atomically (see [`standin::write_atomic`]).
fn write_atomic(dir: &Path, name: &str, data: &[u8]) -> Result<(), CniError> {
    let path = dir.join(name);
    standin::write_atomic(&path, ".gc-ipam.", data, |what, e| {
        store_err(what, &path, e)
    })
}

// ---------------------------------------------------------------------------
// ADD / DEL / CHECK
// ---------------------------------------------------------------------------

fn cmd_add(conf: &Config, att: &Attachment) -> Result<String, CniError> {
    let pool = parse_subnet(conf.subnet.as_deref())?;
    let dir = conf.store_dir();
    let _lock = lock_store(&dir)?;
    let existing = scan(&dir)?;

    if let Some(held) = existing
        .iter()
        .find(|r| pool.net.contains(&r.ip) && (r.is_exact(att) || r.is_legacy(att)))
    {
        return Err(CniError::new(
            ERR_INTERNAL,
            format!(
                "{} has been allocated to {}, duplicate allocation is not allowed",
                held.ip, att.id
            ),
            format!("ifname {}", att.ifname),
        ));
    }

    let taken: HashSet<IpAddr> = existing.iter().map(|r| r.ip).collect();
    for ip in pool.addresses() {
        if taken.contains(&ip) || !reserve(&dir, ip, att)? {
            continue;
        }
        write_atomic(&dir, LAST_RESERVED_FILE, ip.to_string().as_bytes())?;
        return render_result(&conf.cni_version, &pool, ip);
    }
    Err(CniError::new(
        ERR_INTERNAL,
        format!(
            "no IP addresses available in range set: {}-{}",
            pool.gateway,
            pool.last_address()
        ),
        format!("every address of {} is reserved", pool.net),
    ))
}

fn cmd_del(conf: &Config, att: &Attachment) -> Result<(), CniError> {
    let dir = conf.store_dir();
    let _lock = lock_store(&dir)?;
    let existing = scan(&dir)?;
    let mut doomed: Vec<&Reservation> = existing.iter().filter(|r| r.is_exact(att)).collect();
    if doomed.is_empty() {
        doomed = existing.iter().filter(|r| r.is_legacy(att)).collect();
    }
    let errors: Vec<String> = doomed
        .iter()
        .filter_map(|r| match fs::remove_file(&r.path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                Some(format!("{}: {e}", r.path.display()))
            }
            _ => None,
        })
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(CniError::new(
            ERR_INTERNAL,
            format!(
                "gc-ipam: failed to release addresses of container {}",
                att.id
            ),
            errors.join("; "),
        ))
    }
}

fn cmd_check(conf: &Config, att: &Attachment) -> Result<(), CniError> {
    require_version(
        conf,
        "CHECK",
        &["0.4.0", "1.0.0", "1.1.0"],
        "0.4.0 or later",
    )?;
    let dir = conf.store_dir();
    let _lock = lock_store(&dir)?;
    let existing = scan(&dir)?;
    if existing.iter().any(|r| r.is_exact(att)) || existing.iter().any(|r| r.is_legacy(att)) {
        return Ok(());
    }
    Err(CniError::new(
        ERR_INTERNAL,
        format!(
            "gc-ipam: failed to find address added by container {}",
            att.id
        ),
        format!(
            "no reservation for ifname {} in {}",
            att.ifname,
            dir.display()
        ),
    ))
}

// ---------------------------------------------------------------------------
// GC / STATUS
// ---------------------------------------------------------------------------

/// The valid-attachments list: `cni.dev/valid-attachments`, else
/// `cni.dev/attachments`, else empty.
fn gc_attachments(top: &Map<String, Value>) -> Result<Vec<Attachment>, CniError> {
    let list = match array_field(top, VALID_ATTACHMENTS_KEY, VALID_ATTACHMENTS_KEY)? {
        Some(list) => list,
        None => match array_field(top, LEGACY_ATTACHMENTS_KEY, LEGACY_ATTACHMENTS_KEY)? {
            Some(list) => list,
            None => return Ok(Vec::new()),
        },
    };
    list.iter()
        .enumerate()
        .map(|(i, item)| {
            let Value::Object(obj) = item else {
                return Err(decode_err(format!(
                    "GC attachment #{i} must be an object, got {item}"
                )));
            };
            Ok(Attachment {
                id: string_field(obj, "containerID", "containerID")?.unwrap_or_default(),
                ifname: string_field(obj, "ifname", "ifname")?.unwrap_or_default(),
            })
        })
        .collect()
}

fn cmd_gc(conf: &Config) -> Result<(), CniError> {
    require_version(conf, "GC", &["1.1.0"], "1.1.0")?;
    let valid = gc_attachments(&conf.top)?;
    let keep_exact: HashSet<String> = valid.iter().map(Attachment::content).collect();
    let keep_ids: HashSet<&str> = valid.iter().map(|a| a.id.trim()).collect();

    let dir = conf.store_dir();
    let _lock = lock_store(&dir)?;
    let mut freed = BTreeSet::new();
    let mut errors = Vec::new();
    for r in scan(&dir)? {
        let content = match &r.content {
            Ok(c) => c,
            Err(e) => {
                errors.push(e.clone());
                continue;
            }
        };
        let keep = if content.contains(LINE_BREAK) {
            keep_exact.contains(content)
        } else {
            keep_ids.contains(content.as_str())
        };
        if keep {
            continue;
        }
        match fs::remove_file(&r.path) {
            Ok(()) => {
                freed.insert(r.ip);
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => errors.push(format!("{}: {e}", r.path.display())),
        }
    }

    let freed: Vec<String> = freed.iter().map(IpAddr::to_string).collect();
    let log_path = dir.join(GC_LOG);
    let line = serde_json::to_string(&freed).unwrap_or_else(|_| "[]".to_owned());
    if let Err(e) = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o644)
        .open(&log_path)
        .and_then(|mut f| {
            f.write_all(format!("{line}\n").as_bytes())?;
            f.sync_all()
        })
    {
        errors.push(format!("{}: {e}", log_path.display()));
    }

    if errors.is_empty() {
        Ok(())
    } else {
        Err(CniError::new(
            ERR_INTERNAL,
            "gc-ipam: GC could not release every stale address",
            errors.join("; "),
        ))
    }
}

fn cmd_status(conf: &Config) -> Result<(), CniError> {
    require_version(conf, "STATUS", &["1.1.0"], "1.1.0")?;
    let marker = conf.data_dir.join(STATUS_FAIL_MARKER);
    if fs::symlink_metadata(&marker).is_ok() {
        return Err(CniError::new(
            ERR_NOT_AVAILABLE,
            "gc-ipam: not available (status-fail marker present)",
            marker.display().to_string(),
        ));
    }
    check_writable(&conf.data_dir).map_err(|why| {
        CniError::new(
            ERR_NOT_AVAILABLE,
            "gc-ipam: not available (data directory not writable)",
            why,
        )
    })
}

/// Checks that a file can be created in `dir`, or in its nearest existing ancestor
/// if `dir` does not exist yet. Creates nothing that outlives the call.
fn check_writable(dir: &Path) -> Result<(), String> {
    let mut probe = dir;
    loop {
        let at = if probe.as_os_str().is_empty() {
            Path::new(".")
        } else {
            probe
        };
        match fs::metadata(at) {
            Ok(m) if m.is_dir() => {
                return tempfile::Builder::new()
                    .prefix(".gc-ipam-status.")
                    .tempfile_in(at)
                    .map(drop)
                    .map_err(|e| format!("{}: {e}", at.display()));
            }
            Ok(_) => return Err(format!("{} exists and is not a directory", at.display())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => match probe.parent() {
                Some(parent) => probe = parent,
                None => return Err(format!("{}: {e}", at.display())),
            },
            Err(e) => return Err(format!("{}: {e}", at.display())),
        }
    }
}

// ---------------------------------------------------------------------------
// Results
// ---------------------------------------------------------------------------

/// IPAM-abbreviated result: no `interfaces`, `routes` or `dns`.
#[derive(Serialize)]
struct IpamResult {
    #[serde(rename = "cniVersion")]
    cni_version: String,
    ips: Vec<IpConfig>,
}

fn render_result(cni_version: &str, pool: &Pool, ip: IpAddr) -> Result<String, CniError> {
    let result = IpamResult {
        cni_version: cni_version.to_owned(),
        ips: vec![IpConfig::new(cni_version, pool, ip)],
    };
    standin::encode_result(&result, ERR_INTERNAL)
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::HashMap;

    struct Fixture {
        dir: tempfile::TempDir,
    }

    impl Fixture {
        fn new() -> Self {
            Self {
                dir: tempfile::tempdir().unwrap(),
            }
        }

        fn data_dir(&self) -> PathBuf {
            self.dir.path().join("data")
        }

        fn store(&self) -> PathBuf {
            self.data_dir().join("net1")
        }

        /// Config with the given cniVersion and subnet, plus extra top-level keys.
        fn conf(&self, version: &str, subnet: &str, extra: Value) -> String {
            let mut top = json!({
                "cniVersion": version,
                "name": "net1",
                "ipam": {
                    "type": "gc-ipam",
                    "ranges": [[{"subnet": subnet}]],
                    "dataDir": self.data_dir().to_str().unwrap(),
                },
            });
            if let (Value::Object(m), Value::Object(e)) = (&mut top, extra) {
                m.extend(e);
            }
            top.to_string()
        }

        fn conf11(&self, extra: Value) -> String {
            self.conf("1.1.0", "10.88.0.0/24", extra)
        }

        fn read(&self, name: &str) -> String {
            fs::read_to_string(self.store().join(name)).unwrap()
        }

        fn exists(&self, name: &str) -> bool {
            self.store().join(name).exists()
        }

        fn gc_log(&self) -> Vec<Value> {
            self.read(GC_LOG)
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect()
        }
    }

    fn invoke_env(env: &[(&str, &str)], stdin: &str) -> (i32, String) {
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let mut out = Vec::new();
        let code = standin::run(
            VERSION_OUTPUT,
            dispatch,
            |k: &str| env.get(k).cloned(),
            stdin.as_bytes(),
            &mut out,
        );
        (code, String::from_utf8(out).unwrap())
    }

    fn invoke_with(cmd: &str, id: &str, ifname: &str, stdin: &str) -> (i32, String) {
        invoke_env(
            &[
                ("CNI_COMMAND", cmd),
                ("CNI_CONTAINERID", id),
                ("CNI_IFNAME", ifname),
                ("CNI_NETNS", "/var/run/netns/test"),
                ("CNI_PATH", "/opt/cni/bin"),
                ("CNI_ARGS", "IgnoreUnknown=1"),
            ],
            stdin,
        )
    }

    /// GC/STATUS as libcni sends them: attachment vars set but empty.
    fn invoke_net(cmd: &str, stdin: &str) -> (i32, String) {
        invoke_with(cmd, "", "", stdin)
    }

    fn parse(out: &str) -> Value {
        serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}): {out:?}"))
    }

    fn add_ip(fx: &Fixture, id: &str, ifname: &str) -> String {
        let (code, out) = invoke_with("ADD", id, ifname, &fx.conf11(json!({})));
        assert_eq!(code, 0, "{out}");
        parse(&out)["ips"][0]["address"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    fn assert_ok(res: (i32, String)) {
        assert_eq!((res.0, res.1.as_str()), (0, ""));
    }

    fn assert_error(code: i32, out: &str, want: u64) -> Value {
        assert_eq!(code, 1, "{out}");
        let v = parse(out);
        assert_eq!(v["code"], want, "{out}");
        assert!(v.get("cniVersion").is_none(), "{out}");
        v
    }

    #[test]
    fn add_two_pairs_distinct_ips_and_files() {
        let fx = Fixture::new();
        assert_eq!(add_ip(&fx, "ctr1", "eth0"), "10.88.0.2/24");
        // Same container, another ifname: a separate pair.
        assert_eq!(add_ip(&fx, "ctr1", "net1"), "10.88.0.3/24");
        assert_eq!(fx.read("10.88.0.2"), "ctr1\r\neth0");
        assert_eq!(fx.read("10.88.0.3"), "ctr1\r\nnet1");
        assert_eq!(fx.read(LAST_RESERVED_FILE), "10.88.0.3");
        assert_eq!(fx.read(LOCK_FILE), "");
    }

    #[test]
    fn add_result_shapes() {
        let fx = Fixture::new();
        let (code, out) = invoke_with("ADD", "a", "eth0", &fx.conf11(json!({})));
        assert_eq!(code, 0, "{out}");
        assert_eq!(
            parse(&out),
            json!({
                "cniVersion": "1.1.0",
                "ips": [{"address": "10.88.0.2/24", "gateway": "10.88.0.1"}],
            })
        );
        for (i, v) in ["0.3.0", "0.3.1", "0.4.0", "1.0.0"].into_iter().enumerate() {
            let conf = fx.conf(v, "10.88.0.0/24", json!({}));
            let (code, out) = invoke_with("ADD", &format!("b{i}"), "eth0", &conf);
            assert_eq!(code, 0, "{out}");
            let r = parse(&out);
            assert_eq!(r["cniVersion"], v);
            let want_version = if v == "1.0.0" {
                Value::Null
            } else {
                json!("4")
            };
            assert_eq!(r["ips"][0]["version"], want_version, "{out}");
        }
    }

    #[test]
    fn duplicate_add_is_999_and_changes_nothing() {
        let fx = Fixture::new();
        add_ip(&fx, "a", "eth0");
        let (code, out) = invoke_with("ADD", "a", "eth0", &fx.conf11(json!({})));
        let e = assert_error(code, &out, 999);
        let msg = e["msg"].as_str().unwrap();
        assert!(msg.contains("duplicate allocation is not allowed"), "{msg}");
        assert!(msg.contains("10.88.0.2"), "{msg}");
        assert!(!fx.exists("10.88.0.3"));
    }

    #[test]
    fn legacy_file_counts_as_duplicate_and_is_found() {
        let fx = Fixture::new();
        fs::create_dir_all(fx.store()).unwrap();
        fs::write(fx.store().join("10.88.0.2"), "old").unwrap();
        let (code, out) = invoke_with("ADD", "old", "eth0", &fx.conf11(json!({})));
        assert_error(code, &out, 999);
        assert_ok(invoke_with("CHECK", "old", "eth0", &fx.conf11(json!({}))));
        assert_ok(invoke_with("DEL", "old", "eth0", &fx.conf11(json!({}))));
        assert!(!fx.exists("10.88.0.2"));
    }

    #[test]
    fn del_is_idempotent_and_exact() {
        let fx = Fixture::new();
        let conf = fx.conf11(json!({}));
        add_ip(&fx, "a", "eth0");
        add_ip(&fx, "a", "eth1");
        assert_ok(invoke_with("DEL", "a", "eth0", &conf));
        assert!(!fx.exists("10.88.0.2"));
        assert!(fx.exists("10.88.0.3"));
        assert_ok(invoke_with("DEL", "a", "eth0", &conf));
        assert_ok(invoke_with("DEL", "nobody", "eth0", &conf));
        // A DEL on a network never used creates nothing harmful and succeeds.
        let other = conf.replace("\"net1\"", "\"net2\"");
        assert_ok(invoke_with("DEL", "a", "eth0", &other));
        // The freed address is reused first.
        assert_eq!(add_ip(&fx, "b", "eth0"), "10.88.0.2/24");
    }

    #[test]
    fn check() {
        let fx = Fixture::new();
        let conf = fx.conf11(json!({}));
        let (code, out) = invoke_with("CHECK", "a", "eth0", &conf);
        let e = assert_error(code, &out, 999);
        assert_eq!(
            e["msg"],
            "gc-ipam: failed to find address added by container a"
        );
        add_ip(&fx, "a", "eth0");
        assert_ok(invoke_with("CHECK", "a", "eth0", &conf));
        let (code, out) = invoke_with("CHECK", "a", "eth1", &conf);
        assert_error(code, &out, 999);
        let old = fx.conf("0.3.1", "10.88.0.0/24", json!({}));
        let (code, out) = invoke_with("CHECK", "a", "eth0", &old);
        assert_error(code, &out, 1);
    }

    #[test]
    fn gc_keeps_listed_and_frees_the_rest() {
        let fx = Fixture::new();
        add_ip(&fx, "keep", "eth0");
        add_ip(&fx, "gone", "eth0");
        add_ip(&fx, "keep", "eth1");
        fs::write(fx.store().join("last_reserved_ip.1"), "10.88.0.9").unwrap();
        let conf = fx.conf11(json!({
            VALID_ATTACHMENTS_KEY: [{"containerID": "keep", "ifname": "eth0"}],
            // Ignored: the valid list wins.
            LEGACY_ATTACHMENTS_KEY: [{"containerID": "gone", "ifname": "eth0"}],
        }));
        assert_ok(invoke_net("GC", &conf));
        assert_eq!(fx.read("10.88.0.2"), "keep\r\neth0");
        assert!(!fx.exists("10.88.0.3"));
        assert!(!fx.exists("10.88.0.4"));
        assert_eq!(fx.read(LOCK_FILE), "");
        assert_eq!(fx.read(LAST_RESERVED_FILE), "10.88.0.4");
        assert_eq!(fx.read("last_reserved_ip.1"), "10.88.0.9");
        assert_eq!(fx.gc_log(), vec![json!(["10.88.0.3", "10.88.0.4"])]);
        // A second GC frees nothing and logs an empty list.
        assert_ok(invoke_net("GC", &conf));
        assert_eq!(
            fx.gc_log(),
            vec![json!(["10.88.0.3", "10.88.0.4"]), json!([])]
        );
        assert!(fx.exists("10.88.0.2"));
    }

    #[test]
    fn gc_needs_1_1_0() {
        let fx = Fixture::new();
        add_ip(&fx, "a", "eth0");
        for v in ["1.0.0", "0.4.0"] {
            let conf = fx.conf(v, "10.88.0.0/24", json!({}));
            let (code, out) = invoke_net("GC", &conf);
            let e = assert_error(code, &out, 1);
            assert_eq!(e["msg"], "config version does not allow GC");
        }
        assert!(fx.exists("10.88.0.2"));
        assert!(!fx.exists(GC_LOG));
    }

    #[test]
    fn gc_with_legacy_key_only() {
        let fx = Fixture::new();
        add_ip(&fx, "a", "eth0");
        add_ip(&fx, "b", "eth0");
        let conf = fx.conf11(json!({
            VALID_ATTACHMENTS_KEY: null,
            LEGACY_ATTACHMENTS_KEY: [{"containerID": "b", "ifname": "eth0"}],
        }));
        assert_ok(invoke_net("GC", &conf));
        assert!(!fx.exists("10.88.0.2"));
        assert!(fx.exists("10.88.0.3"));
        assert_eq!(fx.gc_log(), vec![json!(["10.88.0.2"])]);
    }

    #[test]
    fn gc_without_list_frees_everything() {
        for extra in [
            json!({}),
            json!({VALID_ATTACHMENTS_KEY: null, LEGACY_ATTACHMENTS_KEY: null}),
            json!({VALID_ATTACHMENTS_KEY: []}),
        ] {
            let fx = Fixture::new();
            add_ip(&fx, "a", "eth0");
            assert_ok(invoke_net("GC", &fx.conf11(extra)));
            assert!(!fx.exists("10.88.0.2"));
            assert!(fx.exists(LOCK_FILE));
            assert!(fx.exists(LAST_RESERVED_FILE));
            assert_eq!(fx.gc_log(), vec![json!(["10.88.0.2"])]);
        }
    }

    #[test]
    fn gc_legacy_files_and_foreign_entries() {
        let fx = Fixture::new();
        fs::create_dir_all(fx.store().join("10.88.0.7")).unwrap();
        fs::write(fx.store().join("10.88.0.5"), "old\n").unwrap();
        fs::write(fx.store().join("10.88.0.6"), "stale").unwrap();
        fs::write(fx.store().join("notes.txt"), "x").unwrap();
        let conf = fx.conf11(json!({
            VALID_ATTACHMENTS_KEY: [{"containerID": "old", "ifname": "eth0"}],
        }));
        assert_ok(invoke_net("GC", &conf));
        assert!(fx.exists("10.88.0.5"));
        assert!(!fx.exists("10.88.0.6"));
        assert!(fx.exists("10.88.0.7"));
        assert!(fx.exists("notes.txt"));
        assert_eq!(fx.gc_log(), vec![json!(["10.88.0.6"])]);
    }

    #[test]
    fn gc_bad_list_is_decode_error() {
        let fx = Fixture::new();
        for bad in [json!(5), json!(["x"]), json!([{"containerID": 5}])] {
            let conf = fx.conf11(json!({ VALID_ATTACHMENTS_KEY: bad }));
            let (code, out) = invoke_net("GC", &conf);
            assert_error(code, &out, 6);
        }
    }

    #[test]
    fn status_ok_and_with_marker() {
        let fx = Fixture::new();
        // dataDir does not exist yet: creatable is enough, and nothing is created.
        assert_ok(invoke_net("STATUS", &fx.conf11(json!({}))));
        assert!(!fx.data_dir().exists());
        fs::create_dir_all(fx.data_dir()).unwrap();
        assert_ok(invoke_net("STATUS", &fx.conf11(json!({}))));
        fs::write(fx.data_dir().join(STATUS_FAIL_MARKER), "").unwrap();
        let (code, out) = invoke_net("STATUS", &fx.conf11(json!({})));
        let e = assert_error(code, &out, 50);
        assert_eq!(
            e["msg"],
            "gc-ipam: not available (status-fail marker present)"
        );
        // STATUS is informational: ADD still works.
        add_ip(&fx, "a", "eth0");
    }

    #[test]
    fn status_unwritable_and_version() {
        let fx = Fixture::new();
        // dataDir below a regular file can never be created, even by root.
        fs::write(fx.dir.path().join("file"), "").unwrap();
        let conf = json!({
            "cniVersion": "1.1.0",
            "name": "net1",
            "ipam": {"type": "gc-ipam", "dataDir": fx.dir.path().join("file/sub")},
        })
        .to_string();
        let (code, out) = invoke_net("STATUS", &conf);
        assert_error(code, &out, 50);
        let (code, out) = invoke_net("STATUS", &fx.conf("1.0.0", "10.88.0.0/24", json!({})));
        let e = assert_error(code, &out, 1);
        assert_eq!(e["msg"], "config version does not allow STATUS");
    }

    #[test]
    fn exhaustion_on_slash_30() {
        let fx = Fixture::new();
        let conf = fx.conf("1.0.0", "10.88.0.0/30", json!({}));
        let (code, out) = invoke_with("ADD", "a", "eth0", &conf);
        assert_eq!(code, 0, "{out}");
        assert_eq!(parse(&out)["ips"][0]["address"], "10.88.0.2/30");
        let (code, out) = invoke_with("ADD", "b", "eth0", &conf);
        let e = assert_error(code, &out, 999);
        assert_eq!(
            e["msg"],
            "no IP addresses available in range set: 10.88.0.1-10.88.0.2"
        );
    }

    #[test]
    fn ipv6_subnet() {
        let fx = Fixture::new();
        let conf = fx.conf("0.4.0", "fd00:88::/64", json!({}));
        let (code, out) = invoke_with("ADD", "a", "eth0", &conf);
        assert_eq!(code, 0, "{out}");
        assert_eq!(
            parse(&out),
            json!({
                "cniVersion": "0.4.0",
                "ips": [{"version": "6", "address": "fd00:88::2/64", "gateway": "fd00:88::1"}],
            })
        );
        assert_eq!(fx.read("fd00:88::2"), "a\r\neth0");
    }

    #[test]
    fn version_command() {
        let (code, out) = invoke_env(&[("CNI_COMMAND", "VERSION")], "garbage");
        assert_eq!(code, 0);
        assert_eq!(out.trim_end(), VERSION_OUTPUT);
        assert_eq!(parse(&out)["cniVersion"], "1.1.0");
    }

    #[test]
    fn env_errors() {
        let fx = Fixture::new();
        let conf = fx.conf11(json!({}));
        let (code, out) = invoke_env(&[], &conf);
        let e = assert_error(code, &out, 4);
        assert_eq!(e["msg"], "required env variables [CNI_COMMAND] missing");
        let (code, out) = invoke_env(&[("CNI_COMMAND", "BOGUS")], &conf);
        let e = assert_error(code, &out, 4);
        assert_eq!(e["msg"], "unknown CNI_COMMAND: BOGUS");
        for cmd in ["ADD", "DEL", "CHECK"] {
            let (code, out) = invoke_env(&[("CNI_COMMAND", cmd)], &conf);
            let e = assert_error(code, &out, 4);
            assert_eq!(
                e["msg"],
                "required env variables [CNI_CONTAINERID,CNI_IFNAME] missing"
            );
            let (code, out) = invoke_with(cmd, "a", "", &conf);
            let e = assert_error(code, &out, 4);
            assert_eq!(e["msg"], "required env variables [CNI_IFNAME] missing");
            let (code, out) = invoke_with(cmd, "bad/id", "eth0", &conf);
            assert_error(code, &out, 4);
            let (code, out) = invoke_with(cmd, "a", "eth0\r\nx", &conf);
            assert_error(code, &out, 4);
        }
        // GC and STATUS need no attachment variables at all.
        assert_ok(invoke_env(&[("CNI_COMMAND", "STATUS")], &conf));
        assert_ok(invoke_env(&[("CNI_COMMAND", "GC")], &conf));
    }

    #[test]
    fn config_errors() {
        let fx = Fixture::new();
        for bad in ["", "{", "not json", "null", "[]", "42"] {
            let (code, out) = invoke_with("ADD", "a", "eth0", bad);
            assert_error(code, &out, 6);
        }
        for v in ["0.2.0", "1.2.0", ""] {
            let (code, out) =
                invoke_with("ADD", "a", "eth0", &fx.conf(v, "10.88.0.0/24", json!({})));
            assert_error(code, &out, 1);
        }
        let (code, out) = invoke_with("ADD", "a", "eth0", r#"{"cniVersion":"1.1.0"}"#);
        assert_error(code, &out, 7);
        let (code, out) = invoke_with(
            "ADD",
            "a",
            "eth0",
            r#"{"cniVersion":"1.1.0","name":"../x"}"#,
        );
        assert_error(code, &out, 7);
        for subnet in ["garbage", "10.88.0.5/24", "10.88.0.0/31", "fd00::/127"] {
            let (code, out) = invoke_with(
                "ADD",
                "a",
                "eth0",
                &fx.conf11(json!({})).replace("10.88.0.0/24", subnet),
            );
            assert_error(code, &out, 7);
        }
    }

    #[test]
    fn hostile_inputs_never_panic() {
        let fx = Fixture::new();
        let data = fx.data_dir();
        let data = data.to_str().unwrap();
        // Every input that gets past decoding names a dataDir, so nothing lands in
        // the default /var/lib/cni/gc-ipam.
        let inputs = [
            r#"{"cniVersion":7,"name":"n"}"#,
            r#"{"cniVersion":"1.1.0","name":"n","ipam":5}"#,
            r#"{"cniVersion":"1.1.0","name":"n","ipam":{"ranges":5}}"#,
            r#"{"cniVersion":"1.1.0","name":"n","ipam":{"ranges":[5]}}"#,
            r#"{"cniVersion":"1.1.0","name":"n","ipam":{"ranges":[[5]]}}"#,
            r#"{"cniVersion":"1.1.0","name":"n","ipam":{"ranges":[[]],"dataDir":"DATA"}}"#,
            r#"{"cniVersion":"1.1.0","name":"n","ipam":{"ranges":[],"dataDir":"DATA"}}"#,
            r#"{"cniVersion":"1.1.0","name":"n","ipam":{"ranges":[[{"subnet":"::/0"}]],"dataDir":"DATA"}}"#,
            r#"{"cniVersion":"1.1.0","name":"n","ipam":{"dataDir":"DATA"},"cni.dev/attachments":[{}]}"#,
            r#"{"cniVersion":"1.1.0","name":"n","ipam":{"ranges":[[{"subnet":[1]}]]}}"#,
            r#"{"cniVersion":"1.1.0","name":"n","ipam":{"ranges":[[{"subnet":"0.0.0.0/0"}]],"dataDir":"/proc/nonexistent/x"}}"#,
            r#"{"cniVersion":"1.1.0","name":"n","ipam":{"dataDir":"/proc/nonexistent/x"},"cni.dev/valid-attachments":{}}"#,
            r#"{"cniVersion":"1.1.0","name":7}"#,
        ];
        for cmd in ["ADD", "DEL", "CHECK", "GC", "STATUS"] {
            for input in inputs {
                let input = input.replace("DATA", data);
                let (code, out) = invoke_with(cmd, "a", "eth0", &input);
                if code != 0 {
                    assert_eq!(code, 1);
                    assert!(parse(&out)["code"].is_u64(), "{out}");
                }
            }
        }
    }

    #[test]
    fn case_insensitive_keys() {
        let fx = Fixture::new();
        let conf = json!({
            "CNIVersion": "1.1.0",
            "Name": "net1",
            "IPAM": {
                "Ranges": [[{"Subnet": "10.88.0.0/24"}]],
                "DATADIR": fx.data_dir().to_str().unwrap(),
            },
        })
        .to_string();
        let (code, out) = invoke_with("ADD", "a", "eth0", &conf);
        assert_eq!(code, 0, "{out}");
        assert_eq!(fx.read("10.88.0.2"), "a\r\neth0");
    }
}
