//! GC: this network's masquerade rules of attachments not in the valid list (ours, and
//! upstream's iptables chains), then the IPAM delegate's GC. Links need no collecting: a veth
//! pair goes with its container's namespace.

use std::collections::HashSet;

use cni_common::attachment::AttachmentId;
use cni_common::error::Result;
use cni_common::error_list::ErrorList;
use cni_common::Request;

use crate::config::Teardown;
use crate::kernel::{Kernel, Real};

pub fn gc(req: &Request) -> Result<()> {
    let conf = Teardown::from_request(req)?;
    let valid = AttachmentId::valid_list(req)?;
    let mut errors = ErrorList::new();
    match Real::new(None) {
        Ok(mut k) => {
            errors.take(run(&mut k, req.network(), &valid, conf.ip_masq));
        }
        Err(e) => errors.push(e),
    }
    errors.take(cni_common::upstream::masq::gc(req));
    if conf.l3 {
        errors.take(cni_common::delegate::ipam::gc(req));
    }
    errors.finish()
}

/// The masquerade part of GC; whether something was removed.
pub fn run(k: &mut dyn Kernel, network: &str, valid: &[AttachmentId], ip_masq: bool) -> Result<bool> {
    let keep: HashSet<String> = valid.iter().map(AttachmentId::masq_tag).collect();
    match k.masq_gc(network, &keep) {
        Ok(removed) => Ok(removed),
        Err(e) if ip_masq => Err(e.context("garbage-collect masquerade rules")),
        Err(e) => {
            cni_common::log!("ptp", "nf_tables not readable, no masquerade rules to collect: {}", e.msg);
            Ok(false)
        }
    }
}
