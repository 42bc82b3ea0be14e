//! Routes: list (all tables) and add (exclusive, append for ECMP-style duplicates, or replace).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use netlink_packet_core::{
    NlasIterator, ParseableParametrized, NLM_F_APPEND, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE,
};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteLwEnCapType, RouteMessage, RouteMetric, RouteNextHop,
};
use netlink_packet_route::RouteNetlinkMessage;

use super::{af_of, family_of_af, Family, Netlink, NlError};

const RTM_NEWROUTE: u16 = 24;
const ROUTE_HEADER_LEN: usize = 12;

/// `RT_TABLE_MAIN`.
pub const TABLE_MAIN: u32 = 254;
/// `RT_SCOPE_LINK`: a route to hosts directly on the link.
pub const SCOPE_LINK: u8 = 253;
/// `RT_SCOPE_UNIVERSE`.
pub const SCOPE_UNIVERSE: u8 = 0;
const RTPROT_BOOT: u8 = 3;

/// The route type (`RTN_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RouteKind {
    Unicast,
    Local,
    Broadcast,
    Anycast,
    Multicast,
    Blackhole,
    Unreachable,
    Prohibit,
    Throw,
    Other(u8),
}

impl From<u8> for RouteKind {
    fn from(v: u8) -> Self {
        match v {
            1 => RouteKind::Unicast,
            2 => RouteKind::Local,
            3 => RouteKind::Broadcast,
            4 => RouteKind::Anycast,
            5 => RouteKind::Multicast,
            6 => RouteKind::Blackhole,
            7 => RouteKind::Unreachable,
            8 => RouteKind::Prohibit,
            9 => RouteKind::Throw,
            other => RouteKind::Other(other),
        }
    }
}

/// One path of a multipath route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NextHop {
    pub gw: Option<IpAddr>,
    pub oif: Option<u32>,
    /// Relative weight (`rtnh_hops + 1`).
    pub weight: u16,
}

/// A route as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// Destination network (`0.0.0.0/0` or `::/0` for a default route).
    pub dst: IpNet,
    pub gw: Option<IpAddr>,
    pub oif: Option<u32>,
    pub table: u32,
    /// The metric; IPv6 routes always have one (1024 unless set).
    pub priority: Option<u32>,
    /// Raw `RT_SCOPE_*`.
    pub scope: u8,
    /// Raw `RTPROT_*` (2 = kernel, 3 = boot, 4 = static, …).
    pub protocol: u8,
    pub mtu: Option<u32>,
    pub advmss: Option<u32>,
    pub kind: RouteKind,
    /// Preferred source address (`src` in `ip route`).
    pub prefsrc: Option<IpAddr>,
    /// Paths of a multipath route (the kernel reports IPv6 routes added with `append` as one
    /// route with several next hops); empty for a single-path route, which uses `gw`/`oif`.
    pub nexthops: Vec<NextHop>,
}

impl Route {
    /// Every (gateway, output interface) pair of the route: the multipath next hops, or the
    /// single `gw`/`oif`.
    pub fn paths(&self) -> Vec<(Option<IpAddr>, Option<u32>)> {
        if self.nexthops.is_empty() {
            vec![(self.gw, self.oif)]
        } else {
            self.nexthops.iter().map(|h| (h.gw, h.oif)).collect()
        }
    }
}

/// A route to add.
///
/// Defaults (from [`RouteSpec::new`]): main table, universe scope, no metric, protocol "boot"
/// as `ip route add` and the Go plugins use; exclusive create (EEXIST when an identical route
/// exists).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteSpec {
    /// Host bits are cleared before sending (`10.1.2.3/24` means `10.1.2.0/24`).
    pub dst: IpNet,
    pub gw: Option<IpAddr>,
    pub oif: Option<u32>,
    pub table: Option<u32>,
    pub priority: Option<u32>,
    /// Raw `RT_SCOPE_*`; universe when unset (as the Go plugins do, even without gateway).
    pub scope: Option<u8>,
    /// Raw `RTPROT_*`.
    pub protocol: Option<u8>,
    pub mtu: Option<u32>,
    pub advmss: Option<u32>,
    /// `NLM_F_APPEND` instead of `NLM_F_EXCL`: add even when a route to the same destination
    /// exists (ECMP-style duplicates, like Go's `RouteAddEcmp` used by `ConfigureIface`).
    pub append: bool,
    /// `NLM_F_REPLACE`: replace an existing route to the same destination (wins over append).
    pub replace: bool,
}

