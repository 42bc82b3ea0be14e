//! File operations relative to the store directory's handle, and how their errors are reported
//! (code 11 for a transient condition, code 5 otherwise).

use crate::index::unlink_if_there;
use cni_common::error::{code, CniError};
use cni_common::fsread::open_regular_at;
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, AT_FDCWD};
use nix::sys::stat::Mode;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, BorrowedFd};

fn transient(e: &io::Error) -> bool {
    e.raw_os_error()
        .is_some_and(|n| matches!(Errno::from_raw(n), Errno::EAGAIN | Errno::EINTR | Errno::EBUSY))
        || e.kind() == io::ErrorKind::TimedOut
}

/// A failed file operation: code 11 ("try again") when the system says the condition is
/// transient (`EAGAIN`, `EINTR`, `EBUSY`, a lock wait past its deadline), code 5 otherwise.
pub(super) fn io_err(what: impl std::fmt::Display, e: impl Into<io::Error>) -> CniError {
    let e: io::Error = e.into();
    let c = if transient(&e) { code::TRY_AGAIN } else { code::IO };
    CniError::new(c, format!("{what}: {e}"))
}

pub(super) fn errno_of(e: &io::Error) -> Option<Errno> {
    e.raw_os_error().map(Errno::from_raw)
}

/// Replace the content of the regular file `name` in `dir` in place (created when missing).
pub(super) fn write_in_place(dir: BorrowedFd<'_>, name: &str, content: &[u8]) -> io::Result<()> {
    let mut f = open_regular_at(dir, name, OFlag::O_WRONLY | OFlag::O_CREAT, 0o600)?;
    f.set_len(0)?;
    f.write_all(content)
}

/// Replace (or create) the regular file `name` in `dir` atomically with `content`: an unnamed
/// file linked in place of the old one (in place where the filesystem has no `O_TMPFILE`).
pub(super) fn replace_file(dir: BorrowedFd<'_>, name: &str, content: &[u8]) -> io::Result<()> {
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
