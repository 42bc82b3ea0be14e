//! The host and the container's namespace in memory, with the kernel's answers bandwidth
//! depends on: a link or qdisc that is not there is `ENODEV`/`ENOENT` (deleting a qdisc that is
//! not there is `Ok(false)`, as [`Netlink::qdisc_del`] reports it), creating a link whose name
//! is taken or a qdisc where there is one is `EEXIST`, deleting one end of a veth pair takes the
//! other, deleting a link takes its qdiscs and filters, and a redirect into a deleted device
//! then names device 0 (as the kernel reports it); looking up link 0 is `EINVAL`. Each link without a root qdisc of its own
//! lists the kernel's default one (`noqueue`, handle 0).
//!
//! Faults: [`Fake::fail_at`] fails the n-th changing call (so every failure point of ADD is
//! reached in turn), [`Fake::faults`] fails the n-th call of one operation, or applies it and
//! loses the reply; [`Fake::vanish`] removes a link just before the n-th call of an operation;
//! [`Fake::ns_gone`] is the container's namespace gone.
//!
//! [`Netlink::qdisc_del`]: cni_common::netlink::Netlink::qdisc_del

use super::*;
use cni_common::netlink::tc::{
    self, FilterAction, INGRESS_HANDLE, TCA_EGRESS_REDIR, TC_ACT_STOLEN, TC_H_INGRESS, TC_H_ROOT,
};
use std::collections::BTreeMap;

/// Which namespace a link is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Side {
    Host,
    Container,
}

/// Each operation of the seam, for fault injection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    CtrLink,
    EnterContainer,
    LinkByName,
    LinkByIndex,
    Links,
    CreateIfb,
    LinkDel,
    LinkDelByName,
    Qdiscs,
    QdiscAddTbf,
    QdiscAddIngress,
    QdiscDel,
    Filters,
    FilterAdd,
    Psched,
}

impl Op {
    fn changes(self) -> bool {
        matches!(
            self,
            Op::CreateIfb
                | Op::LinkDel
                | Op::LinkDelByName
                | Op::QdiscAddTbf
                | Op::QdiscAddIngress
                | Op::QdiscDel
                | Op::FilterAdd
        )
    }
}

/// What goes wrong at a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The call fails with this errno and changes nothing.
    Fail(i32),
    /// The change is applied but the reply is lost: the caller sees EIO.
    LostReply,
}

/// The psched clock of every kernel since 2.6.31 (15.625 ticks per µs).
pub const PSCHED: &str = "000003e8 00000040 000f4240 3b9aca00\n";

#[derive(Debug, Clone)]
pub struct Fake {
    /// By (side, index).
    pub links: BTreeMap<(Side, u32), Link>,
    /// The host's qdiscs (the container's are never asked for).
    pub qdiscs: Vec<Qdisc>,
    /// The host's filters.
    pub filters: Vec<Filter>,
    pub next_index: u32,
    /// `None`: `/proc/net/psched` cannot be read.
    pub psched: Option<Psched>,
    /// The container's namespace is gone (DEL finds none to enter; its links are gone).
    pub ns_gone: bool,
    /// Entering the container's namespace fails (e.g. CNI_NETNS names another kind of namespace).
    pub ns_error: bool,
    /// Calls made so far, per operation.
    pub calls: BTreeMap<Op, usize>,
    /// Changing calls made so far; with `fail_at = Some(n)` the n-th (from 1) fails (EIO).
    pub changes: usize,
    pub fail_at: Option<usize>,
    /// The n-th call (from 1) of an operation goes wrong.
    pub faults: Vec<(Op, usize, Fault)>,
    /// Just before the n-th call of an operation, the host link of this name is deleted (by
    /// someone else).
    pub vanish: Vec<(Op, usize, String)>,
}

fn err(op: Op, errno: i32) -> NlError {
    NlError::new(format!("{op:?}"), errno)
}

impl Default for Fake {
    fn default() -> Fake {
        Fake::new()
    }
}

impl Fake {
    pub fn new() -> Fake {
        Fake {
            links: BTreeMap::new(),
            qdiscs: Vec::new(),
            filters: Vec::new(),
            next_index: 10,
            psched: Psched::parse(PSCHED),
            ns_gone: false,
            ns_error: false,
            calls: BTreeMap::new(),
            changes: 0,
            fail_at: None,
            faults: Vec::new(),
            vanish: Vec::new(),
        }
    }

