//! The static part of the table over netlink: the same objects as
//! [`crate::layout::setup_script`] declares in nft syntax, in nft's encoding (register
//! allocation included; golden test [`super::tests`] against messages captured from nft 1.0.6).
//! Two groups, each rebuilt idempotently (objects added, chains flushed and refilled): the DNAT
//! part, which depends on the conditions (None with conditions: they are nft syntax), and the
//! masquerade part with the `netns` records, which never does.

use crate::config::{Conf, Fam};
use crate::layout::{self, gate_names, masq_chain, Lens, TABLE};
use crate::model::Set;
use cni_common::netlink::nft::{
    BaseChain, CmpOp, NftOp, NftSet, NftSetData, RuleExpr, CT_STATUS, CT_STATUS_DST_NAT, HOOK_POSTROUTING,
    HOOK_PREROUTING, META_L4PROTO, META_NFPROTO, PAYLOAD_NETWORK_HEADER, PAYLOAD_TRANSPORT_HEADER,
    POLICY_ACCEPT, REG32_00, REG_1, REG_2, REG_3, REG_VERDICT,
};
use cni_common::netlink::nft::{NftDelete, NftFamily, Verdict};
use std::net::IpAddr;

pub const FAMILY: NftFamily = NftFamily::Inet;
/// `NF_INET_LOCAL_OUT`.
const HOOK_OUTPUT: u32 = 3;
const NFPROTO_IPV4: u32 = 2;
const NFPROTO_IPV6: u32 = 10;

/// A set as `nft add set|map` declares it, with a transaction-local id (its position in the
/// layout, so that ids are unique in any transaction).
pub fn nft_set(set: Set, lens: &Lens) -> NftSet {
    let id = layout::sets(lens).iter().position(|s| *s == set).map_or(0, |i| i as u32 + 1);
    let (key, data) = layout::set_types(set);
    NftSet {
        name: set.name(),
        key,
        data: data.map(|d| d.map_or(NftSetData::Verdict, NftSetData::Values)),
        interval: false,
        id,
    }
}

fn lookup(set: Set, lens: &Lens, dreg: Option<u32>) -> RuleExpr {
    RuleExpr::Lookup { sreg: REG_1, dreg, set: set.name(), set_id: nft_set(set, lens).id }
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

fn with(mut a: Vec<RuleExpr>, b: Vec<RuleExpr>) -> Vec<RuleExpr> {
    a.extend(b);
    a
}

fn dnat_rules(lens: &Lens) -> Vec<(&'static str, Vec<RuleExpr>)> {
    // fib daddr type local meta nfproto vmap @gates
    let gate = with(
        RuleExpr::daddr_type_local(CmpOp::Eq),
        vec![RuleExpr::Meta { key: META_NFPROTO, dreg: REG_1 }, lookup(Set::Gates, lens, Some(REG_VERDICT))],
    );
    let dnat4 = RuleExpr::Dnat { family: NFPROTO_IPV4, reg_addr: REG_1, reg_proto: REG32_00 + 1 };
    let dnat6 = RuleExpr::Dnat { family: NFPROTO_IPV6, reg_addr: REG_1, reg_proto: REG_2 };
    let net = PAYLOAD_NETWORK_HEADER;
    let (hp4, hip4) = (Set::Hp(Fam::V4), Set::Hip(Fam::V4));
    let (hp6, hip6) = (Set::Hp(Fam::V6), Set::Hip(Fam::V6));
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
                    lookup(hip4, lens, Some(REG_1)),
                    dnat4.clone(),
                ],
            ),
        ),
        // dnat ip to meta l4proto . th dport map @hp4
        ("hostports4", vec![l4proto(REG_1), dport(REG32_00 + 1), lookup(hp4, lens, Some(REG_1)), dnat4]),
        // dnat ip6 to ip6 daddr . meta l4proto . th dport map @hip6
        (
            "hostports6",
            with(
                RuleExpr::nfproto(false),
                vec![
                    payload(net, 24, 16, REG_1),
                    l4proto(REG_2),
                    dport(REG32_00 + 5),
                    lookup(hip6, lens, Some(REG_1)),
                    dnat6.clone(),
                ],
            ),
        ),
        // dnat ip6 to meta l4proto . th dport map @hp6
        ("hostports6", vec![l4proto(REG_1), dport(REG32_00 + 1), lookup(hp6, lens, Some(REG_1)), dnat6]),
        // meta nfproto ipv4 jump hostports4 (no conditions)
        ("gate4", with(RuleExpr::nfproto(true), vec![RuleExpr::Verdict(Verdict::Jump("hostports4".into()))])),
        (
            "gate6",
            with(RuleExpr::nfproto(false), vec![RuleExpr::Verdict(Verdict::Jump("hostports6".into()))]),
        ),
    ]
}

