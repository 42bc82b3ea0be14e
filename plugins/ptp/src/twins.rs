//! Second variants of the verb tests in tests.rs (issue 28): an IPv6-only attachment, dual
//! stack listed IPv6 first, a host-length IPv6 address, and CHECK finding one family's part
//! taken away while the other family's is whole.

use crate::add::{self, Input};
use crate::config::Conf;
use crate::ipam::fake::FakeIpam;
use crate::kernel::fake::Fake;
use crate::kernel::{Kernel, Side};
use crate::{check, del};
use cni_common::attachment::AttachmentId;
use cni_common::spec::result::{CniResult, IpConfig, Route};

const NETNS: &str = "/run/netns/pod";

fn ip(a: &str, gw: &str) -> IpConfig {
    IpConfig { interface: None, address: a.parse().unwrap(), gateway: gw.parse().ok() }
}

fn result(ips: Vec<IpConfig>, routes: &[&str]) -> CniResult {
    CniResult {
        ips,
        routes: routes.iter().map(|r| Route::new(r.parse().unwrap(), None)).collect(),
        ..Default::default()
    }
}

fn att() -> AttachmentId {
    AttachmentId::new("kindnet", "c0ffee", "eth0")
}

fn conf(masq: bool) -> Conf {
    Conf { ip_masq: masq, mtu: None, dns: None }
}

fn run_add(k: &mut Fake, r: CniResult, masq: bool) -> CniResult {
    let mut ipam = FakeIpam { result: r, ..Default::default() };
    let mut n = 0;
    let mut names = move || {
        n += 1;
        format!("veth{n:08x}")
    };
    add::run(k, &mut ipam, &Input { attachment: att(), netns: NETNS, conf: &conf(masq) }, &mut names).unwrap()
}

fn routes(k: &Fake, side: Side) -> Vec<String> {
    let mut v: Vec<String> = k
        .routes
        .iter()
        .filter(|(s, _, _)| *s == side)
        .map(|(_, _, r)| format!("{} {:?}", r.dst, r.gw.map(|g| g.to_string())))
        .collect();
    v.sort();
    v
}

#[test]
fn ipv6_only_add_routes_through_its_gateway_and_turns_on_ipv6_forwarding_only() {
    let mut k = Fake::new();
    let r = run_add(&mut k, result(vec![ip("fd00:10::5/64", "fd00:10::1")], &["::/0"]), true);
    assert_eq!(k.forwarding(), (false, true));
    assert_eq!(k.sysctl_get(Side::Container, "net/ipv6/conf/eth0/keep_addr_on_down").unwrap(), "1");
    assert_eq!(
        routes(&k, Side::Container),
        ["::/0 Some(\"fd00:10::1\")", "fd00:10::/64 Some(\"fd00:10::1\")", "fd00:10::1/128 None"]
    );
    assert_eq!(routes(&k, Side::Host), ["fd00:10::5/128 None"]);
    let host = k.link(Side::Host, "veth00000001").unwrap().unwrap();
    assert_eq!(k.addrs(Side::Host, host.index).unwrap(), vec!["fd00:10::1/128".parse().unwrap()]);
    assert_eq!(k.masq.len(), 1);
    check::run(&mut k, &conf(true), &r, &att(), NETNS, &mut || Ok(false)).unwrap();
    del::run(&mut k, None, &att(), true, true).unwrap();
    assert!(k.links.is_empty() && k.routes.is_empty() && k.masq.is_empty());
}

#[test]
fn dual_stack_listed_ipv6_first_makes_the_same_kernel_state() {
    let v4 = ip("10.244.1.5/24", "10.244.1.1");
    let v6 = ip("fd00:10::5/64", "fd00:10::1");
    let mut a = Fake::new();
    run_add(&mut a, result(vec![v4.clone(), v6.clone()], &["0.0.0.0/0", "::/0"]), false);
    let mut b = Fake::new();
    let r = run_add(&mut b, result(vec![v6, v4], &["::/0", "0.0.0.0/0"]), false);
    for side in [Side::Container, Side::Host] {
        assert_eq!(routes(&a, side), routes(&b, side), "{side:?}");
    }
    assert_eq!(routes(&b, Side::Container).len(), 6);
    assert_eq!((a.forwarding(), a.ctr_sysctls()), (b.forwarding(), b.ctr_sysctls()));
    check::run(&mut b, &conf(false), &r, &att(), NETNS, &mut || Ok(false)).unwrap();
}

