//! The planner: from what the verb wants and the [`State`] read, the one transaction that
//! makes the table so. Pure: no kernel, no file system (a holder's namespace is judged by the
//! caller's [`Judge`]).
//!
//! A plan made from a point read ([`Scope::Point`](crate::state::Scope)) only adds elements and
//! is not guarded: the kernel itself refuses an element whose key exists with other data, so a
//! host port held by someone else, or an attachment whose earlier elements differ, makes it
//! fail as a whole, and the verb reads everything and plans again. A plan that deletes or
//! replaces what it read is guarded by the generation it read: if anything changed since, the
//! kernel refuses it and the verb reads again.
//!
//! Host ports and their claimants: every attachment that wants a host port has a `claims`
//! element `port . its hash : target`. The port's `owner` and DNAT elements follow from the
//! claims ([`slots`]): one claimant holds it alone (`owner` = its hash); several claimants,
//! necessarily attachments of one container (a runtime attaching the container to several
//! networks with the same portMappings, as Podman does), share it (`owner` = the container's
//! shared hash) and the DNAT element leads to one of them, the *active* one: the first stays
//! active; when it goes, the remaining claimant whose tag sorts first takes over.

use crate::config::{fingerprint, Conditions, Intent};
use crate::layout::{self, declaration, lens_in};
use crate::model::{
    container_of, describe_holder, shared_hash, Elem, Hash, HostPort, Key, NsId, Owner, Set, Target,
};
use crate::state::{Held, Listed, Scope, State};
use cni_common::net::{Family, Proto};
use cni_common::netlink::nft::{NftElem, NftOp};
use cni_common::{CniError, Result};
use std::collections::{BTreeMap, BTreeSet};

/// Tells whether a holder's recorded network namespace is gone: Some(why) when it provably
/// is, None when it is (or may be) alive.
pub type Judge<'a> = &'a dyn Fn(&NsId, &str) -> Option<String>;

/// One transaction, and what follows from it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub ops: Vec<NftOp>,
    /// An `nft -f` script to run first (a gate chain with user conditions); after it, the verb
    /// reads again and plans the rest.
    pub nft: Option<String>,
    /// Commit only at the generation read.
    pub guarded: bool,
    /// UDP host ports whose DNAT target is set or removed (their conntrack entries are flushed).
    pub udp: BTreeSet<(Family, u16)>,
    /// Lines for stderr (holders whose pods are gone, replaced).
    pub notes: Vec<String>,
}

/// What the verb does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Apply(Plan),
    /// The point read was not enough: read everything and plan again.
    ReadAll,
}

/// What ADD reads first: the attachment's record and netns record, and how many jumps lead to
/// each of the layout's chains (for these conditions): a few look-ups, whatever the number of
/// mappings or of attachments.
pub fn add_scope(want: &Intent, conds: &Conditions) -> Scope {
    let h = want.owner.hash;
    let chains = declaration(&want.lens(), conds).uses();
    Scope::Point { keys: vec![Key::Attachment(h), Key::Netns(h)], chains, rules: false }
}

/// What DEL reads first: the attachment's record and netns record.
pub fn del_scope(me: &Owner) -> Scope {
    Scope::Point {
        keys: vec![Key::Attachment(me.hash), Key::Netns(me.hash)],
        chains: Vec::new(),
        rules: false,
    }
}

/// What CHECK reads first: every element it compares, and the rules.
pub fn check_scope(want: &Intent) -> Scope {
    let h = want.owner.hash;
    let mut keys = vec![Key::Attachment(h), Key::Netns(h)];
    keys.extend(want.ports().map(Key::Owner));
    keys.extend(want.ports().map(Key::Dnat));
    keys.extend(want.claims().map(|e| e.key));
    keys.extend(want.masq_elems().map(|e| e.key));
    Scope::Point { keys, chains: Vec::new(), rules: true }
}

/// What the guard's verbs read first: the layout version and the reference counts of the
/// static chains (the guard's rules among them).
pub fn guard_scope(conds: &Conditions) -> Scope {
    Scope::Point { keys: Vec::new(), chains: declaration(&Default::default(), conds).uses(), rules: false }
}

