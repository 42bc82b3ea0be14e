//! What each attachment asked for, kept on disk so that DEL without a prevResult and GC
//! know which addresses' rules belong to which attachment (upstream's rules carry no owner).
//! Written before the rules (a crash after it leaves a record GC and DEL act on), removed after
//! the rules went. Read back as data only: every line parsed strictly, anything else ignored.

use cni_common::attachment::sha512_hex;
use cni_common::{AttachmentId, CniError, Result};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

pub const DIR: &str = "/var/lib/cni/firewall";

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

fn net_dir(root: &Path, network: &str) -> PathBuf {
    root.join(network)
}

fn file_of(root: &Path, a: &AttachmentId) -> PathBuf {
    net_dir(root, &a.network).join(sha512_hex(&format!("{}\n{}", a.container_id, a.ifname), 32))
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
    let dir = net_dir(root, &a.network);
    let path = file_of(root, a);
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let io = |e: std::io::Error| CniError::new(cni_common::code::IO, format!("{}: {e}", path.display()));
    // a DEL or GC of the network's last attachment removes the directory: make it again once
    for attempt in 0..2 {
        std::fs::create_dir_all(&dir).map_err(io)?;
        between(&dir);
        match std::fs::write(&tmp, r.text()).and_then(|()| std::fs::rename(&tmp, &path)) {
            Err(e) if attempt == 0 && e.kind() == std::io::ErrorKind::NotFound => continue,
            other => return other.map_err(io),
        }
    }
    Ok(())
}

pub fn read(root: &Path, a: &AttachmentId) -> Option<Record> {
    let text = std::fs::read_to_string(file_of(root, a)).ok()?;
    Record::parse(&text).filter(|r| r.container_id == a.container_id && r.ifname == a.ifname)
}

/// Half-written records (`<hash>.tmp<pid>`, left by a process killed while writing) whose
/// attachment `keep` does not name.
fn sweep_tmp(root: &Path, network: &str, keep: &dyn Fn(&str) -> bool) {
    let Ok(dir) = std::fs::read_dir(net_dir(root, network)) else { return };
    for e in dir.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some((hash, pid)) = name.split_once(".tmp") else { continue };
        if hash.len() == 32 && pid.bytes().all(|b| b.is_ascii_digit()) && !keep(hash) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// GC: half-written records of attachments not in `valid`.
pub fn sweep(root: &Path, network: &str, valid: &[AttachmentId]) {
    let hashes: Vec<String> = valid
        .iter()
        .filter_map(|a| file_of(root, a).file_name().and_then(|n| n.to_str()).map(String::from))
        .collect();
    sweep_tmp(root, network, &|h| hashes.iter().any(|v| v == h));
}

pub fn remove(root: &Path, a: &AttachmentId) -> Result<()> {
    let mine = file_of(root, a);
    let own = mine.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
    sweep_tmp(root, &a.network, &|h| h != own);
    let done = match std::fs::remove_file(mine) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(CniError::new(cni_common::code::IO, format!("removing the firewall record: {e}")))
        }
        _ => Ok(()),
    };
    let _ = std::fs::remove_dir(net_dir(root, &a.network)); // only when it is empty
    done
}

/// Every record of `network` (unreadable or malformed files are skipped).
pub fn all(root: &Path, network: &str) -> Vec<Record> {
    let Ok(dir) = std::fs::read_dir(net_dir(root, network)) else { return Vec::new() };
    dir.flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter(|e| {
            e.file_name().to_str().is_some_and(|n| n.len() == 32 && n.bytes().all(|b| b.is_ascii_hexdigit()))
        })
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .filter_map(|t| Record::parse(&t))
        .collect()
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
        let blocker = file_of(&root, &a);
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
        std::fs::write(file_of(&root, &a), rec("c2").text()).unwrap();
        assert_eq!(read(&root, &a), None);
        let other_if = Record { ifname: "eth1".into(), ..rec("c1") };
        std::fs::write(file_of(&root, &a), other_if.text()).unwrap();
        assert_eq!(read(&root, &a), None);
        std::fs::remove_file(file_of(&root, &a)).unwrap();
        // records under names no write makes are not the network's records
        std::fs::write(root.join("net1").join("abcd"), rec("c3").text()).unwrap();
        std::fs::write(root.join("net1").join("z".repeat(32)), rec("c4").text()).unwrap();
        assert!(all(&root, "net1").is_empty());
        write(&root, &a, &rec("c1")).unwrap();
        assert_eq!(all(&root, "net1"), vec![rec("c1")]);
        // a record that cannot be removed: DEL says so
        std::fs::remove_file(file_of(&root, &a)).unwrap();
        std::fs::create_dir_all(file_of(&root, &a).join("inside")).unwrap();
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
        let tmp = |id: &str| file_of(&root, &AttachmentId::new("net1", id, "eth0")).with_extension("tmp42");
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
}
