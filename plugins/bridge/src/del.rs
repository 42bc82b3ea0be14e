//! DEL: best effort and idempotent: firewall rules of the attachment (found by their tag, so
//! an empty or vanished CNI_NETNS is no obstacle), the container interface, the IPAM
//! reservation. Errors are collected and the first is reported after everything was tried.
//!
//! What upstream's DEL waits for is the kernel, not work: unregistering a network device waits
//! for RCU grace periods (`rcu_barrier()` in `netdev_run_todo`, 10–30 ms measured here), and so
//! does releasing the netlink socket of an nftables transaction that deleted something (the
//! kernel frees the deleted rules after a grace period and flushes that work when the socket
//! goes). By default DEL waits, as upstream. With `"deferredDelete": true` (ours, opt-in) DEL
//! does every change itself — rules deleted and committed, the container interface down and
//! renamed out of the way so CNI_IFNAME is free at once, IPAM released — and hands the two waits
//! to a detached helper process that holds the sockets, unregisters the interface and exits.

use crate::identity::from_veth_alias;
use crate::kernel::{Kernel, Ns, Real};
use cni_common::delegate::ipam;
use cni_common::error::{CniError, Result};
use cni_common::error_list::ErrorList;
use cni_common::netlink::{Netlink, NlError};
use cni_common::netns::NetNs;
use cni_common::spec::Command;
use cni_common::Request;

use crate::config::Teardown;
use crate::firewall;

/// The name a container interface gets while it waits to be unregistered (<= 15 bytes).
fn tombstone_name(index: u32) -> String {
    format!("cnidel{index:x}")
}

/// The container interface, made inert: down (no traffic; the host end loses carrier too) and
/// renamed (CNI_IFNAME is free for a new attachment immediately). Returns the socket and index
/// for unregistering it, or None when there is nothing to remove.
fn make_inert(ns: &NetNs, ifname: &str) -> Result<Option<(Netlink, u32)>> {
    let mut nl = Netlink::new_in(ns)?;
    let Some(link) = nl.link_by_name(ifname)? else { return Ok(None) };
    let inert = |nl: &mut Netlink| -> std::result::Result<(), NlError> {
        nl.link_set_down(link.index)?;
        nl.link_set_name(link.index, &tombstone_name(link.index))
    };
    match inert(&mut nl) {
        Ok(()) => Ok(Some((nl, link.index))),
        Err(e) if e.is_not_found() => Ok(None),
        // Could not rename (a name clash): unregister it right away instead.
        Err(_) => unregister(&mut nl, link.index, ifname).map(|_| None),
    }
}

fn unregister(nl: &mut Netlink, index: u32, ifname: &str) -> Result<()> {
    match nl.link_del(index) {
        Ok(()) => Ok(()),
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(CniError::from(e).context(format_args!("failed to delete {ifname}"))),
    }
}

/// How many threads this process has (`/proc/self/task`); `None` when it cannot be read.
fn thread_count() -> Option<usize> {
    Some(std::fs::read_dir("/proc/self/task").ok()?.count())
}

/// Fork a helper that unregisters `link` (if any) and then exits; it inherits every open file,
/// so the nftables socket is released — and waited for — by the helper too. The helper starts
/// its own session and lets go of stdin/stdout/stderr at once, so the runtime sees this process
/// finish and its output end without waiting for the kernel. Returns false when no helper
/// could be started (nothing was done then), and when this process has more than one thread:
/// an in-process IPAM run that panicked stays parked for good (cni_common::ipam), and a child
/// forked from a multi-threaded process may only run async-signal-safe code, which the
/// netlink request is not (it allocates).
fn spawn_finisher(link: Option<&mut (Netlink, u32)>) -> bool {
    if thread_count() != Some(1) {
        return false;
    }
    // SAFETY: this process has exactly one thread (checked above; DEL starts none that outlive
    // their wait), so the child may run arbitrary code; it leaves with _exit (no atexit
    // handlers, no flushing of buffers it shares with the parent).
    match unsafe { libc::fork() } {
        -1 => false,
        0 => {
            // SAFETY: plain syscalls on descriptors we own; the path is a valid C string.
            unsafe {
                libc::setsid();
                let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
                for fd in 0..3 {
                    if null >= 0 {
                        libc::dup2(null, fd);
                    } else {
                        libc::close(fd);
                    }
                }
                if null > 2 {
                    libc::close(null);
                }
            }
            if let Some((nl, index)) = link {
                let _ = nl.link_del(*index);
            }
            // SAFETY: end the helper without running any parent-owned cleanup.
            unsafe { libc::_exit(0) }
        }
        _ => true,
    }
}

/// DEL. The configuration is read with [`Teardown`]: values only ADD uses are not judged, a
/// hostile IPAM `type` is refused before anything is touched.
pub fn del(req: &Request) -> Result<()> {
    let conf = Teardown::from_request(req)?;
    if conf.deferred_delete {
        return del_deferred(req, &conf);
    }
    let mut errors = ErrorList::new();
    // A namespace that is gone took its interfaces with it.
    let ns = match req.netns() {
        Some(_) => errors.take(req.container_netns()).flatten(),
        None => None,
    };
    let in_container = ns.is_some();
    let mut k = Real::lazy(req, ns);
    let r = del_with(&mut k, &conf, req.network(), &req.env.ifname, in_container, errors);
    // the socket of a committed firewall deletion goes last (Real's drop): its RCU wait
    // overlaps the interface's
    drop(k);
    r
}

