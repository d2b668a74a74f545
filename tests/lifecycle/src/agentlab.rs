//! A bench for the agent's own addresses: dipamd started with `--conflist` pointing at one of
//! the example conflists (adjusted like in [`crate::Lab`]: the real azure-vnet-ipam for a
//! conflist that delegates to it), a node name and roles.

use std::path::PathBuf;

use serde_json::Value;
use tempfile::TempDir;

use crate::{Dipamd, Fixture, Runtime, Subnet, azure::AzureNode, lab};

pub struct AgentLab {
    pub dipamd: Dipamd,
    pub rt: Runtime,
    pub fx: Fixture,
    /// The real azure-vnet-ipam's node, when the conflist delegates to it.
    pub azure: Option<AzureNode>,
    pub subnet: Subnet,
    pub data: TempDir,
    pub node: String,
}

impl AgentLab {
    /// Writes the conflist, then starts dipamd with `flags` added.
    pub fn new(conflist: &str, roles: &str, flags: &[&str]) -> Self {
        let mut lab = Self::unstarted(conflist);
        lab.write_conflist();
        lab.set_roles(roles, flags);
        lab.dipamd.start_again();
        lab
    }

    /// Everything but the conflist file and the running daemon.
    pub fn unstarted(conflist: &str) -> Self {
        Self::unstarted_with_pool(conflist, crate::azure::POOL)
    }

    /// [`Self::unstarted`], with a pool of `azure_pool` addresses if the delegate is
    /// azure-vnet-ipam (ignored otherwise).
    pub fn unstarted_with_pool(conflist: &str, azure_pool: u8) -> Self {
        let raw = Fixture::load(conflist);
        let subnet = Subnet::claim(lab::subnet_prefix(&raw));
        let mut dipamd = Dipamd::unstarted(&[]);
        let data = crate::temp_dir("delegate-store-");
        let (fx, azure, rt) =
            lab::isolate_with_pool(raw, &subnet, &mut dipamd, data.path(), azure_pool);
        let node = format!("node-{}", subnet.index);
        Self {
            dipamd,
            rt,
            fx,
            azure,
            subnet,
            data,
            node,
        }
    }

    pub fn conflist_path(&self) -> PathBuf {
        self.dipamd
            .dir
            .path()
            .join("net.d")
            .join("10-dipam.conflist")
    }

    pub fn write_conflist(&self) {
        let path = self.conflist_path();
        std::fs::create_dir_all(path.parent().expect("parent")).expect("net.d");
        // Written whole then renamed, as an installer DaemonSet should.
        let tmp = path.with_extension("tmp");
        std::fs::write(
            &tmp,
            serde_json::to_vec_pretty(&self.fx.list).expect("json"),
        )
        .expect("write conflist");
        std::fs::rename(&tmp, &path).expect("rename conflist");
    }

    /// Sets the flags for the next start.
    pub fn set_roles(&mut self, roles: &str, flags: &[&str]) {
        let conflist = self.conflist_path().display().to_string();
        let mut all: Vec<String> = vec![
            "--conflist".into(),
            conflist,
            "--node-name".into(),
            self.node.clone(),
            "--agent-roles".into(),
            roles.into(),
        ];
        all.extend(flags.iter().map(|s| (*s).to_owned()));
        let refs: Vec<&str> = all.iter().map(String::as_str).collect();
        self.dipamd.set_flags(&refs);
    }

    pub fn network(&self) -> String {
        self.fx.name()
    }

    /// `dipamctl agent <args> --json`, parsed.
    pub fn agent(&self, args: &[&str]) -> Value {
        let mut all = vec!["agent"];
        all.extend_from_slice(args);
        all.push("--json");
        crate::cmd::json(&self.dipamd.ctl(&all))
    }

    /// (role, family, ip, state) for every agent address, sorted.
    pub fn addresses(&self) -> Vec<(String, String, String, String)> {
        addresses_of(&self.agent(&["list"]))
    }

    /// (container ID, IP) in the delegate's store.
    pub fn delegate_store(&self) -> Vec<(String, String)> {
        lab::store(self.azure.as_ref(), &self.fx, self.data.path())
    }

    /// (container ID, IP) in the ledger for this network.
    pub fn ledger(&self) -> Vec<(String, String)> {
        self.dipamd.ledger_pairs(&self.network())
    }

