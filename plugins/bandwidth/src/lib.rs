//! `bandwidth`: limit a veth-attached container's traffic with token bucket filters.
//!
//! Chained after a plugin that creates a veth pair (bridge, ptp). Traffic into the container is
//! shaped by a tbf at the root of the host veth; traffic out of the container arrives on the
//! host veth's *ingress*, where tc cannot shape, so a u32 filter redirects it to an ifb whose
//! root tbf shapes it. Everything goes through rtnetlink (see `cni_common::netlink::tc`).
//!
//! Beyond upstream: DEL also removes the qdiscs on the host veth when the container's netns is
//! still there, GC removes ifbs of this network's vanished attachments (ownership is recorded in
//! the ifb's alias), CHECK compares the real rate, burst and limit of both buckets and the
//! filter, and STATUS checks that the packet scheduler clock is readable.
//!
//! One flow for every verb, as the other plugins:
//!
//! ```text
//!  request ──► config ──► desired (pure) ──► plan (pure) ──► steps through Kernel
//!                                             ▲
//!  kernel ──► Kernel reads (links, qdiscs, filters) ┘
//! ```
//!
//! - [`config`]: the limits; [`identity`]: the ifb's name, alias and device group.
//! - [`desired`]: the two buckets, the ifb and the redirect the attachment should have (pure).
//! - [`plan`]: whose an ifb is, what blocks ADD, ADD's steps, CHECK's comparisons, GC's
//!   choice (pure).
//! - [`kernel`]: the seam ([`kernel::Kernel`]): rtnetlink and the clock, and a fake for tests.
//! - [`shape`]: reads and applies through the seam (ADD and its undo, DEL's clearing, CHECK).
//! - [`flow`]: each verb; [`upstream`]: upstream's ifbs; [`resync`]: `cni-migrate resync`.

#![warn(clippy::too_many_lines)]

pub mod config;
pub mod desired;
pub mod flow;
pub mod identity;
pub mod kernel;
pub mod plan;
pub mod resync;
pub mod shape;
pub mod upstream;

#[cfg(test)]
mod tests;

use cni_common::attachment::AttachmentId;
use cni_common::netlink::tc::Psched;
use cni_common::spec::result::CniResult;
use cni_common::{CniError, Plugin, Request, Result, Version};
use kernel::Real;

pub struct Bandwidth;

/// Upstream supports 0.3.0 and later (results need `interfaces`).
const VERSIONS: [Version; 5] =
    [Version::V0_3_0, Version::V0_3_1, Version::V0_4_0, Version::V1_0_0, Version::V1_1_0];

impl Plugin for Bandwidth {
    fn name(&self) -> &'static str {
        "bandwidth"
    }

    fn supported_versions(&self) -> &'static [Version] {
        &VERSIONS
    }

    fn add(&self, req: &Request) -> Result<CniResult> {
        let limits = config::limits(&req.config)?;
        let prev = req.prev_result()?;
        if limits.is_empty() {
            return Ok(prev.unwrap_or_default());
        }
        let result = prev.ok_or_else(|| {
            CniError::config(
                "bandwidth must be called as a chained plugin: the configuration has no prevResult",
            )
        })?;
        let ns = req.require_netns()?;
        flow::add(&mut Real::with_container(&ns)?, &AttachmentId::of(req), &limits, result)
    }

    /// Remove the ifb (by name, so also upstream's) and, while the container's netns still
    /// exists, the qdiscs on the host veth. The configuration's limits are not needed (and not
    /// validated): cleanup must not depend on them. Every step is tried; errors are collected.
    fn del(&self, req: &Request) -> Result<()> {
        flow::del(&mut Real::lazy(req)?, &AttachmentId::of(req))
    }

    fn check(&self, req: &Request) -> Result<()> {
        let limits = config::limits(&req.config)?;
        let prev = req.prev_result()?.ok_or_else(|| {
            CniError::config("bandwidth must be called as a chained plugin: CHECK needs prevResult")
        })?;
        if limits.is_empty() {
            return Ok(());
        }
        let ns = req.require_netns()?;
        flow::check(&mut Real::with_container(&ns)?, &AttachmentId::of(req), &limits, &prev)
    }

    /// Delete this network's ifbs whose attachment is not in the valid list. Only ifbs whose
    /// alias records this network are considered, plus alias-less ones in this network's device
    /// group (an ADD killed between creating the ifb and writing its alias): other networks'
    /// ifbs and upstream's (no record, group 0) are never touched. The host veth qdiscs went
    /// with the containers' namespaces.
    fn gc(&self, req: &Request) -> Result<()> {
        let valid = AttachmentId::valid_list(req)?;
        flow::gc(&mut Real::host()?, req.network(), &valid)
    }

    /// Ready when the packet scheduler clock can be read (ADD needs it to size the buckets).
    fn status(&self, _req: &Request) -> Result<()> {
        flow::status(Psched::read())
    }
}
