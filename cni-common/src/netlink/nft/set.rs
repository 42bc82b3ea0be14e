//! Sets, maps and their elements: declaring a set with `type` ([`NftSet`]), element messages
//! (concatenated keys and data, interval ends, comments) and reading elements back
//! (`NfTables::set_elements`, in `set_read`).
//!
//! Keys and data are raw bytes in nft's layout: a concatenation pads every component to a
//! multiple of 4 bytes ([`concat`]); a lone key is not padded (an `nf_proto` key is 1 byte).
//! Integers are big-endian (`inet_service`, addresses), `inet_proto`/`nf_proto` are 1 byte.
//! Intervals of a concatenated set (pipapo) are one element with `key_end`; intervals of a
//! plain interval set (rbtree) are a start element and an end element flagged
//! `interval_end` holding the first value past the interval.

use super::consts::*;
use super::expr::{value_attr, value_of, verdict_attr, verdict_of, Verdict};
use super::family::NftFamily;
use super::wire::{comment_of, comment_udata, nft_msg};
use crate::netlink::nfnl::{
    attrs, cstr, decode_be32, encode_be32, message, put_attr, put_nested, string_of, NLA_F_NESTED,
};

/// Element bytes per `NFT_MSG_NEWSETELEM`/`DELSETELEM` message: the element list is one
/// attribute, whose length field has 16 bits.
const ELEMENTS_PER_MESSAGE_BYTES: usize = 60_000;

/// The data of a map element.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NftData {
    Value(Vec<u8>),
    Verdict(Verdict),
}

/// One set or map element.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NftElem {
    pub key: Vec<u8>,
    /// The interval end of an element of a concatenated interval set (inclusive).
    pub key_end: Option<Vec<u8>>,
    pub data: Option<NftData>,
    /// `NFT_SET_ELEM_INTERVAL_END`: the end marker of an interval of a plain interval set.
    pub interval_end: bool,
    pub comment: Option<String>,
}

impl NftElem {
    /// An element with key `key`.
    pub fn new(key: Vec<u8>) -> NftElem {
        NftElem { key, ..Default::default() }
    }

    pub fn key_end(mut self, end: Vec<u8>) -> NftElem {
        self.key_end = Some(end);
        self
    }

    pub fn data(mut self, data: NftData) -> NftElem {
        self.data = Some(data);
        self
    }

    pub fn comment(mut self, comment: impl Into<String>) -> NftElem {
        self.comment = Some(comment.into());
        self
    }

    /// The element without data and comment: what a deletion names.
    pub fn key_only(&self) -> NftElem {
        NftElem {
            key: self.key.clone(),
            key_end: self.key_end.clone(),
            interval_end: self.interval_end,
            ..Default::default()
        }
    }
}

/// A concatenated key or datum: every component padded with zeros to a multiple of 4 bytes.
pub fn concat(parts: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in parts {
        out.extend_from_slice(p);
        out.resize(out.len().next_multiple_of(4), 0);
    }
    out
}

/// Split a concatenation into components of the given lengths (each padded to 4 bytes in
/// `bytes`); None when the total length does not match.
pub fn split_concat<'a>(bytes: &'a [u8], lens: &[usize]) -> Option<Vec<&'a [u8]>> {
    let mut out = Vec::with_capacity(lens.len());
    let mut off = 0;
    for &len in lens {
        out.push(bytes.get(off..off + len)?);
        off += len.next_multiple_of(4);
    }
    (off == bytes.len()).then_some(out)
}

/// nft's data types (`enum datatypes` of nft 1.0.6), as far as our sets use them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NftType {
    NfProto,
    Ipv4Addr,
    Ipv6Addr,
    InetProto,
    InetService,
}

impl NftType {
    fn id(self) -> u32 {
        match self {
            NftType::NfProto => 2,
            NftType::Ipv4Addr => 7,
            NftType::Ipv6Addr => 8,
            NftType::InetProto => 12,
            NftType::InetService => 13,
        }
    }

    /// Bytes of one value (before the padding of a concatenation).
    pub fn bytes(self) -> u32 {
        match self {
            NftType::NfProto | NftType::InetProto => 1,
            NftType::Ipv4Addr => 4,
            NftType::Ipv6Addr => 16,
            NftType::InetService => 2,
        }
    }

