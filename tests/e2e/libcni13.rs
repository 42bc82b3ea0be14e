//! libcni 1.3.1's own cnitool (containernetworking/cni v1.3.1, the same tree as the cni main
//! branch of August 2026; built by `scripts/install-peers.sh cnitool`) as a client of our
//! plugins, beside our cnitool (tools/cnitool) and Debian's libcni 1.1.2 cnitool
//! (tests/e2e/cnitool_loopback.rs):
//!
//! * ADD / CHECK / STATUS / DEL of the full chain (bridge + host-local + portmap + bandwidth,
//!   cniVersion 1.1.0) with a host port, and of loopback at every spec version;
//! * `cnitool gc`, which sends GC with **no** `cni.dev/valid-attachments` key after DELing every
//!   cached attachment of the network: our plugins refuse it (code 7, saying why) and touch
//!   nothing the cache does not name; our cnitool's gc with a valid list then collects the
//!   leaked attachment and keeps the live one;
//! * non-inlined plugin loading: plugins from `<confdir>/<network>/*.conf`, after the inlined
//!   ones, for both cnitools.
//!
//! libcni 1.3.1's cnitool has no cache-directory setting (always /var/lib/cni), so both
//! cnitools run in a scratch node (`cni_tests::node`) whose /var/lib/cni is a scratch directory:
//! the machine's cache is never read or written. The pods' namespaces, made by the test, are
//! bound into the node's mount namespace (`Node::adopt`). Every plugin call is recorded
//! (`cni_tests::cri`'s wrapper).

use cni_tests::cri::{install_recorders, peer_dir, recorded, Call};
use cni_tests::node::Node;
use cni_tests::traffic::{fetch, Server};
use cni_tests::{bin, unique, Netns};
use serde_json::{json, Value};
use sha2::{Digest, Sha512};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const SUBNET: &str = "10.88.9.0/24";
const GATEWAY: &str = "10.88.9.1";
const HOST_ADDR: &str = "10.252.0.1";
const OUTSIDE_ADDR: &str = "10.252.0.2";
const PLUGINS: [&str; 5] = ["bridge", "host-local", "portmap", "bandwidth", "loopback"];
const FWD: [&str; 3] = ["bridge", "portmap", "bandwidth"];
const REV: [&str; 3] = ["bandwidth", "portmap", "bridge"];

/// Which cnitool runs a verb.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Tool {
    /// libcni 1.3.1's cnitool
    Libcni13,
    /// ours (tools/cnitool)
    Ours,
}

/// The node both cnitools run in (its network namespace the host, its /var/lib/cni the scratch
/// `cache`), its outside namespace, the network's names.
struct World {
    node: Node,
    outside: Netns,
    net: String,
    bridge: String,
    upstream_tool: PathBuf,
}

