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
#![warn(clippy::too_many_lines)]

pub mod add;
pub mod check;
pub mod config;
pub mod del;
pub mod desired;
pub mod gc;
pub mod ipam;
pub mod kernel;
pub mod masq;
pub mod plan;
pub mod status;

#[cfg(test)]
mod tests;

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

/// A host-side veth name: `veth` + 8 random hex digits, as upstream's (NetworkManager and
/// friends ignore `veth*`).
pub fn host_veth_name() -> String {
    let mut b = [0u8; 4];
    let mut filled = 0;
    while filled < b.len() {
        // SAFETY: writes at most len - filled bytes into the buffer's tail.
        let n = unsafe { libc::getrandom(b[filled..].as_mut_ptr().cast(), b.len() - filled, 0) };
        if n > 0 {
            filled += n as usize;
        } else if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            panic!("getrandom failed: {}", std::io::Error::last_os_error());
        }
    }
    format!("veth{:02x}{:02x}{:02x}{:02x}", b[0], b[1], b[2], b[3])
}
