//! ADD: sysctls, then the link settings (saved first), in the container's namespace; the
//! result is prevResult with the interface's MAC as it now is. A failure puts back what this
//! ADD changed (sysctls included, which upstream never restores) and removes the file it saved,
//! so a failed ADD leaves the container as it found it.

use cni_common::error::{CniError, Result};
use cni_common::mac::Mac;
use cni_common::spec::result::CniResult;
use cni_common::Request;

use crate::config::Conf;
use crate::kernel::{Kernel, Real};
use crate::saved::{self, Restore, Saved};
use crate::store::{Entry, Files, Names, Store};

pub fn add(req: &Request) -> Result<CniResult> {
    let conf = Conf::from_request(req)?;
    let prev = req.prev_result()?.ok_or_else(|| CniError::config("Required prevResult missing"))?;
    let ns = req.require_netns()?;
    let mut k = Real::new(&ns)?;
    let mut store = Files::new(&conf.data_dir);
    let names = Names::new(&req.env.container_id, &req.env.ifname);
    run(&mut k, &mut store, &conf, &req.env.ifname, &names.ours, req.network(), prev)
}

/// What this ADD changed so far.
#[derive(Default)]
struct Undo {
    sysctls: Vec<(String, String)>,
    link: Option<(u32, Vec<Restore>)>,
    saved: bool,
}

impl Undo {
    fn run(self, k: &mut dyn Kernel, store: &mut dyn Store, file: &str) {
        if let Some((index, back)) = self.link {
            for r in back.into_iter().rev() {
                if let Err(e) = k.set(index, r) {
                    cni_common::log!("tuning", "undo {r:?}: {e}");
                }
            }
        }
        for (path, old) in self.sysctls.into_iter().rev() {
            if let Err(e) = k.sysctl_set(&path, &old) {
                cni_common::log!("tuning", "undo sysctl {path}: {}", e.msg);
            }
        }
        if self.saved {
            if let Err(e) = store.remove(file) {
                cni_common::log!("tuning", "remove {file}: {}", e.msg);
            }
        }
    }
}

/// ADD against a kernel and a store: `file` is the attachment's saved-settings file name.
pub fn run(
    k: &mut dyn Kernel,
    store: &mut dyn Store,
    conf: &Conf,
    ifname: &str,
    file: &str,
    network: &str,
    mut prev: CniResult,
) -> Result<CniResult> {
    // Read everything first: a missing link or sysctl fails before anything changes.
    let link = if conf.link.any() {
        Some(
            k.link(ifname)?
                .ok_or_else(|| CniError::internal(format!("failed to get {ifname:?}: no such link")))?,
        )
    } else {
        None
    };
    let mut old = Vec::new();
    for s in &conf.sysctls {
        old.push(k.sysctl_get(&s.path)?);
    }
    // An earlier ADD's file of this link; anything else at the name (not ours, another
    // link's) is replaced by the rename of the new one.
    let earlier = match &link {
        Some(l) => match store.load(file)? {
            Entry::Saved(s) if s.other_link(l).is_none() => Some(s),
            _ => None,
        },
        None => None,
    };
    let mut undo = Undo::default();
    let outcome = (|| -> Result<()> {
        for (s, was) in conf.sysctls.iter().zip(old) {
            k.sysctl_set(&s.path, &s.value)?;
            undo.sysctls.push((s.path.clone(), was));
        }
        if let Some(l) = &link {
            let had_file = earlier.is_some();
            let backup: Saved = saved::backup(l, &conf.link, network, earlier.clone());
            store.save(file, &backup)?;
            undo.saved = !had_file;
            let current = saved::backup(l, &conf.link, network, None);
            undo.link = Some((l.index, Vec::new()));
            for change in saved::apply_plan(&conf.link) {
                k.set(l.index, change).map_err(|e| {
                    CniError::from(e).context(format_args!("failed to set {change:?} on {ifname}"))
                })?;
                if let Some((_, back)) = &mut undo.link {
                    back.extend(saved::restore_plan(&current)?.into_iter().filter(|r| same_kind(r, &change)));
                }
            }
        }
        Ok(())
    })();
    if let Err(e) = outcome {
        undo.run(k, store, file);
        return Err(e);
    }
    if let Some(m) = conf.link.mac {
        for i in prev.interfaces.iter_mut().filter(|i| i.name == ifname) {
            i.mac = Mac::text(Some(m.0));
        }
    }
    Ok(prev)
}

fn same_kind(a: &Restore, b: &Restore) -> bool {
    std::mem::discriminant(a) == std::mem::discriminant(b)
}
