//! Reading a set's or map's elements back ([`NfTables::set_elements`]).

use super::consts::*;
use super::family::NftFamily;
use super::set::{parse_setelem_message, NftElem};
use super::wire::{dump_request, nft_msg};
use super::NfTables;
use crate::netlink::NlError;

impl NfTables {
    /// The elements of set or map `set` of `table` (empty when either does not exist).
    pub fn set_elements(
        &mut self,
        family: NftFamily,
        table: &str,
        set: &str,
    ) -> Result<Vec<NftElem>, NlError> {
        let what = format!("list elements of {} {table} {set}", family.keyword());
        let req = dump_request(
            NFT_MSG_GETSETELEM,
            family,
            &[(NFTA_SET_ELEM_LIST_TABLE, table), (NFTA_SET_ELEM_LIST_SET, set)],
        );
        Ok(self
            .dump(req, &what)?
            .iter()
            .filter(|r| r.msg_type == nft_msg(NFT_MSG_NEWSETELEM))
            .flat_map(|r| parse_setelem_message(&r.payload, table, set))
            .collect())
    }
}
