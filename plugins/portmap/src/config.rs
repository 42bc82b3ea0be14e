//! portmap's configuration and what one attachment wants.
//!
//! [`Conf`] validates the keys for ADD, CHECK and STATUS (everything is checked before the
//! kernel is touched); [`Teardown`] reads them as DEL and GC must (values ADD refuses but that
//! are harmless are ignored with a note). [`Intent`] is the attachment's desired state: its
//! host ports resolved against the container addresses of prevResult, the masquerade elements
//! `snat`/`masqAll` ask for, and the record of its network namespace. Pure: nothing here reads
//! the kernel.

use crate::model::{Elem, Hash, HostPort, Masq, NsId, Owner, Target};
use cni_common::net::{container_addrs, Family, Proto};
use cni_common::spec::config::PortMapping;
use cni_common::spec::result::CniResult;
use cni_common::{CniError, Result};
use ipnet::IpNet;
use serde::Deserialize;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// portmap's configuration keys (upstream's `PortMapConf`), as the JSON gives them: read by the
/// plugin's [`Conf`] and [`Teardown`], which validate them their own way, and by
/// [`crate::upstream`], which reads them as upstream's portmap does.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct PortMapConf {
    #[serde(default)]
    pub snat: Option<bool>,
    #[serde(rename = "masqAll", default)]
    pub masq_all: bool,
    #[serde(rename = "conditionsV4", default)]
    pub conditions_v4: Option<Vec<String>>,
    #[serde(rename = "conditionsV6", default)]
    pub conditions_v6: Option<Vec<String>>,
    #[serde(rename = "markMasqBit", default)]
    pub mark_masq_bit: Option<i64>,
    #[serde(rename = "externalSetMarkChain", default)]
    pub external_set_mark_chain: Option<String>,
    #[serde(default)]
    pub backend: Option<String>,
    #[serde(rename = "runtimeConfig", default)]
    pub runtime_config: Option<PortMapRuntime>,
}

/// portmap's `runtimeConfig`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct PortMapRuntime {
    #[serde(rename = "portMappings", default)]
    pub port_mappings: Option<Vec<PortMapping>>,
}

impl PortMapConf {
    /// `snat`, on unless set to false.
    pub fn snat(&self) -> bool {
        self.snat.unwrap_or(true)
    }

    /// `runtimeConfig.portMappings` (none when absent).
    pub fn mappings(&self) -> &[PortMapping] {
        self.runtime_config.as_ref().and_then(|r| r.port_mappings.as_deref()).unwrap_or_default()
    }
}

/// Which host addresses a mapping listens on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HostIp {
    /// No `hostIP`: both families.
    Any,
    /// `0.0.0.0` or `::`: every address of that family.
    AnyOf(Family),
    /// One address.
    Addr(IpAddr),
}

/// One validated `runtimeConfig.portMappings` entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Mapping {
    pub host_port: u16,
    pub container_port: u16,
    pub proto: Proto,
    pub host_ip: HostIp,
}

/// `conditionsV4`/`conditionsV6`: nft match tokens in front of the host-port lookup.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Conditions {
    pub v4: Vec<String>,
    pub v6: Vec<String>,
}

