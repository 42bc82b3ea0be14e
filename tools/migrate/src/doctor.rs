//! `cni-migrate doctor`: a read-only report of a node, for an operator whose pod has no
//! network (issue 39). It changes nothing: files are only read (bounded, regular files only,
//! [`cni_common::fsread`]), the kernel only dumped (netlink, `/proc/sys`), and the only
//! programs it runs are the plugins the conflists name, asked VERSION and STATUS as a runtime
//! would (under a deadline, [`cni_common::child`]), plus `iptables-legacy-save` when the legacy
//! filter table is loaded ([`cni_common::forward_drop`]).
//!
//! What it looks at:
//! - **binaries** in every CNI bin directory: ours (the banner version compiled into every
//!   binary of this suite, [`cni_common::skel::BANNER_VERSION`]), upstream's (a Go binary whose
//!   `go:buildinfo` names a main package of `github.com/containernetworking/plugins`, with the
//!   module's version when the build recorded one; Debian's records none), or someone else's
//!   (a script, Calico's fork, …). Read from the file, never executed;
//! - **conflists** in the configuration directory (`.conf`, `.conflist`, `.json`, as libcni
//!   loads them): every plugin (and IPAM delegate) they name is found in a bin directory and
//!   answers VERSION (with the list's `cniVersion` among its versions) and, for lists of 1.1.0,
//!   STATUS;
//! - **state** in the namespace it runs in: our tables, upstream's (iptables `CNI-*` chains,
//!   the nftables `cni_hostport` table), our per-pod rules whose pod is gone, host-local
//!   reservations whose pod is gone, portmap's localhost guard;
//! - **the kernel's path for pod traffic**: IPv4/IPv6 forwarding, forward chains that drop the
//!   pods' subnets (policy drop, anyone's), `bridge-nf-call-*` where a bridge asks for it,
//!   `accept_ra` under IPv6 forwarding.
//!
//! Every finding has a stable kebab-case id, a severity, what was seen and what to do. Exit
//! status: 0 with no finding, 1 with findings, 2 when it could not run (usage, no root).

use crate::inventory::Inventory;
use crate::ours;
use cni_common::child;
use cni_common::fsread::{names, open_dir, read_named_regular};
use cni_common::netlink::nft::{NfTables, NftFamily};
use cni_common::netns::NetNs;
use cni_common::skel::BANNER_VERSION;
use ipnet::IpNet;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// What `doctor` is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opts {
    pub bin_dirs: Vec<PathBuf>,
    pub conf_dir: PathBuf,
    pub data_dirs: Vec<PathBuf>,
    pub cache_dirs: Vec<PathBuf>,
    pub json: bool,
}

/// `doctor`'s arguments (after the command): `--json`, `--bin-dir DIR` (repeatable, default
/// /opt/cni/bin), `--conf-dir DIR` (/etc/cni/net.d), `--data-dir DIR` (repeatable, host-local's
/// store, /var/lib/cni/networks), `--cache-dir DIR` (repeatable, libcni's cache, /var/lib/cni).
pub fn parse(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts {
        bin_dirs: Vec::new(),
        conf_dir: PathBuf::from("/etc/cni/net.d"),
        data_dirs: Vec::new(),
        cache_dirs: Vec::new(),
        json: false,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().map(PathBuf::from).ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--json" => o.json = true,
            "--bin-dir" => o.bin_dirs.push(value()?),
            "--conf-dir" => o.conf_dir = value()?,
            "--data-dir" => o.data_dirs.push(value()?),
            "--cache-dir" => o.cache_dirs.push(value()?),
            _ => return Err(format!("doctor: unknown argument {a:?}")),
        }
    }
    let default = |v: &mut Vec<PathBuf>, d: &str| {
        if v.is_empty() {
            v.push(PathBuf::from(d));
        }
    };
    default(&mut o.bin_dirs, "/opt/cni/bin");
    default(&mut o.data_dirs, "/var/lib/cni/networks");
    default(&mut o.cache_dirs, "/var/lib/cni");
    Ok(o)
}

/// The plugins of this suite: a file under one of these names that is not ours is a finding.
pub const OUR_PLUGINS: [&str; 8] =
    ["bandwidth", "bridge", "firewall", "host-local", "loopback", "portmap", "ptp", "tuning"];

/// The most read of one binary: Go plugins are 3-60 MiB, ours a few MiB.
const BINARY_CAP: u64 = 256 << 20;
/// The most read of one configuration file.
const CONF_CAP: u64 = 1 << 20;
/// How long a plugin may take to answer VERSION or STATUS (a runtime gives minutes; an
/// operator waiting for a report should not).
const PLUGIN_DEADLINE: Duration = Duration::from_secs(20);
/// The module of upstream's plugins.
const UPSTREAM_MODULE: &str = "github.com/containernetworking/plugins";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// Pod traffic or a runtime's call fails because of it.
    Error,
    /// Works today, but is not what it should be (a mixed install, leftovers).
    Warning,
}

/// One thing found wrong.
#[derive(Debug, Clone)]
pub struct Finding {
    pub id: &'static str,
    pub severity: Severity,
    pub seen: String,
    pub fix: String,
}

impl Finding {
    fn json(&self) -> Value {
        json!({"id": self.id, "severity": match self.severity { Severity::Error => "error", Severity::Warning => "warning" },
               "seen": self.seen, "fix": self.fix})
    }
}

