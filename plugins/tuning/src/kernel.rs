//! The seams: the container's link and sysctls ([`Kernel`]) and the saved-settings directory
//! ([`Store`]). [`Real`] and [`Files`] act on the system; the fakes (tests) keep everything in
//! memory with the kernel's answers (a link gone is `ENODEV`, a sysctl that does not exist in
//! the namespace is an error) and inject failures, so every failure point of ADD is unit-tested
//! without root.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use cni_common::error::{CniError, Result};
use cni_common::netlink::{Link, Netlink, NlError};
use cni_common::netns::NetNs;
use cni_common::sysctl;
use nix::fcntl::OFlag;

use crate::saved::{Restore, Saved};

pub trait Kernel {
    /// The container's link called `name`.
    fn link(&mut self, name: &str) -> std::result::Result<Option<Link>, NlError>;
    fn set(&mut self, index: u32, change: Restore) -> std::result::Result<(), NlError>;
    /// A sysctl of the container's namespace (slash form below /proc/sys).
    fn sysctl_get(&mut self, path: &str) -> Result<String>;
    fn sysctl_set(&mut self, path: &str, value: &str) -> Result<()>;
}

pub trait Store {
    fn load(&mut self, name: &str) -> Result<Option<Saved>>;
    fn save(&mut self, name: &str, s: &Saved) -> Result<()>;
    /// Whether there was a file.
    fn remove(&mut self, name: &str) -> Result<bool>;
    /// Every saved file: (name, content; None when it does not decode).
    fn list(&mut self) -> Result<Vec<(String, Option<Saved>)>>;
}

/// The container's namespace, through netlink and /proc/sys.
pub struct Real {
    ns: NetNs,
    nl: Netlink,
}

impl Real {
    pub fn new(ns: &NetNs) -> Result<Real> {
        Ok(Real { ns: ns.try_clone()?, nl: Netlink::new_in(ns)? })
    }
}

impl Kernel for Real {
    fn link(&mut self, name: &str) -> std::result::Result<Option<Link>, NlError> {
        self.nl.link_by_name(name)
    }

    fn set(&mut self, index: u32, change: Restore) -> std::result::Result<(), NlError> {
        match change {
            Restore::Mtu(m) => self.nl.link_set_mtu(index, m),
            Restore::Mac(m) => self.nl.link_set_mac(index, m.0),
            Restore::Promisc(p) => self.nl.link_set_promisc(index, p),
            Restore::Allmulti(a) => self.nl.link_set_allmulti(index, a),
            Restore::TxQLen(q) => self.nl.link_set_txqlen(index, q),
        }
    }

    fn sysctl_get(&mut self, path: &str) -> Result<String> {
        self.ns.run(|| sysctl::get(path).map_err(|e| CniError::io(format!("read sysctl {path}: {e}"))))
    }

    fn sysctl_set(&mut self, path: &str, value: &str) -> Result<()> {
        self.ns.run(|| sysctl::set(path, value).map(drop))
    }
}

/// The most a saved-settings file may hold (they are a few dozen bytes).
const FILE_MAX: u64 = 64 << 10;

/// The saved-settings directory. Files are opened without following links and only when
/// regular; a file is written under a temporary name and renamed into place, so a crash never
/// leaves half of one.
pub struct Files {
    dir: PathBuf,
}

impl Files {
    pub fn new(dir: &Path) -> Files {
        Files { dir: dir.to_path_buf() }
    }

