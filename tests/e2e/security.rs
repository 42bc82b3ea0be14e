//! Issue 27, the second security review: one test per finding, each run against the build of
//! the previous main (`cf0d296`, built by scripts/build-baseline.sh, unoptimised: what matters
//! is its behaviour) where it must reproduce the finding, and against this build, where it must
//! not. Findings 1 and 2 through `cni-migrate resync` are in tests/e2e/resync.rs.
//!
//! Topology of the portmap findings (all in namespaces the test creates): a fake **host** with a
//! bridge `br0` (10.<n>.0.1/24) wired the way the bridge plugin wires it, containers on it, and
//! an uplink `ext0` (10.250.<n>.1/24) to an **outside** namespace.

use cni_tests::raw::{self, SynProbe, TcpTap, TCP_SYN};
use cni_tests::traffic::{fetch, Server};
use cni_tests::{bin, cni_path_with, unique, workspace_root, Exec, Netns, PluginOutput, TempDir};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

/// The previous main, on which the review reproduced every finding.
const BASELINE: &str = "cf0d296";

/// Which build a scenario runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Build {
    Before,
    Now,
}

/// A binary (`portmap`, `host-local`, `bridge`, `cni-migrate`) of `b`. The baseline's are all
/// built in one call (build-baseline.sh replaces its directory when asked for other names).
fn exe(b: Build, name: &str) -> String {
    match b {
        Build::Now => bin(name).display().to_string(),
        Build::Before => {
            let root = workspace_root();
            let out = Command::new(root.join("scripts/build-baseline.sh"))
                .args([BASELINE, "portmap", "host-local", "bridge", "cni-migrate"])
                .env("BASELINE_PROFILE", "dev")
                .current_dir(&root)
                .output()
                .expect("run scripts/build-baseline.sh");
            assert!(
                out.status.success(),
                "cannot build {BASELINE} with scripts/build-baseline.sh: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let dir =
                String::from_utf8(out.stdout).unwrap().lines().last().expect("its directory").to_string();
            format!("{dir}/{name}")
        }
    }
}

static NET: AtomicU8 = AtomicU8::new(1);

struct World {
    host: Netns,
    _outside: Netns,
    n: u8,
    next: u8,
}

struct Ctr {
    ns: Netns,
    idx: u8,
    id: String,
    hostveth: String,
}

impl World {
    fn new() -> World {
        let n = NET.fetch_add(1, Ordering::Relaxed);
        let host = Netns::new("sch");
        let outside = Netns::new("sco");
        host.run("ip", &["link", "set", "lo", "up"]);
        outside.run("ip", &["link", "set", "lo", "up"]);
        host.run("sysctl", &["-qw", "net.ipv4.ip_forward=1"]);
        for key in ["net.bridge.bridge-nf-call-iptables=0", "net.bridge.bridge-nf-call-ip6tables=0"] {
            host.try_run("sysctl", &["-qw", key]);
        }
        host.run("ip", &["link", "add", "br0", "type", "bridge"]);
        host.run("ip", &["addr", "add", &format!("10.{n}.0.1/24"), "dev", "br0"]);
        host.run("ip", &["link", "set", "br0", "up"]);
        host.run(
            "ip",
            &["link", "add", "ext0", "type", "veth", "peer", "name", "up0", "netns", outside.name()],
        );
        host.run("ip", &["addr", "add", &format!("10.250.{n}.1/24"), "dev", "ext0"]);
        host.run("ip", &["link", "set", "ext0", "up"]);
        outside.run("ip", &["addr", "add", &format!("10.250.{n}.2/24"), "dev", "up0"]);
        outside.run("ip", &["link", "set", "up0", "up"]);
        World { host, _outside: outside, n, next: 2 }
    }

    fn container(&mut self) -> Ctr {
        let idx = self.next;
        self.next += 1;
        let ns = Netns::new("scc");
        let hostveth = unique("vs");
        self.host.run(
            "ip",
            &["link", "add", &hostveth, "type", "veth", "peer", "name", "eth0", "netns", ns.name()],
        );
        self.host.run("ip", &["link", "set", &hostveth, "master", "br0", "up"]);
        let n = self.n;
        ns.run("ip", &["link", "set", "lo", "up"]);
        ns.run("ip", &["addr", "add", &format!("10.{n}.0.{idx}/24"), "dev", "eth0"]);
        ns.run("ip", &["link", "set", "eth0", "up"]);
        ns.run("ip", &["route", "add", "default", "via", &format!("10.{n}.0.1")]);
        Ctr { ns, idx, id: unique("ctr"), hostveth }
    }

    fn ip4(&self, c: &Ctr) -> String {
        format!("10.{}.0.{}", self.n, c.idx)
    }

    /// The prevResult bridge + host-local would give `c`, with `addr` as its address.
    fn prev_with(&self, c: &Ctr, addr: &str) -> Value {
        json!({"cniVersion": "1.0.0",
               "interfaces": [{"name": "br0", "mac": "02:00:00:00:00:01"},
                              {"name": c.hostveth, "mac": "02:00:00:00:00:02"},
                              {"name": "eth0", "mac": "02:00:00:00:00:03", "sandbox": c.ns.path_str()}],
               "ips": [{"address": format!("{addr}/24"), "gateway": format!("10.{}.0.1", self.n), "interface": 2}]})
    }

    fn prev(&self, c: &Ctr) -> Value {
        self.prev_with(c, &self.ip4(c))
    }

    fn portmap(&self, b: Build, cmd: &str, c: &Ctr, stdin: &str) -> PluginOutput {
        Exec::new(&exe(b, "portmap"))
            .in_ns(&self.host)
            .attachment(cmd, &c.id, c.ns.path_str(), "eth0", "/nonexistent")
            .run(stdin)
    }

    fn sysctl(&self, key: &str) -> String {
        String::from_utf8_lossy(&self.host.run("sysctl", &["-n", key]).stdout).trim().to_string()
    }

    /// Whether our table exists and its `localnet` chain holds rules.
    fn guarded(&self) -> bool {
        let out = self.host.try_run("nft", &["list", "chain", "inet", "cni_portmap", "localnet"]);
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("drop")
    }
}

fn conf(prev: &Value, mappings: Value) -> String {
    json!({"cniVersion": "1.1.0", "name": "secnet", "type": "portmap", "snat": true,
           "capabilities": {"portMappings": true},
           "runtimeConfig": {"portMappings": mappings}, "prevResult": prev})
    .to_string()
}

fn tcp(host: u16, ctr: u16) -> Value {
    json!([{"hostPort": host, "containerPort": ctr, "protocol": "tcp"}])
}

/// Whether a TCP segment to `dport` from `sport` reached the namespace of `tap`, within a few
/// resends of the probe (each probe waits for what must, or must not, arrive).
fn arrives(tap: &TcpTap, probe: &SynProbe, sport: u16, dport: u16, expect: bool) -> bool {
    let mut seen = false;
    let rounds = if expect { 20 } else { 6 };
    for i in 0..rounds {
        probe.send(TCP_SYN, sport, 0x2000_0000 + i);
        std::thread::sleep(Duration::from_millis(500));
        if tap.drain().iter().any(|s| s.sport == sport && s.dport == dport) {
            seen = true;
            break;
        }
    }
    seen
}

// ---- finding 8: no panic reachable from the runtime's input

/// bridge ADD with a container id that puts the veth alias limit (255 bytes) inside the
/// 3-byte `€` of a 15-byte CNI_IFNAME: (exit status, stdout, stderr).
fn bridge_add_with_a_long_id(b: Build) -> PluginOutput {
    let host = Netns::new("sbh");
    let ctr = Netns::new("sbc");
    let data = TempDir::new("sbd");
    host.run("ip", &["link", "set", "lo", "up"]);
    let conf = json!({"cniVersion": "1.0.0", "name": "secnet", "type": "bridge", "bridge": "sbr0",
                      "isGateway": true, "macspoofchk": true,
                      "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.93.0.0/24"}]],
                               "dataDir": data.str()}});
    // "cni:" + "secnet" + ":" + id + ":" puts the interface name at byte 254
    let id = "c".repeat(254 - "cni:secnet::".len());
    let ifname = "€€€€€"; // 15 bytes
    let ipam = cni_path_with(&["host-local"]);
    let add = Exec::new(&exe(b, "bridge"))
        .in_ns(&host)
        .attachment("ADD", &id, ctr.path_str(), ifname, ipam.str())
        .run_json(&conf);
    // clean up what a run that did not panic made (DEL is idempotent either way)
    Exec::new("bridge")
        .in_ns(&host)
        .attachment("DEL", &id, ctr.path_str(), ifname, ipam.str())
        .run_json(&conf);
    add
}

