//! Reading the table over netlink: a few dumps between two readings of the ruleset
//! generation, repeated until both agree (one consistent state).

use super::codec::{decode, decode_gate};
use super::setup::FAMILY;
use crate::layout::TABLE;
use crate::legacy;
use crate::model::{Elem, Set};
use crate::table::{Listed, Listing};
use cni_common::netlink::nft::NfTables;
use cni_common::{CniError, Result};

/// How often a read is repeated when the ruleset changed while it was being read.
const READ_ATTEMPTS: usize = 20;

fn read_once(nf: &mut NfTables) -> Result<Option<Listing>> {
    if !nf.has_table(FAMILY, TABLE)? {
        return Ok(None);
    }
    let mut l = Listing::default();
    l.chains = nf.chains(FAMILY, TABLE)?;
    l.rules = nf.rules(FAMILY, TABLE, None)?;
    l.legacy_sets = legacy::sets_in_use(&l);
    // the fixed sets, and the masquerade sets the rules use
    let mut sets: Vec<Set> = Set::FIXED.iter().copied().filter(|s| *s != Set::Gates).collect();
    sets.extend(l.sets_in_rules().iter().filter_map(|s| Set::parse(s)).filter(|s| matches!(s, Set::Net(..))));
    for set in sets {
        for e in nf.set_elements(FAMILY, TABLE, &set.name())? {
            if let Some(elem) = decode(set, &e) {
                l.push(Listed::new(elem, e.comment.clone()));
            }
        }
    }
    l.gates = nf.set_elements(FAMILY, TABLE, &Set::Gates.name())?.iter().filter_map(decode_gate).collect();
    // the previous layout's elements, converted (written by the migrating transaction)
    for (set, fam) in legacy::SETS {
        if !l.legacy_sets.iter().any(|s| s == set) {
            continue;
        }
        for e in nf.set_elements(FAMILY, TABLE, set)? {
            match legacy::decode(fam, &e) {
                Some(m) => l.push(Listed { elem: Elem::masq(m), comment: e.comment.clone(), pending: true }),
                None => eprintln!("portmap: note: element {e:?} of the previous layout's set {set} is not ours; it goes with the set"),
            }
        }
    }
    Ok(Some(l))
}

/// The table as it is (None when it does not exist).
pub fn read(nf: &mut NfTables) -> Result<Option<Listing>> {
    for _ in 0..READ_ATTEMPTS {
        let generation = nf.generation()?;
        let l = read_once(nf)?;
        if nf.generation()? == generation {
            return Ok(l);
        }
    }
    Err(CniError::internal(format!(
        "portmap: table {} {TABLE} kept changing while it was read ({READ_ATTEMPTS} attempts)",
        FAMILY.keyword()
    )))
}
