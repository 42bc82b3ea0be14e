//! Golden tests: one canonical result encoded for all seven versions, prevResults of every
//! version decoded, and every conversion rule.

use cni_common::spec::result::{pretty, CniResult, Dns, Interface, IpConfig, Route};
use cni_common::Version;
use serde_json::{json, Value};

fn canonical() -> CniResult {
    CniResult {
        interfaces: vec![
            Interface { name: "cni0".into(), mac: "0a:58:0a:01:00:01".into(), ..Default::default() },
            Interface { name: "veth1234abcd".into(), mac: "aa:aa:aa:aa:aa:01".into(), ..Default::default() },
            Interface {
                name: "eth0".into(),
                mac: "aa:aa:aa:aa:aa:02".into(),
                mtu: Some(1400),
                sandbox: "/run/netns/c1".into(),
                socket_path: "/run/vhost.sock".into(),
                pci_id: "0000:00:1f.6".into(),
            },
        ],
        ips: vec![
            IpConfig {
                interface: Some(2),
                address: "10.1.0.5/24".parse().unwrap(),
                gateway: Some("10.1.0.1".parse().unwrap()),
            },
            IpConfig { interface: Some(2), address: "10.1.1.5/24".parse().unwrap(), gateway: None },
            IpConfig {
                interface: Some(2),
                address: "fd00::5/64".parse().unwrap(),
                gateway: Some("fd00::1".parse().unwrap()),
            },
        ],
        routes: vec![
            Route {
                dst: "0.0.0.0/0".parse().unwrap(),
                gw: Some("10.1.0.1".parse().unwrap()),
                mtu: Some(1400),
                advmss: Some(1360),
                priority: Some(10),
                table: Some(100),
                scope: Some(0),
            },
            Route::new("::/0".parse().unwrap(), None),
            Route::new("192.168.0.0/16".parse().unwrap(), Some("10.1.0.254".parse().unwrap())),
        ],
        dns: Dns {
            nameservers: vec!["10.1.0.10".into()],
            domain: "cluster.local".into(),
            search: vec!["svc.cluster.local".into()],
            options: vec!["ndots:5".into()],
        },
    }
}

fn dns_json() -> Value {
    json!({"nameservers": ["10.1.0.10"], "domain": "cluster.local", "search": ["svc.cluster.local"], "options": ["ndots:5"]})
}

fn legacy(version: &str) -> Value {
    json!({
        "cniVersion": version,
        "ip4": {
            "ip": "10.1.0.5/24", "gateway": "10.1.0.1",
            "routes": [{"dst": "0.0.0.0/0", "gw": "10.1.0.1"}, {"dst": "192.168.0.0/16", "gw": "10.1.0.254"}]
        },
        "ip6": {"ip": "fd00::5/64", "gateway": "fd00::1", "routes": [{"dst": "::/0"}]},
        "dns": dns_json()
    })
}

fn rich(version: &str, with_ip_version: bool, v11: bool) -> Value {
    let ipv = |v: &str, mut o: Value| {
        if with_ip_version {
            let mut m = serde_json::Map::new();
            m.insert("version".into(), v.into());
            m.extend(o.as_object_mut().unwrap().clone());
            Value::Object(m)
        } else {
            o
        }
    };
    let eth0 = if v11 {
        json!({"name": "eth0", "mac": "aa:aa:aa:aa:aa:02", "mtu": 1400, "sandbox": "/run/netns/c1",
               "socketPath": "/run/vhost.sock", "pciID": "0000:00:1f.6"})
    } else {
        json!({"name": "eth0", "mac": "aa:aa:aa:aa:aa:02", "sandbox": "/run/netns/c1"})
    };
    let default_route = if v11 {
        json!({"dst": "0.0.0.0/0", "gw": "10.1.0.1", "mtu": 1400, "advmss": 1360, "priority": 10, "table": 100, "scope": 0})
    } else {
        json!({"dst": "0.0.0.0/0", "gw": "10.1.0.1"})
    };
    json!({
        "cniVersion": version,
        "interfaces": [
            {"name": "cni0", "mac": "0a:58:0a:01:00:01"},
            {"name": "veth1234abcd", "mac": "aa:aa:aa:aa:aa:01"},
            eth0
        ],
        "ips": [
            ipv("4", json!({"interface": 2, "address": "10.1.0.5/24", "gateway": "10.1.0.1"})),
            ipv("4", json!({"interface": 2, "address": "10.1.1.5/24"})),
            ipv("6", json!({"interface": 2, "address": "fd00::5/64", "gateway": "fd00::1"}))
        ],
        "routes": [default_route, {"dst": "::/0"}, {"dst": "192.168.0.0/16", "gw": "10.1.0.254"}],
        "dns": dns_json()
    })
}

