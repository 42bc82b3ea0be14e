//! The Kubernetes network model across nodes: three simulated nodes, each attaching a pod with
//! its own kubenet conflist (`conf-examples/10-kubenet.conflist` with the node's pod CIDRs),
//! routed to each other over an underlay whose MTU is smaller than the default.
//!
//! * pod ↔ pod across nodes keeps the source address (IPv4 and IPv6): no NAT between pods;
//! * pod → outside leaves with its node's underlay address (the conflist's `ipMasq` with
//!   `nonMasqueradeCIDRs`: the outside has no route to any pod CIDR);
//! * a hostPort on node 1 is reached from a pod on node 2 (both families) and from outside;
//! * pods get the underlay's MTU (`autoMtu`), and full-size packets with DF cross the underlay;
//! * DEL leaves nothing on any node.
//!
//! Topology, every namespace the test's own:
//!
//! ```text
//!   pod1 ─ cbr0 ─ node1 ─┐                          node n: eth0 192.168.100.n   fd00:100::n
//!   pod2 ─ cbr0 ─ node2 ─┼─ ul0 (switch) ─ outside          pods 10.244.n.0/24 fd00:10:244:n::/64
//!   pod3 ─ cbr0 ─ node3 ─┘   MTU 1400                outside: 192.168.100.254 fd00:100::fe
//! ```
//!
//! Each node routes the other nodes' pod CIDRs via their underlay address (what a cloud route
//! controller installs for kubenet). Assertions are about traffic (which server answered, which
//! source address it saw), never about how the plugins lay out their rules.

use cni_tests::chain::Chain;
use cni_tests::leaks::leaks;
use cni_tests::traffic::{fetch, Server};
use cni_tests::{cni_path_with, result_ips, unique, wait_until, workspace_root, Netns, TempDir};
use serde_json::{json, Value};
use std::time::Duration;

const UNDERLAY_MTU: u32 = 1400;
const NODES: usize = 3;
const HOST_PORT: u16 = 8080;
const OUTSIDE4: &str = "192.168.100.254";
const OUTSIDE6: &str = "fd00:100::fe";

fn node_addr4(n: usize) -> String {
    format!("192.168.100.{n}")
}

fn node_addr6(n: usize) -> String {
    format!("fd00:100::{n}")
}

fn pod_cidr4(n: usize) -> String {
    format!("10.244.{n}.0/24")
}

fn pod_cidr6(n: usize) -> String {
    format!("fd00:10:244:{n}::/64")
}

/// The kubenet example conflist with node `n`'s pod CIDRs and a scratch dataDir.
fn kubenet_chain(n: usize, data_dir: &str, cni_path: &std::path::Path) -> Chain {
    let path = workspace_root().join("conf-examples/10-kubenet.conflist");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let list: Value = serde_json::from_str(&text).expect("the example is JSON");
    let mut plugins = list["plugins"].as_array().expect("plugins").clone();
    assert_eq!(plugins[0]["type"], "bridge", "the example starts with bridge");
    assert_eq!(plugins[0]["autoMtu"], true, "the example takes the node's MTU");
    let ipam = &mut plugins[0]["ipam"];
    ipam["ranges"] = json!([[{"subnet": pod_cidr4(n)}], [{"subnet": pod_cidr6(n)}]]);
    ipam["dataDir"] = json!(data_dir);
    Chain {
        name: list["name"].as_str().expect("name").into(),
        version: list["cniVersion"].as_str().expect("cniVersion").into(),
        plugins,
        cni_path: cni_path.to_path_buf(),
    }
}

/// Move one end of a new veth pair into `ns` as `eth0` and the other into the switch's `ul0`.
fn wire(switch: &Netns, ns: &Netns, port: &str, addr4: &str, addr6: &str) {
    let mtu = UNDERLAY_MTU.to_string();
    switch.run(
        "ip",
        &[
            "link",
            "add",
            port,
            "mtu",
            &mtu,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "mtu",
            &mtu,
            "netns",
            ns.name(),
        ],
    );
    switch.run("ip", &["link", "set", port, "master", "ul0", "up"]);
    ns.run("ip", &["addr", "add", &format!("{addr4}/24"), "dev", "eth0"]);
    ns.run("ip", &["-6", "addr", "add", &format!("{addr6}/64"), "dev", "eth0", "nodad"]);
    ns.run("ip", &["link", "set", "eth0", "up"]);
    ns.run("ip", &["link", "set", "lo", "up"]);
}

