//! Benchmark framework: ours vs the upstream releases, interleaved, whole-process.
//!
//! Each scenario gives one or more *cases* (a label and, per implementation, a closure that
//! does untimed setup, times the operation and does untimed cleanup). The driver rotates
//! through the implementations every iteration (the starting side changes each round) so that
//! noise from a shared machine hits all alike, then reports medians, min–max and ratios.
//! Absolute times on shared machines mean little; ratios from one run do.
//!
//! `upstream` is Debian's 1.1.1 (`/usr/lib/cni`). Further sides ([`Case::extra`]) are today's
//! release, v1.10 ([`V110`], and [`V110_NFT`] with its nftables backend where the plugin has
//! one; [`peer_dir`]), the **floor** (the same kernel requests issued bare from this process,
//! see [`floor`]) or, for the kube-proxy scenario, ours on an empty host. They take their turn
//! in the same rotation, so every side of a row is measured in the same minutes.
//!
//! In **baseline mode** (`cnibench --baseline DIR`) the "upstream" side is a previous build of
//! ours in DIR and the tables say so and report current / baseline.

pub mod bandwidth;
pub mod bridge;
pub mod chain;
pub mod deferred;
pub mod firewall;
pub mod floor;
pub mod gap;
pub mod host_local;
pub mod kubeproxy;
pub mod loopback;
pub mod portmap;
pub mod ptp;
pub mod status;
pub mod tuning;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Name of the side opposite ours: set once by `cnibench --baseline`.
static BASELINE: OnceLock<String> = OnceLock::new();

/// Switch to baseline mode: the "upstream" side is our previous build in `dir`, named `name`
/// (e.g. the git ref) in the tables.
pub fn set_baseline(dir: &std::path::Path, name: &str) {
    assert!(dir.join("bridge").is_file(), "baseline build {} has no bridge binary", dir.display());
    let dir = dir.canonicalize().expect("baseline directory");
    // SAFETY: called once from main before any thread is started.
    unsafe { std::env::set_var("CNI_UPSTREAM_DIR", dir) };
    BASELINE.set(name.to_string()).expect("baseline set twice");
}

/// The baseline's name when in baseline mode.
pub fn baseline() -> Option<&'static str> {
    BASELINE.get().map(String::as_str)
}

/// One implementation's timed operation: returns the measured durations for one iteration
/// (a case may time several steps, e.g. ADD and DEL, as separate rows).
pub type Step<'a> = Box<dyn FnMut() -> Vec<Duration> + 'a>;

/// A benchmark case: rows it produces and the two implementations.
pub struct Case<'a> {
    pub label: String,
    pub rows: Vec<String>,
    pub ours: Step<'a>,
    pub upstream: Step<'a>,
    /// Further sides, by name ([`FLOOR`], …), each returning samples for the same rows.
    pub extra: Vec<(String, Step<'a>)>,
}

/// Name of the floor side: the same kernel requests, bare, from inside the driver.
pub const FLOOR: &str = "floor";

/// Today's upstream release (containernetworking/plugins v1.10.0, built by
/// scripts/install-peers.sh) with its default backend: a side of its own in every row.
pub const V110: &str = "v1.10";

/// The same release with its `nftables` backend (bridge `ipMasqBackend`, portmap `backend`),
/// in the rows where the plugin has one.
pub const V110_NFT: &str = "v1.10 nftables";

/// Every side's binaries as a node holds them: each executable of `dirs` written afresh, with
/// one `write` of its whole content, into a directory of its own under `into`, and the
/// environment variable that named the original directory pointed at the copy. Call before
/// any thread starts.
///
/// Why: how a file came to be in the page cache changes how fast it starts. A binary the
/// linker has just written (cargo's `target/…/release`, `go install`'s output) is cached in
/// the small pieces the linker wrote; a binary written in one go (cp, tar, dpkg, what an
/// operator's node runs) is cached in large folios, and each exec faults fewer pages in.
/// Measured with one release build of portmap: a fresh copy ran its ADD in the chain
/// 1.11–1.23x faster than the linker's file, which in baseline mode (the baseline's binaries
/// are copies, `scripts/build-baseline.sh`) read as a regression of the current build.
pub fn stage_binaries(into: &std::path::Path, dirs: &[(&str, std::path::PathBuf)]) {
    use std::os::unix::fs::PermissionsExt;
    for (var, dir) in dirs {
        let to = into.join(var.to_ascii_lowercase());
        std::fs::create_dir_all(&to).unwrap_or_else(|e| panic!("create {}: {e}", to.display()));
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display()));
        for entry in entries {
            let entry = entry.expect("directory entry");
            let from = entry.path();
            // symlinks followed: a directory of links stages what they name
            let Ok(meta) = std::fs::metadata(&from) else { continue };
            if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
                continue;
            }
            let bytes = std::fs::read(&from).unwrap_or_else(|e| panic!("read {}: {e}", from.display()));
            let dest = to.join(entry.file_name());
            std::fs::write(&dest, &bytes).unwrap_or_else(|e| panic!("write {}: {e}", dest.display()));
            std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        // SAFETY: called from main before any thread is started.
        unsafe { std::env::set_var(var, &to) };
    }
    reset_peak_rss();
}

