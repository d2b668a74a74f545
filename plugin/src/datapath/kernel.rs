//! The netlink side of the datapath: create, configure, inspect and delete the pod's veth.
//! Every function runs on a netns thread (super::netns) with the handles it was given.

use std::{net::IpAddr, os::fd::AsRawFd};

use futures_util::TryStreamExt;
use ipnet::IpNet;
use nix::errno::Errno;
use rtnetlink::{
    Handle, LinkMessageBuilder, LinkUnspec, LinkVeth, RouteMessageBuilder,
    packet_route::{
        address::{AddressAttribute, AddressFlags},
        link::{InfoData, InfoKind, InfoVeth, LinkAttribute, LinkInfo, LinkMessage},
        route::{RouteAddress, RouteAttribute, RouteFlags, RouteMessage, RouteMetric, RouteScope},
    },
};

use crate::{
    datapath::{
        check::{LinkState, ObservedRoute},
        netns::Handles,
        plan::{Plan, RouteSpec},
        result::{Created, CreatedLink},
    },
    error::PluginError,
};

/// The errno of a netlink error reply, if it is one.
fn errno(e: &rtnetlink::Error) -> Option<Errno> {
    match e {
        rtnetlink::Error::NetlinkError(m) => Some(Errno::from_raw(-m.raw_code())),
        _ => None,
    }
}

fn failed(step: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> PluginError {
    let step = step.into();
    move |e| PluginError::Datapath {
        reason: match &e {
            rtnetlink::Error::NetlinkError(m) => {
                let errno = Errno::from_raw(-m.raw_code());
                format!("{} ({errno:?}) from the kernel", errno.desc())
            }
            other => other.to_string(),
        },
        step,
    }
}

/// A datapath error that did not come from a netlink reply.
fn invalid(step: &str, e: impl std::fmt::Display) -> PluginError {
    PluginError::Datapath {
        step: step.to_owned(),
        reason: e.to_string(),
    }
}

/// The link `get` asks for, or `None` (the kernel answers ENODEV for a missing link).
async fn lookup(
    get: rtnetlink::LinkGetRequest,
    what: impl std::fmt::Display,
) -> Result<Option<LinkMessage>, PluginError> {
    match get.execute().try_next().await {
        Ok(link) => Ok(link),
        Err(e) if errno(&e) == Some(Errno::ENODEV) => Ok(None),
        Err(e) => Err(failed(format!("looking up link {what}"))(e)),
    }
}

/// The link named `name`, or `None`.
async fn link_by_name(h: &Handle, name: &str) -> Result<Option<LinkMessage>, PluginError> {
    lookup(h.link().get().match_name(name.to_owned()), name).await
}

/// The link with ifindex `index`, or `None`.
async fn link_by_index(h: &Handle, index: u32) -> Result<Option<LinkMessage>, PluginError> {
    lookup(h.link().get().match_index(index), format!("#{index}")).await
}

/// Deletes link `index` (and with a veth, the pair). Already gone is success: the pod's netns
/// was destroyed meanwhile, or dipamd's sweep deleted a retired link first.
async fn delete_link(h: &Handle, index: u32) -> Result<(), rtnetlink::Error> {
    match h.link().del(index).execute().await {
        Err(e) if errno(&e) == Some(Errno::ENODEV) => Ok(()),
        other => other,
    }
}

fn mac_of(link: &LinkMessage) -> String {
    link.attributes
        .iter()
        .find_map(|a| match a {
            LinkAttribute::Address(bytes) => Some(
                bytes
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect::<Vec<_>>()
                    .join(":"),
            ),
            _ => None,
        })
        .unwrap_or_default()
}

fn mtu_of(link: &LinkMessage) -> u32 {
    link.attributes
        .iter()
        .find_map(|a| match a {
            LinkAttribute::Mtu(m) => Some(*m),
            _ => None,
        })
        .unwrap_or_default()
}

fn kind_of(link: &LinkMessage) -> String {
    link.attributes
        .iter()
        .find_map(|a| match a {
            LinkAttribute::LinkInfo(infos) => infos.iter().find_map(|i| match i {
                LinkInfo::Kind(k) => Some(k.to_string()),
                _ => None,
            }),
            _ => None,
        })
        .unwrap_or_default()
}

/// Code 160 when `ifname` exists in the container netns. One exception: the container end of
/// a veth whose host end a DEL retired (a netns that outlived its DEL, as with `podman network
/// disconnect` then `connect`): dipamd deletes it shortly, and this ADD deletes it now.
pub async fn ensure_absent(h: &Handles, ifname: &str, netns: &str) -> Result<(), PluginError> {
    let cont = h.container()?;
    let Some(link) = link_by_name(cont, ifname).await? else {
        return Ok(());
    };
    if kind_of(&link) == "veth"
        && let Some(peer) = link.attributes.iter().find_map(|a| match a {
            LinkAttribute::Link(i) => Some(*i),
            _ => None,
        })
    {
        match link_by_index(&h.host, peer).await {
            Ok(Some(host_end)) if is_retired(&host_end) => {
                return delete_link(cont, link.header.index)
                    .await
                    .map_err(failed(format!("removing the retired {ifname}")));
            }
            Ok(Some(_)) => {}
            // The peer is gone: the pair is being deleted right now (a veth pair goes in one
            // kernel operation), so the name is free if it is gone on this side too.
            Ok(None) | Err(_) => {
                if link_by_name(cont, ifname).await?.is_none() {
                    return Ok(());
                }
            }
        }
    }
    Err(PluginError::InterfaceExists {
        ifname: ifname.to_owned(),
        netns: netns.to_owned(),
    })
}

/// What ADD needs to know about the attachment.
pub struct SetupRequest<'a> {
    pub netns: &'a str,
    pub ifname: &'a str,
    pub host_name: &'a str,
    pub host_alias: &'a str,
    pub mtu: Option<u32>,
}

