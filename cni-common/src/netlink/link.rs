//! Links: query, create (bridge, veth with the peer in another namespace, ifb, dummy), change
//! and delete.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use std::collections::BTreeMap;

use netlink_packet_core::{
    parse_string, DefaultNla, NlasIterator, ParseableParametrized, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL,
};
use netlink_packet_route::link::{
    InfoBridge, InfoData, InfoKind, InfoVeth, LinkAttribute, LinkFlags, LinkHeader, LinkInfo, LinkMessage,
    State,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use super::{Netlink, NlError};
use crate::netns::NetNs;

const RTM_NEWLINK: u16 = 16;
const LINK_HEADER_LEN: usize = 16;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_INFO_DATA: u16 = 2;
const IFLA_BR_STP_STATE: u16 = 5;
const IFLA_BR_VLAN_FILTERING: u16 = 7;
const IFLA_BR_MCAST_SNOOPING: u16 = 23;
/// `IF_OPER_UP` from RFC 2863 / `linux/if.h`.
const IF_OPER_UP: u8 = 6;

/// A network interface as the kernel reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    /// `IFLA_INFO_KIND`: "veth", "bridge", "ifb", "dummy", …; `None` for devices without a
    /// link type (loopback, physical NICs).
    pub kind: Option<String>,
    pub mtu: u32,
    /// The hardware address, when it is a 6-byte (Ethernet) one.
    pub mac: Option<[u8; 6]>,
    /// Raw `IFF_*` flags.
    pub flags: u32,
    /// Raw `IFLA_OPERSTATE` (RFC 2863 state, `IF_OPER_*`).
    pub oper_state: u8,
    /// Index of the bridge (or other master) this link is enslaved to.
    pub master: Option<u32>,
    /// `IFLA_LINK`: for a veth, the peer's ifindex (in the peer's namespace, see
    /// `link_netnsid`).
    pub link: Option<u32>,
    /// `IFLA_LINK_NETNSID`: the namespace id (as seen from this namespace) where `link` lives.
    pub link_netnsid: Option<i32>,
    pub alias: Option<String>,
    pub txqlen: u32,
    /// `IFLA_GROUP`: the device group (0 unless someone set one).
    pub group: u32,
    /// The options of a bridge device as the kernel reported them (`None` for other kinds).
    pub bridge: Option<BridgeOpts>,
}

/// One option of a bridge device: an `IFLA_BR_*` attribute of its `IFLA_INFO_DATA`. The kernel
/// sets and reports each the same way (`ip link set … type bridge …`), so an option this
/// module has no constant for is `BridgeOpt(<its attribute number>)`: a plugin can set and
/// check it without a change here. Values are the attribute's integer in host byte order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BridgeOpt(pub u16);

impl BridgeOpt {
    /// `IFLA_BR_STP_STATE` (u32): spanning tree on (1) or off (0).
    pub const STP_STATE: BridgeOpt = BridgeOpt(IFLA_BR_STP_STATE);
    /// `IFLA_BR_VLAN_FILTERING` (u8). A kernel without `CONFIG_BRIDGE_VLAN_FILTERING` refuses
    /// the attribute even with value 0, so it is best sent only to turn filtering on.
    pub const VLAN_FILTERING: BridgeOpt = BridgeOpt(IFLA_BR_VLAN_FILTERING);
    /// `IFLA_BR_MCAST_SNOOPING` (u8).
    pub const MCAST_SNOOPING: BridgeOpt = BridgeOpt(IFLA_BR_MCAST_SNOOPING);
}

/// The value of a [`BridgeOpt`], with the width the kernel expects for that attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptValue {
    U8(u8),
    U16(u16),
    U32(u32),
    U64(u64),
}

impl OptValue {
    /// The value, whatever its width (what a comparison with the kernel's answer uses).
    pub fn get(self) -> u64 {
        match self {
            OptValue::U8(v) => v.into(),
            OptValue::U16(v) => v.into(),
            OptValue::U32(v) => v.into(),
            OptValue::U64(v) => v,
        }
    }

    fn bytes(self) -> Vec<u8> {
        match self {
            OptValue::U8(v) => vec![v],
            OptValue::U16(v) => v.to_ne_bytes().to_vec(),
            OptValue::U32(v) => v.to_ne_bytes().to_vec(),
            OptValue::U64(v) => v.to_ne_bytes().to_vec(),
        }
    }

