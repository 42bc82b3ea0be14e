//! Swapping binaries on a node with running pods, both directions, against two upstream
//! releases (cni_tests::peers): Debian's plugins 1.1.1 (`/usr/lib/cni`), for both backends of
//! the `iptables` tool (upstream is pointed at `iptables-legacy` through a PATH directory of
//! symlinks), and today's containernetworking/plugins v1.10.0 with bridge `ipMasqBackend` and
//! portmap `backend` set to `iptables` (through iptables-nft and iptables-legacy) and to
//! `nftables` (knftables: an `nft` exec per call; tables `inet cni_plugins_masquerade`, which is
//! our bridge's own layout, and `ip`/`ip6 cni_hostport`, one DNAT rule per mapping commented with
//! the container id). Each scenario is one function over a [`Peer`]; the tests name the pairs.
//!
//! Configuration keys: the pods v1.10 makes carry the backend keys explicitly (the cached
//! configuration ours then CHECKs and DELs with). Our ADD refuses `"iptables"` (code 2: ours
//! write nftables only), so the pods ours make, and the configuration handed back to v1.10 by
//! to-upstream, carry the keys only for `nftables`; v1.10's default backend is iptables when
//! the `iptables` command is present, which is the same form.
//!
//! World per test: a fake **host** netns in which every plugin runs (the bridge `cbr0` is made
//! by the bridge plugin: isGateway, ipMasq, hairpin; host-local 10.<k>.0.0/24 and, for IPv6
//! cases, fd66:<k>::/64, `k` from the process id so that parallel tests' pods never share an
//! address: from-upstream finds a pod's namespace by its address), an **outside** netns on the
//! host's uplink (host 10.250.0.1 / fd01::1, outside .2 / ::2), and one netns per pod. The
//! chain is the kubenet-style list: bridge + host-local, portmap (hostPort 18080/tcp -> 80,
//! 18081/udp -> 81), bandwidth.
//!
//! Upstream 1.1.1's own portmap CHECK fails on every dual-family node: it checks the IPv4
//! container address against `ip6tables` too (and vice versa; fixed upstream after 1.1.1). The
//! control in `to_upstream_nft` shows that on upstream's own pod; where these tests run
//! upstream's CHECK of portmap, they run it once per family with only that family's tool on
//! PATH and prevResult reduced to that family, which is exactly upstream's check of that family.

use cni_tests::chain::Chain;
use cni_tests::leaks::leaks;
use cni_tests::peers::Release;
use cni_tests::traffic::{fetch, fetch_udp, Server, UdpServer};
use cni_tests::{
    bin, cni_path_with, skip_unless, wait_until, without_counters, workspace_root, Exec, Feature, Netns,
    PluginOutput, TempDir,
};
use serde_json::{json, Value};
use std::io::Write as _;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Where the iptables-mode peers' rules go: their `iptables` command's backend.
const NET: &str = "swapnet";
const BRIDGE: &str = "cbr0";
const HOST4: &str = "10.250.0.1";
const HOST6: &str = "fd01::1";
const HP_TCP: u16 = 18080;
const HP_UDP: u16 = 18081;
/// The pods' servers (the mappings' container ports).
const CTR_TCP: u16 = 80;
const CTR_UDP: u16 = 81;
/// A second pod's host ports.
const HP_C: u16 = 19080;
const VERSION: &str = "1.0.0";

/// The upstream release and the backend its bridge and portmap use.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Peer {
    release: Release,
    backend: Backend,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Backend {
    /// iptables rules, written through the `iptables` command of the given backend.
    Iptables(Ipt),
    /// v1.10's nftables backend (`ipMasqBackend`/`backend: "nftables"`).
    Nftables,
}

const DEBIAN_NFT: Peer = Peer { release: Release::Debian, backend: Backend::Iptables(Ipt::Nft) };
const DEBIAN_LEGACY: Peer = Peer { release: Release::Debian, backend: Backend::Iptables(Ipt::Legacy) };
const V110_IPT: Peer = Peer { release: Release::V1_10, backend: Backend::Iptables(Ipt::Nft) };
const V110_IPT_LEGACY: Peer = Peer { release: Release::V1_10, backend: Backend::Iptables(Ipt::Legacy) };
const V110_NFT: Peer = Peer { release: Release::V1_10, backend: Backend::Nftables };

impl Peer {
    /// The `iptables` command's backend on the peer's PATH (iptables-nft for the nftables
    /// backend: the command is there on such nodes too, and upstream's teardown runs it).
    fn ipt(self) -> Ipt {
        match self.backend {
            Backend::Iptables(i) => i,
            Backend::Nftables => Ipt::Nft,
        }
    }

    fn nftables(self) -> bool {
        self.backend == Backend::Nftables
    }

    /// The backend keys of bridge and portmap: explicit for v1.10 (`explicit`: also
    /// `"iptables"`, which only upstream's ADD accepts), none for 1.1.1 (it has no such keys).
    fn keys(self, explicit: bool) -> Option<&'static str> {
        match (self.release, self.backend) {
            (Release::Debian, _) => None,
            (Release::V1_10, Backend::Nftables) => Some("nftables"),
            (Release::V1_10, Backend::Iptables(_)) => explicit.then_some("iptables"),
        }
    }

    /// Legacy iptables needs a kernel with the x_tables nat table (skip otherwise, printed).
    fn available(self) -> bool {
        self.ipt() != Ipt::Legacy || skip_unless(Feature::IptablesLegacyNat)
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Ipt {
    Nft,
    Legacy,
}

impl Ipt {
    fn name(self) -> &'static str {
        match self {
            Ipt::Nft => "nft",
            Ipt::Legacy => "legacy",
        }
    }
}

/// A PATH directory where `iptables`/`ip6tables` (and -save/-restore) are the given backend's,
/// for the given families only.
fn shim(ipt: Ipt, fams: &[&str]) -> TempDir {
    let d = TempDir::new("ipt");
    for f in fams {
        for what in ["", "-save", "-restore"] {
            let target = format!("/usr/sbin/{f}-{}{what}", ipt.name());
            assert!(
                std::path::Path::new(&target).exists(),
                "{target} missing: scripts/install-deps.sh installs iptables"
            );
            std::os::unix::fs::symlink(&target, d.join(format!("{f}{what}"))).unwrap();
        }
    }
    // v1.10's nftables backend (knftables) runs `nft` from PATH
    std::os::unix::fs::symlink("/usr/sbin/nft", d.join("nft")).unwrap();
    d
}

/// The second octet of this process's pod subnets (nextest runs each test in a process).
fn subnet_key() -> u32 {
    60 + std::process::id() % 150
}

fn path_with(d: &TempDir) -> String {
    format!("{}:/usr/bin:/bin", d.str())
}

struct World {
    host: Netns,
    outside: Netns,
    data: TempDir,
    peer: Peer,
    ipt: Ipt,
    /// PATH for upstream's plugins: both families of the backend; one family only.
    path_all: String,
    path4: String,
    path6: String,
    _shims: Vec<TempDir>,
    ours: TempDir,
    v6: bool,
}

