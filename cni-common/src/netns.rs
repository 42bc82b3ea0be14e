//! Network namespaces: open one by path, compare two, and run code inside one.
//!
//! `setns(2)` moves only the calling *thread*, so everything here is about the current thread:
//! [`NetNs::current`] reads `/proc/thread-self/ns/net` (not `/proc/self/…`, which names the main
//! thread's namespace and is wrong on any other thread, e.g. under the test harness), and
//! [`NetNs::run`] enters a namespace, runs a closure and always comes back.
//!
//! Netlink sockets and `/proc/sys/net` files are bound to the namespace of the thread that
//! *created/opened* them, so both work from inside [`NetNs::run`].

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::sched::{setns, CloneFlags};
use nix::sys::statfs::{fstatfs, NSFS_MAGIC};

use crate::{CniError, Result};

/// The calling thread's network namespace.
const THREAD_NETNS: &str = "/proc/thread-self/ns/net";

/// An open handle on a network namespace (a file on nsfs, e.g. `/proc/<pid>/ns/net` or a bind
/// mount of one such as `/run/netns/<name>` or `/var/run/netns/cni-…`).
///
/// Holding the handle keeps the namespace alive even when no process is left in it.
#[derive(Debug)]
pub struct NetNs {
    file: File,
    path: PathBuf,
    /// (st_dev, st_ino) of the nsfs inode: the identity of the namespace.
    id: (u64, u64),
}

/// What an opened file turned out to be.
enum Probe {
    NetNs(NetNs),
    /// Not a namespace file (e.g. the empty mount point left after the bind mount went away).
    NotANamespace,
    /// Nothing at the path.
    Missing,
    /// A namespace of another type (mount, uts, …): a caller mistake rather than a vanished
    /// netns, an error wherever a network namespace is looked for.
    OtherType,
}

/// Open `path` with `O_PATH`: no open(2) side effect of the file itself happens (a FIFO does
/// not block waiting for a writer, a device driver's open is not called), whatever is there.
/// `nofollow`: a symlink as the last component is opened itself, not followed.
///
/// Not through `OpenOptions::custom_flags`: musl counts `O_PATH` in `O_ACCMODE` (its
/// `O_SEARCH`), so std masks it out there and the file would be opened for real.
fn open_o_path(path: &Path, nofollow: bool) -> io::Result<File> {
    use nix::fcntl::OFlag;
    let mut flags = OFlag::O_PATH | OFlag::O_CLOEXEC;
    if nofollow {
        flags |= OFlag::O_NOFOLLOW;
    }
    Ok(File::from(nix::fcntl::open(path, flags, nix::sys::stat::Mode::empty())?))
}

/// Whether the open file is on nsfs, the filesystem of namespace files (Linux 3.19 and
/// later). `fstatfs` works on `O_PATH` descriptors.
fn on_nsfs(file: &File) -> io::Result<bool> {
    Ok(fstatfs(file).map_err(io::Error::from)?.filesystem_type() == NSFS_MAGIC)
}

/// The error of an open that means "nothing is there" (ESRCH: `/proc/<pid>` of a process
/// that is exiting).
fn is_gone(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR | libc::ESRCH))
}

/// Whether `path` is a descriptor's link in `/proc`: `/proc/<pid>/fd/<n>` or
/// `/proc/<pid>/task/<tid>/fd/<n>`, decimal digits only.
fn descriptor_link(path: &str) -> bool {
    let digits = |s: &str| (1..=10).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_digit());
    let Some(rest) = path.strip_prefix("/proc/") else { return false };
    match rest.split('/').collect::<Vec<_>>().as_slice() {
        [pid, "fd", fd] => digits(pid) && digits(fd),
        [pid, "task", tid, "fd", fd] => digits(pid) && digits(tid) && digits(fd),
        _ => false,
    }
}

/// Why [`Probe::OtherType`] is an error.
const OTHER_TYPE: &str = "a namespace file, but not a network namespace";

impl Probe {
    /// The namespace, `None` when there is none (gone, not a namespace file), an error for a
    /// namespace of another type.
    fn found(self) -> io::Result<Option<NetNs>> {
        match self {
            Probe::NetNs(ns) => Ok(Some(ns)),
            Probe::NotANamespace | Probe::Missing => Ok(None),
            Probe::OtherType => Err(io::Error::new(io::ErrorKind::InvalidInput, OTHER_TYPE)),
        }
    }
}

