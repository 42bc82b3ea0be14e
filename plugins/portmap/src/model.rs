//! The elements of portmap's table, typed, and their bytes.
//!
//! Every element is a [`Key`] (which also names its [`Set`]) and, in a map, [`Data`]. Their
//! bytes follow the set's declared types (`layout::set_types`): a key or datum is a list of
//! [`Value`]s, each written in its type's width and padded to 4 bytes inside a concatenation,
//! as nft writes them, so `nft list` shows our elements like its own. [`Elem::encode`] and
//! [`Elem::decode`] are the only place that knows the bytes.

use cni_common::attachment::AttachmentId;

use crate::identity::PortmapIdentity;
use cni_common::net::{Family, Proto};
use cni_common::netlink::nft::{split_concat, NftData, NftElem, NftType};
use ipnet::IpNet;
use sha2::{Digest, Sha256};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A 128-bit value stored as an `ipv6_addr` (nft has no wider integer type): the hash of an
/// attachment, a container's shared claim, or the fingerprint of an attachment's mappings.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct Hash(pub [u8; 16]);

impl Hash {
    /// The first 16 bytes of SHA-256 over the parts, each followed by a NUL.
    pub fn of(parts: &[&[u8]]) -> Hash {
        let mut h = Sha256::new();
        for p in parts {
            h.update(p);
            h.update([0u8]);
        }
        let d: [u8; 32] = h.finalize().into();
        let mut out = [0u8; 16];
        out.copy_from_slice(&d[..16]);
        Hash(out)
    }
}

impl fmt::Display for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Ipv6Addr::from(self.0).fmt(f)
    }
}

/// Who elements belong to: one attachment (network, container id, interface) in the encodings
/// of [`AttachmentId`] (`crate::identity`: `portmap_tag`, `portmap_hash`, `portmap_container`, pinned there so that
/// tables written by earlier builds stay readable).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// `<network>,<container id>,<ifname>`: the comment of the attachment's elements (only
    /// characters nft's quoting leaves alone, at most 128 bytes).
    pub tag: String,
    /// The attachment's 128-bit value: its claim in the `owner` map while it holds a host port
    /// alone, the key of its `attachments` and `netns` records.
    pub hash: Hash,
    /// The container part of the tag (the id, or its hash when long).
    pub container: String,
}

impl Owner {
    pub fn of(a: &AttachmentId) -> Owner {
        Owner {
            tag: a.portmap_tag(),
            hash: Hash(a.portmap_hash().octets()),
            container: a.portmap_container(),
        }
    }

    pub fn new(network: &str, container_id: &str, ifname: &str) -> Owner {
        Owner::of(&AttachmentId::new(network, container_id, ifname))
    }
}

/// The `owner` value of a host port claimed by several attachments of one container: no
/// single attachment's hash.
pub fn shared_hash(container: &str) -> Hash {
    Hash::of(&[b"shared", container.as_bytes()])
}

/// The container part of an owner tag.
pub fn container_of(tag: &str) -> Option<&str> {
    let mut p = tag.split(',');
    match (p.next(), p.next(), p.next(), p.next()) {
        (Some(_), Some(c), Some(_), None) => Some(c),
        _ => None,
    }
}

/// A holder named from an element comment, for messages.
pub fn describe_holder(comment: Option<&str>) -> String {
    match comment.map(|c| c.splitn(3, ',').collect::<Vec<_>>()) {
        Some(p) if p.len() == 3 => format!("network {:?}, container {:?}, interface {:?}", p[0], p[1], p[2]),
        Some(p) => format!("an element with comment {:?}", p.join(",")),
        None => "an element without owner comment (not created by this plugin?)".into(),
    }
}

/// IPv4 addresses mapped into IPv6 (the `owner` and `claims` maps hold both families).
pub fn mapped(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a,
    }
}

fn unmapped(a: Ipv6Addr) -> IpAddr {
    a.to_ipv4_mapped().map_or(IpAddr::V6(a), IpAddr::V4)
}

/// A host port: the host address it is mapped on (None: every local address of the family),
/// the protocol and the port.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct HostPort {
    pub fam: Family,
    pub ip: Option<IpAddr>,
    pub proto: Proto,
    pub port: u16,
}

