//! Telling a reservation whose pod is provably gone from one that may be alive.
//!
//! ADD records the attachment's network namespace ([`capture`]): the CNI_NETNS path, the
//! namespace's nsfs inode and netns cookie (never reused while the kernel runs), and the boot
//! id. A reservation is **dead** when
//! - it was recorded in an earlier boot (no network namespace survives a reboot), or
//! - its recorded path no longer leads to the recorded namespace (gone, or another namespace
//!   mounted under the same name), **and** nothing else holds that namespace: no thread of any
//!   process is in it, no nsfs bind mount of it exists in any mount namespace that has a
//!   process, and no process holds it open (a descriptor in `/proc/<pid>/fd`, or in the table
//!   of a thread that has its own: a `net:[<ino>]` link, or a link showing a path whose
//!   `fdinfo` names the inode, and whose file, looked at through the link with `O_PATH`, is
//!   that very namespace: inode numbers are handed out lowest-free-first, so a namespace made
//!   after the recorded one was freed often has its number, and tests and agents keep their
//!   namespaces open). A mount in another mount namespace is looked at through a process of
//!   that namespace ([`open_foreign_mount`]: its root, the mount point without symbolic links,
//!   and only when what is reached is that very mount, by its id): runtimes pin sandboxes in
//!   mount namespaces of their own, and a mount made under `/run/netns` later propagates into
//!   every mount namespace that is a slave of the node's, so a namespace that got a dead pod's
//!   number is often mounted there. A mount or descriptor whose identity cannot be confirmed
//!   (the process gone, the mount point not leading to that mount, a descriptor that cannot be
//!   looked at) counts as holding it, and so does a scan that cannot be made (`/proc`
//!   unreadable, an unexpected error, more than 2^20 descriptors). Processes even root may not
//!   look at (`EACCES`, `EPERM`) are not seen.
//!
//! Everything else is alive: a reservation without a record (made by upstream or by an older
//! build), a record that no longer belongs to the reservation file, any error.
//!
//! Cost: nothing of this runs on an ordinary ADD. The scans run only when a reservation is
//! judged (an exhausted pool, a restarted container's earlier reservation, STATUS with
//! `reportExhaustionInStatus` on an exhausted set), at most once per call; descriptors are
//! read only for a namespace no thread or mount holds.
//!
//! Every path read back from a record or from `/proc` is opened through
//! `NetNs::open_recorded` (only `/run/netns/<name>`, `/var/run/netns/<name>` and
//! `/proc/<pid>/ns/net`, with `O_PATH` and checked to be nsfs before use) and nowhere else.

use crate::record::{recordable, Record};
use cni_common::fsread::read_capped;
use cni_common::netns::NetNs;
use cni_common::nsident::{ident, NsIdent};

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};

/// What ADD records for CNI_NETNS: its identity and its path (empty when the path cannot be
/// recorded). `None` when the namespace cannot be looked at (nothing is recorded then, and the
/// reservation counts as live for ever, as one made by upstream).
pub fn capture(netns: &str) -> Option<(NsIdent, String)> {
    let ns = NetNs::open(netns).ok()?;
    let id = ident(&ns).ok()?;
    Some((id, if recordable(netns) { netns.to_string() } else { String::new() }))
}

/// Judges records, scanning the node's processes and mounts at most once.
pub struct Judge {
    boot: Option<[u8; 16]>,
    refs: Option<Refs>,
}

impl Judge {
    /// `boot`: this boot's id; `None` when it cannot be read, and then nothing is judged gone.
    pub fn new(boot: Option<[u8; 16]>) -> Judge {
        Judge { boot, refs: None }
    }

    /// `Some(why)` when the attachment `rec` was made for is provably gone.
    pub fn gone(&mut self, rec: &Record) -> Option<String> {
        // Unknown is alive: without this boot's id (or with a record that names no boot) no
        // judgment is proof.
        let boot = self.boot?;
        if rec.boot == [0; 16] {
            return None;
        }
        if rec.boot != boot {
            return Some("it was made before the last reboot".into());
        }
        let at_path = if rec.path.is_empty() {
            "its network namespace path was not recorded".to_string()
        } else {
            match NetNs::open_recorded(&rec.path) {
                Ok(Some(ns)) => match ident(&ns) {
                    Ok(now) if !now.differs(&rec.ns) => return None, // alive where it was
                    Ok(_) => format!("its network namespace {} is another namespace now", rec.path),
                    Err(_) => return None,
                },
                Ok(None) => format!("its network namespace {} no longer exists", rec.path),
                // A path we do not open: the scan below still finds a mount or a process.
                Err(_) => format!("its network namespace {} is not visible", rec.path),
            }
        };
        let refs = self.refs.get_or_insert_with(Refs::scan);
        if refs.holds(rec.ns) {
            return None;
        }
        Some(format!("{at_path} and no process, mount or open descriptor holds it"))
    }
}