/// Whose a binary is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Build {
    /// This suite's, of this version (`same`) or another (its banner version).
    Ours { version: String, same: bool },
    /// containernetworking/plugins: its module version when the build recorded it.
    Upstream { version: Option<String> },
    /// Someone else's: a Go binary's main package, else a short description.
    Foreign { what: String },
}

impl Build {
    fn describe(&self) -> String {
        match self {
            Build::Ours { version, same: true } => format!("ours ({version})"),
            Build::Ours { version, same: false } => format!("ours, another version ({version})"),
            Build::Upstream { version: Some(v) } => format!("upstream's {v}"),
            Build::Upstream { version: None } => "upstream's (version not recorded in the binary)".into(),
            Build::Foreign { what } => format!("someone else's ({what})"),
        }
    }
    fn kind(&self) -> &'static str {
        match self {
            Build::Ours { .. } => "ours",
            Build::Upstream { .. } => "upstream",
            Build::Foreign { .. } => "foreign",
        }
    }
}

/// The position of `needle` in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    let (&first, rest) = needle.split_first()?;
    let mut at = 0;
    // jump between occurrences of the first byte (a binary is tens of MiB)
    while let Some(n) = hay.get(at..)?.iter().position(|&b| b == first) {
        let i = at + n;
        if hay.get(i + 1..i + needle.len()) == Some(rest) {
            return Some(i);
        }
        at = i + 1;
    }
    None
}

/// An unsigned LEB128 varint at the start of `b`: (value, length).
fn varint(b: &[u8]) -> Option<(u64, usize)> {
    let mut v = 0u64;
    for (i, byte) in b.iter().enumerate().take(10) {
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((v, i + 1));
        }
    }
    None
}

/// The Go version and the module information of a Go binary (Go 1.18+: the strings inline
/// after the 32-byte `\xff Go buildinf:` header when its flags have bit 2), else None.
fn go_buildinfo(file: &[u8]) -> Option<(String, String)> {
    let at = find(file, b"\xff Go buildinf:")?;
    let header = file.get(at..at + 32)?;
    if header[15] & 2 == 0 {
        return None; // pre-1.18 layout: pointers into the data segment, not decoded here
    }
    let mut rest = &file[at + 32..];
    let mut strings = Vec::new();
    for _ in 0..2 {
        let (len, n) = varint(rest)?;
        let end = n.checked_add(usize::try_from(len).ok()?)?;
        strings.push(String::from_utf8_lossy(rest.get(n..end)?).into_owned());
        rest = &rest[end..];
    }
    let modinfo = strings.pop()?;
    Some((strings.pop()?, modinfo))
}

/// Whose the binary `file` (its bytes) is. Pure: the file is never executed.
pub fn classify(file: &[u8]) -> Build {
    if find(file, BANNER_VERSION.as_bytes()).is_some() {
        return Build::Ours { version: BANNER_VERSION.into(), same: true };
    }
    if let Some(at) = find(file, b"+cni-rs.") {
        // another banner version, `v<upstream release>+cni-rs.<our version>`: the strings of
        // a binary run into each other, so the version is the digits and dots around it
        let dotted = |b: &u8| b.is_ascii_digit() || *b == b'.';
        let start = file[..at].iter().rposition(|&b| b == b'v').filter(|&s| at - s <= 16).unwrap_or(at);
        let end = file[at + 8..].iter().position(|b| !dotted(b)).map_or(file.len(), |n| at + 8 + n);
        let version = String::from_utf8_lossy(&file[start..end]).trim_end_matches('.').to_string();
        return Build::Ours { same: false, version };
    }
    if let Some((go, modinfo)) = go_buildinfo(file) {
        // modinfo opens with a 16-byte sentinel, on its first line
        let field = |key: &str| {
            modinfo.lines().enumerate().find_map(|(n, l)| {
                let at = if n == 0 { l.find(key)? } else { l.starts_with(key).then_some(0)? };
                Some(l[at + key.len()..].split('\t').collect::<Vec<_>>())
            })
        };
        let main = field("path\t").and_then(|f| f.first().map(|s| s.to_string())).unwrap_or_default();
        if main.starts_with(&format!("{UPSTREAM_MODULE}/")) {
            let version = field("mod\t")
                .filter(|f| f.first() == Some(&UPSTREAM_MODULE))
                .and_then(|f| f.get(1).map(|v| v.to_string()))
                .filter(|v| v != "(devel)");
            return Build::Upstream { version };
        }
        let what = if main.is_empty() { format!("a Go program, {go}") } else { format!("Go program {main}") };
        return Build::Foreign { what };
    }
    let what = if file.starts_with(b"#!") {
        let line = file.split(|&b| b == b'\n').next().unwrap_or_default();
        format!("a script, {}", esc(&String::from_utf8_lossy(&line[..line.len().min(60)])))
    } else if file.starts_with(b"\x7fELF") {
        "an executable of neither suite".into()
    } else {
        "not an executable this report knows".into()
    };
    Build::Foreign { what }
}

/// One file of a bin directory.
struct Binary {
    dir: PathBuf,
    name: String,
    build: Result<Build, String>,
}

/// One plugin a conflist names, as found and as it answered.
struct Named {
    ty: String,
    path: Option<PathBuf>,
    version: Option<Result<Vec<String>, String>>,
    status: Option<Result<(), String>>,
}

struct Conflist {
    file: PathBuf,
    name: String,
    version: String,
    plugins: Vec<Named>,
}

