//! CHECK: every chain and rule of the attachment is there (ours or upstream's: the same).

use crate::backend::{self, Chosen};
use crate::config::{Conf, Intent};
use crate::model::{desired, desired_isolation};
use cni_common::net::Family;
use cni_common::{CniError, Result};

pub fn check(conf: &Conf, intent: &Intent, b: Chosen) -> Result<()> {
    let missing = missing(conf, intent, b)?;
    if missing.is_empty() {
        return Ok(());
    }
    Err(CniError::internal(format!(
        "firewall ({}): {} of the attachment's rules missing: {}",
        b.name(),
        missing.len(),
        missing.join("; ")
    )))
}

/// What of the attachment's chains and rules backend `b` lacks (CHECK's judgment; resync's):
/// empty when everything is there. Err: the backend cannot be read.
pub fn missing(conf: &Conf, intent: &Intent, b: Chosen) -> Result<Vec<String>> {
    let mut missing = Vec::new();
    for fam in [Family::V4, Family::V6] {
        let (chains, rules) = desired(conf, intent, fam);
        let names = backend::Names { admin: &conf.admin_chain, zone: &conf.zone };
        missing.extend(backend::missing(b, fam, names, &intent.addrs, &chains, &rules)?);
        if b == Chosen::Firewalld {
            let (chains, rules) = desired_isolation(conf, intent, fam);
            let iso = backend::isolation_backend();
            missing.extend(backend::missing(iso, fam, names, &intent.addrs, &chains, &rules)?);
        }
    }
    Ok(missing)
}
