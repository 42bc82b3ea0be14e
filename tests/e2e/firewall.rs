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
/// Ours beyond upstream (issue 37): connections this host DNATed to the pod.
const DNAT_RULE: &str = "-A CNI-FORWARD -d 10.88.0.5/32 -m conntrack --ctstate DNAT -j ACCEPT";
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
    for want in ["-P FORWARD DROP", JUMP, IN_RULE, OUT_RULE, DNAT_RULE, "-N CNI-ADMIN"] {
        assert!(v4.contains(want), "{want} missing from iptables-nft -S:\n{v4}");
    }
    assert!(save(&host, "ip6tables-nft").contains("-A CNI-FORWARD -s fd00:88::5/128 -j ACCEPT"));
    // upstream's CHECK (iptables -C of its own rules) finds ours; so does ours
    let up = upstream_firewall();
    call(up.to_str().unwrap(), "CHECK", &host, &pod, &conf(&net, json!({"backend": "iptables"}))).ok_silent();
    call("firewall", "CHECK", &host, &pod, &c).ok_silent();
    call("firewall", "DEL", &host, &pod, &c).ok_silent();
    let after = save(&host, "iptables-nft");
    assert!(!after.contains(IN_RULE) && !after.contains(OUT_RULE) && !after.contains(DNAT_RULE), "{after}");
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
    let kept = save(&host, "iptables-nft");
    assert!(
        kept.contains(OUT_RULE) && kept.contains(DNAT_RULE),
        "a valid attachment keeps its rules: {kept}"
    );
    Exec::new("firewall")
        .in_ns(&host)
        .env("CNI_COMMAND", "GC")
        .env("CNI_PATH", "/nonexistent")
        .run_json(&gc_conf(json!([])))
        .ok_silent();
    let gone = save(&host, "iptables-nft");
    assert!(!gone.contains(OUT_RULE) && !gone.contains(IN_RULE) && !gone.contains(DNAT_RULE), "{gone}");
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

/// A fake host whose FORWARD policy is DROP (written with `tool`), with an "outside" namespace
/// on a veth (192.0.2.2 behind the host's 192.0.2.1) and br_netfilter's call into iptables on
/// when the kernel has it (then pod-to-pod traffic on the bridge meets the drop too).
struct DropHost {
    host: Netns,
    outside: Netns,
    path: cni_tests::TempDir,
    data: cni_tests::TempDir,
    bridged: bool,
}

impl DropHost {
    fn new(tool: &str) -> DropHost {
        let host = Netns::new("fwh");
        let outside = Netns::new("fwo");
        host.run("ip", &["link", "set", "lo", "up"]);
        host.run(
            "ip",
            &["link", "add", "up0", "type", "veth", "peer", "name", "eth0", "netns", outside.name()],
        );
        host.run("ip", &["addr", "add", "192.0.2.1/24", "dev", "up0"]);
        host.run("ip", &["link", "set", "up0", "up"]);
        outside.run("ip", &["addr", "add", "192.0.2.2/24", "dev", "eth0"]);
        outside.run("ip", &["link", "set", "eth0", "up"]);
        outside.run("ip", &["link", "set", "lo", "up"]);
        host.run(tool, &["-P", "FORWARD", "DROP"]);
        let bridged = cni_tests::skip_unless(cni_tests::Feature::BrNetfilter);
        if bridged {
            host.run("sysctl", &["-qw", "net.bridge.bridge-nf-call-iptables=1"]);
        }
        DropHost {
            host,
            outside,
            path: cni_tests::cni_path_with(&["bridge", "host-local", "firewall"]),
            data: cni_tests::TempDir::new("fwd"),
            bridged,
        }
    }

    fn chain(&self, name: &str, firewall: bool) -> cni_tests::chain::Chain {
        let mut plugins =
            vec![json!({"type": "bridge", "bridge": "fwbr0", "isGateway": true, "ipMasq": true,
            "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.77.0.0/24"}]],
                     "routes": [{"dst": "0.0.0.0/0"}], "dataDir": self.data.str()}})];
        if firewall {
            plugins.push(json!({"type": "firewall"}));
        }
        cni_tests::chain::Chain {
            name: name.into(),
            version: "1.0.0".into(),
            plugins,
            cni_path: self.path.path().to_path_buf(),
        }
    }
}

fn pod_addr(result: &Value) -> String {
    let a = result["ips"][0]["address"].as_str().expect("an address");
    a.split('/').next().unwrap().to_string()
}

fn pings(from: &Netns, to: &str) -> bool {
    from.try_run("ping", &["-c", "1", "-W", "2", to]).status.success()
}

