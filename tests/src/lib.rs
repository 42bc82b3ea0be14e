//! Test harness for the end-to-end tests.
//!
//! Every test builds its own world out of network namespaces: a fake **host** netns in which
//! the plugins run (so bridges, veth host ends, nftables rules, qdiscs and sysctls never touch
//! the machine), one or more **container** netns, and scratch directories for CNI_PATH,
//! dataDir and caches. Everything is removed when the guards drop, also when a test fails.
//!
//! Tests need root. They do not skip: if a namespace cannot be made, the test fails and says
//! why. The one exception is a kernel feature some machines lack, and that skip is visible:
//! [`skip_unless`] (module `skip`).

use serde_json::Value;
use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::SystemTime;

/// The workspace root (the directory holding the top-level Cargo.toml).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}

/// The commit whose portmap wrote the released layout (1): main before portmap's rebuild.
pub const RELEASED: &str = "5fca5c6";

/// The portmap binary of [`RELEASED`], built by scripts/build-baseline.sh (unoptimised: the
/// layout it writes is what matters; it keeps its builds under target/baseline/, so only the
/// first call builds).
pub fn released_portmap() -> String {
    let root = workspace_root();
    let out = Command::new(root.join("scripts/build-baseline.sh"))
        .args([RELEASED, "portmap"])
        .env("BASELINE_PROFILE", "dev")
        .current_dir(&root)
        .output()
        .expect("run scripts/build-baseline.sh");
    assert!(
        out.status.success(),
        "cannot build portmap of {RELEASED} with scripts/build-baseline.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = String::from_utf8(out.stdout).unwrap().lines().last().expect("the directory").to_string();
    format!("{dir}/portmap")
}

/// Directory with the built binaries: `CNI_TEST_BIN_DIR`, else `target/debug`.
pub fn bin_dir() -> PathBuf {
    match std::env::var_os("CNI_TEST_BIN_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => {
            let target = std::env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| workspace_root().join("target"));
            target.join("debug")
        }
    }
}

/// Newest modification time of the files below `dir` that cargo builds from (Rust sources and
/// manifests; a README edit does not make a binary stale).
fn newest_mtime(dir: &Path) -> Option<SystemTime> {
    let mut newest = None;
    let entries = std::fs::read_dir(dir).ok()?;
    for e in entries.flatten() {
        let p = e.path();
        let built_from =
            p.extension().is_some_and(|x| x == "rs") || p.file_name().is_some_and(|n| n == "Cargo.toml");
        let t = if p.is_dir() {
            newest_mtime(&p)
        } else if built_from {
            e.metadata().ok().and_then(|m| m.modified().ok())
        } else {
            None
        };
        if let Some(t) = t {
            if newest.is_none_or(|n| t > n) {
                newest = Some(t);
            }
        }
    }
    newest
}

/// Where a binary's sources live, for the staleness check.
fn source_dirs(name: &str) -> Vec<PathBuf> {
    let root = workspace_root();
    let own = match name {
        "cnitool" => root.join("tools/cnitool"),
        "cni-migrate" => root.join("tools/migrate"),
        _ => root.join("plugins").join(name),
    };
    let mut dirs = vec![own.join("src"), root.join("cni-common/src")];
    if name == "bridge" || name == "ptp" {
        dirs.push(root.join("plugins/host-local/src")); // linked in: it runs host-local in-process
    }
    if name == "cni-migrate" {
        // linked in: it reads and rebuilds their state with their own libraries
        for p in ["bridge", "host-local", "portmap", "bandwidth"] {
            dirs.push(root.join("plugins").join(p).join("src"));
        }
        dirs.push(root.join("tools/cnitool/src"));
    }
    dirs
}

/// The files cargo built a binary from, from the dep-info file it writes beside the binary
/// (`<bin>.d`: `<bin>: <source> <source> …`, spaces in paths escaped). Exactly the files whose
/// change makes cargo rebuild it: a test-only module (`#[cfg(test)] mod tests;`) or another
/// binary's `main.rs` is not among them, so editing those never makes the binary "stale" in a
/// way `cargo build` would not clear.
fn dep_info_sources(bin: &Path) -> Option<Vec<PathBuf>> {
    let text = std::fs::read_to_string(bin.with_extension("d")).ok()?;
    let line = text.lines().next()?;
    let (_, deps) = line.split_once(": ")?;
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = deps.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&' ') => {
                cur.push(' ');
                chars.next();
            }
            ' ' => {
                if !cur.is_empty() {
                    out.push(PathBuf::from(std::mem::take(&mut cur)));
                }
            }
            _ => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(PathBuf::from(cur));
    }
    (!out.is_empty()).then_some(out)
}

