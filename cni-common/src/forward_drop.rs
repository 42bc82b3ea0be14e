//! Who drops forwarded traffic from a subnet: the forward hook chains of every nf_tables table
//! (iptables-nft's `filter FORWARD` among them) and iptables-legacy's `filter FORWARD`, judged
//! for a subnet, with a message naming the chain and the fix. Plugin-agnostic: a plugin that
//! routes or bridges pod traffic calls [`diagnose`] and prints [`Diagnosis::message`] when it is
//! `Some`, with the remedy it knows of (a plugin to add to the list) first.
//!
//! A chain drops the subnet's traffic when its policy is drop or it ends in an unconditional
//! drop, and nothing in it accepts the subnet first: an accept whose address match lies in the
//! subnet, directly or in a chain it jumps to (one level deep: upstream's `CNI-FORWARD` is such
//! a chain). Only whole-chain verdicts are judged: a rule that drops some traffic by its own
//! matches is not reported (it is someone's deliberate rule).

use crate::net::Family;
use crate::netlink::nft::{
    NfTables, NftChain, NftExpr, NftFamily, NftRule, Verdict, HOOK_FORWARD, POLICY_DROP,
};
use crate::upstream::iptables::{self as ipt, Backend};
use ipnet::IpNet;
use std::net::IpAddr;

/// One chain that drops the subnet's forwarded traffic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropper {
    /// "nftables", "iptables-nft" or "iptables-legacy".
    pub owner: &'static str,
    /// `ip filter`, `inet firewalld`, …
    pub table: String,
    pub chain: String,
    /// "policy drop" or "an unconditional drop or reject rule".
    pub how: &'static str,
}

/// What [`diagnose`] found for a subnet.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Diagnosis {
    pub droppers: Vec<Dropper>,
    /// Parts that could not be read (the diagnosis is then partial), one message each.
    pub unread: Vec<String>,
}

/// A forward base chain with its rules and the rules of the chains it jumps to (pure input).
#[derive(Debug, Clone)]
pub struct ForwardChain {
    pub owner: &'static str,
    pub table: String,
    pub chain: NftChain,
    pub rules: Vec<NftRule>,
    pub jumped: Vec<NftRule>,
}

fn addr_bytes(a: IpAddr) -> Vec<u8> {
    match a {
        IpAddr::V4(v) => v.octets().to_vec(),
        IpAddr::V6(v) => v.octets().to_vec(),
    }
}

/// Whether `r` accepts traffic with an address in `subnet`: an accept verdict after a
/// comparison with an address (whole or a prefix on a byte boundary) inside the subnet.
fn accepts_subnet(r: &NftRule, subnet: IpNet) -> bool {
    if !r.verdicts().any(|v| *v == Verdict::Accept) {
        return false;
    }
    let net = addr_bytes(subnet.network());
    let plen = subnet.prefix_len() as usize;
    r.exprs.iter().any(|e| match e {
        NftExpr::Cmp { op: 0, data } if data.len() <= net.len() && !data.is_empty() => {
            let mut full = data.clone();
            full.resize(net.len(), 0);
            let ip = match subnet {
                IpNet::V4(_) => <[u8; 4]>::try_from(full.as_slice()).map(IpAddr::from).ok(),
                IpNet::V6(_) => <[u8; 16]>::try_from(full.as_slice()).map(IpAddr::from).ok(),
            };
            // a host address in the subnet, or the subnet itself (or a wider prefix) compared
            ip.is_some_and(|ip| subnet.contains(&ip)) && (data.len() == net.len() || data.len() * 8 <= plen)
        }
        _ => false,
    })
}

/// A rule that drops or rejects everything that reaches it (`drop`, `reject …`: firewalld's
/// last forward rule), counters aside.
fn unconditional_drop(r: &NftRule) -> bool {
    let meaningful: Vec<&NftExpr> =
        r.exprs.iter().filter(|e| !matches!(e, NftExpr::Other(n) if n == "counter")).collect();
    match meaningful.as_slice() {
        [NftExpr::Verdict(Verdict::Drop)] => true,
        [NftExpr::Other(n)] => n == "reject",
        _ => false,
    }
}