/// The veth pair [`create`] made: both ends, up, the host end with its alias.
pub struct Made {
    cont: LinkMessage,
    host: LinkMessage,
}

/// Creates the veth pair and brings both ends up, the host end with its alias: everything of
/// ADD's datapath that needs no address, so it runs while dipamd is still allocating one.
/// An interface that already had the name is never touched. On failure nothing is left.
pub async fn create(h: &Handles, req: &SetupRequest<'_>) -> Result<Made, PluginError> {
    let cont = h.container()?;
    // The container end is created up (create_veth). The host end is brought up, with its
    // alias, by name, *before* either end is read back: reading a link runs its pending
    // link-state event (linkwatch_sync_dev), and for the container end, up without carrier
    // until its peer is up, that deactivates its queues and waits out an expedited RCU grace
    // period (an IPI to every CPU, measured with `perf record -g`). Read after the host end
    // is up, both ends have carrier and the event only activates them.
    create_veth(h, req).await?;
    if let Err(e) = h
        .host
        .link()
        .set(
            LinkUnspec::new_with_name(req.host_name)
                .alias(req.host_alias.to_owned())
                .up()
                .build(),
        )
        .execute()
        .await
    {
        remove_container_end(h, req).await;
        return Err(failed(format!("setting {} up", req.host_name))(e));
    }
    let container = async {
        link_by_name(cont, req.ifname).await?.ok_or_else(|| {
            invalid(
                "creating the veth",
                format!("{} vanished right after it was created", req.ifname),
            )
        })
    };
    let host = async {
        link_by_name(&h.host, req.host_name).await?.ok_or_else(|| {
            invalid(
                "creating the veth",
                format!(
                    "the host end {} did not appear in the host netns",
                    req.host_name
                ),
            )
        })
    };
    match futures_util::future::join(container, host).await {
        (Ok(cont), Ok(host)) => Ok(Made { cont, host }),
        (Ok(cont), Err(e)) => {
            remove_index(h, req, cont.header.index).await;
            Err(e)
        }
        (Err(e), _) => {
            remove_container_end(h, req).await;
            Err(e)
        }
    }
}

