//! Our bridge + host-local + portmap + bandwidth chained with today's upstream companions,
//! containernetworking/plugins v1.10.0's `firewall` and `tuning` (cni_tests::peers), in the
//! order Podman's and nerdctl's default conflists use (`bridge, portmap, firewall, tuning`),
//! with our `bandwidth` appended last: ADD, CHECK and DEL through the chain as a runtime runs
//! it, with real traffic, and nothing of the pods left after DEL.
//!
//! World: a fake **host** netns where every plugin runs, an **outside** netns on its uplink
//! (host 10.250.0.1, outside .2), two pods on the bridge `cni0`. The host's `FORWARD` policy is
//! `DROP` while the pods reach outside: only the firewall plugin's `CNI-FORWARD` rules (accept
//! from the pod's address, accept replies to it) let that traffic through, so the chain's
//! result really reached the companion. Bridged traffic does not meet iptables
//! (`bridge-nf-call-iptables=0`).
//!
//! The firewall plugin's other backend, firewalld, needs a running firewalld on the system D-Bus;
//! [`firewalld_backend`] says why it is skipped on these machines.

use cni_tests::chain::Chain;
use cni_tests::leaks::leaks;
use cni_tests::peers::Release;
use cni_tests::skip::skipped;
use cni_tests::traffic::{fetch, fetch_udp, Server, UdpServer};
use cni_tests::{cni_path_with, Exec, Netns, PluginOutput, TempDir};
use serde_json::{json, Value};

const NET: &str = "podman";
const BRIDGE: &str = "cni0";
const HOST4: &str = "10.250.0.1";
const HP_TCP: u16 = 18080;
const VERSION: &str = "1.0.0";
/// PATH of every plugin: the firewall plugin runs `iptables` (Debian's alternative: nft).
const PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";
/// What tuning sets in each pod (namespaced sysctls; Podman users set these).
const SOMAXCONN: &str = "net.core.somaxconn";
const ARP_IGNORE: &str = "net.ipv4.conf.eth0.arp_ignore";

struct World {
    host: Netns,
    outside: Netns,
    data: TempDir,
    tuning_data: TempDir,
    bins: TempDir,
}

struct Pod {
    ns: Netns,
    id: String,
    name: &'static str,
    caps: Value,
}

impl World {
    fn new() -> World {
        let v110 = Release::V1_10;
        let host = Netns::new("cph");
        let outside = Netns::new("cpo");
        for ns in [&host, &outside] {
            ns.run("ip", &["link", "set", "lo", "up"]);
        }
        host.run("sysctl", &["-qw", "net.ipv4.ip_forward=1"]);
        host.try_run("sysctl", &["-qw", "net.bridge.bridge-nf-call-iptables=0"]);
        host.run(
            "ip",
            &["link", "add", "ext0", "type", "veth", "peer", "name", "up0", "netns", outside.name()],
        );
        host.run("ip", &["addr", "add", &format!("{HOST4}/24"), "dev", "ext0"]);
        host.run("ip", &["link", "set", "ext0", "up"]);
        outside.run("ip", &["addr", "add", "10.250.0.2/24", "dev", "up0"]);
        outside.run("ip", &["link", "set", "up0", "up"]);
        // no route back to the pods' subnet: only masquerading brings replies back
        let bins = cni_path_with(&["bridge", "host-local", "portmap", "bandwidth"]);
        for p in ["firewall", "tuning"] {
            std::os::unix::fs::symlink(v110.bin(p), bins.join(p)).unwrap();
        }
        World { host, outside, data: TempDir::new("cpdata"), tuning_data: TempDir::new("cptuning"), bins }
    }

    /// Podman's default conflist (bridge, portmap, firewall, tuning), bandwidth appended.
    fn chain(&self) -> Chain {
        let k = 40 + std::process::id() % 150;
        Chain {
            name: NET.into(),
            version: VERSION.into(),
            plugins: vec![
                json!({"type": "bridge", "bridge": BRIDGE, "isGateway": true, "ipMasq": true,
                       "hairpinMode": true,
                       "ipam": {"type": "host-local", "ranges": [[{"subnet": format!("10.{k}.0.0/24")}]],
                                "routes": [{"dst": "0.0.0.0/0"}], "dataDir": self.data.str()}}),
                json!({"type": "portmap", "capabilities": {"portMappings": true}}),
                json!({"type": "firewall", "backend": "iptables"}),
                json!({"type": "tuning", "dataDir": self.tuning_data.str(), "allmulti": true,
                       "sysctl": {SOMAXCONN: "512", ARP_IGNORE: "1"}}),
                json!({"type": "bandwidth", "capabilities": {"bandwidth": true}}),
            ],
            cni_path: self.bins.path().to_path_buf(),
        }
    }

