//! The slow paths, under a file lock: ADD after its fast path failed (conflicts, stale holders,
//! ports shared between attachments of one container, a missing or outdated static part) and
//! the withdrawals of DEL (without prevResult, or of shared ports) and GC. Each reads the table
//! and commits what it decided in one transaction, migrating a table in the previous layout
//! in the same transaction (see [`crate::legacy`]).

use crate::claims::{self, Conflict, Gone};
use crate::config::{Conf, Fam};
use crate::layout;
use crate::model::Hash;
use crate::netns;
use crate::owner::{describe_holder, Owner};
use crate::table::{Listing, Want};
use crate::wire;
use cni_common::netlink::nft::NfTables;
use cni_common::nft_cli::Nft;
use cni_common::{CniError, Result};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs::File;

/// Serialises the slow paths and GC of concurrent invocations (the fast paths need no lock:
/// the kernel checks the claims). Machine-wide, like the xtables lock, but only held while
/// reading the table and committing one transaction.
const LOCK_PATH: &str = "/run/cni/portmap.lock";
/// How often a slow path is retried when the table changed between reading and committing.
const SLOW_ATTEMPTS: usize = 3;

fn lock() -> Result<nix::fcntl::Flock<File>> {
    let dir = std::path::Path::new(LOCK_PATH).parent().expect("has a parent");
    std::fs::create_dir_all(dir).map_err(|e| CniError::io(format!("create {}: {e}", dir.display())))?;
    let f = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(LOCK_PATH)
        .map_err(|e| CniError::io(format!("open {LOCK_PATH}: {e}")))?;
    nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| CniError::io(format!("lock {LOCK_PATH}: {e}")))
}

/// Attachments of other containers whose claims an ADD replaces because their pods are gone.
#[derive(Default)]
struct Stale {
    tags: HashSet<String>,
    hashes: HashSet<Hash>,
    notes: Vec<String>,
}

fn refuse(c: &Conflict) -> CniError {
    CniError::config(format!(
        "host port {} is already mapped by {}: refusing to shadow it",
        c.port.describe(),
        describe_holder(c.holder.as_deref())
    ))
    .with_details(format!(
        "conflicting element: {}; if that pod no longer exists, DEL it or run GC for its network",
        c.elem.elem
    ))
}

/// Sort the conflicts of `want` into stale holders (every claimant's recorded namespace is
/// gone, see [`netns`]) and live ones: the first live one is refused, naming its holder.
fn stale_holders(l: &Listing, want: &Want, owner: &Owner) -> Result<Stale> {
    let mut stale = Stale::default();
    let mut checked: HashMap<Hash, Option<String>> = HashMap::new();
    for c in claims::conflicts(l, want, owner) {
        let mut why = Vec::new();
        for (_, hash) in &c.claimants {
            let verdict = checked
                .entry(*hash)
                .or_insert_with(|| l.netns_record(*hash).and_then(|(id, path)| netns::gone(id, &path)));
            why.extend(verdict.clone());
        }
        if c.claimants.is_empty() || why.len() < c.claimants.len() {
            return Err(refuse(&c));
        }
        why.sort();
        why.dedup();
        stale.notes.push(format!(
            "portmap: note: host port {} was held by {}, but {}: its mappings are removed",
            c.port.describe(),
            describe_holder(c.holder.as_deref()),
            why.join("; ")
        ));
        for (tag, hash) in c.claimants {
            stale.tags.insert(tag);
            stale.hashes.insert(hash);
        }
    }
    Ok(stale)
}

