//! GC: saved-settings files of this network whose attachment is not in the valid list (their
//! container is gone with its link: nothing to restore). A valid attachment keeps both its
//! names (ours, and upstream's, which an earlier build of ours wrote). Files of other networks,
//! and files without a network (upstream's), are left alone: they cannot be told apart, and
//! unknown means alive.

use std::collections::HashSet;

use cni_common::attachment::AttachmentId;
use cni_common::error::Result;
use cni_common::Request;

use crate::store::{Files, Names, Store};

pub fn gc(req: &Request) -> Result<()> {
    let dir = crate::config::teardown_data_dir(req)?;
    let valid = AttachmentId::valid_list(req)?;
    run(&mut Files::new(&dir), req.network(), &valid).map(drop)
}

/// The files removed.
pub fn run(store: &mut dyn Store, network: &str, valid: &[AttachmentId]) -> Result<Vec<String>> {
    let keep: HashSet<String> = valid
        .iter()
        .map(|a| Names::new(&a.container_id, &a.ifname))
        .flat_map(|n| [n.ours, n.upstream])
        .collect();
    let mut removed = Vec::new();
    for (name, content) in store.list()? {
        let ours = content.is_some_and(|s| s.network == network);
        if ours && !keep.contains(&name) && store.remove(&name)? {
            removed.push(name);
        }
    }
    Ok(removed)
}
