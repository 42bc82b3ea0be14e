//! The skeleton end to end (no root): environment, stdin and verb handling with the exact
//! error codes, through a recording mock plugin.

use cni_common::skel::{run_with, Plugin, Request};
use cni_common::spec::result::{CniResult, IpConfig};
use cni_common::{CniError, Result, Version};
use serde_json::Value;
use std::cell::RefCell;
use std::collections::HashMap;

#[derive(Default)]
struct Mock {
    calls: RefCell<Vec<String>>,
    versions: Option<&'static [Version]>,
    fail_with: Option<CniError>,
}

impl Mock {
    fn record(&self, req: &Request) -> Result<()> {
        let mut extra = String::new();
        if req.command == cni_common::spec::Command::Gc {
            let list = req.valid_attachments()?;
            extra = format!(" keep={}", list.len());
        }
        self.calls.borrow_mut().push(format!("{:?} {}{extra}", req.command, req.version));
        match &self.fail_with {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }
}

impl Plugin for Mock {
    fn name(&self) -> &'static str {
        "mock"
    }
    fn supported_versions(&self) -> &'static [Version] {
        self.versions.unwrap_or(&Version::ALL)
    }
    fn add(&self, req: &Request) -> Result<CniResult> {
        let _ = req.cni_args(&["IP"])?;
        self.record(req)?;
        Ok(CniResult {
            ips: vec![IpConfig { interface: None, address: "10.0.0.2/24".parse().unwrap(), gateway: None }],
            ..Default::default()
        })
    }
    fn del(&self, req: &Request) -> Result<()> {
        self.record(req)
    }
    fn check(&self, req: &Request) -> Result<()> {
        self.record(req)
    }
    fn gc(&self, req: &Request) -> Result<()> {
        self.record(req)
    }
    fn status(&self, req: &Request) -> Result<()> {
        self.record(req)
    }
}

struct Outcome {
    code: i32,
    stdout: String,
    stderr: String,
    calls: Vec<String>,
}

impl Outcome {
    fn json(&self) -> Value {
        // exactly one JSON document on stdout
        let mut it = serde_json::Deserializer::from_str(&self.stdout).into_iter::<Value>();
        let first = it.next().expect("one document").expect("valid JSON");
        assert!(it.next().is_none(), "more than one document: {}", self.stdout);
        first
    }
    fn err(&self) -> (u64, String) {
        assert_eq!(self.code, 1, "expected failure, stdout: {}", self.stdout);
        let v = self.json();
        (v["code"].as_u64().unwrap(), v["msg"].as_str().unwrap().to_string())
    }
}

fn base_env(cmd: &str, netns: &str) -> HashMap<String, String> {
    let mut m = HashMap::new();
    m.insert("CNI_COMMAND".into(), cmd.into());
    m.insert("CNI_CONTAINERID".into(), "ctr1".into());
    m.insert("CNI_NETNS".into(), netns.into());
    m.insert("CNI_IFNAME".into(), "eth0".into());
    m.insert("CNI_PATH".into(), "/nonexistent".into());
    m
}

fn run(plugin: &Mock, env: &HashMap<String, String>, stdin: &str) -> Outcome {
    let mut out = Vec::new();
    let mut err = Vec::new();
    let code = run_with(plugin, |k| env.get(k).cloned(), &mut stdin.as_bytes(), &mut out, &mut err);
    Outcome {
        code,
        stdout: String::from_utf8(out).unwrap(),
        stderr: String::from_utf8(err).unwrap(),
        calls: plugin.calls.borrow().clone(),
    }
}

/// A network namespace that is not ours, for ADD/CHECK. PID 1's netns is the host's; the
/// test process runs in it too unless the harness moved it, so make a fresh one instead.
fn other_netns() -> (std::thread::JoinHandle<()>, String, std::sync::mpsc::Sender<()>) {
    let (tx_path, rx_path) = std::sync::mpsc::channel();
    let (tx_stop, rx_stop) = std::sync::mpsc::channel::<()>();
    let h = std::thread::spawn(move || {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
            .expect("unshare(CLONE_NEWNET) failed: these tests need root (run as root, as CI does)");
        let tid = nix::unistd::gettid();
        tx_path.send(format!("/proc/{}/task/{}/ns/net", std::process::id(), tid)).unwrap();
        let _ = rx_stop.recv();
    });
    let p = rx_path.recv().unwrap();
    (h, p, tx_stop)
}

