//! ADD: bridge, veth pair (one netlink request, container end created in the container's
//! namespace), port settings, IPAM, container addresses and routes, gateway, firewall.
//!
//! Everything the configuration can get wrong is checked before the first change. Every change
//! is recorded in [`Undo`]; if a later step fails, the attachment is taken apart again (veth,
//! addresses released to IPAM, a bridge this call created), so a failed ADD leaves nothing.

use std::net::IpAddr;
use std::time::Duration;

use cni_common::attachment::AttachmentId;

use crate::identity::BridgeIdentity;
use cni_common::delegate::ipam;
use cni_common::error::{CniError, Context, Result};
use cni_common::mac::Mac;
use cni_common::netlink::{
    Family, Link, LinkKind, LinkSpec, NlError, RouteSpec, VethPeer, IPV4_DEVCONF_ARP_NOTIFY,
};
use cni_common::spec::result::{CniResult, Interface};
use cni_common::sysctl;
use cni_common::Request;
use ipnet::IpNet;

use crate::config::Conf;
use crate::firewall;
use crate::host::{host_veth_name, kubenet_mtu, random_mac, BR_NF_CALL_IPTABLES};
use crate::kernel::{IpamJob, Kernel, Ns, Real, SysctlJob};
use crate::model::{calc_gateways, ipv6_settings, port_flags, port_vlan_plan, route_gateway, BridgeDevice};

/// How long the host veth may take to become operationally up (upstream polls for 2.55 s).
const OPER_UP_TIMEOUT: Duration = Duration::from_millis(2550);
/// How long IPv6 duplicate address detection may take when `enabledad` is set.
const DAD_TIMEOUT: Duration = Duration::from_secs(5);

/// What this ADD changed so far, for taking it apart on failure.
#[derive(Default)]
struct Undo {
    created_bridge: Option<u32>,
    host_veth: Option<u32>,
    /// The container end of a veth pair whose creation's answer was lost.
    container_veth: Option<u32>,
    vlan_gateway: Option<u32>,
    /// The IPAM ADD, while it runs alongside the kernel setup.
    ipam_pending: Option<IpamJob>,
    ipam: bool,
    firewall: bool,
}

impl Undo {
    fn run(mut self, k: &mut dyn Kernel) {
        if let Some(p) = self.ipam_pending.take() {
            // It may have reserved addresses before we failed: wait, then release them.
            self.ipam |= p().is_ok();
        }
        if self.firewall {
            if let Err(e) = k.remove_firewall(true) {
                cni_common::log!("bridge", "undo firewall rules: {e}");
            }
        }
        let links =
            [(Ns::Host, self.host_veth), (Ns::Container, self.container_veth), (Ns::Host, self.vlan_gateway)];
        for (ns, idx) in links.into_iter().filter_map(|(ns, i)| Some((ns, i?))) {
            if let Err(e) = k.link_del(ns, idx) {
                if !e.is_not_found() {
                    cni_common::log!("bridge", "undo veth {idx}: {e}");
                }
            }
        }
        if self.ipam {
            if let Err(e) = k.ipam_del() {
                cni_common::log!("bridge", "release addresses after failed ADD: {e}");
            }
        }
        if let Some(br) = self.created_bridge {
            // Only if no other attachment joined it meanwhile.
            match k.links(Ns::Host) {
                Ok(links) if !links.iter().any(|l| l.master == Some(br)) => {
                    if let Err(e) = k.link_del(Ns::Host, br) {
                        if !e.is_not_found() {
                            cni_common::log!("bridge", "undo bridge {br}: {e}");
                        }
                    }
                }
                Ok(_) => {}
                Err(e) => cni_common::log!("bridge", "undo bridge {br}: {e}"),
            }
        }
    }
}

