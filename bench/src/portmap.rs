//! portmap at scale: N containers, each with one host port, attached one after the other to
//! one bridge (full chain: bridge + host-local, then portmap), ours, v1.10 with each backend and
//! 1.1.1 side by side, each in a fake host of its own. Only the portmap ADD is timed.
//! Containers are added to the hosts in turn (the first rotating every step), so all see the
//! same machine noise at the same table size.
//!
//! Each side runs its own implementation's bridge and host-local (untimed) before portmap.

use super::floor::PortmapFloor;
use super::{peer_bin, stats, timed, upstream_bin, Row, FLOOR};
use cni_tests::{bin, Exec, Netns, TempDir};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Duration;

/// Which implementation a side of the scale scenario runs.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Ours,
    Debian,
    V110,
    V110Nft,
}

impl Kind {
    const ALL: [Kind; 4] = [Kind::Ours, Kind::V110, Kind::V110Nft, Kind::Debian];

    fn name(self) -> &'static str {
        match self {
            Kind::Ours => "ours",
            Kind::Debian => "1.1.1",
            Kind::V110 => super::V110,
            Kind::V110Nft => super::V110_NFT,
        }
    }

    fn bin(self, p: &str) -> PathBuf {
        match self {
            Kind::Ours => bin(p),
            Kind::Debian => upstream_bin(p),
            Kind::V110 | Kind::V110Nft => peer_bin(p),
        }
    }
}

struct Side {
    kind: Kind,
    portmap: PathBuf,
    host: Netns,
    cni_path: TempDir,
    data: TempDir,
    ctrs: Vec<Netns>,
    samples: Vec<Duration>,
}

impl Side {
    fn new(kind: Kind) -> Side {
        let portmap = kind.bin("portmap");
        let host = Netns::new("bph");
        host.run("ip", &["link", "set", "lo", "up"]);
        host.run("sysctl", &["-qw", "net.ipv4.ip_forward=1"]);
        let cni_path = TempDir::new("bpb");
        for p in ["bridge", "host-local"] {
            std::os::unix::fs::symlink(kind.bin(p), cni_path.join(p)).expect("symlink");
        }
        Side {
            kind,
            portmap,
            host,
            cni_path,
            data: TempDir::new("bpd"),
            ctrs: Vec::new(),
            samples: Vec::new(),
        }
    }

    /// portmap's configuration for one host port (v1.10 nftables: its `backend`).
    fn portmap_conf(&self, port: usize, prev: Value) -> String {
        let mut c = json!({"cniVersion": "1.0.0", "name": "benchnet", "type": "portmap",
                           "capabilities": {"portMappings": true}, "snat": true,
                           "runtimeConfig": {"portMappings": [{"hostPort": port, "containerPort": 80, "protocol": "tcp"}]},
                           "prevResult": prev});
        if self.kind == Kind::V110Nft {
            c["backend"] = json!("nftables");
        }
        c.to_string()
    }

    fn bridge_conf(&self) -> String {
        json!({"cniVersion": "1.0.0", "name": "benchnet", "type": "bridge", "bridge": "cnibench0",
               "isGateway": true, "ipMasq": false, "hairpinMode": true,
               "ipam": {"type": "host-local", "subnet": "10.77.0.0/16", "dataDir": self.data.str()}})
        .to_string()
    }

    /// Attach container `i` (untimed bridge ADD), then time the portmap ADD.
    fn step(&mut self, i: usize) {
        let ctr = Netns::new("bpc");
        let id = format!("bench-{i:05}");
        let bridge = self.cni_path.join("bridge");
        let out = Exec::new(bridge.to_str().unwrap())
            .in_ns(&self.host)
            .attachment("ADD", &id, ctr.path_str(), "eth0", self.cni_path.str())
            .run(&self.bridge_conf());
        let prev: Value = out.ok();
        let conf = self.portmap_conf(10000 + i, prev);
        let exec = Exec::new(self.portmap.to_str().unwrap()).in_ns(&self.host).attachment(
            "ADD",
            &id,
            ctr.path_str(),
            "eth0",
            self.cni_path.str(),
        );
        let (out, t) = timed(|| exec.run(&conf));
        assert_eq!(out.code, 0, "{} ADD #{i}: {} {}", self.portmap.display(), out.stdout, out.stderr);
        self.samples.push(t);
        self.ctrs.push(ctr);
    }

