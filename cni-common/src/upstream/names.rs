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

/// The per-attachment masquerade chain (`utils.FormatChainName`).
pub fn masq_chain(network: &str, container_id: &str) -> String {
    chain_name("", network, container_id)
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

/// `utils.FormatComment(name, id)`: the comment of the masquerade rules,
/// `name: "<network>" id: "<container id>"`.
pub fn masq_comment(network: &str, container_id: &str) -> String {
    format!("name: {} id: {}", go_quote(network), go_quote(container_id))
}

/// (network, container id) of a comment `<kind>name: "<network>" id: "<container id>"` (the
/// form of [`masq_comment`], and with `kind` "dnat " or "snat " of upstream's host-port entry rules).
pub fn parse_comment<'a>(kind: &str, comment: &'a str) -> Option<(&'a str, &'a str)> {
    let rest = comment.strip_prefix(kind)?.strip_prefix("name: \"")?;
    let (net, rest) = rest.split_once("\" id: \"")?;
    let id = rest.strip_suffix('"')?;
    (!net.contains('"') && !id.contains('"')).then_some((net, id))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names upstream 1.1.1 gave a real attachment (network "swnet", container "ctrA"; captured
    /// with `iptables-save` and `ip link` after Debian's plugins ADDed it).
    #[test]
    fn names_match_upstream() {
        assert_eq!(masq_chain("swnet", "ctrA"), "CNI-6c848780a988c4f72c3ef534");
        assert!(is_masq_chain("CNI-6c848780a988c4f72c3ef534"));
        assert!(!is_masq_chain("CNI-DN-6c848780a988c4f72c3ef"));
        assert!(!is_masq_chain("CNI-HOSTPORT-SETMARK"));
    }

    #[test]
    fn comments() {
        assert_eq!(masq_comment("swnet", "ctrA"), r#"name: "swnet" id: "ctrA""#);
        assert_eq!(parse_comment("", r#"name: "swnet" id: "ctrA""#), Some(("swnet", "ctrA")));
        assert_eq!(parse_comment("dnat ", r#"dnat name: "n" id: "c""#), Some(("n", "c")));
        assert_eq!(parse_comment("snat ", r#"snat name: "n" id: "c""#), Some(("n", "c")));
        assert_eq!(parse_comment("", r#"dnat name: "n" id: "c""#), None);
        assert_eq!(parse_comment("", "CNI portfwd masquerade mark"), None);
    }
}
