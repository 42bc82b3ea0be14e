//! Process-level tests: the built `host-local` binary with CNI_* env and stdin, against a
//! temporary dataDir. Scenario names follow upstream's host_local_test.go (reference §4.2).

mod common;

use common::*;
use serde_json::{json, Value};
use std::path::Path;

fn conf(version: &str, data_dir: &Path, ipam_extra: Value) -> Value {
    let mut ipam = json!({"type": "host-local", "dataDir": data_dir});
    for (k, v) in ipam_extra.as_object().unwrap() {
        ipam[k] = v.clone();
    }
    json!({"cniVersion": version, "name": "mynet", "type": "ipvlan", "master": "foo0", "ipam": ipam})
}

fn dual(version: &str, data_dir: &Path) -> Value {
    conf(
        version,
        data_dir,
        json!({
            "ranges": [
                [{"subnet": "10.1.2.0/24"}],
                [{"subnet": "2001:db8:1::/64"}]
            ],
            "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}, {"dst": "192.168.0.0/16", "gw": "1.1.1.1"}]
        }),
    )
}

/// Same files with the same content; our index file may differ (tombstones).
fn assert_store_unchanged(
    before: &std::collections::BTreeMap<std::path::PathBuf, Vec<u8>>,
    after: &std::collections::BTreeMap<std::path::PathBuf, Vec<u8>>,
) {
    let strip = |m: &std::collections::BTreeMap<std::path::PathBuf, Vec<u8>>| {
        m.iter()
            .filter(|(p, _)| !p.ends_with(".host-local-index"))
            .map(|(p, v)| (p.clone(), String::from_utf8_lossy(v).to_string()))
            .collect::<Vec<_>>()
    };
    assert_eq!(strip(before), strip(after), "store changed");
}

fn at_least(v: &str, min: &str) -> bool {
    let p = |s: &str| s.split('.').map(|x| x.parse::<u32>().unwrap()).collect::<Vec<_>>();
    p(v) >= p(min)
}

#[test]
fn allocate_and_release_every_version() {
    let ns = Netns::new();
    for version in ALL_VERSIONS {
        let d = tempfile::tempdir().unwrap();
        let resolv = d.path().join("resolv.conf");
        std::fs::write(&resolv, "nameserver 192.0.2.3\ndomain example.com\nsearch example.com\n").unwrap();
        let mut c = dual(version, d.path());
        c["ipam"]["resolvConf"] = json!(resolv);
        let out = Call::new(OURS, "ADD", "dummy", &ns).run(&c).expect_ok();
        let r = &out.json;
        assert_eq!(r["cniVersion"], version);
        let dns = json!({"nameservers": ["192.0.2.3"], "domain": "example.com", "search": ["example.com"]});
        if at_least(version, "0.3.0") {
            let with_version = !at_least(version, "1.0.0");
            let mut ip4 = json!({"address": "10.1.2.2/24", "gateway": "10.1.2.1"});
            let mut ip6 = json!({"address": "2001:db8:1::2/64", "gateway": "2001:db8:1::1"});
            if with_version {
                ip4["version"] = "4".into();
                ip6["version"] = "6".into();
            }
            assert_eq!(r["ips"], json!([ip4, ip6]), "{version}");
            assert!(r.get("interfaces").is_none(), "IPAM results carry no interfaces");
            assert_eq!(
                r["routes"],
                json!([{"dst": "0.0.0.0/0"}, {"dst": "::/0"}, {"dst": "192.168.0.0/16", "gw": "1.1.1.1"}])
            );
            assert_eq!(r["dns"], dns);
        } else {
            assert_eq!(
                r["ip4"],
                json!({"ip": "10.1.2.2/24", "gateway": "10.1.2.1",
                       "routes": [{"dst": "0.0.0.0/0"}, {"dst": "192.168.0.0/16", "gw": "1.1.1.1"}]}),
                "{version}"
            );
            assert_eq!(
                r["ip6"],
                json!({"ip": "2001:db8:1::2/64", "gateway": "2001:db8:1::1", "routes": [{"dst": "::/0"}]})
            );
            assert_eq!(r["dns"], dns);
            assert!(r.get("ips").is_none());
        }
        let net = d.path().join("mynet");
        assert_eq!(std::fs::read(net.join("10.1.2.2")).unwrap(), b"dummy\r\neth0");
        assert_eq!(std::fs::read(net.join("2001:db8:1::2")).unwrap(), b"dummy\r\neth0");
        assert_eq!(std::fs::read_to_string(net.join("last_reserved_ip.0")).unwrap(), "10.1.2.2");
        assert_eq!(std::fs::read_to_string(net.join("last_reserved_ip.1")).unwrap(), "2001:db8:1::2");

        if at_least(version, "0.4.0") {
            let mut chk = c.clone();
            chk["prevResult"] = r.clone();
            Call::new(OURS, "CHECK", "dummy", &ns).run(&chk).expect_ok();
        } else {
            // CHECK does not exist before 0.4.0
            Call::new(OURS, "CHECK", "dummy", &ns).run(&c).expect_err(1, "does not allow CHECK");
        }

        Call::new(OURS, "DEL", "dummy", &ns).run(&c).expect_ok();
        assert!(reservations(&net).is_empty(), "{version}: {:?}", reservations(&net));
        // DEL again: nothing to do, still success
        Call::new(OURS, "DEL", "dummy", &ns).run(&c).expect_ok();
    }
}

