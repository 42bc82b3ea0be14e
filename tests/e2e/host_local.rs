//! host-local, exec'd as a runtime (or bridge) would: the built binary with CNI_* env and stdin,
//! against a scratch dataDir. host-local never enters CNI_NETNS; a scratch namespace makes it
//! pass the skeleton's real checks. Scenario names follow upstream's host_local_test.go
//! (reference §4.2).

use cni_tests::{dir_state, reservations, result_ips, Exec, Netns, PluginOutput, PodNetns, TempDir};
use serde_json::{json, Value};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
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
    let mut opt_in = c.clone();
    opt_in["ipam"]["reportExhaustionInStatus"] = json!(true);
    // a fresh network: ready, and STATUS creates nothing
    hl("STATUS", "", &ns).run_json(&c).ok_silent();
    hl("STATUS", "", &ns).run_json(&opt_in).ok_silent();
    assert!(dir_state(d.path()).is_empty());
    hl("ADD", "a", &ns).run_json(&c).success();
    let before = dir_state(d.path());
    // Exhausted: ADD says so (below); STATUS says the plugin can serve the node's pods unless
    // the configuration asks for exhaustion to be reported (README.md, "STATUS").
    hl("STATUS", "", &ns).run_json(&c).ok_silent();
    let out = hl("STATUS", "", &ns)
        .run_json(&opt_in)
        .err_with(50, "no IP addresses available in range set 1: 10.1.2.1-10.1.2.2");
    assert_eq!(out.stdout.matches('{').count(), 1, "one JSON document");
    assert_store_unchanged(&before, &dir_state(d.path()));
    hl("ADD", "b", &ns).run_json(&c).err_with(
        999,
        "failed to allocate for range 1: no IP addresses available in range set: 10.1.2.1-10.1.2.2",
    );
    // the v6 address reserved before the v4 set failed was rolled back, cursor included
    assert_store_unchanged(&before, &dir_state(d.path()));
    hl("DEL", "a", &ns).run_json(&c).success();
    let ok = hl("STATUS", "", &ns).run_json(&opt_in).success();
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

/// The state letter of process `pid` (`/proc/<pid>/stat`), `None` once it is reaped.
fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
}

/// Whether the stopped process `pid` is in the middle of writing the store under `net`: it
/// holds an unnamed file there (`O_TMPFILE`: a reservation or record being written or linked)
/// or our named temporary files.
fn writing_store(pid: u32, net: &Path) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return false };
    let prefix = net.to_string_lossy().into_owned();
    fds.flatten().any(|fd| {
        let link = std::fs::read_link(fd.path()).unwrap_or_default().to_string_lossy().into_owned();
        link.starts_with(&prefix)
            && (link.ends_with(" (deleted)")
                || link.contains(".host-local-tmp-")
                || link.ends_with(".host-local-index.tmp"))
    })
}

