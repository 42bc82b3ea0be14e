//! Loading a network configuration by name, the way libcni's `LoadConfList` does:
//! `.conflist` files first (sorted), then legacy single-plugin `.conf`/`.json` files (sorted)
//! converted to a one-plugin list. Also libcni's choice of the version to run with
//! (`cniVersion` and the 1.1 `cniVersions` list).

use cni_common::spec::config::IpamRef;
use cni_common::spec::json;
use cni_common::spec::result::Dns;
use cni_common::spec::version::Version;
use cni_common::{code, CniError, Result};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// One plugin of a list: its raw JSON object (passed on with unknown keys and key order
/// intact) and the keys the runner needs.
#[derive(Clone, Debug, PartialEq)]
pub struct PluginConf {
    pub raw: Map<String, Value>,
    pub plugin_type: String,
    /// The plugin's own `name` key, if any (used in messages, as libcni does, and to find
    /// legacy single-plugin files).
    pub name: String,
    /// The plugin's own `cniVersion` key (used when a legacy file becomes a list).
    pub cni_version: String,
    /// Declared capabilities, in file order: name -> enabled.
    pub capabilities: Vec<(String, bool)>,
}

/// A network configuration list (libcni's `NetworkConfigList`).
#[derive(Clone, Debug, PartialEq)]
pub struct NetConfList {
    pub name: String,
    /// The version libcni would run with: `cniVersion`, or the highest usable entry of
    /// `cniVersions`. May be empty (meaning 0.1.0) or a version we do not speak; see
    /// [`NetConfList::version`].
    pub cni_version: String,
    pub disable_check: bool,
    pub disable_gc: bool,
    pub load_only_inlined_plugins: bool,
    pub plugins: Vec<PluginConf>,
    /// The bytes of the list as found on disk (or as converted from a `.conf`): what the
    /// cache records in `config`.
    pub bytes: Vec<u8>,
}

impl NetConfList {
    /// The negotiated version as one we can encode results in.
    pub fn version(&self) -> Result<Version> {
        if !self.cni_version.is_empty() {
            if let Some(v) = Version::from_str_exact(&self.cni_version) {
                return Ok(v);
            }
        } else {
            return Ok(Version::V0_1_0);
        }
        let all: Vec<&str> = Version::ALL.iter().map(|v| v.as_str()).collect();
        Err(CniError::new(
            code::INCOMPATIBLE_VERSION,
            format!("network {:?}: unsupported CNI version {:?}", self.name, self.cni_version),
        )
        .with_details(format!("cnitool supports {}", all.join(", "))))
    }
}

/// Go's `version.ParseVersion`: "" is 0.1.0; one to three dot-separated integers.
fn go_parse_version(s: &str) -> Option<(u64, u64, u64)> {
    if s.is_empty() {
        return Some((0, 1, 0));
    }
    let parts: Vec<&str> = s.split('.').collect();
    if parts.len() > 3 {
        return None;
    }
    let mut n = [0u64; 3];
    for (i, p) in parts.iter().enumerate() {
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        n[i] = p.parse().ok()?;
    }
    Some((n[0], n[1], n[2]))
}

/// libcni's version choice. Without `cniVersions` it is `cniVersion` as written. With it, it is
/// the highest version among `cniVersions` and `cniVersion` that we support; when none is,
/// `cniVersion` stays as written. Entries that are not versions at all are errors.
pub fn choose_version(cni_version: &str, cni_versions: Option<&[String]>) -> Result<String> {
    let Some(list) = cni_versions else {
        return Ok(cni_version.to_string());
    };
    let mut best: Option<Version> = None;
    for (i, v) in list.iter().enumerate() {
        if go_parse_version(v).is_none() {
            return Err(CniError::decode(format!(
                "error parsing configuration list: invalid cniVersions entry {v:?} at index {i}"
            )));
        }
        if let Some(ver) = Version::from_str_exact(v).filter(|_| !v.is_empty()) {
            best = best.max(Some(ver));
        }
    }
    if !cni_version.is_empty() {
        if go_parse_version(cni_version).is_none() {
            return Err(CniError::decode(format!(
                "error parsing configuration list: invalid cniVersion {cni_version:?}"
            )));
        }
        if let Some(ver) = Version::from_str_exact(cni_version) {
            best = best.max(Some(ver));
        }
    }
    Ok(best.map(|v| v.as_str().to_string()).unwrap_or_else(|| cni_version.to_string()))
}

