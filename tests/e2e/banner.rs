//! Nomad's CNI fingerprint, applied to every plugin binary of ours.
//!
//! Nomad (client/fingerprint/plugins_cni.go) runs each executable of its CNI bin dir with no
//! arguments and its own environment (no CNI_COMMAND), keeps the combined stdout and stderr of a
//! run that exits 0, splits it on whitespace (Go's `strings.Fields`) and takes the first word
//! that hashicorp/go-version's `NewSemver` accepts as the attribute
//! `plugins.cni.version.<file name>`. A job with `network { mode = "bridge" }` is placed only on a
//! node where bridge, firewall, host-local, loopback and portmap satisfy `semver >= 0.4.0`
//! (Nomad's helper/constraints/semver: go-version's `Compare`, semver 2.0 ordering, build
//! metadata ignored). This file repeats that parse and that comparison, and runs it over every
//! binary built from `plugins/` (so a plugin added later is covered without editing this list)
//! and over upstream's v1.10.0 release as the control.

use cni_tests::{bin, workspace_root};
use std::cmp::Ordering;
use std::path::Path;
use std::process::{Command, Stdio};

/// A version as go-version holds it after `NewSemver`: numeric segments (padded to three),
/// pre-release, metadata.
#[derive(Debug, Clone, PartialEq)]
struct SemVer {
    segments: Vec<i64>,
    pre: String,
    metadata: String,
}

/// Characters of go-version's identifier class `[0-9A-Za-z\-~]`.
fn ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '~'
}

/// `ident(\.ident)*` with each ident non-empty (the pre-release and metadata parts of the
/// regular expression).
fn dotted_idents(s: &str) -> bool {
    s.split('.').all(|part| !part.is_empty() && part.chars().all(ident_char))
}

/// go-version's `NewSemver`: the anchored `SemverRegexpRaw`
/// `v?([0-9]+(\.[0-9]+)*?)(-(pre))?(\+(meta))?` where pre and meta are dotted identifiers of
/// `[0-9A-Za-z\-~]` (pre-release's two alternatives — starting with a digit or not — together
/// accept exactly that), then each numeric segment through `ParseInt(…, 10, 64)`. The numeric
/// part holds neither `-` nor `+`, and the pre-release no `+`, so the first `+` and then the
/// first `-` are where the regular expression's groups split.
fn new_semver(word: &str) -> Option<SemVer> {
    let s = word.strip_prefix('v').unwrap_or(word);
    let (rest, metadata) = match s.split_once('+') {
        Some((r, m)) if dotted_idents(m) => (r, m),
        Some(_) => return None,
        None => (s, ""),
    };
    let (core, pre) = match rest.split_once('-') {
        Some((c, p)) if dotted_idents(p) => (c, p),
        Some(_) => return None,
        None => (rest, ""),
    };
    let mut segments = Vec::new();
    for seg in core.split('.') {
        if seg.is_empty() || !seg.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        segments.push(seg.parse::<i64>().ok()?);
    }
    while segments.len() < 3 {
        segments.push(0);
    }
    Some(SemVer { segments, pre: pre.to_string(), metadata: metadata.to_string() })
}

/// go-version's `comparePart` for one dot-separated part of two pre-releases.
fn compare_part(a: &str, b: &str) -> Ordering {
    if a == b {
        return Ordering::Equal;
    }
    let (an, bn) = (a.parse::<i64>().ok(), b.parse::<i64>().ok());
    if a.is_empty() {
        return if bn.is_some() { Ordering::Less } else { Ordering::Greater };
    }
    if b.is_empty() {
        return if an.is_some() { Ordering::Greater } else { Ordering::Less };
    }
    match (an, bn) {
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) if a > b => Ordering::Greater,
        (Some(x), Some(y)) if x > y => Ordering::Greater,
        _ => Ordering::Less,
    }
}

