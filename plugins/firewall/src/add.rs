//! ADD: record the attachment, then its chains and rules in each family it has addresses of.

use crate::backend::{self, Chosen};
use crate::config::{Conf, Intent};
use crate::model::{desired, desired_isolation};
use crate::record::{self, Record};
use cni_common::net::Family;
use cni_common::{AttachmentId, Result};
use std::path::Path;

pub fn add(root: &Path, me: &AttachmentId, conf: &Conf, intent: &Intent, b: Chosen) -> Result<()> {
    let rec = Record {
        container_id: me.container_id.clone(),
        ifname: me.ifname.clone(),
        backend: b.name().into(),
        zone: conf.zone.clone(),
        addrs: intent.addrs.clone(),
    };
    record::write(root, me, &rec)?;
    apply(conf, intent, b)
}

/// The attachment's chains and rules in backend `b` (ADD after its record is written; resync's
/// rebuild, whose record is there): whatever of them is there already is left as it is.
pub fn apply(conf: &Conf, intent: &Intent, b: Chosen) -> Result<()> {
    for fam in [Family::V4, Family::V6] {
        let (chains, rules) = desired(conf, intent, fam);
        let names = backend::Names { admin: &conf.admin_chain, zone: &conf.zone };
        backend::add(b, fam, names, &intent.addrs, &chains, &rules)?;
        if b == Chosen::Firewalld {
            let (chains, rules) = desired_isolation(conf, intent, fam);
            backend::add(backend::isolation_backend(), fam, names, &intent.addrs, &chains, &rules)?;
        }
    }
    Ok(())
}