/// The static part of the table (the `localnet` guard with it) where a `route_localnet` we set
/// needs it and no host port of the attachment would make it (see [`crate::localnet`]):
/// nothing when a point read finds it hooked, else what [`layout::Declaration::setup`] says on
/// a full read, guarded by the generation read. A table of the previous layout is left to the
/// next ADD with host ports, which upgrades it with its elements.
pub fn guard(s: &State, conds: &Conditions) -> Result<Step> {
    refuse_unknown_layout(s)?;
    if !s.complete {
        return Ok(if s.found.hooked() { Step::Apply(Plan::default()) } else { Step::ReadAll });
    }
    // A table without the version element but with no set at all holds nothing to upgrade: it
    // is what the gate chains' nft script (user conditions) made a moment ago, in this verb or
    // in one killed before its transaction, and the setup completes it. Only a table of sets
    // (of the previous layout) waits for an ADD with host ports.
    let bare = s.found.sets.as_ref().is_some_and(Vec::is_empty);
    if s.found.table && !s.found.current && !bare {
        let note =
            "portmap: note: the table is of the previous layout; the next ADD with host ports upgrades it \
                    (and adds the localhost guard)";
        return Ok(Step::Apply(Plan { notes: vec![note.into()], ..Default::default() }));
    }
    let setup = declaration(&lens_in(&s.found.rules), conds).setup(&s.found);
    Ok(Step::Apply(Plan { ops: setup.ops, nft: setup.nft, guarded: true, ..Default::default() }))
}

/// Element deletions (keys in the table) and additions (with comments), in one transaction.
#[derive(Debug, Default)]
struct Change {
    delete: BTreeSet<Key>,
    add: BTreeMap<Key, (Elem, String)>,
}

impl Change {
    /// Make `key` hold `want` (None: nothing) given what the table holds.
    fn set(&mut self, cur: Option<&Listed>, key: Key, want: Option<(Elem, String)>) {
        let same = match (cur, &want) {
            (Some(l), Some((e, c))) => l.elem == *e && l.comment.as_deref() == Some(c.as_str()),
            (None, None) => true,
            _ => false,
        };
        if same {
            return;
        }
        if cur.is_some() {
            self.delete.insert(key);
        }
        if let Some(w) = want {
            self.add.insert(key, w);
        }
    }

    fn into_plan(self, mut plan: Plan) -> Plan {
        let udp = |k: &Key| match k {
            Key::Dnat(hp) if hp.proto == Proto::Udp => Some((hp.fam, hp.port)),
            _ => None,
        };
        plan.udp.extend(self.delete.iter().chain(self.add.keys()).filter_map(udp));
        // A masquerade element is keyed by container address and port alone, so one there
        // already is another attachment's at the same address (a pod gone without DEL whose
        // address host-local reclaimed; or this one's, an ADD retried), and an `add` would
        // keep its tag: a GC or DEL of that one would then take the element this one needs.
        // They are created exclusively: EEXIST makes the verb read everything, and the full
        // plan deletes the element (its tag differs) before creating it, in one transaction.
        let (create, add): (Vec<_>, Vec<_>) =
            self.add.values().partition(|(e, _)| matches!(e.key, Key::Masq(_)));
        plan.ops.extend(element_ops(
            self.delete.iter().map(|k| (k.set(), Elem::encode_key(k))),
            add.into_iter().map(|(e, c)| (e.set(), e.encode(Some(c)))),
        ));
        let table = || layout::TABLE.to_string();
        let mut by_set: BTreeMap<Set, Vec<NftElem>> = BTreeMap::new();
        for (e, c) in create {
            by_set.entry(e.set()).or_default().push(e.encode(Some(c)));
        }
        plan.ops.extend(by_set.into_iter().map(|(s, elems)| NftOp::CreateElements {
            family: layout::FAMILY,
            table: table(),
            set: s.name(),
            elems,
        }));
        plan
    }
}

