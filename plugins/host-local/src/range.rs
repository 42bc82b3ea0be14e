//! Address ranges and range sets: defaults, validation and the round-robin candidate order.
//!
//! Semantics follow upstream host-local:
//! - `gateway` defaults to network+1, `rangeStart` to network+1 (the iterator skips the
//!   gateway, so with a non-default gateway `.1` is allocatable), `rangeEnd` to the last address
//!   of the subnet, minus the broadcast address for IPv4;
//! - a range set is a pool of disjoint ranges of one family; one address is allocated per set;
//! - candidates start after the set's last reserved address and wrap around once.

use cni_common::spec::config::RangeConf;
use ipnet::IpNet;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// An address as an integer, for arithmetic (IPv4 in the low 32 bits).
pub fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

pub fn from_u128(v: u128, v4: bool) -> IpAddr {
    if v4 {
        IpAddr::V4(Ipv4Addr::from(v as u32))
    } else {
        IpAddr::V6(Ipv6Addr::from(v))
    }
}

/// One validated range with all defaults filled in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Range {
    pub subnet: IpNet,
    pub start: IpAddr,
    pub end: IpAddr,
    pub gateway: IpAddr,
}

impl fmt::Display for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.start, self.end)
    }
}

fn same_family(a: &IpAddr, b: &IpAddr) -> bool {
    a.is_ipv4() == b.is_ipv4()
}

impl Range {
    /// Fill in defaults and validate. Errors name the field and the value.
    pub fn canonicalize(rc: &RangeConf) -> Result<Range, String> {
        let subnet = rc.subnet;
        if subnet.addr() != subnet.network() {
            return Err(format!(
                "subnet {subnet} has host bits set: the network address is {}/{}",
                subnet.network(),
                subnet.prefix_len()
            ));
        }
        if subnet.prefix_len() > subnet.max_prefix_len() - 2 {
            return Err(format!(
                "subnet: Network {subnet} too small to allocate from (a /{} leaves fewer than 2 host bits)",
                subnet.prefix_len()
            ));
        }
        let v4 = subnet.addr().is_ipv4();
        let net = to_u128(subnet.network());
        let first = from_u128(net + 1, v4);
        let mut last = to_u128(subnet.broadcast());
        if v4 {
            last -= 1;
        }
        let in_subnet = |field: &str, ip: IpAddr| -> Result<IpAddr, String> {
            let ip = ip.to_canonical();
            if !same_family(&ip, &subnet.addr()) {
                return Err(format!("{field}: IP {ip} is not the same protocol as subnet {subnet}"));
            }
            if !subnet.contains(&ip) {
                return Err(format!("{field}: {ip} not in network {subnet}"));
            }
            Ok(ip)
        };
        let gateway = match rc.gateway {
            None => first,
            Some(g) => in_subnet("gateway", g)
                .map_err(|_| format!("gateway: gateway {g} not in network {subnet}"))?,
        };
        let start = match rc.range_start {
            None => first,
            Some(s) => in_subnet("rangeStart", s)?,
        };
        let end = match rc.range_end {
            None => from_u128(last, v4),
            Some(e) => {
                let e = in_subnet("rangeEnd", e)?;
                if to_u128(e) < to_u128(start) {
                    return Err(format!("rangeEnd: {e} is in network {subnet} but before start {start}"));
                }
                e
            }
        };
        Ok(Range { subnet, start, end, gateway })
    }

    pub fn is_v4(&self) -> bool {
        self.start.is_ipv4()
    }

    /// Inside `[start, end]` (and so inside the subnet), same family.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        same_family(&ip, &self.start) && (to_u128(self.start)..=to_u128(self.end)).contains(&to_u128(ip))
    }

    /// Same family and the `[start, end]` intervals intersect.
    pub fn overlaps(&self, other: &Range) -> bool {
        same_family(&self.start, &other.start)
            && to_u128(self.start) <= to_u128(other.end)
            && to_u128(other.start) <= to_u128(self.end)
    }

    /// Addresses that can be handed out: the range minus its gateway.
    pub fn capacity(&self) -> u128 {
        let n = to_u128(self.end) - to_u128(self.start) + 1;
        if self.contains(self.gateway) {
            n - 1
        } else {
            n
        }
    }
}

/// A validated, non-empty pool of disjoint ranges of one family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RangeSet {
    pub ranges: Vec<Range>,
}

impl fmt::Display for RangeSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.ranges.iter().map(|r| r.to_string()).collect();
        f.write_str(&parts.join(","))
    }
}

