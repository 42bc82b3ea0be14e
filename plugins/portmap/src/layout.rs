//! The table, declared once: its sets and maps, chains and rules. Everything that needs the
//! layout derives from [`declaration`]: the netlink operations that build or repair it
//! ([`Declaration::setup`]), the `nft -f` text of the one rule that carries user-written
//! conditions, the check of a table read back ([`Declaration::problems`]), STATUS's dry run,
//! the nft text the golden captures are made from ([`Declaration::nft_text`]), cni-migrate and
//! the benchmark's floor.
//!
//! ```text
//! layout        set, one element: the layout version (2)
//! prerouting    (nat, dstnat)   meta nfproto ipv4 ip daddr 127.0.0.0/8 return
//!                               meta nfproto ipv6 ip6 daddr ::1 return
//!                               meta nfproto ipv4 fib daddr type local jump gate4[_<fp>]
//!                               meta nfproto ipv6 fib daddr type local jump gate6[_<fp>]
//! output        (nat, -100)     the two jumps (loopback hostIPs answer only the host itself)
//! gate4[_<fp>]  meta nfproto ipv4 [conditionsV4] jump hostports4   (the name fingerprints
//! gate6[_<fp>]  meta nfproto ipv6 [conditionsV6] jump hostports6    the conditions)
//! hostports4    dnat ip to ip daddr . meta l4proto . th dport map @hip4   (hostIP mappings)
//!               dnat ip to meta l4proto . th dport map @hp4               (all addresses)
//! hostports6    the same with ip6, @hip6, @hp6
//! masquerading  (nat, srcnat)   ct status dnat meta nfproto ipv4 jump masquerade4
//!                               ct status dnat meta nfproto ipv6 jump masquerade6
//! masquerade4   ip saddr & <mask> . ip daddr . meta l4proto . th dport @net4_<len> masquerade
//!               (one rule per source prefix length in use; no mask for /32, no source for /0)
//! masquerade6   the same with ip6 and @net6_<len>
//! localnet      (filter, input) meta nfproto ipv4 ip saddr 127.0.0.0/8 meta iiftype != loopback drop
//!                               meta nfproto ipv4 ip daddr 127.0.0.0/8 meta iiftype != loopback
//!                               ct state & (invalid | untracked) != 0 drop
//!                               meta nfproto ipv4 ip daddr 127.0.0.0/8 meta iiftype != loopback
//!                               ct state & (established | related) == 0 drop
//!                               the same three for ip6 saddr/daddr ::1
//! ```
//!
//! Elements live in `hp4`/`hip4`/`hp6`/`hip6` (DNAT), `owner`, `claims`, `attachments`,
//! `netns` and the `net*` masquerade sets ([`crate::model::Set`]).

use crate::config::{Conditions, Lens};
use crate::model::{Hash, Set};
use cni_common::net::Family;
use cni_common::netlink::nft::{
    listed, BaseChain, CmpOp, ListedSet, NftDelete, NftElem, NftFamily, NftOp, NftRule, NftSet, NftSetData,
    NftType, RuleExpr, Verdict, ARPHRD_LOOPBACK, CT_STATE, CT_STATE_ESTABLISHED_RELATED,
    CT_STATE_INVALID_UNTRACKED, CT_STATUS, CT_STATUS_DST_NAT, HOOK_INPUT, HOOK_OUTPUT, HOOK_POSTROUTING,
    HOOK_PREROUTING, META_IIFTYPE, META_L4PROTO, PAYLOAD_NETWORK_HEADER, PAYLOAD_TRANSPORT_HEADER,
    POLICY_ACCEPT, REG32_00, REG_1, REG_2, REG_3,
};
use ipnet::IpNet;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub const FAMILY: NftFamily = NftFamily::Inet;
pub const TABLE: &str = "cni_portmap";
/// The layout version, the one element of set [`LAYOUT_SET`]. Version 1 (no such set) is the
/// previous release's: `gates`/`conditions` maps, no `attachments` records, no `localnet`
/// guard; ADD upgrades it in place. A table without the version is judged by the shape of its
/// sets ([`unversioned_layout`]), and one of neither layout is refused ([`unfit`]).
pub const VERSION: u16 = 2;
pub const LAYOUT_SET: &str = "layout";
/// Objects of earlier layouts that an upgrade removes (besides gate chains no longer used).
pub const RETIRED_SETS: [&str; 2] = ["gates", "conditions"];

/// A chain: its name and, for a base chain, its hook (with nft's text for it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainDecl {
    pub name: String,
    pub base: Option<(BaseChain, &'static str)>,
}

/// A rule: nft's text for it, its expressions (None for the gate rule with user conditions,
/// which only nft can encode), and its comment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleDecl {
    pub chain: String,
    pub nft: String,
    pub exprs: Option<Vec<RuleExpr>>,
    pub comment: Option<String>,
    /// The chain the rule jumps to, if any.
    pub jump: Option<String>,
}

/// The whole static part of the table for some masquerade prefix lengths and conditions.
#[derive(Debug, Clone)]
pub struct Declaration {
    /// The element sets, in creation order (their position gives their transaction id).
    pub sets: Vec<Set>,
    pub chains: Vec<ChainDecl>,
    pub rules: Vec<RuleDecl>,
}

