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
//!
//! The store's jobs, one module each (a reader can take them one at a time):
//! - `lock`: opening the directory without following links, refusing a store others can
//!   write, the `lock` file and its flock; the [`Store`] handle itself.
//! - `indexing`: the attachment index: trusted only while the directory's stamp matches,
//!   rebuilt from a scan otherwise; lookups; publishing and stamping at the end of a call.
//! - `files`: reservation files: who holds an address ([`Owner`]), reserving one atomically,
//!   releasing it.
//! - `cursor`: the round-robin cursor `last_reserved_ip.<set>`.
//! - `records`: the netns record kept beside each reservation ADD makes ([`crate::record`]).
//! - `reclaim`: releasing what is judged dead, GC's sweep, and STATUS's probe.
//! - `fsops`: file operations relative to the directory handle, and how their errors are
//!   reported.

mod cursor;
mod files;
mod fsops;
mod indexing;
mod lock;
mod reclaim;
mod records;
#[cfg(test)]
mod tests;

pub use cursor::LAST_RESERVED_PREFIX;
pub use files::{reservation_name, Owner, Pending, RESERVATION_CAP};
pub use indexing::Held;
pub use lock::{Access, NsNote, Store, DEFAULT_LOCK_TIMEOUT, LOCK_NAME};
