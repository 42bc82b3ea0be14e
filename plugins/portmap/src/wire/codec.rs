//! Our elements as nf_tables netlink elements and back: keys and data in nft's byte layout for
//! each set's type (concatenation components padded to 4 bytes), so that the elements we write
//! are the ones `nft add element` writes and `nft list` shows them the same way.

use crate::config::{Fam, Proto};
use crate::model::{mapped, Data, Elem, Hash, HostPort, Key, Masq, NsId, Set, Target};
use cni_common::netlink::nft::Verdict;
use cni_common::netlink::nft::{concat, split_concat, NftData, NftElem};
use ipnet::IpNet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

fn octets(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

fn addr_of(b: &[u8]) -> Option<IpAddr> {
    Some(match b.len() {
        4 => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(b).ok()?)),
        16 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(b).ok()?)),
        _ => return None,
    })
}

fn v6_of(b: &[u8]) -> Option<Ipv6Addr> {
    Some(Ipv6Addr::from(<[u8; 16]>::try_from(b).ok()?))
}

fn port_of(b: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes(b.try_into().ok()?))
}

fn proto_of(b: &[u8]) -> Option<Proto> {
    match b {
        [n] => Proto::from_number(*n),
        _ => None,
    }
}

fn addr_len(f: Fam) -> usize {
    if f == Fam::V4 {
        4
    } else {
        16
    }
}

/// An address in its own family's width (IPv4 in 4 bytes).
fn addr_in(f: Fam, ip: IpAddr) -> Vec<u8> {
    match (f, ip) {
        (Fam::V4, IpAddr::V6(a)) => {
            a.to_ipv4_mapped().map(|v| v.octets().to_vec()).unwrap_or_else(|| octets(ip))
        }
        _ => octets(ip),
    }
}

fn key_bytes(k: &Key) -> Vec<u8> {
    let pp = |hp: &HostPort| (vec![hp.proto.number()], hp.port.to_be_bytes().to_vec());
    match k {
        Key::Owner(hp) => {
            let (p, n) = pp(hp);
            concat(&[&hp.owner_addr().octets(), &p, &n])
        }
        Key::Claim(hp, h) => {
            let (p, n) = pp(hp);
            concat(&[&hp.owner_addr().octets(), &p, &n, &h.0])
        }
        Key::Dnat(hp) => {
            let (p, n) = pp(hp);
            match hp.ip {
                Some(ip) => concat(&[&addr_in(hp.fam, ip), &p, &n]),
                None => concat(&[&p, &n]),
            }
        }
        // every source (`/0`): no source in the key
        Key::Masq(m) if m.src.prefix_len() == 0 => {
            concat(&[&octets(m.ctr), &[m.proto.number()], &m.port.to_be_bytes()])
        }
        Key::Masq(m) => {
            concat(&[&octets(m.src.addr()), &octets(m.ctr), &[m.proto.number()], &m.port.to_be_bytes()])
        }
        Key::Netns(h) => h.0.to_vec(),
    }
}

fn data_bytes(e: &Elem) -> Option<Vec<u8>> {
    Some(match (e.key, e.data?) {
        (_, Data::Hash(h)) => h.0.to_vec(),
        (Key::Claim(..), Data::Target(t)) => concat(&[&mapped(t.ip).octets(), &t.port.to_be_bytes()]),
        (k, Data::Target(t)) => {
            let fam = k.host_port().map(|hp| hp.fam).unwrap_or(Fam::of(&t.ip));
            concat(&[&addr_in(fam, t.ip), &t.port.to_be_bytes()])
        }
        (_, Data::Netns(id)) => id.to_bytes().to_vec(),
    })
}

/// Our element as a netlink element, with `comment` (none when empty).
pub fn encode(e: &Elem, comment: Option<&str>) -> NftElem {
    let mut out = NftElem::new(key_bytes(&e.key));
    if let Some(d) = data_bytes(e) {
        out.data = Some(NftData::Value(d));
    }
    out.comment = comment.filter(|c| !c.is_empty()).map(str::to_string);
    out
}

/// What a deletion names: the key alone.
pub fn encode_key(k: &Key) -> NftElem {
    NftElem::new(key_bytes(k))
}

