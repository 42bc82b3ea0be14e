//! State made by upstream's Go plugins (containernetworking/plugins), found, checked and
//! removed by ours, so that binaries can be swapped on a node with running containers.
//!
//! This module is the part that names no plugin: finding an iptables `nat` chain in either
//! backend ([`locate`], [`locate_any`]), taking jumps and chains out as one change
//! ([`Teardown`]), GC's sweep over one kind of per-attachment state ([`Collect`], [`collect`]),
//! upstream's chain-name hash and comment form ([`names`]) and the `iptables` tools themselves
//! ([`iptables`]). What each plugin made, and how it is recognised, lives with the plugin whose
//! state it is; docs/switching.md ("Upstream's state, exactly") lists every name and rule shape
//! with its source file, and says where each part is.
//!
//! Both backends of the `iptables` tool are covered: `iptables-nft` (nf_tables tables `ip nat`
//! and `ip6 nat`) and `iptables-legacy` (x_tables).
//!
//! **Cost on a node without upstream state.** Each verb first looks for the exact chain names
//! the attachment would have: one nf_tables GET per name and family (no dump: a kube-proxy node
//! has tens of thousands of rules) and a read of `/proc/net/ip{,6}_tables_names` (a legacy `nat`
//! table exists only where `iptables-legacy` was used; then its chain names are read with two
//! `getsockopt` calls). Nothing is executed. Only when upstream state is found: removal from
//! nf_tables goes over netlink (rules are found by the chain they jump to, which needs no
//! decoding of iptables' compat expressions); the legacy backend, CHECK (which compares rule
//! contents) and GC (which reads upstream's comments) run `*-save -t nat` and
//! `*-restore --noflush` of the backend that holds the state.

pub mod iptables;
pub mod masq;
pub mod names;
mod xtables;

use crate::error_list::ErrorList;
use crate::netlink::conntrack;
use crate::netlink::nft::{NfTables, NftDelete, NftFamily, NftOp, Verdict};
use crate::netlink::{Family, NlError};
use crate::{CniError, Request, Result};
use iptables::{Backend, Fam, SavedRule, Script, Table};
use std::collections::HashSet;

/// What CHECK found of upstream's form for an attachment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// Nothing upstream made: check our own form.
    Absent,
    /// Upstream made the attachment and its state is complete: CHECK passes.
    Intact,
}

impl Found {
    pub fn is_intact(self) -> bool {
        self == Found::Intact
    }
}

pub fn nft_family(fam: Fam) -> NftFamily {
    match fam {
        Fam::V4 => NftFamily::Ip,
        Fam::V6 => NftFamily::Ip6,
    }
}

/// Deletions as one transaction.
pub fn delete(nf: &mut NfTables, ops: &[NftDelete]) -> std::result::Result<(), NlError> {
    nf.apply(&ops.iter().cloned().map(NftOp::Delete).collect::<Vec<_>>())
}

/// The table name iptables uses.
pub const NAT: &str = "nat";

/// A netlink connection when nf_tables is usable (None: then nothing can live there).
pub fn nftables() -> Option<NfTables> {
    NfTables::new().ok()
}

/// The (backend, family) pairs whose `nat` table has at least one of `chains` (`nf`: the
/// netlink connection, None when nf_tables is not usable).
pub fn locate(nf: Option<&mut NfTables>, chains: &[String]) -> Result<Vec<(Backend, Fam)>> {
    let mut out = Vec::new();
    if let Some(nf) = nf {
        for fam in Fam::BOTH {
            for c in chains {
                if nf.has_chain(nft_family(fam), NAT, c)? {
                    out.push((Backend::Nft, fam));
                    break;
                }
            }
        }
    }
    for fam in Fam::BOTH {
        if let Some(have) = xtables::nat_chains(fam)? {
            if chains.iter().any(|c| have.contains(c)) {
                out.push((Backend::Legacy, fam));
            }
        }
    }
    Ok(out)
}

/// Every (backend, family) with an iptables `nat` table holding a chain that `wanted` selects
/// (for GC, which does not know the names in advance). nf_tables: one dump of the chain names
/// of `ip nat` / `ip6 nat`.
pub fn locate_any(wanted: impl Fn(&str) -> bool) -> Result<Vec<(Backend, Fam)>> {
    let mut out = Vec::new();
    if let Some(mut nf) = nftables() {
        for fam in Fam::BOTH {
            if nf.chains(nft_family(fam), NAT)?.iter().any(|c| wanted(c)) {
                out.push((Backend::Nft, fam));
            }
        }
    }
    for fam in Fam::BOTH {
        if xtables::nat_chains(fam)?.is_some_and(|have| have.iter().any(|c| wanted(c))) {
            out.push((Backend::Legacy, fam));
        }
    }
    Ok(out)
}