#[test]
fn legacy_single_range_with_explicit_bounds() {
    let ns = Netns::new();
    for version in ALL_VERSIONS {
        let d = tempfile::tempdir().unwrap();
        let c = conf(
            version,
            d.path(),
            json!({"subnet": "10.1.2.0/24", "rangeStart": "10.1.2.9", "rangeEnd": "10.1.2.10", "gateway": "10.1.2.254"}),
        );
        let a = Call::new(OURS, "ADD", "a", &ns).run(&c).expect_ok();
        let b = Call::new(OURS, "ADD", "b", &ns).run(&c).expect_ok();
        assert_eq!(result_ips(&a.json), ["10.1.2.9"], "{version}");
        assert_eq!(result_ips(&b.json), ["10.1.2.10"]);
        Call::new(OURS, "ADD", "c", &ns).run(&c).expect_err(
            999,
            "failed to allocate for range 0: no IP addresses available in range set: 10.1.2.9-10.1.2.10",
        );
    }
}

#[test]
fn allocate_and_release_per_ifname() {
    let ns = Netns::new();
    let d = tempfile::tempdir().unwrap();
    let c = conf("1.1.0", d.path(), json!({"subnet": "10.1.2.0/24"}));
    let a = Call::new(OURS, "ADD", "dummy", &ns).ifname("eth0").run(&c).expect_ok();
    let b = Call::new(OURS, "ADD", "dummy", &ns).ifname("eth1").run(&c).expect_ok();
    assert_eq!(result_ips(&a.json), ["10.1.2.2"]);
    assert_eq!(result_ips(&b.json), ["10.1.2.3"]);
    let net = d.path().join("mynet");
    assert_eq!(
        reservations(&net),
        [("10.1.2.2".into(), "dummy\r\neth0".into()), ("10.1.2.3".into(), "dummy\r\neth1".into())]
    );
    Call::new(OURS, "DEL", "dummy", &ns).ifname("eth0").run(&c).expect_ok();
    assert_eq!(reservations(&net), [("10.1.2.3".into(), "dummy\r\neth1".into())]);
    Call::new(OURS, "DEL", "dummy", &ns).ifname("eth1").run(&c).expect_ok();
    assert!(reservations(&net).is_empty());
}

#[test]
fn repeat_add_for_same_attachment_fails() {
    let ns = Netns::new();
    for version in ALL_VERSIONS {
        let d = tempfile::tempdir().unwrap();
        let c = conf(version, d.path(), json!({"subnet": "10.1.2.0/24"}));
        Call::new(OURS, "ADD", "dummy", &ns).run(&c).expect_ok();
        let before = snapshot(d.path());
        Call::new(OURS, "ADD", "dummy", &ns)
            .run(&c)
            .expect_err(999, "10.1.2.2 has been allocated to dummy, duplicate allocation is not allowed");
        assert_store_unchanged(&before, &snapshot(d.path()));
    }
}

