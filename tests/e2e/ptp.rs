//! ptp end to end, in scratch namespaces: a fake host with an uplink to an "outside" namespace,
//! pods attached by our ptp with host-local (kind's kindnet shape), traffic pod to host, pod to
//! pod, pod to outside through `ipMasq`; the kernel state compared with upstream v1.10's ptp
//! for the same configuration; attachments made by either build deleted by the other; GC,
//! STATUS, CHECK; bad input (right code, host unchanged); SIGKILL during ADD, then DEL or GC
//! leaves nothing.

use cni_tests::chain::Chain;
use cni_tests::leaks::leaks;
use cni_tests::traffic::{fetch, Server};
use cni_tests::{
    cni_path_with, ns_state, unique, wait_until, workspace_root, Exec, Netns, PluginOutput, TempDir,
};
use serde_json::{json, Value};
use std::path::Path;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

static NET: AtomicU8 = AtomicU8::new(1);

/// A host namespace with forwarding off (ptp turns it on), an uplink `ext0` to `outside`
/// (10.250.<n>.0/24, fd01:<n>::/64) where a server answers with the client's address.
struct World {
    host: Netns,
    outside: Netns,
    n: u8,
    data: TempDir,
    bins: TempDir,
}

impl World {
    fn new() -> World {
        let n = NET.fetch_add(1, Ordering::Relaxed) + 100 * (std::process::id() % 2) as u8;
        let host = Netns::new("pth");
        let outside = Netns::new("pto");
        for ns in [&host, &outside] {
            ns.run("ip", &["link", "set", "lo", "up"]);
            // No DAD on these interfaces (the host end of each pod's veth included): addresses
            // usable at once.
            ns.run(
                "sysctl",
                &["-qw", "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0"],
            );
        }
        host.run(
            "ip",
            &["link", "add", "ext0", "type", "veth", "peer", "name", "up0", "netns", outside.name()],
        );
        host.run("ip", &["addr", "add", &format!("10.250.{n}.1/24"), "dev", "ext0"]);
        host.run("ip", &["addr", "add", &format!("fd01:{n}::1/64"), "dev", "ext0", "nodad"]);
        host.run("ip", &["link", "set", "ext0", "up"]);
        outside.run("ip", &["addr", "add", &format!("10.250.{n}.2/24"), "dev", "up0"]);
        outside.run("ip", &["addr", "add", &format!("fd01:{n}::2/64"), "dev", "up0", "nodad"]);
        outside.run("ip", &["link", "set", "up0", "up"]);
        host.settle("ext0");
        outside.settle("up0");
        World { host, outside, n, data: TempDir::new("ptpdata"), bins: cni_path_with(&["ptp", "host-local"]) }
    }

    /// kind's kindnet entry (ptp + host-local, default routes), dual stack, with `extra` keys.
    fn conf(&self, net: &str, extra: Value) -> String {
        let n = self.n;
        let mut c = json!({
            "cniVersion": "1.1.0", "name": net, "type": "ptp", "mtu": 1400,
            "ipam": {"type": "host-local", "dataDir": self.data.str(),
                     "ranges": [[{"subnet": format!("10.{n}.7.0/24")}], [{"subnet": format!("fd00:{n}:7::/64")}]],
                     "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]}
        });
        for (k, v) in extra.as_object().into_iter().flatten() {
            c[k] = v.clone();
        }
        c.to_string()
    }

    fn exec(&self, plugin: &str, cmd: &str, id: &str, netns: &str) -> Exec<'_> {
        let plugin = if plugin.contains('/') {
            plugin.to_string()
        } else {
            self.bins.join(plugin).to_str().unwrap().to_string()
        };
        Exec::new(&plugin).in_ns(&self.host).attachment(cmd, id, netns, "eth0", self.bins.str())
    }

    fn pod(&self) -> (Netns, String) {
        let ns = Netns::new("ptc");
        ns.run("ip", &["link", "set", "lo", "up"]);
        (ns, unique("pod"))
    }

    fn leaks(&self, net: &str) -> Vec<String> {
        leaks(&self.host, net, self.data.path(), &["lo", "ext0"])
    }
}

