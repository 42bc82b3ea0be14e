//! DEL: the address rules of the prevResult's and the record's addresses, in the backend in
//! use and the one the record names, then the record. Best effort, idempotent.

use crate::backend::{self, Chosen};
use crate::record;
use cni_common::net::Family;
use cni_common::{AttachmentId, ErrorList, Result};
use std::net::IpAddr;
use std::path::Path;

pub fn del(
    root: &Path,
    me: &AttachmentId,
    names: backend::Names,
    prev_addrs: &[IpAddr],
    now: Option<Chosen>,
) -> Result<()> {
    let rec = record::read(root, me);
    let mut addrs: Vec<IpAddr> = prev_addrs.to_vec();
    let mut backends: Vec<(Chosen, &str)> = now.into_iter().map(|b| (b, names.zone)).collect();
    if let Some(r) = &rec {
        addrs.extend(r.addrs.iter().copied().filter(|a| !prev_addrs.contains(a)));
        if let Some(b) = Chosen::from_name(&r.backend) {
            if !backends.contains(&(b, r.zone.as_str())) {
                backends.push((b, r.zone.as_str()));
            }
        }
    }
    let mut errors = ErrorList::new();
    for (b, zone) in backends {
        for fam in [Family::V4, Family::V6] {
            errors.take(backend::del(b, fam, backend::Names { admin: names.admin, zone }, &addrs));
        }
    }
    errors.take(record::remove(root, me));
    errors.finish()
}
