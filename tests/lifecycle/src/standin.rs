//! The shared skeleton of the CNI test doubles (`azure-vnet-ipam` and `gc-ipam` in
//! `src/bin/`): the invocation wrapper and its error JSON, the environment and config
//! decoding helpers, the `flock(2)` helper, atomic file replacement, subnet arithmetic
//! and the pieces of result rendering that both share. Each double keeps its own
//! contract (commands, allocation, DEL and GC rules, state format) in its binary; what
//! is here is the CNI plumbing that must behave the same in both, so that a fix to it
//! lands in both.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use serde::Serialize;
use serde_json::{Map, Value};

pub const ERR_INCOMPATIBLE_VERSION: u32 = 1;
pub const ERR_INVALID_ENV: u32 = 4;
pub const ERR_IO: u32 = 5;
pub const ERR_DECODE: u32 = 6;
pub const ERR_INVALID_CONFIG: u32 = 7;
pub const ERR_TRY_AGAIN_LATER: u32 = 11;

/// How long a double waits for its store lock (azure-vnet-ipam gives up after 10 s on
/// Linux) before failing with code 11.
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(10);
const LOCK_POLL: Duration = Duration::from_millis(10);

// ---------------------------------------------------------------------------
// Errors and the invocation wrapper
// ---------------------------------------------------------------------------

/// CNI error object, shaped like Go's `types.Error` (no `cniVersion` key).
#[derive(Debug, Serialize)]
pub struct CniError {
    pub code: u32,
    pub msg: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub details: String,
}

impl CniError {
    pub fn new(code: u32, msg: impl Into<String>, details: impl Into<String>) -> Self {
        Self {
            code,
            msg: msg.into(),
            details: details.into(),
        }
    }
}

/// A double's handler for every `CNI_COMMAND` but `VERSION`: the command, the
/// environment and stdin in; the text to print on success (`None`: print nothing) or
/// the CNI error out. An unknown command is its to reject ([`unknown_command`]).
pub type Dispatch = fn(&str, &Env<'_>, &mut dyn Read) -> Result<Option<String>, CniError>;

/// The CNI environment as a double sees it: an empty value counts as absent, because
/// libcni sets every `CNI_*` var and uses `""` for the ones that do not apply.
pub struct Env<'a> {
    getenv: &'a dyn Fn(&str) -> Option<String>,
}

impl Env<'_> {
    /// The non-empty value of `key`, if any.
    pub fn get(&self, key: &str) -> Option<String> {
        (self.getenv)(key).filter(|v| !v.is_empty())
    }
}

/// Runs one CNI invocation and returns the process exit status.
///
/// `getenv` supplies the environment (`CNI_COMMAND`, `CNI_CONTAINERID`, ...); the
/// process environment is never read or changed here. An absent `CNI_COMMAND` → code
/// 4 `required env variables [CNI_COMMAND] missing`; `VERSION` prints
/// `version_output` without reading stdin; any other command goes to `dispatch`. The
/// result or error JSON goes to `stdout`, one line; an error exits 1.
pub fn run<G, R, W>(
    version_output: &str,
    dispatch: Dispatch,
    getenv: G,
    mut stdin: R,
    mut stdout: W,
) -> i32
where
    G: Fn(&str) -> Option<String>,
    R: Read,
    W: Write,
{
    let env = Env { getenv: &getenv };
    let outcome = match env.get("CNI_COMMAND").as_deref() {
        None => Err(missing_env(&["CNI_COMMAND"])),
        Some("VERSION") => Ok(Some(version_output.to_owned())),
        Some(command) => dispatch(command, &env, &mut stdin),
    };
    let (text, status) = match outcome {
        Ok(out) => (out, 0),
        Err(err) => {
            let text = serde_json::to_string(&err).unwrap_or_else(|_| {
                format!(
                    r#"{{"code":{},"msg":"error serialisation failed"}}"#,
                    err.code
                )
            });
            (Some(text), 1)
        }
    };
    if let Some(text) = text
        && writeln!(stdout, "{text}").is_err()
    {
        return 1;
    }
    if stdout.flush().is_err() {
        return 1;
    }
    status
}

