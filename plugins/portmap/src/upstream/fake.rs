//! Upstream's host-port state in memory, behind the same seam as the node ([`Upstream`]): the
//! iptables `nat` tables of each backend (`iptables-nft`, `iptables-legacy`) and family, kept
//! as `*-save` shows them, and the `cni_hostport` tables of upstream's nftables backend.
//!
//! A test seeds what upstream made (restore lines, captured `*-save` text, or nftables-backend
//! rules tagged with a container id) and sees portmap's DEL, CHECK and GC act on it. Each
//! change is all or nothing, as on the node: a restore script, a teardown transaction, a
//! `cni_hostport` deletion. The semantics kept are the ones portmap relies on: `-D` of a rule
//! that is not there fails, `-X` of a chain with rules or still jumped to fails, a deletion of a
//! missing rule or table fails with `ENOENT`.
//!
//! Faults: [`Fake::fail`] makes the next call of one operation fail, either refused (nothing
//! changed) or with its answer lost (changed, yet the caller sees the error);
//! [`Fake::without_tool`] removes a backend's `*-save`/`*-restore`; [`Fake::without_nf_tables`]
//! makes nf_tables unusable (then neither iptables-nft nor the nftables backend can hold
//! anything visible). Clones share one world.

use super::seam::Upstream;
use cni_common::netlink::nft::{NftDelete, NftFamily, NftRule};
use cni_common::netlink::NlError;
use cni_common::upstream::iptables::{split_words, Backend, Fam, Rule, SavedRule, Script, Table};
use cni_common::upstream::Teardown;
use cni_common::{CniError, Result};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;

/// An operation of the seam, for faults and the log of calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Locate,
    Save,
    Restore,
    Teardown,
    ChainLen,
    HostportRead,
    HostportDelete,
}

/// A failure injected into the next call of an operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Refused: nothing changed.
    Refused(Op, CniError),
    /// Done, but the answer was lost: the caller sees the error.
    Lost(Op, CniError),
}

impl Fault {
    fn op(&self) -> Op {
        match self {
            Fault::Refused(op, _) | Fault::Lost(op, _) => *op,
        }
    }
}

#[derive(Default)]
struct World {
    nat: Vec<(Backend, Fam, Table)>,
    hostport: Vec<(Fam, Vec<NftRule>)>,
    handle: u64,
    faults: VecDeque<Fault>,
    missing_tools: Vec<Backend>,
    no_nf_tables: bool,
    flushed: Vec<(Fam, u16)>,
    calls: Vec<Op>,
}

impl World {
    fn nat_mut(&mut self, backend: Backend, fam: Fam) -> Option<&mut Table> {
        self.nat.iter_mut().find(|(b, f, _)| *b == backend && *f == fam).map(|(_, _, t)| t)
    }

    /// The tables a reader sees (iptables-nft's live in nf_tables).
    fn visible(&self) -> impl Iterator<Item = &(Backend, Fam, Table)> {
        self.nat.iter().filter(|(b, _, _)| !(self.no_nf_tables && *b == Backend::Nft))
    }

    fn nat_or_new(&mut self, backend: Backend, fam: Fam) -> &mut Table {
        if self.nat_mut(backend, fam).is_none() {
            let chains = ["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"].map(String::from).to_vec();
            self.nat.push((backend, fam, Table { chains, rules: Vec::new() }));
        }
        self.nat_mut(backend, fam).expect("made above")
    }

    /// The fault for this call of `op`, if one is queued.
    fn fault(&mut self, op: Op) -> Option<Fault> {
        self.calls.push(op);
        let i = self.faults.iter().position(|f| f.op() == op)?;
        self.faults.remove(i)
    }

    fn tool(&self, backend: Backend, fam: Fam, what: &str) -> Result<()> {
        if self.missing_tools.contains(&backend) {
            return Err(CniError::internal(format!(
                "{} is not installed (searched PATH, /usr/sbin, /sbin, /usr/local/sbin): install the iptables package",
                backend.tool(fam, what)
            )));
        }
        Ok(())
    }
}

