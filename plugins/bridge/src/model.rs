//! The attachment as it should be, derived without touching the kernel from the configuration
//! and the addresses (IPAM's result for ADD, prevResult for CHECK and resync): the bridge device
//! itself, gateways and default routes, the gateway a route goes through, the port's flags and
//! VLANs, the container's IPv6 settings, which interface of a result is the container's. ADD
//! builds from it, CHECK and resync judge against it: nothing here is derived twice.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use cni_common::error::{CniError, Result};
use cni_common::netlink::{
    BridgeOpt, BridgeOpts, Link, LinkKind, LinkSpec, OptValue, PortFlag, PortFlags, PortVlan,
};
use cni_common::spec::result::{CniResult, IpConfig, Route};
use cni_common::sysctl;
use ipnet::IpNet;

use crate::config::Conf;

/// When an option of the bridge device that a key sets takes effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settle {
    /// Only a bridge this ADD creates gets it; a bridge that exists is left as its owner made
    /// it, and CHECK does not judge it.
    AtCreation,
    /// ADD brings every bridge of the network to it, one that exists too; CHECK judges it.
    Always,
}

/// An option of the bridge device a key sets: how CHECK names it, the key (when the name is not
/// the key), the kernel's option (any integer `IFLA_BR_*` attribute: `BridgeOpt(n)` when
/// cni-common has no constant for it), the configuration's value (`None`: the key leaves the
/// option alone) and when it takes effect.
type BridgeOptKey = (&'static str, &'static str, BridgeOpt, fn(&Conf) -> Option<OptValue>, Settle);

/// Every option of the bridge device the configuration sets. ADD creates the bridge with them
/// and brings an existing one to the `Always` ones ([`BridgeDevice`]); CHECK judges those. A key
/// that sets a bridge option is its field in `config.rs` and one entry here.
pub(crate) const BRIDGE_OPTS: [BridgeOptKey; 1] = [
    // sent only to turn filtering on: a kernel without it refuses the attribute even as 0
    (
        "VLAN filtering",
        "vlan/vlanTrunk ",
        BridgeOpt::VLAN_FILTERING,
        |c| c.uses_vlans().then_some(OptValue::U8(1)),
        Settle::AtCreation,
    ),
];

/// The bridge device as the configuration wants it. ADD creates it from this
/// ([`BridgeDevice::spec`]) or brings the bridge that exists to it ([`BridgeDevice::changes`]);
/// CHECK judges the bridge against it ([`BridgeDevice::drift`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BridgeDevice {
    pub name: String,
    /// A new bridge's MTU (`mtu`, or kubenet's choice with `autoMtu`): a bridge that exists
    /// keeps its own.
    pub mtu: Option<u32>,
    /// `promiscMode`: turned on when asked (never off: another network may have asked);
    /// CHECK wants exactly this.
    pub promisc: bool,
    /// The options a new bridge is created with.
    pub create: BridgeOpts,
    /// The options every bridge of the network is brought to, and judged by.
    pub keep: BridgeOpts,
}

/// What ADD changes on a bridge that exists to make it the [`BridgeDevice`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct BridgeChanges {
    pub promisc: bool,
    pub opts: BridgeOpts,
    pub up: bool,
}

impl BridgeDevice {
    pub(crate) fn of(conf: &Conf, mtu: Option<u32>) -> BridgeDevice {
        let (mut create, mut keep) = (BridgeOpts::default(), BridgeOpts::default());
        for (_, _, opt, want, settle) in BRIDGE_OPTS {
            if let Some(v) = want(conf) {
                create.set(opt, v);
                if settle == Settle::Always {
                    keep.set(opt, v);
                }
            }
        }
        BridgeDevice { name: conf.bridge.clone(), mtu, promisc: conf.promisc, create, keep }
    }

