//! Linux bridge specifics: bridge-port flags (hairpin, isolated, or any other one-byte
//! `IFLA_BRPORT_*` flag) and per-port VLANs.
//!
//! Port flags travel as `IFLA_LINKINFO { IFLA_INFO_SLAVE_KIND "bridge", IFLA_INFO_SLAVE_DATA {
//! IFLA_BRPORT_* } }` in an `RTM_NEWLINK` without `NLM_F_CREATE` (the `ip link set … type
//! bridge_slave …` path), which may carry the port's up flag in the same request. They are read
//! back from the same attribute of an ordinary `RTM_GETLINK` reply.
//!
//! VLANs use the `PF_BRIDGE` family: `RTM_SETLINK` (add) and `RTM_DELLINK` (delete VLANs, not the
//! link) with `IFLA_AF_SPEC { IFLA_BRIDGE_VLAN_INFO … }`; consecutive VIDs with equal flags are
//! sent as one `RANGE_BEGIN`/`RANGE_END` pair. The port VLAN table is read with a `PF_BRIDGE`
//! dump carrying `IFLA_EXT_MASK = RTEXT_FILTER_BRVLAN`. All of these need a kernel built with
//! `CONFIG_BRIDGE_VLAN_FILTERING`; without it the kernel answers EOPNOTSUPP
//! ([`NlError::is_unsupported`]).

use std::collections::BTreeMap;

use netlink_packet_core::{DefaultNla, NlasIterator, NLM_F_DUMP};
use netlink_packet_route::link::{
    AfSpecBridge, BridgeVlanInfo, BridgeVlanInfoFlags, InfoBridgePort, InfoPortData, InfoPortKind,
    LinkAttribute, LinkExtentMask, LinkFlags, LinkHeader, LinkInfo, LinkMessage,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use super::link::{parse_link, BridgeOpts};
use super::socket::Reply;
use super::{Link, Netlink, NlError};

const RTM_NEWLINK: u16 = 16;
const LINK_HEADER_LEN: usize = 16;
const IFLA_LINKINFO: u16 = 18;
const IFLA_AF_SPEC: u16 = 26;
const IFLA_INFO_SLAVE_KIND: u16 = 4;
const IFLA_INFO_SLAVE_DATA: u16 = 5;
const IFLA_BRPORT_MODE: u16 = 4;
const IFLA_BRPORT_ISOLATED: u16 = 33;
const IFLA_BRIDGE_VLAN_INFO: u16 = 2;
const VLAN_PVID: u16 = 0x2;
const VLAN_UNTAGGED: u16 = 0x4;
const VLAN_RANGE_BEGIN: u16 = 0x8;
const VLAN_RANGE_END: u16 = 0x10;

impl NlError {
    /// The kernel does not implement the operation (EOPNOTSUPP), e.g. bridge VLAN filtering on
    /// a kernel built without `CONFIG_BRIDGE_VLAN_FILTERING`.
    pub fn is_unsupported(&self) -> bool {
        self.errno == libc::EOPNOTSUPP
    }
}

/// One bridge-port flag: a one-byte `IFLA_BRPORT_*` attribute, on or off. The kernel sets
/// and reports every such flag in the same way, so a flag this module has no constant for is
/// `PortFlag(<its attribute number>)`: a plugin can set and check it without a change here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortFlag(pub u16);

impl PortFlag {
    /// `IFLA_BRPORT_MODE`: frames may be sent back out of the port they came in on (hairpin).
    pub const HAIRPIN: PortFlag = PortFlag(IFLA_BRPORT_MODE);
    /// `IFLA_BRPORT_ISOLATED`: no forwarding to other isolated ports.
    pub const ISOLATED: PortFlag = PortFlag(IFLA_BRPORT_ISOLATED);
}

/// Bridge-port flags of a link enslaved to a bridge: the flags a request sets (each one sent,
/// on or off, in attribute order), or every one-byte attribute the kernel reported for the port
/// (other one-byte attributes, such as the STP state, come along and are simply never asked
/// for). A flag that is absent reads as off.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortFlags(BTreeMap<PortFlag, bool>);

impl PortFlags {
    /// These flags and `flag` set to `on`.
    pub fn with(mut self, flag: PortFlag, on: bool) -> PortFlags {
        self.set(flag, on);
        self
    }
    pub fn set(&mut self, flag: PortFlag, on: bool) {
        self.0.insert(flag, on);
    }
    /// Whether `flag` is on (absent: off).
    pub fn get(&self, flag: PortFlag) -> bool {
        self.0.get(&flag).copied().unwrap_or(false)
    }
    /// Whether any flag is on.
    pub fn any_on(&self) -> bool {
        self.0.values().any(|on| *on)
    }
    /// Every flag held, in attribute order.
    pub fn iter(&self) -> impl Iterator<Item = (PortFlag, bool)> + '_ {
        self.0.iter().map(|(f, on)| (*f, *on))
    }
}

