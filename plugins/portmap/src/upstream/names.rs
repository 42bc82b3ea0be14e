//! Upstream portmap's names and comments, computed exactly as the Go plugin computes them
//! (docs/switching.md, "Upstream's state, exactly", lists each with its source file).

use cni_common::upstream::names::chain_name;

/// portmap's per-attachment DNAT chain (`CNI-DN-…`).
pub fn dnat_chain(network: &str, container_id: &str) -> String {
    chain_name("DN-", network, container_id)
}

/// portmap's per-attachment SNAT chain of versions before 0.7 (`CNI-SN-…`), still torn down by
/// upstream's DEL.
pub fn snat_chain(network: &str, container_id: &str) -> String {
    chain_name("SN-", network, container_id)
}

/// iptables' comment limit as portmap applies it (`trimComment`, plugins/meta/portmap/utils.go).
fn trim_comment(s: String) -> String {
    if s.len() <= 255 {
        return s;
    }
    let mut cut = 253;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}...", &s[..cut])
}

/// The comment of portmap's entry rules in `CNI-HOSTPORT-DNAT`:
/// `dnat name: "<network>" id: "<container id>"` (not `%q`: plain quotes).
pub fn dnat_comment(network: &str, container_id: &str) -> String {
    trim_comment(format!("dnat name: \"{network}\" id: \"{container_id}\""))
}

/// The comment of the pre-0.7 entry rules in `CNI-HOSTPORT-SNAT`.
pub fn snat_comment(network: &str, container_id: &str) -> String {
    format!("snat name: \"{network}\" id: \"{container_id}\"")
}

/// The shared chains of portmap's iptables form (plugins/meta/portmap/portmap.go).
pub const HOSTPORT_DNAT: &str = "CNI-HOSTPORT-DNAT";
pub const HOSTPORT_SETMARK: &str = "CNI-HOSTPORT-SETMARK";
pub const HOSTPORT_MASQ: &str = "CNI-HOSTPORT-MASQ";
/// The top-level SNAT chain of versions before 0.7.
pub const HOSTPORT_SNAT: &str = "CNI-HOSTPORT-SNAT";
/// Comment of the SETMARK rule and of the POSTROUTING jump to `CNI-HOSTPORT-MASQ`.
pub const SETMARK_COMMENT: &str = "CNI portfwd masquerade mark";
pub const MASQ_JUMP_COMMENT: &str = "CNI portfwd requiring masquerade";
/// portmap's default mark bit (`DefaultMarkBit`).
pub const DEFAULT_MARK_BIT: u32 = 13;

/// Upstream's nftables backend of portmap (v1.6+, portmap_nftables.go): table `cni_hostport`
/// in families `ip` and `ip6`, rules commented with the bare container id in these chains.
pub const NFT_HOSTPORT_TABLE: &str = "cni_hostport";
pub const NFT_HOSTPORT_RULE_CHAINS: [&str; 3] = ["hostports", "hostip_hostports", "masquerading"];

#[cfg(test)]
mod tests {
    use super::*;

    /// Names upstream 1.1.1 gave a real attachment (network "swnet", container "ctrA"; captured
    /// with `iptables-save` after Debian's plugins ADDed it).
    #[test]
    fn names_match_upstream() {
        assert_eq!(dnat_chain("swnet", "ctrA"), "CNI-DN-6c848780a988c4f72c3ef");
        assert_eq!(snat_chain("swnet", "ctrA"), "CNI-SN-6c848780a988c4f72c3ef");
    }

    #[test]
    fn comments() {
        assert_eq!(dnat_comment("swnet", "ctrA"), r#"dnat name: "swnet" id: "ctrA""#);
        assert_eq!(snat_comment("swnet", "ctrA"), r#"snat name: "swnet" id: "ctrA""#);
        let long = dnat_comment(&"n".repeat(100), &"c".repeat(200));
        assert_eq!(long.len(), 256);
        assert!(long.ends_with("..."));
    }
}
