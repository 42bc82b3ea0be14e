//! CHECK: verify the real state against prevResult and the configuration — bridge, container
//! interface and its veth peer on the bridge (with MACs), port flags, VLANs, addresses,
//! connected and configured routes, gateway addresses on the bridge, masquerade and spoof-check
//! rules — and CHECK the IPAM delegate. Works for layer-2 configurations too (no IPAM call).

use std::net::IpAddr;

use cni_common::attachment::AttachmentId;
use cni_common::delegate::ipam;
use cni_common::error::{CniError, Result};
use cni_common::mac::Mac;
use cni_common::netlink::{Link, Route, TABLE_MAIN};
use cni_common::spec::result::{CniResult, Interface};
use cni_common::spec::Command;
use cni_common::Request;
use ipnet::IpNet;

use crate::config::Conf;
use crate::firewall;
use crate::kernel::{Kernel, Ns, Real};
use crate::model::{container_of, port_flag_drift, port_flags, port_vlan_plan, route_gateway, BridgeDevice};

fn fail(msg: impl Into<String>) -> CniError {
    CniError::internal(msg)
}

fn mac_of(l: &Link) -> String {
    Mac::text(l.mac)
}

pub fn check(req: &Request) -> Result<()> {
    let conf = Conf::from_request(req)?;
    let prev = req.prev_result()?.ok_or_else(|| CniError::config("Required prevResult missing"))?;
    // The delegate checks its reservation while we look at the kernel.
    let pending = if conf.l3 { Some(ipam::start(req, Command::Check)?) } else { None };
    let ours = req.require_netns().and_then(|ns| {
        let mut k = Real::new(req, ns)?;
        check_state(&mut k, req, &conf, &prev)
    });
    let theirs = match pending {
        Some(p) => p.wait().map(drop),
        None => Ok(()),
    };
    ours.and(theirs)
}

/// CHECK of the kernel's state through the seam `k` (the IPAM delegate aside).
pub(crate) fn check_state(k: &mut dyn Kernel, req: &Request, conf: &Conf, prev: &CniResult) -> Result<()> {
    let ifname = req.env.ifname.as_str();

    // Interfaces we created, as listed in prevResult.
    let br_if = prev
        .interfaces
        .iter()
        .find(|i| i.name == conf.bridge && i.sandbox.is_empty())
        .ok_or_else(|| fail(format!("prevResult lists no bridge interface {:?}", conf.bridge)))?;
    let (ctr_pos, ours) = container_of(prev, ifname, &req.env.netns)?;

    let br = check_bridge(k, conf, br_if)?;
    let c = check_container_interface(k, conf, ifname, &prev.interfaces[ctr_pos])?;
    let hv = find_host_veth(k, conf, prev, &c, &br)?;
    if conf.uses_vlans() {
        let have = k.bridge_port_vlans(hv.index)?;
        for want in port_vlan_plan(conf.vlan, &conf.trunk) {
            if !have.contains(&want) {
                return Err(fail(format!("bridge port {} lacks VLAN {want:?} (has {have:?})", hv.name)));
            }
        }
    }
    check_addresses_and_routes(k, prev, &ours, &c)?;

    // Gateway addresses on the bridge.
    if conf.l3 && conf.is_gateway && conf.vlan == 0 {
        let on_bridge = k.addrs(Ns::Host, Some(br.index), None)?;
        for ip in prev.ips.iter().filter(|i| i.interface.is_none_or(|x| x == ctr_pos)) {
            let Some(gw) = ip.gateway else { continue };
            let Ok(want) = IpNet::new(gw, ip.address.prefix_len()) else { continue };
            if !on_bridge.iter().any(|a| a.addr == want) {
                return Err(fail(format!("gateway address {want} is missing on bridge {}", br.name)));
            }
        }
    }
    // Masquerading made by upstream's bridge (iptables) is checked in its own form.
    let masq = conf.ip_masq && !ours.is_empty() && !k.upstream_masq_intact()?;
    if masq || conf.macspoofchk {
        check_firewall(k, &AttachmentId::of(req), conf, &ours, &hv, &c, masq)?;
    }
    Ok(())
}

