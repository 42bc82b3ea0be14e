//! What to do, from the desired state and what was read (pure): whose an ifb of our name is,
//! whether the host veth's ingress filters are ours, what blocks ADD, ADD's steps, CHECK's
//! comparison one object at a time, and which ifbs GC removes. `crate::shape` reads the kernel
//! and carries the steps out through the seam.

use cni_common::attachment::AttachmentId;
use cni_common::netlink::tc::{self, Filter, FilterAction, Psched, Qdisc, Tbf, INGRESS_HANDLE};
use cni_common::netlink::Link;
use cni_common::{CniError, Result};

use crate::desired::{Desired, TBF_HANDLE};
use crate::identity::{ifb_group, IfbIdentity, IfbOwner};
use crate::kernel::IfbSpec;

/// What an existing link called like our ifb is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Existing {
    None,
    /// Ours for this attachment, or upstream's (no record) for this network + container:
    /// a leftover that may be replaced.
    Stale(Link),
    /// Someone else's: must not be touched.
    Foreign(String),
}

/// Whose the link `found` (looked up by our ifb's `name`) is.
pub fn classify_ifb(found: Option<Link>, name: &str, att: &AttachmentId) -> Existing {
    let Some(l) = found else { return Existing::None };
    if l.kind.as_deref() != Some("ifb") {
        let why =
            format!("{name} exists and is a {} device, not an ifb", l.kind.as_deref().unwrap_or("plain"));
        return Existing::Foreign(why);
    }
    match l.alias.as_deref().map(IfbOwner::parse) {
        // No record: made by upstream's plugin, whose name encodes this network + container.
        None => Existing::Stale(l),
        Some(None) => Existing::Foreign(format!("{name} has an alias not written by this plugin")),
        Some(Some(o)) if o.is(att) => Existing::Stale(l),
        Some(Some(o)) => Existing::Foreign(format!(
            "{name} already shapes {} of network {} (the ifb name is derived from network and container id \
             only, so one container can have one egress-shaped interface per network)",
            match (&o.container_id, &o.ifname) {
                (Some(c), Some(i)) => format!("container {c} interface {i}"),
                (Some(c), None) => format!("container {c}"),
                _ => "an attachment".into(),
            },
            o.network
        )),
    }
}

/// The root tbf `1:` among a link's qdiscs.
pub fn root_tbf(qdiscs: &[Qdisc]) -> Option<&Qdisc> {
    qdiscs.iter().find(|q| q.is_root() && q.kind == "tbf" && q.handle == TBF_HANDLE)
}

/// Whether a link's qdiscs include the ingress qdisc `ffff:`.
pub fn has_ingress(qdiscs: &[Qdisc]) -> bool {
    qdiscs.iter().any(|q| q.is_ingress() && q.handle == INGRESS_HANDLE)
}

/// The redirect targets that must be looked up to judge [`filters_are_ours`]: every mirred
/// target but 0 (the kernel's answer once the target is gone).
pub fn targets_to_look_up(filters: &[Filter]) -> Vec<u32> {
    let mut out: Vec<u32> = filters
        .iter()
        .flat_map(|f| &f.actions)
        .filter_map(|a| match a {
            FilterAction::Mirred { ifindex, .. } if *ifindex != 0 => Some(*ifindex),
            _ => None,
        })
        .collect();
    out.dedup();
    out
}

/// Whether the ingress qdisc of a host veth carries only our kind of filter: every action
/// redirects to `ifb`, or to a device not among `live` (e.g. an ifb already deleted; `live`:
/// those of [`targets_to_look_up`] that exist).
pub fn filters_are_ours(filters: &[Filter], ifb: Option<u32>, live: &[u32]) -> bool {
    filters.iter().flat_map(|f| &f.actions).all(|a| match a {
        FilterAction::Mirred { ifindex, .. } => {
            *ifindex == 0 || Some(*ifindex) == ifb || !live.contains(ifindex)
        }
        FilterAction::Other(_) => false,
    })
}

