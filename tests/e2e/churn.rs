//! Churn: many ADD/DEL cycles of the full kubenet-style chain (bridge + host-local + portmap +
//! bandwidth) from parallel workers on one network. No address may ever be handed out twice
//! while in use, and at the end nothing is left: no veth or ifb, no portmap element, no
//! reservation. CI: 2 000 cycles with 8 workers; `CNI_CHURN_CYCLES=10000` for a long run.

use cni_tests::chain::Chain;
use cni_tests::leaks::leaks;
use cni_tests::{cni_path_with, Netns, TempDir};
use serde_json::json;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

fn env_usize(k: &str, default: usize) -> usize {
    std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[test]
fn parallel_add_del_cycles_hand_out_no_duplicate_and_leak_nothing() {
    let cycles = env_usize("CNI_CHURN_CYCLES", 2000);
    let workers = env_usize("CNI_CHURN_WORKERS", 8);
    let host = Netns::new("chh");
    host.run("ip", &["link", "set", "lo", "up"]);
    let bins = cni_path_with(&["bridge", "host-local", "portmap", "bandwidth"]);
    let data = TempDir::new("churn");
    let chain = Chain::kubenet("churn", "1.1.0", "cbr0", "10.150.0.0/16", data.str(), bins.path());
    let next = AtomicUsize::new(0);
    let live: Mutex<HashMap<String, String>> = Mutex::new(HashMap::new());
    let handed_out = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for w in 0..workers {
            let (chain, host, next, live, handed_out) = (&chain, &host, &next, &live, &handed_out);
            s.spawn(move || loop {
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
                // release the claim before DEL: after DEL the address may be reused at once
                live.lock().unwrap().remove(&ip);
                chain.del(&id, ctr.path_str(), "eth0", &caps, Some(&result), Some(host));
            });
        }
    });
    assert_eq!(handed_out.load(Ordering::Relaxed), cycles);
    let left = leaks(&host, "churn", data.path(), &["lo", "cbr0"]);
    assert!(left.is_empty(), "after {cycles} cycles: {left:#?}");
    eprintln!("churn: {cycles} cycles, {workers} workers, no duplicate, nothing left");
}