impl NetNs {
    /// Open the network namespace at `path`. Fails with code 5 (I/O) naming the path when it does
    /// not exist or is not a network namespace.
    ///
    /// Whatever is at `path` is opened with `O_PATH` first and must be on nsfs before it is
    /// opened for real (through `/proc/thread-self/fd/N`, so it is the very file checked): a
    /// FIFO, a device or any other file never sees an open(2).
    pub fn open(path: impl AsRef<Path>) -> Result<NetNs> {
        let path = path.as_ref();
        let why = match Self::open_checked(path, false)? {
            Probe::NetNs(ns) => return Ok(ns),
            Probe::NotANamespace => "not a network namespace (nsfs) file",
            Probe::Missing => "No such file or directory",
            Probe::OtherType => OTHER_TYPE,
        };
        Err(CniError::io(format!("failed to open network namespace {}: {why}", path.display())))
    }

    /// Like [`NetNs::open`], but `Ok(None)` when the namespace is gone: the path does not exist
    /// (ENOENT/ENOTDIR) or is no longer a namespace (the bind mount was removed and only the
    /// empty mount point is left). DEL uses this to treat a vanished netns as success.
    pub fn open_if_exists(path: impl AsRef<Path>) -> Result<Option<NetNs>> {
        Self::found_at(path.as_ref(), Self::open_checked(path.as_ref(), false)?)
    }