#[test]
fn finding_8_a_long_container_id_with_a_non_ascii_ifname_does_not_panic_bridge() {
    let before = bridge_add_with_a_long_id(Build::Before);
    assert_ne!(before.code, 0, "{BASELINE} fails: {before:?}");
    assert!(
        before.stderr.contains("panic") && before.stderr.contains("is_char_boundary"),
        "{BASELINE} panics in String::truncate: {}",
        before.stderr
    );
    // now: a CNI answer, not a panic (bridge's spoof-check chain name, which holds the id and
    // the interface name, may then be longer than nf_tables takes: an error with a code)
    let now = bridge_add_with_a_long_id(Build::Now);
    assert!(!now.stderr.contains("panic"), "{now:?}");
    let v = now.json();
    if now.code != 0 {
        assert!(v["code"].as_u64().is_some_and(|c| c > 0) && v["msg"].is_string(), "a CNI error: {v}");
    } else {
        assert!(v["interfaces"].as_array().unwrap().iter().any(|i| i["name"] == "€€€€€"), "{v}");
    }
    // and ids longer than any runtime's are refused at the edge, with a CNI error
    let host = Netns::new("sbh");
    let ctr = Netns::new("sbc");
    let out = Exec::new("bridge")
        .in_ns(&host)
        .attachment("ADD", &"c".repeat(1025), ctr.path_str(), "eth0", "/nonexistent")
        .run_json(&json!({"cniVersion": "1.0.0", "name": "secnet", "type": "bridge"}));
    assert!(out.err(4).contains("containerID"), "{out:?}");
}