/// Deletes the pair by its container end's name, for a [`create`] that failed before it knew
/// the end's index: deleting that end deletes the pair, wherever the host end is.
async fn remove_container_end(h: &Handles, req: &SetupRequest<'_>) {
    let Ok(cont) = h.container() else { return };
    if let Ok(Some(made)) = link_by_name(cont, req.ifname).await {
        remove_index(h, req, made.header.index).await;
    }
}

/// Installs `plan` on the veth [`create`] made. On failure, removes the pair again (the caller
/// releases the IPAM allocation): nothing dipam made outlives a failed ADD.
pub async fn finish(
    h: &Handles,
    req: &SetupRequest<'_>,
    plan: &Plan,
    made: &Made,
) -> Result<Created, PluginError> {
    match configure(h, req, plan, made).await {
        Ok(created) => Ok(created),
        Err(e) => {
            remove(h, req, made).await;
            Err(e)
        }
    }
}

/// Deletes the pair [`create`] made, for an ADD that will not succeed. Deleting one end
/// deletes the pair, with its addresses and routes.
pub async fn remove(h: &Handles, req: &SetupRequest<'_>, made: &Made) {
    remove_index(h, req, made.cont.header.index).await;
}

async fn remove_index(h: &Handles, req: &SetupRequest<'_>, index: u32) {
    let Ok(cont) = h.container() else { return };
    if let Err(del) = delete_link(cont, index).await {
        eprintln!(
            "dipam: could not remove {} after a failed ADD: {del}",
            req.ifname
        );
    }
}

/// `ip link add <ifname> mtu M type veth peer name <host_name> mtu M netns <host>`, from inside
/// the container netns: the peer is created directly in the host netns (docs/sources.md §13).
async fn create_veth(h: &Handles, req: &SetupRequest<'_>) -> Result<(), PluginError> {
    let cont = h.container()?;
    let message = || {
        // The container end is created up (IFF_UP in its ifinfomsg): one round trip fewer.
        // The peer cannot be: the kernel configures it before the pair is linked, and opening
        // a veth without its peer fails (ENOTCONN); create() brings it up with its alias.
        // One TX and one RX queue per end, given here: that is what the kernel sets anyway,
        // but when the request does not say, veth_newlink allocates one per CPU and then
        // shrinks each registered end to one, which waits out an expedited RCU grace period
        // per end (netif_set_real_num_tx_queues).
        let mut peer = LinkMessageBuilder::<LinkUnspec>::new()
            .name(req.host_name.to_owned())
            .setns_by_fd(h.host_ns.as_raw_fd())
            .append_extra_attribute(LinkAttribute::NumTxQueues(1))
            .append_extra_attribute(LinkAttribute::NumRxQueues(1));
        let mut veth = LinkMessageBuilder::<LinkVeth>::new_with_info_kind(InfoKind::Veth)
            .name(req.ifname.to_owned())
            .append_extra_attribute(LinkAttribute::NumTxQueues(1))
            .append_extra_attribute(LinkAttribute::NumRxQueues(1))
            .up();
        if let Some(mtu) = req.mtu {
            peer = peer.mtu(mtu);
            veth = veth.mtu(mtu);
        }
        veth.set_info_data(InfoData::Veth(InfoVeth::Peer(peer.build())))
            .build()
    };
    let step = format!("creating veth {} <-> {}", req.ifname, req.host_name);
    match cont.link().add(message()).execute().await {
        Ok(()) => Ok(()),
        Err(e) if errno(&e) == Some(Errno::EEXIST) => {
            // The container name was free a moment ago, so the host name is taken. It is
            // derived from this very attachment: a leftover of an earlier ADD of it whose
            // cleanup never ran (the plugin was killed). It carries nothing of value.
            let Some(stale) = link_by_name(&h.host, req.host_name).await? else {
                return Err(failed(step)(e));
            };
            if kind_of(&stale) != "veth" {
                return Err(invalid(
                    &step,
                    format!(
                        "host interface {} exists and is not a dipam veth; rename or remove it",
                        req.host_name
                    ),
                ));
            }
            eprintln!(
                "dipam: removing stale host veth {} left by an earlier ADD of this attachment",
                req.host_name
            );
            delete_link(&h.host, stale.header.index)
                .await
                .map_err(failed(format!(
                    "removing stale host veth {}",
                    req.host_name
                )))?;
            cont.link()
                .add(message())
                .execute()
                .await
                .map_err(failed(step))
        }
        Err(e) => Err(failed(step)(e)),
    }
}

