//! Taking an attachment's nftables state out: DEL's, ADD's undo and resync's undo, in one
//! netlink transaction rebuilt from what is left when something it names vanished meanwhile.

use cni_common::attachment::AttachmentId;
use cni_common::error::{code, CniError, Result};
use cni_common::netlink::nft::{NfTables, NftDelete, NftOp};
use cni_common::Request;

use super::{del_ops, find, Nft};

/// How often a teardown transaction is rebuilt because something it named vanished meanwhile.
/// Each failed attempt means a concurrent DEL or GC removed part of what this one read, so
/// the garbage only shrinks; the bound is for a table that keeps changing for another reason.
const TEARDOWN_ATTEMPTS: usize = 16;

/// Find `build`'s deletions and commit them in one netlink transaction. An nf_tables
/// transaction is all or nothing: when it fails because an object it names is gone (a
/// concurrent DEL or GC removed it first: ENOENT), nothing was deleted, so read again and
/// retry with what is left; already gone is success. Past [`TEARDOWN_ATTEMPTS`] code 11.
/// Returns whether this socket committed a deletion.
pub(crate) fn delete_with_retry(
    nf: &mut dyn Nft,
    mut build: impl FnMut(&mut dyn Nft) -> Result<Vec<NftDelete>>,
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
/// Without `spoof` the spoof check is left: the container interface CNI_IFNAME is another
/// network's attachment, whose spoof check is keyed by the same `<containerID>-<ifname>`
/// (upstream's chain names and comments do not name the network).
pub(crate) fn remove(req: &Request, required: bool, spoof: bool) -> Result<Option<NfTables>> {
    let att = &AttachmentId::of(req);
    let mut nf = match NfTables::new() {
        Ok(nf) => nf,
        Err(e) if !required => {
            cni_common::log!("bridge", "nftables not readable, skipping firewall cleanup: {e}");
            return Ok(None);
        }
        Err(e) => return Err(e.into()),
    };
    let changed = remove_with(&mut nf, att, spoof)?;
    Ok(changed.then_some(nf))
}

/// Remove `att`'s firewall state through `nf` (its spoof check only with `spoof`); whether
/// something was deleted.
pub(crate) fn remove_with(nf: &mut dyn Nft, att: &AttachmentId, spoof: bool) -> Result<bool> {
    delete_with_retry(nf, |nf| Ok(del_ops(att, &find(nf, att, true, spoof)?)))
        .map_err(|e| e.context("remove firewall rules"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::firewall;
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