struct Pod {
    ns: Option<Netns>,
    id: String,
    name: &'static str,
    /// What the runtime passes as capability arguments (host ports, bandwidth).
    caps: Value,
}

impl Pod {
    fn ns(&self) -> &Netns {
        self.ns.as_ref().expect("pod netns")
    }

    fn netns_path(&self) -> String {
        self.ns.as_ref().map(|n| n.path_str().to_string()).unwrap_or_else(|| "/run/netns/gone".into())
    }
}

fn upstream_present(release: Release) {
    for p in ["bridge", "host-local", "portmap", "bandwidth"] {
        release.bin(p);
    }
}

impl World {
    fn new(peer: Peer, v6: bool) -> World {
        upstream_present(peer.release);
        let ipt = peer.ipt();
        let host = Netns::new("swh");
        let outside = Netns::new("swo");
        for ns in [&host, &outside] {
            ns.run("ip", &["link", "set", "lo", "up"]);
            ns.run(
                "sysctl",
                &["-qw", "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0"],
            );
        }
        host.run("sysctl", &["-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"]);
        // Bridged traffic must not meet iptables (br_netfilter): hairpin then depends on the
        // plugins' masquerading alone.
        for key in ["net.bridge.bridge-nf-call-iptables=0", "net.bridge.bridge-nf-call-ip6tables=0"] {
            host.try_run("sysctl", &["-qw", key]);
        }
        host.run(
            "ip",
            &["link", "add", "ext0", "type", "veth", "peer", "name", "up0", "netns", outside.name()],
        );
        host.run("ip", &["addr", "add", &format!("{HOST4}/24"), "dev", "ext0"]);
        host.run("ip", &["addr", "add", &format!("{HOST6}/64"), "dev", "ext0", "nodad"]);
        host.run("ip", &["link", "set", "ext0", "up"]);
        outside.run("ip", &["addr", "add", "10.250.0.2/24", "dev", "up0"]);
        outside.run("ip", &["addr", "add", "fd01::2/64", "dev", "up0", "nodad"]);
        outside.run("ip", &["link", "set", "up0", "up"]);
        outside.run("ip", &["route", "add", "default", "via", HOST4]);
        outside.run("ip", &["-6", "route", "add", "default", "via", HOST6]);
        let (all, s4, s6) =
            (shim(ipt, &["iptables", "ip6tables"]), shim(ipt, &["iptables"]), shim(ipt, &["ip6tables"]));
        World {
            path_all: path_with(&all),
            path4: path_with(&s4),
            path6: path_with(&s6),
            _shims: vec![all, s4, s6],
            host,
            outside,
            data: TempDir::new("swapdata"),
            peer,
            ipt,
            ours: cni_path_with(&["bridge", "host-local", "portmap", "bandwidth"]),
            v6,
        }
    }

    fn plugins(&self, snat: Option<bool>, explicit: bool) -> Vec<Value> {
        let k = subnet_key();
        let mut ranges = vec![json!([{"subnet": format!("10.{k}.0.0/24")}])];
        let mut routes = vec![json!({"dst": "0.0.0.0/0"})];
        if self.v6 {
            ranges.push(json!([{"subnet": format!("fd66:{k}::/64")}]));
            routes.push(json!({"dst": "::/0"}));
        }
        let mut pm = json!({"type": "portmap", "capabilities": {"portMappings": true}});
        if let Some(s) = snat {
            pm["snat"] = json!(s);
        }
        let mut br = json!({"type": "bridge", "bridge": BRIDGE, "isGateway": true, "ipMasq": true, "hairpinMode": true,
               "ipam": {"type": "host-local", "ranges": ranges, "routes": routes, "dataDir": self.data.str()}});
        if let Some(b) = self.peer.keys(explicit) {
            br["ipMasqBackend"] = json!(b);
            pm["backend"] = json!(b);
        }
        vec![br, pm, json!({"type": "bandwidth", "capabilities": {"bandwidth": true}})]
    }

    /// The chain ours can ADD with (backend keys only for nftables), run by upstream's
    /// binaries (`upstream`) or ours.
    fn chain(&self, upstream: bool, snat: Option<bool>) -> Chain {
        self.chain_keys(upstream, snat, false)
    }

    /// The chain of the pods the peer makes: v1.10's backend keys always explicit.
    fn peer_chain(&self, upstream: bool, snat: Option<bool>) -> Chain {
        self.chain_keys(upstream, snat, true)
    }

    fn chain_keys(&self, upstream: bool, snat: Option<bool>, explicit: bool) -> Chain {
        Chain {
            name: NET.into(),
            version: VERSION.into(),
            plugins: self.plugins(snat, explicit),
            cni_path: if upstream { self.peer.release.dir() } else { self.ours.path().to_path_buf() },
        }
    }

    fn pod(&self, name: &'static str) -> Pod {
        self.pod_with(name, caps())
    }

    fn pod_with(&self, name: &'static str, caps: Value) -> Pod {
        Pod { ns: Some(Netns::new("swc")), id: cni_tests::unique("ctr"), name, caps }
    }

    /// One plugin exec of `chain`, with `path` as PATH (upstream finds `iptables` there).
    fn exec(
        &self,
        c: &Chain,
        i: usize,
        cmd: &str,
        pod: &Pod,
        prev: Option<&Value>,
        path: &str,
    ) -> PluginOutput {
        let plugin = c.cni_path.join(c.plugin_type(i));
        Exec::new(plugin.to_str().unwrap())
            .in_ns(&self.host)
            .attachment(cmd, &pod.id, &pod.netns_path(), "eth0", c.cni_path.to_str().unwrap())
            .env("PATH", path)
            .run(&c.request(i, &pod.caps, prev))
    }

    fn add(&self, c: &Chain, pod: &Pod) -> Value {
        let mut prev: Option<Value> = None;
        for i in 0..c.plugins.len() {
            let out = self.exec(c, i, "ADD", pod, prev.as_ref(), &self.path_all);
            assert_eq!(out.code, 0, "ADD {} failed: {}{}", c.plugin_type(i), out.stdout, out.stderr);
            prev = Some(out.json());
        }
        prev.unwrap()
    }

    fn check(&self, c: &Chain, pod: &Pod, result: &Value) {
        for i in 0..c.plugins.len() {
            let out = self.exec(c, i, "CHECK", pod, Some(result), &self.path_all);
            assert_eq!(out.code, 0, "CHECK {} failed: {}{}", c.plugin_type(i), out.stdout, out.stderr);
        }
    }

    fn del(&self, c: &Chain, pod: &Pod, result: &Value) {
        for i in (0..c.plugins.len()).rev() {
            let out = self.exec(c, i, "DEL", pod, Some(result), &self.path_all);
            assert_eq!(out.code, 0, "DEL {} failed: {}{}", c.plugin_type(i), out.stdout, out.stderr);
        }
    }

