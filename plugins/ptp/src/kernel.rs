//! The kernel seam: everything ptp reads from or changes in the kernel, in two namespaces (the
//! host the plugin runs in and the container's). [`Real`] talks netlink and `/proc/sys`;
//! [`fake::Fake`] keeps both namespaces in memory with the kernel's answers (EEXIST, ENOENT, a
//! link that vanished) and failure injection, so every failure point of ADD and every DEL after
//! a partial ADD is unit-tested without root. [`conformance`] holds the script both pass, the
//! fake in a unit test and [`Real`] in scratch namespaces (root): the same calls, the same
//! answers, the same state read back.

use std::net::IpAddr;
use std::os::fd::AsFd;
use std::time::Duration;

use cni_common::attachment::AttachmentId;
use cni_common::error::{code, CniError, Result};
use cni_common::netlink::nft::{NfTables, NftOp};
use cni_common::netlink::{Family, Link, LinkKind, LinkSpec, Netlink, NlError, RouteSpec, VethPeer};
use cni_common::netns::NetNs;
use cni_common::sysctl;
use ipnet::IpNet;
use std::collections::HashSet;

use crate::desired::RouteWant;
use cni_common::ipmasq as masq;

/// How long IPv6 duplicate address detection may take before routes are added (upstream's
/// `dadSettleTimeout`).
pub const DAD_TIMEOUT: Duration = Duration::from_secs(5);

/// Which namespace an operation is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Side {
    Host,
    Container,
}

/// A route as read back: enough for CHECK.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteSeen {
    pub dst: IpNet,
    pub gw: Option<IpAddr>,
    pub oif: Option<u32>,
    pub scope: u8,
    pub table: u32,
}

pub type NlResult<T> = std::result::Result<T, NlError>;

pub trait Kernel {
    fn link(&mut self, side: Side, name: &str) -> NlResult<Option<Link>>;
    fn link_by_index(&mut self, side: Side, index: u32) -> NlResult<Option<Link>>;
    /// A veth pair: `ctr` in the container namespace, `host` in the host's, both with `mtu`;
    /// the host end up. Returns the host end. EEXIST when either name is taken.
    fn create_veth(&mut self, host: &str, ctr: &str, mtu: Option<u32>) -> NlResult<Link>;
    fn link_up(&mut self, side: Side, index: u32) -> NlResult<()>;
    /// No verb takes a link down; the conformance script does, to see what the kernel keeps
    /// (`keep_addr_on_down`) and what it drops (the routes through the link).
    fn link_down(&mut self, side: Side, index: u32) -> NlResult<()>;
    fn link_del(&mut self, side: Side, index: u32) -> NlResult<()>;
    /// Add an address; `noprefixroute`: without the kernel's route to its subnet.
    fn addr_add(&mut self, side: Side, index: u32, net: IpNet, noprefixroute: bool) -> NlResult<()>;
    /// Remove an address (EADDRNOTAVAIL when it is not there): the conformance script's.
    fn addr_del(&mut self, side: Side, index: u32, net: IpNet) -> NlResult<()>;
    fn addrs(&mut self, side: Side, index: u32) -> NlResult<Vec<IpNet>>;
    fn route_add(&mut self, side: Side, index: u32, r: &RouteWant) -> NlResult<()>;
    fn routes(&mut self, side: Side) -> NlResult<Vec<RouteSeen>>;
    /// IPv6 on for `lo` and `ifname` in the container, addresses kept when it goes down.
    fn ctr_enable_ipv6(&mut self, ifname: &str) -> Result<()>;
    /// Wait (bounded) until no IPv6 address of the container's link `index` is tentative.
    fn ctr_settle_v6(&mut self, index: u32) -> Result<()>;
    /// A sysctl's value in `side`'s namespace (`net/ipv6/conf/eth0/keep_addr_on_down`): what
    /// [`Kernel::ctr_enable_ipv6`] and [`Kernel::forward`] wrote, read back by the conformance
    /// script and by tests.
    fn sysctl_get(&mut self, side: Side, key: &str) -> Result<String>;
    /// Turn on forwarding in the host: (IPv4, IPv6).
    fn forward(&mut self, v4: bool, v6: bool) -> Result<()>;
    /// nf_tables can be used (code 50 otherwise).
    fn nft_ready(&mut self) -> Result<()>;
    /// The attachment's masquerade rules become exactly `addrs`' (one transaction).
    fn masq_set(&mut self, a: &AttachmentId, addrs: &[IpNet]) -> Result<()>;
    /// Remove the attachment's masquerade rules; whether there were any.
    fn masq_remove(&mut self, a: &AttachmentId) -> Result<bool>;
    /// What the attachment's masquerading lacks for `addrs` (None: complete).
    fn masq_missing(&mut self, a: &AttachmentId, addrs: &[IpNet]) -> Result<Option<String>>;
    /// Remove the masquerade rules of `network` whose attachment tag is not in `keep`; whether
    /// there were any.
    fn masq_gc(&mut self, network: &str, keep: &HashSet<String>) -> Result<bool>;
    /// STATUS: the masquerade transaction of a made-up attachment, processed and not committed.
    fn masq_validate(&mut self) -> Result<()>;
}

