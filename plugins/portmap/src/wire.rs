//! The kernel side of the element model: our elements (nft notation strings, see
//! [`crate::ruleset::Elem`]) to and from nf_tables netlink elements, the netlink transactions
//! of the fast paths and of element-only plans, and reading the table over netlink.
//!
//! Keys and data are nft's byte layout for each set's type (concatenation components padded to
//! 4 bytes; the interval component of `masq4`/`masq6` as start and end of one element), so the
//! elements we write are the ones `nft add element` writes and `nft list` shows them (with
//! their comments) exactly the same way.

use crate::config::Conf;
use crate::ruleset::{self, Elem, Listed, Listing, Owner, ELEMENT_SETS, TABLE};
use cni_common::netlink::nft::{
    concat, split_concat, BaseChain, CmpOp, NfTables, NftData, NftDelete, NftElem, NftFamily, NftOp, NftSet,
    NftSetData, NftType, RuleExpr, Verdict, CT_STATUS, CT_STATUS_DST_NAT, HOOK_POSTROUTING, HOOK_PREROUTING,
    META_L4PROTO, META_NFPROTO, PAYLOAD_NETWORK_HEADER, PAYLOAD_TRANSPORT_HEADER, POLICY_ACCEPT, REG32_00,
    REG_1, REG_2, REG_3, REG_VERDICT,
};
use cni_common::{CniError, Result};
use ipnet::IpNet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

const FAMILY: NftFamily = NftFamily::Inet;
/// How often a read is repeated when the ruleset changed while it was being read.
const READ_ATTEMPTS: usize = 20;

/// One component of a key or datum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    V4,
    V6,
    Proto,
    Port,
    /// The interval component (`prefix`, a plain address, or `a-b`) of an interval set.
    Range4,
    Range6,
}

impl Field {
    fn len(self) -> usize {
        match self {
            Field::V4 | Field::Range4 => 4,
            Field::V6 | Field::Range6 => 16,
            Field::Proto => 1,
            Field::Port => 2,
        }
    }
}

use Field::*;

/// Key and data layout of each of our sets (data empty for plain sets).
fn schema(set: &str) -> Option<(&'static [Field], &'static [Field])> {
    Some(match set {
        "hp4" => (&[Proto, Port], &[V4, Port]),
        "hip4" => (&[V4, Proto, Port], &[V4, Port]),
        "hp6" => (&[Proto, Port], &[V6, Port]),
        "hip6" => (&[V6, Proto, Port], &[V6, Port]),
        "owner" => (&[V6, Proto, Port], &[V6]),
        "claims" => (&[V6, Proto, Port, V6], &[V6, Port]),
        "masq4" => (&[Range4, V4, Proto, Port], &[]),
        "masq6" => (&[Range6, V6, Proto, Port], &[]),
        _ => return None,
    })
}

fn proto_number(s: &str) -> Option<u8> {
    match s {
        "tcp" => Some(6),
        "udp" => Some(17),
        "sctp" => Some(132),
        n => n.parse().ok(),
    }
}

fn proto_name(n: u8) -> String {
    match n {
        6 => "tcp".into(),
        17 => "udp".into(),
        132 => "sctp".into(),
        n => n.to_string(),
    }
}

