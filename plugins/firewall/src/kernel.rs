//! The kernel seam of the nftables backend: one consistent reading of a family's `filter`
//! table ([`Kernel::read`]) and one guarded transaction ([`Kernel::apply`]). [`Netlink`] talks
//! to nf_tables; [`fake::Fake`] keeps the table in memory with the kernel's answers (ENOENT,
//! EEXIST, a stale generation) so the flows are tested without root.

use cni_common::net::Family;
use cni_common::netlink::nft::{NfTables, NftChain, NftFamily, NftOp, NftRule};
use cni_common::netlink::NlError;

pub const TABLE: &str = "filter";

/// The nf_tables family iptables-nft uses for `family`.
pub fn nft_family(family: Family) -> NftFamily {
    match family {
        Family::V4 => NftFamily::Ip,
        Family::V6 => NftFamily::Ip6,
    }
}

/// What one reading saw of a family's `filter` table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tables {
    pub generation: u32,
    /// The chains of the table (empty: no table).
    pub chains: Vec<NftChain>,
    /// The rules of the chains asked for, each chain whole.
    pub rules: Vec<NftRule>,
}

impl Tables {
    pub fn has_chain(&self, name: &str) -> bool {
        self.chains.iter().any(|c| c.name == name)
    }

    pub fn rules_in<'a>(&'a self, chain: &'a str) -> impl Iterator<Item = &'a NftRule> + 'a {
        self.rules.iter().filter(move |r| r.chain == chain)
    }
}

pub trait Kernel {
    /// The chains of `family`'s `filter` table and the rules of `chains`, at one generation.
    fn read(&mut self, family: Family, chains: &[String]) -> Result<Tables, NlError>;
    /// One transaction, committed only if the ruleset is still at `generation` (ERESTART
    /// otherwise); rules marked `true` go to the top of their chain.
    fn apply(&mut self, ops: &[(NftOp, bool)], generation: Option<u32>) -> Result<(), NlError>;
    /// Process `ops` without committing (STATUS).
    fn validate(&mut self, ops: &[NftOp]) -> Result<(), NlError>;
}

/// nf_tables over netlink, in the calling thread's network namespace.
pub struct Netlink {
    nf: NfTables,
}

impl Netlink {
    pub fn new() -> Result<Netlink, NlError> {
        Ok(Netlink { nf: NfTables::new()? })
    }
}

/// Readings torn by other transactions are retried this often.
const READ_ATTEMPTS: usize = 8;

impl Kernel for Netlink {
    fn read(&mut self, family: Family, chains: &[String]) -> Result<Tables, NlError> {
        let fam = nft_family(family);
        for _ in 0..READ_ATTEMPTS {
            let generation = self.nf.generation()?;
            let info = self.nf.chain_info(fam, TABLE)?;
            let mut rules = Vec::new();
            for c in chains.iter().filter(|c| info.iter().any(|i| &i.name == *c)) {
                rules.extend(self.nf.rules(fam, TABLE, Some(c))?);
            }
            if self.nf.generation()? == generation {
                return Ok(Tables { generation, chains: info, rules });
            }
        }
        Err(NlError::new(format!("read {} filter", fam.keyword()), libc::EINTR))
    }

    fn apply(&mut self, ops: &[(NftOp, bool)], generation: Option<u32>) -> Result<(), NlError> {
        self.nf.apply_inserting(ops, generation)
    }

    fn validate(&mut self, ops: &[NftOp]) -> Result<(), NlError> {
        self.nf.validate(ops)
    }
}

#[cfg(test)]
pub mod fake;