/// Reset this process's peak resident set size to what it holds now (`/proc/self/clear_refs`,
/// 5). A child's peak (`wait4`'s `ru_maxrss`, the chain's RSS table) starts from the peak of the
/// memory it was spawned from: exec records the old address space's high-water mark, and a
/// child spawned by vfork shares the driver's. Staging reads each binary whole (an 8 MB Go
/// binary among them), so without this every side's peak read as the driver's own (8976 KiB
/// for all three in the run that found it).
pub fn reset_peak_rss() {
    std::fs::write("/proc/self/clear_refs", "5").expect("reset the peak RSS (/proc/self/clear_refs)");
}

/// This process's peak resident set size in KiB (`VmHWM`): the least any child it spawns can
/// report as its own peak.
pub fn own_peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find_map(|l| l.strip_prefix("VmHWM:")?.trim().strip_suffix("kB")?.trim().parse().ok())
}

/// The directory of today's upstream release: `CNI_PEER_DIR` (scripts/bench.sh sets it from
/// `scripts/install-peers.sh --print-dir plugins`), else where that script builds it. Fails
/// loudly when the peer is not built: no row silently loses its v1.10 columns.
pub fn peer_dir() -> std::path::PathBuf {
    let d = std::env::var_os("CNI_PEER_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| cni_tests::workspace_root().join("target/peers/plugins-v1.10.0"));
    assert!(
        d.join("bridge").is_file(),
        "the v1.10 peer is missing in {}: run scripts/install-peers.sh",
        d.display()
    );
    d
}

/// The v1.10 sides `make` builds, or none in baseline mode (the table compares two builds of
/// ours there).
pub fn peer_sides<'a>(make: impl FnOnce() -> Vec<(String, Step<'a>)>) -> Vec<(String, Step<'a>)> {
    if baseline().is_some() {
        Vec::new()
    } else {
        make()
    }
}

/// Path of one of today's upstream plugins.
pub fn peer_bin(name: &str) -> std::path::PathBuf {
    let p = peer_dir().join(name);
    assert!(p.is_file(), "v1.10 plugin {} missing: run scripts/install-peers.sh", p.display());
    p
}

/// Statistics of one series.
#[derive(Debug, Clone)]
pub struct Stats {
    pub median: Duration,
    pub min: Duration,
    pub max: Duration,
    pub n: usize,
}

pub fn stats(mut v: Vec<Duration>) -> Stats {
    assert!(!v.is_empty(), "no samples");
    v.sort();
    let n = v.len();
    let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2 };
    Stats { median, min: v[0], max: v[n - 1], n }
}

/// Result row: (case label, row label, ours, upstream).
pub struct Row {
    pub case: String,
    pub row: String,
    pub ours: Stats,
    pub upstream: Stats,
    /// The extra sides' statistics, by name.
    pub extra: Vec<(String, Stats)>,
}

impl Row {
    pub fn new(case: String, row: String, ours: Stats, upstream: Stats) -> Row {
        Row { case, row, ours, upstream, extra: Vec::new() }
    }

    /// upstream / ours (in baseline mode the table shows the inverse, ours / baseline).
    pub fn ratio(&self) -> f64 {
        self.upstream.median.as_secs_f64() / self.ours.median.as_secs_f64()
    }

    pub fn side(&self, name: &str) -> Option<&Stats> {
        self.extra.iter().find(|(n, _)| n == name).map(|(_, s)| s)
    }

    pub fn floor(&self) -> Option<&Stats> {
        self.side(FLOOR)
    }
}

