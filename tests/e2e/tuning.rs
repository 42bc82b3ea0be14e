//! tuning end to end, in scratch namespaces: chained after our ptp (Podman's and nerdctl's
//! default conflists end with tuning), every key applied and read back from the kernel, DEL
//! putting the link back; upstream v1.10's tuning and ours restoring each other's saved
//! settings; bad input (right code, container unchanged, nothing saved); SIGKILL during ADD,
//! then DEL restores; GC and STATUS. Issue 37.4: DEL succeeds, once, whatever is at the saved
//! name, whatever link now has the ifname and whatever value the kernel refuses, so a chain's
//! DEL still reaches bridge and host-local; ids with `_` no longer share a file.

use cni_tests::chain::Chain;
use cni_tests::{cni_path_with, ns_state, reservations, unique, workspace_root, Exec, Netns, TempDir};
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};

/// The directory of upstream's release, built (once, then reused) by scripts/install-peers.sh.
fn upstream_release_dir() -> String {
    let script = workspace_root().join("scripts/install-peers.sh");
    let mut last = String::new();
    for args in [&["plugins"][..], &["--print-dir", "plugins"][..]] {
        let out = std::process::Command::new(&script)
            .args(args)
            .current_dir(workspace_root())
            .output()
            .expect("run");
        assert!(
            out.status.success(),
            "scripts/install-peers.sh {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        last = String::from_utf8(out.stdout).expect("a path").trim().to_string();
    }
    last
}

/// A pod namespace with `eth0` (one end of a veth pair whose other end stays in the pod) and
/// the prevResult a main plugin would have given for it.
fn pod() -> (Netns, Value) {
    let ns = Netns::new("tnc");
    ns.run("ip", &["link", "set", "lo", "up"]);
    ns.run("ip", &["link", "add", "eth0", "type", "veth", "peer", "name", "peer0"]);
    ns.run("ip", &["link", "set", "eth0", "up"]);
    let mac = ns.link("eth0").unwrap()["address"].as_str().unwrap().to_string();
    let prev = json!({"cniVersion": "1.1.0", "interfaces": [{"name": "eth0", "mac": mac, "sandbox": ns.path_str()}],
                      "ips": [{"address": "10.9.0.5/24", "interface": 0}]});
    (ns, prev)
}

/// What tuning may change on `eth0`, as the kernel lists it.
fn link_state(ns: &Netns) -> Value {
    link_state_of(ns, "eth0")
}

/// What tuning may change on link `name`, with its index and kind.
fn link_state_of(ns: &Netns, name: &str) -> Value {
    let l = ns.link(name).unwrap_or_else(|| panic!("no link {name}"));
    json!({"mtu": l["mtu"], "address": l["address"], "txqlen": l["txqlen"], "promiscuity": l["promiscuity"],
           "allmulti": l["flags"].as_array().unwrap().iter().any(|f| f == "ALLMULTI")})
}

fn sysctl(ns: &Netns, key: &str) -> String {
    String::from_utf8(ns.run("sysctl", &["-n", key]).stdout).unwrap().trim().to_string()
}

fn conf(data: &TempDir, prev: &Value, extra: Value) -> String {
    let mut c = json!({"cniVersion": "1.1.0", "name": "tunenet", "type": "tuning", "dataDir": data.str(),
                       "prevResult": prev});
    for (k, v) in extra.as_object().into_iter().flatten() {
        c[k] = v.clone();
    }
    c.to_string()
}

fn every_key() -> Value {
    json!({"sysctl": {"net.ipv4.conf.IFNAME.arp_filter": "1", "net.core.somaxconn": "512"},
           "mac": "02:aa:bb:cc:dd:01", "mtu": 1280, "promisc": true, "allmulti": true, "txQLen": 77})
}

fn exec<'a>(plugin: &str, cmd: &str, id: &str, ns: &Netns, host: &'a Netns) -> Exec<'a> {
    Exec::new(plugin).in_ns(host).attachment(cmd, id, ns.path_str(), "eth0", "/nonexistent")
}

fn host() -> Netns {
    let h = Netns::new("tnh");
    h.run("ip", &["link", "set", "lo", "up"]);
    h
}

