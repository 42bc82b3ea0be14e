//! Running a network configuration list the way a runtime does (libcni semantics), for the
//! end-to-end, churn, crash and benchmark code: ADD in order with prevResult, DEL in reverse
//! with the final result, `runtimeConfig` built from each plugin's declared capabilities.

use crate::{Exec, Netns, PluginOutput};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A conflist plus where its plugins are.
#[derive(Clone, Debug)]
pub struct Chain {
    pub name: String,
    pub version: String,
    pub plugins: Vec<Value>,
    pub cni_path: PathBuf,
}

/// One plugin exec inside a chain.
#[derive(Debug)]
pub struct Step {
    pub plugin: String,
    pub out: PluginOutput,
    pub elapsed: Duration,
}

impl Chain {
    /// The kubenet-style `cbr0` list: bridge (+host-local), portmap, bandwidth.
    pub fn kubenet(
        name: &str,
        version: &str,
        bridge: &str,
        subnet: &str,
        data_dir: &str,
        cni_path: &Path,
    ) -> Chain {
        Chain {
            name: name.into(),
            version: version.into(),
            plugins: vec![
                json!({"type": "bridge", "bridge": bridge, "isGateway": true, "ipMasq": false,
                       "hairpinMode": true, "mtu": 1460,
                       "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]],
                                "routes": [{"dst": "0.0.0.0/0"}], "dataDir": data_dir}}),
                json!({"type": "portmap", "capabilities": {"portMappings": true}, "snat": true}),
                json!({"type": "bandwidth", "capabilities": {"bandwidth": true}}),
            ],
            cni_path: cni_path.to_path_buf(),
        }
    }

    /// The stdin for plugin `i`: its config with name, cniVersion, runtimeConfig (declared
    /// capabilities only, as libcni) and prevResult injected.
    pub fn request(&self, i: usize, caps: &Value, prev: Option<&Value>) -> String {
        let mut c = self.plugins[i].clone();
        c["cniVersion"] = json!(self.version);
        c["name"] = json!(self.name);
        let mut rc = serde_json::Map::new();
        if let (Some(declared), Some(given)) =
            (c.get("capabilities").and_then(Value::as_object), caps.as_object())
        {
            for (k, on) in declared {
                if on == &json!(true) {
                    if let Some(v) = given.get(k) {
                        rc.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        if !rc.is_empty() {
            c["runtimeConfig"] = Value::Object(rc);
        }
        if let Some(p) = prev {
            c["prevResult"] = p.clone();
        }
        c.to_string()
    }

    pub fn plugin_type(&self, i: usize) -> &str {
        self.plugins[i]["type"].as_str().expect("plugin type")
    }

    /// Exec plugin `i` with `cmd`.
    #[allow(clippy::too_many_arguments)]
    pub fn exec(
        &self,
        i: usize,
        cmd: &str,
        id: &str,
        netns: &str,
        ifname: &str,
        caps: &Value,
        prev: Option<&Value>,
        host: Option<&Netns>,
    ) -> Step {
        let plugin = self.plugin_type(i).to_string();
        let path = self.cni_path.join(&plugin);
        let mut e = Exec::new(path.to_str().expect("utf-8 path")).attachment(
            cmd,
            id,
            netns,
            ifname,
            self.cni_path.to_str().expect("utf-8 path"),
        );
        if let Some(h) = host {
            e = e.in_ns(h);
        }
        let stdin = self.request(i, caps, prev);
        let t = Instant::now();
        let out = e.run(&stdin);
        Step { plugin, out, elapsed: t.elapsed() }
    }

    /// ADD through the whole list. Ok(final result, steps) or Err(steps so far, the last
    /// one being the failure).
    pub fn add(
        &self,
        id: &str,
        netns: &str,
        ifname: &str,
        caps: &Value,
        host: Option<&Netns>,
    ) -> Result<(Value, Vec<Step>), Vec<Step>> {
        let mut prev: Option<Value> = None;
        let mut steps = Vec::new();
        for i in 0..self.plugins.len() {
            let s = self.exec(i, "ADD", id, netns, ifname, caps, prev.as_ref(), host);
            if s.out.code != 0 {
                steps.push(s);
                return Err(steps);
            }
            prev = Some(s.out.json());
            steps.push(s);
        }
        Ok((prev.expect("at least one plugin"), steps))
    }

    /// DEL in reverse order with `prev` (the cached final result, or None after a failed ADD).
    /// Panics on the first failure: DEL must not fail.
    pub fn del(
        &self,
        id: &str,
        netns: &str,
        ifname: &str,
        caps: &Value,
        prev: Option<&Value>,
        host: Option<&Netns>,
    ) -> Vec<Step> {
        let mut steps = Vec::new();
        for i in (0..self.plugins.len()).rev() {
            let s = self.exec(i, "DEL", id, netns, ifname, caps, prev, host);
            assert_eq!(s.out.code, 0, "DEL {} failed: {}{}", s.plugin, s.out.stdout, s.out.stderr);
            steps.push(s);
        }
        steps
    }

    /// CHECK through the whole list in order, each plugin with the cached final result as
    /// prevResult (libcni's `CheckNetworkList`). Every step, whether it failed or not.
    pub fn check(
        &self,
        id: &str,
        netns: &str,
        ifname: &str,
        caps: &Value,
        result: &Value,
        host: Option<&Netns>,
    ) -> Vec<Step> {
        (0..self.plugins.len())
            .map(|i| self.exec(i, "CHECK", id, netns, ifname, caps, Some(result), host))
            .collect()
    }

    /// GC on every plugin with the given valid attachments. Panics naming the plugin that
    /// failed.
    pub fn gc(&self, valid: &[(&str, &str)], host: Option<&Netns>) {
        for s in self.try_gc(valid, host) {
            assert_eq!(s.out.code, 0, "GC {} failed: {}{}", s.plugin, s.out.stdout, s.out.stderr);
        }
    }

    /// GC on every plugin with the given valid attachments: every step, whether it failed or
    /// not.
    pub fn try_gc(&self, valid: &[(&str, &str)], host: Option<&Netns>) -> Vec<Step> {
        let list: Vec<Value> = valid.iter().map(|(c, i)| json!({"containerID": c, "ifname": i})).collect();
        let mut steps = Vec::new();
        for i in 0..self.plugins.len() {
            let mut c = self.plugins[i].clone();
            c["cniVersion"] = json!("1.1.0");
            c["name"] = json!(self.name);
            c["cni.dev/valid-attachments"] = json!(list);
            c["cni.dev/attachments"] = json!(list);
            let path = self.cni_path.join(self.plugin_type(i));
            let mut e = Exec::new(path.to_str().unwrap())
                .env("CNI_COMMAND", "GC")
                .env("CNI_PATH", self.cni_path.to_str().unwrap());
            if let Some(h) = host {
                e = e.in_ns(h);
            }
            let t = Instant::now();
            let out = e.run(&c.to_string());
            steps.push(Step { plugin: self.plugin_type(i).to_string(), out, elapsed: t.elapsed() });
        }
        steps
    }
}