    fn open(&self, create: bool) -> Result<Option<std::fs::File>> {
        match cni_common::fsread::open_dir(&self.dir) {
            Ok(d) => Ok(Some(d)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && create => {
                use std::os::unix::fs::DirBuilderExt;
                std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&self.dir).map_err(|e| {
                    CniError::io(format!("failed to create backup directory {}: {e}", self.dir.display()))
                })?;
                self.open(false)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(CniError::io(format!("dataDir {}: {e}", self.dir.display()))),
        }
    }
}

impl Store for Files {
    fn load(&mut self, name: &str) -> Result<Option<Saved>> {
        let Some(dir) = self.open(false)? else { return Ok(None) };
        match cni_common::fsread::read_regular_at(dir.as_fd(), name, FILE_MAX) {
            Ok(bytes) => Ok(serde_json::from_slice(&bytes).ok()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(CniError::io(format!("{}/{name}: {e}", self.dir.display()))),
        }
    }

    fn save(&mut self, name: &str, s: &Saved) -> Result<()> {
        use std::io::Write;
        let dir = self
            .open(true)?
            .ok_or_else(|| CniError::io(format!("dataDir {} vanished", self.dir.display())))?;
        let tmp = format!(".{name}.{}", std::process::id());
        let io =
            |e: std::io::Error| CniError::io(format!("failed to save {}/{name}: {e}", self.dir.display()));
        let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_TRUNC;
        let mut f = cni_common::fsread::open_regular_at(dir.as_fd(), &tmp, flags, 0o600).map_err(io)?;
        let data = serde_json::to_vec_pretty(s).map_err(|e| CniError::internal(format!("encode: {e}")))?;
        f.write_all(&data).and_then(|_| f.sync_all()).map_err(io)?;
        nix::fcntl::renameat(dir.as_fd(), tmp.as_str(), dir.as_fd(), name).map_err(|e| io(e.into()))
    }

    fn remove(&mut self, name: &str) -> Result<bool> {
        let Some(dir) = self.open(false)? else { return Ok(false) };
        // a temporary file of this attachment's that a killed ADD left before its rename
        let temp = format!(".{name}.");
        let names = cni_common::fsread::names(&dir)
            .map_err(|e| CniError::io(format!("list {}: {e}", self.dir.display())))?;
        for n in names.iter().filter_map(|n| n.to_str()).filter(|n| n.starts_with(&temp)) {
            let _ = nix::unistd::unlinkat(dir.as_fd(), n, nix::unistd::UnlinkatFlags::NoRemoveDir);
        }
        match nix::unistd::unlinkat(dir.as_fd(), name, nix::unistd::UnlinkatFlags::NoRemoveDir) {
            Ok(()) => Ok(true),
            Err(nix::errno::Errno::ENOENT) => Ok(false),
            Err(e) => Err(CniError::io(format!("failed to remove {}/{name}: {e}", self.dir.display()))),
        }
    }

    fn list(&mut self) -> Result<Vec<(String, Option<Saved>)>> {
        let Some(dir) = self.open(false)? else { return Ok(Vec::new()) };
        let names = cni_common::fsread::names(&dir)
            .map_err(|e| CniError::io(format!("list {}: {e}", self.dir.display())))?;
        let mut out = Vec::new();
        for n in names {
            let Some(n) = n.to_str().filter(|n| n.ends_with(".json") && !n.starts_with('.')) else {
                continue;
            };
            let content = cni_common::fsread::read_regular_at(dir.as_fd(), n, FILE_MAX)
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok());
            out.push((n.to_string(), content));
        }
        Ok(out)
    }
}

#[cfg(test)]
pub mod fake {
    use super::*;
    use std::collections::BTreeMap;

    /// The container's namespace in memory.
    #[derive(Debug, Clone, Default)]
    pub struct Fake {
        pub links: Vec<Link>,
        pub sysctls: BTreeMap<String, String>,
        /// Changing calls so far; the n-th (from 1) fails with `fail_at`, never returns with
        /// `crash_at` (a panic the test catches: the process was killed there).
        pub changes: usize,
        pub fail_at: Option<usize>,
        pub crash_at: Option<usize>,
    }

    impl Fake {
        fn change(&mut self) -> std::result::Result<(), NlError> {
            self.changes += 1;
            if self.crash_at == Some(self.changes) {
                panic!("killed at change {}", self.changes);
            }
            if self.fail_at == Some(self.changes) {
                return Err(NlError::new("injected", libc::EIO));
            }
            Ok(())
        }
    }

    impl Kernel for Fake {
        fn link(&mut self, name: &str) -> std::result::Result<Option<Link>, NlError> {
            Ok(self.links.iter().find(|l| l.name == name).cloned())
        }

        fn set(&mut self, index: u32, change: Restore) -> std::result::Result<(), NlError> {
            self.change()?;
            let l = self
                .links
                .iter_mut()
                .find(|l| l.index == index)
                .ok_or_else(|| NlError::new("set", libc::ENODEV))?;
            match change {
                Restore::Mtu(m) => l.mtu = m,
                Restore::Mac(m) => l.mac = Some(m.0),
                Restore::Promisc(p) => l.flags = if p { l.flags | 0x100 } else { l.flags & !0x100 },
                Restore::Allmulti(a) => l.flags = if a { l.flags | 0x200 } else { l.flags & !0x200 },
                Restore::TxQLen(q) => l.txqlen = q,
            }
            Ok(())
        }

        fn sysctl_get(&mut self, path: &str) -> Result<String> {
            self.sysctls
                .get(path)
                .cloned()
                .ok_or_else(|| CniError::io(format!("read sysctl {path}: No such file")))
        }

        fn sysctl_set(&mut self, path: &str, value: &str) -> Result<()> {
            self.change()?;
            let v = self
                .sysctls
                .get_mut(path)
                .ok_or_else(|| CniError::io(format!("set sysctl {path}: No such file")))?;
            *v = value.to_string();
            Ok(())
        }
    }

    /// The saved-settings directory in memory.
    #[derive(Debug, Clone, Default)]
    pub struct MemStore {
        pub files: BTreeMap<String, Saved>,
        pub fail_save: bool,
    }

    impl Store for MemStore {
        fn load(&mut self, name: &str) -> Result<Option<Saved>> {
            Ok(self.files.get(name).cloned())
        }
        fn save(&mut self, name: &str, s: &Saved) -> Result<()> {
            if self.fail_save {
                return Err(CniError::io("disk full"));
            }
            self.files.insert(name.to_string(), s.clone());
            Ok(())
        }
        fn remove(&mut self, name: &str) -> Result<bool> {
            Ok(self.files.remove(name).is_some())
        }
        fn list(&mut self) -> Result<Vec<(String, Option<Saved>)>> {
            Ok(self.files.iter().map(|(k, v)| (k.clone(), Some(v.clone()))).collect())
        }
    }
}
