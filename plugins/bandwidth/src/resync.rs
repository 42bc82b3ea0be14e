//! Rebuilding an attachment's shaping where it is missing: what `cni-migrate resync` asks of
//! the bandwidth plugin. tc state survives a firewall reload, but not everything that can
//! happen to a node (an ifb deleted by hand or by a tool that sweeps unknown devices leaves the
//! redirect pointing nowhere, and traffic out of the pod is dropped).
//!
//! The request is the attachment's own (its cached configuration, CNI_NETNS and ifname, its
//! cached result as prevResult). What is missing is judged by CHECK's own comparison
//! ([`shape::check`]); the rebuild is ADD's ([`shape::add`]): the attachment's leftovers (its
//! ifb, the qdiscs on its host veth) are replaced, anything of someone else's refuses.

use cni_common::attachment::AttachmentId;

use crate::identity::IfbIdentity;
use cni_common::{CniError, Request, Result};

use crate::{config, shape, shaped_veth};

/// What of `req`'s shaping (both token buckets, the ifb, the redirect) is missing, rebuilt
/// unless `dry_run`: `None` when nothing is (or the configuration sets no limit), else what
/// was (or, dry, would be) rebuilt. After a rebuild CHECK's comparison runs again: a failure
/// then is an error.
pub fn shaping(req: &Request, dry_run: bool) -> Result<Option<String>> {
    let limits = config::limits(&req.config)?;
    if limits.is_empty() {
        return Ok(None);
    }
    let prev =
        req.prev_result()?.ok_or_else(|| CniError::config("no result to rebuild from (prevResult)"))?;
    let (mut host, veth, plan) = shaped_veth(req, &prev, &limits)?;
    let att = AttachmentId::of(req);
    let ifb = att.ifb_name();
    let Err(missing) = shape::check(&mut host, &veth, &plan, &ifb, &att) else { return Ok(None) };
    if !dry_run {
        shape::add(&mut host, &veth, &plan, &ifb, &att)?;
        shape::check(&mut host, &veth, &plan, &ifb, &att)
            .map_err(|e| CniError::internal(format!("still missing after rebuilding it: {}", e.msg)))?;
    }
    Ok(Some(missing.msg))
}
