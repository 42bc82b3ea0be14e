//! Rule expressions and verdicts: [`RuleExpr`] to write (encoded as nft 1.0.6 encodes the same
//! text), [`NftExpr`] as read back (decoded as far as plugins need), and the data attributes
//! (values, verdicts) that expressions and map elements share.

use std::net::IpAddr;

use ipnet::IpNet;

use super::consts::*;
use crate::netlink::nfnl::{
    attrs, cstr, decode_be32, encode_be32, find_attr, put_attr, put_nested, string_of,
};

/// A verdict of an `immediate` expression or a verdict map element.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Accept,
    Drop,
    Return,
    Continue,
    Jump(String),
    Goto(String),
    Other(i32),
}

/// `NFT_CMP_*` operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    Eq = 0,
    Neq = 1,
}

/// A rule expression to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleExpr {
    /// `meta load <key> => reg`
    Meta { key: u32, dreg: u32 },
    /// `payload load <len>b @ <base> + <offset> => reg`
    Payload { base: u32, offset: u32, len: u32, dreg: u32 },
    /// `cmp <op> reg <data>`
    Cmp { sreg: u32, op: CmpOp, data: Vec<u8> },
    /// `bitwise reg = (reg & mask) ^ xor`
    Bitwise { sreg: u32, dreg: u32, mask: Vec<u8>, xor: Vec<u8> },
    /// `fib <flags> <result> => reg` (`NFTA_FIB_F_*`, `NFT_FIB_RESULT_*`)
    Fib { flags: u32, result: u32, dreg: u32 },
    /// `immediate reg 0 <verdict>`
    Verdict(Verdict),
    /// `masq`
    Masquerade,
    /// `lookup reg <sreg> set <set> [dreg <dreg>]`: a set match, or a map lookup into `dreg`
    /// (the verdict register for a verdict map).
    Lookup { sreg: u32, dreg: Option<u32>, set: String, set_id: u32 },
    /// `nat dnat <family> addr_min reg <reg_addr> proto_min reg <reg_proto>`.
    Dnat { family: u32, reg_addr: u32, reg_proto: u32 },
    /// `ct load <key> => reg`
    Ct { key: u32, dreg: u32 },
    /// `byteorder reg <dreg> = hton(reg <sreg>, <size>, <len>)`
    Hton { sreg: u32, dreg: u32, size: u32, len: u32 },
    /// `match name <name> rev <rev>`: an x_tables match with its info structure, run by the
    /// kernel's compat layer — how iptables-nft writes `-m conntrack`, `-m comment`, … (a
    /// rule in an iptables-nft table lists in `iptables-nft -S` only in that form).
    XtMatch { name: String, rev: u32, info: Vec<u8> },
}

impl RuleExpr {
    /// `meta nfproto ipv4|ipv6`: the dependency nft puts before the first IP match of a rule
    /// in an `inet` (or bridge) table.
    pub fn nfproto(v4: bool) -> Vec<RuleExpr> {
        vec![
            RuleExpr::Meta { key: META_NFPROTO, dreg: REG_1 },
            RuleExpr::Cmp { sreg: REG_1, op: CmpOp::Eq, data: vec![if v4 { 2 } else { 10 }] },
        ]
    }

    /// `ip|ip6 saddr|daddr [!=] <net>` as nft encodes it: a host address compares the whole
    /// address; a prefix on a byte boundary loads and compares only its bytes; other prefixes
    /// (and /0) load the address and mask it.
    pub fn addr(source: bool, net: IpNet, op: CmpOp) -> Vec<RuleExpr> {
        let net = net.trunc();
        let (offset, bytes): (u32, Vec<u8>) = match net.addr() {
            IpAddr::V4(a) => (if source { 12 } else { 16 }, a.octets().to_vec()),
            IpAddr::V6(a) => (if source { 8 } else { 24 }, a.octets().to_vec()),
        };
        let (plen, max) = (net.prefix_len() as usize, net.max_prefix_len() as usize);
        let payload = |len: usize| RuleExpr::Payload {
            base: PAYLOAD_NETWORK_HEADER,
            offset,
            len: len as u32,
            dreg: REG_1,
        };
        if plen == max || (plen > 0 && plen % 8 == 0) {
            let n = plen / 8;
            return vec![payload(n), RuleExpr::Cmp { sreg: REG_1, op, data: bytes[..n].to_vec() }];
        }
        let mask: Vec<u8> = match net.netmask() {
            IpAddr::V4(m) => m.octets().to_vec(),
            IpAddr::V6(m) => m.octets().to_vec(),
        };
        vec![
            payload(bytes.len()),
            RuleExpr::Bitwise { sreg: REG_1, dreg: REG_1, xor: vec![0; mask.len()], mask },
            RuleExpr::Cmp { sreg: REG_1, op, data: bytes },
        ]
    }

