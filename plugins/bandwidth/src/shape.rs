//! The kernel side: finding the host end of the container's veth, building the two token
//! buckets and the ifb, taking them down again, and checking them.
//!
//! ```text
//!  container ──eth0══veth══▶ host veth ── root tbf 1: ──▶ (into the container: "ingress")
//!                              │
//!                              └ ingress qdisc ffff: ─ u32 match-all ─ mirred egress redirect
//!                                                                       │
//!                                             ifb bwp<hash> ── root tbf 1: ──▶ (out of the container: "egress")
//! ```

use std::time::Duration;

use cni_common::attachment::AttachmentId;

use crate::identity::{IfbIdentity, IfbOwner};
use cni_common::mac::Mac;
use cni_common::netlink::tc::{self, Filter, Psched, Qdisc, Tbf, INGRESS_HANDLE, TC_H_INGRESS, TC_H_ROOT};
use cni_common::netlink::{Link, LinkKind, LinkSpec, Netlink, NlError};
use cni_common::spec::result::{CniResult, Interface};
use cni_common::{CniError, Context, Result};

use crate::config::{Limits, Shape};

/// Upstream's queueing latency: `limit = rate × 25 ms + burst`.
pub const LATENCY: Duration = Duration::from_millis(25);
/// Handle of both token bucket qdiscs.
pub const TBF_HANDLE: u32 = tc::handle(1, 0);
/// Priority of the redirect filter.
pub const FILTER_PRIO: u16 = 1;
/// The two token buckets to build, in kernel units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Plan {
    pub ingress: Option<Tbf>,
    pub egress: Option<Tbf>,
}

impl Plan {
    /// The buckets for `limits` on devices of `mtu` (the host veth's; the ifb gets the same),
    /// which sizes a default burst.
    pub fn new(limits: &Limits, mtu: u32) -> Result<Plan> {
        if limits.is_empty() {
            return Ok(Plan::default());
        }
        let psched =
            Psched::read().map_err(|e| CniError::io(format!("read the packet scheduler clock: {e}")))?;
        let tbf = |s: &Shape| Tbf::with_latency(s.rate_bytes(), s.burst_bytes(mtu), LATENCY, &psched);
        Ok(Plan { ingress: limits.ingress.as_ref().map(tbf), egress: limits.egress.as_ref().map(tbf) })
    }
}

/// The host end of the veth whose container end is `ifname`: the container end must be a veth
/// whose peer lives in another namespace, and the link with that index here must be a veth
/// whose own peer is the container end (the index alone could name an unrelated device of
/// this namespace when the peer is in a third one).
pub fn host_veth(host: &mut Netlink, ctr: &mut Netlink, ifname: &str) -> Result<Link> {
    let c = ctr
        .link_by_name(ifname)?
        .ok_or_else(|| CniError::internal(format!("container interface {ifname} not found in CNI_NETNS")))?;
    let no_peer =
        || CniError::internal(format!("container interface {ifname} has no veth peer in the host namespace"));
    if c.kind.as_deref() != Some("veth") {
        return Err(CniError::internal(format!(
            "container interface {ifname} is a {} device, not a veth: bandwidth only shapes veth-attached containers",
            c.kind.as_deref().unwrap_or("plain")
        )));
    }
    let (Some(peer), Some(_)) = (c.link, c.link_netnsid) else { return Err(no_peer()) };
    let h = host.link_by_index(peer)?.ok_or_else(no_peer)?;
    if h.kind.as_deref() != Some("veth") || h.link != Some(c.index) || h.link_netnsid.is_none() {
        return Err(no_peer());
    }
    Ok(h)
}

