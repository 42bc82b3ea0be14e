//! Reading this suite's own nftables state, for `to-upstream`.
//!
//! **Layout dependency.** Everything this tool knows about our tables' layout is in this file
//! (the owner encodings themselves are `cni_common::attachment::AttachmentId`'s):
//! - bridge `ipMasq`: table `inet cni_plugins_masquerade`, chain `masq_checks`, one rule per
//!   container address (`ip saddr A ip daddr != SUBNET … masquerade`) commented
//!   `<masq_tag>, net: N, if: I, id: C` (plugins/bridge/src/firewall.rs);
//! - portmap (plugins/portmap/src/model.rs, layout.rs, wire/codec.rs): table `inet cni_portmap`;
//!   per-attachment elements commented with the owner tag `<net>,<id>,<ifname>` in `owner`,
//!   `claims`, the DNAT maps `hp4`/`hip4`/`hp6`/`hip6` (`[host address .] proto . host port :
//!   container address . container port`) and the masquerade sets `net4_<len>`/`net6_<len>`
//!   (`source prefix . container address . proto . port`, no source for `_0`; the previous
//!   layout's interval sets `masq4`/`masq6` too); the `netns` record keyed by the attachment's
//!   hash (`AttachmentId::portmap_hash`).
//!
//! When portmap's layout changes, this file is the one to update. The masquerade sets only
//! refine what is written for an attachment without a libcni cache entry (`snat`/`masqAll`,
//! the container's prefix length); when they cannot be decoded, upstream's defaults are used
//! and the prefix comes from the host's routes.

use bridge::firewall;
use cni_common::attachment::AttachmentId;
use cni_common::netlink::nft::{split_concat, NfTables, NftData, NftElem, NftExpr, NftFamily, NftRule};
use cni_common::{CniError, Result};
use ipnet::IpNet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub const PORTMAP_TABLE: &str = "cni_portmap";
/// The sets and maps of `inet cni_portmap` that always hold per-attachment elements (the
/// masquerade sets are found through the rules that use them).
pub const PORTMAP_SETS: [&str; 7] = ["owner", "claims", "hp4", "hip4", "hp6", "hip6", "netns"];
/// The record of an attachment's network namespace: keyed by its hash, commented with a path.
pub const NETNS_SET: &str = "netns";

/// Whether `set` is a masquerade set: `net4_<len>`/`net6_<len>`, or the previous layout's
/// `masq4`/`masq6`.
fn is_masq_set(set: &str) -> bool {
    set == "masq4" || set == "masq6" || set.starts_with("net4_") || set.starts_with("net6_")
}

/// One of our masquerade rules.
#[derive(Debug, Clone)]
pub struct MasqRule {
    pub rule: NftRule,
    /// `<hash16(net)>-<hash16(if:id)>`: the attachment.
    pub hash: String,
    /// (network, ifname, container id) as the comment spells them (sanitised, maybe cut).
    pub named: Option<(String, String, String)>,
    pub saddr: IpAddr,
    /// Networks left alone: the subnet first, then `nonMasqueradeCIDRs` (addresses only; the
    /// kernel keeps the prefix as a mask this reader does not decode).
    pub excluded: Vec<IpAddr>,
}

fn addr_of(b: &[u8]) -> Option<IpAddr> {
    Some(match b.len() {
        4 => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(b).ok()?)),
        16 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(b).ok()?)),
        _ => return None,
    })
}

fn parse_masq_comment(c: &str) -> Option<(String, (String, String, String))> {
    let hash = c.get(..33)?.to_string();
    let rest = c.get(33..)?.strip_prefix(", net: ")?;
    let (net, rest) = rest.split_once(", if: ")?;
    let (ifname, id) = rest.split_once(", id: ")?;
    Some((hash, (net.to_string(), ifname.to_string(), id.to_string())))
}