/// The keys of a plugin object whose types Go's decoder checks (`types.PluginConf`); the
/// ones only decoded for that check are never read.
#[derive(Deserialize)]
#[allow(dead_code)]
struct PluginKeys {
    #[serde(rename = "cniVersion", default)]
    cni_version: String,
    #[serde(default)]
    name: String,
    #[serde(rename = "type", default)]
    plugin_type: String,
    #[serde(default)]
    capabilities: Option<Map<String, Value>>,
    #[serde(default)]
    ipam: Option<IpamRef>,
    #[serde(default)]
    dns: Option<Dns>,
    #[serde(rename = "prevResult", default)]
    prev_result: Option<Map<String, Value>>,
}

/// libcni's `NetworkPluginConfFromBytes`: a JSON object with a non-empty `type`.
pub fn plugin_from_value(v: Value) -> Result<PluginConf> {
    let bad = |m: String| CniError::decode(format!("error parsing configuration: {m}"));
    let Value::Object(raw) = v else {
        return Err(bad("a plugin configuration must be a JSON object".into()));
    };
    let keys: PluginKeys = json::from_ref(&Value::Object(raw.clone())).map_err(bad)?;
    if keys.plugin_type.is_empty() {
        return Err(bad("missing 'type'".into()));
    }
    let mut capabilities = Vec::new();
    for (k, v) in keys.capabilities.unwrap_or_default() {
        let on = match v {
            Value::Bool(b) => b,
            Value::Null => false,
            other => return Err(bad(format!("capabilities.{k}: expected a boolean, got {other}"))),
        };
        capabilities.push((k, on));
    }
    Ok(PluginConf {
        raw,
        plugin_type: keys.plugin_type,
        name: keys.name,
        cni_version: keys.cni_version,
        capabilities,
    })
}

/// libcni's `NetworkConfFromBytes` (without the plugin directory, see [`list_from_file`]).
pub fn list_from_bytes(bytes: &[u8]) -> Result<NetConfList> {
    let bad = |m: String| CniError::decode(format!("error parsing configuration list: {m}"));
    let v: Value = serde_json::from_slice(bytes).map_err(|e| bad(e.to_string()))?;
    let Value::Object(raw) = v else {
        return Err(bad("the configuration list must be a JSON object".into()));
    };
    let name = match raw.get("name") {
        None => return Err(bad("no name".into())),
        Some(Value::String(s)) => s.clone(),
        Some(other) => return Err(bad(format!("invalid name type: {other}"))),
    };
    let cni_version = match raw.get("cniVersion") {
        None => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => return Err(bad(format!("invalid cniVersion type: {other}"))),
    };
    let cni_versions = match raw.get("cniVersions") {
        None => None,
        Some(Value::Array(items)) => {
            let mut out = Vec::new();
            for (i, it) in items.iter().enumerate() {
                match it {
                    Value::String(s) => out.push(s.clone()),
                    other => return Err(bad(format!("invalid type for cniVersions index {i}: {other}"))),
                }
            }
            Some(out)
        }
        Some(other) => return Err(bad(format!("invalid type for cniVersions: {other}"))),
    };
    let cni_version = choose_version(&cni_version, cni_versions.as_deref())?;
    let read_bool = |key: &str| -> Result<bool> {
        match raw.get(key) {
            None => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(Value::String(s)) if s.eq_ignore_ascii_case("true") => Ok(true),
            Some(Value::String(s)) if s.eq_ignore_ascii_case("false") => Ok(false),
            Some(other) => Err(bad(format!("invalid value {other} for {key}: expected true or false"))),
        }
    };
    let disable_check = read_bool("disableCheck")?;
    let disable_gc = read_bool("disableGC")?;
    let load_only_inlined_plugins = read_bool("loadOnlyInlinedPlugins")?;
    let mut list = NetConfList {
        name,
        cni_version,
        disable_check,
        disable_gc,
        load_only_inlined_plugins,
        plugins: Vec::new(),
        bytes: bytes.to_vec(),
    };
    let plugins = match raw.get("plugins") {
        None if load_only_inlined_plugins => {
            return Err(bad("`loadOnlyInlinedPlugins` is true, and no 'plugins' key".into()))
        }
        None => return Ok(list),
        Some(Value::Array(p)) => p,
        Some(other) => return Err(bad(format!("invalid 'plugins' type: {other}"))),
    };
    if plugins.is_empty() {
        return Err(bad("no plugins in list".into()));
    }
    for (i, p) in plugins.iter().enumerate() {
        let pc = plugin_from_value(p.clone())
            .map_err(|e| e.context(format!("failed to parse plugin config {i}")))?;
        list.plugins.push(pc);
    }
    Ok(list)
}