/// `Some(why)` when a DEL naming `del_netns` is certainly not for the attachment `rec` was
/// made for: that attachment's namespace is alive where it was recorded and DEL names another
/// namespace (a late DEL of an earlier incarnation with the same container id and interface).
/// Any doubt: `None` (the DEL goes ahead).
pub fn not_for_holder(rec: &Record, boot: Option<[u8; 16]>, del_netns: &str) -> Option<String> {
    if del_netns.is_empty() || del_netns == rec.path || rec.path.is_empty() || Some(rec.boot) != boot {
        return None;
    }
    let holder = ident(&NetNs::open_recorded(&rec.path).ok()??).ok()?;
    if holder.differs(&rec.ns) {
        return None;
    }
    match NetNs::open_recorded(del_netns) {
        Ok(Some(ns)) if !ident(&ns).ok()?.differs(&holder) => return None,
        Ok(_) => {}
        Err(_) => return None,
    }
    Some(format!(
        "DEL names network namespace {del_netns}, but the address is held for this container and \
         interface by the live network namespace {}",
        rec.path
    ))
}

/// Who holds network namespaces, by nsfs inode: threads, nsfs bind mounts (in our mount
/// namespace with their mount point; in another one without) and, looked at only when neither
/// holds the namespace asked about, open descriptors.
#[derive(Default)]
struct Refs {
    /// Why nothing can be told (`/proc` or our own mount table could not be read, or a thread
    /// or mount table could not be looked at for another reason than [`out_of_sight`]): every
    /// namespace counts as held.
    blind: Option<String>,
    tasks: HashMap<u64, Vec<u32>>,
    mounts: HashMap<u64, Vec<Mount>>,
    /// Namespaces open descriptors may hold ([`fd_holders`]); `None` until first needed.
    fds: Option<std::result::Result<HashMap<u64, Vec<Holder>>, String>>,
}

/// An nsfs mount of a network namespace, as the scan found it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Mount {
    /// In our own mount namespace, at this mount point; `group`: its peer group when shared.
    Own { point: String, group: Option<u64> },
    /// In another mount namespace, seen in the mount table of process `pid`: the mount's id,
    /// its mount point (relative to that process's root) and, when it is a slave, the peer
    /// group it receives propagation from.
    Foreign { pid: u32, id: u64, point: String, master: Option<u64> },
}

/// One nsfs mount of a network namespace in a mountinfo text.
#[derive(Debug, PartialEq, Eq)]
struct NsfsMount {
    id: u64,
    ino: u64,
    point: String,
    /// `shared:N`: the peer group of a shared mount.
    shared: Option<u64>,
    /// `master:N`: the peer group a slave mount receives propagation from.
    master: Option<u64>,
}

/// The inode in a `net:[<ino>]` link or mountinfo root.
fn net_ino(s: &str) -> Option<u64> {
    s.strip_prefix("net:[")?.strip_suffix(']')?.parse().ok()
}

/// The numeric entries of a `/proc` directory (processes, threads).
fn numeric_entries(dir: &Path) -> io::Result<Vec<u32>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        if let Some(n) = e?.file_name().to_str().and_then(|n| n.parse().ok()) {
            out.push(n);
        }
    }
    Ok(out)
}

/// Whether an error met under `/proc/<pid>` means that the process, thread or descriptor
/// went away meanwhile (nothing to hold anything any more), or that the process may not be
/// looked at (`EACCES`, `EPERM`: even root is refused a process of a user namespace it does
/// not own, or by a security module). The latter cannot be told from one that holds nothing:
/// such a process is not seen (README, "Known limits"), as it never was by the thread and mount
/// scans; treating it as holding everything would end every reclaim on such a node.
fn out_of_sight(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ESRCH | libc::EACCES | libc::EPERM))
}

/// `/proc/<pid>/mountinfo` is generated by the kernel; this bounds it anyway.
const MOUNTINFO_CAP: u64 = 64 << 20;

/// The most descriptors one scan looks at ([`fd_holders`]): beyond it the scan cannot tell,
/// and the namespace counts as held. (A few seconds at most.)
const FD_LINKS_CAP: usize = 1 << 20;

/// The most of one `fdinfo` read: a path's is a few lines (position, flags, mount, inode, locks).
const FDINFO_CAP: u64 = 64 << 10;

/// `kcmp`'s type for descriptor tables (`linux/kcmp.h`; the libc crate does not name it).
const KCMP_FILES: libc::c_int = 2;

/// Whether threads `a` and `b` share one descriptor table (`kcmp`, Linux 3.5).
fn same_fd_table(a: u32, b: u32) -> io::Result<bool> {
    let (a, b) = (a as libc::pid_t, b as libc::pid_t);
    // SAFETY: kcmp takes integers only and reads no memory of ours.
    let r =
        unsafe { libc::syscall(libc::SYS_kcmp, a, b, KCMP_FILES, 0 as libc::c_ulong, 0 as libc::c_ulong) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r == 0)
}

