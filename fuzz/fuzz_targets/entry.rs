//! Every input a runtime controls, through the plugins' own entry points (issue 27): the
//! environment (`CNI_COMMAND`, `CNI_CONTAINERID` up to beyond the 1 024-byte bound,
//! `CNI_IFNAME` of any length and encoding, `CNI_ARGS`, `CNI_NETNS`) and stdin, built from the
//! fuzzer's bytes and run by the skeleton's dispatch (`run_with`) with bridge, host-local,
//! portmap and bandwidth. Invariants: no panic, exit status 0 or 1, exactly one JSON document on
//! stdout for ADD, VERSION and every failure, a failure carries a spec code, silent success
//! otherwise.
//!
//! The verbs act for real where the skeleton lets them (DEL and GC go on without a namespace),
//! so the process first jails itself (once): a network namespace of its own, a mount namespace
//! in which the whole tree is read-only but the fuzz directory (corpus, artifacts), and fresh
//! tmpfs over `/tmp` and `/run` (no namespace of the machine is reachable through
//! `/run/netns`), the fuzz directory bound back over them when it lives below one (a checkout
//! under /tmp). `CNI_NETNS` values naming `proc` are replaced (`/proc/1/ns/net` is the
//! machine's namespace), and `CNI_PATH` is fixed to an empty directory: a fuzzed IPAM type on a
//! fuzzed path could exec any program of the machine. Run as root (scripts/fuzz.sh).
#![no_main]

use cni_common::skel::{run_with, Plugin};
use libfuzzer_sys::fuzz_target;
use std::ffi::CString;
use std::sync::Once;

static JAIL: Once = Once::new();

fn check(rc: libc::c_int, what: &str) {
    assert!(rc == 0, "{what}: {}", std::io::Error::last_os_error());
}

fn c(s: &str) -> CString {
    CString::new(s).expect("no NUL")
}

/// `struct mount_attr` of mount_setattr(2).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

const AT_RECURSIVE: libc::c_uint = 0x8000;
const MOUNT_ATTR_RDONLY: u64 = 0x1;

fn setattr(path: &str, set: u64, clr: u64) {
    let attr = MountAttr { attr_set: set, attr_clr: clr, propagation: 0, userns_fd: 0 };
    let p = c(path);
    // SAFETY: mount_setattr(2) with a valid path and a struct of the size passed.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            p.as_ptr(),
            AT_RECURSIVE,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    check(rc as libc::c_int, &format!("mount_setattr {path}"));
}

fn jail() {
    JAIL.call_once(|| {
        let cwd = std::env::current_dir().expect("cwd").to_str().expect("a UTF-8 cwd").to_string();
        let none = std::ptr::null::<libc::c_char>();
        // SAFETY: plain syscalls with valid C strings or null where the kernel allows it.
        unsafe {
            check(libc::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWNET), "unshare (run as root)");
            check(
                libc::mount(none, c("/").as_ptr(), none, libc::MS_REC | libc::MS_PRIVATE, std::ptr::null()),
                "private /",
            );
            check(
                libc::mount(
                    c(&cwd).as_ptr(),
                    c(&cwd).as_ptr(),
                    none,
                    libc::MS_BIND | libc::MS_REC,
                    std::ptr::null(),
                ),
                "bind the fuzz directory",
            );
        }
        setattr("/", MOUNT_ATTR_RDONLY, 0);
        setattr(&cwd, 0, MOUNT_ATTR_RDONLY);
        for dir in ["/tmp", "/run"] {
            // SAFETY: as above.
            unsafe {
                check(
                    libc::mount(
                        c("tmpfs").as_ptr(),
                        c(dir).as_ptr(),
                        c("tmpfs").as_ptr(),
                        0,
                        std::ptr::null(),
                    ),
                    dir,
                );
            }
        }
        // A fuzz directory below /tmp or /run (a checkout under /tmp) is hidden by those
        // tmpfs, and libFuzzer writes its corpus and artifacts by absolute path: bind it back
        // at its own path from the working directory, which still is the covered directory
        // (a mount hides a path, not a directory a process already holds).
        if cwd.starts_with("/tmp/") || cwd.starts_with("/run/") {
            std::fs::create_dir_all(&cwd).expect("the fuzz directory's path on the tmpfs");
            // SAFETY: as above.
            unsafe {
                check(
                    libc::mount(
                        c(".").as_ptr(),
                        c(&cwd).as_ptr(),
                        none,
                        libc::MS_BIND | libc::MS_REC,
                        std::ptr::null(),
                    ),
                    "bind the fuzz directory back over the tmpfs",
                );
            }
        }
        std::fs::create_dir_all("/run/netns").expect("/run/netns");
        std::fs::create_dir_all("/tmp/cni-path").expect("an empty CNI_PATH");
    });
}

