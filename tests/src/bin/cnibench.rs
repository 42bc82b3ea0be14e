//! `cnibench <scenario>… [--iterations N] [--warmup N]`: ours vs upstream, interleaved.
//! Prints a markdown table. Binaries come from CNI_TEST_BIN_DIR (scripts set it to
//! target/release), upstream ones from CNI_UPSTREAM_DIR (default /usr/lib/cni).

use cni_tests::bench;
use cni_tests::Netns;

fn main() {
    let mut args = std::env::args().skip(1);
    let mut scenarios = Vec::new();
    let mut iterations = 100;
    let mut warmup = 5;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--iterations" => iterations = args.next().and_then(|v| v.parse().ok()).expect("--iterations N"),
            "--warmup" => warmup = args.next().and_then(|v| v.parse().ok()).expect("--warmup N"),
            "-h" | "--help" => {
                eprintln!("usage: cnibench <loopback|bandwidth|bridge>… [--iterations N] [--warmup N]");
                return;
            }
            s => scenarios.push(s.to_string()),
        }
    }
    if scenarios.is_empty() {
        scenarios.push("loopback".into());
    }
    // The driver moves itself into a scratch "host" namespace: plugins run there (never in the
    // machine's real one) and are spawned without a pre-exec hook, so the harness adds as
    // little as possible to what is measured.
    let host = Netns::new("bhost");
    host.enter_current_thread();
    let mut cases = Vec::new();
    for s in &scenarios {
        match s.as_str() {
            "loopback" => cases.extend(bench::loopback::cases()),
            "bandwidth" => cases.extend(bench::bandwidth::cases()),
            "bridge" => cases.extend(bench::bridge::cases()),
            other => panic!("unknown scenario {other}"),
        }
    }
    let rows = bench::run(cases, iterations, warmup);
    println!(
        "Machine: {}. {iterations} interleaved iterations per case after {warmup} warm-up.\n",
        bench::machine()
    );
    print!("{}", bench::markdown(&rows));
}