    /// Open a namespace path read back from a record (an element comment, a file of a store):
    /// data, not a path to trust. Only `/run/netns/<name>` and `/var/run/netns/<name>` (`name`
    /// without `/`, not `.` or `..`; a symlink there is not followed) and `/proc/<pid>/ns/net`
    /// (`pid` decimal digits) are opened, with `O_PATH`, and used only when on nsfs and a
    /// network namespace (see [`NetNs::open`]). `Ok(None)`: the namespace recorded there is
    /// gone (nothing there, the process exited, an empty mount point, or something that is no
    /// namespace now). `Err`: cannot tell (a path of another shape, a namespace of another
    /// type, an unexpected error), which callers must treat as "maybe alive".
    pub fn open_recorded(path: &str) -> Result<Option<NetNs>> {
        let refuse = |why: &str| {
            CniError::io(format!("refusing to open recorded network namespace path {path:?}: {why}"))
        };
        let named = ["/run/netns/", "/var/run/netns/"].iter().find_map(|p| path.strip_prefix(p));
        let nofollow = match named {
            Some(name) => {
                if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
                    return Err(refuse("not a namespace name under /run/netns"));
                }
                true
            }
            None => {
                let pid = path.strip_prefix("/proc/").and_then(|r| r.strip_suffix("/ns/net"));
                let digits = pid.is_some_and(|p| {
                    (1..=10).contains(&p.len())
                        && !p.starts_with('0')
                        && p.bytes().all(|b| b.is_ascii_digit())
                });
                if !digits {
                    return Err(refuse(
                        "only /run/netns/<name>, /var/run/netns/<name> and /proc/<pid>/ns/net are opened",
                    ));
                }
                false // the magic link of /proc/<pid>/ns/net must be followed
            }
        };
        Self::found_at(Path::new(path), Self::open_checked(Path::new(path), nofollow)?)
    }

    /// A namespace file another process holds open, looked at through its descriptor's link
    /// in `/proc`: `/proc/<pid>/fd/<n>` or `/proc/<pid>/task/<tid>/fd/<n>` (decimal digits;
    /// any other shape is refused). The link is followed with `O_PATH`, so the file itself is
    /// not opened (a FIFO or a device behind it never is), and it is used only when on nsfs and
    /// a network namespace (see [`NetNs::open`]). `Ok(None)`: the descriptor was closed or its
    /// process is gone, or its file is no network namespace (another filesystem, another
    /// namespace type). `Err`: cannot tell.
    pub fn open_descriptor(path: &str) -> Result<Option<NetNs>> {
        if !descriptor_link(path) {
            return Err(CniError::io(format!(
                "refusing to open {path:?}: only /proc/<pid>/fd/<n> and /proc/<pid>/task/<tid>/fd/<n> are opened"
            )));
        }
        Ok(match Self::open_checked(Path::new(path), false)? {
            Probe::NetNs(ns) => Some(ns),
            Probe::NotANamespace | Probe::Missing | Probe::OtherType => None,
        })
    }

    /// [`Probe::found`] of what was opened at `path`, its error naming the path.
    fn found_at(path: &Path, probe: Probe) -> Result<Option<NetNs>> {
        probe
            .found()
            .map_err(|e| CniError::io(format!("failed to open network namespace {}: {e}", path.display())))
    }

    /// Open what is at `path` with `O_PATH` (optionally not following a symlink there), and
    /// only when it is on nsfs open that very file for real (through
    /// `/proc/thread-self/fd/N`) and classify it.
    fn open_checked(path: &Path, nofollow: bool) -> Result<Probe> {
        let fail = |why: &dyn std::fmt::Display| {
            CniError::io(format!("failed to open network namespace {}: {why}", path.display()))
        };
        let file = match open_o_path(path, nofollow) {
            Ok(f) => f,
            Err(e) if is_gone(&e) => return Ok(Probe::Missing),
            Err(e) => return Err(fail(&e)),
        };
        if !on_nsfs(&file).map_err(|e| fail(&e))? {
            return Ok(Probe::NotANamespace);
        }
        let fd_path = format!("/proc/thread-self/fd/{}", file.as_raw_fd());
        let real = File::open(&fd_path).map_err(|e| fail(&format_args!("reopen through {fd_path}: {e}")))?;
        Self::probe(real, path).map_err(|e| fail(&e))
    }

    /// A handle on the namespace behind an already open namespace file (duplicates the fd).
    pub fn from_fd(fd: BorrowedFd<'_>) -> Result<NetNs> {
        let path = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
        let fail = |why: &dyn std::fmt::Display| {
            CniError::io(format!("failed to use network namespace {}: {why}", path.display()))
        };
        let file = File::from(fd.try_clone_to_owned().map_err(|e| fail(&e))?);
        Self::probe(file, &path)
            .and_then(Probe::found)
            .map_err(|e| fail(&e))?
            .ok_or_else(|| fail(&"not a network namespace (nsfs) file"))
    }

    /// The network namespace of the calling thread.
    ///
    /// Opened directly (the kernel's own link in procfs, not a path anyone else chose: no
    /// `O_PATH` probe first), which spares every `run` a second look-up in `/proc`.
    pub fn current() -> Result<NetNs> {
        let path = Path::new(THREAD_NETNS);
        let fail = |why: &dyn std::fmt::Display| {
            CniError::io(format!("failed to open network namespace {THREAD_NETNS}: {why}"))
        };
        let file = File::open(path).map_err(|e| fail(&e))?;
        Self::probe(file, path)
            .and_then(Probe::found)
            .map_err(|e| fail(&e))?
            .ok_or_else(|| fail(&"not on nsfs"))
    }

    /// The network namespace a socket belongs to (the one it was created in), as the kernel
    /// reports it (`SIOCGSKNS`, Linux 4.9; needs `CAP_NET_ADMIN` over the namespace).
    pub fn of_socket(sock: BorrowedFd<'_>) -> Result<NetNs> {
        let path = PathBuf::from(format!("network namespace of socket {}", sock.as_raw_fd()));
        let fail = |why: &dyn std::fmt::Display| {
            CniError::io(format!("failed to open the {}: {why}", path.display()))
        };
        // SAFETY: SIOCGSKNS takes no argument, only reads the fd (kept open by `sock`) and
        // returns a new fd that we own from here on.
        let fd = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGSKNS as _) };
        if fd < 0 {
            return Err(fail(&io::Error::last_os_error()));
        }
        // SAFETY: `fd` is a fresh descriptor nobody else owns.
        let file = File::from(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) });
        Self::probe(file, &path)
            .and_then(Probe::found)
            .map_err(|e| fail(&e))?
            .ok_or_else(|| fail(&"not a network namespace (nsfs) file"))
    }

    /// A second handle on the same namespace (the descriptor duplicated).
    pub fn try_clone(&self) -> Result<NetNs> {
        let file = self.file.try_clone().map_err(|e| {
            CniError::io(format!(
                "failed to duplicate the handle of network namespace {}: {e}",
                self.path.display()
            ))
        })?;
        Ok(NetNs { file, path: self.path.clone(), id: self.id })
    }

    /// Classify an open (not `O_PATH`) file: a network namespace, a namespace of another type
    /// (mount, uts, …) or some other file.
    fn probe(file: File, path: &Path) -> io::Result<Probe> {
        if !on_nsfs(&file)? {
            return Ok(Probe::NotANamespace);
        }
        // Ask the kernel which kind of namespace this is (NS_GET_NSTYPE, Linux 4.11; ENOTTY
        // before, when setns() still refuses another type with EINVAL).
        //
        // SAFETY: NS_GET_NSTYPE takes no argument and only reads the fd, which `file` keeps open.
        let nstype = unsafe { libc::ioctl(file.as_raw_fd(), libc::NS_GET_NSTYPE) };
        if nstype >= 0 && nstype != libc::CLONE_NEWNET {
            return Ok(Probe::OtherType);
        }
        let meta = file.metadata()?;
        Ok(Probe::NetNs(NetNs { id: (meta.dev(), meta.ino()), file, path: path.to_path_buf() }))
    }

    /// The path this handle was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether both handles refer to the same namespace (same nsfs device and inode).
    pub fn same_as(&self, other: &NetNs) -> bool {
        self.id == other.id
    }

    /// Run `f` with the calling thread inside this namespace, then return to the namespace the
    /// thread was in before, whether `f` succeeds, fails or panics. Nesting works: each level
    /// remembers and restores its own origin.
    ///
    /// If the thread cannot be moved back, the process **aborts** (after a message on stderr).
    /// A thread stranded in the wrong namespace would apply every later step — host-side veth
    /// and bridge changes, sysctls, firewall rules, DEL cleanup — to the container's namespace,
    /// or the other way round. An error return cannot be trusted to stop that (callers collect
    /// errors and keep going on DEL), and unwinding does not change the thread's namespace, so
    /// ending the process is the only safe outcome. It needs a kernel failure to happen: the
    /// origin namespace is held open by this function, and we had the privilege to leave it.
    pub fn run<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let origin = NetNs::current().map_err(|e| e.context("remember the current network namespace"))?;
        if origin.same_as(self) {
            return f();
        }
        setns(&self.file, CloneFlags::CLONE_NEWNET).map_err(|e| {
            CniError::io(format!("failed to enter network namespace {}: {}", self.path.display(), e.desc()))
        })?;
        let _back = ReturnTo(origin);
        f()
    }
}