impl RouteSpec {
    pub fn new(dst: IpNet) -> Self {
        RouteSpec {
            dst,
            gw: None,
            oif: None,
            table: None,
            priority: None,
            scope: None,
            protocol: None,
            mtu: None,
            advmss: None,
            append: false,
            replace: false,
        }
    }

    fn describe(&self) -> String {
        let mut s = self.dst.trunc().to_string();
        if let Some(gw) = self.gw {
            s += &format!(" via {gw}");
        }
        if let Some(oif) = self.oif {
            s += &format!(" dev {oif}");
        }
        if let Some(t) = self.table {
            s += &format!(" table {t}");
        }
        if let Some(p) = self.priority {
            s += &format!(" metric {p}");
        }
        s
    }
}

/// The `RTM_NEWROUTE` body for `spec`.
pub(crate) fn route_message(spec: &RouteSpec) -> Result<RouteMessage, NlError> {
    let dst = spec.dst.trunc();
    let family = Family::of(&dst.addr());
    if let Some(gw) = spec.gw {
        if Family::of(&gw) != family {
            return Err(NlError::new(
                format!("route {}: gateway {gw} is of another address family", spec.describe()),
                libc::EINVAL,
            ));
        }
    }
    let mut msg = RouteMessage::default();
    let h = &mut msg.header;
    h.address_family = af_of(Some(family));
    h.destination_prefix_length = dst.prefix_len();
    let table = spec.table.unwrap_or(TABLE_MAIN);
    h.table = if table < 256 { table as u8 } else { RouteHeader::RT_TABLE_UNSPEC };
    h.scope = spec.scope.unwrap_or(SCOPE_UNIVERSE).into();
    h.protocol = spec.protocol.unwrap_or(RTPROT_BOOT).into();
    h.kind = 1.into(); // RTN_UNICAST
    let attrs = &mut msg.attributes;
    if dst.prefix_len() > 0 {
        attrs.push(RouteAttribute::Destination(RouteAddress::from(dst.addr())));
    }
    if let Some(gw) = spec.gw {
        attrs.push(RouteAttribute::Gateway(RouteAddress::from(gw)));
    }
    if let Some(oif) = spec.oif {
        attrs.push(RouteAttribute::Oif(oif));
    }
    if let Some(p) = spec.priority {
        attrs.push(RouteAttribute::Priority(p));
    }
    attrs.push(RouteAttribute::Table(table));
    let mut metrics = Vec::new();
    if let Some(mtu) = spec.mtu {
        metrics.push(RouteMetric::Mtu(mtu));
    }
    if let Some(mss) = spec.advmss {
        metrics.push(RouteMetric::Advmss(mss));
    }
    if !metrics.is_empty() {
        attrs.push(RouteAttribute::Metrics(metrics));
    }
    Ok(msg)
}

