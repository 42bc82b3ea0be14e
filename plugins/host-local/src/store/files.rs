//! Reservation files: `<ip>` holding `<id>\r\n<ifname>` (upstream's format), who a file says
//! holds its address ([`Owner`]), reserving an address atomically (an unnamed file linked to its
//! name, `EEXIST` = taken; an empty file is crash debris and is taken over) and releasing one.

use super::fsops::io_err;
use super::lock::Store;
use crate::index::{key_hash, unlink_if_there, Entry, Kind};
use crate::record::FileId;
use cni_common::attachment::AttachmentId;
use cni_common::error::Result;
use cni_common::fsread::{open_regular_at, read_regular_at};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, AT_FDCWD};
use nix::sys::stat::{fstat, fstatat, Mode};
use std::fs::File;
use std::io::{self, Write};
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd};

/// Named temp files used only where `O_TMPFILE` is not available; a leftover one is removed
/// by the next scan (all our work happens under the lock, so any such file found is stale,
/// except this process's own: [`tmp_name`]).
pub(super) const TMP_PREFIX: &str = ".host-local-tmp-";

/// This process's named temp file.
pub(super) fn tmp_name() -> String {
    format!("{TMP_PREFIX}{}", std::process::id())
}
/// Largest reservation file read: a container id comes from an environment variable (at most
/// 128 KiB, the kernel's limit for one), plus the interface name and some whitespace.
pub const RESERVATION_CAP: u64 = 256 << 10;

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

    /// The content of the reservation file of `a`: `<id>\r\n<ifname>`, the id trimmed as
    /// upstream compares it (upstream's format: its DEL and GC release our reservations).
    pub fn content_of(a: &AttachmentId) -> String {
        format!("{}\r\n{}", a.container_id.trim(), a.ifname)
    }

    /// What the index files this owner under.
    pub(super) fn key(&self) -> Option<(Kind, u64)> {
        match self {
            Owner::Attachment { id, ifname } => {
                Some((Kind::Attachment, key_hash(Kind::Attachment, id, ifname)))
            }
            Owner::Legacy { id } => Some((Kind::Legacy, key_hash(Kind::Legacy, id, ""))),
            Owner::Unknown | Owner::Foreign(_) => None,
        }
    }

    pub(super) fn entry(&self, ip: IpAddr) -> Option<Entry> {
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
    pub(super) fn filled(mut file: File, named: Option<(String, File)>, content: Vec<u8>) -> Result<Pending> {
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

impl Store {
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

    /// Prepare the reservation content of `a` in an unnamed file.
    pub fn pending(&self, a: &AttachmentId) -> Result<Pending> {
        let content = Owner::content_of(a).into_bytes();
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
    pub(super) fn pending_named(&self, content: Vec<u8>) -> Result<Pending> {
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
    pub(super) fn link(&self, p: &Pending, ip: IpAddr) -> Result<bool> {
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
    pub(super) fn reclaim_if_empty(&mut self, ip: IpAddr) -> Result<bool> {
        let name = ip.to_string();
        match fstatat(self.at(), name.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_size == 0 => {}
            _ => return Ok(false),
        }
        unlink_if_there(self.at(), &name)
            .map_err(|e| io_err(format!("remove empty {}", self.path_of(&name).display()), e))?;
        self.dirty = true;
        cni_common::log!(
            "host-local",
            "reclaimed {ip}: its reservation file was empty (an interrupted write)"
        );
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

    /// Whether no file holds `ip` (STATUS; does not reserve).
    pub fn is_free(&self, ip: IpAddr) -> bool {
        matches!(
            fstatat(self.at(), ip.to_string().as_str(), AtFlags::AT_SYMLINK_NOFOLLOW),
            Err(Errno::ENOENT)
        )
    }
}