/// The cni_common diagnosis, run in `ns` (on a thread of its own that enters it).
fn diagnose_in(ns: &Netns, subnet: &str) -> cni_common::forward_drop::Diagnosis {
    let subnet: ipnet::IpNet = subnet.parse().unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            ns.enter_current_thread();
            cni_common::forward_drop::diagnose(subnet)
        })
        .join()
        .unwrap()
    })
}

fn traffic_through(tool: &str) {
    let w = DropHost::new(tool);
    let net = format!("fwt-{tool}-{}", std::process::id());
    let subnet = "10.77.0.0/24";
    // without the firewall: the drop wins, and the diagnosis names the chain and the fix
    let bare = w.chain(&net, false);
    let p0 = Netns::new("fwp");
    let (r0, steps) = bare.add("ctr-bare", p0.path_str(), "eth0", &json!({}), Some(&w.host)).expect("ADD");
    // the bridge's ADD that made the bridge names the chain that drops and the fix
    let said = &steps[0].out.stderr;
    assert!(
        said.contains("bridge: note:")
            && said.contains(tool)
            && said.contains("FORWARD")
            && said.contains("\"firewall\" plugin"),
        "bridge's ADD says who drops its pods' traffic: {said}"
    );
    assert!(
        !pings(&p0, "192.0.2.2"),
        "traffic must die at {tool}'s FORWARD DROP without the firewall plugin"
    );
    let d = diagnose_in(&w.host, subnet);
    let msg = d.message(subnet.parse().unwrap(), "REMEDY").expect("the drop is found");
    assert!(msg.contains(tool) && msg.contains("FORWARD") && msg.contains("REMEDY"), "{msg}");
    bare.del("ctr-bare", p0.path_str(), "eth0", &json!({}), Some(&r0), Some(&w.host));

    // with it: out and back, and pod to pod across the bridge
    let chain = w.chain(&net, true);
    let (a, b) = (Netns::new("fwa"), Netns::new("fwb"));
    let (ra, _) = chain.add("ctr-a", a.path_str(), "eth0", &json!({}), Some(&w.host)).expect("ADD a");
    let (rb, _) = chain.add("ctr-b", b.path_str(), "eth0", &json!({}), Some(&w.host)).expect("ADD b");
    assert!(pings(&a, "192.0.2.2"), "pod a reaches the outside");
    assert!(pings(&b, "192.0.2.2"), "pod b reaches the outside");
    if w.bridged {
        assert!(pings(&a, &pod_addr(&rb)), "pod a reaches pod b through the bridge");
    }
    assert!(diagnose_in(&w.host, subnet).message(subnet.parse().unwrap(), "REMEDY").is_none());
    for s in chain.check("ctr-a", a.path_str(), "eth0", &json!({}), &ra, Some(&w.host)) {
        assert_eq!(s.out.code, 0, "CHECK {}: {}", s.plugin, s.out.stdout);
    }
    chain.del("ctr-a", a.path_str(), "eth0", &json!({}), Some(&ra), Some(&w.host));
    assert!(pings(&b, "192.0.2.2"), "pod b keeps its way out after a's DEL");
    chain.del("ctr-b", b.path_str(), "eth0", &json!({}), Some(&rb), Some(&w.host));
    let left = save(&w.host, tool);
    assert!(!left.contains("-A CNI-FORWARD -s 10.77."), "{left}");
    drop(w.outside);
}

#[test]
fn pods_get_through_docker_drop_iptables_nft() {
    traffic_through("iptables-nft");
}

#[test]
fn pods_get_through_docker_drop_iptables_legacy() {
    traffic_through("iptables-legacy");
}

