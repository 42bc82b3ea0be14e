//! The seam between what portmap decides about upstream's host ports (`crate::upstream`: which
//! chains and rules an attachment has, what is missing, what is dead) and the node that holds
//! them: the iptables `nat` tables of both backends and both families, and upstream's v1.6+
//! nftables backend (`ip`/`ip6 cni_hostport`). [`System`] is the node, over cni-common's
//! plugin-agnostic tool layer (`cni_common::upstream`) and nf_tables; `fake::Fake` (tests and
//! the `fake` feature) holds the same tables in memory, with faults.
//!
//! Each operation is one read or one all-or-nothing change, so a failure (or a lost answer)
//! between two of them never leaves a table half-changed.

use super::names;
use cni_common::netlink::nft::{NfTables, NftDelete, NftRule};
use cni_common::upstream::iptables::{self, Backend, Fam, Script, Table};
use cni_common::upstream::{self as common, nft_family, Teardown};
use cni_common::{CniError, Result};

pub trait Upstream {
    /// The (backend, family) pairs whose `nat` table has at least one of `chains` (exact names:
    /// point reads, no dump).
    fn locate(&mut self, chains: &[String]) -> Result<Vec<(Backend, Fam)>>;
    /// Every (backend, family) whose `nat` table has a chain `wanted` selects (GC).
    fn locate_any(&mut self, wanted: &dyn Fn(&str) -> bool) -> Result<Vec<(Backend, Fam)>>;
    /// The `nat` table of `backend`/`fam` as `*-save -t nat` prints it.
    fn save(&mut self, backend: Backend, fam: Fam) -> Result<Table>;
    /// Apply `script` to the legacy `nat` table of `fam` (`*-restore --noflush`: all or nothing).
    fn restore_legacy(&mut self, fam: Fam, script: &Script) -> Result<()>;
    /// Take `t`'s jumps and chains out of the iptables-nft `nat` table of `fam` (netlink, one
    /// transaction). Whether something was deleted.
    fn teardown_nft(&mut self, fam: Fam, t: &Teardown) -> Result<bool>;
    /// How many rules chain `chain` of the iptables-nft `nat` table of `fam` holds (None: no
    /// such chain).
    fn nft_chain_len(&mut self, fam: Fam, chain: &str) -> Result<Option<usize>>;
    /// The rules of table `cni_hostport` of `fam` in the chains upstream's per-container rules
    /// live in (`names::NFT_HOSTPORT_RULE_CHAINS`); None: no such table.
    fn hostport_rules(&mut self, fam: Fam) -> Result<Option<Vec<NftRule>>>;
    /// Delete rules (or a table) of `cni_hostport` as one transaction.
    fn hostport_delete(&mut self, ops: &[NftDelete]) -> Result<()>;
    /// Forget conntrack's UDP flows to these host ports (`who`: whose, for the messages).
    fn flush_udp(&mut self, who: &str, ports: &[u16], fams: &[Fam]);
}

/// The node: nf_tables over netlink (opened on first use; not usable: nothing can live there),
/// the `iptables` tools and `/proc` for the legacy backend.
#[derive(Default)]
pub struct System {
    nf: Option<Option<NfTables>>,
}

impl System {
    pub fn new() -> System {
        System::default()
    }

    fn nf(&mut self) -> Option<&mut NfTables> {
        self.nf.get_or_insert_with(common::nftables).as_mut()
    }

    /// Whether nf_tables can be talked to here.
    pub fn nf_tables_usable(&mut self) -> bool {
        self.nf().is_some()
    }
}

impl Upstream for System {
    fn locate(&mut self, chains: &[String]) -> Result<Vec<(Backend, Fam)>> {
        common::locate(self.nf(), chains)
    }

    fn locate_any(&mut self, wanted: &dyn Fn(&str) -> bool) -> Result<Vec<(Backend, Fam)>> {
        common::locate_any(wanted)
    }

    fn save(&mut self, backend: Backend, fam: Fam) -> Result<Table> {
        iptables::save(backend, fam)
    }

    fn restore_legacy(&mut self, fam: Fam, script: &Script) -> Result<()> {
        iptables::restore(Backend::Legacy, fam, script)
    }

    fn teardown_nft(&mut self, fam: Fam, t: &Teardown) -> Result<bool> {
        match self.nf() {
            Some(nf) => t.apply_nft(nf, fam),
            None => Ok(false),
        }
    }

    fn nft_chain_len(&mut self, fam: Fam, chain: &str) -> Result<Option<usize>> {
        let Some(nf) = self.nf() else { return Ok(None) };
        let family = nft_family(fam);
        if !nf.has_chain(family, common::NAT, chain)? {
            return Ok(None);
        }
        Ok(Some(nf.rules(family, common::NAT, Some(chain))?.len()))
    }

    fn hostport_rules(&mut self, fam: Fam) -> Result<Option<Vec<NftRule>>> {
        let Some(nf) = self.nf() else { return Ok(None) };
        let family = nft_family(fam);
        if !nf.has_table(family, names::NFT_HOSTPORT_TABLE)? {
            return Ok(None);
        }
        let mut out = Vec::new();
        for chain in names::NFT_HOSTPORT_RULE_CHAINS {
            out.extend(nf.rules(family, names::NFT_HOSTPORT_TABLE, Some(chain))?);
        }
        Ok(Some(out))
    }

    fn hostport_delete(&mut self, ops: &[NftDelete]) -> Result<()> {
        match self.nf() {
            Some(nf) => common::delete(nf, ops).map_err(CniError::from),
            None => Ok(()),
        }
    }

    fn flush_udp(&mut self, who: &str, ports: &[u16], fams: &[Fam]) {
        common::flush_udp(who, ports, fams);
    }
}
