//! The verbs, each one loop: read what the plan needs, plan, apply one transaction; read
//! again when the transaction was refused because the table changed since it was read
//! (`ERESTART`), when its answer was lost (`ENOBUFS`, a receive deadline: did it commit? the
//! next read tells), or when what a point read assumed was not so (`EEXIST`, `ENOENT`; and
//! `EINVAL`, a key that does not fit the set of its name, whether looked up or added: read
//! everything, whose listing of the sets tells what they are). Bounded: past [`ATTEMPTS`] or
//! [`DEADLINE`], code 11 ("try again later"), and nothing half-done (every transaction is all
//! or nothing).

use crate::config::{Conditions, Conf, Intent, Lens};
use crate::kernel::Kernel;
use crate::layout::declaration;
use crate::model::{Key, NsId, Owner};
use crate::plan::{self, Checked, Judge, Plan, Step};
use crate::state::{Scope, State};
use cni_common::net::Family;
use cni_common::netlink::nft::certify;
use cni_common::netlink::NlError;
use cni_common::{code, CniError, Result};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// Attempts of one verb before it gives up with code 11.
pub const ATTEMPTS: usize = 64;
/// Time one verb may spend re-reading and re-planning before it gives up with code 11.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// What a verb changed that the caller acts on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    /// UDP host ports whose DNAT target was set or removed (flush their conntrack entries).
    pub udp: BTreeSet<(Family, u16)>,
    pub notes: Vec<String>,
}

/// A short pause after a refused transaction, growing with the attempts and varying between
/// processes, so that verbs racing each other do not keep colliding.
fn backoff(attempt: usize) {
    let spread = (attempt.min(10) as u64 + 1) * 200;
    let seed =
        u64::from(std::process::id()) ^ Instant::now().elapsed().as_nanos() as u64 ^ (attempt as u64 * 7919);
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    std::thread::sleep(Duration::from_micros((seed ^ u64::from(nanos)) % spread));
}

fn transient(what: &str, why: String) -> CniError {
    CniError::new(code::TRY_AGAIN, format!("portmap: could not {what}: {why}; try again later"))
}

fn nl(what: &str, e: NlError) -> CniError {
    let e = CniError::from(e);
    let code = e.code;
    CniError::new(code, format!("portmap: could not {what}: {}", e.msg))
}

/// Read, plan with `plan_for`, apply; again as the module says, until [`DEADLINE`] after
/// `start` (when the verb started).
fn run(
    k: &mut dyn Kernel,
    first: Scope,
    what: &str,
    start: Instant,
    mut plan_for: impl FnMut(&State) -> Result<Step>,
) -> Result<Outcome> {
    let mut scope = first;
    let mut lost = Outcome::default();
    let mut refused = 0;
    // the last lost answer or torn read, named if the verb gives up
    let mut last: Option<NlError> = None;
    for attempt in 1..=ATTEMPTS {
        if start.elapsed() > DEADLINE {
            break;
        }
        let s = match k.read(&scope) {
            Ok(s) => s,
            Err(e) if e.is_transient() => {
                last = Some(e);
                continue;
            }
            Err(e) if e.errno == libc::EINVAL && scope != Scope::Full => {
                scope = Scope::Full;
                continue;
            }
            Err(e) => return Err(nl(what, e)),
        };
        let plan = match plan_for(&s)? {
            Step::ReadAll => {
                scope = Scope::Full;
                continue;
            }
            Step::Apply(p) => p,
        };
        if let Some(script) = &plan.nft {
            k.nft(script, false).map_err(|e| nft_failed(what, e))?;
            continue; // read again: the rest is planned on what nft made
        }
        let Plan { ops, guarded, mut udp, mut notes, .. } = plan;
        match k.apply(&ops, guarded.then_some(s.generation)) {
            Ok(()) => {
                udp.append(&mut lost.udp);
                lost.notes.append(&mut notes);
                return Ok(Outcome { udp, notes: lost.notes });
            }
            Err(e) if e.errno == libc::ERESTART => {
                last = None;
                backoff(attempt)
            }
            Err(e) if matches!(e.errno, libc::ENOBUFS | libc::ETIMEDOUT) => {
                // it may have committed: the next read tells (a no-op plan then)
                lost.udp.append(&mut udp);
                lost.notes.append(&mut notes);
                last = Some(e);
            }
            Err(e)
                if matches!(e.errno, libc::EEXIST | libc::ENOENT | libc::EINVAL) && scope != Scope::Full =>
            {
                scope = Scope::Full
            }
            Err(e) if matches!(e.errno, libc::EEXIST | libc::ENOENT | libc::EBUSY) && refused < 3 => {
                // planned on a full read at a generation that still held: a table changed
                // outside the generation's account (nft of another process) — once more
                refused += 1;
                backoff(attempt);
            }
            Err(e) => return Err(nl(what, e)),
        }
    }
    let waited = format!("{} s, up to {ATTEMPTS} attempts", start.elapsed().as_secs());
    Err(transient(
        what,
        match last {
            Some(e) => format!("gave up after {waited}; the last attempt: {e}"),
            None => format!("the table kept changing ({waited})"),
        },
    ))
}

