//! An nf_tables that lives in memory, with the semantics portmap relies on: a transaction
//! commits all of its operations or none; an element added under an existing key with other
//! data fails with `EEXIST` (with the same data it is a no-op that keeps the old comment); a
//! deletion of something missing fails with `ENOENT`; a guarded transaction at another
//! generation fails with `ERESTART`; a set or chain still referenced cannot be deleted; the
//! generation moves with every commit that changes something.
//!
//! A set is kept with its declaration, so a set of one of our names can have another shape
//! (types, flags: a table another build or program made), with the kernel's answers to that:
//! a listing gives each set's shape, a set added under an existing name with another shape
//! fails with `EEXIST`, and a key of another length than the set's fails with `EINVAL`, when
//! looked up as when added.
//!
//! For tests of interleavings and failures: every [`Fake`] cloned from another shares its
//! world (like processes sharing the kernel); [`Fake::before_apply`] runs something (another
//! verb) just before the next transaction is processed, after its caller read and planned;
//! [`Fake::fail_next`] makes the next transactions fail with an errno, before or after they
//! commit (a lost answer: `ENOBUFS`, `ETIMEDOUT`).

use super::Kernel;
use crate::state::{dumped, Scope, State};
use cni_common::netlink::nft::{
    listed, ListedSet, NftData, NftDelete, NftElem, NftExpr, NftOp, NftRule, NftSet, NftTable, Snapshot,
    Verdict,
};
use cni_common::netlink::NlError;
use cni_common::{CniError, Result};
use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::rc::Rc;

/// A set or map: its declaration and its elements by key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeSet {
    pub decl: NftSet,
    pub elems: BTreeMap<Vec<u8>, NftElem>,
}

/// The table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Table {
    pub sets: BTreeMap<String, FakeSet>,
    /// Chains in creation order with their rules.
    pub chains: Vec<(String, Vec<NftRule>)>,
}

impl Table {
    fn chain(&mut self, name: &str) -> Option<&mut Vec<NftRule>> {
        self.chains.iter_mut().find(|(n, _)| n == name).map(|(_, r)| r)
    }

    fn has_chain(&self, name: &str) -> bool {
        self.chains.iter().any(|(n, _)| n == name)
    }

    fn referenced_set(&self, set: &str) -> bool {
        self.chains.iter().flat_map(|(_, r)| r).any(|r| r.uses_set(set))
    }

    fn referenced_chain(&self, chain: &str) -> bool {
        let jump = |v: &Verdict| matches!(v, Verdict::Jump(c) | Verdict::Goto(c) if c == chain);
        self.chains.iter().flat_map(|(_, r)| r).any(|r| r.verdicts().any(jump))
    }

    /// Every element of `set`, decoded as the planner sees them (for assertions).
    pub fn elements(&self, set: &str) -> Vec<NftElem> {
        self.sets.get(set).map(|s| s.elems.values().cloned().collect()).unwrap_or_default()
    }
}

/// A failure injected into the next transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Refused with this errno, nothing applied.
    Before(i32),
    /// Applied, but the answer is lost: the caller sees this errno.
    After(i32),
}

#[derive(Default)]
struct World {
    table: Option<Table>,
    generation: u32,
    faults: VecDeque<Fault>,
    read_faults: VecDeque<i32>,
    hooks: VecDeque<Box<dyn FnOnce()>>,
    scripts: Vec<String>,
    commits: usize,
}

/// A connection to the fake kernel (clones share it).
#[derive(Clone, Default)]
pub struct Fake(Rc<RefCell<World>>);

fn err(op: &str, errno: i32) -> NlError {
    NlError::new(op, errno)
}

impl Fake {
    pub fn new() -> Fake {
        Fake::default()
    }

    /// The table as it is now (None when it does not exist).
    pub fn table(&self) -> Option<Table> {
        self.0.borrow().table.clone()
    }

    /// Change the table directly (tampering, another program).
    pub fn edit(&self, f: impl FnOnce(&mut Option<Table>)) {
        let mut w = self.0.borrow_mut();
        f(&mut w.table);
        w.generation += 1;
    }

    pub fn generation(&self) -> u32 {
        self.0.borrow().generation
    }

