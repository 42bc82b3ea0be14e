//! Who a piece of host state belongs to: the attachment `(network, container id, ifname)`.
//!
//! Every plugin records the owner of what it creates so that DEL removes exactly its own and
//! GC of one network never touches another's. The encodings differ per kind of state, most of
//! them fixed by upstream so that state moves between our binaries and upstream's; each
//! plugin derives its own from [`AttachmentId`] in its `identity` module. What lives here is
//! the key itself, the hashing and length rules every encoding shares, and the one encoding
//! that several plugins write: the tag of a masquerade rule in upstream's nftables layout
//! (`pkg/ip`'s ipmasq, which every plugin with `ipMasq` uses upstream too):
//! [`AttachmentId::masq_tag`], [`AttachmentId::masq_comment`].
//!
//! Network names and container ids are validated by the skeleton (`[A-Za-z0-9][A-Za-z0-9_.-]*`),
//! interface names by [`crate::spec::env::validate_ifname`] (no `/`, `:` or whitespace).

use sha2::{Digest, Sha512};
use std::fmt::Write as _;

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
pub const NFT_COMMENT_MAX: usize = 128;
/// The longest interface alias: `IFALIASZ - 1`.
pub const ALIAS_MAX: usize = 255;

/// Lower-case hex of `bytes` (the form every identity hash is written in).
pub fn hex(bytes: &[u8]) -> String {
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
pub fn nft_safe(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() || "_.-".contains(c) { c } else { '_' }).collect()
}

/// The network part of a masquerade tag (GC of one network selects its rules by it).
pub fn masq_network_hash(network: &str) -> String {
    sha512_hex(network, 16)
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

    /// The tag that starts a masquerade rule's comment: `hash16(network)-hash16(ifname:id)`
    /// (upstream's nftables ipmasq layout), so DEL and GC find the rules without the addresses.
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(net: &str, id: &str, ifname: &str) -> AttachmentId {
        AttachmentId::new(net, id, ifname)
    }

    #[test]
    fn masquerade_tags_match_upstreams_scheme() {
        // sha512("") is well known: cf83e1357eefb8bd…
        assert_eq!(sha512_hex("", 16), "cf83e1357eefb8bd");
        assert_eq!(sha512_hex("kubenet", 128).len(), 128);
        let k = a("kubenet", "c0ffee", "eth0");
        let tag = k.masq_tag();
        assert_eq!(tag.len(), 33);
        assert_eq!(&tag[..16], &sha512_hex("kubenet", 16));
        assert_eq!(&tag[..16], masq_network_hash("kubenet"));
        assert_eq!(&tag[17..], &sha512_hex("eth0:c0ffee", 16));
        assert_eq!(k.masq_comment(), format!("{tag}, net: kubenet, if: eth0, id: c0ffee"));
        assert_eq!(a("n", &"x".repeat(200), "eth0").masq_comment().len(), 128);
        assert!(a("n", "id", "e\"th").masq_comment().ends_with("if: e_th, id: id"));
    }

    #[test]
    fn long_names_with_multibyte_characters_are_cut_between_characters() {
        // issue 27 finding 8: a ~250-byte id and a non-ASCII ifname put a length limit inside
        // a character; every cut lands on a boundary, at most the limit, never a panic
        for len in 240..260 {
            for ifname in ["é", "eth€", "😀😀😀", "ab\u{301}c"] {
                assert!(a("n", &"c".repeat(len), ifname).masq_comment().len() <= NFT_COMMENT_MAX);
            }
        }
        let mut s = "aé".to_string();
        truncate_on_char(&mut s, 2);
        assert_eq!(s, "a");
        truncate_on_char(&mut s, 5);
        assert_eq!(s, "a");
        assert_eq!(nft_safe("a b\"c.d-e_f"), "a_b_c.d-e_f");
    }
}
