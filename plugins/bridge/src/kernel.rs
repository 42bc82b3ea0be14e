//! The host seam: every rtnetlink, nf_tables, sysctl and IPAM call an ADD makes, in the host
//! namespace and the container's ([`Ns`]). [`Real`] is the kernel (one netlink socket per
//! namespace, opened once, as before); [`fake::Fake`] (tests) is an in-memory host and
//! container with the kernel's answers (`EEXIST`, `ENOENT`, `EBUSY`, a link that vanishes, a lost
//! reply), so that every failure point of ADD and its undo are tested without root.

use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use cni_common::delegate::{ipam, Pending};
use cni_common::error::{CniError, Result};
use cni_common::netlink::nft::NfTables;
use cni_common::netlink::{
    Address, BridgeOpts, Family, Link, LinkKind, LinkSpec, Netlink, NlError, PortFlags, PortVlan, Route,
    RouteSpec, VethPeer,
};
use cni_common::netns::NetNs;
use cni_common::spec::Command;
use cni_common::sysctl;
use cni_common::Request;

/// What the forward-drop note (`cni_common::forward_drop`) advises first: the plugin of the
/// ecosystem's default lists that accepts each pod's addresses in the dropping chain.
const FORWARD_REMEDY: &str = "add the \"firewall\" plugin after this one in the network's plugin list (it \
                              accepts each pod's addresses in that chain)";

pub use crate::firewall::Nft;

type Nl<T> = std::result::Result<T, NlError>;

/// Which namespace a call is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ns {
    Host,
    Container,
}