    /// The byte order nft records for a set of this one type (`enum byteorder`: 0 invalid,
    /// 2 big endian).
    fn byteorder(self) -> u32 {
        match self {
            NftType::NfProto | NftType::InetProto => 0,
            NftType::Ipv4Addr | NftType::Ipv6Addr | NftType::InetService => 2,
        }
    }
}

/// The type id nft gives a (possibly concatenated) type: 6 bits per component.
fn type_id(types: &[NftType]) -> u32 {
    types.iter().fold(0, |acc, t| (acc << 6) | t.id())
}

impl NftType {
    const ALL: [NftType; 5] =
        [NftType::NfProto, NftType::Ipv4Addr, NftType::Ipv6Addr, NftType::InetProto, NftType::InetService];

    /// nft's name of the type.
    pub fn name(self) -> &'static str {
        match self {
            NftType::NfProto => "nf_proto",
            NftType::Ipv4Addr => "ipv4_addr",
            NftType::Ipv6Addr => "ipv6_addr",
            NftType::InetProto => "inet_proto",
            NftType::InetService => "inet_service",
        }
    }
}

/// What decides which elements a set takes, as the kernel lists it (`NFT_MSG_NEWSET`): flags,
/// key type and length, and a map's data type and length. Two sets of one name but another
/// shape are different sets to whoever reads or writes their elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetShape {
    /// `NFTA_SET_FLAGS` (`NFT_SET_MAP`, `NFT_SET_INTERVAL`, `NFT_SET_TIMEOUT`, …).
    pub flags: u32,
    /// nft's type id of the key (6 bits per component of a concatenation) and its length.
    pub key_type: u32,
    pub key_len: u32,
    /// A map's data: its type id and length (a verdict map: `NFT_DATA_VERDICT` and 0, whatever
    /// length the kernel keeps for a verdict).
    pub data: Option<(u32, u32)>,
}

/// The flags the kernel keeps for a set (and lists): `NFT_SET_*` as nft names them.
const SET_FLAG_NAMES: [(u32, &str); 8] = [
    (0x1, "anonymous"),
    (0x2, "constant"),
    (NFT_SET_INTERVAL, "interval"),
    (0x10, "timeout"),
    (0x20, "dynamic"),
    (0x40, "object"),
    (0x100, "expr"),
    (NFT_SET_CONCAT, "concat"),
];

/// A type id as nft would write it (`ipv6_addr . inet_proto . inet_service`), with the length
/// when it is not what the named types take.
fn type_text(id: u32, len: u32) -> String {
    let mut parts = Vec::new();
    let mut rest = id;
    while rest != 0 {
        parts.push(rest & 0x3f);
        rest >>= 6;
    }
    parts.reverse();
    let known: Option<Vec<NftType>> =
        parts.iter().map(|p| NftType::ALL.into_iter().find(|t| t.id() == *p)).collect();
    match known {
        Some(types) if !types.is_empty() => {
            let names: Vec<&str> = types.iter().map(|t| t.name()).collect();
            let text = names.join(" . ");
            if types_len(&types) == len {
                text
            } else {
                format!("{text} ({len} bytes)")
            }
        }
        _ => format!("type {id:#x} ({len} bytes)"),
    }
}

impl std::fmt::Display for SetShape {
    /// `map ipv6_addr . inet_proto . inet_service : ipv6_addr`, `set ipv4_addr flags interval`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = if self.flags & NFT_SET_MAP != 0 { "map" } else { "set" };
        write!(f, "{kind} {}", type_text(self.key_type, self.key_len))?;
        match self.data {
            Some((NFT_DATA_VERDICT, _)) => write!(f, " : verdict")?,
            Some((t, len)) => write!(f, " : {}", type_text(t, len))?,
            None => {}
        }
        let mut flags: Vec<String> =
            SET_FLAG_NAMES.iter().filter(|(b, _)| self.flags & b != 0).map(|(_, n)| n.to_string()).collect();
        let named = SET_FLAG_NAMES.iter().fold(NFT_SET_MAP, |acc, (b, _)| acc | b);
        if self.flags & !named != 0 {
            flags.push(format!("{:#x}", self.flags & !named));
        }
        if !flags.is_empty() {
            write!(f, " flags {}", flags.join(","))?;
        }
        Ok(())
    }
}

