//! Who bridge's per-attachment state belongs to: the spoof-check reference (upstream's
//! `<containerID>-<ifname>`, in chain names and comments) and the host veth's alias (ours:
//! upstream's spoof-check comments do not name the network, the alias tells GC which network a
//! port belongs to).

use cni_common::attachment::{
    nft_safe, sha512_hex, truncate_on_char, AttachmentId, ALIAS_MAX, NFT_COMMENT_MAX,
};

/// The longest spoof-check reference: `macspoofchk-<ref>` fits in a rule comment.
const SPOOF_REF_MAX: usize = NFT_COMMENT_MAX - "macspoofchk-".len();
const VETH_ALIAS_TAG: &str = "cni:";

/// bridge's identity values of an attachment.
pub trait BridgeIdentity {
    /// `<containerID>-<ifname>`: upstream's spoof-check reference id (chain names, comments).
    /// One that would not fit whole in the rule comment `macspoofchk-<ref>` (128 bytes; the
    /// chain names' limit is 255) keeps its first bytes and ends in `-` and 16 hex digits of a
    /// hash of the whole (ids past ~110 bytes: no runtime's, but accepted): the chains, the
    /// comment and GC's reading of it then name the same attachment, where a cut comment would
    /// name another and nf_tables would refuse the chain name.
    fn spoof_ref(&self) -> String;
    /// The alias of the host veth of a `macspoofchk` attachment: `cni:<network>:<id>:<ifname>`
    /// (none of the three can contain `:`).
    fn veth_alias(&self) -> String;
}

impl BridgeIdentity for AttachmentId {
    fn spoof_ref(&self) -> String {
        let full = format!("{}-{}", self.container_id, self.ifname);
        let mut r = nft_safe(&full);
        if r.len() > SPOOF_REF_MAX {
            r.truncate(SPOOF_REF_MAX - 17);
            r.push('-');
            r.push_str(&sha512_hex(&full, 16));
        }
        r
    }

    fn veth_alias(&self) -> String {
        let mut s = format!("{VETH_ALIAS_TAG}{}:{}:{}", self.network, self.container_id, self.ifname);
        truncate_on_char(&mut s, ALIAS_MAX);
        s
    }
}

/// The attachment a [`BridgeIdentity::veth_alias`] names. `None` for an alias that may have been
/// cut at the length limit (within a character's width of it): its last field could be a
/// prefix of the real one, and a caller that took it for the attachment (GC judging a port's
/// owner) could find a live attachment stale. Unknown is alive.
pub fn from_veth_alias(alias: &str) -> Option<AttachmentId> {
    if alias.len() > ALIAS_MAX - 4 {
        return None;
    }
    let mut parts = alias.strip_prefix(VETH_ALIAS_TAG)?.splitn(3, ':');
    Some(AttachmentId::new(parts.next()?, parts.next()?, parts.next()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(net: &str, id: &str, ifname: &str) -> AttachmentId {
        AttachmentId::new(net, id, ifname)
    }

    #[test]
    fn spoof_ref_is_upstreams() {
        assert_eq!(a("kubenet", "c0ffee", "eth0").spoof_ref(), "c0ffee-eth0");
    }

    #[test]
    fn veth_alias_round_trip() {
        let x = a("kubenet", "abc-1.x", "net1");
        assert_eq!(x.veth_alias(), "cni:kubenet:abc-1.x:net1");
        assert_eq!(from_veth_alias(&x.veth_alias()), Some(x));
        assert_eq!(from_veth_alias("some admin note"), None);
        assert_eq!(from_veth_alias("cni:only:two"), None);
        // an alias that may have been cut names nothing (GC keeps its port's rules)
        let long = a("n", &"c".repeat(300), "eth0");
        assert_eq!(from_veth_alias(&long.veth_alias()), None);
        let fits = a("n", &"c".repeat(ALIAS_MAX - 4 - "cni:n::eth0".len()), "eth0");
        assert_eq!(fits.veth_alias().len(), ALIAS_MAX - 4);
        assert_eq!(from_veth_alias(&fits.veth_alias()), Some(fits));
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
    fn long_aliases_with_multibyte_characters_are_cut_between_characters() {
        // issue 27 finding 8: a ~250-byte id and a non-ASCII ifname put the alias limit inside
        // a character; every cut lands on a boundary, at most the limit, never a panic
        for len in 240..260 {
            for ifname in ["é", "eth€", "😀😀😀", "ab\u{301}c"] {
                let alias = a("n", &"c".repeat(len), ifname).veth_alias();
                assert!(alias.len() <= ALIAS_MAX, "{}", alias.len());
                assert!(format!("{VETH_ALIAS_TAG}n:{}:{ifname}", "c".repeat(len)).starts_with(&alias));
            }
        }
    }
}
