//! The attachment index ([`crate::index`]) as the store uses it: trusted only while the
//! directory's stamp is the one recorded in it, rebuilt from a scan of the reservation files
//! otherwise (kept in memory when it cannot or must not be written); lookups verified against
//! the files; at the end of a call, this call's reservations entered, the index put in place and
//! the directory stamped "now - 1 s" (see the store's module docs).

use super::files::{reservation_name, tmp_name, Owner, RESERVATION_CAP, TMP_PREFIX};
use super::fsops::io_err;
use super::lock::{Access, Store};
use crate::index::{unlink_if_there, Entry, Index, Kind, Stamp};
use cni_common::attachment::AttachmentId;
use cni_common::error::Result;
use cni_common::fsread::read_regular_at;
use nix::sys::stat::{fstat, futimens};
use nix::sys::time::TimeSpec;
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd};

/// A reservation found for an owner: its index slot (`None`: not in the on-disk index) and
/// address.
pub type Held = (Option<u64>, IpAddr);

impl Store {
    pub(super) fn dir_stamp(&self) -> Result<Stamp> {
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
    pub(super) fn load_index(&mut self) -> Result<()> {
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
                Err(e) => cni_common::log!("host-local", "skipping {}: {e}", self.path_of(name).display()),
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
    pub(super) fn set_index(&mut self, all: &[(IpAddr, Owner)]) {
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
                cni_common::log!(
                    "host-local",
                    "cannot write the index of {} ({e}): working from the files; a later call rebuilds it",
                    self.dir.display()
                );
                self.mem = Some(entries);
            }
        }
    }

    /// Index hits for (`kind`, `key`): with the slot when the on-disk index has them.
    pub(super) fn lookup(&mut self, kind: Kind, key: u64) -> Result<Vec<Held>> {
        self.load_index()?;
        if let Some(idx) = &self.index {
            match idx.lookup(kind, key) {
                Ok(hits) => return Ok(hits.into_iter().map(|(s, ip)| (Some(s), ip)).collect()),
                Err(e) => {
                    cni_common::log!(
                        "host-local",
                        "the index of {} is unreadable ({e}): scanning",
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
    pub(super) fn held_by(&mut self, owner: &Owner) -> Result<Vec<Held>> {
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
    pub(super) fn forget_slot(&mut self, slot: u64) {
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
            cni_common::log!("host-local", "the index of {} is left to be rebuilt: {e}", self.dir.display());
            if let Some(idx) = self.index.take() {
                idx.discard(self.at());
            }
        }
        self.dirty = false;
    }

    pub(super) fn publish_index(&mut self) -> io::Result<()> {
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
                cni_common::log!("host-local", "restore the mtime of {}: {e}", self.dir.display());
            }
        }
    }
}
