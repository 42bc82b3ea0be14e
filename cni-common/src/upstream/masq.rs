//! `ipMasq`, as upstream's iptables backend makes it (pkg/ip/ipmasq_linux.go,
//! `SetupIPMasq`; every version since 0.x, the default backend through v1.9): per attachment a
//! chain `CNI-<hash(network+id)>` in table `nat` of `iptables` (IPv4 addresses) and/or
//! `ip6tables` (IPv6), holding
//!
//! ```text
//! -d <address/prefix> -j ACCEPT -m comment --comment 'name: "<net>" id: "<id>"'
//! ! -d 224.0.0.0/4 (ff00::/8) -j MASQUERADE -m comment --comment …
//! ```
//!
//! and jumped to from `POSTROUTING -s <address> -j CNI-… -m comment --comment …`. Upstream's
//! nftables backend (v1.6+) writes table `inet cni_plugins_masquerade`, which is our own
//! layout: the plugins that masquerade handle that one themselves.

use super::iptables::{self, Fam, Rule, Table};
use super::{locate, names, nftables, Found, Teardown};
use crate::error_list::ErrorList;
use crate::{CniError, Request, Result};
use ipnet::IpNet;
use std::collections::HashSet;

/// Multicast destinations upstream never masquerades.
fn multicast(fam: Fam) -> &'static str {
    match fam {
        Fam::V4 => "224.0.0.0/4",
        Fam::V6 => "ff00::/8",
    }
}

/// The rules upstream's ADD writes for one address, in its order and spelling: (chain, args).
pub fn upstream_rules(network: &str, container_id: &str, addr: IpNet) -> Vec<(String, Vec<String>)> {
    let chain = names::masq_chain(network, container_id);
    let comment = names::masq_comment(network, container_id);
    let fam = Fam::of(&addr.addr());
    let c = |args: &[&str]| {
        let mut v = iptables::words(args);
        v.extend(iptables::words(&["-m", "comment", "--comment", &comment]));
        v
    };
    vec![
        (chain.clone(), c(&["-d", &addr.to_string(), "-j", "ACCEPT"])),
        (chain.clone(), c(&["!", "-d", multicast(fam), "-j", "MASQUERADE"])),
        ("POSTROUTING".into(), c(&["-s", &addr.addr().to_string(), "-j", &chain])),
    ]
}

fn teardown(network: &str, container_id: &str) -> Teardown {
    let chain = names::masq_chain(network, container_id);
    Teardown::default().jump("POSTROUTING", &chain).chain(&chain)
}

/// Remove upstream's masquerade state of (network, container id) from every backend and
/// family that has it. Returns whether anything was there. Costs two nf_tables GETs and two
/// `/proc` reads when nothing is.
pub fn remove(network: &str, container_id: &str) -> Result<bool> {
    let chain = names::masq_chain(network, container_id);
    let mut nf = nftables();
    let at = locate(nf.as_mut(), std::slice::from_ref(&chain))?;
    if at.is_empty() {
        return Ok(false);
    }
    let t = teardown(network, container_id);
    let mut errors = ErrorList::new();
    for (backend, fam) in at {
        if let Err(e) = t.apply(nf.as_mut(), backend, fam) {
            errors.push(e);
        }
    }
    errors.finish().map(|()| true)
}

/// DEL: remove what upstream's bridge made for this attachment's `ipMasq` (upstream keys it by
/// network and container id only; the addresses are not needed, so an empty or vanished
/// CNI_NETNS is no obstacle).
pub fn del(req: &Request) -> Result<()> {
    remove(req.network(), &req.env.container_id)
        .map(drop)
        .map_err(|e| e.context("remove upstream's iptables masquerade rules"))
}

/// Whether `t` (the `nat` table of `addr`'s family) holds upstream's rules for `addr`; the
/// first missing one otherwise.
pub fn missing_rule(t: &Table, network: &str, container_id: &str, addr: IpNet) -> Option<String> {
    let chain = names::masq_chain(network, container_id);
    if !t.has_chain(&chain) {
        return Some(format!("chain {chain} does not exist"));
    }
    for (c, args) in upstream_rules(network, container_id, addr) {
        if !t.contains(&c, &Rule::parse(&args)) {
            return Some(format!("chain {c} lacks rule `{}`", args.join(" ")));
        }
    }
    None
}

