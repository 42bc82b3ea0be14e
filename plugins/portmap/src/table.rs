//! The table as read from the kernel ([`Listing`]), and what one attachment wants in it
//! ([`Want`]).

use crate::config::{Conf, Fam, HostIp, Proto};
use crate::model::{Data, Elem, Hash, HostPort, Key, Masq, NsId, Set, Target};
use crate::owner::Owner;
use cni_common::netlink::nft::{NftExpr, NftRule, Verdict};
use cni_common::{CniError, Result};
use ipnet::IpNet;
use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// One mapping for one address family, resolved against the container's address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub host: HostPort,
    /// The container address with its subnet's prefix length.
    pub ctr: IpNet,
    pub ctr_port: u16,
}

impl Entry {
    pub fn target(&self) -> Target {
        Target { ip: self.ctr.addr(), port: self.ctr_port }
    }
}

/// Whether entry `e` is one of mapping `m`'s.
pub fn covers(e: &Entry, m: &crate::config::Mapping) -> bool {
    let ip = match m.host_ip {
        HostIp::Any => e.host.ip.is_none(),
        HostIp::AnyOf(f) => e.host.fam == f && e.host.ip.is_none(),
        HostIp::Addr(ip) => e.host.ip == Some(ip),
    };
    ip && e.host.port == m.host_port && e.host.proto == m.proto && e.ctr_port == m.container_port
}

/// Expand the mappings for the container's addresses. A hostIP of the other family is
/// skipped for that family, like upstream.
pub fn entries(conf: &Conf, v4: Option<IpNet>, v6: Option<IpNet>) -> Result<Vec<Entry>> {
    let mut out: Vec<Entry> = Vec::new();
    for m in &conf.mappings {
        for (fam, ctr) in [(Fam::V4, v4), (Fam::V6, v6)] {
            let Some(ctr) = ctr else { continue };
            let ip = match m.host_ip {
                HostIp::Any => None,
                HostIp::AnyOf(f) if f == fam => None,
                HostIp::AnyOf(_) => continue,
                HostIp::Addr(ip) if Fam::of(&ip) == fam => Some(ip),
                HostIp::Addr(_) => continue,
            };
            let e = Entry {
                host: HostPort { fam, ip, proto: m.proto, port: m.host_port },
                ctr,
                ctr_port: m.container_port,
            };
            if out.contains(&e) {
                continue;
            }
            if let Some(o) = out.iter().find(|o| o.host == e.host) {
                return Err(CniError::config(format!(
                    "runtimeConfig.portMappings maps host port {}/{} twice (to container ports {} and {}), \
                     once with hostIP \"\" and once with an unspecified hostIP of the same family",
                    e.host.proto.as_str(),
                    e.host.port,
                    o.ctr_port,
                    e.ctr_port
                )));
            }
            out.push(e);
        }
    }
    Ok(out)
}

/// The masquerade elements of an entry: from everywhere (`masqAll`), or from the container's
/// subnet and, for IPv4, from `127.0.0.1` (`snat`).
fn masq_elements(conf: &Conf, e: &Entry) -> Vec<Masq> {
    let m = |src: IpNet| Masq::new(src, e.ctr.addr(), e.host.proto, e.ctr_port);
    if conf.masq_all {
        let all = match e.host.fam {
            Fam::V4 => IpNet::new(Ipv4Addr::UNSPECIFIED.into(), 0),
            Fam::V6 => IpNet::new(Ipv6Addr::UNSPECIFIED.into(), 0),
        };
        vec![m(all.expect("a valid prefix"))]
    } else if conf.snat {
        let mut v = vec![m(e.ctr)];
        if e.host.fam == Fam::V4 {
            v.push(m(IpNet::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 32).expect("a valid prefix")));
        }
        v
    } else {
        Vec::new()
    }
}

