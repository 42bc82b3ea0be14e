//! STATUS: tuning needs nothing of the host but its configuration: a configuration an ADD would
//! refuse (a key outside `net.*`, an allowlist that forbids a key or cannot be read) fails, with
//! ADD's code; anything else is ready.

use cni_common::error::Result;
use cni_common::Request;

use crate::config::Conf;

pub fn status(req: &Request) -> Result<()> {
    // CNI_IFNAME is not part of STATUS: keys with IFNAME are judged with a placeholder name.
    let raw: crate::config::RawConf = req.plugin_config()?;
    let allowlist = crate::config::read_allowlist(std::path::Path::new(crate::config::ALLOWLIST))?;
    Conf::from_raw(raw, None, "eth0", allowlist.as_deref()).map(drop)
}