    /// The request that creates the bridge, up, with `mac` (a random one: the kernel then never
    /// replaces it by a port's).
    pub(crate) fn spec(&self, mac: [u8; 6]) -> LinkSpec<'static> {
        LinkSpec {
            mtu: self.mtu,
            mac: Some(mac),
            up: true,
            ..LinkSpec::new(self.name.clone(), LinkKind::Bridge { opts: self.create.clone() })
        }
    }

    /// What `have` (a bridge that exists) needs to become this one.
    pub(crate) fn changes(&self, have: &Link) -> BridgeChanges {
        let now = |o| have.bridge.as_ref().and_then(|b| b.get(o));
        let mut opts = BridgeOpts::default();
        for (opt, v) in self.keep.iter().filter(|(o, v)| now(*o) != Some(v.get())) {
            opts.set(opt, v);
        }
        BridgeChanges { promisc: self.promisc && !have.promisc(), opts, up: !have.up() }
    }

    /// The first way `have` differs from this bridge, as CHECK reports it. An option the kernel
    /// does not report cannot be judged.
    pub(crate) fn drift(&self, have: &Link) -> Option<String> {
        if have.promisc() != self.promisc {
            return Some(format!(
                "Bridge interface {} configured Promisc Mode {} doesn't match current state: {}",
                have.name,
                self.promisc,
                have.promisc()
            ));
        }
        let (opt, want, cur) = self.keep.iter().find_map(|(opt, want)| {
            let cur = have.bridge.as_ref()?.get(opt).filter(|v| *v != want.get())?;
            Some((opt, want.get(), cur))
        })?;
        let (name, key) = match BRIDGE_OPTS.iter().find(|row| row.2 == opt) {
            Some((name, key, ..)) => (name.to_string(), *key),
            None => (format!("option {}", opt.0), ""),
        };
        Some(format!("Bridge interface {} {name} is {cur}, configured {key}{want}", have.name))
    }
}

/// A port flag a key sets: how CHECK names it, the key (when the name is not the key), the
/// kernel's flag (any one-byte `IFLA_BRPORT_*` attribute: `PortFlag(n)` when cni-common has no
/// constant for it), and the configuration's value.
type PortFlagKey = (&'static str, &'static str, PortFlag, fn(&Conf) -> bool);

/// Every port flag the configuration sets. ADD sends them all when any is on ([`port_flags`]);
/// CHECK judges each ([`port_flag_drift`]). A key that sets a port flag is its field in
/// `config.rs` and one line here.
pub(crate) const PORT_FLAGS: [PortFlagKey; 2] = [
    ("hairpin mode", "", PortFlag::HAIRPIN, |c| c.hairpin),
    ("isolation", "portIsolation ", PortFlag::ISOLATED, |c| c.port_isolation),
];

/// The host port's flags as the configuration wants them.
pub(crate) fn port_flags(conf: &Conf) -> PortFlags {
    let mut flags = PortFlags::default();
    for (_, _, flag, want) in PORT_FLAGS {
        flags.set(flag, want(conf));
    }
    flags
}

/// The first port flag of port `port` that differs from the wanted one, as CHECK reports it.
pub(crate) fn port_flag_drift(port: &str, have: &PortFlags, want: &PortFlags) -> Option<String> {
    PORT_FLAGS.iter().find(|(_, _, f, _)| have.get(*f) != want.get(*f)).map(|(name, key, f, _)| {
        format!("bridge port {port} {name} is {}, configured {key}{}", have.get(*f), want.get(*f))
    })
}

/// The VLAN entries a port gets for `vlan`/`vlanTrunk`, in request order.
pub(crate) fn port_vlan_plan(vlan: u16, trunk: &[u16]) -> Vec<PortVlan> {
    let mut plan = Vec::new();
    if vlan != 0 {
        plan.push(PortVlan::access(vlan));
    } else if !trunk.is_empty() {
        plan.push(PortVlan::access(1)); // native VLAN of the trunk
    }
    plan.extend(trunk.iter().map(|v| PortVlan::tagged(*v)));
    plan
}

fn first_host(net: &IpNet) -> IpAddr {
    match net.trunc().addr() {
        IpAddr::V4(a) => IpAddr::V4(Ipv4Addr::from(u32::from(a).wrapping_add(1))),
        IpAddr::V6(a) => IpAddr::V6(Ipv6Addr::from(u128::from(a).wrapping_add(1))),
    }
}

