//! Issue 37: host ports behind someone else's FORWARD DROP. A scratch "host" namespace gets
//! Docker 28's filter and nat rules as Docker writes them (FORWARD policy DROP, `DOCKER-USER`,
//! `DOCKER-FORWARD`, `DOCKER-CT`, `DOCKER-BRIDGE`, `DOCKER-ISOLATION-STAGE-1/2`, for an idle
//! `docker0`), with iptables-nft in one variant and iptables-legacy in the other, in both
//! families (Docker 27+ runs ip6tables by default). A pod runs Podman's default conflist
//! (`bridge, portmap, firewall, tuning`, conf-examples/87-podman-bridge.conflist) dual-stack
//! with a host port; a client in an "outside" namespace connects to the host's address and
//! the host port. Upstream's firewall (1.1.1, v1.10) accepts only replies toward the pod, so
//! the first SYN dies at Docker's policy; ours accepts, toward the pod's addresses,
//! connections conntrack marks as DNATed, and nothing else: a connection to the pod's address
//! itself still meets Docker's drop, and `ingressPolicy` isolation still wins.

use cni_tests::chain::Chain;
use cni_tests::traffic::{fetch, Server};
use cni_tests::{Netns, TempDir};
use serde_json::{json, Value};

/// Docker 28.0's `filter` and `nat` rules for an idle daemon with its default bridge
/// (`--bip 10.17.0.1/16` here, so the scratch host holds documentation-free 10/8 addresses
/// only), as `iptables-save` prints them after `dockerd` started. The IPv6 tables get the same
/// filter chains (ip6tables is on by default since Docker 27) and no masquerade (docker0 has
/// no IPv6 subnet).
fn docker_rules(v6: bool) -> String {
    let mut s = String::from(
        "*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
:DOCKER - [0:0]
:DOCKER-BRIDGE - [0:0]
:DOCKER-CT - [0:0]
:DOCKER-FORWARD - [0:0]
:DOCKER-ISOLATION-STAGE-1 - [0:0]
:DOCKER-ISOLATION-STAGE-2 - [0:0]
:DOCKER-USER - [0:0]
-A FORWARD -j DOCKER-USER
-A FORWARD -j DOCKER-FORWARD
-A DOCKER ! -i docker0 -o docker0 -j DROP
-A DOCKER-BRIDGE -o docker0 -j DOCKER
-A DOCKER-CT -o docker0 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A DOCKER-FORWARD -j DOCKER-CT
-A DOCKER-FORWARD -j DOCKER-ISOLATION-STAGE-1
-A DOCKER-FORWARD -j DOCKER-BRIDGE
-A DOCKER-FORWARD -i docker0 -j ACCEPT
-A DOCKER-ISOLATION-STAGE-1 -i docker0 ! -o docker0 -j DOCKER-ISOLATION-STAGE-2
-A DOCKER-ISOLATION-STAGE-2 -o docker0 -j DROP
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:DOCKER - [0:0]
-A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER
",
    );
    if v6 {
        s.push_str("-A OUTPUT ! -d ::1/128 -m addrtype --dst-type LOCAL -j DOCKER\n");
    } else {
        s.push_str("-A OUTPUT ! -d 127.0.0.0/8 -m addrtype --dst-type LOCAL -j DOCKER\n");
        s.push_str("-A POSTROUTING -s 10.17.0.0/16 ! -o docker0 -j MASQUERADE\n");
    }
    s.push_str("-A DOCKER -i docker0 -j RETURN\nCOMMIT\n");
    s
}

const HOST_PORT: u16 = 18080;
const POD_PORT: u16 = 8080;

/// The scratch host: Docker's rules written with `iptables-<variant>`, an uplink to the
/// "outside" namespace (192.0.2.2, 2001:db8:1::2 behind the host's .1 and ::1, with routes to
/// the pod subnets through the host, so a connection to a pod's own address can be tried).
struct DockerHost {
    host: Netns,
    outside: Netns,
    variant: &'static str,
    path: TempDir,
}

