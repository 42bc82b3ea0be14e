//! The elements of portmap's table, typed: which set or map holds them ([`Set`]), their key
//! ([`Key`]) and data ([`Data`]), and their nft notation (used in `nft -f` scripts and in
//! messages). The kernel's byte layout of each is in [`crate::wire::codec`].

use crate::config::{Fam, Proto};
use ipnet::IpNet;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A 128-bit value stored as an `ipv6_addr` (nft has no wider integer type): the hash of an
/// attachment, or the shared claim of a container (see [`crate::owner`]).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct Hash(pub [u8; 16]);

impl Hash {
    /// The first 16 bytes of a digest.
    pub fn from_digest(d: &[u8]) -> Hash {
        let mut h = [0u8; 16];
        h.copy_from_slice(&d[..16]);
        Hash(h)
    }
}

impl fmt::Display for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Ipv6Addr::from(self.0).fmt(f)
    }
}

/// IPv4 addresses mapped into IPv6 (the `owner` and `claims` maps hold both families).
pub fn mapped(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a,
    }
}

/// A host port: the host address it is mapped on (None: every local address of the family),
/// the protocol and the port. Keys the `owner` map and the DNAT maps, and starts the keys of
/// the `claims` map.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct HostPort {
    pub fam: Fam,
    pub ip: Option<IpAddr>,
    pub proto: Proto,
    pub port: u16,
}

impl HostPort {
    /// The address part of `owner` and `claims` keys: IPv4 mapped into IPv6, and "every
    /// address" as `::ffff:0.0.0.0` (IPv4) or `::` (IPv6).
    pub fn owner_addr(&self) -> Ipv6Addr {
        match (self.ip, self.fam) {
            (Some(ip), _) => mapped(ip),
            (None, Fam::V4) => Ipv4Addr::UNSPECIFIED.to_ipv6_mapped(),
            (None, Fam::V6) => Ipv6Addr::UNSPECIFIED,
        }
    }

    /// The inverse of [`HostPort::owner_addr`].
    pub fn from_owner_addr(addr: Ipv6Addr, proto: Proto, port: u16) -> HostPort {
        let (fam, ip) = match addr.to_ipv4_mapped() {
            Some(v4) if v4.is_unspecified() => (Fam::V4, None),
            Some(v4) => (Fam::V4, Some(IpAddr::V4(v4))),
            None if addr.is_unspecified() => (Fam::V6, None),
            None => (Fam::V6, Some(IpAddr::V6(addr))),
        };
        HostPort { fam, ip, proto, port }
    }

    /// The DNAT map of this host port: `hp4`/`hp6` for every address, `hip4`/`hip6` for one.
    pub fn dnat_set(&self) -> Set {
        match self.ip {
            None => Set::Hp(self.fam),
            Some(_) => Set::Hip(self.fam),
        }
    }

    /// "tcp/8080 (all IPv4 addresses)" or "tcp/8080 on 192.0.2.1".
    pub fn describe(&self) -> String {
        match self.ip {
            None => format!("{}/{} (all {} addresses)", self.proto.as_str(), self.port, self.fam.name()),
            Some(ip) => format!("{}/{} on {ip}", self.proto.as_str(), self.port),
        }
    }
}

/// Where a mapping leads: the container's address and port.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct Target {
    pub ip: IpAddr,
    pub port: u16,
}

/// A masquerade element: DNATed connections from `src` to the container address, protocol
/// and container port are masqueraded. `src` is a prefix (host bits zero): the container's
/// subnet, `127.0.0.1/32`, or `0.0.0.0/0` / `::/0` for `masqAll`; its length picks the set.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct Masq {
    pub src: IpNet,
    pub ctr: IpAddr,
    pub proto: Proto,
    pub port: u16,
}

impl Masq {
    pub fn new(src: IpNet, ctr: IpAddr, proto: Proto, port: u16) -> Masq {
        Masq { src: src.trunc(), ctr, proto, port }
    }

    pub fn fam(&self) -> Fam {
        Fam::of(&self.ctr)
    }
}

/// The identity of a network namespace: its nsfs inode and its netns cookie
/// (`SO_NETNS_COOKIE`, never reused while the machine runs); 0 when unknown.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct NsId {
    pub ino: u64,
    pub cookie: u64,
}

impl NsId {
    /// Both values in one 128-bit `ipv6_addr` value: inode, then cookie, big-endian.
    pub fn to_bytes(self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.ino.to_be_bytes());
        b[8..].copy_from_slice(&self.cookie.to_be_bytes());
        b
    }

    /// Whether `other` is certainly another namespace: an inode or a cookie known on both
    /// sides differs.
    pub fn differs(&self, other: &NsId) -> bool {
        let d = |a: u64, b: u64| a != 0 && b != 0 && a != b;
        d(self.ino, other.ino) || d(self.cookie, other.cookie)
    }

    pub fn from_bytes(b: [u8; 16]) -> NsId {
        let (ino, cookie) = b.split_at(8);
        NsId {
            ino: u64::from_be_bytes(ino.try_into().expect("8 bytes")),
            cookie: u64::from_be_bytes(cookie.try_into().expect("8 bytes")),
        }
    }
}

