//! firewall ADD and DEL chained after a main plugin, whole process, in the driver's scratch host
//! namespace with iptables-nft as the node's `iptables` (as a Podman host has it). Ours with
//! its nftables backend (netlink, no process); v1.10 and 1.1.1 with `"backend": "iptables"`,
//! their only backend without firewalld (each call runs `iptables`/`iptables-save`). All sides
//! share the one host namespace, so they write into the same `filter` tables and `CNI-FORWARD`
//! chain, each with addresses of its own subnet; the warm-up's first ADD creates the chains and
//! every timed call finds them, as on a node with pods running.

use super::{peer_bin, peer_sides, timed, upstream_bin, Case, Step, V110};
use cni_tests::{bin, Exec, Netns};
use serde_json::json;
use std::time::Duration;

fn step<'a>(label: &'static str, plugin: String, net: u8, backend: &'static str) -> Step<'a> {
    // the container side needs to exist only as a valid CNI_NETNS: firewall reads the addresses
    // from the prevResult
    let ctr = Netns::new("bfc");
    let mut n = 0u32;
    Box::new(move || -> Vec<Duration> {
        n += 1;
        let ip = format!("10.{net}.{}.{}", n / 250, n % 250 + 2);
        let prev = json!({"cniVersion": "1.0.0", "interfaces": [
            {"name": "bfw0"}, {"name": "eth0", "sandbox": ctr.path_str()}],
            "ips": [{"interface": 1, "address": format!("{ip}/16"), "gateway": format!("10.{net}.0.1")}]});
        let conf = json!({"cniVersion": "1.0.0", "name": format!("bench-fw-{label}"), "type": "firewall",
            "backend": backend, "prevResult": prev})
        .to_string();
        let id = format!("bench-fw-{label}-{n}");
        let run = |cmd: &str| {
            Exec::new(&plugin).attachment(cmd, &id, ctr.path_str(), "eth0", "/opt/cni/bin").run(&conf)
        };
        let (add, t_add) = timed(|| run("ADD"));
        assert_eq!(add.code, 0, "firewall {label} ADD: {} {}", add.stdout, add.stderr);
        let (del, t_del) = timed(|| run("DEL"));
        assert_eq!(del.code, 0, "firewall {label} DEL: {} {}", del.stdout, del.stderr);
        vec![t_add, t_del]
    })
}

/// The driver runs inside the fake host netns already.
pub fn cases<'a>() -> Vec<Case<'a>> {
    vec![Case {
        label: "firewall (ours: nftables; v1.10 and 1.1.1: iptables-nft)".into(),
        rows: vec!["ADD".into(), "DEL".into()],
        ours: step("o", bin("firewall").to_string_lossy().into_owned(), 131, "nftables"),
        upstream: step("u", upstream_bin("firewall").to_string_lossy().into_owned(), 132, "iptables"),
        extra: peer_sides(|| {
            vec![(
                V110.into(),
                step("v", peer_bin("firewall").to_string_lossy().into_owned(), 133, "iptables"),
            )]
        }),
    }]
}
