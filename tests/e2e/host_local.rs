//! host-local, exec'd as a runtime (or bridge) would: the built binary with CNI_* env and stdin,
//! against a scratch dataDir. host-local never enters CNI_NETNS; a scratch namespace makes it
//! pass the skeleton's real checks. Scenario names follow upstream's host_local_test.go
//! (reference §4.2).

use cni_tests::{dir_state, reservations, result_ips, Exec, Netns, PluginOutput, TempDir};
use serde_json::{json, Value};
use std::path::Path;

const ALL_VERSIONS: [&str; 7] = ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// One call of our host-local: `CNI_COMMAND`, `CNI_PATH`, and for ADD/DEL/CHECK the attachment
/// (`CNI_IFNAME` eth0; override with `.env`).
fn hl(command: &str, id: &str, ns: &Netns) -> Exec<'static> {
    call("host-local", command, id, ns)
}

fn call(bin: &str, command: &str, id: &str, ns: &Netns) -> Exec<'static> {
    let e = Exec::new(bin).env("CNI_COMMAND", command).env("CNI_PATH", "/usr/lib/cni");
    if matches!(command, "ADD" | "DEL" | "CHECK") {
        e.env("CNI_CONTAINERID", id).env("CNI_IFNAME", "eth0").env("CNI_NETNS", ns.path_str())
    } else {
        e
    }
}

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

/// Same files with the same content, our index included: a failed ADD leaves the store
/// exactly as it was.
fn assert_store_unchanged(before: &[(String, Vec<u8>)], after: &[(String, Vec<u8>)]) {
    if before != after {
        // Names and sizes: the index is binary and large.
        let show = |m: &[(String, Vec<u8>)]| {
            m.iter().map(|(p, v)| format!("{p} ({} bytes)", v.len())).collect::<Vec<_>>().join(", ")
        };
        let changed: Vec<&String> = after.iter().filter(|f| !before.contains(f)).map(|f| &f.0).collect();
        panic!(
            "store changed ({changed:?} new or different):\n before: {}\n after:  {}",
            show(before),
            show(after)
        );
    }
}

fn at_least(v: &str, min: &str) -> bool {
    let p = |s: &str| s.split('.').map(|x| x.parse::<u32>().unwrap()).collect::<Vec<_>>();
    p(v) >= p(min)
}

#[test]
fn allocate_and_release_every_version() {
    let ns = Netns::new("hl");
    for version in ALL_VERSIONS {
        let d = TempDir::new("hl");
        let resolv = d.path().join("resolv.conf");
        std::fs::write(&resolv, "nameserver 192.0.2.3\ndomain example.com\nsearch example.com\n").unwrap();
        let mut c = dual(version, d.path());
        c["ipam"]["resolvConf"] = json!(resolv);
        let out = hl("ADD", "dummy", &ns).run_json(&c).success();
        let r = &out.json();
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
            hl("CHECK", "dummy", &ns).run_json(&chk).success();
        } else {
            // CHECK does not exist before 0.4.0
            hl("CHECK", "dummy", &ns).run_json(&c).err_with(1, "does not allow CHECK");
        }

        hl("DEL", "dummy", &ns).run_json(&c).success();
        assert!(reservations(&net).is_empty(), "{version}: {:?}", reservations(&net));
        // DEL again: nothing to do, still success
        hl("DEL", "dummy", &ns).run_json(&c).success();
    }
}

#[test]
fn legacy_single_range_with_explicit_bounds() {
    let ns = Netns::new("hl");
    for version in ALL_VERSIONS {
        let d = TempDir::new("hl");
        let c = conf(
            version,
            d.path(),
            json!({"subnet": "10.1.2.0/24", "rangeStart": "10.1.2.9", "rangeEnd": "10.1.2.10", "gateway": "10.1.2.254"}),
        );
        let a = hl("ADD", "a", &ns).run_json(&c).success();
        let b = hl("ADD", "b", &ns).run_json(&c).success();
        assert_eq!(result_ips(&a.json()), ["10.1.2.9"], "{version}");
        assert_eq!(result_ips(&b.json()), ["10.1.2.10"]);
        hl("ADD", "c", &ns).run_json(&c).err_with(
            999,
            "failed to allocate for range 0: no IP addresses available in range set: 10.1.2.9-10.1.2.10",
        );
    }
}