fn octets(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// (start, end) bytes of one component.
fn encode_field(f: Field, text: &str) -> Option<(Vec<u8>, Vec<u8>)> {
    let one = |v: Vec<u8>| Some((v.clone(), v));
    match f {
        V4 => one(text.parse::<Ipv4Addr>().ok()?.octets().to_vec()),
        V6 => one(text.parse::<Ipv6Addr>().ok()?.octets().to_vec()),
        Proto => one(vec![proto_number(text)?]),
        Port => one(text.parse::<u16>().ok()?.to_be_bytes().to_vec()),
        Range4 | Range6 => {
            let (start, end) = if let Some((a, b)) = text.split_once('-') {
                (a.parse::<IpAddr>().ok()?, b.parse::<IpAddr>().ok()?)
            } else if text.contains('/') {
                let net: IpNet = text.parse().ok()?;
                (net.network(), net.broadcast())
            } else {
                let a: IpAddr = text.parse().ok()?;
                (a, a)
            };
            let (s, e) = (octets(start), octets(end));
            (s.len() == f.len() && e.len() == f.len()).then_some((s, e))
        }
    }
}

/// Encode `a . b . c` with `fields`: the concatenation of the starts and, when a range
/// component is present, of the ends.
fn encode_concat(fields: &[Field], text: &str) -> Option<(Vec<u8>, Option<Vec<u8>>)> {
    let parts: Vec<&str> = text.split(" . ").collect();
    if parts.len() != fields.len() {
        return None;
    }
    let mut starts = Vec::new();
    let mut ends = Vec::new();
    for (f, p) in fields.iter().zip(&parts) {
        let (s, e) = encode_field(*f, p)?;
        starts.push(s);
        ends.push(e);
    }
    let start = concat(&starts.iter().map(Vec::as_slice).collect::<Vec<_>>());
    let ranged = fields.iter().any(|f| matches!(f, Range4 | Range6));
    let end = ranged.then(|| concat(&ends.iter().map(Vec::as_slice).collect::<Vec<_>>()));
    Some((start, end))
}

fn addr_of(b: &[u8]) -> Option<IpAddr> {
    Some(match b.len() {
        4 => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(b).ok()?)),
        16 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(b).ok()?)),
        _ => return None,
    })
}

/// A range as nft prints it: an address, a prefix, or `a-b`.
fn render_range(start: &[u8], end: &[u8]) -> Option<String> {
    let (s, e) = (addr_of(start)?, addr_of(end)?);
    if s == e {
        return Some(s.to_string());
    }
    let bits = start.len() * 8;
    let (sv, ev) = (to_u128(start), to_u128(end));
    let host = sv ^ ev;
    // a prefix: the differing bits are exactly the low ones, all 0 in start and 1 in end
    if (host & host.wrapping_add(1)) == 0 && sv & host == 0 && ev & host == host {
        let plen = bits - (128 - host.leading_zeros()) as usize;
        return Some(format!("{s}/{plen}"));
    }
    Some(format!("{s}-{e}"))
}

fn to_u128(b: &[u8]) -> u128 {
    b.iter().fold(0u128, |acc, x| (acc << 8) | u128::from(*x))
}

fn render_concat(fields: &[Field], key: &[u8], end: Option<&[u8]>) -> Option<String> {
    let lens: Vec<usize> = fields.iter().map(|f| f.len()).collect();
    let starts = split_concat(key, &lens)?;
    let ends = match end {
        Some(e) => split_concat(e, &lens)?,
        None => starts.clone(),
    };
    let mut out = Vec::with_capacity(fields.len());
    for ((f, s), e) in fields.iter().zip(&starts).zip(&ends) {
        out.push(match f {
            V4 | V6 => addr_of(s)?.to_string(),
            Proto => proto_name(s[0]),
            Port => u16::from_be_bytes([s[0], s[1]]).to_string(),
            Range4 | Range6 => render_range(s, e)?,
        });
    }
    Some(out.join(" . "))
}

/// Our element as a netlink element, with `comment`.
pub fn encode(e: &Elem, comment: Option<&str>) -> Result<NftElem> {
    let bad = || CniError::internal(format!("portmap: cannot encode element {} {{ {} }}", e.set, e.key));
    let (key_fields, data_fields) = schema(&e.set).ok_or_else(bad)?;
    let (key, key_end) = encode_concat(key_fields, &e.key).ok_or_else(bad)?;
    let mut out = NftElem { key, key_end, ..Default::default() };
    if let Some(d) = &e.data {
        let (data, _) = encode_concat(data_fields, d).ok_or_else(bad)?;
        out.data = Some(NftData::Value(data));
    }
    out.comment = comment.map(str::to_string);
    Ok(out)
}

/// A netlink element of `set` in our notation; None when it does not have the set's layout.
pub fn decode(set: &str, e: &NftElem) -> Option<Listed> {
    let (key_fields, data_fields) = schema(set)?;
    let key = render_concat(key_fields, &e.key, e.key_end.as_deref())?;
    let data = match (&e.data, data_fields.is_empty()) {
        (None, true) => None,
        (Some(NftData::Value(v)), false) => Some(render_concat(data_fields, v, None)?),
        _ => return None,
    };
    Some(Listed { set: set.to_string(), key, data, comment: e.comment.clone() })
}