/// What a descriptor's link in `/proc/<pid>/fd` says about the file.
#[derive(Debug, PartialEq, Eq)]
enum FdTarget {
    /// `net:[<ino>]`: a network namespace file opened through nsfs itself (`/proc/…/ns/net`).
    Net(u64),
    /// A path: any file reached through a mount, a namespace file opened through its bind mount
    /// among them (the link shows the mount point, and `/` once the mount is detached).
    Path,
    /// `socket:[…]`, `pipe:[…]`, `anon_inode:…`, another namespace type: no network namespace.
    Other,
}

fn fd_target(link: &[u8]) -> FdTarget {
    if link.starts_with(b"/") {
        return FdTarget::Path;
    }
    match std::str::from_utf8(link).ok().and_then(net_ino) {
        Some(ino) => FdTarget::Net(ino),
        None => FdTarget::Other,
    }
}

/// The `ino:` of a `/proc/<pid>/fdinfo/<fd>` text (Linux 5.14 and later).
fn fdinfo_ino(text: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix("ino:")).and_then(|v| v.trim().parse().ok())
}

/// A descriptor that may hold a namespace: the process or thread whose table has it, and its
/// link in `/proc` (through which [`Refs::holds`] looks at the file).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Holder {
    who: u32,
    link: PathBuf,
}

/// Add what the descriptors in directory `dir` (`…/fd` of process or thread `who`) may hold to
/// `out`, by inode, looking at most `budget` descriptors. Each link is read (`readlink`); for
/// one that shows a path, the inode number comes from the descriptor's `fdinfo` (its file
/// could be a namespace file opened through a bind mount). The descriptor's file itself is not
/// opened or looked up here. A path's inode may belong to any filesystem, a `net:[…]` one to a
/// later namespace that got the number: only a candidate, which [`Refs::holds`] confirms.
fn scan_fd_dir(
    dir: &Path,
    who: u32,
    out: &mut HashMap<u64, Vec<Holder>>,
    budget: &mut usize,
) -> std::result::Result<(), String> {
    use std::os::unix::ffi::OsStrExt;
    let cannot = |p: &Path, e: &dyn std::fmt::Display| format!("cannot read {}: {e}", p.display());
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if out_of_sight(&e) => return Ok(()),
        Err(e) => return Err(cannot(dir, &e)),
    };
    let info_dir = dir.with_file_name("fdinfo");
    for ent in rd {
        let ent = match ent {
            Ok(ent) => ent,
            Err(e) if out_of_sight(&e) => return Ok(()),
            Err(e) => return Err(cannot(dir, &e)),
        };
        let Some(left) = budget.checked_sub(1) else {
            return Err("more open descriptors than one scan looks at".into());
        };
        *budget = left;
        let link = match std::fs::read_link(ent.path()) {
            Ok(link) => link,
            Err(e) if out_of_sight(&e) => continue, // closed meanwhile (or not to be looked at)
            Err(e) => return Err(cannot(&ent.path(), &e)),
        };
        let ino = match fd_target(link.as_os_str().as_bytes()) {
            FdTarget::Net(ino) => ino,
            FdTarget::Other => continue,
            FdTarget::Path => {
                let info = info_dir.join(ent.file_name());
                let text = match std::fs::File::open(&info).and_then(|mut f| read_capped(&mut f, FDINFO_CAP))
                {
                    Ok(b) => String::from_utf8_lossy(&b).into_owned(),
                    Err(e) if out_of_sight(&e) => continue,
                    Err(e) => return Err(cannot(&info, &e)),
                };
                match fdinfo_ino(&text) {
                    Some(ino) => ino,
                    None => return Err(cannot(&info, &"no inode number in it (Linux before 5.14)")),
                }
            }
        };
        out.entry(ino).or_default().push(Holder { who, link: ent.path() });
    }
    Ok(())
}

/// The network namespaces open descriptors may hold, by inode, with the processes (or
/// threads) holding them: every descriptor in `<proc>/<pid>/fd` ([`scan_fd_dir`]), and in
/// `<proc>/<pid>/task/<tid>/fd` for a thread with a descriptor table of its own (`unshare
/// (CLONE_FILES)`; `kcmp` tells, and when it cannot, the thread's table is read too). Processes,
/// threads and descriptors that go away meanwhile are skipped. `Err(why)`: cannot tell
/// (`proc`, a descriptor directory or an `fdinfo` cannot be read, more than `cap`
/// descriptors).
fn fd_holders(proc: &Path, cap: usize) -> std::result::Result<HashMap<u64, Vec<Holder>>, String> {
    let mut out = HashMap::new();
    let mut budget = cap;
    let pids = numeric_entries(proc).map_err(|e| format!("cannot read {}: {e}", proc.display()))?;
    for pid in pids {
        process_fd_holders(proc, pid, &mut out, &mut budget)?;
    }
    Ok(out)
}

