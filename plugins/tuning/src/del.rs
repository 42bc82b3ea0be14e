//! DEL: put back the link settings ADD saved (upstream's file, or ours), then remove the file.
//! Best effort and idempotent: no file, an empty or vanished CNI_NETNS, or a link that is gone
//! (nothing left to restore: the file is removed — upstream leaves it behind) all succeed.
//! Sysctls are not restored, as upstream (their namespace goes with the container).

use cni_common::error::{CniError, Result};
use cni_common::error_list::ErrorList;
use cni_common::Request;

use crate::kernel::{Files, Kernel, Real, Store};
use crate::saved;

pub fn del(req: &Request) -> Result<()> {
    let dir = crate::config::teardown_data_dir(req)?;
    let mut store = Files::new(&dir);
    let file = saved::file_name(&req.env.container_id, &req.env.ifname);
    let ns = if req.netns().is_some() { req.container_netns()? } else { None };
    match ns {
        Some(ns) => run(Some(&mut Real::new(&ns)?), &mut store, &req.env.ifname, &file),
        None => run(None, &mut store, &req.env.ifname, &file),
    }
}

/// DEL against a kernel (None: the namespace is gone) and a store.
pub fn run(k: Option<&mut dyn Kernel>, store: &mut dyn Store, ifname: &str, file: &str) -> Result<()> {
    let Some(saved) = store.load(file)? else {
        // nothing saved; a file that does not decode is not ours to interpret: removed
        store.remove(file)?;
        return Ok(());
    };
    let link = match k {
        Some(k) => k.link(ifname)?.map(|l| (k, l)),
        None => None,
    };
    let Some((k, link)) = link else {
        store.remove(file)?;
        return Ok(());
    };
    let mut errors = ErrorList::new();
    for r in saved::restore_plan(&saved)? {
        if let Err(e) = k.set(link.index, r) {
            errors.push(CniError::from(e).context(format_args!("failed to restore {r:?} on {ifname}")));
        }
    }
    if errors.is_empty() {
        store.remove(file)?;
    }
    errors.finish()
}
