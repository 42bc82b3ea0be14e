//! Second variants (issue 28): the boundaries of a port on both ends, the other family's
//! host IPs, and dual stack listed IPv6 first, beside the tests of config.rs.

use super::*;
use cni_common::spec::json;
use cni_common::spec::result::{Interface, IpConfig};
use serde_json::json;

fn conf(v: serde_json::Value) -> Result<Conf> {
    let raw: PortMapConf = json::from_value(v).map_err(CniError::decode)?;
    Conf::from_raw(&raw)
}

fn one(host: i64, ctr: i64) -> Result<Conf> {
    conf(
        json!({"runtimeConfig": {"portMappings": [{"hostPort": host, "containerPort": ctr, "protocol": "tcp"}]}}),
    )
}

fn intent_of(c: &Conf, addrs: &[&str]) -> Result<(Intent, Vec<String>)> {
    let sandbox = Interface { name: "eth0".into(), sandbox: "/run/netns/x".into(), ..Default::default() };
    let prev = CniResult {
        interfaces: vec![sandbox],
        ips: addrs
            .iter()
            .map(|a| IpConfig { interface: Some(0), address: a.parse().unwrap(), gateway: None })
            .collect(),
        ..Default::default()
    };
    Intent::new(c, &prev, "eth0", Owner::new("n", "c", "eth0"), None)
}

#[test]
fn ports_at_both_ends_of_the_range_are_taken_on_both_sides() {
    for (host, ctr) in [(1, 1), (65535, 65535), (1, 65535), (65535, 1)] {
        let c = one(host, ctr).unwrap_or_else(|e| panic!("{host}->{ctr}: {}", e.msg));
        assert_eq!((c.mappings[0].host_port, c.mappings[0].container_port), (host as u16, ctr as u16));
    }
    for (host, ctr) in [(0, 80), (80, 0), (65536, 80), (80, 65536), (-1, 80)] {
        let e = one(host, ctr).unwrap_err();
        assert_eq!(e.code, 7, "{host}->{ctr}: {}", e.msg);
        assert!(e.msg.contains("between 1 and 65535"), "{}", e.msg);
    }
}

#[test]
fn a_host_ip_of_one_family_maps_only_that_family_either_way_round() {
    let c = conf(json!({"runtimeConfig": {"portMappings": [
        {"hostPort": 9000, "containerPort": 90, "protocol": "tcp", "hostIP": "::"},
        {"hostPort": 9001, "containerPort": 91, "protocol": "tcp", "hostIP": "0.0.0.0"},
        {"hostPort": 9002, "containerPort": 92, "protocol": "udp", "hostIP": "2001:db8::1"},
        {"hostPort": 9003, "containerPort": 93, "protocol": "udp", "hostIP": "192.0.2.1"}
    ]}}))
    .unwrap();
    let fams =
        |i: &Intent| -> Vec<(u16, Family)> { i.entries.iter().map(|e| (e.host.port, e.host.fam)).collect() };
    let want = vec![(9000, Family::V6), (9001, Family::V4), (9002, Family::V6), (9003, Family::V4)];
    // Dual stack, listed either way round: the same entries, each of its host IP's family.
    let (v4_first, notes) = intent_of(&c, &["10.0.0.5/24", "fd00::5/64"]).unwrap();
    assert!(notes.is_empty(), "{notes:?}");
    let (v6_first, _) = intent_of(&c, &["fd00::5/64", "10.0.0.5/24"]).unwrap();
    assert_eq!(fams(&v4_first), want);
    assert_eq!(fams(&v6_first), want);
    assert_eq!(v4_first.fingerprint(), v6_first.fingerprint());
    // One family alone: only its own mappings, a note for each of the other's.
    let (v4, notes) = intent_of(&c, &["10.0.0.5/24"]).unwrap();
    assert_eq!(fams(&v4), vec![(9001, Family::V4), (9003, Family::V4)]);
    assert_eq!(notes.len(), 2, "{notes:?}");
    let (v6, notes) = intent_of(&c, &["fd00::5/64"]).unwrap();
    assert_eq!(fams(&v6), vec![(9000, Family::V6), (9002, Family::V6)]);
    assert_eq!(notes.len(), 2, "{notes:?}");
}
