//! What one attachment should look like in the kernel, computed from the configuration and
//! the IPAM result (pure).
//!
//! A veth pair is not a point-to-point device (no `IFF_POINTOPOINT`), so ptp makes it behave
//! like one, as upstream does: the container gets its address with the IPAM prefix length but
//! no route to that subnet; instead `GW/32 dev IF scope link src IP` and `SUBNET via GW src IP`,
//! so everything, the neighbours of the subnet included, goes through the gateway. The host end
//! carries `GW/32` (`/128`) and a `IP/32 dev HOSTVETH scope host` route per container address.
//! Upstream deletes the kernel's subnet route after adding the address; we add the address
//! with `IFA_F_NOPREFIXROUTE`, which leaves the same routes without a moment in between.

use std::net::IpAddr;

use cni_common::error::{CniError, Result};
use cni_common::netlink::SCOPE_LINK;
use cni_common::spec::result::{CniResult, IpConfig, Route as ResultRoute};
use ipnet::IpNet;

use crate::config::Conf;

/// `RT_SCOPE_HOST`: upstream's host route to a container address (`ip.AddHostRoute`).
pub const SCOPE_HOST: u8 = 254;

/// A route the attachment needs, on one side; the interface is the attachment's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteWant {
    pub dst: IpNet,
    pub gw: Option<IpAddr>,
    pub src: Option<IpAddr>,
    pub scope: Option<u8>,
    pub table: Option<u32>,
    pub priority: Option<u32>,
    pub mtu: Option<u32>,
    pub advmss: Option<u32>,
    /// IPAM's routes are added like `ConfigureIface` adds them (ECMP append: a second route to
    /// the same destination is not an error).
    pub append: bool,
}

impl RouteWant {
    pub(crate) fn new(dst: IpNet) -> RouteWant {
        RouteWant {
            dst,
            gw: None,
            src: None,
            scope: None,
            table: None,
            priority: None,
            mtu: None,
            advmss: None,
            append: false,
        }
    }
}

/// The attachment's kernel state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Desired {
    /// Container addresses, with IPAM's prefix length, added without a subnet route.
    pub ctr_addrs: Vec<IpNet>,
    /// Container routes in the order they must be added (a gateway is reachable before a route
    /// goes through it).
    pub ctr_routes: Vec<RouteWant>,
    /// The container has IPv6 addresses: IPv6 is enabled on `lo` and the interface, addresses
    /// are kept when it goes down, and routes wait until duplicate address detection is over
    /// (a tentative address cannot be a route's source).
    pub ctr_v6: bool,
    /// Host-end addresses: each gateway as /32 (/128).
    pub host_addrs: Vec<IpNet>,
    /// Host routes to the container's addresses.
    pub host_routes: Vec<RouteWant>,
    /// Forwarding to turn on: (IPv4, IPv6).
    pub forward: (bool, bool),
    /// Addresses to masquerade (`ipMasq`), with their prefix length.
    pub masq: Vec<IpNet>,
}

fn host_net(a: IpAddr) -> IpNet {
    IpNet::from(a)
}

/// The desired state for `conf` and the IPAM result `ipam` (its IPs, routes).
pub fn desired(conf: &Conf, ipam: &CniResult) -> Result<Desired> {
    if ipam.ips.is_empty() {
        return Err(CniError::internal("IPAM plugin returned missing IP config"));
    }
    let mut d = Desired {
        ctr_addrs: Vec::new(),
        ctr_routes: Vec::new(),
        ctr_v6: false,
        host_addrs: Vec::new(),
        host_routes: Vec::new(),
        forward: (false, false),
        masq: Vec::new(),
    };
    let mut gw_routes = Vec::new();
    let mut subnet_routes = Vec::new();
    for ip in &ipam.ips {
        let addr = ip.address.addr();
        let gw = gateway_of(ip)?;
        let v4 = addr.is_ipv4();
        if v4 {
            d.forward.0 = true;
        } else {
            d.forward.1 = true;
            d.ctr_v6 = true;
        }
        d.ctr_addrs.push(ip.address);
        gw_routes.push(RouteWant {
            src: Some(addr),
            scope: Some(SCOPE_LINK),
            ..RouteWant::new(host_net(gw))
        });
        if ip.address.prefix_len() < ip.address.max_prefix_len() {
            subnet_routes.push(RouteWant {
                gw: Some(gw),
                src: Some(addr),
                ..RouteWant::new(ip.address.trunc())
            });
        }
        if !d.host_addrs.contains(&host_net(gw)) {
            d.host_addrs.push(host_net(gw));
        }
        d.host_routes.push(RouteWant { scope: Some(SCOPE_HOST), ..RouteWant::new(host_net(addr)) });
        if conf.ip_masq {
            d.masq.push(ip.address);
        }
    }
    // Two addresses behind one gateway need its link route once.
    gw_routes.dedup_by(|b, a| a.dst == b.dst);
    d.ctr_routes.extend(gw_routes);
    d.ctr_routes.extend(subnet_routes);
    d.ctr_routes.extend(ipam.routes.iter().map(|r| ipam_route(r, &ipam.ips)));
    Ok(d)
}