/// go-version's `Compare`: segments (a shorter list equal when the rest of the longer is
/// zeros), then pre-release (none sorts after any); metadata never counts.
fn compare(a: &SemVer, b: &SemVer) -> Ordering {
    if a.segments == b.segments {
        return match (a.pre.is_empty(), b.pre.is_empty()) {
            (true, true) => Ordering::Equal,
            (true, false) => Ordering::Greater,
            (false, true) => Ordering::Less,
            (false, false) => {
                let (x, y): (Vec<&str>, Vec<&str>) = (a.pre.split('.').collect(), b.pre.split('.').collect());
                (0..x.len().max(y.len()))
                    .map(|i| compare_part(x.get(i).copied().unwrap_or(""), y.get(i).copied().unwrap_or("")))
                    .find(|o| o.is_ne())
                    .unwrap_or(Ordering::Equal)
            }
        };
    }
    for i in 0..a.segments.len().max(b.segments.len()) {
        match (a.segments.get(i), b.segments.get(i)) {
            (None, _) => {
                return if b.segments[i..].iter().all(|s| *s == 0) { Ordering::Equal } else { Ordering::Less }
            }
            (_, None) => {
                return if a.segments[i..].iter().all(|s| *s == 0) {
                    Ordering::Equal
                } else {
                    Ordering::Greater
                }
            }
            (Some(x), Some(y)) if x != y => return x.cmp(y),
            _ => {}
        }
    }
    Ordering::Equal
}

/// Nomad's `detectOnePlugin` on one executable's combined output: the first whitespace-separated
/// word `NewSemver` accepts.
fn fingerprint(output: &str) -> Option<&str> {
    output.split_whitespace().find(|w| new_semver(w).is_some())
}

/// `semver >= 0.4.0` as Nomad's constraint checks it.
fn satisfies_nomad_minimum(word: &str) -> bool {
    let min = new_semver("0.4.0").expect("the constraint parses");
    new_semver(word).is_some_and(|v| compare(&v, &min) != Ordering::Less)
}

/// Run `exe` as Nomad does: no arguments, stdout and stderr into one file (Go's
/// `CombinedOutput`), the caller's environment without any CNI variable. Ok(output) only for an
/// exit status of 0, as Nomad keeps no version otherwise.
fn run_like_nomad(exe: &Path) -> Result<String, String> {
    let dir = cni_tests::TempDir::new("nomad-fp");
    let path = dir.join("combined");
    let file = std::fs::File::create(&path).expect("create the output file");
    let mut cmd = Command::new(exe);
    for (k, _) in std::env::vars() {
        if k.starts_with("CNI_") {
            cmd.env_remove(k);
        }
    }
    let status = cmd
        .stdin(Stdio::null())
        .stdout(file.try_clone().expect("dup"))
        .stderr(file)
        .status()
        .unwrap_or_else(|e| panic!("exec {}: {e}", exe.display()));
    let out = std::fs::read_to_string(&path).expect("read the combined output");
    if status.success() {
        Ok(out)
    } else {
        Err(format!("{} exited {status}: {out}", exe.display()))
    }
}

