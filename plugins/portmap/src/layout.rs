//! The static part of the table: its sets, chains and rules, in nft syntax (for `nft -f` when
//! conditions are configured; [`crate::wire::setup`] sends the same objects over netlink), and
//! the checks that it is intact.
//!
//! ```text
//! prerouting   (nat, dstnat)  fib daddr type local meta nfproto vmap @gates
//! output       (nat, -100)    fib daddr type local meta nfproto vmap @gates
//! gates        nf_proto : verdict      ipv4 : jump gate4[_<fp>], ipv6 : jump gate6[_<fp>]
//! conditions   nf_proto : ipv6_addr    ipv4 : <hash of gate4[_<fp>]>, ipv6 : <hash of gate6[_<fp>]>
//! gate4[_fp]   meta nfproto ipv4 [conditionsV4] jump hostports4   (the name fingerprints them)
//! hostports4   dnat ip to ip daddr . meta l4proto . th dport map @hip4
//!              dnat ip to meta l4proto . th dport map @hp4
//! hostports6   (the same for ip6, @hip6 / @hp6)
//! masquerading (nat, srcnat)  ct status dnat meta nfproto ipv4 jump masquerade4
//!                             ct status dnat meta nfproto ipv6 jump masquerade6
//! masquerade4  ip saddr & <mask /len> . ip daddr . meta l4proto . th dport @net4_<len> masquerade
//!              (one rule per prefix length in use; no mask for /32, no source for /0)
//! masquerade6  (the same for ip6 and @net6_<len>)
//! ```
//!
//! The DNAT part (everything but the masquerade chains and the `net*` sets) depends on the
//! conditions; the masquerade part does not, so it is always built over netlink.
//!
//! `conditions` states, with plain values, what `gates` says with verdicts: which gate chain
//! (and so which conditions) each family goes through. The fast ADD re-adds these two
//! elements to prove that the DNAT part was built for its conditions (the kernel refuses an
//! element whose key exists with other data), instead of re-adding the `gates` elements:
//! a jump verdict in a transaction makes older kernels validate every table of the network
//! namespace (per-namespace validation state, e.g. kube-proxy's tens of thousands of rules),
//! a plain value never does. `gates` is written only when the DNAT part is (re)built.

use crate::config::{Conf, Fam};
use crate::model::{Hash, Set};
use crate::owner::{hex, sha};
use crate::table::Listing;
use cni_common::netlink::nft::NftType;
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub const FAMILY: &str = "inet";
pub const TABLE: &str = "cni_portmap";

/// Prefix lengths (per family) of the masquerade sets in use.
pub type Lens = BTreeSet<(Fam, u8)>;

/// Key and data types of a set or map (data: None for a set, Some(None) for a verdict map).
pub fn set_types(set: Set) -> (Vec<NftType>, Option<Option<Vec<NftType>>>) {
    use NftType::*;
    let addr = |f: Fam| if f == Fam::V4 { Ipv4Addr } else { Ipv6Addr };
    match set {
        Set::Hp(f) => (vec![InetProto, InetService], Some(Some(vec![addr(f), InetService]))),
        Set::Hip(f) => (vec![addr(f), InetProto, InetService], Some(Some(vec![addr(f), InetService]))),
        Set::Owner => (vec![Ipv6Addr, InetProto, InetService], Some(Some(vec![Ipv6Addr]))),
        Set::Claims => {
            (vec![Ipv6Addr, InetProto, InetService, Ipv6Addr], Some(Some(vec![Ipv6Addr, InetService])))
        }
        Set::Netns => (vec![Ipv6Addr], Some(Some(vec![Ipv6Addr]))),
        Set::Net(f, 0) => (vec![addr(f), InetProto, InetService], None),
        Set::Net(f, _) => (vec![addr(f), addr(f), InetProto, InetService], None),
        Set::Gates => (vec![NfProto], Some(None)),
        Set::Conditions => (vec![NfProto], Some(Some(vec![Ipv6Addr]))),
    }
}

fn type_name(t: NftType) -> &'static str {
    match t {
        NftType::NfProto => "nf_proto",
        NftType::Ipv4Addr => "ipv4_addr",
        NftType::Ipv6Addr => "ipv6_addr",
        NftType::InetProto => "inet_proto",
        NftType::InetService => "inet_service",
    }
}

