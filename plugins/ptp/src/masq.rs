//! `ipMasq`: upstream's nftables masquerade layout, which bridge writes too, so DEL and GC of
//! either plugin (ours or upstream's, any version with the nftables backend) find the other's
//! rules: table `inet cni_plugins_masquerade`, base chain `postrouting` (nat, srcnat) that
//! returns multicast and goes to `masq_checks`, where each container address has one rule
//! `ip saddr A ip daddr != SUBNET masquerade` commented `<hash(network)>-<hash(ifname:id)>, …`.
//! The comment's prefix identifies the attachment: DEL (with CNI_NETNS gone as well) and GC need
//! no address to find the rules.
//!
//! ptp's own copy of the layout: bridge's lives in plugins/bridge (being rebuilt); the two
//! agree on every byte, and tests of both read the same rules back.

use cni_common::attachment::{masq_network_hash, AttachmentId};
use cni_common::netlink::nft::{
    BaseChain, CmpOp, NfTables, NftDelete, NftFamily, NftOp, NftRule, RuleExpr, Verdict, HOOK_POSTROUTING,
};
use cni_common::netlink::NlError;
use ipnet::IpNet;
use std::collections::HashSet;

pub const MASQ_TABLE: &str = "cni_plugins_masquerade";
pub const MASQ_CHAIN: &str = "masq_checks";
pub const MASQ_HOOK_CHAIN: &str = "postrouting";
const MASQ_TABLE_COMMENT: &str = "Masquerading for plugins from github.com/containernetworking/plugins";
const MASQ_CHAIN_COMMENT: &str =
    "Masquerade traffic from certain IPs to any (non-multicast) IP outside their subnet";

/// What the kernel has of the shared table and of one attachment.
#[derive(Debug, Default, Clone)]
pub struct Found {
    pub table: bool,
    pub checks_chain: bool,
    /// `postrouting` is exactly what ADD writes.
    pub hooked: bool,
    /// The attachment's rules in `masq_checks`.
    pub rules: Vec<NftRule>,
}

fn postrouting_ok(rules: &[NftRule]) -> bool {
    let returns_for = |r: &NftRule, first: u8| {
        r.verdicts().any(|v| *v == Verdict::Return) && r.cmp_data().any(|d| d.first() == Some(&first))
    };
    rules.len() == 3
        && returns_for(&rules[0], 224)
        && returns_for(&rules[1], 0xff)
        && rules[2].verdicts().any(|v| *v == Verdict::Goto(MASQ_CHAIN.into()))
}

/// Read what the kernel has for `a`.
pub fn find(nf: &mut NfTables, a: &AttachmentId) -> Result<Found, NlError> {
    let mut f = Found::default();
    let chains = nf.chain_info(NftFamily::Inet, MASQ_TABLE)?;
    if chains.is_empty() {
        return Ok(f);
    }
    f.table = true;
    f.checks_chain = chains.iter().any(|c| c.name == MASQ_CHAIN && c.hook.is_none());
    let hook_ok = chains.iter().any(|c| {
        c.name == MASQ_HOOK_CHAIN && c.hook == Some((4, 100)) && c.chain_type.as_deref() == Some("nat")
    });
    let post = nf.rules(NftFamily::Inet, MASQ_TABLE, Some(MASQ_HOOK_CHAIN))?;
    f.hooked = hook_ok && postrouting_ok(&post);
    if f.checks_chain {
        let prefix = a.masq_tag();
        f.rules = nf
            .rules(NftFamily::Inet, MASQ_TABLE, Some(MASQ_CHAIN))?
            .into_iter()
            .filter(|r| r.comment.as_deref().is_some_and(|c| c.starts_with(&prefix)))
            .collect();
    }
    Ok(f)
}

/// One rule per address: `ip saddr A ip daddr != SUBNET masquerade comment …`.
pub fn rules(a: &AttachmentId, addrs: &[IpNet]) -> Vec<NftOp> {
    let comment = a.masq_comment();
    addrs
        .iter()
        .map(|addr| {
            let mut exprs = RuleExpr::nfproto(addr.addr().is_ipv4());
            exprs.extend(RuleExpr::addr(true, IpNet::from(addr.addr()), CmpOp::Eq));
            exprs.extend(RuleExpr::addr(false, addr.trunc(), CmpOp::Neq));
            exprs.push(RuleExpr::Masquerade);
            NftOp::rule(NftFamily::Inet, MASQ_TABLE, MASQ_CHAIN, exprs, Some(&comment))
        })
        .collect()
}