/// Whose the container interface `ifname` provably is when it is not `network`'s: one pod is
/// attached to several networks (Multus, DRA drivers), and a runtime sends DEL for an
/// attachment that never was (a refused ADD, a DEL of every network of a pod whose ADD failed
/// halfway) with an ifname that another network's attachment has. Upstream's DEL deletes
/// whatever has the name, and with it that attachment's spoof check (keyed by
/// `<containerID>-<ifname>` alone). It is another network's when it is a veth whose host end
/// (the host link at its peer index whose own peer is this link) says so: its alias names
/// another network ([`crate::identity::BridgeIdentity::veth_alias`], written with
/// macspoofchk), or it is a port of a bridge other than `conf.bridge` when that exists. Anything
/// else (no veth, no such host end, no alias and no bridge to compare, an error) is this
/// network's, as upstream: a half-made attachment of an interrupted ADD is removed.
pub(crate) fn held_elsewhere(
    k: &mut dyn Kernel,
    conf: &Teardown,
    network: &str,
    ifname: &str,
) -> Option<String> {
    let c = k.link_by_name(Ns::Container, ifname).ok()??;
    if c.kind.as_deref() != Some("veth") {
        return None;
    }
    let host = k.link_by_index(Ns::Host, c.link?).ok()??;
    // the peer index is in the peer's namespace: only a host veth whose peer is this link is it
    if host.kind.as_deref() != Some("veth") || host.link != Some(c.index) {
        return None;
    }
    if let Some(a) = host.alias.as_deref().and_then(from_veth_alias) {
        return (a.network != network)
            .then(|| format!("network {:?}'s (host end {} names it)", a.network, host.name));
    }
    let master = host.master?;
    match k.link_by_name(Ns::Host, &conf.bridge) {
        Ok(Some(b)) if b.index != master => {
            Some(format!("not a port of bridge {} (host end {} is another bridge's)", conf.bridge, host.name))
        }
        _ => None,
    }
}

/// DEL through the seam `k`: the IPAM release started first and waited for last; upstream's
/// masquerading, ours, the container interface (`in_container`: its namespace exists) unless
/// it is another network's ([`held_elsewhere`]: then it and its spoof check stay).
pub(crate) fn del_with(
    k: &mut dyn Kernel,
    conf: &Teardown,
    network: &str,
    ifname: &str,
    in_container: bool,
    mut errors: ErrorList,
) -> Result<()> {
    // The IPAM release runs while we clean up the rest.
    let pending = if conf.l3 { errors.take(k.ipam_del_start()) } else { None };
    // ipMasq made by upstream's bridge (iptables chains), if this attachment has any. Before
    // our own deletions: closing its look-up socket while our committed deletion is pending
    // would make this process wait for an RCU grace period here, in series with the veth's.
    errors.take(k.upstream_masq_del());
    let elsewhere = if in_container { held_elsewhere(k, conf, network, ifname) } else { None };
    if let Some(whose) = &elsewhere {
        eprintln!("bridge: DEL: container interface {ifname} is {whose}: left to it, with its spoof check");
    }
    errors.take(k.remove_firewall_parts(conf.firewall(), elsewhere.is_none()));
    if in_container && elsewhere.is_none() {
        let gone = |e: &NlError| e.is_not_found();
        match k.link_by_name(Ns::Container, ifname) {
            Ok(Some(l)) => match k.link_del(Ns::Container, l.index) {
                Err(e) if !gone(&e) => {
                    errors.push(CniError::from(e).context(format_args!("failed to delete {ifname}")))
                }
                _ => {}
            },
            Ok(None) => {}
            Err(e) => errors.push(e.into()),
        }
    }
    if let Some(p) = pending {
        errors.take(p().map(drop));
    }
    errors.finish()
}

/// DEL with `deferredDelete`: the interface made inert at once, its unregistering (and the
/// kernel's waits) left to a detached helper.
fn del_deferred(req: &Request, conf: &Teardown) -> Result<()> {
    let mut errors = ErrorList::new();

    // The IPAM release runs while we clean up the rest.
    let pending = if conf.l3 { errors.take(ipam::start(req, Command::Del)) } else { None };

    // ipMasq made by upstream's bridge (iptables chains), if this attachment has any. Before
    // our own deletions: closing its look-up socket while our committed deletion is pending
    // would make this process wait for an RCU grace period here, in series with the veth's.
    errors.take(cni_common::upstream::masq::del(req));
    let ns = match req.netns() {
        Some(_) => errors.take(req.container_netns()).flatten(),
        // A namespace that is gone took its interfaces with it.
        None => None,
    };
    let elsewhere = ns
        .clone()
        .and_then(|ns| held_elsewhere(&mut Real::lazy(req, Some(ns)), conf, req.network(), &req.env.ifname));
    if let Some(whose) = &elsewhere {
        eprintln!(
            "bridge: DEL: container interface {} is {whose}: left to it, with its spoof check",
            req.env.ifname
        );
    }
    let fw_socket =
        errors.take(firewall::remove::remove(req, conf.firewall(), elsewhere.is_none())).flatten();
    let mut link = None;
    if let Some(ns) = ns.filter(|_| elsewhere.is_none()) {
        link = errors.take(make_inert(&ns, &req.env.ifname)).flatten();
    }
    if let Some(p) = pending {
        errors.take(p.wait());
    }
    if (link.is_some() || fw_socket.is_some()) && !spawn_finisher(link.as_mut()) {
        if let Some((mut nl, index)) = link {
            errors.take(unregister(&mut nl, index, &req.env.ifname));
        }
    }
    drop(fw_socket);
    errors.finish()
}
