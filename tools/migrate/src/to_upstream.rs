//! `to-upstream`: every live attachment of ours gets the iptables form upstream's plugins 1.1.1
//! make (the chains and rules their DEL and CHECK look for), in the backend the node's
//! `iptables` command uses; once that form is verified in the kernel, our elements and rules
//! of those attachments are deleted, and our tables when nothing else is left in them.

use crate::inventory::Inventory;
use crate::ours::{self, MasqRule};
use crate::{Opts, Report};
use bridge::firewall;
use cni_common::attachment::AttachmentId;
use cni_common::netlink::nft::{NfTables, NftDelete, NftFamily, NftOp};
use cni_common::netlink::{Family, Netlink, RouteKind, TABLE_MAIN};
use cni_common::spec::config::{PortMapConf, PortMapRuntime, PortMapping};
use cni_common::upstream::hostport::{self, Spec};
use cni_common::upstream::iptables::{self, Backend, Fam, Rule, Script, Table};
use cni_common::upstream::{masq, names};
use cni_common::{CniError, Result};
use ipnet::IpNet;
use serde_json::Value;
use std::collections::BTreeMap;
use std::net::IpAddr;

type Ident = (String, String, String);

/// One attachment of ours and what upstream's form of it needs.
#[derive(Default)]
struct Att {
    masq_rules: Vec<MasqRule>,
    dnat: Vec<ours::Dnat>,
    masq_elems: Vec<ours::Masq>,
    /// Masquerade: container addresses (with prefix) and extra networks left alone
    /// (`nonMasqueradeCIDRs`).
    addrs: Vec<IpNet>,
    extra_accept: Vec<IpNet>,
    hostports: Option<Spec>,
}

/// The container's prefix from the host's routes (the connected route of the bridge).
fn prefix_from_routes(nl: &mut Netlink, ip: IpAddr) -> Option<IpNet> {
    let fam = if ip.is_ipv4() { Family::V4 } else { Family::V6 };
    let routes = nl.routes(Some(fam)).ok()?;
    let best = routes
        .iter()
        .filter(|r| r.table == TABLE_MAIN && r.kind == RouteKind::Unicast && r.dst.contains(&ip))
        .filter(|r| r.dst.prefix_len() < r.dst.max_prefix_len() && r.dst.prefix_len() > 0)
        .max_by_key(|r| r.dst.prefix_len())?;
    IpNet::new(ip, best.dst.prefix_len()).ok()
}

fn prefix_of(
    inv_result: Option<&cni_common::spec::result::CniResult>,
    nl: &mut Netlink,
    ip: IpAddr,
) -> IpNet {
    if let Some(r) = inv_result {
        if let Some(x) = r.ips.iter().find(|x| x.address.addr() == ip) {
            return x.address;
        }
    }
    prefix_from_routes(nl, ip).unwrap_or_else(|| IpNet::from(ip))
}

/// The mappings of an attachment from its DNAT elements (a wildcard mapping has one element
/// per family: one mapping), in element order.
fn mappings_from(dnat: &[ours::Dnat]) -> Vec<PortMapping> {
    let mut out: Vec<PortMapping> = Vec::new();
    for d in dnat {
        let m = PortMapping {
            host_port: i64::from(d.host_port),
            container_port: i64::from(d.ctr_port),
            protocol: d.proto.clone(),
            host_ip: d.host_ip.map(|ip| ip.to_string()).unwrap_or_default(),
        };
        if !out.contains(&m) {
            out.push(m);
        }
    }
    out
}

/// The upstream configuration of an attachment without a cache entry, from our elements.
fn reconstruct(id: &Ident, a: &Att, masq_decodable: bool, nl: &mut Netlink) -> Spec {
    let pick = |v4: bool| a.dnat.iter().map(|d| d.ctr).find(|ip| ip.is_ipv4() == v4);
    let with_prefix = |ip: IpAddr, nl: &mut Netlink| {
        // the container subnet of a hairpin masquerade element, else the routes
        a.masq_elems
            .iter()
            .filter(|m| m.ctr == ip && m.src.prefix_len() > 0 && m.src.prefix_len() < m.src.max_prefix_len())
            .find(|m| m.src.contains(&ip))
            .and_then(|m| IpNet::new(ip, m.src.prefix_len()).ok())
            .or_else(|| prefix_from_routes(nl, ip))
            .unwrap_or_else(|| IpNet::from(ip))
    };
    let everything = |m: &ours::Masq| m.src.prefix_len() == 0;
    let masq_all = a.masq_elems.iter().any(everything);
    // No masquerade element at all (and the sets could be read): snat was off.
    let snat = !masq_decodable || !a.masq_elems.is_empty();
    Spec {
        network: id.0.clone(),
        container_id: id.1.clone(),
        conf: PortMapConf {
            snat: Some(snat),
            masq_all,
            runtime_config: Some(PortMapRuntime { port_mappings: Some(mappings_from(&a.dnat)) }),
            ..PortMapConf::default()
        },
        v4: pick(true).map(|ip| with_prefix(ip, nl)),
        v6: pick(false).map(|ip| with_prefix(ip, nl)),
    }
}