/// The `gates` elements sending each family to its gate chain.
pub fn gates_elements(conf: &Conf) -> Vec<NftElem> {
    let (g4, g6) = ruleset::gate_names(conf);
    vec![
        NftElem::new(vec![2]).data(NftData::Verdict(Verdict::Jump(g4))),
        NftElem::new(vec![10]).data(NftData::Verdict(Verdict::Jump(g6))),
    ]
}

/// A `gates` element in our notation: ("ipv4", "jump gate4").
fn decode_gate(e: &NftElem) -> Option<(String, String)> {
    let fam = match e.key.as_slice() {
        [2] => "ipv4".to_string(),
        [10] => "ipv6".to_string(),
        [n] => n.to_string(),
        _ => return None,
    };
    let v = match &e.data {
        Some(NftData::Verdict(Verdict::Jump(c))) => format!("jump {c}"),
        Some(NftData::Verdict(Verdict::Goto(c))) => format!("goto {c}"),
        Some(NftData::Verdict(v)) => format!("{v:?}"),
        _ => return None,
    };
    Some((fam, v))
}

/// One element change, in transaction order.
pub enum Change<'a> {
    Add(&'a Elem, &'a str),
    Delete(&'a Elem),
}

/// The changes as netlink operations, consecutive changes of one kind on one set sharing an
/// operation (one message).
pub fn ops<'a>(changes: impl IntoIterator<Item = Change<'a>>) -> Result<Vec<NftOp>> {
    let mut out: Vec<NftOp> = Vec::new();
    for c in changes {
        let (adding, set, elem) = match c {
            Change::Add(e, tag) => (true, &e.set, encode(e, Some(tag))?),
            Change::Delete(e) => (false, &e.set, encode(e, None)?.key_only()),
        };
        match out.last_mut() {
            Some(NftOp::AddElements { set: s, elems, .. }) if adding && s == set => elems.push(elem),
            Some(NftOp::DeleteElements { set: s, elems, .. }) if !adding && s == set => elems.push(elem),
            _ => {
                let (table, set, elems) = (TABLE.to_string(), set.clone(), vec![elem]);
                out.push(if adding {
                    NftOp::AddElements { family: FAMILY, table, set, elems }
                } else {
                    NftOp::DeleteElements { family: FAMILY, table, set, elems }
                });
            }
        }
    }
    Ok(out)
}

/// The fast ADD transaction: the gate element (fails unless the table is set up for these
/// conditions), then this attachment's elements, all additions (see [`ruleset`]).
pub fn fast_add_ops(conf: &Conf, elems: &[Elem], owner: &Owner) -> Result<Vec<NftOp>> {
    let mut out = vec![NftOp::AddElements {
        family: FAMILY,
        table: TABLE.into(),
        set: "gates".into(),
        elems: gates_elements(conf),
    }];
    out.extend(ops(elems.iter().map(|e| Change::Add(e, &owner.tag)))?);
    Ok(out)
}

/// The fast DEL transaction: re-assert every owner claim (fails when one is not ours alone),
/// then delete every element (fails when one is missing).
pub fn guarded_delete_ops(elems: &[Elem], owner: &Owner) -> Result<Vec<NftOp>> {
    let claims = elems.iter().filter(|e| e.set == "owner").map(|e| Change::Add(e, &owner.tag));
    ops(claims.chain(elems.iter().map(Change::Delete)))
}

/// A plan's transaction: its deletions, then its additions.
pub fn plan_ops(p: &ruleset::Plan) -> Result<Vec<NftOp>> {
    let dels: Vec<Elem> = p.delete.iter().map(Listed::elem).collect();
    ops(dels.iter().map(Change::Delete).chain(p.add.iter().map(|(e, t)| Change::Add(e, t))))
}

// ---- the static part over netlink ----