    /// An attribute's raw value, when it is an integer of one of the four widths.
    fn from_bytes(b: &[u8]) -> Option<OptValue> {
        Some(match b.len() {
            1 => OptValue::U8(b[0]),
            2 => OptValue::U16(u16::from_ne_bytes(b.try_into().ok()?)),
            4 => OptValue::U32(u32::from_ne_bytes(b.try_into().ok()?)),
            8 => OptValue::U64(u64::from_ne_bytes(b.try_into().ok()?)),
            _ => return None,
        })
    }
}

/// Options of a bridge device: those a request sets (each sent, in attribute order), or every
/// integer attribute the kernel reported for the bridge (those never asked for come along).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BridgeOpts(BTreeMap<BridgeOpt, OptValue>);

impl BridgeOpts {
    /// These options and `opt` set to `value`.
    pub fn with(mut self, opt: BridgeOpt, value: OptValue) -> BridgeOpts {
        self.set(opt, value);
        self
    }
    pub fn set(&mut self, opt: BridgeOpt, value: OptValue) {
        self.0.insert(opt, value);
    }
    /// Each option of `other` set here (as the kernel applies a request: those not sent stay).
    pub fn merge(&mut self, other: &BridgeOpts) {
        self.0.extend(other.iter());
    }
    /// The value of `opt`, whatever its width (`None` when absent).
    pub fn get(&self, opt: BridgeOpt) -> Option<u64> {
        self.0.get(&opt).map(|v| v.get())
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// Every option held, in attribute order.
    pub fn iter(&self) -> impl Iterator<Item = (BridgeOpt, OptValue)> + '_ {
        self.0.iter().map(|(o, v)| (*o, *v))
    }

    /// `IFLA_INFO_DATA` of a bridge carrying these options.
    pub(crate) fn info_data(&self) -> InfoData {
        InfoData::Bridge(
            self.iter().map(|(o, v)| InfoBridge::Other(DefaultNla::new(o.0, v.bytes()))).collect(),
        )
    }

    /// The integer attributes of the raw `IFLA_INFO_DATA` of a bridge device.
    fn decode(data: &[u8]) -> BridgeOpts {
        let mut opts = BridgeOpts::default();
        for nla in NlasIterator::new(data).map_while(Result::ok) {
            if let Some(v) = OptValue::from_bytes(nla.value()) {
                // (nested attributes carry NLA_F_NESTED; none is an integer option)
                opts.set(BridgeOpt(nla.kind()), v);
            }
        }
        opts
    }
}

impl<const N: usize> From<[(BridgeOpt, OptValue); N]> for BridgeOpts {
    fn from(opts: [(BridgeOpt, OptValue); N]) -> BridgeOpts {
        BridgeOpts(opts.into_iter().collect())
    }
}

impl Link {
    /// Administratively up (`IFF_UP`).
    pub fn up(&self) -> bool {
        self.flags & LinkFlags::Up.bits() != 0
    }

    /// Operationally up (`IFLA_OPERSTATE` is `IF_OPER_UP`).
    pub fn oper_state_up(&self) -> bool {
        self.oper_state == IF_OPER_UP
    }

    /// Promiscuous mode requested by user space (`IFF_PROMISC`; bridge ports are promiscuous
    /// internally without this flag).
    pub fn promisc(&self) -> bool {
        self.flags & LinkFlags::Promisc.bits() != 0
    }

    /// All-multicast mode (`IFF_ALLMULTI`).
    pub fn allmulti(&self) -> bool {
        self.flags & LinkFlags::Allmulti.bits() != 0
    }
}

/// What to create with [`Netlink::link_add`].
#[derive(Debug, Clone)]
pub struct LinkSpec<'a> {
    pub name: String,
    pub kind: LinkKind<'a>,
    pub mtu: Option<u32>,
    pub mac: Option<[u8; 6]>,
    /// Bring the link up as part of creating it.
    pub up: bool,
    /// Enslave to this bridge on creation.
    pub master: Option<u32>,
    pub txqlen: Option<u32>,
    /// Set after creation (the kernel ignores `IFLA_IFALIAS` in a create request).
    pub alias: Option<String>,
    /// `IFLA_GROUP`, which unlike the alias the kernel applies in the create request itself:
    /// the one mark a device can carry from the instant it exists.
    pub group: Option<u32>,
}

