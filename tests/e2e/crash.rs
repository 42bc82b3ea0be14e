//! Crash: SIGKILL each plugin of the chain at a random point of its ADD, then do what a
//! runtime does after a failed ADD (DEL without prevResult), or drop the namespace and GC;
//! either way nothing may be left. CI: 200 trials; `CNI_CRASH_TRIALS`, `CNI_CRASH_SEED`.

use cni_tests::chain::Chain;
use cni_tests::leaks::leaks;
use cni_tests::{cni_path_with, wait_until, Exec, Netns, TempDir};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn env_u64(k: &str) -> Option<u64> {
    std::env::var(k).ok().and_then(|v| v.parse().ok())
}

/// xorshift64*: small, seedable, good enough to spread kill points.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

fn caps() -> Value {
    json!({
        "portMappings": [{"hostPort": 31000, "containerPort": 80, "protocol": "tcp"}],
        "bandwidth": {"ingressRate": 8_000_000, "ingressBurst": 16_000_000,
                      "egressRate": 8_000_000, "egressBurst": 16_000_000}
    })
}

/// Run the chain up to plugin `target` normally, then start `target` (or, for host-local, the
/// bridge's IPAM call on its own) and SIGKILL it after `delay`.
fn add_and_kill(chain: &Chain, host: &Netns, ctr: &Netns, id: &str, target: &str, delay: Duration) {
    let caps = caps();
    let mut prev: Option<Value> = None;
    for i in 0..chain.plugins.len() {
        let t = chain.plugin_type(i);
        if t == target || (target == "host-local" && t == "bridge") {
            let plugin = if target == "host-local" { "host-local" } else { t };
            let path = chain.cni_path.join(plugin);
            let stdin = chain.request(i, &caps, prev.as_ref());
            let mut child = Exec::new(path.to_str().unwrap())
                .in_ns(host)
                .attachment("ADD", id, ctr.path_str(), "eth0", chain.cni_path.to_str().unwrap())
                .spawn(&stdin);
            let start = Instant::now();
            while start.elapsed() < delay {
                std::hint::spin_loop();
            }
            let _ = child.kill();
            let _ = child.wait();
            return;
        }
        let s = chain.exec(i, "ADD", id, ctr.path_str(), "eth0", &caps, prev.as_ref(), Some(host));
        assert_eq!(s.out.code, 0, "ADD {t}: {}", s.out.stdout);
        prev = Some(s.out.json());
    }
}

/// Median wall time of a normal ADD of `target` (with its predecessors done untimed).
fn typical(chain: &Chain, host: &Netns, target: &str) -> Duration {
    let mut v = Vec::new();
    for k in 0..5 {
        let ctr = Netns::new("crt");
        let id = format!("typ-{target}-{k}");
        let caps = caps();
        let (result, steps) = chain.add(&id, ctr.path_str(), "eth0", &caps, Some(host)).expect("normal ADD");
        let name = if target == "host-local" { "bridge" } else { target };
        v.push(steps.iter().find(|s| s.plugin == name).expect("step").elapsed);
        chain.del(&id, ctr.path_str(), "eth0", &caps, Some(&result), Some(host));
    }
    v.sort();
    v[2]
}

#[test]
fn sigkill_during_add_then_del_or_gc_leaves_nothing() {
    let trials = env_u64("CNI_CRASH_TRIALS").unwrap_or(200);
    let seed = env_u64("CNI_CRASH_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1
    });
    eprintln!("crash: {trials} trials, CNI_CRASH_SEED={seed}");
    let mut rng = Rng(seed);
    let host = Netns::new("crh");
    host.run("ip", &["link", "set", "lo", "up"]);
    let bins = cni_path_with(&["bridge", "host-local", "portmap", "bandwidth"]);
    let data = TempDir::new("crash");
    let chain = Chain::kubenet("crash", "1.1.0", "cbr0", "10.151.0.0/16", data.str(), bins.path());
    let targets = ["bridge", "host-local", "portmap", "bandwidth"];
    let typ: Vec<Duration> = targets.iter().map(|t| typical(&chain, &host, t)).collect();
    let mut by_cleanup = [0u32; 2];
    for trial in 0..trials {
        let ti = (trial % targets.len() as u64) as usize;
        let target = targets[ti];
        // anywhere from "not started" to "just finished"
        let max = typ[ti].as_micros() as u64 * 12 / 10 + 1;
        let delay = Duration::from_micros(rng.next() % max);
        let ctr = Netns::new("crc");
        let id = format!("crash-{trial}");
        add_and_kill(&chain, &host, &ctr, &id, target, delay);
        let use_gc = rng.next() % 2 == 1;
        if use_gc {
            // the container is gone: its namespace (and the veth pair with it) disappears, then
            // GC. The kernel destroys a namespace asynchronously: wait for the pair to go.
            drop(ctr);
            wait_until("the dropped namespace's veth pair to go", Duration::from_secs(10), || {
                !host.link_names().iter().any(|l| l.starts_with("veth"))
            });
            chain.gc(&[], Some(&host));
        } else {
            chain.del(&id, ctr.path_str(), "eth0", &caps(), None, Some(&host));
            assert!(
                ctr.link("eth0").is_none(),
                "trial {trial} ({target}, {delay:?}): eth0 left in the container"
            );
            drop(ctr);
        }
        by_cleanup[use_gc as usize] += 1;
        let left = leaks(&host, "crash", data.path(), &["lo", "cbr0"]);
        assert!(
            left.is_empty(),
            "trial {trial}: killed {target} after {delay:?}, cleaned up by {}: {left:#?} (CNI_CRASH_SEED={seed})",
            if use_gc { "GC" } else { "DEL" }
        );
    }
    eprintln!("crash: {trials} trials clean ({} via DEL, {} via GC)", by_cleanup[0], by_cleanup[1]);
}