/// `NF_INET_LOCAL_OUT`.
const HOOK_OUTPUT: u32 = 3;
const NFPROTO_IPV4: u32 = 2;
const NFPROTO_IPV6: u32 = 10;

/// Our sets and maps (`ruleset::setup_script` declares the same in nft syntax), with the
/// transaction-local ids the rules of the same transaction find them by.
fn sets() -> Vec<NftSet> {
    use NftType::*;
    let map = |id, name: &str, key: Vec<NftType>, data: Vec<NftType>| NftSet {
        name: name.into(),
        key,
        data: Some(NftSetData::Values(data)),
        interval: false,
        id,
    };
    let interval =
        |id, name: &str, key: Vec<NftType>| NftSet { name: name.into(), key, data: None, interval: true, id };
    vec![
        map(1, "hp4", vec![InetProto, InetService], vec![Ipv4Addr, InetService]),
        map(2, "hip4", vec![Ipv4Addr, InetProto, InetService], vec![Ipv4Addr, InetService]),
        map(3, "hp6", vec![InetProto, InetService], vec![Ipv6Addr, InetService]),
        map(4, "hip6", vec![Ipv6Addr, InetProto, InetService], vec![Ipv6Addr, InetService]),
        map(5, "owner", vec![Ipv6Addr, InetProto, InetService], vec![Ipv6Addr]),
        map(6, "claims", vec![Ipv6Addr, InetProto, InetService, Ipv6Addr], vec![Ipv6Addr, InetService]),
        interval(7, "masq4", vec![Ipv4Addr, Ipv4Addr, InetProto, InetService]),
        interval(8, "masq6", vec![Ipv6Addr, Ipv6Addr, InetProto, InetService]),
        NftSet {
            name: "gates".into(),
            key: vec![NfProto],
            data: Some(NftSetData::Verdict),
            interval: false,
            id: 9,
        },
    ]
}

fn lookup(sets: &[NftSet], name: &str, dreg: Option<u32>) -> RuleExpr {
    let id = sets.iter().find(|s| s.name == name).map(|s| s.id).expect("one of our sets");
    RuleExpr::Lookup { sreg: REG_1, dreg, set: name.into(), set_id: id }
}

fn payload(base: u32, offset: u32, len: u32, dreg: u32) -> RuleExpr {
    RuleExpr::Payload { base, offset, len, dreg }
}

/// `th dport => reg`
fn dport(dreg: u32) -> RuleExpr {
    payload(PAYLOAD_TRANSPORT_HEADER, 2, 2, dreg)
}

fn l4proto(dreg: u32) -> RuleExpr {
    RuleExpr::Meta { key: META_L4PROTO, dreg }
}

