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

use crate::index::{key_hash, Entry, Index, Kind, Stamp, INDEX_NAME};
use cni_common::attachment::AttachmentId;
use cni_common::error::{code, CniError, Result};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, AT_FDCWD};
use nix::sys::stat::{futimens, Mode};
use nix::sys::time::TimeSpec;
use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{self, Write};
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

pub const LAST_RESERVED_PREFIX: &str = "last_reserved_ip.";
pub const LOCK_NAME: &str = "lock";
/// Named temp files used only where `O_TMPFILE` is not available; a leftover one is removed
/// by the next scan (all our work happens under the lock, so any such file found is stale).
const TMP_PREFIX: &str = ".host-local-tmp-";

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
            Owner::Unknown => None,
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
        }
    }
}

/// Parse a directory entry name as a reservation: the canonical text of an IP address.
pub fn reservation_name(name: &str) -> Option<IpAddr> {
    let ip: IpAddr = name.parse().ok()?;
    (ip.to_string() == name).then_some(ip)
}

/// A failed file operation: code 11 ("try again") when the system says the condition is
/// transient (`EAGAIN`, `EINTR`, `EBUSY`), code 5 otherwise.
fn io_err(what: impl std::fmt::Display, e: impl Into<io::Error>) -> CniError {
    let e: io::Error = e.into();
    let transient = e
        .raw_os_error()
        .is_some_and(|n| matches!(Errno::from_raw(n), Errno::EAGAIN | Errno::EINTR | Errno::EBUSY));
    let c = if transient { code::TRY_AGAIN } else { code::IO };
    CniError::new(c, format!("{what}: {e}"))
}

/// The current boot's id: an index written before a reboot (or power loss) is never trusted.
fn boot_id() -> [u8; 16] {
    let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let hex: Vec<u8> = text.trim().bytes().filter(|b| b.is_ascii_hexdigit()).collect();
    let mut out = [0u8; 16];
    for (i, pair) in hex.chunks(2).take(16).enumerate() {
        let s = std::str::from_utf8(pair).unwrap_or("0");
        out[i] = u8::from_str_radix(s, 16).unwrap_or(0);
    }
    out
}

/// A network's store, locked for the lifetime of the value.
///
/// Changes to the index are kept back until [`Store::finish`]: reservations made by this call
/// are entered then, and a rebuilt index is put in place then. A call that fails and has taken
/// back its reservations ends with [`Store::abort`] instead, which leaves the files as they were
/// (no new or rewritten index) and the directory's mtime too, so the index stays trusted.
pub struct Store {
    dir: PathBuf,
    dirf: File,
    _lock: File,
    index: Option<Index>,
    /// Reservations made by this call, not yet in the index.
    fresh: Vec<Entry>,
    /// The directory's stamp when it was locked.
    opened: Stamp,
    /// The directory or the index changed: re-stamp before unlocking.
    dirty: bool,
    boot: [u8; 16],
    /// How many times the index was rebuilt from the IP files in this call (for tests).
    pub rebuilds: u32,
}

/// A reservation found for an owner: its index slot (`None` when this call made it) and address.
pub type Held = (Option<u64>, IpAddr);

