//! STATUS: code 50 only when no ADD could work: the configuration is refused, nf_tables cannot
//! hold `ipMasq`'s rules (their ADD transaction, for a made-up attachment, is processed by the
//! kernel and never committed), or the IPAM delegate says so.

use cni_common::error::{code, CniError, Result};
use cni_common::Request;

use crate::config::Conf;
use crate::kernel::{Kernel, Real};

pub fn status(req: &Request) -> Result<()> {
    let conf = Conf::from_request(req)?;
    if conf.ip_masq {
        let mut k = Real::new(None)?;
        run(&mut k)?;
    }
    cni_common::delegate::ipam::status(req)
}

/// The masquerade part of STATUS.
pub fn run(k: &mut dyn Kernel) -> Result<()> {
    k.masq_validate().map_err(|e| {
        CniError::new(code::NOT_AVAILABLE, format!("nf_tables cannot hold ptp's masquerade rules: {}", e.msg))
    })
}