/// The elements of one attachment's mappings, owner claims first (the netns record apart).
pub fn elements(conf: &Conf, entries: &[Entry], owner: &Owner) -> Vec<Elem> {
    let mut out: Vec<Elem> = Vec::new();
    let mut push = |e: Elem| {
        if !out.contains(&e) {
            out.push(e);
        }
    };
    for e in entries {
        push(Elem::owner(e.host, owner.hash));
    }
    for e in entries {
        push(Elem::claim(e.host, owner.hash, e.target()));
    }
    for e in entries {
        push(Elem::dnat(e.host, e.target()));
    }
    for e in entries {
        for m in masq_elements(conf, e) {
            push(Elem::masq(m));
        }
    }
    out
}

/// What one attachment wants in the table: its elements (commented with its tag) and the
/// record of its network namespace (commented with the namespace's path).
#[derive(Debug, Clone)]
pub struct Want {
    pub tag: String,
    pub hash: Hash,
    pub elems: Vec<Elem>,
    /// The namespace's identity and path (empty when not recorded, see [`crate::netns`]).
    pub netns: Option<(NsId, String)>,
}

impl Want {
    /// Every element with its comment, the netns record last.
    pub fn all(&self) -> Vec<(Elem, String)> {
        let mut v: Vec<(Elem, String)> = self.elems.iter().map(|e| (*e, self.tag.clone())).collect();
        if let Some((id, path)) = &self.netns {
            v.push((Elem::netns(self.hash, *id), path.clone()));
        }
        v
    }

    /// The prefix lengths of the masquerade sets the elements need.
    pub fn net_lens(&self) -> BTreeSet<(Fam, u8)> {
        net_lens(self.elems.iter())
    }
}

/// The prefix lengths of the masquerade sets `elems` use.
pub fn net_lens<'a>(elems: impl IntoIterator<Item = &'a Elem>) -> BTreeSet<(Fam, u8)> {
    elems
        .into_iter()
        .filter_map(|e| match e.key {
            Key::Masq(m) => Some((m.fam(), m.src.prefix_len())),
            _ => None,
        })
        .collect()
}

/// An element as read from the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub elem: Elem,
    pub comment: Option<String>,
    /// Not in the kernel yet: converted from the previous layout's sets, written by the next
    /// transaction that migrates the table (see [`crate::legacy`]).
    pub pending: bool,
}

impl Listed {
    pub fn new(elem: Elem, comment: Option<String>) -> Listed {
        Listed { elem, comment, pending: false }
    }

    /// The hash of the attachment an element names: its claimant (`claims`), its holder
    /// (`owner`) or its attachment (`netns`).
    pub fn hash(&self) -> Option<Hash> {
        match (self.elem.key, self.elem.data) {
            (Key::Claim(_, h), _) | (Key::Netns(h), _) | (Key::Owner(_), Some(Data::Hash(h))) => Some(h),
            _ => None,
        }
    }
}

/// One attachment's claim on a host port (a `claims` element).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub port: HostPort,
    /// The claimant's hash (its exclusive `owner` value).
    pub hash: Hash,
    pub target: Target,
    /// The claimant's owner tag.
    pub tag: String,
}

/// The parts of the table we reason about.
#[derive(Debug, Default)]
pub struct Listing {
    elems: Vec<Listed>,
    index: HashMap<Key, usize>,
    pub chains: Vec<String>,
    pub rules: Vec<NftRule>,
    /// The `gates` map: nfproto → verdict.
    pub gates: Vec<(u8, Verdict)>,
    /// The `conditions` map: nfproto → the value naming its gate chain (empty when the
    /// table was made before the map existed).
    pub conditions: Vec<(u8, Hash)>,
    /// Sets of the previous layout still in the table (`masq4`, `masq6`): the next
    /// transaction that rebuilds the masquerade part deletes them.
    pub legacy_sets: Vec<String>,
}

impl Listing {
    /// Add an element; a second element with the same key is dropped (a set holds a key once;
    /// a converted element never displaces one that is in the kernel).
    pub fn push(&mut self, l: Listed) {
        if self.index.contains_key(&l.elem.key) {
            return;
        }
        self.index.insert(l.elem.key, self.elems.len());
        self.elems.push(l);
    }

    pub fn elems(&self) -> &[Listed] {
        &self.elems
    }