    fn index(&mut self) -> u32 {
        self.next_index += 1;
        self.next_index
    }

    /// A veth pair as bridge or ptp leaves it: `host` here, `ctr` in the container, each the
    /// other's peer in another namespace. Returns (host index, container index).
    pub fn veth(&mut self, host: &str, ctr: &str) -> (u32, u32) {
        let (h, c) = (self.index(), self.index());
        let mk = |index, name: &str, peer| Link {
            index,
            name: name.into(),
            kind: Some("veth".into()),
            mtu: 1500,
            mac: Some([0x02, 0, 0, 0, 0, index as u8]),
            flags: 1,
            link: Some(peer),
            link_netnsid: Some(0),
            txqlen: 1000,
            ..Link::default()
        };
        self.links.insert((Side::Host, h), mk(h, host, c));
        self.links.insert((Side::Container, c), mk(c, ctr, h));
        (h, c)
    }

    /// A link that is there before the test starts (someone else's, or a leftover).
    pub fn plant(&mut self, side: Side, link: Link) -> u32 {
        let index = self.index();
        self.links.insert((side, index), Link { index, ..link });
        index
    }

    /// An ifb as upstream's plugin or an earlier ADD left it, up.
    pub fn plant_ifb(&mut self, name: &str, alias: Option<&str>, group: u32) -> u32 {
        self.plant(
            Side::Host,
            Link {
                name: name.into(),
                kind: Some("ifb".into()),
                flags: 1,
                mtu: 1500,
                alias: alias.map(str::to_string),
                group,
                ..Link::default()
            },
        )
    }

    /// A u32 match-all filter on the ingress qdisc of `index` (added if missing) whose one
    /// action is `action`.
    pub fn plant_filter(&mut self, index: u32, prio: u16, action: FilterAction) {
        if !self.qdiscs.iter().any(|q| q.ifindex == index && q.parent == TC_H_INGRESS) {
            self.qdiscs.push(ingress(index));
        }
        self.filters.push(Filter {
            ifindex: index,
            parent: INGRESS_HANDLE,
            handle: 0x800_0800,
            prio,
            protocol: tc::ETH_P_ALL,
            kind: "u32".into(),
            match_all: true,
            actions: vec![action],
        });
    }

    pub fn host(&self, name: &str) -> Option<&Link> {
        self.links.iter().find(|((s, _), l)| *s == Side::Host && l.name == name).map(|(_, l)| l)
    }

    /// The host's links' names.
    pub fn host_names(&self) -> Vec<String> {
        self.links.iter().filter(|((s, _), _)| *s == Side::Host).map(|(_, l)| l.name.clone()).collect()
    }

    /// The `n`-th call of `op` from now (from 1) goes wrong.
    pub fn fault(&mut self, op: Op, n: usize, fault: Fault) {
        let at = self.calls.get(&op).copied().unwrap_or(0) + n;
        self.faults.push((op, at, fault));
    }

    /// Just before the `n`-th call of `op` from now, the host link `name` goes.
    pub fn vanish_at(&mut self, op: Op, n: usize, name: &str) {
        let at = self.calls.get(&op).copied().unwrap_or(0) + n;
        self.vanish.push((op, at, name.to_string()));
    }

    /// The explicit qdiscs of link `index` (not the default one), as `kind handle`.
    pub fn qdiscs_of(&self, index: u32) -> Vec<String> {
        self.qdiscs
            .iter()
            .filter(|q| q.ifindex == index)
            .map(|q| format!("{} {}", q.kind, tc::handle_str(q.handle)))
            .collect()
    }

    /// Count a call of `op`; apply the faults and vanishings planned for it. `Ok(true)`: go
    /// on but answer EIO afterwards (a lost reply).
    fn call(&mut self, op: Op) -> NlResult<bool> {
        let n = {
            let c = self.calls.entry(op).or_default();
            *c += 1;
            *c
        };
        let gone: Vec<String> = self
            .vanish
            .iter()
            .filter(|(o, at, _)| *o == op && *at == n)
            .map(|(_, _, name)| name.clone())
            .collect();
        for name in gone {
            if let Some(i) = self.host(&name).map(|l| l.index) {
                self.remove((Side::Host, i));
            }
        }
        if op.changes() {
            self.changes += 1;
            if self.fail_at == Some(self.changes) {
                return Err(err(op, libc::EIO));
            }
        }
        match self.faults.iter().find(|(o, at, _)| *o == op && *at == n).map(|f| f.2) {
            Some(Fault::Fail(errno)) => Err(err(op, errno)),
            Some(Fault::LostReply) => Ok(true),
            None => Ok(false),
        }
    }

