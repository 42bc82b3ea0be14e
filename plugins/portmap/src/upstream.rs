//! portmap's host ports as upstream makes them: found, checked and removed by our verbs (and
//! read and written by `cni-migrate`). What this module decides (which chains and rules an
//! attachment has, what is missing, which attachments are dead, what a removal leaves unused)
//! is pure; it reads and changes the node only through [`seam::Upstream`], whose [`seam::System`]
//! runs the plugin-agnostic iptables layer of `cni_common::upstream` and nf_tables, and whose
//! `fake::Fake` holds upstream's tables in memory for the unit tests (`upstream/tests.rs`).
//!
//! **iptables backend** (plugins/meta/portmap/portmap.go and chain.go; v1.1.1 and later, table
//! `nat` of `iptables` and `ip6tables`):
//!
//! ```text
//! PREROUTING, OUTPUT     -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
//! POSTROUTING (first)    -m comment --comment "CNI portfwd requiring masquerade" -j CNI-HOSTPORT-MASQ
//! CNI-HOSTPORT-MASQ      -m mark --mark 0x2000/0x2000 -j MASQUERADE
//! CNI-HOSTPORT-SETMARK   -m comment --comment "CNI portfwd masquerade mark" -j MARK --set-xmark 0x2000/0x2000
//! CNI-HOSTPORT-DNAT      -m comment --comment 'dnat name: "<net>" id: "<id>"' -m multiport -p <proto>
//!                        --destination-ports <up to 15 ports> [conditions] -j CNI-DN-<hash>
//! CNI-DN-<hash>          per mapping: (snat) -p P --dport H [-d hostIP] -s <container net> -j CNI-HOSTPORT-SETMARK
//!                        (snat, IPv4) -p P --dport H [-d hostIP] -s 127.0.0.1 -j CNI-HOSTPORT-SETMARK
//!                        -p P --dport H [-d hostIP] -j DNAT --to-destination <ip>:<port>
//! ```
//!
//! Versions before 0.7 also made `CNI-SN-<hash>` jumped to from `CNI-HOSTPORT-SNAT`; upstream's
//! DEL still tears it down, and so does ours.
//!
//! **nftables backend** (v1.6+, portmap_nftables.go): tables `ip cni_hostport` and
//! `ip6 cni_hostport`; each mapping one rule in chain `hostports` (older: `hostip_hostports`),
//! the masquerade rules in `masquerading`, every rule commented with the bare container id.
//! DEL removes them by that comment, as upstream does; GC cannot attribute them to a network
//! (the comment has none) and leaves them. Both plumbings are recognised, since only the rules
//! are looked at: v1.6-v1.8's, and v1.9.0+'s (v1.10.0 today) after the fix of CVE-2025-67499
//! (`prerouting`/`output` jump to `hostports_all` for `fib daddr type local` only; host-IP
//! rules in `hostports`). `cni-migrate to-upstream` writes the latter form
//! ([`nft_backend_missing`] verifies it).

#[cfg(any(test, feature = "fake"))]
pub mod fake;
pub mod names;
pub mod seam;

use crate::config::PortMapConf;
use cni_common::error_list::ErrorList;
use cni_common::netlink::nft::{NftDelete, NftRule};
use cni_common::spec::config::PortMapping;
use cni_common::spec::json;
use cni_common::spec::result::CniResult;
use cni_common::upstream::iptables::{self, Backend, Fam, Rule, Script, Table};
use cni_common::upstream::{nft_family, Found, Teardown};
use cni_common::{CniError, Request, Result};
use ipnet::IpNet;
use seam::{System, Upstream};
use serde_json::Value;
use std::collections::HashSet;
use std::net::IpAddr;

/// What upstream's portmap derives its rules from: the attachment, its configuration and its
/// container addresses (the first of each family on the container interface, as upstream
/// picks them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    pub network: String,
    pub container_id: String,
    /// As upstream's ADD accepts it: every mapping's ports above 0, `markMasqBit` within 0..=31
    /// ([`Spec::from_json`] refuses anything else).
    pub conf: PortMapConf,
    pub v4: Option<IpNet>,
    pub v6: Option<IpNet>,
}

/// `markMasqBit` (13 unless set), None when outside upstream's range 0..=31.
fn mark_bit(conf: &PortMapConf) -> Option<u32> {
    match conf.mark_masq_bit {
        None => Some(names::DEFAULT_MARK_BIT),
        Some(b) => u32::try_from(b).ok().filter(|b| *b <= 31),
    }
}