/// The gate chain of a family: `gate4`, or `gate4_<12 hex digits>` fingerprinting the
/// conditions.
pub fn gate_chain(fam: Family, conds: &[String]) -> String {
    if conds.is_empty() {
        return format!("gate{}", fam.digit());
    }
    let parts: Vec<&[u8]> = conds.iter().map(|c| c.as_bytes()).collect();
    let fp: String = Hash::of(&parts).0[..6].iter().map(|b| format!("{b:02x}")).collect();
    format!("gate{}_{fp}", fam.digit())
}

/// Whether `name` is a gate chain of any conditions (exactly `gate4`, `gate6`, or those with
/// `_` and 12 lowercase hex digits): the only chains found in the table that an upgrade or a
/// change of conditions deletes.
pub fn is_gate_chain(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("gate4").or_else(|| name.strip_prefix("gate6")) else { return false };
    rest.is_empty()
        || rest
            .strip_prefix('_')
            .is_some_and(|h| h.len() == 12 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
}

fn base(kind: &str, hook: u32, priority: i32) -> BaseChain {
    BaseChain { kind: kind.into(), hook, priority, policy: Some(POLICY_ACCEPT) }
}

/// The set's declaration for a transaction: its types and an id unique in the transaction.
pub fn nft_set(set: Set, id: u32) -> NftSet {
    let (key, data) = set.types();
    NftSet {
        name: set.name(),
        key: key.to_vec(),
        data: data.map(|d| NftSetData::Values(d.to_vec())),
        interval: false,
        id,
    }
}

/// `map hp4 { type inet_proto . inet_service : ipv4_addr . inet_service; }`
fn set_text(set: Set) -> String {
    let join = |t: &[NftType]| t.iter().map(|t| t.name()).collect::<Vec<_>>().join(" . ");
    match set.types() {
        (key, None) => format!("set {set} {{ type {}; }}", join(key)),
        (key, Some(d)) => format!("map {set} {{ type {} : {}; }}", join(key), join(d)),
    }
}

fn masq_chain(fam: Family) -> String {
    format!("masquerade{}", fam.digit())
}

fn ip_kw(fam: Family) -> &'static str {
    match fam {
        Family::V4 => "ip",
        Family::V6 => "ip6",
    }
}

/// The netmask of a prefix length.
fn mask(fam: Family, len: u8) -> IpAddr {
    match fam {
        Family::V4 => IpAddr::V4(Ipv4Addr::from(u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0))),
        Family::V6 => IpAddr::V6(Ipv6Addr::from(u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0))),
    }
}

