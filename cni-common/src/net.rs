//! Network primitives every layer shares: the address family, the layer-4 protocol of a port
//! mapping, and the container addresses a chained plugin forwards to.

use crate::spec::result::CniResult;
use crate::{CniError, Result};
use ipnet::IpNet;
use std::net::IpAddr;

/// An IP address family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub const BOTH: [Family; 2] = [Family::V4, Family::V6];

    pub fn of(ip: &IpAddr) -> Family {
        match ip {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    /// '4' or '6', as in set, chain and tool names (`hp4`, `ip6tables`).
    pub fn digit(self) -> char {
        match self {
            Family::V4 => '4',
            Family::V6 => '6',
        }
    }

    /// "IPv4" or "IPv6", for messages.
    pub fn name(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }

    /// `NFPROTO_IPV4` / `NFPROTO_IPV6`: the value of `meta nfproto`.
    pub fn nfproto(self) -> u8 {
        match self {
            Family::V4 => NFPROTO_IPV4,
            Family::V6 => NFPROTO_IPV6,
        }
    }

    /// "ipv4" or "ipv6", nft's keyword for the `meta nfproto` value.
    pub fn nft_keyword(self) -> &'static str {
        match self {
            Family::V4 => "ipv4",
            Family::V6 => "ipv6",
        }
    }

    /// Bytes of an address.
    pub fn addr_len(self) -> usize {
        match self {
            Family::V4 => 4,
            Family::V6 => 16,
        }
    }

    /// Bits of an address (the longest prefix).
    pub fn max_prefix(self) -> u8 {
        match self {
            Family::V4 => 32,
            Family::V6 => 128,
        }
    }
}

/// `NFPROTO_IPV4`.
pub const NFPROTO_IPV4: u8 = 2;
/// `NFPROTO_IPV6`.
pub const NFPROTO_IPV6: u8 = 10;

/// The layer-4 protocol of a port mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Proto {
    Tcp,
    Udp,
    Sctp,
}

impl Proto {
    pub const ALL: [Proto; 3] = [Proto::Tcp, Proto::Udp, Proto::Sctp];

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
        Proto::ALL.into_iter().find(|p| p.number() == n)
    }

    /// A `protocol` as runtimes write it: any case, empty meaning TCP (as upstream).
    pub fn parse(s: &str) -> Option<Proto> {
        if s.is_empty() {
            return Some(Proto::Tcp);
        }
        Proto::ALL.into_iter().find(|p| p.as_str().eq_ignore_ascii_case(s))
    }
}

/// Every address of prevResult on the container interface `ifname`: those whose `interface`
/// is absent or names an interface called `ifname` that has a sandbox, in prevResult's order.
/// An `interface` index past the end of `interfaces` is refused (code 7): prevResult is then
/// not a result any plugin made.
pub fn interface_addrs(prev: &CniResult, ifname: &str) -> Result<Vec<IpNet>> {
    let mut out = Vec::new();
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
        out.push(ip.address);
    }
    Ok(out)
}

/// The container addresses a chained plugin forwards to, as upstream's host-port mapping picks them:
/// the first IPv4 and the first IPv6 address of [`interface_addrs`] (upstream would use an
/// address whose `interface` index is out of range; we refuse it, code 7).
pub fn container_addrs(prev: &CniResult, ifname: &str) -> Result<(Option<IpNet>, Option<IpNet>)> {
    let addrs = interface_addrs(prev, ifname)?;
    let first = |v4: bool| addrs.iter().find(|a| a.addr().is_ipv4() == v4).copied();
    Ok((first(true), first(false)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::result::{Interface, IpConfig};

    #[test]
    fn protocols_parse_as_runtimes_write_them() {
        assert_eq!(Proto::parse("TCP"), Some(Proto::Tcp));
        assert_eq!(Proto::parse(""), Some(Proto::Tcp));
        assert_eq!(Proto::parse("Udp"), Some(Proto::Udp));
        assert_eq!(Proto::parse("sctp"), Some(Proto::Sctp));
        assert_eq!(Proto::parse("icmp"), None);
        for p in Proto::ALL {
            assert_eq!(Proto::from_number(p.number()), Some(p));
        }
        assert_eq!(Proto::from_number(1), None);
    }

    #[test]
    fn families() {
        assert_eq!(Family::of(&"10.0.0.1".parse().unwrap()), Family::V4);
        assert_eq!(Family::of(&"::1".parse().unwrap()), Family::V6);
        assert_eq!((Family::V4.digit(), Family::V6.nfproto()), ('4', 10));
        assert_eq!((Family::V4.addr_len(), Family::V6.max_prefix()), (4, 128));
    }

    #[test]
    fn container_address_choice_follows_upstream() {
        let sandbox = |name: &str| Interface {
            name: name.into(),
            sandbox: "/run/netns/x".into(),
            ..Default::default()
        };
        let ip =
            |i: Option<usize>, a: &str| IpConfig { interface: i, address: a.parse().unwrap(), gateway: None };
        let prev = CniResult {
            interfaces: vec![
                Interface { name: "cni0".into(), ..Default::default() },
                Interface { name: "veth1".into(), ..Default::default() },
                sandbox("eth0"),
                sandbox("eth1"),
            ],
            ips: vec![
                ip(Some(0), "10.0.0.1/24"),
                ip(Some(3), "10.1.0.5/24"),
                ip(Some(2), "10.0.0.5/24"),
                ip(Some(2), "10.0.0.6/24"),
                ip(None, "fd00::5/64"),
            ],
            ..Default::default()
        };
        let (v4, v6) = container_addrs(&prev, "eth0").unwrap();
        assert_eq!(v4, Some("10.0.0.5/24".parse().unwrap()));
        assert_eq!(v6, Some("fd00::5/64".parse().unwrap()));
        assert_eq!(container_addrs(&prev, "eth1").unwrap().0, Some("10.1.0.5/24".parse().unwrap()));
        let every: Vec<IpNet> =
            ["10.0.0.5/24", "10.0.0.6/24", "fd00::5/64"].map(|a| a.parse().unwrap()).into();
        assert_eq!(interface_addrs(&prev, "eth0").unwrap(), every, "in order, none of another interface");
        let bad = CniResult { ips: vec![ip(Some(9), "10.0.0.9/24")], ..Default::default() };
        let e = container_addrs(&bad, "eth0").unwrap_err();
        assert_eq!(e.code, 7);
        assert!(e.msg.contains("prevResult.ips[0].interface is 9"), "{}", e.msg);
    }
}
