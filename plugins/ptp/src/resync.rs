//! The ptp plugin's resync surface: what `cni-migrate resync` asks of it after the firewall was
//! reloaded (`nft flush ruleset` takes the masquerade table), for one attachment the runtime
//! still has. The request is the one libcni's cache gives: the plugin's cached configuration,
//! CNI_NETNS and ifname, and the cached result as prevResult.
//!
//! Of what ptp keeps on the host only `ipMasq`'s rules live in the firewall (the veth, its
//! addresses and routes, forwarding survive a reload). Every address of the container's
//! interface in the cached result is masqueraded, IPv4 and IPv6 alike ([`desired`]'s `masq`,
//! what ADD masquerades).
//!
//! - [`judge`]: what is missing, judged as CHECK judges it: ours ([`Kernel::masq_missing`]),
//!   or upstream's iptables form when ours is not complete.
//! - [`rebuild`]: ADD's masquerade transaction ([`Kernel::masq_set`]), judged again afterwards.
//! - [`Rebuilt::undo`]: the rules taken back (the runtime's DEL began meanwhile), as DEL does.

use cni_common::attachment::AttachmentId;
use cni_common::error::{CniError, Result};
use cni_common::spec::result::CniResult;
use cni_common::Request;
use ipnet::IpNet;

use crate::config::Conf;
use crate::desired::desired;
use crate::kernel::{Kernel, Real};

/// The addresses ADD masquerades for the container interface `ifname` (in `netns`) of the
/// cached result `prev`: every one of them, both families; empty without `ipMasq`.
pub fn masq_addrs(conf: &Conf, prev: &CniResult, ifname: &str, netns: &str) -> Result<Vec<IpNet>> {
    if !conf.ip_masq {
        return Ok(Vec::new());
    }
    let pos =
        prev.interfaces.iter().position(|i| i.name == ifname && i.sandbox == netns).ok_or_else(|| {
            CniError::internal(format!("the cached result lists no interface {ifname:?} in {netns:?}"))
        })?;
    let mine = CniResult {
        ips: prev.ips.iter().filter(|i| i.interface.is_none_or(|x| x == pos)).cloned().collect(),
        routes: prev.routes.clone(),
        ..Default::default()
    };
    Ok(desired(conf, &mine)?.masq)
}

fn addrs_of(req: &Request) -> Result<Vec<IpNet>> {
    let conf = Conf::from_request(req)?;
    let prev =
        req.prev_result()?.ok_or_else(|| CniError::config("no result to judge against (prevResult)"))?;
    masq_addrs(&conf, &prev, &req.env.ifname, &req.env.netns)
}

/// [`judge`] against a kernel; `upstream_intact` says whether upstream's iptables form of the
/// attachment's masquerading is complete (asked only when ours is not).
pub fn judge_with(
    k: &mut dyn Kernel,
    a: &AttachmentId,
    addrs: &[IpNet],
    upstream_intact: &mut dyn FnMut() -> Result<bool>,
) -> Result<Option<String>> {
    if addrs.is_empty() {
        return Ok(None);
    }
    match k.masq_missing(a, addrs)? {
        None => Ok(None),
        Some(_) if upstream_intact()? => Ok(None),
        Some(why) => Ok(Some(format!("masquerading of {}: {why}", a.ifname))),
    }
}

/// What is missing of the attachment's masquerading (`Ok(None)`: intact, or no `ipMasq`).
/// Err: it cannot be judged (nf_tables not readable: code 50; a configuration or cached result
/// that is not valid).
pub fn judge(req: &Request) -> Result<Option<String>> {
    let addrs = addrs_of(req)?;
    if addrs.is_empty() {
        return Ok(None);
    }
    let mut k = Real::new(None)?;
    let mut upstream = || Ok(cni_common::upstream::masq::check(req)?.is_intact());
    judge_with(&mut k, &AttachmentId::of(req), &addrs, &mut upstream)
}