impl Conditions {
    pub fn of(&self, fam: Family) -> &[String] {
        match fam {
            Family::V4 => &self.v4,
            Family::V6 => &self.v6,
        }
    }
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Conf {
    pub snat: bool,
    pub masq_all: bool,
    pub conditions: Conditions,
    pub mappings: Vec<Mapping>,
    /// Notes for stderr (ignored iptables-only keys).
    pub notes: Vec<String>,
}

fn port(field: &str, i: usize, v: i64) -> Result<u16> {
    if (1..=65535).contains(&v) {
        Ok(v as u16)
    } else {
        Err(CniError::config(format!(
            "runtimeConfig.portMappings[{i}].{field} is {v}: a port must be between 1 and 65535"
        )))
    }
}

fn proto(i: usize, p: &str) -> Result<Proto> {
    Proto::parse(p).ok_or_else(|| {
        CniError::unsupported_field(
            &format!("runtimeConfig.portMappings[{i}].protocol"),
            format!("{p:?}"),
            "use \"tcp\", \"udp\" or \"sctp\"",
        )
    })
}

fn host_ip(i: usize, s: &str) -> Result<HostIp> {
    if s.is_empty() {
        return Ok(HostIp::Any);
    }
    let ip: IpAddr = s.parse().map_err(|_| {
        CniError::config(format!("runtimeConfig.portMappings[{i}].hostIP {s:?} is not an IP address"))
    })?;
    let ip = ip.to_canonical(); // ::ffff:a.b.c.d is an IPv4 address
    if ip.is_unspecified() {
        return Ok(HostIp::AnyOf(Family::of(&ip)));
    }
    if ip.is_multicast() {
        return Err(CniError::config(format!(
            "runtimeConfig.portMappings[{i}].hostIP {s:?} is a multicast address: name a unicast address of this host"
        )));
    }
    Ok(HostIp::Addr(ip))
}

fn mapping(i: usize, m: &PortMapping) -> Result<Mapping> {
    Ok(Mapping {
        host_port: port("hostPort", i, m.host_port)?,
        container_port: port("containerPort", i, m.container_port)?,
        proto: proto(i, &m.protocol)?,
        host_ip: host_ip(i, &m.host_ip)?,
    })
}

/// Conditions are nft tokens inserted verbatim into one rule: what could end that rule or
/// start another statement is hostile, on every verb (even those that never use them).
fn hostile_conditions(field: &str, list: &[String]) -> Result<()> {
    for tok in list {
        if tok.chars().any(|c| matches!(c, ';' | '\n' | '\r' | '#' | '\0')) || tok.trim().is_empty() {
            return Err(CniError::config(format!(
                "{field} token {tok:?} is not allowed: tokens must be non-empty and must not contain ';', '#' or line breaks"
            )));
        }
    }
    Ok(())
}

/// iptables-style conditions (the upstream iptables backend's), which ADD cannot use.
fn iptables_conditions(list: &[String]) -> bool {
    list.first().is_some_and(|first| first.starts_with('-') || first.starts_with('!'))
}

fn conditions(field: &str, list: Option<&[String]>) -> Result<Vec<String>> {
    let list = list.unwrap_or_default();
    if iptables_conditions(list) {
        return Err(CniError::unsupported_field(
            field,
            format!("{list:?}"),
            "these are iptables match options; this portmap uses nftables, so write them in nft syntax \
             (e.g. [\"ip\", \"daddr\", \"!=\", \"192.0.2.10\"])",
        ));
    }
    hostile_conditions(field, list)?;
    Ok(list.to_vec())
}

fn backend(raw: Option<&str>) -> Result<()> {
    match raw {
        None | Some("") | Some("nftables") => Ok(()),
        Some("iptables") => Err(CniError::unsupported_field(
            "backend",
            "\"iptables\"",
            "this portmap implements only the nftables backend; remove the key or set it to \"nftables\"",
        )),
        Some(other) => Err(CniError::unsupported_field(
            "backend",
            format!("{other:?}"),
            "the only supported backend is \"nftables\"",
        )),
    }
}

/// The mappings of `list`, refusing a host port mapped to two container ports.
fn mappings(list: &[PortMapping]) -> Result<Vec<Mapping>> {
    let mut out: Vec<Mapping> = Vec::with_capacity(list.len());
    // (host port, protocol, host IP) → container port: linear in the number of mappings
    let mut seen: HashMap<(u16, Proto, HostIp), u16> = HashMap::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let mapping = mapping(i, m)?;
        match seen.get(&(mapping.host_port, mapping.proto, mapping.host_ip)) {
            Some(p) if *p == mapping.container_port => continue, // an exact repeat changes nothing
            Some(p) => {
                return Err(CniError::config(format!(
                    "runtimeConfig.portMappings[{i}] maps host port {}/{} again (already mapped to container port {p}): \
                     a host port can go to one container port only",
                    mapping.proto.as_str(),
                    mapping.host_port,
                )))
            }
            None => {}
        }
        seen.insert((mapping.host_port, mapping.proto, mapping.host_ip), mapping.container_port);
        out.push(mapping);
    }
    Ok(out)
}

impl Conf {
    /// The configuration as ADD, CHECK and STATUS need it: everything checked.
    pub fn from_raw(raw: &PortMapConf) -> Result<Conf> {
        let mut notes = Vec::new();
        backend(raw.backend.as_deref())?;
        if let Some(chain) = &raw.external_set_mark_chain {
            notes.push(format!(
                "portmap: note: externalSetMarkChain {chain:?} is an iptables-backend option and is ignored: \
                 the nftables rules masquerade without packet marks"
            ));
        }
        if let Some(bit) = raw.mark_masq_bit {
            if !(0..=31).contains(&bit) {
                return Err(CniError::config(format!("markMasqBit is {bit}: it must be between 0 and 31")));
            }
            notes.push(format!(
                "portmap: note: markMasqBit {bit} is an iptables-backend option and is ignored: \
                 the nftables rules masquerade without packet marks"
            ));
        }
        let conditions = Conditions {
            v4: conditions("conditionsV4", raw.conditions_v4.as_deref())?,
            v6: conditions("conditionsV6", raw.conditions_v6.as_deref())?,
        };
        Ok(Conf {
            snat: raw.snat(),
            masq_all: raw.masq_all,
            conditions,
            mappings: mappings(raw.mappings())?,
            notes,
        })
    }
}

