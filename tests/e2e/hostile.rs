//! Bad input, across the plugins and the runner: malformed JSON, wrong types, huge values,
//! traversal in names and types, unknown versions, missing or malformed environment, bad netns
//! paths. Every case must give the right error code, exactly one JSON document on stdout, a
//! non-zero exit, and leave the host exactly as it was: links, addresses, routes, nftables,
//! qdiscs and sysctls of the fake host and of the container namespace, and every file of the
//! IPAM store, compared byte for byte before and after.
//!
//! Plugin-specific hostile configs live next to the generic ones below; each plugin brings
//! its own list.

use cni_tests::{cni_path_with, crafted_index_header, dir_state, ns_state, Exec, Netns, TempDir};
use serde_json::{json, Value};

struct World {
    host: Netns,
    ctr: Netns,
    data: TempDir,
    cni_path: TempDir,
    /// Files that are no network namespace, for CNI_NETNS: kept out of `data`, whose snapshot
    /// reads every file (and would block on the FIFO).
    odd: TempDir,
}

/// Make a FIFO or a character device (1:3, what /dev/null is) at `path`.
fn mknod(path: &std::path::Path, kind: libc::mode_t) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid C string; makedev is plain arithmetic.
    let r = unsafe { libc::mknod(c.as_ptr(), kind | 0o600, libc::makedev(1, 3)) };
    assert_eq!(r, 0, "mknod {}: {}", path.display(), std::io::Error::last_os_error());
}

impl World {
    fn new(plugins: &[&str]) -> World {
        let w = World {
            host: Netns::new("hh"),
            ctr: Netns::new("hc"),
            data: TempDir::new("hostile-data"),
            cni_path: cni_path_with(plugins),
            odd: TempDir::new("hostile-netns"),
        };
        mknod(&w.odd.join("fifo"), libc::S_IFIFO);
        mknod(&w.odd.join("chardev"), libc::S_IFCHR);
        std::fs::write(w.odd.join("file"), "not a namespace").unwrap();
        for t in ["fifo", "chardev", "file"] {
            std::os::unix::fs::symlink(w.odd.join(t), w.odd.join(format!("link-to-{t}"))).unwrap();
        }
        std::os::unix::fs::symlink(w.odd.join("nothing"), w.odd.join("dangling")).unwrap();
        // Some pre-existing state that must survive untouched.
        w.host.run("ip", &["link", "set", "lo", "up"]);
        w.host.run("ip", &["link", "add", "hbr0", "type", "bridge"]);
        w.host.run("ip", &["addr", "add", "10.66.0.1/24", "dev", "hbr0"]);
        std::fs::create_dir_all(w.data.join("hostile")).unwrap();
        std::fs::write(w.data.join("hostile/10.77.0.9"), "someone\r\neth0").unwrap();
        // A store as any earlier call (ours or upstream's) leaves it: the lock exists.
        std::fs::write(w.data.join("hostile/lock"), "").unwrap();
        w
    }

    fn snapshot(&self) -> String {
        format!(
            "{}\n----\n{}\n----\n{:?}",
            ns_state(&self.host),
            ns_state(&self.ctr),
            dir_state(self.data.path())
        )
    }
}

