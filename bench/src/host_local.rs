//! host-local ADD and DEL against stores that already hold N reservations (upstream's file
//! format, written directly), ours and upstream's each on its own copy of the same store. The
//! cost of upstream's calls grows with N (it reads every file); ours should not.

use super::{peer_bin, peer_sides, timed, upstream_bin, Case, Row, Step, V110};
use cni_tests::{bin, Exec, Netns, TempDir};
use serde_json::json;
use std::path::Path;

const NET: &str = "bench";

fn fill(data_dir: &Path, n: usize) {
    let d = data_dir.join(NET);
    std::fs::create_dir_all(&d).expect("create store");
    let mut last = None;
    for i in 0..n {
        let a = 2 + i; // 10.200.0.2 upwards
        let ip = format!("10.200.{}.{}", a >> 8, a & 255);
        std::fs::write(d.join(&ip), format!("fill-{i}\r\neth0")).expect("write reservation");
        last = Some(ip);
    }
    if let Some(ip) = last {
        std::fs::write(d.join("last_reserved_ip.0"), ip).expect("write cursor");
    }
}

fn step<'a>(plugin: String, data: TempDir, ns: &'a Netns) -> Step<'a> {
    let conf = json!({"cniVersion": "1.0.0", "name": NET, "type": "bridge",
                      "ipam": {"type": "host-local", "dataDir": data.str(), "ranges": [[{"subnet": "10.200.0.0/16"}]]}})
    .to_string();
    let mut k = 0u64;
    Box::new(move || {
        let _keep = &data;
        k += 1;
        let id = format!("bench-{k}");
        let run = |cmd: &str| {
            Exec::new(&plugin).attachment(cmd, &id, ns.path_str(), "eth0", "/opt/cni/bin").run(&conf)
        };
        let (add, t_add) = timed(|| run("ADD"));
        assert_eq!(add.code, 0, "{plugin} ADD: {}{}", add.stdout, add.stderr);
        let (del, t_del) = timed(|| run("DEL"));
        assert_eq!(del.code, 0, "{plugin} DEL: {}{}", del.stdout, del.stderr);
        vec![t_add, t_del]
    })
}

/// One case per store size. `ns` is any netns other than the driver's (CNI_NETNS).
pub fn cases<'a>(sizes: &[usize], ns: &'a Netns) -> Vec<Case<'a>> {
    let ours = bin("host-local").to_string_lossy().into_owned();
    let up = upstream_bin("host-local").to_string_lossy().into_owned();
    let peer = if super::baseline().is_some() {
        String::new()
    } else {
        peer_bin("host-local").to_string_lossy().into_owned()
    };
    sizes
        .iter()
        .map(|&n| {
            let (d_ours, d_up, d_peer) =
                (TempDir::new("hl-ours"), TempDir::new("hl-up"), TempDir::new("hl-peer"));
            fill(d_ours.path(), n);
            fill(d_up.path(), n);
            fill(d_peer.path(), n);
            Case {
                label: format!("host-local, {n} reservations"),
                rows: vec!["ADD".into(), "DEL".into()],
                ours: step(ours.clone(), d_ours, ns),
                upstream: step(up.clone(), d_up, ns),
                extra: peer_sides(|| vec![(V110.into(), step(peer.clone(), d_peer, ns))]),
            }
        })
        .collect()
}

/// How ours and upstream grow: each size's median against the empty store's, per operation.
pub fn growth_markdown(rows: &[Row]) -> String {
    let base = |op: &str| rows.iter().find(|r| r.row == op && r.case.ends_with(" 0 reservations"));
    let mut s = String::from(
        "| store | ours ADD vs empty | ours DEL vs empty | v1.10 ADD vs empty | v1.10 DEL vs empty | 1.1.1 ADD vs empty | 1.1.1 DEL vs empty |\n|---|---|---|---|---|---|---|\n",
    );
    let ratio = |a: std::time::Duration, b: std::time::Duration| a.as_secs_f64() / b.as_secs_f64();
    let (Some(ba), Some(bd)) = (base("ADD"), base("DEL")) else { return String::new() };
    for r in rows.iter().filter(|r| r.row == "ADD" && r.case.starts_with("host-local, ")) {
        let Some(d) = rows.iter().find(|x| x.case == r.case && x.row == "DEL") else { continue };
        let peer = |x: &Row, b: &Row| match (x.side(V110), b.side(V110)) {
            (Some(x), Some(b)) => format!("{:.2}x", ratio(x.median, b.median)),
            _ => "–".into(),
        };
        s.push_str(&format!(
            "| {} | {:.2}x | {:.2}x | {} | {} | {:.2}x | {:.2}x |\n",
            r.case.trim_start_matches("host-local, "),
            ratio(r.ours.median, ba.ours.median),
            ratio(d.ours.median, bd.ours.median),
            peer(r, ba),
            peer(d, bd),
            ratio(r.upstream.median, ba.upstream.median),
            ratio(d.upstream.median, bd.upstream.median),
        ));
    }
    s
}