/// A double's `main`: [`run`] on the process environment, stdin and stdout, then exit
/// with its status.
pub fn main(version_output: &str, dispatch: Dispatch) -> ! {
    let status = run(
        version_output,
        dispatch,
        |key: &str| std::env::var(key).ok(),
        io::stdin().lock(),
        io::stdout().lock(),
    );
    std::process::exit(status)
}

/// Code 4 `required env variables [A,B] missing`.
pub fn missing_env(names: &[&str]) -> CniError {
    CniError::new(
        ERR_INVALID_ENV,
        format!("required env variables [{}] missing", names.join(",")),
        "",
    )
}

/// Code 4 `unknown CNI_COMMAND: X`.
pub fn unknown_command(command: &str) -> CniError {
    CniError::new(
        ERR_INVALID_ENV,
        format!("unknown CNI_COMMAND: {command}"),
        "",
    )
}

/// libcni's container-ID (and network-name) rule: `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`.
pub fn valid_identifier(id: &str) -> bool {
    let mut chars = id.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// `CNI_CONTAINERID` checked against [`valid_identifier`]; a mismatch → code 4
/// `invalid characters in containerID`.
pub fn check_container_id(id: &str) -> Result<(), CniError> {
    if valid_identifier(id) {
        return Ok(());
    }
    Err(CniError::new(
        ERR_INVALID_ENV,
        "invalid characters in containerID",
        id,
    ))
}

/// All of stdin; a read failure → code 5.
pub fn read_stdin(stdin: &mut dyn Read) -> Result<Vec<u8>, CniError> {
    let mut raw = Vec::new();
    stdin
        .read_to_end(&mut raw)
        .map_err(|e| CniError::new(ERR_IO, "error reading from stdin", e.to_string()))?;
    Ok(raw)
}

// ---------------------------------------------------------------------------
// Config decoding (Go `encoding/json` semantics)
// ---------------------------------------------------------------------------

/// Code 6 `failed to decode network configuration`.
pub fn decode_err(details: impl Into<String>) -> CniError {
    CniError::new(
        ERR_DECODE,
        "failed to decode network configuration",
        details,
    )
}

/// Stdin parsed as a JSON object; anything else → code 6.
pub fn parse_object(raw: &[u8]) -> Result<Map<String, Value>, CniError> {
    let value: Value = serde_json::from_slice(raw).map_err(|e| decode_err(e.to_string()))?;
    let Value::Object(top) = value else {
        return Err(decode_err("stdin must be a JSON object"));
    };
    Ok(top)
}

/// Looks up `key`, preferring an exact match and falling back to a
/// case-insensitive one (Go `encoding/json` semantics).
pub fn field<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.get(key).or_else(|| {
        obj.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v)
    })
}

/// A string field; `null`, absent and `""` all read as `None`. Another type → code 6.
pub fn string_field(
    obj: &Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<Option<String>, CniError> {
    match field(obj, key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(decode_err(format!("{path} must be a string, got {other}"))),
    }
}

/// An object field; `null` and absent read as `None`. Another type → code 6.
pub fn object_field<'a>(
    obj: &'a Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<Option<&'a Map<String, Value>>, CniError> {
    match field(obj, key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(m)) => Ok(Some(m)),
        Some(other) => Err(decode_err(format!("{path} must be an object, got {other}"))),
    }
}

/// An array field; `null` and absent read as `None`. Another type → code 6.
pub fn array_field<'a>(
    obj: &'a Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<Option<&'a Vec<Value>>, CniError> {
    match field(obj, key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(a)) => Ok(Some(a)),
        Some(other) => Err(decode_err(format!("{path} must be an array, got {other}"))),
    }
}

// ---------------------------------------------------------------------------
// Versions
// ---------------------------------------------------------------------------