    fn pod(&self, name: &'static str, host_port: u16) -> Pod {
        let ns = Netns::new("cpc");
        ns.run("ip", &["link", "set", "lo", "up"]);
        Pod {
            ns,
            id: cni_tests::unique("ctr"),
            name,
            caps: json!({
                "portMappings": [{"hostPort": host_port, "containerPort": 80, "protocol": "tcp"},
                                 {"hostPort": host_port + 1, "containerPort": 81, "protocol": "udp"}],
                "bandwidth": {"ingressRate": 100_000_000, "ingressBurst": 1_000_000,
                              "egressRate": 100_000_000, "egressBurst": 1_000_000}
            }),
        }
    }

    fn exec(&self, c: &Chain, i: usize, cmd: &str, pod: &Pod, prev: Option<&Value>) -> PluginOutput {
        Exec::new(c.cni_path.join(c.plugin_type(i)).to_str().unwrap())
            .in_ns(&self.host)
            .attachment(cmd, &pod.id, pod.ns.path_str(), "eth0", c.cni_path.to_str().unwrap())
            .env("PATH", PATH)
            .run(&c.request(i, &pod.caps, prev))
    }

    fn add(&self, c: &Chain, pod: &Pod) -> Value {
        let mut prev: Option<Value> = None;
        for i in 0..c.plugins.len() {
            let out = self.exec(c, i, "ADD", pod, prev.as_ref());
            assert_eq!(out.code, 0, "ADD {}: {}{}", c.plugin_type(i), out.stdout, out.stderr);
            let r = out.json();
            if let Some(p) = &prev {
                // every plugin after bridge passes the result on
                assert_eq!(r["ips"], p["ips"], "{} changed the result's addresses", c.plugin_type(i));
            }
            prev = Some(r);
        }
        prev.unwrap()
    }

    fn verb(&self, c: &Chain, cmd: &str, pod: &Pod, result: &Value) {
        let order: Vec<usize> =
            if cmd == "DEL" { (0..c.plugins.len()).rev().collect() } else { (0..c.plugins.len()).collect() };
        for i in order {
            let out = self.exec(c, i, cmd, pod, Some(result));
            assert_eq!(out.code, 0, "{cmd} {}: {}{}", c.plugin_type(i), out.stdout, out.stderr);
        }
    }

    fn filter(&self) -> String {
        String::from_utf8_lossy(&self.host.run("iptables-save", &["-t", "filter"]).stdout).into_owned()
    }
}

fn ip4(r: &Value) -> String {
    r["ips"][0]["address"].as_str().unwrap().split('/').next().unwrap().to_string()
}

fn allmulti(ns: &Netns) -> bool {
    let l = ns.link("eth0").expect("the pod's eth0");
    l["flags"].as_array().unwrap().iter().any(|f| f == "ALLMULTI")
}

fn sysctl(ns: &Netns, key: &str) -> String {
    String::from_utf8_lossy(&ns.run("sysctl", &["-n", key]).stdout).trim().to_string()
}

