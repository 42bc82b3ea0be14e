//! Reading nf_tables state: chains of a table, rules of a table or chain (each with its
//! handle, its comment and a light decoding of its expressions), whether a table exists, and
//! the ruleset generation. One netlink dump each instead of one more `nft` process; set
//! elements are read in [`super::set`].

use netlink_packet_core::{NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST};

use super::consts::*;
use super::expr::{expr_of, NftExpr, Verdict};
use super::{comment_of, nft_msg, NfTables, NftFamily};
use crate::netlink::nfnl::{attrs, cstr, decode_be32, find_attr, message, string_of};
use crate::netlink::socket::Reply;
use crate::netlink::NlError;

/// One rule as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftRule {
    pub table: String,
    pub chain: String,
    pub handle: u64,
    pub comment: Option<String>,
    pub exprs: Vec<NftExpr>,
}

impl NftRule {
    /// Whether the rule looks something up in set or map `set`.
    pub fn uses_set(&self, set: &str) -> bool {
        self.exprs.iter().any(|e| matches!(e, NftExpr::Lookup { set: s } if s == set))
    }

    /// Whether the rule has an expression called `name` (e.g. "masq").
    pub fn has_expr(&self, name: &str) -> bool {
        self.exprs.iter().any(|e| matches!(e, NftExpr::Other(n) if n == name))
    }

    /// The bytes of every `cmp` of the rule.
    pub fn cmp_data(&self) -> impl Iterator<Item = &[u8]> {
        self.exprs.iter().filter_map(|e| match e {
            NftExpr::Cmp { data, .. } => Some(data.as_slice()),
            _ => None,
        })
    }

    /// The interface name a rule matches with `iifname "…"` (meta iifname followed by cmp).
    pub fn iifname(&self) -> Option<String> {
        let i = self.exprs.iter().position(|e| matches!(e, NftExpr::Meta { key: META_IIFNAME }))?;
        match self.exprs.get(i + 1) {
            Some(NftExpr::Cmp { data, .. }) => Some(string_of(data)),
            _ => None,
        }
    }

    /// The verdicts of the rule.
    pub fn verdicts(&self) -> impl Iterator<Item = &Verdict> {
        self.exprs.iter().filter_map(|e| match e {
            NftExpr::Verdict(v) => Some(v),
            _ => None,
        })
    }
}

/// A chain as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftChain {
    pub name: String,
    /// For a base chain: hook number (`NF_INET_*`/`NF_BR_*`, e.g. 4 = postrouting, 0 =
    /// prerouting) and priority.
    pub hook: Option<(u32, i32)>,
    /// Base chain type: "filter", "nat", "route".
    pub chain_type: Option<String>,
    /// Base chain policy (`NF_ACCEPT` = 1, `NF_DROP` = 0).
    pub policy: Option<u32>,
}

/// A dump request of the nf_tables subsystem with string attributes.
pub(super) fn dump_request(msg: u16, family: NftFamily, attrs: &[(u16, &str)]) -> Vec<u8> {
    let attrs: Vec<(u16, Vec<u8>)> = attrs.iter().map(|(k, v)| (*k, cstr(v))).collect();
    message(nft_msg(msg), NLM_F_REQUEST | NLM_F_DUMP, family.proto(), 0, &attrs)
}

/// Decode one `NFT_MSG_NEWRULE` payload (after the netlink header).
pub(super) fn parse_rule(payload: &[u8]) -> Option<NftRule> {
    let body = payload.get(4..)?; // nfgenmsg
    let mut rule =
        NftRule { table: String::new(), chain: String::new(), handle: 0, comment: None, exprs: Vec::new() };
    for (k, value) in attrs(body) {
        match k {
            NFTA_RULE_TABLE => rule.table = string_of(value),
            NFTA_RULE_CHAIN => rule.chain = string_of(value),
            NFTA_RULE_HANDLE => rule.handle = u64::from_be_bytes(value.get(..8)?.try_into().ok()?),
            NFTA_RULE_USERDATA => rule.comment = comment_of(value),
            NFTA_RULE_EXPRESSIONS => {
                for (ek, ev) in attrs(value) {
                    if ek == NFTA_LIST_ELEM {
                        rule.exprs.extend(expr_of(ev));
                    }
                }
            }
            _ => {}
        }
    }
    Some(rule)
}

fn chain_of(payload: &[u8], table: &str) -> Option<NftChain> {
    let body = payload.get(4..)?;
    let mut t = None;
    let mut c = NftChain { name: String::new(), hook: None, chain_type: None, policy: None };
    for (k, value) in attrs(body) {
        match k {
            NFTA_CHAIN_TABLE => t = Some(string_of(value)),
            NFTA_CHAIN_NAME => c.name = string_of(value),
            NFTA_CHAIN_TYPE => c.chain_type = Some(string_of(value)),
            NFTA_CHAIN_POLICY => c.policy = decode_be32(value),
            NFTA_CHAIN_HOOK => {
                let num = find_attr(value, NFTA_HOOK_HOOKNUM).and_then(decode_be32);
                let prio = find_attr(value, NFTA_HOOK_PRIORITY).and_then(decode_be32).map(|p| p as i32);
                c.hook = num.zip(prio);
            }
            _ => {}
        }
    }
    (t.as_deref() == Some(table) && !c.name.is_empty()).then_some(c)
}

