//! Kernel tests (root). Each test first moves its own thread into a fresh network namespace
//! (`private_netns`, which panics when it cannot), so nothing here sees or touches the
//! machine's real interfaces.

use std::net::IpAddr;
use std::os::fd::AsFd;

use ipnet::IpNet;

use super::*;
use crate::netns::test_support::{private_netns, spare_netns};
use crate::sysctl;

/// A netlink message's wire bytes, for the message-level tests of the sibling modules.
pub(super) fn emit<T: netlink_packet_core::Emitable>(msg: &T) -> Vec<u8> {
    let mut buf = vec![0; msg.buffer_len()];
    msg.emit(&mut buf);
    buf
}

fn fresh() -> Netlink {
    private_netns();
    Netlink::new().expect("open netlink socket")
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A link for address and route tests. The test kernel has no `dummy` driver, so this is an
/// ifb device: Ethernet-like, IFF_NOARP (no IPv6 DAD), carrier on once up.
fn test_link(nl: &mut Netlink, name: &str) -> Link {
    let spec = LinkSpec { up: true, ..LinkSpec::new(name, LinkKind::Ifb) };
    let l = nl.link_add(&spec).expect("create ifb test link");
    assert!(l.up());
    l
}

#[test]
fn loopback_up_and_down() {
    let mut nl = fresh();
    let lo = nl.link_by_name("lo").unwrap().expect("lo exists");
    assert_eq!(lo.index, 1);
    assert!(!lo.up(), "lo starts down in a new netns");
    nl.link_set_up(lo.index).unwrap();
    let lo = nl.link_by_index(1).unwrap().unwrap();
    assert!(lo.up());
    assert_eq!(lo.name, "lo");
    assert_eq!(lo.kind, None);
    nl.link_set_down(lo.index).unwrap();
    assert!(!nl.link_by_name("lo").unwrap().unwrap().up());
}

#[test]
fn missing_links() {
    let mut nl = fresh();
    assert_eq!(nl.link_by_name("nope0").unwrap(), None);
    assert_eq!(nl.link_by_index(4242).unwrap(), None);
    assert!(!nl.link_del_by_name("nope0").unwrap());
    let e = nl.link_del(4242).unwrap_err();
    assert!(e.is_not_found(), "{e}");
    assert!(e.to_string().starts_with("delete link 4242: "), "{e}");
    let e = nl.link_set_up(4242).unwrap_err();
    assert!(e.is_not_found(), "{e}");
}

#[test]
fn bridge_create_and_list() {
    let mut nl = fresh();
    let mac = [0x02, 0x42, 0xac, 0x11, 0x00, 0x01];
    let spec = LinkSpec {
        mtu: Some(1450),
        mac: Some(mac),
        up: true,
        ..LinkSpec::new("cni0", LinkKind::Bridge { opts: Default::default() })
    };
    let br = nl.link_add(&spec).unwrap();
    assert_eq!(br.name, "cni0");
    assert_eq!(br.kind.as_deref(), Some("bridge"));
    assert_eq!(br.mtu, 1450);
    assert_eq!(br.mac, Some(mac));
    assert!(br.up());
    assert_eq!(br.master, None);

    let e = nl.link_add(&spec).unwrap_err();
    assert!(e.is_exists(), "{e}");
    assert!(e.to_string().starts_with("create bridge cni0: "), "{e}");

    let names: Vec<String> = nl.links().unwrap().into_iter().map(|l| l.name).collect();
    assert_eq!(names, vec!["lo".to_string(), "cni0".to_string()]);

    assert!(nl.link_del_by_name("cni0").unwrap());
    assert!(nl.link_by_name("cni0").unwrap().is_none());
}

#[test]
fn veth_with_peer_in_other_netns() {
    let mut nl = fresh();
    let container = spare_netns();
    let br = nl.link_add(&LinkSpec::new("br0", LinkKind::Bridge { opts: Default::default() })).unwrap();
    let host_mac = [0x02, 0, 0, 0, 0, 0x01];
    let peer_mac = [0x02, 0, 0, 0, 0, 0x02];
    let spec = LinkSpec {
        mtu: Some(1400),
        mac: Some(host_mac),
        up: true,
        master: Some(br.index),
        txqlen: Some(500),
        alias: Some("ctr-1/eth0".into()),
        ..LinkSpec::new(
            "veth1a2b3c",
            LinkKind::Veth {
                peer: VethPeer {
                    mac: Some(peer_mac),
                    up: true,
                    ..VethPeer::new("eth0", Some(container.as_fd()))
                },
            },
        )
    };
    let host = nl.link_add(&spec).unwrap();
    assert_eq!(host.name, "veth1a2b3c");
    assert_eq!(host.kind.as_deref(), Some("veth"));
    assert_eq!(host.mtu, 1400);
    assert_eq!(host.mac, Some(host_mac));
    assert!(host.up());
    assert_eq!(host.master, Some(br.index));
    assert_eq!(host.txqlen, 500);
    assert_eq!(host.alias.as_deref(), Some("ctr-1/eth0"));
    assert!(host.link_netnsid.is_some(), "peer is in another netns: {host:?}");
    assert_eq!(nl.nsid_of(&container).unwrap(), host.link_netnsid, "the peer's namespace by its id");
    let unrelated = spare_netns();
    assert_eq!(nl.nsid_of(&unrelated).unwrap(), None, "a namespace nothing here points at has no id");
    let peer_index = host.link.expect("veth has IFLA_LINK");

    // The peer is not here...
    assert_eq!(nl.link_by_name("eth0").unwrap(), None);
    // ...but in the container namespace, with its own settings.
    let mut cnl = Netlink::new_in(&container).unwrap();
    let peer = cnl.link_by_name("eth0").unwrap().expect("peer in container");
    assert_eq!(peer.index, peer_index);
    assert_eq!(peer.kind.as_deref(), Some("veth"));
    assert_eq!(peer.mtu, 1400, "peer inherits the MTU");
    assert_eq!(peer.mac, Some(peer_mac));
    assert_eq!(peer.txqlen, 500);
    assert!(peer.up(), "peer up flag honoured: {peer:?}");
    assert_eq!(peer.link, Some(host.index));
    assert_eq!(peer.master, None);
    let names: Vec<String> = cnl.links().unwrap().into_iter().map(|l| l.name).collect();
    assert_eq!(names, vec!["lo".to_string(), "eth0".to_string()]);

    // The peer name is taken in the container netns: EEXIST, and nothing left behind here.
    let again = LinkSpec {
        mtu: None,
        mac: None,
        alias: None,
        master: None,
        ..LinkSpec::new("veth9z", LinkKind::Veth { peer: VethPeer::new("eth0", Some(container.as_fd())) })
    };
    assert!(nl.link_add(&again).unwrap_err().is_exists());
    assert_eq!(nl.link_by_name("veth9z").unwrap(), None);

    // Deleting one end deletes both.
    nl.link_del(host.index).unwrap();
    assert_eq!(cnl.link_by_name("eth0").unwrap(), None);
}

#[test]
fn veth_pair_in_one_netns() {
    let mut nl = fresh();
    let a = nl.link_add(&LinkSpec::new("va", LinkKind::Veth { peer: VethPeer::new("vb", None) })).unwrap();
    let b = nl.link_by_name("vb").unwrap().unwrap();
    assert_eq!(a.link, Some(b.index));
    assert_eq!(b.link, Some(a.index));
    assert_eq!(a.link_netnsid, None);
    assert!(!a.up() && !b.up());
}

#[test]
fn link_setters() {
    let mut nl = fresh();
    let spec =
        LinkSpec { up: true, ..LinkSpec::new("va", LinkKind::Veth { peer: VethPeer::new("vb", None) }) };
    let d = nl.link_add(&spec).unwrap();
    assert!(d.up());
    nl.link_set_mac(d.index, [0x02, 1, 2, 3, 4, 5]).unwrap();
    nl.link_set_promisc(d.index, true).unwrap();
    nl.link_set_alias(d.index, "hello").unwrap();
    let l = nl.link_by_index(d.index).unwrap().unwrap();
    assert_eq!(l.mac, Some([0x02, 1, 2, 3, 4, 5]));
    assert!(l.promisc());
    assert_eq!(l.alias.as_deref(), Some("hello"));
    assert!(l.up(), "setting other things keeps the link up");

    nl.link_set_promisc(d.index, false).unwrap();
    nl.link_set_alias(d.index, "").unwrap();
    nl.link_set_down(d.index).unwrap();
    let l = nl.link_by_index(d.index).unwrap().unwrap();
    assert!(!l.promisc());
    assert_eq!(l.alias, None);
    assert!(!l.up());
    assert!(!l.oper_state_up());

    let e = nl.link_set_mac(d.index, [0x01, 0, 0, 0, 0, 1]).unwrap_err();
    assert_eq!(e.errno(), libc::EADDRNOTAVAIL, "a multicast MAC is refused: {e}");
    assert!(e.to_string().starts_with("set mac 01:00:00:00:00:01 on link "), "{e}");
}

#[test]
fn mtu_queue_length_and_allmulti_setters() {
    let mut nl = fresh();
    let spec =
        LinkSpec { up: true, ..LinkSpec::new("ta", LinkKind::Veth { peer: VethPeer::new("tb", None) }) };
    let d = nl.link_add(&spec).unwrap();
    nl.link_set_mtu(d.index, 1280).unwrap();
    nl.link_set_txqlen(d.index, 77).unwrap();
    nl.link_set_allmulti(d.index, true).unwrap();
    let l = nl.link_by_index(d.index).unwrap().unwrap();
    assert_eq!((l.mtu, l.txqlen, l.allmulti(), l.up()), (1280, 77, true, true));
    nl.link_set_allmulti(d.index, false).unwrap();
    assert!(!nl.link_by_index(d.index).unwrap().unwrap().allmulti());
    let e = nl.link_set_mtu(d.index, 20).unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL, "below the minimum MTU: {e}");
}