#[test]
fn allocate_and_release_per_ifname() {
    let ns = Netns::new("hl");
    let d = TempDir::new("hl");
    let c = conf("1.1.0", d.path(), json!({"subnet": "10.1.2.0/24"}));
    let a = hl("ADD", "dummy", &ns).env("CNI_IFNAME", "eth0").run_json(&c).success();
    let b = hl("ADD", "dummy", &ns).env("CNI_IFNAME", "eth1").run_json(&c).success();
    assert_eq!(result_ips(&a.json()), ["10.1.2.2"]);
    assert_eq!(result_ips(&b.json()), ["10.1.2.3"]);
    let net = d.path().join("mynet");
    assert_eq!(
        reservations(&net),
        [("10.1.2.2".into(), "dummy\r\neth0".into()), ("10.1.2.3".into(), "dummy\r\neth1".into())]
    );
    hl("DEL", "dummy", &ns).env("CNI_IFNAME", "eth0").run_json(&c).success();
    assert_eq!(reservations(&net), [("10.1.2.3".into(), "dummy\r\neth1".into())]);
    hl("DEL", "dummy", &ns).env("CNI_IFNAME", "eth1").run_json(&c).success();
    assert!(reservations(&net).is_empty());
}

#[test]
fn repeat_add_for_same_attachment_fails() {
    let ns = Netns::new("hl");
    for version in ALL_VERSIONS {
        let d = TempDir::new("hl");
        let c = conf(version, d.path(), json!({"subnet": "10.1.2.0/24"}));
        hl("ADD", "dummy", &ns).run_json(&c).success();
        let before = dir_state(d.path());
        hl("ADD", "dummy", &ns)
            .run_json(&c)
            .err_with(999, "10.1.2.2 has been allocated to dummy, duplicate allocation is not allowed");
        assert_store_unchanged(&before, &dir_state(d.path()));
    }
}

#[test]
fn del_releases_legacy_id_only_files() {
    let ns = Netns::new("hl");
    let d = TempDir::new("hl");
    let net = d.path().join("mynet");
    std::fs::create_dir_all(&net).unwrap();
    std::fs::write(net.join("10.1.2.2"), "dummy").unwrap();
    std::fs::write(net.join("10.1.2.3"), "other").unwrap();
    let c = conf("0.4.0", d.path(), json!({"subnet": "10.1.2.0/24"}));
    // CHECK finds a legacy reservation
    hl("CHECK", "dummy", &ns).run_json(&c).success();
    // ADD refuses a second address for the id
    hl("ADD", "dummy", &ns).run_json(&c).err_with(999, "duplicate allocation is not allowed");
    hl("DEL", "dummy", &ns).run_json(&c).success();
    assert_eq!(reservations(&net), [("10.1.2.3".into(), "other".into())]);
}

#[test]
fn exact_matches_win_over_legacy_on_del() {
    let ns = Netns::new("hl");
    let d = TempDir::new("hl");
    let net = d.path().join("mynet");
    std::fs::create_dir_all(&net).unwrap();
    std::fs::write(net.join("10.1.2.5"), "dummy").unwrap();
    let c = conf("1.0.0", d.path(), json!({"subnet": "10.1.2.0/24", "rangeStart": "10.1.2.9"}));
    hl("ADD", "dummy", &ns).env("CNI_IFNAME", "eth1").run_json(&c).success();
    hl("DEL", "dummy", &ns).env("CNI_IFNAME", "eth1").run_json(&c).success();
    assert_eq!(
        reservations(&net),
        [("10.1.2.5".into(), "dummy".into())],
        "upstream: legacy only if no exact match"
    );
}

#[test]
fn del_of_unknown_id_succeeds() {
    let ns = Netns::new("hl");
    let d = TempDir::new("hl");
    let c = conf("1.1.0", d.path(), json!({"subnet": "10.1.2.0/24"}));
    // no network directory at all: nothing is created
    hl("DEL", "nobody", &ns).run_json(&c).success();
    assert!(dir_state(d.path()).is_empty());
    hl("ADD", "somebody", &ns).run_json(&c).success();
    hl("DEL", "nobody", &ns).run_json(&c).success();
    assert_eq!(reservations(&d.path().join("mynet")).len(), 1);
    // DEL also works with an empty or vanished CNI_NETNS
    hl("DEL", "somebody", &ns).env("CNI_NETNS", "").run_json(&c).success();
    assert!(reservations(&d.path().join("mynet")).is_empty());
}