/// The bridge exists, is a bridge, has prevResult's MAC, and is as configured (promiscuity and
/// the options ADD keeps it at: [`BridgeDevice`]).
fn check_bridge(k: &mut dyn Kernel, conf: &Conf, br_if: &Interface) -> Result<Link> {
    let br = k
        .link_by_name(Ns::Host, &conf.bridge)?
        .ok_or_else(|| fail(format!("CNI created bridge {} in host namespace was not found", conf.bridge)))?;
    if br.kind.as_deref() != Some("bridge") {
        return Err(fail(format!("Interface {} does not have link type of bridge", br.name)));
    }
    if !br_if.mac.is_empty() && br_if.mac != mac_of(&br) {
        return Err(fail(format!(
            "Bridge interface {} Mac doesn't match: {} (now {})",
            br.name,
            br_if.mac,
            mac_of(&br)
        )));
    }
    if let Some(drift) = BridgeDevice::of(conf, None).drift(&br) {
        return Err(fail(drift));
    }
    // ADD with isGateway gives the bridge a MAC of its own (add::Add::pin_mac)
    if conf.is_gateway && k.mac_pinned(&br) == Some(false) {
        return Err(fail(format!(
            "bridge {} has no MAC of its own: it follows its ports (the next ADD sets one)",
            br.name
        )));
    }
    Ok(br)
}

/// The container interface is a veth with prevResult's MAC, up unless disabled.
fn check_container_interface(
    k: &mut dyn Kernel,
    conf: &Conf,
    ifname: &str,
    ctr_if: &Interface,
) -> Result<Link> {
    let c = k
        .link_by_name(Ns::Container, ifname)?
        .ok_or_else(|| fail(format!("CNI created interface in container {ifname} not found")))?;
    if c.kind.as_deref() != Some("veth") {
        return Err(fail(format!("Error: Container interface {ifname} not of type veth")));
    }
    if !ctr_if.mac.is_empty() && ctr_if.mac != mac_of(&c) {
        return Err(fail(format!(
            "Interface {ifname} Mac {} doesn't match container Mac: {}",
            ctr_if.mac,
            mac_of(&c)
        )));
    }
    if !conf.disable_container_interface && !c.up() {
        return Err(fail(format!("container interface {ifname} is down")));
    }
    Ok(c)
}

/// The container interface's peer: a host veth of prevResult, enslaved to the bridge, with the
/// configured port flags.
fn find_host_veth(k: &mut dyn Kernel, conf: &Conf, prev: &CniResult, c: &Link, br: &Link) -> Result<Link> {
    let peer = c.link.ok_or_else(|| fail(format!("Unable to obtain veth peer index for veth {}", c.name)))?;
    for i in prev.interfaces.iter().filter(|i| i.sandbox.is_empty() && i.name != conf.bridge) {
        let Some((l, flags)) = k.link_with_port_flags(&i.name)? else { continue };
        if l.kind.as_deref() != Some("veth")
            || l.index != peer
            || l.link != Some(c.index)
            || l.master != Some(br.index)
        {
            continue;
        }
        if !i.mac.is_empty() && i.mac != mac_of(&l) {
            return Err(fail(format!("Interface {} Mac doesn't match: {} not found", l.name, i.mac)));
        }
        if let Some(drift) = port_flag_drift(&l.name, &flags.unwrap_or_default(), &port_flags(conf)) {
            return Err(fail(drift));
        }
        return Ok(l);
    }
    Err(fail(format!("CNI veth created for bridge {} was not found", conf.bridge)))
}

/// Every address of the container interface is on it with its connected route; every
/// prevResult route exists.
fn check_addresses_and_routes(k: &mut dyn Kernel, prev: &CniResult, ours: &[IpNet], c: &Link) -> Result<()> {
    if ours.is_empty() && prev.routes.is_empty() {
        return Ok(());
    }
    let ifname = c.name.as_str();
    let addrs = k.addrs(Ns::Container, Some(c.index), None)?;
    let routes = k.routes(Ns::Container, None)?;
    for a in ours {
        if !addrs.iter().any(|x| x.addr == *a) {
            return Err(fail(format!("Failed to match addr {a} on interface {ifname}")));
        }
        let connected = a.trunc();
        if !routes.iter().any(|r| {
            r.dst == connected && r.table == TABLE_MAIN && r.paths().iter().any(|p| p.1 == Some(c.index))
        }) {
            return Err(fail(format!("no connected route {connected} dev {ifname} for address {a}")));
        }
    }
    for r in &prev.routes {
        let want_gw = route_gateway(&prev.ips, r);
        let table = r.table.unwrap_or(TABLE_MAIN);
        if !routes.iter().any(|k| route_matches(k, r.dst, want_gw, table, c.index)) {
            let via = want_gw.map(|g| format!(" via {g}")).unwrap_or_default();
            return Err(fail(format!("Failed to find a route {}{via} dev {ifname} (table {table})", r.dst)));
        }
    }
    Ok(())
}

