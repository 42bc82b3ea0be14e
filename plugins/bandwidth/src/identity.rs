//! Who an ifb belongs to. Its name is upstream's (`bwp` + a hash of network and container id,
//! so our DEL removes ifbs upstream created); its alias and device group are ours, so GC of one
//! network can tell its ifbs from another's and from upstream's.

use std::fmt::Write as _;

use cni_common::attachment::{sha512_hex, AttachmentId, ALIAS_MAX};
use sha2::{Digest, Sha512};

const IFNAMSIZ: usize = 15;
const IFB_PREFIX: &str = "bwp";
const IFB_ALIAS_TAG: &str = "cni-bandwidth";

/// The device group our ifbs of `network` are created in: a marker byte (`0xB7`) and 24 bits of
/// a hash of the network name. The kernel applies `IFLA_GROUP` in the create request itself
/// (not so the alias), so an ifb is attributable to its network from the instant it exists.
/// Upstream's ifbs are in group 0.
pub fn ifb_group(network: &str) -> u32 {
    let d = Sha512::digest(network.as_bytes());
    0xB700_0000 | (u32::from(d[0]) << 16) | (u32::from(d[1]) << 8) | u32::from(d[2])
}

/// What an ifb's alias records about its owner. Trailing fields that did not fit in the alias
/// are `None` and match anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IfbOwner {
    pub network: String,
    pub container_id: Option<String>,
    pub ifname: Option<String>,
}

impl IfbOwner {
    /// Parse an alias written by [`IfbIdentity::ifb_alias`]; `None` for any other text.
    pub fn parse(alias: &str) -> Option<IfbOwner> {
        let mut words = alias.split(' ');
        if words.next()? != IFB_ALIAS_TAG {
            return None;
        }
        let mut owner = IfbOwner { network: String::new(), container_id: None, ifname: None };
        for w in words {
            match w.split_once('=')? {
                ("net", v) => owner.network = v.into(),
                ("ctr", v) => owner.container_id = Some(v.into()),
                ("if", v) => owner.ifname = Some(v.into()),
                _ => {}
            }
        }
        (!owner.network.is_empty()).then_some(owner)
    }

    /// Whether this record names `a` (a field left out of the alias matches anything).
    pub fn is(&self, a: &AttachmentId) -> bool {
        self.network == a.network
            && self.container_id.as_deref().is_none_or(|c| c == a.container_id)
            && self.ifname.as_deref().is_none_or(|i| i == a.ifname)
    }
}

/// bandwidth's identity values of an attachment.
pub trait IfbIdentity {
    /// The ifb's name, as upstream derives it: `bwp` + the first 12 hex digits of
    /// sha512(network name + container id).
    fn ifb_name(&self) -> String;
    /// The ifb's alias, `cni-bandwidth net=<network> ctr=<container id> if=<ifname>`. When the
    /// whole text would not fit in an alias, trailing fields are left out (see [`IfbOwner`]).
    fn ifb_alias(&self) -> String;
    /// The device group of this attachment's ifb ([`ifb_group`] of its network).
    fn ifb_group(&self) -> u32;
}

impl IfbIdentity for AttachmentId {
    fn ifb_name(&self) -> String {
        let h = sha512_hex(&format!("{}{}", self.network, self.container_id), IFNAMSIZ - IFB_PREFIX.len());
        format!("{IFB_PREFIX}{h}")
    }

    fn ifb_alias(&self) -> String {
        let mut s = format!("{IFB_ALIAS_TAG} net={}", self.network);
        for (key, v) in [("ctr", &self.container_id), ("if", &self.ifname)] {
            if s.len() + key.len() + v.len() + 2 > ALIAS_MAX {
                break;
            }
            let _ = write!(s, " {key}={v}");
        }
        s
    }

    fn ifb_group(&self) -> u32 {
        ifb_group(&self.network)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(net: &str, id: &str, ifname: &str) -> AttachmentId {
        AttachmentId::new(net, id, ifname)
    }

    #[test]
    fn ifb_name_group_and_alias() {
        let x = a("mynet", "ctr1", "eth0");
        let n = x.ifb_name();
        assert_eq!(n, format!("bwp{}", &sha512_hex("mynetctr1", 12)));
        assert_eq!(n.len(), 15);
        let g = x.ifb_group();
        assert_eq!(g >> 24, 0xB7);
        assert_eq!(g, ifb_group("mynet"));
        assert_ne!(g, ifb_group("mynet2"));
        // The marker byte, then the first three bytes of sha512("kubenet") (b7 24 71 62 …).
        assert_eq!(ifb_group("kubenet"), 0xB724_7162);

        let k = a("kubenet", "0123abcd", "eth0");
        assert_eq!(k.ifb_alias(), "cni-bandwidth net=kubenet ctr=0123abcd if=eth0");
        let o = IfbOwner::parse(&k.ifb_alias()).unwrap();
        assert!(o.is(&k));
        assert!(!o.is(&a("kubenet", "0123abcd", "eth1")));
        assert!(!o.is(&a("other", "0123abcd", "eth0")));
        assert_eq!(IfbOwner::parse("something else"), None);
        assert_eq!(IfbOwner::parse("cni-bandwidth ctr=x"), None, "no network");
    }

    #[test]
    fn long_ifb_alias_fields_are_dropped_from_the_end() {
        let long_ctr = "c".repeat(225); // fits, but leaves no room for " if=eth0"
        let alias = a("net", &long_ctr, "eth0").ifb_alias();
        assert!(alias.len() <= ALIAS_MAX, "{}", alias.len());
        let back = IfbOwner::parse(&alias).unwrap();
        assert_eq!(back.container_id.as_deref(), Some(long_ctr.as_str()));
        assert_eq!(back.ifname, None);
        assert!(back.is(&a("net", &long_ctr, "anything")), "missing fields match anything");
        // A field that fills the alias to exactly its limit is kept.
        let prefix = "cni-bandwidth net=net ctr=".len();
        let exact = "c".repeat(ALIAS_MAX - prefix);
        let alias = a("net", &exact, "eth0").ifb_alias();
        assert_eq!(alias.len(), ALIAS_MAX);
        assert_eq!(IfbOwner::parse(&alias).unwrap().container_id.as_deref(), Some(exact.as_str()));
        let over = "c".repeat(ALIAS_MAX - prefix + 1);
        assert_eq!(IfbOwner::parse(&a("net", &over, "eth0").ifb_alias()).unwrap().container_id, None);
        let back = IfbOwner::parse(&a("net", &"c".repeat(300), "eth0").ifb_alias()).unwrap();
        assert_eq!((back.container_id, back.ifname), (None, None));
        // a multibyte name near the limit: never past it, never a panic
        for len in 240..260 {
            for ifname in ["é", "eth€", "😀😀😀", "ab\u{301}c"] {
                assert!(a("n", &"c".repeat(len), ifname).ifb_alias().len() <= ALIAS_MAX);
            }
        }
    }
}
