//! The on-disk store, byte-compatible with upstream host-local:
//! `<dataDir>/<net>/<ip>` holds `<id>\r\n<ifname>` (legacy files only `<id>`),
//! `last_reserved_ip.<set>` the round-robin cursor, `lock` the flock serialising every process
//! (ours and upstream's) working on the network.
//!
//! Additions, invisible to upstream's logic:
//! - `.host-local-index`: the attachment index ([`crate::index`]). Upstream reads it during its
//!   directory walks but its content (which contains spaces) can never equal `<id>\r\n<ifname>`
//!   or `<id>`, so upstream never treats it as a reservation. Its name is not an IP, so
//!   upstream's duplicate check ignores it.
//! - After every change we set the directory's mtime to "now - 1 s" and record the resulting
//!   mtime (with device, inode and boot id) in the index header. Any later creation or removal
//!   of a file by another program sets the mtime to the current time, which can never equal
//!   the recorded value (it is 1 s in the past, so even a filesystem with coarse or 1-second
//!   timestamps shows the change). A mismatch makes us rebuild the index from the IP files.
//!
//! Reservations appear atomically: the content is written to an unnamed `O_TMPFILE`, then
//! linked to the IP name (`EEXIST` = taken). A killed plugin leaves either no file or a
//! complete one, never an empty file (upstream plugins#498). There is no fsync: after a power
//! loss a just-linked file may come back empty (the data had not reached the disk), and so may
//! a file of an upstream writer killed between its create and its write. Both are handled on
//! the read side instead: every change happens under the lock, so an empty reservation file
//! found under the lock can only be such debris, and an allocation that meets one reclaims the
//! address. (An fsync per ADD cost 0.2 ms on an idle disk and hundreds of ms on a busy one, on
//! the path of every pod start.)

//!
//! Distrust: the store directory is opened once (`O_DIRECTORY | O_NOFOLLOW`) and every file is
//! reached relative to that handle, never through a symbolic link (`O_NOFOLLOW`), never waited
//! on (`O_NONBLOCK`), only when it is a regular file, and never read past a cap. A store
//! directory that another user owns or that group or others may write is refused by ADD (its
//! addresses could be taken or freed behind our back) and reported on stderr by the other verbs,
//! which go on (tearing down must not be blocked by it).
//!
//! Full and read-only stores: the index is an optimisation. When it cannot be written (no
//! space, read-only filesystem) or must not be (CHECK, STATUS), the call works from a scan of
//! the files held in memory and publishes nothing. DEL and GC then write nothing but the
//! removals they exist for; CHECK and STATUS never write at all (no lock file, no index, no
//! clean-up).

use crate::index::{key_hash, unlink_if_there, Entry, Index, Kind, Stamp};
use crate::record::{self, FileId, Record, BOOT_MARKER, RECORDS_DIR, RECORD_CAP};
use cni_common::attachment::AttachmentId;
use cni_common::error::{code, CniError, Result};
use cni_common::filelock::{lock_until, LockKind};
use cni_common::fsread::{kind, open_regular_at, read_regular_at};
use cni_common::nsident::{boot_id, NsIdent};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, AT_FDCWD};
use nix::sys::stat::{fstat, fstatat, futimens, Mode};
use nix::sys::time::TimeSpec;
use std::fs::{DirBuilder, File};
use std::io::{self, Write};
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const LAST_RESERVED_PREFIX: &str = "last_reserved_ip.";
pub const LOCK_NAME: &str = "lock";
/// Named temp files used only where `O_TMPFILE` is not available; a leftover one is removed
/// by the next scan (all our work happens under the lock, so any such file found is stale,
/// except this process's own: [`tmp_name`]).
const TMP_PREFIX: &str = ".host-local-tmp-";

/// This process's named temp file.
fn tmp_name() -> String {
    format!("{TMP_PREFIX}{}", std::process::id())
}
/// Largest reservation file read: a container id comes from an environment variable (at most
/// 128 KiB, the kernel's limit for one), plus the interface name and some whitespace.
pub const RESERVATION_CAP: u64 = 256 << 10;
/// A cursor holds one address.
const CURSOR_CAP: u64 = 64;

/// Who a reservation file says holds the address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Owner {
    Attachment {
        id: String,
        ifname: String,
    },
    Legacy {
        id: String,
    },
    /// Empty (or whitespace-only) file: a crash leftover of upstream's create-then-write.
    Unknown,
    /// Something named like an address that is no reservation file (a FIFO, a symbolic link,
    /// an oversized file): it blocks the address, is never read, and is left alone.
    Foreign(String),
}

impl Owner {
    /// Classify file content exactly as upstream's comparisons would: the content is trimmed,
    /// then compared with `<id>\r\n<ifname>`, else with `<id>`.
    pub fn parse(content: &[u8]) -> Owner {
        let text = String::from_utf8_lossy(content);
        let t = text.trim();
        if t.is_empty() {
            Owner::Unknown
        } else if let Some((id, ifname)) = t.split_once("\r\n") {
            Owner::Attachment { id: id.to_string(), ifname: ifname.to_string() }
        } else {
            Owner::Legacy { id: t.to_string() }
        }
    }

    /// What the index files this owner under.
    fn key(&self) -> Option<(Kind, u64)> {
        match self {
            Owner::Attachment { id, ifname } => {
                Some((Kind::Attachment, key_hash(Kind::Attachment, id, ifname)))
            }
            Owner::Legacy { id } => Some((Kind::Legacy, key_hash(Kind::Legacy, id, ""))),
            Owner::Unknown | Owner::Foreign(_) => None,
        }
    }

    fn entry(&self, ip: IpAddr) -> Option<Entry> {
        self.key().map(|(kind, key)| Entry { kind, key, ip })
    }
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Owner::Attachment { id, ifname } => write!(f, "container {id} interface {ifname}"),
            Owner::Legacy { id } => write!(f, "container {id}"),
            Owner::Unknown => write!(f, "an empty reservation file"),
            Owner::Foreign(what) => write!(f, "no reservation file ({what})"),
        }
    }
}

/// Parse a directory entry name as a reservation: the canonical text of an IP address.
pub fn reservation_name(name: &str) -> Option<IpAddr> {
    let ip: IpAddr = name.parse().ok()?;
    (ip.to_string() == name).then_some(ip)
}

fn transient(e: &io::Error) -> bool {
    e.raw_os_error()
        .is_some_and(|n| matches!(Errno::from_raw(n), Errno::EAGAIN | Errno::EINTR | Errno::EBUSY))
        || e.kind() == io::ErrorKind::TimedOut
}

/// A failed file operation: code 11 ("try again") when the system says the condition is
/// transient (`EAGAIN`, `EINTR`, `EBUSY`, a lock wait past its deadline), code 5 otherwise.
fn io_err(what: impl std::fmt::Display, e: impl Into<io::Error>) -> CniError {
    let e: io::Error = e.into();
    let c = if transient(&e) { code::TRY_AGAIN } else { code::IO };
    CniError::new(c, format!("{what}: {e}"))
}

fn errno_of(e: &io::Error) -> Option<Errno> {
    e.raw_os_error().map(Errno::from_raw)
}

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
    dir: PathBuf,
    dirf: File,
    _lock: Option<File>,
    access: Access,
    /// The on-disk index (opened in place, or rebuilt and not yet published).
    index: Option<Index>,
    /// The entries of a scan, when no on-disk index can (or may) be used.
    mem: Option<Vec<Entry>>,
    /// An index update failed: the index must not be stamped as trusted by this call.
    untrusted: bool,
    /// Reservations made by this call, not yet in the index.
    fresh: Vec<Entry>,
    /// Reservations made by this call, with the file each is, for their netns records.
    made: Vec<(IpAddr, FileId)>,
    /// The namespace to record for this call's reservations (ADD).
    pub note: Option<NsNote>,
    /// The directory's stamp when it was locked.
    opened: Stamp,
    /// The directory or the index changed: re-stamp before unlocking.
    dirty: bool,
    /// This boot's id; `None` when it cannot be read (then no record is written and nothing is
    /// judged by boot: unknown is alive).
    boot: Option<[u8; 16]>,
    /// How many times the index was rebuilt from the IP files in this call (for tests).
    pub rebuilds: u32,
}

/// A reservation found for an owner: its index slot (`None`: not in the on-disk index) and
/// address.
pub type Held = (Option<u64>, IpAddr);

/// A reservation content ready to be linked under some address name.
pub struct Pending {
    file: Option<File>,
    tmp_name: Option<String>,
    dir: Option<File>,
    content: Vec<u8>,
}

impl Pending {
    /// Write `content` into `file`; `named`: the temp file's name and directory, removed when
    /// the pending reservation is dropped (also when this write fails).
    fn filled(mut file: File, named: Option<(String, File)>, content: Vec<u8>) -> Result<Pending> {
        let (tmp_name, dir) = named.unzip();
        let mut pending = Pending { file: None, tmp_name, dir, content };
        file.write_all(&pending.content).map_err(|e| io_err("write reservation", e))?;
        pending.file = Some(file);
        Ok(pending)
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let (Some(name), Some(dir)) = (&self.tmp_name, &self.dir) {
            let _ = unlink_if_there(dir.as_fd(), name);
        }
    }
}

