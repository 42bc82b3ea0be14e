//! Floors: the kernel requests of a plugin's plan issued bare, from inside the driver (no
//! process start, no config parsing, no reads the plugin does to decide), through cni-common's
//! own netlink API. What a plugin process costs beyond its floor is start-up plus its own
//! work; the floor itself is what any implementation on this kernel must wait for.
//!
//! Each floor mirrors one plugin's plan, request by request, as far as it changes the kernel:
//! - bridge ADD: the veth pair created with its container end in the container namespace,
//!   enslaved and up; `accept_ra` of the host end; the container end's IPv6 sysctls, ARP
//!   notification and up (one request), addresses, routes; `ip_forward`; the host-local
//!   reservation file; the wait until the host end is operationally up (the plugin must
//!   report a working port). With `ipMasq` the masquerade rule, one nf_tables transaction.
//! - bridge DEL: the container end deleted (RTM_DELLINK: the pair goes, and the kernel's
//!   unregistration waits for RCU grace periods), the reservation file removed; with
//!   `ipMasq` the rule deleted in one transaction and its socket closed (the kernel waits
//!   for a grace period before it frees what the transaction deleted).
//! - bandwidth ADD: tbf on the host veth, the ifb (created up, alias set), tbf on the ifb,
//!   ingress qdisc, u32/mirred redirect. DEL: both qdiscs of the veth and the ifb.
//! - portmap ADD: one transaction adding the gate and the attachment's elements (owner and
//!   claims maps, DNAT map, two masquerade elements) in a table with portmap's set types;
//!   DEL: one transaction re-asserting the owner claim and deleting those elements, its
//!   socket closed.
//!
//! The floor tables are the driver's own (`inet cnibench_*`), never the plugins'.

use crate::{unique, Netns, TempDir};
use cni_common::netlink::nft::{
    concat, BaseChain, CmpOp, NfTables, NftData, NftDelete, NftElem, NftFamily, NftOp, NftSet, NftSetData,
    NftType, RuleExpr, Verdict, HOOK_POSTROUTING,
};
use cni_common::netlink::tc::{self, Psched, Tbf, INGRESS_HANDLE, TC_H_INGRESS, TC_H_ROOT};
use cni_common::netlink::{
    LinkKind, LinkSpec, Netlink, PortFlags, RouteSpec, VethPeer, IPV4_DEVCONF_ARP_NOTIFY,
};
use cni_common::netns::NetNs;
use cni_common::sysctl;
use ipnet::IpNet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::AsFd;
use std::time::Duration;

const FAM: NftFamily = NftFamily::Inet;

fn must<T, E: std::fmt::Display>(what: &str, r: Result<T, E>) -> T {
    r.unwrap_or_else(|e| panic!("floor: {what}: {e}"))
}

/// Which parts of bridge's plan a floor issues.
#[derive(Debug, Clone, Copy, Default)]
pub struct BridgePlan {
    /// An IPv6 address too (and the IPv6 sysctls that go with it).
    pub v6: bool,
    /// A default route per family (kubenet's ranges carry them).
    pub default_routes: bool,
    pub hairpin: bool,
    /// `ipMasq`: one masquerade rule per address.
    pub masq: bool,
    pub mtu: Option<u32>,
}

/// One attachment made by a bridge floor, for its DEL.
pub struct BridgeAttachment {
    /// The host end's name (bandwidth's floor shapes it).
    pub host_veth: String,
    ctr_index: u32,
    reservations: Vec<std::path::PathBuf>,
    rules: Vec<u64>,
    comment: String,
}

/// A bridge of the driver's own (made with `ip`, untimed) on which the floor attaches
/// containers, with its own reservation directory and masquerade table.
pub struct BridgeFloor {
    plan: BridgePlan,
    bridge: u32,
    net: u8,
    next: u32,
    data: TempDir,
    table: String,
}

const MASQ_CHAIN: &str = "masq_checks";