/// Deletions, then additions, one operation per set each (nf_tables splits them into
/// messages of at most 64 KiB).
fn element_ops(
    dels: impl Iterator<Item = (Set, NftElem)>,
    adds: impl Iterator<Item = (Set, NftElem)>,
) -> Vec<NftOp> {
    let group = |it: &mut dyn Iterator<Item = (Set, NftElem)>| {
        let mut m: BTreeMap<Set, Vec<NftElem>> = BTreeMap::new();
        for (s, e) in it {
            m.entry(s).or_default().push(e);
        }
        m
    };
    let (mut dels, mut adds) = (dels, adds);
    let table = || layout::TABLE.to_string();
    let mut ops: Vec<NftOp> = group(&mut dels)
        .into_iter()
        .map(|(s, elems)| NftOp::DeleteElements {
            family: layout::FAMILY,
            table: table(),
            set: s.name(),
            elems,
        })
        .collect();
    ops.extend(group(&mut adds).into_iter().map(|(s, elems)| NftOp::AddElements {
        family: layout::FAMILY,
        table: table(),
        set: s.name(),
        elems,
    }));
    ops
}

/// A claimant of a host port.
#[derive(Debug, Clone)]
struct Claimant {
    tag: String,
    hash: Hash,
    target: Target,
}

/// The `owner` and DNAT elements (with their comment, the active claimant's tag) a host port
/// needs, given its claimants and its current DNAT element; None when nobody claims it.
fn slots(port: HostPort, claimants: &[Claimant], dnat: Option<&Listed>) -> Option<[(Elem, String); 2]> {
    let first = claimants.iter().min_by(|a, b| a.tag.cmp(&b.tag))?;
    let active = dnat
        .and_then(|d| claimants.iter().find(|c| d.comment.as_deref() == Some(c.tag.as_str())))
        .unwrap_or(first);
    let value = match claimants {
        [_] => active.hash,
        _ => shared_hash(container_of(&active.tag).unwrap_or_default()),
    };
    Some([
        (Elem::owner(port, value), active.tag.clone()),
        (Elem::dnat(port, active.target), active.tag.clone()),
    ])
}

/// Which attachments a full plan withdraws, by tag and by hash.
struct Gone<'a> {
    tag: &'a dyn Fn(&str) -> bool,
    hash: &'a dyn Fn(Hash) -> bool,
}

impl Gone<'_> {
    fn held(&self, x: &Held) -> bool {
        (self.tag)(&x.tag) || (self.hash)(x.hash)
    }
}

