//! STATUS as a hot path (containerd ≥ 2.0.1 runs STATUS of every plugin of a 1.1.0 list on
//! every CRI `Status` call; the kubelet makes one every 5 s).
//!
//! - [`cases`]: STATUS and VERSION of each plugin, whole process, ours and today's upstream
//!   release (v1.10, `CNI_PEER_DIR`) interleaved with the start-up floor (`cnibench-nop`).
//! - [`bare_cases`]: what STATUS used to pay on every call and what it pays now, in-process: the
//!   nf_tables dry run of portmap's layout (aborted by the kernel) against the generation read.
//! - [`loaded_cases`]: the full chain's ADD and DEL while a background thread runs STATUS of
//!   the list at kubelet cadence, at 10 Hz, at 10 Hz with a portmap layout never seen before on
//!   every call (so each one is a full dry run, as every STATUS was before certificates), or
//!   kube-proxy-sized nf_tables transactions back to back; each side switches its load on for
//!   its own iterations only, so all sides share the same minutes.

use super::{timed, Case, Row, Step, FLOOR};
use cni_common::netlink::nft::NfTables;
use cni_tests::chain::Chain;
use cni_tests::{bin, kubeproxy, Exec, Netns, TempDir};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Each plugin's STATUS configuration (cniVersion 1.1.0): bridge with ipMasq (the dry run of
/// its masquerade rules), portmap plain, the rest as the chain has them.
fn conf(plugin: &str, data: &str) -> String {
    let c = match plugin {
        "bridge" => json!({"type": "bridge", "bridge": "cbrs", "isGateway": true, "ipMasq": true,
                           "ipam": {"type": "host-local", "subnet": "10.231.0.0/16", "dataDir": data}}),
        // as bridge delegates it: the network's configuration with its `ipam` section
        "host-local" => json!({"type": "host-local",
                               "ipam": {"type": "host-local", "subnet": "10.232.0.0/16", "dataDir": data}}),
        "portmap" => json!({"type": "portmap", "capabilities": {"portMappings": true}, "snat": true}),
        "bandwidth" => json!({"type": "bandwidth", "capabilities": {"bandwidth": true}}),
        _ => json!({"type": plugin}),
    };
    let mut c = c;
    c["cniVersion"] = json!("1.1.0");
    c["name"] = json!("bench-status");
    c.to_string()
}

fn verb<'a>(dir: PathBuf, plugin: &'static str, data: Rc<TempDir>) -> Step<'a> {
    let path = dir.join(plugin).to_string_lossy().into_owned();
    let stdin = conf(plugin, data.str());
    let cni_path = dir.to_string_lossy().into_owned();
    Box::new(move || {
        let _keep = &data;
        let run = |cmd: &str| {
            let (out, t) =
                timed(|| Exec::new(&path).env("CNI_COMMAND", cmd).env("CNI_PATH", &cni_path).run(&stdin));
            assert_eq!(out.code, 0, "{path} {cmd}: {} {}", out.stdout, out.stderr);
            t
        };
        vec![run("STATUS"), run("VERSION")]
    })
}

fn nop<'a>() -> Step<'a> {
    let p = bin("cnibench-nop").to_string_lossy().into_owned();
    Box::new(move || {
        let (out, t) = timed(|| Exec::new(&p).run(""));
        assert_eq!(out.code, 0);
        vec![t, t]
    })
}

/// STATUS and VERSION per plugin, ours against v1.10, with the start-up floor.
pub fn cases<'a>() -> Vec<Case<'a>> {
    let ours = bin("bridge").parent().expect("bin dir").to_path_buf();
    let peer = super::peer_dir();
    ["bridge", "portmap", "host-local", "bandwidth", "loopback"]
        .into_iter()
        .map(|p| Case {
            label: format!("{p}{}", if p == "bridge" { " (ipMasq)" } else { "" }),
            rows: vec!["STATUS".into(), "VERSION".into()],
            ours: verb(ours.clone(), p, Rc::new(TempDir::new("bst"))),
            upstream: verb(peer.clone(), p, Rc::new(TempDir::new("bst"))),
            extra: vec![(FLOOR.into(), nop())],
        })
        .collect()
}

/// Markdown for [`cases`]: per plugin, STATUS and VERSION of each side and STATUS − VERSION.
pub fn markdown(rows: &[Row]) -> String {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let mut s = String::from(
        "| plugin | ours STATUS ms | ours VERSION ms | ours STATUS − VERSION | v1.10 STATUS ms | v1.10 VERSION ms | v1.10 STATUS / ours STATUS | start-up floor ms |\n|---|---|---|---|---|---|---|---|\n",
    );
    for pair in rows.chunks(2) {
        let [st, ver] = pair else { continue };
        let floor = st.floor().map(|f| format!("{:.2}", ms(f.median))).unwrap_or_else(|| "–".into());
        s.push_str(&format!(
            "| {} | {:.2} | {:.2} | {:+.2} ms | {:.2} | {:.2} | **{:.1}x** | {floor} |\n",
            st.case,
            ms(st.ours.median),
            ms(ver.ours.median),
            ms(st.ours.median) - ms(ver.ours.median),
            ms(st.upstream.median),
            ms(ver.upstream.median),
            st.upstream.median.as_secs_f64() / st.ours.median.as_secs_f64(),
        ));
    }
    s
}

