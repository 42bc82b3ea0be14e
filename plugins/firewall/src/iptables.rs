//! The iptables backend: upstream's rules exactly, through `iptables-*-save -t filter` and one
//! `iptables-*-restore --noflush` per family (the same rules [`crate::model`] renders for the
//! nftables backend), so upstream's firewall and ours share state on a live swap.

use crate::model::{addr_rules, Rule, PRIV_CHAIN};
use cni_common::net::Family;
use cni_common::upstream::iptables::{restore_table, save_table, Backend, Script, Table};
use cni_common::Result;
use std::net::IpAddr;

/// The script that adds what `t` lacks (pure).
pub fn plan_add(t: &Table, chains: &[String], rules: &[Rule]) -> Script {
    let mut s = Script::default();
    for c in chains.iter().filter(|c| !t.has_chain(c)) {
        s.new_chain(c);
    }
    for r in rules.iter().filter(|r| !t.rules_in(&r.chain).any(|x| r.is_saved(x))) {
        if r.top {
            s.insert_first(&r.chain, &r.words());
        } else {
            s.append(&r.chain, &r.words());
        }
    }
    s
}

/// The script that deletes every copy of the address rules of `addrs` (pure).
pub fn plan_del(t: &Table, fam: Family, addrs: &[IpAddr]) -> Script {
    let wanted: Vec<Rule> =
        addrs.iter().filter(|a| Family::of(a) == fam).flat_map(|a| addr_rules(*a)).collect();
    let mut s = Script::default();
    for saved in t.rules_in(PRIV_CHAIN).filter(|x| wanted.iter().any(|r| r.is_saved(x))) {
        s.delete(saved);
    }
    s
}

/// What `t` lacks (CHECK), as iptables lines.
pub fn missing_in(t: &Table, chains: &[String], rules: &[Rule]) -> Vec<String> {
    let mut out: Vec<String> = chains.iter().filter(|c| !t.has_chain(c)).map(|c| format!("-N {c}")).collect();
    out.extend(rules.iter().filter(|r| !t.rules_in(&r.chain).any(|x| r.is_saved(x))).map(Rule::line));
    out
}

pub fn add(b: Backend, fam: Family, chains: &[String], rules: &[Rule]) -> Result<()> {
    if rules.is_empty() {
        return Ok(());
    }
    let t = save_table(b, fam, "filter")?;
    restore_table(b, fam, "filter", &plan_add(&t, chains, rules))
}

pub fn del(b: Backend, fam: Family, addrs: &[IpAddr]) -> Result<()> {
    if !addrs.iter().any(|a| Family::of(a) == fam) {
        return Ok(());
    }
    let t = save_table(b, fam, "filter")?;
    restore_table(b, fam, "filter", &plan_del(&t, fam, addrs))
}

pub fn missing(b: Backend, fam: Family, chains: &[String], rules: &[Rule]) -> Result<Vec<String>> {
    if rules.is_empty() {
        return Ok(Vec::new());
    }
    Ok(missing_in(&save_table(b, fam, "filter")?, chains, rules))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cni_common::upstream::iptables::parse_table;

    /// `iptables-nft-save -t filter` after upstream v1.10's firewall ADDed 10.88.0.5 (the
    /// rules as iptables-save prints them, Debian 12, iptables 1.8.9).
    const SAVED: &str = r#"*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
:CNI-ADMIN - [0:0]
:CNI-FORWARD - [0:0]
-A FORWARD -m comment --comment "CNI firewall plugin rules" -j CNI-FORWARD
-A FORWARD -j DOCKER-USER
-A CNI-FORWARD -m comment --comment "CNI firewall plugin admin overrides" -j CNI-ADMIN
-A CNI-FORWARD -d 10.88.0.5/32 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A CNI-FORWARD -s 10.88.0.5/32 -j ACCEPT
COMMIT
"#;

    #[test]
    fn upstreams_state_is_ours() {
        let t = parse_table(SAVED, "filter");
        let a: IpAddr = "10.88.0.5".parse().unwrap();
        let conf = crate::config::Conf::from_raw(&serde_json::json!({})).unwrap();
        let intent = crate::config::Intent { addrs: vec![a], bridge: None };
        let (chains, rules) = crate::model::desired(&conf, &intent, Family::V4);
        // upstream's layout is whole; of ours only the DNAT accept is missing, and ADD adds it
        let upstreams = crate::check::asked(rules.clone(), false);
        assert!(missing_in(&t, &chains, &upstreams).is_empty());
        let dnat = "-A CNI-FORWARD -d 10.88.0.5/32 -m conntrack --ctstate DNAT -j ACCEPT";
        assert_eq!(missing_in(&t, &chains, &rules), [dnat]);
        let added: Vec<String> = plan_add(&t, &chains, &rules).lines().map(String::from).collect();
        assert_eq!(added, [dnat]);
        let with_ours = parse_table(&SAVED.replace("COMMIT", &format!("{dnat}\nCOMMIT")), "filter");
        assert!(missing_in(&with_ours, &chains, &rules).is_empty());
        assert!(plan_add(&with_ours, &chains, &rules).is_empty());
        assert_eq!(plan_del(&with_ours, Family::V4, &[a]).lines().count(), 3, "DEL takes all three");
        let del = plan_del(&t, Family::V4, &[a]);
        assert_eq!(del.lines().count(), 2, "{:?}", del.text());
        assert!(plan_del(&t, Family::V4, &["10.88.0.6".parse().unwrap()]).is_empty());
        let other = crate::config::Intent { addrs: vec!["10.88.0.6".parse().unwrap()], bridge: None };
        let (c2, r2) = crate::model::desired(&conf, &other, Family::V4);
        let lines: Vec<String> = plan_add(&t, &c2, &r2).lines().map(String::from).collect();
        assert_eq!(
            lines,
            [
                "-A CNI-FORWARD -d 10.88.0.6/32 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
                "-A CNI-FORWARD -s 10.88.0.6/32 -j ACCEPT",
                "-A CNI-FORWARD -d 10.88.0.6/32 -m conntrack --ctstate DNAT -j ACCEPT"
            ]
        );
        let empty = parse_table("*filter\n:FORWARD ACCEPT [0:0]\nCOMMIT\n", "filter");
        let first: Vec<String> = plan_add(&empty, &chains, &rules).lines().map(String::from).collect();
        assert_eq!(
            first[..3],
            [
                "-N CNI-FORWARD",
                "-N CNI-ADMIN",
                "-I FORWARD 1 -m comment --comment \"CNI firewall plugin rules\" -j CNI-FORWARD"
            ]
        );
    }
}