/// The host veth must be listed in prevResult as a host-side interface (upstream's rule; it
/// picks the right one when several veths are listed).
pub fn require_listed(veth: &Link, prev: &CniResult, ifname: &str) -> Result<()> {
    if prev.interfaces.is_empty() {
        return Err(CniError::config(
            "prevResult lists no interfaces: bandwidth must be chained after a plugin that creates a veth \
             pair and reports its host end (bridge, ptp)",
        ));
    }
    if prev.interfaces.iter().any(|i| i.sandbox.is_empty() && i.name == veth.name) {
        return Ok(());
    }
    Err(CniError::config(format!(
        "the host end {} of container interface {ifname} is not among prevResult's host interfaces [{}]",
        veth.name,
        prev.interfaces
            .iter()
            .filter(|i| i.sandbox.is_empty())
            .map(|i| i.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    )))
}

fn root_tbf(qdiscs: &[Qdisc]) -> Option<&Qdisc> {
    qdiscs.iter().find(|q| q.is_root() && q.kind == "tbf" && q.handle == TBF_HANDLE)
}

/// Whether the ingress qdisc of a host veth carries only our kind of filter: every action
/// redirects to `ifb` (or to a device that no longer exists, e.g. an ifb already deleted).
fn ingress_filters_are_ours(host: &mut Netlink, filters: &[Filter], ifb: Option<u32>) -> Result<bool> {
    for f in filters {
        for a in &f.actions {
            let tc::FilterAction::Mirred { ifindex, .. } = a else { return Ok(false) };
            // The kernel reports index 0 once the target device is gone.
            if *ifindex != 0 && Some(*ifindex) != ifb && host.link_by_index(*ifindex)?.is_some() {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

/// Remove the shaping of a host veth: the root tbf `1:`, and the ingress qdisc when its filters
/// are ours (see [`ingress_filters_are_ours`]). Anything else is left alone. Idempotent.
pub fn clear_veth(host: &mut Netlink, veth: &Link, ifb: Option<u32>) -> Result<()> {
    let qdiscs = host.qdiscs(Some(veth.index))?;
    if root_tbf(&qdiscs).is_some() {
        host.qdisc_del(veth.index, TC_H_ROOT, TBF_HANDLE)?;
    }
    if qdiscs.iter().any(|q| q.is_ingress() && q.handle == INGRESS_HANDLE) {
        let filters = host.filters(veth.index, INGRESS_HANDLE)?;
        if ingress_filters_are_ours(host, &filters, ifb)? {
            host.qdisc_del(veth.index, TC_H_INGRESS, INGRESS_HANDLE)?;
        } else {
            eprintln!(
                "bandwidth: leaving the ingress qdisc of {}: it has filters that do not redirect to this attachment's ifb",
                veth.name
            );
        }
    }
    Ok(())
}

/// What an existing link called like our ifb is.
pub enum Existing {
    None,
    /// Ours for this attachment, or upstream's (no record) for this network + container:
    /// a leftover that may be replaced.
    Stale(Link),
    /// Someone else's: must not be touched.
    Foreign(String),
}

pub fn existing_ifb(host: &mut Netlink, name: &str, att: &AttachmentId) -> Result<Existing> {
    let Some(l) = host.link_by_name(name)? else { return Ok(Existing::None) };
    if l.kind.as_deref() != Some("ifb") {
        let why =
            format!("{name} exists and is a {} device, not an ifb", l.kind.as_deref().unwrap_or("plain"));
        return Ok(Existing::Foreign(why));
    }
    match l.alias.as_deref().map(IfbOwner::parse) {
        // No record: made by upstream's plugin, whose name encodes this network + container.
        None => Ok(Existing::Stale(l)),
        Some(None) => Ok(Existing::Foreign(format!("{name} has an alias not written by this plugin"))),
        Some(Some(o)) if o.is(att) => Ok(Existing::Stale(l)),
        Some(Some(o)) => {
            let why = format!(
                "{name} already shapes {} of network {} (the ifb name is derived from network and container id \
                 only, so one container can have one egress-shaped interface per network)",
                match (&o.container_id, &o.ifname) {
                    (Some(c), Some(i)) => format!("container {c} interface {i}"),
                    (Some(c), None) => format!("container {c}"),
                    _ => "an attachment".into(),
                },
                o.network
            );
            Ok(Existing::Foreign(why))
        }
    }
}

/// Undo log of one ADD: everything it created, removed again in reverse order on failure.
#[derive(Default)]
struct Undo {
    veth_root: Option<u32>,
    veth_ingress: Option<u32>,
    ifb: Option<String>,
}

impl Undo {
    fn run(self, host: &mut Netlink) {
        let report = |r: std::result::Result<bool, NlError>| {
            if let Err(e) = r {
                eprintln!("bandwidth: rollback: {e}");
            }
        };
        if let Some(i) = self.veth_ingress {
            report(host.qdisc_del(i, TC_H_INGRESS, INGRESS_HANDLE));
        }
        if let Some(name) = &self.ifb {
            report(host.link_del_by_name(name));
        }
        if let Some(i) = self.veth_root {
            report(host.qdisc_del(i, TC_H_ROOT, TBF_HANDLE));
        }
    }
}

/// Build the shaping for `veth`; returns the ifb (when egress is shaped). On failure, whatever
/// was built is removed again.
pub fn add(
    host: &mut Netlink,
    veth: &Link,
    plan: &Plan,
    ifb_name: &str,
    att: &AttachmentId,
) -> Result<Option<Link>> {
    // Leftovers of an earlier ADD of this attachment (a runtime retrying without DEL) are
    // replaced; anything else blocks before the kernel is touched.
    let stale_ifb = match existing_ifb(host, ifb_name, att)? {
        Existing::Foreign(why) if plan.egress.is_some() => {
            return Err(CniError::internal(format!("cannot create ifb: {why}")))
        }
        Existing::Stale(l) => Some(l),
        _ => None,
    };
    let qdiscs = host.qdiscs(Some(veth.index))?;
    if plan.ingress.is_some() {
        if let Some(q) = qdiscs.iter().find(|q| q.is_root() && q.handle != 0 && q.handle != TBF_HANDLE) {
            return Err(CniError::internal(format!(
                "host veth {} already has a root qdisc {} {}: not replacing it",
                veth.name,
                q.kind,
                tc::handle_str(q.handle)
            )));
        }
    }
    let stale_index = stale_ifb.as_ref().map(|l| l.index);
    if plan.egress.is_some() && qdiscs.iter().any(|q| q.is_ingress() && q.handle == INGRESS_HANDLE) {
        let filters = host.filters(veth.index, INGRESS_HANDLE)?;
        if !ingress_filters_are_ours(host, &filters, stale_index)? {
            return Err(CniError::internal(format!(
                "host veth {} already has an ingress qdisc with filters of someone else: not replacing it",
                veth.name
            )));
        }
    }
    clear_veth(host, veth, stale_index)?;
    if let Some(l) = &stale_ifb {
        host.link_del(l.index).context(format_args!("remove leftover ifb {ifb_name}"))?;
    }

    let mut undo = Undo::default();
    let r = build(host, veth, plan, ifb_name, att, &mut undo);
    if r.is_err() {
        undo.run(host);
    }
    r
}

fn build(
    host: &mut Netlink,
    veth: &Link,
    plan: &Plan,
    ifb_name: &str,
    att: &AttachmentId,
    undo: &mut Undo,
) -> Result<Option<Link>> {
    if let Some(t) = &plan.ingress {
        host.qdisc_add_tbf(veth.index, TBF_HANDLE, TC_H_ROOT, t)
            .context(format_args!("shape traffic into the container on {}", veth.name))?;
        undo.veth_root = Some(veth.index);
    }
    let Some(t) = &plan.egress else { return Ok(None) };
    let spec = LinkSpec {
        mtu: Some(veth.mtu),
        up: true,
        // upstream: the veth's queue length, at least 1000
        txqlen: Some(veth.txqlen.max(1000)),
        alias: Some(att.ifb_alias()),
        group: Some(att.ifb_group()),
        ..LinkSpec::new(ifb_name, LinkKind::Ifb)
    };
    let ifb = host.link_add(&spec).context("create ifb for traffic out of the container")?;
    undo.ifb = Some(ifb_name.to_string());
    // The bucket first, then the redirect: traffic never reaches an unshaped ifb.
    host.qdisc_add_tbf(ifb.index, TBF_HANDLE, TC_H_ROOT, t)
        .context(format_args!("shape traffic out of the container on {ifb_name}"))?;
    host.qdisc_add_ingress(veth.index)?;
    undo.veth_ingress = Some(veth.index);
    host.filter_add_redirect(veth.index, INGRESS_HANDLE, FILTER_PRIO, ifb.index)?;
    Ok(Some(ifb))
}

/// The result interface for the ifb.
pub fn ifb_interface(ifb: &Link) -> Interface {
    Interface { name: ifb.name.clone(), mac: Mac::text(ifb.mac), ..Default::default() }
}

/// Delete the ifb `name` if it belongs to `att` (or carries no record, as upstream's do).
/// Missing is fine.
pub fn del_ifb(host: &mut Netlink, name: &str, att: &AttachmentId) -> Result<()> {
    match existing_ifb(host, name, att)? {
        Existing::None => Ok(()),
        Existing::Stale(l) => match host.link_del(l.index) {
            Err(e) if !e.is_not_found() => Err(CniError::from(e).context(format_args!("delete ifb {name}"))),
            _ => Ok(()),
        },
        Existing::Foreign(why) => {
            eprintln!("bandwidth: not deleting {name}: {why}");
            Ok(())
        }
    }
}

fn describe(t: &Tbf, p: &Psched) -> String {
    format!("rate {} B/s, burst {} B, limit {} B", t.rate, t.burst_bytes(p), t.limit)
}

fn check_tbf(qdiscs: &[Qdisc], dev: &str, want: &Tbf, what: &str) -> Result<()> {
    let p = Psched::read().map_err(|e| CniError::io(format!("read the packet scheduler clock: {e}")))?;
    let Some(q) = root_tbf(qdiscs) else {
        let root = qdiscs
            .iter()
            .find(|q| q.is_root())
            .map_or("none".into(), |q| format!("{} {}", q.kind, tc::handle_str(q.handle)));
        return Err(CniError::internal(format!(
            "{what}: no tbf qdisc 1: at the root of {dev} (root qdisc: {root})"
        )));
    };
    match &q.tbf {
        Some(got) if got == want => Ok(()),
        Some(got) => Err(CniError::internal(format!(
            "{what}: tbf on {dev} has {}, expected {}",
            describe(got, &p),
            describe(want, &p)
        ))),
        None => Err(CniError::internal(format!("{what}: cannot read the tbf parameters of {dev}"))),
    }
}

/// CHECK: both token buckets, the ifb and the redirect filter are there with the expected
/// values.
pub fn check(host: &mut Netlink, veth: &Link, plan: &Plan, ifb_name: &str, att: &AttachmentId) -> Result<()> {
    let veth_q = host.qdiscs(Some(veth.index))?;
    if let Some(want) = &plan.ingress {
        check_tbf(&veth_q, &veth.name, want, "traffic into the container")?;
    }
    let Some(want) = &plan.egress else { return Ok(()) };
    let ifb = match existing_ifb(host, ifb_name, att)? {
        Existing::Stale(l) => l,
        Existing::None => return Err(CniError::internal(format!("ifb {ifb_name} not found"))),
        Existing::Foreign(why) => return Err(CniError::internal(why)),
    };
    if !ifb.up() {
        return Err(CniError::internal(format!("ifb {ifb_name} is down")));
    }
    check_tbf(&host.qdiscs(Some(ifb.index))?, ifb_name, want, "traffic out of the container")?;
    if !veth_q.iter().any(|q| q.is_ingress() && q.handle == INGRESS_HANDLE) {
        return Err(CniError::internal(format!("no ingress qdisc ffff: on {}", veth.name)));
    }
    let filters = host.filters(veth.index, INGRESS_HANDLE)?;
    let redirects = filters.iter().any(|f| {
        f.kind == "u32"
            && f.match_all
            && f.protocol == tc::ETH_P_ALL
            && f.actions.iter().any(|a| a.is_egress_redirect_to(ifb.index))
    });
    if !redirects {
        return Err(CniError::internal(format!(
            "no u32 match-all filter on {} ffff: redirecting to {ifb_name} (found {} filter(s))",
            veth.name,
            filters.len()
        )));
    }
    Ok(())
}