impl Spec {
    /// From a portmap configuration object (with `runtimeConfig`) and prevResult.
    pub fn from_json(
        network: &str,
        container_id: &str,
        ifname: &str,
        config: &Value,
        prev: Option<&CniResult>,
    ) -> Result<Spec> {
        let conf: PortMapConf = json::from_ref(config)
            .map_err(|e| CniError::decode(format!("portmap configuration (as upstream reads it): {e}")))?;
        for m in conf.mappings() {
            for (what, v) in [("hostPort", m.host_port), ("containerPort", m.container_port)] {
                if u32::try_from(v).map_or(true, |p| p == 0) {
                    return Err(CniError::config(format!("runtimeConfig.portMappings: invalid {what} {v}")));
                }
            }
        }
        if mark_bit(&conf).is_none() {
            let b = conf.mark_masq_bit.unwrap_or_default();
            return Err(CniError::config(format!("markMasqBit {b} is not between 0 and 31")));
        }
        // the addresses upstream's portmap forwarded to (a prevResult no plugin made gives none)
        let (v4, v6) =
            prev.and_then(|p| cni_common::net::container_addrs(p, ifname).ok()).unwrap_or_default();
        Ok(Spec { network: network.into(), container_id: container_id.into(), conf, v4, v6 })
    }

    pub fn from_request(req: &Request) -> Result<Spec> {
        let prev = req.prev_result()?;
        Spec::from_json(req.network(), &req.env.container_id, &req.env.ifname, &req.config, prev.as_ref())
    }

    pub fn addr(&self, fam: Fam) -> Option<IpNet> {
        match fam {
            Fam::V4 => self.v4,
            Fam::V6 => self.v6,
        }
    }

    pub fn mappings(&self) -> &[PortMapping] {
        self.conf.mappings()
    }

    /// `conditionsV4` or `conditionsV6`.
    pub fn conditions(&self, fam: Fam) -> &[String] {
        let c = match fam {
            Fam::V4 => &self.conf.conditions_v4,
            Fam::V6 => &self.conf.conditions_v6,
        };
        c.as_deref().unwrap_or_default()
    }

    /// `externalSetMarkChain`, when set (then upstream makes no SETMARK and MASQ chains).
    pub fn external_set_mark_chain(&self) -> Option<&str> {
        self.conf.external_set_mark_chain.as_deref().filter(|c| !c.is_empty())
    }

    /// Whether upstream's ADD writes the shared `CNI-HOSTPORT-SETMARK` and `-MASQ` chains for
    /// this attachment: with `snat` and without `externalSetMarkChain`.
    pub fn makes_mark_chains(&self) -> bool {
        self.conf.snat() && self.external_set_mark_chain().is_none()
    }

    /// The chain the hairpin and localhost rules jump to.
    fn set_mark_chain(&self) -> &str {
        self.external_set_mark_chain().unwrap_or(names::HOSTPORT_SETMARK)
    }

    /// UDP host ports (for the conntrack flush).
    fn udp_ports(&self) -> Vec<u16> {
        let mut out: Vec<u16> = Vec::new();
        for m in self.mappings() {
            if m.protocol.eq_ignore_ascii_case("udp") {
                if let Ok(p) = u16::try_from(m.host_port) {
                    if !out.contains(&p) {
                        out.push(p);
                    }
                }
            }
        }
        out
    }

    fn mark(&self) -> String {
        let v = 1u32 << mark_bit(&self.conf).unwrap_or(names::DEFAULT_MARK_BIT);
        format!("{v:#x}/{v:#x}")
    }
}

/// The rules upstream's ADD writes for one family: the per-container chain's rules and the
/// entry rules of `CNI-HOSTPORT-DNAT` (already ending in `-j CNI-DN-…`), in upstream's order
/// and spelling (`fillDnatRules`). None when the container has no address of that family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnatRules {
    pub chain: String,
    pub entries: Vec<Vec<String>>,
    pub rules: Vec<Vec<String>>,
}