#[test]
fn an_address_without_its_prefix_route_and_a_route_with_a_source() {
    let mut nl = fresh();
    let l = test_link(&mut nl, "np0");
    nl.addr_add_noprefixroute(l.index, net("10.61.0.5/24")).unwrap();
    assert!(nl.addrs(Some(l.index), None).unwrap().iter().any(|a| a.addr == net("10.61.0.5/24")));
    let routes = nl.routes(Some(Family::V4)).unwrap();
    assert!(!routes.iter().any(|r| r.dst == net("10.61.0.0/24")), "no subnet route: {routes:?}");
    let gw = RouteSpec { oif: Some(l.index), scope: Some(SCOPE_LINK), ..RouteSpec::new(net("10.61.0.1/32")) };
    nl.route_add_src(&gw, ip("10.61.0.5")).unwrap();
    let via =
        RouteSpec { oif: Some(l.index), gw: Some(ip("10.61.0.1")), ..RouteSpec::new(net("10.61.0.0/24")) };
    nl.route_add_src(&via, ip("10.61.0.5")).unwrap();
    let routes = nl.routes(Some(Family::V4)).unwrap();
    let subnet = routes.iter().find(|r| r.dst == net("10.61.0.0/24")).expect("the subnet via the gateway");
    assert_eq!((subnet.gw, subnet.prefsrc), (Some(ip("10.61.0.1")), Some(ip("10.61.0.5"))));
    let e = nl.route_add_src(&via, ip("10.61.0.5")).unwrap_err();
    assert!(e.is_exists(), "{e}");
    assert!(e.to_string().contains("src 10.61.0.5"), "{e}");
}