/// What to take out of one `nat` table: rules of `entries.0` jumping to `entries.1`, then the
/// chains (flushed first).
#[derive(Debug, Clone, Default)]
pub struct Teardown {
    jumps: Vec<(String, String)>,
    chains: Vec<String>,
}

impl Teardown {
    pub fn jump(mut self, from: &str, to: &str) -> Self {
        self.jumps.push((from.into(), to.into()));
        self
    }

    pub fn chain(mut self, c: &str) -> Self {
        self.chains.push(c.into());
        self
    }

    /// The deletions over netlink: jumps found by their verdict (no need to decode iptables'
    /// xt expressions), chains that exist flushed and deleted; one transaction. Returns whether
    /// something was deleted.
    pub fn apply_nft(&self, nf: &mut NfTables, fam: Fam) -> Result<bool> {
        let family = nft_family(fam);
        let build = |nf: &mut NfTables| -> Result<Vec<NftDelete>> {
            let mut ops = Vec::new();
            let mut seen: Vec<&str> = Vec::new();
            for (from, _) in &self.jumps {
                if seen.contains(&from.as_str()) {
                    continue;
                }
                seen.push(from);
                for r in nf.rules(family, NAT, Some(from))? {
                    let hit = r.verdicts().any(|v| match v {
                        Verdict::Jump(t) | Verdict::Goto(t) => {
                            self.jumps.iter().any(|(f, to)| f == from && to == t)
                        }
                        _ => false,
                    });
                    if hit {
                        ops.push(NftDelete::Rule {
                            family,
                            table: NAT.into(),
                            chain: from.clone(),
                            handle: r.handle,
                        });
                    }
                }
            }
            for c in &self.chains {
                if nf.has_chain(family, NAT, c)? {
                    ops.push(NftDelete::Flush { family, table: NAT.into(), chain: c.clone() });
                }
            }
            for c in &self.chains {
                if nf.has_chain(family, NAT, c)? {
                    ops.push(NftDelete::Chain { family, table: NAT.into(), chain: c.clone() });
                }
            }
            Ok(ops)
        };
        let ops = build(nf)?;
        if ops.is_empty() {
            return Ok(false);
        }
        match delete(nf, &ops) {
            Ok(()) => Ok(true),
            // Something vanished meanwhile (a concurrent iptables user): read again, once.
            Err(e) if e.is_not_found() => {
                let ops = build(nf)?;
                delete(nf, &ops).map(|()| !ops.is_empty()).map_err(CniError::from)
            }
            Err(e) => Err(CniError::from(e)
                .context(format_args!("remove upstream's iptables-nft rules ({} nat)", family.keyword()))),
        }
    }

    /// The same as a restore script against a saved table.
    pub fn script(&self, t: &Table) -> Script {
        let mut s = Script::default();
        for r in self.jump_rules(t) {
            s.delete(r);
        }
        for c in self.chains.iter().filter(|c| t.has_chain(c)) {
            s.flush(c);
        }
        for c in self.chains.iter().filter(|c| t.has_chain(c)) {
            s.delete_chain(c);
        }
        s
    }

    pub fn jump_rules<'a>(&'a self, t: &'a Table) -> impl Iterator<Item = &'a SavedRule> + 'a {
        t.rules.iter().filter(|r| {
            self.jumps.iter().any(|(from, to)| r.chain == *from && r.rule.target.as_deref() == Some(to))
        })
    }

    /// Apply to the legacy table of `fam`. Returns whether something was deleted.
    pub fn apply_legacy(&self, fam: Fam) -> Result<bool> {
        legacy_change(fam, |t| {
            let s = self.script(t);
            let found = !s.is_empty();
            (s, found)
        })
    }

    pub fn apply(&self, nf: Option<&mut NfTables>, backend: Backend, fam: Fam) -> Result<bool> {
        match (backend, nf) {
            (Backend::Nft, Some(nf)) => self.apply_nft(nf, fam),
            (Backend::Nft, None) => Ok(false),
            (Backend::Legacy, _) => self.apply_legacy(fam),
        }
    }
}