#[test]
fn killed_adds_never_leave_partial_files_and_the_store_stays_usable() {
    let ns = Netns::new("hl");
    let d = TempDir::new("hl");
    let c = conf("1.1.0", d.path(), json!({"subnet": "10.1.0.0/16"}));
    let text = c.to_string();
    let net = d.path().join("mynet");
    let (mut kills, mut mid_write) = (0usize, 0usize);
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    // Rounds of 20 ADDs: 10 started together and killed after a random delay wherever they
    // are; while they run, 10 more one by one, each stopped (SIGSTOP) again and again from its
    // start (it runs a random slice of up to 0.2 ms between two looks) until it is caught with
    // a reservation or record half written, and killed there. At least 5 rounds, and until a
    // kill landed mid-write (bounded). (Each is watched from its start, not after the others:
    // on a quiet machine an ADD has finished writing before a late look.)
    for round in 0..60 {
        let mut children = Vec::new();
        for i in 0..10 {
            children.push(hl("ADD", &format!("k{round}-{i}"), &ns).spawn(&text));
        }
        for i in 0..20 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            if i % 2 == 0 {
                std::thread::sleep(std::time::Duration::from_micros(rng % 3000));
                let _ = children[i / 2].kill();
                kills += 1;
                continue;
            }
            children.push(hl("ADD", &format!("k{round}-{}", 10 + i / 2), &ns).spawn(&text));
            let ch = children.last_mut().expect("just pushed");
            let pid = ch.id();
            let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while std::time::Instant::now() < end && matches!(ch.try_wait(), Ok(None)) {
                // SAFETY: signals to our own child, not yet reaped.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGSTOP) };
                while !matches!(proc_state(pid), Some('T' | 't' | 'Z') | None)
                    && std::time::Instant::now() < end
                {
                    std::hint::spin_loop();
                }
                if writing_store(pid, &net) {
                    let _ = ch.kill();
                    kills += 1;
                    mid_write += 1;
                    break;
                }
                // SAFETY: as above.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGCONT) };
                // let it run a random slice (up to 0.2 ms) before the next look
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                std::thread::sleep(std::time::Duration::from_micros(rng % 200));
            }
        }
        for mut ch in children {
            let _ = ch.kill();
            let _ = ch.wait();
        }
        if round >= 4 && mid_write > 0 {
            break;
        }
    }
    let files = reservations(&net);
    eprintln!(
        "{kills} ADDs killed, {mid_write} of them in the middle of a store write; {} reservations left",
        files.len()
    );
    assert!(mid_write > 0, "no kill landed while an ADD was writing the store");
    for (ip, content) in &files {
        assert!(
            content.starts_with('k') && content.ends_with("\r\neth0"),
            "{ip} holds {content:?}: a reservation file must appear complete or not at all"
        );
    }
    for (ip, rec) in records(&net) {
        assert!(
            rec.starts_with("cni-rs host-local netns record v1\n") && rec.ends_with('\n'),
            "{ip}: {rec:?}"
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

// ---- reclaiming dead reservations (issue 21) ----

/// One call of our host-local for container `id` whose namespace is at `netns`.
fn hl_at(command: &str, id: &str, netns: &str) -> Exec<'static> {
    Exec::new("host-local")
        .env("CNI_COMMAND", command)
        .env("CNI_PATH", "/usr/lib/cni")
        .env("CNI_CONTAINERID", id)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_NETNS", netns)
}

/// The netns records of a network directory (our `.host-local-ns/<ip>` files), by address.
fn records(net: &Path) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = std::fs::read_dir(net.join(".host-local-ns"))
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| {
                    let name = e.file_name().into_string().ok()?;
                    name.parse::<std::net::IpAddr>().ok()?;
                    Some((name, std::fs::read_to_string(e.path()).ok()?))
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn boot_id_hex() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap().trim().replace('-', "")
}

#[test]
fn add_records_the_namespace_beside_each_reservation() {
    let d = TempDir::new("hl");
    let pod = PodNetns::new("hlr");
    let c = dual("1.1.0", d.path());
    hl_at("ADD", "rec", pod.path()).run_json(&c).success();
    let net = d.path().join("mynet");
    // the reservations are upstream's, byte for byte; the records sit beside them
    assert_eq!(
        reservations(&net),
        [("10.1.2.2".into(), "rec\r\neth0".into()), ("2001:db8:1::2".into(), "rec\r\neth0".into())]
    );
    let recs = records(&net);
    assert_eq!(recs.iter().map(|r| r.0.as_str()).collect::<Vec<_>>(), ["10.1.2.2", "2001:db8:1::2"]);
    let ino = std::fs::metadata(pod.path()).unwrap().ino();
    for (ip, text) in &recs {
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "cni-rs host-local netns record v1", "{ip}: {text}");
        assert!(lines[1].starts_with(&format!("file {} ", std::fs::metadata(net.join(ip)).unwrap().ino())));
        assert_eq!(lines[2], format!("boot {}", boot_id_hex()));
        let ns: Vec<&str> = lines[3].split(' ').collect();
        assert_eq!((ns[0], ns[1], ns[3]), ("netns", ino.to_string().as_str(), pod.path()), "{text}");
        assert_ne!(ns[2], "0", "a netns cookie");
    }
    // DEL takes the records with the reservations
    hl_at("DEL", "rec", pod.path()).run_json(&c).success();
    assert!(reservations(&net).is_empty() && records(&net).is_empty());
}

#[test]
fn reservations_of_an_earlier_boot_are_released_by_the_first_add_after_it() {
    let d = TempDir::new("hl");
    let c = conf("1.1.0", d.path(), json!({"subnet": "10.1.2.0/24"}));
    let net = d.path().join("mynet");
    let (a, b) = (PodNetns::new("hlb"), PodNetns::new("hlb"));
    hl_at("ADD", "a", a.path()).run_json(&c).success();
    hl_at("ADD", "b", b.path()).run_json(&c).success();
    std::fs::write(net.join("10.1.2.50"), "upstream\r\neth0").unwrap(); // no record: live
                                                                        // A reboot, as the store sees it: every record and the marker carry another boot id.
    let other = "0123456789abcdef0123456789abcdef";
    for entry in std::fs::read_dir(net.join(".host-local-ns")).unwrap() {
        let p = entry.unwrap().path();
        let text = std::fs::read_to_string(&p).unwrap();
        std::fs::write(&p, text.replace(&boot_id_hex(), other)).unwrap();
    }
    let c3 = PodNetns::new("hlb");
    let out = hl_at("ADD", "c", c3.path()).run_json(&c).success();
    for (ip, id) in [("10.1.2.2", "a"), ("10.1.2.3", "b")] {
        let line = format!(
            "network mynet: first ADD since a reboot: released {ip} of container {id} interface eth0: it was made before the last reboot"
        );
        assert!(out.stderr.contains(&line), "{}", out.stderr);
    }
    let left: Vec<String> = reservations(&net).into_iter().map(|(ip, c)| format!("{ip}={c}")).collect();
    assert_eq!(left, ["10.1.2.4=c\r\neth0", "10.1.2.50=upstream\r\neth0"]);
    let marker = std::fs::read_to_string(net.join(".host-local-ns/boot")).unwrap();
    assert!(marker.ends_with(&format!("{}\n", boot_id_hex())), "{marker}");
    // once per boot: the next ADD does not look again
    let d4 = PodNetns::new("hlb");
    let out = hl_at("ADD", "d", d4.path()).run_json(&c).success();
    assert_eq!(out.stderr, "");
}

