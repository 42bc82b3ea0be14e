//! Reading nftables state over netlink (`NETLINK_NETFILTER`, nf_tables subsystem) without
//! executing `nft`: chains of a table and rules of a table or chain, each rule with its handle,
//! its comment and a light decoding of its expressions.
//!
//! Writes still go through `nft -f` (see [`crate::nft`]): one atomic transaction per verb. This
//! reader is what lets a plugin find the handles of the rules it must delete, or prove there is
//! nothing to delete, for the price of one netlink dump instead of one more `nft` process.

use netlink_packet_core::{NLM_F_DUMP, NLM_F_REQUEST};

use super::socket::NlSocket;
use super::NlError;

const NETLINK_NETFILTER: isize = 12;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_GETCHAIN: u16 = 4;
const NFT_MSG_NEWRULE: u16 = 6;
const NFT_MSG_GETRULE: u16 = 7;

const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_HANDLE: u16 = 3;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_RULE_USERDATA: u16 = 7;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_CMP_OP: u16 = 2;
const NFTA_CMP_DATA: u16 = 3;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;
const NFTA_META_KEY: u16 = 2;
const NFTA_IMMEDIATE_DATA: u16 = 2;
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
    fn proto(self) -> u8 {
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
fn nlas(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
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

fn attr(out: &mut Vec<u8>, kind: u16, value: &[u8]) {
    let len = 4 + value.len();
    out.extend_from_slice(&(len as u16).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(value);
    while !out.len().is_multiple_of(4) {
        out.push(0);
    }
}

fn cstr(s: &str) -> Vec<u8> {
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

fn string_of(v: &[u8]) -> String {
    let end = v.iter().position(|b| *b == 0).unwrap_or(v.len());
    String::from_utf8_lossy(&v[..end]).into_owned()
}

fn be32(v: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(v.get(..4)?.try_into().ok()?))
}

fn comment_of(udata: &[u8]) -> Option<String> {
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

fn verdict_of(data: &[u8]) -> Option<Verdict> {
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

fn chain_name_of(payload: &[u8], table: &str) -> Option<String> {
    let attrs = payload.get(4..)?;
    let (mut t, mut name) = (None, None);
    for (k, value) in nlas(attrs) {
        match k {
            NFTA_CHAIN_TABLE => t = Some(string_of(value)),
            NFTA_CHAIN_NAME => name = Some(string_of(value)),
            _ => {}
        }
    }
    (t.as_deref() == Some(table)).then_some(name).flatten()
}

/// A `NETLINK_NETFILTER` connection in the calling thread's network namespace.
pub struct NfTables {
    sock: NlSocket,
}

impl NfTables {
    pub fn new() -> Result<NfTables, NlError> {
        Ok(NfTables { sock: NlSocket::open_protocol(NETLINK_NETFILTER)? })
    }

    fn dump(&mut self, packet: Vec<u8>, what: &str) -> Result<Vec<super::socket::Reply>, NlError> {
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

    /// Names of the chains of `table` (empty when it does not exist).
    pub fn chains(&mut self, family: NftFamily, table: &str) -> Result<Vec<String>, NlError> {
        let what = format!("list nftables chains of {} {table}", family.keyword());
        let replies =
            self.dump(dump_request(NFT_MSG_GETCHAIN, family, &[(NFTA_CHAIN_TABLE, table)]), &what)?;
        Ok(replies
            .iter()
            .filter(|r| r.msg_type == (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWCHAIN)
            .filter_map(|r| chain_name_of(&r.payload, table))
            .collect())
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
        let b = nf.rules(NftFamily::Bridge, "nat", Some("PREROUTING")).unwrap();
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].iifname().as_deref(), Some("veth0"));
        assert_eq!(b[0].comment.as_deref(), Some("macspoofchk-x-eth0"));
        // Delete by the handle we read.
        nft.apply(&format!("delete rule bridge nat PREROUTING handle {}\n", b[0].handle)).unwrap();
        assert!(nf.rules(NftFamily::Bridge, "nat", Some("PREROUTING")).unwrap().is_empty());
        assert!(nf.rules(NftFamily::Bridge, "nat", Some("no-such-chain")).unwrap().is_empty());
    }
}