    #[track_caller]
    pub fn assert_agree(&self) {
        assert_eq!(
            self.ledger(),
            self.delegate_store(),
            "ledger (left) vs delegate store (right)"
        );
    }

    /// Waits (up to 20 s: spooled DELs are replayed at each start and every 5 s) until the
    /// ledger holds only the `agent` agent addresses, then asserts it, and that the delegate's
    /// store agrees: nothing leaked. `context` (a seed, say) goes into the failure.
    #[track_caller]
    pub fn assert_converged(&self, agent: usize, context: &str) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while self.ledger().len() > agent && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        assert_eq!(
            self.ledger().len(),
            agent,
            "{context}: only the agent's addresses stay: {:?}",
            self.ledger()
        );
        self.assert_agree();
    }

    /// Waits until every agent address is ready, or panics with the list and the log.
    pub fn wait_ready(&self, want: usize) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let a = self.addresses();
            if a.len() == want && a.iter().all(|x| x.3 == "ready") {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "agent addresses not ready: {a:?}\n{}",
                self.dipamd.log()
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

/// `dipamctl agent watch --json` on a bench's socket, as an agent runs it: it reconnects to
/// every new dipamd. Killed on drop.
pub struct AgentWatch {
    child: Option<std::process::Child>,
    lines: std::sync::Arc<std::sync::Mutex<Vec<Value>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl AgentLab {
    /// Starts an agent's watch on this bench's dipamd.
    pub fn watch(&self) -> AgentWatch {
        use std::io::BufRead;
        let mut child = std::process::Command::new(crate::bins::bin("dipamctl"))
            .arg("--socket")
            .arg(self.dipamd.socket())
            .args(["agent", "watch", "--json"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("run dipamctl agent watch");
        let out = child.stdout.take().expect("piped stdout");
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = lines.clone();
        let reader = std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str(&line) {
                    sink.lock().expect("watch lines").push(v);
                }
            }
        });
        AgentWatch {
            child: Some(child),
            lines,
            reader: Some(reader),
        }
    }
}

impl AgentWatch {
    /// Waits until a message satisfies `pred`, or panics with what came.
    #[track_caller]
    pub fn wait_for(&self, what: &str, pred: impl Fn(&Value) -> bool) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            if self.lines.lock().expect("watch lines").iter().any(&pred) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the watcher never saw {what}: {:#?}",
                self.lines.lock().expect("watch lines")
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// The messages printed so far.
    pub fn lines(&self) -> Vec<Value> {
        self.lines.lock().expect("watch lines").clone()
    }

    /// Stops the watch and returns every message it printed.
    pub fn finish(mut self) -> Vec<Value> {
        self.stop();
        self.lines.lock().expect("watch lines").clone()
    }

    /// Stops the watch, then asserts it followed dipamd across restarts as an agent needs: in
    /// (instance, generation) order, and through at least two instances.
    #[track_caller]
    pub fn finish_across_restarts(self) -> Vec<Value> {
        let lines = self.finish();
        Self::assert_ordered(&lines);
        let instances: std::collections::BTreeSet<&str> = lines
            .iter()
            .filter_map(|l| l["instanceID"].as_str())
            .collect();
        assert!(
            instances.len() >= 2,
            "the watch followed dipamd across its restarts: {instances:?}"
        );
        lines
    }

    /// The (instance, generation) order an agent relies on across every reconnect: each
    /// message's generation above the one before. Panics naming the messages otherwise.
    #[track_caller]
    pub fn assert_ordered(lines: &[Value]) {
        let gens: Vec<u64> = lines
            .iter()
            .filter_map(|l| l["generation"].as_u64())
            .collect();
        assert!(
            gens.windows(2).all(|w| w[0] < w[1]),
            "the watch went back in generation: {gens:?}"
        );
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

impl Drop for AgentWatch {
    fn drop(&mut self) {
        self.stop();
    }
}

/// (role, family, ip, state) of every address in an agent list or watch message (`dipamctl
/// agent list --json`, one line of `agent watch --json`), sorted: what an agent acts on.
pub fn addresses_of(v: &serde_json::Value) -> Vec<(String, String, String, String)> {
    let mut out: Vec<_> = v["addresses"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|a| {
            let s = |k: &str| a[k].as_str().unwrap_or_default().to_owned();
            (s("role"), s("family"), s("ip"), s("state"))
        })
        .collect();
    out.sort();
    out
}
