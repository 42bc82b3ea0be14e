//! The verbs, as libcni's `AddNetworkList`, `CheckNetworkList`, `DelNetworkList`,
//! `GCNetworkList` and `GetStatusNetworkList` run them, and the per-plugin configuration
//! libcni derives (`buildOneConfig`, `injectRuntimeConfig`, `InjectConf`).

use crate::cache::{self, CacheEntry};
use crate::conf::{NetConfList, PluginConf};
use crate::rt::{cache_file, RuntimeConf};
use cni_common::spec::config::{validate_plugin_type, Attachment};
use cni_common::spec::env::{validate_container_id, validate_ifname, validate_network_name, Command};
use cni_common::spec::result::CniResult;
use cni_common::{code, CniError, Result};
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// The environment a plugin is run with (on top of ours), as libcni's `invoke.Args` sets it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginEnv {
    pub command: Command,
    pub container_id: String,
    pub netns: String,
    pub args: String,
    pub ifname: String,
    pub path: String,
}

impl PluginEnv {
    /// Every CNI_* variable except CNI_COMMAND (which the executor sets itself).
    pub fn vars(&self) -> [(&'static str, &str); 5] {
        [
            ("CNI_CONTAINERID", &self.container_id),
            ("CNI_NETNS", &self.netns),
            ("CNI_ARGS", &self.args),
            ("CNI_IFNAME", &self.ifname),
            ("CNI_PATH", &self.path),
        ]
    }
}

/// Finding and running plugin binaries; tests substitute a fake.
pub trait Exec {
    fn find(&self, plugin_type: &str, cni_path: &str) -> Result<PathBuf>;
    /// Run `plugin` with `env` and `stdin`; stdout on success, the plugin's error otherwise.
    fn run(&mut self, plugin: &Path, env: &PluginEnv, stdin: &[u8]) -> Result<Vec<u8>>;
}

/// Real plugins on disk, through `cni_common::delegate`.
pub struct SystemExec;

impl Exec for SystemExec {
    fn find(&self, plugin_type: &str, cni_path: &str) -> Result<PathBuf> {
        validate_plugin_type("type", plugin_type)?;
        cni_common::delegate::find_in_path(plugin_type, cni_path)
    }

