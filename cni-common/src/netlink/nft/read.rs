//! Reading nf_tables state: chains of a table, rules of a table or chain (each with its
//! handle, its comment and a light decoding of its expressions), whether a table exists, and
//! the ruleset generation. One netlink dump each instead of one more `nft` process; set
//! elements are read in [`super::set`].

use netlink_packet_core::{NLM_F_ACK, NLM_F_REQUEST};

use super::consts::*;
use super::expr::{expr_of, NftExpr, Verdict};
use super::family::NftFamily;
use super::set::ListedSet;
use super::set::NftElem;
use super::wire::{comment_of, dump_request, nft_msg};
use super::NfTables;
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
    /// How many references lead to the chain (`NFTA_CHAIN_USE`: its rules and the jumps and
    /// gotos into it).
    pub uses: Option<u32>,
}

/// Decode one `NFT_MSG_NEWRULE` payload (after the netlink header), with the position the
/// kernel reports for it: the handle of the rule before it in its chain (`NFTA_RULE_POSITION`,
/// absent for the first).
pub(super) fn parse_rule(payload: &[u8]) -> Option<(NftRule, Option<u64>)> {
    let body = payload.get(4..)?; // nfgenmsg
    let mut rule =
        NftRule { table: String::new(), chain: String::new(), handle: 0, comment: None, exprs: Vec::new() };
    let (mut handle, mut position) = (None, None);
    let be64 = |value: &[u8]| Some(u64::from_be_bytes(value.get(..8)?.try_into().ok()?));
    for (k, value) in attrs(body) {
        match k {
            NFTA_RULE_TABLE => rule.table = string_of(value),
            NFTA_RULE_CHAIN => rule.chain = string_of(value),
            NFTA_RULE_HANDLE => handle = Some(be64(value)?),
            NFTA_RULE_POSITION => position = Some(be64(value)?),
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
    rule.handle = handle?; // every rule the kernel lists has one
    Some((rule, position))
}

/// The rules of a rule dump's answer, in the order listed, if they are one whole listing
/// ([`rules_are_linked`]); None when the listing was torn (or a message did not decode).
pub(super) fn whole_listing(replies: &[Reply]) -> Option<Vec<NftRule>> {
    let listed: Vec<(NftRule, Option<u64>)> = replies
        .iter()
        .filter(|r| r.msg_type == nft_msg(NFT_MSG_NEWRULE))
        .map(|r| parse_rule(&r.payload))
        .collect::<Option<_>>()?;
    rules_are_linked(&listed).then(|| listed.into_iter().map(|(rule, _)| rule).collect())
}

/// Whether the rules of a dump are one listing, each chain's rules in order with none
/// missing or repeated. A dump longer than one datagram is resumed by counting rules, and the
/// kernel counts rules that an uncommitted transaction of another process has just linked
/// into a chain (or unlinks when that transaction aborts) without marking the dump as
/// interrupted: the next datagram then repeats a rule or skips one. Every dumped rule names
/// the rule before it in its chain (its position), so a listing is whole when each rule's
/// position is the handle of the rule listed just before it in the same chain, and no handle
/// comes twice. A kernel that names no position at all (none known; the attribute is as old
/// as nf_tables) leaves only the repeat check.
fn rules_are_linked(listed: &[(NftRule, Option<u64>)]) -> bool {
    let mut last: Vec<(&str, u64)> = Vec::new(); // (chain, handle of its last rule so far)
    let mut handles = std::collections::HashSet::new();
    let (mut positions, mut unlinked) = (false, false);
    for (rule, position) in listed {
        if !handles.insert(rule.handle) {
            return false;
        }
        positions |= position.is_some();
        match last.iter_mut().find(|(c, _)| *c == rule.chain) {
            Some((_, before)) => {
                unlinked |= *position != Some(*before);
                *before = rule.handle;
            }
            None => {
                unlinked |= position.is_some();
                last.push((&rule.chain, rule.handle));
            }
        }
    }
    !(positions && unlinked)
}

/// How often a rule dump that came back torn ([`rules_are_linked`]) is read again.
const RULE_DUMP_ATTEMPTS: usize = 20;

fn chain_of(payload: &[u8], table: &str) -> Option<NftChain> {
    let body = payload.get(4..)?;
    let mut t = None;
    let mut c = NftChain { name: String::new(), hook: None, chain_type: None, policy: None, uses: None };
    for (k, value) in attrs(body) {
        match k {
            NFTA_CHAIN_TABLE => t = Some(string_of(value)),
            NFTA_CHAIN_NAME => c.name = string_of(value),
            NFTA_CHAIN_TYPE => c.chain_type = Some(string_of(value)),
            NFTA_CHAIN_POLICY => c.policy = decode_be32(value),
            NFTA_CHAIN_USE => c.uses = decode_be32(value),
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
    /// chain does not exist. A listing torn by other processes' transactions is read again
    /// ([`rules_are_linked`]); after [`RULE_DUMP_ATTEMPTS`] torn ones the error is `EINTR`.
    /// Listed by chain, the rules are always whole: transactions append at a chain's end, so
    /// a dump resumed by count inside one chain can only be torn by a rule unlinked before the
    /// resume point, which a commit does (the kernel then flags the dump as interrupted) and
    /// which the linkage shows otherwise. Listed for the whole table, an aborted transaction
    /// that had appended to one chain can also cut off the last rules of a later chain, which
    /// nothing shows: whoever needs a chain whole lists it by name.
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
        for _ in 0..RULE_DUMP_ATTEMPTS {
            let replies = self.dump(dump_request(NFT_MSG_GETRULE, family, &attrs), &what)?;
            let Some(rules) = whole_listing(&replies) else { continue };
            return Ok(rules
                .into_iter()
                .filter(|r| r.table == table && chain.is_none_or(|c| r.chain == c))
                .collect());
        }
        let mut e = NlError::new(what, libc::EINTR);
        e.detail = Some(format!(
            "every one of {RULE_DUMP_ATTEMPTS} listings was torn by concurrent changes (a rule repeated or missing)"
        ));
        Err(e)
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

impl NfTables {
    /// The tables of `family` (one dump).
    pub fn tables(&mut self, family: NftFamily) -> Result<Vec<NftTable>, NlError> {
        let what = format!("list nftables tables of family {}", family.keyword());
        let replies = self.dump(dump_request(NFT_MSG_GETTABLE, family, &[]), &what)?;
        Ok(replies
            .iter()
            .filter(|r| r.msg_type == nft_msg(NFT_MSG_NEWTABLE))
            .filter_map(|r| table_of(&r.payload))
            .filter(|t| !t.name.is_empty())
            .collect())
    }
}

/// A table as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftTable {
    pub name: String,
    /// The table's comment (nft's `comment "…"`, in its userdata).
    pub comment: Option<String>,
}

fn table_of(payload: &[u8]) -> Option<NftTable> {
    let mut t = NftTable { name: String::new(), comment: None };
    for (k, value) in attrs(payload.get(4..)?) {
        match k {
            NFTA_TABLE_NAME => t.name = string_of(value),
            NFTA_TABLE_USERDATA => t.comment = comment_of(value),
            _ => {}
        }
    }
    Some(t)
}

/// What [`NfTables::snapshot`] reads of one table.
#[derive(Clone, Copy)]
pub struct SnapshotRequest<'a> {
    pub family: NftFamily,
    pub table: &'a str,
    /// Whether to dump the table's rules.
    pub rules: bool,
    /// Elements to get by key: (set, key bytes).
    pub keys: &'a [(String, Vec<u8>)],
    /// Chains to get by name (their reference counts: how many jumps lead to each).
    pub chains: &'a [String],
    /// List the table's sets and chains, and dump the elements of every set this accepts.
    pub listing: Option<&'a dyn Fn(&str) -> bool>,
}

/// One consistent reading of a table: everything in it was read at `generation`.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub generation: u32,
    /// None when the table does not exist (then nothing else was read).
    pub table: Option<NftTable>,
    pub rules: Vec<NftRule>,
    /// The elements asked for by key, in the request's order (None: not there, or no such set).
    pub keys: Vec<Option<NftElem>>,
    /// The chains asked for by name, in the request's order: how many references lead to each
    /// (`NFTA_CHAIN_USE`); None when it does not exist.
    pub chain_uses: Vec<Option<u32>>,
    /// With a listing: the table's sets (names and shapes) and chain names, and the elements
    /// of each set the listing accepted.
    pub sets: Vec<ListedSet>,
    pub chains: Vec<String>,
    pub dumped: Vec<(String, Vec<NftElem>)>,
}

/// How often a snapshot is read again when the ruleset changed while it was being read.
const SNAPSHOT_ATTEMPTS: usize = 20;

impl NfTables {
    /// Read what `req` asks for in as few round trips as possible (the generation, the
    /// elements by key and the rules in one pipelined datagram; each dumped set in one dump),
    /// again until every answer was built at the generation read first (each nf_tables message
    /// carries it): one consistent state, whose generation a guarded transaction
    /// ([`NfTables::apply_guarded`]) can name.
    pub fn snapshot(&mut self, req: &SnapshotRequest<'_>) -> Result<Snapshot, NlError> {
        let what = format!("read nftables table {} {}", req.family.keyword(), req.table);
        for _ in 0..SNAPSHOT_ATTEMPTS {
            match self.snapshot_once(req) {
                Ok(Some(s)) => return Ok(s),
                Ok(None) => continue,
                Err(e) if e.errno == libc::EINTR => continue,
                Err(e) => return Err(e.during(what)),
            }
        }
        let mut e = NlError::new(what, libc::EINTR);
        e.detail =
            Some(format!("the ruleset kept changing while it was read ({SNAPSHOT_ATTEMPTS} attempts)"));
        Err(e)
    }

    /// One attempt; None when the generation changed meanwhile.
    fn snapshot_once(&mut self, req: &SnapshotRequest<'_>) -> Result<Option<Snapshot>, NlError> {
        let get = |msg: u16, family: u8, attrs: &[(u16, Vec<u8>)]| {
            (message(nft_msg(msg), NLM_F_REQUEST, family, 0, attrs), false)
        };
        // A dump filtered by a table that does not exist answers nothing rather than ENOENT:
        // only GETTABLE tells a missing table from an empty one.
        let mut reqs = vec![
            get(NFT_MSG_GETGEN, 0, &[]),
            get(NFT_MSG_GETTABLE, req.family.proto(), &[(NFTA_TABLE_NAME, cstr(req.table))]),
        ];
        reqs.extend(
            req.keys
                .iter()
                .map(|(set, key)| (super::set::get_element_request(req.family, req.table, set, key), false)),
        );
        if !req.chains.is_empty() {
            // one dump of the family's chains rather than one request per chain
            reqs.push((dump_request(NFT_MSG_GETCHAIN, req.family, &[(NFTA_CHAIN_TABLE, req.table)]), true));
        }
        if req.rules {
            reqs.push((dump_request(NFT_MSG_GETRULE, req.family, &[(NFTA_RULE_TABLE, req.table)]), true));
        }
        let mut answers = self.sock.request_many(reqs)?;
        let generation = generation_of(answers.first().cloned())?;
        // Every nf_tables message carries the low 16 bits of the ruleset generation it was
        // built at (nfgenmsg's res_id): all of them at `generation` make one consistent state.
        let mut consistent = true;
        let mut seen = |r: &[Reply]| {
            consistent &= r.iter().all(|m| {
                m.payload.get(2..4).is_some_and(|g| u16::from_be_bytes([g[0], g[1]]) == generation as u16)
            });
        };
        let rules = if req.rules { answers.pop() } else { None };
        let mut answers = answers.into_iter().skip(1);
        let table = match answers.next().expect("asked") {
            Ok(r) => {
                seen(&r);
                r.iter()
                    .filter(|r| r.msg_type == nft_msg(NFT_MSG_NEWTABLE))
                    .find_map(|r| table_of(&r.payload))
            }
            Err(e) if e.errno == libc::ENOENT => None,
            Err(e) => return Err(e),
        };
        let Some(table) = table else {
            return Ok(Some(Snapshot { generation, ..Default::default() }));
        };
        let rules = match rules {
            None => Vec::new(),
            Some(Ok(r)) => {
                seen(&r);
                // torn by another process's transaction: read again
                let Some(rules) = whole_listing(&r) else { return Ok(None) };
                rules.into_iter().filter(|r| r.table == req.table).collect()
            }
            Some(Err(e)) if e.errno == libc::ENOENT => Vec::new(),
            Some(Err(e)) => return Err(e),
        };
        let mut s = Snapshot { generation, table: Some(table), rules, ..Default::default() };
        for (set, _) in req.keys {
            s.keys.push(match answers.next().expect("asked") {
                Ok(r) => {
                    seen(&r);
                    r.iter()
                        .flat_map(|r| super::set::parse_setelem_message(&r.payload, req.table, set))
                        .next()
                }
                Err(e) if e.errno == libc::ENOENT => None,
                Err(e) => return Err(e),
            });
        }
        if !req.chains.is_empty() {
            let found: Vec<NftChain> = match answers.next().expect("asked") {
                Ok(r) => {
                    seen(&r);
                    r.iter()
                        .filter(|r| r.msg_type == nft_msg(NFT_MSG_NEWCHAIN))
                        .filter_map(|r| chain_of(&r.payload, req.table))
                        .collect()
                }
                Err(e) if e.errno == libc::ENOENT => Vec::new(),
                Err(e) => return Err(e),
            };
            s.chain_uses = req
                .chains
                .iter()
                .map(|c| found.iter().find(|f| f.name == *c).map(|f| f.uses.unwrap_or(0)))
                .collect();
        }
        if let Some(accept) = req.listing {
            let sets = dump_request(NFT_MSG_GETSET, req.family, &[(NFTA_SET_TABLE, req.table)]);
            let chains = dump_request(NFT_MSG_GETCHAIN, req.family, &[(NFTA_CHAIN_TABLE, req.table)]);
            let mut lists = self.sock.request_many(vec![(sets, true), (chains, true)])?.into_iter();
            let mut listed = |msg: u16| -> Result<Vec<Reply>, NlError> {
                match lists.next().expect("asked") {
                    Ok(r) => {
                        seen(&r);
                        Ok(r.into_iter().filter(|r| r.msg_type == nft_msg(msg)).collect())
                    }
                    Err(e) if e.errno == libc::ENOENT => Ok(Vec::new()),
                    Err(e) => Err(e),
                }
            };
            s.sets = listed(NFT_MSG_NEWSET)?
                .iter()
                .filter_map(|r| super::set::listed_set(&r.payload, req.table))
                .collect();
            s.chains = listed(NFT_MSG_NEWCHAIN)?
                .iter()
                .filter_map(|r| chain_of(&r.payload, req.table))
                .map(|c| c.name)
                .collect();
            let names: Vec<String> = s.sets.iter().map(|x| x.name.clone()).collect();
            for set in names.into_iter().filter(|n| accept(n)) {
                let dump = dump_request(
                    NFT_MSG_GETSETELEM,
                    req.family,
                    &[(NFTA_SET_ELEM_LIST_TABLE, req.table), (NFTA_SET_ELEM_LIST_SET, &set)],
                );
                let answer = self.sock.request_many(vec![(dump, true)])?.pop().expect("asked");
                let elems = match answer {
                    Ok(r) => {
                        seen(&r);
                        r.iter()
                            .filter(|r| r.msg_type == nft_msg(NFT_MSG_NEWSETELEM))
                            .flat_map(|r| super::set::parse_setelem_message(&r.payload, req.table, &set))
                            .collect()
                    }
                    Err(e) if e.errno == libc::ENOENT => Vec::new(),
                    Err(e) => return Err(e),
                };
                s.dumped.push((set, elems));
            }
        }
        Ok(consistent.then_some(s))
    }
}

/// The generation in the answer to a `GETGEN`.
fn generation_of(answer: Option<Result<Vec<Reply>, NlError>>) -> Result<u32, NlError> {
    answer
        .expect("asked")?
        .iter()
        .filter(|r| r.msg_type == nft_msg(NFT_MSG_NEWGEN))
        .find_map(|r| find_attr(r.payload.get(4..)?, NFTA_GEN_ID).and_then(decode_be32))
        .ok_or_else(|| NlError::new("nftables generation (no id in the reply)", libc::EBADMSG))
}