impl<const N: usize> From<[(PortFlag, bool); N]> for PortFlags {
    fn from(flags: [(PortFlag, bool); N]) -> PortFlags {
        PortFlags(flags.into_iter().collect())
    }
}

/// One VLAN of a bridge port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct PortVlan {
    pub vid: u16,
    /// Untagged frames received on the port are assigned to this VLAN (ingress).
    pub pvid: bool,
    /// Frames of this VLAN leave the port untagged (egress).
    pub untagged: bool,
}

impl PortVlan {
    pub fn tagged(vid: u16) -> Self {
        PortVlan { vid, pvid: false, untagged: false }
    }

    /// An access VLAN: PVID and egress untagged.
    pub fn access(vid: u16) -> Self {
        PortVlan { vid, pvid: true, untagged: true }
    }

    fn flags(&self) -> u16 {
        (if self.pvid { VLAN_PVID } else { 0 }) | (if self.untagged { VLAN_UNTAGGED } else { 0 })
    }
}

/// `IFLA_BRIDGE_VLAN_INFO` entries for `vlans`, in order; runs of consecutive VIDs with the same
/// flags (other than PVID, which the kernel refuses on a range) become one range.
pub(crate) fn vlan_infos(vlans: &[PortVlan]) -> Vec<BridgeVlanInfo> {
    let info =
        |flags: u16, vid: u16| BridgeVlanInfo { flags: BridgeVlanInfoFlags::from_bits_retain(flags), vid };
    let mut out = Vec::new();
    let mut i = 0;
    while i < vlans.len() {
        let first = vlans[i];
        let mut j = i;
        if !first.pvid {
            while j + 1 < vlans.len()
                && vlans[j + 1].vid == vlans[j].vid + 1
                && vlans[j + 1].flags() == first.flags()
            {
                j += 1;
            }
        }
        if j == i {
            out.push(info(first.flags(), first.vid));
        } else {
            out.push(info(first.flags() | VLAN_RANGE_BEGIN, first.vid));
            out.push(info(first.flags() | VLAN_RANGE_END, vlans[j].vid));
        }
        i = j + 1;
    }
    out
}

/// The `PF_BRIDGE` link message carrying `vlans` for port `index`; sent as `RTM_SETLINK` it adds
/// them, as `RTM_DELLINK` it removes them (flags other than the range bits are ignored there).
pub(crate) fn vlan_message(index: u32, vlans: &[PortVlan]) -> LinkMessage {
    let mut msg = LinkMessage::default();
    msg.header.interface_family = AddressFamily::Bridge;
    msg.header.index = index;
    let spec = vlan_infos(vlans).into_iter().map(AfSpecBridge::VlanInfo).collect();
    msg.attributes.push(LinkAttribute::AfSpecBridge(spec));
    msg
}

/// The `RTM_NEWLINK` (no create) that sets the bridge-port flags of `index` and, when `up`,
/// brings the link up in the same request.
pub(crate) fn port_flags_message(index: u32, flags: &PortFlags, up: bool) -> LinkMessage {
    let mut msg = LinkMessage::default();
    msg.header.index = index;
    if up {
        msg.header.flags = LinkFlags::Up;
        msg.header.change_mask = LinkFlags::Up;
    }
    msg.attributes.push(LinkAttribute::LinkInfo(vec![
        LinkInfo::PortKind(InfoPortKind::Bridge),
        LinkInfo::PortData(InfoPortData::BridgePort(
            flags
                .iter()
                .map(|(f, on)| InfoBridgePort::Other(DefaultNla::new(f.0, vec![u8::from(on)])))
                .collect(),
        )),
    ]));
    msg
}