impl HostPort {
    /// The address in `owner` and `claims` keys: IPv4 mapped into IPv6, "every address" as
    /// `::ffff:0.0.0.0` (IPv4) or `::` (IPv6).
    pub fn owner_addr(&self) -> Ipv6Addr {
        match (self.ip, self.fam) {
            (Some(ip), _) => mapped(ip),
            (None, Family::V4) => Ipv4Addr::UNSPECIFIED.to_ipv6_mapped(),
            (None, Family::V6) => Ipv6Addr::UNSPECIFIED,
        }
    }

    fn from_owner_addr(addr: Ipv6Addr, proto: Proto, port: u16) -> HostPort {
        let (fam, ip) = match addr.to_ipv4_mapped() {
            Some(v4) if v4.is_unspecified() => (Family::V4, None),
            Some(v4) => (Family::V4, Some(IpAddr::V4(v4))),
            None if addr.is_unspecified() => (Family::V6, None),
            None => (Family::V6, Some(IpAddr::V6(addr))),
        };
        HostPort { fam, ip, proto, port }
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

    pub fn fam(&self) -> Family {
        Family::of(&self.ctr)
    }
}

/// The identity of a network namespace: its nsfs inode and its netns cookie
/// (`SO_NETNS_COOKIE`, never reused while the machine runs); 0 when unknown.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default, PartialOrd, Ord)]
pub struct NsId {
    pub ino: u64,
    pub cookie: u64,
}

impl NsId {
    /// Whether `other` is certainly another namespace: an inode or a cookie known on both
    /// sides differs.
    pub fn differs(&self, other: &NsId) -> bool {
        let d = |a: u64, b: u64| a != 0 && b != 0 && a != b;
        d(self.ino, other.ino) || d(self.cookie, other.cookie)
    }

    /// Inode and cookie, big-endian, in one 128-bit value.
    fn to_v6(self) -> Ipv6Addr {
        Ipv6Addr::from(u128::from(self.ino) << 64 | u128::from(self.cookie))
    }

    fn from_v6(a: Ipv6Addr) -> NsId {
        let v = u128::from(a);
        NsId { ino: (v >> 64) as u64, cookie: v as u64 }
    }
}

/// The sets and maps that hold elements.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub enum Set {
    /// `hp4`/`hp6`: proto . port → target (every local address of the family).
    Hp(Family),
    /// `hip4`/`hip6`: host address . proto . port → target.
    Hip(Family),
    /// `owner`: host port → the hash of the attachment holding it alone, or the container's
    /// shared hash.
    Owner,
    /// `claims`: host port . attachment hash → target, one per claimant.
    Claims,
    /// `attachments`: attachment hash → the fingerprint of its mappings (comment: its tag).
    Attachments,
    /// `netns`: attachment hash → the identity of its network namespace (comment: the path).
    Netns,
    /// `net4_<len>`/`net6_<len>`: source prefix . container address . proto . port (for `/0`,
    /// every source: container address . proto . port).
    Net(Family, u8),
}

impl Set {
    /// The sets that always exist (the `net*` sets come with the prefix lengths in use).
    pub const FIXED: [Set; 8] = [
        Set::Hp(Family::V4),
        Set::Hip(Family::V4),
        Set::Hp(Family::V6),
        Set::Hip(Family::V6),
        Set::Owner,
        Set::Claims,
        Set::Attachments,
        Set::Netns,
    ];

    pub fn name(&self) -> String {
        match self {
            Set::Hp(f) => format!("hp{}", f.digit()),
            Set::Hip(f) => format!("hip{}", f.digit()),
            Set::Owner => "owner".into(),
            Set::Claims => "claims".into(),
            Set::Attachments => "attachments".into(),
            Set::Netns => "netns".into(),
            Set::Net(f, len) => format!("net{}_{len}", f.digit()),
        }
    }

    /// The set called `name`; None for any other name (exact names only, canonical numbers).
    pub fn parse(name: &str) -> Option<Set> {
        if let Some(s) = Set::FIXED.into_iter().find(|s| s.name() == name) {
            return Some(s);
        }
        let (fam, len) = name.strip_prefix("net")?.split_once('_')?;
        let fam = match fam {
            "4" => Family::V4,
            "6" => Family::V6,
            _ => return None,
        };
        let n: u8 = len.parse().ok()?;
        (n <= fam.max_prefix() && n.to_string() == len).then_some(Set::Net(fam, n))
    }

