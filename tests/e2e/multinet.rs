//! One pod on several networks, as Multus and the Kubernetes DRA network drivers attach them
//! (issue 39 item 3): the same container id with `eth0` on network A (bridge + host-local +
//! portmap + bandwidth), `net1` on network B (ptp + host-local, ipMasq) and `net2` on network C
//! (bridge on another bridge + host-local), each a conflist run through our cnitool (libcni's
//! cache), on a fake host namespace. Everything the plugins key by (container id, ifname) — and
//! by network — must stay apart: ADD in either order, CHECK of each, DEL of one, GC of one
//! network with a valid list naming only some attachments, a second ADD with an ifname already
//! in use, `cni-migrate resync` after a flush, and a caller that never sends DEL (the DRA
//! reference driver's libcni path), cleaned up after by GC and host-local's liveness reclaim.
//!
//! Per attachment a snapshot ([`Node::snapshot`]) holds what is its own: its pod interface
//! (link, addresses, routes), its host interfaces, the nft lines that name its addresses, host
//! interfaces or MAC, its qdiscs and ifb, its host-local reservations. Another attachment's
//! operations must leave it byte for byte.

use cni_tests::traffic::{fetch, Server};
use cni_tests::{
    bin, cni_path_with, dir_state, unique, wait_until, without_counters, Netns, PodNetns, TempDir,
};
use serde_json::{json, Value};
use std::process::Output;
use std::time::Duration;

const HOST4: &str = "192.0.2.1";
const OUTSIDE4: &str = "192.0.2.2";
const HOST6: &str = "2001:db8:1::1";
const OUTSIDE6: &str = "2001:db8:1::2";

#[derive(Clone, Copy, Debug, PartialEq)]
enum Fam {
    V4,
    V6,
    Dual,
}

impl Fam {
    fn v4(self) -> bool {
        self != Fam::V6
    }
    fn v6(self) -> bool {
        self != Fam::V4
    }
}

/// The three networks: (name, pod interface).
const A: (&str, &str) = ("mnA", "eth0");
const B: (&str, &str) = ("mnB", "net1");
const C: (&str, &str) = ("mnC", "net2");

/// host-local's IPAM block for network number `n` (71, 72, 73): one range per family; `one`
/// makes each range a single address (for the liveness reclaim).
fn ipam(fam: Fam, n: u8, data: &TempDir, default_route: bool, one: bool) -> Value {
    let mut ranges = Vec::new();
    let mut routes = Vec::new();
    if fam.v4() {
        let mut r = json!({"subnet": format!("10.{n}.0.0/24")});
        if one {
            r["rangeStart"] = json!(format!("10.{n}.0.10"));
            r["rangeEnd"] = json!(format!("10.{n}.0.10"));
        }
        ranges.push(json!([r]));
        routes.push(json!({"dst": "0.0.0.0/0"}));
    }
    if fam.v6() {
        let mut r = json!({"subnet": format!("2001:db8:{n}::/64")});
        if one {
            r["rangeStart"] = json!(format!("2001:db8:{n}::10"));
            r["rangeEnd"] = json!(format!("2001:db8:{n}::10"));
        }
        ranges.push(json!([r]));
        routes.push(json!({"dst": "::/0"}));
    }
    let mut v = json!({"type": "host-local", "ranges": ranges, "dataDir": data.str()});
    if default_route {
        v["routes"] = json!(routes);
    }
    v
}

/// An attachment made: its network, pod interface, container id, pod namespace path and result.
#[derive(Clone)]
struct Att {
    net: &'static str,
    ifname: &'static str,
    id: String,
    netns: String,
    result: Value,
}

