//! How bridge runs its IPAM delegate: in-process when the `host-local` on CNI_PATH is this very
//! build of ours, exec'd in every other case, with the same answers either way.
//!
//! Which path was taken is seen without tracing: a copy of our host-local whose ELF program
//! header table is made unloadable (e_phentsize = 0) cannot be exec'd — the kernel answers
//! ENOEXEC — but still carries our build identity, so it works only in-process; a wrapper script
//! logs each time it is exec'd; a copy with a different build id and the same damage fails
//! with ENOEXEC, proving it was exec'd.

use cni_tests::{
    assert_bridge_ns_state_returns, bin, bridge_ns_state, cni_path_with, dir_state, Exec, Netns,
    PluginOutput, TempDir,
};
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

const MAGIC: &[u8] = b"cni-rs build identity v1\0host-local\0";

/// A fake host and a dataDir.
struct World {
    host: Netns,
    data: TempDir,
}

impl World {
    fn new() -> World {
        let host = Netns::new("bih");
        host.run("ip", &["link", "set", "lo", "up"]);
        World { host, data: TempDir::new("bid") }
    }

    fn conf(&self, version: &str, name: &str, subnet: &str) -> Value {
        // One bridge per network: each gets its own gateway address.
        json!({"cniVersion": version, "name": name, "type": "bridge", "bridge": format!("b-{name}"), "isGateway": true,
               "ipam": {"type": "host-local", "dataDir": self.data.str(), "ranges": [[{"subnet": subnet}]]}})
    }

    /// bridge with `path` as CNI_PATH and `ipam_exec` as CNI_IPAM_EXEC ("" = fast path allowed,
    /// also when the test runner forces exec for the other suites).
    fn bridge<'a>(
        &'a self,
        path: &TempDir,
        cmd: &str,
        id: &str,
        ctr: Option<&Netns>,
        ipam_exec: &str,
    ) -> Exec<'a> {
        let e = Exec::new("bridge").in_ns(&self.host).env("CNI_IPAM_EXEC", ipam_exec);
        match ctr {
            Some(c) => e.attachment(cmd, id, c.path_str(), "eth0", path.str()),
            None => e.env("CNI_COMMAND", cmd).env("CNI_PATH", path.str()),
        }
    }

    fn reservations(&self, net: &str) -> Vec<String> {
        dir_state(&self.data.join(net))
            .into_iter()
            .map(|(name, _)| name)
            .filter(|n| n.starts_with(|c: char| c.is_ascii_digit()) && !n.starts_with("last_reserved"))
            .collect()
    }
}

fn with_prev(conf: &Value, prev: &Value) -> String {
    let mut c = conf.clone();
    c["prevResult"] = prev.clone();
    c.to_string()
}

fn with_gc_list(conf: &Value, keep: &[&str]) -> String {
    let mut c = conf.clone();
    let list: Vec<Value> = keep.iter().map(|id| json!({"containerID": id, "ifname": "eth0"})).collect();
    c["cni.dev/valid-attachments"] = json!(list);
    c.to_string()
}

/// A CNI_PATH holding only a `host-local` made from our binary by `edit`, with `mode`.
fn path_with_copy(edit: impl FnOnce(&mut [u8]), mode: u32) -> TempDir {
    let d = TempDir::new("bib");
    let mut img = std::fs::read(bin("host-local")).expect("read our host-local");
    edit(&mut img);
    let p = d.join("host-local");
    std::fs::write(&p, &img).expect("write copy");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).expect("chmod");
    d
}

/// Make the program header table unloadable: exec fails with ENOEXEC, the sections stay intact.
fn break_program_headers(img: &mut [u8]) {
    assert_eq!(&img[..4], b"\x7fELF");
    assert_eq!(img[4], 2, "ELF64");
    img[54..56].copy_from_slice(&[0, 0]); // e_phentsize
}

/// Change the random build id in the identity (one occurrence, in its section) and nothing else.
fn change_build_id(img: &mut [u8]) {
    let at: Vec<usize> =
        img.windows(MAGIC.len()).enumerate().filter(|(_, w)| *w == MAGIC).map(|(i, _)| i).collect();
    assert_eq!(at.len(), 1, "our host-local carries its identity exactly once");
    // magic, name, version\0, "commit=… id=…"\0: change the id's last character
    let rest = &img[at[0] + MAGIC.len()..];
    let version_end = rest.iter().position(|&b| b == 0).unwrap();
    let id_end =
        at[0] + MAGIC.len() + version_end + 1 + rest[version_end + 1..].iter().position(|&b| b == 0).unwrap();
    let c = &mut img[id_end - 1];
    *c = if *c == b'0' { b'1' } else { b'0' };
}