/// Whether `r`, in a chain jumped to, sends the subnet's traffic on: an accept, or a jump or
/// goto on its addresses (firewalld binds a zone's sources with `ip saddr … goto <zone>`).
fn passes_subnet(r: &NftRule, subnet: IpNet) -> bool {
    if accepts_subnet(r, subnet) {
        return true;
    }
    let jumps = r.verdicts().any(|v| matches!(v, Verdict::Jump(_) | Verdict::Goto(_)));
    jumps && {
        let as_accept = NftRule {
            exprs: r
                .exprs
                .iter()
                .map(|e| match e {
                    NftExpr::Verdict(Verdict::Jump(_) | Verdict::Goto(_)) => {
                        NftExpr::Verdict(Verdict::Accept)
                    }
                    other => other.clone(),
                })
                .collect(),
            ..r.clone()
        };
        accepts_subnet(&as_accept, subnet)
    }
}

/// The judgement (pure).
pub fn judge(chains: &[ForwardChain], subnet: IpNet) -> Vec<Dropper> {
    let mut out = Vec::new();
    for c in chains {
        let policy_drop = c.chain.policy == Some(POLICY_DROP);
        let first_drop = c.rules.iter().position(unconditional_drop);
        if !policy_drop && first_drop.is_none() {
            continue;
        }
        let before = &c.rules[..first_drop.unwrap_or(c.rules.len())];
        let opened = before.iter().any(|r| accepts_subnet(r, subnet))
            || before.iter().any(|r| {
                r.verdicts().any(|v| {
                    matches!(v, Verdict::Jump(j) | Verdict::Goto(j)
                    if c.jumped.iter().any(|x| &x.chain == j && passes_subnet(x, subnet)))
                })
            });
        if !opened {
            out.push(Dropper {
                owner: c.owner,
                table: c.table.clone(),
                chain: c.chain.name.clone(),
                how: if first_drop.is_some() {
                    "an unconditional drop or reject rule"
                } else {
                    "policy drop"
                },
            });
        }
    }
    out
}

impl Diagnosis {
    /// A message for the user, `None` when nothing drops the subnet. `remedy` is the caller's
    /// advice (e.g. a plugin to add to the list), said before the manual rules.
    pub fn message(&self, subnet: IpNet, remedy: &str) -> Option<String> {
        if self.droppers.is_empty() {
            return None;
        }
        let which: Vec<String> = self
            .droppers
            .iter()
            .map(|d| format!("{} chain {} of table {} ({})", d.owner, d.chain, d.table, d.how))
            .collect();
        let (tool, fam) = match subnet {
            IpNet::V4(_) => ("iptables", "4"),
            IpNet::V6(_) => ("ip6tables", "6"),
        };
        Some(format!(
            "forwarded traffic from {subnet} will be dropped by {}: {remedy}, or accept the subnet there yourself \
             (IPv{fam}: {tool} -I FORWARD -s {subnet} -j ACCEPT; {tool} -I FORWARD -d {subnet} -m conntrack --ctstate \
             RELATED,ESTABLISHED -j ACCEPT)",
            which.join(", ")
        ))
    }
}

/// Everything that hooks forward in nf_tables for `fam` (tables of family ip/ip6 and inet).
fn nft_chains(nf: &mut NfTables, fam: Family) -> Result<Vec<ForwardChain>, crate::netlink::NlError> {
    let mut out = Vec::new();
    let families = match fam {
        Family::V4 => [NftFamily::Ip, NftFamily::Inet],
        Family::V6 => [NftFamily::Ip6, NftFamily::Inet],
    };
    for f in families {
        for t in nf.tables(f)? {
            let chains = nf.chain_info(f, &t.name)?;
            for c in chains.iter().filter(|c| c.hook.is_some_and(|(h, _)| h == HOOK_FORWARD)) {
                let rules = nf.rules(f, &t.name, Some(&c.name))?;
                let mut jumped = Vec::new();
                for target in rules.iter().flat_map(|r| r.verdicts()).filter_map(|v| match v {
                    Verdict::Jump(j) | Verdict::Goto(j) => Some(j.clone()),
                    _ => None,
                }) {
                    if chains.iter().any(|x| x.name == target) {
                        jumped.extend(nf.rules(f, &t.name, Some(&target))?);
                    }
                }
                let iptables_nft = t.name == "filter" && f != NftFamily::Inet && c.name == "FORWARD";
                out.push(ForwardChain {
                    owner: if iptables_nft { "iptables-nft" } else { "nftables" },
                    table: format!("{} {}", f.keyword(), t.name),
                    chain: c.clone(),
                    rules,
                    jumped,
                });
            }
        }
    }
    Ok(out)
}

