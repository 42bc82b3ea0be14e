//! `ptp`: a container attached through a veth pair that is routed, not bridged: the container
//! reaches everything, its subnet included, through a gateway address on the host end, and the
//! host reaches the container through a /32 (/128) route per address. IPAM delegation
//! (host-local in-process when it is this build's), `ipMasq` with upstream's nftables layout,
//! `mtu`, dual stack, every verb of spec 1.1.0.
//!
//! One flow for every verb:
//!
//! ```text
//!  request ──► config ──► IPAM ──► desired (pure) ──► plan (pure) ──► steps through Kernel
//!                                                      ▲
//!  kernel ──► Kernel reads (links, addresses, routes, masquerade rules) ┘  (DEL, CHECK, GC)
//! ```
//!
//! - [`config`]: the keys ([`config::Conf`]; [`config::Teardown`] for DEL and GC).
//! - [`desired`]: the attachment's addresses and routes on both sides (pure).
//! - [`plan`]: the steps of ADD and DEL (pure).
//! - [`kernel`]: the seam ([`kernel::Kernel`]): netlink and `/proc/sys`, and a fake for tests.
//! - [`ipam`]: the IPAM delegate as a seam.
//! - [`masq`]: the masquerade table (upstream's nftables layout).
//! - [`add`], [`del`], [`check`], [`gc`], [`status`]: the verbs.
//! - [`resync`]: judge and rebuild an attachment's masquerading after a firewall reload
//!   (`cni-migrate resync`'s surface of this plugin).
#![warn(clippy::too_many_lines)]

pub mod add;
pub mod check;
pub mod config;
pub mod del;
pub mod desired;
pub mod gc;
pub mod ipam;
pub mod kernel;
pub mod plan;
pub mod resync;
pub mod status;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod twins;

use cni_common::spec::result::CniResult;
use cni_common::{Plugin, Request, Result};

pub struct Ptp;

impl Plugin for Ptp {
    fn name(&self) -> &'static str {
        "ptp"
    }

    fn add(&self, req: &Request) -> Result<CniResult> {
        add::add(req)
    }

    fn del(&self, req: &Request) -> Result<()> {
        del::del(req)
    }

    fn check(&self, req: &Request) -> Result<()> {
        check::check(req)
    }

    fn gc(&self, req: &Request) -> Result<()> {
        gc::gc(req)
    }

    fn status(&self, req: &Request) -> Result<()> {
        status::status(req)
    }
}
