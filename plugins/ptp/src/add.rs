//! ADD: IPAM, then the plan of [`crate::plan::add`] carried out step by step through the
//! kernel seam. Everything the configuration can get wrong is refused before the first change;
//! every change is recorded, and a failure takes the attachment apart again (masquerade rules,
//! the veth pair with everything on it, the IPAM reservation), so a failed ADD leaves nothing.

use cni_common::attachment::AttachmentId;
use cni_common::error::{CniError, Context, Result};
use cni_common::mac::Mac;
use cni_common::spec::result::{CniResult, Interface};
use cni_common::Request;

use crate::config::Conf;
use crate::desired::desired;
use crate::ipam::{Delegated, Ipam};
use crate::kernel::{Kernel, Real, Side};
use crate::plan::{self, Step};

/// What one ADD is about.
pub struct Input<'a> {
    pub attachment: AttachmentId,
    /// CNI_NETNS as given (the result's `sandbox`).
    pub netns: &'a str,
    pub conf: &'a Conf,
}

/// What this ADD changed so far.
#[derive(Debug, Default)]
struct Undo {
    ipam: bool,
    host_veth: Option<u32>,
    masq: bool,
}

impl Undo {
    fn run(self, k: &mut dyn Kernel, ipam: &mut dyn Ipam, a: &AttachmentId) {
        if self.masq {
            if let Err(e) = k.masq_remove(a) {
                cni_common::log!("ptp", "undo masquerade rules: {}", e.msg);
            }
        }
        if let Some(idx) = self.host_veth {
            if let Err(e) = k.link_del(Side::Host, idx) {
                if !e.is_not_found() {
                    cni_common::log!("ptp", "undo veth {idx}: {e}");
                }
            }
        }
        if self.ipam {
            if let Err(e) = ipam.del() {
                cni_common::log!("ptp", "release addresses after failed ADD: {}", e.msg);
            }
        }
    }
}

pub fn add(req: &Request) -> Result<CniResult> {
    let conf = Conf::from_request(req)?;
    let ns = req.require_netns()?;
    let mut k = Real::new(Some(&ns))?;
    let input = Input { attachment: AttachmentId::of(req), netns: &req.env.netns, conf: &conf };
    run(&mut k, &mut Delegated(req), &input, &mut host_veth_name)
}

/// ADD against a kernel and an IPAM delegate; `names` gives host veth names to try.
pub fn run(
    k: &mut dyn Kernel,
    ipam: &mut dyn Ipam,
    input: &Input,
    names: &mut dyn FnMut() -> String,
) -> Result<CniResult> {
    let ifname = input.attachment.ifname.as_str();
    if k.link(Side::Container, ifname)?.is_some() {
        return Err(CniError::internal(format!("container veth name provided ({ifname}) already exists")));
    }
    if input.conf.ip_masq {
        k.nft_ready()?;
    }
    // A delegate that failed reserved nothing (and releasing would free what an earlier ADD
    // of the same attachment holds).
    let reserved = ipam.add()?;
    let mut undo = Undo { ipam: true, ..Undo::default() };
    match apply(k, input, &reserved, &mut undo, names) {
        Ok(r) => Ok(r),
        Err(e) => {
            undo.run(k, ipam, &input.attachment);
            Err(e)
        }
    }
}