/// A set of a table as the kernel lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedSet {
    pub name: String,
    pub shape: SetShape,
}

/// The length of a value of `types`: a concatenation pads every component to 4 bytes.
fn types_len(types: &[NftType]) -> u32 {
    match types {
        [one] => one.bytes(),
        _ => types.iter().map(|t| t.bytes().next_multiple_of(4)).sum(),
    }
}

/// The data of a map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NftSetData {
    Values(Vec<NftType>),
    Verdict,
}

/// A set (`type <key>`) or map (`type <key> : <data>`) declared with `type`, as
/// `nft add set|map` writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftSet {
    pub name: String,
    /// The key's types; more than one make a concatenation.
    pub key: Vec<NftType>,
    pub data: Option<NftSetData>,
    /// `flags interval`.
    pub interval: bool,
    /// The transaction-local id rules of the same transaction use to find the set while it is
    /// being created (`NFTA_SET_ID`, `NFTA_LOOKUP_SET_ID`): unique within one transaction.
    pub id: u32,
}

impl NftSet {
    /// The shape the kernel lists for this set once it is made.
    pub fn shape(&self) -> SetShape {
        SetShape {
            flags: set_flags(self),
            key_type: type_id(&self.key),
            key_len: types_len(&self.key),
            data: self.data.as_ref().map(|d| match d {
                NftSetData::Values(t) => (type_id(t), types_len(t)),
                NftSetData::Verdict => (NFT_DATA_VERDICT, 0),
            }),
        }
    }
}

/// `NFTA_SET_FLAGS` of a set: a map, an interval set (with the concatenation flag when its key
/// is one).
fn set_flags(set: &NftSet) -> u32 {
    let mut flags = 0;
    if set.data.is_some() {
        flags |= NFT_SET_MAP;
    }
    if set.interval {
        flags |= NFT_SET_INTERVAL;
        if set.key.len() > 1 {
            flags |= NFT_SET_CONCAT;
        }
    }
    flags
}

/// A set of `table` in an `NFT_MSG_NEWSET` message.
pub(super) fn listed_set(payload: &[u8], table: &str) -> Option<ListedSet> {
    let (mut t, mut name) = (None, None);
    let mut shape = SetShape { flags: 0, key_type: 0, key_len: 0, data: None };
    let (mut data_type, mut data_len) = (None, None);
    for (k, value) in attrs(payload.get(4..)?) {
        match k {
            NFTA_SET_TABLE => t = Some(string_of(value)),
            NFTA_SET_NAME => name = Some(string_of(value)),
            NFTA_SET_FLAGS => shape.flags = decode_be32(value)?,
            NFTA_SET_KEY_TYPE => shape.key_type = decode_be32(value)?,
            NFTA_SET_KEY_LEN => shape.key_len = decode_be32(value)?,
            NFTA_SET_DATA_TYPE => data_type = decode_be32(value),
            NFTA_SET_DATA_LEN => data_len = decode_be32(value),
            _ => {}
        }
    }
    shape.data = match data_type {
        Some(NFT_DATA_VERDICT) => Some((NFT_DATA_VERDICT, 0)),
        Some(d) => Some((d, data_len.unwrap_or(0))),
        None => None,
    };
    (t.as_deref() == Some(table)).then_some(ListedSet { name: name?, shape })
}