/// A reservation content ready to be linked under some address name.
pub struct Pending {
    file: Option<File>,
    tmp_path: Option<PathBuf>,
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(p) = &self.tmp_path {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Store {
    /// Open and lock `dir` (`<dataDir>/<net>`). With `create`, the directories are created
    /// (mode 0755, like upstream); without, a missing directory gives `None`.
    pub fn open(dir: &Path, create: bool) -> Result<Option<Store>> {
        if create {
            DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(dir)
                .map_err(|e| io_err(format!("create {}", dir.display()), e))?;
        } else {
            match std::fs::metadata(dir) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => return Err(CniError::io(format!("{} is not a directory", dir.display()))),
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(io_err(format!("stat {}", dir.display()), e)),
            }
        }
        let lock_path = dir.join(LOCK_NAME);
        let lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&lock_path)
            .map_err(|e| io_err(format!("open {}", lock_path.display()), e))?;
        lock.lock().map_err(|e| io_err(format!("lock {}", lock_path.display()), e))?;
        let dirf = File::open(dir).map_err(|e| io_err(format!("open {}", dir.display()), e))?;
        let mut store = Store {
            dir: dir.to_path_buf(),
            dirf,
            _lock: lock,
            index: None,
            fresh: Vec::new(),
            opened: Stamp::default(),
            dirty: false,
            boot: boot_id(),
            rebuilds: 0,
        };
        store.opened = store.dir_stamp()?;
        Ok(Some(store))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn dir_stamp(&self) -> Result<Stamp> {
        let m = self.dirf.metadata().map_err(|e| io_err(format!("stat {}", self.dir.display()), e))?;
        Ok(Stamp { dev: m.dev(), ino: m.ino(), sec: m.mtime(), nsec: m.mtime_nsec(), boot: self.boot })
    }

    /// Load the index, rebuilding it from the IP files unless its stamp matches the directory.
    fn index(&mut self) -> Result<&mut Index> {
        if self.index.is_none() {
            match Index::open(&self.dir) {
                Some(idx) if *idx.stamp() == self.opened => self.index = Some(idx),
                _ => {
                    self.rebuild()?;
                }
            }
        }
        Ok(self.index.as_mut().expect("loaded above"))
    }

    /// Read every reservation file (the slow path, as upstream does on every call).
    /// Removes our own stale temp files on the way.
    pub fn scan(&self) -> Result<Vec<(IpAddr, Owner)>> {
        let rd =
            std::fs::read_dir(&self.dir).map_err(|e| io_err(format!("read {}", self.dir.display()), e))?;
        let mut out = Vec::new();
        for ent in rd {
            let ent = ent.map_err(|e| io_err(format!("read {}", self.dir.display()), e))?;
            let name = ent.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.starts_with(TMP_PREFIX) {
                let _ = std::fs::remove_file(ent.path());
                continue;
            }
            let Some(ip) = reservation_name(name) else { continue };
            match std::fs::read(ent.path()) {
                Ok(content) => out.push((ip, Owner::parse(&content))),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                // A directory named like an IP, unreadable file…: not ours to judge; skip.
                Err(e) => eprintln!("host-local: skipping {}: {e}", ent.path().display()),
            }
        }
        Ok(out)
    }

    /// Rebuild the index from the IP files.
    pub fn rebuild(&mut self) -> Result<Vec<(IpAddr, Owner)>> {
        let all = self.scan()?;
        self.write_index(&all)?;
        self.rebuilds += 1;
        Ok(all)
    }

    /// A new index of `all`, put in place by [`Store::finish`].
    fn write_index(&mut self, all: &[(IpAddr, Owner)]) -> Result<()> {
        let entries: Vec<Entry> = all.iter().filter_map(|(ip, o)| o.entry(*ip)).collect();
        let idx = Index::build(&self.dir, &entries)
            .map_err(|e| io_err(format!("write {}", self.dir.join(INDEX_NAME).display()), e))?;
        if let Some(old) = self.index.replace(idx) {
            old.discard(&self.dir);
        }
        self.fresh.clear();
        self.dirty = true;
        Ok(())
    }

    /// The owner recorded in the file for `ip`; `None` when there is no such file.
    pub fn owner_of(&self, ip: IpAddr) -> Result<Option<Owner>> {
        let p = self.dir.join(ip.to_string());
        match std::fs::read(&p) {
            Ok(c) => Ok(Some(Owner::parse(&c))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err(format!("read {}", p.display()), e)),
        }
    }

    /// Addresses held by `owner` according to the index (and the reservations of this call),
    /// each verified against its file, with the index slot when it has one. Stale index entries
    /// are dropped.
    fn held_by(&mut self, owner: &Owner) -> Result<Vec<Held>> {
        let Some((kind, key)) = owner.key() else { return Ok(Vec::new()) };
        let hits = self.index()?.lookup(kind, key).map_err(|e| io_err("read index", e))?;
        let mut out = Vec::new();
        for (slot, ip) in hits {
            if self.owner_of(ip)?.as_ref() == Some(owner) {
                out.push((Some(slot), ip));
            } else {
                self.index()?.remove(slot).map_err(|e| io_err("update index", e))?;
                self.dirty = true;
            }
        }
        out.extend(self.fresh.iter().filter(|e| e.kind == kind && e.key == key).map(|e| (None, e.ip)));
        Ok(out)
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
        let content = a.reservation();
        let tmpfile = nix::fcntl::open(
            &self.dir,
            OFlag::O_TMPFILE | OFlag::O_WRONLY | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        );
        let (mut file, tmp_path): (File, Option<PathBuf>) = match tmpfile {
            Ok(fd) => (File::from(fd), None),
            Err(_) => {
                // No O_TMPFILE on this filesystem: a named temp file, linked then removed.
                let p = self.dir.join(format!("{TMP_PREFIX}{}", std::process::id()));
                let _ = std::fs::remove_file(&p);
                let f = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&p)
                    .map_err(|e| io_err(format!("create {}", p.display()), e))?;
                (f, Some(p))
            }
        };
        // Owns the temp name from here on, so an error below removes it.
        let guard = Pending { file: None, tmp_path };
        file.write_all(content.as_bytes()).map_err(|e| io_err("write reservation", e))?;
        let mut pending = guard;
        pending.file = Some(file);
        Ok(pending)
    }