pub fn dnat_rules(spec: &Spec, fam: Fam) -> Option<DnatRules> {
    let addr = spec.addr(fam)?;
    let v6 = fam == Fam::V6;
    let chain = names::dnat_chain(&spec.network, &spec.container_id);
    let comment = names::dnat_comment(&spec.network, &spec.container_id);
    let conditions = spec.conditions(fam);
    // Entry rules: ports grouped by protocol (every mapping, whatever its hostIP), protocols
    // sorted, at most 15 ports per multiport rule.
    let mut protos: Vec<&str> = Vec::new();
    for m in spec.mappings() {
        if !protos.contains(&m.protocol.as_str()) {
            protos.push(&m.protocol);
        }
    }
    protos.sort_unstable();
    let mut entries = Vec::new();
    for p in protos {
        let ports: Vec<String> =
            spec.mappings().iter().filter(|m| m.protocol == p).map(|m| m.host_port.to_string()).collect();
        for group in ports.chunks(15) {
            let mut r =
                iptables::words(&["-m", "comment", "--comment", &comment, "-m", "multiport", "-p", p]);
            r.extend(iptables::words(&["--destination-ports", &group.join(",")]));
            r.extend(conditions.iter().cloned());
            r.extend(iptables::words(&["-j", &chain]));
            entries.push(r);
        }
    }
    let mut rules = Vec::new();
    for m in spec.mappings() {
        let mut base = iptables::words(&["-p", &m.protocol, "--dport", &m.host_port.to_string()]);
        if !m.host_ip.is_empty() {
            let Ok(hip) = m.host_ip.parse::<IpAddr>() else { continue };
            if hip.is_ipv6() != v6 {
                continue;
            }
            if !hip.is_unspecified() {
                base.extend(iptables::words(&["-d", &m.host_ip]));
            }
        }
        if spec.conf.snat() {
            let src = match (spec.conf.masq_all, v6) {
                (true, false) => "0.0.0.0/0".to_string(),
                (true, true) => "::/0".to_string(),
                (false, _) => addr.to_string(),
            };
            let mut hairpin = base.clone();
            hairpin.extend(iptables::words(&["-s", &src, "-j", spec.set_mark_chain()]));
            rules.push(hairpin);
            if !v6 && !spec.conf.masq_all {
                let mut local = base.clone();
                local.extend(iptables::words(&["-s", "127.0.0.1", "-j", spec.set_mark_chain()]));
                rules.push(local);
            }
        }
        let to = match addr.addr() {
            IpAddr::V4(a) => format!("{a}:{}", m.container_port),
            IpAddr::V6(a) => format!("[{a}]:{}", m.container_port),
        };
        let mut dnat = base;
        dnat.extend(iptables::words(&["-j", "DNAT", "--to-destination", &to]));
        rules.push(dnat);
    }
    Some(DnatRules { chain, entries, rules })
}

/// The shared rules upstream's ADD ensures: (chain, args, at the top). SETMARK and MASQ only
/// with `snat` and without `externalSetMarkChain`.
pub fn plumbing_rules(spec: &Spec) -> Vec<(String, Vec<String>, bool)> {
    let mut out = Vec::new();
    if spec.makes_mark_chains() {
        let mark = spec.mark();
        out.push((
            names::HOSTPORT_SETMARK.to_string(),
            iptables::words(&[
                "-m",
                "comment",
                "--comment",
                names::SETMARK_COMMENT,
                "-j",
                "MARK",
                "--set-xmark",
                &mark,
            ]),
            false,
        ));
        out.push((
            names::HOSTPORT_MASQ.to_string(),
            iptables::words(&["-m", "mark", "--mark", &mark, "-j", "MASQUERADE"]),
            false,
        ));
        out.push((
            "POSTROUTING".to_string(),
            iptables::words(&[
                "-m",
                "comment",
                "--comment",
                names::MASQ_JUMP_COMMENT,
                "-j",
                names::HOSTPORT_MASQ,
            ]),
            true,
        ));
    }
    for c in ["PREROUTING", "OUTPUT"] {
        out.push((
            c.to_string(),
            iptables::words(&["-m", "addrtype", "--dst-type", "LOCAL", "-j", names::HOSTPORT_DNAT]),
            false,
        ));
    }
    out
}

