//! What each attachment asked for, kept on disk so that DEL without a prevResult and GC
//! know which addresses' rules belong to which attachment (upstream's rules carry no owner).
//! Written before the rules (a crash after it leaves a record GC and DEL act on), removed after
//! the rules went. Read back as data only: every line parsed strictly, anything else ignored.
//!
//! The files follow cni-common's [`StateDir`] rules (issue 37, finding 2): [`DIR`] and the
//! network's directory under it are opened once along the path and must be root's and writable
//! by root alone (ADD refuses another, with code 5; DEL and GC then trust no record there and
//! leave its files alone); a record is read only when it is a regular file, without waiting and
//! at most [`MAX`] bytes (a FIFO, a link or a device in its place is no record); a record is
//! written under an unpredictable temporary name created `O_EXCL | O_NOFOLLOW` and renamed at
//! the directory's descriptor.

use cni_common::attachment::sha512_hex;
use cni_common::statedir::{self, StateDir};
use cni_common::{AttachmentId, CniError, Result};
use std::io;
use std::net::IpAddr;
use std::path::Path;

pub const DIR: &str = "/var/lib/cni/firewall";

/// The largest record read back: a few lines and one per address (a result holds a handful).
pub const MAX: u64 = 64 * 1024;

/// Mode of the directories made (the records name containers: nobody else's business).
const DIR_MODE: u32 = 0o700;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub container_id: String,
    pub ifname: String,
    /// "nftables", "iptables-nft", "iptables-legacy" or "firewalld".
    pub backend: String,
    /// The firewalld zone (firewalld backend).
    pub zone: String,
    pub addrs: Vec<IpAddr>,
}

/// The file name of `a`'s record in its network's directory.
fn name_of(a: &AttachmentId) -> String {
    sha512_hex(&format!("{}\n{}", a.container_id, a.ifname), 32)
}