#[test]
fn del_releases_legacy_id_only_files() {
    let ns = Netns::new();
    let d = tempfile::tempdir().unwrap();
    let net = d.path().join("mynet");
    std::fs::create_dir_all(&net).unwrap();
    std::fs::write(net.join("10.1.2.2"), "dummy").unwrap();
    std::fs::write(net.join("10.1.2.3"), "other").unwrap();
    let c = conf("0.4.0", d.path(), json!({"subnet": "10.1.2.0/24"}));
    // CHECK finds a legacy reservation
    Call::new(OURS, "CHECK", "dummy", &ns).run(&c).expect_ok();
    // ADD refuses a second address for the id
    Call::new(OURS, "ADD", "dummy", &ns).run(&c).expect_err(999, "duplicate allocation is not allowed");
    Call::new(OURS, "DEL", "dummy", &ns).run(&c).expect_ok();
    assert_eq!(reservations(&net), [("10.1.2.3".into(), "other".into())]);
}

#[test]
fn exact_matches_win_over_legacy_on_del() {
    let ns = Netns::new();
    let d = tempfile::tempdir().unwrap();
    let net = d.path().join("mynet");
    std::fs::create_dir_all(&net).unwrap();
    std::fs::write(net.join("10.1.2.5"), "dummy").unwrap();
    let c = conf("1.0.0", d.path(), json!({"subnet": "10.1.2.0/24", "rangeStart": "10.1.2.9"}));
    Call::new(OURS, "ADD", "dummy", &ns).ifname("eth1").run(&c).expect_ok();
    Call::new(OURS, "DEL", "dummy", &ns).ifname("eth1").run(&c).expect_ok();
    assert_eq!(
        reservations(&net),
        [("10.1.2.5".into(), "dummy".into())],
        "upstream: legacy only if no exact match"
    );
}

#[test]
fn del_of_unknown_id_succeeds() {
    let ns = Netns::new();
    let d = tempfile::tempdir().unwrap();
    let c = conf("1.1.0", d.path(), json!({"subnet": "10.1.2.0/24"}));
    // no network directory at all: nothing is created
    Call::new(OURS, "DEL", "nobody", &ns).run(&c).expect_ok();
    assert!(snapshot(d.path()).is_empty());
    Call::new(OURS, "ADD", "somebody", &ns).run(&c).expect_ok();
    Call::new(OURS, "DEL", "nobody", &ns).run(&c).expect_ok();
    assert_eq!(reservations(&d.path().join("mynet")).len(), 1);
    // DEL also works with an empty or vanished CNI_NETNS
    let mut call = Call::new(OURS, "DEL", "somebody", &ns);
    call.netns = String::new();
    call.run(&c).expect_ok();
    assert!(reservations(&d.path().join("mynet")).is_empty());
}

#[test]
fn whitespace_in_store_files_is_ignored() {
    let ns = Netns::new();
    let d = tempfile::tempdir().unwrap();
    let net = d.path().join("mynet");
    std::fs::create_dir_all(&net).unwrap();
    std::fs::write(net.join("10.1.2.2"), "  dummy\r\neth0\n\n").unwrap();
    std::fs::write(net.join("10.1.2.3"), "\tlegacy \n").unwrap();
    let c = conf("1.0.0", d.path(), json!({"subnet": "10.1.2.0/24"}));
    let mut chk = c.clone();
    chk["prevResult"] = json!({"cniVersion": "1.0.0", "ips": [{"address": "10.1.2.2/24"}]});
    Call::new(OURS, "CHECK", "dummy", &ns).run(&chk).expect_ok();
    Call::new(OURS, "DEL", "dummy", &ns).run(&c).expect_ok();
    Call::new(OURS, "DEL", "legacy", &ns).run(&c).expect_ok();
    assert!(reservations(&net).is_empty());
}

