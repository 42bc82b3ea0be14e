//! nftables state of a bridge attachment: `ipMasq` and `macspoofchk`.
//!
//! Layouts are upstream's, so a node can move between our binaries and upstream's (v1.6+, whose
//! ipMasq has an nftables backend) in either direction and each side's DEL/GC finds the other's
//! rules:
//!
//! * ipMasq: table `inet cni_plugins_masquerade` in upstream's shared layout, written and read
//!   by `cni_common::ipmasq` (which ptp uses too); this module adds bridge's transactions
//!   around it.
//! * macspoofchk: table `bridge nat`, base chain `PREROUTING` (filter, prerouting, -300); per
//!   attachment chains `cni-br-iface-<id>-<ifname>` and `…-mac`; `iifname <host veth> jump`,
//!   `jump …-mac`, `ether saddr <mac> return`, `drop`; comments `macspoofchk-<id>-<ifname>`.
//!
//! Everything goes over netlink ([`NfTables`]), no verb runs `nft`. ADD writes with one
//! transaction that only adds (shared objects are written only when missing or different; the
//! rules are encoded as `nft` encodes the same rule text, so `nft list` shows them as before);
//! DEL and GC delete with one transaction; a verb that finds nothing to change changes nothing.

pub(crate) mod remove;

use cni_common::attachment::AttachmentId;
use cni_common::ipmasq;

use crate::identity::BridgeIdentity;
use cni_common::mac::Mac;
use cni_common::netlink::nft::{
    NfTables, NftDelete, NftFamily, NftOp, NftRule, RuleExpr, Verdict, HOOK_PREROUTING, POLICY_ACCEPT,
};
use cni_common::netlink::NlError;
use cni_common::{CniError, Result};
use ipnet::IpNet;

use std::collections::HashSet;

pub use cni_common::ipmasq::{
    CHAIN as MASQ_CHAIN, HOOK as MASQ_HOOK, HOOK_CHAIN as MASQ_HOOK_CHAIN, TABLE as MASQ_TABLE,
};
pub use cni_common::netlink::nft::Hooked;
pub const SPOOF_TABLE: &str = "nat";
pub const SPOOF_BASE_CHAIN: &str = "PREROUTING";
/// nft's limit on comment length.
const COMMENT_MAX: usize = 128;

/// `Result` of a netlink request.
type Nl<T> = std::result::Result<T, NlError>;

/// nf_tables as bridge's firewall module uses it: the reads of [`ipmasq::NftRead`] and the
/// transactions.
pub trait Nft: ipmasq::NftRead {
    fn chains(&mut self, family: NftFamily, table: &str) -> Nl<Vec<String>> {
        Ok(self.chain_info(family, table)?.into_iter().map(|c| c.name).collect())
    }
    fn apply(&mut self, ops: &[NftOp]) -> Nl<()>;
    fn validate(&mut self, ops: &[NftOp]) -> Nl<()>;
}

impl Nft for NfTables {
    fn apply(&mut self, ops: &[NftOp]) -> Nl<()> {
        NfTables::apply(self, ops)
    }
    fn validate(&mut self, ops: &[NftOp]) -> Nl<()> {
        NfTables::validate(self, ops)
    }
}

/// macspoofchk's hook: `bridge nat PREROUTING`, filter, -300, policy accept.
pub const SPOOF_HOOK: Hooked = Hooked {
    family: NftFamily::Bridge,
    table: SPOOF_TABLE,
    chain: SPOOF_BASE_CHAIN,
    kind: "filter",
    hook: HOOK_PREROUTING,
    priority: -300,
    policy: Some(POLICY_ACCEPT),
};

/// The per-attachment spoof-check chain of reference id `refid` ([`AttachmentId::spoof_ref`]).
pub fn spoof_chain(refid: &str) -> String {
    format!("cni-br-iface-{refid}")
}

pub fn spoof_mac_chain(refid: &str) -> String {
    format!("cni-br-iface-{refid}-mac")
}

pub fn spoof_comment(refid: &str) -> String {
    let mut c = format!("macspoofchk-{refid}");
    c.truncate(COMMENT_MAX);
    c
}

/// What the kernel has of the shared tables and of one attachment.
#[derive(Debug, Default, Clone)]
pub struct Found {
    /// `inet cni_plugins_masquerade` exists.
    pub masq_table: bool,
    /// Its `masq_checks` chain exists.
    pub masq_checks: bool,
    /// Its `postrouting` base chain is exactly what ADD writes (nat, srcnat, multicast returns,
    /// `goto masq_checks`).
    pub masq_hooked: bool,
    /// The attachment's rules in `masq_checks`.
    pub masq: Vec<NftRule>,
    /// `bridge nat` has the `PREROUTING` base chain ADD writes.
    pub spoof_base: bool,
    /// `PREROUTING` jump rules of the attachment.
    pub spoof_jumps: Vec<NftRule>,
    /// Which of the two per-attachment spoof chains exist (iface chain, mac chain).
    pub spoof_chains: (bool, bool),
    /// Rules inside the per-attachment spoof chains.
    pub spoof_rules: Vec<NftRule>,
}