/// `map hp4 { type inet_proto . inet_service : ipv4_addr . inet_service; }`
pub fn set_declaration(set: Set) -> String {
    let join = |t: &[NftType]| t.iter().map(|t| type_name(*t)).collect::<Vec<_>>().join(" . ");
    let (key, data) = set_types(set);
    match data {
        None => format!("set {set} {{ type {}; }}", join(&key)),
        Some(None) => format!("map {set} {{ type {} : verdict; }}", join(&key)),
        Some(Some(d)) => format!("map {set} {{ type {} : {}; }}", join(&key), join(&d)),
    }
}

/// Every set of the layout for `lens`, in creation order.
pub fn sets(lens: &Lens) -> Vec<Set> {
    let mut v = Set::FIXED.to_vec();
    v.extend(lens.iter().map(|(f, len)| Set::Net(*f, *len)));
    v
}

/// Names of the gate chains for the configured conditions.
pub fn gate_names(conf: &Conf) -> (String, String) {
    let name = |fam: &str, conds: &[String]| {
        if conds.is_empty() {
            format!("gate{fam}")
        } else {
            let parts: Vec<&str> = conds.iter().map(String::as_str).collect();
            format!("gate{fam}_{}", &hex(&sha(&parts))[..12])
        }
    };
    (name("4", &conf.conditions_v4), name("6", &conf.conditions_v6))
}

pub const NFPROTO_IPV4: u8 = 2;
pub const NFPROTO_IPV6: u8 = 10;

/// The `conditions` elements: (nfproto, value), IPv4 first.
pub type Conditions = Vec<(u8, Hash)>;

/// The `conditions` value naming a gate chain (whose name fingerprints the conditions).
pub fn gate_value(chain: &str) -> Hash {
    Hash::from_digest(&sha(&["gate", chain]))
}

/// The `conditions` elements of a DNAT part built for `conf`.
pub fn conditions(conf: &Conf) -> Conditions {
    let (g4, g6) = gate_names(conf);
    vec![(NFPROTO_IPV4, gate_value(&g4)), (NFPROTO_IPV6, gate_value(&g6))]
}

/// The `conditions` elements that state what the installed `gates` map says (DEL and GC,
/// which do not know the conditions, add the map to a table made before it existed); None
/// when `gates` does not send both families to a gate chain of the table.
pub fn conditions_of_gates(l: &Listing) -> Option<Conditions> {
    [NFPROTO_IPV4, NFPROTO_IPV6]
        .into_iter()
        .map(|fam| {
            l.gates.iter().find_map(|(k, v)| match v {
                cni_common::netlink::nft::Verdict::Jump(c) if *k == fam && l.chains.contains(c) => {
                    Some((fam, gate_value(c)))
                }
                _ => None,
            })
        })
        .collect()
}

/// Whether the `conditions` map holds exactly `want`; the problem otherwise.
pub fn conditions_problem(l: &Listing, want: &Conditions) -> Option<String> {
    let mut have = l.conditions.clone();
    have.sort();
    let mut want = want.clone();
    want.sort();
    (have != want).then(|| {
        if have.is_empty() {
            "the conditions map is missing or empty (a table made before it existed)".to_string()
        } else {
            "the conditions map does not name the gate chains (conditions changed?)".to_string()
        }
    })
}

pub fn masq_chain(fam: Fam) -> &'static str {
    match fam {
        Fam::V4 => "masquerade4",
        Fam::V6 => "masquerade6",
    }
}

/// The netmask of a prefix length.
pub fn mask(fam: Fam, len: u8) -> IpAddr {
    match fam {
        Fam::V4 => IpAddr::V4(Ipv4Addr::from(u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0))),
        Fam::V6 => IpAddr::V6(Ipv6Addr::from(u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0))),
    }
}

/// The masquerade rule of one prefix length, in nft syntax.
pub fn net_rule(fam: Fam, len: u8) -> String {
    let (ip, max) = if fam == Fam::V4 { ("ip", 32) } else { ("ip6", 128) };
    let saddr = match len {
        0 => String::new(), // every source
        _ if len == max => format!("{ip} saddr . "),
        _ => format!("{ip} saddr & {} . ", mask(fam, len)),
    };
    format!("{saddr}{ip} daddr . meta l4proto . th dport @{} masquerade", Set::Net(fam, len))
}