/// Bridge-port flags from the raw value of `IFLA_LINKINFO`, when the link is a bridge port.
fn port_flags_of(linkinfo: &[u8]) -> Option<PortFlags> {
    let mut is_bridge_port = false;
    let mut flags = None;
    for nla in NlasIterator::new(linkinfo).map_while(Result::ok) {
        match nla.kind() {
            IFLA_INFO_SLAVE_KIND => is_bridge_port = nla.value().starts_with(b"bridge\0"),
            IFLA_INFO_SLAVE_DATA => {
                let mut f = PortFlags::default();
                for a in NlasIterator::new(nla.value()).map_while(Result::ok) {
                    if let [b] = a.value() {
                        f.set(PortFlag(a.kind()), *b != 0);
                    }
                }
                flags = Some(f);
            }
            _ => {}
        }
    }
    flags.filter(|_| is_bridge_port)
}

/// A link together with its bridge-port flags (None when it is not a bridge port).
fn parse_link_with_port(buf: &[u8]) -> Option<(Link, Option<PortFlags>)> {
    let link = parse_link(buf)?;
    let mut port = None;
    for nla in NlasIterator::new(buf.get(LINK_HEADER_LEN..)?).map_while(Result::ok) {
        if nla.kind() == IFLA_LINKINFO {
            port = port_flags_of(nla.value());
        }
    }
    Some((link, port))
}

/// VLANs of one port from the raw attributes of a `PF_BRIDGE` link message.
fn port_vlans_of(attrs: &[u8]) -> Vec<PortVlan> {
    let mut out = Vec::new();
    for nla in NlasIterator::new(attrs).map_while(Result::ok) {
        if nla.kind() != IFLA_AF_SPEC {
            continue;
        }
        let mut range_start: Option<u16> = None;
        for a in NlasIterator::new(nla.value()).map_while(Result::ok) {
            if a.kind() != IFLA_BRIDGE_VLAN_INFO || a.value().len() < 4 {
                continue;
            }
            let v = a.value();
            let flags = u16::from_ne_bytes([v[0], v[1]]);
            let vid = u16::from_ne_bytes([v[2], v[3]]);
            let entry =
                |vid| PortVlan { vid, pvid: flags & VLAN_PVID != 0, untagged: flags & VLAN_UNTAGGED != 0 };
            if flags & VLAN_RANGE_BEGIN != 0 {
                range_start = Some(vid);
            } else if flags & VLAN_RANGE_END != 0 {
                let start = range_start.take().unwrap_or(vid);
                out.extend((start..=vid).map(entry));
            } else {
                out.push(entry(vid));
            }
        }
    }
    out
}

impl Netlink {
    /// The link called `name` with its bridge-port flags (`None` when it is not a bridge port),
    /// in one request; `Ok(None)` when there is no such link.
    pub fn link_with_port_flags(&mut self, name: &str) -> Result<Option<(Link, Option<PortFlags>)>, NlError> {
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        match self.sock.request(RouteNetlinkMessage::GetLink(msg), 0) {
            Ok(replies) => Ok(replies
                .iter()
                .filter(|r| r.msg_type == RTM_NEWLINK)
                .find_map(|r| parse_link_with_port(&r.payload))),
            Err(e) if e.errno == libc::ENODEV => Ok(None),
            Err(e) => Err(e.during(format!("look up link {name}"))),
        }
    }

    /// Set the bridge-port flags of `index` (which must be enslaved to a bridge), and bring it
    /// up in the same request when `up`.
    pub fn bridge_port_set(&mut self, index: u32, flags: &PortFlags, up: bool) -> Result<(), NlError> {
        self.sock
            .request(RouteNetlinkMessage::NewLink(port_flags_message(index, flags, up)), 0)
            .map(drop)
            .map_err(|e| e.during(format!("set bridge port flags {flags:?} on link {index}")))
    }