#[test]
fn no_error_output_when_creating_the_network_dir() {
    let ns = Netns::new();
    let d = tempfile::tempdir().unwrap();
    let dd = d.path().join("not/yet/there");
    let c = conf("1.1.0", &dd, json!({"subnet": "10.1.2.0/24"}));
    let out = Call::new(OURS, "ADD", "dummy", &ns).run(&c).expect_ok();
    assert_eq!(out.stderr, "");
    let meta = std::fs::metadata(dd.join("mynet")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(meta.permissions().mode() & 0o777, 0o755);
}

#[test]
fn requested_ips_from_args_cni_args_and_runtime_config() {
    let ns = Netns::new();
    for version in ALL_VERSIONS {
        let d = tempfile::tempdir().unwrap();
        let mut c = conf(version, d.path(), json!({"subnet": "10.1.2.0/24"}));
        c["args"] = json!({"cni": {"ips": ["10.1.2.88"]}});
        let a = Call::new(OURS, "ADD", "a", &ns).run(&c).expect_ok();
        assert_eq!(result_ips(&a.json), ["10.1.2.88"], "{version}");
        let c = conf(version, d.path(), json!({"subnet": "10.1.2.0/24"}));
        let b = Call::new(OURS, "ADD", "b", &ns)
            .args("IgnoreUnknown=1;K8S_POD_NAME=p;IP=10.1.2.77/24")
            .run(&c)
            .expect_ok();
        assert_eq!(result_ips(&b.json), ["10.1.2.77"]);
        let mut c = conf(version, d.path(), json!({"subnet": "10.1.2.0/24"}));
        c["runtimeConfig"] = json!({"ips": ["10.1.2.66/24"]});
        let r = Call::new(OURS, "ADD", "c", &ns).run(&c).expect_ok();
        assert_eq!(result_ips(&r.json), ["10.1.2.66"]);
        let net = d.path().join("mynet");
        assert_eq!(std::fs::read_to_string(net.join("last_reserved_ip.0")).unwrap(), "10.1.2.66");
        // round-robin continues after the last requested address
        let n = Call::new(OURS, "ADD", "d", &ns)
            .run(&conf(version, d.path(), json!({"subnet": "10.1.2.0/24"})))
            .expect_ok();
        assert_eq!(result_ips(&n.json), ["10.1.2.67"]);
    }
}

#[test]
fn requested_ips_across_multiple_ranges_and_families() {
    let ns = Netns::new();
    let d = tempfile::tempdir().unwrap();
    let mut c = conf(
        "0.3.1",
        d.path(),
        json!({"ranges": [
            [{"subnet": "10.1.2.0/24"}],
            [{"subnet": "10.1.3.0/24"}],
            [{"subnet": "2001:db8:1::/64"}]
        ]}),
    );
    c["args"] = json!({"cni": {"ips": ["10.1.3.99", "2001:db8:1::999", "10.1.2.88"]}});
    let out = Call::new(OURS, "ADD", "dummy", &ns).run(&c).expect_ok();
    assert_eq!(result_ips(&out.json), ["10.1.2.88", "10.1.3.99", "2001:db8:1::999"]);
    assert_eq!(out.json["ips"][2]["address"], "2001:db8:1::999/64");
}

#[test]
fn requested_ip_failures_leave_the_store_untouched() {
    let ns = Netns::new();
    let d = tempfile::tempdir().unwrap();
    let base = conf(
        "1.0.0",
        d.path(),
        json!({"ranges": [[{"subnet": "10.1.2.0/24"}], [{"subnet": "10.1.3.0/24"}]]}),
    );
    Call::new(OURS, "ADD", "holder", &ns).run(&base).expect_ok(); // .2 and .3.2
    let cases: Vec<(Value, u64, &str)> = vec![
        (json!(["10.1.2.2"]), 999, "failed to allocate for range 0: requested IP address 10.1.2.2 is not available in range set 10.1.2.1-10.1.2.254"),
        (json!(["10.9.9.9"]), 7, "failed to allocate all requested IPs: 10.9.9.9"),
        (json!(["10.1.2.1"]), 7, "requested ip 10.1.2.1 is subnet's gateway"),
        (json!(["10.1.2.40", "10.1.2.41"]), 7, "failed to allocate all requested IPs: 10.1.2.41"),
        // the first set succeeds, the second fails: the first is rolled back
        (json!(["10.1.2.50", "10.1.3.2"]), 999, "failed to allocate for range 1: requested IP address 10.1.3.2 is not available"),
    ];
    for (ips, code, msg) in cases {
        let before = snapshot(d.path());
        let mut c = base.clone();
        c["args"] = json!({"cni": {"ips": ips}});
        let out = Call::new(OURS, "ADD", "req", &ns).run(&c).expect_err(code, msg);
        assert_store_unchanged(&before, &snapshot(d.path()));
        assert_eq!(out.json["cniVersion"], "1.0.0");
    }
    let taken = {
        let mut c = base.clone();
        c["args"] = json!({"cni": {"ips": ["10.1.2.2"]}});
        Call::new(OURS, "ADD", "req", &ns).run(&c)
    };
    assert_eq!(taken.json["details"], "10.1.2.2 is reserved by container holder interface eth0");
}

#[test]
fn exhaustion_and_status() {
    let ns = Netns::new();
    let d = tempfile::tempdir().unwrap();
    let c = conf(
        "1.1.0",
        d.path(),
        json!({"ranges": [[{"subnet": "2001:db8:1::/64"}], [{"subnet": "10.1.2.0/30"}]]}),
    );
    // a fresh network: ready, and STATUS creates nothing
    Call::new(OURS, "STATUS", "", &ns).run(&c).expect_ok();
    assert!(snapshot(d.path()).is_empty());
    Call::new(OURS, "ADD", "a", &ns).run(&c).expect_ok();
    let out = Call::new(OURS, "STATUS", "", &ns)
        .run(&c)
        .expect_err(50, "no IP addresses available in range set 1: 10.1.2.1-10.1.2.2");
    assert_eq!(out.stdout.matches('{').count(), 1, "one JSON document");
    let before = snapshot(d.path());
    Call::new(OURS, "ADD", "b", &ns).run(&c).expect_err(
        999,
        "failed to allocate for range 1: no IP addresses available in range set: 10.1.2.1-10.1.2.2",
    );
    // the v6 address reserved before the v4 set failed was rolled back, cursor included
    assert_store_unchanged(&before, &snapshot(d.path()));
    Call::new(OURS, "DEL", "a", &ns).run(&c).expect_ok();
    let ok = Call::new(OURS, "STATUS", "", &ns).run(&c).expect_ok();
    assert_eq!(ok.stdout, "", "STATUS success prints nothing");
    // STATUS before 1.1.0 is a version error
    let mut old = c.clone();
    old["cniVersion"] = "1.0.0".into();
    Call::new(OURS, "STATUS", "", &ns).run(&old).expect_err(1, "does not allow STATUS");
}

#[test]
fn round_robin_does_not_reuse_a_freed_address_until_wrap() {
    let ns = Netns::new();
    let d = tempfile::tempdir().unwrap();
    let c = conf("1.0.0", d.path(), json!({"subnet": "10.1.2.0/29"})); // .2 … .6
    let mut seen = Vec::new();
    for (i, id) in ["a", "b", "c"].iter().enumerate() {
        let out = Call::new(OURS, "ADD", id, &ns).run(&c).expect_ok();
        seen.push(result_ips(&out.json)[0].clone());
        if i == 0 {
            Call::new(OURS, "DEL", id, &ns).run(&c).expect_ok();
        }
    }
    assert_eq!(seen, ["10.1.2.2", "10.1.2.3", "10.1.2.4"]);
    for id in ["d", "e", "f"] {
        let out = Call::new(OURS, "ADD", id, &ns).run(&c).expect_ok();
        seen.push(result_ips(&out.json)[0].clone());
    }
    assert_eq!(&seen[3..], ["10.1.2.5", "10.1.2.6", "10.1.2.2"], "wraps to the freed .2 last");
}

#[test]
fn check_compares_with_prev_result() {
    let ns = Netns::new();
    let d = tempfile::tempdir().unwrap();
    let c = dual("1.1.0", d.path());
    let add = Call::new(OURS, "ADD", "dummy", &ns).run(&c).expect_ok();
    let mut chk = c.clone();
    chk["prevResult"] = add.json.clone();
    Call::new(OURS, "CHECK", "dummy", &ns).run(&chk).expect_ok();
    // a prevResult as a bridge would send it (interfaces, interface indexes, extra foreign IP)
    let mut bridged = add.json.clone();
    bridged["interfaces"] =
        json!([{"name": "cni0"}, {"name": "veth1"}, {"name": "eth0", "sandbox": ns.path()}]);
    for ip in bridged["ips"].as_array_mut().unwrap() {
        ip["interface"] = 2.into();
    }
    bridged["ips"].as_array_mut().unwrap().push(json!({"address": "192.0.2.9/24", "interface": 2}));
    chk["prevResult"] = bridged;
    Call::new(OURS, "CHECK", "dummy", &ns).run(&chk).expect_ok();
    // prevResult names an address we did not reserve for it
    let mut wrong = add.json.clone();
    wrong["ips"][0]["address"] = "10.1.2.77/24".into();
    chk["prevResult"] = wrong;
    Call::new(OURS, "CHECK", "dummy", &ns)
        .run(&chk)
        .expect_err(999, "address 10.1.2.77 from prevResult is not reserved");
    // prevResult lacks one of our addresses
    let mut partial = add.json.clone();
    partial["ips"].as_array_mut().unwrap().pop();
    chk["prevResult"] = partial;
    Call::new(OURS, "CHECK", "dummy", &ns).run(&chk).expect_err(
        999,
        "2001:db8:1::2 reserved for container dummy interface eth0 is missing from prevResult",
    );
    // the reservation is gone
    chk["prevResult"] = add.json.clone();
    Call::new(OURS, "DEL", "dummy", &ns).run(&c).expect_ok();
    Call::new(OURS, "CHECK", "dummy", &ns)
        .run(&chk)
        .expect_err(999, "host-local: Failed to find address added by container dummy");
    // another ifname of the same container does not count
    Call::new(OURS, "ADD", "dummy", &ns).ifname("eth1").run(&c).expect_ok();
    Call::new(OURS, "CHECK", "dummy", &ns).run(&chk).expect_err(999, "Failed to find address");
}

#[test]
fn gc_releases_what_is_not_valid() {
    let ns = Netns::new();
    let d = tempfile::tempdir().unwrap();
    let c = conf("1.1.0", d.path(), json!({"subnet": "10.1.2.0/24"}));
    for (id, ifname) in [("a", "eth0"), ("a", "eth1"), ("b", "eth0"), ("c", "eth0")] {
        Call::new(OURS, "ADD", id, &ns).ifname(ifname).run(&c).expect_ok();
    }
    let net = d.path().join("mynet");
    std::fs::write(net.join("10.1.2.100"), "legacy-alive").unwrap();
    std::fs::write(net.join("10.1.2.101"), "legacy-dead").unwrap();
    std::fs::write(net.join("10.1.2.102"), "").unwrap(); // crash leftover
    std::fs::write(net.join("notes.txt"), "b\r\neth0").unwrap(); // not a reservation name: untouched
                                                                 // another network in the same dataDir, with a reservation GC must not touch
    let mut other = c.clone();
    other["name"] = "othernet".into();
    Call::new(OURS, "ADD", "zzz", &ns).run(&other).expect_ok();
    let other_before = snapshot(&d.path().join("othernet"));

    let mut gc = c.clone();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "a", "ifname": "eth1"}]);
    // the legacy spelling is honoured too
    gc["cni.dev/attachments"] =
        json!([{"containerID": "c", "ifname": "eth0"}, {"containerID": "legacy-alive", "ifname": "eth0"}]);
    Call::new(OURS, "GC", "", &ns).run(&gc).expect_ok();
    let left: Vec<String> =
        reservations(&net).into_iter().map(|(ip, content)| format!("{ip}={content}")).collect();
    assert_eq!(left, ["10.1.2.100=legacy-alive", "10.1.2.3=a\r\neth1", "10.1.2.5=c\r\neth0"]);
    assert!(
        net.join("notes.txt").exists()
            && net.join("lock").exists()
            && net.join("last_reserved_ip.0").exists()
    );
    assert_eq!(snapshot(&d.path().join("othernet")), other_before);
    // the index agrees with the files afterwards: DEL of a kept attachment works
    Call::new(OURS, "DEL", "c", &ns).run(&c).expect_ok();
    assert_eq!(reservations(&net).len(), 2);

    // an empty list releases everything
    let mut gc = c.clone();
    gc["cni.dev/valid-attachments"] = json!([]);
    Call::new(OURS, "GC", "", &ns).run(&gc).expect_ok();
    assert!(reservations(&net).is_empty());
    assert_eq!(reservations(&d.path().join("othernet")).len(), 1);
    // GC without the list is a config error; GC of a network that never existed is fine
    Call::new(OURS, "GC", "", &ns).run(&c).expect_err(7, "cni.dev/valid-attachments");
    let mut never = gc.clone();
    never["name"] = "never".into();
    Call::new(OURS, "GC", "", &ns).run(&never).expect_ok();
    assert!(!d.path().join("never").exists());
}

