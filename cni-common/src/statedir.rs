//! A directory of state a plugin keeps for itself (records of what an ADD made, STATUS's
//! certificates, marks a DEL leaves), and the only way its files are opened.
//!
//! Whoever can write into such a directory, or into one above it, can make root write through
//! a link or read a FIFO: so the rules of [`crate::fsread`] are extended to writing, and kept in
//! one place so that the next plugin cannot forget one.
//!
//! - **The directory is opened once**, from `/` one component at a time, and everything after
//!   that goes through its descriptor (`openat`, `renameat`, `unlinkat`): whatever happens to
//!   the path meanwhile, the files are the ones in the directory that was checked.
//! - **Every component is checked on its descriptor**: owned by root (by our effective user, the
//!   same for the plugins) and writable by no one else. A directory above the last may be
//!   writable by others when it is sticky (`/tmp`): then nobody but its owner can rename or
//!   remove the next component, which must be ours. The last component is never a symbolic link
//!   (`O_NOFOLLOW`); one above it is followed only when it is ours, in a directory that passed
//!   (`/var/run` -> `/run`: root put it there), and the directory it leads to is checked like
//!   any other (the directories its target passes through are the kernel's to resolve: root
//!   chose them). Anything else is an error of kind `PermissionDenied` naming the directory,
//!   its owner and mode.
//! - **Missing components are made** when asked (`mkdirat`, 0755 above the last, the caller's
//!   mode for the last), and checked like found ones.
//! - **Files are read** with [`fsread::read_regular_at`]: regular files only, never followed,
//!   never waited on, capped. A symbolic link, FIFO, device or socket in a file's place, or a
//!   file past the cap, is "not ours" ([`not_ours`]): the caller treats it as absent or refuses.
//! - **Files are written whole** ([`StateDir::write_atomic`]): into a new file under an
//!   unpredictable name (pid, time, a counter and 64 bits of `getrandom`), created
//!   `O_CREAT | O_EXCL | O_NOFOLLOW` (a link or anything else planted there is never opened: the
//!   next name is tried), then renamed over the name at the directory's descriptor.

use crate::fsread;
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{fstat, fstatat, Mode};
use std::ffi::OsString;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// A checked directory, open.
#[derive(Debug)]
pub struct StateDir {
    path: PathBuf,
    dir: File,
}

/// Whether an error of [`StateDir::read`] says the file is there but not one we could have
/// written (a symbolic link, FIFO, device or socket, or larger than the cap): the callers treat
/// it as absent (a certificate, a record) or refuse, never as an I/O failure to retry.
pub fn not_ours(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::InvalidInput | io::ErrorKind::FileTooLarge)
}

/// Whether `e` is [`StateDir::open`]'s refusal of a directory others could write.
pub fn is_unsafe(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::PermissionDenied
}

/// The mode of directories made above the last component.
const PARENT_MODE: u32 = 0o755;

/// How many temporary names [`StateDir::write_atomic`] tries before giving up.
const TMP_TRIES: u32 = 16;

fn dir_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC
}

fn euid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// `Ok` when the directory open as `f` (at `path`, for the message) may hold our state: ours
/// (or root's), writable by no one else, or, above the last component, sticky.
fn check(f: &File, path: &Path, last: bool) -> io::Result<()> {
    let st = fstat(f.as_fd())?;
    let me = euid();
    let mode = st.st_mode & 0o7777;
    let sticky_ok = !last && mode & libc::S_ISVTX != 0;
    let why = if st.st_uid != me && st.st_uid != 0 {
        format!("it belongs to uid {} (mode {mode:04o}), not to root or uid {me}", st.st_uid)
    } else if mode & 0o022 != 0 && !sticky_ok {
        format!("group or others may write it (mode {mode:04o})")
    } else {
        return Ok(());
    };
    Err(io::Error::new(io::ErrorKind::PermissionDenied, format!("{} is not safe: {why}", path.display())))
}

/// The one name a file or subdirectory of a state directory may have: one component.
fn plain(name: &str) -> io::Result<&str> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not a plain file name"),
        ));
    }
    Ok(name)
}

