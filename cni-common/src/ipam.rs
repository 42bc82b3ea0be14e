//! Delegation to an IPAM plugin found on CNI_PATH (how bridge runs host-local).
//!
//! The delegate gets the same environment with only `CNI_COMMAND` replaced and the complete
//! original stdin. Its result may be of any version; its error object is surfaced unchanged.

use crate::error::{CniError, Result};
use crate::skel::Request;
use crate::spec::config::validate_plugin_type;
use crate::spec::env::Command;
use crate::spec::result::CniResult;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command as Process, Stdio};

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

/// Run a plugin binary with `command`, the current environment (CNI_COMMAND replaced) and
/// `stdin`. Returns stdout on success; on failure the plugin's error object, or its stderr.
pub fn exec_plugin(path: &Path, command: Command, stdin: &[u8]) -> Result<Vec<u8>> {
    spawn_plugin(path, command, stdin)?.wait()
}

/// A delegate that has been started and fed its stdin, still running.
pub struct Pending {
    child: std::process::Child,
    path: PathBuf,
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
    Ok(Pending { child, path: path.to_path_buf() })
}

impl Pending {
    /// Wait for an ADD started with [`start`] and decode its result into the canonical model.
    pub fn wait_result(self, req: &Request) -> Result<CniResult> {
        let out = self.wait()?;
        decode_result(req, &out)
    }

    /// Wait for the plugin: its stdout on success; on failure its error object, or its stderr.
    pub fn wait(self) -> Result<Vec<u8>> {
        let Pending { child, path } = self;
        let path = path.as_path();
        let out = child
            .wait_with_output()
            .map_err(|e| CniError::internal(format!("wait for {}: {e}", path.display())))?;
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
    spawn_plugin(&required(req)?, command, &req.stdin)
}

/// The IPAM delegate configured in `req` (`ipam.type`), located on CNI_PATH.
pub fn delegate_path(req: &Request) -> Result<Option<PathBuf>> {
    match req.conf.ipam_type() {
        None => Ok(None),
        Some(t) => find_in_path(t, &req.env.path).map(Some),
    }
}

fn required(req: &Request) -> Result<PathBuf> {
    delegate_path(req)?.ok_or_else(|| CniError::config("no IPAM plugin configured (ipam.type is empty)"))
}

/// IPAM ADD: returns the delegate's result converted to the canonical model.
pub fn add(req: &Request) -> Result<CniResult> {
    start(req, Command::Add)?.wait_result(req)
}

/// IPAM DEL.
pub fn del(req: &Request) -> Result<()> {
    let path = required(req)?;
    exec_plugin(&path, Command::Del, &req.stdin).map(drop)
}

/// IPAM CHECK.
pub fn check(req: &Request) -> Result<()> {
    let path = required(req)?;
    exec_plugin(&path, Command::Check, &req.stdin).map(drop)
}

/// IPAM GC (forwarded with the same valid-attachments list).
pub fn gc(req: &Request) -> Result<()> {
    let path = required(req)?;
    exec_plugin(&path, Command::Gc, &req.stdin).map(drop)
}

/// IPAM STATUS.
pub fn status(req: &Request) -> Result<()> {
    let path = required(req)?;
    exec_plugin(&path, Command::Status, &req.stdin).map(drop)
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
