//! The nftables backend's flows: read, plan, apply under the generation read, again when
//! another transaction came in between (a bounded number of times, then code 11).

use crate::kernel::Kernel;
use crate::model::{self, Rule};
use crate::plan;
use cni_common::net::Family;
use cni_common::netlink::nft::NftOp;
use cni_common::{code, CniError, Result};
use std::net::IpAddr;

pub const ATTEMPTS: usize = 10;

/// Every chain a verb reads: FORWARD, CNI-FORWARD, the admin chain, the isolation chains.
fn chains_read(admin: &str) -> Vec<String> {
    vec![
        model::FORWARD.into(),
        model::PRIV_CHAIN.into(),
        admin.into(),
        model::STAGE1.into(),
        model::STAGE2.into(),
    ]
}

fn run<K: Kernel>(
    k: &mut K,
    fam: Family,
    admin: &str,
    verb: &str,
    plan: impl Fn(&crate::kernel::Tables) -> Vec<(NftOp, bool)>,
) -> Result<()> {
    for _ in 0..ATTEMPTS {
        let t = k.read(fam, &chains_read(admin)).map_err(CniError::from)?;
        let ops = plan(&t);
        if ops.is_empty() {
            return Ok(());
        }
        match k.apply(&ops, Some(t.generation)) {
            Ok(()) => return Ok(()),
            Err(e) if e.errno == libc::ERESTART => continue,
            Err(e) => return Err(CniError::from(e)),
        }
    }
    Err(CniError::new(
        code::TRY_AGAIN,
        format!(
            "firewall {verb}: the {} filter table changed under every one of {ATTEMPTS} attempts",
            fam.name()
        ),
    ))
}

/// ADD of one family's chains and rules.
pub fn add<K: Kernel>(k: &mut K, fam: Family, admin: &str, chains: &[String], rules: &[Rule]) -> Result<()> {
    run(k, fam, admin, "ADD", |t| plan::add(t, fam, chains, rules))
}

/// DEL of the address rules of `addrs` in `fam`.
pub fn del<K: Kernel>(k: &mut K, fam: Family, admin: &str, addrs: &[IpAddr]) -> Result<()> {
    if !addrs.iter().any(|a| Family::of(a) == fam) {
        return Ok(());
    }
    run(k, fam, admin, "DEL", |t| plan::del(t, fam, addrs))
}

/// CHECK: what is missing, empty when everything is there.
pub fn missing<K: Kernel>(
    k: &mut K,
    fam: Family,
    admin: &str,
    chains: &[String],
    rules: &[Rule],
) -> Result<Vec<String>> {
    if rules.is_empty() {
        return Ok(Vec::new());
    }
    let t = k.read(fam, &chains_read(admin)).map_err(CniError::from)?;
    Ok(plan::missing(&t, chains, rules))
}
