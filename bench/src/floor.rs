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
//! - portmap ADD: the one transaction portmap's ADD commits for a new attachment in an intact
//!   table (its owner, claim, DNAT and masquerade elements, its record and netns record), as
//!   portmap's library computes it, in a table built from portmap's layout declaration; DEL:
//!   the transaction deleting them, its socket closed. (The plugin also reads a few elements
//!   first to decide: that read is its own work, above the floor.)
//!
//! The floor tables are the driver's own (`inet cnibench_*`), never the plugins'.

use cni_common::net::Family;
use cni_common::netlink::nft::{
    BaseChain, CmpOp, NfTables, NftDelete, NftFamily, NftOp, RuleExpr, Verdict, HOOK_POSTROUTING,
};
use cni_common::netlink::tc::{self, Psched, Tbf, INGRESS_HANDLE, TC_H_INGRESS, TC_H_ROOT};
use cni_common::netlink::{
    LinkKind, LinkSpec, Netlink, PortFlag, PortFlags, RouteSpec, VethPeer, IPV4_DEVCONF_ARP_NOTIFY,
};
use cni_common::netns::NetNs;
use cni_common::spec::result::{CniResult, Interface, IpConfig};
use cni_common::sysctl;
use cni_tests::{unique, Netns, TempDir};
use ipnet::IpNet;
use portmap::config::PortMapConf;
use portmap::config::{Conditions, Conf, Intent, Lens};
use portmap::layout::{declaration, Found};
use portmap::model::{NsId, Owner};
use portmap::plan;
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
        let run = |args: &[&str]| cni_tests::sh("ip", args);
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
            let flags = PortFlags::from([(PortFlag::HAIRPIN, true), (PortFlag::ISOLATED, false)]);
            must("hairpin", host.bridge_port_set(hv.index, &flags, false));
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

/// A table of portmap's layout (its declaration, under another name so that it never meets the
/// plugin's own table), into which the floor sends the transactions portmap's ADD and DEL
/// commit in the common case (portmap's library computes them: `plan::add_ops`,
/// `plan::del_ops`), bare: no process, no read, the socket closed at the end of DEL as the
/// plugin's is.
pub struct PortmapFloor {
    table: String,
}

/// `ops` aimed at table `table` instead of portmap's.
fn retarget(mut ops: Vec<NftOp>, table: &str) -> Vec<NftOp> {
    for op in &mut ops {
        let t = match op {
            NftOp::AddTable { table, .. }
            | NftOp::AddChain { table, .. }
            | NftOp::AddRule { table, .. }
            | NftOp::AddElements { table, .. }
            | NftOp::CreateElements { table, .. }
            | NftOp::DeleteElements { table, .. }
            | NftOp::AddSet { table, .. }
            | NftOp::FlushSet { table, .. } => table,
            NftOp::Delete(
                NftDelete::Rule { table, .. }
                | NftDelete::Flush { table, .. }
                | NftDelete::Chain { table, .. }
                | NftDelete::Table { table, .. }
                | NftDelete::Set { table, .. },
            ) => table,
        };
        *t = table.to_string();
    }
    ops
}

impl Default for PortmapFloor {
    fn default() -> Self {
        Self::new()
    }
}

impl PortmapFloor {
    /// The table, as portmap builds it for containers in a /16 and a /64 (masquerade sets /16,
    /// /32 and /64).
    pub fn new() -> PortmapFloor {
        let table = unique("cnibench_p");
        let lens: Lens = [(Family::V4, 16), (Family::V4, 32), (Family::V6, 64)].into();
        let ops = declaration(&lens, &Conditions::default()).setup(&Found::default()).ops;
        must("portmap floor table", NfTables::new().and_then(|mut nf| nf.apply(&retarget(ops, &table))));
        PortmapFloor { table }
    }

    /// Attachment `n`: container 10.99.<hi>.<lo>/16 on eth0, host port from `n` to port 80,
    /// `snat` on, its namespace recorded.
    fn intent(n: u32) -> Intent {
        let port = 10_000 + n % 50_000;
        let raw: PortMapConf = serde_json::from_value(serde_json::json!({
            "runtimeConfig": {"portMappings": [{"hostPort": port, "containerPort": 80, "protocol": "tcp"}]}
        }))
        .expect("portmap config");
        let conf = Conf::from_raw(&raw).expect("portmap config");
        let ip = IpNet::new(IpAddr::V4(Ipv4Addr::new(10, 99, (n >> 8) as u8, n as u8)), 16).expect("prefix");
        let prev = CniResult {
            interfaces: vec![Interface {
                name: "eth0".into(),
                sandbox: format!("/run/netns/cni-bench-{n}"),
                ..Default::default()
            }],
            ips: vec![IpConfig { interface: Some(0), address: ip, gateway: None }],
            ..Default::default()
        };
        let ns =
            Some((NsId { ino: 0xf000_0000 + u64::from(n), cookie: 42 }, format!("/run/netns/cni-bench-{n}")));
        Intent::new(&conf, &prev, "eth0", Owner::new("floor", &format!("bench-{n}"), "eth0"), ns)
            .expect("intent")
            .0
    }

    /// The transactions of attachment `n`'s ADD and DEL (computed, not timed).
    pub fn ops(&self, n: u32) -> (Vec<NftOp>, Vec<NftOp>) {
        let i = Self::intent(n);
        (retarget(plan::add_ops(&i), &self.table), retarget(plan::del_ops(&i), &self.table))
    }

    /// The ADD and DEL transactions of the attachment portmap's configuration `conf` (a JSON
    /// request with runtimeConfig and prevResult) describes, for container `bench-mappings`.
    pub fn ops_of(&self, conf: &str) -> (Vec<NftOp>, Vec<NftOp>) {
        let v: serde_json::Value = serde_json::from_str(conf).expect("json");
        let raw: PortMapConf = serde_json::from_value(v.clone()).expect("portmap config");
        let c = Conf::from_raw(&raw).expect("portmap config");
        let prev: CniResult =
            CniResult::decode(&v["prevResult"], cni_common::Version::V1_0_0).expect("prevResult");
        let ns = Some((NsId { ino: 0xf100_0000, cookie: 43 }, "/run/netns/bench-mappings".to_string()));
        let i = Intent::new(&c, &prev, "eth0", Owner::new("benchmaps", "bench-mappings", "eth0"), ns)
            .expect("intent")
            .0;
        (retarget(plan::add_ops(&i), &self.table), retarget(plan::del_ops(&i), &self.table))
    }

    /// Send one transaction and close the socket. Timed by the caller.
    pub fn send(ops: &[NftOp]) {
        let mut nf = must("nf_tables socket", NfTables::new());
        must("portmap floor transaction", nf.apply(ops));
        drop(nf);
    }

    /// ADD of attachment `n` (computes the transaction, then sends it: for set-up only).
    pub fn add(&self, n: u32) {
        Self::send(&self.ops(n).0);
    }
}

impl Drop for PortmapFloor {
    fn drop(&mut self) {
        let _ = NfTables::new().and_then(|mut nf| {
            nf.apply(&[NftOp::Delete(NftDelete::Table { family: FAM, table: self.table.clone() })])
        });
    }
}
