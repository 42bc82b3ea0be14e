//! loopback, exec'd as a runtime would: every verb, every spec version.

use cni_tests::{ns_state, Exec, Netns};
use serde_json::json;

fn conf(version: &str) -> String {
    json!({"cniVersion": version, "name": "lo-test", "type": "loopback"}).to_string()
}

/// The config of `version` with `prev` as prevResult (what a runtime sends on CHECK).
fn with_prev(version: &str, prev: &serde_json::Value) -> String {
    json!({"cniVersion": version, "name": "lo-test", "type": "loopback", "prevResult": prev}).to_string()
}

const ALL: [&str; 7] = ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

fn exec<'a>(host: &'a Netns, cmd: &str, ctr: &Netns) -> Exec<'a> {
    Exec::new("loopback").in_ns(host).attachment(cmd, "ctr-lo-1", ctr.path_str(), "eth0", "/nonexistent")
}

#[test]
fn add_check_del_for_every_version() {
    let host = Netns::new("lohost");
    for v in ALL {
        let ctr = Netns::new("lo");
        assert!(!ctr.link_is_up("lo"), "a fresh netns starts with lo down");
        let result = exec(&host, "ADD", &ctr).run(&conf(v)).ok();
        assert!(ctr.link_is_up("lo"), "{v}: lo is up after ADD");
        assert_eq!(result["cniVersion"], v);
        // upstream 1.1.1 prints an empty "dns" object at every version it speaks (up to
        // 1.0.0; its own loopback test waits for it); 1.1.0 omits an empty one, as libcni 1.2+
        let dns = result.get("dns");
        if v == "1.1.0" {
            assert!(dns.is_none(), "{v}: {result}");
        } else {
            assert_eq!(dns, Some(&serde_json::json!({})), "{v}: {result}");
        }
        match v {
            "0.1.0" | "0.2.0" => {
                // correctly shaped for 0.x (upstream prints interfaces/ips labelled 0.2.0)
                assert_eq!(result["ip4"]["ip"], "127.0.0.1/8", "{result}");
                assert_eq!(result["ip6"]["ip"], "::1/128", "{result}");
                assert!(result.get("interfaces").is_none());
            }
            _ => {
                assert_eq!(result["interfaces"][0]["name"], "lo");
                assert_eq!(result["interfaces"][0]["mac"], "00:00:00:00:00:00");
                assert_eq!(result["interfaces"][0]["sandbox"], ctr.path_str());
                assert_eq!(result["ips"][0]["address"], "127.0.0.1/8");
                assert_eq!(result["ips"][0]["interface"], 0);
                assert_eq!(result["ips"][1]["address"], "::1/128");
                let has_version = result["ips"][0].get("version").is_some();
                assert_eq!(has_version, matches!(v, "0.3.0" | "0.3.1" | "0.4.0"), "{v}: {result}");
            }
        }
        if v >= "0.4.0" {
            exec(&host, "CHECK", &ctr).run(&with_prev(v, &result)).ok_silent();
        } else {
            let msg = exec(&host, "CHECK", &ctr).run(&conf(v)).err(1);
            assert_eq!(msg, "config version does not allow CHECK");
        }
        exec(&host, "DEL", &ctr).run(&conf(v)).ok_silent();
        assert!(!ctr.link_is_up("lo"), "{v}: lo is down after DEL");
        // DEL is idempotent
        exec(&host, "DEL", &ctr).run(&conf(v)).ok_silent();
    }
}

#[test]
fn check_fails_when_lo_is_down() {
    let host = Netns::new("lohost");
    let ctr = Netns::new("lo");
    let r = exec(&host, "ADD", &ctr).run(&conf("1.1.0")).ok();
    ctr.run("ip", &["link", "set", "lo", "down"]);
    let msg = exec(&host, "CHECK", &ctr).run(&with_prev("1.1.0", &r)).err(999);
    assert_eq!(msg, "loopback interface is down");
}

/// Regression: CHECK without prevResult succeeded; like every plugin's CHECK it is the spec's
/// error (code 7), whatever the state of `lo`.
#[test]
fn check_requires_prev_result() {
    let host = Netns::new("lohost");
    let ctr = Netns::new("lo");
    exec(&host, "ADD", &ctr).run(&conf("1.1.0")).ok();
    for v in ["0.4.0", "1.0.0", "1.1.0"] {
        let msg = exec(&host, "CHECK", &ctr).run(&conf(v)).err(7);
        assert_eq!(msg, "Required prevResult missing", "{v}");
    }
}