/// Enables IPv6 on the container interface if the netns disabled it by default; ptp does the
/// same (`ipam.ConfigureIface`). Runs in this thread's netns: /proc/sys/net shows the netns
/// of the task that opens it.
fn enable_ipv6(ifname: &str) -> Result<(), PluginError> {
    let path = format!("/proc/sys/net/ipv6/conf/{ifname}/disable_ipv6");
    match std::fs::read_to_string(&path) {
        Ok(v) if v.trim() == "0" => Ok(()),
        Ok(_) => {
            std::fs::write(&path, "0").map_err(|e| invalid(&format!("writing 0 to {path}"), e))
        }
        Err(e) => Err(invalid(
            &format!("reading {path}"),
            format!("{e}: IPv6 is not available in the pod's netns"),
        )),
    }
}

/// Adds `addr` to link `index`. The kernel's automatic prefix route is suppressed
/// (plan.rs says why); IPv6 addresses skip duplicate address detection (`IFA_F_NODAD`): the
/// IPAM handed the address to this pod alone and the link has exactly one other end (the
/// host), so a duplicate cannot exist, while DAD would keep the address "tentative" for a
/// second or more, during which the pod cannot use it and routes with it as source fail.
/// ptp waits for DAD instead (up to 5 s per ADD).
async fn add_addr(h: &Handle, index: u32, addr: IpNet, what: &str) -> Result<(), PluginError> {
    let mut req = h.address().add(index, addr.addr(), addr.prefix_len());
    let mut flags = AddressFlags::Noprefixroute;
    if addr.addr().is_ipv6() {
        flags |= AddressFlags::Nodad;
    }
    req.message_mut()
        .attributes
        .push(AddressAttribute::Flags(flags));
    req.execute()
        .await
        .map_err(failed(format!("adding address {addr} to {what}")))
}

fn route_message(index: u32, r: &RouteSpec) -> Result<RouteMessage, PluginError> {
    let step = r.describe();
    let mut b = RouteMessageBuilder::<IpAddr>::new()
        .destination_prefix(r.dst.addr(), r.dst.prefix_len())
        .map_err(|e| invalid(&step, e))?
        .output_interface(index)
        .scope(RouteScope::from(r.scope));
    if let Some(gw) = r.gw {
        b = b.gateway(gw).map_err(|e| invalid(&step, e))?;
    }
    if let Some(src) = r.src {
        b = b.pref_source(src).map_err(|e| invalid(&step, e))?;
    }
    if let Some(p) = r.priority {
        b = b.priority(p);
    }
    if let Some(t) = r.table {
        b = b.table_id(t);
    }
    if r.onlink {
        b.get_mut().header.flags |= RouteFlags::Onlink;
    }
    let mut metrics = Vec::new();
    if let Some(m) = r.mtu {
        metrics.push(RouteMetric::Mtu(m));
    }
    if let Some(m) = r.advmss {
        metrics.push(RouteMetric::Advmss(m));
    }
    if !metrics.is_empty() {
        b.get_mut()
            .attributes
            .push(RouteAttribute::Metrics(metrics));
    }
    Ok(b.build())
}

