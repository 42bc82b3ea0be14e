//! portmap's configuration: validation of its keys (cni-common's `PortMapConf`; everything is
//! checked before the kernel is touched) and the choice of the container addresses from prevResult.

use cni_common::spec::config::{PortMapConf, PortMapping};
use cni_common::spec::result::CniResult;
use cni_common::{CniError, Result};
use ipnet::IpNet;
use std::net::IpAddr;

/// Layer-4 protocol of a mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Proto {
    Tcp,
    Udp,
    Sctp,
}

impl Proto {
    pub fn as_str(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
            Proto::Sctp => "sctp",
        }
    }

    /// The IP protocol number (`meta l4proto`).
    pub fn number(self) -> u8 {
        match self {
            Proto::Tcp => 6,
            Proto::Udp => 17,
            Proto::Sctp => 132,
        }
    }

    pub fn from_number(n: u8) -> Option<Proto> {
        [Proto::Tcp, Proto::Udp, Proto::Sctp].into_iter().find(|p| p.number() == n)
    }
}

/// Address family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fam {
    V4,
    V6,
}

impl Fam {
    pub fn of(ip: &IpAddr) -> Fam {
        if ip.is_ipv4() {
            Fam::V4
        } else {
            Fam::V6
        }
    }

    /// "4" or "6", as in set and chain names.
    pub fn digit(self) -> char {
        match self {
            Fam::V4 => '4',
            Fam::V6 => '6',
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Fam::V4 => "IPv4",
            Fam::V6 => "IPv6",
        }
    }
}

/// Which host addresses a mapping listens on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HostIp {
    /// No `hostIP`: both families.
    Any,
    /// `0.0.0.0` or `::`: every address of that family.
    AnyOf(Fam),
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

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Conf {
    pub snat: bool,
    pub masq_all: bool,
    pub conditions_v4: Vec<String>,
    pub conditions_v6: Vec<String>,
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
    match p.to_ascii_lowercase().as_str() {
        "" | "tcp" => Ok(Proto::Tcp),
        "udp" => Ok(Proto::Udp),
        "sctp" => Ok(Proto::Sctp),
        _ => Err(CniError::unsupported_field(
            &format!("runtimeConfig.portMappings[{i}].protocol"),
            format!("{p:?}"),
            "use \"tcp\", \"udp\" or \"sctp\"",
        )),
    }
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
        return Ok(HostIp::AnyOf(Fam::of(&ip)));
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
    for (i, m) in list.iter().enumerate() {
        let mapping = mapping(i, m)?;
        if out.contains(&mapping) {
            continue; // an exact repeat changes nothing
        }
        if let Some(o) = out.iter().find(|o| {
            o.host_port == mapping.host_port && o.proto == mapping.proto && o.host_ip == mapping.host_ip
        }) {
            return Err(CniError::config(format!(
                "runtimeConfig.portMappings[{i}] maps host port {}/{} again (already mapped to container port {}): \
                 a host port can go to one container port only",
                mapping.proto.as_str(),
                mapping.host_port,
                o.container_port
            )));
        }
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
        let conditions_v4 = conditions("conditionsV4", raw.conditions_v4.as_deref())?;
        let conditions_v6 = conditions("conditionsV6", raw.conditions_v6.as_deref())?;
        Ok(Conf {
            snat: raw.snat(),
            masq_all: raw.masq_all,
            conditions_v4,
            conditions_v6,
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
            conditions_v4: Vec::new(),
            conditions_v6: Vec::new(),
            mappings: self.mappings.clone()?,
            notes: Vec::new(),
        })
    }
}

/// The container's addresses as upstream picks them: the first IPv4 and the first IPv6
/// address of prevResult whose `interface` is absent or names an interface called CNI_IFNAME
/// that has a sandbox. Unlike upstream, an `interface` index past the end of the list is
/// refused (code 7): prevResult is then not a result any plugin made.
pub fn container_addrs(prev: &CniResult, ifname: &str) -> Result<(Option<IpNet>, Option<IpNet>)> {
    let mut v4 = None;
    let mut v6 = None;
    for (k, ip) in prev.ips.iter().enumerate() {
        if let Some(i) = ip.interface {
            let intf = prev.interfaces.get(i).ok_or_else(|| {
                CniError::config(format!(
                    "prevResult.ips[{k}].interface is {i}, but prevResult lists {} interface(s)",
                    prev.interfaces.len()
                ))
            })?;
            if intf.name != ifname || intf.sandbox.is_empty() {
                continue;
            }
        }
        let slot = if ip.address.addr().is_ipv4() { &mut v4 } else { &mut v6 };
        if slot.is_none() {
            *slot = Some(ip.address);
        }
    }
    Ok((v4, v6))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cni_common::spec::json;
    use cni_common::spec::result::{Interface, IpConfig};
    use serde_json::json;

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
        assert_eq!(c.mappings[2].host_ip, HostIp::AnyOf(Fam::V6));
        assert_eq!(c.mappings[3].host_ip, HostIp::AnyOf(Fam::V4));
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
        assert_eq!(c.conditions_v4.len(), 4);
        assert_eq!(conf(json!({"conditionsV4": ["-d", "10.0.0.1"]})).unwrap_err().code, 2);
        assert_eq!(conf(json!({"conditionsV6": ["!", "-d", "::1"]})).unwrap_err().code, 2);
        assert_eq!(conf(json!({"conditionsV4": ["ip daddr 1.1.1.1; flush ruleset"]})).unwrap_err().code, 7);
        assert_eq!(conf(json!({"conditionsV4": ["a\nb"]})).unwrap_err().code, 7);
    }

    #[test]
    fn container_address_choice_follows_upstream() {
        let prev = CniResult {
            interfaces: vec![
                Interface { name: "cni0".into(), ..Default::default() },
                Interface { name: "veth1".into(), ..Default::default() },
                Interface { name: "eth0".into(), sandbox: "/run/netns/x".into(), ..Default::default() },
                Interface { name: "eth1".into(), sandbox: "/run/netns/x".into(), ..Default::default() },
            ],
            ips: vec![
                IpConfig { interface: Some(0), address: "10.0.0.1/24".parse().unwrap(), gateway: None },
                IpConfig { interface: Some(3), address: "10.1.0.5/24".parse().unwrap(), gateway: None },
                IpConfig { interface: Some(2), address: "10.0.0.5/24".parse().unwrap(), gateway: None },
                IpConfig { interface: Some(2), address: "10.0.0.6/24".parse().unwrap(), gateway: None },
                IpConfig { interface: None, address: "fd00::5/64".parse().unwrap(), gateway: None },
            ],
            ..Default::default()
        };
        let (v4, v6) = container_addrs(&prev, "eth0").unwrap();
        assert_eq!(v4, Some("10.0.0.5/24".parse().unwrap()));
        assert_eq!(v6, Some("fd00::5/64".parse().unwrap()));
        let (v4, _) = container_addrs(&prev, "eth1").unwrap();
        assert_eq!(v4, Some("10.1.0.5/24".parse().unwrap()));
        // an index past the end is refused (upstream would use the address)
        let prev = CniResult {
            ips: vec![IpConfig {
                interface: Some(9),
                address: "10.0.0.9/24".parse().unwrap(),
                gateway: None,
            }],
            ..Default::default()
        };
        let e = container_addrs(&prev, "eth0").unwrap_err();
        assert_eq!(e.code, 7);
        assert!(e.msg.contains("prevResult.ips[0].interface is 9"), "{}", e.msg);
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
}
