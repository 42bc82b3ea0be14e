//! CRI-O's CNI call sequence, replayed by our driver on libcni v1.3.1 (tests/go/crio-driver,
//! built by `scripts/install-peers.sh crio-driver`): CRI-O is not served by the Go module
//! registry, so the daemon itself cannot be built here; the driver makes the calls CRI-O's
//! ocicni makes, in its order, with its options (docs/real-clients.md, "CRI-O").
//!
//! The full chain (bridge + host-local + portmap + bandwidth, cniVersion 1.1.0), the driver run
//! in a scratch node (`cni_tests::node`: its network namespace is the host, the pods'
//! namespaces bound into its mount namespace) with an outside peer: start-up with no pods
//! (STATUS, then GC with a null list), three pods (ADD then CHECK with the cached result, each),
//! traffic both ways, a "restart" after the runtime lost one pod (STATUS, CHECK of every known
//! pod, GC with the known pods after libcni's synthetic DEL of the stale cache entry), the
//! STATUS monitor, and the pods stopped: the stale pod's address, veth, shaping and cache entry
//! are gone after the restart, the live pods kept everything, and nothing is left at the end.
//! Every plugin call is recorded by a wrapper (`cni_tests::cri::install_recorders`) and the
//! verbs are checked in order.
//!
//! The same test runs against upstream's v1.10.0 plugins (`scripts/install-peers.sh plugins`).

use cni_tests::cri::{install_recorders, peer_dir, recorded, Call};
use cni_tests::node::Node;
use cni_tests::traffic::{fetch, Server};
use cni_tests::{bin, unique, Netns};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

const SUBNET: &str = "10.88.7.0/24";
/// The bridge's address: what a pod sees the host connect from.
const GATEWAY: &str = "10.88.7.1";
const HOST_ADDR: &str = "10.251.0.1";
const OUTSIDE_ADDR: &str = "10.251.0.2";
/// What CRI-O derives from `kubernetes.io/ingress-bandwidth: 1M` (and egress 2M): bits/s.
const INGRESS_BPS: u64 = 1_000_000;
const EGRESS_BPS: u64 = 2_000_000;
/// The chain's plugins libcni execs (host-local is the bridge's delegate).
const CHAIN: [&str; 3] = ["bridge", "portmap", "bandwidth"];

/// The node the driver (CRI-O's part) runs in, its outside namespace, the network's names.
struct World {
    node: Node,
    outside: Netns,
    net: String,
    bridge: String,
    driver: PathBuf,
}

