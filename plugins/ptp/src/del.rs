//! DEL: best effort and idempotent. The container's veth (the host end, its addresses and
//! routes go with it), the attachment's masquerade rules (found by their tag: an empty or
//! vanished CNI_NETNS is no obstacle), upstream's iptables masquerade chain if upstream's ptp
//! made one, the IPAM reservation. Errors are collected and the first is reported after
//! everything was tried.

use cni_common::attachment::AttachmentId;
use cni_common::error::{CniError, Result};
use cni_common::error_list::ErrorList;
use cni_common::Request;

use crate::config::Teardown;
use crate::ipam::{Delegated, Ipam};
use crate::kernel::{Kernel, Real, Side};
use crate::plan::{self, DelStep};

pub fn del(req: &Request) -> Result<()> {
    let conf = Teardown::from_request(req)?;
    let mut errors = ErrorList::new();
    // ipMasq made by upstream's ptp with its iptables backend, if this attachment has any.
    errors.take(cni_common::upstream::masq::del(req));
    let ns = if req.netns().is_some() { errors.take(req.container_netns()).flatten() } else { None };
    match Real::new(ns.as_deref()) {
        Ok(mut k) => {
            let mut ipam = Delegated(req);
            let ipam: Option<&mut dyn Ipam> = if conf.l3 { Some(&mut ipam) } else { None };
            errors.take(run(&mut k, ipam, &AttachmentId::of(req), ns.is_some(), conf.ip_masq));
        }
        Err(e) => errors.push(e),
    }
    errors.finish()
}

/// DEL against a kernel: `has_ns` whether the container's namespace is there to look in;
/// `ip_masq` whether nf_tables must be readable (without it, a kernel lacking nf_tables holds
/// no rules of ours).
pub fn run(
    k: &mut dyn Kernel,
    ipam: Option<&mut dyn Ipam>,
    a: &AttachmentId,
    has_ns: bool,
    ip_masq: bool,
) -> Result<()> {
    let mut errors = ErrorList::new();
    let link = if has_ns {
        errors.take(k.link(Side::Container, &a.ifname).map_err(CniError::from)).flatten()
    } else {
        None
    };
    // its host end: the host link at the veth's peer index whose own peer is this link (the
    // index is in the peer's namespace, which need not be the host's); not found is no answer
    let host_end = link.as_ref().and_then(|l| Some((l.index, l.link?))).and_then(|(index, peer)| {
        k.link_by_index(Side::Host, peer).ok().flatten().filter(|h| h.link == Some(index))
    });
    let mut ipam = ipam;
    for step in plan::del(link.as_ref(), host_end.as_ref(), ipam.is_some()) {
        match step {
            DelStep::DeleteContainerLink(index) => match k.link_del(Side::Container, index) {
                Err(e) if !e.is_not_found() => {
                    errors.push(CniError::from(e).context(format_args!("failed to delete {}", a.ifname)))
                }
                _ => {}
            },
            DelStep::LeaveForeign(why) => cni_common::log!("ptp", "{why}"),
            DelStep::RemoveMasq => match k.masq_remove(a) {
                Err(e) if ip_masq => errors.push(e.context("remove masquerade rules")),
                Err(e) => cni_common::log!(
                    "ptp",
                    "nf_tables not readable, no masquerade rules to remove: {}",
                    e.msg
                ),
                Ok(_) => {}
            },
            DelStep::ReleaseIpam => {
                if let Some(i) = ipam.as_mut() {
                    errors.take(i.del());
                }
            }
        }
    }
    errors.finish()
}