#[test]
fn a_host_length_ipv6_address_has_no_subnet_route_like_a_32() {
    for (addr, gw, link_route) in
        [("10.1.0.5/32", "10.1.0.1", "10.1.0.1/32 None"), ("fd00::5/128", "fd00::1", "fd00::1/128 None")]
    {
        let mut k = Fake::new();
        run_add(&mut k, result(vec![ip(addr, gw)], &[]), false);
        assert_eq!(routes(&k, Side::Container), [link_route], "{addr}");
    }
}

/// CHECK of a dual-stack attachment with only one family's part taken away, each family in
/// turn: the other family's being whole does not hide it.
#[test]
fn check_finds_one_familys_part_taken_away_in_either_family() {
    type Tamper = fn(&mut Fake, bool);
    let cases: [(&str, Tamper); 4] = [
        ("address", |k, v4| {
            let c = k.link(Side::Container, "eth0").unwrap().unwrap();
            k.links
                .get_mut(&(Side::Container, c.index))
                .unwrap()
                .addrs
                .retain(|(a, _)| a.addr().is_ipv4() != v4);
        }),
        ("route", |k, v4| {
            k.routes.retain(|(s, _, r)| {
                !(*s == Side::Container && r.dst.prefix_len() == 0 && r.dst.addr().is_ipv4() == v4)
            })
        }),
        ("host route", |k, v4| {
            k.routes.retain(|(s, _, r)| !(*s == Side::Host && r.dst.addr().is_ipv4() == v4))
        }),
        ("gateway address", |k, v4| {
            let h = k.link(Side::Host, "veth00000001").unwrap().unwrap();
            k.links.get_mut(&(Side::Host, h.index)).unwrap().addrs.retain(|(a, _)| a.addr().is_ipv4() != v4);
        }),
    ];
    for v4 in [true, false] {
        for (part, tamper) in cases {
            let mut k = Fake::new();
            let r = run_add(
                &mut k,
                result(
                    vec![ip("10.244.1.5/24", "10.244.1.1"), ip("fd00:10::5/64", "fd00:10::1")],
                    &["0.0.0.0/0", "::/0"],
                ),
                false,
            );
            tamper(&mut k, v4);
            let e = check::run(&mut k, &conf(false), &r, &att(), NETNS, &mut || Ok(false)).unwrap_err();
            assert!(e.msg.contains(part), "{part} (IPv4: {v4}): {}", e.msg);
        }
    }
}

/// Upstream's rule (mutation triage, issue 28): a host route to the container's address that
/// is there already (a stale one of an earlier pod) does not fail ADD, in either family.
#[test]
fn a_host_route_that_is_there_already_does_not_fail_add() {
    for (addr, gw, host) in
        [("10.244.1.5/24", "10.244.1.1", "10.244.1.5/32"), ("fd00:10::5/64", "fd00:10::1", "fd00:10::5/128")]
    {
        let mut k = Fake::new();
        let stale = k.plant(Side::Host, "vethstale", "veth");
        k.routes.push((Side::Host, stale, crate::desired::RouteWant::new(host.parse().unwrap())));
        run_add(&mut k, result(vec![ip(addr, gw)], &[]), false);
        assert!(k.link(Side::Container, "eth0").unwrap().is_some(), "{addr}");
    }
}