    /// Time one extra portmap ADD and its DEL with the current table: attach a probe container
    /// (bridge, untimed), time portmap ADD and DEL, detach it again (bridge DEL, untimed).
    fn probe(&mut self, j: usize) -> (Duration, Duration) {
        let ctr = Netns::new("bpp");
        let id = format!("probe-{j}");
        let bridge = self.cni_path.join("bridge");
        let br = |cmd: &str| {
            Exec::new(bridge.to_str().unwrap())
                .in_ns(&self.host)
                .attachment(cmd, &id, ctr.path_str(), "eth0", self.cni_path.str())
                .run(&self.bridge_conf())
        };
        let prev: Value = br("ADD").ok();
        let conf = self.portmap_conf(60000, prev);
        let pm = |cmd: &str| {
            Exec::new(self.portmap.to_str().unwrap())
                .in_ns(&self.host)
                .attachment(cmd, &id, ctr.path_str(), "eth0", self.cni_path.str())
                .run(&conf)
        };
        let (out, t) = timed(|| pm("ADD"));
        assert_eq!(out.code, 0, "{} probe ADD: {} {}", self.portmap.display(), out.stdout, out.stderr);
        let (out, d) = timed(|| pm("DEL"));
        assert_eq!(out.code, 0, "{} probe DEL: {} {}", self.portmap.display(), out.stdout, out.stderr);
        assert_eq!(br("DEL").code, 0);
        (t, d)
    }

    /// What the firewall holds afterwards: nft rules of our table (or of the whole ruleset
    /// for v1.10's nftables backend), or iptables nat rules.
    fn rule_count(&self) -> usize {
        if matches!(self.kind, Kind::Ours | Kind::V110Nft) {
            let args: &[&str] = if self.kind == Kind::Ours {
                &["-j", "list", "table", "inet", "cni_portmap"]
            } else {
                &["-j", "list", "ruleset"]
            };
            let out = self.host.try_run("nft", args);
            let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
            v["nftables"]
                .as_array()
                .map(|a| a.iter().filter(|o| o.get("rule").is_some()).count())
                .unwrap_or(0)
        } else {
            let out = self.host.try_run("iptables-save", &["-t", "nat"]);
            String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.starts_with("-A ")).count()
        }
    }
}

/// 1-based inclusive positions summarised as one row each.
fn windows(n: usize) -> Vec<(String, usize, usize)> {
    let mut w = vec![("ADD #1 (creates the table)".to_string(), 1, 1)];
    if n >= 12 {
        w.push(("ADD #2–11".into(), 2, 11));
    }
    if n >= 20 {
        let mid = n / 2;
        w.push((format!("ADD #{}–{}", mid - 5, mid + 5), mid - 5, mid + 5));
        w.push((format!("ADD #{}–{}", n - 10, n), n - 10, n));
    }
    w
}

/// Probes per checkpoint.
const PROBES: usize = 45;

/// ADD and DEL samples taken at one checkpoint, per side (in the order given).
type Probes = Vec<Vec<(Duration, Duration)>>;

/// At a checkpoint, time probe ADDs on the big hosts and on reference hosts that hold one
/// container, round-robin, so the growth ratio compares measurements taken at the same time
/// (the machine is shared: load drifts over the minutes the scenario takes).
fn checkpoint(all: &mut [Side]) -> Probes {
    let k = all.len();
    let mut out: Probes = vec![Vec::new(); k];
    for j in 0..PROBES {
        for i in 0..k {
            let idx = (i + j) % k;
            let t = all[idx].probe(j);
            out[idx].push(t);
        }
    }
    out
}

/// Floors at scale: a table of portmap's layout holding as many attachments as the big hosts,
/// and a one-attachment reference, probed at the checkpoints like the plugins, so that the
/// kernel's own growth is read against the same moment.
struct Floors {
    big: PortmapFloor,
    reference: PortmapFloor,
}

/// ADD and DEL probe samples: [big, reference].
type FloorProbes = [Vec<(Duration, Duration)>; 2];

impl Floors {
    fn new() -> Floors {
        let (big, reference) = (PortmapFloor::new(), PortmapFloor::new());
        reference.add(1);
        Floors { big, reference }
    }

    fn step(&self, i: usize) {
        self.big.add(i as u32);
    }