    /// `iifname "<name>"` (exact match: the name padded to IFNAMSIZ).
    pub fn iifname(name: &str) -> Vec<RuleExpr> {
        let mut data = name.as_bytes().to_vec();
        data.resize(16, 0);
        vec![
            RuleExpr::Meta { key: META_IIFNAME, dreg: REG_1 },
            RuleExpr::Cmp { sreg: REG_1, op: CmpOp::Eq, data },
        ]
    }

    /// `ether saddr <mac>`.
    pub fn ether_saddr(mac: [u8; 6]) -> Vec<RuleExpr> {
        vec![
            RuleExpr::Payload { base: PAYLOAD_LL_HEADER, offset: 6, len: 6, dreg: REG_1 },
            RuleExpr::Cmp { sreg: REG_1, op: CmpOp::Eq, data: mac.to_vec() },
        ]
    }

    /// `fib daddr type != local`.
    pub fn daddr_not_local() -> Vec<RuleExpr> {
        RuleExpr::daddr_type_local(CmpOp::Neq)
    }

    /// `fib daddr type local` (`Eq`) or `fib daddr type != local` (`Neq`).
    pub fn daddr_type_local(op: CmpOp) -> Vec<RuleExpr> {
        vec![
            RuleExpr::Fib { flags: NFTA_FIB_F_DADDR, result: NFT_FIB_RESULT_ADDRTYPE, dreg: REG_1 },
            // the register holds the route type as a host-order u32
            RuleExpr::Cmp { sreg: REG_1, op, data: RTN_LOCAL.to_ne_bytes().to_vec() },
        ]
    }
}

/// A rule expression as read back, decoded as far as plugins need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NftExpr {
    /// `cmp`: operator (`NFT_CMP_*`, 0 = eq, 1 = neq) and the compared bytes.
    Cmp { op: u32, data: Vec<u8> },
    /// `meta`: the key (`NFT_META_*`, e.g. 6 = iifname, 7 = oifname).
    Meta { key: u32 },
    /// `immediate` carrying a verdict.
    Verdict(Verdict),
    /// `lookup` in a named set or map (`@set`, `vmap @map`, `… map @map`).
    Lookup { set: String },
    /// `ct load`: the key (`NFT_CT_*`, e.g. 0 = state, 2 = status).
    Ct { key: u32 },
    /// `bitwise` with a mask (`reg & mask ^ xor`); a shift is [`NftExpr::Other`].
    Bitwise { mask: Vec<u8>, xor: Vec<u8> },
    /// `match`: an x_tables match of the compat layer, by name, with its info structure.
    XtMatch { name: String, info: Vec<u8> },
    /// Anything else, by name (`payload`, `masq`, `fib`, `nat`, …).
    Other(String),
}

/// The expressions of a rule written with `exprs`, as a rule dump lists them ([`NftExpr`]):
/// what [`super::NftRule::exprs`] holds for that rule when it is read back. Lets a plugin
/// compare the rules it finds with the rules it declares, and a fake kernel store rules as
/// the real one reports them.
pub fn listed(exprs: &[RuleExpr]) -> Vec<NftExpr> {
    exprs.iter().map(as_listed).collect()
}

/// One expression as [`expr_of`] decodes it from the kernel's dump (without encoding it: the
/// unit test `listed_is_what_the_decoder_reads_back` holds the two to each other).
fn as_listed(e: &RuleExpr) -> NftExpr {
    match e {
        RuleExpr::Meta { key, .. } => NftExpr::Meta { key: *key },
        RuleExpr::Cmp { op, data, .. } => NftExpr::Cmp { op: *op as u32, data: data.clone() },
        RuleExpr::Verdict(v) => NftExpr::Verdict(v.clone()),
        RuleExpr::Lookup { set, .. } => NftExpr::Lookup { set: set.clone() },
        RuleExpr::Payload { .. } => NftExpr::Other("payload".into()),
        RuleExpr::Bitwise { mask, xor, .. } => NftExpr::Bitwise { mask: mask.clone(), xor: xor.clone() },
        RuleExpr::Fib { .. } => NftExpr::Other("fib".into()),
        RuleExpr::Masquerade => NftExpr::Other("masq".into()),
        RuleExpr::Dnat { .. } => NftExpr::Other("nat".into()),
        RuleExpr::Ct { key, .. } => NftExpr::Ct { key: *key },
        RuleExpr::Hton { .. } => NftExpr::Other("byteorder".into()),
        RuleExpr::XtMatch { name, info, .. } => NftExpr::XtMatch { name: name.clone(), info: info.clone() },
    }
}

// ---- encoding ----