/// The first piece of upstream's form `spec` needs in `t` (the nat table of `fam`) that is
/// missing, or None when all is there (the per-container chain and its rules, the entry
/// rules, and the shared chains that make them work).
pub fn missing_rule(t: &Table, spec: &Spec, fam: Fam) -> Option<String> {
    let d = dnat_rules(spec, fam)?;
    if !t.has_chain(&d.chain) {
        return Some(format!("chain {} does not exist", d.chain));
    }
    let lacks = |chain: &str, args: &[String]| {
        (!t.contains(chain, &Rule::parse(args)))
            .then(|| format!("chain {chain} lacks rule `{}`", args.join(" ")))
    };
    for r in &d.rules {
        if let Some(m) = lacks(&d.chain, r) {
            return Some(m);
        }
    }
    for r in &d.entries {
        if let Some(m) = lacks(names::HOSTPORT_DNAT, r) {
            return Some(m);
        }
    }
    for (chain, args, _) in plumbing_rules(spec) {
        if let Some(m) = lacks(&chain, &args) {
            return Some(m);
        }
    }
    None
}

fn teardown(network: &str, container_id: &str) -> Teardown {
    let (dn, sn) = (names::dnat_chain(network, container_id), names::snat_chain(network, container_id));
    Teardown::default().jump(names::HOSTPORT_DNAT, &dn).jump(names::HOSTPORT_SNAT, &sn).chain(&dn).chain(&sn)
}

fn dnat_teardown() -> Teardown {
    Teardown::default()
        .jump("PREROUTING", names::HOSTPORT_DNAT)
        .jump("OUTPUT", names::HOSTPORT_DNAT)
        .chain(names::HOSTPORT_DNAT)
}

fn masq_teardown() -> Teardown {
    Teardown::default().jump("POSTROUTING", names::HOSTPORT_MASQ).chain(names::HOSTPORT_MASQ)
}

fn setmark_teardown() -> Teardown {
    Teardown::default().chain(names::HOSTPORT_SETMARK)
}

fn old_snat_teardown() -> Teardown {
    Teardown::default().jump("POSTROUTING", names::HOSTPORT_SNAT).chain(names::HOSTPORT_SNAT)
}

/// Remove the shared `CNI-HOSTPORT-*` chains from the nf_tables nat table of `fam` when no
/// container uses them any more. Best effort: `CNI-HOSTPORT-SETMARK` stays while any rule
/// still jumps to it (the kernel refuses to delete it).
fn nft_plumbing(u: &mut dyn Upstream, fam: Fam) {
    let empty = |u: &mut dyn Upstream, chain: &str| matches!(u.nft_chain_len(fam, chain), Ok(Some(0)));
    if empty(u, names::HOSTPORT_DNAT) {
        for t in [dnat_teardown(), masq_teardown(), setmark_teardown()] {
            if let Err(e) = u.teardown_nft(fam, &t) {
                cni_common::log!("", "note: upstream's portmap chains left in place: {}", e.msg);
            }
        }
    }
    if empty(u, names::HOSTPORT_SNAT) {
        if let Err(e) = u.teardown_nft(fam, &old_snat_teardown()) {
            cni_common::log!("", "note: upstream's {} left in place: {}", names::HOSTPORT_SNAT, e.msg);
        }
    }
}

/// The same for a saved (legacy) table, as restore lines, given that the chains `dropped`
/// (and every jump to them) are being removed.
fn plumbing_script(t: &Table, dropped: &[String], s: &mut Script) {
    let left = |chain: &str| {
        t.rules_in(chain).any(|r| r.rule.target.as_deref().is_none_or(|x| !dropped.iter().any(|d| d == x)))
    };
    if t.has_chain(names::HOSTPORT_DNAT) && !left(names::HOSTPORT_DNAT) {
        for l in dnat_teardown().script(t).lines().chain(masq_teardown().script(t).lines()) {
            s.push(l);
        }
        // SETMARK: only when no chain that stays refers to it.
        let still = t.rules.iter().any(|r| {
            r.rule.target.as_deref() == Some(names::HOSTPORT_SETMARK) && !dropped.contains(&r.chain)
        });
        if !still {
            for l in setmark_teardown().script(t).lines() {
                s.push(l);
            }
        }
    }
    if t.has_chain(names::HOSTPORT_SNAT) && !left(names::HOSTPORT_SNAT) {
        for l in old_snat_teardown().script(t).lines() {
            s.push(l);
        }
    }
}

/// Chains a script deletes (`-X`).
fn dropped_by(s: &Script) -> Vec<String> {
    s.lines().filter_map(|l| l.strip_prefix("-X ").map(str::to_string)).collect()
}

