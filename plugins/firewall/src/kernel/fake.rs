//! An in-memory `ip filter` / `ip6 filter` with the kernel's semantics as far as the flows
//! use them: a generation that moves with every commit, ERESTART for a batch planned on an
//! older one, ENOENT for a rule or chain that is not there, all-or-nothing batches, inserts at
//! the top, and hooks to run another process's transaction between a read and an apply.

use super::{Kernel, Tables};
use cni_common::net::Family;
use cni_common::netlink::nft::{listed, NftChain, NftDelete, NftOp, NftRule};
use cni_common::netlink::NlError;

/// One family's table: its chains and rules.
pub type FakeTable = (Family, Vec<NftChain>, Vec<NftRule>);

/// Another process's transaction, run between a read and the apply that follows it.
pub type Between = Box<dyn FnMut(&mut Fake)>;

#[derive(Default)]
pub struct Fake {
    pub generation: u32,
    /// (family, chains, rules): the table of each family that has one.
    pub tables: Vec<FakeTable>,
    pub next_handle: u64,
    /// Run after the next read (another process's transaction).
    pub between: Vec<Between>,
    pub applied: usize,
    /// Fail every apply with this errno.
    pub fail: Option<i32>,
}

fn fam_of(op: &NftOp) -> Family {
    use cni_common::netlink::nft::NftFamily;
    let f = match op {
        NftOp::AddTable { family, .. } | NftOp::AddChain { family, .. } | NftOp::AddRule { family, .. } => {
            *family
        }
        NftOp::Delete(NftDelete::Rule { family, .. }) => *family,
        other => panic!("the firewall plugin does not send {other:?}"),
    };
    if f == NftFamily::Ip6 {
        Family::V6
    } else {
        Family::V4
    }
}

impl Fake {
    fn table(&mut self, f: Family) -> Option<&mut FakeTable> {
        self.tables.iter_mut().find(|t| t.0 == f)
    }

    /// Apply `ops` to a copy; keep it only when every op succeeded.
    pub fn commit(&mut self, ops: &[(NftOp, bool)]) -> Result<(), NlError> {
        let saved = (self.tables.clone(), self.next_handle);
        for (op, top) in ops {
            if let Err(e) = self.one(op, *top) {
                (self.tables, self.next_handle) = saved;
                return Err(e);
            }
        }
        self.generation += 1;
        Ok(())
    }

    fn one(&mut self, op: &NftOp, top: bool) -> Result<(), NlError> {
        let f = fam_of(op);
        let err = |what: &str, errno| NlError::new(what.to_string(), errno);
        if let NftOp::AddTable { .. } = op {
            if self.table(f).is_none() {
                self.tables.push((f, Vec::new(), Vec::new()));
            }
            return Ok(());
        }
        self.next_handle += 1;
        let handle = self.next_handle;
        let t = self.table(f).ok_or_else(|| err("no table", libc::ENOENT))?;
        match op {
            NftOp::AddChain { chain, base, .. } => {
                if !t.1.iter().any(|c| &c.name == chain) {
                    t.1.push(NftChain {
                        name: chain.clone(),
                        hook: base.as_ref().map(|b| (b.hook, b.priority)),
                        chain_type: base.as_ref().map(|b| b.kind.clone()),
                        policy: base.as_ref().and_then(|b| b.policy),
                        uses: None,
                    });
                }
            }
            NftOp::AddRule { chain, exprs, comment, .. } => {
                if !t.1.iter().any(|c| &c.name == chain) {
                    return Err(err("add rule", libc::ENOENT));
                }
                let r = NftRule {
                    table: "filter".into(),
                    chain: chain.clone(),
                    handle,
                    comment: comment.clone(),
                    exprs: listed(exprs),
                };
                if top {
                    let at = t.2.iter().position(|x| &x.chain == chain).unwrap_or(t.2.len());
                    t.2.insert(at, r);
                } else {
                    t.2.push(r);
                }
            }
            NftOp::Delete(NftDelete::Rule { chain, handle, .. }) => {
                let at =
                    t.2.iter()
                        .position(|x| &x.chain == chain && x.handle == *handle)
                        .ok_or_else(|| err("delete rule", libc::ENOENT))?;
                t.2.remove(at);
            }
            _ => unreachable!(),
        }
        Ok(())
    }
}

impl Kernel for Fake {
    fn read(&mut self, family: Family, chains: &[String]) -> Result<Tables, NlError> {
        let t = self.tables.iter().find(|t| t.0 == family);
        let out = Tables {
            generation: self.generation,
            chains: t.map(|t| t.1.clone()).unwrap_or_default(),
            rules: t
                .map(|t| t.2.iter().filter(|r| chains.contains(&r.chain)).cloned().collect())
                .unwrap_or_default(),
        };
        let mut between = std::mem::take(&mut self.between);
        for f in &mut between {
            f(self);
        }
        Ok(out)
    }

    fn apply(&mut self, ops: &[(NftOp, bool)], generation: Option<u32>) -> Result<(), NlError> {
        if let Some(e) = self.fail {
            return Err(NlError::new("apply", e));
        }
        if generation.is_some_and(|g| g != self.generation) {
            return Err(NlError::new("apply", libc::ERESTART));
        }
        self.applied += 1;
        self.commit(ops)
    }

    fn validate(&mut self, _ops: &[NftOp]) -> Result<(), NlError> {
        self.fail.map_or(Ok(()), |e| Err(NlError::new("validate", e)))
    }
}