#[test]
fn prev_result_is_passed_through_in_the_config_version() {
    let host = Netns::new("lohost");
    let ctr = Netns::new("lo");
    let prev = json!({"cniVersion": "0.3.1", "interfaces": [{"name": "eth0", "sandbox": ctr.path_str()}],
                      "ips": [{"version": "4", "interface": 0, "address": "10.9.0.2/24", "gateway": "10.9.0.1"}]});
    let c = json!({"cniVersion": "1.0.0", "name": "n", "type": "loopback", "prevResult": prev}).to_string();
    let r = exec(&host, "ADD", &ctr).run(&c).ok();
    assert!(ctr.link_is_up("lo"));
    assert_eq!(r["cniVersion"], "1.0.0");
    assert_eq!(r["ips"], json!([{"interface": 0, "address": "10.9.0.2/24", "gateway": "10.9.0.1"}]));
    assert_eq!(r["interfaces"][0]["name"], "eth0");
}

/// DEL without a namespace to act on succeeds and touches nothing: not the namespace it runs in
/// (whose `lo` is up and must stay up), not another container's.
#[test]
fn del_succeeds_with_empty_or_vanished_netns() {
    let host = Netns::new("lohost");
    host.run("ip", &["link", "set", "lo", "up"]);
    let other = Netns::new("lo");
    exec(&host, "ADD", &other).run(&conf("1.1.0")).ok();
    let (host_before, other_before) = (ns_state(&host), ns_state(&other));
    let del = |netns: &str| Exec::new("loopback").in_ns(&host).attachment("DEL", "c1", netns, "eth0", "/x");
    let unchanged = |what: &str| {
        assert!(host.link_is_up("lo") && other.link_is_up("lo"), "{what}: a lo went down");
        assert_eq!(ns_state(&host), host_before, "{what}: the plugin's own namespace changed");
        assert_eq!(ns_state(&other), other_before, "{what}: another container changed");
    };
    del("").run(&conf("1.1.0")).ok_silent();
    unchanged("empty CNI_NETNS");
    del("/run/netns/does-not-exist").run(&conf("1.1.0")).ok_silent();
    unchanged("missing CNI_NETNS");
    // a netns deleted between ADD and DEL
    let ctr = Netns::new("lo");
    let path = ctr.path_str().to_string();
    exec(&host, "ADD", &ctr).run(&conf("1.1.0")).ok();
    drop(ctr);
    assert!(!std::path::Path::new(&path).exists(), "{path} is gone");
    del(&path).run(&conf("1.1.0")).ok_silent();
    unchanged("vanished CNI_NETNS");
}

#[test]
fn refuses_to_act_on_its_own_netns() {
    // CNI_NETNS pointing at the namespace the plugin runs in (the recycled-/proc-path bug of
    // plugins#714): refused with code 8 before anything is touched, for ADD and DEL.
    let host = Netns::new("lohost");
    host.run("ip", &["link", "set", "lo", "up"]);
    let before = ns_state(&host);
    for cmd in ["ADD", "DEL", "CHECK"] {
        let e = Exec::new("loopback").in_ns(&host).attachment(cmd, "c1", host.path_str(), "eth0", "/x");
        let msg = e.run(&conf("1.1.0")).err(8);
        assert!(msg.contains("should not be the same"), "{msg}");
    }
    assert!(host.link_is_up("lo"), "host lo untouched");
    assert_eq!(ns_state(&host), before);
}

/// loopback keeps no state outside the container: GC and STATUS succeed and change nothing,
/// neither where they run nor in a container whose `lo` an ADD brought up.
#[test]
fn gc_and_status_succeed_and_change_nothing() {
    let host = Netns::new("lohost");
    host.run("ip", &["link", "set", "lo", "up"]);
    let ctr = Netns::new("lo");
    exec(&host, "ADD", &ctr).run(&conf("1.1.0")).ok();
    let (host_before, ctr_before) = (ns_state(&host), ns_state(&ctr));
    let global = |cmd: &str| Exec::new("loopback").in_ns(&host).env("CNI_COMMAND", cmd).env("CNI_PATH", "/x");
    let gc = json!({"cniVersion": "1.1.0", "name": "lo-test", "type": "loopback", "cni.dev/valid-attachments": []});
    global("GC").run(&gc.to_string()).ok_silent();
    global("STATUS").run(&conf("1.1.0")).ok_silent();
    assert!(ctr.link_is_up("lo"), "GC of a network with no valid attachment took lo down");
    assert_eq!(ns_state(&host), host_before);
    assert_eq!(ns_state(&ctr), ctr_before);
    // Both are 1.1.0 verbs: refused for older configs, still without a change.
    global("GC").run(&conf("1.0.0")).err(1);
    global("STATUS").run(&conf("1.0.0")).err(1);
    assert_eq!(ns_state(&host), host_before);
}

#[test]
fn version_lists_every_spec_version() {
    let out = Exec::new("loopback").env("CNI_COMMAND", "VERSION").run("").ok();
    assert_eq!(out["supportedVersions"], json!(ALL));
}