    fn run(&mut self, plugin: &Path, env: &PluginEnv, stdin: &[u8]) -> Result<Vec<u8>> {
        // Our environment with CNI_COMMAND and the rest of libcni's variables set on top.
        // Under cnitool's deadline (cni_common::child::Use::Runner): past it the plugin is
        // killed and the verb fails with code 11.
        let runner = cni_common::child::Use::Runner;
        cni_common::delegate::spawn_plugin(plugin, env.command, &env.vars(), stdin, runner)?.wait()
    }
}

/// libcni's `injectRuntimeConfig`: the capability args whose names the plugin declares with
/// `true`, in the order the plugin declares them.
pub fn runtime_config(plugin: &PluginConf, cap_args: Option<&Map<String, Value>>) -> Map<String, Value> {
    let mut rc = Map::new();
    let Some(args) = cap_args else { return rc };
    for (cap, enabled) in &plugin.capabilities {
        if !enabled {
            continue;
        }
        if let Some(v) = args.get(cap) {
            rc.insert(cap.clone(), v.clone());
        }
    }
    rc
}

/// libcni's `buildOneConfig`: the plugin object with `name` and `cniVersion` set (replaced in
/// place when present, appended otherwise), `prevResult` when there is one, and
/// `runtimeConfig` when any capability arg applies (replacing one written in the file).
/// Everything else is passed through unchanged, in order.
pub fn build_one_config(
    list: &NetConfList,
    plugin: &PluginConf,
    prev_result: Option<&Value>,
    rt: &RuntimeConf,
) -> Map<String, Value> {
    let mut conf = plugin.raw.clone();
    conf.insert("name".into(), list.name.clone().into());
    conf.insert("cniVersion".into(), list.cni_version.clone().into());
    if let Some(prev) = prev_result {
        conf.insert("prevResult".into(), prev.clone());
    }
    let rc = runtime_config(plugin, rt.capability_args.as_ref());
    if !rc.is_empty() {
        conf.insert("runtimeConfig".into(), Value::Object(rc));
    }
    conf
}

/// The GC configuration of one plugin: `name`, `cniVersion` and the valid attachments under
/// both keys libcni sends (`cni.dev/valid-attachments` and the legacy `cni.dev/attachments`).
pub fn gc_config(list: &NetConfList, plugin: &PluginConf, valid: &[Attachment]) -> Map<String, Value> {
    let mut conf = plugin.raw.clone();
    conf.insert("name".into(), list.name.clone().into());
    conf.insert("cniVersion".into(), list.cni_version.clone().into());
    let entries: Vec<Value> = valid
        .iter()
        .map(|a| {
            let mut m = Map::new();
            m.insert("containerID".into(), a.container_id.clone().into());
            m.insert("ifname".into(), a.ifname.clone().into());
            Value::Object(m)
        })
        .collect();
    conf.insert("cni.dev/valid-attachments".into(), Value::Array(entries.clone()));
    conf.insert("cni.dev/attachments".into(), Value::Array(entries));
    conf
}

/// The STATUS configuration of one plugin: `name` and `cniVersion` injected.
pub fn status_config(list: &NetConfList, plugin: &PluginConf) -> Map<String, Value> {
    let mut conf = plugin.raw.clone();
    conf.insert("name".into(), list.name.clone().into());
    conf.insert("cniVersion".into(), list.cni_version.clone().into());
    conf
}

/// libcni's `pluginDescription`: `type="bridge" name="x"`.
fn describe(p: &PluginConf) -> String {
    let mut s = format!("type={:?}", p.plugin_type);
    if !p.name.is_empty() {
        s.push_str(&format!(" name={:?}", p.name));
    }
    s
}

/// Wrap an error of one plugin: `plugin type="x" failed (add): msg; details (CNI error code N)`.
/// The code is kept; details are folded into the message so nothing is lost when printed.
fn plugin_failed(p: &PluginConf, verb: &str, e: CniError) -> CniError {
    let mut msg = format!("plugin {} failed ({verb}): {}", describe(p), e.msg);
    if !e.details.is_empty() {
        msg.push_str(&format!("; {}", e.details));
    }
    msg.push_str(&format!(" (CNI error code {})", e.code));
    CniError::new(e.code, msg)
}

/// Runs verbs against one cache directory and CNI_PATH.
pub struct Runner<E: Exec> {
    pub exec: E,
    pub cni_path: String,
    pub cache_dir: PathBuf,
}

impl<E: Exec> Runner<E> {
    fn env(&self, command: Command, rt: &RuntimeConf) -> PluginEnv {
        PluginEnv {
            command,
            container_id: rt.container_id.clone(),
            netns: rt.netns.clone(),
            args: rt.args_string(),
            ifname: rt.ifname.clone(),
            path: self.cni_path.clone(),
        }
    }

    fn invoke(
        &mut self,
        plugin: &PluginConf,
        verb: &str,
        env: &PluginEnv,
        conf: Map<String, Value>,
    ) -> Result<Vec<u8>> {
        let path = self
            .exec
            .find(&plugin.plugin_type, &self.cni_path)
            .map_err(|e| plugin_failed(plugin, verb, e))?;
        let stdin = serde_json::to_vec(&Value::Object(conf)).expect("a Value always serializes");
        self.exec.run(&path, env, &stdin).map_err(|e| plugin_failed(plugin, verb, e))
    }

    fn validate_attachment(list: &NetConfList, rt: &RuntimeConf) -> Result<()> {
        validate_container_id(&rt.container_id)?;
        validate_network_name(&list.name)?;
        validate_ifname(&rt.ifname)
    }

