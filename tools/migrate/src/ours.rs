//! Reading this suite's own nftables state, for `to-upstream`.
//!
//! - bridge `ipMasq`: table `inet cni_plugins_masquerade`, chain `masq_checks`, one rule per
//!   container address (`ip saddr A ip daddr != SUBNET … masquerade`) commented
//!   `<masq_tag>, net: N, if: I, id: C` (plugins/bridge/src/firewall/mod.rs);
//! - portmap: read and decoded by portmap's own library (`portmap::state`): every attachment
//!   with its host ports (its claims) and masquerade elements, by owner tag.
use bridge::firewall;
use cni_common::attachment::AttachmentId;
use cni_common::netlink::nft::{NfTables, NftFamily, NftRule};
use cni_common::{CniError, Result};
use ipnet::IpNet;
use portmap::identity::PortmapIdentity;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

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

/// A host port of an attachment, decoded.
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

/// Our portmap table's attachments.
#[derive(Debug, Default)]
pub struct Portmap {
    /// Owner tags of every attachment holding something.
    pub tags: Vec<String>,
    pub dnat: Vec<Dnat>,
    pub masq: Vec<Masq>,
}

/// Our portmap table as portmap's library reads it (None when it does not exist).
pub fn read_portmap() -> Result<Option<Portmap>> {
    let mut k = portmap::kernel::Netlink::new()?;
    let s = portmap::kernel::Kernel::read(&mut k, &portmap::state::Scope::Full).map_err(CniError::from)?;
    if !s.found.table {
        return Ok(None);
    }
    let mut p = Portmap::default();
    for h in s.held() {
        for (hp, t) in &h.claims {
            p.dnat.push(Dnat {
                tag: h.tag.clone(),
                proto: hp.proto.as_str().into(),
                host_port: hp.port,
                host_ip: hp.ip,
                ctr: t.ip,
                ctr_port: t.port,
            });
        }
        p.masq.extend(h.masq.iter().map(|m| Masq { tag: h.tag.clone(), src: m.src, ctr: m.ctr }));
        p.tags.push(h.tag);
    }
    Ok(Some(p))
}

/// Remove everything of the attachments `ids` from our portmap table (portmap's own DEL), then
/// the table when no attachment is left in it.
pub fn remove_portmap(ids: &[AttachmentId]) -> Result<()> {
    let Ok(mut k) = portmap::kernel::Netlink::new() else { return Ok(()) };
    for id in ids {
        portmap::flow::del(&mut k, &portmap::model::Owner::of(id), None)?;
    }
    portmap::flow::drop_if_unused(&mut k)
}

/// portmap's owner tag of an attachment.
pub fn owner_tag(network: &str, id: &str, ifname: &str) -> String {
    AttachmentId::new(network, id, ifname).portmap_tag()
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
    fn masq_comment() {
        let a = AttachmentId::new("net", "ctr", "eth0");
        let (hash, named) = parse_masq_comment(&a.masq_comment()).unwrap();
        assert_eq!(hash, a.masq_tag());
        assert_eq!(named, ("net".into(), "eth0".into(), "ctr".into()));
    }
}