impl RangeSet {
    /// Canonicalize every range, check family and overlaps within the set.
    pub fn canonicalize(confs: &[RangeConf]) -> Result<RangeSet, String> {
        if confs.is_empty() {
            return Err("empty range set: give at least one range with a subnet".into());
        }
        let mut ranges: Vec<Range> = Vec::with_capacity(confs.len());
        for (i, rc) in confs.iter().enumerate() {
            let r = Range::canonicalize(rc).map_err(|e| format!("range {i}: {e}"))?;
            if let Some(first) = ranges.first() {
                if first.is_v4() != r.is_v4() {
                    return Err(format!(
                        "mixed address families: range {i} ({}) is not the family of range 0 ({})",
                        r.subnet, first.subnet
                    ));
                }
            }
            if let Some((j, other)) = ranges.iter().enumerate().find(|(_, o)| o.overlaps(&r)) {
                return Err(format!("subnets {other} and {r} overlap (ranges {j} and {i})"));
            }
            ranges.push(r);
        }
        Ok(RangeSet { ranges })
    }

    pub fn is_v4(&self) -> bool {
        self.ranges[0].is_v4()
    }

    pub fn range_for(&self, ip: IpAddr) -> Option<&Range> {
        self.ranges.iter().find(|r| r.contains(ip))
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        self.range_for(ip).is_some()
    }

    pub fn overlaps(&self, other: &RangeSet) -> bool {
        self.ranges.iter().any(|a| other.ranges.iter().any(|b| a.overlaps(b)))
    }

    /// Round-robin candidate order: the address after `last` when `last` is in the set
    /// (moving to the next range's start after a range's end, wrapping from the last range to
    /// the first), otherwise the first range's start. Every allocatable address is produced
    /// once; gateways are skipped.
    pub fn candidates(&self, last: Option<IpAddr>) -> Candidates<'_> {
        let total = self
            .ranges
            .iter()
            .fold(0u128, |acc, r| acc.saturating_add(to_u128(r.end) - to_u128(r.start) + 1));
        let mut it = Candidates { set: self, idx: 0, cur: to_u128(self.ranges[0].start), left: total };
        if let Some(last) = last.map(|l| l.to_canonical()) {
            if let Some(i) = self.ranges.iter().position(|r| r.contains(last)) {
                it.idx = i;
                it.cur = to_u128(last);
                it.advance();
            }
        }
        it
    }

    /// Number of addresses that can be handed out (saturating).
    pub fn capacity(&self) -> u128 {
        self.ranges.iter().fold(0u128, |acc, r| acc.saturating_add(r.capacity()))
    }
}

/// Iterator over allocation candidates of a range set; yields the address and its range.
pub struct Candidates<'a> {
    set: &'a RangeSet,
    idx: usize,
    cur: u128,
    left: u128,
}

impl Candidates<'_> {
    fn advance(&mut self) {
        let r = &self.set.ranges[self.idx];
        if self.cur == to_u128(r.end) {
            self.idx = (self.idx + 1) % self.set.ranges.len();
            self.cur = to_u128(self.set.ranges[self.idx].start);
        } else {
            self.cur += 1;
        }
    }
}

