//! dipam's main job, end to end, on embedded defaults: start dipamd on a temp socket and
//! state directory, take one pod through ADD, CHECK and DEL under the example conflist
//! (ptp + dipam + host-local) in a fresh network namespace, show the ledger at each step,
//! and clean everything up. Run it with `bash tests/demo.sh` (it needs root).

use dipam_lifecycle::{Lab, hostlocal, is_root, runtime::result_ips};

fn step(n: u32, what: &str) {
    println!("\n== {n}. {what}");
}

fn show_ledger(lab: &Lab) {
    let out = lab.dipamd.ctl(&["attachments"]);
    print!("{}", String::from_utf8_lossy(&out.stdout));
    let store = hostlocal::reservations(lab.data.path(), &lab.network());
    if store.is_empty() {
        println!("host-local reservations: none");
    }
    for (id, ifname, ip) in store {
        println!("host-local reservation: {ip} -> {id} {ifname}");
    }
}

fn main() -> std::process::ExitCode {
    if !is_root() {
        eprintln!(
            "dipam-demo needs root (it creates a network namespace and a veth): sudo bash tests/demo.sh"
        );
        return std::process::ExitCode::FAILURE;
    }
    step(1, "start dipamd on a temporary socket and state directory");
    let lab = Lab::new("ptp-dipam-host-local.conflist");
    println!(
        "dipamd pid {:?}, socket {}",
        lab.dipamd.pid(),
        lab.dipamd.socket().display()
    );
    println!("conflist (conflist/ptp-dipam-host-local.conflist, test paths filled in):");
    println!("{:#}", lab.list());

    step(2, "create a network namespace for the pod");
    let (ns, att) = lab.pod();
    println!("netns {} , container {}", ns.path(), att.container_id);

    step(
        3,
        "ADD: ptp asks dipam for an address; dipam asks dipamd; dipamd runs host-local",
    );
    let result = match lab.rt.add(lab.list(), &att) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("ADD failed: {e}\n{}", lab.dipamd.log());
            return std::process::ExitCode::FAILURE;
        }
    };
    println!("{result:#}");
    let addr = ns.exec(&["ip", "-brief", "addr", "show", "eth0"]);
    print!("inside the pod: {}", String::from_utf8_lossy(&addr.stdout));
    show_ledger(&lab);

    step(
        4,
        "CHECK: the ledger, host-local and the pod's interface agree",
    );
    if let Err(e) = lab.rt.check(lab.list(), &att) {
        eprintln!("CHECK failed: {e}");
        return std::process::ExitCode::FAILURE;
    }
    println!("CHECK ok for {}", result_ips(&result).join(", "));

    step(
        5,
        "DEL: released through host-local, then dropped from the ledger",
    );
    if let Err(e) = lab.rt.del(lab.list(), &att) {
        eprintln!("DEL failed: {e}");
        return std::process::ExitCode::FAILURE;
    }
    show_ledger(&lab);

    step(
        6,
        "clean up: dipamd stopped, netns and temp directories removed",
    );
    drop(ns);
    drop(lab);
    println!("done");
    std::process::ExitCode::SUCCESS
}
