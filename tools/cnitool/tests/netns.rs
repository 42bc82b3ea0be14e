//! Root tests: the built `cnitool` against Debian's upstream plugins (/usr/lib/cni) in network
//! namespaces made by the test, and interoperability with upstream cnitool (built by
//! scripts/build-upstream-cnitool.sh). Nothing here touches the machine's own network: bridge
//! tests run the plugins inside a "host" namespace of their own.
//!
//! These tests need root and fail (never skip) without it.

use cni_tests::{unique, Netns, TempDir};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

const OURS: &str = env!("CARGO_BIN_EXE_cnitool");
const PLUGINS: &str = "/usr/lib/cni";
const LIBCNI_CACHE: &str = "/var/lib/cni";

fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

fn must(cmd: &mut Command) -> Output {
    let what = format!("{cmd:?}");
    ok(run(cmd), &what)
}

fn require_root() {
    let out = must(Command::new("id").arg("-u"));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "0",
        "these tests create network namespaces and must run as root"
    );
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

fn upstream_cnitool() -> PathBuf {
    workspace_root().join("target/upstream/cnitool")
}

/// Make sure the upstream plugins and upstream cnitool are there, building them with the
/// script when not. A failing build fails the test.
fn ensure_upstream() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        require_root();
        let needed =
            ["loopback", "bridge", "host-local"].iter().all(|p| Path::new(PLUGINS).join(p).is_file());
        if needed && upstream_cnitool().is_file() {
            return;
        }
        let script = workspace_root().join("scripts/build-upstream-cnitool.sh");
        let out = run(Command::new("bash").arg(&script));
        assert!(
            out.status.success(),
            "{} failed ({}):\n{}",
            script.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(upstream_cnitool().is_file(), "the script did not produce {}", upstream_cnitool().display());
    });
}

/// Removes `<LIBCNI_CACHE>/results/<net>-*` on drop (upstream cnitool always caches there).
struct LibcniCacheGuard {
    network: String,
}

impl LibcniCacheGuard {
    fn files(&self) -> Vec<PathBuf> {
        let dir = Path::new(LIBCNI_CACHE).join("results");
        let prefix = format!("{}-", self.network);
        match std::fs::read_dir(&dir) {
            Ok(rd) => rd
                .filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                .map(|e| e.path())
                .collect(),
            Err(_) => Vec::new(),
        }
    }
}

impl Drop for LibcniCacheGuard {
    fn drop(&mut self) {
        for f in self.files() {
            let _ = std::fs::remove_file(f);
        }
    }
}

/// One network configuration in its own NETCONFPATH.
struct Net {
    name: String,
    conf_dir: TempDir,
    /// Our cache dir; `None` means the libcni default (for interop with upstream cnitool).
    cache_dir: Option<TempDir>,
}

impl Net {
    fn new(name: String, conflist: &Value, own_cache: bool) -> Net {
        let conf_dir = TempDir::new("conf");
        std::fs::write(
            conf_dir.path().join("10-test.conflist"),
            serde_json::to_vec_pretty(conflist).unwrap(),
        )
        .unwrap();
        let cache_dir = own_cache.then(|| TempDir::new("cache"));
        Net { name, conf_dir, cache_dir }
    }

    fn cache_root(&self) -> PathBuf {
        self.cache_dir.as_ref().map(|d| d.path().to_path_buf()).unwrap_or_else(|| LIBCNI_CACHE.into())
    }

    /// Run a cnitool binary (`tool`) with `verb`, optionally inside the host netns `host`.
    fn cnitool(&self, tool: &Path, verb: &str, netns: &Netns, host: Option<&Netns>) -> Output {
        let mut cmd = match host {
            Some(h) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", h.name()]).arg(tool);
                c
            }
            None => Command::new(tool),
        };
        cmd.args([verb, self.name.as_str(), netns.path_str()])
            .env("CNI_PATH", PLUGINS)
            .env("NETCONFPATH", self.conf_dir.path())
            .env_remove("CNI_IFNAME")
            .env_remove("CNI_ARGS")
            .env_remove("CAP_ARGS")
            .env_remove("CNI_CONTAINERID")
            .env_remove("CNI_GC_KEEP");
        match &self.cache_dir {
            Some(d) => cmd.env("CNI_CACHE_DIR", d.path()),
            None => cmd.env_remove("CNI_CACHE_DIR"),
        };
        run(&mut cmd)
    }

    fn ours(&self, verb: &str, netns: &Netns, host: Option<&Netns>) -> Output {
        self.cnitool(Path::new(OURS), verb, netns, host)
    }

    fn ours_ok(&self, verb: &str, netns: &Netns, host: Option<&Netns>) -> Output {
        ok(self.ours(verb, netns, host), &format!("ours {verb} {}", self.name))
    }

    fn upstream_ok(&self, verb: &str, netns: &Netns, host: Option<&Netns>) -> Output {
        ok(self.cnitool(&upstream_cnitool(), verb, netns, host), &format!("upstream {verb} {}", self.name))
    }

    /// The cache files of this network.
    fn cache_files(&self) -> Vec<PathBuf> {
        let dir = self.cache_root().join("results");
        let prefix = format!("{}-", self.name);
        let mut v: Vec<PathBuf> = match std::fs::read_dir(&dir) {
            Ok(rd) => rd
                .filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                .map(|e| e.path())
                .collect(),
            Err(_) => Vec::new(),
        };
        v.sort();
        v
    }
}