// ---- finding 5: host-local fails closed when the boot id cannot be read

/// ADD `a` (live namespace, boot id readable), then ADD `b` with the boot id hidden; whether
/// `a`'s reservation is still there, and what `b` got.
fn add_with_the_boot_id_hidden(b: Build) -> (bool, String) {
    let host = Netns::new("shh");
    let (ca, cb) = (Netns::new("sha"), Netns::new("shb"));
    let data = TempDir::new("shd");
    let conf = json!({"cniVersion": "1.0.0", "name": "secnet", "type": "host-local",
                      "ranges": [[{"subnet": "10.94.0.0/24"}]], "dataDir": data.str()});
    let ipam = json!({"cniVersion": "1.0.0", "name": "secnet", "ipam": conf});
    let hl = exe(b, "host-local");
    let a =
        Exec::new(&hl).in_ns(&host).attachment("ADD", "ctr-a", ca.path_str(), "eth0", "/x").run_json(&ipam);
    assert_eq!(cni_tests::result_ips(&a.ok()), ["10.94.0.2"]);
    let blind = Exec::new(&hl)
        .in_ns(&host)
        .in_private_mounts("mount --bind /dev/null /proc/sys/kernel/random/boot_id")
        .attachment("ADD", "ctr-b", cb.path_str(), "eth0", "/x")
        .run_json(&ipam);
    let got = cni_tests::result_ips(&blind.ok()).join(",");
    (data.join("secnet/10.94.0.2").exists(), got)
}

#[test]
fn finding_5_an_unreadable_boot_id_releases_no_live_reservation() {
    let (kept, got) = add_with_the_boot_id_hidden(Build::Before);
    assert!(!kept, "{BASELINE}: the live pod's reservation was released (all-zero boot id); b got {got}");
    let (kept, got) = add_with_the_boot_id_hidden(Build::Now);
    assert!(kept, "the live pod keeps its address");
    assert_eq!(got, "10.94.0.3");
}

// ---- finding 9: a FIFO at resync's lock path

