//! The second variant of behaviours whose first variant is tested beside the code (issue 28):
//! the other address family, dual stack listed IPv6 first, the other shape of the same input.

use cni_common::net::container_addrs;
use cni_common::spec::result::{CniResult, Interface, IpConfig};
use ipnet::IpNet;

fn net(a: &str) -> IpNet {
    a.parse().unwrap()
}

fn prev_of(addrs: &[&str]) -> CniResult {
    CniResult {
        interfaces: vec![Interface {
            name: "eth0".into(),
            sandbox: "/run/netns/x".into(),
            ..Default::default()
        }],
        ips: addrs.iter().map(|a| IpConfig { interface: Some(0), address: net(a), gateway: None }).collect(),
        ..Default::default()
    }
}

#[test]
fn container_addresses_listed_ipv6_first_are_found_as_ipv4_first() {
    let v4_first = prev_of(&["10.0.0.5/24", "fd00::5/64"]);
    let v6_first = prev_of(&["fd00::5/64", "10.0.0.5/24"]);
    let want = (Some(net("10.0.0.5/24")), Some(net("fd00::5/64")));
    assert_eq!(container_addrs(&v4_first, "eth0").unwrap(), want);
    assert_eq!(container_addrs(&v6_first, "eth0").unwrap(), want);
    // Two of each, IPv6 first: the first of each family, whatever the other family's place.
    let mixed = prev_of(&["fd00::5/64", "fd00::6/64", "10.0.0.5/24", "10.0.0.6/24"]);
    assert_eq!(container_addrs(&mixed, "eth0").unwrap(), want);
    // One family alone, either one.
    assert_eq!(container_addrs(&prev_of(&["fd00::5/64"]), "eth0").unwrap(), (None, Some(net("fd00::5/64"))));
    assert_eq!(
        container_addrs(&prev_of(&["10.0.0.5/24"]), "eth0").unwrap(),
        (Some(net("10.0.0.5/24")), None)
    );
}

/// A plugin the skeleton must never reach: every test here expects it to refuse first.
struct Unreachable;

impl cni_common::skel::Plugin for Unreachable {
    fn name(&self) -> &'static str {
        "unreachable"
    }
    fn add(&self, _: &cni_common::skel::Request) -> cni_common::Result<CniResult> {
        panic!("ADD reached the plugin")
    }
    fn del(&self, _: &cni_common::skel::Request) -> cni_common::Result<()> {
        panic!("DEL reached the plugin")
    }
    fn check(&self, _: &cni_common::skel::Request) -> cni_common::Result<()> {
        panic!("CHECK reached the plugin")
    }
    fn gc(&self, _: &cni_common::skel::Request) -> cni_common::Result<()> {
        panic!("GC reached the plugin")
    }
    fn status(&self, _: &cni_common::skel::Request) -> cni_common::Result<()> {
        panic!("STATUS reached the plugin")
    }
}

/// A bind mount of the calling thread's network namespace on a file of a scratch directory
/// (as `ip netns add` makes `/run/netns/NAME`), unmounted and removed on drop.
struct BoundHere(std::path::PathBuf);

impl BoundHere {
    fn new() -> BoundHere {
        let dir = std::env::temp_dir().join(format!("cni-common-twins-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("here");
        std::fs::write(&file, b"").unwrap();
        let c = |p: &std::path::Path| std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        let src = c(std::path::Path::new("/proc/thread-self/ns/net"));
        let dst = c(&file);
        // SAFETY: both are NUL-terminated paths; a bind mount takes no filesystem type or data.
        let rc = unsafe {
            libc::mount(src.as_ptr(), dst.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null())
        };
        assert_eq!(
            rc,
            0,
            "bind mount of the test's namespace: {} (run as root)",
            std::io::Error::last_os_error()
        );
        BoundHere(file)
    }
}

impl Drop for BoundHere {
    fn drop(&mut self) {
        let p = std::ffi::CString::new(self.0.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        unsafe { libc::umount2(p.as_ptr(), libc::MNT_DETACH) };
        let _ = std::fs::remove_dir_all(self.0.parent().unwrap());
    }
}

/// CNI_NETNS naming the plugin's own namespace is refused (code 8) however the path names it:
/// the calling thread's, the process's, by PID and TID, or a bind mount of it. The first is
/// tested in tests/skel.rs; the others must be told by the namespace's identity, not the path.
#[test]
fn the_plugins_own_namespace_is_refused_by_every_path_that_names_it() {
    let bound = BoundHere::new();
    let pid = std::process::id();
    let tid = nix::unistd::gettid();
    let paths = [
        "/proc/thread-self/ns/net".to_string(),
        "/proc/self/ns/net".to_string(),
        format!("/proc/{pid}/ns/net"),
        format!("/proc/{pid}/task/{tid}/ns/net"),
        bound.0.to_str().unwrap().to_string(),
    ];
    for netns in paths {
        for cmd in ["ADD", "CHECK"] {
            let env: std::collections::HashMap<&str, String> = [
                ("CNI_COMMAND", cmd.to_string()),
                ("CNI_CONTAINERID", "ctr1".into()),
                ("CNI_NETNS", netns.clone()),
                ("CNI_IFNAME", "eth0".into()),
                ("CNI_PATH", "/nonexistent".into()),
            ]
            .into();
            let conf = r#"{"cniVersion":"1.1.0","name":"n","type":"unreachable","prevResult":{"cniVersion":"1.1.0"}}"#;
            let (mut out, mut err) = (Vec::new(), Vec::new());
            let code = cni_common::skel::run_with(
                &Unreachable,
                |k| env.get(k).cloned(),
                &mut conf.as_bytes(),
                &mut out,
                &mut err,
            );
            let out = String::from_utf8(out).unwrap();
            assert_ne!(code, 0, "{cmd} {netns}: {out}");
            assert!(out.contains("\"code\": 8") || out.contains("\"code\":8"), "{cmd} {netns}: {out}");
            assert!(out.contains("should not be the same"), "{cmd} {netns}: {out}");
        }
    }
}

/// A recordable CNI_NETNS path is made of allowed bytes only: one byte that could break a
/// record's line or need escaping anywhere in it, first or last or between good ones, makes
/// it unrecordable (not just a path made entirely of them).
#[test]
fn a_path_with_one_unrecordable_byte_anywhere_is_not_recordable() {
    use cni_common::nsident::recordable_path;
    assert!(recordable_path("/var/run/netns/cni-1234_a.b:c@d,e=f+g-h~", 64));
    for bad in [
        "/var/run/netns/with space",
        "/var/run/netns/new\nline",
        "/var/run/netns/tab\there",
        " /var/run/netns/x",
        "/var/run/netns/x ",
        "/var/run/netns/caf\u{e9}",
        "/var/run/netns/quote\"d",
        "/var/run/netns/back\\slash",
        "/var/run/netns/nul\0",
    ] {
        assert!(!recordable_path(bad, 64), "{bad:?}");
    }
    // The length limit, at its boundary.
    let p = format!("/{}", "a".repeat(63));
    assert!(recordable_path(&p, 64));
    assert!(!recordable_path(&format!("{p}b"), 64));
    assert!(!recordable_path("", 64));
}