/// CHECK: when upstream made this attachment's masquerading, whether it is complete (every
/// address of prevResult has its rules); [`Found::Absent`] when upstream made none.
pub fn check(req: &Request) -> Result<Found> {
    let (net, id) = (req.network(), req.env.container_id.as_str());
    let chain = names::masq_chain(net, id);
    let at = locate(nftables().as_mut(), std::slice::from_ref(&chain))?;
    if at.is_empty() {
        return Ok(Found::Absent);
    }
    let addrs = match req.prev_result()? {
        Some(prev) => crate::net::interface_addrs(&prev, &req.env.ifname)?,
        None => Vec::new(),
    };
    for addr in addrs {
        let fam = Fam::of(&addr.addr());
        let Some((backend, _)) = at.iter().find(|(_, f)| *f == fam) else {
            return Err(CniError::internal(format!(
                "upstream's masquerade chain {chain} exists, but not in the {} nat table (address {addr})",
                if fam == Fam::V4 { "iptables" } else { "ip6tables" }
            )));
        };
        let t = iptables::save(*backend, fam)?;
        if let Some(why) = missing_rule(&t, net, id, addr) {
            return Err(CniError::internal(format!(
                "masquerading made by upstream's bridge ({} backend) is incomplete: {why}",
                backend.name()
            )));
        }
    }
    Ok(Found::Intact)
}

/// The container ids of network `network` whose upstream masquerade chain is in `t` and which
/// are not in `keep`.
fn dead_in(t: &Table, network: &str, keep: &HashSet<&str>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for r in &t.rules {
        let Some((net, id)) = r.rule.comment.as_deref().and_then(|c| names::parse_comment("", c)) else {
            continue;
        };
        if net != network || keep.contains(id) || out.iter().any(|x| x == id) {
            continue;
        }
        let chain = names::masq_chain(net, id);
        if r.chain == chain || (r.chain == "POSTROUTING" && r.rule.target.as_deref() == Some(chain.as_str()))
        {
            out.push(id.to_string());
        }
    }
    out
}

/// GC of upstream's masquerade state (found by the network name in upstream's rule comments).
struct Gc;

impl super::Collect for Gc {
    const WHAT: &'static str = "masquerade rules";

    fn is_chain(c: &str) -> bool {
        names::is_masq_chain(c)
    }

    fn dead_in(t: &Table, network: &str, keep: &HashSet<&str>) -> Vec<String> {
        dead_in(t, network, keep)
    }

    fn teardown(network: &str, container_id: &str) -> Teardown {
        teardown(network, container_id)
    }
}

/// GC: remove upstream's masquerade state of this network's attachments that are not in the
/// valid list (found by the network name in upstream's rule comments).
pub fn gc(req: &Request) -> Result<()> {
    super::collect::<Gc>(req)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::iptables::SAVED_FOR_TESTS;

    #[test]
    fn upstream_form_of_a_captured_attachment() {
        let t = Table::parse(SAVED_FOR_TESTS);
        let a: IpNet = "10.77.0.2/24".parse().unwrap();
        assert_eq!(missing_rule(&t, "swnet", "ctrA", a), None);
        let other: IpNet = "10.77.0.3/24".parse().unwrap();
        assert!(missing_rule(&t, "swnet", "ctrA", other).unwrap().contains("POSTROUTING"));
        assert!(missing_rule(&t, "swnet", "ctrB", a).unwrap().contains("does not exist"));
        let keep: HashSet<&str> = HashSet::new();
        assert_eq!(dead_in(&t, "swnet", &keep), vec!["ctrA"]);
        assert!(dead_in(&t, "other", &keep).is_empty());
        assert!(dead_in(&t, "swnet", &HashSet::from(["ctrA"])).is_empty());
        let s = teardown("swnet", "ctrA").script(&t);
        assert_eq!(s.lines().count(), 3, "{}", s.text());
    }
}
