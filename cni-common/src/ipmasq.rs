//! `ipMasq` in upstream's nftables layout (`pkg/ip`'s ipmasq, v1.6+ with the nftables backend),
//! which every plugin that masquerades writes, upstream's and ours alike, so DEL and GC of any of
//! them find the others' rules: table `inet cni_plugins_masquerade`; base chain `postrouting`
//! (nat, srcnat) written by an ADD that finds it missing or different: multicast destinations
//! `return`, then `goto masq_checks`; in `masq_checks` one rule per container address,
//! `ip saddr A ip daddr != SUBNET masquerade`, commented with the attachment's masquerade tag
//! ([`AttachmentId::masq_comment`]). The tag identifies the attachment, so DEL (also with an
//! empty CNI_NETNS) and GC never need the addresses and never touch another attachment's rules.
//!
//! Pure where it can be: what to write ([`add_ops`]), what to delete ([`del_ops`]), what is
//! missing ([`missing`]) are computed from what [`find`] read; reading goes through [`NftRead`],
//! which the real connection and a plugin's fake both implement. The plugin runs the transaction
//! through its own seam.
//!
//! One extension over upstream: `nonMasqueradeCIDRs` (kubenet's `--non-masquerade-cidr`) adds
//! consecutive `ip daddr != <cidr>` matches and `fib daddr type != local` (same meaning as nft's
//! anonymous set `ip daddr != { … }`, without a set to create).

use std::collections::HashSet;

use ipnet::IpNet;

use crate::attachment::{masq_network_hash, AttachmentId};
use crate::netlink::nft::{
    BaseChain, CmpOp, Hooked, NfTables, NftChain, NftDelete, NftFamily, NftOp, NftRule, RuleExpr, Verdict,
    HOOK_POSTROUTING,
};
use crate::netlink::NlError;

pub const TABLE: &str = "cni_plugins_masquerade";
pub const CHAIN: &str = "masq_checks";
pub const HOOK_CHAIN: &str = "postrouting";
const TABLE_COMMENT: &str = "Masquerading for plugins from github.com/containernetworking/plugins";
const CHAIN_COMMENT: &str =
    "Masquerade traffic from certain IPs to any (non-multicast) IP outside their subnet";

/// The base chain: `inet cni_plugins_masquerade postrouting`, nat, srcnat (100).
pub const HOOK: Hooked = Hooked {
    family: NftFamily::Inet,
    table: TABLE,
    chain: HOOK_CHAIN,
    kind: "nat",
    hook: HOOK_POSTROUTING,
    priority: 100,
    policy: None,
};

/// `Result` of a netlink request.
type Nl<T> = std::result::Result<T, NlError>;

/// The reads of nf_tables this layout needs (the real connection, or a plugin's fake).
pub trait NftRead {
    fn chain_info(&mut self, family: NftFamily, table: &str) -> Nl<Vec<NftChain>>;
    fn rules(&mut self, family: NftFamily, table: &str, chain: Option<&str>) -> Nl<Vec<NftRule>>;
}

impl NftRead for NfTables {
    fn chain_info(&mut self, family: NftFamily, table: &str) -> Nl<Vec<NftChain>> {
        NfTables::chain_info(self, family, table)
    }
    fn rules(&mut self, family: NftFamily, table: &str, chain: Option<&str>) -> Nl<Vec<NftRule>> {
        NfTables::rules(self, family, table, chain)
    }
}

/// What the kernel has of the shared table and of one attachment.
#[derive(Debug, Default, Clone)]
pub struct Found {
    /// `inet cni_plugins_masquerade` exists.
    pub table: bool,
    /// Its `masq_checks` chain exists.
    pub checks: bool,
    /// Its `postrouting` base chain is exactly what ADD writes (nat, srcnat, multicast returns,
    /// `goto masq_checks`).
    pub hooked: bool,
    /// The attachment's rules in `masq_checks`.
    pub rules: Vec<NftRule>,
}

/// `postrouting` holds exactly the three rules ADD writes.
pub fn postrouting_ok(rules: &[NftRule]) -> bool {
    let returns_for = |r: &NftRule, first: u8| {
        r.verdicts().any(|v| *v == Verdict::Return) && r.cmp_data().any(|d| d.first() == Some(&first))
    };
    rules.len() == 3
        && returns_for(&rules[0], 224)
        && returns_for(&rules[1], 0xff)
        && rules[2].verdicts().any(|v| *v == Verdict::Goto(CHAIN.into()))
}