/// A record's name: 32 hexadecimal digits.
fn is_record_name(n: &str) -> bool {
    n.len() == 32 && n.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `root` and the network's directory in it, checked; made when `create` (ADD).
fn open(root: &Path, network: &str, create: bool) -> io::Result<(StateDir, StateDir)> {
    let mode = create.then_some(DIR_MODE);
    let top = StateDir::open(root, mode)?;
    let net = top.subdir(network, mode)?;
    Ok((top, net))
}

/// The network's directory for DEL and GC: `None` when it is not there, or not trusted (said on
/// stderr: the calls go on with what they know without it).
fn open_existing(root: &Path, network: &str) -> Option<(StateDir, StateDir)> {
    match open(root, network, false) {
        Ok(dirs) => Some(dirs),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => {
            cni_common::log!("firewall", "not using the records of network {network:?}: {e}");
            None
        }
    }
}

impl Record {
    pub fn text(&self) -> String {
        let mut s = format!(
            "ctr {}\nif {}\nbackend {}\nzone {}\n",
            self.container_id, self.ifname, self.backend, self.zone
        );
        for a in &self.addrs {
            s.push_str(&format!("addr {a}\n"));
        }
        s
    }

    pub fn parse(text: &str) -> Option<Record> {
        let mut r = Record {
            container_id: String::new(),
            ifname: String::new(),
            backend: String::new(),
            zone: "trusted".into(),
            addrs: Vec::new(),
        };
        for line in text.lines() {
            let (k, v) = line.split_once(' ')?;
            match k {
                "ctr" => r.container_id = v.into(),
                "if" => r.ifname = v.into(),
                "backend" if matches!(v, "nftables" | "iptables-nft" | "iptables-legacy" | "firewalld") => {
                    r.backend = v.into()
                }
                "zone" if crate::config::valid_zone(v) => r.zone = v.into(),
                "addr" => r.addrs.push(v.parse().ok()?),
                _ => return None,
            }
        }
        (!r.container_id.is_empty() && !r.ifname.is_empty() && !r.backend.is_empty()).then_some(r)
    }
}

pub fn write(root: &Path, a: &AttachmentId, r: &Record) -> Result<()> {
    write_racing(root, a, r, &mut |_| {})
}

/// [`write`], with `between` run after the network's directory is made and before the record
/// is written: where a concurrent DEL or GC of the network's last attachment may remove the
/// directory (the unit tests stand in for it there).
fn write_racing(root: &Path, a: &AttachmentId, r: &Record, between: &mut dyn FnMut(&Path)) -> Result<()> {
    let name = name_of(a);
    let io = |e: io::Error| {
        let err = CniError::io(format!("firewall record of {}/{}: {e}", a.container_id, a.ifname));
        if statedir::is_unsafe(&e) {
            return err.with_details(format!(
                "whoever can write there can make root write through a link or hide an attachment's \
                 rules from DEL and GC; chown root {0} && chmod go-w {0}",
                root.display()
            ));
        }
        err
    };
    // a DEL or GC of the network's last attachment removes the directory: make it again once
    for attempt in 0..2 {
        let (_top, dir) = open(root, &a.network, true).map_err(io)?;
        between(dir.path());
        // not flushed to disk: the rules it names do not survive a crash of the machine either
        match dir.write_atomic(&name, r.text().as_bytes(), 0o600, false) {
            Err(e) if attempt == 0 && e.kind() == io::ErrorKind::NotFound => continue,
            other => return other.map_err(io),
        }
    }
    Ok(())
}

/// The record `name` in `dir` when it is one: a regular file of at most [`MAX`] bytes that
/// parses (anything else in its place is said on stderr and is no record).
fn read_in(dir: &StateDir, name: &str) -> Option<Record> {
    match dir.read(name, MAX) {
        Ok(bytes) => Record::parse(std::str::from_utf8(&bytes).ok()?),
        Err(e) => {
            if statedir::not_ours(&e) {
                cni_common::log!("firewall", "{}/{name} is no record: {e}", dir.path().display());
            }
            None
        }
    }
}

pub fn read(root: &Path, a: &AttachmentId) -> Option<Record> {
    let (_top, dir) = open_existing(root, &a.network)?;
    read_in(&dir, &name_of(a)).filter(|r| r.container_id == a.container_id && r.ifname == a.ifname)
}

/// Half-written records (`<hash>.tmp…`, left by a process killed while writing) whose
/// attachment `keep` does not name.
fn sweep_tmp(dir: &StateDir, keep: &dyn Fn(&str) -> bool) {
    for name in dir.names().unwrap_or_default() {
        let Some(name) = name.to_str() else { continue };
        match statedir::is_tmp_of(name) {
            Some(hash) if is_record_name(hash) && !keep(hash) => {
                let _ = dir.remove(name);
            }
            _ => {}
        }
    }
}

/// GC: half-written records of attachments not in `valid`.
pub fn sweep(root: &Path, network: &str, valid: &[AttachmentId]) {
    let Some((_top, dir)) = open_existing(root, network) else { return };
    let hashes: Vec<String> = valid.iter().map(name_of).collect();
    sweep_tmp(&dir, &|h| hashes.iter().any(|v| v == h));
}

pub fn remove(root: &Path, a: &AttachmentId) -> Result<()> {
    let Some((top, dir)) = open_existing(root, &a.network) else { return Ok(()) };
    let own = name_of(a);
    sweep_tmp(&dir, &|h| h != own);
    // whatever is at the name goes (a FIFO or link planted there too): unlinked, not opened
    let done =
        dir.remove(&own).map(drop).map_err(|e| CniError::io(format!("removing the firewall record: {e}")));
    drop(dir);
    let _ = top.remove_dir(&a.network); // only when it is empty
    done
}

/// Every record of `network` (files that are no records, unreadable or malformed, are skipped).
pub fn all(root: &Path, network: &str) -> Vec<Record> {
    let Some((_top, dir)) = open_existing(root, network) else { return Vec::new() };
    let mut names: Vec<String> =
        dir.names().unwrap_or_default().into_iter().filter_map(|n| n.into_string().ok()).collect();
    names.retain(|n| is_record_name(n));
    names.sort();
    names.iter().filter_map(|n| read_in(&dir, n)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record that cannot be written for any reason but a directory removed meanwhile (here:
    /// its path is a directory with something in it, so the rename fails) is an error, not
    /// retried into silence: only a missing directory is made again, once.
    #[test]
    fn a_write_that_fails_otherwise_is_reported() {
        let root = std::env::temp_dir().join(format!("fw-rec-fail-{}", std::process::id()));
        let a = AttachmentId::new("net1", "c1", "eth0");
        let r = Record {
            container_id: "c1".into(),
            ifname: "eth0".into(),
            backend: "nftables".into(),
            zone: "trusted".into(),
            addrs: vec!["10.0.0.2".parse().unwrap()],
        };
        let blocker = root.join("net1").join(name_of(&a));
        std::fs::create_dir_all(blocker.join("inside")).unwrap();
        let e = write(&root, &a, &r).unwrap_err();
        assert_eq!(e.code, cni_common::code::IO, "{}", e.msg);
        assert_eq!(read(&root, &a), None);
        // the directory of the network removed between calls: made again, the record written
        std::fs::remove_dir_all(&root).unwrap();
        write(&root, &a, &r).unwrap();
        assert_eq!(read(&root, &a), Some(r));
        std::fs::remove_dir_all(&root).unwrap();
    }

    fn rec(ctr: &str) -> Record {
        Record {
            container_id: ctr.into(),
            ifname: "eth0".into(),
            backend: "nftables".into(),
            zone: "trusted".into(),
            addrs: vec!["10.0.0.2".parse().unwrap()],
        }
    }

    /// A record needs each of its container, interface and backend lines.
    #[test]
    fn a_record_without_its_container_interface_or_backend_is_refused() {
        assert!(Record::parse("ctr c\nif e\nbackend nftables\n").is_some());
        for text in ["if e\nbackend nftables\n", "ctr c\nbackend nftables\n", "ctr c\nif e\n"] {
            assert_eq!(Record::parse(text), None, "{text:?}");
        }
    }

    /// The network's directory removed by a concurrent DEL or GC between making it and
    /// writing the record: made again once and the record written; removed again on that
    /// second attempt, the write fails (never `Ok` with nothing written).
    #[test]
    fn a_directory_removed_while_the_record_is_written_is_made_again_once() {
        let root = std::env::temp_dir().join(format!("fw-rec-race-{}", std::process::id()));
        let a = AttachmentId::new("net1", "c1", "eth0");
        // a DEL or GC removing the directory the first `times` times it is made
        let race = |times: usize| {
            let mut left = times;
            move |dir: &Path| {
                if left > 0 {
                    left -= 1;
                    std::fs::remove_dir(dir).unwrap();
                }
            }
        };
        write_racing(&root, &a, &rec("c1"), &mut race(1)).unwrap();
        assert_eq!(read(&root, &a), Some(rec("c1")));
        std::fs::remove_dir_all(&root).unwrap();
        let e = write_racing(&root, &a, &rec("c1"), &mut race(2)).unwrap_err();
        assert_eq!(e.code, cni_common::code::IO, "{}", e.msg);
        assert_eq!(read(&root, &a), None);
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// Only what can be the attachment's own is read: a file holding another attachment's
    /// record, a file whose name is not a record's (32 hex digits), and a record that cannot be
    /// removed (its path is a directory) is an error for DEL.
    #[test]
    fn only_an_attachments_own_file_is_read_and_a_failed_removal_is_reported() {
        let root = std::env::temp_dir().join(format!("fw-rec-own-{}", std::process::id()));
        let a = AttachmentId::new("net1", "c1", "eth0");
        std::fs::create_dir_all(root.join("net1")).unwrap();
        // the file of c1/eth0 holding c2/eth0's record (or c1/eth1's): not c1/eth0's
        std::fs::write(root.join("net1").join(name_of(&a)), rec("c2").text()).unwrap();
        assert_eq!(read(&root, &a), None);
        let other_if = Record { ifname: "eth1".into(), ..rec("c1") };
        std::fs::write(root.join("net1").join(name_of(&a)), other_if.text()).unwrap();
        assert_eq!(read(&root, &a), None);
        std::fs::remove_file(root.join("net1").join(name_of(&a))).unwrap();
        // records under names no write makes are not the network's records
        std::fs::write(root.join("net1").join("abcd"), rec("c3").text()).unwrap();
        std::fs::write(root.join("net1").join("z".repeat(32)), rec("c4").text()).unwrap();
        assert!(all(&root, "net1").is_empty());
        write(&root, &a, &rec("c1")).unwrap();
        assert_eq!(all(&root, "net1"), vec![rec("c1")]);
        // a record that cannot be removed: DEL says so
        std::fs::remove_file(root.join("net1").join(name_of(&a))).unwrap();
        std::fs::create_dir_all(root.join("net1").join(name_of(&a)).join("inside")).unwrap();
        let e = remove(&root, &a).unwrap_err();
        assert_eq!(e.code, cni_common::code::IO, "{}", e.msg);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn records_round_trip_and_refuse_anything_else() {
        let r = Record {
            container_id: "c1".into(),
            ifname: "eth0".into(),
            backend: "nftables".into(),
            zone: "trusted".into(),
            addrs: vec!["10.0.0.2".parse().unwrap(), "fd00::2".parse().unwrap()],
        };
        assert_eq!(Record::parse(&r.text()), Some(r.clone()));
        assert_eq!(Record::parse("ctr c\nif e\nbackend sh -c x\n"), None);
        assert_eq!(Record::parse("ctr c\nif e\nbackend firewalld\nzone -x\n"), None);
        let fw = Record { backend: "firewalld".into(), zone: "internal".into(), ..r.clone() };
        assert_eq!(Record::parse(&fw.text()), Some(fw));
        assert_eq!(Record::parse("ctr c\nif e\nbackend nftables\naddr 10.0.0.2/../x\n"), None);
        let root = std::env::temp_dir().join(format!("fw-rec-{}", std::process::id()));
        let a = AttachmentId::new("net1", "c1", "eth0");
        write(&root, &a, &r).unwrap();
        assert_eq!(read(&root, &a), Some(r.clone()));
        assert_eq!(all(&root, "net1"), vec![r.clone()]);
        assert_eq!(read(&root, &AttachmentId::new("net1", "c2", "eth0")), None);
        // a half-written record of a killed ADD goes with DEL, another attachment's with GC
        let tmp = |id: &str| {
            root.join("net1").join(format!("{}.tmp42", name_of(&AttachmentId::new("net1", id, "eth0"))))
        };
        std::fs::write(tmp("c1"), "ctr c1\n").unwrap();
        std::fs::write(tmp("c3"), "ctr c3\n").unwrap();
        std::fs::write(tmp("c4"), "ctr c4\n").unwrap();
        remove(&root, &a).unwrap();
        remove(&root, &a).unwrap();
        assert!(!tmp("c1").exists() && tmp("c3").exists());
        sweep(&root, "net1", &[AttachmentId::new("net1", "c4", "eth0")]);
        assert!(!tmp("c3").exists() && tmp("c4").exists());
        std::fs::remove_file(tmp("c4")).unwrap();
        assert!(all(&root, "net1").is_empty());
        remove(&root, &a).unwrap();
        assert!(!root.join("net1").exists(), "the network's empty directory goes with its last record");
        write(&root, &a, &r).unwrap(); // and comes back with the next ADD
        remove(&root, &a).unwrap();
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// Issue 37, finding 2: a FIFO or a link to /dev/zero in a record's place is no record (read
    /// without waiting or following, and removed by DEL), and a directory others can write is
    /// refused by ADD and not read by DEL.
    #[test]
    fn what_is_no_regular_file_is_no_record_and_an_unsafe_directory_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let root = std::env::temp_dir().join(format!("fw-rec-safe-{}", std::process::id()));
        let a = AttachmentId::new("net1", "c1", "eth0");
        let path = root.join("net1").join(name_of(&a));
        for plant in ["fifo", "zero"] {
            write(&root, &a, &rec("c1")).unwrap();
            std::fs::remove_file(&path).unwrap();
            match plant {
                "fifo" => {
                    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
                    // SAFETY: a valid NUL-terminated path.
                    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
                }
                _ => std::os::unix::fs::symlink("/dev/zero", &path).unwrap(),
            }
            assert_eq!(read(&root, &a), None, "{plant}");
            assert!(all(&root, "net1").is_empty(), "{plant}");
            remove(&root, &a).unwrap();
            assert!(std::fs::symlink_metadata(&path).is_err(), "{plant}: removed, not followed");
        }
        write(&root, &a, &rec("c1")).unwrap();
        std::fs::set_permissions(root.join("net1"), std::fs::Permissions::from_mode(0o775)).unwrap();
        let e = write(&root, &a, &rec("c1")).unwrap_err();
        assert_eq!(e.code, cni_common::code::IO, "{}", e.msg);
        assert!(e.msg.contains("is not safe: group or others may write it"), "{}", e.msg);
        assert_eq!(read(&root, &a), None, "a record in a directory others can write is not trusted");
        remove(&root, &a).unwrap();
        assert!(path.exists(), "nor removed");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