    /// Upstream's CHECK of the whole chain (`up`, upstream's binaries): bridge and bandwidth as
    /// they are, portmap for 1.1.1 once per family (see the module documentation), for v1.10
    /// (which fixed that) as it is.
    fn upstream_check(&self, up: &Chain, pod: &Pod, result: &Value) {
        if self.peer.release == Release::V1_10 {
            return self.check(up, pod, result);
        }
        for i in [0, 2] {
            let out = self.exec(up, i, "CHECK", pod, Some(result), &self.path_all);
            assert_eq!(
                out.code,
                0,
                "upstream CHECK {} failed: {}{}",
                up.plugin_type(i),
                out.stdout,
                out.stderr
            );
        }
        for (v4, path) in [(true, &self.path4), (false, &self.path6)] {
            let mut r = result.clone();
            let ips: Vec<Value> = r["ips"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|ip| ip["address"].as_str().unwrap().contains('.') == v4)
                .cloned()
                .collect();
            if ips.is_empty() {
                continue;
            }
            r["ips"] = json!(ips);
            let out = self.exec(up, 1, "CHECK", pod, Some(&r), path);
            assert_eq!(
                out.code,
                0,
                "upstream CHECK portmap ({}) failed: {}{}",
                if v4 { "IPv4" } else { "IPv6" },
                out.stdout,
                out.stderr
            );
        }
    }

    fn ours_gc(&self, valid: &[&Pod]) {
        let v: Vec<(&str, &str)> = valid.iter().map(|p| (p.id.as_str(), "eth0")).collect();
        self.chain(false, None).gc(&v, Some(&self.host));
    }

    /// `nat` tables of the backend, both families (`*-save` text without its comments and
    /// without the built-in chains' packet counters: iptables-legacy keeps real ones, and the
    /// bridges' IGMP reports bump them at a moment of the kernel's choosing).
    fn iptables(&self) -> String {
        let mut s = String::new();
        for f in ["iptables", "ip6tables"] {
            let out = self.host.run(&format!("/usr/sbin/{f}-{}-save", self.ipt.name()), &["-t", "nat"]);
            // without the "# Generated … on <time>" lines
            for l in String::from_utf8_lossy(&out.stdout).lines().filter(|l| !l.starts_with('#')) {
                s.push_str(l);
                s.push('\n');
            }
        }
        without_counters(&s)
    }

    /// The host's nftables ruleset, without the counters of iptables-nft's rules.
    fn nft(&self) -> String {
        without_counters(&String::from_utf8_lossy(&self.host.try_run("nft", &["list", "ruleset"]).stdout))
    }

    /// The peer wrote its form of `pod`, in its backend and nowhere else: the iptables chains
    /// (`CNI-HOSTPORT-DNAT`, the masquerade chain) in the `iptables` backend under test, or the
    /// rules commented with the pod's id in `ip cni_hostport` and `inet cni_plugins_masquerade`.
    fn assert_peer_form(&self, pod: &Pod) {
        let (ipt, nft) = (self.iptables(), self.nft());
        let in_table = |table: &str| table_has(&nft, table, &pod.id);
        if self.peer.nftables() {
            assert!(
                in_table("ip cni_hostport") && in_table("inet cni_plugins_masquerade"),
                "{} wrote no nftables form of {}:\n{nft}",
                self.peer.release.name(),
                pod.id
            );
            assert!(!ipt.contains(&pod.id), "the nftables backend wrote iptables rules:\n{ipt}");
        } else {
            assert!(
                ipt.contains("CNI-HOSTPORT-DNAT") && ipt.contains(&pod.id),
                "{} wrote no iptables state:\n{ipt}",
                self.peer.release.name()
            );
            assert!(!in_table("ip cni_hostport"), "the iptables backend wrote cni_hostport:\n{nft}");
        }
    }