/// Run `f` (a change) under the fault queued for `op`: refused, it is not run; lost, it runs
/// and the caller sees the error.
fn faulted<T>(w: &mut World, op: Op, f: impl FnOnce(&mut World) -> Result<T>) -> Result<T> {
    match w.fault(op) {
        Some(Fault::Refused(_, e)) => Err(e),
        Some(Fault::Lost(_, e)) => f(w).and(Err(e)),
        None => f(w),
    }
}

/// Apply restore lines to `t`, all or nothing (what `*-restore --noflush` does to a table).
fn run(t: &mut Table, lines: &[String]) -> Result<()> {
    let mut n = t.clone();
    for line in lines {
        let words = split_words(line);
        let bad = |why: &str| CniError::internal(format!("iptables-restore: line {line:?}: {why}"));
        let (Some(cmd), Some(chain)) = (words.first(), words.get(1)) else { return Err(bad("no command")) };
        let rest = &words[2..];
        let exists = n.has_chain(chain);
        match cmd.as_str() {
            "-N" if exists => return Err(bad("Chain already exists")),
            "-N" => n.chains.push(chain.clone()),
            _ if !exists => return Err(bad("No chain/target/match by that name")),
            "-A" | "-I" => {
                let words =
                    if cmd == "-I" { rest.get(1..).unwrap_or_default().to_vec() } else { rest.to_vec() };
                let r = SavedRule { chain: chain.clone(), rule: Rule::parse(&words), words };
                let at = match cmd.as_str() {
                    "-I" => n.rules.iter().position(|x| x.chain == *chain),
                    _ => None,
                };
                n.rules.insert(at.unwrap_or(n.rules.len()), r);
            }
            "-D" => {
                let i = n
                    .rules
                    .iter()
                    .position(|x| x.chain == *chain && x.words == rest)
                    .ok_or_else(|| bad("Bad rule (does a matching rule exist in that chain?)"))?;
                n.rules.remove(i);
            }
            "-F" => n.rules.retain(|x| x.chain != *chain),
            "-X" => {
                if n.rules.iter().any(|x| x.chain == *chain) || n.referenced(chain) {
                    return Err(bad("Directory not empty / Too many links"));
                }
                n.chains.retain(|c| c != chain);
            }
            _ => return Err(bad("not understood by the fake")),
        }
    }
    *t = n;
    Ok(())
}

fn fam_of(f: NftFamily) -> Option<Fam> {
    match f {
        NftFamily::Ip => Some(Fam::V4),
        NftFamily::Ip6 => Some(Fam::V6),
        _ => None,
    }
}

fn enoent(what: &str) -> CniError {
    CniError::from(NlError::new(what, libc::ENOENT))
}

/// Upstream's state of the fake node (clones share it).
#[derive(Clone, Default)]
pub struct Fake(Rc<RefCell<World>>);

impl Fake {
    pub fn new() -> Fake {
        Fake::default()
    }

    /// Apply restore lines to the `nat` table of `backend`/`fam` (made with its base chains when
    /// missing), as upstream's ADD (or another iptables user) would. Panics on a line the table
    /// refuses: a seed is a test's premise.
    pub fn seed(&self, backend: Backend, fam: Fam, script: &Script) {
        let lines: Vec<String> = script.lines().map(String::from).collect();
        assert!(script.refused().is_empty(), "seed refused: {:?}", script.refused());
        run(self.0.borrow_mut().nat_or_new(backend, fam), &lines).expect("seed applies");
    }

    /// What upstream's ADD (1.1.1 and later) writes in the `nat` table of `backend`/`fam` for
    /// `spec`, given what the table already holds (upstream's form: `crate::upstream`).
    pub fn made_by_upstream(&self, backend: Backend, fam: Fam, spec: &super::Spec) {
        self.seed(backend, fam, &Script::default());
        let t = self.nat(backend, fam).expect("made above");
        let d = super::dnat_rules(spec, fam).expect("an address of the family");
        let mut s = Script::default();
        let mut chains = vec![super::names::HOSTPORT_DNAT, d.chain.as_str()];
        if spec.makes_mark_chains() {
            chains.extend([super::names::HOSTPORT_SETMARK, super::names::HOSTPORT_MASQ]);
        }
        for c in chains {
            if !t.has_chain(c) {
                s.new_chain(c);
            }
        }
        for (chain, args, first) in super::plumbing_rules(spec) {
            if !t.contains(&chain, &Rule::parse(&args)) {
                if first {
                    s.insert_first(&chain, &args);
                } else {
                    s.append(&chain, &args);
                }
            }
        }
        for r in &d.rules {
            s.append(&d.chain, r);
        }
        for e in &d.entries {
            s.append(super::names::HOSTPORT_DNAT, e);
        }
        self.seed(backend, fam, &s);
    }