impl Found {
    /// The masquerade part, as the shared layout reads it.
    pub fn masq_found(&self) -> ipmasq::Found {
        ipmasq::Found {
            table: self.masq_table,
            checks: self.masq_checks,
            hooked: self.masq_hooked,
            rules: self.masq.clone(),
        }
    }

    /// Nothing of the attachment is there.
    pub fn is_empty(&self) -> bool {
        self.masq.is_empty() && self.spoof_jumps.is_empty() && self.spoof_chains == (false, false)
    }
}

/// Find what the kernel has for `a`; `masq`/`spoof` select what to look at. Netlink only.
pub fn find(nf: &mut dyn Nft, a: &AttachmentId, masq: bool, spoof: bool) -> Result<Found> {
    let mut f = Found::default();
    if masq {
        let m = ipmasq::find(nf, a)?;
        (f.masq_table, f.masq_checks, f.masq_hooked, f.masq) = (m.table, m.checks, m.hooked, m.rules);
    }
    if spoof {
        let refid = a.spoof_ref();
        let (chain, mac_chain, comment) =
            (spoof_chain(&refid), spoof_mac_chain(&refid), spoof_comment(&refid));
        let chains = nf.chain_info(NftFamily::Bridge, SPOOF_TABLE)?;
        f.spoof_base = chains.iter().any(|c| SPOOF_HOOK.is(c));
        f.spoof_chains = (chains.iter().any(|c| c.name == chain), chains.iter().any(|c| c.name == mac_chain));
        if !chains.is_empty() {
            f.spoof_jumps = nf
                .rules(NftFamily::Bridge, SPOOF_TABLE, Some(SPOOF_BASE_CHAIN))?
                .into_iter()
                .filter(|r| r.comment.as_deref() == Some(comment.as_str()))
                .collect();
            for (name, exists) in [(&chain, f.spoof_chains.0), (&mac_chain, f.spoof_chains.1)] {
                if exists {
                    f.spoof_rules.extend(nf.rules(NftFamily::Bridge, SPOOF_TABLE, Some(name))?);
                }
            }
        }
    }
    Ok(f)
}

/// The masquerade rules `a` should have for `addrs` ([`ipmasq::rules`]).
pub fn masq_rules(a: &AttachmentId, addrs: &[IpNet], non_masquerade: Option<&[IpNet]>) -> Vec<NftOp> {
    ipmasq::rules(a, addrs, non_masquerade)
}

/// The ADD transaction for ipMasq ([`ipmasq::add_ops`]).
pub fn masq_add_ops(
    a: &AttachmentId,
    addrs: &[IpNet],
    non_masquerade: Option<&[IpNet]>,
    f: &Found,
) -> Vec<NftOp> {
    ipmasq::add_ops(a, addrs, non_masquerade, &f.masq_found())
}

/// The ADD transaction for macspoofchk on `host_veth` allowing only `mac`. Stale state of the
/// same attachment is replaced.
pub fn spoof_add_ops(a: &AttachmentId, host_veth: &str, mac: Mac, f: &Found) -> Vec<NftOp> {
    let refid = a.spoof_ref();
    let (chain, mac_chain) = (spoof_chain(&refid), spoof_mac_chain(&refid));
    let comment = spoof_comment(&refid);
    let (br, t) = (NftFamily::Bridge, SPOOF_TABLE);
    let mut ops = Vec::new();
    if !f.spoof_base {
        ops.push(NftOp::AddTable { family: br, table: t.into(), comment: None });
        ops.push(SPOOF_HOOK.add_op());
    }
    for r in &f.spoof_jumps {
        ops.push(NftOp::Delete(NftDelete::Rule {
            family: br,
            table: t.into(),
            chain: SPOOF_BASE_CHAIN.into(),
            handle: r.handle,
        }));
    }
    for (name, exists) in [(&chain, f.spoof_chains.0), (&mac_chain, f.spoof_chains.1)] {
        ops.push(if exists {
            NftOp::Delete(NftDelete::Flush { family: br, table: t.into(), chain: name.clone() })
        } else {
            NftOp::AddChain { family: br, table: t.into(), chain: name.clone(), base: None, comment: None }
        });
    }
    let c = Some(comment.as_str());
    let mut jump = RuleExpr::iifname(host_veth);
    jump.push(RuleExpr::Verdict(Verdict::Jump(chain.clone())));
    ops.push(NftOp::rule(br, t, SPOOF_BASE_CHAIN, jump, c));
    ops.push(NftOp::rule(br, t, &chain, vec![RuleExpr::Verdict(Verdict::Jump(mac_chain.clone()))], c));
    let mut allow = RuleExpr::ether_saddr(mac.0);
    allow.push(RuleExpr::Verdict(Verdict::Return));
    ops.push(NftOp::rule(br, t, &mac_chain, allow, c));
    ops.push(NftOp::rule(br, t, &mac_chain, vec![RuleExpr::Verdict(Verdict::Drop)], c));
    ops
}