/// What DEL and GC need from the configuration. Runtimes DEL with the configuration they
/// cached at ADD time, which upstream accepted: values ADD refuses but that are harmless here
/// (`backend: "iptables"`, iptables-syntax conditions, iptables-only keys out of range,
/// mappings with an unknown protocol or an invalid port or host IP) are ignored with a note,
/// never a failure. Hostile values (condition tokens that would end an nft statement) are
/// refused on every verb, before anything is touched.
#[derive(Debug, Clone, Default)]
pub struct Teardown {
    /// Whether the configuration lists any mapping at all (DEL returns at once otherwise).
    pub listed: bool,
    /// The mappings, when every listed one is valid (then DEL can name each element);
    /// None when some are not (DEL then removes whatever carries the attachment's tag).
    pub mappings: Option<Vec<Mapping>>,
    /// `snat` and `masqAll`, for naming the masquerade elements.
    pub snat: bool,
    pub masq_all: bool,
    pub notes: Vec<String>,
}

impl Teardown {
    pub fn from_raw(raw: &PortMapConf, verb: &str) -> Result<Teardown> {
        let mut notes = Vec::new();
        let benign = |what: String, e: CniError| {
            format!("portmap: note: {verb} ignores {what}, which ADD would refuse ({})", e.msg)
        };
        if let Err(e) = backend(raw.backend.as_deref()) {
            notes.push(benign(format!("backend {:?}", raw.backend.as_deref().unwrap_or_default()), e));
        }
        for (field, list) in [("conditionsV4", &raw.conditions_v4), ("conditionsV6", &raw.conditions_v6)] {
            let list = list.as_deref().unwrap_or_default();
            hostile_conditions(field, list)?;
            if iptables_conditions(list) {
                notes.push(format!(
                    "portmap: note: {verb} ignores the iptables-syntax {field} {list:?}, which ADD would refuse"
                ));
            }
        }
        if let Some(bit) = raw.mark_masq_bit.filter(|b| !(0..=31).contains(b)) {
            notes.push(format!("portmap: note: {verb} ignores markMasqBit {bit}, which ADD would refuse"));
        }
        let list = raw.mappings();
        let mappings = match mappings(list) {
            Ok(m) => Some(m),
            Err(e) => {
                notes.push(benign("the port mappings".into(), e));
                None
            }
        };
        Ok(Teardown { listed: !list.is_empty(), mappings, snat: raw.snat(), masq_all: raw.masq_all, notes })
    }

    /// The configuration of the elements DEL names (no conditions: DEL never touches them).
    pub fn conf(&self) -> Option<Conf> {
        Some(Conf {
            snat: self.snat,
            masq_all: self.masq_all,
            conditions: Conditions::default(),
            mappings: self.mappings.clone()?,
            notes: Vec::new(),
        })
    }
}

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

/// Expand the mappings for the container's addresses. A hostIP of the other family is
/// skipped for that family, like upstream.
fn entries(conf: &Conf, v4: Option<IpNet>, v6: Option<IpNet>) -> Result<Vec<Entry>> {
    let mut out: Vec<Entry> = Vec::new();
    let mut seen: HashMap<HostPort, u16> = HashMap::new();
    for m in &conf.mappings {
        for (fam, ctr) in [(Family::V4, v4), (Family::V6, v6)] {
            let Some(ctr) = ctr else { continue };
            let ip = match m.host_ip {
                HostIp::Any => None,
                HostIp::AnyOf(f) if f == fam => None,
                HostIp::AnyOf(_) => continue,
                HostIp::Addr(ip) if Family::of(&ip) == fam => Some(ip),
                HostIp::Addr(_) => continue,
            };
            let e = Entry {
                host: HostPort { fam, ip, proto: m.proto, port: m.host_port },
                ctr,
                ctr_port: m.container_port,
            };
            match seen.get(&e.host) {
                Some(p) if *p == e.ctr_port => continue,
                Some(p) => {
                    return Err(CniError::config(format!(
                    "runtimeConfig.portMappings maps host port {}/{} twice (to container ports {p} and {}), \
                         once with hostIP \"\" and once with an unspecified hostIP of the same family",
                    e.host.proto.as_str(),
                    e.host.port,
                    e.ctr_port
                )))
                }
                None => {}
            }
            seen.insert(e.host, e.ctr_port);
            out.push(e);
        }
    }
    Ok(out)
}