#[test]
fn whitespace_in_store_files_is_ignored() {
    let ns = Netns::new("hl");
    let d = TempDir::new("hl");
    let net = d.path().join("mynet");
    std::fs::create_dir_all(&net).unwrap();
    std::fs::write(net.join("10.1.2.2"), "  dummy\r\neth0\n\n").unwrap();
    std::fs::write(net.join("10.1.2.3"), "\tlegacy \n").unwrap();
    let c = conf("1.0.0", d.path(), json!({"subnet": "10.1.2.0/24"}));
    let mut chk = c.clone();
    chk["prevResult"] = json!({"cniVersion": "1.0.0", "ips": [{"address": "10.1.2.2/24"}]});
    hl("CHECK", "dummy", &ns).run_json(&chk).success();
    hl("DEL", "dummy", &ns).run_json(&c).success();
    hl("DEL", "legacy", &ns).run_json(&c).success();
    assert!(reservations(&net).is_empty());
}

#[test]
fn no_error_output_when_creating_the_network_dir() {
    let ns = Netns::new("hl");
    let d = TempDir::new("hl");
    let dd = d.path().join("not/yet/there");
    let c = conf("1.1.0", &dd, json!({"subnet": "10.1.2.0/24"}));
    let out = hl("ADD", "dummy", &ns).run_json(&c).success();
    assert_eq!(out.stderr, "");
    let meta = std::fs::metadata(dd.join("mynet")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(meta.permissions().mode() & 0o777, 0o755);
}

#[test]
fn requested_ips_from_args_cni_args_and_runtime_config() {
    let ns = Netns::new("hl");
    for version in ALL_VERSIONS {
        let d = TempDir::new("hl");
        let mut c = conf(version, d.path(), json!({"subnet": "10.1.2.0/24"}));
        c["args"] = json!({"cni": {"ips": ["10.1.2.88"]}});
        let a = hl("ADD", "a", &ns).run_json(&c).success();
        assert_eq!(result_ips(&a.json()), ["10.1.2.88"], "{version}");
        let c = conf(version, d.path(), json!({"subnet": "10.1.2.0/24"}));
        let b = hl("ADD", "b", &ns)
            .env("CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAME=p;IP=10.1.2.77/24")
            .run_json(&c)
            .success();
        assert_eq!(result_ips(&b.json()), ["10.1.2.77"]);
        let mut c = conf(version, d.path(), json!({"subnet": "10.1.2.0/24"}));
        c["runtimeConfig"] = json!({"ips": ["10.1.2.66/24"]});
        let r = hl("ADD", "c", &ns).run_json(&c).success();
        assert_eq!(result_ips(&r.json()), ["10.1.2.66"]);
        let net = d.path().join("mynet");
        assert_eq!(std::fs::read_to_string(net.join("last_reserved_ip.0")).unwrap(), "10.1.2.66");
        // round-robin continues after the last requested address
        let n = hl("ADD", "d", &ns)
            .run_json(&conf(version, d.path(), json!({"subnet": "10.1.2.0/24"})))
            .success();
        assert_eq!(result_ips(&n.json()), ["10.1.2.67"]);
    }
}

#[test]
fn requested_ips_across_multiple_ranges_and_families() {
    let ns = Netns::new("hl");
    let d = TempDir::new("hl");
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
    let out = hl("ADD", "dummy", &ns).run_json(&c).success();
    assert_eq!(result_ips(&out.json()), ["10.1.2.88", "10.1.3.99", "2001:db8:1::999"]);
    assert_eq!(out.json()["ips"][2]["address"], "2001:db8:1::999/64");
}

#[test]
fn requested_ip_failures_leave_the_store_untouched() {
    let ns = Netns::new("hl");
    let d = TempDir::new("hl");
    let base = conf(
        "1.0.0",
        d.path(),
        json!({"ranges": [[{"subnet": "10.1.2.0/24"}], [{"subnet": "10.1.3.0/24"}]]}),
    );
    hl("ADD", "holder", &ns).run_json(&base).success(); // .2 and .3.2
    let cases: Vec<(Value, u64, &str)> = vec![
        (json!(["10.1.2.2"]), 999, "failed to allocate for range 0: requested IP address 10.1.2.2 is not available in range set 10.1.2.1-10.1.2.254"),
        (json!(["10.9.9.9"]), 7, "failed to allocate all requested IPs: 10.9.9.9"),
        (json!(["10.1.2.1"]), 7, "requested ip 10.1.2.1 is subnet's gateway"),
        (json!(["10.1.2.40", "10.1.2.41"]), 7, "failed to allocate all requested IPs: 10.1.2.41"),
        // the first set succeeds, the second fails: the first is rolled back
        (json!(["10.1.2.50", "10.1.3.2"]), 999, "failed to allocate for range 1: requested IP address 10.1.3.2 is not available"),
    ];
    for (ips, code, msg) in cases {
        let before = dir_state(d.path());
        let mut c = base.clone();
        c["args"] = json!({"cni": {"ips": ips}});
        let out = hl("ADD", "req", &ns).run_json(&c).err_with(code, msg);
        assert_store_unchanged(&before, &dir_state(d.path()));
        assert_eq!(out.json()["cniVersion"], "1.0.0");
    }
    let taken = {
        let mut c = base.clone();
        c["args"] = json!({"cni": {"ips": ["10.1.2.2"]}});
        hl("ADD", "req", &ns).run_json(&c)
    };
    assert_eq!(taken.json()["details"], "10.1.2.2 is reserved by container holder interface eth0");
}

#[test]
fn exhaustion_and_status() {
    let ns = Netns::new("hl");
    let d = TempDir::new("hl");
    let c = conf(
        "1.1.0",
        d.path(),
        json!({"ranges": [[{"subnet": "2001:db8:1::/64"}], [{"subnet": "10.1.2.0/30"}]]}),
    );
    // a fresh network: ready, and STATUS creates nothing
    hl("STATUS", "", &ns).run_json(&c).success();
    assert!(dir_state(d.path()).is_empty());
    hl("ADD", "a", &ns).run_json(&c).success();
    let out = hl("STATUS", "", &ns)
        .run_json(&c)
        .err_with(50, "no IP addresses available in range set 1: 10.1.2.1-10.1.2.2");
    assert_eq!(out.stdout.matches('{').count(), 1, "one JSON document");
    let before = dir_state(d.path());
    hl("ADD", "b", &ns).run_json(&c).err_with(
        999,
        "failed to allocate for range 1: no IP addresses available in range set: 10.1.2.1-10.1.2.2",
    );
    // the v6 address reserved before the v4 set failed was rolled back, cursor included
    assert_store_unchanged(&before, &dir_state(d.path()));
    hl("DEL", "a", &ns).run_json(&c).success();
    let ok = hl("STATUS", "", &ns).run_json(&c).success();
    assert_eq!(ok.stdout, "", "STATUS success prints nothing");
    // STATUS before 1.1.0 is a version error
    let mut old = c.clone();
    old["cniVersion"] = "1.0.0".into();
    hl("STATUS", "", &ns).run_json(&old).err_with(1, "does not allow STATUS");
}

#[test]
fn round_robin_does_not_reuse_a_freed_address_until_wrap() {
    let ns = Netns::new("hl");
    let d = TempDir::new("hl");
    let c = conf("1.0.0", d.path(), json!({"subnet": "10.1.2.0/29"})); // .2 … .6
    let mut seen = Vec::new();
    for (i, id) in ["a", "b", "c"].iter().enumerate() {
        let out = hl("ADD", id, &ns).run_json(&c).success();
        seen.push(result_ips(&out.json())[0].clone());
        if i == 0 {
            hl("DEL", id, &ns).run_json(&c).success();
        }
    }
    assert_eq!(seen, ["10.1.2.2", "10.1.2.3", "10.1.2.4"]);
    for id in ["d", "e", "f"] {
        let out = hl("ADD", id, &ns).run_json(&c).success();
        seen.push(result_ips(&out.json())[0].clone());
    }
    assert_eq!(&seen[3..], ["10.1.2.5", "10.1.2.6", "10.1.2.2"], "wraps to the freed .2 last");
}

#[test]
fn check_compares_with_prev_result() {
    let ns = Netns::new("hl");
    let d = TempDir::new("hl");
    let c = dual("1.1.0", d.path());
    let add = hl("ADD", "dummy", &ns).run_json(&c).success();
    let mut chk = c.clone();
    chk["prevResult"] = add.json();
    hl("CHECK", "dummy", &ns).run_json(&chk).success();
    // a prevResult as a bridge would send it (interfaces, interface indexes, extra foreign IP)
    let mut bridged = add.json();
    bridged["interfaces"] =
        json!([{"name": "cni0"}, {"name": "veth1"}, {"name": "eth0", "sandbox": ns.path()}]);
    for ip in bridged["ips"].as_array_mut().unwrap() {
        ip["interface"] = 2.into();
    }
    bridged["ips"].as_array_mut().unwrap().push(json!({"address": "192.0.2.9/24", "interface": 2}));
    chk["prevResult"] = bridged;
    hl("CHECK", "dummy", &ns).run_json(&chk).success();
    // prevResult names an address we did not reserve for it
    let mut wrong = add.json();
    wrong["ips"][0]["address"] = "10.1.2.77/24".into();
    chk["prevResult"] = wrong;
    hl("CHECK", "dummy", &ns)
        .run_json(&chk)
        .err_with(999, "address 10.1.2.77 from prevResult is not reserved");
    // prevResult lacks one of our addresses
    let mut partial = add.json();
    partial["ips"].as_array_mut().unwrap().pop();
    chk["prevResult"] = partial;
    hl("CHECK", "dummy", &ns).run_json(&chk).err_with(
        999,
        "2001:db8:1::2 reserved for container dummy interface eth0 is missing from prevResult",
    );
    // the reservation is gone
    chk["prevResult"] = add.json();
    hl("DEL", "dummy", &ns).run_json(&c).success();
    hl("CHECK", "dummy", &ns)
        .run_json(&chk)
        .err_with(999, "host-local: Failed to find address added by container dummy");
    // another ifname of the same container does not count
    hl("ADD", "dummy", &ns).env("CNI_IFNAME", "eth1").run_json(&c).success();
    hl("CHECK", "dummy", &ns).run_json(&chk).err_with(999, "Failed to find address");
}

#[test]
fn gc_releases_what_is_not_valid() {
    let ns = Netns::new("hl");
    let d = TempDir::new("hl");
    let c = conf("1.1.0", d.path(), json!({"subnet": "10.1.2.0/24"}));
    for (id, ifname) in [("a", "eth0"), ("a", "eth1"), ("b", "eth0"), ("c", "eth0")] {
        hl("ADD", id, &ns).env("CNI_IFNAME", ifname).run_json(&c).success();
    }
    let net = d.path().join("mynet");
    std::fs::write(net.join("10.1.2.100"), "legacy-alive").unwrap();
    std::fs::write(net.join("10.1.2.101"), "legacy-dead").unwrap();
    std::fs::write(net.join("10.1.2.102"), "").unwrap(); // crash leftover
    std::fs::write(net.join("notes.txt"), "b\r\neth0").unwrap(); // not a reservation name: untouched
                                                                 // another network in the same dataDir, with a reservation GC must not touch
    let mut other = c.clone();
    other["name"] = "othernet".into();
    hl("ADD", "zzz", &ns).run_json(&other).success();
    let other_before = dir_state(&d.path().join("othernet"));

    let mut gc = c.clone();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "a", "ifname": "eth1"}]);
    // the legacy spelling is honoured too
    gc["cni.dev/attachments"] =
        json!([{"containerID": "c", "ifname": "eth0"}, {"containerID": "legacy-alive", "ifname": "eth0"}]);
    hl("GC", "", &ns).run_json(&gc).success();
    let left: Vec<String> =
        reservations(&net).into_iter().map(|(ip, content)| format!("{ip}={content}")).collect();
    assert_eq!(left, ["10.1.2.100=legacy-alive", "10.1.2.3=a\r\neth1", "10.1.2.5=c\r\neth0"]);
    assert!(
        net.join("notes.txt").exists()
            && net.join("lock").exists()
            && net.join("last_reserved_ip.0").exists()
    );
    assert_eq!(dir_state(&d.path().join("othernet")), other_before);
    // the index agrees with the files afterwards: DEL of a kept attachment works
    hl("DEL", "c", &ns).run_json(&c).success();
    assert_eq!(reservations(&net).len(), 2);

    // an empty list releases everything
    let mut gc = c.clone();
    gc["cni.dev/valid-attachments"] = json!([]);
    hl("GC", "", &ns).run_json(&gc).success();
    assert!(reservations(&net).is_empty());
    assert_eq!(reservations(&d.path().join("othernet")).len(), 1);
    // GC without the list is a config error; GC of a network that never existed is fine
    hl("GC", "", &ns).run_json(&c).err_with(7, "cni.dev/valid-attachments");
    let mut never = gc.clone();
    never["name"] = "never".into();
    hl("GC", "", &ns).run_json(&never).success();
    assert!(!d.path().join("never").exists());
}