#[test]
fn a_late_del_never_frees_what_a_new_incarnation_holds() {
    let d = TempDir::new("hl");
    // one address: 10.1.2.2
    let c = conf("1.1.0", d.path(), json!({"subnet": "10.1.2.0/30"}));
    let net = d.path().join("mynet");
    let first = PodNetns::new("hli");
    let first_path = first.path().to_string();
    hl_at("ADD", "x", &first_path).run_json(&c).success();
    // The container's namespace goes without a DEL; the runtime starts it again under the
    // same id: its earlier reservation is provably dead and is released for it.
    first.delete();
    let second = PodNetns::new("hli");
    let out = hl_at("ADD", "x", second.path()).run_json(&c).success();
    assert_eq!(result_ips(&out.json()), ["10.1.2.2"]);
    assert!(
        out.stderr.contains("released 10.1.2.2 of an earlier incarnation of container x interface eth0"),
        "{}",
        out.stderr
    );
    let before = dir_state(d.path());
    // The late DEL of the first incarnation names its (gone) namespace: nothing is freed.
    let late = hl_at("DEL", "x", &first_path).run_json(&c).success();
    assert!(late.stderr.contains("10.1.2.2 left alone"), "{}", late.stderr);
    assert_store_unchanged(&before, &dir_state(d.path()));
    // With a live holder the same applies to a DEL naming any other namespace.
    let stranger = PodNetns::new("hli");
    hl_at("DEL", "x", stranger.path()).run_json(&c).success();
    assert_store_unchanged(&before, &dir_state(d.path()));
    // The DEL of the live incarnation releases it.
    hl_at("DEL", "x", second.path()).run_json(&c).success();
    assert!(reservations(&net).is_empty());
}

