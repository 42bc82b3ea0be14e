//! Real container runtimes — Podman (CNI backend) and containerd (`ctr run --cni`) — run
//! against our plugins in a sandbox that leaves the machine alone.
//!
//! Runtimes set up networking in the network namespace they run in, and write state to fixed
//! host paths (`/var/lib/cni` for libcni's cache, `/run/netns` for Podman's namespaces,
//! `/run/containerd/s` for containerd shim sockets, `/dev/shm/libpod_lock`, `/etc/cni/net.d`
//! and `/opt/cni/bin` for `ctr`). So every runtime runs in a [`Sandbox`]:
//!
//! * a scratch [`Node`] (crate::node): network, mount, UTS and cgroup namespaces and a cgroup
//!   subtree of its own, fresh tmpfs on `/run`, `/dev/shm` and `/opt`, and the scratch plugin, config
//!   and cache directories bound on `/opt/cni/bin`, `/etc/cni/net.d` and `/var/lib/cni`; its
//!   network namespace is the **host** to the plugins (bridges, veth host ends, nftables,
//!   qdiscs and sysctls land there);
//! * an **outside** peer namespace joined to the node by a veth, addresses in 10.250.0.0/30
//!   (host .1, outside .2) and fd00:250::/64 (::1, ::2): the node's underlay;
//! * scratch directories for everything else (Podman root/runroot/tmpdir, containerd
//!   root/state/sockets, host-local's dataDir, a busybox-static rootfs);
//! * a cgroup parent of its own for the containers (below the node's cgroups: the node has a
//!   cgroup namespace), removed at the end.
//!
//! Runtime commands run in the node through `nsenter`, each under `timeout`. The tests assert
//! on the node and its outside namespace only, never on the machine's namespaces (other
//! suites, a second copy of this one, change those at any time); what they do check of the
//! machine is that no file appeared in its runtime directories ([`HostSnapshot`]) and that the
//! daemons ran confined to the node ([`Node::assert_confined`]).

use crate::node::Node;
use crate::{bin, unique, Netns};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Which plugins a sandbox puts in its plugin directory. The tests use ours only; for work on
/// the harness itself `CNI_CLIENTS_UPSTREAM` swaps in Debian's Go plugins from /usr/lib/cni
/// (`all`, or a comma-separated list such as `bridge`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PluginSet {
    /// Plugins taken from /usr/lib/cni instead of ours.
    pub upstream: Vec<String>,
}

impl PluginSet {
    /// All ours.
    pub fn ours() -> PluginSet {
        PluginSet::default()
    }

    /// Ours, except what `CNI_CLIENTS_UPSTREAM` names.
    pub fn from_env() -> PluginSet {
        let v = std::env::var("CNI_CLIENTS_UPSTREAM").unwrap_or_default();
        let upstream: Vec<String> = match v.trim() {
            "" => Vec::new(),
            "all" => PLUGINS.iter().map(|p| p.to_string()).collect(),
            list => list.split(',').map(|p| p.trim().to_string()).collect(),
        };
        for p in &upstream {
            assert!(
                PLUGINS.contains(&p.as_str()),
                "CNI_CLIENTS_UPSTREAM names {p:?}, not one of {PLUGINS:?}"
            );
        }
        if !upstream.is_empty() {
            eprintln!("NOTE: CNI_CLIENTS_UPSTREAM: using upstream {upstream:?} from /usr/lib/cni, not ours");
        }
        PluginSet { upstream }
    }

    pub fn is_upstream(&self, plugin: &str) -> bool {
        self.upstream.iter().any(|p| p == plugin)
    }
}

/// The plugins the runtime tests chain.
pub const PLUGINS: [&str; 5] = ["bridge", "host-local", "portmap", "bandwidth", "loopback"];

