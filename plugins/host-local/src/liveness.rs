//! Telling a reservation whose pod is provably gone from one that may be alive.
//!
//! ADD records the attachment's network namespace ([`capture`]): the CNI_NETNS path, the
//! namespace's nsfs inode and netns cookie (never reused while the kernel runs), and the boot
//! id. A reservation is **dead** when
//! - it was recorded in an earlier boot (no network namespace survives a reboot), or
//! - its recorded path no longer leads to the recorded namespace (gone, or another namespace
//!   mounted under the same name), **and** nothing else holds that namespace: no thread of any
//!   process is in it, and no nsfs bind mount of it exists in any mount namespace that has a
//!   process. A mount or thread whose identity cannot be confirmed (another mount namespace, an
//!   error) counts as holding it.
//!
//! Everything else is alive: a reservation without a record (made by upstream or by an older
//! build), a record that no longer belongs to the reservation file, any error. A namespace
//! held only by an open file descriptor (no process inside it, no mount) is not seen; such a
//! namespace has no process that could use the address.
//!
//! Every path read back from a record or from `/proc` is opened through
//! `NetNs::open_recorded` (only `/run/netns/<name>`, `/var/run/netns/<name>` and
//! `/proc/<pid>/ns/net`, with `O_PATH` and checked to be nsfs before use) and nowhere else.

use crate::record::{recordable, Record};
use cni_common::fsread::read_capped;
use cni_common::netns::NetNs;
use cni_common::nsident::{ident, NsIdent};

use std::collections::HashMap;

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
    boot: [u8; 16],
    refs: Option<Refs>,
}

impl Judge {
    pub fn new(boot: [u8; 16]) -> Judge {
        Judge { boot, refs: None }
    }

    /// `Some(why)` when the attachment `rec` was made for is provably gone.
    pub fn gone(&mut self, rec: &Record) -> Option<String> {
        if rec.boot != self.boot {
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
        Some(format!("{at_path} and no process or mount holds it"))
    }
}

/// `Some(why)` when a DEL naming `del_netns` is certainly not for the attachment `rec` was
/// made for: that attachment's namespace is alive where it was recorded and DEL names another
/// namespace (a late DEL of an earlier incarnation with the same container id and interface).
/// Any doubt: `None` (the DEL goes ahead).
pub fn not_for_holder(rec: &Record, boot: &[u8; 16], del_netns: &str) -> Option<String> {
    if del_netns.is_empty() || del_netns == rec.path || rec.path.is_empty() || rec.boot != *boot {
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

/// Who holds network namespaces, by nsfs inode: threads, and nsfs bind mounts (in our mount
/// namespace with their mount point; in another one without).
#[derive(Default)]
struct Refs {
    tasks: HashMap<u64, Vec<u32>>,
    mounts: HashMap<u64, Vec<Option<String>>>,
}

/// The inode in a `net:[<ino>]` link or mountinfo root.
fn net_ino(s: &str) -> Option<u64> {
    s.strip_prefix("net:[")?.strip_suffix(']')?.parse().ok()
}

fn numeric_entries(dir: &str) -> Vec<u32> {
    let Ok(rd) = std::fs::read_dir(dir) else { return Vec::new() };
    rd.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect()
}

/// `/proc/<pid>/mountinfo` is generated by the kernel; this bounds it anyway.
const MOUNTINFO_CAP: u64 = 64 << 20;

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

/// nsfs mounts of network namespaces in a mountinfo text: (inode, mount point).
fn nsfs_mounts(text: &str) -> Vec<(u64, String)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some((left, right)) = line.split_once(" - ") else { continue };
        if right.split(' ').next() != Some("nsfs") {
            continue;
        }
        let f: Vec<&str> = left.split(' ').collect();
        if let (Some(root), Some(point)) = (f.get(3), f.get(4)) {
            if let Some(ino) = net_ino(root) {
                out.push((ino, unescape(point)));
            }
        }
    }
    out
}

impl Refs {
    fn scan() -> Refs {
        let mut refs = Refs::default();
        let own_mnt = std::fs::read_link("/proc/self/ns/mnt").ok();
        let mut mnt_seen = Vec::new();
        let read_mounts = |path: &str| -> String {
            let Ok(mut f) = std::fs::File::open(path) else { return String::new() };
            read_capped(&mut f, MOUNTINFO_CAP)
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default()
        };
        for (ino, point) in nsfs_mounts(&read_mounts("/proc/self/mountinfo")) {
            refs.mounts.entry(ino).or_default().push(Some(point));
        }
        for pid in numeric_entries("/proc") {
            // Other mount namespaces: their nsfs mounts count, by inode.
            if let Ok(mnt) = std::fs::read_link(format!("/proc/{pid}/ns/mnt")) {
                if Some(&mnt) != own_mnt.as_ref() && !mnt_seen.contains(&mnt) {
                    for (ino, _) in nsfs_mounts(&read_mounts(&format!("/proc/{pid}/mountinfo"))) {
                        refs.mounts.entry(ino).or_default().push(None);
                    }
                    mnt_seen.push(mnt);
                }
            }
            for tid in numeric_entries(&format!("/proc/{pid}/task")) {
                let Ok(link) = std::fs::read_link(format!("/proc/{pid}/task/{tid}/ns/net")) else { continue };
                if let Some(ino) = link.to_str().and_then(net_ino) {
                    refs.tasks.entry(ino).or_default().push(tid);
                }
            }
        }
        refs
    }

    /// Whether a thread or a mount holds the namespace `id` (or might: unconfirmed ones count).
    fn holds(&self, id: NsIdent) -> bool {
        let same = |path: &str| match NetNs::open_recorded(path) {
            Ok(Some(ns)) => ident(&ns).map_or(true, |now| !now.differs(&id)),
            Ok(None) => false, // gone meanwhile
            Err(_) => true,
        };
        let by_task =
            self.tasks.get(&id.ino).into_iter().flatten().any(|tid| same(&format!("/proc/{tid}/ns/net")));
        by_task
            || self.mounts.get(&id.ino).into_iter().flatten().any(|point| match point {
                Some(p) => same(p), // a path of another shape: cannot tell, so held
                None => true,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_nsfs_lines() {
        let text = "\
612 29 0:4 net:[4026532999] /run/netns/pod\\040a rw shared:5 - nsfs nsfs rw
613 29 0:4 mnt:[4026532998] /run/x rw - nsfs nsfs rw
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
bogus line without separator";
        assert_eq!(nsfs_mounts(text), vec![(4_026_532_999, "/run/netns/pod a".to_string())]);
        assert_eq!(net_ino("net:[12]"), Some(12));
        assert_eq!(net_ino("mnt:[12]"), None);
        assert_eq!(unescape("a\\134b\\"), "a\\b\\");
    }

    #[test]
    fn this_threads_namespace_is_held_and_a_made_up_one_is_not() {
        let here = ident(&NetNs::current().unwrap()).unwrap();
        let refs = Refs::scan();
        assert!(refs.holds(here), "our own thread is in it");
        assert!(!refs.holds(NsIdent { ino: 1, cookie: 1 }));
    }
}