/// Change the legacy `nat` table of `fam`: save it, let `build` make a restore script from it,
/// apply the script. A restore that fails (the table changed since it was saved, e.g. a rule to
/// delete is gone) is tried again from a new save, three times in all. Returns what `build`
/// returned with the script that was applied.
pub fn legacy_change<T>(fam: Fam, mut build: impl FnMut(&Table) -> (Script, T)) -> Result<T> {
    let mut last = None;
    for _ in 0..3 {
        let t = iptables::save(Backend::Legacy, fam)?;
        let (s, out) = build(&t);
        match iptables::restore(Backend::Legacy, fam, &s) {
            Ok(()) => return Ok(out),
            Err(e) => last = Some(e),
        }
    }
    Err(last.expect("three attempts"))
}

/// One kind of upstream state in the iptables `nat` tables, as GC finds and removes it
/// ([`collect`]).
pub trait Collect {
    /// What GC's messages call it: "masquerade rules", "port mappings".
    const WHAT: &'static str;
    /// Whether a `nat` table with chain `c` may hold some.
    fn is_chain(c: &str) -> bool;
    /// The container ids of `network` whose state is in `t` and which are not in `keep`.
    fn dead_in(t: &Table, network: &str, keep: &HashSet<&str>) -> Vec<String>;
    /// What to take out of a `nat` table for one attachment.
    fn teardown(network: &str, container_id: &str) -> Teardown;
    /// Once the dead are gone from a nf_tables `nat` table: shared state they left unused.
    fn tidy_nft(_nf: &mut NfTables, _fam: Fam) {}
    /// The same for a legacy table, as lines added to the restore script `s` that removes the
    /// dead from `t`.
    fn tidy_script(_t: &Table, _s: &mut Script) {}
    /// UDP host ports the state of `dead` in `t` forwarded (their flows are forgotten once it
    /// is gone).
    fn udp_ports(_t: &Table, _network: &str, _dead: &[String]) -> Vec<u16> {
        Vec::new()
    }
}

/// GC of one kind of upstream state: remove it for this network's attachments that are not in
/// the valid list, in every (backend, family) whose `nat` table has a chain of that kind (found
/// by reading each saved table; nf_tables changed over netlink, legacy by one restore script),
/// and forget the UDP flows of what was removed. A failing table does not stop the others.
pub fn collect<C: Collect>(req: &Request) -> Result<()> {
    let network = req.network();
    let valid = req.valid_attachments()?;
    let keep: HashSet<&str> = valid.iter().map(|a| a.container_id.as_str()).collect();
    let at = locate_any(C::is_chain)?;
    let mut nf = nftables();
    let mut errors = ErrorList::new();
    for (backend, fam) in at {
        let r = (|| -> Result<()> {
            let (dead, ports) = match (backend, nf.as_mut()) {
                (Backend::Nft, Some(nf)) => {
                    let t = iptables::save(backend, fam)?;
                    let dead = C::dead_in(&t, network, &keep);
                    for id in &dead {
                        C::teardown(network, id).apply_nft(nf, fam)?;
                    }
                    C::tidy_nft(nf, fam);
                    let ports = C::udp_ports(&t, network, &dead);
                    (dead, ports)
                }
                (Backend::Nft, None) => (Vec::new(), Vec::new()),
                (Backend::Legacy, _) => legacy_change(fam, |t| {
                    let dead = C::dead_in(t, network, &keep);
                    let mut s = Script::default();
                    for id in &dead {
                        for line in C::teardown(network, id).script(t).lines() {
                            s.push(line);
                        }
                    }
                    C::tidy_script(t, &mut s);
                    let ports = C::udp_ports(t, network, &dead);
                    (s, (dead, ports))
                })?,
            };
            for id in &dead {
                crate::log!(
                    "",
                    "GC: removed upstream's {} of {network}/{id} ({} {fam:?})",
                    C::WHAT,
                    backend.name()
                );
            }
            flush_udp(&format!("upstream's {}", C::WHAT), &ports, &[fam]);
            Ok(())
        })();
        if let Err(e) = r {
            errors.push(e.context(format_args!("GC of upstream's iptables {}", C::WHAT)));
        }
    }
    errors.finish()
}

/// Forget UDP flows to host ports whose mapping went away (`who`: whose, for the messages).
pub fn flush_udp(who: &str, ports: &[u16], families: &[Fam]) {
    let targets: Vec<(Family, u16)> =
        families.iter().flat_map(|f| ports.iter().map(move |p| (*f, *p))).collect();
    conntrack::flush_udp_ports(who, &targets);
}
