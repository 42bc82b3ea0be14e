//! IP addresses on links.

use std::net::{IpAddr, Ipv4Addr};

use ipnet::IpNet;
use netlink_packet_core::{NlasIterator, Parseable, NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::address::{AddressAttribute, AddressHeader, AddressMessage, AddressScope};
use netlink_packet_route::RouteNetlinkMessage;

use super::{af_of, family_of_af, Family, Netlink, NlError};

const RTM_NEWADDR: u16 = 20;
const ADDRESS_HEADER_LEN: usize = 8;
const IFA_F_DADFAILED: u32 = 0x08;
const IFA_F_TENTATIVE: u32 = 0x40;

/// An address assigned to a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Address {
    pub index: u32,
    /// The local address with its prefix length (host bits kept: `10.1.0.5/16`).
    pub addr: IpNet,
    /// IPv4 broadcast address, when set.
    pub broadcast: Option<Ipv4Addr>,
    /// Raw `IFA_F_*` flags (from `IFA_FLAGS` when present, which has the bits above 8).
    pub flags: u32,
    /// Raw `RT_SCOPE_*` scope.
    pub scope: u8,
}

impl Address {
    /// IPv6 duplicate address detection has not finished.
    pub fn tentative(&self) -> bool {
        self.flags & IFA_F_TENTATIVE != 0
    }

    /// IPv6 duplicate address detection found a duplicate.
    pub fn dadfailed(&self) -> bool {
        self.flags & IFA_F_DADFAILED != 0
    }
}

/// The broadcast address `ip addr add` picks by default: all host bits set, for prefixes that
/// leave room for one (/30 and shorter).
fn default_broadcast(net: &IpNet) -> Option<Ipv4Addr> {
    match net {
        IpNet::V4(v4) if v4.prefix_len() <= 30 => Some(v4.broadcast()),
        _ => None,
    }
}

/// `RTM_NEWADDR`/`RTM_DELADDR` body for `net` on link `index`.
pub(crate) fn addr_message(index: u32, net: &IpNet, with_broadcast: bool) -> AddressMessage {
    let mut msg = AddressMessage::default();
    msg.header.family = af_of(Some(Family::of(&net.addr())));
    msg.header.prefix_len = net.prefix_len();
    msg.header.index = index;
    msg.header.scope = match net.addr() {
        IpAddr::V4(a) if a.is_loopback() => AddressScope::Host,
        _ => AddressScope::Universe,
    };
    msg.attributes.push(AddressAttribute::Local(net.addr()));
    msg.attributes.push(AddressAttribute::Address(net.addr()));
    if with_broadcast {
        if let Some(b) = default_broadcast(net) {
            msg.attributes.push(AddressAttribute::Broadcast(b));
        }
    }
    msg
}

/// Decode an `RTM_NEWADDR` payload; `None` for non-IP families or malformed messages.
/// Attributes that do not decode are skipped.
pub(crate) fn parse_address(buf: &[u8]) -> Option<Address> {
    let header = AddressHeader::parse(buf).ok()?;
    family_of_af(header.family)?;
    let (mut local, mut address, mut broadcast, mut flags) = (None, None, None, None);
    for nla in NlasIterator::new(buf.get(ADDRESS_HEADER_LEN..)?) {
        let Ok(nla) = nla else { break };
        match AddressAttribute::parse(&nla) {
            Ok(AddressAttribute::Local(ip)) => local = Some(ip),
            Ok(AddressAttribute::Address(ip)) => address = Some(ip),
            Ok(AddressAttribute::Broadcast(b)) => broadcast = Some(b),
            Ok(AddressAttribute::Flags(f)) => flags = Some(f.bits()),
            _ => {}
        }
    }
    // IFA_LOCAL is our address; IFA_ADDRESS is the same, or the peer on point-to-point links
    // (and the only one IPv6 normally sends).
    let ip = local.or(address)?;
    Some(Address {
        index: header.index,
        addr: IpNet::new(ip, header.prefix_len).ok()?,
        broadcast,
        flags: flags.unwrap_or(u32::from(header.flags.bits())),
        scope: header.scope.into(),
    })
}

impl Netlink {
    /// Addresses, optionally only those of link `index` and/or of one family.
    pub fn addrs(&mut self, index: Option<u32>, family: Option<Family>) -> Result<Vec<Address>, NlError> {
        let mut msg = AddressMessage::default();
        msg.header.family = af_of(family);
        // With strict checking the kernel filters by ifindex itself; filtered again below.
        msg.header.index = index.unwrap_or(0);
        let all = self
            .dump(RouteNetlinkMessage::GetAddress(msg), RTM_NEWADDR, parse_address)
            .map_err(|e| e.during("list addresses"))?;
        Ok(all
            .into_iter()
            .filter(|a| index.is_none_or(|i| a.index == i))
            .filter(|a| family.is_none_or(|f| Family::of(&a.addr.addr()) == f))
            .collect())
    }

