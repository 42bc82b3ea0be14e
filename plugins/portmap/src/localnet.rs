//! `route_localnet` and the localhost guard that must live as long as it does.
//!
//! portmap sets `net.ipv4.conf.<if>.route_localnet=1` so that `127.0.0.1:<hostPort>` can be
//! DNATed out of the host, and only on an interface the chain created: a host-side interface of
//! prevResult (one without a sandbox: bridge's bridge and host veth, ptp's host veth). An
//! uplink (macvlan, ipvlan, host-device, a routed setup) never gets it (issue 27 finding 7).
//!
//! The sysctl survives `nft flush ruleset`; the table's `localnet` guard does not. The record
//! of what we set is the pair the runtime keeps and the kernel holds: the cached result names
//! the host-side interfaces, and the sysctl says whether it is on. Whenever a host-side
//! interface of an attachment of a chain with portmap has it on, the guard must exist: ADD
//! restores it (also for a pod without host ports), CHECK reports it missing, `cni-migrate
//! resync` rebuilds it (finding 2). Reading the sysctl can only add protection: it never
//! decides what a pod may reach.

use cni_common::netlink::{Netlink, Route, RouteKind};
use cni_common::spec::env::validate_ifname;
use cni_common::spec::result::CniResult;
use cni_common::{sysctl, CniError, Result};
use std::net::IpAddr;

/// The host-side interfaces of `prev` (no sandbox), those with a valid name only (the names
/// come from the runtime and become sysctl paths).
pub fn host_side(prev: &CniResult) -> Vec<String> {
    prev.interfaces
        .iter()
        .filter(|i| i.sandbox.is_empty() && validate_ifname(&i.name).is_ok())
        .map(|i| i.name.clone())
        .collect()
}

fn key(ifname: &str) -> String {
    sysctl::iface_key("ipv4", ifname, "route_localnet")
}

/// The host-side interfaces of `prev` that have `route_localnet` on (read in the calling
/// thread's network namespace). An interface that is gone or unreadable is not listed.
pub fn enabled_on(prev: &CniResult) -> Vec<String> {
    host_side(prev).into_iter().filter(|n| sysctl::get(&key(n)).is_ok_and(|v| v == "1")).collect()
}

/// The kernel's route to `ip` (one `ip route get`: policy routing included).
pub fn best_route(nl: &mut Netlink, ip: IpAddr) -> Result<Option<Route>> {
    nl.route_get(ip).map_err(CniError::from)
}

/// Whether `best`, the kernel's route to an address, says the host holds it itself (an
/// address of one of its interfaces, or a local route). A DNAT there lands on the host's own
/// services.
pub fn local_to_host(best: Option<&Route>) -> bool {
    best.is_some_and(|r| r.kind == RouteKind::Local)
}

/// `route_localnet=1` on the interface that routes to the container address `ctr` (`best`: the
/// kernel's route to it, [`best_route`]), when it is a host-side interface of `prev`;
/// otherwise nothing is set and a note says why. Returns the interface set (or already on).
pub fn enable(
    nl: &mut Netlink,
    prev: &CniResult,
    ctr: IpAddr,
    best: Option<&Route>,
) -> Result<Option<String>> {
    let best = best.filter(|r| r.kind == RouteKind::Unicast);
    let Some(oif) = best.and_then(|r| r.oif.or_else(|| r.nexthops.first().and_then(|h| h.oif))) else {
        cni_common::log!("portmap", "note: no route to {ctr} in the host; route_localnet not set");
        return Ok(None);
    };
    let Some(link) = nl.link_by_index(oif).map_err(CniError::from)? else { return Ok(None) };
    if !host_side(prev).contains(&link.name) {
        cni_common::log!(
            "portmap",
            "note: {ctr} is reached through {}, which is not an interface this chain created \
             (prevResult's host-side interfaces: {:?}); route_localnet is not set on it, so \
             127.0.0.1:<hostPort> is not forwarded to this container",
            link.name.escape_debug(),
            host_side(prev)
        );
        return Ok(None);
    }
    sysctl::set(&key(&link.name), "1")?;
    Ok(Some(link.name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_interfaces_without_a_sandbox_and_with_valid_names_are_host_side() {
        let r = json!({"cniVersion": "1.0.0", "interfaces": [
            {"name": "cni0"}, {"name": "veth1234"}, {"name": "eth0", "sandbox": "/run/netns/x"},
            {"name": "../../all"}, {"name": "a b"}, {"name": ""}],
            "ips": [{"address": "10.0.0.2/24", "interface": 2}]});
        let r = CniResult::decode(&r, cni_common::Version::V1_0_0).unwrap();
        assert_eq!(host_side(&r), ["cni0", "veth1234"]);
    }
}