/// Code 1 `incompatible CNI versions`.
pub fn incompatible_version(details: impl Into<String>) -> CniError {
    CniError::new(
        ERR_INCOMPATIBLE_VERSION,
        "incompatible CNI versions",
        details,
    )
}

/// Code 1 for a config `cniVersion` the double does not support.
pub fn unsupported_version(version: &str, supported: &[&str]) -> CniError {
    incompatible_version(format!(
        "config is {version:?}, plugin supports {supported:?}"
    ))
}

/// `Ok` if `cni_version` is one of `ok`; otherwise code 1
/// `config version does not allow <op>`.
pub fn require_version(
    cni_version: &str,
    op: &str,
    ok: &[&str],
    needs: &str,
) -> Result<(), CniError> {
    if ok.contains(&cni_version) {
        return Ok(());
    }
    Err(CniError::new(
        ERR_INCOMPATIBLE_VERSION,
        format!("config version does not allow {op}"),
        format!("config is {cni_version:?}; {op} needs {needs}"),
    ))
}

// ---------------------------------------------------------------------------
// Subnet arithmetic (addresses as u128 so IPv4 and IPv6 share one code path)
// ---------------------------------------------------------------------------

/// A subnet as both doubles allocate from it: the gateway is network+1 and never
/// allocated; the allocatable range runs from network+2 to the last address, which
/// for IPv4 is the one below broadcast.
#[derive(Debug, Clone, Copy)]
pub struct Pool {
    /// Canonical network (host bits cleared).
    pub net: IpNet,
    pub gateway: IpAddr,
    /// Inclusive range of allocatable addresses.
    pub first: u128,
    pub last: u128,
}

impl Pool {
    /// The pool of `net` (its host bits are cleared); `None` if it is too small to
    /// hold a network address, a gateway and one allocatable address (IPv4 /31 and
    /// /32, IPv6 /127 and /128).
    pub fn new(net: IpNet) -> Option<Self> {
        let net = net.trunc();
        let v6 = net.addr().is_ipv6();
        let width: u8 = if v6 { 128 } else { 32 };
        let host_bits = width.saturating_sub(net.prefix_len());
        if host_bits < 2 {
            return None;
        }
        let base = ip_to_u128(net.network());
        let host_mask = if host_bits >= 128 {
            u128::MAX
        } else {
            (1u128 << host_bits) - 1
        };
        let top = base | host_mask;
        // IPv4 loses its broadcast address; IPv6 has none.
        let last = if v6 { top } else { top - 1 };
        Some(Self {
            net,
            gateway: u128_to_ip(v6, base + 1),
            first: base + 2,
            last,
        })
    }

    pub fn is_ipv6(&self) -> bool {
        self.net.addr().is_ipv6()
    }

    /// True if `ip` is in the allocatable range (not network, gateway or broadcast).
    pub fn is_assignable(&self, ip: IpAddr) -> bool {
        ip.is_ipv6() == self.is_ipv6() && (self.first..=self.last).contains(&ip_to_u128(ip))
    }

    /// How many addresses are allocatable.
    pub fn capacity(&self) -> u128 {
        (self.last - self.first).saturating_add(1)
    }

    /// The allocatable addresses, lowest first.
    pub fn addresses(&self) -> impl Iterator<Item = IpAddr> + use<> {
        let v6 = self.is_ipv6();
        (self.first..=self.last).map(move |n| u128_to_ip(v6, n))
    }

    /// The highest allocatable address.
    pub fn last_address(&self) -> IpAddr {
        u128_to_ip(self.is_ipv6(), self.last)
    }
}

fn ip_to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

fn u128_to_ip(v6: bool, n: u128) -> IpAddr {
    if v6 {
        IpAddr::V6(Ipv6Addr::from(n))
    } else {
        IpAddr::V4(Ipv4Addr::from((n & u128::from(u32::MAX)) as u32))
    }
}

// ---------------------------------------------------------------------------
// Results
// ---------------------------------------------------------------------------

/// One entry of a result's `ips` (0.3.0 and later).
#[derive(Debug, Serialize)]
pub struct IpConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<&'static str>,
    pub address: String,
    pub gateway: String,
}

