//! STATUS as containerd ≥ 2.0.1 calls it (every plugin of a 1.1.0 list, on every CRI `Status`
//! call), at 10 Hz, racing parallel ADD/CHECK/DEL cycles of the full kubenet-style chain
//! (bridge with ipMasq + host-local + portmap + bandwidth) on one host namespace. Every ADD
//! works, so every STATUS must succeed: a spurious failure would mark the node NotReady.
//!
//! Two kinds of STATUS alternate: the chain's own configuration, whose dry runs are certified
//! after the first (later calls only read the ruleset generation: cni-common's
//! `netlink::nft::certify`), and the same list with portmap `conditionsV4` that change on every
//! call, so that each of those runs portmap's whole dry run (the nf_tables batch aborted by the
//! kernel, and `nft -c`) while ADDs and DELs commit beside it. CI: 300 cycles with 4 workers;
//! `CNI_STATUS_CYCLES` and `CNI_STATUS_WORKERS` for longer runs.

use cni_tests::chain::Chain;
use cni_tests::leaks::leaks;
use cni_tests::{cni_path_with, Exec, Netns, TempDir};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

fn env_usize(k: &str, default: usize) -> usize {
    std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// STATUS of every plugin of `chain` (as libcni: the plugin's config with name and
/// cniVersion), in `host`. The failures, as "plugin: stdout stderr".
fn status(chain: &Chain, host: &Netns, conditions: Option<Value>) -> Vec<String> {
    let mut failed = Vec::new();
    for i in 0..chain.plugins.len() {
        let mut c = chain.plugins[i].clone();
        c["cniVersion"] = json!(chain.version);
        c["name"] = json!(chain.name);
        if chain.plugin_type(i) == "portmap" {
            if let Some(cond) = &conditions {
                c["conditionsV4"] = cond.clone();
            }
        }
        let path = chain.cni_path.join(chain.plugin_type(i));
        let out = Exec::new(path.to_str().unwrap())
            .env("CNI_COMMAND", "STATUS")
            .env("CNI_PATH", chain.cni_path.to_str().unwrap())
            .in_ns(host)
            .run(&c.to_string());
        if out.code != 0 {
            failed.push(format!("{}: {} {}", chain.plugin_type(i), out.stdout.trim(), out.stderr.trim()));
        }
    }
    failed
}

#[test]
fn status_at_10_hz_racing_churn_never_fails_while_adds_work() {
    let cycles = env_usize("CNI_STATUS_CYCLES", 300);
    let workers = env_usize("CNI_STATUS_WORKERS", 4);
    let host = Netns::new("sth");
    host.run("ip", &["link", "set", "lo", "up"]);
    let bins = cni_path_with(&["bridge", "host-local", "portmap", "bandwidth"]);
    let data = TempDir::new("ststress");
    let mut chain = Chain::kubenet("ststress", "1.1.0", "cbr0", "10.151.0.0/16", data.str(), bins.path());
    chain.plugins[0]["ipMasq"] = json!(true);
    // STATUS before any ADD: the first, uncertified dry runs in this namespace
    let first = status(&chain, &host, None);
    assert!(first.is_empty(), "STATUS on an empty node: {first:?}");
    let next = AtomicUsize::new(0);
    let done = AtomicBool::new(false);
    let statuses = AtomicUsize::new(0);
    let dry_runs = AtomicUsize::new(0);
    let failed: Mutex<Vec<String>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        let poller = s.spawn(|| {
            let mut n = 0u32;
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(100));
                n += 1;
                // odd calls: a portmap layout never seen before, so its dry run runs now
                let conditions = (n % 2 == 1).then(|| {
                    json!(["ip", "saddr", "!=", format!("192.0.{}.{}", n / 250 % 250, n % 250 + 1)])
                });
                if conditions.is_some() {
                    dry_runs.fetch_add(1, Ordering::Relaxed);
                }
                let f = status(&chain, &host, conditions);
                statuses.fetch_add(1, Ordering::Relaxed);
                if !f.is_empty() {
                    failed.lock().unwrap().push(format!("STATUS #{n}: {}", f.join("; ")));
                }
            }
        });
        let mut handles = Vec::new();
        for w in 0..workers {
            let (chain, host, next) = (&chain, &host, &next);
            handles.push(s.spawn(move || loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                if k >= cycles {
                    break;
                }
                let ctr = Netns::new("stc");
                let id = format!("ststress-{w}-{k}");
                let caps = json!({
                    "portMappings": [{"hostPort": 31000 + w, "containerPort": 80, "protocol": "tcp"}],
                    "bandwidth": {"ingressRate": 8_000_000, "ingressBurst": 16_000_000,
                                  "egressRate": 8_000_000, "egressBurst": 16_000_000}
                });
                let (result, _) =
                    chain.add(&id, ctr.path_str(), "eth0", &caps, Some(host)).unwrap_or_else(|steps| {
                        let last = steps.last().unwrap();
                        panic!(
                            "cycle {k}: ADD {} failed: {}{}",
                            last.plugin, last.out.stdout, last.out.stderr
                        )
                    });
                for step in chain.check(&id, ctr.path_str(), "eth0", &caps, &result, Some(host)) {
                    assert_eq!(step.out.code, 0, "cycle {k}: CHECK {}: {}", step.plugin, step.out.stdout);
                }
                for i in (0..chain.plugins.len()).rev() {
                    let step =
                        chain.exec(i, "DEL", &id, ctr.path_str(), "eth0", &caps, Some(&result), Some(host));
                    assert_eq!(step.out.code, 0, "cycle {k}: DEL {}: {}", step.plugin, step.out.stdout);
                }
            }));
        }
        for h in handles {
            if let Err(p) = h.join() {
                done.store(true, Ordering::Relaxed);
                std::panic::resume_unwind(p);
            }
        }
        done.store(true, Ordering::Relaxed);
        poller.join().expect("STATUS poller");
    });
    let failed = failed.into_inner().unwrap();
    let (n, d) = (statuses.load(Ordering::Relaxed), dry_runs.load(Ordering::Relaxed));
    assert!(
        failed.is_empty(),
        "{} of {n} STATUS rounds failed while every ADD worked:\n{}",
        failed.len(),
        failed.join("\n")
    );
    assert!(
        n >= 4 && d >= 2,
        "the churn ended before STATUS raced it ({n} rounds, {d} with a fresh dry run)"
    );
    let left = leaks(&host, "ststress", data.path(), &["lo", "cbr0"]);
    assert!(left.is_empty(), "after {cycles} cycles: {left:#?}");
    eprintln!("STATUS: {n} rounds of the whole list ({d} with portmap's full dry run) racing {cycles} cycles, none failed");
}
