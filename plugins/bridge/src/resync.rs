//! Rebuilding an attachment's firewall state after the ruleset was flushed (`systemctl reload
//! nftables`, `nft flush ruleset`): what `cni-migrate resync` asks of the bridge plugin.
//!
//! `cni-migrate resync` judges and rebuilds bridge's part itself from the cached result (the
//! MAC the runtime gave the pod, never the interface's current one: tools/migrate/src/resync.rs,
//! `bridge_part`, with [`crate::firewall`]'s `find`, `masq_missing`, `spoof_missing` and
//! `apply_add`, the functions CHECK and ADD use). What stays here is the undo of a rebuild
//! whose attachment's DEL began meanwhile.

use cni_common::{Request, Result};

/// Remove what `cni-migrate resync` rebuilt for an attachment whose runtime deleted it meanwhile (its
/// DEL may have run before the rebuild): the firewall part of bridge's DEL.
pub fn undo(req: &Request) -> Result<()> {
    crate::firewall::remove::remove(req, true, true).map(drop)
}