fn expected(v: Version) -> Value {
    match v {
        Version::V0_1_0 | Version::V0_2_0 => legacy(v.as_str()),
        Version::V0_3_0 | Version::V0_3_1 | Version::V0_4_0 => rich(v.as_str(), true, false),
        Version::V1_0_0 => rich(v.as_str(), false, false),
        Version::V1_1_0 => rich(v.as_str(), false, true),
    }
}

#[test]
fn canonical_result_encodes_exactly_for_every_version() {
    let r = canonical();
    for v in Version::ALL {
        let got = r.encode(v).unwrap();
        assert_eq!(got, expected(v), "version {v}");
        // key order is part of the format: cniVersion first, then Go's struct order
        let text = got.to_string();
        assert!(text.starts_with(&format!("{{\"cniVersion\":\"{v}\"")), "{text}");
    }
}

#[test]
fn pretty_output_is_go_style_and_key_ordered() {
    let r = CniResult {
        ips: vec![IpConfig { interface: Some(0), address: "127.0.0.1/8".parse().unwrap(), gateway: None }],
        interfaces: vec![Interface {
            name: "lo".into(),
            mac: "00:00:00:00:00:00".into(),
            sandbox: "/n".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let text = r.to_pretty(Version::V1_0_0).unwrap();
    assert_eq!(
        text,
        "{\n    \"cniVersion\": \"1.0.0\",\n    \"interfaces\": [\n        {\n            \"name\": \"lo\",\n            \"mac\": \"00:00:00:00:00:00\",\n            \"sandbox\": \"/n\"\n        }\n    ],\n    \"ips\": [\n        {\n            \"interface\": 0,\n            \"address\": \"127.0.0.1/8\"\n        }\n    ],\n    \"dns\": {}\n}"
    );
}

#[test]
fn empty_dns_is_printed_up_to_1_0_0_and_omitted_at_1_1_0() {
    let r = CniResult {
        ips: vec![IpConfig { interface: None, address: "10.0.0.2/24".parse().unwrap(), gateway: None }],
        ..Default::default()
    };
    for v in Version::ALL {
        let got = r.encode(v).unwrap();
        assert_eq!(got.get("dns").is_some(), v < Version::V1_1_0, "{v}: {got}");
        if v < Version::V1_1_0 {
            assert_eq!(got["dns"], json!({}));
            assert!(pretty(&got).ends_with("\n    \"dns\": {}\n}"), "{v}: the last key, Go's text");
        }
    }
}

/// What Debian's containernetworking-plugins 1.1.1 printed for ADD, every plugin and every
/// version it speaks (captured by `tests/data/capture-upstream-results.sh`): decoded and
/// encoded again in the same version, ours is the same text byte for byte, `"dns": {}` included.
/// The one deliberate difference is upstream loopback below 1.0.0, which prints its 1.0.0
/// document under the config's version label (no `ip4`/`ip6` at 0.1.0/0.2.0, no
/// `ips[].version` at 0.3.x/0.4.0); ours encodes those versions by the spec, `"dns": {}` too.
#[test]
fn upstream_1_1_1_output_is_reproduced_for_every_plugin_and_version() {
    let text = include_str!("data/upstream-1.1.1-results.json");
    let captured: serde_json::Map<String, Value> = serde_json::from_str(text).unwrap();
    let mut seen = Vec::new();
    for (key, out) in &captured {
        let (plugin, version) = key.split_once(' ').unwrap();
        let v = Version::from_str_exact(version).unwrap();
        let out = out.as_str().unwrap();
        let doc: Value = serde_json::from_str(out).unwrap();
        if plugin == "loopback" && v < Version::V1_0_0 {
            let mut as_100 = doc.clone();
            as_100["cniVersion"] = json!("1.0.0");
            let r = CniResult::decode(&as_100, Version::V1_0_0).unwrap();
            let relabelled = pretty(&r.encode(Version::V1_0_0).unwrap()).replacen(
                "\"1.0.0\"",
                &format!("\"{version}\""),
                1,
            );
            assert_eq!(relabelled, out, "{key}: upstream prints its 1.0.0 document");
            let ours = r.encode(v).unwrap();
            assert_ne!(ours, doc, "{key}");
            assert_eq!(ours["dns"], json!({}), "{key}");
            seen.push(key.clone());
            continue;
        }
        let r = CniResult::decode(&doc, v).unwrap();
        assert_eq!(r.to_pretty(v).unwrap(), out, "{key}");
        seen.push(key.clone());
    }
    // every plugin at every version upstream 1.1.1 speaks (bandwidth: 0.3.0 and later)
    assert_eq!(seen.len(), 4 * 6 + 4, "{seen:?}");
}

#[test]
fn interface_index_zero_is_kept_and_absent_is_omitted() {
    let mut r = CniResult::default();
    r.ips.push(IpConfig { interface: Some(0), address: "10.0.0.2/24".parse().unwrap(), gateway: None });
    r.ips.push(IpConfig { interface: None, address: "10.0.1.2/24".parse().unwrap(), gateway: None });
    let got = r.encode(Version::V1_1_0).unwrap();
    assert_eq!(got["ips"][0]["interface"], 0);
    assert!(got["ips"][1].get("interface").is_none());
}

#[test]
fn every_version_decodes_to_the_canonical_model() {
    let full = canonical();
    for v in Version::ALL {
        let decoded = CniResult::decode(&expected(v), Version::V1_1_0).unwrap();
        match v {
            Version::V1_1_0 => assert_eq!(decoded, full, "lossless at 1.1.0"),
            Version::V0_1_0 | Version::V0_2_0 => {
                // up-conversion: ip4/ip6 become ips without interface, routes flattened
                assert!(decoded.interfaces.is_empty());
                assert_eq!(decoded.ips.len(), 2);
                assert_eq!(decoded.ips[0].address.to_string(), "10.1.0.5/24");
                assert_eq!(decoded.ips[0].interface, None);
                assert_eq!(decoded.ips[1].address.to_string(), "fd00::5/64");
                let dsts: Vec<String> = decoded.routes.iter().map(|r| r.dst.to_string()).collect();
                assert_eq!(dsts, ["0.0.0.0/0", "192.168.0.0/16", "::/0"]);
                assert_eq!(decoded.dns, full.dns);
                // and up-encoding to 0.4.0 re-derives the version field
                let up = decoded.encode(Version::V0_4_0).unwrap();
                assert_eq!(up["ips"][1]["version"], "6");
                assert!(up.get("interfaces").is_none());
            }
            _ => {
                // 0.3.x … 1.0.0 lose only the 1.1 fields
                assert_eq!(decoded.ips, full.ips, "{v}");
                assert_eq!(decoded.interfaces[2].mtu, None);
                assert_eq!(decoded.routes[0].table, None);
                assert_eq!(decoded.routes[1], full.routes[1]);
            }
        }
    }
}

#[test]
fn missing_prev_result_version_means_config_version() {
    let doc = json!({"ip4": {"ip": "10.0.0.2/24"}});
    let r = CniResult::decode(&doc, Version::V0_2_0).unwrap();
    assert_eq!(r.ips[0].address.to_string(), "10.0.0.2/24");
    // the same document read as a 1.0.0 result has no ips at all
    let r = CniResult::decode(&doc, Version::V1_0_0).unwrap();
    assert!(r.ips.is_empty());
}

#[test]
fn down_conversion_keeps_first_ip_per_family_and_family_routes() {
    let mut r = canonical();
    // v6 route with a gateway must land in ip6, the v4 ones in ip4
    r.routes.push(Route::new("fd01::/64".parse().unwrap(), Some("fd00::1".parse().unwrap())));
    let got = r.encode(Version::V0_2_0).unwrap();
    assert_eq!(got["ip4"]["ip"], "10.1.0.5/24", "first v4 only, the second is dropped");
    assert_eq!(got["ip6"]["routes"], json!([{"dst": "::/0"}, {"dst": "fd01::/64", "gw": "fd00::1"}]));
    assert_eq!(
        got["ip4"]["routes"][0],
        json!({"dst": "0.0.0.0/0", "gw": "10.1.0.1"}),
        "1.1 route fields dropped"
    );
}

#[test]
fn down_conversion_with_one_family_omits_the_other() {
    let r = CniResult {
        ips: vec![IpConfig { interface: Some(0), address: "fd00::9/64".parse().unwrap(), gateway: None }],
        routes: vec![Route::new("0.0.0.0/0".parse().unwrap(), None)],
        ..Default::default()
    };
    let got = r.encode(Version::V0_1_0).unwrap();
    assert!(got.get("ip4").is_none(), "no v4 address: the v4 route is dropped with it");
    assert_eq!(got["ip6"], json!({"ip": "fd00::9/64"}));
}

#[test]
fn down_conversion_without_ips_fails_clearly() {
    let r = CniResult {
        interfaces: vec![Interface { name: "eth0".into(), sandbox: "/n".into(), ..Default::default() }],
        ..Default::default()
    };
    for v in [Version::V0_1_0, Version::V0_2_0] {
        let e = r.encode(v).unwrap_err();
        assert_eq!(e.code, 1);
        assert!(e.msg.contains("no valid IP addresses"), "{}", e.msg);
    }
    // rich versions are fine without IPs (L2-only results)
    for v in &Version::ALL[2..] {
        assert!(r.encode(*v).is_ok());
    }
}

#[test]
fn decode_rejects_bad_documents_with_codes() {
    let cases = [
        (json!([]), 6),
        (json!({"cniVersion": "9.9.9", "ips": []}), 1),
        (json!({"cniVersion": 1}), 6),
        (json!({"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.300/24"}]}), 6),
        (json!({"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.3/24", "interface": -1}]}), 6),
        (json!({"cniVersion": "0.2.0", "ip4": {"ip": "nonsense"}}), 6),
        (json!({"cniVersion": "1.1.0", "routes": [{"gw": "10.0.0.1"}]}), 6),
    ];
    for (doc, code) in cases {
        let e = CniResult::decode(&doc, Version::V1_0_0).unwrap_err();
        assert_eq!(e.code, code, "{doc}: {e}");
    }
}

