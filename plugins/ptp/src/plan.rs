//! The steps of each verb, planned from the desired state and what was read (pure); the
//! verb modules carry them out through the [`crate::kernel::Kernel`] seam.

use cni_common::netlink::Link;
use ipnet::IpNet;

use crate::desired::{Desired, RouteWant};

/// One change ADD makes, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Forwarding in the host for the families the container has (upstream turns it on first).
    Forward(bool, bool),
    /// The veth pair: the container end named CNI_IFNAME in its namespace, the host end
    /// `veth<8 hex>` (a fresh name on a clash).
    CreateVeth,
    /// IPv6 on in the container for its interface and `lo`.
    CtrEnableIpv6,
    CtrAddr(IpNet),
    CtrUp,
    /// Wait until IPv6 duplicate address detection is over (routes name the address as source).
    CtrSettleV6,
    CtrRoute(RouteWant),
    HostAddr(IpNet),
    HostRoute(RouteWant),
    /// The attachment's masquerade rules.
    Masq(Vec<IpNet>),
}

/// ADD's steps for `d`.
pub fn add(d: &Desired) -> Vec<Step> {
    let mut steps = vec![Step::Forward(d.forward.0, d.forward.1), Step::CreateVeth];
    if d.ctr_v6 {
        steps.push(Step::CtrEnableIpv6);
    }
    steps.extend(d.ctr_addrs.iter().map(|a| Step::CtrAddr(*a)));
    steps.push(Step::CtrUp);
    if d.ctr_v6 {
        steps.push(Step::CtrSettleV6);
    }
    steps.extend(d.ctr_routes.iter().cloned().map(Step::CtrRoute));
    steps.extend(d.host_addrs.iter().map(|a| Step::HostAddr(*a)));
    steps.extend(d.host_routes.iter().cloned().map(Step::HostRoute));
    if !d.masq.is_empty() {
        steps.push(Step::Masq(d.masq.clone()));
    }
    steps
}

/// One change DEL makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DelStep {
    /// Delete the container's interface (the host end, its addresses and routes go with it).
    DeleteContainerLink(u32),
    /// A link of CNI_IFNAME's name that is not a veth is not ptp's: left alone, said on stderr.
    LeaveForeign(String),
    RemoveMasq,
    ReleaseIpam,
}

/// DEL's steps, given the container's link named CNI_IFNAME (None: not there or no namespace)
/// and that veth's host end when found. A veth whose host end is a port of a bridge is not
/// ptp's (ptp never enslaves it): one pod on several networks (Multus, DRA drivers) has it from
/// a bridge network, and a DEL for an attachment of this network that never was (its ADD
/// refused because the name was taken) must leave it, where upstream's DEL deletes it.
/// Masquerade rules are looked for by the attachment's tag whether or not `ipMasq` is set now
/// (an earlier configuration may have set it).
pub fn del(ctr_link: Option<&Link>, host_end: Option<&Link>, l3: bool) -> Vec<DelStep> {
    let mut steps = Vec::new();
    match ctr_link {
        Some(l) if l.kind.as_deref() == Some("veth") && host_end.is_some_and(|h| h.master.is_some()) => steps
            .push(DelStep::LeaveForeign(format!(
                "{:?} is a veth whose host end {:?} is a bridge's port, not one ptp made: left alone",
                l.name,
                host_end.map(|h| h.name.as_str()).unwrap_or_default()
            ))),
        Some(l) if l.kind.as_deref() == Some("veth") => steps.push(DelStep::DeleteContainerLink(l.index)),
        Some(l) => steps.push(DelStep::LeaveForeign(format!(
            "{:?} is a {} device, not a veth ptp made: left alone",
            l.name,
            l.kind.as_deref().unwrap_or("typeless")
        ))),
        None => {}
    }
    steps.push(DelStep::RemoveMasq);
    if l3 {
        steps.push(DelStep::ReleaseIpam);
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Conf;
    use crate::desired::desired;
    use cni_common::spec::result::{CniResult, IpConfig};

    #[test]
    fn add_orders_container_before_host_and_masquerade_last() {
        let r = CniResult {
            ips: vec![
                IpConfig {
                    interface: None,
                    address: "10.1.0.5/24".parse().unwrap(),
                    gateway: "10.1.0.1".parse().ok(),
                },
                IpConfig {
                    interface: None,
                    address: "fd00::5/64".parse().unwrap(),
                    gateway: "fd00::1".parse().ok(),
                },
            ],
            ..Default::default()
        };
        let d = desired(&Conf { ip_masq: true, mtu: None, dns: None }, &r).unwrap();
        let steps = add(&d);
        let kinds: Vec<&str> = steps
            .iter()
            .map(|s| match s {
                Step::Forward(..) => "forward",
                Step::CreateVeth => "veth",
                Step::CtrEnableIpv6 => "v6on",
                Step::CtrAddr(_) => "caddr",
                Step::CtrUp => "up",
                Step::CtrSettleV6 => "settle",
                Step::CtrRoute(_) => "croute",
                Step::HostAddr(_) => "haddr",
                Step::HostRoute(_) => "hroute",
                Step::Masq(_) => "masq",
            })
            .collect();
        assert_eq!(
            kinds,
            vec![
                "forward", "veth", "v6on", "caddr", "caddr", "up", "settle", "croute", "croute", "croute",
                "croute", "haddr", "haddr", "hroute", "hroute", "masq"
            ]
        );
        let v4only = CniResult { ips: r.ips[..1].to_vec(), ..Default::default() };
        let steps = add(&desired(&Conf { ip_masq: false, mtu: None, dns: None }, &v4only).unwrap());
        assert!(!steps.iter().any(|s| matches!(s, Step::CtrEnableIpv6 | Step::CtrSettleV6 | Step::Masq(_))));
    }

    #[test]
    fn del_removes_only_a_veth_and_always_looks_for_masquerade() {
        let veth = Link { index: 7, name: "eth0".into(), kind: Some("veth".into()), ..Link::default() };
        assert_eq!(
            del(Some(&veth), None, true),
            vec![DelStep::DeleteContainerLink(7), DelStep::RemoveMasq, DelStep::ReleaseIpam]
        );
        let dummy = Link { index: 8, name: "eth0".into(), kind: Some("dummy".into()), ..Link::default() };
        assert!(matches!(del(Some(&dummy), None, false)[0], DelStep::LeaveForeign(_)));
        assert_eq!(del(None, None, false), vec![DelStep::RemoveMasq]);
        // one pod on several networks: a veth whose host end is a bridge's port is another
        // network's (a DEL of an attachment of this one that never was); one not enslaved is ptp's
        let port = Link {
            index: 8,
            name: "veth1".into(),
            kind: Some("veth".into()),
            master: Some(3),
            ..Link::default()
        };
        let steps = del(Some(&veth), Some(&port), true);
        assert!(matches!(&steps[0], DelStep::LeaveForeign(w) if w.contains("bridge's port")), "{steps:?}");
        assert_eq!(steps[1..], [DelStep::RemoveMasq, DelStep::ReleaseIpam]);
        let own = Link { master: None, ..port };
        assert_eq!(
            del(Some(&veth), Some(&own), false),
            vec![DelStep::DeleteContainerLink(7), DelStep::RemoveMasq]
        );
    }
}
