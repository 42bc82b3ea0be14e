//! Upstream's rules, declared once: the chains and rules of v1.10's `firewall` (iptables
//! backend and its `ingressPolicy` chains), each rule rendered as iptables words (our
//! iptables backend, CHECK of upstream's state) and as the nf_tables expressions iptables-nft
//! writes for those words (our nftables backend), so a rule written by either is the same rule
//! to both: `iptables-nft -S` lists ours, upstream's `iptables -C` finds ours, we find theirs.

use cni_common::net::Family;
use cni_common::netlink::nft::{
    CmpOp, NftExpr, NftRule, RuleExpr, Verdict, META_IIFNAME, META_OIFNAME, REG_1,
};
use ipnet::IpNet;
use std::net::IpAddr;

pub const FORWARD: &str = "FORWARD";
pub const PRIV_CHAIN: &str = "CNI-FORWARD";
pub const STAGE1: &str = "CNI-ISOLATION-STAGE-1";
pub const STAGE2: &str = "CNI-ISOLATION-STAGE-2";
pub const FILTER_COMMENT: &str = "CNI firewall plugin rules";
pub const ADMIN_COMMENT: &str = "CNI firewall plugin admin overrides";
pub const POLICY_DEFAULT_COMMENT: &str = "CNI firewall plugin rules (ingressPolicy: same-bridge|isolated)";

/// The conntrack states a rule matches (`-m conntrack --ctstate …`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CtState {
    /// `RELATED,ESTABLISHED`: upstream's replies-in rule.
    RelatedEstablished,
    /// `DNAT`: the connection's destination was rewritten by this host's nat (conntrack's
    /// `IPS_DST_NAT`, nftables' `ct status dnat`): a host port (portmap, kube-proxy) led here.
    Dnat,
}

impl CtState {
    fn word(self) -> &'static str {
        match self {
            CtState::RelatedEstablished => "RELATED,ESTABLISHED",
            CtState::Dnat => "DNAT",
        }
    }

    /// `state_mask` of `struct xt_conntrack_mtinfo3` (linux/netfilter/xt_conntrack.h):
    /// `XT_CONNTRACK_STATE_BIT(ctinfo)` is `1 << (ctinfo + 1)` (ESTABLISHED 0 -> 2, RELATED 1
    /// -> 4), `XT_CONNTRACK_STATE_DNAT` is `1 << (IP_CT_NUMBER + 2)` = `1 << 7`.
    fn mask(self) -> u16 {
        match self {
            CtState::RelatedEstablished => 2 | 4,
            CtState::Dnat => 1 << 7,
        }
    }
}

/// One iptables rule of the `filter` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub chain: String,
    /// Inserted at the top of its chain (upstream's `-I … 1`), else appended.
    pub top: bool,
    pub iif: Option<String>,
    /// `[!] -o <name>`: (negated, name).
    pub oif: Option<(bool, String)>,
    pub src: Option<IpAddr>,
    pub dst: Option<IpAddr>,
    /// `-m conntrack --ctstate <states>`
    pub ctstate: Option<CtState>,
    pub comment: Option<String>,
    pub target: String,
}

fn host(a: IpAddr) -> String {
    IpNet::from(a).to_string()
}

impl Rule {
    fn new(chain: &str, target: &str) -> Rule {
        Rule {
            chain: chain.into(),
            top: false,
            iif: None,
            oif: None,
            src: None,
            dst: None,
            ctstate: None,
            comment: None,
            target: target.into(),
        }
    }

    /// The words after `-A <chain>`, in the order iptables-save prints them.
    pub fn words(&self) -> Vec<String> {
        let mut w: Vec<String> = Vec::new();
        if let Some(i) = &self.iif {
            w.extend(["-i".into(), i.clone()]);
        }
        if let Some((neg, o)) = &self.oif {
            if *neg {
                w.push("!".into());
            }
            w.extend(["-o".into(), o.clone()]);
        }
        if let Some(s) = self.src {
            w.extend(["-s".into(), host(s)]);
        }
        if let Some(d) = self.dst {
            w.extend(["-d".into(), host(d)]);
        }
        if let Some(st) = self.ctstate {
            w.extend(["-m", "conntrack", "--ctstate", st.word()].map(String::from));
        }
        if let Some(c) = &self.comment {
            w.extend(["-m".into(), "comment".into(), "--comment".into(), c.clone()]);
        }
        w.extend(["-j".into(), self.target.clone()]);
        w
    }