/// The next field of `data`: a length byte, then that many bytes (lossy UTF-8: a runtime's
/// environment reaches the skeleton as strings).
fn field(data: &mut &[u8]) -> String {
    let Some((&n, rest)) = data.split_first() else { return String::new() };
    let n = usize::from(n).min(rest.len());
    let (f, rest) = rest.split_at(n);
    *data = rest;
    String::from_utf8_lossy(f).into_owned()
}

const CODES: [u64; 13] = [1, 2, 3, 4, 5, 6, 7, 8, 11, 50, 51, 999, 0];

fn drive(plugin: &impl Plugin, verb: &str, env: &[(&str, String)], stdin: &[u8]) {
    let get = |k: &str| env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone());
    let mut out = Vec::new();
    let code = run_with(plugin, get, &mut &stdin[..], &mut out, &mut Vec::new());
    assert!(code == 0 || code == 1, "exit code {code}");
    let text = std::str::from_utf8(&out).expect("stdout is UTF-8");
    if code == 1 || (verb == "ADD" && code == 0) || verb == "VERSION" {
        let mut docs = serde_json::Deserializer::from_str(text).into_iter::<serde_json::Value>();
        let doc = docs.next().expect("one document").expect("valid JSON");
        assert!(docs.next().is_none(), "exactly one document");
        if code == 1 {
            let c = doc["code"].as_u64().expect("an error has a code");
            assert!(CODES.contains(&c), "code {c} not in the spec");
        }
    } else if !verb.is_empty() {
        assert!(out.is_empty(), "silent success: {text}");
    }
}

fuzz_target!(|data: &[u8]| {
    jail();
    let Some((&sel, mut rest)) = data.split_first() else { return };
    let verbs = ["ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION", "", "add"];
    let verb = verbs[usize::from(sel & 7)];
    let mut id = field(&mut rest);
    if sel & 0x08 != 0 {
        // long ids: around the veth alias limit and beyond the bound at the edge
        let n = usize::from(rest.first().copied().unwrap_or(0)) * 5;
        id = id.repeat(1 + n / id.len().max(1));
    }
    let ifname = field(&mut rest);
    let args = field(&mut rest);
    let mut netns = field(&mut rest);
    if netns.contains("proc") {
        netns = "/nonexistent/fuzz".into();
    }
    let env = [
        ("CNI_COMMAND", verb.to_string()),
        ("CNI_CONTAINERID", id),
        ("CNI_IFNAME", ifname),
        ("CNI_ARGS", args),
        ("CNI_NETNS", netns),
        ("CNI_PATH", "/tmp/cni-path".to_string()),
    ];
    match (sel >> 4) % 4 {
        0 => drive(&bridge::Bridge, verb, &env, rest),
        1 => drive(&host_local::HostLocal, verb, &env, rest),
        2 => drive(&portmap::plugin::Portmap, verb, &env, rest),
        _ => drive(&bandwidth::Bandwidth, verb, &env, rest),
    }
});