/// Read what the kernel has for `a`. Chain by chain: rules another process appends to
/// `masq_checks` while a dump of the whole table is under way would shift the rules of
/// `postrouting` after them.
pub fn find(nf: &mut dyn NftRead, a: &AttachmentId) -> Nl<Found> {
    let mut f = Found::default();
    let chains = nf.chain_info(NftFamily::Inet, TABLE)?;
    if chains.is_empty() {
        return Ok(f);
    }
    f.table = true;
    f.checks = chains.iter().any(|c| c.name == CHAIN && c.hook.is_none());
    let hook_ok = chains.iter().any(|c| HOOK.is(c));
    let post = nf.rules(NftFamily::Inet, TABLE, Some(HOOK_CHAIN))?;
    f.hooked = hook_ok && postrouting_ok(&post);
    if f.checks {
        let prefix = a.masq_tag();
        f.rules = nf
            .rules(NftFamily::Inet, TABLE, Some(CHAIN))?
            .into_iter()
            .filter(|r| r.comment.as_deref().is_some_and(|c| c.starts_with(&prefix)))
            .collect();
    }
    Ok(f)
}

/// What the masquerade rule of one address leaves alone: destination networks (the
/// attachment's subnet, plus the `nonMasqueradeCIDRs` of the same family when given) and, with
/// `nonMasqueradeCIDRs`, local destinations (as kubenet's rule did). `None` when nothing at all
/// is to be masqueraded.
pub fn exclusions(addr: &IpNet, non_masquerade: Option<&[IpNet]>) -> Option<(Vec<IpNet>, bool)> {
    let Some(extra) = non_masquerade else {
        return Some((vec![addr.trunc()], false));
    };
    let mut nets: Vec<IpNet> = vec![addr.trunc()];
    nets.extend(extra.iter().filter(|n| n.addr().is_ipv4() == addr.addr().is_ipv4()).copied());
    let nets = IpNet::aggregate(&nets);
    if nets.iter().any(|n| n.prefix_len() == 0) {
        return None; // the whole address family is excluded
    }
    Some((nets, true))
}

/// The masquerade rules `a` should have for `addrs` (one per address, in order):
/// `ip saddr A ip daddr != SUBNET masquerade comment …` (with `nonMasqueradeCIDRs`: one
/// `ip daddr != …` per excluded network, then `fib daddr type != local`).
pub fn rules(a: &AttachmentId, addrs: &[IpNet], non_masquerade: Option<&[IpNet]>) -> Vec<NftOp> {
    let comment = a.masq_comment();
    addrs
        .iter()
        .filter_map(|addr| {
            let (nets, not_local) = exclusions(addr, non_masquerade)?;
            let mut exprs = RuleExpr::nfproto(addr.addr().is_ipv4());
            exprs.extend(RuleExpr::addr(true, IpNet::from(addr.addr()), CmpOp::Eq));
            for n in nets {
                exprs.extend(RuleExpr::addr(false, n, CmpOp::Neq));
            }
            if not_local {
                exprs.extend(RuleExpr::daddr_not_local());
            }
            exprs.push(RuleExpr::Masquerade);
            Some(NftOp::rule(NftFamily::Inet, TABLE, CHAIN, exprs, Some(&comment)))
        })
        .collect()
}

/// The ADD transaction. Shared objects are only written when they are missing or differ
/// (redefining an existing chain makes the kernel keep the old definition until an RCU grace
/// period has passed, which the process releasing the socket then waits for); stale rules of the
/// same attachment are removed; the new rules are added.
pub fn add_ops(a: &AttachmentId, addrs: &[IpNet], non_masquerade: Option<&[IpNet]>, f: &Found) -> Vec<NftOp> {
    let (inet, t) = (NftFamily::Inet, TABLE.to_string());
    let mut ops = Vec::new();
    if !f.table {
        ops.push(NftOp::AddTable { family: inet, table: t.clone(), comment: Some(TABLE_COMMENT.into()) });
    }
    if !f.checks {
        ops.push(NftOp::AddChain {
            family: inet,
            table: t.clone(),
            chain: CHAIN.into(),
            base: None::<BaseChain>,
            comment: Some(CHAIN_COMMENT.into()),
        });
    }
    if !f.hooked {
        ops.push(HOOK.add_op());
        ops.push(NftOp::Delete(NftDelete::Flush {
            family: inet,
            table: t.clone(),
            chain: HOOK_CHAIN.into(),
        }));
        for net in ["224.0.0.0/4", "ff00::/8"] {
            let net: IpNet = net.parse().expect("valid");
            let mut exprs = RuleExpr::nfproto(net.addr().is_ipv4());
            exprs.extend(RuleExpr::addr(false, net, CmpOp::Eq));
            exprs.push(RuleExpr::Verdict(Verdict::Return));
            ops.push(NftOp::rule(inet, &t, HOOK_CHAIN, exprs, None));
        }
        let goto = vec![RuleExpr::Verdict(Verdict::Goto(CHAIN.into()))];
        ops.push(NftOp::rule(inet, &t, HOOK_CHAIN, goto, None));
    }
    ops.extend(del_ops(&f.rules).into_iter().map(NftOp::Delete));
    ops.extend(rules(a, addrs, non_masquerade));
    ops
}

