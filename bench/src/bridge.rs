//! bridge + host-local ADD and DEL, whole process (the bridge runs host-local itself: ours
//! in-process, being the same build, upstream's by exec), in a
//! fresh container netns each iteration. Ours and upstream's each get their own CNI_PATH
//! (bridge + host-local of the same implementation), bridge, subnet and dataDir.

use super::floor::{BridgeFloor, BridgePlan};
use super::{baseline, peer_bin, timed, upstream_bin, Case, Step, FLOOR, V110, V110_NFT};
use cni_tests::{bin, Exec, Netns, TempDir};
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

/// Which configuration a case uses.
#[derive(Clone, Copy)]
enum Profile {
    /// `isGateway`, one IPv4 range.
    Gateway,
    /// The same with `ipMasq`.
    Masq,
    /// `isGateway` with our opt-in `deferredDelete` (upstream ignores the key).
    Deferred,
    /// kubenet's: dual stack, default routes, hairpin (no masquerading, as kubenet's bridge).
    Kubenet,
}

fn step<'a>(label: &'static str, s: Side, net: u8, profile: Profile) -> Step<'a> {
    step_with(label, s, net, profile, None)
}

/// [`step`] with bridge's `ipMasqBackend` (v1.10's) set to `backend`.
fn step_with<'a>(label: &'static str, s: Side, net: u8, profile: Profile, backend: Option<&str>) -> Step<'a> {
    let data = s.data.str();
    let conf = match profile {
        Profile::Gateway | Profile::Masq | Profile::Deferred => format!(
            r#"{{"cniVersion":"1.0.0","name":"bench-{label}-{net}","type":"bridge","bridge":"bb{label}{net}",
                "isGateway":true,"ipMasq":{},"deferredDelete":{},
                "ipam":{{"type":"host-local","subnet":"10.{net}.0.0/16","dataDir":"{data}"}}}}"#,
            matches!(profile, Profile::Masq),
            matches!(profile, Profile::Deferred)
        ),
        Profile::Kubenet => format!(
            r#"{{"cniVersion":"1.0.0","name":"bench-{label}-{net}","type":"bridge","bridge":"bb{label}{net}",
                "isGateway":true,"hairpinMode":true,
                "ipam":{{"type":"host-local","dataDir":"{data}",
                         "ranges":[[{{"subnet":"10.{net}.0.0/16"}}],[{{"subnet":"fd00:{net}::/64"}}]],
                         "routes":[{{"dst":"0.0.0.0/0"}},{{"dst":"::/0"}}]}}}}"#
        ),
    };
    let conf = match backend {
        Some(b) => {
            let mut v: serde_json::Value = serde_json::from_str(&conf).expect("bridge conf");
            v["ipMasqBackend"] = serde_json::json!(b);
            v.to_string()
        }
        None => conf,
    };
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

/// The floor of a profile: the same kernel requests from inside the driver, on a bridge of its
/// own (see [`super::floor`]).
fn floor_step<'a>(net: u8, profile: Profile) -> Step<'a> {
    let plan = match profile {
        Profile::Gateway | Profile::Deferred => BridgePlan::default(),
        Profile::Masq => BridgePlan { masq: true, ..Default::default() },
        Profile::Kubenet => {
            BridgePlan { v6: true, default_routes: true, hairpin: true, ..Default::default() }
        }
    };
    let mut f = BridgeFloor::new(plan, net);
    Box::new(move || -> Vec<Duration> {
        let ctr = Netns::new("bb");
        let (mut a, t_add) = timed(|| f.add(&ctr));
        f.prepare_del(&mut a);
        let ((), t_del) = timed(|| f.del(&ctr, a));
        vec![t_add, t_del]
    })
}

/// `sides` and the floor last.
fn with_floor<'a>(mut sides: Vec<(String, Step<'a>)>, floor: Step<'a>) -> Vec<(String, Step<'a>)> {
    sides.push((FLOOR.into(), floor));
    sides
}

/// The driver runs inside the fake host netns already.
pub fn cases<'a>() -> Vec<Case<'a>> {
    let ours = || side(&bin("bridge"), &bin("host-local"));
    let up = || side(&upstream_bin("bridge"), &upstream_bin("host-local"));
    let peer = || side(&peer_bin("bridge"), &peer_bin("host-local"));
    // v1.10 sides: the default backend (iptables when the node has it, as here), and for
    // ipMasq the nftables one
    let v110 = |net: u8, profile: Profile| -> Vec<(String, Step<'a>)> {
        super::peer_sides(|| {
            let mut v = vec![(V110.to_string(), step("v", peer(), net, profile))];
            if matches!(profile, Profile::Masq) {
                v.push((V110_NFT.to_string(), step_with("n", peer(), net + 10, profile, Some("nftables"))));
            }
            v
        })
    };
    vec![
        Case {
            label: "bridge + host-local (isGateway)".into(),
            rows: vec!["ADD".into(), "DEL".into()],
            ours: step("o", ours(), 61, Profile::Gateway),
            upstream: step("u", up(), 62, Profile::Gateway),
            extra: with_floor(v110(81, Profile::Gateway), floor_step(71, Profile::Gateway)),
        },
        Case {
            label: "kubenet profile (dual stack, default routes, hairpin)".into(),
            rows: vec!["ADD".into(), "DEL".into()],
            ours: step("o", ours(), 65, Profile::Kubenet),
            upstream: step("u", up(), 66, Profile::Kubenet),
            extra: with_floor(v110(85, Profile::Kubenet), floor_step(75, Profile::Kubenet)),
        },
        Case {
            label: if baseline().is_some() {
                "isGateway + ipMasq".into()
            } else {
                "isGateway + ipMasq (ours: nftables; 1.1.1: iptables; v1.10: iptables by default)".into()
            },
            rows: vec!["ADD".into(), "DEL".into()],
            ours: step("o", ours(), 63, Profile::Masq),
            upstream: step("u", up(), 64, Profile::Masq),
            extra: with_floor(v110(83, Profile::Masq), floor_step(73, Profile::Masq)),
        },
        Case {
            label: "isGateway, ours with deferredDelete (opt-in)".into(),
            rows: vec!["ADD".into(), "DEL".into()],
            ours: step("o", ours(), 67, Profile::Deferred),
            upstream: step("u", up(), 68, Profile::Deferred),
            extra: with_floor(v110(87, Profile::Deferred), floor_step(77, Profile::Deferred)),
        },
    ]
}