impl IpConfig {
    /// `ip` as `<ip>/<pool prefix>` with the pool's gateway. For 0.3.0/0.3.1/0.4.0
    /// it carries `"version":"4"|"6"`; for 1.0.0 and later it does not.
    pub fn new(cni_version: &str, pool: &Pool, ip: IpAddr) -> Self {
        let version = match cni_version {
            "0.3.0" | "0.3.1" | "0.4.0" => Some(if pool.is_ipv6() { "6" } else { "4" }),
            _ => None,
        };
        Self {
            version,
            address: format!("{ip}/{}", pool.net.prefix_len()),
            gateway: pool.gateway.to_string(),
        }
    }
}

/// `result` as JSON; a failure → `code` `failed to encode result`.
pub fn encode_result(result: &impl Serialize, code: u32) -> Result<String, CniError> {
    serde_json::to_string(result)
        .map_err(|e| CniError::new(code, "failed to encode result", e.to_string()))
}

// ---------------------------------------------------------------------------
// Files: flock and atomic replace
// ---------------------------------------------------------------------------

/// Which step of [`FileLock::acquire`] failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockStep {
    /// Opening (or creating) the lock file.
    Open,
    /// `flock(2)` itself, for a reason other than contention.
    Lock,
}

/// Holds an exclusive `flock(2)` until dropped (closing the fd releases it).
#[derive(Debug)]
pub struct FileLock {
    _file: File,
}

impl FileLock {
    /// Opens the lock file at `path` (created with `mode` if missing, never
    /// truncated) and takes an exclusive flock on it, retrying for up to
    /// [`LOCK_TIMEOUT`]. Giving up → code 11 `timed out waiting for the <what> lock`.
    /// Any other failure → `io_err(step, err)`.
    pub fn acquire(
        path: &Path,
        mode: u32,
        what: &str,
        io_err: impl Fn(LockStep, io::Error) -> CniError,
    ) -> Result<Self, CniError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(mode)
            .open(path)
            .map_err(|e| io_err(LockStep::Open, e))?;
        let deadline = Instant::now() + LOCK_TIMEOUT;
        loop {
            // SAFETY: `file` is an open `File` owned by this frame, so its descriptor
            // stays valid for the whole call; flock(2) takes no pointers and only
            // touches the lock attached to that open file description.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if rc == 0 {
                return Ok(Self { _file: file });
            }
            let err = io::Error::last_os_error();
            let retry = matches!(err.raw_os_error(),
                Some(e) if e == libc::EWOULDBLOCK || e == libc::EAGAIN || e == libc::EINTR);
            if !retry {
                return Err(io_err(LockStep::Lock, err));
            }
            if Instant::now() >= deadline {
                return Err(CniError::new(
                    ERR_TRY_AGAIN_LATER,
                    format!("timed out waiting for the {what} lock"),
                    format!("{} held for more than {LOCK_TIMEOUT:?}", path.display()),
                ));
            }
            thread::sleep(LOCK_POLL);
        }
    }
}

/// Replaces `path` with `data` atomically: a temp file named `<tmp_prefix>XXXXXX.tmp` in
/// the same directory, fsync, rename, then a best-effort fsync of the directory. A
/// failure → `io_err(step, err)`, where `step` is `"create temp file for"`, `"write"`
/// or `"replace"`.
pub fn write_atomic(
    path: &Path,
    tmp_prefix: &str,
    data: &[u8],
    io_err: impl Fn(&'static str, io::Error) -> CniError,
) -> Result<(), CniError> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(tmp_prefix)
        .suffix(".tmp")
        .tempfile_in(dir)
        .map_err(|e| io_err("create temp file for", e))?;
    tmp.write_all(data)
        .and_then(|()| tmp.as_file().sync_all())
        .map_err(|e| io_err("write", e))?;
    tmp.persist(path).map_err(|e| io_err("replace", e.error))?;
    // Best effort: make the rename itself durable.
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}