    /// Key and data types (data: None for a set).
    pub fn types(&self) -> (&'static [NftType], Option<&'static [NftType]>) {
        use Family::{V4, V6};
        use NftType::{InetProto as P, InetService as S, Ipv4Addr as A4, Ipv6Addr as A6};
        match self {
            Set::Hp(V4) => (&[P, S], Some(&[A4, S])),
            Set::Hp(V6) => (&[P, S], Some(&[A6, S])),
            Set::Hip(V4) => (&[A4, P, S], Some(&[A4, S])),
            Set::Hip(V6) => (&[A6, P, S], Some(&[A6, S])),
            Set::Owner => (&[A6, P, S], Some(&[A6])),
            Set::Claims => (&[A6, P, S, A6], Some(&[A6, S])),
            Set::Attachments | Set::Netns => (&[A6], Some(&[A6])),
            Set::Net(V4, 0) => (&[A4, P, S], None),
            Set::Net(V6, 0) => (&[A6, P, S], None),
            Set::Net(V4, _) => (&[A4, A4, P, S], None),
            Set::Net(V6, _) => (&[A6, A6, P, S], None),
        }
    }
}

impl fmt::Display for Set {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// The key of an element (which also names its set).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub enum Key {
    Dnat(HostPort),
    Owner(HostPort),
    Claim(HostPort, Hash),
    Attachment(Hash),
    Netns(Hash),
    Masq(Masq),
}

impl Key {
    pub fn set(&self) -> Set {
        match self {
            Key::Dnat(hp) if hp.ip.is_none() => Set::Hp(hp.fam),
            Key::Dnat(hp) => Set::Hip(hp.fam),
            Key::Owner(_) => Set::Owner,
            Key::Claim(..) => Set::Claims,
            Key::Attachment(_) => Set::Attachments,
            Key::Netns(_) => Set::Netns,
            Key::Masq(m) => Set::Net(m.fam(), m.src.prefix_len()),
        }
    }

    /// The host port of a DNAT, `owner` or `claims` element.
    pub fn host_port(&self) -> Option<HostPort> {
        match self {
            Key::Dnat(hp) | Key::Owner(hp) | Key::Claim(hp, _) => Some(*hp),
            _ => None,
        }
    }

    fn values(&self) -> Vec<Value> {
        let pp = |hp: &HostPort| [Value::Proto(hp.proto), Value::Port(hp.port)];
        match self {
            Key::Dnat(hp) => hp.ip.map(Value::Ip).into_iter().chain(pp(hp)).collect(),
            Key::Owner(hp) => [Value::Ip(IpAddr::V6(hp.owner_addr()))].into_iter().chain(pp(hp)).collect(),
            Key::Claim(hp, h) => {
                let mut v = vec![Value::Ip(IpAddr::V6(hp.owner_addr()))];
                v.extend(pp(hp));
                v.push(Value::hash(*h));
                v
            }
            Key::Attachment(h) | Key::Netns(h) => vec![Value::hash(*h)],
            Key::Masq(m) => {
                let src = (m.src.prefix_len() > 0).then_some(Value::Ip(m.src.addr()));
                let rest = [Value::Ip(m.ctr), Value::Proto(m.proto), Value::Port(m.port)];
                src.into_iter().chain(rest).collect()
            }
        }
    }