/// The element changes of a full plan: the attachments `gone` selects are withdrawn
/// (remaining claimants of their host ports take over), `want` (if any) is claimed, records
/// (`attachments`) are written for attachments of an earlier layout when `records`, and
/// `netns`/`attachments` records of attachments left without a claim go.
fn reconcile(s: &State, gone: &Gone<'_>, want: Option<&Intent>, records: bool) -> Change {
    let held = s.held();
    let mut ch = Change::default();
    let me = want.map(|w| w.owner.hash);
    let mut desired: BTreeMap<Key, (Elem, String)> = BTreeMap::new();
    if let Some(w) = want {
        let tag = &w.owner.tag;
        for e in w.claims().chain(w.masq_elems()) {
            desired.insert(e.key, (e, tag.clone()));
        }
        if records {
            desired.insert(Key::Attachment(w.owner.hash), (w.record(), tag.clone()));
        }
        if let Some((e, path)) = w.netns_elem() {
            desired.insert(e.key, (e, path));
        }
    }
    let staying: Vec<&Held> = held.iter().filter(|x| !gone.held(x) && Some(x.hash) != me).collect();
    if records {
        for x in staying.iter().filter(|x| x.record.is_none()) {
            let elems = x
                .claims
                .iter()
                .map(|(p, t)| Elem::claim(*p, x.hash, *t))
                .chain(x.masq.iter().map(|m| Elem::masq(*m)));
            desired.insert(
                Key::Attachment(x.hash),
                (Elem::attachment(x.hash, fingerprint(elems)), x.tag.clone()),
            );
        }
    }
    // the final claims, by host port
    let mut claimants: BTreeMap<HostPort, Vec<Claimant>> = BTreeMap::new();
    for x in &staying {
        for (p, t) in &x.claims {
            claimants.entry(*p).or_default().push(Claimant { tag: x.tag.clone(), hash: x.hash, target: *t });
        }
    }
    if let Some(w) = want {
        for e in &w.entries {
            let c = Claimant { tag: w.owner.tag.clone(), hash: w.owner.hash, target: e.target() };
            claimants.entry(e.host).or_default().push(c);
        }
    }
    let claimed: BTreeSet<Hash> = claimants.values().flatten().map(|c| c.hash).collect();
    // per-attachment elements: the withdrawn ones' go, records of the unclaimed go
    let gone_tag = |c: &Option<String>| c.as_deref().is_some_and(|c| (gone.tag)(c));
    let mut ports: BTreeSet<HostPort> = want.iter().flat_map(|w| w.ports()).collect();
    for l in s.elems() {
        let k = l.elem.key;
        let stale = match k {
            Key::Claim(p, h) => {
                let g = (gone.hash)(h) || gone_tag(&l.comment) || Some(h) == me;
                if g {
                    ports.insert(p);
                }
                g
            }
            Key::Attachment(h) | Key::Netns(h) => (gone.hash)(h) || !claimed.contains(&h),
            Key::Masq(_) => gone_tag(&l.comment),
            Key::Owner(p) | Key::Dnat(p) => {
                if gone_tag(&l.comment) || l.elem.hash_data().is_some_and(|h| (gone.hash)(h)) {
                    ports.insert(p);
                }
                false
            }
        };
        if stale && !desired.contains_key(&k) {
            ch.set(Some(l), k, None);
        }
    }
    for (k, w) in desired {
        ch.set(s.get(&k), k, Some(w));
    }
    // the owner and DNAT elements of every host port whose claimants changed
    for p in ports {
        let want_slots = slots(p, claimants.get(&p).map_or(&[][..], Vec::as_slice), s.get(&Key::Dnat(p)));
        let [o, d] = match want_slots {
            Some([o, d]) => [Some(o), Some(d)],
            None => [None, None],
        };
        ch.set(s.get(&Key::Owner(p)), Key::Owner(p), o);
        ch.set(s.get(&Key::Dnat(p)), Key::Dnat(p), d);
    }
    ch
}

/// Refuse a table this build does not know: one whose `layout` set names another version (a
/// newer build made it), or, when the read listed the sets, one whose sets are not of a layout
/// it knows ([`layout::unfit`]). Code 999, nothing changed.
fn refuse_unknown_layout(s: &State) -> Result<()> {
    if s.other_versions.is_empty() {
        return match layout::unfit(&s.found) {
            Some(why) => Err(CniError::internal(format!("portmap: {why}"))),
            None => Ok(()),
        };
    }
    Err(CniError::internal(format!(
        "table {} {} is of layout version {:?}, which this build does not know (it writes version {}): \
         a newer portmap made it; use that build, or delete the table (its host ports stop working)",
        layout::FAMILY.keyword(),
        layout::TABLE,
        s.other_versions,
        layout::VERSION
    )))
}

fn refuse(port: HostPort, holder: Option<&str>, elem: &Elem) -> CniError {
    CniError::config(format!(
        "host port {} is already mapped by {}: refusing to shadow it",
        port.describe(),
        describe_holder(holder)
    ))
    .with_details(format!(
        "conflicting element: {elem}; if that pod no longer exists, DEL it or run GC for its network"
    ))
}

/// The elements of `want` holding each of its host ports alone, its record and its netns
/// record (replacing `netns_now`, an outdated one), all added.
fn fresh(want: &Intent, netns_now: Option<&Listed>) -> Change {
    let mut ch = Change::default();
    for e in want.sole_elements() {
        ch.add.insert(e.key, (e, want.owner.tag.clone()));
    }
    if let Some((e, path)) = want.netns_elem() {
        if netns_now.is_some_and(|l| l.elem != e || l.comment.as_deref() != Some(path.as_str())) {
            ch.delete.insert(e.key);
        }
        ch.add.insert(e.key, (e, path));
    }
    ch
}