impl<'a> LinkSpec<'a> {
    /// A spec with only name and kind set.
    pub fn new(name: impl Into<String>, kind: LinkKind<'a>) -> Self {
        LinkSpec {
            name: name.into(),
            kind,
            mtu: None,
            mac: None,
            up: false,
            master: None,
            txqlen: None,
            alias: None,
            group: None,
        }
    }
}

#[derive(Debug, Clone)]
pub enum LinkKind<'a> {
    /// A bridge with these options (none: the kernel's defaults).
    Bridge {
        opts: BridgeOpts,
    },
    Veth {
        peer: VethPeer<'a>,
    },
    Ifb,
    Dummy,
}

impl LinkKind<'_> {
    fn name(&self) -> &'static str {
        match self {
            LinkKind::Bridge { .. } => "bridge",
            LinkKind::Veth { .. } => "veth",
            LinkKind::Ifb => "ifb",
            LinkKind::Dummy => "dummy",
        }
    }
}

/// The other end of a veth pair. It is created in `netns` (an open namespace file, e.g.
/// `NetNs::as_fd()`), or next to the first end when `None`.
#[derive(Debug, Clone)]
pub struct VethPeer<'a> {
    pub name: String,
    /// Defaults to the first end's MTU.
    pub mtu: Option<u32>,
    pub mac: Option<[u8; 6]>,
    pub netns: Option<BorrowedFd<'a>>,
    /// Bring the peer up right after creating the pair (a second request; the kernel cannot
    /// open a veth end before the pair exists). Usually left false: the container end is
    /// configured and brought up inside the container namespace.
    pub up: bool,
}

impl<'a> VethPeer<'a> {
    pub fn new(name: impl Into<String>, netns: Option<BorrowedFd<'a>>) -> Self {
        VethPeer { name: name.into(), mtu: None, mac: None, netns, up: false }
    }
}

fn up_flags(up: bool) -> (LinkFlags, LinkFlags) {
    if up {
        (LinkFlags::Up, LinkFlags::Up)
    } else {
        (LinkFlags::empty(), LinkFlags::empty())
    }
}

/// The `RTM_NEWLINK` request that creates `spec`: one message, also for a veth pair, whose peer
/// is described by a nested link message inside `IFLA_INFO_DATA`/`VETH_INFO_PEER` carrying its
/// own name, MTU, MAC and `IFLA_NET_NS_FD`, so the kernel creates it directly in the target
/// namespace.
pub(crate) fn new_link_message(spec: &LinkSpec<'_>) -> LinkMessage {
    let mut msg = LinkMessage::default();
    (msg.header.flags, msg.header.change_mask) = up_flags(spec.up);
    let attrs = &mut msg.attributes;
    attrs.push(LinkAttribute::IfName(spec.name.clone()));
    if let Some(mtu) = spec.mtu {
        attrs.push(LinkAttribute::Mtu(mtu));
    }
    if let Some(mac) = spec.mac {
        attrs.push(LinkAttribute::Address(mac.to_vec()));
    }
    if let Some(q) = spec.txqlen {
        attrs.push(LinkAttribute::TxQueueLen(q));
    }
    if let Some(g) = spec.group {
        attrs.push(LinkAttribute::Group(g));
    }
    if let Some(master) = spec.master {
        attrs.push(LinkAttribute::Controller(master));
    }
    let info = match &spec.kind {
        LinkKind::Bridge { opts } => {
            let mut info = vec![LinkInfo::Kind(InfoKind::Bridge)];
            if !opts.is_empty() {
                info.push(LinkInfo::Data(opts.info_data()));
            }
            info
        }
        LinkKind::Veth { peer } => {
            // No up flag here: see `Netlink::veth_peer_up`.
            let mut p = LinkMessage::default();
            p.attributes.push(LinkAttribute::IfName(peer.name.clone()));
            if let Some(mtu) = peer.mtu.or(spec.mtu) {
                p.attributes.push(LinkAttribute::Mtu(mtu));
            }
            if let Some(mac) = peer.mac {
                p.attributes.push(LinkAttribute::Address(mac.to_vec()));
            }
            if let Some(q) = spec.txqlen {
                p.attributes.push(LinkAttribute::TxQueueLen(q));
            }
            if let Some(fd) = peer.netns {
                p.attributes.push(LinkAttribute::NetNsFd(fd.as_raw_fd()));
            }
            vec![LinkInfo::Kind(InfoKind::Veth), LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(p)))]
        }
        LinkKind::Ifb => vec![LinkInfo::Kind(InfoKind::Ifb)],
        LinkKind::Dummy => vec![LinkInfo::Kind(InfoKind::Dummy)],
    };
    attrs.push(LinkAttribute::LinkInfo(info));
    msg
}

