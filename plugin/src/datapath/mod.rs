//! The pod datapath of main mode (`{"type":"dipam","ipam":{"type":"host-local",...}}`):
//! dipam gets the addresses from the delegated IPAM through dipamd, then wires the pod itself.
//!
//! # Shape (the reference ptp plugin's; docs/sources.md §6)
//! - A veth pair per attachment: the container end is CNI_IFNAME inside CNI_NETNS, the host
//!   end is `dp<11 hex>` derived from (network, container ID, ifname) (naming.rs), with an
//!   alias naming the attachment.
//! - Container: every IPAM address with its prefix, the gateway on-link, the subnet and every
//!   IPAM route via the gateway (plan.rs). Host: the gateway as /32 (/128) on the host end and
//!   a /32 (/128) route to each pod address. So all pod traffic is routed by the host, and two
//!   pods of one subnet reach each other through it.
//! - IPv4 (and, with IPv6 addresses, IPv6) forwarding is enabled on the host, as ptp does:
//!   without it nothing beyond the host end is reachable.
//! - IPv6 addresses are added without DAD (kernel.rs `add_addr` says why).
//! - MTU: the config's `mtu` on both ends; the kernel default otherwise.
//!
//! # Threads
//! Every operation inside a pod's netns runs on a dedicated thread that enters the netns,
//! runs its own current-thread runtime for rtnetlink, and exits (netns.rs). The gRPC client
//! runs on the main thread, which never leaves the host netns; ADD's last step runs there
//! too, through a socket its netns thread opened in the pod's netns (netns::run_here).
//!
//! # Concurrency
//! Nothing here is shared between invocations: the names derive from the attachment, so a
//! runtime that sets up several interfaces of one pod at once (containerd attaches all
//! networks concurrently, docs/sources.md §5) gets independent veths, addresses and
//! routes; dipamd serialises per attachment, and the IPAM locks its own store.

pub mod check;
pub mod kernel;
pub mod naming;
pub mod netns;
pub mod plan;
pub mod result;

use rscni_types::types::CNIResult;

use crate::{
    datapath::{
        check::{Expected, Observed},
        kernel::SetupRequest,
        netns::Netns,
        plan::Plan,
        result::Created,
    },
    error::PluginError,
};

/// The attachment being wired: the key of every CNI operation (spec §2).
#[derive(Debug, Clone, Copy)]
pub struct Attachment<'a> {
    pub network: &'a str,
    pub container_id: &'a str,
    pub ifname: &'a str,
}

impl Attachment<'_> {
    pub fn host_ifname(&self) -> String {
        naming::host_ifname(self.network, self.container_id, self.ifname)
    }
}

/// ADD's datapath, overlapped with the IPAM call: on a netns thread, check that CNI_IFNAME is
/// free (spec §ADD: code 160 otherwise), create the veth pair and bring it up, all of which
/// needs no address, while `ipam` runs on the calling thread (the RPC to dipamd: ~4-5 ms, most
/// of it the delegate's exec; ~1.5 ms from the warm pool); then install the plan made from
/// its answer, on the calling thread, through a socket the netns thread opened in the pod's
/// netns (netns::run_here says why). If `ipam` fails, the pair is removed and its error
/// returned. On any error nothing of the datapath is left. After `ipam` succeeded, the error comes with its answer:
/// the caller decides whether to release it (not when dipamd answered from its ledger: an
/// interface that exists then is the live attachment's, and so is the address).
///
/// `confirm` runs once the plan is installed (dipamd's commit ran meanwhile): for an answer
/// that came before dipamd's commit (AddEarly), it waits for the ADD's outcome. If it
/// fails, the pair is removed like on any other error after the IPAM call.
pub fn add_during<R, F, C>(
    att: Attachment<'_>,
    netns: &Netns,
    mtu: Option<u32>,
    ipam: F,
    confirm: C,
) -> Result<(R, Created), AddError<R>>
where
    F: FnOnce() -> Result<(R, Plan), PluginError>,
    C: FnOnce(&mut R) -> Result<(), PluginError>,
{
    let host_name = att.host_ifname();
    let host_alias = naming::host_alias(att.network, att.container_id, att.ifname);
    let req = SetupRequest {
        netns: netns.path(),
        ifname: att.ifname,
        host_name: &host_name,
        host_alias: &host_alias,
        mtu,
    };
    std::thread::scope(|scope| {
        let req = &req;
        // Ok(Err(_)): the name is taken (or unreadable), nothing was made. The socket it
        // returns lets the calling thread finish the pair without entering the pod's netns.
        let thread = netns::spawn(scope, Some(netns), move |h| async move {
            if let Err(e) = kernel::ensure_absent(&h, att.ifname, netns.path()).await {
                return Ok(Err(e));
            }
            let pod = netns::PodSocket::open()?;
            Ok(Ok((kernel::create(&h, req).await?, pod)))
        })
        .map_err(AddError::BeforeIpam)?;
        let ipam = ipam();
        // The pair is made in ~0.5 ms, the IPAM call takes several: the thread is done.
        let made = netns::join(thread);
        let (mut answer, plan) = match ipam {
            Ok(v) => v,
            Err(e) => {
                return Err(AddError::BeforeIpam(match made {
                    Ok(Ok((made, pod))) => {
                        let removed = netns::run_here(pod, |h| async move {
                            kernel::remove(&h, req, &made).await;
                            Ok(())
                        });
                        if removed.is_err() {
                            // The socket could not be used: by the host end's name instead.
                            let _ = del(att, netns.path(), None);
                        }
                        e
                    }
                    // A taken name is the clearer error of the two: nothing was allocated.
                    Ok(Err(taken)) => taken,
                    Err(_) => e,
                }));
            }
        };
        let (made, pod) = match made {
            Ok(Ok(v)) => v,
            Ok(Err(error)) | Err(error) => return Err(AddError::AfterIpam { error, answer }),
        };
        let forwarding = enable_forwarding(&plan);
        let created = netns::run_here(pod, |h| async move {
            kernel::finish(&h, req, &plan, &made).await
        });
        // dipamd's commit ran while the addresses went in.
        let confirmed = confirm(&mut answer);
        let created = match created {
            Ok(created) => created,
            Err(error) => {
                // finish() removes the pair when a step fails; this covers a socket or a
                // runtime that never started. Deleting the host end deletes the pair.
                let _ = del(att, netns.path(), None);
                return Err(AddError::AfterIpam { error, answer });
            }
        };
        if let Err(error) = confirmed.and(forwarding) {
            // The pair is complete but must not stay; deleting the host end deletes it all.
            let _ = del(att, netns.path(), None);
            return Err(AddError::AfterIpam { error, answer });
        }
        Ok((answer, created))
    })
}

