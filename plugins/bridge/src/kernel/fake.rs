//! An in-memory host and container with the kernel's answers bridge relies on: a link, an
//! address or a route that exists is `EEXIST`, one that does not is `ENODEV`/`EADDRNOTAVAIL`
//! (not found); deleting a veth takes its peer; deleting a bridge frees its ports; an nf_tables
//! transaction commits all or nothing, a rule or chain it names that is gone is `ENOENT`, a chain
//! still holding rules or jumped to is `EBUSY`; a bridge reports its options, the kernel's
//! defaults among them, and options sent to another kind of link are `EOPNOTSUPP`; a kernel
//! without bridge VLAN filtering answers `EOPNOTSUPP`, to the option too. Faults: the next call of an operation fails with an errno before it acts, or
//! after (the answer is lost: the change is made and the caller sees the error); a hook runs
//! before an operation (another process, a link vanishing). Every [`Fake`] cloned from another
//! shares its world, and the world records every call, so requests can be counted.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::time::Duration;

use cni_common::error::{CniError, Result};
use cni_common::netlink::nft::{listed, NftChain, NftDelete, NftFamily, NftOp, NftRule, Verdict};
use cni_common::netlink::{
    Address, BridgeOpt, BridgeOpts, Family, Link, LinkKind, LinkSpec, NlError, OptValue, PortFlags, PortVlan,
    Route, RouteKind, RouteSpec, TABLE_MAIN,
};
use ipnet::IpNet;

use super::{IpamJob, Kernel, Nft, Ns, SysctlJob};

type Nl<T> = std::result::Result<T, NlError>;

const IFF_UP: u32 = 0x1;
const IFF_PROMISC: u32 = 0x100;
const IFF_LOOPBACK: u32 = 0x8;
const IF_OPER_UP: u8 = 6;

/// A new bridge's options as the kernel reports them (those cni-common names).
fn bridge_defaults() -> BridgeOpts {
    BridgeOpts::from([
        (BridgeOpt::STP_STATE, OptValue::U32(0)),
        (BridgeOpt::VLAN_FILTERING, OptValue::U8(0)),
        (BridgeOpt::MCAST_SNOOPING, OptValue::U8(1)),
    ])
}

/// One link of the world.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeLink {
    pub ns: Ns,
    pub link: Link,
    pub port: PortFlags,
    pub vlans: Vec<PortVlan>,
}

/// A table of nf_tables: its chains in creation order, each with its rules.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FakeTable {
    pub chains: Vec<(NftChain, Vec<NftRule>)>,
}

/// When an injected fault strikes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Refused with this errno, nothing done.
    Before(i32),
    /// Done, but the answer is lost: the caller sees this errno.
    After(i32),
}

type Hook = Box<dyn FnMut(&mut World)>;