fn resync_with_a_fifo_lock(b: Build) -> Option<std::process::ExitStatus> {
    let cache = TempDir::new("sfc");
    nix::unistd::mkfifo(&cache.join("resync.lock"), nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let mut child = Command::new(exe(b, "cni-migrate"))
        .args(["resync", "--cache-dir", cache.str(), "--cni-bin-dir", "/nonexistent"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run cni-migrate");
    // generous: a run that does not wait for a reader is done at once
    for _ in 0..100 {
        if let Some(st) = child.try_wait().unwrap() {
            return Some(st);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

#[test]
fn finding_9_a_fifo_at_the_resync_lock_is_refused_without_blocking() {
    assert_eq!(resync_with_a_fifo_lock(Build::Before), None, "{BASELINE} blocks in open(2) on the FIFO");
    let st = resync_with_a_fifo_lock(Build::Now).expect("refused at once");
    assert!(!st.success(), "a FIFO is no lock: {st:?}");
}

// ---- finding 11: install.sh --restore and a planted link

/// `install.sh --restore` of `script` over a bin directory with `bridge.orig` and a link
/// planted at `.bridge.new`; the content of the file the link points to afterwards.
fn restore_with_a_planted_link(script: &Path) -> String {
    let dir = TempDir::new("sir");
    let dest = dir.join("bin");
    std::fs::create_dir(&dest).unwrap();
    std::fs::write(dest.join("bridge"), "ours").unwrap();
    std::fs::write(dest.join("bridge.orig"), "theirs").unwrap();
    let victim = dir.join("victim");
    std::fs::write(&victim, "untouched").unwrap();
    std::os::unix::fs::symlink(&victim, dest.join(".bridge.new")).unwrap();
    let units = dir.join("units");
    let out = Command::new("bash")
        .arg(script)
        .args(["--restore", "--unit-dir", units.to_str().unwrap(), dest.to_str().unwrap()])
        .output()
        .expect("run install.sh");
    assert!(out.status.success(), "install.sh --restore: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_to_string(dest.join("bridge")).unwrap(), "theirs", "restored");
    std::fs::read_to_string(&victim).unwrap()
}

#[test]
fn finding_11_install_restore_never_writes_through_a_planted_link() {
    // the previous main's script, in a scratch tree of its own (it finds itself by $0)
    let old = TempDir::new("sio");
    std::fs::create_dir(old.join("scripts")).unwrap();
    let text = Command::new("git")
        .args(["show", &format!("{BASELINE}:scripts/install.sh")])
        .current_dir(workspace_root())
        .output()
        .expect("git show");
    assert!(text.status.success(), "git show {BASELINE}:scripts/install.sh");
    std::fs::write(old.join("scripts/install.sh"), text.stdout).unwrap();
    assert_eq!(
        restore_with_a_planted_link(&old.join("scripts/install.sh")),
        "theirs",
        "{BASELINE} wrote through it"
    );
    let now = workspace_root().join("scripts/install.sh");
    assert_eq!(restore_with_a_planted_link(&now), "untouched");
}

// ---- finding 4: DNAT targets on the host itself

/// portmap ADD for a container whose prevResult address is `addr`: the output, and the DNAT
/// targets in the table afterwards.
fn add_with_address(b: Build, addr: impl Fn(&World) -> String) -> (PluginOutput, String) {
    let mut w = World::new();
    let a = w.container();
    let addr = addr(&w);
    let out = w.portmap(b, "ADD", &a, &conf(&w.prev_with(&a, &addr), tcp(8080, 9999)));
    let table = w.host.try_run("nft", &["list", "map", "inet", "cni_portmap", "hp4"]);
    (out, String::from_utf8_lossy(&table.stdout).into_owned())
}

#[test]
fn finding_4_container_addresses_of_the_host_itself_are_refused() {
    let loopback = |_: &World| "127.0.0.1".to_string();
    let gateway = |w: &World| format!("10.{}.0.1", w.n);
    for (what, addr) in [
        ("a loopback address", &loopback as &dyn Fn(&World) -> String),
        ("the bridge's own address", &gateway),
    ] {
        let (out, table) = add_with_address(Build::Before, addr);
        assert_eq!(out.code, 0, "{BASELINE} accepts {what}: {out:?}");
        assert!(table.contains(". 9999"), "{BASELINE} DNATs to {what}: {table}");
        let (out, table) = add_with_address(Build::Now, addr);
        out.err(7);
        assert!(!table.contains(". 9999"), "nothing DNATs to {what}: {table}");
    }
}

#[test]
fn finding_4_a_dnat_to_the_hosts_loopback_is_not_exempt_from_the_guard() {
    // an element of the previous main (a loopback target) left in the table: the guard no
    // longer lets what was DNATed to the host's loopback through
    let mut w = World::new();
    let a = w.container();
    let b = w.container();
    let _lo = Server::socat(
        &w.host,
        "TCP4-LISTEN:9999,bind=127.0.0.1,fork,reuseaddr",
        "src 127.0.0.1:9999",
        "hostlo",
    );
    // another pod's host port puts route_localnet on the bridge
    let cb = conf(&w.prev(&b), tcp(8081, 80));
    w.portmap(Build::Before, "ADD", &b, &cb).ok();
    w.portmap(Build::Before, "ADD", &a, &conf(&w.prev_with(&a, "127.0.0.1"), tcp(8080, 9999))).ok();
    let gw = format!("10.{}.0.1", w.n);
    assert_eq!(
        fetch(&b.ns, &gw, 8080),
        format!("hostlo {}", w.ip4(&b)),
        "{BASELINE}: B reaches the host's loopback"
    );
    // this build's ADD of another pod brings the guard of this build
    w.portmap(Build::Now, "ADD", &b, &cb).ok();
    assert_eq!(fetch(&b.ns, &gw, 8080), "", "the guard drops it");
}

// ---- finding 7: route_localnet never on an uplink

fn route_localnet_of_the_uplink(b: Build) -> String {
    let w = World::new();
    let n = w.n;
    // a macvlan-like attachment: the container address is on the uplink's segment, and
    // prevResult names only the container's interface
    let c = Netns::new("scm");
    let prev = json!({"cniVersion": "1.0.0",
                      "interfaces": [{"name": "eth0", "mac": "02:00:00:00:00:09", "sandbox": c.path_str()}],
                      "ips": [{"address": format!("10.250.{n}.7/24"), "interface": 0}]});
    let out = Exec::new(&exe(b, "portmap"))
        .in_ns(&w.host)
        .attachment("ADD", "ctr-m", c.path_str(), "eth0", "/nonexistent")
        .run(&conf(&prev, tcp(8080, 80)));
    out.ok();
    w.sysctl("net.ipv4.conf.ext0.route_localnet")
}

#[test]
fn finding_7_route_localnet_is_never_set_on_an_uplink() {
    assert_eq!(route_localnet_of_the_uplink(Build::Before), "1", "{BASELINE} sets it on ext0");
    assert_eq!(route_localnet_of_the_uplink(Build::Now), "0");
}

// ---- finding 3: a loopback hostIP answers only the host

/// A has `127.0.0.1:8080` -> its port 80; B writes a SYN for 127.0.0.1:8080 to the bridge.
/// (whether it reached A, whether the host itself reaches A through it).
fn loopback_host_ip(b: Build) -> (bool, String) {
    let mut w = World::new();
    let a = w.container();
    let c = w.container();
    let _srv = Server::tcp4(&a.ns, 80, "ctrA");
    let m = json!([{"hostPort": 8080, "containerPort": 80, "protocol": "tcp", "hostIP": "127.0.0.1"}]);
    w.portmap(b, "ADD", &a, &conf(&w.prev(&a), m)).ok();
    assert_eq!(w.sysctl("net.ipv4.conf.br0.route_localnet"), "1");
    let local = fetch(&w.host, "127.0.0.1", 8080);
    let tap = TcpTap::open(&a.ns, false);
    let probe = SynProbe {
        ns: &c.ns,
        ifname: "eth0",
        dst_mac: raw::mac_of(&w.host, "br0"),
        src: w.ip4(&c).parse().unwrap(),
        dst: "127.0.0.1".parse().unwrap(),
        dport: 8080,
    };
    let reached = arrives(&tap, &probe, 41234, 80, b == Build::Before);
    (reached, local)
}

#[test]
fn finding_3_a_loopback_host_ip_mapping_answers_only_the_host() {
    let (reached, local) = loopback_host_ip(Build::Before);
    assert!(reached, "{BASELINE}: another container reaches 127.0.0.1:8080");
    assert!(local.starts_with("ctrA "), "{local}");
    let (reached, local) = loopback_host_ip(Build::Now);
    assert!(!reached, "another container's SYN for 127.0.0.1:8080 is not DNATed");
    assert!(local.starts_with("ctrA "), "the host's own connections are: {local}");
}

// ---- finding 6: loopback sources from a container

/// A host service on 0.0.0.0:9998; with route_localnet on br0 (set for A's host port) and
/// rp_filter off, B writes a SYN from 127.0.0.5 to the bridge address: whether it reached the
/// host's TCP.
fn loopback_source(b: Build) -> bool {
    let mut w = World::new();
    let a = w.container();
    let c = w.container();
    for key in ["net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.br0.rp_filter=0"] {
        w.host.run("sysctl", &["-qw", key]);
    }
    w.portmap(b, "ADD", &a, &conf(&w.prev(&a), tcp(8080, 80))).ok();
    assert_eq!(w.sysctl("net.ipv4.conf.br0.route_localnet"), "1");
    let _srv = Server::tcp4(&w.host, 9998, "hostany");
    let tap = TcpTap::open(&w.host, false);
    let gw = format!("10.{}.0.1", w.n);
    let probe = SynProbe {
        ns: &c.ns,
        ifname: "eth0",
        dst_mac: raw::mac_of(&w.host, "br0"),
        src: "127.0.0.5".parse().unwrap(),
        dst: gw.parse().unwrap(),
        dport: 9998,
    };
    arrives(&tap, &probe, 41235, 9998, b == Build::Before)
}

#[test]
fn finding_6_loopback_sources_from_a_container_are_dropped() {
    assert!(
        loopback_source(Build::Before),
        "{BASELINE}: a SYN from 127.0.0.5 reaches the host's 0.0.0.0 service"
    );
    assert!(!loopback_source(Build::Now), "dropped by the guard");
}

// ---- finding 2: the guard after a flush, with no host-port pod left

/// A with a host port (route_localnet on br0), A deleted, the ruleset flushed, then B added
/// without host ports: (the guard is there after B's ADD, B's CHECK after a second flush
/// passes). route_localnet stays on br0 throughout: without the guard every container on it
/// reaches the host's 127.0.0.0/8 (tests/e2e/portmap.rs shows that traffic).
fn flushed_then_no_host_port_pod(b: Build) -> (bool, bool) {
    let mut w = World::new();
    let a = w.container();
    let c = w.container();
    let ca = conf(&w.prev(&a), tcp(8080, 80));
    w.portmap(b, "ADD", &a, &ca).ok();
    w.portmap(b, "DEL", &a, &ca).ok_silent();
    assert_eq!(w.sysctl("net.ipv4.conf.br0.route_localnet"), "1", "the sysctl outlives the last mapping");
    w.host.run("nft", &["flush", "ruleset"]);
    let cb = conf(&w.prev(&c), json!([]));
    w.portmap(b, "ADD", &c, &cb).ok();
    let guarded = w.guarded();
    w.host.run("nft", &["flush", "ruleset"]);
    let check = w.portmap(b, "CHECK", &c, &cb);
    assert_eq!(w.sysctl("net.ipv4.conf.br0.route_localnet"), "1");
    (guarded, check.code == 0)
}

#[test]
fn finding_2_the_guard_comes_back_after_a_flush_without_host_port_pods() {
    let got = flushed_then_no_host_port_pod(Build::Before);
    assert_eq!(got, (false, true), "{BASELINE}: no guard after the ADD, and CHECK passes without it");
    let (guarded, check_ok) = flushed_then_no_host_port_pod(Build::Now);
    assert!(guarded, "ADD of a pod without host ports restores the guard");
    assert!(!check_ok, "CHECK reports the guard missing after the next flush");
}

// ---- issue 37, findings 2 and 5: the files of firewall's records and of STATUS's certificates
//
// Each plugin runs in a private mount namespace in which a scratch directory of the test is
// bound over its real one (/var/lib/cni/firewall, /run/cni-rs/status): what is planted there
// reaches no other test's plugin, and the files stay for the test to look at after the plugin
// is gone. They are not run against BASELINE (cf0d296 has no firewall records and no
// certificates); each was run against 2d443c7, the commit before the fix, and failed there
// (docs/security.md says how).

/// The firewall's record directory and the attachment every scenario uses.
struct FwWorld {
    host: Netns,
    pod: cni_tests::PodNetns,
    /// Bound over /var/lib/cni/firewall in the plugin's mount namespace.
    records: TempDir,
    net: String,
}

const FW_CTR: &str = "ctr-files";
const FW_ADDR: &str = "10.88.0.7";

impl FwWorld {
    fn new() -> FwWorld {
        let records = TempDir::new("fwrec");
        // as the plugin would make it: root's, writable by root alone
        std::fs::set_permissions(records.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        FwWorld {
            host: Netns::new("fls-fw"),
            pod: cni_tests::PodNetns::new("fls-pod"),
            records,
            net: unique("fls-net"),
        }
    }

    /// The network's directory of records, as the test sees it.
    fn net_dir(&self) -> std::path::PathBuf {
        self.records.join(&self.net)
    }

    /// The name of the attachment's record (firewall's record.rs: a hash of container and
    /// interface).
    fn record_name(&self) -> String {
        cni_common::attachment::sha512_hex(&format!("{FW_CTR}\neth0"), 32)
    }

    fn conf(&self) -> Value {
        json!({
            "cniVersion": "1.0.0", "name": self.net, "type": "firewall", "backend": "nftables",
            "prevResult": {"cniVersion": "1.0.0", "interfaces": [{"name": "cni0"}],
                "ips": [{"address": format!("{FW_ADDR}/16")}]}
        })
    }

    /// `verb` with `script` (sh, `$$` is the plugin's pid: it is exec'd by the same process)
    /// run in the plugin's mount namespace after the bind, bounded by 60 s.
    fn call(&self, verb: &str, script: &str) -> PluginOutput {
        let setup = format!(
            "mkdir -p /var/lib/cni/firewall; mount --bind {} /var/lib/cni/firewall; {script}",
            self.records.str()
        );
        Exec::new("firewall")
            .in_private_mounts(&setup)
            .in_ns(&self.host)
            .attachment(verb, FW_CTR, self.pod.path(), "eth0", "/nonexistent")
            .run_within(&self.conf().to_string(), Duration::from_secs(60))
    }

    /// ADD, then `plant` in place of the record ADD wrote (the record's path given); the path.
    fn added_with_record_replaced(&self, plant: impl FnOnce(&Path)) -> std::path::PathBuf {
        self.call("ADD", "true").ok();
        let record = self.net_dir().join(self.record_name());
        std::fs::remove_file(&record).unwrap();
        plant(&record);
        record
    }

    /// Whether the host holds a firewall rule for the attachment's address.
    fn has_rules(&self) -> bool {
        let out = self.host.run("nft", &["list", "ruleset"]);
        String::from_utf8_lossy(&out.stdout).contains(FW_ADDR)
    }
}

/// Finding 2: a symbolic link planted at the temporary name a record is written under
/// (`<record>.tmp<pid>` before the fix: predictable) is never written through; ADD writes its
/// record and the link's target keeps its content.
#[test]
fn finding_37_2_a_link_at_the_temporary_record_name_is_never_written_through() {
    let w = FwWorld::new();
    let victim = w.records.join("victim");
    std::fs::write(&victim, "keep\n").unwrap();
    std::fs::create_dir(w.net_dir()).unwrap();
    let plant =
        format!("ln -s {} /var/lib/cni/firewall/{}/{}.tmp$$", victim.display(), w.net, w.record_name());
    w.call("ADD", &plant).ok();
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep\n", "the link's target was written through");
    let record = std::fs::symlink_metadata(w.net_dir().join(w.record_name())).expect("the record");
    assert!(record.file_type().is_file(), "the record is a regular file: {record:?}");
    assert!(w.has_rules());
    w.call("DEL", "true").ok_silent();
    assert!(!w.has_rules(), "DEL removed the rules its record names");
}

/// Finding 2: a FIFO in place of a record is not waited on: DEL returns, succeeds, and removes
/// the rules of its prevResult.
#[test]
fn finding_37_2_a_fifo_at_a_record_lets_del_return() {
    let w = FwWorld::new();
    let record = w.added_with_record_replaced(|p| {
        nix::unistd::mkfifo(p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap()
    });
    w.call("DEL", "true").ok_silent();
    assert!(!w.has_rules());
    assert!(std::fs::symlink_metadata(&record).is_err(), "DEL removed what was at the record's name");
}

/// Finding 2: a link to /dev/zero in place of a record is not followed (nor read until memory
/// runs out: the plugin runs under a 1 GiB address-space limit, so that the code before the fix
/// stops there instead of taking the machine's memory; it read 1 GiB of zeroes, then gave up).
#[test]
fn finding_37_2_a_link_to_dev_zero_at_a_record_is_not_read() {
    let w = FwWorld::new();
    let record = w.added_with_record_replaced(|p| std::os::unix::fs::symlink("/dev/zero", p).unwrap());
    let out = w.call("DEL", "ulimit -v 1048576");
    out.ok_silent();
    assert!(out.max_rss_kib < 64 * 1024, "DEL read into memory: peak RSS {} KiB", out.max_rss_kib);
    assert!(!w.has_rules());
    assert!(std::fs::symlink_metadata(&record).is_err(), "DEL removed the link, not its target");
    assert!(Path::new("/dev/zero").exists());
}

/// Finding 2: a record directory others could write (group-writable, or not root's), at the
/// network's level or the plugin's, is refused by ADD with a CNI error (code 5) naming it, before
/// any rule is written; DEL still succeeds (it trusts no record there and removes the rules of
/// its prevResult).
#[test]
fn finding_37_2_an_unsafe_record_directory_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let w = FwWorld::new();
    let set_mode =
        |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    std::fs::create_dir(w.net_dir()).unwrap();
    let cases: [(&str, &dyn Fn()); 3] = [
        ("group-writable network directory", &|| set_mode(&w.net_dir(), 0o775)),
        ("network directory of another user", &|| {
            set_mode(&w.net_dir(), 0o755);
            std::os::unix::fs::chown(w.net_dir(), Some(65534), Some(65534)).unwrap();
        }),
        ("world-writable plugin directory", &|| {
            std::os::unix::fs::chown(w.net_dir(), Some(0), Some(0)).unwrap();
            set_mode(w.records.path(), 0o777);
        }),
    ];
    for (what, make) in cases {
        make();
        let msg = w.call("ADD", "true").err(5);
        assert!(msg.contains("/var/lib/cni/firewall"), "{what}: the message names the directory: {msg}");
        assert!(!w.has_rules(), "{what}: ADD wrote rules before refusing");
        assert!(!w.net_dir().join(w.record_name()).exists(), "{what}: a record was written");
        w.call("DEL", "true").ok_silent();
    }
}

/// Finding 5: a FIFO in place of portmap's STATUS certificate counts as no certificate: STATUS
/// returns, succeeds (it dry-runs), and certifies again (a regular file in the FIFO's place).
#[test]
fn finding_37_5_a_fifo_at_the_status_certificate_counts_as_none() {
    let host = Netns::new("fls-st");
    let certs = TempDir::new("fwcert");
    std::fs::set_permissions(certs.path(), std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let status = || {
        let setup =
            format!("mkdir -p -m 700 /run/cni-rs/status; mount --bind {} /run/cni-rs/status", certs.str());
        let conf = json!({"cniVersion": "1.1.0", "name": unique("fls-st"), "type": "portmap"});
        Exec::new("portmap")
            .in_private_mounts(&setup)
            .in_ns(&host)
            .env("CNI_COMMAND", "STATUS")
            .env("CNI_PATH", "/nonexistent")
            .run_within(&conf.to_string(), Duration::from_secs(60))
    };
    status().ok_silent();
    let names: Vec<_> = std::fs::read_dir(certs.path()).unwrap().map(|e| e.unwrap().path()).collect();
    let [cert] = names.as_slice() else {
        panic!("one certificate expected (netns cookies needed): {names:?}")
    };
    std::fs::remove_file(cert).unwrap();
    nix::unistd::mkfifo(cert, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    status().ok_silent();
    let after = std::fs::symlink_metadata(cert).unwrap();
    assert!(after.file_type().is_file(), "certified again in the FIFO's place: {after:?}");
}
