//! What the node knows about its attachments besides the kernel: libcni's attachment cache
//! (`<cacheDir>/results/<net>-<id>-<ifname>`: the configuration list, the capability arguments
//! such as `portMappings`, the result) and host-local's stores (`<dataDir>/<net>/<ip>` holding
//! `<id>\r\n<ifname>`). Both are only read.

use cni_common::fsread::{names, open_dir_at, read_regular_at};
use cni_common::spec::result::CniResult;
use cni_common::spec::Version;
use host_local::store::{reservation_name, Owner, RESERVATION_CAP};
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use serde_json::{json, Map, Value};
use std::fs::File;
use std::io;
use std::net::IpAddr;
use std::os::fd::AsFd;
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

/// Every reservation of host-local's stores under `data_dir` (`<net>/<ip>`), read the way
/// host-local reads its own store, which whoever can write there may have planted things in:
/// `data_dir` (the configured path) is followed, a network directory that is a symbolic link is
/// not; only files named by the canonical text of an address are read, with `O_NOFOLLOW |
/// O_NONBLOCK`, only when they are regular files, and at most host-local's cap. What is no
/// reservation file (a link, a FIFO, a device, an oversized file) is skipped with a note; a
/// store that is not there is no note.
fn read_store(data_dir: &Path, out: &mut Vec<Reservation>, notes: &mut Vec<String>) {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let top = match nix::fcntl::open(data_dir, flags, Mode::empty()) {
        Ok(d) => File::from(d),
        Err(Errno::ENOENT) => return,
        Err(e) => return notes.push(format!("cannot read the store {}: {e}", data_dir.display())),
    };
    let mut nets = match names(&top) {
        Ok(n) => n,
        Err(e) => return notes.push(format!("cannot read the store {}: {e}", data_dir.display())),
    };
    nets.sort();
    // names read from disk: shown escaped
    let shown = |name: &str| data_dir.join(name.escape_debug().to_string()).display().to_string();
    for net in nets {
        let Some(network) = net.to_str() else { continue };
        let dir = match open_dir_at(top.as_fd(), Path::new(network)) {
            Ok(d) => d,
            Err(e) => {
                notes.push(format!("skipping {}: {e}", shown(network)));
                continue;
            }
        };
        let files = match names(&dir) {
            Ok(f) => f,
            Err(e) => {
                notes.push(format!("cannot read {}: {e}", shown(network)));
                continue;
            }
        };
        for f in files {
            let Some(ip) = f.to_str().and_then(reservation_name) else { continue };
            let owner = match read_regular_at(dir.as_fd(), &ip.to_string(), RESERVATION_CAP) {
                Ok(content) => Owner::parse(&content),
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue, // released meanwhile
                Err(e) => {
                    notes.push(format!("skipping {}/{ip}: {e} (no reservation file)", shown(network)));
                    continue;
                }
            };
            let (container_id, ifname) = match owner {
                Owner::Attachment { id, ifname } => (id, Some(ifname)),
                Owner::Legacy { id } => (id, None),
                Owner::Unknown | Owner::Foreign(_) => continue,
            };
            out.push(Reservation { network: network.to_string(), ip, container_id, ifname });
        }
    }
}

