//! DEL's marks: what lets `cni-migrate resync` refuse to rebuild host ports for an attachment
//! whose DEL has begun (issue 27 finding 10).
//!
//! A runtime's DEL runs the chain in reverse: portmap's step first, the pod's interface goes
//! later (bridge's step). A resync that rebuilt the host ports after portmap's step and looked
//! at the pod again before its interface went left the deleted pod's DNAT behind, pointing at an
//! address host-local hands out again. So portmap's DEL leaves a mark for the attachment before
//! it deletes anything, and resync rebuilds only when there is none, holding the lock DEL takes
//! to write it:
//!
//! - `<dir>/lock`: DEL and ADD hold it shared (they never wait for each other), resync holds it
//!   exclusively from looking for the mark until its rebuild is committed. So a DEL's mark is
//!   either seen by resync (nothing rebuilt) or written after the rebuild, and that DEL's
//!   deletion, which follows its mark, then removes what was rebuilt.
//! - `<dir>/<hash>` (the attachment's 128-bit value, 32 hex digits): the mark, an empty file
//!   created with `O_EXCL | O_NOFOLLOW`. ADD of the same attachment (a restarted pod with the
//!   same container id) removes it. Whatever is at that name, of any type, counts as a mark:
//!   resync then rebuilds nothing (unknown is alive, and a mark no one can remove is loud).
//!
//! Files, not elements of portmap's nf_tables table: the table is what a `flush ruleset` takes,
//! and that is when resync runs; `/run` survives a flush, and goes at reboot, when every pod
//! has gone too. The directory is a [`StateDir`] (cni-common's one way to a directory of
//! state): root's, mode 0700, opened once along its path, refused when it or a directory above
//! it is another user's or writable by others, never followed when a link; nothing in it is
//! read as data.
//! resync sweeps the marks of attachments no cache it scans holds any more, and DEL, once per
//! [`SWEEP_EVERY`], those made or renewed more than [`LIFETIME`] ago (their DEL is long done:
//! a node that never resyncs keeps the last hour's marks, not one per pod deleted since boot).

use cni_common::statedir::{self, StateDir};
use cni_common::{code, CniError, Result};
use nix::fcntl::OFlag;
use std::collections::BTreeSet;
use std::ffi::CString;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use crate::model::Owner;

/// Where the marks are kept on a node.
pub const DIR: &str = "/run/cni/portmap";

/// How long a verb waits for the lock (a resync holds it for one attachment's rebuild).
pub const WAIT: Duration = Duration::from_secs(10);

/// How long a mark outlives the DEL that made it. A runtime's DEL of a chain ends in seconds
/// (every step has a deadline) and then removes the attachment's cache entry, after which
/// resync never looks at the attachment again: the mark is needed no longer. A DEL that
/// failed is tried again by the runtime, and that DEL's portmap step marks anew, renewing the
/// mark's time. Past this lifetime a mark goes at the next sweep ([`SWEEP_EVERY`]), so the
/// directory holds the marks of the last hour's DELs, not of every pod deleted since boot.
pub const LIFETIME: Duration = Duration::from_secs(3600);

/// How often DEL looks for marks past their [`LIFETIME`] (the time of the last look is that
/// of the file `swept` in the directory): one lookup per DEL, one listing per period.
pub const SWEEP_EVERY: Duration = Duration::from_secs(600);

/// The file whose modification time says when marks were last swept for age.
const SWEPT: &str = "swept";

/// The marks directory.
#[derive(Debug, Clone)]
pub struct Marks {
    dir: PathBuf,
}

/// The lock held (shared or exclusive), and the directory it guards.
#[derive(Debug)]
pub struct Held {
    dir: StateDir,
    _lock: File,
    path: PathBuf,
}

fn io(path: &Path, what: &str, e: impl std::fmt::Display) -> CniError {
    CniError::io(format!("portmap: {what} {}: {e}", path.display()))
}

impl Marks {
    /// The node's ([`DIR`]).
    pub fn system() -> Marks {
        Marks { dir: PathBuf::from(DIR) }
    }