/// The masquerade rules of the container's addresses and the spoof-check chains are in place.
/// (`masq`: ours to check; not when upstream's iptables form holds it, intact.)
fn check_firewall(
    k: &mut dyn Kernel,
    att: &AttachmentId,
    conf: &Conf,
    ours: &[IpNet],
    hv: &Link,
    c: &Link,
    masq: bool,
) -> Result<()> {
    let found = firewall::find(k.nft()?, att, masq, conf.macspoofchk)?;
    if masq {
        if let Some(why) = firewall::masq_missing(&found, att, ours, conf.non_masquerade.as_deref()) {
            return Err(fail(why));
        }
    }
    if conf.macspoofchk {
        if let Some(why) = firewall::spoof_missing(&found, &hv.name, Mac(c.mac.unwrap_or_default())) {
            return Err(fail(why));
        }
    }
    Ok(())
}

fn route_matches(k: &Route, dst: IpNet, gw: Option<IpAddr>, table: u32, oif: u32) -> bool {
    k.dst == dst.trunc()
        && k.table == table
        && k.paths().iter().any(|(g, o)| (gw.is_none() || *g == gw) && (o.is_none() || *o == Some(oif)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cni_common::netlink::{NextHop, RouteKind};

    fn route(dst: &str, gw: Option<&str>, oif: Option<u32>, table: u32) -> Route {
        Route {
            dst: dst.parse().unwrap(),
            gw: gw.map(|g| g.parse().unwrap()),
            oif,
            table,
            priority: None,
            scope: 0,
            protocol: 3,
            mtu: None,
            advmss: None,
            kind: RouteKind::Unicast,
            prefsrc: None,
            nexthops: vec![],
        }
    }

    #[test]
    fn a_kernel_route_matches_by_destination_table_gateway_and_interface() {
        let gw: Option<IpAddr> = Some("10.1.0.1".parse().unwrap());
        let dst = "10.9.0.0/16".parse().unwrap();
        let k = route("10.9.0.0/16", Some("10.1.0.1"), Some(7), TABLE_MAIN);
        assert!(route_matches(&k, dst, gw, TABLE_MAIN, 7));
        assert!(route_matches(&k, "10.9.3.4/16".parse().unwrap(), gw, TABLE_MAIN, 7), "host bits ignored");
        assert!(route_matches(&k, dst, None, TABLE_MAIN, 7), "no gateway wanted: any");
        assert!(!route_matches(&k, "10.8.0.0/16".parse().unwrap(), gw, TABLE_MAIN, 7), "destination");
        assert!(!route_matches(&k, dst, gw, 100, 7), "table");
        assert!(!route_matches(&k, dst, Some("10.1.0.9".parse().unwrap()), TABLE_MAIN, 7), "gateway");
        assert!(!route_matches(&k, dst, gw, TABLE_MAIN, 8), "interface");
        // A route the kernel reports without an interface matches any.
        assert!(route_matches(
            &route("10.9.0.0/16", Some("10.1.0.1"), None, TABLE_MAIN),
            dst,
            gw,
            TABLE_MAIN,
            8
        ));
        // Multipath (IPv6 routes added with append): any of the next hops.
        let mut m = route("fd00::/64", None, None, TABLE_MAIN);
        let hop = |g: &str, oif| NextHop { gw: Some(g.parse().unwrap()), oif: Some(oif), weight: 1 };
        m.nexthops = vec![hop("fd01::1", 3), hop("fd01::2", 7)];
        let d6 = "fd00::/64".parse().unwrap();
        assert!(route_matches(&m, d6, Some("fd01::2".parse().unwrap()), TABLE_MAIN, 7));
        assert!(
            !route_matches(&m, d6, Some("fd01::2".parse().unwrap()), TABLE_MAIN, 3),
            "gateway and interface of one hop"
        );
    }
}
