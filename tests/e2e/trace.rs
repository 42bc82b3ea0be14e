//! Trace context (issue 39): a runtime's W3C `TRACEPARENT` in the plugin environment is named
//! in the `details` of every error object and in every stderr line of our plugins, and the
//! delegated IPAM plugin gets it (and `TRACESTATE`) too; a malformed one changes nothing.
//!
//! * the binaries exec'd directly, as a runtime would;
//! * bridge with host-local exec'd (`CNI_IPAM_EXEC=1`, through a wrapper that records the
//!   delegate's environment) and in-process;
//! * libcni 1.3.1 with a span: our CRI-O replay driver (tests/go/crio-driver, on libcni v1.3.1)
//!   runs its libcni calls under a context carrying a span context (`-traceparent`), from
//!   which libcni's `injectTraceContext` (pkg/invoke/raw_exec.go) sets TRACEPARENT/TRACESTATE
//!   for every plugin it execs; the driver's own environment has none.

use cni_tests::cri::peer_dir;
use cni_tests::{bin, unique, Exec, Netns, PodNetns, TempDir};
use serde_json::{json, Value};
use std::path::Path;

/// W3C Trace Context's example.
const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const TS: &str = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7";
const PLUGINS: [&str; 8] =
    ["bridge", "host-local", "ptp", "portmap", "bandwidth", "firewall", "tuning", "loopback"];

/// host-local's warning line: `rangeStart` without `subnet` is ignored, and said so on stderr.
const HL_WARNING: &str = "ipam.rangeStart/rangeEnd/gateway are ignored without ipam.subnet";

