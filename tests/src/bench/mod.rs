//! Benchmark framework: ours vs upstream, interleaved, whole-process.
//!
//! Each scenario gives one or more *cases* (a label and, per implementation, a closure that
//! does untimed setup, times the operation and does untimed cleanup). The driver alternates
//! implementations every iteration (ours, upstream, ours, …, starting side flipped each round)
//! so that noise from a shared machine hits both alike, then reports medians, min–max and the
//! ratio upstream/ours. Absolute times on shared machines mean little; ratios from one run do.

pub mod bandwidth;
pub mod bridge;
pub mod chain;
pub mod host_local;
pub mod loopback;
pub mod portmap;

use std::time::{Duration, Instant};

/// One implementation's timed operation: returns the measured durations for one iteration
/// (a case may time several steps, e.g. ADD and DEL, as separate rows).
pub type Step<'a> = Box<dyn FnMut() -> Vec<Duration> + 'a>;

/// A benchmark case: rows it produces and the two implementations.
pub struct Case<'a> {
    pub label: String,
    pub rows: Vec<String>,
    pub ours: Step<'a>,
    pub upstream: Step<'a>,
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
}

impl Row {
    pub fn ratio(&self) -> f64 {
        self.upstream.median.as_secs_f64() / self.ours.median.as_secs_f64()
    }
}

/// Run every case `iterations` times, interleaving ours and upstream.
pub fn run(cases: Vec<Case<'_>>, iterations: usize, warmup: usize) -> Vec<Row> {
    let mut out = Vec::new();
    for mut case in cases {
        let nrows = case.rows.len();
        let mut ours: Vec<Vec<Duration>> = vec![Vec::new(); nrows];
        let mut up: Vec<Vec<Duration>> = vec![Vec::new(); nrows];
        for i in 0..warmup + iterations {
            let order_ours_first = i % 2 == 0;
            for side in 0..2 {
                let is_ours = (side == 0) == order_ours_first;
                let d = if is_ours { (case.ours)() } else { (case.upstream)() };
                assert_eq!(
                    d.len(),
                    nrows,
                    "case {} returned {} samples, declared {nrows} rows",
                    case.label,
                    d.len()
                );
                if i >= warmup {
                    let dst = if is_ours { &mut ours } else { &mut up };
                    for (k, x) in d.into_iter().enumerate() {
                        dst[k].push(x);
                    }
                }
            }
        }
        for (k, row) in case.rows.iter().enumerate() {
            out.push(Row {
                case: case.label.clone(),
                row: row.clone(),
                ours: stats(std::mem::take(&mut ours[k])),
                upstream: stats(std::mem::take(&mut up[k])),
            });
        }
    }
    out
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}

/// Markdown table of the rows.
pub fn markdown(rows: &[Row]) -> String {
    let mut s = String::from(
        "| case | operation | ours median ms (min–max) | upstream median ms (min–max) | upstream / ours |\n|---|---|---|---|---|\n",
    );
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {} ({}–{}) | {} ({}–{}) | **{:.1}x** |\n",
            r.case,
            r.row,
            ms(r.ours.median),
            ms(r.ours.min),
            ms(r.ours.max),
            ms(r.upstream.median),
            ms(r.upstream.min),
            ms(r.upstream.max),
            r.ratio()
        ));
    }
    s
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
pub use crate::upstream_bin;
