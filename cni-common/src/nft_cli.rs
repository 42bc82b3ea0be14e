//! The `nft` command-line tool, run as a child process: for the one input that is nft syntax
//! (conditions a user writes into a plugin's configuration), whose table the plugin then builds with
//! `nft -f -` (the whole script is one transaction: committed or nothing). Everything else
//! goes over netlink ([`crate::netlink::nft`]).
//!
//! Scripts are written in nft's own syntax. Everything we interpolate is either a number,
//! an address we formatted, or text passed through [`quote`], which only lets through a
//! conservative character set, so a hostile ifname or network name cannot inject syntax.

use crate::child::{self, Use};
use crate::error::{code, CniError, Result};
#[cfg(test)]
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A located `nft` binary.
#[derive(Debug, Clone)]
pub struct Nft {
    program: PathBuf,
}

const CANDIDATES: [&str; 4] = ["/usr/sbin/nft", "/sbin/nft", "/usr/bin/nft", "/bin/nft"];

impl Nft {
    /// Find `nft`: `CNI_NFT` (ours, for unusual installs), the usual sbin locations, then PATH.
    /// A runtime may exec plugins with a minimal PATH, so the fixed locations come first.
    pub fn find() -> Result<Nft> {
        if let Some(p) = std::env::var_os("CNI_NFT").filter(|p| !p.is_empty()) {
            let program = PathBuf::from(p);
            if !program.is_file() {
                return Err(CniError::new(
                    code::NOT_AVAILABLE,
                    format!("nft binary {} (from CNI_NFT) not found", program.display()),
                ));
            }
            return Ok(Nft { program });
        }
        for c in CANDIDATES {
            if Path::new(c).is_file() {
                return Ok(Nft { program: c.into() });
            }
        }
        if let Some(path) = std::env::var_os("PATH") {
            for dir in std::env::split_paths(&path) {
                let p = dir.join("nft");
                if p.is_file() {
                    return Ok(Nft { program: p });
                }
            }
        }
        Err(CniError::new(
            code::NOT_AVAILABLE,
            "nft binary not found (install the nftables package, or set CNI_NFT to its path)",
        ))
    }

    #[cfg(test)]
    pub(crate) fn program(&self) -> &Path {
        &self.program
    }

    /// Run `nft args` under the deadline of [`Use::Nft`] ([`crate::child`]).
    fn run(&self, args: &[&str], stdin: Option<&str>) -> Result<child::Output> {
        child::run(Command::new(&self.program).args(args), stdin.map(str::as_bytes), Use::Nft)
    }

    /// Apply `script` as one transaction.
    pub fn apply(&self, script: &str) -> Result<()> {
        let out = self.run(&["-f", "-"], Some(script))?;
        if out.status.success() {
            return Ok(());
        }
        Err(CniError::internal(format!(
            "nft transaction failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
        .with_details(script.to_string()))
    }

    /// Dry-run `script` (`nft -c -f -`): the kernel validates the whole transaction and
    /// nothing is committed.
    pub fn check(&self, script: &str) -> Result<()> {
        let out = self.run(&["-c", "-f", "-"], Some(script))?;
        if out.status.success() {
            return Ok(());
        }
        Err(CniError::internal(format!("nft check failed: {}", String::from_utf8_lossy(&out.stderr).trim())))
    }

    /// `nft -j list table <family> <name>`: the list of objects, or None when the table does
    /// not exist.
    #[cfg(test)]
    pub(crate) fn list_table(&self, family: &str, table: &str) -> Result<Option<Vec<Value>>> {
        let out = self.run(&["-j", "list", "table", family, table], None)?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            if err.contains("No such file or directory") || err.contains("does not exist") {
                return Ok(None);
            }
            return Err(CniError::internal(format!("nft list table {family} {table}: {}", err.trim())));
        }
        parse_list(&out.stdout).map(Some)
    }
}

/// The `nftables` array of a `nft -j` document.
#[cfg(test)]
fn parse_list(bytes: &[u8]) -> Result<Vec<Value>> {
    let v: Value =
        serde_json::from_slice(bytes).map_err(|e| CniError::internal(format!("nft -j output: {e}")))?;
    match v.get("nftables") {
        Some(Value::Array(a)) => Ok(a.clone()),
        _ => Err(CniError::internal("nft -j output has no \"nftables\" array")),
    }
}

/// A double-quoted nft string. Characters outside `[A-Za-z0-9_.:/@,=+-]` and space are
/// replaced by `%XX`, so the result can never close the quote or start a new statement.
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"_.:/@,=+- ".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quote_neutralises_syntax() {
        assert_eq!(quote("net: kubenet, id: abc-1"), "\"net: kubenet, id: abc-1\"");
        assert_eq!(quote("a\"; flush ruleset"), "\"a%22%3B flush ruleset\"");
        assert_eq!(quote("x{}\n#"), "\"x%7B%7D%0A%23\"");
    }

    #[test]
    fn listing_helpers() {
        let doc = br#"{"nftables":[{"metainfo":{"version":"1.0.6"}},
            {"table":{"family":"inet","name":"t","handle":1}},
            {"chain":{"family":"inet","table":"t","name":"c","handle":1}},
            {"rule":{"family":"inet","table":"t","chain":"c","handle":2,"comment":"x","expr":[]}},
            {"rule":{"family":"inet","table":"t","chain":"d","handle":3,"expr":[]}}]}"#;
        let list = parse_list(doc).unwrap();
        assert_eq!(list.len(), 5);
        assert_eq!(list[2]["chain"]["name"], "c");
        assert!(parse_list(b"{}").is_err());
    }
}