/// Our masquerade rules (empty when the table does not exist).
pub fn read_masq(nf: &mut NfTables) -> Result<Vec<MasqRule>> {
    let rules = nf.rules(NftFamily::Inet, firewall::MASQ_TABLE, Some(firewall::MASQ_CHAIN))?;
    let mut out = Vec::new();
    for r in rules {
        let Some(comment) = r.comment.clone() else { continue };
        let (hash, named) = match parse_masq_comment(&comment) {
            Some((h, n)) => (h, Some(n)),
            None => (comment.chars().take(33).collect(), None),
        };
        let addrs: Vec<IpAddr> = r.cmp_data().filter_map(addr_of).collect();
        let Some((saddr, excluded)) = addrs.split_first() else { continue };
        out.push(MasqRule { saddr: *saddr, excluded: excluded.to_vec(), hash, named, rule: r });
    }
    Ok(out)
}

/// A per-attachment element of our portmap table.
#[derive(Debug, Clone)]
pub struct Elem {
    pub set: String,
    pub elem: NftElem,
    pub tag: Option<String>,
}

/// A DNAT element, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dnat {
    pub tag: String,
    pub proto: String,
    pub host_port: u16,
    pub host_ip: Option<IpAddr>,
    pub ctr: IpAddr,
    pub ctr_port: u16,
}

/// A masquerade element, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Masq {
    pub tag: String,
    /// The source: the container's subnet, `127.0.0.1/32`, or everything (`/0`, `masqAll`).
    pub src: IpNet,
    pub ctr: IpAddr,
}

#[derive(Debug, Default)]
pub struct Portmap {
    pub elems: Vec<Elem>,
    pub dnat: Vec<Dnat>,
    pub masq: Vec<Masq>,
}

fn proto_name(n: u8) -> String {
    match n {
        6 => "tcp".into(),
        17 => "udp".into(),
        132 => "sctp".into(),
        n => n.to_string(),
    }
}

fn port(b: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes(b.get(..2)?.try_into().ok()?))
}

fn decode_dnat(set: &str, e: &NftElem, tag: &str) -> Option<Dnat> {
    let alen = if set.ends_with('4') { 4 } else { 16 };
    let key: Vec<&[u8]> = if set.starts_with("hip") {
        split_concat(&e.key, &[alen, 1, 2])?
    } else {
        split_concat(&e.key, &[1, 2])?
    };
    let Some(NftData::Value(v)) = &e.data else { return None };
    let data = split_concat(v, &[alen, 2])?;
    let (host_ip, rest) = if key.len() == 3 { (Some(addr_of(key[0])?), &key[1..]) } else { (None, &key[..]) };
    Some(Dnat {
        tag: tag.to_string(),
        proto: proto_name(rest[0][0]),
        host_port: port(rest[1])?,
        host_ip,
        ctr: addr_of(data[0])?,
        ctr_port: port(data[1])?,
    })
}

fn decode_masq(set: &str, e: &NftElem, tag: &str) -> Option<Masq> {
    let alen = if set.starts_with("net4") || set == "masq4" { 4 } else { 16 };
    if let Some(len) = set.strip_prefix("net4_").or(set.strip_prefix("net6_")) {
        let len: u8 = len.parse().ok()?;
        if len == 0 {
            let key = split_concat(&e.key, &[alen, 1, 2])?;
            let ctr = addr_of(key[0])?;
            let any = if ctr.is_ipv4() {
                IpAddr::V4(Ipv4Addr::UNSPECIFIED)
            } else {
                IpAddr::V6(Ipv6Addr::UNSPECIFIED)
            };
            return Some(Masq { tag: tag.to_string(), src: IpNet::new(any, 0).ok()?, ctr });
        }
        let key = split_concat(&e.key, &[alen, alen, 1, 2])?;
        return Some(Masq {
            tag: tag.to_string(),
            src: IpNet::new(addr_of(key[0])?, len).ok()?,
            ctr: addr_of(key[1])?,
        });
    }
    // the previous layout: a concatenated interval set, the source a range
    let key = split_concat(&e.key, &[alen, alen, 1, 2])?;
    let end = match &e.key_end {
        Some(k) => split_concat(k, &[alen, alen, 1, 2])?,
        None => key.clone(),
    };
    let (start, stop) = (addr_of(key[0])?, addr_of(end[0])?);
    let span = match (start, stop) {
        (IpAddr::V4(s), IpAddr::V4(e)) => u128::from(u32::from(e) ^ u32::from(s)),
        (IpAddr::V6(s), IpAddr::V6(e)) => u128::from(e) ^ u128::from(s),
        _ => return None,
    };
    let bits = if alen == 4 { 32 } else { 128 };
    let len = bits - (128 - span.leading_zeros()) as u8;
    Some(Masq { tag: tag.to_string(), src: IpNet::new(start, len).ok()?, ctr: addr_of(key[1])? })
}

