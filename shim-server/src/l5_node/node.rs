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
    l1_leaves::access::{Admission, Caller},
    l1_leaves::error::ShimError,
    l1_leaves::privilege::Denials,
    l2_core::core::{Core, Identity, Prepared},
    l2_core::delegate::Executor,
    l3_clients::agent::{Agent, AgentConfig, reconcile::Reconciler},
    l3_clients::divergence::Misconfigured,
    l3_clients::divergence::Watch,
    l3_clients::gc::{Collector, Gc, GcPolicy},
    l3_clients::pool::{Pool, refill::Refiller},
    l3_clients::spool::SpoolState,
    l3_clients::teardown::Teardown,
};

pub struct Node {
    pub core: Arc<Core>,
    pub agent: Arc<Agent>,
    /// The GC's policy, counters and runtime-aware GC (gc/).
    pub gc: Arc<Gc>,
    pub admission: Admission,
    /// The warm pool (pool/): off unless dipamd configures it.
    pub pool: Arc<Pool>,
    /// Networks whose delegate store dipamd must not trust (divergence/).
    pub misconfigured: Arc<Misconfigured>,
    /// The delegate's own STATUS answers, briefly remembered: containerd 2.x calls STATUS on
    /// every kubelet status poll, and each answer costs a delegate exec.
    pub status_cache: Mutex<HashMap<String, (Instant, Option<String>)>>,
    /// DELs of containers held on another network only (crossed.rs), for doctor.
    pub crossed: Arc<crate::l3_clients::crossed::Crossed>,
    pub started: Instant,
    /// Deletes the pod veths main-mode DELs retired (teardown.rs); set by the daemon, absent
    /// in tests that run without netlink.
    pub teardown: Arc<OnceLock<Teardown>>,
    /// Operations that failed for lack of a privilege (privilege.rs), for status and doctor.
    pub denials: Arc<Denials>,
    /// The DEL spool's condition, for status, doctor and metrics (spool/).
    pub spool: Arc<SpoolState>,
    /// The explain history's writer (history.rs), for status (its drops); set by the daemon.
    pub history: OnceLock<crate::l4_observers::history::Sink>,
    /// Not-ready reasons found once at start (startup_checks.rs); set by the daemon.
    pub startup: OnceLock<Vec<String>>,
    /// Whether each metrics listener is bound (metrics_listen.rs), for doctor.
    pub metrics_listeners: Arc<crate::l4_observers::metrics_listen::Listeners>,
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
            core: Arc::new(Core::new(
                Ledger::from_arc(store),
                exec,
                identity,
                agent.clone(),
            )),
            agent,
            gc: Arc::new(Gc::new(gc)),
            admission,
            pool: Arc::default(),
            misconfigured: Arc::default(),
            status_cache: Mutex::new(HashMap::new()),
            crossed: Arc::default(),
            started: Instant::now(),
            teardown: Arc::default(),
            denials,
            spool: Arc::default(),
            history: OnceLock::new(),
            startup: OnceLock::new(),
            metrics_listeners: Arc::default(),
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
            .note_config(&p.req.stdin, &p.dc.network, &self.core.identity.spool_dir);
        Ok(p)
    }

    /// What the GC works with.
    pub fn collector(&self) -> Collector {
        Collector {
            core: Arc::clone(&self.core),
            gc: Arc::clone(&self.gc),
            agent: Arc::clone(&self.agent),
            teardown: Arc::clone(&self.teardown),
        }
    }

    /// What the reconcile with the delegate's store works with.
    pub fn watch(&self) -> Watch {
        Watch {
            core: Arc::clone(&self.core),
            agent: Arc::clone(&self.agent),
            gc: Arc::clone(&self.gc),
            misconfigured: Arc::clone(&self.misconfigured),
            teardown: Arc::clone(&self.teardown),
        }
    }

    /// What the agent's reconcile works with.
    pub fn reconciler(&self) -> Reconciler {
        Reconciler {
            core: Arc::clone(&self.core),
            agent: Arc::clone(&self.agent),
            spool: Arc::clone(&self.spool),
        }
    }

    /// What the warm pool's refiller works with.
    pub fn refiller(&self) -> Refiller {
        Refiller {
            core: Arc::clone(&self.core),
            pool: Arc::clone(&self.pool),
            agent: Arc::clone(&self.agent),
            misconfigured: Arc::clone(&self.misconfigured),
        }
    }

    /// Why pod ADDs on `network` are refused, if they are (divergence/).
    pub fn misconfigured(&self, network: &str, creator: Option<u32>) -> Option<String> {
        self.misconfigured.of(network, creator)
    }
}
