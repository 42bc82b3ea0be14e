//! `firewall`: the CNI plugin around the [`firewall`] library.

cni_common::global_allocator!();

use cni_common::spec::result::CniResult;
use cni_common::{AttachmentId, CniError, Plugin, Request, Result, Version};
use firewall::backend::{self, Chosen};
use firewall::config::{Conf, Intent};
use firewall::{add, check, del, gc, kernel, record, status};
use serde_json::Value;
use std::net::IpAddr;
use std::path::Path;

struct Firewall;

fn load(req: &Request) -> Result<Conf> {
    Conf::from_raw(&req.plugin_config::<Value>()?)
}

fn root() -> &'static Path {
    Path::new(record::DIR)
}

fn prev_addrs(req: &Request) -> Vec<IpAddr> {
    req.prev.as_ref().map(|p| p.ips.iter().map(|i| i.address.addr()).collect()).unwrap_or_default()
}

impl Plugin for Firewall {
    fn name(&self) -> &'static str {
        "firewall"
    }

    /// A chained plugin needs a prevResult: 0.3.0 and later (upstream's starts at 0.4.0; the
    /// 0.3.x results carry everything it reads).
    fn supported_versions(&self) -> &'static [Version] {
        &[Version::V0_3_0, Version::V0_3_1, Version::V0_4_0, Version::V1_0_0, Version::V1_1_0]
    }

    fn add(&self, req: &Request) -> Result<CniResult> {
        let conf = load(req)?;
        let prev =
            req.prev_result()?.ok_or_else(|| CniError::config("missing prevResult from earlier plugin"))?;
        let intent = Intent::new(&conf, &prev)?;
        let b = backend::choose(&conf)?;
        add::add(root(), &AttachmentId::of(req), &conf, &intent, b)?;
        Ok(prev)
    }

    fn del(&self, req: &Request) -> Result<()> {
        let conf = load(req)?;
        // a backend that cannot be used now (firewalld, no iptables) still lets the record's go
        let now = match backend::choose(&conf) {
            Ok(b) => Some(b),
            Err(e) => {
                cni_common::log!("firewall", "{}; removing only what the record names", e.msg);
                None
            }
        };
        let names = backend::Names { admin: &conf.admin_chain, zone: &conf.zone };
        del::del(root(), &AttachmentId::of(req), names, &prev_addrs(req), now)
    }

    fn check(&self, req: &Request) -> Result<()> {
        let conf = load(req)?;
        let prev =
            req.prev_result()?.ok_or_else(|| CniError::config("missing prevResult from earlier plugin"))?;
        let intent = Intent::new(&conf, &prev)?;
        // our record says our ADD made it (with the DNAT accept); none: upstream's, or nothing
        let made_by_us = record::read(root(), &AttachmentId::of(req)).is_some();
        check::check_made(&conf, &intent, backend::choose(&conf)?, made_by_us)
    }

    fn gc(&self, req: &Request) -> Result<()> {
        let conf = load(req)?;
        gc::gc(root(), req.network(), &conf.admin_chain, &AttachmentId::valid_list(req)?)
    }

    fn status(&self, req: &Request) -> Result<()> {
        let conf = load(req)?;
        let b = backend::choose(&conf)?;
        let mut k = match b {
            Chosen::Nftables => kernel::Netlink::new().ok(),
            Chosen::Iptables(_) | Chosen::Firewalld => None,
        };
        status::status(b, k.as_mut())
    }
}

fn main() {
    cni_common::skel::run(&Firewall)
}