/// Deletions of masquerade rules (by handle).
pub fn del_ops(rules: &[NftRule]) -> Vec<NftDelete> {
    rules
        .iter()
        .map(|r| NftDelete::Rule {
            family: NftFamily::Inet,
            table: TABLE.into(),
            chain: r.chain.clone(),
            handle: r.handle,
        })
        .collect()
}

fn ip_octets(ip: &std::net::IpAddr) -> Vec<u8> {
    match ip {
        std::net::IpAddr::V4(v) => v.octets().to_vec(),
        std::net::IpAddr::V6(v) => v.octets().to_vec(),
    }
}

/// What `a`'s masquerading lacks for `addrs`, judged on what [`find`] read: `None` when the base
/// chain is hooked and every address has its rule. CHECK fails with this message; `cni-migrate
/// resync` rebuilds when it is `Some`.
pub fn missing(
    f: &Found,
    a: &AttachmentId,
    addrs: &[IpNet],
    non_masquerade: Option<&[IpNet]>,
) -> Option<String> {
    let expected = rules(a, addrs, non_masquerade).len();
    if expected > 0 && !f.hooked {
        return Some(format!(
            "masquerading is not hooked: chain {HOOK_CHAIN} of table inet {TABLE} does not go to {CHAIN}"
        ));
    }
    if f.rules.len() != expected {
        return Some(format!(
            "expected {expected} masquerade rule(s) for {} in {TABLE} {CHAIN}, found {}",
            a.ifname,
            f.rules.len()
        ));
    }
    if expected == 0 {
        return None; // every destination excluded: nothing to masquerade
    }
    addrs.iter().find_map(|addr| {
        let octets = ip_octets(&addr.addr());
        let covered =
            f.rules.iter().any(|r| r.has_expr("masq") && r.cmp_data().any(|d| d == octets.as_slice()));
        (!covered).then(|| format!("no masquerade rule for source {}", addr.addr()))
    })
}

/// GC: the masquerade rules of `network` whose attachment's tag is not in `valid`.
pub fn garbage(nf: &mut dyn NftRead, network: &str, valid: &HashSet<String>) -> Nl<Vec<NftRule>> {
    let net = format!("{}-", masq_network_hash(network));
    Ok(nf
        .rules(NftFamily::Inet, TABLE, Some(CHAIN))?
        .into_iter()
        .filter(|r| {
            r.comment
                .as_deref()
                .is_some_and(|c| c.starts_with(&net) && !valid.contains(c.get(..33).unwrap_or(c)))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_ops_build_the_shared_objects_only_when_missing() {
        let a = AttachmentId::new("kindnet", "c0ffee", "eth0");
        let addrs: Vec<IpNet> = vec!["10.244.0.5/24".parse().unwrap(), "fd00:10::5/64".parse().unwrap()];
        let fresh = add_ops(&a, &addrs, None, &Found::default());
        // table, masq_checks, postrouting, flush, 3 hook rules, 2 attachment rules
        assert_eq!(fresh.len(), 9);
        let complete = Found { table: true, checks: true, hooked: true, rules: Vec::new() };
        let ops = add_ops(&a, &addrs, None, &complete);
        assert_eq!(ops.len(), 2, "only the attachment's rules");
        for op in &ops {
            match op {
                NftOp::AddRule { chain, comment, .. } => {
                    assert_eq!(chain, CHAIN);
                    assert!(comment.as_deref().unwrap().starts_with(&a.masq_tag()));
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert!(missing(&complete, &a, &addrs, None).unwrap().contains("expected 2"));
        assert!(missing(&Found::default(), &a, &addrs, None).unwrap().contains("not hooked"));
    }

    #[test]
    fn a_family_excluded_whole_gets_no_rule_and_is_not_missing() {
        let a = AttachmentId::new("n", "c", "eth0");
        let addrs: Vec<IpNet> = vec!["10.1.0.5/24".parse().unwrap(), "fd00::5/64".parse().unwrap()];
        let all_v4: Vec<IpNet> = vec!["0.0.0.0/0".parse().unwrap()];
        let r = rules(&a, &addrs, Some(&all_v4));
        assert_eq!(r.len(), 1, "only the IPv6 address is masqueraded");
        let none = Found { table: true, checks: true, hooked: false, rules: vec![] };
        assert_eq!(missing(&none, &a, &addrs[..1], Some(&all_v4)), None);
    }

    #[test]
    fn address_octets_as_nf_tables_compares_them() {
        assert_eq!(ip_octets(&"10.1.2.3".parse().unwrap()), vec![10, 1, 2, 3]);
        let six = ip_octets(&"fd00::1".parse().unwrap());
        assert_eq!((six.len(), six[0], six[15]), (16, 0xfd, 1));
    }
}