/// iptables-legacy's `filter FORWARD` (only when its table is loaded: then `*-save` runs).
fn legacy_drops(fam: Family, subnet: IpNet) -> Result<Option<Dropper>, crate::CniError> {
    let names = match fam {
        Family::V4 => "/proc/thread-self/net/ip_tables_names",
        Family::V6 => "/proc/thread-self/net/ip6_tables_names",
    };
    if !std::fs::read_to_string(names).is_ok_and(|t| t.lines().any(|l| l.trim() == "filter")) {
        return Ok(None);
    }
    let tool = Backend::Legacy.tool(fam, "save");
    let Some(path) = ipt::find_tool(&tool) else { return Ok(None) };
    let out = crate::child::run(
        std::process::Command::new(path).args(["-t", "filter"]),
        None,
        crate::child::Use::Iptables,
    )?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(legacy_judge(&text, subnet))
}

/// The legacy table's judgement from its `*-save` text (pure).
pub fn legacy_judge(save_text: &str, subnet: IpNet) -> Option<Dropper> {
    let policy_drop = save_text.lines().any(|l| l.trim().starts_with(":FORWARD DROP"));
    if !policy_drop {
        return None;
    }
    let t = ipt::parse_table(save_text, "filter");
    let accepts = |chain: &str| {
        t.rules_in(chain).any(|r| {
            r.rule.target.as_deref() == Some("ACCEPT")
                && [r.rule.src, r.rule.dst]
                    .iter()
                    .flatten()
                    .any(|m| !m.negated && subnet.contains(&m.net.addr()))
        })
    };
    let opened = accepts("FORWARD")
        || t.rules_in("FORWARD")
            .filter_map(|r| r.rule.target.as_deref())
            .any(|j| j != "ACCEPT" && accepts(j));
    (!opened).then(|| Dropper {
        owner: "iptables-legacy",
        table: "filter".into(),
        chain: "FORWARD".into(),
        how: "policy drop",
    })
}