    /// What upstream's nftables backend (v1.6+) writes for `spec` in `fam`: a rule per mapping
    /// in `hostports`, the masquerade rules in `masquerading` (2 for IPv4, 1 for IPv6), each
    /// commented with the container id.
    pub fn made_by_nft_backend(&self, fam: Fam, spec: &super::Spec) {
        for _ in spec.mappings() {
            self.hostport_rule(fam, "hostports", &spec.container_id);
        }
        for _ in 0..if fam == Fam::V4 { 2 } else { 1 } {
            self.hostport_rule(fam, "masquerading", &spec.container_id);
        }
    }

    /// Put a `*-save -t nat` text in place of the `nat` table of `backend`/`fam`.
    pub fn seed_saved(&self, backend: Backend, fam: Fam, text: &str) {
        let mut w = self.0.borrow_mut();
        w.nat.retain(|(b, f, _)| !(*b == backend && *f == fam));
        w.nat.push((backend, fam, Table::parse(text)));
    }

    /// Add a rule to chain `chain` of `cni_hostport` in `fam` (the table made when missing),
    /// commented `comment` (upstream's nftables backend comments with the container id).
    pub fn hostport_rule(&self, fam: Fam, chain: &str, comment: &str) {
        let mut w = self.0.borrow_mut();
        w.handle += 1;
        let rule = NftRule {
            table: super::names::NFT_HOSTPORT_TABLE.into(),
            chain: chain.into(),
            handle: w.handle,
            comment: Some(comment.into()),
            exprs: Vec::new(),
        };
        match w.hostport.iter_mut().find(|(f, _)| *f == fam) {
            Some((_, rules)) => rules.push(rule),
            None => w.hostport.push((fam, vec![rule])),
        }
    }

    /// The `nat` table of `backend`/`fam` now (None: never made).
    pub fn nat(&self, backend: Backend, fam: Fam) -> Option<Table> {
        self.0.borrow_mut().nat_mut(backend, fam).cloned()
    }

    /// The rules of `cni_hostport` in `fam` now (None: no such table).
    pub fn hostport(&self, fam: Fam) -> Option<Vec<NftRule>> {
        self.0.borrow().hostport.iter().find(|(f, _)| *f == fam).map(|(_, r)| r.clone())
    }

    /// Queue faults, each for the next call of its operation.
    pub fn fail(&self, faults: impl IntoIterator<Item = Fault>) {
        self.0.borrow_mut().faults.extend(faults);
    }

    /// Faults queued and not yet met.
    pub fn faults_left(&self) -> usize {
        self.0.borrow().faults.len()
    }

    /// `backend`'s `*-save` and `*-restore` are not installed.
    pub fn without_tool(&self, backend: Backend) {
        self.0.borrow_mut().missing_tools.push(backend);
    }

    /// nf_tables cannot be talked to.
    pub fn without_nf_tables(&self) {
        self.0.borrow_mut().no_nf_tables = true;
    }

    /// UDP host ports whose flows were forgotten, in order.
    pub fn flushed(&self) -> Vec<(Fam, u16)> {
        self.0.borrow().flushed.clone()
    }

    /// The operations called, in order.
    pub fn calls(&self) -> Vec<Op> {
        self.0.borrow().calls.clone()
    }
}

impl Upstream for Fake {
    fn locate(&mut self, chains: &[String]) -> Result<Vec<(Backend, Fam)>> {
        self.locate_any(&|c| chains.iter().any(|x| x == c))
    }

    fn locate_any(&mut self, wanted: &dyn Fn(&str) -> bool) -> Result<Vec<(Backend, Fam)>> {
        let mut w = self.0.borrow_mut();
        faulted(&mut w, Op::Locate, |w| {
            let mut out = Vec::new();
            for backend in [Backend::Nft, Backend::Legacy] {
                for fam in Fam::BOTH {
                    let hit = w
                        .visible()
                        .any(|(b, f, t)| *b == backend && *f == fam && t.chains.iter().any(|c| wanted(c)));
                    if hit {
                        out.push((backend, fam));
                    }
                }
            }
            Ok(out)
        })
    }