/// Address of the scratch host on its link to the outside namespace.
pub const HOST_ADDR: &str = "10.250.0.1";
/// Address of the outside namespace.
pub const OUTSIDE_ADDR: &str = "10.250.0.2";
/// IPv6 address of the scratch host on its link to the outside namespace.
pub const HOST_ADDR6: &str = "fd00:250::1";
/// IPv6 address of the outside namespace.
pub const OUTSIDE_ADDR6: &str = "fd00:250::2";

// (the command deadline lives with the node, which clients' runtimes run in)
pub use crate::node::{must, timed, CMD_TIMEOUT};

/// Poll `cond` until it returns Some (-> Some) or `limit` passes (-> None).
pub fn poll<T>(limit: Duration, mut cond: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = cond() {
            return Some(v);
        }
        if start.elapsed() >= limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Poll `cond` until it returns Some; fail the test if `limit` passes first.
pub fn wait_for<T>(what: &str, limit: Duration, cond: impl FnMut() -> Option<T>) -> T {
    poll(limit, cond).unwrap_or_else(|| panic!("timed out after {limit:?} waiting for {what}"))
}

/// A scratch node (the host), its outside namespace and the containers' cgroup parent. Derefs
/// to its [`Node`]: `sb.host`, `sb.dir`, `sb.command(…)`, `sb.must(…)`.
pub struct Sandbox {
    pub node: Node,
    pub outside: Netns,
    pub plugins: PluginSet,
    /// Absolute cgroup parent (e.g. `/cnisbx…`) for containers of this sandbox.
    pub cgroup_parent: String,
}

impl std::ops::Deref for Sandbox {
    type Target = Node;
    fn deref(&self) -> &Node {
        &self.node
    }
}

impl Sandbox {
    pub fn new(plugins: PluginSet) -> Sandbox {
        let node = Node::new("sbh");
        let (host, dir) = (&node.host, &node.dir);
        let outside = Netns::new("sbo");
        for d in ["data", "rootfs"] {
            std::fs::create_dir_all(dir.join(d)).expect("scratch dir");
        }
        for p in PLUGINS {
            let dst = dir.join("bin").join(p);
            if plugins.is_upstream(p) {
                std::fs::copy(Path::new("/usr/lib/cni").join(p), &dst)
                    .unwrap_or_else(|e| panic!("upstream plugin {p}: {e}"));
            } else {
                std::os::unix::fs::symlink(bin(p), &dst).expect("symlink plugin");
            }
        }
        // host <-> outside link
        let hv = unique("sbv");
        let ov = unique("sbw");
        let out = Command::new("ip")
            .args(["link", "add", &hv, "netns", host.name(), "type", "veth", "peer", "name", &ov])
            .args(["netns", outside.name()])
            .output()
            .expect("run ip");
        assert!(out.status.success(), "veth host<->outside: {}", String::from_utf8_lossy(&out.stderr));
        host.run("ip", &["addr", "add", &format!("{HOST_ADDR}/30"), "dev", &hv]);
        outside.run("ip", &["addr", "add", &format!("{OUTSIDE_ADDR}/30"), "dev", &ov]);
        host.run("ip", &["-6", "addr", "add", &format!("{HOST_ADDR6}/64"), "dev", &hv, "nodad"]);
        outside.run("ip", &["-6", "addr", "add", &format!("{OUTSIDE_ADDR6}/64"), "dev", &ov, "nodad"]);
        host.run("ip", &["link", "set", &hv, "up"]);
        outside.run("ip", &["link", "set", &ov, "up"]);
        outside.run("ip", &["link", "set", "lo", "up"]);
        make_rootfs(&dir.join("rootfs"));
        let cgroup_parent = format!("/{}", unique("cnisbx"));
        Sandbox { node, outside, plugins, cgroup_parent }
    }

    /// Write a conflist into the scratch config dir (what `/etc/cni/net.d` shows in the sandbox).
    pub fn write_conflist(&self, file: &str, v: &Value) {
        std::fs::write(self.dir.join("conf").join(file), serde_json::to_string_pretty(v).unwrap())
            .expect("write conflist");
    }

    /// The libcni cache entry of an attachment, parsed (None if absent).
    pub fn cached(&self, net: &str, id: &str, ifname: &str) -> Option<Value> {
        let p = self.dir.join("cache/results").join(format!("{net}-{id}-{ifname}"));
        std::fs::read(p).ok().map(|b| serde_json::from_slice(&b).expect("cache entry is JSON"))
    }

    /// Names of files in the libcni cache (results/).
    pub fn cache_entries(&self) -> Vec<String> {
        list(&self.dir.join("cache/results"))
    }

    /// host-local's reservations (files named after an address) for `net`.
    pub fn reservations(&self, net: &str) -> Vec<String> {
        list(&self.dir.join("data").join(net))
            .into_iter()
            .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
            .collect()
    }

    /// HTTP GET with curl from `ns` (5 s limit); Ok(body) or Err(curl's complaint).
    pub fn http_get(ns: &Netns, url: &str) -> Result<String, String> {
        let out = ns
            .command("timeout")
            .args(["-k", "2", "10", "curl", "-gsS", "--max-time", "5", "--noproxy", "*", url])
            .output()
            .expect("run curl");
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// Everything firewall-shaped in the host netns, as text: the nft ruleset and, when
    /// iptables is installed (upstream's plugins use it), iptables-save of both families.
    pub fn firewall_text(&self) -> String {
        let mut s =
            String::from_utf8_lossy(&self.host.try_run("nft", &["list", "ruleset"]).stdout).into_owned();
        for tool in ["iptables-save", "ip6tables-save"] {
            if Path::new("/usr/sbin").join(tool).exists() {
                s.push_str(&String::from_utf8_lossy(&self.host.try_run(tool, &[]).stdout));
            }
        }
        s
    }

    /// Links in the host netns.
    pub fn host_links(&self) -> Vec<String> {
        self.host.link_names()
    }

    /// tc qdiscs in the host netns, as text.
    pub fn qdiscs(&self) -> String {
        String::from_utf8_lossy(&self.host.run("tc", &["qdisc", "show"]).stdout).into_owned()
    }

    /// Remove this sandbox's cgroup directories (deepest first); returns what could not be
    /// removed (a non-empty cgroup means a process of a container is still alive).
    pub fn remove_cgroups(&self) -> Vec<String> {
        let mut left = Vec::new();
        // the node's cgroups are the root its processes see (a cgroup namespace)
        for node_dir in self.node.cgroup_dirs() {
            let base = node_dir.join(self.cgroup_parent.trim_start_matches('/'));
            if !base.exists() {
                continue;
            }
            let mut dirs = Vec::new();
            collect_dirs(&base, &mut dirs);
            dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
            for d in dirs {
                if let Err(e) = std::fs::remove_dir(&d) {
                    left.push(format!("{}: {e}", d.display()));
                }
            }
        }
        left
    }
}

/// The first address of a result libcni cached ([`Sandbox::cached`]), without its prefix.
pub fn cached_ip(cached: &Value) -> String {
    let addr = cached["result"]["ips"][0]["address"].as_str().expect("cached result has an IP");
    addr.split('/').next().unwrap().to_string()
}

/// The host-side interface (no sandbox, not the bridge `bridge`) of a result libcni cached.
pub fn cached_host_veth(cached: &Value, bridge: &str) -> String {
    cached["result"]["interfaces"]
        .as_array()
        .expect("cached result has interfaces")
        .iter()
        .find(|i| i.get("sandbox").is_none_or(|s| s.as_str() == Some("")) && i["name"] != bridge)
        .and_then(|i| i["name"].as_str())
        .unwrap_or_else(|| panic!("no host veth in cached result {cached}"))
        .to_string()
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let left = self.remove_cgroups();
        if !left.is_empty() && !std::thread::panicking() {
            panic!("cgroups left behind: {left:?}");
        }
    }
}

fn collect_dirs(d: &Path, out: &mut Vec<PathBuf>) {
    out.push(d.to_path_buf());
    if let Ok(rd) = std::fs::read_dir(d) {
        for e in rd.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                collect_dirs(&e.path(), out);
            }
        }
    }
}

