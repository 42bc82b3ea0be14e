//! portmap's host ports as upstream makes them: found, checked and removed by our verbs (and
//! read and written by `cni-migrate`), on the plugin-agnostic iptables layer of
//! `cni_common::upstream`.
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

pub mod names;

use crate::config::PortMapConf;
use cni_common::error_list::ErrorList;
use cni_common::netlink::nft::{NfTables, NftDelete, NftRule};
use cni_common::spec::config::PortMapping;
use cni_common::spec::json;
use cni_common::spec::result::CniResult;
use cni_common::upstream::iptables::{self, Backend, Fam, Rule, Script, Table};
use cni_common::upstream::{self as common, locate, nft_family, nftables, Collect, Found, Teardown};
use cni_common::{CniError, Request, Result};
use ipnet::IpNet;
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
fn nft_plumbing(nf: &mut NfTables, fam: Fam) {
    let family = nft_family(fam);
    let empty = |nf: &mut NfTables, chain: &str| -> bool {
        matches!(nf.has_chain(family, "nat", chain), Ok(true))
            && matches!(nf.rules(family, "nat", Some(chain)), Ok(r) if r.is_empty())
    };
    if empty(nf, names::HOSTPORT_DNAT) {
        for t in [dnat_teardown(), masq_teardown(), setmark_teardown()] {
            if let Err(e) = t.apply_nft(nf, fam) {
                eprintln!("note: upstream's portmap chains left in place: {}", e.msg);
            }
        }
    }
    if empty(nf, names::HOSTPORT_SNAT) {
        if let Err(e) = old_snat_teardown().apply_nft(nf, fam) {
            eprintln!("note: upstream's {} left in place: {}", names::HOSTPORT_SNAT, e.msg);
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
fn nft_backend_rules(nf: &mut NfTables, container_id: &str) -> Result<Vec<(Fam, NftRule)>> {
    let mut out = Vec::new();
    for fam in Fam::BOTH {
        let family = nft_family(fam);
        if !nf.has_table(family, names::NFT_HOSTPORT_TABLE)? {
            continue;
        }
        for chain in names::NFT_HOSTPORT_RULE_CHAINS {
            for r in nf.rules(family, names::NFT_HOSTPORT_TABLE, Some(chain))? {
                if r.comment.as_deref() == Some(container_id) {
                    out.push((fam, r));
                }
            }
        }
    }
    Ok(out)
}

/// Delete upstream's nftables-backend rules of `container_id` (one transaction), and each
/// `cni_hostport` table left without any such rule.
fn remove_nft_backend(nf: &mut NfTables, container_id: &str) -> Result<bool> {
    let found = nft_backend_rules(nf, container_id)?;
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
    common::delete(nf, &ops)
        .map_err(|e| CniError::from(e).context("remove upstream's cni_hostport rules"))?;
    for fam in Fam::BOTH {
        let family = nft_family(fam);
        if !found.iter().any(|(f, _)| *f == fam) {
            continue;
        }
        let mut left = 0;
        for chain in names::NFT_HOSTPORT_RULE_CHAINS {
            left += nf.rules(family, names::NFT_HOSTPORT_TABLE, Some(chain))?.len();
        }
        if left == 0 {
            let drop = NftDelete::Table { family, table: names::NFT_HOSTPORT_TABLE.into() };
            if let Err(e) = common::delete(nf, &[drop]) {
                eprintln!(
                    "note: empty table {} {} left in place: {e}",
                    family.keyword(),
                    names::NFT_HOSTPORT_TABLE
                );
            }
        }
    }
    Ok(true)
}

/// Remove everything upstream's portmap made for (network, container id): the iptables chains
/// in every backend and family that has them, the shared chains when no container uses them
/// any more, and the nftables backend's rules of the container id. Returns whether anything
/// was there. On a node without upstream state this costs a few nf_tables GETs and two
/// `/proc` reads.
pub fn remove(network: &str, container_id: &str) -> Result<bool> {
    let wanted = [names::dnat_chain(network, container_id), names::snat_chain(network, container_id)];
    let mut nf = nftables();
    let at = locate(nf.as_mut(), &wanted)?;
    let mut errors = ErrorList::new();
    let mut removed = false;
    let t = teardown(network, container_id);
    for (backend, fam) in at {
        let r = match backend {
            Backend::Nft => match nf.as_mut() {
                Some(nf) => {
                    let r = t.apply_nft(nf, fam);
                    nft_plumbing(nf, fam);
                    r
                }
                None => Ok(false),
            },
            Backend::Legacy => common::legacy_change(fam, |table| {
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
    if let Some(nf) = nf.as_mut() {
        match remove_nft_backend(nf, container_id) {
            Ok(x) => removed |= x,
            Err(e) => errors.push(e),
        }
    }
    errors.finish().map(|()| removed)
}

/// DEL: remove what upstream's portmap made for this attachment (both iptables backends and
/// its nftables backend), and flush the UDP flows of its mappings. A configuration this
/// cannot read (DEL must not fail on it) only costs the conntrack flush.
pub fn del(req: &Request) -> Result<()> {
    let removed = remove(req.network(), &req.env.container_id)
        .map_err(|e| e.context("remove upstream's port mappings"))?;
    if removed {
        if let Ok(spec) = Spec::from_request(req) {
            common::flush_udp("portmap (upstream's rules)", &spec.udp_ports(), &Fam::BOTH);
        }
    }
    Ok(())
}

/// CHECK: when upstream made this attachment's port mappings, whether its form is complete
/// for every family the container has an address in; [`Found::Absent`] when upstream made
/// none.
pub fn check(req: &Request) -> Result<Found> {
    let spec = Spec::from_request(req)?;
    if spec.mappings().is_empty() {
        return Ok(Found::Absent);
    }
    let dn = names::dnat_chain(&spec.network, &spec.container_id);
    let mut nf = nftables();
    let at = locate(nf.as_mut(), std::slice::from_ref(&dn))?;
    let nft_form = match nf.as_mut() {
        Some(nf) => nft_backend_rules(nf, &spec.container_id)?,
        None => Vec::new(),
    };
    if at.is_empty() && nft_form.is_empty() {
        return Ok(Found::Absent);
    }
    for fam in Fam::BOTH {
        if spec.addr(fam).is_none() {
            continue;
        }
        if let Some((backend, _)) = at.iter().find(|(_, f)| *f == fam) {
            let t = iptables::save(*backend, fam)?;
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
/// missing. `cni-migrate to-upstream` verifies what it wrote with this.
pub fn nft_backend_missing(spec: &Spec) -> Result<Option<String>> {
    let Some(mut nf) = nftables() else {
        return Ok(Some("nf_tables is not usable".into()));
    };
    let found = nft_backend_rules(&mut nf, &spec.container_id)?;
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

/// GC of upstream's iptables port mappings (found by the network name in the entry rules'
/// comments), with the shared chains once unused. Rules of upstream's nftables backend name no
/// network and are left to DEL.
struct Gc;

impl Collect for Gc {
    const WHAT: &'static str = "port mappings";

    fn is_chain(c: &str) -> bool {
        c == names::HOSTPORT_DNAT
            || c == names::HOSTPORT_SNAT
            || c.starts_with("CNI-DN-")
            || c.starts_with("CNI-SN-")
    }

    fn dead_in(t: &Table, network: &str, keep: &HashSet<&str>) -> Vec<String> {
        dead_in(t, network, keep)
    }

    fn teardown(network: &str, container_id: &str) -> Teardown {
        teardown(network, container_id)
    }

    fn tidy_nft(nf: &mut NfTables, fam: Fam) {
        nft_plumbing(nf, fam);
    }

    fn tidy_script(t: &Table, s: &mut Script) {
        let dropped = dropped_by(s);
        plumbing_script(t, &dropped, s);
    }

    fn udp_ports(t: &Table, network: &str, dead: &[String]) -> Vec<u16> {
        dead.iter().flat_map(|id| udp_ports_in(t, &names::dnat_chain(network, id))).collect()
    }
}

/// GC: remove upstream's iptables port mappings of this network's attachments that are not
/// in the valid list, the shared chains once unused, and the UDP flows of the removed mappings.
pub fn gc(req: &Request) -> Result<()> {
    common::collect::<Gc>(req)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cni_common::spec::result::{Interface, IpConfig};
    use cni_common::upstream::iptables::SAVED_FOR_TESTS;
    use serde_json::json;

    fn prev() -> CniResult {
        CniResult {
            interfaces: vec![
                Interface { name: "cbr9".into(), ..Default::default() },
                Interface { name: "eth0".into(), sandbox: "/run/netns/x".into(), ..Default::default() },
            ],
            ips: vec![IpConfig {
                interface: Some(1),
                address: "10.77.0.2/24".parse().unwrap(),
                gateway: None,
            }],
            ..Default::default()
        }
    }

    fn spec(extra: Value) -> Spec {
        let mut c = json!({"runtimeConfig": {"portMappings": [
            {"hostPort": 18080, "containerPort": 80, "protocol": "tcp"},
            {"hostPort": 18081, "containerPort": 81, "protocol": "udp"}]}});
        for (k, v) in extra.as_object().unwrap() {
            c[k] = v.clone();
        }
        Spec::from_json("swnet", "ctrA", "eth0", &c, Some(&prev())).unwrap()
    }

    #[test]
    fn captured_upstream_state_is_complete() {
        let t = Table::parse(SAVED_FOR_TESTS);
        let s = spec(json!({}));
        assert_eq!(s.udp_ports(), vec![18081]);
        assert_eq!(missing_rule(&t, &s, Fam::V4), None);
        assert_eq!(missing_rule(&t, &s, Fam::V6), None, "no IPv6 address: nothing to check");
        // A mapping upstream did not make, or another container, is missing.
        let more = Spec::from_json(
            "swnet",
            "ctrA",
            "eth0",
            &json!({"runtimeConfig": {"portMappings": [{"hostPort": 9, "containerPort": 9, "protocol": "tcp"}]}}),
            Some(&prev()),
        )
        .unwrap();
        assert!(missing_rule(&t, &more, Fam::V4).unwrap().contains("--dport 9"));
        let nosnat = spec(json!({"snat": false}));
        assert_eq!(missing_rule(&t, &nosnat, Fam::V4), None, "extra mark rules do not hurt");
        let keep = HashSet::new();
        assert_eq!(dead_in(&t, "swnet", &keep), vec!["ctrA"]);
        assert!(dead_in(&t, "swnet", &HashSet::from(["ctrA"])).is_empty());
        assert_eq!(udp_ports_in(&t, "CNI-DN-6c848780a988c4f72c3ef"), vec![18081]);
    }

    #[test]
    fn rules_in_upstream_order() {
        let s = spec(json!({}));
        let d = dnat_rules(&s, Fam::V4).unwrap();
        assert_eq!(d.chain, "CNI-DN-6c848780a988c4f72c3ef");
        assert_eq!(d.entries.len(), 2);
        assert_eq!(d.entries[0].join(" "), "-m comment --comment dnat name: \"swnet\" id: \"ctrA\" -m multiport -p tcp --destination-ports 18080 -j CNI-DN-6c848780a988c4f72c3ef");
        let rules: Vec<String> = d.rules.iter().map(|r| r.join(" ")).collect();
        assert_eq!(
            rules,
            vec![
                "-p tcp --dport 18080 -s 10.77.0.2/24 -j CNI-HOSTPORT-SETMARK",
                "-p tcp --dport 18080 -s 127.0.0.1 -j CNI-HOSTPORT-SETMARK",
                "-p tcp --dport 18080 -j DNAT --to-destination 10.77.0.2:80",
                "-p udp --dport 18081 -s 10.77.0.2/24 -j CNI-HOSTPORT-SETMARK",
                "-p udp --dport 18081 -s 127.0.0.1 -j CNI-HOSTPORT-SETMARK",
                "-p udp --dport 18081 -j DNAT --to-destination 10.77.0.2:81",
            ]
        );
        assert!(dnat_rules(&s, Fam::V6).is_none());
        // 16 ports of one protocol: two multiport rules; hostIP of the other family skipped.
        let many: Vec<Value> =
            (1..=16).map(|p| json!({"hostPort": 1000 + p, "containerPort": 80, "protocol": "tcp"})).collect();
        let mut c =
            json!({"runtimeConfig": {"portMappings": many}, "markMasqBit": 5, "externalSetMarkChain": ""});
        c["runtimeConfig"]["portMappings"]
            .as_array_mut()
            .unwrap()
            .push(json!({"hostPort": 7, "containerPort": 7, "protocol": "udp", "hostIP": "fd00::1"}));
        let s = Spec::from_json("n", "c", "eth0", &c, Some(&prev())).unwrap();
        let d = dnat_rules(&s, Fam::V4).unwrap();
        assert_eq!(d.entries.len(), 3, "tcp 15 + 1, udp 1 (ports of every mapping)");
        assert_eq!(d.rules.len(), 16 * 3);
        assert_eq!(s.mark(), "0x20/0x20");
        let p = plumbing_rules(&s);
        assert_eq!(p.len(), 5);
        assert!(p
            .iter()
            .any(|(c, a, first)| c == "POSTROUTING" && *first && a.last().unwrap() == "CNI-HOSTPORT-MASQ"));
        assert!(p
            .iter()
            .any(|(c, a, _)| c == "CNI-HOSTPORT-SETMARK" && a.contains(&"0x20/0x20".to_string())));
        let ext = Spec::from_json("n", "c", "eth0", &json!({"externalSetMarkChain": "KUBE-MARK-MASQ"}), None)
            .unwrap();
        assert_eq!(plumbing_rules(&ext).len(), 2, "no SETMARK/MASQ with an external chain");
    }

    #[test]
    fn lenient_and_strict_parsing() {
        assert!(Spec::from_json("n", "c", "eth0", &json!({"markMasqBit": 40}), None).is_err());
        assert!(Spec::from_json(
            "n",
            "c",
            "eth0",
            &json!({"runtimeConfig": {"portMappings": [{"hostPort": 0}]}}),
            None
        )
        .is_err());
        let s = Spec::from_json("n", "c", "eth0", &json!({"snat": null}), None).unwrap();
        assert!(s.conf.snat() && s.mappings().is_empty() && s.v4.is_none());
    }
}
