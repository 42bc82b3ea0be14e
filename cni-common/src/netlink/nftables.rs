//! Reading nftables state over netlink (`NETLINK_NETFILTER`, nf_tables subsystem) without
//! executing `nft`: chains of a table and rules of a table or chain, each rule with its handle,
//! its comment and a light decoding of its expressions.
//!
//! Writing (elements, tables, chains, rules) is in [`super::nftwrite`]; plugins still use
//! `nft -f` (see [`crate::nft`]) where their input is nft syntax. This module finds the handles of the
//! rules a plugin must delete, or proves there is nothing to delete, for the price of one netlink
//! dump instead of one more `nft` process, and deletes (rules by handle, whole chains) in one
//! atomic nfnetlink batch ([`NfTables::delete`]).
//!
//! Why deletes matter: the kernel frees deleted nftables objects after an RCU grace period and,
//! when the netlink socket that made the change is released, waits for that (10-20 ms here) —
//! in `nft` that is every `nft -f` that deletes or redefines something. A socket of our own can
//! be kept open by a process that outlives the verb (see the bridge plugin's DEL), so the caller
//! does not wait.

use netlink_packet_core::{NLM_F_DUMP, NLM_F_REQUEST};

use super::socket::NlSocket;
use super::NlError;

const NETLINK_NETFILTER: isize = 12;
pub(super) const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFT_MSG_DELTABLE: u16 = 2;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_GETCHAIN: u16 = 4;
const NFT_MSG_DELCHAIN: u16 = 5;
const NFT_MSG_NEWRULE: u16 = 6;
const NFT_MSG_GETRULE: u16 = 7;
const NFT_MSG_DELRULE: u16 = 8;
const NFT_MSG_DELSET: u16 = 11;
pub(super) const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
pub(super) const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFTA_TABLE_NAME: u16 = 1;

const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_POLICY: u16 = 5;
const NFTA_CHAIN_TYPE: u16 = 7;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_HOOK_PRIORITY: u16 = 2;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_HANDLE: u16 = 3;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_RULE_USERDATA: u16 = 7;
pub(super) const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_CMP_OP: u16 = 2;
const NFTA_CMP_DATA: u16 = 3;
pub(super) const NFTA_DATA_VALUE: u16 = 1;
pub(super) const NFTA_DATA_VERDICT: u16 = 2;
pub(super) const NFTA_VERDICT_CODE: u16 = 1;
pub(super) const NFTA_VERDICT_CHAIN: u16 = 2;
const NFTA_META_KEY: u16 = 2;
const NFTA_IMMEDIATE_DATA: u16 = 2;
const NFTA_LOOKUP_SET: u16 = 1;
/// `NFTNL_UDATA_RULE_COMMENT`: the TLV type of a rule comment inside `NFTA_RULE_USERDATA`.
const UDATA_RULE_COMMENT: u8 = 0;
const NLA_TYPE_MASK: u16 = 0x3fff;

/// An nftables address family (`NFPROTO_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NftFamily {
    Inet,
    Ip,
    Ip6,
    Bridge,
}

impl NftFamily {
    pub(super) fn proto(self) -> u8 {
        match self {
            NftFamily::Inet => 1,
            NftFamily::Ip => 2,
            NftFamily::Bridge => 7,
            NftFamily::Ip6 => 10,
        }
    }

    /// The family keyword of nft's syntax.
    pub fn keyword(self) -> &'static str {
        match self {
            NftFamily::Inet => "inet",
            NftFamily::Ip => "ip",
            NftFamily::Bridge => "bridge",
            NftFamily::Ip6 => "ip6",
        }
    }
}

/// A verdict of an `immediate` expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Accept,
    Drop,
    Return,
    Continue,
    Jump(String),
    Goto(String),
    Other(i32),
}

