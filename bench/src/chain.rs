//! The kubenet-style chain, whole process per plugin: bridge (delegating to host-local),
//! portmap with one hostPort, bandwidth with ingress and egress limits. ADD runs the plugins
//! in order with prevResult, DEL in reverse with the final result, as a runtime does; the
//! chain is driven from here (no runner process) so only plugin processes are timed. Also
//! records each plugin's peak RSS.
//!
//! Both sides run in the same scratch host namespace on their own bridge, subnet, dataDir and
//! host ports (against a baseline build of ours, each build in a host namespace of its own). cniVersion 1.0.0: the newest version Debian's upstream plugins accept.

use super::floor::{BandwidthFloor, BridgeFloor, BridgePlan, PortmapFloor};
use super::{peer_dir, timed, upstream_bin, Case, Step, FLOOR, V110, V110_NFT};
use cni_common::netns::NetNs;
use cni_tests::chain::Chain;
use cni_tests::{bin, Netns, TempDir};
use serde_json::{json, Value};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

const PLUGINS: [&str; 3] = ["bridge", "portmap", "bandwidth"];

/// Peak RSS (KiB) of every ADD process per (side, plugin), filled while the benchmark runs.
pub type RssTable = Rc<RefCell<BTreeMap<(String, String), Vec<u64>>>>;

/// The driver's own peak RSS (KiB) while the chain's ADDs ran: the least any of them can
/// report (see [`crate::reset_peak_rss`]).
pub static DRIVER_PEAK_KIB: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Capability args of iteration `n`: one hostPort and 100 Mbit/s each way.
fn caps(port_base: u16, n: u32) -> Value {
    json!({
        "portMappings": [{"hostPort": port_base + (n % 10000) as u16, "containerPort": 80, "protocol": "tcp"}],
        "bandwidth": {"ingressRate": 100_000_000u64, "ingressBurst": 200_000_000u64,
                      "egressRate": 100_000_000u64, "egressBurst": 200_000_000u64}
    })
}

/// One chain run (ADD, DEL) per call; the plugins run in `host` (through a pre-exec setns)
/// or, when None, in the driver's own namespace.
pub(crate) fn step<'a>(
    label: &'static str,
    chain: Chain,
    port_base: u16,
    rss: RssTable,
    host: Option<std::sync::Arc<Netns>>,
) -> Step<'a> {
    let mut n = 0u32;
    Box::new(move || {
        n += 1;
        let ctr = Netns::new("bc");
        let id = format!("bench-{label}-{n}");
        let caps = caps(port_base, n);
        let host = host.as_deref();
        let (result, adds) = chain
            .add(&id, ctr.path_str(), "eth0", &caps, host)
            .unwrap_or_else(|s| panic!("{label} ADD failed: {:?}", s.last().map(|x| &x.out)));
        if let Some(k) = crate::own_peak_rss_kib() {
            DRIVER_PEAK_KIB.fetch_max(k, std::sync::atomic::Ordering::Relaxed);
        }
        {
            let mut r = rss.borrow_mut();
            for s in &adds {
                r.entry((label.to_string(), s.plugin.clone())).or_default().push(s.out.max_rss_kib);
            }
        }
        let mut dels = chain.del(&id, ctr.path_str(), "eth0", &caps, Some(&result), host);
        dels.reverse();
        let mut v = vec![adds.iter().map(|s| s.elapsed).sum(), dels.iter().map(|s| s.elapsed).sum()];
        v.extend(adds.iter().map(|s| s.elapsed));
        v.extend(dels.iter().map(|s| s.elapsed));
        v
    })
}

/// Run `f` with the calling thread in `host` (and back), or where it is when None.
fn in_host<T>(host: Option<&NetNs>, f: impl FnOnce() -> T) -> T {
    match host {
        Some(ns) => {
            ns.run(|| Ok(f())).unwrap_or_else(|e| panic!("floor in {}: {}", ns.path().display(), e.msg))
        }
        None => f(),
    }
}

/// The chain's floor: bridge's (kubenet profile: gateway, hairpin, MTU 1460, default
/// route), portmap's and bandwidth's kernel requests from inside the driver, same rows; in
/// `host` (every socket made and every request sent there) or the driver's own namespace.
pub(crate) fn floor_step<'a>(host: Option<&Netns>) -> Step<'a> {
    let host = host.map(|h| NetNs::open(h.path_str()).expect("open the host namespace"));
    let plan = BridgePlan { default_routes: true, hairpin: true, mtu: Some(1460), ..Default::default() };
    let (mut br, pm, bw) = in_host(host.as_ref(), || {
        (BridgeFloor::new(plan, 203), PortmapFloor::new(), BandwidthFloor::new(100_000_000, 200_000_000))
    });
    let mut n = 0u32;
    Box::new(move || {
        n += 1;
        let ctr = Netns::new("bc");
        in_host(host.as_ref(), || {
            let (mut a, t_br) = timed(|| br.add(&ctr));
            let (pm_add, pm_del) = pm.ops(n);
            let ((), t_pm) = timed(|| PortmapFloor::send(&pm_add));
            let (ifb, t_bw) = timed(|| bw.add(&a.host_veth));
            br.prepare_del(&mut a);
            let veth = a.host_veth.clone();
            let ((), d_bw) = timed(|| bw.del(&veth, &ifb));
            let ((), d_pm) = timed(|| PortmapFloor::send(&pm_del));
            let ((), d_br) = timed(|| br.del(&ctr, a));
            vec![t_br + t_pm + t_bw, d_bw + d_pm + d_br, t_br, t_pm, t_bw, d_br, d_pm, d_bw]
        })
    })
}

