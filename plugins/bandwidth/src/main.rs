//! `bandwidth`: limit a veth-attached container's traffic with token bucket filters.
//!
//! Chained after a plugin that creates a veth pair (bridge, ptp). Traffic into the container is
//! shaped by a tbf at the root of the host veth; traffic out of the container arrives on the
//! host veth's *ingress*, where tc cannot shape, so a u32 filter redirects it to an ifb whose
//! root tbf shapes it. Everything goes through rtnetlink (see `cni_common::netlink::tc`).
//!
//! Beyond upstream: DEL also removes the qdiscs on the host veth when the container's netns is
//! still there, GC removes ifbs of this network's vanished attachments (ownership is recorded in
//! the ifb's alias), CHECK compares the real rate, burst and limit of both buckets and the
//! filter, and STATUS checks that the packet scheduler clock is readable.

mod config;
mod shape;

use cni_common::netlink::Netlink;
use cni_common::netns::NetNs;
use cni_common::spec::result::CniResult;
use cni_common::{code, CniError, Plugin, Request, Result, Version};

use shape::{Owner, Plan};

struct Bandwidth;

/// Upstream supports 0.3.0 and later (results need `interfaces`).
const VERSIONS: [Version; 5] =
    [Version::V0_3_0, Version::V0_3_1, Version::V0_4_0, Version::V1_0_0, Version::V1_1_0];

fn owner(req: &Request) -> Owner {
    Owner::new(req.network(), &req.env.container_id, &req.env.ifname)
}

fn ifb_name(req: &Request) -> String {
    shape::ifb_name(req.network(), &req.env.container_id)
}

fn open_netns(req: &Request) -> Result<NetNs> {
    let path = req.netns().ok_or_else(|| CniError::env("CNI_NETNS is required"))?;
    NetNs::open(path)
}

/// Several errors of a best-effort verb as one: the first, with the others in `details`.
fn combine(mut errors: Vec<CniError>) -> Result<()> {
    if errors.is_empty() {
        return Ok(());
    }
    let first = errors.remove(0);
    if errors.is_empty() {
        return Err(first);
    }
    let rest: Vec<String> = errors.into_iter().map(|e| e.msg).collect();
    Err(first.with_details(format!("also: {}", rest.join("; "))))
}