/// The static rules, chain by chain, in nft's encoding of the rules of
/// `ruleset::setup_script` (register allocation included), for empty conditions.
fn static_rules(sets: &[NftSet]) -> Vec<(&'static str, Vec<RuleExpr>)> {
    // fib daddr type local meta nfproto vmap @gates
    let gate = {
        let mut r = RuleExpr::daddr_type_local(CmpOp::Eq);
        r.push(RuleExpr::Meta { key: META_NFPROTO, dreg: REG_1 });
        r.push(lookup(sets, "gates", Some(REG_VERDICT)));
        r
    };
    let dnat4 = RuleExpr::Dnat { family: NFPROTO_IPV4, reg_addr: REG_1, reg_proto: REG32_00 + 1 };
    let dnat6 = RuleExpr::Dnat { family: NFPROTO_IPV6, reg_addr: REG_1, reg_proto: REG_2 };
    let with = |mut a: Vec<RuleExpr>, b: Vec<RuleExpr>| {
        a.extend(b);
        a
    };
    // ct status dnat
    let dnatted = vec![
        RuleExpr::Ct { key: CT_STATUS, dreg: REG_1 },
        RuleExpr::Bitwise {
            sreg: REG_1,
            dreg: REG_1,
            mask: CT_STATUS_DST_NAT.to_ne_bytes().to_vec(),
            xor: vec![0; 4],
        },
        RuleExpr::Cmp { sreg: REG_1, op: CmpOp::Neq, data: vec![0; 4] },
    ];
    let hton = |r: u32| RuleExpr::Hton { sreg: r, dreg: r, size: 2, len: 1 };
    let net = PAYLOAD_NETWORK_HEADER;
    vec![
        ("prerouting", gate.clone()),
        ("output", gate),
        // dnat ip to ip daddr . meta l4proto . th dport map @hip4
        (
            "hostports4",
            with(
                RuleExpr::nfproto(true),
                vec![
                    payload(net, 16, 4, REG_1),
                    l4proto(REG32_00 + 1),
                    dport(REG32_00 + 2),
                    lookup(sets, "hip4", Some(REG_1)),
                    dnat4.clone(),
                ],
            ),
        ),
        // dnat ip to meta l4proto . th dport map @hp4
        ("hostports4", vec![l4proto(REG_1), dport(REG32_00 + 1), lookup(sets, "hp4", Some(REG_1)), dnat4]),
        // dnat ip6 to ip6 daddr . meta l4proto . th dport map @hip6
        (
            "hostports6",
            with(
                RuleExpr::nfproto(false),
                vec![
                    payload(net, 24, 16, REG_1),
                    l4proto(REG_2),
                    dport(REG32_00 + 5),
                    lookup(sets, "hip6", Some(REG_1)),
                    dnat6.clone(),
                ],
            ),
        ),
        // dnat ip6 to meta l4proto . th dport map @hp6
        ("hostports6", vec![l4proto(REG_1), dport(REG32_00 + 1), lookup(sets, "hp6", Some(REG_1)), dnat6]),
        // ct status dnat ip saddr . ip daddr . meta l4proto . th dport @masq4 masquerade
        (
            "masquerading",
            with(
                with(dnatted.clone(), RuleExpr::nfproto(true)),
                vec![
                    payload(net, 12, 4, REG_1),
                    payload(net, 16, 4, REG32_00 + 1),
                    l4proto(REG32_00 + 2),
                    hton(REG32_00 + 2),
                    dport(REG32_00 + 3),
                    lookup(sets, "masq4", None),
                    RuleExpr::Masquerade,
                ],
            ),
        ),
        // ct status dnat ip6 saddr . ip6 daddr . meta l4proto . th dport @masq6 masquerade
        (
            "masquerading",
            with(
                with(dnatted, RuleExpr::nfproto(false)),
                vec![
                    payload(net, 8, 16, REG_1),
                    payload(net, 24, 16, REG_2),
                    l4proto(REG_3),
                    hton(REG_3),
                    dport(REG32_00 + 9),
                    lookup(sets, "masq6", None),
                    RuleExpr::Masquerade,
                ],
            ),
        ),
        // meta nfproto ipv4 jump hostports4 (no conditions)
        ("gate4", with(RuleExpr::nfproto(true), vec![RuleExpr::Verdict(Verdict::Jump("hostports4".into()))])),
        (
            "gate6",
            with(RuleExpr::nfproto(false), vec![RuleExpr::Verdict(Verdict::Jump("hostports6".into()))]),
        ),
    ]
}