impl StateDir {
    /// Open the absolute `path`, checking each component (see the module). `create`: make
    /// missing components, the last with this mode (others 0755); `None`: a missing one is an
    /// error of kind `NotFound`.
    pub fn open(path: &Path, create: Option<u32>) -> io::Result<StateDir> {
        if !path.is_absolute() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not an absolute path", path.display()),
            ));
        }
        let root = File::from(nix::fcntl::open("/", dir_flags(), Mode::empty())?);
        let mut here = StateDir { path: PathBuf::from("/"), dir: root };
        let parts: Vec<&std::ffi::OsStr> = path
            .components()
            .filter_map(|c| match c {
                Component::Normal(n) => Some(Ok(n)),
                Component::ParentDir => Some(Err(())),
                _ => None,
            })
            .collect::<Result<_, ()>>()
            .map_err(|()| {
                io::Error::new(io::ErrorKind::InvalidInput, format!("{} has '..'", path.display()))
            })?;
        check(&here.dir, &here.path, parts.is_empty())?;
        for (i, part) in parts.iter().enumerate() {
            let last = i + 1 == parts.len();
            let name = part.to_str().ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, format!("{} is not UTF-8", path.display()))
            })?;
            let mode = if last { create } else { create.map(|_| PARENT_MODE) };
            here = here.step(name, mode, last)?;
        }
        Ok(here)
    }

    /// The subdirectory `name` (one component), checked as the last component of
    /// [`StateDir::open`]; made with `create`'s mode when missing and `create` is given.
    pub fn subdir(&self, name: &str, create: Option<u32>) -> io::Result<StateDir> {
        self.step(plain(name)?, create, true)
    }

    /// One component further: `name` in this directory, made when missing with `create`'s
    /// mode; a symbolic link followed only above the `last` component, and when it is ours.
    fn step(&self, name: &str, create: Option<u32>, last: bool) -> io::Result<StateDir> {
        let path = self.path.join(name);
        let at = self.dir.as_fd();
        let open = || nix::fcntl::openat(at, name, dir_flags() | OFlag::O_NOFOLLOW, Mode::empty());
        let fd = match open() {
            Err(Errno::ENOENT) if create.is_some() => {
                let mode = Mode::from_bits_truncate(create.unwrap_or(PARENT_MODE));
                match nix::sys::stat::mkdirat(at, name, mode) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(e) => return Err(with_path(e.into(), "create", &path)),
                }
                open()
            }
            other => other,
        };
        let fd = match fd {
            Ok(fd) => fd,
            Err(e @ (Errno::ELOOP | Errno::ENOTDIR)) => {
                let st = fstatat(at, name, AtFlags::AT_SYMLINK_NOFOLLOW).map_err(|_| io::Error::from(e))?;
                let is_link = st.st_mode & libc::S_IFMT == libc::S_IFLNK;
                if !is_link || last {
                    let what = if is_link {
                        "a symbolic link, which is not followed"
                    } else {
                        fsread::kind(st.st_mode)
                    };
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("{} is not a directory but {what}", path.display()),
                    ));
                }
                if st.st_uid != euid() && st.st_uid != 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::PermissionDenied,
                        format!("{} is not safe: a symbolic link of uid {}", path.display(), st.st_uid),
                    ));
                }
                nix::fcntl::openat(at, name, dir_flags(), Mode::empty())
                    .map_err(|e| with_path(e.into(), "open", &path))?
            }
            Err(e) => return Err(with_path(e.into(), "open", &path)),
        };
        let dir = File::from(fd);
        check(&dir, &path, last)?;
        Ok(StateDir { path, dir })
    }

    /// The path it was opened by (for messages: the files are reached through the descriptor).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory's descriptor.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.dir.as_fd()
    }

    /// The content of the regular file `name`, at most `cap` bytes ([`fsread::read_regular_at`]:
    /// `NotFound` when missing; [`not_ours`] for anything that is no regular file or too large).
    pub fn read(&self, name: &str, cap: u64) -> io::Result<Vec<u8>> {
        fsread::read_regular_at(self.fd(), plain(name)?, cap)
    }

    /// The regular file `name` opened with `flags` (plus `O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC`,
    /// [`fsread::open_regular_at`]), made with `mode` under `O_CREAT`: lock files.
    pub fn open_file(&self, name: &str, flags: OFlag, mode: u32) -> io::Result<File> {
        fsread::open_regular_at(self.fd(), plain(name)?, flags, mode)
    }

    /// Replace `name` with `bytes` (mode `mode`) as one step: written to a new file under an
    /// unpredictable temporary name ([`tmp_name`]), flushed to disk first when `durable`, then
    /// renamed over `name`. A failure leaves `name` as it was and no temporary file.
    pub fn write_atomic(&self, name: &str, bytes: &[u8], mode: u32, durable: bool) -> io::Result<()> {
        let name = plain(name)?;
        let create = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL;
        let mut made = None;
        for _ in 0..TMP_TRIES {
            let tmp = tmp_name(name);
            match fsread::open_regular_at(self.fd(), &tmp, create, mode) {
                Ok(f) => {
                    made = Some((f, tmp));
                    break;
                }
                // something (planted, or another writer's) is there: never opened, next name
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(with_path(e, "create", &self.path.join(&tmp))),
            }
        }
        let Some((mut f, tmp)) = made else {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{TMP_TRIES} temporary names for {name} in {} are taken", self.path.display()),
            ));
        };
        let written = (|| {
            f.write_all(bytes)?;
            if durable {
                f.sync_all()?;
            }
            nix::fcntl::renameat(self.fd(), tmp.as_str(), self.fd(), name).map_err(io::Error::from)
        })();
        if let Err(e) = written {
            let _ = nix::unistd::unlinkat(self.fd(), tmp.as_str(), nix::unistd::UnlinkatFlags::NoRemoveDir);
            return Err(with_path(e, "write", &self.path.join(name)));
        }
        Ok(())
    }

    /// Remove the file `name` (whatever it is but a directory; a link is removed, not
    /// followed). `Ok(false)`: it was not there.
    pub fn remove(&self, name: &str) -> io::Result<bool> {
        match nix::unistd::unlinkat(self.fd(), plain(name)?, nix::unistd::UnlinkatFlags::NoRemoveDir) {
            Ok(()) => Ok(true),
            Err(Errno::ENOENT) => Ok(false),
            Err(e) => Err(with_path(e.into(), "remove", &self.path.join(name))),
        }
    }

    /// Remove the subdirectory `name` if it is empty. `Ok(false)`: not there, or not empty.
    pub fn remove_dir(&self, name: &str) -> io::Result<bool> {
        match nix::unistd::unlinkat(self.fd(), plain(name)?, nix::unistd::UnlinkatFlags::RemoveDir) {
            Ok(()) => Ok(true),
            Err(Errno::ENOENT | Errno::ENOTEMPTY | Errno::EEXIST) => Ok(false),
            Err(e) => Err(with_path(e.into(), "remove", &self.path.join(name))),
        }
    }

    /// The names in the directory (without `.` and `..`), unsorted: the very directory opened.
    pub fn names(&self) -> io::Result<Vec<OsString>> {
        fsread::names(&self.dir)
    }
}