/// nft-syntax conditions (ours) cannot be written as iptables matches.
fn iptables_conditions(spec: &mut Spec, report: &mut Report, who: &str) {
    for (fam, conds) in [("V4", &mut spec.conf.conditions_v4), ("V6", &mut spec.conf.conditions_v6)] {
        let Some(list) = conds.as_deref() else { continue };
        if let Some(first) = list.first() {
            if !(first.starts_with('-') || first.starts_with('!')) {
                report.notes.push(format!(
                    "{who}: conditions{fam} {list:?} are nft syntax, which upstream 1.1.1 cannot use: \
                     its host ports are written without them (upstream would fail to ADD with them)"
                ));
                *conds = None;
            }
        }
    }
}

/// Append `args` to `chain` unless the table has it already.
fn ensure(s: &mut Script, t: &Table, chain: &str, args: &[String]) {
    if !t.contains(chain, &Rule::parse(args)) {
        s.append(chain, args);
    }
}

/// Rules of one per-attachment chain: when it exists with some rule missing it is flushed and
/// rewritten in upstream's order (the marks must come before the DNAT rule).
fn ensure_chain(s: &mut Script, t: &Table, chain: &str, rules: &[Vec<String>]) {
    let complete = rules.iter().all(|r| t.contains(chain, &Rule::parse(r)));
    if complete && t.has_chain(chain) {
        return;
    }
    if t.has_chain(chain) {
        s.flush(chain);
    } else {
        s.new_chain(chain);
    }
    for r in rules {
        s.append(chain, r);
    }
}

/// The restore script writing upstream's form of `atts` for family `fam` into `t`.
fn script_for(t: &Table, fam: Fam, atts: &BTreeMap<Ident, Att>) -> Script {
    let mut s = Script::default();
    // portmap's shared chains first (the per-attachment chains jump to them)
    let specs: Vec<&Spec> =
        atts.values().filter_map(|a| a.hostports.as_ref()).filter(|p| p.addr(fam).is_some()).collect();
    if let Some(first) = specs.iter().find(|p| p.makes_mark_chains()).or(specs.first()) {
        let plumbing = hostport::plumbing_rules(first);
        for c in [names::HOSTPORT_SETMARK, names::HOSTPORT_MASQ, names::HOSTPORT_DNAT] {
            let used = c == names::HOSTPORT_DNAT || plumbing.iter().any(|(x, _, _)| x == c);
            if used && !t.has_chain(c) {
                s.new_chain(c);
            }
        }
        for (chain, args, _) in plumbing.iter().filter(|(c, _, _)| c.starts_with("CNI-")) {
            ensure(&mut s, t, chain, args);
        }
    }
    for (id, a) in atts {
        let Some(spec) = &a.hostports else { continue };
        if let Some(d) = hostport::dnat_rules(spec, fam) {
            ensure_chain(&mut s, t, &d.chain, &d.rules);
            for e in &d.entries {
                ensure(&mut s, t, names::HOSTPORT_DNAT, e);
            }
        } else {
            let _ = id;
        }
    }
    // bridge's masquerade chains
    for (id, a) in atts {
        let addrs: Vec<IpNet> = a.addrs.iter().filter(|n| Fam::of(&n.addr()) == fam).copied().collect();
        if addrs.is_empty() {
            continue;
        }
        let chain = names::masq_chain(&id.0, &id.1);
        let comment = names::masq_comment(&id.0, &id.1);
        let mut rules: Vec<Vec<String>> = Vec::new();
        for addr in &addrs {
            let up = masq::upstream_rules(&id.0, &id.1, *addr);
            rules.push(up[0].1.clone());
        }
        for n in a.extra_accept.iter().filter(|n| Fam::of(&n.addr()) == fam) {
            rules.push(iptables::words(&[
                "-d",
                &n.to_string(),
                "-j",
                "ACCEPT",
                "-m",
                "comment",
                "--comment",
                &comment,
            ]));
        }
        for addr in &addrs {
            rules.push(masq::upstream_rules(&id.0, &id.1, *addr)[1].1.clone());
        }
        rules.dedup();
        ensure_chain(&mut s, t, &chain, &rules);
    }
    // the jumps last
    if let Some(first) = specs.iter().find(|p| p.makes_mark_chains()).or(specs.first()) {
        for (chain, args, top) in
            hostport::plumbing_rules(first).into_iter().filter(|(c, _, _)| !c.starts_with("CNI-"))
        {
            if !t.contains(&chain, &Rule::parse(&args)) {
                if top {
                    s.insert_first(&chain, &args);
                } else {
                    s.append(&chain, &args);
                }
            }
        }
    }
    for (id, a) in atts {
        for addr in a.addrs.iter().filter(|n| Fam::of(&n.addr()) == fam) {
            let up = masq::upstream_rules(&id.0, &id.1, *addr);
            ensure(&mut s, t, &up[2].0, &up[2].1);
        }
    }
    s
}