/// The gateway of one IPAM address: ptp routes everything through it, so it must be there, be
/// of the address's family and not be the address itself.
fn gateway_of(ip: &IpConfig) -> Result<IpAddr> {
    let addr = ip.address.addr();
    match ip.gateway {
        None => Err(CniError::config(format!(
            "IPAM gave {} no gateway: ptp routes the container through one (host-local picks the range's first address unless \"gateway\" is set)",
            ip.address
        ))),
        Some(g) if g.is_ipv4() != addr.is_ipv4() => Err(CniError::config(format!(
            "IPAM gave {} the gateway {g} of another address family",
            ip.address
        ))),
        Some(g) if g == addr => Err(CniError::config(format!(
            "IPAM gave {} itself as its gateway: ptp needs another address for the host end",
            ip.address
        ))),
        Some(g) => Ok(g),
    }
}

/// An IPAM route as `ConfigureIface` adds it: without a gateway it goes through the first
/// gateway of its family.
fn ipam_route(r: &ResultRoute, ips: &[IpConfig]) -> RouteWant {
    let v4 = r.dst.addr().is_ipv4();
    let gw = r.gw.or_else(|| ips.iter().filter_map(|i| i.gateway).find(|g| g.is_ipv4() == v4));
    RouteWant {
        gw,
        scope: r.scope,
        table: r.table,
        priority: r.priority,
        mtu: r.mtu,
        advmss: r.advmss,
        append: true,
        ..RouteWant::new(r.dst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cni_common::code;

    fn ip(a: &str, gw: Option<&str>) -> IpConfig {
        IpConfig { interface: None, address: a.parse().unwrap(), gateway: gw.map(|g| g.parse().unwrap()) }
    }

    fn conf(masq: bool) -> Conf {
        Conf { ip_masq: masq, mtu: None, dns: None }
    }

    #[test]
    fn dual_stack_routes_through_the_gateways() {
        let r = CniResult {
            ips: vec![ip("10.244.1.5/24", Some("10.244.1.1")), ip("fd00:10::5/64", Some("fd00:10::1"))],
            routes: vec![
                ResultRoute::new("0.0.0.0/0".parse().unwrap(), None),
                ResultRoute::new("::/0".parse().unwrap(), None),
            ],
            ..Default::default()
        };
        let d = desired(&conf(true), &r).unwrap();
        assert_eq!(
            d.ctr_addrs,
            vec!["10.244.1.5/24".parse::<IpNet>().unwrap(), "fd00:10::5/64".parse().unwrap()]
        );
        let text: Vec<String> = d
            .ctr_routes
            .iter()
            .map(|r| {
                format!(
                    "{} via {:?} src {:?} scope {:?} append {}",
                    r.dst,
                    r.gw.map(|g| g.to_string()),
                    r.src.map(|g| g.to_string()),
                    r.scope,
                    r.append
                )
            })
            .collect();
        assert_eq!(
            text,
            vec![
                "10.244.1.1/32 via None src Some(\"10.244.1.5\") scope Some(253) append false",
                "fd00:10::1/128 via None src Some(\"fd00:10::5\") scope Some(253) append false",
                "10.244.1.0/24 via Some(\"10.244.1.1\") src Some(\"10.244.1.5\") scope None append false",
                "fd00:10::/64 via Some(\"fd00:10::1\") src Some(\"fd00:10::5\") scope None append false",
                "0.0.0.0/0 via Some(\"10.244.1.1\") src None scope None append true",
                "::/0 via Some(\"fd00:10::1\") src None scope None append true",
            ]
        );
        assert!(d.ctr_v6);
        assert_eq!(d.forward, (true, true));
        assert_eq!(
            d.host_addrs,
            vec!["10.244.1.1/32".parse::<IpNet>().unwrap(), "fd00:10::1/128".parse().unwrap()]
        );
        let host: Vec<(String, Option<u8>)> =
            d.host_routes.iter().map(|r| (r.dst.to_string(), r.scope)).collect();
        assert_eq!(host, vec![("10.244.1.5/32".into(), Some(254)), ("fd00:10::5/128".into(), Some(254))]);
        assert_eq!(d.masq, d.ctr_addrs);
        assert!(desired(&conf(false), &r).unwrap().masq.is_empty());
    }

    #[test]
    fn ipv4_only_turns_on_ipv4_forwarding_only_and_a_host_address_once_per_gateway() {
        let r = CniResult {
            ips: vec![ip("10.1.0.5/24", Some("10.1.0.1")), ip("10.1.0.6/24", Some("10.1.0.1"))],
            ..Default::default()
        };
        let d = desired(&conf(false), &r).unwrap();
        assert_eq!(d.forward, (true, false));
        assert!(!d.ctr_v6);
        assert_eq!(d.host_addrs.len(), 1);
        assert_eq!(d.host_routes.len(), 2);
        assert_eq!(d.ctr_routes.iter().filter(|r| r.scope == Some(SCOPE_LINK)).count(), 1);
        // A /32 address has no subnet to route.
        let r = CniResult { ips: vec![ip("10.1.0.5/32", Some("10.1.0.1"))], ..Default::default() };
        assert_eq!(desired(&conf(false), &r).unwrap().ctr_routes.len(), 1);
    }

    #[test]
    fn unusable_ipam_results_are_refused() {
        let e = desired(&conf(false), &CniResult::default()).unwrap_err();
        assert_eq!(e.code, code::INTERNAL);
        for (ips, part) in [
            (vec![ip("10.1.0.5/24", None)], "no gateway"),
            (vec![ip("10.1.0.5/24", Some("fd00::1"))], "another address family"),
            (vec![ip("10.1.0.5/24", Some("10.1.0.5"))], "itself"),
        ] {
            let e = desired(&conf(false), &CniResult { ips, ..Default::default() }).unwrap_err();
            assert_eq!(e.code, code::INVALID_CONFIG);
            assert!(e.msg.contains(part), "{}", e.msg);
        }
    }
}
