//! Bounded reads of files (and streams) the plugins did not write themselves.
//!
//! Three rules, for every file a configuration names or a store holds:
//! - **never read without a cap**: [`read_capped`] stops one byte past the limit and fails with
//!   an error of kind [`io::ErrorKind::FileTooLarge`] (`/dev/zero` or a sparse 2 GiB file does
//!   not grow the process until the OOM killer steps in);
//! - **never block in `open`**: a FIFO opened for reading waits for a writer; these functions
//!   either open with `O_NONBLOCK` or do not open for reading at all until the file is known to
//!   be a regular one;
//! - **only regular files**: a FIFO, socket or device is refused with a message naming what it
//!   is ([`kind`]), before anything is read from it.
//!
//! Inside a directory the plugin owns (an address store), [`open_regular_at`] additionally
//! never follows a symbolic link (`O_NOFOLLOW`). A file a configuration names by path is
//! opened with [`open_named_regular`], which follows links (`/etc/resolv.conf` usually is one)
//! but looks at the file through an `O_PATH` handle first, so that a device is never opened.
//!
//! A store or cache directory another program fills (an IPAM store's `<dataDir>/<net>`, libcni's
//! `<cacheDir>/results`) is opened with [`open_dir_at`] (a symbolic link in its place is not
//! followed), listed with [`names`] (the very directory opened, whatever happens to its path)
//! and its files read with [`read_regular_at`].

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{fstat, fstatat, Mode};
use std::ffi::OsString;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::path::Path;

/// Read all of `r`, at most `cap` bytes. More is an error of kind `FileTooLarge` saying the
/// limit. Interrupted reads are retried.
pub fn read_capped(r: &mut impl Read, cap: u64) -> io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    r.take(cap.saturating_add(1)).read_to_end(&mut buf)?;
    if buf.len() as u64 > cap {
        return Err(too_large(cap));
    }
    Ok(buf)
}

/// The error [`read_capped`] gives past its limit.
pub fn too_large(cap: u64) -> io::Error {
    io::Error::new(io::ErrorKind::FileTooLarge, format!("larger than {cap} bytes, the most that is read"))
}

/// What kind of file a `st_mode` describes, for messages ("a FIFO", "a symbolic link", …).
pub fn kind(mode: u32) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFREG => "a regular file",
        libc::S_IFDIR => "a directory",
        libc::S_IFLNK => "a symbolic link",
        libc::S_IFIFO => "a FIFO",
        libc::S_IFSOCK => "a socket",
        libc::S_IFCHR => "a character device",
        libc::S_IFBLK => "a block device",
        _ => "a file of unknown type",
    }
}

fn not_regular(mode: u32) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, format!("not a regular file but {}", kind(mode)))
}

/// The error for a symbolic link met where none is followed (instead of the kernel's
/// "Too many levels of symbolic links" for `ELOOP`).
fn symlink_refused() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, "a symbolic link, which is not followed")
}

/// `Ok` when `f` is a regular file.
pub fn check_regular(f: impl AsFd) -> io::Result<()> {
    let st = fstat(f.as_fd())?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(not_regular(st.st_mode));
    }
    Ok(())
}

/// Open `name` in directory `dir` with `flags` (`O_RDONLY`, `O_WRONLY | O_CREAT`, …) plus
/// `O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY`, and keep it only if it is a regular file.
/// A symbolic link, FIFO, socket or device gives an error of kind `InvalidInput` naming it;
/// a missing file stays `NotFound`. New files get `mode`.
pub fn open_regular_at(dir: BorrowedFd<'_>, name: &str, flags: OFlag, mode: u32) -> io::Result<File> {
    let all = flags | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC | OFlag::O_NOCTTY;
    let fd = match nix::fcntl::openat(dir, name, all, Mode::from_bits_truncate(mode)) {
        Ok(fd) => fd,
        Err(Errno::ELOOP) => return Err(symlink_refused()),
        Err(e) => return Err(e.into()),
    };
    let f = File::from(fd);
    check_regular(&f)?;
    Ok(f)
}

