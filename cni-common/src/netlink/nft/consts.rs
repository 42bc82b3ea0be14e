//! The numbers of the nf_tables netlink protocol (`linux/netfilter/nf_tables.h`,
//! `linux/netfilter/nfnetlink.h`) and of nft's userdata (libnftnl `udata.h`), in one place.
//! The public ones are what plugins put into expressions, chains and verdicts.

// ---- subsystem and messages ----
pub(crate) const NFNL_SUBSYS_NFTABLES: u16 = 10;
pub(crate) const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
pub(crate) const NFNL_MSG_BATCH_END: u16 = 0x11;

pub(crate) const NFT_MSG_NEWTABLE: u16 = 0;
pub(crate) const NFT_MSG_GETTABLE: u16 = 1;
pub(crate) const NFT_MSG_DELTABLE: u16 = 2;
pub(crate) const NFT_MSG_NEWCHAIN: u16 = 3;
pub(crate) const NFT_MSG_GETCHAIN: u16 = 4;
pub(crate) const NFT_MSG_DELCHAIN: u16 = 5;
pub(crate) const NFT_MSG_NEWRULE: u16 = 6;
pub(crate) const NFT_MSG_GETRULE: u16 = 7;
pub(crate) const NFT_MSG_DELRULE: u16 = 8;
pub(crate) const NFT_MSG_NEWSET: u16 = 9;
pub(crate) const NFT_MSG_GETSET: u16 = 10;
pub(crate) const NFT_MSG_NEWSETELEM: u16 = 12;
pub(crate) const NFT_MSG_GETSETELEM: u16 = 13;
pub(crate) const NFT_MSG_DELSET: u16 = 11;
pub(crate) const NFT_MSG_DELSETELEM: u16 = 14;
pub(crate) const NFT_MSG_NEWGEN: u16 = 15;
pub(crate) const NFT_MSG_GETGEN: u16 = 16;

// ---- tables, chains, rules ----
pub(crate) const NFTA_TABLE_NAME: u16 = 1;
pub(crate) const NFTA_TABLE_FLAGS: u16 = 2;
pub(crate) const NFTA_TABLE_USERDATA: u16 = 6;

pub(crate) const NFTA_CHAIN_TABLE: u16 = 1;
pub(crate) const NFTA_CHAIN_NAME: u16 = 3;
pub(crate) const NFTA_CHAIN_HOOK: u16 = 4;
pub(crate) const NFTA_CHAIN_POLICY: u16 = 5;
pub(crate) const NFTA_CHAIN_TYPE: u16 = 7;
/// `NFTA_CHAIN_USE`: how many references (jumps, gotos, verdict map elements) lead to a chain.
pub(crate) const NFTA_CHAIN_USE: u16 = 6;
pub(crate) const NFTA_CHAIN_USERDATA: u16 = 12;
pub(crate) const NFTA_HOOK_HOOKNUM: u16 = 1;
pub(crate) const NFTA_HOOK_PRIORITY: u16 = 2;

pub(crate) const NFTA_RULE_TABLE: u16 = 1;
pub(crate) const NFTA_RULE_CHAIN: u16 = 2;
pub(crate) const NFTA_RULE_HANDLE: u16 = 3;
pub(crate) const NFTA_RULE_EXPRESSIONS: u16 = 4;
pub(crate) const NFTA_RULE_POSITION: u16 = 6;
pub(crate) const NFTA_RULE_USERDATA: u16 = 7;

pub(crate) const NFTA_GEN_ID: u16 = 1;

// ---- sets and elements ----
pub(crate) const NFTA_SET_TABLE: u16 = 1;
pub(crate) const NFTA_SET_NAME: u16 = 2;
pub(crate) const NFTA_SET_FLAGS: u16 = 3;
pub(crate) const NFTA_SET_KEY_TYPE: u16 = 4;
pub(crate) const NFTA_SET_KEY_LEN: u16 = 5;
pub(crate) const NFTA_SET_DATA_TYPE: u16 = 6;
pub(crate) const NFTA_SET_DATA_LEN: u16 = 7;
pub(crate) const NFTA_SET_DESC: u16 = 9;
pub(crate) const NFTA_SET_ID: u16 = 10;
pub(crate) const NFTA_SET_USERDATA: u16 = 13;
pub(crate) const NFTA_SET_DESC_CONCAT: u16 = 2;
pub(crate) const NFTA_SET_FIELD_LEN: u16 = 1;
pub(crate) const NFT_SET_INTERVAL: u32 = 0x4;
pub(crate) const NFT_SET_MAP: u32 = 0x8;
pub(crate) const NFT_SET_CONCAT: u32 = 0x80;
/// `NFT_DATA_VERDICT`: the data type of a verdict map.
pub(crate) const NFT_DATA_VERDICT: u32 = 0xffff_ff00;

