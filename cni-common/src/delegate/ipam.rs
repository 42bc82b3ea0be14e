//! The IPAM delegate of a request: the plugin named by `ipam.type`, located on CNI_PATH, run
//! with the request's stdin (in-process when it can be, see [`super`]).

use super::{find_in_path, Delegate, Pending};
use crate::error::{CniError, Result};
use crate::skel::Request;
use crate::spec::env::Command;
use crate::spec::result::CniResult;
use std::path::PathBuf;

/// Where the IPAM plugin configured in `req` (`ipam.type`) is on CNI_PATH; `None` when the
/// configuration names none.
pub fn path(req: &Request) -> Result<Option<PathBuf>> {
    match req.conf.ipam_type() {
        None => Ok(None),
        Some(t) => find_in_path(t, &req.env.path).map(Some),
    }
}

/// The IPAM delegate configured in `req`, located on CNI_PATH; `None` when there is none.
pub fn locate(req: &Request) -> Result<Option<Delegate>> {
    Ok(path(req)?.map(Delegate::at))
}

fn required(req: &Request) -> Result<Delegate> {
    locate(req)?.ok_or_else(|| CniError::config("no IPAM plugin configured (ipam.type is empty)"))
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
/// do its own work meanwhile; [`Pending::wait`] collects the outcome. The caller must wait for
/// it, also on its own error paths.
pub fn start(req: &Request, command: Command) -> Result<Pending> {
    required(req)?.start(command, &req.stdin)
}

/// IPAM DEL.
pub fn del(req: &Request) -> Result<()> {
    required(req)?.run(Command::Del, &req.stdin).map(drop)
}

/// IPAM GC (forwarded with the same valid-attachments list).
pub fn gc(req: &Request) -> Result<()> {
    required(req)?.run(Command::Gc, &req.stdin).map(drop)
}

/// IPAM STATUS.
pub fn status(req: &Request) -> Result<()> {
    required(req)?.run(Command::Status, &req.stdin).map(drop)
}