/// Upstream's `calcGateways`: every address belongs to the container interface (index 2); with
/// `isGateway` a missing gateway is the subnet's first address; with `isDefaultGateway` a default
/// route per family is added unless one with a gateway is there. Returns the gateway addresses
/// (with the container's prefix length) for the bridge.
pub(crate) fn calc_gateways(result: &mut CniResult, conf: &Conf) -> Vec<IpNet> {
    let mut gws = Vec::new();
    let mut default_done = [false, false];
    for i in 0..result.ips.len() {
        let ip = &mut result.ips[i];
        ip.interface = Some(2);
        if ip.gateway.is_none() && conf.is_gateway {
            ip.gateway = Some(first_host(&ip.address));
        }
        let (v4, gw, prefix) = (ip.address.addr().is_ipv4(), ip.gateway, ip.address.prefix_len());
        let fam = if v4 { 0 } else { 1 };
        if conf.is_default_gateway && !default_done[fam] {
            let default: IpNet = if v4 { "0.0.0.0/0".parse().unwrap() } else { "::/0".parse().unwrap() };
            if !result.routes.iter().any(|r| r.gw.is_some() && r.dst == default) {
                result.routes.push(Route::new(default, gw));
            }
            default_done[fam] = true;
        }
        if conf.is_gateway {
            if let Some(g) = gw {
                if let Ok(n) = IpNet::new(g, prefix) {
                    if !gws.contains(&n) {
                        gws.push(n);
                    }
                }
            }
        }
    }
    gws
}

/// The container's IPv6 settings: DAD off (or enhanced DAD on with `enabledad`); with IPv6
/// addresses, IPv6 enabled on `lo` and the interface and addresses kept when it goes down.
/// (key, value, whether failing to write it is an error — DAD keys are best effort as upstream:
/// a namespace without IPv6 has none.)
pub(crate) fn ipv6_settings(ifname: &str, conf: &Conf, has_v6: bool) -> Vec<(String, &'static str, bool)> {
    let key = |dev: &str, leaf: &str| sysctl::iface_key("ipv6", dev, leaf);
    let mut list = Vec::new();
    if conf.enable_dad {
        list.push((key(ifname, "enhanced_dad"), "1", false));
        list.push((key(ifname, "accept_dad"), "1", false));
    } else {
        list.push((key(ifname, "accept_dad"), "0", false));
    }
    if has_v6 {
        list.push((key("lo", "disable_ipv6"), "0", true));
        list.push((key(ifname, "disable_ipv6"), "0", true));
        list.push((key(ifname, "keep_addr_on_down"), "1", false));
    }
    list
}

/// The gateway route `r` goes through: its own, else the gateway of the first address of its
/// family that has one (upstream's rule, for ADD and CHECK alike).
pub(crate) fn route_gateway(ips: &[IpConfig], r: &Route) -> Option<IpAddr> {
    let v4 = r.dst.addr().is_ipv4();
    r.gw.or_else(|| ips.iter().filter(|i| i.address.addr().is_ipv4() == v4).find_map(|i| i.gateway))
}

