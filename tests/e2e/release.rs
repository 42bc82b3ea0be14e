//! What users install: `scripts/install.sh` (refusing, `--force`, `--restore`) in scratch
//! directories, and the panic hook of the binaries. scripts/test.sh runs this file against the
//! debug builds and again against the static `panic = "abort"` release binaries
//! (`CNI_TEST_BIN_DIR`), where the hook is the only thing that tells a runtime what happened.

use cni_tests::{bin, bin_dir, dir_state, workspace_root, Exec, PluginOutput, TempDir};
use serde_json::json;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const PLUGINS: [&str; 8] =
    ["loopback", "bridge", "host-local", "portmap", "bandwidth", "firewall", "ptp", "tuning"];

// ---- the panic hook ----

/// How to make a shipped binary panic without a test-only code path in it: take away the OS's
/// random source. std seeds every hash map's hasher from it (serde_json's maps are hash maps, so
/// reading the configuration needs it) and panics when neither getrandom(2) nor /dev/urandom
/// gives any: strace fails every getrandom call, and /dev is an empty tmpfs in a private mount
/// namespace of the plugin's own.
fn without_os_randomness<'a>(e: Exec<'a>) -> Exec<'a> {
    assert!(
        Command::new("strace").arg("-V").output().is_ok_and(|o| o.status.success()),
        "strace missing: scripts/install-deps.sh installs it"
    );
    // The script execs strace, which runs the plugin ("$0"): the harness's own exec after it is
    // never reached.
    e.in_private_mounts(
        r#"mount -t tmpfs none /dev; exec strace -f -qq -o /dev/strace.log -e inject=getrandom:error=ENOSYS "$0""#,
    )
}

/// Whether the binaries under test are the release builds (`panic = "abort"`).
fn release() -> bool {
    std::env::var_os("CNI_TEST_BIN_DIR").is_some_and(|d| !d.is_empty())
}

#[test]
fn a_panic_is_reported_as_one_cni_error_and_ends_the_process() {
    for plugin in PLUGINS {
        let conf = json!({"cniVersion": "1.0.0", "name": "n", "type": plugin});
        let out: PluginOutput = without_os_randomness(Exec::new(plugin).attachment(
            "ADD",
            "c1",
            "/run/netns/none",
            "eth0",
            "/nonexistent",
        ))
        .run(&conf.to_string());
        // err() checks: non-zero exit, exactly one JSON document on stdout, code 999.
        let msg = out.err(999);
        assert!(msg.starts_with("internal error: failed to generate random data"), "{plugin}: {msg}");
        assert!(out.stderr.contains("panic: failed to generate random data"), "{plugin}: {}", out.stderr);
        if release() {
            assert_eq!(out.code, -libc::SIGABRT, "{plugin}: a panic=abort binary ends with SIGABRT");
        } else {
            assert_eq!(out.code, 101, "{plugin}: an unwinding binary exits with 101 after a panic");
        }
    }
    // The same run with the random source in place gets past the configuration.
    let out = Exec::new("loopback")
        .attachment("ADD", "c1", "/run/netns/none", "eth0", "/x")
        .run(&json!({"cniVersion": "1.0.0", "name": "n", "type": "loopback"}).to_string());
    out.err(3);
}

// ---- scripts/install.sh ----

/// The binaries install.sh installs (`--from`): the ones under test, fresh (install.sh builds
/// release binaries itself without `--from`; that one line is not run here).
fn build_dir() -> PathBuf {
    for n in PLUGINS.iter().chain(&["cni-migrate"]) {
        bin(n); // fails when missing or older than its sources
    }
    bin_dir()
}