/// The transaction of an ADD of a new attachment into an intact table (the common case; what
/// the benchmark's floor sends bare).
pub fn add_ops(want: &Intent) -> Vec<NftOp> {
    fresh(want, None).into_plan(Plan::default()).ops
}

/// The transaction of a DEL of an attachment that holds its host ports alone, going by its
/// record (the common case; what the benchmark's floor sends bare).
pub fn del_ops(want: &Intent) -> Vec<NftOp> {
    sole_del_ops(want, sole_del(want).1).ops
}

/// DEL of an attachment by its record: every element it has when it holds each port alone,
/// its netns record. The `owner` elements are re-asserted first (added with the data they
/// must have: a no-op, or `EEXIST` when a port is shared or held by another, and the verb
/// then reads everything).
fn sole_del(want: &Intent) -> (Vec<Elem>, Change) {
    let mut ch = Change::default();
    let elems = want.sole_elements();
    ch.delete.extend(elems.iter().map(|e| e.key));
    if want.netns.is_some() {
        ch.delete.insert(Key::Netns(want.owner.hash));
    }
    let owners = elems.into_iter().filter(|e| matches!(e.key, Key::Owner(_))).collect();
    (owners, ch)
}

/// The ops of a DEL by record: the owner claims re-asserted, then the deletions.
fn sole_del_ops(want: &Intent, ch: Change) -> Plan {
    let (owners, _) = sole_del(want);
    let reassert =
        element_ops(std::iter::empty(), owners.iter().map(|e| (e.set(), e.encode(Some(&want.owner.tag)))));
    let mut plan = Plan { ops: reassert, guarded: true, ..Default::default() };
    plan = ch.into_plan(plan);
    plan
}

/// ADD of `want` with conditions `conds`.
pub fn add(s: &State, want: &Intent, conds: &Conditions, judge: Judge<'_>) -> Result<Step> {
    refuse_unknown_layout(s)?;
    let me = &want.owner;
    if !s.complete {
        // a point read: the jumps ADD relies on are in place, and the attachment is new or
        // unchanged; anything else is planned on a full read
        if !s.found.hooked() {
            return Ok(Step::ReadAll);
        }
        if s.hash_at(&Key::Attachment(me.hash)).is_some_and(|fp| fp != want.fingerprint()) {
            return Ok(Step::ReadAll);
        }
        let ch = fresh(want, s.get(&Key::Netns(me.hash)));
        let guarded = !ch.delete.is_empty();
        return Ok(Step::Apply(ch.into_plan(Plan { guarded, ..Default::default() })));
    }
    let mut lens = lens_in(&s.found.rules);
    lens.extend(want.lens());
    let setup = declaration(&lens, conds).setup(&s.found);
    let mut plan = Plan { ops: setup.ops, nft: setup.nft, ..Default::default() };
    if plan.nft.is_some() {
        return Ok(Step::Apply(plan));
    }
    let held = s.held();
    let mine = |tag: &str| tag == me.tag || container_of(tag) == Some(me.container.as_str());
    let mut stale: BTreeSet<Hash> = BTreeSet::new();
    for p in want.ports() {
        let others: Vec<&Held> = held
            .iter()
            .filter(|x| x.hash != me.hash && !mine(&x.tag) && x.claims.iter().any(|(q, _)| *q == p))
            .collect();
        let foreign = [Key::Dnat(p), Key::Owner(p)]
            .iter()
            .filter_map(|k| s.get(k))
            .find(|l| !l.comment.as_deref().is_some_and(|c| mine(c) || others.iter().any(|x| x.tag == c)));
        if let Some(l) = foreign.filter(|_| others.is_empty()) {
            return Err(refuse(p, l.comment.as_deref(), &l.elem));
        }
        if others.is_empty() {
            continue;
        }
        let holder =
            s.get(&Key::Dnat(p)).and_then(|d| d.comment.clone()).or_else(|| Some(others[0].tag.clone()));
        let why: Vec<String> =
            others.iter().filter_map(|x| x.netns.as_ref().and_then(|(id, path)| judge(id, path))).collect();
        if why.len() < others.len() {
            let elem = s
                .get(&Key::Dnat(p))
                .map_or(Elem::claim(p, others[0].hash, others[0].claims[0].1), |d| d.elem);
            return Err(refuse(p, holder.as_deref(), &elem));
        }
        let mut why = why;
        why.sort();
        why.dedup();
        plan.notes.push(format!(
            "portmap: note: host port {} was held by {}, but {}: its mappings are removed",
            p.describe(),
            describe_holder(holder.as_deref()),
            why.join("; ")
        ));
        stale.extend(others.iter().map(|x| x.hash));
    }
    let stale_tags: BTreeSet<String> =
        held.iter().filter(|x| stale.contains(&x.hash)).map(|x| x.tag.clone()).collect();
    let gone = Gone {
        tag: &|t| t == me.tag || stale_tags.contains(t),
        hash: &|h| h == me.hash || stale.contains(&h),
    };
    plan.guarded = true;
    Ok(Step::Apply(reconcile(s, &gone, Some(want), true).into_plan(plan)))
}

