//! The second variant of behaviours whose first variant is tested beside the code (issue 28):
//! the other address family, dual stack listed IPv6 first, the other shape of the same input.

use cni_common::net::container_addrs;
use cni_common::spec::result::{CniResult, Interface, IpConfig};
use ipnet::IpNet;

fn net(a: &str) -> IpNet {
    a.parse().unwrap()
}

fn prev_of(addrs: &[&str]) -> CniResult {
    CniResult {
        interfaces: vec![Interface { name: "eth0".into(), sandbox: "/run/netns/x".into(), ..Default::default() }],
        ips: addrs
            .iter()
            .map(|a| IpConfig { interface: Some(0), address: net(a), gateway: None })
            .collect(),
        ..Default::default()
    }
}

#[test]
fn container_addresses_listed_ipv6_first_are_found_as_ipv4_first() {
    let v4_first = prev_of(&["10.0.0.5/24", "fd00::5/64"]);
    let v6_first = prev_of(&["fd00::5/64", "10.0.0.5/24"]);
    let want = (Some(net("10.0.0.5/24")), Some(net("fd00::5/64")));
    assert_eq!(container_addrs(&v4_first, "eth0").unwrap(), want);
    assert_eq!(container_addrs(&v6_first, "eth0").unwrap(), want);
    // Two of each, IPv6 first: the first of each family, whatever the other family's place.
    let mixed = prev_of(&["fd00::5/64", "fd00::6/64", "10.0.0.5/24", "10.0.0.6/24"]);
    assert_eq!(container_addrs(&mixed, "eth0").unwrap(), want);
    // One family alone, either one.
    assert_eq!(container_addrs(&prev_of(&["fd00::5/64"]), "eth0").unwrap(), (None, Some(net("fd00::5/64"))));
    assert_eq!(container_addrs(&prev_of(&["10.0.0.5/24"]), "eth0").unwrap(), (Some(net("10.0.0.5/24")), None));
}