fn decode_key(set: Set, b: &[u8]) -> Option<Key> {
    let hp = |fam, ip: Option<&[u8]>, p: &[u8], n: &[u8]| -> Option<HostPort> {
        let ip = match ip {
            Some(b) => Some(addr_of(b).filter(|a| Fam::of(a) == fam)?),
            None => None,
        };
        Some(HostPort { fam, ip, proto: proto_of(p)?, port: port_of(n)? })
    };
    Some(match set {
        Set::Owner => {
            let f = split_concat(b, &[16, 1, 2])?;
            Key::Owner(HostPort::from_owner_addr(v6_of(f[0])?, proto_of(f[1])?, port_of(f[2])?))
        }
        Set::Claims => {
            let f = split_concat(b, &[16, 1, 2, 16])?;
            let port = HostPort::from_owner_addr(v6_of(f[0])?, proto_of(f[1])?, port_of(f[2])?);
            Key::Claim(port, Hash(f[3].try_into().ok()?))
        }
        Set::Hp(fam) => {
            let f = split_concat(b, &[1, 2])?;
            Key::Dnat(hp(fam, None, f[0], f[1])?)
        }
        Set::Hip(fam) => {
            let f = split_concat(b, &[addr_len(fam), 1, 2])?;
            Key::Dnat(hp(fam, Some(f[0]), f[1], f[2])?)
        }
        Set::Net(fam, 0) => {
            let f = split_concat(b, &[addr_len(fam), 1, 2])?;
            let ctr = addr_of(f[0])?;
            let any = if fam == Fam::V4 {
                IpAddr::V4(Ipv4Addr::UNSPECIFIED)
            } else {
                IpAddr::V6(Ipv6Addr::UNSPECIFIED)
            };
            let src = IpNet::new(any, 0).ok()?;
            Key::Masq(Masq { src, ctr, proto: proto_of(f[1])?, port: port_of(f[2])? })
        }
        Set::Net(fam, len) => {
            let n = addr_len(fam);
            let f = split_concat(b, &[n, n, 1, 2])?;
            let src = IpNet::new(addr_of(f[0])?, len).ok()?;
            if src.trunc() != src {
                return None; // host bits set: not an element we write
            }
            Key::Masq(Masq { src, ctr: addr_of(f[1])?, proto: proto_of(f[2])?, port: port_of(f[3])? })
        }
        Set::Netns => Key::Netns(Hash(b.try_into().ok()?)),
        Set::Gates => return None,
    })
}

fn decode_data(key: &Key, b: &[u8]) -> Option<Data> {
    Some(match key {
        Key::Owner(_) => Data::Hash(Hash(b.try_into().ok()?)),
        Key::Claim(..) => {
            let f = split_concat(b, &[16, 2])?;
            let ip = v6_of(f[0])?;
            let ip = ip.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(IpAddr::V6(ip));
            Data::Target(Target { ip, port: port_of(f[1])? })
        }
        Key::Dnat(hp) => {
            let f = split_concat(b, &[addr_len(hp.fam), 2])?;
            Data::Target(Target { ip: addr_of(f[0])?, port: port_of(f[1])? })
        }
        Key::Netns(_) => Data::Netns(NsId::from_bytes(b.try_into().ok()?)),
        Key::Masq(_) => return None,
    })
}

/// A netlink element of `set` as ours; None when it does not have the set's layout (then it is
/// not an element this plugin wrote, and it is left alone).
pub fn decode(set: Set, e: &NftElem) -> Option<Elem> {
    if e.key_end.is_some() || e.interval_end {
        return None;
    }
    let key = decode_key(set, &e.key)?;
    let data = match (&e.data, key) {
        (None, Key::Masq(_)) => None,
        (Some(NftData::Value(v)), k) if !matches!(k, Key::Masq(_)) => Some(decode_data(&k, v)?),
        _ => return None,
    };
    Some(Elem { key, data })
}

/// The `gates` elements sending each family to its gate chain.
pub fn gates_elements(g4: &str, g6: &str) -> Vec<NftElem> {
    vec![
        NftElem::new(vec![2]).data(NftData::Verdict(Verdict::Jump(g4.into()))),
        NftElem::new(vec![10]).data(NftData::Verdict(Verdict::Jump(g6.into()))),
    ]
}