/// Rules of upstream's nftables backend carrying `container_id` as their comment, per family.
fn nft_backend_rules(u: &mut dyn Upstream, container_id: &str) -> Result<Vec<(Fam, NftRule)>> {
    let mut out = Vec::new();
    for fam in Fam::BOTH {
        for r in u.hostport_rules(fam)?.unwrap_or_default() {
            if r.comment.as_deref() == Some(container_id) {
                out.push((fam, r));
            }
        }
    }
    Ok(out)
}

/// Delete upstream's nftables-backend rules of `container_id` (one transaction), and each
/// `cni_hostport` table left without any such rule.
fn remove_nft_backend(u: &mut dyn Upstream, container_id: &str) -> Result<bool> {
    let found = nft_backend_rules(u, container_id)?;
    if found.is_empty() {
        return Ok(false);
    }
    let ops: Vec<NftDelete> = found
        .iter()
        .map(|(fam, r)| NftDelete::Rule {
            family: nft_family(*fam),
            table: names::NFT_HOSTPORT_TABLE.into(),
            chain: r.chain.clone(),
            handle: r.handle,
        })
        .collect();
    u.hostport_delete(&ops).map_err(|e| e.context("remove upstream's cni_hostport rules"))?;
    for fam in Fam::BOTH {
        if !found.iter().any(|(f, _)| *f == fam) {
            continue;
        }
        if u.hostport_rules(fam)?.is_some_and(|left| left.is_empty()) {
            let family = nft_family(fam);
            let drop = NftDelete::Table { family, table: names::NFT_HOSTPORT_TABLE.into() };
            if let Err(e) = u.hostport_delete(&[drop]) {
                cni_common::log!(
                    "",
                    "note: empty table {} {} left in place: {}",
                    family.keyword(),
                    names::NFT_HOSTPORT_TABLE,
                    e.msg
                );
            }
        }
    }
    Ok(true)
}

/// Change the legacy `nat` table of `fam`: save it, let `build` make a restore script from it,
/// apply the script. A restore that fails (the table changed since it was saved: a rule to
/// delete is gone) is tried again from a new save, three times in all. Returns what `build`
/// returned with the script that was applied.
fn legacy_change<T>(
    u: &mut dyn Upstream,
    fam: Fam,
    mut build: impl FnMut(&Table) -> (Script, T),
) -> Result<T> {
    let mut last = None;
    for _ in 0..3 {
        let t = u.save(Backend::Legacy, fam)?;
        let (s, out) = build(&t);
        match u.restore_legacy(fam, &s) {
            Ok(()) => return Ok(out),
            Err(e) => last = Some(e),
        }
    }
    Err(last.expect("three attempts"))
}

/// Remove everything upstream's portmap made for (network, container id): the iptables chains
/// in every backend and family that has them, the shared chains when no container uses them
/// any more, and the nftables backend's rules of the container id. Returns whether anything
/// was there. On a node without upstream state this costs a few nf_tables GETs and two
/// `/proc` reads. Every table is tried; the errors are reported together.
pub fn remove(u: &mut dyn Upstream, network: &str, container_id: &str) -> Result<bool> {
    let wanted = [names::dnat_chain(network, container_id), names::snat_chain(network, container_id)];
    let at = u.locate(&wanted)?;
    let mut errors = ErrorList::new();
    let mut removed = false;
    let t = teardown(network, container_id);
    for (backend, fam) in at {
        let r = match backend {
            Backend::Nft => {
                let r = u.teardown_nft(fam, &t);
                nft_plumbing(u, fam);
                r
            }
            Backend::Legacy => legacy_change(u, fam, |table| {
                let mut s = t.script(table);
                let found = !s.is_empty();
                plumbing_script(table, &dropped_by(&s), &mut s);
                (s, found)
            }),
        };
        match r {
            Ok(x) => removed |= x,
            Err(e) => errors.push(e),
        }
    }
    match remove_nft_backend(u, container_id) {
        Ok(x) => removed |= x,
        Err(e) => errors.push(e),
    }
    errors.finish().map(|()| removed)
}