    /// The pod's rules in `inet cni_plugins_masquerade` as `nft` lists them, with its addresses
    /// and its comment's hashes and id replaced by placeholders (so two pods' rules compare).
    fn masq_rules_of(&self, pod: &Pod, result: &Value) -> Vec<String> {
        let out =
            self.host.try_run("nft", &["list", "chain", "inet", "cni_plugins_masquerade", "masq_checks"]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut rules: Vec<String> = text
            .lines()
            .filter(|l| l.contains(&pod.id))
            .map(|l| {
                let mut l = l.trim().to_string();
                for ip in result["ips"].as_array().unwrap() {
                    let addr = ip["address"].as_str().unwrap().split('/').next().unwrap();
                    l = l.replace(&format!("{addr} "), "ADDR ");
                }
                let hash = |s: &str| sha512_hex(s)[..16].to_string();
                l.replace(&hash(NET), "NETHASH")
                    .replace(&hash(&format!("eth0:{}", pod.id)), "IDHASH")
                    .replace(&pod.id, "ID")
            })
            .collect();
        rules.sort();
        rules
    }

    /// Everything of `pod` that may be left anywhere: iptables (this backend and, for
    /// iptables-nft, the nf_tables view), our tables, ifbs, reservations.
    fn assert_nothing_of(&self, pod: &Pod) {
        let hash = sha512_hex(&format!("{NET}{}", pod.id));
        let ipt = self.iptables();
        assert!(
            !ipt.contains(&pod.id) && !ipt.contains(&hash[..16]),
            "iptables state of {} left:\n{ipt}",
            pod.id
        );
        let nft = self.nft();
        assert!(
            !nft.contains(&pod.id) && !nft.contains(&hash[..16]),
            "nftables state of {} left:\n{nft}",
            pod.id
        );
        let ifb = format!("bwp{}", &hash[..12]);
        assert!(!self.host.link_names().contains(&ifb), "ifb {ifb} left");
        let store = self.data.join(NET);
        for e in std::fs::read_dir(&store).into_iter().flatten().flatten() {
            let content = std::fs::read_to_string(e.path()).unwrap_or_default();
            assert!(!content.contains(&pod.id), "reservation {:?} of {} left", e.file_name(), pod.id);
        }
    }

    /// Run `scripts/migrate.sh` in the host netns with upstream's PATH (so `iptables` is the
    /// backend under test) and our release-or-debug cni-migrate.
    fn migrate(&self, args: &[&str]) -> std::process::Output {
        let script = workspace_root().join("scripts/migrate.sh");
        let out = self
            .host
            .command(&script)
            .args(args)
            .args(["--data-dir", self.data.str(), "--cache-dir", &self.data.join("cache").to_string_lossy()])
            .args(["--cni-bin-dir", self.ours.str()])
            .env("CNI_MIGRATE", bin("cni-migrate"))
            .env(
                "PATH",
                format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", self.path_all.split(':').next().unwrap()),
            )
            .output()
            .expect("run scripts/migrate.sh");
        eprintln!(
            "migrate {args:?}: {}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }
}

fn caps() -> Value {
    json!({
        "portMappings": [{"hostPort": HP_TCP, "containerPort": CTR_TCP, "protocol": "tcp"},
                         {"hostPort": HP_UDP, "containerPort": CTR_UDP, "protocol": "udp"}],
        "bandwidth": {"ingressRate": 100_000_000, "ingressBurst": 1_000_000,
                      "egressRate": 100_000_000, "egressBurst": 1_000_000}
    })
}

/// Whether table `table` ("family name") of an `nft list ruleset` text mentions `needle`.
fn table_has(ruleset: &str, table: &str, needle: &str) -> bool {
    ruleset.find(&format!("table {table} {{")).is_some_and(|i| {
        let body = &ruleset[i..];
        let end = body[1..].find("\ntable ").map_or(body.len(), |e| e + 1);
        body[..end].contains(needle)
    })
}

/// sha512 hex via coreutils (independent of the code under test).
fn sha512_hex(s: &str) -> String {
    let mut child = Command::new("sha512sum").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8(out.stdout).unwrap()[..128].to_string()
}

// ---- traffic ----

/// The pod's host port answers from outside, from the host (its own address, and 127.0.0.1
/// for IPv4) and from the pod itself (hairpin), over IPv4 and, when it has one, IPv6 (with
/// `snat` off: from outside and the host address only, for upstream as for us).
fn assert_reachable(w: &World, pod: &Pod, snat: bool, what: &str) {
    let mut ways: Vec<(&Netns, &str, &str)> =
        vec![(&w.outside, HOST4, "outside -> host"), (&w.host, HOST4, "host -> host address")];
    if w.v6 {
        ways.push((&w.outside, HOST6, "outside -> host (IPv6)"));
    }
    // localhost and hairpin connections need the masquerading `snat` adds
    if snat {
        ways.extend([(&w.host, "127.0.0.1", "host -> 127.0.0.1"), (pod.ns(), HOST4, "hairpin")]);
        if w.v6 {
            ways.push((pod.ns(), HOST6, "hairpin (IPv6)"));
        }
    }
    for (ns, addr, how) in ways {
        let r = fetch(ns, addr, HP_TCP);
        assert!(r.starts_with(pod.name), "{what}: {how} ({addr}:{HP_TCP}) reached {r:?}, not {}", pod.name);
    }
}

fn result_ip4(r: &Value) -> String {
    r["ips"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["address"].as_str().unwrap())
        .find(|a| a.contains('.'))
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_string()
}

// ---- forward: ours takes over upstream's pods ----

/// Upstream ADDs a full-chain pod; ours CHECKs and DELs it; nothing of it is left; a new pod of
/// ours gets the same host ports and they work (TCP three ways, UDP after the conntrack flush).
fn adopt(peer: Peer, v6: bool, snat: Option<bool>, netns_gone: bool) {
    if !peer.available() {
        return;
    }
    let w = World::new(peer, v6);
    // upstream's pod: DELeted by ours with the configuration it was made with (the runtime's
    // cached one), CHECKed with the conflist as it is after the swap (libcni's CHECK takes the
    // current one): for v1.10's iptables backend the operator has removed the `"iptables"`
    // keys ours refuse (docs/switching.md); otherwise it is the same
    let (up, cached) = (w.peer_chain(true, snat), w.peer_chain(false, snat));
    let ours = w.chain(false, snat);
    let mut a = w.pod("podA");
    let ra = w.add(&up, &a);
    w.assert_peer_form(&a);
    let masq_a = w.masq_rules_of(&a, &ra);
    {
        let _s = Server::tcp(a.ns(), CTR_TCP, "podA");
        let _u = UdpServer::start(a.ns(), CTR_UDP, "podA");
        assert_reachable(&w, &a, snat != Some(false), "upstream's pod");
        let r = fetch_udp(&w.outside, HOST4, HP_UDP, 40000);
        assert!(r.starts_with("podA "), "UDP to upstream's pod reached {r:?}");
    }
    if cached.plugins != ours.plugins {
        // the unedited conflist: ours says which key to remove, and changes nothing
        let msg = w.exec(&cached, 0, "CHECK", &a, Some(&ra), &w.path_all).err(2);
        assert!(msg.contains("ipMasqBackend"), "{msg}");
        w.assert_peer_form(&a);
    }
    w.check(&ours, &a, &ra);
    if netns_gone {
        a.ns = None; // the runtime tore the sandbox down before DEL
    }
    w.del(&cached, &a, &ra);
    if netns_gone {
        // The pod's veth pair goes with its namespace, in the kernel's own time (the namespace
        // is cleaned up from a workqueue after its last reference is dropped); DEL, like
        // upstream's, has no namespace to delete it from.
        wait_until("the dropped namespace's veth pair to go", Duration::from_secs(10), || {
            w.host.link_names().iter().all(|l| ["lo", "ext0", BRIDGE].contains(&l.as_str()))
        });
    }
    w.assert_nothing_of(&a);
    let ct = w.host.run("conntrack", &["-L", "-p", "udp", "--dport", &HP_UDP.to_string()]);
    assert!(
        !String::from_utf8_lossy(&ct.stdout).contains(&format!("dport={HP_UDP}")),
        "UDP flows of the removed mapping still in conntrack: {}",
        String::from_utf8_lossy(&ct.stdout)
    );
    // The shared CNI-HOSTPORT-* chains (iptables), the cni_hostport tables (nftables) went
    // with the last pod using them.
    assert!(!w.iptables().contains("CNI-HOSTPORT"), "shared chains left:\n{}", w.iptables());
    assert!(!w.nft().contains("cni_hostport"), "upstream's cni_hostport left:\n{}", w.nft());
    let problems = leaks(&w.host, NET, w.data.path(), &["lo", "ext0", BRIDGE]);
    assert!(problems.is_empty(), "{problems:?}");

    let b = w.pod("podB");
    let rb = w.add(&ours, &b);
    if peer.nftables() {
        // one table, one form: our masquerade rules are v1.10's, rule for rule
        assert!(
            !masq_a.is_empty()
                && masq_a.iter().all(|r| r.contains("masquerade comment \"NETHASH-IDHASH, net: ")),
            "{masq_a:?}"
        );
        assert_eq!(w.masq_rules_of(&b, &rb), masq_a, "our masquerade rules differ from v1.10's");
    }
    let _s = Server::tcp(b.ns(), CTR_TCP, "podB");
    let _u = UdpServer::start(b.ns(), CTR_UDP, "podB");
    assert_reachable(&w, &b, snat != Some(false), "our new pod on the same host ports");
    let r = fetch_udp(&w.outside, HOST4, HP_UDP, 40000);
    assert!(r.starts_with("podB "), "UDP from the same client port reaches the new pod, not {r:?}");
    w.check(&ours, &b, &rb);
    w.del(&ours, &b, &rb);
    w.assert_nothing_of(&b);
}

#[test]
fn adopt_nft_ipv4() {
    adopt(DEBIAN_NFT, false, None, false);
}

#[test]
fn adopt_nft_dual_stack() {
    adopt(DEBIAN_NFT, true, None, false);
}

#[test]
fn adopt_nft_snat_off() {
    adopt(DEBIAN_NFT, false, Some(false), false);
}

#[test]
fn adopt_nft_netns_gone() {
    adopt(DEBIAN_NFT, true, None, true);
}

#[test]
fn adopt_legacy_ipv4() {
    adopt(DEBIAN_LEGACY, false, None, false);
}

#[test]
fn adopt_legacy_dual_stack() {
    adopt(DEBIAN_LEGACY, true, None, false);
}

#[test]
fn adopt_legacy_snat_off() {
    adopt(DEBIAN_LEGACY, false, Some(false), false);
}

#[test]
fn adopt_legacy_netns_gone() {
    adopt(DEBIAN_LEGACY, true, None, true);
}

#[test]
fn adopt_v110_iptables_ipv4() {
    adopt(V110_IPT, false, None, false);
}

#[test]
fn adopt_v110_iptables_dual_stack() {
    adopt(V110_IPT, true, None, false);
}

#[test]
fn adopt_v110_iptables_snat_off() {
    adopt(V110_IPT, false, Some(false), false);
}

#[test]
fn adopt_v110_iptables_netns_gone() {
    adopt(V110_IPT, true, None, true);
}

#[test]
fn adopt_v110_iptables_legacy_dual_stack() {
    adopt(V110_IPT_LEGACY, true, None, false);
}

#[test]
fn adopt_v110_nftables_ipv4() {
    adopt(V110_NFT, false, None, false);
}

#[test]
fn adopt_v110_nftables_dual_stack() {
    adopt(V110_NFT, true, None, false);
}

#[test]
fn adopt_v110_nftables_snat_off() {
    adopt(V110_NFT, false, Some(false), false);
}

#[test]
fn adopt_v110_nftables_netns_gone() {
    adopt(V110_NFT, true, None, true);
}

/// GC of a network removes exactly upstream's leftovers of its dead attachments: not those of
/// its live ones, not those of another network. One exception, v1.10's portmap nftables rules:
/// their comment is the bare container id, which names no network, so GC (for one network)
/// cannot tell a dead pod's from another network's and leaves them (unknown means alive; the
/// runtime's DEL removes them; docs/switching.md).
fn gc_leftovers(peer: Peer) {
    if !peer.available() {
        return;
    }
    let w = World::new(peer, true);
    let up = w.peer_chain(true, None);
    let (mut dead, live) = (w.pod("dead"), w.pod("live"));
    let foreign = w.pod_with(
        "foreign",
        json!({"portMappings": [{"hostPort": 19090, "containerPort": CTR_TCP, "protocol": "tcp"}]}),
    );
    let rd = w.add(&up, &dead);
    let rl = w.add(&up, &live);
    // Another network (own bridge and subnet) with a pod of its own on another host port.
    let mut other = w.peer_chain(true, None);
    other.name = "othernet".into();
    other.plugins[0]["bridge"] = json!("cbr1");
    other.plugins[0]["ipam"]["ranges"] = json!([[{"subnet": format!("10.{}.1.0/24", subnet_key())}]]);
    other.plugins[0]["ipam"]["routes"] = json!([{"dst": "0.0.0.0/0"}]);
    other.plugins.truncate(2);
    w.add(&other, &foreign);
    let dead_hash = sha512_hex(&format!("{NET}{}", dead.id));
    // The dead pod's sandbox goes without a DEL (a node crash, a runtime restart).
    let dead_veth = rd["interfaces"][1]["name"].as_str().unwrap().to_string();
    dead.ns = None;
    wait_until("the dead pod's host veth to go", Duration::from_secs(10), || {
        !w.host.link_names().contains(&dead_veth)
    });
    w.ours_gc(&[&live]);
    let ipt_text = w.iptables();
    assert!(
        !ipt_text.contains(&dead.id) && !ipt_text.contains(&dead_hash[..16]),
        "dead pod's rules left:\n{ipt_text}"
    );
    if peer.nftables() {
        let nft = w.nft();
        assert!(
            !table_has(&nft, "inet cni_plugins_masquerade", &dead.id),
            "dead pod's masquerade left:\n{nft}"
        );
        for p in [&live, &foreign] {
            assert!(
                table_has(&nft, "inet cni_plugins_masquerade", &p.id),
                "GC took {}'s masquerade:\n{nft}",
                p.name
            );
            assert!(table_has(&nft, "ip cni_hostport", &p.id), "GC took {}'s host ports:\n{nft}", p.name);
        }
        // the exception (above): GC cannot attribute the dead pod's port rules to a network
        assert!(table_has(&nft, "ip cni_hostport", &dead.id), "GC attributed a bare container id:\n{nft}");
    } else {
        assert!(
            ipt_text.contains(&live.id) && ipt_text.contains(&foreign.id),
            "GC took live or foreign rules:\n{ipt_text}"
        );
    }
    assert!(!w.host.link_names().contains(&format!("bwp{}", &dead_hash[..12])), "dead pod's ifb left");
    let live_ifb = format!("bwp{}", &sha512_hex(&format!("{NET}{}", live.id))[..12]);
    assert!(w.host.link_names().contains(&live_ifb), "live pod's ifb taken");
    assert!(
        !std::fs::read_dir(w.data.join(NET))
            .unwrap()
            .flatten()
            .any(|e| std::fs::read_to_string(e.path()).unwrap_or_default().contains(&dead.id)),
        "dead pod's reservation left"
    );
    // the live pod is still upstream's and intact: upstream's own check and ours pass
    w.upstream_check(&up, &live, &rl);
    w.check(&w.chain(false, None), &live, &rl);
    // GC again: nothing more goes
    let before = (w.iptables(), w.nft());
    w.ours_gc(&[&live]);
    assert_eq!((w.iptables(), w.nft()), before, "a second GC changed the {} state", w.ipt.name());
    if peer.nftables() {
        // the runtime's DEL of the dead pod (its cached result) takes the rest
        w.del(&w.peer_chain(false, None), &dead, &rd);
        w.assert_nothing_of(&dead);
    }
}

#[test]
fn gc_upstream_leftovers_nft() {
    gc_leftovers(DEBIAN_NFT);
}

#[test]
fn gc_upstream_leftovers_legacy() {
    gc_leftovers(DEBIAN_LEGACY);
}

#[test]
fn gc_upstream_leftovers_v110_iptables() {
    gc_leftovers(V110_IPT);
}

#[test]
fn gc_upstream_leftovers_v110_nftables() {
    gc_leftovers(V110_NFT);
}

// ---- backward and forward migration of live pods ----

/// A libcni cache entry for a pod (what containerd/CRI-O/Podman keep), so that to-upstream
/// takes the exact configuration from it.
fn write_cache(w: &World, c: &Chain, pod: &Pod, result: &Value) {
    let list = json!({"cniVersion": VERSION, "name": NET, "plugins": c.plugins});
    let mut b64 =
        Command::new("base64").args(["-w0"]).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    b64.stdin.take().unwrap().write_all(list.to_string().as_bytes()).unwrap();
    let config = String::from_utf8(b64.wait_with_output().unwrap().stdout).unwrap();
    let entry = json!({"kind": "cniCacheV1", "containerId": pod.id, "config": config, "ifName": "eth0",
                       "networkName": NET, "capabilityArgs": caps(), "result": result});
    let dir = w.data.join("cache/results");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("{NET}-{}-eth0", pod.id)), entry.to_string()).unwrap();
}

/// Fetch from outside in a loop while `f` runs; every answer must come from `name`.
fn during(w: &World, name: &str, f: impl FnOnce()) -> usize {
    /// Ends the probe loop also when `f` or a wait fails (the scope joins the prober).
    struct Stop<'a>(&'a AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let stop = AtomicBool::new(false);
    let count = AtomicUsize::new(0);
    let bad = std::thread::scope(|s| {
        let prober = s.spawn(|| {
            let mut bad = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let r = fetch(&w.outside, HOST4, HP_TCP);
                if !r.starts_with(name) {
                    bad.push(format!("{r:?} after {:?}", t.elapsed()));
                }
                count.fetch_add(1, Ordering::Relaxed);
            }
            bad
        });
        let stopper = Stop(&stop);
        // at least one probe before
        wait_until("a first probe", Duration::from_secs(10), || count.load(Ordering::Relaxed) > 0);
        f();
        let n = count.load(Ordering::Relaxed);
        wait_until("a probe after", Duration::from_secs(10), || count.load(Ordering::Relaxed) > n);
        drop(stopper);
        prober.join().unwrap()
    });
    assert!(bad.is_empty(), "host port of {name} failed during the migration: {bad:?}");
    count.load(Ordering::Relaxed)
}