#[test]
fn ifb_and_dummy_kinds() {
    let mut nl = fresh();
    let ifb = nl.link_add(&LinkSpec::new("bwp1234", LinkKind::Ifb)).unwrap();
    assert_eq!(ifb.kind.as_deref(), Some("ifb"));
    assert!(nl.link_del_by_name("bwp1234").unwrap());
    assert!(!nl.link_del_by_name("bwp1234").unwrap());

    // Kernels without the dummy driver (like the one these tests were written on) answer
    // EOPNOTSUPP with an extended-ack message; both outcomes are checked.
    match nl.link_add(&LinkSpec::new("d0", LinkKind::Dummy)) {
        Ok(d) => assert_eq!(d.kind.as_deref(), Some("dummy")),
        Err(e) => {
            assert_eq!(e.errno(), libc::EOPNOTSUPP, "{e}");
            assert_eq!(e.detail.as_deref(), Some("Unknown device type"), "{e}");
            assert_eq!(e.to_string(), "create dummy d0: Operation not supported (Unknown device type)");
            eprintln!("note: no dummy driver in this kernel; checked the error instead");
        }
    }
}

#[test]
fn large_dumps_span_several_datagrams() {
    let mut nl = fresh();
    for i in 0..80 {
        nl.link_add(&LinkSpec::new(format!("d{i}"), LinkKind::Ifb)).unwrap();
        nl.addr_add(i + 2, net(&format!("10.9.{i}.1/24"))).unwrap();
    }
    let links = nl.links().unwrap();
    assert_eq!(links.len(), 81);
    assert!(links.iter().any(|l| l.name == "d79"));
    let addrs = nl.addrs(None, Some(Family::V4)).unwrap();
    assert_eq!(addrs.len(), 80);
    // The socket stays usable and in sequence afterwards.
    assert!(nl.link_by_name("d42").unwrap().is_some());
}