/// The slow ADD path: read the table, refuse claims of other live containers (replacing stale
/// ones), and apply this attachment's changes in one transaction: over netlink, or with one
/// `nft -f` when the DNAT part must be (re)built with conditions. Returns the UDP ports whose
/// target changed.
pub fn add(
    nf: &mut NfTables,
    conf: &Conf,
    want: &Want,
    owner: &Owner,
    fast_err: CniError,
) -> Result<BTreeSet<(Fam, u16)>> {
    let _lock = lock()?;
    let mut last = fast_err;
    let mut rebuild = false;
    let mut nft = None;
    let conditions = !conf.conditions_v4.is_empty() || !conf.conditions_v6.is_empty();
    for _ in 0..SLOW_ATTEMPTS {
        let read = wire::read(nf)?;
        rebuild |= read.is_none();
        let l = read.unwrap_or_default();
        let stale = stale_holders(&l, want, owner)?;
        let gone = |tag: &str, h: Option<Hash>| {
            tag == owner.tag
                || h == Some(owner.hash)
                || stale.tags.contains(tag)
                || h.is_some_and(|h| stale.hashes.contains(&h))
        };
        let plan = claims::plan(&l, &gone, Some(want));
        let mut lens = l.net_lens();
        lens.extend(want.net_lens());
        let dnat_fix = rebuild || layout::dnat_problem(&l, conf).is_some();
        let masq_fix = rebuild || layout::masq_problem(&l, &lens).is_some();
        let applied = if dnat_fix && conditions {
            let nft = match &nft {
                Some(n) => n,
                None => nft.insert(Nft::find()?),
            };
            let mut script = layout::setup_script(conf, &l.gate_chains(), &lens, &l.legacy_sets);
            script.push_str(&wire::plan_script(&l, &plan));
            nft.apply(&script)
        } else {
            let mut ops = Vec::new();
            if dnat_fix {
                ops.extend(wire::dnat_ops(conf, &l.gate_chains(), &lens).expect("no conditions"));
            }
            if masq_fix {
                ops.extend(wire::masq_ops(&lens, &l.legacy_sets));
            }
            ops.extend(wire::plan_ops(&l, &plan));
            nf.apply(&ops).map_err(CniError::from)
        };
        match applied {
            Ok(()) => {
                for n in &stale.notes {
                    eprintln!("{n}");
                }
                return Ok(plan.udp_ports());
            }
            // A concurrent change, or a set that went missing: retried from a new read with
            // the static part rebuilt.
            Err(e) => {
                last = e;
                rebuild = true;
            }
        }
    }
    if conditions {
        if let Some(nft) = &nft {
            if let Err(e) = nft.check(&layout::conditions_probe_script(conf)) {
                return Err(CniError::config(format!(
                    "conditionsV4/conditionsV6 are not valid nft syntax: {}",
                    e.msg.trim_start_matches("nft check failed: ")
                )));
            }
        }
    }
    Err(last.context("portmap: could not install the port mappings"))
}

/// Under the lock: withdraw the claims of the attachments `gone` selects (the remaining
/// claimants of a shared host port keep it) and delete their other elements, in one netlink
/// transaction; returns the UDP ports whose target changed. With `drop_empty_table`, a table
/// left without any element is deleted.
pub fn withdraw(
    nf: &mut NfTables,
    gone: Gone<'_>,
    drop_empty_table: bool,
    what: &str,
) -> Result<BTreeSet<(Fam, u16)>> {
    let _lock = lock()?;
    let mut last = None;
    for _ in 0..SLOW_ATTEMPTS {
        let Some(l) = wire::read(nf)? else { return Ok(BTreeSet::new()) };
        let plan = claims::plan(&l, gone, None);
        let lens = l.net_lens();
        let migrate = layout::masq_problem(&l, &lens).is_some();
        let ops = if drop_empty_table && l.remaining(plan.delete.len(), plan.add.len()) == 0 {
            // Nothing of any network is mapped any more: leave no table behind.
            vec![wire::delete_table_op()]
        } else if plan.is_empty() && !migrate {
            return Ok(BTreeSet::new());
        } else {
            let mut ops = if migrate { wire::masq_ops(&lens, &l.legacy_sets) } else { Vec::new() };
            ops.extend(wire::plan_ops(&l, &plan));
            ops
        };
        match nf.apply(&ops) {
            Ok(()) => return Ok(plan.udp_ports()),
            Err(e) => last = Some(CniError::from(e)),
        }
    }
    Err(last.expect("an attempt failed").context(what))
}
