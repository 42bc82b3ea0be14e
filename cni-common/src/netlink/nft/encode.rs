//! The messages of a transaction: each [`NftOp`] encoded as `nft` encodes it, and the nfnetlink
//! batch around them (begin with the generation guard, end).

use netlink_packet_core::{NLM_F_ACK, NLM_F_APPEND, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST};

use super::consts::*;
use super::expr;
use super::ops::{NftDelete, NftOp};
use super::set::{element_messages, set_attrs};
use super::wire::{comment_udata, nft_msg};
use crate::netlink::nfnl::{self, cstr, encode_be32, message, put_attr};

const ACK: u16 = NLM_F_REQUEST | NLM_F_ACK;

/// The message of one deletion.
fn delete_message(op: &NftDelete) -> Vec<u8> {
    let (msg, family, attrs) = match op {
        NftDelete::Rule { family, table, chain, handle } => (
            NFT_MSG_DELRULE,
            family,
            vec![
                (NFTA_RULE_TABLE, cstr(table)),
                (NFTA_RULE_CHAIN, cstr(chain)),
                (NFTA_RULE_HANDLE, handle.to_be_bytes().to_vec()),
            ],
        ),
        NftDelete::Flush { family, table, chain } => {
            (NFT_MSG_DELRULE, family, vec![(NFTA_RULE_TABLE, cstr(table)), (NFTA_RULE_CHAIN, cstr(chain))])
        }
        NftDelete::Chain { family, table, chain } => {
            (NFT_MSG_DELCHAIN, family, vec![(NFTA_CHAIN_TABLE, cstr(table)), (NFTA_CHAIN_NAME, cstr(chain))])
        }
        NftDelete::Table { family, table } => {
            (NFT_MSG_DELTABLE, family, vec![(NFTA_TABLE_NAME, cstr(table))])
        }
        NftDelete::Set { family, table, set } => {
            (NFT_MSG_DELSET, family, vec![(NFTA_SET_TABLE, cstr(table)), (NFTA_SET_NAME, cstr(set))])
        }
    };
    message(nft_msg(msg), ACK, family.proto(), 0, &attrs)
}

/// The messages of one operation (each acknowledged).
pub(crate) fn op_messages(op: &NftOp) -> Vec<Vec<u8>> {
    match op {
        NftOp::AddTable { family, table, comment } => {
            let mut attrs = vec![(NFTA_TABLE_NAME, cstr(table)), (NFTA_TABLE_FLAGS, encode_be32(0).to_vec())];
            if let Some(c) = comment {
                attrs.push((NFTA_TABLE_USERDATA, comment_udata(c)));
            }
            vec![message(nft_msg(NFT_MSG_NEWTABLE), ACK, family.proto(), 0, &attrs)]
        }
        NftOp::AddChain { family, table, chain, base, comment } => {
            let mut attrs = vec![(NFTA_CHAIN_TABLE, cstr(table)), (NFTA_CHAIN_NAME, cstr(chain))];
            if let Some(b) = base {
                attrs.push((NFTA_CHAIN_TYPE, cstr(&b.kind)));
                if let Some(p) = b.policy {
                    attrs.push((NFTA_CHAIN_POLICY, encode_be32(p).to_vec()));
                }
                let mut hook = Vec::new();
                put_attr(&mut hook, NFTA_HOOK_HOOKNUM, &encode_be32(b.hook));
                put_attr(&mut hook, NFTA_HOOK_PRIORITY, &b.priority.to_be_bytes());
                attrs.push((NFTA_CHAIN_HOOK | nfnl::NLA_F_NESTED, hook));
            }
            if let Some(c) = comment {
                attrs.push((NFTA_CHAIN_USERDATA, comment_udata(c)));
            }
            vec![message(nft_msg(NFT_MSG_NEWCHAIN), ACK | NLM_F_CREATE, family.proto(), 0, &attrs)]
        }
        NftOp::AddRule { family, table, chain, exprs, comment } => {
            let mut list = Vec::new();
            for e in exprs {
                expr::put_expr(&mut list, e);
            }
            let mut attrs = vec![
                (NFTA_RULE_TABLE, cstr(table)),
                (NFTA_RULE_CHAIN, cstr(chain)),
                (NFTA_RULE_EXPRESSIONS | nfnl::NLA_F_NESTED, list),
            ];
            if let Some(c) = comment {
                attrs.push((NFTA_RULE_USERDATA, comment_udata(c)));
            }
            let flags = ACK | NLM_F_CREATE | NLM_F_APPEND;
            vec![message(nft_msg(NFT_MSG_NEWRULE), flags, family.proto(), 0, &attrs)]
        }
        NftOp::AddElements { family, table, set, elems } => {
            element_messages(NFT_MSG_NEWSETELEM, ACK | NLM_F_CREATE, *family, table, set, elems, true)
        }
        NftOp::CreateElements { family, table, set, elems } => element_messages(
            NFT_MSG_NEWSETELEM,
            ACK | NLM_F_CREATE | NLM_F_EXCL,
            *family,
            table,
            set,
            elems,
            true,
        ),
        NftOp::DeleteElements { family, table, set, elems } => {
            element_messages(NFT_MSG_DELSETELEM, ACK, *family, table, set, elems, false)
        }
        NftOp::AddSet { family, table, set } => {
            vec![message(
                nft_msg(NFT_MSG_NEWSET),
                ACK | NLM_F_CREATE,
                family.proto(),
                0,
                &set_attrs(table, set),
            )]
        }
        NftOp::FlushSet { family, table, set } => vec![message(
            nft_msg(NFT_MSG_DELSETELEM),
            ACK,
            family.proto(),
            0,
            &[(NFTA_SET_ELEM_LIST_SET, cstr(set)), (NFTA_SET_ELEM_LIST_TABLE, cstr(table))],
        )],
        NftOp::Delete(d) => vec![delete_message(d)],
    }
}

