//! The previous layout of the masquerade part, read for migration.
//!
//! Until this layout, `masquerading` held `ct status dnat ip saddr . ip daddr . meta l4proto .
//! th dport @masq4 masquerade` (and the same with `ip6` and `@masq6`), `masq4`/`masq6` being
//! concatenated **interval** sets (the source part a prefix), which the kernel keeps in its
//! pipapo backend: adding or removing one element costs time in proportion to the set's size.
//! An element `<prefix> . <container address> . <proto> . <port>` becomes the element of the
//! same meaning in the hash set of the prefix's length (`net4_<len>`/`net6_<len>`).
//!
//! The first ADD, DEL or GC that reads a table in the previous layout converts it in the one
//! transaction it commits anyway: the masquerade part is rebuilt, the converted elements are
//! added with their comments, and the old sets are deleted (see [`crate::wire::plan_ops`]).
//! CHECK reads the old layout as it is, and changes nothing.

use crate::config::{Fam, Proto};
use crate::model::Masq;
use crate::table::Listing;
use cni_common::netlink::nft::{split_concat, NftElem};
use ipnet::IpNet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The sets of the previous layout, and the family of each.
pub const SETS: [(&str, Fam); 2] = [("masq4", Fam::V4), ("masq6", Fam::V6)];

/// The previous layout's sets that the table's `masquerading` chain still uses.
pub fn sets_in_use(l: &Listing) -> Vec<String> {
    SETS.iter().filter(|(s, _)| l.uses_set("masquerading", s)).map(|(s, _)| s.to_string()).collect()
}

/// Whether the previous layout's masquerade rules are intact (for CHECK before migration).
pub fn problem(l: &Listing) -> Option<String> {
    let missing: Vec<&str> =
        SETS.iter().map(|(s, _)| *s).filter(|s| !l.uses_set("masquerading", s)).collect();
    (!missing.is_empty()).then(|| format!("chain masquerading lacks its rule using @{}", missing.join(", @")))
}

fn addr_of(b: &[u8]) -> Option<IpAddr> {
    Some(match b.len() {
        4 => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(b).ok()?)),
        16 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(b).ok()?)),
        _ => return None,
    })
}

fn to_u128(b: &[u8]) -> u128 {
    b.iter().fold(0u128, |acc, x| (acc << 8) | u128::from(*x))
}

/// The range `start`–`end` as a prefix; None when it is not one.
fn prefix(start: &[u8], end: &[u8]) -> Option<IpNet> {
    let bits = start.len() * 8;
    let (s, e) = (to_u128(start), to_u128(end));
    let host = s ^ e;
    // a prefix: the differing bits are exactly the low ones, all 0 in start and 1 in end
    if host & host.wrapping_add(1) != 0 || s & host != 0 || e & host != host {
        return None;
    }
    let len = bits - (128 - host.leading_zeros()) as usize;
    IpNet::new(addr_of(start)?, len as u8).ok()
}

/// An element of `masq4`/`masq6` (`<range> . <container> . <proto> . <port>`, the range as
/// key and key end) as the element of the new layout; None when it is not one we wrote (a
/// range that is not a prefix, an unknown protocol).
pub fn decode(fam: Fam, e: &NftElem) -> Option<Masq> {
    let n = if fam == Fam::V4 { 4 } else { 16 };
    let lens = [n, n, 1, 2];
    let start = split_concat(&e.key, &lens)?;
    let end = match &e.key_end {
        Some(k) => split_concat(k, &lens)?,
        None => start.clone(),
    };
    if start[1..] != end[1..] {
        return None;
    }
    let src = prefix(start[0], end[0])?;
    let proto = match start[2] {
        [p] => Proto::from_number(*p)?,
        _ => return None,
    };
    let port = u16::from_be_bytes(start[3].try_into().ok()?);
    Some(Masq::new(src, addr_of(start[1])?, proto, port))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cni_common::netlink::nft::concat;

    /// An element as the previous layout wrote it (its codec, kept here as the reference).
    fn old(start: &str, end: &str, ctr: &str, proto: u8, port: u16) -> NftElem {
        let o = |s: &str| match s.parse::<IpAddr>().unwrap() {
            IpAddr::V4(a) => a.octets().to_vec(),
            IpAddr::V6(a) => a.octets().to_vec(),
        };
        let key = concat(&[&o(start), &o(ctr), &[proto], &port.to_be_bytes()]);
        let key_end = concat(&[&o(end), &o(ctr), &[proto], &port.to_be_bytes()]);
        NftElem::new(key).key_end(key_end)
    }

    #[test]
    fn old_elements_convert() {
        let m = |s: &str, c: &str, p: Proto, port: u16| {
            Masq::new(s.parse().unwrap(), c.parse().unwrap(), p, port)
        };
        let cases = [
            (old("10.0.0.0", "10.0.0.255", "10.0.0.5", 6, 80), m("10.0.0.0/24", "10.0.0.5", Proto::Tcp, 80)),
            (
                old("127.0.0.1", "127.0.0.1", "10.0.0.5", 17, 53),
                m("127.0.0.1/32", "10.0.0.5", Proto::Udp, 53),
            ),
            (
                old("0.0.0.0", "255.255.255.255", "10.0.0.5", 6, 80),
                m("0.0.0.0/0", "10.0.0.5", Proto::Tcp, 80),
            ),
            (
                old("fd00::", "fd00::ffff:ffff:ffff:ffff", "fd00::5", 132, 9),
                m("fd00::/64", "fd00::5", Proto::Sctp, 9),
            ),
            (
                old("::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "fd00::5", 6, 80),
                m("::/0", "fd00::5", Proto::Tcp, 80),
            ),
        ];
        for (e, want) in &cases {
            let fam = want.fam();
            assert_eq!(decode(fam, e), Some(*want), "{want:?}");
        }
        // a range that is no prefix, an unknown protocol: not ours
        assert_eq!(decode(Fam::V4, &old("10.0.0.3", "10.0.0.9", "10.0.0.5", 6, 80)), None);
        assert_eq!(decode(Fam::V4, &old("10.0.0.0", "10.0.0.255", "10.0.0.5", 1, 80)), None);
        assert_eq!(decode(Fam::V6, &cases[0].0), None, "wrong family");
    }
}
