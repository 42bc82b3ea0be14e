//! Harness for the process-level tests: exec a host-local binary with CNI_* env and stdin.
#![allow(dead_code)]

use serde_json::Value;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

pub const OURS: &str = env!("CARGO_BIN_EXE_host-local");
/// Debian's containernetworking-plugins 1.1.1.
pub const UPSTREAM: &str = "/usr/lib/cni/host-local";

pub const ALL_VERSIONS: [&str; 7] = ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// A fresh network namespace standing in for the container's, deleted on drop. host-local
/// never enters it; it exists so CNI_NETNS passes the skeleton's real checks.
pub struct Netns {
    pub name: String,
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

impl Netns {
    pub fn new() -> Netns {
        let name = format!("hl-test-{}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed));
        let st = Command::new("ip").args(["netns", "add", &name]).status().expect("run ip netns add");
        assert!(st.success(), "ip netns add {name} failed (the process tests need root and iproute2)");
        Netns { name }
    }

    pub fn path(&self) -> String {
        format!("/run/netns/{}", self.name)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

#[derive(Debug)]
pub struct Out {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
    pub json: Value,
}

impl Out {
    pub fn code(&self) -> u64 {
        self.json["code"].as_u64().unwrap_or(0)
    }
    pub fn msg(&self) -> &str {
        self.json["msg"].as_str().unwrap_or("")
    }
    /// Fail with everything the plugin said unless it succeeded.
    pub fn expect_ok(self) -> Out {
        assert!(self.ok, "plugin failed: stdout={} stderr={}", self.stdout, self.stderr);
        self
    }
    pub fn expect_err(self, code: u64, msg_part: &str) -> Out {
        assert!(!self.ok, "plugin unexpectedly succeeded: {}", self.stdout);
        assert_eq!(self.code(), code, "error code; output {}", self.stdout);
        assert!(self.msg().contains(msg_part), "message {:?} lacks {msg_part:?}", self.msg());
        self
    }
}

/// One invocation's environment.
pub struct Call<'a> {
    pub bin: &'a str,
    pub command: &'a str,
    pub id: &'a str,
    pub ifname: &'a str,
    pub netns: String,
    pub args: &'a str,
}

impl<'a> Call<'a> {
    pub fn new(bin: &'a str, command: &'a str, id: &'a str, ns: &Netns) -> Call<'a> {
        Call { bin, command, id, ifname: "eth0", netns: ns.path(), args: "" }
    }
    pub fn ifname(mut self, i: &'a str) -> Self {
        self.ifname = i;
        self
    }
    pub fn args(mut self, a: &'a str) -> Self {
        self.args = a;
        self
    }

    pub fn command(&self) -> Command {
        let mut c = Command::new(self.bin);
        c.env_clear()
            .env("CNI_COMMAND", self.command)
            .env("CNI_PATH", "/usr/lib/cni")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if matches!(self.command, "ADD" | "DEL" | "CHECK") {
            c.env("CNI_CONTAINERID", self.id).env("CNI_IFNAME", self.ifname).env("CNI_NETNS", &self.netns);
        }
        if !self.args.is_empty() {
            c.env("CNI_ARGS", self.args);
        }
        c
    }

    pub fn run_raw(&self, stdin: &[u8]) -> Out {
        let mut child = self.command().spawn().expect("spawn plugin");
        // A plugin may exit without reading stdin (VERSION, env errors): EPIPE is expected then.
        if let Err(e) = child.stdin.take().unwrap().write_all(stdin) {
            assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "write plugin stdin: {e}");
        }
        finish(child)
    }

    pub fn run(&self, conf: &Value) -> Out {
        self.run_raw(conf.to_string().as_bytes())
    }
}

pub fn finish(child: std::process::Child) -> Out {
    let o = child.wait_with_output().expect("wait plugin");
    let stdout = String::from_utf8_lossy(&o.stdout).to_string();
    let json = serde_json::from_str(&stdout).unwrap_or(Value::Null);
    Out { ok: o.status.success(), stdout, stderr: String::from_utf8_lossy(&o.stderr).to_string(), json }
}

/// Every file under `dir` with its content, recursively (for "store untouched" assertions).
pub fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    fn walk(d: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
        let Ok(rd) = std::fs::read_dir(d) else { return };
        for e in rd {
            let e = e.unwrap();
            let p = e.path();
            if p.is_dir() {
                out.insert(p.clone(), b"<dir>".to_vec());
                walk(&p, out);
            } else {
                out.insert(p.clone(), std::fs::read(&p).unwrap());
            }
        }
    }
    walk(dir, &mut out);
    out
}

/// Reservation files (named by an IP) in a network directory, sorted, with content.
pub fn reservations(netdir: &Path) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = std::fs::read_dir(netdir)
        .map(|rd| {
            rd.filter_map(|e| {
                let e = e.ok()?;
                let name = e.file_name().into_string().ok()?;
                name.parse::<std::net::IpAddr>().ok()?;
                Some((name, std::fs::read_to_string(e.path()).ok()?))
            })
            .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The addresses (without prefix) in an ADD result of any version.
pub fn result_ips(v: &Value) -> Vec<String> {
    let strip = |s: &str| s.split('/').next().unwrap().to_string();
    if let Some(ips) = v["ips"].as_array() {
        return ips.iter().map(|i| strip(i["address"].as_str().unwrap())).collect();
    }
    let mut out = Vec::new();
    for k in ["ip4", "ip6"] {
        if let Some(s) = v[k]["ip"].as_str() {
            out.push(strip(s));
        }
    }
    out
}