/// For `isGateway`: a bridge that is there gets a MAC of its own, as v1.10 does
/// (containernetworking/plugins#1265): one that follows its ports changes MAC as pods come
/// and go (cni#285), and one that lost its last port has the zero MAC, which is replaced by
/// a random one (no peer can hold the old one). Unlike v1.10, a bridge whose MAC is already
/// its own is left alone: setting a MAC, even the one it has, makes the kernel flush the
/// bridge's ARP and neighbour tables (`NETDEV_CHANGEADDR`), on every pod's ADD. When the
/// state cannot be read ([`Kernel::mac_pinned`] `None`) the MAC is set, as v1.10 does.
/// Returns whether the bridge's MAC is now its own.
fn pin_mac(k: &mut dyn Kernel, br: &mut Link) -> Result<bool> {
    if k.mac_pinned(br) == Some(true) {
        return Ok(true);
    }
    let mac = match br.mac {
        Some(m) if m != [0; 6] => m,
        _ => random_mac(),
    };
    k.link_set_mac(Ns::Host, br.index, mac)
        .with_context(|| format!("could not set the MAC of bridge {:?}", br.name))?;
    br.mac = Some(mac);
    Ok(true)
}

fn vlan_unsupported(conf: &Conf, e: &NlError) -> CniError {
    let (key, value) = if conf.vlan != 0 {
        ("vlan", conf.vlan.to_string())
    } else {
        ("vlanTrunk", format!("{:?}", conf.trunk))
    };
    CniError::unsupported_field(
        key,
        value,
        "this kernel has no bridge VLAN filtering (CONFIG_BRIDGE_VLAN_FILTERING): remove vlan/vlanTrunk or use a kernel that supports it",
    )
    .with_details(e.to_string())
}

/// One ADD: the request, its validated configuration, the kernel it works through and what it
/// changed so far. Built by [`Add::prepare`] without changing anything.
struct Add<'r, 'k> {
    req: &'r Request,
    conf: Conf,
    k: &'k mut dyn Kernel,
    /// The MTU for a new bridge and both veth ends (`mtu`, or kubenet's choice with `autoMtu`).
    mtu: Option<u32>,
    undo: Undo,
}

pub fn add(req: &Request) -> Result<CniResult> {
    let conf = Conf::from_request(req)?;
    conf.check_version(req.version)?;
    if conf.l3 {
        ipam::path(req)?;
    }
    let nft = if conf.ip_masq || conf.macspoofchk { Some(firewall::open()?) } else { None };
    let mut k = Real::new(req, req.require_netns()?)?.with_nft(nft);
    add_with(&mut k, req, conf)
}

/// ADD through the seam `k`, with `conf` validated.
pub(crate) fn add_with(k: &mut dyn Kernel, req: &Request, conf: Conf) -> Result<CniResult> {
    let mut a = Add::prepare(k, req, conf)?;
    // The container's IPv6 helper starts before anything is reserved or created: if it cannot
    // start, the ADD fails having changed nothing. From here on every failure is undone.
    let v6conf = a.k.container_sysctls()?;
    match a.run(v6conf) {
        Ok(r) => Ok(r),
        Err(e) => {
            let undo = std::mem::take(&mut a.undo);
            undo.run(a.k);
            Err(e)
        }
    }
}

/// `bridgeNfCallIptables` needs br_netfilter: without it ADD could never work (code 50), which
/// ADD and STATUS both say.
fn require_br_netfilter(k: &mut dyn Kernel, conf: &Conf) -> Result<()> {
    if conf.bridge_nf_call_iptables {
        crate::host::br_netfilter_present(k.sysctl_get(BR_NF_CALL_IPTABLES).is_ok())?;
    }
    Ok(())
}