fn ok(out: Output, what: &str) -> Output {
    assert!(
        out.status.success(),
        "{what} failed: {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn container_id_of(netns: &Netns) -> String {
    // Upstream's derivation, computed by our library (unit-tested against an independent
    // sha512 there); here we check that the cache file name agrees with it.
    cnitool::rt::container_id_for(netns.path_str())
}

fn lo_is_up(ns: &Netns) -> bool {
    let lo = ns.link("lo").expect("lo exists");
    lo["flags"].as_array().unwrap().iter().any(|f| f == "UP")
}

#[test]
fn loopback_add_check_del_per_version() {
    ensure_upstream();
    for version in ["0.3.1", "0.4.0", "1.0.0"] {
        let ns = Netns::new("lo");
        let name = unique("lo-");
        let net = Net::new(
            name.clone(),
            &serde_json::json!({"cniVersion": version, "name": name, "plugins": [{"type": "loopback"}]}),
            true,
        );
        assert!(!lo_is_up(&ns));

        let out = net.ours_ok("add", &ns, None);
        let result: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(result["cniVersion"], version);
        assert_eq!(result["interfaces"][0]["name"], "lo", "{result}");
        assert!(lo_is_up(&ns), "{version}: lo is up after ADD");

        let files = net.cache_files();
        assert_eq!(files.len(), 1, "{files:?}");
        let expected = format!("{}-{}-eth0", name, container_id_of(&ns));
        assert_eq!(files[0].file_name().unwrap().to_string_lossy(), expected);
        let cached: Value = serde_json::from_slice(&std::fs::read(&files[0]).unwrap()).unwrap();
        assert_eq!(cached["kind"], "cniCacheV1");
        assert_eq!(cached["netns"], ns.path_str());
        assert_eq!(cached["result"], result);

        let check = net.ours("check", &ns, None);
        if version == "0.3.1" {
            assert!(!check.status.success());
            let err = String::from_utf8_lossy(&check.stderr);
            assert!(err.contains("does not support the CHECK command"), "{err}");
        } else {
            ok(check, "check");
        }

        net.ours_ok("del", &ns, None);
        assert!(!lo_is_up(&ns), "{version}: lo is down after DEL");
        assert!(net.cache_files().is_empty(), "{version}: cache removed");
        net.ours_ok("del", &ns, None);
    }
}

#[test]
fn plugin_errors_are_reported_with_code() {
    ensure_upstream();
    let ns = Netns::new("er");
    let name = unique("er-");
    let dir = TempDir::new("ipam");
    let net = Net::new(
        name.clone(),
        &serde_json::json!({"cniVersion": "1.0.0", "name": name,
            "plugins": [{"type": "host-local", "dataDir": dir.path()}]}),
        true,
    );
    let out = net.ours("add", &ns, None);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "plugin type=\"host-local\" failed (add): IPAM config missing 'ipam' key (CNI error code 999)"
        ),
        "{err}"
    );
    assert!(net.cache_files().is_empty());

    let missing = Net::new(
        unique("mi-"),
        &serde_json::json!({"cniVersion": "1.0.0", "name": "other", "plugins": [{"type": "loopback"}]}),
        true,
    );
    let out = missing.ours("add", &ns, None);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no net configuration with name"), "{err}");
}

/// A bridge + host-local network unique to one test, for a container namespace whose
/// plugins run inside `host`.
struct BridgeNet {
    net: Net,
    data_dir: TempDir,
    subnet_prefix: String,
}

impl BridgeNet {
    fn new(version: &str, own_cache: bool) -> BridgeNet {
        let name = unique("br-");
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        // A subnet unique to this process and test (only ever configured inside the test's
        // own namespaces).
        let third = (std::process::id() as usize * 7 + n) % 250 + 1;
        let subnet_prefix = format!("10.213.{third}");
        let data_dir = TempDir::new("ipam");
        let conflist = serde_json::json!({
            "cniVersion": version,
            "name": name,
            "plugins": [{
                "type": "bridge",
                "bridge": unique("cbr"),
                "isGateway": true,
                "ipMasq": false,
                "ipam": {
                    "type": "host-local",
                    "subnet": format!("{subnet_prefix}.0/24"),
                    "dataDir": data_dir.path(),
                    "routes": [{"dst": "0.0.0.0/0"}]
                }
            }]
        });
        BridgeNet { net: Net::new(name, &conflist, own_cache), data_dir, subnet_prefix }
    }