/// Everything the report says.
#[derive(Default)]
pub struct Report {
    binaries: Vec<Binary>,
    conflists: Vec<Conflist>,
    tables: Vec<String>,
    sysctls: Vec<(String, String)>,
    pub findings: Vec<Finding>,
    pub notes: Vec<String>,
}

impl Report {
    fn find(&mut self, id: &'static str, severity: Severity, seen: String, fix: impl Into<String>) {
        self.findings.push(Finding { id, severity, seen, fix: fix.into() });
    }
}

/// Shown escaped: names and text read from disk or from a child (control characters, which
/// could rewrite the operator's terminal, as escapes; quotes and apostrophes as they are).
fn esc(s: &str) -> String {
    s.chars().map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() }).collect()
}

fn binaries(o: &Opts, r: &mut Report) {
    for dir in &o.bin_dirs {
        let mut list = match open_dir(dir).and_then(|d| names(&d)) {
            Ok(l) => l,
            Err(e) => {
                r.notes.push(format!("cannot list the bin directory {}: {e}", dir.display()));
                continue;
            }
        };
        list.sort();
        for n in list {
            let Some(name) = n.to_str() else { continue };
            // hidden files (install.sh's temporaries) and directories are no plugins
            if name.starts_with('.') || dir.join(name).is_dir() {
                continue;
            }
            let build = read_named_regular(&dir.join(name), BINARY_CAP)
                .map(|bytes| classify(&bytes))
                .map_err(|e| e.to_string());
            r.binaries.push(Binary { dir: dir.clone(), name: name.to_string(), build });
        }
    }
    // the binary a runtime runs under each name: the first bin directory's
    let mut seen: Vec<&str> = Vec::new();
    let findings: Vec<(String, Build)> = r
        .binaries
        .iter()
        .filter(|b| OUR_PLUGINS.contains(&b.name.as_str()))
        .filter(|b| {
            let first = !seen.contains(&b.name.as_str());
            seen.push(&b.name);
            first
        })
        .filter_map(|b| b.build.as_ref().ok().map(|x| (b.dir.join(&b.name).display().to_string(), x.clone())))
        .collect();
    for (path, build) in findings {
        match build {
            Build::Ours { same: true, .. } => {}
            Build::Ours { version, same: false } => r.find(
                "binary-other-version",
                Severity::Warning,
                format!("{} is ours but of another version ({version}; this cni-migrate is {BANNER_VERSION})", esc(&path)),
                "install one build of the suite everywhere: scripts/install.sh --force (docs/switching.md)",
            ),
            Build::Upstream { version } => r.find(
                "binary-upstream",
                Severity::Warning,
                format!(
                    "{} is upstream's ({}): pods it adds are in upstream's form, next to ours",
                    esc(&path),
                    version.as_deref().unwrap_or("version not recorded")
                ),
                "if you meant to run ours: scripts/install.sh --force, then scripts/migrate.sh from-upstream; if you meant \
                 upstream's everywhere: scripts/install.sh --restore, then scripts/migrate.sh to-upstream (docs/switching.md)",
            ),
            Build::Foreign { what } => r.find(
                "binary-foreign",
                Severity::Error,
                format!("{} is neither ours nor upstream's: {what}", esc(&path)),
                "find what installed it (Calico's installer rewrites same-named plugins in /opt/cni/bin on every restart: \
                 point it at its own names or directory), then put ours back: scripts/install.sh --force",
            ),
        }
    }
}

/// The plugin `ty` in the first bin directory holding it (a regular file after links).
fn locate(o: &Opts, ty: &str) -> Option<PathBuf> {
    if ty.is_empty() || ty.contains('/') || ty == "." || ty == ".." {
        return None;
    }
    o.bin_dirs.iter().map(|d| d.join(ty)).find(|p| p.is_file())
}

/// Run `bin` with `command` and `stdin` (env cleared but for the CNI variables), under
/// [`PLUGIN_DEADLINE`]: its stdout, or why it failed (its error message when it printed one).
fn ask(o: &Opts, bin: &Path, command: &str, stdin: &Value) -> Result<Vec<u8>, String> {
    let path = std::env::join_paths(&o.bin_dirs).map_err(|e| e.to_string())?;
    let mut cmd = Command::new(bin);
    cmd.env_clear().env("CNI_COMMAND", command).env("CNI_PATH", path);
    let input = stdin.to_string();
    let out = child::spawn(&mut cmd, Some(input.as_bytes()), PLUGIN_DEADLINE, child::Use::Runner)
        .map_err(|e| format!("cannot run it: {e}"))?
        .wait()
        .map_err(|e| e.msg)?;
    if out.status.success() {
        return Ok(out.stdout);
    }
    let said = serde_json::from_slice::<Value>(&out.stdout).ok();
    let msg = said
        .as_ref()
        .and_then(|v| {
            let m = v.get("msg")?.as_str()?;
            let d = v.get("details").and_then(Value::as_str).unwrap_or_default();
            Some(format!("code {}: {m}{}{d}", v["code"], if d.is_empty() { "" } else { ": " }))
        })
        .unwrap_or_else(|| {
            let err = String::from_utf8_lossy(&out.stderr);
            format!("{} ({})", out.status, err.trim().chars().take(200).collect::<String>())
        });
    Err(esc(&msg))
}