impl AsFd for NetNs {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

/// Moves the thread back into the namespace it holds when dropped (also while unwinding).
struct ReturnTo(NetNs);

impl Drop for ReturnTo {
    fn drop(&mut self) {
        if let Err(e) = setns(&self.0.file, CloneFlags::CLONE_NEWNET) {
            // See NetNs::run for why continuing is not an option.
            crate::log!(
                "",
                "fatal: cannot return to network namespace {}: {}; aborting so that nothing \
                 runs in the wrong namespace",
                self.0.path.display(),
                e.desc()
            );
            std::process::abort();
        }
    }
}

/// Helpers for tests that need root: private namespaces for the test thread.
#[cfg(test)]
pub(crate) mod test_support {
    use super::NetNs;
    use nix::sched::{unshare, CloneFlags};

    /// Move the calling test thread into a new, empty network namespace. libtest runs each test
    /// on its own thread, so the namespace is private to the test and the machine's interfaces
    /// are never touched. Panics (fails the test) when that is impossible: these tests must run
    /// as root and must never pass by skipping.
    pub(crate) fn private_netns() {
        if let Err(e) = unshare(CloneFlags::CLONE_NEWNET) {
            panic!(
                "unshare(CLONE_NEWNET) failed: {}; kernel tests need root (CAP_SYS_ADMIN) \
                 and namespace support",
                e.desc()
            );
        }
    }