/// The most cnitool reads of one file (a configuration, a cached result): what a plugin reads
/// of its stdin ([`cni_common::skel::STDIN_MAX`]), which is where a configuration ends up.
pub const FILE_MAX: usize = cni_common::skel::STDIN_MAX;

/// Read a file whose name comes from the environment or a directory listing: only a regular
/// file (never a FIFO waited on or a device opened), at most [`FILE_MAX`] bytes
/// (`cni_common::fsread`).
pub fn read_bounded(path: &Path) -> std::io::Result<Vec<u8>> {
    cni_common::fsread::read_named_regular(path, FILE_MAX as u64)
}

fn read(path: &Path) -> Result<Vec<u8>> {
    read_bounded(path).map_err(|e| CniError::io(format!("error reading {}: {e}", path.display())))
}

/// libcni's `NetworkConfFromFile`: the list, plus (unless `loadOnlyInlinedPlugins`) the
/// plugin objects in `<dir>/<name>/*.conf`, appended in file-name order.
pub fn list_from_file(path: &Path) -> Result<NetConfList> {
    let bytes = read(path)?;
    let mut list = list_from_bytes(&bytes).map_err(|e| e.context(path.display()))?;
    if !list.load_only_inlined_plugins {
        let dir = path.parent().unwrap_or(Path::new(".")).join(&list.name);
        for f in conf_files(&dir, &["conf"])? {
            let v: Value = serde_json::from_slice(&read(&f)?).map_err(|e| {
                CniError::decode(format!("{}: error parsing configuration: {e}", f.display()))
            })?;
            list.plugins.push(plugin_from_value(v).map_err(|e| e.context(f.display()))?);
        }
    }
    if list.plugins.is_empty() {
        return Err(CniError::config(format!("{}: no plugin configs found", path.display())));
    }
    Ok(list)
}

/// libcni's `ConfFiles`: regular entries of `dir` whose extension is one of `exts`, sorted.
/// A missing directory has no files.
pub fn conf_files(dir: &Path, exts: &[&str]) -> Result<Vec<PathBuf>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(CniError::io(format!("cannot read directory {}: {e}", dir.display()))),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry =
            entry.map_err(|e| CniError::io(format!("cannot read directory {}: {e}", dir.display())))?;
        if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            continue;
        }
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()).is_some_and(|e| exts.contains(&e)) {
            out.push(path);
        }
    }
    out.sort();
    Ok(out)
}

/// A legacy single-plugin file converted to a list (libcni's `ConfListFromConf`).
fn list_from_single(path: &Path, plugin: PluginConf) -> Result<NetConfList> {
    let mut wrapper = Map::new();
    wrapper.insert("name".into(), plugin.name.into());
    wrapper.insert("cniVersion".into(), plugin.cni_version.into());
    wrapper.insert("plugins".into(), Value::Array(vec![Value::Object(plugin.raw)]));
    let list_bytes = serde_json::to_vec(&Value::Object(wrapper)).expect("a Value always serializes");
    list_from_bytes(&list_bytes).map_err(|e| e.context(path.display()))
}

