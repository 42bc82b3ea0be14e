//! The planner and the nftables flows against the fake kernel.

use crate::config::{Conf, Intent};
use crate::kernel::fake::Fake;
use crate::kernel::Kernel;
use crate::model::{desired, FORWARD, PRIV_CHAIN};
use crate::nft;
use cni_common::net::Family;
use cni_common::netlink::nft::{BaseChain, NftOp, Verdict, HOOK_FORWARD, POLICY_DROP};
use std::net::IpAddr;

fn conf(j: serde_json::Value) -> Conf {
    Conf::from_raw(&j).unwrap()
}

fn intent(addrs: &[&str]) -> Intent {
    Intent { addrs: addrs.iter().map(|a| a.parse().unwrap()).collect(), bridge: Some("cni0".into()) }
}

fn all(k: &mut Fake, fam: Family) -> crate::kernel::Tables {
    let names: Vec<String> = k.tables.iter().flat_map(|t| t.1.iter().map(|c| c.name.clone())).collect();
    k.read(fam, &names).unwrap()
}

/// A host where Docker (iptables-nft) set FORWARD's policy to DROP and put its own jump first.
fn docker_host() -> Fake {
    let mut k = Fake::default();
    let family = crate::kernel::nft_family(Family::V4);
    let base =
        BaseChain { kind: "filter".into(), hook: HOOK_FORWARD, priority: 0, policy: Some(POLICY_DROP) };
    let t = "filter".to_string();
    k.commit(&[
        (NftOp::AddTable { family, table: t.clone(), comment: None }, false),
        (
            NftOp::AddChain {
                family,
                table: t.clone(),
                chain: FORWARD.into(),
                base: Some(base),
                comment: None,
            },
            false,
        ),
        (
            NftOp::AddChain {
                family,
                table: t.clone(),
                chain: "DOCKER-USER".into(),
                base: None,
                comment: None,
            },
            false,
        ),
        (
            NftOp::rule(
                family,
                "filter",
                FORWARD,
                vec![cni_common::netlink::nft::RuleExpr::Verdict(Verdict::Jump("DOCKER-USER".into()))],
                None,
            ),
            false,
        ),
    ])
    .unwrap();
    k
}

fn add(k: &mut Fake, c: &Conf, i: &Intent) {
    for fam in [Family::V4, Family::V6] {
        let (chains, rules) = desired(c, i, fam);
        nft::add(k, fam, &c.admin_chain, &chains, &rules).unwrap();
    }
}

fn missing(k: &mut Fake, c: &Conf, i: &Intent) -> Vec<String> {
    let mut out = Vec::new();
    for fam in [Family::V4, Family::V6] {
        let (chains, rules) = desired(c, i, fam);
        out.extend(nft::missing(k, fam, &c.admin_chain, &chains, &rules).unwrap());
    }
    out
}

#[test]
fn add_keeps_someones_drop_policy_and_jumps_first() {
    let mut k = docker_host();
    let c = conf(serde_json::json!({}));
    let i = intent(&["10.88.0.5"]);
    add(&mut k, &c, &i);
    let t = all(&mut k, Family::V4);
    let fwd = t.chains.iter().find(|c| c.name == FORWARD).unwrap();
    assert_eq!(fwd.policy, Some(POLICY_DROP), "the host's policy is not ours to change");
    let first = t.rules_in(FORWARD).next().unwrap();
    assert_eq!(first.verdicts().next(), Some(&Verdict::Jump(PRIV_CHAIN.into())));
    assert_eq!(t.rules_in(PRIV_CHAIN).count(), 4, "the admin jump and the address's three");
    assert!(missing(&mut k, &c, &i).is_empty());
    // a second ADD (or upstream's after ours) adds nothing
    let before = k.generation;
    add(&mut k, &c, &i);
    assert_eq!(k.generation, before);
    // no IPv6 address, no ip6 table
    assert!(k.tables.iter().all(|t| t.0 == Family::V4));
}

#[test]
fn a_bare_host_gets_iptables_nfts_forward_chain_with_policy_accept() {
    let mut k = Fake::default();
    let c = conf(serde_json::json!({"iptablesAdminChainName": "NOMAD-ADMIN"}));
    add(&mut k, &c, &intent(&["10.88.0.5", "fd00::5"]));
    for fam in [Family::V4, Family::V6] {
        let t = all(&mut k, fam);
        let names: Vec<&str> = t.chains.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, [FORWARD, PRIV_CHAIN, "NOMAD-ADMIN"]);
        assert_eq!(t.chains[0].policy, Some(cni_common::netlink::nft::POLICY_ACCEPT));
        assert_eq!(t.chains[0].hook, Some((HOOK_FORWARD, 0)));
    }
}