/// Read the host (the calling thread's namespace) and judge `subnet`. Errors reading a part
/// are in `unread`; what could be read is judged.
pub fn diagnose(subnet: IpNet) -> Diagnosis {
    let fam = match subnet {
        IpNet::V4(_) => Family::V4,
        IpNet::V6(_) => Family::V6,
    };
    let mut d = Diagnosis::default();
    match NfTables::new().and_then(|mut nf| nft_chains(&mut nf, fam)) {
        Ok(chains) => d.droppers.extend(judge(&chains, subnet)),
        Err(e) => d.unread.push(format!("nf_tables: {e}")),
    }
    match legacy_drops(fam, subnet) {
        Ok(x) => d.droppers.extend(x),
        Err(e) => d.unread.push(format!("iptables-legacy: {}", e.msg)),
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::nft::{listed, CmpOp, RuleExpr, POLICY_ACCEPT};

    fn chain(policy: u32) -> NftChain {
        NftChain {
            name: "FORWARD".into(),
            hook: Some((HOOK_FORWARD, 0)),
            chain_type: Some("filter".into()),
            policy: Some(policy),
            uses: None,
        }
    }

    fn rule(chain: &str, exprs: Vec<RuleExpr>) -> NftRule {
        NftRule {
            table: "filter".into(),
            chain: chain.into(),
            handle: 1,
            comment: None,
            exprs: listed(&exprs),
        }
    }

    fn accept_src(chain: &str, net: &str) -> NftRule {
        let mut e = RuleExpr::addr(true, net.parse().unwrap(), CmpOp::Eq);
        e.push(RuleExpr::Verdict(Verdict::Accept));
        rule(chain, e)
    }

    fn fc(policy: u32, rules: Vec<NftRule>, jumped: Vec<NftRule>) -> ForwardChain {
        ForwardChain { owner: "iptables-nft", table: "ip filter".into(), chain: chain(policy), rules, jumped }
    }

    #[test]
    fn a_drop_policy_is_named_until_the_subnet_is_accepted() {
        let subnet: IpNet = "10.88.0.0/16".parse().unwrap();
        let bare = judge(&[fc(POLICY_DROP, vec![], vec![])], subnet);
        assert_eq!(bare.len(), 1);
        assert_eq!((bare[0].chain.as_str(), bare[0].how), ("FORWARD", "policy drop"));
        let msg = Diagnosis { droppers: bare, unread: vec![] }.message(subnet, "REMEDY").unwrap();
        assert!(
            msg.contains("iptables-nft chain FORWARD of table ip filter (policy drop): REMEDY, or accept"),
            "{msg}"
        );
        assert!(msg.contains("iptables -I FORWARD -s 10.88.0.0/16 -j ACCEPT"), "{msg}");
        // accepted directly (the subnet or a pod's address), or through a chain it jumps to
        assert!(
            judge(&[fc(POLICY_DROP, vec![accept_src("FORWARD", "10.88.0.0/16")], vec![])], subnet).is_empty()
        );
        let jump = rule("FORWARD", vec![RuleExpr::Verdict(Verdict::Jump("CNI-FORWARD".into()))]);
        let pod = accept_src("CNI-FORWARD", "10.88.0.5/32");
        assert!(judge(&[fc(POLICY_DROP, vec![jump.clone()], vec![pod])], subnet).is_empty());
        // another subnet's accept does not count
        let other = accept_src("CNI-FORWARD", "10.99.0.5/32");
        assert_eq!(judge(&[fc(POLICY_DROP, vec![jump], vec![other])], subnet).len(), 1);
        // an accepting policy with no drop rule is fine; an unconditional drop rule is not
        assert!(judge(&[fc(POLICY_ACCEPT, vec![], vec![])], subnet).is_empty());
        let drop = rule("FORWARD", vec![RuleExpr::Verdict(Verdict::Drop)]);
        let d = judge(&[fc(POLICY_ACCEPT, vec![drop.clone()], vec![])], subnet);
        assert_eq!(d[0].how, "an unconditional drop or reject rule");
        // firewalld: a final reject, the zone's sources bound by a goto one jump deep
        let reject = NftRule { exprs: vec![NftExpr::Other("reject".into())], ..rule("FORWARD", vec![]) };
        let zones = rule("FORWARD", vec![RuleExpr::Verdict(Verdict::Jump("filter_FORWARD_ZONES".into()))]);
        assert_eq!(judge(&[fc(POLICY_ACCEPT, vec![zones.clone(), reject.clone()], vec![])], subnet).len(), 1);
        let mut bind = RuleExpr::addr(true, "10.88.0.5/32".parse().unwrap(), CmpOp::Eq);
        bind.push(RuleExpr::Verdict(Verdict::Goto("filter_FWD_trusted".into())));
        let bound = rule("filter_FORWARD_ZONES", bind);
        assert!(judge(&[fc(POLICY_ACCEPT, vec![zones, reject], vec![bound])], subnet).is_empty());
        // an accept after the drop rule is too late
        let late =
            judge(&[fc(POLICY_ACCEPT, vec![drop, accept_src("FORWARD", "10.88.0.0/16")], vec![])], subnet);
        assert_eq!(late.len(), 1);
        assert_eq!(Diagnosis::default().message(subnet, "REMEDY"), None);
    }

    #[test]
    fn legacy_save_text_is_judged_the_same_way() {
        let subnet: IpNet = "10.88.0.0/16".parse().unwrap();
        let docker = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT ACCEPT [0:0]\n-A FORWARD -j DOCKER-USER\nCOMMIT\n";
        assert_eq!(legacy_judge(docker, subnet).map(|d| d.owner), Some("iptables-legacy"));
        let fixed = "*filter\n:FORWARD DROP [0:0]\n:CNI-FORWARD - [0:0]\n-A FORWARD -j CNI-FORWARD\n-A CNI-FORWARD -s 10.88.0.5/32 -j ACCEPT\nCOMMIT\n";
        assert_eq!(legacy_judge(fixed, subnet), None);
        assert_eq!(legacy_judge("*filter\n:FORWARD ACCEPT [0:0]\nCOMMIT\n", subnet), None);
    }
}
