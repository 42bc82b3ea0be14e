//! The house's rules about its own structure, read from the sources (no build, no kernel):
//!
//! * no import cycle among the files of any crate: a file's imports (`use` declarations and
//!   paths written in its code, `crate::…`, `super::…`, `self::…` and paths that start with a
//!   child module) point at the file that defines the module they name; `mod x;` declares a
//!   child and is not an import. A cycle means two files can only be read together.
//! * the crate graph: cni-common depends on no plugin; a plugin depends on no other plugin but
//!   bridge's and ptp's on host-local (their in-process IPAM); the e2e harness depends on no
//!   plugin; nothing shipped depends on the test harness or the benchmark tool.
//!
//! Run alone: `cargo test -p cni-tests --test structure`.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

const PLUGINS: &[&str] =
    &["bandwidth", "bridge", "firewall", "host-local", "loopback", "portmap", "ptp", "tuning"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// Every workspace member's directory, from the workspace manifest's `members` list.
fn members() -> Vec<PathBuf> {
    let text = fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let start = text.find("members").expect("workspace members");
    let list = &text[start..text[start..].find(']').unwrap() + start];
    let out: Vec<PathBuf> = list.split('"').skip(1).step_by(2).map(|m| root().join(m)).collect();
    assert!(out.len() >= 10, "read only {} workspace members", out.len());
    out
}

/// Source text without comments and string literals (so a path in a doc comment or a message
/// is not an import). Char literals are left: they hold no `::`.
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if b[i] == b'r'
            && (b.get(i + 1) == Some(&b'"') || b.get(i + 1) == Some(&b'#'))
            && !ident_byte(b, i)
        {
            // raw string r"…", r#"…"#
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push('r');
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= b.len() {
                    break;
                }
                if b[j] == b'"' && (0..hashes).all(|h| b.get(j + 1 + h) == Some(&b'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

/// Whether the byte before `i` continues an identifier (so `r"` is not a raw string there).
fn ident_byte(b: &[u8], i: usize) -> bool {
    i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')
}

/// The code of a file without its `#[cfg(test)]` items (a test module may import anything).
fn without_test_items(code: &str) -> String {
    let mut out = String::new();
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at..];
        // the item ends at its `;` (e.g. `mod tests;`) or at the brace closing its first `{`
        let semi = after.find(';').unwrap_or(after.len());
        let brace = after.find('{').unwrap_or(after.len());
        if semi < brace {
            rest = &after[semi + 1..];
            continue;
        }
        let mut depth = 0;
        let mut end = after.len();
        for (k, c) in after.char_indices().skip(brace) {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = k + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// Expand a use tree (`a::{b, c::{d as e}}`) into its paths.
fn expand_use(tree: &str) -> Vec<Vec<String>> {
    fn segs(t: &str) -> Vec<String> {
        t.split("::").map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect()
    }
    fn go(prefix: &[String], t: &str, out: &mut Vec<Vec<String>>) {
        let t = t.trim();
        if let Some(open) = t.find('{') {
            let mut p = prefix.to_vec();
            p.extend(segs(&t[..open]));
            let inner = &t[open + 1..t.rfind('}').unwrap_or(t.len())];
            let mut depth = 0;
            let mut start = 0;
            for (k, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        go(&p, &inner[start..k], out);
                        start = k + 1;
                    }
                    _ => {}
                }
            }
            go(&p, &inner[start..], out);
        } else if !t.is_empty() {
            let leaf = t.split_whitespace().next().unwrap_or(t); // `x as y`: the path is `x`
            let mut p = prefix.to_vec();
            p.extend(segs(leaf));
            out.push(p);
        }
    }
    let mut out = Vec::new();
    go(&[], tree, &mut out);
    out
}

/// Paths written in code: maximal `a::b::c` runs (not the ones inside `use` declarations,
/// which [`expand_use`] reads with their braces).
fn code_paths(code: &str) -> Vec<Vec<String>> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let is_id = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    while i < b.len() {
        if is_id(b[i]) && (i == 0 || !(is_id(b[i - 1]) || b[i - 1] == b':')) {
            let mut segs = Vec::new();
            let mut j = i;
            loop {
                let s = j;
                while j < b.len() && is_id(b[j]) {
                    j += 1;
                }
                segs.push(code[s..j].to_string());
                if b.get(j) == Some(&b':')
                    && b.get(j + 1) == Some(&b':')
                    && b.get(j + 2).is_some_and(|c| is_id(*c))
                {
                    j += 2;
                } else {
                    break;
                }
            }
            if segs.len() > 1 {
                out.push(segs);
            }
            i = j.max(i + 1);
        } else {
            i += 1;
        }
    }
    out
}

struct Crate {
    dir: PathBuf,
    /// module path → file (relative to the crate)
    modules: BTreeMap<Vec<String>, PathBuf>,
}

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n != "testdata") {
                rs_files(&p, out);
            }
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The module path of a file under `src/`: lib.rs/main.rs are the root, `a/mod.rs` and `a.rs`
/// are `a`. A `src/bin/x.rs` is a root of its own (its own binary).
fn module_of(src: &Path, file: &Path) -> Option<Vec<String>> {
    let rel = file.strip_prefix(src).ok()?;
    let parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if parts.first().is_some_and(|p| p == "bin") {
        return None;
    }
    let mut m: Vec<String> = parts[..parts.len() - 1].to_vec();
    let last = parts.last()?.trim_end_matches(".rs").to_string();
    if !(m.is_empty() && (last == "lib" || last == "main")) && last != "mod" {
        m.push(last);
    }
    Some(m)
}

fn read_crate(dir: &Path) -> Crate {
    let src = dir.join("src");
    let mut files = Vec::new();
    if src.is_dir() {
        rs_files(&src, &mut files);
    }
    let mut modules = BTreeMap::new();
    for f in files {
        if let Some(m) = module_of(&src, &f) {
            // lib.rs wins over main.rs as the root: main.rs is the binary around the library
            if m.is_empty() && f.ends_with("main.rs") && src.join("lib.rs").exists() {
                continue;
            }
            modules.insert(m, f.strip_prefix(dir).unwrap().to_path_buf());
        }
    }
    Crate { dir: dir.to_path_buf(), modules }
}

impl Crate {
    /// The file an import path names, seen from module `here`, if it names one of this crate.
    fn resolve(&self, here: &[String], path: &[String]) -> Option<&PathBuf> {
        let mut base: Vec<String>;
        let mut rest = path;
        match path.first().map(String::as_str) {
            Some("crate") => {
                base = Vec::new();
                rest = &path[1..];
            }
            Some("self") => {
                base = here.to_vec();
                rest = &path[1..];
            }
            Some("super") => {
                base = here.to_vec();
                while rest.first().is_some_and(|s| s == "super") {
                    base.pop();
                    rest = &rest[1..];
                }
            }
            Some(first) => {
                // a path that starts with a child module of `here`
                let mut child = here.to_vec();
                child.push(first.to_string());
                if !self.modules.contains_key(&child) {
                    return None;
                }
                base = here.to_vec();
            }
            None => return None,
        }
        // the longest module prefix; an item of a module names the module's file
        let mut best = self.modules.get(&base);
        for seg in rest {
            base.push(seg.clone());
            match self.modules.get(&base) {
                Some(f) => best = Some(f),
                None => break,
            }
        }
        best
    }

    /// file → files it imports (test items left out).
    fn graph(&self) -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
        self.graph_why().into_iter().map(|(f, to)| (f, to.into_keys().collect())).collect()
    }

    /// file → (file it imports → the first path that names it).
    fn graph_why(&self) -> BTreeMap<PathBuf, BTreeMap<PathBuf, String>> {
        let mut g = BTreeMap::new();
        for (m, f) in &self.modules {
            let raw = fs::read_to_string(self.dir.join(f)).unwrap();
            // a file that is a test module as a whole (`#[cfg(test)] mod tests;` in its parent)
            if f.file_name().is_some_and(|n| n == "tests.rs" || n == "fake.rs")
                || f.iter().any(|p| p == "tests")
            {
                continue;
            }
            let code = without_test_items(&code_only(&raw));
            let mut paths = Vec::new();
            let mut reexports = Vec::new();
            let mut non_use = String::new();
            let mut rest = code.as_str();
            while let Some(at) = find_use(rest) {
                non_use.push_str(&rest[..at]);
                let after = &rest[at..];
                let end = after.find(';').unwrap_or(after.len());
                let public = rest[..at].trim_end().ends_with("pub") || rest[..at].trim_end().ends_with(')');
                let used = expand_use(after[..end].trim_start_matches("use"));
                // `pub use child::X` in a parent hands a child's name on (the module's face); it
                // is not the parent using the child. Any other `use` is an import.
                if public {
                    reexports.extend(used);
                } else {
                    paths.extend(used);
                }
                rest = &after[(end + 1).min(after.len())..];
            }
            non_use.push_str(rest);
            paths.extend(code_paths(&non_use));
            let mut to = BTreeMap::new();
            for p in paths {
                if let Some(t) = self.resolve(m, &p) {
                    if t != f {
                        to.entry(t.clone()).or_insert_with(|| p.join("::"));
                    }
                }
            }
            for p in reexports {
                // a re-export of something that is not a descendant is still an import
                let descendant = self.resolve(m, &p).is_some_and(|t| {
                    let tm = self
                        .modules
                        .iter()
                        .find(|(_, v)| *v == t)
                        .map(|(k, _)| k.clone())
                        .unwrap_or_default();
                    tm.len() > m.len() && tm.starts_with(m)
                });
                if let (false, Some(t)) = (descendant, self.resolve(m, &p)) {
                    if t != f {
                        to.entry(t.clone()).or_insert_with(|| p.join("::"));
                    }
                }
            }
            g.insert(f.clone(), to);
        }
        g
    }
}