    /// Marks kept in `dir` (tests).
    pub fn at(dir: impl Into<PathBuf>) -> Marks {
        Marks { dir: dir.into() }
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The directory, opened without following a link and checked to be root's alone (`None`:
    /// not there and `create` is false).
    fn open_dir(&self, create: bool) -> Result<Option<StateDir>> {
        match StateDir::open(&self.dir, create.then_some(0o700)) {
            Ok(d) => Ok(Some(d)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !create => Ok(None),
            Err(e) if statedir::is_unsafe(&e) => {
                Err(io(&self.dir, "refuse", format!("{e}: it must be ours and writable by us alone")))
            }
            Err(e) => Err(io(&self.dir, "open (a directory, not a link)", e)),
        }
    }

    fn hold(&self, create: bool, exclusive: bool, wait: Duration) -> Result<Option<Held>> {
        let Some(dir) = self.open_dir(create)? else { return Ok(None) };
        let path = self.dir.join("lock");
        // a regular file only (a FIFO there is refused, never waited on)
        let lock = dir.open_file("lock", OFlag::O_CREAT | OFlag::O_RDWR, 0o600).map_err(|e| {
            io(&path, "open", format!("{e}{}", if statedir::not_ours(&e) { " (remove it)" } else { "" }))
        })?;
        let start = Instant::now();
        loop {
            let tried = if exclusive { lock.try_lock() } else { lock.try_lock_shared() };
            match tried {
                Ok(()) => return Ok(Some(Held { dir, _lock: lock, path: self.dir.clone() })),
                Err(std::fs::TryLockError::WouldBlock) if start.elapsed() < wait => {
                    std::thread::sleep(Duration::from_millis(20).min(wait))
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(CniError::new(
                        code::TRY_AGAIN,
                        format!(
                        "portmap: {} is held (a resync is rebuilding host ports) past {} s; try again later",
                        path.display(),
                        wait.as_secs_f64()
                    ),
                    ))
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(io(&path, "lock", e)),
            }
        }
    }

    /// The lock shared, as DEL and ADD hold it; the directory is made when `create`.
    pub fn shared(&self, create: bool, wait: Duration) -> Result<Option<Held>> {
        self.hold(create, false, wait)
    }

    /// The lock exclusive, as resync holds it (the directory is made: a DEL that comes later
    /// must find it).
    pub fn exclusive(&self, wait: Duration) -> Result<Held> {
        Ok(self.hold(true, true, wait)?.expect("created"))
    }

    /// DEL's step: mark `owner`'s attachment deleted (idempotent: a mark there is renewed),
    /// under the shared lock; then, once per [`SWEEP_EVERY`], remove the marks past their
    /// [`LIFETIME`] (a failure there is a note: the mark is made).
    pub fn mark_deleted(&self, owner: &Owner) -> Result<()> {
        let held = self.shared(true, WAIT)?.expect("created");
        held.mark(owner)?;
        if let Err(e) = held.expire_due(SystemTime::now()) {
            cni_common::log!("", "{}; old marks stay until the next sweep", e.msg);
        }
        Ok(())
    }

    /// ADD's step: the attachment lives again (a restarted pod with the same container id).
    ///
    /// Almost every ADD is of an attachment never deleted under its id: nothing is at the
    /// mark's name, and one lookup (the name itself not followed) says so, without the lock:
    /// with nothing to remove there is nothing to order against a resync, so a new pod's ADD
    /// never waits for one. Whatever the lookup finds, or cannot tell, takes the checked path
    /// (the directory refused when it is a link or not root's alone, the lock, the removal).
    pub fn unmark(&self, owner: &Owner) -> Result<()> {
        match std::fs::symlink_metadata(self.dir.join(name(owner))) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            _ => {}
        }
        match self.shared(false, WAIT)? {
            Some(h) => h.unmark(owner),
            None => Ok(()),
        }
    }
}

/// The name of `owner`'s mark.
pub fn name(owner: &Owner) -> String {
    owner.hash.0.iter().map(|b| format!("{b:02x}")).collect()
}

fn cstr(name: &str) -> CString {
    CString::new(name).expect("hex digits or a fixed name")
}

impl Held {
    /// Mark `owner` (an existing mark, whatever it is, stays, its time renewed: never
    /// followed, never opened).
    pub fn mark(&self, owner: &Owner) -> Result<()> {
        let n = name(owner);
        match self.dir.open_file(&n, OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY, 0o600) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => self.touch(&n),
            Err(e) => Err(io(&self.path.join(&n), "create", e)),
        }
    }

    /// Set the modification time of what is at `n` to now (a link's own, not its target's).
    fn touch(&self, n: &str) -> Result<()> {
        let c = cstr(n);
        // SAFETY: a valid directory fd, a NUL-terminated name; null times mean now
        let r = unsafe {
            libc::utimensat(
                self.dir.fd().as_raw_fd(),
                c.as_ptr(),
                std::ptr::null(),
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        if r == 0 {
            return Ok(());
        }
        Err(io(&self.path.join(n), "renew the time of", std::io::Error::last_os_error()))
    }

    /// The modification time of what is at `n` (not followed); None: nothing there.
    fn modified(&self, n: &str) -> Result<Option<SystemTime>> {
        let c = cstr(n);
        // SAFETY: a valid directory fd, a NUL-terminated name, a zeroed stat buffer
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        let r = unsafe {
            libc::fstatat(self.dir.fd().as_raw_fd(), c.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW)
        };
        if r != 0 {
            return match std::io::Error::last_os_error() {
                e if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
                e => Err(io(&self.path.join(n), "look at", e)),
            };
        }
        let since = Duration::new(st.st_mtime.max(0) as u64, st.st_mtime_nsec.clamp(0, 999_999_999) as u32);
        Ok(Some(SystemTime::UNIX_EPOCH + since))
    }

    /// Once per [`SWEEP_EVERY`] (by the time of `swept`, `SWEEP_EVERY` apart from `now` either
    /// way: a time far in the future, after the clock was set back, counts as due): remove the marks older than [`LIFETIME`] at `now`. The
    /// number removed.
    pub fn expire_due(&self, now: SystemTime) -> Result<usize> {
        let last = self.modified(SWEPT)?;
        let apart = |t: SystemTime| now.duration_since(t).unwrap_or_else(|e| e.duration());
        if last.is_some_and(|t| apart(t) < SWEEP_EVERY) {
            return Ok(0);
        }
        // made when missing, never opened when there (whatever was planted at the name, a FIFO
        // too): its time is set without opening it
        match self.dir.open_file(SWEPT, OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY, 0o600) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io(&self.path.join(SWEPT), "create", e)),
        }
        self.touch(SWEPT)?;
        self.expire(now.checked_sub(LIFETIME).unwrap_or(SystemTime::UNIX_EPOCH))
    }

    /// Remove the marks last made or renewed before `before`; other names, and what cannot be
    /// looked at or removed (unknown is alive), are left alone. The number removed.
    pub fn expire(&self, before: SystemTime) -> Result<usize> {
        let mut removed = 0;
        for n in self.mark_names()? {
            if self.modified(&n).ok().flatten().is_some_and(|t| t < before) && self.unlink(&n).is_ok() {
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// The names in the directory that are marks' ([`name`]: 32 hex digits).
    fn mark_names(&self) -> Result<Vec<String>> {
        let list = self.dir.names().map_err(|e| io(&self.path, "list", e))?;
        let mut out = Vec::new();
        for n in list {
            let is_mark = n.len() == 32 && n.as_encoded_bytes().iter().all(|b| b.is_ascii_hexdigit());
            if let Some(n) = n.to_str().filter(|_| is_mark) {
                out.push(n.to_string());
            }
        }
        Ok(out)
    }

    /// Remove `owner`'s mark (a link there is removed, never followed; none: nothing to do).
    pub fn unmark(&self, owner: &Owner) -> Result<()> {
        self.unlink(&name(owner))
    }

    fn unlink(&self, n: &str) -> Result<()> {
        self.dir.remove(n).map(drop).map_err(|e| io(&self.path.join(n), "remove", e))
    }

    /// Whether `owner` has a mark: anything at its name counts (Err: cannot tell).
    pub fn is_marked(&self, owner: &Owner) -> Result<bool> {
        Ok(self.modified(&name(owner))?.is_some())
    }

    /// Remove the marks whose names are not in `keep` (names of [`name`]); other names are left
    /// alone. The number removed.
    pub fn sweep(&self, keep: &BTreeSet<String>) -> Result<usize> {
        let mut removed = 0;
        for n in self.mark_names()?.into_iter().filter(|n| !keep.contains(n)) {
            self.unlink(&n)?;
            removed += 1;
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cni_common::attachment::AttachmentId;
    use std::os::unix::fs::MetadataExt;

    fn owner(id: &str) -> Owner {
        Owner::of(&AttachmentId { network: "net".into(), container_id: id.into(), ifname: "eth0".into() })
    }

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("portmap-marks-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_del_marks_an_add_unmarks_and_a_missing_directory_is_no_mark() {
        let d = scratch("cycle");
        let m = Marks::at(d.join("portmap"));
        m.unmark(&owner("a")).expect("no directory: nothing to unmark, nothing made");
        assert!(!d.exists(), "ADD makes no directory");
        m.mark_deleted(&owner("a")).unwrap();
        m.mark_deleted(&owner("a")).expect("DEL is idempotent");
        let meta = std::fs::metadata(m.path()).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o700);
        let h = m.exclusive(Duration::ZERO).unwrap();
        assert!(h.is_marked(&owner("a")).unwrap());
        assert!(!h.is_marked(&owner("b")).unwrap());
        drop(h);
        m.unmark(&owner("a")).unwrap();
        let h = m.exclusive(Duration::ZERO).unwrap();
        assert!(!h.is_marked(&owner("a")).unwrap(), "a restarted pod (ADD after DEL) is no longer marked");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn resync_holding_the_lock_keeps_a_del_from_marking_until_it_is_done() {
        let d = scratch("lock");
        let m = Marks::at(d.join("portmap"));
        let resync = m.exclusive(Duration::ZERO).unwrap();
        let e = m.shared(true, Duration::ZERO).expect_err("a DEL waits for the rebuild");
        assert_eq!(e.code, code::TRY_AGAIN, "{e:?}");
        let e = m.exclusive(Duration::ZERO).expect_err("one resync at a time");
        assert_eq!(e.code, code::TRY_AGAIN);
        drop(resync);
        let del1 = m.shared(true, Duration::ZERO).unwrap().unwrap();
        let del2 = m.shared(true, Duration::ZERO).unwrap().expect("DELs and ADDs share it");
        assert_eq!(m.exclusive(Duration::ZERO).unwrap_err().code, code::TRY_AGAIN, "no rebuild meanwhile");
        drop((del1, del2));
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// Set the modification time of `path` (a regular file) to `t`.
    fn age(path: &Path, t: SystemTime) {
        std::fs::File::options().write(true).open(path).unwrap().set_modified(t).unwrap();
    }

    #[test]
    fn marks_go_one_lifetime_after_their_last_del_swept_once_per_period() {
        let d = scratch("expire");
        let m = Marks::at(d.join("portmap"));
        let path = |o: &str| m.path().join(name(&owner(o)));
        let now = SystemTime::now();
        let long_ago = now - LIFETIME - Duration::from_secs(60);
        m.mark_deleted(&owner("old")).unwrap();
        m.mark_deleted(&owner("retried")).unwrap();
        m.mark_deleted(&owner("recent")).unwrap();
        std::fs::write(m.path().join("README"), "").unwrap();
        for o in ["old", "retried"] {
            age(&path(o), long_ago);
        }
        age(&m.path().join("README"), long_ago);
        // the runtime tries a failed DEL again: its mark is renewed, not left at its first time
        m.mark_deleted(&owner("retried")).unwrap();
        assert!(std::fs::metadata(path("retried")).unwrap().modified().unwrap() > long_ago);
        // the first DEL swept already (no `swept` yet): nothing is due until SWEEP_EVERY passes
        let h = m.shared(false, WAIT).unwrap().unwrap();
        assert_eq!(h.expire_due(now).unwrap(), 0, "swept a moment ago");
        assert!(path("old").exists());
        age(&m.path().join(SWEPT), now - SWEEP_EVERY);
        assert_eq!(h.expire_due(now).unwrap(), 1, "only the mark past its lifetime");
        assert!(!path("old").exists() && path("retried").exists() && path("recent").exists());
        assert!(m.path().join("README").exists() && m.path().join("lock").exists(), "no mark: left alone");
        // a `swept` time in the future (the clock set back) counts as due
        age(&m.path().join(SWEPT), now + Duration::from_secs(86_400));
        age(&path("recent"), long_ago);
        assert_eq!(h.expire_due(now).unwrap(), 1);
        assert!(!path("recent").exists());
        // whatever is at `swept` is never opened (a FIFO would block an open for writing)
        std::fs::remove_file(m.path().join(SWEPT)).unwrap();
        nix::unistd::mkfifo(&m.path().join(SWEPT), nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let old = nix::sys::time::TimeSpec::from_duration(
            (now - SWEEP_EVERY - Duration::from_secs(1)).duration_since(SystemTime::UNIX_EPOCH).unwrap(),
        );
        nix::sys::stat::utimensat(
            nix::fcntl::AT_FDCWD,
            &m.path().join(SWEPT),
            &old,
            &old,
            nix::sys::stat::UtimensatFlags::NoFollowSymlink,
        )
        .unwrap();
        assert_eq!(h.expire_due(now).unwrap(), 0, "due, its time renewed without opening it");
        let renewed = std::fs::symlink_metadata(m.path().join(SWEPT)).unwrap().modified().unwrap();
        assert!(renewed > now - SWEEP_EVERY);
        std::fs::remove_file(m.path().join(SWEPT)).unwrap();
        std::fs::write(m.path().join(SWEPT), "").unwrap();
        // a DEL sweeps by itself once the period has passed
        age(&m.path().join(SWEPT), now - SWEEP_EVERY - Duration::from_secs(1));
        age(&path("retried"), long_ago);
        drop(h);
        m.mark_deleted(&owner("next")).unwrap();
        assert!(!path("retried").exists() && path("next").exists());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn an_add_of_a_pod_never_deleted_does_not_wait_for_a_resync() {
        let d = scratch("nowait");
        let m = Marks::at(d.join("portmap"));
        m.mark_deleted(&owner("gone")).unwrap();
        let resync = m.exclusive(Duration::ZERO).unwrap();
        // (the lock held, the checked path would fail with code 11 after WAIT)
        m.unmark(&owner("new")).expect("nothing to remove: no lock needed");
        assert!(resync.is_marked(&owner("gone")).unwrap() && !resync.is_marked(&owner("new")).unwrap());
        drop(resync);
        m.unmark(&owner("gone")).unwrap();
        assert!(!m.exclusive(Duration::ZERO).unwrap().is_marked(&owner("gone")).unwrap());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn planted_things_are_never_followed_and_count_as_marks() {
        let d = scratch("planted");
        let m = Marks::at(d.join("portmap"));
        let victim = d.join("victim");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(&victim, "keep").unwrap();
        m.mark_deleted(&owner("x")).unwrap();
        // a link at a mark's name: a mark, and removing it removes the link, not its target
        std::os::unix::fs::symlink(&victim, m.path().join(name(&owner("a")))).unwrap();
        let h = m.exclusive(Duration::ZERO).unwrap();
        assert!(h.is_marked(&owner("a")).unwrap());
        h.mark(&owner("a")).expect("already marked");
        h.unmark(&owner("a")).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        // a sweep keeps what is asked and what is no mark
        std::fs::write(m.path().join("README"), "").unwrap();
        h.mark(&owner("y")).unwrap();
        let keep: BTreeSet<String> = [name(&owner("y"))].into();
        assert_eq!(h.sweep(&keep).unwrap(), 1);
        assert!(!h.is_marked(&owner("x")).unwrap() && h.is_marked(&owner("y")).unwrap());
        assert!(m.path().join("README").exists());
        drop(h);
        // a lock that is not a regular file, a directory that is a link or others' to write
        std::fs::remove_file(m.path().join("lock")).unwrap();
        nix::unistd::mkfifo(&m.path().join("lock"), nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert!(m.exclusive(Duration::ZERO).unwrap_err().msg.contains("not a regular file"));
        let linked = Marks::at(d.join("linked"));
        std::os::unix::fs::symlink(m.path(), linked.path()).unwrap();
        assert!(linked.exclusive(Duration::ZERO).is_err(), "a link is not followed");
        // ADD through a linked directory: a mark found there is never removed through the link
        assert!(linked.unmark(&owner("y")).unwrap_err().msg.contains("not a link"));
        assert!(m.path().join(name(&owner("y"))).exists(), "the mark stays");
        std::fs::set_permissions(m.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        let e = m.mark_deleted(&owner("z")).unwrap_err();
        assert!(e.msg.contains("writable by us alone"), "{e:?}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
