//! Delegation to an IPAM plugin found on CNI_PATH (how bridge runs host-local).
//!
//! The delegate gets the same environment with only `CNI_COMMAND` replaced and the complete
//! original stdin. Its result may be of any version; its error object is surfaced unchanged.
//!
//! # In-process fast path
//!
//! A binary may declare, with [`allow_in_process`], plugins whose code it carries (bridge
//! carries host-local's). When `ipam.type` resolves on CNI_PATH — exactly as for an exec: the
//! first regular file of that name — to a file that is **this very build** of such a plugin,
//! the delegate runs inside this process instead of being exec'd. "This very build" is proven
//! by [`crate::ident::file_carries`]: the file must be runnable by us (what execve checks
//! first: mode, `noexec` mounts), carry no set-id bits or file capabilities, and be a native ELF
//! executable whose `.cni_rs_ident` section holds exactly the identity compiled into this binary
//! (magic, plugin name, crate version, commit, random per-build id). That is a handful of
//! bounded reads; the file is never read whole nor run. A wrapper script, upstream's binary,
//! another build or version of ours, anything unreadable or odd: exec as always.
//!
//! Why this is equivalent: the code that would run in the child is the code linked in here,
//! driven through the same skeleton ([`crate::skel::run_with`]) with the same inputs — stdin
//! bytes, the process environment read at run time with `CNI_COMMAND` replaced, the same
//! namespaces, credentials and working directory (the run happens on a fresh thread started
//! from the calling thread, which is where a child would inherit them from). Its stdout and
//! exit code are turned into the caller's `Result` by the same code as a child's
//! ([`Pending::wait`]); what it writes to stderr reaches our stderr. Nothing is shared with the
//! caller's own work: the run owns its locals (store lock included, released when it returns),
//! and runs on its own thread, so the caller's parallelism (IPAM alongside kernel setup) stays.
//! A panic in the delegate is reported as a child's would be (the panic's error object on its
//! stdout, a failed status): the skeleton's panic hook hands it to the waiting caller and parks
//! that thread for good instead of ending the process.
//!
//! `CNI_IPAM_EXEC=1` in the environment forces the exec path (debugging, tests).

use crate::error::{CniError, Result};
use crate::skel::{Plugin, Request};
use crate::spec::config::validate_plugin_type;
use crate::spec::env::Command;
use crate::spec::result::CniResult;
use crate::spec::Version;
use std::cell::RefCell;
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command as Process, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::OnceLock;

/// Environment variable that, set to anything but empty or `0`, forces every IPAM delegate to
/// be exec'd (no in-process fast path).
pub const EXEC_ENV: &str = "CNI_IPAM_EXEC";

/// A plugin this binary carries and may run in-process instead of exec'ing its binary.
pub struct InProcess {
    /// The identity its binary carries (see [`crate::ident`]): a file on CNI_PATH is run
    /// in-process only if it holds exactly these bytes.
    pub identity: &'static [u8],
    pub plugin: &'static (dyn Plugin + Sync),
}

static IN_PROCESS: OnceLock<&'static [InProcess]> = OnceLock::new();

/// Declare the plugins this binary may run in-process (once, from `main`, before
/// [`crate::skel::run`]). Without it every delegate is exec'd.
pub fn allow_in_process(list: &'static [InProcess]) {
    let _ = IN_PROCESS.set(list);
}

fn exec_forced() -> bool {
    std::env::var_os(EXEC_ENV).is_some_and(|v| !v.is_empty() && v != "0")
}

/// Find `name` in the `:`-separated directories of `cni_path`: the first regular file wins.
pub fn find_in_path(name: &str, cni_path: &str) -> Result<PathBuf> {
    validate_plugin_type("ipam.type", name)?;
    let dirs: Vec<&str> = cni_path.split(':').filter(|d| !d.is_empty()).collect();
    if dirs.is_empty() {
        return Err(CniError::env(format!(
            "no paths provided: cannot find plugin {name:?} (CNI_PATH is empty)"
        )));
    }
    for d in &dirs {
        let p = Path::new(d).join(name);
        if std::fs::metadata(&p).map(|m| m.is_file()).unwrap_or(false) {
            return Ok(p);
        }
    }
    Err(CniError::config(format!("failed to find plugin {name:?} in path {dirs:?}")))
}