/// DEL: remove what upstream's portmap made for this attachment (both iptables backends and
/// its nftables backend), and flush the UDP flows of its mappings. A configuration this
/// cannot read (DEL must not fail on it) only costs the conntrack flush.
pub fn del(u: &mut dyn Upstream, req: &Request) -> Result<()> {
    let removed = remove(u, req.network(), &req.env.container_id)
        .map_err(|e| e.context("remove upstream's port mappings"))?;
    if removed {
        if let Ok(spec) = Spec::from_request(req) {
            u.flush_udp("portmap (upstream's rules)", &spec.udp_ports(), &Fam::BOTH);
        }
    }
    Ok(())
}

/// CHECK: when upstream made this attachment's port mappings, whether its form is complete
/// for every family the container has an address in; [`Found::Absent`] when upstream made
/// none.
pub fn check(u: &mut dyn Upstream, req: &Request) -> Result<Found> {
    let spec = Spec::from_request(req)?;
    if spec.mappings().is_empty() {
        return Ok(Found::Absent);
    }
    let dn = names::dnat_chain(&spec.network, &spec.container_id);
    let at = u.locate(std::slice::from_ref(&dn))?;
    let nft_form = nft_backend_rules(u, &spec.container_id)?;
    if at.is_empty() && nft_form.is_empty() {
        return Ok(Found::Absent);
    }
    for fam in Fam::BOTH {
        if spec.addr(fam).is_none() {
            continue;
        }
        if let Some((backend, _)) = at.iter().find(|(_, f)| *f == fam) {
            let t = u.save(*backend, fam)?;
            if let Some(why) = missing_rule(&t, &spec, fam) {
                return Err(CniError::internal(format!(
                    "port mappings made by upstream's portmap (iptables, {} backend) are incomplete: {why}",
                    backend.name()
                )));
            }
        } else if nft_form.iter().any(|(f, _)| *f == fam) {
            check_nft_backend(&spec, fam, &nft_form)?;
        } else {
            return Err(CniError::internal(format!(
                "port mappings made by upstream's portmap: nothing for the {} address {}",
                if fam == Fam::V4 { "IPv4" } else { "IPv6" },
                spec.addr(fam).map(|a| a.to_string()).unwrap_or_default()
            )));
        }
    }
    Ok(Found::Intact)
}

/// Whether upstream's nftables-backend form of `spec` is complete in every family the
/// container has an address in (what v1.10's CHECK counts): None when it is, else what is
/// missing. `cni-migrate to-upstream` verifies what it wrote with this, on the node.
pub fn nft_backend_missing(spec: &Spec) -> Result<Option<String>> {
    let mut node = System::new();
    if !node.nf_tables_usable() {
        return Ok(Some("nf_tables is not usable".into()));
    }
    nft_backend_missing_in(&mut node, spec)
}

/// [`nft_backend_missing`] through the seam.
pub fn nft_backend_missing_in(u: &mut dyn Upstream, spec: &Spec) -> Result<Option<String>> {
    let found = nft_backend_rules(u, &spec.container_id)?;
    for fam in Fam::BOTH {
        if spec.addr(fam).is_none() {
            continue;
        }
        if let Err(e) = check_nft_backend(spec, fam, &found) {
            return Ok(Some(e.msg));
        }
    }
    Ok(None)
}

/// Upstream's own CHECK of its nftables backend: enough rules with the container id in
/// `hostports` (one per mapping of the family) and in `masquerading` (with `snat`: 2 for IPv4,
/// 1 for IPv6 or with masqAll).
fn check_nft_backend(spec: &Spec, fam: Fam, found: &[(Fam, NftRule)]) -> Result<()> {
    let mine = |chains: &[&str]| {
        found.iter().filter(|(f, r)| *f == fam && chains.contains(&r.chain.as_str())).count()
    };
    let want = spec
        .mappings()
        .iter()
        .filter(|m| m.host_ip.parse::<IpAddr>().map_or(true, |ip| ip.is_ipv6() == (fam == Fam::V6)))
        .count();
    let family = nft_family(fam).keyword();
    if mine(&["hostports", "hostip_hostports"]) < want {
        return Err(CniError::internal(format!(
            "port mappings made by upstream's portmap (nftables): missing rules in {family} cni_hostport hostports"
        )));
    }
    let masq = if !spec.conf.snat() {
        0
    } else if fam == Fam::V4 && !spec.conf.masq_all {
        2
    } else {
        1
    };
    if mine(&["masquerading"]) < masq {
        return Err(CniError::internal(format!(
            "port mappings made by upstream's portmap (nftables): missing rules in {family} cni_hostport masquerading"
        )));
    }
    Ok(())
}