#[test]
fn after_our_ptp_every_key_is_applied_checked_and_put_back() {
    let host = host();
    let data = TempDir::new("tundata");
    let ipam = TempDir::new("tunipam");
    let bins = cni_path_with(&["ptp", "host-local", "tuning"]);
    let pod = Netns::new("tnc");
    pod.run("ip", &["link", "set", "lo", "up"]);
    let id = unique("tun");
    let ptp_conf = json!({"cniVersion": "1.1.0", "name": "tunenet", "type": "ptp",
                          "ipam": {"type": "host-local", "subnet": "10.77.0.0/24", "dataDir": ipam.str()}})
    .to_string();
    let run = |plugin: &str, cmd: &str, stdin: &str| {
        Exec::new(bins.join(plugin).to_str().unwrap())
            .in_ns(&host)
            .attachment(cmd, &id, pod.path_str(), "eth0", bins.str())
            .run(stdin)
    };
    let prev = run("ptp", "ADD", &ptp_conf).ok();
    let before = link_state(&pod);
    let arp_before = sysctl(&pod, "net.ipv4.conf.eth0.arp_filter");
    let tconf = conf(&data, &prev, every_key());
    let r = run("tuning", "ADD", &tconf).ok();
    assert_eq!(r["interfaces"][1]["mac"], "02:aa:bb:cc:dd:01", "the result has the new MAC: {r}");
    assert_eq!(r["ips"], prev["ips"]);
    assert_eq!(
        link_state(&pod),
        json!({"mtu": 1280, "address": "02:aa:bb:cc:dd:01", "txqlen": 77, "promiscuity": 1, "allmulti": true})
    );
    assert_eq!(sysctl(&pod, "net.ipv4.conf.eth0.arp_filter"), "1");
    assert_eq!(sysctl(&pod, "net.core.somaxconn"), "512");
    // The host still reaches the pod (its new MAC is what the pod answers ARP with).
    let pod_ip = prev["ips"][0]["address"].as_str().unwrap().split('/').next().unwrap().to_string();
    host.run("ping", &["-c1", "-W5", &pod_ip]);
    // Saved in upstream's place and format.
    let saved: Value =
        serde_json::from_slice(&std::fs::read(data.join(format!("{id}_eth0.json"))).unwrap()).unwrap();
    assert_eq!(saved["mtu"], before["mtu"]);
    assert_eq!(saved["mac"], before["address"]);
    assert_eq!(saved["txQLen"], before["txqlen"]);
    assert_eq!((saved["promisc"].clone(), saved["allmulti"].clone()), (json!(false), json!(false)));
    run("tuning", "CHECK", &conf(&data, &r, every_key())).ok_silent();
    pod.run("ip", &["link", "set", "eth0", "mtu", "1300"]);
    let msg = run("tuning", "CHECK", &conf(&data, &r, every_key())).err(999);
    assert!(msg.contains("MTU"), "{msg}");
    run("tuning", "DEL", &tconf).ok_silent();
    assert_eq!(link_state(&pod), before, "DEL put the link back");
    assert_eq!(sysctl(&pod, "net.ipv4.conf.eth0.arp_filter"), "1", "sysctls stay, as upstream");
    assert_ne!(arp_before, "1");
    assert!(std::fs::read_dir(data.path()).unwrap().next().is_none(), "the saved file is gone");
    run("tuning", "DEL", &tconf).ok_silent();
    run("ptp", "DEL", &ptp_conf).ok_silent();
}

/// Upstream's tuning and ours read each other's saved settings: ADD by one, DEL by the other
/// puts the link back and removes the file.
#[test]
fn either_build_restores_what_the_other_saved() {
    let host = host();
    let upstream = Path::new(&upstream_release_dir()).join("tuning");
    let upstream = upstream.to_str().unwrap();
    let ours = cni_tests::bin("tuning");
    let ours = ours.to_str().unwrap();
    let link_keys =
        json!({"mac": "02:aa:bb:cc:dd:02", "mtu": 1300, "promisc": true, "allmulti": true, "txQLen": 33});
    for (maker, deleter) in [(upstream, ours), (ours, upstream)] {
        let data = TempDir::new("tunswap");
        let (ns, prev) = pod();
        let before = link_state(&ns);
        let id = unique("tsw");
        let c = conf(&data, &prev, link_keys.clone());
        exec(maker, "ADD", &id, &ns, &host).run(&c).ok();
        assert_eq!(link_state(&ns)["mtu"], 1300, "{maker}");
        exec(ours, "CHECK", &id, &ns, &host).run(&c).ok_silent();
        exec(deleter, "DEL", &id, &ns, &host).run(&c).ok_silent();
        assert_eq!(link_state(&ns), before, "{maker}'s ADD, {deleter}'s DEL");
        assert!(std::fs::read_dir(data.path()).unwrap().next().is_none(), "{deleter} removed {maker}'s file");
    }
}