/// The masquerade elements of an entry, as upstream's rules: with `snat`, from every source
/// (`masqAll`) or from the container's subnet and, for IPv4, from `127.0.0.1`; without
/// `snat`, none (`masqAll` applies only with `snat`, as upstream).
fn masq_of(conf: &Conf, e: &Entry) -> Vec<Masq> {
    let m = |src: IpNet| Masq::new(src, e.ctr.addr(), e.host.proto, e.ctr_port);
    if !conf.snat {
        return Vec::new();
    }
    if conf.masq_all {
        let all = match e.host.fam {
            Family::V4 => IpNet::new(Ipv4Addr::UNSPECIFIED.into(), 0),
            Family::V6 => IpNet::new(Ipv6Addr::UNSPECIFIED.into(), 0),
        };
        return vec![m(all.expect("a valid prefix"))];
    }
    let mut v = vec![m(e.ctr)];
    if e.host.fam == Family::V4 {
        v.push(m(IpNet::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 32).expect("a valid prefix")));
    }
    v
}

/// Prefix lengths (per family) of masquerade sets.
pub type Lens = BTreeSet<(Family, u8)>;

/// What one attachment wants in the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Intent {
    pub owner: Owner,
    pub entries: Vec<Entry>,
    pub masq: Vec<Masq>,
    /// The identity and path of the attachment's network namespace (the path empty when it
    /// cannot be recorded; None when there is no namespace to record).
    pub netns: Option<(NsId, String)>,
}

/// Why a container address cannot be a DNAT target (issue 27 finding 4): one of the host's
/// loopback addresses, unspecified, multicast, broadcast or link-local (an IPv4-mapped IPv6
/// address as the IPv4 address it maps). Addresses local to the host are refused by the
/// plugin, which asks the kernel ([`crate::localnet::best_route`]).
pub fn unfit_target(ip: IpAddr) -> Option<&'static str> {
    let ip = ip.to_canonical();
    match ip {
        _ if ip.is_loopback() => Some("a loopback address"),
        _ if ip.is_unspecified() => Some("the unspecified address"),
        _ if ip.is_multicast() => Some("a multicast address"),
        IpAddr::V4(a) if a.is_broadcast() => Some("the broadcast address"),
        IpAddr::V4(a) if a.is_link_local() => Some("a link-local address"),
        IpAddr::V6(a) if a.is_unicast_link_local() => Some("a link-local address"),
        _ => None,
    }
}

impl Intent {
    /// The intent of an attachment with configuration `conf` and prevResult `prev`, and notes
    /// on mappings that do not apply to the container's address family. Fails (code 7) when
    /// prevResult gives the container no address the mappings can use: the host ports would
    /// silently not work.
    pub fn new(
        conf: &Conf,
        prev: &CniResult,
        ifname: &str,
        owner: Owner,
        netns: Option<(NsId, String)>,
    ) -> Result<(Intent, Vec<String>)> {
        let (v4, v6) = container_addrs(prev, ifname)?;
        for a in [v4, v6].into_iter().flatten() {
            if let Some(why) = unfit_target(a.addr()) {
                return Err(CniError::config(format!(
                    "prevResult gives interface {ifname:?} the address {a}, which is {why}: host ports are \
                     never forwarded to it (a DNAT there would lead into the host itself or nowhere)"
                )));
            }
        }
        if v4.is_none() && v6.is_none() {
            return Err(CniError::config(format!(
                "prevResult has no address for interface {ifname:?} (an IP whose \"interface\" is that \
                 container interface, or has none): the host ports cannot be forwarded"
            )));
        }
        let entries = entries(conf, v4, v6)?;
        let mut notes = Vec::new();
        for (i, m) in conf.mappings.iter().enumerate() {
            let has = |f: Family| if f == Family::V4 { v4.is_some() } else { v6.is_some() };
            let covered = match m.host_ip {
                HostIp::Any => true,
                HostIp::AnyOf(f) => has(f),
                HostIp::Addr(ip) => has(Family::of(&ip)),
            };
            if covered {
                continue;
            }
            let fam = if v4.is_some() { "IPv4" } else { "IPv6" };
            let msg = format!(
                "runtimeConfig.portMappings[{i}] (host port {}/{}) names a hostIP of another family \
                 than the container's {fam} address",
                m.proto.as_str(),
                m.host_port
            );
            if entries.is_empty() {
                return Err(CniError::config(format!("{msg}: nothing would be forwarded")));
            }
            notes.push(format!("portmap: note: {msg}; it is not forwarded"));
        }
        let mut seen: HashSet<Masq> = HashSet::new();
        let masq: Vec<Masq> =
            entries.iter().flat_map(|e| masq_of(conf, e)).filter(|m| seen.insert(*m)).collect();
        Ok((Intent { owner, entries, masq, netns }, notes))
    }