fn to_upstream(peer: Peer) {
    if !peer.available() {
        return;
    }
    let w = World::new(peer, true);
    let ours = w.chain(false, None);
    let (a, b) = (w.pod("podA"), w.pod("podB"));
    let ra = w.add(&ours, &a);
    write_cache(&w, &ours, &a, &ra); // podA from the cache, podB rebuilt from our elements
    let _sa = Server::tcp(a.ns(), CTR_TCP, "podA");
    assert_reachable(&w, &a, true, "before to-upstream");
    // podB: no host port of its own (one owner per host port): masquerading only
    let ours_b = {
        let mut c = w.chain(false, None);
        c.plugins.remove(1);
        c
    };
    let rb = w.add(&ours_b, &b);
    // podC: host ports of its own and no cache entry: its upstream form is rebuilt from our
    // elements
    let c = w.pod_with(
        "podC",
        json!({"portMappings": [{"hostPort": HP_C, "containerPort": CTR_TCP, "protocol": "tcp"},
                                {"hostPort": HP_C + 1, "containerPort": CTR_UDP, "protocol": "udp"}],
               // (upstream 1.1.1's bandwidth CHECK dereferences nil without a bandwidth entry)
               "bandwidth": caps()["bandwidth"]}),
    );
    let rc = w.add(&ours, &c);
    let _sc = Server::tcp(c.ns(), CTR_TCP, "podC");
    let reach_c = |when: &str| {
        for (ns, addr) in [(&w.outside, HOST4), (&w.outside, HOST6), (c.ns(), HOST4), (c.ns(), HOST6)] {
            let r = fetch(ns, addr, HP_C);
            assert!(r.starts_with("podC"), "{when}: podC via {addr}:{HP_C} reached {r:?}");
        }
    };
    reach_c("before to-upstream");
    // v1.10's nftables backend: podA's cached configuration says so (ipMasqBackend/backend),
    // podB and podC (no cache entry) take --backend
    let args: &[&str] =
        if peer.nftables() { &["to-upstream", "--backend", "nftables"] } else { &["to-upstream"] };
    let probes = during(&w, "podA", || {
        let out = w.migrate(args);
        assert!(out.status.success(), "to-upstream failed");
    });
    assert!(probes >= 2);
    let nft = w.nft();
    assert!(!nft.contains("cni_portmap"), "our portmap table left:\n{nft}");
    if peer.nftables() {
        // the masquerade rules are upstream's nftables form already: kept, not converted
        for p in [&a, &b, &c] {
            assert!(
                table_has(&nft, "inet cni_plugins_masquerade", &p.id),
                "{}'s masquerade taken:\n{nft}",
                p.name
            );
        }
        for p in [&a, &c] {
            w.assert_peer_form(p);
        }
        assert!(!w.iptables().contains("CNI-"), "iptables rules written:\n{}", w.iptables());
    } else {
        assert!(!nft.contains("cni_plugins_masquerade"), "our masquerade table left:\n{nft}");
    }
    assert_reachable(&w, &a, true, "after to-upstream");
    reach_c("after to-upstream");
    // idempotent: a second run changes nothing
    let before = (w.iptables(), w.nft());
    assert!(w.migrate(args).status.success());
    assert_eq!((w.iptables(), w.nft()), before, "a second to-upstream changed something");
    // the binaries are upstream's again: their CHECK and DEL work and leave nothing of the pods
    w.upstream_check(&w.chain(true, None), &a, &ra);
    let up_b = {
        let mut c = w.chain(true, None);
        c.plugins.remove(1);
        c
    };
    for i in [0, 1] {
        let out = w.exec(&up_b, i, "CHECK", &b, Some(&rb), &w.path_all);
        assert_eq!(
            out.code,
            0,
            "upstream CHECK {} of podB: {}{}",
            up_b.plugin_type(i),
            out.stdout,
            out.stderr
        );
    }
    w.upstream_check(&w.chain(true, None), &c, &rc);
    w.del(&w.chain(true, None), &a, &ra);
    w.del(&up_b, &b, &rb);
    w.del(&w.chain(true, None), &c, &rc);
    for p in [&a, &b, &c] {
        w.assert_nothing_of(p);
    }
}