impl NfTables {
    /// Run a dump; a missing table or chain (ENOENT) is an empty answer.
    pub(super) fn dump(&mut self, packet: Vec<u8>, what: &str) -> Result<Vec<Reply>, NlError> {
        match self.sock.request_packet(packet, true) {
            Ok(r) => Ok(r),
            Err(e) if e.errno == libc::ENOENT => Ok(Vec::new()),
            Err(e) => Err(e.during(what.to_string())),
        }
    }

    /// Rules of `table` (all chains, or only `chain`), in chain order. Empty when the table or
    /// chain does not exist.
    pub fn rules(
        &mut self,
        family: NftFamily,
        table: &str,
        chain: Option<&str>,
    ) -> Result<Vec<NftRule>, NlError> {
        let mut attrs = vec![(NFTA_RULE_TABLE, table)];
        if let Some(c) = chain {
            attrs.push((NFTA_RULE_CHAIN, c));
        }
        let what = format!("list nftables rules of {} {table}", family.keyword());
        let replies = self.dump(dump_request(NFT_MSG_GETRULE, family, &attrs), &what)?;
        Ok(replies
            .iter()
            .filter(|r| r.msg_type == nft_msg(NFT_MSG_NEWRULE))
            .filter_map(|r| parse_rule(&r.payload))
            .filter(|r| r.table == table && chain.is_none_or(|c| r.chain == c))
            .collect())
    }

    /// The chains of `table` (empty when it does not exist).
    pub fn chain_info(&mut self, family: NftFamily, table: &str) -> Result<Vec<NftChain>, NlError> {
        let what = format!("list nftables chains of {} {table}", family.keyword());
        let replies =
            self.dump(dump_request(NFT_MSG_GETCHAIN, family, &[(NFTA_CHAIN_TABLE, table)]), &what)?;
        Ok(replies
            .iter()
            .filter(|r| r.msg_type == nft_msg(NFT_MSG_NEWCHAIN))
            .filter_map(|r| chain_of(&r.payload, table))
            .collect())
    }

    /// Names of the chains of `table` (empty when it does not exist).
    pub fn chains(&mut self, family: NftFamily, table: &str) -> Result<Vec<String>, NlError> {
        Ok(self.chain_info(family, table)?.into_iter().map(|c| c.name).collect())
    }

    /// The ruleset generation: it changes with every committed transaction, so two equal
    /// readings around a series of dumps prove they saw one consistent state.
    pub fn generation(&mut self) -> Result<u32, NlError> {
        let req = message(nft_msg(NFT_MSG_GETGEN), NLM_F_REQUEST | NLM_F_ACK, 0, 0, &[]);
        let replies = self.sock.request_packet(req, false).map_err(|e| e.during("nftables generation"))?;
        replies
            .iter()
            .filter(|r| r.msg_type == nft_msg(NFT_MSG_NEWGEN))
            .find_map(|r| find_attr(r.payload.get(4..)?, NFTA_GEN_ID).and_then(decode_be32))
            .ok_or_else(|| NlError::new("nftables generation (no id in the reply)", libc::EBADMSG))
    }

    /// Whether `table` exists.
    pub fn has_table(&mut self, family: NftFamily, table: &str) -> Result<bool, NlError> {
        let req = message(
            nft_msg(NFT_MSG_GETTABLE),
            NLM_F_REQUEST | NLM_F_ACK,
            family.proto(),
            0,
            &[(NFTA_TABLE_NAME, cstr(table))],
        );
        match self.sock.request_packet(req, false) {
            Ok(_) => Ok(true),
            Err(e) if e.errno == libc::ENOENT => Ok(false),
            Err(e) => Err(e.during(format!("get nftables table {} {table}", family.keyword()))),
        }
    }

    /// Whether chain `chain` of `table` exists: one GET of that chain (no dump of the table's
    /// chains, which on a kube-proxy node are thousands).
    pub fn has_chain(&mut self, family: NftFamily, table: &str, chain: &str) -> Result<bool, NlError> {
        let req = message(
            nft_msg(NFT_MSG_GETCHAIN),
            NLM_F_REQUEST | NLM_F_ACK,
            family.proto(),
            0,
            &[(NFTA_CHAIN_TABLE, cstr(table)), (NFTA_CHAIN_NAME, cstr(chain))],
        );
        match self.sock.request_packet(req, false) {
            Ok(_) => Ok(true),
            Err(e) if e.errno == libc::ENOENT => Ok(false),
            Err(e) => Err(e.during(format!("get nftables chain {} {table} {chain}", family.keyword()))),
        }
    }
}