    /// Transactions committed so far.
    pub fn commits(&self) -> usize {
        self.0.borrow().commits
    }

    /// The `nft -f` scripts run so far.
    pub fn scripts(&self) -> Vec<String> {
        self.0.borrow().scripts.clone()
    }

    /// Make the next transactions fail, one fault each.
    pub fn fail_next(&self, faults: impl IntoIterator<Item = Fault>) {
        self.0.borrow_mut().faults.extend(faults);
    }

    /// Make the next reads fail with these errnos.
    pub fn fail_reads(&self, errnos: impl IntoIterator<Item = i32>) {
        self.0.borrow_mut().read_faults.extend(errnos);
    }

    /// Run `f` just before the next transaction is processed (after its caller read and
    /// planned): a concurrent verb.
    pub fn before_apply(&self, f: impl FnOnce() + 'static) {
        self.0.borrow_mut().hooks.push_back(Box::new(f));
    }

    /// Forget the [`Fake::before_apply`] hooks no transaction ran (the verb applied nothing).
    pub fn clear_hooks(&self) {
        self.0.borrow_mut().hooks.clear();
    }

    fn snapshot(&self, scope: &Scope) -> std::result::Result<Snapshot, NlError> {
        let w = self.0.borrow();
        let mut s = Snapshot { generation: w.generation, ..Default::default() };
        let Some(t) = &w.table else { return Ok(s) };
        s.table = Some(NftTable { name: crate::layout::TABLE.into(), comment: None });
        if !matches!(scope, Scope::Point { rules: false, .. }) {
            s.rules = t.chains.iter().flat_map(|(_, r)| r.iter().cloned()).collect();
        }
        // as the kernel counts (NFTA_CHAIN_USE): the chain's own rules and the jumps into it
        let uses = |c: &String| {
            let own = t.chains.iter().find(|(n, _)| n == c).map(|(_, r)| r.len() as u32)?;
            let jump = |v: &Verdict| matches!(v, Verdict::Jump(x) | Verdict::Goto(x) if x == c);
            Some(own + t.chains.iter().flat_map(|(_, r)| r).filter(|r| r.verdicts().any(jump)).count() as u32)
        };
        s.chain_uses = scope.chains().iter().map(uses).collect();
        for (set, key) in scope.keys() {
            let x = t.sets.get(&set);
            if x.is_some_and(|x| key_len(&x.decl) != key.len()) {
                return Err(err("get element (key of another length than the set's)", libc::EINVAL));
            }
            s.keys.push(x.and_then(|x| x.elems.get(&key)).cloned());
        }
        if matches!(scope, Scope::Full) {
            s.sets =
                t.sets.iter().map(|(n, x)| ListedSet { name: n.clone(), shape: x.decl.shape() }).collect();
            s.chains = t.chains.iter().map(|(n, _)| n.clone()).collect();
            s.dumped = t
                .sets
                .iter()
                .filter(|(n, _)| dumped(n))
                .map(|(n, x)| (n.clone(), x.elems.values().cloned().collect()))
                .collect();
        }
        Ok(s)
    }
}