fn with_path(e: io::Error, what: &str, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

/// A temporary name for `name`: `<name>.tmp<pid>-<time>-<counter>-<random>`, all hexadecimal
/// but the pid, so that no one can plant something at it beforehand (and [`is_tmp_of`] can
/// tell it from any other name).
pub fn tmp_name(name: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{name}.tmp{}-{nanos:x}-{n:x}-{:016x}", std::process::id(), random_u64())
}

/// `Some(name)` when `file` is a temporary name of `name` made by [`tmp_name`] (or by the
/// writers before it: `<name>.tmp<pid>`), left by a process killed while writing.
pub fn is_tmp_of(file: &str) -> Option<&str> {
    let (name, rest) = file.split_once(".tmp")?;
    let ok = !name.is_empty()
        && !rest.is_empty()
        && rest.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
        && rest.as_bytes()[0].is_ascii_digit();
    ok.then_some(name)
}

/// 64 bits from `getrandom` (never waiting for the pool at boot: then the time's bits, which
/// still make an unused name; `O_EXCL` is what makes a planted one harmless).
fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: writes at most 8 bytes into the local buffer.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), libc::GRND_NONBLOCK) };
    if n == 8 {
        return u64::from_ne_bytes(b);
    }
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos().into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, PermissionsExt};

    /// A scratch directory of the test's own, 0755.
    fn scratch(test: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("cni-statedir-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        d
    }

    fn set_mode(p: &Path, m: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    }

    #[test]
    fn directories_are_made_checked_and_never_a_link_at_the_end() {
        let d = scratch("open");
        let deep = d.join("a/b/c");
        assert_eq!(StateDir::open(&deep, None).unwrap_err().kind(), io::ErrorKind::NotFound);
        let s = StateDir::open(&deep, Some(0o700)).unwrap();
        assert_eq!(s.path(), deep);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&deep), 0o700);
        assert_eq!(mode(&d.join("a")) & 0o022, 0);
        // group- or other-writable, at the end or above it: refused, naming the directory
        set_mode(&deep, 0o770);
        let e = StateDir::open(&deep, None).unwrap_err();
        assert!(is_unsafe(&e), "{e}");
        assert!(e.to_string().contains(&format!("{} is not safe: group or others", deep.display())), "{e}");
        set_mode(&deep, 0o700);
        set_mode(&d.join("a"), 0o777);
        assert!(is_unsafe(&StateDir::open(&deep, None).unwrap_err()));
        // sticky above the end is fine (/tmp); at the end it is not
        set_mode(&d.join("a"), 0o1777);
        StateDir::open(&deep, None).unwrap();
        assert!(is_unsafe(&StateDir::open(&d.join("a"), None).unwrap_err()));
        set_mode(&d.join("a"), 0o755);
        // a link at the end is refused; above it, one of ours is followed
        symlink(d.join("a"), d.join("link")).unwrap();
        let e = StateDir::open(&d.join("link"), Some(0o700)).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "{} is not a directory but a symbolic link, which is not followed",
                d.join("link").display()
            )
        );
        assert_eq!(StateDir::open(&d.join("link/b/c"), None).unwrap().names().unwrap().len(), 0);
        // a file in a directory's place
        std::fs::write(d.join("file"), "x").unwrap();
        let e = StateDir::open(&d.join("file"), Some(0o700)).unwrap_err();
        assert!(e.to_string().ends_with("is not a directory but a regular file"), "{e}");
        assert_eq!(
            StateDir::open(Path::new("relative"), None).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(StateDir::open(&d.join("a/../a"), None).unwrap_err().kind(), io::ErrorKind::InvalidInput);
        // subdirectories: one component, the same checks
        let a = StateDir::open(&d.join("a"), None).unwrap();
        assert_eq!(a.subdir("b", None).unwrap().path(), d.join("a/b"));
        assert_eq!(a.subdir("../x", Some(0o700)).unwrap_err().kind(), io::ErrorKind::InvalidInput);
        assert_eq!(a.subdir("new", Some(0o700)).unwrap().path(), d.join("a/new"));
        set_mode(&d.join("a/new"), 0o777);
        assert!(is_unsafe(&a.subdir("new", None).unwrap_err()));
        assert!(a.remove_dir("new").unwrap());
        assert!(!a.remove_dir("b").unwrap(), "not empty: kept");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn files_are_written_whole_and_never_through_what_is_planted() {
        let d = scratch("write");
        let s = StateDir::open(&d.join("s"), Some(0o700)).unwrap();
        s.write_atomic("rec", b"one\n", 0o600, true).unwrap();
        s.write_atomic("rec", b"two\n", 0o600, false).unwrap();
        assert_eq!(s.read("rec", 64).unwrap(), b"two\n");
        assert_eq!(std::fs::metadata(d.join("s/rec")).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(s.names().unwrap(), vec![OsString::from("rec")], "no temporary file left");
        // a link in the record's place is replaced, its target left alone
        std::fs::write(d.join("victim"), "keep").unwrap();
        std::fs::remove_file(d.join("s/rec")).unwrap();
        symlink(d.join("victim"), d.join("s/rec")).unwrap();
        s.write_atomic("rec", b"three\n", 0o600, false).unwrap();
        assert_eq!(std::fs::read(d.join("victim")).unwrap(), b"keep");
        assert_eq!(s.read("rec", 64).unwrap(), b"three\n");
        // temporary names are never the same twice and are told from other names
        let (a, b) = (tmp_name("rec"), tmp_name("rec"));
        assert_ne!(a, b);
        assert_eq!(is_tmp_of(&a), Some("rec"));
        assert_eq!(is_tmp_of("rec.tmp42"), Some("rec"), "the name the writers before made");
        assert_eq!(is_tmp_of("rec"), None);
        assert_eq!(is_tmp_of("rec.tmpx"), None);
        assert_eq!(is_tmp_of(".tmp1"), None);
        assert_eq!(s.write_atomic("a/b", b"", 0o600, false).unwrap_err().kind(), io::ErrorKind::InvalidInput);
        // removal: a link is removed, not followed; a missing file is no error
        assert!(s.remove("rec").unwrap());
        assert!(!s.remove("rec").unwrap());
        assert_eq!(std::fs::read(d.join("victim")).unwrap(), b"keep");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn only_regular_files_are_read_and_nothing_else_is_ours() {
        let d = scratch("read");
        let s = StateDir::open(&d, None).unwrap();
        nix::unistd::mkfifo(&d.join("fifo"), Mode::from_bits_truncate(0o600)).unwrap();
        symlink("/dev/zero", d.join("zero")).unwrap();
        std::fs::write(d.join("big"), vec![b'x'; 65]).unwrap();
        for name in ["fifo", "zero", "big"] {
            let e = s.read(name, 64).unwrap_err();
            assert!(not_ours(&e), "{name}: {e}");
        }
        let e = s.read("missing", 64).unwrap_err();
        assert!(!not_ours(&e) && e.kind() == io::ErrorKind::NotFound);
        // a FIFO at a temporary name is never opened: the next name is used
        let f = s.open_file("lock", OFlag::O_RDONLY | OFlag::O_CREAT, 0o600).unwrap();
        fsread::check_regular(&f).unwrap();
        assert!(s.open_file("fifo", OFlag::O_RDONLY, 0).is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