/// The host and the container.
#[derive(Default)]
pub struct World {
    pub links: Vec<FakeLink>,
    next_index: u32,
    pub addrs: Vec<(Ns, Address)>,
    pub routes: Vec<(Ns, Route)>,
    /// Host sysctls (a key that is absent does not exist).
    pub sysctls: BTreeMap<String, String>,
    /// What the container's sysctl writer wrote.
    pub ctr_sysctls: BTreeMap<String, String>,
    pub tables: BTreeMap<(String, String), FakeTable>,
    next_handle: u64,
    /// The kernel has no nf_tables.
    pub no_nftables: bool,
    /// The kernel has no bridge VLAN filtering.
    pub no_vlan_filtering: bool,
    /// What the IPAM delegate answers to ADD (its stdout), or its error.
    pub ipam_answer: Option<std::result::Result<String, CniError>>,
    /// Whether the IPAM delegate holds a reservation for the attachment.
    pub ipam_reserved: bool,
    pub faults: Vec<(&'static str, usize, Fault)>,
    hooks: Vec<(&'static str, Hook)>,
    /// The process "died" at a call: from then on every call fails and nothing changes, as
    /// for an ADD killed halfway (no undo runs).
    pub crashed: bool,
    crash_at: Option<(&'static str, usize)>,
    /// Every operation, in order.
    pub calls: Vec<&'static str>,
    /// Upstream's bridge made the attachment's masquerading (iptables), complete.
    pub upstream_masq: bool,
    /// How often GC of upstream's masquerading ran.
    pub upstream_masq_gcs: usize,
    /// The attachment whose firewall state `remove_firewall` takes out.
    pub attachment: Option<cni_common::attachment::AttachmentId>,
    /// What the host's forward chains say of a subnet (another table's drop), when asked.
    pub forward_drop: Option<String>,
    /// The subnets the forward chains were asked about.
    pub forward_drop_asked: Vec<ipnet::IpNet>,
    /// The links whose MAC was set (created with one, or set since: the kernel's
    /// `addr_assign_type` 3, `NET_ADDR_SET`). A bridge not in it floats: the kernel gives it
    /// the lowest MAC of its ports, and zeroes it when the last port leaves.
    pub mac_set: BTreeSet<u32>,
    /// Whether a link's `addr_assign_type` cannot be read (sysfs of another namespace).
    pub mac_assign_unreadable: bool,
}

impl World {
    /// A host with `lo` and `eth0` (up), IPv6 on, nothing else; a container with `lo`.
    pub fn new() -> World {
        let mut w = World { next_index: 1, next_handle: 1, ..World::default() };
        for (ns, name) in [(Ns::Host, "lo"), (Ns::Host, "eth0"), (Ns::Container, "lo")] {
            let (flags, mtu) = if name == "lo" { (IFF_UP | IFF_LOOPBACK, 65536) } else { (IFF_UP, 1500) };
            w.insert(ns, name, None, flags, None, mtu);
        }
        for (k, v) in [
            ("net/ipv4/ip_forward", "0"),
            ("net/ipv6/conf/all/forwarding", "0"),
            ("net/ipv6/conf/all/accept_ra", "1"),
            ("net/ipv6/conf/default/accept_ra", "1"),
        ] {
            w.sysctls.insert(k.into(), v.into());
        }
        w
    }

    fn insert(
        &mut self,
        ns: Ns,
        name: &str,
        kind: Option<&str>,
        flags: u32,
        mac: Option<[u8; 6]>,
        mtu: u32,
    ) -> u32 {
        let index = self.next_index;
        self.next_index += 1;
        if mac.is_some() {
            self.mac_set.insert(index);
        }
        // a device the kernel made gets a MAC the fake can tell from any we chose
        let mac = mac.or(Some([0x00, 0x16, 0x3e, 0, (index >> 8) as u8, index as u8]));
        let link = Link {
            index,
            name: name.into(),
            kind: kind.map(Into::into),
            mtu,
            mac,
            flags,
            oper_state: if flags & IFF_UP != 0 { IF_OPER_UP } else { 2 },
            bridge: (kind == Some("bridge")).then(bridge_defaults),
            ..Link::default()
        };
        self.links.push(FakeLink { ns, link, port: PortFlags::default(), vlans: Vec::new() });
        if ns == Ns::Host {
            self.sysctls.insert(format!("net/ipv6/conf/{name}/accept_ra"), "1".into());
        }
        index
    }

    /// A copy of the state (no faults, hooks or calls), for looking at it apart.
    pub fn copy(&self) -> World {
        World {
            links: self.links.clone(),
            next_index: self.next_index,
            addrs: self.addrs.clone(),
            routes: self.routes.clone(),
            sysctls: self.sysctls.clone(),
            ctr_sysctls: self.ctr_sysctls.clone(),
            tables: self.tables.clone(),
            next_handle: self.next_handle,
            ipam_reserved: self.ipam_reserved,
            upstream_masq: self.upstream_masq,
            mac_set: self.mac_set.clone(),
            ..World::default()
        }
    }

    pub fn link(&self, ns: Ns, name: &str) -> Option<&FakeLink> {
        self.links.iter().find(|l| l.ns == ns && l.link.name == name)
    }

    fn pos(&self, ns: Ns, index: u32) -> Nl<usize> {
        self.links
            .iter()
            .position(|l| l.ns == ns && l.link.index == index)
            .ok_or_else(|| NlError::new(format!("link {index}"), libc::ENODEV))
    }

    /// Remove link `index` of `ns` as the kernel unregisters it: its addresses and routes go,
    /// a veth's peer goes with it, a bridge's ports are freed.
    pub fn unregister(&mut self, ns: Ns, index: u32) {
        let Ok(p) = self.pos(ns, index) else { return };
        let l = self.links.remove(p);
        self.mac_set.remove(&index);
        let name = l.link.name.clone();
        self.addrs.retain(|(n, a)| !(*n == ns && a.index == index));
        self.routes.retain(|(n, r)| !(*n == ns && r.oif == Some(index)));
        if ns == Ns::Host {
            self.sysctls.retain(|k, _| !k.starts_with(&format!("net/ipv6/conf/{name}/")));
        }
        for other in &mut self.links {
            if other.ns == ns && other.link.master == Some(index) {
                other.link.master = None;
            }
        }
        if let Some(m) = l.link.master {
            self.float_bridge_mac(ns, m);
        }
        if l.link.kind.as_deref() == Some("veth") {
            if let Some(peer) = l.link.link {
                let peer_ns = self.links.iter().find(|x| x.link.index == peer && x.link.link == Some(index));
                if let Some(pn) = peer_ns.map(|x| x.ns) {
                    self.unregister(pn, peer);
                }
            }
        }
    }

    /// The kernel's `br_stp_recalculate_bridge_id`: a bridge whose MAC was never set takes the
    /// lowest MAC of its ports, or the zero MAC when it has none.
    pub fn float_bridge_mac(&mut self, ns: Ns, bridge: u32) {
        if self.mac_set.contains(&bridge) {
            return;
        }
        let lowest = self
            .links
            .iter()
            .filter(|l| l.ns == ns && l.link.master == Some(bridge))
            .filter_map(|l| l.link.mac)
            .min()
            .unwrap_or([0; 6]);
        if let Ok(p) = self.pos(ns, bridge) {
            if self.links[p].link.kind.as_deref() == Some("bridge") {
                self.links[p].link.mac = Some(lowest);
            }
        }
    }

    /// The rules of a chain, for assertions.
    pub fn rules(&self, family: NftFamily, table: &str, chain: &str) -> Vec<NftRule> {
        self.tables
            .get(&key(family, table))
            .and_then(|t| t.chains.iter().find(|(c, _)| c.name == chain))
            .map(|(_, r)| r.clone())
            .unwrap_or_default()
    }

    /// What a test compares before and after: links (without the order), addresses, routes,
    /// host sysctls, nf_tables, the IPAM reservation.
    pub fn state(&self) -> String {
        let mut links: Vec<String> = self
            .links
            .iter()
            .map(|l| {
                format!(
                    "{:?} {} {:?} master={:?} up={}",
                    l.ns,
                    l.link.name,
                    l.link.kind,
                    l.link.master,
                    l.link.flags & IFF_UP
                )
            })
            .collect();
        links.sort();
        format!(
            "links {links:?}\naddrs {:?}\nroutes {:?}\nsysctls {:?}\ntables {:?}\nipam {}",
            self.addrs.iter().map(|(n, a)| format!("{n:?} {} {}", a.index, a.addr)).collect::<Vec<_>>(),
            self.routes
                .iter()
                .map(|(n, r)| format!("{n:?} {} {:?} {:?}", r.dst, r.gw, r.oif))
                .collect::<Vec<_>>(),
            self.sysctls,
            self.tables
                .iter()
                .map(|(k, t)| (
                    k,
                    t.chains.iter().map(|(c, r)| (c.name.clone(), r.len())).collect::<Vec<_>>()
                ))
                .collect::<Vec<_>>(),
            self.ipam_reserved
        )
    }

    /// Record the call of `op`; run its hooks; strike its fault if one is due.
    fn enter(&mut self, op: &'static str) -> Option<Fault> {
        self.calls.push(op);
        if let Some((o, n)) = self.crash_at {
            if o == op {
                if n == 0 {
                    self.crashed = true;
                    self.crash_at = None;
                } else {
                    self.crash_at = Some((o, n - 1));
                }
            }
        }
        if self.crashed {
            return Some(Fault::Before(libc::EIO));
        }
        let mut hooks = std::mem::take(&mut self.hooks);
        for (o, h) in hooks.iter_mut() {
            if *o == op {
                h(self);
            }
        }
        hooks.append(&mut self.hooks);
        self.hooks = hooks;
        let i = self.faults.iter().position(|(o, _, _)| *o == op)?;
        if self.faults[i].1 > 0 {
            self.faults[i].1 -= 1;
            return None;
        }
        Some(self.faults.remove(i).2)
    }

    /// The nf_tables transaction `ops`, all or nothing.
    fn nft_apply(&mut self, ops: &[NftOp]) -> Nl<()> {
        let mut tables = self.tables.clone();
        let mut handle = self.next_handle;
        for op in ops {
            apply_one(&mut tables, &mut handle, op)?;
        }
        self.tables = tables;
        self.next_handle = handle;
        Ok(())
    }
}

/// How the world keys a table.
pub fn key(family: NftFamily, table: &str) -> (String, String) {
    (family.keyword().to_string(), table.to_string())
}

fn enoent(what: impl Into<String>) -> NlError {
    NlError::new(what, libc::ENOENT)
}

fn apply_one(tables: &mut BTreeMap<(String, String), FakeTable>, handle: &mut u64, op: &NftOp) -> Nl<()> {
    match op {
        NftOp::AddTable { family, table: t, .. } => {
            tables.entry(key(*family, t)).or_default();
        }
        NftOp::AddChain { family, table: t, chain, base, .. } => {
            let tb = tables.get_mut(&key(*family, t)).ok_or_else(|| enoent(format!("table {t}")))?;
            let info = NftChain {
                name: chain.clone(),
                hook: base.as_ref().map(|b| (b.hook, b.priority)),
                chain_type: base.as_ref().map(|b| b.kind.clone()),
                policy: base.as_ref().map(|b| b.policy.unwrap_or(1)),
                uses: None,
            };
            match tb.chains.iter_mut().find(|(c, _)| c.name == *chain) {
                Some((c, _)) if base.is_some() => *c = info,
                Some(_) => {}
                None => tb.chains.push((info, Vec::new())),
            }
        }
        NftOp::AddRule { family, table: t, chain, exprs, comment } => {
            let tb = tables.get_mut(&key(*family, t)).ok_or_else(|| enoent(format!("table {t}")))?;
            let (_, rules) = tb
                .chains
                .iter_mut()
                .find(|(c, _)| c.name == *chain)
                .ok_or_else(|| enoent(format!("chain {chain}")))?;
            rules.push(NftRule {
                table: t.clone(),
                chain: chain.clone(),
                handle: *handle,
                comment: comment.clone(),
                exprs: listed(exprs),
            });
            *handle += 1;
        }
        NftOp::Delete(d) => match d {
            NftDelete::Rule { family, table: t, chain, handle: h } => {
                let tb = tables.get_mut(&key(*family, t)).ok_or_else(|| enoent(format!("table {t}")))?;
                let (_, rules) = tb
                    .chains
                    .iter_mut()
                    .find(|(c, _)| c.name == *chain)
                    .ok_or_else(|| enoent(format!("chain {chain}")))?;
                let p =
                    rules.iter().position(|r| r.handle == *h).ok_or_else(|| enoent(format!("rule {h}")))?;
                rules.remove(p);
            }
            NftDelete::Flush { family, table: t, chain } => {
                let tb = tables.get_mut(&key(*family, t)).ok_or_else(|| enoent(format!("table {t}")))?;
                let (_, rules) = tb
                    .chains
                    .iter_mut()
                    .find(|(c, _)| c.name == *chain)
                    .ok_or_else(|| enoent(format!("chain {chain}")))?;
                rules.clear();
            }
            NftDelete::Chain { family, table: t, chain } => {
                let tb = tables.get_mut(&key(*family, t)).ok_or_else(|| enoent(format!("table {t}")))?;
                let p = tb
                    .chains
                    .iter()
                    .position(|(c, _)| c.name == *chain)
                    .ok_or_else(|| enoent(format!("chain {chain}")))?;
                let jumped = tb.chains.iter().flat_map(|(_, r)| r).any(|r| {
                    r.verdicts().any(|v| matches!(v, Verdict::Jump(c) | Verdict::Goto(c) if c == chain))
                });
                if !tb.chains[p].1.is_empty() || jumped {
                    return Err(NlError::new(format!("delete chain {chain}"), libc::EBUSY));
                }
                tb.chains.remove(p);
            }
            other => {
                return Err(NlError::new(format!("fake nf_tables: {other:?} not modelled"), libc::EOPNOTSUPP))
            }
        },
        other => {
            return Err(NlError::new(format!("fake nf_tables: {other:?} not modelled"), libc::EOPNOTSUPP))
        }
    }
    Ok(())
}

/// A view of the shared world as bridge's seam.
#[derive(Clone)]
pub struct Fake {
    pub w: Rc<RefCell<World>>,
    nft: FakeNft,
}

/// The world's nf_tables as the firewall module sees it.
#[derive(Clone)]
pub struct FakeNft {
    w: Rc<RefCell<World>>,
}

impl Fake {
    pub fn new(w: World) -> Fake {
        let w = Rc::new(RefCell::new(w));
        Fake { nft: FakeNft { w: w.clone() }, w }
    }

    /// The `n`th next call (0: the next) of `op` fails with `fault`.
    pub fn fail(&self, op: &'static str, n: usize, fault: Fault) {
        self.w.borrow_mut().faults.push((op, n, fault));
    }

    /// The process dies at the `n`th next call (0: the next) of `op`: see [`World::crashed`].
    pub fn crash(&self, op: &'static str, n: usize) {
        self.w.borrow_mut().crash_at = Some((op, n));
    }

    /// Run `f` on the world before every call of `op`.
    pub fn before(&self, op: &'static str, f: impl FnMut(&mut World) + 'static) {
        self.w.borrow_mut().hooks.push((op, Box::new(f)));
    }

    pub fn state(&self) -> String {
        self.w.borrow().state()
    }

    pub fn calls(&self, op: &str) -> usize {
        self.w.borrow().calls.iter().filter(|c| **c == op).count()
    }

    /// Run `op` with the world: fault before, the action, fault after.
    fn with<T>(&self, op: &'static str, f: impl FnOnce(&mut World) -> Nl<T>) -> Nl<T> {
        let mut w = self.w.borrow_mut();
        let fault = w.enter(op);
        if let Some(Fault::Before(e)) = fault {
            return Err(NlError::new(format!("{op} (injected)"), e));
        }
        let r = f(&mut w)?;
        match fault {
            Some(Fault::After(e)) => Err(NlError::new(format!("{op} (answer lost)"), e)),
            _ => Ok(r),
        }
    }

    fn cni<T>(&self, op: &'static str, f: impl FnOnce(&mut World) -> Result<T>) -> Result<T> {
        let mut w = self.w.borrow_mut();
        match w.enter(op) {
            Some(Fault::Before(e)) => Err(NlError::new(format!("{op} (injected)"), e).into()),
            Some(Fault::After(e)) => {
                f(&mut w)?;
                Err(NlError::new(format!("{op} (answer lost)"), e).into())
            }
            None => f(&mut w),
        }
    }
}

impl cni_common::ipmasq::NftRead for FakeNft {
    fn chain_info(&mut self, family: NftFamily, table: &str) -> Nl<Vec<NftChain>> {
        let fake = Fake { w: self.w.clone(), nft: self.clone() };
        fake.with("nft_read", |w| {
            Ok(w.tables
                .get(&key(family, table))
                .map(|t| t.chains.iter().map(|(c, _)| c.clone()).collect())
                .unwrap_or_default())
        })
    }

    fn rules(&mut self, family: NftFamily, table: &str, chain: Option<&str>) -> Nl<Vec<NftRule>> {
        let fake = Fake { w: self.w.clone(), nft: self.clone() };
        fake.with("nft_read", |w| {
            Ok(w.tables
                .get(&key(family, table))
                .map(|t| {
                    t.chains
                        .iter()
                        .filter(|(c, _)| chain.is_none_or(|x| x == c.name))
                        .flat_map(|(_, r)| r.iter().cloned())
                        .collect()
                })
                .unwrap_or_default())
        })
    }
}

impl Nft for FakeNft {
    fn apply(&mut self, ops: &[NftOp]) -> Nl<()> {
        let fake = Fake { w: self.w.clone(), nft: self.clone() };
        fake.with("nft_apply", |w| w.nft_apply(ops))
    }

    fn validate(&mut self, ops: &[NftOp]) -> Nl<()> {
        let fake = Fake { w: self.w.clone(), nft: self.clone() };
        fake.with("nft_validate", |w| {
            let mut tables = w.tables.clone();
            let mut h = w.next_handle;
            ops.iter().try_for_each(|op| apply_one(&mut tables, &mut h, op))
        })
    }
}

fn ns_of(f: &FakeLink, ns: Ns) -> bool {
    f.ns == ns
}

impl Kernel for Fake {
    fn link_by_name(&mut self, ns: Ns, name: &str) -> Nl<Option<Link>> {
        self.with("link_get", |w| Ok(w.link(ns, name).map(|l| l.link.clone())))
    }

    fn link_by_index(&mut self, ns: Ns, index: u32) -> Nl<Option<Link>> {
        self.with("link_get", |w| {
            Ok(w.links.iter().find(|l| ns_of(l, ns) && l.link.index == index).map(|l| l.link.clone()))
        })
    }

    fn links(&mut self, ns: Ns) -> Nl<Vec<Link>> {
        self.with("link_dump", |w| {
            Ok(w.links.iter().filter(|l| l.ns == ns).map(|l| l.link.clone()).collect())
        })
    }

    fn link_add(&mut self, spec: &LinkSpec<'_>, peer_in_container: bool) -> Nl<Link> {
        self.with("link_add", |w| {
            let exists = |w: &World, ns, name: &str| w.link(ns, name).is_some();
            if exists(w, Ns::Host, &spec.name) {
                return Err(NlError::new(format!("add link {}", spec.name), libc::EEXIST));
            }
            if let Some(m) = spec.master {
                if w.pos(Ns::Host, m).is_err() {
                    return Err(NlError::new("master", libc::ENODEV));
                }
            }
            let flags = if spec.up { IFF_UP } else { 0 };
            let mtu = spec.mtu.unwrap_or(1500);
            let index = match &spec.kind {
                LinkKind::Bridge { opts } => {
                    if opts.get(BridgeOpt::VLAN_FILTERING).is_some() && w.no_vlan_filtering {
                        return Err(NlError::new("add bridge with vlan_filtering", libc::EOPNOTSUPP));
                    }
                    let index = w.insert(Ns::Host, &spec.name, Some("bridge"), flags, spec.mac, mtu);
                    let p = w.pos(Ns::Host, index)?;
                    w.links[p].link.bridge.get_or_insert_default().merge(opts);
                    index
                }
                LinkKind::Veth { peer } => {
                    let peer_ns = if peer_in_container { Ns::Container } else { Ns::Host };
                    if exists(w, peer_ns, &peer.name) || (peer_ns == Ns::Host && peer.name == spec.name) {
                        return Err(NlError::new(format!("add link {}", peer.name), libc::EEXIST));
                    }
                    let h = w.insert(Ns::Host, &spec.name, Some("veth"), flags, spec.mac, mtu);
                    let pflags = if peer.up { IFF_UP } else { 0 };
                    let c = w.insert(
                        peer_ns,
                        &peer.name,
                        Some("veth"),
                        pflags,
                        peer.mac,
                        peer.mtu.unwrap_or(mtu),
                    );
                    let hp = w.pos(Ns::Host, h)?;
                    w.links[hp].link.link = Some(c);
                    let cp = w.pos(peer_ns, c)?;
                    w.links[cp].link.link = Some(h);
                    h
                }
                other => return Err(NlError::new(format!("fake: {other:?} not modelled"), libc::EOPNOTSUPP)),
            };
            let p = w.pos(Ns::Host, index)?;
            w.links[p].link.master = spec.master;
            w.links[p].link.alias = spec.alias.clone();
            if let Some(m) = spec.master {
                w.links[p].vlans = vec![PortVlan { vid: 1, pvid: true, untagged: true }];
                w.float_bridge_mac(Ns::Host, m);
            }
            let p = w.pos(Ns::Host, index)?;
            Ok(w.links[p].link.clone())
        })
    }

    fn link_del(&mut self, ns: Ns, index: u32) -> Nl<()> {
        self.with("link_del", |w| {
            w.pos(ns, index)?;
            w.unregister(ns, index);
            Ok(())
        })
    }

    fn link_set_up(&mut self, ns: Ns, index: u32) -> Nl<()> {
        self.with("link_set", |w| {
            let p = w.pos(ns, index)?;
            w.links[p].link.flags |= IFF_UP;
            w.links[p].link.oper_state = IF_OPER_UP;
            Ok(())
        })
    }

    fn link_set_mac(&mut self, ns: Ns, index: u32, mac: [u8; 6]) -> Nl<()> {
        self.with("link_set_mac", |w| {
            let p = w.pos(ns, index)?;
            // the kernel's is_valid_ether_addr: not zero, not multicast
            if mac == [0; 6] || mac[0] & 1 != 0 {
                return Err(NlError::new("set mac", libc::EADDRNOTAVAIL));
            }
            w.links[p].link.mac = Some(mac);
            w.mac_set.insert(index);
            Ok(())
        })
    }

    fn link_set_promisc(&mut self, ns: Ns, index: u32, on: bool) -> Nl<()> {
        self.with("link_set", |w| {
            let p = w.pos(ns, index)?;
            if on {
                w.links[p].link.flags |= IFF_PROMISC;
            } else {
                w.links[p].link.flags &= !IFF_PROMISC;
            }
            Ok(())
        })
    }

    fn link_set_ipv4_conf(&mut self, ns: Ns, index: u32, _conf: &[(u16, u32)], up: bool) -> Nl<()> {
        self.with("link_set", |w| {
            let p = w.pos(ns, index)?;
            if up {
                w.links[p].link.flags |= IFF_UP;
                w.links[p].link.oper_state = IF_OPER_UP;
                // the host end's carrier comes with its peer
                if let Some(peer) = w.links[p].link.link {
                    if let Some(h) = w.links.iter_mut().find(|l| l.link.index == peer) {
                        h.link.oper_state = IF_OPER_UP;
                    }
                }
            }
            Ok(())
        })
    }

    fn link_with_port_flags(&mut self, name: &str) -> Nl<Option<(Link, Option<PortFlags>)>> {
        self.with("link_get", |w| {
            Ok(w.link(Ns::Host, name).map(|l| (l.link.clone(), l.link.master.map(|_| l.port.clone()))))
        })
    }

    fn bridge_set(&mut self, index: u32, opts: &BridgeOpts) -> Nl<()> {
        self.with("bridge_set", |w| {
            let p = w.pos(Ns::Host, index)?;
            if opts.get(BridgeOpt::VLAN_FILTERING).is_some() && w.no_vlan_filtering {
                return Err(NlError::new("set bridge vlan_filtering", libc::EOPNOTSUPP));
            }
            // as the kernel: options of another kind of link are refused; each option sent is
            // set, the others stay as they were
            let Some(have) = w.links[p].link.bridge.as_mut() else {
                return Err(NlError::new("bridge options of a link that is no bridge", libc::EOPNOTSUPP));
            };
            have.merge(opts);
            Ok(())
        })
    }

    fn bridge_port_set(&mut self, index: u32, flags: &PortFlags, _up: bool) -> Nl<()> {
        self.with("port_set", |w| {
            let p = w.pos(Ns::Host, index)?;
            if w.links[p].link.master.is_none() {
                return Err(NlError::new("port flags of a link without master", libc::EINVAL));
            }
            // as the kernel: each flag sent is set, the others stay as they were
            for (f, on) in flags.iter() {
                w.links[p].port.set(f, on);
            }
            Ok(())
        })
    }

    fn bridge_port_vlans(&mut self, index: u32) -> Nl<Vec<PortVlan>> {
        self.with("vlan_get", |w| Ok(w.links[w.pos(Ns::Host, index)?].vlans.clone()))
    }

    fn bridge_vlan_del(&mut self, index: u32, vids: &[u16]) -> Nl<()> {
        self.with("vlan_set", |w| {
            if w.no_vlan_filtering {
                return Err(NlError::new("vlan del", libc::EOPNOTSUPP));
            }
            let p = w.pos(Ns::Host, index)?;
            w.links[p].vlans.retain(|v| !vids.contains(&v.vid));
            Ok(())
        })
    }

    fn bridge_vlan_add(&mut self, index: u32, vlans: &[PortVlan]) -> Nl<()> {
        self.with("vlan_set", |w| {
            if w.no_vlan_filtering {
                return Err(NlError::new("vlan add", libc::EOPNOTSUPP));
            }
            let p = w.pos(Ns::Host, index)?;
            for v in vlans {
                w.links[p].vlans.retain(|x| x.vid != v.vid);
                w.links[p].vlans.push(*v);
            }
            Ok(())
        })
    }

    fn addrs(&mut self, ns: Ns, index: Option<u32>, family: Option<Family>) -> Nl<Vec<Address>> {
        self.with("addr_dump", |w| {
            Ok(w.addrs
                .iter()
                .filter(|(n, a)| {
                    *n == ns
                        && index.is_none_or(|i| a.index == i)
                        && family.is_none_or(|f| Family::of(&a.addr.addr()) == f)
                })
                .map(|(_, a)| a.clone())
                .collect())
        })
    }

    fn addr_add(&mut self, ns: Ns, index: u32, net: IpNet) -> Nl<()> {
        self.with("addr_add", |w| {
            w.pos(ns, index)?;
            if w.addrs.iter().any(|(n, a)| *n == ns && a.index == index && a.addr.addr() == net.addr()) {
                return Err(NlError::new(format!("add address {net}"), libc::EEXIST));
            }
            w.addrs.push((ns, Address { index, addr: net, broadcast: None, flags: 0, scope: 0 }));
            // the connected route
            w.routes.push((ns, route(net.trunc(), None, Some(index))));
            Ok(())
        })
    }

    fn addr_del(&mut self, ns: Ns, index: u32, net: IpNet) -> Nl<()> {
        self.with("addr_del", |w| {
            let p = w
                .addrs
                .iter()
                .position(|(n, a)| *n == ns && a.index == index && a.addr == net)
                .ok_or_else(|| NlError::new(format!("delete address {net}"), libc::EADDRNOTAVAIL))?;
            w.addrs.remove(p);
            w.routes.retain(|(n, r)| {
                !(*n == ns && r.oif == Some(index) && r.dst == net.trunc() && r.gw.is_none())
            });
            Ok(())
        })
    }

    fn routes(&mut self, ns: Ns, family: Option<Family>) -> Nl<Vec<Route>> {
        self.with("route_dump", |w| {
            Ok(w.routes
                .iter()
                .filter(|(n, r)| *n == ns && family.is_none_or(|f| Family::of(&r.dst.addr()) == f))
                .map(|(_, r)| r.clone())
                .collect())
        })
    }

    fn route_add(&mut self, ns: Ns, spec: &RouteSpec) -> Nl<()> {
        self.with("route_add", |w| {
            if let Some(oif) = spec.oif {
                w.pos(ns, oif)?;
            }
            let mut r = route(spec.dst.trunc(), spec.gw, spec.oif);
            r.table = spec.table.unwrap_or(TABLE_MAIN);
            r.priority = spec.priority;
            r.mtu = spec.mtu;
            r.advmss = spec.advmss;
            r.scope = spec.scope.unwrap_or(0);
            // NLM_F_EXCL (not append): any route to the destination in the table and metric
            // is in the way; with append only the very same path is
            let in_the_way = |x: &Route| {
                x.dst == r.dst
                    && x.table == r.table
                    && x.priority == r.priority
                    && (!spec.append || (x.gw == r.gw && x.oif == r.oif))
            };
            if w.routes.iter().any(|(n, x)| *n == ns && in_the_way(x)) {
                return Err(NlError::new(format!("add route {}", spec.dst), libc::EEXIST));
            }
            w.routes.push((ns, r));
            Ok(())
        })
    }

    fn wait_link_oper_up(&mut self, index: u32, _timeout: Duration) -> Nl<Option<Link>> {
        self.with("wait_oper_up", |w| {
            let Some(l) = w.links.iter().find(|l| l.ns == Ns::Host && l.link.index == index) else {
                return Ok(None);
            };
            if l.link.oper_state != IF_OPER_UP {
                return Err(NlError::new("wait for the link to come up", libc::ETIMEDOUT));
            }
            Ok(Some(l.link.clone()))
        })
    }

    fn wait_addrs_settled(&mut self, _index: u32, _family: Option<Family>, _timeout: Duration) -> Result<()> {
        Ok(self.with("wait_settled", |_| Ok(()))?)
    }

    fn sysctl_get(&mut self, key: &str) -> std::io::Result<String> {
        let mut w = self.w.borrow_mut();
        if let Some(Fault::Before(e) | Fault::After(e)) = w.enter("sysctl_get") {
            return Err(std::io::Error::from_raw_os_error(e));
        }
        w.sysctls.get(key).cloned().ok_or_else(|| std::io::Error::from_raw_os_error(libc::ENOENT))
    }

    fn sysctl_set(&mut self, key: &str, value: &str) -> Result<bool> {
        self.cni("sysctl_set", |w| match w.sysctls.get_mut(key) {
            None => Err(CniError::io(format!("read sysctl {key}: No such file or directory"))),
            Some(v) if v == value => Ok(false),
            Some(v) => {
                *v = value.to_string();
                Ok(true)
            }
        })
    }

    fn sysctl_exists(&mut self, key: &str) -> bool {
        self.w.borrow().sysctls.contains_key(key)
    }

    fn ipv6_conf_names(&mut self) -> Vec<String> {
        let w = self.w.borrow();
        let mut names: Vec<String> = w
            .sysctls
            .keys()
            .filter_map(|k| k.strip_prefix("net/ipv6/conf/")?.split('/').next().map(String::from))
            .collect();
        names.dedup();
        names
    }

    fn container_sysctls(&mut self) -> Result<SysctlJob> {
        self.cni("ctr_sysctls_start", |_| Ok(()))?;
        let me = self.clone();
        Ok(Box::new(move |list| {
            me.cni("ctr_sysctls", |w| {
                for (k, v, _) in list {
                    w.ctr_sysctls.insert(k, v.to_string());
                }
                Ok(())
            })
        }))
    }

    fn ipam_add(&mut self) -> Result<IpamJob> {
        self.cni("ipam_start", |_| Ok(()))?;
        let me = self.clone();
        Ok(Box::new(move || {
            me.cni("ipam_add", |w| match w.ipam_answer.clone() {
                Some(Ok(out)) => {
                    w.ipam_reserved = true;
                    Ok(out.into_bytes())
                }
                Some(Err(e)) => Err(e),
                None => Err(CniError::internal("no IPAM answer in the fake")),
            })
        }))
    }

    fn ipam_del(&mut self) -> Result<()> {
        self.cni("ipam_del", |w| {
            w.ipam_reserved = false;
            Ok(())
        })
    }

    fn nft(&mut self) -> Result<&mut dyn Nft> {
        if self.w.borrow().no_nftables {
            return Err(CniError::new(cni_common::code::NOT_AVAILABLE, "nf_tables is not usable (fake)"));
        }
        Ok(&mut self.nft)
    }

    fn ipam_del_start(&mut self) -> Result<IpamJob> {
        self.cni("ipam_start", |_| Ok(()))?;
        let me = self.clone();
        Ok(Box::new(move || {
            me.cni("ipam_del", |w| {
                w.ipam_reserved = false;
                Ok(Vec::new())
            })
        }))
    }

    fn upstream_masq_gc(&mut self) -> Result<()> {
        self.cni("upstream_masq", |w| {
            w.upstream_masq_gcs += 1;
            Ok(())
        })
    }

    fn ipam_gc(&mut self) -> Result<()> {
        self.cni("ipam_gc", |_| Ok(()))
    }

    fn upstream_masq_del(&mut self) -> Result<()> {
        self.cni("upstream_masq", |w| {
            w.upstream_masq = false;
            Ok(())
        })
    }

    fn remove_firewall_parts(&mut self, _required: bool, spoof: bool) -> Result<()> {
        let a = self.w.borrow().attachment.clone().expect("the fake's attachment is set");
        crate::firewall::remove::remove_with(&mut self.nft, &a, spoof).map(drop)
    }

    fn upstream_masq_intact(&mut self) -> Result<bool> {
        self.cni("upstream_masq", |w| Ok(w.upstream_masq))
    }
    fn forward_drop_note(&mut self, subnet: ipnet::IpNet) -> Option<String> {
        let mut w = self.w.borrow_mut();
        w.forward_drop_asked.push(subnet);
        w.forward_drop.clone()
    }

    fn mac_pinned(&mut self, br: &Link) -> Option<bool> {
        let mut w = self.w.borrow_mut();
        // an injected fault is a sysfs that cannot be read
        if w.enter("mac_pinned").is_some() || w.mac_assign_unreadable || w.pos(Ns::Host, br.index).is_err() {
            return None;
        }
        Some(w.mac_set.contains(&br.index))
    }
}

fn route(dst: IpNet, gw: Option<std::net::IpAddr>, oif: Option<u32>) -> Route {
    Route {
        dst,
        gw,
        oif,
        table: TABLE_MAIN,
        priority: None,
        scope: 0,
        protocol: 4,
        mtu: None,
        advmss: None,
        kind: RouteKind::Unicast,
        prefsrc: None,
        nexthops: Vec::new(),
    }
}