/// Append expression `e` to an `NFTA_RULE_EXPRESSIONS` list. Attributes in libnftnl's order.
pub(super) fn put_expr(out: &mut Vec<u8>, e: &RuleExpr) {
    let mut d = Vec::new();
    let put_u32s = |d: &mut Vec<u8>, attrs: &[(u16, u32)]| {
        for (kind, v) in attrs {
            put_attr(d, *kind, &encode_be32(*v));
        }
    };
    let name = match e {
        RuleExpr::Meta { key, dreg } => {
            put_u32s(&mut d, &[(NFTA_META_KEY, *key), (NFTA_META_DREG, *dreg)]);
            "meta"
        }
        RuleExpr::Payload { base, offset, len, dreg } => {
            put_u32s(
                &mut d,
                &[
                    (NFTA_PAYLOAD_DREG, *dreg),
                    (NFTA_PAYLOAD_BASE, *base),
                    (NFTA_PAYLOAD_OFFSET, *offset),
                    (NFTA_PAYLOAD_LEN, *len),
                ],
            );
            "payload"
        }
        RuleExpr::Cmp { sreg, op, data } => {
            put_u32s(&mut d, &[(NFTA_CMP_SREG, *sreg), (NFTA_CMP_OP, *op as u32)]);
            put_nested(&mut d, NFTA_CMP_DATA, &value_attr(data));
            "cmp"
        }
        RuleExpr::Bitwise { sreg, dreg, mask, xor } => {
            let len = mask.len() as u32;
            put_u32s(
                &mut d,
                &[(NFTA_BITWISE_SREG, *sreg), (NFTA_BITWISE_DREG, *dreg), (NFTA_BITWISE_LEN, len)],
            );
            put_nested(&mut d, NFTA_BITWISE_MASK, &value_attr(mask));
            put_nested(&mut d, NFTA_BITWISE_XOR, &value_attr(xor));
            "bitwise"
        }
        RuleExpr::Fib { flags, result, dreg } => {
            put_u32s(&mut d, &[(NFTA_FIB_FLAGS, *flags), (NFTA_FIB_RESULT, *result), (NFTA_FIB_DREG, *dreg)]);
            "fib"
        }
        RuleExpr::Verdict(v) => {
            put_u32s(&mut d, &[(NFTA_IMMEDIATE_DREG, REG_VERDICT)]);
            put_nested(&mut d, NFTA_IMMEDIATE_DATA, &verdict_attr(v));
            "immediate"
        }
        RuleExpr::Masquerade => "masq",
        RuleExpr::Lookup { sreg, dreg, set, set_id } => {
            put_u32s(&mut d, &[(NFTA_LOOKUP_SREG, *sreg)]);
            if let Some(r) = dreg {
                put_u32s(&mut d, &[(NFTA_LOOKUP_DREG, *r)]);
            }
            put_attr(&mut d, NFTA_LOOKUP_SET, &cstr(set));
            put_u32s(&mut d, &[(NFTA_LOOKUP_SET_ID, *set_id)]);
            "lookup"
        }
        RuleExpr::Dnat { family, reg_addr, reg_proto } => {
            put_u32s(
                &mut d,
                &[
                    (NFTA_NAT_TYPE, NFT_NAT_DNAT),
                    (NFTA_NAT_FAMILY, *family),
                    (NFTA_NAT_REG_ADDR_MIN, *reg_addr),
                    (NFTA_NAT_REG_PROTO_MIN, *reg_proto),
                ],
            );
            "nat"
        }
        RuleExpr::Ct { key, dreg } => {
            put_u32s(&mut d, &[(NFTA_CT_KEY, *key), (NFTA_CT_DREG, *dreg)]);
            "ct"
        }
        RuleExpr::Hton { sreg, dreg, size, len } => {
            put_u32s(
                &mut d,
                &[
                    (NFTA_BYTEORDER_SREG, *sreg),
                    (NFTA_BYTEORDER_DREG, *dreg),
                    (NFTA_BYTEORDER_OP, NFT_BYTEORDER_HTON),
                    (NFTA_BYTEORDER_LEN, *len),
                    (NFTA_BYTEORDER_SIZE, *size),
                ],
            );
            "byteorder"
        }
        RuleExpr::XtMatch { name, rev, info } => {
            put_attr(&mut d, NFTA_MATCH_NAME, &cstr(name));
            put_u32s(&mut d, &[(NFTA_MATCH_REV, *rev)]);
            put_attr(&mut d, NFTA_MATCH_INFO, info);
            "match"
        }
    };
    let mut elem = Vec::new();
    put_attr(&mut elem, NFTA_EXPR_NAME, &cstr(name));
    put_nested(&mut elem, NFTA_EXPR_DATA, &d);
    put_nested(out, NFTA_LIST_ELEM, &elem);
}

