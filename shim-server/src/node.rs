//! The daemon's context: the core (core/) and the handles of the optional subsystems that are
//! its clients (the warm pool, the agent's addresses, GC settings and stats, the spool's
//! condition, the veth teardown, admission, the refused networks). The RPCs (rpc/) and the
//! background tasks get a `Node`; the core never sees one.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, OnceLock},
    time::Instant,
};

use dipam_proto::v1::CniRequest;
use dipam_state::{Ledger, Store};

use crate::{
    access::{Admission, Caller},
    agent::{Agent, AgentConfig},
    core::{Core, Identity, Prepared},
    delegate::Executor,
    error::ShimError,
    gc::{GcPolicy, GcStats},
    pool::Pool,
    privilege::Denials,
    spool::SpoolState,
    teardown::Teardown,
};

pub struct Node {
    pub core: Core,
    pub agent: Arc<Agent>,
    pub gc: GcPolicy,
    pub admission: Admission,
    pub gc_stats: GcStats,
    /// The warm pool (pool/): off unless dipamd configures it.
    pub pool: Pool,
    /// Networks whose delegate store dipamd must not trust (divergence.rs), with the reason:
    /// pod ADDs there are refused.
    pub misconfigured: Mutex<HashMap<String, String>>,
    /// The delegate's own STATUS answers, briefly remembered: containerd 2.x calls STATUS on
    /// every kubelet status poll, and each answer costs a delegate exec.
    pub status_cache: Mutex<HashMap<String, (Instant, Option<String>)>>,
    pub started: Instant,
    /// Deletes the pod veths main-mode DELs retired (teardown.rs); set by the daemon, absent
    /// in tests that run without netlink.
    pub teardown: OnceLock<Teardown>,
    /// Operations that failed for lack of a privilege (privilege.rs), for status and doctor.
    pub denials: Arc<Denials>,
    /// The DEL spool's condition, for status, doctor and metrics (spool/).
    pub spool: SpoolState,
    /// The explain history's writer (history.rs), for status (its drops); set by the daemon.
    pub history: OnceLock<crate::history::Sink>,
    /// The runtime-aware GC (gc/runtime/): set by the daemon when it runs with
    /// --cri-endpoint.
    pub runtime_gc: OnceLock<crate::gc::runtime::RuntimeGc>,
    /// Not-ready reasons found once at start (startup_checks.rs); set by the daemon.
    pub startup: OnceLock<Vec<String>>,
}

/// The core's functions read as the node's: `node.ledger(..)`, `node.lookup(..)`. The node
/// adds handles around the core; it changes nothing of it.
impl std::ops::Deref for Node {
    type Target = Core;

    fn deref(&self) -> &Core {
        &self.core
    }
}

impl Node {
    pub fn new(
        store: Arc<dyn Store>,
        exec: Executor,
        identity: Identity,
        agent: Option<AgentConfig>,
        gc: GcPolicy,
        admission: Admission,
    ) -> Arc<Self> {
        let agent = Arc::new(Agent::new(agent));
        let denials = Arc::new(Denials::with_events(exec.events.clone()));
        Arc::new(Self {
            core: Core::new(Ledger::from_arc(store), exec, identity, agent.clone()),
            agent,
            gc,
            admission,
            gc_stats: GcStats::default(),
            pool: Pool::default(),
            misconfigured: Mutex::new(HashMap::new()),
            status_cache: Mutex::new(HashMap::new()),
            started: Instant::now(),
            teardown: OnceLock::new(),
            denials,
            spool: SpoolState::default(),
            history: OnceLock::new(),
            runtime_gc: OnceLock::new(),
            startup: OnceLock::new(),
        })
    }

    /// [`Core::prepare`], and the spool learns the network's config (a `spoolDir` other
    /// than dipamd's is reported, spool/).
    pub fn prepare(
        &self,
        req: CniRequest,
        attachment: bool,
        caller: Caller,
    ) -> Result<Prepared, ShimError> {
        let p = self.core.prepare(req, attachment, caller)?;
        self.spool
            .note_config(&p.req.stdin, &p.dc.network, &self.identity.spool_dir);
        Ok(p)
    }

    /// Before GC releases `rec`'s address: the host veth dipam's main mode made for it (and
    /// with it the host's route to the address) goes first, as a DEL's would
    /// (teardown.rs `retire`). Without the teardown worker it stays; a later ADD handed the
    /// address is then refused (165), naming it.
    pub async fn retire_datapath(&self, rec: &dipam_state::AttachmentRecord) {
        if rec.owner != dipam_state::Owner::Pod {
            return;
        }
        if let Some(t) = self.teardown.get() {
            let k = &rec.key;
            t.retire(vec![(
                k.network.clone(),
                k.container_id.clone(),
                k.ifname.clone(),
            )])
            .await;
        }
    }

    /// Why pod ADDs on `network` are refused, if they are (divergence.rs).
    pub fn misconfigured(&self, network: &str) -> Option<String> {
        self.misconfigured
            .lock()
            .ok()
            .and_then(|m| m.get(network).cloned())
    }
}
