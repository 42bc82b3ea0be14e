//! The plugin skeleton: read the environment and stdin, validate, dispatch the verb, print
//! exactly one JSON document on stdout.
//!
//! Order of checks (the Go skeleton's, except that the netns safety check runs before the
//! plugin acts rather than after): environment -> VERSION -> stdin JSON -> network name ->
//! container id -> ifname -> version negotiation and verb gating -> common config ->
//! CNI_NETNS checks -> plugin.
//!
//! A plugin runs as a process ([`run`]) or, for in-process delegation
//! ([`crate::delegate`]), on a thread of the calling plugin (`InThread`) that behaves like a
//! child process: same skeleton, same inputs, its stdout and exit status handed to the caller,
//! and a panic reported as the process's panic hook would report it.

use crate::error::{code, CniError, Result};
use crate::netns::NetNs;
use crate::spec::config::{require_object, validate_plugin_type, Attachment, NetConf};
use crate::spec::env::{
    validate_container_id, validate_ifname, validate_network_name, CniArgs, Command, Env, EnvOutcome,
};
use crate::spec::json;
use crate::spec::result::{pretty, CniResult};
use crate::spec::version::{parse_semver, version_reply, Version};
use crate::trace::TraceParent;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::cell::RefCell;
use std::io::{Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;

/// What a plugin implements. Every verb of spec 1.1.0 is required: a plugin with nothing to
/// do for a verb says so explicitly by returning `Ok`.
pub trait Plugin {
    /// Binary name (used in the about banner).
    fn name(&self) -> &'static str;

    /// Spec versions this plugin accepts in `cniVersion`.
    fn supported_versions(&self) -> &'static [Version] {
        &Version::ALL
    }

    fn add(&self, req: &Request) -> Result<CniResult>;
    fn del(&self, req: &Request) -> Result<()>;
    fn check(&self, req: &Request) -> Result<()>;
    fn gc(&self, req: &Request) -> Result<()>;
    fn status(&self, req: &Request) -> Result<()>;
}

/// One validated invocation.
#[derive(Debug, Clone)]
pub struct Request {
    pub command: Command,
    pub env: Env,
    /// The negotiated version: the config's `cniVersion`, which the output must use.
    pub version: Version,
    /// Raw stdin, forwarded unchanged to delegated IPAM.
    pub stdin: Vec<u8>,
    /// Stdin parsed as a JSON object.
    pub config: Value,
    /// The common keys of the config.
    pub conf: NetConf,
    /// `prevResult`, decoded (any version) before the plugin runs, so a malformed one is
    /// rejected by every plugin before anything is touched.
    pub prev: Option<CniResult>,
    /// CNI_NETNS as the skeleton found it ([`Request::container_netns`]).
    ns: Checked,
}

/// What the skeleton's check of CNI_NETNS found.
#[derive(Debug, Clone)]
enum Checked {
    /// Opened, a network namespace, not the plugin's own.
    Open(std::sync::Arc<NetNs>),
    /// DEL: nothing there any more (or CNI_NETNS empty).
    Gone,
    /// Not checked (CNI_NETNS_OVERRIDE, a verb without an attachment), or DEL found something
    /// it cannot use (the plugin opens it and reports why).
    Unchecked,
}

impl Request {
    /// Decode the plugin's own configuration struct from the whole stdin object, with Go's
    /// key matching. Type errors are code 6 naming the field.
    pub fn plugin_config<T: DeserializeOwned>(&self) -> Result<T> {
        json::from_ref(&self.config).map_err(|e| CniError::decode(format!("invalid network config: {e}")))
    }

    /// The previous result in the canonical model, if the runtime sent one.
    pub fn prev_result(&self) -> Result<Option<CniResult>> {
        Ok(self.prev.clone())
    }

    /// CNI_NETNS, or None when empty (DEL may be called without one).
    pub fn netns(&self) -> Option<&Path> {
        Some(Path::new(&self.env.netns)).filter(|_| !self.env.netns.is_empty())
    }