/// Find the network called `name` in `dir`.
pub fn load(dir: &Path, name: &str) -> Result<NetConfList> {
    let lists = conf_files(dir, &["conflist"])?;
    for f in &lists {
        let list = list_from_file(f)?;
        if list.name == name {
            return Ok(list);
        }
    }
    let singles = conf_files(dir, &["conf", "json"])?;
    if singles.is_empty() && lists.is_empty() {
        return Err(CniError::config(format!("no net configurations found in {}", dir.display())));
    }
    for f in &singles {
        let bytes = read(f)?;
        let v: Value = serde_json::from_slice(&bytes)
            .map_err(|e| CniError::decode(format!("{}: error parsing configuration: {e}", f.display())))?;
        let plugin = plugin_from_value(v).map_err(|e| e.context(f.display()))?;
        // Go decodes `name` case-insensitively here; plugin.name is that value.
        if plugin.name == name {
            return list_from_single(f, plugin);
        }
    }
    Err(CniError::config(format!("no net configuration with name {name:?} in {}", dir.display())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    struct TempDir(PathBuf);
    impl TempDir {
        fn new(tag: &str) -> TempDir {
            let p = std::env::temp_dir().join(format!(
                "cnitool-conf-{tag}-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            let _ = fs::remove_dir_all(&p);
            fs::create_dir_all(&p).unwrap();
            TempDir(p)
        }
        fn write(&self, name: &str, text: &str) {
            let p = self.0.join(name);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, text).unwrap();
        }
    }
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn list(name: &str, ty: &str) -> String {
        format!(r#"{{"cniVersion":"1.0.0","name":"{name}","plugins":[{{"type":"{ty}"}}]}}"#)
    }

    #[test]
    fn conflist_wins_over_conf_and_files_are_sorted() {
        let d = TempDir::new("order");
        d.write("10-a.conf", r#"{"cniVersion":"0.4.0","name":"net","type":"from-conf"}"#);
        d.write("20-b.conflist", &list("net", "second"));
        d.write("15-c.conflist", &list("net", "first"));
        d.write("99.txt", "not json");
        let l = load(&d.0, "net").unwrap();
        assert_eq!(l.plugins[0].plugin_type, "first");
        assert_eq!(l.bytes, list("net", "first").as_bytes());
    }

    #[test]
    fn single_conf_is_converted_to_a_list() {
        let d = TempDir::new("single");
        d.write("b.json", r#"{"cniVersion":"0.3.1","name":"other","type":"x"}"#);
        d.write(
            "a.conf",
            r#"{"cniVersion":"0.4.0","name":"net","type":"bridge","zzz":1,"bridge":"cni0","capabilities":{"mac":true}}"#,
        );
        let l = load(&d.0, "net").unwrap();
        assert_eq!((l.name.as_str(), l.cni_version.as_str()), ("net", "0.4.0"));
        assert_eq!(l.plugins.len(), 1);
        let keys: Vec<&String> = l.plugins[0].raw.keys().collect();
        assert_eq!(keys, ["cniVersion", "name", "type", "zzz", "bridge", "capabilities"]);
        assert_eq!(l.plugins[0].capabilities, vec![("mac".to_string(), true)]);
        let wrapper: Value = serde_json::from_slice(&l.bytes).unwrap();
        assert_eq!(wrapper["name"], "net");
        assert_eq!(wrapper["cniVersion"], "0.4.0");
        assert_eq!(wrapper["plugins"][0]["bridge"], "cni0");
        assert_eq!(load(&d.0, "other").unwrap().plugins[0].plugin_type, "x");
    }

    #[test]
    fn missing_network_and_empty_dir() {
        let d = TempDir::new("missing");
        let e = load(&d.0, "net").unwrap_err();
        assert_eq!(e.msg, format!("no net configurations found in {}", d.0.display()));
        let e = load(&d.0.join("does-not-exist"), "net").unwrap_err();
        assert!(e.msg.starts_with("no net configurations found in"), "{}", e.msg);
        d.write("a.conflist", &list("other", "x"));
        let e = load(&d.0, "net").unwrap_err();
        assert_eq!(e.msg, format!("no net configuration with name \"net\" in {}", d.0.display()));
    }

    #[test]
    fn invalid_files_are_named_in_errors() {
        let d = TempDir::new("invalid");
        d.write("a.conflist", r#"{"cniVersion":"1.0.0","plugins":[{"type":"x"}]}"#);
        let e = load(&d.0, "net").unwrap_err();
        assert!(e.msg.contains("a.conflist") && e.msg.contains("no name"), "{}", e.msg);
        d.write("a.conflist", r#"{"name":"net","plugins":[{"bridge":"x"}]}"#);
        let e = load(&d.0, "net").unwrap_err();
        assert!(
            e.msg.contains("failed to parse plugin config 0") && e.msg.contains("missing 'type'"),
            "{}",
            e.msg
        );
        d.write("a.conflist", r#"{"name":"net","plugins":[]}"#);
        assert!(load(&d.0, "net").unwrap_err().msg.contains("no plugins in list"));
        d.write("a.conflist", r#"{"name":"net"}"#);
        assert!(load(&d.0, "net").unwrap_err().msg.contains("no plugin configs found"));
        d.write("a.conflist", r#"{"name":"net","plugins":[{"type":"x","capabilities":{"mac":"yes"}}]}"#);
        assert!(load(&d.0, "net").unwrap_err().msg.contains("capabilities.mac"));
        d.write("a.conflist", r#"{"name":"net","disableCheck":"maybe","plugins":[{"type":"x"}]}"#);
        assert!(load(&d.0, "net").unwrap_err().msg.contains("disableCheck"));
        d.write("a.conflist", "{nope");
        assert!(load(&d.0, "net").unwrap_err().msg.contains("error parsing configuration list"));
    }

    #[test]
    fn flags_accept_bools_and_strings() {
        let l = list_from_bytes(
            br#"{"name":"n","disableCheck":"TRUE","disableGC":true,"loadOnlyInlinedPlugins":"false","plugins":[{"type":"x"}]}"#,
        )
        .unwrap();
        assert!(l.disable_check && l.disable_gc && !l.load_only_inlined_plugins);
    }

    #[test]
    fn plugins_from_the_network_directory() {
        let d = TempDir::new("plugdir");
        d.write("net.conflist", r#"{"cniVersion":"1.1.0","name":"net","plugins":[{"type":"a"}]}"#);
        d.write("net/2.conf", r#"{"type":"c"}"#);
        d.write("net/1.conf", r#"{"type":"b"}"#);
        d.write("net/3.json", r#"{"type":"ignored"}"#);
        let l = load(&d.0, "net").unwrap();
        let types: Vec<&str> = l.plugins.iter().map(|p| p.plugin_type.as_str()).collect();
        assert_eq!(types, ["a", "b", "c"]);
        d.write(
            "net.conflist",
            r#"{"cniVersion":"1.1.0","name":"net","loadOnlyInlinedPlugins":true,"plugins":[{"type":"a"}]}"#,
        );
        assert_eq!(load(&d.0, "net").unwrap().plugins.len(), 1);
        d.write("net.conflist", r#"{"cniVersion":"1.1.0","name":"net"}"#);
        assert_eq!(load(&d.0, "net").unwrap().plugins.len(), 2);
    }

    #[test]
    fn version_choice() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(choose_version("0.4.0", None).unwrap(), "0.4.0");
        assert_eq!(choose_version("", None).unwrap(), "");
        assert_eq!(choose_version("0.4.0", Some(&s(&["1.0.0", "1.1.0", "2.0.0"]))).unwrap(), "1.1.0");
        assert_eq!(choose_version("1.0.0", Some(&s(&["0.3.1", "0.4.0"]))).unwrap(), "1.0.0");
        assert_eq!(choose_version("", Some(&s(&["0.3.1", "1.0.0", "0.4.0"]))).unwrap(), "1.0.0");
        // Nothing we speak: cniVersion stays as written.
        assert_eq!(choose_version("", Some(&s(&["2.0.0", "1.5.0"]))).unwrap(), "");
        assert_eq!(choose_version("3.0.0", Some(&s(&["2.0.0"]))).unwrap(), "3.0.0");
        assert_eq!(choose_version("1.0.0", Some(&[])).unwrap(), "1.0.0");
        assert!(choose_version("1.0.0", Some(&s(&["1.0.x"]))).is_err());
        assert!(choose_version("one", Some(&s(&["1.0.0"]))).is_err());

        let l = list_from_bytes(
            br#"{"cniVersion":"1.0.0","cniVersions":["0.4.0","1.1.0"],"name":"n","plugins":[{"type":"x"}]}"#,
        )
        .unwrap();
        assert_eq!(l.cni_version, "1.1.0");
        assert_eq!(l.version().unwrap(), Version::V1_1_0);
        let l = list_from_bytes(br#"{"name":"n","plugins":[{"type":"x"}]}"#).unwrap();
        assert_eq!(l.version().unwrap(), Version::V0_1_0);
        let l = list_from_bytes(br#"{"cniVersion":"0.5.0","name":"n","plugins":[{"type":"x"}]}"#).unwrap();
        assert_eq!(l.version().unwrap_err().code, 1);
        assert!(list_from_bytes(br#"{"cniVersions":"1.0.0","name":"n","plugins":[{"type":"x"}]}"#).is_err());
    }

    #[test]
    fn files_are_read_bounded_and_never_waited_on() {
        let d = TempDir::new("bounded");
        let fifo = d.0.join("10-fifo.conflist");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // returns at once: the open does not wait for a writer
        let e = list_from_file(&fifo).unwrap_err();
        assert_eq!(e.code, 5);
        assert!(e.msg.contains("not a regular file"), "{}", e.msg);
        let huge = d.0.join("20-huge.conflist");
        fs::write(&huge, vec![b' '; FILE_MAX + 1]).unwrap();
        let e = list_from_file(&huge).unwrap_err();
        assert!(e.msg.contains("larger than 8388608 bytes"), "{}", e.msg);
        fs::write(&huge, vec![b' '; FILE_MAX]).unwrap();
        assert_eq!(read_bounded(&huge).unwrap().len(), FILE_MAX);
        assert!(list_from_file(&d.0).unwrap_err().msg.contains("not a regular file"));
    }
}
