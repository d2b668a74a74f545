//! `azure-vnet-ipam` stand-in: a CNI IPAM plugin for the lifecycle tests.
//!
//! **This is a test double; it follows azure-vnet-ipam's documented contract**
//! (`reference/cni-spec.md` §8, plus the CNI protocol rules of §2–§4). The real
//! plugin learns its address pool from Azure's wireserver/IMDS (or
//! `/etc/kubernetes/interfaces.json`), so it cannot run here. This binary takes the
//! pool from its config instead and otherwise behaves like the real plugin at the
//! CNI boundary. Only the points below are promised.
//!
//! # Environment
//! - Env vars come in through the `getenv` closure given to [`run`]; `main` passes
//!   `std::env::var`. The process environment is never changed. An empty value
//!   counts as absent, because libcni sets every `CNI_*` var and uses `""` for the
//!   ones that do not apply.
//! - `CNI_COMMAND`: `ADD`, `DEL`, `CHECK` or `VERSION`. Any other value, `GC` and
//!   `STATUS` included, → code 4 `unknown CNI_COMMAND: X`. An absent value → code 4
//!   `required env variables [CNI_COMMAND] missing`.
//! - `CNI_CONTAINERID`: required for `ADD`/`DEL` (code 4
//!   `required env variables [CNI_CONTAINERID] missing`). When present it must match
//!   `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$` (code 4 `invalid characters in containerID`).
//! - `CNI_NETNS`, `CNI_IFNAME`, `CNI_ARGS` and `CNI_PATH` are accepted and ignored.
//!   The real plugin keys allocations by container ID only and execs nothing, so
//!   **two allocations need two distinct container IDs**.
//!
//! # Versions
//! - `VERSION` ignores stdin and prints
//!   `{"cniVersion":"1.0.0","supportedVersions":["0.1.0","0.2.0","0.3.0","0.3.1","0.4.0","1.0.0"]}`.
//!   That is ACN ≥ v1.6.1; there is never a 1.1.0.
//! - A config `cniVersion` outside that list (e.g. `"1.1.0"`) → code 1
//!   `incompatible CNI versions`, with details naming the version.
//! - *Deviation:* a config with no `cniVersion` (or an empty one) → code 1 as well.
//!   The real plugin would assume `"0.2.0"`.
//! - `CHECK` with a config version below 0.4.0 → code 1
//!   `config version does not allow CHECK` (libcni skel's rule).
//!
//! # Config (stdin)
//! `{"cniVersion": ..., "name": ..., "ipam": {"type", "environment"?, "subnet"?,
//! "ipAddress"?, "stateFile"?, "pool"?}}`. Keys match case-insensitively, with an
//! exact match preferred, as with Go's `encoding/json`. Unknown keys are ignored, and
//! an empty string counts as absent. `type` and `environment` are not read.
//! - `pool` (stand-in only; it replaces the wireserver/interfaces.json source) is the
//!   address pool CIDR. Default `10.240.0.0/24`. IPv4 pools need prefix ≤ /30, IPv6
//!   pools ≤ /126, or else code 7.
//! - `stateFile` (stand-in only) is the JSON state file. Default
//!   `/run/azure-vnet-ipam-standin.json`.
//! - `subnet` is the pool id. `DEL` requires it (see below).
//! - `ipAddress` asks `ADD` for one specific address.
//!
//! Input that is not a JSON object, or a known key of the wrong JSON type → code 6.
//! Reading stdin fails → code 5.
//!
//! # ADD
//! - Allocations are keyed by `CNI_CONTAINERID` only. A repeated `ADD` with the same
//!   container ID returns the address it already holds (idempotent, never an error).
//! - With `ipam.ipAddress` set (plain IP; a CIDR's prefix is dropped), the plugin
//!   allocates exactly that address if it is free or already held by this container.
//!   Otherwise → code 100 `requested address X is not available`. The same error
//!   covers an address that is outside the pool, reserved, held by another
//!   container, or unparseable. It also covers a container that already holds a
//!   *different* address.
//! - Without it, the plugin allocates the lowest free host address in the pool. It
//!   skips the network address, the gateway (first host, `.1`) and, for IPv4, the
//!   broadcast address.
//! - Pool exhausted → code 100 `no addresses available in pool <cidr>`.
//! - A container that already holds an address outside the configured pool → code 100.
//! - The result is in the config's `cniVersion`. It has one IP,
//!   `address` = `<ip>/<pool prefix>` and `gateway` = first host of the pool, plus
//!   `routes: [{"dst":"0.0.0.0/0" (or "::/0"),"gw":<gateway>}]` and
//!   `dns: {"nameservers":["168.63.129.16"]}`. There is no `interfaces`. For
//!   0.3.0/0.3.1/0.4.0 each IP carries `"version":"4"|"6"`; for 1.0.0 it does not.
//!   For 0.1.0/0.2.0 the result uses the legacy `ip4`/`ip6` shape.
//!
//! # DEL
//! - `DEL` requires `ipam.subnet`, equal to the pool's canonical CIDR (e.g.
//!   `10.78.0.0/24`, not `10.78.0.5/24`). The caller must remember the subnet from
//!   the ADD result and inject it, as Azure's own CNI does. Missing or different →
//!   code 100 `failed to release address: pool id not found`. The state is left
//!   untouched.
//! - The container's address is released, keyed by container ID. If `ipam.ipAddress`
//!   is also given and names a different address, it is ignored. A container that
//!   holds no address → success. `DEL` prints nothing on success.
//!
//! # CHECK
//! A no-op success with no output; the real plugin maps `CHECK` to a no-op `Get`.
//!
//! # Errors
//! `{"code":N,"msg":"...","details":"..."}` on stdout, with `details` left out when
//! empty and no `cniVersion` key, like Go's `types.Error`. Exit status 1. Lock
//! timeout (10 s) → code 11. State-file I/O or corruption → code 100. The plugin
//! never panics on any input.
//!
//! # State
//! The state is guarded by an exclusive `flock(2)` on `<stateFile>.lock`, held for
//! the whole read-modify-write. It is written atomically: temp file in the same
//! directory, fsync, rename, then a best-effort fsync of the directory. Missing
//! parent directories are created.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