/// A rule expression, decoded as far as plugins need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NftExpr {
    /// `cmp`: operator (`NFT_CMP_*`, 0 = eq, 1 = neq) and the compared bytes.
    Cmp { op: u32, data: Vec<u8> },
    /// `meta`: the key (`NFT_META_*`, e.g. 6 = iifname, 7 = oifname).
    Meta { key: u32 },
    /// `immediate` carrying a verdict.
    Verdict(Verdict),
    /// `lookup` in a named set or map (`@set`, `vmap @map`, `… map @map`).
    Lookup { set: String },
    /// Anything else, by name (`payload`, `masq`, `lookup`, `fib`, …).
    Other(String),
}

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
        let i = self.exprs.iter().position(|e| matches!(e, NftExpr::Meta { key: 6 }))?;
        match self.exprs.get(i + 1) {
            Some(NftExpr::Cmp { data, .. }) => {
                let end = data.iter().position(|b| *b == 0).unwrap_or(data.len());
                Some(String::from_utf8_lossy(&data[..end]).into_owned())
            }
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

/// Netlink attributes of `buf` as (type without flag bits, value); stops at the first malformed one.
pub(super) fn nlas(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if buf.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([buf[0], buf[1]]) as usize;
        let kind = u16::from_ne_bytes([buf[2], buf[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > buf.len() {
            return None;
        }
        let value = &buf[4..len];
        buf = &buf[((len + 3) & !3).min(buf.len())..];
        Some((kind, value))
    })
}

pub(super) fn attr(out: &mut Vec<u8>, kind: u16, value: &[u8]) {
    let len = 4 + value.len();
    out.extend_from_slice(&(len as u16).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(value);
    while !out.len().is_multiple_of(4) {
        out.push(0);
    }
}

pub(super) fn cstr(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

/// A dump request of the nf_tables subsystem: nlmsghdr + nfgenmsg + attributes.
pub(crate) fn dump_request(msg: u16, family: NftFamily, attrs: &[(u16, &str)]) -> Vec<u8> {
    let mut body = vec![family.proto(), 0 /* NFNETLINK_V0 */, 0, 0 /* res_id */];
    for (kind, value) in attrs {
        attr(&mut body, *kind, &cstr(value));
    }
    let mut packet = Vec::with_capacity(16 + body.len());
    packet.extend_from_slice(&((16 + body.len()) as u32).to_ne_bytes());
    packet.extend_from_slice(&((NFNL_SUBSYS_NFTABLES << 8) | msg).to_ne_bytes());
    packet.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    packet.extend_from_slice(&[0; 8]); // sequence number (set when sent) and port id
    packet.extend_from_slice(&body);
    packet
}

pub(super) fn string_of(v: &[u8]) -> String {
    let end = v.iter().position(|b| *b == 0).unwrap_or(v.len());
    String::from_utf8_lossy(&v[..end]).into_owned()
}

pub(super) fn be32(v: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(v.get(..4)?.try_into().ok()?))
}

pub(super) fn comment_of(udata: &[u8]) -> Option<String> {
    let mut rest = udata;
    while rest.len() >= 2 {
        let (kind, len) = (rest[0], rest[1] as usize);
        let value = rest.get(2..2 + len)?;
        if kind == UDATA_RULE_COMMENT {
            return Some(string_of(value));
        }
        rest = &rest[2 + len..];
    }
    None
}

pub(super) fn verdict_of(data: &[u8]) -> Option<Verdict> {
    let v = nlas(data).find(|(k, _)| *k == NFTA_DATA_VERDICT)?;
    let (mut code, mut chain) = (None, None);
    for (k, value) in nlas(v.1) {
        match k {
            NFTA_VERDICT_CODE => code = be32(value).map(|c| c as i32),
            NFTA_VERDICT_CHAIN => chain = Some(string_of(value)),
            _ => {}
        }
    }
    Some(match (code?, chain) {
        (1, _) => Verdict::Accept,
        (0, _) => Verdict::Drop,
        (-1, _) => Verdict::Continue,
        (-5, _) => Verdict::Return,
        (-3, Some(c)) => Verdict::Jump(c),
        (-4, Some(c)) => Verdict::Goto(c),
        (other, _) => Verdict::Other(other),
    })
}

fn expr_of(elem: &[u8]) -> Option<NftExpr> {
    let (mut name, mut data) = (None, None);
    for (k, value) in nlas(elem) {
        match k {
            NFTA_EXPR_NAME => name = Some(string_of(value)),
            NFTA_EXPR_DATA => data = Some(value),
            _ => {}
        }
    }
    let name = name?;
    let data = data.unwrap_or_default();
    let find = |kind: u16| nlas(data).find(|(k, _)| *k == kind).map(|(_, v)| v);
    Some(match name.as_str() {
        "cmp" => {
            let op = find(NFTA_CMP_OP).and_then(be32).unwrap_or(0);
            let bytes = find(NFTA_CMP_DATA)
                .and_then(|d| nlas(d).find(|(k, _)| *k == NFTA_DATA_VALUE).map(|(_, v)| v.to_vec()))
                .unwrap_or_default();
            NftExpr::Cmp { op, data: bytes }
        }
        "meta" => NftExpr::Meta { key: find(NFTA_META_KEY).and_then(be32).unwrap_or(u32::MAX) },
        "immediate" => match find(NFTA_IMMEDIATE_DATA).and_then(verdict_of) {
            Some(v) => NftExpr::Verdict(v),
            None => NftExpr::Other(name),
        },
        "lookup" => match find(NFTA_LOOKUP_SET) {
            Some(set) => NftExpr::Lookup { set: string_of(set) },
            None => NftExpr::Other(name),
        },
        _ => NftExpr::Other(name),
    })
}

/// Decode one `NFT_MSG_NEWRULE` payload (after the netlink header).
pub(crate) fn parse_rule(payload: &[u8]) -> Option<NftRule> {
    let attrs = payload.get(4..)?; // nfgenmsg
    let mut rule =
        NftRule { table: String::new(), chain: String::new(), handle: 0, comment: None, exprs: Vec::new() };
    for (k, value) in nlas(attrs) {
        match k {
            NFTA_RULE_TABLE => rule.table = string_of(value),
            NFTA_RULE_CHAIN => rule.chain = string_of(value),
            NFTA_RULE_HANDLE => rule.handle = u64::from_be_bytes(value.get(..8)?.try_into().ok()?),
            NFTA_RULE_USERDATA => rule.comment = comment_of(value),
            NFTA_RULE_EXPRESSIONS => {
                for (ek, ev) in nlas(value) {
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

fn chain_of(payload: &[u8], table: &str) -> Option<NftChain> {
    let attrs = payload.get(4..)?;
    let mut t = None;
    let mut c = NftChain { name: String::new(), hook: None, chain_type: None, policy: None };
    for (k, value) in nlas(attrs) {
        match k {
            NFTA_CHAIN_TABLE => t = Some(string_of(value)),
            NFTA_CHAIN_NAME => c.name = string_of(value),
            NFTA_CHAIN_TYPE => c.chain_type = Some(string_of(value)),
            NFTA_CHAIN_POLICY => c.policy = be32(value),
            NFTA_CHAIN_HOOK => {
                let (mut num, mut prio) = (None, None);
                for (hk, hv) in nlas(value) {
                    match hk {
                        NFTA_HOOK_HOOKNUM => num = be32(hv),
                        NFTA_HOOK_PRIORITY => prio = be32(hv).map(|p| p as i32),
                        _ => {}
                    }
                }
                c.hook = num.zip(prio);
            }
            _ => {}
        }
    }
    (t.as_deref() == Some(table) && !c.name.is_empty()).then_some(c)
}

/// One deletion of a [`NfTables::delete`] transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NftDelete {
    /// A rule, by handle.
    Rule { family: NftFamily, table: String, chain: String, handle: u64 },
    /// Every rule of a chain (`flush chain`).
    Flush { family: NftFamily, table: String, chain: String },
    /// A chain (it must not be referenced by a jump; flush it in the same transaction first).
    Chain { family: NftFamily, table: String, chain: String },
    /// A whole table with everything in it.
    Table { family: NftFamily, table: String },
    /// A set or map with its elements (no rule may use it any more: delete or flush those
    /// rules first, in the same transaction).
    Set { family: NftFamily, table: String, set: String },
}

pub(super) fn message(
    msg_type: u16,
    flags: u16,
    family: u8,
    res_id: u16,
    attrs: &[(u16, Vec<u8>)],
) -> Vec<u8> {
    let mut body = vec![family, 0 /* NFNETLINK_V0 */];
    body.extend_from_slice(&res_id.to_be_bytes());
    for (kind, value) in attrs {
        attr(&mut body, *kind, value);
    }
    let mut packet = Vec::with_capacity(16 + body.len());
    packet.extend_from_slice(&((16 + body.len()) as u32).to_ne_bytes());
    packet.extend_from_slice(&msg_type.to_ne_bytes());
    packet.extend_from_slice(&flags.to_ne_bytes());
    packet.extend_from_slice(&[0; 8]);
    packet.extend_from_slice(&body);
    packet
}

/// The message of one deletion, acknowledged.
pub(super) fn delete_message(op: &NftDelete) -> Vec<u8> {
    const ACKED: u16 = NLM_F_REQUEST | netlink_packet_core::NLM_F_ACK;
    let kind = |m: u16| (NFNL_SUBSYS_NFTABLES << 8) | m;
    match op {
        NftDelete::Rule { family, table, chain, handle } => message(
            kind(NFT_MSG_DELRULE),
            ACKED,
            family.proto(),
            0,
            &[
                (NFTA_RULE_TABLE, cstr(table)),
                (NFTA_RULE_CHAIN, cstr(chain)),
                (NFTA_RULE_HANDLE, handle.to_be_bytes().to_vec()),
            ],
        ),
        NftDelete::Flush { family, table, chain } => message(
            kind(NFT_MSG_DELRULE),
            ACKED,
            family.proto(),
            0,
            &[(NFTA_RULE_TABLE, cstr(table)), (NFTA_RULE_CHAIN, cstr(chain))],
        ),
        NftDelete::Chain { family, table, chain } => message(
            kind(NFT_MSG_DELCHAIN),
            ACKED,
            family.proto(),
            0,
            &[(NFTA_CHAIN_TABLE, cstr(table)), (NFTA_CHAIN_NAME, cstr(chain))],
        ),
        NftDelete::Table { family, table } => {
            message(kind(NFT_MSG_DELTABLE), ACKED, family.proto(), 0, &[(NFTA_TABLE_NAME, cstr(table))])
        }
        NftDelete::Set { family, table, set } => {
            // NFTA_SET_TABLE = 1, NFTA_SET_NAME = 2
            message(kind(NFT_MSG_DELSET), ACKED, family.proto(), 0, &[(1, cstr(table)), (2, cstr(set))])
        }
    }
}

/// An nfnetlink batch: begin, `messages`, end.
pub(super) fn batch(messages: impl IntoIterator<Item = Vec<u8>>) -> Vec<Vec<u8>> {
    let mut out = vec![message(NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, 0, NFNL_SUBSYS_NFTABLES, &[])];
    out.extend(messages);
    out.push(message(NFNL_MSG_BATCH_END, NLM_F_REQUEST, 0, NFNL_SUBSYS_NFTABLES, &[]));
    out
}

/// The nfnetlink batch for `ops`: begin, one message per deletion (each acknowledged), end.
pub(crate) fn delete_batch(ops: &[NftDelete]) -> Vec<Vec<u8>> {
    batch(ops.iter().map(delete_message))
}

/// A `NETLINK_NETFILTER` connection in the calling thread's network namespace.
pub struct NfTables {
    pub(super) sock: NlSocket,
}

impl NfTables {
    pub fn new() -> Result<NfTables, NlError> {
        Ok(NfTables { sock: NlSocket::open_protocol(NETLINK_NETFILTER)? })
    }

    pub(super) fn dump(&mut self, packet: Vec<u8>, what: &str) -> Result<Vec<super::socket::Reply>, NlError> {
        match self.sock.request_packet(packet, true) {
            Ok(r) => Ok(r),
            // No such table/chain: nothing to list.
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
            .filter(|r| r.msg_type == (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWRULE)
            .filter_map(|r| parse_rule(&r.payload))
            .filter(|r| r.table == table && chain.is_none_or(|c| r.chain == c))
            .collect())
    }

    /// Apply `ops` as one atomic transaction: all of them or none. Nothing is sent for an empty
    /// list. Deleting something that is not there fails the whole transaction (ENOENT, see
    /// [`NlError::is_not_found`]); callers re-read and retry.
    pub fn delete(&mut self, ops: &[NftDelete]) -> Result<(), NlError> {
        if ops.is_empty() {
            return Ok(());
        }
        self.sock
            .request_batch(delete_batch(ops))
            .map_err(|e| e.during(format!("nftables transaction ({} deletions)", ops.len())))
    }

    /// The chains of `table` (empty when it does not exist).
    pub fn chain_info(&mut self, family: NftFamily, table: &str) -> Result<Vec<NftChain>, NlError> {
        let what = format!("list nftables chains of {} {table}", family.keyword());
        let replies =
            self.dump(dump_request(NFT_MSG_GETCHAIN, family, &[(NFTA_CHAIN_TABLE, table)]), &what)?;
        Ok(replies
            .iter()
            .filter(|r| r.msg_type == (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWCHAIN)
            .filter_map(|r| chain_of(&r.payload, table))
            .collect())
    }

    /// Names of the chains of `table` (empty when it does not exist).
    pub fn chains(&mut self, family: NftFamily, table: &str) -> Result<Vec<String>, NlError> {
        Ok(self.chain_info(family, table)?.into_iter().map(|c| c.name).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dump_request_layout() {
        let p = dump_request(
            NFT_MSG_GETRULE,
            NftFamily::Bridge,
            &[(NFTA_RULE_TABLE, "nat"), (NFTA_RULE_CHAIN, "PREROUTING")],
        );
        // header: len, type 0x0a07, flags REQUEST|DUMP (0x301)
        assert_eq!(u32::from_ne_bytes(p[0..4].try_into().unwrap()) as usize, p.len());
        assert_eq!(u16::from_ne_bytes(p[4..6].try_into().unwrap()), 0x0a07);
        assert_eq!(u16::from_ne_bytes(p[6..8].try_into().unwrap()), 0x301);
        assert_eq!(&p[16..20], &[7, 0, 0, 0]);
        // "nat\0" padded to 4 + 4 header bytes
        assert_eq!(u16::from_ne_bytes(p[20..22].try_into().unwrap()), 8);
        assert_eq!(&p[24..28], b"nat\0");
        assert_eq!(u16::from_ne_bytes(p[28..30].try_into().unwrap()), 15);
        assert_eq!(&p[32..43], b"PREROUTING\0");
        assert_eq!(p.len() % 4, 0);
    }

    fn nested(kind: u16, inner: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        attr(&mut v, kind | 0x8000, inner);
        v
    }

    #[test]
    fn rule_with_comment_cmp_meta_and_verdict() {
        let mut payload = vec![7, 0, 0, 0];
        attr(&mut payload, NFTA_RULE_TABLE, b"nat\0");
        attr(&mut payload, NFTA_RULE_CHAIN, b"PREROUTING\0");
        attr(&mut payload, NFTA_RULE_HANDLE, &42u64.to_be_bytes());
        let mut exprs = Vec::new();
        // meta iifname
        let mut meta = Vec::new();
        attr(&mut meta, NFTA_EXPR_NAME, b"meta\0");
        let mut md = Vec::new();
        attr(&mut md, 1, &1u32.to_be_bytes());
        attr(&mut md, NFTA_META_KEY, &6u32.to_be_bytes());
        meta.extend(nested(NFTA_EXPR_DATA, &md));
        exprs.extend(nested(NFTA_LIST_ELEM, &meta));
        // cmp eq "veth1234"
        let mut cmp = Vec::new();
        attr(&mut cmp, NFTA_EXPR_NAME, b"cmp\0");
        let mut cd = Vec::new();
        attr(&mut cd, 1, &1u32.to_be_bytes());
        attr(&mut cd, NFTA_CMP_OP, &0u32.to_be_bytes());
        let mut value = Vec::new();
        attr(&mut value, NFTA_DATA_VALUE, b"veth1234\0\0\0\0\0\0\0\0");
        cd.extend(nested(NFTA_CMP_DATA, &value));
        cmp.extend(nested(NFTA_EXPR_DATA, &cd));
        exprs.extend(nested(NFTA_LIST_ELEM, &cmp));
        // immediate jump "chainx"
        let mut imm = Vec::new();
        attr(&mut imm, NFTA_EXPR_NAME, b"immediate\0");
        let mut verdict = Vec::new();
        attr(&mut verdict, NFTA_VERDICT_CODE, &(-3i32).to_be_bytes());
        attr(&mut verdict, NFTA_VERDICT_CHAIN, b"chainx\0");
        let data = nested(NFTA_DATA_VERDICT, &verdict);
        let mut id = Vec::new();
        attr(&mut id, 1, &0u32.to_be_bytes());
        id.extend(nested(NFTA_IMMEDIATE_DATA, &data));
        imm.extend(nested(NFTA_EXPR_DATA, &id));
        exprs.extend(nested(NFTA_LIST_ELEM, &imm));
        payload.extend(nested(NFTA_RULE_EXPRESSIONS, &exprs));
        // userdata: comment TLV
        let mut udata = vec![UDATA_RULE_COMMENT, 8];
        udata.extend_from_slice(b"hello-x\0");
        attr(&mut payload, NFTA_RULE_USERDATA, &udata);

        let r = parse_rule(&payload).unwrap();
        assert_eq!((r.table.as_str(), r.chain.as_str(), r.handle), ("nat", "PREROUTING", 42));
        assert_eq!(r.comment.as_deref(), Some("hello-x"));
        assert_eq!(r.iifname().as_deref(), Some("veth1234"));
        assert_eq!(r.verdicts().collect::<Vec<_>>(), vec![&Verdict::Jump("chainx".into())]);
        assert!(!r.has_expr("masq"));
    }

    /// Kernel test: rules written with `nft` in a private namespace are read back over netlink.
    #[test]
    fn reads_back_rules_written_by_nft() {
        crate::netns::test_support::private_netns();
        let nft = crate::nft::Nft::find().expect("nft is installed (scripts/install-deps.sh)");
        let mut nf = NfTables::new().unwrap();
        assert!(nf.rules(NftFamily::Inet, "t", None).unwrap().is_empty(), "no table yet");
        assert!(nf.chains(NftFamily::Inet, "t").unwrap().is_empty());
        nft.apply(
            "add table inet t\n\
             add chain inet t c\n\
             add chain inet t pr { type nat hook postrouting priority srcnat ; }\n\
             add rule inet t pr goto c\n\
             add rule inet t c ip saddr 10.1.2.3 ip daddr != 10.1.2.0/24 masquerade comment \"abc, net: x\"\n\
             add table bridge nat\n\
             add chain bridge nat PREROUTING { type filter hook prerouting priority -300 ; }\n\
             add chain bridge nat cni-br-iface-x-eth0\n\
             add rule bridge nat PREROUTING iifname \"veth0\" jump cni-br-iface-x-eth0 comment \"macspoofchk-x-eth0\"\n",
        )
        .unwrap();
        let all = nf.rules(NftFamily::Inet, "t", None).unwrap();
        assert_eq!(all.len(), 2);
        let c = nf.rules(NftFamily::Inet, "t", Some("c")).unwrap();
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].comment.as_deref(), Some("abc, net: x"));
        assert!(c[0].has_expr("masq"));
        assert!(c[0].cmp_data().any(|d| d == [10, 1, 2, 3]), "{:?}", c[0]);
        let pr = nf.rules(NftFamily::Inet, "t", Some("pr")).unwrap();
        assert_eq!(pr[0].verdicts().collect::<Vec<_>>(), vec![&Verdict::Goto("c".into())]);
        let mut chains = nf.chains(NftFamily::Inet, "t").unwrap();
        chains.sort();
        assert_eq!(chains, vec!["c", "pr"]);
        let info = nf.chain_info(NftFamily::Inet, "t").unwrap();
        let pr = info.iter().find(|c| c.name == "pr").unwrap();
        assert_eq!((pr.hook, pr.chain_type.as_deref(), pr.policy), (Some((4, 100)), Some("nat"), Some(1)));
        assert_eq!(info.iter().find(|c| c.name == "c").unwrap().hook, None);
        let br = nf.chain_info(NftFamily::Bridge, "nat").unwrap();
        assert_eq!(br.iter().find(|c| c.name == "PREROUTING").unwrap().hook, Some((0, -300)));
        let b = nf.rules(NftFamily::Bridge, "nat", Some("PREROUTING")).unwrap();
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].iifname().as_deref(), Some("veth0"));
        assert_eq!(b[0].comment.as_deref(), Some("macspoofchk-x-eth0"));
        // Delete by the handle we read, over netlink, in one transaction with the chain.
        let gone = NftDelete::Rule {
            family: NftFamily::Bridge,
            table: "nat".into(),
            chain: "PREROUTING".into(),
            handle: b[0].handle,
        };
        nf.delete(&[
            gone.clone(),
            NftDelete::Flush { family: NftFamily::Inet, table: "t".into(), chain: "c".into() },
        ])
        .unwrap();
        assert!(nf.rules(NftFamily::Bridge, "nat", Some("PREROUTING")).unwrap().is_empty());
        assert!(nf.rules(NftFamily::Inet, "t", Some("c")).unwrap().is_empty());
        // All or nothing: the rule is gone already, so nothing of this batch happens.
        let e = nf
            .delete(&[
                NftDelete::Chain {
                    family: NftFamily::Bridge,
                    table: "nat".into(),
                    chain: "cni-br-iface-x-eth0".into(),
                },
                gone,
            ])
            .unwrap_err();
        assert!(e.is_not_found(), "{e}");
        assert!(nf.chains(NftFamily::Bridge, "nat").unwrap().contains(&"cni-br-iface-x-eth0".to_string()));
        nf.delete(&[NftDelete::Chain {
            family: NftFamily::Bridge,
            table: "nat".into(),
            chain: "cni-br-iface-x-eth0".into(),
        }])
        .unwrap();
        assert_eq!(nf.chains(NftFamily::Bridge, "nat").unwrap(), vec!["PREROUTING"]);
        nf.delete(&[]).unwrap();
        assert!(nf.rules(NftFamily::Bridge, "nat", Some("no-such-chain")).unwrap().is_empty());
    }
}
