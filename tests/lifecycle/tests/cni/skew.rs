//! Version skew between the plugin and dipamd (F12, docs/cfp.md §5.2). After an upgrade the
//! CNI bin directory may still hold an older plugin than the daemon, or the other way round;
//! pods must keep getting and releasing addresses either way.
//!
//! The older plugin is played by a raw dipam.v1 client that sends exactly what a protocol-1
//! plugin from before request ordering sends: `protocol_version` 1 and no `issued_at_ms`
//! (absent on the wire, so 0). That client links dipam-proto, the wire contract, and nothing
//! else of dipam: the daemon and the current plugin are the built binaries, as everywhere in
//! this harness.

// Tests: a panic is the failure report.
#![allow(clippy::unwrap_used)]

use dipam_lifecycle::{Attachment, Lab, Runtime, bins, cmd, require_root, runtime::result_ips};
use dipam_proto::v1::{CniReply, CniRequest, Mode, cni_client::CniClient, cni_reply::Outcome};
use serde_json::Value;

/// The plugin's request for `command` on `att` in IPAM mode, as a plugin speaking
/// `protocol` sends it: the config ptp hands its IPAM, the runtime's environment, and none
/// of the fields newer protocols added (`issued_at_ms` stays 0, as if absent).
fn request(lab: &Lab, att: &Attachment, command: &str, protocol: u32) -> CniRequest {
    let conf = Runtime::plugin_config(lab.list(), 0, None);
    CniRequest {
        protocol_version: protocol,
        request_id: format!("skew-v{protocol}"),
        command: command.into(),
        container_id: att.container_id.clone(),
        netns: att.netns.clone(),
        ifname: att.ifname.clone(),
        cni_args: att.args.clone(),
        cni_path: bins::cni_path(),
        stdin: serde_json::to_vec(&conf).unwrap(),
        mode: Mode::Ipam as i32,
        ..CniRequest::default()
    }
}

/// Sends one request to dipamd over its socket, as the plugin does.
fn call(lab: &Lab, req: CniRequest) -> Result<CniReply, tonic::Status> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let socket = lab.dipamd.socket();
    rt.block_on(async move {
        let channel = dipam_proto::connect(&socket).await.unwrap();
        let mut client = CniClient::new(channel);
        let reply = match req.command.as_str() {
            "ADD" => client.add(req).await,
            "DEL" => client.del(req).await,
            other => panic!("no {other} here"),
        };
        reply.map(tonic::Response::into_inner)
    })
}

/// The ADD result of a reply, or a panic naming the CNI error.
fn added(reply: CniReply) -> Value {
    match reply.outcome {
        Some(Outcome::Result(bytes)) => serde_json::from_slice(&bytes).unwrap(),
        other => panic!("ADD failed: {other:?}"),
    }
}

#[track_caller]
fn deleted(reply: CniReply) {
    match reply.outcome {
        None => {}
        Some(Outcome::Result(bytes)) if bytes.is_empty() => {}
        other => panic!("DEL failed: {other:?}"),
    }
}

/// A protocol-1 plugin without request ordering adds and deletes against this dipamd, and
/// pods it added can be deleted by the current plugin and the other way round: the order in
/// which the plugin and the daemon are upgraded does not matter.
#[test]
fn an_older_plugin_keeps_working_against_this_daemon() {
    require_root!();
    let lab = Lab::new("ptp-dipam-host-local.conflist");
    // "Older" is protocol 1 because that is the oldest this daemon serves; raising the
    // minimum must be a deliberate decision that also changes this test.
    assert_eq!(dipam_proto::MIN_PROTOCOL_VERSION, 1);

    // Old plugin: ADD then DEL.
    let (_ns, a) = lab.pod();
    let result = added(call(&lab, request(&lab, &a, "ADD", 1)).unwrap());
    let ips = result_ips(&result);
    assert_eq!(ips.len(), 1, "{result}");
    assert!(lab.subnet.contains(&ips[0]), "{result}");
    assert_eq!(
        lab.delegate_store(),
        vec![(a.container_id.clone(), ips[0].clone())]
    );
    lab.assert_agree();
    // A repeated ADD (a runtime retry) is answered from the ledger, as for any plugin.
    let again = added(call(&lab, request(&lab, &a, "ADD", 1)).unwrap());
    assert_eq!(result_ips(&again), ips);
    deleted(call(&lab, request(&lab, &a, "DEL", 1)).unwrap());
    lab.assert_agree();

    // Added by the old plugin, deleted by the current one (the plugin was upgraded while
    // the pod ran).
    let (_ns, b) = lab.pod();
    added(call(&lab, request(&lab, &b, "ADD", 1)).unwrap());
    lab.rt
        .ipam(lab.list(), 0, "DEL", &b, None)
        .unwrap_or_else(|e| panic!("current plugin's DEL: {e}"));
    lab.assert_agree();

    // Added by the current plugin, deleted by the old one (a plugin rolled back): a DEL
    // without ordering information is not taken for a stale one.
    let (_ns, c) = lab.pod();
    lab.rt
        .ipam(lab.list(), 0, "ADD", &c, None)
        .unwrap_or_else(|e| panic!("current plugin's ADD: {e}"));
    deleted(call(&lab, request(&lab, &c, "DEL", 1)).unwrap());
    assert!(
        lab.delegate_store().is_empty(),
        "{:?}",
        lab.delegate_store()
    );
    lab.assert_agree();
}

