//! A base chain as a plugin declares it ([`Hooked`]).

use super::family::NftFamily;
use super::ops::{BaseChain, NftOp};
use super::read::NftChain;

/// A base chain as a plugin declares it: how ADD writes it, and what a reading of the kernel
/// must find for it to count as there (declared once; ADD, CHECK and STATUS derive from it).
pub struct Hooked {
    pub family: NftFamily,
    pub table: &'static str,
    pub chain: &'static str,
    /// "nat" or "filter".
    pub kind: &'static str,
    pub hook: u32,
    pub priority: i32,
    /// The policy written, when one is (then it must be read back too).
    pub policy: Option<u32>,
}

impl Hooked {
    pub fn base(&self) -> BaseChain {
        BaseChain { kind: self.kind.into(), hook: self.hook, priority: self.priority, policy: self.policy }
    }

    /// The operation that writes it.
    pub fn add_op(&self) -> NftOp {
        NftOp::AddChain {
            family: self.family,
            table: self.table.into(),
            chain: self.chain.into(),
            base: Some(self.base()),
            comment: None,
        }
    }

    /// Whether the kernel's chain `c` is this one as declared.
    pub fn is(&self, c: &NftChain) -> bool {
        c.name == self.chain
            && c.hook == Some((self.hook, self.priority))
            && c.chain_type.as_deref() == Some(self.kind)
            && self.policy.is_none_or(|p| c.policy == Some(p))
    }
}
