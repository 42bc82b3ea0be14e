//! The in-process delegate machinery of `cni_common::delegate` with a plugin made for it: the
//! caller gets exactly what it would get from a child process running the same code —
//! stdout, error objects, and for a panic the skeleton's error object — and the process
//! survives a panicking delegate.
//!
//! The scenario runs in a child process of the test (the test binary re-executed with
//! [`CHILD`] set) and ends it with `exit`, as a plugin process ends: it installs the
//! skeleton's process-wide panic hook, and the threads parked by the panics keep that hook in
//! use, so the test harness could not take it back at the end.

use cni_common::delegate::{Delegate, InProcess};
use cni_common::skel::{run_with, Plugin, Request};
use cni_common::spec::env::Command;
use cni_common::{CniError, CniResult, Result};
use std::path::PathBuf;

struct Testee;

impl Plugin for Testee {
    fn name(&self) -> &'static str {
        "testee"
    }
    fn add(&self, req: &Request) -> Result<CniResult> {
        // Echo what the skeleton saw, so the test can compare environments.
        eprintln!("testee: add for {}", req.env.container_id);
        let v: serde_json::Value = serde_json::json!({
            "cniVersion": req.version.as_str(),
            "ips": [{"address": "10.9.0.5/24"}],
            "dns": {"domain": format!("{}.{}", req.env.ifname, std::env::var("TESTEE_MARK").unwrap_or_default())},
        });
        CniResult::decode(&v, req.version)
    }
    fn del(&self, _: &Request) -> Result<()> {
        Err(CniError::new(11, "try again").with_details("busy"))
    }
    fn check(&self, _: &Request) -> Result<()> {
        Ok(())
    }
    fn gc(&self, _: &Request) -> Result<()> {
        let v: Vec<u8> = Vec::new();
        let _ = v[3]; // index out of bounds: a bug
        Ok(())
    }
    fn status(&self, _: &Request) -> Result<()> {
        panic!("boom");
    }
}

static TESTEE: InProcess = InProcess { identity: b"unused", plugin: &Testee };

fn delegate() -> Delegate {
    Delegate::in_process_unchecked(PathBuf::from("/nonexistent/testee"), &TESTEE)
}

/// What the child process would print for `command`: the skeleton run directly.
fn as_child(command: &str, stdin: &[u8]) -> (i32, Vec<u8>) {
    let get = |k: &str| if k == "CNI_COMMAND" { Some(command.to_string()) } else { std::env::var(k).ok() };
    let mut out = Vec::new();
    let code = run_with(&Testee, get, &mut &stdin[..], &mut out, &mut Vec::new());
    (code, out)
}

const CONF: &[u8] = br#"{"cniVersion":"1.1.0","name":"n","type":"testee","cni.dev/valid-attachments":[]}"#;

const CHILD: &str = "IN_PROCESS_DELEGATE_SCENARIO";

#[test]
fn in_process_runs_look_like_child_processes() {
    if std::env::var_os(CHILD).is_some() {
        // A failed assertion must end the process too, never return into the harness.
        let passed = std::panic::catch_unwind(scenario).is_ok();
        std::process::exit(if passed { 0 } else { 1 });
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "in_process_runs_look_like_child_processes", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "scenario failed: {}\n{stderr}", String::from_utf8_lossy(&out.stdout));
    // What the delegates wrote to stderr reached ours: their own line, the panic lines.
    assert!(stderr.contains("testee: add for c1"), "{stderr}");
    assert!(stderr.contains("panic: boom at "), "{stderr}");
    assert!(stderr.contains("panic: index out of bounds"), "{stderr}");
}

fn scenario() {
    // SAFETY (edition 2021: safe): set before any thread of this test binary reads them.
    std::env::set_var("CNI_CONTAINERID", "c1");
    std::env::set_var("CNI_IFNAME", "eth7");
    std::env::set_var("CNI_NETNS", "/proc/self/ns/net");
    std::env::set_var("CNI_NETNS_OVERRIDE", "1");
    std::env::set_var("CNI_PATH", "/nonexistent");
    std::env::set_var("TESTEE_MARK", "m");
    // The command the caller runs with is not what the delegate sees.
    std::env::set_var("CNI_COMMAND", "VERSION");
    cni_common::skel::install_panic_hook();
    let d = delegate();
    assert!(d.in_process());

    // Success: the same stdout bytes, environment as ours with CNI_COMMAND replaced.
    let out = d.run(Command::Add, CONF).expect("ADD");
    let (code, child) = as_child("ADD", CONF);
    assert_eq!(code, 0);
    assert_eq!(out, child);
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["dns"]["domain"], "eth7.m");

    // An error object: surfaced unchanged.
    let e = d.run(Command::Del, CONF).unwrap_err();
    let (code, child) = as_child("DEL", CONF);
    assert_eq!(code, 1);
    assert_eq!(Some(e.clone()), CniError::from_json(&child));
    assert_eq!((e.code, e.msg.as_str(), e.details.as_str()), (11, "try again", "busy"));

    // Input the skeleton refuses: refused the same way.
    let bad = br#"{"cniVersion":"1.1.0","name":"n","type":"testee"}"#; // GC without the list
    let e = d.run(Command::Gc, bad).unwrap_err();
    assert_eq!(Some(e), CniError::from_json(&as_child("GC", bad).1));

    // Panics: reported as the skeleton reports a panicking process, and this process goes on.
    let e = d.run(Command::Status, CONF).unwrap_err();
    assert_eq!(e.code, 999);
    assert!(e.msg.starts_with("internal error: boom at "), "{e:?}");
    assert!(e.msg.contains("in_process_delegate.rs"), "{e:?}");
    let e = d.start(Command::Gc, CONF).unwrap().wait().unwrap_err();
    assert_eq!(e.code, 999);
    assert!(e.msg.contains("index out of bounds"), "{e:?}");

    // Still fine afterwards, also several at once.
    let runs: Vec<_> = (0..4).map(|_| d.start(Command::Check, CONF).unwrap()).collect();
    for r in runs {
        assert_eq!(r.wait().unwrap(), b"");
    }
}