/// [`fd_holders`] of one process: its descriptor table, and those of its threads that have
/// one of their own.
fn process_fd_holders(
    proc: &Path,
    pid: u32,
    out: &mut HashMap<u64, Vec<Holder>>,
    budget: &mut usize,
) -> std::result::Result<(), String> {
    let base = proc.join(pid.to_string());
    scan_fd_dir(&base.join("fd"), pid, out, budget)?;
    let tids = match numeric_entries(&base.join("task")) {
        Ok(t) => t,
        Err(e) if out_of_sight(&e) => return Ok(()),
        Err(e) => return Err(format!("cannot read {}: {e}", base.join("task").display())),
    };
    for tid in tids.into_iter().filter(|t| *t != pid) {
        match same_fd_table(pid, tid) {
            Ok(true) => {}
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
            _ => scan_fd_dir(&base.join(format!("task/{tid}/fd")), tid, out, budget)?,
        }
    }
    Ok(())
}

/// Undo mountinfo's octal escapes (`\040` for a space, …).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// nsfs mounts of network namespaces in a mountinfo text.
fn nsfs_mounts(text: &str) -> Vec<NsfsMount> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some((left, right)) = line.split_once(" - ") else { continue };
        if right.split(' ').next() != Some("nsfs") {
            continue;
        }
        let f: Vec<&str> = left.split(' ').collect();
        if let (Some(id), Some(root), Some(point)) = (f.first(), f.get(3), f.get(4)) {
            if let (Ok(id), Some(ino)) = (id.parse(), net_ino(root)) {
                // the optional fields, after the mount options
                let tag = |t: &str| f.iter().skip(6).find_map(|x| x.strip_prefix(t)?.parse().ok());
                let (shared, master) = (tag("shared:"), tag("master:"));
                out.push(NsfsMount { id, ino, point: unescape(point), shared, master });
            }
        }
    }
    out
}

fn read_mounts(path: &str) -> io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    Ok(String::from_utf8_lossy(&read_capped(&mut f, MOUNTINFO_CAP)?).into_owned())
}

/// The namespace mounted at `point` in the mount namespace of process `pid`, when what is
/// there is the mount `mnt` (its id in that process's mount table). The point is resolved
/// inside the process's root (`/proc/<pid>/root`) with `O_PATH`, following no symbolic link
/// (magic ones included), and used only when `statx` says it is the very mount the table
/// listed and it is on nsfs. `Ok(None)`: not a network namespace. `Err`: cannot tell (the
/// process is gone, the path leads elsewhere or nowhere, the mount was replaced), which
/// [`confirms`] counts as holding.
fn open_foreign_mount(pid: u32, mnt: u64, point: &str) -> cni_common::Result<Option<NetNs>> {
    use std::ffi::CString;
    use std::fs::File;
    use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
    let cannot = |why: &dyn std::fmt::Display| {
        cni_common::CniError::io(format!("cannot look at mount {mnt} at {point:?} of process {pid}: {why}"))
    };
    let root = nix::fcntl::open(
        format!("/proc/{pid}/root").as_str(),
        nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_DIRECTORY,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| cannot(&e.desc()))?;
    let path = CString::new(point).map_err(|e| cannot(&e))?;
    // SAFETY: open_how is plain data; all-zero is valid and its fields are set below.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_PATH | libc::O_CLOEXEC | libc::O_NOFOLLOW) as u64;
    how.resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: openat2 reads the path and `how` (its size passed), which outlive the call, and
    // returns a new descriptor or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root.as_raw_fd(),
            path.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(cannot(&io::Error::last_os_error()));
    }
    // SAFETY: a fresh descriptor nobody else owns.
    let file = File::from(unsafe { OwnedFd::from_raw_fd(fd as i32) });
    // SAFETY: statx writes at most one `statx` into `stx`, which lives across the call; the
    // empty path with AT_EMPTY_PATH names `file` itself.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let rc = unsafe {
        libc::statx(file.as_raw_fd(), c"".as_ptr(), libc::AT_EMPTY_PATH, libc::STATX_MNT_ID, &mut stx)
    };
    if rc != 0 {
        return Err(cannot(&io::Error::last_os_error()));
    }
    if stx.stx_mask & libc::STATX_MNT_ID == 0 || stx.stx_mnt_id != mnt {
        return Err(cannot(&"the mount point leads to another mount now"));
    }
    let magic = nix::sys::statfs::fstatfs(&file).map_err(|e| cannot(&e.desc()))?;
    if magic.filesystem_type() != nix::sys::statfs::NSFS_MAGIC {
        return Ok(None);
    }
    let real = File::open(format!("/proc/thread-self/fd/{}", file.as_raw_fd())).map_err(|e| cannot(&e))?;
    match NetNs::from_fd(real.as_fd()) {
        Ok(ns) => Ok(Some(ns)),
        Err(e) => Err(cannot(&e.msg)),
    }
}