/// In-process, in the driver's host namespace: the generation read STATUS makes now (ours),
/// and the dry run of portmap's layout it made on every call before (the "upstream" column of
/// this row is that dry run).
pub fn bare_cases<'a>() -> Vec<Case<'a>> {
    use portmap::config::{Conditions, Lens};
    use portmap::layout::{declaration, Found};
    let lens: Lens = [(cni_common::net::Family::V4, 24), (cni_common::net::Family::V6, 64)].into();
    let ops = declaration(&lens, &Conditions::default()).setup(&Found::default()).ops;
    let mut nf = NfTables::new().expect("nf_tables");
    let mut nf2 = NfTables::new().expect("nf_tables");
    // A one-element commit of portmap's ADD (its floor table), quiet and while another thread
    // of the same namespace makes STATUS's dry run back to back: does the abort hold others up?
    let floor = Rc::new(super::floor::PortmapFloor::new());
    let dry = Arc::new(std::sync::atomic::AtomicBool::new(false));
    {
        let (dry, ops) = (dry.clone(), ops.clone());
        // spawned from the driver's thread, so in its host namespace
        std::thread::spawn(move || {
            let mut nf = NfTables::new().expect("nf_tables");
            loop {
                if dry.load(Ordering::Relaxed) {
                    nf.validate(&ops).expect("dry run");
                } else {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        });
    }
    let commit = |with_dry_runs: bool| -> Step<'a> {
        let (floor, dry) = (floor.clone(), dry.clone());
        let mut nf = NfTables::new().expect("nf_tables");
        let mut n = 0u32;
        Box::new(move || {
            n += 1;
            let (add, del) = floor.ops(n);
            dry.store(with_dry_runs, Ordering::Relaxed);
            if with_dry_runs {
                std::thread::sleep(Duration::from_millis(2)); // the loop is running
            }
            let (r, t) = timed(|| nf.apply(&add));
            dry.store(false, Ordering::Relaxed);
            r.expect("commit");
            nf.apply(&del).expect("commit");
            vec![t]
        })
    };
    let quiet = commit(false);
    let loaded = commit(true);
    vec![
        Case {
            label: "in-process: a one-element commit, quiet (ours) vs while dry runs loop".into(),
            rows: vec!["one commit".into()],
            ours: quiet,
            upstream: loaded,
            extra: vec![],
        },
        Case {
            label: "in-process: generation read (ours now) vs portmap's dry run (before)".into(),
            rows: vec!["one call".into()],
            ours: Box::new(move || {
                let (r, t) = timed(|| nf.generation());
                r.expect("GETGEN");
                vec![t]
            }),
            upstream: Box::new(move || {
                let (r, t) = timed(|| nf2.validate(&ops));
                r.expect("dry run");
                vec![t]
            }),
            extra: vec![],
        },
    ]
}

/// What the background thread does while a side's iterations run.
const QUIET: u8 = 0;
const CADENCE: u8 = 1;
const HZ10: u8 = 2;
const HZ10_DRY: u8 = 3;
const KUBE_PROXY: u8 = 4;

/// What the background thread did, per load, and whether it is in a round now.
#[derive(Default)]
pub struct Rounds {
    by_mode: [AtomicUsize; 5],
    busy: std::sync::atomic::AtomicBool,
}

impl Rounds {
    /// "N rounds of STATUS at 10 Hz, …" for the table's heading.
    pub fn describe(&self) -> String {
        let n = |m: u8| self.by_mode[m as usize].load(Ordering::Relaxed);
        format!(
            "{} STATUS rounds of the list at 10 Hz, {} at 5 s, {} with a fresh dry run, {} kube-proxy restores",
            n(HZ10),
            n(CADENCE),
            n(HZ10_DRY),
            n(KUBE_PROXY)
        )
    }
}

/// The background load of [`loaded_cases`]: STATUS of `chain`'s list in `host` (at 5 s or
/// 10 Hz, certified or with a fresh portmap layout each time), or kube-proxy's rules for
/// `services` services restored back to back.
fn load_thread(chain: Chain, host: Arc<Netns>, mode: Arc<AtomicU8>, services: usize, count: Arc<Rounds>) {
    std::thread::spawn(move || {
        let mut last = Instant::now() - Duration::from_secs(10);
        let mut n = 0u32;
        loop {
            let m = mode.load(Ordering::Relaxed);
            let period = match m {
                CADENCE => Duration::from_secs(5),
                HZ10 | HZ10_DRY => Duration::from_millis(100),
                KUBE_PROXY => Duration::ZERO,
                _ => {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                }
            };
            if last.elapsed() < period {
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
            count.busy.store(true, Ordering::SeqCst);
            if mode.load(Ordering::SeqCst) != m {
                // the side's iteration ended meanwhile: no round outside it
                count.busy.store(false, Ordering::SeqCst);
                continue;
            }
            last = Instant::now();
            n += 1;
            if m == KUBE_PROXY {
                kubeproxy::load(&host, services);
            } else {
                for i in 0..chain.plugins.len() {
                    let mut c: Value = chain.plugins[i].clone();
                    c["cniVersion"] = json!("1.1.0");
                    c["name"] = json!(chain.name);
                    if m == HZ10_DRY && chain.plugin_type(i) == "portmap" {
                        c["conditionsV4"] =
                            json!(["ip", "saddr", "!=", format!("198.18.{}.{}", n / 250 % 250, n % 250 + 1)]);
                    }
                    let p = chain.cni_path.join(chain.plugin_type(i));
                    let out = Exec::new(p.to_str().unwrap())
                        .env("CNI_COMMAND", "STATUS")
                        .env("CNI_PATH", chain.cni_path.to_str().unwrap())
                        .in_ns(&host)
                        .run(&c.to_string());
                    assert_eq!(
                        out.code,
                        0,
                        "STATUS of {}: {} {}",
                        chain.plugin_type(i),
                        out.stdout,
                        out.stderr
                    );
                }
            }
            count.by_mode[m as usize].fetch_add(1, Ordering::Relaxed);
            count.busy.store(false, Ordering::SeqCst);
        }
    });
}

/// The chain's ADD and DEL (ours, cniVersion 1.1.0, ipMasq) in a host namespace of their own,
/// quiet ("ours") against the same under each background load. A side switches its load on
/// for its own iteration and, before it returns, waits until the background round in flight
/// (a restore can take seconds) has ended, so that no load spills into another side's timing.
/// kube-proxy's restores are of `services` services.
pub fn loaded_cases<'a>(services: usize, keep: &mut Vec<TempDir>) -> (Vec<Case<'a>>, Arc<Rounds>) {
    let dir = super::chain::our_dir();
    let data = TempDir::new("bench-stl");
    let host = Arc::new(Netns::new("bstl"));
    host.run("ip", &["link", "set", "lo", "up"]);
    let mut chain = Chain::kubenet("bench-stl", "1.1.0", "cbrs", "10.233.0.0/16", data.str(), dir.path());
    chain.plugins[0]["ipMasq"] = json!(true);
    let mode = Arc::new(AtomicU8::new(QUIET));
    let count = Arc::new(Rounds::default());
    load_thread(chain.clone(), host.clone(), mode.clone(), services, count.clone());
    keep.extend([dir, data]);
    let rss: super::chain::RssTable = Default::default();
    let side = |m: u8, port: u16| -> Step<'a> {
        let mut inner = super::chain::step("stl", chain.clone(), port, rss.clone(), Some(host.clone()));
        let (mode, count) = (mode.clone(), count.clone());
        Box::new(move || {
            mode.store(m, Ordering::SeqCst);
            let v = inner();
            mode.store(QUIET, Ordering::SeqCst);
            while count.busy.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(1));
            }
            vec![v[0], v[1]]
        })
    };
    let case = Case {
        label: "full chain under STATUS / kube-proxy load".into(),
        rows: vec!["ADD (whole chain)".into(), "DEL (whole chain)".into()],
        ours: side(QUIET, 21000),
        upstream: side(HZ10, 22000),
        extra: vec![
            ("STATUS every 5 s".into(), side(CADENCE, 23000)),
            ("STATUS 10 Hz, a dry run each".into(), side(HZ10_DRY, 24000)),
            (format!("kube-proxy restores ({services} services)"), side(KUBE_PROXY, 25000)),
        ],
    };
    (vec![case], count)
}

/// Markdown for [`loaded_cases`]: each load's median against the quiet one.
pub fn loaded_markdown(rows: &[Row]) -> String {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let mut s = String::from(
        "| operation | quiet ms | load | median ms (min–max) | load / quiet |\n|---|---|---|---|---|\n",
    );
    for r in rows {
        let mut sides = vec![("STATUS at 10 Hz (certified)".to_string(), &r.upstream)];
        sides.extend(r.extra.iter().map(|(n, st)| (n.clone(), st)));
        for (name, st) in sides {
            s.push_str(&format!(
                "| {} | {:.2} | {name} | {:.2} ({:.2}–{:.2}) | **{:.3}** |\n",
                r.row,
                ms(r.ours.median),
                ms(st.median),
                ms(st.min),
                ms(st.max),
                st.median.as_secs_f64() / r.ours.median.as_secs_f64()
            ));
        }
    }
    s
}