/// A `gates` element: (nfproto, verdict).
pub fn decode_gate(e: &NftElem) -> Option<(u8, Verdict)> {
    match (e.key.as_slice(), &e.data) {
        ([n], Some(NftData::Verdict(v))) => Some((*n, v.clone())),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hp(fam: Fam, ip: Option<&str>, proto: Proto, port: u16) -> HostPort {
        HostPort { fam, ip: ip.map(|s| s.parse().unwrap()), proto, port }
    }

    fn t(ip: &str, port: u16) -> Target {
        Target { ip: ip.parse().unwrap(), port }
    }

    fn masq(src: &str, ctr: &str, proto: Proto, port: u16) -> Elem {
        Elem::masq(Masq::new(src.parse().unwrap(), ctr.parse().unwrap(), proto, port))
    }

    #[test]
    fn every_kind_of_element_round_trips() {
        let h = Hash([0x12, 0x34, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        let cases = [
            Elem::dnat(hp(Fam::V4, None, Proto::Tcp, 8080), t("10.0.0.5", 80)),
            Elem::dnat(hp(Fam::V4, Some("192.0.2.1"), Proto::Udp, 53), t("10.0.0.5", 5353)),
            Elem::dnat(hp(Fam::V6, None, Proto::Sctp, 9), t("fd00::5", 9)),
            Elem::dnat(hp(Fam::V6, Some("fd00::1"), Proto::Tcp, 443), t("fd00::5", 8443)),
            Elem::owner(hp(Fam::V4, None, Proto::Tcp, 8080), h),
            Elem::owner(hp(Fam::V6, None, Proto::Udp, 53), h),
            Elem::claim(hp(Fam::V4, Some("192.0.2.1"), Proto::Tcp, 80), h, t("10.0.0.5", 80)),
            Elem::claim(hp(Fam::V6, None, Proto::Tcp, 80), h, t("fd00::5", 80)),
            masq("10.0.0.0/24", "10.0.0.5", Proto::Tcp, 80),
            masq("127.0.0.1/32", "10.0.0.5", Proto::Udp, 53),
            masq("0.0.0.0/0", "10.0.0.5", Proto::Tcp, 80),
            masq("fd00::/64", "fd00::5", Proto::Tcp, 80),
            masq("::/0", "fd00::5", Proto::Tcp, 80),
            Elem::netns(h, NsId { ino: 4026532001, cookie: 7 }),
        ];
        for e in &cases {
            let n = encode(e, Some("n,c,eth0"));
            assert_eq!(decode(e.set(), &n), Some(*e), "{e} does not decode: {n:?}");
            assert_eq!(n.comment.as_deref(), Some("n,c,eth0"));
        }
        // the layout is nft's: protocol and port padded to 4 bytes
        let n = encode(&cases[8], None);
        assert_eq!(n.key, [10, 0, 0, 0, 10, 0, 0, 5, 6, 0, 0, 0, 0, 80, 0, 0]);
        assert!(n.key_end.is_none() && n.comment.is_none());
        assert_eq!(encode(&cases[4], None).key.len(), 16 + 4 + 4);
        // what does not fit the set's layout is not ours
        assert!(decode(Set::Hp(Fam::V4), &NftElem::new(vec![6, 0, 0, 0])).is_none());
        assert!(decode(Set::Net(Fam::V4, 24), &encode(&cases[0], None)).is_none());
        let m24 = masq("10.0.1.0/24", "10.0.1.5", Proto::Tcp, 80);
        assert!(decode(Set::Net(Fam::V4, 16), &encode(&m24, None)).is_none(), "host bits set for /16");
        assert_eq!(encode(&cases[10], None).key, [10, 0, 0, 5, 6, 0, 0, 0, 0, 80, 0, 0], "/0: no source");
        assert!(decode(Set::Hp(Fam::V6), &encode(&cases[0], None)).is_none());
        let mut odd = encode(&cases[0], None);
        odd.key[0] = 1; // icmp
        assert!(decode(Set::Hp(Fam::V4), &odd).is_none());
    }

    #[test]
    fn gates() {
        let g = gates_elements("gate4", "gate6_0123");
        assert_eq!(decode_gate(&g[0]), Some((2, Verdict::Jump("gate4".into()))));
        assert_eq!(decode_gate(&g[1]), Some((10, Verdict::Jump("gate6_0123".into()))));
    }
}
