//! Per-interface IPv4 settings (`net.ipv4.conf.<if>.*`) over netlink: `RTM_SETLINK` with
//! `IFLA_AF_SPEC { AF_INET { IFLA_INET_CONF { [IPV4_DEVCONF_*] = u32 } } }`.
//!
//! Writing these through `/proc/sys` in a namespace that has never used it costs a lookup of
//! `/proc/sys/net/ipv4` that grows with the number of network namespaces on the host
//! (milliseconds on a busy node); netlink has no such cost, and the change can ride along with
//! bringing the link up. (IPv6 settings have no netlink setter.)

use netlink_packet_core::DefaultNla;
use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkMessage};
use netlink_packet_route::RouteNetlinkMessage;

use super::{Netlink, NlError};

const IFLA_AF_SPEC: u16 = 26;
const AF_INET: u16 = 2;
const IFLA_INET_CONF: u16 = 1;

/// `IPV4_DEVCONF_ARP_NOTIFY`: send gratuitous ARP when the device comes up or its address changes.
pub const IPV4_DEVCONF_ARP_NOTIFY: u16 = 22;

fn nla(kind: u16, value: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(4 + value.len());
    v.extend_from_slice(&((4 + value.len()) as u16).to_ne_bytes());
    v.extend_from_slice(&kind.to_ne_bytes());
    v.extend_from_slice(value);
    while v.len() % 4 != 0 {
        v.push(0);
    }
    v
}

/// The value of `IFLA_AF_SPEC` setting the IPv4 devconf entries `conf`.
pub(crate) fn inet_conf_spec(conf: &[(u16, u32)]) -> Vec<u8> {
    let entries: Vec<u8> = conf.iter().flat_map(|(id, v)| nla(*id, &v.to_ne_bytes())).collect();
    nla(AF_INET, &nla(IFLA_INET_CONF, &entries))
}

pub(crate) fn inet_conf_message(index: u32, conf: &[(u16, u32)], up: bool) -> LinkMessage {
    let mut msg = LinkMessage::default();
    msg.header.index = index;
    if up {
        msg.header.flags = LinkFlags::Up;
        msg.header.change_mask = LinkFlags::Up;
    }
    msg.attributes.push(LinkAttribute::Other(DefaultNla::new(IFLA_AF_SPEC, inet_conf_spec(conf))));
    msg
}

impl Netlink {
    /// Set IPv4 per-interface settings (`IPV4_DEVCONF_*` ids) of link `index`, and bring it up in
    /// the same request when `up`.
    pub fn link_set_ipv4_conf(&mut self, index: u32, conf: &[(u16, u32)], up: bool) -> Result<(), NlError> {
        self.sock
            .request(RouteNetlinkMessage::SetLink(inet_conf_message(index, conf, up)), 0)
            .map(drop)
            .map_err(|e| e.during(format!("set IPv4 settings {conf:?} on link {index}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::{LinkKind, LinkSpec};
    use crate::netns::test_support::private_netns;

    #[test]
    fn encoding() {
        let spec = inet_conf_spec(&[(IPV4_DEVCONF_ARP_NOTIFY, 1)]);
        #[rustfmt::skip]
        let want: Vec<u8> = [
            &16u16.to_ne_bytes()[..], &2u16.to_ne_bytes(),      // AF_INET
            &12u16.to_ne_bytes(), &1u16.to_ne_bytes(),           // IFLA_INET_CONF
            &8u16.to_ne_bytes(), &22u16.to_ne_bytes(), &1u32.to_ne_bytes(), // ARP_NOTIFY = 1
        ].concat();
        assert_eq!(spec, want);
    }

    /// Kernel test: the value lands in /proc/sys, and the link comes up in the same request.
    #[test]
    fn arp_notify_over_netlink() {
        private_netns();
        let mut nl = Netlink::new().unwrap();
        let l = nl.link_add(&LinkSpec::new("if0", LinkKind::Ifb)).unwrap();
        assert_eq!(crate::sysctl::get("net/ipv4/conf/if0/arp_notify").unwrap(), "0");
        nl.link_set_ipv4_conf(l.index, &[(IPV4_DEVCONF_ARP_NOTIFY, 1)], true).unwrap();
        assert_eq!(crate::sysctl::get("net/ipv4/conf/if0/arp_notify").unwrap(), "1");
        assert!(nl.link_by_index(l.index).unwrap().unwrap().up());
    }
}