/// `ct status dnat meta nfproto ipv4|ipv6 jump masquerade4|6`
fn masq_jump(fam: Fam) -> Vec<RuleExpr> {
    with(
        vec![
            RuleExpr::Ct { key: CT_STATUS, dreg: REG_1 },
            RuleExpr::Bitwise {
                sreg: REG_1,
                dreg: REG_1,
                mask: CT_STATUS_DST_NAT.to_ne_bytes().to_vec(),
                xor: vec![0; 4],
            },
            RuleExpr::Cmp { sreg: REG_1, op: CmpOp::Neq, data: vec![0; 4] },
        ],
        with(
            RuleExpr::nfproto(fam == Fam::V4),
            vec![RuleExpr::Verdict(Verdict::Jump(masq_chain(fam).into()))],
        ),
    )
}

/// `ip saddr & <mask> . ip daddr . meta l4proto . th dport @net4_<len> masquerade` (and ip6;
/// without the mask for a full-length prefix, without the source for `/0`).
fn net_rule(fam: Fam, len: u8, lens: &Lens) -> Vec<RuleExpr> {
    let (alen, saddr, daddr) = match fam {
        Fam::V4 => (4, 12, 16),
        Fam::V6 => (16, 8, 24),
    };
    let mut v = RuleExpr::nfproto(fam == Fam::V4);
    // the registers of daddr, l4proto and dport, after the source (if any) in register 1
    let regs = match (fam, len) {
        (Fam::V4, 0) => [REG_1, REG32_00 + 1, REG32_00 + 2],
        (Fam::V6, 0) => [REG_1, REG_2, REG32_00 + 5],
        (Fam::V4, _) => [REG32_00 + 1, REG32_00 + 2, REG32_00 + 3],
        (Fam::V6, _) => [REG_2, REG_3, REG32_00 + 9],
    };
    if len > 0 {
        v.push(payload(PAYLOAD_NETWORK_HEADER, saddr, alen, REG_1));
    }
    if len > 0 && u32::from(len) != alen * 8 {
        let mask = match layout::mask(fam, len) {
            IpAddr::V4(m) => m.octets().to_vec(),
            IpAddr::V6(m) => m.octets().to_vec(),
        };
        v.push(RuleExpr::Bitwise { sreg: REG_1, dreg: REG_1, xor: vec![0; mask.len()], mask });
    }
    v.extend([
        payload(PAYLOAD_NETWORK_HEADER, daddr, alen, regs[0]),
        l4proto(regs[1]),
        dport(regs[2]),
        lookup(Set::Net(fam, len), lens, None),
        RuleExpr::Masquerade,
    ]);
    v
}

fn add_chain(chain: &str, base: Option<BaseChain>) -> NftOp {
    NftOp::AddChain { family: FAMILY, table: TABLE.into(), chain: chain.into(), base, comment: None }
}

fn base(hook: u32, priority: i32) -> Option<BaseChain> {
    Some(BaseChain { kind: "nat".into(), hook, priority, policy: Some(POLICY_ACCEPT) })
}

fn flush(chain: &str) -> NftOp {
    NftOp::Delete(NftDelete::Flush { family: FAMILY, table: TABLE.into(), chain: chain.into() })
}

