//! Two network namespaces in memory, with the kernel's answers ptp depends on: a link name
//! taken is `EEXIST` (in either namespace, for a veth pair), an address or a non-append route
//! already there is `EEXIST`, anything on a link that is gone is `ENOENT`, deleting one end of a
//! veth pair takes the other with it (and everything on both), and a link can vanish between
//! two calls (the container's namespace went away). [`Fake::fail_at`] makes the n-th changing
//! call fail, so every failure point of ADD is reached in turn.

use super::*;
use cni_common::netlink::SCOPE_LINK;
use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeLink {
    pub link: Link,
    pub side: Side,
    pub addrs: Vec<(IpNet, bool)>,
}

#[derive(Debug, Clone, Default)]
pub struct Fake {
    /// By (side, index).
    pub links: BTreeMap<(Side, u32), FakeLink>,
    pub routes: Vec<(Side, u32, RouteWant)>,
    pub next_index: u32,
    pub forward: (bool, bool),
    pub ctr_v6: bool,
    pub masq: BTreeMap<String, (AttachmentId, Vec<IpNet>)>,
    pub nft_missing: bool,
    /// Changing calls made so far; with `fail_at = Some(n)` the n-th (from 1) fails.
    pub changes: usize,
    pub fail_at: Option<usize>,
    /// The n-th changing call never returns (the process was killed there): a panic the test
    /// catches, after which nothing of ADD's undo runs.
    pub crash_at: Option<usize>,
    /// Remove the container's links just before the next changing call (the namespace went).
    pub vanish_next: bool,
    /// The same just before the n-th changing call (from 1).
    pub vanish_at: Option<usize>,
    /// The container's namespace is gone: nothing can be created in it any more.
    pub ns_gone: bool,
}

fn err(op: &str, errno: i32) -> NlError {
    NlError::new(op.to_string(), errno)
}

impl Fake {
    pub fn new() -> Fake {
        Fake { next_index: 10, ..Fake::default() }
    }

    /// A link that is there before the test starts (another program's, or a leftover).
    pub fn plant(&mut self, side: Side, name: &str, kind: &str) -> u32 {
        self.next_index += 1;
        let link =
            Link { index: self.next_index, name: name.into(), kind: Some(kind.into()), ..Link::default() };
        self.links.insert((side, link.index), FakeLink { link, side, addrs: Vec::new() });
        self.next_index
    }

    fn change(&mut self, op: &str) -> NlResult<()> {
        if self.vanish_next || self.vanish_at == Some(self.changes + 1) {
            self.vanish_next = false;
            self.ns_gone = true;
            let gone: Vec<(Side, u32)> =
                self.links.keys().filter(|(s, _)| *s == Side::Container).copied().collect();
            for k in gone {
                self.remove_link(k);
            }
        }
        self.changes += 1;
        if self.crash_at == Some(self.changes) {
            panic!("killed at change {}", self.changes);
        }
        if self.fail_at == Some(self.changes) {
            return Err(err(op, libc::EIO));
        }
        Ok(())
    }

    fn by_name(&self, side: Side, name: &str) -> Option<&FakeLink> {
        self.links.values().find(|l| l.side == side && l.link.name == name)
    }

    fn remove_link(&mut self, key: (Side, u32)) {
        if let Some(l) = self.links.remove(&key) {
            self.routes.retain(|(s, i, _)| !(*s == key.0 && *i == key.1));
            if let Some(peer) = l.link.link {
                let other = if key.0 == Side::Host { Side::Container } else { Side::Host };
                if self.links.remove(&(other, peer)).is_some() {
                    self.routes.retain(|(s, i, _)| !(*s == other && *i == peer));
                }
            }
        }
    }

    /// Names of the links on `side`.
    pub fn names(&self, side: Side) -> Vec<String> {
        self.links.values().filter(|l| l.side == side).map(|l| l.link.name.clone()).collect()
    }
}

impl Kernel for Fake {
    fn link(&mut self, side: Side, name: &str) -> NlResult<Option<Link>> {
        Ok(self.by_name(side, name).map(|l| l.link.clone()))
    }

    fn link_by_index(&mut self, side: Side, index: u32) -> NlResult<Option<Link>> {
        Ok(self.links.get(&(side, index)).map(|l| l.link.clone()))
    }

    fn create_veth(&mut self, host: &str, ctr: &str, mtu: Option<u32>) -> NlResult<Link> {
        self.change("create veth")?;
        if self.ns_gone {
            return Err(err("create veth: the container's namespace is gone", libc::ENOENT));
        }
        if self.by_name(Side::Host, host).is_some() || self.by_name(Side::Container, ctr).is_some() {
            return Err(err("create veth", libc::EEXIST));
        }
        let (hi, ci) = (self.next_index + 1, self.next_index + 2);
        self.next_index += 2;
        let mk = |index, name: &str, peer, up| Link {
            index,
            name: name.into(),
            kind: Some("veth".into()),
            mtu: mtu.unwrap_or(1500),
            mac: Some([0x02, 0, 0, 0, 0, index as u8]),
            flags: if up { 1 } else { 0 },
            link: Some(peer),
            ..Link::default()
        };
        let h = mk(hi, host, ci, true);
        self.links
            .insert((Side::Host, hi), FakeLink { link: h.clone(), side: Side::Host, addrs: Vec::new() });
        let c = mk(ci, ctr, hi, false);
        self.links
            .insert((Side::Container, ci), FakeLink { link: c, side: Side::Container, addrs: Vec::new() });
        Ok(h)
    }

