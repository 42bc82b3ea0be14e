//! Where the time between a plugin process and its kernel floor goes: our bridge ADD and DEL
//! and portmap DEL run under `strace -f -T` (every system call of every thread, with the time
//! spent in it), summed per kind of work, medians over the runs, beside the untraced time of the
//! same operation measured in the same loop. Tracing slows every system call down, so read the
//! shares, not the absolute figures.

use super::stats;
use cni_tests::{bin, Netns, TempDir};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Kinds of work, in table order.
const KINDS: [&str; 8] = [
    "process (exec, loader, memory, clone, exit)",
    "netlink requests (send/recv)",
    "closing netlink sockets",
    "namespaces (open, setns)",
    "/proc/sys",
    "files (IPAM store, locks)",
    "waits for threads (futex, poll)",
    "other",
];

/// One strace line: pid, syscall, first argument, return value, seconds inside the call.
struct Call {
    pid: u32,
    name: String,
    args: String,
    ret: String,
    secs: f64,
}

fn parse_line(line: &str) -> Option<Call> {
    let (pid, rest) = line.split_once(' ')?;
    let pid: u32 = pid.trim().parse().ok()?;
    let rest = rest.trim_start();
    // skip the -ttt timestamp
    let rest = rest.split_once(' ').map(|(_, r)| r).unwrap_or(rest);
    if rest.contains("<unfinished ...>") || rest.starts_with("+++") || rest.starts_with("---") {
        return None;
    }
    let (name, tail, resumed) = if let Some(r) = rest.strip_prefix("<... ") {
        let (name, tail) = r.split_once(" resumed>")?;
        (name.to_string(), tail, true)
    } else {
        let (name, tail) = rest.split_once('(')?;
        (name.to_string(), tail, false)
    };
    let open = line.rfind('<')?;
    let secs: f64 = line[open + 1..].trim_end_matches('>').parse().ok()?;
    let tail = tail[..tail.rfind('<').unwrap_or(tail.len())].trim_end();
    let (args, ret) = tail.rsplit_once(" = ").unwrap_or((tail, ""));
    let args = args.trim_end().strip_suffix(')').unwrap_or(args);
    let ret = ret.split_whitespace().next().unwrap_or("").to_string();
    // a resumed call's arguments are on its "unfinished" line: only the tail is here
    let args = if resumed { String::new() } else { args.to_string() };
    Some(Call { pid, name, args, ret, secs })
}

/// Seconds per kind of work in one trace.
fn classify(trace: &str) -> BTreeMap<&'static str, f64> {
    let mut out: BTreeMap<&'static str, f64> = KINDS.iter().map(|k| (*k, 0.0)).collect();
    // descriptors per process: netlink sockets and /proc/sys files (threads share them, but
    // the traces here have one process with threads, or a forked helper that inherits them)
    let mut netlink: HashSet<(u32, String)> = HashSet::new();
    let mut procsys: HashSet<(u32, String)> = HashSet::new();
    let fd_of = |c: &Call| c.args.split([',', ')']).next().unwrap_or("").trim().to_string();
    for line in trace.lines() {
        let Some(c) = parse_line(line) else { continue };
        let fd = fd_of(&c);
        let kind = match c.name.as_str() {
            "execve" | "brk" | "mmap" | "munmap" | "mprotect" | "arch_prctl" | "set_tid_address"
            | "set_robust_list" | "rseq" | "prlimit64" | "exit_group" | "exit" | "clone" | "clone3"
            | "vfork" | "fork" | "wait4" | "sigaltstack" | "rt_sigaction" | "rt_sigprocmask" | "madvise"
            | "getrandom" | "sched_getaffinity" => KINDS[0],
            "socket" => {
                if c.args.starts_with("AF_NETLINK") {
                    netlink.insert((c.pid, c.ret.clone()));
                }
                KINDS[1]
            }
            "sendto" | "sendmsg" | "recvfrom" | "recvmsg" | "bind" | "setsockopt" | "getsockopt"
            | "getsockname" => KINDS[1],
            "close" if netlink.remove(&(c.pid, fd.clone())) => KINDS[2],
            "close" if procsys.remove(&(c.pid, fd.clone())) => KINDS[4],
            "setns" | "unshare" => KINDS[3],
            "openat" | "open" if c.args.contains("/proc/sys/") => {
                procsys.insert((c.pid, c.ret.clone()));
                KINDS[4]
            }
            "openat" | "open" if c.args.contains("/run/netns") || c.args.contains("/ns/net") => KINDS[3],
            "read" | "write" | "pread64" | "pwrite64" if procsys.contains(&(c.pid, fd.clone())) => KINDS[4],
            "openat" | "open" | "read" | "write" | "flock" | "fcntl" | "rename" | "renameat"
            | "renameat2" | "unlink" | "unlinkat" | "fsync" | "fdatasync" | "getdents64" | "statx"
            | "newfstatat" | "fstat" | "mkdir" | "mkdirat" | "lseek" | "close" | "ftruncate" | "readlink"
            | "readlinkat" => KINDS[5],
            "futex" | "poll" | "ppoll" | "epoll_wait" | "epoll_pwait" | "nanosleep" | "clock_nanosleep" => {
                KINDS[6]
            }
            _ => KINDS[7],
        };
        *out.get_mut(kind).unwrap() += c.secs;
    }
    out
}

