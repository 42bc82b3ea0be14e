//! Child processes with a deadline. Every program the suite runs goes through [`spawn`]: a
//! delegated plugin (IPAM), cnitool's plugins, `nft -f`/`-c`, `iptables-*-save`/`-restore`.
//!
//! The child runs in a process group of its own. One `poll(2)` loop feeds its stdin, collects
//! its stdout and stderr and waits for its exit through a pidfd (`pidfd_open`, Linux 5.3; on an
//! older kernel a helper thread blocked in `waitid(WNOWAIT)` reports the exit through a pipe),
//! so nothing busy-waits and no pipe can fill up and stall either side. Past the deadline the
//! whole process group is killed with SIGKILL (a wrapper script's own children included), the
//! child is reaped, and the call fails with code 11 naming the program and the deadline.
//! Output beyond a cap ([`Use::max_output`]) is refused the same way (code 5): a child
//! printing without end must not grow this process until the OOM killer ends it.
//!
//! Deadlines are per use ([`Use::default_timeout`]); `CNI_CHILD_TIMEOUT_MS` (ours, a number
//! of milliseconds) replaces all of them. It is validated before a plugin acts
//! ([`crate::spec::env::Env::load`]) and inherited by the children, so one value bounds a
//! whole chain of delegations.

use crate::error::{code, CniError, Result};
use std::ffi::OsStr;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Environment variable replacing every default deadline: milliseconds, 1 to [`TIMEOUT_MAX_MS`].
pub const TIMEOUT_ENV: &str = "CNI_CHILD_TIMEOUT_MS";
/// The largest value [`TIMEOUT_ENV`] accepts (one hour).
pub const TIMEOUT_MAX_MS: u64 = 3_600_000;
/// How long a killed child may take to be gone before we stop waiting for it (a process in
/// uninterruptible sleep cannot die at once; init reaps it after we exit).
const REAP_GRACE: Duration = Duration::from_secs(2);

/// What a child is run for; each use has its own default deadline and output cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Use {
    /// A plugin run by a plugin: the IPAM delegate.
    Delegate,
    /// A plugin run by cnitool (which may in turn wait for its own delegate).
    Runner,
    /// `nft -f -` / `nft -c -f -`.
    Nft,
    /// `iptables-*-save`, `iptables-*-restore --wait`, `iptables -V`.
    Iptables,
}

impl Use {
    /// The deadline without [`TIMEOUT_ENV`]. Runtimes give a whole CNI call minutes
    /// (kubelet gives RunPodSandbox twice its 2-minute runtime request timeout; containerd's
    /// CNI calls end with that request's context; libcni itself has no deadline), so ours end
    /// well before theirs and report code 11 instead of being killed without a word:
    /// * a delegate, 60 s: an IPAM plugin's own waits (its store lock) end sooner;
    /// * cnitool's plugins, 120 s: a plugin may wait up to 60 s for its delegate;
    /// * nft, 30 s: a transaction of a few hundred lines takes milliseconds;
    /// * iptables tools, 60 s: `--wait` may queue behind kube-proxy's xtables lock, and a
    ///   large node's `-save` takes seconds.
    pub fn default_timeout(self) -> Duration {
        Duration::from_secs(match self {
            Use::Delegate => 60,
            Use::Runner => 120,
            Use::Nft => 30,
            Use::Iptables => 60,
        })
    }

    /// The most a child may print on stdout (and, separately, on stderr): 16 MiB for a plugin
    /// (a result is kilobytes) and `nft`; 1 GiB for `iptables-save`, whose output on a node
    /// with tens of thousands of kube-proxy rules reaches tens of MiB.
    pub fn max_output(self) -> usize {
        match self {
            Use::Delegate | Use::Runner | Use::Nft => 16 << 20,
            Use::Iptables => 1 << 30,
        }
    }
}

