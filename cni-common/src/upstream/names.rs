//! Upstream's names and comments, computed exactly as the Go plugins compute them
//! (docs/switching.md, "Upstream's state, exactly", lists each with its source file).

use crate::attachment::sha512_hex;

/// iptables chain names upstream derives from (network, container id) are this long.
const CHAIN_LEN: usize = 28;

/// `utils.MustFormatChainNameWithPrefix(name, id, prefix)` (pkg/utils/utils.go): `CNI-` +
/// `prefix` + the lowercase hex of sha512(`network` + `container_id`), cut to 28 characters.
pub fn chain_name(prefix: &str, network: &str, container_id: &str) -> String {
    let head = format!("CNI-{prefix}");
    let hex = sha512_hex(&format!("{network}{container_id}"), CHAIN_LEN - head.len());
    format!("{head}{hex}")
}

/// bridge's per-attachment masquerade chain (`utils.FormatChainName`).
pub fn masq_chain(network: &str, container_id: &str) -> String {
    chain_name("", network, container_id)
}

/// portmap's per-attachment DNAT chain (`CNI-DN-…`).
pub fn dnat_chain(network: &str, container_id: &str) -> String {
    chain_name("DN-", network, container_id)
}

/// portmap's per-attachment SNAT chain of versions before 0.7 (`CNI-SN-…`), still torn down by
/// upstream's DEL.
pub fn snat_chain(network: &str, container_id: &str) -> String {
    chain_name("SN-", network, container_id)
}

/// Whether `chain` has the shape of a masquerade chain (`CNI-` + 24 hex digits).
pub fn is_masq_chain(chain: &str) -> bool {
    chain.len() == CHAIN_LEN
        && chain.starts_with("CNI-")
        && chain[4..].bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Go's `%q` of an identifier. Network names and container ids are validated to
/// `[A-Za-z0-9][A-Za-z0-9_.-]*` before any plugin runs, so quoting is all `%q` does to them;
/// `"` and `\` are escaped anyway.
fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// `utils.FormatComment(name, id)`: the comment of bridge's masquerade rules,
/// `name: "<network>" id: "<container id>"`.
pub fn masq_comment(network: &str, container_id: &str) -> String {
    format!("name: {} id: {}", go_quote(network), go_quote(container_id))
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

/// (network, container id) of a comment made by [`masq_comment`], [`dnat_comment`] or
/// [`snat_comment`] (`kind` = "", "dnat " or "snat ").
pub fn parse_comment<'a>(kind: &str, comment: &'a str) -> Option<(&'a str, &'a str)> {
    let rest = comment.strip_prefix(kind)?.strip_prefix("name: \"")?;
    let (net, rest) = rest.split_once("\" id: \"")?;
    let id = rest.strip_suffix('"')?;
    (!net.contains('"') && !id.contains('"')).then_some((net, id))
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

/// Whether `name` has the shape of a bandwidth ifb (`bwp` + 12 hex digits).
pub fn is_ifb_name(name: &str) -> bool {
    name.len() == 15
        && name.starts_with("bwp")
        && name[3..].bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names upstream 1.1.1 gave a real attachment (network "swnet", container "ctrA"; captured
    /// with `iptables-save` and `ip link` after Debian's plugins ADDed it).
    #[test]
    fn names_match_upstream() {
        assert_eq!(masq_chain("swnet", "ctrA"), "CNI-6c848780a988c4f72c3ef534");
        assert_eq!(dnat_chain("swnet", "ctrA"), "CNI-DN-6c848780a988c4f72c3ef");
        assert_eq!(snat_chain("swnet", "ctrA"), "CNI-SN-6c848780a988c4f72c3ef");
        assert_eq!(
            crate::attachment::AttachmentId::new("swnet", "ctrA", "eth0").ifb_name(),
            "bwp6c848780a988"
        );
        assert!(is_masq_chain("CNI-6c848780a988c4f72c3ef534"));
        assert!(!is_masq_chain("CNI-DN-6c848780a988c4f72c3ef"));
        assert!(!is_masq_chain("CNI-HOSTPORT-SETMARK"));
        assert!(is_ifb_name("bwp6c848780a988"));
        assert!(!is_ifb_name("bwp6c848780a98g"));
    }

    #[test]
    fn comments() {
        assert_eq!(masq_comment("swnet", "ctrA"), r#"name: "swnet" id: "ctrA""#);
        assert_eq!(dnat_comment("swnet", "ctrA"), r#"dnat name: "swnet" id: "ctrA""#);
        assert_eq!(parse_comment("", r#"name: "swnet" id: "ctrA""#), Some(("swnet", "ctrA")));
        assert_eq!(parse_comment("dnat ", r#"dnat name: "n" id: "c""#), Some(("n", "c")));
        assert_eq!(parse_comment("snat ", r#"snat name: "n" id: "c""#), Some(("n", "c")));
        assert_eq!(parse_comment("", r#"dnat name: "n" id: "c""#), None);
        assert_eq!(parse_comment("", "CNI portfwd masquerade mark"), None);
        let long = dnat_comment(&"n".repeat(100), &"c".repeat(200));
        assert_eq!(long.len(), 256);
        assert!(long.ends_with("..."));
    }
}