/// Subnets of an IPAM section (`subnet`, `ranges`).
fn subnets(ipam: &Value, out: &mut Vec<IpNet>) {
    if let Some(s) = ipam.get("subnet").and_then(Value::as_str).and_then(|s| s.parse().ok()) {
        out.push(s);
    }
    for set in ipam.get("ranges").and_then(Value::as_array).into_iter().flatten() {
        for r in set.as_array().into_iter().flatten() {
            if let Some(s) = r.get("subnet").and_then(Value::as_str).and_then(|s| s.parse::<IpNet>().ok()) {
                out.push(s.trunc());
            }
        }
    }
}

/// What the conflists want of the kernel.
#[derive(Default)]
struct Wants {
    subnets: Vec<IpNet>,
    /// A bridge or ptp: pod traffic is routed by the host.
    routed: bool,
    /// A bridge with `bridgeNfCallIptables`: (file, v6 too).
    nf_call: Vec<(String, bool)>,
}

fn conflists(o: &Opts, r: &mut Report, w: &mut Wants) {
    let mut files = match open_dir(&o.conf_dir).and_then(|d| names(&d)) {
        Ok(l) => l,
        Err(e) => {
            r.find(
                "no-conf-dir",
                Severity::Error,
                format!("cannot read the configuration directory {}: {e}", o.conf_dir.display()),
                "a runtime finds no network there either: install a conflist (conf-examples/) or name the right \
                 directory with --conf-dir",
            );
            return;
        }
    };
    files.sort();
    let mut any = false;
    for f in files {
        let Some(name) = f.to_str() else { continue };
        if ![".conf", ".conflist", ".json"].iter().any(|x| name.ends_with(x)) {
            continue;
        }
        any = true;
        let file = o.conf_dir.join(name);
        let shown = esc(&file.display().to_string());
        let conf = match read_named_regular(&file, CONF_CAP)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice::<Value>(&b).map_err(|e| e.to_string()))
        {
            Ok(v) => v,
            Err(e) => {
                r.find(
                    "conflist-unreadable",
                    Severity::Error,
                    format!("{shown}: {}", esc(&e)),
                    "fix or remove the file: a runtime that loads it fails the same way",
                );
                continue;
            }
        };
        let version = conf.get("cniVersion").and_then(Value::as_str).unwrap_or("0.1.0").to_string();
        let list_name = conf.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
        let plugins = match conf.get("plugins").and_then(Value::as_array) {
            Some(p) => p.clone(),
            None => vec![conf.clone()],
        };
        let mut named = Vec::new();
        for p in &plugins {
            let ty = p.get("type").and_then(Value::as_str).unwrap_or_default().to_string();
            if ty == "bridge" || ty == "ptp" {
                w.routed = true;
            }
            let mut mine = Vec::new();
            if let Some(ipam) = p.get("ipam") {
                subnets(ipam, &mut mine);
            }
            if ty == "bridge" && p.get("bridgeNfCallIptables") == Some(&json!(true)) {
                w.nf_call.push((shown.clone(), mine.iter().any(|s| matches!(s, IpNet::V6(_)))));
            }
            w.subnets.extend(mine);
            let mut with_name = p.clone();
            with_name["name"] = json!(list_name);
            with_name["cniVersion"] = json!(version);
            named.push((ty, with_name));
            if let Some(t) = p.get("ipam").and_then(|i| i.get("type")).and_then(Value::as_str) {
                // the delegate is asked VERSION only: its STATUS is its caller's to ask
                named.push((t.to_string(), Value::Null));
            }
        }
        let mut checked = Vec::new();
        for (ty, conf) in named {
            let path = locate(o, &ty);
            let mut n = Named { ty: ty.clone(), path: path.clone(), version: None, status: None };
            let Some(bin) = path else {
                r.find(
                    "plugin-missing",
                    Severity::Error,
                    format!("{shown} names plugin {:?}, which is in no bin directory ({})", ty, dirs(o)),
                    "install it (scripts/install.sh for ours) or fix the conflist: every ADD of this network fails",
                );
                checked.push(n);
                continue;
            };
            let v = ask(o, &bin, "VERSION", &json!({"cniVersion": version})).and_then(|out| {
                let v: Value =
                    serde_json::from_slice(&out).map_err(|e| format!("VERSION answered no JSON: {e}"))?;
                Ok(v.get("supportedVersions")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(Value::as_str).map(String::from).collect::<Vec<String>>())
                    .unwrap_or_default())
            });
            match &v {
                Err(e) => r.find(
                    "plugin-version-fails",
                    Severity::Error,
                    format!("{} (named by {shown}) does not answer VERSION: {e}", bin.display()),
                    "replace the binary (scripts/install.sh --force for ours)",
                ),
                Ok(list) if !list.contains(&version) => r.find(
                    "plugin-version-unsupported",
                    Severity::Error,
                    format!(
                        "{} (named by {shown}) does not support cniVersion {version} (it supports {})",
                        bin.display(),
                        esc(&list.join(", "))
                    ),
                    "set a cniVersion it supports in the conflist, or install a plugin that supports it",
                ),
                Ok(_) => {}
            }
            // STATUS exists from 1.1.0 on; libcni asks it of every plugin of such a list
            if !conf.is_null() && version == "1.1.0" && v.is_ok() {
                let s = ask(o, &bin, "STATUS", &conf).map(|_| ());
                if let Err(e) = &s {
                    r.find(
                        "plugin-status-fails",
                        Severity::Error,
                        format!("{} (named by {shown}) fails STATUS: {e}", bin.display()),
                        "fix what it names: a runtime of CNI 1.1 reports the node's network as not ready",
                    );
                }
                n.status = Some(s);
            }
            n.version = Some(v);
            checked.push(n);
        }
        r.conflists.push(Conflist { file, name: list_name, version, plugins: checked });
    }
    if !any {
        r.find(
            "no-conflist",
            Severity::Error,
            format!("no .conf, .conflist or .json file in {}", o.conf_dir.display()),
            "a runtime has no network to give pods: install a conflist (conf-examples/)",
        );
    }
}