fn list(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// `GET /cgi-bin/zeros?N`: N bytes of zeros.
const ZEROS: &str =
    "#!/bin/sh\nprintf 'Content-Type: application/octet-stream\\r\\n\\r\\n'\nexec head -c \"$QUERY_STRING\" /dev/zero\n";

/// `POST /cgi-bin/sink?SKIP-TIMED`: reads SKIP blocks of the body, then TIMED blocks between
/// two readings of /proc/uptime; answers "<start> <end> <bytes of the timed part>".
const SINK: &str = r#"#!/bin/sh
skip=${QUERY_STRING%-*}
timed=${QUERY_STRING#*-}
dd bs=1000 count="$skip" iflag=fullblock of=/dev/null 2>/dev/null
read t1 rest < /proc/uptime
n=$(dd bs=1000 count="$timed" iflag=fullblock 2>/dev/null | wc -c)
read t2 rest < /proc/uptime
printf 'Content-Type: text/plain\r\n\r\n%s %s %s\n' "$t1" "$t2" "$n"
"#;

/// Transfers count in blocks of this many bytes (`dd bs=1000 … iflag=fullblock` reads exact
/// amounts on both sides).
const BLOCK: u64 = 1000;
/// Seconds of traffic at the shaped rate sent after the bucket is empty and before the timing
/// starts, so that TCP has left slow start and its first losses behind.
const WARMUP_SECONDS: u64 = 2;
/// Seconds of traffic at the shaped rate in each timed transfer.
const TRANSFER_SECONDS: u64 = 6;

/// Blocks to skip (the token bucket of `burst` bytes, then the warm-up) and to time, for a
/// transfer shaped to `bits` bit/s.
fn transfer_blocks(burst: u64, bits: u64) -> (u64, u64) {
    let per_second = bits / 8 / BLOCK;
    (burst.div_ceil(BLOCK) + WARMUP_SECONDS * per_second, TRANSFER_SECONDS * per_second)
}

/// Steady-state rate out of a container (through its egress shaping), in bit/s of payload: one
/// download from the container's busybox httpd (rootfs of [`make_rootfs`]) through host port
/// `port`, from the outside netns, timed there between the end of the skipped part and the end
/// of the timed part. `burst` (bytes) and `bits` (bit/s) are the limit's, which size the parts.
pub fn shaped_rate_out_of(sb: &Sandbox, port: u16, burst: u64, bits: u64) -> f64 {
    let (skip, timed) = transfer_blocks(burst, bits);
    let url = format!("http://{HOST_ADDR}:{port}/cgi-bin/zeros?{}", (skip + timed) * BLOCK);
    let script = format!(
        "set -o pipefail; curl -gsS --noproxy '*' --max-time 170 '{url}' | {{ \
         dd bs={BLOCK} count={skip} iflag=fullblock of=/dev/null 2>/dev/null; date +%s%N; \
         dd bs={BLOCK} count={timed} iflag=fullblock 2>/dev/null | wc -c; date +%s%N; cat >/dev/null; }}"
    );
    let out =
        sb.outside.command("timeout").args(["-k", "2", "180", "bash", "-c", &script]).output().expect("bash");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "download: {text} {}", String::from_utf8_lossy(&out.stderr));
    let v: Vec<u64> = text.split_whitespace().map(|x| x.parse().expect("numbers")).collect();
    assert_eq!(v.len(), 3, "download printed {text:?}");
    assert_eq!(v[1], timed * BLOCK, "bytes in the timed part");
    v[1] as f64 * 8.0 / ((v[2] - v[0]) as f64 / 1e9)
}

/// Steady-state rate into a container (through its ingress shaping), in bit/s of payload: one
/// upload from the outside netns through host port `port` that the container's `/cgi-bin/sink`
/// reads, timed in the container (/proc/uptime, 10 ms steps).
pub fn shaped_rate_into(sb: &Sandbox, port: u16, burst: u64, bits: u64) -> f64 {
    let (skip, timed) = transfer_blocks(burst, bits);
    let file = sb.dir.join("upload");
    std::fs::write(&file, vec![0u8; ((skip + timed) * BLOCK) as usize]).unwrap();
    let url = format!("http://{HOST_ADDR}:{port}/cgi-bin/sink?{skip}-{timed}");
    let data = format!("@{}", file.display());
    let out = sb
        .outside
        .command("timeout")
        .args(["-k", "2", "120", "curl", "-gsS", "--noproxy", "*", "--max-time", "110"])
        .args(["-H", "Expect:", "-H", "Content-Type: application/octet-stream", "--data-binary", &data, &url])
        .output()
        .expect("run curl");
    let _ = std::fs::remove_file(&file);
    let answer = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "upload: {answer}{}", String::from_utf8_lossy(&out.stderr));
    let v: Vec<f64> = answer.split_whitespace().map(|x| x.parse().expect("numbers")).collect();
    assert_eq!(v.len(), 3, "the sink answered {answer:?}");
    assert_eq!(v[2] as u64, timed * BLOCK, "bytes in the timed part");
    v[2] * 8.0 / (v[1] - v[0])
}