fn no_tentative(ns: &Netns) {
    wait_until("IPv6 duplicate address detection", Duration::from_secs(10), || {
        ns.ip_json(&["-6", "addr", "show", "tentative"]).as_array().is_none_or(|a| a.is_empty())
    });
}

/// A ping with DF set and a payload filling `UNDERLAY_MTU` exactly.
fn full_size_ping(from: &Netns, to: &str) -> bool {
    let (fam, header) = if to.contains(':') { ("-6", 48) } else { ("-4", 28) };
    let size = (UNDERLAY_MTU - header).to_string();
    from.try_run("ping", &[fam, "-c", "1", "-W", "3", "-M", "do", "-s", &size, to]).status.success()
}

/// The capability arguments of the pod on node `i + 1`: pod 1 publishes hostPort 8080 -> 80.
fn caps(i: usize) -> Value {
    if i == 0 {
        json!({"portMappings": [{"hostPort": HOST_PORT, "containerPort": 80, "protocol": "tcp"}]})
    } else {
        json!({})
    }
}

struct Pod {
    ns: Netns,
    id: String,
    v4: String,
    v6: String,
    result: Value,
}

#[test]
fn pods_on_three_nodes_reach_each_other_unnated_the_outside_masqueraded_and_a_remote_host_port() {
    let switch = Netns::new("mnsw");
    switch.run("ip", &["link", "add", "ul0", "mtu", &UNDERLAY_MTU.to_string(), "type", "bridge"]);
    switch.run("ip", &["link", "set", "ul0", "up"]);
    let outside = Netns::new("mnout");
    wire(&switch, &outside, "ulout", OUTSIDE4, OUTSIDE6);

    let bins = cni_path_with(&["bridge", "host-local", "portmap", "bandwidth"]);
    let nodes: Vec<Netns> = (1..=NODES).map(|_| Netns::new("mnnode")).collect();
    let data: Vec<TempDir> = (1..=NODES).map(|_| TempDir::new("mndata")).collect();
    for (i, node) in nodes.iter().enumerate() {
        let n = i + 1;
        wire(&switch, node, &format!("ul{n}"), &node_addr4(n), &node_addr6(n));
        for m in (1..=NODES).filter(|m| *m != n) {
            node.run("ip", &["route", "add", &pod_cidr4(m), "via", &node_addr4(m)]);
            node.run("ip", &["-6", "route", "add", &pod_cidr6(m), "via", &node_addr6(m)]);
        }
    }
    let chains: Vec<Chain> = (1..=NODES).map(|n| kubenet_chain(n, data[n - 1].str(), bins.path())).collect();

    // One pod per node.
    let mut pods = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        let ns = Netns::new("mnpod");
        let id = unique("mnpod");
        let caps = caps(i);
        let (result, _) =
            chains[i].add(&id, ns.path_str(), "eth0", &caps, Some(node)).unwrap_or_else(|steps| {
                let last = steps.last().expect("a step");
                panic!("node {}: ADD {} failed: {}{}", i + 1, last.plugin, last.out.stdout, last.out.stderr)
            });
        let ips = result_ips(&result);
        assert_eq!(ips.len(), 2, "one address per family: {result}");
        let (v4, v6) = (ips[0].clone(), ips[1].clone());
        assert!(v4.starts_with(&format!("10.244.{}.", i + 1)), "{v4} from node {}'s CIDR", i + 1);
        assert!(v6.starts_with(&format!("fd00:10:244:{}::", i + 1)), "{v6} from node {}'s CIDR", i + 1);
        pods.push(Pod { ns, id, v4, v6, result });
    }
    for ns in nodes.iter().chain(pods.iter().map(|p| &p.ns)).chain([&outside]) {
        no_tentative(ns);
    }

    // Pods get the underlay's MTU, and full-size packets with DF cross it.
    for (i, p) in pods.iter().enumerate() {
        assert_eq!(p.ns.link("eth0").expect("pod eth0")["mtu"], UNDERLAY_MTU, "pod {}", i + 1);
        assert_eq!(nodes[i].link("cbr0").expect("cbr0")["mtu"], UNDERLAY_MTU, "node {}", i + 1);
    }
    for (a, b) in [(0, 1), (1, 2), (2, 0)] {
        for to in [&pods[b].v4, &pods[b].v6] {
            assert!(
                full_size_ping(&pods[a].ns, to),
                "pod {} -> {to}: {UNDERLAY_MTU}-byte packets with DF",
                a + 1
            );
        }
    }

    // Pod to pod across nodes: the server sees the client pod's own address.
    let servers: Vec<Server> =
        pods.iter().enumerate().map(|(i, p)| Server::tcp(&p.ns, 80, &format!("pod{}", i + 1))).collect();
    for (a, from) in pods.iter().enumerate() {
        for (b, to) in pods.iter().enumerate().filter(|(b, _)| *b != a) {
            for (fam, dst, src) in [("IPv4", &to.v4, &from.v4), ("IPv6", &to.v6, &from.v6)] {
                let want = format!("pod{} {src}", b + 1);
                assert_eq!(fetch(&from.ns, dst, 80), want, "{fam} pod{} -> pod{}", a + 1, b + 1);
            }
        }
    }

    // Pod to the outside: masqueraded to its node's underlay address.
    let internet = Server::tcp(&outside, 80, "outside");
    for (i, p) in pods.iter().enumerate() {
        let n = i + 1;
        assert_eq!(
            fetch(&p.ns, OUTSIDE4, 80),
            format!("outside {}", node_addr4(n)),
            "IPv4 pod{n} -> outside"
        );
        assert_eq!(
            fetch(&p.ns, OUTSIDE6, 80),
            format!("outside {}", node_addr6(n)),
            "IPv6 pod{n} -> outside"
        );
    }
    drop(internet);

    // Node 1's hostPort from a pod on node 2: DNATed to pod 1 on node 1. The destination (a node
    // address) is outside the cluster CIDRs, so node 2 masquerades the connection on its way
    // out, as kubenet did: pod 1 sees node 2's address.
    assert_eq!(fetch(&pods[1].ns, &node_addr4(1), HOST_PORT), format!("pod1 {}", node_addr4(2)));
    assert_eq!(fetch(&pods[1].ns, &node_addr6(1), HOST_PORT), format!("pod1 {}", node_addr6(2)));
    // and from outside the cluster, which keeps its own address
    assert_eq!(fetch(&outside, &node_addr4(1), HOST_PORT), format!("pod1 {OUTSIDE4}"));
    assert_eq!(fetch(&outside, &node_addr6(1), HOST_PORT), format!("pod1 {OUTSIDE6}"));
    // the port is node 1's only
    assert_eq!(fetch(&pods[0].ns, &node_addr4(2), HOST_PORT), "", "node 2 publishes nothing");
    drop(servers);

    // DEL leaves nothing on any node (the bridge stays, as upstream's).
    for (i, p) in pods.iter().enumerate() {
        let caps = caps(i);
        chains[i].del(&p.id, p.ns.path_str(), "eth0", &caps, Some(&p.result), Some(&nodes[i]));
    }
    for (i, node) in nodes.iter().enumerate() {
        let left = leaks(node, &chains[i].name, data[i].path(), &["lo", "eth0", "cbr0"]);
        assert!(left.is_empty(), "node {}: {left:#?}", i + 1);
        let rules = String::from_utf8_lossy(&node.run("nft", &["list", "ruleset"]).stdout).into_owned();
        for p in &pods {
            assert!(
                !rules.contains(&p.v4) && !rules.contains(&p.v6),
                "node {}: rules name {} or {}: {rules}",
                i + 1,
                p.v4,
                p.v6
            );
        }
    }
    assert_eq!(fetch(&outside, &node_addr4(1), HOST_PORT), "", "the hostPort is gone");
}
