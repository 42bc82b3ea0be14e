//! `loopback`: set `lo` up in the container's network namespace (ADD), down again (DEL).
//!
//! No host-side state at all, so GC and STATUS have nothing to do. Unlike upstream, the result
//! is shaped for the config's version (upstream prints a 1.x-shaped document labelled 0.2.0),
//! and CHECK requires prevResult as the spec says (upstream's does not).

#![warn(clippy::too_many_lines)]

cni_common::global_allocator!();

use cni_common::netlink::Netlink;
use cni_common::netns::NetNs;
use cni_common::spec::result::{CniResult, Interface, IpConfig};
use cni_common::{CniError, Context, Plugin, Request, Result};

struct Loopback;

fn open_netns(req: &Request) -> Result<std::sync::Arc<NetNs>> {
    req.require_netns()
}

/// Addresses on `lo` after bringing it up; all must be loopback addresses.
fn bring_up(ns: &NetNs) -> Result<Vec<ipnet::IpNet>> {
    let mut nl = Netlink::new_in(ns)?;
    let lo =
        nl.link_by_name("lo")?.ok_or_else(|| CniError::internal("no lo interface in the container netns"))?;
    nl.link_set_up(lo.index).context("set lo up")?;
    let addrs: Vec<ipnet::IpNet> = nl.addrs(Some(lo.index), None)?.into_iter().map(|a| a.addr).collect();
    if let Some(bad) = addrs.iter().find(|a| !a.addr().is_loopback()) {
        return Err(CniError::internal(format!("loopback interface found with non-loopback address {bad}")));
    }
    Ok(addrs)
}

impl Plugin for Loopback {
    fn name(&self) -> &'static str {
        "loopback"
    }

    fn add(&self, req: &Request) -> Result<CniResult> {
        // Decode everything before touching the namespace: bad input changes nothing.
        let prev = req.prev_result()?;
        let ns = open_netns(req)?;
        let addrs = bring_up(&ns)?;
        if let Some(prev) = prev {
            return Ok(prev);
        }
        let mut result = CniResult {
            interfaces: vec![Interface {
                name: "lo".into(),
                mac: "00:00:00:00:00:00".into(),
                sandbox: req.env.netns.clone(),
                ..Default::default()
            }],
            ..Default::default()
        };
        for want_v4 in [true, false] {
            if let Some(a) = addrs.iter().find(|a| a.addr().is_ipv4() == want_v4) {
                result.ips.push(IpConfig { interface: Some(0), address: *a, gateway: None });
            }
        }
        Ok(result)
    }

    fn del(&self, req: &Request) -> Result<()> {
        let Some(ns) = req.container_netns()? else { return Ok(()) };
        let mut nl = Netlink::new_in(&ns)?;
        if let Some(lo) = nl.link_by_name("lo")? {
            nl.link_set_down(lo.index).context("set lo down")?;
        }
        Ok(())
    }

    /// `lo` must be up. prevResult is required, as for every CHECK (spec 1.11; upstream's
    /// loopback does not ask for it).
    fn check(&self, req: &Request) -> Result<()> {
        req.prev_result()?.ok_or_else(|| CniError::config("Required prevResult missing"))?;
        let ns = open_netns(req)?;
        let mut nl = Netlink::new_in(&ns)?;
        let lo = nl
            .link_by_name("lo")?
            .ok_or_else(|| CniError::internal("no lo interface in the container netns"))?;
        if !lo.up() {
            return Err(CniError::internal("loopback interface is down"));
        }
        Ok(())
    }

    fn gc(&self, _req: &Request) -> Result<()> {
        Ok(()) // no state outside the container's namespace
    }

    fn status(&self, _req: &Request) -> Result<()> {
        Ok(()) // nothing can make loopback unavailable
    }
}

fn main() {
    cni_common::skel::run(&Loopback)
}