/// DEL of attachment `me`, whose elements `intent` names when the configuration and prevResult
/// allow (then, when its record's fingerprint says they are all it has and it holds each of
/// its host ports alone, they are deleted by key from a point read).
pub fn del(s: &State, me: &Owner, intent: Option<&Intent>) -> Result<Step> {
    if !s.found.table {
        return Ok(Step::Apply(Plan::default()));
    }
    // a newer layout (a newer build made it), or one of neither layout: not ours to change, as
    // for ADD
    refuse_unknown_layout(s)?;
    if !s.complete {
        if !s.found.current {
            return Ok(Step::ReadAll); // an earlier layout (or a newer one): a full read tells
        }
        let record = s.get(&Key::Attachment(me.hash));
        let netns = s.get(&Key::Netns(me.hash));
        let (w, mut ch) = match (record, intent) {
            (None, _) => (None, Change::default()),
            (Some(r), Some(w)) if r.elem.hash_data() == Some(w.fingerprint()) => (Some(w), sole_del(w).1),
            (Some(_), _) => return Ok(Step::ReadAll),
        };
        if netns.is_some() {
            ch.delete.insert(Key::Netns(me.hash));
        } else {
            ch.delete.remove(&Key::Netns(me.hash));
        }
        return Ok(Step::Apply(match w {
            Some(w) => sole_del_ops(w, ch),
            None => ch.into_plan(Plan { guarded: true, ..Default::default() }),
        }));
    }
    let gone = Gone { tag: &|t| t == me.tag, hash: &|h| h == me.hash };
    let plan =
        reconcile(s, &gone, None, s.found.current).into_plan(Plan { guarded: true, ..Default::default() });
    Ok(Step::Apply(plan))
}

/// GC of network `prefix` (the tag prefix of its attachments) keeping the attachments whose
/// tags are `valid`. Needs a full read.
pub fn gc(s: &State, prefix: &str, valid: &BTreeSet<String>) -> Result<Plan> {
    refuse_unknown_layout(s)?;
    let dead = |t: &str| t.starts_with(prefix) && !valid.contains(t);
    let held = s.held();
    let dead_hashes: BTreeSet<Hash> = held.iter().filter(|x| dead(&x.tag)).map(|x| x.hash).collect();
    let gone = Gone { tag: &dead, hash: &|h| dead_hashes.contains(&h) };
    Ok(reconcile(s, &gone, None, s.found.current).into_plan(Plan { guarded: true, ..Default::default() }))
}

/// The outcome of CHECK.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checked {
    Ok,
    /// Needs a full read (a host port shared with another attachment of the container).
    ReadAll,
}

