//! A scratch **node**: the machine a container runtime (containerd and its CRI, the kubelet,
//! Podman, CRI-O's call driver) believes it runs on, made of namespaces and scratch files, so
//! that the runtime tests assert on the node alone, never look at or change the machine's own
//! namespaces, and two copies of the suite run side by side (issue 35). The cluster tests are
//! meant to build their Kubernetes nodes from the same type.
//!
//! A [`Node`] is
//!
//! * a **network namespace** of its own ([`Node::host`], named `<prefix><pid><n>`) with its
//!   loopback up: its bridges, veth host ends, nftables rules, qdiscs, sysctls and listening
//!   ports (the kubelet's 10250, …) are the node's; links to other namespaces (an underlay, the
//!   "outside") are the caller's to make;
//! * a **mount, UTS and cgroup namespace**, held by a keeper process started inside that network
//!   namespace (mount propagation slave: the machine's mounts reach the node, the node's never
//!   reach the machine), with fresh tmpfs on `/run` (and `/run/netns`), `/dev/shm` and `/opt`,
//!   a scratch directory bound on each path of [`SCRATCH_PATHS`] (the CNI directories, the
//!   runtimes' fixed state directories, `/var/log`), and its hostname set to the node's name;
//! * a **cgroup subtree**: a cgroup named after the node below the test process's own cgroup in
//!   every hierarchy, which every process started through [`Node::command`] or [`Node::enter`]
//!   joins before it execs, so the daemons and whatever they fork (containerd's shims) are found
//!   there, checked ([`Node::assert_confined`]) and ended with the node; and a **cgroup
//!   namespace** rooted there, every hierarchy mounted again in the node's mount namespace, so
//!   the cgroups a runtime makes at `/` (containerd's `/k8s.io/<id>`, a container's cgroup
//!   parent) are below the node's, removed with it;
//! * a **scratch directory** ([`Node::dir`]) for everything else.
//!
//! Every name carries the test process's pid, so nothing of one copy of the suite collides with
//! another's. On drop the keeper ends, what is still running in the node's cgroups is killed,
//! the cgroups are removed and the network namespace deleted.

use crate::{Netns, TempDir};
use std::ffi::CString;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::time::Duration;

/// Seconds any one runtime command may take.
pub const CMD_TIMEOUT: u64 = 60;

/// Build `timeout -k 5 <secs> <program>` so no external command can hang a test.
pub fn timed(secs: u64, program: &str) -> Command {
    let mut c = Command::new("timeout");
    c.args(["-k", "5", &secs.to_string(), program]);
    c
}