    fn checkpoint(&self) -> FloorProbes {
        let mut out: FloorProbes = Default::default();
        for j in 0..PROBES {
            let n = 40_000 + j as u32; // host ports above the filled ones
            for k in 0..2 {
                let idx = (k + j) % 2;
                let t = if idx == 0 { &self.big } else { &self.reference };
                let (add, del) = t.ops(n);
                let ((), a) = timed(|| PortmapFloor::send(&add));
                let ((), d) = timed(|| PortmapFloor::send(&del));
                out[idx].push((a, d));
            }
        }
        out
    }
}

/// Run the scenario with `n` containers per side. Returns the table rows and a few notes.
pub fn scale(n: usize) -> (Vec<Row>, Vec<String>) {
    // big sides (one per kind), then their one-container references, same order
    let mut sides: Vec<Side> = Kind::ALL.iter().chain(Kind::ALL.iter()).map(|&k| Side::new(k)).collect();
    let kinds = Kind::ALL.len();
    for r in &mut sides[kinds..] {
        r.step(1);
    }
    let floors = Floors::new();
    let mut floor_probes: Vec<FloorProbes> = Vec::new();
    let checkpoints: Vec<usize> = if n >= 20 { vec![1, n / 2, n] } else { vec![n] };
    let mut probes: Vec<(usize, Probes)> = Vec::new();
    for i in 1..=n {
        for j in 0..kinds {
            sides[(i + j) % kinds].step(i);
        }
        floors.step(i);
        if i % 100 == 0 {
            eprintln!("portmap-scale: {i}/{n} containers per side");
        }
        if checkpoints.contains(&i) {
            probes.push((i, checkpoint(&mut sides)));
            floor_probes.push(floors.checkpoint());
        }
    }
    let index = |k: Kind| Kind::ALL.iter().position(|&x| x == k).expect("a kind");
    let (o, d, v, vn) = (index(Kind::Ours), index(Kind::Debian), index(Kind::V110), index(Kind::V110Nft));
    let case = format!("portmap, {n} containers on one bridge");
    let mut rows = Vec::new();
    for (label, a, b) in windows(n) {
        let w = |k: usize| stats(sides[k].samples[a - 1..b].to_vec());
        let mut row = Row::new(case.clone(), label, w(o), w(d));
        row.extra.push((super::V110.into(), w(v)));
        row.extra.push((super::V110_NFT.into(), w(vn)));
        rows.push(row);
    }
    let pick = |v: &[(Duration, Duration)], del: bool| -> Vec<Duration> {
        v.iter().map(|(a, d)| if del { *d } else { *a }).collect()
    };
    for (verb, del) in [("ADD", false), ("DEL", true)] {
        for ((i, p), f) in probes.iter().zip(&floor_probes) {
            let mut row = Row::new(
                case.clone(),
                format!("probe {verb} with {i} attached ({PROBES}×)"),
                stats(pick(&p[o], del)),
                stats(pick(&p[d], del)),
            );
            row.extra.push((super::V110.into(), stats(pick(&p[v], del))));
            row.extra.push((super::V110_NFT.into(), stats(pick(&p[vn], del))));
            row.extra.push((FLOOR.into(), stats(pick(&f[0], del))));
            rows.push(row);
        }
    }
    let med = |s: &Side, a: usize, b: usize| stats(s.samples[a - 1..b].to_vec()).median.as_secs_f64();
    let mut notes = Vec::new();
    if n >= 20 {
        for s in &sides[..kinds] {
            notes.push(format!(
                "{}: ADD at #{}–{} / ADD at #1 = {:.2}x; / ADD at #2–11 = {:.2}x",
                s.kind.name(),
                n - 10,
                n,
                med(s, n - 10, n) / med(s, 1, 1),
                med(s, n - 10, n) / med(s, 2, 11)
            ));
        }
    }
    for (verb, del) in [("ADD", false), ("DEL", true)] {
        for (i, p) in &probes {
            let m = |k: usize| stats(pick(&p[k], del)).median.as_secs_f64();
            let each: Vec<String> =
                (0..kinds).map(|k| format!("{} {:.2}x", sides[k].kind.name(), m(k) / m(k + kinds))).collect();
            notes.push(format!(
                "probe {verb} with {i} attached vs a 1-container host probed at the same time: {}",
                each.join(", ")
            ));
        }
    }
    for (verb, del) in [("ADD", false), ("DEL", true)] {
        for ((i, _), f) in probes.iter().zip(&floor_probes) {
            let m = |k: usize| stats(pick(&f[k], del)).median.as_secs_f64();
            notes.push(format!(
                "floor {verb} with {i} attached vs a 1-attachment floor table probed at the same time: {:.2}x",
                m(0) / m(1)
            ));
        }
    }
    let counts: Vec<String> = sides[..kinds]
        .iter()
        .map(|s| {
            let what = match s.kind {
                Kind::Ours => "nft rules in inet cni_portmap (elements hold the mappings)",
                Kind::V110Nft => "nft rules in its tables",
                _ => "iptables nat rules",
            };
            format!("{} {} {what}", s.kind.name(), s.rule_count())
        })
        .collect();
    notes.push(format!("firewall rules after {n} containers: {}", counts.join("; ")));
    eprintln!("portmap-scale: removing {} namespaces", kinds * n);
    (rows, notes)
}