/// SIGKILL the firewall at a random point of its ADD, then DEL without prevResult (what a
/// runtime does after a failed ADD) or GC with nothing valid: no rule of the address and no
/// record may be left. `CNI_CRASH_TRIALS` (default 40), `CNI_CRASH_SEED`.
#[test]
fn sigkill_during_add_then_del_or_gc_leaves_nothing() {
    let trials: u64 = std::env::var("CNI_CRASH_TRIALS").ok().and_then(|v| v.parse().ok()).unwrap_or(40);
    let mut seed: u64 =
        std::env::var("CNI_CRASH_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1
        });
    eprintln!("firewall crash: {trials} trials, CNI_CRASH_SEED={seed}");
    let start_seed = seed;
    let mut rng = move || {
        seed ^= seed >> 12;
        seed ^= seed << 25;
        seed ^= seed >> 27;
        seed.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    let host = Netns::new("fwcr");
    let pod = PodNetns::new("fwcp");
    host.run("iptables-nft", &["-P", "FORWARD", "DROP"]);
    let net = format!("fwcrash-{}", std::process::id());
    let records = std::path::Path::new("/var/lib/cni/firewall").join(&net);
    let conf_for = |i: u64| {
        let mut c = conf(&net, json!({}));
        c["prevResult"]["ips"] = json!([{"address": format!("10.66.{}.{}/16", i / 200, i % 200 + 2)}]);
        c
    };
    // a normal ADD's wall time bounds the kill points (anywhere from "not started" to "done")
    let mut typical = Vec::new();
    for k in 0..5 {
        let t = std::time::Instant::now();
        call("firewall", "ADD", &host, &pod, &conf_for(1000 + k)).ok();
        typical.push(t.elapsed());
        call("firewall", "DEL", &host, &pod, &conf_for(1000 + k)).ok_silent();
    }
    typical.sort();
    let max = typical[2].as_micros() as u64 * 12 / 10 + 1;
    for trial in 0..trials {
        let c = conf_for(trial);
        let id = format!("crash-{trial}");
        let delay = std::time::Duration::from_micros(rng() % max);
        let mut child = Exec::new("firewall")
            .in_ns(&host)
            .attachment("ADD", &id, pod.path(), "eth0", "/nonexistent")
            .spawn(&c.to_string());
        let t = std::time::Instant::now();
        while t.elapsed() < delay {
            std::hint::spin_loop();
        }
        let _ = child.kill();
        let _ = child.wait();
        let by_gc = rng() % 2 == 1;
        if by_gc {
            let mut g = conf(&net, json!({}));
            g["cniVersion"] = json!("1.1.0");
            g.as_object_mut().unwrap().remove("prevResult");
            g["cni.dev/valid-attachments"] = json!([]);
            Exec::new("firewall")
                .in_ns(&host)
                .env("CNI_COMMAND", "GC")
                .env("CNI_PATH", "/nonexistent")
                .run_json(&g)
                .ok_silent();
        } else {
            let mut d = c.clone();
            d.as_object_mut().unwrap().remove("prevResult");
            Exec::new("firewall")
                .in_ns(&host)
                .attachment("DEL", &id, pod.path(), "eth0", "/nonexistent")
                .run_json(&d)
                .ok_silent();
        }
        let addr = format!("10.66.{}.{}/32", trial / 200, trial % 200 + 2);
        let left = save(&host, "iptables-nft");
        assert!(
            !left.contains(&format!(" {addr} ")),
            "trial {trial}: killed after {delay:?}, cleaned by {}: {addr} left (CNI_CRASH_SEED={start_seed}):\n{left}",
            if by_gc { "GC" } else { "DEL" }
        );
        let files: Vec<_> = std::fs::read_dir(&records)
            .map(|d| d.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert!(files.is_empty(), "trial {trial}: records left: {files:?} (CNI_CRASH_SEED={start_seed})");
    }
    assert!(save(&host, "iptables-nft").contains("-P FORWARD DROP"));
}

/// Hostile values: refused with the key named and code 7 before anything is touched (no
/// chain, no record), and DEL of garbage prevResult-less input succeeds without touching.
#[test]
fn hostile_configurations_change_nothing() {
    let host = Netns::new("fwhost");
    let pod = PodNetns::new("fwhp");
    let net = format!("fwhostile-{}", std::process::id());
    let cases = [
        json!({"backend": "ipfw"}),
        json!({"backend": ["iptables"]}),
        json!({"iptablesAdminChainName": "-F"}),
        json!({"iptablesAdminChainName": "A\nCOMMIT\n*nat\n-F"}),
        json!({"iptablesAdminChainName": "X".repeat(29)}),
        json!({"iptablesAdminChainName": "FORWARD"}),
        json!({"firewalldZone": "trusted'; rm -rf /"}),
        json!({"ingressPolicy": "open; same-bridge"}),
        json!({"ingressPolicy": "same-bridge", "prevResult": {"cniVersion": "1.0.0", "ips": [{"address": "10.88.0.5/16"}]}}),
        json!({"ingressPolicy": "same-bridge", "prevResult": {"cniVersion": "1.0.0",
            "interfaces": [{"name": "../../etc"}], "ips": [{"address": "10.88.0.5/16"}]}}),
    ];
    for extra in cases {
        let c = conf(&net, extra.clone());
        let out = call("firewall", "ADD", &host, &pod, &c);
        assert_ne!(out.code, 0, "{extra}: {}", out.stdout);
        let e = out.json();
        assert_eq!(e["code"], json!(7), "{extra}: {e}");
        let key = extra.as_object().unwrap().keys().next().unwrap().clone();
        assert!(e["msg"].as_str().unwrap().contains(&key), "{extra}: the message names {key}: {e}");
    }
    // ADD without prevResult: refused; DEL without it: nothing to do, success
    let mut bare = conf(&net, json!({}));
    bare.as_object_mut().unwrap().remove("prevResult");
    let out = call("firewall", "ADD", &host, &pod, &bare);
    assert_eq!(out.json()["code"], json!(7), "{}", out.stdout);
    call("firewall", "DEL", &host, &pod, &bare).ok_silent();
    let v4 = save(&host, "iptables-nft");
    assert!(!v4.contains("CNI-FORWARD"), "nothing written: {v4}");
    assert!(!std::path::Path::new("/var/lib/cni/firewall").join(&net).exists(), "no record");
}

/// Every spec version with a prevResult (0.3.0 on) runs ADD, CHECK (0.4.0 on) and DEL; 0.1.0
/// and 0.2.0 are refused with code 1 (no chaining there), as VERSION says.
#[test]
fn every_version_with_chaining() {
    let host = Netns::new("fwver");
    let pod = PodNetns::new("fwvp");
    let net = format!("fwver-{}", std::process::id());
    for v in ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        let mut c = conf(&net, json!({}));
        c["cniVersion"] = json!(v);
        c["prevResult"]["cniVersion"] = json!(v);
        let r = call("firewall", "ADD", &host, &pod, &c).ok();
        assert_eq!(r["cniVersion"], json!(v));
        assert_eq!(r["ips"][0]["address"], json!("10.88.0.5/16"), "the prevResult passes through: {r}");
        if !v.starts_with("0.3") {
            call("firewall", "CHECK", &host, &pod, &c).ok_silent();
        }
        call("firewall", "DEL", &host, &pod, &c).ok_silent();
    }
    for v in ["0.1.0", "0.2.0"] {
        let mut c = conf(&net, json!({}));
        c["cniVersion"] = json!(v);
        c.as_object_mut().unwrap().remove("prevResult");
        let out = call("firewall", "ADD", &host, &pod, &c);
        assert_eq!(out.json()["code"], json!(1), "{v}: {}", out.stdout);
    }
    let out = Exec::new("firewall").env("CNI_COMMAND", "VERSION").run("{\"cniVersion\":\"1.1.0\"}").ok();
    let supported = out["supportedVersions"].as_array().unwrap().clone();
    assert_eq!(supported.len(), 5, "{out}");
    assert!(!save(&host, "iptables-nft").contains("10.88.0.5"));
}