impl BridgeFloor {
    /// `net` picks the subnets 10.<net>.0.0/16 and fd00:<net>::/64 (gateway .1 / ::1 on the bridge).
    pub fn new(plan: BridgePlan, net: u8) -> BridgeFloor {
        let name = unique("bfl");
        let run = |args: &[&str]| crate::sh("ip", args);
        run(&["link", "add", &name, "type", "bridge"]);
        run(&["addr", "add", &format!("10.{net}.0.1/16"), "dev", &name]);
        if plan.v6 {
            run(&["addr", "add", &format!("fd00:{net}::1/64"), "dev", &name, "nodad"]);
        }
        if let Some(m) = plan.mtu {
            run(&["link", "set", &name, "mtu", &m.to_string()]);
        }
        run(&["link", "set", &name, "up"]);
        let bridge = must("bridge index", Netlink::new().and_then(|mut n| n.link_by_name(&name)))
            .expect("floor bridge exists")
            .index;
        let table = unique("cnibench_m");
        if plan.masq {
            let ops = vec![
                NftOp::AddTable { family: FAM, table: table.clone(), comment: None },
                NftOp::AddChain {
                    family: FAM,
                    table: table.clone(),
                    chain: "postrouting".into(),
                    base: Some(BaseChain {
                        kind: "nat".into(),
                        hook: HOOK_POSTROUTING,
                        priority: 100,
                        policy: None,
                    }),
                    comment: None,
                },
                NftOp::AddChain {
                    family: FAM,
                    table: table.clone(),
                    chain: MASQ_CHAIN.into(),
                    base: None,
                    comment: None,
                },
                NftOp::rule(
                    FAM,
                    &table,
                    "postrouting",
                    vec![RuleExpr::Verdict(Verdict::Goto(MASQ_CHAIN.into()))],
                    None,
                ),
            ];
            must("masquerade table", NfTables::new().and_then(|mut nf| nf.apply(&ops)));
        }
        BridgeFloor { plan, bridge, net, next: 1, data: TempDir::new("bfl"), table }
    }

    fn addrs(&mut self) -> (IpNet, Option<IpNet>) {
        self.next = if self.next >= 60_000 { 2 } else { self.next + 1 };
        let n = self.next;
        let v4 = IpNet::new(IpAddr::V4(Ipv4Addr::new(10, self.net, (n >> 8) as u8, n as u8)), 16).unwrap();
        let v6 = self.plan.v6.then(|| {
            let a = Ipv6Addr::new(0xfd00, u16::from(self.net), 0, 0, 0, 0, 0, n as u16);
            IpNet::new(IpAddr::V6(a), 64).unwrap()
        });
        (v4, v6)
    }

    fn gateway(&self, v6: bool) -> IpAddr {
        if v6 {
            IpAddr::V6(Ipv6Addr::new(0xfd00, u16::from(self.net), 0, 0, 0, 0, 0, 1))
        } else {
            IpAddr::V4(Ipv4Addr::new(10, self.net, 0, 1))
        }
    }

    /// The ADD plan's kernel requests for a container in `ctr` (interface `eth0`). Timed by
    /// the caller.
    pub fn add(&mut self, ctr: &Netns) -> BridgeAttachment {
        let (v4, v6) = self.addrs();
        let id = unique("fl");
        let mut host = must("host socket", Netlink::new());
        let ns = must("open netns", NetNs::open(ctr.path()));
        let mut c = must("container socket", Netlink::new_in(&ns));
        let peer = VethPeer::new("eth0", Some(ns.as_fd()));
        let spec = LinkSpec {
            up: true,
            master: Some(self.bridge),
            mtu: self.plan.mtu,
            ..LinkSpec::new(unique("vfl"), LinkKind::Veth { peer })
        };
        let hv = must("create veth pair", host.link_add(&spec));
        must("accept_ra", sysctl::set(&sysctl::iface_key("ipv6", &hv.name, "accept_ra"), "0"));
        if self.plan.hairpin {
            let flags = PortFlags { hairpin: true, isolated: false };
            must("hairpin", host.bridge_port_set(hv.index, flags, false));
        }
        let ci = hv.link.expect("veth reports its peer");
        let v6on = self.plan.v6;
        must(
            "container sysctls",
            ns.run(|| {
                let key = |dev: &str, leaf: &str| sysctl::iface_key("ipv6", dev, leaf);
                sysctl::set(&key("eth0", "accept_dad"), "0")?;
                if v6on {
                    sysctl::set(&key("lo", "disable_ipv6"), "0")?;
                    sysctl::set(&key("eth0", "disable_ipv6"), "0")?;
                    sysctl::set(&key("eth0", "keep_addr_on_down"), "1")?;
                }
                Ok(())
            }),
        );
        must("arp_notify + up", c.link_set_ipv4_conf(ci, &[(IPV4_DEVCONF_ARP_NOTIFY, 1)], true));
        let mut nets = vec![v4];
        nets.extend(v6);
        for a in &nets {
            must("address", c.addr_add(ci, *a));
        }
        if self.plan.default_routes {
            for a in &nets {
                let v6 = a.addr().is_ipv6();
                let dst: IpNet = if v6 { "::/0".parse().unwrap() } else { "0.0.0.0/0".parse().unwrap() };
                let spec = RouteSpec {
                    gw: Some(self.gateway(v6)),
                    oif: Some(ci),
                    append: true,
                    ..RouteSpec::new(dst)
                };
                must("route", c.route_add(&spec));
            }
        }
        must("ip_forward", sysctl::set("net/ipv4/ip_forward", "1"));
        if v6on {
            must("forwarding", sysctl::set("net/ipv6/conf/all/forwarding", "1"));
        }
        let mut reservations = Vec::new();
        for a in &nets {
            let p = self.data.join(a.addr().to_string());
            let mut f = must("reservation", std::fs::File::create_new(&p));
            must("reservation", std::io::Write::write_all(&mut f, format!("{id}\r\neth0").as_bytes()));
            reservations.push(p);
        }
        let comment = format!("{id}, net: floor, if: eth0, id: {id}");
        if self.plan.masq {
            let subnet = IpNet::new(IpAddr::V4(Ipv4Addr::new(10, self.net, 0, 0)), 16).unwrap();
            let ops: Vec<NftOp> = nets
                .iter()
                .filter(|a| a.addr().is_ipv4())
                .map(|a| {
                    let mut e = RuleExpr::nfproto(true);
                    e.extend(RuleExpr::addr(true, IpNet::from(a.addr()), CmpOp::Eq));
                    e.extend(RuleExpr::addr(false, subnet, CmpOp::Neq));
                    e.push(RuleExpr::Masquerade);
                    NftOp::rule(FAM, &self.table, MASQ_CHAIN, e, Some(&comment))
                })
                .collect();
            must("masquerade rule", NfTables::new().and_then(|mut nf| nf.apply(&ops)));
        }
        must("oper up", host.wait_link_oper_up(hv.index, Duration::from_secs(3)));
        BridgeAttachment { host_veth: hv.name, ctr_index: ci, reservations, rules: Vec::new(), comment }
    }