/// The file cannot run as a process: exec of it fails with `errno`. `ETXTBSY` is not an
/// answer about the file: another test thread of this process forked while the copy was still
/// open for writing, and its child holds that descriptor until its own exec; tried again until
/// that child has exec'd (bounded).
fn assert_exec_fails(path: &Path, errno: i32) {
    let exec = || std::process::Command::new(path).env_clear().stdin(std::process::Stdio::null()).output();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut r = exec();
    while matches!(&r, Err(e) if e.raw_os_error() == Some(libc::ETXTBSY))
        && std::time::Instant::now() < deadline
    {
        std::thread::yield_now();
        r = exec();
    }
    match r {
        Err(e) => assert_eq!(e.raw_os_error(), Some(errno), "exec {}: {e}", path.display()),
        Ok(out) => panic!("{} ran as a process: {out:?}", path.display()),
    }
}

#[test]
fn our_own_build_runs_in_process_for_every_verb() {
    let w = World::new();
    let path = path_with_copy(break_program_headers, 0o755);
    assert_exec_fails(&path.join("host-local"), libc::ENOEXEC);
    let conf = w.conf("1.1.0", "inproc", "10.41.0.0/24");
    let (c1, c2) = (Netns::new("bic"), Netns::new("bic"));

    let r1 = w.bridge(&path, "ADD", "c1", Some(&c1), "").run(&conf.to_string()).ok();
    assert_eq!(r1["ips"][0]["address"], "10.41.0.2/24", "{r1}");
    assert_eq!(w.reservations("inproc"), ["10.41.0.2"]);
    w.bridge(&path, "CHECK", "c1", Some(&c1), "").run(&with_prev(&conf, &r1)).ok_silent();
    w.bridge(&path, "STATUS", "", None, "").run(&conf.to_string()).ok_silent();
    w.bridge(&path, "ADD", "c2", Some(&c2), "").run(&conf.to_string()).ok();
    assert_eq!(w.reservations("inproc").len(), 2);
    w.bridge(&path, "GC", "", None, "").run(&with_gc_list(&conf, &["c2"])).ok_silent();
    assert_eq!(w.reservations("inproc"), ["10.41.0.3"], "GC released c1's address");
    w.bridge(&path, "DEL", "c2", Some(&c2), "").run(&conf.to_string()).ok_silent();
    assert!(w.reservations("inproc").is_empty());
    w.bridge(&path, "DEL", "c2", Some(&c2), "").run(&conf.to_string()).ok_silent();

    // The escape hatch: exec'd, the damaged copy fails, and the host is left as it was.
    let before = bridge_ns_state(&w.host);
    let store = dir_state(&w.data.join("inproc"));
    let c3 = Netns::new("bic");
    for v in ["1", "yes"] {
        let msg = w.bridge(&path, "ADD", "c3", Some(&c3), v).run(&conf.to_string()).err(999);
        assert!(msg.contains("exec ") && msg.contains("os error 8"), "CNI_IPAM_EXEC={v}: {msg}");
    }
    let msg = w.bridge(&path, "DEL", "c2", Some(&c2), "1").run(&conf.to_string()).err(999);
    assert!(msg.contains("os error 8"), "{msg}");
    assert_bridge_ns_state_returns(&w.host, &before, "failed ADD with CNI_IPAM_EXEC=1");
    assert_eq!(dir_state(&w.data.join("inproc")), store);
    // "0" does not force exec.
    w.bridge(&path, "ADD", "c3", Some(&c3), "0").run(&conf.to_string()).ok();
}

