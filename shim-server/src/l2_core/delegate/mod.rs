//! The delegate executor: find a CNI IPAM plugin, learn its versions once, and run it.

pub mod config;
pub mod exec;
pub mod import;
pub mod keys;
pub mod ranges;
pub mod store;
pub mod survivors;
pub mod version;
pub mod yielding;

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::Mutex,
    time::{Duration, SystemTime},
};

use rscni_types::version::SpecVersion;
use serde_json::Value;
use tracing::{info, warn};

pub use self::exec::{Gated, Invocation, Output};
use crate::l1_leaves::error::ShimError;

/// What a delegate binary said about itself.
#[derive(Debug, Clone)]
pub struct Probe {
    pub path: PathBuf,
    pub supported: Vec<SpecVersion>,
}

/// Runs delegates. Cheap to share: the probe cache is the only state.
#[derive(Debug)]
pub struct Executor {
    /// dipamd's --cni-path directories, searched after the request's CNI_PATH.
    pub dirs: Vec<PathBuf>,
    /// The delegate types a non-root caller may have dipamd run (--non-root-delegate). Any
    /// other binary in `dirs` (bridge, host-device, ...) would run as root with that caller's
    /// config and netns.
    pub non_root_kinds: Vec<String>,
    /// The host-local `dataDir`s a non-root caller may name (--non-root-data-dir, and
    /// host-local's default), each checked root-only at start and at each use
    /// (store::root_only_dir_remade).
    pub non_root_data_dirs: Vec<PathBuf>,
    pub timeout: Duration,
    /// Notes running delegates for the next start (daemon only; tests run without).
    pub tracker: Option<survivors::Tracker>,
    /// Where execs are reported (events.rs); the daemon's observers listen.
    pub events: crate::l1_leaves::events::Events,
    /// VERSION answers by (path, mtime): a replaced binary is probed again.
    probes: Mutex<HashMap<PathBuf, (SystemTime, Vec<SpecVersion>)>>,
    /// Held while probing: the first requests after a start (or an upgrade) arrive together,
    /// and without it each would exec its own VERSION (measured: 1.25 execs per request on a
    /// fresh dipamd under 8-way ADDs).
    probing: tokio::sync::Mutex<()>,
    /// The pods' execs in flight per network, which the pool's wait for (yielding.rs).
    pub yielding: yielding::Yielding,
    /// How long a pool exec waits for them ([`yielding::BACKGROUND_YIELD`]; tests shorten it).
    pub background_yield: Duration,
}

impl Executor {
    pub fn new(dirs: Vec<PathBuf>, timeout: Duration) -> Self {
        Self {
            dirs,
            non_root_kinds: vec!["host-local".to_owned()],
            non_root_data_dirs: vec![PathBuf::from(store::DEFAULT_DATA_DIR)],
            timeout,
            tracker: None,
            events: crate::l1_leaves::events::Events::default(),
            probes: Mutex::new(HashMap::new()),
            probing: tokio::sync::Mutex::new(()),
            yielding: yielding::Yielding::default(),
            background_yield: yielding::BACKGROUND_YIELD,
        }
    }

    /// The CNI_PATH a request may use. Root's is used as sent. A non-root caller's keeps only
    /// the entries that are dipamd's own directories, so that the delegate is found there and
    /// nowhere else (empty: dipamd's directories): dipamd runs it as root, and a directory
    /// the caller can write would let it pick the binary (docs/cfp.md, "Threat model"). The
    /// result is what the ledger records, so replays as root later use it too.
    pub fn confine_cni_path(
        &self,
        cni_path: &str,
        caller: crate::l1_leaves::access::Caller,
    ) -> String {
        if caller.is_root() {
            return cni_path.to_owned();
        }
        let kept: Vec<&str> = cni_path
            .split(':')
            .filter(|s| !s.is_empty() && self.dirs.iter().any(|d| d == Path::new(s)))
            .collect();
        if kept.len() != cni_path.split(':').filter(|s| !s.is_empty()).count() {
            warn!(
                uid = caller.uid,
                "a non-root caller's CNI_PATH names directories that are not dipamd's \
                 --cni-path; the delegate is searched in dipamd's directories only"
            );
        }
        kept.join(":")
    }

    /// Refuses a delegate type a non-root caller may not have run as root.
    pub fn allow_kind(
        &self,
        kind: &str,
        caller: crate::l1_leaves::access::Caller,
    ) -> Result<(), ShimError> {
        if caller.is_root() || self.non_root_kinds.iter().any(|k| k == kind) {
            return Ok(());
        }
        Err(ShimError::Forbidden {
            msg: format!(
                "uid {} may not have dipamd run the delegate type {}",
                caller.uid,
                crate::l1_leaves::validate::shown(kind)
            ),
            details: format!(
                "dipamd runs delegates as root; for non-root callers it runs only {} \
                 (dipamd --non-root-delegate)",
                self.non_root_kinds.join(", ")
            ),
        })
    }