/// Our portmap table (None when it does not exist).
pub fn read_portmap(nf: &mut NfTables) -> Result<Option<Portmap>> {
    if !nf.has_table(NftFamily::Inet, PORTMAP_TABLE)? {
        return Ok(None);
    }
    let mut sets: Vec<String> = PORTMAP_SETS.iter().map(|s| s.to_string()).collect();
    for r in nf.rules(NftFamily::Inet, PORTMAP_TABLE, None)? {
        for e in &r.exprs {
            if let NftExpr::Lookup { set } = e {
                if is_masq_set(set) && !sets.contains(set) {
                    sets.push(set.clone());
                }
            }
        }
    }
    let mut p = Portmap::default();
    for set in &sets {
        for e in nf.set_elements(NftFamily::Inet, PORTMAP_TABLE, set)? {
            let tag = e.comment.clone();
            if let (Some(t), true) = (&tag, set != NETNS_SET) {
                if set.starts_with("hp") || set.starts_with("hip") {
                    match decode_dnat(set, &e, t) {
                        Some(d) => p.dnat.push(d),
                        None => {
                            return Err(CniError::internal(format!(
                                "cannot decode an element of inet {PORTMAP_TABLE} {set}: the portmap layout changed? \
                                 (tools/migrate/src/ours.rs)"
                            )))
                        }
                    }
                } else if is_masq_set(set) {
                    if let Some(m) = decode_masq(set, &e, t) {
                        p.masq.push(m);
                    }
                }
            }
            p.elems.push(Elem { set: set.clone(), elem: e, tag });
        }
    }
    Ok(Some(p))
}

/// portmap's owner tag of an attachment.
pub fn owner_tag(network: &str, id: &str, ifname: &str) -> String {
    AttachmentId::new(network, id, ifname).portmap_tag()
}

/// Whether a per-attachment element belongs to `id`: by its owner tag, or (the `netns`
/// record, commented with a path) by its key, the attachment's hash.
pub fn belongs(e: &Elem, id: &AttachmentId) -> bool {
    if e.set == NETNS_SET {
        return e.elem.key == id.portmap_hash().octets();
    }
    e.tag.as_deref() == Some(id.portmap_tag().as_str())
}

/// The attachment an owner tag names: directly when the tag spells it out, else the candidate
/// whose tag it is.
pub fn resolve_tag(tag: &str, candidates: &[(String, String, String)]) -> Option<(String, String, String)> {
    let parts: Vec<&str> = tag.split(',').collect();
    if let [net, id, ifname] = parts.as_slice() {
        // `=…` is a hash of a long name (names never start with `=`)
        if !parts.iter().any(|p| p.starts_with('=')) && owner_tag(net, id, ifname) == tag {
            return Some((net.to_string(), id.to_string(), ifname.to_string()));
        }
    }
    candidates.iter().find(|(n, i, f)| owner_tag(n, i, f) == tag).cloned()
}