    /// The container's network namespace: the handle the skeleton opened when it checked
    /// CNI_NETNS (so the namespace used is the one checked, and it is opened once), or, where
    /// it did not (CNI_NETNS_OVERRIDE), CNI_NETNS opened now. None when CNI_NETNS is empty or
    /// the namespace is gone (only DEL gets this far with a vanished one).
    pub fn container_netns(&self) -> Result<Option<std::sync::Arc<NetNs>>> {
        match (&self.ns, self.netns()) {
            (Checked::Open(ns), _) => Ok(Some(ns.clone())),
            (Checked::Gone, _) | (Checked::Unchecked, None) => Ok(None),
            (Checked::Unchecked, Some(path)) => Ok(NetNs::open_if_exists(path)?.map(std::sync::Arc::new)),
        }
    }

    /// [`Request::container_netns`] where the verb needs it (ADD, CHECK): an error naming
    /// CNI_NETNS when there is none.
    pub fn require_netns(&self) -> Result<std::sync::Arc<NetNs>> {
        match self.container_netns()? {
            Some(ns) => Ok(ns),
            None if self.netns().is_none() => Err(CniError::env("CNI_NETNS is required")),
            None => Err(CniError::new(
                code::UNKNOWN_CONTAINER,
                format!(
                    "CNI_NETNS {:?} does not exist: the container's network namespace is gone",
                    self.env.netns
                ),
            )),
        }
    }

    /// CNI_ARGS checked against the keys this plugin understands.
    pub fn cni_args(&self, known: &[&str]) -> Result<CniArgs> {
        let a = CniArgs::parse(&self.env.args)?;
        a.validate(known)?;
        Ok(a)
    }

    /// The GC list (both key spellings merged).
    pub fn valid_attachments(&self) -> Result<Vec<Attachment>> {
        self.conf.gc_valid_attachments()
    }

    /// The network name (validated).
    pub fn network(&self) -> &str {
        &self.conf.name
    }
}

/// The most a plugin reads from stdin: 8 MiB. A configuration is kilobytes; the largest real
/// input is a GC's list of valid attachments (about 90 bytes per attachment, so some 90 000
/// of them fit), and a larger stdin is a runtime bug or an attack (`/dev/zero` as stdin would
/// otherwise grow the process until the OOM killer ends it).
pub const STDIN_MAX: usize = 8 << 20;

/// Read stdin to its end, refusing more than [`STDIN_MAX`] bytes with code 5 (the read is
/// what failed, before anything was decoded; the same code as any other input over its cap).
fn read_stdin(stdin: &mut dyn Read) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    stdin
        .take(STDIN_MAX as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| CniError::io(format!("error reading from stdin: {e}")))?;
    if bytes.len() > STDIN_MAX {
        return Err(CniError::io(format!(
            "stdin holds more than {STDIN_MAX} bytes (8 MiB), the most a plugin reads: nothing was done"
        )));
    }
    Ok(bytes)
}

/// Stdin must be one JSON object.
fn parse_stdin(bytes: &[u8]) -> Result<Value> {
    let config: Value = serde_json::from_slice(bytes)
        .map_err(|e| CniError::decode(format!("error unmarshall network config: {e}")))?;
    require_object(&config)?;
    Ok(config)
}

impl Request {
    /// Validate and assemble a request from the environment and stdin: every check the
    /// skeleton makes before a plugin runs (identifiers, version and verb gates, common
    /// config, prevResult, CNI_NETNS). Plugins' unit tests build requests through this too.
    pub fn new(env: Env, stdin: Vec<u8>, supported: &[Version]) -> Result<Request> {
        let config = parse_stdin(&stdin)?;
        Request::from_parts(env, stdin, config, supported)
    }

    fn from_parts(env: Env, stdin: Vec<u8>, config: Value, supported: &[Version]) -> Result<Request> {
        let command = env.command.ok_or_else(|| CniError::env("CNI_COMMAND is missing"))?;
        let raw_version = match config.get("cniVersion") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(other) => {
                return Err(CniError::decode(format!(
                    "error unmarshall network config: cniVersion must be a string, got {other}"
                )))
            }
        };
        let name = match config.get("name") {
            None | Some(Value::Null) => "",
            Some(Value::String(s)) => s.as_str(),
            Some(other) => {
                return Err(CniError::decode(format!(
                    "error unmarshall network config: name must be a string, got {other}"
                )))
            }
        };
        validate_network_name(name)?;
        if command.has_attachment() {
            validate_container_id(&env.container_id)?;
            validate_ifname(&env.ifname)?;
        }
        let version = negotiate(command, &raw_version, supported)?;
        let conf = NetConf::from_value(&config)?;
        if !conf.plugin_type.is_empty() {
            validate_plugin_type("type", &conf.plugin_type)?;
        }
        if command == Command::Gc
            && config.get("cni.dev/valid-attachments").is_none()
            && config.get("cni.dev/attachments").is_none()
        {
            return Err(gc_without_list());
        }
        let prev = conf.prev_result(version)?;
        let ns = if command.has_attachment() && !env.netns_override {
            check_netns(command, &env.netns)?
        } else {
            Checked::Unchecked
        };
        Ok(Request { command, env, version, stdin, config, conf, prev, ns })
    }
}