/// Run every case `iterations` times, rotating through its sides (ours, upstream, extras): the
/// side that goes first changes every iteration, so slow drifts of a shared machine hit all
/// alike. With two sides this is ours, upstream, upstream, ours, …
/// The orders in which `k` sides take their turns, iteration after iteration: a Williams
/// design (the crossover trial's balanced Latin square). Every side runs first, second, …
/// equally often, and every side runs **right after** every other side equally often (once per
/// `k` rows for even `k`; for odd `k` the square and its mirror, `2k` rows). A plain rotation
/// (`i, i+1, …`) is balanced in position only: with three sides, ours followed the floor in
/// two rounds of three, so whatever a step leaves the kernel to finish (a namespace's
/// cleanup, an RCU grace period) could be charged to one side more than another. (Checked
/// when a 1.1x difference between two copies of one build turned up: the order was not its
/// cause, see [`stage_binaries`], but the balance costs nothing.)
pub fn williams(k: usize) -> Vec<Vec<usize>> {
    if k <= 1 {
        return vec![(0..k).collect()];
    }
    // first row 0, 1, k-1, 2, k-2, …; row r adds r to every entry (mod k)
    let mut first = vec![0usize];
    let (mut lo, mut hi) = (1usize, k - 1);
    while first.len() < k {
        first.push(lo);
        lo += 1;
        if first.len() < k {
            first.push(hi);
            hi -= 1;
        }
    }
    let mut rows: Vec<Vec<usize>> = (0..k).map(|r| first.iter().map(|x| (x + r) % k).collect()).collect();
    if k % 2 == 1 {
        let mirrored: Vec<Vec<usize>> = rows.iter().map(|r| r.iter().rev().copied().collect()).collect();
        rows.extend(mirrored);
    }
    rows
}

pub fn run(cases: Vec<Case<'_>>, iterations: usize, warmup: usize) -> Vec<Row> {
    let mut out = Vec::new();
    for case in cases {
        let nrows = case.rows.len();
        let mut names = vec!["ours".to_string(), "upstream".to_string()];
        let mut steps = vec![case.ours, case.upstream];
        for (n, s) in case.extra {
            names.push(n);
            steps.push(s);
        }
        let k = steps.len();
        let mut samples: Vec<Vec<Vec<Duration>>> = vec![vec![Vec::new(); nrows]; k];
        let orders = williams(k);
        for i in 0..warmup + iterations {
            for &side in &orders[i % orders.len()] {
                let d = (steps[side])();
                assert_eq!(
                    d.len(),
                    nrows,
                    "case {} ({}) returned {} samples, declared {nrows} rows",
                    case.label,
                    names[side],
                    d.len()
                );
                if i >= warmup {
                    for (r, x) in d.into_iter().enumerate() {
                        samples[side][r].push(x);
                    }
                }
            }
        }
        for (r, row) in case.rows.iter().enumerate() {
            let mut take = |side: usize| stats(std::mem::take(&mut samples[side][r]));
            let mut row = Row::new(case.label.clone(), row.clone(), take(0), take(1));
            for (side, name) in names.iter().enumerate().skip(2) {
                let s = take(side);
                row.extra.push((name.clone(), s));
            }
            out.push(row);
        }
    }
    out
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}

fn range(s: &Stats) -> String {
    format!("{} ({}–{})", ms(s.median), ms(s.min), ms(s.max))
}

fn ratio(a: &Stats, b: &Stats) -> f64 {
    a.median.as_secs_f64() / b.median.as_secs_f64()
}