/// An `nft -f` that failed: its input was ours but for the user's conditions, so that is what
/// nft refused (code 7), unless nft is missing (code 50) or timed out (11).
fn nft_failed(what: &str, e: CniError) -> CniError {
    if e.code == code::NOT_AVAILABLE || e.code == code::TRY_AGAIN {
        return e;
    }
    CniError::config(format!(
        "portmap: could not {what}: conditionsV4/conditionsV6 are not valid nft syntax: {}",
        e.msg.trim_start_matches("nft transaction failed: ")
    ))
}

/// ADD.
pub fn add(k: &mut dyn Kernel, conf: &Conf, want: &Intent, judge: Judge<'_>) -> Result<Outcome> {
    run(k, plan::add_scope(want, &conf.conditions), "install the port mappings", Instant::now(), |s| {
        plan::add(s, want, &conf.conditions, judge)
    })
}

/// The static part of the table, the localhost guard with it, where a `route_localnet` we set
/// needs it ([`crate::localnet`]): made or repaired when missing, untouched when intact.
pub fn guard(k: &mut dyn Kernel, conds: &Conditions) -> Result<Outcome> {
    run(k, plan::guard_scope(conds), "restore the localhost guard", Instant::now(), |s| plan::guard(s, conds))
}

/// What is missing of the static part (the guard with it), one line each; empty: intact.
/// Reads only.
pub fn guard_missing(k: &mut dyn Kernel, conds: &Conditions) -> Result<Vec<String>> {
    let read = |k: &mut dyn Kernel, scope: &Scope| k.read(scope).map_err(|e| nl("read the table", e));
    let s = read(k, &plan::guard_scope(conds))?;
    if s.found.hooked() {
        return Ok(Vec::new());
    }
    let s = read(k, &Scope::Full)?;
    Ok(declaration(&crate::layout::lens_in(&s.found.rules), conds).problems(&s.found))
}

/// DEL of attachment `me`; `intent` when the configuration names its elements.
pub fn del(k: &mut dyn Kernel, me: &Owner, intent: Option<&Intent>) -> Result<Outcome> {
    run(k, plan::del_scope(me), "delete the port mappings", Instant::now(), |s| plan::del(s, me, intent))
}

/// GC of the attachments of a network (tag prefix `prefix`) not in `valid`.
pub fn gc(k: &mut dyn Kernel, prefix: &str, valid: &BTreeSet<String>) -> Result<Outcome> {
    run(k, Scope::Full, "garbage-collect stale port mappings", Instant::now(), |s| {
        plan::gc(s, prefix, valid).map(Step::Apply)
    })
}