/// How long an upstream may take for one ADD or DEL of the mappings scenario before its larger
/// sizes are skipped (1.1.1 writes one iptables rule, one exec, per mapping and more).
pub const UPSTREAM_BOUND: Duration = Duration::from_secs(20);

/// One side of the mappings scenario: a host namespace of its own, the plugin and, for
/// v1.10, its `backend`.
struct MapSide {
    name: &'static str,
    portmap: PathBuf,
    backend: Option<&'static str>,
    host: Netns,
    ctr: Netns,
    gave_up: Option<String>,
}

impl MapSide {
    fn new(name: &'static str, portmap: PathBuf, backend: Option<&'static str>) -> MapSide {
        let host = Netns::new("bmh");
        host.run("ip", &["link", "set", "lo", "up"]);
        MapSide { name, portmap, backend, host, ctr: Netns::new("bmc"), gave_up: None }
    }

    /// The same side on fresh namespaces (after a run past the bound: its half-written rules
    /// go with the old ones).
    fn fresh(&self) -> MapSide {
        MapSide {
            gave_up: self.gave_up.clone(),
            ..MapSide::new(self.name, self.portmap.clone(), self.backend)
        }
    }

    /// Run `cmd` with `conf`, within `bound`: its duration, or None past the bound (the
    /// process group killed).
    fn run(&self, cmd: &str, conf: &str, bound: Duration) -> Option<Duration> {
        let conf = match self.backend {
            Some(b) => {
                let mut v: Value = serde_json::from_str(conf).expect("conf");
                v["backend"] = json!(b);
                v.to_string()
            }
            None => conf.to_string(),
        };
        let mut c = self.host.command(&self.portmap);
        c.env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("CNI_COMMAND", cmd)
            .env("CNI_CONTAINERID", "bench-mappings")
            .env("CNI_NETNS", self.ctr.path_str())
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", "/nonexistent");
        let (out, t) = timed(|| {
            cni_common::child::spawn(&mut c, Some(conf.as_bytes()), bound, cni_common::child::Use::Runner)
                .expect("spawn portmap")
                .wait()
        });
        match out {
            Ok(o) => {
                assert!(
                    o.status.success(),
                    "{} {cmd}: {}{}",
                    self.portmap.display(),
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                );
                Some(t)
            }
            Err(e) if e.code == 11 => None,
            Err(e) => panic!("{} {cmd}: {}", self.portmap.display(), e.msg),
        }
    }
}

/// The configuration of one attachment with `n` mappings (TCP and UDP alternating, container
/// ports from 20000, host ports from 10000), a dual-stack container.
fn mappings_conf(n: usize) -> String {
    let maps: Vec<Value> = (0..n)
        .map(|i| json!({"hostPort": 10000 + i, "containerPort": 20000 + i, "protocol": if i % 2 == 0 { "tcp" } else { "udp" }}))
        .collect();
    json!({"cniVersion": "1.0.0", "name": "benchmaps", "type": "portmap", "snat": true,
           "runtimeConfig": {"portMappings": maps},
           "prevResult": {"cniVersion": "1.0.0",
                          "interfaces": [{"name": "eth0", "sandbox": "/run/netns/bench-mappings"}],
                          "ips": [{"interface": 0, "address": "10.98.0.5/16"}, {"interface": 0, "address": "fd98::5/64"}]}})
    .to_string()
}