/// Open the store directory without following a symbolic link in its last component.
fn open_dir(dir: &Path, create: bool) -> Result<Option<File>> {
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
fn unsafe_owner(dirf: &File) -> io::Result<Option<String>> {
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

fn unsafe_store(dir: &Path, why: &str) -> CniError {
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
            Some(why) => eprintln!("host-local: warning: {}", unsafe_store(dir, &why).msg),
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
    fn open_lock(dirf: &File, dir: &Path, access: Access) -> Result<Option<File>> {
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

    fn at(&self) -> BorrowedFd<'_> {
        self.dirf.as_fd()
    }

    fn path_of(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn dir_stamp(&self) -> Result<Stamp> {
        let st = fstat(self.at()).map_err(|e| io_err(format!("stat {}", self.dir.display()), e))?;
        Ok(Stamp {
            dev: st.st_dev,
            ino: st.st_ino,
            sec: st.st_mtime,
            nsec: st.st_mtime_nsec,
            // an unknown boot never matches a stamp (see [`Store::load_index`])
            boot: self.boot.unwrap_or_default(),
        })
    }

    /// Make sure the index (on disk or in memory) is loaded: the on-disk one when its stamp
    /// matches the directory, else rebuilt from the IP files.
    fn load_index(&mut self) -> Result<()> {
        if self.index.is_some() || self.mem.is_some() {
            return Ok(());
        }
        if let Some(idx) = Index::open(self.at(), self.access != Access::Read) {
            if self.boot.is_some() && *idx.stamp() == self.opened {
                self.index = Some(idx);
                return Ok(());
            }
        }
        self.rebuild()?;
        Ok(())
    }

    /// Read every reservation file (the slow path, as upstream does on every call). Removes the
    /// stale temp files of earlier calls on the way (except in read-only calls). Entries that are no
    /// reservation files (FIFOs, links, oversized files) are skipped with a warning.
    pub fn scan(&self) -> Result<Vec<(IpAddr, Owner)>> {
        let listing = format!("/proc/self/fd/{}", self.dirf.as_raw_fd());
        let rd =
            std::fs::read_dir(&listing).map_err(|e| io_err(format!("read {}", self.dir.display()), e))?;
        let mut out = Vec::new();
        for ent in rd {
            let ent = ent.map_err(|e| io_err(format!("read {}", self.dir.display()), e))?;
            let name = ent.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.starts_with(TMP_PREFIX) {
                // Ours may hold a pending reservation (Store::pending_named removes a stale one).
                if self.access != Access::Read && name != tmp_name() {
                    let _ = unlink_if_there(self.at(), name);
                }
                continue;
            }
            let Some(ip) = reservation_name(name) else { continue };
            match read_regular_at(self.at(), name, RESERVATION_CAP) {
                Ok(content) => out.push((ip, Owner::parse(&content))),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                // Not ours to judge: it stays, and blocks the address (linkat says EEXIST).
                Err(e) => eprintln!("host-local: skipping {}: {e}", self.path_of(name).display()),
            }
        }
        Ok(out)
    }

    /// Rebuild the index from the IP files.
    pub fn rebuild(&mut self) -> Result<Vec<(IpAddr, Owner)>> {
        let all = self.scan()?;
        self.set_index(&all);
        self.rebuilds += 1;
        Ok(all)
    }

    /// A new index of `all`: written beside the old one and put in place by [`Store::finish`];
    /// kept in memory only when it must not or cannot be written.
    fn set_index(&mut self, all: &[(IpAddr, Owner)]) {
        let entries: Vec<Entry> = all.iter().filter_map(|(ip, o)| o.entry(*ip)).collect();
        // The files were read: this call's reservations are among them.
        self.fresh.clear();
        if let Some(old) = self.index.take() {
            old.discard(self.at());
        }
        if self.access == Access::Read {
            self.mem = Some(entries);
            return;
        }
        match Index::build(self.at(), &entries) {
            Ok(idx) => {
                self.index = Some(idx);
                self.mem = None;
                self.dirty = true;
            }
            Err(e) => {
                eprintln!(
                    "host-local: cannot write the index of {} ({e}): working from the files; a later call rebuilds it",
                    self.dir.display()
                );
                self.mem = Some(entries);
            }
        }
    }

    /// The owner recorded in the file for `ip`; `None` when there is no such file.
    pub fn owner_of(&self, ip: IpAddr) -> Result<Option<Owner>> {
        let name = ip.to_string();
        match read_regular_at(self.at(), &name, RESERVATION_CAP) {
            Ok(c) => Ok(Some(Owner::parse(&c))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) if e.raw_os_error().is_none() => Ok(Some(Owner::Foreign(e.to_string()))),
            Err(e) => Err(io_err(format!("read {}", self.path_of(&name).display()), e)),
        }
    }

    /// Index hits for (`kind`, `key`): with the slot when the on-disk index has them.
    fn lookup(&mut self, kind: Kind, key: u64) -> Result<Vec<Held>> {
        self.load_index()?;
        if let Some(idx) = &self.index {
            match idx.lookup(kind, key) {
                Ok(hits) => return Ok(hits.into_iter().map(|(s, ip)| (Some(s), ip)).collect()),
                Err(e) => {
                    eprintln!(
                        "host-local: the index of {} is unreadable ({e}): scanning",
                        self.dir.display()
                    );
                    self.index = None;
                    self.untrusted = true;
                    self.fresh.clear(); // the scan sees this call's reservations
                    let all = self.scan()?;
                    self.mem = Some(all.iter().filter_map(|(ip, o)| o.entry(*ip)).collect());
                }
            }
        }
        let mem = self.mem.as_ref().expect("loaded above");
        Ok(mem.iter().filter(|e| e.kind == kind && e.key == key).map(|e| (None, e.ip)).collect())
    }

    /// Addresses held by `owner` according to the index (and the reservations of this call),
    /// each verified against its file, with the index slot when it has one. Stale index entries
    /// are dropped.
    fn held_by(&mut self, owner: &Owner) -> Result<Vec<Held>> {
        let Some((kind, key)) = owner.key() else { return Ok(Vec::new()) };
        let mut out = Vec::new();
        for (slot, ip) in self.lookup(kind, key)? {
            if self.owner_of(ip)?.as_ref() == Some(owner) {
                out.push((slot, ip));
            } else if let Some(slot) = slot {
                self.forget_slot(slot);
            }
        }
        out.extend(self.fresh.iter().filter(|e| e.kind == kind && e.key == key).map(|e| (None, e.ip)));
        Ok(out)
    }

    /// Tombstone an index slot whose file is gone (not in read-only calls: the hit is verified
    /// away each time instead).
    fn forget_slot(&mut self, slot: u64) {
        if self.access == Access::Read {
            return;
        }
        if let Some(idx) = self.index.as_mut() {
            match idx.remove(slot) {
                Ok(()) => self.dirty = true,
                Err(_) => self.untrusted = true,
            }
        }
    }

    /// Files of `a` — `<id>\r\n<ifname>` content.
    pub fn held_exact(&mut self, a: &AttachmentId) -> Result<Vec<Held>> {
        self.held_by(&Owner::Attachment { id: a.container_id.trim().to_string(), ifname: a.ifname.clone() })
    }

    /// Legacy files of `id` — `<id>` content.
    pub fn held_legacy(&mut self, id: &str) -> Result<Vec<Held>> {
        self.held_by(&Owner::Legacy { id: id.trim().to_string() })
    }

    /// Prepare the reservation content of `a` in an unnamed file.
    pub fn pending(&self, a: &AttachmentId) -> Result<Pending> {
        let content = a.reservation().into_bytes();
        let tmpfile = nix::fcntl::openat(
            self.at(),
            ".",
            OFlag::O_TMPFILE | OFlag::O_WRONLY | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        );
        match tmpfile {
            Ok(fd) => Pending::filled(File::from(fd), None, content),
            // No O_TMPFILE on this filesystem.
            Err(_) => self.pending_named(content),
        }
    }

    /// Prepare `content` in a named temp file, linked then removed (where the filesystem has
    /// no `O_TMPFILE`).
    fn pending_named(&self, content: Vec<u8>) -> Result<Pending> {
        let name = tmp_name();
        unlink_if_there(self.at(), &name)
            .map_err(|e| io_err(format!("remove {}", self.path_of(&name).display()), e))?;
        let create = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL;
        let f = open_regular_at(self.at(), &name, create, 0o600)
            .map_err(|e| io_err(format!("create {}", self.path_of(&name).display()), e))?;
        let dir = self.dirf.try_clone().map_err(|e| io_err("duplicate a directory handle", e))?;
        Pending::filled(f, Some((name, dir)), content)
    }

    /// Link `p` under the name of `ip`. `false` when the address is taken.
    fn link(&self, p: &Pending, ip: IpAddr) -> Result<bool> {
        let dst = ip.to_string();
        let res = match (&p.tmp_name, &p.file) {
            (Some(tmp), _) => {
                nix::unistd::linkat(self.at(), tmp.as_str(), self.at(), dst.as_str(), AtFlags::empty())
            }
            (None, Some(f)) => {
                let src = format!("/proc/self/fd/{}", f.as_raw_fd());
                nix::unistd::linkat(
                    AT_FDCWD,
                    src.as_str(),
                    self.at(),
                    dst.as_str(),
                    AtFlags::AT_SYMLINK_FOLLOW,
                )
            }
            (None, None) => unreachable!("a pending reservation has a file"),
        };
        match res {
            Ok(()) => Ok(true),
            Err(Errno::EEXIST) => Ok(false),
            Err(e) => Err(io_err(format!("create {}", self.path_of(&dst).display()), e)),
        }
    }

    /// Try to reserve `ip` for `a` with the prepared content `p`. On success the pending
    /// content is used up (`p` is reset); the index gets the entry in [`Store::finish`].
    pub fn reserve(&mut self, p: &mut Option<Pending>, ip: IpAddr, a: &AttachmentId) -> Result<bool> {
        self.load_index()?;
        if p.is_none() {
            *p = Some(self.pending(a)?);
        }
        if !self.link(p.as_ref().expect("set above"), ip)? {
            // Taken, unless the file is empty: debris of a killed upstream writer or of a power
            // loss (see the module docs). We hold the lock, so nobody is writing it now.
            if !self.reclaim_if_empty(ip)? || !self.link(p.as_ref().expect("set above"), ip)? {
                return Ok(false);
            }
        }
        let done = p.take().expect("set above");
        if let Some(f) = &done.file {
            if let Ok(st) = fstat(f.as_fd()) {
                let hash = crate::index::fnv(&[&done.content]);
                let id =
                    FileId { ino: st.st_ino, ctime_sec: st.st_ctime, ctime_nsec: st.st_ctime_nsec, hash };
                self.made.push((ip, id));
            }
        }
        self.dirty = true;
        let key = key_hash(Kind::Attachment, a.container_id.trim(), &a.ifname);
        self.fresh.push(Entry { kind: Kind::Attachment, key, ip });
        Ok(true)
    }

    /// Remove the reservation file of `ip` if it is empty. Returns whether it did.
    fn reclaim_if_empty(&mut self, ip: IpAddr) -> Result<bool> {
        let name = ip.to_string();
        match fstatat(self.at(), name.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_size == 0 => {}
            _ => return Ok(false),
        }
        unlink_if_there(self.at(), &name)
            .map_err(|e| io_err(format!("remove empty {}", self.path_of(&name).display()), e))?;
        self.dirty = true;
        eprintln!("host-local: reclaimed {ip}: its reservation file was empty (an interrupted write)");
        Ok(true)
    }

    /// Remove the reservation of `ip` found at index `slot` (`None`: not in the on-disk index),
    /// and its netns record.
    pub fn release(&mut self, slot: Option<u64>, ip: IpAddr) -> Result<()> {
        let name = ip.to_string();
        self.dirty = true;
        unlink_if_there(self.at(), &name)
            .map_err(|e| io_err(format!("remove {}", self.path_of(&name).display()), e))?;
        self.remove_record(ip);
        if let Some(slot) = slot {
            self.forget_slot(slot);
        }
        self.fresh.retain(|e| e.ip != ip);
        self.made.retain(|m| m.0 != ip);
        if let Some(mem) = self.mem.as_mut() {
            mem.retain(|e| e.ip != ip);
        }
        Ok(())
    }

    /// Release whatever `a` holds at `ip` (rollback of a failed ADD).
    pub fn release_ip(&mut self, a: &AttachmentId, ip: IpAddr) -> Result<()> {
        for (slot, held) in self.held_exact(a)? {
            if held == ip {
                self.release(slot, held)?;
            }
        }
        Ok(())
    }

    /// The round-robin cursor of range set `set`. A missing or unparsable cursor is `None`
    /// (allocation starts at the range start); one that is no regular file (a symbolic link, a
    /// FIFO) is an error: ADD would write through it.
    pub fn last_reserved(&self, set: usize) -> Result<Option<IpAddr>> {
        let name = format!("{LAST_RESERVED_PREFIX}{set}");
        match read_regular_at(self.at(), &name, CURSOR_CAP) {
            Ok(b) => Ok(std::str::from_utf8(&b).ok().and_then(|t| t.trim().parse().ok())),
            Err(e) if matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::FileTooLarge) => Ok(None),
            Err(e) => Err(io_err(format!("read {}", self.path_of(&name).display()), e)),
        }
    }

    /// Replace the content of the regular file `name` in place (created when missing).
    fn write_file(&self, name: &str, content: &[u8]) -> Result<()> {
        write_in_place(self.at(), name, content)
            .map_err(|e| io_err(format!("write {}", self.path_of(name).display()), e))
    }

    /// Write the cursor in place, as upstream does (it is only a hint: a torn write just
    /// restarts round-robin at the range start).
    pub fn set_last_reserved(&mut self, set: usize, ip: IpAddr) -> Result<()> {
        self.dirty = true;
        self.write_file(&format!("{LAST_RESERVED_PREFIX}{set}"), ip.to_string().as_bytes())
    }

    /// The raw cursor file of `set` (`None`: no file), to restore it on rollback.
    pub fn cursor_snapshot(&self, set: usize) -> Option<Vec<u8>> {
        read_regular_at(self.at(), &format!("{LAST_RESERVED_PREFIX}{set}"), CURSOR_CAP).ok()
    }

    /// Put back a cursor saved by [`Store::cursor_snapshot`].
    pub fn restore_cursor(&mut self, set: usize, saved: Option<Vec<u8>>) -> Result<()> {
        if self.cursor_snapshot(set) == saved {
            return Ok(());
        }
        let name = format!("{LAST_RESERVED_PREFIX}{set}");
        self.dirty = true;
        match saved {
            Some(content) => self.write_file(&name, &content),
            None => unlink_if_there(self.at(), &name)
                .map_err(|e| io_err(format!("restore {}", self.path_of(&name).display()), e)),
        }
    }

    /// Whether no file holds `ip` (STATUS; does not reserve).
    pub fn is_free(&self, ip: IpAddr) -> bool {
        matches!(
            fstatat(self.at(), ip.to_string().as_str(), AtFlags::AT_SYMLINK_NOFOLLOW),
            Err(Errno::ENOENT)
        )
    }

    /// GC: remove every reservation for which `keep` is false (empty files included: they
    /// have no owner; files that are no reservations stay), with their netns records, and
    /// records that no longer belong to a reservation; then rebuild the index from what is
    /// left. Errors are collected.
    pub fn retain(&mut self, keep: impl Fn(&Owner) -> bool) -> Result<(Vec<IpAddr>, Vec<CniError>)> {
        let all = self.scan()?;
        let mut removed = Vec::new();
        let mut errors = Vec::new();
        let mut left = Vec::with_capacity(all.len());
        for (ip, owner) in all {
            if keep(&owner) {
                left.push((ip, owner));
                continue;
            }
            let name = ip.to_string();
            match unlink_if_there(self.at(), &name) {
                Ok(()) => {
                    self.dirty = true;
                    self.remove_record(ip);
                    removed.push(ip);
                }
                Err(e) => {
                    errors.push(io_err(format!("remove {}", self.path_of(&name).display()), e));
                    left.push((ip, owner));
                }
            }
        }
        for (ip, rec) in self.records() {
            if self.file_id(ip) != Some(rec.file) {
                self.remove_record(ip);
            }
        }
        if self.dirty || self.index.is_none() {
            self.set_index(&left);
        }
        Ok((removed, errors))
    }

    /// Before unlocking: if anything changed, enter this call's reservations in the index, write
    /// their netns records, set the directory mtime to "now - 1 s", record the resulting stamp
    /// in the index and put a rebuilt index in place, so the next call can trust it. Nothing
    /// here fails the call: an index that cannot be written is left untrusted (rebuilt by a
    /// later call), a record that cannot be written leaves its reservation live for ever.
    pub fn finish(&mut self) {
        if !self.dirty {
            return;
        }
        if !self.made.is_empty() {
            self.write_records();
        }
        if self.index.is_none() || self.untrusted {
            // Memory only (or a failed update): publish nothing, stamp nothing.
            if let Some(idx) = self.index.take() {
                idx.discard(self.at());
            }
            return;
        }
        if let Err(e) = self.publish_index() {
            eprintln!("host-local: the index of {} is left to be rebuilt: {e}", self.dir.display());
            if let Some(idx) = self.index.take() {
                idx.discard(self.at());
            }
        }
        self.dirty = false;
    }

    fn publish_index(&mut self) -> io::Result<()> {
        let Store { dirf, index, fresh, boot, .. } = self;
        let boot = boot.unwrap_or_default();
        let dir = dirf.as_fd();
        let idx = index.as_mut().expect("checked by the caller");
        for e in std::mem::take(fresh) {
            idx.insert(dir, e)?;
        }
        // In place before the stamp is taken: the rename changes the directory too.
        idx.publish(dir)?;
        let now =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_err(io::Error::other)?;
        let then = TimeSpec::new(now.as_secs() as i64 - 1, i64::from(now.subsec_nanos()));
        futimens(dir, &TimeSpec::UTIME_OMIT, &then)?;
        let st = fstat(dir)?;
        let stamp = Stamp { dev: st.st_dev, ino: st.st_ino, sec: st.st_mtime, nsec: st.st_mtime_nsec, boot };
        idx.set_stamp(stamp)
    }

    /// End a call that failed after taking back every reservation it made: no index is put in
    /// place or changed, and the directory gets back the mtime it had when it was locked (its
    /// files are what they were then), so the index stays as trusted as it was.
    pub fn abort(mut self) {
        if let Some(idx) = self.index.take() {
            idx.discard(self.at());
        }
        if self.dirty {
            let m = TimeSpec::new(self.opened.sec, self.opened.nsec);
            if let Err(e) = futimens(self.at(), &TimeSpec::UTIME_OMIT, &m) {
                eprintln!("host-local: restore the mtime of {}: {e}", self.dir.display());
            }
        }
    }

    // --- netns records (crate::record) ---

    /// The records directory, if it exists (created with `create`).
    fn records_dir(&self, create: bool) -> io::Result<Option<File>> {
        if create {
            match nix::sys::stat::mkdirat(self.at(), RECORDS_DIR, Mode::from_bits_truncate(0o700)) {
                Ok(()) => {
                    // New: nothing from an earlier boot is in it (only made when the boot is
                    // known: see write_records).
                    let d = self.records_dir(false)?.expect("just made");
                    let boot = self.boot.ok_or_else(|| io::Error::other("the boot id is unknown"))?;
                    write_in_place(d.as_fd(), BOOT_MARKER, record::boot_marker(&boot).as_bytes())?;
                    return Ok(Some(d));
                }
                Err(Errno::EEXIST) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        match nix::fcntl::openat(self.at(), RECORDS_DIR, flags, Mode::empty()) {
            Ok(fd) => Ok(Some(File::from(fd))),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Write the records of this call's reservations (ADD; [`Store::note`] says what to record).
    fn write_records(&mut self) {
        let Some(note) = self.note.clone() else { return };
        let made = std::mem::take(&mut self.made);
        let Some(boot) = self.boot else {
            // A record says "made in this boot"; with the boot unknown it would be judged
            // later against a boot it does not name. No record: live until released.
            eprintln!(
                "host-local: the boot id (/proc/sys/kernel/random/boot_id) cannot be read: this call's \
                 reservations are not recorded (they count as live until released)"
            );
            return;
        };
        let result = (|| -> io::Result<()> {
            let d = self.records_dir(true)?.expect("created");
            for (ip, file) in made {
                let rec = Record { file, boot, ns: note.id, path: note.path.clone() };
                replace_file(d.as_fd(), &ip.to_string(), rec.encode().as_bytes())?;
            }
            Ok(())
        })();
        if let Err(e) = result {
            eprintln!(
                "host-local: cannot record the network namespace of this call's reservations in {}: {e} \
                 (they count as live until released)",
                self.path_of(RECORDS_DIR).display()
            );
        }
    }

    /// The well-formed record of `ip`, if there is one.
    pub fn record(&self, ip: IpAddr) -> Option<Record> {
        let d = self.records_dir(false).ok()??;
        Record::parse(&read_regular_at(d.as_fd(), &ip.to_string(), RECORD_CAP).ok()?)
    }

    /// Every well-formed record, by address.
    pub fn records(&self) -> Vec<(IpAddr, Record)> {
        let Ok(Some(d)) = self.records_dir(false) else { return Vec::new() };
        let Ok(rd) = std::fs::read_dir(format!("/proc/self/fd/{}", d.as_raw_fd())) else { return Vec::new() };
        let mut out = Vec::new();
        for ent in rd.flatten() {
            let Some(ip) = ent.file_name().to_str().and_then(reservation_name) else { continue };
            if let Ok(b) = read_regular_at(d.as_fd(), &ip.to_string(), RECORD_CAP) {
                if let Some(rec) = Record::parse(&b) {
                    out.push((ip, rec));
                }
            }
        }
        out.sort_by_key(|(ip, _)| *ip);
        out
    }

    fn remove_record(&mut self, ip: IpAddr) {
        if self.access == Access::Read {
            return;
        }
        if let Ok(Some(d)) = self.records_dir(false) {
            let _ = unlink_if_there(d.as_fd(), &ip.to_string());
        }
    }

    /// Which file the reservation of `ip` is (`None`: none, or no regular file).
    pub fn file_id(&self, ip: IpAddr) -> Option<FileId> {
        let mut f = open_regular_at(self.at(), &ip.to_string(), OFlag::O_RDONLY, 0).ok()?;
        let st = fstat(f.as_fd()).ok()?;
        let content = cni_common::fsread::read_capped(&mut f, RESERVATION_CAP).ok()?;
        Some(FileId {
            ino: st.st_ino,
            ctime_sec: st.st_ctime,
            ctime_nsec: st.st_ctime_nsec,
            hash: crate::index::fnv(&[&content]),
        })
    }

    /// The boot id a pass over earlier boots' reservations last ran in (`None`: no records).
    pub fn records_boot(&self) -> Option<[u8; 16]> {
        let d = self.records_dir(false).ok()??;
        match read_regular_at(d.as_fd(), BOOT_MARKER, RECORD_CAP) {
            Ok(b) => Some(record::parse_boot_marker(&b).unwrap_or_default()),
            Err(_) => Some([0; 16]),
        }
    }

    /// Note that earlier boots' reservations were dealt with in this boot.
    pub fn set_records_boot(&self) {
        let Some(boot) = self.boot else { return };
        if let Ok(Some(d)) = self.records_dir(false) {
            if let Err(e) = replace_file(d.as_fd(), BOOT_MARKER, record::boot_marker(&boot).as_bytes()) {
                eprintln!(
                    "host-local: cannot write {}: {e}",
                    self.path_of(RECORDS_DIR).join(BOOT_MARKER).display()
                );
            }
        }
    }

    /// This boot's id, `None` when unknown.
    pub fn boot(&self) -> Option<[u8; 16]> {
        self.boot
    }

    /// Forget the boot id, as when it cannot be read.
    #[cfg(test)]
    pub fn forget_boot(&mut self) {
        self.boot = None;
    }

    /// Release the reservations whose record `dead` judges dead, with their records: only
    /// reservations that are still the very file their record was written for. Records that no
    /// longer belong to their reservation are removed on the way. Returns what was released,
    /// who held it and why.
    pub fn reclaim(
        &mut self,
        mut dead: impl FnMut(&Record) -> Option<String>,
    ) -> Result<Vec<(IpAddr, Owner, String)>> {
        self.load_index()?;
        let mut out = Vec::new();
        for (ip, rec) in self.records() {
            if self.file_id(ip) != Some(rec.file) {
                self.remove_record(ip);
                continue;
            }
            let Some(why) = dead(&rec) else { continue };
            let Some(owner) = self.owner_of(ip)? else { continue };
            let slot = self.held_by(&owner)?.into_iter().find(|h| h.1 == ip).and_then(|h| h.0);
            self.release(slot, ip)?;
            out.push((ip, owner, why));
        }
        Ok(out)
    }

    /// Whether the store can serve an ADD, without writing anything (STATUS): `Err(why)` when
    /// no ADD could work: the directory (or the nearest existing parent it would be created
    /// in) is not a directory, a symbolic link, not writable or on a read-only filesystem,
    /// others may write it, or its lock or a cursor is no regular file.
    pub fn usable(dir: &Path, sets: usize) -> std::result::Result<(), String> {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let dirf = match nix::fcntl::open(dir, flags, Mode::empty()) {
            Ok(fd) => File::from(fd),
            Err(Errno::ENOENT) => {
                // ADD would create it: the nearest existing ancestor must take a new directory.
                let mut p = dir.parent();
                while let Some(d) = p {
                    match nix::unistd::access(
                        d,
                        nix::unistd::AccessFlags::W_OK | nix::unistd::AccessFlags::X_OK,
                    ) {
                        Ok(()) => return Ok(()),
                        Err(Errno::ENOENT) => p = d.parent(),
                        Err(e) => {
                            return Err(format!(
                                "{} cannot be created in {}: {}",
                                dir.display(),
                                d.display(),
                                e.desc()
                            ))
                        }
                    }
                }
                return Err(format!("{}: no existing parent directory", dir.display()));
            }
            Err(e) => {
                return Err(match open_dir(dir, false) {
                    Err(err) => err.msg,
                    Ok(_) => format!("{}: {}", dir.display(), e.desc()),
                })
            }
        };
        if let Some(why) = unsafe_owner(&dirf).map_err(|e| e.to_string())? {
            return Err(unsafe_store(dir, &why).msg);
        }
        let at = dirf.as_fd();
        let w = nix::unistd::AccessFlags::W_OK;
        if let Err(e) = nix::unistd::faccessat(at, ".", w, AtFlags::AT_EACCESS) {
            return Err(format!("{} is not writable: {}", dir.display(), e.desc()));
        }
        let names = std::iter::once(LOCK_NAME.to_string())
            .chain((0..sets).map(|i| format!("{LAST_RESERVED_PREFIX}{i}")));
        for name in names {
            if let Ok(st) = fstatat(at, name.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
                if st.st_mode & libc::S_IFMT != libc::S_IFREG {
                    return Err(format!(
                        "{} is {}, not a regular file",
                        dir.join(&name).display(),
                        kind(st.st_mode)
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Replace the content of the regular file `name` in `dir` in place (created when missing).
fn write_in_place(dir: BorrowedFd<'_>, name: &str, content: &[u8]) -> io::Result<()> {
    let mut f = open_regular_at(dir, name, OFlag::O_WRONLY | OFlag::O_CREAT, 0o600)?;
    f.set_len(0)?;
    f.write_all(content)
}

/// Replace (or create) the regular file `name` in `dir` atomically with `content`: an unnamed
/// file linked in place of the old one (in place where the filesystem has no `O_TMPFILE`).
fn replace_file(dir: BorrowedFd<'_>, name: &str, content: &[u8]) -> io::Result<()> {
    let fd = nix::fcntl::openat(
        dir,
        ".",
        OFlag::O_TMPFILE | OFlag::O_WRONLY | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    );
    let Ok(fd) = fd else { return write_in_place(dir, name, content) };
    let mut f = File::from(fd);
    f.write_all(content)?;
    let src = format!("/proc/self/fd/{}", f.as_raw_fd());
    // Under the store lock nobody else writes here: the second attempt finds the name free.
    for _ in 0..2 {
        match nix::unistd::linkat(AT_FDCWD, src.as_str(), dir, name, AtFlags::AT_SYMLINK_FOLLOW) {
            Ok(()) => return Ok(()),
            Err(Errno::EEXIST) => unlink_if_there(dir, name)?,
            Err(e) => return Err(e.into()),
        }
    }
    Err(io::Error::from(Errno::EEXIST))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::INDEX_NAME;
    use std::os::unix::fs::MetadataExt;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn open(d: &Path) -> Store {
        Store::open(d, Access::Add, DEFAULT_LOCK_TIMEOUT).unwrap().unwrap()
    }

    fn att(id: &str, ifname: &str) -> AttachmentId {
        AttachmentId::new("net", id, ifname)
    }

    /// A store directory `net` (not created yet) inside a temporary directory, and the guard
    /// that removes it.
    fn net_dir() -> (tempfile::TempDir, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let net = d.path().join("net");
        (d, net)
    }

    /// A store directory that another program (or an older writer) left with `files` in it.
    fn seeded(files: &[(&str, &[u8])]) -> (tempfile::TempDir, PathBuf) {
        let (d, net) = net_dir();
        std::fs::create_dir_all(&net).unwrap();
        for (name, content) in files {
            std::fs::write(net.join(name), content).unwrap();
        }
        (d, net)
    }

    /// Reserve `addr` for container `id` on eth0 with freshly prepared content.
    fn reserve(s: &mut Store, addr: &str, id: &str) -> bool {
        s.reserve(&mut None, ip(addr), &att(id, "eth0")).unwrap()
    }

    #[test]
    fn owner_parsing_matches_upstream_comparisons() {
        assert_eq!(
            Owner::parse(b"abc\r\neth0"),
            Owner::Attachment { id: "abc".into(), ifname: "eth0".into() }
        );
        assert_eq!(
            Owner::parse(b"  abc\r\neth0 \n"),
            Owner::Attachment { id: "abc".into(), ifname: "eth0".into() },
            "whitespace around the content is ignored"
        );
        assert_eq!(Owner::parse(b"abc\n"), Owner::Legacy { id: "abc".into() });
        assert_eq!(Owner::parse(b"abc\r\n"), Owner::Legacy { id: "abc".into() });
        assert_eq!(Owner::parse(b""), Owner::Unknown);
        assert_eq!(Owner::parse(b" \n"), Owner::Unknown);
    }

    #[test]
    fn reservation_names() {
        assert_eq!(reservation_name("10.0.0.2"), Some(ip("10.0.0.2")));
        assert_eq!(reservation_name("2001:db8::2"), Some(ip("2001:db8::2")));
        for n in ["lock", "last_reserved_ip.0", INDEX_NAME, "010.0.0.2", "2001:DB8::2", "10.0.0.2.bak"] {
            assert_eq!(reservation_name(n), None, "{n}");
        }
    }

    #[test]
    fn reserve_is_exclusive_writes_upstream_format_and_mode() {
        let (_d, net) = net_dir();
        let mut s = open(&net);
        let mut p = None;
        assert!(s.reserve(&mut p, ip("10.0.0.2"), &att("c1", "eth0")).unwrap());
        assert!(p.is_none(), "content used up");
        assert!(!s.reserve(&mut p, ip("10.0.0.2"), &att("c2", "eth0")).unwrap(), "taken");
        assert!(p.is_some(), "content kept for the next candidate");
        assert!(s.reserve(&mut p, ip("10.0.0.3"), &att("c2", "eth0")).unwrap());
        s.finish();
        assert_eq!(std::fs::read(net.join("10.0.0.2")).unwrap(), b"c1\r\neth0");
        assert_eq!(std::fs::read(net.join("10.0.0.3")).unwrap(), b"c2\r\neth0");
        let mode = std::fs::metadata(net.join("10.0.0.2")).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // no stray files: the two reservations, the lock, the index
        let mut names: Vec<String> =
            std::fs::read_dir(&net).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        assert_eq!(names, [INDEX_NAME, "10.0.0.2", "10.0.0.3", "lock"]);
    }

    #[test]
    fn an_empty_reservation_file_is_debris_and_is_reclaimed() {
        let (_d, net) = seeded(&[("10.0.0.5", b""), ("10.0.0.6", b"other\r\neth0")]);
        let mut s = open(&net);
        assert!(reserve(&mut s, "10.0.0.5", "c1"), "an empty file (an interrupted write) is taken over");
        assert!(!reserve(&mut s, "10.0.0.6", "c1"), "a file with an owner is not");
        s.finish();
        assert_eq!(std::fs::read(net.join("10.0.0.5")).unwrap(), b"c1\r\neth0");
        assert_eq!(std::fs::read(net.join("10.0.0.6")).unwrap(), b"other\r\neth0");
    }

    #[test]
    fn index_is_trusted_only_while_the_directory_is_unchanged() {
        let (_d, net) = net_dir();
        {
            let mut s = open(&net);
            assert!(reserve(&mut s, "10.0.0.2", "c1"));
            assert_eq!(s.rebuilds, 1, "first use builds the index");
            s.finish();
        }
        {
            let mut s = open(&net);
            assert_eq!(s.held_exact(&att("c1", "eth0")).unwrap().len(), 1);
            assert_eq!(s.rebuilds, 0, "unchanged directory: index trusted");
        }
        // another program adds a reservation behind our back (within the same clock tick)
        std::fs::write(net.join("10.0.0.9"), b"c9\r\neth0").unwrap();
        {
            let mut s = open(&net);
            let held = s.held_exact(&att("c9", "eth0")).unwrap();
            assert_eq!(held.iter().map(|h| h.1).collect::<Vec<_>>(), [ip("10.0.0.9")]);
            assert_eq!(s.rebuilds, 1, "foreign change detected");
            s.finish();
        }
        // another program removes one: the stale index hit is verified away
        std::fs::remove_file(net.join("10.0.0.2")).unwrap();
        {
            let mut s = open(&net);
            assert!(s.held_exact(&att("c1", "eth0")).unwrap().is_empty());
        }
        // the index file itself deleted or replaced by garbage
        std::fs::write(net.join(INDEX_NAME), b"junk").unwrap();
        {
            let mut s = open(&net);
            assert_eq!(s.held_exact(&att("c9", "eth0")).unwrap().len(), 1);
            assert_eq!(s.rebuilds, 1);
        }
    }

    #[test]
    fn legacy_files_and_whitespace() {
        let (_d, net) = seeded(&[("10.0.0.4", b"old\n"), ("10.0.0.5", b" new\r\neth1\n"), ("10.0.0.6", b"")]);
        let mut s = open(&net);
        assert_eq!(s.held_legacy("old").unwrap().len(), 1);
        assert!(s.held_exact(&att("old", "eth0")).unwrap().is_empty());
        assert_eq!(s.held_exact(&att("new", "eth1")).unwrap().len(), 1);
        assert_eq!(s.owner_of(ip("10.0.0.6")).unwrap(), Some(Owner::Unknown));
        assert!(!s.is_free(ip("10.0.0.6")) && s.is_free(ip("10.0.0.7")));
    }

    #[test]
    fn stale_named_temp_files_are_cleaned_by_a_scan() {
        let (_d, net) = seeded(&[(".host-local-tmp-123", b"c\r\neth0")]);
        let s = open(&net);
        assert!(s.scan().unwrap().is_empty());
        assert!(!net.join(".host-local-tmp-123").exists());
    }

    #[test]
    fn last_reserved_roundtrip() {
        let d = tempfile::tempdir().unwrap();
        let mut s = open(&d.path().join("n"));
        assert_eq!(s.last_reserved(0).unwrap(), None);
        s.set_last_reserved(0, ip("10.0.0.7")).unwrap();
        s.set_last_reserved(1, ip("2001:db8::7")).unwrap();
        assert_eq!(s.last_reserved(0).unwrap(), Some(ip("10.0.0.7")));
        assert_eq!(std::fs::read_to_string(d.path().join("n/last_reserved_ip.1")).unwrap(), "2001:db8::7");
    }

    #[test]
    fn missing_directory_without_create() {
        let d = tempfile::tempdir().unwrap();
        assert!(Store::open(&d.path().join("nope"), Access::Change, DEFAULT_LOCK_TIMEOUT).unwrap().is_none());
        assert!(!d.path().join("nope").exists());
    }

    /// Every file below `d` with its content.
    fn files(d: &Path) -> Vec<(String, Vec<u8>)> {
        let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (e.file_name().into_string().unwrap(), std::fs::read(e.path()).unwrap())
            })
            .collect();
        v.sort();
        v
    }

    #[test]
    fn an_aborted_call_leaves_every_file_as_it_was() {
        // A store as upstream leaves it: a reservation and the lock, no index.
        let (_d, net) = seeded(&[("10.0.0.9", b"up\r\neth0"), (LOCK_NAME, b"")]);
        let before = files(&net);
        let mut s = open(&net);
        assert!(reserve(&mut s, "10.0.0.2", "c1"));
        assert_eq!(s.held_exact(&att("c1", "eth0")).unwrap(), [(None, ip("10.0.0.2"))], "seen before finish");
        s.release_ip(&att("c1", "eth0"), ip("10.0.0.2")).unwrap();
        s.abort();
        assert_eq!(files(&net), before, "no index appeared, nothing else changed");

        // With a trusted index: its bytes and its trust survive an aborted call.
        let mut s = open(&net);
        assert!(reserve(&mut s, "10.0.0.3", "c3"));
        s.finish();
        drop(s);
        let before = files(&net);
        let mut s = open(&net);
        assert!(reserve(&mut s, "10.0.0.4", "c4"));
        s.release_ip(&att("c4", "eth0"), ip("10.0.0.4")).unwrap();
        s.abort();
        assert_eq!(files(&net), before);
        let mut s = open(&net);
        assert_eq!(s.held_exact(&att("c3", "eth0")).unwrap().len(), 1);
        assert_eq!(s.rebuilds, 0, "the index is still trusted");
    }

    #[test]
    fn read_only_calls_write_nothing() {
        // upstream's store without its lock, and a leftover temp file of ours
        let (_d, net) = seeded(&[("10.0.0.9", b"up\r\neth0"), (".host-local-tmp-1", b"x")]);
        let before = files(&net);
        let mut s = Store::open(&net, Access::Read, DEFAULT_LOCK_TIMEOUT).unwrap().unwrap();
        assert_eq!(s.held_exact(&att("up", "eth0")).unwrap().len(), 1);
        assert!(s.held_legacy("up").unwrap().is_empty());
        assert_eq!(s.rebuilds, 1, "scanned, in memory");
        s.finish();
        drop(s);
        assert_eq!(files(&net), before, "no lock, no index, no clean-up");
    }

    #[test]
    fn lock_and_cursor_links_are_refused_and_their_targets_left_alone() {
        let (d, net) = seeded(&[("10.0.0.9", b"up\r\neth0")]);
        let target = d.path().join("target");
        std::os::unix::fs::symlink(&target, net.join(LOCK_NAME)).unwrap();
        for access in [Access::Add, Access::Change, Access::Read] {
            let e = Store::open(&net, access, DEFAULT_LOCK_TIMEOUT).err().unwrap();
            assert_eq!(e.code, code::IO);
            assert_eq!(
                e.msg,
                format!("open {}/lock: a symbolic link, which is not followed", net.display()),
                "{access:?}"
            );
        }
        assert!(!target.exists());
        std::fs::remove_file(net.join(LOCK_NAME)).unwrap();
        std::fs::write(&target, "victim").unwrap();
        std::os::unix::fs::symlink(&target, net.join("last_reserved_ip.0")).unwrap();
        let mut s = open(&net);
        let cursor = net.join("last_reserved_ip.0");
        let e = s.last_reserved(0).unwrap_err();
        assert_eq!(e.msg, format!("read {}: a symbolic link, which is not followed", cursor.display()));
        let e = s.set_last_reserved(0, ip("10.0.0.2")).unwrap_err();
        assert_eq!(e.msg, format!("write {}: a symbolic link, which is not followed", cursor.display()));
        assert_eq!(std::fs::read(&target).unwrap(), b"victim");
    }

    #[test]
    fn a_store_others_can_write_is_refused_by_add_only() {
        use std::os::unix::fs::PermissionsExt;
        let (_d, net) = seeded(&[]);
        std::fs::set_permissions(&net, std::fs::Permissions::from_mode(0o775)).unwrap();
        let e = Store::open(&net, Access::Add, DEFAULT_LOCK_TIMEOUT).err().unwrap();
        assert!(e.msg.contains("group or others may write it (mode 0775)"), "{}", e.msg);
        assert!(Store::open(&net, Access::Change, DEFAULT_LOCK_TIMEOUT).unwrap().is_some());
        assert!(Store::usable(&net, 1).unwrap_err().contains("not safe to allocate from"));
    }

    #[test]
    fn records_apply_only_to_the_file_they_were_written_for() {
        let (_d, net) = net_dir();
        let mut s = open(&net);
        s.note = Some(NsNote { id: NsIdent { ino: 7, cookie: 8 }, path: "/run/netns/x".into() });
        assert!(reserve(&mut s, "10.0.0.2", "c1"));
        assert!(reserve(&mut s, "10.0.0.3", "c2"));
        s.finish();
        let recs = s.records();
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[0].1.file, s.file_id(ip("10.0.0.2")).unwrap());
        assert_eq!(recs[0].1.path, "/run/netns/x");
        // Another writer (upstream) released 10.0.0.2 and reserved it again, same content.
        std::fs::remove_file(net.join("10.0.0.2")).unwrap();
        std::fs::write(net.join("10.0.0.2"), b"c1\r\neth0").unwrap();
        let released = s.reclaim(|_| Some("judged dead".into())).unwrap();
        assert_eq!(
            released.iter().map(|r| r.0).collect::<Vec<_>>(),
            [ip("10.0.0.3")],
            "only the file its record names"
        );
        assert!(net.join("10.0.0.2").exists());
        assert!(s.records().is_empty(), "the stale record went too");
        assert!(s.held_exact(&att("c2", "eth0")).unwrap().is_empty());
    }

    #[test]
    fn transient_errors_say_try_again() {
        assert_eq!(io_err("remove x", Errno::EBUSY).code, code::TRY_AGAIN);
        assert_eq!(io_err("lock x", Errno::EINTR).code, code::TRY_AGAIN);
        assert_eq!(io_err("x", Errno::EAGAIN).code, code::TRY_AGAIN);
        let e = io_err("remove /d/10.0.0.2", Errno::EROFS);
        assert_eq!(e.code, code::IO);
        assert_eq!(e.msg, "remove /d/10.0.0.2: Read-only file system (os error 30)");
    }

    /// The names in directory `d`, sorted.
    fn names(d: &Path) -> Vec<String> {
        let mut v: Vec<String> =
            std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        v.sort();
        v
    }

    fn note(path: &str) -> Option<NsNote> {
        Some(NsNote { id: NsIdent { ino: 7, cookie: 8 }, path: path.into() })
    }

    fn ips(held: &[Held]) -> Vec<IpAddr> {
        held.iter().map(|h| h.1).collect()
    }

    #[test]
    fn a_store_directory_that_is_a_link_or_a_file_is_refused() {
        let (d, real) = seeded(&[]);
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let file = d.path().join("file");
        std::fs::write(&file, "").unwrap();
        for access in [Access::Add, Access::Change, Access::Read] {
            let e = Store::open(&link, access, DEFAULT_LOCK_TIMEOUT).err().unwrap();
            assert_eq!(e.code, code::IO);
            assert_eq!(
                e.msg,
                format!("store directory {} is a symbolic link, not a directory", link.display())
            );
        }
        for access in [Access::Change, Access::Read] {
            let e = Store::open(&file, access, DEFAULT_LOCK_TIMEOUT).err().unwrap();
            assert_eq!(
                e.msg,
                format!("store directory {} is a regular file, not a directory", file.display())
            );
        }
        assert_eq!(names(&real), Vec::<String>::new(), "nothing made through the link");
        let why = Store::usable(&link, 1).unwrap_err();
        assert_eq!(why, format!("store directory {} is a symbolic link, not a directory", link.display()));
        let why = Store::usable(&file, 1).unwrap_err();
        assert_eq!(why, format!("store directory {} is a regular file, not a directory", file.display()));
    }

    #[test]
    fn status_finds_a_store_usable_only_when_an_add_could_work() {
        let (d, net) = seeded(&[("last_reserved_ip.0", b"10.0.0.5"), (LOCK_NAME, b"")]);
        assert_eq!(Store::usable(&net, 2), Ok(()), "regular lock and cursor; cursor 1 not made yet");
        assert_eq!(Store::usable(&d.path().join("new/net"), 1), Ok(()), "ADD would create it");
        std::fs::write(d.path().join("plain"), "").unwrap();
        let under_file = d.path().join("plain/net");
        let why = Store::usable(&under_file, 1).unwrap_err();
        assert_eq!(why, format!("open {}: Not a directory (os error 20)", under_file.display()));
        std::os::unix::fs::symlink("/etc/hostname", net.join("last_reserved_ip.1")).unwrap();
        assert_eq!(Store::usable(&net, 1), Ok(()), "one range set: cursor 1 is not used");
        let why = Store::usable(&net, 2).unwrap_err();
        assert_eq!(
            why,
            format!("{}/last_reserved_ip.1 is a symbolic link, not a regular file", net.display())
        );
        std::fs::remove_file(net.join(LOCK_NAME)).unwrap();
        nix::unistd::mkfifo(&net.join(LOCK_NAME), Mode::from_bits_truncate(0o600)).unwrap();
        let why = Store::usable(&net, 1).unwrap_err();
        assert_eq!(why, format!("{}/lock is a FIFO, not a regular file", net.display()));
    }

    #[test]
    fn check_and_status_share_the_lock_and_changes_wait_for_every_holder() {
        let (_d, net) = net_dir();
        drop(open(&net));
        let short = Duration::from_millis(20);
        let check1 = Store::open(&net, Access::Read, short).unwrap().unwrap();
        let check2 = Store::open(&net, Access::Read, short).unwrap().unwrap();
        for access in [Access::Change, Access::Add] {
            let e = Store::open(&net, access, short).err().unwrap();
            assert_eq!(e.code, code::TRY_AGAIN, "{access:?}");
            assert!(e.msg.starts_with(&format!("lock {}/lock: ", net.display())), "{}", e.msg);
        }
        drop((check1, check2));
        let del = Store::open(&net, Access::Change, short).unwrap().unwrap();
        let e = Store::open(&net, Access::Read, short).err().unwrap();
        assert_eq!(e.code, code::TRY_AGAIN, "CHECK waits for a DEL");
        drop(del);
    }

    #[test]
    fn a_store_directory_removed_under_the_call_is_never_used_without_its_lock() {
        let (_d, net) = seeded(&[]);
        let dirf = File::open(&net).unwrap();
        std::fs::remove_dir(&net).unwrap();
        for access in [Access::Add, Access::Change] {
            let e = Store::open_lock(&dirf, &net, access).unwrap_err();
            assert_eq!(
                (e.code, e.msg),
                (code::IO, format!("open {}/lock: No such file or directory (os error 2)", net.display()))
            );
        }
        assert!(Store::open_lock(&dirf, &net, Access::Read).unwrap().is_none(), "CHECK: no lock to share");
    }

    #[test]
    fn who_holds_an_address_that_is_no_reservation_file() {
        let (_d, net) = seeded(&[("10.0.0.2", b"c1\r\neth0")]);
        nix::unistd::mkfifo(&net.join("10.0.0.5"), Mode::from_bits_truncate(0o600)).unwrap();
        let _sock = std::os::unix::net::UnixListener::bind(net.join("10.0.0.6")).unwrap();
        let s = open(&net);
        assert_eq!(s.owner_of(ip("10.0.0.7")).unwrap(), None, "no file: nobody");
        assert_eq!(
            s.owner_of(ip("10.0.0.5")).unwrap(),
            Some(Owner::Foreign("not a regular file but a FIFO".into()))
        );
        let e = s.owner_of(ip("10.0.0.6")).unwrap_err();
        assert_eq!(
            (e.code, e.msg),
            (code::IO, format!("read {}/10.0.0.6: No such device or address (os error 6)", net.display()))
        );
        assert_eq!(
            s.owner_of(ip("10.0.0.2")).unwrap(),
            Some(Owner::Attachment { id: "c1".into(), ifname: "eth0".into() })
        );
    }

    #[test]
    fn every_change_leaves_an_index_the_next_call_trusts() {
        let (_d, net) = net_dir();
        let mut s = open(&net);
        for (addr, id) in [("10.0.0.2", "c1"), ("10.0.0.3", "c2"), ("10.0.0.4", "c3")] {
            assert!(reserve(&mut s, addr, id));
        }
        s.finish();
        drop(s);
        // DEL of c2: found in the on-disk index, released from it
        let mut s = Store::open(&net, Access::Change, DEFAULT_LOCK_TIMEOUT).unwrap().unwrap();
        let held = s.held_exact(&att("c2", "eth0")).unwrap();
        assert_eq!((s.rebuilds, held.len()), (0, 1));
        assert!(held[0].0.is_some(), "an index slot");
        s.release(held[0].0, held[0].1).unwrap();
        s.finish();
        drop(s);
        let dirf = File::open(&net).unwrap();
        let idx = Index::open(dirf.as_fd(), false).unwrap();
        assert_eq!(idx.live(), 2);
        assert!(idx.lookup(Kind::Attachment, key_hash(Kind::Attachment, "c2", "eth0")).unwrap().is_empty());
        // One call reserves two addresses and releases one of them again (an ADD that meets
        // an earlier incarnation's reservation, or a rollback).
        let mut s = open(&net);
        assert_eq!(ips(&s.held_exact(&att("c1", "eth0")).unwrap()), [ip("10.0.0.2")]);
        assert!(s.held_exact(&att("c2", "eth0")).unwrap().is_empty());
        assert!(reserve(&mut s, "10.0.0.5", "c4"));
        assert!(reserve(&mut s, "10.0.0.6", "c5"));
        s.release(None, ip("10.0.0.5")).unwrap();
        s.finish();
        drop(s);
        let mut s = open(&net);
        assert_eq!(ips(&s.held_exact(&att("c5", "eth0")).unwrap()), [ip("10.0.0.6")]);
        assert!(s.held_exact(&att("c4", "eth0")).unwrap().is_empty());
        assert_eq!(ips(&s.held_exact(&att("c3", "eth0")).unwrap()), [ip("10.0.0.4")]);
        assert_eq!(s.rebuilds, 0, "every index above was trusted");
    }

    #[test]
    fn the_directory_is_stamped_one_second_in_the_past() {
        // A later change by anyone sets the mtime to the current time, which can then never
        // equal the stamp, even where timestamps have a resolution of one second.
        let (_d, net) = net_dir();
        let mut s = open(&net);
        assert!(reserve(&mut s, "10.0.0.2", "c1"));
        let before = std::time::SystemTime::now();
        s.finish();
        let after = std::time::SystemTime::now();
        let m = std::fs::metadata(&net).unwrap().modified().unwrap();
        let second = Duration::from_secs(1);
        assert!(before - second <= m && m <= after - second, "{m:?} not 1 s before {before:?} … {after:?}");
    }

    #[test]
    fn an_index_damaged_during_a_call_gives_way_to_the_files() {
        let (_d, net) = net_dir();
        let mut s = open(&net);
        assert!(reserve(&mut s, "10.0.0.2", "c1"));
        assert!(reserve(&mut s, "10.0.0.3", "c2"));
        s.finish();
        drop(s);
        let mut s = Store::open(&net, Access::Change, DEFAULT_LOCK_TIMEOUT).unwrap().unwrap();
        assert_eq!(s.held_exact(&att("c1", "eth0")).unwrap().len(), 1, "index loaded");
        let f = std::fs::OpenOptions::new().write(true).open(net.join(INDEX_NAME)).unwrap();
        f.set_len(4096).unwrap(); // the table is gone
        let held = s.held_exact(&att("c1", "eth0")).unwrap();
        assert_eq!(held, [(None, ip("10.0.0.2"))], "from a scan");
        s.release(None, ip("10.0.0.2")).unwrap();
        assert_eq!(s.held_exact(&att("c2", "eth0")).unwrap(), [(None, ip("10.0.0.3"))]);
        s.finish();
        drop(s);
        let mut s = open(&net);
        assert_eq!(ips(&s.held_exact(&att("c2", "eth0")).unwrap()), [ip("10.0.0.3")]);
        assert!(s.held_exact(&att("c1", "eth0")).unwrap().is_empty());
        assert_eq!(s.rebuilds, 1, "the damaged index was not stamped as trusted");
    }

    #[test]
    fn without_o_tmpfile_a_named_temp_file_is_linked_and_always_removed() {
        let (_d, net) = net_dir();
        let mut s = open(&net);
        assert!(s.held_exact(&att("c1", "eth0")).unwrap().is_empty(), "index loaded, as reserve does first");
        // The name a later call's scan recognises as a leftover (a killed call's) and removes.
        let tmp = format!(".host-local-tmp-{}", std::process::id());
        let p = s.pending_named(b"c1\r\neth0".to_vec()).unwrap();
        assert_eq!(std::fs::read(net.join(&tmp)).unwrap(), b"c1\r\neth0");
        drop(p);
        assert!(!net.join(&tmp).exists(), "an unused one is removed");
        let mut p = Some(s.pending_named(b"c1\r\neth0".to_vec()).unwrap());
        assert!(s.reserve(&mut p, ip("10.0.0.2"), &att("c1", "eth0")).unwrap());
        s.finish();
        assert_eq!(std::fs::read(net.join("10.0.0.2")).unwrap(), b"c1\r\neth0");
        assert_eq!(names(&net), [INDEX_NAME, "10.0.0.2", "lock"], "no temp file left");
    }

    /// An index that cannot be written (its temporary name taken by a directory here; a full
    /// filesystem in practice): the call works from the files, publishes no index, and the next
    /// call finds the reservations all the same.
    #[test]
    fn without_a_writable_index_the_call_works_from_the_files() {
        let (_d, net) = seeded(&[("10.0.0.3", b"c2\r\neth0")]);
        std::fs::create_dir_all(net.join(".host-local-index.tmp/x")).unwrap();
        let mut s = open(&net);
        assert!(reserve(&mut s, "10.0.0.2", "c1"));
        assert_eq!(ips(&s.held_exact(&att("c1", "eth0")).unwrap()), [ip("10.0.0.2")]);
        assert_eq!(ips(&s.held_exact(&att("c2", "eth0")).unwrap()), [ip("10.0.0.3")]);
        s.finish();
        assert_eq!(
            names(&net),
            [".host-local-index.tmp", "10.0.0.2", "10.0.0.3", "lock"],
            "no index published"
        );
        drop(s);
        let mut s = open(&net);
        assert_eq!(ips(&s.held_exact(&att("c1", "eth0")).unwrap()), [ip("10.0.0.2")]);
    }

    /// A scan later in the same call (after an index read error, during an exhaustion
    /// reclaim) removed the call's own pending temp file, and the next candidate's link failed.
    #[test]
    fn a_scan_during_the_call_keeps_its_own_named_temp_file() {
        let (_d, net) = seeded(&[(".host-local-tmp-1", b"stale")]);
        let mut s = open(&net);
        assert!(s.held_exact(&att("c1", "eth0")).unwrap().is_empty());
        assert!(!net.join(".host-local-tmp-1").exists(), "another process's is stale");
        let mut p = Some(s.pending_named(b"c1\r\neth0".to_vec()).unwrap());
        s.rebuild().unwrap();
        assert!(s.reserve(&mut p, ip("10.0.0.2"), &att("c1", "eth0")).unwrap());
        assert_eq!(std::fs::read(net.join("10.0.0.2")).unwrap(), b"c1\r\neth0");
    }

    /// A record is replaced by a new file, never rewritten in place: whoever opened the old one
    /// reads it whole (where the filesystem has O_TMPFILE, as here).
    #[test]
    fn replace_file_puts_a_new_file_in_place() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("f"), b"the old record").unwrap();
        let old = File::open(d.path().join("f")).unwrap();
        let dirf = File::open(d.path()).unwrap();
        replace_file(dirf.as_fd(), "f", b"new").unwrap();
        assert_eq!(std::fs::read(d.path().join("f")).unwrap(), b"new");
        assert_eq!(std::io::read_to_string(old).unwrap(), "the old record");
        assert_eq!(names(d.path()), ["f"]);
    }

    #[test]
    fn cursors_are_put_back_as_they_were() {
        let (_d, net) = net_dir();
        let mut s = open(&net);
        let cursor = net.join("last_reserved_ip.0");
        assert_eq!(s.cursor_snapshot(0), None);
        s.set_last_reserved(0, ip("10.0.0.5")).unwrap();
        let saved = s.cursor_snapshot(0);
        assert_eq!(saved.as_deref(), Some(&b"10.0.0.5"[..]));
        s.set_last_reserved(0, ip("10.0.0.9")).unwrap();
        s.restore_cursor(0, saved).unwrap();
        assert_eq!(std::fs::read(&cursor).unwrap(), b"10.0.0.5");
        s.restore_cursor(0, None).unwrap();
        assert!(!cursor.exists(), "no cursor before: none after");
    }

    #[test]
    fn records_are_written_for_what_the_call_still_holds() {
        let (_d, net) = net_dir();
        let mut s = open(&net);
        s.note = note("/run/netns/x");
        assert!(reserve(&mut s, "10.0.0.2", "c1"));
        assert!(reserve(&mut s, "10.0.0.3", "c2"));
        s.release(None, ip("10.0.0.2")).unwrap();
        s.finish();
        assert_eq!(s.records().into_iter().map(|r| r.0).collect::<Vec<_>>(), [ip("10.0.0.3")]);
        let rec = s.record(ip("10.0.0.3")).unwrap();
        assert_eq!(
            (rec.path.as_str(), rec.ns, rec.boot),
            ("/run/netns/x", NsIdent { ino: 7, cookie: 8 }, boot_id().unwrap())
        );
        assert_eq!(Some(rec.file), s.file_id(ip("10.0.0.3")));
        assert!(s.record(ip("10.0.0.2")).is_none());
    }

    #[test]
    fn reclaim_releases_what_is_judged_dead_and_keeps_the_rest_in_the_index() {
        let (_d, net) = net_dir();
        let mut s = open(&net);
        s.note = note("/run/netns/x");
        assert!(reserve(&mut s, "10.0.0.2", "c1"));
        assert!(reserve(&mut s, "2001:db8::2", "c1"));
        s.finish();
        drop(s);
        let mut s = open(&net);
        let v4 = s.file_id(ip("10.0.0.2"));
        let released = s.reclaim(|rec| (Some(rec.file) == v4).then(|| "gone".to_string())).unwrap();
        let c1 = Owner::Attachment { id: "c1".into(), ifname: "eth0".into() };
        assert_eq!(released, [(ip("10.0.0.2"), c1, "gone".to_string())]);
        s.finish();
        drop(s);
        assert!(!net.join("10.0.0.2").exists());
        let mut s = open(&net);
        assert_eq!(ips(&s.held_exact(&att("c1", "eth0")).unwrap()), [ip("2001:db8::2")]);
        assert_eq!(s.rebuilds, 0);
        assert_eq!(s.records().into_iter().map(|r| r.0).collect::<Vec<_>>(), [ip("2001:db8::2")]);
    }

    #[test]
    fn gc_removes_what_is_not_kept_with_its_record_and_stale_records() {
        let (_d, net) = net_dir();
        let mut s = open(&net);
        s.note = note("/run/netns/x");
        for (addr, id) in [("10.0.0.2", "c1"), ("10.0.0.3", "c2"), ("10.0.0.4", "c3")] {
            assert!(reserve(&mut s, addr, id));
        }
        s.finish();
        drop(s);
        // upstream released 10.0.0.3 and reserved it again: its record is for another file
        std::fs::remove_file(net.join("10.0.0.3")).unwrap();
        std::fs::write(net.join("10.0.0.3"), b"c2\r\neth0").unwrap();
        let mut s = Store::open(&net, Access::Change, DEFAULT_LOCK_TIMEOUT).unwrap().unwrap();
        let c1 = Owner::Attachment { id: "c1".into(), ifname: "eth0".into() };
        let (removed, errors) = s.retain(|o| *o != c1).unwrap();
        assert_eq!((removed, errors.len()), (vec![ip("10.0.0.2")], 0));
        s.finish();
        assert_eq!(names(&net), [INDEX_NAME, RECORDS_DIR, "10.0.0.3", "10.0.0.4", "lock"]);
        assert_eq!(s.records().into_iter().map(|r| r.0).collect::<Vec<_>>(), [ip("10.0.0.4")]);
    }

    #[test]
    fn gc_of_an_upstream_store_leaves_an_index_even_when_it_removes_nothing() {
        let (_d, net) = seeded(&[("10.0.0.2", b"c1\r\neth0"), (LOCK_NAME, b"")]);
        let mut s = Store::open(&net, Access::Change, DEFAULT_LOCK_TIMEOUT).unwrap().unwrap();
        assert!(s.retain(|_| true).unwrap().0.is_empty());
        s.finish();
        drop(s);
        let mut s = open(&net);
        assert_eq!(ips(&s.held_exact(&att("c1", "eth0")).unwrap()), [ip("10.0.0.2")]);
        assert_eq!(s.rebuilds, 0, "the index GC wrote is trusted");
    }

    #[test]
    fn the_boot_marker_says_which_boot_last_dealt_with_earlier_boots() {
        let (_d, net) = net_dir();
        let mut s = open(&net);
        assert_eq!(s.boot(), boot_id());
        assert_eq!(s.records_boot(), None, "no records");
        s.note = note("/run/netns/x");
        assert!(reserve(&mut s, "10.0.0.2", "c1"));
        s.finish();
        assert_eq!(s.records_boot(), boot_id(), "a new records directory: nothing of earlier boots");
        let marker = net.join(RECORDS_DIR).join(BOOT_MARKER);
        std::fs::write(&marker, record::boot_marker(&[9; 16])).unwrap();
        assert_eq!(s.records_boot(), Some([9; 16]));
        s.set_records_boot();
        assert_eq!(std::fs::read_to_string(&marker).unwrap(), record::boot_marker(&boot_id().unwrap()));
        std::fs::write(&marker, "junk").unwrap();
        assert_eq!(s.records_boot(), Some([0; 16]), "damaged: some earlier boot");
        std::fs::remove_file(&marker).unwrap();
        assert_eq!(s.records_boot(), Some([0; 16]), "missing: some earlier boot");
    }

    #[test]
    fn a_records_directory_that_is_a_link_or_a_file_is_not_used() {
        let (d, net) = seeded(&[]);
        let elsewhere = d.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::fs::write(elsewhere.join(BOOT_MARKER), record::boot_marker(&[9; 16])).unwrap();
        std::os::unix::fs::symlink(&elsewhere, net.join(RECORDS_DIR)).unwrap();
        let mut s = open(&net);
        assert_eq!(s.records_boot(), None);
        s.note = note("/run/netns/x");
        assert!(reserve(&mut s, "10.0.0.2", "c1"));
        s.finish();
        assert!(s.records().is_empty());
        assert_eq!(names(&elsewhere), [BOOT_MARKER], "nothing written through the link");
        std::fs::remove_file(net.join(RECORDS_DIR)).unwrap();
        std::fs::write(net.join(RECORDS_DIR), record::boot_marker(&[9; 16])).unwrap();
        assert_eq!(s.records_boot(), None);
        assert!(s.record(ip("10.0.0.2")).is_none());
    }
}
