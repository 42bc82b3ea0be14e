//! The `iptables` tool, as far as upstream's state needs it: which backend holds a table, the
//! `*-save` text of the `nat` table parsed into rules, and `*-restore --noflush` scripts.
//!
//! Only used once upstream-made state was found (see [`super::detect`]); a node without such
//! state never executes any of this.

use crate::child::{self, Use};
use crate::{CniError, Result};
use ipnet::IpNet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Which kernel interface an `iptables` binary drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// `iptables-nft`: nf_tables tables `ip nat` / `ip6 nat` with xt compat expressions.
    Nft,
    /// `iptables-legacy`: x_tables (`/proc/net/ip_tables_names`).
    Legacy,
}

/// IPv4 (`iptables`) or IPv6 (`ip6tables`): the address family every layer shares.
pub use crate::net::Family as Fam;

/// `iptables` or `ip6tables`.
fn cmd(fam: Fam) -> &'static str {
    match fam {
        Fam::V4 => "iptables",
        Fam::V6 => "ip6tables",
    }
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Nft => "nft",
            Backend::Legacy => "legacy",
        }
    }

    /// `iptables-nft-save`, `ip6tables-legacy-restore`, …
    pub fn tool(self, fam: Fam, what: &str) -> String {
        match what {
            "" => format!("{}-{}", cmd(fam), self.name()),
            w => format!("{}-{}-{w}", cmd(fam), self.name()),
        }
    }
}

/// Where to look for the tools: the process's PATH (runtimes often pass a short one), then
/// the usual system directories.
pub fn find_tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs = std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/local/sbin", "/usr/bin", "/bin"].iter().map(PathBuf::from));
    for d in dirs {
        let p = d.join(name);
        if is_executable(&p) {
            return Some(p);
        }
    }
    None
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn require_tool(name: &str, why: &str) -> Result<PathBuf> {
    find_tool(name).ok_or_else(|| {
        CniError::internal(format!(
            "{why}, but {name} is not installed (searched PATH, /usr/sbin, /sbin, /usr/local/sbin): \
             install the iptables package"
        ))
    })
}

/// An address match (`[!] -s/-d net`), normalised (`10.1.1.5/24` is `10.1.1.0/24`, a bare
/// address a full-length prefix).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddrMatch {
    pub negated: bool,
    pub net: IpNet,
}

fn parse_net(s: &str) -> Option<IpNet> {
    if let Ok(n) = s.parse::<IpNet>() {
        return Some(n.trunc());
    }
    s.parse::<IpAddr>().ok().map(IpNet::from)
}

/// One rule, as `-A CHAIN …` in `*-save` output or as the arguments upstream passes to
/// `iptables`, decoded as far as upstream's rules need. Comparing two of them compares
/// meaning, not spelling (`-m tcp` that iptables adds, `--dports` vs `--destination-ports`,
/// `127.0.0.1` vs `127.0.0.1/32`, option order).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rule {
    pub src: Option<AddrMatch>,
    pub dst: Option<AddrMatch>,
    pub proto: Option<String>,
    pub dport: Option<String>,
    pub dports: Option<String>,
    pub comment: Option<String>,
    pub target: Option<String>,
    pub to_destination: Option<String>,
    pub mark: Option<String>,
    pub set_xmark: Option<String>,
    pub dst_type: Option<String>,
    /// Everything else (user `conditionsV4/V6`), in order, `-m <name>` left out.
    pub other: Vec<String>,
}