impl<'a> Iterator for Candidates<'a> {
    type Item = (IpAddr, &'a Range);

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.left == 0 {
                return None;
            }
            self.left -= 1;
            let set: &'a RangeSet = self.set;
            let r = &set.ranges[self.idx];
            let ip = from_u128(self.cur, r.is_v4());
            self.advance();
            if ip != r.gateway {
                return Some((ip, r));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rc(subnet: &str, start: Option<&str>, end: Option<&str>, gw: Option<&str>) -> RangeConf {
        RangeConf {
            subnet: subnet.parse().unwrap(),
            range_start: start.map(|s| s.parse().unwrap()),
            range_end: end.map(|s| s.parse().unwrap()),
            gateway: gw.map(|s| s.parse().unwrap()),
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn v4_defaults() {
        let r = Range::canonicalize(&rc("192.0.2.0/24", None, None, None)).unwrap();
        assert_eq!(r.start, ip("192.0.2.1"));
        assert_eq!(r.end, ip("192.0.2.254"), "broadcast excluded");
        assert_eq!(r.gateway, ip("192.0.2.1"));
        assert_eq!(r.capacity(), 253);
    }

    #[test]
    fn v6_defaults_include_all_ones() {
        let r = Range::canonicalize(&rc("2001:db8:1::/64", None, None, None)).unwrap();
        assert_eq!(r.start, ip("2001:db8:1::1"));
        assert_eq!(r.end, ip("2001:db8:1::ffff:ffff:ffff:ffff"));
        assert_eq!(r.gateway, ip("2001:db8:1::1"));
    }

    #[test]
    fn small_v4_subnet() {
        let r = Range::canonicalize(&rc("192.0.2.0/30", None, None, None)).unwrap();
        assert_eq!((r.start, r.end, r.gateway), (ip("192.0.2.1"), ip("192.0.2.2"), ip("192.0.2.1")));
        let set = RangeSet { ranges: vec![r] };
        let all: Vec<IpAddr> = set.candidates(None).map(|(a, _)| a).collect();
        assert_eq!(all, vec![ip("192.0.2.2")]);
        // a non-default gateway makes .1 allocatable (observed upstream behaviour)
        let r = Range::canonicalize(&rc("192.0.2.0/30", None, None, Some("192.0.2.2"))).unwrap();
        let set = RangeSet { ranges: vec![r] };
        let all: Vec<IpAddr> = set.candidates(None).map(|(a, _)| a).collect();
        assert_eq!(all, vec![ip("192.0.2.1")]);
    }

    #[test]
    fn host_bits_and_masked_addresses_rejected() {
        let e = Range::canonicalize(&rc("192.0.2.5/24", None, None, None)).unwrap_err();
        assert!(e.contains("192.0.2.5/24 has host bits set") && e.contains("192.0.2.0/24"), "{e}");
        let e = Range::canonicalize(&rc("2001:db8::1/64", None, None, None)).unwrap_err();
        assert!(e.contains("host bits"), "{e}");
    }

    #[test]
    fn too_small_networks() {
        for s in ["192.0.2.0/31", "192.0.2.0/32", "2001:db8::/127", "2001:db8::/128"] {
            let e = Range::canonicalize(&rc(s, None, None, None)).unwrap_err();
            assert!(e.contains("too small to allocate from"), "{s}: {e}");
        }
        assert!(Range::canonicalize(&rc("2001:db8::/126", None, None, None)).is_ok());
    }

    #[test]
    fn invalid_start_end_gateway() {
        let cases = [
            (
                rc("10.0.0.0/24", Some("10.0.1.1"), None, None),
                "rangeStart: 10.0.1.1 not in network 10.0.0.0/24",
            ),
            (
                rc("10.0.0.0/24", None, Some("10.0.1.1"), None),
                "rangeEnd: 10.0.1.1 not in network 10.0.0.0/24",
            ),
            (
                rc("10.0.0.0/24", Some("10.0.0.50"), Some("10.0.0.40"), None),
                "rangeEnd: 10.0.0.40 is in network 10.0.0.0/24 but before start 10.0.0.50",
            ),
            (
                rc("10.0.0.0/24", None, None, Some("10.0.1.1")),
                "gateway: gateway 10.0.1.1 not in network 10.0.0.0/24",
            ),
            (
                rc("10.0.0.0/24", Some("2001:db8::1"), None, None),
                "rangeStart: IP 2001:db8::1 is not the same protocol as subnet 10.0.0.0/24",
            ),
        ];
        for (c, want) in cases {
            assert_eq!(Range::canonicalize(&c).unwrap_err(), want);
        }
    }

    #[test]
    fn explicit_fields_parse() {
        let r =
            Range::canonicalize(&rc("10.0.0.0/24", Some("10.0.0.10"), Some("10.0.0.20"), Some("10.0.0.254")))
                .unwrap();
        assert_eq!((r.start, r.end, r.gateway), (ip("10.0.0.10"), ip("10.0.0.20"), ip("10.0.0.254")));
        assert_eq!(r.to_string(), "10.0.0.10-10.0.0.20");
    }

    #[test]
    fn membership() {
        let r = Range::canonicalize(&rc("10.0.0.0/24", Some("10.0.0.10"), Some("10.0.0.20"), None)).unwrap();
        assert!(r.contains(ip("10.0.0.10")) && r.contains(ip("10.0.0.20")) && r.contains(ip("10.0.0.15")));
        assert!(!r.contains(ip("10.0.0.9")) && !r.contains(ip("10.0.0.21")));
        assert!(!r.contains(ip("10.0.1.15")) && !r.contains(ip("::a00:f")));
        assert!(r.contains(ip("::ffff:10.0.0.15")), "v4-mapped form is the same address");
    }

    #[test]
    fn overlap_table() {
        let mk = |s, a: Option<&str>, b: Option<&str>| Range::canonicalize(&rc(s, a, b, None)).unwrap();
        let cases = [
            (mk("10.0.0.0/24", None, None), mk("10.0.1.0/24", None, None), false),
            (mk("10.0.0.0/24", None, None), mk("2001:db8::/64", None, None), false),
            (mk("10.0.0.0/24", None, None), mk("10.0.0.0/24", None, None), true),
            (mk("10.0.0.0/16", None, None), mk("10.0.5.0/24", None, None), true),
            (
                mk("10.0.0.0/24", Some("10.0.0.1"), Some("10.0.0.100")),
                mk("10.0.0.0/24", Some("10.0.0.101"), None),
                false,
            ),
            (
                mk("10.0.0.0/24", Some("10.0.0.1"), Some("10.0.0.100")),
                mk("10.0.0.0/24", Some("10.0.0.100"), None),
                true,
            ),
        ];
        for (i, (a, b, want)) in cases.iter().enumerate() {
            assert_eq!(a.overlaps(b), *want, "case {i}");
            assert_eq!(b.overlaps(a), *want, "case {i} reversed");
        }
    }

    #[test]
    fn set_rules() {
        assert!(RangeSet::canonicalize(&[]).unwrap_err().contains("empty range set"));
        let e = RangeSet::canonicalize(&[
            rc("10.0.0.0/24", None, None, None),
            rc("2001:db8::/64", None, None, None),
        ])
        .unwrap_err();
        assert!(e.starts_with("mixed address families"), "{e}");
        let e = RangeSet::canonicalize(&[
            rc("10.0.0.0/24", None, None, None),
            rc("10.0.0.0/25", None, None, None),
        ])
        .unwrap_err();
        assert!(e.starts_with("subnets 10.0.0.1-10.0.0.254 and 10.0.0.1-10.0.0.126 overlap"), "{e}");
    }

    fn set(specs: &[(&str, Option<&str>, Option<&str>)]) -> RangeSet {
        let confs: Vec<RangeConf> = specs.iter().map(|(s, a, b)| rc(s, *a, *b, None)).collect();
        RangeSet::canonicalize(&confs).unwrap()
    }

    fn first_n(s: &RangeSet, last: Option<&str>, n: usize) -> Vec<String> {
        s.candidates(last.map(ip)).take(n).map(|(a, _)| a.to_string()).collect()
    }

    #[test]
    fn iterator_from_beginning_middle_and_end() {
        let s = set(&[("192.168.1.0/29", None, None)]); // .1 (gw) .2 … .6
        assert_eq!(first_n(&s, None, 2), ["192.168.1.2", "192.168.1.3"]);
        assert_eq!(first_n(&s, Some("192.168.1.3"), 2), ["192.168.1.4", "192.168.1.5"]);
        assert_eq!(first_n(&s, Some("192.168.1.6"), 2), ["192.168.1.2", "192.168.1.3"], "wraps, skips gw");
        // every address exactly once, the last one offered is the last reserved itself
        let all = first_n(&s, Some("192.168.1.4"), 100);
        assert_eq!(all, ["192.168.1.5", "192.168.1.6", "192.168.1.2", "192.168.1.3", "192.168.1.4"]);
        // never the broadcast address
        assert!(!s.candidates(None).any(|(a, _)| a == ip("192.168.1.7")));
    }

    #[test]
    fn last_reserved_at_end_of_one_range_goes_to_next_range_start() {
        let s = set(&[
            ("192.168.1.0/24", Some("192.168.1.10"), Some("192.168.1.11")),
            ("192.168.2.0/24", Some("192.168.2.20"), Some("192.168.2.21")),
        ]);
        assert_eq!(first_n(&s, Some("192.168.1.11"), 1), ["192.168.2.20"]);
        assert_eq!(first_n(&s, Some("192.168.2.21"), 1), ["192.168.1.10"], "last range wraps to first");
        assert_eq!(first_n(&s, None, 1), ["192.168.1.10"], "no last reserved: first range start");
        assert_eq!(first_n(&s, Some("10.9.9.9"), 1), ["192.168.1.10"], "last reserved outside set ignored");
        assert_eq!(s.candidates(None).count(), 4);
    }

    #[test]
    fn capacity_counts_without_gateways() {
        let s = set(&[("10.0.0.0/29", None, None), ("10.0.1.0/29", Some("10.0.1.2"), None)]);
        assert_eq!(s.capacity(), 5 + 5);
        assert_eq!(s.capacity() as usize, s.candidates(None).count());
    }
}