/// The whole static part as one netlink transaction, the same objects as
/// `ruleset::setup_script` (sets and chains added, chains flushed and refilled, the gates
/// map refilled, `old_gates` chains deleted). None when `conf` has conditions: they are nft
/// syntax, so that case goes through `nft -f`.
pub fn setup_ops(conf: &Conf, old_gates: &[String]) -> Option<Vec<NftOp>> {
    if !conf.conditions_v4.is_empty() || !conf.conditions_v6.is_empty() {
        return None;
    }
    let (g4, g6) = ruleset::gate_names(conf);
    debug_assert_eq!((g4.as_str(), g6.as_str()), ("gate4", "gate6"));
    let t = || TABLE.to_string();
    let sets = sets();
    let mut ops = vec![NftOp::AddTable { family: FAMILY, table: t(), comment: None }];
    ops.extend(sets.iter().map(|s| NftOp::AddSet { family: FAMILY, table: t(), set: s.clone() }));
    let base =
        |hook, priority| Some(BaseChain { kind: "nat".into(), hook, priority, policy: Some(POLICY_ACCEPT) });
    let chains = [
        ("prerouting", base(HOOK_PREROUTING, -100)),
        ("output", base(HOOK_OUTPUT, -100)),
        ("masquerading", base(HOOK_POSTROUTING, 100)),
        ("hostports4", None),
        ("hostports6", None),
        ("gate4", None),
        ("gate6", None),
    ];
    for (chain, base) in &chains {
        ops.push(NftOp::AddChain {
            family: FAMILY,
            table: t(),
            chain: chain.to_string(),
            base: base.clone(),
            comment: None,
        });
    }
    for (chain, _) in &chains {
        ops.push(NftOp::Delete(NftDelete::Flush { family: FAMILY, table: t(), chain: chain.to_string() }));
    }
    for (chain, exprs) in static_rules(&sets) {
        ops.push(NftOp::rule(FAMILY, TABLE, chain, exprs, None));
    }
    ops.push(NftOp::FlushSet { family: FAMILY, table: t(), set: "gates".into() });
    ops.push(NftOp::AddElements {
        family: FAMILY,
        table: t(),
        set: "gates".into(),
        elems: gates_elements(conf),
    });
    for g in old_gates.iter().filter(|g| **g != g4 && **g != g6) {
        ops.push(NftOp::Delete(NftDelete::Chain { family: FAMILY, table: t(), chain: g.clone() }));
    }
    Some(ops)
}

/// The operation removing the whole table.
pub fn delete_table_op() -> NftOp {
    NftOp::Delete(NftDelete::Table { family: FAMILY, table: TABLE.into() })
}

fn read_once(nf: &mut NfTables) -> Result<Option<Listing>> {
    if !nf.has_table(FAMILY, TABLE)? {
        return Ok(None);
    }
    let mut l = Listing {
        chains: nf.chains(FAMILY, TABLE)?,
        rules: nf.rules(FAMILY, TABLE, None)?,
        ..Default::default()
    };
    for set in ELEMENT_SETS {
        l.elems.extend(nf.set_elements(FAMILY, TABLE, set)?.iter().filter_map(|e| decode(set, e)));
    }
    l.gates = nf.set_elements(FAMILY, TABLE, "gates")?.iter().filter_map(decode_gate).collect();
    Ok(Some(l))
}