    /// Untimed, between ADD and DEL: the handles of the attachment's rules (the plugin finds
    /// them with a dump; the floor only deletes).
    pub fn prepare_del(&self, a: &mut BridgeAttachment) {
        if self.plan.masq {
            let rules = must(
                "list rules",
                NfTables::new().and_then(|mut nf| nf.rules(FAM, &self.table, Some(MASQ_CHAIN))),
            );
            a.rules =
                rules.iter().filter(|r| r.comment.as_deref() == Some(&a.comment)).map(|r| r.handle).collect();
            assert!(!a.rules.is_empty(), "floor: masquerade rule not found");
        }
    }

    /// The DEL plan's kernel requests. Timed by the caller.
    pub fn del(&self, ctr: &Netns, a: BridgeAttachment) {
        let nf = if a.rules.is_empty() {
            None
        } else {
            let mut nf = must("nf_tables socket", NfTables::new());
            let ops: Vec<NftOp> = a
                .rules
                .iter()
                .map(|h| {
                    NftOp::Delete(NftDelete::Rule {
                        family: FAM,
                        table: self.table.clone(),
                        chain: MASQ_CHAIN.into(),
                        handle: *h,
                    })
                })
                .collect();
            must("delete rule", nf.apply(&ops));
            Some(nf)
        };
        let ns = must("open netns", NetNs::open(ctr.path()));
        let mut c = must("container socket", Netlink::new_in(&ns));
        must("delete veth", c.link_del(a.ctr_index));
        for p in &a.reservations {
            must("release", std::fs::remove_file(p));
        }
        drop(c);
        drop(nf); // closing the socket waits for the grace period of what it deleted
    }
}

impl Drop for BridgeFloor {
    fn drop(&mut self) {
        if self.plan.masq {
            let _ = NfTables::new().and_then(|mut nf| {
                nf.apply(&[NftOp::Delete(NftDelete::Table { family: FAM, table: self.table.clone() })])
            });
        }
    }
}

/// bandwidth's plan on the host veth `veth` (ifindex): ingress and egress token buckets.
pub struct BandwidthFloor {
    ingress: Tbf,
    egress: Tbf,
}

impl BandwidthFloor {
    /// Rates and bursts in bits, as in a bandwidth config.
    pub fn new(rate_bits: u64, burst_bits: u64) -> BandwidthFloor {
        let psched = must("psched", Psched::read());
        let t = Tbf::with_latency(rate_bits / 8, burst_bits / 8, Duration::from_millis(25), &psched);
        BandwidthFloor { ingress: t, egress: t }
    }