fn dirs(o: &Opts) -> String {
    o.bin_dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
}

/// Whether the pod of a cached attachment is alive: `Some(false)` when its namespace is gone,
/// `None` when that cannot be told (treated as alive).
fn alive(sandbox: Option<String>) -> Option<bool> {
    let s = sandbox?;
    match NetNs::open_recorded(&s) {
        Ok(Some(_)) => Some(true),
        Ok(None) => Some(false),
        Err(_) => None,
    }
}

/// What to do about per-pod rules whose pod is gone.
const STALE_RULES_TODO: &str =
    "the DEL the runtime never made: cnitool del (with the cached attachment), the runtime's GC, or `cnitool gc`";
/// The same for portmap's, which a new pod claiming the ports also replaces.
const STALE_RULES_TODO_PORTMAP: &str = "the DEL the runtime never made: cnitool del (with the cached attachment), \
                                        the runtime's GC, or `cnitool gc`; portmap also replaces them when a new \
                                        pod claims the ports";

/// Why per-pod rules of the attachment `owner` (network, id, ifname, as resolved from the
/// rule) have no live pod, if they have none; rules naming no attachment the node knows are
/// stale too.
fn stale_why(inv: &Inventory, owner: Option<(String, String, String)>) -> Option<String> {
    match owner {
        Some((n, i, f)) => gone_why(inv, &n, &i, &f).map(|w| format!("{n}/{i}/{f}: {w}")),
        None => Some("an attachment this node has no record of".into()),
    }
}

/// Why the attachment (network, id, ifname) has no live pod, if it has none.
fn gone_why(inv: &Inventory, net: &str, id: &str, ifname: &str) -> Option<String> {
    match inv.cached(net, id, ifname) {
        None => Some("no attachment in libcni's cache".into()),
        Some(c) => match alive(c.sandbox()) {
            Some(false) => Some(format!("its namespace {} is gone", esc(&c.sandbox().unwrap_or_default()))),
            _ => None,
        },
    }
}

/// Our state and upstream's; whether the node has attachments (in libcni's cache).
fn state(o: &Opts, r: &mut Report) -> bool {
    let inv = Inventory::load(&o.cache_dirs, &o.data_dirs);
    r.notes.extend(inv.notes.iter().cloned());
    let pods = !inv.cached.is_empty();
    let mut nf = match NfTables::new() {
        Ok(nf) => nf,
        Err(e) => {
            r.notes.push(format!("cannot read nf_tables: {e}"));
            return pods;
        }
    };
    let mut upstream = Vec::new();
    let mut portmap_guard = None;
    for fam in [NftFamily::Inet, NftFamily::Ip, NftFamily::Ip6, NftFamily::Bridge] {
        let tables = match nf.tables(fam) {
            Ok(t) => t,
            Err(e) => {
                r.notes.push(format!("cannot list the {} tables: {e}", fam.keyword()));
                continue;
            }
        };
        for t in tables {
            let label = format!("{} {}", fam.keyword(), t.name);
            let chains = nf.chains(fam, &t.name).unwrap_or_default();
            let whose = match (fam, t.name.as_str()) {
                (NftFamily::Inet, "cni_portmap") => {
                    portmap_guard = Some(chains.iter().any(|c| c == "localnet"));
                    "ours (portmap)"
                }
                (NftFamily::Inet, "cni_plugins_masquerade") => "ours or upstream's v1.6+ (bridge ipMasq)",
                (NftFamily::Bridge, "nat") if chains.iter().any(|c| c.starts_with("cni-br-iface-")) => {
                    "ours or upstream's (bridge macspoofchk)"
                }
                (_, "cni_hostport") => {
                    upstream.push(label.clone());
                    "upstream's (portmap, nftables backend)"
                }
                (NftFamily::Ip | NftFamily::Ip6, "nat" | "filter") => {
                    let cni: Vec<&String> = chains.iter().filter(|c| c.starts_with("CNI-")).collect();
                    if cni.is_empty() {
                        continue;
                    }
                    upstream.push(format!("{label} ({} CNI-* chains)", cni.len()));
                    "iptables-nft CNI-* chains (upstream's iptables form; our firewall's CNI-FORWARD)"
                }
                _ => continue,
            };
            r.tables.push(format!("{label}: {whose}"));
        }
    }
    if portmap_guard == Some(false) {
        r.find(
            "portmap-guard-missing",
            Severity::Warning,
            "table inet cni_portmap has no localnet chain: containers can reach the host's 127.0.0.1 services \
             through route_localnet"
                .into(),
            "scripts/migrate.sh resync (rebuilds the table in this release's layout; docs/node-operations.md)",
        );
    }

    // our per-pod rules whose pod is gone
    let candidates = inv.identities();
    match ours::read_portmap() {
        Ok(Some(p)) => {
            for tag in &p.tags {
                if let Some(why) = stale_why(&inv, ours::resolve_tag(tag, &candidates)) {
                    let seen =
                        format!("portmap's host ports and masquerading of {}: {}", esc(tag), esc(&why));
                    r.find("stale-pod-rules", Severity::Warning, seen, STALE_RULES_TODO_PORTMAP);
                }
            }
        }
        Ok(None) => {}
        Err(e) => r.notes.push(format!("cannot read portmap's table: {}", e.msg)),
    }
    match ours::read_masq(&mut nf) {
        Ok(rules) => {
            for m in rules {
                if let Some(why) = stale_why(&inv, ours::resolve_masq(&m, &candidates)) {
                    let seen = format!(
                        "bridge's masquerade rule for {} (handle {}): {}",
                        m.saddr,
                        m.rule.handle,
                        esc(&why)
                    );
                    r.find("stale-pod-rules", Severity::Warning, seen, STALE_RULES_TODO);
                }
            }
        }
        Err(e) => r.notes.push(format!("cannot read bridge's masquerade table: {e}")),
    }
    // host-local reservations whose pod is gone
    for res in &inv.reservations {
        let why = match &res.ifname {
            Some(ifname) => gone_why(&inv, &res.network, &res.container_id, ifname),
            None => {
                let cached: Vec<_> = inv
                    .cached
                    .iter()
                    .filter(|c| c.network == res.network && c.container_id == res.container_id)
                    .collect();
                if cached.is_empty() {
                    Some("no attachment in libcni's cache".into())
                } else if cached.iter().all(|c| alive(c.sandbox()) == Some(false)) {
                    Some("its namespace is gone".into())
                } else {
                    None
                }
            }
        };
        if let Some(why) = why {
            r.find(
                "stale-reservation",
                Severity::Warning,
                format!(
                    "host-local's reservation of {} in network {} for container {}: {}",
                    res.ip,
                    esc(&res.network),
                    esc(&res.container_id),
                    esc(&why)
                ),
                "the DEL the runtime never made (cnitool del, the runtime's GC, `cnitool gc`); host-local reuses it \
                 when the pool runs out, and releases every reservation of before a reboot",
            );
        }
    }
    if !upstream.is_empty() {
        r.notes.push(format!("upstream's form is on this host: {}", upstream.join(", ")));
    }
    pods
}