    /// Whether upstream's firewall writes no such rule (the DNAT accept): an attachment
    /// upstream made lacks it, and CHECK does not ask it of one (see [`crate::check`]).
    pub fn beyond_upstream(&self) -> bool {
        self.ctstate == Some(CtState::Dnat)
    }

    /// The rule as one line of `iptables -S` (for messages).
    pub fn line(&self) -> String {
        let words: Vec<String> =
            self.words().iter().map(|w| if w.contains(' ') { format!("{w:?}") } else { w.clone() }).collect();
        format!("-A {} {}", self.chain, words.join(" "))
    }

    /// The expressions iptables-nft 1.8 writes for [`Rule::words`] (without its `counter`).
    pub fn exprs(&self) -> Vec<RuleExpr> {
        let mut e = Vec::new();
        let ifname = |key: u32, op: CmpOp, name: &str| {
            let mut data = name.as_bytes().to_vec();
            data.push(0); // iptables-nft: the name and its NUL (an exact match)
            [RuleExpr::Meta { key, dreg: REG_1 }, RuleExpr::Cmp { sreg: REG_1, op, data }]
        };
        if let Some(i) = &self.iif {
            e.extend(ifname(META_IIFNAME, CmpOp::Eq, i));
        }
        if let Some((neg, o)) = &self.oif {
            e.extend(ifname(META_OIFNAME, if *neg { CmpOp::Neq } else { CmpOp::Eq }, o));
        }
        if let Some(s) = self.src {
            e.extend(RuleExpr::addr(true, IpNet::from(s), CmpOp::Eq));
        }
        if let Some(d) = self.dst {
            e.extend(RuleExpr::addr(false, IpNet::from(d), CmpOp::Eq));
        }
        if let Some(st) = self.ctstate {
            e.push(RuleExpr::XtMatch { name: "conntrack".into(), rev: 3, info: conntrack_info(st) });
        }
        if let Some(c) = &self.comment {
            e.push(RuleExpr::XtMatch { name: "comment".into(), rev: 0, info: comment_info(c) });
        }
        e.push(RuleExpr::Verdict(match self.target.as_str() {
            "ACCEPT" => Verdict::Accept,
            "DROP" => Verdict::Drop,
            "RETURN" => Verdict::Return,
            chain => Verdict::Jump(chain.into()),
        }));
        e
    }

    /// Whether `found` (read back from the kernel) is this rule: the same expressions, with
    /// the counters iptables-nft adds left out.
    pub fn is(&self, found: &NftRule) -> bool {
        found.chain == self.chain
            && without_counters(&found.exprs) == cni_common::netlink::nft::listed(&self.exprs())
    }

    /// Whether `saved` (an `iptables-save` rule of this chain) is this rule.
    pub fn is_saved(&self, saved: &cni_common::upstream::iptables::SavedRule) -> bool {
        saved.chain == self.chain && saved.rule == cni_common::upstream::iptables::Rule::parse(&self.words())
    }
}

fn without_counters(exprs: &[NftExpr]) -> Vec<NftExpr> {
    exprs.iter().filter(|e| !matches!(e, NftExpr::Other(n) if n == "counter")).cloned().collect()
}

/// `struct xt_conntrack_mtinfo3` for `--ctstate <st>` (168 bytes with x_tables' 8-byte
/// alignment): `match_flags` = XT_CONNTRACK_STATE at 146, `state_mask` ([`CtState::mask`]) at
/// 150, host byte order, the rest zero.
pub fn conntrack_info(st: CtState) -> Vec<u8> {
    let mut info = vec![0u8; 168];
    info[146..148].copy_from_slice(&1u16.to_ne_bytes());
    info[150..152].copy_from_slice(&st.mask().to_ne_bytes());
    info
}