    /// ADD: every plugin in order, each result the next one's prevResult; the final result is
    /// cached and returned (encoded in the list's version). A failing plugin stops the chain
    /// without rolling back what earlier plugins did (as libcni; run DEL to clean up).
    pub fn add(&mut self, list: &NetConfList, rt: &RuntimeConf) -> Result<Value> {
        let version = list.version()?;
        Self::validate_attachment(list, rt)?;
        let env = self.env(Command::Add, rt);
        let mut prev: Option<Value> = None;
        for plugin in &list.plugins {
            let conf = build_one_config(list, plugin, prev.as_ref(), rt);
            let out = self.invoke(plugin, "add", &env, conf)?;
            let value: Value = serde_json::from_slice(&out).map_err(|e| {
                plugin_failed(
                    plugin,
                    "add",
                    CniError::decode(format!(
                        "failed to unmarshal raw result: {e}: {:?}",
                        String::from_utf8_lossy(&out)
                    )),
                )
            })?;
            // A result without cniVersion is taken to be in the config's version (libcni).
            let value = if value.is_null() { Value::Object(Map::new()) } else { value };
            let result = CniResult::decode(&value, version).map_err(|e| plugin_failed(plugin, "add", e))?;
            prev = Some(cache::encode_result(&result, version).map_err(|e| plugin_failed(plugin, "add", e))?);
        }
        let result =
            prev.ok_or_else(|| CniError::config(format!("network {:?} has no plugins", list.name)))?;
        let entry = CacheEntry {
            container_id: rt.container_id.clone(),
            config: list.bytes.clone(),
            if_name: rt.ifname.clone(),
            network_name: list.name.clone(),
            netns: rt.netns.clone(),
            cni_args: rt.args.clone(),
            capability_args: rt.capability_args.clone(),
            result: result.as_object().cloned(),
        };
        let path = cache_file(&self.cache_dir, &list.name, rt)?;
        cache::write(&path, &entry)
            .map_err(|e| e.context(format!("failed to set network {:?} cached result", list.name)))?;
        Ok(result)
    }

    /// CHECK: needs a list version >= 0.4.0 and the cached ADD result, which every plugin
    /// gets as prevResult, in order. `disableCheck` makes it a no-op.
    pub fn check(&mut self, list: &NetConfList, rt: &RuntimeConf) -> Result<()> {
        let version = list.version()?;
        if !version.has_check() {
            return Err(CniError::new(
                code::INCOMPATIBLE_VERSION,
                format!("configuration version {:?} does not support the CHECK command", list.cni_version),
            ));
        }
        if list.disable_check {
            return Ok(());
        }
        Self::validate_attachment(list, rt)?;
        let path = cache_file(&self.cache_dir, &list.name, rt)?;
        let cached = cache::read_result(&path, version)
            .map_err(|e| e.context(format!("failed to get network {:?} cached result", list.name)))?
            .ok_or_else(|| {
                CniError::new(
                    code::UNKNOWN_CONTAINER,
                    format!(
                        "no cached result for network {:?}, container {:?}, interface {:?} (looked for {}): run add first",
                        list.name,
                        rt.container_id,
                        rt.ifname,
                        path.display()
                    ),
                )
            })?;
        let env = self.env(Command::Check, rt);
        for plugin in &list.plugins {
            let conf = build_one_config(list, plugin, Some(&cached), rt);
            self.invoke(plugin, "check", &env, conf)?;
        }
        Ok(())
    }

