//! The element transactions: the fast paths (no read before), and the changes of a plan.

use super::codec::{encode, encode_key, gates_elements};
use super::setup::FAMILY;
use crate::claims::Plan;
use crate::config::Conf;
use crate::layout::{self, TABLE};
use crate::model::{Elem, Key};
use crate::owner::Owner;
use crate::table::{Listing, Want};
use cni_common::netlink::nft::NftOp;
use cni_common::nft_cli::quote;
use std::collections::HashSet;

/// One element change, in transaction order.
enum Change<'a> {
    Add(Elem, &'a str),
    Delete(Key),
}

/// The changes as netlink operations, consecutive changes of one kind on one set sharing an
/// operation (one message).
fn ops<'a>(changes: impl IntoIterator<Item = Change<'a>>) -> Vec<NftOp> {
    let mut out: Vec<NftOp> = Vec::new();
    for c in changes {
        let (adding, set, elem) = match c {
            Change::Add(e, comment) => (true, e.set().name(), encode(&e, Some(comment))),
            Change::Delete(k) => (false, k.set().name(), encode_key(&k)),
        };
        match out.last_mut() {
            Some(NftOp::AddElements { set: s, elems, .. }) if adding && *s == set => elems.push(elem),
            Some(NftOp::DeleteElements { set: s, elems, .. }) if !adding && *s == set => elems.push(elem),
            _ => {
                let table = TABLE.to_string();
                out.push(if adding {
                    NftOp::AddElements { family: FAMILY, table, set, elems: vec![elem] }
                } else {
                    NftOp::DeleteElements { family: FAMILY, table, set, elems: vec![elem] }
                });
            }
        }
    }
    out
}

/// The fast ADD transaction: the gate element (fails unless the table is set up for these
/// conditions), then this attachment's elements and netns record, all additions. It fails as
/// a whole when a set is missing (a prefix length not in use yet, a table in the previous
/// layout) or a key exists with other data (a host port claimed by another attachment).
pub fn fast_add_ops(conf: &Conf, want: &Want) -> Vec<NftOp> {
    let (g4, g6) = layout::gate_names(conf);
    let mut out = vec![NftOp::AddElements {
        family: FAMILY,
        table: TABLE.into(),
        set: crate::model::Set::Gates.name(),
        elems: gates_elements(&g4, &g6),
    }];
    let all = want.all();
    out.extend(ops(all.iter().map(|(e, c)| Change::Add(*e, c))));
    out
}

/// The fast DEL transaction: re-assert every owner claim (fails when one is not ours alone),
/// then delete every element and the netns record (fails when one is missing).
pub fn guarded_delete_ops(elems: &[Elem], owner: &Owner) -> Vec<NftOp> {
    let claims = elems.iter().filter(|e| matches!(e.key, Key::Owner(_))).map(|e| Change::Add(*e, &owner.tag));
    let deletes = elems.iter().map(|e| Change::Delete(e.key)).chain([Change::Delete(Key::Netns(owner.hash))]);
    ops(claims.chain(deletes))
}

/// The elements a plan on `l` writes: converted elements of the previous layout it keeps, then
/// its own additions.
fn additions<'a>(l: &'a Listing, p: &'a Plan) -> Vec<(Elem, &'a str)> {
    let deleted: HashSet<Key> = p.delete.iter().map(|x| x.elem.key).collect();
    let kept = l
        .elems()
        .iter()
        .filter(|x| x.pending && !deleted.contains(&x.elem.key))
        .map(|x| (x.elem, x.comment.as_deref().unwrap_or_default()));
    kept.chain(p.add.iter().map(|(e, c)| (*e, c.as_str()))).collect()
}

/// A plan's transaction: its deletions (of elements in the kernel), then its additions.
pub fn plan_ops(l: &Listing, p: &Plan) -> Vec<NftOp> {
    let dels = p.delete.iter().filter(|x| !x.pending).map(|x| Change::Delete(x.elem.key));
    let adds = additions(l, p).into_iter().map(|(e, c)| Change::Add(e, c));
    ops(dels.chain(adds))
}

/// The same as [`plan_ops`] in nft syntax (for a transaction that `nft -f` runs).
pub fn plan_script(l: &Listing, p: &Plan) -> String {
    let t = format!("{} {TABLE}", layout::FAMILY);
    let mut s = String::new();
    for x in p.delete.iter().filter(|x| !x.pending) {
        s.push_str(&format!("delete element {t} {} {{ {} }}\n", x.elem.set(), x.elem.key));
    }
    for (e, c) in additions(l, p) {
        let comment = if c.is_empty() { String::new() } else { format!(" comment {}", quote(c)) };
        let data = if e.data.is_some() { format!(" : {}", e.data_text()) } else { String::new() };
        s.push_str(&format!("add element {t} {} {{ {}{comment}{data} }}\n", e.set(), e.key));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{HostIp, Proto};
    use crate::model::NsId;
    use crate::table::tests::{conf, m};
    use crate::table::{elements, entries};

    #[test]
    fn fast_paths_are_element_only() {
        let c = conf(vec![m(80, 8080, Proto::Tcp, HostIp::Any)]);
        let o = Owner::new("n", "c", "eth0");
        let en = entries(&c, Some("10.0.0.5/24".parse().unwrap()), None).unwrap();
        let el = elements(&c, &en, &o);
        let w = Want {
            tag: o.tag.clone(),
            hash: o.hash,
            elems: el.clone(),
            netns: Some((NsId { ino: 1, cookie: 2 }, "/run/netns/x".into())),
        };
        let ops = fast_add_ops(&c, &w);
        assert!(ops.iter().all(|op| matches!(op, NftOp::AddElements { .. })), "{ops:?}");
        assert!(matches!(&ops[0], NftOp::AddElements { set, .. } if set == "gates"));
        match ops.last().unwrap() {
            NftOp::AddElements { set, elems, .. } => {
                assert_eq!(set, "netns");
                assert_eq!(elems[0].comment.as_deref(), Some("/run/netns/x"));
            }
            other => panic!("{other:?}"),
        }
        // consecutive elements of one set share a message: owner, claims, hp4, net4_24, net4_32
        assert_eq!(ops.len(), 1 + 5 + 1);
        let d = guarded_delete_ops(&el, &o);
        assert!(
            matches!(&d[0], NftOp::AddElements { set, .. } if set == "owner"),
            "owner claims re-asserted first"
        );
        let deleted: Vec<&str> = d
            .iter()
            .filter_map(|op| match op {
                NftOp::DeleteElements { set, elems, .. } => {
                    assert!(elems.iter().all(|e| e.data.is_none() && e.comment.is_none()));
                    Some(set.as_str())
                }
                _ => None,
            })
            .collect();
        assert_eq!(deleted, ["owner", "claims", "hp4", "net4_24", "net4_32", "netns"]);
    }
}