/// One hostile invocation.
struct Case {
    what: String,
    /// Environment overrides on top of a valid ADD environment; `None` removes the variable.
    env: Vec<(&'static str, Option<String>)>,
    stdin: String,
    code: u64,
}

fn case(what: impl Into<String>, stdin: impl Into<String>, code: u64) -> Case {
    Case { what: what.into(), env: vec![], stdin: stdin.into(), code }
}

fn with_env(mut c: Case, k: &'static str, v: Option<&str>) -> Case {
    c.env.push((k, v.map(str::to_string)));
    c
}

fn set(base: &Value, key: &str, v: Value) -> String {
    let mut c = base.clone();
    c[key] = v;
    c.to_string()
}

/// Hostile cases every plugin must handle the same way (the skeleton's checks).
fn generic_cases(base: &Value, w: &World) -> Vec<Case> {
    let ok = base.to_string();
    let mut v = vec![
        case("empty stdin", "", 6),
        case("truncated JSON", "{\"cniVersion\":", 6),
        case("JSON array", "[]", 6),
        case("JSON null", "null", 6),
        case("JSON string", "\"x\"", 6),
        case(
            "invalid UTF-8",
            String::from_utf8_lossy(b"{\"name\":\"\xff\"}").replace('\u{fffd}', "\u{7f}\u{0}"),
            6,
        ),
        case("deep nesting", format!("{}{}", "[".repeat(5000), "]".repeat(5000)), 6),
        case("missing name", set(base, "name", Value::Null), 7),
        case("name is a number", set(base, "name", json!(123)), 6),
        case("name traversal", set(base, "name", json!("../../etc")), 7),
        case("name with slash", set(base, "name", json!("a/b")), 7),
        case("name with space", set(base, "name", json!("a b")), 7),
        case("empty name", set(base, "name", json!("")), 7),
        case("name starts with dot", set(base, "name", json!(".hidden")), 7),
        case("unknown version", set(base, "cniVersion", json!("9.9.9")), 1),
        case("two-part version", set(base, "cniVersion", json!("1.0")), 1),
        case("version is a number", set(base, "cniVersion", json!(1.0)), 6),
        case("version is an array", set(base, "cniVersion", json!(["1.0.0"])), 6),
        case("type traversal", set(base, "type", json!("../../bin/sh")), 7),
        case("type absolute", set(base, "type", json!("/bin/sh")), 7),
        case("type is an object", set(base, "type", json!({"a": 1})), 6),
        with_env(case("unknown verb", ok.clone(), 4), "CNI_COMMAND", Some("ATTACH")),
        with_env(case("lower-case verb", ok.clone(), 4), "CNI_COMMAND", Some("add")),
        with_env(case("missing container id", ok.clone(), 4), "CNI_CONTAINERID", None),
        with_env(case("missing netns", ok.clone(), 4), "CNI_NETNS", None),
        with_env(case("missing ifname", ok.clone(), 4), "CNI_IFNAME", None),
        with_env(case("missing CNI_PATH", ok.clone(), 4), "CNI_PATH", None),
        with_env(case("container id traversal", ok.clone(), 4), "CNI_CONTAINERID", Some("../x")),
        with_env(case("container id leading dash", ok.clone(), 4), "CNI_CONTAINERID", Some("-rf")),
        with_env(case("container id newline", ok.clone(), 4), "CNI_CONTAINERID", Some("a\nb")),
        with_env(case("container id semicolon", ok.clone(), 4), "CNI_CONTAINERID", Some("a;rm")),
        with_env(case("ifname too long", ok.clone(), 4), "CNI_IFNAME", Some("a23456789012345x")),
        with_env(case("ifname dot", ok.clone(), 4), "CNI_IFNAME", Some(".")),
        with_env(case("ifname dotdot", ok.clone(), 4), "CNI_IFNAME", Some("..")),
        with_env(case("ifname slash", ok.clone(), 4), "CNI_IFNAME", Some("a/b")),
        with_env(case("ifname colon", ok.clone(), 4), "CNI_IFNAME", Some("eth0:1")),
        with_env(case("ifname space", ok.clone(), 4), "CNI_IFNAME", Some("eth 0")),
        with_env(case("netns missing path", ok.clone(), 3), "CNI_NETNS", Some("/run/netns/no-such-ns")),
        with_env(case("netns regular file", ok.clone(), 4), "CNI_NETNS", Some("/etc/hostname")),
        with_env(case("netns directory", ok.clone(), 4), "CNI_NETNS", Some("/tmp")),
        with_env(case("netns is the plugin's own", ok.clone(), 8), "CNI_NETNS", Some(w.host.path_str())),
        with_env(
            case("netns dangling symlink", ok.clone(), 3),
            "CNI_NETNS",
            Some(w.odd.join("dangling").to_str().unwrap()),
        ),
        with_env(
            case("CNI_CHILD_TIMEOUT_MS not a number", ok.clone(), 4),
            "CNI_CHILD_TIMEOUT_MS",
            Some("soon"),
        ),
        with_env(case("CNI_CHILD_TIMEOUT_MS zero", ok.clone(), 4), "CNI_CHILD_TIMEOUT_MS", Some("0")),
        // A valid configuration made one byte longer than the skeleton reads (8 MiB).
        case("stdin beyond 8 MiB", format!("{ok}{}", " ".repeat((8 << 20) + 1 - ok.len())), 5),
        with_env(
            case("CHECK below 0.4.0", set(base, "cniVersion", json!("0.3.1")), 1),
            "CNI_COMMAND",
            Some("CHECK"),
        ),
        with_env(
            case("GC below 1.1.0", set(base, "cniVersion", json!("1.0.0")), 1),
            "CNI_COMMAND",
            Some("GC"),
        ),
        with_env(
            case("STATUS below 1.1.0", set(base, "cniVersion", json!("0.4.0")), 1),
            "CNI_COMMAND",
            Some("STATUS"),
        ),
        with_env(case("GC without the valid list", ok.clone(), 7), "CNI_COMMAND", Some("GC")),
        with_env(
            case("GC list of wrong type", set(base, "cni.dev/valid-attachments", json!("all")), 6),
            "CNI_COMMAND",
            Some("GC"),
        ),
        with_env(
            case(
                "GC entry of wrong type",
                set(base, "cni.dev/valid-attachments", json!([{"containerID": 7}])),
                6,
            ),
            "CNI_COMMAND",
            Some("GC"),
        ),
        case("prevResult of wrong type", set(base, "prevResult", json!("x")), 6),
        case("prevResult unknown version", set(base, "prevResult", json!({"cniVersion": "7.0.0"})), 1),
        case(
            "prevResult bad address",
            set(base, "prevResult", json!({"cniVersion": "1.0.0", "ips": [{"address": "1.2.3.4/99"}]})),
            6,
        ),
    ];
    // What is at CNI_NETNS is looked at without being opened: a FIFO does not block ADD or
    // CHECK, a device's open is never called (a plugin still running after 30 s fails the case).
    for name in ["fifo", "chardev", "file", "link-to-fifo", "link-to-chardev", "link-to-file"] {
        let path = w.odd.join(name).to_str().unwrap().to_string();
        v.push(with_env(case(format!("netns {name}"), ok.clone(), 4), "CNI_NETNS", Some(&path)));
        let check =
            with_env(case(format!("CHECK netns {name}"), ok.clone(), 4), "CNI_COMMAND", Some("CHECK"));
        v.push(with_env(check, "CNI_NETNS", Some(&path)));
    }
    // Every variable missing at once: one error naming them all.
    let mut all = case("every variable missing but the verb", ok, 4);
    for k in ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"] {
        all.env.push((k, None));
    }
    v.push(all);
    v
}

fn run_cases(w: &World, plugin: &str, cases: Vec<Case>) -> usize {
    let n = cases.len();
    let mut failures = Vec::new();
    for c in cases {
        let before = w.snapshot();
        let mut e = Exec::new(plugin).in_ns(&w.host).attachment(
            "ADD",
            "hostile-ctr",
            w.ctr.path_str(),
            "eth0",
            w.cni_path.str(),
        );
        for (k, v) in &c.env {
            e = match v {
                Some(v) => e.env(k, v),
                None => e.env(k, ""),
            };
        }
        // a case that blocks the plugin (a FIFO opened for real) fails here, named
        let out = e.run_within(&c.stdin, std::time::Duration::from_secs(30));
        let what = &c.what;
        if out.code == 0 {
            failures.push(format!("{what}: succeeded: {}", out.stdout));
            continue;
        }
        let doc = out.json(); // exactly one document
        if doc["code"] != c.code {
            failures.push(format!("{what}: code {} (want {}): {}", doc["code"], c.code, doc["msg"]));
        }
        if doc["msg"].as_str().is_none_or(str::is_empty) || !doc["cniVersion"].is_string() {
            failures.push(format!("{what}: no message or cniVersion: {doc}"));
        }
        if before != w.snapshot() {
            failures.push(format!("{what}: host state changed"));
        }
    }
    assert!(failures.is_empty(), "{plugin}: {} of {n} cases wrong:\n{}", failures.len(), failures.join("\n"));
    n
}

