//! GC: the rules of recorded attachments of this network that are not in the valid list
//! (except addresses a valid attachment holds now), and their records.

use crate::backend::{self, Chosen};
use crate::record::{self, Record};
use cni_common::net::Family;
use cni_common::{AttachmentId, ErrorList, Result};
use std::net::IpAddr;
use std::path::Path;

/// The stale records and the addresses whose rules go (pure).
pub fn stale(records: &[Record], network: &str, valid: &[AttachmentId]) -> (Vec<Record>, Vec<IpAddr>) {
    let is_valid = |r: &Record| {
        valid.iter().any(|v| v.network == network && v.container_id == r.container_id && v.ifname == r.ifname)
    };
    let kept: Vec<IpAddr> =
        records.iter().filter(|r| is_valid(r)).flat_map(|r| r.addrs.iter().copied()).collect();
    let gone: Vec<Record> = records.iter().filter(|r| !is_valid(r)).cloned().collect();
    let mut addrs: Vec<IpAddr> = Vec::new();
    for a in gone.iter().flat_map(|r| r.addrs.iter()) {
        if !kept.contains(a) && !addrs.contains(a) {
            addrs.push(*a);
        }
    }
    (gone, addrs)
}

pub fn gc(root: &Path, network: &str, admin: &str, valid: &[AttachmentId]) -> Result<()> {
    let (gone, addrs) = stale(&record::all(root, network), network, valid);
    let mut errors = ErrorList::new();
    let mut backends: Vec<(Chosen, &str)> = Vec::new();
    for r in &gone {
        if let Some(b) = Chosen::from_name(&r.backend) {
            if !backends.contains(&(b, r.zone.as_str())) {
                backends.push((b, r.zone.as_str()));
            }
        }
    }
    for (b, zone) in backends {
        for fam in [Family::V4, Family::V6] {
            errors.take(backend::del(b, fam, backend::Names { admin, zone }, &addrs));
        }
    }
    for r in &gone {
        errors.take(record::remove(root, &AttachmentId::new(network, &r.container_id, &r.ifname)));
    }
    record::sweep(root, network, valid);
    errors.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_a_valid_attachment_holds_now_stays() {
        let rec = |c: &str, a: &str| Record {
            container_id: c.into(),
            ifname: "eth0".into(),
            backend: "nftables".into(),
            zone: "trusted".into(),
            addrs: vec![a.parse().unwrap()],
        };
        let records = [rec("old", "10.0.0.2"), rec("new", "10.0.0.2"), rec("gone", "10.0.0.3")];
        let valid = [AttachmentId::new("n", "new", "eth0")];
        let (gone, addrs) = stale(&records, "n", &valid);
        assert_eq!(gone.iter().map(|r| r.container_id.as_str()).collect::<Vec<_>>(), ["old", "gone"]);
        assert_eq!(addrs, vec!["10.0.0.3".parse::<IpAddr>().unwrap()]);
        let (all_gone, all_addrs) = stale(&records, "n", &[]);
        assert_eq!((all_gone.len(), all_addrs.len()), (3, 2));
    }

    /// The twin with dual-stack records (issue 28): a valid attachment that holds one family's
    /// address keeps that address's rules; the other family's address of the stale record goes.
    #[test]
    fn dual_stack_records_keep_only_the_family_a_valid_attachment_holds() {
        let rec = |c: &str, a: &[&str]| Record {
            container_id: c.into(),
            ifname: "eth0".into(),
            backend: "nftables".into(),
            zone: "trusted".into(),
            addrs: a.iter().map(|a| a.parse().unwrap()).collect(),
        };
        let records = [rec("old", &["fd00::2", "10.0.0.2"]), rec("new", &["fd00::2"])];
        let valid = [AttachmentId::new("n", "new", "eth0")];
        let (gone, addrs) = stale(&records, "n", &valid);
        assert_eq!(gone.iter().map(|r| r.container_id.as_str()).collect::<Vec<_>>(), ["old"]);
        assert_eq!(addrs, vec!["10.0.0.2".parse::<IpAddr>().unwrap()]);
        // Another network's valid attachment of the same container and interface keeps nothing.
        let elsewhere = [AttachmentId::new("m", "new", "eth0")];
        let (gone, addrs) = stale(&records, "n", &elsewhere);
        assert_eq!((gone.len(), addrs.len()), (2, 2));
    }
}
