//! `bridge`: attach a container to a Linux bridge on the host through a veth pair, with
//! optional gateway, masquerading, VLANs, MAC spoof check, and IPAM delegation (host-local).
//!
//! One process per verb, one thread, synchronous netlink. See README.md for every key and how
//! each verb behaves; `firewall` for the nftables layout (upstream's).

#![warn(clippy::too_many_lines)]

pub mod config;
pub mod firewall;
pub mod identity;
pub mod resync;

mod add;
mod check;
mod del;
mod forwarding;
mod gc;
mod host;
mod kernel;
mod model;
mod status;

use cni_common::spec::result::CniResult;
use cni_common::{Plugin, Request, Result};

pub use config::Conf;

pub struct Bridge;

impl Plugin for Bridge {
    fn name(&self) -> &'static str {
        "bridge"
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

#[cfg(test)]
mod tests;