/// Apply one operation to `t` (None: no table).
fn apply_op(t: &mut Option<Table>, op: &NftOp, next_handle: &mut u64) -> std::result::Result<(), NlError> {
    if let NftOp::AddTable { .. } = op {
        t.get_or_insert_with(Table::default);
        return Ok(());
    }
    if let NftOp::Delete(NftDelete::Table { .. }) = op {
        return t.take().map(|_| ()).ok_or_else(|| err("delete table", libc::ENOENT));
    }
    let t = t.as_mut().ok_or_else(|| err("no such table", libc::ENOENT))?;
    match op {
        NftOp::AddTable { .. } | NftOp::Delete(NftDelete::Table { .. }) => unreachable!(),
        NftOp::AddSet { set, .. } => {
            let x = t
                .sets
                .entry(set.name.clone())
                .or_insert_with(|| FakeSet { decl: set.clone(), elems: BTreeMap::new() });
            if x.decl.shape() != set.shape() {
                return Err(err("add set (one of this name with another shape exists)", libc::EEXIST));
            }
        }
        NftOp::AddChain { chain, .. } => {
            if !t.has_chain(chain) {
                t.chains.push((chain.clone(), Vec::new()));
            }
        }
        NftOp::AddRule { chain, exprs, comment, .. } => {
            let exprs = listed(exprs);
            for e in &exprs {
                match e {
                    NftExpr::Lookup { set } if !t.sets.contains_key(set) => {
                        return Err(err("lookup set", libc::ENOENT))
                    }
                    NftExpr::Verdict(Verdict::Jump(c) | Verdict::Goto(c)) if !t.has_chain(c) => {
                        return Err(err("jump", libc::ENOENT))
                    }
                    _ => {}
                }
            }
            *next_handle += 1;
            let rule = NftRule {
                table: crate::layout::TABLE.into(),
                chain: chain.clone(),
                handle: *next_handle,
                comment: comment.clone(),
                exprs,
            };
            t.chain(chain).ok_or_else(|| err("add rule", libc::ENOENT))?.push(rule);
        }
        NftOp::AddElements { set, elems, .. } => add_elements(t, set, elems, false)?,
        NftOp::CreateElements { set, elems, .. } => add_elements(t, set, elems, true)?,
        NftOp::DeleteElements { set, elems, .. } => {
            let s = t.sets.get_mut(set).ok_or_else(|| err("delete element", libc::ENOENT))?;
            for e in elems {
                s.elems.remove(&e.key).ok_or_else(|| err("delete element", libc::ENOENT))?;
            }
        }
        NftOp::FlushSet { set, .. } => {
            t.sets.get_mut(set).ok_or_else(|| err("flush set", libc::ENOENT))?.elems.clear();
        }
        NftOp::Delete(NftDelete::Flush { chain, .. }) => {
            t.chain(chain).ok_or_else(|| err("flush chain", libc::ENOENT))?.clear();
        }
        NftOp::Delete(NftDelete::Rule { chain, handle, .. }) => {
            let rules = t.chain(chain).ok_or_else(|| err("delete rule", libc::ENOENT))?;
            let i = rules
                .iter()
                .position(|r| r.handle == *handle)
                .ok_or_else(|| err("delete rule", libc::ENOENT))?;
            rules.remove(i);
        }
        NftOp::Delete(NftDelete::Chain { chain, .. }) => {
            let i = t
                .chains
                .iter()
                .position(|(n, _)| n == chain)
                .ok_or_else(|| err("delete chain", libc::ENOENT))?;
            if !t.chains[i].1.is_empty() || t.referenced_chain(chain) {
                return Err(err("delete chain", libc::EBUSY));
            }
            t.chains.remove(i);
        }
        NftOp::Delete(NftDelete::Set { set, .. }) => {
            if !t.sets.contains_key(set) {
                return Err(err("delete set", libc::ENOENT));
            }
            if t.referenced_set(set) {
                return Err(err("delete set", libc::EBUSY));
            }
            t.sets.remove(set);
        }
    }
    Ok(())
}

/// `add element` (`create element` with `excl`): a key that exists with the same data is a
/// no-op keeping the old comment, with other data (or any, with `excl`) `EEXIST`.
fn add_elements(t: &mut Table, set: &str, elems: &[NftElem], excl: bool) -> std::result::Result<(), NlError> {
    let s = t.sets.get_mut(set).ok_or_else(|| err("add element", libc::ENOENT))?;
    let key_len = key_len(&s.decl);
    for e in elems {
        if e.key.len() != key_len || e.data.is_some() != s.decl.data.is_some() {
            return Err(err("add element (layout)", libc::EINVAL));
        }
        match s.elems.get(&e.key) {
            Some(old) if excl || old.data != e.data => return Err(err("add element", libc::EEXIST)),
            Some(_) => {}
            None => {
                s.elems.insert(e.key.clone(), e.clone());
            }
        }
    }
    Ok(())
}

/// The key length of a set's declaration (a concatenation pads each part to 4 bytes).
fn key_len(s: &NftSet) -> usize {
    match s.key.as_slice() {
        [one] => one.bytes() as usize,
        many => many.iter().map(|t| (t.bytes() as usize).next_multiple_of(4)).sum(),
    }
}