/// Whether a mount of another mount namespace that cannot be reached by its path (a slave copy
/// under a mount made over `/run` there, as a sandbox does) holds `id`, judged by the mount of
/// ours it was copied from: a slave of the peer group `master`, of which one of our `mounts`
/// (same inode number) is a member, is a clone of that mount (propagation copies the mount,
/// and every mount of a peer group and its slaves has the same root: the same namespace). Held
/// unless that mount of ours is there and certainly another namespace.
fn propagated_copy_holds(mounts: &[Mount], master: Option<u64>, id: NsIdent) -> bool {
    let Some(group) = master else { return true };
    let ours = mounts.iter().find_map(|m| match m {
        Mount::Own { point, group: Some(g) } if *g == group => Some(point),
        _ => None,
    });
    match ours.map(|p| NetNs::open_recorded(p)) {
        Some(Ok(Some(ns))) => ident(&ns).map_or(true, |now| !now.differs(&id)),
        _ => true,
    }
}

/// Whether what was opened to confirm a holder is the namespace `id`: a namespace whose
/// identity (inode and cookie) is `id`'s, or one that cannot be told (counts as held). Gone
/// meanwhile, or not a network namespace: no.
fn confirms(opened: cni_common::Result<Option<NetNs>>, id: NsIdent) -> bool {
    match opened {
        Ok(Some(ns)) => ident(&ns).map_or(true, |now| !now.differs(&id)),
        Ok(None) => false,
        Err(_) => true,
    }
}

impl Refs {
    fn scan() -> Refs {
        let mut refs = Refs::default();
        if let Err(why) = refs.scan_tasks_and_mounts() {
            refs.blind = Some(why);
        }
        refs
    }

    /// Threads and mounts. `Err(why)`: cannot tell.
    fn scan_tasks_and_mounts(&mut self) -> std::result::Result<(), String> {
        let fail = |what: &str, e: io::Error| format!("cannot read {what}: {e}");
        let own_mnt = std::fs::read_link("/proc/self/ns/mnt").map_err(|e| fail("/proc/self/ns/mnt", e))?;
        let mut mnt_seen = vec![own_mnt.clone()];
        let own = read_mounts("/proc/self/mountinfo").map_err(|e| fail("/proc/self/mountinfo", e))?;
        for m in nsfs_mounts(&own) {
            self.mounts.entry(m.ino).or_default().push(Mount::Own { point: m.point, group: m.shared });
        }
        for pid in numeric_entries(Path::new("/proc")).map_err(|e| fail("/proc", e))? {
            // Other mount namespaces: their nsfs mounts, looked at through this process.
            let mnt_link = format!("/proc/{pid}/ns/mnt");
            match std::fs::read_link(&mnt_link) {
                Ok(mnt) if !mnt_seen.contains(&mnt) => {
                    let path = format!("/proc/{pid}/mountinfo");
                    match read_mounts(&path) {
                        Ok(text) => {
                            for m in nsfs_mounts(&text) {
                                let (id, point, master) = (m.id, m.point, m.master);
                                self.mounts.entry(m.ino).or_default().push(Mount::Foreign {
                                    pid,
                                    id,
                                    point,
                                    master,
                                });
                            }
                            mnt_seen.push(mnt);
                        }
                        // a process that exited (EINVAL: a zombie has no mount namespace)
                        Err(e) if out_of_sight(&e) || e.raw_os_error() == Some(libc::EINVAL) => {}
                        Err(e) => return Err(fail(&path, e)),
                    }
                }
                Ok(_) => {}
                Err(e) if out_of_sight(&e) => {}
                Err(e) => return Err(fail(&mnt_link, e)),
            }
            let task_dir = format!("/proc/{pid}/task");
            let tids = match numeric_entries(Path::new(&task_dir)) {
                Ok(t) => t,
                Err(e) if out_of_sight(&e) => continue,
                Err(e) => return Err(fail(&task_dir, e)),
            };
            for tid in tids {
                let net_link = format!("/proc/{pid}/task/{tid}/ns/net");
                match std::fs::read_link(&net_link) {
                    Ok(link) => {
                        if let Some(ino) = link.to_str().and_then(net_ino) {
                            self.tasks.entry(ino).or_default().push(tid);
                        }
                    }
                    Err(e) if out_of_sight(&e) => {}
                    Err(e) => return Err(fail(&net_link, e)),
                }
            }
        }
        Ok(())
    }