/// Decode an `RTM_NEWLINK` payload. Lenient: attributes this crate version cannot decode are
/// skipped instead of failing the whole dump; the link kind is read straight from the raw
/// `IFLA_LINKINFO` so that unusual `IFLA_INFO_DATA` contents cannot hide it.
pub(crate) fn parse_link(buf: &[u8]) -> Option<Link> {
    let header = LinkHeader::parse(buf).ok()?;
    let mut link = Link { index: header.index, flags: header.flags.bits(), ..Link::default() };
    for nla in NlasIterator::new(buf.get(LINK_HEADER_LEN..)?) {
        let Ok(nla) = nla else { break };
        if nla.kind() == IFLA_LINKINFO {
            link.kind = info_kind(nla.value());
            if link.kind.as_deref() == Some("bridge") {
                link.bridge = Some(info_data(nla.value()).map(BridgeOpts::decode).unwrap_or_default());
            }
            continue;
        }
        let Ok(attr) = LinkAttribute::parse_with_param(&nla, header.interface_family) else {
            continue;
        };
        match attr {
            LinkAttribute::IfName(n) => link.name = n,
            LinkAttribute::Mtu(m) => link.mtu = m,
            LinkAttribute::Address(a) => link.mac = a.as_slice().try_into().ok(),
            LinkAttribute::OperState(s) => link.oper_state = oper_state_raw(s),
            LinkAttribute::Controller(m) if m != 0 => link.master = Some(m),
            LinkAttribute::Link(l) if l != 0 => link.link = Some(l),
            LinkAttribute::LinkNetNsId(id) => link.link_netnsid = Some(id),
            LinkAttribute::IfAlias(a) if !a.is_empty() => link.alias = Some(a),
            LinkAttribute::TxQueueLen(q) => link.txqlen = q,
            LinkAttribute::Group(g) => link.group = g,
            _ => {}
        }
    }
    Some(link)
}

/// `IFLA_INFO_KIND` from the raw value of `IFLA_LINKINFO`.
fn info_kind(linkinfo: &[u8]) -> Option<String> {
    NlasIterator::new(linkinfo)
        .map_while(Result::ok)
        .find(|nla| nla.kind() == IFLA_INFO_KIND)
        .and_then(|nla| parse_string(nla.value()).ok())
}

/// The raw `IFLA_INFO_DATA` of a raw `IFLA_LINKINFO`.
fn info_data(linkinfo: &[u8]) -> Option<&[u8]> {
    let nla = NlasIterator::new(linkinfo).map_while(Result::ok).find(|nla| nla.kind() == IFLA_INFO_DATA)?;
    let len = usize::from(nla.length());
    nla.into_inner().get(4..len) // past the attribute's 4-byte header
}

fn oper_state_raw(s: State) -> u8 {
    match s {
        State::Unknown => 0,
        State::NotPresent => 1,
        State::Down => 2,
        State::LowerLayerDown => 3,
        State::Testing => 4,
        State::Dormant => 5,
        State::Up => IF_OPER_UP,
        State::Other(v) => v,
        _ => 0,
    }
}

fn decode_links(replies: Vec<super::socket::Reply>) -> Result<Vec<Link>, NlError> {
    replies
        .into_iter()
        .filter(|r| r.msg_type == RTM_NEWLINK)
        .map(|r| parse_link(&r.payload).ok_or_else(|| NlError::new("decode link message", libc::EBADMSG)))
        .collect()
}