#[test]
fn del_removes_only_its_addresses_and_every_copy() {
    let mut k = docker_host();
    let c = conf(serde_json::json!({}));
    add(&mut k, &c, &intent(&["10.88.0.5"]));
    add(&mut k, &c, &intent(&["10.88.0.6"]));
    // a copy of the .5 rules, as a concurrent upstream ADD could append
    let (_, rules) = desired(&c, &intent(&["10.88.0.5"]), Family::V4);
    let family = crate::kernel::nft_family(Family::V4);
    let copies: Vec<(NftOp, bool)> = rules[2..]
        .iter()
        .map(|r| (NftOp::rule(family, "filter", &r.chain, r.exprs(), None), false))
        .collect();
    k.commit(&copies).unwrap();
    let five: Vec<IpAddr> = vec!["10.88.0.5".parse().unwrap()];
    nft::del(&mut k, Family::V4, "CNI-ADMIN", &five).unwrap();
    assert!(!missing(&mut k, &c, &intent(&["10.88.0.5"])).is_empty());
    assert!(missing(&mut k, &c, &intent(&["10.88.0.6"])).is_empty());
    assert_eq!(all(&mut k, Family::V4).rules_in(PRIV_CHAIN).count(), 4);
    // again: nothing to do, no transaction
    let applied = k.applied;
    nft::del(&mut k, Family::V4, "CNI-ADMIN", &five).unwrap();
    assert_eq!(k.applied, applied);
}

#[test]
fn a_transaction_in_between_is_seen_and_planned_again() {
    let mut k = Fake::default();
    let c = conf(serde_json::json!({}));
    let i = intent(&["10.88.0.5"]);
    // another ADD (of .6) commits between our read and our apply
    k.between.push(Box::new(|k: &mut Fake| add(k, &conf(serde_json::json!({})), &intent(&["10.88.0.6"]))));
    add(&mut k, &c, &i);
    let t = all(&mut k, Family::V4);
    assert_eq!(t.rules_in(FORWARD).count(), 1, "one jump, not two");
    assert_eq!(t.rules_in(PRIV_CHAIN).count(), 7);
    assert!(missing(&mut k, &c, &i).is_empty());
}

#[test]
fn a_table_that_never_holds_still_ends_in_code_11() {
    struct Busy(Fake);
    impl Kernel for Busy {
        fn read(
            &mut self,
            f: Family,
            c: &[String],
        ) -> Result<crate::kernel::Tables, cni_common::netlink::NlError> {
            let t = self.0.read(f, c);
            self.0.generation += 1;
            t
        }
        fn apply(&mut self, o: &[(NftOp, bool)], g: Option<u32>) -> Result<(), cni_common::netlink::NlError> {
            self.0.apply(o, g)
        }
        fn validate(&mut self, o: &[NftOp]) -> Result<(), cni_common::netlink::NlError> {
            self.0.validate(o)
        }
    }
    let mut k = Busy(Fake::default());
    let c = conf(serde_json::json!({}));
    let (chains, rules) = desired(&c, &intent(&["10.88.0.5"]), Family::V4);
    let e = nft::add(&mut k, Family::V4, "CNI-ADMIN", &chains, &rules).unwrap_err();
    assert_eq!(e.code, cni_common::code::TRY_AGAIN);
    assert!(k.0.tables.is_empty(), "nothing half-applied");
    // a refusal that is not a stale generation is the answer
    let mut f = Fake { fail: Some(libc::EPERM), ..Fake::default() };
    assert!(nft::add(&mut f, Family::V4, "CNI-ADMIN", &chains, &rules).is_err());
    assert!(f.tables.is_empty());
}

