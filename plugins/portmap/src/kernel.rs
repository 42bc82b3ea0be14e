//! The kernel seam: reading the table ([`Kernel::read`]) and applying one transaction
//! ([`Kernel::apply`]). [`Netlink`] talks to nf_tables; [`fake::Fake`] (tests, and the
//! `fake` feature) keeps a table in memory with the kernel's semantics, faults and
//! interleavings included, so the flows and the planner are tested without a kernel.

use crate::state::{dumped, Scope, State};
use cni_common::netlink::nft::{NfTables, NftOp};
use cni_common::netlink::NlError;
use cni_common::nft_cli::Nft;
use cni_common::Result;

pub trait Kernel {
    /// One consistent reading of what `scope` asks for.
    fn read(&mut self, scope: &Scope) -> std::result::Result<State, NlError>;
    /// Apply `ops` as one transaction; with `generation`, only if the ruleset is still at it
    /// (`ERESTART` otherwise).
    fn apply(&mut self, ops: &[NftOp], generation: Option<u32>) -> std::result::Result<(), NlError>;
    /// Process `ops` without committing (STATUS).
    fn validate(&mut self, ops: &[NftOp]) -> std::result::Result<(), NlError>;
    /// A read that shows nf_tables answers here (the ruleset generation: no lock, no
    /// transaction), for STATUS when its dry run is certified.
    fn answers(&mut self) -> std::result::Result<(), NlError>;
    /// Run an `nft -f` script (a gate chain with user conditions), or check it (`check`).
    fn nft(&mut self, script: &str, check: bool) -> Result<()>;
}

/// nf_tables over netlink, in the calling thread's network namespace.
pub struct Netlink {
    nf: NfTables,
}

impl Netlink {
    pub fn new() -> std::result::Result<Netlink, NlError> {
        Ok(Netlink { nf: NfTables::new()? })
    }

    /// After an answer was lost (`ENOBUFS`, a receive deadline), the socket may still hold
    /// late answers: talk on a fresh one.
    fn after(&mut self, e: NlError) -> NlError {
        if matches!(e.errno, libc::ENOBUFS | libc::ETIMEDOUT) {
            if let Ok(nf) = NfTables::new() {
                self.nf = nf;
            }
        }
        e
    }
}

impl Kernel for Netlink {
    fn read(&mut self, scope: &Scope) -> std::result::Result<State, NlError> {
        let (keys, chains) = (scope.keys(), scope.chains());
        let snap = self.nf.snapshot(&scope.request(&keys, &chains, &dumped)).map_err(|e| self.after(e))?;
        Ok(State::decode(scope, &snap))
    }

    fn apply(&mut self, ops: &[NftOp], generation: Option<u32>) -> std::result::Result<(), NlError> {
        self.nf.apply_guarded(ops, generation).map_err(|e| self.after(e))
    }

    fn validate(&mut self, ops: &[NftOp]) -> std::result::Result<(), NlError> {
        self.nf.validate(ops).map_err(|e| self.after(e))
    }

    fn answers(&mut self) -> std::result::Result<(), NlError> {
        self.nf.generation().map(drop).map_err(|e| self.after(e))
    }

    fn nft(&mut self, script: &str, check: bool) -> Result<()> {
        let nft = Nft::find()?;
        if check {
            nft.check(script)
        } else {
            nft.apply(script)
        }
    }
}

#[cfg(any(test, feature = "fake"))]
pub mod fake;