impl Att {
    /// The words that name this attachment's state on the host: its addresses, its host-side
    /// interfaces (not the bridges, which are shared), its pod MAC, its ifb.
    fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.result["ips"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|ip| ip["address"].as_str())
            .map(|a| a.split('/').next().unwrap().to_string())
            .collect();
        for i in self.result["interfaces"].as_array().into_iter().flatten() {
            let name = i["name"].as_str().unwrap_or_default();
            if i.get("sandbox").is_some() {
                if let Some(mac) = i["mac"].as_str() {
                    keys.push(mac.to_string());
                }
            } else if !name.starts_with("mnbr") && !name.is_empty() {
                keys.push(name.to_string());
            }
        }
        keys
    }

    /// Host-side interfaces (veth ends and ifbs), not the bridges.
    fn host_links(&self) -> Vec<String> {
        self.result["interfaces"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|i| i.get("sandbox").is_none())
            .filter_map(|i| i["name"].as_str())
            .filter(|n| !n.starts_with("mnbr"))
            .map(str::to_string)
            .collect()
    }

    fn gateways(&self) -> Vec<String> {
        self.result["ips"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|ip| ip["gateway"].as_str().map(str::to_string))
            .collect()
    }
}

/// Whether `key` occurs in `line` as a whole word (not as a part of a longer address or name).
fn has_word(line: &str, key: &str) -> bool {
    let word = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | ':' | '_' | '-');
    let mut from = 0;
    while let Some(at) = line[from..].find(key) {
        let start = from + at;
        let end = start + key.len();
        let before_ok = line[..start].chars().next_back().is_none_or(|c| !word(c));
        let after_ok =
            line[end..].chars().next().is_none_or(|c| !c.is_ascii_alphanumeric() && c != '.' && c != ':');
        if before_ok && after_ok {
            return true;
        }
        from = start + 1;
    }
    false
}

/// `text`'s lines without what the kernel changes by itself (counters, timers, carrier and
/// operational state, link-local addresses and their routes, DAD flags), set elements one a
/// line (so one attachment's element is a line of its own).
fn stable_lines(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in without_counters(text).lines() {
        // (a local route comes with its address, once its DAD is over: the address is listed)
        if line.contains("RX:")
            || line.contains("TX:")
            || line.contains("fe80")
            || line.contains("ff00::/8")
            || line.contains("table local")
        {
            continue;
        }
        let mut words = line.split_whitespace().peekable();
        let mut kept = Vec::new();
        while let Some(w) = words.next() {
            let state =
                w == "state" && words.peek().is_some_and(|n| n.chars().all(|c| c.is_ascii_uppercase()));
            if state || w.ends_with("_timer") {
                words.next();
            } else if !matches!(w, "linkdown" | "tentative") {
                kept.push(w.replace("NO-CARRIER,", "").replace(",LOWER_UP", ""));
            }
        }
        for part in kept.join(" ").split(", ") {
            // a set's first element shares its line with `elements = {`, its last with `}`:
            // which element that is changes when another attachment's goes
            let part = part.trim_start_matches("elements = { ").trim_end_matches(" }").trim_end_matches(',');
            out.push(part.to_string());
        }
    }
    out
}

/// A fake node: host and outside namespaces joined by a veth, the three networks' conflists,
/// a libcni cache and host-local's store.
struct Node {
    host: Netns,
    outside: Netns,
    plugins: TempDir,
    conf: TempDir,
    cache: TempDir,
    data: TempDir,
}