/// The messages of `ops` as [`NfTables::apply`] sends them between the batch markers.
#[cfg(any(test, feature = "nftgolden"))]
pub(crate) fn wire_messages(ops: &[NftOp]) -> Vec<Vec<u8>> {
    ops.iter().flat_map(op_messages).collect()
}

/// The messages of `ops`, each rule marked `true` without `NLM_F_APPEND` (inserted first).
pub(crate) fn insert_messages(ops: &[(NftOp, bool)]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for (op, top) in ops {
        for mut m in op_messages(op) {
            if *top && matches!(op, NftOp::AddRule { .. }) {
                let flags = u16::from_ne_bytes([m[6], m[7]]) & !NLM_F_APPEND;
                m[6..8].copy_from_slice(&flags.to_ne_bytes());
            }
            out.push(m);
        }
    }
    out
}

/// `NFNL_BATCH_GENID`: the attribute of a batch's begin message naming the ruleset
/// generation the batch was planned on.
const NFNL_BATCH_GENID: u16 = 1;

/// An nfnetlink batch: begin (with the generation guard, if any), `messages`, end. Only the
/// last message asks for an acknowledgement: the kernel answers every failing message
/// anyway, and a large batch with one acknowledgement per message would overflow the
/// receive buffer (the answers wait there until the whole batch is processed).
pub(super) fn batch(messages: impl IntoIterator<Item = Vec<u8>>, generation: Option<u32>) -> Vec<Vec<u8>> {
    let attrs: Vec<(u16, Vec<u8>)> =
        generation.map(|g| (NFNL_BATCH_GENID, encode_be32(g).to_vec())).into_iter().collect();
    let mut out = vec![message(NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, 0, NFNL_SUBSYS_NFTABLES, &attrs)];
    out.extend(messages);
    let last = out.len() - 1;
    for (i, m) in out.iter_mut().enumerate().skip(1) {
        let flags = u16::from_ne_bytes([m[6], m[7]]);
        let flags = if i == last { flags | NLM_F_ACK } else { flags & !NLM_F_ACK };
        m[6..8].copy_from_slice(&flags.to_ne_bytes());
    }
    out.push(message(NFNL_MSG_BATCH_END, NLM_F_REQUEST, 0, NFNL_SUBSYS_NFTABLES, &[]));
    out
}
