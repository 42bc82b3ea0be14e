//! The round-robin cursor of each range set, `last_reserved_ip.<set>`: read, written in place as
//! upstream does (it is only a hint), saved and put back on rollback.

use super::fsops::{io_err, write_in_place};
use super::lock::Store;
use crate::index::unlink_if_there;
use cni_common::error::Result;
use cni_common::fsread::read_regular_at;
use std::io;
use std::net::IpAddr;

/// The cursor file of range set N is this prefix followed by N.
pub const LAST_RESERVED_PREFIX: &str = "last_reserved_ip.";

/// A cursor holds one address.
pub(super) const CURSOR_CAP: u64 = 64;

impl Store {
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
}