/// GC without a `cni.dev/valid-attachments` list (nor the misspelled `cni.dev/attachments`):
/// refused, because an absent list must never be read as "nothing is valid" — that would
/// tear down every live attachment of the network. libcni 1.3's `cnitool gc` sends no list;
/// runtimes that pass `GCArgs` (CRI-O) and our cnitool always send one.
fn gc_without_list() -> CniError {
    CniError::config(
        "GC needs \"cni.dev/valid-attachments\" naming the attachments to keep, and this request has none \
         (nor the older \"cni.dev/attachments\"): refusing to garbage-collect",
    )
    .with_details(
        "without the list every attachment of this network would look stale and GC would delete live pods' \
         interfaces, addresses, port mappings and shaping; nothing was changed. Send the list in the GC \
         config: [{\"containerID\": ..., \"ifname\": ...}, ...] for the attachments still in use, or [] \
         (or null) when none is. libcni sends it when GCNetworkList gets non-nil GCArgs (CRI-O does); \
         libcni 1.3's \"cnitool gc\" sends none (its DELs of cached attachments still ran); our cnitool's \
         gc sends one (CNI_GC_KEEP names the attachments to keep)",
    )
}

/// The version an error is reported in, remembered for the panic hook.
static REPORT_VERSION: AtomicUsize = AtomicUsize::new(usize::MAX);

fn report_version() -> &'static str {
    match REPORT_VERSION.load(Ordering::Relaxed) {
        i if i < Version::ALL.len() => Version::ALL[i].as_str(),
        _ => Version::LATEST.as_str(),
    }
}

fn remember_version(v: Version) {
    if let Some(i) = Version::ALL.iter().position(|x| *x == v) {
        REPORT_VERSION.store(i, Ordering::Relaxed);
    }
}

/// Print a CNI error JSON on stdout if the process panics: with `panic = "abort"` nothing
/// else would tell the runtime what happened. [`run`] installs it; public for tests of
/// in-process delegation.
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let msg = match info.payload().downcast_ref::<&str>() {
            Some(s) => (*s).to_string(),
            None => {
                info.payload().downcast_ref::<String>().cloned().unwrap_or_else(|| "unknown panic".into())
            }
        };
        let loc = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
        let trace = crate::trace::current();
        let details = trace.map(|t| t.decorate_details(""));
        let json = panic_report(report_version(), &format!("internal error: {msg}{loc}"), details.as_deref());
        let line = format!("{}\n", crate::trace::format_line("panic", trace, format_args!("{msg}{loc}")));
        // A plugin running in-process (InThread) reports like a child process would and never
        // returns here; anywhere else the process reports and ends.
        InThread::panicked(json.as_bytes(), line.as_bytes());
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(json.as_bytes());
        let _ = out.flush();
        let _ = std::io::stderr().write_all(line.as_bytes());
    }));
}

/// The error object a panic is reported with (code 999), as `pretty` would print
/// `CniError::to_json`, but serialized from a struct: a `serde_json::Map` seeds its hasher from the
/// OS's random source, and that failing may be the very panic being reported (the hook must not
/// panic in turn, or nothing is printed at all).
fn panic_report(version: &str, msg: &str, details: Option<&str>) -> String {
    #[derive(serde::Serialize)]
    struct Report<'a> {
        #[serde(rename = "cniVersion")]
        cni_version: &'a str,
        code: u32,
        msg: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        details: Option<&'a str>,
    }
    let mut buf = Vec::new();
    let fmt = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let report = Report { cni_version: version, code: code::INTERNAL, msg, details };
    // Writing a struct of strings into a Vec cannot fail.
    let _ = serde::Serialize::serialize(&report, &mut serde_json::Serializer::with_formatter(&mut buf, fmt));
    buf.push(b'\n');
    String::from_utf8_lossy(&buf).into_owned()
}

