//! `to-upstream`: every live attachment of ours gets the iptables form upstream's plugins 1.1.1
//! make (the chains and rules their DEL and CHECK look for), in the backend the node's
//! `iptables` command uses; once that form is verified in the kernel, our elements and rules
//! of those attachments are deleted, and our tables when nothing else is left in them.
//!
//! **Upstream's nftables backend** (v1.6+; v1.10.0 today): per attachment and plugin, when its
//! cached configuration says `ipMasqBackend` / `backend` `"nftables"` (else as `--backend`
//! says; default iptables, which is also v1.10's default where `iptables` is installed):
//! - bridge `ipMasq`: our rules in `inet cni_plugins_masquerade` are upstream's own form (same
//!   table, chain, rule and comment), so they stay as they are;
//! - portmap: the rules of tables `ip`/`ip6 cni_hostport` as portmap_nftables.go writes them
//!   (chains `hostports`, `hostip_hostports`, `hostports_all`, base chains `prerouting`/`output`
//!   jumping there for local destinations only (`fib daddr type local`: the form after
//!   CVE-2025-67499's fix), `masquerading`; one DNAT rule per mapping and the hairpin/localhost
//!   masquerade rules, each commented with the container id), written with `nft -f -` as one
//!   transaction and verified as v1.10's CHECK counts them; nft-syntax conditions are not
//!   carried (upstream keeps one set per table, the last ADD's).

use crate::inventory::Inventory;
use crate::opts::{Opts, Report};
use crate::ours::{self, MasqRule};
use bridge::firewall;
use cni_common::attachment::AttachmentId;
use cni_common::netlink::nft::{NfTables, NftDelete, NftFamily, NftOp};
use cni_common::netlink::{Family, Netlink, RouteKind, TABLE_MAIN};
use cni_common::nft_cli::{quote, Nft};
use cni_common::spec::config::PortMapping;
use cni_common::upstream::iptables::{self, Backend, Fam, Rule, Script, Table};
use cni_common::upstream::{masq, names};
use cni_common::{CniError, Result};
use ipnet::IpNet;
use portmap::config::{PortMapConf, PortMapRuntime};
use portmap::upstream::{self as hostport, names as hostport_names, Spec};
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
    /// Host ports in upstream's iptables form.
    hostports: Option<Spec>,
    /// Masquerading by upstream's nftables backend: our rules are its form and stay.
    masq_nft: bool,
    /// Host ports in upstream's nftables form (`cni_hostport`).
    nft_hostports: Option<Spec>,
}

/// Whether upstream's nftables backend is the one for a plugin whose cached configuration has
/// `key` (`ipMasqBackend`, `backend`) as given; `default` (from `--backend`) when it says none.
fn wants_nftables(config: Option<&Value>, key: &str, default: bool) -> bool {
    match config.and_then(|c| c.get(key)).and_then(Value::as_str) {
        Some("nftables") => true,
        Some("iptables") => false,
        _ => default,
    }
}

