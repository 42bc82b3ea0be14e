//! A Kubernetes node's host namespace: kube-proxy's iptables-nft rules (a few hundred
//! services, the shape of `tests/src/kubeproxy.rs`) are in place when our chain (bridge with
//! ipMasq + host-local, portmap with a hostPort and snat, bandwidth) attaches a pod. The pod's
//! hostPort must be reached from outside, from the host and from the pod itself (hairpin), its
//! traffic to the outside must be masqueraded, and DEL must leave kube-proxy's rules exactly as
//! they were (`iptables-nft-save` before and after).
//!
//! Topology (namespaces the test creates): a fake **host** netns (kube-proxy's rules, the
//! bridge the plugin makes) and an **outside** netns on the host's uplink `ext0`
//! (host 10.250.<n>.1, outside 10.250.<n>.2), which has no route to the pod subnet: a reply
//! reaches the pod only if the host masqueraded its connection.

use cni_tests::chain::Chain;
use cni_tests::traffic::{fetch, Server};
use cni_tests::{cni_path_with, kubeproxy, skip_unless, unique, Feature, Netns};
use serde_json::{json, Value};

const SERVICES: usize = 300;

fn pod_ip(result: &Value) -> String {
    let a = result["ips"][0]["address"].as_str().expect("result has an address");
    a.split('/').next().unwrap().to_string()
}

#[test]
fn hostport_and_masquerading_work_beside_kube_proxy_and_del_leaves_its_rules() {
    let host = Netns::new("kph");
    let outside = Netns::new("kpo");
    for ns in [&host, &outside] {
        ns.run("ip", &["link", "set", "lo", "up"]);
    }
    // A kube-proxy node runs with br_netfilter's bridge-nf-call-iptables on: bridged frames go
    // through the nat hooks too, so a hairpin connection is DNATed on the bridge and has to
    // leave by the port it came in on, which only the bridge plugin's hairpinMode allows.
    if !skip_unless(Feature::BrNetfilter) {
        return;
    }
    for key in ["net.bridge.bridge-nf-call-iptables=1", "net.bridge.bridge-nf-call-ip6tables=1"] {
        host.run("sysctl", &["-qw", key]);
    }
    host.run("ip", &["link", "add", "ext0", "type", "veth", "peer", "name", "up0", "netns", outside.name()]);
    host.run("ip", &["addr", "add", "10.250.7.1/24", "dev", "ext0"]);
    host.run("ip", &["link", "set", "ext0", "up"]);
    outside.run("ip", &["addr", "add", "10.250.7.2/24", "dev", "up0"]);
    outside.run("ip", &["link", "set", "up0", "up"]);
    // the node's default route (a DNATed service connection is routed out, and confirmed)
    host.run("ip", &["route", "add", "default", "via", "10.250.7.2"]);

    kubeproxy::load(&host, SERVICES);
    let nat_rules = kubeproxy::rule_count(&host, "nat");
    assert!(
        nat_rules >= SERVICES * (2 + 3 * kubeproxy::ENDPOINTS),
        "kube-proxy's rules did not load: {nat_rules} nat rules"
    );
    let before = kubeproxy::save(&host);

    let bins = cni_path_with(&["bridge", "host-local", "portmap", "bandwidth"]);
    let data = cni_tests::TempDir::new("kpdata");
    let chain = Chain {
        name: "kpnet".into(),
        version: "1.0.0".into(),
        plugins: vec![
            json!({"type": "bridge", "bridge": "cbr0", "isGateway": true, "ipMasq": true,
                   "hairpinMode": true,
                   "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.200.0/24"}]],
                            "routes": [{"dst": "0.0.0.0/0"}], "dataDir": data.str()}}),
            json!({"type": "portmap", "capabilities": {"portMappings": true}, "snat": true}),
            json!({"type": "bandwidth", "capabilities": {"bandwidth": true}}),
        ],
        cni_path: bins.path().to_path_buf(),
    };
    let caps = json!({
        "portMappings": [{"hostPort": 18080, "containerPort": 80, "protocol": "tcp"}],
        "bandwidth": {"ingressRate": 100_000_000u64, "ingressBurst": 200_000_000u64,
                      "egressRate": 100_000_000u64, "egressBurst": 200_000_000u64}
    });
    let pod = Netns::new("kpp");
    pod.run("ip", &["link", "set", "lo", "up"]);
    let id = unique("kppod");
    let (result, _) = chain
        .add(&id, pod.path_str(), "eth0", &caps, Some(&host))
        .unwrap_or_else(|s| panic!("chain ADD failed: {:?}", s.last().map(|x| &x.out)));
    let ip = pod_ip(&result);

    {
        let _pod_srv = Server::tcp4(&pod, 80, "pod");
        let _out_srv = Server::tcp4(&outside, 9000, "outside");
        // hostPort from outside: DNATed to the pod, client address preserved
        assert_eq!(fetch(&outside, "10.250.7.1", 18080), "pod 10.250.7.2", "outside -> hostPort");
        // from the host itself, to its own address
        let from_host = fetch(&host, "10.250.7.1", 18080);
        assert!(from_host.starts_with("pod "), "host -> hostPort: {from_host:?}");
        // hairpin: the pod reaches itself through the hostPort (masqueraded to the gateway)
        assert_eq!(fetch(&pod, "10.250.7.1", 18080), "pod 10.244.200.1", "hairpin");
        // masquerading of the pod's own traffic: the outside has no route to 10.244.200.0/24,
        // so only a masqueraded connection gets its answer, which names the host's address
        assert_eq!(fetch(&pod, "10.250.7.2", 9000), "outside 10.250.7.1", "pod -> outside (ipMasq)");
        // kube-proxy's rules are still in force: a connection from the pod to a cluster IP is
        // DNATed by them to an endpoint address (nothing listens there: no answer, but the
        // conntrack entry shows the rewrite)
        let _ = fetch(&pod, "10.96.0.5", 80);
        let ct = host.try_run("conntrack", &["-L", "-p", "tcp", "--orig-dst", "10.96.0.5"]);
        let ct = String::from_utf8_lossy(&ct.stdout);
        assert!(ct.contains("src=10.244.0."), "kube-proxy's DNAT did not apply to the pod's traffic: {ct}");
    }
    assert_ne!(kubeproxy::save(&host), "", "iptables-nft-save lists the tables");

    chain.del(&id, pod.path_str(), "eth0", &caps, Some(&result), Some(&host));
    let after = kubeproxy::save(&host);
    assert!(after == before, "DEL changed kube-proxy's rules:\n{}", diff(&before, &after));
    assert_eq!(fetch(&outside, "10.250.7.1", 18080), "", "the hostPort is gone after DEL");
    // nothing of the pod is left in our tables either
    let nft = String::from_utf8_lossy(&host.run("nft", &["list", "ruleset"]).stdout).into_owned();
    assert!(!nft.contains(&ip), "DEL left the pod's address {ip} in nf_tables:\n{nft}");
}

/// Lines only in `a` (-) or only in `b` (+).
fn diff(a: &str, b: &str) -> String {
    let (la, lb): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    let mut out = Vec::new();
    out.extend(la.iter().filter(|l| !lb.contains(l)).map(|l| format!("- {l}")));
    out.extend(lb.iter().filter(|l| !la.contains(l)).map(|l| format!("+ {l}")));
    out.join("\n")
}
