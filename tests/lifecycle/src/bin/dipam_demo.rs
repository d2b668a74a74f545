//! dipam's main job, end to end, on embedded defaults. One dipamd (temporary socket and
//! state directory) serves a network in main mode (`"type": "dipam"`, host-local as the real
//! IPAM, the README's first example) and holds a network agent's router, health and ingress
//! addresses from the same host-local range. The story, a screen per step:
//!
//! 1. the agent's addresses come from the pods' own IPAM;
//! 2. pods get addresses that never collide with them;
//! 3. the agent's addresses survive a dipamd crash (SIGKILL) unchanged;
//! 4. a CNI GC whose valid list omits them frees a stale pod and keeps them;
//! 5. a DEL made while dipamd is down is spooled and released at the next start.
//!
//! Each step checks what it shows and stops the demo with a non-zero exit if it does not hold
//! (the suite runs the demo: tests/lifecycle/tests/docs/demo.rs). Everything is cleaned up on exit.
//! Run it with `bash tests/demo.sh` (it needs root).

use std::process::ExitCode;

use dipam_lifecycle::{AgentLab, Attachment, NetNs, hostlocal, is_root, runtime::result_ips};
use serde_json::{Value, json};

const CONFLIST: &str = "dipam-host-local-1.1.0.conflist";

fn step(n: u32, what: &str) {
    println!("\n== {n}. {what}");
}

fn notice(what: &str) {
    println!("-> notice: {what}");
}

/// A failed check: says what did not hold, with dipamd's log tail, and ends the demo.
struct Failed(String);

fn check(ok: bool, what: impl FnOnce() -> String) -> Result<(), Failed> {
    if ok { Ok(()) } else { Err(Failed(what())) }
}

fn show_agent(lab: &AgentLab) {
    let out = lab.dipamd.ctl(&["agent", "list"]);
    print!("{}", String::from_utf8_lossy(&out.stdout));
}

fn show_ledger(lab: &AgentLab) {
    let out = lab.dipamd.ctl(&["attachments"]);
    print!("{}", String::from_utf8_lossy(&out.stdout));
    let store = hostlocal::reservations(lab.data.path(), &lab.network());
    println!("host-local's own store ({} reservations):", store.len());
    for (id, ifname, ip) in store {
        println!("  {ip:<12} {id} {ifname}");
    }
}

/// The agent's addresses as (role, family, ip), once all three are ready.
fn agent_ips(lab: &AgentLab) -> Vec<(String, String, String)> {
    lab.wait_ready(3);
    lab.addresses()
        .into_iter()
        .map(|(role, family, ip, _)| {
            // The agent list shows CIDR notation; the stores hold bare addresses.
            let bare = ip.split('/').next().unwrap_or_default().to_owned();
            (role, family, bare)
        })
        .collect()
}