/// The table with its sets, chains and static rules for `conf` and `lens`, rebuilt
/// idempotently (add, flush, add rules). `old_gates`: gate chains to remove; `legacy`: sets
/// of the previous layout to remove (after the chain that used them is flushed).
pub fn setup_script(conf: &Conf, old_gates: &[String], lens: &Lens, legacy: &[String]) -> String {
    let (g4, g6) = gate_names(conf);
    let tn = format!("{FAMILY} {TABLE}");
    let mut s = format!("table {tn} {{\n");
    for set in sets(lens) {
        let _ = writeln!(s, "\t{}", set_declaration(set));
    }
    let chains = chains(conf);
    for (c, base) in &chains {
        match base {
            Some(b) => {
                let _ = writeln!(s, "\tchain {c} {{ {b} }}");
            }
            None => {
                let _ = writeln!(s, "\tchain {c} {{ }}");
            }
        }
    }
    s.push_str("}\n");
    for (c, _) in &chains {
        let _ = writeln!(s, "flush chain {tn} {c}");
    }
    for c in ["prerouting", "output"] {
        let _ = writeln!(s, "add rule {tn} {c} fib daddr type local meta nfproto vmap @gates");
    }
    for (ip, f) in [("ip", '4'), ("ip6", '6')] {
        let _ = writeln!(
            s,
            "add rule {tn} hostports{f} dnat {ip} to {ip} daddr . meta l4proto . th dport map @hip{f}"
        );
        let _ = writeln!(s, "add rule {tn} hostports{f} dnat {ip} to meta l4proto . th dport map @hp{f}");
    }
    for (fam, name) in [(Fam::V4, "ipv4"), (Fam::V6, "ipv6")] {
        let _ = writeln!(
            s,
            "add rule {tn} masquerading ct status dnat meta nfproto {name} jump {}",
            masq_chain(fam)
        );
    }
    for (fam, len) in lens {
        let _ = writeln!(s, "add rule {tn} {} {}", masq_chain(*fam), net_rule(*fam, *len));
    }
    let _ =
        writeln!(s, "add rule {tn} {g4} meta nfproto ipv4 {} jump hostports4", conf.conditions_v4.join(" "));
    let _ =
        writeln!(s, "add rule {tn} {g6} meta nfproto ipv6 {} jump hostports6", conf.conditions_v6.join(" "));
    let _ = writeln!(s, "flush map {tn} gates");
    let _ = writeln!(s, "add element {tn} gates {{ ipv4 : jump {g4}, ipv6 : jump {g6} }}");
    let _ = writeln!(s, "flush map {tn} conditions");
    let _ = writeln!(
        s,
        "add element {tn} conditions {{ ipv4 : {}, ipv6 : {} }}",
        gate_value(&g4),
        gate_value(&g6)
    );
    for g in old_gates.iter().filter(|g| **g != g4 && **g != g6) {
        let _ = writeln!(s, "delete chain {tn} {g}");
    }
    for set in legacy {
        let _ = writeln!(s, "delete set {tn} {set}");
    }
    s
}

/// The chains of the layout for `conf`, with their base chain declaration.
fn chains(conf: &Conf) -> Vec<(String, Option<&'static str>)> {
    let (g4, g6) = gate_names(conf);
    vec![
        ("prerouting".into(), Some("type nat hook prerouting priority dstnat; policy accept;")),
        ("output".into(), Some("type nat hook output priority -100; policy accept;")),
        ("masquerading".into(), Some("type nat hook postrouting priority srcnat; policy accept;")),
        (masq_chain(Fam::V4).into(), None),
        (masq_chain(Fam::V6).into(), None),
        ("hostports4".into(), None),
        ("hostports6".into(), None),
        (g4, None),
        (g6, None),
    ]
}

/// A scratch table exercising the conditions alone (for `nft -c`), to tell a condition nft
/// rejects from other failures.
pub fn conditions_probe_script(conf: &Conf) -> String {
    format!(
        "table inet cni_portmap_probe {{\n\tchain c {{ }}\n}}\n\
         add rule inet cni_portmap_probe c meta nfproto ipv4 {} accept\n\
         add rule inet cni_portmap_probe c meta nfproto ipv6 {} accept\n",
        conf.conditions_v4.join(" "),
        conf.conditions_v6.join(" ")
    )
}