/// The attachment a masquerade rule belongs to: its comment when the spelled-out names hash
/// to the rule's hash, else the candidate that does.
pub fn resolve_masq(
    r: &MasqRule,
    candidates: &[(String, String, String)],
) -> Option<(String, String, String)> {
    let fits = |net: &str, id: &str, ifname: &str| AttachmentId::new(net, id, ifname).masq_tag() == r.hash;
    if let Some((net, ifname, id)) = &r.named {
        if fits(net, id, ifname) {
            return Some((net.clone(), id.clone(), ifname.clone()));
        }
    }
    candidates.iter().find(|(n, i, f)| fits(n, i, f)).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use cni_common::netlink::nft::concat;

    #[test]
    fn owner_tags_like_portmap() {
        assert_eq!(owner_tag("net", "ctr", "eth0"), "net,ctr,eth0");
        assert_eq!(owner_tag("net", "ctr", "e:0"), "net,ctr,e+3A0");
        let long = owner_tag(&"n".repeat(41), "c", "eth0");
        assert!(long.starts_with('=') && long.ends_with(",c,eth0"), "{long}");
        let cands = vec![("n".repeat(41), "c".to_string(), "eth0".to_string())];
        assert_eq!(resolve_tag(&long, &cands), Some(cands[0].clone()));
        assert_eq!(resolve_tag("net,ctr,eth0", &[]), Some(("net".into(), "ctr".into(), "eth0".into())));
        assert_eq!(resolve_tag(&long, &[]), None);
    }

    #[test]
    fn decodes_dnat_and_masq_elements() {
        let key = concat(&[&[6], &18080u16.to_be_bytes()]);
        let data = concat(&[&[10, 1, 0, 5], &80u16.to_be_bytes()]);
        let e = NftElem::new(key).data(NftData::Value(data));
        let d = decode_dnat("hp4", &e, "n,c,eth0").unwrap();
        assert_eq!((d.proto.as_str(), d.host_port, d.host_ip, d.ctr_port), ("tcp", 18080, None, 80));
        assert_eq!(d.ctr, "10.1.0.5".parse::<IpAddr>().unwrap());
        let hkey = concat(&[&[192, 0, 2, 1], &[17], &53u16.to_be_bytes()]);
        let e = NftElem::new(hkey).data(NftData::Value(concat(&[&[10, 1, 0, 5], &5353u16.to_be_bytes()])));
        let d = decode_dnat("hip4", &e, "t").unwrap();
        assert_eq!((d.proto.as_str(), d.host_ip), ("udp", Some("192.0.2.1".parse().unwrap())));
        let mk = |a: [u8; 4]| concat(&[&a, &[10, 1, 0, 5], &[6], &80u16.to_be_bytes()]);
        let e = NftElem::new(mk([10, 1, 0, 0])).key_end(mk([10, 1, 0, 255]));
        let m = decode_masq("masq4", &e, "t").unwrap();
        assert_eq!(m.src, "10.1.0.0/24".parse::<IpNet>().unwrap());
        assert!(decode_masq("masq4", &NftElem::new(vec![1, 2, 3]), "t").is_none());
        let m = decode_masq("net4_24", &NftElem::new(mk([10, 1, 0, 0])), "t").unwrap();
        assert_eq!((m.src, m.ctr), ("10.1.0.0/24".parse().unwrap(), "10.1.0.5".parse().unwrap()));
        let all = concat(&[&[10, 1, 0, 5], &[6], &80u16.to_be_bytes()]);
        let m = decode_masq("net4_0", &NftElem::new(all), "t").unwrap();
        assert_eq!(m.src.prefix_len(), 0);
    }

    #[test]
    fn masq_comment() {
        let a = AttachmentId::new("net", "ctr", "eth0");
        let (hash, named) = parse_masq_comment(&a.masq_comment()).unwrap();
        assert_eq!(hash, a.masq_tag());
        assert_eq!(named, ("net".into(), "eth0".into(), "ctr".into()));
    }
}
