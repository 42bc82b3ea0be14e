//! `cnibench <scenario>… [--iterations N] [--warmup N] [--containers N] [--services N]
//! [--baseline DIR --baseline-name NAME]`: ours vs upstream (or vs a previous build of ours in
//! baseline mode), interleaved, with floors. Prints markdown. Binaries come from
//! CNI_TEST_BIN_DIR (scripts set it to the release build), upstream ones from
//! CNI_UPSTREAM_DIR (default /usr/lib/cni).

use cni_bench as bench;
use cni_tests::Netns;

fn main() {
    let mut args = std::env::args().skip(1);
    let mut scenarios = Vec::new();
    let mut iterations = 100;
    let mut warmup = 5;
    let mut containers = 1000;
    let mut services = 5000;
    let mut baseline: Option<String> = None;
    let mut baseline_name = String::from("baseline");
    while let Some(a) = args.next() {
        match a.as_str() {
            "--iterations" => iterations = args.next().and_then(|v| v.parse().ok()).expect("--iterations N"),
            "--warmup" => warmup = args.next().and_then(|v| v.parse().ok()).expect("--warmup N"),
            "--containers" => containers = args.next().and_then(|v| v.parse().ok()).expect("--containers N"),
            "--services" => services = args.next().and_then(|v| v.parse().ok()).expect("--services N"),
            "--baseline" => baseline = Some(args.next().expect("--baseline DIR")),
            "--baseline-name" => baseline_name = args.next().expect("--baseline-name NAME"),
            "-h" | "--help" => {
                eprintln!(
                    "usage: cnibench <startup|loopback|bridge|ptp|tuning|firewall|bandwidth|chain|host-local|portmap-scale|portmap-mappings|kube-proxy|status|status-load|gap|deferred>… \
                     [--iterations N] [--warmup N] [--containers N] [--services N] [--baseline DIR --baseline-name NAME]"
                );
                return;
            }
            s => scenarios.push(s.to_string()),
        }
    }
    if scenarios.is_empty() {
        scenarios.push("loopback".into());
    }
    if let Some(dir) = &baseline {
        bench::set_baseline(std::path::Path::new(dir), &baseline_name);
    }
    // Every side runs from a fresh copy of its binaries (bench::stage_binaries says why).
    let _ = cni_tests::bin("bridge"); // refuses a debug build older than its sources
    let staged = cni_tests::TempDir::new("bench-staged");
    let upstream = std::env::var_os("CNI_UPSTREAM_DIR").unwrap_or_else(|| "/usr/lib/cni".into());
    let mut sides = vec![("CNI_TEST_BIN_DIR", cni_tests::bin_dir()), ("CNI_UPSTREAM_DIR", upstream.into())];
    if baseline.is_none() {
        sides.push(("CNI_PEER_DIR", bench::peer_dir()));
    }
    bench::stage_binaries(staged.path(), &sides);
    // The driver moves itself into a scratch "host" namespace: plugins run there (never in the
    // machine's real one) and are spawned without a pre-exec hook, so the harness adds as
    // little as possible to what is measured.
    let host = Netns::new("bhost");
    host.enter_current_thread();
    // A namespace that is not the driver's, for plugins that only need CNI_NETNS to be valid.
    let other = Netns::new("bother");
    let mut sizes: Vec<usize> = vec![0, 1000, 10000, 30000];
    if let Ok(s) = std::env::var("HOST_LOCAL_SIZES") {
        sizes = s.split_whitespace().map(|x| x.parse().expect("HOST_LOCAL_SIZES: numbers")).collect();
    }
    let mut growth = false;
    let mut cases = Vec::new();
    let mut scale_rows = Vec::new();
    let mut notes = Vec::new();
    let rss: bench::chain::RssTable = Default::default();
    let mut keep = Vec::new();
    let mut kp_cases = Vec::new();
    let mut gap = None;
    let mut deferred = None;
    let mut mappings_table = None;
    let mut status_cases = Vec::new();
    let mut bare_cases = Vec::new();
    let mut loaded = None;
    for s in &scenarios {
        match s.as_str() {
            "loopback" => cases.extend(bench::loopback::cases()),
            "startup" => cases.extend(bench::loopback::startup()),
            "bandwidth" => cases.extend(bench::bandwidth::cases()),
            "bridge" => cases.extend(bench::bridge::cases()),
            "ptp" => cases.extend(bench::ptp::cases()),
            "tuning" => cases.extend(bench::tuning::cases()),
            "firewall" => cases.extend(bench::firewall::cases()),
            "chain" => cases.extend(bench::chain::cases(rss.clone(), &mut keep)),
            "host-local" => {
                cases.extend(bench::host_local::cases(&sizes, &other));
                growth = true;
            }
            "portmap-mappings" => {
                let (table, n) = bench::portmap::mappings(&[1, 100, 1000, 10_000], iterations);
                mappings_table = Some(table);
                notes.extend(n);
            }
            "portmap-scale" => {
                let (rows, n) = bench::portmap::scale(containers);
                scale_rows.extend(rows);
                notes.extend(n);
            }
            "kube-proxy" => {
                let (c, note) = bench::kubeproxy::cases(services, &mut keep);
                kp_cases.extend(c);
                notes.push(note);
            }
            "status" => {
                status_cases.extend(bench::status::cases());
                bare_cases.extend(bench::status::bare_cases());
            }
            "status-load" => {
                let (c, count) = bench::status::loaded_cases(services, &mut keep);
                loaded = Some((c, count));
            }
            "gap" => gap = Some(bench::gap::report(iterations)),
            "deferred" => deferred = Some(bench::deferred::report(iterations)),
            other => panic!("unknown scenario {other}"),
        }
    }
    let mut rows = bench::run(cases, iterations, warmup);
    let status_rows = bench::run(status_cases, iterations, warmup);
    let bare_rows = bench::run(bare_cases, iterations, warmup);
    let loaded = loaded.map(|(c, count)| (bench::run(c, iterations, warmup), count));
    let kp_rows = bench::run(kp_cases, iterations, warmup);
    // rows where v1.10's best backend is ahead of ours or within 10%, for the doc's closing list
    let mut close = bench::close_rows(&rows);
    close.extend(bench::close_rows(&kp_rows));
    close.extend(bench::close_rows(&scale_rows));
    for r in status_rows.iter().filter(|r| r.row == "STATUS") {
        let q = r.upstream.median.as_secs_f64() / r.ours.median.as_secs_f64();
        if q < 1.1 {
            close.push((format!("STATUS: {}", r.case), r.row.clone(), q));
        }
    }
    if let Some(path) = std::env::var_os("CNIBENCH_CLOSE_FILE") {
        use std::io::Write;
        let mut f =
            std::fs::OpenOptions::new().append(true).create(true).open(path).expect("CNIBENCH_CLOSE_FILE");
        for (case, row, q) in &close {
            writeln!(f, "| {case} | {row} | {q:.2}x |").expect("write CNIBENCH_CLOSE_FILE");
        }
    }
    println!("Machine: {}.", bench::machine());
    if !rows.is_empty() || !kp_rows.is_empty() {
        println!("{iterations} interleaved iterations per case after {warmup} warm-up.");
    }
    if !scale_rows.is_empty() {
        println!("portmap-scale: {containers} containers per side, added alternately; medians over the positions named.");
    }
    println!();
    rows.extend(scale_rows);
    if !rows.is_empty() {
        print!("{}", bench::markdown(&rows));
    }
    if !kp_rows.is_empty() {
        print!("{}", bench::kubeproxy::markdown(&kp_rows));
    }
    if !status_rows.is_empty() {
        println!("STATUS and VERSION of each plugin, whole process (cniVersion 1.1.0), ours and v1.10 interleaved with the start-up floor:\n");
        print!("{}", bench::status::markdown(&status_rows));
    }
    if !bare_rows.is_empty() {
        println!(
            "\nIn-process, in the host namespace (the \"upstream\" column holds the second of each pair): a one-element\n\
             commit of portmap's ADD, quiet against the same commit while another thread makes STATUS's dry run back to\n\
             back; and the generation read STATUS makes now against the dry run it made on every call before:\n"
        );
        print!("{}", bench::markdown(&bare_rows));
    }
    if let Some((rows, count)) = loaded {
        println!(
            "\nThe full chain (ours, ipMasq, cniVersion 1.1.0) quiet and under each background load (in all: {}):\n",
            count.describe()
        );
        print!("{}", bench::status::loaded_markdown(&rows));
    }
    if growth {
        println!("\nGrowth with the store size (median at N / median on an empty store):\n");
        print!("{}", bench::host_local::growth_markdown(&rows));
    }
    if let Some(t) = mappings_table {
        println!("\nportmap, one attachment with N mappings (medians of {iterations}):\n");
        print!("{t}");
    }
    for n in notes {
        println!("\n{n}");
    }
    if let Some(g) = gap {
        println!("\n{g}");
    }
    if let Some(d) = deferred {
        println!("\n{d}");
    }
    if !rss.borrow().is_empty() {
        println!(
            "\nPeak RSS of the ADD processes during the chain runs (wait4 of each child, so it would include\n\
             any program the plugin ran; the largest includes the warm-up, e.g. portmap's first ADD building\n\
             its table; a child's value can include the memory it was spawned from, so the driver\n\
             resets its own peak after staging the binaries: its peak while the chain ran was {} KiB):\n",
            bench::chain::DRIVER_PEAK_KIB.load(std::sync::atomic::Ordering::Relaxed)
        );
        print!("{}", bench::chain::rss_markdown(&rss));
    }
}