#[test]
fn a_wrapper_script_is_execd_for_every_verb_with_the_same_stdin() {
    let w = World::new();
    let path = TempDir::new("bib");
    let log = TempDir::new("bil");
    let script = format!(
        "#!/bin/sh\necho \"$CNI_COMMAND\" >> {log}/calls\ncat > {log}/stdin.$CNI_COMMAND\nexec {real} < {log}/stdin.$CNI_COMMAND\n",
        log = log.str(),
        real = bin("host-local").display()
    );
    std::fs::write(path.join("host-local"), script).unwrap();
    std::fs::set_permissions(path.join("host-local"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let conf = w.conf("1.1.0", "wrapped", "10.42.0.0/24");
    let ctr = Netns::new("bic");

    let add = conf.to_string();
    let r = w.bridge(&path, "ADD", "c1", Some(&ctr), "").run(&add).ok();
    assert_eq!(r["ips"][0]["address"], "10.42.0.2/24");
    let check = with_prev(&conf, &r);
    w.bridge(&path, "CHECK", "c1", Some(&ctr), "").run(&check).ok_silent();
    let status = conf.to_string();
    w.bridge(&path, "STATUS", "", None, "").run(&status).ok_silent();
    let gc = with_gc_list(&conf, &["c1"]);
    w.bridge(&path, "GC", "", None, "").run(&gc).ok_silent();
    let del = conf.to_string();
    w.bridge(&path, "DEL", "c1", Some(&ctr), "").run(&del).ok_silent();
    assert!(w.reservations("wrapped").is_empty());

    let calls = std::fs::read_to_string(log.join("calls")).unwrap();
    assert_eq!(calls.lines().collect::<Vec<_>>(), ["ADD", "CHECK", "STATUS", "GC", "DEL"]);
    for (verb, sent) in [("ADD", add), ("CHECK", check), ("STATUS", status), ("GC", gc), ("DEL", del)] {
        let got = std::fs::read(log.join(format!("stdin.{verb}"))).unwrap();
        assert_eq!(got, sent.as_bytes(), "{verb}: the delegate gets bridge's stdin unchanged");
    }
}

#[test]
fn other_builds_and_files_we_may_not_run_are_execd() {
    let w = World::new();
    let conf = w.conf("1.0.0", "others", "10.43.0.0/24");
    let ctr = Netns::new("bic");

    let before = bridge_ns_state(&w.host);
    // Our code with another build id and unloadable program headers: exec'd, hence ENOEXEC
    // (in-process it would have worked).
    let damaged = path_with_copy(
        |img| {
            change_build_id(img);
            break_program_headers(img);
        },
        0o755,
    );
    let msg = w.bridge(&damaged, "ADD", "c1", Some(&ctr), "").run(&conf.to_string()).err(999);
    assert!(msg.contains("os error 8"), "{msg}");
    // This very build, but not executable: exec'd as before, refused by the kernel.
    let noexec = path_with_copy(|_| {}, 0o644);
    assert_exec_fails(&noexec.join("host-local"), libc::EACCES);
    let msg = w.bridge(&noexec, "ADD", "c1", Some(&ctr), "").run(&conf.to_string()).err(999);
    assert!(msg.contains("Permission denied"), "{msg}");
    assert_bridge_ns_state_returns(&w.host, &before, "failed ADDs leave the host as it was");

    // Another build id, intact: exec'd, works.
    let other = path_with_copy(change_build_id, 0o755);
    let r = w.bridge(&other, "ADD", "c1", Some(&ctr), "").run(&conf.to_string()).ok();
    w.bridge(&other, "CHECK", "c1", Some(&ctr), "").run(&with_prev(&conf, &r)).ok_silent();
    w.bridge(&other, "DEL", "c1", Some(&ctr), "").run(&conf.to_string()).ok_silent();
    assert!(w.reservations("others").is_empty());

    // Upstream's host-local (Go, spec <= 1.0.0): exec'd, works, its own store.
    let upstream = Path::new("/usr/lib/cni/host-local");
    assert!(upstream.is_file(), "upstream plugins missing: apt-get install containernetworking-plugins");
    let up = TempDir::new("bib");
    std::os::unix::fs::symlink(upstream, up.join("host-local")).unwrap();
    let r = w.bridge(&up, "ADD", "c2", Some(&ctr), "").run(&conf.to_string()).ok();
    let addr = r["ips"][0]["address"].as_str().unwrap().split('/').next().unwrap().to_string();
    assert_eq!(w.reservations("others"), [addr]);
    w.bridge(&up, "CHECK", "c2", Some(&ctr), "").run(&with_prev(&conf, &r)).ok_silent();
    w.bridge(&up, "DEL", "c2", Some(&ctr), "").run(&conf.to_string()).ok_silent();
    assert!(w.reservations("others").is_empty());
}

/// Run the same request in-process and exec'd: the same code and the same stdout.
fn both_ways(run: impl Fn(&str) -> PluginOutput) -> PluginOutput {
    let a = run("");
    let b = run("1");
    assert_eq!(
        (a.code, &a.stdout),
        (b.code, &b.stdout),
        "in-process vs exec'd; stderr {} / {}",
        a.stderr,
        b.stderr
    );
    a
}

#[test]
fn in_process_and_exec_give_identical_answers() {
    let w = World::new();
    let path = cni_path_with(&["host-local"]); // a symlink to this very build: in-process
    let ctr = Netns::new("bic");
    let tiny = w.conf("1.1.0", "tiny", "10.44.0.0/30");

    // An address asked for: the same result (but for the random veth name and MACs).
    let mut asked = w.conf("1.1.0", "same", "10.45.0.0/24");
    asked["args"] = json!({"cni": {"ips": ["10.45.0.9"]}});
    let mut results = Vec::new();
    for v in ["", "1"] {
        let r = w.bridge(&path, "ADD", "c1", Some(&ctr), v).run(&asked.to_string()).ok();
        w.bridge(&path, "CHECK", "c1", Some(&ctr), if v.is_empty() { "1" } else { "" })
            .run(&with_prev(&asked, &r))
            .ok_silent();
        // released by the other path
        w.bridge(&path, "DEL", "c1", Some(&ctr), if v.is_empty() { "1" } else { "" })
            .run(&asked.to_string())
            .ok_silent();
        assert!(w.reservations("same").is_empty());
        results.push(r);
    }
    for k in ["cniVersion", "ips", "routes", "dns"] {
        assert_eq!(results[0][k], results[1][k], "{k}");
    }
    assert_eq!(results[0]["ips"][0]["address"], "10.45.0.9/24");

    // Errors of the delegate, and the host left as it was after each failed ADD.
    w.bridge(&path, "ADD", "t1", Some(&ctr), "").run(&tiny.to_string()).ok();
    let before = bridge_ns_state(&w.host);
    let t2 = Netns::new("bic");
    let full = both_ways(|v| w.bridge(&path, "ADD", "t2", Some(&t2), v).run(&tiny.to_string()));
    assert!(full.err(999).contains("no IP addresses available"), "{}", full.stdout);
    // exhaustion is ADD's to report; STATUS says so only when asked (host-local's README)
    both_ways(|v| w.bridge(&path, "STATUS", "", None, v).run(&tiny.to_string())).ok_silent();
    let mut asked = tiny.clone();
    asked["ipam"]["reportExhaustionInStatus"] = json!(true);
    both_ways(|v| w.bridge(&path, "STATUS", "", None, v).run(&asked.to_string())).err(50);
    let mut outside = tiny.clone();
    outside["args"] = json!({"cni": {"ips": ["10.99.0.5"]}});
    both_ways(|v| w.bridge(&path, "ADD", "t2", Some(&t2), v).run(&outside.to_string())).err(7);
    outside["args"] = json!({"cni": {"ips": ["nope"]}});
    both_ways(|v| w.bridge(&path, "ADD", "t2", Some(&t2), v).run(&outside.to_string())).err(6);
    let mut bad = tiny.clone();
    bad["ipam"]["ranges"] = json!("nope");
    both_ways(|v| w.bridge(&path, "ADD", "t2", Some(&t2), v).run(&bad.to_string())).err(6);
    assert_bridge_ns_state_returns(&w.host, &before, "failed ADDs, both ways");
    assert_eq!(w.reservations("tiny"), ["10.44.0.2"]);

    // CHECK that only the delegate fails: its reservation vanished behind its back.
    let mut again = tiny.clone();
    again["name"] = json!("tiny2");
    let ctr2 = Netns::new("bic");
    let r = w.bridge(&path, "ADD", "k1", Some(&ctr2), "").run(&again.to_string()).ok();
    std::fs::remove_file(w.data.join("tiny2").join("10.44.0.2")).unwrap();
    let out = both_ways(|v| w.bridge(&path, "CHECK", "k1", Some(&ctr2), v).run(&with_prev(&again, &r)));
    assert!(out.err(999).contains("Failed to find address"), "{}", out.stdout);
    // GC and DEL, both ways, succeed alike.
    both_ways(|v| w.bridge(&path, "GC", "", None, v).run(&with_gc_list(&tiny, &[]))).ok_silent();
    assert!(w.reservations("tiny").is_empty());
    both_ways(|v| w.bridge(&path, "DEL", "k1", Some(&ctr2), v).run(&again.to_string())).ok_silent();
}