impl<'r, 'k> Add<'r, 'k> {
    /// Validation: everything the configuration can get wrong, and conflicts that would make
    /// setup fail halfway, are refused here, before anything is reserved or created.
    fn prepare(k: &'k mut dyn Kernel, req: &'r Request, conf: Conf) -> Result<Add<'r, 'k>> {
        require_br_netfilter(k, &conf)?;
        if let Some(l) = k.link_by_name(Ns::Host, &conf.bridge)? {
            if l.kind.as_deref() != Some("bridge") {
                return Err(CniError::config(format!(
                    "{:?} already exists but is not a bridge ({}): name another bridge in \"bridge\"",
                    conf.bridge,
                    l.kind.as_deref().unwrap_or("a device without a link type")
                )));
            }
        }
        if k.link_by_name(Ns::Container, &req.env.ifname)?.is_some() {
            return Err(CniError::internal(format!(
                "container veth name provided ({}) already exists",
                req.env.ifname
            )));
        }
        let mtu = match conf.mtu {
            Some(m) => Some(m),
            None if conf.auto_mtu => Some(kubenet_mtu(&k.links(Ns::Host)?)),
            None => None,
        };
        Ok(Add { req, conf, k, mtu, undo: Undo::default() })
    }

    fn set_if_present(&mut self, key: &str, value: &str) -> Result<()> {
        set_if_present(self.k, key, value)
    }