/// The DNAT part as one list of operations (table, maps, chains flushed and refilled, the
/// gates map refilled, `old_gates` chains deleted). None when `conf` has conditions.
pub fn dnat_ops(conf: &Conf, old_gates: &[String], lens: &Lens) -> Option<Vec<NftOp>> {
    if !conf.conditions_v4.is_empty() || !conf.conditions_v6.is_empty() {
        return None;
    }
    let (g4, g6) = gate_names(conf);
    debug_assert_eq!((g4.as_str(), g6.as_str()), ("gate4", "gate6"));
    let mut ops = vec![NftOp::AddTable { family: FAMILY, table: TABLE.into(), comment: None }];
    // the maps of the DNAT part: every fixed set but the netns records
    let sets: Vec<Set> = Set::FIXED.into_iter().filter(|s| *s != Set::Netns).collect();
    ops.extend(sets.iter().map(|s| NftOp::AddSet {
        family: FAMILY,
        table: TABLE.into(),
        set: nft_set(*s, lens),
    }));
    let chains = [
        ("prerouting", base(HOOK_PREROUTING, -100)),
        ("output", base(HOOK_OUTPUT, -100)),
        ("hostports4", None),
        ("hostports6", None),
        ("gate4", None),
        ("gate6", None),
    ];
    ops.extend(chains.iter().map(|(c, b)| add_chain(c, b.clone())));
    ops.extend(chains.iter().map(|(c, _)| flush(c)));
    ops.extend(
        dnat_rules(lens).into_iter().map(|(chain, exprs)| NftOp::rule(FAMILY, TABLE, chain, exprs, None)),
    );
    let gates = Set::Gates.name();
    ops.push(NftOp::FlushSet { family: FAMILY, table: TABLE.into(), set: gates.clone() });
    ops.push(NftOp::AddElements {
        family: FAMILY,
        table: TABLE.into(),
        set: gates,
        elems: super::codec::gates_elements(&g4, &g6),
    });
    for g in old_gates.iter().filter(|g| **g != g4 && **g != g6) {
        ops.push(NftOp::Delete(NftDelete::Chain { family: FAMILY, table: TABLE.into(), chain: g.clone() }));
    }
    Some(ops)
}

/// The masquerade part for `lens` and the `netns` map (table, sets, chains flushed and
/// refilled), then the deletion of the previous layout's `legacy` sets, whose rule the flush
/// of `masquerading` removed.
pub fn masq_ops(lens: &Lens, legacy: &[String]) -> Vec<NftOp> {
    let mut ops = vec![NftOp::AddTable { family: FAMILY, table: TABLE.into(), comment: None }];
    let mut sets = vec![Set::Netns];
    sets.extend(lens.iter().map(|(f, len)| Set::Net(*f, *len)));
    ops.extend(sets.iter().map(|s| NftOp::AddSet {
        family: FAMILY,
        table: TABLE.into(),
        set: nft_set(*s, lens),
    }));
    let chains = [
        ("masquerading", base(HOOK_POSTROUTING, 100)),
        (masq_chain(Fam::V4), None),
        (masq_chain(Fam::V6), None),
    ];
    ops.extend(chains.iter().map(|(c, b)| add_chain(c, b.clone())));
    ops.extend(chains.iter().map(|(c, _)| flush(c)));
    for fam in [Fam::V4, Fam::V6] {
        ops.push(NftOp::rule(FAMILY, TABLE, "masquerading", masq_jump(fam), None));
    }
    for (fam, len) in lens {
        ops.push(NftOp::rule(FAMILY, TABLE, masq_chain(*fam), net_rule(*fam, *len, lens), None));
    }
    for set in legacy {
        ops.push(NftOp::Delete(NftDelete::Set { family: FAMILY, table: TABLE.into(), set: set.clone() }));
    }
    ops
}

/// The operation removing the whole table.
pub fn delete_table_op() -> NftOp {
    NftOp::Delete(NftDelete::Table { family: FAMILY, table: TABLE.into() })
}
