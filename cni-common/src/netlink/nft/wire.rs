//! The nf_tables message layer that writing ([`super::NfTables::apply`]) and both kinds of
//! reading ([`super::read`], [`super::set`]) share: message types, dump requests, and the
//! comment that tables, chains, rules and elements carry in their userdata.

use netlink_packet_core::{NLM_F_DUMP, NLM_F_REQUEST};

use super::consts::{COMMENT_MAX, NFNL_SUBSYS_NFTABLES, UDATA_COMMENT};
use super::family::NftFamily;
use crate::netlink::nfnl::{self, cstr, message, string_of};

/// The message type of nf_tables message `msg`.
pub(crate) const fn nft_msg(msg: u16) -> u16 {
    nfnl::msg_type(NFNL_SUBSYS_NFTABLES, msg)
}

/// A dump request of the nf_tables subsystem with string attributes.
pub(crate) fn dump_request(msg: u16, family: NftFamily, attrs: &[(u16, &str)]) -> Vec<u8> {
    let attrs: Vec<(u16, Vec<u8>)> = attrs.iter().map(|(k, v)| (*k, cstr(v))).collect();
    message(nft_msg(msg), NLM_F_REQUEST | NLM_F_DUMP, family.proto(), 0, &attrs)
}

/// A comment TLV as libnftnl writes it (`nftnl_udata_put_strz`): type, length with the
/// terminating NUL, text, NUL. Cut at [`COMMENT_MAX`] bytes (on a character boundary).
pub(crate) fn comment_udata(comment: &str) -> Vec<u8> {
    let mut end = comment.len().min(COMMENT_MAX);
    while !comment.is_char_boundary(end) {
        end -= 1;
    }
    let text = &comment.as_bytes()[..end];
    let mut v = vec![UDATA_COMMENT, (text.len() + 1) as u8];
    v.extend_from_slice(text);
    v.push(0);
    v
}

/// The comment in the userdata of a table, chain, rule or element.
pub(crate) fn comment_of(udata: &[u8]) -> Option<String> {
    let mut rest = udata;
    while rest.len() >= 2 {
        let (kind, len) = (rest[0], rest[1] as usize);
        let value = rest.get(2..2 + len)?;
        if kind == UDATA_COMMENT {
            return Some(string_of(value));
        }
        rest = &rest[2 + len..];
    }
    None
}