fn ip_of(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

fn next_hop(h: &RouteNextHop) -> NextHop {
    NextHop {
        gw: h.attributes.iter().find_map(|a| match a {
            RouteAttribute::Gateway(g) => ip_of(g),
            _ => None,
        }),
        oif: (h.interface_index != 0).then_some(h.interface_index),
        weight: u16::from(h.hops) + 1,
    }
}

/// Decode an `RTM_NEWROUTE` payload; `None` for non-IP families (multicast routing tables,
/// MPLS, …) or malformed messages. Attributes that do not decode are skipped.
pub(crate) fn parse_route(buf: &[u8]) -> Option<Route> {
    let header = RouteHeader::parse(buf).ok()?;
    let family = family_of_af(header.address_family)?;
    let mut route = Route {
        dst: unspecified(family),
        gw: None,
        oif: None,
        table: u32::from(header.table),
        priority: None,
        scope: header.scope.into(),
        protocol: header.protocol.into(),
        mtu: None,
        advmss: None,
        kind: RouteKind::from(u8::from(header.kind)),
        prefsrc: None,
        nexthops: Vec::new(),
    };
    let mut dst_addr = None;
    let param = (header.address_family, header.kind, RouteLwEnCapType::None);
    for nla in NlasIterator::new(buf.get(ROUTE_HEADER_LEN..)?) {
        let Ok(nla) = nla else { break };
        let Ok(attr) = RouteAttribute::parse_with_param(&nla, param) else {
            continue;
        };
        match attr {
            RouteAttribute::Destination(a) => dst_addr = ip_of(&a),
            RouteAttribute::Gateway(a) => route.gw = ip_of(&a),
            RouteAttribute::PrefSource(a) => route.prefsrc = ip_of(&a),
            RouteAttribute::Oif(i) => route.oif = Some(i),
            RouteAttribute::Priority(p) => route.priority = Some(p),
            RouteAttribute::Table(t) => route.table = t,
            RouteAttribute::Metrics(ms) => {
                for m in ms {
                    match m {
                        RouteMetric::Mtu(v) => route.mtu = Some(v),
                        RouteMetric::Advmss(v) => route.advmss = Some(v),
                        _ => {}
                    }
                }
            }
            RouteAttribute::MultiPath(hops) => {
                route.nexthops = hops.iter().map(next_hop).collect();
            }
            _ => {}
        }
    }
    let addr = dst_addr.unwrap_or(route.dst.addr());
    route.dst = IpNet::new(addr, header.destination_prefix_length).ok()?;
    Some(route)
}

fn unspecified(family: Family) -> IpNet {
    match family {
        Family::V4 => IpNet::new(Ipv4Addr::UNSPECIFIED.into(), 0),
        Family::V6 => IpNet::new(Ipv6Addr::UNSPECIFIED.into(), 0),
    }
    .expect("prefix 0 is valid")
}

impl Netlink {
    /// All routes of all tables (unicast, local, broadcast, multicast, …), optionally of one
    /// family; callers filter.
    pub fn routes(&mut self, family: Option<Family>) -> Result<Vec<Route>, NlError> {
        let mut msg = RouteMessage::default();
        msg.header.address_family = af_of(family);
        let all = self
            .dump(RouteNetlinkMessage::GetRoute(msg), RTM_NEWROUTE, parse_route)
            .map_err(|e| e.during("list routes"))?;
        Ok(all.into_iter().filter(|r| family.is_none_or(|f| Family::of(&r.dst.addr()) == f)).collect())
    }

    /// The route the kernel would use to reach `dst` (`ip route get`: one lookup, policy
    /// routing included, no dump), or `None` when `dst` is unreachable. The answer is a host
    /// route to `dst` carrying the chosen `oif` and gateway.
    pub fn route_get(&mut self, dst: IpAddr) -> Result<Option<Route>, NlError> {
        let mut msg = RouteMessage::default();
        msg.header.address_family = af_of(Some(Family::of(&dst)));
        msg.header.destination_prefix_length = if dst.is_ipv4() { 32 } else { 128 };
        msg.attributes.push(RouteAttribute::Destination(RouteAddress::from(dst)));
        match self.sock.request(RouteNetlinkMessage::GetRoute(msg), 0) {
            Ok(replies) => Ok(replies
                .iter()
                .filter(|r| r.msg_type == RTM_NEWROUTE)
                .find_map(|r| parse_route(&r.payload))),
            Err(e) if matches!(e.errno, libc::ENETUNREACH | libc::EHOSTUNREACH) => Ok(None),
            Err(e) => Err(e.during(format!("look up the route to {dst}"))),
        }
    }

    /// [`Netlink::route_add`] with a preferred source address (`ip route add … src ADDR`).
    pub fn route_add_src(&mut self, spec: &RouteSpec, src: IpAddr) -> Result<(), NlError> {
        let mut msg = route_message(spec)?;
        msg.attributes.push(RouteAttribute::PrefSource(RouteAddress::from(src)));
        let mode = if spec.replace {
            NLM_F_REPLACE
        } else if spec.append {
            NLM_F_APPEND
        } else {
            NLM_F_EXCL
        };
        self.sock
            .request(RouteNetlinkMessage::NewRoute(msg), NLM_F_CREATE | mode)
            .map(drop)
            .map_err(|e| e.during(format!("add route {} src {src}", spec.describe())))
    }

    /// Add a route. EEXIST ([`NlError::is_exists`]) when it exists, unless `append`/`replace`.
    pub fn route_add(&mut self, spec: &RouteSpec) -> Result<(), NlError> {
        let msg = route_message(spec)?;
        let mode = if spec.replace {
            NLM_F_REPLACE
        } else if spec.append {
            NLM_F_APPEND
        } else {
            NLM_F_EXCL
        };
        self.sock
            .request(RouteNetlinkMessage::NewRoute(msg), NLM_F_CREATE | mode)
            .map(drop)
            .map_err(|e| e.during(format!("add route {}", spec.describe())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::tests::emit;
    use netlink_packet_core::Parseable;
    use netlink_packet_route::route::RouteType;

    #[test]
    fn add_message_roundtrips_and_parses_back() {
        let spec = RouteSpec {
            gw: Some("192.168.1.1".parse().unwrap()),
            oif: Some(4),
            priority: Some(100),
            mtu: Some(1400),
            advmss: Some(1360),
            table: Some(1000),
            ..RouteSpec::new("10.20.30.40/16".parse().unwrap())
        };
        let msg = route_message(&spec).unwrap();
        let bytes = emit(&msg);
        assert_eq!(RouteMessage::parse(&bytes[..]).unwrap(), msg);
        // Tables above 255 only fit in RTA_TABLE.
        assert_eq!(msg.header.table, 0);
        let r = parse_route(&bytes).unwrap();
        assert_eq!(r.dst.to_string(), "10.20.0.0/16");
        assert_eq!(r.gw, spec.gw);
        assert_eq!(r.oif, Some(4));
        assert_eq!(r.priority, Some(100));
        assert_eq!((r.mtu, r.advmss), (Some(1400), Some(1360)));
        assert_eq!(r.table, 1000);
        assert_eq!(r.kind, RouteKind::Unicast);
        assert_eq!((r.scope, r.protocol), (SCOPE_UNIVERSE, RTPROT_BOOT));
        assert_eq!(r.paths(), vec![(spec.gw, Some(4))]);
    }

    #[test]
    fn default_route_message_has_no_destination() {
        let add = route_message(&RouteSpec::new("::/0".parse().unwrap())).unwrap();
        assert_eq!(add.header.table, 254);
        assert_eq!(add.attributes, vec![RouteAttribute::Table(254)]);
    }

    #[test]
    fn mixed_families_are_rejected() {
        let spec = RouteSpec {
            gw: Some("fe80::1".parse().unwrap()),
            ..RouteSpec::new("10.0.0.0/8".parse().unwrap())
        };
        assert_eq!(route_message(&spec).unwrap_err().errno, libc::EINVAL);
    }

    #[test]
    fn multipath_routes_expose_all_paths() {
        let mut msg = RouteMessage::default();
        msg.header.address_family = af_of(Some(Family::V6));
        msg.header.destination_prefix_length = 48;
        msg.header.table = 254;
        msg.header.kind = RouteType::Unicast;
        let hop = |gw: &str, oif| {
            let mut h = RouteNextHop::default();
            h.interface_index = oif;
            h.attributes = vec![RouteAttribute::Gateway(RouteAddress::from(gw.parse::<IpAddr>().unwrap()))];
            h
        };
        msg.attributes = vec![
            RouteAttribute::Destination(RouteAddress::from("2001:db8:99::".parse::<IpAddr>().unwrap())),
            RouteAttribute::Priority(1024),
            RouteAttribute::MultiPath(vec![hop("2001:db8::1", 3), hop("2001:db8::2", 3)]),
        ];
        let r = parse_route(&emit(&msg)).unwrap();
        assert_eq!(r.dst.to_string(), "2001:db8:99::/48");
        assert_eq!(r.gw, None);
        assert_eq!(r.nexthops.len(), 2);
        assert_eq!(r.nexthops[1].weight, 1);
        assert_eq!(
            r.paths(),
            vec![
                (Some("2001:db8::1".parse().unwrap()), Some(3)),
                (Some("2001:db8::2".parse().unwrap()), Some(3)),
            ]
        );
    }

    #[test]
    fn non_ip_families_are_skipped() {
        let mut msg = RouteMessage::default();
        msg.header.address_family = 128u8.into(); // RTNL_FAMILY_IPMR
        assert!(parse_route(&emit(&msg)).is_none());
    }
}