/// Bad input: the right code; the container, the host and the data directory unchanged.
#[test]
fn bad_input_gets_the_right_code_and_changes_nothing() {
    let host = host();
    let data = TempDir::new("tunbad");
    let (ns, prev) = pod();
    let id = unique("tbad");
    let cases: Vec<(String, u64, &str)> = vec![
        (conf(&data, &prev, json!({"sysctl": {"kernel.panic": "1"}})), 7, "kernel.panic"),
        (conf(&data, &prev, json!({"sysctl": {"net/../kernel/panic": "1"}})), 7, "net sysctl key"),
        (conf(&data, &prev, json!({"sysctl": {"net.ipv4..ip_forward": "1"}})), 7, "net sysctl key"),
        (conf(&data, &prev, json!({"sysctl": {"net.core.somaxconn": 5}})), 6, "somaxconn"),
        (conf(&data, &prev, json!({"mtu": "1500"})), 6, "mtu"),
        (conf(&data, &prev, json!({"mtu": 20})), 7, "mtu"),
        (conf(&data, &prev, json!({"mac": "02:00:zz:00:00:01"})), 7, "MAC"),
        (conf(&data, &prev, json!({"txQLen": -4})), 7, "txQLen"),
        (conf(&data, &prev, json!({"sysctl": {"net.nonexistent.key": "1"}, "mtu": 1300})), 5, "nonexistent"),
        (json!({"cniVersion": "1.1.0", "name": "tunenet", "type": "tuning", "dataDir": data.str(), "mtu": 1300}).to_string(), 7, "prevResult"),
        (
            format!(
                r#"{{"cniVersion": "1.1.0", "name": "tunenet", "type": "tuning", "dataDir": {:?}, "prevResult": {prev},
                    "sysctl": {{"net.core.somaxconn": "1", "net.core.somaxconn": "2"}}}}"#,
                data.str()
            ),
            6,
            "duplicated",
        ),
    ];
    let (ns_before, host_before) = (ns_state(&ns), ns_state(&host));
    let somax = sysctl(&ns, "net.core.somaxconn");
    for (c, code, part) in &cases {
        let msg = exec(cni_tests::bin("tuning").to_str().unwrap(), "ADD", &id, &ns, &host).run(c).err(*code);
        assert!(msg.contains(part), "{c}: {msg}");
    }
    // CNI_ARGS with a key tuning does not know (and no IgnoreUnknown): code 4.
    exec(cni_tests::bin("tuning").to_str().unwrap(), "ADD", &id, &ns, &host)
        .env("CNI_ARGS", "FOO=bar")
        .run(&conf(&data, &prev, json!({"mtu": 1300})))
        .err(4);
    assert_eq!(ns_state(&ns), ns_before, "the container is unchanged");
    assert_eq!(ns_state(&host), host_before, "the host is unchanged");
    assert_eq!(sysctl(&ns, "net.core.somaxconn"), somax);
    assert!(
        !data.path().exists() || std::fs::read_dir(data.path()).unwrap().next().is_none(),
        "nothing saved"
    );
}