/// Path of a built binary (`loopback`, `bridge`, `cnitool`, …). Fails the test if it is
/// missing or older than its sources: run `cargo build --workspace --bins` (scripts/test.sh
/// does) before the tests. The sources are the ones cargo recorded for that binary
/// ([`dep_info_sources`]); without that record, every Rust file of the crates it links.
pub fn bin(name: &str) -> PathBuf {
    let p = bin_dir().join(name);
    let meta = std::fs::metadata(&p).unwrap_or_else(|e| {
        panic!("binary {} missing ({e}): build first with `cargo build --workspace --bins`", p.display())
    });
    if std::env::var_os("CNI_TEST_BIN_DIR").is_none() {
        let built = meta.modified().expect("mtime");
        let stale = |src: SystemTime, what: &Path| {
            assert!(
                src <= built,
                "binary {} is older than its source {}: rebuild with `cargo build --workspace --bins`",
                p.display(),
                what.display()
            )
        };
        match dep_info_sources(&p) {
            Some(files) => {
                for f in files {
                    // a source that is gone was removed since the build: cargo rebuilds then
                    match std::fs::metadata(&f).and_then(|m| m.modified()) {
                        Ok(t) => stale(t, &f),
                        Err(_) => panic!(
                            "binary {} was built from {}, which is gone: rebuild with `cargo build --workspace --bins`",
                            p.display(),
                            f.display()
                        ),
                    }
                }
            }
            None => {
                for d in source_dirs(name) {
                    if let Some(src) = newest_mtime(&d) {
                        stale(src, &d);
                    }
                }
            }
        }
    }
    p
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A short name unique to this process and call: `<prefix><pid36><n>` (<= 15 bytes so it can
/// also be used for interface names).
pub fn unique(prefix: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let pid = std::process::id();
    let s = format!("{prefix}{}{n}", radix36(pid as u64));
    assert!(s.len() <= 15, "unique name {s} too long: shorten the prefix");
    s
}

fn radix36(mut v: u64) -> String {
    const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(DIGITS[(v % 36) as usize]);
        v /= 36;
        if v == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).unwrap()
}

/// Run a command, panicking with its output if it cannot start or fails.
pub fn sh(program: &str, args: &[&str]) -> Output {
    let out = Command::new(program).args(args).output().unwrap_or_else(|e| {
        panic!("cannot run {program}: {e} (is it installed? scripts/test.sh installs it)")
    });
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A named network namespace (`ip netns add`), deleted on drop.
pub struct Netns {
    name: String,
    path: PathBuf,
    file: File,
}

impl Netns {
    /// Create a fresh namespace named `<prefix>…`, with `lo` left down as the kernel makes it.
    pub fn new(prefix: &str) -> Netns {
        let name = unique(prefix);
        let out = Command::new("ip").args(["netns", "add", &name]).output().expect("run ip");
        assert!(
            out.status.success(),
            "cannot create network namespace {name}: {} — these tests need root and netns support",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        let path = PathBuf::from("/run/netns").join(&name);
        let file = File::open(&path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
        Netns { name, path, file }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The bind-mounted path, as a runtime would pass it in CNI_NETNS.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn path_str(&self) -> &str {
        self.path.to_str().expect("utf-8 path")
    }

    /// A path to this namespace that any mount namespace can open while this handle lives:
    /// the harness's own descriptor of it under /proc (a scratch node binds it at
    /// [`Netns::path`] inside: `node::Node::adopt`).
    pub fn fd_path(&self) -> String {
        format!("/proc/{}/fd/{}", std::process::id(), self.file.as_raw_fd())
    }

    /// Move the calling thread into this namespace for good (benchmark drivers do this once so
    /// that children are spawned without a pre-exec hook, i.e. with the cheap vfork path).
    pub fn enter_current_thread(&self) {
        nix::sched::setns(&self.file, nix::sched::CloneFlags::CLONE_NEWNET)
            .unwrap_or_else(|e| panic!("setns into {}: {e}", self.name));
    }

    /// A command that will run inside this namespace (setns between fork and exec).
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut cmd = Command::new(program);
        let fd = self.file.as_raw_fd();
        // SAFETY: setns is async-signal-safe; the fd stays open in the parent for the whole call.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd
    }

    /// Run `program args` in this namespace; panics on failure.
    pub fn run(&self, program: &str, args: &[&str]) -> Output {
        let out = self
            .command(program)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {program} in {}: {e}", self.name));
        assert!(
            out.status.success(),
            "{program} {args:?} in netns {} failed: {}{}",
            self.name,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// Run `program args` in this namespace, returning the output whatever the status.
    pub fn try_run(&self, program: &str, args: &[&str]) -> Output {
        self.command(program)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {program} in {}: {e}", self.name))
    }

    /// `ip -j <args>` in this namespace, parsed.
    pub fn ip_json(&self, args: &[&str]) -> Value {
        let mut all = vec!["-j"];
        all.extend_from_slice(args);
        let out = self.run("ip", &all);
        if out.stdout.iter().all(|b| b.is_ascii_whitespace()) {
            return Value::Array(vec![]);
        }
        serde_json::from_slice(&out.stdout).expect("ip -j prints JSON")
    }

    /// The link named `name`, as `ip -j -d link show` prints it, or None.
    pub fn link(&self, name: &str) -> Option<Value> {
        let out = self.try_run("ip", &["-j", "-d", "link", "show", "dev", name]);
        if !out.status.success() {
            return None;
        }
        let v: Value = serde_json::from_slice(&out.stdout).expect("ip -j prints JSON");
        v.as_array().and_then(|a| a.first().cloned())
    }

    /// Wait (bounded) until the kernel has finished bringing up `dev`, a link set up whose
    /// carrier comes (one end of a veth pair whose both ends are up, or a bridge with a port
    /// up): its operational state (the `state` and `NO-CARRIER` of `ip link`), its IPv6
    /// link-local address (not tentative) and that address's local route. The kernel does
    /// this after `ip link set up` returns, in its link-watch work, which runs at most once a
    /// second for the whole machine: with other tests changing links beside this one it comes
    /// up to a second later, and a snapshot taken before it ([`ns_state`]) differs from every
    /// later one although no plugin changed anything.
    pub fn settle(&self, dev: &str) {
        let what = format!("{dev} in {} to come up", self.name);
        wait_until(&what, std::time::Duration::from_secs(10), || {
            let up = self.link(dev).is_some_and(|l| l["operstate"] == "UP");
            let link_local = || {
                let a = self.ip_json(&["-6", "addr", "show", "dev", dev, "scope", "link", "-tentative"]);
                a.as_array().is_some_and(|a| !a.is_empty())
            };
            let local_route = || {
                let r = self.run("ip", &["-6", "route", "show", "table", "local", "dev", dev]);
                String::from_utf8_lossy(&r.stdout).lines().any(|l| l.starts_with("local fe80::"))
            };
            up && link_local() && local_route()
        });
    }

    /// Whether link `name` has IFF_UP set.
    pub fn link_is_up(&self, name: &str) -> bool {
        let l = self.link(name).unwrap_or_else(|| panic!("no link {name} in {}", self.name));
        l["flags"].as_array().is_some_and(|f| f.iter().any(|x| x == "UP"))
    }

    /// Names of all links in the namespace.
    pub fn link_names(&self) -> Vec<String> {
        self.ip_json(&["link", "show"])
            .as_array()
            .map(|a| a.iter().filter_map(|l| l["ifname"].as_str().map(str::to_string)).collect())
            .unwrap_or_default()
    }

    /// Addresses (CIDR text) on `dev`.
    pub fn addrs(&self, dev: &str) -> Vec<String> {
        let v = self.ip_json(&["addr", "show", "dev", dev]);
        let mut out = Vec::new();
        for l in v.as_array().into_iter().flatten() {
            for a in l["addr_info"].as_array().into_iter().flatten() {
                out.push(format!("{}/{}", a["local"].as_str().unwrap_or(""), a["prefixlen"]));
            }
        }
        out
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let out = Command::new("ip").args(["netns", "del", &self.name]).output();
        if let Ok(o) = out {
            if !o.status.success() && !std::thread::panicking() {
                panic!("cannot delete netns {}: {}", self.name, String::from_utf8_lossy(&o.stderr));
            }
        }
    }
}

/// A named network namespace held only by its bind mount in `/run/netns` (this harness keeps
/// no descriptor of it, unlike [`Netns`]), as a runtime leaves a pod's namespace: after
/// [`PodNetns::delete`] (`ip netns del`) it is gone. Deleted on drop if still there.
pub struct PodNetns {
    name: String,
    path: String,
}

impl PodNetns {
    pub fn new(prefix: &str) -> PodNetns {
        PodNetns::named(&unique(prefix))
    }

    /// A namespace with exactly this name (e.g. a new namespace under a deleted one's name).
    pub fn named(name: &str) -> PodNetns {
        sh("ip", &["netns", "add", name]);
        PodNetns { name: name.to_string(), path: format!("/run/netns/{name}") }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    /// Remove the namespace (its bind mount), as a pod's namespace goes when the runtime
    /// tears the sandbox down or the node loses it.
    pub fn delete(mut self) {
        sh("ip", &["netns", "del", &self.name]);
        self.name.clear();
    }
}

impl Drop for PodNetns {
    fn drop(&mut self) {
        if !self.name.is_empty() {
            let _ = Command::new("ip").args(["netns", "del", &self.name]).output();
        }
    }
}

/// A scratch directory removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(prefix: &str) -> TempDir {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let base = std::env::temp_dir().join(format!("cni-{prefix}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&base).expect("create temp dir");
        TempDir(base)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
    pub fn join(&self, p: impl AsRef<Path>) -> PathBuf {
        self.0.join(p)
    }
    pub fn str(&self) -> &str {
        self.0.to_str().expect("utf-8 path")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A CNI_PATH directory holding symlinks to our built binaries (and nothing else), so a test
/// can be sure which `host-local` a `bridge` delegates to.
pub fn cni_path_with(names: &[&str]) -> TempDir {
    let d = TempDir::new("bin");
    for n in names {
        std::os::unix::fs::symlink(bin(n), d.join(n)).expect("symlink plugin");
    }
    d
}

/// The outcome of one plugin exec.
#[derive(Debug)]
pub struct PluginOutput {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    /// Peak resident set size of the plugin process (getrusage of the child), in KiB.
    pub max_rss_kib: u64,
}

impl PluginOutput {
    /// The single JSON document on stdout (asserts there is exactly one).
    pub fn json(&self) -> Value {
        let mut it = serde_json::Deserializer::from_str(&self.stdout).into_iter::<Value>();
        let v = it
            .next()
            .unwrap_or_else(|| panic!("no JSON on stdout; stderr: {}", self.stderr))
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", self.stdout));
        assert!(it.next().is_none(), "more than one JSON document on stdout: {}", self.stdout);
        v
    }

    /// Assert success and return the parsed result.
    pub fn ok(&self) -> Value {
        assert_eq!(self.code, 0, "plugin failed: stdout {} stderr {}", self.stdout, self.stderr);
        self.json()
    }

    /// Assert success with empty stdout (DEL, CHECK, GC, STATUS).
    pub fn ok_silent(&self) {
        assert_eq!(self.code, 0, "plugin failed: stdout {} stderr {}", self.stdout, self.stderr);
        assert!(self.stdout.trim().is_empty(), "unexpected stdout: {}", self.stdout);
    }

    /// Assert failure with a CNI error of `code`; returns the error message.
    pub fn err(&self, code: u64) -> String {
        assert_ne!(self.code, 0, "expected failure, got success: {}", self.stdout);
        let v = self.json();
        assert_eq!(v["code"], code, "wrong error code: {} (stderr {})", self.stdout, self.stderr);
        v["msg"].as_str().unwrap_or_default().to_string()
    }

    /// Assert failure with a CNI error of `code` whose message contains `part`; returns the
    /// output for further checks.
    pub fn err_with(self, code: u64, part: &str) -> PluginOutput {
        let msg = self.err(code);
        assert!(msg.contains(part), "message {msg:?} lacks {part:?}");
        self
    }

    /// Assert success; returns the output for further checks.
    pub fn success(self) -> PluginOutput {
        assert_eq!(self.code, 0, "plugin failed: stdout {} stderr {}", self.stdout, self.stderr);
        self
    }
}

/// The addresses (without prefix) of an ADD result of any version (`ips`, or 0.1/0.2 `ip4`/`ip6`).
pub fn result_ips(v: &Value) -> Vec<String> {
    let strip = |s: &str| s.split('/').next().unwrap_or_default().to_string();
    if let Some(ips) = v["ips"].as_array() {
        return ips.iter().filter_map(|i| i["address"].as_str()).map(strip).collect();
    }
    ["ip4", "ip6"].iter().filter_map(|k| v[*k]["ip"].as_str()).map(strip).collect()
}

/// host-local reservation files (named by an IP) of a network directory with their content,
/// sorted by name.
pub fn reservations(netdir: &Path) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = std::fs::read_dir(netdir)
        .map(|rd| {
            rd.filter_map(|e| {
                let e = e.ok()?;
                let name = e.file_name().into_string().ok()?;
                name.parse::<std::net::IpAddr>().ok()?;
                // only regular files: a FIFO planted by a test would block the read
                std::fs::symlink_metadata(e.path()).ok()?.is_file().then_some(())?;
                Some((name, std::fs::read_to_string(e.path()).ok()?))
            })
            .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// A host-local index header (plugins/host-local/src/index.rs has the layout) with a valid
/// checksum claiming `slots` slots: `1 << 59` makes `4096 + slots * 32` wrap to 4096, the
/// header's own length, which release builds once accepted.
pub fn crafted_index_header(slots: u64) -> Vec<u8> {
    let mut h = vec![0u8; 4096];
    h[..64].copy_from_slice(b"cni-rs host-local attachment index v1: not a reservation file.\n\n");
    h[64..72].copy_from_slice(&slots.to_le_bytes());
    let mut x: u64 = 0xcbf2_9ce4_8422_2325; // FNV-1a of the fields, then the part separator
    for b in h[64..136].iter().copied().chain([0xff]) {
        x = (x ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h[136..144].copy_from_slice(&x.to_le_bytes());
    h
}

/// Path of one of Debian's upstream plugins (`CNI_UPSTREAM_DIR`, default `/usr/lib/cni`);
/// fails the test when it is missing (scripts/install-deps.sh installs it).
pub fn upstream_bin(name: &str) -> PathBuf {
    let dir = std::env::var("CNI_UPSTREAM_DIR").unwrap_or_else(|_| "/usr/lib/cni".into());
    let p = Path::new(&dir).join(name);
    assert!(
        p.is_file(),
        "upstream plugin {} missing: apt-get install containernetworking-plugins",
        p.display()
    );
    p
}

/// The one CNI_* variable of the test runner's environment that plugins get: it forces bridge
/// to exec its IPAM delegate instead of running our host-local in-process.
pub const KEPT_ENV: &str = "CNI_IPAM_EXEC";

/// One invocation of a plugin binary: env + stdin, run inside a namespace (the fake host).
pub struct Exec<'a> {
    plugin: PathBuf,
    env: Vec<(String, String)>,
    in_ns: Option<&'a Netns>,
    /// A command the plugin runs under (`program args… <plugin>`), see [`Exec::under`].
    wrapper: Vec<String>,
}

impl<'a> Exec<'a> {
    /// `plugin` is a binary name (resolved with [`bin`]) or a path.
    pub fn new(plugin: &str) -> Exec<'a> {
        let plugin = if plugin.contains('/') { PathBuf::from(plugin) } else { bin(plugin) };
        Exec { plugin, env: Vec::new(), in_ns: None, wrapper: Vec::new() }
    }

    /// Run the plugin as the last argument of `command` (e.g. `unshare -m sh -c '… exec "$0"'`),
    /// which must exec it with the environment and stdio it got.
    pub fn under(mut self, command: &[&str]) -> Self {
        self.wrapper = command.iter().map(|s| s.to_string()).collect();
        self
    }

    /// Run the plugin in a private mount namespace in which `script` (sh) ran first, e.g. to hide
    /// a /proc/sys directory with a tmpfs. Nothing of it reaches the machine's mounts.
    pub fn in_private_mounts(self, script: &str) -> Self {
        self.under(&[
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-ec",
            &format!("{script}; exec \"$0\""),
        ])
    }

    /// Run inside `ns` (normally the fake host namespace).
    pub fn in_ns(mut self, ns: &'a Netns) -> Self {
        self.in_ns = Some(ns);
        self
    }

    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.retain(|(x, _)| x != k);
        self.env.push((k.into(), v.into()));
        self
    }

    /// The usual attachment environment.
    pub fn attachment(
        self,
        command: &str,
        container_id: &str,
        netns: &str,
        ifname: &str,
        cni_path: &str,
    ) -> Self {
        self.env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", container_id)
            .env("CNI_NETNS", netns)
            .env("CNI_IFNAME", ifname)
            .env("CNI_PATH", cni_path)
    }

    /// The command with the plugin's CNI environment (only what the test set), in the namespace.
    fn command(&self) -> Command {
        let program = self.wrapper.first().map(PathBuf::from).unwrap_or_else(|| self.plugin.clone());
        let mut cmd = match self.in_ns {
            Some(ns) => ns.command(&program),
            None => Command::new(&program),
        };
        if !self.wrapper.is_empty() {
            cmd.args(&self.wrapper[1..]).arg(&self.plugin);
        }
        for (k, _) in std::env::vars() {
            if k.starts_with("CNI_") && k != KEPT_ENV {
                cmd.env_remove(k);
            }
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        cmd
    }

    /// Start the plugin with `stdin` written and closed, and hand back the running process
    /// (fault-injection tests kill it midway).
    pub fn spawn(&self, stdin: &str) -> std::process::Child {
        let mut cmd = self.command();
        cmd.stdin(Stdio::piped()).stdout(Stdio::null()).stderr(Stdio::null());
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("exec {}: {e}", self.plugin.display()));
        {
            use std::io::Write;
            let mut input = child.stdin.take().expect("stdin");
            let _ = input.write_all(stdin.as_bytes());
        }
        child
    }

    /// [`Exec::run`] with a JSON document on stdin.
    pub fn run_json(&self, stdin: &Value) -> PluginOutput {
        self.run(&stdin.to_string())
    }

    pub fn run(&self, stdin: &str) -> PluginOutput {
        self.run_until(stdin, None)
    }

    /// [`Exec::run`], but a plugin still running after `limit` is killed and the test fails:
    /// for inputs that could make a plugin block (a FIFO where it expects a file).
    pub fn run_within(&self, stdin: &str, limit: std::time::Duration) -> PluginOutput {
        self.run_until(stdin, Some(std::time::Instant::now() + limit))
    }

    fn run_until(&self, stdin: &str, deadline: Option<std::time::Instant>) -> PluginOutput {
        let mut cmd = self.command();
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        // Reaped below with wait4 (for the resource usage), not with Child::wait.
        #[allow(clippy::zombie_processes)]
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("exec {}: {e}", self.plugin.display()));
        {
            use std::io::Write;
            let mut input = child.stdin.take().expect("stdin");
            let _ = input.write_all(stdin.as_bytes());
        }
        // Read both pipes (stderr on a thread so neither can fill up and block the plugin),
        // then reap the child with wait4 to get its resource usage.
        let mut err_pipe = child.stderr.take().expect("stderr");
        let err_reader = std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = std::io::Read::read_to_end(&mut err_pipe, &mut v);
            v
        });
        let mut out_pipe = child.stdout.take().expect("stdout");
        let out_reader = std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = std::io::Read::read_to_end(&mut out_pipe, &mut v);
            v
        });
        let pid = child.id() as libc::pid_t;
        let (code, max_rss_kib) = match deadline {
            None => wait4(pid, 0).expect("a blocking wait4 returns the child"),
            Some(end) => loop {
                if let Some(done) = wait4(pid, libc::WNOHANG) {
                    break done;
                }
                if std::time::Instant::now() >= end {
                    let _ = child.kill();
                    wait4(pid, 0);
                    let (out, err) =
                        (out_reader.join().unwrap_or_default(), err_reader.join().unwrap_or_default());
                    panic!(
                        "{} did not exit in time: killed; stdout {} stderr {}",
                        self.plugin.display(),
                        String::from_utf8_lossy(&out),
                        String::from_utf8_lossy(&err)
                    );
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            },
        };
        let out = out_reader.join().expect("stdout reader");
        let err = err_reader.join().expect("stderr reader");
        PluginOutput {
            code,
            stdout: String::from_utf8_lossy(&out).into_owned(),
            stderr: String::from_utf8_lossy(&err).into_owned(),
            max_rss_kib,
        }
    }
}

/// Reap `pid`: (exit code or -signal, peak RSS in KiB); None when `flags` has `WNOHANG` and it
/// is still running.
fn wait4(pid: libc::pid_t, flags: libc::c_int) -> Option<(i32, u64)> {
    let mut status = 0;
    // SAFETY: rusage is plain data; wait4 fills it for our own child.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: valid pointers to locals; pid is a child of this process not yet reaped.
        let r = unsafe { libc::wait4(pid, &mut status, flags, &mut ru) };
        if r == pid {
            break;
        }
        if r == 0 {
            return None;
        }
        let e = std::io::Error::last_os_error();
        assert_eq!(e.kind(), std::io::ErrorKind::Interrupted, "wait4({pid}): {e}");
    }
    let code = if libc::WIFEXITED(status) { libc::WEXITSTATUS(status) } else { -libc::WTERMSIG(status) };
    Some((code, ru.ru_maxrss as u64))
}

/// Snapshot of everything a plugin could change in a namespace: links, addresses, routes
/// (all tables), nftables ruleset, qdiscs and filters, and the sysctls we write. Used to
/// prove that bad input leaves the host exactly as it was.
pub fn ns_state(ns: &Netns) -> String {
    let mut s = String::new();
    for args in [
        &["-d", "link", "show"][..],
        &["addr", "show"],
        &["route", "show", "table", "all"],
        &["-6", "route", "show", "table", "all"],
    ] {
        let out = ns.run("ip", args);
        s.push_str(&String::from_utf8_lossy(&out.stdout));
    }
    let nft = ns.try_run("nft", &["list", "ruleset"]);
    s.push_str(&String::from_utf8_lossy(&nft.stdout));
    let q = ns.try_run("tc", &["qdisc", "show"]);
    s.push_str(&String::from_utf8_lossy(&q.stdout));
    for key in ["net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding"] {
        let v = ns.try_run("cat", &[&format!("/proc/sys/{key}")]);
        s.push_str(&format!("{key}={}", String::from_utf8_lossy(&v.stdout)));
    }
    // Strip counters and bridge timers that change by themselves.
    s.lines()
        .filter(|l| !l.contains("RX:") && !l.contains("TX:"))
        .map(strip_timers)
        .collect::<Vec<_>>()
        .join("\n")
}

/// `text` without packet and byte counters, which the kernel changes by itself: the
/// `[packets:bytes]` of `*-save` chain lines (x_tables keeps them for the built-in chains of
/// iptables-legacy, and the first packet of any connection in the namespace counts, e.g. the
/// IGMP report a bridge sends for the group 224.0.0.106 up to a second after it comes up) and
/// the `counter packets N bytes M` of `nft list ruleset` (every rule iptables-nft writes has
/// one), left as a bare `counter`. For comparing firewall state before and after.
pub fn without_counters(text: &str) -> String {
    const NFT: &str = "counter packets ";
    let digits = |s: &str| s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let mut line = line;
        if line.starts_with(':') && line.ends_with(']') {
            if let Some(at) = line.rfind(" [") {
                line = &line[..at];
            }
        }
        let mut rest = line;
        while let Some(at) = rest.find(NFT) {
            let after = &rest[at + NFT.len()..];
            let n = digits(after);
            match after[n..].strip_prefix(" bytes ") {
                Some(b) if n > 0 && digits(b) > 0 => {
                    out.push_str(&rest[..at]);
                    out.push_str("counter");
                    rest = &b[digits(b)..];
                }
                _ => {
                    out.push_str(&rest[..at + NFT.len()]);
                    rest = after;
                }
            }
        }
        out.push_str(rest);
        out.push('\n');
    }
    out
}

/// Drop `<name>_timer <seconds>` pairs (bridge and bridge-port timers tick on their own).
fn strip_timers(line: &str) -> String {
    let mut out = Vec::new();
    let mut words = line.split_whitespace().peekable();
    while let Some(w) = words.next() {
        if w.ends_with("_timer") {
            words.next();
            continue;
        }
        out.push(w);
    }
    out.join(" ")
}

/// [`ns_state`] without what the kernel derives asynchronously from a bridge's ports (carrier,
/// operational state, offload limits) or from IPv6 DAD (tentative): a port attached and taken
/// away again by a failed ADD, or still being unregistered, flips those although nothing was
/// left behind.
pub fn bridge_ns_state(ns: &Netns) -> String {
    const DERIVED: [&str; 5] =
        ["gso_max_size", "gso_max_segs", "tso_max_size", "tso_max_segs", "gro_max_size"];
    let mut out = String::new();
    for line in ns_state(ns).lines() {
        // The local route of an IPv6 link-local address appears when its duplicate address
        // detection ends (up to seconds after the link comes up on a loaded machine): a
        // snapshot taken before that differs from one taken after by these lines alone. The
        // address itself is listed (its `tentative` flag dropped above).
        if line.trim_start().starts_with("local fe80::") {
            continue;
        }
        let mut words = line.split_whitespace().peekable();
        let mut kept = Vec::new();
        while let Some(w) = words.next() {
            let state_word =
                w == "state" && words.peek().is_some_and(|n| n.chars().all(|c| c.is_ascii_uppercase()));
            if state_word || DERIVED.contains(&w) {
                words.next();
            } else if !matches!(w, "linkdown" | "tentative") {
                kept.push(w.replace("NO-CARRIER,", "").replace(",LOWER_UP", ""));
            }
        }
        out.push_str(&kept.join(" "));
        out.push('\n');
    }
    out
}

/// Wait (bounded) until [`bridge_ns_state`] of `ns` is `before` again, then fail with the diff.
pub fn assert_bridge_ns_state_returns(ns: &Netns, before: &str, what: &str) {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let now = bridge_ns_state(ns);
        if now == before {
            return;
        }
        if std::time::Instant::now() >= end {
            assert_eq!(now, before, "{what}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Poll `cond` with a short backoff until it holds; fail the test after `limit`. For state the
/// kernel finishes asynchronously (a dropped namespace's devices), never as a fixed sleep.
pub fn wait_until(what: &str, limit: std::time::Duration, mut cond: impl FnMut() -> bool) {
    let end = std::time::Instant::now() + limit;
    let mut pause = std::time::Duration::from_millis(1);
    while !cond() {
        assert!(std::time::Instant::now() < end, "timed out after {limit:?} waiting for {what}");
        std::thread::sleep(pause);
        pause = (pause * 2).min(std::time::Duration::from_millis(50));
    }
}

/// Files (relative path and content) below `dir`, sorted: to compare stores before/after.
/// Symbolic links are not followed (their target is the content, after `-> `), FIFOs, sockets
/// and devices are not opened (their kind is the content), and a directory's mode is part of
/// its entry.
pub fn dir_state(dir: &Path) -> Vec<(String, Vec<u8>)> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<(String, Vec<u8>)>) {
        use std::os::unix::fs::{FileTypeExt, PermissionsExt};
        let Ok(rd) = std::fs::read_dir(dir) else { return };
        for e in rd.flatten() {
            let p = e.path();
            let rel = p.strip_prefix(base).unwrap().to_string_lossy().into_owned();
            let Ok(meta) = std::fs::symlink_metadata(&p) else { continue };
            let t = meta.file_type();
            if t.is_symlink() {
                let target = std::fs::read_link(&p).unwrap_or_default();
                out.push((rel, format!("-> {}", target.display()).into_bytes()));
            } else if t.is_dir() {
                let mode = format!("mode {:o}", meta.permissions().mode() & 0o7777);
                out.push((format!("{rel}/"), mode.into_bytes()));
                walk(base, &p, out);
            } else if t.is_fifo() || t.is_socket() || t.is_char_device() || t.is_block_device() {
                out.push((rel, format!("special {:?}", t).into_bytes()));
            } else {
                out.push((rel, std::fs::read(&p).unwrap_or_default()));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

pub mod chain;
pub mod clients;
pub mod cri;
pub mod kubeproxy;
pub mod leaks;
pub mod node;
pub mod peers;
pub mod raw;
pub mod skip;
pub mod traffic;

pub use skip::{skip_if_present, skip_unless, Feature};

#[cfg(test)]
mod tests {
    #[test]
    fn without_counters_keeps_everything_but_counters() {
        let save = "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [1:40]\n:CNI-DN-x - [0:0]\n\
                    -A OUTPUT -m comment --comment \"a [1:2]\" -j CNI-DN-x\nCOMMIT\n";
        assert_eq!(
            super::without_counters(save),
            "*nat\n:PREROUTING ACCEPT\n:OUTPUT ACCEPT\n:CNI-DN-x -\n\
             -A OUTPUT -m comment --comment \"a [1:2]\" -j CNI-DN-x\nCOMMIT\n"
        );
        let nft = "table ip nat {\n\tchain POSTROUTING {\n\t\tip saddr 10.1.1.1 counter packets 12 bytes 3400 masquerade\n\
                   \t\tcounter packets 1 bytes 40 jump X comment \"counter packets x\"\n\t}\n}";
        assert_eq!(
            super::without_counters(nft),
            "table ip nat {\n\tchain POSTROUTING {\n\t\tip saddr 10.1.1.1 counter masquerade\n\
             \t\tcounter jump X comment \"counter packets x\"\n\t}\n}\n"
        );
    }
}
