//! Who a piece of host state belongs to: the attachment `(network, container id, ifname)`.
//!
//! Every plugin records the owner of what it creates so that DEL removes exactly its own and
//! GC of one network never touches another's (DESIGN.md §3). The encodings differ per plugin,
//! most of them fixed by upstream so that state moves between our binaries and upstream's;
//! they all live here, as methods of [`AttachmentId`]:
//!
//! | plugin | encoding | method |
//! |---|---|---|
//! | host-local | reservation file content `<id>\r\n<ifname>` (upstream's) | [`AttachmentId::reservation`] |
//! | bridge | masquerade rule tag `hash16(net)-hash16(ifname:id)` and comment (upstream's nftables backend) | [`AttachmentId::masq_tag`], [`AttachmentId::masq_comment`] |
//! | bridge | spoof-check reference `<id>-<ifname>` (upstream's) | [`AttachmentId::spoof_ref`] |
//! | bridge | host veth alias `cni:<net>:<id>:<ifname>` (ours) | [`AttachmentId::veth_alias`] |
//! | bandwidth | ifb name `bwp` + hash of network and id (upstream's) | [`AttachmentId::ifb_name`] |
//! | bandwidth | ifb alias `cni-bandwidth net=… ctr=… if=…` and device group (ours) | [`AttachmentId::ifb_alias`], [`ifb_group`] |
//! | portmap | element comment tag and 128-bit claim value (ours) | [`AttachmentId::portmap_tag`], [`AttachmentId::portmap_hash`] |
//!
//! Network names and container ids are validated by the skeleton (`[A-Za-z0-9][A-Za-z0-9_.-]*`),
//! interface names by [`crate::spec::env::validate_ifname`] (no `/`, `:` or whitespace).

use std::fmt::Write as _;
use std::net::Ipv6Addr;

use sha2::{Digest, Sha256, Sha512};

use crate::error::Result;
use crate::skel::Request;

/// One attachment of a container to a network.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AttachmentId {
    pub network: String,
    pub container_id: String,
    pub ifname: String,
}

/// nft's limit on comment length.
const NFT_COMMENT_MAX: usize = 128;
/// The longest spoof-check reference: `macspoofchk-<ref>` fits in a rule comment.
const SPOOF_REF_MAX: usize = NFT_COMMENT_MAX - "macspoofchk-".len();
/// `IFALIASZ - 1`.
const ALIAS_MAX: usize = 255;
const IFNAMSIZ: usize = 15;
const IFB_PREFIX: &str = "bwp";
const IFB_ALIAS_TAG: &str = "cni-bandwidth";
const VETH_ALIAS_TAG: &str = "cni:";

fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// The first `n` hex digits of SHA-512(`s`): upstream's `utils.MustFormatHashWithPrefix(n, "", s)`.
pub fn sha512_hex(s: &str, n: usize) -> String {
    let mut h = hex(&Sha512::digest(s.as_bytes()));
    h.truncate(n);
    h
}

/// Shorten `s` to at most `max` bytes, cutting before the character that would cross the limit
/// (`String::truncate` panics inside a character; names from the runtime may be non-ASCII).
pub fn truncate_on_char(s: &mut String, max: usize) {
    if s.len() > max {
        let mut at = max;
        while !s.is_char_boundary(at) {
            at -= 1;
        }
        s.truncate(at);
    }
}

/// Characters nft accepts in an identifier or that are harmless in a comment; everything else
/// becomes `_` (only exotic interface names are affected).
fn nft_safe(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() || "_.-".contains(c) { c } else { '_' }).collect()
}

/// bridge: the network part of a masquerade tag (GC of one network selects its rules by it).
pub fn masq_network_hash(network: &str) -> String {
    sha512_hex(network, 16)
}