#[test]
fn loopback_rejects_hostile_input_without_side_effects() {
    let w = World::new(&["loopback"]);
    let base = json!({"cniVersion": "1.1.0", "name": "hostile", "type": "loopback"});
    let n = run_cases(&w, "loopback", generic_cases(&base, &w));
    assert!(n >= 50, "{n} cases");
}

fn host_local_base(w: &World) -> Value {
    json!({"cniVersion": "1.1.0", "name": "hostile", "type": "host-local",
           "ipam": {"type": "host-local", "subnet": "10.77.0.0/24", "dataDir": w.data.str()}})
}

fn ipam_set(base: &Value, key: &str, v: Value) -> String {
    let mut c = base.clone();
    c["ipam"][key] = v;
    c.to_string()
}

#[test]
fn host_local_rejects_hostile_input_without_side_effects() {
    let w = World::new(&["host-local"]);
    let base = host_local_base(&w);
    let mut cases = generic_cases(&base, &w);
    let specific = vec![
        case("subnet not a CIDR", ipam_set(&base, "subnet", json!("10.77.0.0")), 6),
        case("subnet prefix out of range", ipam_set(&base, "subnet", json!("10.77.0.0/33")), 6),
        case("subnet with host bits", ipam_set(&base, "subnet", json!("10.77.0.5/24")), 7),
        case("subnet too small", ipam_set(&base, "subnet", json!("10.77.0.0/31")), 7),
        case("subnet is a number", ipam_set(&base, "subnet", json!(10)), 6),
        case("rangeStart outside subnet", ipam_set(&base, "rangeStart", json!("10.78.0.5")), 7),
        case("rangeEnd outside subnet", ipam_set(&base, "rangeEnd", json!("10.76.0.5")), 7),
        case("gateway not an IP", ipam_set(&base, "gateway", json!("gw")), 6),
        case("dataDir relative", ipam_set(&base, "dataDir", json!("relative/dir")), 7),
        case(
            "dataDir traversal",
            ipam_set(&base, "dataDir", json!(format!("{}/../../etc", w.data.str()))),
            7,
        ),
        case("ranges of wrong type", ipam_set(&base, "ranges", json!("10.0.0.0/8")), 6),
        case(
            "overlapping range sets",
            ipam_set(&base, "ranges", json!([[{"subnet": "10.77.0.0/24"}], [{"subnet": "10.77.0.0/25"}]])),
            7,
        ),
        case(
            "mixed families in one set",
            ipam_set(&base, "ranges", json!([[{"subnet": "10.79.0.0/24"}, {"subnet": "fd00::/64"}]])),
            7,
        ),
        case("routes of wrong type", ipam_set(&base, "routes", json!({"dst": "0.0.0.0/0"})), 6),
        case("route dst not a CIDR", ipam_set(&base, "routes", json!([{"dst": "default"}])), 6),
        case(
            "requested IP outside every range",
            set(&base, "args", json!({"cni": {"ips": ["192.0.2.1"]}})),
            7,
        ),
        case("requested IP is the gateway", set(&base, "args", json!({"cni": {"ips": ["10.77.0.1"]}})), 7),
        // Fails under the store lock, after the store was read: still nothing may change (no
        // index of ours appears).
        case(
            "requested IP held by another container",
            set(&base, "args", json!({"cni": {"ips": ["10.77.0.9"]}})),
            999,
        ),
        case("requested IP not an IP", set(&base, "args", json!({"cni": {"ips": ["ten"]}})), 6),
        with_env(case("CNI_ARGS malformed", base.to_string(), 4), "CNI_ARGS", Some("IP")),
        with_env(case("CNI_ARGS unknown key", base.to_string(), 4), "CNI_ARGS", Some("FOO=bar")),
        with_env(case("CNI_ARGS bad IP", base.to_string(), 4), "CNI_ARGS", Some("IP=10.77.0.300")),
        case(
            "runtimeConfig ipRanges of wrong type",
            set(&base, "runtimeConfig", json!({"ipRanges": "x"})),
            6,
        ),
        case("ipam is a string", set(&base, "ipam", json!("host-local")), 6),
        case("huge mtu-like number in ranges", ipam_set(&base, "ranges", json!([[{"subnet": 1e300}]])), 6),
    ];
    cases.extend(specific);
    let n = run_cases(&w, "host-local", cases);
    assert!(n >= 70, "{n} cases");
}

/// One planted thing in or around host-local's store: how to plant and remove it, the call
/// that meets it, and what that call must answer.
struct Plant {
    what: &'static str,
    plant: Box<dyn Fn()>,
    remove: Box<dyn Fn()>,
    verb: &'static str,
    stdin: String,
    code: u64,
    msg: &'static str,
}