/// nft's userdata of a set: the byte orders of key and data, a "typeof" record for a
/// concatenated key or data declared with `type` (a concat expression without members), and
/// whether map data are intervals (never here). `nft list` reads them back to print values.
fn set_userdata(set: &NftSet) -> Vec<u8> {
    /// `NFTNL_UDATA_SET_TYPEOF_EXPR` = nft's `EXPR_CONCAT`, then an empty
    /// `NFTNL_UDATA_SET_TYPEOF_DATA`.
    fn typeof_concat(u: &mut Vec<u8>, kind: u8) {
        u.extend_from_slice(&[kind, 8, 0, 4]);
        u.extend_from_slice(&NFT_EXPR_CONCAT.to_ne_bytes());
        u.extend_from_slice(&[1, 0]);
    }
    fn put_u32(u: &mut Vec<u8>, kind: u8, v: u32) {
        u.extend_from_slice(&[kind, 4]);
        u.extend_from_slice(&v.to_ne_bytes());
    }
    let order = |t: &[NftType]| if let [one] = t { one.byteorder() } else { 0 };
    let mut u = Vec::new();
    put_u32(&mut u, UDATA_SET_KEYBYTEORDER, order(&set.key));
    if let Some(d) = &set.data {
        put_u32(&mut u, UDATA_SET_DATABYTEORDER, if let NftSetData::Values(t) = d { order(t) } else { 0 });
    }
    if set.key.len() > 1 {
        typeof_concat(&mut u, UDATA_SET_KEY_TYPEOF);
    }
    if matches!(&set.data, Some(NftSetData::Values(t)) if t.len() > 1) {
        typeof_concat(&mut u, UDATA_SET_DATA_TYPEOF);
    }
    if set.data.is_some() {
        put_u32(&mut u, UDATA_SET_DATA_INTERVAL, 0);
    }
    u
}

/// The attributes of `NFT_MSG_NEWSET` for `set` in `table`.
pub(super) fn set_attrs(table: &str, set: &NftSet) -> Vec<(u16, Vec<u8>)> {
    let be = |v: u32| encode_be32(v).to_vec();
    let concat_key = set.key.len() > 1;
    let mut attrs = vec![
        (NFTA_SET_TABLE, cstr(table)),
        (NFTA_SET_NAME, cstr(&set.name)),
        (NFTA_SET_FLAGS, be(set_flags(set))),
        (NFTA_SET_KEY_TYPE, be(type_id(&set.key))),
        (NFTA_SET_KEY_LEN, be(types_len(&set.key))),
    ];
    match &set.data {
        Some(NftSetData::Values(t)) => {
            attrs.push((NFTA_SET_DATA_TYPE, be(type_id(t))));
            attrs.push((NFTA_SET_DATA_LEN, be(types_len(t))));
        }
        Some(NftSetData::Verdict) => {
            attrs.push((NFTA_SET_DATA_TYPE, be(NFT_DATA_VERDICT)));
            attrs.push((NFTA_SET_DATA_LEN, be(0)));
        }
        None => {}
    }
    attrs.push((NFTA_SET_ID, be(set.id)));
    if set.interval && concat_key {
        // the field lengths the pipapo backend of a concatenated interval set needs
        let mut fields = Vec::new();
        for t in &set.key {
            let mut f = Vec::new();
            put_attr(&mut f, NFTA_SET_FIELD_LEN, &encode_be32(t.bytes()));
            put_nested(&mut fields, NFTA_LIST_ELEM, &f);
        }
        let mut desc = Vec::new();
        put_nested(&mut desc, NFTA_SET_DESC_CONCAT, &fields);
        attrs.push((NFTA_SET_DESC | NLA_F_NESTED, desc));
    }
    attrs.push((NFTA_SET_USERDATA, set_userdata(set)));
    attrs
}

fn data_attr(d: &NftData) -> Vec<u8> {
    match d {
        NftData::Value(b) => value_attr(b),
        NftData::Verdict(v) => verdict_attr(v),
    }
}

/// The attributes of one element (libnftnl's order: flags, key, key end, data, userdata).
fn elem_attrs(e: &NftElem, full: bool) -> Vec<u8> {
    let mut v = Vec::new();
    if e.interval_end {
        put_attr(&mut v, NFTA_SET_ELEM_FLAGS, &encode_be32(NFT_SET_ELEM_INTERVAL_END));
    }
    put_nested(&mut v, NFTA_SET_ELEM_KEY, &value_attr(&e.key));
    if let Some(end) = &e.key_end {
        put_nested(&mut v, NFTA_SET_ELEM_KEY_END, &value_attr(end));
    }
    if full {
        if let Some(d) = &e.data {
            put_nested(&mut v, NFTA_SET_ELEM_DATA, &data_attr(d));
        }
        if let Some(c) = &e.comment {
            put_attr(&mut v, NFTA_SET_ELEM_USERDATA, &comment_udata(c));
        }
    }
    v
}

