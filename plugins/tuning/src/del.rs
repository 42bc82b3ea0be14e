//! DEL: put back the link settings ADD saved (ours, or upstream's file), then remove the file.
//! Idempotent, and best effort toward the link (issue 37.4): DEL runs while the sandbox is torn
//! down, and a chain's DEL stops at its first failure, so a DEL that failed for ever would keep
//! bridge's and host-local's DEL from ever running (the address and the host veth leaked, the
//! sandbox never torn down), for a link whose settings no longer matter. So:
//! - no file, an empty or vanished CNI_NETNS, or a link that is gone: nothing to restore, the
//!   file is removed (upstream leaves it behind);
//! - something at the name that is not a saved file (a FIFO, a symbolic link, a file that does
//!   not decode) is not ours: removed (a directory only when empty), never opened or followed;
//! - another link under the ifname than the one ADD tuned (the identity ours records), or a
//!   value no link takes: not restored;
//! - a setting the kernel refuses: the others are still put back.
//!
//! Each of these is said once on stderr and the file is removed: the DEL succeeds, and a retry
//! finds nothing to fail on. Upstream's DEL returns the error and keeps the file, so it fails
//! again on every retry. Only a directory or kernel that cannot be read or written at all still
//! fails a DEL. Sysctls are not restored, as upstream (their namespace goes with the container).

use cni_common::error::Result;
use cni_common::Request;

use crate::kernel::{Kernel, Real};
use crate::saved::{self, Decision, Saved};
use crate::store::{Entry, Files, Names, Store};

pub fn del(req: &Request) -> Result<()> {
    let dir = crate::config::teardown_data_dir(req)?;
    let mut store = Files::new(&dir);
    let names = Names::new(&req.env.container_id, &req.env.ifname);
    let ns = if req.netns().is_some() { req.container_netns()? } else { None };
    let notes = match ns {
        Some(ns) => run(Some(&mut Real::new(&ns)?), &mut store, &req.env.ifname, &names)?,
        None => run(None, &mut store, &req.env.ifname, &names)?,
    };
    for n in notes {
        cni_common::log!("tuning", "{n}");
    }
    Ok(())
}

/// The attachment's saved file: ours, else upstream's name. Whatever else is at those names
/// is removed on the way (if it can be: a directory that is not empty cannot), with a note;
/// it is never a reason for DEL to fail.
fn find(store: &mut dyn Store, names: &Names, notes: &mut Vec<String>) -> Result<Option<(String, Saved)>> {
    for name in names.lookup() {
        match store.load(name)? {
            Entry::Missing => {}
            Entry::NotOurs(what) => {
                let outcome = match store.remove(name) {
                    Ok(_) => "removed".to_string(),
                    Err(e) => e.msg,
                };
                notes.push(format!("{name} is {what}, not settings a tuning saved: {outcome}"));
            }
            Entry::Saved(s) => return Ok(Some((name.to_string(), s))),
        }
    }
    Ok(None)
}

/// DEL against a kernel (None: the namespace is gone) and a store. Ok with what is to be said
/// once on stderr: what was not ours at the names, what was not restored and why.
pub fn run(
    k: Option<&mut dyn Kernel>,
    store: &mut dyn Store,
    ifname: &str,
    names: &Names,
) -> Result<Vec<String>> {
    let mut notes = Vec::new();
    if let Some((name, saved)) = find(store, names, &mut notes)? {
        let link = match k {
            Some(k) => k.link(ifname)?.map(|l| (k, l)),
            None => None,
        };
        if let Some((k, link)) = link {
            match saved::decide(&saved, &link) {
                Decision::Leave(why) => notes.push(format!("{ifname}: {name} not restored: {why}")),
                Decision::Restore(plan) => {
                    let failed: Vec<String> = plan
                        .into_iter()
                        .filter_map(|r| k.set(link.index, r).err().map(|e| format!("{r:?}: {e}")))
                        .collect();
                    if !failed.is_empty() {
                        notes
                            .push(format!("{ifname}: could not restore {} (from {name})", failed.join("; ")));
                    }
                }
            }
        }
        store.remove(&name)?;
    }
    // a temporary file of ours a killed ADD left (the file itself is gone by now, or was not
    // ours and has its note)
    let _ = store.remove(&names.ours);
    Ok(notes)
}
