//! The firewall plugin on hosts where someone else's filter drops forwarded traffic (Docker's
//! FORWARD policy DROP, written with iptables-nft and with iptables-legacy), and the live swap
//! with upstream v1.10's firewall (scripts/install-peers.sh builds it): each finds, checks and
//! deletes what the other wrote. Every namespace is a scratch one.

use cni_tests::{Exec, Netns, PodNetns};
use serde_json::{json, Value};
use std::path::PathBuf;

fn upstream_firewall() -> PathBuf {
    let out = std::process::Command::new(cni_tests::workspace_root().join("scripts/install-peers.sh"))
        .arg("--print-dir")
        .arg("plugins")
        .output()
        .expect("run scripts/install-peers.sh");
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let p = PathBuf::from(dir).join("firewall");
    assert!(p.is_file(), "upstream firewall v1.10 missing at {}: run scripts/install-peers.sh", p.display());
    p
}

fn conf(net: &str, extra: Value) -> Value {
    let mut c = json!({
        "cniVersion": "1.0.0", "name": net, "type": "firewall",
        "prevResult": {"cniVersion": "1.0.0", "interfaces": [{"name": "cni0"}],
            "ips": [{"address": "10.88.0.5/16"}, {"address": "fd00:88::5/64"}]}
    });
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    c
}

fn call(plugin: &str, verb: &str, host: &Netns, pod: &PodNetns, c: &Value) -> cni_tests::PluginOutput {
    Exec::new(plugin).in_ns(host).attachment(verb, "ctr-fw", pod.path(), "eth0", "/nonexistent").run_json(c)
}

fn save(host: &Netns, tool: &str) -> String {
    String::from_utf8_lossy(&host.run(tool, &["-S"]).stdout).into_owned()
}

const IN_RULE: &str = "-A CNI-FORWARD -d 10.88.0.5/32 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT";
const OUT_RULE: &str = "-A CNI-FORWARD -s 10.88.0.5/32 -j ACCEPT";
const JUMP: &str = "-A FORWARD -m comment --comment \"CNI firewall plugin rules\" -j CNI-FORWARD";

/// Docker on iptables-nft: our default backend writes upstream's rules over netlink into the
/// chain that drops, and iptables-nft lists them as its own.
#[test]
fn docker_drop_with_iptables_nft() {
    let host = Netns::new("fwnft");
    let pod = PodNetns::new("fwpod");
    host.run("iptables-nft", &["-P", "FORWARD", "DROP"]);
    let net = format!("fwnft-{}", std::process::id());
    let c = conf(&net, json!({}));
    let out = call("firewall", "ADD", &host, &pod, &c);
    out.ok();
    let v4 = save(&host, "iptables-nft");
    for want in ["-P FORWARD DROP", JUMP, IN_RULE, OUT_RULE, "-N CNI-ADMIN"] {
        assert!(v4.contains(want), "{want} missing from iptables-nft -S:\n{v4}");
    }
    assert!(save(&host, "ip6tables-nft").contains("-A CNI-FORWARD -s fd00:88::5/128 -j ACCEPT"));
    // upstream's CHECK (iptables -C of its own rules) finds ours; so does ours
    let up = upstream_firewall();
    call(up.to_str().unwrap(), "CHECK", &host, &pod, &conf(&net, json!({"backend": "iptables"}))).ok_silent();
    call("firewall", "CHECK", &host, &pod, &c).ok_silent();
    call("firewall", "DEL", &host, &pod, &c).ok_silent();
    let after = save(&host, "iptables-nft");
    assert!(!after.contains(IN_RULE) && !after.contains(OUT_RULE), "{after}");
    assert!(after.contains("-P FORWARD DROP"), "the host's policy stays: {after}");
    let check = call("firewall", "CHECK", &host, &pod, &c);
    assert_ne!(check.code, 0, "CHECK after DEL must fail: {}", check.stdout);
    // DEL again: nothing to do, success
    call("firewall", "DEL", &host, &pod, &c).ok_silent();
}

/// Upstream's firewall made the attachment (iptables backend on iptables-nft); ours checks and
/// deletes it, then a GC with no valid attachment leaves nothing of ours either.
#[test]
fn upstreams_state_is_checked_and_deleted_by_ours() {
    let host = Netns::new("fwswap");
    let pod = PodNetns::new("fwpod");
    let net = format!("fwswap-{}", std::process::id());
    let up = upstream_firewall();
    let c = conf(&net, json!({"backend": "iptables", "iptablesAdminChainName": "NOMAD-ADMIN"}));
    call(up.to_str().unwrap(), "ADD", &host, &pod, &c).ok();
    call("firewall", "CHECK", &host, &pod, &c).ok_silent();
    let ours = conf(&net, json!({"iptablesAdminChainName": "NOMAD-ADMIN"}));
    call("firewall", "CHECK", &host, &pod, &ours).ok_silent();
    call("firewall", "DEL", &host, &pod, &ours).ok_silent();
    let after = save(&host, "iptables-nft");
    assert!(!after.contains(IN_RULE) && !after.contains(OUT_RULE), "{after}");
    // ours again, then GC with an empty valid list removes it by its record
    let gc_conf = |v: Value| {
        let mut g = conf(&net, json!({}));
        g["cniVersion"] = json!("1.1.0");
        g.as_object_mut().unwrap().remove("prevResult");
        g["cni.dev/valid-attachments"] = v;
        g
    };
    call("firewall", "ADD", &host, &pod, &ours).ok();
    Exec::new("firewall")
        .in_ns(&host)
        .env("CNI_COMMAND", "GC")
        .env("CNI_PATH", "/nonexistent")
        .run_json(&gc_conf(json!([{"containerID": "ctr-fw", "ifname": "eth0"}])))
        .ok_silent();
    assert!(save(&host, "iptables-nft").contains(OUT_RULE), "a valid attachment keeps its rules");
    Exec::new("firewall")
        .in_ns(&host)
        .env("CNI_COMMAND", "GC")
        .env("CNI_PATH", "/nonexistent")
        .run_json(&gc_conf(json!([])))
        .ok_silent();
    let gone = save(&host, "iptables-nft");
    assert!(!gone.contains(OUT_RULE) && !gone.contains(IN_RULE), "{gone}");
}

/// Docker on iptables-legacy: the drop is in x_tables, out of nf_tables' reach; the default
/// backend goes there through iptables-legacy.
#[test]
fn docker_drop_with_iptables_legacy() {
    let host = Netns::new("fwleg");
    let pod = PodNetns::new("fwpod");
    host.run("iptables-legacy", &["-P", "FORWARD", "DROP"]);
    let net = format!("fwleg-{}", std::process::id());
    let c = conf(&net, json!({}));
    call("firewall", "ADD", &host, &pod, &c).ok();
    let v4 = save(&host, "iptables-legacy");
    for want in ["-P FORWARD DROP", JUMP, IN_RULE, OUT_RULE] {
        assert!(v4.contains(want), "{want} missing from iptables-legacy -S:\n{v4}");
    }
    call("firewall", "CHECK", &host, &pod, &c).ok_silent();
    call("firewall", "DEL", &host, &pod, &c).ok_silent();
    let after = save(&host, "iptables-legacy");
    assert!(!after.contains(IN_RULE) && !after.contains(OUT_RULE), "{after}");
}