impl Node {
    fn new(fam: Fam, one_address: bool) -> Node {
        let host = Netns::new("mnh");
        let outside = Netns::new("mno");
        host.run(
            "ip",
            &["link", "add", "up0", "type", "veth", "peer", "name", "eth0", "netns", outside.name()],
        );
        for (ns, dev, a4, a6) in [(&host, "up0", HOST4, HOST6), (&outside, "eth0", OUTSIDE4, OUTSIDE6)] {
            ns.run("ip", &["addr", "add", &format!("{a4}/24"), "dev", dev]);
            ns.run("ip", &["addr", "add", &format!("{a6}/64"), "dev", dev, "nodad"]);
            ns.run("ip", &["link", "set", dev, "up"]);
            ns.run("ip", &["link", "set", "lo", "up"]);
        }
        let n = Node {
            host,
            outside,
            plugins: cni_path_with(&["bridge", "ptp", "host-local", "portmap", "bandwidth"]),
            conf: TempDir::new("mnconf"),
            cache: TempDir::new("mncache"),
            data: TempDir::new("mndata"),
        };
        let a = json!({"cniVersion": "1.1.0", "name": A.0, "plugins": [
            {"type": "bridge", "bridge": "mnbrA", "isGateway": true, "ipMasq": true,
             "macspoofchk": true, "hairpinMode": true,
             "ipam": ipam(fam, 71, &n.data, true, one_address)},
            {"type": "portmap", "capabilities": {"portMappings": true}, "snat": true},
            {"type": "bandwidth", "capabilities": {"bandwidth": true}}]});
        let b = json!({"cniVersion": "1.1.0", "name": B.0, "plugins": [
            {"type": "ptp", "ipMasq": true, "ipam": ipam(fam, 72, &n.data, false, one_address)}]});
        let c = json!({"cniVersion": "1.1.0", "name": C.0, "plugins": [
            {"type": "bridge", "bridge": "mnbrC", "isGateway": true, "macspoofchk": true,
             "ipam": ipam(fam, 73, &n.data, false, one_address)}]});
        for (file, list) in [("10-a.conflist", a), ("20-b.conflist", b), ("30-c.conflist", c)] {
            std::fs::write(n.conf.join(file), list.to_string()).unwrap();
        }
        n
    }

    /// cnitool `verb` of (`id`, `ifname`) on `net`; `keep` is CNI_GC_KEEP for gc.
    fn cnitool(
        &self,
        verb: &str,
        (net, ifname): (&str, &str),
        id: &str,
        netns: &str,
        caps: &Value,
        keep: &str,
    ) -> Output {
        self.host
            .command(bin("cnitool"))
            .args([verb, net, netns])
            .env("CNI_PATH", self.plugins.path())
            .env("NETCONFPATH", self.conf.path())
            .env("CNI_CACHE_DIR", self.cache.path())
            .env("CNI_CONTAINERID", id)
            .env("CNI_IFNAME", ifname)
            .env("CAP_ARGS", caps.to_string())
            .env("CNI_GC_KEEP", keep)
            .output()
            .expect("run cnitool")
    }

    fn add(&self, (net, ifname): (&'static str, &'static str), id: &str, netns: &str, caps: &Value) -> Att {
        let out = self.cnitool("add", (net, ifname), id, netns, caps, "");
        assert!(out.status.success(), "ADD {net}/{id}/{ifname}: {}", String::from_utf8_lossy(&out.stderr));
        let result = serde_json::from_slice(&out.stdout).expect("ADD prints the result");
        Att { net, ifname, id: id.to_string(), netns: netns.to_string(), result }
    }