/// The content of the regular file `name` in `dir`, at most `cap` bytes ([`open_regular_at`]
/// read-only, then [`read_capped`]).
pub fn read_regular_at(dir: BorrowedFd<'_>, name: &str, cap: u64) -> io::Result<Vec<u8>> {
    let mut f = open_regular_at(dir, name, OFlag::O_RDONLY, 0)?;
    read_capped(&mut f, cap)
}

/// Open the directory `name` in `dir` for listing ([`names`]) and for the `*_at` functions
/// here (`O_DIRECTORY | O_NOFOLLOW`). A symbolic link (or anything else that is no directory)
/// in its place is refused with an error of kind `InvalidInput` naming it; a missing one stays
/// `NotFound`. With `dir` = [`nix::fcntl::AT_FDCWD`], `name` may be a whole path: its earlier
/// components (the configured part) are followed, its last one is not.
pub fn open_dir_at(dir: BorrowedFd<'_>, name: &Path) -> io::Result<File> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    match nix::fcntl::openat(dir, name, flags, Mode::empty()) {
        Ok(fd) => Ok(File::from(fd)),
        // O_DIRECTORY | O_NOFOLLOW on a link gives ELOOP or ENOTDIR: say what is there
        Err(e @ (Errno::ELOOP | Errno::ENOTDIR)) => match fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFLNK => Err(symlink_refused()),
            Ok(st) => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("not a directory but {}", kind(st.st_mode)),
            )),
            Err(_) => Err(e.into()),
        },
        Err(e) => Err(e.into()),
    }
}

/// [`open_dir_at`] of a whole path: its last component is not followed when it is a symbolic
/// link, the components before it are.
pub fn open_dir(path: &Path) -> io::Result<File> {
    open_dir_at(nix::fcntl::AT_FDCWD, path)
}

/// The names in directory `dir` (without `.` and `..`), unsorted. Listed through
/// `/proc/self/fd/N`: the directory that was opened, not whatever its path names now.
pub fn names(dir: &File) -> io::Result<Vec<OsString>> {
    let listing = format!("/proc/self/fd/{}", dir.as_raw_fd());
    std::fs::read_dir(&listing)?.map(|e| e.map(|e| e.file_name())).collect()
}

/// Open the file at `path` (a path a configuration names; links are followed) for reading,
/// only if it is a regular file. The file is looked at through an `O_PATH` handle, which opens
/// nothing, and only a regular file is then opened for reading, through that handle (the same
/// inode, whatever happens to the path meanwhile). A FIFO is never waited on and a device never
/// opened.
pub fn open_named_regular(path: &Path) -> io::Result<File> {
    let handle = nix::fcntl::open(path, OFlag::O_PATH | OFlag::O_CLOEXEC, Mode::empty())?;
    check_regular(&handle)?;
    let reopen = format!("/proc/self/fd/{}", handle.as_raw_fd());
    File::open(&reopen)
        .map_err(|e| io::Error::new(e.kind(), format!("reopen through {reopen} (is /proc mounted?): {e}")))
}