/// Wrappers in `spy` for each of `names`: each call writes its CNI_COMMAND, TRACEPARENT and
/// TRACESTATE (`<unset>` when absent) to a file of its own in `calls`, then execs the binary.
fn install_spies(spy: &Path, calls: &Path, names: &[&str]) {
    use std::os::unix::fs::PermissionsExt;
    for n in names {
        let script = format!(
            "#!/bin/sh\nprintf '%s\\n%s\\n%s\\n' \"$CNI_COMMAND\" \"${{TRACEPARENT-<unset>}}\" \
             \"${{TRACESTATE-<unset>}}\" >\"{calls}/{n}.$$\"\nexec \"{real}\" \"$@\"\n",
            calls = calls.display(),
            real = bin(n).display()
        );
        let p = spy.join(n);
        std::fs::write(&p, script).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

/// What the spies recorded: (plugin, command, TRACEPARENT, TRACESTATE), sorted.
fn recorded(calls: &Path) -> Vec<(String, String, String, String)> {
    let mut v: Vec<_> = std::fs::read_dir(calls)
        .unwrap()
        .flatten()
        .map(|e| {
            let name = e.file_name().to_string_lossy().split('.').next().unwrap().to_string();
            let text = std::fs::read_to_string(e.path()).unwrap();
            let l: Vec<&str> = text.lines().collect();
            assert_eq!(l.len(), 3, "spy record {:?}: {text:?}", e.path());
            (name, l[0].to_string(), l[1].to_string(), l[2].to_string())
        })
        .collect();
    v.sort();
    v
}

/// Every plugin, exec'd with a bad network name (code 7, found before anything is touched):
/// the error's details gain ` (trace <id>)`; without a trace, and with every malformed value,
/// the output is byte-for-byte the same and names nothing.
#[test]
fn every_plugin_names_the_trace_in_its_error_details_and_ignores_a_malformed_one() {
    for p in PLUGINS {
        let conf = json!({"cniVersion": "1.1.0", "name": "bad name", "type": p}).to_string();
        let exec = |tp: Option<&str>| {
            let mut e = Exec::new(p).attachment("ADD", "trace-ctr", "/nonexistent", "eth0", "/nonexistent");
            if let Some(tp) = tp {
                e = e.env("TRACEPARENT", tp).env("TRACESTATE", "evil=\u{1b}[2J");
            }
            e.run(&conf)
        };
        let traced = exec(Some(TP));
        let plain = exec(None);
        assert!(traced.err(7).contains("network name"), "{p}: {}", traced.stdout);
        assert_eq!(plain.err(7), traced.err(7), "{p}");
        // the untraced details (the name), then the trace: what was there stays as it was
        let before = plain.json()["details"].as_str().unwrap_or_default().to_string();
        assert!(!before.contains("trace"), "{p}: {}", plain.stdout);
        let want = if before.is_empty() { format!("trace {ID}") } else { format!("{before} (trace {ID})") };
        assert_eq!(traced.json()["details"], want, "{p}: {}", traced.stdout);
        for bad in [
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\n\u{1b}[31mforged",
            "00-4bf92f3577b34da6a3ce929d0e0e47-00f067aa0ba902b7-01",
        ] {
            let o = exec(Some(bad));
            assert_eq!(
                (o.code, &o.stdout, &o.stderr),
                (plain.code, &plain.stdout, &plain.stderr),
                "{p} {bad:?}"
            );
        }
    }
}

/// host-local exec'd directly: its stderr line names the trace, and its error object does.
#[test]
fn host_local_stderr_lines_carry_the_trace() {
    let ns = PodNetns::new("trh");
    let dir = TempDir::new("trace-hl");
    let conf = json!({
        "cniVersion": "1.1.0", "name": unique("trn"), "type": "host-local",
        "ipam": {"type": "host-local", "dataDir": dir.path(), "rangeStart": "198.51.100.2",
                 "ranges": [[{"subnet": "198.51.100.0/30"}]]}
    });
    let run = |id: &str, tp: Option<&str>| {
        let mut e = Exec::new("host-local").attachment("ADD", id, ns.path(), "eth0", "/nonexistent");
        if let Some(tp) = tp {
            e = e.env("TRACEPARENT", tp);
        }
        e.run_json(&conf)
    };
    let plain = run("trace-a", None).success();
    assert!(plain.stderr.contains(&format!("host-local: {HL_WARNING}")), "{}", plain.stderr);
    assert!(!plain.stderr.contains("trace "), "{}", plain.stderr);
    // the /30 has one address to give: it is taken, so this ADD fails
    let full = run("trace-b", Some(TP));
    assert_ne!(full.code, 0, "{}", full.stdout);
    let details = full.json()["details"].as_str().unwrap_or_default().to_string();
    assert!(details.ends_with(&format!("trace {ID}")), "details {details:?}");
    assert!(full.stderr.contains(&format!("host-local: trace {ID}: {HL_WARNING}")), "{}", full.stderr);
    for line in full.stderr.lines() {
        assert!(line.contains(&format!("trace {ID}")), "a stderr line without the trace: {line:?}");
    }
}

struct BridgeWorld {
    host: Netns,
    pod: PodNetns,
    dir: TempDir,
    net: String,
    bridge: String,
}

impl BridgeWorld {
    fn new() -> BridgeWorld {
        let host = Netns::new("trb");
        // a forward chain that drops: bridge's ADD that makes the bridge says so on stderr
        host.run("nft", &["add", "table", "inet", "trace-fw"]);
        host.run(
            "nft",
            &[
                "add",
                "chain",
                "inet",
                "trace-fw",
                "trfwd",
                "{ type filter hook forward priority 0; policy drop; }",
            ],
        );
        let dir = TempDir::new("trace-br");
        for d in ["spy", "calls", "data"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        install_spies(&dir.join("spy"), &dir.join("calls"), &["bridge", "host-local"]);
        std::fs::create_dir_all(dir.join("bin")).unwrap();
        for n in ["bridge", "host-local"] {
            std::os::unix::fs::symlink(bin(n), dir.join("bin").join(n)).unwrap();
        }
        BridgeWorld { host, pod: PodNetns::new("trp"), dir, net: unique("trn"), bridge: unique("trbr") }
    }

    /// bridge + host-local on a /30: one address to give, and host-local's warning line.
    fn conf(&self) -> Value {
        json!({
            "cniVersion": "1.1.0", "name": self.net, "type": "bridge", "bridge": self.bridge,
            "isGateway": true,
            "ipam": {"type": "host-local", "dataDir": self.dir.join("data"), "rangeStart": "198.51.100.2",
                     "ranges": [[{"subnet": "198.51.100.0/30"}]]}
        })
    }

    fn add(&self, id: &str, cni_path: &Path, ipam_exec: &str, pod: &str) -> cni_tests::PluginOutput {
        Exec::new("bridge")
            .in_ns(&self.host)
            .attachment("ADD", id, pod, "eth0", cni_path.to_str().unwrap())
            .env("CNI_IPAM_EXEC", ipam_exec)
            .env("TRACEPARENT", TP)
            .env("TRACESTATE", TS)
            .run_json(&self.conf())
    }
}

/// bridge exec'ing host-local (`CNI_IPAM_EXEC=1`): the delegate is run with the caller's
/// TRACEPARENT and TRACESTATE (recorded by a wrapper), its stderr line and bridge's own carry
/// the trace id, and when the range is exhausted the error bridge returns names it.
#[test]
fn bridge_passes_the_trace_to_an_execd_ipam_delegate() {
    let w = BridgeWorld::new();
    let spy = w.dir.join("spy");
    let ok = w.add("trace-a", &spy, "1", w.pod.path()).success();
    assert!(ok.stderr.contains(&format!("host-local: trace {ID}: {HL_WARNING}")), "{}", ok.stderr);
    assert!(ok.stderr.contains(&format!("bridge: trace {ID}: note: ")), "{}", ok.stderr);
    for line in ok.stderr.lines() {
        assert!(line.contains(&format!("trace {ID}")), "a stderr line without the trace: {line:?}");
    }
    let want = |cmd: &str| ("host-local".to_string(), cmd.to_string(), TP.to_string(), TS.to_string());
    assert_eq!(recorded(&w.dir.join("calls")), vec![want("ADD")], "the delegate's environment");
    // the range's one address is taken: host-local's error, surfaced by bridge, names the trace
    let pod2 = PodNetns::new("trp");
    let full = w.add("trace-b", &spy, "1", pod2.path());
    assert_ne!(full.code, 0, "{}", full.stdout);
    let details = full.json()["details"].as_str().unwrap_or_default().to_string();
    assert!(details.ends_with(&format!("(trace {ID})")) || details == format!("trace {ID}"), "{details:?}");
    assert_eq!(details.matches(ID).count(), 1, "the trace once: {details:?}");
    assert!(full.stderr.contains(&format!("host-local: trace {ID}: {HL_WARNING}")), "{}", full.stderr);
    let calls = recorded(&w.dir.join("calls"));
    assert!(calls.iter().all(|c| c.2 == TP && c.3 == TS), "{calls:?}");
}

/// The same with host-local run in-process (the same build on CNI_PATH): it reads the same
/// environment, so its stderr line names the trace.
#[test]
fn bridge_with_an_in_process_ipam_delegate_keeps_the_trace() {
    let w = BridgeWorld::new();
    let ok = w.add("trace-a", &w.dir.join("bin"), "", w.pod.path()).success();
    assert!(ok.stderr.contains(&format!("host-local: trace {ID}: {HL_WARNING}")), "{}", ok.stderr);
    for line in ok.stderr.lines() {
        assert!(line.contains(&format!("trace {ID}")), "a stderr line without the trace: {line:?}");
    }
    let pod2 = PodNetns::new("trp");
    let full = w.add("trace-b", &w.dir.join("bin"), "", pod2.path());
    assert_ne!(full.code, 0, "{}", full.stdout);
    let details = full.json()["details"].as_str().unwrap_or_default().to_string();
    assert_eq!(details.matches(&format!("trace {ID}")).count(), 1, "{details:?}");
}

/// libcni 1.3.1 with a span: the crio-driver runs RunPodSandbox (ADD then CHECK of the list)
/// under a context carrying the span context `TP`/`TS`, with neither variable in its own
/// environment. Every plugin call, the exec'd IPAM delegate's included, gets both; the
/// delegate's stderr line (passed on by bridge, then by libcni) and, for a second pod that finds
/// the range exhausted, the error libcni returns name the trace id.
#[test]
fn libcni13_span_context_reaches_every_plugin_and_the_ipam_delegate() {
    let driver = peer_dir("crio-driver").join("crio-driver");
    let w = BridgeWorld::new();
    std::fs::create_dir_all(w.dir.join("conf")).unwrap();
    let list = json!({"cniVersion": "1.1.0", "name": w.net, "plugins": [w.conf()]});
    std::fs::write(w.dir.join("conf/10-trace.conflist"), list.to_string()).unwrap();
    let run = |args: &[&str]| {
        let mut cmd = w.host.command("timeout");
        cmd.args(["-k", "5", "180"]).arg(&driver);
        for (flag, d) in [("-confdir", "conf"), ("-bindir", "spy"), ("-cachedir", "cache")] {
            cmd.arg(flag).arg(w.dir.join(d));
        }
        cmd.arg("-state").arg(w.dir.join("state.json"));
        cmd.args(["-traceparent", TP, "-tracestate", TS]).args(args);
        for (k, _) in std::env::vars() {
            if k.starts_with("CNI_") || k == "TRACEPARENT" || k == "TRACESTATE" {
                cmd.env_remove(k);
            }
        }
        // the exec path, so the wrapper records the delegate's environment
        cmd.env("CNI_IPAM_EXEC", "1");
        let out = cmd.output().expect("run crio-driver");
        let events: Vec<Value> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("driver event {l:?}: {e}")))
            .collect();
        (out.status.code(), events, String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (rc, events, err) = run(&["run-pod", "trace-a", w.pod.path()]);
    assert_eq!(rc, Some(0), "events {events:?} stderr {err}");
    assert!(err.contains(&format!("host-local: trace {ID}: {HL_WARNING}")), "driver stderr: {err}");
    let calls = recorded(&w.dir.join("calls"));
    let cmds: Vec<(&str, &str)> = calls.iter().map(|c| (c.0.as_str(), c.1.as_str())).collect();
    assert!(cmds.contains(&("bridge", "ADD")) && cmds.contains(&("host-local", "ADD")), "{calls:?}");
    assert!(cmds.contains(&("bridge", "CHECK")) && cmds.contains(&("host-local", "CHECK")), "{calls:?}");
    for c in &calls {
        assert_eq!((c.2.as_str(), c.3.as_str()), (TP, TS), "call {c:?}");
    }
    // a second pod: the range is exhausted; libcni's error carries our details
    let pod2 = PodNetns::new("trp");
    let (rc, events, err) = run(&["run-pod", "trace-b", pod2.path()]);
    assert_ne!(rc, Some(0), "events {events:?} stderr {err}");
    let add = events.iter().find(|e| e["op"] == "ADD").unwrap_or_else(|| panic!("no ADD event: {events:?}"));
    assert_eq!(add["ok"], false, "{add}");
    assert!(add["error"].as_str().unwrap_or_default().contains(&format!("trace {ID}")), "{add}");
    let calls = recorded(&w.dir.join("calls"));
    assert!(calls.iter().all(|c| c.2 == TP && c.3 == TS), "{calls:?}");
}
