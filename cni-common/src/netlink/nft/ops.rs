//! The operations a transaction is made of ([`NftOp`], [`NftDelete`]): plain data, encoded by
//! `encode` and sent by [`super::NfTables::apply`].

use super::expr::RuleExpr;
use super::family::NftFamily;
use super::set::{NftElem, NftSet};

/// A base chain's type, hook, priority and (when given) policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseChain {
    /// "filter", "nat" or "route".
    pub kind: String,
    pub hook: u32,
    pub priority: i32,
    pub policy: Option<u32>,
}

/// One change of an [`NfTables::apply`] transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NftOp {
    /// `add table` (an existing table is left as it is).
    AddTable { family: NftFamily, table: String, comment: Option<String> },
    /// `add chain` (an existing chain with the same definition is left as it is).
    AddChain {
        family: NftFamily,
        table: String,
        chain: String,
        base: Option<BaseChain>,
        comment: Option<String>,
    },
    /// `add rule` (appended to the chain).
    AddRule { family: NftFamily, table: String, chain: String, exprs: Vec<RuleExpr>, comment: Option<String> },
    /// `add element`: see the module documentation for what happens to existing keys.
    AddElements { family: NftFamily, table: String, set: String, elems: Vec<NftElem> },
    /// `create element`: fails when any key exists.
    CreateElements { family: NftFamily, table: String, set: String, elems: Vec<NftElem> },
    /// `delete element` (by key, and key end / interval flag; data and comments are ignored).
    DeleteElements { family: NftFamily, table: String, set: String, elems: Vec<NftElem> },
    /// `add set|map` (an existing set with the same definition is left as it is).
    AddSet { family: NftFamily, table: String, set: NftSet },
    /// `flush set|map`: every element goes.
    FlushSet { family: NftFamily, table: String, set: String },
    /// A deletion of a rule, chain or table, or the flush of a chain.
    Delete(NftDelete),
}

/// What an [`NftOp::Delete`] removes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NftDelete {
    /// A rule, by handle.
    Rule { family: NftFamily, table: String, chain: String, handle: u64 },
    /// Every rule of a chain (`flush chain`).
    Flush { family: NftFamily, table: String, chain: String },
    /// A chain (it must not be referenced by a jump; flush it in the same transaction first).
    Chain { family: NftFamily, table: String, chain: String },
    /// A whole table with everything in it.
    Table { family: NftFamily, table: String },
    /// A set or map with its elements (no rule may use it any more: delete or flush those
    /// rules first, in the same transaction).
    Set { family: NftFamily, table: String, set: String },
}

impl NftOp {
    /// `add rule <family> <table> <chain> <exprs> [comment "<comment>"]`.
    pub fn rule(
        family: NftFamily,
        table: &str,
        chain: &str,
        exprs: Vec<RuleExpr>,
        comment: Option<&str>,
    ) -> NftOp {
        NftOp::AddRule {
            family,
            table: table.into(),
            chain: chain.into(),
            exprs,
            comment: comment.map(str::to_string),
        }
    }
}