const SUPPORTED_VERSIONS: [&str; 6] = ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0"];
const VERSION_OUTPUT: &str = r#"{"cniVersion":"1.0.0","supportedVersions":["0.1.0","0.2.0","0.3.0","0.3.1","0.4.0","1.0.0"]}"#;
const DEFAULT_POOL: &str = "10.240.0.0/24";
const DEFAULT_STATE_FILE: &str = "/run/azure-vnet-ipam-standin.json";
/// Azure's virtual public IP for DNS (what the real pool reports as its DNS server).
const AZURE_DNS: &str = "168.63.129.16";
/// The real plugin gives up on its store lock after 10 s on Linux.
const LOCK_TIMEOUT: Duration = Duration::from_secs(10);
const LOCK_POLL: Duration = Duration::from_millis(10);

const ERR_INCOMPATIBLE_VERSION: u32 = 1;
const ERR_INVALID_ENV: u32 = 4;
const ERR_IO: u32 = 5;
const ERR_DECODE: u32 = 6;
const ERR_INVALID_CONFIG: u32 = 7;
const ERR_TRY_AGAIN_LATER: u32 = 11;
/// azure-vnet-ipam reports its own failures as `ErrRuntime` (100).
const ERR_RUNTIME: u32 = 100;

/// CNI error object, shaped like Go's `types.Error` (no `cniVersion` key).
#[derive(Debug, Serialize)]
struct CniError {
    code: u32,
    msg: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    details: String,
}

impl CniError {
    fn new(code: u32, msg: impl Into<String>, details: impl Into<String>) -> Self {
        Self {
            code,
            msg: msg.into(),
            details: details.into(),
        }
    }
}