/// bandwidth: the device group our ifbs of `network` are created in: a marker byte (`0xB7`) and
/// 24 bits of a hash of the network name. The kernel applies `IFLA_GROUP` in the create request
/// itself (not so the alias), so an ifb is attributable to its network from the instant it
/// exists. Upstream's ifbs are in group 0.
pub fn ifb_group(network: &str) -> u32 {
    let d = Sha512::digest(network.as_bytes());
    0xB700_0000 | (u32::from(d[0]) << 16) | (u32::from(d[1]) << 8) | u32::from(d[2])
}

/// portmap: SHA-256 over the parts, each followed by a NUL.
fn portmap_sha(parts: &[&str]) -> [u8; 32] {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0u8]);
    }
    h.finalize().into()
}

/// portmap: an identifier shortened to fit the 128-byte element comment: kept when short, else
/// `=` and a hash prefix.
fn portmap_short(kind: &str, s: &str, max: usize) -> String {
    if s.len() <= max {
        s.to_string()
    } else {
        format!("={}", &hex(&portmap_sha(&[kind, s]))[..24])
    }
}

/// portmap: the network part of an owner tag, `<net>,` (GC selects this network's elements by it).
pub fn portmap_net_prefix(network: &str) -> String {
    format!("{},", portmap_short("net", network, 40))
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
    /// Parse an alias written by [`AttachmentId::ifb_alias`]; `None` for any other text.
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

impl AttachmentId {
    pub fn new(network: &str, container_id: &str, ifname: &str) -> AttachmentId {
        AttachmentId { network: network.into(), container_id: container_id.into(), ifname: ifname.into() }
    }

    /// The attachment a request is about (ADD, DEL, CHECK).
    pub fn of(req: &Request) -> AttachmentId {
        AttachmentId::new(req.network(), &req.env.container_id, &req.env.ifname)
    }

    /// GC: the attachments of this network that are still valid.
    pub fn valid_list(req: &Request) -> Result<Vec<AttachmentId>> {
        Ok(req
            .valid_attachments()?
            .into_iter()
            .map(|a| AttachmentId::new(req.network(), &a.container_id, &a.ifname))
            .collect())
    }

    // ---- host-local ----

    /// The content of a host-local reservation file: `<id>\r\n<ifname>` (the id trimmed, as
    /// upstream compares it).
    pub fn reservation(&self) -> String {
        format!("{}\r\n{}", self.container_id.trim(), self.ifname)
    }

    // ---- bridge ----

    /// The tag that starts a masquerade rule's comment: `hash16(network)-hash16(ifname:id)`
    /// (upstream's nftables backend), so DEL and GC find the rules without the addresses.
    pub fn masq_tag(&self) -> String {
        format!(
            "{}-{}",
            masq_network_hash(&self.network),
            sha512_hex(&format!("{}:{}", self.ifname, self.container_id), 16)
        )
    }

    /// The masquerade rule comment, as upstream writes it (at most nft's 128 bytes).
    pub fn masq_comment(&self) -> String {
        let mut c = format!(
            "{}, net: {}, if: {}, id: {}",
            self.masq_tag(),
            nft_safe(&self.network),
            nft_safe(&self.ifname),
            nft_safe(&self.container_id)
        );
        truncate_on_char(&mut c, NFT_COMMENT_MAX);
        c
    }

    /// `<containerID>-<ifname>`: upstream's spoof-check reference id (chain names, comments).
    /// One that would not fit whole in the rule comment `macspoofchk-<ref>` (128 bytes; the
    /// chain names' limit is 255) keeps its first bytes and ends in `-` and 16 hex digits of
    /// a hash of the whole (ids past ~110 bytes: no runtime's, but accepted): the chains, the
    /// comment and GC's reading of it then name the same attachment, where a cut comment
    /// would name another and nf_tables would refuse the chain name.
    pub fn spoof_ref(&self) -> String {
        let full = format!("{}-{}", self.container_id, self.ifname);
        let mut r = nft_safe(&full);
        if r.len() > SPOOF_REF_MAX {
            r.truncate(SPOOF_REF_MAX - 17);
            r.push('-');
            r.push_str(&sha512_hex(&full, 16));
        }
        r
    }

    /// The alias bridge gives the host veth of a `macspoofchk` attachment:
    /// `cni:<network>:<id>:<ifname>` (none of the three can contain `:`). It tells GC which
    /// network a spoof-check rule belongs to, which upstream's rule comments do not.
    pub fn veth_alias(&self) -> String {
        let mut s = format!("{VETH_ALIAS_TAG}{}:{}:{}", self.network, self.container_id, self.ifname);
        truncate_on_char(&mut s, ALIAS_MAX);
        s
    }

    /// The attachment a [`AttachmentId::veth_alias`] names. `None` for an alias that may have
    /// been cut at the length limit (within a character's width of it): its last field could
    /// be a prefix of the real one, and a caller that took it for the attachment (GC judging
    /// a port's owner) could find a live attachment stale. Unknown is alive.
    pub fn from_veth_alias(alias: &str) -> Option<AttachmentId> {
        if alias.len() > ALIAS_MAX - 4 {
            return None;
        }
        let mut parts = alias.strip_prefix(VETH_ALIAS_TAG)?.splitn(3, ':');
        Some(AttachmentId::new(parts.next()?, parts.next()?, parts.next()?))
    }

    // ---- bandwidth ----

    /// The ifb's name, as upstream derives it: `bwp` + the first 12 hex digits of
    /// sha512(network name + container id), so our DEL removes ifbs upstream created.
    pub fn ifb_name(&self) -> String {
        let h = sha512_hex(&format!("{}{}", self.network, self.container_id), IFNAMSIZ - IFB_PREFIX.len());
        format!("{IFB_PREFIX}{h}")
    }

    /// The ifb's alias, `cni-bandwidth net=<network> ctr=<container id> if=<ifname>`. When the
    /// whole text would not fit in an alias, trailing fields are left out (see [`IfbOwner`]).
    pub fn ifb_alias(&self) -> String {
        let mut s = format!("{IFB_ALIAS_TAG} net={}", self.network);
        for (key, v) in [("ctr", &self.container_id), ("if", &self.ifname)] {
            if s.len() + key.len() + v.len() + 2 > ALIAS_MAX {
                break;
            }
            let _ = write!(s, " {key}={v}");
        }
        s
    }

    /// The device group of this attachment's ifb ([`ifb_group`] of its network).
    pub fn ifb_group(&self) -> u32 {
        ifb_group(&self.network)
    }

    // ---- portmap ----

    /// portmap's element comment: `<network>,<container id>,<ifname>`, each part shortened to a
    /// hash when long and the interface name escaped (`+XX` for anything but `[A-Za-z0-9_.-]`),
    /// so it fits nft's 128 bytes and needs no quoting.
    pub fn portmap_tag(&self) -> String {
        let mut ifn = String::new();
        for b in self.ifname.bytes() {
            if b.is_ascii_alphanumeric() || b"_.-".contains(&b) {
                ifn.push(b as char);
            } else {
                let _ = write!(ifn, "+{b:02X}");
            }
        }
        format!(
            "{}{},{}",
            portmap_net_prefix(&self.network),
            self.portmap_container(),
            portmap_short("if", &ifn, 15)
        )
    }

    /// The container part of [`AttachmentId::portmap_tag`] (the id, or its hash when long).
    pub fn portmap_container(&self) -> String {
        portmap_short("id", &self.container_id, 64)
    }

    /// portmap's 128-bit claim value of a host port held by this attachment alone.
    pub fn portmap_hash(&self) -> Ipv6Addr {
        let d = portmap_sha(&["owner", &self.network, &self.container_id, &self.ifname]);
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

    #[test]
    fn host_local_reservation_is_upstreams() {
        assert_eq!(a("n", " c1 ", "eth0").reservation(), "c1\r\neth0");
    }

    #[test]
    fn bridge_tags_match_upstream_scheme() {
        // sha512("") is well known: cf83e1357eefb8bd…
        assert_eq!(sha512_hex("", 16), "cf83e1357eefb8bd");
        assert_eq!(sha512_hex("kubenet", 128).len(), 128);
        let k = a("kubenet", "c0ffee", "eth0");
        let tag = k.masq_tag();
        assert_eq!(tag.len(), 33);
        assert_eq!(&tag[..16], &sha512_hex("kubenet", 16));
        assert_eq!(&tag[17..], &sha512_hex("eth0:c0ffee", 16));
        assert_eq!(k.masq_comment(), format!("{tag}, net: kubenet, if: eth0, id: c0ffee"));
        assert_eq!(a("n", &"x".repeat(200), "eth0").masq_comment().len(), 128);
        assert!(a("n", "id", "e\"th").masq_comment().ends_with("if: e_th, id: id"));
        assert_eq!(k.spoof_ref(), "c0ffee-eth0");
    }

    #[test]
    fn veth_alias_round_trip() {
        let x = a("kubenet", "abc-1.x", "net1");
        assert_eq!(x.veth_alias(), "cni:kubenet:abc-1.x:net1");
        assert_eq!(AttachmentId::from_veth_alias(&x.veth_alias()), Some(x));
        assert_eq!(AttachmentId::from_veth_alias("some admin note"), None);
        assert_eq!(AttachmentId::from_veth_alias("cni:only:two"), None);
        // an alias that may have been cut names nothing (GC keeps its port's rules)
        let long = a("n", &"c".repeat(300), "eth0");
        assert_eq!(AttachmentId::from_veth_alias(&long.veth_alias()), None);
        let fits = a("n", &"c".repeat(ALIAS_MAX - 4 - "cni:n::eth0".len()), "eth0");
        assert_eq!(fits.veth_alias().len(), ALIAS_MAX - 4);
        assert_eq!(AttachmentId::from_veth_alias(&fits.veth_alias()), Some(fits));
    }

    #[test]
    fn a_long_spoof_ref_fits_comments_and_chain_names_and_stays_distinct() {
        let short = a("n", &"c".repeat(64), "eth0");
        assert_eq!(short.spoof_ref(), format!("{}-eth0", "c".repeat(64)), "runtimes' ids: upstream's form");
        let (x, y) = (a("n", &"c".repeat(400), "eth0"), a("n", &"c".repeat(401), "eth0"));
        for r in [x.spoof_ref(), y.spoof_ref()] {
            assert_eq!(r.len(), SPOOF_REF_MAX);
            assert!(format!("macspoofchk-{r}").len() <= NFT_COMMENT_MAX);
            assert!(format!("cni-br-iface-{r}-mac").len() <= 255);
        }
        assert_ne!(x.spoof_ref(), y.spoof_ref(), "ids that share a prefix keep apart");
        assert_eq!(x.spoof_ref(), x.spoof_ref());
    }

    #[test]
    fn long_names_with_multibyte_characters_are_cut_between_characters() {
        // issue 27 finding 8: a ~250-byte id and a non-ASCII ifname put the alias limit inside
        // a character; every cut lands on a boundary, at most the limit, never a panic
        for len in 240..260 {
            for ifname in ["é", "eth€", "😀😀😀", "ab\u{301}c"] {
                let x = a("n", &"c".repeat(len), ifname);
                let alias = x.veth_alias();
                assert!(alias.len() <= ALIAS_MAX, "{}", alias.len());
                assert!(format!("{VETH_ALIAS_TAG}n:{}:{ifname}", "c".repeat(len)).starts_with(&alias));
                assert!(x.masq_comment().len() <= NFT_COMMENT_MAX);
                assert!(x.ifb_alias().len() <= ALIAS_MAX);
            }
        }
        let mut s = "aé".to_string();
        truncate_on_char(&mut s, 2);
        assert_eq!(s, "a");
        truncate_on_char(&mut s, 5);
        assert_eq!(s, "a");
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
        let back = IfbOwner::parse(&a("net", &"c".repeat(300), "eth0").ifb_alias()).unwrap();
        assert_eq!((back.container_id, back.ifname), (None, None));
    }

    /// The values plugins/portmap/src/ruleset.rs `Owner::new` computes, pinned: state written
    /// by earlier builds must be recognised by later ones.
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
