//! The kernel side, through the seam ([`Kernel`]): finding the host end of the container's
//! veth, reading what is there, and carrying out what `crate::plan` decides: building the two
//! token buckets and the ifb (undone on failure), taking them down again, and checking them.
//! The layout is drawn in `crate::desired`.

use cni_common::attachment::AttachmentId;
use cni_common::mac::Mac;
use cni_common::netlink::tc::{Filter, Psched, INGRESS_HANDLE, TC_H_INGRESS, TC_H_ROOT};
use cni_common::netlink::{Link, NlError};
use cni_common::spec::result::{CniResult, Interface};
use cni_common::{CniError, Context, Result};

use crate::desired::{Desired, FILTER_PRIO, TBF_HANDLE};
use crate::identity::IfbIdentity;
use crate::kernel::Kernel;
use crate::plan::{self, Existing, Step};

/// The host end of the veth whose container end is `ifname`: the container end must be a veth
/// whose peer lives in another namespace, and the link with that index here must be a veth
/// whose own peer is the container end (the index alone could name an unrelated device of
/// this namespace when the peer is in a third one).
pub fn host_veth(k: &mut dyn Kernel, ifname: &str) -> Result<Link> {
    let c = k
        .ctr_link_by_name(ifname)?
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
    let h = k.link_by_index(peer)?.ok_or_else(no_peer)?;
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

/// The packet scheduler clock, which sizes the buckets.
pub fn psched(k: &mut dyn Kernel) -> Result<Psched> {
    k.psched().map_err(|e| CniError::io(format!("read the packet scheduler clock: {e}")))
}

/// Whose the link called `name` (our ifb's name) is.
pub fn existing_ifb(k: &mut dyn Kernel, name: &str, att: &AttachmentId) -> Result<Existing> {
    Ok(plan::classify_ifb(k.link_by_name(name)?, name, att))
}

/// [`plan::filters_are_ours`], after looking up the devices the filters redirect to.
fn ingress_filters_are_ours(k: &mut dyn Kernel, filters: &[Filter], ifb: Option<u32>) -> Result<bool> {
    let mut live = Vec::new();
    for t in plan::targets_to_look_up(filters) {
        if k.link_by_index(t)?.is_some() {
            live.push(t);
        }
    }
    Ok(plan::filters_are_ours(filters, ifb, &live))
}

/// Remove the shaping of a host veth: the root tbf `1:`, and the ingress qdisc when its filters
/// are ours (see [`plan::filters_are_ours`]). Anything else is left alone. Idempotent.
pub fn clear_veth(k: &mut dyn Kernel, veth: &Link, ifb: Option<u32>) -> Result<()> {
    let qdiscs = k.qdiscs(Some(veth.index))?;
    if plan::root_tbf(&qdiscs).is_some() {
        k.qdisc_del(veth.index, TC_H_ROOT, TBF_HANDLE)?;
    }
    if plan::has_ingress(&qdiscs) {
        let filters = k.filters(veth.index, INGRESS_HANDLE)?;
        if ingress_filters_are_ours(k, &filters, ifb)? {
            k.qdisc_del(veth.index, TC_H_INGRESS, INGRESS_HANDLE)?;
        } else {
            cni_common::log!(
                "bandwidth", "leaving the ingress qdisc of {}: it has filters that do not redirect to this attachment's ifb",
                veth.name
            );
        }
    }
    Ok(())
}

/// Undo log of one ADD: everything it created, removed again in reverse order on failure.
#[derive(Default)]
struct Undo {
    veth_root: Option<u32>,
    veth_ingress: Option<u32>,
    ifb: Option<String>,
}

impl Undo {
    fn run(self, k: &mut dyn Kernel) {
        let report = |r: std::result::Result<bool, NlError>| {
            if let Err(e) = r {
                cni_common::log!("bandwidth", "rollback: {e}");
            }
        };
        if let Some(i) = self.veth_ingress {
            report(k.qdisc_del(i, TC_H_INGRESS, INGRESS_HANDLE));
        }
        if let Some(name) = &self.ifb {
            report(k.link_del_by_name(name));
        }
        if let Some(i) = self.veth_root {
            report(k.qdisc_del(i, TC_H_ROOT, TBF_HANDLE));
        }
    }
}

/// Build the shaping `d` for `veth`; returns the ifb (when egress is shaped). Leftovers of an
/// earlier ADD of this attachment (a runtime retrying without DEL) are replaced; anything else
/// blocks before the kernel is touched. On failure, whatever was built is removed again.
pub fn add(k: &mut dyn Kernel, veth: &Link, d: &Desired, att: &AttachmentId) -> Result<Option<Link>> {
    let ifb_name = att.ifb_name();
    let existing = existing_ifb(k, &ifb_name, att)?;
    let stale = match &existing {
        Existing::Stale(l) => Some(l.index),
        _ => None,
    };
    let qdiscs = k.qdiscs(Some(veth.index))?;
    let ours = if d.egress.is_some() && plan::has_ingress(&qdiscs) {
        let filters = k.filters(veth.index, INGRESS_HANDLE)?;
        Some(ingress_filters_are_ours(k, &filters, stale)?)
    } else {
        None
    };
    plan::add_refusal(d, &veth.name, &existing, &qdiscs, ours)?;
    clear_veth(k, veth, stale)?;
    if let Some(i) = stale {
        k.link_del(i).context(format_args!("remove leftover ifb {ifb_name}"))?;
    }
    let mut undo = Undo::default();
    let r = build(k, veth, &plan::add_steps(d), &mut undo);
    if r.is_err() {
        undo.run(k);
    }
    r
}

fn build(k: &mut dyn Kernel, veth: &Link, steps: &[Step], undo: &mut Undo) -> Result<Option<Link>> {
    let mut ifb: Option<Link> = None;
    for step in steps {
        match step {
            Step::VethTbf(t) => {
                k.qdisc_add_tbf(veth.index, TBF_HANDLE, TC_H_ROOT, t)
                    .context(format_args!("shape traffic into the container on {}", veth.name))?;
                undo.veth_root = Some(veth.index);
            }
            Step::CreateIfb(spec) => {
                ifb = Some(k.create_ifb(spec).context("create ifb for traffic out of the container")?);
                undo.ifb = Some(spec.name.clone());
            }
            Step::IfbTbf(t) => {
                let i = ifb.as_ref().ok_or_else(|| CniError::internal("no ifb to shape"))?;
                k.qdisc_add_tbf(i.index, TBF_HANDLE, TC_H_ROOT, t)
                    .context(format_args!("shape traffic out of the container on {}", i.name))?;
            }
            Step::Ingress => {
                k.qdisc_add_ingress(veth.index)?;
                undo.veth_ingress = Some(veth.index);
            }
            Step::Redirect => {
                let i = ifb.as_ref().ok_or_else(|| CniError::internal("no ifb to redirect to"))?;
                k.filter_add_redirect(veth.index, INGRESS_HANDLE, FILTER_PRIO, i.index)?;
            }
        }
    }
    Ok(ifb)
}

/// The result interface for the ifb.
pub fn ifb_interface(ifb: &Link) -> Interface {
    Interface { name: ifb.name.clone(), mac: Mac::text(ifb.mac), ..Default::default() }
}

/// Delete the ifb `name` if it belongs to `att` (or carries no record, as upstream's do).
/// Missing is fine.
pub fn del_ifb(k: &mut dyn Kernel, name: &str, att: &AttachmentId) -> Result<()> {
    match existing_ifb(k, name, att)? {
        Existing::None => Ok(()),
        Existing::Stale(l) => match k.link_del(l.index) {
            Err(e) if !e.is_not_found() => Err(CniError::from(e).context(format_args!("delete ifb {name}"))),
            _ => Ok(()),
        },
        Existing::Foreign(why) => {
            cni_common::log!("bandwidth", "not deleting {name}: {why}");
            Ok(())
        }
    }
}

/// CHECK: both token buckets, the ifb and the redirect filter are there with the expected
/// values (each compared by [`plan`]'s checks, in this order).
pub fn check(k: &mut dyn Kernel, veth: &Link, d: &Desired, att: &AttachmentId, p: &Psched) -> Result<()> {
    let veth_q = k.qdiscs(Some(veth.index))?;
    if let Some(want) = &d.ingress {
        plan::check_tbf(&veth_q, &veth.name, want, "traffic into the container", p)?;
    }
    let Some(e) = &d.egress else { return Ok(()) };
    let ifb = plan::check_ifb(existing_ifb(k, &e.ifb.name, att)?, &e.ifb.name)?;
    let ifb_q = k.qdiscs(Some(ifb.index))?;
    plan::check_tbf(&ifb_q, &e.ifb.name, &e.tbf, "traffic out of the container", p)?;
    plan::check_ingress(&veth_q, &veth.name)?;
    plan::check_redirect(&k.filters(veth.index, INGRESS_HANDLE)?, &veth.name, &ifb)
}