/// The start of the next `use` declaration (as a word at the start of a statement).
fn find_use(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    let mut from = 0;
    while let Some(k) = s[from..].find("use ") {
        let at = from + k;
        let before = s[..at].trim_end();
        let word_start = at == 0 || !(b[at - 1].is_ascii_alphanumeric() || b[at - 1] == b'_');
        let stmt_start = before.is_empty()
            || before.ends_with(';')
            || before.ends_with('{')
            || before.ends_with('}')
            || before.ends_with(']')
            || before.ends_with("pub")
            || before.ends_with("pub(crate)")
            || before.ends_with("pub(super)");
        if word_start && stmt_start {
            return Some(at);
        }
        from = at + 4;
    }
    None
}

/// Strongly connected components with more than one file (Tarjan).
fn cycles(g: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<Vec<PathBuf>> {
    struct T<'a> {
        g: &'a BTreeMap<PathBuf, BTreeSet<PathBuf>>,
        index: BTreeMap<&'a PathBuf, usize>,
        low: BTreeMap<&'a PathBuf, usize>,
        stack: Vec<&'a PathBuf>,
        on: BTreeSet<&'a PathBuf>,
        n: usize,
        out: Vec<Vec<PathBuf>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a PathBuf) {
        t.index.insert(v, t.n);
        t.low.insert(v, t.n);
        t.n += 1;
        t.stack.push(v);
        t.on.insert(v);
        if let Some(next) = t.g.get(v) {
            for w in next {
                let Some((w, _)) = t.g.get_key_value(w) else { continue };
                if !t.index.contains_key(w) {
                    visit(t, w);
                    let lw = t.low[w];
                    let lv = t.low.get_mut(v).unwrap();
                    *lv = (*lv).min(lw);
                } else if t.on.contains(w) {
                    let iw = t.index[w];
                    let lv = t.low.get_mut(v).unwrap();
                    *lv = (*lv).min(iw);
                }
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                comp.push(w.clone());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        n: 0,
        out: Vec::new(),
    };
    for v in g.keys() {
        if !t.index.contains_key(v) {
            visit(&mut t, v);
        }
    }
    t.out
}

#[test]
fn no_crate_has_an_import_cycle_among_its_files() {
    let mut found = Vec::new();
    let mut edges = 0;
    for dir in members() {
        let c = read_crate(&dir);
        let why = c.graph_why();
        let g = c.graph();
        edges += g.values().map(BTreeSet::len).sum::<usize>();
        for comp in cycles(&g) {
            let mut lines = Vec::new();
            for a in &comp {
                for (b, path) in &why[a] {
                    if comp.contains(b) {
                        lines.push(format!("    {} -> {} ({path})", a.display(), b.display()));
                    }
                }
            }
            found.push(format!("{}:\n{}", dir.strip_prefix(root()).unwrap().display(), lines.join("\n")));
        }
    }
    // the reader found the imports it should (a parser that reads nothing finds no cycle)
    assert!(edges > 200, "only {edges} imports among files read: the reader is broken");
    assert!(
        found.is_empty(),
        "files that import each other (directly or around a loop):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_reader_finds_a_planted_cycle() {
    // the checker itself, on a small crate: a grouped `use`, a `super::` path, a path written in
    // code and one that starts with a child module are imports; a string and a comment are not
    let dir = std::env::temp_dir().join(format!("structure-probe-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(dir.join("src/a")).unwrap();
    fs::write(dir.join("src/lib.rs"), "mod a;\nmod b;\nmod c;\n").unwrap();
    fs::write(dir.join("src/a/mod.rs"), "mod inner;\nuse crate::{b::{B, other}};\n// crate::c::C\n").unwrap();
    fs::write(dir.join("src/a/inner.rs"), "use super::super::c::C;\nfn f() { let s = \"crate::b::B\"; }\n")
        .unwrap();
    fs::write(dir.join("src/b.rs"), "pub struct B;\nfn g() -> usize { crate::a::A }\n").unwrap();
    fs::write(dir.join("src/c.rs"), "mod d;\nfn h() { d::x() }\n#[cfg(test)]\nmod t { use crate::a::A; }\n")
        .unwrap();
    fs::create_dir_all(dir.join("src/c")).unwrap();
    fs::write(dir.join("src/c/d.rs"), "pub fn x() {}\n").unwrap();
    let c = read_crate(&dir);
    let g = c.graph();
    let found = cycles(&g);
    let _ = fs::remove_dir_all(&dir);
    let set = |v: &[&str]| v.iter().map(PathBuf::from).collect::<BTreeSet<_>>();
    assert_eq!(
        g[&PathBuf::from("src/a/mod.rs")],
        set(&["src/b.rs"]),
        "grouped use; a comment is not an import"
    );
    assert_eq!(
        g[&PathBuf::from("src/a/inner.rs")],
        set(&["src/c.rs"]),
        "super::super; a string is not an import"
    );
    assert_eq!(g[&PathBuf::from("src/b.rs")], set(&["src/a/mod.rs"]), "a path in code");
    assert_eq!(
        g[&PathBuf::from("src/c.rs")],
        set(&["src/c/d.rs"]),
        "a child module's path; test items left out"
    );
    assert_eq!(found, vec![vec![PathBuf::from("src/a/mod.rs"), PathBuf::from("src/b.rs")]]);
}

/// `name = …` keys of a manifest's `[dependencies]` and `[dev-dependencies]` tables.
fn deps(manifest: &Path) -> (BTreeSet<String>, BTreeSet<String>) {
    let text = fs::read_to_string(manifest).unwrap();
    let (mut normal, mut dev) = (BTreeSet::new(), BTreeSet::new());
    let mut table = "";
    for line in text.lines() {
        let l = line.trim();
        if l.starts_with('[') {
            table = match l {
                "[dependencies]" => "normal",
                "[dev-dependencies]" => "dev",
                _ => "",
            };
            continue;
        }
        if let Some((k, _)) = l.split_once('=') {
            let k = k.trim().trim_matches('"').to_string();
            if k.is_empty() || k.starts_with('#') {
                continue;
            }
            match table {
                "normal" => normal.insert(k),
                "dev" => dev.insert(k),
                _ => false,
            };
        }
    }
    (normal, dev)
}

#[test]
fn crates_depend_only_downward() {
    let mut wrong = Vec::new();
    for dir in members() {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let (normal, dev) = deps(&dir.join("Cargo.toml"));
        let all: BTreeSet<&String> = normal.iter().chain(dev.iter()).collect();
        let plugins_used: Vec<&&String> = all.iter().filter(|d| PLUGINS.contains(&d.as_str())).collect();
        let allowed: &[&str] = match name.as_str() {
            "cni-common" => &[],
            // their IPAM runs in-process (cni_common::delegate::allow_in_process)
            "bridge" | "ptp" => &["host-local"],
            n if PLUGINS.contains(&n) => &[],
            // the e2e harness runs the binaries; it pins what it expects rather than asking a
            // plugin's library (a wrong declaration must fail its tests too)
            "tests" => &[],
            _ => PLUGINS, // cni-migrate and the benchmark tool use plugins' libraries
        };
        for p in plugins_used {
            if !allowed.contains(&p.as_str()) {
                wrong.push(format!("{name} depends on plugin {p}"));
            }
        }
        if PLUGINS.contains(&name.as_str()) || name == "cni-common" {
            for d in ["cni-tests", "cni-bench"] {
                if normal.contains(d) {
                    wrong.push(format!("{name} (shipped) depends on {d}"));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