/// [`rebuild`] against a kernel: the masquerade rules of every address in one transaction,
/// then judged again (ours only: what was just written).
pub fn rebuild_with(k: &mut dyn Kernel, a: &AttachmentId, addrs: &[IpNet]) -> Result<Rebuilt> {
    k.masq_set(a, addrs)?;
    if let Some(still) = k.masq_missing(a, addrs)? {
        return Err(CniError::internal(format!("still missing after rebuilding it: {still}")));
    }
    Ok(Rebuilt { attachment: a.clone() })
}

/// Rebuild the attachment's masquerading (ADD's code).
pub fn rebuild(req: &Request) -> Result<Rebuilt> {
    let addrs = addrs_of(req)?;
    rebuild_with(&mut Real::new(None)?, &AttachmentId::of(req), &addrs)
}

/// What [`rebuild`] made, to take back when the attachment's DEL began meanwhile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rebuilt {
    attachment: AttachmentId,
}

impl Rebuilt {
    /// Remove the attachment's masquerade rules (found by its tag), as DEL does.
    pub fn undo(&self) -> Result<()> {
        self.undo_with(&mut Real::new(None)?)
    }

    pub fn undo_with(&self, k: &mut dyn Kernel) -> Result<()> {
        k.masq_remove(&self.attachment).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::fake::Fake;
    use cni_common::Version;
    use serde_json::json;

    fn cached() -> CniResult {
        CniResult::decode(
            &json!({"cniVersion": "1.0.0",
                    "interfaces": [{"name": "veth1"}, {"name": "eth0", "sandbox": "/run/netns/p"}],
                    "ips": [{"address": "10.1.0.5/24", "gateway": "10.1.0.1", "interface": 1},
                            {"address": "2001:db8:1::5/64", "gateway": "2001:db8:1::1", "interface": 1}]}),
            Version::V1_0_0,
        )
        .unwrap()
    }

    /// Issue 38's survivor: every address of a dual-stack pod is masqueraded again, never the
    /// first only; a second judgment finds it intact, the undo removes it.
    #[test]
    fn every_address_of_a_dual_stack_pod_is_judged_and_rebuilt() {
        let conf = Conf { ip_masq: true, mtu: None, dns: None };
        let addrs = masq_addrs(&conf, &cached(), "eth0", "/run/netns/p").unwrap();
        let want: Vec<IpNet> =
            ["10.1.0.5/24", "2001:db8:1::5/64"].iter().map(|a| a.parse().unwrap()).collect();
        assert_eq!(addrs, want);
        let off = Conf { ip_masq: false, ..conf.clone() };
        assert!(masq_addrs(&off, &cached(), "eth0", "/run/netns/p").unwrap().is_empty());
        assert!(masq_addrs(&conf, &cached(), "eth0", "/run/netns/q").is_err(), "another pod's result");

        let a = AttachmentId::new("net", "ctr", "eth0");
        let mut k = Fake::new();
        let mut no_upstream = || Ok(false);
        // only the IPv4 rule left (what a rebuild from the first address would make)
        k.masq_set(&a, &want[..1]).unwrap();
        let why = judge_with(&mut k, &a, &addrs, &mut no_upstream).unwrap().expect("IPv6 is missing");
        assert!(why.contains("eth0"), "{why}");
        let r = rebuild_with(&mut k, &a, &addrs).unwrap();
        assert_eq!(k.masq.get(&a.masq_tag()).map(|(_, v)| v.clone()), Some(want.clone()));
        assert_eq!(judge_with(&mut k, &a, &addrs, &mut no_upstream).unwrap(), None);
        // upstream's iptables form intact counts, as with CHECK
        k.masq_remove(&a).unwrap();
        assert_eq!(judge_with(&mut k, &a, &addrs, &mut || Ok(true)).unwrap(), None);
        k.masq_set(&a, &addrs).unwrap();
        r.undo_with(&mut k).unwrap();
        assert!(k.masq.is_empty());
    }
}