/// Concurrent ADDs on a host with no filter table yet (every one plans to create it), then
/// concurrent DELs and CHECKs: each change is planned on one generation and committed only at
/// it, so the table, chains and jumps exist once and no attachment's rules are lost.
#[test]
fn concurrent_verbs_keep_one_setup_and_every_rule() {
    let host = Netns::new("fwcc");
    let pod = PodNetns::new("fwccp");
    let net = format!("fwcc-{}", std::process::id());
    let n = 8u32;
    let conf_for = |i: u32| {
        let mut c = conf(&net, json!({}));
        c["prevResult"]["ips"] = json!([{"address": format!("10.55.0.{}/16", i + 2)}]);
        c
    };
    let run = |verb: &'static str, i: u32| {
        let c = conf_for(i);
        let (host, pod) = (&host, &pod);
        move || {
            Exec::new("firewall")
                .in_ns(host)
                .attachment(verb, &format!("cc-{i}"), pod.path(), "eth0", "/nonexistent")
                .run_json(&c)
        }
    };
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n).map(|i| s.spawn(run("ADD", i))).collect();
        for h in hs {
            h.join().unwrap().ok();
        }
    });
    let v4 = save(&host, "iptables-nft");
    assert_eq!(v4.matches(JUMP).count(), 1, "{v4}");
    assert_eq!(v4.matches("-j CNI-ADMIN").count(), 1, "{v4}");
    assert_eq!(v4.matches("-A CNI-FORWARD -s 10.55.0.").count(), n as usize, "{v4}");
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n).map(|i| s.spawn(run(if i % 2 == 0 { "DEL" } else { "CHECK" }, i))).collect();
        for h in hs {
            h.join().unwrap().ok_silent();
        }
    });
    let half = save(&host, "iptables-nft");
    assert_eq!(half.matches("-A CNI-FORWARD -s 10.55.0.").count(), (n / 2) as usize, "{half}");
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n).filter(|i| i % 2 == 1).map(|i| s.spawn(run("DEL", i))).collect();
        for h in hs {
            h.join().unwrap().ok_silent();
        }
    });
    let after = save(&host, "iptables-nft");
    assert!(!after.contains("10.55.0."), "{after}");
}