#[test]
fn an_empty_file_from_a_crash_is_reclaimed_by_add_and_removed_by_gc() {
    // An empty reservation file can only be debris (an upstream writer killed between create
    // and write, or a power loss before the content reached the disk): every writer holds the
    // lock while it writes, so under the lock it is nobody's.
    let ns = Netns::new("hl");
    let d = TempDir::new("hl");
    let net = d.path().join("mynet");
    std::fs::create_dir_all(&net).unwrap();
    std::fs::write(net.join("10.1.2.2"), "").unwrap();
    let c = conf("1.1.0", d.path(), json!({"subnet": "10.1.2.0/24"}));
    let out = hl("ADD", "a", &ns).run_json(&c).success();
    assert_eq!(result_ips(&out.json()), ["10.1.2.2"], "the address is reclaimed, not lost");
    assert_eq!(reservations(&net), [("10.1.2.2".into(), "a\r\neth0".into())]);
    // GC removes empty files it finds, too
    std::fs::write(net.join("10.1.2.9"), "").unwrap();
    let mut gc = c.clone();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "a", "ifname": "eth0"}]);
    hl("GC", "", &ns).run_json(&gc).success();
    assert_eq!(reservations(&net), [("10.1.2.2".into(), "a\r\neth0".into())]);
}