    fn from_values(set: Set, v: &[Value]) -> Option<Key> {
        use Value::{Ip, Port, Proto as P};
        let owner = |a: &IpAddr, p: &Proto, n: &u16| match a {
            IpAddr::V6(a) => Some(HostPort::from_owner_addr(*a, *p, *n)),
            IpAddr::V4(_) => None,
        };
        Some(match (set, v) {
            (Set::Hp(fam), [P(p), Port(n)]) => Key::Dnat(HostPort { fam, ip: None, proto: *p, port: *n }),
            (Set::Hip(fam), [Ip(a), P(p), Port(n)]) => {
                Key::Dnat(HostPort { fam, ip: Some(*a), proto: *p, port: *n })
            }
            (Set::Owner, [Ip(a), P(p), Port(n)]) => Key::Owner(owner(a, p, n)?),
            (Set::Claims, [Ip(a), P(p), Port(n), h]) => Key::Claim(owner(a, p, n)?, h.as_hash()?),
            (Set::Attachments, [h]) => Key::Attachment(h.as_hash()?),
            (Set::Netns, [h]) => Key::Netns(h.as_hash()?),
            (Set::Net(fam, 0), [Ip(c), P(p), Port(n)]) => {
                let any = match fam {
                    Family::V4 => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                    Family::V6 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
                };
                Key::Masq(Masq { src: IpNet::new(any, 0).ok()?, ctr: *c, proto: *p, port: *n })
            }
            (Set::Net(_, len), [Ip(s), Ip(c), P(p), Port(n)]) => {
                let src = IpNet::new(*s, len).ok()?;
                if src.trunc() != src {
                    return None; // host bits set: not an element we write
                }
                Key::Masq(Masq { src, ctr: *c, proto: *p, port: *n })
            }
            _ => return None,
        })
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text: Vec<String> = self.values().iter().map(Value::to_string).collect();
        f.write_str(&text.join(" . "))
    }
}

/// The data of a map element.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub enum Data {
    /// `owner`: the holder's hash; `attachments`: the fingerprint of the mappings.
    Hash(Hash),
    /// `claims` (IPv4 written mapped into IPv6) and the DNAT maps.
    Target(Target),
    /// `netns`.
    Netns(NsId),
}

impl Data {
    fn values(&self, key: &Key) -> Vec<Value> {
        match (self, key) {
            (Data::Hash(h), _) => vec![Value::hash(*h)],
            (Data::Target(t), Key::Claim(..)) => {
                vec![Value::Ip(IpAddr::V6(mapped(t.ip))), Value::Port(t.port)]
            }
            (Data::Target(t), _) => vec![Value::Ip(t.ip), Value::Port(t.port)],
            (Data::Netns(id), _) => vec![Value::Ip(IpAddr::V6(id.to_v6()))],
        }
    }

    fn from_values(key: &Key, v: &[Value]) -> Option<Data> {
        Some(match (key, v) {
            (Key::Owner(_) | Key::Attachment(_), [h]) => Data::Hash(h.as_hash()?),
            (Key::Netns(_), [Value::Ip(IpAddr::V6(a))]) => Data::Netns(NsId::from_v6(*a)),
            (Key::Claim(..), [Value::Ip(IpAddr::V6(a)), Value::Port(p)]) => {
                Data::Target(Target { ip: unmapped(*a), port: *p })
            }
            (Key::Dnat(hp), [Value::Ip(a), Value::Port(p)]) if Family::of(a) == hp.fam => {
                Data::Target(Target { ip: *a, port: *p })
            }
            _ => return None,
        })
    }
}

/// One element: a key and, in a map, its data.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub struct Elem {
    pub key: Key,
    pub data: Option<Data>,
}

impl Elem {
    pub fn dnat(hp: HostPort, t: Target) -> Elem {
        Elem { key: Key::Dnat(hp), data: Some(Data::Target(t)) }
    }

    pub fn owner(hp: HostPort, holder: Hash) -> Elem {
        Elem { key: Key::Owner(hp), data: Some(Data::Hash(holder)) }
    }

    pub fn claim(hp: HostPort, claimant: Hash, t: Target) -> Elem {
        Elem { key: Key::Claim(hp, claimant), data: Some(Data::Target(t)) }
    }

    pub fn attachment(h: Hash, fingerprint: Hash) -> Elem {
        Elem { key: Key::Attachment(h), data: Some(Data::Hash(fingerprint)) }
    }

    pub fn netns(h: Hash, id: NsId) -> Elem {
        Elem { key: Key::Netns(h), data: Some(Data::Netns(id)) }
    }

    pub fn masq(m: Masq) -> Elem {
        Elem { key: Key::Masq(m), data: None }
    }

    pub fn set(&self) -> Set {
        self.key.set()
    }

