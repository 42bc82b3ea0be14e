//! ADD and CHECK against the fake host (kernel::fake): what ADD builds for IPv4, IPv6 and dual
//! stack; every failure point of ADD, refused or with its answer lost, leaves the host as it was;
//! each kind of drift CHECK claims to find, one by one, in each family.

use crate::identity::BridgeIdentity;
use cni_common::netlink::nft::NftFamily;
use cni_common::netlink::PortFlag;
use cni_common::skel::Request;
use cni_common::spec::result::CniResult;
use cni_common::spec::{Command, Env};
use cni_common::{CniError, Version};
use ipnet::IpNet;
use serde_json::{json, Value};

use crate::add::add_with;
use crate::check::check_state;
use crate::config::Conf;
use crate::firewall::{MASQ_CHAIN, MASQ_TABLE};
use crate::kernel::fake::{key, Fake, Fault, World};
use crate::kernel::Ns;

const NETNS: &str = "/run/netns/pod";

/// The families a test runs in: the IPAM answer's addresses and their gateways.
const FAMILIES: [(&str, &[(&str, &str)]); 3] = [
    ("v4", &[("10.1.0.5/24", "10.1.0.1")]),
    ("v6", &[("fd00:1::5/64", "fd00:1::1")]),
    ("dual", &[("10.1.0.5/24", "10.1.0.1"), ("fd00:1::5/64", "fd00:1::1")]),
];

fn request(conf: &Value) -> Request {
    request_for(conf, "ctr1", "eth0")
}

fn request_for(conf: &Value, id: &str, ifname: &str) -> Request {
    let env = Env {
        command: Some(Command::Add),
        container_id: id.into(),
        netns: NETNS.into(),
        ifname: ifname.into(),
        args: String::new(),
        path: "/opt/cni/bin".into(),
        netns_override: true,
    };
    Request::new(env, serde_json::to_vec(conf).unwrap(), &Version::ALL).expect("valid request")
}

fn config(extra: Value) -> Value {
    let mut c = json!({"cniVersion": "1.0.0", "name": "net", "type": "bridge", "bridge": "cni0",
                       "isGateway": true, "isDefaultGateway": true, "ipMasq": true,
                       "ipam": {"type": "host-local"}});
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    c
}

/// A fresh host whose IPAM hands out `addrs` (address, gateway).
fn world(addrs: &[(&str, &str)]) -> Fake {
    let mut w = World::new();
    let ips: Vec<Value> = addrs.iter().map(|(a, g)| json!({"address": a, "gateway": g})).collect();
    w.ipam_answer = Some(Ok(json!({"cniVersion": "1.0.0", "ips": ips}).to_string()));
    w.attachment = Some(cni_common::attachment::AttachmentId::new("net", "ctr1", "eth0"));
    Fake::new(w)
}

fn add(f: &Fake, conf: &Value) -> Result<CniResult, CniError> {
    let req = request(conf);
    let c = Conf::from_request(&req)?;
    add_with(&mut f.clone(), &req, c)
}

fn check(f: &Fake, conf: &Value, prev: &CniResult) -> Result<(), CniError> {
    let req = request(conf);
    let c = Conf::from_request(&req)?;
    check_state(&mut f.clone(), &req, &c, prev)
}

fn masq_rules(f: &Fake) -> usize {
    f.w.borrow().rules(NftFamily::Inet, MASQ_TABLE, MASQ_CHAIN).len()
}

#[test]
fn add_builds_the_attachment_in_each_family_and_check_passes() {
    for (fam, addrs) in FAMILIES {
        let f = world(addrs);
        let conf = config(json!({}));
        let r = add(&f, &conf).unwrap_or_else(|e| panic!("{fam}: {}", e.msg));
        let w = f.w.borrow();
        let br = w.link(Ns::Host, "cni0").expect("bridge");
        let ctr = w.link(Ns::Container, "eth0").expect("container interface");
        let hv = w.links.iter().find(|l| l.ns == Ns::Host && l.link.index == ctr.link.link.unwrap()).unwrap();
        assert_eq!(hv.link.master, Some(br.link.index), "{fam}");
        let mac = |l: &cni_common::netlink::Link| cni_common::mac::Mac::text(l.mac);
        let names: Vec<&str> = r.interfaces.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, vec!["cni0", hv.link.name.as_str(), "eth0"], "{fam}");
        let macs: Vec<&str> = r.interfaces.iter().map(|i| i.mac.as_str()).collect();
        assert_eq!(macs, vec![mac(&br.link), mac(&hv.link), mac(&ctr.link)], "{fam}");
        assert_eq!(r.interfaces[2].sandbox, NETNS, "{fam}");
        assert!(r.ips.iter().all(|i| i.interface == Some(2)), "{fam}");
        assert_eq!(
            f.calls("link_set"),
            1,
            "{fam}: only the container end is set up (bridge and host end are made up)"
        );
        assert_eq!(f.calls("link_set_mac"), 0, "{fam}: a bridge made with its MAC needs no pinning");
        assert!(ctr.link.flags & 1 != 0, "{fam}: up");
        assert!(hv.link.flags & 1 != 0 && br.link.flags & 1 != 0, "{fam}: host end and bridge up");
        let bm = br.link.mac.unwrap();
        assert_eq!(bm[0] & 0x03, 0x02, "{fam}: the bridge got a random locally administered MAC");
        assert_eq!(w.sysctls[&format!("net/ipv6/conf/{}/accept_ra", hv.link.name)], "0", "{fam}");
        assert_eq!(w.sysctls["net/ipv6/conf/cni0/accept_ra"], "0", "{fam}");
        for (a, g) in addrs {
            let a: ipnet::IpNet = a.parse().unwrap();
            assert!(w.addrs.iter().any(|(n, x)| *n == Ns::Container && x.addr == a), "{fam}: {a}");
            let gw = ipnet::IpNet::new(g.parse().unwrap(), a.prefix_len()).unwrap();
            assert!(
                w.addrs.iter().any(|(n, x)| *n == Ns::Host && x.addr == gw && x.index == br.link.index),
                "{fam}"
            );
            let default: ipnet::IpNet =
                if a.addr().is_ipv4() { "0.0.0.0/0" } else { "::/0" }.parse().unwrap();
            assert!(
                w.routes.iter().any(|(n, x)| *n == Ns::Container
                    && x.dst == default
                    && x.gw == Some(g.parse().unwrap())),
                "{fam}: default route via {g}"
            );
        }
        let v4 = addrs.iter().any(|(a, _)| a.contains('.'));
        let v6 = addrs.iter().any(|(a, _)| a.contains(':'));
        assert_eq!(w.sysctls["net/ipv4/ip_forward"], if v4 { "1" } else { "0" }, "{fam}");
        assert_eq!(w.sysctls["net/ipv6/conf/all/forwarding"], if v6 { "1" } else { "0" }, "{fam}");
        // the uplink kept taking router advertisements once IPv6 forwarding came on
        assert_eq!(w.sysctls["net/ipv6/conf/eth0/accept_ra"], if v6 { "2" } else { "1" }, "{fam}");
        assert_eq!(w.ctr_sysctls.contains_key("net/ipv6/conf/eth0/disable_ipv6"), v6, "{fam}");
        assert!(w.ipam_reserved, "{fam}");
        drop(w);
        assert_eq!(masq_rules(&f), addrs.len(), "{fam}");
        assert_eq!(r.ips.len(), addrs.len(), "{fam}");
        check(&f, &conf, &r).unwrap_or_else(|e| panic!("{fam}: CHECK after ADD: {}", e.msg));
    }
}