#[test]
fn an_empty_file_from_a_crash_is_reclaimed_by_add_and_removed_by_gc() {
    // An empty reservation file can only be debris (an upstream writer killed between create
    // and write, or a power loss before the content reached the disk): every writer holds the
    // lock while it writes, so under the lock it is nobody's.
    let ns = Netns::new();
    let d = tempfile::tempdir().unwrap();
    let net = d.path().join("mynet");
    std::fs::create_dir_all(&net).unwrap();
    std::fs::write(net.join("10.1.2.2"), "").unwrap();
    let c = conf("1.1.0", d.path(), json!({"subnet": "10.1.2.0/24"}));
    let out = Call::new(OURS, "ADD", "a", &ns).run(&c).expect_ok();
    assert_eq!(result_ips(&out.json), ["10.1.2.2"], "the address is reclaimed, not lost");
    assert_eq!(reservations(&net), [("10.1.2.2".into(), "a\r\neth0".into())]);
    // GC removes empty files it finds, too
    std::fs::write(net.join("10.1.2.9"), "").unwrap();
    let mut gc = c.clone();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "a", "ifname": "eth0"}]);
    Call::new(OURS, "GC", "", &ns).run(&gc).expect_ok();
    assert_eq!(reservations(&net), [("10.1.2.2".into(), "a\r\neth0".into())]);
}