    /// Reservation files in host-local's store (everything but `lock` and
    /// `last_reserved_ip.*`).
    fn reservations(&self) -> Vec<String> {
        let dir = self.data_dir.path().join(&self.net.name);
        match std::fs::read_dir(&dir) {
            Ok(rd) => rd
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n != "lock" && !n.starts_with("last_reserved_ip"))
                .collect(),
            Err(_) => Vec::new(),
        }
    }

    fn container_addr(&self, ns: &Netns) -> Option<String> {
        let addrs = ns.ip_json(&["addr", "show"]);
        for link in addrs.as_array().unwrap() {
            if link["ifname"] != "eth0" {
                continue;
            }
            for a in link["addr_info"].as_array().unwrap() {
                if a["family"] == "inet" {
                    return Some(format!("{}/{}", a["local"].as_str().unwrap(), a["prefixlen"]));
                }
            }
        }
        None
    }

    fn assert_attached(&self, ns: &Netns, result: Option<&Value>) -> String {
        let addr = self.container_addr(ns).expect("eth0 has an IPv4 address");
        assert!(addr.starts_with(&format!("{}.", self.subnet_prefix)), "{addr}");
        let ip = addr.split('/').next().unwrap().to_string();
        assert_eq!(self.reservations(), vec![ip.clone()]);
        if let Some(r) = result {
            let ips = r["ips"].as_array().unwrap();
            assert!(ips.iter().any(|i| i["address"] == addr.as_str()), "{r}");
        }
        ip
    }

    fn assert_detached(&self, ns: &Netns) {
        assert!(ns.link("eth0").is_none(), "eth0 removed");
        assert!(self.reservations().is_empty(), "host-local store empty: {:?}", self.reservations());
        assert!(self.net.cache_files().is_empty(), "cache removed: {:?}", self.net.cache_files());
    }
}

#[test]
fn bridge_host_local_add_check_del_gc() {
    ensure_upstream();
    let host = Netns::new("h");
    let ns = Netns::new("c");
    let br = BridgeNet::new("1.0.0", true);
    let net = &br.net;

    let out = net.ours_ok("add", &ns, Some(&host));
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["cniVersion"], "1.0.0");
    br.assert_attached(&ns, Some(&result));
    let files = net.cache_files();
    assert_eq!(files.len(), 1);
    assert!(files[0].to_string_lossy().ends_with(&format!("{}-eth0", container_id_of(&ns))));

    net.ours_ok("check", &ns, Some(&host));
    net.ours_ok("status", &ns, Some(&host));

    net.ours_ok("del", &ns, Some(&host));
    br.assert_detached(&ns);
    net.ours_ok("del", &ns, Some(&host));

    // GC (1.0.0: no GC verb for the plugins, but stale cached attachments are deleted).
    net.ours_ok("add", &ns, Some(&host));
    br.assert_attached(&ns, None);
    net.ours_ok("gc", &ns, Some(&host));
    br.assert_detached(&ns);
}

#[test]
fn interop_bridge_with_upstream_cnitool() {
    ensure_upstream();
    let host = Netns::new("h");
    let ns = Netns::new("c");
    let br = BridgeNet::new("1.0.0", false);
    let _guard = LibcniCacheGuard { network: br.net.name.clone() };
    let net = &br.net;

    // ADD with ours, CHECK and DEL with upstream's.
    let out = net.ours_ok("add", &ns, Some(&host));
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    br.assert_attached(&ns, Some(&result));
    assert_eq!(net.cache_files().len(), 1);
    net.upstream_ok("check", &ns, Some(&host));
    net.upstream_ok("del", &ns, Some(&host));
    br.assert_detached(&ns);

    // ADD with upstream's, CHECK and DEL with ours.
    let out = net.upstream_ok("add", &ns, Some(&host));
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    br.assert_attached(&ns, Some(&result));
    let files = net.cache_files();
    assert_eq!(files.len(), 1, "upstream cached under {LIBCNI_CACHE}");
    assert!(files[0].to_string_lossy().ends_with(&format!("{}-eth0", container_id_of(&ns))));
    net.ours_ok("check", &ns, Some(&host));
    net.ours_ok("del", &ns, Some(&host));
    br.assert_detached(&ns);
}

#[test]
fn interop_loopback_with_upstream_cnitool() {
    ensure_upstream();
    let ns = Netns::new("lo");
    let name = unique("ilo-");
    let _guard = LibcniCacheGuard { network: name.clone() };
    let net = Net::new(
        name.clone(),
        &serde_json::json!({"cniVersion": "0.4.0", "name": name, "plugins": [{"type": "loopback"}]}),
        false,
    );
    net.ours_ok("add", &ns, None);
    assert!(lo_is_up(&ns));
    net.upstream_ok("check", &ns, None);
    net.upstream_ok("del", &ns, None);
    assert!(!lo_is_up(&ns));
    assert!(net.cache_files().is_empty());

    net.upstream_ok("add", &ns, None);
    assert!(lo_is_up(&ns));
    net.ours_ok("check", &ns, None);
    net.ours_ok("del", &ns, None);
    assert!(!lo_is_up(&ns));
    assert!(net.cache_files().is_empty());
}