/// A sysctl of the namespace this runs in; None when it does not exist.
fn sysctl(r: &mut Report, key: &str) -> Option<String> {
    let v = read_named_regular(&Path::new("/proc/sys").join(key), 64)
        .ok()
        .map(|b| String::from_utf8_lossy(&b).trim().to_string());
    r.sysctls.push((key.replace('/', "."), v.clone().unwrap_or_else(|| "(absent)".into())));
    v
}

/// `pods`: the node has attachments. Forwarding off before the first one is no finding: a
/// bridge with `isGateway` (and ptp) turn it on in their ADD.
fn kernel(r: &mut Report, w: &Wants, pods: bool) {
    let v4 = w.subnets.iter().any(|s| matches!(s, IpNet::V4(_)));
    let v6 = w.subnets.iter().any(|s| matches!(s, IpNet::V6(_)));
    let fwd4 = sysctl(r, "net/ipv4/ip_forward");
    let fwd6 = sysctl(r, "net/ipv6/conf/all/forwarding");
    if pods && w.routed && v4 && fwd4.as_deref() == Some("0") {
        r.find(
            "ipv4-forwarding-off",
            Severity::Error,
            "net.ipv4.ip_forward is 0: pods' IPv4 traffic is not routed off the node".into(),
            "sysctl -w net.ipv4.ip_forward=1, and find what turned it off (a sysctl.d file, a firewall's start-up)",
        );
    }
    if pods && w.routed && v6 && fwd6.as_deref() == Some("0") {
        r.find(
            "ipv6-forwarding-off",
            Severity::Error,
            "net.ipv6.conf.all.forwarding is 0: pods' IPv6 traffic is not routed off the node".into(),
            "sysctl -w net.ipv6.conf.all.forwarding=1 (set accept_ra=2 first on interfaces that take their route \
             from router advertisements)",
        );
    }
    if fwd6.as_deref() == Some("1") {
        // with forwarding on, accept_ra=1 ignores router advertisements: an uplink that took its
        // default route from them loses it when the route expires
        for i in ra_default_route_links(r) {
            let key = format!("net/ipv6/conf/{i}/accept_ra");
            if read_named_regular(&Path::new("/proc/sys").join(&key), 64)
                .is_ok_and(|b| String::from_utf8_lossy(&b).trim() == "1")
            {
                r.find(
                    "accept-ra-ignored",
                    Severity::Warning,
                    format!(
                        "{} has its IPv6 default route from router advertisements, which IPv6 forwarding makes it \
                         ignore (accept_ra=1): the route is gone when it expires",
                        esc(&i)
                    ),
                    format!("sysctl -w net.ipv6.conf.{}.accept_ra=2", esc(&i)),
                );
            }
        }
    }
    for (file, six) in &w.nf_call {
        for (key, needed) in
            [("net/bridge/bridge-nf-call-iptables", true), ("net/bridge/bridge-nf-call-ip6tables", *six)]
        {
            if !needed {
                continue;
            }
            match sysctl(r, key) {
                None => r.find(
                    "br-netfilter-missing",
                    Severity::Error,
                    format!("{file} sets bridgeNfCallIptables but br_netfilter is not loaded ({} does not exist)", key.replace('/', ".")),
                    "modprobe br_netfilter (and list it in /etc/modules-load.d/): every ADD of this network fails with code 50",
                ),
                Some(v) if v == "0" => r.find(
                    "bridge-nf-call-off",
                    Severity::Error,
                    format!("{file} sets bridgeNfCallIptables but {} is 0: pod-to-pod traffic on the bridge skips the firewall (Service DNAT, policies)", key.replace('/', ".")),
                    format!("sysctl -w {}=1, and find what turned it off", key.replace('/', ".")),
                ),
                Some(_) => {}
            }
        }
    }
    let mut seen = Vec::new();
    for s in &w.subnets {
        if seen.contains(s) {
            continue;
        }
        seen.push(*s);
        let d = cni_common::forward_drop::diagnose(*s);
        for u in &d.unread {
            r.notes.push(format!("forward chains for {s} partly unread: {u}"));
        }
        if let Some(m) =
            d.message(*s, "add the firewall plugin to the conflist (it accepts each pod's address there)")
        {
            let (seen, fix) =
                m.split_once(": ").map(|(a, b)| (a.to_string(), b.to_string())).unwrap_or((m, String::new()));
            r.find("forward-drop", Severity::Error, seen, fix);
        }
    }
}