#[test]
fn bad_input_is_rejected_and_creates_nothing() {
    let ns = Netns::new();
    let d = tempfile::tempdir().unwrap();
    let good = conf("1.1.0", d.path(), json!({"subnet": "10.1.2.0/24"}));
    let with = |f: &dyn Fn(&mut Value)| {
        let mut c = good.clone();
        f(&mut c);
        c.to_string()
    };
    let cases: Vec<(String, u64, &str)> = vec![
        ("{not json".into(), 6, "error unmarshall network config"),
        ("[1, 2]".into(), 6, "must be a JSON object"),
        (with(&|c| c["ipam"]["subnet"] = json!(24)), 6, "ipam.subnet"),
        (with(&|c| c["ipam"]["subnet"] = json!("10.1.2.0/40")), 6, "ipam.subnet"),
        (with(&|c| c["ipam"]["routes"] = json!([{"dst": "default"}])), 6, "ipam.routes[0].dst"),
        (
            with(&|c| c["ipam"]["ranges"] = json!([[{"subnet": "10.9.0.0/16", "gateway": "nope"}]])),
            6,
            "ipam.ranges[0][0].gateway",
        ),
        (with(&|c| c["name"] = json!("../../etc")), 7, "invalid characters found in network name"),
        (with(&|c| c["name"] = json!("a/b")), 7, "invalid characters found in network name"),
        (
            with(&|c| c["ipam"]["dataDir"] = json!("relative/dir")),
            7,
            "ipam.dataDir \"relative/dir\" is not an absolute path",
        ),
        (
            with(&|c| c["ipam"]["dataDir"] = json!(format!("{}/x/../../escape", d.path().display()))),
            7,
            "\"..\"",
        ),
        (with(&|c| c["ipam"]["subnet"] = json!("10.1.2.1/24")), 7, "has host bits set"),
        (with(&|c| c["ipam"]["subnet"] = json!("10.1.2.0/31")), 7, "too small to allocate from"),
        (
            with(&|c| c["ipam"]["rangeStart"] = json!("10.1.3.1")),
            7,
            "invalid range set 0 (ipam.subnet): range 0: rangeStart: 10.1.3.1 not in network 10.1.2.0/24",
        ),
        (
            with(&|c| c["ipam"]["ranges"] = json!([[{"subnet": "10.1.2.0/25"}]])),
            7,
            "range set 0 overlaps with 1",
        ),
        (
            with(&|c| c["ipam"]["resolvConf"] = json!("/nonexistent/resolv.conf")),
            7,
            "ipam.resolvConf /nonexistent/resolv.conf",
        ),
        (
            with(&|c| {
                c.as_object_mut().unwrap().remove("ipam");
            }),
            7,
            "IPAM config missing 'ipam' key",
        ),
    ];
    for (stdin, code, msg) in &cases {
        for verb in ["ADD", "DEL", "CHECK", "GC", "STATUS"] {
            if verb != "ADD" && msg.contains("resolvConf") {
                continue; // resolvConf is read on ADD only, like upstream
            }
            let mut s = stdin.clone();
            if verb == "GC" && s.starts_with("{\"") {
                let mut v: Value = serde_json::from_str(&s).unwrap();
                v["cni.dev/valid-attachments"] = json!([]);
                s = v.to_string();
            }
            let out = Call::new(OURS, verb, "dummy", &ns).run_raw(s.as_bytes());
            assert!(!out.ok, "{verb} {stdin}: succeeded");
            assert_eq!(out.code(), *code, "{verb} {stdin}: {}", out.stdout);
            assert!(
                out.msg().contains(msg) || out.json["details"].as_str().unwrap_or("").contains(msg),
                "{verb} {stdin}: {:?} lacks {msg:?}",
                out.msg()
            );
            assert!(snapshot(d.path()).is_empty(), "{verb} {stdin}: created {:?}", snapshot(d.path()));
        }
    }
}