impl Inventory {
    pub fn load(cache_dirs: &[PathBuf], data_dirs: &[PathBuf]) -> Inventory {
        let mut inv = Inventory::default();
        for d in cache_dirs {
            match cnitool::cache::list(d) {
                Ok(list) => {
                    for (path, e) in &list.unreadable {
                        inv.notes.push(format!("skipping cache file {}: {e}", path.display()));
                    }
                    for (path, e) in list.entries {
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
            read_store(d, &mut inv.reservations, &mut inv.notes);
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
    use nix::unistd::mkfifo;

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
        let (mut r, mut notes) = (Vec::new(), Vec::new());
        read_store(&d, &mut r, &mut notes);
        assert!(notes.is_empty(), "{notes:?}");
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

    #[test]
    fn planted_files_in_the_store_are_skipped_never_followed_or_waited_on() {
        use std::os::unix::fs::symlink;
        let d = std::env::temp_dir().join(format!("cni-migrate-planted-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let net = d.join("store/net1");
        std::fs::create_dir_all(&net).unwrap();
        std::fs::create_dir_all(d.join("elsewhere")).unwrap();
        std::fs::write(net.join("10.1.0.5"), "ctr1\r\neth1").unwrap();
        // a link named like an address, to a file that would read as a reservation
        std::fs::write(d.join("elsewhere/target"), "victim\r\neth9").unwrap();
        symlink(d.join("elsewhere/target"), net.join("10.1.0.7")).unwrap();
        // a FIFO named like an address: std::fs::read_to_string would wait for a writer forever
        mkfifo(&net.join("10.1.0.8"), Mode::from_bits_truncate(0o600)).unwrap();
        // an oversized file (sparse): never read whole
        File::create(net.join("10.1.0.9")).unwrap().set_len(1 << 31).unwrap();
        // a whole network directory that is a link, to a directory holding a reservation
        std::fs::write(d.join("elsewhere/10.2.0.5"), "victim\r\neth9").unwrap();
        symlink(d.join("elsewhere"), d.join("store/net2")).unwrap();
        // a non-canonical address name is no reservation (as for host-local)
        std::fs::write(net.join("2001:DB8::1"), "ctr3\r\neth0").unwrap();

        let (mut r, mut notes) = (Vec::new(), Vec::new());
        read_store(&d.join("store"), &mut r, &mut notes);
        notes.sort();
        std::fs::remove_dir_all(&d).unwrap();
        assert_eq!(
            r,
            vec![Reservation {
                network: "net1".into(),
                ip: "10.1.0.5".parse().unwrap(),
                container_id: "ctr1".into(),
                ifname: Some("eth1".into()),
            }],
            "only the regular reservation file is read"
        );
        let store = d.join("store");
        assert_eq!(
            notes,
            vec![
                format!("skipping {}/10.1.0.7: a symbolic link, which is not followed (no reservation file)", store.join("net1").display()),
                format!("skipping {}/10.1.0.8: not a regular file but a FIFO (no reservation file)", store.join("net1").display()),
                format!(
                    "skipping {}/10.1.0.9: larger than {RESERVATION_CAP} bytes, the most that is read (no reservation file)",
                    store.join("net1").display()
                ),
                format!("skipping {}: a symbolic link, which is not followed", store.join("net2").display()),
            ]
        );
        // a store that is not there is nothing to say
        read_store(&d.join("missing"), &mut r, &mut notes);
        assert_eq!((r.len(), notes.len()), (1, 4));
    }

    /// What resync and both migrations read of libcni's cache: planted files are named in the
    /// notes, never followed or waited on.
    #[test]
    fn planted_cache_files_are_noted_never_followed_or_waited_on() {
        use cnitool::cache::{write, CacheEntry};
        use std::os::unix::fs::symlink;
        let d = std::env::temp_dir().join(format!("cni-migrate-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let results = d.join("cache/results");
        let entry = |id: &str| CacheEntry {
            container_id: id.into(),
            config: br#"{"cniVersion":"1.0.0","name":"net1","plugins":[{"type":"portmap"}]}"#.to_vec(),
            if_name: "eth0".into(),
            network_name: "net1".into(),
            netns: "/run/netns/x".into(),
            ..Default::default()
        };
        write(&results.join("net1-real-eth0"), &entry("real")).unwrap();
        write(&d.join("elsewhere/forged"), &entry("forged")).unwrap();
        symlink(d.join("elsewhere/forged"), results.join("net1-forged-eth0")).unwrap();
        mkfifo(&results.join("net1-fifo-eth0"), Mode::from_bits_truncate(0o600)).unwrap();

        let inv = Inventory::load(&[d.join("cache")], &[]);
        std::fs::remove_dir_all(&d).unwrap();
        let ids: Vec<&str> = inv.cached.iter().map(|c| c.container_id.as_str()).collect();
        assert_eq!(ids, ["real"]);
        assert_eq!(
            inv.notes,
            vec![
                format!(
                    "skipping cache file {}: not a regular file but a FIFO",
                    results.join("net1-fifo-eth0").display()
                ),
                format!(
                    "skipping cache file {}: a symbolic link, which is not followed",
                    results.join("net1-forged-eth0").display()
                ),
            ]
        );
    }
}