/// What is missing of upstream's form of `atts` in `t`.
fn verify(t: &Table, fam: Fam, atts: &BTreeMap<Ident, Att>) -> Vec<String> {
    let mut out = Vec::new();
    for (id, a) in atts {
        for addr in a.addrs.iter().filter(|n| Fam::of(&n.addr()) == fam) {
            if let Some(why) = masq::missing_rule(t, &id.0, &id.1, *addr) {
                out.push(format!("{}/{}/{}: masquerade: {why}", id.0, id.1, id.2));
            }
        }
        if let Some(spec) = &a.hostports {
            if let Some(why) = hostport::missing_rule(t, spec, fam) {
                out.push(format!("{}/{}/{}: host ports: {why}", id.0, id.1, id.2));
            }
        }
    }
    out
}

fn tools_present(backend: Backend) -> Result<()> {
    for fam in Fam::BOTH {
        for what in ["save", "restore"] {
            let name = backend.tool(fam, what);
            if iptables::find_tool(&name).is_none() {
                return Err(crate::refused(format!(
                    "{name} is not installed: the iptables package is incomplete; nothing was changed"
                )));
            }
        }
    }
    Ok(())
}

/// Delete our state of the converted attachments: masquerade rules by handle, portmap elements
/// by key (re-read, so only what still carries a converted owner tag goes), and each of our
/// tables left empty.
fn remove_ours(nf: &mut NfTables, converted: &[Ident], candidates: &[Ident]) -> Result<()> {
    for attempt in 0..3 {
        let mut ops: Vec<NftOp> = Vec::new();
        for r in ours::read_masq(nf)? {
            if ours::resolve_masq(&r, candidates).is_some_and(|id| converted.contains(&id)) {
                ops.push(NftOp::Delete(NftDelete::Rule {
                    family: NftFamily::Inet,
                    table: firewall::MASQ_TABLE.into(),
                    chain: firewall::MASQ_CHAIN.into(),
                    handle: r.rule.handle,
                }));
            }
        }
        match nf.apply(&ops) {
            Ok(()) => break,
            Err(e) if e.is_not_found() && attempt < 2 => continue,
            Err(e) => return Err(CniError::from(e).context("delete our rules and elements")),
        }
    }
    // Empty tables go.
    if nf.has_table(NftFamily::Inet, firewall::MASQ_TABLE)? && ours::read_masq(nf)?.is_empty() {
        let left = nf.rules(NftFamily::Inet, firewall::MASQ_TABLE, Some(firewall::MASQ_CHAIN))?;
        if left.is_empty() {
            nf.apply(&[NftOp::Delete(NftDelete::Table {
                family: NftFamily::Inet,
                table: firewall::MASQ_TABLE.into(),
            })])?;
        }
    }
    let ids: Vec<AttachmentId> = converted.iter().map(|(n, i, f)| AttachmentId::new(n, i, f)).collect();
    ours::remove_portmap(&ids).map_err(|e| e.context("delete our host ports"))?;
    Ok(())
}