impl DockerHost {
    fn new(variant: &'static str) -> DockerHost {
        let host = Netns::new("dnath");
        let outside = Netns::new("dnato");
        host.run("ip", &["link", "set", "lo", "up"]);
        host.run(
            "ip",
            &["link", "add", "up0", "type", "veth", "peer", "name", "eth0", "netns", outside.name()],
        );
        host.run("ip", &["addr", "add", "192.0.2.1/24", "dev", "up0"]);
        host.run("ip", &["addr", "add", "2001:db8:1::1/64", "dev", "up0", "nodad"]);
        host.run("ip", &["link", "set", "up0", "up"]);
        outside.run("ip", &["link", "set", "lo", "up"]);
        outside.run("ip", &["addr", "add", "192.0.2.2/24", "dev", "eth0"]);
        outside.run("ip", &["addr", "add", "2001:db8:1::2/64", "dev", "eth0", "nodad"]);
        outside.run("ip", &["link", "set", "eth0", "up"]);
        outside.run("ip", &["route", "add", "10.89.0.0/16", "via", "192.0.2.1"]);
        outside.run("ip", &["route", "add", "2001:db8:89::/48", "via", "2001:db8:1::1"]);
        // dockerd: its bridge, forwarding on in both families, its rules
        host.run("ip", &["link", "add", "docker0", "type", "bridge"]);
        host.run("ip", &["addr", "add", "10.17.0.1/16", "dev", "docker0"]);
        host.run("ip", &["link", "set", "docker0", "up"]);
        host.run("sysctl", &["-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"]);
        for (tool, v6) in [("iptables", false), ("ip6tables", true)] {
            let restore = format!("{tool}-{variant}-restore");
            let mut child = host
                .command(&restore)
                .stdin(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("run {restore} (scripts/install-deps.sh installs iptables): {e}"));
            use std::io::Write;
            child.stdin.take().unwrap().write_all(docker_rules(v6).as_bytes()).unwrap();
            let out = child.wait_with_output().unwrap();
            assert!(out.status.success(), "{restore}: {}", String::from_utf8_lossy(&out.stderr));
        }
        let path = cni_tests::cni_path_with(&["bridge", "host-local", "portmap", "firewall", "tuning"]);
        DockerHost { host, outside, variant, path }
    }

    /// `iptables-<variant> -S` or `ip6tables-<variant> -S` (filter).
    fn listed(&self, v6: bool) -> String {
        let tool = format!("{}-{}", if v6 { "ip6tables" } else { "iptables" }, self.variant);
        String::from_utf8_lossy(&self.host.run(&tool, &["-S"]).stdout).into_owned()
    }