#[test]
fn same_bridge_is_upstreams_isolation_chains_in_its_order() {
    let mut k = Fake::default();
    let c = conf(serde_json::json!({"ingressPolicy": "same-bridge"}));
    let i = intent(&["10.88.0.5"]);
    add(&mut k, &c, &i);
    let t = all(&mut k, Family::V4);
    let fwd: Vec<_> = t.rules_in(FORWARD).map(|r| r.verdicts().next().cloned()).collect();
    assert_eq!(
        fwd,
        [Some(Verdict::Jump("CNI-ISOLATION-STAGE-1".into())), Some(Verdict::Jump(PRIV_CHAIN.into()))],
        "the isolation jump runs before CNI-FORWARD"
    );
    assert_eq!(t.rules_in("CNI-ISOLATION-STAGE-1").count(), 2);
    assert_eq!(t.rules_in("CNI-ISOLATION-STAGE-2").count(), 2);
    assert!(missing(&mut k, &c, &i).is_empty());
    assert!(!missing(&mut k, &conf(serde_json::json!({"ingressPolicy": "isolated"})), &i).is_empty());
}

/// The second family (issue 28): DEL of a dual-stack attachment, its addresses listed either
/// way round, removes its rules from both tables and leaves another attachment's in each.
#[test]
fn dual_stack_del_removes_both_families_rules_whichever_comes_first() {
    for order in [["10.88.0.5", "fd00::5"], ["fd00::5", "10.88.0.5"]] {
        let mut k = Fake::default();
        let c = conf(serde_json::json!({}));
        let other = intent(&["10.88.0.6", "fd00::6"]);
        add(&mut k, &c, &intent(&order));
        add(&mut k, &c, &other);
        for fam in [Family::V4, Family::V6] {
            assert_eq!(all(&mut k, fam).rules_in(PRIV_CHAIN).count(), 7, "{order:?} {fam:?}");
        }
        let addrs: Vec<IpAddr> = order.iter().map(|a| a.parse().unwrap()).collect();
        for fam in [Family::V4, Family::V6] {
            nft::del(&mut k, fam, "CNI-ADMIN", &addrs).unwrap();
        }
        for fam in [Family::V4, Family::V6] {
            assert_eq!(
                all(&mut k, fam).rules_in(PRIV_CHAIN).count(),
                4,
                "{order:?} {fam:?}: its three rules gone"
            );
        }
        assert_eq!(missing(&mut k, &c, &intent(&order)).len(), 6, "{order:?}: both families' rules gone");
        assert!(missing(&mut k, &c, &other).is_empty(), "{order:?}: the other attachment's kept");
    }
}

/// An IPv6-only attachment: its ADD makes the ip6 table only, CHECK sees it whole, DEL in the
/// IPv4 table changes nothing (no transaction), DEL in the IPv6 table removes it.
#[test]
fn ipv6_only_attachment_lives_in_the_ip6_table_only() {
    let mut k = Fake::default();
    let c = conf(serde_json::json!({}));
    let i = intent(&["fd00::5"]);
    add(&mut k, &c, &i);
    assert!(k.tables.iter().all(|t| t.0 == Family::V6), "no ip table without an IPv4 address");
    assert!(missing(&mut k, &c, &i).is_empty());
    let addrs: Vec<IpAddr> = vec!["fd00::5".parse().unwrap()];
    let applied = k.applied;
    nft::del(&mut k, Family::V4, "CNI-ADMIN", &addrs).unwrap();
    assert_eq!(k.applied, applied, "nothing of IPv4 to remove");
    nft::del(&mut k, Family::V6, "CNI-ADMIN", &addrs).unwrap();
    assert_eq!(missing(&mut k, &c, &i).len(), 3);
    assert_eq!(all(&mut k, Family::V6).rules_in(PRIV_CHAIN).count(), 1);
}

/// A refusal that is not a stale generation is the answer at once, in either family: not
/// retried into code 11 (mutation triage, issue 28).
#[test]
fn a_refusal_is_returned_as_it_is_not_retried_in_either_family() {
    let c = conf(serde_json::json!({}));
    for (fam, addr) in [(Family::V4, "10.88.0.5"), (Family::V6, "fd00::5")] {
        let (chains, rules) = desired(&c, &intent(&[addr]), fam);
        let mut f = Fake { fail: Some(libc::EPERM), ..Fake::default() };
        let e = nft::add(&mut f, fam, "CNI-ADMIN", &chains, &rules).unwrap_err();
        assert_ne!(e.code, cni_common::code::TRY_AGAIN, "{fam:?}: {}", e.msg);
        assert!(f.tables.is_empty(), "{fam:?}");
    }
}