/// `NFTA_DATA_VALUE` holding `bytes`.
pub(super) fn value_attr(bytes: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    put_attr(&mut v, NFTA_DATA_VALUE, bytes);
    v
}

fn verdict_code(v: &Verdict) -> (i32, Option<&str>) {
    match v {
        Verdict::Accept => (NF_ACCEPT, None),
        Verdict::Drop => (NF_DROP, None),
        Verdict::Continue => (NFT_CONTINUE, None),
        Verdict::Return => (NFT_RETURN, None),
        Verdict::Jump(c) => (NFT_JUMP, Some(c)),
        Verdict::Goto(c) => (NFT_GOTO, Some(c)),
        Verdict::Other(code) => (*code, None),
    }
}

/// `NFTA_DATA_VERDICT` holding `v`.
pub(super) fn verdict_attr(v: &Verdict) -> Vec<u8> {
    let (code, chain) = verdict_code(v);
    let mut inner = Vec::new();
    put_attr(&mut inner, NFTA_VERDICT_CODE, &code.to_be_bytes());
    if let Some(c) = chain {
        put_attr(&mut inner, NFTA_VERDICT_CHAIN, &cstr(c));
    }
    let mut v = Vec::new();
    put_nested(&mut v, NFTA_DATA_VERDICT, &inner);
    v
}

// ---- decoding ----

/// The bytes of an `NFTA_DATA_VALUE` in `data`.
pub(super) fn value_of(data: &[u8]) -> Option<Vec<u8>> {
    find_attr(data, NFTA_DATA_VALUE).map(<[u8]>::to_vec)
}

/// The verdict of an `NFTA_DATA_VERDICT` in `data`.
pub(super) fn verdict_of(data: &[u8]) -> Option<Verdict> {
    let v = find_attr(data, NFTA_DATA_VERDICT)?;
    let (mut code, mut chain) = (None, None);
    for (k, value) in attrs(v) {
        match k {
            NFTA_VERDICT_CODE => code = decode_be32(value).map(|c| c as i32),
            NFTA_VERDICT_CHAIN => chain = Some(string_of(value)),
            _ => {}
        }
    }
    Some(match (code?, chain) {
        (NF_ACCEPT, _) => Verdict::Accept,
        (NF_DROP, _) => Verdict::Drop,
        (NFT_CONTINUE, _) => Verdict::Continue,
        (NFT_RETURN, _) => Verdict::Return,
        (NFT_JUMP, Some(c)) => Verdict::Jump(c),
        (NFT_GOTO, Some(c)) => Verdict::Goto(c),
        (other, _) => Verdict::Other(other),
    })
}

/// Decode one element of an `NFTA_RULE_EXPRESSIONS` list.
pub(super) fn expr_of(elem: &[u8]) -> Option<NftExpr> {
    let name = string_of(find_attr(elem, NFTA_EXPR_NAME)?);
    let data = find_attr(elem, NFTA_EXPR_DATA).unwrap_or_default();
    let find = |kind: u16| find_attr(data, kind);
    Some(match name.as_str() {
        "cmp" => {
            let op = find(NFTA_CMP_OP).and_then(decode_be32).unwrap_or(0);
            NftExpr::Cmp { op, data: find(NFTA_CMP_DATA).and_then(value_of).unwrap_or_default() }
        }
        "meta" => NftExpr::Meta { key: find(NFTA_META_KEY).and_then(decode_be32).unwrap_or(u32::MAX) },
        "immediate" => match find(NFTA_IMMEDIATE_DATA).and_then(verdict_of) {
            Some(v) => NftExpr::Verdict(v),
            None => NftExpr::Other(name),
        },
        "lookup" => match find(NFTA_LOOKUP_SET) {
            Some(set) => NftExpr::Lookup { set: string_of(set) },
            None => NftExpr::Other(name),
        },
        "ct" => match (find(NFTA_CT_KEY).and_then(decode_be32), find(NFTA_CT_DREG)) {
            (Some(key), Some(_)) => NftExpr::Ct { key },
            _ => NftExpr::Other(name), // `ct … set`
        },
        "bitwise" => {
            match (find(NFTA_BITWISE_MASK).and_then(value_of), find(NFTA_BITWISE_XOR).and_then(value_of)) {
                (Some(mask), Some(xor)) => NftExpr::Bitwise { mask, xor },
                _ => NftExpr::Other(name),
            }
        }
        "match" => match find(NFTA_MATCH_NAME) {
            Some(m) => NftExpr::XtMatch {
                name: string_of(m),
                info: find(NFTA_MATCH_INFO).map(<[u8]>::to_vec).unwrap_or_default(),
            },
            None => NftExpr::Other(name),
        },
        _ => NftExpr::Other(name),
    })
}
