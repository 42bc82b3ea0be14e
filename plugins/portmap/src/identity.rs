//! Who an element of portmap's table belongs to: the attachment `(network, container id,
//! ifname)` written into each element's comment (the tag) and, for a host port held by one
//! attachment alone, into its 128-bit claim value. Both are ours (upstream's portmap keeps no
//! such record); they are pinned by the tests below because tables written by earlier builds
//! must be recognised by later ones.

use std::fmt::Write as _;
use std::net::Ipv6Addr;

use cni_common::attachment::{hex, AttachmentId};
use sha2::{Digest, Sha256};

/// SHA-256 over the parts, each followed by a NUL.
fn sha(parts: &[&str]) -> [u8; 32] {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0u8]);
    }
    h.finalize().into()
}

/// An identifier shortened to fit the 128-byte element comment: kept when short, else `=` and
/// a hash prefix.
fn short(kind: &str, s: &str, max: usize) -> String {
    if s.len() <= max {
        s.to_string()
    } else {
        format!("={}", &hex(&sha(&[kind, s]))[..24])
    }
}

/// The network part of an owner tag, `<net>,` (GC selects this network's elements by it).
pub fn portmap_net_prefix(network: &str) -> String {
    format!("{},", short("net", network, 40))
}

/// portmap's identity values of an attachment.
pub trait PortmapIdentity {
    /// The element comment: `<network>,<container id>,<ifname>`, each part shortened to a hash
    /// when long and the interface name escaped (`+XX` for anything but `[A-Za-z0-9_.-]`), so it
    /// fits nft's 128 bytes and needs no quoting.
    fn portmap_tag(&self) -> String;
    /// The container part of the tag (the id, or its hash when long).
    fn portmap_container(&self) -> String;
    /// The 128-bit claim value of a host port held by this attachment alone.
    fn portmap_hash(&self) -> Ipv6Addr;
}

impl PortmapIdentity for AttachmentId {
    fn portmap_tag(&self) -> String {
        let mut ifn = String::new();
        for b in self.ifname.bytes() {
            if b.is_ascii_alphanumeric() || b"_.-".contains(&b) {
                ifn.push(b as char);
            } else {
                let _ = write!(ifn, "+{b:02X}");
            }
        }
        format!("{}{},{}", portmap_net_prefix(&self.network), self.portmap_container(), short("if", &ifn, 15))
    }

    fn portmap_container(&self) -> String {
        short("id", &self.container_id, 64)
    }

    fn portmap_hash(&self) -> Ipv6Addr {
        let d = sha(&["owner", &self.network, &self.container_id, &self.ifname]);
        let mut h = [0u8; 16];
        h.copy_from_slice(&d[..16]);
        Ipv6Addr::from(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(net: &str, id: &str, ifname: &str) -> AttachmentId {
        AttachmentId::new(net, id, ifname)
    }

    /// Pinned: state written by earlier builds must be recognised by later ones.
    #[test]
    fn portmap_tag_and_hash_are_pinned() {
        let k = a("kubenet", "abc-123", "eth0");
        assert_eq!(k.portmap_tag(), "kubenet,abc-123,eth0");
        assert_eq!(k.portmap_container(), "abc-123");
        assert_eq!(k.portmap_hash(), "5c86:bc7e:322:5b69:808f:97b9:1262:a193".parse::<Ipv6Addr>().unwrap());
        let long = a(&"n".repeat(200), &"c".repeat(300), "e\u{e9}th,x");
        assert_eq!(long.portmap_tag(), "=3514b7e49cfdebbecc56fc78,=9ed59a4c2c8a9b656872b5ff,e+C3+A9th+2Cx");
        assert_eq!(long.portmap_container(), "=9ed59a4c2c8a9b656872b5ff");
        assert!(long.portmap_tag().len() <= 128);
        assert!(long.portmap_tag().starts_with(&portmap_net_prefix(&"n".repeat(200))));
        assert_eq!(
            long.portmap_hash(),
            "2503:5f9b:2898:2d81:9b35:fc4d:7de1:ef8c".parse::<Ipv6Addr>().unwrap()
        );
        assert_eq!(portmap_net_prefix("kubenet"), "kubenet,");
        assert_ne!(a("n", "a", "eth0").portmap_hash(), a("n", "a", "eth1").portmap_hash());
        assert_ne!(a("n", "a", "eth0").portmap_hash(), a("m", "a", "eth0").portmap_hash());
    }
}