// STATE FORMAT
// The state file is one JSON object:
//     {"allocations": {"<containerID>": "<ip>", ...}}
// `<ip>` is a bare address with no prefix length, e.g. "10.78.0.2" or "fd00::2". Each
// container ID holds at most one address; that is the azure-vnet-ipam keying (ifname
// plays no part). A missing or empty file means no allocations. Unknown top-level
// keys are ignored on read and dropped on the next write. The file is rewritten
// pretty-printed with keys sorted, by temp file + fsync + rename, under an exclusive
// flock on "<stateFile>.lock".
#[derive(Debug, Default, Serialize, Deserialize)]
struct State {
    #[serde(default)]
    allocations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Command {
    Add,
    Del,
    Check,
}

/// The parts of the stdin config this plugin uses.
#[derive(Debug)]
struct Config {
    cni_version: String,
    subnet: Option<String>,
    ip_address: Option<String>,
    state_file: PathBuf,
    pool: String,
}

/// Runs one CNI invocation and returns the process exit status.
///
/// `getenv` supplies the environment (`CNI_COMMAND`, `CNI_CONTAINERID`, ...).
/// The result or error JSON goes to `stdout`.
pub fn run<G, R, W>(getenv: G, mut stdin: R, mut stdout: W) -> i32
where
    G: Fn(&str) -> Option<String>,
    R: Read,
    W: Write,
{
    let (text, status) = match dispatch(&getenv, &mut stdin) {
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

fn main() {
    let status = run(
        |key: &str| std::env::var(key).ok(),
        io::stdin().lock(),
        io::stdout().lock(),
    );
    std::process::exit(status);
}

fn dispatch(
    getenv: &dyn Fn(&str) -> Option<String>,
    stdin: &mut dyn Read,
) -> Result<Option<String>, CniError> {
    let env = |key: &str| getenv(key).filter(|v| !v.is_empty());

    let command = match env("CNI_COMMAND").as_deref() {
        None => return Err(missing_env("CNI_COMMAND")),
        Some("VERSION") => return Ok(Some(VERSION_OUTPUT.to_owned())),
        Some("ADD") => Command::Add,
        Some("DEL") => Command::Del,
        Some("CHECK") => Command::Check,
        Some(other) => {
            return Err(CniError::new(
                ERR_INVALID_ENV,
                format!("unknown CNI_COMMAND: {other}"),
                "",
            ));
        }
    };

    let container_id = env("CNI_CONTAINERID");
    if let Some(id) = &container_id
        && !valid_container_id(id)
    {
        return Err(CniError::new(
            ERR_INVALID_ENV,
            "invalid characters in containerID",
            id.clone(),
        ));
    }
    // CNI_NETNS, CNI_IFNAME, CNI_ARGS, CNI_PATH: ignored (see the module docs).

    let mut raw = Vec::new();
    stdin
        .read_to_end(&mut raw)
        .map_err(|e| CniError::new(ERR_IO, "error reading from stdin", e.to_string()))?;
    let conf = parse_config(&raw)?;

    match command {
        Command::Check => {
            if matches!(
                conf.cni_version.as_str(),
                "0.1.0" | "0.2.0" | "0.3.0" | "0.3.1"
            ) {
                return Err(CniError::new(
                    ERR_INCOMPATIBLE_VERSION,
                    "config version does not allow CHECK",
                    format!(
                        "config is {:?}; CHECK needs 0.4.0 or later",
                        conf.cni_version
                    ),
                ));
            }
            Ok(None)
        }
        Command::Add => {
            let id = container_id.ok_or_else(|| missing_env("CNI_CONTAINERID"))?;
            cmd_add(&conf, &id).map(Some)
        }
        Command::Del => {
            let id = container_id.ok_or_else(|| missing_env("CNI_CONTAINERID"))?;
            cmd_del(&conf, &id).map(|()| None)
        }
    }
}

fn missing_env(name: &str) -> CniError {
    CniError::new(
        ERR_INVALID_ENV,
        format!("required env variables [{name}] missing"),
        "",
    )
}

/// libcni's rule: `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`.
fn valid_container_id(id: &str) -> bool {
    let mut chars = id.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

// ---------------------------------------------------------------------------
// Config
// ---------------------------------------------------------------------------

/// Looks up `key`, preferring an exact match and falling back to a
/// case-insensitive one (Go `encoding/json` semantics).
fn field<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.get(key).or_else(|| {
        obj.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v)
    })
}

/// A string field; `null`, absent and `""` all read as `None`.
fn string_field(
    obj: &Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<Option<String>, CniError> {
    match field(obj, key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(CniError::new(
            ERR_DECODE,
            "failed to decode network configuration",
            format!("{path} must be a string, got {other}"),
        )),
    }
}

fn parse_config(raw: &[u8]) -> Result<Config, CniError> {
    let value: Value = serde_json::from_slice(raw).map_err(|e| {
        CniError::new(
            ERR_DECODE,
            "failed to decode network configuration",
            e.to_string(),
        )
    })?;
    let Value::Object(top) = value else {
        return Err(CniError::new(
            ERR_DECODE,
            "failed to decode network configuration",
            "stdin must be a JSON object",
        ));
    };

    let cni_version = match string_field(&top, "cniVersion", "cniVersion")? {
        None => {
            return Err(CniError::new(
                ERR_INCOMPATIBLE_VERSION,
                "incompatible CNI versions",
                "config has no cniVersion; this stand-in requires one (the real \
                 azure-vnet-ipam would assume \"0.2.0\")",
            ));
        }
        Some(v) if !SUPPORTED_VERSIONS.contains(&v.as_str()) => {
            return Err(CniError::new(
                ERR_INCOMPATIBLE_VERSION,
                "incompatible CNI versions",
                format!("config is {v:?}, plugin supports {SUPPORTED_VERSIONS:?}"),
            ));
        }
        Some(v) => v,
    };

    let empty = Map::new();
    let ipam = match field(&top, "ipam") {
        None | Some(Value::Null) => &empty,
        Some(Value::Object(m)) => m,
        Some(other) => {
            return Err(CniError::new(
                ERR_DECODE,
                "failed to decode network configuration",
                format!("ipam must be an object, got {other}"),
            ));
        }
    };
    // Checked for type only, like a Go struct decode; their values are not used.
    string_field(ipam, "type", "ipam.type")?;
    string_field(ipam, "environment", "ipam.environment")?;

    Ok(Config {
        cni_version,
        subnet: string_field(ipam, "subnet", "ipam.subnet")?,
        ip_address: string_field(ipam, "ipAddress", "ipam.ipAddress")?,
        state_file: PathBuf::from(
            string_field(ipam, "stateFile", "ipam.stateFile")?
                .unwrap_or_else(|| DEFAULT_STATE_FILE.to_owned()),
        ),
        pool: string_field(ipam, "pool", "ipam.pool")?.unwrap_or_else(|| DEFAULT_POOL.to_owned()),
    })
}

// ---------------------------------------------------------------------------
// Pool arithmetic (addresses as u128 so IPv4 and IPv6 share one code path)
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
struct Pool {
    /// Canonical network (host bits cleared).
    net: IpNet,
    gateway: IpAddr,
    /// Inclusive range of assignable addresses.
    first: u128,
    last: u128,
}

impl Pool {
    fn parse(text: &str) -> Result<Self, CniError> {
        let net: IpNet = text.parse().map_err(|e| {
            CniError::new(
                ERR_INVALID_CONFIG,
                "invalid ipam.pool",
                format!("{text:?} is not a CIDR: {e}"),
            )
        })?;
        let net = net.trunc();
        let width: u8 = if net.addr().is_ipv4() { 32 } else { 128 };
        let host_bits = width.saturating_sub(net.prefix_len());
        if host_bits < 2 {
            return Err(CniError::new(
                ERR_INVALID_CONFIG,
                "invalid ipam.pool",
                format!(
                    "pool {net} is too small: it needs a network address, a gateway and at \
                     least one assignable address (IPv4 ≤ /30, IPv6 ≤ /126)"
                ),
            ));
        }
        let base = ip_to_u128(net.network());
        let host_mask = if host_bits >= 128 {
            u128::MAX
        } else {
            (1u128 << host_bits) - 1
        };
        let top = base | host_mask;
        let gateway = base + 1;
        // IPv4 loses its broadcast address; IPv6 has none.
        let last = if net.addr().is_ipv4() { top - 1 } else { top };
        Ok(Self {
            net,
            gateway: u128_to_ip(net.addr().is_ipv6(), gateway),
            first: base + 2,
            last,
        })
    }

    fn is_ipv6(&self) -> bool {
        self.net.addr().is_ipv6()
    }

    /// True if `ip` is in the pool and is neither network, gateway nor broadcast.
    fn is_assignable(&self, ip: IpAddr) -> bool {
        ip.is_ipv6() == self.is_ipv6() && (self.first..=self.last).contains(&ip_to_u128(ip))
    }

    fn capacity(&self) -> u128 {
        (self.last - self.first).saturating_add(1)
    }

    fn lowest_free(&self, taken: &HashMap<IpAddr, &str>) -> Option<IpAddr> {
        (self.first..=self.last)
            .map(|n| u128_to_ip(self.is_ipv6(), n))
            .find(|ip| !taken.contains_key(ip))
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
// ADD / DEL
// ---------------------------------------------------------------------------

fn not_available(requested: &str, why: impl Into<String>) -> CniError {
    CniError::new(
        ERR_RUNTIME,
        format!("requested address {requested} is not available"),
        why,
    )
}

fn cmd_add(conf: &Config, id: &str) -> Result<String, CniError> {
    let pool = Pool::parse(&conf.pool)?;
    let requested = match &conf.ip_address {
        None => None,
        Some(text) => {
            // Accept "10.78.0.5" and, leniently, "10.78.0.5/24".
            let ip = text
                .parse::<IpAddr>()
                .ok()
                .or_else(|| text.parse::<IpNet>().ok().map(|n| n.addr()))
                .ok_or_else(|| not_available(text, "ipam.ipAddress is not a valid IP address"))?;
            Some(ip)
        }
    };
    let ip = with_state(&conf.state_file, |state| {
        allocate(state, &pool, id, requested)
    })?;
    render_result(&conf.cni_version, &pool, ip)
}

/// Allocation under the lock. Returns the address and whether the state changed.
fn allocate(
    state: &mut State,
    pool: &Pool,
    id: &str,
    requested: Option<IpAddr>,
) -> Result<(IpAddr, bool), CniError> {
    if let Some(held) = state.allocations.get(id) {
        let held_ip: IpAddr = held.parse().map_err(|_| {
            CniError::new(
                ERR_RUNTIME,
                "corrupt state file",
                format!("container {id} maps to {held:?}, which is not an IP address"),
            )
        })?;
        if !pool.is_assignable(held_ip) {
            return Err(CniError::new(
                ERR_RUNTIME,
                format!(
                    "container {id} already holds address {held_ip} outside pool {}",
                    pool.net
                ),
                "allocations are keyed by container ID; release it with DEL (using its own \
                 pool as ipam.subnet) first",
            ));
        }
        if let Some(req) = requested
            && req != held_ip
        {
            return Err(not_available(
                &req.to_string(),
                format!(
                    "container {id} already holds {held_ip}; allocations are keyed by container \
                     ID, one address each"
                ),
            ));
        }
        return Ok((held_ip, false));
    }

    let taken: HashMap<IpAddr, &str> = state
        .allocations
        .iter()
        .filter_map(|(owner, ip)| ip.parse().ok().map(|ip| (ip, owner.as_str())))
        .collect();

    let ip = match requested {
        Some(req) => {
            if !pool.is_assignable(req) {
                return Err(not_available(
                    &req.to_string(),
                    format!(
                        "it is not an assignable address of pool {} (network, gateway {} and \
                         broadcast are reserved)",
                        pool.net, pool.gateway
                    ),
                ));
            }
            if let Some(owner) = taken.get(&req) {
                return Err(not_available(
                    &req.to_string(),
                    format!("it is held by container {owner}"),
                ));
            }
            req
        }
        None => pool.lowest_free(&taken).ok_or_else(|| {
            CniError::new(
                ERR_RUNTIME,
                format!("no addresses available in pool {}", pool.net),
                format!(
                    "all {} assignable addresses are allocated; release one with DEL",
                    pool.capacity()
                ),
            )
        })?,
    };
    state.allocations.insert(id.to_owned(), ip.to_string());
    Ok((ip, true))
}

fn cmd_del(conf: &Config, id: &str) -> Result<(), CniError> {
    let pool = Pool::parse(&conf.pool)?;
    let pool_not_found = |details: String| {
        CniError::new(
            ERR_RUNTIME,
            "failed to release address: pool id not found",
            details,
        )
    };
    let Some(subnet) = &conf.subnet else {
        return Err(pool_not_found(format!(
            "DEL needs ipam.subnet set to the pool id (the subnet CIDR, here {}): the caller must \
             remember the subnet from the ADD result and inject it into the DEL config, as \
             Azure's own CNI does",
            pool.net
        )));
    };
    if subnet.parse::<IpNet>().ok() != Some(pool.net) {
        return Err(pool_not_found(format!(
            "ipam.subnet {subnet:?} does not name this plugin's pool {} (the pool id is the \
             canonical subnet CIDR)",
            pool.net
        )));
    }
    // ipam.ipAddress, if given, is ignored: the release is keyed by container ID.
    with_state(&conf.state_file, |state| {
        let removed = state.allocations.remove(id).is_some();
        Ok(((), removed))
    })
}

// ---------------------------------------------------------------------------
// Results
// ---------------------------------------------------------------------------

#[derive(Serialize)]
struct Route {
    dst: String,
    gw: String,
}

#[derive(Serialize)]
struct Dns {
    nameservers: Vec<String>,
}

#[derive(Serialize)]
struct IpConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    version: Option<&'static str>,
    address: String,
    gateway: String,
}

/// 0.3.x / 0.4.0 / 1.0.0 result (IPAM-abbreviated: no `interfaces`).
#[derive(Serialize)]
struct CurrentResult {
    #[serde(rename = "cniVersion")]
    cni_version: String,
    ips: Vec<IpConfig>,
    routes: Vec<Route>,
    dns: Dns,
}

#[derive(Serialize)]
struct LegacyIpConfig {
    ip: String,
    gateway: String,
    routes: Vec<Route>,
}

/// 0.1.0 / 0.2.0 result.
#[derive(Serialize)]
struct LegacyResult {
    #[serde(rename = "cniVersion")]
    cni_version: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    ip4: Option<LegacyIpConfig>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ip6: Option<LegacyIpConfig>,
    dns: Dns,
}

fn render_result(cni_version: &str, pool: &Pool, ip: IpAddr) -> Result<String, CniError> {
    let v6 = pool.is_ipv6();
    let address = format!("{ip}/{}", pool.net.prefix_len());
    let gateway = pool.gateway.to_string();
    let route = Route {
        dst: if v6 { "::/0" } else { "0.0.0.0/0" }.to_owned(),
        gw: gateway.clone(),
    };
    let dns = Dns {
        nameservers: vec![AZURE_DNS.to_owned()],
    };
    let json = match cni_version {
        "0.1.0" | "0.2.0" => {
            let cfg = LegacyIpConfig {
                ip: address,
                gateway,
                routes: vec![route],
            };
            let (ip4, ip6) = if v6 {
                (None, Some(cfg))
            } else {
                (Some(cfg), None)
            };
            serde_json::to_string(&LegacyResult {
                cni_version: cni_version.to_owned(),
                ip4,
                ip6,
                dns,
            })
        }
        _ => {
            let version = match cni_version {
                "0.3.0" | "0.3.1" | "0.4.0" => Some(if v6 { "6" } else { "4" }),
                _ => None,
            };
            serde_json::to_string(&CurrentResult {
                cni_version: cni_version.to_owned(),
                ips: vec![IpConfig {
                    version,
                    address,
                    gateway,
                }],
                routes: vec![route],
                dns,
            })
        }
    };
    json.map_err(|e| CniError::new(ERR_RUNTIME, "failed to encode result", e.to_string()))
}

// ---------------------------------------------------------------------------
// State file: flock + atomic replace
// ---------------------------------------------------------------------------

fn state_err(what: &str, path: &Path, err: impl std::fmt::Display) -> CniError {
    CniError::new(
        ERR_RUNTIME,
        format!("failed to {what} state file"),
        format!("{}: {err}", path.display()),
    )
}

/// Holds the exclusive flock until dropped (closing the fd releases it).
struct StateLock {
    _file: File,
}

impl StateLock {
    fn acquire(state_path: &Path) -> Result<Self, CniError> {
        let mut lock_path = state_path.as_os_str().to_owned();
        lock_path.push(".lock");
        let lock_path = PathBuf::from(lock_path);
        if let Some(parent) = state_path.parent().filter(|p| !p.as_os_str().is_empty()) {
            fs::create_dir_all(parent).map_err(|e| state_err("create directory for", parent, e))?;
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
            .map_err(|e| state_err("open lock for", &lock_path, e))?;
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
                return Err(state_err("lock", &lock_path, err));
            }
            if Instant::now() >= deadline {
                return Err(CniError::new(
                    ERR_TRY_AGAIN_LATER,
                    "timed out waiting for the state file lock",
                    format!(
                        "{} held for more than {LOCK_TIMEOUT:?}",
                        lock_path.display()
                    ),
                ));
            }
            thread::sleep(LOCK_POLL);
        }
    }
}

fn read_state(path: &Path) -> Result<State, CniError> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(State::default()),
        Err(e) => return Err(state_err("read", path, e)),
    };
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(State::default());
    }
    serde_json::from_slice(&bytes).map_err(|e| state_err("parse", path, e))
}

