//! STATUS.

use cni_common::delegate::ipam;
use cni_common::error::{code, CniError, Result};
use cni_common::sysctl;
use cni_common::Request;

use crate::config::Conf;
use crate::firewall;

/// STATUS: code 50 only when no ADD could work (docs/real-clients.md, "STATUS"): nf_tables
/// cannot hold the rules `ipMasq`/`macspoofchk` need (their ADD transaction, for a made-up
/// attachment, is processed by the kernel and never committed), br_netfilter is missing for
/// `bridgeNfCallIptables`, or the IPAM plugin says so.
pub fn status(req: &Request) -> Result<()> {
    let conf = Conf::from_request(req)?;
    if conf.bridge_nf_call_iptables {
        crate::host::br_netfilter_present(sysctl::get(crate::host::BR_NF_CALL_IPTABLES).is_ok())?;
    }
    if conf.ip_masq || conf.macspoofchk {
        firewall::validate_status(conf.ip_masq, conf.macspoofchk).map_err(|e| {
            CniError::new(code::NOT_AVAILABLE, format!("nf_tables cannot hold the bridge's rules: {e}"))
        })?;
    }
    if conf.l3 {
        ipam::status(req)?;
    }
    Ok(())
}