/// Parse a [`TIMEOUT_ENV`] value: `None` when empty, code 4 when malformed.
pub fn parse_timeout(text: &str) -> Result<Option<Duration>> {
    if text.is_empty() {
        return Ok(None);
    }
    match text.parse::<u64>() {
        Ok(ms) if (1..=TIMEOUT_MAX_MS).contains(&ms) => Ok(Some(Duration::from_millis(ms))),
        _ => Err(CniError::env(format!(
            "{TIMEOUT_ENV}={text:?} is not a deadline: expected a number of milliseconds from 1 to {TIMEOUT_MAX_MS}"
        ))),
    }
}

/// The deadline for `use_`: [`TIMEOUT_ENV`] when set, else the default.
pub fn timeout(use_: Use) -> Result<Duration> {
    let text = std::env::var(TIMEOUT_ENV).unwrap_or_default();
    Ok(parse_timeout(&text)?.unwrap_or_else(|| use_.default_timeout()))
}

/// What a finished child left.
#[derive(Debug)]
pub struct Output {
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// How we learn that the child has exited: its pidfd, or the read end of a pipe whose write
/// end a helper thread closes once `waitid(WNOWAIT)` returned (kernels before 5.3).
struct ExitWatch {
    fd: OwnedFd,
    waiter: Option<std::thread::JoinHandle<()>>,
}

#[cfg(test)]
thread_local! {
    /// Tests of the pre-5.3 path: behave as if pidfd_open did not exist.
    static NO_PIDFD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl ExitWatch {
    fn new(pid: u32) -> std::io::Result<ExitWatch> {
        #[cfg(test)]
        let pidfd = !NO_PIDFD.get();
        #[cfg(not(test))]
        let pidfd = true;
        if pidfd {
            // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
            let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
            if fd >= 0 {
                // SAFETY: a fresh descriptor nobody else owns.
                return Ok(ExitWatch { fd: unsafe { OwnedFd::from_raw_fd(fd as RawFd) }, waiter: None });
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::ENOSYS) {
                return Err(e);
            }
        }
        let mut fds = [0 as RawFd; 2];
        // SAFETY: pipe2 fills the array with two fresh descriptors.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fresh descriptors nobody else owns.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let waiter = std::thread::Builder::new().name("child-exit".into()).spawn(move || {
            // SAFETY: siginfo_t is plain data; WNOWAIT leaves the child for Child::wait to reap.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            while unsafe {
                libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, libc::WEXITED | libc::WNOWAIT)
            } != 0
                && std::io::Error::last_os_error().kind() == ErrorKind::Interrupted
            {}
            drop(write);
        })?;
        Ok(ExitWatch { fd: read, waiter: Some(waiter) })
    }
}

/// A started child, fed and collected by [`Running::wait`].
pub struct Running {
    child: Child,
    program: String,
    watch: ExitWatch,
    stdin: Option<ChildStdin>,
    input: Vec<u8>,
    written: usize,
    stdout: Option<ChildStdout>,
    stderr: Option<ChildStderr>,
    out: Vec<u8>,
    err: Vec<u8>,
    timeout: Duration,
    deadline: Instant,
    max_output: usize,
}