    /// ADD: returns the ifb's name. Timed by the caller.
    pub fn add(&self, veth: &str) -> String {
        let mut host = must("host socket", Netlink::new());
        // the plugin looks its veth up from the container side; the floor by name
        let v = must("veth", host.link_by_name(veth)).expect("floor veth exists");
        let handle = tc::handle(1, 0);
        must("veth tbf", host.qdisc_add_tbf(v.index, handle, TC_H_ROOT, &self.ingress));
        let name = unique("bwf");
        let spec = LinkSpec {
            mtu: Some(v.mtu),
            up: true,
            txqlen: Some(v.txqlen.max(1000)),
            alias: Some(format!("cni-bandwidth net=floor ctr={name} if=eth0")),
            ..LinkSpec::new(name.clone(), LinkKind::Ifb)
        };
        let ifb = must("ifb", host.link_add(&spec));
        must("ifb tbf", host.qdisc_add_tbf(ifb.index, handle, TC_H_ROOT, &self.egress));
        must("ingress qdisc", host.qdisc_add_ingress(v.index));
        must("redirect", host.filter_add_redirect(v.index, INGRESS_HANDLE, 1, ifb.index));
        name
    }

    /// CHECK's reads: the veth, its qdiscs (one dump covers the ifb's too) and its ingress
    /// filters. Timed by the caller.
    pub fn check(&self, veth: &str) {
        let mut host = must("host socket", Netlink::new());
        let v = must("veth", host.link_by_name(veth)).expect("floor veth exists");
        let q = must("qdiscs", host.qdiscs(None));
        assert!(q.len() >= 3, "floor: qdiscs missing");
        let f = must("filters", host.filters(v.index, INGRESS_HANDLE));
        assert!(!f.is_empty(), "floor: redirect filter missing");
    }

    /// DEL: the veth's qdiscs and the ifb. Timed by the caller.
    pub fn del(&self, veth: &str, ifb: &str) {
        let mut host = must("host socket", Netlink::new());
        if let Some(v) = must("veth", host.link_by_name(veth)) {
            must("del tbf", host.qdisc_del(v.index, TC_H_ROOT, tc::handle(1, 0)));
            must("del ingress", host.qdisc_del(v.index, TC_H_INGRESS, INGRESS_HANDLE));
        }
        must("del ifb", host.link_del_by_name(ifb));
    }
}

/// A table with portmap's set types, on which the floor adds and deletes one attachment's
/// elements the way portmap's fast paths do (one transaction each).
pub struct PortmapFloor {
    table: String,
    masq_hash: bool,
}

fn v6(a: Ipv6Addr) -> Vec<u8> {
    a.octets().to_vec()
}

impl PortmapFloor {
    /// `masq_hash`: the masquerade sets as plain hash sets instead of concatenated interval
    /// sets (the layout whose element removal does not scale with the set's size).
    pub fn new(masq_hash: bool) -> PortmapFloor {
        use NftType::*;
        let table = unique("cnibench_p");
        let map = |id, name: &str, key: Vec<NftType>, data: Vec<NftType>| NftSet {
            name: name.into(),
            key,
            data: Some(NftSetData::Values(data)),
            interval: false,
            id,
        };
        let sets = vec![
            map(1, "hp4", vec![InetProto, InetService], vec![Ipv4Addr, InetService]),
            map(5, "owner", vec![Ipv6Addr, InetProto, InetService], vec![Ipv6Addr]),
            map(6, "claims", vec![Ipv6Addr, InetProto, InetService, Ipv6Addr], vec![Ipv6Addr, InetService]),
            NftSet {
                name: "masq4".into(),
                key: vec![Ipv4Addr, Ipv4Addr, InetProto, InetService],
                data: None,
                interval: !masq_hash,
                id: 7,
            },
            NftSet {
                name: "gates".into(),
                key: vec![NfProto],
                data: Some(NftSetData::Verdict),
                interval: false,
                id: 9,
            },
        ];
        let mut ops = vec![NftOp::AddTable { family: FAM, table: table.clone(), comment: None }];
        for c in ["gate4", "gate6"] {
            ops.push(NftOp::AddChain {
                family: FAM,
                table: table.clone(),
                chain: c.into(),
                base: None,
                comment: None,
            });
        }
        for s in sets {
            ops.push(NftOp::AddSet { family: FAM, table: table.clone(), set: s });
        }
        must("portmap floor table", NfTables::new().and_then(|mut nf| nf.apply(&ops)));
        PortmapFloor { table, masq_hash }
    }