impl World {
    fn new() -> World {
        let node = Node::new("lch");
        let (host, dir) = (&node.host, &node.dir);
        let outside = Netns::new("lco");
        for d in ["bin", "spy", "calls", "conf", "cache", "data"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        for p in PLUGINS {
            std::os::unix::fs::symlink(bin(p), dir.join("bin").join(p)).unwrap();
        }
        install_recorders(&dir.join("spy"), &dir.join("bin"), &dir.join("calls"), &PLUGINS);
        let hv = unique("lcv");
        let ov = unique("lcw");
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
        World {
            node,
            outside,
            net: unique("lcnet"),
            bridge: unique("lcb"),
            upstream_tool: peer_dir("cnitool").join("cnitool"),
        }
    }

    fn bridge_conf(&self) -> Value {
        json!({
            "type": "bridge", "bridge": self.bridge, "isGateway": true, "ipMasq": true,
            "ipam": {
                "type": "host-local", "dataDir": self.node.dir.join("data"),
                "ranges": [[{"subnet": SUBNET}]], "routes": [{"dst": "0.0.0.0/0"}]
            }
        })
    }

    fn portmap_conf() -> Value {
        json!({"type": "portmap", "capabilities": {"portMappings": true}})
    }

    fn bandwidth_conf() -> Value {
        json!({"type": "bandwidth", "ingressRate": 8_000_000, "ingressBurst": 800_000,
               "egressRate": 8_000_000, "egressBurst": 800_000})
    }

    /// The chain, all inlined.
    fn write_chain(&self) {
        let list = json!({
            "cniVersion": "1.1.0", "name": self.net,
            "plugins": [self.bridge_conf(), World::portmap_conf(), World::bandwidth_conf()]
        });
        std::fs::write(self.node.dir.join("conf/10-chain.conflist"), list.to_string()).unwrap();
    }

    /// Run `tool verb net netns` in the host namespace with this world's directories.
    fn run(&self, tool: Tool, verb: &str, net: &str, netns: &str, extra_env: &[(&str, &str)]) -> Output {
        // both in the node: libcni 1.3.1's has no cache-directory setting (/var/lib/cni, the
        // node's scratch `cache`), ours is told the same directory
        let mut cmd = match tool {
            Tool::Libcni13 => self.node.command(120, self.upstream_tool.to_str().expect("a UTF-8 path")),
            Tool::Ours => {
                let mut c = self.node.command(120, bin("cnitool").to_str().expect("a UTF-8 path"));
                c.env("CNI_CACHE_DIR", self.node.dir.join("cache"));
                c
            }
        };
        cmd.args([verb, net, netns])
            .env("CNI_PATH", self.node.dir.join("spy"))
            .env("NETCONFPATH", self.node.dir.join("conf"))
            .env_remove("CNI_IFNAME")
            .env_remove("CAP_ARGS")
            .env_remove("CNI_ARGS")
            .env_remove("CNI_GC_KEEP");
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        cmd.output().expect("run cnitool")
    }

    fn must(&self, tool: Tool, verb: &str, net: &str, netns: &str, extra_env: &[(&str, &str)]) -> String {
        let out = self.run(tool, verb, net, netns, extra_env);
        assert!(
            out.status.success(),
            "{tool:?} cnitool {verb} {net}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn calls(&self) -> Vec<Call> {
        recorded(&self.node.dir.join("calls"))
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
}

fn names(d: &Path) -> BTreeSet<String> {
    std::fs::read_dir(d)
        .map(|rd| rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
}

/// cnitool's container id for a namespace path: "cnitool-" + hex of sha512(path)[..10].
fn container_id(netns: &str) -> String {
    let d = Sha512::digest(netns.as_bytes());
    format!("cnitool-{}", d[..10].iter().map(|b| format!("{b:02x}")).collect::<String>())
}

/// The (plugin, verb) pairs of the calls recorded since `from`, host-local (the bridge's
/// delegate) left out.
fn verbs(calls: &[Call], from: usize) -> Vec<(String, String)> {
    calls[from..]
        .iter()
        .filter(|c| c.plugin != "host-local")
        .map(|c| (c.plugin.clone(), c.command().to_string()))
        .collect()
}

fn seq(parts: &[(&[&str], &str)]) -> Vec<(String, String)> {
    parts.iter().flat_map(|(ps, v)| ps.iter().map(move |p| (p.to_string(), v.to_string()))).collect()
}

fn result_ip(add_output: &str) -> String {
    let v: Value = serde_json::from_str(add_output).expect("ADD prints the result");
    v["ips"][0]["address"].as_str().expect("an address").split('/').next().unwrap().to_string()
}

#[test]
fn libcni13_cnitool_drives_the_full_chain_with_a_host_port() {
    let w = World::new();
    w.write_chain();
    let base_links = w.links();
    let pod = Netns::new("lcp");
    w.node.adopt(&pod);
    let caps = r#"{"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"tcp"}]}"#;
    let t = Tool::Libcni13;

    let out = w.must(t, "add", &w.net, pod.path_str(), &[("CAP_ARGS", caps)]);
    let ip = result_ip(&out);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["cniVersion"], "1.1.0");
    let id = container_id(pod.path_str());
    assert_eq!(
        w.cache_entries(),
        BTreeSet::from([format!("{}-{id}-eth0", w.net)]),
        "cached in the scratch dir"
    );
    let _srv = Server::tcp4(&pod, 80, "pod");
    assert_eq!(fetch(&w.outside, HOST_ADDR, 8080), format!("pod {OUTSIDE_ADDR}"), "the host port");
    assert_eq!(fetch(&w.node.host, &ip, 80), format!("pod {GATEWAY}"));
    w.must(t, "check", &w.net, pod.path_str(), &[]);
    w.must(t, "status", &w.net, pod.path_str(), &[]);
    w.must(t, "del", &w.net, pod.path_str(), &[]);
    w.must(t, "del", &w.net, pod.path_str(), &[]); // idempotent

    let calls = w.calls();
    assert_eq!(
        verbs(&calls, 0),
        seq(&[(&FWD, "ADD"), (&FWD, "CHECK"), (&FWD, "STATUS"), (&REV, "DEL"), (&REV, "DEL")])
    );
    let pm = calls.iter().find(|c| c.plugin == "portmap" && c.command() == "ADD").unwrap();
    assert_eq!(pm.stdin["runtimeConfig"]["portMappings"][0]["hostPort"], 8080);
    for c in &calls {
        assert_eq!(c.rc, Some(0), "{} {}", c.summary(), c.stdout);
        assert_eq!(
            c.container_id(),
            if c.command() == "STATUS" { "" } else { id.as_str() },
            "{}",
            c.summary()
        );
    }
    assert_eq!(fetch(&w.outside, HOST_ADDR, 8080), "", "the host port is gone");
    assert!(w.cache_entries().is_empty());
    assert!(w.reservations().is_empty());
    let mut expected = base_links;
    expected.insert(w.bridge.clone()); // the bridge stays, as with upstream
    assert_eq!(w.links(), expected);
}

#[test]
fn libcni13_cnitool_drives_loopback_at_every_version() {
    let w = World::new();
    for v in ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        let net = format!("{}{}", w.net, v.replace('.', ""));
        let list = json!({"cniVersion": v, "name": net, "plugins": [{"type": "loopback"}]});
        std::fs::write(w.node.dir.join("conf").join(format!("20-{net}.conflist")), list.to_string()).unwrap();
        let ctr = Netns::new("lcl");
        w.node.adopt(&ctr);
        let t = Tool::Libcni13;
        let out = w.must(t, "add", &net, ctr.path_str(), &[]);
        let r: Value = serde_json::from_str(&out).expect("ADD prints the result");
        assert_eq!(r["cniVersion"], v);
        assert!(ctr.link_is_up("lo"), "{v}");
        if v >= "0.4.0" {
            w.must(t, "check", &net, ctr.path_str(), &[]);
        } else {
            // libcni refuses CHECK below 0.4.0 itself
            assert!(!w.run(t, "check", &net, ctr.path_str(), &[]).status.success(), "{v}");
        }
        // STATUS below 1.1.0 is not sent by libcni (it succeeds without calling the plugin)
        let from = w.calls().len();
        w.must(t, "status", &net, ctr.path_str(), &[]);
        let sent: Vec<_> = verbs(&w.calls(), from);
        assert_eq!(sent, if v == "1.1.0" { seq(&[(&["loopback"], "STATUS")]) } else { vec![] }, "{v}");
        w.must(t, "del", &net, ctr.path_str(), &[]);
        assert!(!ctr.link_is_up("lo"), "{v}");
        assert!(w.cache_entries().is_empty(), "{v}");
    }
    for c in w.calls() {
        assert_eq!(c.rc, Some(0), "{} {}", c.summary(), c.stdout);
    }
}

#[test]
fn libcni13_cnitool_gc_sends_no_list_and_is_refused_then_ours_collects_with_one() {
    let w = World::new();
    w.write_chain();
    let live = Netns::new("lcp");
    w.node.adopt(&live);
    let leaked = Netns::new("lcp");
    w.node.adopt(&leaked);
    let t = Tool::Libcni13;
    let caps_live = r#"{"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"tcp"}]}"#;
    let caps_leaked = r#"{"portMappings":[{"hostPort":8081,"containerPort":80,"protocol":"tcp"}]}"#;
    let ip_leaked = result_ip(&w.must(t, "add", &w.net, leaked.path_str(), &[("CAP_ARGS", caps_leaked)]));
    // the runtime lost this attachment's cache entry: only a GC with a list can find it
    for e in w.cache_entries() {
        std::fs::remove_file(w.node.dir.join("cache/results").join(e)).unwrap();
    }
    let links_with_leaked = w.links();
    w.must(t, "add", &w.net, live.path_str(), &[("CAP_ARGS", caps_live)]);
    let _srv_live = Server::tcp4(&live, 80, "live");
    let _srv_leaked = Server::tcp4(&leaked, 80, "leaked");
    assert_eq!(fetch(&w.outside, HOST_ADDR, 8080), format!("live {OUTSIDE_ADDR}"));
    assert_eq!(fetch(&w.outside, HOST_ADDR, 8081), format!("leaked {OUTSIDE_ADDR}"));

    // libcni 1.3.1's gc: DEL of every cached attachment (the live pod's), then GC without a list
    let from = w.calls().len();
    let out = w.run(t, "gc", &w.net, live.path_str(), &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "cnitool gc reports the refusal");
    assert!(
        stderr.contains("\"cni.dev/valid-attachments\"") && stderr.contains("has none"),
        "our message reaches the user: {stderr}"
    );
    let calls = w.calls();
    assert_eq!(verbs(&calls, from), seq(&[(&REV, "DEL"), (&FWD, "GC")]), "libcni goes on after a refusal");
    for c in calls[from..].iter().filter(|c| c.command() == "GC") {
        assert!(c.stdin.get("cni.dev/valid-attachments").is_none(), "no list sent: {}", c.stdin);
        assert_eq!(c.rc, Some(1), "{}", c.summary());
        let e: Value = serde_json::from_str(&c.stdout).expect("a CNI error");
        assert_eq!(e["code"], 7, "{e}");
        assert!(e["details"].as_str().unwrap_or("").contains("nothing was changed"), "{e}");
    }
    // the synthetic DEL took the cached (live) attachment; the refused GC left the rest as it was
    assert!(w.cache_entries().is_empty());
    assert_eq!(w.reservations(), BTreeSet::from([ip_leaked.clone()]));
    assert_eq!(w.links(), links_with_leaked, "the leaked attachment's veth untouched");
    assert_eq!(fetch(&w.outside, HOST_ADDR, 8081), format!("leaked {OUTSIDE_ADDR}"), "and its host port");

    // the pod comes back, and our cnitool's gc sends the list: the live pod stays, the leaked
    // one (in no cache, in no list) is collected by the plugins' GC
    let ip_live = result_ip(&w.must(t, "add", &w.net, live.path_str(), &[("CAP_ARGS", caps_live)]));
    let keep = format!("{}:eth0", container_id(live.path_str()));
    let from = w.calls().len();
    w.must(Tool::Ours, "gc", &w.net, live.path_str(), &[("CNI_GC_KEEP", &keep)]);
    let calls = w.calls();
    assert_eq!(verbs(&calls, from), seq(&[(&FWD, "GC")]), "nothing cached outside the list: no DEL");
    for c in calls[from..].iter().filter(|c| c.command() == "GC") {
        assert_eq!(
            c.stdin["cni.dev/valid-attachments"],
            json!([{"containerID": container_id(live.path_str()), "ifname": "eth0"}]),
            "{}",
            c.summary()
        );
        assert_eq!(c.rc, Some(0), "{} {}", c.summary(), c.stdout);
    }
    assert_eq!(w.reservations(), BTreeSet::from([ip_live]), "the leaked address released, the live one kept");
    assert_eq!(fetch(&w.outside, HOST_ADDR, 8081), "", "the leaked host port is gone");
    assert_eq!(fetch(&w.outside, HOST_ADDR, 8080), format!("live {OUTSIDE_ADDR}"), "the live one works");
    w.must(t, "check", &w.net, live.path_str(), &[]);
    w.must(t, "del", &w.net, live.path_str(), &[]);
    assert!(w.reservations().is_empty());
}

#[test]
fn non_inlined_plugins_load_from_the_network_directory_for_both_cnitools() {
    let w = World::new();
    // bridge inlined; portmap and bandwidth from <confdir>/<net>/*.conf, in file-name order,
    // after the inlined plugins (libcni 1.3's NetworkConfFromFile)
    let list = json!({"cniVersion": "1.1.0", "name": w.net, "plugins": [w.bridge_conf()]});
    std::fs::write(w.node.dir.join("conf/10-chain.conflist"), list.to_string()).unwrap();
    let sub = w.node.dir.join("conf").join(&w.net);
    std::fs::create_dir_all(&sub).unwrap();
    std::fs::write(sub.join("20-portmap.conf"), World::portmap_conf().to_string()).unwrap();
    std::fs::write(sub.join("30-bandwidth.conf"), World::bandwidth_conf().to_string()).unwrap();
    let caps = r#"{"portMappings":[{"hostPort":8082,"containerPort":80,"protocol":"tcp"}]}"#;
    for (adder, other) in [(Tool::Libcni13, Tool::Ours), (Tool::Ours, Tool::Libcni13)] {
        let pod = Netns::new("lcp");
        w.node.adopt(&pod);
        let from = w.calls().len();
        w.must(adder, "add", &w.net, pod.path_str(), &[("CAP_ARGS", caps)]);
        let _srv = Server::tcp4(&pod, 80, "pod");
        assert_eq!(fetch(&w.outside, HOST_ADDR, 8082), format!("pod {OUTSIDE_ADDR}"), "{adder:?}");
        w.must(other, "check", &w.net, pod.path_str(), &[]);
        w.must(adder, "status", &w.net, pod.path_str(), &[]);
        w.must(other, "del", &w.net, pod.path_str(), &[]);
        let calls = w.calls();
        assert_eq!(
            verbs(&calls, from),
            seq(&[(&FWD, "ADD"), (&FWD, "CHECK"), (&FWD, "STATUS"), (&REV, "DEL")]),
            "{adder:?} adds, {other:?} checks and deletes"
        );
        for c in &calls[from..] {
            // the plugins from files get the list's name and version injected
            assert_eq!(
                (c.stdin["name"].as_str(), c.stdin["cniVersion"].as_str()),
                (Some(w.net.as_str()), Some("1.1.0"))
            );
            assert_eq!(c.rc, Some(0), "{} {}", c.summary(), c.stdout);
        }
        assert_eq!(fetch(&w.outside, HOST_ADDR, 8082), "", "{adder:?}: host port gone");
        assert!(w.reservations().is_empty() && w.cache_entries().is_empty(), "{adder:?}");
    }
    // with loadOnlyInlinedPlugins the directory is ignored: only the bridge runs
    let list = json!({"cniVersion": "1.1.0", "name": w.net, "loadOnlyInlinedPlugins": true, "plugins": [w.bridge_conf()]});
    std::fs::write(w.node.dir.join("conf/10-chain.conflist"), list.to_string()).unwrap();
    for t in [Tool::Libcni13, Tool::Ours] {
        let pod = Netns::new("lcp");
        w.node.adopt(&pod);
        let from = w.calls().len();
        w.must(t, "add", &w.net, pod.path_str(), &[]);
        w.must(t, "del", &w.net, pod.path_str(), &[]);
        assert_eq!(verbs(&w.calls(), from), seq(&[(&["bridge"], "ADD"), (&["bridge"], "DEL")]), "{t:?}");
    }
}