/// A minimal rootfs: static busybox, a page for httpd at /www/index.html and the CGI scripts of
/// the timed transfers.
fn make_rootfs(root: &Path) {
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.exists())
        .expect("busybox not installed: scripts/install-deps.sh installs busybox-static");
    for d in ["bin", "proc", "sys", "dev", "etc", "tmp", "run", "www"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::fs::copy(busybox, root.join("bin/busybox")).expect("copy busybox");
    for a in ["sh", "httpd", "nc", "ip", "cat", "sleep", "ls", "echo", "printf", "head", "wc", "dd"] {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(a)).unwrap();
    }
    std::fs::write(root.join("www/index.html"), "hello from the container\n").unwrap();
    // The CGI scripts of the timed transfers (shaped_rate_out_of, shaped_rate_into).
    let cgi = root.join("www/cgi-bin");
    std::fs::create_dir_all(&cgi).unwrap();
    for (name, text) in [("zeros", ZEROS), ("sink", SINK)] {
        let p = cgi.join(name);
        std::fs::write(&p, text).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::write(root.join("etc/passwd"), "root:x:0:0:root:/:/bin/sh\n").unwrap();
    std::fs::write(root.join("etc/group"), "root:x:0:\n").unwrap();
}

/// Podman 4 with its CNI backend, configured entirely through scratch files.
pub struct Podman<'a> {
    sb: &'a Sandbox,
    conf: PathBuf,
    storage: PathBuf,
}