/// What `a`'s masquerading lacks for `addrs`, judged on what [`find`] read (with `masq`):
/// [`ipmasq::missing`].
pub fn masq_missing(
    f: &Found,
    a: &AttachmentId,
    addrs: &[IpNet],
    non_masquerade: Option<&[IpNet]>,
) -> Option<String> {
    ipmasq::missing(&f.masq_found(), a, addrs, non_masquerade)
}

/// What the MAC spoof check of host veth `host_veth` allowing only `mac` lacks, judged on what
/// [`find`] read (with `spoof`): None when it is in place.
pub fn spoof_missing(f: &Found, host_veth: &str, mac: Mac) -> Option<String> {
    if !f.spoof_jumps.iter().any(|r| r.iifname().as_deref() == Some(host_veth)) {
        return Some(format!("macspoofchk: no rule in bridge nat PREROUTING for {host_veth}"));
    }
    let allowed = f.spoof_rules.iter().any(|r| r.cmp_data().any(|d| d == mac.0.as_slice()))
        && f.spoof_rules.iter().any(|r| r.has_expr("immediate") || r.verdicts().next().is_some());
    (!allowed).then(|| format!("macspoofchk: rules do not allow {mac} on {host_veth}"))
}

/// A netlink connection for the firewall verbs; code 50 when nf_tables cannot be used.
pub fn open() -> Result<NfTables> {
    NfTables::new().map_err(|e| {
        CniError::new(cni_common::code::NOT_AVAILABLE, format!("nf_tables is not usable (netlink): {e}"))
    })
}

/// STATUS: the ADD transaction of a made-up attachment on an empty ruleset (tables, base
/// chains, a masquerade rule of each family, the MAC spoof chains), sent to the kernel and never
/// committed ([`NfTables::validate`]): what an ADD needs of nf_tables (nat, masquerade, the
/// bridge family) is there, whatever the node holds now.
pub fn validate_status(masq: bool, spoof: bool) -> Result<()> {
    let a = AttachmentId::new("status", "status", "eth0");
    let nothing = Found::default();
    let mut ops = Vec::new();
    if masq {
        let addrs: Vec<IpNet> = vec![
            "10.255.255.2/24".parse().expect("an address"),
            "fd00:ffff::2/64".parse().expect("an address"),
        ];
        ops.extend(masq_add_ops(&a, &addrs, None, &nothing));
    }
    if spoof {
        ops.extend(spoof_add_ops(&a, "vethstatus", Mac([0x02, 0, 0, 0, 0, 1]), &nothing));
    }
    let mut nf = open()?;
    cni_common::netlink::nft::certify::validate_certified(&mut nf, "bridge", &ops).map_err(CniError::from)
}

/// ADD's firewall state for `a`: masquerading of `masq` = (addresses, `nonMasqueradeCIDRs`)
/// and the MAC spoof check of `spoof` = (host veth, container MAC), in one transaction built
/// from what the kernel has. If it fails (e.g. a rule it deletes by handle vanished meanwhile),
/// read again and retry once.
pub fn apply_add(
    nf: &mut dyn Nft,
    a: &AttachmentId,
    masq: Option<(&[IpNet], Option<&[IpNet]>)>,
    spoof: Option<(&str, Mac)>,
) -> Result<()> {
    let build = |nf: &mut dyn Nft| -> Result<Vec<NftOp>> {
        let found = find(nf, a, masq.is_some(), spoof.is_some())?;
        let mut ops = Vec::new();
        if let Some((veth, mac)) = spoof {
            ops.extend(spoof_add_ops(a, veth, mac, &found));
        }
        if let Some((addrs, non_masquerade)) = masq.filter(|(addrs, _)| !addrs.is_empty()) {
            ops.extend(masq_add_ops(a, addrs, non_masquerade, &found));
        }
        Ok(ops)
    };
    let ops = build(nf)?;
    match nf.apply(&ops) {
        Ok(()) => Ok(()),
        Err(first) => {
            let ops = build(nf)?;
            nf.apply(&ops).map_err(|e| CniError::from(e).context(format_args!("(retry after: {first})")))
        }
    }
}