#[test]
fn to_upstream_nft() {
    // Control: upstream 1.1.1's portmap CHECK fails on its own dual-stack pod (it checks the
    // IPv4 rules in ip6tables): the reason upstream_check runs it per family.
    let w = World::new(DEBIAN_NFT, true);
    let up = w.chain(true, None);
    let p = w.pod("ctl");
    let r = w.add(&up, &p);
    let out = w.exec(&up, 1, "CHECK", &p, Some(&r), &w.path_all);
    assert_ne!(out.code, 0, "upstream 1.1.1's portmap CHECK of a dual-stack pod passed: the bug is fixed?");
    assert!(out.stdout.contains("could not check ipv6 dnat"), "{}", out.stdout);
    w.upstream_check(&up, &p, &r);
    w.del(&up, &p, &r);
    drop(w);
    to_upstream(DEBIAN_NFT);
}

#[test]
fn to_upstream_legacy() {
    to_upstream(DEBIAN_LEGACY);
}

#[test]
fn to_upstream_v110_iptables() {
    to_upstream(V110_IPT);
}

#[test]
fn to_upstream_v110_iptables_legacy() {
    to_upstream(V110_IPT_LEGACY);
}

#[test]
fn to_upstream_v110_nftables() {
    to_upstream(V110_NFT);
}

