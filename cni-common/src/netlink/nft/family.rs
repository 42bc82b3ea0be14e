//! The nftables address families (`NFPROTO_*`).

/// An nftables address family (`NFPROTO_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NftFamily {
    Inet,
    Ip,
    Ip6,
    Bridge,
}

impl NftFamily {
    /// The family's `NFPROTO_*` number (the nfgenmsg family of every request).
    pub(crate) fn proto(self) -> u8 {
        match self {
            NftFamily::Inet => 1, // NFPROTO_INET
            NftFamily::Ip => crate::net::NFPROTO_IPV4,
            NftFamily::Bridge => 7, // NFPROTO_BRIDGE
            NftFamily::Ip6 => crate::net::NFPROTO_IPV6,
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