    /// The host ports.
    pub fn ports(&self) -> impl Iterator<Item = HostPort> + '_ {
        self.entries.iter().map(|e| e.host)
    }

    /// The attachment's `claims` elements: where each of its host ports should lead.
    pub fn claims(&self) -> impl Iterator<Item = Elem> + '_ {
        self.entries.iter().map(|e| Elem::claim(e.host, self.owner.hash, e.target()))
    }

    /// The masquerade elements.
    pub fn masq_elems(&self) -> impl Iterator<Item = Elem> + '_ {
        self.masq.iter().map(|m| Elem::masq(*m))
    }

    /// The fingerprint of the mappings (claims and masquerade elements): what the attachment's
    /// `attachments` record holds, so that a later verb can tell whether the mappings it is
    /// given are all the attachment has.
    pub fn fingerprint(&self) -> Hash {
        fingerprint(self.claims().chain(self.masq_elems()))
    }

    /// The record of the attachment: `attachments { hash : fingerprint }`.
    pub fn record(&self) -> Elem {
        Elem::attachment(self.owner.hash, self.fingerprint())
    }

    /// Every element of the attachment when it holds each of its host ports alone (the
    /// common case): owner claims, claims, DNAT elements, masquerade elements and its record.
    /// The netns record apart (its comment is the path, not the tag).
    pub fn sole_elements(&self) -> Vec<Elem> {
        let h = self.owner.hash;
        let mut v: Vec<Elem> = self.entries.iter().map(|e| Elem::owner(e.host, h)).collect();
        v.extend(self.claims());
        v.extend(self.entries.iter().map(|e| Elem::dnat(e.host, e.target())));
        v.extend(self.masq_elems());
        v.push(self.record());
        v
    }

    /// The netns record, with its comment (the path).
    pub fn netns_elem(&self) -> Option<(Elem, String)> {
        self.netns.as_ref().map(|(id, path)| (Elem::netns(self.owner.hash, *id), path.clone()))
    }

    /// The prefix lengths of the masquerade sets the attachment needs.
    pub fn lens(&self) -> Lens {
        self.masq.iter().map(|m| (m.fam(), m.src.prefix_len())).collect()
    }
}

/// The fingerprint of a set of elements (order does not matter).
pub fn fingerprint(elems: impl IntoIterator<Item = Elem>) -> Hash {
    let mut encoded: Vec<Vec<u8>> = elems
        .into_iter()
        .map(|e| {
            let n = e.encode(None);
            let mut b = e.set().name().into_bytes();
            b.push(0);
            b.extend(n.key);
            if let Some(cni_common::netlink::nft::NftData::Value(d)) = n.data {
                b.extend(d);
            }
            b
        })
        .collect();
    encoded.sort();
    encoded.dedup();
    let parts: Vec<&[u8]> = encoded.iter().map(Vec::as_slice).collect();
    Hash::of(&parts)
}

