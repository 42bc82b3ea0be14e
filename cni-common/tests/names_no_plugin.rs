//! cni-common is what every plugin shares, so it names none of them: a fact about one plugin
//! (its identity values, its upstream state, its advice to the user) lives in that plugin's
//! crate, where a change to it touches one crate. This test reads every source file under
//! `src/` (test data excepted) and fails on a plugin named as a plugin.
//!
//! Kernel words are not plugin names and stay allowed: the Linux bridge (`netlink/bridge.rs`,
//! the `bridge` link kind and nftables family, bridge ports), the loopback interface, firewall
//! rules in general. What is refused: the names only a plugin has (`portmap`, `bandwidth`,
//! `host-local`, `ptp`, `tuning`), and for the three whose names are also kernel words, the
//! forms that can only mean the plugin (`bridge plugin`, `bridge's`, `"firewall"`, `firewall
//! plugin`, `loopback plugin`, upstream's source files `bridge.go` …, `plugins/<name>`).
//!
//! Run alone: `cargo test -p cni-common --test names_no_plugin`.

use std::path::{Path, PathBuf};

/// Names that are a plugin's and nothing else's: refused as whole words, in any case.
const ONLY_PLUGINS: &[&str] =
    &["portmap", "bandwidth", "host-local", "host_local", "hostlocal", "ptp", "tuning"];

/// Forms that name a plugin whose name is also a kernel word: refused as written (any case).
const PLUGIN_FORMS: &[&str] = &[
    "bridge plugin",
    "bridge's",
    "\"firewall\"",
    "firewall plugin",
    "firewall's",
    "loopback plugin",
    "loopback's",
    "bridge.go",
    "firewall.go",
    "loopback.go",
    "plugins/bridge",
    "plugins/firewall",
    "plugins/loopback",
    "plugins/main",
    "plugins/meta",
    "plugins/ipam",
];

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n != "testdata") {
                sources(&p, out);
            }
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn is_word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Every place `word` occurs in `line` as a whole word (case-insensitive).
fn whole_word(line: &str, word: &str) -> bool {
    let hay = line.to_ascii_lowercase();
    let b = hay.as_bytes();
    let mut from = 0;
    while let Some(k) = hay[from..].find(word) {
        let at = from + k;
        let end = at + word.len();
        let before_ok = at == 0 || !is_word_byte(b[at - 1]);
        let after_ok = end == b.len() || !is_word_byte(b[end]);
        if before_ok && after_ok {
            return true;
        }
        from = at + 1;
    }
    false
}

/// What in `text` names a plugin: (line number, line) for each offending line.
fn offences(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let lower = line.to_ascii_lowercase();
        let hit = ONLY_PLUGINS.iter().any(|w| whole_word(line, w))
            || PLUGIN_FORMS.iter().any(|f| lower.contains(f));
        if hit {
            out.push((n + 1, line.trim().to_string()));
        }
    }
    out
}

#[test]
fn cni_common_names_no_plugin() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    assert!(files.len() > 40, "read only {} files under {}", files.len(), root.display());
    let mut found = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for (n, line) in offences(&text) {
            found.push(format!("{}:{n}: {line}", f.strip_prefix(&root).unwrap().display()));
        }
    }
    assert!(
        found.is_empty(),
        "cni-common names a plugin (move the fact to the plugin's crate, or say it without the name):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_reader_tells_plugin_names_from_kernel_words() {
    // refused
    for line in [
        "// portmap's element comment",
        "//! what the bridge plugin builds",
        "/// bridge's `ipMasq`",
        "let t = \"cni_hostport\"; // Portmap.",
        "// (host-local's store)",
        "add the \"firewall\" plugin",
        "// see plugins/bridge/src/add.rs",
        "// upstream's bridge.go",
        "x.tuning()",
        "// the PTP plugin",
    ] {
        assert_eq!(offences(line).len(), 1, "{line}");
    }
    // kernel words and names that merely contain a plugin's
    for line in [
        "LinkKind::Bridge { .. } => \"bridge\",",
        "// a bridge port's flags",
        "// the loopback interface",
        "// firewall rules, sysctls",
        "runtimeConfig.portMappings",
        "pub struct PortMapping {",
        "// the bandwidths of two links",
        "// firewalld's zone",
    ] {
        assert_eq!(offences(line), vec![], "{line}");
    }
}