impl Plugin for Bandwidth {
    fn name(&self) -> &'static str {
        "bandwidth"
    }

    fn supported_versions(&self) -> &'static [Version] {
        &VERSIONS
    }

    fn add(&self, req: &Request) -> Result<CniResult> {
        let limits = config::limits(&req.config)?;
        let prev = req.prev_result()?;
        if limits.is_empty() {
            return Ok(prev.unwrap_or_default());
        }
        let mut result = prev.ok_or_else(|| {
            CniError::config(
                "bandwidth must be called as a chained plugin: the configuration has no prevResult",
            )
        })?;
        let plan = Plan::new(&limits)?;
        let ns = open_netns(req)?;
        let mut host = Netlink::new()?;
        let mut ctr = Netlink::new_in(&ns)?;
        let veth = shape::host_veth(&mut host, &mut ctr, &req.env.ifname)?;
        shape::require_listed(&veth, &result, &req.env.ifname)?;
        if let Some(ifb) = shape::add(&mut host, &veth, &plan, &ifb_name(req), &owner(req))? {
            result.interfaces.push(shape::ifb_interface(&ifb));
        }
        Ok(result)
    }

    /// Remove the ifb (by name, so also upstream's) and, while the container's netns still
    /// exists, the qdiscs on the host veth. The configuration's limits are not needed (and not
    /// validated): cleanup must not depend on them.
    fn del(&self, req: &Request) -> Result<()> {
        let name = ifb_name(req);
        let owner = owner(req);
        let mut host = Netlink::new()?;
        let mut errors = Vec::new();
        let ifb = match shape::existing_ifb(&mut host, &name, &owner)? {
            shape::Existing::Stale(l) => Some(l.index),
            _ => None,
        };
        if let Some(path) = req.netns() {
            if let Some(ns) = NetNs::open_if_exists(path)? {
                let mut ctr = Netlink::new_in(&ns)?;
                match shape::host_veth(&mut host, &mut ctr, &req.env.ifname) {
                    Ok(veth) => {
                        if let Err(e) = shape::clear_veth(&mut host, &veth, ifb) {
                            errors.push(e);
                        }
                    }
                    // The container end or its peer is gone: so are the host veth's qdiscs.
                    Err(e) => eprintln!("bandwidth: DEL: no host veth to clear: {}", e.msg),
                }
            }
        }
        if let Err(e) = shape::del_ifb(&mut host, &name, &owner) {
            errors.push(e);
        }
        combine(errors)
    }

    fn check(&self, req: &Request) -> Result<()> {
        let limits = config::limits(&req.config)?;
        let prev = req.prev_result()?.ok_or_else(|| {
            CniError::config("bandwidth must be called as a chained plugin: CHECK needs prevResult")
        })?;
        if limits.is_empty() {
            return Ok(());
        }
        let plan = Plan::new(&limits)?;
        let ns = open_netns(req)?;
        let mut host = Netlink::new()?;
        let mut ctr = Netlink::new_in(&ns)?;
        let veth = shape::host_veth(&mut host, &mut ctr, &req.env.ifname)?;
        shape::require_listed(&veth, &prev, &req.env.ifname)?;
        shape::check(&mut host, &veth, &plan, &ifb_name(req), &owner(req))
    }

    /// Delete this network's ifbs whose attachment is not in the valid list. Only ifbs whose
    /// alias records this network are considered, plus alias-less ones in this network's device
    /// group (an ADD killed between creating the ifb and writing its alias): other networks'
    /// ifbs and upstream's (no record, group 0) are never touched. The host veth qdiscs went
    /// with the containers' namespaces.
    fn gc(&self, req: &Request) -> Result<()> {
        let valid = req.valid_attachments()?;
        let net = req.network();
        let mut host = Netlink::new()?;
        let mut errors = Vec::new();
        for link in host.links()? {
            if link.kind.as_deref() != Some("ifb") || !link.name.starts_with("bwp") {
                continue;
            }
            let alive = match link.alias.as_deref() {
                Some(alias) => {
                    let Some(o) = Owner::parse(alias) else { continue };
                    if o.network != net {
                        continue;
                    }
                    valid.iter().any(|a| {
                        o.is(net, &a.container_id, &a.ifname)
                            && shape::ifb_name(net, &a.container_id) == link.name
                    })
                }
                // No alias: ours only if created in this network's group. Then it is alive
                // only if a valid attachment's ifb has this name (its ADD is being retried).
                None if link.group == shape::owner_group(net) => {
                    valid.iter().any(|a| shape::ifb_name(net, &a.container_id) == link.name)
                }
                None => continue,
            };
            if alive {
                continue;
            }
            match host.link_del(link.index) {
                Err(e) if !e.is_not_found() => {
                    errors.push(CniError::from(e).context(format_args!("GC: delete ifb {}", link.name)))
                }
                _ => eprintln!(
                    "bandwidth: GC: deleted ifb {} ({})",
                    link.name,
                    link.alias.as_deref().unwrap_or("")
                ),
            }
        }
        // ifbs made by upstream's bandwidth (no owner record): removed when nothing uses them.
        if let Err(e) = cni_common::upstream::ifb::gc(&mut host, net, &valid) {
            errors.push(e);
        }
        combine(errors)
    }

    /// Ready when the packet scheduler clock can be read (ADD needs it to size the buckets).
    fn status(&self, _req: &Request) -> Result<()> {
        cni_common::netlink::tc::Psched::read()
            .map(drop)
            .map_err(|e| CniError::new(code::NOT_AVAILABLE, format!("cannot read /proc/net/psched: {e}")))
    }
}

fn main() {
    cni_common::skel::run(&Bandwidth)
}
