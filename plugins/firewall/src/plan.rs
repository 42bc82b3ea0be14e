//! The planner (pure): from what a reading saw ([`Tables`]) and what the attachment wants,
//! the ops of one transaction (ADD, DEL) or what is missing (CHECK).

use crate::kernel::{nft_family, Tables, TABLE};
use crate::model::{addr_rules, Rule, FORWARD, PRIV_CHAIN};
use cni_common::net::Family;
use cni_common::netlink::nft::{BaseChain, NftDelete, NftOp, HOOK_FORWARD, POLICY_ACCEPT};
use std::net::IpAddr;

/// ADD: the table and iptables-nft's `FORWARD` base chain when missing (policy accept, as
/// iptables-nft creates it: an existing chain is never redefined, so someone's DROP policy
/// stays), then each missing chain and rule in order.
pub fn add(t: &Tables, fam: Family, chains: &[String], rules: &[Rule]) -> Vec<(NftOp, bool)> {
    let family = nft_family(fam);
    let mut ops = Vec::new();
    if rules.is_empty() {
        return ops;
    }
    if t.chains.is_empty() {
        ops.push((NftOp::AddTable { family, table: TABLE.into(), comment: None }, false));
    }
    if !t.has_chain(FORWARD) {
        let base =
            BaseChain { kind: "filter".into(), hook: HOOK_FORWARD, priority: 0, policy: Some(POLICY_ACCEPT) };
        ops.push((
            NftOp::AddChain {
                family,
                table: TABLE.into(),
                chain: FORWARD.into(),
                base: Some(base),
                comment: None,
            },
            false,
        ));
    }
    for c in chains.iter().filter(|c| !t.has_chain(c)) {
        ops.push((
            NftOp::AddChain { family, table: TABLE.into(), chain: c.clone(), base: None, comment: None },
            false,
        ));
    }
    for r in rules {
        if !t.rules_in(&r.chain).any(|f| r.is(f)) {
            ops.push((NftOp::rule(family, TABLE, &r.chain, r.exprs(), None), r.top));
        }
    }
    ops
}

/// DEL: every copy of the address rules of `addrs` in `CNI-FORWARD` (ours or upstream's: the
/// same rules), by handle. Chains and jumps stay, as upstream leaves them (other attachments
/// and the admin's rules use them).
pub fn del(t: &Tables, fam: Family, addrs: &[IpAddr]) -> Vec<(NftOp, bool)> {
    let family = nft_family(fam);
    let wanted: Vec<Rule> =
        addrs.iter().filter(|a| Family::of(a) == fam).flat_map(|a| addr_rules(*a)).collect();
    t.rules_in(PRIV_CHAIN)
        .filter(|f| wanted.iter().any(|r| r.is(f)))
        .map(|f| {
            let d =
                NftDelete::Rule { family, table: TABLE.into(), chain: PRIV_CHAIN.into(), handle: f.handle };
            (NftOp::Delete(d), false)
        })
        .collect()
}

/// CHECK: the chains and rules of the attachment that the table lacks, as iptables lines.
pub fn missing(t: &Tables, chains: &[String], rules: &[Rule]) -> Vec<String> {
    let mut out: Vec<String> = chains.iter().filter(|c| !t.has_chain(c)).map(|c| format!("-N {c}")).collect();
    out.extend(rules.iter().filter(|r| !t.rules_in(&r.chain).any(|f| r.is(f))).map(Rule::line));
    out
}

#[cfg(test)]
mod tests;