/// A CNI 1.1 GC sent to the dipam plugin as libcni sends it: the plugin's config plus the
/// attachments the runtime still knows.
fn gc(lab: &AgentLab, valid: &[&Attachment]) -> Result<(), String> {
    let mut conf = dipam_lifecycle::Runtime::plugin_config(&lab.fx.list, 0, None);
    conf["cni.dev/valid-attachments"] = json!(
        valid
            .iter()
            .map(|a| dipam_lifecycle::runtime::gc_entry(a))
            .collect::<Vec<Value>>()
    );
    let bytes = serde_json::to_vec(&conf).unwrap_or_default();
    lab.rt
        .exec("dipam", "GC", &Attachment::new("", ""), &bytes)
        .into_result("dipam")
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn run(lab: &mut AgentLab) -> Result<(), Failed> {
    step(
        1,
        "dipamd starts, and holds the agent's addresses from the pods' own IPAM",
    );
    println!(
        "dipamd pid {:?}, socket {}, state dir {}",
        lab.dipamd.pid(),
        lab.dipamd.socket().display(),
        lab.dipamd.state_dir().display()
    );
    println!("conflist (conflist/{CONFLIST}, temporary paths filled in):");
    println!("{:#}", lab.fx.list);
    let agent = agent_ips(lab);
    show_agent(lab);
    let store = hostlocal::reservations(lab.data.path(), &lab.network());
    check(store.len() == 3, || {
        format!("host-local should hold the 3 agent addresses, holds {store:?}")
    })?;
    notice(
        "router, health and ingress are ordinary host-local reservations, made by dipamd \
         exactly as a runtime would: no second IPAM, no carved-out range.",
    );

    step(
        2,
        "two pods: dipam is the main plugin, host-local its IPAM, via dipamd",
    );
    let mut pods: Vec<(NetNs, Attachment, String)> = Vec::new();
    for _ in 0..2 {
        let ns = NetNs::new();
        let att = Attachment::new(&dipam_lifecycle::unique("pod"), &ns.path());
        let result = lab
            .rt
            .add(&lab.fx.list, &att)
            .map_err(|e| Failed(format!("ADD failed: {e}")))?;
        let ip = result_ips(&result).into_iter().next().unwrap_or_default();
        let inside = ns.exec(&["ip", "-brief", "addr", "show", "eth0"]);
        print!(
            "pod {}: inside the pod: {}",
            att.container_id,
            String::from_utf8_lossy(&inside.stdout)
        );
        check(!agent.iter().any(|a| a.2 == ip), || {
            format!("pod got an agent address {ip}")
        })?;
        pods.push((ns, att, ip));
    }
    show_ledger(lab);
    check(lab.ledger() == lab.delegate_store(), || {
        "ledger and host-local disagree".into()
    })?;
    notice("the pods' addresses come from the same range and never collide with the agent's.");

    step(3, "dipamd is killed (SIGKILL) and started again");
    lab.dipamd.kill9();
    lab.dipamd.start_again();
    let again = agent_ips(lab);
    show_agent(lab);
    check(again == agent, || {
        format!("agent addresses changed: {agent:?} -> {again:?}")
    })?;
    notice(
        "same three addresses: dipamd restores them from its ledger with a CHECK through \
         host-local, never a fresh ADD, so the agent's routes and health checks stay valid.",
    );

    step(
        4,
        "a CNI GC whose valid list names only the first pod (dipamd runs with --gc-grace 1)",
    );
    let (first, stale) = (&pods[0].1, &pods[1]);
    println!(
        "valid-attachments: [{}]   (the second pod, {}, was lost by the runtime; the agent's \
         addresses are not pods, so no runtime lists them)",
        first.container_id, stale.1.container_id
    );
    // Older than --gc-grace (1 s here): younger attachments are kept whatever the list says.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    gc(lab, &[first]).map_err(|e| Failed(format!("GC failed: {e}")))?;
    show_ledger(lab);
    let held: Vec<String> = lab.delegate_store().into_iter().map(|p| p.1).collect();
    check(!held.contains(&stale.2), || {
        format!("the stale pod's {} was not freed", stale.2)
    })?;
    check(
        held.contains(&pods[0].2) && agent.iter().all(|a| held.contains(&a.2)),
        || format!("GC freed something it must keep: {held:?}"),
    )?;
    notice(
        "the stale pod's address went back to host-local; the live pod and the agent's \
         three addresses stayed: dipamd's ledger knows they are the agent's, which no \
         runtime's list and no host-local file can say.",
    );

    step(5, "the first pod is deleted while dipamd is down");
    lab.dipamd.kill9();
    let (ns, att, ip) = pods.remove(0);
    lab.rt
        .del(&lab.fx.list, &att)
        .map_err(|e| Failed(format!("DEL with dipamd down failed: {e}")))?;
    drop(ns);
    let spool = lab.dipamd.state_dir().join("spool");
    let spooled = std::fs::read_dir(&spool)
        .map(|d| d.filter_map(Result::ok).count())
        .unwrap_or(0);
    println!(
        "DEL returned success; {spooled} file(s) in {}; host-local still holds {ip}",
        spool.display()
    );
    check(lab.delegate_store().iter().any(|p| p.1 == ip), || {
        format!("{ip} was released with dipamd down?")
    })?;
    lab.dipamd.start_again();
    let _ = agent_ips(lab);
    show_ledger(lab);
    let left: Vec<String> = lab.delegate_store().into_iter().map(|p| p.1).collect();
    check(!left.contains(&ip), || {
        format!("the spooled DEL of {ip} was not replayed")
    })?;
    check(
        left.len() == 3 && lab.ledger() == lab.delegate_store(),
        || format!("after the replay, expected only the agent's 3 addresses: {left:?}"),
    )?;
    notice(
        "the runtime's DEL succeeded although dipamd was down, because the plugin spooled it \
         where dipamd looks; dipamd released it at start. Only the agent's addresses remain.",
    );
    Ok(())
}

fn main() -> ExitCode {
    if !is_root() {
        eprintln!(
            "dipam-demo needs root (it creates network namespaces and veths): sudo bash tests/demo.sh"
        );
        return ExitCode::FAILURE;
    }
    // --gc-grace 1: a GC keeps attachments younger than the grace (60 s by default, so that a
    // pod being created while GC runs keeps its address); the demo's pods are seconds old.
    let mut lab = AgentLab::new(CONFLIST, "router,health,ingress", &["--gc-grace", "1"]);
    let outcome = run(&mut lab);
    step(
        6,
        "clean up: dipamd stopped, netns and temporary directories removed",
    );
    let code = match outcome {
        Ok(()) => {
            println!("done: every step held.");
            ExitCode::SUCCESS
        }
        Err(Failed(what)) => {
            eprintln!(
                "\nDEMO FAILED: {what}\n--- dipamd log ---\n{}",
                lab.dipamd.log()
            );
            ExitCode::FAILURE
        }
    };
    drop(lab);
    code
}