/// Deletions of masquerade rules.
fn masq_del_ops(rules: &[NftRule]) -> Vec<NftDelete> {
    ipmasq::del_ops(rules)
}

/// The teardown of what `find` returned, as one netlink transaction (empty: nothing to do).
pub fn del_ops(a: &AttachmentId, f: &Found) -> Vec<NftDelete> {
    let mut ops = masq_del_ops(&f.masq);
    spoof_del_ops(&mut ops, &a.spoof_ref(), f);
    ops
}

fn spoof_del_ops(ops: &mut Vec<NftDelete>, refid: &str, f: &Found) {
    let b = |chain: &str| (NftFamily::Bridge, SPOOF_TABLE.to_string(), chain.to_string());
    for r in &f.spoof_jumps {
        let (family, table, chain) = b(SPOOF_BASE_CHAIN);
        ops.push(NftDelete::Rule { family, table, chain, handle: r.handle });
    }
    let chains = [(spoof_chain(refid), f.spoof_chains.0), (spoof_mac_chain(refid), f.spoof_chains.1)];
    for (name, exists) in &chains {
        if *exists {
            let (family, table, chain) = b(name);
            ops.push(NftDelete::Flush { family, table, chain });
        }
    }
    for (name, exists) in &chains {
        if *exists {
            let (family, table, chain) = b(name);
            ops.push(NftDelete::Chain { family, table, chain });
        }
    }
}

/// GC: the masquerade rules of `network` whose attachment is not in `valid`.
pub fn masq_garbage(nf: &mut dyn Nft, network: &str, valid: &HashSet<String>) -> Result<Vec<NftRule>> {
    Ok(ipmasq::garbage(nf, network, valid)?)
}

/// What GC knows about the host interface a spoof-check rule matches.
pub enum PortOwner {
    /// The interface is gone: the rule can never match again.
    Gone,
    /// It exists and its alias names its attachment ([`AttachmentId::veth_alias`]).
    Attachment(AttachmentId),
    /// It exists but says nothing about its attachment (e.g. made by upstream's bridge).
    Unknown,
}

/// GC: spoof-check state of this network's attachments that are not in `valid`
/// and of any attachment whose host interface is gone, as (reference id, what was found).
// Reads the kernel: not mutated by scripts/mutants.sh (exclude_re does not reach field deletions).
#[cfg_attr(mutants, mutants::skip)]
pub fn spoof_garbage(
    nf: &mut dyn Nft,
    network: &str,
    owner_of: &mut dyn FnMut(&str) -> Result<PortOwner>,
    valid: &HashSet<AttachmentId>,
) -> Result<Vec<(String, Found)>> {
    let chains = nf.chains(NftFamily::Bridge, SPOOF_TABLE)?;
    if chains.is_empty() {
        return Ok(Vec::new());
    }
    let mut out: Vec<(String, Found)> = Vec::new();
    for r in nf.rules(NftFamily::Bridge, SPOOF_TABLE, Some(SPOOF_BASE_CHAIN))? {
        let Some(refid) = r.comment.as_deref().and_then(|c| c.strip_prefix("macspoofchk-")) else { continue };
        let Some(iface) = r.iifname() else { continue };
        let garbage = match owner_of(&iface)? {
            PortOwner::Gone => true,
            PortOwner::Attachment(a) => a.network == network && !valid.contains(&a),
            PortOwner::Unknown => false,
        };
        if !garbage {
            continue;
        }
        let refid = refid.to_string();
        let pos = match out.iter().position(|(id, _)| *id == refid) {
            Some(p) => p,
            None => {
                let f = Found {
                    spoof_chains: (
                        chains.contains(&spoof_chain(&refid)),
                        chains.contains(&spoof_mac_chain(&refid)),
                    ),
                    ..Found::default()
                };
                out.push((refid, f));
                out.len() - 1
            }
        };
        out[pos].1.spoof_jumps.push(r);
    }
    Ok(out)
}

/// The transaction removing GC garbage.
pub fn gc_ops(masq: &[NftRule], spoof: &[(String, Found)]) -> Vec<NftDelete> {
    let mut ops = masq_del_ops(masq);
    for (refid, f) in spoof {
        spoof_del_ops(&mut ops, refid, f);
    }
    ops
}

#[cfg(test)]
mod tests {
    use super::*;
    use cni_common::ipmasq::exclusions as masq_exclusions;
    use cni_common::netlink::nft::{CmpOp, NftChain};

    fn postrouting_ok(rules: &[&NftRule]) -> bool {
        ipmasq::postrouting_ok(&rules.iter().map(|r| (*r).clone()).collect::<Vec<_>>())
    }

    fn a() -> AttachmentId {
        AttachmentId::new("kubenet", "c0ffee", "eth0")
    }

