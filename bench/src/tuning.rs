//! tuning ADD and DEL chained after a main plugin, whole process: only tuning's own call is
//! timed. Untimed per iteration: a container netns and a veth pair into it (what bridge or ptp
//! would leave), and the prevResult naming it. Keys: one sysctl of the interface, `mtu` and
//! `mac`, so ADD saves the link's settings and changes three things, and DEL puts MTU and MAC
//! back from the saved file.

use super::{peer_bin, peer_sides, timed, upstream_bin, Case, Step, V110};
use cni_tests::{bin, sh, unique, Exec, Netns};
use serde_json::json;
use std::time::Duration;

fn step<'a>(plugin: String) -> Step<'a> {
    Box::new(move || -> Vec<Duration> {
        let ctr = Netns::new("btc");
        let veth = unique("btv");
        sh("ip", &["link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", ctr.name()]);
        sh("ip", &["link", "set", &veth, "up"]);
        ctr.run("ip", &["link", "set", "eth0", "up"]);
        let prev = json!({"cniVersion": "1.0.0", "interfaces": [
            {"name": veth}, {"name": "eth0", "sandbox": ctr.path_str()}],
            "ips": [{"interface": 1, "address": "10.98.0.2/24", "gateway": "10.98.0.1"}]});
        let mut conf = json!({"cniVersion": "1.0.0", "name": "bench-tuning", "type": "tuning",
            "sysctl": {"net.ipv4.conf.eth0.arp_notify": "1"},
            "mtu": 1400, "mac": "0a:58:0a:62:00:02", "prevResult": prev});
        let id = unique("bench-");
        let run = |cmd: &str, conf: &str| {
            Exec::new(&plugin).attachment(cmd, &id, ctr.path_str(), "eth0", "/opt/cni/bin").run(conf)
        };
        let (add, t_add) = timed(|| run("ADD", &conf.to_string()));
        assert_eq!(add.code, 0, "{plugin} ADD: {} {}", add.stdout, add.stderr);
        conf["prevResult"] = add.json();
        let (del, t_del) = timed(|| run("DEL", &conf.to_string()));
        assert_eq!(del.code, 0, "{plugin} DEL: {} {}", del.stdout, del.stderr);
        sh("ip", &["link", "del", &veth]);
        vec![t_add, t_del]
    })
}

/// The driver runs inside the fake host netns already.
pub fn cases<'a>() -> Vec<Case<'a>> {
    vec![Case {
        label: "tuning (sysctl + mtu + mac, after a veth pair)".into(),
        rows: vec!["ADD".into(), "DEL".into()],
        ours: step(bin("tuning").to_string_lossy().into_owned()),
        upstream: step(upstream_bin("tuning").to_string_lossy().into_owned()),
        extra: peer_sides(|| vec![(V110.into(), step(peer_bin("tuning").to_string_lossy().into_owned()))]),
    }]
}
