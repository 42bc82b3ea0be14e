//! CHECK: the attachment in prevResult against the kernel — the container's veth (name,
//! sandbox, MAC), its addresses, the point-to-point routes and IPAM's routes, the host end with
//! the gateway addresses and the routes to the container, the masquerade rules with `ipMasq`
//! (ours, or upstream's iptables form) — and the IPAM delegate's CHECK.

use cni_common::attachment::AttachmentId;
use cni_common::delegate::ipam;
use cni_common::error::{CniError, Result};
use cni_common::mac::Mac;
use cni_common::spec::result::CniResult;
use cni_common::spec::Command;
use cni_common::Request;

use crate::config::Conf;
use crate::desired::{desired, RouteWant};
use crate::kernel::{Kernel, Real, RouteSeen, Side};

fn fail(msg: impl Into<String>) -> CniError {
    CniError::internal(msg)
}

pub fn check(req: &Request) -> Result<()> {
    let conf = Conf::from_request(req)?;
    let prev = req.prev_result()?.ok_or_else(|| CniError::config("ptp: Required prevResult missing"))?;
    let ns = req.require_netns()?;
    let pending = ipam::start(req, Command::Check)?;
    let ours = (|| {
        let mut k = Real::new(Some(&ns))?;
        let a = AttachmentId::of(req);
        // Masquerading that upstream's ptp wrote with its iptables backend counts too.
        let mut upstream_masq = || Ok(cni_common::upstream::masq::check(req)?.is_intact());
        run(&mut k, &conf, &prev, &a, &req.env.netns, &mut upstream_masq)
    })();
    let theirs = pending.wait().map(drop);
    ours.and(theirs)
}

fn route_there(seen: &[RouteSeen], index: u32, want: &RouteWant) -> bool {
    seen.iter().any(|r| {
        r.dst == want.dst.trunc()
            && r.oif == Some(index)
            && (want.gw.is_none() || r.gw == want.gw)
            && r.table == want.table.unwrap_or(254)
    })
}

/// CHECK against a kernel; `upstream_masq` says whether upstream's iptables form of the
/// attachment's masquerading is there and intact (asked only when ours is not complete).
pub fn run(
    k: &mut dyn Kernel,
    conf: &Conf,
    prev: &CniResult,
    a: &AttachmentId,
    netns: &str,
    upstream_masq: &mut dyn FnMut() -> Result<bool>,
) -> Result<()> {
    let ifname = a.ifname.as_str();
    let ctr_pos =
        prev.interfaces.iter().position(|i| i.name == ifname && i.sandbox == netns).ok_or_else(|| {
            fail(format!(
                "prevResult lists no interface {ifname:?} in sandbox {netns:?} (the configured netns)"
            ))
        })?;
    let ctr_if = &prev.interfaces[ctr_pos];
    let c = k
        .link(Side::Container, ifname)?
        .ok_or_else(|| fail(format!("ptp: Container Interface name in prevResult: {ifname} not found")))?;
    if c.kind.as_deref() != Some("veth") {
        return Err(fail(format!("Error: Container interface {ifname} not of type veth/p2p")));
    }
    if !ctr_if.mac.is_empty() && ctr_if.mac != Mac::text(c.mac) {
        return Err(fail(format!(
            "ptp: Interface {ifname} Mac {} doesn't match container Mac: {}",
            ctr_if.mac,
            Mac::text(c.mac)
        )));
    }
    // The addresses of prevResult that are the container's.
    let mine = CniResult {
        ips: prev.ips.iter().filter(|i| i.interface.is_none_or(|x| x == ctr_pos)).cloned().collect(),
        routes: prev.routes.clone(),
        ..Default::default()
    };
    let d = desired(conf, &mine)?;
    let have = k.addrs(Side::Container, c.index)?;
    for want in &d.ctr_addrs {
        if !have.contains(want) {
            return Err(fail(format!("ptp: address {want} is missing on {ifname} (it has {have:?})")));
        }
    }
    let seen = k.routes(Side::Container)?;
    for want in &d.ctr_routes {
        if !route_there(&seen, c.index, want) {
            return Err(fail(format!(
                "ptp: route {} via {} dev {ifname} is missing in the container",
                want.dst,
                want.gw.map(|g| g.to_string()).unwrap_or_else(|| "-".into())
            )));
        }
    }
    // The host end: the veth of prevResult without a sandbox, the peer of the container's.
    let host_if = prev
        .interfaces
        .iter()
        .find(|i| i.sandbox.is_empty())
        .ok_or_else(|| fail("prevResult lists no host interface"))?;
    let h = k
        .link(Side::Host, &host_if.name)?
        .ok_or_else(|| fail(format!("ptp: host veth {} of prevResult not found", host_if.name)))?;
    if h.kind.as_deref() != Some("veth") || c.link != Some(h.index) {
        return Err(fail(format!("ptp: host interface {} is not the peer of {ifname}", h.name)));
    }
    let host_addrs = k.addrs(Side::Host, h.index)?;
    for want in &d.host_addrs {
        if !host_addrs.contains(want) {
            return Err(fail(format!("ptp: gateway address {want} is missing on host veth {}", h.name)));
        }
    }
    let host_routes = k.routes(Side::Host)?;
    for want in &d.host_routes {
        if !route_there(&host_routes, h.index, want) {
            return Err(fail(format!("ptp: host route {} dev {} is missing", want.dst, h.name)));
        }
    }
    if conf.ip_masq {
        if let Some(why) = k.masq_missing(a, &d.masq)? {
            if !upstream_masq()? {
                return Err(fail(format!("ptp: masquerading of {ifname}: {why}")));
            }
        }
    }
    Ok(())
}