#[test]
fn bad_input_is_rejected_and_creates_nothing() {
    let ns = Netns::new("hl");
    let d = TempDir::new("hl");
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
            let out = hl(verb, "dummy", &ns).run(&s);
            assert_ne!(out.code, 0, "{verb} {stdin}: succeeded");
            let doc = out.json();
            assert_eq!(doc["code"], *code, "{verb} {stdin}: {}", out.stdout);
            let m = doc["msg"].as_str().unwrap_or("");
            assert!(
                m.contains(msg) || doc["details"].as_str().unwrap_or("").contains(msg),
                "{verb} {stdin}: {m:?} lacks {msg:?}"
            );
            assert!(dir_state(d.path()).is_empty(), "{verb} {stdin}: created {:?}", dir_state(d.path()));
        }
    }
}

#[test]
fn hundred_concurrent_adds_get_distinct_addresses() {
    let ns = Netns::new("hl");
    let d = TempDir::new("hl");
    let c = conf("1.1.0", d.path(), json!({"subnet": "10.1.0.0/16"})).to_string();
    let ids: Vec<String> = (0..100).map(|i| format!("ctr-{i}")).collect();
    // all 100 at once, one thread each
    let outs: Vec<(String, PluginOutput)> = std::thread::scope(|s| {
        let running: Vec<_> =
            ids.iter().map(|id| (id.clone(), s.spawn(|| hl("ADD", id, &ns).run(&c)))).collect();
        running.into_iter().map(|(id, t)| (id, t.join().expect("ADD thread").success())).collect()
    });
    let mut ips: Vec<String> = outs.iter().map(|(_, o)| result_ips(&o.json())[0].clone()).collect();
    ips.sort();
    ips.dedup();
    assert_eq!(ips.len(), 100, "distinct addresses");
    let files = reservations(&d.path().join("mynet"));
    assert_eq!(files.len(), 100);
    for (id, o) in &outs {
        let ip = &result_ips(&o.json())[0];
        assert!(files.contains(&(ip.clone(), format!("{id}\r\neth0"))), "{ip} not recorded for {id}");
    }
    // and the index is consistent: every one of them can be deleted through it
    for id in &ids {
        hl("DEL", id, &ns).run_json(&serde_json::from_str(&c).unwrap()).success();
    }
    assert!(reservations(&d.path().join("mynet")).is_empty());
}