impl Netlink {
    fn get_link(&mut self, msg: LinkMessage) -> Result<Option<Link>, NlError> {
        match self.sock.request(RouteNetlinkMessage::GetLink(msg), 0) {
            Ok(replies) => Ok(decode_links(replies)?.into_iter().next()),
            Err(e) if e.errno == libc::ENODEV => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The link called `name`, or `None`.
    pub fn link_by_name(&mut self, name: &str) -> Result<Option<Link>, NlError> {
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        self.get_link(msg).map_err(|e| e.during(format!("look up link {name}")))
    }

    /// The id this connection's namespace gives namespace `ns` (what a link's
    /// [`Link::link_netnsid`] names), or `None` when it gives it none (`RTM_GETNSID`).
    pub fn nsid_of(&mut self, ns: &NetNs) -> Result<Option<i32>, NlError> {
        /// `RTM_NEWNSID`, and `NETNSA_NSID` in its answer.
        const RTM_NEWNSID: u16 = 88;
        const NETNSA_NSID: u16 = 1;
        let mut msg = netlink_packet_route::nsid::NsidMessage::default();
        msg.attributes.push(netlink_packet_route::nsid::NsidAttribute::Fd(ns.as_fd().as_raw_fd() as u32));
        let replies = self
            .sock
            .request(RouteNetlinkMessage::GetNsId(msg), 0)
            .map_err(|e| e.during("get a namespace id"))?;
        Ok(replies
            .iter()
            .filter(|r| r.msg_type == RTM_NEWNSID)
            .find_map(|r| {
                super::nfnl::attrs(r.payload.get(4..)?)
                    .find(|(t, _)| *t & 0x3fff == NETNSA_NSID)
                    .and_then(|(_, v)| Some(i32::from_ne_bytes(v.get(..4)?.try_into().ok()?)))
            })
            .filter(|id| *id >= 0))
    }

    /// The link with ifindex `index`, or `None`.
    pub fn link_by_index(&mut self, index: u32) -> Result<Option<Link>, NlError> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        self.get_link(msg).map_err(|e| e.during(format!("look up link {index}")))
    }

    /// All links of the namespace.
    pub fn links(&mut self) -> Result<Vec<Link>, NlError> {
        let replies = self
            .sock
            .request(RouteNetlinkMessage::GetLink(LinkMessage::default()), NLM_F_DUMP)
            .map_err(|e| e.during("list links"))?;
        decode_links(replies)
    }

    /// Create a link and return it as the kernel reports it afterwards. A veth pair is created
    /// in one request; the returned link is the end in this namespace, whose `link` is the
    /// peer's ifindex. Fails with EEXIST ([`NlError::is_exists`]) when the name is taken (in the
    /// peer's namespace too, for the peer's name).
    pub fn link_add(&mut self, spec: &LinkSpec<'_>) -> Result<Link, NlError> {
        let what = || format!("create {} {}", spec.kind.name(), spec.name);
        self.sock
            .request(RouteNetlinkMessage::NewLink(new_link_message(spec)), NLM_F_CREATE | NLM_F_EXCL)
            .map_err(|e| e.during(what()))?;
        let vanished = || NlError::new(format!("{}: vanished", what()), libc::ENODEV);
        let finish = |nl: &mut Netlink| -> Result<Link, NlError> {
            let link = nl.link_by_name(&spec.name)?.ok_or_else(vanished)?;
            if let LinkKind::Veth { peer } = &spec.kind {
                if peer.up {
                    nl.veth_peer_up(&link, peer)?;
                }
            }
            match &spec.alias {
                Some(alias) => {
                    nl.link_set_alias(link.index, alias)?;
                    nl.link_by_index(link.index)?.ok_or_else(vanished)
                }
                None => Ok(link),
            }
        };
        finish(self).inspect_err(|_| {
            // Do not leave a half-configured link behind.
            let _ = self.link_del_by_name(&spec.name);
        })
    }

    /// Bring up the peer of the just-created veth `link`. This cannot be part of the create
    /// request: the kernel configures the peer before the pair is joined, and opening an
    /// unpaired veth fails with ENOTCONN. A peer in another namespace is reached through a
    /// short-lived socket opened inside that namespace. (`IFLA_TARGET_NETNSID` is no way
    /// round this: on a set request the kernel reads it as "move the device there".)
    fn veth_peer_up(&mut self, link: &Link, peer: &VethPeer<'_>) -> Result<(), NlError> {
        let what = format!("set veth peer {} up", peer.name);
        let index = link.link.ok_or_else(|| NlError::new(format!("{what}: no peer index"), libc::ENODEV))?;
        let Some(fd) = peer.netns else {
            return self.link_set_up(index).map_err(|e| e.during(what));
        };
        let netns_failure = |e: crate::CniError| {
            let mut err = NlError::new(what.clone(), libc::EIO);
            err.detail = Some(e.msg);
            err
        };
        let ns = NetNs::from_fd(fd).map_err(netns_failure)?;
        let mut there = Netlink::new_in(&ns).map_err(netns_failure)?;
        there.link_set_up(index).map_err(|e| e.during(what.clone()))
    }

    fn set_link(
        &mut self,
        what: impl FnOnce() -> String,
        index: u32,
        build: impl FnOnce(&mut LinkMessage),
    ) -> Result<(), NlError> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        build(&mut msg);
        self.sock.request(RouteNetlinkMessage::SetLink(msg), 0).map(drop).map_err(|e| e.during(what()))
    }

