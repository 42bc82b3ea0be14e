//! Taking addresses back: the reservations whose record is judged dead, GC's sweep of what is
//! not kept, and STATUS's probe of whether an ADD could work at all (which writes nothing).

use super::cursor::LAST_RESERVED_PREFIX;
use super::files::Owner;
use super::fsops::io_err;
use super::lock::{open_dir, unsafe_owner, unsafe_store, Store, LOCK_NAME};
use crate::index::unlink_if_there;
use crate::record::Record;
use cni_common::error::{CniError, Result};
use cni_common::fsread::kind;
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{fstatat, Mode};
use std::fs::File;
use std::net::IpAddr;
use std::os::fd::AsFd;
use std::path::Path;

impl Store {
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