#[test]
fn addresses_v4_and_v6() {
    let mut nl = fresh();
    let d = test_link(&mut nl, "dum0");
    let other = test_link(&mut nl, "dum1");
    sysctl::set(&sysctl::iface_key("ipv6", "dum0", "disable_ipv6"), "0").unwrap();

    let v4 = net("10.1.2.3/24");
    let v6 = net("2001:db8::5/64");
    nl.addr_add(d.index, v4).unwrap();
    nl.addr_add(d.index, v6).unwrap();
    nl.addr_add(other.index, net("10.7.0.1/16")).unwrap();

    let mine4 = nl.addrs(Some(d.index), Some(Family::V4)).unwrap();
    assert_eq!(mine4.len(), 1, "{mine4:?}");
    assert_eq!(mine4[0].addr, v4);
    assert_eq!(mine4[0].index, d.index);
    assert_eq!(mine4[0].broadcast, Some("10.1.2.255".parse().unwrap()));
    assert_eq!(mine4[0].scope, 0);

    // NOARP links skip DAD, but the kernel finishes it from a work queue, so the address can
    // be tentative for a moment.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mine6 = loop {
        let mine6 = nl.addrs(Some(d.index), Some(Family::V6)).unwrap();
        let global: Vec<_> = mine6.iter().filter(|a| a.addr == v6).collect();
        assert_eq!(global.len(), 1, "{mine6:?}");
        assert!(!global[0].dadfailed());
        if !global[0].tentative() {
            break mine6;
        }
        assert!(std::time::Instant::now() < deadline, "still tentative: {mine6:?}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    assert!(mine6.iter().all(|a| a.index == d.index));

    let all = nl.addrs(None, None).unwrap();
    assert!(all.iter().any(|a| a.addr == net("10.7.0.1/16")));
    assert!(all.iter().any(|a| a.addr == v6));

    let e = nl.addr_add(d.index, v4).unwrap_err();
    assert!(e.is_exists(), "{e}");

    nl.addr_del(d.index, v4).unwrap();
    nl.addr_del(d.index, v6).unwrap();
    let left = nl.addrs(Some(d.index), None).unwrap();
    assert!(!left.iter().any(|a| a.addr == v4 || a.addr == v6), "{left:?}");
    let e = nl.addr_del(d.index, v4).unwrap_err();
    assert!(e.is_not_found(), "{e}");
    let e = nl.addr_del(d.index, v6).unwrap_err();
    assert!(e.is_not_found(), "{e}");
}

#[test]
fn routes_add_and_list() {
    let mut nl = fresh();
    let d = test_link(&mut nl, "dum0");
    sysctl::set(&sysctl::iface_key("ipv6", "dum0", "disable_ipv6"), "0").unwrap();
    nl.addr_add(d.index, net("192.168.50.2/24")).unwrap();
    nl.addr_add(d.index, net("2001:db8:1::2/64")).unwrap();

    // Connected routes show up with protocol kernel and link scope; local ones in table 255.
    let v4 = nl.routes(Some(Family::V4)).unwrap();
    let connected = v4
        .iter()
        .find(|r| r.dst == net("192.168.50.0/24") && r.table == TABLE_MAIN)
        .expect("connected route");
    assert_eq!((connected.protocol, connected.scope), (2, SCOPE_LINK));
    assert_eq!(connected.oif, Some(d.index));
    assert!(v4.iter().any(|r| r.kind == RouteKind::Local && r.table == 255));

    let spec = RouteSpec {
        gw: Some(ip("192.168.50.1")),
        oif: Some(d.index),
        priority: Some(100),
        mtu: Some(1300),
        advmss: Some(1200),
        ..RouteSpec::new(net("10.10.0.0/16"))
    };
    nl.route_add(&spec).unwrap();
    let found: Vec<Route> =
        nl.routes(Some(Family::V4)).unwrap().into_iter().filter(|r| r.dst == net("10.10.0.0/16")).collect();
    assert_eq!(found.len(), 1, "{found:?}");
    let r = &found[0];
    assert_eq!(r.gw, Some(ip("192.168.50.1")));
    assert_eq!(r.oif, Some(d.index));
    assert_eq!(r.priority, Some(100));
    assert_eq!((r.mtu, r.advmss), (Some(1300), Some(1200)));
    assert_eq!(r.table, TABLE_MAIN);
    assert_eq!(r.kind, RouteKind::Unicast);
    assert_eq!((r.scope, r.protocol), (SCOPE_UNIVERSE, 3));

    let e = nl.route_add(&spec).unwrap_err();
    assert!(e.is_exists(), "{e}");
    assert!(e.to_string().contains("add route 10.10.0.0/16 via 192.168.50.1"), "{e}");

    // Default route and a route in another table.
    nl.route_add(&RouteSpec { gw: Some(ip("192.168.50.1")), ..RouteSpec::new(net("0.0.0.0/0")) }).unwrap();
    nl.route_add(&RouteSpec {
        oif: Some(d.index),
        table: Some(1000),
        scope: Some(SCOPE_LINK),
        ..RouteSpec::new(net("172.16.0.0/12"))
    })
    .unwrap();
    let v4 = nl.routes(Some(Family::V4)).unwrap();
    assert!(v4.iter().any(|r| r.dst == net("0.0.0.0/0") && r.gw == Some(ip("192.168.50.1"))));
    let t = v4.iter().find(|r| r.dst == net("172.16.0.0/12")).expect("table 1000 route");
    assert_eq!((t.table, t.scope, t.gw), (1000, SCOPE_LINK, None));

    // Append: two IPv4 routes to the same destination with different gateways.
    for gw in ["192.168.50.1", "192.168.50.254"] {
        nl.route_add(&RouteSpec {
            gw: Some(ip(gw)),
            oif: Some(d.index),
            append: true,
            ..RouteSpec::new(net("10.20.0.0/16"))
        })
        .unwrap();
    }
    let gws: Vec<_> = nl
        .routes(Some(Family::V4))
        .unwrap()
        .iter()
        .filter(|r| r.dst == net("10.20.0.0/16"))
        .flat_map(Route::paths)
        .map(|(gw, _)| gw)
        .collect();
    assert_eq!(gws.len(), 2, "{gws:?}");
    assert!(gws.contains(&Some(ip("192.168.50.254"))));

    // Append with IPv6: the kernel merges them into one multipath route.
    for gw in ["2001:db8:1::1", "2001:db8:1::fe"] {
        nl.route_add(&RouteSpec {
            gw: Some(ip(gw)),
            oif: Some(d.index),
            append: true,
            ..RouteSpec::new(net("2001:db8:99::/48"))
        })
        .unwrap();
    }
    let v6: Vec<Route> = nl
        .routes(Some(Family::V6))
        .unwrap()
        .into_iter()
        .filter(|r| r.dst == net("2001:db8:99::/48"))
        .collect();
    let paths: Vec<_> = v6.iter().flat_map(Route::paths).collect();
    assert_eq!(paths.len(), 2, "{v6:?}");
    assert!(paths.contains(&(Some(ip("2001:db8:1::fe")), Some(d.index))));
    assert!(v6.iter().all(|r| r.priority == Some(1024)));

    // A gateway that is not on any connected network.
    let e = nl
        .route_add(&RouteSpec { gw: Some(ip("10.99.99.1")), ..RouteSpec::new(net("10.30.0.0/16")) })
        .unwrap_err();
    assert_eq!(e.errno(), libc::ENETUNREACH, "{e}");

    // One lookup, as `ip route get`: the connected network, a route via the gateway (the
    // default route above), nothing (IPv6 has no default route here).
    let got = nl.route_get(ip("192.168.50.9")).unwrap().expect("connected");
    assert_eq!((got.oif, got.gw), (Some(d.index), None), "{got:?}");
    let got = nl.route_get(ip("10.10.3.4")).unwrap().expect("via the gateway");
    assert_eq!((got.oif, got.gw), (Some(d.index), Some(ip("192.168.50.1"))), "{got:?}");
    assert_eq!(nl.route_get(ip("2001:db8:77::1")).unwrap(), None, "no IPv6 default route here: unreachable");
}

#[test]
fn sockets_stay_in_their_netns_and_sysctls_follow_the_thread() {
    let mut nl = fresh();
    let other = spare_netns();
    let mut onl = Netlink::new_in(&other).unwrap();
    test_link(&mut nl, "here0");
    test_link(&mut onl, "there0");
    assert!(nl.link_by_name("there0").unwrap().is_none());
    assert!(onl.link_by_name("here0").unwrap().is_none());

    // Interface names with dots need slash-form keys.
    test_link(&mut nl, "dum0.5");
    let key = sysctl::iface_key("ipv4", "dum0.5", "forwarding");
    assert!(sysctl::set(&key, "1").unwrap());
    assert!(!sysctl::set(&key, "1").unwrap());

    sysctl::set("net.ipv4.ip_forward", "1").unwrap();
    let inside = other.run(|| sysctl::get("net.ipv4.ip_forward").map_err(Into::into)).unwrap();
    assert_eq!(inside, "0");
    assert!(other
        .run(|| sysctl::get(&sysctl::iface_key("ipv4", "there0", "forwarding")).map_err(Into::into))
        .is_ok());
    assert_eq!(sysctl::get("net.ipv4.ip_forward").unwrap(), "1");
}

/// The second socket an event wait opens lands in the namespace of the connection's socket,
/// not in the calling thread's (the waits used to subscribe in the thread's namespace, where
/// no notification about the connection's links ever arrives).
#[test]
fn event_waits_subscribe_in_the_namespace_of_the_socket() {
    use std::time::Duration;
    const RTNLGRP_LINK: u32 = 1;
    private_netns();
    let home = NetNs::current().unwrap();
    let other = spare_netns();

    // Opened for `other` from here: subscriptions land in `other`.
    let mut ctr = Netlink::new_in(&other).unwrap();
    let sub = ctr.subscribe(&[RTNLGRP_LINK]).unwrap();
    assert!(
        NetNs::of_socket(sub.sock.as_fd()).unwrap().same_as(&other),
        "subscribed outside the socket's netns"
    );
    // Opened here, used while the thread is in `other`: subscriptions land here.
    let host = Netlink::new().unwrap();
    let sub = other.run(|| Ok(host.subscribe(&[RTNLGRP_LINK]))).unwrap().unwrap();
    assert!(
        NetNs::of_socket(sub.sock.as_fd()).unwrap().same_as(&home),
        "subscribed outside the socket's netns"
    );

    // Both waits, from here, on links and addresses of `other`.
    let spec =
        LinkSpec { up: true, ..LinkSpec::new("ev0", LinkKind::Veth { peer: VethPeer::new("ev1", None) }) };
    let a = ctr.link_add(&spec).unwrap();
    let b = ctr.link_by_name("ev1").unwrap().unwrap();
    ctr.link_set_up(b.index).unwrap();
    let up = ctr.wait_link_oper_up(a.index, Duration::from_secs(30)).unwrap().unwrap();
    assert!(up.oper_state_up());
    // IPv6 duplicate address detection runs on a veth with carrier: the address starts
    // tentative and the wait returns once it settled.
    ctr.addr_add(a.index, net("fd00:e::1/64")).unwrap();
    let addrs = ctr.wait_addrs_settled(a.index, Some(Family::V6), Duration::from_secs(30)).unwrap();
    let ours = addrs.iter().find(|x| x.addr == net("fd00:e::1/64")).expect("address listed");
    assert!(!ours.tentative() && !ours.dadfailed(), "{ours:?}");
    assert!(NetNs::current().unwrap().same_as(&home));
}