    pub fn find(&self, key: &Key) -> Option<&Listed> {
        self.index.get(key).map(|&i| &self.elems[i])
    }

    /// Every `claims` element: who wants which host port, and where it should lead.
    pub fn claims(&self) -> Vec<Claim> {
        self.elems
            .iter()
            .filter_map(|x| match (x.elem.key, x.elem.target()) {
                (Key::Claim(port, hash), Some(target)) => {
                    Some(Claim { port, hash, target, tag: x.comment.clone().unwrap_or_default() })
                }
                _ => None,
            })
            .collect()
    }

    /// The recorded network namespace of an attachment: identity and path.
    pub fn netns_record(&self, attachment: Hash) -> Option<(NsId, String)> {
        let x = self.find(&Key::Netns(attachment))?;
        match x.elem.data {
            Some(Data::Netns(id)) => Some((id, x.comment.clone().unwrap_or_default())),
            _ => None,
        }
    }

    pub fn gate_chains(&self) -> Vec<String> {
        self.chains.iter().filter(|c| c.starts_with("gate4") || c.starts_with("gate6")).cloned().collect()
    }

    pub fn uses_set(&self, chain: &str, set: &str) -> bool {
        self.rules.iter().any(|r| r.chain == chain && r.uses_set(set))
    }

    pub fn jumps_to(&self, chain: &str, target: &str) -> bool {
        self.rules
            .iter()
            .any(|r| r.chain == chain && r.verdicts().any(|v| *v == Verdict::Jump(target.to_string())))
    }

    /// The sets the rules of the table look elements up in.
    pub fn sets_in_rules(&self) -> BTreeSet<String> {
        self.rules
            .iter()
            .flat_map(|r| r.exprs.iter())
            .filter_map(|e| match e {
                NftExpr::Lookup { set } => Some(set.clone()),
                _ => None,
            })
            .collect()
    }

    /// The prefix lengths of the masquerade sets the table has (and needs, for its elements).
    pub fn net_lens(&self) -> BTreeSet<(Fam, u8)> {
        let mut lens: BTreeSet<(Fam, u8)> = self
            .sets_in_rules()
            .iter()
            .filter_map(|s| match Set::parse(s) {
                Some(Set::Net(f, len)) => Some((f, len)),
                _ => None,
            })
            .collect();
        lens.extend(net_lens(self.elems.iter().map(|x| &x.elem)));
        lens
    }

    /// How many elements would be left after `deleted` go and `added` come.
    pub fn remaining(&self, deleted: usize, added: usize) -> usize {
        (self.elems.len() + added).saturating_sub(deleted)
    }
}

