//! The kernel side: our elements in nf_tables' byte layout ([`codec`]), the static part over
//! netlink ([`setup`]), reading the table ([`read`]) and the element transactions ([`txn`]).

pub mod codec;
pub mod read;
pub mod setup;
pub mod txn;

pub use read::read;
pub use setup::{conditions_ops, delete_table_op, dnat_ops, masq_ops};
pub use txn::{fast_add_ops, guarded_delete_ops, plan_ops, plan_script};

#[cfg(test)]
mod tests {
    //! Our messages are, object by object, what nft 1.0.6 sends for the same declarations
    //! (`testdata/nft-golden.txt`, captured by `testdata/capture-nft.py`).

    use super::codec::encode;
    use super::setup::FAMILY;
    use super::*;
    use crate::config::{Conf, Fam, Proto};
    use crate::layout::{Lens, TABLE};
    use crate::model::{Elem, Hash, HostPort, Masq, NsId, Target};
    use cni_common::netlink::nft::golden::{hex, messages, normalize};
    use cni_common::netlink::nft::NftDelete;
    use cni_common::netlink::nft::{NftOp, RuleExpr};
    use cni_common::spec::config::PortMapConf;

    const GOLDEN: &str = include_str!("../../testdata/nft-golden.txt");
    /// The sets of the capture's table, in the order nft's cache numbers them.
    const CACHE: [&str; 15] = [
        "hp4",
        "hip4",
        "hp6",
        "hip6",
        "owner",
        "claims",
        "netns",
        "gates",
        "net4_24",
        "net4_32",
        "net4_0",
        "net6_64",
        "net6_128",
        "net6_0",
        "conditions",
    ];

    /// Netlink attributes as (type with flags, value).
    fn attrs(mut b: &[u8]) -> Vec<(u16, Vec<u8>)> {
        let mut v = Vec::new();
        while b.len() >= 4 {
            let len = u16::from_ne_bytes([b[0], b[1]]) as usize;
            v.push((u16::from_ne_bytes([b[2], b[3]]), b[4..len].to_vec()));
            b = &b[len.next_multiple_of(4).min(b.len())..];
        }
        v
    }

    fn put(attrs: &[(u16, Vec<u8>)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (kind, value) in attrs {
            out.extend(((value.len() + 4) as u16).to_ne_bytes());
            out.extend(kind.to_ne_bytes());
            out.extend(value);
            out.resize(out.len().next_multiple_of(4), 0);
        }
        out
    }

    /// nft 1.0.6 states `NFTA_BITWISE_OP` = `NFT_BITWISE_BOOL` for an explicit `&` (the source
    /// masks), which is what the kernel assumes when the attribute is absent, as in our
    /// messages: drop it from a captured rule before comparing.
    fn without_bitwise_op(msg: &[u8]) -> Vec<u8> {
        const NFT_MSG_NEWRULE: u16 = 6;
        const NESTED: u16 = 0x8000;
        if u16::from_ne_bytes([msg[4], msg[5]]) & 0xff != NFT_MSG_NEWRULE {
            return msg.to_vec();
        }
        let mut top = attrs(&msg[20..]);
        // NFTA_RULE_EXPRESSIONS > NFTA_LIST_ELEM > NFTA_EXPR_NAME "bitwise", NFTA_EXPR_DATA
        for (_, exprs) in top.iter_mut().filter(|(k, _)| *k == 4 | NESTED) {
            let mut list = attrs(exprs);
            for (_, elem) in list.iter_mut() {
                let mut e = attrs(elem);
                if e.iter().any(|(k, v)| *k == 1 && v.starts_with(b"bitwise\0")) {
                    for (_, data) in e.iter_mut().filter(|(k, _)| *k == 2 | NESTED) {
                        *data = put(&attrs(data).into_iter().filter(|(k, _)| *k != 6).collect::<Vec<_>>());
                    }
                }
                *elem = put(&e);
            }
            *exprs = put(&list);
        }
        let body = put(&top);
        let mut out = ((20 + body.len()) as u32).to_ne_bytes().to_vec();
        out.extend(&msg[4..20]);
        out.extend(body);
        out
    }

    fn golden(name: &str) -> Vec<String> {
        let v: Vec<String> = GOLDEN
            .lines()
            .filter_map(|l| l.split_once(' '))
            .filter(|(n, _)| *n == name)
            .map(|(_, h)| {
                let bytes: Vec<u8> =
                    (0..h.len()).step_by(2).map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap()).collect();
                hex(&normalize(&without_bitwise_op(&bytes)))
            })
            .collect();
        assert!(!v.is_empty(), "no golden message {name}");
        v
    }

