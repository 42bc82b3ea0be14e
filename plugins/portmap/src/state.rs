//! The table as read: what a [`Scope`] asks the kernel for, and the [`State`] decoded from the
//! answer. Pure decoding: names, comments and bytes read back are data here, compared and
//! carried, never executed or opened.

use crate::layout::{self, Found, LAYOUT_SET, VERSION};
use crate::model::{Data, Elem, Hash, HostPort, Key, Masq, NsId, Set, Target};
use cni_common::netlink::nft::{Snapshot, SnapshotRequest};
use std::collections::BTreeMap;

/// What to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// The layout version, these elements by key, the reference counts of these chains (with
    /// the count the layout expects), and (with `rules`) every rule: one pipelined round trip
    /// whatever the size of the table.
    Point { keys: Vec<Key>, chains: Vec<(String, u32)>, rules: bool },
    /// Everything: every set and chain and every element of the table.
    Full,
}

impl Scope {
    /// The keys to look up (the layout version first).
    pub fn keys(&self) -> Vec<(String, Vec<u8>)> {
        let mut v = vec![layout::version_key()];
        if let Scope::Point { keys, .. } = self {
            v.extend(keys.iter().map(|k| (k.set().name(), Elem::encode_key(k).key)));
        }
        v
    }

    /// The chains whose references a point read counts.
    pub fn chains(&self) -> Vec<String> {
        match self {
            Scope::Point { chains, .. } => chains.iter().map(|(c, _)| c.clone()).collect(),
            Scope::Full => Vec::new(),
        }
    }

    /// The snapshot request for this scope (keys as [`Scope::keys`] gives them).
    pub fn request<'a>(
        &'a self,
        keys: &'a [(String, Vec<u8>)],
        chains: &'a [String],
        accept: &'a dyn Fn(&str) -> bool,
    ) -> SnapshotRequest<'a> {
        SnapshotRequest {
            family: layout::FAMILY,
            table: layout::TABLE,
            rules: !matches!(self, Scope::Point { rules: false, .. }),
            keys,
            chains,
            listing: matches!(self, Scope::Full).then_some(accept),
        }
    }
}

/// The sets a full read dumps: ours (element sets and the version set).
pub fn dumped(name: &str) -> bool {
    name == LAYOUT_SET || Set::parse(name).is_some()
}

/// An element as read, with its comment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub elem: Elem,
    pub comment: Option<String>,
}

/// One attachment as the table holds it (complete reads only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub tag: String,
    pub hash: Hash,
    /// Its claims: host port → where it should lead for this attachment.
    pub claims: Vec<(HostPort, Target)>,
    /// The masquerade elements carrying its tag.
    pub masq: Vec<Masq>,
    /// Its `attachments` record (the fingerprint of its mappings).
    pub record: Option<Hash>,
    /// Its `netns` record: identity and path.
    pub netns: Option<(NsId, String)>,
}

/// The table at one generation.
#[derive(Debug, Clone, Default)]
pub struct State {
    pub generation: u32,
    pub found: Found,
    /// Versions in the table's `layout` set other than ours (a newer layout: refused).
    pub other_versions: Vec<u16>,
    elems: BTreeMap<Key, Listed>,
    /// Every element was read (a full read, or no table at all), not only some keys.
    pub complete: bool,
}

impl State {
    /// Decode a snapshot read for `scope`.
    pub fn decode(scope: &Scope, snap: &Snapshot) -> State {
        let full = matches!(scope, Scope::Full);
        let mut s = State {
            generation: snap.generation,
            found: Found {
                table: snap.table.is_some(),
                current: snap.keys.first().is_some_and(Option::is_some),
                rules: snap.rules.clone(),
                uses: match scope {
                    Scope::Point { chains, .. } => chains
                        .iter()
                        .zip(&snap.chain_uses)
                        .map(|((c, want), got)| (c.clone(), *want, *got))
                        .collect(),
                    Scope::Full => Vec::new(),
                },
                sets: full.then(|| snap.sets.clone()),
                chains: full.then(|| snap.chains.clone()),
            },
            complete: full || snap.table.is_none(),
            ..Default::default()
        };
        if let Scope::Point { keys, .. } = scope {
            for (k, e) in keys.iter().zip(snap.keys.iter().skip(1)) {
                if let Some(l) = e.as_ref().and_then(|e| Elem::decode(k.set(), e)).filter(|l| l.key == *k) {
                    let comment = e.as_ref().and_then(|e| e.comment.clone());
                    s.elems.insert(*k, Listed { elem: l, comment });
                }
            }
        }
        for (name, elems) in &snap.dumped {
            if name == LAYOUT_SET {
                s.other_versions = elems
                    .iter()
                    .filter_map(|e| <[u8; 2]>::try_from(e.key.as_slice()).ok().map(u16::from_be_bytes))
                    .filter(|v| *v != VERSION)
                    .collect();
                continue;
            }
            let Some(set) = Set::parse(name) else { continue };
            for e in elems {
                if let Some(elem) = Elem::decode(set, e) {
                    s.elems.insert(elem.key, Listed { elem, comment: e.comment.clone() });
                }
            }
        }
        s
    }