/// Assert a command succeeded; return its stdout. Says so when `timeout` killed it.
pub fn must(what: &str, out: Output) -> String {
    let code = out.status.code();
    assert!(
        out.status.success(),
        "{what} failed ({}): stdout {} stderr {}",
        match code {
            Some(124) | Some(137) => "timed out".to_string(),
            Some(c) => format!("exit {c}"),
            None => "killed by a signal".to_string(),
        },
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Paths of the machine a runtime writes to whatever its configuration says, each covered in
/// the node by a scratch directory (`<dir>/<name>`): the CNI plugin, configuration and cache
/// directories (`ctr --cni`, libcni's defaults), containerd's, Podman's and the kubelet's fixed
/// state directories (`/var/lib/kubelet/device-plugins`, `pki`), and `/var/log` (pod and
/// container logs). Where the machine has no such directory it is made in an overlay of its
/// nearest parent whose upper layer is scratch, so the machine's tree stays as it is.
pub const SCRATCH_PATHS: [(&str, &str); 7] = [
    ("bin", "/opt/cni/bin"),
    ("conf", "/etc/cni/net.d"),
    ("cache", "/var/lib/cni"),
    ("var-lib-containerd", "/var/lib/containerd"),
    ("var-lib-containers", "/var/lib/containers"),
    ("var-lib-kubelet", "/var/lib/kubelet"),
    ("var-log", "/var/log"),
];

/// The keeper's script, run in its new mount and UTS namespaces: `$1` scratch root, `$2`
/// hostname, then `name:path` pairs of [`SCRATCH_PATHS`]. Prints `ready`, then waits for its
/// stdin to close.
const KEEPER_SCRIPT: &str = r#"
set -eu
S="$1"; H="$2"; shift 2
hostname "$H"
# The directories the node must keep reaching whatever is mounted over their path ($KEEP, one
# a line: the checkout, our binaries, the scratch root): each held open on fds 3… now, and
# bound back at its own path from there after the mounts that could cover it (a checkout
# under /opt or /run; mount must not canonicalize /proc/self/fd/N, which names the path).
i=3
while IFS= read -r d; do
    [ -n "$d" ] || continue
    eval "exec $i<\"\$d\""
    i=$((i + 1))
done <<EOF
$KEEP
EOF
keep_back() {
    i=3
    while IFS= read -r d; do
        [ -n "$d" ] || continue
        mkdir -p "$d"
        mount --no-canonicalize --rbind "/proc/self/fd/$i" "$d"
        i=$((i + 1))
    done <<EOF
$KEEP
EOF
}
mount -t tmpfs -o mode=755 cninode /run
mkdir -p /run/netns
mount -t tmpfs -o mode=1777 cninode /dev/shm
mount -t tmpfs -o mode=755 cninode /opt
keep_back
# every overlay first (one per parent): an overlay mounted later would hide the binds below it
for pair in "$@"; do
    target=${pair#*:}
    parent=$target
    while [ ! -d "$parent" ]; do parent=$(dirname "$parent"); done
    case $parent in "$target" | /opt | /opt/*) continue ;; esac
    o="$S/overlay$(echo "$parent" | tr / _)"
    [ -d "$o" ] && continue
    mkdir -p "$o/up" "$o/work"
    mount -t overlay overlay -o "lowerdir=$parent,upperdir=$o/up,workdir=$o/work" "$parent"
done
for pair in "$@"; do
    name=${pair%%:*}; target=${pair#*:}
    mkdir -p "$S/$name" "$target"
    mount --bind "$S/$name" "$target"
done
# cgroups: the keeper joined the node's cgroups before its cgroup namespace was made, so they
# are that namespace's root; every hierarchy mounted again shows the node's subtree as the
# whole tree to what runs here (runc's /k8s.io/<id>, a cgroup parent /cnisbx… land below the
# node's cgroups). The kernel refuses a hierarchy on its own mount point again: a fresh tmpfs
# over /sys/fs/cgroup first (with the machine's symbolic links there, `cpu,cpuacct` and
# the like), then every hierarchy on a directory of its own. Their mountinfo roots read
# "/.." here (the hierarchy's root is above the namespace's).
hierarchies=$(sed -n 's|^[0-9]* [0-9]* [^ ]* [^ ]* \([^ ]*\) .* - \(cgroup2\{0,1\}\) [^ ]* \([^ ]*\)$|\2 \1 \3|p' /proc/self/mountinfo)
links=$(find /sys/fs/cgroup -mindepth 1 -maxdepth 1 -type l -printf '%f %l\n')
mount -t tmpfs -o mode=755 cninode /sys/fs/cgroup
echo "$links" | while read -r name target; do
    if [ -n "$name" ]; then ln -s "$target" "/sys/fs/cgroup/$name"; fi
done
echo "$hierarchies" | while read -r fstype point opts; do
    [ -n "$fstype" ] || continue
    mkdir -p "$point"
    mount -t "$fstype" -o "$opts" cninode "$point"
    # the keeper is in the node's cgroup itself: its pid listed at the top, or this failed
    grep -qx "$$" "$point/cgroup.procs" || { echo "$point does not show the node's cgroup" >&2; exit 1; }
done
keep_back
echo ready
exec cat >/dev/null
"#;

/// One cgroup hierarchy of the machine as this process sees it: where it is mounted and the
/// node's cgroup in it.
struct Cgroup {
    /// The node's cgroup directory (below the test process's own cgroup).
    dir: PathBuf,
    /// Its path inside the hierarchy, as `/proc/<pid>/cgroup` lists it.
    path: String,
    /// The hierarchy's line key in `/proc/<pid>/cgroup` (`4:memory`, `0:`).
    key: String,
}

/// The hierarchies of `/proc/self/cgroup` with their mount points (from `/proc/self/mountinfo`):
/// (key `id:controllers`, this process's cgroup path, mount directory).
fn hierarchies() -> Vec<(String, String, PathBuf)> {
    let mine = std::fs::read_to_string("/proc/self/cgroup").expect("read /proc/self/cgroup");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("read /proc/self/mountinfo");
    let mut out = Vec::new();
    for line in mine.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(id), Some(ctl), Some(path)) = (f.next(), f.next(), f.next()) else { continue };
        let wanted: Vec<&str> = ctl.split(',').filter(|c| !c.is_empty()).collect();
        // mountinfo: `… root mountpoint … - fstype source superoptions`
        let dir = mounts.lines().find_map(|m| {
            let (left, right) = m.split_once(" - ")?;
            let mut r = right.split_whitespace();
            let fstype = r.next()?;
            let opts: Vec<&str> = r.nth(1)?.split(',').collect();
            let mut l = left.split_whitespace();
            let root = l.nth(3)?;
            let point = l.next()?;
            let fits = match fstype {
                "cgroup2" => wanted.is_empty(),
                "cgroup" => !wanted.is_empty() && wanted.iter().all(|c| opts.contains(c)),
                _ => false,
            };
            // a hierarchy mounted at its root (a container's view mounts a subtree: skipped)
            (fits && root == "/").then(|| PathBuf::from(point))
        });
        if let Some(dir) = dir {
            out.push((format!("{id}:{ctl}"), path.to_string(), dir));
        }
    }
    out
}

/// A scratch node (module docs).
pub struct Node {
    /// The node's network namespace ("the host" to the plugins the runtimes run).
    pub host: Netns,
    /// Scratch root: the directories of [`SCRATCH_PATHS`] and whatever the tests put there.
    pub dir: TempDir,
    /// The node's name, also its hostname.
    pub name: String,
    cgroups: Vec<Cgroup>,
    keeper: Option<(Child, ChildStdin)>,
    keeper_pid: u32,
    /// `cgroup.procs` of the node's cgroups, for the join between fork and exec.
    procs_files: Vec<CString>,
}

impl Node {
    /// Make a node named `<prefix><pid><n>` (at most 15 bytes in all: a short prefix); fails
    /// the test, saying why, when a namespace, mount or cgroup cannot be made (needs root).
    pub fn new(prefix: &str) -> Node {
        Node::keeping(prefix, &[])
    }

    /// [`Node::new`], the node also keeping `dirs` reachable at their paths (besides the
    /// checkout, the binaries' directory, the peers' and the scratch root, which every node
    /// keeps) whatever it mounts over them.
    pub fn keeping(prefix: &str, dirs: &[&std::path::Path]) -> Node {
        let host = Netns::new(prefix);
        let name = host.name().to_string();
        host.run("ip", &["link", "set", "lo", "up"]);
        let dir = TempDir::new(&format!("node-{name}"));
        let mut cgroups = Vec::new();
        for (key, mine, mount) in hierarchies() {
            let path = format!("{}/{name}", mine.trim_end_matches('/'));
            let cg = mount.join(path.trim_start_matches('/'));
            std::fs::create_dir(&cg).unwrap_or_else(|e| panic!("cgroup {}: {e}", cg.display()));
            // cgroup v1's cpuset: a task joins only a cgroup with CPUs and memory nodes
            for f in ["cpuset.cpus", "cpuset.mems"] {
                let own = cg.join(f);
                if std::fs::read_to_string(&own).is_ok_and(|v| v.trim().is_empty()) {
                    let parent = std::fs::read_to_string(cg.parent().unwrap().join(f)).unwrap();
                    std::fs::write(&own, parent.trim()).unwrap_or_else(|e| panic!("{}: {e}", own.display()));
                }
            }
            cgroups.push(Cgroup { dir: cg, path, key });
        }
        assert!(!cgroups.is_empty(), "no cgroup hierarchy found in /proc/self/cgroup and mountinfo");
        let procs_files = cgroups
            .iter()
            .map(|c| CString::new(c.dir.join("cgroup.procs").into_os_string().into_encoded_bytes()).unwrap())
            .collect();
        let mut node = Node { host, dir, name, cgroups, keeper: None, keeper_pid: 0, procs_files };

        let mut cmd = node.host.command("unshare");
        node.join_cgroups(&mut cmd);
        cmd.args([
            "--mount",
            "--uts",
            "--cgroup",
            "--propagation",
            "slave",
            "sh",
            "-c",
            KEEPER_SCRIPT,
            "keeper",
        ])
        .arg(node.dir.path())
        .arg(&node.name)
        .env("KEEP", kept_dirs(dirs))
        .args(SCRATCH_PATHS.iter().map(|(n, p)| format!("{n}:{p}")))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn unshare (util-linux)");
        let stdin = child.stdin.take().expect("keeper stdin");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("keeper stdout"))
            .read_line(&mut line)
            .expect("read keeper");
        if line.trim() != "ready" {
            let out = child.wait_with_output().expect("keeper output");
            panic!(
                "cannot set up node {}'s mount namespace: {}",
                node.name,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        node.keeper_pid = child.id();
        node.keeper = Some((child, stdin));
        node
    }

    /// Make `cmd` join the node's cgroups between fork and exec.
    fn join_cgroups(&self, cmd: &mut Command) {
        let files = self.procs_files.clone();
        // SAFETY: open/write/close are async-signal-safe; the paths were allocated before fork.
        unsafe {
            cmd.pre_exec(move || {
                for f in &files {
                    let fd = libc::open(f.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if fd < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    let n = libc::write(fd, b"0".as_ptr().cast(), 1);
                    let err = std::io::Error::last_os_error();
                    libc::close(fd);
                    if n != 1 {
                        return Err(err);
                    }
                }
                Ok(())
            });
        }
    }

    /// `program`, run in the node: its cgroups, then (through `nsenter`) its network, mount
    /// and UTS namespaces. No time limit: for daemons the test stops itself.
    pub fn enter(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("nsenter");
        self.join_cgroups(&mut c);
        c.args(["-t", &self.keeper_pid.to_string(), "-m", "-n", "-u", "-C", "--"]).arg(program);
        c
    }

    /// `program`, run in the node under `timeout -k 5 <secs>` (so no command can hang a test).
    pub fn command(&self, secs: u64, program: &str) -> Command {
        let mut c = timed(secs, "nsenter");
        self.join_cgroups(&mut c);
        c.args(["-t", &self.keeper_pid.to_string(), "-m", "-n", "-u", "-C", "--", program]);
        c
    }

    /// Run `program args` in the node; panics on failure; returns stdout.
    pub fn must(&self, program: &str, args: &[&str]) -> String {
        let out: Output = self.command(CMD_TIMEOUT, program).args(args).output().expect("spawn nsenter");
        must(&format!("{program} {args:?}"), out)
    }

    /// Processes in the node's cgroups and the cgroups below them now (in any hierarchy):
    /// the daemons, and the containers they made.
    pub fn pids(&self) -> Vec<i32> {
        fn below(dir: &std::path::Path, out: &mut Vec<i32>) {
            let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            out.extend(procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
            for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    below(&e.path(), out);
                }
            }
        }
        let mut v = Vec::new();
        for c in &self.cgroups {
            below(&c.dir, &mut v);
        }
        v.sort_unstable();
        v.dedup();
        v
    }

    /// The node's cgroup directory in every hierarchy (as the machine mounts them): what its
    /// processes see as `/sys/fs/cgroup/<hierarchy>`.
    pub fn cgroup_dirs(&self) -> Vec<PathBuf> {
        self.cgroups.iter().map(|c| c.dir.clone()).collect()
    }

    /// Processes in the node's cgroups whose command name (`/proc/<pid>/comm`) is `comm`.
    pub fn pids_named(&self, comm: &str) -> Vec<i32> {
        self.pids()
            .into_iter()
            .filter(|p| std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == comm))
            .collect()
    }

    /// The identity (device, inode) of namespace `kind` (`net`, `mnt`, `uts`) of `pid`.
    fn ns_of(pid: i32, kind: &str) -> Option<(u64, u64)> {
        let m = std::fs::metadata(format!("/proc/{pid}/ns/{kind}")).ok()?;
        Some((m.dev(), m.ino()))
    }

    /// Whether `pid` runs in the node: in its network, mount and UTS namespaces and, in every
    /// hierarchy, in the node's cgroup or below it. Err says what differs.
    pub fn confines(&self, pid: i32) -> Result<(), String> {
        let keeper = self.keeper_pid as i32;
        for kind in ["net", "mnt", "uts"] {
            let (theirs, ours) = (Node::ns_of(pid, kind), Node::ns_of(keeper, kind));
            if theirs.is_none() || theirs != ours {
                return Err(format!("pid {pid} is not in node {}'s {kind} namespace", self.name));
            }
        }
        let text =
            std::fs::read_to_string(format!("/proc/{pid}/cgroup")).map_err(|e| format!("pid {pid}: {e}"))?;
        for c in &self.cgroups {
            let line = text.lines().find_map(|l| l.strip_prefix(&format!("{}:", c.key)));
            let inside = line.is_some_and(|p| p == c.path || p.starts_with(&format!("{}/", c.path)));
            if !inside {
                return Err(format!("pid {pid} is in cgroup {line:?} of {}, not below {}", c.key, c.path));
            }
        }
        Ok(())
    }

    /// Assert that every process named `comm` in the node (at least one) runs in it
    /// ([`Node::confines`]): a runtime daemon, the kubelet, a shim.
    pub fn assert_confined(&self, comm: &str) {
        let pids = self.pids_named(comm);
        assert!(!pids.is_empty(), "no {comm} process in node {}", self.name);
        for p in pids {
            if let Err(e) = self.confines(p) {
                panic!("{comm}: {e}");
            }
        }
    }

    /// Make `ns` (a pod's namespace the test made: `/run/netns/<name>` on the machine, which
    /// the node's own `/run` hides) appear at the same path inside the node, for a runtime there
    /// to be handed: a bind mount of it in the node's mount namespace (an nsfs file may be bound
    /// from another mount namespace). Undone by [`Node::release`], or with the node.
    pub fn adopt(&self, ns: &Netns) {
        let script = "touch \"$1\" && mount --no-canonicalize --bind \"$2\" \"$1\"";
        self.must("sh", &["-c", script, "adopt", ns.path_str(), &ns.fd_path()]);
    }

    /// Undo [`Node::adopt`]: the node no longer holds `ns` (when the test drops it, it goes,
    /// as a pod's namespace the runtime lost).
    pub fn release(&self, ns: &Netns) {
        self.must("sh", &["-c", "umount \"$1\" && rm \"$1\"", "release", ns.path_str()]);
    }

    /// The hostname the node's processes see.
    pub fn hostname(&self) -> String {
        self.must("hostname", &[]).trim().to_string()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some((mut child, stdin)) = self.keeper.take() {
            drop(stdin);
            let _ = child.wait();
        }
        // What a failed test left running (a daemon, an orphaned shim): all started in the node.
        let end = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let pids = self.pids();
            if pids.is_empty() {
                break;
            }
            if std::time::Instant::now() >= end {
                if !std::thread::panicking() {
                    panic!("processes of node {} do not end: {pids:?}", self.name);
                }
                break;
            }
            for p in pids {
                // SAFETY: kill(2) on a process in this node's cgroups: one the test started.
                unsafe { libc::kill(p, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut left = Vec::new();
        for c in &self.cgroups {
            remove_cgroup(&c.dir, &mut left);
        }
        if !left.is_empty() && !std::thread::panicking() {
            panic!("cgroups of node {} left: {left:?}", self.name);
        }
    }
}

/// Remove cgroup `dir` and the cgroups below it, deepest first; what cannot go is listed in
/// `left`.
fn remove_cgroup(dir: &std::path::Path, left: &mut Vec<String>) {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup(&e.path(), left);
            }
        }
    }
    if let Err(e) = std::fs::remove_dir(dir) {
        left.push(format!("{}: {e}", dir.display()));
    }
}

/// The directories a node keeps reachable ([`Node::keeping`]), one a line, for its keeper: real
/// paths, none below another (binding the outer one keeps those), at most 7 (the keeper holds
/// each on one of the descriptors 3 to 9).
fn kept_dirs(extra: &[&std::path::Path]) -> String {
    let root = crate::workspace_root();
    let mut dirs: Vec<PathBuf> = Vec::new();
    let candidates = [root.clone(), crate::bin_dir(), root.join("target/peers"), std::env::temp_dir()];
    for d in candidates.iter().map(PathBuf::as_path).chain(extra.iter().copied()) {
        if let Ok(real) = std::fs::canonicalize(d) {
            dirs.push(real);
        }
    }
    dirs.sort();
    dirs.dedup();
    let outer: Vec<PathBuf> =
        dirs.iter().filter(|d| !dirs.iter().any(|o| o != *d && d.starts_with(o))).cloned().collect();
    assert!(outer.len() <= 7, "a node keeps at most 7 directories: {outer:?}");
    let lines: Vec<String> = outer
        .iter()
        .map(|d| {
            let s = d.to_str().unwrap_or_else(|| panic!("{} is not UTF-8", d.display()));
            assert!(!s.contains('\n'), "{s:?}: a path with a newline");
            s.to_string()
        })
        .collect();
    lines.join("\n")
}