/// Entry rules of `network` in `t` whose container is not in `keep`: (container id, its DNAT
/// or SNAT chain).
fn dead_in(t: &Table, network: &str, keep: &HashSet<&str>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (top, kind) in [(names::HOSTPORT_DNAT, "dnat "), (names::HOSTPORT_SNAT, "snat ")] {
        for r in t.rules_in(top) {
            let Some((net, id)) =
                r.rule.comment.as_deref().and_then(|c| cni_common::upstream::names::parse_comment(kind, c))
            else {
                continue;
            };
            if net != network || keep.contains(id) || out.iter().any(|x| x == id) {
                continue;
            }
            let chain = if kind == "dnat " { names::dnat_chain(net, id) } else { names::snat_chain(net, id) };
            if r.rule.target.as_deref() == Some(chain.as_str()) {
                out.push(id.to_string());
            }
        }
    }
    out
}

/// UDP host ports DNATed by the chain `chain` of `t`.
fn udp_ports_in(t: &Table, chain: &str) -> Vec<u16> {
    t.rules_in(chain)
        .filter(|r| r.rule.target.as_deref() == Some("DNAT") && r.rule.proto.as_deref() == Some("udp"))
        .filter_map(|r| r.rule.dport_num())
        .collect()
}

/// Whether a `nat` table with chain `c` may hold upstream's port mappings for GC: GC finds
/// the dead only by the entry rules of these two chains, and tidies only them, so a table
/// without either (a `CNI-DN-…` chain nothing jumps to) has nothing GC would act on.
fn is_gc_chain(c: &str) -> bool {
    c == names::HOSTPORT_DNAT || c == names::HOSTPORT_SNAT
}

/// UDP host ports the dead attachments' DNAT chains forwarded.
fn dead_udp_ports(t: &Table, network: &str, dead: &[String]) -> Vec<u16> {
    dead.iter().flat_map(|id| udp_ports_in(t, &names::dnat_chain(network, id))).collect()
}

/// GC in one (backend, family): the dead attachments' chains and jumps, then the shared chains
/// they left unused; their UDP flows forgotten once they are gone.
fn gc_in(
    u: &mut dyn Upstream,
    backend: Backend,
    fam: Fam,
    network: &str,
    keep: &HashSet<&str>,
) -> Result<()> {
    let (dead, ports) = match backend {
        Backend::Nft => {
            let t = u.save(backend, fam)?;
            let dead = dead_in(&t, network, keep);
            for id in &dead {
                u.teardown_nft(fam, &teardown(network, id))?;
            }
            nft_plumbing(u, fam);
            let ports = dead_udp_ports(&t, network, &dead);
            (dead, ports)
        }
        Backend::Legacy => legacy_change(u, fam, |t| {
            let dead = dead_in(t, network, keep);
            let mut s = Script::default();
            for id in &dead {
                for line in teardown(network, id).script(t).lines() {
                    s.push(line);
                }
            }
            let dropped = dropped_by(&s);
            plumbing_script(t, &dropped, &mut s);
            let ports = dead_udp_ports(t, network, &dead);
            (s, (dead, ports))
        })?,
    };
    for id in &dead {
        cni_common::log!(
            "",
            "GC: removed upstream's port mappings of {network}/{id} ({} {fam:?})",
            backend.name()
        );
    }
    u.flush_udp("upstream's port mappings", &ports, &[fam]);
    Ok(())
}

/// GC: remove upstream's iptables port mappings of this network's attachments that are not
/// in the valid list (found by the network name in the entry rules' comments), the shared
/// chains once unused, and the UDP flows of the removed mappings. A failing table does not stop
/// the others. Rules of upstream's nftables backend name no network and are left to DEL.
pub fn gc(u: &mut dyn Upstream, req: &Request) -> Result<()> {
    let network = req.network();
    let valid = req.valid_attachments()?;
    let keep: HashSet<&str> = valid.iter().map(|a| a.container_id.as_str()).collect();
    let mut errors = ErrorList::new();
    for (backend, fam) in u.locate_any(&is_gc_chain)? {
        if let Err(e) = gc_in(u, backend, fam, network, &keep) {
            errors.push(e.context("GC of upstream's iptables port mappings"));
        }
    }
    errors.finish()
}

#[cfg(test)]
mod tests;