#[test]
fn hundred_concurrent_adds_get_distinct_addresses() {
    let ns = Netns::new();
    let d = tempfile::tempdir().unwrap();
    let c = conf("1.1.0", d.path(), json!({"subnet": "10.1.0.0/16"})).to_string();
    let ids: Vec<String> = (0..100).map(|i| format!("ctr-{i}")).collect();
    // start all 100 before waiting for any
    let mut children = Vec::new();
    for id in &ids {
        let mut child = Call::new(OURS, "ADD", id, &ns).command().spawn().unwrap();
        children.push((id.clone(), child.stdin.take().unwrap(), child));
    }
    let mut outs = Vec::new();
    for (id, mut stdin, child) in children {
        use std::io::Write;
        stdin.write_all(c.as_bytes()).unwrap();
        drop(stdin);
        outs.push((id, finish(child).expect_ok()));
    }
    let mut ips: Vec<String> = outs.iter().map(|(_, o)| result_ips(&o.json)[0].clone()).collect();
    ips.sort();
    ips.dedup();
    assert_eq!(ips.len(), 100, "distinct addresses");
    let files = reservations(&d.path().join("mynet"));
    assert_eq!(files.len(), 100);
    for (id, o) in &outs {
        let ip = &result_ips(&o.json)[0];
        assert!(files.contains(&(ip.clone(), format!("{id}\r\neth0"))), "{ip} not recorded for {id}");
    }
    // and the index is consistent: every one of them can be deleted through it
    for id in &ids {
        Call::new(OURS, "DEL", id, &ns).run(&serde_json::from_str(&c).unwrap()).expect_ok();
    }
    assert!(reservations(&d.path().join("mynet")).is_empty());
}

