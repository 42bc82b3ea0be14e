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

#![warn(clippy::too_many_lines)]

pub mod config;
pub mod identity;
pub mod resync;
pub mod shape;
pub mod upstream;

use cni_common::attachment::AttachmentId;
use cni_common::error_list::ErrorList;
use cni_common::netlink::{Link, Netlink};
use cni_common::spec::result::CniResult;
use cni_common::{code, CniError, Plugin, Request, Result, Version};
use identity::{ifb_group, IfbIdentity, IfbOwner};

use shape::Plan;

pub struct Bandwidth;

/// Upstream supports 0.3.0 and later (results need `interfaces`).
const VERSIONS: [Version; 5] =
    [Version::V0_3_0, Version::V0_3_1, Version::V0_4_0, Version::V1_0_0, Version::V1_1_0];

/// The host veth of the attachment (checked to be listed in `prev`), a host socket, and the
/// buckets for `limits` on it: what ADD builds and CHECK compares.
pub fn shaped_veth(
    req: &Request,
    prev: &CniResult,
    limits: &config::Limits,
) -> Result<(Netlink, Link, Plan)> {
    let ns = req.require_netns()?;
    let mut host = Netlink::new()?;
    let mut ctr = Netlink::new_in(&ns)?;
    let veth = shape::host_veth(&mut host, &mut ctr, &req.env.ifname)?;
    shape::require_listed(&veth, prev, &req.env.ifname)?;
    let plan = Plan::new(limits, veth.mtu)?;
    Ok((host, veth, plan))
}

/// Remove the shaping of the host veth whose container end is `ifname` in the namespace at
/// `path`, if the namespace still exists.
fn clear_host_veth(host: &mut Netlink, req: &Request, ifname: &str, ifb: Option<u32>) -> Result<()> {
    let Some(ns) = req.container_netns()? else { return Ok(()) };
    let mut ctr = Netlink::new_in(&ns)?;
    match shape::host_veth(host, &mut ctr, ifname) {
        Ok(veth) => shape::clear_veth(host, &veth, ifb),
        // The container end or its peer is gone: so are the host veth's qdiscs.
        Err(e) => {
            eprintln!("bandwidth: DEL: no host veth to clear: {}", e.msg);
            Ok(())
        }
    }
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
        let (mut host, veth, plan) = shaped_veth(req, &result, &limits)?;
        let att = AttachmentId::of(req);
        if let Some(ifb) = shape::add(&mut host, &veth, &plan, &att.ifb_name(), &att)? {
            result.interfaces.push(shape::ifb_interface(&ifb));
        }
        Ok(result)
    }

    /// Remove the ifb (by name, so also upstream's) and, while the container's netns still
    /// exists, the qdiscs on the host veth. The configuration's limits are not needed (and not
    /// validated): cleanup must not depend on them. Every step is tried; errors are collected.
    fn del(&self, req: &Request) -> Result<()> {
        let att = AttachmentId::of(req);
        let name = att.ifb_name();
        let mut host = Netlink::new()?;
        let mut errors = ErrorList::new();
        let ifb = match errors.take(shape::existing_ifb(&mut host, &name, &att)) {
            Some(shape::Existing::Stale(l)) => Some(l.index),
            _ => None,
        };
        errors.take(clear_host_veth(&mut host, req, &req.env.ifname, ifb));
        errors.take(shape::del_ifb(&mut host, &name, &att));
        errors.finish()
    }

    fn check(&self, req: &Request) -> Result<()> {
        let limits = config::limits(&req.config)?;
        let prev = req.prev_result()?.ok_or_else(|| {
            CniError::config("bandwidth must be called as a chained plugin: CHECK needs prevResult")
        })?;
        if limits.is_empty() {
            return Ok(());
        }
        let (mut host, veth, plan) = shaped_veth(req, &prev, &limits)?;
        let att = AttachmentId::of(req);
        shape::check(&mut host, &veth, &plan, &att.ifb_name(), &att)
    }

    /// Delete this network's ifbs whose attachment is not in the valid list. Only ifbs whose
    /// alias records this network are considered, plus alias-less ones in this network's device
    /// group (an ADD killed between creating the ifb and writing its alias): other networks'
    /// ifbs and upstream's (no record, group 0) are never touched. The host veth qdiscs went
    /// with the containers' namespaces.
    fn gc(&self, req: &Request) -> Result<()> {
        let valid = AttachmentId::valid_list(req)?;
        let net = req.network();
        let mut host = Netlink::new()?;
        let mut errors = ErrorList::new();
        for link in host.links()? {
            if link.kind.as_deref() != Some("ifb") || !link.name.starts_with("bwp") {
                continue;
            }
            let alive = match link.alias.as_deref() {
                Some(alias) => {
                    let Some(o) = IfbOwner::parse(alias) else { continue };
                    if o.network != net {
                        continue;
                    }
                    valid.iter().any(|a| o.is(a) && a.ifb_name() == link.name)
                }
                // No alias: ours only if created in this network's group. Then it is alive
                // only if a valid attachment's ifb has this name (its ADD is being retried).
                None if link.group == ifb_group(net) => valid.iter().any(|a| a.ifb_name() == link.name),
                None => continue,
            };
            if alive {
                continue;
            }
            // Gone already (its attachment's DEL got there first): nothing to do.
            match host.link_del(link.index) {
                Ok(()) => eprintln!(
                    "bandwidth: GC: deleted ifb {} ({})",
                    link.name,
                    link.alias.as_deref().unwrap_or("")
                ),
                Err(e) if e.is_not_found() => {}
                Err(e) => {
                    errors.push(CniError::from(e).context(format_args!("GC: delete ifb {}", link.name)))
                }
            }
        }
        // ifbs made by upstream's bandwidth (no owner record): removed when nothing uses them.
        if let Err(e) = upstream::gc(&mut host, net, &valid) {
            errors.push(e);
        }
        errors.finish()
    }

    /// Ready when the packet scheduler clock can be read (ADD needs it to size the buckets).
    fn status(&self, _req: &Request) -> Result<()> {
        cni_common::netlink::tc::Psched::read()
            .map(drop)
            .map_err(|e| CniError::new(code::NOT_AVAILABLE, format!("cannot read /proc/net/psched: {e}")))
    }
}
