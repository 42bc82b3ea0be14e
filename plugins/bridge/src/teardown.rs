//! DEL, GC and STATUS.
//!
//! DEL is best effort and idempotent: firewall rules of the attachment (found by their tag, so
//! an empty or vanished CNI_NETNS is no obstacle), the container interface, the IPAM
//! reservation. Errors are collected and the first is reported after everything was tried.
//!
//! Removing the container interface: unregistering a network device makes the kernel wait for
//! RCU grace periods (`rcu_barrier()` in `netdev_run_todo`, 10–30 ms measured here), which is
//! most of what upstream's DEL waits for. By default DEL makes the interface inert at once —
//! down, renamed out of the way so CNI_IFNAME is free again — and leaves the unregistering to a
//! detached helper process; `"deferredDelete": false` deletes it synchronously instead.

use std::collections::HashSet;

use cni_common::error::{CniError, Result};
use cni_common::ipam;
use cni_common::netlink::nftables::NfTables;
use cni_common::netlink::Netlink;
use cni_common::netns::NetNs;
use cni_common::nft::Nft;
use cni_common::Request;

use crate::add::apply_with_retry;
use crate::config::Conf;
use crate::firewall::{self, Attachment};

fn attachment(req: &Request) -> Attachment<'_> {
    Attachment { network: req.network(), container_id: &req.env.container_id, ifname: &req.env.ifname }
}

