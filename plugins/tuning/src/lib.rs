//! `tuning`: sysctls and link settings (MAC, promiscuity, MTU, all-multicast, queue length) of
//! a chained container interface; DEL puts back what ADD changed, from a file in upstream's
//! format (`<dataDir>/<containerID>_<ifname>.json`, or an unambiguous name of ours when ids or
//! ifnames hold `_`: [`store::Names`]), so either build restores the other's.
//!
//! ```text
//!  request ──► config (pure) ──► read (link, sysctls, saved file) ──► saved::backup / plans
//!                                   through Kernel + Store seams        (pure; saved::decide)
//!                                                          ──► apply, undone on failure
//! ```
//!
//! - [`config`]: the keys, CNI_ARGS, runtimeConfig and args.cni, the sysctl path rule, the
//!   allowlist.
//! - [`saved`]: the saved settings (upstream's format) and the plans that apply or restore them.
//! - [`kernel`]: the container's link and sysctls ([`kernel::Kernel`]) and its fake.
//! - [`store`]: the saved-settings directory ([`store::Store`]): file names, the only code that
//!   touches the files, and its fake.
//! - [`add`], [`del`], [`check`], [`gc`], [`status`]: the verbs.
#![warn(clippy::too_many_lines)]

pub mod add;
pub mod check;
pub mod config;
pub mod del;
pub mod gc;
pub mod kernel;
pub mod saved;
pub mod status;
pub mod store;

#[cfg(test)]
mod tests;

use cni_common::spec::result::CniResult;
use cni_common::{Plugin, Request, Result};

pub struct Tuning;

impl Plugin for Tuning {
    fn name(&self) -> &'static str {
        "tuning"
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