/// Run `plugin` as a process: real environment, stdin and stdout. Never returns.
pub fn run(plugin: &impl Plugin) -> ! {
    install_panic_hook();
    let code = run_with(
        plugin,
        |k| std::env::var(k).ok(),
        &mut std::io::stdin().lock(),
        // Not locked for the whole run: other threads (an in-process IPAM delegate, the panic
        // hook) write to stderr meanwhile, and holding the lock would block them for good.
        &mut std::io::stdout(),
        &mut std::io::stderr(),
    );
    std::process::exit(code)
}

/// What a finished plugin run leaves: what a caller sees of a child process.
pub(crate) type Outcome = crate::child::Output;

thread_local! {
    /// On a thread running a plugin in-process: where its outcome goes, and whether the run
    /// returned (false: it panicked and the thread is parked).
    static OUTCOME: RefCell<Option<mpsc::Sender<(Outcome, bool)>>> = const { RefCell::new(None) };
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

/// Stack of an in-process run: what the main thread of a child would have.
const IN_THREAD_STACK: usize = 8 << 20;

/// A plugin running in-process on a thread of its own, as a child process would run it.
pub(crate) struct InThread {
    outcome: mpsc::Receiver<(Outcome, bool)>,
    thread: std::thread::JoinHandle<()>,
}

impl InThread {
    /// Start `plugin` with `command` and `stdin` on a fresh thread (started from the calling
    /// thread, so it has the caller's namespaces and credentials, as a child would): the
    /// environment is ours, read at run time, with `CNI_COMMAND` replaced.
    pub(crate) fn start(
        plugin: &'static (dyn Plugin + Sync),
        command: Command,
        stdin: Vec<u8>,
    ) -> std::io::Result<InThread> {
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("ipam-inproc".into())
            .stack_size(IN_THREAD_STACK)
            .spawn(move || {
                OUTCOME.with(|o| *o.borrow_mut() = Some(tx));
                let get = |k: &str| {
                    if k == "CNI_COMMAND" {
                        Some(command.as_str().to_string())
                    } else {
                        std::env::var(k).ok()
                    }
                };
                let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
                let code = run_with(&Dyn(plugin), get, &mut stdin.as_slice(), &mut stdout, &mut stderr);
                let status = ExitStatus::from_raw((code & 0xff) << 8);
                if let Some(tx) = OUTCOME.with(|o| o.borrow_mut().take()) {
                    let _ = tx.send((Outcome { status, stdout, stderr }, true));
                }
            })?;
        Ok(InThread { outcome: rx, thread })
    }

    /// Wait for the run to end; `None` when it ended without a result.
    pub(crate) fn wait(self) -> Option<Outcome> {
        match self.outcome.recv() {
            Ok((out, returned)) => {
                if returned {
                    let _ = self.thread.join();
                }
                Some(out)
            }
            Err(_) => {
                let _ = self.thread.join();
                None
            }
        }
    }

    /// Called by the panic hook with what it would print (the error object for stdout, the
    /// line for stderr). On a thread running a plugin in-process this hands both to the
    /// waiting caller as a child's output with a failed status, and parks the thread for good
    /// (a panicking child ends; this process must not). Elsewhere it returns at once.
    fn panicked(stdout: &[u8], stderr: &[u8]) {
        let tx = OUTCOME.try_with(|o| o.try_borrow_mut().ok().and_then(|mut o| o.take())).ok().flatten();
        let Some(tx) = tx else { return };
        // How a child would have ended: SIGABRT with panic=abort, exit code 101 when unwinding.
        let status = if cfg!(panic = "abort") {
            ExitStatus::from_raw(libc::SIGABRT)
        } else {
            ExitStatus::from_raw(101 << 8)
        };
        let _ = tx.send((Outcome { status, stdout: stdout.to_vec(), stderr: stderr.to_vec() }, false));
        loop {
            std::thread::park();
        }
    }
}

/// The release of upstream's plugins (containernetworking/plugins) whose keys and behaviour
/// this suite matches, and which `scripts/install-peers.sh` builds as the peer to compare with.
pub const UPSTREAM_RELEASE: &str = "1.10.0";

/// The version word of the about banner: upstream's release that ours stands in for, with this
/// suite's own version as semver build metadata, e.g. `v1.10.0+cni-rs.0.1.0`.
///
/// Why this shape: tools read the banner as upstream's (`CNI <name> plugin v1.x.y`). Nomad runs
/// every file of its CNI bin dir with no arguments, takes the first whitespace-separated word of
/// stdout and stderr that parses as a semantic version (hashicorp/go-version's `NewSemver`) and
/// schedules bridge networking only where the five plugins its bridge mode chains are
/// `semver >= 0.4.0`; our own 0.1.0 would fail that, though we implement every verb of spec
/// 1.1.0. Build metadata is ignored by every semver comparison (Nomad's included), so the word
/// compares exactly as upstream's same release, and a pre-release tag (`-cni-rs`) would not do:
/// it sorts before the release. The metadata keeps ours recognisable (`cni-migrate` tells our
/// build from upstream's by it).
pub const BANNER_VERSION: &str = concat!("v1.10.0+cni-rs.", env!("CARGO_PKG_VERSION"));

/// The about banner printed on stderr when CNI_COMMAND is unset.
pub fn about(name: &str, versions: &[Version]) -> String {
    let list: Vec<&str> = versions.iter().map(|v| v.as_str()).collect();
    format!(
        "CNI {name} plugin {BANNER_VERSION} ({})\nCNI protocol versions supported: {}\n",
        option_env!("CNI_BUILD_COMMIT").unwrap_or("unknown commit"),
        list.join(", ")
    )
}

/// Testable core of [`run`]: returns the exit code.
pub fn run_with(
    plugin: &impl Plugin,
    get: impl Fn(&str) -> Option<String>,
    stdin: &mut dyn Read,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> i32 {
    let mut version_for_errors = Version::LATEST.as_str().to_string();
    let outcome = dispatch(plugin, &get, stdin, stdout, stderr, &mut version_for_errors);
    match outcome {
        Ok(()) => 0,
        Err(e) => {
            // The caller's trace, read through `get` like the rest of the environment.
            let e = e.traced(TraceParent::from_env(&get).as_ref());
            let _ = writeln!(stdout, "{}", pretty(&e.to_json(&version_for_errors)));
            let _ = stdout.flush();
            1
        }
    }
}

fn dispatch(
    plugin: &impl Plugin,
    get: &impl Fn(&str) -> Option<String>,
    stdin: &mut dyn Read,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
    version_for_errors: &mut String,
) -> Result<()> {
    let env = match Env::load(get)? {
        EnvOutcome::NoCommand => {
            let _ = write!(stderr, "{}", about(plugin.name(), plugin.supported_versions()));
            return Ok(());
        }
        EnvOutcome::Ready(env) => env,
    };
    let command = env.command.expect("Env::load sets the command");
    if command == Command::Version {
        let reply = version_reply(plugin.supported_versions());
        writeln!(stdout, "{reply}").map_err(|e| CniError::io(format!("write stdout: {e}")))?;
        return Ok(());
    }

    let bytes = read_stdin(stdin)?;
    let config = parse_stdin(&bytes)?;
    // Report errors in the config's version when it is a string we know.
    if let Some(v) = config.get("cniVersion").and_then(Value::as_str).and_then(Version::from_str_exact) {
        *version_for_errors = v.as_str().to_string();
        remember_version(v);
    } else if config.get("cniVersion").is_none_or(Value::is_null) {
        *version_for_errors = Version::V0_1_0.as_str().to_string();
    }
    let req = Request::from_parts(env, bytes, config, plugin.supported_versions())?;
    let version = req.version;
    match command {
        Command::Add => {
            let result = plugin.add(&req)?;
            let text = result.to_pretty(version)?;
            writeln!(stdout, "{text}").map_err(|e| CniError::io(format!("write stdout: {e}")))?;
        }
        Command::Del => plugin.del(&req)?,
        Command::Check => plugin.check(&req)?,
        Command::Gc => plugin.gc(&req)?,
        Command::Status => plugin.status(&req)?,
        Command::Version => unreachable!("handled above"),
    }
    Ok(())
}

/// Version negotiation with the verb gates of the spec: CHECK needs >= 0.4.0, GC and STATUS
/// need >= 1.1.0. For those verbs a version string that cannot be compared is code 6.
///
/// A gated verb's refusal is upstream's error object exactly (code 1, its message, no
/// details): a Go plugin that delegates the verb to ours (its IPAM, through `ipam.ExecCheck`)
/// hands on `err.Error()`, message and details joined, and upstream's own suites match that
/// string (scripts/upstream-tests.sh).
fn negotiate(command: Command, raw: &str, supported: &[Version]) -> Result<Version> {
    let gate = match command {
        Command::Check => Some(((0, 4, 0), "CHECK")),
        Command::Gc => Some(((1, 1, 0), "GC")),
        Command::Status => Some(((1, 1, 0), "STATUS")),
        _ => None,
    };
    if let Some((min, verb)) = gate {
        let parsed = if raw.is_empty() { Some((0, 1, 0)) } else { parse_semver(raw) };
        let Some(v) = parsed else {
            return Err(CniError::decode(format!("invalid version {raw:?}: expected major.minor.patch")));
        };
        if v < min {
            return Err(CniError::new(
                code::INCOMPATIBLE_VERSION,
                format!("config version does not allow {verb}"),
            ));
        }
    }
    Version::negotiate(raw, supported)
}

/// CNI_NETNS must exist, be a network namespace and not be the plugin's own. DEL accepts an
/// empty, vanished or unmounted path (the container is gone; cleanup continues). Whatever is
/// at the path is looked at through an `O_PATH` descriptor and opened for real only when it is
/// on nsfs ([`NetNs::open_if_exists`]): a FIFO or a device there is refused (code 4) without
/// blocking and without the side effects of opening it.
fn check_netns(command: Command, netns: &str) -> Result<Checked> {
    if netns.is_empty() {
        return Ok(Checked::Gone); // only DEL gets here: ADD/CHECK require the variable
    }
    let is_del = command == Command::Del;
    let path = Path::new(netns);
    let ns = match NetNs::open_if_exists(path) {
        Ok(Some(ns)) => ns,
        Ok(None) if is_del => return Ok(Checked::Gone),
        Err(_) if is_del => return Ok(Checked::Unchecked),
        Ok(None) if !path.exists() => {
            return Err(CniError::new(
                code::UNKNOWN_CONTAINER,
                format!("CNI_NETNS {netns:?} does not exist: the container's network namespace is gone"),
            ))
        }
        Ok(None) => return Err(CniError::env(format!("CNI_NETNS {netns:?} is not a network namespace"))),
        Err(e) => return Err(CniError::env(format!("CNI_NETNS {netns:?}: {}", e.msg))),
    };
    if ns.same_as(&NetNs::current()?) {
        return Err(CniError::new(
            code::INVALID_NETNS,
            "plugin's netns and netns from CNI_NETNS should not be the same",
        )
        .with_details(format!("CNI_NETNS {netns:?} is the namespace the plugin runs in")));
    }
    Ok(Checked::Open(std::sync::Arc::new(ns)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn banner_version_is_upstreams_release_with_ours_as_build_metadata() {
        assert_eq!(BANNER_VERSION, format!("v{UPSTREAM_RELEASE}+cni-rs.{}", env!("CARGO_PKG_VERSION")));
        let banner = about("example", &Version::ALL);
        assert!(banner.starts_with(&format!("CNI example plugin {BANNER_VERSION} (")), "{banner}");
    }

    #[test]
    fn panic_report_is_the_error_object_pretty_prints() {
        for (v, msg) in [("1.1.0", "internal error: boom at x.rs:1"), ("0.2.0", "quote \" and \\ and \u{1}")]
        {
            let want = format!("{}\n", pretty(&CniError::internal(msg).to_json(v)));
            assert_eq!(panic_report(v, msg, None), want);
            let traced = CniError::internal(msg).with_details("trace 4bf92f3577b34da6a3ce929d0e0e4736");
            let want = format!("{}\n", pretty(&traced.to_json(v)));
            assert_eq!(panic_report(v, msg, Some("trace 4bf92f3577b34da6a3ce929d0e0e4736")), want);
        }
    }
}