/// The `nft -f` script writing `spec`'s host ports as upstream's nftables backend does
/// (plugins/meta/portmap/portmap_nftables.go, `forwardPorts`), both families it has an
/// address in (priorities as numbers: dstnat is -100, srcnat 100, and nft 1.0.6 takes the
/// name dstnat in the prerouting hook only). Everything interpolated is a number, an address
/// we formatted, a protocol from a fixed list, or the container id through [`quote`].
fn nft_hostport_script(spec: &Spec) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let snat = spec.conf.snat.unwrap_or(true);
    let comment = quote(&spec.container_id);
    for fam in Fam::BOTH {
        let Some(addr) = spec.addr(fam) else { continue };
        let ip = addr.addr();
        let ipx = if fam == Fam::V4 { "ip" } else { "ip6" };
        let t = format!("{ipx} {}", hostport_names::NFT_HOSTPORT_TABLE);
        let _ = writeln!(s, "add table {t} {{ comment \"CNI portmap plugin\" ; }}");
        for c in ["hostports", "hostip_hostports", "hostports_all"] {
            let _ = writeln!(s, "add chain {t} {c}");
        }
        let _ = writeln!(s, "flush chain {t} hostports_all");
        let _ = writeln!(s, "add rule {t} hostports_all jump hostip_hostports");
        let _ = writeln!(s, "add rule {t} hostports_all jump hostports");
        for hook in ["prerouting", "output"] {
            let _ = writeln!(s, "add chain {t} {hook} {{ type nat hook {hook} priority -100 ; }}");
            let _ = writeln!(s, "flush chain {t} {hook}");
            let _ = writeln!(s, "add rule {t} {hook} fib daddr type local jump hostports_all");
        }
        if snat {
            let _ = writeln!(s, "add chain {t} masquerading {{ type nat hook postrouting priority 100 ; }}");
        }
        for m in spec.mappings() {
            let proto = m.protocol.to_ascii_lowercase();
            if !["tcp", "udp", "sctp"].contains(&proto.as_str()) {
                continue;
            }
            let host_ip = match m.host_ip.as_str() {
                "" => None,
                h => match h.parse::<IpAddr>() {
                    Ok(h) if h.is_ipv6() == (fam == Fam::V6) => Some(h),
                    _ => continue, // the other family's (upstream skips those)
                },
            };
            let daddr = host_ip
                .filter(|h| !h.is_unspecified())
                .map(|h| format!("{ipx} daddr {h} "))
                .unwrap_or_default();
            let to = match ip {
                IpAddr::V4(a) => format!("{a}:{}", m.container_port),
                IpAddr::V6(a) => format!("[{a}]:{}", m.container_port),
            };
            let _ = writeln!(
                s,
                "add rule {t} hostports {daddr}{proto} dport {} dnat to {to} comment {comment}",
                m.host_port
            );
        }
        if snat {
            let src = match (spec.conf.masq_all, fam) {
                (true, Fam::V4) => "0.0.0.0/0".to_string(),
                (true, Fam::V6) => "::/0".to_string(),
                (false, _) => ip.to_string(),
            };
            let _ = writeln!(
                s,
                "add rule {t} masquerading {ipx} saddr {src} {ipx} daddr {ip} masquerade comment {comment}"
            );
            if fam == Fam::V4 && !spec.conf.masq_all {
                let _ = writeln!(
                    s,
                    "add rule {t} masquerading ip saddr 127.0.0.1 ip daddr {ip} masquerade comment {comment}"
                );
            }
        }
    }
    s
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
        for c in
            [hostport_names::HOSTPORT_SETMARK, hostport_names::HOSTPORT_MASQ, hostport_names::HOSTPORT_DNAT]
        {
            let used = c == hostport_names::HOSTPORT_DNAT || plumbing.iter().any(|(x, _, _)| x == c);
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
                ensure(&mut s, t, hostport_names::HOSTPORT_DNAT, e);
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
                return Err(crate::opts::refused(format!(
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
fn remove_ours(
    nf: &mut NfTables,
    converted: &[Ident],
    candidates: &[Ident],
    keep_masq: &[Ident],
) -> Result<()> {
    for attempt in 0..3 {
        let mut ops: Vec<NftOp> = Vec::new();
        for r in ours::read_masq(nf)? {
            if ours::resolve_masq(&r, candidates)
                .is_some_and(|id| converted.contains(&id) && !keep_masq.contains(&id))
            {
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
    let no_iptables = || {
        crate::opts::refused(
            "iptables is not installed on this node: upstream's plugins 1.1.1 (and later releases' default backend) \
             need it (bridge ipMasq and portmap run iptables), so their form cannot be written; install the \
             iptables package, or give --backend nftables for upstream's nftables backend (v1.6+). Nothing was \
             changed.",
        )
    };
    let backend = iptables::default_backend()?;
    if backend.is_none() && !opts.nftables {
        return Err(no_iptables());
    }
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
        return Err(crate::opts::refused(format!(
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
        let bridge_conf = cached.and_then(|c| c.plugin_config("bridge"));
        let portmap_conf = cached.and_then(|c| c.plugin_config("portmap"));
        a.masq_nft =
            !a.masq_rules.is_empty() && wants_nftables(bridge_conf.as_ref(), "ipMasqBackend", opts.nftables);
        let ports_nft = wants_nftables(portmap_conf.as_ref(), "backend", opts.nftables);
        let masq_rules = if a.masq_nft { &[][..] } else { &a.masq_rules[..] };
        for r in masq_rules {
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
            if ports_nft {
                if spec.conf.conditions_v4.is_some() || spec.conf.conditions_v6.is_some() {
                    report.notes.push(format!(
                        "{who}: its conditionsV4/V6 are not carried into cni_hostport (upstream's nftables backend \
                         keeps one set per table, the last ADD's)"
                    ));
                }
                a.nft_hostports = Some(spec);
            } else {
                iptables_conditions(&mut spec, report, &who);
                a.hostports = Some(spec);
            }
        }
        report.done.push(format!(
            "{who}: {} masquerade address(es) ({}), {} host port mapping(s) ({})",
            if a.masq_nft { a.masq_rules.len() } else { a.addrs.len() },
            if a.masq_nft { "nftables: kept as they are" } else { "iptables" },
            a.hostports.as_ref().or(a.nft_hostports.as_ref()).map_or(0, |s| s.mappings().len()),
            if a.nft_hostports.is_some() { "nftables" } else { "iptables" },
        ));
    }
    let needs_iptables = atts.values().any(|a| !a.addrs.is_empty() || a.hostports.is_some());
    let backend = match backend {
        Some(b) if needs_iptables => {
            tools_present(b)?;
            report.notes.push(format!(
                "writing upstream's iptables form with iptables-{} (what `iptables` runs here)",
                b.name()
            ));
            Some(b)
        }
        None if needs_iptables => return Err(no_iptables()),
        _ => None,
    };
    if atts.is_empty() {
        report
            .notes
            .push("no attachment of ours has masquerade rules or host ports: nothing to write".into());
    }
    // Write upstream's form: nftables, one transaction per attachment (skipped when complete);
    // iptables, one transaction per family.
    let nft_specs: Vec<&Spec> = atts.values().filter_map(|a| a.nft_hostports.as_ref()).collect();
    if !nft_specs.is_empty() {
        let nft = Nft::find()?;
        for spec in &nft_specs {
            if hostport::nft_backend_missing(spec)?.is_none() {
                continue;
            }
            let script = nft_hostport_script(spec);
            if opts.dry_run {
                report.notes.push(format!("would apply with nft -f -:\n{script}"));
            } else {
                nft.apply(&script).map_err(|e| e.context("write upstream's cni_hostport rules"))?;
            }
        }
    }
    for fam in Fam::BOTH {
        let Some(backend) = backend else { break };
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
        let Some(backend) = backend else { break };
        missing.extend(verify(&iptables::save(backend, fam)?, fam, &atts));
    }
    for (id, a) in &atts {
        if let Some(spec) = &a.nft_hostports {
            if let Some(why) = hostport::nft_backend_missing(spec)? {
                missing.push(format!("{}/{}/{}: host ports (nftables): {why}", id.0, id.1, id.2));
            }
        }
    }
    if !missing.is_empty() {
        return Err(CniError::internal(format!(
            "upstream's form is incomplete after writing it, so ours was kept: {}",
            missing.join("; ")
        )));
    }
    let converted: Vec<Ident> = atts.keys().cloned().collect();
    let keep_masq: Vec<Ident> = atts.iter().filter(|(_, a)| a.masq_nft).map(|(id, _)| id.clone()).collect();
    remove_ours(&mut nf, &converted, &candidates, &keep_masq)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(snat: Option<bool>, masq_all: bool, maps: Vec<(i64, i64, &str, &str)>) -> Spec {
        let port_mappings = maps
            .into_iter()
            .map(|(h, c, p, ip)| PortMapping {
                host_port: h,
                container_port: c,
                protocol: p.into(),
                host_ip: ip.into(),
            })
            .collect();
        Spec {
            network: "net".into(),
            container_id: "ctr-1".into(),
            conf: PortMapConf {
                snat,
                masq_all,
                runtime_config: Some(PortMapRuntime { port_mappings: Some(port_mappings) }),
                ..PortMapConf::default()
            },
            v4: Some("10.1.0.2/24".parse().unwrap()),
            v6: Some("fd00::2/64".parse().unwrap()),
        }
    }

    /// Upstream's nftables form, rule for rule: a DNAT rule per mapping of the family (a host IP
    /// of the other family skipped, an unspecified one without a daddr match), the hairpin
    /// masquerade and, for IPv4, the localhost one.
    #[test]
    fn nftables_form_as_upstream_writes_it() {
        let s = nft_hostport_script(&spec(
            None,
            false,
            vec![(8080, 80, "tcp", ""), (5353, 53, "UDP", "192.0.2.1"), (9090, 90, "tcp", "::")],
        ));
        let rules: Vec<&str> =
            s.lines().filter(|l| l.starts_with("add rule ")).filter(|l| !l.contains("jump")).collect();
        assert_eq!(
            rules,
            [
                "add rule ip cni_hostport hostports tcp dport 8080 dnat to 10.1.0.2:80 comment \"ctr-1\"",
                "add rule ip cni_hostport hostports ip daddr 192.0.2.1 udp dport 5353 dnat to 10.1.0.2:53 comment \"ctr-1\"",
                "add rule ip cni_hostport masquerading ip saddr 10.1.0.2 ip daddr 10.1.0.2 masquerade comment \"ctr-1\"",
                "add rule ip cni_hostport masquerading ip saddr 127.0.0.1 ip daddr 10.1.0.2 masquerade comment \"ctr-1\"",
                "add rule ip6 cni_hostport hostports tcp dport 8080 dnat to [fd00::2]:80 comment \"ctr-1\"",
                "add rule ip6 cni_hostport hostports tcp dport 9090 dnat to [fd00::2]:90 comment \"ctr-1\"",
                "add rule ip6 cni_hostport masquerading ip6 saddr fd00::2 ip6 daddr fd00::2 masquerade comment \"ctr-1\"",
            ]
        );
        // local destinations only (the form after CVE-2025-67499's fix), both hooks
        for t in ["ip", "ip6"] {
            for hook in ["prerouting", "output"] {
                assert!(s.contains(&format!(
                    "add rule {t} cni_hostport {hook} fib daddr type local jump hostports_all\n"
                )));
            }
        }
        // snat off: no masquerading chain or rule; masqAll: any source, no localhost rule
        let off = nft_hostport_script(&spec(Some(false), false, vec![(8080, 80, "tcp", "")]));
        assert!(!off.contains("masquerad"), "{off}");
        let all = nft_hostport_script(&spec(None, true, vec![(8080, 80, "tcp", "")]));
        assert!(all.contains("ip saddr 0.0.0.0/0 ip daddr 10.1.0.2 masquerade"), "{all}");
        assert!(all.contains("ip6 saddr ::/0 ip6 daddr fd00::2 masquerade"), "{all}");
        assert!(!all.contains("127.0.0.1"), "{all}");
    }

    #[test]
    fn backend_from_the_cached_configuration_else_the_option() {
        let c = |v: Value| Some(v);
        assert!(wants_nftables(c(json!({"backend": "nftables"})).as_ref(), "backend", false));
        assert!(!wants_nftables(c(json!({"backend": "iptables"})).as_ref(), "backend", true));
        assert!(wants_nftables(c(json!({})).as_ref(), "backend", true));
        assert!(!wants_nftables(None, "ipMasqBackend", false));
        assert!(wants_nftables(c(json!({"ipMasqBackend": "nftables"})).as_ref(), "ipMasqBackend", false));
    }
}
