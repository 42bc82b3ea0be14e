//! What a runtime can observe of bridge's opt-in `deferredDelete`, measured against the
//! default (synchronous) DEL in the same loop:
//! - when DEL returns, and for how long afterwards the veth pair is still there (the host end
//!   in the host namespace, the container end — renamed `cnidel…` and down — in the
//!   container's), polled over netlink every 0.2 ms;
//! - an immediate re-ADD of the same container id and ifname in the same namespace, right
//!   after DEL returned: whether it succeeds, and what it costs;
//! - the address reuse window: on a network whose range holds one address, a pod A the host
//!   has just pinged is deleted and a new pod B ADDed right after gets the same address; how
//!   long until the host's ping reaches B (the host's neighbour entry still holds A's MAC
//!   until B's gratuitous ARP, `arp_notify`, replaces it).

use super::{stats, timed};
use cni_common::netlink::Netlink;
use cni_common::netns::NetNs;
use cni_tests::{bin, Exec, Netns, TempDir};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

struct Mode {
    del: Vec<Duration>,
    host_end: Vec<Duration>,
    ctr_end: Vec<Duration>,
    readd_ok: usize,
    readd: Vec<Duration>,
    ping: Vec<Duration>,
    ping_fail: usize,
}

/// How long after `since` until `gone()` holds, polling every 0.2 ms (5 s at most); zero when
/// the first look finds it gone (a look itself takes ~0.1–0.2 ms).
fn until_gone(since: Instant, mut gone: impl FnMut() -> bool) -> Duration {
    if gone() {
        return Duration::ZERO;
    }
    let end = Instant::now() + Duration::from_secs(5);
    while !gone() {
        assert!(Instant::now() < end, "deferred: a veth end is still there after 5 s");
        std::thread::sleep(Duration::from_micros(200));
    }
    since.elapsed()
}

fn ping_until(ip: &str, since: Instant) -> Option<Duration> {
    let end = Instant::now() + Duration::from_secs(5);
    while Instant::now() < end {
        let out = std::process::Command::new("ping").args(["-c1", "-W0.2", "-q", ip]).output().expect("ping");
        if out.status.success() {
            return Some(since.elapsed());
        }
    }
    None
}

