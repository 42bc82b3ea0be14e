//! ADD: record the attachment, then its chains and rules in each family it has addresses of.

use crate::backend::{self, Chosen};
use crate::config::{Conf, Intent};
use crate::model::desired;
use crate::record::{self, Record};
use cni_common::net::Family;
use cni_common::{AttachmentId, Result};
use std::path::Path;

pub fn add(root: &Path, me: &AttachmentId, conf: &Conf, intent: &Intent, b: Chosen) -> Result<()> {
    let rec = Record {
        container_id: me.container_id.clone(),
        ifname: me.ifname.clone(),
        backend: b.name().into(),
        addrs: intent.addrs.clone(),
    };
    record::write(root, me, &rec)?;
    for fam in [Family::V4, Family::V6] {
        let (chains, rules) = desired(conf, intent, fam);
        backend::add(b, fam, &conf.admin_chain, &chains, &rules)?;
    }
    Ok(())
}
