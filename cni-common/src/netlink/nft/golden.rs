//! What `nft` 1.0.6 sends for a set of commands (testdata/nft-golden.txt, captured by
//! testdata/capture-nft.py), and a comparison of our messages with them. For the unit tests of
//! this crate and of plugins that build nf_tables objects: compiled for this crate's tests and
//! with the `nftgolden` feature (plugins enable it for their tests only), never into a plugin.

use super::consts::{NFTA_SET_ELEM_LIST_SET_ID, NFT_MSG_NEWSETELEM};
use super::{wire_messages, NftOp};
use netlink_packet_core::NLM_F_ACK;

const GOLDEN: &str = include_str!("testdata/nft-golden.txt");

/// The messages `nft` sent for case `name` (panics when there is no such case).
pub fn golden(name: &str) -> Vec<Vec<u8>> {
    let v: Vec<Vec<u8>> = GOLDEN
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(n, _)| *n == name)
        .map(|(_, hex)| {
            (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect()
        })
        .collect();
    assert!(!v.is_empty(), "no golden message {name}");
    v
}

/// A message with sequence number and port id zeroed, without our `NLM_F_ACK` (nft reads
/// errors without asking for acks) and without `NFTA_SET_ELEM_LIST_SET_ID` (nft's
/// process-local set id, meaningless for a set that exists).
pub fn normalize(msg: &[u8]) -> Vec<u8> {
    let ty = u16::from_ne_bytes([msg[4], msg[5]]);
    let flags = u16::from_ne_bytes([msg[6], msg[7]]) & !NLM_F_ACK;
    let mut attrs = Vec::new();
    let mut rest = &msg[20..];
    while rest.len() >= 4 {
        let len = u16::from_ne_bytes([rest[0], rest[1]]) as usize;
        let kind = u16::from_ne_bytes([rest[2], rest[3]]);
        let padded = len.next_multiple_of(4).min(rest.len());
        if !(ty & 0xff == NFT_MSG_NEWSETELEM && kind == NFTA_SET_ELEM_LIST_SET_ID) {
            attrs.extend_from_slice(&rest[..padded]);
        }
        rest = &rest[padded..];
    }
    let mut out = ((20 + attrs.len()) as u32).to_ne_bytes().to_vec();
    out.extend_from_slice(&ty.to_ne_bytes());
    out.extend_from_slice(&flags.to_ne_bytes());
    out.extend_from_slice(&[0; 8]);
    out.extend_from_slice(&msg[16..20]);
    out.extend_from_slice(&attrs);
    out
}

/// The messages [`super::NfTables::apply`] sends for `ops` (for plugins that compare them with
/// captures of their own).
pub fn messages(ops: &[NftOp]) -> Vec<Vec<u8>> {
    wire_messages(ops)
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Assert that `ops` encode to exactly the messages nft sent for case `name`.
pub fn assert_like_nft(name: &str, ops: &[NftOp]) {
    let ours: Vec<String> = wire_messages(ops).iter().map(|m| hex(&normalize(m))).collect();
    let nft: Vec<String> = golden(name).iter().map(|m| hex(&normalize(m))).collect();
    assert_eq!(ours, nft, "{name}: ours (left) differs from nft's (right)");
}