/// SIGKILL during ADD at any moment, then DEL: the link is as it was and nothing is saved.
#[test]
fn sigkill_during_add_then_del_puts_the_link_back() {
    let host = host();
    let bin = cni_tests::bin("tuning");
    let bin = bin.to_str().unwrap();
    let link_keys =
        json!({"mac": "02:aa:bb:cc:dd:03", "mtu": 1300, "promisc": true, "allmulti": true, "txQLen": 9});
    let mut typical = Vec::new();
    for _ in 0..3 {
        let data = TempDir::new("tuncr");
        let (ns, prev) = pod();
        let id = unique("tcr");
        let c = conf(&data, &prev, link_keys.clone());
        let t = Instant::now();
        exec(bin, "ADD", &id, &ns, &host).run(&c).ok();
        typical.push(t.elapsed());
        exec(bin, "DEL", &id, &ns, &host).run(&c).ok_silent();
    }
    typical.sort();
    let span = typical[1].as_micros() as u64 * 12 / 10 + 1;
    let mut seed =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1;
    eprintln!("tuning crash: 16 trials, seed {seed}");
    for trial in 0..16 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let delay = Duration::from_micros(seed % span);
        let data = TempDir::new("tuncr");
        let (ns, prev) = pod();
        let before = link_state(&ns);
        let id = unique("tcr");
        let c = conf(&data, &prev, link_keys.clone());
        let mut child = exec(bin, "ADD", &id, &ns, &host).spawn(&c);
        let t = Instant::now();
        while t.elapsed() < delay {
            std::hint::spin_loop();
        }
        let _ = child.kill();
        let _ = child.wait();
        exec(bin, "DEL", &id, &ns, &host).run(&c).ok_silent();
        assert_eq!(link_state(&ns), before, "trial {trial}: killed after {delay:?} (seed {seed})");
        let left: Vec<_> = std::fs::read_dir(data.path())
            .map(|d| d.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "trial {trial}: {left:?} left (a killed ADD's temporary file included)");
    }
}