    /// DEL: every plugin in reverse order, with the cached result as prevResult from 0.4.0 on
    /// (no cache is fine; an unreadable one is dropped), then the cache file is removed.
    /// Running it again succeeds as long as the plugins' DEL is idempotent.
    pub fn del(&mut self, list: &NetConfList, rt: &RuntimeConf) -> Result<()> {
        let version = list.version()?;
        Self::validate_attachment(list, rt)?;
        let path = cache_file(&self.cache_dir, &list.name, rt)?;
        let cached = if version.has_check() {
            match cache::read_result(&path, version) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("cnitool: ignoring unusable cached result: {e}");
                    let _ = cache::remove(&path);
                    None
                }
            }
        } else {
            None
        };
        let env = self.env(Command::Del, rt);
        for plugin in list.plugins.iter().rev() {
            let conf = build_one_config(list, plugin, cached.as_ref(), rt);
            self.invoke(plugin, "delete", &env, conf)?;
        }
        cache::remove(&path)
    }

    /// GC: DEL every cached attachment of this network that is not in `valid` (with the
    /// CNI_ARGS, capability args and netns recorded at ADD), then, from version 1.1.0 on, send
    /// GC with the valid list to every plugin. Errors are collected. `disableGC` makes it a
    /// no-op.
    pub fn gc(&mut self, list: &NetConfList, valid: &[Attachment]) -> Result<()> {
        let version = list.version()?;
        if list.disable_gc {
            return Ok(());
        }
        let mut errs: Vec<String> = Vec::new();
        for (_, entry) in cache::attachments(&self.cache_dir)? {
            if entry.network_name != list.name {
                continue;
            }
            let key = Attachment { container_id: entry.container_id.clone(), ifname: entry.if_name.clone() };
            if valid.contains(&key) {
                continue;
            }
            let rt = RuntimeConf {
                container_id: entry.container_id,
                netns: entry.netns,
                ifname: entry.if_name,
                args: entry.cni_args,
                capability_args: entry.capability_args,
            };
            if let Err(e) = self.del(list, &rt) {
                errs.push(format!(
                    "failed to delete stale attachment {} {}: {}",
                    rt.container_id, rt.ifname, e.msg
                ));
            }
        }
        if version.has_gc_and_status() {
            let env = self.env(Command::Gc, &RuntimeConf::default());
            for plugin in &list.plugins {
                let conf = gc_config(list, plugin, valid);
                if let Err(e) = self.invoke(plugin, "gc", &env, conf) {
                    errs.push(e.msg);
                }
            }
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(CniError::internal(errs.join("\n")))
        }
    }

    /// STATUS: from version 1.1.0 on, every plugin in order; the first failure is the answer.
    /// Older versions have no STATUS and succeed (as libcni).
    pub fn status(&mut self, list: &NetConfList) -> Result<()> {
        let version = list.version()?;
        if !version.has_gc_and_status() {
            return Ok(());
        }
        let env = self.env(Command::Status, &RuntimeConf::default());
        for plugin in &list.plugins {
            let conf = status_config(list, plugin);
            self.invoke(plugin, "status", &env, conf)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conf::list_from_bytes;
    use serde_json::json;

    /// A fake plugin host: records every call and answers from a script.
    #[derive(Default)]
    struct Fake {
        calls: Vec<(String, PluginEnv, Value)>,
        /// plugin type -> error to fail with
        fail: Vec<(String, Command, CniError)>,
    }

    impl Exec for Fake {
        fn find(&self, plugin_type: &str, _cni_path: &str) -> Result<PathBuf> {
            if plugin_type == "missing" {
                return Err(CniError::config("failed to find plugin \"missing\" in path [/x]"));
            }
            Ok(PathBuf::from(format!("/fake/{plugin_type}")))
        }
        fn run(&mut self, plugin: &Path, env: &PluginEnv, stdin: &[u8]) -> Result<Vec<u8>> {
            let name = plugin.file_name().unwrap().to_str().unwrap().to_string();
            let conf: Value = serde_json::from_slice(stdin).unwrap();
            self.calls.push((name.clone(), env.clone(), conf.clone()));
            if let Some((_, _, e)) = self.fail.iter().find(|(t, c, _)| *t == name && *c == env.command) {
                return Err(e.clone());
            }
            if env.command != Command::Add {
                return Ok(Vec::new());
            }
            // Each plugin adds one interface to what it got.
            let mut result =
                conf.get("prevResult").cloned().unwrap_or(json!({"cniVersion": conf["cniVersion"]}));
            let mut ifs = result.get("interfaces").cloned().unwrap_or(json!([]));
            ifs.as_array_mut().unwrap().push(json!({"name": name}));
            result["interfaces"] = ifs;
            Ok(serde_json::to_vec(&result).unwrap())
        }
    }

    struct Dir(PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn runner(tag: &str) -> (Runner<Fake>, Dir) {
        let d = std::env::temp_dir().join(format!("cnitool-runner-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        (Runner { exec: Fake::default(), cni_path: "/opt/cni/bin".into(), cache_dir: d.clone() }, Dir(d))
    }

    const LIST: &str = r#"{"cniVersion":"1.1.0","name":"net","plugins":[
        {"type":"first","zz":1,"capabilities":{"portMappings":true,"mac":false,"ips":true}},
        {"type":"second","name":"sec","runtimeConfig":{"keep":"me"},"cniVersion":"0.1.0"}]}"#;

    fn rt() -> RuntimeConf {
        RuntimeConf {
            container_id: "c1".into(),
            netns: "/run/netns/x".into(),
            ifname: "eth0".into(),
            args: vec![("A".into(), "1".into())],
            capability_args: Some(
                json!({"mac": "aa", "portMappings": [{"hostPort": 80}], "other": 1})
                    .as_object()
                    .unwrap()
                    .clone(),
            ),
        }
    }

    #[test]
    fn runtime_config_is_the_intersection() {
        let list = list_from_bytes(LIST.as_bytes()).unwrap();
        let rc = runtime_config(&list.plugins[0], rt().capability_args.as_ref());
        assert_eq!(Value::Object(rc), json!({"portMappings": [{"hostPort": 80}]}));
        assert!(runtime_config(&list.plugins[1], rt().capability_args.as_ref()).is_empty());
        assert!(runtime_config(&list.plugins[0], None).is_empty());
    }

    #[test]
    fn build_config_injects_and_keeps_order() {
        let list = list_from_bytes(LIST.as_bytes()).unwrap();
        let c = build_one_config(&list, &list.plugins[0], None, &rt());
        let keys: Vec<&str> = c.keys().map(String::as_str).collect();
        assert_eq!(keys, ["type", "zz", "capabilities", "name", "cniVersion", "runtimeConfig"]);
        assert!(!c.contains_key("prevResult"));
        assert_eq!(c["capabilities"]["mac"], false, "capabilities pass through");

        let prev = json!({"cniVersion": "1.1.0", "interfaces": [{"name": "first"}]});
        let c = build_one_config(&list, &list.plugins[1], Some(&prev), &rt());
        let keys: Vec<&str> = c.keys().map(String::as_str).collect();
        assert_eq!(keys, ["type", "name", "runtimeConfig", "cniVersion", "prevResult"]);
        assert_eq!(c["name"], "net", "the list name replaces the plugin's");
        assert_eq!(c["cniVersion"], "1.1.0");
        assert_eq!(c["runtimeConfig"], json!({"keep": "me"}), "no capability applies: file value stays");
        assert_eq!(c["prevResult"], prev);

        let g = gc_config(
            &list,
            &list.plugins[1],
            &[Attachment { container_id: "c".into(), ifname: "e".into() }],
        );
        assert_eq!(g["cni.dev/valid-attachments"], json!([{"containerID": "c", "ifname": "e"}]));
        assert_eq!(g["cni.dev/attachments"], g["cni.dev/valid-attachments"]);
        assert!(!g.contains_key("prevResult"));
        let g = gc_config(&list, &list.plugins[0], &[]);
        assert_eq!(g["cni.dev/valid-attachments"], json!([]));
        assert!(!g.contains_key("runtimeConfig"));
        let s = status_config(&list, &list.plugins[1]);
        assert_eq!((s["name"].as_str(), s["cniVersion"].as_str()), (Some("net"), Some("1.1.0")));
    }

    #[test]
    fn add_chains_caches_and_del_reverses() {
        let (mut r, _d) = runner("add");
        let list = list_from_bytes(LIST.as_bytes()).unwrap();
        let res = r.add(&list, &rt()).unwrap();
        assert_eq!(
            res,
            json!({"cniVersion": "1.1.0", "interfaces": [{"name": "first"}, {"name": "second"}]})
        );
        let calls = std::mem::take(&mut r.exec.calls);
        assert_eq!(calls.len(), 2);
        assert!(calls[0].2.get("prevResult").is_none());
        assert_eq!(calls[1].2["prevResult"]["interfaces"], json!([{"name": "first"}]));
        let env = &calls[0].1;
        assert_eq!(
            (
                env.command,
                env.container_id.as_str(),
                env.netns.as_str(),
                env.ifname.as_str(),
                env.args.as_str()
            ),
            (Command::Add, "c1", "/run/netns/x", "eth0", "A=1")
        );
        assert_eq!(env.path, "/opt/cni/bin");

        let path = r.cache_dir.join("results/net-c1-eth0");
        let entry = CacheEntry::from_json(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(entry.config, LIST.as_bytes());
        assert_eq!(Value::Object(entry.result.clone().unwrap()), res);
        assert_eq!(entry.cni_args, vec![("A".to_string(), "1".to_string())]);
        assert_eq!(entry.netns, "/run/netns/x");

        r.check(&list, &rt()).unwrap();
        let calls = std::mem::take(&mut r.exec.calls);
        let order: Vec<&str> = calls.iter().map(|c| c.0.as_str()).collect();
        assert_eq!(order, ["first", "second"]);
        assert!(calls.iter().all(|c| c.2["prevResult"] == res && c.1.command == Command::Check));

        r.del(&list, &rt()).unwrap();
        let calls = std::mem::take(&mut r.exec.calls);
        let order: Vec<&str> = calls.iter().map(|c| c.0.as_str()).collect();
        assert_eq!(order, ["second", "first"]);
        assert!(calls.iter().all(|c| c.2["prevResult"] == res));
        assert!(!path.exists());

        // Again: no cache, no prevResult, still fine.
        r.del(&list, &rt()).unwrap();
        assert!(r.exec.calls.iter().all(|c| c.2.get("prevResult").is_none()));
        // CHECK without a cached result is refused before any plugin runs.
        r.exec.calls.clear();
        let e = r.check(&list, &rt()).unwrap_err();
        assert!(e.msg.contains("no cached result"), "{}", e.msg);
        assert!(r.exec.calls.is_empty());
    }

    #[test]
    fn add_failure_stops_without_rollback() {
        let (mut r, _d) = runner("addfail");
        r.exec.fail.push((
            "second".into(),
            Command::Add,
            CniError::new(7, "bad config").with_details("field x"),
        ));
        let list = list_from_bytes(LIST.as_bytes()).unwrap();
        let e = r.add(&list, &rt()).unwrap_err();
        assert_eq!(e.code, 7);
        assert_eq!(
            e.msg,
            "plugin type=\"second\" name=\"sec\" failed (add): bad config; field x (CNI error code 7)"
        );
        assert_eq!(r.exec.calls.len(), 2, "no DEL was issued");
        assert!(!r.cache_dir.join("results/net-c1-eth0").exists());
    }

    #[test]
    fn version_gates() {
        let (mut r, _d) = runner("gates");
        let old =
            list_from_bytes(br#"{"cniVersion":"0.3.1","name":"net","plugins":[{"type":"a"}]}"#).unwrap();
        let e = r.check(&old, &rt()).unwrap_err();
        assert_eq!(e.msg, "configuration version \"0.3.1\" does not support the CHECK command");
        r.status(&old).unwrap();
        assert!(r.exec.calls.is_empty(), "no STATUS below 1.1.0");
        // DEL below 0.4.0 sends no prevResult even with a cache.
        r.add(&old, &rt()).unwrap();
        r.exec.calls.clear();
        r.del(&old, &rt()).unwrap();
        assert!(r.exec.calls[0].2.get("prevResult").is_none());

        let off = list_from_bytes(
            br#"{"cniVersion":"1.1.0","name":"net","disableCheck":true,"disableGC":true,"plugins":[{"type":"a"}]}"#,
        )
        .unwrap();
        r.exec.calls.clear();
        r.check(&off, &rt()).unwrap();
        r.gc(&off, &[]).unwrap();
        assert!(r.exec.calls.is_empty());
    }

    #[test]
    fn gc_deletes_stale_attachments_then_sends_gc() {
        let (mut r, _d) = runner("gc");
        let list = list_from_bytes(LIST.as_bytes()).unwrap();
        let other =
            list_from_bytes(br#"{"cniVersion":"1.1.0","name":"other","plugins":[{"type":"o"}]}"#).unwrap();
        let mut keep = rt();
        keep.container_id = "keep".into();
        r.add(&list, &rt()).unwrap();
        r.add(&list, &keep).unwrap();
        r.add(&other, &rt()).unwrap();
        r.exec.calls.clear();

        let valid = [Attachment { container_id: "keep".into(), ifname: "eth0".into() }];
        r.gc(&list, &valid).unwrap();
        let calls = std::mem::take(&mut r.exec.calls);
        let seen: Vec<(String, Command, String)> =
            calls.iter().map(|c| (c.0.clone(), c.1.command, c.1.container_id.clone())).collect();
        assert_eq!(
            seen,
            [
                ("second".to_string(), Command::Del, "c1".to_string()),
                ("first".to_string(), Command::Del, "c1".to_string()),
                ("first".to_string(), Command::Gc, String::new()),
                ("second".to_string(), Command::Gc, String::new()),
            ]
        );
        // The stale DEL used what was recorded at ADD.
        assert_eq!(calls[0].1.args, "A=1");
        assert_eq!(calls[1].2["runtimeConfig"]["portMappings"], json!([{"hostPort": 80}]));
        assert_eq!(
            calls[2].2["cni.dev/valid-attachments"],
            json!([{"containerID": "keep", "ifname": "eth0"}])
        );
        assert_eq!(calls[2].2["cni.dev/attachments"], json!([{"containerID": "keep", "ifname": "eth0"}]));
        assert_eq!(calls[2].1.path, "/opt/cni/bin");
        assert!(!r.cache_dir.join("results/net-c1-eth0").exists());
        assert!(r.cache_dir.join("results/net-keep-eth0").exists());
        assert!(r.cache_dir.join("results/other-c1-eth0").exists(), "other networks are untouched");

        // Default (no keep list): everything of the network is garbage; errors are collected.
        r.exec.fail.push(("first".into(), Command::Gc, CniError::new(11, "busy")));
        let e = r.gc(&list, &[]).unwrap_err();
        assert!(e.msg.contains("plugin type=\"first\" failed (gc): busy"), "{}", e.msg);
        assert!(!r.cache_dir.join("results/net-keep-eth0").exists());
        let gcs: Vec<&str> =
            r.exec.calls.iter().filter(|c| c.1.command == Command::Gc).map(|c| c.0.as_str()).collect();
        assert_eq!(gcs, ["first", "second"], "a failing GC does not stop the others");
    }

    #[test]
    fn status_stops_at_first_failure() {
        let (mut r, _d) = runner("status");
        let list = list_from_bytes(LIST.as_bytes()).unwrap();
        r.status(&list).unwrap();
        assert_eq!(r.exec.calls.len(), 2);
        assert_eq!(r.exec.calls[0].1.container_id, "");
        r.exec.calls.clear();
        r.exec.fail.push(("first".into(), Command::Status, CniError::new(50, "no addresses left")));
        let e = r.status(&list).unwrap_err();
        assert_eq!(e.code, 50);
        assert_eq!(r.exec.calls.len(), 1);
    }

    #[test]
    fn missing_plugin_and_bad_identifiers() {
        let (mut r, _d) = runner("missing");
        let list = list_from_bytes(br#"{"cniVersion":"1.0.0","name":"net","plugins":[{"type":"missing"}]}"#)
            .unwrap();
        let e = r.add(&list, &rt()).unwrap_err();
        assert!(e.msg.contains("failed to find plugin"), "{}", e.msg);
        let bad =
            list_from_bytes(br#"{"cniVersion":"1.0.0","name":"../x","plugins":[{"type":"a"}]}"#).unwrap();
        assert_eq!(r.add(&bad, &rt()).unwrap_err().code, 7);
        assert_eq!(r.del(&bad, &rt()).unwrap_err().code, 7);
    }
}
