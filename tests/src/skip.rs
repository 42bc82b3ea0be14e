//! Visible skips: a test whose kernel feature is missing on this machine does not pass silently.
//!
//! `skip_unless(Feature::X)` probes the feature (in a scratch network namespace, so probing
//! changes nothing). When it is there, the test goes on. When it is not:
//! - under `CNI_TEST_REQUIRE_ALL=1`, or when `CNI_TEST_REQUIRE` (comma-separated feature names)
//!   lists it, the test fails and says which feature is missing and why;
//! - otherwise the skip is appended to the skip log (`CNI_TEST_SKIP_LOG`, default
//!   `target/cni-test-skips.log`) as one line `<feature> <test> <reason>`, printed on stderr,
//!   and the test returns. scripts/test.sh empties the log before the run and prints it after, so
//!   every skip shows at the end of the run (nextest hides the output of passing tests).
//!
//! Tests use it as `if !cni_tests::skip_unless(Feature::SctpSockets) { return; }`.
//!
//! This file is also compiled into cni-common's unit tests (`#[path]` include in
//! cni-common/src/upstream/xtables.rs), so it uses std and libc only.

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;

/// Kernel features some machines lack (/work/shared/DESIGN.md, section 5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Feature {
    /// The legacy x_tables nat table (`iptables-legacy -t nat`).
    IptablesLegacyNat,
    /// Bridge VLAN filtering (`ip link add … type bridge vlan_filtering 1`).
    BridgeVlanFiltering,
    /// SCTP sockets (`socket(AF_INET, SOCK_STREAM, IPPROTO_SCTP)`).
    SctpSockets,
    /// br_netfilter (`/proc/sys/net/bridge/bridge-nf-call-iptables`; scripts/install-deps.sh
    /// loads the module where it exists).
    BrNetfilter,
}

impl Feature {
    /// The name used in `CNI_TEST_REQUIRE` and in the skip log.
    pub fn name(self) -> &'static str {
        match self {
            Feature::IptablesLegacyNat => "iptables-legacy",
            Feature::BridgeVlanFiltering => "vlan-filtering",
            Feature::SctpSockets => "sctp",
            Feature::BrNetfilter => "br_netfilter",
        }
    }

    /// Ok when the kernel has the feature, else the reason it has not. Commands run in a new
    /// network namespace of their own (`unshare --net`), which disappears with them.
    pub fn probe(self) -> Result<(), String> {
        let in_scratch_ns = |args: &[&str]| -> Result<(), String> {
            let out = Command::new("unshare")
                .arg("--net")
                .args(args)
                .output()
                .map_err(|e| format!("cannot run unshare {args:?}: {e}"))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!("{}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
            }
        };
        match self {
            Feature::IptablesLegacyNat => in_scratch_ns(&["iptables-legacy", "-t", "nat", "-L", "-n"]),
            Feature::BridgeVlanFiltering => {
                in_scratch_ns(&["ip", "link", "add", "vbr0", "type", "bridge", "vlan_filtering", "1"])
            }
            Feature::BrNetfilter => {
                in_scratch_ns(&["test", "-e", "/proc/sys/net/bridge/bridge-nf-call-iptables"])
            }
            Feature::SctpSockets => {
                // SAFETY: plain socket(2); the descriptor is closed right away.
                let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, libc::IPPROTO_SCTP) };
                if fd < 0 {
                    return Err(format!(
                        "socket(AF_INET, SOCK_STREAM, IPPROTO_SCTP): {}",
                        std::io::Error::last_os_error()
                    ));
                }
                // SAFETY: fd is ours and open.
                unsafe { libc::close(fd) };
                Ok(())
            }
        }
    }

    /// Whether this run must fail rather than skip when the feature is missing.
    pub fn required(self) -> bool {
        if std::env::var("CNI_TEST_REQUIRE_ALL").is_ok_and(|v| v == "1") {
            return true;
        }
        std::env::var("CNI_TEST_REQUIRE").unwrap_or_default().split(',').any(|f| f.trim() == self.name())
    }
}

/// Where skips are recorded: `CNI_TEST_SKIP_LOG`, else `<target dir>/cni-test-skips.log`.
pub fn skip_log() -> PathBuf {
    if let Some(p) = std::env::var_os("CNI_TEST_SKIP_LOG").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| {
        // Both crates that include this file sit one level below the workspace root.
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").join("target")
    });
    target.join("cni-test-skips.log")
}

/// The running test: `<test binary>::<test>` (libtest names the test's thread after the test;
/// cargo names test binaries `<target>-<hash>`).
fn current_test() -> String {
    let exe = std::env::current_exe().ok();
    let stem = exe.as_deref().and_then(|p| p.file_name()).and_then(|n| n.to_str()).unwrap_or("?");
    let binary = stem.rsplit_once('-').map_or(stem, |(b, _)| b);
    format!("{binary}::{}", std::thread::current().name().unwrap_or("unknown test"))
}

/// True when `feature` is there and the test should go on. False after recording a visible
/// skip (the caller returns); panics instead when this run requires the feature.
#[must_use = "return from the test when this is false"]
pub fn skip_unless(feature: Feature) -> bool {
    match feature.probe() {
        Ok(()) => true,
        Err(why) => {
            let test = current_test();
            if feature.required() {
                panic!(
                    "{test}: kernel feature {} is missing ({why}), and this run requires it \
                     (CNI_TEST_REQUIRE_ALL / CNI_TEST_REQUIRE)",
                    feature.name()
                );
            }
            record(&test, feature.name(), &format!("kernel feature missing: {why}"));
            false
        }
    }
}

/// For a test of what happens on kernels *without* `feature` (a clean refusal): true when the
/// feature is missing and the test should go on; false after recording a visible skip when
/// the kernel has it (the test's behaviour cannot occur there; the test of the feature runs).
#[must_use = "return from the test when this is false"]
pub fn skip_if_present(feature: Feature) -> bool {
    if feature.probe().is_err() {
        return true;
    }
    let test = current_test();
    record(&test, &format!("{}-present", feature.name()), "the kernel has it: its refusal cannot occur");
    false
}

/// A test that cannot run on these machines for a reason other than a kernel feature (a daemon
/// they do not have): recorded as a visible skip like [`skip_unless`]'s; the caller returns.
pub fn skipped(what: &str, why: &str) {
    record(&current_test(), what, why);
}

/// Append `<what> <test> <why>` to the skip log and say so on stderr.
fn record(test: &str, what: &str, why: &str) {
    let line = format!("{what} {test} {}\n", why.replace('\n', " "));
    let log = skip_log();
    if let Some(dir) = log.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    // One write of one short line to a file opened with O_APPEND: lines of tests running in
    // parallel processes do not interleave.
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = written {
        panic!("{test}: skipping ({what}) but cannot record it in {}: {e}", log.display());
    }
    eprintln!("SKIPPED {test}: {what}: {why}; recorded in {}", log.display());
}