/// `struct xt_comment_info`: the text, NUL-padded to 256 bytes (longer text is cut, as
/// iptables refuses more than 255 bytes).
pub fn comment_info(c: &str) -> Vec<u8> {
    let mut info = c.as_bytes()[..c.len().min(255)].to_vec();
    info.resize(256, 0);
    info
}

/// The rules that must exist before any address rule (upstream's `setupChains`), for
/// admin chain `admin`: the jump from FORWARD and the admin jump, both at the top.
pub fn setup(admin: &str) -> Vec<Rule> {
    let mut fwd = Rule::new(FORWARD, PRIV_CHAIN);
    fwd.comment = Some(FILTER_COMMENT.into());
    fwd.top = true;
    let mut adm = Rule::new(PRIV_CHAIN, admin);
    adm.comment = Some(ADMIN_COMMENT.into());
    adm.top = true;
    vec![fwd, adm]
}

/// The chains upstream creates (`EnsureChain`) for admin chain `admin`.
pub fn chains(admin: &str) -> Vec<String> {
    vec![PRIV_CHAIN.into(), admin.into()]
}

/// An address's rules: upstream's two (replies in, everything out), then ours beyond
/// upstream: connections this host DNATed to the address in (a host port behind someone
/// else's FORWARD drop, as netavark accepts them).
///
/// The DNAT rule matches only a connection whose conntrack entry says this host's nat
/// rewrote its destination to `a` (portmap's host port, a kube-proxy service): a packet sent
/// to `a` directly is not DNATed and still meets the host's policy. Connections from other
/// pods of the plugin were accepted already by their own `-s` rule; `ingressPolicy`'s drops
/// stay first, as their jump precedes `CNI-FORWARD`'s in `FORWARD`.
pub fn addr_rules(a: IpAddr) -> Vec<Rule> {
    let mut r_in = Rule::new(PRIV_CHAIN, "ACCEPT");
    r_in.dst = Some(a);
    r_in.ctstate = Some(CtState::RelatedEstablished);
    let mut r_out = Rule::new(PRIV_CHAIN, "ACCEPT");
    r_out.src = Some(a);
    let mut r_dnat = Rule::new(PRIV_CHAIN, "ACCEPT");
    r_dnat.dst = Some(a);
    r_dnat.ctstate = Some(CtState::Dnat);
    vec![r_in, r_out, r_dnat]
}

/// The chains and rules of `ingressPolicy` same-bridge (`isolated` too when set), in the order
/// upstream's `setupIsolationChains` makes them.
pub fn isolation(bridge: &str, isolated: bool) -> Vec<Rule> {
    let policy = if isolated { "isolated" } else { "same-bridge" };
    let policy_comment = format!("CNI firewall plugin rules (ingressPolicy: {policy})");
    let mut out = Vec::new();
    let mut jump = Rule::new(FORWARD, STAGE1);
    jump.comment = Some(POLICY_DEFAULT_COMMENT.into());
    jump.top = true;
    out.push(jump);
    let mut s1 = Rule::new(STAGE1, STAGE2);
    s1.iif = Some(bridge.into());
    s1.oif = Some((true, bridge.into()));
    s1.comment = Some(policy_comment.clone());
    s1.top = true;
    out.push(s1);
    if isolated {
        let mut d = Rule::new(STAGE1, "DROP");
        d.iif = Some(bridge.into());
        d.oif = Some((false, bridge.into()));
        d.comment = Some(policy_comment);
        d.top = true;
        out.push(d);
    }
    let mut r1 = Rule::new(STAGE1, "RETURN");
    r1.comment = Some(POLICY_DEFAULT_COMMENT.into());
    out.push(r1);
    let mut s2 = Rule::new(STAGE2, "DROP");
    s2.oif = Some((false, bridge.into()));
    s2.comment = Some(POLICY_DEFAULT_COMMENT.into());
    s2.top = true;
    out.push(s2);
    let mut r2 = Rule::new(STAGE2, "RETURN");
    r2.comment = Some(POLICY_DEFAULT_COMMENT.into());
    out.push(r2);
    out
}