    /// Refuses a non-root caller's delegate `dataDir` unless it is one of
    /// --non-root-data-dir's root-only directories (host-local's default when none is
    /// named). host-local runs as root and follows links for `lock` and `last_reserved_ip.*`
    /// in `<dataDir>/<network>`: in a directory the caller can write, it overwrote a root-only
    /// file and wrote into dipamd's own state (docs/cfp.md, "Threat model").
    pub fn allow_store(
        &self,
        conf: &serde_json::Value,
        caller: crate::l1_leaves::access::Caller,
    ) -> Result<(), ShimError> {
        if caller.is_root() {
            return Ok(());
        }
        let named = store::data_dir(conf).unwrap_or(store::DEFAULT_DATA_DIR);
        let wanted = Path::new(named);
        if self
            .non_root_data_dirs
            .iter()
            .any(|d| d.as_path() == wanted)
        {
            // Checked again at each use, not only at start: a directory removed since then
            // could be made again by the caller (in a parent open to others, such as /tmp).
            // Missing there, root makes it first; one the caller made is refused.
            return store::root_only_dir_remade(wanted).map_err(|why| {
                warn!(uid = caller.uid, data_dir = %wanted.display(), why = %why,
                    "refused: a --non-root-data-dir directory is no longer root's alone");
                ShimError::Forbidden {
                    msg: format!(
                        "uid {} may not have the delegate keep its store in {}: {why}",
                        caller.uid,
                        crate::l1_leaves::validate::shown(named)
                    ),
                    details: "dipamd runs the delegate as root, and it would follow links in a \
                         directory others can write; the node's administrator must make it \
                         root-owned and writable by root only again (it was when dipamd \
                         started)"
                        .to_owned(),
                }
            });
        }
        warn!(
            uid = caller.uid,
            data_dir = %crate::l1_leaves::validate::shown(named),
            "refused: a non-root caller's delegate dataDir is not one of --non-root-data-dir"
        );
        let allowed: Vec<String> = self
            .non_root_data_dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect();
        Err(ShimError::Forbidden {
            msg: format!(
                "uid {} may not have the delegate keep its store in {}",
                caller.uid,
                crate::l1_leaves::validate::shown(named)
            ),
            details: format!(
                "dipamd runs the delegate as root, and it would follow links in a directory \
                 a non-root caller chose; use one of the directories only root can write \
                 that dipamd allows ({}), or remove ipam.dataDir where host-local's default \
                 is among them; the node's administrator allows others with dipamd \
                 --non-root-data-dir",
                if allowed.is_empty() {
                    "none".to_owned()
                } else {
                    allowed.join(", ")
                }
            ),
        })
    }

    /// The directories to search for a request: its CNI_PATH first (what the runtime would
    /// use), then dipamd's own.
    pub fn search_dirs(&self, cni_path: &str) -> Vec<PathBuf> {
        let mut dirs: Vec<PathBuf> = cni_path
            .split(':')
            .filter(|s| !s.is_empty())
            .map(PathBuf::from)
            .collect();
        for d in &self.dirs {
            if !dirs.contains(d) {
                dirs.push(d.clone());
            }
        }
        dirs
    }

    /// CNI_PATH for the delegate: the runtime's when it sent one, else dipamd's directories.
    pub fn delegate_cni_path(&self, cni_path: &str) -> String {
        if cni_path.is_empty() {
            self.dirs
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(":")
        } else {
            cni_path.to_owned()
        }
    }

    /// Finds `kind` and returns its VERSION answer, probing it once per binary version.
    pub async fn probe(&self, kind: &str, cni_path: &str) -> Result<Probe, ShimError> {
        let path = exec::find(kind, &self.search_dirs(cni_path))?;
        let mtime = path
            .metadata()
            .and_then(|m| m.modified())
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let cached = |path: &PathBuf| {
            let cache = self.probes.lock().ok()?;
            let (seen, supported) = cache.get(path)?;
            (*seen == mtime).then(|| supported.clone())
        };
        if let Some(supported) = cached(&path) {
            return Ok(Probe { path, supported });
        }
        let _probing = self.probing.lock().await;
        // Another request may have probed it while this one waited.
        if let Some(supported) = cached(&path) {
            return Ok(Probe { path, supported });
        }
        let supported = self.version_of(kind, &path).await;
        // A failed probe is not remembered: a delegate that was mid-upgrade or briefly broken
        // is asked again on the next call instead of being spoken to unconverted for good.
        if !supported.is_empty()
            && let Ok(mut cache) = self.probes.lock()
        {
            cache.insert(path.clone(), (mtime, supported.clone()));
        }
        Ok(Probe { path, supported })
    }