/// The table as it is (None when it does not exist), read with a few netlink dumps between two
/// readings of the ruleset generation, repeated until both agree (one consistent state).
pub fn read(nf: &mut NfTables) -> Result<Option<Listing>> {
    for _ in 0..READ_ATTEMPTS {
        let generation = nf.generation()?;
        let l = read_once(nf)?;
        if nf.generation()? == generation {
            return Ok(l);
        }
    }
    Err(CniError::internal(format!(
        "portmap: table {} {TABLE} kept changing while it was read ({READ_ATTEMPTS} attempts)",
        FAMILY.keyword()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RawConf;
    use cni_common::netlink::nft::golden::assert_like_nft;

    fn el(set: &str, key: &str, data: Option<&str>) -> Elem {
        Elem { set: set.into(), key: key.into(), data: data.map(str::to_string) }
    }

    #[test]
    fn every_kind_of_element_round_trips() {
        let cases = [
            el("hp4", "tcp . 8080", Some("10.0.0.5 . 80")),
            el("hip4", "192.0.2.1 . udp . 53", Some("10.0.0.5 . 5353")),
            el("hp6", "sctp . 9", Some("fd00::5 . 9")),
            el("hip6", "fd00::1 . tcp . 443", Some("fd00::5 . 8443")),
            el("owner", "::ffff:0.0.0.0 . tcp . 8080", Some("1234:5678::9")),
            el("owner", ":: . udp . 53", Some("1234:5678::9")),
            el("claims", "::ffff:192.0.2.1 . tcp . 80 . 1234::1", Some("::ffff:10.0.0.5 . 80")),
            el("masq4", "10.0.0.0/24 . 10.0.0.5 . tcp . 80", None),
            el("masq4", "127.0.0.1 . 10.0.0.5 . udp . 53", None),
            el("masq4", "0.0.0.0/0 . 10.0.0.5 . tcp . 80", None),
            el("masq4", "10.0.0.3-10.0.0.9 . 10.0.0.5 . tcp . 80", None),
            el("masq6", "fd00::/64 . fd00::5 . tcp . 80", None),
            el("masq6", "::/0 . fd00::5 . tcp . 80", None),
            el("masq6", "fd00::5 . fd00::5 . tcp . 80", None),
        ];
        for e in &cases {
            let n = encode(e, Some("n,c,eth0")).unwrap();
            let back = decode(&e.set, &n).unwrap_or_else(|| panic!("{e:?} does not decode: {n:?}"));
            assert_eq!(back.elem(), *e);
            assert_eq!(back.comment.as_deref(), Some("n,c,eth0"));
        }
        // the layout is nft's: protocol and port padded to 4 bytes, interval as key end
        let n = encode(&cases[7], None).unwrap();
        assert_eq!(n.key, [10, 0, 0, 0, 10, 0, 0, 5, 6, 0, 0, 0, 0, 80, 0, 0]);
        assert_eq!(n.key_end.unwrap()[..4], [10, 0, 0, 255]);
        let n = encode(&cases[4], None).unwrap();
        assert_eq!(n.key.len(), 16 + 4 + 4);
        assert!(n.key_end.is_none());
        // what does not fit the set's layout is refused, not guessed
        assert!(encode(&el("hp4", "tcp . 70000", Some("10.0.0.5 . 80")), None).is_err());
        assert!(encode(&el("hp4", "tcp . 80", Some("fd00::1 . 80")), None).is_err());
        assert!(encode(&el("nope", "tcp . 80", None), None).is_err());
        assert!(decode("hp4", &NftElem::new(vec![6, 0, 0, 0])).is_none());
        assert!(decode("masq4", &encode(&cases[0], None).unwrap()).is_none());
    }

    #[test]
    fn gates_and_transactions() {
        let c = Conf::from_raw(Default::default()).unwrap();
        let g = gates_elements(&c);
        assert_eq!(decode_gate(&g[0]), Some(("ipv4".into(), "jump gate4".into())));
        assert_eq!(decode_gate(&g[1]), Some(("ipv6".into(), "jump gate6".into())));
        let o = Owner::new("n", "c", "eth0");
        let els = vec![
            el("owner", "::ffff:0.0.0.0 . tcp . 80", Some(&o.hash.to_string())),
            el("owner", ":: . tcp . 80", Some(&o.hash.to_string())),
            el("hp4", "tcp . 80", Some("10.0.0.5 . 80")),
        ];
        let f = fast_add_ops(&c, &els, &o).unwrap();
        assert_eq!(f.len(), 3, "gates, owner (both in one message), hp4");
        match &f[1] {
            NftOp::AddElements { set, elems, .. } => {
                assert_eq!((set.as_str(), elems.len()), ("owner", 2));
                assert_eq!(elems[0].comment.as_deref(), Some("n,c,eth0"));
            }
            other => panic!("{other:?}"),
        }
        let d = guarded_delete_ops(&els, &o).unwrap();
        assert_eq!(d.len(), 3, "re-assert owners, delete owners, delete hp4");
        assert!(matches!(&d[0], NftOp::AddElements { set, .. } if set == "owner"));
        match &d[2] {
            NftOp::DeleteElements { set, elems, .. } => {
                assert_eq!(set, "hp4");
                assert_eq!((elems[0].data.as_ref(), elems[0].comment.as_ref()), (None, None));
            }
            other => panic!("{other:?}"),
        }
    }

    /// The static part over netlink is, object by object, what nft sends for
    /// `ruleset::setup_script` (testdata/capture-nft.py in cni-common, cases `pm-*`).
    #[test]
    fn static_part_is_what_nft_sends() {
        let conf = Conf::from_raw(RawConf::default()).unwrap();
        let ops = setup_ops(&conf, &["gate4_0123456789ab".into(), "gate4".into()]).unwrap();
        // nft found the sets in its cache, numbered in the order of the capture's table
        let nft_ids = |chain: &str, set: &str| -> u32 {
            let full = ["hp4", "hip6", "owner", "claims", "masq4", "masq6", "hip4", "hp6", "gates"];
            let short = ["hp4", "hip6", "owner", "claims", "masq4", "masq6", "gates"];
            let order: &[&str] = if chain == "prerouting" || chain == "output" { &short } else { &full };
            order.iter().position(|s| *s == set).unwrap() as u32 + 1
        };
        let mut seen = Vec::new();
        let mut rules_of = std::collections::HashMap::<String, usize>::new();
        for op in &ops {
            let case = match op {
                NftOp::AddTable { .. } => "pm-table".to_string(),
                NftOp::AddSet { set, .. } => {
                    // each set was captured as the first of its batch: id 1
                    let mut set = set.clone();
                    set.id = 1;
                    assert_like_nft(
                        &format!("pm-set-{}", set.name),
                        &[NftOp::AddSet { family: FAMILY, table: TABLE.into(), set }],
                    );
                    seen.push("set".to_string());
                    continue;
                }
                NftOp::AddChain { chain, base: None, .. } if chain == "hostports4" => "pm-chain".into(),
                NftOp::AddChain { base: None, .. } => continue,
                NftOp::AddChain { chain, .. } => format!("pm-{chain}"),
                NftOp::AddRule { chain, exprs, .. } => {
                    let n = rules_of.entry(chain.clone()).or_default();
                    *n += 1;
                    let case = match (chain.as_str(), *n) {
                        ("prerouting", 1) => "pm-rule-gates",
                        ("output", 1) => "pm-rule-gates",
                        ("hostports4", 1) => "pm-rule-hip4",
                        ("hostports4", 2) => "pm-rule-hp4",
                        ("hostports6", 1) => "pm-rule-hip6",
                        ("hostports6", 2) => "pm-rule-hp6",
                        ("masquerading", 1) => "pm-rule-masq4",
                        ("masquerading", 2) => "pm-rule-masq6",
                        ("gate4", 1) => "pm-rule-gate4",
                        ("gate6", 1) => "pm-rule-gate6",
                        other => panic!("unexpected rule {other:?}"),
                    };
                    let exprs = exprs
                        .iter()
                        .map(|e| match e {
                            RuleExpr::Lookup { sreg, dreg, set, .. } => RuleExpr::Lookup {
                                sreg: *sreg,
                                dreg: *dreg,
                                set: set.clone(),
                                set_id: nft_ids(chain, set),
                            },
                            e => e.clone(),
                        })
                        .collect();
                    // the captured rule went into the chain nft was given
                    let chain = if chain == "output" { "prerouting".to_string() } else { chain.clone() };
                    assert_like_nft(
                        case,
                        &[NftOp::AddRule {
                            family: FAMILY,
                            table: TABLE.into(),
                            chain,
                            exprs,
                            comment: None,
                        }],
                    );
                    seen.push(case.to_string());
                    continue;
                }
                NftOp::FlushSet { .. } => "pm-flush-gates".into(),
                NftOp::AddElements { set, .. } if set == "gates" => "gates".into(),
                NftOp::Delete(NftDelete::Flush { .. }) => continue,
                NftOp::Delete(NftDelete::Chain { chain, .. }) => {
                    assert_eq!(chain, "gate4_0123456789ab", "only the old gate chain goes");
                    continue;
                }
                other => panic!("unexpected operation {other:?}"),
            };
            assert_like_nft(&case, std::slice::from_ref(op));
            seen.push(case);
        }
        assert_eq!(seen.iter().filter(|c| *c == "set").count(), 9);
        assert_eq!(seen.iter().filter(|c| c.starts_with("pm-rule")).count(), 10);
        for c in [
            "pm-table",
            "pm-chain",
            "pm-prerouting",
            "pm-output",
            "pm-masquerading",
            "pm-flush-gates",
            "gates",
        ] {
            assert!(seen.iter().any(|s| s == c), "{c} not covered");
        }
        // with conditions the static part is nft syntax: no netlink version
        let mut with = Conf::from_raw(RawConf::default()).unwrap();
        with.conditions_v4 = vec!["ip saddr != 10.0.0.0/8".into()];
        assert!(setup_ops(&with, &[]).is_none());
    }
}