/// A delegate located on CNI_PATH, and how it will run.
#[derive(Clone)]
pub struct Delegate {
    path: PathBuf,
    in_process: Option<&'static InProcess>,
}

impl std::fmt::Debug for Delegate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delegate").field("path", &self.path).field("in_process", &self.in_process()).finish()
    }
}

impl Delegate {
    /// The delegate at `path` (already located): in-process if it is this build of a plugin
    /// declared with [`allow_in_process`] and [`EXEC_ENV`] is not set, exec'd otherwise.
    pub fn at(path: PathBuf) -> Delegate {
        let in_process = match IN_PROCESS.get() {
            Some(list) if !exec_forced() => {
                list.iter().find(|p| crate::ident::file_carries(&path, p.identity))
            }
            _ => None,
        };
        Delegate { path, in_process }
    }

    /// The IPAM delegate configured in `req` (`ipam.type`), located on CNI_PATH.
    pub fn locate(req: &Request) -> Result<Option<Delegate>> {
        Ok(delegate_path(req)?.map(Delegate::at))
    }

    /// A delegate that runs `plugin` in-process without looking at `path` (for tests of the
    /// in-process machinery itself; real callers use [`Delegate::at`]).
    #[doc(hidden)]
    pub fn in_process_unchecked(path: PathBuf, plugin: &'static InProcess) -> Delegate {
        Delegate { path, in_process: Some(plugin) }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether it runs inside this process.
    pub fn in_process(&self) -> bool {
        self.in_process.is_some()
    }

    /// Start it with `command` and `stdin` and return while it runs (on a thread of its own
    /// when in-process; spawning a child blocks until the child has exec'd).
    pub fn start(&self, command: Command, stdin: &[u8]) -> Result<Pending> {
        match self.in_process {
            None => spawn_plugin(&self.path, command, stdin),
            Some(p) => start_in_process(&self.path, p.plugin, command, stdin.to_vec()),
        }
    }

    /// Run it to completion: its stdout on success, its error otherwise.
    pub fn run(&self, command: Command, stdin: &[u8]) -> Result<Vec<u8>> {
        self.start(command, stdin)?.wait()
    }
}

/// Run a plugin binary with `command`, the current environment (CNI_COMMAND replaced) and
/// `stdin`. Returns stdout on success; on failure the plugin's error object, or its stderr.
/// Always an exec (see [`Delegate`] for the in-process fast path).
pub fn exec_plugin(path: &Path, command: Command, stdin: &[u8]) -> Result<Vec<u8>> {
    spawn_plugin(path, command, stdin)?.wait()
}

/// A delegate that has been started and fed its stdin, still running.
pub struct Pending {
    path: PathBuf,
    running: Running,
}

enum Running {
    Child(std::process::Child),
    Thread { outcome: mpsc::Receiver<Outcome>, thread: std::thread::JoinHandle<()> },
}

/// What a finished delegate left: what the caller sees of a child process.
struct Outcome {
    status: ExitStatus,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    /// The thread ran to its end (false: it panicked and is parked).
    returned: bool,
}

/// Start a plugin binary like [`exec_plugin`] without waiting for it.
pub fn spawn_plugin(path: &Path, command: Command, stdin: &[u8]) -> Result<Pending> {
    let mut attempt = 0;
    let mut child = loop {
        let spawned = Process::new(path)
            .env("CNI_COMMAND", command.as_str())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        match spawned {
            Ok(c) => break c,
            // The binary is being replaced right now: libcni retries too.
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && attempt < 5 => {
                attempt += 1;
                std::thread::sleep(std::time::Duration::from_millis(20 * attempt));
            }
            Err(e) => return Err(CniError::internal(format!("exec {}: {e}", path.display()))),
        }
    };
    if let Some(mut input) = child.stdin.take() {
        // A plugin may exit without reading stdin (e.g. on an env error): ignore EPIPE.
        if let Err(e) = input.write_all(stdin) {
            if e.kind() != std::io::ErrorKind::BrokenPipe {
                let _ = child.kill();
                let _ = child.wait();
                return Err(CniError::io(format!("write stdin of {}: {e}", path.display())));
            }
        }
    }
    Ok(Pending { path: path.to_path_buf(), running: Running::Child(child) })
}

thread_local! {
    /// On a thread running a delegate in-process: where its outcome goes.
    static OUTCOME: RefCell<Option<mpsc::Sender<Outcome>>> = const { RefCell::new(None) };
}

/// The skeleton's interface as a sized type.
struct Dyn(&'static (dyn Plugin + Sync));

impl Plugin for Dyn {
    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn supported_versions(&self) -> &'static [Version] {
        self.0.supported_versions()
    }
    fn add(&self, req: &Request) -> Result<CniResult> {
        self.0.add(req)
    }
    fn del(&self, req: &Request) -> Result<()> {
        self.0.del(req)
    }
    fn check(&self, req: &Request) -> Result<()> {
        self.0.check(req)
    }
    fn gc(&self, req: &Request) -> Result<()> {
        self.0.gc(req)
    }
    fn status(&self, req: &Request) -> Result<()> {
        self.0.status(req)
    }
}

/// Stack of the in-process run: what the main thread of a child would have.
const IN_PROCESS_STACK: usize = 8 << 20;

fn start_in_process(
    path: &Path,
    plugin: &'static (dyn Plugin + Sync),
    command: Command,
    stdin: Vec<u8>,
) -> Result<Pending> {
    let (tx, rx) = mpsc::channel();
    let thread = std::thread::Builder::new()
        .name("ipam-inproc".into())
        .stack_size(IN_PROCESS_STACK)
        .spawn(move || {
            OUTCOME.with(|o| *o.borrow_mut() = Some(tx));
            // What the child's skeleton would do: environment as ours, CNI_COMMAND replaced.
            let get = |k: &str| {
                if k == "CNI_COMMAND" {
                    Some(command.as_str().to_string())
                } else {
                    std::env::var(k).ok()
                }
            };
            let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
            let code =
                crate::skel::run_with(&Dyn(plugin), get, &mut stdin.as_slice(), &mut stdout, &mut stderr);
            let status = ExitStatus::from_raw((code & 0xff) << 8);
            if let Some(tx) = OUTCOME.with(|o| o.borrow_mut().take()) {
                let _ = tx.send(Outcome { status, stdout, stderr, returned: true });
            }
        })
        .map_err(|e| CniError::internal(format!("exec {}: start in-process thread: {e}", path.display())))?;
    Ok(Pending { path: path.to_path_buf(), running: Running::Thread { outcome: rx, thread } })
}

/// Called by the skeleton's panic hook with what it would print (the error object for stdout,
/// the line for stderr). On a thread running a delegate in-process this hands both to the
/// waiting caller as a child's output with a failed status, and parks the thread for good (a
/// panicking child ends; this process must not). Elsewhere it returns at once.
pub(crate) fn delegate_panicked(stdout: &[u8], stderr: &[u8]) {
    let tx = OUTCOME.try_with(|o| o.try_borrow_mut().ok().and_then(|mut o| o.take())).ok().flatten();
    let Some(tx) = tx else { return };
    // How a child would have ended: SIGABRT with panic=abort, exit code 101 when unwinding.
    let status = if cfg!(panic = "abort") {
        ExitStatus::from_raw(libc::SIGABRT)
    } else {
        ExitStatus::from_raw(101 << 8)
    };
    let _ = tx.send(Outcome { status, stdout: stdout.to_vec(), stderr: stderr.to_vec(), returned: false });
    loop {
        std::thread::park();
    }
}

impl Pending {
    /// Wait for an ADD started with [`start`] and decode its result into the canonical model.
    pub fn wait_result(self, req: &Request) -> Result<CniResult> {
        let out = self.wait()?;
        decode_result(req, &out)
    }