    pub fn link_set_up(&mut self, index: u32) -> Result<(), NlError> {
        self.set_link(
            || format!("set link {index} up"),
            index,
            |m| {
                m.header.flags = LinkFlags::Up;
                m.header.change_mask = LinkFlags::Up;
            },
        )
    }

    pub fn link_set_down(&mut self, index: u32) -> Result<(), NlError> {
        self.set_link(
            || format!("set link {index} down"),
            index,
            |m| {
                m.header.flags = LinkFlags::empty();
                m.header.change_mask = LinkFlags::Up;
            },
        )
    }

    pub fn link_set_mac(&mut self, index: u32, mac: [u8; 6]) -> Result<(), NlError> {
        self.set_link(
            || format!("set mac {} on link {index}", crate::mac::Mac(mac)),
            index,
            |m| m.attributes.push(LinkAttribute::Address(mac.to_vec())),
        )
    }

    pub fn link_set_promisc(&mut self, index: u32, on: bool) -> Result<(), NlError> {
        self.set_link(
            || format!("set promisc {} on link {index}", if on { "on" } else { "off" }),
            index,
            |m| {
                m.header.flags = if on { LinkFlags::Promisc } else { LinkFlags::empty() };
                m.header.change_mask = LinkFlags::Promisc;
            },
        )
    }

    /// Turn all-multicast mode on or off (`ip link set … allmulticast on|off`).
    pub fn link_set_allmulti(&mut self, index: u32, on: bool) -> Result<(), NlError> {
        self.set_link(
            || format!("set allmulticast {} on link {index}", if on { "on" } else { "off" }),
            index,
            |m| {
                m.header.flags = if on { LinkFlags::Allmulti } else { LinkFlags::empty() };
                m.header.change_mask = LinkFlags::Allmulti;
            },
        )
    }

    /// Set the MTU.
    pub fn link_set_mtu(&mut self, index: u32, mtu: u32) -> Result<(), NlError> {
        self.set_link(
            || format!("set mtu {mtu} on link {index}"),
            index,
            |m| m.attributes.push(LinkAttribute::Mtu(mtu)),
        )
    }

    /// Set the transmit queue length (`ip link set … txqueuelen`).
    pub fn link_set_txqlen(&mut self, index: u32, len: u32) -> Result<(), NlError> {
        self.set_link(
            || format!("set txqueuelen {len} on link {index}"),
            index,
            |m| m.attributes.push(LinkAttribute::TxQueueLen(len)),
        )
    }

    /// Rename a link (it must be down: the kernel refuses to rename a running device).
    pub fn link_set_name(&mut self, index: u32, name: &str) -> Result<(), NlError> {
        self.set_link(
            || format!("rename link {index} to {name}"),
            index,
            |m| m.attributes.push(LinkAttribute::IfName(name.to_string())),
        )
    }

    /// Set the alias (`ip link set … alias`); an empty string removes it.
    pub fn link_set_alias(&mut self, index: u32, alias: &str) -> Result<(), NlError> {
        self.set_link(
            || format!("set alias {alias:?} on link {index}"),
            index,
            |m| m.attributes.push(LinkAttribute::IfAlias(alias.to_string())),
        )
    }