impl World {
    fn new(plugin_dir: Option<&Path>) -> World {
        let node = Node::new("crh");
        let (host, dir) = (&node.host, &node.dir);
        let outside = Netns::new("cro");
        for d in ["bin", "spy", "calls", "conf", "cache", "data"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        for p in ["bridge", "host-local", "portmap", "bandwidth"] {
            let real = match plugin_dir {
                Some(d) => d.join(p),
                None => bin(p),
            };
            std::os::unix::fs::symlink(real, dir.join("bin").join(p)).unwrap();
        }
        install_recorders(
            &dir.join("spy"),
            &dir.join("bin"),
            &dir.join("calls"),
            &["bridge", "host-local", "portmap", "bandwidth"],
        );
        let hv = unique("crv");
        let ov = unique("crw");
        let out = Command::new("ip")
            .args(["link", "add", &hv, "netns", host.name(), "type", "veth", "peer", "name", &ov])
            .args(["netns", outside.name()])
            .output()
            .unwrap();
        assert!(out.status.success(), "veth: {}", String::from_utf8_lossy(&out.stderr));
        host.run("ip", &["addr", "add", &format!("{HOST_ADDR}/30"), "dev", &hv]);
        outside.run("ip", &["addr", "add", &format!("{OUTSIDE_ADDR}/30"), "dev", &ov]);
        for (ns, dev) in [(host, hv.as_str()), (&outside, ov.as_str())] {
            ns.run("ip", &["link", "set", dev, "up"]);
            ns.run("ip", &["link", "set", "lo", "up"]);
        }
        let net = unique("crio");
        let bridge = unique("crb");
        let w = World { node, outside, net, bridge, driver: peer_dir("crio-driver").join("crio-driver") };
        let conflist = json!({
            "cniVersion": "1.1.0",
            "name": w.net,
            "plugins": [
                {
                    "type": "bridge", "bridge": w.bridge, "isGateway": true, "ipMasq": true,
                    "hairpinMode": true,
                    "ipam": {
                        "type": "host-local", "dataDir": w.node.dir.join("data"),
                        "ranges": [[{"subnet": SUBNET}]], "routes": [{"dst": "0.0.0.0/0"}]
                    }
                },
                {"type": "portmap", "capabilities": {"portMappings": true}},
                {"type": "bandwidth", "capabilities": {"bandwidth": true}}
            ]
        });
        std::fs::write(w.node.dir.join("conf/10-crio.conflist"), conflist.to_string()).unwrap();
        w
    }

    /// Run one phase of the driver in the node: (exit code, events, stderr).
    fn driver(&self, args: &[&str]) -> (i32, Vec<Value>, String) {
        let mut cmd = self.node.command(180, self.driver.to_str().expect("a UTF-8 path"));
        cmd.args([
            "-confdir",
            self.node.dir.join("conf").to_str().unwrap(),
            "-bindir",
            self.node.dir.join("spy").to_str().unwrap(),
            "-cachedir",
            self.node.dir.join("cache").to_str().unwrap(),
            "-state",
            self.node.dir.join("state.json").to_str().unwrap(),
        ]);
        let out = cmd.args(args).output().expect("run crio-driver");
        let events = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("driver event {l:?}: {e}")))
            .collect();
        (out.status.code().unwrap_or(-1), events, String::from_utf8_lossy(&out.stderr).into_owned())
    }

    fn must(&self, args: &[&str]) -> Vec<Value> {
        let (rc, events, err) = self.driver(args);
        assert_eq!(rc, 0, "crio-driver {args:?}: events {events:?} stderr {err}");
        for e in &events {
            assert_eq!(e["ok"], true, "crio-driver {args:?}: {e} (stderr {err})");
        }
        events
    }

    fn calls(&self) -> Vec<Call> {
        recorded(&self.node.dir.join("calls"))
    }

    fn cached_ip(&self, id: &str) -> String {
        let p = self.node.dir.join("cache/results").join(format!("{}-{id}-eth0", self.net));
        let v: Value = serde_json::from_slice(&std::fs::read(&p).expect("cache entry")).unwrap();
        let addr = v["result"]["ips"][0]["address"].as_str().expect("cached address").to_string();
        addr.split('/').next().unwrap().to_string()
    }

    fn cache_entries(&self) -> BTreeSet<String> {
        names(&self.node.dir.join("cache/results"))
    }

    fn reservations(&self) -> BTreeSet<String> {
        names(&self.node.dir.join("data").join(&self.net))
            .into_iter()
            .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
            .collect()
    }

    fn links(&self) -> BTreeSet<String> {
        self.node.host.link_names().into_iter().collect()
    }

    fn qdiscs(&self) -> String {
        String::from_utf8_lossy(&self.node.host.run("tc", &["qdisc", "show"]).stdout).into_owned()
    }
}

fn names(d: &Path) -> BTreeSet<String> {
    std::fs::read_dir(d)
        .map(|rd| rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
}

/// The chain-level calls (plugin, verb, container id) recorded since `from`, host-local's
/// delegated calls left out.
fn verbs(calls: &[Call], from: usize) -> Vec<(String, String, String)> {
    calls[from..]
        .iter()
        .filter(|c| CHAIN.contains(&c.plugin.as_str()))
        .map(|c| (c.plugin.clone(), c.command().to_string(), c.container_id().to_string()))
        .collect()
}

fn seq(parts: &[(&[&str], &str, &str)]) -> Vec<(String, String, String)> {
    parts
        .iter()
        .flat_map(|(plugins, verb, id)| {
            plugins.iter().map(move |p| (p.to_string(), verb.to_string(), id.to_string()))
        })
        .collect()
}

const FWD: &[&str] = &["bridge", "portmap", "bandwidth"];
const REV: &[&str] = &["bandwidth", "portmap", "bridge"];

fn ops(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| format!("{} {}", e["op"].as_str().unwrap_or(""), e["id"].as_str().unwrap_or("")))
        .map(|s| s.trim().to_string())
        .collect()
}

