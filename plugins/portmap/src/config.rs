//! portmap's configuration: decoding, validation (everything is checked before the kernel is
//! touched) and the choice of the container addresses from prevResult.

use cni_common::spec::config::PortMapping;
use cni_common::spec::result::CniResult;
use cni_common::{CniError, Result};
use ipnet::IpNet;
use serde::Deserialize;
use std::net::IpAddr;

#[derive(Debug, Default, Deserialize)]
pub struct RawConf {
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
    pub runtime_config: Option<RuntimeConfig>,
}

#[derive(Debug, Default, Deserialize)]
pub struct RuntimeConfig {
    #[serde(rename = "portMappings", default)]
    pub port_mappings: Option<Vec<PortMapping>>,
}

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

/// Conditions are nft tokens inserted verbatim into one rule: reject what could end that rule
/// or start another statement, and iptables syntax.
fn conditions(field: &str, list: Option<Vec<String>>) -> Result<Vec<String>> {
    let list = list.unwrap_or_default();
    if let Some(first) = list.first() {
        if first.starts_with('-') || first.starts_with('!') {
            return Err(CniError::unsupported_field(
                field,
                format!("{list:?}"),
                "these are iptables match options; this portmap uses nftables, so write them in nft syntax \
                 (e.g. [\"ip\", \"daddr\", \"!=\", \"192.0.2.10\"])",
            ));
        }
    }
    for tok in &list {
        if tok.chars().any(|c| matches!(c, ';' | '\n' | '\r' | '#' | '\0')) || tok.trim().is_empty() {
            return Err(CniError::config(format!(
                "{field} token {tok:?} is not allowed: tokens must be non-empty and must not contain ';', '#' or line breaks"
            )));
        }
    }
    Ok(list)
}

impl Conf {
    pub fn from_raw(raw: RawConf) -> Result<Conf> {
        let mut notes = Vec::new();
        match raw.backend.as_deref() {
            None | Some("") | Some("nftables") => {}
            Some("iptables") => return Err(CniError::unsupported_field(
                "backend",
                "\"iptables\"",
                "this portmap implements only the nftables backend; remove the key or set it to \"nftables\"",
            )),
            Some(other) => {
                return Err(CniError::unsupported_field(
                    "backend",
                    format!("{other:?}"),
                    "the only supported backend is \"nftables\"",
                ))
            }
        }
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
        let conditions_v4 = conditions("conditionsV4", raw.conditions_v4)?;
        let conditions_v6 = conditions("conditionsV6", raw.conditions_v6)?;
        let list = raw.runtime_config.and_then(|r| r.port_mappings).unwrap_or_default();
        let mut mappings: Vec<Mapping> = Vec::with_capacity(list.len());
        for (i, m) in list.iter().enumerate() {
            let mapping = Mapping {
                host_port: port("hostPort", i, m.host_port)?,
                container_port: port("containerPort", i, m.container_port)?,
                proto: proto(i, &m.protocol)?,
                host_ip: host_ip(i, &m.host_ip)?,
            };
            if mappings.contains(&mapping) {
                continue; // an exact repeat changes nothing
            }
            if let Some(j) = mappings.iter().position(|o| {
                o.host_port == mapping.host_port && o.proto == mapping.proto && o.host_ip == mapping.host_ip
            }) {
                return Err(CniError::config(format!(
                    "runtimeConfig.portMappings[{i}] maps host port {}/{} again (already mapped to container port {}): \
                     a host port can go to one container port only",
                    mapping.proto.as_str(),
                    mapping.host_port,
                    mappings[j].container_port
                )));
            }
            mappings.push(mapping);
        }
        Ok(Conf {
            snat: raw.snat.unwrap_or(true),
            masq_all: raw.masq_all,
            conditions_v4,
            conditions_v6,
            mappings,
            notes,
        })
    }
}

/// The container's addresses as upstream picks them: the first IPv4 and the first IPv6
/// address of prevResult whose `interface` is absent, out of range, or names an interface
/// called CNI_IFNAME that has a sandbox.
pub fn container_addrs(prev: &CniResult, ifname: &str) -> (Option<IpNet>, Option<IpNet>) {
    let mut v4 = None;
    let mut v6 = None;
    for ip in &prev.ips {
        if let Some(i) = ip.interface {
            if let Some(intf) = prev.interfaces.get(i) {
                if intf.name != ifname || intf.sandbox.is_empty() {
                    continue;
                }
            }
        }
        let slot = if ip.address.addr().is_ipv4() { &mut v4 } else { &mut v6 };
        if slot.is_none() {
            *slot = Some(ip.address);
        }
    }
    (v4, v6)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cni_common::spec::json;
    use cni_common::spec::result::{Interface, IpConfig};
    use serde_json::json;

    fn conf(v: serde_json::Value) -> Result<Conf> {
        let raw: RawConf = json::from_value(v).map_err(CniError::decode)?;
        Conf::from_raw(raw)
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
        let (v4, v6) = container_addrs(&prev, "eth0");
        assert_eq!(v4, Some("10.0.0.5/24".parse().unwrap()));
        assert_eq!(v6, Some("fd00::5/64".parse().unwrap()));
        let (v4, _) = container_addrs(&prev, "eth1");
        assert_eq!(v4, Some("10.1.0.5/24".parse().unwrap()));
        // an index past the end is accepted (upstream does the same)
        let prev = CniResult {
            ips: vec![IpConfig {
                interface: Some(9),
                address: "10.0.0.9/24".parse().unwrap(),
                gateway: None,
            }],
            ..Default::default()
        };
        assert_eq!(container_addrs(&prev, "eth0").0, Some("10.0.0.9/24".parse().unwrap()));
    }
}
