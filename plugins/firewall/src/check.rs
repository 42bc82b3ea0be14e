//! CHECK: every chain and rule of the attachment is there (ours or upstream's: the same).
//!
//! One rule is ours alone: the DNAT accept ([`crate::model::addr_rules`]). An attachment our
//! ADD made (it has our record) must have it; one without our record was made by upstream's
//! firewall (a node switched with pods running), whose layout is upstream's two rules per
//! address: CHECK asks that layout of it, and our next ADD of it adds the third rule.

use crate::backend::{self, Chosen};
use crate::config::{Conf, Intent};
use crate::model::{desired, desired_isolation, Rule};
use cni_common::net::Family;
use cni_common::{CniError, Result};

/// The rules CHECK asks of an attachment (pure): all of them when our ADD made it.
pub fn asked(rules: Vec<Rule>, made_by_us: bool) -> Vec<Rule> {
    rules.into_iter().filter(|r| made_by_us || !r.beyond_upstream()).collect()
}

/// CHECK of the whole layout, ours (what our ADD writes).
pub fn check(conf: &Conf, intent: &Intent, b: Chosen) -> Result<()> {
    check_made(conf, intent, b, true)
}

/// CHECK of an attachment our ADD made (`made_by_us`: our record exists) or upstream's.
pub fn check_made(conf: &Conf, intent: &Intent, b: Chosen, made_by_us: bool) -> Result<()> {
    let missing = missing_of(conf, intent, b, made_by_us)?;
    if missing.is_empty() {
        return Ok(());
    }
    Err(CniError::internal(format!(
        "firewall ({}): {} of the attachment's rules missing: {}",
        b.name(),
        missing.len(),
        missing.join("; ")
    )))
}

/// What of the attachment's chains and rules (ours, all of them) backend `b` lacks (resync's
/// judgment): empty when everything is there. Err: the backend cannot be read.
pub fn missing(conf: &Conf, intent: &Intent, b: Chosen) -> Result<Vec<String>> {
    missing_of(conf, intent, b, true)
}

/// [`missing`] of the rules CHECK asks of an attachment ([`asked`]).
fn missing_of(conf: &Conf, intent: &Intent, b: Chosen, made_by_us: bool) -> Result<Vec<String>> {
    let mut missing = Vec::new();
    for fam in [Family::V4, Family::V6] {
        let (chains, rules) = desired(conf, intent, fam);
        let rules = asked(rules, made_by_us);
        let names = backend::Names { admin: &conf.admin_chain, zone: &conf.zone };
        missing.extend(backend::missing(b, fam, names, &intent.addrs, &chains, &rules)?);
        if b == Chosen::Firewalld {
            let (chains, rules) = desired_isolation(conf, intent, fam);
            let iso = backend::isolation_backend();
            missing.extend(backend::missing(iso, fam, names, &intent.addrs, &chains, &rules)?);
        }
    }
    Ok(missing)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attachment_upstream_made_is_asked_upstreams_layout_ours_all_of_ours() {
        let conf = Conf::from_raw(&serde_json::json!({})).unwrap();
        let intent = Intent { addrs: vec!["10.88.0.5".parse().unwrap()], bridge: None };
        let (_, rules) = desired(&conf, &intent, Family::V4);
        let ours = asked(rules.clone(), true);
        assert_eq!(ours, rules);
        assert!(ours.iter().any(|r| r.line().ends_with("--ctstate DNAT -j ACCEPT")));
        let upstreams: Vec<String> = asked(rules, false).iter().map(Rule::line).collect();
        assert_eq!(
            upstreams[2..],
            [
                "-A CNI-FORWARD -d 10.88.0.5/32 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
                "-A CNI-FORWARD -s 10.88.0.5/32 -j ACCEPT"
            ]
        );
    }
}