#[test]
fn decode_is_case_insensitive_and_ignores_unknown_keys() {
    let doc =
        json!({"CNIVersion": "1.0.0", "IPs": [{"Address": "10.0.0.3/24", "extra": 1}], "vendor": {"x": 1}});
    let r = CniResult::decode(&doc, Version::V1_0_0).unwrap();
    assert_eq!(r.ips[0].address.to_string(), "10.0.0.3/24");
}

#[test]
fn same_version_roundtrip_is_identity_for_rich_versions() {
    for v in &Version::ALL[2..] {
        let doc = expected(*v);
        let again = CniResult::decode(&doc, *v).unwrap().encode(*v).unwrap();
        assert_eq!(again, doc, "{v}");
        assert_eq!(pretty(&again), pretty(&doc));
    }
}

/// Go writes 0 for an unset route mtu/advmss/priority, and an empty string for an unset
/// gateway: both read as unset, keys match case-insensitively, `null` is unset.
#[test]
fn route_zero_values_read_as_unset() {
    let v = json!({"cniVersion": "1.1.0", "routes": [
        {"dst": "10.0.0.0/8", "gw": "", "mtu": 0, "advmss": null, "Priority": 7, "table": 0, "scope": 0}
    ]});
    let r = CniResult::decode(&v, Version::V1_1_0).unwrap();
    let route = &r.routes[0];
    assert_eq!((route.gw, route.mtu, route.advmss, route.priority), (None, None, None, Some(7)));
    assert_eq!((route.table, route.scope), (Some(0), Some(0)), "table and scope keep their zeros");
    let bad = json!({"cniVersion": "1.1.0", "routes": [{"dst": "10.0.0.0/8", "mtu": "x"}]});
    assert!(CniResult::decode(&bad, Version::V1_1_0).is_err());
}