#[test]
fn version_command_and_about_banner() {
    let ns = Netns::new("hl");
    let out = hl("VERSION", "", &ns).run("{}").success();
    assert_eq!(out.json()["supportedVersions"], json!(ALL_VERSIONS));
    let o = std::process::Command::new(cni_tests::bin("host-local")).env_clear().output().unwrap();
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).starts_with("CNI host-local plugin"));
}

#[test]
fn killed_adds_never_leave_partial_files_and_the_store_stays_usable() {
    let ns = Netns::new("hl");
    let d = TempDir::new("hl");
    let c = conf("1.1.0", d.path(), json!({"subnet": "10.1.0.0/16"}));
    let text = c.to_string();
    let net = d.path().join("mynet");
    for round in 0..5 {
        let mut children = Vec::new();
        for i in 0..20 {
            let id = format!("k{round}-{i}");
            children.push(hl("ADD", &id, &ns).spawn(&text));
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
        hl("DEL", id, &ns).run_json(&c).success();
    }
    assert!(reservations(&net).is_empty(), "{:?}", reservations(&net));
    let out = hl("ADD", "after", &ns).run_json(&c).success();
    assert_eq!(result_ips(&out.json()).len(), 1);
}

/// Regression: a failing ADD on a store without our index (one upstream made, or a fresh one)
/// left a new `.host-local-index` behind, and one that had reserved and released an address
/// left its index rewritten. A failed ADD leaves every file exactly as it was.
#[test]
fn a_failed_add_leaves_no_index_behind() {
    let ns = Netns::new("hl");
    let d = TempDir::new("hl");
    let net = d.path().join("mynet");
    // As upstream leaves a store: reservations and the lock, nothing of ours.
    std::fs::create_dir_all(&net).unwrap();
    std::fs::write(net.join("10.1.2.2"), "theirs\r\neth0").unwrap();
    std::fs::write(net.join("10.1.3.2"), "theirs\r\neth0").unwrap();
    std::fs::write(net.join("lock"), "").unwrap();
    let mut c = conf(
        "1.1.0",
        d.path(),
        json!({"ranges": [[{"subnet": "10.1.2.0/24"}], [{"subnet": "10.1.3.0/24"}]]}),
    );
    let before = dir_state(d.path());
    for ips in [json!(["10.1.2.2"]), json!(["10.1.2.9", "10.1.3.2"])] {
        c["args"] = json!({"cni": {"ips": ips}});
        hl("ADD", "mine", &ns).run_json(&c).err_with(999, "is not available");
        assert_store_unchanged(&before, &dir_state(d.path()));
    }
    // Once our index exists and is trusted, a failed ADD keeps it byte for byte.
    c.as_object_mut().unwrap().remove("args");
    hl("ADD", "mine", &ns).run_json(&c).success();
    let before = dir_state(d.path());
    assert!(before.iter().any(|(n, _)| n.ends_with(".host-local-index")));
    c["args"] = json!({"cni": {"ips": ["10.1.2.9", "10.1.3.2"]}});
    hl("ADD", "other", &ns).run_json(&c).err_with(999, "is not available");
    assert_store_unchanged(&before, &dir_state(d.path()));
    hl("DEL", "mine", &ns).run_json(&c).success();
    assert_eq!(reservations(&net).len(), 2, "the index still finds what it must");
}

/// Regression: DEL turned every error into code 5 (I/O), losing e.g. 11 ("try again"). Here
/// the reservation file is a mount point in the plugin's mount namespace, which the kernel
/// refuses to unlink with EBUSY: DEL reports 11 and the message names the file.
#[test]
fn del_keeps_the_code_of_what_failed() {
    use std::os::unix::fs::PermissionsExt;
    let ns = Netns::new("hl");
    let d = TempDir::new("hl");
    let c = conf("1.1.0", d.path(), json!({"subnet": "10.1.2.0/24"}));
    hl("ADD", "busy", &ns).run_json(&c).success();
    let file = d.path().join("mynet/10.1.2.2");
    let src = d.join("bind-source");
    std::fs::write(&src, "busy\r\neth0").unwrap();
    // host-local in a private mount namespace in which its reservation file is a bind mount.
    let wrapper = d.join("host-local-in-mntns");
    let script = format!(
        "#!/bin/sh\nexec unshare --mount --propagation private sh -c 'mount --bind \"$1\" \"$2\" && exec \"$3\"' sh {} {} {}\n",
        src.display(),
        file.display(),
        cni_tests::bin("host-local").display()
    );
    std::fs::write(&wrapper, script).unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = call(wrapper.to_str().unwrap(), "DEL", "busy", &ns).run_json(&c).err_with(11, "remove");
    assert!(out.stdout.contains("10.1.2.2"), "{}", out.stdout);
    assert!(file.exists());
    hl("DEL", "busy", &ns).run_json(&c).success();
    assert!(reservations(&d.path().join("mynet")).is_empty());
}