    fn check(&self, att: &Att, caps: &Value) -> Result<(), String> {
        let out = self.cnitool("check", (att.net, att.ifname), &att.id, &att.netns, caps, "");
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    fn del(&self, att: &Att, caps: &Value) {
        let out = self.cnitool("del", (att.net, att.ifname), &att.id, &att.netns, caps, "");
        assert!(
            out.status.success(),
            "DEL {}/{}/{}: {}",
            att.net,
            att.id,
            att.ifname,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// cnitool gc of `net` keeping `keep` (`id:ifname,…`; empty: none).
    fn gc(&self, net: &str, keep: &str) {
        let out = self.cnitool("gc", (net, "eth0"), "gc", "/run/netns/none", &json!({}), keep);
        eprintln!("--- gc {net} keeping {keep:?}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "GC {net} keeping {keep:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Forget the cache entry of `att`, as a caller that never kept one (or lost it).
    fn forget(&self, att: &Att) {
        let p = self.cache.join(format!("results/{}-{}-{}", att.net, att.id, att.ifname));
        std::fs::remove_file(&p).unwrap_or_else(|e| panic!("remove {}: {e}", p.display()));
    }

    fn lines(&self, program: &str, args: &[&str]) -> Vec<String> {
        let out = self.host.try_run(program, args);
        stable_lines(&String::from_utf8_lossy(&out.stdout))
    }

    /// What is `att`'s own on the host and in its pod (see the module doc). `pod` runs a
    /// command in the pod namespace.
    fn snapshot(&self, att: &Att) -> String {
        let keys = att.keys();
        let named = |lines: Vec<String>| -> Vec<String> {
            lines.into_iter().filter(|l| keys.iter().any(|k| has_word(l, k))).collect()
        };
        let mut s = Vec::new();
        s.push(format!("== {}/{}/{}", att.net, att.id, att.ifname));
        // sorted: a rebuilt table may list its rules in another order than ADD made them
        let mut nft = named(self.lines("nft", &["list", "ruleset"]));
        nft.sort();
        s.extend(nft);
        for dev in att.host_links() {
            s.extend(self.lines("ip", &["-d", "link", "show", "dev", &dev]));
            s.extend(self.lines("ip", &["-o", "addr", "show", "dev", &dev]));
            s.extend(self.lines("tc", &["qdisc", "show", "dev", &dev]));
            s.extend(self.lines("tc", &["filter", "show", "dev", &dev, "ingress"]));
            s.extend(self.lines("tc", &["filter", "show", "dev", &dev, "egress"]));
        }
        s.extend(named(self.lines("ip", &["route", "show", "table", "all"])));
        s.extend(named(self.lines("ip", &["-6", "route", "show", "table", "all"])));
        for (name, content) in dir_state(&self.data.join(att.net)) {
            if keys.iter().any(|k| has_word(&name, k)) {
                s.push(format!("{name}: {}", String::from_utf8_lossy(&content)));
            }
        }
        // the pod side, when the pod is still there
        let pod = |args: &[&str]| -> Vec<String> {
            let net = format!("--net={}", att.netns);
            let mut all = vec![net.as_str(), "ip"];
            all.extend_from_slice(args);
            let out = std::process::Command::new("nsenter").args(&all).output().expect("nsenter");
            stable_lines(&String::from_utf8_lossy(&out.stdout))
        };
        if std::path::Path::new(&att.netns).exists() {
            s.extend(pod(&["-d", "link", "show", "dev", att.ifname]));
            s.extend(pod(&["-o", "addr", "show", "dev", att.ifname]));
            s.extend(pod(&["route", "show", "table", "all", "dev", att.ifname]));
            s.extend(pod(&["-6", "route", "show", "table", "all", "dev", att.ifname]));
        }
        s.join("\n")
    }

    /// What is left of `att` on the host: its nft lines, host links, reservations, routes
    /// (its snapshot without the header and pod side).
    fn remnants(&self, att: &Att) -> Vec<String> {
        let keys = att.keys();
        let mut found: Vec<String> = self
            .lines("nft", &["list", "ruleset"])
            .into_iter()
            .filter(|l| keys.iter().any(|k| has_word(l, k)))
            .map(|l| format!("nft: {l}"))
            .collect();
        for dev in att.host_links() {
            if self.host.link(&dev).is_some() {
                found.push(format!("link {dev}"));
            }
        }
        for (name, _) in dir_state(&self.data.join(att.net)) {
            if keys.iter().any(|k| has_word(&name, k)) {
                found.push(format!("reservation {name}"));
            }
        }
        found
    }

    /// Ping every gateway of `att` from its pod (bounded: IPv6 addresses leave DAD on their own
    /// time).
    fn ping_gateways(&self, ctr: &Netns, att: &Att) {
        let gws = att.gateways();
        assert!(!gws.is_empty(), "{}: a gateway in {}", att.net, att.result);
        for gw in gws {
            wait_until(
                &format!("{} ({}) to answer from {}", gw, att.net, att.ifname),
                Duration::from_secs(10),
                || ctr.try_run("ping", &["-c1", "-W1", "-I", att.ifname, &gw]).status.success(),
            );
        }
    }
}

fn caps_a(port: u16) -> Value {
    json!({"portMappings": [{"hostPort": port, "containerPort": 80, "protocol": "tcp"}],
           "bandwidth": {"ingressRate": 8_000_000, "ingressBurst": 800_000,
                         "egressRate": 16_000_000, "egressBurst": 1_600_000}})
}

fn caps_for(net: &str, port: u16) -> Value {
    if net == A.0 {
        caps_a(port)
    } else {
        json!({})
    }
}

fn assert_same(before: &[String], after: &[String], what: &str) {
    assert_eq!(before.len(), after.len(), "{what}");
    for (b, a) in before.iter().zip(after) {
        if a != b {
            let gone: Vec<&str> = b.lines().filter(|l| !a.lines().any(|x| x == *l)).collect();
            let new: Vec<&str> = a.lines().filter(|l| !b.lines().any(|x| x == *l)).collect();
            panic!("{what}\n--- gone: {gone:#?}\n+++ new: {new:#?}\n--- before:\n{b}\n+++ after:\n{a}");
        }
    }
}

/// The whole matrix for one family and one ADD order.
fn one_pod_on_three_networks(fam: Fam, order: [(&'static str, &'static str); 3]) {
    const PORT: u16 = 18_480;
    const PORT2: u16 = 18_481;
    let node = Node::new(fam, false);
    let ctr = Netns::new("mnp");
    let id = unique("mnctr");
    let mut atts: Vec<Att> =
        order.iter().map(|&n| node.add(n, &id, ctr.path_str(), &caps_for(n.0, PORT))).collect();
    atts.sort_by_key(|a| a.net);
    let (a, b, c) = (atts[0].clone(), atts[1].clone(), atts[2].clone());
    for att in &atts {
        node.check(att, &caps_for(att.net, PORT))
            .unwrap_or_else(|e| panic!("CHECK {} after the ADDs: {e}", att.net));
        node.ping_gateways(&ctr, att);
    }
    let _server = Server::tcp(&ctr, 80, "podA");
    let host_addrs: Vec<&str> =
        [(fam.v4(), HOST4), (fam.v6(), HOST6)].iter().filter(|x| x.0).map(|x| x.1).collect();
    let outside_of = |h: &str| if h == HOST4 { OUTSIDE4 } else { OUTSIDE6 };
    for h in &host_addrs {
        let got = fetch(&node.outside, h, PORT);
        assert_eq!(got, format!("podA {}", outside_of(h)), "the host port on A reaches the pod over {h}");
    }

    // ---- DEL of B leaves A and C as they were
    let snaps = |atts: &[&Att]| atts.iter().map(|a| node.snapshot(a)).collect::<Vec<_>>();
    let before = snaps(&[&a, &c]);
    let data_before = [dir_state(&node.data.join(A.0)), dir_state(&node.data.join(C.0))];
    node.del(&b, &json!({}));
    assert_same(&before, &snaps(&[&a, &c]), "DEL of B changed A's or C's state");
    assert_eq!(
        [dir_state(&node.data.join(A.0)), dir_state(&node.data.join(C.0))],
        data_before,
        "DEL of B touched A's or C's store"
    );
    assert!(node.remnants(&b).is_empty(), "B's DEL left: {:?}", node.remnants(&b));
    assert!(ctr.link(B.1).is_none(), "net1 gone from the pod");
    for att in [&a, &c] {
        node.check(att, &caps_for(att.net, PORT))
            .unwrap_or_else(|e| panic!("CHECK {} after DEL of B: {e}", att.net));
    }
    let b = node.add(B, &id, ctr.path_str(), &json!({}));

    // ---- a second ADD of the pod with an ifname it already has on another network
    let before = snaps(&[&a, &b, &c]);
    let out = node.cnitool("add", (C.0, A.1), &id, ctr.path_str(), &json!({}), "");
    assert!(
        !out.status.success(),
        "ADD of C with eth0 (A's) must be refused: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    // the runtime cleans up its failed ADD with a DEL of what it asked for
    let out = node.cnitool("del", (C.0, A.1), &id, ctr.path_str(), &json!({}), "");
    assert!(out.status.success(), "DEL of the refused attachment: {}", String::from_utf8_lossy(&out.stderr));
    assert_same(
        &before,
        &snaps(&[&a, &b, &c]),
        "a refused ADD (and its DEL) with A's ifname on C changed the pod",
    );
    // the same on B (ptp) with C's net2
    let out = node.cnitool("add", (B.0, C.1), &id, ctr.path_str(), &json!({}), "");
    assert!(
        !out.status.success(),
        "ADD of B with net2 (C's) must be refused: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = node.cnitool("del", (B.0, C.1), &id, ctr.path_str(), &json!({}), "");
    assert!(out.status.success(), "DEL of the refused attachment: {}", String::from_utf8_lossy(&out.stderr));
    assert_same(
        &before,
        &snaps(&[&a, &b, &c]),
        "a refused ADD (and its DEL) with C's ifname on B changed the pod",
    );
    for att in [&a, &b, &c] {
        node.check(att, &caps_for(att.net, PORT))
            .unwrap_or_else(|e| panic!("CHECK {} after the refused ADD: {e}", att.net));
    }

    // ---- GC of A naming only (ctr, eth0), with a second pod's attachment on A unknown to it
    let ctr2 = Netns::new("mnq");
    let id2 = unique("mnpod");
    let other = node.add(A, &id2, ctr2.path_str(), &caps_a(PORT2));
    assert!(!node.remnants(&other).is_empty());
    node.forget(&other);
    let before = snaps(&[&a, &b, &c]);
    node.gc(A.0, &format!("{id}:{}", A.1));
    assert_same(&before, &snaps(&[&a, &b, &c]), "GC of A keeping (ctr, eth0) changed the pod");
    let left: Vec<String> = node
        .remnants(&other)
        .into_iter()
        .filter(|r| !r.starts_with("link mn") && !r.starts_with("link veth"))
        .collect();
    assert!(left.is_empty(), "GC of A left the other pod's state: {left:?}");
    // and GC of B and C keeping the pod's attachments changes nothing of it
    node.gc(B.0, &format!("{id}:{}", B.1));
    node.gc(C.0, &format!("{id}:{}", C.1));
    assert_same(&before, &snaps(&[&a, &b, &c]), "GC of B and C keeping the pod changed it");
    for att in [&a, &b, &c] {
        node.check(att, &caps_for(att.net, PORT))
            .unwrap_or_else(|e| panic!("CHECK {} after GC: {e}", att.net));
    }

    // ---- a firewall reload: resync rebuilds every attachment of the pod
    node.host.run("nft", &["flush", "ruleset"]);
    let out = node
        .host
        .command(bin("cni-migrate"))
        .args(["resync", "--cache-dir", node.cache.str(), "--cni-bin-dir", node.plugins.str()])
        .output()
        .expect("run cni-migrate");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(10), "resync rebuilt something: {text}");
    for (att, plugin) in [(&a, "bridge"), (&b, "ptp"), (&c, "bridge")] {
        let line = format!("{}/{id}/{}: {plugin}: repaired", att.net, att.ifname);
        assert!(text.lines().any(|l| l.contains(&line)), "{line} in {text}");
        node.check(att, &caps_for(att.net, PORT))
            .unwrap_or_else(|e| panic!("CHECK {} after resync: {e}\n{text}", att.net));
    }
    assert_same(&before, &snaps(&[&a, &b, &c]), "resync rebuilt the pod differently");
    for h in &host_addrs {
        assert_eq!(
            fetch(&node.outside, h, PORT),
            format!("podA {}", outside_of(h)),
            "host port after resync"
        );
    }

    // ---- DEL of all, in the ADD order
    for &(net, _) in &order {
        let att = [&a, &b, &c].into_iter().find(|x| x.net == net).unwrap();
        node.del(att, &caps_for(net, PORT));
        assert!(node.remnants(att).is_empty(), "DEL of {net} left: {:?}", node.remnants(att));
    }
    let out = node.cnitool("del", (A.0, A.1), &id2, ctr2.path_str(), &caps_a(PORT2), "");
    assert!(
        out.status.success(),
        "DEL of the other pod without a cache entry: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn multinet_v4_abc() {
    one_pod_on_three_networks(Fam::V4, [A, B, C]);
}

#[test]
fn multinet_v4_cba() {
    one_pod_on_three_networks(Fam::V4, [C, B, A]);
}

#[test]
fn multinet_v6_abc() {
    one_pod_on_three_networks(Fam::V6, [A, B, C]);
}

#[test]
fn multinet_v6_cba() {
    one_pod_on_three_networks(Fam::V6, [C, B, A]);
}

#[test]
fn multinet_dual_abc() {
    one_pod_on_three_networks(Fam::Dual, [A, B, C]);
}

#[test]
fn multinet_dual_cba() {
    one_pod_on_three_networks(Fam::Dual, [C, B, A]);
}

/// A caller that never sends DEL: the pod's namespace goes, then GC of each network with an
/// empty valid list (`with_cache`: libcni's cache still holds the attachments, so cnitool's gc
/// DELs them first, as libcni's GCNetworkList; without: the plugins' GC alone) frees every
/// reservation, veth, rule and ifb.
fn pod_gone_without_del(fam: Fam, with_cache: bool) {
    let node = Node::new(fam, false);
    let pod = PodNetns::new("mnr");
    let id = unique("mngone");
    let atts: Vec<Att> =
        [A, B, C].iter().map(|&n| node.add(n, &id, pod.path(), &caps_for(n.0, 18_482))).collect();
    for att in &atts {
        assert!(!node.remnants(att).is_empty(), "{} made state", att.net);
    }
    pod.delete();
    for att in &atts {
        if !with_cache {
            node.forget(att);
        }
        node.gc(att.net, "");
    }
    for att in &atts {
        // the veths go with the namespace, on the kernel's time
        wait_until(&format!("{}'s state to go", att.net), Duration::from_secs(10), || {
            node.remnants(att).is_empty()
        });
    }
}

#[test]
fn multinet_pod_gone_gc_frees_everything_v4() {
    pod_gone_without_del(Fam::V4, false);
}

#[test]
fn multinet_pod_gone_gc_frees_everything_dual() {
    pod_gone_without_del(Fam::Dual, false);
}

#[test]
fn multinet_pod_gone_gc_through_the_cache_dual() {
    pod_gone_without_del(Fam::Dual, true);
}

/// The liveness reclaim: pools of one address per network. A pod on all three dies without
/// DEL; the next pod's ADDs on each network take the dead pod's address (host-local judges the
/// reservation dead), then GC keeping only the new pod removes the dead pod's rules and ifb and
/// leaves the new pod's — which name the same addresses — as they are.
#[test]
fn multinet_liveness_reclaim_then_gc_keeps_the_new_pod() {
    let node = Node::new(Fam::Dual, true);
    let dead = PodNetns::new("mnd");
    let id1 = unique("mndead");
    let old: Vec<Att> =
        [A, B, C].iter().map(|&n| node.add(n, &id1, dead.path(), &caps_for(n.0, 18_483))).collect();
    dead.delete();
    let live = Netns::new("mnl");
    let id2 = unique("mnlive");
    let new: Vec<Att> =
        [A, B, C].iter().map(|&n| node.add(n, &id2, live.path_str(), &caps_for(n.0, 18_484))).collect();
    for (o, n) in old.iter().zip(&new) {
        let ips = |a: &Att| a.result["ips"].clone();
        assert_eq!(ips(o), ips(n), "{}: the new pod got the dead pod's address", o.net);
        node.check(n, &caps_for(n.net, 18_484)).unwrap_or_else(|e| panic!("CHECK {}: {e}", n.net));
    }
    let before: Vec<String> = new.iter().map(|a| node.snapshot(a)).collect();
    for (o, n) in old.iter().zip(&new) {
        node.forget(o);
        node.gc(o.net, &format!("{id2}:{}", n.ifname));
    }
    // the new pod's snapshot names its addresses, and so the dead pod's rules of the same
    // addresses: those (its host ports by its id, its masquerade rules by a tag) are all that
    // may go, one masquerade rule per address stays
    for (o, (n, b)) in old.iter().zip(new.iter().zip(&before)) {
        let after = node.snapshot(n);
        let gone: Vec<&str> = b.lines().filter(|l| !after.lines().any(|x| x == *l)).collect();
        let added: Vec<&str> = after.lines().filter(|l| !b.lines().any(|x| x == *l)).collect();
        assert!(added.is_empty(), "{}: GC added {added:?}", n.net);
        for l in &gone {
            assert!(
                l.contains(&o.id) || l.contains("masquerade"),
                "{}: GC took the new pod's {l:?}\n{after}",
                n.net
            );
        }
        if n.net != C.0 {
            let masq = after.lines().filter(|l| l.contains("masquerade")).count();
            assert_eq!(
                masq,
                n.keys().iter().filter(|k| k.parse::<std::net::IpAddr>().is_ok()).count(),
                "{}: {after}",
                n.net
            );
        }
    }
    for (o, n) in old.iter().zip(&new) {
        node.check(n, &caps_for(n.net, 18_484)).unwrap_or_else(|e| panic!("CHECK {} after GC: {e}", n.net));
        // what names the old pod alone: its host links, its ifb, its MAC's spoof rules
        let own: Vec<String> = o
            .host_links()
            .into_iter()
            .chain(o.keys().into_iter().filter(|k| k.contains(':') && k.len() == 17))
            .collect();
        let left: Vec<String> = node
            .lines("nft", &["list", "ruleset"])
            .into_iter()
            .filter(|l| own.iter().any(|k| has_word(l, k)))
            .chain(o.host_links().into_iter().filter(|d| node.host.link(d).is_some()))
            .collect();
        assert!(left.is_empty(), "{}: the dead pod's state left after GC: {left:?}", o.net);
    }
    for n in &new {
        node.del(n, &caps_for(n.net, 18_484));
        assert!(node.remnants(n).is_empty(), "{}: {:?}", n.net, node.remnants(n));
    }
}

/// One network attached twice to one pod (Multus allows the same network under two ifnames):
/// (ctr, eth0) and (ctr, net3) on A. bandwidth's ifb is named from network and container id
/// only (upstream's name, which our DEL must find), so the second shaped attachment is refused
/// with a message saying so; the runtime's DEL of the refused one (bridge and portmap had made
/// their part) leaves eth0's attachment as it was, its ifb with it.
#[test]
fn multinet_one_network_twice() {
    const NET3: (&str, &str) = ("mnA", "net3");
    let node = Node::new(Fam::V4, false);
    let ctr = Netns::new("mnt");
    let id = unique("mntwice");
    let first = node.add(A, &id, ctr.path_str(), &caps_a(18_485));
    let before = node.snapshot(&first);
    let out = node.cnitool("add", NET3, &id, ctr.path_str(), &caps_a(18_486), "");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("one egress-shaped interface per network"), "{err}");
    let out = node.cnitool("del", NET3, &id, ctr.path_str(), &caps_a(18_486), "");
    assert!(out.status.success(), "DEL of the refused attachment: {}", String::from_utf8_lossy(&out.stderr));
    assert!(ctr.link(NET3.1).is_none(), "net3 is gone");
    assert_same(
        &[before],
        &[node.snapshot(&first)],
        "the refused net3 and its DEL changed eth0 on the same network",
    );
    node.check(&first, &caps_a(18_485)).unwrap_or_else(|e| panic!("CHECK eth0 after DEL of net3: {e}"));
    node.del(&first, &caps_a(18_485));
    assert!(node.remnants(&first).is_empty(), "{:?}", node.remnants(&first));
}
