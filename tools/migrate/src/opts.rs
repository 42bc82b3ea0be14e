//! What the user asked for, what happened, and a refusal: shared by every command.

use std::path::PathBuf;

/// What the user asked for.
pub struct Opts {
    pub dry_run: bool,
    /// libcni cache directories (`<dir>/results/…`).
    pub cache_dirs: Vec<PathBuf>,
    /// host-local data directories (`<dir>/<network>/<ip>`).
    pub data_dirs: Vec<PathBuf>,
    /// Where our plugins are (from-upstream runs our portmap).
    pub bin_dir: PathBuf,
    /// to-upstream: the backend upstream's bridge and portmap use where an attachment's cached
    /// configuration does not say (`--backend`; default iptables).
    pub nftables: bool,
}

/// What happened, for the user.
#[derive(Default)]
pub struct Report {
    pub done: Vec<String>,
    pub notes: Vec<String>,
}

/// A refusal before anything was changed (exit status 2).
pub fn refused(msg: impl Into<String>) -> cni_common::CniError {
    cni_common::CniError::new(cni_common::code::NOT_AVAILABLE, msg)
}