impl Rule {
    /// Decode an argument list (unknown options are kept in `other`).
    pub fn parse(args: &[String]) -> Rule {
        let mut r = Rule::default();
        let mut neg = false;
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut value = || it.next().cloned().unwrap_or_default();
            match a.as_str() {
                "!" => {
                    neg = true;
                    continue;
                }
                "-s" | "--source" | "-d" | "--destination" => {
                    let v = value();
                    match parse_net(&v) {
                        // `-s 0.0.0.0/0` matches everything: iptables-save leaves it out.
                        Some(net) if net.prefix_len() == 0 && !neg => {}
                        Some(net) => {
                            let m = AddrMatch { negated: neg, net };
                            if a.starts_with("-s") || a == "--source" {
                                r.src = Some(m);
                            } else {
                                r.dst = Some(m);
                            }
                        }
                        None => {
                            if neg {
                                r.other.push("!".into());
                            }
                            r.other.extend([a.clone(), v]);
                        }
                    }
                }
                "-p" | "--protocol" if !neg => r.proto = Some(value().to_ascii_lowercase()),
                "-m" | "--match" => {
                    value();
                }
                "--dport" | "--destination-port" if !neg => r.dport = Some(value()),
                "--dports" | "--destination-ports" if !neg => r.dports = Some(value()),
                "--comment" => r.comment = Some(value()),
                "-j" | "--jump" => r.target = Some(value()),
                "--to-destination" => r.to_destination = Some(value()),
                "--mark" if !neg => r.mark = Some(value().to_ascii_lowercase()),
                "--set-xmark" => r.set_xmark = Some(value().to_ascii_lowercase()),
                "--dst-type" if !neg => r.dst_type = Some(value().to_ascii_uppercase()),
                other => {
                    if neg {
                        r.other.push("!".into());
                    }
                    r.other.push(other.to_string());
                }
            }
            neg = false;
        }
        r
    }

    /// The destination port this rule DNATs or marks (`--dport`).
    pub fn dport_num(&self) -> Option<u16> {
        self.dport.as_deref()?.parse().ok()
    }
}

/// Split one line of `*-save` output (or a restore line) into words: blanks separate, double
/// quotes group, a backslash escapes the next character inside quotes (how iptables-save
/// writes comments).
pub fn split_words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut quoted = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' if quoted => {
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            }
            '"' => {
                quoted = !quoted;
                in_word = true;
            }
            c if c.is_whitespace() && !quoted => {
                if in_word {
                    out.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            c => {
                cur.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        out.push(cur);
    }
    out
}

/// One word for a restore script, quoted when needed. A word with a control character is
/// refused: `*-restore` reads its input line by line, so a line break inside a word (quoted or
/// not) would end the command there and run the rest of the word as a command of its own, and
/// no quoting or escape of `*-restore` carries one.
pub fn quote_word(w: &str) -> Result<String> {
    if w.chars().any(char::is_control) {
        return Err(CniError::internal(format!(
            "refusing to write {w:?} into an iptables-restore script: it holds a control character (a line break would start a new command)"
        )));
    }
    if !w.is_empty() && !w.chars().any(|c| c.is_whitespace() || c == '"' || c == '\\' || c == '\'') {
        return Ok(w.to_string());
    }
    let mut s = String::from("\"");
    for c in w.chars() {
        if c == '"' || c == '\\' {
            s.push('\\');
        }
        s.push(c);
    }
    s.push('"');
    Ok(s)
}

/// A rule found in a table: its chain, decoded form and the words after `-A CHAIN` (what a
/// restore script's `-D CHAIN …` repeats).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedRule {
    pub chain: String,
    pub rule: Rule,
    pub words: Vec<String>,
}

/// The `nat` table of one backend and family, as `*-save -t nat` printed it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Table {
    pub chains: Vec<String>,
    pub rules: Vec<SavedRule>,
}

impl Table {
    pub fn parse(text: &str) -> Table {
        let mut t = Table::default();
        let mut in_nat = false;
        for line in text.lines() {
            let line = line.trim();
            if let Some(name) = line.strip_prefix('*') {
                in_nat = name == "nat";
                continue;
            }
            if !in_nat {
                continue;
            }
            if let Some(decl) = line.strip_prefix(':') {
                if let Some(name) = decl.split_whitespace().next() {
                    t.chains.push(name.to_string());
                }
            } else if line.starts_with("-A ") {
                let mut words = split_words(line);
                if words.len() < 2 {
                    continue;
                }
                let chain = words[1].clone();
                words.drain(..2);
                t.rules.push(SavedRule { chain, rule: Rule::parse(&words), words });
            }
        }
        t
    }