/// ADD's transaction: the shared table and chains where missing or different, the attachment's
/// stale rules out, its rules in.
pub fn add_ops(a: &AttachmentId, addrs: &[IpNet], f: &Found) -> Vec<NftOp> {
    let (inet, t) = (NftFamily::Inet, MASQ_TABLE.to_string());
    let chain = |name: &str, base: Option<BaseChain>, comment: Option<&str>| NftOp::AddChain {
        family: inet,
        table: t.clone(),
        chain: name.into(),
        base,
        comment: comment.map(Into::into),
    };
    let mut ops = Vec::new();
    if !f.table {
        ops.push(NftOp::AddTable {
            family: inet,
            table: t.clone(),
            comment: Some(MASQ_TABLE_COMMENT.into()),
        });
    }
    if !f.checks_chain {
        ops.push(chain(MASQ_CHAIN, None, Some(MASQ_CHAIN_COMMENT)));
    }
    if !f.hooked {
        let base = BaseChain { kind: "nat".into(), hook: HOOK_POSTROUTING, priority: 100, policy: None };
        ops.push(chain(MASQ_HOOK_CHAIN, Some(base), None));
        ops.push(NftOp::Delete(NftDelete::Flush {
            family: inet,
            table: t.clone(),
            chain: MASQ_HOOK_CHAIN.into(),
        }));
        for net in ["224.0.0.0/4", "ff00::/8"] {
            let net: IpNet = net.parse().expect("a network");
            let mut exprs = RuleExpr::nfproto(net.addr().is_ipv4());
            exprs.extend(RuleExpr::addr(false, net, CmpOp::Eq));
            exprs.push(RuleExpr::Verdict(Verdict::Return));
            ops.push(NftOp::rule(inet, &t, MASQ_HOOK_CHAIN, exprs, None));
        }
        ops.push(NftOp::rule(
            inet,
            &t,
            MASQ_HOOK_CHAIN,
            vec![RuleExpr::Verdict(Verdict::Goto(MASQ_CHAIN.into()))],
            None,
        ));
    }
    ops.extend(del_ops(&f.rules).into_iter().map(NftOp::Delete));
    ops.extend(rules(a, addrs));
    ops
}

/// Deletions of rules by handle.
pub fn del_ops(rules: &[NftRule]) -> Vec<NftDelete> {
    rules
        .iter()
        .map(|r| NftDelete::Rule {
            family: NftFamily::Inet,
            table: MASQ_TABLE.into(),
            chain: r.chain.clone(),
            handle: r.handle,
        })
        .collect()
}

/// What `a`'s masquerading lacks for `addrs`; None when complete.
pub fn missing(f: &Found, a: &AttachmentId, addrs: &[IpNet]) -> Option<String> {
    if !f.hooked {
        return Some(format!(
            "masquerading is not hooked: chain {MASQ_HOOK_CHAIN} of table inet {MASQ_TABLE} does not go to {MASQ_CHAIN}"
        ));
    }
    if f.rules.len() != addrs.len() {
        return Some(format!(
            "expected {} masquerade rule(s) for {} in {MASQ_TABLE} {MASQ_CHAIN}, found {}",
            addrs.len(),
            a.ifname,
            f.rules.len()
        ));
    }
    addrs.iter().find_map(|addr| {
        let octets = match addr.addr() {
            std::net::IpAddr::V4(v) => v.octets().to_vec(),
            std::net::IpAddr::V6(v) => v.octets().to_vec(),
        };
        let covered =
            f.rules.iter().any(|r| r.has_expr("masq") && r.cmp_data().any(|d| d == octets.as_slice()));
        (!covered).then(|| format!("no masquerade rule for source {}", addr.addr()))
    })
}

/// GC: the masquerade rules of `network` whose attachment is not in `valid` (masq tags).
pub fn garbage(nf: &mut NfTables, network: &str, valid: &HashSet<String>) -> Result<Vec<NftRule>, NlError> {
    let net = format!("{}-", masq_network_hash(network));
    Ok(nf
        .rules(NftFamily::Inet, MASQ_TABLE, Some(MASQ_CHAIN))?
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
        let fresh = add_ops(&a, &addrs, &Found::default());
        // table, masq_checks, postrouting, flush, 3 hook rules, 2 attachment rules
        assert_eq!(fresh.len(), 9);
        let complete = Found { table: true, checks_chain: true, hooked: true, rules: Vec::new() };
        let ops = add_ops(&a, &addrs, &complete);
        assert_eq!(ops.len(), 2, "only the attachment's rules");
        for op in &ops {
            match op {
                NftOp::AddRule { chain, comment, .. } => {
                    assert_eq!(chain, MASQ_CHAIN);
                    assert!(comment.as_deref().unwrap().starts_with(&a.masq_tag()));
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert!(missing(&complete, &a, &addrs).unwrap().contains("expected 2"));
        assert!(missing(&Found::default(), &a, &addrs).unwrap().contains("not hooked"));
    }
}