fn apply(
    k: &mut dyn Kernel,
    input: &Input,
    reserved: &CniResult,
    undo: &mut Undo,
    names: &mut dyn FnMut() -> String,
) -> Result<CniResult> {
    let conf = input.conf;
    let ifname = input.attachment.ifname.as_str();
    let d = desired(conf, reserved)?;
    let mut host = None;
    let mut ctr = None;
    let vanished = || CniError::internal(format!("container interface {ifname} vanished during ADD"));
    for step in plan::add(&d) {
        match step {
            Step::Forward(v4, v6) => k.forward(v4, v6)?,
            Step::CreateVeth => {
                let h = create_veth(k, ifname, conf.mtu, names)?;
                undo.host_veth = Some(h.index);
                ctr = Some(k.link(Side::Container, ifname)?.ok_or_else(vanished)?);
                host = Some(h);
            }
            Step::CtrEnableIpv6 => k.ctr_enable_ipv6(ifname)?,
            Step::CtrAddr(a) => {
                let c = ctr.as_ref().ok_or_else(vanished)?;
                k.addr_add(Side::Container, c.index, a, true)
                    .with_context(|| format!("failed to add IP addr {a} to {ifname:?}"))?;
            }
            Step::CtrUp => {
                let c = ctr.as_ref().ok_or_else(vanished)?;
                k.link_up(Side::Container, c.index)
                    .with_context(|| format!("failed to set {ifname:?} up"))?;
            }
            Step::CtrSettleV6 => k.ctr_settle_v6(ctr.as_ref().ok_or_else(vanished)?.index)?,
            Step::CtrRoute(r) => {
                let c = ctr.as_ref().ok_or_else(vanished)?;
                k.route_add(Side::Container, c.index, &r).with_context(|| {
                    format!(
                        "failed to add route '{} via {:?} dev {ifname}'",
                        r.dst,
                        r.gw.map(|g| g.to_string())
                    )
                })?;
            }
            Step::HostAddr(a) => {
                let h = host.as_ref().ok_or_else(vanished)?;
                k.addr_add(Side::Host, h.index, a, false)
                    .with_context(|| format!("failed to add IP addr {a} to veth {}", h.name))?;
            }
            Step::HostRoute(r) => {
                let h = host.as_ref().ok_or_else(vanished)?;
                match k.route_add(Side::Host, h.index, &r) {
                    // upstream: a host route that exists already is fine
                    Err(e) if e.is_exists() => {}
                    other => other.context("failed to add route on host")?,
                }
            }
            Step::Masq(addrs) => {
                undo.masq = true;
                k.masq_set(&input.attachment, &addrs)?;
            }
        }
    }
    let (host, ctr) = (host.ok_or_else(vanished)?, ctr.ok_or_else(vanished)?);
    let mut ips = reserved.ips.clone();
    for ip in &mut ips {
        ip.interface = Some(1);
    }
    Ok(CniResult {
        interfaces: vec![
            Interface { name: host.name.clone(), mac: Mac::text(host.mac), ..Default::default() },
            Interface {
                name: ifname.to_string(),
                mac: Mac::text(ctr.mac),
                sandbox: input.netns.to_string(),
                ..Default::default()
            },
        ],
        ips,
        routes: reserved.routes.clone(),
        dns: conf.dns.clone().unwrap_or_else(|| reserved.dns.clone()),
    })
}

/// The veth pair, with a fresh host name when the random one is taken (10 tries, as upstream).
fn create_veth(
    k: &mut dyn Kernel,
    ifname: &str,
    mtu: Option<u32>,
    names: &mut dyn FnMut() -> String,
) -> Result<cni_common::netlink::Link> {
    let mut last = None;
    for _ in 0..10 {
        match k.create_veth(&names(), ifname, mtu) {
            Ok(l) => return Ok(l),
            Err(e) if e.is_exists() => {
                if k.link(Side::Container, ifname)?.is_some() {
                    return Err(CniError::internal(format!(
                        "container veth name provided ({ifname}) already exists"
                    )));
                }
                last = Some(e);
            }
            Err(e) => return Err(CniError::from(e).context("failed to create veth pair")),
        }
    }
    Err(CniError::internal(format!(
        "failed to find a free host veth name: {}",
        last.map(|e| e.to_string()).unwrap_or_default()
    )))
}

/// A host-side veth name: `veth` + 8 random hex digits, as upstream's (NetworkManager and
/// friends ignore `veth*`).
pub fn host_veth_name() -> String {
    let mut b = [0u8; 4];
    let mut filled = 0;
    while filled < b.len() {
        // SAFETY: writes at most len - filled bytes into the buffer's tail.
        let n = unsafe { libc::getrandom(b[filled..].as_mut_ptr().cast(), b.len() - filled, 0) };
        if n > 0 {
            filled += n as usize;
        } else if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            panic!("getrandom failed: {}", std::io::Error::last_os_error());
        }
    }
    format!("veth{:02x}{:02x}{:02x}{:02x}", b[0], b[1], b[2], b[3])
}