    /// Add `net` (address with prefix length) to link `index`. IPv4 gets the default broadcast
    /// address, as with `ip addr add`. EEXIST when already present.
    pub fn addr_add(&mut self, index: u32, net: IpNet) -> Result<(), NlError> {
        self.sock
            .request(
                RouteNetlinkMessage::NewAddress(addr_message(index, &net, true)),
                NLM_F_CREATE | NLM_F_EXCL,
            )
            .map(drop)
            .map_err(|e| {
                let mut e = e.during(format!("add address {net} to link {index}"));
                if e.errno == libc::EACCES && net.addr().is_ipv6() && e.detail.is_none() {
                    e.detail = Some("is IPv6 disabled on this interface?".into());
                }
                e
            })
    }

    /// [`Netlink::addr_add`] with `IFA_F_NOPREFIXROUTE`: the kernel adds no route to the
    /// address's subnet (a point-to-point setup routes the subnet through its gateway instead).
    pub fn addr_add_noprefixroute(&mut self, index: u32, net: IpNet) -> Result<(), NlError> {
        let mut msg = addr_message(index, &net, true);
        msg.attributes
            .push(AddressAttribute::Flags(netlink_packet_route::address::AddressFlags::Noprefixroute));
        self.sock
            .request(RouteNetlinkMessage::NewAddress(msg), NLM_F_CREATE | NLM_F_EXCL)
            .map(drop)
            .map_err(|e| e.during(format!("add address {net} (noprefixroute) to link {index}")))
    }

    /// Remove `net` from link `index` (EADDRNOTAVAIL, see [`NlError::is_not_found`], when it
    /// is not there).
    pub fn addr_del(&mut self, index: u32, net: IpNet) -> Result<(), NlError> {
        self.sock
            .request(RouteNetlinkMessage::DelAddress(addr_message(index, &net, false)), 0)
            .map(drop)
            .map_err(|e| e.during(format!("delete address {net} from link {index}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::tests::emit;
    use netlink_packet_core::Parseable;
    use netlink_packet_route::address::AddressFlags;

    #[test]
    fn v4_add_message_has_local_address_and_broadcast() {
        let net: IpNet = "10.1.2.3/24".parse().unwrap();
        let msg = addr_message(5, &net, true);
        let back = AddressMessage::parse(&emit(&msg)[..]).unwrap();
        assert_eq!(back, msg);
        assert_eq!(back.header.prefix_len, 24);
        assert_eq!(back.header.index, 5);
        assert!(back.attributes.contains(&AddressAttribute::Broadcast("10.1.2.255".parse().unwrap())));
        assert!(back.attributes.contains(&AddressAttribute::Local("10.1.2.3".parse().unwrap())));

        // /31 and /32 have no broadcast address; deletes never send one.
        let p2p = addr_message(5, &"10.1.2.3/31".parse().unwrap(), true);
        assert!(!p2p.attributes.iter().any(|a| matches!(a, AddressAttribute::Broadcast(_))));
        let del = addr_message(5, &net, false);
        assert_eq!(del.attributes.len(), 2);
    }

    #[test]
    fn address_parses_with_extended_flags() {
        let mut msg = AddressMessage::default();
        msg.header.family = af_of(Some(Family::V6));
        msg.header.prefix_len = 64;
        msg.header.index = 3;
        msg.header.scope = AddressScope::Universe;
        msg.attributes = vec![
            AddressAttribute::Address("2001:db8::5".parse().unwrap()),
            AddressAttribute::Flags(AddressFlags::Tentative | AddressFlags::Noprefixroute),
        ];
        let a = parse_address(&emit(&msg)).unwrap();
        assert_eq!(a.addr, "2001:db8::5/64".parse::<IpNet>().unwrap());
        assert_eq!(a.index, 3);
        assert!(a.tentative());
        assert!(!a.dadfailed());
        assert_eq!(a.flags, 0x40 | 0x200);
        assert_eq!(a.broadcast, None);

        // IFA_LOCAL wins over IFA_ADDRESS (point-to-point peer).
        let mut msg = AddressMessage::default();
        msg.header.family = af_of(Some(Family::V4));
        msg.header.prefix_len = 32;
        msg.attributes = vec![
            AddressAttribute::Address("10.0.0.2".parse().unwrap()),
            AddressAttribute::Local("10.0.0.1".parse().unwrap()),
        ];
        let a = parse_address(&emit(&msg)).unwrap();
        assert_eq!(a.addr.to_string(), "10.0.0.1/32");
    }
}
