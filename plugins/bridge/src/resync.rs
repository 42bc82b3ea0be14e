//! Rebuilding an attachment's firewall state after the ruleset was flushed (`systemctl reload
//! nftables`, `nft flush ruleset`): what `cni-migrate resync` asks of the bridge plugin.
//!
//! The request is the attachment's own (its cached configuration, CNI_NETNS and ifname, its
//! cached result as prevResult). What is missing is judged exactly as CHECK judges it
//! ([`firewall::masq_missing`], [`firewall::spoof_missing`]), and rebuilt with ADD's own
//! transaction ([`firewall::apply_add`]), which leaves whatever is intact as it is: only the
//! part found missing (masquerading, spoof check, or both) is written.

use cni_common::attachment::AttachmentId;
use cni_common::mac::Mac;
use cni_common::netlink::Netlink;
use cni_common::netns::NetNs;
use cni_common::{CniError, Request, Result};
use ipnet::IpNet;

use crate::config::Conf;
use crate::firewall;
use crate::model::container_of;

/// The host end of the veth whose container end is `ifname` in the namespace at `netns`, and
/// the container end's MAC: what the spoof check is keyed on.
fn veth_pair(netns: &std::path::Path, ifname: &str) -> Result<(String, Mac)> {
    let ns = NetNs::open(netns)?;
    let mut ctr = Netlink::new_in(&ns)?;
    let mut host = Netlink::new()?;
    let gone =
        || CniError::internal(format!("container interface {ifname} has no veth peer in this namespace"));
    let c = ctr
        .link_by_name(ifname)?
        .ok_or_else(|| CniError::internal(format!("container interface {ifname} not found")))?;
    let h = host.link_by_index(c.link.ok_or_else(gone)?)?.ok_or_else(gone)?;
    if h.kind.as_deref() != Some("veth") || h.link != Some(c.index) {
        return Err(gone());
    }
    let mac = c.mac.map(Mac).ok_or_else(|| CniError::internal(format!("{ifname} has no MAC address")))?;
    Ok((h.name, mac))
}

/// What of `req`'s masquerading (`ipMasq`) and MAC spoof check (`macspoofchk`) is missing,
/// rebuilt unless `dry_run`: `None` when nothing is (or the configuration asks for neither),
/// else what was (or, dry, would be) rebuilt. Masquerading that upstream's bridge made
/// (iptables) and that is intact is left to it. After a rebuild the state is judged again: what
/// is still missing then is an error.
pub fn firewall(req: &Request, dry_run: bool) -> Result<Option<String>> {
    let conf = Conf::from_request(req)?;
    if !conf.ip_masq && !conf.macspoofchk {
        return Ok(None);
    }
    let prev =
        req.prev_result()?.ok_or_else(|| CniError::config("no result to rebuild from (prevResult)"))?;
    let netns = req.netns().ok_or_else(|| CniError::env("CNI_NETNS is required"))?;
    let (_, addrs) = container_of(&prev, &req.env.ifname, &req.env.netns)?;
    let masq_wanted =
        conf.ip_masq && !addrs.is_empty() && !cni_common::upstream::masq::check(req)?.is_intact();
    let masq: Option<(&[IpNet], Option<&[IpNet]>)> =
        masq_wanted.then_some((addrs.as_slice(), conf.non_masquerade.as_deref()));
    let pair = if conf.macspoofchk { Some(veth_pair(netns, &req.env.ifname)?) } else { None };
    let spoof = pair.as_ref().map(|(veth, mac)| (veth.as_str(), *mac));

    let att = AttachmentId::of(req);
    let mut nf = firewall::open()?;
    let missing = |nf: &mut cni_common::netlink::nft::NfTables| -> Result<(Option<String>, Option<String>)> {
        let found = firewall::find(nf, &att, masq.is_some(), spoof.is_some())?;
        Ok((
            masq.and_then(|(a, n)| firewall::masq_missing(&found, &att, a, n)),
            spoof.and_then(|(v, m)| firewall::spoof_missing(&found, v, m)),
        ))
    };
    let (masq_gap, spoof_gap) = missing(&mut nf)?;
    let what: Vec<String> = masq_gap.iter().chain(spoof_gap.iter()).cloned().collect();
    if what.is_empty() {
        return Ok(None);
    }
    if !dry_run {
        firewall::apply_add(
            &mut nf,
            &att,
            masq.filter(|_| masq_gap.is_some()),
            spoof.filter(|_| spoof_gap.is_some()),
        )?;
        let (m, s) = missing(&mut nf)?;
        if let Some(still) = m.or(s) {
            return Err(CniError::internal(format!("still missing after rebuilding it: {still}")));
        }
    }
    Ok(Some(what.join("; ")))
}

/// Remove what [`firewall`] rebuilt for an attachment whose runtime deleted it meanwhile (its
/// DEL may have run before the rebuild): the firewall part of bridge's DEL.
pub fn undo(req: &Request) -> Result<()> {
    crate::firewall::remove::remove(req, true).map(drop)
}