    /// The hash of an `owner` or `attachments` element.
    pub fn hash_data(&self) -> Option<Hash> {
        match self.data {
            Some(Data::Hash(h)) => Some(h),
            _ => None,
        }
    }

    /// The data in nft notation ("-" for none).
    pub fn data_text(&self) -> String {
        match &self.data {
            None => "-".into(),
            Some(d) => d.values(&self.key).iter().map(Value::to_string).collect::<Vec<_>>().join(" . "),
        }
    }

    /// The element's bytes in its set, with `comment`.
    pub fn encode(&self, comment: Option<&str>) -> NftElem {
        let (key_types, data_types) = self.set().types();
        let mut out = NftElem::new(bytes(key_types, &self.key.values()));
        if let (Some(d), Some(t)) = (&self.data, data_types) {
            out.data = Some(NftData::Value(bytes(t, &d.values(&self.key))));
        }
        out.comment = comment.filter(|c| !c.is_empty()).map(str::to_string);
        out
    }

    /// The key's bytes alone: what a deletion or a look-up names.
    pub fn encode_key(key: &Key) -> NftElem {
        NftElem::new(bytes(key.set().types().0, &key.values()))
    }

    /// An element of `set` as ours; None when it does not have the set's layout (then it is
    /// not an element this plugin wrote, and it is left alone).
    pub fn decode(set: Set, e: &NftElem) -> Option<Elem> {
        if e.key_end.is_some() || e.interval_end {
            return None;
        }
        let (key_types, data_types) = set.types();
        let key = Key::from_values(set, &values(key_types, &e.key)?)?;
        let data = match (&e.data, data_types) {
            (None, None) => None,
            (Some(NftData::Value(b)), Some(t)) => Some(Data::from_values(&key, &values(t, b)?)?),
            _ => return None,
        };
        Some(Elem { key, data })
    }
}

/// `set { key }` (with `: data` for a map element), for messages.
impl fmt::Display for Elem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.data {
            None => write!(f, "{} {{ {} }}", self.set(), self.key),
            Some(_) => write!(f, "{} {{ {} : {} }}", self.set(), self.key, self.data_text()),
        }
    }
}

/// One component of a key or datum.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Value {
    Ip(IpAddr),
    Proto(Proto),
    Port(u16),
}

impl Value {
    fn hash(h: Hash) -> Value {
        Value::Ip(IpAddr::V6(Ipv6Addr::from(h.0)))
    }

    fn as_hash(&self) -> Option<Hash> {
        match self {
            Value::Ip(IpAddr::V6(a)) => Some(Hash(a.octets())),
            _ => None,
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Ip(a) => a.fmt(f),
            Value::Proto(p) => f.write_str(p.as_str()),
            Value::Port(p) => p.fmt(f),
        }
    }
}

/// The bytes of `vals` typed `types` (a concatenation when more than one).
fn bytes(types: &[NftType], vals: &[Value]) -> Vec<u8> {
    debug_assert_eq!(types.len(), vals.len(), "{types:?} {vals:?}");
    let mut out = Vec::with_capacity(16 * vals.len());
    for (v, t) in vals.iter().zip(types) {
        match (v, t) {
            (Value::Ip(IpAddr::V4(a)), NftType::Ipv4Addr) => out.extend_from_slice(&a.octets()),
            (Value::Ip(IpAddr::V4(a)), _) => out.extend_from_slice(&a.to_ipv6_mapped().octets()),
            (Value::Ip(IpAddr::V6(a)), _) => out.extend_from_slice(&a.octets()),
            (Value::Proto(p), _) => out.push(p.number()),
            (Value::Port(p), _) => out.extend_from_slice(&p.to_be_bytes()),
        }
        if vals.len() > 1 {
            // inside a concatenation every value is padded to 4 bytes (nft_set_concat)
            out.resize(out.len().next_multiple_of(4), 0);
        }
    }
    out
}