fn octets(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

fn with(mut a: Vec<RuleExpr>, b: impl IntoIterator<Item = RuleExpr>) -> Vec<RuleExpr> {
    a.extend(b);
    a
}

/// `th dport`, `meta l4proto`, a payload load.
fn dport(dreg: u32) -> RuleExpr {
    RuleExpr::Payload { base: PAYLOAD_TRANSPORT_HEADER, offset: 2, len: 2, dreg }
}

fn l4proto(dreg: u32) -> RuleExpr {
    RuleExpr::Meta { key: META_L4PROTO, dreg }
}

fn network(offset: u32, len: u32, dreg: u32) -> RuleExpr {
    RuleExpr::Payload { base: PAYLOAD_NETWORK_HEADER, offset, len, dreg }
}

/// `ct <key> & <bits> == 0` (`Eq`) or `!= 0` (`Neq`: the flag test `ct status dnat`).
fn ct_bits(key: u32, bits: u32, op: CmpOp) -> Vec<RuleExpr> {
    vec![
        RuleExpr::Ct { key, dreg: REG_1 },
        RuleExpr::Bitwise { sreg: REG_1, dreg: REG_1, mask: bits.to_ne_bytes().to_vec(), xor: vec![0; 4] },
        RuleExpr::Cmp { sreg: REG_1, op, data: vec![0; 4] },
    ]
}

impl Declaration {
    fn set_id(&self, set: Set) -> u32 {
        self.sets.iter().position(|s| *s == set).map_or(0, |i| i as u32 + 2)
    }

    fn lookup(&self, set: Set, dreg: Option<u32>) -> RuleExpr {
        RuleExpr::Lookup { sreg: REG_1, dreg, set: set.name(), set_id: self.set_id(set) }
    }

    fn rule(&mut self, chain: &str, nft: String, exprs: Option<Vec<RuleExpr>>, comment: Option<String>) {
        let jump = exprs.as_ref().and_then(|e| {
            e.iter().find_map(|x| match x {
                RuleExpr::Verdict(Verdict::Jump(c) | Verdict::Goto(c)) => Some(c.clone()),
                _ => None,
            })
        });
        self.rules.push(RuleDecl { chain: chain.into(), nft, exprs, comment, jump });
    }

    /// The DNAT rules of a family's `hostports` chain.
    fn hostports(&mut self, fam: Family) {
        let (ip, digit) = (ip_kw(fam), fam.digit());
        let chain = format!("hostports{digit}");
        // registers as nft allocates them after a host address (4 or 16 bytes) in register 1
        let (daddr, after_addr) = match fam {
            Family::V4 => (network(16, 4, REG_1), [l4proto(REG32_00 + 1), dport(REG32_00 + 2)]),
            Family::V6 => (network(24, 16, REG_1), [l4proto(REG_2), dport(REG32_00 + 5)]),
        };
        let dnat = RuleExpr::Dnat {
            family: u32::from(fam.nfproto()),
            reg_addr: REG_1,
            reg_proto: if fam == Family::V4 { REG32_00 + 1 } else { REG_2 },
        };
        let hip = with(RuleExpr::nfproto(fam == Family::V4), [daddr]);
        let hip = with(with(hip, after_addr), [self.lookup(Set::Hip(fam), Some(REG_1)), dnat.clone()]);
        let hp = vec![l4proto(REG_1), dport(REG32_00 + 1), self.lookup(Set::Hp(fam), Some(REG_1)), dnat];
        self.rule(
            &chain,
            format!("dnat {ip} to {ip} daddr . meta l4proto . th dport map @hip{digit}"),
            Some(hip),
            None,
        );
        self.rule(&chain, format!("dnat {ip} to meta l4proto . th dport map @hp{digit}"), Some(hp), None);
    }

    /// The masquerade rule of one source prefix length.
    fn masq_rule(&mut self, fam: Family, len: u8) {
        let ip = ip_kw(fam);
        let set = Set::Net(fam, len);
        let (alen, saddr_off, daddr_off) = match fam {
            Family::V4 => (4, 12, 16),
            Family::V6 => (16, 8, 24),
        };
        // registers of daddr, l4proto and dport, after the source (if any) in register 1
        let regs = match (fam, len) {
            (Family::V4, 0) => [REG_1, REG32_00 + 1, REG32_00 + 2],
            (Family::V6, 0) => [REG_1, REG_2, REG32_00 + 5],
            (Family::V4, _) => [REG32_00 + 1, REG32_00 + 2, REG32_00 + 3],
            (Family::V6, _) => [REG_2, REG_3, REG32_00 + 9],
        };
        let mut e = RuleExpr::nfproto(fam == Family::V4);
        let saddr = match len {
            0 => String::new(),
            _ if len == fam.max_prefix() => format!("{ip} saddr . "),
            _ => format!("{ip} saddr & {} . ", mask(fam, len)),
        };
        if len > 0 {
            e.push(network(saddr_off, alen, REG_1));
        }
        if len > 0 && len != fam.max_prefix() {
            let m = octets(mask(fam, len));
            e.push(RuleExpr::Bitwise { sreg: REG_1, dreg: REG_1, xor: vec![0; m.len()], mask: m });
        }
        e.extend([
            network(daddr_off, alen, regs[0]),
            l4proto(regs[1]),
            dport(regs[2]),
            self.lookup(set, None),
            RuleExpr::Masquerade,
        ]);
        let text = format!("{saddr}{ip} daddr . meta l4proto . th dport @{set} masquerade");
        self.rule(&masq_chain(fam), text, Some(e), None);
    }

    /// The guard of a family, three rules. First, what arrives on a non-loopback interface
    /// *from* a loopback address is dropped, whatever conntrack says (`route_localnet` lifts
    /// the kernel's martian check for sources too: a container could reach services on
    /// 0.0.0.0 as 127.0.0.x, or inject into the reply side of the host's loopback flows; issue
    /// 27 finding 6). Then what arrives on a non-loopback interface *for* the loopback addresses
    /// is dropped unless it belongs to a connection conntrack knows as established or related
    /// (the replies of the host's own connections to `127.0.0.1:<hostPort>`, which were DNATed
    /// out and masqueraded). No DNAT of ours targets a loopback address (portmap refuses such
    /// container addresses), so a DNATed new connection has no exemption (finding 4).
    ///
    /// A packet conntrack has no entry for (one it calls invalid, e.g. TCP with SYN and FIN
    /// set, or one marked untracked) has no `ct state` bit of established or related; it is
    /// dropped by the second rule, whose `ct state` test sees the invalid or untracked bit.
    fn guard(&mut self, fam: Family) {
        let (ip, dst, text_dst): (_, IpNet, _) = match fam {
            Family::V4 => ("ip", "127.0.0.0/8".parse().expect("a prefix"), "127.0.0.0/8"),
            Family::V6 => ("ip6", "::1/128".parse().expect("a prefix"), "::1"),
        };
        let mut head = RuleExpr::nfproto(fam == Family::V4);
        head.extend(RuleExpr::addr(false, dst, CmpOp::Eq));
        head.push(RuleExpr::Meta { key: META_IIFTYPE, dreg: REG_1 });
        head.push(RuleExpr::Cmp {
            sreg: REG_1,
            op: CmpOp::Neq,
            data: ARPHRD_LOOPBACK.to_ne_bytes().to_vec(),
        });
        let head_text =
            format!("meta nfproto {} {ip} daddr {text_dst} meta iiftype != loopback", fam.nft_keyword());
        let mut from_lo = RuleExpr::nfproto(fam == Family::V4);
        from_lo.extend(RuleExpr::addr(true, dst, CmpOp::Eq));
        from_lo.extend(head[head.len() - 2..].iter().cloned());
        from_lo.push(RuleExpr::Verdict(Verdict::Drop));
        let text =
            format!("meta nfproto {} {ip} saddr {text_dst} meta iiftype != loopback drop", fam.nft_keyword());
        self.rule("localnet", text, Some(from_lo), None);
        let mut untracked = head.clone();
        untracked.extend(ct_bits(CT_STATE, CT_STATE_INVALID_UNTRACKED, CmpOp::Neq));
        untracked.push(RuleExpr::Verdict(Verdict::Drop));
        let text = format!("{head_text} ct state & (invalid | untracked) != 0 drop");
        self.rule("localnet", text, Some(untracked), None);
        let mut e = head;
        e.extend(ct_bits(CT_STATE, CT_STATE_ESTABLISHED_RELATED, CmpOp::Eq));
        e.push(RuleExpr::Verdict(Verdict::Drop));
        let text = format!("{head_text} ct state & (established | related) == 0 drop");
        self.rule("localnet", text, Some(e), None);
    }
}

/// The declaration for masquerade prefix lengths `lens` and conditions `conds`.
pub fn declaration(lens: &Lens, conds: &Conditions) -> Declaration {
    let mut sets = Set::FIXED.to_vec();
    sets.extend(lens.iter().map(|(f, len)| Set::Net(*f, *len)));
    let gates: Vec<(Family, String)> =
        Family::BOTH.iter().map(|f| (*f, gate_chain(*f, conds.of(*f)))).collect();
    let chain = |name: &str| ChainDecl { name: name.into(), base: None };
    let mut chains = vec![
        ChainDecl {
            name: "prerouting".into(),
            base: Some((
                base("nat", HOOK_PREROUTING, -100),
                "type nat hook prerouting priority dstnat; policy accept;",
            )),
        },
        ChainDecl {
            name: "output".into(),
            base: Some((
                base("nat", HOOK_OUTPUT, -100),
                "type nat hook output priority -100; policy accept;",
            )),
        },
        ChainDecl {
            name: "masquerading".into(),
            base: Some((
                base("nat", HOOK_POSTROUTING, 100),
                "type nat hook postrouting priority srcnat; policy accept;",
            )),
        },
        ChainDecl {
            name: "localnet".into(),
            base: Some((
                base("filter", HOOK_INPUT, 0),
                "type filter hook input priority filter; policy accept;",
            )),
        },
        chain("hostports4"),
        chain("hostports6"),
        chain("masquerade4"),
        chain("masquerade6"),
    ];
    chains.extend(gates.iter().map(|(_, g)| chain(g)));
    let mut d = Declaration { sets, chains, rules: Vec::new() };
    // Loopback destinations arriving from outside are never DNATed: a `hostIP` of 127.0.0.1 or
    // ::1 answers only the host's own connections (the output hook), not a container on a
    // bridge with route_localnet (issue 27 finding 3); the guard then drops them.
    for fam in Family::BOTH {
        let (ip, dst, text_dst): (_, IpNet, _) = match fam {
            Family::V4 => ("ip", "127.0.0.0/8".parse().expect("a prefix"), "127.0.0.0/8"),
            Family::V6 => ("ip6", "::1/128".parse().expect("a prefix"), "::1"),
        };
        let mut e = RuleExpr::nfproto(fam == Family::V4);
        e.extend(RuleExpr::addr(false, dst, CmpOp::Eq));
        e.push(RuleExpr::Verdict(Verdict::Return));
        d.rule(
            "prerouting",
            format!("meta nfproto {} {ip} daddr {text_dst} return", fam.nft_keyword()),
            Some(e),
            None,
        );
    }
    for hook in ["prerouting", "output"] {
        for (fam, gate) in &gates {
            let e = with(
                with(RuleExpr::nfproto(*fam == Family::V4), RuleExpr::daddr_type_local(CmpOp::Eq)),
                [RuleExpr::Verdict(Verdict::Jump(gate.clone()))],
            );
            d.rule(
                hook,
                format!("meta nfproto {} fib daddr type local jump {gate}", fam.nft_keyword()),
                Some(e),
                None,
            );
        }
    }
    for (fam, gate) in &gates {
        let c = conds.of(*fam);
        let target = format!("hostports{}", fam.digit());
        let exprs = c.is_empty().then(|| {
            with(RuleExpr::nfproto(*fam == Family::V4), [RuleExpr::Verdict(Verdict::Jump(target.clone()))])
        });
        let conds_text: String = c.iter().map(|t| format!("{t} ")).collect();
        d.rule(gate, format!("meta nfproto {} {conds_text}jump {target}", fam.nft_keyword()), exprs, None);
        d.rules.last_mut().expect("just added").jump = Some(target);
    }
    d.hostports(Family::V4);
    d.hostports(Family::V6);
    for fam in Family::BOTH {
        let mut e = ct_bits(CT_STATUS, CT_STATUS_DST_NAT, CmpOp::Neq);
        e.extend(RuleExpr::nfproto(fam == Family::V4));
        e.push(RuleExpr::Verdict(Verdict::Jump(masq_chain(fam))));
        let text = format!("ct status dnat meta nfproto {} jump {}", fam.nft_keyword(), masq_chain(fam));
        d.rule("masquerading", text, Some(e), None);
    }
    for (fam, len) in lens {
        d.masq_rule(*fam, *len);
    }
    d.guard(Family::V4);
    d.guard(Family::V6);
    d
}

/// The table's objects as read back: what [`Declaration::setup`] compares with.
#[derive(Debug, Clone, Default)]
pub struct Found {
    /// The table exists.
    pub table: bool,
    /// The version element of [`LAYOUT_SET`] is [`VERSION`].
    pub current: bool,
    pub rules: Vec<NftRule>,
    /// Chains whose references were counted (a point read): name, the count the declaration
    /// expects, and the count found (None: no such chain).
    pub uses: Vec<(String, u32, Option<u32>)>,
    /// Sets (names and shapes) and chain names (None when not listed: a point read).
    pub sets: Option<Vec<ListedSet>>,
    pub chains: Option<Vec<String>>,
}

impl Found {
    /// Whether a point read found the table of this layout with every chain in place, the
    /// hooks included (the jumps of `prerouting` and `output` into the gate chains of the
    /// conditions read for, the gates' jumps into `hostports4`/`6`, the guard's rules): by the
    /// kernel's reference counts, no rule read. What an ADD relies on; every rule is compared
    /// by CHECK and by every full read.
    pub fn hooked(&self) -> bool {
        self.table
            && self.current
            && !self.uses.is_empty()
            && self.uses.iter().all(|(_, want, got)| *got == Some(*want))
    }
}

/// What the static part needs: netlink operations, and an `nft -f` script to run before them
/// (gate chains with conditions).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Setup {
    pub ops: Vec<NftOp>,
    pub nft: Option<String>,
}

