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
    let dir = net_dir(root, &a.network);
    std::fs::create_dir_all(&dir)
        .map_err(|e| CniError::new(cni_common::code::IO, format!("{}: {e}", dir.display())))?;
    let path = file_of(root, a);
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, r.text())
        .and_then(|()| std::fs::rename(&tmp, &path))
        .map_err(|e| CniError::new(cni_common::code::IO, format!("{}: {e}", path.display())))
}

pub fn read(root: &Path, a: &AttachmentId) -> Option<Record> {
    let text = std::fs::read_to_string(file_of(root, a)).ok()?;
    Record::parse(&text).filter(|r| r.container_id == a.container_id && r.ifname == a.ifname)
}

pub fn remove(root: &Path, a: &AttachmentId) -> Result<()> {
    match std::fs::remove_file(file_of(root, a)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(CniError::new(cni_common::code::IO, format!("removing the firewall record: {e}")))
        }
        _ => Ok(()),
    }
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
        assert_eq!(all(&root, "net1"), vec![r]);
        assert_eq!(read(&root, &AttachmentId::new("net1", "c2", "eth0")), None);
        remove(&root, &a).unwrap();
        remove(&root, &a).unwrap();
        assert!(all(&root, "net1").is_empty());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