#[test]
fn gc_removes_dead_attachments_files_of_this_network_and_status_judges_the_config() {
    let host = host();
    let data = TempDir::new("tungc");
    let bin = cni_tests::bin("tuning");
    let bin = bin.to_str().unwrap();
    let (a, pa) = pod();
    let (b, pb) = pod();
    let (ida, idb) = (unique("tga"), unique("tgb"));
    exec(bin, "ADD", &ida, &a, &host).run(&conf(&data, &pa, json!({"mtu": 1300}))).ok();
    exec(bin, "ADD", &idb, &b, &host).run(&conf(&data, &pb, json!({"mtu": 1300}))).ok();
    // A file of upstream's (no network in it) is left alone.
    std::fs::write(data.join("someone_eth0.json"), br#"{"mtu": 1500}"#).unwrap();
    let mut gc: Value = serde_json::from_str(&conf(&data, &pa, json!({}))).unwrap();
    gc.as_object_mut().unwrap().remove("prevResult");
    gc["cni.dev/valid-attachments"] = json!([{"containerID": ida, "ifname": "eth0"}]);
    let verb =
        |cmd: &str| Exec::new(bin).in_ns(&host).env("CNI_COMMAND", cmd).env("CNI_PATH", "/nonexistent");
    verb("GC").run(&gc.to_string()).ok_silent();
    let mut left: Vec<String> = std::fs::read_dir(data.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    let mut want = vec![format!("{ida}_eth0.json"), "someone_eth0.json".to_string()];
    want.sort();
    assert_eq!(left, want);
    let status = json!({"cniVersion": "1.1.0", "name": "tunenet", "type": "tuning", "sysctl": {"net.core.somaxconn": "9"}});
    verb("STATUS").run(&status.to_string()).ok_silent();
    let bad =
        json!({"cniVersion": "1.1.0", "name": "tunenet", "type": "tuning", "sysctl": {"vm.swappiness": "9"}});
    verb("STATUS").run(&bad.to_string()).err(7);
}

/// Every spec version: prevResult of that version passed through with the new MAC, DEL puts
/// the link back.
#[test]
fn every_spec_version() {
    let host = host();
    let bin = cni_tests::bin("tuning");
    let bin = bin.to_str().unwrap();
    for v in ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        let data = TempDir::new("tunver");
        let (ns, _) = pod();
        let before = link_state(&ns);
        let prev = if v.starts_with("0.1") || v.starts_with("0.2") {
            json!({"cniVersion": v, "ip4": {"ip": "10.9.0.5/24"}})
        } else {
            json!({"cniVersion": v, "interfaces": [{"name": "eth0", "sandbox": ns.path_str()}],
                   "ips": [{"version": "4", "address": "10.9.0.5/24", "interface": 0}]})
        };
        let mut c: Value =
            serde_json::from_str(&conf(&data, &prev, json!({"mac": "02:aa:bb:cc:dd:09", "mtu": 1300})))
                .unwrap();
        c["cniVersion"] = json!(v);
        let id = unique("tver");
        let r = exec(bin, "ADD", &id, &ns, &host).run(&c.to_string()).ok();
        assert_eq!(r["cniVersion"], v);
        if r.get("interfaces").is_some() {
            assert_eq!(r["interfaces"][0]["mac"], "02:aa:bb:cc:dd:09", "{v}: {r}");
        } else {
            assert_eq!(r["ip4"]["ip"], "10.9.0.5/24", "{v}: {r}");
        }
        assert_eq!(link_state(&ns)["mtu"], 1300, "{v}");
        exec(bin, "DEL", &id, &ns, &host).run(&c.to_string()).ok_silent();
        assert_eq!(link_state(&ns), before, "{v}");
    }
}

/// inotify on a directory: the names in it that anything opened or read since the watch began.
struct Opens(std::os::fd::OwnedFd);

impl Opens {
    fn watch(dir: &Path) -> Opens {
        use std::os::fd::{AsRawFd, FromRawFd};
        // SAFETY: plain inotify_init1; the descriptor is owned right away.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        assert!(fd >= 0, "inotify_init1: {}", std::io::Error::last_os_error());
        // SAFETY: fd is a fresh descriptor nobody else owns.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        let c = std::ffi::CString::new(dir.to_str().unwrap()).unwrap();
        // SAFETY: a valid inotify descriptor and a NUL-terminated path.
        let wd =
            unsafe { libc::inotify_add_watch(fd.as_raw_fd(), c.as_ptr(), libc::IN_OPEN | libc::IN_ACCESS) };
        assert!(wd >= 0, "inotify_add_watch {}: {}", dir.display(), std::io::Error::last_os_error());
        Opens(fd)
    }

    /// The names of entries opened or read (the directory's own opens have no name).
    fn names(&self) -> Vec<String> {
        use std::os::fd::AsRawFd;
        let mut out = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            // SAFETY: buf is writable for its length.
            let n = unsafe { libc::read(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                return out;
            }
            let mut at = 0;
            while at + 16 <= n as usize {
                // struct inotify_event: wd, mask, cookie, len, then len bytes of NUL-padded name
                let len = u32::from_ne_bytes(buf[at + 12..at + 16].try_into().unwrap()) as usize;
                let name = &buf[at + 16..at + 16 + len];
                let name = String::from_utf8_lossy(name.split(|b| *b == 0).next().unwrap_or_default());
                if !name.is_empty() {
                    out.push(name.into_owned());
                }
                at += 16 + len;
            }
        }
    }
}

/// Our tuning on the attachment (`id`, `ifname`), run in `host`.
fn ours<'a>(cmd: &str, id: &str, ns: &Netns, ifname: &str, host: &'a Netns) -> Exec<'a> {
    let bin = cni_tests::bin("tuning");
    Exec::new(bin.to_str().unwrap()).in_ns(host).attachment(cmd, id, ns.path_str(), ifname, "/nonexistent")
}

/// A DEL that might block (a FIFO where it expects a file) gets this long before the test
/// fails; a DEL takes milliseconds.
const PROMPT: Duration = Duration::from_secs(20);

/// The keys every issue-37.4 test tunes.
fn link_keys() -> Value {
    json!({"mac": "02:aa:bb:cc:dd:37", "mtu": 1300, "promisc": true, "allmulti": true, "txQLen": 37})
}