/// The container interface of prevResult (`ifname` in sandbox `netns`): its position in
/// `interfaces` and the addresses prevResult puts on it.
pub(crate) fn container_of(prev: &CniResult, ifname: &str, netns: &str) -> Result<(usize, Vec<IpNet>)> {
    let pos =
        prev.interfaces.iter().position(|i| i.name == ifname && i.sandbox == netns).ok_or_else(|| {
            CniError::internal(format!("prevResult lists no interface {ifname:?} in sandbox {netns:?}"))
        })?;
    let addrs = prev.ips.iter().filter(|i| i.interface.is_none_or(|x| x == pos)).map(|i| i.address).collect();
    Ok((pos, addrs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_flags_follow_their_keys_and_check_names_each_drift() {
        let none = port_flags(&conf(json!({})));
        assert_eq!(none, PortFlags::from([(PortFlag::HAIRPIN, false), (PortFlag::ISOLATED, false)]));
        assert!(!none.any_on());
        let both = port_flags(&conf(json!({"hairpinMode": true, "portIsolation": true})));
        assert_eq!(both, PortFlags::from([(PortFlag::HAIRPIN, true), (PortFlag::ISOLATED, true)]));
        assert_eq!(port_flag_drift("veth1", &both, &both), None);
        assert_eq!(
            port_flag_drift("veth1", &none, &both).as_deref(),
            Some("bridge port veth1 hairpin mode is false, configured true")
        );
        let only_hairpin = PortFlags::from([(PortFlag::HAIRPIN, true), (PortFlag::ISOLATED, false)]);
        assert_eq!(
            port_flag_drift("veth1", &only_hairpin, &both).as_deref(),
            Some("bridge port veth1 isolation is false, configured portIsolation true")
        );
        assert_eq!(
            port_flag_drift("veth1", &both, &only_hairpin).as_deref(),
            Some("bridge port veth1 isolation is true, configured portIsolation false")
        );
    }
    #[test]
    fn the_bridge_device_is_created_as_configured_and_an_existing_one_brought_to_what_is_kept() {
        let mtu = Some(1400);
        let plain = BridgeDevice::of(&conf(json!({"bridge": "br7"})), mtu);
        assert_eq!(plain.name, "br7");
        assert!(plain.create.is_empty() && plain.keep.is_empty() && !plain.promisc);
        let vlan = BridgeDevice::of(&conf(json!({"vlan": 10, "promiscMode": true})), mtu);
        let filtering = BridgeOpts::default().with(BridgeOpt::VLAN_FILTERING, OptValue::U8(1));
        assert_eq!(vlan.create, filtering);
        assert!(vlan.keep.is_empty(), "VLAN filtering is set at creation only");
        assert!(vlan.promisc);
        let trunk = BridgeDevice::of(&conf(json!({"vlanTrunk": [{"id": 5}]})), None);
        assert_eq!(trunk.create, filtering);

        let spec = vlan.spec([2, 0, 0, 0, 0, 1]);
        assert_eq!(
            (spec.name.as_str(), spec.mtu, spec.mac, spec.up),
            ("cni0", mtu, Some([2, 0, 0, 0, 0, 1]), true)
        );
        let LinkKind::Bridge { opts } = &spec.kind else { panic!("{spec:?}") };
        assert_eq!(opts, &filtering);

        // An option kept at a value: changed on a bridge that has another, judged by CHECK.
        let ageing = BridgeOpt(4); // IFLA_BR_AGEING_TIME, which no key sets
        let kept =
            BridgeDevice { keep: BridgeOpts::default().with(ageing, OptValue::U32(0)), ..plain.clone() };
        let bridge = |flags: u32, opts: BridgeOpts| Link {
            name: "br7".into(),
            kind: Some("bridge".into()),
            flags,
            bridge: Some(opts),
            ..Link::default()
        };
        let (up, promisc) = (0x1, 0x100);
        let on_off = |v: u8| BridgeOpts::default().with(BridgeOpt::VLAN_FILTERING, OptValue::U8(v));
        let learning = BridgeOpts::default().with(ageing, OptValue::U32(30000));
        let flooding = BridgeOpts::default().with(ageing, OptValue::U32(0));
        let ch = kept.changes(&bridge(0, learning.clone()));
        assert_eq!(ch, BridgeChanges { promisc: false, opts: flooding.clone(), up: true });
        assert_eq!(kept.changes(&bridge(up, flooding.clone())), BridgeChanges::default());
        assert_eq!(kept.changes(&bridge(up, BridgeOpts::default())).opts, flooding, "not reported: sent");
        assert_eq!(
            kept.drift(&bridge(up, learning.clone())).as_deref(),
            Some("Bridge interface br7 option 4 is 30000, configured 0")
        );
        let named = BridgeDevice { keep: filtering.clone(), ..plain.clone() };
        assert_eq!(
            named.drift(&bridge(up, on_off(0))).as_deref(),
            Some("Bridge interface br7 VLAN filtering is 0, configured vlan/vlanTrunk 1"),
            "a row of the table: named by it"
        );
        assert_eq!(kept.drift(&bridge(up, flooding.clone())), None);
        assert_eq!(kept.drift(&bridge(up, BridgeOpts::default())), None, "not reported: cannot be judged");
        // an option only created with is neither changed nor judged
        let on = BridgeOpts::default().with(BridgeOpt::VLAN_FILTERING, OptValue::U8(0));
        assert_eq!(vlan.changes(&bridge(up | promisc, on.clone())), BridgeChanges::default());
        assert_eq!(vlan.drift(&bridge(up | promisc, on)), None);

        // promiscuity: turned on when asked, never off; CHECK wants exactly the configured mode
        assert!(vlan.changes(&bridge(up, BridgeOpts::default())).promisc);
        assert!(!plain.changes(&bridge(up | promisc, BridgeOpts::default())).promisc);
        assert_eq!(
            vlan.drift(&bridge(up, BridgeOpts::default())).as_deref(),
            Some("Bridge interface br7 configured Promisc Mode true doesn't match current state: false")
        );
        assert_eq!(
            plain.drift(&bridge(up | promisc, BridgeOpts::default())).as_deref(),
            Some("Bridge interface br7 configured Promisc Mode false doesn't match current state: true")
        );
    }

    use crate::config::RawConf;
    use cni_common::netlink::PortVlan;
    use cni_common::spec::json;
    use cni_common::spec::result::IpConfig;
    use serde_json::json;

    fn conf(v: serde_json::Value) -> Conf {
        let raw: RawConf = json::from_value(v).unwrap();
        Conf::from_raw(raw, "", true, None).unwrap()
    }

    fn ip(a: &str, gw: Option<&str>) -> IpConfig {
        IpConfig { interface: None, address: a.parse().unwrap(), gateway: gw.map(|g| g.parse().unwrap()) }
    }

    #[test]
    fn gateways_and_default_routes_like_upstream() {
        let mut r = CniResult {
            ips: vec![
                ip("10.1.0.5/24", None),
                ip("fd00:1::5/64", Some("fd00:1::1")),
                ip("fd00:2::5/64", None),
            ],
            ..Default::default()
        };
        let gws = calc_gateways(&mut r, &conf(json!({"isDefaultGateway": true})));
        assert!(r.ips.iter().all(|i| i.interface == Some(2)));
        assert_eq!(r.ips[0].gateway, Some("10.1.0.1".parse().unwrap()));
        assert_eq!(r.ips[2].gateway, Some("fd00:2::1".parse().unwrap()));
        let gw_text: Vec<String> = gws.iter().map(|g| g.to_string()).collect();
        assert_eq!(gw_text, vec!["10.1.0.1/24", "fd00:1::1/64", "fd00:2::1/64"]);
        let routes: Vec<(String, Option<String>)> =
            r.routes.iter().map(|r| (r.dst.to_string(), r.gw.map(|g| g.to_string()))).collect();
        assert_eq!(
            routes,
            vec![("0.0.0.0/0".into(), Some("10.1.0.1".into())), ("::/0".into(), Some("fd00:1::1".into()))]
        );

        // An IPAM default route with a gateway is kept and not duplicated.
        let mut r = CniResult {
            ips: vec![ip("10.1.0.5/24", Some("10.1.0.254"))],
            routes: vec![Route::new("0.0.0.0/0".parse().unwrap(), Some("10.1.0.254".parse().unwrap()))],
            ..Default::default()
        };
        calc_gateways(&mut r, &conf(json!({"isDefaultGateway": true})));
        assert_eq!(r.routes.len(), 1);

        // Without isGateway nothing is invented.
        let mut r = CniResult { ips: vec![ip("10.1.0.5/24", None)], ..Default::default() };
        assert!(calc_gateways(&mut r, &conf(json!({}))).is_empty());
        assert_eq!(r.ips[0].gateway, None);
        assert!(r.routes.is_empty());
    }

    #[test]
    fn vlan_plans() {
        assert_eq!(port_vlan_plan(100, &[]), vec![PortVlan::access(100)]);
        assert_eq!(
            port_vlan_plan(0, &[101, 200]),
            vec![PortVlan::access(1), PortVlan::tagged(101), PortVlan::tagged(200)]
        );
        assert_eq!(port_vlan_plan(100, &[101]), vec![PortVlan::access(100), PortVlan::tagged(101)]);
        assert!(port_vlan_plan(0, &[]).is_empty());
    }

    #[test]
    fn ipv6_settings_turn_dad_off_unless_enabledad_and_enable_ipv6_with_v6_addresses() {
        let list = |dad: bool, v6: bool| -> Vec<(String, &'static str, bool)> {
            ipv6_settings("eth0", &conf(json!({"enabledad": dad})), v6)
        };
        let k = |dev: &str, leaf: &str| format!("net/ipv6/conf/{dev}/{leaf}");
        assert_eq!(list(false, false), vec![(k("eth0", "accept_dad"), "0", false)]);
        assert_eq!(
            list(true, false),
            vec![(k("eth0", "enhanced_dad"), "1", false), (k("eth0", "accept_dad"), "1", false)]
        );
        assert_eq!(
            list(false, true),
            vec![
                (k("eth0", "accept_dad"), "0", false),
                (k("lo", "disable_ipv6"), "0", true),
                (k("eth0", "disable_ipv6"), "0", true),
                (k("eth0", "keep_addr_on_down"), "1", false),
            ]
        );
    }

    #[test]
    fn the_container_interface_is_found_by_name_and_sandbox_with_its_addresses() {
        let prev = CniResult::decode(
            &serde_json::json!({
                "cniVersion": "1.0.0",
                "interfaces": [
                    {"name": "cni0", "mac": "0a:58:0a:01:00:01"},
                    {"name": "eth0"},
                    {"name": "eth0", "sandbox": "/run/netns/other"},
                    {"name": "eth0", "sandbox": "/run/netns/mine"},
                ],
                "ips": [
                    {"address": "10.1.0.5/24", "interface": 3},
                    {"address": "10.1.0.6/24", "interface": 2},
                    {"address": "fd00::5/64"},
                ],
            }),
            cni_common::Version::V1_0_0,
        )
        .unwrap();
        let (pos, addrs) = container_of(&prev, "eth0", "/run/netns/mine").unwrap();
        assert_eq!(pos, 3);
        let want: Vec<IpNet> = vec!["10.1.0.5/24".parse().unwrap(), "fd00::5/64".parse().unwrap()];
        assert_eq!(addrs, want, "its own and those that name no interface");
        let (pos, addrs) = container_of(&prev, "eth0", "/run/netns/other").unwrap();
        assert_eq!((pos, addrs.len()), (2, 2));
        let e = container_of(&prev, "eth1", "/run/netns/mine").unwrap_err();
        assert_eq!(e.msg, r#"prevResult lists no interface "eth1" in sandbox "/run/netns/mine""#);
    }

    #[test]
    fn a_route_goes_through_its_own_gateway_else_the_first_of_its_family() {
        let ips = vec![
            ip("10.1.0.5/24", None),
            ip("10.2.0.5/24", Some("10.2.0.1")),
            ip("fd00:1::5/64", Some("fd00:1::1")),
            ip("fd00:2::5/64", Some("fd00:2::1")),
        ];
        let r =
            |dst: &str, gw: Option<&str>| Route::new(dst.parse().unwrap(), gw.map(|g| g.parse().unwrap()));
        let gw = |s: &str| Some(s.parse::<IpAddr>().unwrap());
        // IPv4, IPv6, and both in one list: each family finds its own
        assert_eq!(route_gateway(&ips, &r("0.0.0.0/0", None)), gw("10.2.0.1"));
        assert_eq!(route_gateway(&ips, &r("::/0", None)), gw("fd00:1::1"));
        assert_eq!(route_gateway(&ips, &r("10.9.0.0/16", Some("10.1.0.254"))), gw("10.1.0.254"));
        assert_eq!(route_gateway(&ips, &r("fd09::/64", Some("fd00:2::fe"))), gw("fd00:2::fe"));
        // an IPv6-first list gives the same answers
        let mut rev = ips.clone();
        rev.reverse();
        assert_eq!(route_gateway(&rev, &r("0.0.0.0/0", None)), gw("10.2.0.1"));
        assert_eq!(route_gateway(&rev, &r("::/0", None)), gw("fd00:2::1"));
        // a family without a gateway: none
        assert_eq!(route_gateway(&ips[..2], &r("::/0", None)), None);
        assert_eq!(route_gateway(&ips[2..], &r("0.0.0.0/0", None)), None);
    }
}