/// The whole round trip on one CNI bin directory, as an operator runs it: pods of v1.10 with its
/// binaries in the directory; `scripts/install.sh --force` puts ours there (keeping v1.10's as
/// `.orig`); ours adopt the old pod and make a new one; `scripts/install.sh --restore` puts
/// v1.10's back and `scripts/migrate.sh to-upstream` (`--backend nftables` for that backend)
/// hands the new pod to them with its host port probed throughout; then v1.10's CHECK and DEL
/// of both pods pass and leave nothing.
fn install_round_trip(peer: Peer) {
    if !peer.available() {
        return;
    }
    let w = World::new(peer, true);
    let dir = TempDir::new("cnibin");
    let units = TempDir::new("units");
    for p in ["bridge", "host-local", "portmap", "bandwidth", "loopback"] {
        std::fs::copy(peer.release.bin(p), dir.join(p)).unwrap();
    }
    let in_dir = |mut c: Chain| {
        c.cni_path = dir.path().to_path_buf();
        c
    };
    let install = |args: &[&str]| {
        let out = Command::new(workspace_root().join("scripts/install.sh"))
            .arg("--from")
            .arg(cni_tests::bin_dir())
            .arg("--unit-dir")
            .arg(units.path())
            .args(args)
            .arg(dir.path())
            .output()
            .expect("run install.sh");
        assert!(
            out.status.success(),
            "install.sh {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    for p in ["bridge", "portmap", "cni-migrate"] {
        bin(p); // fresh builds, or the test fails saying so
    }
    // podA: made by v1.10 (its configuration as cached: backend keys explicit), host ports HP_C
    let cached_a = in_dir(w.peer_chain(true, None));
    let a = w.pod_with(
        "podA",
        json!({"portMappings": [{"hostPort": HP_C, "containerPort": CTR_TCP, "protocol": "tcp"}],
               "bandwidth": caps()["bandwidth"]}),
    );
    let ra = w.add(&cached_a, &a);
    w.assert_peer_form(&a);
    let _sa = Server::tcp(a.ns(), CTR_TCP, "podA");
    install(&["--force"]);
    assert!(dir.join("portmap.orig").is_file(), "install.sh kept no portmap.orig");
    // ours in the directory: CHECK of podA with the conflist after the switch, a new pod
    let now = in_dir(w.chain(false, None));
    w.check(&now, &a, &ra);
    let b = w.pod("podB");
    let rb = w.add(&now, &b);
    write_cache(&w, &now, &b, &rb);
    let _sb = Server::tcp(b.ns(), CTR_TCP, "podB");
    assert_reachable(&w, &b, true, "podB of ours");
    // back to v1.10
    install(&["--restore"]);
    assert!(!dir.join("portmap.orig").exists(), "--restore left portmap.orig");
    let args: &[&str] =
        if peer.nftables() { &["to-upstream", "--backend", "nftables"] } else { &["to-upstream"] };
    during(&w, "podB", || {
        let out = w.migrate(args);
        assert!(out.status.success(), "to-upstream failed");
    });
    assert!(!w.nft().contains("cni_portmap"), "our portmap table left:\n{}", w.nft());
    assert_reachable(&w, &b, true, "podB after to-upstream");
    assert!(fetch(&w.outside, HOST4, HP_C).starts_with("podA"), "podA's host port after the round trip");
    // v1.10's own CHECK and DEL of both pods (podB with the conflist it was made with)
    w.upstream_check(&now, &b, &rb);
    w.upstream_check(&cached_a, &a, &ra);
    w.del(&now, &b, &rb);
    w.del(&cached_a, &a, &ra);
    for p in [&a, &b] {
        w.assert_nothing_of(p);
    }
}

#[test]
fn install_round_trip_v110_iptables() {
    install_round_trip(V110_IPT);
}

#[test]
fn install_round_trip_v110_nftables() {
    install_round_trip(V110_NFT);
}

fn from_upstream(peer: Peer) {
    if !peer.available() {
        return;
    }
    let w = World::new(peer, true);
    let up = w.peer_chain(true, None);
    let a = w.pod("podA");
    let ra = w.add(&up, &a);
    if peer.nftables() {
        // cni_hostport's rules name only the container: the runtime's cache names the rest
        write_cache(&w, &up, &a, &ra);
    }
    let _sa = Server::tcp(a.ns(), CTR_TCP, "podA");
    assert_reachable(&w, &a, true, "before from-upstream");
    during(&w, "podA", || {
        let out = w.migrate(&["from-upstream"]);
        assert!(out.status.success(), "from-upstream failed");
    });
    let ipt_text = w.iptables();
    assert!(!ipt_text.contains("CNI-"), "upstream's chains left:\n{ipt_text}");
    assert!(w.nft().contains("cni_portmap"), "our tables were not written");
    assert!(
        !table_has(&w.nft(), "ip cni_hostport", &a.id),
        "upstream's cni_hostport rules left:\n{}",
        w.nft()
    );
    assert_reachable(&w, &a, true, "after from-upstream");
    assert!(w.migrate(&["from-upstream"]).status.success(), "second run");
    // CHECK with the conflist after the swap, DEL with the cached one (see adopt)
    w.check(&w.chain(false, None), &a, &ra);
    w.del(&w.peer_chain(false, None), &a, &ra);
    w.assert_nothing_of(&a);
}

#[test]
fn from_upstream_nft() {
    from_upstream(DEBIAN_NFT);
}

#[test]
fn from_upstream_legacy() {
    from_upstream(DEBIAN_LEGACY);
}

#[test]
fn from_upstream_v110_iptables() {
    from_upstream(V110_IPT);
}

#[test]
fn from_upstream_v110_nftables() {
    from_upstream(V110_NFT);
}

/// Without `iptables` there is no upstream form to write: the script and the tool say so, exit
/// 2 and change nothing. (A private mount namespace hides the iptables binaries.)
#[test]
fn to_upstream_without_iptables_changes_nothing() {
    let w = World::new(DEBIAN_NFT, false);
    let ours = w.chain(false, None);
    let a = w.pod("podA");
    let ra = w.add(&ours, &a);
    let before = (w.nft(), w.iptables());
    let hide = "for f in /usr/sbin/iptables /usr/sbin/ip6tables /usr/sbin/iptables-nft /usr/sbin/iptables-legacy; do \
                mount --bind /dev/null $f; done; exec \"$@\"";
    for tool in [workspace_root().join("scripts/migrate.sh"), bin("cni-migrate")] {
        let out = w
            .host
            .command("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", hide, "sh"])
            .arg(&tool)
            .args(["to-upstream", "--data-dir", w.data.str()])
            .env("CNI_MIGRATE", bin("cni-migrate"))
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{}: {err}", tool.display());
        assert!(err.contains("iptables is not installed"), "{err}");
    }
    assert_eq!((w.nft(), w.iptables()), before, "something changed");
    w.del(&ours, &a, &ra);
}