/// The whole sequence; `upstream` names the plugin directory when it is upstream's.
fn crio_sequence(upstream: Option<&Path>) {
    let w = World::new(upstream);
    let what = if upstream.is_some() { "upstream v1.10.0" } else { "ours" };

    // 1. start-up with no pod: STATUS (polled until it succeeds), then GC of the network with
    // no valid attachment: ocicni passes a nil list, which libcni sends as null
    let base_links = w.links();
    let ev = w.must(&["start"]);
    assert_eq!(ops(&ev), ["STATUS", "GC"], "{what}");
    let calls = w.calls();
    assert_eq!(verbs(&calls, 0), seq(&[(FWD, "STATUS", ""), (FWD, "GC", "")]), "{what}");
    for c in calls.iter().filter(|c| c.command() == "GC") {
        assert_eq!(c.stdin["cni.dev/valid-attachments"], Value::Null, "{what}: {}", c.summary());
        assert!(c.stdin.get("cni.dev/valid-attachments").is_some(), "{what}: the key is sent");
        assert_eq!(c.rc, Some(0), "{what}: {} {}", c.summary(), c.stdout);
    }

    // 2. three pods: ADD of the list, then CHECK of the list with the cached result
    let outside_srv = Server::tcp4(&w.outside, 8080, "outside");
    let mut pods: Vec<Netns> = (0..3).map(|_| Netns::new("crp")).collect();
    for p in &pods {
        w.node.adopt(p); // the pods' namespaces, where the driver in the node finds them
    }
    let ids = ["pod-a", "pod-b", "pod-c"];
    let mut servers = Vec::new();
    let mut links_before_c = BTreeSet::new();
    for (i, (id, ns)) in ids.iter().zip(&pods).enumerate() {
        if i == 2 {
            links_before_c = w.links();
        }
        let from = w.calls().len();
        let ev = w.must(&["run-pod", id, ns.path_str(), &INGRESS_BPS.to_string(), &EGRESS_BPS.to_string()]);
        assert_eq!(ops(&ev), [format!("ADD {id}"), format!("CHECK {id}"), format!("cached-result {id}")]);
        let calls = w.calls();
        assert_eq!(verbs(&calls, from), seq(&[(FWD, "ADD", id), (FWD, "CHECK", id)]), "{what}: {id}");
        let bw = calls[from..].iter().find(|c| c.plugin == "bandwidth" && c.command() == "ADD").unwrap();
        // CRI-O's burst for "no limit": MaxUint32*8-1 bits = 2^35 - 9
        assert_eq!(bw.stdin["runtimeConfig"]["bandwidth"]["ingressBurst"], json!((1u64 << 35) - 9));
        assert!(ns.link_is_up("lo"), "{what}: the driver brought lo up as CRI-O does");
        servers.push(Server::tcp4(ns, 80, id));
    }
    let ips: Vec<String> = ids.iter().map(|id| w.cached_ip(id)).collect();
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(fetch(&w.node.host, &ips[i], 80), format!("{id} {GATEWAY}"), "{what}");
        // out through the bridge, masqueraded to the host's address on the outside link
        assert_eq!(fetch(&pods[i], OUTSIDE_ADDR, 8080), format!("outside {HOST_ADDR}"), "{what}: {id}");
    }
    let q = w.qdiscs();
    assert!(q.contains("tbf"), "{what}: bandwidth shaped the pods: {q}");

    // 3. the runtime loses pod-c (no DEL) and its namespace goes; then CRI-O restarts
    w.must(&["forget", "pod-c"]);
    drop(servers.pop());
    let lost = pods.pop().unwrap();
    w.node.release(&lost);
    drop(lost);
    let live = pods;
    let from = w.calls().len();
    let ev = w.must(&["start"]);
    assert_eq!(
        ops(&ev),
        ["STATUS", "CHECK pod-a", "cached-result pod-a", "CHECK pod-b", "cached-result pod-b", "GC"],
        "{what}"
    );
    assert_eq!(
        ev[5]["valid"],
        json!([{"containerID": "pod-a", "ifname": "eth0"}, {"containerID": "pod-b", "ifname": "eth0"}])
    );
    let calls = w.calls();
    assert_eq!(
        verbs(&calls, from),
        seq(&[
            (FWD, "STATUS", ""),
            (FWD, "CHECK", "pod-a"),
            (FWD, "CHECK", "pod-b"),
            (REV, "DEL", "pod-c"),
            (FWD, "GC", ""),
        ]),
        "{what}"
    );
    for c in calls[from..].iter().filter(|c| c.command() == "GC") {
        assert_eq!(
            c.stdin["cni.dev/valid-attachments"],
            json!([{"containerID": "pod-a", "ifname": "eth0"}, {"containerID": "pod-b", "ifname": "eth0"}]),
            "{what}: {}",
            c.summary()
        );
        assert_eq!(c.rc, Some(0), "{what}: {} {}", c.summary(), c.stdout);
    }
    // the stale pod is gone, the live ones kept everything
    let expected_cache: BTreeSet<String> =
        ["pod-a", "pod-b"].iter().map(|id| format!("{}-{id}-eth0", w.net)).collect();
    assert_eq!(w.cache_entries(), expected_cache, "{what}");
    assert_eq!(w.reservations(), ips[..2].iter().cloned().collect::<BTreeSet<_>>(), "{what}");
    assert_eq!(w.links(), links_before_c, "{what}: pod-c's veth (and ifb) gone, the others kept");
    for (i, id) in ids[..2].iter().enumerate() {
        assert_eq!(fetch(&w.node.host, &ips[i], 80), format!("{id} {GATEWAY}"), "{what}: after restart");
        assert_eq!(fetch(&live[i], OUTSIDE_ADDR, 8080), format!("outside {HOST_ADDR}"), "{what}: {id}");
    }
    assert!(w.qdiscs().contains("tbf"), "{what}: the live pods are still shaped");

    // 4. the STATUS monitor (cni_status_grace_period): every poll succeeds while pods run
    let from = w.calls().len();
    let ev = w.must(&["status", "3", "500ms"]);
    assert_eq!(ops(&ev), ["STATUS", "STATUS", "STATUS"], "{what}");
    assert_eq!(
        verbs(&w.calls(), from),
        seq(&[(FWD, "STATUS", ""), (FWD, "STATUS", ""), (FWD, "STATUS", "")])
    );

    // 5. StopPodSandbox for both: DEL with the cached config, nothing left
    for id in ["pod-a", "pod-b"] {
        let from = w.calls().len();
        let ev = w.must(&["stop-pod", id]);
        assert_eq!(ops(&ev), [format!("DEL {id}")]);
        assert_eq!(verbs(&w.calls(), from), seq(&[(REV, "DEL", id)]), "{what}");
    }
    drop(servers);
    drop(outside_srv);
    assert_eq!(w.cache_entries(), BTreeSet::new(), "{what}");
    assert_eq!(w.reservations(), BTreeSet::new(), "{what}");
    let mut expected = base_links;
    expected.insert(w.bridge.clone()); // the bridge stays, as with upstream
    assert_eq!(w.links(), expected, "{what}: links left");
    let q = w.qdiscs();
    assert!(!q.contains("tbf"), "{what}: shaping left: {q}");
    // no recorded call failed
    for c in w.calls() {
        assert_eq!(c.rc, Some(0), "{what}: {} {}", c.summary(), c.stdout);
    }
}

