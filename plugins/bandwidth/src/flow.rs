//! Each verb through the seam: config (done by the caller) → desired (`crate::desired`, pure)
//! → read → plan (`crate::plan`, pure) → apply (`crate::shape`). `crate::Bandwidth` opens the
//! real kernel and hands over; the unit tests hand the fake.

use cni_common::attachment::AttachmentId;
use cni_common::error_list::ErrorList;
use cni_common::netlink::tc::Psched;
use cni_common::spec::result::CniResult;
use cni_common::{code, CniError, Result};

use crate::config::Limits;
use crate::desired::{self, Desired};
use crate::identity::IfbIdentity;
use crate::kernel::Kernel;
use crate::plan::{self, Existing};
use crate::shape;
use crate::upstream;

/// The attachment as ADD, CHECK and resync see it: the host veth (checked to be listed in
/// `prev`), the shaping it should have, and the clock that sized it.
pub struct Shaped {
    pub veth: cni_common::netlink::Link,
    pub desired: Desired,
    pub psched: Psched,
}

/// Find the host veth of the container's `ifname` and what it should carry for `limits`.
pub fn shaped(k: &mut dyn Kernel, att: &AttachmentId, prev: &CniResult, limits: &Limits) -> Result<Shaped> {
    let veth = shape::host_veth(k, &att.ifname)?;
    shape::require_listed(&veth, prev, &att.ifname)?;
    let psched = shape::psched(k)?;
    let desired = desired::desired(limits, &veth, att, &psched);
    Ok(Shaped { veth, desired, psched })
}

/// ADD with non-empty `limits`: build the shaping; the ifb (when egress is shaped) is added to
/// `result`'s interfaces.
pub fn add(
    k: &mut dyn Kernel,
    att: &AttachmentId,
    limits: &Limits,
    mut result: CniResult,
) -> Result<CniResult> {
    let s = shaped(k, att, &result, limits)?;
    if let Some(ifb) = shape::add(k, &s.veth, &s.desired, att)? {
        result.interfaces.push(shape::ifb_interface(&ifb));
    }
    Ok(result)
}

/// CHECK with non-empty `limits`.
pub fn check(k: &mut dyn Kernel, att: &AttachmentId, limits: &Limits, prev: &CniResult) -> Result<()> {
    let s = shaped(k, att, prev, limits)?;
    shape::check(k, &s.veth, &s.desired, att, &s.psched)
}

/// Remove the shaping of the host veth whose container end is `ifname`, if the container's
/// namespace still exists.
fn clear_host_veth(k: &mut dyn Kernel, ifname: &str, ifb: Option<u32>) -> Result<()> {
    if !k.enter_container()? {
        return Ok(());
    }
    match shape::host_veth(k, ifname) {
        Ok(veth) => shape::clear_veth(k, &veth, ifb),
        // The container end or its peer is gone: so are the host veth's qdiscs.
        Err(e) => {
            cni_common::log!("bandwidth", "DEL: no host veth to clear: {}", e.msg);
            Ok(())
        }
    }
}

/// DEL: remove the ifb (by name, so also upstream's) and, while the container's namespace
/// still exists, the qdiscs on the host veth. Every step is tried; errors are collected.
pub fn del(k: &mut dyn Kernel, att: &AttachmentId) -> Result<()> {
    let name = att.ifb_name();
    let mut errors = ErrorList::new();
    let ifb = match errors.take(shape::existing_ifb(k, &name, att)) {
        Some(Existing::Stale(l)) => Some(l.index),
        _ => None,
    };
    errors.take(clear_host_veth(k, &att.ifname, ifb));
    errors.take(shape::del_ifb(k, &name, att));
    errors.finish()
}

/// GC: delete this network's ifbs whose attachment is not in `valid` ([`plan::gc_victims`]),
/// then upstream's that nothing uses any more ([`upstream::gc`]).
pub fn gc(k: &mut dyn Kernel, net: &str, valid: &[AttachmentId]) -> Result<()> {
    let mut errors = ErrorList::new();
    for link in plan::gc_victims(&k.links()?, net, valid) {
        // Gone already (its attachment's DEL got there first): nothing to do.
        match k.link_del(link.index) {
            Ok(()) => cni_common::log!(
                "bandwidth",
                "GC: deleted ifb {} ({})",
                link.name,
                link.alias.as_deref().unwrap_or("")
            ),
            Err(e) if e.is_not_found() => {}
            Err(e) => errors.push(CniError::from(e).context(format_args!("GC: delete ifb {}", link.name))),
        }
    }
    // ifbs made by upstream's bandwidth (no owner record): removed when nothing uses them.
    if let Err(e) = upstream::gc(k, net, valid) {
        errors.push(e);
    }
    errors.finish()
}

/// STATUS: ready when the packet scheduler clock can be read (ADD needs it to size the
/// buckets).
/// `clock` is what reading it gave (`Kernel::psched`; STATUS opens no netlink socket).
pub fn status(clock: std::io::Result<Psched>) -> Result<()> {
    clock
        .map(drop)
        .map_err(|e| CniError::new(code::NOT_AVAILABLE, format!("cannot read /proc/net/psched: {e}")))
}

/// resync with non-empty `limits`: what of the shaping is missing (CHECK's comparison),
/// rebuilt by ADD's steps unless `dry_run`, and compared again.
pub fn resync(
    k: &mut dyn Kernel,
    att: &AttachmentId,
    limits: &Limits,
    prev: &CniResult,
    dry_run: bool,
) -> Result<Option<String>> {
    let s = shaped(k, att, prev, limits)?;
    let Err(missing) = shape::check(k, &s.veth, &s.desired, att, &s.psched) else { return Ok(None) };
    if !dry_run {
        shape::add(k, &s.veth, &s.desired, att)?;
        shape::check(k, &s.veth, &s.desired, att, &s.psched)
            .map_err(|e| CniError::internal(format!("still missing after rebuilding it: {}", e.msg)))?;
    }
    Ok(Some(missing.msg))
}