/// One attachment with 1, 100, 1 000 and 10 000 mappings: ADD then DEL, ours, v1.10 with each
/// backend, Debian's 1.1.1 and the floor (the transactions portmap's library computes for
/// that attachment, sent bare), interleaved; an upstream's larger sizes are skipped once one
/// of its runs takes longer than [`UPSTREAM_BOUND`]. Returns the markdown table and notes.
pub fn mappings(sizes: &[usize], iterations: usize) -> (String, Vec<String>) {
    let mut sides = [
        MapSide::new("ours", bin("portmap"), None),
        MapSide::new("v1.10", peer_bin("portmap"), None),
        MapSide::new("v1.10 nftables", peer_bin("portmap"), Some("nftables")),
        MapSide::new("1.1.1", upstream_bin("portmap"), None),
    ];
    let floor = PortmapFloor::new();
    let k = sides.len() + 1; // the floor last
    let mut table = String::from(
        "| mappings | op | ours ms | v1.10 ms | v1.10 nftables ms | 1.1.1 ms | floor ms | best v1.10 / ours | 1.1.1 / ours | ours / floor |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let mut per_mapping: Vec<(usize, f64, f64)> = Vec::new();
    for &n in sizes {
        let conf = mappings_conf(n);
        let (fa, fd) = floor.ops_of(&conf);
        // [side][0 = ADD, 1 = DEL]
        let mut s: Vec<[Vec<Duration>; 2]> = vec![Default::default(); k];
        for i in 0..iterations + 1 {
            for j in 0..k {
                let side = (i + j) % k;
                let (a, d) = if side == k - 1 {
                    let ((), a) = timed(|| PortmapFloor::send(&fa));
                    let ((), d) = timed(|| PortmapFloor::send(&fd));
                    (Some(a), Some(d))
                } else if side == 0 {
                    let bound = Duration::from_secs(120);
                    (sides[0].run("ADD", &conf, bound), sides[0].run("DEL", &conf, bound))
                } else if sides[side].gave_up.is_none() {
                    let a = sides[side].run("ADD", &conf, UPSTREAM_BOUND);
                    let d = a.and_then(|_| sides[side].run("DEL", &conf, UPSTREAM_BOUND));
                    if a.is_none() || d.is_none() {
                        sides[side].gave_up = Some(format!(
                            "{}'s {} with {n} mappings did not finish within {} s: its larger sizes are skipped",
                            sides[side].name,
                            if a.is_none() { "ADD" } else { "DEL" },
                            UPSTREAM_BOUND.as_secs()
                        ));
                        sides[side] = sides[side].fresh();
                    }
                    (a, d)
                } else {
                    (None, None)
                };
                if i > 0 {
                    s[side][0].extend(a);
                    s[side][1].extend(d);
                }
            }
        }
        let med = |v: &Vec<Duration>| (!v.is_empty()).then(|| stats(v.clone()).median);
        let text =
            |d: Option<Duration>| d.map_or("—".to_string(), |d| format!("{:.2}", d.as_secs_f64() * 1000.0));
        let r = |a: Option<Duration>, b: Option<Duration>| match (a, b) {
            (Some(a), Some(b)) => format!("{:.2}x", a.as_secs_f64() / b.as_secs_f64()),
            _ => "—".into(),
        };
        for (op, o) in [("ADD", 0), ("DEL", 1)] {
            let m: Vec<Option<Duration>> = s.iter().map(|x| med(&x[o])).collect();
            let best = [m[1], m[2]].into_iter().flatten().min();
            table.push_str(&format!(
                "| {n} | {op} | {} | {} | {} | {} | {} | **{}** | {} | {} |\n",
                text(m[0]),
                text(m[1]),
                text(m[2]),
                text(m[3]),
                text(m[4]),
                r(best, m[0]),
                r(m[3], m[0]),
                r(m[0], m[4]),
            ));
        }
        if let (Some(a), Some(d)) = (med(&s[0][0]), med(&s[0][1])) {
            per_mapping.push((n, a.as_secs_f64() / n as f64, d.as_secs_f64() / n as f64));
        }
    }
    let mut notes: Vec<String> = sides.iter().filter_map(|x| x.gave_up.clone()).collect();
    let at = |n: usize| per_mapping.iter().find(|(k, _, _)| *k == n).copied();
    if let (Some((_, a100, d100)), Some((_, a10k, d10k))) = (at(100), at(10_000)) {
        notes.push(format!(
            "ours, cost per mapping at 10 000 / at 100 mappings: ADD {:.2}x, DEL {:.2}x",
            a10k / a100,
            d10k / d100
        ));
    }
    (table, notes)
}