    fn lost<T>(lost: bool, op: Op, v: T) -> NlResult<T> {
        if lost {
            Err(err(op, libc::EIO))
        } else {
            Ok(v)
        }
    }

    fn remove(&mut self, key: (Side, u32)) {
        let Some(l) = self.links.remove(&key) else { return };
        if key.0 == Side::Host {
            self.qdiscs.retain(|q| q.ifindex != key.1);
            self.filters.retain(|f| f.ifindex != key.1);
            for f in &mut self.filters {
                for a in &mut f.actions {
                    if let FilterAction::Mirred { ifindex, .. } = a {
                        if *ifindex == key.1 {
                            *ifindex = 0;
                        }
                    }
                }
            }
        }
        if l.kind.as_deref() == Some("veth") {
            if let Some(peer) = l.link {
                let other = if key.0 == Side::Host { Side::Container } else { Side::Host };
                self.remove((other, peer));
            }
        }
    }

    fn host_index(&self, index: u32) -> bool {
        self.links.contains_key(&(Side::Host, index))
    }
}

fn ingress(index: u32) -> Qdisc {
    Qdisc { ifindex: index, handle: INGRESS_HANDLE, parent: TC_H_INGRESS, kind: "ingress".into(), tbf: None }
}

impl Kernel for Fake {
    fn ctr_link_by_name(&mut self, name: &str) -> NlResult<Option<Link>> {
        Self::lost(self.call(Op::CtrLink)?, Op::CtrLink, ())?;
        Ok(self
            .links
            .iter()
            .find(|((s, _), l)| *s == Side::Container && l.name == name)
            .map(|(_, l)| l.clone()))
    }

    fn enter_container(&mut self) -> Result<bool> {
        self.call(Op::EnterContainer)?;
        if self.ns_error {
            return Err(CniError::internal("cannot enter CNI_NETNS: not a network namespace"));
        }
        Ok(!self.ns_gone)
    }

    fn link_by_name(&mut self, name: &str) -> NlResult<Option<Link>> {
        Self::lost(self.call(Op::LinkByName)?, Op::LinkByName, ())?;
        Ok(self.host(name).cloned())
    }

    fn link_by_index(&mut self, index: u32) -> NlResult<Option<Link>> {
        Self::lost(self.call(Op::LinkByIndex)?, Op::LinkByIndex, ())?;
        // RTM_GETLINK with neither an index nor a name.
        if index == 0 {
            return Err(err(Op::LinkByIndex, libc::EINVAL));
        }
        Ok(self.links.get(&(Side::Host, index)).cloned())
    }

    fn links(&mut self) -> NlResult<Vec<Link>> {
        Self::lost(self.call(Op::Links)?, Op::Links, ())?;
        Ok(self.links.iter().filter(|((s, _), _)| *s == Side::Host).map(|(_, l)| l.clone()).collect())
    }

    fn create_ifb(&mut self, s: &IfbSpec) -> NlResult<Link> {
        let lost = self.call(Op::CreateIfb)?;
        if self.host(&s.name).is_some() {
            return Err(err(Op::CreateIfb, libc::EEXIST));
        }
        let index = self.index();
        let l = Link {
            index,
            name: s.name.clone(),
            kind: Some("ifb".into()),
            mtu: s.mtu,
            mac: Some([0x0a, 0, 0, 0, 0, index as u8]),
            flags: 1,
            alias: Some(s.alias.clone()),
            txqlen: s.txqlen,
            group: s.group,
            ..Link::default()
        };
        self.links.insert((Side::Host, index), l.clone());
        Self::lost(lost, Op::CreateIfb, l)
    }

    fn link_del(&mut self, index: u32) -> NlResult<()> {
        let lost = self.call(Op::LinkDel)?;
        if !self.host_index(index) {
            return Err(err(Op::LinkDel, libc::ENODEV));
        }
        self.remove((Side::Host, index));
        Self::lost(lost, Op::LinkDel, ())
    }

    fn link_del_by_name(&mut self, name: &str) -> NlResult<bool> {
        let lost = self.call(Op::LinkDelByName)?;
        let Some(i) = self.host(name).map(|l| l.index) else {
            return Self::lost(lost, Op::LinkDelByName, false);
        };
        self.remove((Side::Host, i));
        Self::lost(lost, Op::LinkDelByName, true)
    }