/// The slowest calls of one trace (name, first argument, ms), for the notes.
fn slowest(trace: &str, n: usize) -> Vec<String> {
    let mut calls: Vec<Call> = trace.lines().filter_map(parse_line).collect();
    calls.sort_by(|a, b| b.secs.total_cmp(&a.secs));
    calls
        .into_iter()
        .take(n)
        .map(|c| {
            let arg: String = c.args.chars().take(40).collect();
            let more = if c.args.chars().count() > 40 { "…" } else { "" };
            format!("`{}({}{more})` {:.2} ms", c.name, arg.replace('`', "'"), c.secs * 1000.0)
        })
        .collect()
}

struct Op {
    label: &'static str,
    untraced: Vec<Duration>,
    traced: Vec<Duration>,
    kinds: Vec<BTreeMap<&'static str, f64>>,
    example: String,
}

impl Op {
    fn new(label: &'static str) -> Op {
        Op { label, untraced: Vec::new(), traced: Vec::new(), kinds: Vec::new(), example: String::new() }
    }
}

/// Run `plugin` with `env` and `stdin`, under strace when `trace` names the output file.
fn exec(
    plugin: &str,
    env: &[(&str, &str)],
    stdin: &str,
    trace: Option<&std::path::Path>,
) -> (Value, Duration) {
    let mut cmd = match trace {
        Some(f) => {
            let mut c = Command::new("strace");
            c.args(["-f", "-T", "-ttt", "-qq", "-o"]).arg(f).arg(plugin);
            c
        }
        None => Command::new(plugin),
    };
    for (k, _) in std::env::vars() {
        if k.starts_with("CNI_") {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env.iter().copied()).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let t = Instant::now();
    let mut child = cmd.spawn().expect("run strace (scripts/install-deps.sh installs it)");
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), stdin.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let el = t.elapsed();
    assert!(
        out.status.success(),
        "{plugin}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (v, el)
}

/// `runs` traced and `runs` untraced executions of each operation, alternating.
pub fn report(runs: usize) -> String {
    let bins = TempDir::new("gapbin");
    for p in ["bridge", "host-local", "portmap"] {
        std::os::unix::fs::symlink(bin(p), bins.join(p)).expect("symlink");
    }
    let data = TempDir::new("gapdata");
    let traces = TempDir::new("gaptrace");
    let bridge = bins.join("bridge").to_string_lossy().into_owned();
    let portmap = bins.join("portmap").to_string_lossy().into_owned();
    let bconf = json!({"cniVersion": "1.0.0", "name": "gapnet", "type": "bridge", "bridge": "gapbr0",
        "isGateway": true, "hairpinMode": true,
        "ipam": {"type": "host-local", "subnet": "10.93.0.0/16", "dataDir": data.str()}})
    .to_string();
    let mut ops =
        [Op::new("bridge ADD (+host-local)"), Op::new("bridge DEL (+host-local)"), Op::new("portmap DEL")];
    let mut last_trace: HashMap<usize, String> = HashMap::new();
    for i in 0..2 * runs + 2 {
        let traced = i % 2 == 1;
        let ctr = Netns::new("gap");
        let id = format!("gap-{i}");
        let env = [
            ("CNI_CONTAINERID", id.as_str()),
            ("CNI_NETNS", ctr.path_str()),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", bins.str()),
        ];
        let with = |cmd: &'static str| {
            let mut e = env.to_vec();
            e.push(("CNI_COMMAND", cmd));
            e
        };
        let file = |k: usize| traces.join(format!("{k}-{i}"));
        let mut record = |k: usize, d: Duration, ops: &mut [Op; 3]| {
            if i < 2 {
                return; // warm-up
            }
            if traced {
                let t = std::fs::read_to_string(file(k)).unwrap_or_default();
                ops[k].traced.push(d);
                ops[k].kinds.push(classify(&t));
                last_trace.insert(k, t);
            } else {
                ops[k].untraced.push(d);
            }
        };
        let tr = |k: usize| traced.then(|| file(k));
        let (result, d) = exec(&bridge, &with("ADD"), &bconf, tr(0).as_deref());
        record(0, d, &mut ops);
        let pconf = json!({"cniVersion": "1.0.0", "name": "gapnet", "type": "portmap",
            "capabilities": {"portMappings": true}, "snat": true,
            "runtimeConfig": {"portMappings": [{"hostPort": 30000 + i as u16, "containerPort": 80, "protocol": "tcp"}]},
            "prevResult": result})
        .to_string();
        exec(&portmap, &with("ADD"), &pconf, None);
        let (_, d) = exec(&portmap, &with("DEL"), &pconf, tr(2).as_deref());
        record(2, d, &mut ops);
        let (_, d) = exec(&bridge, &with("DEL"), &bconf, tr(1).as_deref());
        record(1, d, &mut ops);
    }
    for (k, t) in last_trace {
        ops[k].example = slowest(&t, 4).join(", ");
    }
    let ms = |s: f64| format!("{:.2}", s * 1000.0);
    let mut out = String::from("| kind of work (median ms per run, all threads) |");
    for op in &ops {
        out.push_str(&format!(" {} |", op.label));
    }
    out.push_str("\n|---|---|---|---|\n");
    let med = |v: Vec<Duration>| stats(v).median.as_secs_f64();
    out.push_str("| **untraced run, whole process** |");
    for op in &ops {
        out.push_str(&format!(" **{}** |", ms(med(op.untraced.clone()))));
    }
    out.push_str("\n| traced run, whole process |");
    for op in &ops {
        out.push_str(&format!(" {} |", ms(med(op.traced.clone()))));
    }
    out.push('\n');
    for kind in KINDS {
        out.push_str(&format!("| {kind} |"));
        for op in &ops {
            let v: Vec<Duration> = op.kinds.iter().map(|m| Duration::from_secs_f64(m[kind])).collect();
            out.push_str(&format!(" {} |", ms(med(v))));
        }
        out.push('\n');
    }
    out.push_str("| outside system calls (user space, tracing) |");
    for op in &ops {
        let v: Vec<Duration> = op
            .traced
            .iter()
            .zip(&op.kinds)
            .map(|(t, m)| t.saturating_sub(Duration::from_secs_f64(m.values().sum())))
            .collect();
        out.push_str(&format!(" {} |", ms(med(v))));
    }
    out.push_str("\n\nThe slowest system calls of the last traced run of each:\n\n");
    for op in &ops {
        out.push_str(&format!("- {}: {}\n", op.label, op.example));
    }
    out
}
