//! Several claimants of one host port, conflicts, and the element changes of the slow paths.
//!
//! Every attachment that wants a host port has a `claims` element `host port . its hash :
//! container address . container port`. The `owner` and DNAT elements of the port follow from
//! the claims:
//! - one claimant: `owner` holds its hash and the DNAT element its target (the fast paths
//!   create and delete exactly this state in one transaction, without reading the table);
//! - several claimants, necessarily of one container (a runtime attaching the container to
//!   several networks with the same portMappings, as Podman does): `owner` holds the
//!   container's [`shared_hash`], and the DNAT element leads to one of them, the *active*
//!   claimant: the one that had the port first stays active; when it goes, the remaining
//!   claimant whose tag sorts first takes over. Changes happen under the lock ([`plan`]).

use crate::config::Fam;
use crate::model::{Elem, Hash, HostPort, Key};
use crate::owner::{container_of, shared_hash, Owner};
use crate::table::{udp_ports, Claim, Listed, Listing, Want};
use std::collections::{BTreeSet, HashSet};

/// The `owner` and DNAT elements (with their comments) a host port needs, given its claimants
/// and its current DNAT element; None when nobody claims it.
pub fn desired_slots(
    port: HostPort,
    claimants: &[&Claim],
    dnat: Option<&Listed>,
) -> Option<[(Elem, String); 2]> {
    let first = claimants.iter().min_by(|a, b| a.tag.cmp(&b.tag))?;
    let active = dnat
        .and_then(|d| claimants.iter().find(|c| d.comment.as_deref() == Some(c.tag.as_str())))
        .unwrap_or(first);
    let value = if claimants.len() == 1 {
        active.hash
    } else {
        shared_hash(container_of(&active.tag).unwrap_or_default())
    };
    Some([
        (Elem::owner(port, value), active.tag.clone()),
        (Elem::dnat(port, active.target), active.tag.clone()),
    ])
}

/// A host port this ADD wants that another container holds.
#[derive(Debug, Clone)]
pub struct Conflict {
    pub port: HostPort,
    /// The holder named in messages (the active claimant's tag, or an element's comment).
    pub holder: Option<String>,
    /// The listed element that conflicts (for the error's details).
    pub elem: Listed,
    /// The attachments of other containers claiming the port, (tag, hash); empty when the
    /// holder is known only from an element comment.
    pub claimants: Vec<(String, Hash)>,
}

/// Every wanted host port that belongs to another container.
pub fn conflicts(l: &Listing, want: &Want, owner: &Owner) -> Vec<Conflict> {
    let mine = |c: Option<&str>| c.and_then(container_of) == Some(owner.container.as_str());
    let claims = l.claims();
    let shared = shared_hash(&owner.container);
    let mut out = Vec::new();
    for e in &want.elems {
        let Key::Owner(port) = e.key else { continue };
        let dnat = l.find(&Key::Dnat(port));
        let holder = || dnat.and_then(|d| d.comment.clone());
        let claimants: Vec<(String, Hash)> = claims
            .iter()
            .filter(|c| c.port == port && c.tag != owner.tag && !mine(Some(&c.tag)))
            .map(|c| (c.tag.clone(), c.hash))
            .collect();
        let found = if let Some(d) = dnat.filter(|d| !mine(d.comment.as_deref())) {
            Some((d.comment.clone(), d.clone()))
        } else if let Some(o) = l.find(&e.key).filter(|o| {
            let ours = o.elem == *e || o.elem == Elem::owner(port, shared);
            !ours && !mine(o.comment.as_deref())
        }) {
            Some((holder().or(o.comment.clone()), o.clone()))
        } else if let Some((tag, hash)) = claimants.first() {
            l.find(&Key::Claim(port, *hash)).map(|x| (holder().or(Some(tag.clone())), x.clone()))
        } else {
            None
        };
        if let Some((holder, elem)) = found {
            out.push(Conflict { port, holder, elem, claimants });
        }
    }
    out
}

/// Which attachments a slow path withdraws: `gone(tag, hash)` of an element's comment and of
/// the attachment hash it names (claims, owner and netns elements).
pub type Gone<'a> = &'a dyn Fn(&str, Option<Hash>) -> bool;

/// A change to the table: deletions, then additions with their comments.
#[derive(Debug, Default)]
pub struct Plan {
    pub delete: Vec<Listed>,
    pub add: Vec<(Elem, String)>,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.delete.is_empty() && self.add.is_empty()
    }

    /// UDP host ports whose DNAT target is removed or set.
    pub fn udp_ports(&self) -> BTreeSet<(Fam, u16)> {
        udp_ports(self.delete.iter().map(|x| &x.elem.key).chain(self.add.iter().map(|(e, _)| &e.key)))
    }
}