pub fn run(opts: &Opts, report: &mut Report) -> Result<()> {
    let Some(backend) = iptables::default_backend()? else {
        return Err(crate::refused(
            "iptables is not installed on this node: upstream's plugins 1.1.1 need it (bridge ipMasq and portmap \
             run iptables), so their form cannot be written; install the iptables package. Nothing was changed.",
        ));
    };
    tools_present(backend)?;
    report.notes.push(format!(
        "writing upstream's form with iptables-{} (what `iptables` runs here)",
        backend.name()
    ));
    let inv = Inventory::load(&opts.cache_dirs, &opts.data_dirs);
    report.notes.extend(inv.notes.iter().cloned());
    let Ok(mut nf) = NfTables::new() else {
        report.notes.push("nf_tables is not usable here: there is no state of ours to convert".into());
        return Ok(());
    };
    let mut nl = Netlink::new().map_err(CniError::from)?;
    let candidates = inv.identities();
    let masq_rules = ours::read_masq(&mut nf)?;
    let portmap = ours::read_portmap()?.unwrap_or_default();
    let mut atts: BTreeMap<Ident, Att> = BTreeMap::new();
    let mut unresolved = Vec::new();
    for r in masq_rules {
        match ours::resolve_masq(&r, &candidates) {
            Some(id) => atts.entry(id).or_default().masq_rules.push(r),
            None => unresolved.push(format!(
                "masquerade rule for {} ({:?}): no cache entry or host-local reservation names its attachment",
                r.saddr,
                r.rule.comment.as_deref().unwrap_or("")
            )),
        }
    }
    for d in &portmap.dnat {
        match ours::resolve_tag(&d.tag, &candidates) {
            Some(id) => atts.entry(id).or_default().dnat.push(d.clone()),
            None => unresolved.push(format!(
                "host port {}/{} of owner {:?}: attachment unknown",
                d.proto, d.host_port, d.tag
            )),
        }
    }
    // portmap's library decodes every masquerade element it wrote
    let masq_decodable = true;
    for m in &portmap.masq {
        if let Some(id) = ours::resolve_tag(&m.tag, &candidates) {
            if let Some(a) = atts.get_mut(&id) {
                a.masq_elems.push(m.clone());
            }
        }
    }
    if !unresolved.is_empty() {
        return Err(crate::refused(format!(
            "{} piece(s) of our state cannot be attributed to an attachment (give --cache-dir/--data-dir): {}; \
             nothing was changed",
            unresolved.len(),
            unresolved.join("; ")
        )));
    }
    // What upstream's form of each attachment is.
    for (id, a) in atts.iter_mut() {
        let cached = inv.cached(&id.0, &id.1, &id.2);
        let result = cached.and_then(|c| c.result.as_ref());
        let who = format!("{}/{}/{}", id.0, id.1, id.2);
        for r in &a.masq_rules {
            let n = prefix_of(result, &mut nl, r.saddr);
            if !a.addrs.contains(&n) {
                a.addrs.push(n);
            }
            if r.excluded.len() > 1 {
                let extra = cached
                    .and_then(|c| c.plugin_config("bridge"))
                    .and_then(|b| b.get("nonMasqueradeCIDRs").cloned())
                    .and_then(|v| serde_json::from_value::<Vec<IpNet>>(v).ok());
                match extra {
                    Some(list) => a.extra_accept = list,
                    None => report.notes.push(format!(
                        "{who}: its masquerade rule leaves more networks alone (nonMasqueradeCIDRs) than the \
                         attachment's subnet, and no cached configuration says which: upstream's form leaves \
                         only the subnet alone"
                    )),
                }
            }
        }
        if !a.dnat.is_empty() {
            let from_cache = cached.and_then(|c| {
                let conf: Value = c.plugin_config("portmap")?;
                Spec::from_json(&id.0, &id.1, &id.2, &conf, c.result.as_ref()).ok()
            });
            let mut spec = match from_cache {
                Some(s) if !s.mappings().is_empty() && (s.v4.is_some() || s.v6.is_some()) => s,
                _ => {
                    report.notes.push(format!(
                        "{who}: no libcni cache entry with its portmap configuration: host ports rebuilt from our \
                         elements ({})",
                        if masq_decodable { "snat as found" } else { "snat assumed on" }
                    ));
                    reconstruct(id, a, masq_decodable, &mut nl)
                }
            };
            iptables_conditions(&mut spec, report, &who);
            a.hostports = Some(spec);
        }
        report.done.push(format!(
            "{who}: {} masquerade address(es), {} host port mapping(s)",
            a.addrs.len(),
            a.hostports.as_ref().map_or(0, |s| s.mappings().len())
        ));
    }
    if atts.is_empty() {
        report
            .notes
            .push("no attachment of ours has masquerade rules or host ports: nothing to write".into());
    }
    // Write upstream's form, one transaction per family.
    for fam in Fam::BOTH {
        let t = iptables::save(backend, fam)?;
        let s = script_for(&t, fam, &atts);
        if s.is_empty() {
            continue;
        }
        if opts.dry_run {
            report.notes.push(format!("would apply with {}:\n{}", backend.tool(fam, "restore"), s.text()));
        } else {
            iptables::restore(backend, fam, &s)?;
        }
    }
    if opts.dry_run {
        return Ok(());
    }
    // Verify, then take ours away.
    let mut missing = Vec::new();
    for fam in Fam::BOTH {
        missing.extend(verify(&iptables::save(backend, fam)?, fam, &atts));
    }
    if !missing.is_empty() {
        return Err(CniError::internal(format!(
            "upstream's form is incomplete after writing it, so ours was kept: {}",
            missing.join("; ")
        )));
    }
    let converted: Vec<Ident> = atts.keys().cloned().collect();
    remove_ours(&mut nf, &converted, &candidates)?;
    if converted.is_empty() {
        return Ok(());
    }
    report.done.push(format!(
        "our tables inet {} / inet {}: converted rules and elements removed",
        firewall::MASQ_TABLE,
        portmap::layout::TABLE
    ));
    Ok(())
}