    pub fn get(&self, k: &Key) -> Option<&Listed> {
        self.elems.get(k)
    }

    pub fn elems(&self) -> impl Iterator<Item = &Listed> {
        self.elems.values()
    }

    /// The hash an `owner` or `attachments` element holds.
    pub fn hash_at(&self, k: &Key) -> Option<Hash> {
        self.get(k).and_then(|l| l.elem.hash_data())
    }

    /// Every attachment the table holds, by its claims and records (complete reads only).
    pub fn held(&self) -> Vec<Held> {
        let mut by_hash: BTreeMap<Hash, Held> = BTreeMap::new();
        for l in self.elems.values() {
            let (h, claim, record) = match (l.elem.key, l.elem.data) {
                (Key::Claim(hp, h), Some(Data::Target(t))) => (h, Some((hp, t)), None),
                (Key::Attachment(h), Some(Data::Hash(fp))) => (h, None, Some(fp)),
                _ => continue,
            };
            let held = by_hash.entry(h).or_insert_with(|| Held {
                tag: l.comment.clone().unwrap_or_default(),
                hash: h,
                claims: Vec::new(),
                masq: Vec::new(),
                record: None,
                netns: None,
            });
            held.claims.extend(claim);
            if record.is_some() {
                held.record = record;
            }
        }
        let mut by_tag: BTreeMap<String, Hash> = BTreeMap::new();
        for h in by_hash.values() {
            by_tag.entry(h.tag.clone()).or_insert(h.hash);
        }
        for l in self.elems.values() {
            match (l.elem.key, l.elem.data) {
                (Key::Masq(m), _) => {
                    if let Some(h) = l.comment.as_ref().and_then(|c| by_tag.get(c)) {
                        by_hash.get_mut(h).expect("indexed").masq.push(m);
                    }
                }
                (Key::Netns(h), Some(Data::Netns(id))) => {
                    if let Some(held) = by_hash.get_mut(&h) {
                        held.netns = Some((id, l.comment.clone().unwrap_or_default()));
                    }
                }
                _ => {}
            }
        }
        by_hash.into_values().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cni_common::net::{Family, Proto};
    use cni_common::netlink::nft::NftTable;

    #[test]
    fn point_reads_keep_only_the_keys_asked_for() {
        let hp = HostPort { fam: Family::V4, ip: None, proto: Proto::Tcp, port: 80 };
        let h = Hash([1; 16]);
        let owner = Elem::owner(hp, h);
        let scope =
            Scope::Point { keys: vec![owner.key, Key::Attachment(h)], chains: Vec::new(), rules: true };
        assert_eq!(scope.keys().len(), 3);
        let snap = Snapshot {
            generation: 7,
            table: Some(NftTable { name: layout::TABLE.into(), comment: None }),
            keys: vec![
                Some(cni_common::netlink::nft::NftElem::new(vec![0, 2])),
                Some(owner.encode(Some("n,c,eth0"))),
                None,
            ],
            ..Default::default()
        };
        let s = State::decode(&scope, &snap);
        assert!(s.found.table && s.found.current && !s.complete);
        assert_eq!(s.generation, 7);
        assert_eq!(s.hash_at(&owner.key), Some(h));
        assert_eq!(s.get(&owner.key).unwrap().comment.as_deref(), Some("n,c,eth0"));
        assert!(s.get(&Key::Attachment(h)).is_none());
        // no table: nothing else to read, the state is complete
        let s = State::decode(&scope, &Snapshot::default());
        assert!(!s.found.table && s.complete);
    }

    /// What each read asks the kernel for: ADD's and DEL's point reads no rule and no listing,
    /// CHECK's every rule, a full read every rule and the elements of our sets only (not of
    /// retired maps or another program's sets).
    #[test]
    fn reads_ask_for_what_they_use() {
        let h = Hash([1; 16]);
        let accept = |n: &str| dumped(n);
        for (scope, rules, listing) in [
            (Scope::Point { keys: vec![Key::Attachment(h)], chains: Vec::new(), rules: false }, false, false),
            (Scope::Point { keys: vec![Key::Attachment(h)], chains: Vec::new(), rules: true }, true, false),
            (Scope::Full, true, true),
        ] {
            let (keys, chains) = (scope.keys(), scope.chains());
            let req = scope.request(&keys, &chains, &accept);
            assert_eq!((req.rules, req.listing.is_some()), (rules, listing), "{scope:?}");
        }
        for ours in ["layout", "hp4", "hip6", "owner", "claims", "attachments", "netns", "net4_24", "net6_0"]
        {
            assert!(dumped(ours), "{ours}");
        }
        for other in ["gates", "conditions", "net4_33", "kube_proxy_set"] {
            assert!(!dumped(other), "{other}");
        }
    }
}