    /// Set options of bridge `index` (`ip link set … type bridge …`): an `RTM_NEWLINK` without
    /// `NLM_F_CREATE` naming the kind, whose `IFLA_INFO_DATA` carries only these options.
    /// EOPNOTSUPP when `index` is not a bridge or the kernel refuses an option.
    pub fn bridge_set(&mut self, index: u32, opts: &BridgeOpts) -> Result<(), NlError> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(netlink_packet_route::link::InfoKind::Bridge),
            LinkInfo::Data(opts.info_data()),
        ]));
        self.sock
            .request(RouteNetlinkMessage::NewLink(msg), 0)
            .map(drop)
            .map_err(|e| e.during(format!("set bridge options {opts:?} on link {index}")))
    }

    /// Add `vlans` to bridge port `index`, in one request and in the given order (a VID listed
    /// again later gets the later flags, as with consecutive `bridge vlan add` calls).
    pub fn bridge_vlan_add(&mut self, index: u32, vlans: &[PortVlan]) -> Result<(), NlError> {
        if vlans.is_empty() {
            return Ok(());
        }
        self.sock
            .request(RouteNetlinkMessage::SetLink(vlan_message(index, vlans)), 0)
            .map(drop)
            .map_err(|e| e.during(format!("add VLANs to bridge port {index}")))
    }

    /// Remove the VLANs `vids` from bridge port `index`, in one request.
    pub fn bridge_vlan_del(&mut self, index: u32, vids: &[u16]) -> Result<(), NlError> {
        if vids.is_empty() {
            return Ok(());
        }
        let vlans: Vec<PortVlan> = vids.iter().map(|v| PortVlan::tagged(*v)).collect();
        self.sock
            .request(RouteNetlinkMessage::DelLink(vlan_message(index, &vlans)), 0)
            .map(drop)
            .map_err(|e| e.during(format!("delete VLANs from bridge port {index}")))
    }

    /// The VLAN table of bridge port `index` (empty when it has none).
    pub fn bridge_port_vlans(&mut self, index: u32) -> Result<Vec<PortVlan>, NlError> {
        let mut msg = LinkMessage::default();
        msg.header.interface_family = AddressFamily::Bridge;
        msg.attributes.push(LinkAttribute::ExtMask(vec![LinkExtentMask::Brvlan]));
        let replies: Vec<Reply> = self
            .sock
            .request(RouteNetlinkMessage::GetLink(msg), NLM_F_DUMP)
            .map_err(|e| e.during("list bridge VLANs"))?;
        let mut out = Vec::new();
        for r in replies.iter().filter(|r| r.msg_type == RTM_NEWLINK) {
            let Ok(h) = LinkHeader::parse(&r.payload) else { continue };
            if h.index == index {
                out.extend(port_vlans_of(r.payload.get(LINK_HEADER_LEN..).unwrap_or_default()));
            }
        }
        out.sort();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::tests::emit;
    use netlink_packet_core::Parseable;

    /// The serialized `RTM_SETLINK` (add) or `RTM_DELLINK` (delete) request for `vlans` on
    /// port `index`, exactly as sent (sequence number 0).
    fn vlan_request_bytes(index: u32, vlans: &[PortVlan], delete: bool) -> Vec<u8> {
        use crate::netlink::socket::encode;
        use netlink_packet_core::{NLM_F_ACK, NLM_F_REQUEST};
        let msg = vlan_message(index, vlans);
        let msg = if delete { RouteNetlinkMessage::DelLink(msg) } else { RouteNetlinkMessage::SetLink(msg) };
        encode(msg, NLM_F_REQUEST | NLM_F_ACK)
    }

    /// nlmsghdr (16) + ifinfomsg (16) + IFLA_AF_SPEC { IFLA_BRIDGE_VLAN_INFO (8 bytes each) }.
    fn expected(msg_type: u16, index: u32, infos: &[(u16, u16)]) -> Vec<u8> {
        let spec_len = 4 + 8 * infos.len();
        let total = 16 + 16 + spec_len;
        let mut v = Vec::new();
        v.extend_from_slice(&(total as u32).to_ne_bytes());
        v.extend_from_slice(&msg_type.to_ne_bytes());
        v.extend_from_slice(&(0x1u16 | 0x4).to_ne_bytes()); // NLM_F_REQUEST | NLM_F_ACK
        v.extend_from_slice(&0u32.to_ne_bytes()); // seq (filled in when sent)
        v.extend_from_slice(&0u32.to_ne_bytes()); // port id
                                                  // struct ifinfomsg: family AF_BRIDGE (7), pad, type, index, flags, change
        v.extend_from_slice(&[7, 0, 0, 0]);
        v.extend_from_slice(&index.to_ne_bytes());
        v.extend_from_slice(&0u32.to_ne_bytes());
        v.extend_from_slice(&0u32.to_ne_bytes());
        v.extend_from_slice(&(spec_len as u16).to_ne_bytes());
        v.extend_from_slice(&26u16.to_ne_bytes()); // IFLA_AF_SPEC (kernel accepts it without NLA_F_NESTED)
        for (flags, vid) in infos {
            v.extend_from_slice(&8u16.to_ne_bytes());
            v.extend_from_slice(&2u16.to_ne_bytes()); // IFLA_BRIDGE_VLAN_INFO
            v.extend_from_slice(&flags.to_ne_bytes());
            v.extend_from_slice(&vid.to_ne_bytes());
        }
        v
    }

    const RTM_DELLINK: u16 = 17;
    const RTM_SETLINK: u16 = 19;

    #[test]
    fn access_vlan_is_pvid_and_untagged() {
        let bytes = vlan_request_bytes(42, &[PortVlan::access(100)], false);
        assert_eq!(bytes, expected(RTM_SETLINK, 42, &[(VLAN_PVID | VLAN_UNTAGGED, 100)]));
    }

    #[test]
    fn trunk_runs_become_ranges_and_access_vlan_comes_first() {
        let mut vlans = vec![PortVlan::access(100), PortVlan::tagged(101)];
        vlans.extend((200..=210).map(PortVlan::tagged));
        vlans.push(PortVlan::tagged(300));
        let bytes = vlan_request_bytes(7, &vlans, false);
        assert_eq!(
            bytes,
            expected(
                RTM_SETLINK,
                7,
                &[
                    (VLAN_PVID | VLAN_UNTAGGED, 100),
                    (0, 101),
                    (VLAN_RANGE_BEGIN, 200),
                    (VLAN_RANGE_END, 210),
                    (0, 300),
                ]
            )
        );
        // A PVID entry is never folded into a range, even next to consecutive VIDs.
        let infos = vlan_infos(&[PortVlan::access(1), PortVlan::access(2), PortVlan::tagged(3)]);
        assert_eq!(
            infos.iter().map(|i| (i.flags.bits(), i.vid)).collect::<Vec<_>>(),
            vec![(6, 1), (6, 2), (0, 3)]
        );
    }

    #[test]
    fn deleting_the_default_vlan() {
        let bytes = vlan_request_bytes(9, &[PortVlan::tagged(1)], true);
        assert_eq!(bytes, expected(RTM_DELLINK, 9, &[(0, 1)]));
    }

    #[test]
    fn port_flags_request_is_bridge_slave_data() {
        let flags = PortFlags::from([(PortFlag::ISOLATED, false), (PortFlag::HAIRPIN, true)]);
        let msg = port_flags_message(5, &flags, true);
        let back = LinkMessage::parse(&emit(&msg)[..]).unwrap();
        assert_eq!(back.header.index, 5);
        assert!(back.header.flags.contains(LinkFlags::Up));
        let raw = emit(&msg);
        // The kernel-style reader finds the same flags again.
        let info = NlasIterator::new(&raw[LINK_HEADER_LEN..])
            .map_while(Result::ok)
            .find(|n| n.kind() == IFLA_LINKINFO)
            .unwrap();
        assert_eq!(port_flags_of(info.value()), Some(flags));
        // Slave data holds IFLA_BRPORT_MODE (4) = 1 and IFLA_BRPORT_ISOLATED (33) = 0, one byte each.
        let data = NlasIterator::new(info.value())
            .map_while(Result::ok)
            .find(|n| n.kind() == IFLA_INFO_SLAVE_DATA)
            .unwrap();
        let attrs: Vec<(u16, Vec<u8>)> = NlasIterator::new(data.value())
            .map_while(Result::ok)
            .map(|n| (n.kind(), n.value().to_vec()))
            .collect();
        assert_eq!(attrs, vec![(4, vec![1]), (33, vec![0])]);
    }

    #[test]
    fn any_one_byte_port_flag_travels_and_reads_back() {
        // IFLA_BRPORT_NEIGH_SUPPRESS (32), which this module has no constant for
        let suppress = PortFlag(32);
        let flags = PortFlags::default().with(suppress, true).with(PortFlag::HAIRPIN, false);
        assert!(flags.any_on() && flags.get(suppress) && !flags.get(PortFlag::HAIRPIN));
        assert!(!flags.get(PortFlag::ISOLATED), "absent reads as off");
        let raw = emit(&port_flags_message(2, &flags, false));
        let info = NlasIterator::new(&raw[LINK_HEADER_LEN..])
            .map_while(Result::ok)
            .find(|n| n.kind() == IFLA_LINKINFO)
            .unwrap();
        assert_eq!(port_flags_of(info.value()), Some(flags));
        assert!(!PortFlags::from([(PortFlag::HAIRPIN, false)]).any_on());
    }

    #[test]
    fn vlan_table_parses_single_entries_and_ranges() {
        let msg = vlan_message(
            3,
            &[PortVlan::access(1), PortVlan::tagged(10), PortVlan::tagged(11), PortVlan::tagged(12)],
        );
        let raw = emit(&msg);
        let vlans = port_vlans_of(&raw[LINK_HEADER_LEN..]);
        assert_eq!(
            vlans,
            vec![PortVlan::access(1), PortVlan::tagged(10), PortVlan::tagged(11), PortVlan::tagged(12)]
        );
    }

    /// Kernel tests: each in its own network namespace.
    mod kernel {
        use super::super::super::{LinkKind, LinkSpec, VethPeer};
        use super::*;
        use crate::netns::test_support::private_netns;
        use std::time::Duration;

        fn bridge_with_port(nl: &mut Netlink) -> (Link, Link) {
            let br = nl
                .link_add(&LinkSpec {
                    up: true,
                    ..LinkSpec::new("br0", LinkKind::Bridge { opts: Default::default() })
                })
                .unwrap();
            let spec = LinkSpec {
                master: Some(br.index),
                ..LinkSpec::new("vh0", LinkKind::Veth { peer: VethPeer::new("vc0", None) })
            };
            let port = nl.link_add(&spec).unwrap();
            (br, port)
        }

        #[test]
        fn port_flags_round_trip() {
            private_netns();
            let mut nl = Netlink::new().unwrap();
            let (br, port) = bridge_with_port(&mut nl);
            let (l, flags) = nl.link_with_port_flags("vh0").unwrap().unwrap();
            assert_eq!(l.master, Some(br.index));
            let on = |f: &Option<PortFlags>, flag| f.as_ref().expect("a bridge port").get(flag);
            let neigh_suppress = PortFlag(32); // IFLA_BRPORT_NEIGH_SUPPRESS, no constant here
            assert!(!on(&flags, PortFlag::HAIRPIN) && !on(&flags, PortFlag::ISOLATED), "{flags:?}");
            assert!(!on(&flags, neigh_suppress), "{flags:?}");
            assert!(!l.up());
            let all = PortFlags::from([
                (PortFlag::HAIRPIN, true),
                (PortFlag::ISOLATED, true),
                (neigh_suppress, true),
            ]);
            nl.bridge_port_set(port.index, &all, true).unwrap();
            let (l, flags) = nl.link_with_port_flags("vh0").unwrap().unwrap();
            assert!(l.up(), "up flag sent with the port flags");
            assert!(on(&flags, PortFlag::HAIRPIN) && on(&flags, PortFlag::ISOLATED), "{flags:?}");
            assert!(on(&flags, neigh_suppress), "{flags:?}");
            let some = PortFlags::from([(PortFlag::HAIRPIN, false), (PortFlag::ISOLATED, true)]);
            nl.bridge_port_set(port.index, &some, false).unwrap();
            let flags = nl.link_with_port_flags("vh0").unwrap().unwrap().1;
            assert!(!on(&flags, PortFlag::HAIRPIN) && on(&flags, PortFlag::ISOLATED), "{flags:?}");
            assert!(on(&flags, neigh_suppress), "a flag not sent is left as it was: {flags:?}");
            // Not a bridge port / not there.
            assert_eq!(nl.link_with_port_flags("br0").unwrap().unwrap().1, None);
            assert_eq!(nl.link_with_port_flags("nope0").unwrap(), None);
        }

        #[test]
        fn bridge_options_round_trip() {
            use super::super::super::{BridgeOpt, OptValue};
            private_netns();
            let mut nl = Netlink::new().unwrap();
            let ageing = BridgeOpt(4); // IFLA_BR_AGEING_TIME, u32, no constant here
            let opts = BridgeOpts::from([
                (BridgeOpt::MCAST_SNOOPING, OptValue::U8(0)),
                (ageing, OptValue::U32(12_300)),
            ]);
            let br = nl.link_add(&LinkSpec::new("br0", LinkKind::Bridge { opts })).unwrap();
            let have = br.bridge.clone().expect("a bridge reads back with its options");
            assert_eq!(have.get(BridgeOpt::MCAST_SNOOPING), Some(0), "{have:?}");
            assert_eq!(have.get(ageing), Some(12_300), "{have:?}");
            assert_eq!(have.get(BridgeOpt::STP_STATE), Some(0), "the kernel's default comes along");
            assert_eq!(have.get(BridgeOpt::VLAN_FILTERING), Some(0));
            nl.bridge_set(br.index, &BridgeOpts::default().with(BridgeOpt::MCAST_SNOOPING, OptValue::U8(1)))
                .unwrap();
            let have = nl.link_by_index(br.index).unwrap().unwrap().bridge.unwrap();
            assert_eq!(have.get(BridgeOpt::MCAST_SNOOPING), Some(1));
            assert_eq!(have.get(ageing), Some(12_300), "an option not sent is left as it was");
            // Not a bridge: refused, not reinterpreted.
            let d = nl
                .link_add(&LinkSpec::new("vh0", LinkKind::Veth { peer: VethPeer::new("vc0", None) }))
                .unwrap();
            assert_eq!(d.bridge, None);
            let e =
                nl.bridge_set(d.index, &BridgeOpts::default().with(ageing, OptValue::U32(100))).unwrap_err();
            assert!(e.is_unsupported(), "{e}");
        }

        #[test]
        fn vlans_on_a_port_or_a_clear_unsupported_error() {
            private_netns();
            let mut nl = Netlink::new().unwrap();
            let (_br, port) = bridge_with_port(&mut nl);
            match nl.bridge_vlan_add(
                port.index,
                &[PortVlan::access(100), PortVlan::tagged(200), PortVlan::tagged(201)],
            ) {
                Err(e) if e.is_unsupported() => {
                    println!(
                        "kernel test not run: bridge VLAN filtering is not supported by this kernel ({e})"
                    );
                }
                Err(e) => panic!("unexpected error: {e}"),
                Ok(()) => {
                    let vlans = nl.bridge_port_vlans(port.index).unwrap();
                    assert!(vlans.contains(&PortVlan::access(100)), "{vlans:?}");
                    assert!(
                        vlans.contains(&PortVlan::tagged(200)) && vlans.contains(&PortVlan::tagged(201)),
                        "{vlans:?}"
                    );
                    nl.bridge_vlan_del(port.index, &[200, 201]).unwrap();
                    let vlans = nl.bridge_port_vlans(port.index).unwrap();
                    assert!(!vlans.iter().any(|v| v.vid == 200 || v.vid == 201), "{vlans:?}");
                }
            }
        }

        #[test]
        fn waits_for_oper_up_without_sleeping() {
            private_netns();
            let mut nl = Netlink::new().unwrap();
            let spec = LinkSpec {
                up: true,
                ..LinkSpec::new("wa0", LinkKind::Veth { peer: VethPeer::new("wb0", None) })
            };
            let a = nl.link_add(&spec).unwrap();
            // The peer is down: a short wait times out and says why.
            let e = nl.wait_link_oper_up(a.index, Duration::from_millis(30)).unwrap_err();
            assert_eq!(e.errno, libc::ETIMEDOUT);
            assert!(e.to_string().contains("lowerlayerdown") || e.to_string().contains("down"), "{e}");
            let b = nl.link_by_name("wb0").unwrap().unwrap();
            nl.link_set_up(b.index).unwrap();
            let l = nl.wait_link_oper_up(a.index, Duration::from_secs(5)).unwrap().unwrap();
            assert!(l.oper_state_up());
            assert_eq!(nl.wait_link_oper_up(9999, Duration::from_millis(1)).unwrap(), None);
        }
    }
}