fn addr_of(result: &Value, v6: bool) -> String {
    result["ips"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["address"].as_str().unwrap().split('/').next().unwrap().to_string())
        .find(|a| a.contains(':') == v6)
        .expect("an address of the family")
}

fn with_prev(conf: &str, prev: &Value) -> String {
    let mut c: Value = serde_json::from_str(conf).unwrap();
    c["prevResult"] = prev.clone();
    c.to_string()
}

/// `ip -j route` of a namespace, one line per route: what ptp set up, without what changes from
/// run to run (interface names and indexes are the same `eth0`; the host side is filtered to the
/// pod's veth and named `VETH`).
fn routes(ns: &Netns, dev: &str, family: &str) -> Vec<String> {
    let out = ns.run("ip", &["-j", family, "route", "show", "dev", dev]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut lines: Vec<String> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            format!(
                "{} via {} scope {} src {} proto {}",
                r["dst"].as_str().unwrap_or("?"),
                r["gateway"].as_str().unwrap_or("-"),
                r["scope"].as_str().unwrap_or("-"),
                r["prefsrc"].as_str().unwrap_or("-"),
                r["protocol"].as_str().unwrap_or("-")
            )
        })
        .filter(|l| !l.starts_with("fe80::/64"))
        .collect();
    lines.sort();
    lines
}

fn addrs(ns: &Netns, dev: &str) -> Vec<String> {
    let mut a: Vec<String> = ns.addrs(dev).into_iter().filter(|a| !a.starts_with("fe80:")).collect();
    a.sort();
    a
}