    pub fn has_chain(&self, chain: &str) -> bool {
        self.chains.iter().any(|c| c == chain)
    }

    pub fn rules_in<'a>(&'a self, chain: &'a str) -> impl Iterator<Item = &'a SavedRule> + 'a {
        self.rules.iter().filter(move |r| r.chain == chain)
    }

    /// Rules of `chain` that jump to `target`.
    pub fn jumps<'a>(&'a self, chain: &'a str, target: &'a str) -> impl Iterator<Item = &'a SavedRule> + 'a {
        self.rules_in(chain).filter(move |r| r.rule.target.as_deref() == Some(target))
    }

    /// Whether any rule, in any chain, jumps to `target`.
    pub fn referenced(&self, target: &str) -> bool {
        self.rules.iter().any(|r| r.rule.target.as_deref() == Some(target))
    }

    /// Whether `chain` holds a rule meaning `want`.
    pub fn contains(&self, chain: &str, want: &Rule) -> bool {
        self.rules_in(chain).any(|r| r.rule == *want)
    }
}

/// `*-save -t nat` of `backend`/`fam`.
pub fn save(backend: Backend, fam: Fam) -> Result<Table> {
    let name = backend.tool(fam, "save");
    let tool = require_tool(&name, "reading upstream's iptables rules")?;
    let out = child::run(Command::new(&tool).args(["-t", "nat"]), None, Use::Iptables)?;
    if !out.status.success() {
        return Err(CniError::internal(format!(
            "{name} -t nat failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(Table::parse(&String::from_utf8_lossy(&out.stdout)))
}

/// A `*-restore --noflush` script for the `nat` table. Chains are never declared with
/// `:CHAIN` lines (with `--noflush` that flushes an existing chain): `-N` only for chains known
/// to be missing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Script {
    lines: Vec<String>,
    /// Why words or lines were refused ([`quote_word`]); [`restore`] then runs nothing.
    refused: Vec<String>,
}

fn render(words: &[String]) -> Result<String> {
    Ok(words.iter().map(|w| quote_word(w)).collect::<Result<Vec<_>>>()?.join(" "))
}

/// A chain name as a script line may carry it: no whitespace, quotes or control characters.
fn chain_word(chain: &str) -> Result<&str> {
    if chain.is_empty() || chain.chars().any(|c| c.is_whitespace() || c.is_control() || c == '"' || c == '\'')
    {
        return Err(CniError::internal(format!(
            "refusing chain name {chain:?} in an iptables-restore script"
        )));
    }
    Ok(chain)
}

impl Script {
    pub fn is_empty(&self) -> bool {
        self.lines.is_empty() && self.refused.is_empty()
    }

    /// The command lines, without the table header and COMMIT.
    pub fn lines(&self) -> impl Iterator<Item = &str> {
        self.lines.iter().map(String::as_str)
    }

    fn add(&mut self, line: Result<String>) {
        match line {
            Ok(l) => self.lines.push(l),
            Err(e) => self.refused.push(e.msg),
        }
    }

    /// Add a line made by [`Script::lines`] of another script.
    pub fn push(&mut self, line: &str) {
        self.add(if line.chars().any(char::is_control) {
            Err(CniError::internal(format!("refusing line {line:?} in an iptables-restore script")))
        } else {
            Ok(line.to_string())
        });
    }

    pub fn new_chain(&mut self, chain: &str) {
        self.add(chain_word(chain).map(|c| format!("-N {c}")));
    }

    pub fn append(&mut self, chain: &str, args: &[String]) {
        self.add(chain_word(chain).and_then(|c| Ok(format!("-A {c} {}", render(args)?))));
    }

    /// Insert at the top of `chain`.
    pub fn insert_first(&mut self, chain: &str, args: &[String]) {
        self.add(chain_word(chain).and_then(|c| Ok(format!("-I {c} 1 {}", render(args)?))));
    }

    /// Delete a rule read from the table.
    pub fn delete(&mut self, r: &SavedRule) {
        self.add(chain_word(&r.chain).and_then(|c| Ok(format!("-D {c} {}", render(&r.words)?))));
    }

    pub fn flush(&mut self, chain: &str) {
        self.add(chain_word(chain).map(|c| format!("-F {c}")));
    }

    pub fn delete_chain(&mut self, chain: &str) {
        self.add(chain_word(chain).map(|c| format!("-X {c}")));
    }

    /// Why lines were left out (each a message naming the word), empty when none were.
    pub fn refused(&self) -> &[String] {
        &self.refused
    }

    pub fn text(&self) -> String {
        let mut s = String::from("*nat\n");
        for l in &self.lines {
            s.push_str(l);
            s.push('\n');
        }
        s.push_str("COMMIT\n");
        s
    }
}

/// Apply `script` with `*-restore --noflush --wait` of `backend`/`fam`: one transaction (nft)
/// or one table replacement (legacy, under the xtables lock).
pub fn restore(backend: Backend, fam: Fam, script: &Script) -> Result<()> {
    if !script.refused.is_empty() {
        return Err(CniError::internal(format!("iptables-restore not run: {}", script.refused.join("; ")))
            .with_details(script.text()));
    }
    if script.is_empty() {
        return Ok(());
    }
    let name = backend.tool(fam, "restore");
    let tool = require_tool(&name, "changing upstream's iptables rules")?;
    let text = script.text();
    let out =
        child::run(Command::new(&tool).args(["--noflush", "--wait"]), Some(text.as_bytes()), Use::Iptables)?;
    if !out.status.success() {
        return Err(CniError::internal(format!(
            "{name} --noflush failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
        .with_details(text));
    }
    Ok(())
}

/// The backend the node's `iptables` command uses (what upstream's plugins will exec), from
/// `iptables -V` (`iptables v1.8.9 (nf_tables)` or `(legacy)`); None when there is no
/// `iptables`.
pub fn default_backend() -> Result<Option<Backend>> {
    let Some(tool) = find_tool("iptables") else { return Ok(None) };
    let out = child::run(Command::new(&tool).arg("-V"), None, Use::Iptables)?;
    let v = String::from_utf8_lossy(&out.stdout);
    Ok(Some(if v.contains("nf_tables") { Backend::Nft } else { Backend::Legacy }))
}

/// Table `name` of a `*-save` text (what [`Table::parse`] does for `nat`), for upstream forms
/// that live in another table (`filter`).
pub fn parse_table(text: &str, name: &str) -> Table {
    let mut t = Table::default();
    let mut inside = false;
    for line in text.lines() {
        let line = line.trim();
        if let Some(n) = line.strip_prefix('*') {
            inside = n == name;
            continue;
        }
        if !inside {
            continue;
        }
        if let Some(decl) = line.strip_prefix(':') {
            if let Some(c) = decl.split_whitespace().next() {
                t.chains.push(c.to_string());
            }
        } else if line.starts_with("-A ") {
            let mut words = split_words(line);
            if words.len() < 2 {
                continue;
            }
            let chain = words[1].clone();
            words.drain(..2);
            t.rules.push(SavedRule { chain, rule: Rule::parse(&words), words });
        }
    }
    t
}

/// `*-save -t <table>` of `backend`/`fam`.
pub fn save_table(backend: Backend, fam: Fam, table: &str) -> Result<Table> {
    let name = backend.tool(fam, "save");
    let tool = require_tool(&name, "reading iptables rules")?;
    let out = child::run(Command::new(&tool).args(["-t", table]), None, Use::Iptables)?;
    if !out.status.success() {
        return Err(CniError::internal(format!(
            "{name} -t {table} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(parse_table(&String::from_utf8_lossy(&out.stdout), table))
}

/// [`restore`] of `script` into table `table` instead of `nat`.
pub fn restore_table(backend: Backend, fam: Fam, table: &str, script: &Script) -> Result<()> {
    if !script.refused().is_empty() {
        return Err(CniError::internal(format!("iptables-restore not run: {}", script.refused().join("; "))));
    }
    if script.is_empty() {
        return Ok(());
    }
    let name = backend.tool(fam, "restore");
    let tool = require_tool(&name, "changing iptables rules")?;
    let mut text = format!("*{table}\n");
    for l in script.lines() {
        text.push_str(l);
        text.push('\n');
    }
    text.push_str("COMMIT\n");
    let out =
        child::run(Command::new(&tool).args(["--noflush", "--wait"]), Some(text.as_bytes()), Use::Iptables)?;
    if !out.status.success() {
        return Err(CniError::internal(format!(
            "{name} --noflush failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
        .with_details(text));
    }
    Ok(())
}

/// Words of an argument list given as string slices.
pub fn words(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// `iptables-save -t nat` after upstream 1.1.1 ADDed an attachment with masquerading and two
/// host port mappings, for container "ctrA" of network "swnet" (captured on Debian 12, iptables-nft
/// 1.8.9).
#[cfg(any(test, feature = "upstreamfixtures"))]
pub const SAVED_FOR_TESTS: &str = r#"# Generated by iptables-save v1.8.9 (nf_tables) on Mon Nov 23 18:03:47 2026
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:CNI-6c848780a988c4f72c3ef534 - [0:0]
:CNI-DN-6c848780a988c4f72c3ef - [0:0]
:CNI-HOSTPORT-DNAT - [0:0]
:CNI-HOSTPORT-MASQ - [0:0]
:CNI-HOSTPORT-SETMARK - [0:0]
-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
-A OUTPUT -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
-A POSTROUTING -m comment --comment "CNI portfwd requiring masquerade" -j CNI-HOSTPORT-MASQ
-A POSTROUTING -s 10.77.0.2/32 -m comment --comment "name: \"swnet\" id: \"ctrA\"" -j CNI-6c848780a988c4f72c3ef534
-A CNI-6c848780a988c4f72c3ef534 -d 10.77.0.0/24 -m comment --comment "name: \"swnet\" id: \"ctrA\"" -j ACCEPT
-A CNI-6c848780a988c4f72c3ef534 ! -d 224.0.0.0/4 -m comment --comment "name: \"swnet\" id: \"ctrA\"" -j MASQUERADE
-A CNI-DN-6c848780a988c4f72c3ef -s 10.77.0.0/24 -p tcp -m tcp --dport 18080 -j CNI-HOSTPORT-SETMARK
-A CNI-DN-6c848780a988c4f72c3ef -s 127.0.0.1/32 -p tcp -m tcp --dport 18080 -j CNI-HOSTPORT-SETMARK
-A CNI-DN-6c848780a988c4f72c3ef -p tcp -m tcp --dport 18080 -j DNAT --to-destination 10.77.0.2:80
-A CNI-DN-6c848780a988c4f72c3ef -s 10.77.0.0/24 -p udp -m udp --dport 18081 -j CNI-HOSTPORT-SETMARK
-A CNI-DN-6c848780a988c4f72c3ef -s 127.0.0.1/32 -p udp -m udp --dport 18081 -j CNI-HOSTPORT-SETMARK
-A CNI-DN-6c848780a988c4f72c3ef -p udp -m udp --dport 18081 -j DNAT --to-destination 10.77.0.2:81
-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"swnet\" id: \"ctrA\"" -m multiport --dports 18080 -j CNI-DN-6c848780a988c4f72c3ef
-A CNI-HOSTPORT-DNAT -p udp -m comment --comment "dnat name: \"swnet\" id: \"ctrA\"" -m multiport --dports 18081 -j CNI-DN-6c848780a988c4f72c3ef
-A CNI-HOSTPORT-MASQ -m mark --mark 0x2000/0x2000 -j MASQUERADE
-A CNI-HOSTPORT-SETMARK -m comment --comment "CNI portfwd masquerade mark" -j MARK --set-xmark 0x2000/0x2000
COMMIT
# Completed on Mon Nov 23 18:03:47 2026
"#;

#[cfg(test)]
mod tests {
    use super::*;

    fn w(s: &str) -> Vec<String> {
        split_words(s)
    }

    #[test]
    fn parses_save_output() {
        let t = Table::parse(SAVED_FOR_TESTS);
        assert_eq!(t.chains.len(), 9);
        assert!(t.has_chain("CNI-HOSTPORT-DNAT"));
        assert_eq!(t.rules.len(), 16);
        let post: Vec<&SavedRule> = t.jumps("POSTROUTING", "CNI-6c848780a988c4f72c3ef534").collect();
        assert_eq!(post.len(), 1);
        assert_eq!(post[0].rule.comment.as_deref(), Some(r#"name: "swnet" id: "ctrA""#));
        assert_eq!(
            post[0].rule.src,
            Some(AddrMatch { negated: false, net: "10.77.0.2/32".parse().unwrap() })
        );
        let masq: Vec<&SavedRule> = t.rules_in("CNI-6c848780a988c4f72c3ef534").collect();
        assert_eq!(masq[1].rule.dst, Some(AddrMatch { negated: true, net: "224.0.0.0/4".parse().unwrap() }));
        assert_eq!(masq[1].rule.target.as_deref(), Some("MASQUERADE"));
        assert!(t.referenced("CNI-HOSTPORT-SETMARK"));
        assert!(!t.referenced("CNI-SN-x"));
    }

    #[test]
    fn upstream_arguments_match_saved_rules() {
        let t = Table::parse(SAVED_FOR_TESTS);
        // What upstream passes to `iptables -C` (its chain helpers), with its spellings.
        let hairpin = Rule::parse(&w("-p tcp --dport 18080 -s 10.77.0.2/24 -j CNI-HOSTPORT-SETMARK"));
        assert!(t.contains("CNI-DN-6c848780a988c4f72c3ef", &hairpin));
        let local = Rule::parse(&w("-p tcp --dport 18080 -s 127.0.0.1 -j CNI-HOSTPORT-SETMARK"));
        assert!(t.contains("CNI-DN-6c848780a988c4f72c3ef", &local));
        let dnat = Rule::parse(&w("-p udp --dport 18081 -j DNAT --to-destination 10.77.0.2:81"));
        assert!(t.contains("CNI-DN-6c848780a988c4f72c3ef", &dnat));
        let wrong = Rule::parse(&w("-p udp --dport 18081 -j DNAT --to-destination 10.77.0.3:81"));
        assert!(!t.contains("CNI-DN-6c848780a988c4f72c3ef", &wrong));
        let entry = Rule::parse(&words(&[
            "-m",
            "comment",
            "--comment",
            r#"dnat name: "swnet" id: "ctrA""#,
            "-m",
            "multiport",
            "-p",
            "tcp",
            "--destination-ports",
            "18080",
            "-j",
            "CNI-DN-6c848780a988c4f72c3ef",
        ]));
        assert!(t.contains("CNI-HOSTPORT-DNAT", &entry));
        let mark = Rule::parse(&w(
            r#"-m comment --comment "CNI portfwd masquerade mark" -j MARK --set-xmark 0x2000/0x2000"#,
        ));
        assert!(t.contains("CNI-HOSTPORT-SETMARK", &mark));
    }

    #[test]
    fn words_and_quoting_round_trip() {
        let line =
            r#"-A POSTROUTING -s 10.77.0.2/32 -m comment --comment "name: \"swnet\" id: \"ctrA\"" -j X"#;
        let ws = split_words(line);
        assert_eq!(ws[7], r#"name: "swnet" id: "ctrA""#);
        let back = render(&ws).unwrap();
        assert_eq!(back, line);
        assert_eq!(split_words(r#"a "" b"#), vec!["a", "", "b"]);
        assert_eq!(quote_word("").unwrap(), "\"\"");
    }

    /// Kernel test (private namespace): a script goes through `*-restore` and comes back from
    /// `*-save`, both run as children under their deadline (crate::child), quoting intact.
    #[test]
    fn restore_then_save_round_trip() {
        crate::netns::test_support::private_netns();
        let mut s = Script::default();
        s.new_chain("CNI-x");
        let rule =
            words(&["-s", "10.1.0.5/32", "-m", "comment", "--comment", "name: \"a b\"", "-j", "MASQUERADE"]);
        s.append("CNI-x", &rule);
        restore(Backend::Nft, Fam::V4, &s)
            .expect("iptables-nft-restore (scripts/install-deps.sh installs iptables)");
        let t = save(Backend::Nft, Fam::V4).unwrap();
        assert!(t.chains.iter().any(|c| c == "CNI-x"), "{t:?}");
        assert!(t.contains("CNI-x", &Rule::parse(&rule)), "{t:?}");
    }

    #[test]
    fn a_line_break_never_reaches_a_restore_script() {
        // What would otherwise run: `-A X -m comment --comment "a` then `-F INPUT "` as a
        // command of its own.
        for bad in ["a\n-F INPUT", "a\r\nCOMMIT", "nul\0byte", "\n", "tab\tis control too"] {
            let e = quote_word(bad).unwrap_err();
            assert!(e.msg.contains("control character"), "{bad:?}: {}", e.msg);
            let mut s = Script::default();
            s.append("CNI-x", &words(&["-m", "comment", "--comment", bad, "-j", "ACCEPT"]));
            assert!(s.lines().next().is_none(), "{bad:?} made a line: {}", s.text());
            assert!(!s.is_empty() && s.refused().len() == 1, "{bad:?}");
            // restore refuses before looking for the tool or running anything
            let e = restore(Backend::Legacy, Fam::V4, &s).unwrap_err();
            assert!(e.msg.starts_with("iptables-restore not run: refusing"), "{}", e.msg);
        }
        let mut s = Script::default();
        s.new_chain("CNI-x\n-F INPUT");
        s.flush("two words");
        s.push("-A X -j Y\n-F INPUT");
        assert_eq!(s.refused().len(), 3, "{:?}", s.refused());
        assert_eq!(s.text(), "*nat\nCOMMIT\n");
        // Spaces and quotes are still quoted, not refused.
        assert_eq!(quote_word("a \"b\"").unwrap(), r#""a \"b\"""#);
    }

    #[test]
    fn scripts_never_declare_chains() {
        let t = Table::parse(SAVED_FOR_TESTS);
        let mut s = Script::default();
        assert!(s.is_empty());
        let r = t.jumps("POSTROUTING", "CNI-6c848780a988c4f72c3ef534").next().unwrap();
        s.delete(r);
        s.flush("CNI-6c848780a988c4f72c3ef534");
        s.delete_chain("CNI-6c848780a988c4f72c3ef534");
        s.new_chain("CNI-x");
        s.insert_first("POSTROUTING", &words(&["-j", "CNI-x"]));
        assert_eq!(
            s.text(),
            "*nat\n\
             -D POSTROUTING -s 10.77.0.2/32 -m comment --comment \"name: \\\"swnet\\\" id: \\\"ctrA\\\"\" -j CNI-6c848780a988c4f72c3ef534\n\
             -F CNI-6c848780a988c4f72c3ef534\n\
             -X CNI-6c848780a988c4f72c3ef534\n\
             -N CNI-x\n\
             -I POSTROUTING 1 -j CNI-x\n\
             COMMIT\n"
        );
    }

    #[test]
    fn tool_names() {
        assert_eq!(Backend::Nft.tool(Fam::V4, "save"), "iptables-nft-save");
        assert_eq!(Backend::Legacy.tool(Fam::V6, "restore"), "ip6tables-legacy-restore");
        assert_eq!(Backend::Legacy.tool(Fam::V4, ""), "iptables-legacy");
    }
}