    fn link_up(&mut self, side: Side, index: u32) -> NlResult<()> {
        self.change("link up")?;
        let l = self.links.get_mut(&(side, index)).ok_or_else(|| err("link up", libc::ENODEV))?;
        l.link.flags |= 1;
        Ok(())
    }

    fn link_del(&mut self, side: Side, index: u32) -> NlResult<()> {
        self.change("link del")?;
        if !self.links.contains_key(&(side, index)) {
            return Err(err("link del", libc::ENODEV));
        }
        self.remove_link((side, index));
        Ok(())
    }

    fn addr_add(&mut self, side: Side, index: u32, net: IpNet, noprefixroute: bool) -> NlResult<()> {
        self.change("addr add")?;
        let l = self.links.get_mut(&(side, index)).ok_or_else(|| err("addr add", libc::ENODEV))?;
        if l.addrs.iter().any(|(a, _)| *a == net) {
            return Err(err("addr add", libc::EEXIST));
        }
        l.addrs.push((net, noprefixroute));
        if !noprefixroute && net.prefix_len() < net.max_prefix_len() {
            let mut r = RouteWant {
                dst: net.trunc(),
                gw: None,
                src: Some(net.addr()),
                scope: Some(SCOPE_LINK),
                table: None,
                priority: None,
                mtu: None,
                advmss: None,
                append: false,
            };
            r.append = false;
            self.routes.push((side, index, r));
        }
        Ok(())
    }

    fn addrs(&mut self, side: Side, index: u32) -> NlResult<Vec<IpNet>> {
        let l = self.links.get(&(side, index)).ok_or_else(|| err("addrs", libc::ENODEV))?;
        Ok(l.addrs.iter().map(|(a, _)| *a).collect())
    }

    fn route_add(&mut self, side: Side, index: u32, r: &RouteWant) -> NlResult<()> {
        self.change("route add")?;
        if !self.links.contains_key(&(side, index)) {
            return Err(err("route add", libc::ENODEV));
        }
        if !r.append && self.routes.iter().any(|(s, _, x)| *s == side && x.dst == r.dst && x.table == r.table)
        {
            return Err(err("route add", libc::EEXIST));
        }
        if let Some(gw) = r.gw {
            // The gateway must be reachable through a link route of this interface.
            let reachable = self
                .routes
                .iter()
                .any(|(s, i, x)| *s == side && *i == index && x.gw.is_none() && x.dst.contains(&gw));
            if !reachable {
                return Err(err("route add: gateway unreachable", libc::ENETUNREACH));
            }
        }
        self.routes.push((side, index, r.clone()));
        Ok(())
    }

    fn routes(&mut self, side: Side) -> NlResult<Vec<RouteSeen>> {
        Ok(self
            .routes
            .iter()
            .filter(|(s, _, _)| *s == side)
            .map(|(_, i, r)| RouteSeen {
                dst: r.dst,
                gw: r.gw,
                oif: Some(*i),
                scope: r.scope.unwrap_or(0),
                table: r.table.unwrap_or(254),
            })
            .collect())
    }

    fn ctr_enable_ipv6(&mut self, _ifname: &str) -> Result<()> {
        self.change("enable ipv6")?;
        self.ctr_v6 = true;
        Ok(())
    }

    fn ctr_settle_v6(&mut self, _index: u32) -> Result<()> {
        self.change("settle")?;
        Ok(())
    }

    fn forward(&mut self, v4: bool, v6: bool) -> Result<()> {
        self.change("forward")?;
        self.forward.0 |= v4;
        self.forward.1 |= v6;
        Ok(())
    }

    fn nft_ready(&mut self) -> Result<()> {
        if self.nft_missing {
            return Err(CniError::new(code::NOT_AVAILABLE, "nf_tables is not usable"));
        }
        Ok(())
    }

    fn masq_set(&mut self, a: &AttachmentId, addrs: &[IpNet]) -> Result<()> {
        self.nft_ready()?;
        self.change("masq set")?;
        self.masq.insert(a.masq_tag(), (a.clone(), addrs.to_vec()));
        Ok(())
    }

    fn masq_remove(&mut self, a: &AttachmentId) -> Result<bool> {
        self.nft_ready()?;
        Ok(self.masq.remove(&a.masq_tag()).is_some())
    }

    fn masq_missing(&mut self, a: &AttachmentId, addrs: &[IpNet]) -> Result<Option<String>> {
        Ok(match self.masq.get(&a.masq_tag()) {
            Some((_, have)) if have == addrs => None,
            _ => Some("masquerade rules differ".into()),
        })
    }

    fn masq_gc(&mut self, network: &str, keep: &HashSet<String>) -> Result<bool> {
        self.nft_ready()?;
        let before = self.masq.len();
        self.masq.retain(|tag, (a, _)| a.network != network || keep.contains(tag));
        Ok(self.masq.len() != before)
    }

    fn masq_validate(&mut self) -> Result<()> {
        self.nft_ready()
    }
}