/// Whether the DNAT part matches what `conf` needs; the first problem otherwise.
pub fn dnat_problem(l: &Listing, conf: &Conf) -> Option<String> {
    let (g4, g6) = gate_names(conf);
    let checks = [
        ("prerouting", Set::Gates),
        ("output", Set::Gates),
        ("hostports4", Set::Hp(Fam::V4)),
        ("hostports4", Set::Hip(Fam::V4)),
        ("hostports6", Set::Hp(Fam::V6)),
        ("hostports6", Set::Hip(Fam::V6)),
    ];
    for (chain, set) in checks {
        if !l.uses_set(chain, &set.name()) {
            return Some(format!("chain {chain} lacks its rule using @{set}"));
        }
    }
    for (fam, g, hp) in [(2u8, &g4, "hostports4"), (10, &g6, "hostports6")] {
        let name = if fam == 2 { "ipv4" } else { "ipv6" };
        let jump = cni_common::netlink::nft::Verdict::Jump(g.clone());
        if !l.gates.iter().any(|(k, v)| *k == fam && *v == jump) {
            return Some(format!("gates map does not send {name} to chain {g} (conditions changed?)"));
        }
        if !l.jumps_to(g, hp) {
            return Some(format!("chain {g} lacks its jump to {hp}"));
        }
    }
    None
}

