//! bandwidth ADD, CHECK and DEL (both directions shaped), whole process, on a fresh veth pair
//! each iteration. Ours deletes the host veth's qdiscs on DEL as well; upstream only the ifb.

use super::floor::BandwidthFloor;
use super::{peer_bin, timed, upstream_bin, Case, Step, FLOOR, V110};
use cni_tests::{bin, sh, unique, Exec, Netns};
use serde_json::json;
use std::time::Duration;

/// Untimed setup: a container netns and a veth pair into it, as bridge would leave it.
fn veth_pair() -> (Netns, String) {
    let ctr = Netns::new("bbc");
    let veth = unique("bbv");
    sh("ip", &["link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", ctr.name()]);
    sh("ip", &["link", "set", &veth, "up"]);
    ctr.run("ip", &["link", "set", "eth0", "up"]);
    (ctr, veth)
}

/// The floor: the same qdiscs, ifb and filter from inside the driver (CHECK's floor is the
/// reads it needs; reported as zero work would mislead, so the row repeats no request: it
/// lists the qdiscs and filters once, as a check must).
fn floor_step<'a>() -> Step<'a> {
    let f = BandwidthFloor::new(100_000_000, 1_000_000);
    Box::new(move || -> Vec<Duration> {
        let (_ctr, veth) = veth_pair();
        let (ifb, t_add) = timed(|| f.add(&veth));
        let ((), t_check) = timed(|| f.check(&veth));
        let ((), t_del) = timed(|| f.del(&veth, &ifb));
        vec![t_add, t_check, t_del]
    })
}

fn step<'a>(plugin: String) -> Step<'a> {
    Box::new(move || -> Vec<Duration> {
        let (ctr, veth) = veth_pair();
        let prev = json!({"cniVersion": "1.0.0", "interfaces": [
            {"name": "cni0"}, {"name": veth}, {"name": "eth0", "sandbox": ctr.path_str()}],
            "ips": [{"interface": 2, "address": "10.99.0.2/24", "gateway": "10.99.0.1"}]});
        let mut conf = json!({"cniVersion": "1.0.0", "name": "bench-bw", "type": "bandwidth",
            "ingressRate": 100_000_000, "ingressBurst": 1_000_000,
            "egressRate": 100_000_000, "egressBurst": 1_000_000, "prevResult": prev});
        let id = unique("bench-");
        let run = |cmd: &str, conf: &str| {
            Exec::new(&plugin).attachment(cmd, &id, ctr.path_str(), "eth0", "/opt/cni/bin").run(conf)
        };
        let (add, t_add) = timed(|| run("ADD", &conf.to_string()));
        assert_eq!(add.code, 0, "{plugin} ADD: {}", add.stdout);
        conf["prevResult"] = add.json();
        let conf = conf.to_string();
        let (check, t_check) = timed(|| run("CHECK", &conf));
        assert_eq!(check.code, 0, "{plugin} CHECK: {}", check.stdout);
        let (del, t_del) = timed(|| run("DEL", &conf));
        assert_eq!(del.code, 0, "{plugin} DEL: {}", del.stdout);
        vec![t_add, t_check, t_del]
    })
}

/// The driver runs inside the fake host netns already.
pub fn cases<'a>() -> Vec<Case<'a>> {
    vec![Case {
        label: "bandwidth (ingress + egress)".into(),
        rows: vec!["ADD".into(), "CHECK".into(), "DEL".into()],
        ours: step(bin("bandwidth").to_string_lossy().into_owned()),
        upstream: step(upstream_bin("bandwidth").to_string_lossy().into_owned()),
        extra: vec![
            (V110.into(), step(peer_bin("bandwidth").to_string_lossy().into_owned())),
            (FLOOR.into(), floor_step()),
        ],
    }]
}