#[test]
fn crio_sequence_on_our_chain() {
    crio_sequence(None);
}

#[test]
fn crio_sequence_on_upstream_v1_10() {
    let dir = peer_dir("plugins");
    crio_sequence(Some(&dir));
}

/// CRI-O fails the pod when the CHECK right after ADD fails, and tears its network down (the
/// deferred networkStop): with a CHECK failure injected in front of portmap, the driver's
/// run-pod fails and the DEL of the chain leaves nothing behind.
#[test]
fn crio_check_failure_fails_the_pod_and_its_del_leaves_nothing() {
    let w = World::new(None);
    let spy = w.node.dir.join("spy");
    std::fs::rename(spy.join("portmap"), spy.join("portmap.rec")).unwrap();
    let script = format!(
        "#!/bin/sh\nif [ \"$CNI_COMMAND\" = CHECK ]; then\n  cat >/dev/null\n  \
         echo '{{\"cniVersion\":\"1.1.0\",\"code\":11,\"msg\":\"injected CHECK failure\"}}'\n  exit 1\nfi\n\
         exec \"{}\"\n",
        spy.join("portmap.rec").display()
    );
    std::fs::write(spy.join("portmap"), script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(spy.join("portmap"), std::fs::Permissions::from_mode(0o755)).unwrap();

    let base_links = w.links();
    w.must(&["start"]);
    let pod = Netns::new("crp");
    w.node.adopt(&pod);
    let from = w.calls().len();
    let (rc, ev, err) =
        w.driver(&["run-pod", "pod-x", pod.path_str(), &INGRESS_BPS.to_string(), &EGRESS_BPS.to_string()]);
    assert_eq!(rc, 1, "the pod fails: {ev:?} {err}");
    assert_eq!(ops(&ev), ["ADD pod-x", "CHECK pod-x", "DEL pod-x"]);
    assert_eq!(
        (ev[0]["ok"].clone(), ev[1]["ok"].clone(), ev[2]["ok"].clone()),
        (json!(true), json!(false), json!(true))
    );
    assert!(ev[1]["error"].as_str().unwrap_or("").contains("injected CHECK failure"), "{}", ev[1]);
    // the failed CHECK stopped at portmap (its wrapper records nothing); then DEL of the chain
    assert_eq!(
        verbs(&w.calls(), from),
        seq(&[(FWD, "ADD", "pod-x"), (&["bridge"], "CHECK", "pod-x"), (REV, "DEL", "pod-x")])
    );
    let add = w.calls().into_iter().find(|c| c.plugin == "bandwidth" && c.command() == "ADD").unwrap();
    assert_eq!(add.rc, Some(0), "bandwidth shaped the pod: {}", add.stdout);
    assert_eq!(add.stdin["runtimeConfig"]["bandwidth"]["ingressRate"], json!(INGRESS_BPS));
    assert_eq!(w.cache_entries(), BTreeSet::new());
    assert_eq!(w.reservations(), BTreeSet::new());
    let mut expected = base_links;
    expected.insert(w.bridge.clone());
    assert_eq!(w.links(), expected, "the pod's veth and ifb gone");
    assert!(!w.qdiscs().contains("tbf"));
    let state: Value =
        serde_json::from_slice(&std::fs::read(w.node.dir.join("state.json")).unwrap_or_default())
            .unwrap_or(json!({"pods": []}));
    assert!(
        state["pods"].as_array().map(|p| p.is_empty()).unwrap_or(true),
        "the runtime does not keep the pod: {state}"
    );
}

/// CRI-O's start-up waits for STATUS: while our host-local's store is unusable (here a regular
/// file where the network's directory belongs) STATUS fails with code 50, the node would stay
/// NetworkReady=false and the start-up GC is not sent at all (CRI-O defers it until STATUS
/// succeeds); once the store is repaired, start-up goes on: STATUS, then the GC.
#[test]
fn crio_start_up_waits_for_status_and_only_then_collects() {
    let w = World::new(None);
    let store = w.node.dir.join("data").join(&w.net);
    std::fs::write(&store, "not a directory").unwrap();
    let (rc, ev, err) = w.driver(&["-status-wait", "1", "start"]);
    assert_eq!(rc, 1, "start-up never got ready: {ev:?} {err}");
    let statuses: Vec<&Value> = ev.iter().filter(|e| e["op"] == "STATUS").collect();
    assert!(!statuses.is_empty(), "{ev:?}");
    for s in &statuses {
        assert_eq!(s["ok"], false, "{s}");
        assert!(s["error"].as_str().unwrap_or("").contains("not usable"), "our STATUS says why: {s}");
    }
    assert_eq!(ev.last().unwrap()["op"], "start", "{ev:?}");
    let calls = w.calls();
    assert!(calls.iter().all(|c| c.command() == "STATUS"), "nothing but STATUS before ready");
    // libcni stops at the first plugin that fails: bridge, which forwards to host-local
    let bridge_status: Vec<&Call> = calls.iter().filter(|c| c.plugin == "bridge").collect();
    assert!(!bridge_status.is_empty());
    for c in bridge_status {
        assert_eq!(c.rc, Some(1), "{}", c.summary());
        let e: Value = serde_json::from_str(&c.stdout).expect("a CNI error");
        assert_eq!(e["code"], 50, "{e}");
    }
    assert!(!calls.iter().any(|c| c.plugin == "portmap"), "libcni stopped at the failing plugin");

    std::fs::remove_file(&store).unwrap();
    let from = w.calls().len();
    let ev = w.must(&["start"]);
    assert_eq!(ops(&ev), ["STATUS", "GC"]);
    assert_eq!(verbs(&w.calls(), from), seq(&[(FWD, "STATUS", ""), (FWD, "GC", "")]));
}

/// On a restart CRI-O CHECKs every pod it knows and only logs a failure; the start-up GC still
/// lists the pod as valid. A pod whose interface someone removed fails that CHECK (ours compares
/// the kernel with the cached result), and GC keeps its address (the runtime's list is the
/// truth); the pod's stop then releases everything.
#[test]
fn crio_restart_check_failure_is_a_warning_and_gc_keeps_the_listed_pod() {
    let w = World::new(None);
    w.must(&["start"]);
    let pod = Netns::new("crp");
    w.node.adopt(&pod);
    w.must(&["run-pod", "pod-d", pod.path_str()]);
    let ip = w.cached_ip("pod-d");
    pod.run("ip", &["link", "del", "eth0"]); // takes the host end with it
    let from = w.calls().len();
    let (rc, ev, err) = w.driver(&["start"]);
    assert_eq!(rc, 0, "a failed CHECK does not stop the start-up: {ev:?} {err}");
    assert_eq!(ops(&ev), ["STATUS", "CHECK pod-d", "GC"]);
    assert_eq!(ev[1]["ok"], false, "{}", ev[1]);
    assert!(err.contains("WARN could not restore sandbox IP for pod-d"), "{err}");
    assert_eq!(ev[2]["ok"], true, "{}", ev[2]);
    let calls = w.calls();
    let check = calls[from..].iter().find(|c| c.command() == "CHECK").unwrap();
    assert_eq!((check.plugin.as_str(), check.rc), ("bridge", Some(1)), "{}", check.stdout);
    let gc = calls[from..].iter().find(|c| c.command() == "GC").unwrap();
    assert_eq!(gc.stdin["cni.dev/valid-attachments"], json!([{"containerID": "pod-d", "ifname": "eth0"}]));
    assert_eq!(w.reservations(), BTreeSet::from([ip]), "GC keeps what the runtime lists");
    w.must(&["stop-pod", "pod-d"]);
    assert_eq!(w.reservations(), BTreeSet::new());
    assert_eq!(w.cache_entries(), BTreeSet::new());
}