/// How the table changes when the attachments `gone` selects are withdrawn and `want` (one
/// attachment's elements; None for DEL and GC) is claimed, read from `l` under the lock.
///
/// `claims` and masquerade elements are per attachment and simply deleted or added. The
/// `owner` and DNAT elements of every host port whose claimants change are recomputed with
/// [`desired_slots`]. Every claim the result relies on is deleted and re-added in the same
/// transaction, so that the transaction fails (and is retried) if a lock-free fast path
/// removed it in the meantime; a fast ADD in the meantime makes the `owner` addition fail.
/// `netns` records go with the last claim of their attachment.
pub fn plan(l: &Listing, gone: Gone<'_>, want: Option<&Want>) -> Plan {
    let mut p = Plan::default();
    let wanted: Vec<(Elem, String)> = want.map(Want::all).unwrap_or_default();
    per_attachment(l, gone, &wanted, &mut p);
    let tag = want.map(|w| w.tag.as_str()).unwrap_or_default();
    let new_claims: Vec<Claim> = wanted
        .iter()
        .filter_map(|(e, _)| match (e.key, e.target()) {
            (Key::Claim(port, hash), Some(target)) => Some(Claim { port, hash, target, tag: tag.into() }),
            _ => None,
        })
        .collect();
    host_ports(l, gone, &new_claims, &mut p);
    netns_records(l, want, &mut p);
    p
}

/// `claims` and masquerade elements: per attachment, deleted or added as they are.
fn per_attachment(l: &Listing, gone: Gone<'_>, wanted: &[(Elem, String)], p: &mut Plan) {
    let per_attachment = |k: &Key| matches!(k, Key::Claim(..) | Key::Masq(_));
    let gone_elem = |x: &Listed| x.comment.as_deref().is_some_and(|c| gone(c, x.hash()));
    let mut keep: HashSet<Key> = HashSet::new();
    for x in l.elems().iter().filter(|x| per_attachment(&x.elem.key)) {
        if gone_elem(x) && !wanted.iter().any(|(e, _)| *e == x.elem) {
            p.delete.push(x.clone());
        } else {
            keep.insert(x.elem.key);
        }
    }
    for (e, tag) in wanted.iter().filter(|(e, _)| per_attachment(&e.key)) {
        match l.find(&e.key) {
            Some(x) if keep.contains(&x.elem.key) => {
                if x.elem.data != e.data {
                    // someone else's element under our key (tampering): replace it
                    p.delete.push(x.clone());
                    p.add.push((*e, tag.clone()));
                }
            }
            _ => p.add.push((*e, tag.clone())),
        }
    }
}

/// The `owner` and DNAT elements of every host port whose claimants change.
fn host_ports(l: &Listing, gone: Gone<'_>, new_claims: &[Claim], p: &mut Plan) {
    let claims = l.claims();
    let gone_elem = |x: &Listed| x.comment.as_deref().is_some_and(|c| gone(c, x.hash()));
    let mut ports: BTreeSet<HostPort> =
        claims.iter().filter(|c| gone(&c.tag, Some(c.hash))).map(|c| c.port).collect();
    ports.extend(new_claims.iter().map(|c| c.port));
    for x in l.elems().iter().filter(|x| matches!(x.elem.key, Key::Owner(_) | Key::Dnat(_)) && gone_elem(x)) {
        ports.extend(x.elem.key.host_port());
    }
    for port in ports {
        let staying: Vec<&Claim> = claims
            .iter()
            .filter(|c| c.port == port && !gone(&c.tag, Some(c.hash)))
            .filter(|c| !new_claims.iter().any(|n| n.hash == c.hash))
            .collect();
        let mut claimants = staying.clone();
        claimants.extend(new_claims.iter().filter(|c| c.port == port));
        let dnat = l.find(&Key::Dnat(port));
        let current = [l.find(&Key::Owner(port)), dnat];
        let desired = desired_slots(port, &claimants, dnat);
        for (i, cur) in current.iter().enumerate() {
            let want_i = desired.as_ref().map(|d| &d[i]);
            let same = match (cur, want_i) {
                (Some(x), Some((e, t))) => x.elem == *e && x.comment.as_deref() == Some(t.as_str()),
                (None, None) => true,
                _ => false,
            };
            if same {
                continue;
            }
            if let Some(x) = cur {
                p.delete.push((*x).clone());
            }
            if let Some((e, t)) = want_i {
                p.add.push((*e, t.clone()));
            }
        }
        // re-assert the claims that stay (they would vanish with a concurrent fast DEL)
        for c in staying {
            if let Some(x) = l.find(&Key::Claim(c.port, c.hash)) {
                if !p.delete.contains(x) {
                    p.delete.push(x.clone());
                    p.add.push((x.elem, c.tag.clone()));
                }
            }
        }
    }
}