    fn qdiscs(&mut self, index: Option<u32>) -> NlResult<Vec<Qdisc>> {
        Self::lost(self.call(Op::Qdiscs)?, Op::Qdiscs, ())?;
        let mut out = Vec::new();
        for (_, l) in
            self.links.iter().filter(|((s, i), _)| *s == Side::Host && index.is_none_or(|x| x == *i))
        {
            if !self.qdiscs.iter().any(|q| q.ifindex == l.index && q.parent == TC_H_ROOT) {
                out.push(Qdisc {
                    ifindex: l.index,
                    handle: 0,
                    parent: TC_H_ROOT,
                    kind: "noqueue".into(),
                    tbf: None,
                });
            }
            out.extend(self.qdiscs.iter().filter(|q| q.ifindex == l.index).cloned());
        }
        Ok(out)
    }

    fn qdisc_add_tbf(&mut self, index: u32, handle: u32, parent: u32, tbf: &Tbf) -> NlResult<()> {
        let lost = self.call(Op::QdiscAddTbf)?;
        if !self.host_index(index) {
            return Err(err(Op::QdiscAddTbf, libc::ENODEV));
        }
        if self.qdiscs.iter().any(|q| q.ifindex == index && q.parent == parent) {
            return Err(err(Op::QdiscAddTbf, libc::EEXIST));
        }
        self.qdiscs.push(Qdisc { ifindex: index, handle, parent, kind: "tbf".into(), tbf: Some(*tbf) });
        Self::lost(lost, Op::QdiscAddTbf, ())
    }

    fn qdisc_add_ingress(&mut self, index: u32) -> NlResult<()> {
        let lost = self.call(Op::QdiscAddIngress)?;
        if !self.host_index(index) {
            return Err(err(Op::QdiscAddIngress, libc::ENODEV));
        }
        if self.qdiscs.iter().any(|q| q.ifindex == index && q.parent == TC_H_INGRESS) {
            return Err(err(Op::QdiscAddIngress, libc::EEXIST));
        }
        self.qdiscs.push(ingress(index));
        Self::lost(lost, Op::QdiscAddIngress, ())
    }

    fn qdisc_del(&mut self, index: u32, parent: u32, handle: u32) -> NlResult<bool> {
        let lost = self.call(Op::QdiscDel)?;
        let before = self.qdiscs.len();
        self.qdiscs.retain(|q| !(q.ifindex == index && q.parent == parent && q.handle == handle));
        let deleted = self.qdiscs.len() != before;
        if deleted && parent == TC_H_INGRESS {
            self.filters.retain(|f| f.ifindex != index);
        }
        Self::lost(lost, Op::QdiscDel, deleted)
    }

    fn filters(&mut self, index: u32, parent: u32) -> NlResult<Vec<Filter>> {
        Self::lost(self.call(Op::Filters)?, Op::Filters, ())?;
        Ok(self.filters.iter().filter(|f| f.ifindex == index && f.parent == parent).cloned().collect())
    }

    fn filter_add_redirect(&mut self, index: u32, parent: u32, prio: u16, target: u32) -> NlResult<()> {
        let lost = self.call(Op::FilterAdd)?;
        if !self.host_index(index) {
            return Err(err(Op::FilterAdd, libc::ENODEV));
        }
        if !self.qdiscs.iter().any(|q| q.ifindex == index && q.handle == parent) {
            return Err(err(Op::FilterAdd, libc::EINVAL));
        }
        if self.filters.iter().any(|f| f.ifindex == index && f.parent == parent && f.prio == prio) {
            return Err(err(Op::FilterAdd, libc::EEXIST));
        }
        self.filters.push(Filter {
            ifindex: index,
            parent,
            handle: 0x800_0800,
            prio,
            protocol: tc::ETH_P_ALL,
            kind: "u32".into(),
            match_all: true,
            actions: vec![FilterAction::Mirred {
                eaction: TCA_EGRESS_REDIR,
                ifindex: target,
                verdict: TC_ACT_STOLEN,
            }],
        });
        Self::lost(lost, Op::FilterAdd, ())
    }

    fn psched(&mut self) -> std::io::Result<Psched> {
        self.call(Op::Psched).map_err(|e| std::io::Error::other(e.to_string()))?;
        self.psched.ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no /proc/net/psched"))
    }
}