/// What an `nft -f` script of ours does to the table (the lines portmap writes: add table,
/// add chain, flush chain, add rule ... jump <chain>). The rule's conditions are kept as an
/// opaque expression.
fn run_script(t: &mut Option<Table>, script: &str) -> Result<()> {
    let mut handle = 1000;
    for line in script.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let op = match words.as_slice() {
            ["add", "table", ..] => NftOp::AddTable {
                family: crate::layout::FAMILY,
                table: crate::layout::TABLE.into(),
                comment: None,
            },
            ["add", "chain", _, _, name] => NftOp::AddChain {
                family: crate::layout::FAMILY,
                table: crate::layout::TABLE.into(),
                chain: name.to_string(),
                base: None,
                comment: None,
            },
            ["flush", "chain", _, _, name] => NftOp::Delete(NftDelete::Flush {
                family: crate::layout::FAMILY,
                table: crate::layout::TABLE.into(),
                chain: name.to_string(),
            }),
            ["add", "rule", _, _, chain, rest @ ..] => {
                let target = rest.iter().position(|w| *w == "jump").and_then(|i| rest.get(i + 1));
                let Some(target) = target else {
                    return Err(CniError::internal(format!("fake nft: no jump in {line:?}")));
                };
                let tab = t.as_mut().ok_or_else(|| CniError::internal("fake nft: no table"))?;
                handle += 1;
                let rule = NftRule {
                    table: crate::layout::TABLE.into(),
                    chain: chain.to_string(),
                    handle,
                    comment: None,
                    exprs: vec![
                        NftExpr::Other("conditions".into()),
                        NftExpr::Verdict(Verdict::Jump(target.to_string())),
                    ],
                };
                tab.chain(chain).ok_or_else(|| CniError::internal("fake nft: no chain"))?.push(rule);
                continue;
            }
            _ => return Err(CniError::internal(format!("fake nft: cannot run {line:?}"))),
        };
        apply_op(t, &op, &mut handle).map_err(CniError::from)?;
    }
    Ok(())
}

impl Kernel for Fake {
    fn read(&mut self, scope: &Scope) -> std::result::Result<State, NlError> {
        if let Some(e) = self.0.borrow_mut().read_faults.pop_front() {
            return Err(err("read (injected)", e));
        }
        Ok(State::decode(scope, &self.snapshot(scope)?))
    }

    fn apply(&mut self, ops: &[NftOp], generation: Option<u32>) -> std::result::Result<(), NlError> {
        let hook = self.0.borrow_mut().hooks.pop_front();
        if let Some(h) = hook {
            h();
        }
        let mut w = self.0.borrow_mut();
        let fault = w.faults.pop_front();
        if let Some(Fault::Before(e)) = fault {
            return Err(err("nftables transaction (injected)", e));
        }
        if ops.is_empty() {
            return Ok(());
        }
        if generation.is_some_and(|g| g != w.generation) {
            return Err(err("nftables transaction", libc::ERESTART));
        }
        let mut t = w.table.clone();
        let mut handle = w.commits as u64 * 10_000;
        for op in ops {
            apply_op(&mut t, op, &mut handle)?;
        }
        if t != w.table {
            w.table = t;
            w.generation += 1;
        }
        w.commits += 1;
        match fault {
            Some(Fault::After(e)) => Err(err("nftables transaction (answer lost)", e)),
            _ => Ok(()),
        }
    }

    fn validate(&mut self, ops: &[NftOp]) -> std::result::Result<(), NlError> {
        let mut t = None;
        let mut handle = 0;
        for op in ops {
            apply_op(&mut t, op, &mut handle)?;
        }
        Ok(())
    }

    fn answers(&mut self) -> std::result::Result<(), NlError> {
        Ok(())
    }

    fn nft(&mut self, script: &str, check: bool) -> Result<()> {
        let mut w = self.0.borrow_mut();
        w.scripts.push(script.to_string());
        let mut t = w.table.clone();
        run_script(&mut t, script)?;
        if !check {
            w.table = t;
            w.generation += 1;
        }
        Ok(())
    }
}

/// The data of an element as bytes (for assertions).
pub fn data_bytes(e: &NftElem) -> Option<&[u8]> {
    match &e.data {
        Some(NftData::Value(v)) => Some(v),
        _ => None,
    }
}