/// `ingressPolicy: same-bridge` (BuildKit's): two networks on two bridges, each pod reaches the
/// outside and not the other bridge's pod; upstream's isolation chains, written over netlink,
/// list in iptables-nft as upstream writes them.
#[test]
fn same_bridge_isolates_bridges() {
    let w = DropHost::new("iptables-nft");
    let data2 = cni_tests::TempDir::new("fwsb");
    let chain = |name: &str, bridge: &str, subnet: &str, data: &str| cni_tests::chain::Chain {
        name: name.into(),
        version: "1.0.0".into(),
        plugins: vec![
            json!({"type": "bridge", "bridge": bridge, "isGateway": true, "ipMasq": true,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]],
                         "routes": [{"dst": "0.0.0.0/0"}], "dataDir": data}}),
            json!({"type": "firewall", "ingressPolicy": "same-bridge"}),
        ],
        cni_path: w.path.path().to_path_buf(),
    };
    let pid = std::process::id();
    let c1 = chain(&format!("fwsb1-{pid}"), "fwsb1", "10.71.0.0/24", w.data.str());
    let c2 = chain(&format!("fwsb2-{pid}"), "fwsb2", "10.72.0.0/24", data2.str());
    let (a, b) = (Netns::new("fwsa"), Netns::new("fwsb"));
    let (ra, _) = c1.add("sb-a", a.path_str(), "eth0", &json!({}), Some(&w.host)).expect("ADD a");
    let (rb, _) = c2.add("sb-b", b.path_str(), "eth0", &json!({}), Some(&w.host)).expect("ADD b");
    let v4 = save(&w.host, "iptables-nft");
    let want = "-A CNI-ISOLATION-STAGE-1 -i fwsb1 ! -o fwsb1 -m comment --comment \"CNI firewall plugin rules (ingressPolicy: same-bridge)\" -j CNI-ISOLATION-STAGE-2";
    assert!(v4.contains(want), "{want} missing:\n{v4}");
    assert!(v4.contains("-A CNI-ISOLATION-STAGE-2 -o fwsb2 -m comment"), "{v4}");
    let fwd: Vec<&str> = v4.lines().filter(|l| l.starts_with("-A FORWARD")).collect();
    assert!(fwd[0].ends_with("-j CNI-ISOLATION-STAGE-1"), "isolation first: {fwd:?}");
    assert!(pings(&a, "192.0.2.2") && pings(&b, "192.0.2.2"), "both pods reach the outside");
    assert!(!pings(&a, &pod_addr(&rb)), "a bridge's pod does not reach the other bridge's");
    for (c, r, id, ns) in [(&c1, &ra, "sb-a", &a), (&c2, &rb, "sb-b", &b)] {
        for s in c.check(id, ns.path_str(), "eth0", &json!({}), r, Some(&w.host)) {
            assert_eq!(s.out.code, 0, "CHECK {}: {}", s.plugin, s.out.stdout);
        }
        c.del(id, ns.path_str(), "eth0", &json!({}), Some(r), Some(&w.host));
    }
    assert!(!save(&w.host, "iptables-nft").contains("-A CNI-FORWARD -s 10.7"));
}

/// STATUS: the kernel accepts iptables-nft's form (a dry run, nothing committed); a backend
/// that cannot work here is code 50 (firewalld without a bus).
#[test]
fn status_says_whether_the_backend_can_work() {
    let host = Netns::new("fwst");
    let net = format!("fwst-{}", std::process::id());
    let status = |extra: Value| {
        let mut c = conf(&net, extra);
        c["cniVersion"] = json!("1.1.0");
        c.as_object_mut().unwrap().remove("prevResult");
        Exec::new("firewall")
            .in_ns(&host)
            .env("CNI_COMMAND", "STATUS")
            .env("CNI_PATH", "/nonexistent")
            .env("DBUS_SYSTEM_BUS_ADDRESS", "unix:path=/nonexistent/bus")
            .run_json(&c)
    };
    status(json!({})).ok_silent();
    status(json!({"backend": "nftables"})).ok_silent();
    status(json!({"backend": "iptables"})).ok_silent();
    let out = status(json!({"backend": "firewalld"}));
    assert_eq!(out.json()["code"], json!(50), "{}", out.stdout);
    let listed = String::from_utf8_lossy(&host.run("nft", &["list", "ruleset"]).stdout).into_owned();
    assert!(!listed.contains("cni_firewall_status"), "the dry run commits nothing: {listed}");
}