/// CHECK's other identity tests (mutation triage, issue 28): a container MAC in prevResult that
/// is not the interface's, and a host interface in prevResult that is a veth but not the peer
/// of the container's.
#[test]
fn check_finds_a_wrong_mac_and_a_host_veth_that_is_not_the_peer() {
    let r0 = result(vec![ip("10.244.1.5/24", "10.244.1.1"), ip("fd00:10::5/64", "fd00:10::1")], &[]);
    let mut k = Fake::new();
    let r = run_add(&mut k, r0.clone(), false);
    let mut wrong_mac = r.clone();
    wrong_mac.interfaces[1].mac = "02:00:00:00:00:ff".into();
    let e = check::run(&mut k, &conf(false), &wrong_mac, &att(), NETNS, &mut || Ok(false)).unwrap_err();
    assert!(e.msg.contains("Mac"), "{}", e.msg);
    // No MAC in prevResult: nothing to compare.
    let mut no_mac = r.clone();
    no_mac.interfaces[1].mac.clear();
    check::run(&mut k, &conf(false), &no_mac, &att(), NETNS, &mut || Ok(false)).unwrap();
    // Another pod's host veth named in prevResult.
    k.plant(Side::Host, "vethother", "veth");
    let mut other = r;
    other.interfaces[0].name = "vethother".into();
    let e = check::run(&mut k, &conf(false), &other, &att(), NETNS, &mut || Ok(false)).unwrap_err();
    assert!(e.msg.contains("not the peer"), "{}", e.msg);
}

/// The DNS of the configuration replaces IPAM's when any one of its fields is set (mutation
/// triage, issue 28: config.rs tests the nameservers alone).
#[test]
fn each_dns_field_alone_is_something_set() {
    use cni_common::spec::result::Dns;
    let raw: crate::config::RawConf = cni_common::spec::json::from_value(serde_json::json!({})).unwrap();
    for one in [
        Dns { domain: "cluster.local".into(), ..Default::default() },
        Dns { search: vec!["svc.cluster.local".into()], ..Default::default() },
        Dns { options: vec!["ndots:5".into()], ..Default::default() },
    ] {
        assert_eq!(Conf::from_raw(&raw, Some("host-local"), Some(one.clone())).unwrap().dns, Some(one));
    }
}

/// DEL when the container's veth is gone between the read and the delete (its namespace went):
/// done; when deleting it fails otherwise: DEL fails (mutation triage, issue 28).
#[test]
fn del_tells_a_veth_gone_meanwhile_from_one_that_cannot_be_deleted() {
    let dual = || result(vec![ip("10.244.1.5/24", "10.244.1.1"), ip("fd00:10::5/64", "fd00:10::1")], &[]);
    let mut k = Fake::new();
    run_add(&mut k, dual(), false);
    k.vanish_next = true;
    del::run(&mut k, None, &att(), true, false).unwrap();
    assert!(k.links.is_empty());
    let mut k = Fake::new();
    run_add(&mut k, dual(), false);
    k.fail_at = Some(k.changes + 1);
    let e = del::run(&mut k, None, &att(), true, false).unwrap_err();
    assert!(e.msg.contains("failed to delete eth0"), "{}", e.msg);
}

/// Masquerade rules that cannot be looked for fail DEL only when `ipMasq` is set now.
#[test]
fn del_without_nf_tables_fails_only_with_ipmasq() {
    let mut k = Fake { nft_missing: true, ..Fake::new() };
    del::run(&mut k, None, &att(), false, false).unwrap();
    assert!(del::run(&mut k, None, &att(), false, true).is_err());
}

/// A 1.1.0 IPAM route keeps its scope, table, priority, MTU and advmss, in either family
/// (mutation triage, issue 28).
#[test]
fn an_ipam_routes_attributes_are_kept_in_either_family() {
    for (addr, gw, dst) in
        [("10.244.1.5/24", "10.244.1.1", "192.0.2.0/24"), ("fd00:10::5/64", "fd00:10::1", "2001:db8::/64")]
    {
        let mut route = Route::new(dst.parse().unwrap(), None);
        route.scope = Some(0);
        route.table = Some(100);
        route.priority = Some(7);
        route.mtu = Some(1300);
        route.advmss = Some(1260);
        let r = CniResult { ips: vec![ip(addr, gw)], routes: vec![route], ..Default::default() };
        let d = crate::desired::desired(&conf(false), &r).unwrap();
        let w = d.ctr_routes.last().unwrap();
        assert_eq!(w.dst, dst.parse().unwrap());
        assert_eq!(w.gw, gw.parse().ok(), "{dst}: through its family's gateway");
        assert_eq!(
            (w.scope, w.table, w.priority, w.mtu, w.advmss, w.append),
            (Some(0), Some(100), Some(7), Some(1300), Some(1260), true),
            "{dst}"
        );
    }
}
