//! ptp + host-local ADD and DEL, whole process (ours runs host-local in-process, being the same
//! build; the upstreams exec theirs), in a fresh container netns each iteration, plain and with
//! `ipMasq`. Each side has its own CNI_PATH (ptp + host-local of one implementation), subnet and
//! dataDir. With `ipMasq`, v1.10 masquerades with iptables by default and with nftables under
//! `"ipMasqBackend": "nftables"` (its own column); 1.1.1 with iptables; ours with nftables.

use super::{peer_bin, peer_sides, timed, upstream_bin, Case, Step, V110, V110_NFT};
use cni_tests::{bin, Exec, Netns, TempDir};
use std::path::Path;
use std::time::Duration;

struct Side {
    cni_path: TempDir,
    data: TempDir,
}

fn side(ptp: &Path, host_local: &Path) -> Side {
    let cni_path = TempDir::new("pbin");
    std::os::unix::fs::symlink(ptp, cni_path.join("ptp")).expect("symlink ptp");
    std::os::unix::fs::symlink(host_local, cni_path.join("host-local")).expect("symlink host-local");
    Side { cni_path, data: TempDir::new("pdata") }
}

/// One side's ADD then DEL on subnet 10.`net`.0.0/16; `backend` sets v1.10's `ipMasqBackend`.
fn step<'a>(label: &'static str, s: Side, net: u8, masq: bool, backend: Option<&str>) -> Step<'a> {
    let mut conf = serde_json::json!({
        "cniVersion": "1.0.0", "name": format!("bench-ptp-{label}-{net}"), "type": "ptp",
        "ipMasq": masq,
        "ipam": {"type": "host-local", "subnet": format!("10.{net}.0.0/16"), "dataDir": s.data.str()},
    });
    if let Some(b) = backend {
        conf["ipMasqBackend"] = serde_json::json!(b);
    }
    let conf = conf.to_string();
    let plugin = s.cni_path.join("ptp").to_string_lossy().into_owned();
    let mut n = 0u64;
    Box::new(move || -> Vec<Duration> {
        let _keep = &s;
        n += 1;
        let id = format!("bench-ptp-{n}");
        let ctr = Netns::new("bp");
        let run = |cmd: &str| {
            Exec::new(&plugin).attachment(cmd, &id, ctr.path_str(), "eth0", s.cni_path.str()).run(&conf)
        };
        let (add, t_add) = timed(|| run("ADD"));
        assert_eq!(add.code, 0, "ptp {label} ADD: {} {}", add.stdout, add.stderr);
        let (del, t_del) = timed(|| run("DEL"));
        assert_eq!(del.code, 0, "ptp {label} DEL: {} {}", del.stdout, del.stderr);
        vec![t_add, t_del]
    })
}

/// The driver runs inside the fake host netns already.
pub fn cases<'a>() -> Vec<Case<'a>> {
    let ours = || side(&bin("ptp"), &bin("host-local"));
    let up = || side(&upstream_bin("ptp"), &upstream_bin("host-local"));
    let peer = || side(&peer_bin("ptp"), &peer_bin("host-local"));
    let v110 = |net: u8, masq: bool| -> Vec<(String, Step<'a>)> {
        peer_sides(|| {
            let mut v = vec![(V110.to_string(), step("v", peer(), net, masq, None))];
            if masq {
                v.push((V110_NFT.to_string(), step("n", peer(), net + 1, masq, Some("nftables"))));
            }
            v
        })
    };
    vec![
        Case {
            label: "ptp + host-local".into(),
            rows: vec!["ADD".into(), "DEL".into()],
            ours: step("o", ours(), 121, false, None),
            upstream: step("u", up(), 122, false, None),
            extra: v110(123, false),
        },
        Case {
            label: "ptp + host-local, ipMasq (ours: nftables; 1.1.1: iptables; v1.10: iptables by default)"
                .into(),
            rows: vec!["ADD".into(), "DEL".into()],
            ours: step("o", ours(), 125, true, None),
            upstream: step("u", up(), 126, true, None),
            extra: v110(127, true),
        },
    ]
}