/// The interfaces holding an IPv6 default route learnt from router advertisements (protocol
/// `ra`), in the namespace this runs in.
fn ra_default_route_links(r: &mut Report) -> Vec<String> {
    const RTPROT_RA: u8 = 9;
    let mut nl = match cni_common::netlink::Netlink::new() {
        Ok(nl) => nl,
        Err(e) => {
            r.notes.push(format!("cannot read the routes: {e}"));
            return Vec::new();
        }
    };
    let routes = match nl.routes(Some(cni_common::net::Family::V6)) {
        Ok(routes) => routes,
        Err(e) => {
            r.notes.push(format!("cannot read the routes: {e}"));
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for rt in routes.iter().filter(|rt| rt.dst.prefix_len() == 0 && rt.protocol == RTPROT_RA) {
        for (_, oif) in rt.paths() {
            if let Some(l) = oif.and_then(|i| nl.link_by_index(i).ok().flatten()) {
                if !out.contains(&l.name) {
                    out.push(l.name);
                }
            }
        }
    }
    out
}

/// Look at the node; the report.
pub fn run(o: &Opts) -> Report {
    let mut r = Report::default();
    let mut w = Wants::default();
    binaries(o, &mut r);
    conflists(o, &mut r, &mut w);
    let pods = state(o, &mut r);
    kernel(&mut r, &w, pods);
    r
}

impl Report {
    pub fn to_json(&self) -> Value {
        json!({
            "healthy": self.findings.is_empty(),
            "binaries": self.binaries.iter().map(|b| {
                let mut v = json!({"dir": b.dir, "name": b.name});
                match &b.build {
                    Ok(x) => {
                        v["kind"] = json!(x.kind());
                        match x {
                            Build::Ours { version, .. } => v["version"] = json!(version),
                            Build::Upstream { version } => v["version"] = json!(version),
                            Build::Foreign { what } => v["what"] = json!(what),
                        }
                    }
                    Err(e) => { v["kind"] = json!("unreadable"); v["error"] = json!(e); }
                }
                v
            }).collect::<Vec<_>>(),
            "conflists": self.conflists.iter().map(|c| json!({
                "file": c.file, "name": c.name, "cniVersion": c.version,
                "plugins": c.plugins.iter().map(|p| json!({
                    "type": p.ty, "path": p.path,
                    "version": p.version.as_ref().map(|v| match v { Ok(l) => json!({"supported": l}), Err(e) => json!({"error": e}) }),
                    "status": p.status.as_ref().map(|s| match s { Ok(()) => json!("ok"), Err(e) => json!({"error": e}) }),
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
            "tables": self.tables,
            "sysctls": self.sysctls.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>(),
            "findings": self.findings.iter().map(Finding::json).collect::<Vec<_>>(),
            "notes": self.notes,
        })
    }

    pub fn to_text(&self) -> String {
        let mut s = String::from("binaries:\n");
        for b in &self.binaries {
            let what = match &b.build {
                Ok(x) => x.describe(),
                Err(e) => format!("unreadable: {e}"),
            };
            s.push_str(&format!("  {}: {what}\n", esc(&b.dir.join(&b.name).display().to_string())));
        }
        s.push_str("conflists:\n");
        for c in &self.conflists {
            let file = esc(&c.file.display().to_string());
            s.push_str(&format!("  {file} (network {:?}, cniVersion {:?})\n", c.name, c.version));
            for p in &c.plugins {
                let answer = match (&p.path, &p.version, &p.status) {
                    (None, ..) => "MISSING".to_string(),
                    (Some(_), Some(Err(e)), _) => format!("VERSION fails: {e}"),
                    (Some(_), _, Some(Err(e))) => format!("STATUS fails: {e}"),
                    (Some(_), _, Some(Ok(()))) => "VERSION ok, STATUS ok".into(),
                    (Some(_), ..) => "VERSION ok".into(),
                };
                let at = p.path.as_ref().map(|x| format!(" ({})", x.display())).unwrap_or_default();
                s.push_str(&format!("    {}{at}: {answer}\n", esc(&p.ty)));
            }
        }
        s.push_str("tables:\n");
        for t in &self.tables {
            s.push_str(&format!("  {}\n", esc(t)));
        }
        if self.tables.is_empty() {
            s.push_str("  (none of ours or upstream's)\n");
        }
        s.push_str("sysctls:\n");
        for (k, v) in &self.sysctls {
            s.push_str(&format!("  {k} = {v}\n"));
        }
        for n in &self.notes {
            s.push_str(&format!("note: {n}\n"));
        }
        for f in &self.findings {
            let sev = match f.severity {
                Severity::Error => "error",
                Severity::Warning => "warning",
            };
            s.push_str(&format!("{sev} [{}]: {}\n  fix: {}\n", f.id, f.seen, f.fix));
        }
        if self.findings.is_empty() {
            s.push_str("healthy: nothing found\n");
        } else {
            s.push_str(&format!("{} finding(s)\n", self.findings.len()));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Go 1.18+ buildinfo blob: header, Go version, modinfo.
    fn go_binary(main: &str, module: Option<(&str, &str)>) -> Vec<u8> {
        let mut b = b"\x7fELF....padding".to_vec();
        let mut h = b"\xff Go buildinf:".to_vec();
        h.extend([8u8, 2]);
        h.resize(32, 0);
        b.extend(h);
        let mut modinfo = format!("0123456789abcdefpath\t{main}\n");
        if let Some((m, v)) = module {
            modinfo.push_str(&format!("mod\t{m}\t{v}\th1:x=\n"));
        }
        for s in ["go1.22.5".to_string(), modinfo] {
            let mut n = s.len();
            while n >= 0x80 {
                b.push((n as u8 & 0x7f) | 0x80);
                n >>= 7;
            }
            b.push(n as u8);
            b.extend(s.as_bytes());
        }
        b
    }

    #[test]
    fn binaries_are_told_apart_from_their_bytes() {
        let mut ours = b"\x7fELF stuff\0".to_vec();
        ours.extend(BANNER_VERSION.as_bytes());
        ours.extend(b"\0more");
        assert_eq!(classify(&ours), Build::Ours { version: BANNER_VERSION.into(), same: true });
        assert_eq!(
            classify(b"\x7fELF\0unknown commit, v1.10.0+cni-rs.0.0.1cniVersion\0"),
            Build::Ours { version: "v1.10.0+cni-rs.0.0.1".into(), same: false }
        );
        let up = go_binary(
            "github.com/containernetworking/plugins/plugins/main/bridge",
            Some((UPSTREAM_MODULE, "v1.10.0")),
        );
        assert_eq!(classify(&up), Build::Upstream { version: Some("v1.10.0".into()) });
        let debian = go_binary("github.com/containernetworking/plugins/plugins/main/bridge", None);
        assert_eq!(classify(&debian), Build::Upstream { version: None });
        let calico = go_binary("github.com/projectcalico/calico/cni-plugin/cmd/calico", None);
        assert_eq!(
            classify(&calico),
            Build::Foreign {
                what: "Go program github.com/projectcalico/calico/cni-plugin/cmd/calico".into()
            }
        );
        assert!(
            matches!(classify(b"#!/bin/sh\necho hi\n"), Build::Foreign { what } if what.contains("script"))
        );
        // a truncated header or string is no buildinfo, never a panic
        let mut cut = up.clone();
        cut.truncate(up.len() - 20);
        assert!(matches!(classify(&cut), Build::Foreign { .. }));
        assert!(matches!(classify(b"\xff Go buildinf:"), Build::Foreign { .. }));
        assert_eq!(find(b"aab", b"ab"), Some(1));
        assert_eq!(find(b"aa", b"aab"), None);
        assert_eq!(find(b"", b"a"), None);
    }

    #[test]
    fn text_read_back_is_shown_without_control_characters() {
        assert_eq!(esc("libcni's \"cache\""), "libcni's \"cache\"");
        assert_eq!(esc("a\x1b[2Jb\n"), "a\\u{1b}[2Jb\\n");
    }

    #[test]
    fn arguments() {
        let a = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
        let o =
            parse(&a("--json --bin-dir /a --bin-dir /b --conf-dir /c --data-dir /d --cache-dir /e")).unwrap();
        assert!(o.json);
        assert_eq!(o.bin_dirs, [PathBuf::from("/a"), PathBuf::from("/b")]);
        assert_eq!(
            (o.conf_dir, o.data_dirs, o.cache_dirs),
            ("/c".into(), vec!["/d".into()], vec!["/e".into()])
        );
        let o = parse(&[]).unwrap();
        assert_eq!((o.bin_dirs, o.conf_dir), (vec!["/opt/cni/bin".into()], "/etc/cni/net.d".into()));
        assert!(!o.json);
        assert!(parse(&a("--dry-run")).is_err());
        assert!(parse(&a("--bin-dir")).is_err());
    }

    #[test]
    fn subnets_of_ipam() {
        let mut out = Vec::new();
        subnets(
            &json!({"ranges": [[{"subnet": "10.1.0.5/24"}], [{"subnet": "2001:db8::/64"}]], "subnet": "10.9.0.0/16"}),
            &mut out,
        );
        assert_eq!(out.len(), 3);
        assert!(out.contains(&"10.1.0.0/24".parse().unwrap()));
    }
}
