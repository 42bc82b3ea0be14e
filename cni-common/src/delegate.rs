//! Running another plugin found on CNI_PATH: how bridge delegates to its IPAM plugin
//! ([`ipam`]) and how cnitool runs every plugin ([`spawn_plugin`]).
//!
//! A delegate gets the same environment with `CNI_COMMAND` replaced (and, for cnitool, the
//! other `CNI_*` variables it passes) and the complete stdin. Its result may be of any version;
//! its error object is surfaced unchanged.
//!
//! # In-process fast path
//!
//! A binary may declare, with [`allow_in_process`], plugins whose code it carries (a main
//! plugin carries its IPAM's). When a delegate's name (`ipam.type`) resolves on CNI_PATH — exactly as for an exec: the
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
//! driven through the same skeleton (the skeleton's in-process runner, `skel::InThread`, which
//! calls [`crate::skel::run_with`]) with the same inputs — stdin
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

use crate::child::{self, Use};
use crate::error::{CniError, Result};
use crate::skel::{InThread, Plugin};
use crate::spec::config::validate_plugin_type;
use crate::spec::env::Command;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command as Process;
use std::sync::OnceLock;

pub mod ipam;

/// Environment variable that, set to anything but empty or `0`, forces every delegate to be
/// exec'd (no in-process fast path).
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

    /// A delegate that runs `plugin` in-process without looking at `path` (for tests of the
    /// in-process machinery itself; real callers use [`Delegate::at`]).
    #[doc(hidden)]
    pub fn in_process_unchecked(path: PathBuf, plugin: &'static InProcess) -> Delegate {
        Delegate { path, in_process: Some(plugin) }
    }

    /// Whether it runs inside this process.
    pub fn in_process(&self) -> bool {
        self.in_process.is_some()
    }

    /// Start it with `command` and `stdin` and return while it runs (on a thread of its own
    /// when in-process; spawning a child blocks until the child has exec'd).
    pub fn start(&self, command: Command, stdin: &[u8]) -> Result<Pending> {
        match self.in_process {
            None => spawn_plugin(&self.path, command, &[], stdin, Use::Delegate),
            Some(p) => {
                let run = InThread::start(p.plugin, command, stdin.to_vec()).map_err(|e| {
                    CniError::internal(format!("exec {}: start in-process thread: {e}", self.path.display()))
                })?;
                Ok(Pending { path: self.path.clone(), running: Running::Thread(run) })
            }
        }
    }

    /// Run it to completion: its stdout on success, its error otherwise.
    pub fn run(&self, command: Command, stdin: &[u8]) -> Result<Vec<u8>> {
        self.start(command, stdin)?.wait()
    }
}

/// A delegate that has been started and fed its stdin, still running.
pub struct Pending {
    path: PathBuf,
    running: Running,
}

enum Running {
    Child(Box<child::Running>),
    Thread(InThread),
}

/// Start the plugin binary at `path` with `command` and `stdin`, without waiting for it. Its
/// environment is ours with `CNI_COMMAND` set to `command` and each of `env` set on top. Always
/// an exec (see [`Delegate`] for the in-process fast path), under the deadline of `use_`
/// ([`child`]: past it the plugin is killed and [`Pending::wait`] reports code 11).
pub fn spawn_plugin(
    path: &Path,
    command: Command,
    env: &[(&str, &str)],
    stdin: &[u8],
    use_: Use,
) -> Result<Pending> {
    let timeout = child::timeout(use_)?;
    let mut attempt = 0;
    let running = loop {
        let mut cmd = Process::new(path);
        cmd.env("CNI_COMMAND", command.as_str()).envs(env.iter().copied());
        match child::spawn(&mut cmd, Some(stdin), timeout, use_) {
            Ok(c) => break c,
            // The binary is being replaced right now: libcni retries too.
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && attempt < 5 => {
                attempt += 1;
                std::thread::sleep(std::time::Duration::from_millis(20 * attempt));
            }
            Err(e) => return Err(CniError::internal(format!("exec {}: {e}", path.display()))),
        }
    };
    Ok(Pending { path: path.to_path_buf(), running: Running::Child(Box::new(running)) })
}

impl Pending {
    /// Wait for the plugin: its stdout on success; on failure its error object, or its stderr.
    pub fn wait(self) -> Result<Vec<u8>> {
        let Pending { path, running } = self;
        let path = path.as_path();
        let out = match running {
            Running::Child(child) => child.wait()?,
            Running::Thread(run) => run.wait().ok_or_else(|| {
                CniError::internal(format!(
                    "wait for {}: the in-process run ended without a result",
                    path.display()
                ))
            })?,
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