#[test]
fn version_command_and_about_banner() {
    let ns = Netns::new();
    let out = Call::new(OURS, "VERSION", "", &ns).run_raw(b"{}").expect_ok();
    assert_eq!(out.json["supportedVersions"], json!(ALL_VERSIONS));
    let o = std::process::Command::new(OURS).env_clear().output().unwrap();
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).starts_with("CNI host-local plugin"));
}

#[test]
fn killed_adds_never_leave_partial_files_and_the_store_stays_usable() {
    let ns = Netns::new();
    let d = tempfile::tempdir().unwrap();
    let c = conf("1.1.0", d.path(), json!({"subnet": "10.1.0.0/16"}));
    let text = c.to_string();
    let net = d.path().join("mynet");
    for round in 0..5 {
        let mut children = Vec::new();
        for i in 0..20 {
            let id = format!("k{round}-{i}");
            let mut child = Call::new(OURS, "ADD", &id, &ns).command().spawn().unwrap();
            use std::io::Write;
            let _ = child.stdin.take().unwrap().write_all(text.as_bytes());
            children.push(child);
        }
        // kill them wherever they are: before, during or after their reservation
        std::thread::sleep(std::time::Duration::from_millis(2 * round));
        for ch in &mut children {
            let _ = ch.kill();
        }
        for mut ch in children {
            let _ = ch.wait();
        }
    }
    let files = reservations(&net);
    eprintln!("{} of 100 killed ADDs left a reservation", files.len());
    for (ip, content) in &files {
        assert!(
            content.starts_with('k') && content.ends_with("\r\neth0"),
            "{ip} holds {content:?}: a reservation file must appear complete or not at all"
        );
    }
    // the index may be stale after the kills; every surviving reservation can still be found
    for (_, content) in &files {
        let id = content.split("\r\n").next().unwrap();
        Call::new(OURS, "DEL", id, &ns).run(&c).expect_ok();
    }
    assert!(reservations(&net).is_empty(), "{:?}", reservations(&net));
    let out = Call::new(OURS, "ADD", "after", &ns).run(&c).expect_ok();
    assert_eq!(result_ips(&out.json).len(), 1);
}