/// Older than the oldest protocol dipamd serves: refused before anything is allocated, with
/// the gRPC code the plugin turns into CNI code 1 and "install the dipam plugin that matches
/// dipamd". Newer than dipamd's: served (fields it does not know are ignored).
#[test]
fn too_old_is_refused_and_newer_is_served() {
    require_root!();
    let lab = Lab::new("ptp-dipam-host-local.conflist");
    let (_ns, a) = lab.pod();

    let old = dipam_proto::MIN_PROTOCOL_VERSION - 1;
    for command in ["ADD", "DEL"] {
        let e = call(&lab, request(&lab, &a, command, old)).unwrap_err();
        assert_eq!(
            e.code(),
            tonic::Code::FailedPrecondition,
            "{command}: {e:?}"
        );
        // 0 is proto3's unset field: most likely a new client that forgot it, said so.
        let says = match old {
            0 => "the request sets no protocol_version (0)".to_owned(),
            v => format!("v{v}"),
        };
        assert!(e.message().contains(&says), "{e:?}");
    }
    assert!(lab.delegate_store().is_empty());
    assert!(lab.ledger().is_empty());

    let newer = dipam_proto::PROTOCOL_VERSION + 98;
    let result = added(call(&lab, request(&lab, &a, "ADD", newer)).unwrap());
    assert_eq!(result_ips(&result).len(), 1, "{result}");
    lab.assert_agree();
    deleted(call(&lab, request(&lab, &a, "DEL", newer)).unwrap());
    assert!(lab.delegate_store().is_empty());
    lab.assert_agree();
}

/// `dipamctl status` shows the protocol dipamd speaks, the oldest it serves, and the one the
/// client speaks, in both output forms.
#[test]
fn status_shows_the_protocol_versions() {
    require_root!();
    let lab = Lab::new("ptp-dipam-host-local.conflist");
    let v = cmd::json(&lab.dipamd.ctl(&["status", "--json"]));
    assert_eq!(
        v["protocol"]["daemon"],
        dipam_proto::PROTOCOL_VERSION,
        "{v:#}"
    );
    assert_eq!(
        v["protocol"]["daemonMin"],
        dipam_proto::MIN_PROTOCOL_VERSION,
        "{v:#}"
    );
    assert_eq!(
        v["protocol"]["client"],
        dipam_proto::PROTOCOL_VERSION,
        "{v:#}"
    );

    let out = lab.dipamd.ctl(&["status"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let daemon = text
        .lines()
        .find(|l| l.starts_with("daemon:"))
        .unwrap_or_else(|| panic!("{text}"));
    for part in [
        format!("protocol v{}", dipam_proto::PROTOCOL_VERSION),
        format!("serves v{}+", dipam_proto::MIN_PROTOCOL_VERSION),
        format!("client v{}", dipam_proto::PROTOCOL_VERSION),
    ] {
        assert!(daemon.contains(&part), "{part:?} not in {daemon:?}");
    }
}

/// A dipamd from before `AddEarly`: a server without the method answers it UNIMPLEMENTED;
/// every other call is passed to the real dipamd. It serves on its own socket, from a thread
/// of its own, until dropped.
struct OlderDaemon {
    socket: std::path::PathBuf,
    early_calls: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

struct Older {
    upstream: std::path::PathBuf,
    early_calls: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Older {
    async fn client(&self) -> Result<CniClient<tonic::transport::Channel>, tonic::Status> {
        let channel = dipam_proto::connect(&self.upstream)
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        Ok(CniClient::new(channel))
    }
}

type Reply = Result<tonic::Response<CniReply>, tonic::Status>;

#[tonic::async_trait]
impl dipam_proto::v1::cni_server::Cni for Older {
    async fn add(&self, r: tonic::Request<CniRequest>) -> Reply {
        self.client().await?.add(r.into_inner()).await
    }
    type AddEarlyStream = std::pin::Pin<
        Box<dyn tokio_stream::Stream<Item = Result<CniReply, tonic::Status>> + Send + 'static>,
    >;
    async fn add_early(
        &self,
        _: tonic::Request<CniRequest>,
    ) -> Result<tonic::Response<Self::AddEarlyStream>, tonic::Status> {
        self.early_calls
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Err(tonic::Status::unimplemented(""))
    }
    async fn del(&self, r: tonic::Request<CniRequest>) -> Reply {
        self.client().await?.del(r.into_inner()).await
    }
    async fn check(&self, r: tonic::Request<CniRequest>) -> Reply {
        self.client().await?.check(r.into_inner()).await
    }
    async fn gc(&self, r: tonic::Request<CniRequest>) -> Reply {
        self.client().await?.gc(r.into_inner()).await
    }
    async fn status(&self, r: tonic::Request<CniRequest>) -> Reply {
        self.client().await?.status(r.into_inner()).await
    }
}

impl OlderDaemon {
    fn start(upstream: std::path::PathBuf) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("older.sock");
        let early_calls = std::sync::Arc::default();
        let older = Older {
            upstream,
            early_calls: std::sync::Arc::clone(&early_calls),
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (ready_tx, ready) = std::sync::mpsc::channel();
        let path = socket.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::UnixListener::bind(&path).unwrap();
                ready_tx.send(()).unwrap();
                tonic::transport::Server::builder()
                    .add_service(dipam_proto::v1::cni_server::CniServer::new(older))
                    .serve_with_incoming_shutdown(
                        tokio_stream::wrappers::UnixListenerStream::new(listener),
                        async {
                            let _ = stopped.await;
                        },
                    )
                    .await
                    .unwrap();
            });
        });
        ready.recv().unwrap();
        Self {
            socket,
            early_calls,
            stop: Some(stop),
            thread: Some(thread),
            _dir: dir,
        }
    }
}