/// The sets and maps that hold elements.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub enum Set {
    /// `owner`: host port → the hash of the attachment holding it alone, or the container's
    /// shared hash.
    Owner,
    /// `claims`: host port . attachment hash → target, one per claimant.
    Claims,
    /// `hp4`/`hp6`: proto . port → target (every local address).
    Hp(Fam),
    /// `hip4`/`hip6`: host address . proto . port → target.
    Hip(Fam),
    /// `netns`: attachment hash → the identity of its network namespace (the element comment
    /// holds its path).
    Netns,
    /// `net4_<len>`/`net6_<len>`: source prefix . container address . proto . port, for the
    /// source prefixes of that length (`/0`, every source: container address . proto . port).
    Net(Fam, u8),
    /// `gates`: nfproto → verdict (see [`crate::layout`]).
    Gates,
}

impl Set {
    pub fn name(&self) -> String {
        match self {
            Set::Owner => "owner".into(),
            Set::Claims => "claims".into(),
            Set::Hp(f) => format!("hp{}", f.digit()),
            Set::Hip(f) => format!("hip{}", f.digit()),
            Set::Netns => "netns".into(),
            Set::Net(f, len) => format!("net{}_{len}", f.digit()),
            Set::Gates => "gates".into(),
        }
    }

    pub fn parse(name: &str) -> Option<Set> {
        Some(match name {
            "owner" => Set::Owner,
            "claims" => Set::Claims,
            "hp4" => Set::Hp(Fam::V4),
            "hp6" => Set::Hp(Fam::V6),
            "hip4" => Set::Hip(Fam::V4),
            "hip6" => Set::Hip(Fam::V6),
            "netns" => Set::Netns,
            "gates" => Set::Gates,
            _ => {
                let (fam, len) = name.strip_prefix("net")?.split_once('_')?;
                let fam = match fam {
                    "4" => Fam::V4,
                    "6" => Fam::V6,
                    _ => return None,
                };
                let len: u8 = len.parse().ok()?;
                let max = if fam == Fam::V4 { 32 } else { 128 };
                // canonical numbers only, so that name and set correspond one to one
                if len > max || len.to_string() != name.rsplit('_').next()? {
                    return None;
                }
                Set::Net(fam, len)
            }
        })
    }

    /// The sets that always exist (the `net*` sets come and go with the prefix lengths in use).
    pub const FIXED: [Set; 8] = [
        Set::Hp(Fam::V4),
        Set::Hip(Fam::V4),
        Set::Hp(Fam::V6),
        Set::Hip(Fam::V6),
        Set::Owner,
        Set::Claims,
        Set::Netns,
        Set::Gates,
    ];
}

impl fmt::Display for Set {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// The key of an element (which also names its set).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub enum Key {
    Owner(HostPort),
    Claim(HostPort, Hash),
    Dnat(HostPort),
    Masq(Masq),
    Netns(Hash),
}

impl Key {
    pub fn set(&self) -> Set {
        match self {
            Key::Owner(_) => Set::Owner,
            Key::Claim(..) => Set::Claims,
            Key::Dnat(hp) => hp.dnat_set(),
            Key::Masq(m) => Set::Net(m.fam(), m.src.prefix_len()),
            Key::Netns(_) => Set::Netns,
        }
    }

    /// The host port of an `owner`, `claims` or DNAT element.
    pub fn host_port(&self) -> Option<HostPort> {
        match self {
            Key::Owner(hp) | Key::Claim(hp, _) | Key::Dnat(hp) => Some(*hp),
            Key::Masq(_) | Key::Netns(_) => None,
        }
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pp = |hp: &HostPort| format!("{} . {}", hp.proto.as_str(), hp.port);
        match self {
            Key::Owner(hp) => write!(f, "{} . {}", hp.owner_addr(), pp(hp)),
            Key::Claim(hp, h) => write!(f, "{} . {} . {h}", hp.owner_addr(), pp(hp)),
            Key::Dnat(hp) => match hp.ip {
                Some(ip) => write!(f, "{ip} . {}", pp(hp)),
                None => f.write_str(&pp(hp)),
            },
            Key::Masq(m) if m.src.prefix_len() == 0 => {
                write!(f, "{} . {} . {}", m.ctr, m.proto.as_str(), m.port)
            }
            Key::Masq(m) => write!(f, "{} . {} . {} . {}", m.src.addr(), m.ctr, m.proto.as_str(), m.port),
            Key::Netns(h) => write!(f, "{h}"),
        }
    }
}

/// The data of a map element.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Data {
    /// `owner`: the holder's hash.
    Hash(Hash),
    /// `claims` (IPv4 written mapped into IPv6) and the DNAT maps.
    Target(Target),
    /// `netns`.
    Netns(NsId),
}