/// Host ports (family, port) of UDP DNAT elements, to flush conntrack for.
pub fn udp_ports<'a>(keys: impl IntoIterator<Item = &'a Key>) -> BTreeSet<(Fam, u16)> {
    keys.into_iter()
        .filter_map(|k| match k {
            Key::Dnat(hp) if hp.proto == Proto::Udp => Some((hp.fam, hp.port)),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use crate::config::Mapping;
    use cni_common::spec::config::PortMapConf;

    pub fn conf(mappings: Vec<Mapping>) -> Conf {
        let mut c = Conf::from_raw(&PortMapConf::default()).unwrap();
        c.mappings = mappings;
        c
    }

    pub fn m(host: u16, ctr: u16, proto: Proto, host_ip: HostIp) -> Mapping {
        Mapping { host_port: host, container_port: ctr, proto, host_ip }
    }

    #[test]
    fn elements_for_dual_stack_with_host_ips() {
        let c = conf(vec![
            m(8080, 80, Proto::Tcp, HostIp::Any),
            m(53, 53, Proto::Udp, HostIp::Addr("192.0.2.1".parse().unwrap())),
            m(9000, 90, Proto::Tcp, HostIp::AnyOf(Fam::V6)),
        ]);
        let v4: IpNet = "10.0.0.5/24".parse().unwrap();
        let v6: IpNet = "fd00::5/64".parse().unwrap();
        let en = entries(&c, Some(v4), Some(v6)).unwrap();
        assert_eq!(en.len(), 4, "{en:?}");
        let o = Owner::new("n", "c", "eth0");
        let keys: Vec<String> = elements(&c, &en, &o)
            .iter()
            .map(|e| match e.data {
                Some(_) => format!("{e} : {}", e.data_text()),
                None => e.to_string(),
            })
            .collect();
        let h = o.hash.to_string();
        assert_eq!(
            keys,
            vec![
                format!("owner {{ ::ffff:0.0.0.0 . tcp . 8080 }} : {h}"),
                format!("owner {{ :: . tcp . 8080 }} : {h}"),
                format!("owner {{ ::ffff:192.0.2.1 . udp . 53 }} : {h}"),
                format!("owner {{ :: . tcp . 9000 }} : {h}"),
                format!("claims {{ ::ffff:0.0.0.0 . tcp . 8080 . {h} }} : ::ffff:10.0.0.5 . 80"),
                format!("claims {{ :: . tcp . 8080 . {h} }} : fd00::5 . 80"),
                format!("claims {{ ::ffff:192.0.2.1 . udp . 53 . {h} }} : ::ffff:10.0.0.5 . 53"),
                format!("claims {{ :: . tcp . 9000 . {h} }} : fd00::5 . 90"),
                "hp4 { tcp . 8080 } : 10.0.0.5 . 80".to_string(),
                "hp6 { tcp . 8080 } : fd00::5 . 80".to_string(),
                "hip4 { 192.0.2.1 . udp . 53 } : 10.0.0.5 . 53".to_string(),
                "hp6 { tcp . 9000 } : fd00::5 . 90".to_string(),
                "net4_24 { 10.0.0.0 . 10.0.0.5 . tcp . 80 }".to_string(),
                "net4_32 { 127.0.0.1 . 10.0.0.5 . tcp . 80 }".to_string(),
                "net6_64 { fd00:: . fd00::5 . tcp . 80 }".to_string(),
                "net4_24 { 10.0.0.0 . 10.0.0.5 . udp . 53 }".to_string(),
                "net4_32 { 127.0.0.1 . 10.0.0.5 . udp . 53 }".to_string(),
                "net6_64 { fd00:: . fd00::5 . tcp . 90 }".to_string(),
            ]
        );
        // the v4 host IP is skipped for a v6-only container
        assert_eq!(entries(&c, None, Some(v6)).unwrap().len(), 2);
    }

    #[test]
    fn masq_all_and_no_snat() {
        let mut c = conf(vec![m(80, 80, Proto::Tcp, HostIp::Any)]);
        let v4: IpNet = "10.0.0.5/32".parse().unwrap();
        let o = Owner::new("n", "c", "eth0");
        c.masq_all = true;
        let en = entries(&c, Some(v4), None).unwrap();
        let el = elements(&c, &en, &o);
        assert_eq!(el.last().unwrap().to_string(), "net4_0 { 10.0.0.5 . tcp . 80 }");
        c.masq_all = false;
        let el = elements(&c, &en, &o);
        let masq: Vec<String> =
            el.iter().filter(|e| matches!(e.key, Key::Masq(_))).map(|e| e.to_string()).collect();
        assert_eq!(
            masq,
            ["net4_32 { 10.0.0.5 . 10.0.0.5 . tcp . 80 }", "net4_32 { 127.0.0.1 . 10.0.0.5 . tcp . 80 }"]
        );
        assert_eq!(net_lens(el.iter()), BTreeSet::from([(Fam::V4, 32)]));
        c.snat = false;
        assert!(elements(&c, &en, &o).iter().all(|e| !matches!(e.key, Key::Masq(_))));
    }

    #[test]
    fn conflicting_entries_within_one_request() {
        let c = conf(vec![m(80, 80, Proto::Tcp, HostIp::Any), m(80, 81, Proto::Tcp, HostIp::AnyOf(Fam::V4))]);
        let e = entries(&c, Some("10.0.0.5/24".parse().unwrap()), None).unwrap_err();
        assert_eq!(e.code, 7);
    }
}