#[cfg(test)]
mod twins;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_addresses_that_lead_into_the_host_or_nowhere_are_unfit() {
        for bad in [
            "127.0.0.1",
            "127.8.9.10",
            "::1",
            "0.0.0.0",
            "::",
            "224.0.0.1",
            "ff02::1",
            "169.254.1.1",
            "fe80::1",
            "255.255.255.255",
            "::ffff:127.0.0.1",
        ] {
            assert!(unfit_target(bad.parse().unwrap()).is_some(), "{bad}");
        }
        for ok in ["10.0.0.5", "192.168.1.2", "fd00::5", "2001:db8::1", "100.64.0.1"] {
            assert_eq!(unfit_target(ok.parse().unwrap()), None, "{ok}");
        }
    }
    use cni_common::spec::json;
    use cni_common::spec::result::{Interface, IpConfig};
    use serde_json::json;

    fn intent(c: &Conf, v4: Option<&str>, v6: Option<&str>) -> Result<(Intent, Vec<String>)> {
        let sandbox = Interface { name: "eth0".into(), sandbox: "/run/netns/x".into(), ..Default::default() };
        let ip = |a: &str| IpConfig { interface: Some(0), address: a.parse().unwrap(), gateway: None };
        let prev = CniResult {
            interfaces: vec![sandbox],
            ips: v4.into_iter().chain(v6).map(ip).collect(),
            ..Default::default()
        };
        Intent::new(c, &prev, "eth0", Owner::new("n", "c", "eth0"), None)
    }

    fn texts(i: &Intent) -> Vec<String> {
        i.sole_elements().iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn elements_for_dual_stack_with_host_ips() {
        let c = conf(json!({"runtimeConfig": {"portMappings": [
            {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"},
            {"hostPort": 53, "containerPort": 53, "protocol": "udp", "hostIP": "192.0.2.1"},
            {"hostPort": 9000, "containerPort": 90, "protocol": "tcp", "hostIP": "::"}
        ]}}))
        .unwrap();
        let (i, notes) = intent(&c, Some("10.0.0.5/24"), Some("fd00::5/64")).unwrap();
        assert!(notes.is_empty());
        let h = i.owner.hash;
        let fp = i.fingerprint();
        assert_eq!(
            texts(&i),
            [
                format!("owner {{ ::ffff:0.0.0.0 . tcp . 8080 : {h} }}"),
                format!("owner {{ :: . tcp . 8080 : {h} }}"),
                format!("owner {{ ::ffff:192.0.2.1 . udp . 53 : {h} }}"),
                format!("owner {{ :: . tcp . 9000 : {h} }}"),
                format!("claims {{ ::ffff:0.0.0.0 . tcp . 8080 . {h} : ::ffff:10.0.0.5 . 80 }}"),
                format!("claims {{ :: . tcp . 8080 . {h} : fd00::5 . 80 }}"),
                format!("claims {{ ::ffff:192.0.2.1 . udp . 53 . {h} : ::ffff:10.0.0.5 . 53 }}"),
                format!("claims {{ :: . tcp . 9000 . {h} : fd00::5 . 90 }}"),
                "hp4 { tcp . 8080 : 10.0.0.5 . 80 }".to_string(),
                "hp6 { tcp . 8080 : fd00::5 . 80 }".to_string(),
                "hip4 { 192.0.2.1 . udp . 53 : 10.0.0.5 . 53 }".to_string(),
                "hp6 { tcp . 9000 : fd00::5 . 90 }".to_string(),
                "net4_24 { 10.0.0.0 . 10.0.0.5 . tcp . 80 }".to_string(),
                "net4_32 { 127.0.0.1 . 10.0.0.5 . tcp . 80 }".to_string(),
                "net6_64 { fd00:: . fd00::5 . tcp . 80 }".to_string(),
                "net4_24 { 10.0.0.0 . 10.0.0.5 . udp . 53 }".to_string(),
                "net4_32 { 127.0.0.1 . 10.0.0.5 . udp . 53 }".to_string(),
                "net6_64 { fd00:: . fd00::5 . tcp . 90 }".to_string(),
                format!("attachments {{ {h} : {fp} }}"),
            ]
        );
        // the IPv4 host IP is skipped for an IPv6-only container, with a note
        let (i, notes) = intent(&c, None, Some("fd00::5/64")).unwrap();
        assert_eq!(i.entries.len(), 2);
        assert_eq!(notes.len(), 1, "{notes:?}");
        // only mappings of the other family: refused
        let v4only = conf(json!({"runtimeConfig": {"portMappings": [{"hostPort": 53, "containerPort": 53, "hostIP": "192.0.2.1"}]}})).unwrap();
        assert_eq!(intent(&v4only, None, Some("fd00::5/64")).unwrap_err().code, 7);
        // no address at all: refused
        assert_eq!(intent(&c, None, None).unwrap_err().code, 7);
        // the fingerprint follows the mappings, not their order
        let mut swapped = c.clone();
        swapped.mappings.reverse();
        assert_eq!(intent(&swapped, Some("10.0.0.5/24"), Some("fd00::5/64")).unwrap().0.fingerprint(), {
            intent(&c, Some("10.0.0.5/24"), Some("fd00::5/64")).unwrap().0.fingerprint()
        });
        swapped.mappings.pop();
        assert_ne!(
            intent(&swapped, Some("10.0.0.5/24"), None).unwrap().0.fingerprint(),
            intent(&c, Some("10.0.0.5/24"), None).unwrap().0.fingerprint()
        );
    }

    #[test]
    fn masquerading_as_upstream() {
        let one = json!([{"hostPort": 80, "containerPort": 80}]);
        let masq = |v: serde_json::Value| -> Vec<String> {
            let c = conf(v).unwrap();
            intent(&c, Some("10.0.0.5/32"), Some("fd00::5/128"))
                .unwrap()
                .0
                .masq_elems()
                .map(|e| e.to_string())
                .collect()
        };
        assert_eq!(
            masq(json!({"runtimeConfig": {"portMappings": one}})),
            [
                "net4_32 { 10.0.0.5 . 10.0.0.5 . tcp . 80 }",
                "net4_32 { 127.0.0.1 . 10.0.0.5 . tcp . 80 }",
                "net6_128 { fd00::5 . fd00::5 . tcp . 80 }"
            ]
        );
        assert_eq!(
            masq(json!({"masqAll": true, "runtimeConfig": {"portMappings": one}})),
            ["net4_0 { 10.0.0.5 . tcp . 80 }", "net6_0 { fd00::5 . tcp . 80 }"]
        );
        // masqAll applies only with snat, as upstream
        assert!(
            masq(json!({"snat": false, "masqAll": true, "runtimeConfig": {"portMappings": one}})).is_empty()
        );
        assert!(masq(json!({"snat": false, "runtimeConfig": {"portMappings": one}})).is_empty());
    }

    #[test]
    fn conflicting_entries_within_one_request() {
        let c = conf(json!({"runtimeConfig": {"portMappings": [
            {"hostPort": 80, "containerPort": 80},
            {"hostPort": 80, "containerPort": 81, "hostIP": "0.0.0.0"}]}}))
        .unwrap();
        assert_eq!(intent(&c, Some("10.0.0.5/24"), None).unwrap_err().code, 7);
        // the same mapping twice that way is one host port, not a conflict
        let c = conf(json!({"runtimeConfig": {"portMappings": [
            {"hostPort": 80, "containerPort": 80},
            {"hostPort": 80, "containerPort": 80, "hostIP": "0.0.0.0"}]}}))
        .unwrap();
        let (i, _) = intent(&c, Some("10.0.0.5/24"), Some("fd00::5/64")).unwrap();
        let ports: Vec<String> = i.ports().map(|p| p.describe()).collect();
        assert_eq!(ports, ["tcp/80 (all IPv4 addresses)", "tcp/80 (all IPv6 addresses)"]);
    }

    fn conf(v: serde_json::Value) -> Result<Conf> {
        let raw: PortMapConf = json::from_value(v).map_err(CniError::decode)?;
        Conf::from_raw(&raw)
    }

    #[test]
    fn defaults_and_mappings() {
        let c = conf(json!({"runtimeConfig": {"portMappings": [
            {"hostPort": 8080, "containerPort": 80, "protocol": "TCP"},
            {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"},
            {"hostPort": 53, "containerPort": 53, "protocol": "Udp", "hostIP": "192.0.2.1"},
            {"hostPort": 9, "containerPort": 9, "protocol": "sctp", "hostIP": "::"},
            {"hostPort": 10, "containerPort": 10, "protocol": "tcp", "hostIP": "0.0.0.0"}
        ]}}))
        .unwrap();
        assert!(c.snat && !c.masq_all);
        assert_eq!(c.mappings.len(), 4, "exact repeats collapse");
        assert_eq!(c.mappings[1].proto, Proto::Udp);
        assert_eq!(c.mappings[1].host_ip, HostIp::Addr("192.0.2.1".parse().unwrap()));
        assert_eq!(c.mappings[2].host_ip, HostIp::AnyOf(Family::V6));
        assert_eq!(c.mappings[3].host_ip, HostIp::AnyOf(Family::V4));
    }

    #[test]
    fn bad_values_are_rejected_with_the_right_code() {
        let cases = [
            (json!({"hostPort": 0, "containerPort": 80, "protocol": "tcp"}), 7),
            (json!({"hostPort": 70000, "containerPort": 80, "protocol": "tcp"}), 7),
            (json!({"hostPort": 80, "containerPort": -1, "protocol": "tcp"}), 7),
            (json!({"hostPort": 80, "containerPort": 80, "protocol": "icmp"}), 2),
            (json!({"hostPort": 80, "containerPort": 80, "protocol": "tcp", "hostIP": "nope"}), 7),
            (json!({"hostPort": 80, "containerPort": 80, "protocol": "tcp", "hostIP": "224.0.0.1"}), 7),
        ];
        for (m, code) in cases {
            let e = conf(json!({"runtimeConfig": {"portMappings": [m]}})).unwrap_err();
            assert_eq!(e.code, code, "{m}: {}", e.msg);
        }
        let e = conf(json!({"runtimeConfig": {"portMappings": [
            {"hostPort": 80, "containerPort": 80, "protocol": "tcp"},
            {"hostPort": 80, "containerPort": 81, "protocol": "tcp"}]}}))
        .unwrap_err();
        assert_eq!(e.code, 7);
        assert!(e.msg.contains("tcp/80"), "{}", e.msg);
    }

    #[test]
    fn backends_and_iptables_keys() {
        assert!(conf(json!({"backend": "nftables"})).is_ok());
        let e = conf(json!({"backend": "iptables"})).unwrap_err();
        assert_eq!(e.code, 2);
        assert!(e.msg.contains("backend"), "{}", e.msg);
        assert_eq!(conf(json!({"backend": "ebpf"})).unwrap_err().code, 2);
        let c = conf(json!({"externalSetMarkChain": "KUBE-MARK-MASQ", "snat": true})).unwrap();
        assert_eq!(c.notes.len(), 1);
        assert!(c.notes[0].contains("KUBE-MARK-MASQ"));
        let c = conf(json!({"markMasqBit": 13})).unwrap();
        assert_eq!(c.notes.len(), 1);
        assert_eq!(conf(json!({"markMasqBit": 40})).unwrap_err().code, 7);
        assert_eq!(conf(json!({"markMasqBit": "x"})).unwrap_err().code, 6);
    }

    #[test]
    fn conditions_are_checked() {
        let c = conf(json!({"conditionsV4": ["ip", "daddr", "!=", "{ 10.0.0.1, 10.0.0.2 }"]})).unwrap();
        assert_eq!(c.conditions.v4.len(), 4);
        assert_eq!(conf(json!({"conditionsV4": ["-d", "10.0.0.1"]})).unwrap_err().code, 2);
        assert_eq!(conf(json!({"conditionsV6": ["!", "-d", "::1"]})).unwrap_err().code, 2);
        assert_eq!(conf(json!({"conditionsV4": ["ip daddr 1.1.1.1; flush ruleset"]})).unwrap_err().code, 7);
        assert_eq!(conf(json!({"conditionsV4": ["a\nb"]})).unwrap_err().code, 7);
    }

    fn teardown(v: serde_json::Value) -> Result<Teardown> {
        let raw: PortMapConf = json::from_value(v).map_err(CniError::decode)?;
        Teardown::from_raw(&raw, "DEL")
    }

    #[test]
    fn teardown_ignores_benign_values_and_refuses_hostile_ones() {
        let ok = json!({"hostPort": 80, "containerPort": 8080, "protocol": "tcp"});
        // each of these makes ADD fail, but not DEL or GC
        let benign = [
            json!({"backend": "iptables"}),
            json!({"backend": "ebpf"}),
            json!({"conditionsV4": ["-d", "10.0.0.1"], "conditionsV6": ["!", "-s", "::1"]}),
            json!({"markMasqBit": 40}),
            json!({"runtimeConfig": {"portMappings": [ok, {"hostPort": 81, "containerPort": 80, "protocol": "icmp"}]}}),
            json!({"runtimeConfig": {"portMappings": [{"hostPort": 0, "containerPort": 80}]}}),
            json!({"runtimeConfig": {"portMappings": [{"hostPort": 80, "containerPort": 70000}]}}),
            json!({"runtimeConfig": {"portMappings": [{"hostPort": 80, "containerPort": 80, "hostIP": "x"}]}}),
            json!({"runtimeConfig": {"portMappings": [{"hostPort": 80, "containerPort": 80, "hostIP": "ff02::1"}]}}),
            json!({"runtimeConfig": {"portMappings": [ok, {"hostPort": 80, "containerPort": 81}]}}),
        ];
        for v in benign {
            assert!(conf(v.clone()).is_err(), "ADD refuses {v}");
            let t = teardown(v.clone()).unwrap_or_else(|e| panic!("{v}: {}", e.msg));
            assert!(!t.notes.is_empty(), "{v}: a note says what was ignored");
            assert!(t.notes.iter().all(|n| n.starts_with("portmap: note: DEL ignores")), "{:?}", t.notes);
        }
        // an invalid mapping: DEL cannot name the elements, and withdraws by tag instead
        let t =
            teardown(json!({"runtimeConfig": {"portMappings": [ok, {"hostPort": 0, "containerPort": 80}]}}))
                .unwrap();
        assert!(t.listed && t.conf().is_none());
        let t = teardown(json!({"backend": "iptables", "runtimeConfig": {"portMappings": [ok]}})).unwrap();
        assert_eq!(t.conf().unwrap().mappings.len(), 1);
        assert!(!teardown(json!({})).unwrap().listed);
        // hostile: refused on every verb
        for v in
            [json!({"conditionsV4": ["ip daddr 1.1.1.1; flush ruleset"]}), json!({"conditionsV6": ["#"]})]
        {
            assert_eq!(teardown(v).unwrap_err().code, 7);
        }
        // a document of the wrong shape is still a decode error
        assert_eq!(teardown(json!({"snat": "yes"})).unwrap_err().code, 6);
    }

    #[test]
    fn portmap_keys_and_their_defaults() {
        let c = PortMapConf::default();
        assert!(c.snat() && !c.masq_all && c.mappings().is_empty());
        let c: PortMapConf = json::from_value(json!({"SNAT": false, "masqall": true, "snat": null,
            "runtimeConfig": {"portMappings": [{"hostPort": 80, "containerPort": 8080}]}}))
        .unwrap();
        assert!(!c.snat() && c.masq_all);
        assert_eq!((c.mappings().len(), c.mappings()[0].protocol.as_str()), (1, ""));
        // a mapping needs both ports (Go would read 0 and refuse it later)
        assert!(json::from_value::<PortMapConf>(
            json!({"runtimeConfig": {"portMappings": [{"hostPort": 80}]}})
        )
        .is_err());
    }
}