/// One element: a key and, in a map, its data.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Elem {
    pub key: Key,
    pub data: Option<Data>,
}

impl Elem {
    pub fn owner(hp: HostPort, holder: Hash) -> Elem {
        Elem { key: Key::Owner(hp), data: Some(Data::Hash(holder)) }
    }

    pub fn claim(hp: HostPort, claimant: Hash, target: Target) -> Elem {
        Elem { key: Key::Claim(hp, claimant), data: Some(Data::Target(target)) }
    }

    pub fn dnat(hp: HostPort, target: Target) -> Elem {
        Elem { key: Key::Dnat(hp), data: Some(Data::Target(target)) }
    }

    pub fn masq(m: Masq) -> Elem {
        Elem { key: Key::Masq(m), data: None }
    }

    pub fn netns(attachment: Hash, id: NsId) -> Elem {
        Elem { key: Key::Netns(attachment), data: Some(Data::Netns(id)) }
    }

    pub fn set(&self) -> Set {
        self.key.set()
    }

    /// The target of a `claims` or DNAT element.
    pub fn target(&self) -> Option<Target> {
        match self.data {
            Some(Data::Target(t)) => Some(t),
            _ => None,
        }
    }

    /// The data in nft notation ("-" for none).
    pub fn data_text(&self) -> String {
        match (&self.key, &self.data) {
            (_, None) => "-".into(),
            (_, Some(Data::Hash(h))) => h.to_string(),
            (Key::Claim(..), Some(Data::Target(t))) => format!("{} . {}", mapped(t.ip), t.port),
            (_, Some(Data::Target(t))) => format!("{} . {}", t.ip, t.port),
            (_, Some(Data::Netns(id))) => Ipv6Addr::from(id.to_bytes()).to_string(),
        }
    }
}

/// `set { key }` in nft notation, for messages.
impl fmt::Display for Elem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {{ {} }}", self.set(), self.key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_names_round_trip() {
        let mut all = Set::FIXED.to_vec();
        all.extend([
            Set::Net(Fam::V4, 0),
            Set::Net(Fam::V4, 32),
            Set::Net(Fam::V6, 64),
            Set::Net(Fam::V6, 128),
        ]);
        for s in all {
            assert_eq!(Set::parse(&s.name()), Some(s), "{s}");
        }
        for bad in ["net4_33", "net6_129", "net4_024", "net5_1", "net4_", "masq4", "net4_x"] {
            assert_eq!(Set::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn host_ports_convert_both_ways() {
        for (addr, hp) in [
            ("::ffff:0.0.0.0", HostPort { fam: Fam::V4, ip: None, proto: Proto::Tcp, port: 80 }),
            ("::", HostPort { fam: Fam::V6, ip: None, proto: Proto::Tcp, port: 80 }),
            (
                "::ffff:192.0.2.1",
                HostPort {
                    fam: Fam::V4,
                    ip: Some("192.0.2.1".parse().unwrap()),
                    proto: Proto::Tcp,
                    port: 80,
                },
            ),
            (
                "fd00::1",
                HostPort { fam: Fam::V6, ip: Some("fd00::1".parse().unwrap()), proto: Proto::Tcp, port: 80 },
            ),
        ] {
            assert_eq!(hp.owner_addr().to_string(), addr);
            assert_eq!(HostPort::from_owner_addr(hp.owner_addr(), Proto::Tcp, 80), hp);
        }
    }

    #[test]
    fn nft_notation() {
        let hp = HostPort { fam: Fam::V4, ip: None, proto: Proto::Udp, port: 53 };
        let t = Target { ip: "10.0.0.5".parse().unwrap(), port: 5353 };
        let h = Hash([0x12, 0x34, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(Elem::claim(hp, h, t).data_text(), "::ffff:10.0.0.5 . 5353");
        assert_eq!(Elem::dnat(hp, t).data_text(), "10.0.0.5 . 5353");
        assert_eq!(Elem::claim(hp, h, t).key.to_string(), "::ffff:0.0.0.0 . udp . 53 . 1234::1");
        assert_eq!(Elem::dnat(hp, t).to_string(), "hp4 { udp . 53 }");
        let m = Masq::new("10.0.0.5/24".parse().unwrap(), t.ip, Proto::Tcp, 80);
        assert_eq!(Elem::masq(m).to_string(), "net4_24 { 10.0.0.0 . 10.0.0.5 . tcp . 80 }");
        let id = NsId { ino: 0xf000_0001, cookie: 42 };
        assert_eq!(NsId::from_bytes(id.to_bytes()), id);
        assert_eq!(Elem::netns(h, id).data_text(), "0:0:f000:1::2a");
        let all = Masq::new("0.0.0.0/0".parse().unwrap(), t.ip, Proto::Tcp, 80);
        assert_eq!(Elem::masq(all).to_string(), "net4_0 { 10.0.0.5 . tcp . 80 }");
    }
}