/// Markdown table of the rows. With v1.10 sides ([`V110`], [`V110_NFT`]) in any row: ours,
/// v1.10 (default backend), v1.10 nftables, Debian's 1.1.1, then **best v1.10 / ours** (the
/// faster of its backends) and 1.1.1 / ours. Floor columns (floor median, ours / floor) appear
/// when any row has a floor; rows without one side show "–" there. In baseline mode the other
/// side is the baseline and the ratio is current / baseline (above 1: the current build is
/// slower).
pub fn markdown(rows: &[Row]) -> String {
    let floors = rows.iter().any(|r| r.floor().is_some());
    let peers = baseline().is_none() && rows.iter().any(|r| r.side(V110).is_some());
    let mut s = match baseline() {
        Some(b) => format!(
            "| case | operation | current median ms (min–max) | baseline `{b}` median ms (min–max) | current / baseline |"
        ),
        None if peers => "| case | operation | ours median ms (min–max) | v1.10 median ms | v1.10 nftables median ms | 1.1.1 median ms | best v1.10 / ours | 1.1.1 / ours |".to_string(),
        None => {
            "| case | operation | ours median ms (min–max) | upstream median ms (min–max) | upstream / ours |".to_string()
        }
    };
    if floors {
        s.push_str(" floor median ms (min–max) | ours / floor |");
    }
    s.push('\n');
    let columns = s.matches(" |").count();
    s.push('|');
    s.push_str(&"---|".repeat(columns));
    s.push('\n');
    let dash = || "–".to_string();
    for r in rows {
        if peers {
            let v = r.side(V110);
            let n = r.side(V110_NFT);
            let best = [v, n].into_iter().flatten().map(|x| x.median).min();
            s.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {} | {:.1}x |",
                r.case,
                r.row,
                range(&r.ours),
                v.map(|x| ms(x.median)).unwrap_or_else(dash),
                n.map(|x| ms(x.median)).unwrap_or_else(dash),
                ms(r.upstream.median),
                best.map(|b| format!("**{:.1}x**", b.as_secs_f64() / r.ours.median.as_secs_f64()))
                    .unwrap_or_else(dash),
                r.ratio(),
            ));
        } else {
            let shown = if baseline().is_some() { ratio(&r.ours, &r.upstream) } else { r.ratio() };
            // a baseline comparison is about small differences: two decimals
            let shown = if baseline().is_some() { format!("{shown:.2}") } else { format!("{shown:.1}") };
            s.push_str(&format!(
                "| {} | {} | {} | {} | **{shown}x** |",
                r.case,
                r.row,
                range(&r.ours),
                range(&r.upstream),
            ));
        }
        if floors {
            match r.floor() {
                Some(f) => s.push_str(&format!(" {} | {:.2}x |", range(f), ratio(&r.ours, f))),
                None => s.push_str(" – | – |"),
            }
        }
        s.push('\n');
    }
    s
}

/// Rows where the best v1.10 backend is ahead of ours or within 10%: (case, operation, best
/// v1.10 / ours).
pub fn close_rows(rows: &[Row]) -> Vec<(String, String, f64)> {
    rows.iter()
        .filter_map(|r| {
            let best = [r.side(V110), r.side(V110_NFT)].into_iter().flatten().map(|x| x.median).min()?;
            let q = best.as_secs_f64() / r.ours.median.as_secs_f64();
            (q < 1.1).then(|| (r.case.clone(), r.row.clone(), q))
        })
        .collect()
}

/// Time one closure.
pub fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let t = Instant::now();
    let v = f();
    (v, t.elapsed())
}

/// A one-line description of the machine for the report header.
pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cores} × {cpu}, kernel {}", kernel.trim())
}

/// Path of an upstream plugin binary (Debian's containernetworking-plugins).
pub use cni_tests::upstream_bin;

#[cfg(test)]
mod tests {
    use super::williams;
    use std::collections::BTreeMap;

    /// Every order is a permutation; every side holds every position equally often and
    /// follows every other side equally often (within a row, where the driver's steps run
    /// back to back).
    #[test]
    fn williams_orders_balance_position_and_predecessor() {
        for k in 1..=6 {
            let rows = williams(k);
            assert_eq!(rows.len(), if k > 1 && k % 2 == 1 { 2 * k } else { k }, "k={k}");
            let mut at: BTreeMap<(usize, usize), usize> = BTreeMap::new();
            let mut after: BTreeMap<(usize, usize), usize> = BTreeMap::new();
            for r in &rows {
                let mut sorted = r.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, (0..k).collect::<Vec<_>>(), "k={k}: {r:?} is not a permutation");
                for (pos, &s) in r.iter().enumerate() {
                    *at.entry((s, pos)).or_default() += 1;
                }
                for w in r.windows(2) {
                    *after.entry((w[0], w[1])).or_default() += 1;
                }
            }
            let per_pos = rows.len() / k;
            assert!(at.values().all(|&n| n == per_pos) && at.len() == k * k, "k={k}: positions {at:?}");
            if k > 1 {
                let pairs = k * (k - 1);
                let each = rows.len() * (k - 1) / pairs;
                assert_eq!(after.len(), pairs, "k={k}: some side never follows another: {after:?}");
                assert!(after.values().all(|&n| n == each), "k={k}: predecessors {after:?}");
            }
        }
    }
}