    fn ifname(&self) -> &'r str {
        self.req.env.ifname.as_str()
    }

    fn attachment(&self) -> AttachmentId {
        AttachmentId::of(self.req)
    }

    /// Everything that changes the host; the caller undoes it on failure.
    fn run(&mut self, v6conf: SysctlJob) -> Result<CniResult> {
        // The IPAM delegate runs while we build the bridge and the veth pair — except with
        // VLANs, which a kernel may not support: then nothing is reserved before they are in
        // place.
        if self.conf.l3 && !self.conf.uses_vlans() {
            self.undo.ipam_pending = Some(self.k.ipam_add()?);
        }
        let (mut br, br_pinned) = self.ensure_bridge()?;
        let hv = self.create_veth(br.index)?;
        let ctr_index =
            hv.link.ok_or_else(|| CniError::internal(format!("veth {} reports no peer", hv.name)))?;
        self.configure_port(&hv)?;
        let ctr_mac = match self.conf.mac {
            Some(m) => m,
            None => self.k.link_by_index(Ns::Container, ctr_index)?.and_then(|l| l.mac).map(Mac).ok_or_else(
                || CniError::internal(format!("container interface {} vanished", self.ifname())),
            )?,
        };
        let mut result = CniResult {
            interfaces: vec![
                Interface { name: br.name.clone(), mac: Mac::text(br.mac), ..Default::default() },
                Interface { name: hv.name.clone(), mac: Mac::text(hv.mac), ..Default::default() },
                Interface {
                    name: self.ifname().to_string(),
                    mac: ctr_mac.to_string(),
                    sandbox: self.req.env.netns.clone(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let gateways = if self.conf.l3 { self.addresses(&mut result)? } else { Vec::new() };
        self.configure_container(ctr_index, &result, v6conf)?;
        // (none without isGateway or IPAM)
        self.gateways(&mut br, &gateways, &mut result)?;
        if self.conf.bridge_nf_call_iptables {
            self.k.sysctl_set(BR_NF_CALL_IPTABLES, "1")?;
            if result.ips.iter().any(|i| i.address.addr().is_ipv6()) {
                self.k.sysctl_set("net/bridge/bridge-nf-call-ip6tables", "1")?;
            }
        }
        self.firewall(&result, &hv, ctr_mac)?;
        if self.undo.created_bridge.is_some() {
            self.note_forward_drops(&result);
        }
        if !self.conf.disable_container_interface {
            self.wait_port_up(&hv)?;
        }
        if !br_pinned {
            if let Some(cur) = self.k.link_by_index(Ns::Host, br.index)? {
                br = cur;
            }
        }
        result.interfaces[0].mac = Mac::text(br.mac);
        if let Some(dns) = &self.conf.dns {
            result.dns = dns.clone();
        }
        Ok(result)
    }

    /// When this ADD made the bridge (the first pod of the network on this host): say on
    /// stderr if another table's forward chain drops the pods' subnets (Docker's FORWARD
    /// policy DROP, firewalld's zones), naming the chain and the fix (the `firewall` plugin in
    /// the chain). A note, not a failure: a `firewall` plugin later in the chain opens the drop
    /// per pod, and the cost (reading the forward chains) is paid once per bridge, not per pod.
    fn note_forward_drops(&mut self, result: &CniResult) {
        let mut subnets: Vec<IpNet> = result.ips.iter().map(|i| i.address.trunc()).collect();
        subnets.dedup();
        for net in subnets {
            if let Some(m) = self.k.forward_drop_note(net) {
                cni_common::log!("bridge", "note: {m}");
            }
        }
    }

    /// The host end as a bridge port: no router advertisements, flags, VLANs.
    fn configure_port(&mut self, hv: &Link) -> Result<()> {
        // CVE-2020-10749: the host must not learn routes from router advertisements sent by the
        // container. The container end is still down, so nothing can have arrived yet.
        self.set_if_present(&sysctl::iface_key("ipv6", &hv.name, "accept_ra"), "0")?;
        let conf = &self.conf;
        let flags = port_flags(conf);
        if flags.any_on() {
            self.k
                .bridge_port_set(hv.index, &flags, false)
                .with_context(|| format!("failed to set bridge port flags on {}", hv.name))?;
        }
        if conf.uses_vlans() {
            setup_port_vlans(self.k, hv.index, conf.vlan, &conf.trunk, conf.preserve_default_vlan).map_err(
                |e| if e.is_unsupported() { vlan_unsupported(conf, &e) } else { CniError::from(e) },
            )?;
        }
        Ok(())
    }

    /// The IPAM result in `result` (addresses, routes, DNS); returns the gateway addresses for
    /// the bridge.
    fn addresses(&mut self, result: &mut CniResult) -> Result<Vec<IpNet>> {
        let pending = match self.undo.ipam_pending.take() {
            Some(p) => p,
            None => self.k.ipam_add()?,
        };
        // A delegate that failed reserved nothing (and releasing would free what an earlier
        // ADD of the same attachment holds); one whose output we cannot use has reserved.
        let out = pending()?;
        self.undo.ipam = true;
        let r = ipam::decode_result(self.req, &out)?;
        if r.ips.is_empty() {
            return Err(CniError::internal("IPAM plugin returned missing IP config"));
        }
        result.ips = r.ips;
        result.routes = r.routes;
        result.dns = r.dns;
        Ok(calc_gateways(result, &self.conf))
    }

    /// `isGateway`: the gateway addresses on the bridge (or the VLAN gateway), forwarding on.
    fn gateways(&mut self, br: &mut Link, gateways: &[IpNet], result: &mut CniResult) -> Result<()> {
        let mut vlan_if = None;
        for gw in gateways {
            if self.conf.vlan != 0 {
                let l = self.ensure_vlan_gateway(br)?;
                ensure_addr(self.k, &l, *gw, self.conf.force_address)?;
                vlan_if.get_or_insert(l);
            } else {
                ensure_addr(self.k, br, *gw, self.conf.force_address)?;
            }
        }
        if let Some(l) = vlan_if {
            result.interfaces.push(Interface {
                name: l.name.clone(),
                mac: Mac::text(l.mac),
                ..Default::default()
            });
        }
        if gateways.iter().any(|g| g.addr().is_ipv4()) {
            crate::forwarding::enable_v4(self.k)?;
        }
        if gateways.iter().any(|g| g.addr().is_ipv6()) {
            crate::forwarding::enable_v6(self.k)?;
        }
        Ok(())
    }

    /// `ipMasq` and `macspoofchk` rules, in one transaction.
    fn firewall(&mut self, result: &CniResult, hv: &Link, ctr_mac: Mac) -> Result<()> {
        if !self.conf.ip_masq && !self.conf.macspoofchk {
            return Ok(());
        }
        let att = AttachmentId::of(self.req);
        let addrs: Vec<IpNet> = result.ips.iter().map(|i| i.address).collect();
        self.undo.firewall = true;
        let masq = self.conf.ip_masq.then_some((addrs.as_slice(), self.conf.non_masquerade.as_deref()));
        let spoof = self.conf.macspoofchk.then_some((hv.name.as_str(), ctr_mac));
        firewall::apply_add(self.k.nft()?, &att, masq, spoof)
    }

    /// The host veth must become operationally up (upstream waits for it too).
    fn wait_port_up(&mut self, hv: &Link) -> Result<()> {
        match self.k.wait_link_oper_up(hv.index, OPER_UP_TIMEOUT) {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err(CniError::internal(format!("host veth {} vanished", hv.name))),
            Err(e) if e.errno() == libc::ETIMEDOUT => {
                Err(CniError::internal(format!("bridge port in error state: {}", hv.name))
                    .with_details(e.to_string()))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The bridge, created when missing as the configuration describes it ([`BridgeDevice`]),
    /// or brought to it, up, with `accept_ra=0`. Returns whether its MAC is pinned by this call
    /// (created with a random MAC, which the kernel then never replaces by a port's).
    fn ensure_bridge(&mut self) -> Result<(Link, bool)> {
        let conf = &self.conf;
        let want = BridgeDevice::of(conf, self.mtu);
        let name = conf.bridge.as_str();
        let (br, created) = match self.k.link_by_name(Ns::Host, name)? {
            Some(l) => (l, false),
            None => match self.k.link_add(&want.spec(random_mac()), false) {
                Ok(l) => {
                    self.undo.created_bridge = Some(l.index);
                    (l, true)
                }
                Err(e) if e.is_exists() => {
                    let l = self
                        .k
                        .link_by_name(Ns::Host, name)?
                        .ok_or_else(|| CniError::internal(format!("could not lookup {name:?}")))?;
                    (l, false)
                }
                Err(e) if e.is_unsupported() && conf.uses_vlans() => return Err(vlan_unsupported(conf, &e)),
                Err(e) if answer_lost(&e) => {
                    // made or not? a bridge of this name now is taken back like one made
                    // (only while it has no port, as any bridge this ADD made)
                    if let Ok(Some(l)) = self.k.link_by_name(Ns::Host, name) {
                        self.undo.created_bridge = Some(l.index);
                    }
                    return Err(CniError::from(e).context(format_args!("failed to create bridge {name:?}")));
                }
                Err(e) => {
                    return Err(CniError::from(e).context(format_args!("failed to create bridge {name:?}")))
                }
            },
        };
        if br.kind.as_deref() != Some("bridge") {
            return Err(CniError::internal(format!("{name:?} already exists but is not a bridge")));
        }
        let mut br = br;
        let pinned = created || (conf.is_gateway && pin_mac(self.k, &mut br)?);
        let changes = want.changes(&br);
        if changes.promisc {
            self.k
                .link_set_promisc(Ns::Host, br.index, true)
                .with_context(|| format!("could not set promiscuous mode on {name:?}"))?;
        }
        if !changes.opts.is_empty() {
            self.k
                .bridge_set(br.index, &changes.opts)
                .with_context(|| format!("could not set the options of bridge {name:?}"))?;
        }
        // We own the routes of this interface.
        let key = sysctl::iface_key("ipv6", name, "accept_ra");
        self.set_if_present(&key, "0")?;
        if changes.up {
            self.k.link_set_up(Ns::Host, br.index)?;
        }
        Ok((br, pinned))
    }

    /// The veth pair in one request: the host end (random name, MTU, up, enslaved to the
    /// bridge; with macspoofchk an alias saying whose it is, which GC needs) and the container
    /// end created directly in the container namespace (CNI_IFNAME, MTU, MAC).
    fn create_veth(&mut self, bridge: u32) -> Result<Link> {
        let ifname = self.ifname();
        let alias = self.conf.macspoofchk.then(|| self.attachment().veth_alias());
        let mut last = None;
        for _ in 0..10 {
            let peer = VethPeer {
                name: ifname.to_string(),
                mtu: None,
                mac: self.conf.mac.map(|m| m.0),
                netns: None,
                up: false,
            };
            let spec = LinkSpec {
                mtu: self.mtu,
                up: true,
                master: Some(bridge),
                alias: alias.clone(),
                ..LinkSpec::new(host_veth_name(), LinkKind::Veth { peer })
            };
            match self.k.link_add(&spec, true) {
                Ok(l) => {
                    self.undo.host_veth = Some(l.index);
                    return Ok(l);
                }
                Err(e) if e.is_exists() => {
                    if self.k.link_by_name(Ns::Container, ifname)?.is_some() {
                        return Err(CniError::internal(format!(
                            "container veth name provided ({ifname}) already exists"
                        )));
                    }
                    last = Some(e); // the random host name was taken: try another
                }
                Err(e) => {
                    // CNI_IFNAME was free (checked before): if it exists now, the pair was made
                    // and only the answer went missing
                    if answer_lost(&e) {
                        if let Ok(Some(c)) = self.k.link_by_name(Ns::Container, ifname) {
                            self.undo.container_veth = Some(c.index);
                        }
                    }
                    return Err(CniError::from(e).context("failed to create veth pair"));
                }
            }
        }
        Err(CniError::internal(format!(
            "failed to find a free host veth name: {}",
            last.map(|e| e.to_string()).unwrap_or_default()
        )))
    }
}

/// VLANs of a new bridge port: unless `preserve_default`, whatever the port got by default is
/// removed first; then the access VLAN (PVID, untagged) — VLAN 1 for a trunk without one — and
/// the trunk VIDs, tagged.
fn setup_port_vlans(
    host: &mut dyn Kernel,
    port: u32,
    vlan: u16,
    trunk: &[u16],
    preserve_default: bool,
) -> std::result::Result<(), NlError> {
    if !preserve_default {
        let existing: Vec<u16> = host.bridge_port_vlans(port)?.iter().map(|v| v.vid).collect();
        host.bridge_vlan_del(port, &existing)?;
    }
    host.bridge_vlan_add(port, &port_vlan_plan(vlan, trunk))
}

impl Add<'_, '_> {
    /// `<bridge>.<vlan>`: a veth whose one end joins the bridge as an access port of the VLAN
    /// and whose other end (in the host) carries the gateway address (upstream's VLAN gateway).
    fn ensure_vlan_gateway(&mut self, br: &Link) -> Result<Link> {
        let conf = &self.conf;
        let host = &mut *self.k;
        let name = format!("{}.{}", br.name, conf.vlan);
        if name.len() > 15 {
            return Err(CniError::config(format!(
                "VLAN gateway interface name {name:?} is longer than 15 bytes: use a shorter bridge name"
            )));
        }
        if let Some(l) = host.link_by_name(Ns::Host, &name)? {
            return Ok(l);
        }
        let peer = VethPeer { name: name.clone(), mtu: None, mac: None, netns: None, up: true };
        let spec = LinkSpec {
            mtu: self.mtu.or(Some(br.mtu)),
            up: true,
            master: Some(br.index),
            ..LinkSpec::new(host_veth_name(), LinkKind::Veth { peer })
        };
        let port = host.link_add(&spec, false).context("failed to create vlan gateway")?;
        self.undo.vlan_gateway = Some(port.index);
        set_if_present(host, &sysctl::iface_key("ipv6", &port.name, "accept_ra"), "0")?;
        setup_port_vlans(host, port.index, conf.vlan, &[], conf.preserve_default_vlan).map_err(|e| {
            if e.is_unsupported() {
                vlan_unsupported(conf, &e)
            } else {
                CniError::from(e)
            }
        })?;
        host.link_by_name(Ns::Host, &name)?
            .ok_or_else(|| CniError::internal(format!("VLAN gateway {name} vanished")))
    }

    /// Container side: IPv6 sysctls, then arp_notify and link up in one request, addresses,
    /// routes.
    fn configure_container(&mut self, index: u32, result: &CniResult, v6conf: SysctlJob) -> Result<()> {
        let (conf, k, ifname) = (&self.conf, &mut *self.k, self.req.env.ifname.as_str());
        let has_v6 = result.ips.iter().any(|i| i.address.addr().is_ipv6());
        v6conf(ipv6_settings(ifname, conf, has_v6)).context("failed to configure IPv6 in the container")?;
        let up = !conf.disable_container_interface;
        k.link_set_ipv4_conf(Ns::Container, index, &[(IPV4_DEVCONF_ARP_NOTIFY, 1)], up)
            .with_context(|| format!("failed to set {ifname:?} up"))?;
        if !up {
            return Ok(());
        }
        for ip in &result.ips {
            k.addr_add(Ns::Container, index, ip.address)
                .with_context(|| format!("failed to add IP addr {} to {ifname:?}", ip.address))?;
        }
        let v6gw = result.ips.iter().find_map(|i| i.gateway.filter(IpAddr::is_ipv6));
        // With an IPv6 gateway, routes wait until no address is tentative (as upstream): with
        // DAD on, the kernel's DAD verdict; with DAD off, the moment the kernel clears the
        // flag (its DAD work runs after the address is added), so that ADD never returns an
        // address the container cannot bind yet.
        if v6gw.is_some() {
            k.wait_addrs_settled(index, Some(Family::V6), DAD_TIMEOUT)?;
        }
        for r in &result.routes {
            let gw = route_gateway(&result.ips, r);
            let spec = RouteSpec {
                gw,
                oif: Some(index),
                table: r.table,
                priority: r.priority,
                scope: r.scope,
                mtu: r.mtu,
                advmss: r.advmss,
                append: true,
                ..RouteSpec::new(r.dst)
            };
            let via = gw.map(|g| g.to_string()).unwrap_or_else(|| "<nil>".into());
            k.route_add(Ns::Container, &spec)
                .with_context(|| format!("failed to add route '{} via {via} dev {ifname}'", r.dst))?;
        }
        Ok(())
    }
}

/// Put `gw` on `link` the way upstream does: nothing if present; another IPv4 address, or an
/// overlapping IPv6 one, is an error unless `force` (then it is replaced). Returns whether the
/// address was added.
fn ensure_addr(host: &mut dyn Kernel, link: &Link, gw: IpNet, force: bool) -> Result<bool> {
    let family = Family::of(&gw.addr());
    let addrs = host.addrs(Ns::Host, Some(link.index), Some(family))?;
    if addrs.iter().any(|a| a.addr == gw) {
        return Ok(false);
    }
    for a in &addrs {
        if family == Family::V4 || a.addr.contains(&gw.addr()) || gw.contains(&a.addr.addr()) {
            if !force {
                return Err(CniError::internal(format!(
                    "{:?} already has an IP address different from {gw}",
                    link.name
                ))
                .with_details(format!("it has {}; set \"forceAddress\": true to replace it", a.addr)));
            }
            host.addr_del(Ns::Host, link.index, a.addr)
                .with_context(|| format!("could not remove IP address from {:?}", link.name))?;
        }
    }
    match host.addr_add(Ns::Host, link.index, gw) {
        Ok(()) => Ok(true),
        Err(e) if e.is_exists() => Ok(false),
        Err(e) => Err(CniError::from(e).context(format_args!("could not add IP address to {:?}", link.name))),
    }
}

/// The kernel may have done what was asked: the answer did not arrive (a receive deadline, a
/// full socket buffer).
fn answer_lost(e: &NlError) -> bool {
    matches!(e.errno, libc::ETIMEDOUT | libc::ENOBUFS)
}

/// Write a per-interface sysctl; a key that does not exist (IPv6 disabled) is skipped.
fn set_if_present(k: &mut dyn Kernel, key: &str, value: &str) -> Result<()> {
    if k.sysctl_exists(key) {
        k.sysctl_set(key, value)?;
    }
    Ok(())
}