/// Adds (or replaces) a route: the netns is the pod's and was empty of dipam's routes, so a
/// same-destination route is one dipam's plan deliberately overrides; on the host, a route to
/// this pod's address through a veth that no longer carries it (a leaked earlier pod) must
/// give way to the live pod.
async fn add_route(h: &Handle, index: u32, r: &RouteSpec, what: &str) -> Result<(), PluginError> {
    let msg = route_message(index, r)?;
    h.route()
        .add(msg)
        .replace()
        .execute()
        .await
        .map_err(failed(format!("adding {} dev {what}", r.describe())))
}

/// Adds the host's route to one of the pod's addresses, refusing (165) an address the host
/// already routes to another live veth. The route is first added exclusively, so the common
/// case costs nothing more; only when one exists is its link looked at. A veth that is up
/// has its peer in a living netns (a pair dies with either end's netns): the address is that
/// netns's, which the IPAM handed out again (its store lost the reservation, or a GC given a
/// wrong list freed it). Taking the route would silently cut that pod off while two netns
/// answer for one address. A route through anything else (a retired or down link, an
/// operator's route through a non-veth) gives way to the new pod, as before.
async fn add_host_route(h: &Handle, index: u32, dst: IpNet, what: &str) -> Result<(), PluginError> {
    let spec = RouteSpec::on_link(dst);
    let msg = route_message(index, &spec)?;
    match h.route().add(msg).execute().await {
        Ok(()) => return Ok(()),
        Err(e) if errno(&e) == Some(Errno::EEXIST) => {}
        Err(e) => return Err(failed(format!("adding {} dev {what}", spec.describe()))(e)),
    }
    let holder = routes(h)
        .await?
        .into_iter()
        .filter(|r| r.dst == dst && r.table == MAIN_TABLE && r.oif != Some(index))
        .find_map(|r| r.oif);
    if let Some(other) = holder
        && let Some(link) = link_by_index(h, other).await?
        && kind_of(&link) == "veth"
        && link
            .header
            .flags
            .contains(rtnetlink::packet_route::link::LinkFlags::Up)
        && !is_retired(&link)
    {
        let name = link
            .attributes
            .iter()
            .find_map(|a| match a {
                LinkAttribute::IfName(n) => Some(n.clone()),
                _ => None,
            })
            .unwrap_or_else(|| format!("ifindex {other}"));
        let alias = link.attributes.iter().find_map(|a| match a {
            LinkAttribute::IfAlias(s) => Some(s.clone()),
            _ => None,
        });
        let holder = match &alias {
            Some(a) if a.starts_with(crate::datapath::naming::ALIAS_PREFIX) => {
                format!("dipam veth {name} ({a})")
            }
            _ => format!("veth {name}"),
        };
        let ip = dst.addr().to_string();
        return Err(PluginError::AddressInUse {
            details: format!(
                "the IPAM handed out {ip}, but the host routes it to {holder}, which is up: \
                 the pod behind it still holds the address, and its reservation was lost \
                 (the delegate's store was wiped, or a GC freed it while the pod ran). \
                 Nothing was taken over and the allocation is released. Find the holder with \
                 `ip route show {ip}` and `dipamctl attachments | grep {ip}`; if that pod is gone, \
                 delete the veth (`ip link delete {name}`); if it runs, record it again with \
                 `dipamctl adopt` so that its address is never handed out twice"
            ),
            ip,
            holder,
        });
    }
    add_route(h, index, &spec, what).await
}

/// The main routing table's id (RT_TABLE_MAIN), where the host's pod routes live.
const MAIN_TABLE: u32 = 254;

