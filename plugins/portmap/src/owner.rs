//! Who an element belongs to: the attachment's tag (the element comment) and hash (its claim
//! value in the `owner` map).

use crate::model::Hash;
use sha2::{Digest, Sha256};
use std::fmt::Write as _;

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

/// An identifier shortened to fit the 128-byte element comment: kept when short, else `=` and
/// a hash prefix. Network names and container ids are validated by the skeleton
/// (`[A-Za-z0-9][A-Za-z0-9_.-]*`), so they never contain `,`.
fn short(kind: &str, s: &str, max: usize) -> String {
    if s.len() <= max {
        s.to_string()
    } else {
        format!("={}", &hex(&sha(&[kind, s]))[..24])
    }
}

/// The network part of an owner tag, `<net>,`: GC selects this network's elements with it.
pub fn net_prefix(net: &str) -> String {
    format!("{},", short("net", net, 40))
}

/// Who an element belongs to: one attachment (network, container id, interface).
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
    pub fn new(net: &str, id: &str, ifname: &str) -> Owner {
        // ifnames may hold any byte but '/', ':' and whitespace: escape everything unusual.
        let mut ifn = String::new();
        for b in ifname.bytes() {
            if b.is_ascii_alphanumeric() || b"_.-".contains(&b) {
                ifn.push(b as char);
            } else {
                let _ = write!(ifn, "+{b:02X}");
            }
        }
        let container = short("id", id, 64);
        let tag = format!("{}{container},{}", net_prefix(net), short("if", &ifn, 15));
        Owner { tag, hash: Hash::from_digest(&sha(&["owner", net, id, ifname])), container }
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
        assert!(long.tag.starts_with(&net_prefix(&"n".repeat(200))));
        assert_ne!(Owner::new("n", "a", "eth0").hash, Owner::new("n", "a", "eth1").hash);
        assert_ne!(Owner::new("n", "a", "eth0").hash, Owner::new("m", "a", "eth0").hash);
        assert_eq!(describe_holder(Some("n,c1,eth0")), "network \"n\", container \"c1\", interface \"eth0\"");
        assert_eq!(container_of("n,c1,eth0"), Some("c1"));
        assert_eq!(container_of("n,c1"), None);
    }
}