impl<'a> Podman<'a> {
    pub fn new(sb: &'a Sandbox) -> Podman<'a> {
        let d = sb.dir.join("podman");
        for s in ["root", "runroot", "tmp"] {
            std::fs::create_dir_all(d.join(s)).unwrap();
        }
        let conf = d.join("containers.conf");
        let storage = d.join("storage.conf");
        let p = |s: &str| d.join(s).to_string_lossy().into_owned();
        std::fs::write(
            &conf,
            format!(
                r#"[containers]
default_sysctls = []
[network]
network_backend = "cni"
cni_plugin_dirs = ["{bin}"]
network_config_dir = "{conf}"
[engine]
cgroup_manager = "cgroupfs"
events_logger = "none"
runtime = "runc"
tmp_dir = "{tmp}"
static_dir = "{root}/libpod"
volume_path = "{root}/volumes"
num_locks = 64
"#,
                bin = sb.dir.join("bin").display(),
                conf = sb.dir.join("conf").display(),
                tmp = p("tmp"),
                root = p("root"),
            ),
        )
        .unwrap();
        std::fs::write(
            &storage,
            format!(
                "[storage]\ndriver = \"vfs\"\ngraphroot = \"{}\"\nrunroot = \"{}\"\n",
                p("root"),
                p("runroot")
            ),
        )
        .unwrap();
        Podman { sb, conf, storage }
    }

    /// `podman <global flags> args…` in the sandbox, under a timeout.
    pub fn run(&self, args: &[&str]) -> Output {
        let d = self.sb.dir.join("podman");
        let mut c = self.sb.command(CMD_TIMEOUT, "env");
        c.arg(format!("CONTAINERS_CONF={}", self.conf.display()))
            .arg(format!("CONTAINERS_STORAGE_CONF={}", self.storage.display()))
            .arg("CONTAINERS_REGISTRIES_CONF=/dev/null")
            .arg("podman")
            .arg("--root")
            .arg(d.join("root"))
            .arg("--runroot")
            .arg(d.join("runroot"))
            .args(["--runtime", "runc", "--cgroup-manager", "cgroupfs", "--events-backend", "none"])
            .args(args);
        c.output().expect("spawn podman")
    }

    pub fn must(&self, args: &[&str]) -> String {
        must(&format!("podman {args:?}"), self.run(args))
    }

    /// `podman inspect` of one container, parsed.
    pub fn inspect(&self, name: &str) -> Value {
        let v: Value = serde_json::from_str(&self.must(&["inspect", name])).expect("inspect JSON");
        v[0].clone()
    }
}

impl Drop for Podman<'_> {
    fn drop(&mut self) {
        // Whatever a failed test left running.
        let _ = self.run(&["rm", "-f", "-a", "-t", "0"]);
    }
}

