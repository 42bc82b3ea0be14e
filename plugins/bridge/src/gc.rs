//! GC: this network's firewall rules of attachments not in the valid list (ours and upstream's
//! iptables masquerading), then the IPAM delegate's GC.

use std::collections::HashSet;

use cni_common::attachment::AttachmentId;
use cni_common::delegate::ipam;
use cni_common::error::Result;
use cni_common::error_list::ErrorList;
use cni_common::netlink::nft::NfTables;
use cni_common::netlink::Netlink;
use cni_common::Request;

use crate::config::Teardown;
use crate::firewall;
use crate::firewall::remove::delete_with_retry;

/// GC: this network's firewall rules of attachments not in the valid list, then the IPAM
/// delegate's GC. Reads the configuration like DEL ([`Teardown`]).
pub fn gc(req: &Request) -> Result<()> {
    let conf = Teardown::from_request(req)?;
    let valid = AttachmentId::valid_list(req)?;
    let network = req.network();
    let mut errors = ErrorList::new();

    let keep_masq: HashSet<String> = valid.iter().map(AttachmentId::masq_tag).collect();
    let keep_spoof: HashSet<AttachmentId> = valid.into_iter().collect();
    let firewall_gc = || -> Result<()> {
        let mut nf = match NfTables::new() {
            Ok(nf) => nf,
            Err(_) if !conf.firewall() => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let mut host = Netlink::new()?;
        delete_with_retry(&mut nf, |nf| {
            let masq = firewall::masq_garbage(nf, network, &keep_masq)?;
            let spoof = if conf.macspoofchk {
                let mut owner_of = |name: &str| -> Result<firewall::PortOwner> {
                    Ok(match host.link_by_name(name)? {
                        None => firewall::PortOwner::Gone,
                        Some(l) => match l.alias.as_deref().and_then(AttachmentId::from_veth_alias) {
                            Some(a) => firewall::PortOwner::Attachment(a),
                            None => firewall::PortOwner::Unknown,
                        },
                    })
                };
                firewall::spoof_garbage(nf, network, &mut owner_of, &keep_spoof)?
            } else {
                Vec::new()
            };
            Ok(firewall::gc_ops(&masq, &spoof))
        })
        .map(drop)
    };
    if let Err(e) = firewall_gc() {
        errors.push(e.context("garbage-collect firewall rules"));
    }
    // upstream's iptables masquerade chains of this network's dead attachments
    errors.take(crate::upstream_masq::gc(req));
    if conf.l3 {
        errors.take(ipam::gc(req));
    }
    errors.finish()
}
