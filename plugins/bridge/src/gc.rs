//! GC: this network's firewall rules of attachments not in the valid list (ours and upstream's
//! iptables masquerading), then the IPAM delegate's GC.

use std::collections::HashSet;

use cni_common::attachment::AttachmentId;

use crate::identity::from_veth_alias;
use cni_common::error::Result;
use cni_common::error_list::ErrorList;
use cni_common::Request;

use crate::config::Teardown;
use crate::firewall;
use crate::firewall::remove::delete_with_retry;
use crate::kernel::{Kernel, Ns, Real};

/// GC: this network's firewall rules of attachments not in the valid list, then the IPAM
/// delegate's GC. Reads the configuration like DEL ([`Teardown`]).
pub fn gc(req: &Request) -> Result<()> {
    let conf = Teardown::from_request(req)?;
    let valid = AttachmentId::valid_list(req)?;
    gc_with(&mut Real::lazy(req, None), &conf, req.network(), valid)
}

/// GC through the seam `k`, keeping the attachments of `valid`.
pub(crate) fn gc_with(
    k: &mut dyn Kernel,
    conf: &Teardown,
    network: &str,
    valid: Vec<AttachmentId>,
) -> Result<()> {
    let mut errors = ErrorList::new();
    let keep_masq: HashSet<String> = valid.iter().map(AttachmentId::masq_tag).collect();
    let keep_spoof: HashSet<AttachmentId> = valid.into_iter().collect();
    let mut firewall_gc = || -> Result<()> {
        // whose host interface a spoof-check rule names: read once, before the transaction
        let owners: Option<Vec<(String, Option<String>)>> = if conf.macspoofchk {
            Some(k.links(Ns::Host)?.into_iter().map(|l| (l.name, l.alias)).collect())
        } else {
            None
        };
        let nf = match k.nft() {
            Ok(nf) => nf,
            Err(_) if !conf.firewall() => return Ok(()),
            Err(e) => return Err(e),
        };
        delete_with_retry(nf, |nf| {
            let masq = firewall::masq_garbage(nf, network, &keep_masq)?;
            let spoof = match &owners {
                Some(links) => {
                    let mut owner_of = |name: &str| -> Result<firewall::PortOwner> {
                        Ok(match links.iter().find(|(n, _)| n == name) {
                            None => firewall::PortOwner::Gone,
                            Some((_, alias)) => match alias.as_deref().and_then(from_veth_alias) {
                                Some(a) => firewall::PortOwner::Attachment(a),
                                None => firewall::PortOwner::Unknown,
                            },
                        })
                    };
                    firewall::spoof_garbage(nf, network, &mut owner_of, &keep_spoof)?
                }
                None => Vec::new(),
            };
            Ok(firewall::gc_ops(&masq, &spoof))
        })
        .map(drop)
    };
    if let Err(e) = firewall_gc() {
        errors.push(e.context("garbage-collect firewall rules"));
    }
    // upstream's iptables masquerade chains of this network's dead attachments
    errors.take(k.upstream_masq_gc());
    if conf.l3 {
        errors.take(k.ipam_gc());
    }
    errors.finish()
}