    /// Wait for the plugin: its stdout on success; on failure its error object, or its stderr.
    pub fn wait(self) -> Result<Vec<u8>> {
        let Pending { path, running } = self;
        let path = path.as_path();
        let out = match running {
            Running::Child(child) => {
                let out = child
                    .wait_with_output()
                    .map_err(|e| CniError::internal(format!("wait for {}: {e}", path.display())))?;
                Outcome { status: out.status, stdout: out.stdout, stderr: out.stderr, returned: true }
            }
            Running::Thread { outcome, thread } => match outcome.recv() {
                Ok(out) => {
                    if out.returned {
                        let _ = thread.join();
                    }
                    out
                }
                Err(_) => {
                    let _ = thread.join();
                    return Err(CniError::internal(format!(
                        "wait for {}: the in-process run ended without a result",
                        path.display()
                    )));
                }
            },
        };
        if !out.stderr.is_empty() {
            let _ = std::io::stderr().write_all(&out.stderr);
        }
        if out.status.success() {
            return Ok(out.stdout);
        }
        if let Some(e) = CniError::from_json(&out.stdout) {
            return Err(e);
        }
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        Err(CniError::internal(format!(
            "netplugin {name} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(if out.stderr.is_empty() { &out.stdout } else { &out.stderr }).trim()
        )))
    }
}

/// Decode the stdout of a successful IPAM ADD (any version) into the canonical model.
pub fn decode_result(req: &Request, out: &[u8]) -> Result<CniResult> {
    let v: serde_json::Value = serde_json::from_slice(out).map_err(|e| {
        CniError::decode(format!(
            "cannot decode result of IPAM plugin {:?}: {e}",
            req.conf.ipam_type().unwrap_or("")
        ))
    })?;
    CniResult::decode(&v, req.version).map_err(|e| e.context("IPAM result"))
}

/// Start the configured IPAM delegate with `command` and return while it runs, so the caller can
/// do its own work meanwhile; [`Pending::wait`] (or [`Pending::wait_result`] for ADD) collects
/// the outcome. The caller must wait for it, also on its own error paths.
pub fn start(req: &Request, command: Command) -> Result<Pending> {
    required(req)?.start(command, &req.stdin)
}

/// The IPAM delegate configured in `req` (`ipam.type`), located on CNI_PATH.
pub fn delegate_path(req: &Request) -> Result<Option<PathBuf>> {
    match req.conf.ipam_type() {
        None => Ok(None),
        Some(t) => find_in_path(t, &req.env.path).map(Some),
    }
}

fn required(req: &Request) -> Result<Delegate> {
    Delegate::locate(req)?.ok_or_else(|| CniError::config("no IPAM plugin configured (ipam.type is empty)"))
}

/// IPAM ADD: returns the delegate's result converted to the canonical model.
pub fn add(req: &Request) -> Result<CniResult> {
    start(req, Command::Add)?.wait_result(req)
}

/// IPAM DEL.
pub fn del(req: &Request) -> Result<()> {
    required(req)?.run(Command::Del, &req.stdin).map(drop)
}

/// IPAM CHECK.
pub fn check(req: &Request) -> Result<()> {
    required(req)?.run(Command::Check, &req.stdin).map(drop)
}

/// IPAM GC (forwarded with the same valid-attachments list).
pub fn gc(req: &Request) -> Result<()> {
    required(req)?.run(Command::Gc, &req.stdin).map(drop)
}

/// IPAM STATUS.
pub fn status(req: &Request) -> Result<()> {
    required(req)?.run(Command::Status, &req.stdin).map(drop)
}

/// IPAM ADD, then `f` with the result; if `f` fails the addresses are released again with an
/// IPAM DEL before the error is returned.
pub fn add_with_rollback<T>(req: &Request, f: impl FnOnce(CniResult) -> Result<T>) -> Result<T> {
    let result = add(req)?;
    if result.ips.is_empty() {
        let e = CniError::internal("IPAM plugin returned no IP addresses");
        if let Err(d) = del(req) {
            eprintln!("IPAM DEL after failed ADD: {d}");
        }
        return Err(e);
    }
    match f(result) {
        Ok(v) => Ok(v),
        Err(e) => {
            if let Err(d) = del(req) {
                eprintln!("IPAM DEL after failed ADD also failed: {d}");
            }
            Err(e)
        }
    }
}