    /// Podman's default conflist (conf-examples/87-podman-bridge.conflist) with a bridge, a
    /// dual-stack range and a data directory of this test's own; `firewall` gets `extra`.
    fn podman_chain(
        &self,
        net: &str,
        bridge: &str,
        v4: &str,
        v6: &str,
        data: &TempDir,
        extra: Value,
    ) -> Chain {
        let text = std::fs::read_to_string(
            cni_tests::workspace_root().join("conf-examples/87-podman-bridge.conflist"),
        )
        .expect("conf-examples/87-podman-bridge.conflist");
        let list: Value = serde_json::from_str(&text).expect("Podman's conflist is JSON");
        let mut plugins = list["plugins"].as_array().expect("plugins").clone();
        let types: Vec<&str> = plugins.iter().map(|p| p["type"].as_str().unwrap()).collect();
        assert_eq!(types, ["bridge", "portmap", "firewall", "tuning"], "Podman's default list");
        plugins[0]["bridge"] = json!(bridge);
        plugins[0]["ipam"]["ranges"] = json!([[{"subnet": v4}], [{"subnet": v6}]]);
        plugins[0]["ipam"]["routes"] = json!([{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]);
        plugins[0]["ipam"]["dataDir"] = json!(data.str());
        for (k, v) in extra.as_object().unwrap() {
            plugins[2][k] = v.clone();
        }
        Chain {
            name: net.into(),
            version: list["cniVersion"].as_str().unwrap().into(),
            plugins,
            cni_path: self.path.path().to_path_buf(),
        }
    }
}

fn caps() -> Value {
    json!({"portMappings": [{"hostPort": HOST_PORT, "containerPort": POD_PORT, "protocol": "tcp"}]})
}

/// The pod's address of each family in an ADD result.
fn pod_addrs(result: &Value) -> (String, String) {
    let ips = cni_tests::result_ips(result);
    let of = |v6: bool| {
        ips.iter()
            .map(|a| a.split('/').next().unwrap().to_string())
            .find(|a| a.contains(':') == v6)
            .unwrap_or_else(|| panic!("no IPv{} address in {result}", if v6 { 6 } else { 4 }))
    };
    (of(false), of(true))
}

fn pings(from: &Netns, to: &str) -> bool {
    from.try_run("ping", &["-c", "1", "-W", "2", to]).status.success()
}

fn dnat_rule(addr: &str) -> String {
    let plen = if addr.contains(':') { 128 } else { 32 };
    format!("-A CNI-FORWARD -d {addr}/{plen} -m conntrack --ctstate DNAT -j ACCEPT")
}

fn host_port_behind_dockers_drop(variant: &'static str) {
    let w = DockerHost::new(variant);
    let data = TempDir::new("dnatd");
    let net = format!("dnat-{variant}-{}", std::process::id());
    let chain = w.podman_chain(&net, "dnbr0", "10.89.0.0/24", "2001:db8:89::/64", &data, json!({}));
    let pod = Netns::new("dnatp");
    let (result, steps) = chain
        .add("dnat-ctr", pod.path_str(), "eth0", &caps(), Some(&w.host))
        .unwrap_or_else(|s| panic!("ADD: {:?}", s.last().map(|s| &s.out)));
    let (v4, v6) = pod_addrs(&result);
    let fw_said = &steps[2].out.stderr;
    let _srv = Server::tcp(&pod, POD_PORT, "dnpod");

    // the host port answers from outside, in both families, with the client's own address
    assert_eq!(
        fetch(&w.outside, "192.0.2.1", HOST_PORT),
        "dnpod 192.0.2.2",
        "{variant}: 192.0.2.1:{HOST_PORT} from outside reaches the pod behind Docker's FORWARD DROP\n{}\n{fw_said}",
        w.listed(false)
    );
    assert_eq!(
        fetch(&w.outside, "2001:db8:1::1", HOST_PORT),
        "dnpod 2001:db8:1::2",
        "{variant}: [2001:db8:1::1]:{HOST_PORT} from outside reaches the pod\n{}",
        w.listed(true)
    );
    // the pod still reaches the outside
    assert!(pings(&pod, "192.0.2.2"), "{variant}: the pod reaches 192.0.2.2");
    assert!(pings(&pod, "2001:db8:1::2"), "{variant}: the pod reaches 2001:db8:1::2");
    // nothing broader: the pod's own address and port, not DNATed, still meet Docker's drop
    // (and only the drop: with an accept of the admin's in front of it, they answer)
    assert_eq!(fetch(&w.outside, &v4, POD_PORT), "", "{variant}: {v4}:{POD_PORT} directly must stay dropped");
    assert_eq!(
        fetch(&w.outside, &v6, POD_PORT),
        "",
        "{variant}: [{v6}]:{POD_PORT} directly must stay dropped"
    );
    for (tool, addr, client) in [("iptables", &v4, "192.0.2.2"), ("ip6tables", &v6, "2001:db8:1::2")] {
        let tool = format!("{tool}-{variant}");
        let accept = ["FORWARD", "-d", addr.as_str(), "-j", "ACCEPT"];
        w.host.run(&tool, &[&["-I"][..], &accept].concat());
        assert_eq!(fetch(&w.outside, addr, POD_PORT), format!("dnpod {client}"), "{variant}: the control");
        w.host.run(&tool, &[&["-D"][..], &accept].concat());
    }

    // the rule, where Docker's drop is, listed by the tool Docker used; Docker's own untouched
    for (fam_v6, addr) in [(false, &v4), (true, &v6)] {
        let listed = w.listed(fam_v6);
        for want in [
            "-P FORWARD DROP".to_string(),
            dnat_rule(addr),
            "-A FORWARD -j DOCKER-USER".into(),
            "-A DOCKER-FORWARD -j DOCKER-ISOLATION-STAGE-1".into(),
        ] {
            assert!(listed.contains(&want), "{variant}: {want} missing:\n{listed}");
        }
        assert_eq!(
            listed.matches("--ctstate DNAT").count(),
            1,
            "{variant}: one DNAT accept per address:\n{listed}"
        );
    }
    for s in chain.check("dnat-ctr", pod.path_str(), "eth0", &caps(), &result, Some(&w.host)) {
        assert_eq!(s.out.code, 0, "{variant}: CHECK {}: {}", s.plugin, s.out.stdout);
    }
    // CHECK names the DNAT accept when it is gone; the tool deleting ours by its words is
    // the tool's own reading of it as that rule (for nftables: our encoding is iptables-nft's)
    let tool = format!("iptables-{variant}");
    let words: Vec<String> = dnat_rule(&v4).split(' ').map(String::from).collect();
    let with = |op: &str| {
        let mut a: Vec<&str> = words.iter().map(String::as_str).collect();
        a[0] = op;
        w.host.run(&tool, &a);
    };
    with("-D");
    let fw =
        chain.exec(2, "CHECK", "dnat-ctr", pod.path_str(), "eth0", &caps(), Some(&result), Some(&w.host));
    assert_ne!(fw.out.code, 0, "{variant}: CHECK without the DNAT accept must fail");
    assert!(fw.out.stdout.contains("--ctstate DNAT"), "{variant}: CHECK names it: {}", fw.out.stdout);
    chain.exec(2, "ADD", "dnat-ctr", pod.path_str(), "eth0", &caps(), Some(&result), Some(&w.host)).out.ok();
    assert!(w.listed(false).contains(&dnat_rule(&v4)), "{variant}: a repeated ADD puts it back");
    // and the rule as the tool writes it is ours to CHECK and DEL
    with("-D");
    with("-A");
    for s in chain.check("dnat-ctr", pod.path_str(), "eth0", &caps(), &result, Some(&w.host)) {
        assert_eq!(s.out.code, 0, "{variant}: CHECK with {tool}'s own rule {}: {}", s.plugin, s.out.stdout);
    }

    chain.del("dnat-ctr", pod.path_str(), "eth0", &caps(), Some(&result), Some(&w.host));
    for (fam_v6, addr) in [(false, &v4), (true, &v6)] {
        let listed = w.listed(fam_v6);
        assert!(!listed.contains(addr.as_str()), "{variant}: DEL leaves no rule of {addr}:\n{listed}");
        assert!(!listed.contains("--ctstate DNAT"), "{variant}: the DNAT accept is gone:\n{listed}");
        assert!(listed.contains("-P FORWARD DROP"), "{variant}: Docker's policy stays:\n{listed}");
    }
}

#[test]
fn host_port_behind_dockers_forward_drop_iptables_nft() {
    host_port_behind_dockers_drop("nft");
}

#[test]
fn host_port_behind_dockers_forward_drop_iptables_legacy() {
    host_port_behind_dockers_drop("legacy");
}

/// `ingressPolicy: isolated` on two bridges behind Docker's drop: the host port of a pod on
/// one answers the outside, and a pod on the other bridge connecting to that same host port
/// (DNATed from its bridge to the first) is still dropped: the isolation chains are jumped to
/// before `CNI-FORWARD`, so the DNAT accept never sees what isolation drops.
#[test]
fn a_host_port_is_no_way_around_isolation() {
    let w = DockerHost::new("nft");
    let (d1, d2) = (TempDir::new("dnati1"), TempDir::new("dnati2"));
    let pid = std::process::id();
    let iso = json!({"ingressPolicy": "isolated"});
    let c1 = w.podman_chain(
        &format!("dnati1-{pid}"),
        "dnbr1",
        "10.89.1.0/24",
        "2001:db8:89:1::/64",
        &d1,
        iso.clone(),
    );
    let c2 =
        w.podman_chain(&format!("dnati2-{pid}"), "dnbr2", "10.89.2.0/24", "2001:db8:89:2::/64", &d2, iso);
    let (a, b) = (Netns::new("dnatia"), Netns::new("dnatib"));
    let (ra, _) = c1.add("iso-a", a.path_str(), "eth0", &caps(), Some(&w.host)).expect("ADD a");
    let (rb, _) = c2.add("iso-b", b.path_str(), "eth0", &json!({}), Some(&w.host)).expect("ADD b");
    let _srv = Server::tcp(&a, POD_PORT, "dnisoa");
    assert_eq!(
        fetch(&w.outside, "192.0.2.1", HOST_PORT),
        "dnisoa 192.0.2.2",
        "the outside reaches a's host port"
    );
    assert_eq!(fetch(&w.outside, "2001:db8:1::1", HOST_PORT), "dnisoa 2001:db8:1::2");
    assert!(pings(&b, "192.0.2.2"), "b reaches the outside");
    for target in ["192.0.2.1", "2001:db8:1::1"] {
        assert_eq!(
            fetch(&b, target, HOST_PORT),
            "",
            "b (other isolated bridge) must not reach a through {target}:{HOST_PORT}"
        );
    }
    let listed = w.listed(false);
    let fwd: Vec<&str> = listed.lines().filter(|l| l.starts_with("-A FORWARD")).collect();
    assert!(fwd[0].ends_with("-j CNI-ISOLATION-STAGE-1"), "isolation first: {fwd:?}");
    c2.del("iso-b", b.path_str(), "eth0", &json!({}), Some(&rb), Some(&w.host));
    c1.del("iso-a", a.path_str(), "eth0", &caps(), Some(&ra), Some(&w.host));
    assert!(!w.listed(false).contains("--ctstate DNAT"), "{}", w.listed(false));
    assert!(!w.listed(true).contains("--ctstate DNAT"), "{}", w.listed(true));
}