#[test]
fn podman_order_with_v1_10_firewall_and_tuning() {
    let w = World::new();
    let c = w.chain();
    let (a, b) = (w.pod("podA", HP_TCP), w.pod("podB", HP_TCP + 10));
    let ra = w.add(&c, &a);
    let rb = w.add(&c, &b);
    let (ia, ib) = (ip4(&ra), ip4(&rb));

    // tuning's sysctls and allmulti are in the pods (with its backup of the interface's
    // settings, which its DEL restores), firewall's rules for each pod's address in the host
    for p in [&a, &b] {
        assert_eq!(sysctl(&p.ns, SOMAXCONN), "512", "{}: tuning's {SOMAXCONN}", p.name);
        assert_eq!(sysctl(&p.ns, ARP_IGNORE), "1", "{}: tuning's {ARP_IGNORE}", p.name);
        assert!(allmulti(&p.ns), "{}: tuning's allmulti", p.name);
        assert!(w.tuning_data.join(format!("{}_eth0.json", p.id)).is_file(), "{}: tuning's backup", p.name);
    }
    let f = w.filter();
    for ip in [&ia, &ib] {
        assert!(
            f.contains(&format!("-A CNI-FORWARD -s {ip}/32 -j ACCEPT"))
                && f.contains(&format!("-A CNI-FORWARD -d {ip}/32")),
            "firewall's rules for {ip} missing:\n{f}"
        );
    }

    // CHECK of the whole chain, ours and theirs
    w.verb(&c, "CHECK", &a, &ra);
    w.verb(&c, "CHECK", &b, &rb);

    // egress with FORWARD dropping everything else: the firewall plugin's rules let the pods
    // out, and our bridge's masquerading brings the replies back
    {
        let _o = Server::tcp(&w.outside, 8080, "outside");
        w.host.run("iptables", &["-P", "FORWARD", "DROP"]);
        for p in [&a, &b] {
            assert_eq!(fetch(&p.ns, "10.250.0.2", 8080), format!("outside {HOST4}"), "{} -> outside", p.name);
        }
        w.host.run("iptables", &["-P", "FORWARD", "ACCEPT"]);
    }
    // pod to pod on the bridge, and each pod's host ports: outside, host, hairpin, the other pod
    let _sa = (Server::tcp(&a.ns, 80, "podA"), UdpServer::start(&a.ns, 81, "podA"));
    let _sb = (Server::tcp(&b.ns, 80, "podB"), UdpServer::start(&b.ns, 81, "podB"));
    assert!(fetch(&a.ns, &ib, 80).starts_with("podB"), "podA -> podB over the bridge");
    for (p, hp) in [(&a, HP_TCP), (&b, HP_TCP + 10)] {
        assert_eq!(fetch(&w.outside, HOST4, hp), format!("{} 10.250.0.2", p.name), "outside -> {}", p.name);
        assert!(fetch(&w.host, HOST4, hp).starts_with(p.name), "host -> {}", p.name);
        assert!(fetch(&w.host, "127.0.0.1", hp).starts_with(p.name), "127.0.0.1 -> {}", p.name);
        assert!(fetch(&p.ns, HOST4, hp).starts_with(p.name), "hairpin {}", p.name);
        let r = fetch_udp(&w.outside, HOST4, hp + 1, 40000);
        assert!(r.starts_with(&format!("{} ", p.name)), "UDP to {} reached {r:?}", p.name);
    }
    assert!(fetch(&b.ns, HOST4, HP_TCP).starts_with("podA"), "podB -> podA's host port");

    // DEL in reverse order; then nothing of podA: firewall's rules, our elements, the ifb,
    // tuning's backup, the reservation; podB's all still there and working
    w.verb(&c, "DEL", &a, &ra);
    let f = w.filter();
    assert!(!f.contains(&format!("{ia}/32")), "firewall's rules for podA left:\n{f}");
    assert!(f.contains(&format!("-A CNI-FORWARD -s {ib}/32 -j ACCEPT")), "podB's firewall rules taken:\n{f}");
    let nft = String::from_utf8_lossy(&w.host.run("nft", &["list", "ruleset"]).stdout).into_owned();
    assert!(!nft.contains(&a.id), "nftables state of podA left:\n{nft}");
    assert!(
        std::fs::read_dir(w.tuning_data.path())
            .unwrap()
            .flatten()
            .all(|e| !e.file_name().to_string_lossy().contains(&a.id)),
        "tuning's backup of podA left"
    );
    assert_eq!(fetch(&w.outside, HOST4, HP_TCP), "", "podA's host port answers after DEL");
    assert_eq!(fetch(&w.outside, HOST4, HP_TCP + 10), format!("podB 10.250.0.2"), "podB after podA's DEL");
    w.verb(&c, "CHECK", &b, &rb);
    // a DEL again changes nothing and succeeds (idempotent, ours and theirs)
    w.verb(&c, "DEL", &a, &ra);
    w.verb(&c, "DEL", &b, &rb);
    let f = w.filter();
    assert!(!f.contains(&format!("{ib}/32")), "firewall's rules for podB left:\n{f}");
    let problems = leaks(&w.host, NET, w.data.path(), &["lo", "ext0", BRIDGE]);
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(std::fs::read_dir(w.tuning_data.path()).unwrap().count(), 0, "tuning's backups left");
}

/// The firewall plugin's firewalld backend talks to firewalld on the system D-Bus. Running it
/// here would need the firewalld daemon (not on these machines: Debian 12's base image, and
/// scripts/install-deps.sh does not install it) started on a private D-Bus inside the test's
/// host namespace; without it the plugin can only fail to connect. Recorded as a visible skip.
#[test]
fn firewalld_backend() {
    let installed =
        ["/usr/sbin/firewalld", "/usr/bin/firewalld"].iter().any(|p| std::path::Path::new(p).exists());
    let why = if installed {
        "firewalld is installed, but this suite does not start it on a private D-Bus in a scratch namespace"
    } else {
        "firewalld is not installed (the firewall plugin's firewalld backend needs it running on D-Bus)"
    };
    skipped("firewalld", why);
}