/// Every plugin crate of the workspace (a directory of `plugins/` with a Cargo.toml).
fn our_plugins() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(workspace_root().join("plugins"))
        .expect("read plugins/")
        .flatten()
        .filter(|e| e.path().join("Cargo.toml").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn the_parse_and_comparison_are_nomads() {
    // What go-version's NewSemver accepts and refuses, word by word.
    for ok in [
        "1.0.0",
        "v1.10.0",
        "0.4.0",
        "1.2",
        "v1.10.0+cni-rs.0.1.0",
        "1.0.0-rc.1",
        "1.0.0-beta+exp.sha.5114f85",
    ] {
        assert!(new_semver(ok).is_some(), "{ok} parses");
    }
    for bad in [
        "",
        "v",
        "1.",
        ".1",
        "1..0",
        "1.0.0-",
        "1.0.0+",
        "1.0.0+a..b",
        "(90aa8a2)",
        "0.1.0,",
        "commit)",
        "V1.0.0",
    ] {
        assert!(new_semver(bad).is_none(), "{bad:?} does not parse");
    }
    // The words the two banners' first lines start with.
    assert_eq!(
        fingerprint("CNI bridge plugin v1.10.0\nCNI protocol versions supported: 0.1.0, 1.0.0\n"),
        Some("v1.10.0")
    );
    assert_eq!(
        fingerprint("CNI bridge plugin 0.1.0 (abc)\nCNI protocol versions supported: 0.1.0"),
        Some("0.1.0")
    );
    // A banner without a version of its own still yields one: the last protocol version, the
    // only word without a trailing comma.
    assert_eq!(
        fingerprint("CNI bridge plugin version unknown\nCNI protocol versions supported: 0.1.0, 1.0.0"),
        Some("1.0.0")
    );
    assert_eq!(
        fingerprint("CNI bridge plugin version unknown\nCNI protocol versions supported: 0.1.0,"),
        None
    );
    // The constraint: our earlier banner failed it; upstream's releases and ours now pass.
    assert!(!satisfies_nomad_minimum("0.1.0"));
    assert!(!satisfies_nomad_minimum("0.3.9"));
    assert!(!satisfies_nomad_minimum("0.4.0-rc.1"), "a pre-release sorts before its release");
    assert!(satisfies_nomad_minimum("0.4.0"));
    assert!(satisfies_nomad_minimum("v1.10.0"));
    assert!(satisfies_nomad_minimum("v1.10.0+cni-rs.0.1.0"));
    assert_eq!(compare(&new_semver("1.0.0+a").unwrap(), &new_semver("1.0.0+b").unwrap()), Ordering::Equal);
    assert_eq!(compare(&new_semver("1.0").unwrap(), &new_semver("1.0.0").unwrap()), Ordering::Equal);
    assert_eq!(compare(&new_semver("1.0.0-2").unwrap(), &new_semver("1.0.0-10").unwrap()), Ordering::Less);
    assert_eq!(compare(&new_semver("1.0.0-a").unwrap(), &new_semver("1.0.0-1").unwrap()), Ordering::Greater);
}

#[test]
fn every_plugin_of_ours_passes_nomads_version_gate() {
    let plugins = our_plugins();
    for required in ["bridge", "host-local", "loopback", "portmap"] {
        assert!(plugins.iter().any(|p| p == required), "plugins/ has no {required}: {plugins:?}");
    }
    for p in &plugins {
        let out = run_like_nomad(&bin(p)).unwrap_or_else(|e| panic!("Nomad would record no version: {e}"));
        let word = fingerprint(&out).unwrap_or_else(|| panic!("{p}: no semantic version in {out:?}"));
        assert_eq!(word, cni_common::skel::BANNER_VERSION, "{p}: the first version word of {out:?}");
        assert!(satisfies_nomad_minimum(word), "{p}: {word} fails Nomad's semver >= 0.4.0");
    }
}

#[test]
fn upstreams_release_passes_the_same_gate() {
    // The control: the parse above agrees with what upstream's banners are known to give Nomad.
    let dir = upstream_release_dir();
    for p in ["bridge", "host-local", "loopback", "portmap", "firewall"] {
        let exe = Path::new(&dir).join(p);
        let out = run_like_nomad(&exe).unwrap_or_else(|e| panic!("upstream's {p}: {e}"));
        let word = fingerprint(&out).unwrap_or_else(|| panic!("upstream's {p}: no version in {out:?}"));
        assert_eq!(word, format!("v{}", cni_common::skel::UPSTREAM_RELEASE), "upstream's {p}");
        assert!(satisfies_nomad_minimum(word));
    }
}

/// The directory of upstream's release, built (once, then reused) by scripts/install-peers.sh.
fn upstream_release_dir() -> String {
    let script = workspace_root().join("scripts/install-peers.sh");
    let mut last = String::new();
    for args in [&["plugins"][..], &["--print-dir", "plugins"][..]] {
        let out = Command::new(&script)
            .args(args)
            .current_dir(workspace_root())
            .output()
            .expect("run install-peers.sh");
        assert!(
            out.status.success(),
            "scripts/install-peers.sh {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        last = String::from_utf8(out.stdout).expect("a path").trim().to_string();
    }
    last
}
