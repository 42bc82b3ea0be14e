//! Two network namespaces in memory, with the kernel's answers ptp depends on: a link name
//! taken is `EEXIST` (in either namespace, for a veth pair), an address or a non-append route
//! already there is `EEXIST`, anything on a link that is gone is `ENOENT`, deleting one end of a
//! veth pair takes the other with it (and everything on both), and a link can vanish between
//! two calls (the container's namespace went away). [`Fake::fail_at`] makes the n-th changing
//! call fail, so every failure point of ADD is reached in turn.
//!
//! What it models is checked against the kernel by [`super::conformance`] (the same script,
//! the same answers): a route through a link that is down is `ENETDOWN`; an unreachable
//! gateway is `ENETUNREACH` for IPv4 and `EHOSTUNREACH` for IPv6; taking a link down removes the
//! routes through it and its IPv6 addresses unless `keep_addr_on_down` is 1 (IPv4 addresses
//! stay), and bringing it up again restores the prefix routes of the addresses it kept;
//! sysctls are values per namespace (`/proc/sys`), written by `ctr_enable_ipv6` and `forward`
//! and read back, a per-interface key existing only while its interface does.

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
    /// The sysctls written, by namespace and slash-form key; unwritten ones read as "0".
    pub sysctls: BTreeMap<(Side, String), String>,
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
            self.forget(key.0, key.1, &l.link.name);
            if let Some(peer) = l.link.link {
                let other = if key.0 == Side::Host { Side::Container } else { Side::Host };
                if let Some(p) = self.links.remove(&(other, peer)) {
                    self.forget(other, peer, &p.link.name);
                }
            }
        }
    }

    /// What goes with a link: its routes and its per-interface sysctls.
    fn forget(&mut self, side: Side, index: u32, name: &str) {
        self.routes.retain(|(s, i, _)| !(*s == side && *i == index));
        self.sysctls.retain(|(s, k), _| !(*s == side && Self::key_dev(k) == Some(name)));
    }

    /// Forwarding in the host as the sysctls say: (IPv4, IPv6).
    pub fn forwarding(&self) -> (bool, bool) {
        let on = |k: &str| self.sysctls.get(&(Side::Host, k.to_string())).is_some_and(|v| v == "1");
        (on("net/ipv4/ip_forward"), on("net/ipv6/conf/all/forwarding"))
    }

    /// The container's sysctls that were written (IPv6 turned on, addresses kept on down).
    pub fn ctr_sysctls(&self) -> BTreeMap<String, String> {
        self.sysctls
            .iter()
            .filter(|((s, _), _)| *s == Side::Container)
            .map(|((_, k), v)| (k.clone(), v.clone()))
            .collect()
    }

    /// The interface a key is about (`net/ipv6/conf/<dev>/…`), when it is a per-interface one.
    fn key_dev(key: &str) -> Option<&str> {
        let rest = key.strip_prefix("net/ipv6/conf/").or_else(|| key.strip_prefix("net/ipv4/conf/"))?;
        rest.split('/').next()
    }

    /// Whether `key` exists in `side`'s `/proc/sys`: global keys this fake knows, and per
    /// interface ones of `all`, `default`, `lo` and the side's links.
    fn key_exists(&self, side: Side, key: &str) -> bool {
        match Self::key_dev(key) {
            Some("all" | "default" | "lo") => true,
            Some(dev) => self.by_name(side, dev).is_some(),
            None => key == "net/ipv4/ip_forward",
        }
    }

    fn sysctl_value(&self, side: Side, key: &str) -> Option<String> {
        if !self.key_exists(side, key) {
            return None;
        }
        Some(self.sysctls.get(&(side, key.to_string())).cloned().unwrap_or_else(|| "0".into()))
    }

    fn sysctl_set(&mut self, side: Side, key: &str, value: &str) -> Result<()> {
        if !self.key_exists(side, key) {
            return Err(CniError::io(format!("set sysctl {key} to {value:?}: No such file or directory")));
        }
        self.sysctls.insert((side, key.to_string()), value.to_string());
        Ok(())
    }

    /// The kernel's route to the subnet of an address added without `noprefixroute`.
    fn prefix_route(net: IpNet) -> Option<RouteWant> {
        (net.prefix_len() < net.max_prefix_len()).then(|| RouteWant {
            dst: net.trunc(),
            gw: None,
            src: Some(net.addr()),
            scope: Some(SCOPE_LINK),
            table: None,
            priority: None,
            mtu: None,
            advmss: None,
            append: false,
        })
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
        if l.link.flags & 1 == 0 {
            l.link.flags |= 1;
            // The kernel restores the subnet routes of the addresses the link kept.
            let back: Vec<RouteWant> = l
                .addrs
                .iter()
                .filter(|(_, noprefix)| !noprefix)
                .filter_map(|(a, _)| Self::prefix_route(*a))
                .collect();
            self.routes.extend(back.into_iter().map(|r| (side, index, r)));
        }
        Ok(())
    }

    fn link_down(&mut self, side: Side, index: u32) -> NlResult<()> {
        self.change("link down")?;
        let name =
            self.links.get(&(side, index)).ok_or_else(|| err("link down", libc::ENODEV))?.link.name.clone();
        let keep = |k: &Fake, dev: &str| {
            k.sysctl_value(side, &sysctl::iface_key("ipv6", dev, "keep_addr_on_down"))
                .is_some_and(|v| v == "1")
        };
        let keep_v6 = keep(self, &name) || keep(self, "all");
        self.routes.retain(|(s, i, _)| !(*s == side && *i == index));
        let l = self.links.get_mut(&(side, index)).expect("looked up above");
        l.link.flags &= !1;
        if !keep_v6 {
            l.addrs.retain(|(a, _)| matches!(a, IpNet::V4(_)));
        }
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
        // A link that is down gets the subnet route when it comes up.
        let up = l.link.flags & 1 != 0;
        if let Some(r) = Self::prefix_route(net).filter(|_| !noprefixroute && up) {
            self.routes.push((side, index, r));
        }
        Ok(())
    }

    fn addr_del(&mut self, side: Side, index: u32, net: IpNet) -> NlResult<()> {
        self.change("addr del")?;
        let l = self.links.get_mut(&(side, index)).ok_or_else(|| err("addr del", libc::ENODEV))?;
        let before = l.addrs.len();
        l.addrs.retain(|(a, _)| *a != net);
        if l.addrs.len() == before {
            return Err(err("addr del", libc::EADDRNOTAVAIL));
        }
        // Its subnet route goes with it.
        if let Some(r) = Self::prefix_route(net) {
            self.routes.retain(|(s, i, x)| !(*s == side && *i == index && x.dst == r.dst && x.src == r.src));
        }
        Ok(())
    }

    fn addrs(&mut self, side: Side, index: u32) -> NlResult<Vec<IpNet>> {
        let l = self.links.get(&(side, index)).ok_or_else(|| err("addrs", libc::ENODEV))?;
        Ok(l.addrs.iter().map(|(a, _)| *a).collect())
    }

    fn route_add(&mut self, side: Side, index: u32, r: &RouteWant) -> NlResult<()> {
        self.change("route add")?;
        let l = self.links.get(&(side, index)).ok_or_else(|| err("route add", libc::ENODEV))?;
        if l.link.flags & 1 == 0 {
            return Err(err("route add: the link is down", libc::ENETDOWN));
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
                // Through netlink: IPv4 finds no network, IPv6 no route to the host.
                let errno = if gw.is_ipv4() { libc::ENETUNREACH } else { libc::EHOSTUNREACH };
                return Err(err("route add: gateway unreachable", errno));
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
                // IPv6 has no route scopes: every route reads back as universe.
                scope: if r.dst.addr().is_ipv4() { r.scope.unwrap_or(0) } else { 0 },
                table: r.table.unwrap_or(254),
            })
            .collect())
    }

    fn ctr_enable_ipv6(&mut self, ifname: &str) -> Result<()> {
        self.change("enable ipv6")?;
        for dev in ["lo", ifname] {
            self.sysctl_set(Side::Container, &sysctl::iface_key("ipv6", dev, "disable_ipv6"), "0")?;
        }
        self.sysctl_set(Side::Container, &sysctl::iface_key("ipv6", ifname, "keep_addr_on_down"), "1")
    }

    fn sysctl_get(&mut self, side: Side, key: &str) -> Result<String> {
        self.sysctl_value(side, key)
            .ok_or_else(|| CniError::io(format!("read sysctl {key}: No such file or directory")))
    }

    fn ctr_settle_v6(&mut self, _index: u32) -> Result<()> {
        self.change("settle")?;
        Ok(())
    }

    fn forward(&mut self, v4: bool, v6: bool) -> Result<()> {
        self.change("forward")?;
        if v4 {
            self.sysctl_set(Side::Host, "net/ipv4/ip_forward", "1")?;
        }
        if v6 {
            self.sysctl_set(Side::Host, "net/ipv6/conf/all/forwarding", "1")?;
        }
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