/// Everything an attachment needs in family `fam`, in upstream's order: chains, then rules.
/// Empty when the attachment has no address of that family (upstream skips the family).
pub fn desired(
    conf: &crate::config::Conf,
    intent: &crate::config::Intent,
    fam: Family,
) -> (Vec<String>, Vec<Rule>) {
    use crate::config::Ingress;
    let addrs: Vec<IpAddr> = intent.addrs.iter().copied().filter(|a| Family::of(a) == fam).collect();
    let mut chains = Vec::new();
    let mut rules = Vec::new();
    if !addrs.is_empty() {
        chains.extend(self::chains(&conf.admin_chain));
        rules.extend(setup(&conf.admin_chain));
        for a in &addrs {
            rules.extend(addr_rules(*a));
        }
    }
    // upstream: the policy's chains in every family of the result (findProtos)
    if conf.ingress != Ingress::Open && !addrs.is_empty() {
        if let Some(b) = &intent.bridge {
            chains.extend([STAGE1.to_string(), STAGE2.to_string()]);
            rules.extend(isolation(b, conf.ingress == Ingress::Isolated));
        }
    }
    (chains, rules)
}

/// Only the `ingressPolicy` part of [`desired`]: what the firewalld backend adds in iptables
/// form (upstream runs its isolation chains through `iptables` whatever the backend).
pub fn desired_isolation(
    conf: &crate::config::Conf,
    intent: &crate::config::Intent,
    fam: Family,
) -> (Vec<String>, Vec<Rule>) {
    let (chains, rules) = desired(conf, intent, fam);
    let iso = |c: &str| c == STAGE1 || c == STAGE2;
    let jump_to_stage1 = |r: &Rule| r.chain == FORWARD && r.target == STAGE1;
    (
        chains.into_iter().filter(|c| iso(c)).collect(),
        rules.into_iter().filter(|r| iso(&r.chain) || jump_to_stage1(r)).collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_upstreams() {
        let a: IpAddr = "10.1.0.2".parse().unwrap();
        let r = addr_rules(a);
        assert_eq!(
            r[0].line(),
            "-A CNI-FORWARD -d 10.1.0.2/32 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"
        );
        assert_eq!(r[1].line(), "-A CNI-FORWARD -s 10.1.0.2/32 -j ACCEPT");
        assert_eq!(r[2].line(), "-A CNI-FORWARD -d 10.1.0.2/32 -m conntrack --ctstate DNAT -j ACCEPT");
        assert_eq!(r.len(), 3, "upstream's two and the DNAT accept, nothing else per address");
        let s = setup("NOMAD-ADMIN");
        assert_eq!(
            s[0].line(),
            "-A FORWARD -m comment --comment \"CNI firewall plugin rules\" -j CNI-FORWARD"
        );
        assert_eq!(
            s[1].line(),
            "-A CNI-FORWARD -m comment --comment \"CNI firewall plugin admin overrides\" -j NOMAD-ADMIN"
        );
        let v6 = addr_rules("fd00::2".parse().unwrap());
        assert_eq!(v6[1].line(), "-A CNI-FORWARD -s fd00::2/128 -j ACCEPT");
        assert_eq!(v6[2].line(), "-A CNI-FORWARD -d fd00::2/128 -m conntrack --ctstate DNAT -j ACCEPT");
        let iso = isolation("cni0", false);
        assert_eq!(
            iso[1].line(),
            "-A CNI-ISOLATION-STAGE-1 -i cni0 ! -o cni0 -m comment --comment \"CNI firewall plugin rules (ingressPolicy: same-bridge)\" -j CNI-ISOLATION-STAGE-2"
        );
        assert_eq!(iso.len(), 5);
        assert_eq!(isolation("cni0", true).len(), 6);
    }

    #[test]
    fn the_isolation_part_is_the_policys_chains_and_their_jump_only() {
        let conf =
            crate::config::Conf::from_raw(&serde_json::json!({"ingressPolicy": "same-bridge"})).unwrap();
        let intent =
            crate::config::Intent { addrs: vec!["10.1.0.2".parse().unwrap()], bridge: Some("cni0".into()) };
        let (chains, rules) = desired_isolation(&conf, &intent, Family::V4);
        assert_eq!(chains, [STAGE1, STAGE2]);
        assert_eq!(rules.len(), 5);
        assert!(rules.iter().all(|r| r.chain != PRIV_CHAIN && r.target != PRIV_CHAIN));
        assert!(desired_isolation(&conf, &intent, Family::V6).1.is_empty());
        let open = crate::config::Conf::from_raw(&serde_json::json!({})).unwrap();
        assert!(desired_isolation(&open, &intent, Family::V4).1.is_empty());
    }

    /// The expressions of upstream's rules as iptables-nft 1.8.9 sends them (captured with
    /// strace: `iptables-nft -A CNI-FORWARD -d 10.1.0.2/32 -m conntrack --ctstate
    /// RELATED,ESTABLISHED -j ACCEPT`): payload, cmp, match conntrack rev 3 with this info,
    /// counter, accept.
    #[test]
    fn exprs_are_iptables_nfts() {
        let r = &addr_rules("10.1.0.2".parse().unwrap())[0];
        let e = r.exprs();
        assert_eq!(e.len(), 4);
        assert_eq!(e[1], RuleExpr::Cmp { sreg: REG_1, op: CmpOp::Eq, data: vec![10, 1, 0, 2] });
        let RuleExpr::XtMatch { name, rev, info } = &e[2] else { panic!("{e:?}") };
        assert_eq!((name.as_str(), *rev, info.len()), ("conntrack", 3, 168));
        assert_eq!(info.iter().filter(|b| **b != 0).count(), 2);
        assert_eq!(e[3], RuleExpr::Verdict(Verdict::Accept));
        // read back with iptables-nft's counter, it is the same rule; in another chain it is not
        let mut listed = cni_common::netlink::nft::listed(&e);
        listed.insert(3, NftExpr::Other("counter".into()));
        let found = NftRule {
            table: "filter".into(),
            chain: PRIV_CHAIN.into(),
            handle: 9,
            comment: None,
            exprs: listed,
        };
        assert!(r.is(&found));
        assert!(!addr_rules("10.1.0.3".parse().unwrap())[0].is(&found));
        assert!(!addr_rules("10.1.0.2".parse().unwrap())[1].is(&found));
        assert!(!addr_rules("10.1.0.2".parse().unwrap())[2].is(&found), "DNAT is not RELATED,ESTABLISHED");
        assert!(!r.is(&NftRule { chain: "OTHER".into(), ..found }));
        // the DNAT accept: the same shape, state_mask XT_CONNTRACK_STATE_DNAT (1 << 7) alone
        let d = addr_rules("10.1.0.2".parse().unwrap())[2].exprs();
        let RuleExpr::XtMatch { name, rev, info } = &d[2] else { panic!("{d:?}") };
        assert_eq!((name.as_str(), *rev, info.len()), ("conntrack", 3, 168));
        assert_eq!(info[146..148], 1u16.to_ne_bytes(), "match_flags XT_CONNTRACK_STATE");
        assert_eq!(info[150..152], 0x80u16.to_ne_bytes(), "state_mask DNAT");
        assert_eq!(info.iter().filter(|b| **b != 0).count(), 2);
        assert_eq!((&d[..2], &d[3]), (&e[..2], &e[3]), "the address and verdict of the replies rule");
        let c = comment_info(FILTER_COMMENT);
        assert_eq!(
            (c.len(), &c[..FILTER_COMMENT.len()], c[FILTER_COMMENT.len()]),
            (256, FILTER_COMMENT.as_bytes(), 0)
        );
    }
}
