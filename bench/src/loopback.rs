//! loopback ADD and DEL, whole process, in a fresh container netns each iteration.

use super::{peer_bin, peer_sides, timed, upstream_bin, Case, Step, FLOOR, V110};
use cni_tests::{bin, Exec, Netns};
use std::time::Duration;

fn step<'a>(plugin: String) -> Step<'a> {
    let conf = r#"{"cniVersion":"1.0.0","name":"bench-lo","type":"loopback"}"#;
    Box::new(move || -> Vec<Duration> {
        let ctr = Netns::new("bl");
        let run = |cmd: &str| {
            Exec::new(&plugin).attachment(cmd, "bench-ctr", ctr.path_str(), "eth0", "/opt/cni/bin").run(conf)
        };
        let (add, t_add) = timed(|| run("ADD"));
        assert_eq!(add.code, 0, "{plugin} ADD: {}", add.stdout);
        let (del, t_del) = timed(|| run("DEL"));
        assert_eq!(del.code, 0, "{plugin} DEL: {}", del.stdout);
        vec![t_add, t_del]
    })
}

/// The driver runs inside the fake host netns already.
pub fn cases<'a>() -> Vec<Case<'a>> {
    vec![Case {
        label: "loopback".into(),
        rows: vec!["ADD".into(), "DEL".into()],
        ours: step(bin("loopback").to_string_lossy().into_owned()),
        upstream: step(upstream_bin("loopback").to_string_lossy().into_owned()),
        extra: peer_sides(|| vec![(V110.into(), step(peer_bin("loopback").to_string_lossy().into_owned()))]),
    }]
}

/// Process start-up alone: each binary with CNI_COMMAND unset prints its about banner and
/// exits. The floor is the exec of `cnibench-nop`, a static program that does nothing.
pub fn startup<'a>() -> Vec<Case<'a>> {
    let one = |p: String| -> Step<'a> {
        Box::new(move || {
            let (out, t) = timed(|| Exec::new(&p).run(""));
            assert_eq!(out.code, 0, "{p}: {}", out.stderr);
            vec![t]
        })
    };
    ["loopback", "bridge", "host-local", "portmap", "bandwidth"]
        .into_iter()
        .map(|p| Case {
            label: format!("start-up only: {p}"),
            rows: vec!["exec + about banner".into()],
            ours: one(bin(p).to_string_lossy().into_owned()),
            upstream: one(upstream_bin(p).to_string_lossy().into_owned()),
            extra: [
                peer_sides(|| vec![(V110.to_string(), one(peer_bin(p).to_string_lossy().into_owned()))]),
                vec![(FLOOR.to_string(), one(bin("cnibench-nop").to_string_lossy().into_owned()))],
            ]
            .into_iter()
            .flatten()
            .collect(),
        })
        .collect()
}