/// For upstream's nftables backend `iptables` is not needed: with it hidden, the script and the
/// tool hand a pod of ours to v1.10's nftables form (`--backend nftables`), which v1.10's CHECK
/// and DEL then accept.
#[test]
fn to_upstream_nftables_needs_no_iptables() {
    let w = World::new(V110_NFT, false);
    let ours = w.chain(false, None);
    let a = w.pod("podA");
    let ra = w.add(&ours, &a);
    let _s = Server::tcp(a.ns(), CTR_TCP, "podA");
    let hide = "for f in /usr/sbin/iptables /usr/sbin/ip6tables /usr/sbin/iptables-nft /usr/sbin/iptables-legacy; do \
                mount --bind /dev/null $f; done; exec \"$@\"";
    let out = w
        .host
        .command("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", hide, "sh"])
        .arg(workspace_root().join("scripts/migrate.sh"))
        .args(["to-upstream", "--backend", "nftables", "--data-dir", w.data.str()])
        .args(["--cache-dir", &w.data.join("cache").to_string_lossy()])
        .env("CNI_MIGRATE", bin("cni-migrate"))
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!w.nft().contains("cni_portmap"), "our portmap table left:\n{}", w.nft());
    w.assert_peer_form(&a);
    assert_reachable(&w, &a, true, "after to-upstream without iptables");
    let up = w.chain(true, None);
    w.upstream_check(&up, &a, &ra);
    w.del(&up, &a, &ra);
    w.assert_nothing_of(&a);
}

// ---- upstream's nftables backend (v1.6+) ----

/// The state upstream's portmap nftables backend writes for one container, as
/// plugins/meta/portmap/portmap_nftables.go builds it (knftables transaction, written here as
/// an nft script): table ip cni_hostport, its chains, one DNAT rule per mapping and the
/// masquerade rules, all commented with the container id.
fn nft_backend_script(id: &str, ctr: &str, hostport: u16) -> String {
    format!(
        "add table ip cni_hostport {{ comment \"CNI portmap plugin\" ; }}\n\
         add chain ip cni_hostport hostports\n\
         add chain ip cni_hostport hostip_hostports\n\
         add chain ip cni_hostport hostports_all\n\
         flush chain ip cni_hostport hostports_all\n\
         add rule ip cni_hostport hostports_all jump hostip_hostports\n\
         add rule ip cni_hostport hostports_all jump hostports\n\
         add chain ip cni_hostport prerouting {{ type nat hook prerouting priority -100 ; }}\n\
         flush chain ip cni_hostport prerouting\n\
         add rule ip cni_hostport prerouting fib daddr type local jump hostports_all\n\
         add chain ip cni_hostport output {{ type nat hook output priority -100 ; }}\n\
         flush chain ip cni_hostport output\n\
         add rule ip cni_hostport output fib daddr type local jump hostports_all\n\
         add chain ip cni_hostport masquerading {{ type nat hook postrouting priority 100 ; }}\n\
         add rule ip cni_hostport hostports tcp dport {hostport} dnat to {ctr}:80 comment \"{id}\"\n\
         add rule ip cni_hostport hostports udp dport {} dnat to {ctr}:81 comment \"{id}\"\n\
         add rule ip cni_hostport masquerading ip saddr {ctr} ip daddr {ctr} masquerade comment \"{id}\"\n\
         add rule ip cni_hostport masquerading ip saddr 127.0.0.1 ip daddr {ctr} masquerade comment \"{id}\"\n",
        hostport + 1
    )
}

#[test]
fn upstream_nftables_backend_form() {
    let w = World::new(DEBIAN_NFT, false);
    let ours = w.chain(false, None);
    let (a, other) = (w.pod("podA"), w.pod("other"));
    // podA's bridge/bandwidth by ours, its host ports in upstream's nftables form
    let mut no_pm = w.chain(false, None);
    no_pm.plugins.remove(1);
    let ra = w.add(&no_pm, &a);
    let ip = result_ip4(&ra);
    let script = format!(
        "{}{}",
        nft_backend_script(&a.id, &ip, HP_TCP),
        nft_backend_script(&other.id, &format!("10.{}.0.200", subnet_key()), 19090)
    );
    let mut nft = w.host.command("nft").args(["-f", "-"]).stdin(Stdio::piped()).spawn().unwrap();
    nft.stdin.take().unwrap().write_all(script.as_bytes()).unwrap();
    assert!(nft.wait().unwrap().success());
    {
        let _s = Server::tcp(a.ns(), CTR_TCP, "podA");
        let r = fetch(&w.outside, HOST4, HP_TCP);
        assert!(r.starts_with("podA"), "the upstream-form DNAT works: {r:?}");
    }
    // CHECK passes on the intact form, and fails when a rule is missing
    w.check(&ours, &a, &ra);
    let handle = {
        let out = w.host.run("nft", &["-a", "list", "chain", "ip", "cni_hostport", "masquerading"]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let line = text.lines().find(|l| l.contains(&a.id) && l.contains("127.0.0.1")).unwrap().to_string();
        line.rsplit("# handle ").next().unwrap().trim().to_string()
    };
    w.host.run("nft", &["delete", "rule", "ip", "cni_hostport", "masquerading", "handle", &handle]);
    let out = w.exec(&ours, 1, "CHECK", &a, Some(&ra), &w.path_all);
    assert_ne!(out.code, 0, "CHECK passed with a masquerade rule missing");
    assert!(out.stdout.contains("masquerading"), "{}", out.stdout);
    // GC cannot attribute these rules to a network (the comment is the bare container id)
    let before = w.nft();
    w.ours_gc(&[&a]);
    assert!(w.nft().contains(&other.id), "GC removed another container's rules");
    assert_eq!(before.matches("comment").count(), w.nft().matches("comment").count());
    // DEL removes podA's rules only; the table goes with the last rule
    w.del(&ours, &a, &ra);
    let after = w.nft();
    assert!(!after.contains(&a.id), "podA's rules left:\n{after}");
    assert!(after.contains(&other.id), "another container's rules removed:\n{after}");
    let o = Pod { ns: None, id: other.id.clone(), name: "other", caps: caps() };
    let out = w.exec(&ours, 1, "DEL", &o, None, &w.path_all);
    assert_eq!(out.code, 0, "{}", out.stdout);
    assert!(!w.nft().contains("cni_hostport"), "empty cni_hostport table left:\n{}", w.nft());
}