/// The kernel, through netlink and `/proc/sys`.
pub struct Real {
    host: Netlink,
    ctr: Option<(NetNs, Netlink)>,
    nf: Option<NfTables>,
}

impl Real {
    /// Sockets in the host namespace and, when given, in the container's.
    pub fn new(ns: Option<&NetNs>) -> Result<Real> {
        let ctr = match ns {
            Some(ns) => Some((ns.try_clone()?, Netlink::new_in(ns)?)),
            None => None,
        };
        Ok(Real { host: Netlink::new()?, ctr, nf: None })
    }

    fn nl(&mut self, side: Side) -> NlResult<&mut Netlink> {
        match side {
            Side::Host => Ok(&mut self.host),
            Side::Container => match &mut self.ctr {
                Some((_, nl)) => Ok(nl),
                None => Err(NlError::new("no container namespace", libc::ENOENT)),
            },
        }
    }

    fn ns(&self) -> Result<&NetNs> {
        self.ctr.as_ref().map(|(ns, _)| ns).ok_or_else(|| CniError::internal("no container namespace"))
    }

    fn nf(&mut self) -> Result<&mut NfTables> {
        if self.nf.is_none() {
            let nf = NfTables::new().map_err(|e| {
                CniError::new(code::NOT_AVAILABLE, format!("nf_tables is not usable (netlink): {e}"))
            })?;
            self.nf = Some(nf);
        }
        Ok(self.nf.as_mut().expect("set above"))
    }