/// The content of the regular file at `path`, at most `cap` bytes ([`open_named_regular`], then
/// [`read_capped`]).
pub fn read_named_regular(path: &Path, cap: u64) -> io::Result<Vec<u8>> {
    let mut f = open_named_regular(path)?;
    read_capped(&mut f, cap)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn dir() -> (std::path::PathBuf, File) {
        let n = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        let d = std::env::temp_dir().join(format!("cni-fsread-{}-{n}", std::process::id()));
        std::fs::create_dir(&d).unwrap();
        let f = File::open(&d).unwrap();
        (d, f)
    }

    #[test]
    fn caps_are_exact() {
        assert_eq!(read_capped(&mut &b"12345"[..], 5).unwrap(), b"12345");
        let e = read_capped(&mut &b"123456"[..], 5).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::FileTooLarge);
        assert_eq!(e.to_string(), "larger than 5 bytes, the most that is read");
        // an endless stream stops one byte past the cap
        let e = read_capped(&mut io::repeat(0), 1 << 20).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::FileTooLarge);
    }

    #[test]
    fn named_files_must_be_regular_and_are_capped() {
        let e = read_named_regular(Path::new("/dev/zero"), 1 << 20).unwrap_err();
        assert_eq!(e.to_string(), "not a regular file but a character device");
        let (d, _f) = dir();
        let fifo = d.join("fifo");
        nix::unistd::mkfifo(&fifo, Mode::from_bits_truncate(0o600)).unwrap();
        // would block forever in open(O_RDONLY) without the O_PATH look first
        assert_eq!(read_named_regular(&fifo, 10).unwrap_err().to_string(), "not a regular file but a FIFO");
        let big = d.join("big");
        File::create(&big).unwrap().set_len(1 << 31).unwrap(); // sparse 2 GiB
        assert_eq!(read_named_regular(&big, 1 << 20).unwrap_err().kind(), io::ErrorKind::FileTooLarge);
        std::fs::write(d.join("small"), "nameserver 192.0.2.1\n").unwrap();
        symlink(d.join("small"), d.join("link")).unwrap();
        assert_eq!(read_named_regular(&d.join("link"), 100).unwrap(), b"nameserver 192.0.2.1\n");
        assert_eq!(read_named_regular(&d.join("missing"), 1).unwrap_err().kind(), io::ErrorKind::NotFound);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn files_in_a_directory_are_never_followed_or_waited_on() {
        let (d, f) = dir();
        std::fs::write(d.join("victim"), "keep").unwrap();
        symlink(d.join("victim"), d.join("link")).unwrap();
        nix::unistd::mkfifo(&d.join("fifo"), Mode::from_bits_truncate(0o600)).unwrap();
        std::fs::write(d.join("ok"), "c1\r\neth0").unwrap();
        let at = f.as_fd();
        assert_eq!(read_regular_at(at, "ok", 64).unwrap(), b"c1\r\neth0");
        let e = read_regular_at(at, "link", 64).unwrap_err();
        assert_eq!(e.to_string(), "a symbolic link, which is not followed");
        assert_eq!(read_regular_at(at, "fifo", 64).unwrap_err().to_string(), "not a regular file but a FIFO");
        assert_eq!(read_regular_at(at, "ok", 3).unwrap_err().kind(), io::ErrorKind::FileTooLarge);
        assert_eq!(read_regular_at(at, "missing", 3).unwrap_err().kind(), io::ErrorKind::NotFound);
        // writing through a link is refused too, and the link's target is left alone
        let w = OFlag::O_WRONLY | OFlag::O_CREAT;
        assert!(open_regular_at(at, "link", w, 0o600).is_err());
        assert_eq!(std::fs::read(d.join("victim")).unwrap(), b"keep");
        // a FIFO opened for writing without a reader fails at once (ENXIO) instead of blocking
        assert!(open_regular_at(at, "fifo", w, 0o600).is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn directories_are_opened_without_following_a_link_and_listed_as_opened() {
        let (d, f) = dir();
        std::fs::create_dir(d.join("sub")).unwrap();
        std::fs::write(d.join("sub/a"), "x").unwrap();
        std::fs::create_dir(d.join("elsewhere")).unwrap();
        std::fs::write(d.join("elsewhere/secret"), "x").unwrap();
        symlink(d.join("elsewhere"), d.join("link")).unwrap();
        let at = f.as_fd();
        let sub = open_dir_at(at, Path::new("sub")).unwrap();
        assert_eq!(names(&sub).unwrap(), vec![OsString::from("a")]);
        let e = open_dir_at(at, Path::new("link")).unwrap_err();
        assert_eq!(e.to_string(), "a symbolic link, which is not followed");
        assert_eq!(
            open_dir_at(at, Path::new("sub/a")).unwrap_err().to_string(),
            "not a directory but a regular file"
        );
        assert_eq!(open_dir_at(at, Path::new("missing")).unwrap_err().kind(), io::ErrorKind::NotFound);
        // a whole path: the last component is not followed, earlier ones are
        assert_eq!(
            open_dir(&d.join("link")).unwrap_err().to_string(),
            "a symbolic link, which is not followed"
        );
        assert_eq!(names(&open_dir(&d.join("link/.")).unwrap()).unwrap(), vec![OsString::from("secret")]);
        // the listing is of the directory opened, even after its path names another one
        std::fs::rename(d.join("sub"), d.join("moved")).unwrap();
        std::fs::rename(d.join("elsewhere"), d.join("sub")).unwrap();
        assert_eq!(names(&sub).unwrap(), vec![OsString::from("a")]);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