/// A `netns` record stays while its attachment has a claim; the wanted one replaces an
/// outdated one.
fn netns_records(l: &Listing, want: Option<&Want>, p: &mut Plan) {
    let deleted: HashSet<Key> = p.delete.iter().map(|x| x.elem.key).collect();
    let claimed: HashSet<Hash> = l
        .claims()
        .iter()
        .filter(|c| !deleted.contains(&Key::Claim(c.port, c.hash)))
        .map(|c| c.hash)
        .chain(p.add.iter().filter_map(|(e, _)| match e.key {
            Key::Claim(_, h) => Some(h),
            _ => None,
        }))
        .collect();
    let wanted = want.and_then(|w| w.all().into_iter().find(|(e, _)| matches!(e.key, Key::Netns(_))));
    for x in l.elems() {
        let Key::Netns(h) = x.elem.key else { continue };
        if let Some((e, path)) = wanted.as_ref().filter(|(e, _)| e.key == x.elem.key) {
            // the wanted record replaces an outdated one (a new sandbox of the attachment)
            if x.elem != *e || x.comment.as_deref().unwrap_or_default() != path {
                p.delete.push(x.clone());
                p.add.push((*e, path.clone()));
            }
        } else if !claimed.contains(&h) {
            p.delete.push(x.clone());
        }
    }
    if let Some((e, path)) = wanted {
        if l.find(&e.key).is_none() {
            p.add.push((e, path));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{HostIp, Proto};
    use crate::model::{Masq, NsId, Target};
    use crate::table::tests::{conf, m};
    use crate::table::{elements, entries};

    /// The table as the given attachments' ADDs leave it (every element tagged with its owner).
    fn listed(parts: &[(&[Elem], &Owner)]) -> Listing {
        let mut l = Listing::default();
        for (els, o) in parts {
            for e in els.iter() {
                l.push(Listed::new(*e, Some(o.tag.clone())));
            }
        }
        l
    }

    /// Apply a plan to a listing the way the kernel would.
    fn apply(l: &Listing, p: &Plan) -> Listing {
        let deleted: HashSet<Key> = p.delete.iter().map(|x| x.elem.key).collect();
        let mut out = Listing::default();
        for x in l.elems().iter().filter(|x| !deleted.contains(&x.elem.key)) {
            out.push(Listed::new(x.elem, x.comment.clone()));
        }
        for (e, t) in &p.add {
            assert!(out.find(&e.key).is_none(), "add of an existing key {e}");
            out.push(Listed::new(*e, Some(t.clone())));
        }
        out
    }

    fn want(o: &Owner, elems: Vec<Elem>) -> Want {
        Want { tag: o.tag.clone(), hash: o.hash, elems, netns: None }
    }

    fn gone_of(o: &Owner) -> impl Fn(&str, Option<Hash>) -> bool + '_ {
        move |t: &str, h: Option<Hash>| t == o.tag || h == Some(o.hash)
    }

    fn one_port(o: &Owner, addr: &str) -> Vec<Elem> {
        let c = conf(vec![m(18090, 80, Proto::Tcp, HostIp::AnyOf(Fam::V4))]);
        elements(&c, &entries(&c, Some(addr.parse().unwrap()), None).unwrap(), o)
    }

    const PORT: HostPort = HostPort { fam: Fam::V4, ip: None, proto: Proto::Tcp, port: 18090 };

    fn active(l: &Listing) -> (String, Hash) {
        let d = l.find(&Key::Dnat(PORT)).expect("DNAT element");
        let o = l.find(&Key::Owner(PORT)).expect("owner element");
        assert_eq!(o.comment, d.comment, "owner and DNAT name the same claimant");
        let Some(crate::model::Data::Hash(h)) = o.elem.data else { panic!("owner data") };
        (d.elem.data_text(), h)
    }

    #[test]
    fn a_second_network_of_the_same_container_shares_the_port() {
        let (a1, a2) = (Owner::new("n1", "ctr", "eth0"), Owner::new("n2", "ctr", "eth1"));
        let (e1, e2) = (one_port(&a1, "10.0.0.5/24"), one_port(&a2, "10.1.0.5/24"));
        let l = listed(&[(&e1, &a1)]);
        let w2 = want(&a2, e2.clone());
        assert!(conflicts(&l, &w2, &a2).is_empty(), "same container: compatible");
        let p = plan(&l, &gone_of(&a2), Some(&w2));
        let l2 = apply(&l, &p);
        // the first claimant stays active; the owner value is the container's shared hash
        assert_eq!(active(&l2), ("10.0.0.5 . 80".into(), shared_hash("ctr")));
        assert_eq!(l2.claims().len(), 2);
        let m2 = Masq::new("10.1.0.5/24".parse().unwrap(), "10.1.0.5".parse().unwrap(), Proto::Tcp, 80);
        assert!(l2.find(&Key::Masq(m2)).is_some());
        // the claim it relies on is re-asserted (fails the transaction if a fast DEL took it)
        assert!(p
            .delete
            .iter()
            .any(|x| matches!(x.elem.key, Key::Claim(..)) && x.comment.as_deref() == Some(a1.tag.as_str())));
        assert!(p.udp_ports().is_empty());
        // a repeated ADD of either changes nothing but the re-assertions
        for (o, e) in [(&a1, &e1), (&a2, &e2)] {
            let p = plan(&l2, &gone_of(o), Some(&want(o, e.clone())));
            assert_eq!(apply(&l2, &p).elems().len(), l2.elems().len());
            assert_eq!(active(&apply(&l2, &p)), active(&l2));
        }
        // another container is refused, naming the active claimant
        let b = Owner::new("n1", "other", "eth0");
        let c = conflicts(&l2, &want(&b, one_port(&b, "10.0.0.6/24")), &b);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].holder.as_deref(), Some(a1.tag.as_str()));
        assert_eq!(c[0].claimants.len(), 2, "both claimants of the other container");

        // DEL of the active claimant: the other takes over and holds the port alone again
        let l3 = apply(&l2, &plan(&l2, &gone_of(&a1), None));
        assert_eq!(active(&l3), ("10.1.0.5 . 80".into(), a2.hash));
        assert!(l3.elems().iter().all(|x| x.comment.as_deref() == Some(a2.tag.as_str())), "{:?}", l3.elems());
        assert_eq!(l3.elems().len(), e2.len(), "exactly a2's own elements: its fast DEL works again");
        // DEL of the last one empties the table
        let l4 = apply(&l3, &plan(&l3, &gone_of(&a2), None));
        assert!(l4.elems().is_empty(), "{:?}", l4.elems());

        // DEL of the inactive claimant leaves the active one in place
        let l3 = apply(&l2, &plan(&l2, &gone_of(&a2), None));
        assert_eq!(active(&l3), ("10.0.0.5 . 80".into(), a1.hash));
        assert_eq!(l3.elems().len(), e1.len());
    }

    #[test]
    fn three_claimants_and_udp_switch_over() {
        let c = conf(vec![m(53, 53, Proto::Udp, HostIp::AnyOf(Fam::V4))]);
        let o: Vec<Owner> = ["n3", "n1", "n2"].iter().map(|n| Owner::new(n, "ctr", "eth0")).collect();
        let els: Vec<Vec<Elem>> = o
            .iter()
            .enumerate()
            .map(|(i, ow)| {
                elements(&c, &entries(&c, Some(format!("10.{i}.0.5/24").parse().unwrap()), None).unwrap(), ow)
            })
            .collect();
        let mut l = listed(&[(&els[0], &o[0])]);
        for i in 1..3 {
            l = apply(&l, &plan(&l, &gone_of(&o[i]), Some(&want(&o[i], els[i].clone()))));
        }
        let port = HostPort { fam: Fam::V4, ip: None, proto: Proto::Udp, port: 53 };
        let d = |l: &Listing| l.find(&Key::Dnat(port)).unwrap().elem.data_text();
        assert_eq!(d(&l), "10.0.0.5 . 53", "n3 came first");
        // n3 goes: the remaining claimant whose tag sorts first (n1) takes over, still shared
        let p = plan(&l, &gone_of(&o[0]), None);
        assert_eq!(p.udp_ports(), BTreeSet::from([(Fam::V4, 53)]), "flows to the old target are flushed");
        let l = apply(&l, &p);
        assert_eq!(d(&l), "10.1.0.5 . 53");
        assert_eq!(l.find(&Key::Owner(port)).unwrap().elem, Elem::owner(port, shared_hash("ctr")));
        // GC of network n1 (nothing valid): n2 alone
        let l = apply(&l, &plan(&l, &|t: &str, _: Option<Hash>| t.starts_with("n1,"), None));
        assert_eq!(d(&l), "10.2.0.5 . 53");
        assert_eq!(l.find(&Key::Owner(port)).unwrap().elem, Elem::owner(port, o[2].hash));
    }

    #[test]
    fn desired_slots_are_deterministic() {
        let claim = |tag: &str, ip: &str| Claim {
            port: PORT,
            hash: Hash([1; 16]),
            target: Target { ip: ip.parse().unwrap(), port: 80 },
            tag: tag.into(),
        };
        let (x, y) = (claim("b,c,eth0", "10.0.0.1"), claim("a,c,eth1", "10.0.0.2"));
        let [_, (d, t)] = desired_slots(PORT, &[&x, &y], None).unwrap();
        assert_eq!((d.data_text().as_str(), t.as_str()), ("10.0.0.2 . 80", "a,c,eth1"));
        let cur = Listed::new(Elem::dnat(PORT, x.target), Some("b,c,eth0".into()));
        let [(o, _), (d, _)] = desired_slots(PORT, &[&y, &x], Some(&cur)).unwrap();
        assert_eq!(d.data_text(), "10.0.0.1 . 80", "the active claimant stays");
        assert_eq!(o, Elem::owner(PORT, shared_hash("c")));
        assert!(desired_slots(PORT, &[], Some(&cur)).is_none());
    }

    #[test]
    fn netns_records_follow_the_claims() {
        let (a, b) = (Owner::new("n", "a", "eth0"), Owner::new("n", "b", "eth0"));
        let id = NsId { ino: 4026532001, cookie: 9 };
        let mut wa = want(&a, one_port(&a, "10.0.0.5/24"));
        wa.netns = Some((id, "/run/netns/a".into()));
        let l = apply(&Listing::default(), &plan(&Listing::default(), &gone_of(&a), Some(&wa)));
        assert_eq!(l.netns_record(a.hash), Some((id, "/run/netns/a".into())));
        // a repeated ADD changes nothing; another namespace (a new sandbox) replaces the record
        assert!(plan(&l, &gone_of(&a), Some(&wa)).add.iter().all(|(e, _)| !matches!(e.key, Key::Netns(_))));
        let mut moved = wa.clone();
        moved.netns = Some((NsId { ino: 4026532002, cookie: 10 }, "/run/netns/a2".into()));
        let l2 = apply(&l, &plan(&l, &gone_of(&a), Some(&moved)));
        assert_eq!(l2.netns_record(a.hash).unwrap().1, "/run/netns/a2");
        // B takes over A's port as a stale holder: A's record goes with its claims
        let wb = want(&b, one_port(&b, "10.0.0.6/24"));
        let gone = |t: &str, h: Option<Hash>| gone_of(&b)(t, h) || t == a.tag || h == Some(a.hash);
        let l3 = apply(&l, &plan(&l, &gone, Some(&wb)));
        assert_eq!(l3.netns_record(a.hash), None);
        assert!(l3.elems().iter().all(|x| x.comment.as_deref() == Some(b.tag.as_str())), "{:?}", l3.elems());
        // GC selects by tag only: the record (commented with its path) goes with the last claim
        let l4 = apply(&l, &plan(&l, &|t: &str, _: Option<Hash>| t.starts_with("n,"), None));
        assert!(l4.elems().is_empty(), "{:?}", l4.elems());
    }

    #[test]
    fn converted_elements_are_written_unless_withdrawn() {
        let (a, b) = (Owner::new("n", "a", "eth0"), Owner::new("n", "b", "eth0"));
        let (ea, eb) = (one_port(&a, "10.0.0.5/24"), one_port(&b, "10.0.0.6/24"));
        let mut l = Listing::default();
        for (els, o) in [(&ea, &a), (&eb, &b)] {
            for e in els.iter() {
                let pending = matches!(e.key, Key::Masq(_));
                l.push(Listed { elem: *e, comment: Some(o.tag.clone()), pending });
            }
        }
        // DEL of A during the migration: A's converted elements are neither deleted (they are
        // not in the kernel) nor written; B's are written
        let p = plan(&l, &gone_of(&a), None);
        let ops = crate::wire::plan_ops(&l, &p);
        let script = crate::wire::plan_script(&l, &p);
        assert!(!script.contains("delete element inet cni_portmap net4"), "{script}");
        assert!(script.contains("add element inet cni_portmap net4_24 { 10.0.0.0 . 10.0.0.6 . tcp . 80 comment \"n,b,eth0\" }"), "{script}");
        assert!(!script.contains("10.0.0.5 . tcp"), "{script}");
        let deleted: usize = ops
            .iter()
            .map(|op| match op {
                cni_common::netlink::nft::NftOp::DeleteElements { elems, .. } => elems.len(),
                _ => 0,
            })
            .sum();
        assert_eq!(deleted, p.delete.iter().filter(|x| !x.pending).count());
    }
}