/// Whether the masquerade part has every set and rule `lens` need; the first problem
/// otherwise. A table still in the previous layout is a problem (it gets migrated).
pub fn masq_problem(l: &Listing, lens: &Lens) -> Option<String> {
    if !l.legacy_sets.is_empty() {
        return Some(format!(
            "masquerading still uses the previous layout's sets ({})",
            l.legacy_sets.join(", ")
        ));
    }
    for fam in [Fam::V4, Fam::V6] {
        if !l.jumps_to("masquerading", masq_chain(fam)) {
            return Some(format!("chain masquerading lacks its jump to {}", masq_chain(fam)));
        }
    }
    for (fam, len) in lens {
        let set = Set::Net(*fam, *len);
        if !l.uses_set(masq_chain(*fam), &set.name()) {
            return Some(format!("chain {} lacks its rule using @{set}", masq_chain(*fam)));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use cni_common::netlink::nft::{NftExpr, NftRule, Verdict};
    use cni_common::spec::config::PortMapConf;

    #[test]
    fn masks_and_rules() {
        assert_eq!(mask(Fam::V4, 24).to_string(), "255.255.255.0");
        assert_eq!(mask(Fam::V4, 0).to_string(), "0.0.0.0");
        assert_eq!(mask(Fam::V6, 64).to_string(), "ffff:ffff:ffff:ffff::");
        assert_eq!(mask(Fam::V6, 0).to_string(), "::");
        assert_eq!(
            net_rule(Fam::V4, 32),
            "ip saddr . ip daddr . meta l4proto . th dport @net4_32 masquerade"
        );
        assert_eq!(net_rule(Fam::V4, 0), "ip daddr . meta l4proto . th dport @net4_0 masquerade");
        assert_eq!(
            net_rule(Fam::V6, 64),
            "ip6 saddr & ffff:ffff:ffff:ffff:: . ip6 daddr . meta l4proto . th dport @net6_64 masquerade"
        );
    }

    fn rule(chain: &str, exprs: Vec<NftExpr>) -> NftRule {
        NftRule { table: TABLE.into(), chain: chain.into(), handle: 1, comment: None, exprs }
    }

    #[test]
    fn static_part_is_checked_from_the_rules() {
        let c = Conf::from_raw(&PortMapConf::default()).unwrap();
        let lookup = |set: &str| NftExpr::Lookup { set: set.into() };
        let mut l = Listing::default();
        l.chains = vec!["gate4".into(), "gate6".into(), "hostports4".into()];
        l.gates = vec![(2, Verdict::Jump("gate4".into())), (10, Verdict::Jump("gate6".into()))];
        for (chain, sets) in [
            ("prerouting", &["gates"][..]),
            ("output", &["gates"]),
            ("hostports4", &["hip4", "hp4"]),
            ("hostports6", &["hip6", "hp6"]),
            ("masquerade4", &["net4_24", "net4_32"]),
        ] {
            for set in sets {
                l.rules.push(rule(chain, vec![NftExpr::Other("fib".into()), lookup(set)]));
            }
        }
        for (g, hp) in [
            ("gate4", "hostports4"),
            ("gate6", "hostports6"),
            ("masquerading", "masquerade4"),
            ("masquerading", "masquerade6"),
        ] {
            l.rules.push(rule(g, vec![NftExpr::Verdict(Verdict::Jump(hp.into()))]));
        }
        let lens = Lens::from([(Fam::V4, 24), (Fam::V4, 32)]);
        assert_eq!(dnat_problem(&l, &c), None);
        assert_eq!(masq_problem(&l, &lens), None);
        assert_eq!(l.net_lens(), lens, "the prefix lengths in use come from the rules");
        assert_eq!(l.gate_chains(), vec!["gate4".to_string(), "gate6".to_string()]);
        assert_eq!(
            masq_problem(&l, &Lens::from([(Fam::V6, 64)])).unwrap(),
            "chain masquerade6 lacks its rule using @net6_64"
        );
        let mut cond = c.clone();
        cond.conditions_v4 = vec!["ip".into(), "saddr".into(), "10.0.0.1".into()];
        assert!(dnat_problem(&l, &cond).unwrap().contains("conditions changed"));
        l.rules.retain(|r| !(r.chain == "hostports4" && r.uses_set("hp4")));
        assert_eq!(dnat_problem(&l, &c).unwrap(), "chain hostports4 lacks its rule using @hp4");
        // the conditions map: what the fast ADD checks
        assert!(conditions_problem(&l, &conditions(&c)).unwrap().contains("missing"));
        assert_eq!(conditions_of_gates(&l), Some(conditions(&c)), "derived from the installed gates");
        l.conditions = conditions(&c);
        l.conditions.reverse();
        assert_eq!(conditions_problem(&l, &conditions(&c)), None, "order does not matter");
        assert!(conditions_problem(&l, &conditions(&cond)).unwrap().contains("conditions changed"));
        l.chains.retain(|x| x != "gate6");
        assert_eq!(conditions_of_gates(&l), None, "gates naming a chain that is not there");
        // a table in the previous layout needs the masquerade part rebuilt
        l.rules.push(rule("masquerading", vec![lookup("masq4")]));
        l.legacy_sets = crate::legacy::sets_in_use(&l);
        assert_eq!(l.legacy_sets, ["masq4"]);
        assert!(masq_problem(&l, &lens).unwrap().contains("previous layout"));
    }

    #[test]
    fn setup_script_carries_conditions_in_a_fingerprinted_gate() {
        let mut c = Conf::from_raw(&PortMapConf::default()).unwrap();
        c.conditions_v4 = vec!["ip".into(), "daddr".into(), "!=".into(), "192.0.2.9".into()];
        let (g4, g6) = gate_names(&c);
        assert!(g4.starts_with("gate4_") && g4.len() == 18);
        assert_eq!(g6, "gate6");
        let lens = Lens::from([(Fam::V4, 24), (Fam::V4, 32)]);
        let s = setup_script(&c, &["gate4".into(), g4.clone()], &lens, &["masq4".into()]);
        assert!(s.contains(&format!(
            "add rule inet cni_portmap {g4} meta nfproto ipv4 ip daddr != 192.0.2.9 jump hostports4"
        )));
        assert!(s.contains("delete chain inet cni_portmap gate4\n"));
        assert!(!s.contains(&format!("delete chain inet cni_portmap {g4}\n")));
        assert!(s.contains("\tset net4_24 { type ipv4_addr . ipv4_addr . inet_proto . inet_service; }\n"));
        assert!(s.contains("add rule inet cni_portmap masquerade4 ip saddr & 255.255.255.0 . ip daddr"));
        assert!(s.ends_with("delete set inet cni_portmap masq4\n"), "{s}");
        assert!(s.contains("\tmap conditions { type nf_proto : ipv6_addr; }\n"), "{s}");
        assert!(s.contains(&format!(
            "add element inet cni_portmap conditions {{ ipv4 : {}, ipv6 : {} }}\n",
            gate_value(&g4),
            gate_value("gate6")
        )));
        assert!(s.find("flush chain inet cni_portmap masquerading").unwrap() < s.find("delete set").unwrap());
    }
}