    fn summary(ops: &[NftOp]) -> Vec<String> {
        ops.iter()
            .map(|op| match op {
                NftOp::AddTable { table, comment, .. } => format!("table {table} {}", comment.is_some()),
                NftOp::AddChain { chain, base, .. } => format!("chain {chain} {}", base.is_some()),
                NftOp::AddRule { chain, exprs, comment, .. } => {
                    format!("rule {chain} {} {}", exprs.len(), comment.as_deref().unwrap_or("-"))
                }
                NftOp::Delete(NftDelete::Rule { handle, .. }) => format!("delete {handle}"),
                NftOp::Delete(NftDelete::Flush { chain, .. }) => format!("flush {chain}"),
                other => format!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn add_ops_for_dual_stack() {
        let addrs: Vec<IpNet> = vec!["10.1.0.5/24".parse().unwrap(), "fd00:1::5/64".parse().unwrap()];
        let c = a().masq_comment();
        // meta nfproto + cmp, saddr payload + cmp, daddr payload + cmp, masq
        let rules = vec![format!("rule masq_checks 7 {c}"), format!("rule masq_checks 7 {c}")];
        // Nothing there yet: table, chains and the hook are created.
        let ops = masq_add_ops(&a(), &addrs, None, &Found::default());
        let mut all = vec![
            "table cni_plugins_masquerade true".to_string(),
            "chain masq_checks false".into(),
            "chain postrouting true".into(),
            "flush postrouting".into(),
            "rule postrouting 6 -".into(),
            "rule postrouting 5 -".into(),
            "rule postrouting 1 -".into(),
        ];
        all.extend(rules.clone());
        assert_eq!(summary(&ops), all);
        // Everything shared is in place: only additions.
        let ready = Found { masq_table: true, masq_checks: true, masq_hooked: true, ..Found::default() };
        assert_eq!(summary(&masq_add_ops(&a(), &addrs, None, &ready)), rules);
        match &masq_add_ops(&a(), &addrs, None, &ready)[1] {
            NftOp::AddRule { exprs, .. } => {
                let prefix = RuleExpr::addr(false, "fd00:1::/64".parse().unwrap(), CmpOp::Neq);
                assert_eq!(exprs[4..6], prefix[..], "{exprs:?}");
                assert_eq!(exprs[6], RuleExpr::Masquerade);
            }
            other => panic!("{other:?}"),
        }
        // A stale rule of the same attachment is replaced.
        let stale = Found { masq: vec![rule_at("masq_checks", 9)], ..ready };
        let mut want = vec!["delete 9".to_string()];
        want.extend(rules);
        assert_eq!(summary(&masq_add_ops(&a(), &addrs, None, &stale)), want);
    }

    fn rule_at(chain: &str, handle: u64) -> NftRule {
        NftRule { table: String::new(), chain: chain.into(), handle, comment: None, exprs: vec![] }
    }

    #[test]
    fn non_masquerade_cidrs_like_kubenet() {
        let addr: IpNet = "10.244.3.7/24".parse().unwrap();
        let extra: Vec<IpNet> = vec![
            "10.0.0.0/8".parse().unwrap(),
            "192.168.0.0/16".parse().unwrap(),
            "fd00::/8".parse().unwrap(),
        ];
        // The pod subnet lies inside 10.0.0.0/8: aggregated away; v6 CIDRs not used for v4.
        assert_eq!(
            masq_exclusions(&addr, Some(&extra)),
            Some((vec!["10.0.0.0/8".parse().unwrap(), "192.168.0.0/16".parse().unwrap()], true))
        );
        let rules = masq_rules(&a(), &[addr], Some(&extra));
        assert_eq!(rules.len(), 1);
        let NftOp::AddRule { exprs, .. } = &rules[0] else { panic!("{rules:?}") };
        let mut want = RuleExpr::nfproto(true);
        want.extend(RuleExpr::addr(true, "10.244.3.7/32".parse().unwrap(), CmpOp::Eq));
        want.extend(RuleExpr::addr(false, "10.0.0.0/8".parse().unwrap(), CmpOp::Neq));
        want.extend(RuleExpr::addr(false, "192.168.0.0/16".parse().unwrap(), CmpOp::Neq));
        want.extend(RuleExpr::daddr_not_local());
        want.push(RuleExpr::Masquerade);
        assert_eq!(*exprs, want);
        // Empty list: only non-local destinations outside the pod subnet.
        assert_eq!(masq_exclusions(&addr, Some(&[])), Some((vec!["10.244.3.0/24".parse().unwrap()], true)));
        assert_eq!(masq_exclusions(&addr, None), Some((vec!["10.244.3.0/24".parse().unwrap()], false)));
        // 0.0.0.0/0 means nothing is masqueraded (kubenet skipped its rule then).
        assert!(masq_rules(&a(), &[addr], Some(&["0.0.0.0/0".parse().unwrap()])).is_empty());
    }

    #[test]
    fn spoof_ops_match_upstream_layout() {
        let mac = Mac([0x0a, 0x58, 0x0a, 0x01, 0x00, 0x05]);
        let ops = spoof_add_ops(&a(), "veth1234abcd", mac, &Found::default());
        let c = "macspoofchk-c0ffee-eth0";
        assert_eq!(
            summary(&ops),
            vec![
                "table nat false".to_string(),
                "chain PREROUTING true".into(),
                "chain cni-br-iface-c0ffee-eth0 false".into(),
                "chain cni-br-iface-c0ffee-eth0-mac false".into(),
                format!("rule PREROUTING 3 {c}"),
                format!("rule cni-br-iface-c0ffee-eth0 1 {c}"),
                format!("rule cni-br-iface-c0ffee-eth0-mac 3 {c}"),
                format!("rule cni-br-iface-c0ffee-eth0-mac 1 {c}"),
            ]
        );
        let NftOp::AddChain { base: Some(base), .. } = &ops[1] else { panic!("{:?}", ops[1]) };
        assert_eq!(
            (base.kind.as_str(), base.hook, base.priority),
            ("filter", HOOK_PREROUTING, -300),
            "upstream's base chain"
        );
        let NftOp::AddRule { exprs, .. } = &ops[4] else { panic!() };
        assert_eq!(exprs[..2], RuleExpr::iifname("veth1234abcd")[..]);
        assert_eq!(exprs[2], RuleExpr::Verdict(Verdict::Jump("cni-br-iface-c0ffee-eth0".into())));
        let NftOp::AddRule { exprs, .. } = &ops[6] else { panic!() };
        assert_eq!(exprs[..2], RuleExpr::ether_saddr(mac.0)[..]);
        // Base chain present, stale state of the attachment: replaced, not redefined.
        let f = Found {
            spoof_base: true,
            spoof_jumps: vec![rule_at("PREROUTING", 4)],
            spoof_chains: (true, true),
            ..Found::default()
        };
        let s = summary(&spoof_add_ops(&a(), "veth1234abcd", mac, &f));
        assert_eq!(
            s[..4],
            [
                "delete 4".to_string(),
                "flush cni-br-iface-c0ffee-eth0".into(),
                "flush cni-br-iface-c0ffee-eth0-mac".into(),
                format!("rule PREROUTING 3 {c}"),
            ]
        );
    }

    #[test]
    fn teardown_names_only_what_exists() {
        assert!(del_ops(&a(), &Found::default()).is_empty());
        let f = Found {
            masq: vec![rule_at("masq_checks", 7), rule_at("masq_checks", 9)],
            spoof_jumps: vec![rule_at("PREROUTING", 3)],
            spoof_chains: (true, true),
            ..Found::default()
        };
        let inet = |chain: &str, handle| NftDelete::Rule {
            family: NftFamily::Inet,
            table: "cni_plugins_masquerade".into(),
            chain: chain.into(),
            handle,
        };
        let br = |chain: &str| (NftFamily::Bridge, "nat".to_string(), chain.to_string());
        let (f1, t1, c1) = br("cni-br-iface-c0ffee-eth0");
        let (f2, t2, c2) = br("cni-br-iface-c0ffee-eth0-mac");
        assert_eq!(
            del_ops(&a(), &f),
            vec![
                inet("masq_checks", 7),
                inet("masq_checks", 9),
                NftDelete::Rule {
                    family: NftFamily::Bridge,
                    table: "nat".into(),
                    chain: "PREROUTING".into(),
                    handle: 3
                },
                NftDelete::Flush { family: f1, table: t1.clone(), chain: c1.clone() },
                NftDelete::Flush { family: f2, table: t2.clone(), chain: c2.clone() },
                NftDelete::Chain { family: f1, table: t1, chain: c1 },
                NftDelete::Chain { family: f2, table: t2, chain: c2 },
            ]
        );
    }

    use cni_common::netlink::nft::NftExpr;

    /// A read-back rule: a cmp on `first` (0 = none) and `verdict`.
    fn read_rule(first: u8, verdict: Verdict) -> NftRule {
        let mut exprs = vec![];
        if first != 0 {
            exprs.push(NftExpr::Cmp { op: 0, data: vec![first, 0, 0, 0] });
        }
        exprs.push(NftExpr::Verdict(verdict));
        NftRule { exprs, ..rule_at(MASQ_HOOK_CHAIN, 1) }
    }

    #[test]
    fn postrouting_is_ok_only_with_the_three_rules_add_writes_in_order() {
        let mcast4 = read_rule(224, Verdict::Return);
        let mcast6 = read_rule(0xff, Verdict::Return);
        let goto = read_rule(0, Verdict::Goto(MASQ_CHAIN.into()));
        assert!(postrouting_ok(&[&mcast4, &mcast6, &goto]));
        assert!(!postrouting_ok(&[&mcast4, &mcast6]), "a rule missing");
        assert!(!postrouting_ok(&[&mcast4, &mcast6, &goto, &goto]), "a rule too many");
        assert!(!postrouting_ok(&[&mcast6, &mcast4, &goto]), "out of order");
        assert!(!postrouting_ok(&[&read_rule(10, Verdict::Return), &mcast6, &goto]), "another network");
        assert!(!postrouting_ok(&[&read_rule(224, Verdict::Accept), &mcast6, &goto]), "another verdict");
        assert!(!postrouting_ok(&[&mcast4, &read_rule(0xfe, Verdict::Return), &goto]));
        assert!(!postrouting_ok(&[&mcast4, &read_rule(0xff, Verdict::Accept), &goto]));
        assert!(!postrouting_ok(&[&mcast4, &mcast6, &read_rule(0, Verdict::Goto("other".into()))]));
    }

    #[test]
    fn found_is_empty_only_without_any_piece() {
        assert!(Found::default().is_empty());
        for f in [
            Found { masq: vec![rule_at(MASQ_CHAIN, 3)], ..Found::default() },
            Found { spoof_jumps: vec![rule_at(SPOOF_BASE_CHAIN, 4)], ..Found::default() },
            Found { spoof_chains: (true, false), ..Found::default() },
            Found { spoof_chains: (false, true), ..Found::default() },
        ] {
            assert!(!f.is_empty(), "{f:?}");
        }
        // Shared pieces do not belong to the attachment.
        assert!(
            Found { masq_table: true, masq_checks: true, masq_hooked: true, ..Found::default() }.is_empty()
        );
    }

    #[test]
    fn gc_removes_masquerade_rules_and_spoof_state_of_the_garbage() {
        let refid = a().spoof_ref();
        let spoof = Found {
            spoof_jumps: vec![rule_at(SPOOF_BASE_CHAIN, 8)],
            spoof_chains: (true, true),
            ..Found::default()
        };
        let ops: Vec<NftOp> = gc_ops(&[rule_at(MASQ_CHAIN, 5)], &[(refid.clone(), spoof.clone())])
            .into_iter()
            .map(NftOp::Delete)
            .collect();
        let want: Vec<NftOp> = masq_del_ops(&[rule_at(MASQ_CHAIN, 5)])
            .into_iter()
            .chain(del_ops(&a(), &spoof))
            .map(NftOp::Delete)
            .collect();
        assert_eq!(summary(&ops), summary(&want));
        assert!(ops.len() >= 3, "{ops:?}");
        assert!(gc_ops(&[], &[]).is_empty());
    }

    #[test]
    fn masq_missing_names_an_address_without_its_rule() {
        let addrs: Vec<IpNet> = vec!["10.1.0.5/24".parse().unwrap()];
        let rule = |octets: Vec<u8>| NftRule {
            exprs: vec![NftExpr::Cmp { op: 0, data: octets }, NftExpr::Other("masq".into())],
            ..rule_at(MASQ_CHAIN, 1)
        };
        let hooked = |masq: Vec<NftRule>| Found {
            masq_table: true,
            masq_checks: true,
            masq_hooked: true,
            masq,
            ..Found::default()
        };
        assert_eq!(masq_missing(&hooked(vec![rule(vec![10, 1, 0, 5])]), &a(), &addrs, None), None);
        let m = masq_missing(&hooked(vec![rule(vec![10, 1, 0, 6])]), &a(), &addrs, None)
            .expect("a rule is missing");
        assert!(m.contains("no masquerade rule for source 10.1.0.5"), "{m}");
        let m = masq_missing(&hooked(vec![]), &a(), &addrs, None).expect("no rule at all");
        assert!(m.contains("expected 1 masquerade rule"), "{m}");
        // every rule there, but the base chain no longer leads to them
        let unhooked = Found { masq_hooked: false, ..hooked(vec![rule(vec![10, 1, 0, 5])]) };
        assert_eq!(
            masq_missing(&unhooked, &a(), &addrs, None).as_deref(),
            Some("masquerading is not hooked: chain postrouting of table inet cni_plugins_masquerade does not go to masq_checks")
        );
        // nonMasqueradeCIDRs 0.0.0.0/0: nothing to masquerade, so nothing to hook
        let everything: Vec<IpNet> = vec!["0.0.0.0/0".parse().unwrap()];
        assert_eq!(masq_missing(&Found::default(), &a(), &addrs, Some(&everything)), None);
    }

    /// The rules of `ops` as a rule dump lists them: jumps from the base chain, the rest.
    fn read_back(ops: &[NftOp]) -> (Vec<NftRule>, Vec<NftRule>) {
        let rules = ops.iter().filter_map(|op| match op {
            NftOp::AddRule { chain, exprs, .. } => {
                Some(NftRule { exprs: cni_common::netlink::nft::listed(exprs), ..rule_at(chain, 1) })
            }
            _ => None,
        });
        rules.partition(|r| r.chain == SPOOF_BASE_CHAIN)
    }

    #[test]
    fn spoof_missing_names_what_the_spoof_check_lacks() {
        let mac = Mac([0x0a, 0x58, 0x0a, 0x01, 0x00, 0x05]);
        let (jumps, rules) = read_back(&spoof_add_ops(&a(), "veth1234abcd", mac, &Found::default()));
        let f = Found {
            spoof_base: true,
            spoof_jumps: jumps,
            spoof_chains: (true, true),
            spoof_rules: rules,
            ..Found::default()
        };
        assert_eq!(spoof_missing(&f, "veth1234abcd", mac), None, "what ADD writes");
        assert_eq!(
            spoof_missing(&f, "veth99", mac).as_deref(),
            Some("macspoofchk: no rule in bridge nat PREROUTING for veth99"),
            "the jump is for another veth"
        );
        let other = Mac([0x0a, 0x58, 0x0a, 0x01, 0x00, 0x06]);
        assert_eq!(
            spoof_missing(&f, "veth1234abcd", other).as_deref(),
            Some("macspoofchk: rules do not allow 0a:58:0a:01:00:06 on veth1234abcd")
        );
        let flushed = Found { spoof_rules: vec![], ..f.clone() };
        assert!(spoof_missing(&flushed, "veth1234abcd", mac).is_some(), "chains emptied");
        let without_verdicts: Vec<NftRule> = f
            .spoof_rules
            .iter()
            .map(|r| NftRule {
                exprs: r.exprs.iter().filter(|e| !matches!(e, NftExpr::Verdict(_))).cloned().collect(),
                ..r.clone()
            })
            .collect();
        let f = Found { spoof_rules: without_verdicts, ..f };
        assert!(spoof_missing(&f, "veth1234abcd", mac).is_some(), "the MAC compared, nothing decided");
    }

    #[test]
    fn the_hooks_read_back_as_declared_and_nothing_else_counts() {
        use crate::kernel::fake::{Fake, World};
        let mut f = Fake::new(World::new());
        let nf = crate::kernel::Kernel::nft(&mut f).unwrap();
        let a = a();
        let addrs: Vec<IpNet> = vec!["10.1.0.5/24".parse().unwrap(), "fd00:1::5/64".parse().unwrap()];
        apply_add(nf, &a, Some((&addrs, None)), Some(("veth1", Mac([2, 0, 0, 0, 0, 1])))).unwrap();
        let found = find(nf, &a, true, true).unwrap();
        assert!(found.masq_hooked && found.spoof_base && found.masq_checks, "{found:?}");
        for h in [&MASQ_HOOK, &SPOOF_HOOK] {
            let chains = nf.chain_info(h.family, h.table).unwrap();
            let c = chains.iter().find(|c| c.name == h.chain).unwrap();
            assert!(h.is(c), "{}", h.chain);
            let other = |f: &dyn Fn(&mut NftChain)| {
                let mut x = c.clone();
                f(&mut x);
                h.is(&x)
            };
            assert!(!other(&|x| x.priority_shift()), "{}: priority", h.chain);
            assert!(!other(&|x| x.hook = x.hook.map(|(k, p)| (k + 1, p))), "{}: hook", h.chain);
            assert!(!other(&|x| x.chain_type = Some("route".into())), "{}: type", h.chain);
            assert!(!other(&|x| x.name.push('x')), "{}: name", h.chain);
            assert_eq!(other(&|x| x.policy = Some(0)), h.policy.is_none(), "{}: policy", h.chain);
        }
        // a second ADD finds both hooks and writes neither again
        let again = find(nf, &a, true, true).unwrap();
        let ops = masq_add_ops(&a, &addrs, None, &again);
        assert!(!ops.iter().any(|o| matches!(o, NftOp::AddChain { .. } | NftOp::AddTable { .. })), "{ops:?}");
        assert!(!spoof_add_ops(&a, "veth1", Mac([2, 0, 0, 0, 0, 1]), &again)
            .iter()
            .any(|o| matches!(o, NftOp::AddChain { base: Some(_), .. })));
    }

    trait Shift {
        fn priority_shift(&mut self);
    }

    impl Shift for NftChain {
        fn priority_shift(&mut self) {
            self.hook = self.hook.map(|(k, p)| (k, p + 1));
        }
    }
}