pub(crate) const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
pub(crate) const NFTA_SET_ELEM_LIST_SET: u16 = 2;
pub(crate) const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
/// nft's process-local id of a set created in the same transaction.
#[cfg(any(test, feature = "nftgolden"))]
pub(crate) const NFTA_SET_ELEM_LIST_SET_ID: u16 = 4;
pub(crate) const NFTA_SET_ELEM_KEY: u16 = 1;
pub(crate) const NFTA_SET_ELEM_DATA: u16 = 2;
pub(crate) const NFTA_SET_ELEM_FLAGS: u16 = 3;
pub(crate) const NFTA_SET_ELEM_USERDATA: u16 = 6;
pub(crate) const NFTA_SET_ELEM_KEY_END: u16 = 10;
/// `NFT_SET_ELEM_INTERVAL_END`.
pub(crate) const NFT_SET_ELEM_INTERVAL_END: u32 = 1;

// ---- data and verdicts ----
pub(crate) const NFTA_LIST_ELEM: u16 = 1;
pub(crate) const NFTA_DATA_VALUE: u16 = 1;
pub(crate) const NFTA_DATA_VERDICT: u16 = 2;
pub(crate) const NFTA_VERDICT_CODE: u16 = 1;
pub(crate) const NFTA_VERDICT_CHAIN: u16 = 2;
pub(crate) const NF_DROP: i32 = 0;
pub(crate) const NF_ACCEPT: i32 = 1;
pub(crate) const NFT_CONTINUE: i32 = -1;
pub(crate) const NFT_JUMP: i32 = -3;
pub(crate) const NFT_GOTO: i32 = -4;
pub(crate) const NFT_RETURN: i32 = -5;

// ---- expressions ----
pub(crate) const NFTA_EXPR_NAME: u16 = 1;
pub(crate) const NFTA_EXPR_DATA: u16 = 2;
pub(crate) const NFTA_META_DREG: u16 = 1;
pub(crate) const NFTA_META_KEY: u16 = 2;
pub(crate) const NFTA_PAYLOAD_DREG: u16 = 1;
pub(crate) const NFTA_PAYLOAD_BASE: u16 = 2;
pub(crate) const NFTA_PAYLOAD_OFFSET: u16 = 3;
pub(crate) const NFTA_PAYLOAD_LEN: u16 = 4;
pub(crate) const NFTA_CMP_SREG: u16 = 1;
pub(crate) const NFTA_CMP_OP: u16 = 2;
pub(crate) const NFTA_CMP_DATA: u16 = 3;
pub(crate) const NFTA_BITWISE_SREG: u16 = 1;
pub(crate) const NFTA_BITWISE_DREG: u16 = 2;
pub(crate) const NFTA_BITWISE_LEN: u16 = 3;
pub(crate) const NFTA_BITWISE_MASK: u16 = 4;
pub(crate) const NFTA_BITWISE_XOR: u16 = 5;
pub(crate) const NFTA_FIB_DREG: u16 = 1;
pub(crate) const NFTA_FIB_RESULT: u16 = 2;
pub(crate) const NFTA_FIB_FLAGS: u16 = 3;
pub(crate) const NFTA_FIB_F_DADDR: u32 = 1 << 1;
pub(crate) const NFT_FIB_RESULT_ADDRTYPE: u32 = 3;
pub(crate) const NFTA_IMMEDIATE_DREG: u16 = 1;
pub(crate) const NFTA_IMMEDIATE_DATA: u16 = 2;
pub(crate) const NFTA_LOOKUP_SET: u16 = 1;
pub(crate) const NFTA_LOOKUP_SREG: u16 = 2;
pub(crate) const NFTA_LOOKUP_DREG: u16 = 3;
pub(crate) const NFTA_LOOKUP_SET_ID: u16 = 4;
pub(crate) const NFTA_NAT_TYPE: u16 = 1;
pub(crate) const NFTA_NAT_FAMILY: u16 = 2;
pub(crate) const NFTA_NAT_REG_ADDR_MIN: u16 = 3;
pub(crate) const NFTA_NAT_REG_PROTO_MIN: u16 = 5;
pub(crate) const NFT_NAT_DNAT: u32 = 1;
pub(crate) const NFTA_CT_DREG: u16 = 1;
pub(crate) const NFTA_CT_KEY: u16 = 2;
pub(crate) const NFTA_BYTEORDER_SREG: u16 = 1;
pub(crate) const NFTA_BYTEORDER_DREG: u16 = 2;
pub(crate) const NFTA_BYTEORDER_OP: u16 = 3;
pub(crate) const NFTA_BYTEORDER_LEN: u16 = 4;
pub(crate) const NFTA_BYTEORDER_SIZE: u16 = 5;
pub(crate) const NFT_BYTEORDER_HTON: u32 = 1;
/// `NFTA_MATCH_*`: an x_tables match run by nf_tables' compat layer (what iptables-nft writes).
pub(crate) const NFTA_MATCH_NAME: u16 = 1;
pub(crate) const NFTA_MATCH_REV: u16 = 2;
pub(crate) const NFTA_MATCH_INFO: u16 = 3;
/// `RTN_LOCAL`: the route type `fib … type local` compares with.
pub(crate) const RTN_LOCAL: u32 = 2;