/// A private containerd 1.6 daemon (root, state and sockets in scratch; CRI off unless
/// started with [`Containerd::start_with_cri`]) and `ctr`.
pub struct Containerd<'a> {
    sb: &'a Sandbox,
    daemon: Option<Child>,
    pub socket: PathBuf,
    /// The daemon's `root` directory (content store, snapshots, CRI's per-sandbox files).
    pub root: PathBuf,
    state: PathBuf,
    /// The daemon's log (stdout and stderr).
    pub log: PathBuf,
    /// Where `containerd`, `ctr` and the shim come from: None = the machine's (PATH).
    bin_dir: Option<PathBuf>,
    config: PathBuf,
}

impl<'a> Containerd<'a> {
    /// Start the daemon (CRI plugin disabled) in the sandbox and wait until it answers. Fails
    /// the test if it cannot.
    pub fn start(sb: &'a Sandbox) -> Containerd<'a> {
        Containerd::launch(sb, None)
    }

    /// Start the daemon with its CRI plugin on; `cri_toml` is the body of the
    /// `[plugins."io.containerd.grpc.v1.cri"]` table (tables below it included, with their full
    /// names). The CRI serves on [`Containerd::socket`] too.
    pub fn start_with_cri(sb: &'a Sandbox, cri_toml: &str) -> Containerd<'a> {
        Containerd::launch(sb, Some(cri_toml))
    }

    /// Start a containerd 2.x from `bin_dir` (containerd, ctr, containerd-shim-runc-v2) with
    /// a version 3 configuration: `plugins_toml` is appended after the daemon's own settings
    /// (root, state, sockets, the plugins no test uses disabled) and names its tables in full.
    pub fn start_v2(sb: &'a Sandbox, bin_dir: &Path, plugins_toml: &str) -> Containerd<'a> {
        let d = sb.dir.join("containerd");
        std::fs::create_dir_all(&d).unwrap();
        let (socket, state, root) = (d.join("c.sock"), d.join("state"), d.join("root"));
        let config = d.join("config.toml");
        std::fs::write(
            &config,
            format!(
                r#"version = 3
root = "{root}"
state = "{state}"
disabled_plugins = [
  "io.containerd.internal.v1.opt",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
  "io.containerd.nri.v1.nri",
]
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
{plugins_toml}
"#,
                root = root.display(),
                state = state.display(),
                sock = socket.display(),
            ),
        )
        .unwrap();
        let mut me = Containerd {
            sb,
            daemon: None,
            socket,
            root,
            state,
            log: d.join("containerd.log"),
            bin_dir: Some(bin_dir.to_path_buf()),
            config,
        };
        me.spawn();
        me
    }

    /// Stop the daemon and start it again with the same configuration (running pods' shims
    /// stay up), waiting until it answers.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    /// The program `name` (containerd, ctr) this daemon uses.
    fn program(&self, name: &str) -> String {
        match &self.bin_dir {
            Some(d) => d.join(name).to_string_lossy().into_owned(),
            None => name.to_string(),
        }
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).unwrap();
        let mut c = self.sb.enter(self.program("containerd"));
        c.arg("--config").arg(&self.config).stdin(Stdio::null()).stdout(log.try_clone().unwrap()).stderr(log);
        if let Some(d) = &self.bin_dir {
            // the shim is looked up on PATH: ours first, not the machine's 1.x shim
            let path = std::env::var("PATH").unwrap_or_default();
            c.env("PATH", format!("{}:{path}", d.display()));
        }
        self.daemon = Some(c.spawn().expect("spawn containerd"));
        self.wait_answering();
    }

    fn wait_answering(&mut self) {
        let start = Instant::now();
        loop {
            if self.ctr(&["version"]).status.success() {
                break;
            }
            if let Some(st) = self.daemon.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "containerd exited ({st}) at start: {}",
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                );
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "containerd did not answer within 30 s: {}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        // nsenter execs the daemon: the child is containerd itself
        let pid = self.daemon.as_ref().unwrap().id() as i32;
        if let Err(e) = self.sb.confines(pid) {
            panic!("containerd does not run in its node: {e}");
        }
    }

    fn launch(sb: &'a Sandbox, cri_toml: Option<&str>) -> Containerd<'a> {
        let d = sb.dir.join("containerd");
        std::fs::create_dir_all(&d).unwrap();
        let socket = d.join("c.sock");
        let state = d.join("state");
        let root = d.join("root");
        let config = d.join("config.toml");
        let (cri_disabled, cri_table) = match cri_toml {
            None => ("\n  \"io.containerd.grpc.v1.cri\",", String::new()),
            Some(t) => ("", format!("[plugins.\"io.containerd.grpc.v1.cri\"]\n{t}\n")),
        };
        std::fs::write(
            &config,
            format!(
                r#"version = 2
root = "{root}"
state = "{state}"
disabled_plugins = [{cri_disabled}
  "io.containerd.internal.v1.opt",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
{cri_table}"#,
                root = root.display(),
                state = state.display(),
                sock = socket.display(),
            ),
        )
        .unwrap();
        let mut me = Containerd {
            sb,
            daemon: None,
            socket,
            root,
            state,
            log: d.join("containerd.log"),
            bin_dir: None,
            config,
        };
        me.spawn();
        me
    }

    /// `ctr -a <socket> args…` in the sandbox, under a timeout.
    pub fn ctr(&self, args: &[&str]) -> Output {
        self.ctr_command(CMD_TIMEOUT, args).output().expect("spawn ctr")
    }

    pub fn ctr_command(&self, secs: u64, args: &[&str]) -> Command {
        let mut c = self.sb.command(secs, &self.program("ctr"));
        c.arg("-a").arg(&self.socket).args(args);
        c
    }

    pub fn must(&self, args: &[&str]) -> String {
        must(&format!("ctr {args:?}"), self.ctr(args))
    }

    /// PIDs of running shims (from their pid files under the state dir).
    pub fn shim_pids(&self) -> Vec<i32> {
        let mut pids = Vec::new();
        let base = self.state.join("io.containerd.runtime.v2.task");
        for ns in list(&base) {
            for id in list(&base.join(&ns)) {
                if let Ok(s) = std::fs::read_to_string(base.join(&ns).join(&id).join("shim.pid")) {
                    if let Ok(p) = s.trim().parse() {
                        pids.push(p);
                    }
                }
            }
        }
        pids
    }

    /// Stop the daemon (SIGTERM, then wait).
    pub fn stop(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            // SAFETY: plain kill(2) on the daemon this struct started and has not reaped.
            unsafe { libc::kill(d.id() as i32, libc::SIGTERM) };
            let _ = d.wait();
        }
    }
}

impl Drop for Containerd<'_> {
    fn drop(&mut self) {
        // Clean up what a failed test left: tasks, containers, then the daemon and any shim.
        if self.daemon.is_some() {
            let tasks = self.ctr(&["task", "ls", "-q"]);
            for id in String::from_utf8_lossy(&tasks.stdout).lines() {
                let _ = self.ctr(&["task", "kill", "-s", "SIGKILL", id]);
                let _ = self.ctr(&["task", "delete", "-f", id]);
            }
            let cs = self.ctr(&["container", "ls", "-q"]);
            for id in String::from_utf8_lossy(&cs.stdout).lines() {
                let _ = self.ctr(&["container", "delete", id]);
            }
        }
        let shims = self.shim_pids();
        self.stop();
        for p in shims {
            // SAFETY: kill(2) on a shim this daemon started for this sandbox.
            unsafe { libc::kill(p, libc::SIGKILL) };
        }
    }
}

/// What the machine's file tree looks like where a runtime or our plugins could leave
/// something behind: runtime state directories, and entries naming this test's attachments in
/// shared CNI directories. The machine's links and firewall are not looked at: other suites,
/// a second copy of this one, change those at any time, and the runtimes run in a [`Node`],
/// which the tests check instead ([`Node::assert_confined`], and their assertions on the
/// node's links, rules and qdiscs).
#[derive(Debug, PartialEq, Eq)]
pub struct HostSnapshot {
    files: Vec<String>,
}

/// Directories that no other test writes to: any change there is ours.
const RUNTIME_DIRS: [&str; 12] = [
    "/run/containerd",
    "/run/libpod",
    "/run/containers",
    "/run/runc",
    "/run/crun",
    "/run/podman",
    "/var/lib/containers",
    "/var/lib/containerd",
    "/opt/cni",
    "/etc/cni",
    "/var/lib/cni/networks",
    "/etc/containers/networks",
];

impl HostSnapshot {
    /// `tokens`: strings that name this test's networks/containers (checked in shared dirs
    /// such as /var/lib/cni/results and /run/netns, where other tests write too).
    pub fn take(tokens: &[&str]) -> HostSnapshot {
        let mut files = Vec::new();
        for d in RUNTIME_DIRS {
            walk(Path::new(d), &mut files);
        }
        // Podman's SHM lock; other programs may use /dev/shm for their own things
        walk(Path::new("/dev/shm"), &mut files);
        files.retain(|f| !f.starts_with("/dev/shm/") || f.starts_with("/dev/shm/libpod"));
        for d in ["/var/lib/cni", "/run/netns", "/run/cni"] {
            let mut all = Vec::new();
            walk(Path::new(d), &mut all);
            files.extend(
                all.into_iter()
                    .filter(|f| tokens.iter().any(|t| f.contains(t)) || f.starts_with("/run/netns/cni-")),
            );
        }
        files.sort();
        HostSnapshot { files }
    }

    /// Assert the machine's files look as they did in `before`.
    pub fn assert_unchanged_since(before: &HostSnapshot, tokens: &[&str]) {
        let after = HostSnapshot::take(tokens);
        assert_eq!(before.files, after.files, "files appeared or vanished outside the scratch dirs");
    }
}

fn walk(p: &Path, out: &mut Vec<String>) {
    let Ok(rd) = std::fs::read_dir(p) else { return };
    out.push(p.display().to_string());
    for e in rd.flatten() {
        let path = e.path();
        if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            walk(&path, out);
        } else {
            out.push(path.display().to_string());
        }
    }
}