    /// Whether a thread, a mount or an open descriptor holds the namespace `id` (or might:
    /// unconfirmed ones count, and so does a scan that could not be made). Descriptors are
    /// looked at only when no thread or mount holds it, once per `Refs`.
    fn holds(&mut self, id: NsIdent) -> bool {
        if self.blind.is_some() {
            return true;
        }
        let by_task = self
            .tasks
            .get(&id.ino)
            .into_iter()
            .flatten()
            .any(|tid| confirms(NetNs::open_recorded(&format!("/proc/{tid}/ns/net")), id));
        let by_mount = || {
            let mounts = self.mounts.get(&id.ino).map(Vec::as_slice).unwrap_or_default();
            mounts.iter().any(|m| match m {
                Mount::Own { point, .. } => confirms(NetNs::open_recorded(point), id), // another shape: cannot tell, so held
                Mount::Foreign { pid, id: mnt, point, master } => match open_foreign_mount(*pid, *mnt, point)
                {
                    Ok(found) => confirms(Ok(found), id),
                    Err(_) => propagated_copy_holds(mounts, *master, id),
                },
            })
        };
        if by_task || by_mount() {
            return true;
        }
        match self.fds.get_or_insert_with(|| fd_holders(Path::new("/proc"), FD_LINKS_CAP)) {
            Ok(held) => held
                .get(&id.ino)
                .into_iter()
                .flatten()
                .any(|h| confirms(NetNs::open_descriptor(&h.link.to_string_lossy()), id)),
            Err(_) => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn mountinfo_nsfs_lines() {
        let text = "\
612 29 0:4 net:[4026532999] /run/netns/pod\\040a rw shared:5 - nsfs nsfs rw
613 29 0:4 mnt:[4026532998] /run/x rw - nsfs nsfs rw
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
bogus line without separator";
        let one =
            |id, ino, point: &str, shared, master| NsfsMount { id, ino, point: point.into(), shared, master };
        assert_eq!(nsfs_mounts(text), vec![one(612, 4_026_532_999, "/run/netns/pod a", Some(5), None)]);
        let text = "\
700 29 0:4 net:[4026533094] /run/netns/a rw shared:412 - nsfs nsfs rw
701 29 0:4 net:[4026533095] /run/netns/b rw shared:413 master:7 - nsfs nsfs rw
702 29 0:4 net:[4026533096] /run/netns/c rw master:414 propagate_from:3 - nsfs nsfs rw";
        assert_eq!(
            nsfs_mounts(text),
            vec![
                one(700, 4_026_533_094, "/run/netns/a", Some(412), None),
                one(701, 4_026_533_095, "/run/netns/b", Some(413), Some(7)),
                one(702, 4_026_533_096, "/run/netns/c", None, Some(414)),
            ]
        );
        assert_eq!(net_ino("net:[12]"), Some(12));
        assert_eq!(net_ino("mnt:[12]"), None);
        assert_eq!(unescape("a\\134b\\"), "a\\b\\");
    }

    #[test]
    fn this_threads_namespace_is_held_and_a_made_up_one_is_not() {
        let here = ident(&NetNs::current().unwrap()).unwrap();
        let mut refs = Refs::scan();
        assert!(refs.holds(here), "our own thread is in it");
        // (not 1: the root of /proc, sysfs or a tmpfs is inode 1, and a descriptor of one may be
        // open somewhere; a path's inode counts, whatever its filesystem)
        let made_up = refs.holds(NsIdent { ino: u64::MAX - 1, cookie: 1 });
        assert!(
            !made_up,
            "scan: {:?}, descriptors: {:?}",
            refs.blind,
            refs.fds.as_ref().map(|r| r.as_ref().err())
        );
    }

    /// `(pid, tid)` of the calling thread, from `/proc/thread-self` (`<pid>/task/<tid>`).
    fn me() -> (u32, u32) {
        let link = std::fs::read_link("/proc/thread-self").unwrap();
        let parts: Vec<u32> = link.to_str().unwrap().split('/').filter_map(|p| p.parse().ok()).collect();
        (parts[0], parts[1])
    }

    #[test]
    fn descriptors_are_found_in_the_process_table_and_in_a_threads_own_table() {
        let proc = Path::new("/proc");
        // who holds `ino`, by the scan of process `pid`
        let scan = |pid: u32, ino: u64| -> Vec<u32> {
            let (mut out, mut budget) = (HashMap::new(), FD_LINKS_CAP);
            process_fd_holders(proc, pid, &mut out, &mut budget).unwrap();
            out.remove(&ino).unwrap_or_default().into_iter().map(|h| h.who).collect()
        };
        let ino = ident(&NetNs::current().unwrap()).unwrap().ino;
        let (pid, _) = me();
        // a thread sharing the process's table, alive during the scans
        let (shared_tx, shared_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let sharing = std::thread::spawn(move || {
            shared_tx.send(me().1).unwrap();
            let _ = stop_rx.recv();
        });
        let shared_tid = shared_rx.recv().unwrap();
        let before = scan(pid, ino);
        let held = std::fs::File::open("/proc/thread-self/ns/net").unwrap();
        let with = scan(pid, ino);
        assert_eq!(
            with.iter().filter(|w| **w == pid).count(),
            before.iter().filter(|w| **w == pid).count() + 1
        );
        assert!(!with.contains(&shared_tid), "a thread sharing the table is not read again: {with:?}");
        drop(held);
        // a thread with a table of its own (unshare(CLONE_FILES)) holding a namespace open
        let own = std::thread::spawn(move || {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_FILES).unwrap();
            let _held = std::fs::File::open("/proc/thread-self/ns/net").unwrap();
            (me().1, scan(pid, ino))
        });
        let (tid, holders) = own.join().unwrap();
        assert!(holders.contains(&tid), "{tid} in {holders:?}");
        stop_tx.send(()).unwrap();
        sharing.join().unwrap();
    }

    #[test]
    fn descriptor_links_and_fdinfo() {
        assert_eq!(fd_target(b"net:[4026532177]"), FdTarget::Net(4_026_532_177));
        // a namespace file opened through its bind mount, before and after the mount is gone
        assert_eq!(fd_target(b"/run/netns/pod"), FdTarget::Path);
        assert_eq!(fd_target(b"/"), FdTarget::Path);
        assert_eq!(fd_target(b"/tmp/x (deleted)"), FdTarget::Path);
        for other in
            [&b"socket:[77]"[..], b"pipe:[5]", b"anon_inode:[eventpoll]", b"mnt:[4026531841]", b"net:[x]"]
        {
            assert_eq!(fd_target(other), FdTarget::Other, "{}", String::from_utf8_lossy(other));
        }
        let info = "pos:\t0\nflags:\t0100000\nmnt_id:\t43\nino:\t4026532177\n";
        assert_eq!(fdinfo_ino(info), Some(4_026_532_177));
        assert_eq!(fdinfo_ino("pos:\t0\nflags:\t0100000\nmnt_id:\t43\n"), None, "Linux before 5.14");
    }

    #[test]
    fn a_file_opened_by_path_is_looked_up_by_its_fdinfo_inode() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("f");
        std::fs::write(&path, "x").unwrap();
        let ino = std::fs::metadata(&path).unwrap().ino();
        let (pid, _) = me();
        let held = std::fs::File::open(&path).unwrap();
        let (mut out, mut budget) = (HashMap::new(), FD_LINKS_CAP);
        process_fd_holders(Path::new("/proc"), pid, &mut out, &mut budget).unwrap();
        let holder = Holder { who: pid, link: PathBuf::from(format!("/proc/{pid}/fd/{}", held.as_raw_fd())) };
        assert_eq!(out.get(&ino), Some(&vec![holder]));
        drop(held);
    }

    #[test]
    fn a_scan_that_cannot_be_made_counts_as_holding() {
        let e = fd_holders(Path::new("/nonexistent-proc"), FD_LINKS_CAP).unwrap_err();
        assert!(e.starts_with("cannot read /nonexistent-proc: "), "{e}");
        let (mut out, mut budget) = (HashMap::new(), 0);
        let e = process_fd_holders(Path::new("/proc"), me().0, &mut out, &mut budget).unwrap_err();
        assert_eq!(e, "more open descriptors than one scan looks at");
        let made_up = NsIdent { ino: 1, cookie: 1 };
        let mut refs = Refs { fds: Some(Ok(HashMap::new())), ..Refs::default() };
        assert!(!refs.holds(made_up), "nothing holds it");
        let mut refs = Refs { fds: Some(Err("cannot read /proc/7/fd".into())), ..Refs::default() };
        assert!(refs.holds(made_up), "descriptors that could not be read: doubt");
        let mut refs = Refs { blind: Some("cannot read /proc".into()), ..Refs::default() };
        assert!(refs.holds(made_up), "threads and mounts that could not be read: doubt");
        // a descriptor that cannot be looked at counts (a link of another shape stands for it)
        let odd = Holder { who: 7, link: PathBuf::from("/proc/7/cwd") };
        let mut refs = Refs { fds: Some(Ok(HashMap::from([(1, vec![odd])]))), ..Refs::default() };
        assert!(refs.holds(made_up));
    }

    /// A namespace held only by a bind mount in another mount namespace (as a runtime pins a
    /// sandbox, or as a mount under `/run/netns` propagates into a slave mount namespace): it
    /// is held, and a namespace that got its inode number (another cookie) is not, so a dead
    /// pod whose number went to a namespace mounted elsewhere is not kept alive by that mount.
    /// A mount that cannot be looked at (its process gone, its id not what the path reaches)
    /// counts as holding. Root: a mount namespace of its own for the child.
    #[test]
    fn a_mount_in_another_mount_namespace_holds_only_the_namespace_it_is() {
        use std::io::{BufRead, BufReader};
        use std::process::{Command, Stdio};
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().to_str().unwrap().to_string();
        // `unshare` execs the script, which ends as `cat`: the child's pid stays the process
        // in the private mount namespace, which holds the new network namespace by a bind
        // mount on a tmpfs only it sees, and is itself in no other namespace than ours.
        let script = r#"set -e; mount -t tmpfs flkhl "$1"; touch "$1/ns"; unshare --net="$1/ns" true
                        echo ready; exec cat"#;
        let mut child = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", script, "sh", &dir])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("unshare (util-linux)");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "the child could not set up its mount namespace (root?)");
        let pid = child.id();
        let ns = NetNs::open(format!("/proc/{pid}/root{dir}/ns")).unwrap();
        let held = ident(&ns).unwrap();
        drop(ns);
        assert_ne!(held.cookie, 0, "SO_NETNS_COOKIE (Linux >= 5.14)");
        let mut refs = Refs::scan();
        let found = refs.mounts.get(&held.ino).cloned().unwrap_or_default();
        assert!(
            found.iter().any(|m| matches!(m, Mount::Foreign { pid: p, point, .. } if *p == pid && *point == format!("{dir}/ns"))),
            "{found:?}"
        );
        assert!(refs.holds(held), "the mount holds its namespace");
        let later = NsIdent { ino: held.ino, cookie: held.cookie + 1 };
        assert!(!refs.holds(later), "a namespace that got the number is not held by that mount");
        // what cannot be looked at: held
        let Some(Mount::Foreign { id, point, .. }) =
            found.into_iter().find(|m| matches!(m, Mount::Foreign { .. }))
        else {
            unreachable!()
        };
        for (p, mnt) in [(u32::MAX, id), (pid, id + 1_000_000)] {
            let mut refs = Refs {
                mounts: HashMap::from([(
                    later.ino,
                    vec![Mount::Foreign { pid: p, id: mnt, point: point.clone(), master: None }],
                )]),
                fds: Some(Ok(HashMap::new())),
                ..Refs::default()
            };
            assert!(refs.holds(later), "process {p}, mount {mnt}: cannot tell, so held");
        }
        drop(child.stdin.take());
        child.wait().unwrap();
    }

    /// A slave copy that cannot be reached by its path (under a tmpfs a sandbox mounted over
    /// `/run`) is judged by the mount of ours it receives propagation from: the same root, so
    /// the same namespace. It holds a namespace only when that mount is it, or cannot be told.
    #[test]
    fn an_unreachable_slave_copy_is_the_namespace_of_its_master() {
        let pid = std::process::id();
        let here = ident(&NetNs::current().unwrap()).unwrap();
        assert_ne!(here.cookie, 0, "SO_NETNS_COOKIE (Linux >= 5.14)");
        let later = NsIdent { ino: here.ino, cookie: here.cookie + 1 };
        let ours = |group| Mount::Own { point: format!("/proc/{pid}/ns/net"), group };
        let copy = |master| Mount::Foreign { pid: u32::MAX, id: 1, point: "/run/netns/x".into(), master };
        assert!(propagated_copy_holds(&[ours(Some(5))], Some(5), here), "a copy of its mount");
        assert!(!propagated_copy_holds(&[ours(Some(5))], Some(5), later), "a copy of another's mount");
        assert!(propagated_copy_holds(&[ours(Some(5))], None, later), "no master: cannot tell");
        assert!(propagated_copy_holds(&[ours(Some(5))], Some(6), later), "another group: cannot tell");
        assert!(propagated_copy_holds(&[ours(None)], Some(5), later), "ours not shared: cannot tell");
        let gone = Mount::Own { point: format!("/proc/{}/ns/net", u32::MAX), group: Some(5) };
        assert!(propagated_copy_holds(&[gone], Some(5), later), "ours gone meanwhile: cannot tell");
        // through Refs::holds: the copy's process is gone, so only its master can tell
        let refs = |mounts| Refs {
            mounts: HashMap::from([(here.ino, mounts)]),
            fds: Some(Ok(HashMap::new())),
            ..Refs::default()
        };
        assert!(!refs(vec![ours(Some(5)), copy(Some(5))]).holds(later));
        assert!(refs(vec![ours(Some(5)), copy(Some(5))]).holds(here));
        assert!(refs(vec![ours(Some(5)), copy(Some(9))]).holds(later));
    }

    /// A descriptor whose inode number is the recorded namespace's but whose file is something
    /// else holds nothing: a regular file, or a later namespace that got the number (the same
    /// inode, another cookie); one that is the namespace holds it.
    #[test]
    fn a_descriptor_holds_a_namespace_only_when_its_file_is_that_namespace() {
        let pid = me().0;
        let here = ident(&NetNs::current().unwrap()).unwrap();
        let net = std::fs::File::open("/proc/thread-self/ns/net").unwrap();
        let d = tempfile::tempdir().unwrap();
        let file = std::fs::File::create(d.path().join("f")).unwrap();
        let link = |f: &std::fs::File| PathBuf::from(format!("/proc/{pid}/fd/{}", f.as_raw_fd()));
        let refs_with = |f: &std::fs::File| Refs {
            fds: Some(Ok(HashMap::from([(here.ino, vec![Holder { who: pid, link: link(f) }])]))),
            ..Refs::default()
        };
        assert!(refs_with(&net).holds(here), "the namespace itself");
        assert!(!refs_with(&file).holds(here), "a regular file with that inode number");
        if here.cookie != 0 {
            let later = NsIdent { ino: here.ino, cookie: here.cookie + 1 };
            assert!(!refs_with(&net).holds(later), "another namespace that got the number");
        }
        let mut closed = refs_with(&net);
        drop(net);
        assert!(!closed.holds(here), "a descriptor closed meanwhile");
    }
}