    /// Every delegate probed so far, for status output.
    pub fn probed(&self) -> Vec<Probe> {
        self.probes
            .lock()
            .map(|c| {
                c.iter()
                    .map(|(path, (_, supported))| Probe {
                        path: path.clone(),
                        supported: supported.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Runs VERSION the way libcni does (dummy netns and ifname). A delegate that fails it is
    /// treated as "versions unknown": the config then goes to it unconverted.
    async fn version_of(&self, kind: &str, path: &Path) -> Vec<SpecVersion> {
        let inv = Invocation {
            command: "VERSION".into(),
            container_id: String::new(),
            netns: "dummy".into(),
            ifname: "dummy".into(),
            args: String::new(),
            path: "dummy".into(),
            stdin: br#"{"cniVersion":"1.1.0"}"#.to_vec(),
            ..Invocation::default()
        };
        let parsed = match exec::run(kind, path, &inv, self.timeout, self.tracker.as_ref()).await {
            Ok(out) if out.status.success() => serde_json::from_slice::<Value>(&out.stdout)
                .ok()
                .and_then(|v| {
                    v.get("supportedVersions")?.as_array().map(|a| {
                        a.iter()
                            .filter_map(|s| s.as_str()?.parse::<SpecVersion>().ok())
                            .collect::<Vec<_>>()
                    })
                }),
            _ => None,
        };
        match parsed {
            Some(v) => {
                info!(delegate = kind, path = %path.display(), versions = ?v.iter().map(ToString::to_string).collect::<Vec<_>>(), "probed delegate");
                v
            }
            None => {
                warn!(delegate = kind, path = %path.display(), "delegate VERSION gave no usable answer; sending configs unconverted");
                Vec::new()
            }
        }
    }

    /// Runs `inv` against the probed delegate and checks its exit like libcni.
    pub async fn call(
        &self,
        kind: &str,
        probe: &Probe,
        inv: &Invocation,
    ) -> Result<Output, ShimError> {
        self.call_gated(kind, probe, inv, std::future::ready(Ok(())), None)
            .await
            .into_result()
    }

    /// [`Self::call`], with the config withheld from the delegate until `gate` succeeds
    /// ([`exec::run_gated`] says why). [`Gated::GateFailed`]: the delegate was killed before
    /// it read its config, so it did nothing.
    pub async fn call_gated(
        &self,
        kind: &str,
        probe: &Probe,
        inv: &Invocation,
        gate: impl std::future::Future<Output = Result<(), ShimError>>,
        peek: Option<exec::Peek>,
    ) -> Gated {
        let unniced;
        let mut _pod = None;
        let inv = if inv.background {
            // The pool's exec yields to the pods' on its network (yielding.rs): once they
            // are done it runs niced; past the bound it runs now, at dipamd's priority, so
            // that a pod's exec never waits on a niced holder of the delegate's store lock.
            if self
                .yielding
                .wait_quiet(&inv.network, self.background_yield)
                .await
            {
                inv
            } else {
                unniced = Invocation {
                    background: false,
                    ..inv.clone()
                };
                &unniced
            }
        } else {
            if matches!(inv.command.as_str(), "ADD" | "CHECK" | "DEL") {
                _pod = Some(self.yielding.foreground(&inv.network));
            }
            inv
        };
        let started = std::time::Instant::now();
        let outcome = match exec::run_gated(
            kind,
            &probe.path,
            inv,
            self.timeout,
            self.tracker.as_ref(),
            gate,
            peek,
        )
        .await
        {
            Gated::GateFailed(e) => return Gated::GateFailed(e),
            Gated::Ran(out) => {
                out.and_then(|out| exec::check(kind, &inv.command, &out).map(|()| out))
            }
        };
        self.record(kind, probe, inv, started.elapsed(), &outcome);
        Gated::Ran(outcome)
    }

    /// One history event per exec: what was run, with what, and how it ended.
    fn record(
        &self,
        kind: &str,
        probe: &Probe,
        inv: &Invocation,
        took: Duration,
        outcome: &Result<Output, ShimError>,
    ) {
        let mut ev = serde_json::json!({
            "kind": "exec",
            "requestId": inv.request_id,
            "network": inv.network,
            "delegate": kind,
            "argv": [probe.path.display().to_string()],
            "env": {
                "CNI_COMMAND": inv.command, "CNI_CONTAINERID": inv.container_id,
                "CNI_NETNS": inv.netns, "CNI_IFNAME": inv.ifname, "CNI_ARGS": inv.args,
                "CNI_PATH": inv.path,
            },
            "durationMs": took.as_secs_f64() * 1e3,
        });
        if let Some(uid) = inv.uid {
            ev["uid"] = uid.into();
        }
        match outcome {
            Ok(out) => {
                ev["exit"] = out.describe_exit().into();
                ev["stderr"] = crate::l1_leaves::error::excerpt(&out.stderr).into();
            }
            Err(e) => {
                ev["error"] = e.to_string().into();
                ev["details"] = e.code_and_details().1.into();
            }
        }
        self.events.emit(crate::l1_leaves::events::Event::Exec {
            delegate: kind,
            command: inv.command.as_str(),
            took,
            container_id: &inv.container_id,
            record: &ev,
        });
    }
}
