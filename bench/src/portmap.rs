//! portmap at scale: N containers, each with one host port, attached one after the other to
//! one bridge (full chain: bridge + host-local, then portmap), ours and upstream side by side
//! in two fake hosts. Only the portmap ADD is timed. Containers are added alternately to
//! the two hosts (ours first on even steps, upstream first on odd ones), so both see the same
//! machine noise at the same table size.
//!
//! Each side runs its own implementation's bridge and host-local (untimed) before portmap.

use super::floor::PortmapFloor;
use super::{stats, timed, upstream_bin, Row, FLOOR};
use cni_tests::{bin, Exec, Netns, TempDir};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Duration;

struct Side {
    portmap: PathBuf,
    host: Netns,
    cni_path: TempDir,
    data: TempDir,
    ctrs: Vec<Netns>,
    samples: Vec<Duration>,
}

impl Side {
    fn new(ours: bool) -> Side {
        let portmap = if ours { bin("portmap") } else { upstream_bin("portmap") };
        let host = Netns::new("bph");
        host.run("ip", &["link", "set", "lo", "up"]);
        host.run("sysctl", &["-qw", "net.ipv4.ip_forward=1"]);
        let cni_path = TempDir::new("bpb");
        for p in ["bridge", "host-local"] {
            let b = if ours { bin(p) } else { upstream_bin(p) };
            std::os::unix::fs::symlink(b, cni_path.join(p)).expect("symlink");
        }
        Side { portmap, host, cni_path, data: TempDir::new("bpd"), ctrs: Vec::new(), samples: Vec::new() }
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
        let conf = json!({"cniVersion": "1.0.0", "name": "benchnet", "type": "portmap",
                          "capabilities": {"portMappings": true}, "snat": true,
                          "runtimeConfig": {"portMappings": [{"hostPort": 10000 + i, "containerPort": 80, "protocol": "tcp"}]},
                          "prevResult": prev})
        .to_string();
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
        let conf = json!({"cniVersion": "1.0.0", "name": "benchnet", "type": "portmap",
                          "capabilities": {"portMappings": true}, "snat": true,
                          "runtimeConfig": {"portMappings": [{"hostPort": 60000, "containerPort": 80, "protocol": "tcp"}]},
                          "prevResult": prev})
        .to_string();
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

    /// What the firewall holds afterwards: nft rules of our table, or iptables nat rules.
    fn rule_count(&self, ours: bool) -> usize {
        if ours {
            let out = self.host.try_run("nft", &["-j", "list", "table", "inet", "cni_portmap"]);
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

/// ADD and DEL samples taken at one checkpoint: (ours, ours reference, upstream, upstream
/// reference).
type Probes = [Vec<(Duration, Duration)>; 4];

/// At a checkpoint, time probe ADDs on the big hosts and on reference hosts that hold one
/// container, round-robin, so the growth ratio compares measurements taken at the same time
/// (the machine is shared: load drifts over the minutes the scenario takes).
fn checkpoint(sides: [&mut Side; 4]) -> Probes {
    let mut out: Probes = Default::default();
    let [a, b, c, d] = sides;
    let all = [a, b, c, d];
    for j in 0..PROBES {
        for k in 0..4 {
            let idx = (k + j) % 4;
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
    let mut ours = Side::new(true);
    let mut up = Side::new(false);
    let mut ours_ref = Side::new(true);
    let mut up_ref = Side::new(false);
    ours_ref.step(1);
    up_ref.step(1);
    let floors = Floors::new();
    let mut floor_probes: Vec<FloorProbes> = Vec::new();
    let checkpoints: Vec<usize> = if n >= 20 { vec![1, n / 2, n] } else { vec![n] };
    let mut probes: Vec<(usize, Probes)> = Vec::new();
    for i in 1..=n {
        if i % 2 == 0 {
            ours.step(i);
            up.step(i);
        } else {
            up.step(i);
            ours.step(i);
        }
        floors.step(i);
        if i % 100 == 0 {
            eprintln!("portmap-scale: {i}/{n} containers per side");
        }
        if checkpoints.contains(&i) {
            probes.push((i, checkpoint([&mut ours, &mut ours_ref, &mut up, &mut up_ref])));
            floor_probes.push(floors.checkpoint());
        }
    }
    let mut rows = Vec::new();
    for (label, a, b) in windows(n) {
        rows.push(Row::new(
            format!("portmap, {n} containers on one bridge"),
            label,
            stats(ours.samples[a - 1..b].to_vec()),
            stats(up.samples[a - 1..b].to_vec()),
        ));
    }
    let pick = |v: &[(Duration, Duration)], del: bool| -> Vec<Duration> {
        v.iter().map(|(a, d)| if del { *d } else { *a }).collect()
    };
    for (verb, del) in [("ADD", false), ("DEL", true)] {
        for ((i, p), f) in probes.iter().zip(&floor_probes) {
            let mut row = Row::new(
                format!("portmap, {n} containers on one bridge"),
                format!("probe {verb} with {i} attached ({PROBES}×)"),
                stats(pick(&p[0], del)),
                stats(pick(&p[2], del)),
            );
            row.extra.push((FLOOR.into(), stats(pick(&f[0], del))));
            rows.push(row);
        }
    }
    let med = |s: &Side, a: usize, b: usize| stats(s.samples[a - 1..b].to_vec()).median.as_secs_f64();
    let mut notes = Vec::new();
    if n >= 20 {
        for (name, s) in [("ours", &ours), ("upstream", &up)] {
            notes.push(format!(
                "{name}: ADD at #{}–{} / ADD at #1 = {:.2}x; / ADD at #2–11 = {:.2}x",
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
            notes.push(format!(
                "probe {verb} with {i} attached vs a 1-container host probed at the same time: ours {:.2}x, upstream {:.2}x",
                m(0) / m(1),
                m(2) / m(3)
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
    notes.push(format!(
        "firewall rules after {n} containers: ours {} nft rules in inet cni_portmap (elements hold the mappings), \
         upstream {} iptables nat rules",
        ours.rule_count(true),
        up.rule_count(false)
    ));
    eprintln!("portmap-scale: removing {} namespaces", 2 * n);
    (rows, notes)
}

/// How long upstream may take for one ADD or DEL of the mappings scenario before its larger
/// sizes are skipped (1.1.1 writes one iptables rule, one exec, per mapping and more).
pub const UPSTREAM_BOUND: Duration = Duration::from_secs(20);

/// One side of the mappings scenario: a host namespace of its own and the plugin.
struct MapSide {
    portmap: PathBuf,
    host: Netns,
    ctr: Netns,
    gave_up: Option<String>,
}

impl MapSide {
    fn new(ours: bool) -> MapSide {
        let host = Netns::new("bmh");
        host.run("ip", &["link", "set", "lo", "up"]);
        let portmap = if ours { bin("portmap") } else { upstream_bin("portmap") };
        MapSide { portmap, host, ctr: Netns::new("bmc"), gave_up: None }
    }

    /// Run `cmd` with `conf`, within `bound`: its duration, or None past the bound (the
    /// process group killed).
    fn run(&self, cmd: &str, conf: &str, bound: Duration) -> Option<Duration> {
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

/// One attachment with 1, 100, 1 000 and 10 000 mappings: ADD then DEL, ours, upstream and the
/// floor (the transactions portmap's library computes for that attachment, sent bare),
/// interleaved; upstream's larger sizes are skipped once one of its runs takes longer than
/// [`UPSTREAM_BOUND`]. Returns the markdown table and notes.
pub fn mappings(sizes: &[usize], iterations: usize) -> (String, Vec<String>) {
    let ours = MapSide::new(true);
    let mut up = MapSide::new(false);
    let floor = PortmapFloor::new();
    let mut table = String::from(
        "| mappings | ADD ours | ADD upstream | ADD floor | DEL ours | DEL upstream | DEL floor | ADD ours/floor | ADD upstream/ours |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    let mut per_mapping: Vec<(usize, f64, f64)> = Vec::new();
    for &n in sizes {
        let conf = mappings_conf(n);
        let (fa, fd) = floor.ops_of(&conf);
        let mut s: [Vec<Duration>; 6] = Default::default();
        for i in 0..iterations + 1 {
            let mut order = [0usize, 1, 2];
            order.rotate_left(i % 3);
            for side in order {
                let (a, d) = match side {
                    0 => (
                        ours.run("ADD", &conf, Duration::from_secs(120)),
                        ours.run("DEL", &conf, Duration::from_secs(120)),
                    ),
                    1 if up.gave_up.is_none() => {
                        let a = up.run("ADD", &conf, UPSTREAM_BOUND);
                        let d = a.and_then(|_| up.run("DEL", &conf, UPSTREAM_BOUND));
                        if a.is_none() || d.is_none() {
                            up.gave_up = Some(format!(
                                "upstream's {} with {n} mappings did not finish within {} s",
                                if a.is_none() { "ADD" } else { "DEL" },
                                UPSTREAM_BOUND.as_secs()
                            ));
                            // its half-written rules go with a fresh namespace
                            up = MapSide { gave_up: up.gave_up.take(), ..MapSide::new(false) };
                        }
                        (a, d)
                    }
                    1 => (None, None),
                    _ => {
                        let ((), a) = timed(|| PortmapFloor::send(&fa));
                        let ((), d) = timed(|| PortmapFloor::send(&fd));
                        (Some(a), Some(d))
                    }
                };
                if i > 0 {
                    s[side].extend(a);
                    s[side + 3].extend(d);
                }
            }
        }
        let med = |v: &Vec<Duration>| (!v.is_empty()).then(|| stats(v.clone()).median);
        let text = |d: Option<Duration>| {
            d.map_or("—".to_string(), |d| format!("{:.2} ms", d.as_secs_f64() * 1000.0))
        };
        let m: Vec<Option<Duration>> = s.iter().map(med).collect();
        let r = |a: Option<Duration>, b: Option<Duration>| match (a, b) {
            (Some(a), Some(b)) => format!("{:.2}", a.as_secs_f64() / b.as_secs_f64()),
            _ => "—".into(),
        };
        table.push_str(&format!(
            "| {n} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            text(m[0]),
            text(m[1]),
            text(m[2]),
            text(m[3]),
            text(m[4]),
            text(m[5]),
            r(m[0], m[2]),
            r(m[1], m[0])
        ));
        if let (Some(a), Some(d)) = (m[0], m[3]) {
            per_mapping.push((n, a.as_secs_f64() / n as f64, d.as_secs_f64() / n as f64));
        }
    }
    let mut notes: Vec<String> = up.gave_up.iter().cloned().collect();
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
