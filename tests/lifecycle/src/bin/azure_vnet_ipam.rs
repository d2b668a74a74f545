//! `azure-vnet-ipam` stand-in: a CNI IPAM plugin for the lifecycle tests.
//!
//! **This is a test double; it follows azure-vnet-ipam's documented contract**
//! (`docs/sources.md` §8, plus the CNI protocol rules of §2–§4). The real plugin
//! (built by tests/deps.sh) runs in `tests/lifecycle/tests/azure.rs`, from its
//! file-backed source in a private mount namespace per dipamd (`src/azure.rs`): its
//! state and config paths are fixed (`/var/run/azure-vnet-ipam.json`,
//! `/etc/kubernetes/interfaces.json`). This double stays where the older tests run
//! many dipamds and call the plugin from the test process itself, outside such a
//! namespace (docs/compatibility.md, "Where a test double stays"). It takes the pool
//! from its config and otherwise behaves like the real plugin at the CNI boundary;
//! where they differ (the real one hands out any free address, not the lowest), the
//! real one is what dipam is proven against. Only the points below are promised.
//!
//! # Environment
//! - Env vars come in through the `getenv` closure given to `standin::run`;
//!   `main` passes `std::env::var`. The process environment is never changed. An
//!   empty value counts as absent, because libcni sets every `CNI_*` var and uses
//!   `""` for the ones that do not apply.
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
use std::fs;
use std::io::{self, Read};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use dipam_lifecycle::standin::{
    self, CniError, ERR_INVALID_CONFIG, Env, FileLock, IpConfig, LockStep, Pool, missing_env,
    object_field, string_field,
};
use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use serde_json::Map;

const SUPPORTED_VERSIONS: [&str; 6] = ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0"];
const VERSION_OUTPUT: &str = r#"{"cniVersion":"1.0.0","supportedVersions":["0.1.0","0.2.0","0.3.0","0.3.1","0.4.0","1.0.0"]}"#;
const DEFAULT_POOL: &str = "10.240.0.0/24";
const DEFAULT_STATE_FILE: &str = "/run/azure-vnet-ipam-standin.json";
/// Azure's virtual public IP for DNS (what the real pool reports as its DNS server).
const AZURE_DNS: &str = "168.63.129.16";

/// azure-vnet-ipam reports its own failures as `ErrRuntime` (100).
const ERR_RUNTIME: u32 = 100;

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
        "ADD" => Command::Add,
        "DEL" => Command::Del,
        "CHECK" => Command::Check,
        other => return Err(standin::unknown_command(other)),
    };

    let container_id = env.get("CNI_CONTAINERID");
    if let Some(id) = &container_id {
        standin::check_container_id(id)?;
    }
    // CNI_NETNS, CNI_IFNAME, CNI_ARGS, CNI_PATH: ignored (see the module docs).

    let conf = parse_config(&standin::read_stdin(stdin)?)?;

    match command {
        Command::Check => {
            // Every supported version from 0.4.0 on (libcni skel's rule).
            standin::require_version(
                &conf.cni_version,
                "CHECK",
                &["0.4.0", "1.0.0"],
                "0.4.0 or later",
            )?;
            Ok(None)
        }
        Command::Add => {
            let id = container_id.ok_or_else(|| missing_env(&["CNI_CONTAINERID"]))?;
            cmd_add(&conf, &id).map(Some)
        }
        Command::Del => {
            let id = container_id.ok_or_else(|| missing_env(&["CNI_CONTAINERID"]))?;
            cmd_del(&conf, &id).map(|()| None)
        }
    }
}

// ---------------------------------------------------------------------------
// Config
// ---------------------------------------------------------------------------