/// Remove the attachment's firewall rules. Reading is netlink only; `nft` runs only when there
/// is something to delete. When neither ipMasq nor macspoofchk is configured, a kernel without
/// nf_tables is not an error (`required` false).
pub(crate) fn remove_firewall(req: &Request, required: bool) -> Result<()> {
    let att = attachment(req);
    let mut nf = match NfTables::new() {
        Ok(nf) => nf,
        Err(e) if !required => {
            eprintln!("bridge: nftables not readable, skipping firewall cleanup: {e}");
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    let found = firewall::find(&mut nf, att, true, true)?;
    if found.is_empty() {
        return Ok(());
    }
    let nft = Nft::find()?;
    let mut first = Some(found);
    apply_with_retry(&nft, || {
        let f = match first.take() {
            Some(f) => f,
            None => firewall::find(&mut nf, att, true, true)?,
        };
        Ok(firewall::del_script(att, &f))
    })
    .map_err(|e| e.context("remove firewall rules"))
}

/// The name a container interface gets while it waits to be unregistered (<= 15 bytes).
fn tombstone_name(index: u32) -> String {
    format!("cnidel{index:x}")
}

/// Remove `ifname` from the namespace at `path` (nothing to do when the namespace or the
/// interface is gone).
fn remove_container_iface(ns: &NetNs, ifname: &str, deferred: bool) -> Result<()> {
    let mut nl = Netlink::new_in(ns)?;
    let Some(link) = nl.link_by_name(ifname)? else { return Ok(()) };
    if deferred && make_inert(&mut nl, link.index).is_ok() && spawn_unregister(&mut nl, link.index) {
        return Ok(());
    }
    match nl.link_del(link.index) {
        Ok(()) => Ok(()),
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(CniError::from(e).context(format_args!("failed to delete {ifname}"))),
    }
}

/// Down (no traffic, carrier off on the host end too) and renamed (CNI_IFNAME is free for a
/// new attachment immediately).
fn make_inert(nl: &mut Netlink, index: u32) -> std::result::Result<(), cni_common::netlink::NlError> {
    nl.link_set_down(index)?;
    nl.link_set_name(index, &tombstone_name(index))
}

/// Fork a helper that unregisters link `index` through `nl` (a socket in the container's
/// namespace) and exits. The helper starts its own session and lets go of stdin/stdout/stderr
/// at once, so the runtime sees this process finish (and its output end) without waiting for
/// the kernel. Returns false when no helper could be started.
fn spawn_unregister(nl: &mut Netlink, index: u32) -> bool {
    // SAFETY: the plugin is single-threaded, so the child may run arbitrary code; it leaves
    // with _exit (no atexit handlers, no flushing of buffers it shares with the parent).
    match unsafe { libc::fork() } {
        -1 => false,
        0 => {
            // SAFETY: plain syscalls on fds we own; the path is a valid C string.
            unsafe {
                libc::setsid();
                let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
                if null >= 0 {
                    for fd in 0..3 {
                        libc::dup2(null, fd);
                    }
                    if null > 2 {
                        libc::close(null);
                    }
                } else {
                    for fd in 0..3 {
                        libc::close(fd);
                    }
                }
            }
            let _ = nl.link_del(index);
            // SAFETY: terminate the helper without running any parent-owned cleanup.
            unsafe { libc::_exit(0) }
        }
        _ => true,
    }
}

pub fn del(req: &Request) -> Result<()> {
    let conf = Conf::from_request(req)?;
    let mut errors: Vec<CniError> = Vec::new();

    // IPAM release runs while we clean up the rest.
    let pending = if conf.l3 { Some(ipam::start(req, cni_common::spec::Command::Del)) } else { None };

    if let Err(e) = remove_firewall(req, conf.ip_masq || conf.macspoofchk) {
        errors.push(e);
    }
    if let Some(path) = req.netns() {
        match NetNs::open_if_exists(path) {
            Ok(Some(ns)) => {
                if let Err(e) = remove_container_iface(&ns, &req.env.ifname, conf.deferred_delete) {
                    errors.push(e);
                }
            }
            Ok(None) => {} // the container's namespace is gone, and its interfaces with it
            Err(e) => errors.push(e),
        }
    }
    if let Some(p) = pending {
        if let Err(e) = p.and_then(|p| p.wait()) {
            errors.push(e);
        }
    }
    report(errors)
}

fn report(mut errors: Vec<CniError>) -> Result<()> {
    if errors.is_empty() {
        return Ok(());
    }
    let first = errors.remove(0);
    if errors.is_empty() {
        return Err(first);
    }
    let rest: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
    Err(first.with_details(format!("also: {}", rest.join("; "))))
}

pub fn gc(req: &Request) -> Result<()> {
    let conf = Conf::from_request(req)?;
    let valid = req.valid_attachments()?;
    let network = req.network();
    let mut errors = Vec::new();

    let keep_masq: HashSet<String> =
        valid.iter().map(|a| firewall::instance_hash(network, &a.ifname, &a.container_id)).collect();
    let keep_spoof: HashSet<String> =
        valid.iter().map(|a| firewall::spoof_ref(&a.container_id, &a.ifname)).collect();
    let required = conf.ip_masq || conf.macspoofchk;
    let firewall_gc = || -> Result<()> {
        let mut nf = match NfTables::new() {
            Ok(nf) => nf,
            Err(_) if !required => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let mut host = Netlink::new()?;
        let mut build = || -> Result<String> {
            let masq = firewall::masq_garbage(&mut nf, network, &keep_masq)?;
            let spoof = if conf.macspoofchk {
                firewall::spoof_garbage(
                    &mut nf,
                    &mut |name| Ok(host.link_by_name(name)?.is_some()),
                    &keep_spoof,
                )?
            } else {
                Vec::new()
            };
            Ok(firewall::gc_script(&masq, &spoof))
        };
        let script = build()?;
        if script.is_empty() {
            return Ok(());
        }
        let nft = Nft::find()?;
        let mut first = Some(script);
        apply_with_retry(&nft, || match first.take() {
            Some(s) => Ok(s),
            None => build(),
        })
    };
    if let Err(e) = firewall_gc() {
        errors.push(e.context("garbage-collect firewall rules"));
    }
    if conf.l3 {
        if let Err(e) = ipam::gc(req) {
            errors.push(e);
        }
    }
    report(errors)
}

pub fn status(req: &Request) -> Result<()> {
    let conf = Conf::from_request(req)?;
    if conf.ip_masq || conf.macspoofchk {
        Nft::find()?; // code 50 when nft is missing: ADD could not set up the rules
    }
    if conf.l3 {
        ipam::status(req)?;
    }
    Ok(())
}