    fn assert_like_nft(name: &str, op: &NftOp) {
        let ours: Vec<String> =
            messages(std::slice::from_ref(op)).iter().map(|m| hex(&normalize(m))).collect();
        assert_eq!(ours, golden(name), "{name}: ours (left) differs from nft's (right)");
    }

    /// A rule as nft sent it into the capture's table: set ids are nft's cache indexes.
    fn as_captured(op: &NftOp) -> NftOp {
        let NftOp::AddRule { chain, exprs, .. } = op else { return op.clone() };
        let exprs = exprs
            .iter()
            .map(|e| match e {
                RuleExpr::Lookup { sreg, dreg, set, .. } => RuleExpr::Lookup {
                    sreg: *sreg,
                    dreg: *dreg,
                    set: set.clone(),
                    set_id: CACHE.iter().position(|s| s == set).unwrap() as u32 + 1,
                },
                e => e.clone(),
            })
            .collect();
        // the captured gates rule went into prerouting
        let chain = if chain == "output" { "prerouting".to_string() } else { chain.clone() };
        NftOp::AddRule { family: FAMILY, table: TABLE.into(), chain, exprs, comment: None }
    }

    fn rule_case(chain: &str, exprs: &[RuleExpr], n: usize) -> String {
        let set = exprs.iter().find_map(|e| match e {
            RuleExpr::Lookup { set, .. } => Some(set.as_str()),
            _ => None,
        });
        match (chain, set) {
            ("prerouting" | "output", _) => "pm-rule-gates".into(),
            ("hostports4" | "hostports6", Some(s)) => format!("pm-rule-{s}"),
            ("masquerading", _) => format!("pm-rule-masq{}", n),
            ("masquerade4" | "masquerade6", Some(s)) => format!("pm-rule-{s}"),
            ("gate4", _) => "pm-rule-gate4".into(),
            ("gate6", _) => "pm-rule-gate6".into(),
            other => panic!("unexpected rule {other:?}"),
        }
    }

    #[test]
    fn static_part_is_what_nft_sends() {
        let conf = Conf::from_raw(&PortMapConf::default()).unwrap();
        let lens: Lens =
            [(Fam::V4, 24), (Fam::V4, 32), (Fam::V4, 0), (Fam::V6, 64), (Fam::V6, 128), (Fam::V6, 0)].into();
        let mut ops = dnat_ops(&conf, &["gate4_0123456789ab".into(), "gate4".into()], &lens).unwrap();
        ops.extend(masq_ops(&lens, &["masq4".into()]));
        // the map alone, as a table of an earlier layout gets it
        ops.extend(conditions_ops(&crate::layout::conditions(&conf)));
        let mut seen = std::collections::BTreeSet::new();
        let mut masq_rules = 0;
        for op in &ops {
            let case = match op {
                NftOp::AddTable { .. } => "pm-table".to_string(),
                NftOp::AddSet { set, .. } => {
                    // each set was captured as the first of its batch: id 1
                    let mut set = set.clone();
                    set.id = 1;
                    let name = format!("pm-set-{}", set.name);
                    assert_like_nft(&name, &NftOp::AddSet { family: FAMILY, table: TABLE.into(), set });
                    seen.insert(name);
                    continue;
                }
                NftOp::AddChain { chain, base: None, .. } if chain == "hostports4" => "pm-chain".into(),
                NftOp::AddChain { base: None, .. } => continue,
                NftOp::AddChain { chain, .. } => format!("pm-{chain}"),
                NftOp::AddRule { chain, exprs, .. } => {
                    if chain == "masquerading" {
                        masq_rules += 1;
                    }
                    let case = rule_case(chain, exprs, if masq_rules == 1 { 4 } else { 6 });
                    assert_like_nft(&case, &as_captured(op));
                    seen.insert(case);
                    continue;
                }
                NftOp::FlushSet { set, .. } => format!("pm-flush-{set}"),
                NftOp::AddElements { set, .. } if set == "gates" || set == "conditions" => {
                    format!("pm-{set}")
                }
                NftOp::Delete(NftDelete::Flush { .. }) => continue,
                NftOp::Delete(NftDelete::Chain { chain, .. }) => {
                    assert_eq!(chain, "gate4_0123456789ab", "only the old gate chain goes");
                    continue;
                }
                NftOp::Delete(NftDelete::Set { .. }) => "pm-delete-legacy".into(),
                other => panic!("unexpected operation {other:?}"),
            };
            assert_like_nft(&case, op);
            seen.insert(case);
        }
        let captured: std::collections::BTreeSet<String> = GOLDEN
            .lines()
            .filter_map(|l| l.split_once(' ').map(|(n, _)| n.to_string()))
            .filter(|n| !n.starts_with("pm-elem") && !n.starts_with("pm-del-"))
            .collect();
        assert_eq!(seen, captured, "every captured declaration is covered");
        // with conditions the DNAT part is nft syntax: no netlink version
        let mut with = conf.clone();
        with.conditions_v4 = vec!["ip saddr != 10.0.0.0/8".into()];
        assert!(dnat_ops(&with, &[], &lens).is_none());
    }