/// The values of `b` typed `types`; None when the bytes do not have that layout.
fn values(types: &[NftType], b: &[u8]) -> Option<Vec<Value>> {
    let lens: Vec<usize> = types.iter().map(|t| t.bytes() as usize).collect();
    let parts = match types {
        [_] => (b.len() == lens[0]).then(|| vec![b])?,
        _ => split_concat(b, &lens)?,
    };
    parts
        .iter()
        .zip(types)
        .map(|(p, t)| match t {
            NftType::Ipv4Addr => Some(Value::Ip(IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(*p).ok()?)))),
            NftType::Ipv6Addr => Some(Value::Ip(IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(*p).ok()?)))),
            NftType::InetProto => match p {
                [n] => Proto::from_number(*n).map(Value::Proto),
                _ => None,
            },
            NftType::InetService => Some(Value::Port(u16::from_be_bytes((*p).try_into().ok()?))),
            NftType::NfProto => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hp(fam: Family, ip: Option<&str>, proto: Proto, port: u16) -> HostPort {
        HostPort { fam, ip: ip.map(|s| s.parse().unwrap()), proto, port }
    }

    fn t(ip: &str, port: u16) -> Target {
        Target { ip: ip.parse().unwrap(), port }
    }

    fn masq(src: &str, ctr: &str, proto: Proto, port: u16) -> Elem {
        Elem::masq(Masq::new(src.parse().unwrap(), ctr.parse().unwrap(), proto, port))
    }

    const H: Hash = Hash([0x12, 0x34, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);

    #[test]
    fn every_kind_of_element_round_trips() {
        use Family::{V4, V6};
        let cases = [
            Elem::dnat(hp(V4, None, Proto::Tcp, 8080), t("10.0.0.5", 80)),
            Elem::dnat(hp(V4, Some("192.0.2.1"), Proto::Udp, 53), t("10.0.0.5", 5353)),
            Elem::dnat(hp(V6, None, Proto::Sctp, 9), t("fd00::5", 9)),
            Elem::dnat(hp(V6, Some("fd00::1"), Proto::Tcp, 443), t("fd00::5", 8443)),
            Elem::owner(hp(V4, None, Proto::Tcp, 8080), H),
            Elem::owner(hp(V6, None, Proto::Udp, 53), H),
            Elem::claim(hp(V4, Some("192.0.2.1"), Proto::Tcp, 80), H, t("10.0.0.5", 80)),
            Elem::claim(hp(V6, None, Proto::Tcp, 80), H, t("fd00::5", 80)),
            Elem::owner(hp(V6, Some("fd00::1"), Proto::Tcp, 443), H),
            Elem::claim(hp(V6, Some("fd00::1"), Proto::Tcp, 443), H, t("fd00::5", 8443)),
            masq("10.0.0.0/24", "10.0.0.5", Proto::Tcp, 80),
            masq("127.0.0.1/32", "10.0.0.5", Proto::Udp, 53),
            masq("0.0.0.0/0", "10.0.0.5", Proto::Tcp, 80),
            masq("fd00::/64", "fd00::5", Proto::Tcp, 80),
            masq("::/0", "fd00::5", Proto::Tcp, 80),
            Elem::netns(H, NsId { ino: 4026532001, cookie: 7 }),
            Elem::attachment(H, Hash([9; 16])),
        ];
        for e in &cases {
            let n = e.encode(Some("n,c,eth0"));
            assert_eq!(Elem::decode(e.set(), &n), Some(*e), "{e} does not decode: {n:?}");
            assert_eq!(n.comment.as_deref(), Some("n,c,eth0"));
            assert_eq!(Elem::encode_key(&e.key).key, n.key);
            assert_eq!(Set::parse(&e.set().name()), Some(e.set()));
        }
        // nft's byte layout: protocol and port padded to 4 bytes, IPv4 in 4 bytes
        assert_eq!(cases[10].encode(None).key, [10, 0, 0, 0, 10, 0, 0, 5, 6, 0, 0, 0, 0, 80, 0, 0]);
        assert_eq!(cases[12].encode(None).key, [10, 0, 0, 5, 6, 0, 0, 0, 0, 80, 0, 0], "/0: no source");
        assert_eq!(cases[4].encode(None).key.len(), 16 + 4 + 4);
        assert_eq!(
            cases[15].encode(None).data,
            Some(NftData::Value(NsId { ino: 4026532001, cookie: 7 }.to_v6().octets().to_vec()))
        );
        // what does not fit the set's layout is not ours
        assert!(Elem::decode(Set::Hp(V4), &NftElem::new(vec![6, 0, 0, 0])).is_none());
        assert!(Elem::decode(Set::Net(V4, 24), &cases[0].encode(None)).is_none());
        let m24 = masq("10.0.1.0/24", "10.0.1.5", Proto::Tcp, 80);
        assert!(Elem::decode(Set::Net(V4, 16), &m24.encode(None)).is_none(), "host bits set for /16");
        assert!(Elem::decode(Set::Hp(V6), &cases[0].encode(None)).is_none());
        // interval elements (another program's, in a set of the same name) are not ours
        let mut ranged = cases[0].encode(None);
        ranged.key_end = Some(ranged.key.clone());
        assert!(Elem::decode(Set::Hp(V4), &ranged).is_none());
        let mut end = cases[0].encode(None);
        end.interval_end = true;
        assert!(Elem::decode(Set::Hp(V4), &end).is_none());
        let mut odd = cases[0].encode(None);
        odd.key[0] = 1; // icmp
        assert!(Elem::decode(Set::Hp(V4), &odd).is_none());
        let mut wrong_family = cases[0].encode(None);
        wrong_family.data = Some(NftData::Value(
            cases[2]
                .encode(None)
                .data
                .map(|d| match d {
                    NftData::Value(v) => v,
                    NftData::Verdict(_) => unreachable!(),
                })
                .unwrap(),
        ));
        assert!(Elem::decode(Set::Hp(V4), &wrong_family).is_none(), "an IPv6 target in hp4");
    }

    #[test]
    fn names_and_notation() {
        for bad in ["net4_33", "net6_129", "net4_024", "net5_1", "net4_", "masq4", "net4_x", "gates"] {
            assert_eq!(Set::parse(bad), None, "{bad}");
        }
        let port = hp(Family::V4, None, Proto::Udp, 53);
        assert_eq!(
            Elem::claim(port, H, t("10.0.0.5", 5353)).to_string(),
            "claims { ::ffff:0.0.0.0 . udp . 53 . 1234::1 : ::ffff:10.0.0.5 . 5353 }"
        );
        assert_eq!(Elem::dnat(port, t("10.0.0.5", 5353)).to_string(), "hp4 { udp . 53 : 10.0.0.5 . 5353 }");
        assert_eq!(
            masq("10.0.0.5/24", "10.0.0.5", Proto::Tcp, 80).to_string(),
            "net4_24 { 10.0.0.0 . 10.0.0.5 . tcp . 80 }"
        );
        assert_eq!(
            masq("0.0.0.0/0", "10.0.0.5", Proto::Tcp, 80).to_string(),
            "net4_0 { 10.0.0.5 . tcp . 80 }"
        );
        assert_eq!(port.describe(), "udp/53 (all IPv4 addresses)");
    }

    #[test]
    fn owners() {
        let o = Owner::new("kubenet", "abc-123", "eth0");
        assert_eq!(o.tag, "kubenet,abc-123,eth0");
        assert_eq!(container_of(&o.tag), Some("abc-123"));
        let long = Owner::new(&"n".repeat(200), &"c".repeat(300), "e\u{e9}th,x");
        assert!(long.tag.len() <= 128, "{}", long.tag);
        assert_eq!(container_of(&long.tag), Some(long.container.as_str()));
        assert_ne!(Owner::new("n", "a", "eth0").hash, Owner::new("n", "a", "eth1").hash);
        assert_ne!(shared_hash("a"), shared_hash("b"));
        assert_eq!(describe_holder(Some("n,c1,eth0")), "network \"n\", container \"c1\", interface \"eth0\"");
        assert_eq!(container_of("n,c1"), None);
        // a comment that is not an owner tag (another program's element) is quoted whole
        assert_eq!(describe_holder(Some("kube-proxy")), "an element with comment \"kube-proxy\"");
        assert_eq!(describe_holder(Some("n,c1")), "an element with comment \"n,c1\"");
        assert!(NsId { ino: 1, cookie: 2 }.differs(&NsId { ino: 1, cookie: 3 }));
        assert!(!NsId { ino: 1, cookie: 0 }.differs(&NsId { ino: 1, cookie: 3 }));
    }
}
