//! The store handle: the directory opened once, without following a link, refused to ADD when
//! others could write it, and its `lock` file held (exclusive for changes, shared for reads) for
//! the lifetime of the value.

use super::fsops::{errno_of, io_err};
use crate::index::{Entry, Index, Stamp};
use crate::record::FileId;
use cni_common::error::{CniError, Result};
use cni_common::filelock::{lock_until, LockKind};
use cni_common::fsread::{kind, open_regular_at};
use cni_common::nsident::{boot_id, NsIdent};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, AT_FDCWD};
use nix::sys::stat::{fstat, fstatat, Mode};
use std::fs::{DirBuilder, File};
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The lock file every process working on the network (ours and upstream's) flocks.
pub const LOCK_NAME: &str = "lock";

/// What a call may do to the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// ADD: creates the directories and the lock; refuses a store others can write.
    Add,
    /// DEL, GC: remove files, keep the index up to date where it can be written.
    Change,
    /// CHECK, STATUS: never write anything (no lock file, no index, no clean-up).
    Read,
}

/// The attachment's network namespace, recorded beside each reservation ADD makes.
#[derive(Clone, Debug)]
pub struct NsNote {
    pub id: NsIdent,
    pub path: String,
}

/// How long a call waits for the store lock by default.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(60);

/// A network's store, locked for the lifetime of the value.
///
/// Changes to the index are kept back until [`Store::finish`]: reservations made by this call
/// are entered then, and a rebuilt index is put in place then. A call that fails and has taken
/// back its reservations ends with [`Store::abort`] instead, which leaves the files as they were
/// (no new or rewritten index) and the directory's mtime too, so the index stays trusted.
pub struct Store {
    pub(super) dir: PathBuf,
    pub(super) dirf: File,
    pub(super) _lock: Option<File>,
    pub(super) access: Access,
    /// The on-disk index (opened in place, or rebuilt and not yet published).
    pub(super) index: Option<Index>,
    /// The entries of a scan, when no on-disk index can (or may) be used.
    pub(super) mem: Option<Vec<Entry>>,
    /// An index update failed: the index must not be stamped as trusted by this call.
    pub(super) untrusted: bool,
    /// Reservations made by this call, not yet in the index.
    pub(super) fresh: Vec<Entry>,
    /// Reservations made by this call, with the file each is, for their netns records.
    pub(super) made: Vec<(IpAddr, FileId)>,
    /// The namespace to record for this call's reservations (ADD).
    pub note: Option<NsNote>,
    /// The directory's stamp when it was locked.
    pub(super) opened: Stamp,
    /// The directory or the index changed: re-stamp before unlocking.
    pub(super) dirty: bool,
    /// This boot's id; `None` when it cannot be read (then no record is written and nothing is
    /// judged by boot: unknown is alive).
    pub(super) boot: Option<[u8; 16]>,
    /// How many times the index was rebuilt from the IP files in this call (for tests).
    pub rebuilds: u32,
}

/// Open the store directory without following a symbolic link in its last component.
pub(super) fn open_dir(dir: &Path, create: bool) -> Result<Option<File>> {
    if create {
        DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .map_err(|e| io_err(format!("create {}", dir.display()), e))?;
    }
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    match nix::fcntl::open(dir, flags, Mode::empty()) {
        Ok(fd) => Ok(Some(File::from(fd))),
        Err(Errno::ENOENT) if !create => Ok(None),
        Err(e @ (Errno::ELOOP | Errno::ENOTDIR)) => match fstatat(AT_FDCWD, dir, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => Err(CniError::io(format!("store directory {} is {}, not a directory", dir.display(), kind(st.st_mode)))
                .with_details("host-local does not follow symbolic links to its store: point ipam.dataDir at the real directory")),
            Err(_) => Err(io_err(format!("open {}", dir.display()), e)),
        },
        Err(e) => Err(io_err(format!("open {}", dir.display()), e)),
    }
}

