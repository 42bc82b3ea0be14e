//! The upstream plugins our tests run beside ours: Debian's containernetworking-plugins 1.1.1
//! (`/usr/lib/cni`, iptables only) and today's release, containernetworking/plugins v1.10.0,
//! built from its Go module by scripts/install-peers.sh into target/peers/ (bridge
//! `ipMasqBackend` and portmap `backend` can be `iptables` or `nftables`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Which upstream release a test runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    /// Debian 12's containernetworking-plugins 1.1.1 (`/usr/lib/cni`).
    Debian,
    /// containernetworking/plugins v1.10.0, built by scripts/install-peers.sh.
    V1_10,
}

impl Release {
    /// Where the release's plugin binaries are. For v1.10 this runs scripts/install-peers.sh
    /// (idempotent; offline once built) and fails the test when it cannot build them: no test
    /// falls back to another release.
    pub fn dir(self) -> PathBuf {
        match self {
            Release::Debian => {
                let dir = std::env::var("CNI_UPSTREAM_DIR").unwrap_or_else(|_| "/usr/lib/cni".into());
                PathBuf::from(dir)
            }
            Release::V1_10 => v1_10_dir().to_path_buf(),
        }
    }

    /// One plugin of the release; fails the test when it is missing.
    pub fn bin(self, name: &str) -> PathBuf {
        let p = self.dir().join(name);
        assert!(
            p.is_file(),
            "upstream plugin {} missing ({}: {})",
            p.display(),
            self.name(),
            match self {
                Release::Debian => "scripts/install-deps.sh installs containernetworking-plugins",
                Release::V1_10 => "scripts/install-peers.sh builds it",
            }
        );
        p
    }

    pub fn name(self) -> &'static str {
        match self {
            Release::Debian => "1.1.1",
            Release::V1_10 => "v1.10.0",
        }
    }
}

/// target/peers/plugins-v1.10.0, built by scripts/install-peers.sh on first use in this process.
fn v1_10_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let script = crate::workspace_root().join("scripts/install-peers.sh");
        let out = Command::new(&script).arg("plugins").output().expect("run scripts/install-peers.sh");
        assert!(
            out.status.success(),
            "scripts/install-peers.sh plugins failed (the v1.10.0 peer is required): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let out = Command::new(&script).args(["--print-dir", "plugins"]).output().expect("run install-peers");
        assert!(out.status.success(), "install-peers.sh --print-dir plugins failed");
        let dir = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
        assert!(dir.join("portmap").is_file(), "no v1.10.0 plugins in {}", dir.display());
        dir
    })
}