/// Issue 37.4 (a, b): a FIFO, or a symbolic link, at the saved name (upstream's DEL fails on
/// both, for ever): DEL succeeds promptly and removes it without opening it, the link's target
/// is neither opened nor changed, and the link is not touched.
#[test]
fn a_fifo_or_a_link_at_the_saved_name_is_removed_unopened_and_del_succeeds() {
    let host = host();
    let elsewhere = TempDir::new("tunelse");
    let target = elsewhere.join("target.json");
    let planted = br#"{"mtu": 9000, "mac": "02:00:00:00:00:66"}"#;
    std::fs::write(&target, planted).unwrap();
    for kind in ["fifo", "symlink"] {
        let data = TempDir::new("tunfifo");
        let (ns, prev) = pod();
        let id = unique("tff");
        let c = conf(&data, &prev, link_keys());
        let name = data.join(format!("{id}_eth0.json"));
        ours("ADD", &id, &ns, "eth0", &host).run(&c).ok();
        std::fs::remove_file(&name).unwrap();
        match kind {
            "fifo" => nix::unistd::mkfifo(&name, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap(),
            _ => std::os::unix::fs::symlink(&target, &name).unwrap(),
        }
        let tuned = link_state(&ns);
        let (opens, target_opens) = (Opens::watch(data.path()), Opens::watch(elsewhere.path()));
        let out = ours("DEL", &id, &ns, "eth0", &host).run_within(&c, PROMPT);
        assert_eq!(out.code, 0, "{kind}: {}{}", out.stdout, out.stderr);
        assert!(out.stderr.contains("not settings a tuning saved"), "{kind}: said once: {}", out.stderr);
        assert!(std::fs::symlink_metadata(&name).is_err(), "{kind}: removed");
        assert_eq!(opens.names(), Vec::<String>::new(), "{kind}: nothing in the data directory opened");
        assert_eq!(target_opens.names(), Vec::<String>::new(), "{kind}: the link's target not opened");
        assert_eq!(std::fs::read(&target).unwrap(), planted, "{kind}: the target as it was");
        assert_eq!(link_state(&ns), tuned, "{kind}: nothing restored from what no tuning wrote");
        let again = ours("DEL", &id, &ns, "eth0", &host).run(&c);
        assert_eq!((again.code, again.stderr.as_str()), (0, ""), "{kind}: a retry: {}", again.stdout);
    }
}

/// Issue 37.4 (c): the pod (CAP_NET_ADMIN in its own namespace) replaced its eth0 by a macvlan
/// after ADD, on a lower device (a veth) that cannot take the saved MTU: DEL succeeds, says so once,
/// does not touch the new link and removes the file; a retry has nothing to say.
#[test]
fn a_link_that_replaced_the_tuned_one_is_left_alone_and_del_succeeds() {
    let host = host();
    let data = TempDir::new("tunrepl");
    let (ns, prev) = pod();
    let id = unique("trp");
    let c = conf(&data, &prev, link_keys());
    ours("ADD", &id, &ns, "eth0", &host).run(&c).ok();
    let file = data.join(format!("{id}_eth0.json"));
    let saved: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let tuned_index = ns.link("eth0").unwrap()["ifindex"].clone();
    ns.run("ip", &["link", "del", "eth0"]);
    ns.run("ip", &["link", "add", "low0", "mtu", "1400", "type", "veth", "peer", "name", "low1"]);
    ns.run("ip", &["link", "add", "eth0", "link", "low0", "type", "macvlan"]);
    ns.run("ip", &["link", "set", "eth0", "up"]);
    let identity = |ns: &Netns| {
        let l = ns.link("eth0").unwrap();
        (l["ifindex"].clone(), l["linkinfo"]["info_kind"].clone())
    };
    let (replaced, who) = (link_state(&ns), identity(&ns));
    assert_eq!(who.1, "macvlan");
    let out = ours("DEL", &id, &ns, "eth0", &host).run(&c);
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(out.stderr.contains("is not the one tuned"), "{}", out.stderr);
    assert_eq!((link_state(&ns), identity(&ns)), (replaced, who), "the new link is not modified");
    assert!(!file.exists(), "the file is gone");
    let again = ours("DEL", &id, &ns, "eth0", &host).run(&c);
    assert_eq!((again.code, again.stderr.as_str()), (0, ""), "a retry: {}", again.stdout);
    // what DEL went by: the tuned link's identity, saved by ADD
    assert_eq!((&saved["ifindex"], &saved["kind"]), (&tuned_index, &json!("veth")), "{saved}");
}

/// Issue 37.4 (d): a saved value the kernel refuses (an MTU above a veth's largest): DEL
/// succeeds once, reports the error on stderr, still restores the other settings, and the
/// file is gone, so the retry succeeds silently.
#[test]
fn a_saved_value_the_kernel_refuses_is_reported_once_and_del_succeeds() {
    let host = host();
    let data = TempDir::new("tunref");
    let (ns, prev) = pod();
    let before = link_state(&ns);
    let id = unique("trf");
    let c = conf(&data, &prev, link_keys());
    ours("ADD", &id, &ns, "eth0", &host).run(&c).ok();
    let file = data.join(format!("{id}_eth0.json"));
    let mut saved: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    saved["mtu"] = json!(70000);
    std::fs::write(&file, saved.to_string()).unwrap();
    let out = ours("DEL", &id, &ns, "eth0", &host).run(&c);
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(out.stderr.contains("could not restore Mtu(70000)"), "{}", out.stderr);
    let mut want = before.clone();
    want["mtu"] = json!(1300);
    assert_eq!(link_state(&ns), want, "everything but the refused MTU put back");
    assert!(!file.exists(), "the file is gone");
    let again = ours("DEL", &id, &ns, "eth0", &host).run(&c);
    assert_eq!((again.code, again.stderr.as_str()), (0, ""), "reported once: {}", again.stdout);
}

/// A pod namespace with a veth called `ifname` (its peer stays in the pod) of MTU `mtu`.
fn pod_with(ifname: &str, mtu: &str) -> (Netns, Value) {
    let ns = Netns::new("tnc");
    ns.run("ip", &["link", "add", ifname, "mtu", mtu, "type", "veth", "peer", "name", "peer0"]);
    ns.run("ip", &["link", "set", ifname, "up"]);
    let prev = json!({"cniVersion": "1.1.0", "interfaces": [{"name": ifname, "sandbox": ns.path_str()}],
                      "ips": [{"address": "10.9.0.5/24", "interface": 0}]});
    (ns, prev)
}

/// Issue 37.4 (e): id `<u>_b` with ifname `c` and id `<u>` with ifname `b_c` have the same
/// upstream name; each gets its own file now, and each DEL restores its own link.
#[test]
fn ids_and_ifnames_with_underscores_no_longer_share_a_saved_file() {
    let host = host();
    let data = TempDir::new("tunus");
    let u = unique("tus");
    let (a, pa) = pod_with("c", "1500");
    let (b, pb) = pod_with("b_c", "1400");
    let (ida, idb) = (format!("{u}_b"), u.clone());
    let keys = json!({"mtu": 1300, "mac": "02:aa:bb:cc:dd:38"});
    let (ca, cb) = (conf(&data, &pa, keys.clone()), conf(&data, &pb, keys));
    let (before_a, before_b) = (link_state_of(&a, "c"), link_state_of(&b, "b_c"));
    ours("ADD", &ida, &a, "c", &host).run(&ca).ok();
    ours("ADD", &idb, &b, "b_c", &host).run(&cb).ok();
    let mut files: Vec<String> = std::fs::read_dir(data.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    ours("DEL", &idb, &b, "b_c", &host).run(&cb).ok_silent();
    ours("DEL", &ida, &a, "c", &host).run(&ca).ok_silent();
    assert_eq!(link_state_of(&a, "c"), before_a, "{ida}'s link restored from its own file");
    assert_eq!(link_state_of(&b, "b_c"), before_b, "{idb}'s link restored from its own file");
    assert!(std::fs::read_dir(data.path()).unwrap().next().is_none());
    assert_eq!(files, vec![format!("+{u}+b_c.json"), format!("+{u}_b+c.json")], "the names ADD wrote");
}

/// Issue 37.4 (f): a file upstream wrote (its name, no ifindex or kind) still restores with
/// ours, for an id with `_` too (ours looks for its own name first, then upstream's); and a
/// hand-written file in upstream's format, without upstream's binary.
#[test]
fn del_restores_from_upstreams_file_under_upstreams_name() {
    let host = host();
    let upstream = Path::new(&upstream_release_dir()).join("tuning");
    for id in [unique("tup"), format!("{}_x", unique("tup"))] {
        let data = TempDir::new("tunup");
        let (ns, prev) = pod();
        let before = link_state(&ns);
        let c = conf(&data, &prev, link_keys());
        exec(upstream.to_str().unwrap(), "ADD", &id, &ns, &host).run(&c).ok();
        let file = data.join(format!("{id}_eth0.json"));
        let saved: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        assert!(saved.get("ifindex").is_none() && saved.get("kind").is_none(), "{saved}");
        ours("DEL", &id, &ns, "eth0", &host).run(&c).ok_silent();
        assert_eq!(link_state(&ns), before, "{id}: upstream's ADD, our DEL");
        assert!(!file.exists(), "{id}");
    }
    let data = TempDir::new("tunup");
    let (ns, prev) = pod();
    let id = format!("{}_y", unique("tup"));
    ns.run("ip", &["link", "set", "eth0", "mtu", "1280", "txqlen", "5"]);
    std::fs::write(data.join(format!("{id}_eth0.json")), br#"{"mtu":1500,"txQLen":1000}"#).unwrap();
    ours("DEL", &id, &ns, "eth0", &host).run(&conf(&data, &prev, json!({}))).ok_silent();
    let now = link_state(&ns);
    assert_eq!((now["mtu"].clone(), now["txqlen"].clone()), (json!(1500), json!(1000)));
    assert!(std::fs::read_dir(data.path()).unwrap().next().is_none());
}

/// Issue 37.4, the whole chain (bridge with host-local, then tuning): the pod replaced its
/// eth0 by a macvlan after ADD; the chain's DEL (tuning first) succeeds, so bridge's and
/// host-local's DEL run: the address is released and no host veth is left on the bridge.
#[test]
fn the_chains_del_releases_the_address_after_the_pod_replaced_its_interface() {
    let host = host();
    let ipam = TempDir::new("tunchip");
    let data = TempDir::new("tunchdt");
    let bins = cni_path_with(&["bridge", "host-local", "tuning"]);
    let chain = Chain {
        name: "tunechain".into(),
        version: "1.1.0".into(),
        plugins: vec![
            json!({"type": "bridge", "bridge": "tunbr0", "isGateway": true,
                   "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.78.0.0/24"}]], "dataDir": ipam.str()}}),
            json!({"type": "tuning", "dataDir": data.str(), "mtu": 1300, "mac": "02:aa:bb:cc:dd:39"}),
        ],
        cni_path: bins.path().to_path_buf(),
    };
    let pod = Netns::new("tnc");
    pod.run("ip", &["link", "set", "lo", "up"]);
    let id = unique("tch");
    let caps = json!({});
    let (result, _) = chain.add(&id, pod.path_str(), "eth0", &caps, Some(&host)).unwrap_or_else(|steps| {
        let last = steps.last().unwrap();
        panic!("ADD {} failed: {}{}", last.plugin, last.out.stdout, last.out.stderr)
    });
    let netdir = ipam.join("tunechain");
    assert_eq!(reservations(&netdir).len(), 1, "one address reserved");
    let host_veths = |h: &Netns| -> Vec<String> {
        let links = h.ip_json(&["link", "show", "master", "tunbr0"]);
        links.as_array().unwrap().iter().map(|l| l["ifname"].as_str().unwrap().to_string()).collect()
    };
    assert_eq!(host_veths(&host).len(), 1);
    pod.run("ip", &["link", "del", "eth0"]);
    pod.run("ip", &["link", "add", "low0", "mtu", "1400", "type", "veth", "peer", "name", "low1"]);
    pod.run("ip", &["link", "add", "eth0", "link", "low0", "type", "macvlan"]);
    let steps = chain.del(&id, pod.path_str(), "eth0", &caps, Some(&result), Some(&host));
    assert_eq!(steps[0].plugin, "tuning");
    assert!(steps[0].out.stderr.contains("is not the one tuned"), "{}", steps[0].out.stderr);
    assert_eq!(reservations(&netdir), vec![], "host-local released the address");
    assert_eq!(host_veths(&host), Vec::<String>::new(), "no host veth left");
    assert!(pod.link("eth0").is_none(), "bridge's DEL removed the pod's eth0");
    assert!(std::fs::read_dir(data.path()).unwrap().next().is_none(), "tuning's file is gone");
}