    /// A second, unrelated network namespace, created on a helper thread. The returned handle
    /// keeps it alive after that thread has ended.
    pub(crate) fn spare_netns() -> NetNs {
        std::thread::spawn(|| {
            private_netns();
            NetNs::current().expect("open the helper thread's netns")
        })
        .join()
        .expect("helper thread creating a netns panicked")
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::{private_netns, spare_netns};
    use super::*;
    use crate::code;

    #[test]
    fn open_missing_path_is_io_error_naming_path() {
        let e = NetNs::open("/nonexistent/cni-test-netns").unwrap_err();
        assert_eq!(e.code, code::IO);
        assert!(e.msg.contains("/nonexistent/cni-test-netns"), "{}", e.msg);
        assert!(NetNs::open_if_exists("/nonexistent/cni-test-netns").unwrap().is_none());
    }

    #[test]
    fn regular_file_is_not_a_netns() {
        // What a /run/netns/<name> mount point looks like after the bind mount is gone.
        let path = std::env::temp_dir().join(format!("cni-netns-test-{}", std::process::id()));
        std::fs::write(&path, b"").unwrap();
        let gone = NetNs::open_if_exists(&path).unwrap();
        let err = NetNs::open(&path).unwrap_err();
        std::fs::remove_file(&path).unwrap();
        assert!(gone.is_none());
        assert_eq!(err.code, code::IO);
        assert!(err.msg.contains("not a network namespace"), "{}", err.msg);
    }

    /// A scratch directory removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(what: &str) -> Scratch {
            let p = std::env::temp_dir().join(format!("cni-netns-{what}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            Scratch(p)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn mkfifo(p: &Path) {
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo {}", p.display());
    }

    /// Files that must be refused without being opened for real: a FIFO (an open would block
    /// until a writer comes), a directory, a regular file, /dev/null, symlinks to each. Every
    /// call returns (a hang fails the test by the runner's timeout).
    #[test]
    fn what_is_not_a_namespace_is_never_opened() {
        let d = Scratch::new("hostile");
        let fifo = d.0.join("fifo");
        mkfifo(&fifo);
        let file = d.0.join("file");
        std::fs::write(&file, b"").unwrap();
        let mut paths = vec![fifo.clone(), file.clone(), d.0.clone(), PathBuf::from("/dev/null")];
        for (i, target) in paths.clone().iter().enumerate() {
            let link = d.0.join(format!("link{i}"));
            std::os::unix::fs::symlink(target, &link).unwrap();
            paths.push(link);
        }
        for p in &paths {
            assert!(NetNs::open_if_exists(p).unwrap().is_none(), "{}", p.display());
            let e = NetNs::open(p).unwrap_err();
            assert_eq!(e.code, code::IO);
            assert!(e.msg.contains("not a network namespace"), "{}: {}", p.display(), e.msg);
        }
        // A dangling symlink is a missing namespace.
        let dangling = d.0.join("dangling");
        std::os::unix::fs::symlink(d.0.join("nothing"), &dangling).unwrap();
        assert!(NetNs::open_if_exists(&dangling).unwrap().is_none());
        assert!(NetNs::open(&dangling).unwrap_err().msg.contains("No such file"));
    }

    #[test]
    fn recorded_paths_of_other_shapes_are_refused() {
        for bad in [
            "/etc/passwd",
            "",
            "run/netns/x",
            "/run/netns/",
            "/run/netns/.",
            "/run/netns/..",
            "/run/netns/../../etc/passwd",
            "/run/netns/a/b",
            "/var/run/netns/",
            "/run/netnsx",
            "/run//netns/x",
            "/proc/self/ns/net",
            "/proc/thread-self/ns/net",
            "/proc/01/ns/net",
            "/proc//ns/net",
            "/proc/1/ns/uts",
            "/proc/1/ns/net/",
            "/proc/1/../1/ns/net",
            "/proc/12345678901/ns/net",
            "/proc/-1/ns/net",
            "/tmp/fifo",
        ] {
            let e = NetNs::open_recorded(bad).unwrap_err();
            assert_eq!(e.code, code::IO, "{bad:?}");
            assert!(e.msg.contains("refusing to open recorded network namespace path"), "{bad:?}: {}", e.msg);
        }
    }

    #[test]
    fn recorded_paths_that_are_gone() {
        let pid = std::process::id();
        for gone in [
            format!("/run/netns/cni-no-such-ns-{pid}"),
            format!("/var/run/netns/cni-no-such-ns-{pid}"),
            // beyond pid_max (at most 2^22): never a process
            "/proc/4999999999/ns/net".to_string(),
        ] {
            assert!(NetNs::open_recorded(&gone).unwrap().is_none(), "{gone}");
        }
        let mine = NetNs::open_recorded(&format!("/proc/{pid}/ns/net")).unwrap().expect("our own netns");
        // The process's (main thread's) namespace; this test thread has not left it.
        assert!(mine.same_as(&NetNs::current().unwrap()));
    }

    /// A named namespace in /run/netns (root): found; a symlink to it, a FIFO and a regular
    /// file under the same prefix are not followed or opened and count as gone.
    #[test]
    fn recorded_named_namespaces_are_opened_without_following_links() {
        struct Named(String);
        impl Drop for Named {
            fn drop(&mut self) {
                let _ = std::process::Command::new("ip").args(["netns", "del", &self.0]).status();
                for extra in ["link", "fifo", "file"] {
                    let _ = std::fs::remove_file(format!("/run/netns/{}-{extra}", self.0));
                }
            }
        }
        let n = Named(format!("cni-rec-{}", std::process::id()));
        let st = std::process::Command::new("ip").args(["netns", "add", &n.0]).status().expect("run ip");
        assert!(st.success(), "ip netns add {} failed: this test needs root and iproute2", n.0);
        let path = format!("/run/netns/{}", n.0);
        let ns = NetNs::open_recorded(&path).unwrap().expect("the named namespace");
        assert!(ns.same_as(&NetNs::open(&path).unwrap()));
        assert!(!ns.same_as(&NetNs::current().unwrap()));
        let via_var = NetNs::open_recorded(&format!("/var/run/netns/{}", n.0)).unwrap();
        assert!(via_var.expect("same namespace through /var/run").same_as(&ns));

        let link = format!("{path}-link");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(NetNs::open_if_exists(&link).unwrap().is_some(), "CNI_NETNS may be a symlink");
        assert!(NetNs::open_recorded(&link).unwrap().is_none(), "a recorded path's symlink is not followed");
        let fifo = PathBuf::from(format!("{path}-fifo"));
        mkfifo(&fifo);
        assert!(NetNs::open_recorded(fifo.to_str().unwrap()).unwrap().is_none());
        let file = format!("{path}-file");
        std::fs::write(&file, b"").unwrap();
        assert!(NetNs::open_recorded(&file).unwrap().is_none());
    }

    /// What a process holds open, looked at through its descriptors' links: our own network
    /// namespace is found; a FIFO (never opened, so no wait for a writer), a regular file, a
    /// namespace of another type and a closed descriptor are no network namespace; links of
    /// other shapes are refused.
    #[test]
    fn namespaces_held_by_descriptors() {
        use std::os::fd::AsRawFd;
        let pid = std::process::id();
        let link = |f: &dyn AsRawFd| format!("/proc/{pid}/fd/{}", f.as_raw_fd());
        let net = File::open("/proc/thread-self/ns/net").unwrap();
        let found = NetNs::open_descriptor(&link(&net)).unwrap().expect("our network namespace");
        assert!(found.same_as(&NetNs::current().unwrap()));
        // `<pid>/task/<tid>`
        let task = std::fs::read_link("/proc/thread-self").unwrap();
        let via_task = format!("/proc/{}/fd/{}", task.display(), net.as_raw_fd());
        assert!(via_task.starts_with(&format!("/proc/{pid}/task/")), "{via_task}");
        assert!(NetNs::open_descriptor(&via_task).unwrap().expect("through the thread").same_as(&found));

        let d = Scratch::new("descriptors");
        let fifo = d.0.join("fifo");
        mkfifo(&fifo);
        // held without being opened (an open would wait for a writer)
        let held_fifo = open_o_path(&fifo, true).unwrap();
        assert!(NetNs::open_descriptor(&link(&held_fifo)).unwrap().is_none(), "a FIFO");
        let file = File::create(d.0.join("file")).unwrap();
        assert!(NetNs::open_descriptor(&link(&file)).unwrap().is_none(), "a regular file");
        let uts = File::open("/proc/thread-self/ns/uts").unwrap();
        assert!(NetNs::open_descriptor(&link(&uts)).unwrap().is_none(), "a namespace of another type");
        let closed = link(&net);
        drop(net);
        drop(found);
        assert!(NetNs::open_descriptor(&closed).unwrap().is_none(), "a closed descriptor");

        for bad in [
            "/proc/self/fd/0",
            "/proc/thread-self/fd/0",
            "/proc/1/fd/",
            "/proc/1/fd/x",
            "/proc/1/ns/net",
            "/proc/1/fd/0/",
            "/proc/1/task/1/fd",
            "/proc/1/../1/fd/0",
            "/run/netns/x",
            "",
        ] {
            let e = NetNs::open_descriptor(bad).unwrap_err();
            assert!(e.msg.contains("refusing to open"), "{bad:?}: {}", e.msg);
        }
    }

    #[test]
    fn other_namespace_types_are_rejected() {
        let e = NetNs::open("/proc/thread-self/ns/uts").unwrap_err();
        assert!(e.msg.contains("not a network namespace"), "{}", e.msg);
        assert!(NetNs::open_if_exists("/proc/thread-self/ns/uts").is_err());
    }

    #[test]
    fn current_is_same_as_itself() {
        let a = NetNs::current().unwrap();
        let b = NetNs::open("/proc/thread-self/ns/net").unwrap();
        assert!(a.same_as(&b));
        assert!(a.try_clone().unwrap().same_as(&b));
    }

    #[test]
    fn another_netns_is_not_the_current_one() {
        private_netns();
        let other = spare_netns();
        // The handle's own path named the helper thread's /proc/thread-self; reach the same
        // namespace through the open fd instead.
        let fd_path = format!("/proc/self/fd/{}", other.as_fd().as_raw_fd());
        let again = NetNs::open(&fd_path).unwrap();
        assert!(again.same_as(&other));
        assert!(!again.same_as(&NetNs::current().unwrap()));
        assert!(!NetNs::from_fd(other.as_fd()).unwrap().same_as(&NetNs::current().unwrap()));
    }

    #[test]
    fn a_socket_belongs_to_the_namespace_it_was_created_in() {
        private_netns();
        let home = NetNs::current().unwrap();
        let other = spare_netns();
        let there = other.run(|| Ok(std::net::UdpSocket::bind("0.0.0.0:0").unwrap())).unwrap();
        let here = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        assert!(NetNs::of_socket(there.as_fd()).unwrap().same_as(&other));
        assert!(NetNs::of_socket(here.as_fd()).unwrap().same_as(&home));
    }

    #[test]
    fn run_enters_and_returns_even_on_error_and_panic() {
        private_netns();
        let home = NetNs::current().unwrap();
        let other = spare_netns();
        assert!(!home.same_as(&other));

        let inside = other.run(|| Ok(NetNs::current()?.same_as(&other))).unwrap();
        assert!(inside, "closure did not run inside the target netns");
        assert!(NetNs::current().unwrap().same_as(&home));

        let r: Result<()> = other.run(|| Err(CniError::internal("boom")));
        assert_eq!(r.unwrap_err().msg, "boom");
        assert!(NetNs::current().unwrap().same_as(&home), "not back after error");

        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _: Result<()> = other.run(|| panic!("inside"));
        }));
        assert!(caught.is_err());
        assert!(NetNs::current().unwrap().same_as(&home), "not back after panic");
    }

    #[test]
    fn run_nests() {
        private_netns();
        let home = NetNs::current().unwrap();
        let a = spare_netns();
        let b = spare_netns();
        a.run(|| {
            assert!(NetNs::current()?.same_as(&a));
            b.run(|| {
                assert!(NetNs::current()?.same_as(&b));
                // Re-entering the namespace we are already in is a no-op.
                b.run(|| {
                    assert!(NetNs::current()?.same_as(&b));
                    Ok(())
                })
            })?;
            assert!(NetNs::current()?.same_as(&a), "inner run did not return to a");
            Ok(())
        })
        .unwrap();
        assert!(NetNs::current().unwrap().same_as(&home));
    }
}