/// ADD's refusals, before the kernel is touched: an ifb of our name that is someone else's
/// (when egress is shaped), another root qdisc on the host veth (when ingress is), an ingress
/// qdisc with someone else's filters (when egress is; `ingress_ours` is `None` when the veth
/// has no ingress qdisc or its filters were not judged).
pub fn add_refusal(
    d: &Desired,
    veth: &str,
    existing: &Existing,
    qdiscs: &[Qdisc],
    ingress_ours: Option<bool>,
) -> Result<()> {
    if let (Existing::Foreign(why), Some(_)) = (existing, &d.egress) {
        return Err(CniError::internal(format!("cannot create ifb: {why}")));
    }
    if d.ingress.is_some() {
        if let Some(q) = qdiscs.iter().find(|q| q.is_root() && q.handle != 0 && q.handle != TBF_HANDLE) {
            return Err(CniError::internal(format!(
                "host veth {veth} already has a root qdisc {} {}: not replacing it",
                q.kind,
                tc::handle_str(q.handle)
            )));
        }
    }
    if d.egress.is_some() && ingress_ours == Some(false) {
        return Err(CniError::internal(format!(
            "host veth {veth} already has an ingress qdisc with filters of someone else: not replacing it"
        )));
    }
    Ok(())
}

/// One change ADD makes, in order. Each is undone on a later failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// The bucket into the container at the root of the host veth.
    VethTbf(Tbf),
    CreateIfb(IfbSpec),
    /// The bucket out of the container at the root of the ifb: before the redirect, so that
    /// traffic never reaches an unshaped ifb.
    IfbTbf(Tbf),
    /// The ingress qdisc of the host veth.
    Ingress,
    /// The u32 filter there redirecting into the ifb.
    Redirect,
}

/// ADD's steps for `d`.
pub fn add_steps(d: &Desired) -> Vec<Step> {
    let mut steps = Vec::new();
    if let Some(t) = d.ingress {
        steps.push(Step::VethTbf(t));
    }
    if let Some(e) = &d.egress {
        steps.extend([Step::CreateIfb(e.ifb.clone()), Step::IfbTbf(e.tbf), Step::Ingress, Step::Redirect]);
    }
    steps
}

fn describe(t: &Tbf, p: &Psched) -> String {
    format!("rate {} B/s, burst {} B, limit {} B", t.rate, t.burst_bytes(p), t.limit)
}

/// CHECK of one bucket: the root tbf `1:` of `dev` (among `qdiscs`) has `want`'s values.
pub fn check_tbf(qdiscs: &[Qdisc], dev: &str, want: &Tbf, what: &str, p: &Psched) -> Result<()> {
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
            describe(got, p),
            describe(want, p)
        ))),
        None => Err(CniError::internal(format!("{what}: cannot read the tbf parameters of {dev}"))),
    }
}

/// CHECK of the ifb: there, ours, up.
pub fn check_ifb(existing: Existing, name: &str) -> Result<Link> {
    let ifb = match existing {
        Existing::Stale(l) => l,
        Existing::None => return Err(CniError::internal(format!("ifb {name} not found"))),
        Existing::Foreign(why) => return Err(CniError::internal(why)),
    };
    if !ifb.up() {
        return Err(CniError::internal(format!("ifb {name} is down")));
    }
    Ok(ifb)
}

/// CHECK of the host veth's ingress qdisc (among `veth_q`), which holds the redirect.
pub fn check_ingress(veth_q: &[Qdisc], veth: &str) -> Result<()> {
    if has_ingress(veth_q) {
        Ok(())
    } else {
        Err(CniError::internal(format!("no ingress qdisc ffff: on {veth}")))
    }
}

/// CHECK of the redirect: one of the host veth's ingress `filters` is a u32 match-all of
/// every protocol redirecting into the ifb.
pub fn check_redirect(filters: &[Filter], veth: &str, ifb: &Link) -> Result<()> {
    let redirects = filters.iter().any(|f| {
        f.kind == "u32"
            && f.match_all
            && f.protocol == tc::ETH_P_ALL
            && f.actions.iter().any(|a| a.is_egress_redirect_to(ifb.index))
    });
    if !redirects {
        return Err(CniError::internal(format!(
            "no u32 match-all filter on {veth} ffff: redirecting to {} (found {} filter(s))",
            ifb.name,
            filters.len()
        )));
    }
    Ok(())
}

/// GC: this network's ifbs (by their alias, or alias-less in this network's device group: an
/// ADD killed between creating the ifb and writing its alias) whose attachment is not in
/// `valid`. Other networks' ifbs and upstream's (no record, group 0) are never chosen.
pub fn gc_victims(links: &[Link], net: &str, valid: &[AttachmentId]) -> Vec<Link> {
    let mut out = Vec::new();
    for link in links {
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
            // No alias: ours only if created in this network's group. Then it is alive only if
            // a valid attachment's ifb has this name (its ADD is being retried).
            None if link.group == ifb_group(net) => valid.iter().any(|a| a.ifb_name() == link.name),
            None => continue,
        };
        if !alive {
            out.push(link.clone());
        }
    }
    out
}