    #[test]
    fn elements_are_what_nft_sends() {
        let h = Hash([0x12, 0x34, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        let any4 = HostPort { fam: Fam::V4, ip: None, proto: Proto::Tcp, port: 8080 };
        let t4 = Target { ip: "10.0.0.5".parse().unwrap(), port: 80 };
        let net4 = Elem::masq(Masq::new("10.0.0.5/24".parse().unwrap(), t4.ip, Proto::Tcp, 80));
        let netns = Elem::netns(
            h,
            NsId::from_bytes("::f000:1:0:0:2a".parse::<std::net::Ipv6Addr>().unwrap().octets()),
        );
        let hip6 =
            HostPort { fam: Fam::V6, ip: Some("fd00::1".parse().unwrap()), proto: Proto::Udp, port: 53 };
        let cases = [
            ("pm-elem-net4", net4, "n,c,eth0"),
            (
                "pm-elem-net6",
                Elem::masq(Masq::new(
                    "fd00::5/64".parse().unwrap(),
                    "fd00::5".parse().unwrap(),
                    Proto::Udp,
                    53,
                )),
                "n,c,eth0",
            ),
            (
                "pm-elem-net4_0",
                Elem::masq(Masq::new("0.0.0.0/0".parse().unwrap(), t4.ip, Proto::Tcp, 80)),
                "n,c,eth0",
            ),
            ("pm-elem-netns", netns, "/run/netns/cni-1"),
            ("pm-elem-owner", Elem::owner(any4, h), "n,c,eth0"),
            ("pm-elem-claims", Elem::claim(any4, h, t4), "n,c,eth0"),
            ("pm-elem-hp4", Elem::dnat(any4, t4), "n,c,eth0"),
            (
                "pm-elem-hip6",
                Elem::dnat(hip6, Target { ip: "fd00::5".parse().unwrap(), port: 5353 }),
                "n,c,eth0",
            ),
        ];
        let add = |e: &Elem, c: &str| NftOp::AddElements {
            family: FAMILY,
            table: TABLE.into(),
            set: e.set().name(),
            elems: vec![encode(e, Some(c))],
        };
        for (case, e, c) in &cases {
            assert_like_nft(case, &add(e, c));
        }
        let del = |e: &Elem| NftOp::DeleteElements {
            family: FAMILY,
            table: TABLE.into(),
            set: e.set().name(),
            elems: vec![super::codec::encode_key(&e.key)],
        };
        assert_like_nft("pm-del-net4", &del(&net4));
        assert_like_nft("pm-del-netns", &del(&netns));
    }
}