/// install.sh with the binaries of `from` and the systemd unit into `units` (scratch: without
/// `--unit-dir` it would go to the machine's /etc/systemd/system).
fn install(from: &Path, units: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(workspace_root().join("scripts/install.sh"))
        .arg("--from")
        .arg(from)
        .arg("--unit-dir")
        .arg(units)
        .args(args)
        .output()
        .expect("run install.sh");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A stand-in for an upstream plugin already in the directory.
fn upstream_stub(dir: &Path, name: &str) -> Vec<u8> {
    let text = format!("#!/bin/sh\necho upstream {name}\n").into_bytes();
    std::fs::write(dir.join(name), &text).unwrap();
    std::fs::set_permissions(dir.join(name), std::fs::Permissions::from_mode(0o755)).unwrap();
    text
}

fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

#[test]
fn install_refuses_then_force_keeps_the_originals_and_restore_puts_them_back() {
    let rel = build_dir();
    let d = TempDir::new("install");
    let units = TempDir::new("units");
    let unit = units.join("cni-resync.service");
    let dest = d.str();
    let lo_orig = upstream_stub(d.path(), "loopback");
    let br_orig = upstream_stub(d.path(), "bridge");
    let before = dir_state(d.path());

    // Refused without --force: nothing changes.
    let (code, _, err) = install(&rel, units.path(), &[dest]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("refusing to overwrite") && err.contains("loopback bridge"), "{err}");
    assert_eq!(dir_state(d.path()), before, "a refused install changed the directory");
    let (code, _, err) = install(&rel, units.path(), &["--bogus", dest]);
    assert_eq!(code, 2, "{err}");
    assert_eq!(dir_state(d.path()), before);

    // --force: every plugin and cni-migrate are ours, the originals kept as <name>.orig.
    let (code, out, err) = install(&rel, units.path(), &["--force", dest]);
    assert_eq!(code, 0, "{out}{err}");
    for n in PLUGINS.iter().chain(&["cni-migrate"]) {
        let p = d.join(n);
        assert_eq!(read(&p), read(&rel.join(n)), "{n} is not the release binary");
        assert_eq!(mode(&p), 0o755, "{n}");
    }
    assert_eq!(read(&d.join("loopback.orig")), lo_orig);
    assert_eq!(read(&d.join("bridge.orig")), br_orig);
    assert!(unit.is_file(), "the resync unit is installed");
    let mut names: Vec<String> = dir_state(d.path()).into_iter().map(|(n, _)| n).collect();
    names.sort();
    let mut want: Vec<String> = PLUGINS
        .iter()
        .chain(&["cni-migrate", "loopback.orig", "bridge.orig"])
        .map(|s| s.to_string())
        .collect();
    want.sort();
    assert_eq!(names, want, "nothing else (no temporary files) is left");
    // What was installed runs.
    let v = Exec::new(d.join("loopback").to_str().unwrap()).env("CNI_COMMAND", "VERSION").run("").ok();
    assert!(v["supportedVersions"].as_array().is_some_and(|a| a.contains(&json!("1.1.0"))), "{v}");

    // --force again: the originals stay the upstream ones (kept once, never overwritten by ours).
    let (code, _, err) = install(&rel, units.path(), &["--force", dest]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(read(&d.join("loopback.orig")), lo_orig);

    // --restore: the originals are back, ours stay where there was nothing to put back.
    let (code, out, err) = install(&rel, units.path(), &["--restore", dest]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(read(&d.join("loopback")), lo_orig);
    assert_eq!(read(&d.join("bridge")), br_orig);
    assert_eq!(mode(&d.join("loopback")), 0o755);
    assert!(!d.join("loopback.orig").exists() && !d.join("bridge.orig").exists());
    for n in ["host-local", "portmap", "bandwidth", "cni-migrate"] {
        assert_eq!(read(&d.join(n)), read(&rel.join(n)), "{n} kept");
    }
    assert!(out.contains("scripts/migrate.sh to-upstream"), "{out}");
    assert!(!unit.exists(), "--restore removes the resync unit");
    // Nothing left to restore: said so, exit 1, nothing changed.
    let after = dir_state(d.path());
    let (code, _, err) = install(&rel, units.path(), &["--restore", dest]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("nothing to restore"), "{err}");
    assert_eq!(dir_state(d.path()), after);
}