/// Delete the table when no attachment holds anything in it (a node going back to upstream's
/// plugins: `cni-migrate to-upstream`). Guarded: an ADD in the meantime keeps it.
pub fn drop_if_unused(k: &mut dyn Kernel) -> Result<()> {
    run(k, Scope::Full, "delete the unused table", Instant::now(), |s| {
        let used = s.elems().any(|l| !matches!(l.elem.key, Key::Attachment(_) | Key::Netns(_)));
        let ops = if s.found.table && !used {
            vec![cni_common::netlink::nft::NftOp::Delete(cni_common::netlink::nft::NftDelete::Table {
                family: crate::layout::FAMILY,
                table: crate::layout::TABLE.into(),
            })]
        } else {
            Vec::new()
        };
        Ok(Step::Apply(Plan { ops, guarded: true, ..Default::default() }))
    })
    .map(|_| ())
}

/// CHECK (reads only). Lines for stderr go to `notes` whatever the outcome (the caller prints
/// them).
pub fn check(
    k: &mut dyn Kernel,
    conf: &Conf,
    want: &Intent,
    netns_now: Option<NsId>,
    notes: &mut Vec<String>,
) -> Result<()> {
    let read = |k: &mut dyn Kernel, scope: &Scope| k.read(scope).map_err(|e| nl("read the port mappings", e));
    let s = match k.read(&plan::check_scope(want)) {
        Ok(s) => s,
        // a key that does not fit the set of its name: the full read's listing says why
        Err(e) if e.errno == libc::EINVAL => read(k, &Scope::Full)?,
        Err(e) => return Err(nl("read the port mappings", e)),
    };
    let start = notes.len();
    if plan::check(&s, want, &conf.conditions, netns_now, notes)? == Checked::Ok {
        return Ok(());
    }
    notes.truncate(start); // only the notes of the read that decides
    let s = read(k, &Scope::Full)?;
    match plan::check(&s, want, &conf.conditions, netns_now, notes)? {
        Checked::Ok => Ok(()),
        Checked::ReadAll => Err(CniError::internal("portmap: CHECK could not decide on a full read")),
    }
}

/// STATUS: the whole layout (with a masquerade set of each family) is dry-run: processed by
/// the kernel and never committed; a gate chain with conditions is checked by `nft -c`. The
/// dry run's abort holds the namespace's nf_tables lock for an RCU grace period, so its success
/// is certified in `certificates` (cni-common's `nft::certify`: per boot, namespace and exact
/// batch) and later calls only read the generation to see nf_tables answer. `None`, or
/// conditions (their `nft` is checked on every call): every call dry-runs.
pub fn status(k: &mut dyn Kernel, conf: &Conf, certificates: Option<&std::path::Path>) -> Result<()> {
    let cannot = |msg: String| {
        CniError::new(code::NOT_AVAILABLE, format!("nf_tables cannot hold the portmap rules: {msg}"))
    };
    let lens: Lens = [(Family::V4, 24), (Family::V6, 64)].into();
    let setup = declaration(&lens, &conf.conditions).setup(&crate::layout::Found::default());
    let fingerprint = certify::fingerprint(&setup.ops, setup.nft.as_deref());
    // A gate chain with conditions is applied by running `nft`, which can vanish or change
    // (CNI_NFT) after any certificate: with conditions every STATUS checks them with `nft -c`.
    let certificates = certificates.filter(|_| setup.nft.is_none());
    let k = std::cell::RefCell::new(k);
    certify::certified(
        certificates,
        "portmap",
        &fingerprint,
        || k.borrow_mut().answers().map_err(|e| cannot(e.to_string())),
        || {
            let mut k = k.borrow_mut();
            k.validate(&setup.ops).map_err(|e| cannot(e.to_string()))?;
            match &setup.nft {
                Some(script) => {
                    k.nft(script, true)
                        .map_err(|e| if e.code == code::NOT_AVAILABLE { e } else { cannot(e.msg) })
                }
                None => Ok(()),
            }
        },
    )
}

#[cfg(test)]
mod tests;