/// The operations of a successful ADD, each with how often it was called.
fn calls_of_a_good_add(addrs: &[(&str, &str)], conf: &Value) -> Vec<(&'static str, usize)> {
    let f = world(addrs);
    add(&f, conf).unwrap();
    let mut out: Vec<(&'static str, usize)> = Vec::new();
    for c in f.w.borrow().calls.iter() {
        match out.iter_mut().find(|(o, _)| o == c) {
            Some((_, n)) => *n += 1,
            None => out.push((c, 1)),
        }
    }
    out
}

/// The host's state but for the settings ADD turns on for the whole host and no verb turns
/// off again (forwarding, and the uplink's `accept_ra` raised for it), as upstream: another
/// attachment may rely on them from the moment they are on.
fn state(f: &Fake) -> String {
    let w = f.w.borrow();
    let mut copy = World::new();
    copy.sysctls = w.sysctls.clone();
    for k in ["net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding", "net/ipv6/conf/eth0/accept_ra"] {
        copy.sysctls.remove(k);
    }
    let sysctls = format!("sysctls {:?}", copy.sysctls);
    // of nf_tables, the attachments' rules (commented): the shared tables and base chains stay
    // once made, as after the last DEL (and upstream's)
    let rules: Vec<String> = w
        .tables
        .values()
        .flat_map(|t| t.chains.iter().flat_map(|(_, r)| r))
        .filter_map(|r| r.comment.clone())
        .collect();
    let tables = format!("rules {rules:?}");
    w.state()
        .lines()
        .map(|l| match l {
            l if l.starts_with("sysctls ") => sysctls.clone(),
            l if l.starts_with("tables ") => tables.clone(),
            l => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The host as a failed ADD must leave it: what it was before, and nothing in the container.
fn assert_untouched(f: &Fake, before: &str, what: &str) {
    assert_eq!(state(f), before, "{what}");
    assert!(f.w.borrow().link(Ns::Container, "eth0").is_none(), "{what}");
}

#[test]
fn every_failure_point_of_add_is_undone_in_each_family() {
    for (fam, addrs) in FAMILIES {
        for conf in [config(json!({})), config(json!({"macspoofchk": true, "hairpinMode": true}))] {
            let mut survived = Vec::new();
            for (op, count) in calls_of_a_good_add(addrs, &conf) {
                for n in 0..count {
                    let f = world(addrs);
                    let before = state(&f);
                    f.fail(op, n, Fault::Before(libc::EIO));
                    let what = format!("{fam}: {op} #{n} refused, {conf}");
                    match add(&f, &conf) {
                        // only where ADD is meant to get over a refusal (below): whole then
                        Ok(r) => {
                            check(&f, &conf, &r).unwrap_or_else(|e| panic!("{what}: {}", e.msg));
                            survived.push(format!("{op} #{n}"));
                        }
                        Err(_) => assert_untouched(&f, &before, &what),
                    }
                }
            }
            // a refused nf_tables transaction is read and applied again, once; raising an
            // uplink's accept_ra is
            let mut expected = vec!["nft_apply #0"];
            // reported, not fatal (v6: the one interface at 1 besides lo), and so are the reads
            // before it: whether forwarding is on (else it is written), each interface's value
            if addrs.iter().any(|(a, _)| a.contains(':')) {
                expected.extend(["sysctl_set (raise)", "sysctl_get (forwarding)"]);
            }
            for s in survived.iter_mut() {
                if s.starts_with("sysctl_set") {
                    *s = "sysctl_set (raise)".into();
                } else if s.starts_with("sysctl_get") {
                    *s = "sysctl_get (forwarding)".into();
                }
            }
            expected.sort();
            survived.sort();
            survived.dedup();
            assert_eq!(survived, expected, "{fam} {conf}");
        }
    }
}

#[test]
fn a_lost_answer_to_a_change_is_undone_too() {
    // The change is made, the caller sees an error: the undo takes back what it knows of,
    // and what it cannot know of (a link whose creation's answer was lost) DEL finds by name.
    for (fam, addrs) in FAMILIES {
        let conf = config(json!({}));
        for (op, count) in calls_of_a_good_add(addrs, &conf) {
            if !matches!(
                op,
                "addr_add" | "route_add" | "nft_apply" | "sysctl_set" | "link_set" | "port_set" | "link_add"
            ) {
                continue;
            }
            for n in 0..count {
                let f = world(addrs);
                let before = state(&f);
                f.fail(op, n, Fault::After(libc::ETIMEDOUT));
                let what = format!("{fam}: {op} #{n} answer lost");
                match add(&f, &conf) {
                    // nf_tables: read again and applied again (the rules of the attachment
                    // replaced, not doubled)
                    Ok(r) => {
                        assert!(matches!(op, "nft_apply" | "sysctl_set"), "{what}: ADD succeeded");
                        assert_eq!(masq_rules(&f), addrs.len(), "{what}");
                        check(&f, &conf, &r).unwrap_or_else(|e| panic!("{what}: {}", e.msg));
                    }
                    Err(_) => assert_untouched(&f, &before, &what),
                }
            }
        }
    }
}

#[test]
fn a_bridge_another_add_joined_meanwhile_is_not_taken_back() {
    let f = world(FAMILIES[0].1);
    // another attachment's port joins the new bridge just before this ADD's firewall fails
    f.before("nft_apply", |w| {
        let br = w.link(Ns::Host, "cni0").map(|l| l.link.index);
        if let Some(l) = w.links.iter_mut().find(|l| l.ns == Ns::Host && l.link.name == "eth0") {
            l.link.master = br;
        }
    });
    // refused twice: the first attempt and the one after reading again
    f.fail("nft_apply", 0, Fault::Before(libc::EIO));
    f.fail("nft_apply", 0, Fault::Before(libc::EIO));
    add(&f, &config(json!({}))).unwrap_err();
    let w = f.w.borrow();
    assert!(w.link(Ns::Host, "cni0").is_some(), "the bridge has another port: it stays");
    assert!(w.link(Ns::Container, "eth0").is_none());
    assert!(!w.ipam_reserved);
}

#[test]
fn the_container_interface_vanishing_midway_fails_the_add_and_is_undone() {
    for (fam, addrs) in FAMILIES {
        let f = world(addrs);
        let before = state(&f);
        f.before("addr_add", |w| {
            if let Some(c) = w.link(Ns::Container, "eth0").map(|l| l.link.index) {
                w.unregister(Ns::Container, c);
            }
        });
        let e = add(&f, &config(json!({}))).unwrap_err();
        assert!(e.msg.contains("failed to add IP addr"), "{fam}: {}", e.msg);
        assert_untouched(&f, &before, fam);
    }
}

#[test]
fn an_existing_container_interface_or_a_non_bridge_is_refused_before_anything_changes() {
    let f = world(FAMILIES[2].1);
    let taken = f.clone();
    {
        let mut w = taken.w.borrow_mut();
        w.links.push(crate::kernel::fake::FakeLink {
            ns: Ns::Container,
            link: cni_common::netlink::Link { index: 999, name: "eth0".into(), ..Default::default() },
            port: Default::default(),
            vlans: Vec::new(),
        });
    }
    let before = f.state();
    let e = add(&f, &config(json!({}))).unwrap_err();
    assert!(e.msg.contains("already exists"), "{}", e.msg);
    assert_eq!(f.state(), before, "not even a sysctl");
    assert_eq!(f.calls("ipam_start"), 0, "nothing reserved");

    let f = world(FAMILIES[0].1);
    f.w.borrow_mut().links.push(crate::kernel::fake::FakeLink {
        ns: Ns::Host,
        link: cni_common::netlink::Link {
            index: 998,
            name: "cni0".into(),
            kind: Some("dummy".into()),
            ..Default::default()
        },
        port: Default::default(),
        vlans: Vec::new(),
    });
    let e = add(&f, &config(json!({}))).unwrap_err();
    assert_eq!(e.code, 7, "{}", e.msg);
    assert_eq!(f.calls("ipam_start"), 0);
}

#[test]
fn vlans_on_a_kernel_without_filtering_are_refused_with_nothing_reserved() {
    for (fam, addrs) in FAMILIES {
        let f = world(addrs);
        f.w.borrow_mut().no_vlan_filtering = true;
        let before = state(&f);
        let e = add(&f, &config(json!({"vlan": 100}))).unwrap_err();
        assert_eq!(e.code, 2, "{fam}: {}", e.msg);
        assert!(e.msg.contains("field \"vlan\""), "{fam}: {}", e.msg);
        let e = add(&f, &config(json!({"vlanTrunk": [{"id": 5}]}))).unwrap_err();
        assert!(e.msg.contains("field \"vlanTrunk\""), "{fam}: {}", e.msg);
        assert_untouched(&f, &before, fam);
        assert_eq!(f.calls("ipam_add"), 0, "{fam}: nothing reserved before the VLANs are in place");
    }
}

#[test]
fn an_add_of_the_ipam_that_fails_reserves_nothing_to_release() {
    for (fam, addrs) in FAMILIES {
        let f = world(addrs);
        f.w.borrow_mut().ipam_answer = Some(Err(CniError::internal("no IP addresses available")));
        let before = state(&f);
        add(&f, &config(json!({}))).unwrap_err();
        assert_untouched(&f, &before, fam);
        assert_eq!(
            f.calls("ipam_del"),
            0,
            "{fam}: a failed delegate is not released (it may hold an earlier ADD's address)"
        );
    }
}

/// Each kind of drift CHECK claims to find, made after a good ADD, one at a time.
#[test]
fn check_finds_each_kind_of_drift_in_each_family() {
    type Drift = (&'static str, &'static str, fn(&mut World));
    let drifts: [Drift; 12] = [
        ("bridge gone", "was not found", |w| {
            let i = w.link(Ns::Host, "cni0").unwrap().link.index;
            w.unregister(Ns::Host, i);
        }),
        ("bridge MAC", "Mac doesn't match", |w| {
            let p = w.links.iter().position(|l| l.link.name == "cni0").unwrap();
            w.links[p].link.mac = Some([2, 9, 9, 9, 9, 9]);
        }),
        ("container interface gone", "not found", |w| {
            let i = w.link(Ns::Container, "eth0").unwrap().link.index;
            w.unregister(Ns::Container, i);
        }),
        ("container interface down", "is down", |w| {
            let p = w.links.iter().position(|l| l.ns == Ns::Container && l.link.name == "eth0").unwrap();
            w.links[p].link.flags &= !1;
        }),
        ("container MAC", "Mac", |w| {
            let p = w.links.iter().position(|l| l.ns == Ns::Container && l.link.name == "eth0").unwrap();
            w.links[p].link.mac = Some([2, 8, 8, 8, 8, 8]);
        }),
        ("port left the bridge", "was not found", |w| {
            let p = w.links.iter().position(|l| l.ns == Ns::Host && l.link.name.starts_with("veth")).unwrap();
            w.links[p].link.master = None;
        }),
        ("hairpin", "hairpin", |w| {
            let p = w.links.iter().position(|l| l.ns == Ns::Host && l.link.name.starts_with("veth")).unwrap();
            w.links[p].port.set(PortFlag::HAIRPIN, true);
        }),
        ("address", "Failed to match addr", |w| {
            w.addrs.retain(|(n, _)| *n != Ns::Container);
        }),
        ("connected route", "no connected route", |w| {
            w.routes.retain(|(n, r)| !(*n == Ns::Container && r.gw.is_none()));
        }),
        ("default route", "Failed to find a route", |w| {
            w.routes.retain(|(n, r)| !(*n == Ns::Container && r.dst.prefix_len() == 0));
        }),
        ("gateway on the bridge", "gateway address", |w| {
            let br = w.link(Ns::Host, "cni0").unwrap().link.index;
            w.addrs.retain(|(n, a)| !(*n == Ns::Host && a.index == br));
        }),
        ("masquerade rule", "masquerade rule", |w| {
            let k = key(NftFamily::Inet, MASQ_TABLE);
            let t = w.tables.get_mut(&k).unwrap();
            for (c, rules) in t.chains.iter_mut() {
                if c.name == MASQ_CHAIN {
                    rules.pop();
                }
            }
        }),
    ];
    for (fam, addrs) in FAMILIES {
        for (what, says, drift) in drifts {
            let f = world(addrs);
            let conf = config(json!({}));
            let r = add(&f, &conf).unwrap();
            check(&f, &conf, &r).unwrap();
            drift(&mut f.w.borrow_mut());
            let e = check(&f, &conf, &r).expect_err(&format!("{fam}: {what} not found by CHECK"));
            assert!(e.msg.contains(says), "{fam}: {what}: {}", e.msg);
        }
    }
}

#[test]
fn check_finds_a_dropped_address_of_either_family_in_dual_stack() {
    for drop_v6 in [false, true] {
        let f = world(FAMILIES[2].1);
        let conf = config(json!({}));
        let r = add(&f, &conf).unwrap();
        f.w.borrow_mut().addrs.retain(|(n, a)| !(*n == Ns::Container && a.addr.addr().is_ipv6() == drop_v6));
        let e = check(&f, &conf, &r).unwrap_err();
        let gone = if drop_v6 { "fd00:1::5/64" } else { "10.1.0.5/24" };
        assert!(e.msg.contains(gone), "{}", e.msg);
    }
}

#[test]
fn check_leaves_masquerading_to_upstreams_intact_chains() {
    let f = world(FAMILIES[2].1);
    let conf = config(json!({}));
    let r = add(&f, &conf).unwrap();
    f.w.borrow_mut().tables.clear();
    check(&f, &conf, &r).unwrap_err();
    f.w.borrow_mut().upstream_masq = true;
    check(&f, &conf, &r).unwrap();
}

#[test]
fn the_spoof_check_and_port_flags_are_checked() {
    let f = world(FAMILIES[0].1);
    let conf = config(json!({"macspoofchk": true, "portIsolation": true}));
    let r = add(&f, &conf).unwrap();
    check(&f, &conf, &r).unwrap();
    {
        let mut w = f.w.borrow_mut();
        let p = w.links.iter().position(|l| l.ns == Ns::Host && l.link.name.starts_with("veth")).unwrap();
        w.links[p].port.set(PortFlag::ISOLATED, false);
    }
    assert!(check(&f, &conf, &r).unwrap_err().msg.contains("isolation"));
    let f = world(FAMILIES[0].1);
    let r = add(&f, &conf).unwrap();
    f.w.borrow_mut().tables.retain(|k, _| k.0 != "bridge");
    assert!(check(&f, &conf, &r).unwrap_err().msg.contains("macspoofchk"));
}

#[test]
fn a_second_add_on_the_same_bridge_reuses_it_and_forwarding_is_written_once() {
    let f = world(FAMILIES[2].1);
    add(&f, &config(json!({}))).unwrap();
    let writes = f.calls("sysctl_set");
    let bridges = f.w.borrow().links.iter().filter(|l| l.link.name == "cni0").count();
    assert_eq!(bridges, 1);
    // another container on the same host: the bridge, its gateways and forwarding are there
    let g = f.clone();
    {
        let mut w = g.w.borrow_mut();
        let c = w.link(Ns::Container, "eth0").unwrap().link.index;
        w.unregister(Ns::Container, c);
        w.calls.clear();
    }
    add(&g, &config(json!({}))).unwrap();
    assert_eq!(g.w.borrow().links.iter().filter(|l| l.link.name == "cni0").count(), 1);
    assert_eq!(
        g.calls("link_set"),
        1,
        "only the container end comes up: the bridge's MAC is not pinned again"
    );
    assert!(g.calls("sysctl_set") < writes, "forwarding and the bridge's accept_ra are not written again");
    assert_eq!(g.calls("link_add"), 1, "only the veth pair is created");
}

#[test]
fn the_first_add_on_a_new_bridge_asks_who_drops_its_subnets_and_later_adds_do_not() {
    let f = world(FAMILIES[2].1);
    f.w.borrow_mut().forward_drop =
        Some("iptables-nft chain FORWARD of table ip filter (policy drop)".into());
    add(&f, &config(json!({}))).unwrap();
    let mut asked: Vec<String> = f.w.borrow().forward_drop_asked.iter().map(|n| n.to_string()).collect();
    asked.sort();
    let mut want: Vec<String> =
        FAMILIES[2].1.iter().map(|(a, _)| a.parse::<IpNet>().unwrap().trunc().to_string()).collect();
    want.sort();
    assert_eq!(asked, want, "each family's subnet, once");
    let g = f.clone();
    {
        let mut w = g.w.borrow_mut();
        let c = w.link(Ns::Container, "eth0").unwrap().link.index;
        w.unregister(Ns::Container, c);
        w.forward_drop_asked.clear();
    }
    add(&g, &config(json!({}))).unwrap();
    assert!(g.w.borrow().forward_drop_asked.is_empty(), "the bridge existed: no second look");
}

fn del(f: &Fake, conf: &Value, in_container: bool) -> Result<(), CniError> {
    let req = request(conf);
    let t = crate::config::Teardown::from_request(&req)?;
    crate::del::del_with(
        &mut f.clone(),
        &t,
        req.network(),
        "eth0",
        in_container,
        cni_common::error_list::ErrorList::new(),
    )
}

/// [`state`] without what DEL leaves by design, as upstream: the bridge, its addresses and
/// routes, its `accept_ra`.
fn state_after_del(f: &Fake) -> String {
    let mut copy = f.w.borrow().copy();
    if let Some(b) = copy.link(Ns::Host, "cni0").map(|l| l.link.index) {
        copy.unregister(Ns::Host, b);
    }
    state(&Fake::new(copy))
}

#[test]
fn del_takes_back_everything_but_the_bridge_in_each_family_and_again_finds_nothing() {
    for (fam, addrs) in FAMILIES {
        for extra in [json!({}), json!({"macspoofchk": true})] {
            let conf = config(extra);
            let pristine = world(addrs);
            let before = state(&pristine);
            let f = world(addrs);
            add(&f, &conf).unwrap();
            del(&f, &conf, true).unwrap_or_else(|e| panic!("{fam}: {}", e.msg));
            assert_eq!(state_after_del(&f), before, "{fam} {conf}");
            assert!(f.w.borrow().link(Ns::Host, "cni0").is_some(), "{fam}: the bridge stays");
            let (applies, after) = (f.calls("nft_apply"), f.state());
            del(&f, &conf, true).unwrap();
            assert_eq!(f.calls("nft_apply"), applies, "{fam}: a second DEL commits nothing");
            assert_eq!(f.state(), after, "{fam}: and changes nothing");
        }
    }
}

#[test]
fn del_after_an_add_killed_at_any_point_leaves_nothing_but_the_bridge() {
    for (fam, addrs) in FAMILIES {
        for conf in [config(json!({})), config(json!({"macspoofchk": true, "hairpinMode": true}))] {
            let before = state(&world(addrs));
            for (op, count) in calls_of_a_good_add(addrs, &conf) {
                for n in 0..count {
                    let f = world(addrs);
                    f.crash(op, n);
                    add(&f, &conf).unwrap_err();
                    f.w.borrow_mut().crashed = false;
                    del(&f, &conf, true).unwrap_or_else(|e| panic!("{fam}: killed at {op} #{n}: {}", e.msg));
                    assert_eq!(state_after_del(&f), before, "{fam}: killed at {op} #{n}, {conf}");
                    assert!(f.w.borrow().link(Ns::Container, "eth0").is_none());
                }
            }
        }
    }
}

#[test]
fn del_without_the_namespace_still_removes_rules_and_releases_addresses() {
    for (fam, addrs) in FAMILIES {
        let f = world(addrs);
        let conf = config(json!({"macspoofchk": true}));
        add(&f, &conf).unwrap();
        del(&f, &conf, false).unwrap();
        let w = f.w.borrow();
        let commented = w
            .tables
            .values()
            .flat_map(|t| t.chains.iter().flat_map(|(_, r)| r))
            .filter(|r| r.comment.is_some())
            .count();
        assert_eq!(commented, 0, "{fam}");
        assert!(!w.ipam_reserved, "{fam}");
    }
}

#[test]
fn del_goes_on_past_a_failure_and_reports_it() {
    for (fam, addrs) in FAMILIES {
        let f = world(addrs);
        let conf = config(json!({}));
        add(&f, &conf).unwrap();
        f.fail("nft_read", 0, Fault::Before(libc::EIO));
        let e = del(&f, &conf, true).unwrap_err();
        assert!(e.msg.contains("remove firewall rules"), "{fam}: {}", e.msg);
        let w = f.w.borrow();
        assert!(w.link(Ns::Container, "eth0").is_none(), "{fam}: the interface went all the same");
        assert!(!w.ipam_reserved, "{fam}: and the address");
        drop(w);
        // upstream's masquerading is removed too
        let f = world(addrs);
        add(&f, &conf).unwrap();
        f.w.borrow_mut().upstream_masq = true;
        del(&f, &conf, true).unwrap();
        assert!(!f.w.borrow().upstream_masq, "{fam}");
    }
}

/// DEL's firewall transaction: one that names something a concurrent DEL or GC removed first
/// (ENOENT) is rebuilt from what is left and succeeds; any other refusal is reported at once,
/// not retried, and the rules stay for the runtime's next DEL.
#[test]
fn del_rebuilds_a_firewall_transaction_only_when_something_it_named_vanished() {
    for (fam, addrs) in FAMILIES {
        let conf = config(json!({"macspoofchk": true}));
        let f = world(addrs);
        add(&f, &conf).unwrap();
        let applies = f.calls("nft_apply");
        f.fail("nft_apply", 0, Fault::Before(libc::ENOENT));
        del(&f, &conf, true).unwrap_or_else(|e| panic!("{fam}: {}", e.msg));
        assert_eq!(f.calls("nft_apply"), applies + 2, "{fam}: rebuilt once, then committed");
        assert_eq!(masq_rules(&f), 0, "{fam}");

        let f = world(addrs);
        add(&f, &conf).unwrap();
        let applies = f.calls("nft_apply");
        f.fail("nft_apply", 0, Fault::Before(libc::EPERM));
        let e = del(&f, &conf, true).unwrap_err();
        assert!(e.msg.contains("remove firewall rules"), "{fam}: {}", e.msg);
        assert_eq!(f.calls("nft_apply"), applies + 1, "{fam}: not retried");
        assert!(masq_rules(&f) > 0, "{fam}: nothing deleted");
        del(&f, &conf, true).unwrap_or_else(|e| panic!("{fam}: the next DEL: {}", e.msg));
        assert_eq!(masq_rules(&f), 0, "{fam}");
    }
}

#[test]
fn bridge_nf_call_needs_br_netfilter_and_turns_on_each_family_it_serves() {
    for (fam, addrs) in FAMILIES {
        let conf = config(json!({"bridgeNfCallIptables": true}));
        let f = world(addrs);
        let before = f.state();
        let e = add(&f, &conf).unwrap_err();
        assert_eq!(e.code, 50, "{fam}: {}", e.msg);
        assert_eq!(f.state(), before, "{fam}: refused before anything changed");
        let f = world(addrs);
        for k in ["net/bridge/bridge-nf-call-iptables", "net/bridge/bridge-nf-call-ip6tables"] {
            f.w.borrow_mut().sysctls.insert(k.into(), "0".into());
        }
        add(&f, &conf).unwrap();
        let w = f.w.borrow();
        let v6 = addrs.iter().any(|(a, _)| a.contains(':'));
        assert_eq!(w.sysctls["net/bridge/bridge-nf-call-iptables"], "1", "{fam}");
        assert_eq!(w.sysctls["net/bridge/bridge-nf-call-ip6tables"], if v6 { "1" } else { "0" }, "{fam}");
    }
}

fn host_veth(f: &Fake) -> crate::kernel::fake::FakeLink {
    let w = f.w.borrow();
    let c = w.link(Ns::Container, "eth0").expect("container interface");
    w.links
        .iter()
        .find(|l| l.ns == Ns::Host && Some(l.link.index) == c.link.link)
        .cloned()
        .expect("host veth")
}

#[test]
fn vlans_access_trunk_and_the_default_vlan_on_the_port() {
    use cni_common::netlink::PortVlan;
    let f = world(FAMILIES[0].1);
    let conf = config(json!({"vlan": 100, "isGateway": false}));
    add(&f, &conf).unwrap();
    assert_eq!(host_veth(&f).vlans, vec![PortVlan::access(100)], "the default VLAN 1 removed");
    let f = world(FAMILIES[1].1);
    let conf = config(
        json!({"vlanTrunk": [{"id": 101}, {"minID": 200, "maxID": 201}], "preserveDefaultVlan": true, "isGateway": false}),
    );
    let r = add(&f, &conf).unwrap();
    let mut v = host_veth(&f).vlans;
    v.sort();
    let mut want =
        vec![PortVlan::access(1), PortVlan::tagged(101), PortVlan::tagged(200), PortVlan::tagged(201)];
    want.sort();
    assert_eq!(v, want);
    check(&f, &conf, &r).unwrap();
    // a VLAN gone from the port: CHECK says so
    {
        let mut w = f.w.borrow_mut();
        let i = w.links.iter().position(|l| l.ns == Ns::Host && l.link.name.starts_with("veth")).unwrap();
        w.links[i].vlans.retain(|x| x.vid != 200);
    }
    assert!(check(&f, &conf, &r).unwrap_err().msg.contains("lacks VLAN"));
}

#[test]
fn a_vlan_gateway_carries_the_gateway_addresses_of_each_family() {
    for (fam, addrs) in FAMILIES {
        let f = world(addrs);
        let r = add(&f, &config(json!({"vlan": 100}))).unwrap();
        let w = f.w.borrow();
        let gw = w.link(Ns::Host, "cni0.100").unwrap_or_else(|| panic!("{fam}: no VLAN gateway"));
        for (a, g) in addrs {
            let a: ipnet::IpNet = a.parse().unwrap();
            let want = ipnet::IpNet::new(g.parse().unwrap(), a.prefix_len()).unwrap();
            assert!(
                w.addrs.iter().any(|(n, x)| *n == Ns::Host && x.index == gw.link.index && x.addr == want),
                "{fam}"
            );
        }
        let br = w.link(Ns::Host, "cni0").unwrap().link.index;
        assert!(
            !w.addrs.iter().any(|(n, x)| *n == Ns::Host && x.index == br),
            "{fam}: nothing on the bridge itself"
        );
        let port = w.links.iter().find(|l| l.link.link == Some(gw.link.index)).expect("its bridge end");
        assert_eq!(port.link.master, Some(br));
        assert_eq!(port.vlans, vec![cni_common::netlink::PortVlan::access(100)], "{fam}");
        assert_eq!(r.interfaces.last().map(|i| i.name.as_str()), Some("cni0.100"), "{fam}");
        assert_eq!(r.interfaces.last().unwrap().mac, cni_common::mac::Mac::text(gw.link.mac), "{fam}");
        assert!(gw.link.flags & 1 != 0, "{fam}: the VLAN gateway is up");
        assert_eq!(gw.link.mtu, w.link(Ns::Host, "cni0").unwrap().link.mtu, "{fam}: the bridge's MTU");
    }
}

#[test]
fn port_flags_mtu_promisc_and_the_containers_mac_are_applied() {
    let f = world(FAMILIES[2].1);
    let conf = config(json!({"hairpinMode": true, "portIsolation": true, "mtu": 1400,
                             "runtimeConfig": {"mac": "0a:58:0a:01:00:05"}, "macspoofchk": true}));
    let r = add(&f, &conf).unwrap();
    let hv = host_veth(&f);
    assert!(hv.port.get(PortFlag::HAIRPIN) && hv.port.get(PortFlag::ISOLATED));
    assert_eq!(hv.link.mtu, 1400);
    assert_eq!(
        hv.link.alias.as_deref(),
        Some(cni_common::attachment::AttachmentId::new("net", "ctr1", "eth0").veth_alias().as_str())
    );
    let w = f.w.borrow();
    let br = w.link(Ns::Host, "cni0").unwrap();
    assert_eq!(br.link.mtu, 1400);
    assert!(br.link.flags & 0x100 == 0, "not promiscuous");
    let c = w.link(Ns::Container, "eth0").unwrap();
    assert_eq!(c.link.mac, Some([0x0a, 0x58, 0x0a, 0x01, 0x00, 0x05]));
    assert_eq!(r.interfaces[2].mac, "0a:58:0a:01:00:05");
    assert_eq!(r.interfaces[2].sandbox, NETNS);
    assert_eq!(r.interfaces[1].name, hv.link.name);
    assert_eq!(r.interfaces[0].name, "cni0");
    drop(w);
    // the spoof check allows exactly that MAC on that port
    let jumps = f.w.borrow().rules(NftFamily::Bridge, "nat", "PREROUTING");
    assert_eq!(jumps.len(), 1);
    assert_eq!(jumps[0].iifname().as_deref(), Some(hv.link.name.as_str()));
    check(&f, &conf, &r).unwrap();
    // promiscuous mode on the bridge, and CHECK's view of it
    let f = world(FAMILIES[0].1);
    let conf = config(json!({"promiscMode": true}));
    let r = add(&f, &conf).unwrap();
    assert!(f.w.borrow().link(Ns::Host, "cni0").unwrap().link.flags & 0x100 != 0, "promiscuous");
    check(&f, &conf, &r).unwrap();
    {
        let mut w = f.w.borrow_mut();
        let i = w.links.iter().position(|l| l.link.name == "cni0").unwrap();
        w.links[i].link.flags &= !0x100;
    }
    assert!(check(&f, &conf, &r).unwrap_err().msg.contains("Promisc"));
}

#[test]
fn a_new_bridge_gets_its_creation_options_and_one_that_exists_only_what_add_keeps() {
    use cni_common::netlink::{BridgeOpt, BridgeOpts, OptValue};
    let opts_of = |f: &Fake| f.w.borrow().link(Ns::Host, "cni0").unwrap().link.bridge.clone().unwrap();
    // created: VLAN filtering on with a VLAN, the kernel's default without
    let f = world(FAMILIES[0].1);
    let r = add(&f, &config(json!({"vlan": 100, "isGateway": false}))).unwrap();
    assert_eq!(opts_of(&f).get(BridgeOpt::VLAN_FILTERING), Some(1));
    assert_eq!(f.calls("bridge_set"), 0, "created with its options: nothing set afterwards");
    check(&f, &config(json!({"vlan": 100, "isGateway": false})), &r).unwrap();
    let f = world(FAMILIES[0].1);
    add(&f, &config(json!({}))).unwrap();
    assert_eq!(opts_of(&f).get(BridgeOpt::VLAN_FILTERING), Some(0));
    // a bridge someone else made, down, filtering off, not promiscuous: ADD with a VLAN and
    // promiscMode turns promiscuity on and brings it up, and leaves its filtering alone
    for (fam, addrs) in FAMILIES {
        let f = world(addrs);
        let theirs = BridgeOpts::from([
            (BridgeOpt::VLAN_FILTERING, OptValue::U8(0)),
            (BridgeOpt::MCAST_SNOOPING, OptValue::U8(0)),
        ]);
        f.w.borrow_mut().links.push(crate::kernel::fake::FakeLink {
            ns: Ns::Host,
            link: cni_common::netlink::Link {
                index: 990,
                name: "cni0".into(),
                kind: Some("bridge".into()),
                mtu: 1500,
                mac: Some([0x02, 0, 0, 0, 0, 0x99]),
                bridge: Some(theirs.clone()),
                ..Default::default()
            },
            port: Default::default(),
            vlans: Vec::new(),
        });
        let conf = config(json!({"vlan": 100, "isGateway": false, "promiscMode": true}));
        let r = add(&f, &conf).unwrap_or_else(|e| panic!("{fam}: {}", e.msg));
        let br = f.w.borrow().link(Ns::Host, "cni0").unwrap().link.clone();
        assert_eq!(br.index, 990, "{fam}: the bridge that exists is used");
        assert_eq!(br.bridge, Some(theirs), "{fam}: its options untouched");
        assert_eq!(f.calls("bridge_set"), 0, "{fam}");
        assert!(br.promisc() && br.up(), "{fam}: promiscuous and up");
        check(&f, &conf, &r)
            .unwrap_or_else(|e| panic!("{fam}: options set only at creation are not judged: {}", e.msg));
    }
}

#[test]
fn auto_mtu_takes_kubenets_choice_from_the_host() {
    let f = world(FAMILIES[0].1);
    {
        let mut w = f.w.borrow_mut();
        let i = w.links.iter().position(|l| l.ns == Ns::Host && l.link.name == "eth0").unwrap();
        w.links[i].link.mtu = 9001;
    }
    add(&f, &config(json!({"autoMtu": true}))).unwrap();
    assert_eq!(host_veth(&f).link.mtu, 9001);
    assert_eq!(f.w.borrow().link(Ns::Host, "cni0").unwrap().link.mtu, 9001);
    // its twin: without autoMtu (and without mtu) the host's interfaces choose nothing
    let f = world(FAMILIES[0].1);
    {
        let mut w = f.w.borrow_mut();
        let i = w.links.iter().position(|l| l.ns == Ns::Host && l.link.name == "eth0").unwrap();
        w.links[i].link.mtu = 9001;
    }
    add(&f, &config(json!({}))).unwrap();
    assert_ne!(host_veth(&f).link.mtu, 9001, "no MTU asked for, none taken from the host");
    assert_ne!(f.w.borrow().link(Ns::Host, "cni0").unwrap().link.mtu, 9001);
}

/// Two ADDs on one bridge at the same moment: the other one adds the gateway address between
/// this ADD's read of the bridge's addresses and its own request, which the kernel answers
/// EEXIST. The address is there, as wanted: ADD goes on and succeeds.
#[test]
fn a_gateway_address_added_by_a_concurrent_add_is_taken_as_there() {
    for (fam, addrs) in FAMILIES {
        let f = world(addrs);
        // the container's addresses come first, then the gateways on the bridge
        f.fail("addr_add", addrs.len(), Fault::After(libc::EEXIST));
        let r = add(&f, &config(json!({}))).unwrap_or_else(|e| panic!("{fam}: {}", e.msg));
        check(&f, &config(json!({})), &r).unwrap_or_else(|e| panic!("{fam}: {}", e.msg));
        assert!(f.w.borrow().faults.is_empty(), "{fam}: the fault was met");
    }
}

#[test]
fn a_disabled_container_interface_stays_down_without_addresses() {
    for (fam, addrs) in FAMILIES {
        let f = world(addrs);
        let mut conf =
            config(json!({"disableContainerInterface": true, "isGateway": false, "ipMasq": false}));
        conf.as_object_mut().unwrap().remove("ipam");
        let r = add(&f, &conf).unwrap();
        let w = f.w.borrow();
        let c = w.link(Ns::Container, "eth0").unwrap();
        assert_eq!(c.link.flags & 1, 0, "{fam}: down");
        assert!(!w.addrs.iter().any(|(n, _)| *n == Ns::Container), "{fam}");
        assert_eq!(f.calls("wait_oper_up"), 0, "{fam}: nothing to wait for");
        drop(w);
        check(&f, &conf, &r).unwrap();
        // the same attachment not disabled: a down interface is drift
        let mut on = config(json!({"isGateway": false, "ipMasq": false}));
        on.as_object_mut().unwrap().remove("ipam");
        assert!(check(&f, &on, &r).unwrap_err().msg.contains("is down"), "{fam}");
    }
}

#[test]
fn an_existing_bridge_address_of_another_subnet_needs_force_address() {
    for (fam, addrs) in FAMILIES {
        let f = world(addrs);
        // a bridge that is there already with another address of each family
        let br = {
            let mut w = f.w.borrow_mut();
            let i = w.links.len() as u32 + 100;
            w.links.push(crate::kernel::fake::FakeLink {
                ns: Ns::Host,
                link: cni_common::netlink::Link {
                    index: i,
                    name: "cni0".into(),
                    kind: Some("bridge".into()),
                    flags: 1,
                    mtu: 1500,
                    mac: Some([2, 1, 1, 1, 1, 1]),
                    ..Default::default()
                },
                port: Default::default(),
                vlans: Vec::new(),
            });
            w.sysctls.insert("net/ipv6/conf/cni0/accept_ra".into(), "1".into());
            for a in ["10.1.0.99/24", "fd00:1::99/64"] {
                w.addrs.push((
                    Ns::Host,
                    cni_common::netlink::Address {
                        index: i,
                        addr: a.parse().unwrap(),
                        broadcast: None,
                        flags: 0,
                        scope: 0,
                    },
                ));
            }
            i
        };
        let e = add(&f, &config(json!({}))).unwrap_err();
        assert!(e.msg.contains("already has an IP address different from"), "{fam}: {}", e.msg);
        assert!(f.w.borrow().link(Ns::Container, "eth0").is_none(), "{fam}: undone");
        let r = add(&f, &config(json!({"forceAddress": true}))).unwrap();
        let w = f.w.borrow();
        let on: Vec<String> = w
            .addrs
            .iter()
            .filter(|(n, a)| *n == Ns::Host && a.index == br)
            .map(|(_, a)| a.addr.to_string())
            .collect();
        for (a, g) in addrs {
            let p: ipnet::IpNet = a.parse().unwrap();
            assert!(on.contains(&format!("{g}/{}", p.prefix_len())), "{fam}: {on:?}");
            let old = if p.addr().is_ipv4() { "10.1.0.99/24" } else { "fd00:1::99/64" };
            assert!(!on.contains(&old.to_string()), "{fam}: replaced: {on:?}");
        }
        assert_eq!(w.link(Ns::Host, "cni0").unwrap().link.mac, Some([2, 1, 1, 1, 1, 1]), "{fam}: MAC kept");
        assert_eq!(
            f.calls("link_set_mac"),
            1,
            "{fam}: pinned once, by the first ADD (the second finds it pinned)"
        );
        assert_eq!(r.interfaces[0].mac, "02:01:01:01:01:01");
        assert_eq!(w.sysctls["net/ipv6/conf/cni0/accept_ra"], "0", "{fam}: we own its routes");
    }
}

#[test]
fn the_containers_ipv6_settings_and_a_layer_2_attachment() {
    let f = world(FAMILIES[1].1);
    add(&f, &config(json!({"enabledad": true}))).unwrap();
    let w = f.w.borrow();
    assert_eq!(w.ctr_sysctls["net/ipv6/conf/eth0/enhanced_dad"], "1");
    assert_eq!(w.ctr_sysctls["net/ipv6/conf/eth0/keep_addr_on_down"], "1");
    assert_eq!(w.ctr_sysctls["net/ipv6/conf/lo/disable_ipv6"], "0");
    drop(w);
    assert_eq!(f.calls("wait_settled"), 1, "an IPv6 gateway: routes wait for DAD");
    let f = world(FAMILIES[0].1);
    add(&f, &config(json!({}))).unwrap();
    assert_eq!(f.calls("wait_settled"), 0, "no IPv6 gateway: no wait");
    // layer 2: no IPAM, no addresses, no gateway, no firewall
    let f = world(FAMILIES[0].1);
    let mut conf = config(json!({"isGateway": false, "ipMasq": false}));
    conf.as_object_mut().unwrap().remove("ipam");
    let r = add(&f, &conf).unwrap();
    assert!(r.ips.is_empty());
    assert_eq!(f.calls("ipam_start"), 0);
    assert!(f.w.borrow().tables.is_empty());
    check(&f, &conf, &r).unwrap();
}

#[test]
fn dns_of_the_configuration_wins_over_ipams() {
    let f = world(FAMILIES[0].1);
    let r = add(&f, &config(json!({"dns": {"nameservers": ["10.1.0.53"]}}))).unwrap();
    assert_eq!(r.dns.nameservers, vec!["10.1.0.53".to_string()]);
}

#[test]
fn a_port_that_never_comes_up_fails_the_add_and_is_undone() {
    for (fam, addrs) in FAMILIES {
        let f = world(addrs);
        let before = state(&f);
        f.fail("wait_oper_up", 0, Fault::Before(libc::ETIMEDOUT));
        let e = add(&f, &config(json!({}))).unwrap_err();
        assert!(e.msg.contains("bridge port in error state"), "{fam}: {}", e.msg);
        assert_untouched(&f, &before, fam);
        // vanished while waiting
        let f = world(addrs);
        f.before("wait_oper_up", |w| {
            if let Some(i) = w.links.iter().position(|l| l.ns == Ns::Host && l.link.name.starts_with("veth"))
            {
                let idx = w.links[i].link.index;
                w.unregister(Ns::Host, idx);
            }
        });
        let e = add(&f, &config(json!({}))).unwrap_err();
        assert!(e.msg.contains("vanished"), "{fam}: {}", e.msg);
    }
}

#[test]
fn gc_removes_the_rules_of_attachments_not_valid_and_of_ports_gone() {
    use cni_common::attachment::AttachmentId;
    for (fam, addrs) in FAMILIES {
        let f = world(addrs);
        let conf = config(json!({"macspoofchk": true}));
        let mut other = conf.clone();
        other["name"] = json!("othernet");
        for (c, id, ifname) in [(&conf, "ctr1", "eth0"), (&conf, "ctr2", "eth1"), (&other, "ctr3", "eth2")] {
            let req = request_for(c, id, ifname);
            add_with(&mut f.clone(), &req, Conf::from_request(&req).unwrap()).unwrap();
        }
        let tags = |f: &Fake| -> Vec<String> {
            let w = f.w.borrow();
            let mut t: Vec<String> = w
                .tables
                .values()
                .flat_map(|t| t.chains.iter().flat_map(|(_, r)| r))
                .filter_map(|r| r.comment.clone())
                .collect();
            t.sort();
            t.dedup();
            t
        };
        let a = |id: &str, ifname: &str, net: &str| AttachmentId::new(net, id, ifname);
        let has = |f: &Fake, x: &AttachmentId| {
            let t = tags(f);
            (t.iter().any(|c| c.starts_with(&x.masq_tag())), t.iter().any(|c| c.ends_with(&x.spoof_ref())))
        };
        let (one, two, three) =
            (a("ctr1", "eth0", "net"), a("ctr2", "eth1", "net"), a("ctr3", "eth2", "othernet"));
        assert_eq!(has(&f, &two), (true, true), "{fam}");
        let req = request(&conf);
        let t = crate::config::Teardown::from_request(&req).unwrap();
        crate::gc::gc_with(&mut f.clone(), &t, "net", vec![one.clone()]).unwrap();
        assert_eq!(has(&f, &one), (true, true), "{fam}: valid: kept");
        assert_eq!(has(&f, &two), (false, false), "{fam}: not valid: removed");
        assert_eq!(has(&f, &three), (true, true), "{fam}: another network's: kept");
        assert_eq!(f.w.borrow().upstream_masq_gcs, 1, "{fam}");
        assert_eq!(f.calls("ipam_gc"), 1, "{fam}");
        // a valid attachment whose port is gone: its spoof check can never match again
        {
            let mut w = f.w.borrow_mut();
            let c = w.link(Ns::Container, "eth0").unwrap().link.index;
            w.unregister(Ns::Container, c);
        }
        crate::gc::gc_with(&mut f.clone(), &t, "net", vec![one.clone()]).unwrap();
        assert_eq!(has(&f, &one), (true, false), "{fam}: port gone: spoof check removed, masquerading kept");
        // nothing left to collect: nothing committed
        let applies = f.calls("nft_apply");
        crate::gc::gc_with(&mut f.clone(), &t, "net", vec![one.clone()]).unwrap();
        assert_eq!(f.calls("nft_apply"), applies, "{fam}");
    }
}

#[test]
fn ipv6_forwarding_already_on_raises_nothing_and_other_values_are_left_alone() {
    let f = world(FAMILIES[1].1);
    f.w.borrow_mut().sysctls.insert("net/ipv6/conf/all/forwarding".into(), "1".into());
    add(&f, &config(json!({}))).unwrap();
    assert_eq!(
        f.w.borrow().sysctls["net/ipv6/conf/eth0/accept_ra"],
        "1",
        "forwarding was on: nothing raised"
    );
    for (v, after) in [("0", "0"), ("2", "2"), ("1", "2")] {
        let f = world(FAMILIES[2].1);
        f.w.borrow_mut().sysctls.insert("net/ipv6/conf/eth0/accept_ra".into(), v.into());
        add(&f, &config(json!({}))).unwrap();
        let w = f.w.borrow();
        assert_eq!(w.sysctls["net/ipv6/conf/eth0/accept_ra"], after, "{v}");
        assert_eq!(w.sysctls["net/ipv6/conf/default/accept_ra"], "1", "the template is left alone");
        assert_eq!(w.sysctls["net/ipv6/conf/all/forwarding"], "1");
    }
    // IPv4 only: IPv6 forwarding is not touched
    let f = world(FAMILIES[0].1);
    add(&f, &config(json!({}))).unwrap();
    assert_eq!(f.w.borrow().sysctls["net/ipv6/conf/all/forwarding"], "0");
}

#[test]
fn a_wait_that_fails_otherwise_is_not_called_an_error_state() {
    let f = world(FAMILIES[0].1);
    f.fail("wait_oper_up", 0, Fault::Before(libc::EIO));
    let e = add(&f, &config(json!({}))).unwrap_err();
    assert!(!e.msg.contains("error state") && e.msg.contains("wait_oper_up"), "{}", e.msg);
}

/// A bridge of the configured name that is not ours, made by another ADD at the moment this
/// one creates it.
fn concurrent_bridge(w: &mut World) {
    if w.link(Ns::Host, "cni0").is_none() {
        w.links.push(crate::kernel::fake::FakeLink {
            ns: Ns::Host,
            link: cni_common::netlink::Link {
                index: 500,
                name: "cni0".into(),
                kind: Some("bridge".into()),
                mtu: 1500,
                mac: Some([2, 5, 5, 5, 5, 5]),
                ..Default::default()
            },
            port: Default::default(),
            vlans: Vec::new(),
        });
    }
}

#[test]
fn a_bridge_another_add_creates_at_the_same_moment_is_used_and_never_taken_back() {
    for (fam, addrs) in FAMILIES {
        // its creation answers EEXIST: the other's bridge is used (and brought up)
        let f = world(addrs);
        f.before("link_add", concurrent_bridge);
        let r = add(&f, &config(json!({}))).unwrap_or_else(|e| panic!("{fam}: {}", e.msg));
        assert_eq!(r.interfaces[0].mac, "02:05:05:05:05:05", "{fam}");
        assert!(f.w.borrow().link(Ns::Host, "cni0").unwrap().link.flags & 1 != 0, "{fam}: brought up");
        // this ADD fails later: the other's bridge stays
        let f = world(addrs);
        f.before("link_add", concurrent_bridge);
        f.fail("nft_apply", 0, Fault::Before(libc::EIO));
        f.fail("nft_apply", 0, Fault::Before(libc::EIO));
        add(&f, &config(json!({}))).unwrap_err();
        assert!(f.w.borrow().link(Ns::Host, "cni0").is_some(), "{fam}: not ours: kept");
        // its creation is refused for another reason while the other's appears: not ours either
        let f = world(addrs);
        f.before("link_add", concurrent_bridge);
        f.fail("link_add", 0, Fault::Before(libc::EPERM));
        add(&f, &config(json!({}))).unwrap_err();
        assert!(f.w.borrow().link(Ns::Host, "cni0").is_some(), "{fam}: refused, not lost: kept");
    }
}

#[test]
fn routes_of_ipam_two_ways_to_one_destination_and_their_scope() {
    for (fam, addrs) in FAMILIES {
        let mut w = World::new();
        let ips: Vec<Value> = addrs.iter().map(|(a, g)| json!({"address": a, "gateway": g})).collect();
        let mut routes = Vec::new();
        for (a, _) in addrs {
            let v4 = a.contains('.');
            let (dst, g1, g2) = if v4 {
                ("10.9.0.0/16", "10.1.0.2", "10.1.0.3")
            } else {
                ("fd09::/64", "fd00:1::2", "fd00:1::3")
            };
            routes.push(json!({"dst": dst, "gw": g1}));
            routes.push(json!({"dst": dst, "gw": g2}));
            routes.push(json!({"dst": if v4 { "10.8.0.0/16" } else { "fd08::/64" }, "scope": 253}));
            routes.push(
                json!({"dst": if v4 { "10.7.0.0/16" } else { "fd07::/64" }, "table": 100, "mtu": 1400, "priority": 50, "advmss": 1300}),
            );
        }
        w.ipam_answer = Some(Ok(json!({"cniVersion": "1.1.0", "ips": ips, "routes": routes}).to_string()));
        w.attachment = Some(cni_common::attachment::AttachmentId::new("net", "ctr1", "eth0"));
        let f = Fake::new(w);
        let mut conf = config(json!({"isDefaultGateway": false}));
        conf["cniVersion"] = json!("1.1.0");
        let r = add(&f, &conf).unwrap_or_else(|e| panic!("{fam}: {}", e.msg));
        let w = f.w.borrow();
        let ctr_routes: Vec<&cni_common::netlink::Route> =
            w.routes.iter().filter(|(n, _)| *n == Ns::Container).map(|(_, r)| r).collect();
        for (a, _) in addrs {
            let v4 = a.contains('.');
            let dst: ipnet::IpNet = if v4 { "10.9.0.0/16" } else { "fd09::/64" }.parse().unwrap();
            assert_eq!(ctr_routes.iter().filter(|r| r.dst == dst).count(), 2, "{fam}: both paths");
            let scoped: ipnet::IpNet = if v4 { "10.8.0.0/16" } else { "fd08::/64" }.parse().unwrap();
            assert_eq!(ctr_routes.iter().find(|r| r.dst == scoped).map(|r| r.scope), Some(253), "{fam}");
            let tabled: ipnet::IpNet = if v4 { "10.7.0.0/16" } else { "fd07::/64" }.parse().unwrap();
            let t = ctr_routes.iter().find(|r| r.dst == tabled).unwrap();
            assert_eq!(
                (t.table, t.mtu, t.priority, t.advmss),
                (100, Some(1400), Some(50), Some(1300)),
                "{fam}"
            );
        }
        drop(w);
        check(&f, &conf, &r).unwrap();
    }
}

#[test]
fn another_ipv4_address_on_the_bridge_is_in_the_way_another_ipv6_subnet_is_not() {
    for other in ["192.168.5.1/24", "fd00:99::1/64"] {
        let f = world(FAMILIES[2].1);
        {
            let mut w = f.w.borrow_mut();
            w.links.push(crate::kernel::fake::FakeLink {
                ns: Ns::Host,
                link: cni_common::netlink::Link {
                    index: 300,
                    name: "cni0".into(),
                    kind: Some("bridge".into()),
                    flags: 1,
                    mtu: 1500,
                    mac: Some([2, 3, 3, 3, 3, 3]),
                    ..Default::default()
                },
                port: Default::default(),
                vlans: Vec::new(),
            });
            w.addrs.push((
                Ns::Host,
                cni_common::netlink::Address {
                    index: 300,
                    addr: other.parse().unwrap(),
                    broadcast: None,
                    flags: 0,
                    scope: 0,
                },
            ));
        }
        let r = add(&f, &config(json!({})));
        if other.contains('.') {
            assert!(r.unwrap_err().msg.contains("already has an IP address different from 10.1.0.1/24"));
        } else {
            r.unwrap();
            assert!(f.w.borrow().addrs.iter().any(|(_, a)| a.addr.to_string() == other), "kept beside ours");
        }
    }
}

#[test]
fn a_gateway_address_another_add_puts_on_the_bridge_first_is_fine() {
    for (fam, addrs) in FAMILIES {
        let f = world(addrs);
        let gws: Vec<(ipnet::IpNet, usize)> = addrs
            .iter()
            .map(|(a, g)| {
                (
                    ipnet::IpNet::new(g.parse().unwrap(), a.parse::<ipnet::IpNet>().unwrap().prefix_len())
                        .unwrap(),
                    0,
                )
            })
            .collect();
        f.before("addr_add", move |w| {
            let Some(br) = w.link(Ns::Host, "cni0").map(|l| l.link.index) else { return };
            for (g, _) in &gws {
                if !w.addrs.iter().any(|(n, a)| *n == Ns::Host && a.addr == *g) {
                    w.addrs.push((
                        Ns::Host,
                        cni_common::netlink::Address {
                            index: br,
                            addr: *g,
                            broadcast: None,
                            flags: 0,
                            scope: 0,
                        },
                    ));
                }
            }
        });
        let r = add(&f, &config(json!({}))).unwrap_or_else(|e| panic!("{fam}: {}", e.msg));
        check(&f, &config(json!({})), &r).unwrap();
    }
}

#[test]
fn without_is_gateway_the_ipam_gateway_is_not_looked_for_on_the_bridge() {
    for (fam, addrs) in FAMILIES {
        let f = world(addrs);
        let conf = config(json!({"isGateway": false, "isDefaultGateway": false}));
        let r = add(&f, &conf).unwrap();
        let br = f.w.borrow().link(Ns::Host, "cni0").unwrap().link.index;
        assert!(!f.w.borrow().addrs.iter().any(|(n, a)| *n == Ns::Host && a.index == br), "{fam}");
        check(&f, &conf, &r).unwrap_or_else(|e| panic!("{fam}: {}", e.msg));
    }
}

#[test]
fn del_of_an_interface_that_vanishes_meanwhile_is_success_another_failure_is_not() {
    for (fam, addrs) in FAMILIES {
        let conf = config(json!({}));
        let f = world(addrs);
        add(&f, &conf).unwrap();
        f.before("link_del", |w| {
            if let Some(c) = w.link(Ns::Container, "eth0").map(|l| l.link.index) {
                w.unregister(Ns::Container, c);
            }
        });
        del(&f, &conf, true).unwrap_or_else(|e| panic!("{fam}: gone is fine: {}", e.msg));
        let f = world(addrs);
        add(&f, &conf).unwrap();
        f.fail("link_del", 0, Fault::Before(libc::EBUSY));
        let e = del(&f, &conf, true).unwrap_err();
        assert!(e.msg.contains("failed to delete eth0"), "{fam}: {}", e.msg);
        assert!(!f.w.borrow().ipam_reserved, "{fam}: the address is released all the same");
    }
}

#[test]
fn gc_without_nf_tables_fails_only_where_rules_are_configured() {
    for (extra, fails) in [
        (json!({}), true),
        (json!({"ipMasq": false}), false),
        (json!({"ipMasq": false, "macspoofchk": true}), true),
    ] {
        let f = world(FAMILIES[0].1);
        f.w.borrow_mut().no_nftables = true;
        let conf = config(extra.clone());
        let req = request(&conf);
        let t = crate::config::Teardown::from_request(&req).unwrap();
        let r = crate::gc::gc_with(&mut f.clone(), &t, "net", Vec::new());
        assert_eq!(r.is_err(), fails, "{extra}");
        assert_eq!(f.calls("ipam_gc"), 1, "{extra}: IPAM's GC runs all the same");
    }
}

#[test]
fn the_firewall_is_written_for_what_is_configured_and_not_touched_otherwise() {
    for (fam, addrs) in FAMILIES {
        let f = world(addrs);
        add(&f, &config(json!({"ipMasq": false, "macspoofchk": true}))).unwrap();
        assert_eq!(masq_rules(&f), 0, "{fam}");
        assert_eq!(f.w.borrow().rules(NftFamily::Bridge, "nat", "PREROUTING").len(), 1, "{fam}: spoof check");
        let f = world(addrs);
        add(&f, &config(json!({"ipMasq": false}))).unwrap();
        assert_eq!(f.calls("nft_read") + f.calls("nft_apply"), 0, "{fam}: no nf_tables at all");
    }
}

#[test]
fn a_host_veth_name_taken_meanwhile_is_tried_again_and_a_taken_ifname_is_not() {
    let f = world(FAMILIES[0].1);
    f.fail("link_add", 1, Fault::Before(libc::EEXIST));
    add(&f, &config(json!({}))).unwrap();
    assert_eq!(f.calls("link_add"), 3, "bridge, the refused pair, the pair under another name");
    let f = world(FAMILIES[0].1);
    f.before("link_add", |w| {
        if w.link(Ns::Host, "cni0").is_some() && w.link(Ns::Container, "eth0").is_none() {
            w.links.push(crate::kernel::fake::FakeLink {
                ns: Ns::Container,
                link: cni_common::netlink::Link { index: 700, name: "eth0".into(), ..Default::default() },
                port: Default::default(),
                vlans: Vec::new(),
            });
        }
    });
    let e = add(&f, &config(json!({}))).unwrap_err();
    assert!(e.msg.contains("container veth name provided (eth0) already exists"), "{}", e.msg);
}

#[test]
fn the_vlan_gateways_name_may_have_15_bytes_not_16() {
    for (bridge, ok) in [("br0123456789", true), ("br01234567890", false)] {
        let f = world(FAMILIES[0].1);
        let r = add(&f, &config(json!({"bridge": bridge, "vlan": 10})));
        assert_eq!(r.is_ok(), ok, "{bridge}.10: {r:?}");
    }
}

#[test]
fn an_ipv6_address_inside_the_gateways_subnet_is_in_the_way_too() {
    let f = world(FAMILIES[1].1);
    {
        let mut w = f.w.borrow_mut();
        w.links.push(crate::kernel::fake::FakeLink {
            ns: Ns::Host,
            link: cni_common::netlink::Link {
                index: 301,
                name: "cni0".into(),
                kind: Some("bridge".into()),
                flags: 1,
                mtu: 1500,
                mac: Some([2, 3, 3, 3, 3, 3]),
                ..Default::default()
            },
            port: Default::default(),
            vlans: Vec::new(),
        });
        // fd00:1::1:99/112 does not contain the gateway fd00:1::1, the gateway's /64 contains it
        w.addrs.push((
            Ns::Host,
            cni_common::netlink::Address {
                index: 301,
                addr: "fd00:1::1:99/112".parse().unwrap(),
                broadcast: None,
                flags: 0,
                scope: 0,
            },
        ));
    }
    let e = add(&f, &config(json!({}))).unwrap_err();
    assert!(e.msg.contains("already has an IP address different from fd00:1::1/64"), "{}", e.msg);
}

#[test]
fn check_wants_the_containers_own_peer_on_the_bridge() {
    for (fam, addrs) in FAMILIES {
        let conf = config(json!({}));
        // prevResult names another attachment's host veth: not this container's peer
        let f = world(addrs);
        let first = add(&f, &conf).unwrap();
        let req = request_for(&conf, "ctr2", "eth1");
        let second = add_with(&mut f.clone(), &req, Conf::from_request(&req).unwrap()).unwrap();
        let mut swapped = first.clone();
        swapped.interfaces[1] = second.interfaces[1].clone();
        assert!(check(&f, &conf, &swapped).unwrap_err().msg.contains("was not found"), "{fam}");
        // the peer is ours but on another bridge
        {
            let mut w = f.w.borrow_mut();
            let i = w.links.iter().position(|l| l.link.name == first.interfaces[1].name).unwrap();
            w.links[i].link.master = Some(9999);
        }
        assert!(check(&f, &conf, &first).unwrap_err().msg.contains("was not found"), "{fam}");
    }
}

#[test]
fn check_looks_at_addresses_also_when_there_are_no_routes() {
    for (fam, addrs) in FAMILIES {
        let f = world(addrs);
        let conf = config(json!({"isDefaultGateway": false}));
        let r = add(&f, &conf).unwrap();
        assert!(r.routes.is_empty(), "{fam}");
        check(&f, &conf, &r).unwrap();
        f.w.borrow_mut().addrs.retain(|(n, _)| *n != Ns::Container);
        assert!(check(&f, &conf, &r).unwrap_err().msg.contains("Failed to match addr"), "{fam}");
    }
}

#[test]
fn an_existing_bridges_mac_is_read_again_before_the_result() {
    // a bridge that is there, without our MAC pinned: the kernel moves its MAC as ports join
    let f = world(FAMILIES[0].1);
    f.w.borrow_mut().links.push(crate::kernel::fake::FakeLink {
        ns: Ns::Host,
        link: cni_common::netlink::Link {
            index: 400,
            name: "cni0".into(),
            kind: Some("bridge".into()),
            flags: 1,
            mtu: 1500,
            mac: Some([2, 4, 4, 4, 4, 4]),
            ..Default::default()
        },
        port: Default::default(),
        vlans: Vec::new(),
    });
    f.before("wait_oper_up", |w| {
        let i = w.links.iter().position(|l| l.link.name == "cni0").unwrap();
        w.links[i].link.mac = Some([2, 4, 4, 4, 4, 0]);
    });
    let r = add(&f, &config(json!({"isGateway": false, "isDefaultGateway": false}))).unwrap();
    assert_eq!(r.interfaces[0].mac, "02:04:04:04:04:00");
}

#[test]
fn a_bridge_refused_as_unsupported_without_vlans_is_not_a_vlan_error() {
    let f = world(FAMILIES[0].1);
    f.fail("link_add", 0, Fault::Before(libc::EOPNOTSUPP));
    let e = add(&f, &config(json!({}))).unwrap_err();
    assert!(e.msg.contains("failed to create bridge") && !e.msg.contains("VLAN"), "{}", e.msg);
}

#[test]
fn check_compares_the_host_veths_mac_with_prev_result() {
    for (fam, addrs) in FAMILIES {
        let f = world(addrs);
        let conf = config(json!({}));
        let mut r = add(&f, &conf).unwrap();
        r.interfaces[1].mac = "02:99:99:99:99:99".into();
        assert!(check(&f, &conf, &r).unwrap_err().msg.contains("Mac doesn't match"), "{fam}");
        r.interfaces[1].mac = String::new();
        check(&f, &conf, &r)
            .unwrap_or_else(|e| panic!("{fam}: no MAC recorded: nothing to compare: {}", e.msg));
    }
}

#[test]
fn the_vlan_gateways_port_is_up_with_the_configured_mtu() {
    let f = world(FAMILIES[2].1);
    add(&f, &config(json!({"vlan": 100, "mtu": 1400}))).unwrap();
    let w = f.w.borrow();
    let gw = w.link(Ns::Host, "cni0.100").unwrap();
    let port = w.links.iter().find(|l| l.link.link == Some(gw.link.index)).unwrap();
    assert_eq!((port.link.mtu, port.link.flags & 1), (1400, 1), "its bridge end");
}

#[test]
fn check_finds_the_bridge_in_prev_result_wherever_it_is_listed() {
    let f = world(FAMILIES[2].1);
    let conf = config(json!({}));
    let mut r = add(&f, &conf).unwrap();
    // the container's interface first: the bridge is found by name and empty sandbox
    r.interfaces.swap(0, 2);
    for ip in r.ips.iter_mut() {
        ip.interface = Some(0);
    }
    check(&f, &conf, &r).unwrap();
}

/// A bridge of this name that is there already, made by someone else without a MAC of its own
/// (the kernel's `addr_assign_type` not 3), with the MAC `mac`.
fn floating_bridge(f: &Fake, mac: [u8; 6]) -> u32 {
    let mut w = f.w.borrow_mut();
    let index = 400;
    w.links.push(crate::kernel::fake::FakeLink {
        ns: Ns::Host,
        link: cni_common::netlink::Link {
            index,
            name: "cni0".into(),
            kind: Some("bridge".into()),
            flags: 1,
            mtu: 1500,
            mac: Some(mac),
            ..Default::default()
        },
        port: Default::default(),
        vlans: Vec::new(),
    });
    index
}

fn bridge_mac(f: &Fake) -> [u8; 6] {
    f.w.borrow().link(Ns::Host, "cni0").unwrap().link.mac.unwrap()
}

#[test]
fn with_is_gateway_a_floating_bridge_gets_its_mac_pinned_once() {
    for (fam, addrs) in FAMILIES {
        let f = world(addrs);
        let br = floating_bridge(&f, [2, 7, 7, 7, 7, 7]);
        let conf = config(json!({}));
        let r = add(&f, &conf).unwrap();
        assert!(f.w.borrow().mac_set.contains(&br), "{fam}: pinned");
        assert_eq!(
            bridge_mac(&f),
            [2, 7, 7, 7, 7, 7],
            "{fam}: to the MAC it had, before the pod's port joined"
        );
        assert_eq!(r.interfaces[0].mac, "02:07:07:07:07:07", "{fam}");
        assert_eq!(f.calls("link_set_mac"), 1, "{fam}");
        check(&f, &conf, &r).unwrap();
        // the next pod finds it pinned: no MAC set again (that would flush its neighbours)
        {
            let mut w = f.w.borrow_mut();
            let ctr = w.link(Ns::Container, "eth0").unwrap().link.index;
            w.unregister(Ns::Container, ctr); // (the fake has one container: the next pod reuses it)
            w.calls.clear();
        }
        add(&f, &conf).unwrap();
        assert_eq!(bridge_mac(&f), [2, 7, 7, 7, 7, 7], "{fam}");
        assert_eq!(f.calls("link_set_mac"), 0, "{fam}: {:?}", f.w.borrow().calls);
    }
}

#[test]
fn a_bridge_that_lost_its_last_port_gets_a_random_mac_not_the_zero_one() {
    for (fam, addrs) in FAMILIES {
        let f = world(addrs);
        floating_bridge(&f, [0; 6]);
        let r = add(&f, &config(json!({}))).unwrap();
        let mac = bridge_mac(&f);
        assert_ne!(mac, [0; 6], "{fam}");
        assert_eq!(mac[0] & 0x03, 0x02, "{fam}: unicast, locally administered: {mac:02x?}");
        assert_eq!(r.interfaces[0].mac, cni_common::mac::Mac(mac).to_string(), "{fam}");
        // and it stays when the pod's port leaves again
        let hv = host_veth(&f).link.index;
        f.w.borrow_mut().unregister(Ns::Host, hv);
        assert_eq!(bridge_mac(&f), mac, "{fam}");
    }
}

#[test]
fn a_failed_add_leaves_a_floating_bridge_pinned_not_zeroed() {
    // v1.10's case (plugins#1265): the first ADD on a bridge fails after its port joined; the
    // port goes, and a bridge that followed it would be left with the zero MAC
    let f = world(FAMILIES[0].1);
    floating_bridge(&f, [2, 7, 7, 7, 7, 7]);
    f.fail("wait_oper_up", 0, Fault::Before(libc::ETIMEDOUT));
    add(&f, &config(json!({}))).unwrap_err();
    assert!(!f.w.borrow().links.iter().any(|l| l.link.master.is_some()), "undone: no port left");
    assert_eq!(bridge_mac(&f), [2, 7, 7, 7, 7, 7]);
}

#[test]
fn without_is_gateway_a_floating_bridge_is_left_to_the_kernel_as_v1_10_does() {
    let f = world(FAMILIES[0].1);
    let br = floating_bridge(&f, [2, 7, 7, 7, 7, 7]);
    let conf = config(json!({"isGateway": false, "isDefaultGateway": false, "ipMasq": false}));
    let r = add(&f, &conf).unwrap();
    assert_eq!(f.calls("link_set_mac"), 0);
    assert!(!f.w.borrow().mac_set.contains(&br));
    // it took the lowest port MAC, as the kernel does, and the result says so
    assert_eq!(r.interfaces[0].mac, cni_common::mac::Mac(bridge_mac(&f)).to_string());
    check(&f, &conf, &r).unwrap();
}

#[test]
fn check_reports_a_floating_mac_only_when_add_would_have_pinned_it() {
    for (fam, addrs) in FAMILIES {
        let f = world(addrs);
        let conf = config(json!({}));
        let r = add(&f, &conf).unwrap();
        let br = f.w.borrow().link(Ns::Host, "cni0").unwrap().link.index;
        // someone re-creates the situation: the bridge follows its ports again
        f.w.borrow_mut().mac_set.remove(&br);
        let e = check(&f, &conf, &r).unwrap_err();
        assert!(e.msg.contains("has no MAC of its own"), "{fam}: {}", e.msg);
        // what cannot be read is not reported
        f.w.borrow_mut().mac_assign_unreadable = true;
        check(&f, &conf, &r).unwrap();
    }
}

#[test]
fn where_the_mac_state_cannot_be_read_add_pins_as_v1_10_does() {
    let f = world(FAMILIES[0].1);
    floating_bridge(&f, [2, 7, 7, 7, 7, 7]);
    f.w.borrow_mut().mac_assign_unreadable = true;
    add(&f, &config(json!({}))).unwrap();
    assert_eq!(f.calls("link_set_mac"), 1);
    assert_eq!(bridge_mac(&f), [2, 7, 7, 7, 7, 7]);
}

/// One pod on several networks (issue 39 item 3): network "net" has the pod's eth0; a runtime
/// sends DEL for (ctr1, eth0) on network "other" — an attachment that never was (its ADD was
/// refused: eth0 exists), which a Multus-style caller cleans up after. Upstream's DEL deleted
/// eth0 and net's spoof check (keyed by `<containerID>-<ifname>` alone); ours tells from the
/// host end's alias that the interface is net's and leaves both. net's own DEL takes them.
#[test]
fn del_of_another_network_leaves_the_interface_and_spoof_check_of_this_one() {
    use crate::firewall::{SPOOF_BASE_CHAIN, SPOOF_TABLE};
    let jumps = |f: &Fake| f.w.borrow().rules(NftFamily::Bridge, SPOOF_TABLE, SPOOF_BASE_CHAIN).len();
    for (fam, addrs) in FAMILIES {
        let f = world(addrs);
        let conf = config(json!({"macspoofchk": true}));
        add(&f, &conf).unwrap();
        let ours = jumps(&f);
        assert!(ours > 0, "{fam}");
        let mut other = conf.clone();
        other["name"] = json!("other");
        other["bridge"] = json!("cni9");
        del(&f, &other, true).unwrap_or_else(|e| panic!("{fam}: {}", e.msg));
        assert!(f.w.borrow().link(Ns::Container, "eth0").is_some(), "{fam}: net's eth0 stays");
        assert_eq!(jumps(&f), ours, "{fam}: and its spoof check");
        del(&f, &conf, true).unwrap();
        assert!(f.w.borrow().link(Ns::Container, "eth0").is_none(), "{fam}: net's DEL takes it");
        assert_eq!(jumps(&f), 0, "{fam}");
    }
}

/// The same without an alias (no macspoofchk on either network): the host end is a port of
/// cni0, the DEL names another existing bridge, so eth0 is not its own. A DEL naming a bridge
/// that does not exist cannot tell, and deletes it as upstream (an interrupted ADD's half-made
/// attachment must go).
#[test]
fn del_naming_another_bridge_leaves_a_port_of_this_one_and_cannot_tell_without_it() {
    for (fam, addrs) in FAMILIES {
        let f = world(addrs);
        let conf = config(json!({}));
        add(&f, &conf).unwrap();
        let mut other = conf.clone();
        other["name"] = json!("other");
        // a host link other than cni0 (the fake's host eth0 stands for another bridge)
        other["bridge"] = json!("eth0");
        del(&f, &other, true).unwrap_or_else(|e| panic!("{fam}: {}", e.msg));
        assert!(f.w.borrow().link(Ns::Container, "eth0").is_some(), "{fam}: cni0's port stays");
        other["bridge"] = json!("cni9");
        del(&f, &other, true).unwrap();
        assert!(f.w.borrow().link(Ns::Container, "eth0").is_none(), "{fam}: no bridge to compare: deleted");
    }
}