/// `Some(why)` when others than the plugin's user could change the store directory.
pub(super) fn unsafe_owner(dirf: &File) -> io::Result<Option<String>> {
    let st = fstat(dirf.as_fd())?;
    let me = nix::unistd::geteuid().as_raw();
    let mode = st.st_mode & 0o7777;
    if st.st_uid != me {
        return Ok(Some(format!("it belongs to uid {} (mode {mode:04o}), not to uid {me}", st.st_uid)));
    }
    if mode & 0o022 != 0 {
        return Ok(Some(format!("group or others may write it (mode {mode:04o})")));
    }
    Ok(None)
}

pub(super) fn unsafe_store(dir: &Path, why: &str) -> CniError {
    CniError::io(format!("store directory {} is not safe to allocate from: {why}", dir.display()))
        .with_details(format!(
            "whoever can write there can take or free addresses behind host-local's back; \
             chown root {0} && chmod go-w {0}",
            dir.display()
        ))
}

impl Store {
    /// Open and lock `dir` (`<dataDir>/<net>`). ADD creates the directories (mode 0755, like
    /// upstream); other calls get `None` for a missing directory. The lock is waited for at
    /// most `timeout` (then code 11 naming it): exclusive for ADD, DEL and GC, shared for
    /// CHECK and STATUS.
    pub fn open(dir: &Path, access: Access, timeout: Duration) -> Result<Option<Store>> {
        let Some(dirf) = open_dir(dir, access == Access::Add)? else { return Ok(None) };
        match unsafe_owner(&dirf).map_err(|e| io_err(format!("stat {}", dir.display()), e))? {
            Some(why) if access == Access::Add => return Err(unsafe_store(dir, &why)),
            Some(why) => cni_common::log!("host-local", "warning: {}", unsafe_store(dir, &why).msg),
            None => {}
        }
        let lock = Self::open_lock(&dirf, dir, access)?;
        let lock_path = dir.join(LOCK_NAME);
        let lock = match lock {
            Some(f) => {
                let kind = if access == Access::Read { LockKind::Shared } else { LockKind::Exclusive };
                Some(
                    lock_until(f, kind, timeout)
                        .map_err(|e| io_err(format!("lock {}", lock_path.display()), e))?,
                )
            }
            None => None,
        };
        let mut store = Store {
            dir: dir.to_path_buf(),
            dirf,
            _lock: lock,
            access,
            index: None,
            mem: None,
            untrusted: false,
            fresh: Vec::new(),
            made: Vec::new(),
            note: None,
            opened: Stamp::default(),
            dirty: false,
            boot: boot_id(),
            rebuilds: 0,
        };
        store.opened = store.dir_stamp()?;
        Ok(Some(store))
    }

    /// The lock file: created by ADD, DEL and GC (as upstream does on every call), never by
    /// CHECK and STATUS. `None` when it does not exist and cannot be created (a read-only or
    /// full filesystem: nobody else can create it either) or, for CHECK and STATUS, when it
    /// does not exist.
    pub(super) fn open_lock(dirf: &File, dir: &Path, access: Access) -> Result<Option<File>> {
        let at = dirf.as_fd();
        let fail = |e: io::Error| io_err(format!("open {}", dir.join(LOCK_NAME).display()), e);
        let plain = || open_regular_at(at, LOCK_NAME, OFlag::O_RDONLY, 0);
        if access == Access::Read {
            return match plain() {
                Ok(f) => Ok(Some(f)),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(fail(e)),
            };
        }
        match open_regular_at(at, LOCK_NAME, OFlag::O_RDONLY | OFlag::O_CREAT, 0o600) {
            Ok(f) => Ok(Some(f)),
            Err(e)
                if access == Access::Change
                    && matches!(errno_of(&e), Some(Errno::EROFS | Errno::ENOSPC | Errno::EDQUOT)) =>
            {
                match plain() {
                    Ok(f) => Ok(Some(f)),
                    Err(e2) if e2.kind() == io::ErrorKind::NotFound => Ok(None),
                    Err(e2) => Err(fail(e2)),
                }
            }
            Err(e) => Err(fail(e)),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub(super) fn at(&self) -> BorrowedFd<'_> {
        self.dirf.as_fd()
    }

    pub(super) fn path_of(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}