/// Installs the plan on a pair [`create`] brought up. The two sides are independent (two
/// netlink sockets, two netns), so they are configured concurrently: the part of ADD that
/// waits for the address costs the longer side's round trips, not the sum.
async fn configure(
    h: &Handles,
    req: &SetupRequest<'_>,
    plan: &Plan,
    made: &Made,
) -> Result<Created, PluginError> {
    let cont = h.container()?;
    let (cont_link, host_link) = (&made.cont, &made.host);
    let (cidx, hidx) = (cont_link.header.index, host_link.header.index);

    if plan.has_ipv6() {
        enable_ipv6(req.ifname)?;
    }
    // Within a side, in order: the container's gateway route is on-link before the routes
    // via the gateway (the kernel checks a gateway's reachability on insert).
    let container = async {
        for addr in &plan.container_addrs {
            add_addr(cont, cidx, *addr, req.ifname).await?;
        }
        for r in &plan.container_routes {
            add_route(cont, cidx, r, req.ifname).await?;
        }
        Ok::<(), PluginError>(())
    };
    let host = async {
        for addr in &plan.host_addrs {
            add_addr(&h.host, hidx, *addr, req.host_name).await?;
        }
        for dst in &plan.host_routes {
            add_host_route(&h.host, hidx, *dst, req.host_name).await?;
        }
        Ok::<(), PluginError>(())
    };
    futures_util::future::try_join(container, host).await?;
    Ok(Created {
        host: CreatedLink {
            name: req.host_name.to_owned(),
            mac: mac_of(host_link),
            mtu: mtu_of(host_link),
        },
        container: CreatedLink {
            name: req.ifname.to_owned(),
            mac: mac_of(cont_link),
            mtu: mtu_of(cont_link),
        },
    })
}

/// A host veth retired by DEL: down and marked (`dipam_proto::retired`), awaiting deletion.
#[derive(Debug, Clone)]
pub struct Retired {
    pub index: u32,
    pub name: String,
}

/// Retires the veth whose host end is `name` (DEL's first step): sets it down, which drops
/// its routes at once, so the pod's address can be released and reused right after; and
/// marks it with the retired alias, so that dipamd's sweep deletes it even if the
/// hand-off is lost. `None` when there is no such veth (a link of that name that is not a
/// veth is left alone: dipam did not make it).
pub async fn retire_host_veth(
    host: &Handle,
    name: &str,
    alias: &str,
) -> Result<Option<Retired>, PluginError> {
    let Some(link) = link_by_name(host, name).await? else {
        return Ok(None);
    };
    if kind_of(&link) != "veth" {
        eprintln!("dipam: {name} is not a veth; leaving it alone");
        return Ok(None);
    }
    let index = link.header.index;
    let msg = LinkUnspec::new_with_index(index)
        .down()
        .alias(alias.to_owned())
        .build();
    match host.link().set(msg).execute().await {
        Ok(()) => Ok(Some(Retired {
            index,
            name: name.to_owned(),
        })),
        // Gone in between (the netns was being destroyed, taking the pair with it).
        Err(e) if errno(&e) == Some(Errno::ENODEV) => Ok(None),
        Err(e) => Err(failed(format!("retiring host veth {name}"))(e)),
    }
}

/// Deletes a retired veth by index, if it is still there and still retired (an index is
/// never that of another link while this one exists, and the alias check covers a link
/// deleted and an index reused meanwhile).
pub async fn delete_retired(host: &Handle, r: &Retired) -> Result<(), PluginError> {
    match link_by_index(host, r.index).await? {
        Some(link) if is_retired(&link) => delete_link(host, r.index)
            .await
            .map_err(failed(format!("deleting host veth {}", r.name))),
        _ => Ok(()),
    }
}

fn is_retired(link: &LinkMessage) -> bool {
    link.attributes.iter().any(|a| {
        matches!(a, LinkAttribute::IfAlias(s) if s.starts_with(dipam_proto::retired::ALIAS_PREFIX))
    })
}

/// Deletes the veth whose host end is `name`, if there is one. Returns whether it existed.
/// A link of that name that is not a veth is left alone (dipam did not make it).
pub async fn delete_host_veth(host: &Handle, name: &str) -> Result<bool, PluginError> {
    let Some(link) = link_by_name(host, name).await? else {
        return Ok(false);
    };
    if kind_of(&link) != "veth" {
        eprintln!("dipam: {name} is not a veth; leaving it alone");
        return Ok(false);
    }
    delete_link(host, link.header.index)
        .await
        .map(|()| true)
        .map_err(failed(format!("deleting host veth {name}")))
}