/// A CNI_PATH with our binaries (bridge finds host-local next to itself).
pub(crate) fn our_dir() -> TempDir {
    let d = TempDir::new("bench-bin");
    for p in ["bridge", "host-local", "portmap", "bandwidth"] {
        std::os::unix::fs::symlink(bin(p), d.join(p)).expect("symlink");
    }
    d
}

/// The rows a chain step returns.
pub(crate) fn rows() -> Vec<String> {
    let suffix = |p: &str| if p == "bridge" { " (+host-local)" } else { "" };
    let mut rows = vec!["ADD (whole chain)".to_string(), "DEL (whole chain)".to_string()];
    rows.extend(PLUGINS.iter().map(|p| format!("ADD {p}{}", suffix(p))));
    rows.extend(PLUGINS.iter().map(|p| format!("DEL {p}{}", suffix(p))));
    rows
}

pub fn cases<'a>(rss: RssTable, keep: &mut Vec<TempDir>) -> Vec<Case<'a>> {
    let ours_dir = our_dir();
    let upstream_dir: PathBuf = upstream_bin("bridge").parent().map(Path::to_path_buf).expect("dir");
    let ours_data = TempDir::new("bench-data");
    let upstream_data = TempDir::new("bench-data");
    let ours =
        Chain::kubenet("bench-ours", "1.0.0", "cbro", "10.201.0.0/16", ours_data.str(), ours_dir.path());
    let upstream =
        Chain::kubenet("bench-up", "1.0.0", "cbru", "10.202.0.0/16", upstream_data.str(), &upstream_dir);
    let (peer_data, nft_data) = (TempDir::new("bench-data"), TempDir::new("bench-data"));
    let peer = Chain::kubenet("bench-v110", "1.0.0", "cbrv", "10.203.0.0/16", peer_data.str(), &peer_dir());
    // v1.10 with its nftables backend: portmap `backend` (bridge has no masquerading here)
    let mut peer_nft =
        Chain::kubenet("bench-v110n", "1.0.0", "cbrn", "10.204.0.0/16", nft_data.str(), &peer_dir());
    peer_nft.plugins[1]["backend"] = json!("nftables");
    keep.extend([ours_dir, ours_data, upstream_data, peer_data, nft_data]);
    // Against a baseline build of ours, each build runs in a host namespace of its own (both
    // through the same pre-exec setns): two builds of portmap may keep its table in different
    // layouts, and sharing one table would time each side rebuilding the other's layout
    // (upstream keeps its own iptables chains).
    let host = |name| super::baseline().map(|_| std::sync::Arc::new(Netns::new(name)));
    vec![Case {
        label: "bridge+host-local+portmap+bandwidth".into(),
        rows: rows(),
        ours: step("ours", ours, 20000, rss.clone(), host("bco")),
        upstream: step("upstream", upstream, 40000, rss.clone(), host("bcb")),
        extra: if super::baseline().is_some() {
            vec![(FLOOR.into(), floor_step(None))]
        } else {
            vec![
                (V110.into(), step("v110", peer, 30000, rss.clone(), None)),
                (V110_NFT.into(), step("v110nft", peer_nft, 50000, rss, None)),
                (FLOOR.into(), floor_step(None)),
            ]
        },
    }]
}

/// Markdown table of peak RSS per plugin: the largest of all ADD processes (warm-up included,
/// so a one-time cost such as creating a table shows) and the median one, ours against v1.10
/// (default backend) and 1.1.1.
pub fn rss_markdown(rss: &RssTable) -> String {
    let r = rss.borrow();
    // in baseline mode the other side (run where 1.1.1 runs otherwise) is our earlier build
    let other = crate::baseline().map_or("1.1.1".to_string(), |b| format!("baseline `{b}`"));
    let mut s = format!(
        "| plugin | ours largest (KiB) | v1.10 largest (KiB) | {other} largest (KiB) | ours median (KiB) | v1.10 median (KiB) | {other} median (KiB) | ours / v1.10 (median) | ours / {other} (median) |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    let stats = |side: &str, p: &str| {
        let mut v = r.get(&(side.to_string(), p.to_string())).cloned().unwrap_or_default();
        v.sort_unstable();
        (v.last().copied().unwrap_or(0), v.get(v.len() / 2).copied().unwrap_or(0))
    };
    let q = |a: u64, b: u64| if b > 0 { format!("{:.2}", a as f64 / b as f64) } else { "–".into() };
    for p in PLUGINS {
        let ((o, om), (v, vm), (u, um)) = (stats("ours", p), stats("v110", p), stats("upstream", p));
        if o > 0 && u > 0 {
            s.push_str(&format!(
                "| {p} | {o} | {v} | {u} | {om} | {vm} | {um} | {} | {} |\n",
                q(om, vm),
                q(om, um)
            ));
        }
    }
    s
}
