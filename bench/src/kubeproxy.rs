//! The kube-proxy-loaded node: a scratch host namespace holding what kube-proxy in iptables
//! mode (nf_tables backend) installs for N services ([`cni_tests::kubeproxy`], one
//! `iptables-nft-restore`), and the kubenet chain (bridge + host-local, portmap with a
//! hostPort, bandwidth) run there by ours and by upstream's plugins, interleaved with the same
//! chains on an empty host namespace: upstream / ours on the loaded node, and each
//! implementation's loaded / empty ratio (ours should stay flat: the plugins never read
//! kube-proxy's rules).
//!
//! All four sides exec their plugins through the same pre-exec setns into their host, so the
//! spawn path is the same for every figure of the table.

use super::chain::{floor_step, our_dir, rows, step, RssTable};
use super::{peer_dir, upstream_bin, Case, Row, Stats, V110, V110_NFT};
use cni_tests::chain::Chain;
use cni_tests::{kubeproxy, Netns, TempDir};
use std::path::{Path, PathBuf};

pub const OURS_EMPTY: &str = "ours, empty host";
pub const UPSTREAM_EMPTY: &str = "upstream, empty host";
pub const FLOOR_LOADED: &str = "floor, loaded host";
pub const FLOOR_EMPTY: &str = "floor, empty host";

fn host(prefix: &str) -> std::sync::Arc<Netns> {
    let h = Netns::new(prefix);
    h.run("ip", &["link", "set", "lo", "up"]);
    std::sync::Arc::new(h)
}

/// The case, and a note on what the loaded host holds.
pub fn cases<'a>(services: usize, keep: &mut Vec<TempDir>) -> (Vec<Case<'a>>, String) {
    let loaded = host("bkl");
    let empty = host("bke");
    kubeproxy::load(&loaded, services);
    let (nat, filter) = (kubeproxy::rule_count(&loaded, "nat"), kubeproxy::rule_count(&loaded, "filter"));
    let note = format!(
        "The loaded host holds kube-proxy's rules for {services} services ({} endpoints each): \
         {nat} nat and {filter} filter rules (`iptables-nft-save`), loaded with one `iptables-nft-restore`.",
        kubeproxy::ENDPOINTS
    );
    let ours_dir = our_dir();
    let upstream_dir: PathBuf = upstream_bin("bridge").parent().map(Path::to_path_buf).expect("dir");
    let mut chain = |name: &str, bridge: &str, subnet: &str, dir: &Path| {
        let data = TempDir::new("bench-kp");
        let c = Chain::kubenet(name, "1.0.0", bridge, subnet, data.str(), dir);
        keep.push(data);
        c
    };
    let ours_loaded = chain("bench-ours", "cbro", "10.211.0.0/16", ours_dir.path());
    let up_loaded = chain("bench-up", "cbru", "10.212.0.0/16", &upstream_dir);
    let ours_empty = chain("bench-ours", "cbro", "10.211.0.0/16", ours_dir.path());
    let up_empty = chain("bench-up", "cbru", "10.212.0.0/16", &upstream_dir);
    let peer_loaded = chain("bench-v110", "cbrv", "10.213.0.0/16", &peer_dir());
    let mut nft_loaded = chain("bench-v110n", "cbrn", "10.214.0.0/16", &peer_dir());
    nft_loaded.plugins[1]["backend"] = serde_json::json!("nftables");
    keep.push(ours_dir);
    let rss = RssTable::default();
    let case = Case {
        label: format!("kube-proxy-loaded node, {services} services"),
        rows: rows(),
        ours: step("ours", ours_loaded, 20000, rss.clone(), Some(loaded.clone())),
        upstream: step("upstream", up_loaded, 40000, rss.clone(), Some(loaded.clone())),
        extra: vec![
            (OURS_EMPTY.into(), step("ours", ours_empty, 20000, rss.clone(), Some(empty.clone()))),
            (FLOOR_LOADED.into(), floor_step(Some(&loaded))),
            (FLOOR_EMPTY.into(), floor_step(Some(&empty))),
            (UPSTREAM_EMPTY.into(), step("upstream", up_empty, 40000, rss.clone(), Some(empty))),
            (V110.into(), step("v110", peer_loaded, 30000, rss.clone(), Some(loaded.clone()))),
            (V110_NFT.into(), step("v110nft", nft_loaded, 50000, rss, Some(loaded.clone()))),
        ],
    };
    (vec![case], note)
}

fn ms(s: &Stats) -> String {
    format!("{:.2}", s.median.as_secs_f64() * 1000.0)
}

fn ratio(a: &Stats, b: &Stats) -> f64 {
    a.median.as_secs_f64() / b.median.as_secs_f64()
}

/// Medians per side and the ratios the issue asks for.
pub fn markdown(rows: &[Row]) -> String {
    let mut s = String::from(
        "| operation | ours loaded ms | v1.10 loaded ms | v1.10 nftables loaded ms | best v1.10 / ours (loaded) | 1.1.1 loaded ms | 1.1.1 / ours (loaded) | ours empty ms | **ours loaded / empty** | floor loaded / empty (ms) | ours / floor (loaded) | 1.1.1 empty ms | 1.1.1 loaded / empty |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let (Some(oe), Some(ue)) = (r.side(OURS_EMPTY), r.side(UPSTREAM_EMPTY)) else { continue };
        let (Some(fl), Some(fe)) = (r.side(FLOOR_LOADED), r.side(FLOOR_EMPTY)) else { continue };
        let (Some(v), Some(vn)) = (r.side(V110), r.side(V110_NFT)) else { continue };
        let best = if v.median <= vn.median { v } else { vn };
        s.push_str(&format!(
            "| {} | {} | {} | {} | **{:.1}x** | {} | {:.1}x | {} | **{:.2}x** | {:.2}x ({} / {}) | {:.2}x | {} | {:.2}x |\n",
            r.row,
            ms(&r.ours),
            ms(v),
            ms(vn),
            ratio(best, &r.ours),
            ms(&r.upstream),
            ratio(&r.upstream, &r.ours),
            ms(oe),
            ratio(&r.ours, oe),
            ratio(fl, fe),
            ms(fl),
            ms(fe),
            ratio(&r.ours, fl),
            ms(ue),
            ratio(&r.upstream, ue),
        ));
    }
    s
}