/// Deletes `ifname` in the container netns if it is the veth prevResult describes (same MAC):
/// DEL's fallback when the host end is not found by name. Returns whether it deleted.
pub async fn delete_container_veth(
    cont: &Handle,
    ifname: &str,
    mac: &str,
) -> Result<bool, PluginError> {
    let Some(link) = link_by_name(cont, ifname).await? else {
        return Ok(false);
    };
    if kind_of(&link) != "veth" || !mac_of(&link).eq_ignore_ascii_case(mac) {
        return Ok(false);
    }
    delete_link(cont, link.header.index)
        .await
        .map(|()| true)
        .map_err(failed(format!("deleting {ifname}")))
}

fn route_addr(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

/// Every IPv4 and IPv6 route of the handle's netns, in any table.
async fn routes(h: &Handle) -> Result<Vec<ObservedRoute>, PluginError> {
    let mut out = Vec::new();
    for query in [
        RouteMessageBuilder::<std::net::Ipv4Addr>::new().build(),
        RouteMessageBuilder::<std::net::Ipv6Addr>::new().build(),
    ] {
        let v4 = query.header.address_family == rtnetlink::packet_route::AddressFamily::Inet;
        let mut stream = h.route().get(query).execute();
        while let Some(msg) = stream.try_next().await.map_err(failed("listing routes"))? {
            let mut dst = None;
            let mut gw = None;
            let mut table = u32::from(msg.header.table);
            let mut oif = None;
            for attr in &msg.attributes {
                match attr {
                    RouteAttribute::Destination(a) => dst = route_addr(a),
                    RouteAttribute::Gateway(a) => gw = route_addr(a),
                    RouteAttribute::Table(t) => table = *t,
                    RouteAttribute::Oif(i) => oif = Some(*i),
                    _ => {}
                }
            }
            let dst = dst.unwrap_or(if v4 {
                IpAddr::from([0u8; 4])
            } else {
                IpAddr::from([0u16; 8])
            });
            if let Ok(dst) = IpNet::new(dst, msg.header.destination_prefix_length) {
                out.push(ObservedRoute {
                    dst,
                    gw,
                    table,
                    oif,
                });
            }
        }
    }
    Ok(out)
}

/// The state of link `name`: kind, MAC, addresses, and routes (all of the netns's when
/// `all_routes`, else only those through this link). `None` when it does not exist.
pub async fn observe(
    h: &Handle,
    name: &str,
    all_routes: bool,
) -> Result<Option<LinkState>, PluginError> {
    let Some(link) = link_by_name(h, name).await? else {
        return Ok(None);
    };
    let index = link.header.index;
    let mut addrs = Vec::new();
    let mut stream = h.address().get().set_link_index_filter(index).execute();
    while let Some(msg) = stream
        .try_next()
        .await
        .map_err(failed(format!("listing addresses of {name}")))?
    {
        // IFA_LOCAL is the interface's own address (IFA_ADDRESS is the peer's on
        // point-to-point links); IPv6 only sends IFA_ADDRESS.
        let local = msg.attributes.iter().find_map(|a| match a {
            AddressAttribute::Local(ip) => Some(*ip),
            _ => None,
        });
        let address = msg.attributes.iter().find_map(|a| match a {
            AddressAttribute::Address(ip) => Some(*ip),
            _ => None,
        });
        if let Some(ip) = local.or(address)
            && let Ok(net) = IpNet::new(ip, msg.header.prefix_len)
        {
            addrs.push(net);
        }
    }
    let mut routes = routes(h).await?;
    if !all_routes {
        routes.retain(|r| r.oif == Some(index));
    }
    Ok(Some(LinkState {
        index,
        kind: kind_of(&link),
        mac: mac_of(&link),
        addrs,
        routes,
    }))
}