/// The container's sysctl writes, started early (see `add::Ipv6Conf`) and given their list
/// later: (key, value, whether failing to write it is an error).
pub type SysctlJob = Box<dyn FnOnce(Vec<(String, &'static str, bool)>) -> Result<()>>;

/// An IPAM ADD under way: its wait gives the delegate's stdout.
pub type IpamJob = Box<dyn FnOnce() -> Result<Vec<u8>>>;

/// The calls of an ADD (and of CHECK, which reads through the same seam).
pub trait Kernel {
    fn link_by_name(&mut self, ns: Ns, name: &str) -> Nl<Option<Link>>;
    fn link_by_index(&mut self, ns: Ns, index: u32) -> Nl<Option<Link>>;
    fn links(&mut self, ns: Ns) -> Nl<Vec<Link>>;
    /// Create a link in the host; a veth whose peer has `container` set gets its peer created
    /// in the container namespace (the spec's `netns` is filled in by the seam).
    fn link_add(&mut self, spec: &LinkSpec<'_>, peer_in_container: bool) -> Nl<Link>;
    fn link_del(&mut self, ns: Ns, index: u32) -> Nl<()>;
    fn link_set_up(&mut self, ns: Ns, index: u32) -> Nl<()>;
    fn link_set_mac(&mut self, ns: Ns, index: u32, mac: [u8; 6]) -> Nl<()>;
    fn link_set_promisc(&mut self, ns: Ns, index: u32, on: bool) -> Nl<()>;
    fn link_set_ipv4_conf(&mut self, ns: Ns, index: u32, conf: &[(u16, u32)], up: bool) -> Nl<()>;
    fn link_with_port_flags(&mut self, name: &str) -> Nl<Option<(Link, Option<PortFlags>)>>;
    /// Set options of the host's bridge `index` (the others stay as they are).
    fn bridge_set(&mut self, index: u32, opts: &BridgeOpts) -> Nl<()>;
    fn bridge_port_set(&mut self, index: u32, flags: &PortFlags, up: bool) -> Nl<()>;
    fn bridge_port_vlans(&mut self, index: u32) -> Nl<Vec<PortVlan>>;
    fn bridge_vlan_del(&mut self, index: u32, vids: &[u16]) -> Nl<()>;
    fn bridge_vlan_add(&mut self, index: u32, vlans: &[PortVlan]) -> Nl<()>;
    fn addrs(&mut self, ns: Ns, index: Option<u32>, family: Option<Family>) -> Nl<Vec<Address>>;
    fn addr_add(&mut self, ns: Ns, index: u32, net: ipnet::IpNet) -> Nl<()>;
    fn addr_del(&mut self, ns: Ns, index: u32, net: ipnet::IpNet) -> Nl<()>;
    fn routes(&mut self, ns: Ns, family: Option<Family>) -> Nl<Vec<Route>>;
    fn route_add(&mut self, ns: Ns, spec: &RouteSpec) -> Nl<()>;
    fn wait_link_oper_up(&mut self, index: u32, timeout: Duration) -> Nl<Option<Link>>;
    /// In the container: until no address of `index` is tentative.
    fn wait_addrs_settled(&mut self, index: u32, family: Option<Family>, timeout: Duration) -> Result<()>;
    /// A host sysctl's current value.
    fn sysctl_get(&mut self, key: &str) -> std::io::Result<String>;
    /// Set a host sysctl unless it has the value; whether it wrote.
    fn sysctl_set(&mut self, key: &str, value: &str) -> Result<bool>;
    /// Whether a host sysctl exists (a per-interface IPv6 key does not when IPv6 is off).
    fn sysctl_exists(&mut self, key: &str) -> bool;
    /// The entries of the host's `/proc/sys/net/ipv6/conf` (interfaces and the templates
    /// `all` and `default`; none without IPv6).
    fn ipv6_conf_names(&mut self) -> Vec<String>;
    /// Start the container's sysctl writer (a thread that enters the namespace at once).
    fn container_sysctls(&mut self) -> Result<SysctlJob>;
    /// Start the IPAM delegate's ADD.
    fn ipam_add(&mut self) -> Result<IpamJob>;
    /// The IPAM delegate's DEL (releasing what a failed ADD reserved).
    fn ipam_del(&mut self) -> Result<()>;
    /// nf_tables, opened on first use.
    fn nft(&mut self) -> Result<&mut dyn Nft>;
    /// Start the IPAM delegate's DEL (DEL waits for it after its own work).
    fn ipam_del_start(&mut self) -> Result<IpamJob>;
    /// Remove the attachment's firewall state (ADD's undo, DEL); without `required`, a kernel
    /// without nf_tables has none.
    fn remove_firewall(&mut self, required: bool) -> Result<()> {
        self.remove_firewall_parts(required, true)
    }
    /// [`Kernel::remove_firewall`], the spoof check only with `spoof` (DEL leaves it when the
    /// container interface is another network's attachment: the same `<containerID>-<ifname>`
    /// keys both).
    fn remove_firewall_parts(&mut self, required: bool, spoof: bool) -> Result<()>;
    /// Remove what upstream's bridge made for the attachment's masquerading (iptables).
    fn upstream_masq_del(&mut self) -> Result<()>;
    /// GC of upstream's masquerading of this network (attachments not in the valid list).
    fn upstream_masq_gc(&mut self) -> Result<()>;
    /// The IPAM delegate's GC.
    fn ipam_gc(&mut self) -> Result<()>;
    /// Whether upstream's bridge made this attachment's masquerading (iptables chains) and it
    /// is complete: then CHECK leaves masquerading to it.
    fn upstream_masq_intact(&mut self) -> Result<bool>;
    /// Who drops forwarded traffic from `subnet` in the host (another table's forward chain
    /// with policy drop: Docker's, firewalld's), as one message naming the chain and the fix;
    /// `None` when nothing visibly does.
    fn forward_drop_note(&mut self, subnet: ipnet::IpNet) -> Option<String>;
    /// Whether the host bridge `br` keeps the MAC it has (`addr_assign_type` 3: it was set)
    /// rather than following its ports; `None` when that cannot be read for this namespace.
    fn mac_pinned(&mut self, br: &Link) -> Option<bool>;
}

/// The kernel, for one request: a netlink socket in the host and one in the container, each
/// opened when first used.
pub struct Real<'r> {
    req: &'r Request,
    /// The container's namespace (None: DEL of an attachment whose namespace is gone).
    ns: Option<Arc<NetNs>>,
    host: Option<Netlink>,
    ctr: Option<Netlink>,
    nft: Option<NfTables>,
    /// The socket of a committed firewall deletion, released last (see `del`).
    released: Option<NfTables>,
}

impl<'r> Real<'r> {
    /// For ADD and CHECK: both sockets opened now, as any failure to open them must come
    /// before anything changes.
    pub fn new(req: &'r Request, ns: Arc<NetNs>) -> Result<Real<'r>> {
        let host = Netlink::new()?;
        let ctr = Netlink::new_in(&ns)?;
        Ok(Real { req, ns: Some(ns), host: Some(host), ctr: Some(ctr), nft: None, released: None })
    }

    /// For DEL: nothing opened until used; `ns` None when the namespace is gone.
    pub fn lazy(req: &'r Request, ns: Option<Arc<NetNs>>) -> Real<'r> {
        Real { req, ns, host: None, ctr: None, nft: None, released: None }
    }

    /// With nf_tables opened now (ADD opens it while validating, before changing anything).
    pub fn with_nft(mut self, nft: Option<NfTables>) -> Self {
        self.nft = nft;
        self
    }

    fn nl(&mut self, ns: Ns) -> Nl<&mut Netlink> {
        let slot = match ns {
            Ns::Host => &mut self.host,
            Ns::Container => &mut self.ctr,
        };
        if slot.is_none() {
            let open = match (ns, &self.ns) {
                (Ns::Host, _) => Netlink::new(),
                (Ns::Container, Some(n)) => Netlink::new_in(n)
                    .map_err(|e| NlError::new(format!("netlink in the container: {}", e.msg), libc::EIO)),
                (Ns::Container, None) => Err(NlError::new("the container's namespace is gone", libc::ENOENT)),
            };
            *slot = Some(open?);
        }
        Ok(slot.as_mut().expect("opened above"))
    }

    fn ctr_ns(&self) -> Result<&Arc<NetNs>> {
        self.ns.as_ref().ok_or_else(|| CniError::internal("the container's namespace is gone"))
    }
}

/// The IPAM ADD while it runs alongside the kernel setup: in-process on a thread of its own
/// (see `cni_common::delegate`), or exec'd from a helper thread — spawning a process blocks the
/// spawning thread until the child has exec'd, which this keeps off the main path as well.
fn start_ipam_add(req: &Request) -> Result<IpamJob> {
    let delegate = ipam::locate(req)?.ok_or_else(|| CniError::config("no IPAM plugin configured"))?;
    if delegate.in_process() {
        let p: Pending = delegate.start(Command::Add, &req.stdin)?;
        return Ok(Box::new(move || p.wait()));
    }
    let stdin = req.stdin.clone();
    let handle = std::thread::Builder::new()
        .name("ipam".into())
        .spawn(move || delegate.run(Command::Add, &stdin))
        .map_err(|e| CniError::internal(format!("start IPAM thread: {e}")))?;
    Ok(Box::new(move || handle.join().unwrap_or_else(|_| Err(CniError::internal("IPAM thread panicked")))))
}

/// IPv6 settings of the container interface, written from a helper thread inside the container
/// namespace. The first lookup of `/proc/sys/net/ipv6` in a namespace costs time that grows with
/// the number of namespaces on the host (milliseconds on a busy node); the thread does it at
/// once, while the main thread creates the veth pair and IPAM runs, and writes the values when
/// told (before the interface comes up).
fn start_container_sysctls(ns: NetNs) -> Result<SysctlJob> {
    let (jobs, rx) = std::sync::mpsc::channel::<Vec<(String, &'static str, bool)>>();
    let done = std::thread::Builder::new()
        .name("ipv6conf".into())
        .spawn(move || -> Result<()> {
            ns.run(|| {
                let _warm = std::fs::File::open("/proc/sys/net/ipv6/conf"); // absent without IPv6
                let Ok(list) = rx.recv() else { return Ok(()) }; // ADD gave up: nothing to do
                for (key, value, required) in list {
                    match sysctl::set(&key, value) {
                        Err(e) if required => return Err(e),
                        _ => {}
                    }
                }
                Ok(())
            })
        })
        .map_err(|e| CniError::internal(format!("start sysctl thread: {e}")))?;
    Ok(Box::new(move |list| {
        let _ = jobs.send(list);
        done.join().unwrap_or_else(|_| Err(CniError::internal("sysctl thread panicked")))
    }))
}

// Delegations to the kernel: nothing to mutate (the fake's tests and the e2e suite cover them).
#[cfg_attr(mutants, mutants::skip)]
impl Kernel for Real<'_> {
    fn link_by_name(&mut self, ns: Ns, name: &str) -> Nl<Option<Link>> {
        self.nl(ns)?.link_by_name(name)
    }
    fn link_by_index(&mut self, ns: Ns, index: u32) -> Nl<Option<Link>> {
        self.nl(ns)?.link_by_index(index)
    }
    fn links(&mut self, ns: Ns) -> Nl<Vec<Link>> {
        self.nl(ns)?.links()
    }
    fn link_add(&mut self, spec: &LinkSpec<'_>, peer_in_container: bool) -> Nl<Link> {
        match (&spec.kind, peer_in_container) {
            (LinkKind::Veth { peer }, true) => {
                let ns = self
                    .ns
                    .clone()
                    .ok_or_else(|| NlError::new("the container's namespace is gone", libc::ENOENT))?;
                let peer = VethPeer { netns: Some(ns.as_fd()), ..peer.clone() };
                let spec = LinkSpec { kind: LinkKind::Veth { peer }, ..spec.clone() };
                self.nl(Ns::Host)?.link_add(&spec)
            }
            _ => self.nl(Ns::Host)?.link_add(spec),
        }
    }
    fn link_del(&mut self, ns: Ns, index: u32) -> Nl<()> {
        self.nl(ns)?.link_del(index)
    }
    fn link_set_up(&mut self, ns: Ns, index: u32) -> Nl<()> {
        self.nl(ns)?.link_set_up(index)
    }
    fn link_set_mac(&mut self, ns: Ns, index: u32, mac: [u8; 6]) -> Nl<()> {
        self.nl(ns)?.link_set_mac(index, mac)
    }
    fn link_set_promisc(&mut self, ns: Ns, index: u32, on: bool) -> Nl<()> {
        self.nl(ns)?.link_set_promisc(index, on)
    }
    fn link_set_ipv4_conf(&mut self, ns: Ns, index: u32, conf: &[(u16, u32)], up: bool) -> Nl<()> {
        self.nl(ns)?.link_set_ipv4_conf(index, conf, up)
    }
    fn link_with_port_flags(&mut self, name: &str) -> Nl<Option<(Link, Option<PortFlags>)>> {
        self.nl(Ns::Host)?.link_with_port_flags(name)
    }
    fn bridge_set(&mut self, index: u32, opts: &BridgeOpts) -> Nl<()> {
        self.nl(Ns::Host)?.bridge_set(index, opts)
    }
    fn bridge_port_set(&mut self, index: u32, flags: &PortFlags, up: bool) -> Nl<()> {
        self.nl(Ns::Host)?.bridge_port_set(index, flags, up)
    }
    fn bridge_port_vlans(&mut self, index: u32) -> Nl<Vec<PortVlan>> {
        self.nl(Ns::Host)?.bridge_port_vlans(index)
    }
    fn bridge_vlan_del(&mut self, index: u32, vids: &[u16]) -> Nl<()> {
        self.nl(Ns::Host)?.bridge_vlan_del(index, vids)
    }
    fn bridge_vlan_add(&mut self, index: u32, vlans: &[PortVlan]) -> Nl<()> {
        self.nl(Ns::Host)?.bridge_vlan_add(index, vlans)
    }
    fn addrs(&mut self, ns: Ns, index: Option<u32>, family: Option<Family>) -> Nl<Vec<Address>> {
        self.nl(ns)?.addrs(index, family)
    }
    fn addr_add(&mut self, ns: Ns, index: u32, net: ipnet::IpNet) -> Nl<()> {
        self.nl(ns)?.addr_add(index, net)
    }
    fn addr_del(&mut self, ns: Ns, index: u32, net: ipnet::IpNet) -> Nl<()> {
        self.nl(ns)?.addr_del(index, net)
    }
    fn routes(&mut self, ns: Ns, family: Option<Family>) -> Nl<Vec<Route>> {
        self.nl(ns)?.routes(family)
    }
    fn route_add(&mut self, ns: Ns, spec: &RouteSpec) -> Nl<()> {
        self.nl(ns)?.route_add(spec)
    }
    fn wait_link_oper_up(&mut self, index: u32, timeout: Duration) -> Nl<Option<Link>> {
        self.nl(Ns::Host)?.wait_link_oper_up(index, timeout)
    }
    fn wait_addrs_settled(&mut self, index: u32, family: Option<Family>, timeout: Duration) -> Result<()> {
        let ns = self.ctr_ns()?.clone();
        let ctr = self.nl(Ns::Container)?;
        ns.run(|| Ok(ctr.wait_addrs_settled(index, family, timeout)?)).map(drop)
    }
    fn sysctl_get(&mut self, key: &str) -> std::io::Result<String> {
        sysctl::get(key)
    }
    fn sysctl_set(&mut self, key: &str, value: &str) -> Result<bool> {
        sysctl::set(key, value)
    }
    fn sysctl_exists(&mut self, key: &str) -> bool {
        sysctl::path_of(key).map(|p| p.exists()).unwrap_or(false)
    }
    fn ipv6_conf_names(&mut self) -> Vec<String> {
        let Ok(dir) = std::fs::read_dir("/proc/sys/net/ipv6/conf") else { return Vec::new() };
        dir.flatten().filter_map(|e| e.file_name().into_string().ok()).collect()
    }
    fn container_sysctls(&mut self) -> Result<SysctlJob> {
        start_container_sysctls(self.ctr_ns()?.try_clone()?)
    }
    fn ipam_add(&mut self) -> Result<IpamJob> {
        start_ipam_add(self.req)
    }
    fn ipam_del(&mut self) -> Result<()> {
        ipam::del(self.req)
    }
    fn nft(&mut self) -> Result<&mut dyn Nft> {
        if self.nft.is_none() {
            self.nft = Some(crate::firewall::open()?);
        }
        Ok(self.nft.as_mut().expect("opened above"))
    }
    fn ipam_del_start(&mut self) -> Result<IpamJob> {
        let p = ipam::start(self.req, Command::Del)?;
        Ok(Box::new(move || p.wait()))
    }
    fn remove_firewall_parts(&mut self, required: bool, spoof: bool) -> Result<()> {
        let socket = crate::firewall::remove::remove(self.req, required, spoof)?;
        self.released = self.released.take().or(socket);
        Ok(())
    }
    fn upstream_masq_del(&mut self) -> Result<()> {
        cni_common::upstream::masq::del(self.req)
    }
    fn upstream_masq_gc(&mut self) -> Result<()> {
        cni_common::upstream::masq::gc(self.req)
    }
    fn ipam_gc(&mut self) -> Result<()> {
        ipam::gc(self.req)
    }
    fn forward_drop_note(&mut self, subnet: ipnet::IpNet) -> Option<String> {
        cni_common::forward_drop::diagnose(subnet).message(subnet, FORWARD_REMEDY)
    }
    fn upstream_masq_intact(&mut self) -> Result<bool> {
        Ok(cni_common::upstream::masq::check(self.req)?.is_intact())
    }
    fn mac_pinned(&mut self, br: &Link) -> Option<bool> {
        sysfs_mac_pinned(br)
    }
}

/// `addr_assign_type` of `br` from sysfs, which rtnetlink does not report. sysfs shows the
/// devices of the namespace it was mounted for, which need not be the one this process is in
/// (a runtime's plugin exec'd with only `setns`): the device directory counts only when it
/// names the same ifindex and MAC as the link netlink gave, else the answer is `None`.
fn sysfs_mac_pinned(br: &Link) -> Option<bool> {
    use cni_common::fsread::{open_dir, read_regular_at};
    // the bridge name is a validated interface name (no `/`, not `.` or `..`); `.` opens the
    // device directory the class entry links to
    let dir = open_dir(&std::path::Path::new("/sys/class/net").join(&br.name).join(".")).ok()?;
    let read = |name: &str| {
        let b = read_regular_at(dir.as_fd(), name, 64).ok()?;
        Some(String::from_utf8(b).ok()?.trim().to_string())
    };
    let same_device = read("ifindex")? == br.index.to_string()
        && br.mac.is_some_and(|m| {
            read("address").as_deref() == Some(cni_common::mac::Mac(m).to_string().as_str())
        });
    if !same_device {
        return None;
    }
    // NET_ADDR_SET: the MAC was given; 0 (permanent), 1 (random), 2 (stolen) and 4 follow
    // the bridge's ports
    Some(read("addr_assign_type")? == "3")
}

#[cfg(test)]
pub mod fake;