fn set_nonblocking(fd: RawFd) -> std::io::Result<()> {
    // SAFETY: fcntl on a descriptor we own.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The name errors use for `cmd`: its program's file name.
fn program_name(cmd: &Command) -> String {
    let p = Path::new(cmd.get_program());
    p.file_name().unwrap_or(OsStr::new("?")).to_string_lossy().into_owned()
}

/// Start `cmd` with stdout and stderr collected, `stdin` fed to it (`None`: /dev/null), in a
/// process group of its own, under the deadline and output cap of `use_`. The spawn error is
/// returned as is (callers retry ETXTBSY); as much of `stdin` as the pipe takes is written at
/// once, the rest by [`Running::wait`].
pub fn spawn(
    cmd: &mut Command,
    stdin: Option<&[u8]>,
    timeout: Duration,
    use_: Use,
) -> std::io::Result<Running> {
    cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let started = Instant::now();
    let mut child = cmd.spawn()?;
    let watch = match ExitWatch::new(child.id()) {
        Ok(w) => w,
        Err(e) => {
            kill_group(&mut child);
            let _ = child.wait();
            return Err(e);
        }
    };
    let mut r = Running {
        program: program_name(cmd),
        watch,
        stdin: child.stdin.take(),
        input: stdin.unwrap_or_default().to_vec(),
        written: 0,
        stdout: child.stdout.take(),
        stderr: child.stderr.take(),
        child,
        out: Vec::new(),
        err: Vec::new(),
        timeout,
        deadline: started + timeout,
        max_output: use_.max_output(),
    };
    let fds = [r.stdin.as_ref().map(AsRawFd::as_raw_fd), r.stdout.as_ref().map(AsRawFd::as_raw_fd)];
    for fd in fds.into_iter().flatten().chain(r.stderr.as_ref().map(AsRawFd::as_raw_fd)) {
        if let Err(e) = set_nonblocking(fd) {
            r.abandon();
            return Err(e);
        }
    }
    r.feed();
    Ok(r)
}

/// Run `cmd` to completion under the deadline of `use_` (see [`spawn`]).
pub fn run(cmd: &mut Command, stdin: Option<&[u8]>, use_: Use) -> Result<Output> {
    let limit = timeout(use_)?;
    let name = program_name(cmd);
    spawn(cmd, stdin, limit, use_).map_err(|e| CniError::internal(format!("cannot run {name}: {e}")))?.wait()
}

/// SIGKILL the child's process group (and the child itself, should it have left the group).
fn kill_group(child: &mut Child) {
    // SAFETY: kill(2) with the group id of a child we have not reaped yet: the id cannot have
    // been reused.
    unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
    let _ = child.kill();
}

/// When `ready`, read what `pipe` holds into `buf`, closing it at end of file; `Err` says why
/// the child must be stopped (a read error, more output than `max`).
fn collect(
    ready: bool,
    pipe: &mut Option<impl Read>,
    buf: &mut Vec<u8>,
    max: usize,
    name: &str,
) -> std::result::Result<(), String> {
    let Some(p) = pipe.as_mut().filter(|_| ready) else { return Ok(()) };
    match drain(p, buf, max) {
        Ok(true) => {}
        Ok(false) => *pipe = None,
        Err(e) => return Err(format!("{name}: read error: {e}")),
    }
    if buf.len() > max {
        return Err(format!("printed more than {max} bytes on {name}: killed"));
    }
    Ok(())
}

/// Read what `pipe` holds without blocking into `buf`; `Ok(false)` at end of file.
fn drain(pipe: &mut impl Read, buf: &mut Vec<u8>, max: usize) -> std::io::Result<bool> {
    let mut chunk = [0u8; 16 * 1024];
    loop {
        match pipe.read(&mut chunk) {
            Ok(0) => return Ok(false),
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                if buf.len() > max {
                    return Ok(true);
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(true),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

impl Running {
    /// The program's file name, as errors name it.
    pub fn program(&self) -> &str {
        &self.program
    }

    /// Write as much of the pending stdin as the pipe takes; close it when all is written or
    /// the child stopped reading (EPIPE: a plugin may exit without reading its input).
    fn feed(&mut self) {
        let Some(pipe) = self.stdin.as_mut() else { return };
        while self.written < self.input.len() {
            match pipe.write(&self.input[self.written..]) {
                Ok(n) => self.written += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        self.stdin = None;
    }

    /// Wait until the child has exited and closed its output, or the deadline has passed.
    /// Code 11 past the deadline and code 5 for output beyond the cap (the process group is
    /// killed then); otherwise what the child left, whatever its exit status.
    pub fn wait(mut self) -> Result<Output> {
        let mut exited = false;
        loop {
            if exited && self.stdout.is_none() && self.stderr.is_none() {
                break;
            }
            let now = Instant::now();
            if now >= self.deadline {
                let what = if exited {
                    "exited, but its output stayed open (held by a process it started)"
                } else {
                    "did not finish"
                };
                return Err(self.fail(CniError::new(
                    code::TRY_AGAIN,
                    format!(
                        "{} {what} within {} ms: killed ({TIMEOUT_ENV} sets the deadline)",
                        self.program,
                        self.timeout.as_millis()
                    ),
                )));
            }
            // Round up: a zero timeout before the deadline would spin.
            let left = (self.deadline - now).as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
            let mut fds = Vec::with_capacity(4);
            let mut push = |fd: Option<RawFd>, events: libc::c_short| {
                if let Some(fd) = fd {
                    fds.push(libc::pollfd { fd, events, revents: 0 });
                }
            };
            push(self.stdin.as_ref().map(AsRawFd::as_raw_fd), libc::POLLOUT);
            push(self.stdout.as_ref().map(AsRawFd::as_raw_fd), libc::POLLIN);
            push(self.stderr.as_ref().map(AsRawFd::as_raw_fd), libc::POLLIN);
            push((!exited).then(|| self.watch.fd.as_raw_fd()), libc::POLLIN);
            // SAFETY: `fds` is a valid array of pollfd for the duration of the call.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, left) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == ErrorKind::Interrupted {
                    continue;
                }
                return Err(self.fail(CniError::internal(format!("wait for {}: poll: {e}", self.program))));
            }
            let ready =
                |fd: Option<RawFd>| fd.is_some_and(|fd| fds.iter().any(|p| p.fd == fd && p.revents != 0));
            if ready(self.stdin.as_ref().map(AsRawFd::as_raw_fd)) {
                self.feed();
            }
            let out_ready = ready(self.stdout.as_ref().map(AsRawFd::as_raw_fd));
            let err_ready = ready(self.stderr.as_ref().map(AsRawFd::as_raw_fd));
            let max = self.max_output;
            let collected = collect(out_ready, &mut self.stdout, &mut self.out, max, "stdout")
                .and_then(|()| collect(err_ready, &mut self.stderr, &mut self.err, max, "stderr"));
            if let Err(why) = collected {
                let e = CniError::io(format!("{} {why}", self.program));
                return Err(self.fail(e));
            }
            if !exited && ready(Some(self.watch.fd.as_raw_fd())) {
                exited = true;
                // Whatever it did not read, it never will.
                self.stdin = None;
            }
        }
        let status =
            self.child.wait().map_err(|e| CniError::internal(format!("wait for {}: {e}", self.program)))?;
        if let Some(w) = self.watch.waiter.take() {
            let _ = w.join();
        }
        Ok(Output { status, stdout: std::mem::take(&mut self.out), stderr: std::mem::take(&mut self.err) })
    }

    /// Kill the process group, reap the child (waiting at most [`REAP_GRACE`] for it to be
    /// gone) and return `e`.
    fn fail(&mut self, e: CniError) -> CniError {
        self.abandon();
        e
    }

    fn abandon(&mut self) {
        self.stdin = None;
        self.stdout = None;
        self.stderr = None;
        kill_group(&mut self.child);
        let mut p = libc::pollfd { fd: self.watch.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        let until = Instant::now() + REAP_GRACE;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            // SAFETY: one valid pollfd.
            let n = unsafe { libc::poll(&mut p, 1, left.as_millis() as libc::c_int) };
            if n > 0 {
                let _ = self.child.wait();
                if let Some(w) = self.watch.waiter.take() {
                    let _ = w.join();
                }
                return;
            }
            if n == 0 || std::io::Error::last_os_error().kind() != ErrorKind::Interrupted {
                return; // not gone yet: left for init to reap after we exit
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Command {
        let mut c = Command::new("/bin/sh");
        c.args(["-c", script]);
        c
    }

    #[test]
    fn timeout_values() {
        assert_eq!(parse_timeout("").unwrap(), None);
        assert_eq!(parse_timeout("250").unwrap(), Some(Duration::from_millis(250)));
        assert_eq!(parse_timeout("3600000").unwrap(), Some(Duration::from_secs(3600)));
        for bad in ["0", "-1", "1.5", "10s", "3600001", " 5", "99999999999999999999999"] {
            let e = parse_timeout(bad).unwrap_err();
            assert_eq!(e.code, code::INVALID_ENV, "{bad}");
            assert!(e.msg.contains(TIMEOUT_ENV), "{}", e.msg);
        }
        assert!(Use::Delegate.default_timeout() < Use::Runner.default_timeout());
    }

    #[test]
    fn collects_output_and_status() {
        let out = run(&mut sh("cat; echo err >&2; exit 3"), Some(b"hello"), Use::Nft).unwrap();
        assert_eq!(out.stdout, b"hello");
        assert_eq!(out.stderr, b"err\n");
        assert_eq!(out.status.code(), Some(3));
        let out = run(&mut sh("test -t 0 || cat"), None, Use::Nft).unwrap();
        assert!(out.stdout.is_empty() && out.status.success());
    }

    #[test]
    fn large_input_and_output_do_not_deadlock() {
        // Far more than a pipe holds, in both directions at once.
        let input = vec![b'x'; 4 << 20];
        let out = run(&mut sh("cat; head -c 3000000 /dev/zero >&2"), Some(&input), Use::Nft).unwrap();
        assert_eq!(out.stdout.len(), input.len());
        assert_eq!(out.stderr.len(), 3_000_000);
    }

    #[test]
    fn a_child_not_reading_its_input_is_no_error() {
        let out = run(&mut sh("exit 0"), Some(&vec![b'x'; 1 << 20]), Use::Nft).unwrap();
        assert!(out.status.success());
    }

    #[test]
    fn past_the_deadline_the_group_is_killed_with_code_11() {
        let dir = std::env::temp_dir().join(format!("cni-child-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pidfile = dir.join("grandchild");
        // A wrapper that starts a grandchild and waits: both must die.
        let script = format!("sleep 1000 & echo $! > {}; wait", pidfile.display());
        let r = spawn(&mut sh(&script), Some(b""), Duration::from_millis(300), Use::Delegate).unwrap();
        let e = r.wait().unwrap_err();
        assert_eq!(e.code, code::TRY_AGAIN);
        assert!(e.msg.contains("sh did not finish within 300 ms"), "{}", e.msg);
        assert!(e.msg.contains(TIMEOUT_ENV), "{}", e.msg);
        let pid: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        // The grandchild was reparented; SIGKILL was sent to it before wait returned. It is
        // gone once its pidfd says it exited (or it was already reaped).
        // SAFETY: pidfd_open on a pid; -1 with ESRCH when it is already gone.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd >= 0 {
            // SAFETY: a fresh descriptor.
            let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
            let mut p = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd; generous deadline, never a timing assertion.
            let n = unsafe { libc::poll(&mut p, 1, 30_000) };
            assert_eq!(n, 1, "grandchild {pid} still running after its group was killed");
        } else {
            assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::ESRCH));
        }
    }

    #[test]
    fn output_beyond_the_cap_is_refused() {
        let e = run(&mut sh("exec cat /dev/zero"), None, Use::Nft).unwrap_err();
        assert_eq!(e.code, code::IO);
        assert!(e.msg.contains("more than 16777216 bytes on stdout"), "{}", e.msg);
    }

    #[test]
    fn output_held_open_by_a_grandchild_ends_at_the_deadline() {
        let r = spawn(&mut sh("sleep 1000 & exit 0"), None, Duration::from_millis(300), Use::Nft).unwrap();
        let e = r.wait().unwrap_err();
        assert_eq!(e.code, code::TRY_AGAIN);
        assert!(e.msg.contains("output stayed open"), "{}", e.msg);
    }

    #[test]
    fn without_pidfd_a_helper_thread_reports_the_exit() {
        NO_PIDFD.set(true);
        let out = run(&mut sh("cat; exit 4"), Some(b"x"), Use::Nft).unwrap();
        assert_eq!((out.stdout.as_slice(), out.status.code()), (&b"x"[..], Some(4)));
        let r = spawn(&mut sh("sleep 1000"), None, Duration::from_millis(200), Use::Nft).unwrap();
        assert!(r.watch.waiter.is_some());
        assert_eq!(r.wait().unwrap_err().code, code::TRY_AGAIN);
    }

    #[test]
    fn spawn_errors_are_returned() {
        let e = spawn(&mut Command::new("/nonexistent/prog"), None, Duration::from_secs(1), Use::Nft);
        assert_eq!(e.err().unwrap().kind(), ErrorKind::NotFound);
    }
}