    /// Build and commit a masquerade transaction from a fresh read; a transaction that fails
    /// because something it named vanished meanwhile (another verb) is rebuilt, a bounded
    /// number of times (code 11 past it).
    fn masq_txn(&mut self, build: impl Fn(&mut NfTables) -> NlResult<Vec<NftOp>>) -> Result<bool> {
        const ATTEMPTS: usize = 16;
        let nf = self.nf()?;
        for _ in 0..ATTEMPTS {
            let ops = build(nf)?;
            if ops.is_empty() {
                return Ok(false);
            }
            match nf.apply(&ops) {
                Ok(()) => return Ok(true),
                Err(e) if e.is_not_found() => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(CniError::new(
            code::TRY_AGAIN,
            format!("the masquerade table kept changing under this transaction ({ATTEMPTS} attempts)"),
        ))
    }
}

impl Kernel for Real {
    fn link(&mut self, side: Side, name: &str) -> NlResult<Option<Link>> {
        self.nl(side)?.link_by_name(name)
    }

    fn link_by_index(&mut self, side: Side, index: u32) -> NlResult<Option<Link>> {
        self.nl(side)?.link_by_index(index)
    }

    fn create_veth(&mut self, host: &str, ctr: &str, mtu: Option<u32>) -> NlResult<Link> {
        let Some((ns, _)) = &self.ctr else {
            return Err(NlError::new("no container namespace", libc::ENOENT));
        };
        let peer = VethPeer { name: ctr.to_string(), mtu, mac: None, netns: Some(ns.as_fd()), up: false };
        let spec = LinkSpec { mtu, up: true, ..LinkSpec::new(host, LinkKind::Veth { peer }) };
        self.host.link_add(&spec)
    }

    fn link_up(&mut self, side: Side, index: u32) -> NlResult<()> {
        self.nl(side)?.link_set_up(index)
    }

    fn link_down(&mut self, side: Side, index: u32) -> NlResult<()> {
        self.nl(side)?.link_set_down(index)
    }

    fn link_del(&mut self, side: Side, index: u32) -> NlResult<()> {
        self.nl(side)?.link_del(index)
    }

    fn addr_add(&mut self, side: Side, index: u32, net: IpNet, noprefixroute: bool) -> NlResult<()> {
        let nl = self.nl(side)?;
        if noprefixroute {
            nl.addr_add_noprefixroute(index, net)
        } else {
            nl.addr_add(index, net)
        }
    }

    fn addr_del(&mut self, side: Side, index: u32, net: IpNet) -> NlResult<()> {
        self.nl(side)?.addr_del(index, net)
    }

    fn addrs(&mut self, side: Side, index: u32) -> NlResult<Vec<IpNet>> {
        Ok(self.nl(side)?.addrs(Some(index), None)?.into_iter().map(|a| a.addr).collect())
    }

    fn route_add(&mut self, side: Side, index: u32, r: &RouteWant) -> NlResult<()> {
        let spec = RouteSpec {
            gw: r.gw,
            oif: Some(index),
            table: r.table,
            priority: r.priority,
            scope: r.scope,
            mtu: r.mtu,
            advmss: r.advmss,
            append: r.append,
            ..RouteSpec::new(r.dst)
        };
        let nl = self.nl(side)?;
        match r.src {
            Some(src) => nl.route_add_src(&spec, src),
            None => nl.route_add(&spec),
        }
    }

    fn routes(&mut self, side: Side) -> NlResult<Vec<RouteSeen>> {
        Ok(self
            .nl(side)?
            .routes(None)?
            .into_iter()
            .map(|r| RouteSeen { dst: r.dst, gw: r.gw, oif: r.oif, scope: r.scope, table: r.table })
            .collect())
    }

    fn ctr_enable_ipv6(&mut self, ifname: &str) -> Result<()> {
        let ns = self.ns()?;
        ns.run(|| {
            for dev in ["lo", ifname] {
                sysctl::set(&sysctl::iface_key("ipv6", dev, "disable_ipv6"), "0")
                    .map_err(|e| e.context(format_args!("failed to enable IPv6 for interface {dev:?}")))?;
            }
            sysctl::set(&sysctl::iface_key("ipv6", ifname, "keep_addr_on_down"), "1")?;
            Ok(())
        })
    }

    fn ctr_settle_v6(&mut self, index: u32) -> Result<()> {
        let Some((ns, nl)) = &mut self.ctr else { return Err(CniError::internal("no container namespace")) };
        ns.run(|| {
            nl.wait_addrs_settled(index, Some(Family::V6), DAD_TIMEOUT).map(drop).map_err(|e| {
                let retry = e.errno == libc::ETIMEDOUT;
                let e = CniError::from(e);
                if retry {
                    CniError::new(code::TRY_AGAIN, e.msg)
                } else {
                    e
                }
            })
        })
    }

    fn sysctl_get(&mut self, side: Side, key: &str) -> Result<String> {
        let get = || sysctl::get(key).map_err(|e| CniError::io(format!("read sysctl {key}: {e}")));
        match side {
            // The calling thread's namespace, where `forward` writes.
            Side::Host => get(),
            Side::Container => self.ns()?.run(get),
        }
    }

    fn forward(&mut self, v4: bool, v6: bool) -> Result<()> {
        if v4 {
            sysctl::set("net/ipv4/ip_forward", "1")
                .map_err(|e| e.context("Could not enable IP forwarding"))?;
        }
        if v6 {
            sysctl::set("net/ipv6/conf/all/forwarding", "1")
                .map_err(|e| e.context("Could not enable IP forwarding"))?;
        }
        Ok(())
    }

    fn nft_ready(&mut self) -> Result<()> {
        self.nf().map(drop)
    }

    fn masq_set(&mut self, a: &AttachmentId, addrs: &[IpNet]) -> Result<()> {
        self.masq_txn(|nf| Ok(masq::add_ops(a, addrs, None, &masq::find(nf, a)?))).map(drop)
    }

    fn masq_remove(&mut self, a: &AttachmentId) -> Result<bool> {
        self.masq_txn(|nf| {
            Ok(masq::del_ops(&masq::find(nf, a)?.rules).into_iter().map(NftOp::Delete).collect())
        })
    }

    fn masq_missing(&mut self, a: &AttachmentId, addrs: &[IpNet]) -> Result<Option<String>> {
        let f = masq::find(self.nf()?, a)?;
        Ok(masq::missing(&f, a, addrs, None))
    }

    fn masq_gc(&mut self, network: &str, keep: &HashSet<String>) -> Result<bool> {
        self.masq_txn(|nf| {
            let garbage = masq::garbage(nf, network, keep)?;
            Ok(masq::del_ops(&garbage).into_iter().map(NftOp::Delete).collect())
        })
    }

    fn masq_validate(&mut self) -> Result<()> {
        let a = AttachmentId::new("status", "status", "eth0");
        let addrs: Vec<IpNet> = vec![
            "10.255.255.2/24".parse().expect("an address"),
            "fd00:ffff::2/64".parse().expect("an address"),
        ];
        let ops = masq::add_ops(&a, &addrs, None, &masq::Found::default());
        self.nf()?.validate(&ops).map_err(CniError::from)
    }
}

#[cfg(test)]
pub mod conformance;
#[cfg(test)]
pub mod fake;
