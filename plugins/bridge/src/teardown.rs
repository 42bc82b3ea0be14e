//! DEL, GC and STATUS.
//!
//! DEL is best effort and idempotent: firewall rules of the attachment (found by their tag, so
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

use std::collections::HashSet;

use cni_common::attachment::AttachmentId;
use cni_common::delegate::ipam;
use cni_common::error::{code, CniError, Result};
use cni_common::error_list::ErrorList;
use cni_common::netlink::nft::{NfTables, NftDelete, NftOp};
use cni_common::netlink::{Netlink, NlError};
use cni_common::netns::NetNs;
use cni_common::spec::Command;
use cni_common::Request;

use crate::config::{Conf, Teardown};
use crate::firewall;

/// How often a teardown transaction is rebuilt because something it named vanished meanwhile.
/// Each failed attempt means a concurrent DEL or GC removed part of what this one read, so
/// the garbage only shrinks; the bound is for a table that keeps changing for another reason.
const TEARDOWN_ATTEMPTS: usize = 16;

/// Find `build`'s deletions and commit them in one netlink transaction. An nf_tables
/// transaction is all or nothing: when it fails because an object it names is gone (a
/// concurrent DEL or GC removed it first: ENOENT), nothing was deleted, so read again and
/// retry with what is left; already gone is success. Past [`TEARDOWN_ATTEMPTS`] code 11.
/// Returns whether this socket committed a deletion.
fn delete_with_retry(
    nf: &mut NfTables,
    mut build: impl FnMut(&mut NfTables) -> Result<Vec<NftDelete>>,
) -> Result<bool> {
    for _ in 0..TEARDOWN_ATTEMPTS {
        let ops: Vec<NftOp> = build(nf)?.into_iter().map(NftOp::Delete).collect();
        if ops.is_empty() {
            return Ok(false);
        }
        match nf.apply(&ops) {
            Ok(()) => return Ok(true),
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(CniError::new(
        code::TRY_AGAIN,
        format!(
            "nftables rules kept vanishing while being deleted ({TEARDOWN_ATTEMPTS} attempts, each rebuilt from what was left)"
        ),
    ))
}

/// Remove the attachment's firewall rules with one netlink transaction. When neither ipMasq
/// nor macspoofchk is configured, a kernel without nf_tables is not an error (`required`
/// false). Returns the socket when it committed a deletion (releasing it makes the kernel wait
/// for an RCU grace period).
pub(crate) fn remove_firewall(req: &Request, required: bool) -> Result<Option<NfTables>> {
    let att = &AttachmentId::of(req);
    let mut nf = match NfTables::new() {
        Ok(nf) => nf,
        Err(e) if !required => {
            eprintln!("bridge: nftables not readable, skipping firewall cleanup: {e}");
            return Ok(None);
        }
        Err(e) => return Err(e.into()),
    };
    let changed =
        delete_with_retry(&mut nf, |nf| Ok(firewall::del_ops(att, &firewall::find(nf, att, true, true)?)))
            .map_err(|e| e.context("remove firewall rules"))?;
    Ok(changed.then_some(nf))
}

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
    let mut errors = ErrorList::new();

    // The IPAM release runs while we clean up the rest.
    let pending = if conf.l3 { errors.take(ipam::start(req, Command::Del)) } else { None };

    // ipMasq made by upstream's bridge (iptables chains), if this attachment has any. Before
    // our own deletions: closing its look-up socket while our committed deletion is pending
    // would make this process wait for an RCU grace period here, in series with the veth's.
    errors.take(crate::upstream_masq::del(req));
    let fw_socket = errors.take(remove_firewall(req, conf.firewall())).flatten();
    let mut link = None;
    if req.netns().is_some() {
        match req.container_netns() {
            // A namespace that is gone took its interfaces with it.
            Ok(None) => {}
            Ok(Some(ns)) if conf.deferred_delete => {
                link = errors.take(make_inert(&ns, &req.env.ifname)).flatten()
            }
            Ok(Some(ns)) => {
                errors.take(Netlink::new_in(&ns).and_then(
                    |mut nl| match nl.link_by_name(&req.env.ifname)? {
                        Some(l) => unregister(&mut nl, l.index, &req.env.ifname),
                        None => Ok(()),
                    },
                ));
            }
            Err(e) => errors.push(e),
        }
    }
    if let Some(p) = pending {
        errors.take(p.wait());
    }
    if conf.deferred_delete && (link.is_some() || fw_socket.is_some()) && !spawn_finisher(link.as_mut()) {
        if let Some((mut nl, index)) = link {
            errors.take(unregister(&mut nl, index, &req.env.ifname));
        }
    }
    drop(fw_socket);
    errors.finish()
}

/// GC: this network's firewall rules of attachments not in the valid list, then the IPAM
/// delegate's GC. Reads the configuration like DEL ([`Teardown`]).
pub fn gc(req: &Request) -> Result<()> {
    let conf = Teardown::from_request(req)?;
    let valid = AttachmentId::valid_list(req)?;
    let network = req.network();
    let mut errors = ErrorList::new();

    let keep_masq: HashSet<String> = valid.iter().map(AttachmentId::masq_tag).collect();
    let keep_spoof: HashSet<AttachmentId> = valid.into_iter().collect();
    let firewall_gc = || -> Result<()> {
        let mut nf = match NfTables::new() {
            Ok(nf) => nf,
            Err(_) if !conf.firewall() => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let mut host = Netlink::new()?;
        delete_with_retry(&mut nf, |nf| {
            let masq = firewall::masq_garbage(nf, network, &keep_masq)?;
            let spoof = if conf.macspoofchk {
                let mut owner_of = |name: &str| -> Result<firewall::PortOwner> {
                    Ok(match host.link_by_name(name)? {
                        None => firewall::PortOwner::Gone,
                        Some(l) => match l.alias.as_deref().and_then(AttachmentId::from_veth_alias) {
                            Some(a) => firewall::PortOwner::Attachment(a),
                            None => firewall::PortOwner::Unknown,
                        },
                    })
                };
                firewall::spoof_garbage(nf, network, &mut owner_of, &keep_spoof)?
            } else {
                Vec::new()
            };
            Ok(firewall::gc_ops(&masq, &spoof))
        })
        .map(drop)
    };
    if let Err(e) = firewall_gc() {
        errors.push(e.context("garbage-collect firewall rules"));
    }
    // upstream's iptables masquerade chains of this network's dead attachments
    errors.take(crate::upstream_masq::gc(req));
    if conf.l3 {
        errors.take(ipam::gc(req));
    }
    errors.finish()
}

/// STATUS: code 50 only when no ADD could work (docs/real-clients.md, "STATUS"): nf_tables
/// cannot hold the rules `ipMasq`/`macspoofchk` need (their ADD transaction, for a made-up
/// attachment, is processed by the kernel and never committed), br_netfilter is missing for
/// `bridgeNfCallIptables`, or the IPAM plugin says so.
pub fn status(req: &Request) -> Result<()> {
    let conf = Conf::from_request(req)?;
    crate::add::require_br_netfilter(&conf)?;
    if conf.ip_masq || conf.macspoofchk {
        firewall::validate_status(conf.ip_masq, conf.macspoofchk).map_err(|e| {
            CniError::new(code::NOT_AVAILABLE, format!("nf_tables cannot hold the bridge's rules: {e}"))
        })?;
    }
    if conf.l3 {
        ipam::status(req)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cni_common::netlink::nft::NftFamily;
    use ipnet::IpNet;

    /// An object a teardown transaction names vanishes before it commits (a concurrent DEL or
    /// GC got there first): the transaction is rebuilt from what is left and succeeds; one that
    /// keeps failing that way ends with code 11. Kernel test (root) in a private namespace.
    #[test]
    fn teardown_rebuilds_when_something_vanished_and_gives_up_with_11() {
        // SAFETY: moves only this test's thread into a new network namespace.
        let r = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "unshare(CLONE_NEWNET): this test needs root");
        let mut nf = NfTables::new().unwrap();
        let a = AttachmentId::new("net", "ctr", "eth0");
        let addrs: Vec<IpNet> = vec!["10.1.0.5/24".parse().unwrap(), "fd00:1::5/64".parse().unwrap()];
        let masq = Some((addrs.as_slice(), None));
        let vanished = |handle| NftDelete::Rule {
            family: NftFamily::Inet,
            table: firewall::MASQ_TABLE.into(),
            chain: firewall::MASQ_CHAIN.into(),
            handle,
        };
        // The attachment's teardown, naming a rule that was there when read and is gone now in
        // the builds `vanish` picks; returns the outcome and how many builds it took.
        let teardown = |nf: &mut NfTables, vanish: &dyn Fn(usize) -> bool| {
            let mut builds = 0;
            let r = delete_with_retry(nf, |nf| {
                builds += 1;
                let f = firewall::find(nf, &a, true, true)?;
                let mut ops = firewall::del_ops(&a, &f);
                if vanish(builds) {
                    assert_eq!(f.masq.len(), 2);
                    ops.push(vanished(f.masq[1].handle + 1000));
                }
                Ok(ops)
            });
            (r, builds)
        };
        firewall::apply_add(&mut nf, &a, masq, None).unwrap();
        let (deleted, builds) = teardown(&mut nf, &|n| n == 1);
        assert!(deleted.unwrap());
        assert_eq!(builds, 2, "rebuilt once");
        assert!(firewall::find(&mut nf, &a, true, true).unwrap().is_empty());
        // nothing left to delete: nothing done
        let (again, _) = teardown(&mut nf, &|_| false);
        assert!(!again.unwrap());
        // always something gone: bounded, code 11, and the real rules are still there
        firewall::apply_add(&mut nf, &a, masq, None).unwrap();
        let (r, builds) = teardown(&mut nf, &|_| true);
        let e = r.unwrap_err();
        assert_eq!(e.code, code::TRY_AGAIN, "{}", e.msg);
        assert_eq!(builds, TEARDOWN_ATTEMPTS);
        assert_eq!(firewall::find(&mut nf, &a, true, true).unwrap().masq.len(), 2, "all or nothing");
    }
}