/// The prefix lengths of the masquerade rules found (the sets in use).
pub fn lens_in(rules: &[NftRule]) -> Lens {
    rules
        .iter()
        .filter(|r| r.chain == "masquerade4" || r.chain == "masquerade6")
        .flat_map(|r| r.exprs.iter())
        .filter_map(|e| match e {
            cni_common::netlink::nft::NftExpr::Lookup { set } => match Set::parse(set) {
                Some(Set::Net(f, len)) => Some((f, len)),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

/// The `layout` set (its one element: the version).
fn layout_set() -> NftSet {
    NftSet { name: LAYOUT_SET.into(), key: vec![NftType::InetService], data: None, interval: false, id: 1 }
}

/// A set of layout 2 by name, as it is declared: `layout` and the element sets
/// ([`Set::parse`]); None for any other name.
fn layout_2_set(name: &str) -> Option<NftSet> {
    if name == LAYOUT_SET {
        return Some(layout_set());
    }
    Set::parse(name).map(|s| nft_set(s, 0))
}

/// A set of layout 1 (the release, 5fca5c6) by name, as it declared it: the element sets of
/// layout 2 but `attachments`, with the same types, and the `gates` (`nf_proto : verdict`) and
/// `conditions` (`nf_proto : ipv6_addr`) maps; None for any other name.
fn layout_1_set(name: &str) -> Option<NftSet> {
    let map = |data| NftSet {
        name: name.into(),
        key: vec![NftType::NfProto],
        data: Some(data),
        interval: false,
        id: 0,
    };
    match name {
        "gates" => Some(map(NftSetData::Verdict)),
        "conditions" => Some(map(NftSetData::Values(vec![NftType::Ipv6Addr]))),
        _ => Set::parse(name).filter(|s| *s != Set::Attachments).map(|s| nft_set(s, 0)),
    }
}

/// What keeps the sets found from being those of a layout (`set_of`: its set of a name), one
/// line per set (empty: they are, some sets perhaps missing).
fn misfits(sets: &[ListedSet], set_of: fn(&str) -> Option<NftSet>) -> Vec<String> {
    sets.iter()
        .filter_map(|x| match set_of(&x.name) {
            None => Some(format!("set {} is not one of its sets", x.name)),
            Some(d) if d.shape() != x.shape => {
                Some(format!("set {} is `{}` instead of `{}`", x.name, x.shape, d.shape()))
            }
            Some(_) => None,
        })
        .collect()
}

/// The layout of a table whose `layout` set has no version element, decided by the shape of
/// its sets (flags, key and data types): 1 when each is a set layout 1 had, with its types (the
/// previous release's table); 2 when each is one of this layout (a table of this layout that
/// lost its version element); else what differs from the nearer of the two (both when they
/// are as near), for a message.
pub fn unversioned_layout(sets: &[ListedSet]) -> Result<u16, String> {
    let (one, two) = (misfits(sets, layout_1_set), misfits(sets, layout_2_set));
    if one.is_empty() {
        return Ok(1);
    }
    if two.is_empty() {
        return Ok(2);
    }
    Err(match one.len().cmp(&two.len()) {
        std::cmp::Ordering::Less => format!("against layout 1, the nearer: {}", one.join("; ")),
        std::cmp::Ordering::Greater => format!("against layout {VERSION}, the nearer: {}", two.join("; ")),
        std::cmp::Ordering::Equal => {
            format!("against layout 1: {}; against layout {VERSION}: {}", one.join("; "), two.join("; "))
        }
    })
}

/// Why this build must leave the table found alone, judging by the shape of its sets: a table
/// without the version element that is neither of layout 1 nor of layout 2, or a table of
/// layout 2 with a set of this layout's name but another shape (whose elements nobody could
/// read or write as they are). None when it fits, or when the read listed no sets (a point
/// read, which a full read follows whenever the table is not of this layout).
pub fn unfit(found: &Found) -> Option<String> {
    let sets = found.sets.as_ref()?;
    let t = format!("{} {TABLE}", FAMILY.keyword());
    let change =
        "this build changes nothing in it: delete the table (its host ports stop working), or use the build \
                  that made it";
    if found.current {
        let known: Vec<ListedSet> =
            sets.iter().filter(|x| layout_2_set(&x.name).is_some()).cloned().collect();
        let bad = misfits(&known, layout_2_set);
        return (!bad.is_empty())
            .then(|| format!("table {t} is of layout {VERSION} but {}; {change}", bad.join("; ")));
    }
    unversioned_layout(sets).err().map(|why| {
        format!("table {t} has no layout version and its sets fit neither layout 1 nor layout {VERSION} ({why}); {change}")
    })
}

/// The version element.
fn version_elem() -> NftElem {
    NftElem::new(VERSION.to_be_bytes().to_vec()).comment("portmap table layout version")
}

/// The look-up that tells whether a table is of this layout: (set, key).
pub fn version_key() -> (String, Vec<u8>) {
    (LAYOUT_SET.into(), VERSION.to_be_bytes().to_vec())
}

impl Declaration {
    /// The rules of `chain` as declared.
    fn chain_rules<'a>(&'a self, chain: &'a str) -> impl Iterator<Item = &'a RuleDecl> + 'a {
        self.rules.iter().filter(move |r| r.chain == chain)
    }

    /// Whether the rules found in `chain` are the declared ones: each the same expressions
    /// as a dump lists them (a rule with user conditions: ends with the same jump) and the
    /// same comment.
    fn chain_intact(&self, chain: &str, found: &[NftRule]) -> bool {
        self.chain_difference(chain, found).is_none()
    }

    /// How the rules found in `chain` differ from the declared ones (`None`: they do not), in
    /// words a report can carry: the counts, or the first rule that differs.
    fn chain_difference(&self, chain: &str, found: &[NftRule]) -> Option<String> {
        let have: Vec<&NftRule> = found.iter().filter(|r| r.chain == chain).collect();
        let want: Vec<&RuleDecl> = self.chain_rules(chain).collect();
        if have.len() != want.len() {
            return Some(format!("{} rules found, {} declared", have.len(), want.len()));
        }
        let same = |h: &NftRule, w: &RuleDecl| {
            h.comment == w.comment
                && match &w.exprs {
                    Some(e) => h.exprs == listed(e),
                    None => {
                        h.exprs.last()
                            == listed(&[RuleExpr::Verdict(Verdict::Jump(format!(
                                "hostports{}",
                                &chain[4..5]
                            )))])
                            .last()
                    }
                }
        };
        let i = have.iter().zip(&want).position(|(h, w)| !same(h, w))?;
        Some(format!("rule {} of {} differs, handle {}", i + 1, want.len(), have[i].handle))
    }

    /// The reference count the kernel keeps for each chain whose rules do not depend on the
    /// prefix lengths in use (all but `masquerade4`/`6`): its rules plus the jumps into it
    /// (`NFTA_CHAIN_USE` counts both), as declared.
    pub fn uses(&self) -> Vec<(String, u32)> {
        let count = |f: &dyn Fn(&RuleDecl) -> bool| self.rules.iter().filter(|r| f(r)).count() as u32;
        self.chains
            .iter()
            .filter(|c| !c.name.starts_with("masquerade") || c.name == "masquerading")
            .map(|c| {
                let n =
                    count(&|r| r.chain == c.name) + count(&|r| r.jump.as_deref() == Some(c.name.as_str()));
                (c.name.clone(), n)
            })
            .collect()
    }

    /// What is wrong with the static part found, one line each (empty: intact).
    pub fn problems(&self, found: &Found) -> Vec<String> {
        let t = format!("{} {TABLE}", FAMILY.keyword());
        if !found.table {
            return vec![format!("table {t} does not exist")];
        }
        let mut out = Vec::new();
        if !found.current {
            out.push(format!("table {t} is not of layout {VERSION} (set {LAYOUT_SET} lacks the version)"));
        }
        for c in &self.chains {
            if let Some(how) = self.chain_difference(&c.name, &found.rules) {
                out.push(format!("chain {} does not hold the rules of this layout ({how})", c.name));
            }
        }
        if let Some(sets) = &found.sets {
            for s in &self.sets {
                if !sets.iter().any(|x| x.name == s.name()) {
                    out.push(format!("set {s} is missing"));
                }
            }
            for s in sets.iter().filter(|s| RETIRED_SETS.contains(&s.name.as_str())) {
                out.push(format!("set {} of an earlier layout is still there", s.name));
            }
        }
        if let Some(chains) = &found.chains {
            for c in chains.iter().filter(|c| is_gate_chain(c) && !self.chains.iter().any(|d| d.name == **c))
            {
                out.push(format!("gate chain {c} is no longer used"));
            }
        }
        out
    }

    /// The operations that make the table found what is declared, leaving the elements as
    /// they are: nothing when it is intact. Every object is added (a no-op for those that
    /// exist), each chain whose rules differ is flushed and refilled, the version element
    /// written, and (when `found` lists them) retired maps and unused gate chains deleted
    /// after the chains that used them are refilled. A gate chain with conditions is written
    /// by the `nft -f` script, to run first.
    pub fn setup(&self, found: &Found) -> Setup {
        if found.table && self.problems(found).is_empty() {
            return Setup::default();
        }
        let tn = TABLE.to_string();
        let mut ops = vec![NftOp::AddTable { family: FAMILY, table: tn.clone(), comment: None }];
        ops.push(NftOp::AddSet { family: FAMILY, table: tn.clone(), set: layout_set() });
        ops.extend(self.sets.iter().map(|s| NftOp::AddSet {
            family: FAMILY,
            table: tn.clone(),
            set: nft_set(*s, self.set_id(*s)),
        }));
        for c in &self.chains {
            let base = c.base.as_ref().map(|(b, _)| b.clone());
            ops.push(NftOp::AddChain {
                family: FAMILY,
                table: tn.clone(),
                chain: c.name.clone(),
                base,
                comment: None,
            });
        }
        let mut script = String::new();
        for c in &self.chains {
            if found.table && self.chain_intact(&c.name, &found.rules) {
                continue;
            }
            let rules: Vec<&RuleDecl> = self.chain_rules(&c.name).collect();
            if rules.iter().any(|r| r.exprs.is_none()) {
                // only nft can encode user conditions: the chain is rewritten by nft
                let _ = writeln!(script, "add table {} {tn}", FAMILY.keyword());
                for dep in ["hostports4", "hostports6", &c.name] {
                    let _ = writeln!(script, "add chain {} {tn} {dep}", FAMILY.keyword());
                }
                let _ = writeln!(script, "flush chain {} {tn} {}", FAMILY.keyword(), c.name);
                for r in rules {
                    let _ = writeln!(script, "add rule {} {tn} {} {}", FAMILY.keyword(), c.name, r.nft);
                }
                continue;
            }
            ops.push(NftOp::Delete(NftDelete::Flush {
                family: FAMILY,
                table: tn.clone(),
                chain: c.name.clone(),
            }));
            for r in rules {
                let exprs = r.exprs.clone().expect("netlink rule");
                ops.push(NftOp::rule(FAMILY, TABLE, &c.name, exprs, r.comment.as_deref()));
            }
        }
        if !found.current {
            ops.push(NftOp::FlushSet { family: FAMILY, table: tn.clone(), set: LAYOUT_SET.into() });
            ops.push(NftOp::AddElements {
                family: FAMILY,
                table: tn.clone(),
                set: LAYOUT_SET.into(),
                elems: vec![version_elem()],
            });
        }
        for s in found.sets.iter().flatten().filter(|s| RETIRED_SETS.contains(&s.name.as_str())) {
            ops.push(NftOp::Delete(NftDelete::Set {
                family: FAMILY,
                table: tn.clone(),
                set: s.name.clone(),
            }));
        }
        for c in found.chains.iter().flatten() {
            if is_gate_chain(c) && !self.chains.iter().any(|d| d.name == *c) {
                ops.push(NftOp::Delete(NftDelete::Flush {
                    family: FAMILY,
                    table: tn.clone(),
                    chain: c.clone(),
                }));
                ops.push(NftOp::Delete(NftDelete::Chain {
                    family: FAMILY,
                    table: tn.clone(),
                    chain: c.clone(),
                }));
            }
        }
        Setup { ops, nft: (!script.is_empty()).then_some(script) }
    }

    /// The whole table in nft syntax (`nft -f` input): what the golden captures are made
    /// from, and what STATUS checks with `nft -c` when conditions need nft.
    pub fn nft_text(&self) -> String {
        let kw = FAMILY.keyword();
        let mut s = format!("table {kw} {TABLE} {{\n    set {LAYOUT_SET} {{ type inet_service; }}\n");
        for set in &self.sets {
            let _ = writeln!(s, "    {}", set_text(*set));
        }
        for c in &self.chains {
            match &c.base {
                Some((_, text)) => {
                    let _ = writeln!(s, "    chain {} {{ {text} }}", c.name);
                }
                None => {
                    let _ = writeln!(s, "    chain {} {{ }}", c.name);
                }
            }
        }
        s.push_str("}\n");
        for r in &self.rules {
            let comment = r.comment.as_ref().map(|c| format!(" comment \"{c}\"")).unwrap_or_default();
            let _ = writeln!(s, "add rule {kw} {TABLE} {} {}{comment}", r.chain, r.nft);
        }
        let _ = writeln!(
            s,
            "add element {kw} {TABLE} {LAYOUT_SET} {{ {VERSION} comment \"portmap table layout version\" }}"
        );
        s
    }
}

/// One element of each kind of set, named by its case.
#[cfg(test)]
pub fn sample_elements() -> Vec<(&'static str, crate::model::Elem)> {
    use crate::model::{Elem, HostPort, Masq, NsId, Target};
    use cni_common::net::Proto;
    let h = Hash([0x12, 0x34, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
    let any4 = HostPort { fam: Family::V4, ip: None, proto: Proto::Tcp, port: 8080 };
    let t4 = Target { ip: "10.0.0.5".parse().expect("ip"), port: 80 };
    let hip6 =
        HostPort { fam: Family::V6, ip: Some("fd00::1".parse().expect("ip")), proto: Proto::Udp, port: 53 };
    let m = |src: &str, ctr: &str, p: Proto, port: u16| {
        Elem::masq(Masq::new(src.parse().expect("net"), ctr.parse().expect("ip"), p, port))
    };
    vec![
        ("hp4", Elem::dnat(any4, t4)),
        ("hip6", Elem::dnat(hip6, Target { ip: "fd00::5".parse().expect("ip"), port: 5353 })),
        ("owner", Elem::owner(any4, h)),
        ("claims", Elem::claim(any4, h, t4)),
        ("attachments", Elem::attachment(h, Hash([0xab; 16]))),
        ("netns", Elem::netns(h, NsId { ino: 0xf000_0001, cookie: 42 })),
        ("net4_24", m("10.0.0.5/24", "10.0.0.5", Proto::Tcp, 80)),
        ("net4_0", m("0.0.0.0/0", "10.0.0.5", Proto::Tcp, 80)),
        ("net6_64", m("fd00::5/64", "fd00::5", Proto::Udp, 53)),
    ]
}

/// The masquerade prefix lengths of the golden capture: with and without a mask, and no source
/// at all, in each family.
#[cfg(test)]
pub fn capture_lens() -> Lens {
    [
        (Family::V4, 24),
        (Family::V4, 32),
        (Family::V4, 0),
        (Family::V6, 64),
        (Family::V6, 128),
        (Family::V6, 0),
    ]
    .into()
}

/// The cases of the golden capture (testdata/capture-cases.txt, made from the declaration by
/// [`tests::the_capture_cases_follow_the_declaration`]; testdata/capture-nft.py runs each with
/// nft 1.0.6 and records the messages in testdata/nft-golden.txt): (name, setup, command).
#[cfg(test)]
pub fn capture_cases() -> Vec<(String, String, String)> {
    let d = declaration(&capture_lens(), &Conditions::default());
    let kw = FAMILY.keyword();
    let t = format!("{kw} {TABLE}");
    let full = d.nft_text();
    let full = full[..full.find("\n}\n").expect("table block") + 3].to_string();
    let mut v = vec![("table".to_string(), String::new(), format!("add table {t}"))];
    let add_table = format!("add table {t}");
    v.push((
        format!("set-{LAYOUT_SET}"),
        add_table.clone(),
        format!("add set {t} {LAYOUT_SET} {{ type inet_service; }}"),
    ));
    for s in &d.sets {
        v.push((
            format!("set-{s}"),
            add_table.clone(),
            format!("add {t} {}", set_text(*s)).replacen(" set ", " set ", 1),
        ));
    }
    // `add set inet cni_portmap x { … }` / `add map …`: nft's command form of the declaration
    for c in v.iter_mut().filter(|c| c.0.starts_with("set-") && c.0 != format!("set-{LAYOUT_SET}")) {
        let decl = c.2.trim_start_matches(&format!("add {t} ")).to_string();
        let (kind, rest) = decl.split_once(' ').expect("kind and name");
        c.2 = format!("add {kind} {t} {rest}");
    }
    for c in &d.chains {
        if let Some((_, text)) = &c.base {
            v.push((
                format!("chain-{}", c.name),
                add_table.clone(),
                format!("add chain {t} {} {{ {text} }}", c.name),
            ));
        }
    }
    v.push(("chain".into(), add_table.clone(), format!("add chain {t} hostports4")));
    for (i, r) in d.rules.iter().enumerate() {
        v.push((format!("rule-{i}"), full.clone(), format!("add rule {t} {} {}", r.chain, r.nft)));
    }
    v.push((
        "layout-elem".into(),
        full.clone(),
        format!("add element {t} {LAYOUT_SET} {{ {VERSION} comment \"portmap table layout version\" }}"),
    ));
    for (name, e) in sample_elements() {
        let data = if e.data.is_some() { format!(" : {}", e.data_text()) } else { String::new() };
        v.push((
            format!("elem-{name}"),
            full.clone(),
            format!("add element {t} {} {{ {} comment \"n,c,eth0\"{data} }}", e.set(), e.key),
        ));
        v.push((
            format!("del-{name}"),
            format!("{full}add element {t} {} {{ {}{data} }}\n", e.set(), e.key),
            format!("delete element {t} {} {{ {} }}", e.set(), e.key),
        ));
    }
    v
}

/// Register numbers are nft's: the assertion that our expressions are what nft sends is the
/// golden test ([`tests`]); the assertion that the kernel lists them as [`listed`] predicts is
/// a kernel test (tests/e2e/portmap.rs).
#[cfg(test)]
mod tests;
