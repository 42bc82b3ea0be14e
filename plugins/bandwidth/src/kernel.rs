//! The kernel seam: every operation bandwidth makes, in two namespaces (the host the plugin
//! runs in, and the container's, where only the container end of the veth is looked up).
//! [`Real`] talks rtnetlink and reads `/proc/net/psched`; [`fake::Fake`] keeps both namespaces
//! in memory with the kernel's answers (ENOENT for a missing link or qdisc, EEXIST on a
//! duplicate create, a link that vanishes between two calls, a reply lost after the change was
//! applied) and failure injection, so every failure point of ADD and every DEL after a partial
//! ADD is unit-tested without root. Upstream's ifbs (`crate::upstream`) go through the same
//! seam.

use std::sync::Arc;

use cni_common::netlink::tc::{Filter, Psched, Qdisc, Tbf};
use cni_common::netlink::{Link, LinkKind, LinkSpec, Netlink, NlError};
use cni_common::netns::NetNs;
use cni_common::{CniError, Request, Result};

pub type NlResult<T> = std::result::Result<T, NlError>;

/// The ifb to create: name, MTU and queue length (the host veth's), the owner record (alias)
/// and the device group. It is created up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IfbSpec {
    pub name: String,
    pub mtu: u32,
    pub txqlen: u32,
    pub alias: String,
    pub group: u32,
}

pub trait Kernel {
    /// The container's side: its link called `name`. An error when the container's namespace
    /// cannot be reached.
    fn ctr_link_by_name(&mut self, name: &str) -> NlResult<Option<Link>>;
    /// DEL: open the container's namespace if it still exists; `Ok(false)` when it is gone.
    fn enter_container(&mut self) -> Result<bool>;
    fn link_by_name(&mut self, name: &str) -> NlResult<Option<Link>>;
    fn link_by_index(&mut self, index: u32) -> NlResult<Option<Link>>;
    fn links(&mut self) -> NlResult<Vec<Link>>;
    /// Create the ifb, up, with its alias and group in the create request. EEXIST when the
    /// name is taken.
    fn create_ifb(&mut self, spec: &IfbSpec) -> NlResult<Link>;
    fn link_del(&mut self, index: u32) -> NlResult<()>;
    /// `Ok(false)` when there is no link called `name`.
    fn link_del_by_name(&mut self, name: &str) -> NlResult<bool>;
    /// The qdiscs of link `index` (all links when `None`).
    fn qdiscs(&mut self, index: Option<u32>) -> NlResult<Vec<Qdisc>>;
    /// EEXIST when `parent` already has a (non-default) qdisc.
    fn qdisc_add_tbf(&mut self, index: u32, handle: u32, parent: u32, tbf: &Tbf) -> NlResult<()>;
    /// EEXIST when there is one.
    fn qdisc_add_ingress(&mut self, index: u32) -> NlResult<()>;
    /// `Ok(false)` when the link or the qdisc is gone.
    fn qdisc_del(&mut self, index: u32, parent: u32, handle: u32) -> NlResult<bool>;
    /// The filters of `parent` on link `index`; empty when the link or the qdisc is gone.
    fn filters(&mut self, index: u32, parent: u32) -> NlResult<Vec<Filter>>;
    /// A u32 match-all filter with one action, mirred egress redirect to `target`.
    fn filter_add_redirect(&mut self, index: u32, parent: u32, prio: u16, target: u32) -> NlResult<()>;
    /// The packet scheduler clock (`/proc/net/psched`).
    fn psched(&mut self) -> std::io::Result<Psched>;
}

/// The kernel, through rtnetlink: a socket in the host namespace and, once opened, one in the
/// container's.
pub struct Real<'a> {
    host: Netlink,
    ctr: Option<Netlink>,
    /// Where DEL finds the container's namespace ([`Kernel::enter_container`]).
    req: Option<&'a Request>,
}

impl<'a> Real<'a> {
    /// A socket in the host namespace only (GC, STATUS).
    pub fn host() -> Result<Real<'a>> {
        Ok(Real { host: Netlink::new()?, ctr: None, req: None })
    }

    /// ADD, CHECK: sockets in the host namespace and in `ns`.
    pub fn with_container(ns: &Arc<NetNs>) -> Result<Real<'a>> {
        let host = Netlink::new()?;
        let ctr = Netlink::new_in(ns)?;
        Ok(Real { host, ctr: Some(ctr), req: None })
    }

    /// DEL: a socket in the host namespace; the container's is opened when asked for, if the
    /// namespace of `req` still exists.
    pub fn lazy(req: &'a Request) -> Result<Real<'a>> {
        Ok(Real { host: Netlink::new()?, ctr: None, req: Some(req) })
    }
}

impl Kernel for Real<'_> {
    fn ctr_link_by_name(&mut self, name: &str) -> NlResult<Option<Link>> {
        match &mut self.ctr {
            Some(nl) => nl.link_by_name(name),
            None => Err(NlError::new("no container namespace", libc::ENOENT)),
        }
    }

    fn enter_container(&mut self) -> Result<bool> {
        if self.ctr.is_some() {
            return Ok(true);
        }
        let Some(req) = self.req else { return Err(CniError::internal("no container namespace")) };
        let Some(ns) = req.container_netns()? else { return Ok(false) };
        self.ctr = Some(Netlink::new_in(&ns)?);
        Ok(true)
    }

    fn link_by_name(&mut self, name: &str) -> NlResult<Option<Link>> {
        self.host.link_by_name(name)
    }

    fn link_by_index(&mut self, index: u32) -> NlResult<Option<Link>> {
        self.host.link_by_index(index)
    }

    fn links(&mut self) -> NlResult<Vec<Link>> {
        self.host.links()
    }

    fn create_ifb(&mut self, s: &IfbSpec) -> NlResult<Link> {
        let spec = LinkSpec {
            mtu: Some(s.mtu),
            up: true,
            txqlen: Some(s.txqlen),
            alias: Some(s.alias.clone()),
            group: Some(s.group),
            ..LinkSpec::new(s.name.as_str(), LinkKind::Ifb)
        };
        self.host.link_add(&spec)
    }

    fn link_del(&mut self, index: u32) -> NlResult<()> {
        self.host.link_del(index)
    }

    fn link_del_by_name(&mut self, name: &str) -> NlResult<bool> {
        self.host.link_del_by_name(name)
    }

    fn qdiscs(&mut self, index: Option<u32>) -> NlResult<Vec<Qdisc>> {
        self.host.qdiscs(index)
    }

    fn qdisc_add_tbf(&mut self, index: u32, handle: u32, parent: u32, tbf: &Tbf) -> NlResult<()> {
        self.host.qdisc_add_tbf(index, handle, parent, tbf)
    }

    fn qdisc_add_ingress(&mut self, index: u32) -> NlResult<()> {
        self.host.qdisc_add_ingress(index)
    }

    fn qdisc_del(&mut self, index: u32, parent: u32, handle: u32) -> NlResult<bool> {
        self.host.qdisc_del(index, parent, handle)
    }

    fn filters(&mut self, index: u32, parent: u32) -> NlResult<Vec<Filter>> {
        self.host.filters(index, parent)
    }

    fn filter_add_redirect(&mut self, index: u32, parent: u32, prio: u16, target: u32) -> NlResult<()> {
        self.host.filter_add_redirect(index, parent, prio, target)
    }

    fn psched(&mut self) -> std::io::Result<Psched> {
        Psched::read()
    }
}

#[cfg(test)]
pub mod fake;
