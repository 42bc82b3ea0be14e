//! Who an element belongs to: the attachment's tag (the element comment) and hash (its claim
//! value in the `owner` map).

use crate::model::Hash;
use cni_common::attachment::AttachmentId;
use sha2::{Digest, Sha256};

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn sha(parts: &[&str]) -> [u8; 32] {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0u8]);
    }
    h.finalize().into()
}

/// Who an element belongs to: one attachment (network, container id, interface), in the
/// encodings of [`AttachmentId`] (`portmap_tag`, `portmap_hash`, `portmap_container`; pinned
/// there by a unit test, so that tables written by earlier builds stay readable).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// `<network>,<container id>,<ifname>`, only characters nft's quoting leaves alone.
    pub tag: String,
    /// The 128-bit claim value stored in the `owner` map while this attachment is the only
    /// claimant of a host port; also the key of its `netns` record.
    pub hash: Hash,
    /// The container part of the tag (the id, or its hash when long).
    pub container: String,
}

impl Owner {
    pub fn of(a: &AttachmentId) -> Owner {
        Owner {
            tag: a.portmap_tag(),
            hash: Hash(a.portmap_hash().octets()),
            container: a.portmap_container(),
        }
    }

    #[cfg(test)]
    pub fn new(net: &str, id: &str, ifname: &str) -> Owner {
        Owner::of(&AttachmentId::new(net, id, ifname))
    }
}

/// The `owner` value of a host port claimed by several attachments of one container (the
/// container part of their tags): no single attachment's hash, so that neither a fast ADD of
/// another attachment nor a fast DEL of one claimant can succeed on it without the lock.
pub fn shared_hash(container: &str) -> Hash {
    Hash::from_digest(&sha(&["shared", container]))
}

/// The container part of an owner tag.
pub fn container_of(tag: &str) -> Option<&str> {
    let mut p = tag.split(',');
    match (p.next(), p.next(), p.next(), p.next()) {
        (Some(_), Some(c), Some(_), None) => Some(c),
        _ => None,
    }
}

/// A human-readable holder description from an element comment.
pub fn describe_holder(comment: Option<&str>) -> String {
    match comment.map(|c| c.splitn(3, ',').collect::<Vec<_>>()) {
        Some(p) if p.len() == 3 => {
            format!("network {:?}, container {:?}, interface {:?}", p[0], p[1], p[2])
        }
        Some(p) => format!("an element with comment {:?}", p.join(",")),
        None => "an element without owner comment (not created by this plugin?)".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cni_common::nft_cli::quote;

    #[test]
    fn owner_tags_fit_and_escape() {
        let o = Owner::new("kubenet", "abc-123", "eth0");
        assert_eq!(o.tag, "kubenet,abc-123,eth0");
        assert_eq!(quote(&o.tag), format!("\"{}\"", o.tag));
        let long = Owner::new(&"n".repeat(200), &"c".repeat(300), "e\u{e9}th,x");
        assert!(long.tag.len() <= 128, "{}", long.tag);
        assert_eq!(quote(&long.tag), format!("\"{}\"", long.tag), "nothing for quote() to escape");
        assert_eq!(container_of(&long.tag), Some(long.container.as_str()));
        assert_ne!(Owner::new("n", "a", "eth0").hash, Owner::new("n", "a", "eth1").hash);
        assert_eq!(describe_holder(Some("n,c1,eth0")), "network \"n\", container \"c1\", interface \"eth0\"");
        assert_eq!(container_of("n,c1,eth0"), Some("c1"));
        assert_eq!(container_of("n,c1"), None);
    }
}