/// Where [`add_during`] failed.
#[derive(Debug)]
pub enum AddError<R> {
    /// Nothing is allocated: the IPAM call failed (its error as dipamd reported it), or the
    /// thread could not start.
    BeforeIpam(PluginError),
    /// After the IPAM answered (`answer`): the datapath is undone, the allocation is the
    /// caller's to release or keep.
    AfterIpam { error: PluginError, answer: R },
}

/// DEL's first step: retires the pod's host veth (kernel::retire_host_veth), found by its
/// derived name without entering the netns. `None` when it is not there.
pub fn retire(att: Attachment<'_>) -> Result<Option<kernel::Retired>, PluginError> {
    let host_name = att.host_ifname();
    let alias = naming::retired_alias(att.network, att.container_id, att.ifname);
    netns::run(None, |h| {
        let (host_name, alias) = (&host_name, &alias);
        async move { kernel::retire_host_veth(&h.host, host_name, alias).await }
    })
}

/// Deletes a retired host veth now (and with it the pair): when dipamd did not take it over.
pub fn delete_retired(r: &kernel::Retired) -> Result<(), PluginError> {
    netns::run(
        None,
        |h| async move { kernel::delete_retired(&h.host, r).await },
    )
}

/// The inode of the plugin's network namespace, which dipamd compares with its own before it
/// takes over a retired veth (ifindexes are per-namespace). 0 when unreadable: never taken.
pub fn own_netns_inode() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/net").map_or(0, |m| m.ino())
}

/// Removes the pod's veth, wherever it still is. Missing netns, empty CNI_NETNS and missing
/// links are success (spec §DEL); repeated calls are no-ops.
pub fn del(
    att: Attachment<'_>,
    netns_path: &str,
    prev: Option<&CNIResult>,
) -> Result<(), PluginError> {
    let host_name = att.host_ifname();
    // The host end is found by its derived name, without entering the netns: this works when
    // the netns is gone and with no prevResult. Deleting it deletes the pair.
    let removed = netns::run(None, |h| {
        let host_name = &host_name;
        async move { kernel::delete_host_veth(&h.host, host_name).await }
    })?;
    if removed {
        return Ok(());
    }
    // Fallback: the host end is not where its name says (renamed by someone). Delete the
    // container end only if prevResult shows dipam created it (same MAC): after a failed ADD
    // the runtime DELs too, and an interface that was there before must survive.
    let Some(mac) = prev.and_then(|p| {
        p.interfaces
            .iter()
            .find(|i| i.name == att.ifname && i.sandbox.as_deref() == Some(netns_path))
            .map(|i| i.mac.clone())
            .filter(|m| !m.is_empty())
    }) else {
        return Ok(());
    };
    let Some(ns) = Netns::open_if_present(netns_path) else {
        return Ok(());
    };
    netns::run(Some(&ns), |h| {
        let mac = &mac;
        async move { kernel::delete_container_veth(h.container()?, att.ifname, mac).await }
    })
    .map(|_| ())
}

/// Reads what the kernel has for the attachment `expected` describes.
pub fn observe(
    att: Attachment<'_>,
    netns: &Netns,
    expected: &Expected,
) -> Result<Observed, PluginError> {
    let host_name = expected
        .host
        .as_ref()
        .map(|(name, _)| name.clone())
        .unwrap_or_else(|| att.host_ifname());
    netns::run(Some(netns), |h| {
        let host_name = &host_name;
        async move {
            let container = kernel::observe(h.container()?, att.ifname, true).await?;
            let host = kernel::observe(&h.host, host_name, false).await?;
            Ok(Observed { container, host })
        }
    })
}

/// Turns on IP forwarding in the host netns for the families in `plan`, as ptp does
/// (`ip.EnableForward`); already-enabled is left untouched. Runs on the calling thread, which
/// is in the host netns.
fn enable_forwarding(plan: &Plan) -> Result<(), PluginError> {
    let mut knobs = Vec::new();
    if plan.has_ipv4() {
        knobs.push("/proc/sys/net/ipv4/ip_forward");
    }
    if plan.has_ipv6() {
        knobs.push("/proc/sys/net/ipv6/conf/all/forwarding");
    }
    for knob in knobs {
        let on = std::fs::read_to_string(knob).is_ok_and(|v| v.trim() == "1");
        if !on {
            std::fs::write(knob, "1").map_err(|e| PluginError::Datapath {
                step: format!("enabling forwarding ({knob})"),
                reason: e.to_string(),
            })?;
        }
    }
    Ok(())
}