/// CHECK of `want`: the static part is the declared one, the attachment's record, claims and
/// masquerade elements are there, each host port's `owner` and DNAT elements are what its
/// claimants need, and the recorded namespace is `netns_now` (when both are known). Lines for
/// stderr go to `notes` (a table of an earlier layout, whose static part is not checked),
/// whatever the outcome: the caller prints them.
pub fn check(
    s: &State,
    want: &Intent,
    conds: &Conditions,
    netns_now: Option<NsId>,
    notes: &mut Vec<String>,
) -> Result<Checked> {
    let t = format!("{} {}", layout::FAMILY.keyword(), layout::TABLE);
    let fail = |m: String| Err(CniError::internal(format!("portmap: {m}")));
    if !s.found.table {
        return fail(format!("table {t} does not exist"));
    }
    if !s.found.current && !s.complete {
        return Ok(Checked::ReadAll); // an earlier layout, or a newer one: only a full read tells
    }
    refuse_unknown_layout(s)?;
    let me = &want.owner;
    if s.found.current {
        let mut lens = lens_in(&s.found.rules);
        lens.extend(want.lens());
        if let Some(p) = declaration(&lens, conds).problems(&s.found).first() {
            return fail(format!("table {t}: {p}"));
        }
        match s.hash_at(&Key::Attachment(me.hash)) {
            None => return fail(format!("no record of this attachment in {t} (not added, or deleted)")),
            Some(fp) if fp != want.fingerprint() => {
                return fail("the attachment was added with other port mappings than these".into())
            }
            Some(_) => {}
        }
    } else if let Some(Ok(2)) = s.found.sets.as_deref().map(layout::unversioned_layout) {
        notes.push(format!(
            "portmap: note: table {t} lacks its layout version; its static part is not checked (the next ADD writes it)"
        ));
    } else {
        notes.push(format!(
            "portmap: note: table {t} is of an earlier layout; its static part is not checked (the next ADD upgrades it)"
        ));
    }
    let missing = |e: &Elem| CniError::internal(format!("portmap: element {e} is missing"));
    let differs = |e: &Elem, x: &Elem| {
        CniError::internal(format!(
            "portmap: element {} maps to {} instead of {}",
            e.key,
            x.data_text(),
            e.data_text()
        ))
    };
    for e in want.claims().chain(want.masq_elems()) {
        let x = s.get(&e.key).ok_or_else(|| missing(&e))?;
        if x.elem != e {
            return Err(differs(&e, &x.elem));
        }
    }
    let held = (s.complete).then(|| s.held());
    for entry in &want.entries {
        let p = entry.host;
        let owner = s.hash_at(&Key::Owner(p));
        let claimants: Vec<Claimant> = match (&held, owner) {
            (_, Some(h)) if h == me.hash => {
                vec![Claimant { tag: me.tag.clone(), hash: me.hash, target: entry.target() }]
            }
            (None, _) => return Ok(Checked::ReadAll),
            (Some(held), _) => held
                .iter()
                .flat_map(|x| {
                    x.claims.iter().filter(|(q, _)| *q == p).map(|(_, t)| Claimant {
                        tag: x.tag.clone(),
                        hash: x.hash,
                        target: *t,
                    })
                })
                .collect(),
        };
        let Some(need) = slots(p, &claimants, s.get(&Key::Dnat(p))) else { continue };
        for (e, tag) in need {
            let x = s.get(&e.key).ok_or_else(|| missing(&e))?;
            if x.comment.as_deref() != Some(tag.as_str()) {
                return fail(format!("element {e} belongs to {}", describe_holder(x.comment.as_deref())));
            }
            if x.elem != e {
                return Err(differs(&e, &x.elem));
            }
        }
    }
    if let (Some(now), Some(Listed { elem, comment })) = (netns_now, s.get(&Key::Netns(me.hash))) {
        if let Some(crate::model::Data::Netns(id)) = elem.data {
            if id.differs(&now) {
                return fail(format!(
                    "the attachment was made for network namespace {:?}, not for CNI_NETNS",
                    comment.as_deref().unwrap_or_default()
                ));
            }
        }
    }
    Ok(Checked::Ok)
}