    /// Link `p` under the name of `ip`. `false` when the address is taken.
    fn link(&self, p: &Pending, ip: IpAddr) -> Result<bool> {
        let dst = self.dir.join(ip.to_string());
        let res = match (&p.tmp_path, &p.file) {
            (Some(tmp), _) => nix::unistd::linkat(AT_FDCWD, tmp, AT_FDCWD, &dst, AtFlags::empty()),
            (None, Some(f)) => {
                let src = format!("/proc/self/fd/{}", f.as_raw_fd());
                nix::unistd::linkat(AT_FDCWD, src.as_str(), AT_FDCWD, &dst, AtFlags::AT_SYMLINK_FOLLOW)
            }
            (None, None) => unreachable!("a pending reservation has a file"),
        };
        match res {
            Ok(()) => Ok(true),
            Err(Errno::EEXIST) => Ok(false),
            Err(e) => Err(io_err(format!("create {}", dst.display()), e)),
        }
    }

    /// Try to reserve `ip` for `a` with the prepared content `p`. On success the pending
    /// content is used up (`p` is reset); the index gets the entry in [`Store::finish`].
    pub fn reserve(&mut self, p: &mut Option<Pending>, ip: IpAddr, a: &AttachmentId) -> Result<bool> {
        self.index()?;
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
        *p = None;
        self.dirty = true;
        let key = key_hash(Kind::Attachment, a.container_id.trim(), &a.ifname);
        self.fresh.push(Entry { kind: Kind::Attachment, key, ip });
        Ok(true)
    }