/// `NFT_META_*` keys.
pub const META_IIFNAME: u32 = 6;
pub const META_OIFNAME: u32 = 7;
pub const META_IIFTYPE: u32 = 8;
pub const META_NFPROTO: u32 = 15;
pub const META_L4PROTO: u32 = 16;
/// `NFT_PAYLOAD_*` bases.
pub const PAYLOAD_LL_HEADER: u32 = 0;
pub const PAYLOAD_NETWORK_HEADER: u32 = 1;
pub const PAYLOAD_TRANSPORT_HEADER: u32 = 2;
/// `NFT_CT_STATE` and its bits: established and related (`NF_CT_STATE_BIT(IP_CT_ESTABLISHED)`,
/// `(IP_CT_RELATED)`), invalid (`NF_CT_STATE_INVALID_BIT`), untracked
/// (`NF_CT_STATE_UNTRACKED_BIT`).
pub const CT_STATE: u32 = 0;
pub const CT_STATE_ESTABLISHED_RELATED: u32 = 0x2 | 0x4;
pub const CT_STATE_INVALID_UNTRACKED: u32 = 0x1 | 0x40;
/// `NFT_CT_STATUS`, and the `IPS_DST_NAT` bit of the status.
pub const CT_STATUS: u32 = 2;
pub const CT_STATUS_DST_NAT: u32 = 0x20;
/// `ARPHRD_LOOPBACK`: the interface type `meta iiftype loopback` compares with.
pub const ARPHRD_LOOPBACK: u16 = 772;
/// The verdict register, and the 16-byte data registers nft uses for single values
/// (`NFT_REG_1`, `NFT_REG_2`, `NFT_REG_3`: each spans four 32-bit registers).
pub const REG_VERDICT: u32 = 0;
pub const REG_1: u32 = 1;
pub const REG_2: u32 = 2;
pub const REG_3: u32 = 3;
/// The first 32-bit register (`NFT_REG32_00`, the first quarter of `NFT_REG_1`): the
/// components of a concatenation go into consecutive 32-bit registers from here.
pub const REG32_00: u32 = 8;
/// `NF_INET_*` hooks (also `NF_BR_*` for the bridge family: prerouting 0, postrouting 4).
pub const HOOK_PREROUTING: u32 = 0;
pub const HOOK_INPUT: u32 = 1;
pub const HOOK_FORWARD: u32 = 2;
pub const HOOK_OUTPUT: u32 = 3;
pub const HOOK_POSTROUTING: u32 = 4;
/// Chain policies.
pub const POLICY_ACCEPT: u32 = 1;
pub const POLICY_DROP: u32 = 0;

// ---- nft's userdata (TLVs of one type byte and one length byte) ----
/// The comment TLV inside table, chain, rule and element userdata (`NFTNL_UDATA_*_COMMENT`).
pub(crate) const UDATA_COMMENT: u8 = 0;
/// nft refuses longer comments (`NFT_USERDATA_MAXLEN` is 256, nft's own limit 128).
pub const COMMENT_MAX: usize = 128;
pub(crate) const UDATA_SET_KEYBYTEORDER: u8 = 0;
pub(crate) const UDATA_SET_DATABYTEORDER: u8 = 1;
pub(crate) const UDATA_SET_KEY_TYPEOF: u8 = 3;
pub(crate) const UDATA_SET_DATA_TYPEOF: u8 = 4;
pub(crate) const UDATA_SET_DATA_INTERVAL: u8 = 6;
/// nft's `EXPR_CONCAT`, as recorded in a "typeof" userdata record.
pub(crate) const NFT_EXPR_CONCAT: u32 = 13;
