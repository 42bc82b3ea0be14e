//! The netns records ([`crate::record`]) kept beside the reservations ADD makes: written at the
//! end of the call, read by reclaim and GC, removed with their reservation; and the boot marker
//! saying which boot last dealt with earlier boots' reservations.

use super::files::{reservation_name, RESERVATION_CAP};
use super::fsops::{replace_file, write_in_place};
use super::lock::{Access, Store};
use crate::index::unlink_if_there;
use crate::record::{self, FileId, Record, BOOT_MARKER, RECORDS_DIR, RECORD_CAP};
use cni_common::fsread::{open_regular_at, read_regular_at};
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::{fstat, Mode};
use std::fs::File;
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd};

impl Store {
    /// The records directory, if it exists (created with `create`).
    pub(super) fn records_dir(&self, create: bool) -> io::Result<Option<File>> {
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
    pub(super) fn write_records(&mut self) {
        let Some(note) = self.note.clone() else { return };
        let made = std::mem::take(&mut self.made);
        let Some(boot) = self.boot else {
            // A record says "made in this boot"; with the boot unknown it would be judged
            // later against a boot it does not name. No record: live until released.
            cni_common::log!(
                "host-local",
                "the boot id (/proc/sys/kernel/random/boot_id) cannot be read: this call's \
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
            cni_common::log!(
                "host-local",
                "cannot record the network namespace of this call's reservations in {}: {e} \
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

    pub(super) fn remove_record(&mut self, ip: IpAddr) {
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
                cni_common::log!(
                    "host-local",
                    "cannot write {}: {e}",
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
}
