//! Rebuilding an attachment's shaping where it is missing: what `cni-migrate resync` asks of
//! the bandwidth plugin. tc state survives a firewall reload, but not everything that can
//! happen to a node (an ifb deleted by hand or by a tool that sweeps unknown devices leaves the
//! redirect pointing nowhere, and traffic out of the pod is dropped).
//!
//! The request is the attachment's own (its cached configuration, CNI_NETNS and ifname, its
//! cached result as prevResult). What is missing is judged by CHECK's own comparison
//! ([`shape::check`](crate::shape::check)); the rebuild is ADD's
//! ([`shape::add`](crate::shape::add)): the attachment's leftovers (its ifb, the qdiscs on its
//! host veth) are replaced, anything of someone else's refuses ([`flow::resync`]).

use cni_common::attachment::AttachmentId;
use cni_common::{CniError, Request, Result};

use crate::kernel::Real;
use crate::{config, flow};

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
    let ns = req.require_netns()?;
    let mut k = Real::with_container(&ns)?;
    flow::resync(&mut k, &AttachmentId::of(req), &limits, &prev, dry_run)
}