    /// Delete a link (for a veth, both ends go).
    pub fn link_del(&mut self, index: u32) -> Result<(), NlError> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        self.sock
            .request(RouteNetlinkMessage::DelLink(msg), 0)
            .map(drop)
            .map_err(|e| e.during(format!("delete link {index}")))
    }

    /// Delete the link called `name`; `Ok(false)` when there is none.
    pub fn link_del_by_name(&mut self, name: &str) -> Result<bool, NlError> {
        let mut msg = LinkMessage::default();
        msg.header.interface_family = AddressFamily::Unspec;
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        match self.sock.request(RouteNetlinkMessage::DelLink(msg), 0) {
            Ok(_) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(e.during(format!("delete link {name}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::tests::emit;
    use netlink_packet_core::Parseable;
    use std::os::fd::AsFd;

    #[test]
    fn veth_request_carries_peer_with_netns_fd() {
        let ns = std::fs::File::open("/proc/self/ns/net").unwrap();
        let mut spec = LinkSpec::new(
            "veth1234",
            LinkKind::Veth {
                peer: VethPeer {
                    name: "eth0".into(),
                    mtu: None,
                    mac: Some([0x02, 0, 0, 0, 0, 0x42]),
                    netns: Some(ns.as_fd()),
                    up: true,
                },
            },
        );
        spec.mtu = Some(1450);
        spec.master = Some(7);
        spec.up = true;
        let msg = new_link_message(&spec);

        // Round-trip through bytes, as the kernel would see it.
        let parsed = LinkMessage::parse(&emit(&msg)[..]).unwrap();
        assert_eq!(parsed, msg);
        assert!(parsed.header.flags.contains(LinkFlags::Up));
        assert!(parsed.attributes.contains(&LinkAttribute::IfName("veth1234".into())));
        assert!(parsed.attributes.contains(&LinkAttribute::Mtu(1450)));
        assert!(parsed.attributes.contains(&LinkAttribute::Controller(7)));
        // The host end itself must not move.
        assert!(!parsed.attributes.iter().any(|a| matches!(a, LinkAttribute::NetNsFd(_))));

        let info = parsed
            .attributes
            .iter()
            .find_map(|a| match a {
                LinkAttribute::LinkInfo(i) => Some(i),
                _ => None,
            })
            .expect("IFLA_LINKINFO");
        assert_eq!(info[0], LinkInfo::Kind(InfoKind::Veth));
        let LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(peer))) = &info[1] else {
            panic!("no VETH_INFO_PEER in {info:?}");
        };
        // Bringing the peer up is a separate request (ENOTCONN otherwise).
        assert!(peer.header.flags.is_empty());
        let pa = &peer.attributes;
        assert!(pa.contains(&LinkAttribute::IfName("eth0".into())));
        assert!(pa.contains(&LinkAttribute::NetNsFd(ns.as_raw_fd())));
        // The peer inherits the MTU when it has none of its own.
        assert!(pa.contains(&LinkAttribute::Mtu(1450)));
        assert!(pa.contains(&LinkAttribute::Address(vec![0x02, 0, 0, 0, 0, 0x42])));
    }

    #[test]
    fn bridge_request_sends_the_options_asked_for_and_none_else() {
        let plain =
            new_link_message(&LinkSpec::new("cni0", LinkKind::Bridge { opts: BridgeOpts::default() }));
        assert!(plain.attributes.contains(&LinkAttribute::LinkInfo(vec![LinkInfo::Kind(InfoKind::Bridge)])));
        let opts = BridgeOpts::from([
            (BridgeOpt::VLAN_FILTERING, OptValue::U8(1)),
            (BridgeOpt::STP_STATE, OptValue::U32(0)),
        ]);
        let vf = new_link_message(&LinkSpec::new("cni0", LinkKind::Bridge { opts }));
        // the same bytes the library's named attributes make, in attribute order
        assert_eq!(
            emit(&vf),
            emit(&{
                let mut m = LinkMessage::default();
                m.attributes.push(LinkAttribute::IfName("cni0".into()));
                m.attributes.push(LinkAttribute::LinkInfo(vec![
                    LinkInfo::Kind(InfoKind::Bridge),
                    LinkInfo::Data(InfoData::Bridge(vec![
                        InfoBridge::StpState(netlink_packet_route::link::BridgeStpState::Disabled),
                        InfoBridge::VlanFiltering(true),
                    ])),
                ]));
                m
            })
        );
    }

    #[test]
    fn a_bridge_reads_back_with_its_integer_options_and_other_kinds_with_none() {
        let mut msg = LinkMessage::default();
        msg.header.index = 3;
        msg.attributes = vec![
            LinkAttribute::IfName("cni0".into()),
            LinkAttribute::LinkInfo(vec![
                LinkInfo::Kind(InfoKind::Bridge),
                LinkInfo::Data(InfoData::Bridge(vec![
                    InfoBridge::StpState(netlink_packet_route::link::BridgeStpState::KernelStp),
                    InfoBridge::VlanFiltering(false),
                    InfoBridge::MulticastSnooping(true),
                    InfoBridge::AgeingTime(30000),
                    InfoBridge::MulticastLastMemberInterval(100),
                    // not an integer: skipped
                    InfoBridge::Other(netlink_packet_core::DefaultNla::new(200, vec![1, 2, 3])),
                ])),
            ]),
        ];
        let br = parse_link(&emit(&msg)).unwrap().bridge.expect("the options of a bridge device");
        assert_eq!(br.get(BridgeOpt::STP_STATE), Some(1));
        assert_eq!(br.get(BridgeOpt::VLAN_FILTERING), Some(0));
        assert_eq!(br.get(BridgeOpt::MCAST_SNOOPING), Some(1));
        assert_eq!(br.get(BridgeOpt(4)), Some(30000), "a u32 this module has no constant for");
        assert_eq!(br.get(BridgeOpt(30)), Some(100), "a u64");
        assert_eq!(br.get(BridgeOpt(200)), None);
        assert_eq!(br.iter().count(), 5);
        msg.attributes[1] = LinkAttribute::LinkInfo(vec![LinkInfo::Kind(InfoKind::Bridge)]);
        assert_eq!(parse_link(&emit(&msg)).unwrap().bridge, Some(BridgeOpts::default()));
        msg.attributes[1] = LinkAttribute::LinkInfo(vec![LinkInfo::Kind(InfoKind::Dummy)]);
        assert_eq!(parse_link(&emit(&msg)).unwrap().bridge, None);
    }

    #[test]
    fn link_parses_from_kernel_style_message() {
        let mut msg = LinkMessage::default();
        msg.header.index = 12;
        msg.header.flags = LinkFlags::Up | LinkFlags::Promisc | LinkFlags::Broadcast;
        msg.attributes = vec![
            LinkAttribute::IfName("veth0".into()),
            LinkAttribute::Mtu(1400),
            LinkAttribute::Address(vec![2, 0xab, 0, 0, 0, 1]),
            LinkAttribute::Controller(3),
            LinkAttribute::Link(4),
            LinkAttribute::LinkNetNsId(0),
            LinkAttribute::IfAlias("container x".into()),
            LinkAttribute::TxQueueLen(1000),
            LinkAttribute::Group(0xB700_0001),
            LinkAttribute::OperState(State::Up),
            LinkAttribute::LinkInfo(vec![LinkInfo::Kind(InfoKind::Veth)]),
            LinkAttribute::Other(netlink_packet_core::DefaultNla::new(999, vec![1, 2, 3, 4])),
        ];
        let link = parse_link(&emit(&msg)).unwrap();
        assert_eq!(
            link,
            Link {
                index: 12,
                name: "veth0".into(),
                kind: Some("veth".into()),
                mtu: 1400,
                mac: Some([2, 0xab, 0, 0, 0, 1]),
                flags: (LinkFlags::Up | LinkFlags::Promisc | LinkFlags::Broadcast).bits(),
                oper_state: IF_OPER_UP,
                master: Some(3),
                link: Some(4),
                link_netnsid: Some(0),
                alias: Some("container x".into()),
                txqlen: 1000,
                group: 0xB700_0001,
                bridge: None,
            }
        );
        assert!(link.up() && link.promisc() && link.oper_state_up());
    }

    #[test]
    fn undecodable_attributes_are_skipped() {
        let mut msg = LinkMessage::default();
        msg.header.index = 2;
        msg.attributes = vec![
            LinkAttribute::IfName("lo".into()),
            // IFLA_MTU with a 2-byte value cannot be decoded as u32.
            LinkAttribute::Other(netlink_packet_core::DefaultNla::new(4, vec![1, 2])),
            LinkAttribute::TxQueueLen(5),
        ];
        let link = parse_link(&emit(&msg)).unwrap();
        assert_eq!((link.name.as_str(), link.mtu, link.txqlen), ("lo", 0, 5));
        assert!(!link.up());
        assert_eq!(link.kind, None);
        assert!(parse_link(&[0; 4]).is_none());
    }
}
