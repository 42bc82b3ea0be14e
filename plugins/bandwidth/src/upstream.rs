//! bandwidth's ifb as upstream makes it (plugins/meta/bandwidth/main.go, `getIfbDeviceName`
//! and `CreateIfb`; [`AttachmentId::ifb_name`]): `bwp` + 12 hex digits of sha512(network +
//! container id), device group 0,
//! no alias, a root tbf, and a u32 filter on the host veth's ingress redirecting into it.
//!
//! Our own ifbs have the same name (so our DEL, which deletes by name, removes upstream's too)
//! plus an owner record (alias, device group). Upstream's record no network, so GC cannot tell
//! whose it is. Decision: GC removes an upstream-made ifb only when it is provably dead — no
//! filter on any host interface redirects into it (its host veth, and with it the redirect,
//! went with the container) — and it is not the ifb a valid attachment of this network would
//! have. A dead ifb shapes nothing, so removing it in whichever network's GC runs first takes
//! nothing from anybody. A live one is never touched, whatever network it belongs to.

use cni_common::attachment::AttachmentId;

use crate::identity::IfbIdentity;
use crate::kernel::Kernel;
use cni_common::error_list::ErrorList;
use cni_common::netlink::tc::{FilterAction, INGRESS_HANDLE};
use cni_common::netlink::Link;
use cni_common::{CniError, Result};
use std::collections::HashSet;

/// Whether `name` has the shape of an ifb name upstream derives (`bwp` + 12 hex digits).
pub fn is_ifb_name(name: &str) -> bool {
    name.len() == 15
        && name.starts_with("bwp")
        && name[3..].bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// An ifb upstream made: the name shape, kind ifb, no alias, device group 0.
pub fn is_upstream_ifb(l: &Link) -> bool {
    l.kind.as_deref() == Some("ifb") && is_ifb_name(&l.name) && l.alias.is_none() && l.group == 0
}

/// Interfaces that some ingress filter of `host` redirects packets into.
fn redirect_targets(host: &mut dyn Kernel) -> Result<HashSet<u32>> {
    let mut out = HashSet::new();
    for q in host.qdiscs(None)?.iter().filter(|q| q.is_ingress()) {
        for f in host.filters(q.ifindex, INGRESS_HANDLE)? {
            for a in &f.actions {
                if let FilterAction::Mirred { ifindex, .. } = a {
                    out.insert(*ifindex);
                }
            }
        }
    }
    Ok(out)
}

/// GC for bandwidth: delete upstream-made ifbs that nothing redirects into any more (see the
/// module documentation), except the one a valid attachment of `network` would use. Returns
/// the names deleted.
pub fn gc(host: &mut dyn Kernel, network: &str, valid: &[AttachmentId]) -> Result<Vec<String>> {
    let keep: HashSet<String> =
        valid.iter().map(|a| AttachmentId::new(network, &a.container_id, &a.ifname).ifb_name()).collect();
    let candidates: Vec<Link> =
        host.links()?.into_iter().filter(|l| is_upstream_ifb(l) && !keep.contains(&l.name)).collect();
    if candidates.is_empty() {
        return Ok(Vec::new());
    }
    let used = redirect_targets(host)?;
    let mut deleted = Vec::new();
    let mut errors = ErrorList::new();
    for l in candidates.into_iter().filter(|l| !used.contains(&l.index)) {
        match host.link_del(l.index) {
            Ok(()) => {
                cni_common::log!(
                    "",
                    "GC: deleted {}, an ifb made by upstream's bandwidth that shapes nothing any more",
                    l.name
                );
                deleted.push(l.name);
            }
            Err(e) if e.is_not_found() => {}
            Err(e) => {
                errors.push(CniError::from(e).context(format_args!("GC: delete upstream's ifb {}", l.name)))
            }
        }
    }
    errors.finish().map(|()| deleted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ifb_names_match_upstream() {
        // upstream 1.1.1's ifb of network "swnet", container "ctrA" (captured with `ip link`)
        assert_eq!(AttachmentId::new("swnet", "ctrA", "eth0").ifb_name(), "bwp6c848780a988");
        assert!(is_ifb_name("bwp6c848780a988"));
        assert!(!is_ifb_name("bwp6c848780a98g"));
        assert!(!is_ifb_name("bwp6c848780a98"));
        assert!(!is_ifb_name("xyz6c848780a988"));
    }
}
