//! Our loopback through our cnitool, as a user would run it: every spec version, every verb,
//! plus the cache interplay with upstream cnitool (Debian's 1.1.2, built by
//! scripts/build-upstream-cnitool.sh, which supports spec <= 1.0.0).

use cni_tests::{bin, cni_path_with, workspace_root, Netns, TempDir};
use std::path::PathBuf;
use std::process::{Command, Output};

const ALL: [&str; 7] = ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

struct World {
    host: Netns,
    plugins: TempDir,
    conf: TempDir,
    cache: TempDir,
}

impl World {
    fn new() -> World {
        World {
            host: Netns::new("cth"),
            plugins: cni_path_with(&["loopback"]),
            conf: TempDir::new("netconf"),
            cache: TempDir::new("cache"),
        }
    }

    fn write_conflist(&self, net: &str, version: &str) {
        let text =
            format!(r#"{{"cniVersion": "{version}", "name": "{net}", "plugins": [{{"type": "loopback"}}]}}"#);
        std::fs::write(self.conf.join(format!("10-{net}.conflist")), text).unwrap();
    }

    fn cnitool(&self, tool: &PathBuf, verb: &str, net: &str, ctr: &Netns) -> Output {
        let mut cmd = self.host.command(tool);
        cmd.args([verb, net, ctr.path_str()])
            .env("CNI_PATH", self.plugins.path())
            .env("NETCONFPATH", self.conf.path())
            .env("CNI_CACHE_DIR", self.cache.path())
            .env_remove("CNI_IFNAME");
        cmd.output().expect("run cnitool")
    }

    fn must(&self, tool: &PathBuf, verb: &str, net: &str, ctr: &Netns) -> String {
        let out = self.cnitool(tool, verb, net, ctr);
        assert!(
            out.status.success(),
            "{} {verb} {net}: {}{}",
            tool.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }
}

fn cache_files(dir: &TempDir) -> Vec<String> {
    std::fs::read_dir(dir.join("results"))
        .map(|rd| rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
}

#[test]
fn loopback_through_cnitool_for_every_version() {
    let w = World::new();
    let tool = bin("cnitool");
    for v in ALL {
        let net = format!("lo{}", v.replace('.', ""));
        w.write_conflist(&net, v);
        let ctr = Netns::new("ctl");
        let out = w.must(&tool, "add", &net, &ctr);
        let result: serde_json::Value = serde_json::from_str(&out).expect("add prints the result");
        assert_eq!(result["cniVersion"], v);
        assert!(ctr.link_is_up("lo"), "{v}");
        assert_eq!(cache_files(&w.cache).len(), 1, "{v}: the result is cached");
        if v >= "0.4.0" {
            w.must(&tool, "check", &net, &ctr);
        } else {
            let out = w.cnitool(&tool, "check", &net, &ctr);
            assert!(!out.status.success(), "{v}: CHECK is refused below 0.4.0");
        }
        if v == "1.1.0" {
            w.must(&tool, "status", &net, &ctr);
        }
        w.must(&tool, "del", &net, &ctr);
        assert!(!ctr.link_is_up("lo"), "{v}");
        assert!(cache_files(&w.cache).is_empty(), "{v}: DEL removes the cache entry");
        w.must(&tool, "del", &net, &ctr); // idempotent
    }
}

#[test]
fn gc_through_cnitool_deletes_cached_attachments() {
    let w = World::new();
    let tool = bin("cnitool");
    w.write_conflist("logc", "1.1.0");
    let ctr = Netns::new("ctl");
    w.must(&tool, "add", "logc", &ctr);
    assert!(ctr.link_is_up("lo"));
    // as libcni 1.3's cnitool, every cached attachment of the network is DELed first; unlike it,
    // ours then sends the plugins an explicit (empty) valid list, which they accept (libcni's
    // sends none, which they refuse: tests/e2e/libcni13.rs)
    w.must(&tool, "gc", "logc", &ctr);
    assert!(!ctr.link_is_up("lo"));
    assert!(cache_files(&w.cache).is_empty());
}

/// Build (or reuse) upstream cnitool; a failed build fails the test.
fn upstream_cnitool() -> PathBuf {
    let root = workspace_root();
    let out =
        Command::new(root.join("scripts/build-upstream-cnitool.sh")).output().expect("run build script");
    assert!(
        out.status.success(),
        "building upstream cnitool failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    root.join("target/upstream/cnitool")
}

#[test]
fn upstream_cnitool_and_ours_share_attachments() {
    // upstream cnitool has no cache-dir option: it uses /var/lib/cni, so use unique names
    let upstream = upstream_cnitool();
    let ours = bin("cnitool");
    let w = World::new();
    // every plugin call recorded, to show what libcni 1.1.2's cnitool sends
    let spy = TempDir::new("spy");
    let log = TempDir::new("calls");
    cni_tests::cri::install_recorders(spy.path(), w.plugins.path(), log.path(), &["loopback"]);
    for (adder, deleter) in [(&ours, &upstream), (&upstream, &ours)] {
        let net = cni_tests::unique("loi");
        w.write_conflist(&net, "1.0.0");
        let ctr = Netns::new("ctl");
        let run = |tool: &PathBuf, verb: &str| {
            let mut cmd = w.host.command(tool);
            cmd.args([verb, net.as_str(), ctr.path_str()])
                .env("CNI_PATH", spy.path())
                .env("NETCONFPATH", w.conf.path())
                .env("CNI_CACHE_DIR", "/var/lib/cni");
            let out = cmd.output().unwrap();
            assert!(
                out.status.success(),
                "{} {verb}: {}{}",
                tool.display(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let from = cni_tests::cri::recorded(log.path()).len();
        run(adder, "add");
        assert!(ctr.link_is_up("lo"));
        run(deleter, "check");
        run(deleter, "del");
        assert!(!ctr.link_is_up("lo"), "{} deleted what {} added", deleter.display(), adder.display());
        let leftovers: Vec<_> = std::fs::read_dir("/var/lib/cni/results")
            .map(|rd| rd.flatten().filter(|e| e.file_name().to_string_lossy().starts_with(&net)).count())
            .into_iter()
            .collect();
        assert_eq!(leftovers.iter().sum::<usize>(), 0, "cache entry removed");
        let calls = cni_tests::cri::recorded(log.path());
        let verbs: Vec<(&str, Option<i32>)> = calls[from..].iter().map(|c| (c.command(), c.rc)).collect();
        assert_eq!(verbs, [("ADD", Some(0)), ("CHECK", Some(0)), ("DEL", Some(0))], "{}", adder.display());
        let check = &calls[from + 1];
        assert_eq!(check.stdin["prevResult"]["cniVersion"], "1.0.0", "CHECK carries the cached result");
    }
}