    /// The elements of attachment `n` (container 10.<hi>.<lo> in a /16, host port from `n`).
    fn elements(&self, n: u32) -> Vec<(&'static str, Vec<NftElem>)> {
        let port = (10_000 + n % 50_000) as u16;
        let ctr = Ipv4Addr::new(10, 99, (n >> 8) as u8, n as u8);
        let hash = Ipv6Addr::new(0xfeed, 0, 0, 0, 0, 0, (n >> 16) as u16, n as u16);
        let tcp = [6u8];
        let p = port.to_be_bytes();
        let any = Ipv4Addr::UNSPECIFIED.to_ipv6_mapped();
        let tag = format!("floor,bench-{n},eth0");
        let owner_key = concat(&[&v6(any), &tcp, &p]);
        let owner = NftElem::new(owner_key.clone()).data(NftData::Value(v6(hash))).comment(tag.clone());
        let claim = NftElem::new(concat(&[&v6(any), &tcp, &p, &v6(hash)]))
            .data(NftData::Value(concat(&[&v6(ctr.to_ipv6_mapped()), &80u16.to_be_bytes()])))
            .comment(tag.clone());
        let dnat = NftElem::new(concat(&[&tcp, &p]))
            .data(NftData::Value(concat(&[&ctr.octets(), &80u16.to_be_bytes()])))
            .comment(tag.clone());
        let tail = |start: Ipv4Addr| concat(&[&start.octets(), &ctr.octets(), &tcp, &80u16.to_be_bytes()]);
        let masq = if self.masq_hash {
            // exact-match sets: the source side is the container's subnet as one key
            vec![
                NftElem::new(tail(Ipv4Addr::new(10, 99, 0, 0))).comment(tag.clone()),
                NftElem::new(tail(Ipv4Addr::LOCALHOST)).comment(tag.clone()),
            ]
        } else {
            vec![
                NftElem::new(tail(Ipv4Addr::new(10, 99, 0, 0)))
                    .key_end(tail(Ipv4Addr::new(10, 99, 255, 255)))
                    .comment(tag.clone()),
                NftElem::new(tail(Ipv4Addr::LOCALHOST))
                    .key_end(tail(Ipv4Addr::LOCALHOST))
                    .comment(tag.clone()),
            ]
        };
        vec![("owner", vec![owner]), ("claims", vec![claim]), ("hp4", vec![dnat]), ("masq4", masq)]
    }

    /// ADD of attachment `n` (the gate element and the elements of `sets`, all of portmap's
    /// when empty): one transaction. Timed by the caller.
    pub fn add(&self, n: u32, sets: &[&str]) {
        let mut ops = Vec::new();
        if sets.is_empty() {
            let gates = vec![
                NftElem::new(vec![2]).data(NftData::Verdict(Verdict::Jump("gate4".into()))),
                NftElem::new(vec![10]).data(NftData::Verdict(Verdict::Jump("gate6".into()))),
            ];
            ops.push(NftOp::AddElements {
                family: FAM,
                table: self.table.clone(),
                set: "gates".into(),
                elems: gates,
            });
        }
        for (set, elems) in self.elements(n) {
            if sets.is_empty() || sets.contains(&set) {
                ops.push(NftOp::AddElements {
                    family: FAM,
                    table: self.table.clone(),
                    set: set.into(),
                    elems,
                });
            }
        }
        must("portmap floor ADD", NfTables::new().and_then(|mut nf| nf.apply(&ops)));
    }

    /// DEL of attachment `n` (the owner claim re-asserted, then the elements of `sets`
    /// deleted; all of portmap's when empty): one transaction, socket closed. Timed by the
    /// caller.
    pub fn del(&self, n: u32, sets: &[&str]) {
        let els = self.elements(n);
        let mut ops = Vec::new();
        if sets.is_empty() || sets.contains(&"owner") {
            let owner = els[0].1.clone();
            ops.push(NftOp::AddElements {
                family: FAM,
                table: self.table.clone(),
                set: "owner".into(),
                elems: owner,
            });
        }
        for (set, elems) in els {
            if sets.is_empty() || sets.contains(&set) {
                let elems = elems.iter().map(NftElem::key_only).collect();
                ops.push(NftOp::DeleteElements {
                    family: FAM,
                    table: self.table.clone(),
                    set: set.into(),
                    elems,
                });
            }
        }
        let mut nf = must("nf_tables socket", NfTables::new());
        must("portmap floor DEL", nf.apply(&ops));
        drop(nf);
    }
}

impl Drop for PortmapFloor {
    fn drop(&mut self) {
        let _ = NfTables::new().and_then(|mut nf| {
            nf.apply(&[NftOp::Delete(NftDelete::Table { family: FAM, table: self.table.clone() })])
        });
    }
}