impl Drop for OlderDaemon {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// This plugin against a dipamd from before `AddEarly`: a main-mode ADD asks for it, falls
/// back to `Add` on the same connection, and the pod is wired; CHECK and DEL as usual.
#[test]
fn this_plugin_works_against_a_daemon_without_add_early() {
    require_root!();
    let mut lab = Lab::new("dipam-host-local-1.1.0.conflist");
    let older = OlderDaemon::start(lab.dipamd.socket());
    lab.fx = lab.fx.clone().with_socket(&older.socket);
    let (_ns, att) = lab.pod();
    let result = lab.rt.add(lab.list(), &att).unwrap();
    assert_eq!(
        older.early_calls.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the plugin did not try AddEarly first"
    );
    assert_eq!(result_ips(&result).len(), 1, "{result}");
    lab.assert_agree();
    lab.rt.check(lab.list(), &att).unwrap();
    lab.rt.del(lab.list(), &att).unwrap();
    lab.assert_agree();
    assert!(lab.ledger().is_empty());
}

/// An agent built against the Agent service before claims (protocol 1: List, Allocate,
/// Release, and the string fields role, family, state) keeps working against this dipamd: the
/// roles are predefined claims now, and every field such a client reads is still filled in.
#[test]
fn an_older_agent_client_keeps_working() {
    use dipam_proto::v1::{AgentListRequest, AgentRoleRequest, agent_client::AgentClient};
    require_root!();
    let lab = dipam_lifecycle::AgentLab::new("ptp-dipam-host-local.conflist", "router", &[]);
    lab.wait_ready(1);
    let socket = lab.dipamd.socket();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let mut agent = AgentClient::new(dipam_proto::connect(&socket).await.unwrap());
        let role = |role: &str| AgentRoleRequest {
            protocol_version: 1,
            role: role.into(),
        };
        // What a protocol-1 agent reads of an address.
        let old_view = |a: &dipam_proto::v1::AgentAddress| {
            (
                a.role.clone(),
                a.family.clone(),
                a.state.clone(),
                a.ip.is_empty(),
            )
        };
        let list = agent
            .list(AgentListRequest {
                protocol_version: 1,
            })
            .await
            .unwrap()
            .into_inner();
        let views: Vec<_> = list.addresses.iter().map(old_view).collect();
        assert_eq!(
            views,
            vec![("router".into(), "ipv4".into(), "ready".into(), false)]
        );
        let reply = agent.allocate(role("health")).await.unwrap().into_inner();
        let health = reply
            .addresses
            .iter()
            .find(|a| a.role == "health")
            .expect("Allocate's reply lists the role it enabled");
        assert_eq!(
            old_view(health),
            ("health".into(), "ipv4".into(), "ready".into(), false)
        );
        assert!(reply.generation > list.generation);
        let reply = agent.release(role("health")).await.unwrap().into_inner();
        assert!(
            reply.addresses.iter().all(|a| a.role != "health"),
            "{reply:?}"
        );
        let e = agent.allocate(role("dns")).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
    });
    assert_eq!(lab.delegate_store().len(), 1);
    lab.assert_agree();
}