/// Issue 18: the store and the files a configuration names are data, never followed, waited on
/// or read without a cap. Each planted thing makes the call fail with its code, and the hosts,
/// the store and everything outside it (a link's target, a victim file) stay as they were.
#[test]
fn host_local_refuses_a_hostile_store_without_side_effects() {
    use std::os::unix::fs::{symlink, PermissionsExt};
    let w = World::new(&["host-local"]);
    let base = host_local_base(&w);
    let store = w.data.join("hostile");
    let outside = TempDir::new("hostile-outside");
    std::fs::write(outside.join("victim"), "precious").unwrap();
    // not part of the snapshots (they read every file)
    let big = TempDir::new("hostile-big");
    let huge = big.join("huge");
    let (st, out) = (store.clone(), outside.path().to_path_buf());
    let mkfifo = |p: std::path::PathBuf| {
        cni_tests::sh("mkfifo", &[p.to_str().unwrap()]);
    };
    let with_resolv = |p: &str| ipam_set(&base, "resolvConf", json!(p));
    let plants = vec![
        Plant {
            what: "lock is a symbolic link (root would create its target)",
            plant: Box::new({
                let (st, out) = (st.clone(), out.clone());
                move || {
                    std::fs::remove_file(st.join("lock")).unwrap();
                    symlink(out.join("created-by-root"), st.join("lock")).unwrap();
                }
            }),
            remove: Box::new({
                let st = st.clone();
                move || {
                    std::fs::remove_file(st.join("lock")).unwrap();
                    std::fs::write(st.join("lock"), "").unwrap();
                }
            }),
            verb: "ADD",
            stdin: base.to_string(),
            code: 5,
            msg: "lock: a symbolic link, which is not followed",
        },
        Plant {
            what: "last_reserved_ip.0 is a symbolic link to a victim file (it was truncated)",
            plant: Box::new({
                let (st, out) = (st.clone(), out.clone());
                move || symlink(out.join("victim"), st.join("last_reserved_ip.0")).unwrap()
            }),
            remove: Box::new({
                let st = st.clone();
                move || std::fs::remove_file(st.join("last_reserved_ip.0")).unwrap()
            }),
            verb: "ADD",
            stdin: base.to_string(),
            code: 5,
            msg: "last_reserved_ip.0: a symbolic link, which is not followed",
        },
        Plant {
            what: "a FIFO named like the requested address (blocked the scan with the lock held)",
            plant: Box::new({
                let st = st.clone();
                move || mkfifo(st.join("10.77.0.5"))
            }),
            remove: Box::new({
                let st = st.clone();
                move || std::fs::remove_file(st.join("10.77.0.5")).unwrap()
            }),
            verb: "ADD",
            stdin: set(&base, "args", json!({"cni": {"ips": ["10.77.0.5"]}})),
            code: 999,
            msg: "requested IP address 10.77.0.5 is not available",
        },
        Plant {
            what: "a crafted index header (wrapping size) on CHECK",
            plant: Box::new({
                let st = st.clone();
                move || std::fs::write(st.join(".host-local-index"), crafted_index_header(1 << 59)).unwrap()
            }),
            remove: Box::new({
                let st = st.clone();
                move || std::fs::remove_file(st.join(".host-local-index")).unwrap()
            }),
            verb: "CHECK",
            stdin: base.to_string(),
            code: 999,
            msg: "Failed to find address added by container hostile-ctr",
        },
        Plant {
            what: "the store directory writable by others",
            plant: Box::new({
                let st = st.clone();
                move || std::fs::set_permissions(&st, std::fs::Permissions::from_mode(0o777)).unwrap()
            }),
            remove: Box::new({
                let st = st.clone();
                move || std::fs::set_permissions(&st, std::fs::Permissions::from_mode(0o755)).unwrap()
            }),
            verb: "ADD",
            stdin: base.to_string(),
            code: 5,
            msg: "is not safe to allocate from: group or others may write it (mode 0777)",
        },
        Plant {
            what: "the store directory is a symbolic link",
            plant: Box::new({
                let (st, out) = (st.clone(), out.clone());
                move || {
                    std::fs::rename(&st, out.join("real-store")).unwrap();
                    symlink(out.join("real-store"), &st).unwrap();
                }
            }),
            remove: Box::new({
                let (st, out) = (st.clone(), out.clone());
                move || {
                    std::fs::remove_file(&st).unwrap();
                    std::fs::rename(out.join("real-store"), &st).unwrap();
                }
            }),
            verb: "ADD",
            stdin: base.to_string(),
            code: 5,
            msg: "is a symbolic link, not a directory",
        },
        Plant {
            what: "a huge resolvConf (a sparse 4 GiB file)",
            plant: Box::new({
                let huge = huge.clone();
                move || std::fs::File::create(&huge).unwrap().set_len(4 << 30).unwrap()
            }),
            remove: Box::new({
                let huge = huge.clone();
                move || std::fs::remove_file(&huge).unwrap()
            }),
            verb: "ADD",
            stdin: with_resolv(huge.to_str().unwrap()),
            code: 5,
            msg: "larger than 1048576 bytes",
        },
        Plant {
            what: "resolvConf is a FIFO",
            plant: Box::new({
                let out = out.clone();
                move || mkfifo(out.join("fifo"))
            }),
            remove: Box::new({
                let out = out.clone();
                move || std::fs::remove_file(out.join("fifo")).unwrap()
            }),
            verb: "ADD",
            stdin: with_resolv(outside.join("fifo").to_str().unwrap()),
            code: 7,
            msg: "not a regular file but a FIFO",
        },
        Plant {
            what: "resolvConf is /dev/zero",
            plant: Box::new(|| {}),
            remove: Box::new(|| {}),
            verb: "ADD",
            stdin: with_resolv("/dev/zero"),
            code: 7,
            msg: "not a regular file but a character device",
        },
    ];
    let n = plants.len();
    let mut failures = Vec::new();
    for p in plants {
        (p.plant)();
        let before = format!("{}\n{:?}", w.snapshot(), dir_state(outside.path()));
        let res = Exec::new("host-local")
            .in_ns(&w.host)
            .attachment(p.verb, "hostile-ctr", w.ctr.path_str(), "eth0", w.cni_path.str())
            .run_within(&p.stdin, std::time::Duration::from_secs(30));
        let after = format!("{}\n{:?}", w.snapshot(), dir_state(outside.path()));
        (p.remove)();
        let what = p.what;
        if res.code == 0 {
            failures.push(format!("{what}: succeeded: {}", res.stdout));
            continue;
        }
        let doc = res.json();
        let msg = doc["msg"].as_str().unwrap_or_default();
        if doc["code"] != p.code || !msg.contains(p.msg) {
            failures.push(format!("{what}: code {} {msg:?} (want {} {:?})", doc["code"], p.code, p.msg));
        }
        if before != after {
            failures.push(format!("{what}: host or store changed"));
        }
    }
    assert!(!outside.join("created-by-root").exists(), "root created a lock's link target");
    assert_eq!(std::fs::read(outside.join("victim")).unwrap(), b"precious");
    assert!(failures.is_empty(), "{} of {n} cases wrong:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn bandwidth_rejects_hostile_input_without_side_effects() {
    let w = World::new(&["bandwidth"]);
    // The container is attached by a veth pair, as bridge would leave it.
    w.host
        .run("ip", &["link", "add", "hveth0", "type", "veth", "peer", "name", "eth0", "netns", w.ctr.name()]);
    let prev = json!({"cniVersion": "1.0.0", "interfaces": [
        {"name": "hbr0"}, {"name": "hveth0"}, {"name": "eth0", "sandbox": w.ctr.path_str()}]});
    let base = json!({"cniVersion": "1.1.0", "name": "hostile", "type": "bandwidth",
        "ingressRate": 8000, "ingressBurst": 800, "egressRate": 8000, "egressBurst": 800, "prevResult": prev});
    let mut cases = generic_cases(&base, &w);
    let without = |keys: &[&str]| {
        let mut c = base.clone();
        for k in keys {
            c.as_object_mut().unwrap().remove(*k);
        }
        c
    };
    let rt = |v: Value| {
        let mut c = without(&["ingressRate", "ingressBurst", "egressRate", "egressBurst"]);
        c["runtimeConfig"] = json!({"bandwidth": v});
        c.to_string()
    };
    let specific = vec![
        case("rate without burst", without(&["ingressBurst"]).to_string(), 7),
        case("burst without rate", without(&["egressRate"]).to_string(), 7),
        case("burst over 4GB", set(&base, "egressBurst", json!(34_359_738_360u64)), 7),
        case("burst u64::MAX", set(&base, "egressBurst", json!(u64::MAX)), 7),
        case("rate below one byte/s", set(&base, "ingressRate", json!(7)), 7),
        case("rate above u64", set(&base, "ingressRate", json!(1e20)), 6),
        case("rate negative", set(&base, "ingressRate", json!(-8000)), 6),
        case("rate fractional", set(&base, "ingressRate", json!(8000.5)), 6),
        case("rate as string", set(&base, "ingressRate", json!("8k")), 6),
        case("runtime rate without burst", rt(json!({"egressRate": 1000})), 7),
        case("runtime bandwidth of wrong type", rt(json!([1, 2])), 6),
        case("runtime rate of wrong type", rt(json!({"ingressRate": true, "ingressBurst": 8})), 6),
        case("runtimeConfig of wrong type", set(&base, "runtimeConfig", json!("fast")), 6),
        case("shaped subnets", set(&base, "shapedSubnets", json!(["10.0.0.0/8"])), 2),
        case("subnets of wrong type", set(&base, "unshapedSubnets", json!("10.0.0.0/8")), 6),
        case("no prevResult", without(&["prevResult"]).to_string(), 7),
        case("prevResult without interfaces", set(&base, "prevResult", json!({"cniVersion": "1.0.0"})), 7),
        case(
            "prevResult without the host veth",
            set(&base, "prevResult", json!({"cniVersion": "1.0.0", "interfaces": [{"name": "hbr0"}]})),
            7,
        ),
        case(
            "host veth listed inside the sandbox",
            set(
                &base,
                "prevResult",
                json!({"cniVersion": "1.0.0", "interfaces": [{"name": "hveth0", "sandbox": w.ctr.path_str()}]}),
            ),
            7,
        ),
        case("spec 0.2.0 (no interfaces in results)", set(&base, "cniVersion", json!("0.2.0")), 1),
        with_env(case("container interface missing", base.to_string(), 999), "CNI_IFNAME", Some("eth9")),
        with_env(case("container interface not a veth", base.to_string(), 999), "CNI_IFNAME", Some("lo")),
    ];
    cases.extend(specific);
    let n = run_cases(&w, "bandwidth", cases);
    assert!(n >= 70, "{n} cases");
}

#[test]
fn portmap_rejects_hostile_input_without_side_effects() {
    let w = World::new(&["portmap"]);
    let prev = json!({"cniVersion": "1.0.0", "interfaces": [
        {"name": "hbr0"}, {"name": "hveth0"}, {"name": "eth0", "sandbox": w.ctr.path_str()}],
        "ips": [{"address": "10.66.0.5/24", "gateway": "10.66.0.1", "interface": 2}]});
    let pm = |v: Value| json!({"portMappings": v});
    let base = json!({"cniVersion": "1.1.0", "name": "hostile", "type": "portmap",
        "runtimeConfig": pm(json!([{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}])), "prevResult": prev});
    let mut cases = generic_cases(&base, &w);
    let mapping = |m: Value| set(&base, "runtimeConfig", pm(json!([m])));
    let without_prev = {
        let mut c = base.clone();
        c.as_object_mut().unwrap().remove("prevResult");
        c.to_string()
    };
    let specific = vec![
        case("host port 0", mapping(json!({"hostPort": 0, "containerPort": 80})), 7),
        case("host port 65536", mapping(json!({"hostPort": 65536, "containerPort": 80})), 7),
        case("container port negative", mapping(json!({"hostPort": 80, "containerPort": -1})), 7),
        case("port huge", mapping(json!({"hostPort": 1e30, "containerPort": 80})), 6),
        case("port as string", mapping(json!({"hostPort": "80", "containerPort": 80})), 6),
        case("protocol icmp", mapping(json!({"hostPort": 80, "containerPort": 80, "protocol": "icmp"})), 2),
        case(
            "protocol with nft syntax",
            mapping(json!({"hostPort": 80, "containerPort": 80, "protocol": "tcp; flush ruleset"})),
            2,
        ),
        case(
            "hostIP not an address",
            mapping(json!({"hostPort": 80, "containerPort": 80, "hostIP": "x; y"})),
            7,
        ),
        case(
            "hostIP multicast",
            mapping(json!({"hostPort": 80, "containerPort": 80, "hostIP": "ff02::1"})),
            7,
        ),
        case(
            "same host port to two container ports",
            set(
                &base,
                "runtimeConfig",
                pm(json!([{"hostPort": 80, "containerPort": 80}, {"hostPort": 80, "containerPort": 81}])),
            ),
            7,
        ),
        case("mappings not a list", set(&base, "runtimeConfig", pm(json!({"hostPort": 80}))), 6),
        case("backend iptables", set(&base, "backend", json!("iptables")), 2),
        case("backend unknown", set(&base, "backend", json!("bpf")), 2),
        case("iptables conditions", set(&base, "conditionsV4", json!(["-d", "10.0.0.1"])), 2),
        case(
            "conditions injecting a statement",
            set(&base, "conditionsV4", json!(["ip daddr 1.1.1.1; flush ruleset"])),
            7,
        ),
        case("conditions with a comment", set(&base, "conditionsV6", json!(["#"])), 7),
        case("conditions nft rejects", set(&base, "conditionsV4", json!(["ip", "daddr", "nonsense"])), 7),
        case("conditions of wrong type", set(&base, "conditionsV4", json!("ip daddr 1.1.1.1")), 6),
        case("markMasqBit out of range", set(&base, "markMasqBit", json!(32)), 7),
        case("snat of wrong type", set(&base, "snat", json!("yes")), 6),
        case("no prevResult", without_prev, 7),
    ];
    cases.extend(specific);
    let n = run_cases(&w, "portmap", cases);
    assert!(n >= 60, "{n} cases");
}

fn bridge_base(w: &World) -> Value {
    json!({"cniVersion": "1.1.0", "name": "hostile", "type": "bridge", "bridge": "hbr1", "isGateway": true,
           "ipMasq": true,
           "ipam": {"type": "host-local", "subnet": "10.78.0.0/24", "dataDir": w.data.str()}})
}

#[test]
fn bridge_rejects_hostile_input_without_side_effects() {
    let w = World::new(&["bridge", "host-local"]);
    let base = bridge_base(&w);
    let mut cases = generic_cases(&base, &w);
    let specific = vec![
        case("bridge name too long", set(&base, "bridge", json!("averyverylongbridgename")), 7),
        case("bridge name with slash", set(&base, "bridge", json!("br/0")), 7),
        case("bridge name with space", set(&base, "bridge", json!("br 0")), 7),
        case("bridge name is a number", set(&base, "bridge", json!(0)), 6),
        case("bridge is an existing non-bridge", set(&base, "bridge", json!("lo")), 7),
        case("isGateway as a string", set(&base, "isGateway", json!("true")), 6),
        case("hairpinMode as a number", set(&base, "hairpinMode", json!(1)), 6),
        case("mtu negative", set(&base, "mtu", json!(-1)), 7),
        case("mtu as a string", set(&base, "mtu", json!("1500")), 6),
        case("mtu too small", set(&base, "mtu", json!(10)), 7),
        case("mtu too large", set(&base, "mtu", json!(1_000_000)), 7),
        case("vlan out of range", set(&base, "vlan", json!(5000)), 7),
        case("vlan negative", set(&base, "vlan", json!(-1)), 7),
        case("vlanTrunk missing maxID", set(&base, "vlanTrunk", json!([{"minID": 10}])), 7),
        case("vlanTrunk min above max", set(&base, "vlanTrunk", json!([{"minID": 20, "maxID": 10}])), 7),
        case("vlanTrunk id out of range", set(&base, "vlanTrunk", json!([{"id": 4095}])), 7),
        case("vlanTrunk of wrong type", set(&base, "vlanTrunk", json!("10-20")), 6),
        case(
            "hairpin and promisc together",
            {
                let mut c = base.clone();
                c["hairpinMode"] = json!(true);
                c["promiscMode"] = json!(true);
                c.to_string()
            },
            7,
        ),
        case("ipMasqBackend iptables", set(&base, "ipMasqBackend", json!("iptables")), 2),
        case("ipMasqBackend unknown", set(&base, "ipMasqBackend", json!("pf")), 7),
        case("ipam with disableContainerInterface", set(&base, "disableContainerInterface", json!(true)), 7),
        case("ipam type traversal", ipam_set(&base, "type", json!("../host-local")), 7),
        case("ipam type missing on CNI_PATH", ipam_set(&base, "type", json!("no-such-ipam")), 7),
        case("ipam subnet malformed", ipam_set(&base, "subnet", json!("10.78.0.0/40")), 6),
        case("ipam subnet host bits", ipam_set(&base, "subnet", json!("10.78.0.1/24")), 7),
        case("args.cni.mac malformed", set(&base, "args", json!({"cni": {"mac": "zz:zz"}})), 7),
        case(
            "runtimeConfig.mac multicast",
            set(&base, "runtimeConfig", json!({"mac": "01:00:5e:00:00:01"})),
            7,
        ),
        with_env(
            case("CNI_ARGS MAC malformed", set(&base, "x", json!(0)), 7),
            "CNI_ARGS",
            Some("IgnoreUnknown=1;MAC=nope"),
        ),
        case("dns of wrong type", set(&base, "dns", json!(["8.8.8.8"])), 6),
        case("nonMasqueradeCIDRs of wrong type", set(&base, "nonMasqueradeCIDRs", json!("10.0.0.0/8")), 6),
        case(
            "nonMasqueradeCIDRs entry malformed",
            set(&base, "nonMasqueradeCIDRs", json!(["10.0.0.0/99"])),
            7,
        ),
        case("autoMtu as a string", set(&base, "autoMtu", json!("yes")), 6),
        // the container already has an interface of that name
        with_env(case("CNI_IFNAME exists in the container", base.to_string(), 999), "CNI_IFNAME", Some("lo")),
        case("macspoofchk as a string", set(&base, "macspoofchk", json!("true")), 6),
    ];
    cases.extend(specific);
    let n = run_cases(&w, "bridge", cases);
    assert!(n >= 80, "{n} cases");
}

/// The runner: cnitool must refuse bad configuration files, environments and arguments with a
/// message on stderr and a non-zero exit, and change nothing.
#[test]
fn cnitool_rejects_hostile_input_without_side_effects() {
    let w = World::new(&["loopback", "bridge", "host-local"]);
    let conf = TempDir::new("hostile-conf");
    let cache = TempDir::new("hostile-cache");
    let good = json!({"cniVersion": "1.1.0", "name": "good", "plugins": [{"type": "loopback"}]});
    let files: Vec<(&str, String)> = vec![
        ("10-good.conflist", good.to_string()),
        ("20-broken.conflist", "{\"name\": \"broken\", \"plugins\": [".into()),
        (
            "30-traversal.conflist",
            json!({"cniVersion": "1.1.0", "name": "traversal", "plugins": [{"type": "../../../bin/true"}]})
                .to_string(),
        ),
        ("40-empty.conflist", json!({"cniVersion": "1.1.0", "name": "empty", "plugins": []}).to_string()),
        (
            "50-future.conflist",
            json!({"cniVersion": "9.9.9", "name": "future", "plugins": [{"type": "loopback"}]}).to_string(),
        ),
        ("60-noname.conflist", json!({"cniVersion": "1.1.0", "plugins": [{"type": "loopback"}]}).to_string()),
        (
            "70-badname.conflist",
            json!({"cniVersion": "1.1.0", "name": "../etc", "plugins": [{"type": "loopback"}]}).to_string(),
        ),
        (
            "80-missing.conflist",
            json!({"cniVersion": "1.1.0", "name": "missing", "plugins": [{"type": "no-such-plugin"}]})
                .to_string(),
        ),
        (
            "90-notype.conflist",
            json!({"cniVersion": "1.1.0", "name": "notype", "plugins": [{"bridge": "x"}]}).to_string(),
        ),
    ];
    for (f, text) in &files {
        std::fs::write(conf.join(f), text).unwrap();
    }
    let tool = cni_tests::bin("cnitool");
    // (what, argv, env overrides)
    type RunnerCase<'a> = (&'a str, Vec<&'a str>, Vec<(&'a str, &'a str)>);
    let ctr = w.ctr.path_str();
    let cases: Vec<RunnerCase> = vec![
        ("no arguments", vec![], vec![]),
        ("too few arguments", vec!["add", "good"], vec![]),
        ("unknown verb", vec!["attach", "good", ctr], vec![]),
        ("network not found", vec!["add", "nosuchnet", ctr], vec![]),
        ("broken conflist", vec!["add", "broken", ctr], vec![]),
        ("plugin type with a path", vec!["add", "traversal", ctr], vec![]),
        ("empty plugin list", vec!["add", "empty", ctr], vec![]),
        ("unsupported cniVersion", vec!["add", "future", ctr], vec![]),
        ("network with a bad name", vec!["add", "../etc", ctr], vec![]),
        ("plugin not on CNI_PATH", vec!["add", "missing", ctr], vec![]),
        ("plugin without a type", vec!["add", "notype", ctr], vec![]),
        ("CAP_ARGS not JSON", vec!["add", "good", ctr], vec![("CAP_ARGS", "{portMappings")]),
        ("CAP_ARGS not an object", vec!["add", "good", ctr], vec![("CAP_ARGS", "[1]")]),
        ("CNI_ARGS without =", vec!["add", "good", ctr], vec![("CNI_ARGS", "IP")]),
        ("CNI_ARGS empty value", vec!["add", "good", ctr], vec![("CNI_ARGS", "IP=")]),
        ("CNI_IFNAME too long", vec!["add", "good", ctr], vec![("CNI_IFNAME", "a23456789012345x")]),
        ("CNI_IFNAME with slash", vec!["add", "good", ctr], vec![("CNI_IFNAME", "a/b")]),
        ("container id override invalid", vec!["add", "good", ctr], vec![("CNI_CONTAINERID", "../x")]),
        ("netns does not exist", vec!["add", "good", "/run/netns/no-such-ns"], vec![]),
        ("netns is a regular file", vec!["add", "good", "/etc/hostname"], vec![]),
        ("NETCONFPATH missing", vec!["add", "good", ctr], vec![("NETCONFPATH", "/nonexistent/net.d")]),
        ("CNI_PATH empty", vec!["add", "good", ctr], vec![("CNI_PATH", "")]),
        ("check without a cached result", vec!["check", "good", ctr], vec![]),
        ("GC keep list malformed", vec!["gc", "good", ctr], vec![("CNI_GC_KEEP", "no-colon")]),
    ];
    let n = cases.len();
    for (what, args, env) in cases {
        let before = format!("{}\n{:?}", w.snapshot(), dir_state(cache.path()));
        let mut cmd = w.host.command(&tool);
        cmd.args(&args)
            .env("CNI_PATH", w.cni_path.path())
            .env("NETCONFPATH", conf.path())
            .env("CNI_CACHE_DIR", cache.path());
        for k in ["CAP_ARGS", "CNI_ARGS", "CNI_IFNAME", "CNI_CONTAINERID", "CNI_GC_KEEP"] {
            cmd.env_remove(k);
        }
        for (k, v) in &env {
            cmd.env(k, v);
        }
        let out = cmd.output().expect("run cnitool");
        assert!(!out.status.success(), "cnitool: {what}: succeeded");
        assert!(!out.stderr.is_empty(), "cnitool: {what}: no message on stderr");
        assert!(
            out.stdout.is_empty(),
            "cnitool: {what}: printed on stdout: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let after = format!("{}\n{:?}", w.snapshot(), dir_state(cache.path()));
        assert!(before == after, "cnitool: {what}: state changed");
    }
    assert!(n >= 24, "{n} cases");
}

/// DEL accepts a CNI_NETNS that is no namespace (the container is gone) and goes on cleaning
/// up: a FIFO or a device there must neither block it nor be opened, and with nothing to
/// clean up nothing changes.
#[test]
fn del_with_a_netns_that_is_no_namespace_returns_and_changes_nothing() {
    let w = World::new(&["loopback", "bridge", "host-local", "bandwidth", "portmap"]);
    let configs = [
        ("loopback", json!({"cniVersion": "1.1.0", "name": "hostile", "type": "loopback"})),
        ("host-local", host_local_base(&w)),
        ("bridge", bridge_base(&w)),
        ("bandwidth", json!({"cniVersion": "1.1.0", "name": "hostile", "type": "bandwidth"})),
        ("portmap", json!({"cniVersion": "1.1.0", "name": "hostile", "type": "portmap"})),
    ];
    let mut failures = Vec::new();
    for (plugin, conf) in &configs {
        // A first DEL without a netns: whatever a DEL writes anyway (host-local's index of a
        // store it has not seen yet) is not what this test is about.
        Exec::new(plugin)
            .in_ns(&w.host)
            .attachment("DEL", "hostile-ctr", "", "eth0", w.cni_path.str())
            .run(&conf.to_string())
            .success();
        for name in ["fifo", "chardev", "link-to-fifo", "link-to-chardev"] {
            let before = w.snapshot();
            let path = w.odd.join(name);
            let out = Exec::new(plugin)
                .in_ns(&w.host)
                .attachment("DEL", "hostile-ctr", path.to_str().unwrap(), "eth0", w.cni_path.str())
                .run(&conf.to_string());
            if out.code != 0 {
                failures.push(format!("{plugin} DEL netns {name}: {}{}", out.stdout, out.stderr));
            }
            if before != w.snapshot() {
                failures.push(format!("{plugin} DEL netns {name}: host state changed"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A fake plugin on CNI_PATH that never answers: it records its pid and that of a child it
/// starts (as a wrapper script would), then waits for ever.
fn never_answering_plugin(dir: &std::path::Path, name: &str, pids: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    let script =
        format!("#!/bin/sh\necho $$ >> {p}\nsleep 100000 &\necho $! >> {p}\nwait\n", p = pids.display());
    let path = dir.join(name);
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Every pid listed in `pids` is gone (or a zombie waiting for init): nothing left running.
fn assert_all_gone(pids: &std::path::Path) {
    let text = std::fs::read_to_string(pids).expect("the fake plugin ran and wrote its pids");
    let list: Vec<String> = text.split_whitespace().map(str::to_string).collect();
    assert!(list.len() >= 2, "pids: {text:?}");
    for pid in &list {
        // SIGKILL was sent before the plugin returned; the kernel finishes the exit on its own.
        cni_tests::wait_until(
            &format!("process {pid} to be gone"),
            std::time::Duration::from_secs(10),
            || match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
                Err(_) => true,
                Ok(stat) => stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')),
            },
        );
    }
}

/// bridge's IPAM delegate never answers: past the deadline (CNI_CHILD_TIMEOUT_MS, low here)
/// the delegate's process group is killed, ADD fails with code 11 naming it, everything ADD
/// had built is taken down again, and no process is left.
#[test]
fn bridge_add_with_an_ipam_that_never_answers_fails_with_11_and_leaves_nothing() {
    let w = World::new(&["bridge"]);
    let pids = w.odd.join("pids");
    never_answering_plugin(w.cni_path.path(), "stuck-ipam", &pids);
    let mut conf = bridge_base(&w);
    conf["ipam"]["type"] = json!("stuck-ipam");
    let before = w.snapshot();
    let out = Exec::new("bridge")
        .in_ns(&w.host)
        .attachment("ADD", "hostile-ctr", w.ctr.path_str(), "eth0", w.cni_path.str())
        .env("CNI_CHILD_TIMEOUT_MS", "700")
        .run(&conf.to_string());
    let msg = out.err(11);
    assert!(msg.contains("stuck-ipam did not finish within 700 ms"), "{msg}");
    assert_eq!(before, w.snapshot(), "host state changed");
    assert_all_gone(&pids);
}

/// cnitool's runner: a plugin of the list that never answers is killed at the deadline and
/// the verb fails with code 11; nothing is cached, no process is left.
#[test]
fn cnitool_plugin_that_never_answers_is_killed_at_the_deadline() {
    let w = World::new(&[]);
    let pids = w.odd.join("pids");
    never_answering_plugin(w.cni_path.path(), "stuck", &pids);
    let conf = TempDir::new("hostile-conf");
    let cache = TempDir::new("hostile-cache");
    let list = json!({"cniVersion": "1.1.0", "name": "stuck", "plugins": [{"type": "stuck"}]});
    std::fs::write(conf.join("10-stuck.conflist"), list.to_string()).unwrap();
    let before = format!("{}\n{:?}", w.snapshot(), dir_state(cache.path()));
    let out = w
        .host
        .command(cni_tests::bin("cnitool"))
        .args(["add", "stuck", w.ctr.path_str()])
        .env("CNI_PATH", w.cni_path.path())
        .env("NETCONFPATH", conf.path())
        .env("CNI_CACHE_DIR", cache.path())
        .env("CNI_CHILD_TIMEOUT_MS", "500")
        .output()
        .expect("run cnitool");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("stuck did not finish within 500 ms"), "{stderr}");
    assert_eq!(before, format!("{}\n{:?}", w.snapshot(), dir_state(cache.path())), "state changed");
    assert_all_gone(&pids);
}

/// cnitool reads configuration files only when they are regular files, and at most 8 MiB: a
/// FIFO named like a configuration does not block it, a huge one is refused.
#[test]
fn cnitool_refuses_fifo_and_huge_configuration_files() {
    let w = World::new(&["loopback"]);
    let tool = cni_tests::bin("cnitool");
    for (what, make) in [
        ("FIFO", Box::new(|p: &std::path::Path| mknod(p, libc::S_IFIFO)) as Box<dyn Fn(&std::path::Path)>),
        ("huge", Box::new(|p: &std::path::Path| std::fs::write(p, vec![b' '; (8 << 20) + 1]).unwrap())),
    ] {
        let conf = TempDir::new("hostile-conf");
        let cache = TempDir::new("hostile-cache");
        make(&conf.join("10-odd.conflist"));
        let before = w.snapshot();
        let out = w
            .host
            .command(&tool)
            .args(["add", "odd", w.ctr.path_str()])
            .env("CNI_PATH", w.cni_path.path())
            .env("NETCONFPATH", conf.path())
            .env("CNI_CACHE_DIR", cache.path())
            .output()
            .expect("run cnitool");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what}: succeeded");
        let want = if what == "FIFO" { "not a regular file" } else { "larger than 8388608 bytes" };
        assert!(stderr.contains(want), "{what}: {stderr}");
        assert_eq!(before, w.snapshot(), "{what}: host state changed");
        assert!(dir_state(cache.path()).is_empty(), "{what}: something cached");
    }
}