/// The element messages of one set operation: the elements numbered 1, 2, … as libnftnl does,
/// split into several messages when the list would not fit one attribute. `full`: with data
/// and comments (additions), or keys only (deletions).
pub(super) fn element_messages(
    msg: u16,
    flags: u16,
    family: NftFamily,
    table: &str,
    set: &str,
    elems: &[NftElem],
    full: bool,
) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut list = Vec::new();
    let mut n = 0u16;
    let flush = |list: &mut Vec<u8>, out: &mut Vec<Vec<u8>>| {
        let attrs = [
            (NFTA_SET_ELEM_LIST_TABLE, cstr(table)),
            (NFTA_SET_ELEM_LIST_SET, cstr(set)),
            (NFTA_SET_ELEM_LIST_ELEMENTS | NLA_F_NESTED, std::mem::take(list)),
        ];
        out.push(message(nft_msg(msg), flags, family.proto(), 0, &attrs));
    };
    for e in elems {
        let blob = elem_attrs(e, full);
        if !list.is_empty() && list.len() + blob.len() + 4 > ELEMENTS_PER_MESSAGE_BYTES {
            flush(&mut list, &mut out);
            n = 0;
        }
        n += 1;
        put_nested(&mut list, n, &blob);
    }
    if !list.is_empty() {
        flush(&mut list, &mut out);
    }
    out
}

/// A request for one element of `set` by key (`nft get element`), without `NLM_F_ACK`: the
/// kernel answers with the element, or with `ENOENT` when the key (or the set) is missing.
pub(super) fn get_element_request(family: NftFamily, table: &str, set: &str, key: &[u8]) -> Vec<u8> {
    let mut elem = Vec::new();
    put_nested(&mut elem, NFTA_SET_ELEM_KEY, &value_attr(key));
    let mut list = Vec::new();
    put_nested(&mut list, 1, &elem);
    let attrs = [
        (NFTA_SET_ELEM_LIST_TABLE, cstr(table)),
        (NFTA_SET_ELEM_LIST_SET, cstr(set)),
        (NFTA_SET_ELEM_LIST_ELEMENTS | NLA_F_NESTED, list),
    ];
    message(nft_msg(NFT_MSG_GETSETELEM), netlink_packet_core::NLM_F_REQUEST, family.proto(), 0, &attrs)
}

fn data_of(v: &[u8]) -> Option<NftData> {
    if let Some(b) = value_of(v) {
        return Some(NftData::Value(b));
    }
    verdict_of(v).map(NftData::Verdict)
}

/// One element of an `NFT_MSG_NEWSETELEM` dump.
pub(super) fn parse_elem(buf: &[u8]) -> Option<NftElem> {
    let mut e = NftElem::default();
    let mut has_key = false;
    for (k, v) in attrs(buf) {
        match k {
            NFTA_SET_ELEM_KEY => {
                e.key = value_of(v)?;
                has_key = true;
            }
            NFTA_SET_ELEM_KEY_END => e.key_end = value_of(v),
            NFTA_SET_ELEM_DATA => e.data = data_of(v),
            NFTA_SET_ELEM_FLAGS => e.interval_end = decode_be32(v)? & NFT_SET_ELEM_INTERVAL_END != 0,
            NFTA_SET_ELEM_USERDATA => e.comment = comment_of(v),
            _ => {}
        }
    }
    has_key.then_some(e)
}

/// The elements of one `NFT_MSG_NEWSETELEM` message (after the netlink header), if it is of
/// `table`/`set`.
pub(super) fn parse_setelem_message(payload: &[u8], table: &str, set: &str) -> Vec<NftElem> {
    let Some(body) = payload.get(4..) else { return Vec::new() };
    let (mut t, mut s, mut out) = (None, None, Vec::new());
    for (k, v) in attrs(body) {
        match k {
            NFTA_SET_ELEM_LIST_TABLE => t = Some(string_of(v)),
            NFTA_SET_ELEM_LIST_SET => s = Some(string_of(v)),
            NFTA_SET_ELEM_LIST_ELEMENTS => out.extend(attrs(v).filter_map(|(_, e)| parse_elem(e))),
            _ => {}
        }
    }
    if t.as_deref() == Some(table) && s.as_deref() == Some(set) {
        out
    } else {
        Vec::new()
    }
}
