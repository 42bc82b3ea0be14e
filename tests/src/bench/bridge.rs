//! bridge + host-local ADD and DEL, whole process (the bridge execs host-local itself), in a
//! fresh container netns each iteration. Ours and upstream's each get their own CNI_PATH
//! (bridge + host-local of the same implementation), bridge, subnet and dataDir.

use super::{timed, upstream_bin, Case, Step};
use crate::{bin, Exec, Netns, TempDir};
use std::path::Path;
use std::time::Duration;

struct Side {
    cni_path: TempDir,
    data: TempDir,
}

fn side(bridge: &Path, host_local: &Path) -> Side {
    let cni_path = TempDir::new("bbin");
    std::os::unix::fs::symlink(bridge, cni_path.join("bridge")).expect("symlink bridge");
    std::os::unix::fs::symlink(host_local, cni_path.join("host-local")).expect("symlink host-local");
    Side { cni_path, data: TempDir::new("bdata") }
}

fn step<'a>(label: &'static str, s: Side, net: u8, ip_masq: bool) -> Step<'a> {
    let conf = format!(
        r#"{{"cniVersion":"1.0.0","name":"bench-{label}-{net}","type":"bridge","bridge":"bb{label}{net}",
            "isGateway":true,"ipMasq":{ip_masq},
            "ipam":{{"type":"host-local","subnet":"10.{net}.0.0/16","dataDir":"{}"}}}}"#,
        s.data.str()
    );
    let plugin = s.cni_path.join("bridge").to_string_lossy().into_owned();
    let mut n = 0u64;
    Box::new(move || -> Vec<Duration> {
        let _keep = &s;
        n += 1;
        let id = format!("bench-{n}");
        let ctr = Netns::new("bb");
        let run = |cmd: &str| {
            Exec::new(&plugin).attachment(cmd, &id, ctr.path_str(), "eth0", s.cni_path.str()).run(&conf)
        };
        let (add, t_add) = timed(|| run("ADD"));
        assert_eq!(add.code, 0, "{label} ADD: {} {}", add.stdout, add.stderr);
        let (del, t_del) = timed(|| run("DEL"));
        assert_eq!(del.code, 0, "{label} DEL: {} {}", del.stdout, del.stderr);
        vec![t_add, t_del]
    })
}

/// The driver runs inside the fake host netns already.
pub fn cases<'a>() -> Vec<Case<'a>> {
    let ours = || side(&bin("bridge"), &bin("host-local"));
    let up = || side(&upstream_bin("bridge"), &upstream_bin("host-local"));
    vec![
        Case {
            label: "bridge + host-local (isGateway)".into(),
            rows: vec!["ADD".into(), "DEL".into()],
            ours: step("o", ours(), 61, false),
            upstream: step("u", up(), 62, false),
        },
        Case {
            label: "… with ipMasq (ours: nftables; upstream 1.1.1: iptables)".into(),
            rows: vec!["ADD".into(), "DEL".into()],
            ours: step("o", ours(), 63, true),
            upstream: step("u", up(), 64, true),
        },
    ]
}