    fn save(&mut self, backend: Backend, fam: Fam) -> Result<Table> {
        let mut w = self.0.borrow_mut();
        faulted(&mut w, Op::Save, |w| {
            w.tool(backend, fam, "save")?;
            let t = w.visible().find(|(b, f, _)| *b == backend && *f == fam).map(|(_, _, t)| t.clone());
            Ok(t.unwrap_or_default())
        })
    }

    fn restore_legacy(&mut self, fam: Fam, script: &Script) -> Result<()> {
        let mut w = self.0.borrow_mut();
        faulted(&mut w, Op::Restore, |w| {
            if !script.refused().is_empty() {
                return Err(CniError::internal(format!(
                    "iptables-restore not run: {}",
                    script.refused().join("; ")
                )));
            }
            if script.is_empty() {
                return Ok(());
            }
            w.tool(Backend::Legacy, fam, "restore")?;
            let lines: Vec<String> = script.lines().map(String::from).collect();
            run(w.nat_or_new(Backend::Legacy, fam), &lines)
        })
    }

    fn teardown_nft(&mut self, fam: Fam, t: &Teardown) -> Result<bool> {
        let mut w = self.0.borrow_mut();
        faulted(&mut w, Op::Teardown, |w| {
            if w.no_nf_tables {
                return Ok(false);
            }
            let Some(table) = w.nat_mut(Backend::Nft, fam) else { return Ok(false) };
            let s = t.script(table);
            if s.is_empty() {
                return Ok(false);
            }
            let lines: Vec<String> = s.lines().map(String::from).collect();
            run(table, &lines).map(|()| true)
        })
    }

    fn nft_chain_len(&mut self, fam: Fam, chain: &str) -> Result<Option<usize>> {
        let mut w = self.0.borrow_mut();
        faulted(&mut w, Op::ChainLen, |w| {
            let t = w.visible().find(|(b, f, _)| *b == Backend::Nft && *f == fam).map(|(_, _, t)| t);
            Ok(t.filter(|t| t.has_chain(chain)).map(|t| t.rules_in(chain).count()))
        })
    }

    fn hostport_rules(&mut self, fam: Fam) -> Result<Option<Vec<NftRule>>> {
        let mut w = self.0.borrow_mut();
        faulted(&mut w, Op::HostportRead, |w| {
            if w.no_nf_tables {
                return Ok(None);
            }
            Ok(w.hostport.iter().find(|(f, _)| *f == fam).map(|(_, r)| r.clone()))
        })
    }

    fn hostport_delete(&mut self, ops: &[NftDelete]) -> Result<()> {
        let mut w = self.0.borrow_mut();
        faulted(&mut w, Op::HostportDelete, |w| {
            let mut tables = w.hostport.clone();
            for op in ops {
                match op {
                    NftDelete::Rule { family, chain, handle, .. } => {
                        let fam = fam_of(*family);
                        let rules = tables
                            .iter_mut()
                            .find(|(f, _)| Some(*f) == fam)
                            .map(|(_, r)| r)
                            .ok_or_else(|| enoent("delete rule"))?;
                        let i = rules
                            .iter()
                            .position(|r| r.chain == *chain && r.handle == *handle)
                            .ok_or_else(|| enoent("delete rule"))?;
                        rules.remove(i);
                    }
                    NftDelete::Table { family, .. } => {
                        let fam = fam_of(*family);
                        let i = tables
                            .iter()
                            .position(|(f, _)| Some(*f) == fam)
                            .ok_or_else(|| enoent("delete table"))?;
                        tables.remove(i);
                    }
                    other => {
                        return Err(CniError::internal(format!("fake cni_hostport: cannot {other:?}")));
                    }
                }
            }
            w.hostport = tables;
            Ok(())
        })
    }

    fn flush_udp(&mut self, _who: &str, ports: &[u16], fams: &[Fam]) {
        let mut w = self.0.borrow_mut();
        for f in fams {
            w.flushed.extend(ports.iter().map(|p| (*f, *p)));
        }
    }
}