pub fn report(iterations: usize) -> String {
    let bins = TempDir::new("dfbin");
    for p in ["bridge", "host-local"] {
        std::os::unix::fs::symlink(bin(p), bins.join(p)).expect("symlink");
    }
    let bridge = bins.join("bridge").to_string_lossy().into_owned();
    let mut modes = [(), ()].map(|()| Mode {
        del: Vec::new(),
        host_end: Vec::new(),
        ctr_end: Vec::new(),
        readd_ok: 0,
        readd: Vec::new(),
        ping: Vec::new(),
        ping_fail: 0,
    });
    let mut keep = Vec::new();
    let confs: Vec<(String, String)> = (0..2u8)
        .map(|k| {
            let data = TempDir::new("dfdata");
            let net = |one: bool| {
                let range = if one {
                    json!({"subnet": format!("10.9{k}.0.0/24"), "rangeStart": format!("10.9{k}.0.10"), "rangeEnd": format!("10.9{k}.0.10")})
                } else {
                    json!({"subnet": format!("10.8{k}.0.0/16")})
                };
                let br = if one { format!("dfone{k}") } else { format!("dfbr{k}") };
                json!({"cniVersion": "1.0.0", "name": format!("df{k}{one}"), "type": "bridge", "bridge": br,
                    "isGateway": true, "deferredDelete": k == 1,
                    "ipam": {"type": "host-local", "ranges": [[range]], "dataDir": data.str()}})
                .to_string()
            };
            let c = (net(false), net(true));
            keep.push(data);
            c
        })
        .collect();
    let mut host = Netlink::new().expect("host netlink");
    for i in 0..iterations + 2 {
        for j in 0..2 {
            let k = (i + j) % 2;
            let m = &mut modes[k];
            let (conf, one) = &confs[k];
            let ctr = Netns::new("df");
            let id = format!("df-{i}");
            let run = |cmd: &str, id: &str, ns: &Netns, conf: &str| {
                Exec::new(&bridge).attachment(cmd, id, ns.path_str(), "eth0", bins.str()).run(conf)
            };
            let add: Value = run("ADD", &id, &ctr, conf).ok();
            let host_veth = add["interfaces"][1]["name"].as_str().expect("host veth").to_string();
            let (out, d) = timed(|| run("DEL", &id, &ctr, conf));
            out.ok_silent();
            let returned = Instant::now();
            let ns = NetNs::open(ctr.path()).expect("open container netns");
            let mut c = Netlink::new_in(&ns).expect("container netlink");
            let host_gone = until_gone(returned, || host.link_by_name(&host_veth).expect("lookup").is_none());
            let ctr_gone = until_gone(returned, || c.links().expect("links").iter().all(|l| l.name == "lo"));
            // an immediate re-ADD of the same attachment, right after its DEL returned
            run("ADD", &id, &ctr, conf).ok();
            run("DEL", &id, &ctr, conf).ok_silent();
            let (again, t_readd) = timed(|| run("ADD", &id, &ctr, conf));
            if again.code == 0 {
                run("DEL", &id, &ctr, conf).ok_silent();
            }
            // the address reuse window: A on the one-address network, DEL, B gets the address
            let a = Netns::new("dfa");
            let ra: Value = run("ADD", "dfa", &a, one).ok();
            let ip = ra["ips"][0]["address"].as_str().unwrap().split('/').next().unwrap().to_string();
            // the host has talked to A (its neighbour entry holds A's MAC), as it would a pod
            a.run("ip", &["link", "set", "lo", "up"]);
            assert!(ping_until(&ip, Instant::now()).is_some(), "pod A at {ip} answers");
            run("DEL", "dfa", &a, one).ok_silent();
            let b = Netns::new("dfb");
            let rb: Value = run("ADD", "dfb", &b, one).ok();
            let t_b = Instant::now();
            assert_eq!(rb["ips"][0]["address"], ra["ips"][0]["address"], "the one address is reused");
            let reached = ping_until(&ip, t_b);
            run("DEL", "dfb", &b, one).ok_silent();
            if i < 2 {
                continue; // warm-up
            }
            m.del.push(d);
            m.host_end.push(host_gone);
            m.ctr_end.push(ctr_gone);
            if again.code == 0 {
                m.readd_ok += 1;
                m.readd.push(t_readd);
            }
            match reached {
                Some(t) => m.ping.push(t),
                None => m.ping_fail += 1,
            }
        }
    }
    let ms = |v: &[Duration]| {
        if v.is_empty() {
            return "–".to_string();
        }
        let s = stats(v.to_vec());
        format!("{:.2} / {:.2}", s.median.as_secs_f64() * 1000.0, s.max.as_secs_f64() * 1000.0)
    };
    // how many were gone at the first look, and the median / max of the others
    let lingering = |v: &[Duration]| {
        let later: Vec<Duration> = v.iter().copied().filter(|d| !d.is_zero()).collect();
        let first = v.len() - later.len();
        if later.is_empty() {
            format!("gone at the first look {first}/{}", v.len())
        } else {
            format!("gone at the first look {first}/{}; the others {}", v.len(), ms(&later))
        }
    };
    let mut out = String::from(
        "| what a runtime observes (median / max ms over the iterations) | DEL as upstream (default) | deferredDelete |\n|---|---|---|\n",
    );
    let row = |label: &str, f: &dyn Fn(&Mode) -> String| {
        format!("| {label} | {} | {} |\n", f(&modes[0]), f(&modes[1]))
    };
    out.push_str(&row("DEL returns after", &|m| ms(&m.del)));
    out.push_str(&row("host end of the veth still listed after DEL returned", &|m| lingering(&m.host_end)));
    out.push_str(&row(
        "container end (deferred: down, renamed `cnidel…`) still in the namespace after DEL returned",
        &|m| lingering(&m.ctr_end),
    ));
    let n = iterations;
    out.push_str(&row("immediate re-ADD, same container id + ifname + netns: succeeded", &|m| {
        format!("{}/{n}", m.readd_ok)
    }));
    out.push_str(&row("… and took", &|m| ms(&m.readd)));
    out.push_str(&row("one-address range: a new pod ADDed right after DEL gets the same address; host's ping first answered after its ADD returned", &|m| {
        if m.ping_fail > 0 {
            format!("{} ({} of {n} never within 5 s)", ms(&m.ping), m.ping_fail)
        } else {
            ms(&m.ping)
        }
    }));
    out
}
