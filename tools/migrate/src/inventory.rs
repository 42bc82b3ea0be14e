//! What the node knows about its attachments besides the kernel: libcni's attachment cache
//! (`<cacheDir>/results/<net>-<id>-<ifname>`: the configuration list, the capability arguments
//! such as `portMappings`, the result) and host-local's stores (`<dataDir>/<net>/<ip>` holding
//! `<id>\r\n<ifname>`). Both are only read.

use cni_common::spec::result::CniResult;
use cni_common::spec::Version;
use serde_json::{json, Map, Value};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// One attachment from libcni's cache.
#[derive(Debug, Clone)]
pub struct Cached {
    /// The cache file.
    pub path: PathBuf,
    pub network: String,
    pub container_id: String,
    pub ifname: String,
    pub netns: String,
    pub version: String,
    /// The plugin objects of the configuration (a single-plugin configuration is a list of one).
    pub plugins: Vec<Value>,
    pub caps: Map<String, Value>,
    pub result: Option<CniResult>,
    /// The result as cached (in the configuration's version), what libcni hands the plugins as
    /// prevResult for CHECK.
    pub result_json: Option<Value>,
}

impl Cached {
    /// The configuration libcni gives plugin `ty` (first of that type): its object with `name`,
    /// `cniVersion` and `runtimeConfig` for the capabilities it declares.
    pub fn plugin_config(&self, ty: &str) -> Option<Value> {
        let p = self.plugins.iter().find(|p| p["type"] == ty)?;
        let mut c = p.clone();
        c["name"] = json!(self.network);
        c["cniVersion"] = json!(self.version);
        let mut rc = Map::new();
        if let Some(declared) = p.get("capabilities").and_then(Value::as_object) {
            for (k, on) in declared {
                if on == &json!(true) {
                    if let Some(v) = self.caps.get(k) {
                        rc.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        if !rc.is_empty() {
            c["runtimeConfig"] = Value::Object(rc);
        }
        Some(c)
    }

    /// The sandbox path: the cache's `netns`, else the container interface's sandbox in the
    /// result.
    pub fn sandbox(&self) -> Option<String> {
        if !self.netns.is_empty() {
            return Some(self.netns.clone());
        }
        self.result
            .as_ref()?
            .interfaces
            .iter()
            .find(|i| i.name == self.ifname && !i.sandbox.is_empty())
            .map(|i| i.sandbox.clone())
    }
}

/// One host-local reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    pub network: String,
    pub ip: IpAddr,
    pub container_id: String,
    /// None for the legacy format (id only).
    pub ifname: Option<String>,
}

#[derive(Debug, Default)]
pub struct Inventory {
    pub cached: Vec<Cached>,
    pub reservations: Vec<Reservation>,
    pub notes: Vec<String>,
}

fn decode_cache(path: &Path, e: cnitool::cache::CacheEntry) -> Result<Cached, String> {
    let conf: Value = serde_json::from_slice(&e.config).map_err(|x| format!("config is not JSON: {x}"))?;
    let version = conf.get("cniVersion").and_then(Value::as_str).unwrap_or("1.0.0").to_string();
    let plugins = match conf.get("plugins").and_then(Value::as_array) {
        Some(list) => list.clone(),
        None => vec![conf.clone()],
    };
    let result = match &e.result {
        Some(r) => {
            let v = Version::from_str_exact(&version).unwrap_or(Version::V1_0_0);
            Some(CniResult::decode(&Value::Object(r.clone()), v).map_err(|x| format!("result: {}", x.msg))?)
        }
        None => None,
    };
    Ok(Cached {
        path: path.to_path_buf(),
        network: e.network_name,
        container_id: e.container_id,
        ifname: e.if_name,
        netns: e.netns,
        version,
        plugins,
        caps: e.capability_args.unwrap_or_default(),
        result,
        result_json: e.result.map(Value::Object),
    })
}

fn read_store(data_dir: &Path, out: &mut Vec<Reservation>) {
    let Ok(nets) = std::fs::read_dir(data_dir) else { return };
    for net in nets.flatten() {
        let network = net.file_name().to_string_lossy().into_owned();
        let Ok(files) = std::fs::read_dir(net.path()) else { continue };
        for f in files.flatten() {
            let Ok(ip) = f.file_name().to_string_lossy().parse::<IpAddr>() else { continue };
            let Ok(content) = std::fs::read_to_string(f.path()) else { continue };
            let mut lines = content.split(['\r', '\n']).filter(|l| !l.is_empty());
            let Some(id) = lines.next() else { continue };
            out.push(Reservation {
                network: network.clone(),
                ip,
                container_id: id.trim().to_string(),
                ifname: lines.next().map(|s| s.trim().to_string()),
            });
        }
    }
}

impl Inventory {
    pub fn load(cache_dirs: &[PathBuf], data_dirs: &[PathBuf]) -> Inventory {
        let mut inv = Inventory::default();
        for d in cache_dirs {
            match cnitool::cache::attachments(d) {
                Ok(list) => {
                    for (path, e) in list {
                        match decode_cache(&path, e) {
                            Ok(c) => inv.cached.push(c),
                            Err(why) => {
                                inv.notes.push(format!("ignoring cache file {}: {why}", path.display()))
                            }
                        }
                    }
                }
                Err(e) => inv.notes.push(format!("cannot read the cache in {}: {}", d.display(), e.msg)),
            }
        }
        for d in data_dirs {
            read_store(d, &mut inv.reservations);
        }
        inv
    }

    pub fn cached(&self, network: &str, id: &str, ifname: &str) -> Option<&Cached> {
        self.cached.iter().find(|c| c.network == network && c.container_id == id && c.ifname == ifname)
    }

    /// Every (network, container id, ifname) the node knows of.
    pub fn identities(&self) -> Vec<(String, String, String)> {
        let mut out: Vec<(String, String, String)> = Vec::new();
        let mut push = |t: (String, String, String)| {
            if !out.contains(&t) {
                out.push(t);
            }
        };
        for c in &self.cached {
            push((c.network.clone(), c.container_id.clone(), c.ifname.clone()));
        }
        for r in &self.reservations {
            if let Some(i) = &r.ifname {
                push((r.network.clone(), r.container_id.clone(), i.clone()));
            }
        }
        out
    }

    /// The interface of (network, container id): from the cache (preferring the entry whose
    /// result holds `ip`), else from a reservation of `ip` or of the container in `network`.
    pub fn ifname_of(&self, network: &str, id: &str, ip: Option<IpAddr>) -> Option<String> {
        let cached: Vec<&Cached> =
            self.cached.iter().filter(|c| c.network == network && c.container_id == id).collect();
        if let Some(ip) = ip {
            if let Some(c) = cached
                .iter()
                .find(|c| c.result.as_ref().is_some_and(|r| r.ips.iter().any(|x| x.address.addr() == ip)))
            {
                return Some(c.ifname.clone());
            }
            if let Some(r) = self
                .reservations
                .iter()
                .find(|r| r.network == network && r.container_id == id && r.ip == ip && r.ifname.is_some())
            {
                return r.ifname.clone();
            }
        }
        if let Some(c) = cached.first() {
            return Some(c.ifname.clone());
        }
        self.reservations
            .iter()
            .find(|r| r.network == network && r.container_id == id && r.ifname.is_some())
            .and_then(|r| r.ifname.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_config_gets_declared_capabilities_only() {
        let c = Cached {
            path: PathBuf::new(),
            network: "n".into(),
            container_id: "c".into(),
            ifname: "eth0".into(),
            netns: String::new(),
            version: "1.0.0".into(),
            plugins: vec![
                json!({"type": "bridge"}),
                json!({"type": "portmap", "capabilities": {"portMappings": true, "bandwidth": false}}),
            ],
            caps: serde_json::from_value(json!({"portMappings": [{"hostPort": 1}], "bandwidth": {}}))
                .unwrap(),
            result: None,
            result_json: None,
        };
        let p = c.plugin_config("portmap").unwrap();
        assert_eq!(p["name"], "n");
        assert_eq!(p["runtimeConfig"], json!({"portMappings": [{"hostPort": 1}]}));
        assert!(c.plugin_config("bridge").unwrap().get("runtimeConfig").is_none());
        assert!(c.plugin_config("bandwidth").is_none());
    }

    #[test]
    fn store_reader() {
        let d = std::env::temp_dir().join(format!("cni-migrate-store-{}", std::process::id()));
        std::fs::create_dir_all(d.join("net1")).unwrap();
        std::fs::write(d.join("net1/10.1.0.5"), "ctr1\r\neth1").unwrap();
        std::fs::write(d.join("net1/10.1.0.6"), "ctr2").unwrap();
        std::fs::write(d.join("net1/last_reserved_ip.0"), "10.1.0.6").unwrap();
        let mut r = Vec::new();
        read_store(&d, &mut r);
        r.sort_by_key(|x| x.ip);
        std::fs::remove_dir_all(&d).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].ifname.as_deref(), Some("eth1"));
        assert_eq!(r[1].ifname, None);
        let inv = Inventory { reservations: r, ..Default::default() };
        assert_eq!(inv.ifname_of("net1", "ctr1", Some("10.1.0.5".parse().unwrap())).as_deref(), Some("eth1"));
        assert_eq!(inv.ifname_of("net1", "ctr2", None), None);
        assert_eq!(inv.identities(), vec![("net1".to_string(), "ctr1".to_string(), "eth1".to_string())]);
    }
}