#[test]
fn a_live_namespace_is_never_reclaimed_whoever_holds_it() {
    let d = TempDir::new("hl");
    let c = conf("1.1.0", d.path(), json!({"subnet": "10.1.2.0/29"})); // .2 … .6
    let net = d.path().join("mynet");
    // Three pods whose bind mounts go away, each kept alive another way: a process inside it,
    // a second bind mount elsewhere, and a bind mount under another name in /run/netns.
    let pods: Vec<PodNetns> = (0..5).map(|_| PodNetns::new("hll")).collect();
    for (i, p) in pods.iter().enumerate() {
        hl_at("ADD", &format!("p{i}"), p.path()).run_json(&c).success();
    }
    let elsewhere = TempDir::new("hll-mnt");
    let pin = elsewhere.join("pinned");
    std::fs::write(&pin, "").unwrap();
    cni_tests::sh("mount", &["--bind", pods[1].path(), pin.to_str().unwrap()]);
    let alias = format!("{}-alias", pods[2].name());
    std::fs::write(format!("/run/netns/{alias}"), "").unwrap();
    cni_tests::sh("mount", &["--bind", pods[2].path(), &format!("/run/netns/{alias}")]);
    let mut sleeper = std::process::Command::new("ip")
        .args(["netns", "exec", pods[0].name(), "sleep", "60"])
        .spawn()
        .unwrap();
    cni_tests::wait_until("the sleeper to enter its namespace", std::time::Duration::from_secs(10), || {
        let link = std::fs::read_link(format!("/proc/{}/ns/net", sleeper.id())).unwrap_or_default();
        link != std::fs::read_link("/proc/self/ns/net").unwrap()
    });
    let mut it = pods.into_iter();
    let (p0, p1, p2, p3, p4) =
        (it.next().unwrap(), it.next().unwrap(), it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
    p0.delete();
    p1.delete();
    p2.delete();
    p3.delete(); // the only dead one
    let before: Vec<(String, String)> =
        reservations(&net).into_iter().filter(|r| r.1 != "p3\r\neth0").collect();
    let newcomer = PodNetns::new("hll");
    let out = hl_at("ADD", "new", newcomer.path()).run_json(&c).success();
    assert_eq!(result_ips(&out.json()), ["10.1.2.5"], "p3's address");
    assert_eq!(out.stderr.matches("released").count(), 1, "{}", out.stderr);
    let after: Vec<(String, String)> =
        reservations(&net).into_iter().filter(|r| r.1 != "new\r\neth0").collect();
    assert_eq!(after, before, "the pods held by a process or a mount keep their addresses");
    // full again, nothing else is dead
    let late = PodNetns::new("hll");
    hl_at("ADD", "late", late.path()).run_json(&c).err_with(999, "no IP addresses available");
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    cni_tests::sh("umount", &[pin.to_str().unwrap()]);
    cni_tests::sh("umount", &[&format!("/run/netns/{alias}")]);
    let _ = std::fs::remove_file(format!("/run/netns/{alias}"));
    drop(p4);
}

/// A process holding a network namespace open by a descriptor only; killed (and reaped) on
/// drop, which closes the descriptor.
struct FdHolder(std::process::Child);

impl FdHolder {
    /// `sh` opens `path` as its descriptor 3, says so, then becomes `sleep` (which keeps it):
    /// its own network namespace stays the test's.
    fn new(path: &str) -> FdHolder {
        use std::io::BufRead;
        let mut child = std::process::Command::new("sh")
            .args(["-c", "exec 3<\"$1\" && echo open && exec sleep 600", "sh", path])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let holder = FdHolder(child);
        assert_eq!(line, "open\n", "the helper could not open {path}");
        holder
    }
}

impl Drop for FdHolder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_namespace_held_only_by_an_open_descriptor_is_not_reclaimed_until_it_is_closed() {
    let d = TempDir::new("hl");
    let c = conf("1.1.0", d.path(), json!({"subnet": "10.1.2.0/30"})); // one address: .2
    let net = d.path().join("mynet");
    let pod = PodNetns::new("hlfd");
    hl_at("ADD", "held", pod.path()).run_json(&c).success();
    let pod_path = pod.path().to_string();
    let ino = std::fs::metadata(&pod_path).unwrap().ino();
    let holder = FdHolder::new(&pod_path);
    let pid = holder.0.id();
    // opened through the bind mount, the descriptor's link shows the mount point (and "/" once
    // the mount is gone), not net:[…]: its fdinfo has the namespace's inode
    let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/3")).unwrap();
    assert!(
        info.lines().any(|l| l == format!("ino:\t{ino}")),
        "the helper holds the pod's namespace open: {info}"
    );
    assert_eq!(
        std::fs::read_link(format!("/proc/{pid}/ns/net")).unwrap(),
        std::fs::read_link("/proc/thread-self/ns/net").unwrap(),
        "the helper is not in the pod's namespace: only its descriptor holds it"
    );
    pod.delete(); // the bind mount goes: no mount, no process inside, one descriptor
    let before = dir_state(d.path());
    let newcomer = PodNetns::new("hlfd");
    let out = hl_at("ADD", "new", newcomer.path()).run_json(&c).err_with(999, "no IP addresses available");
    assert!(!out.stderr.contains("released"), "{}", out.stderr);
    assert_store_unchanged(&before, &dir_state(d.path()));
    assert_eq!(reservations(&net), [("10.1.2.2".to_string(), "held\r\neth0".to_string())]);
    // the descriptor is closed: nothing holds the namespace any more
    drop(holder);
    let out = hl_at("ADD", "new", newcomer.path()).run_json(&c).success();
    assert_eq!(result_ips(&out.json()), ["10.1.2.2"]);
    let line = format!(
        "released 10.1.2.2 of container held interface eth0: its network namespace {pod_path} no longer \
         exists and no process, mount or open descriptor holds it"
    );
    assert!(out.stderr.contains(&line), "{}", out.stderr);
    assert_eq!(reservations(&net), [("10.1.2.2".to_string(), "new\r\neth0".to_string())]);
}

/// Namespace inode numbers are handed out lowest-free-first: a namespace made after a pod's was
/// freed often gets its number, and whoever holds the new one (an agent, a test, another pod's
/// runtime) must not keep the dead pod's reservation alive. Here the record is pointed at a
/// live namespace held only by this test's descriptor (its inode, the dead pod's cookie): the
/// descriptor's file is looked at, is another namespace, and the reservation is released.
#[test]
fn a_later_namespace_with_the_dead_ones_inode_number_does_not_keep_it_alive() {
    let d = TempDir::new("hl");
    let c = conf("1.1.0", d.path(), json!({"subnet": "10.1.2.0/30"})); // one address: .2
    let net = d.path().join("mynet");
    let pod = PodNetns::new("hlre");
    hl_at("ADD", "dead", pod.path()).run_json(&c).success();
    let pod_path = pod.path().to_string();
    // the later namespace, held by a descriptor of this process only
    let later = PodNetns::new("hlre");
    let held = std::fs::File::open(later.path()).unwrap();
    let later_ino = held.metadata().unwrap().ino();
    later.delete();
    let record = net.join(".host-local-ns/10.1.2.2");
    let text = std::fs::read_to_string(&record).unwrap();
    let netns_line = text.lines().find(|l| l.starts_with("netns ")).expect("a netns line").to_string();
    let fields: Vec<&str> = netns_line.split(' ').collect();
    assert_eq!(fields[3], pod_path, "{netns_line}");
    assert_ne!(fields[2], "0", "a netns cookie is recorded (Linux 5.14; not under qemu-user): {netns_line}");
    let pointed = format!("netns {later_ino} {} {}", fields[2], fields[3]);
    std::fs::write(&record, text.replace(&netns_line, &pointed)).unwrap();
    pod.delete();
    let newcomer = PodNetns::new("hlre");
    let out = hl_at("ADD", "new", newcomer.path()).run_json(&c).success();
    assert_eq!(result_ips(&out.json()), ["10.1.2.2"]);
    assert!(out.stderr.contains("released 10.1.2.2 of container dead interface eth0"), "{}", out.stderr);
    assert_eq!(reservations(&net), [("10.1.2.2".to_string(), "new\r\neth0".to_string())]);
    drop(held);
}

#[test]
fn churn_with_random_namespace_deletion_never_gives_one_address_to_two_live_namespaces() {
    let cycles: usize = std::env::var("CNI_HL_CHURN_CYCLES").ok().and_then(|v| v.parse().ok()).unwrap_or(240);
    let workers = 4;
    let d = TempDir::new("hl");
    // 13 addresses; at most 4 workers x 3 live pods = 12 live at once, the rest leak by dying
    let c = conf("1.1.0", d.path(), json!({"subnet": "10.1.2.0/28"}));
    let net = d.path().join("mynet");
    let next = std::sync::atomic::AtomicUsize::new(0);
    let live: std::sync::Mutex<std::collections::HashMap<String, String>> = Default::default();
    let (reclaimed, deleted, exhausted) = (
        std::sync::atomic::AtomicUsize::new(0),
        std::sync::atomic::AtomicUsize::new(0),
        std::sync::atomic::AtomicUsize::new(0),
    );
    std::thread::scope(|s| {
        for w in 0..workers {
            let (c, net, next, live, reclaimed, deleted, exhausted) =
                (&c, &net, &next, &live, &reclaimed, &deleted, &exhausted);
            s.spawn(move || {
                let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (w as u64 + 1);
                let mut mine: std::collections::VecDeque<(String, String, PodNetns)> = Default::default();
                loop {
                    let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if k >= cycles {
                        break;
                    }
                    let ns = PodNetns::new("hlc");
                    let id = format!("churn-{w}-{k}");
                    let out = hl_at("ADD", &id, ns.path()).run_json(c);
                    if out.stdout.contains("no IP addresses available") {
                        // a legitimate refusal: 4 workers hold up to 3 pods each, plus the one
                        // each may be tearing down (out of the live set, namespace not yet
                        // gone): 16 > 13 addresses at the worst moment. Never a shared address.
                        if exhausted.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 0 {
                            eprintln!("cycle {k}: the first refusal on a full pool: {}", out.stderr);
                        }
                        continue;
                    }
                    if out.code != 0 {
                        // this worker's pods leave the live set before their namespaces go
                        // with the unwinding: another worker may then take their addresses
                        let mut l = live.lock().unwrap();
                        for (_, ip, _) in &mine {
                            l.remove(ip);
                        }
                        drop(l);
                        panic!("cycle {k}: {} {}", out.stdout, out.stderr);
                    }
                    reclaimed.fetch_add(
                        out.stderr.matches("released").count(),
                        std::sync::atomic::Ordering::Relaxed,
                    );
                    let ip = result_ips(&out.json())[0].clone();
                    if let Some(other) = live.lock().unwrap().insert(ip.clone(), id.clone()) {
                        panic!("{ip} given to {id} while {other}'s namespace is alive");
                    }
                    mine.push_back((id, ip, ns));
                    if mine.len() < 3 {
                        continue;
                    }
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let (id, ip, ns) = mine.pop_front().unwrap();
                    // no longer live before its namespace goes: its address may be reused from then on
                    live.lock().unwrap().remove(&ip);
                    match rng % 3 {
                        0 => {
                            hl_at("DEL", &id, ns.path()).run_json(c).success();
                            ns.delete();
                        }
                        1 => {
                            ns.delete(); // died without a DEL
                            deleted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        _ => {
                            // died without a DEL, and another namespace took its name
                            let name = ns.name().to_string();
                            ns.delete();
                            let _again = PodNetns::named(&name);
                            deleted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                }
                // the pods still alive hold what they were given
                for (id, ip, ns) in mine {
                    assert_eq!(std::fs::read_to_string(net.join(&ip)).unwrap(), format!("{id}\r\neth0"));
                    hl_at("DEL", &id, ns.path()).run_json(c).success();
                    live.lock().unwrap().remove(&ip);
                }
            });
        }
    });
    let (r, dd, full) = (reclaimed.into_inner(), deleted.into_inner(), exhausted.into_inner());
    eprintln!(
        "churn: {cycles} ADDs, {dd} pods died without DEL, {r} of their addresses reclaimed, {full} ADDs refused \
         on a pool whose dead could not all be proven dead at that moment"
    );
    assert!(r > 0 && dd > 0, "the pool never ran out: nothing was reclaimed");
    assert!(live.lock().unwrap().is_empty());
}

// ---- full, read-only and hostile stores (issues 18 and 21) ----

/// A filesystem mounted on a scratch directory for one test, unmounted on drop.
struct Mount(TempDir);

impl Mount {
    /// A tmpfs of `size` (`mount -t tmpfs -o size=…`).
    fn tmpfs(size: &str) -> Mount {
        let m = TempDir::new("hl-mnt");
        cni_tests::sh("mount", &["-t", "tmpfs", "-o", &format!("size={size},mode=0755"), "tmpfs", m.str()]);
        Mount(m)
    }

    /// `src` again, read-only.
    fn read_only(src: &Path) -> Mount {
        let m = TempDir::new("hl-ro");
        cni_tests::sh("mount", &["--bind", src.to_str().unwrap(), m.str()]);
        cni_tests::sh("mount", &["-o", "remount,bind,ro", m.str()]);
        Mount(m)
    }

    fn path(&self) -> &Path {
        self.0.path()
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(self.0.path()).output();
    }
}

/// Fill the filesystem of `dir` with a file `name` until it has no space left.
fn fill(dir: &Path, name: &str) -> std::path::PathBuf {
    use std::io::Write;
    let p = dir.join(name);
    let mut f = std::fs::File::create(&p).unwrap();
    let chunk = vec![0u8; 4096];
    while f.write_all(&chunk).is_ok() {}
    p
}

#[test]
fn a_full_store_still_serves_del_check_and_gc() {
    let ns = Netns::new("hl");
    let m = Mount::tmpfs("256k");
    let c = conf("1.1.0", m.path(), json!({"subnet": "10.1.2.0/24"}));
    let net = m.path().join("mynet");
    let mut results = Vec::new();
    for id in ["a", "b", "c"] {
        results.push(hl("ADD", id, &ns).run_json(&c).success().json());
    }
    // Another program changed the store: the index is no longer trusted and would be rebuilt.
    std::fs::write(net.join("10.1.2.99"), "upstream\r\neth0").unwrap();
    let filler = fill(m.path(), "filler");
    let before = dir_state(&net);
    // CHECK, with and without prevResult: succeeds and writes nothing
    let mut chk = c.clone();
    chk["prevResult"] = results[1].clone();
    hl("CHECK", "b", &ns).run_json(&chk).success();
    hl("CHECK", "b", &ns).run_json(&c).success();
    assert_store_unchanged(&before, &dir_state(&net));
    // DEL removes its file and record, nothing else (no index could be written)
    hl("DEL", "a", &ns).run_json(&c).success();
    let gone: Vec<String> = ["10.1.2.2", ".host-local-ns/10.1.2.2"].iter().map(|f| f.to_string()).collect();
    let expect: Vec<(String, Vec<u8>)> = before.iter().filter(|(n, _)| !gone.contains(n)).cloned().collect();
    assert_store_unchanged(&expect, &dir_state(&net));
    // GC too
    let mut gc = c.clone();
    gc["cni.dev/valid-attachments"] =
        json!([{"containerID": "b", "ifname": "eth0"}, {"containerID": "upstream", "ifname": "eth0"}]);
    hl("GC", "", &ns).run_json(&gc).success();
    let left: Vec<String> = reservations(&net).into_iter().map(|(ip, _)| ip).collect();
    assert_eq!(left, ["10.1.2.3", "10.1.2.99"]);
    // ADD needs space (the removals above freed some: fill it again): code 5 naming the
    // reason, and the store as it was
    let filler2 = fill(m.path(), "filler2");
    let before = dir_state(&net);
    hl("ADD", "d", &ns).run_json(&c).err_with(5, "No space left on device");
    assert_store_unchanged(&before, &dir_state(&net));
    // A full disk is not an unusable store (README.md, "STATUS")
    hl("STATUS", "", &ns).run_json(&c).ok_silent();
    // With room again everything works, and the index is rebuilt
    std::fs::remove_file(filler).unwrap();
    std::fs::remove_file(filler2).unwrap();
    hl("ADD", "d", &ns).run_json(&c).success();
    hl("DEL", "b", &ns).run_json(&c).success();
    hl("DEL", "d", &ns).run_json(&c).success();
    assert_eq!(reservations(&net), [("10.1.2.99".into(), "upstream\r\neth0".into())]);
    assert!(net.join(".host-local-index").exists());
}

#[test]
fn a_read_only_store_serves_check_and_whatever_needs_no_write() {
    let ns = Netns::new("hl");
    let d = TempDir::new("hl");
    let rw = conf("1.1.0", d.path(), json!({"subnet": "10.1.2.0/24"}));
    let a = hl("ADD", "a", &ns).run_json(&rw).success().json();
    hl("ADD", "b", &ns).run_json(&rw).success();
    std::fs::write(d.join("mynet/10.1.2.99"), "upstream\r\neth0").unwrap(); // index untrusted
    let ro = Mount::read_only(d.path());
    let c = conf("1.1.0", ro.path(), json!({"subnet": "10.1.2.0/24"}));
    let before = dir_state(d.path());
    let mut chk = c.clone();
    chk["prevResult"] = a;
    hl("CHECK", "a", &ns).run_json(&chk).success();
    hl("CHECK", "a", &ns).run_json(&c).success();
    hl("DEL", "nobody", &ns).run_json(&c).success();
    let mut gc = c.clone();
    gc["cni.dev/valid-attachments"] = json!([
        {"containerID": "a", "ifname": "eth0"}, {"containerID": "b", "ifname": "eth0"},
        {"containerID": "upstream", "ifname": "eth0"}
    ]);
    hl("GC", "", &ns).run_json(&gc).success();
    assert_store_unchanged(&before, &dir_state(d.path()));
    // What needs a write fails with code 5 naming the file; STATUS says no ADD can work.
    hl("DEL", "a", &ns).run_json(&c).err_with(5, "10.1.2.2: Read-only file system");
    hl("ADD", "c", &ns).run_json(&c).err_with(5, "Read-only file system");
    hl("STATUS", "", &ns).run_json(&c).err_with(50, "is not writable: Read-only file system");
    assert_store_unchanged(&before, &dir_state(d.path()));
}

#[test]
fn check_and_status_never_write() {
    let ns = Netns::new("hl");
    let d = TempDir::new("hl");
    let net = d.path().join("mynet");
    // as upstream leaves a store (no index of ours), but without its lock file
    std::fs::create_dir_all(&net).unwrap();
    std::fs::write(net.join("10.1.2.2"), "a\r\neth0").unwrap();
    let c = conf("1.1.0", d.path(), json!({"subnet": "10.1.2.0/24", "reportExhaustionInStatus": true}));
    let before = dir_state(d.path());
    hl("CHECK", "a", &ns).run_json(&c).success();
    let mut chk = c.clone();
    chk["prevResult"] = json!({"cniVersion": "1.1.0", "ips": [{"address": "10.1.2.2/24"}]});
    hl("CHECK", "a", &ns).run_json(&chk).success();
    hl("CHECK", "z", &ns).run_json(&c).err_with(999, "Failed to find address");
    hl("STATUS", "", &ns).run_json(&c).ok_silent();
    assert_store_unchanged(&before, &dir_state(d.path()));
}

#[test]
fn nothing_in_the_store_is_followed_or_waited_on() {
    let ns = Netns::new("hl");
    let d = TempDir::new("hl");
    let net = d.path().join("mynet");
    let c = conf("1.1.0", d.path(), json!({"subnet": "10.1.2.0/24"}));
    hl("ADD", "a", &ns).run_json(&c).success();
    let limit = std::time::Duration::from_secs(20);
    // A FIFO named like an address: the scan of a rebuild (foreign change) skips it without
    // blocking, ADD passes over it, GC leaves it, CHECK and DEL finish.
    cni_tests::sh("mkfifo", &[net.join("10.1.2.3").to_str().unwrap()]);
    let out = hl("ADD", "b", &ns).run_within(&c.to_string(), limit).success();
    assert_eq!(result_ips(&out.json()), ["10.1.2.4"]);
    assert!(
        out.stderr.contains("skipping") && out.stderr.contains("not a regular file but a FIFO"),
        "{}",
        out.stderr
    );
    let mut gc = c.clone();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "b", "ifname": "eth0"}]);
    hl("GC", "", &ns).run_within(&gc.to_string(), limit).success();
    hl("CHECK", "b", &ns).run_within(&c.to_string(), limit).success();
    hl("DEL", "b", &ns).run_within(&c.to_string(), limit).success();
    let mut req = c.clone();
    req["args"] = json!({"cni": {"ips": ["10.1.2.3"]}});
    let taken = hl("ADD", "c", &ns).run_within(&req.to_string(), limit).err_with(999, "is not available");
    assert_eq!(
        taken.json()["details"],
        "10.1.2.3 is reserved by no reservation file (not a regular file but a FIFO)"
    );
    assert!(std::fs::symlink_metadata(net.join("10.1.2.3")).unwrap().file_type().is_fifo());
    assert!(reservations(&net).is_empty());
    // A crafted index header (valid checksum, a slot count whose size wraps): ignored and
    // replaced by a rebuilt index.
    std::fs::write(net.join(".host-local-index"), cni_tests::crafted_index_header(1 << 59)).unwrap();
    hl("ADD", "d", &ns).run_json(&c).success();
    hl("DEL", "d", &ns).run_json(&c).success();
    assert!(std::fs::metadata(net.join(".host-local-index")).unwrap().len() > 4096, "rebuilt");
}

#[test]
fn a_held_lock_is_waited_for_until_the_deadline() {
    let ns = Netns::new("hl");
    let d = TempDir::new("hl");
    let c = conf("1.1.0", d.path(), json!({"subnet": "10.1.2.0/24", "lockTimeout": 1}));
    hl("ADD", "a", &ns).run_json(&c).success();
    let lock = std::fs::File::open(d.join("mynet/lock")).unwrap();
    lock.lock().unwrap();
    let before = dir_state(d.path());
    let msg = format!("lock {}: still held by another process after 1s", d.join("mynet/lock").display());
    hl("ADD", "b", &ns).run_json(&c).err_with(11, &msg);
    hl("DEL", "a", &ns).run_json(&c).err_with(11, &msg);
    assert_store_unchanged(&before, &dir_state(d.path()));
    drop(lock);
    hl("DEL", "a", &ns).run_json(&c).success();
    let mut bad = c.clone();
    bad["ipam"]["lockTimeout"] = json!(0);
    hl("ADD", "b", &ns).run_json(&bad).err_with(7, "ipam.lockTimeout 0 is out of range");
}

#[test]
fn status_fails_only_when_no_add_could_work() {
    use std::os::unix::fs::PermissionsExt;
    let ns = Netns::new("hl");
    let d = TempDir::new("hl");
    let status = |c: &Value| hl("STATUS", "", &ns).run_json(c);
    let c = conf("1.1.0", d.path(), json!({"subnet": "10.1.2.0/24"}));
    status(&c).ok_silent(); // not created yet: the parent takes it
    hl("ADD", "a", &ns).run_json(&c).success();
    status(&c).ok_silent();
    let net = d.path().join("mynet");
    // what STATUS must name, how to break the store, how to repair it
    type Breakage<'a> = (&'a str, Box<dyn Fn() + 'a>, Box<dyn Fn() + 'a>);
    let cases: Vec<Breakage> = vec![
        (
            "group or others may write it (mode 0777)",
            Box::new(|| std::fs::set_permissions(&net, std::fs::Permissions::from_mode(0o777)).unwrap()),
            Box::new(|| std::fs::set_permissions(&net, std::fs::Permissions::from_mode(0o755)).unwrap()),
        ),
        (
            "lock is a FIFO, not a regular file",
            Box::new(|| {
                std::fs::remove_file(net.join("lock")).unwrap();
                cni_tests::sh("mkfifo", &[net.join("lock").to_str().unwrap()]);
            }),
            Box::new(|| {
                std::fs::remove_file(net.join("lock")).unwrap();
                std::fs::write(net.join("lock"), "").unwrap();
            }),
        ),
        (
            "last_reserved_ip.0 is a symbolic link, not a regular file",
            Box::new(|| {
                std::fs::remove_file(net.join("last_reserved_ip.0")).unwrap();
                std::os::unix::fs::symlink("/etc/hostname", net.join("last_reserved_ip.0")).unwrap();
            }),
            Box::new(|| {
                std::fs::remove_file(net.join("last_reserved_ip.0")).unwrap();
                std::fs::write(net.join("last_reserved_ip.0"), "10.1.2.2").unwrap();
            }),
        ),
    ];
    for (why, break_it, repair) in cases {
        break_it();
        let before = dir_state(d.path());
        status(&c).err_with(50, why);
        hl("ADD", "b", &ns).run_json(&c).err(5);
        assert_store_unchanged(&before, &dir_state(d.path()));
        repair();
        status(&c).ok_silent();
    }
    // a store directory that is a symbolic link, or a file
    let real = TempDir::new("hl-real");
    let linked = TempDir::new("hl-link");
    std::os::unix::fs::symlink(real.path(), linked.join("mynet")).unwrap();
    status(&conf("1.1.0", linked.path(), json!({"subnet": "10.1.2.0/24"})))
        .err_with(50, "is a symbolic link, not a directory");
    let file = TempDir::new("hl-file");
    std::fs::write(file.join("mynet"), "").unwrap();
    status(&conf("1.1.0", file.path(), json!({"subnet": "10.1.2.0/24"})))
        .err_with(50, "is a regular file, not a directory");
    // an exhausted pool is ADD's to report, unless asked for
    let tiny = conf("1.1.0", d.path(), json!({"subnet": "10.1.3.0/30"}));
    hl("ADD", "t", &ns).run_json(&tiny).success();
    status(&tiny).ok_silent();
    let mut opt_in = tiny.clone();
    opt_in["ipam"]["reportExhaustionInStatus"] = json!(true);
    status(&opt_in).err_with(50, "no IP addresses available in range set 0");
}

/// STATUS with `reportExhaustionInStatus` on an exhausted set is fine when a reservation is
/// provably dead: ADD would reclaim it. (Needs netns cookies: other tests make namespaces all
/// the time, one of them often gets the dead one's inode number, and without a cookie that
/// one cannot be told from it.)
#[test]
fn status_counts_a_provably_dead_reservation_as_room() {
    let ns = Netns::new("hl");
    let d = TempDir::new("hl");
    let status = |c: &Value| hl("STATUS", "", &ns).run_json(c);
    let tiny = conf("1.1.0", d.path(), json!({"subnet": "10.1.3.0/30"}));
    let mut opt_in = tiny.clone();
    opt_in["ipam"]["reportExhaustionInStatus"] = json!(true);
    let pod = PodNetns::new("hls");
    hl_at("ADD", "gone", pod.path()).run_json(&tiny).success();
    status(&opt_in).err_with(50, "no IP addresses available in range set 0");
    pod.delete();
    let before = dir_state(d.path());
    status(&opt_in).ok_silent();
    assert_store_unchanged(&before, &dir_state(d.path()));
}