    /// Remove the reservation file of `ip` if it is empty. Returns whether it did.
    fn reclaim_if_empty(&mut self, ip: IpAddr) -> Result<bool> {
        let path = self.dir.join(ip.to_string());
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.is_file() && m.len() == 0 => {}
            _ => return Ok(false),
        }
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(format!("remove empty {}", path.display()), e)),
        }
        self.dirty = true;
        eprintln!("host-local: reclaimed {ip}: its reservation file was empty (an interrupted write)");
        Ok(true)
    }

    /// Remove the reservation of `ip` found at index `slot` (`None`: made by this call).
    pub fn release(&mut self, slot: Option<u64>, ip: IpAddr) -> Result<()> {
        let p = self.dir.join(ip.to_string());
        self.dirty = true;
        match std::fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(format!("remove {}", p.display()), e)),
        }
        match slot {
            Some(slot) => self.index()?.remove(slot).map_err(|e| io_err("update index", e)),
            None => {
                self.fresh.retain(|e| e.ip != ip);
                Ok(())
            }
        }
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

    pub fn last_reserved(&self, set: usize) -> Option<IpAddr> {
        let text = std::fs::read_to_string(self.dir.join(format!("{LAST_RESERVED_PREFIX}{set}"))).ok()?;
        text.trim().parse().ok()
    }

    /// Write the cursor in place, as upstream does (it is only a hint: a torn write just
    /// restarts round-robin at the range start).
    pub fn set_last_reserved(&mut self, set: usize, ip: IpAddr) -> Result<()> {
        let p = self.dir.join(format!("{LAST_RESERVED_PREFIX}{set}"));
        self.dirty = true;
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&p)
            .map_err(|e| io_err(format!("open {}", p.display()), e))?;
        f.write_all(ip.to_string().as_bytes()).map_err(|e| io_err(format!("write {}", p.display()), e))
    }

    /// The raw cursor file of `set` (`None`: no file), to restore it on rollback.
    pub fn cursor_snapshot(&self, set: usize) -> Option<Vec<u8>> {
        std::fs::read(self.dir.join(format!("{LAST_RESERVED_PREFIX}{set}"))).ok()
    }

    /// Put back a cursor saved by [`Store::cursor_snapshot`].
    pub fn restore_cursor(&mut self, set: usize, saved: Option<Vec<u8>>) -> Result<()> {
        if self.cursor_snapshot(set) == saved {
            return Ok(());
        }
        let p = self.dir.join(format!("{LAST_RESERVED_PREFIX}{set}"));
        self.dirty = true;
        let r = match saved {
            Some(content) => std::fs::write(&p, content),
            None => std::fs::remove_file(&p).or_else(|e| {
                if e.kind() == io::ErrorKind::NotFound {
                    Ok(())
                } else {
                    Err(e)
                }
            }),
        };
        r.map_err(|e| io_err(format!("restore {}", p.display()), e))
    }

    /// Whether no file holds `ip` (STATUS; does not reserve).
    pub fn is_free(&self, ip: IpAddr) -> bool {
        matches!(std::fs::symlink_metadata(self.dir.join(ip.to_string())), Err(e) if e.kind() == io::ErrorKind::NotFound)
    }

    /// GC: remove every reservation for which `keep` is false (empty files included: they
    /// have no owner), then rebuild the index from what is left. Errors are collected.
    pub fn retain(&mut self, keep: impl Fn(&Owner) -> bool) -> Result<(Vec<IpAddr>, Vec<CniError>)> {
        let all = self.scan()?;
        let mut removed = Vec::new();
        let mut errors = Vec::new();
        let mut left = Vec::with_capacity(all.len());
        self.dirty = true;
        for (ip, owner) in all {
            if keep(&owner) {
                left.push((ip, owner));
                continue;
            }
            let p = self.dir.join(ip.to_string());
            match std::fs::remove_file(&p) {
                Ok(()) => removed.push(ip),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    errors.push(io_err(format!("remove {}", p.display()), e));
                    left.push((ip, owner));
                }
            }
        }
        self.write_index(&left)?;
        Ok((removed, errors))
    }

    /// Before unlocking: if anything changed, enter this call's reservations in the index, set
    /// the directory mtime to "now - 1 s", record the resulting stamp in the index and put a
    /// rebuilt index in place, so the next call can trust it.
    pub fn finish(&mut self) -> Result<()> {
        if !self.dirty || self.index.is_none() {
            return Ok(());
        }
        let dir = self.dir.clone();
        for e in std::mem::take(&mut self.fresh) {
            self.index()?.insert(&dir, e).map_err(|e| io_err("update index", e))?;
        }
        // In place before the stamp is taken: the rename changes the directory too.
        let idx = self.index.as_mut().expect("checked above");
        idx.publish(&dir).map_err(|e| io_err(format!("write {}", dir.join(INDEX_NAME).display()), e))?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_err(|e| CniError::io(format!("system clock before 1970: {e}")))?;
        let then = TimeSpec::new(now.as_secs() as i64 - 1, i64::from(now.subsec_nanos()));
        futimens(&self.dirf, &TimeSpec::UTIME_OMIT, &then)
            .map_err(|e| io_err(format!("set mtime of {}", self.dir.display()), e))?;
        let stamp = self.dir_stamp()?;
        let idx = self.index.as_mut().expect("checked above");
        idx.set_stamp(stamp).map_err(|e| io_err("write index header", e))?;
        self.dirty = false;
        Ok(())
    }

    /// End a call that failed after taking back every reservation it made: no index is put in
    /// place or changed, and the directory gets back the mtime it had when it was locked (its
    /// files are what they were then), so the index stays as trusted as it was.
    pub fn abort(mut self) {
        if let Some(idx) = self.index.take() {
            idx.discard(&self.dir);
        }
        if self.dirty {
            let m = TimeSpec::new(self.opened.sec, self.opened.nsec);
            if let Err(e) = futimens(&self.dirf, &TimeSpec::UTIME_OMIT, &m) {
                eprintln!("host-local: restore the mtime of {}: {e}", self.dir.display());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn open(d: &Path) -> Store {
        Store::open(d, true).unwrap().unwrap()
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
        s.finish().unwrap();
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
        s.finish().unwrap();
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
            s.finish().unwrap();
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
            s.finish().unwrap();
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
        assert_eq!(s.last_reserved(0), None);
        s.set_last_reserved(0, ip("10.0.0.7")).unwrap();
        s.set_last_reserved(1, ip("2001:db8::7")).unwrap();
        assert_eq!(s.last_reserved(0), Some(ip("10.0.0.7")));
        assert_eq!(std::fs::read_to_string(d.path().join("n/last_reserved_ip.1")).unwrap(), "2001:db8::7");
    }

    #[test]
    fn missing_directory_without_create() {
        let d = tempfile::tempdir().unwrap();
        assert!(Store::open(&d.path().join("nope"), false).unwrap().is_none());
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
        s.finish().unwrap();
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
    fn transient_errors_say_try_again() {
        assert_eq!(io_err("remove x", Errno::EBUSY).code, code::TRY_AGAIN);
        assert_eq!(io_err("lock x", Errno::EINTR).code, code::TRY_AGAIN);
        assert_eq!(io_err("x", Errno::EAGAIN).code, code::TRY_AGAIN);
        let e = io_err("remove /d/10.0.0.2", Errno::EROFS);
        assert_eq!(e.code, code::IO);
        assert_eq!(e.msg, "remove /d/10.0.0.2: Read-only file system (os error 30)");
    }
}