fn parse_config(raw: &[u8]) -> Result<Config, CniError> {
    let top = standin::parse_object(raw)?;

    let cni_version = match string_field(&top, "cniVersion", "cniVersion")? {
        None => {
            return Err(standin::incompatible_version(
                "config has no cniVersion; this stand-in requires one (the real \
                 azure-vnet-ipam would assume \"0.2.0\")",
            ));
        }
        Some(v) if !SUPPORTED_VERSIONS.contains(&v.as_str()) => {
            return Err(standin::unsupported_version(&v, &SUPPORTED_VERSIONS));
        }
        Some(v) => v,
    };

    let empty = Map::new();
    let ipam = object_field(&top, "ipam", "ipam")?.unwrap_or(&empty);
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

/// The pool from `ipam.pool`: any CIDR (host bits are dropped) with room for a network
/// address, a gateway and one assignable address.
fn parse_pool(text: &str) -> Result<Pool, CniError> {
    let invalid = |details: String| CniError::new(ERR_INVALID_CONFIG, "invalid ipam.pool", details);
    let net: IpNet = text
        .parse()
        .map_err(|e| invalid(format!("{text:?} is not a CIDR: {e}")))?;
    let net = net.trunc();
    Pool::new(net).ok_or_else(|| {
        invalid(format!(
            "pool {net} is too small: it needs a network address, a gateway and at \
             least one assignable address (IPv4 ≤ /30, IPv6 ≤ /126)"
        ))
    })
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
    let pool = parse_pool(&conf.pool)?;
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
        None => pool
            .addresses()
            .find(|ip| !taken.contains_key(ip))
            .ok_or_else(|| {
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
    let pool = parse_pool(&conf.pool)?;
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
    let ip_config = IpConfig::new(cni_version, pool, ip);
    let route = Route {
        dst: if v6 { "::/0" } else { "0.0.0.0/0" }.to_owned(),
        gw: ip_config.gateway.clone(),
    };
    let dns = Dns {
        nameservers: vec![AZURE_DNS.to_owned()],
    };
    match cni_version {
        "0.1.0" | "0.2.0" => {
            let cfg = LegacyIpConfig {
                ip: ip_config.address,
                gateway: ip_config.gateway,
                routes: vec![route],
            };
            let (ip4, ip6) = if v6 {
                (None, Some(cfg))
            } else {
                (Some(cfg), None)
            };
            let result = LegacyResult {
                cni_version: cni_version.to_owned(),
                ip4,
                ip6,
                dns,
            };
            standin::encode_result(&result, ERR_RUNTIME)
        }
        _ => {
            let result = CurrentResult {
                cni_version: cni_version.to_owned(),
                ips: vec![ip_config],
                routes: vec![route],
                dns,
            };
            standin::encode_result(&result, ERR_RUNTIME)
        }
    }
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

/// Takes the exclusive flock on `<stateFile>.lock` (held until the guard drops),
/// creating missing parent directories first.
fn lock_state(state_path: &Path) -> Result<FileLock, CniError> {
    let mut lock_path = state_path.as_os_str().to_owned();
    lock_path.push(".lock");
    let lock_path = PathBuf::from(lock_path);
    if let Some(parent) = state_path.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(parent).map_err(|e| state_err("create directory for", parent, e))?;
    }
    // 0o666 is `OpenOptions`' default: the umask decides.
    FileLock::acquire(&lock_path, 0o666, "state file", |step, e| {
        let what = match step {
            LockStep::Open => "open lock for",
            LockStep::Lock => "lock",
        };
        state_err(what, &lock_path, e)
    })
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
    let mut data = serde_json::to_vec_pretty(state).map_err(|e| state_err("encode", path, e))?;
    data.push(b'\n');
    standin::write_atomic(path, ".azure-vnet-ipam-standin.", &data, |what, e| {
        state_err(what, path, e)
    })
}

/// Runs `f` on the state under the exclusive lock and writes the state back
/// (atomically) if `f` reports a change.
fn with_state<T>(
    path: &Path,
    f: impl FnOnce(&mut State) -> Result<(T, bool), CniError>,
) -> Result<T, CniError> {
    let _lock = lock_state(path)?;
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
    use serde_json::{Value, json};

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
        let code = standin::run(
            VERSION_OUTPUT,
            dispatch,
            |k: &str| env.get(k).cloned(),
            stdin.as_bytes(),
            &mut out,
        );
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