fn write_state(path: &Path, state: &State) -> Result<(), CniError> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".azure-vnet-ipam-standin.")
        .suffix(".tmp")
        .tempfile_in(dir)
        .map_err(|e| state_err("create temp file for", path, e))?;
    serde_json::to_writer_pretty(&mut tmp, state).map_err(|e| state_err("encode", path, e))?;
    tmp.write_all(b"\n")
        .and_then(|()| tmp.as_file().sync_all())
        .map_err(|e| state_err("write", path, e))?;
    tmp.persist(path)
        .map_err(|e| state_err("replace", path, e.error))?;
    // Best effort: make the rename itself durable.
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Runs `f` on the state under the exclusive lock and writes the state back
/// (atomically) if `f` reports a change.
fn with_state<T>(
    path: &Path,
    f: impl FnOnce(&mut State) -> Result<(T, bool), CniError>,
) -> Result<T, CniError> {
    let _lock = StateLock::acquire(path)?;
    let mut state = read_state(path)?;
    let (out, changed) = f(&mut state)?;
    if changed {
        write_state(path, &state)?;
    }
    Ok(out)
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    struct Fixture {
        _dir: tempfile::TempDir,
        state: PathBuf,
    }

    impl Fixture {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            let state = dir.path().join("sub").join("state.json");
            Self { _dir: dir, state }
        }

        /// Config with the given cniVersion, pool and extra ipam keys.
        fn conf(&self, version: &str, pool: &str, extra: Value) -> String {
            let mut ipam = json!({
                "type": "azure-vnet-ipam",
                "environment": "azure",
                "pool": pool,
                "stateFile": self.state.to_str().unwrap(),
            });
            if let (Value::Object(m), Value::Object(e)) = (&mut ipam, extra) {
                m.extend(e);
            }
            json!({"cniVersion": version, "name": "net1", "ipam": ipam}).to_string()
        }

        fn allocations(&self) -> BTreeMap<String, String> {
            let v: Value = serde_json::from_slice(&fs::read(&self.state).unwrap()).unwrap();
            serde_json::from_value(v["allocations"].clone()).unwrap()
        }
    }

    fn invoke_with(cmd: &str, id: Option<&str>, ifname: &str, stdin: &str) -> (i32, String) {
        let mut env: HashMap<&str, String> = HashMap::new();
        env.insert("CNI_COMMAND", cmd.to_owned());
        if let Some(id) = id {
            env.insert("CNI_CONTAINERID", id.to_owned());
        }
        env.insert("CNI_NETNS", "/var/run/netns/test".to_owned());
        env.insert("CNI_IFNAME", ifname.to_owned());
        env.insert("CNI_PATH", "/opt/cni/bin".to_owned());
        env.insert("CNI_ARGS", "IgnoreUnknown=1".to_owned());
        let mut out = Vec::new();
        let code = run(|k: &str| env.get(k).cloned(), stdin.as_bytes(), &mut out);
        (code, String::from_utf8(out).unwrap())
    }

    fn invoke(cmd: &str, id: &str, stdin: &str) -> (i32, String) {
        invoke_with(cmd, Some(id), "eth0", stdin)
    }

    fn parse(out: &str) -> Value {
        serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}): {out:?}"))
    }

    fn add_ip(fx: &Fixture, id: &str) -> String {
        let (code, out) = invoke("ADD", id, &fx.conf("1.0.0", "10.78.0.0/24", json!({})));
        assert_eq!(code, 0, "{out}");
        parse(&out)["ips"][0]["address"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    fn assert_error(code: i32, out: &str, want: u64) -> Value {
        assert_eq!(code, 1, "{out}");
        let v = parse(out);
        assert_eq!(v["code"], want, "{out}");
        assert!(v.get("cniVersion").is_none(), "{out}");
        v
    }

    #[test]
    fn add_twice_same_id_returns_same_ip() {
        let fx = Fixture::new();
        let conf = fx.conf("1.0.0", "10.78.0.0/24", json!({}));
        let (c1, o1) = invoke_with("ADD", Some("ctr1"), "eth0", &conf);
        // A different ifname does not matter: keyed by container ID only.
        let (c2, o2) = invoke_with("ADD", Some("ctr1"), "eth1", &conf);
        assert_eq!((c1, c2), (0, 0), "{o1} {o2}");
        assert_eq!(o1, o2);
        assert_eq!(parse(&o1)["ips"][0]["address"], "10.78.0.2/24");
        assert_eq!(fx.allocations().len(), 1);
    }

    #[test]
    fn two_ids_get_different_ips() {
        let fx = Fixture::new();
        assert_eq!(add_ip(&fx, "a"), "10.78.0.2/24");
        assert_eq!(add_ip(&fx, "b"), "10.78.0.3/24");
    }

    #[test]
    fn add_result_shape_1_0_0() {
        let fx = Fixture::new();
        let (code, out) = invoke("ADD", "a", &fx.conf("1.0.0", "10.78.0.0/24", json!({})));
        assert_eq!(code, 0);
        assert_eq!(
            parse(&out),
            json!({
                "cniVersion": "1.0.0",
                "ips": [{"address": "10.78.0.2/24", "gateway": "10.78.0.1"}],
                "routes": [{"dst": "0.0.0.0/0", "gw": "10.78.0.1"}],
                "dns": {"nameservers": ["168.63.129.16"]},
            })
        );
    }

    #[test]
    fn legacy_versions_have_ip_version() {
        for v in ["0.3.0", "0.3.1", "0.4.0"] {
            let fx = Fixture::new();
            let (code, out) = invoke("ADD", "a", &fx.conf(v, "10.78.0.0/24", json!({})));
            assert_eq!(code, 0, "{out}");
            let r = parse(&out);
            assert_eq!(r["cniVersion"], v);
            assert_eq!(r["ips"][0]["version"], "4");
            assert_eq!(r["ips"][0]["address"], "10.78.0.2/24");
            assert!(r.get("interfaces").is_none());
        }
    }

    #[test]
    fn version_0_2_0_uses_ip4_shape() {
        let fx = Fixture::new();
        let (code, out) = invoke("ADD", "a", &fx.conf("0.2.0", "10.78.0.0/24", json!({})));
        assert_eq!(code, 0, "{out}");
        assert_eq!(
            parse(&out),
            json!({
                "cniVersion": "0.2.0",
                "ip4": {
                    "ip": "10.78.0.2/24",
                    "gateway": "10.78.0.1",
                    "routes": [{"dst": "0.0.0.0/0", "gw": "10.78.0.1"}],
                },
                "dns": {"nameservers": ["168.63.129.16"]},
            })
        );
    }

    #[test]
    fn del_without_subnet_fails_and_keeps_address() {
        let fx = Fixture::new();
        add_ip(&fx, "a");
        let (code, out) = invoke("DEL", "a", &fx.conf("1.0.0", "10.78.0.0/24", json!({})));
        let e = assert_error(code, &out, 100);
        assert_eq!(e["msg"], "failed to release address: pool id not found");
        assert!(e["details"].as_str().unwrap().contains("ipam.subnet"));
        assert_eq!(fx.allocations()["a"], "10.78.0.2");
        // Still held: the next container gets the next address.
        assert_eq!(add_ip(&fx, "b"), "10.78.0.3/24");
    }

    #[test]
    fn del_with_wrong_subnet_fails() {
        let fx = Fixture::new();
        add_ip(&fx, "a");
        for subnet in ["10.79.0.0/24", "10.78.0.2/24", "garbage"] {
            let conf = fx.conf("1.0.0", "10.78.0.0/24", json!({"subnet": subnet}));
            let (code, out) = invoke("DEL", "a", &conf);
            assert_error(code, &out, 100);
        }
        assert_eq!(fx.allocations()["a"], "10.78.0.2");
    }

    #[test]
    fn del_with_subnet_releases() {
        let fx = Fixture::new();
        add_ip(&fx, "a");
        let conf = fx.conf("1.0.0", "10.78.0.0/24", json!({"subnet": "10.78.0.0/24"}));
        let (code, out) = invoke("DEL", "a", &conf);
        assert_eq!((code, out.as_str()), (0, ""));
        assert!(fx.allocations().is_empty());
        assert_eq!(add_ip(&fx, "b"), "10.78.0.2/24");
    }

    #[test]
    fn del_releases_by_container_id_even_if_ip_address_differs() {
        let fx = Fixture::new();
        add_ip(&fx, "a");
        add_ip(&fx, "b");
        let conf = fx.conf(
            "1.0.0",
            "10.78.0.0/24",
            json!({"subnet": "10.78.0.0/24", "ipAddress": "10.78.0.3"}),
        );
        let (code, out) = invoke("DEL", "a", &conf);
        assert_eq!((code, out.as_str()), (0, ""));
        let allocs = fx.allocations();
        assert_eq!(allocs.len(), 1);
        assert_eq!(allocs["b"], "10.78.0.3");
    }

    #[test]
    fn del_unknown_succeeds() {
        let fx = Fixture::new();
        let conf = fx.conf("1.0.0", "10.78.0.0/24", json!({"subnet": "10.78.0.0/24"}));
        let (code, out) = invoke("DEL", "nobody", &conf);
        assert_eq!((code, out.as_str()), (0, ""));
        // Repeated DEL is fine too.
        add_ip(&fx, "a");
        assert_eq!(invoke("DEL", "a", &conf).0, 0);
        assert_eq!(invoke("DEL", "a", &conf), (0, String::new()));
    }

    #[test]
    fn version_1_1_0_is_incompatible() {
        let fx = Fixture::new();
        let (code, out) = invoke("ADD", "a", &fx.conf("1.1.0", "10.78.0.0/24", json!({})));
        let e = assert_error(code, &out, 1);
        assert_eq!(e["msg"], "incompatible CNI versions");
        assert!(e["details"].as_str().unwrap().contains("1.1.0"));
        assert!(!fx.state.exists());
    }

    #[test]
    fn missing_cni_version_is_incompatible() {
        let (code, out) = invoke("ADD", "a", r#"{"name":"n","ipam":{}}"#);
        assert_error(code, &out, 1);
    }

    #[test]
    fn exhaustion_on_slash_30() {
        let fx = Fixture::new();
        let conf = fx.conf("1.0.0", "10.78.0.0/30", json!({}));
        let (code, out) = invoke("ADD", "a", &conf);
        assert_eq!(code, 0, "{out}");
        assert_eq!(parse(&out)["ips"][0]["address"], "10.78.0.2/30");
        let (code, out) = invoke("ADD", "b", &conf);
        let e = assert_error(code, &out, 100);
        assert!(
            e["msg"]
                .as_str()
                .unwrap()
                .contains("no addresses available")
        );
        // Idempotent ADD still works when full.
        assert_eq!(invoke("ADD", "a", &conf).0, 0);
    }

    #[test]
    fn requested_ip_address() {
        let fx = Fixture::new();
        let want = |ip: &str| fx.conf("1.0.0", "10.78.0.0/24", json!({"ipAddress": ip}));
        let (code, out) = invoke("ADD", "a", &want("10.78.0.5"));
        assert_eq!(code, 0, "{out}");
        assert_eq!(parse(&out)["ips"][0]["address"], "10.78.0.5/24");
        // Same owner: same address.
        assert_eq!(invoke("ADD", "a", &want("10.78.0.5")).0, 0);
        // Another owner, reserved, out of pool, garbage: all "not available".
        for ip in [
            "10.78.0.5",
            "10.78.0.1",
            "10.78.0.0",
            "10.78.0.255",
            "10.9.9.9",
            "x",
        ] {
            let (code, out) = invoke("ADD", "b", &want(ip));
            let e = assert_error(code, &out, 100);
            assert_eq!(e["msg"], format!("requested address {ip} is not available"));
        }
        // The container already holds a different one.
        let (code, out) = invoke("ADD", "a", &want("10.78.0.6"));
        assert_error(code, &out, 100);
        // Automatic allocation skips it only where taken.
        assert_eq!(add_ip(&fx, "c"), "10.78.0.2/24");
    }

    #[test]
    fn ipv6_pool() {
        let fx = Fixture::new();
        let (code, out) = invoke("ADD", "a", &fx.conf("0.4.0", "fd00:78::/64", json!({})));
        assert_eq!(code, 0, "{out}");
        let r = parse(&out);
        assert_eq!(r["ips"][0]["address"], "fd00:78::2/64");
        assert_eq!(r["ips"][0]["version"], "6");
        assert_eq!(r["ips"][0]["gateway"], "fd00:78::1");
        assert_eq!(r["routes"][0]["dst"], "::/0");
    }

    #[test]
    fn state_format() {
        let fx = Fixture::new();
        add_ip(&fx, "a");
        let v: Value = serde_json::from_slice(&fs::read(&fx.state).unwrap()).unwrap();
        assert_eq!(v, json!({"allocations": {"a": "10.78.0.2"}}));
        let mut lock = fx.state.clone().into_os_string();
        lock.push(".lock");
        assert!(Path::new(&lock).exists());
    }

    #[test]
    fn version_command() {
        let (code, out) = invoke_with("VERSION", None, "", "garbage");
        assert_eq!(code, 0);
        assert_eq!(out.trim_end(), VERSION_OUTPUT);
        assert_eq!(
            parse(&out)["supportedVersions"],
            json!(["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0"])
        );
    }

    #[test]
    fn unknown_commands() {
        for cmd in ["GC", "STATUS", "add", "bogus"] {
            let (code, out) = invoke(cmd, "a", "{}");
            let e = assert_error(code, &out, 4);
            assert_eq!(e["msg"], format!("unknown CNI_COMMAND: {cmd}"));
        }
        let (code, out) = invoke_with("", Some("a"), "eth0", "{}");
        assert_error(code, &out, 4);
    }

    #[test]
    fn check_is_noop() {
        let fx = Fixture::new();
        let (code, out) = invoke("CHECK", "a", &fx.conf("1.0.0", "10.78.0.0/24", json!({})));
        assert_eq!((code, out.as_str()), (0, ""));
        let (code, out) = invoke("CHECK", "a", &fx.conf("0.3.1", "10.78.0.0/24", json!({})));
        assert_error(code, &out, 1);
    }

    #[test]
    fn env_and_decode_errors() {
        let fx = Fixture::new();
        let conf = fx.conf("1.0.0", "10.78.0.0/24", json!({}));
        for cmd in ["ADD", "DEL"] {
            let (code, out) = invoke_with(cmd, None, "eth0", &conf);
            let e = assert_error(code, &out, 4);
            assert_eq!(e["msg"], "required env variables [CNI_CONTAINERID] missing");
            let (code, out) = invoke_with(cmd, Some(""), "eth0", &conf);
            assert_error(code, &out, 4);
        }
        let (code, out) = invoke("ADD", "bad/id", &conf);
        assert_error(code, &out, 4);
        for bad in ["", "{", "not json", "null", "[]", "42"] {
            let (code, out) = invoke("ADD", "a", bad);
            assert_error(code, &out, 6);
        }
    }

    #[test]
    fn hostile_inputs_never_panic() {
        let inputs = [
            r#"{"cniVersion":7}"#,
            r#"{"cniVersion":"1.0.0","ipam":5}"#,
            r#"{"cniVersion":"1.0.0","ipam":{"pool":"garbage"}}"#,
            r#"{"cniVersion":"1.0.0","ipam":{"pool":"10.0.0.0/31"}}"#,
            r#"{"cniVersion":"1.0.0","ipam":{"pool":"10.0.0.0/32"}}"#,
            r#"{"cniVersion":"1.0.0","ipam":{"pool":"fd00::/127"}}"#,
            r#"{"cniVersion":"1.0.0","ipam":{"pool":["x"]}}"#,
            r#"{"cniVersion":"1.0.0","ipam":{"subnet":{}}}"#,
            r#"{"cniVersion":"1.0.0","ipam":{"stateFile":"/proc/nonexistent/x/y","pool":"10.0.0.0/24"}}"#,
        ];
        for cmd in ["ADD", "DEL", "CHECK"] {
            for input in inputs {
                let (code, out) = invoke(cmd, "a", input);
                if code != 0 {
                    assert_eq!(code, 1);
                    assert!(parse(&out)["code"].is_u64(), "{out}");
                }
            }
        }
    }

    #[test]
    fn corrupt_state_is_an_error_not_overwritten() {
        let fx = Fixture::new();
        fs::create_dir_all(fx.state.parent().unwrap()).unwrap();
        fs::write(&fx.state, "{oops").unwrap();
        let (code, out) = invoke("ADD", "a", &fx.conf("1.0.0", "10.78.0.0/24", json!({})));
        assert_error(code, &out, 100);
        assert_eq!(fs::read_to_string(&fx.state).unwrap(), "{oops");
    }

    #[test]
    fn case_insensitive_keys() {
        let fx = Fixture::new();
        let conf = json!({
            "CNIVersion": "1.0.0",
            "IPAM": {"Pool": "10.78.0.0/24", "STATEFILE": fx.state.to_str().unwrap()},
        })
        .to_string();
        let (code, out) = invoke("ADD", "a", &conf);
        assert_eq!(code, 0, "{out}");
        assert_eq!(fx.allocations()["a"], "10.78.0.2");
    }
}