#[test]
fn dual_stack_pods_reach_the_host_each_other_and_the_outside_and_leave_nothing() {
    let w = World::new();
    let n = w.n;
    let conf = w.conf("kindnet", json!({"ipMasq": true}));
    let (a, ida) = w.pod();
    let (b, idb) = w.pod();
    let ra = w.exec("ptp", "ADD", &ida, a.path_str()).run(&conf).ok();
    let rb = w.exec("ptp", "ADD", &idb, b.path_str()).run(&conf).ok();
    assert_eq!(w.host.run("sysctl", &["-n", "net.ipv4.ip_forward"]).stdout, b"1\n");
    assert_eq!(w.host.run("sysctl", &["-n", "net.ipv6.conf.all.forwarding"]).stdout, b"1\n");
    // The result: host veth first, the container's interface with its sandbox, every address on it.
    assert!(ra["interfaces"][0]["name"].as_str().unwrap().starts_with("veth"));
    assert_eq!(ra["interfaces"][1]["name"], "eth0");
    assert_eq!(ra["interfaces"][1]["sandbox"], a.path_str());
    assert!(ra["ips"].as_array().unwrap().iter().all(|i| i["interface"] == 1), "{ra}");
    assert_eq!(ra["routes"], json!([{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]));
    let (a4, a6) = (addr_of(&ra, false), addr_of(&ra, true));
    let (b4, b6) = (addr_of(&rb, false), addr_of(&rb, true));
    // The container's routes: everything through the gateway, which is on the link.
    assert_eq!(
        routes(&a, "eth0", "-4"),
        vec![
            format!("10.{n}.7.0/24 via 10.{n}.7.1 scope - src {a4} proto -"),
            format!("10.{n}.7.1 via - scope link src {a4} proto -"),
            format!("default via 10.{n}.7.1 scope - src - proto -"),
        ]
    );
    assert_eq!(a.link("eth0").unwrap()["mtu"], 1400);
    let veth = ra["interfaces"][0]["name"].as_str().unwrap();
    assert_eq!(w.host.link(veth).unwrap()["mtu"], 1400);
    assert_eq!(addrs(&w.host, veth), vec![format!("10.{n}.7.1/32"), format!("fd00:{n}:7::1/128")]);
    assert_eq!(
        routes(&w.host, veth, "-4"),
        vec![format!("{a4} via - scope host src - proto -")],
        "the host's route to the pod"
    );
    // Traffic: pod to host gateway, pod to pod (both families), pod to outside masqueraded.
    let servers =
        [Server::tcp(&a, 80, "podA"), Server::tcp(&b, 80, "podB"), Server::tcp(&w.outside, 80, "outside")];
    assert_eq!(fetch(&w.host, &a4, 80), format!("podA 10.{n}.7.1"), "host -> pod over its /32 route");
    assert_eq!(fetch(&b, &a4, 80), format!("podA {b4}"), "pod -> pod (IPv4)");
    assert_eq!(fetch(&a, &b6, 80), format!("podB {a6}"), "pod -> pod (IPv6)");
    assert_eq!(
        fetch(&a, &format!("10.250.{n}.2"), 80),
        format!("outside 10.250.{n}.1"),
        "masqueraded (IPv4)"
    );
    assert_eq!(fetch(&a, &format!("fd01:{n}::2"), 80), format!("outside fd01:{n}::1"), "masqueraded (IPv6)");
    drop(servers); // a process left in a pod's namespace would keep it alive
                   // CHECK passes, and fails once a route is gone.
    w.exec("ptp", "CHECK", &ida, a.path_str()).run(&with_prev(&conf, &ra)).ok_silent();
    a.run("ip", &["route", "del", "default"]);
    let msg = w.exec("ptp", "CHECK", &ida, a.path_str()).run(&with_prev(&conf, &ra)).err(999);
    assert!(msg.contains("0.0.0.0/0"), "{msg}");
    // DEL: nothing left, twice; and with the namespace gone.
    w.exec("ptp", "DEL", &ida, a.path_str()).run(&conf).ok_silent();
    w.exec("ptp", "DEL", &ida, a.path_str()).run(&conf).ok_silent();
    assert!(a.link("eth0").is_none());
    let bpath = b.path_str().to_string();
    drop(b);
    w.exec("ptp", "DEL", &idb, &bpath).run(&conf).ok_silent();
    w.exec("ptp", "DEL", &idb, "").run(&conf).ok_silent();
    wait_until("the dropped namespace's veth pair to go", Duration::from_secs(10), || {
        !w.host.link_names().iter().any(|l| l.starts_with("veth"))
    });
    assert_eq!(w.leaks("kindnet"), Vec::<String>::new());
}

/// The directory of upstream's release, built (once, then reused) by scripts/install-peers.sh.
fn upstream_release_dir() -> String {
    let script = workspace_root().join("scripts/install-peers.sh");
    let mut last = String::new();
    for args in [&["plugins"][..], &["--print-dir", "plugins"][..]] {
        let out = std::process::Command::new(&script)
            .args(args)
            .current_dir(workspace_root())
            .output()
            .expect("run");
        assert!(
            out.status.success(),
            "scripts/install-peers.sh {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        last = String::from_utf8(out.stdout).expect("a path").trim().to_string();
    }
    last
}

/// The same configuration through upstream v1.10's ptp and ours gives the same addresses and
/// routes on both sides; an attachment made by either is deleted by the other without a trace;
/// our CHECK passes on upstream's attachment.
#[test]
fn same_state_as_upstream_and_either_build_deletes_the_others() {
    let w = World::new();
    let upstream = Path::new(&upstream_release_dir()).join("ptp");
    let upstream = upstream.to_str().unwrap();
    // upstream's ipMasq writes nftables only when asked (its default is iptables)
    let conf = w.conf("swapnet", json!({"ipMasq": true, "ipMasqBackend": "nftables"}));
    let snapshot = |ns: &Netns, r: &Value| {
        let veth = r["interfaces"][0]["name"].as_str().unwrap().to_string();
        let mut s = routes(ns, "eth0", "-4");
        s.extend(routes(ns, "eth0", "-6"));
        s.extend(addrs(ns, "eth0"));
        s.extend(routes(&w.host, &veth, "-4"));
        s.extend(routes(&w.host, &veth, "-6"));
        s.extend(addrs(&w.host, &veth));
        // host-local hands out the next address, not the released one: name the pod's
        let (p4, p6) = (addr_of(r, false), addr_of(r, true));
        s.into_iter().map(|l| l.replace(&p4, "POD4").replace(&p6, "POD6")).collect::<Vec<_>>()
    };
    let mut seen = Vec::new();
    for (maker, deleter) in [(upstream, "ptp"), ("ptp", upstream)] {
        let (pod, id) = w.pod();
        let r = w.exec(maker, "ADD", &id, pod.path_str()).run(&conf).ok();
        let state = snapshot(&pod, &r);
        seen.push(state);
        w.exec("ptp", "CHECK", &id, pod.path_str()).run(&with_prev(&conf, &r)).ok_silent();
        let rules = w.host.run("nft", &["list", "chain", "inet", "cni_plugins_masquerade", "masq_checks"]);
        let rules = String::from_utf8_lossy(&rules.stdout).into_owned();
        assert_eq!(rules.matches(&format!("id: {id}")).count(), 2, "{maker}: {rules}");
        w.exec(deleter, "DEL", &id, pod.path_str()).run(&conf).ok_silent();
        assert!(pod.link("eth0").is_none(), "{deleter} deleted {maker}'s veth");
        assert_eq!(w.leaks("swapnet"), Vec::<String>::new(), "{maker}'s attachment deleted by {deleter}");
    }
    assert_eq!(seen[0], seen[1], "upstream's state, then ours");
}

#[test]
fn gc_keeps_the_valid_attachments_and_status_reports_readiness() {
    let w = World::new();
    let conf = w.conf("gcnet", json!({"ipMasq": true}));
    let (a, ida) = w.pod();
    let (b, idb) = w.pod();
    let ra = w.exec("ptp", "ADD", &ida, a.path_str()).run(&conf).ok();
    w.exec("ptp", "ADD", &idb, b.path_str()).run(&conf).ok();
    let mut gc: Value = serde_json::from_str(&conf).unwrap();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": ida, "ifname": "eth0"}]);
    let gc_exec = |cmd: &str| {
        Exec::new(w.bins.join("ptp").to_str().unwrap())
            .in_ns(&w.host)
            .env("CNI_COMMAND", cmd)
            .env("CNI_PATH", w.bins.str())
    };
    gc_exec("GC").run(&gc.to_string()).ok_silent();
    let rules = String::from_utf8_lossy(
        &w.host.run("nft", &["list", "chain", "inet", "cni_plugins_masquerade", "masq_checks"]).stdout,
    )
    .into_owned();
    assert!(rules.contains(&format!("id: {ida}")) && !rules.contains(&format!("id: {idb}")), "{rules}");
    let kept: Vec<String> = std::fs::read_dir(w.data.join("gcnet"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
        .collect();
    assert_eq!(kept.len(), 2, "pod A's two addresses only: {kept:?}");
    w.exec("ptp", "CHECK", &ida, a.path_str()).run(&with_prev(&conf, &ra)).ok_silent();
    gc_exec("STATUS").run(&conf).ok_silent();
    // A STATUS whose IPAM cannot work: code 50 from host-local (its dataDir is a file).
    let file = w.data.join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let mut bad: Value = serde_json::from_str(&conf).unwrap();
    bad["ipam"]["dataDir"] = json!(file.to_str().unwrap());
    gc_exec("STATUS").run(&bad.to_string()).err(50);
    w.exec("ptp", "DEL", &ida, a.path_str()).run(&conf).ok_silent();
    w.exec("ptp", "DEL", &idb, b.path_str()).run(&conf).ok_silent();
    assert_eq!(w.leaks("gcnet"), Vec::<String>::new());
}

/// Bad input: the right code, and the host exactly as it was (no veth, no rule, no address,
/// no reservation).
#[test]
fn bad_input_gets_the_right_code_and_changes_nothing() {
    let w = World::new();
    let (pod, id) = w.pod();
    let good: Value = serde_json::from_str(&w.conf("badnet", json!({"ipMasq": true}))).unwrap();
    let with = |k: &str, v: Value| {
        let mut c = good.clone();
        c[k] = v;
        c.to_string()
    };
    let mut no_ipam = good.clone();
    no_ipam.as_object_mut().unwrap().remove("ipam");
    let mut hostile_ipam = good.clone();
    hostile_ipam["ipam"]["type"] = json!("../../bin/sh");
    let cases: Vec<(String, u64, &str)> = vec![
        (with("mtu", json!(20)), 7, "mtu 20"),
        (with("mtu", json!("1400")), 6, "mtu"),
        (with("ipMasqBackend", json!("iptables")), 2, "ipMasqBackend"),
        (with("ipMasqBackend", json!("bpf")), 7, "ipMasqBackend"),
        (with("ipMasq", json!("yes")), 6, "ipMasq"),
        (no_ipam.to_string(), 7, "ipam"),
        (hostile_ipam.to_string(), 7, "ipam.type"),
        (with("cniVersion", json!("9.9.9")), 1, ""),
        ("{\"cniVersion\": \"1.1.0\", \"name\": \"badnet\", \"type\": \"ptp\"".to_string(), 6, ""),
    ];
    let before = ns_state(&w.host);
    let ctr_before = ns_state(&pod);
    for (conf, code, part) in &cases {
        let out = w.exec("ptp", "ADD", &id, pod.path_str()).run(conf);
        let msg = out.err(*code);
        assert!(msg.contains(part), "{conf}: {msg}");
    }
    // The container's interface name taken: refused before anything is reserved.
    pod.run("ip", &["link", "add", "eth0", "type", "veth", "peer", "name", "other0"]);
    let taken = ns_state(&pod);
    let msg = w.exec("ptp", "ADD", &id, pod.path_str()).run(&good.to_string()).err(999);
    assert!(msg.contains("already exists"), "{msg}");
    assert_eq!(ns_state(&pod), taken, "the foreign eth0 is left as it was");
    // CNI_NETNS of the plugin's own namespace (the host): code 8.
    let out = Exec::new(w.bins.join("ptp").to_str().unwrap())
        .in_ns(&w.host)
        .attachment("ADD", &id, "/proc/self/ns/net", "eth0", w.bins.str())
        .run(&good.to_string());
    out.err(8);
    assert_eq!(ns_state(&w.host), before, "the host is unchanged");
    pod.run("ip", &["link", "del", "eth0"]);
    assert_eq!(ns_state(&pod), ctr_before);
    assert_eq!(w.leaks("badnet"), Vec::<String>::new(), "no reservation");
    // DEL with a bad value only ADD judges still cleans up (and changes nothing here); a
    // hostile IPAM type is refused by DEL and GC too, before anything is run or touched.
    w.exec("ptp", "DEL", &id, pod.path_str()).run(&with("mtu", json!(20))).ok_silent();
    w.exec("ptp", "DEL", &id, pod.path_str()).run(&hostile_ipam.to_string()).err(7);
    let mut gc = hostile_ipam.clone();
    gc["cni.dev/valid-attachments"] = json!([]);
    Exec::new(w.bins.join("ptp").to_str().unwrap())
        .in_ns(&w.host)
        .env("CNI_COMMAND", "GC")
        .env("CNI_PATH", w.bins.str())
        .run(&gc.to_string())
        .err(7);
    assert_eq!(ns_state(&w.host), before, "the host is still unchanged");
}

/// SIGKILL during ADD at any moment from start to finish, then what a runtime does after a
/// failed ADD (DEL), or the pod's namespace dropped and GC: nothing left either way.
#[test]
fn sigkill_during_add_then_del_or_gc_leaves_nothing() {
    let w = World::new();
    let conf = w.conf("crashnet", json!({"ipMasq": true}));
    // A normal ADD's wall time bounds the kill points.
    let mut typical = Vec::new();
    for _ in 0..3 {
        let (pod, id) = w.pod();
        let start = Instant::now();
        w.exec("ptp", "ADD", &id, pod.path_str()).run(&conf).ok();
        typical.push(start.elapsed());
        w.exec("ptp", "DEL", &id, pod.path_str()).run(&conf).ok_silent();
    }
    typical.sort();
    let span = typical[1].as_micros() as u64 * 12 / 10 + 1;
    let trials = 24u64;
    let mut seed =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1;
    eprintln!("ptp crash: {trials} trials, seed {seed}");
    for trial in 0..trials {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let delay = Duration::from_micros(seed % span);
        let (pod, id) = w.pod();
        let mut child = w.exec("ptp", "ADD", &id, pod.path_str()).spawn(&conf);
        let start = Instant::now();
        while start.elapsed() < delay {
            std::hint::spin_loop();
        }
        let _ = child.kill();
        let _ = child.wait();
        if trial % 2 == 0 {
            let out: PluginOutput = w.exec("ptp", "DEL", &id, pod.path_str()).run(&conf);
            out.ok_silent();
            assert!(pod.link("eth0").is_none(), "trial {trial} ({delay:?}): eth0 left");
        } else {
            drop(pod);
            wait_until("the dropped namespace's veth pair to go", Duration::from_secs(10), || {
                !w.host.link_names().iter().any(|l| l.starts_with("veth"))
            });
            let mut gc: Value = serde_json::from_str(&conf).unwrap();
            gc["cni.dev/valid-attachments"] = json!([]);
            Exec::new(w.bins.join("ptp").to_str().unwrap())
                .in_ns(&w.host)
                .env("CNI_COMMAND", "GC")
                .env("CNI_PATH", w.bins.str())
                .run(&gc.to_string())
                .ok_silent();
        }
        assert_eq!(
            w.leaks("crashnet"),
            Vec::<String>::new(),
            "trial {trial}: killed after {delay:?} (seed {seed})"
        );
    }
}

/// conf-examples/kind-kindnet.conflist as kindnetd writes it (cniVersion 0.3.1, ptp without
/// ipMasq, host-local, portmap), with only our binaries on CNI_PATH: ADD, a host port from
/// outside, pod to pod, CHECK, DEL, nothing left.
#[test]
fn kinds_kindnet_conflist_runs_on_our_binaries_alone() {
    let w = World::new();
    let n = w.n;
    let text = std::fs::read_to_string(workspace_root().join("conf-examples/kind-kindnet.conflist")).unwrap();
    let list: Value = serde_json::from_str(&text).unwrap();
    let mut plugins = list["plugins"].as_array().unwrap().clone();
    // the node's pod CIDRs and a scratch dataDir
    plugins[0]["ipam"]["dataDir"] = json!(w.data.str());
    plugins[0]["ipam"]["ranges"] =
        json!([[{"subnet": format!("10.{n}.8.0/24")}], [{"subnet": format!("fd00:{n}:8::/64")}]]);
    let bins = cni_path_with(&["ptp", "host-local", "portmap"]);
    let chain = Chain {
        name: list["name"].as_str().unwrap().into(),
        version: list["cniVersion"].as_str().unwrap().into(),
        plugins,
        cni_path: bins.path().to_path_buf(),
    };
    let caps = json!({"portMappings": [{"hostPort": 8081, "containerPort": 80, "protocol": "tcp"}]});
    let (a, ida) = w.pod();
    let (b, idb) = w.pod();
    let (ra, _) =
        chain.add(&ida, a.path_str(), "eth0", &caps, Some(&w.host)).unwrap_or_else(|s| panic!("{s:?}"));
    let (rb, _) =
        chain.add(&idb, b.path_str(), "eth0", &json!({}), Some(&w.host)).unwrap_or_else(|s| panic!("{s:?}"));
    assert_eq!(ra["cniVersion"], "0.3.1");
    {
        let _s = Server::tcp(&a, 80, "podA");
        assert_eq!(
            fetch(&w.outside, &format!("10.250.{n}.1"), 8081),
            format!("podA 10.250.{n}.2"),
            "host port from outside"
        );
        assert_eq!(
            fetch(&b, &addr_of(&ra, true), 80),
            format!("podA {}", addr_of(&rb, true)),
            "pod to pod (IPv6)"
        );
    }
    // libcni runs no CHECK for 0.3.1: the same list at 1.0.0 (the 0.3.1 result as prevResult)
    let newer = Chain { version: "1.0.0".into(), ..chain.clone() };
    for s in newer.check(&ida, a.path_str(), "eth0", &caps, &ra, Some(&w.host)) {
        assert_eq!(s.out.code, 0, "CHECK {}: {}", s.plugin, s.out.stdout);
    }
    chain.del(&ida, a.path_str(), "eth0", &caps, Some(&ra), Some(&w.host));
    chain.del(&idb, b.path_str(), "eth0", &json!({}), Some(&rb), Some(&w.host));
    assert_eq!(w.leaks("kindnet"), Vec::<String>::new());
}

/// Upstream's ptp with `ipMasq` and no `ipMasqBackend` masquerades with iptables where
/// `iptables` exists (a chain `CNI-…` in table nat, jumped to from POSTROUTING): our CHECK
/// accepts that form and our DEL removes it with the rest of the attachment.
#[test]
fn upstreams_iptables_masquerade_is_checked_and_deleted_by_ours() {
    let w = World::new();
    let upstream = Path::new(&upstream_release_dir()).join("ptp");
    let conf = w.conf("iptnet", json!({"ipMasq": true}));
    let (pod, id) = w.pod();
    let r = w.exec(upstream.to_str().unwrap(), "ADD", &id, pod.path_str()).run(&conf).ok();
    let nat = |cmd: &str| String::from_utf8_lossy(&w.host.run(cmd, &["-t", "nat", "-S"]).stdout).into_owned();
    assert!(nat("iptables").contains("-j MASQUERADE"), "upstream wrote iptables rules: {}", nat("iptables"));
    w.exec("ptp", "CHECK", &id, pod.path_str()).run(&with_prev(&conf, &r)).ok_silent();
    w.exec("ptp", "DEL", &id, pod.path_str()).run(&conf).ok_silent();
    for cmd in ["iptables", "ip6tables"] {
        let left = nat(cmd);
        assert!(!left.contains("CNI-"), "{cmd}: {left}");
    }
    assert!(pod.link("eth0").is_none());
    assert_eq!(w.leaks("iptnet"), Vec::<String>::new());
}

/// Eight pods ADDed at once on one network with `ipMasq` (the first ADDs race to create the
/// shared masquerade table and its hook), then DELeted at once while a GC keeping none of them
/// runs: every ADD succeeds with its own rules, every pod reaches the outside, and nothing is
/// left at the end.
#[test]
fn concurrent_adds_dels_and_gc_on_one_network() {
    let w = World::new();
    let n = w.n;
    let conf = w.conf("racenet", json!({"ipMasq": true}));
    let pods: Vec<(Netns, String)> = (0..8).map(|_| w.pod()).collect();
    let results: Vec<Value> = std::thread::scope(|s| {
        let handles: Vec<_> = pods
            .iter()
            .map(|(ns, id)| s.spawn(|| w.exec("ptp", "ADD", id, ns.path_str()).run(&conf).ok()))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let rules = String::from_utf8_lossy(
        &w.host.run("nft", &["list", "chain", "inet", "cni_plugins_masquerade", "masq_checks"]).stdout,
    )
    .into_owned();
    for ((_, id), r) in pods.iter().zip(&results) {
        assert_eq!(rules.matches(&format!("id: {id}")).count(), 2, "{id}: {rules}");
        assert_eq!(r["ips"].as_array().unwrap().len(), 2);
    }
    let post = w.host.run("nft", &["list", "chain", "inet", "cni_plugins_masquerade", "postrouting"]);
    assert_eq!(String::from_utf8_lossy(&post.stdout).matches("goto masq_checks").count(), 1, "one hook");
    {
        let _so = Server::tcp(&w.outside, 80, "outside");
        for (ns, _) in &pods {
            assert_eq!(fetch(ns, &format!("10.250.{n}.2"), 80), format!("outside 10.250.{n}.1"));
        }
    }
    let mut gc: Value = serde_json::from_str(&conf).unwrap();
    gc["cni.dev/valid-attachments"] = json!([]);
    std::thread::scope(|s| {
        for (ns, id) in &pods {
            s.spawn(|| w.exec("ptp", "DEL", id, ns.path_str()).run(&conf).ok_silent());
        }
        s.spawn(|| {
            Exec::new(w.bins.join("ptp").to_str().unwrap())
                .in_ns(&w.host)
                .env("CNI_COMMAND", "GC")
                .env("CNI_PATH", w.bins.str())
                .run(&gc.to_string())
                .ok_silent()
        });
    });
    assert_eq!(w.leaks("racenet"), Vec::<String>::new());
}

/// Every spec version: ADD answers in the configuration's version (0.1.0 and 0.2.0 with `ip4`
/// and `ip6`, later ones with `interfaces` and `ips`), DEL cleans up.
#[test]
fn every_spec_version() {
    let w = World::new();
    for v in ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        let mut c: Value = serde_json::from_str(&w.conf("vernet", json!({}))).unwrap();
        c["cniVersion"] = json!(v);
        let conf = c.to_string();
        let (pod, id) = w.pod();
        let r = w.exec("ptp", "ADD", &id, pod.path_str()).run(&conf).ok();
        assert_eq!(r["cniVersion"], v);
        if v.starts_with("0.1") || v.starts_with("0.2") {
            assert!(r["ip4"]["ip"].as_str().unwrap().starts_with(&format!("10.{}.7.", w.n)), "{v}: {r}");
            assert!(r["ip6"]["ip"].is_string(), "{v}: {r}");
        } else {
            assert_eq!(r["ips"].as_array().unwrap().len(), 2, "{v}: {r}");
            assert_eq!(r["interfaces"][1]["sandbox"], pod.path_str(), "{v}");
        }
        assert!(pod.link("eth0").is_some());
        w.exec("ptp", "DEL", &id, pod.path_str()).run(&conf).ok_silent();
        assert!(pod.link("eth0").is_none(), "{v}");
    }
    assert_eq!(w.leaks("vernet"), Vec::<String>::new());
}

/// Issue 38's two survivors on the real kernel. The pod's IPv6 address outlives `eth0` going
/// down and up (ADD sets `keep_addr_on_down`, as upstream does; without it the kernel drops
/// the address). CHECK fails once the host routes to the pod, prefix for prefix the same, go
/// through another device: the host cannot reach the pod any more.
#[test]
fn ipv6_address_survives_eth0_down_up_and_check_sees_host_routes_on_another_device() {
    let w = World::new();
    let conf = w.conf("kindnet", json!({}));
    let (a, ida) = w.pod();
    let ra = w.exec("ptp", "ADD", &ida, a.path_str()).run(&conf).ok();
    let a6 = addr_of(&ra, true);
    let before = addrs(&a, "eth0");
    assert!(before.iter().any(|x| x.starts_with(&format!("{a6}/"))), "{before:?}");
    a.run("ip", &["link", "set", "eth0", "down"]);
    a.run("ip", &["link", "set", "eth0", "up"]);
    assert_eq!(addrs(&a, "eth0"), before, "the pod's addresses after eth0 down and up");
    let sysctl = a.run("sysctl", &["-n", "net.ipv6.conf.eth0.keep_addr_on_down"]).stdout;
    assert_eq!(sysctl, b"1\n");

    // A second pod (the first one's routes went with eth0 down): CHECK passes, then its host
    // routes are moved onto another device of the host's.
    let (b, idb) = w.pod();
    let rb = w.exec("ptp", "ADD", &idb, b.path_str()).run(&conf).ok();
    let (b4, b6) = (addr_of(&rb, false), addr_of(&rb, true));
    w.exec("ptp", "CHECK", &idb, b.path_str()).run(&with_prev(&conf, &rb)).ok_silent();
    // A veth pair of the host's own (no dummy module on every kernel), both ends up.
    w.host.run("ip", &["link", "add", "conform-d0", "type", "veth", "peer", "name", "conform-d1"]);
    for dev in ["conform-d0", "conform-d1"] {
        w.host.run("ip", &["link", "set", dev, "up"]);
    }
    w.host.run("ip", &["route", "replace", &format!("{b4}/32"), "dev", "conform-d0"]);
    w.host.run("ip", &["-6", "route", "replace", &format!("{b6}/128"), "dev", "conform-d0"]);
    let msg = w.exec("ptp", "CHECK", &idb, b.path_str()).run(&with_prev(&conf, &rb)).err(999);
    assert!(msg.contains("host route"), "{msg}");
    w.host.run("ip", &["link", "del", "conform-d0"]);
    for (ns, id) in [(&a, &ida), (&b, &idb)] {
        w.exec("ptp", "DEL", id, ns.path_str()).run(&conf).ok_silent();
    }
    assert_eq!(w.leaks("kindnet"), Vec::<String>::new());
}