const CONF: &str = r#"{"cniVersion":"1.1.0","name":"net1","type":"mock"}"#;

#[test]
fn no_command_prints_about_on_stderr_only() {
    let o = run(&Mock::default(), &HashMap::new(), "");
    assert_eq!(o.code, 0);
    assert!(o.stdout.is_empty());
    assert!(o.stderr.starts_with("CNI mock plugin "), "{}", o.stderr);
    assert!(o
        .stderr
        .contains("CNI protocol versions supported: 0.1.0, 0.2.0, 0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0"));
}

#[test]
fn version_ignores_stdin_and_lists_versions() {
    let env = HashMap::from([("CNI_COMMAND".to_string(), "VERSION".to_string())]);
    let o = run(&Mock::default(), &env, "this is not json");
    assert_eq!(o.code, 0);
    let v = o.json();
    assert_eq!(v["supportedVersions"].as_array().unwrap().len(), 7);
    let limited = Mock { versions: Some(&Version::ALL[2..]), ..Default::default() };
    let v = run(&limited, &env, "").json();
    assert_eq!(v["supportedVersions"][0], "0.3.0");
}

#[test]
fn add_prints_the_result_in_the_config_version() {
    let (_h, ns, stop) = other_netns();
    for v in Version::ALL {
        let m = Mock::default();
        let conf = format!(r#"{{"cniVersion":"{v}","name":"net1","type":"mock"}}"#);
        let o = run(&m, &base_env("ADD", &ns), &conf);
        assert_eq!(o.code, 0, "{}", o.stdout);
        let doc = o.json();
        assert_eq!(doc["cniVersion"], v.as_str());
        if v.has_rich_result() {
            assert_eq!(doc["ips"][0]["address"], "10.0.0.2/24");
        } else {
            assert_eq!(doc["ip4"]["ip"], "10.0.0.2/24");
        }
        assert_eq!(o.calls, [format!("Add {v}")]);
    }
    stop.send(()).unwrap();
}

#[test]
fn missing_cni_version_means_0_1_0() {
    let (_h, ns, stop) = other_netns();
    let m = Mock::default();
    let o = run(&m, &base_env("ADD", &ns), r#"{"name":"net1","type":"mock"}"#);
    assert_eq!(o.code, 0);
    assert_eq!(o.json()["cniVersion"], "0.1.0");
    assert_eq!(o.calls, ["Add 0.1.0"]);
    stop.send(()).unwrap();
}

#[test]
fn errors_carry_the_config_version_and_exact_codes() {
    let (_h, ns, stop) = other_netns();
    /// (verb, env overrides, stdin, expected code, expected message part)
    type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, &'a str, u64, &'a str);
    let cases: Vec<Case> = vec![
        ("ADD", vec![], "not json", 6, "error unmarshall network config"),
        ("ADD", vec![], "[1,2]", 6, "error unmarshall network config"),
        ("ADD", vec![], r#"{"cniVersion":"1.1.0","type":"mock"}"#, 7, "missing network name"),
        (
            "ADD",
            vec![],
            r#"{"cniVersion":"1.1.0","name":"../x"}"#,
            7,
            "invalid characters found in network name",
        ),
        (
            "ADD",
            vec![],
            r#"{"cniVersion":"1.1.0","name":7}"#,
            6,
            "error unmarshall network config: name must be a string",
        ),
        (
            "ADD",
            vec![],
            r#"{"cniVersion":1,"name":"n"}"#,
            6,
            "error unmarshall network config: cniVersion must be a string",
        ),
        ("ADD", vec![], r#"{"cniVersion":"0.5.0","name":"n"}"#, 1, "incompatible CNI versions"),
        ("ADD", vec![], r#"{"cniVersion":"banana","name":"n"}"#, 1, "incompatible CNI versions"),
        ("ADD", vec![("CNI_CONTAINERID", "-bad")], CONF, 4, "invalid characters in containerID"),
        ("ADD", vec![("CNI_CONTAINERID", "a b")], CONF, 4, "invalid characters in containerID"),
        ("ADD", vec![("CNI_IFNAME", "averyveryverylongname")], CONF, 4, "interface name is too long"),
        ("ADD", vec![("CNI_IFNAME", "..")], CONF, 4, "interface name is . or .."),
        (
            "ADD",
            vec![("CNI_IFNAME", "a/b")],
            CONF,
            4,
            "interface name contains / or : or whitespace characters",
        ),
        ("ADD", vec![("CNI_ARGS", "IP")], CONF, 4, "ARGS: invalid pair \"IP\""),
        ("ADD", vec![("CNI_ARGS", "FOO=bar")], CONF, 4, "ARGS: unknown args"),
        (
            "ADD",
            vec![("CNI_NETNS", "/nonexistent/netns")],
            CONF,
            3,
            "CNI_NETNS \"/nonexistent/netns\" does not exist",
        ),
        (
            "ADD",
            vec![("CNI_NETNS", "/etc/hostname")],
            CONF,
            4,
            "CNI_NETNS \"/etc/hostname\" is not a network namespace",
        ),
        (
            "ADD",
            vec![("CNI_NETNS", "/proc/thread-self/ns/net")],
            CONF,
            8,
            "plugin's netns and netns from CNI_NETNS should not be the same",
        ),
        ("ADD", vec![("CNI_NETNS", "")], CONF, 4, "required env variables [CNI_NETNS] missing"),
        (
            "ADD",
            vec![],
            r#"{"cniVersion":"1.1.0","name":"n","type":"../../bin/sh"}"#,
            7,
            "contains a path separator",
        ),
        (
            "ADD",
            vec![],
            r#"{"cniVersion":"1.1.0","name":"n","ipam":"x"}"#,
            6,
            "error decoding network config: ipam",
        ),
        ("CHECK", vec![], r#"{"cniVersion":"0.3.1","name":"n"}"#, 1, "config version does not allow CHECK"),
        ("CHECK", vec![], r#"{"name":"n"}"#, 1, "config version does not allow CHECK"),
        ("CHECK", vec![], r#"{"cniVersion":"x.y","name":"n"}"#, 6, "invalid version \"x.y\""),
        ("CHECK", vec![], r#"{"cniVersion":"2.0.0","name":"n"}"#, 1, "incompatible CNI versions"),
        (
            "GC",
            vec![],
            r#"{"cniVersion":"1.0.0","name":"n","cni.dev/valid-attachments":[]}"#,
            1,
            "config version does not allow GC",
        ),
        ("GC", vec![], r#"{"cniVersion":"1.1.0","name":"n"}"#, 7, "GC needs \"cni.dev/valid-attachments\""),
        (
            "GC",
            vec![],
            r#"{"cniVersion":"1.1.0","name":"n","cni.dev/valid-attachments":[{"containerID":1}]}"#,
            6,
            "error decoding network config",
        ),
        ("STATUS", vec![], r#"{"cniVersion":"0.4.0","name":"n"}"#, 1, "config version does not allow STATUS"),
        ("ATTACH", vec![], CONF, 4, "unknown CNI_COMMAND: ATTACH"),
    ];
    for (cmd, overrides, stdin, code, msg) in cases {
        let mut env = base_env(cmd, &ns);
        for (k, v) in overrides {
            env.insert(k.into(), v.into());
        }
        let m = Mock::default();
        let o = run(&m, &env, stdin);
        let (got_code, got_msg) = o.err();
        assert_eq!(got_code, code, "{cmd} {stdin}: {got_msg}");
        assert!(got_msg.contains(msg), "{cmd} {stdin}: {got_msg:?} should contain {msg:?}");
        // the plugin never ran: bad input changes nothing
        assert!(o.calls.is_empty(), "{cmd} {stdin}: plugin was called: {:?}", o.calls);
        // errors carry a cniVersion: the config's when known, else the newest
        let v = o.json();
        let want = serde_json::from_str::<Value>(stdin)
            .ok()
            .and_then(|c| c.get("cniVersion").and_then(|v| v.as_str()).map(str::to_string))
            .filter(|s| Version::from_str_exact(s).is_some())
            .unwrap_or_else(|| {
                if stdin.starts_with('{') && !stdin.contains("cniVersion") {
                    "0.1.0".into()
                } else {
                    "1.1.0".into()
                }
            });
        assert_eq!(v["cniVersion"], want.as_str(), "{stdin}");
    }
    stop.send(()).unwrap();
}

/// A verb the config's version does not allow is refused with upstream's error object
/// exactly, no details: a Go plugin delegating CHECK to ours (v1.10's ptp to our host-local)
/// passes `err.Error()` on, message and details joined, and v1.10's own ptp suite matches it
/// against "config version does not allow CHECK" (scripts/upstream-tests.sh, ptp-ipam).
#[test]
fn a_verb_gated_by_the_config_version_is_upstreams_error_object_exactly() {
    let (_h, ns, stop) = other_netns();
    for (cmd, version, msg) in [
        ("CHECK", "0.1.0", "config version does not allow CHECK"),
        ("CHECK", "0.3.1", "config version does not allow CHECK"),
        ("GC", "1.0.0", "config version does not allow GC"),
        ("STATUS", "0.4.0", "config version does not allow STATUS"),
    ] {
        let m = Mock::default();
        let stdin = format!(r#"{{"cniVersion":"{version}","name":"n","type":"mock"}}"#);
        let o = run(&m, &base_env(cmd, &ns), &stdin);
        let want = serde_json::json!({"cniVersion": version, "code": 1, "msg": msg});
        assert_eq!(o.json(), want, "{cmd} {version}: {}", o.stdout);
        assert!(o.calls.is_empty(), "{cmd} {version}: plugin was called: {:?}", o.calls);
    }
    stop.send(()).unwrap();
}

#[test]
fn netns_override_skips_the_own_netns_check() {
    let mut env = base_env("ADD", "/proc/thread-self/ns/net");
    env.insert("CNI_NETNS_OVERRIDE".into(), "1".into());
    let m = Mock::default();
    assert_eq!(run(&m, &env, CONF).code, 0);
}

#[test]
fn del_tolerates_missing_and_empty_netns_but_not_our_own() {
    for ns in ["", "/nonexistent/netns", "/etc/hostname"] {
        let m = Mock::default();
        let o = run(&m, &base_env("DEL", ns), CONF);
        assert_eq!(o.code, 0, "{ns}: {}", o.stdout);
        assert!(o.stdout.is_empty());
        assert_eq!(o.calls, ["Del 1.1.0"]);
    }
    let m = Mock::default();
    let o = run(&m, &base_env("DEL", "/proc/thread-self/ns/net"), CONF);
    assert_eq!(o.err().0, 8);
    assert!(o.calls.is_empty(), "refused before acting");
}

#[test]
fn check_gc_status_succeed_silently() {
    let (_h, ns, stop) = other_netns();
    let m = Mock::default();
    let o = run(&m, &base_env("CHECK", &ns), r#"{"cniVersion":"0.4.0","name":"n"}"#);
    assert_eq!((o.code, o.stdout.as_str()), (0, ""));
    let env = HashMap::from([
        ("CNI_COMMAND".to_string(), "GC".to_string()),
        ("CNI_PATH".to_string(), "/x".to_string()),
    ]);
    let m = Mock::default();
    let gc = r#"{"cniVersion":"1.1.0","name":"n","cni.dev/valid-attachments":null,"cni.dev/attachments":[{"containerID":"a","ifname":"eth0"}]}"#;
    let o = run(&m, &env, gc);
    assert_eq!((o.code, o.stdout.as_str()), (0, ""));
    assert_eq!(o.calls, ["Gc 1.1.0 keep=1"]);
    let m = Mock::default();
    let o = run(&m, &env, r#"{"cniVersion":"1.1.0","name":"n","cni.dev/valid-attachments":null}"#);
    assert_eq!(o.calls, ["Gc 1.1.0 keep=0"], "null means nothing is alive");
    let mut env = env;
    env.insert("CNI_COMMAND".into(), "STATUS".into());
    let m = Mock::default();
    let o = run(&m, &env, r#"{"cniVersion":"1.1.0","name":"n"}"#);
    assert_eq!((o.code, o.stdout.as_str()), (0, ""));
    stop.send(()).unwrap();
}

#[test]
fn plugin_errors_are_printed_once_with_their_code() {
    let (_h, ns, stop) = other_netns();
    let m = Mock { fail_with: Some(CniError::new(11, "busy").with_details("retry")), ..Default::default() };
    let o = run(&m, &base_env("ADD", &ns), r#"{"cniVersion":"0.4.0","name":"n"}"#);
    assert_eq!(o.err(), (11, "busy".to_string()));
    let v = o.json();
    assert_eq!(v["cniVersion"], "0.4.0");
    assert_eq!(v["details"], "retry");
    stop.send(()).unwrap();
}

#[test]
fn unconvertible_result_is_an_error_not_a_mislabelled_document() {
    struct NoIp;
    impl Plugin for NoIp {
        fn name(&self) -> &'static str {
            "noip"
        }
        fn add(&self, _: &Request) -> Result<CniResult> {
            Ok(CniResult::default())
        }
        fn del(&self, _: &Request) -> Result<()> {
            Ok(())
        }
        fn check(&self, _: &Request) -> Result<()> {
            Ok(())
        }
        fn gc(&self, _: &Request) -> Result<()> {
            Ok(())
        }
        fn status(&self, _: &Request) -> Result<()> {
            Ok(())
        }
    }
    let (_h, ns, stop) = other_netns();
    let env = base_env("ADD", &ns);
    let mut out = Vec::new();
    let code = run_with(
        &NoIp,
        |k| env.get(k).cloned(),
        &mut r#"{"cniVersion":"0.2.0","name":"n"}"#.as_bytes(),
        &mut out,
        &mut Vec::new(),
    );
    assert_eq!(code, 1);
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["code"], 1);
    assert_eq!(v["cniVersion"], "0.2.0");
    stop.send(()).unwrap();
}

#[test]
fn stdin_beyond_the_cap_is_refused_before_anything_runs() {
    use cni_common::skel::STDIN_MAX;
    let (_h, ns, stop) = other_netns();
    // A valid configuration padded with whitespace: only the size is wrong.
    let at_cap = format!("{CONF}{}", " ".repeat(STDIN_MAX - CONF.len()));
    let m = Mock::default();
    assert_eq!(run(&m, &base_env("ADD", &ns), &at_cap).code, 0, "exactly the cap is read");
    for cmd in ["ADD", "DEL", "CHECK"] {
        let m = Mock::default();
        let o = run(&m, &base_env(cmd, &ns), &format!("{at_cap} "));
        let (code, msg) = o.err();
        assert_eq!(code, 5, "{cmd}: {msg}");
        assert!(msg.contains("more than 8388608 bytes"), "{msg}");
        assert!(o.calls.is_empty(), "{cmd}: the plugin ran");
    }
    // An endless stdin ends at the cap too.
    let m = Mock::default();
    let mut out = Vec::new();
    let env = base_env("ADD", &ns);
    let code = run_with(&m, |k| env.get(k).cloned(), &mut std::io::repeat(b' '), &mut out, &mut Vec::new());
    assert_eq!(code, 1);
    assert!(String::from_utf8(out).unwrap().contains("\"code\": 5"));
    stop.send(()).unwrap();
}

#[test]
fn a_malformed_child_deadline_is_refused_before_anything_runs() {
    let (_h, ns, stop) = other_netns();
    for bad in ["0", "soon", "-5", "1e3"] {
        let mut env = base_env("ADD", &ns);
        env.insert("CNI_CHILD_TIMEOUT_MS".into(), bad.into());
        let m = Mock::default();
        let o = run(&m, &env, CONF);
        let (code, msg) = o.err();
        assert_eq!(code, 4, "{bad}: {msg}");
        assert!(msg.contains("CNI_CHILD_TIMEOUT_MS"), "{msg}");
        assert!(o.calls.is_empty());
    }
    let mut env = base_env("ADD", &ns);
    env.insert("CNI_CHILD_TIMEOUT_MS".into(), "1500".into());
    assert_eq!(run(&Mock::default(), &env, CONF).code, 0);
    // VERSION never runs anything: the variable is not looked at.
    env.insert("CNI_COMMAND".into(), "VERSION".into());
    env.insert("CNI_CHILD_TIMEOUT_MS".into(), "soon".into());
    assert_eq!(run(&Mock::default(), &env, CONF).code, 0);
    stop.send(()).unwrap();
}

#[test]
fn gc_without_a_list_is_refused_saying_what_is_missing_why_and_how() {
    let env = HashMap::from([
        ("CNI_COMMAND".to_string(), "GC".to_string()),
        ("CNI_PATH".to_string(), "/x".to_string()),
    ]);
    let m = Mock::default();
    let o = run(&m, &env, r#"{"cniVersion":"1.1.0","name":"n","type":"x"}"#);
    assert!(o.calls.is_empty(), "refused before the plugin's GC ran: {:?}", o.calls);
    let (code, msg) = o.err();
    assert_eq!(code, 7);
    // what was missing
    assert!(msg.contains("\"cni.dev/valid-attachments\"") && msg.contains("has none"), "{msg}");
    assert!(msg.contains("\"cni.dev/attachments\""), "{msg}");
    let details = o.json()["details"].as_str().unwrap_or_default().to_string();
    // why we refuse, and that nothing changed
    assert!(details.contains("would look stale") && details.contains("nothing was changed"), "{details}");
    // how to call it: the list's shape, the empty form, and which callers send it
    assert!(details.contains("\"containerID\"") && details.contains("[]"), "{details}");
    assert!(details.contains("GCArgs") && details.contains("CNI_GC_KEEP"), "{details}");
}

#[test]
fn a_traceparent_names_its_trace_in_every_error_object_and_nothing_else_changes() {
    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    // An error of the skeleton (no details before): details are the trace alone.
    let mut env = base_env("ADD", "/nonexistent");
    env.insert("TRACEPARENT".into(), TP.into());
    env.insert("TRACESTATE".into(), "vendor=\u{1b}[31mred".into());
    let m = Mock::default();
    let traced = run(&m, &env, "{not json");
    assert_eq!(traced.err().0, 6);
    assert_eq!(traced.json()["details"], format!("trace {ID}"));
    assert!(!traced.stdout.contains("vendor") && !traced.stdout.contains('\u{1b}'), "{}", traced.stdout);
    // The same error without a trace, and with malformed ones: byte-identical, no details.
    let plain = run(&m, &base_env("ADD", "/nonexistent"), "{not json");
    assert!(plain.json().get("details").is_none(), "{}", plain.stdout);
    for bad in [
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\n\u{1b}[2Jforged",
    ] {
        env.insert("TRACEPARENT".into(), bad.into());
        let o = run(&m, &env, "{not json");
        assert_eq!(o.stdout, plain.stdout, "TRACEPARENT {bad:?}");
    }
    // A plugin's error with details keeps them, the trace appended.
    let (_h, ns, stop) = other_netns();
    let m = Mock { fail_with: Some(CniError::new(11, "busy").with_details("retry")), ..Default::default() };
    let mut env = base_env("ADD", &ns);
    env.insert("TRACEPARENT".into(), TP.into());
    let o = run(&m, &env, r#"{"cniVersion":"1.1.0","name":"n"}"#);
    assert_eq!(o.err(), (11, "busy".to_string()));
    assert_eq!(o.json()["details"], format!("retry (trace {ID})"));
    // Details that already name the trace (an IPAM delegate's error, surfaced) gain nothing.
    let m = Mock {
        fail_with: Some(CniError::new(2, "full").with_details(format!("x (trace {ID})"))),
        ..Default::default()
    };
    let o = run(&m, &env, r#"{"cniVersion":"1.1.0","name":"n"}"#);
    assert_eq!(o.json()["details"], format!("x (trace {ID})"));
    stop.send(()).unwrap();
}
