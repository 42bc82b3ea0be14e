//! Churn: many ADD/CHECK/DEL cycles of the full kubenet-style chain (bridge with ipMasq +
//! host-local + portmap + bandwidth) from parallel workers on one network, with a GC of the
//! whole chain racing them every 0.2 s. No address may ever be handed out twice while in use;
//! every GC and every DEL succeeds (something a concurrent DEL or GC removed first is "already
//! gone", not an error); CHECK passes for every live attachment just before its DEL (no GC
//! took anything of a valid attachment); at the end nothing is left: no veth or ifb, no
//! portmap element, no masquerade rule, no reservation. CI: 2 000 cycles with 8 workers;
//! `CNI_CHURN_CYCLES=10000` for a long run.
//!
//! The GC's valid list is every attachment whose ADD started and whose DEL did not, as a
//! runtime knows it. A runtime never GCs with a list older than an ADD it started (the
//! attachment would not be in it), so here an ADD does not start while a GC runs (`gate`);
//! DELs start at any moment, which is the race that matters: GC and DEL removing the same
//! state at once.

use cni_tests::chain::{Chain, Step};
use cni_tests::leaks::leaks;
use cni_tests::{cni_path_with, Netns, TempDir};
use serde_json::json;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::Duration;

fn env_usize(k: &str, default: usize) -> usize {
    std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Failures by (verb, plugin): how many, and the first message.
#[derive(Default)]
struct Failures(Mutex<BTreeMap<(String, String), (usize, String)>>);

impl Failures {
    fn record(&self, verb: &str, what: &str, steps: &[Step]) {
        for s in steps.iter().filter(|s| s.out.code != 0) {
            let mut m = self.0.lock().unwrap();
            let e = m.entry((verb.to_string(), s.plugin.clone())).or_insert((0, String::new()));
            e.0 += 1;
            if e.1.is_empty() {
                e.1 = format!("{what}: {} {}", s.out.stdout.trim(), s.out.stderr.trim());
            }
        }
    }

    fn report(&self) -> String {
        let m = self.0.lock().unwrap();
        m.iter()
            .map(|((verb, plugin), (n, first))| {
                format!("{verb} of {plugin} failed {n} times; first: {first}")
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

#[test]
fn parallel_add_del_cycles_racing_gc_hand_out_no_duplicate_and_leak_nothing() {
    let cycles = env_usize("CNI_CHURN_CYCLES", 2000);
    let workers = env_usize("CNI_CHURN_WORKERS", 8);
    let host = Netns::new("chh");
    host.run("ip", &["link", "set", "lo", "up"]);
    let bins = cni_path_with(&["bridge", "host-local", "portmap", "bandwidth"]);
    let data = TempDir::new("churn");
    let mut chain = Chain::kubenet("churn", "1.1.0", "cbr0", "10.150.0.0/16", data.str(), bins.path());
    // masquerade rules too: the state issue 21 saw GC and DEL fight over
    chain.plugins[0]["ipMasq"] = json!(true);
    let next = AtomicUsize::new(0);
    let live: Mutex<HashMap<String, String>> = Mutex::new(HashMap::new());
    let handed_out = AtomicUsize::new(0);
    // attachments whose ADD started and whose DEL did not: the GC's valid list
    let valid: Mutex<HashSet<String>> = Mutex::new(HashSet::new());
    let gate = RwLock::new(());
    let done = AtomicBool::new(false);
    let gcs = AtomicUsize::new(0);
    let failures = Failures::default();
    std::thread::scope(|s| {
        let gc = s.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                let _no_new_add = gate.write().unwrap();
                let list: Vec<String> = valid.lock().unwrap().iter().cloned().collect();
                let pairs: Vec<(&str, &str)> = list.iter().map(|id| (id.as_str(), "eth0")).collect();
                let steps = chain.try_gc(&pairs, Some(&host));
                failures.record("GC", &format!("GC with {} valid", pairs.len()), &steps);
                gcs.fetch_add(1, Ordering::Relaxed);
            }
        });
        let mut handles = Vec::new();
        for w in 0..workers {
            let (chain, host, next, live, handed_out) = (&chain, &host, &next, &live, &handed_out);
            let (valid, gate, failures) = (&valid, &gate, &failures);
            handles.push(s.spawn(move || loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                if k >= cycles {
                    break;
                }
                let ctr = Netns::new("chc");
                let id = format!("churn-{w}-{k}");
                // one host port per worker: a worker has at most one live container
                let caps = json!({
                    "portMappings": [{"hostPort": 30000 + w, "containerPort": 80, "protocol": "tcp"}],
                    "bandwidth": {"ingressRate": 8_000_000, "ingressBurst": 16_000_000,
                                  "egressRate": 8_000_000, "egressBurst": 16_000_000}
                });
                {
                    let _no_gc = gate.read().unwrap();
                    valid.lock().unwrap().insert(id.clone());
                }
                let (result, _) =
                    chain.add(&id, ctr.path_str(), "eth0", &caps, Some(host)).unwrap_or_else(|steps| {
                        let last = steps.last().unwrap();
                        panic!(
                            "cycle {k}: ADD {} failed: {}{}",
                            last.plugin, last.out.stdout, last.out.stderr
                        )
                    });
                let ip = result["ips"][0]["address"].as_str().expect("an address").to_string();
                {
                    let mut m = live.lock().unwrap();
                    if let Some(other) = m.insert(ip.clone(), id.clone()) {
                        panic!("address {ip} handed to {id} while {other} still holds it");
                    }
                }
                handed_out.fetch_add(1, Ordering::Relaxed);
                // the address really is on the container side
                if k % 50 == 0 {
                    assert!(ctr.addrs("eth0").contains(&ip), "cycle {k}: {ip} not on eth0");
                }
                // Nothing of a valid attachment was taken by a GC.
                let checked = chain.check(&id, ctr.path_str(), "eth0", &caps, &result, Some(host));
                failures.record("CHECK", &format!("cycle {k} ({id})"), &checked);
                // release the claim before DEL: after DEL the address may be reused at once
                live.lock().unwrap().remove(&ip);
                valid.lock().unwrap().remove(&id);
                let dels: Vec<Step> = (0..chain.plugins.len())
                    .rev()
                    .map(|i| {
                        chain.exec(i, "DEL", &id, ctr.path_str(), "eth0", &caps, Some(&result), Some(host))
                    })
                    .collect();
                failures.record("DEL", &format!("cycle {k} ({id})"), &dels);
            }));
        }
        for h in handles {
            if let Err(p) = h.join() {
                done.store(true, Ordering::Relaxed);
                std::panic::resume_unwind(p);
            }
        }
        done.store(true, Ordering::Relaxed);
        gc.join().expect("GC thread");
    });
    let report = failures.report();
    assert!(report.is_empty(), "after {cycles} cycles and {} GCs:\n{report}", gcs.load(Ordering::Relaxed));
    assert_eq!(handed_out.load(Ordering::Relaxed), cycles);
    assert!(gcs.load(Ordering::Relaxed) > 0, "no GC ran during the churn");
    let left = leaks(&host, "churn", data.path(), &["lo", "cbr0"]);
    assert!(left.is_empty(), "after {cycles} cycles: {left:#?}");
    eprintln!(
        "churn: {cycles} cycles, {workers} workers, {} GCs racing them, no duplicate, nothing left",
        gcs.load(Ordering::Relaxed)
    );
}
